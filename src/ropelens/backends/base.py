"""The backend a loaded model runs on, chosen once, and the handle every layer above reads the model
through.

ropelens runs every model on the HF model's own forward (:mod:`ropelens.backends.engine` applies
RoPE variants, plane ablations and massive-value replacement at the rotation that forward calls).
What differs between models is only the surface around that forward, and this module is the one
place that asks which surface a model has:

- :class:`HFBackend`: an HF causal LM ropelens wraps itself
  (:class:`ropelens.backends.hf.PlainModel`, for the families TransformerLens has no adapter for,
  and for ``bridge=False``);
- :class:`BridgeBackend`: a TransformerLens bridge, the TL view (hook points, ``run_with_cache``) on
  the same HF model; analyses read its hook points only where the plan in force is one its hooks
  see;
- :class:`CallableBackend`: an HF causal LM (or any callable taking ``input_ids`` and returning
  logits) passed as it is, for the functions that only need its forward (losses, greedy decoding).

:func:`backend_of` picks one per model and keeps it on the model; :func:`handle` adds what every
layer used to ask the raw model for again (label, device, dtype, the HF view, the spec read at the
plan in force, the verification fingerprint). Code outside ``ropelens.backends`` asks the backend
(``backend_of(model).loss_path()``, ``.capture_session(...)``, ``.uses_engine(...)``) and never
which backend it is.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import importlib
import inspect
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import torch
from torch import Tensor

from ropelens.backends.acts import Reducer
from ropelens.backends.bridge_capture import hooked_capture
from ropelens.backends.bridge_hooks import attn_hooks
from ropelens.backends.bridge_interventions import (
    install_ablation,
    install_replacement,
    install_variant,
)
from ropelens.backends.hf import PlainModel, capture, plain_model, planned_forward
from ropelens.backends.losses import hf_losses, losses_of
from ropelens.backends.sdpa import engine_plan, engine_ready, on_sdpa, sdpa_ready
from ropelens.backends.sdpa_capture import hf_view, sdpa_attention
from ropelens.backends.serials import object_serial
from ropelens.devices import device_of
from ropelens.errors import InputError, UnsupportedModelError
from ropelens.spec.plan import active_plan
from ropelens.spec.reading import hf_model_of, model_label, rope_spec
from ropelens.spec.rope import RopeSpec
from ropelens.spec.rotary_state import rotary_state_kept
from ropelens.spec.surface import is_nnsight, nnsight_module, register_runner

__all__ = [
    "Backend",
    "BridgeBackend",
    "CallableBackend",
    "HFBackend",
    "ModelHandle",
    "backend_of",
    "fingerprint",
    "handle",
    "plain_of_nnsight",
]

_ATTR = "_ropelens_backend"
_HANDLE = "_ropelens_handle"
_NNSIGHT = "_ropelens_plain_model"  # on an nnsight wrapper: the plain model of its HF model
Fold = Callable[[int, dict[str, Tensor]], None]
Run = Callable[[Tensor, Tensor, bool, Fold], None]


class Backend:
    """How ropelens runs one loaded model: capture, interventions, losses and decoding on its HF
    forward.

    ``name`` says which surface the model has; ``tl_view`` whether it has TransformerLens hook
    points and ``run_with_cache``. Every method answers for this model; callers never branch on the
    name.
    """

    name: ClassVar[str] = "hf"
    tl_view: ClassVar[bool] = False
    runs_analyses: ClassVar[bool] = True  # a model from ropelens.load_model (spec, capture, report)

    def __init__(self, model: Any) -> None:
        self.model = model

    def __repr__(self) -> str:
        return f"{type(self).__name__}({type(self.model).__name__})"

    # ------------------------------------------------------------------ the HF model under it
    @property
    def hf(self) -> torch.nn.Module:
        """The HF causal LM the model runs (without a bridge's components; weights shared)."""
        return hf_view(self.model)

    @property
    def label(self) -> str:
        """The name the model was loaded under."""
        return model_label(self.model)

    # ------------------------------------------------------------------ capture
    def on_engine(self) -> bool:
        """Whether q/k captures with the plan in force are read from the HF forward's own rotation
        (else from the bridge's hook points)."""
        return True

    def capture_path(self) -> str:
        """The name of the path analyses take off the fast q/k path."""
        return "plain HF forward" if self.on_engine() else "bridge"

    @contextlib.contextmanager
    def capture_session(
        self, spec: RopeSpec, layers: Sequence[int], reducers: Sequence[Reducer]
    ) -> Iterator[Run]:
        """A block in which ``run(tokens, valid, padded, fold)`` captures one batch of ``layers``:
        each layer's tensors go to ``fold(layer, tensors)`` (read at the HF forward's rotation and
        attention function, with the plan in force) or straight to ``reducers`` (read from a
        bridge's hook points)."""
        needs = frozenset().union(*(r.needs for r in reducers))

        def run(toks: Tensor, valid: Tensor, padded: bool, fold: Fold) -> None:
            with planned_forward(self.model, self.hf):
                capture(self.model, spec, toks, valid, layers, needs, fold, padded=padded)

        yield run

    # ------------------------------------------------------------------ interventions
    def uses_engine(self, layers: Sequence[int], what: str) -> bool:
        """Whether ``what`` is applied by the engine (at the rotation the HF forward calls) rather
        than by bridge hooks; raises UnsupportedModelError, with what was seen, where neither
        reaches the model's rotation."""
        why = engine_ready(self.model)
        if why is not None:
            raise UnsupportedModelError(f"{what} cannot reach this model's rotation: {why}")
        return True

    def pre_rope_hooks(self, layers: Sequence[int], parts: Sequence[str]) -> bool:
        """Whether a hook point before the rotation exists for each of ``parts`` ("q", "k") in every
        layer."""
        return False

    def variant_hooks(
        self,
        spec: RopeSpec,
        new_spec: RopeSpec,
        variant: Any,
        layers: Sequence[int],
    ) -> tuple[list[Callable[[], None]], bool]:
        """Install RoPE ``variant`` in ``layers`` where hooks apply it: (hook removers, whether the
        engine applies it instead, from the plan)."""
        return [], self.uses_engine(layers, "apply_rope_variant")

    def ablation_hooks(
        self, masks: dict[int, tuple[Tensor | None, Tensor | None]]
    ) -> tuple[list[Callable[[], None]], bool]:
        """Install the zeroing of ``masks[layer] = (q, k)`` entries of the rotated q and k:
        (removers, engine)."""
        return [], self.uses_engine(list(masks), "ablate_planes")

    def replacement_hooks(
        self,
        step: dict[int, dict[str, tuple[Tensor, Tensor]]],
        layers: Sequence[int],
        parts: Sequence[str],
    ) -> tuple[list[Callable[[], None]], bool]:
        """Install writing ``step[layer][w] = (mask, value)`` into the q and k entering the
        rotation: (removers, engine)."""
        return [], self.uses_engine(layers, "replace_massive")

    # ------------------------------------------------------------------ forward, losses, decoding
    def loss_path(self, path: str = "auto") -> str:
        """The forward losses take: ``"sdpa"`` (the HF model with sdpa attention and the plan
        applied at its rotation) where the engine reaches it, else ``"hf"`` (the model's own
        forward, the plan applied)."""
        return "sdpa" if path != "bridge" and sdpa_ready(self.model) else "hf"

    @contextlib.contextmanager
    def loss_forward(self, path: str) -> Iterator[Callable[[Tensor], Tensor]]:
        """A block in which ``losses(batch)`` gives each window's mean next-token loss on forward
        ``path``."""
        with rotary_state_kept(self.model):
            if path == "sdpa":
                with on_sdpa(self.model) as hf:
                    yield lambda batch: hf_losses(hf, batch)
                return
            yield self._losses

    def _losses(self, batch: Tensor) -> Tensor:
        return losses_of(self.model(input_ids=batch).logits, batch)

    def fast_forward(
        self, fast: bool = True
    ) -> tuple[Any, Callable[[], contextlib.AbstractContextManager]]:
        """The module a long forward runs (called as ``module(tokens)``) and a context to run it
        in."""
        return self.model, functools.partial(rotary_state_kept, self.model)

    def last_logits(self, ids: Tensor) -> Tensor:
        """Logits after the last token of ``ids`` (``[1, pos]``), from one full forward."""
        with rotary_state_kept(self.model):
            out = self.model(input_ids=ids)
        return getattr(out, "logits", out)[0, -1]

    @contextlib.contextmanager
    def decoding(
        self, path: str, cache: bool, chunk: int | None
    ) -> Iterator[tuple[Callable[[Tensor, Tensor], Tensor], bool]]:
        """A block in which ``step(new, seq)`` gives the logits after ``seq``, whose last tokens
        ``new`` the model has not seen yet (a key/value cache where ``cache`` and the path has one,
        prefilled ``chunk`` tokens at a time); yields ``(step, cached)``."""
        use_cache = cache and path != "hf"
        # one block for every step: a key/value cache's steps run as one input growing
        with rotary_state_kept(self.model):
            if path == "sdpa":
                with on_sdpa(self.model) as hf:
                    yield _hf_stepper(hf, use_cache, chunk), use_cache
                return
            yield self._stepper(use_cache, chunk), use_cache

    def _stepper(self, cache: bool, chunk: int | None) -> Callable[[Tensor, Tensor], Tensor]:
        return lambda _new, seq: self.last_logits(seq)

    # ------------------------------------------------------------------ identity
    def named(self, label: str, path: Path | None) -> Any:
        """The model with ``label`` (and the resolved ``path`` its weights came from) on its
        config."""
        import dataclasses

        resolved = None if path is None else str(path.expanduser().resolve())
        self.model.cfg = dataclasses.replace(
            self.model.cfg, model_name=label, model_path=resolved
        )  # frozen config
        return self.model


class HFBackend(Backend):
    """An HF causal LM ropelens wraps itself (:class:`ropelens.backends.hf.PlainModel`)."""

    name = "hf"


class BridgeBackend(Backend):
    """A TransformerLens bridge: the TL view (hook points, ``run_with_cache``) on the HF model it
    wraps."""

    name = "bridge"
    tl_view = True

    def on_engine(self) -> bool:
        return engine_plan(self.model)  # a step only the engine applies: no bridge hook sees it

    @contextlib.contextmanager
    def capture_session(
        self, spec: RopeSpec, layers: Sequence[int], reducers: Sequence[Reducer]
    ) -> Iterator[Run]:
        if self.on_engine():
            with super().capture_session(spec, layers, reducers) as run:
                yield run
            return

        with hooked_capture(self.model, spec, layers, reducers) as hooked:
            yield lambda toks, valid, padded, _fold: hooked(toks, valid, padded)

    def uses_engine(self, layers: Sequence[int], what: str) -> bool:
        if all(hasattr(self.model.blocks[i].attn, "hook_cos") for i in layers):
            return False  # the attention receives (cos, sin): bridge hooks apply it
        return super().uses_engine(layers, what)

    def pre_rope_hooks(self, layers: Sequence[int], parts: Sequence[str]) -> bool:
        try:
            return all(
                attn_hooks(self.model, L).pre(w) in self.model.hook_dict
                for L in layers
                for w in parts
            )
        except (AttributeError, KeyError, TypeError):
            return False

    def variant_hooks(
        self, spec: RopeSpec, new_spec: RopeSpec, variant: Any, layers: Sequence[int]
    ) -> tuple[list[Callable[[], None]], bool]:
        if self.uses_engine(layers, "apply_rope_variant"):
            return [], True

        return [
            h.remove for h in install_variant(self.model, spec, new_spec, variant, layers)
        ], False

    def ablation_hooks(
        self, masks: dict[int, tuple[Tensor | None, Tensor | None]]
    ) -> tuple[list[Callable[[], None]], bool]:
        if self.uses_engine(list(masks), "ablate_planes"):
            return [], True

        return install_ablation(self.model, masks), False

    def replacement_hooks(
        self,
        step: dict[int, dict[str, tuple[Tensor, Tensor]]],
        layers: Sequence[int],
        parts: Sequence[str],
    ) -> tuple[list[Callable[[], None]], bool]:
        # entries are replaced before the rotation: the bridge's pre-RoPE hooks reach them wherever
        # it rotates
        if not self.pre_rope_hooks(layers, parts) and self.uses_engine(layers, "replace_massive"):
            return [], True

        return install_replacement(self.model, step), False

    def loss_path(self, path: str = "auto") -> str:
        if path != "auto":
            return path

        return "sdpa" if sdpa_ready(self.model) else "bridge"

    def _losses(self, batch: Tensor) -> Tensor:
        return self.model(batch, return_type="loss", loss_per_token=True).float().mean(dim=-1)

    def fast_forward(
        self, fast: bool = True
    ) -> tuple[Any, Callable[[], contextlib.AbstractContextManager]]:
        if not fast or getattr(
            self.model, "_ropelens_interventions", 0
        ):  # bridge hooks in force: run it as it is
            return self.model, functools.partial(rotary_state_kept, self.model)

        @contextlib.contextmanager
        def kept_on_sdpa() -> Iterator[None]:
            with rotary_state_kept(self.model), sdpa_attention(self.hf):
                yield

        return self.hf, kept_on_sdpa

    def last_logits(self, ids: Tensor) -> Tensor:
        with rotary_state_kept(self.model):
            return self.model(ids, logits_to_keep=1)[0, -1]

    def _stepper(self, cache: bool, chunk: int | None) -> Callable[[Tensor, Tensor], Tensor]:
        if not cache:
            return super()._stepper(cache, chunk)
        kv: list[Any] = [None]
        kept = [True]  # whether the bridge's cache holds every token it was given

        def cached(new: Tensor, seq: Tensor) -> Tensor:
            if not kept[0]:
                return self.last_logits(seq)
            logits = None
            for s in range(0, new.shape[1], chunk or new.shape[1]):
                part = new[:, s : s + (chunk or new.shape[1])]
                logits, kv[0] = self.model(
                    part, return_type="logits_and_cache", past_key_values=kv[0], logits_to_keep=1
                )
            if _cache_length(kv[0]) != seq.shape[1]:
                # a bridge whose attention stores no keys and values (TransformerLens's on
                # transformers 5.24, which hands attention the cache under another name): the
                # cached logits saw only their own chunk, so full forwards give them
                kept[0] = False
                return self.last_logits(seq)
            return logits[0, -1]

        return cached

    def named(self, label: str, path: Path | None) -> Any:
        self.model.cfg.model_name = label  # TransformerLens keeps a model's name there
        self.model.cfg.model_path = None if path is None else str(path.expanduser().resolve())
        return self.model


class CallableBackend(Backend):
    """An HF causal LM or a callable taking ``input_ids`` and returning logits, passed as it is: its
    forward only."""

    name = "callable"
    runs_analyses = False

    @property
    def label(self) -> str:
        return type(self.model).__name__

    def loss_path(self, path: str = "auto") -> str:
        return "hf"

    def _refuse(self) -> InputError:
        return InputError(
            f"a {type(self.model).__name__} is not a model from ropelens.load_model: load it with "
            "ropelens.load_model, or wrap an HF model with ropelens.loading.models.wrap_hf_model"
        )

    def capture_session(
        self, spec: RopeSpec, layers: Sequence[int], reducers: Sequence[Reducer]
    ) -> Iterator[Run]:
        raise self._refuse()

    def uses_engine(self, layers: Sequence[int], what: str) -> bool:
        raise self._refuse()

    def named(self, label: str, path: Path | None) -> Any:
        raise self._refuse()


def _cache_length(cache: Any) -> int | None:
    """Tokens an HF key/value cache holds (None where it is none)."""
    length = getattr(cache, "get_seq_length", None)
    return int(length()) if callable(length) else None


def _hf_stepper(hf: Any, cache: bool, chunk: int | None) -> Callable[[Tensor, Tensor], Tensor]:
    """Decoding steps on an HF causal LM: a key/value cache prefilled ``chunk`` tokens at a time, or
    full forwards."""
    if not cache:
        return lambda _new, seq: hf(input_ids=seq, use_cache=False, logits_to_keep=1).logits[0, -1]
    kv: list[Any] = [None]
    # the HF forward's cache argument: ``cache`` since transformers 5.24, ``past_key_values`` before
    name = (
        "cache" if "cache" in inspect.signature(type(hf).forward).parameters else "past_key_values"
    )

    def cached(new: Tensor, _seq: Tensor) -> Tensor:
        logits = None
        for s in range(0, new.shape[1], chunk or new.shape[1]):
            res = hf(
                input_ids=new[:, s : s + (chunk or new.shape[1])],
                use_cache=True,
                logits_to_keep=1,
                **{name: kv[0]},
            )
            logits, kv[0] = res.logits, getattr(res, name)
        return logits[0, -1]

    return cached


def plain_of_nnsight(model: Any) -> Any:
    """The model ropelens runs for an nnsight wrapper (``nnsight.LanguageModel``,
    ``TransformersModel``): the :class:`~ropelens.backends.hf.PlainModel` of the HF causal LM it
    wraps and its tokenizer, made once and kept on the wrapper (so a variant or ablation applied
    through it is in force for every analysis given it); ``model`` itself for anything else.

    The HF model is the engine, as it is, on its device and in its dtype: the numbers are those of
    the same HF model given to :func:`ropelens.loading.models.wrap_hf_model` with
    ``bridge=False``. A wrapper still on the meta device (nnsight's lazy loading) is dispatched
    first, as its own first trace would.
    """
    if not is_nnsight(model):
        return model
    held = model.__dict__
    if held.get("dispatched") is False and callable(getattr(type(model), "dispatch", None)):
        model.dispatch()  # real weights in place of nnsight's meta skeleton
    hf = nnsight_module(model)
    known = held.get(_NNSIGHT)
    if known is not None and known.original_model is hf:
        return known
    if not isinstance(hf, torch.nn.Module) or not hasattr(hf, "config"):
        raise InputError(
            f"a {type(model).__name__} wrapping a {type(hf).__name__}: ropelens measures the HF "
            "causal LMs nnsight wraps (nnsight.LanguageModel(path or HF model))"
        )
    tokenizer = held.get("tokenizer")
    if tokenizer is None:
        raise InputError(
            f"a {type(model).__name__} without a tokenizer: pass one "
            "(nnsight.LanguageModel(hf_model, tokenizer=tokenizer))"
        )
    label = held.get("repo_id")
    if not isinstance(label, str) or not label:
        label = str(getattr(hf.config, "name_or_path", "") or type(hf).__name__)
    plain = plain_model(hf, tokenizer, label=label, why=f"held in nnsight ({type(model).__name__})")
    held[_NNSIGHT] = plain
    return plain


register_runner(plain_of_nnsight)


def backend_of(model: Any) -> Backend:
    """The backend ``model`` runs on, chosen on first use and kept on the model (an nnsight
    model's: its HF model's, :func:`plain_of_nnsight`)."""
    model = plain_of_nnsight(model)
    known = getattr(model, "__dict__", {}).get(_ATTR)
    if known is not None and known.model is model:
        return known

    if isinstance(model, PlainModel):
        backend: Backend = HFBackend(model)
    elif hasattr(
        model, "original_model"
    ):  # a TransformerBridge (its blocks may be missing for an unadapted family)
        backend = BridgeBackend(model)
    else:
        backend = CallableBackend(model)
    with contextlib.suppress(
        AttributeError, TypeError
    ):  # a callable may refuse attributes: choose again next time
        object.__setattr__(model, _ATTR, backend)
    return backend


@dataclass(frozen=True)
class ModelHandle:
    """A loaded model with what every layer reads from it: its backend (chosen once), label, device,
    dtype, the HF model it runs, and its spec (read once, and again only when the plan in force, a
    buffer, or a rotation or attention function the model calls changes).
    :func:`ropelens.run.measure.measure` reads models through it."""

    model: Any
    backend: Backend

    @property
    def label(self) -> str:
        return self.backend.label

    @property
    def device(self) -> torch.device:
        return device_of(self.model)

    @property
    def dtype(self) -> torch.dtype:
        return next(
            (p.dtype for p in self.model.parameters() if p.is_floating_point()), torch.float32
        )

    @property
    def hf(self) -> torch.nn.Module:
        return self.backend.hf

    @property
    def spec(self) -> RopeSpec:
        """What each attention layer rotates, at the plan in force
        (:func:`ropelens.spec.reading.rope_spec`)."""
        # what a reading depends on: the plan in force, every buffer (rotary tables included) and
        # its in-place version, and the rotation and attention functions the modeling module and its
        # modules call
        mod = importlib.import_module(type(self.hf).__module__)
        steps = tuple(active_plan(self.model))
        buffers = tuple(self.hf.buffers())
        functions = tuple(
            getattr(mod, n, None)
            for n in ("apply_rotary_pos_emb", "rotate_half", "eager_attention_forward")
        )
        forwards = tuple(m.__dict__.get("forward") for m in self.hf.modules())
        key = (
            tuple(id(s) for s in steps),
            getattr(self.model, "_ropelens_interventions", 0),
            tuple((id(b), b._version) for b in buffers),
            tuple(id(f) for f in functions),
            tuple(id(f) for f in forwards),
        )
        cached = self.__dict__.get("_spec")
        if cached is None or cached[0] != key:
            # the objects the key names by id stay alive with it: a plan step, buffer or forward
            # made after one is freed could otherwise take its id and be read as the old one (a
            # new ablation given the spec of the one before)
            cached = (key, rope_spec(self.model), (steps, buffers, functions, forwards))
            object.__setattr__(self, "_spec", cached)
        return cached[1]

    @property
    def fingerprint(self) -> str:
        """What a verification of the model depends on (:func:`fingerprint`)."""
        return fingerprint(self.model, self.spec)


def handle(model: Any) -> ModelHandle:
    """The :class:`ModelHandle` of a model from :func:`ropelens.load_model` (made once, kept on the
    model); raises InputError, naming the fix, for anything else."""
    if isinstance(model, ModelHandle):
        return model
    model = plain_of_nnsight(model)
    known = getattr(model, "__dict__", {}).get(_HANDLE)
    if known is not None and known.model is model:
        return known
    backend = backend_of(model)
    if not backend.runs_analyses:
        raise InputError(
            f"model must be an embedded name, a path, or a model from ropelens.load_model; got a "
            f"{type(model).__name__}: wrap an HF model with ropelens.loading.models.wrap_hf_model"
        )
    h = ModelHandle(model=model, backend=backend)
    object.__setattr__(model, _HANDLE, h)
    return h


def _modeling_module(model):
    return importlib.import_module(type(hf_model_of(model)).__module__)


def fingerprint(model, spec: RopeSpec) -> str:
    """What the verification of ``model`` depends on: the spec, the code that rotates and scores,
    the hooks. Each function, forward and hook is named by :func:`object_serial`, never by its id:
    one freed and another made at its address must not read as the one verified."""
    parts = [spec.to_json()]
    mod = _modeling_module(model)
    parts += [
        f"{n}:{object_serial(getattr(mod, n, None))}"
        for n in ("apply_rotary_pos_emb", "rotate_half", "eager_attention_forward", "repeat_kv")
    ]
    for m in hf_model_of(model).modules():
        name = type(m).__name__.lower()
        if ("attention" in name or "rotary" in name) and "bridge" not in name:
            parts.append(
                f"{type(m).__qualname__}:{object_serial(type(m).forward)}:"
                f"{object_serial(m.__dict__.get('forward'))}"
            )
    for b in getattr(model, "blocks", ()):
        attn = getattr(b, "attn", None)
        if attn is not None:
            hooks = (*attn._forward_pre_hooks.values(), *attn._forward_hooks.values())
            parts.append(str([object_serial(h) for h in hooks]))
    for name, hp in getattr(model, "hook_dict", {}).items():
        if ".attn." in name and getattr(hp, "fwd_hooks", None):
            parts.append(f"{name}:{[object_serial(h) for h in hp.fwd_hooks]}")
    parts.append(str(getattr(model, "_ropelens_interventions", 0)))
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()
