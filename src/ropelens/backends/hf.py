"""The plain HF model, for architectures TransformerLens cannot wrap: q, k and patterns read from
its own forward.

TransformerLens 4 has no adapter for some RoPE families (Ministral, Helium, Persimmon, PhiMoE, ...)
and cannot wrap others (Falcon's grouped KV heads in a fused projection).
:func:`ropelens.load_model` returns a :class:`PlainModel` for those (and for any model with
``bridge=False``): the HF causal LM and its tokenizer behind the small surface ropelens reads from a
bridge (``cfg``, ``tokenizer``, ``to_tokens``, a forward that returns logits, ``parameters``). Its
RoPE is read from the HF modules as a bridge's is; queries and keys come from the fast q/k path
(:mod:`ropelens.backends.sdpa_capture`) or, where that declines or a pattern is needed, from
:func:`capture`, which runs the HF model with eager attention and taps the family's
``apply_rotary_pos_emb`` (pre-RoPE q and k) and ``eager_attention_forward`` (the q and k that enter
the score, and the probabilities).

RoPE variants, plane ablations and massive-value replacement run on a plain model as on any other,
at the rotation its forward calls (:mod:`ropelens.backends.engine`): :class:`PlainModel`'s forward
and :func:`capture` apply the interventions in force. Only TransformerLens's own surface (hook
points, ``run_with_cache``) needs the bridge; asking a plain model for it raises
:class:`BridgeOnlyError` in one line.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import inspect
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

import torch
from torch import Tensor

from ropelens.backends.engine import rotation_plan
from ropelens.backends.sdpa_capture import attention_implementation, hf_view, sdpa_attention
from ropelens.devices import device_of
from ropelens.errors import InputError, UnsupportedModelError
from ropelens.spec.forward_taps import (
    attention_tap,
    complex_positions_axis,
    outside_indexers,
    rotation_functions,
    single_rotation,
    table_rotation,
)
from ropelens.spec.plan import active_plan
from ropelens.spec.reading import is_token_mixer, unmodified_spec

__all__ = [
    "BridgeOnlyError",
    "PlainConfig",
    "PlainModel",
    "attention_modules",
    "capture",
    "is_plain",
    "what_works",
]

# what still runs on a plain model (said in every refusal, so a user knows where to go instead)
WORKS = (
    "every ropelens analysis, intervention (RoPE variants, plane ablations, massive-value "
    "replacement) and the report"
)
# TransformerLens's surface: asking a plain model for it means the caller needs the bridge's hooks
_BRIDGE_ONLY = frozenset(
    {
        "blocks",
        "hook_dict",
        "hooks",
        "run_with_cache",
        "run_with_hooks",
        "add_hook",
        "reset_hooks",
        "mod_dict",
    }
)


class BridgeOnlyError(UnsupportedModelError, AttributeError):
    """A plain model asked for TransformerLens's hooks; an AttributeError too, so ``hasattr`` stays
    False."""


@dataclass(frozen=True)
class PlainConfig:
    """The config fields ropelens reads from a bridge's ``cfg``, for a plain HF model."""

    model_name: str
    model_path: str | None
    architecture: str
    n_layers: int
    n_ctx: int
    d_vocab: int
    device: torch.device
    dtype: torch.dtype
    why: str  # why there is no bridge: TransformerLens's refusal, or "bridge=False"
    positional_embedding_type: str = "rotary"


def _text_config(hf) -> Any:
    cfg = hf.config
    return cfg.get_text_config() if hasattr(cfg, "get_text_config") else cfg


def decoder_layers(hf) -> Sequence[torch.nn.Module]:
    """The HF model's decoder layers: the first ModuleList with one entry per hidden layer; where
    decoder layers hold several attention sublayers each (LongCat-Flash: two, HF counting 2 ×
    num_layers hidden layers), the decoder layer of each sublayer (:func:`_attention_sublayers`)."""
    n = int(getattr(_text_config(hf), "num_hidden_layers", 0) or 0)
    for name, m in hf.named_modules():
        # a vision tower's blocks (Qwen2-VL's visual.blocks) come first and may be as many as the
        # decoder layers
        if (
            isinstance(m, torch.nn.ModuleList)
            and len(m) == n
            and not any(w in name for w in ("visual", "vision"))
        ):
            return m
    sub = _attention_sublayers(hf, n)
    if sub is not None:
        return [decoder for decoder, _ in sub]
    raise UnsupportedModelError(
        f"{type(hf).__name__}: found no list of {n} decoder layers in the HF model, nor {n} "
        f"attention sublayers numbered 0 to {n - 1} (layer_idx), so ropelens cannot tell its "
        "attention layers apart"
    )


def _attention_sublayers(hf, n: int) -> list[tuple[torch.nn.Module, torch.nn.Module]] | None:
    """(decoder layer, attention) for each of the ``n`` layers HF counts, where decoder layers hold
    several attention sublayers, each numbered by its own ``layer_idx`` (LongCat-Flash's attention j
    of decoder layer i is layer 2i + j, as its KV cache counts them); None unless every number
    0..n-1 names one attention (a module with a score scale)."""
    found: dict[int, tuple[torch.nn.Module, torch.nn.Module]] = {}
    for lst in (m for m in hf.modules() if isinstance(m, torch.nn.ModuleList) and 0 < len(m) < n):
        for decoder in lst:
            for sub in decoder.modules():
                idx = getattr(sub, "layer_idx", None)
                attention = (
                    sub is not decoder
                    and isinstance(idx, int)
                    and isinstance(getattr(sub, "scaling", None), float)
                )
                if attention and found.setdefault(idx, (decoder, sub))[1] is not sub:
                    return None  # one number, two modules: not a numbering of layers
    return [found[i] for i in range(n)] if n and sorted(found) == list(range(n)) else None


def attention_modules(hf) -> list[torch.nn.Module | None]:
    """Each decoder layer's softmax self-attention module (its first child whose class is an
    attention and no linear attention, as MiniMax's lightning attention is, nor cross-attention),
    None where it has none; each attention sublayer where decoder layers hold several
    (:func:`decoder_layers`)."""
    n = int(getattr(_text_config(hf), "num_hidden_layers", 0) or 0)
    if not any(isinstance(m, torch.nn.ModuleList) and len(m) == n for m in hf.modules()):
        sub = _attention_sublayers(hf, n)
        if sub is not None:
            return [attn for _, attn in sub]
    out: list[torch.nn.Module | None] = []
    for layer in decoder_layers(
        hf
    ):  # cross-attention (Mllama's, to image states) is no self-attention: None
        out.append(
            next(
                (
                    c
                    for c in layer.children()
                    if "attention" in type(c).__name__.lower()
                    and not is_token_mixer(type(c).__name__)
                    and "crossattention" not in type(c).__name__.lower()
                ),
                None,
            )
        )
    return out


class PlainModel(torch.nn.Module):
    """An HF causal LM and its tokenizer behind the surface ropelens reads from a TransformerLens
    bridge."""

    def __init__(self, hf: torch.nn.Module, tokenizer: Any, cfg: PlainConfig) -> None:
        super().__init__()
        self.original_model = hf  # where ropelens.spec.reading.hf_model_of looks, as on a bridge
        self.tokenizer = tokenizer
        self.cfg = cfg

    def __getattr__(self, name: str) -> Any:
        if name in _BRIDGE_ONLY:
            cfg = self.__dict__.get("cfg")
            raise BridgeOnlyError(
                refusal(
                    cfg,
                    f"model.{name} is TransformerLens's hook surface, which only the bridge has",
                )
            )
        return super().__getattr__(name)

    @property
    def attention_blocks(self) -> list[SimpleNamespace]:
        """Each decoder layer as ``reading`` reads a bridge block: ``.attn.original_component``, no
        ``.attn`` where it has no softmax attention; ``.original_component`` is the HF decoder layer
        (its token mixer is read there)."""
        layers = decoder_layers(
            self.original_model
        )  # each block's HF decoder layer, where its other mixers live
        return [
            SimpleNamespace(original_component=d)
            if a is None
            else SimpleNamespace(attn=SimpleNamespace(original_component=a), original_component=d)
            for a, d in zip(attention_modules(self.original_model), layers, strict=True)
        ]

    def to_tokens(self, text: str | Sequence[str], prepend_bos: bool = True) -> Tensor:
        """``[batch, pos]`` token ids of ``text`` on the model's device, BOS first (as the bridge's
        ``to_tokens``)."""
        texts = [text] if isinstance(text, str) else list(text)
        bos = getattr(self.tokenizer, "bos_token_id", None)
        rows = [
            ([bos] if prepend_bos and bos is not None else [])
            + self.tokenizer(t, add_special_tokens=False)["input_ids"]
            for t in texts
        ]
        n = max(len(r) for r in rows)
        pad = getattr(self.tokenizer, "pad_token_id", None) or 0
        return torch.tensor([r + [pad] * (n - len(r)) for r in rows], device=self.cfg.device)

    def forward(
        self,
        input: Tensor | str | None = None,
        return_type: str | None = "logits",
        *,
        input_ids: Tensor | None = None,
        **kwargs: Any,
    ) -> Any:
        """``model(tokens)`` → logits ``[batch, pos, vocab]`` as a bridge gives
        (``return_type=None``: nothing); ``model(input_ids=...)`` → the HF model's own output, as an
        HF causal LM gives."""
        hf = self.original_model
        if input_ids is not None:
            with self._planned(hf):
                return hf(input_ids=input_ids, **kwargs)
        if return_type not in ("logits", None):
            raise InputError(
                f"return_type {return_type!r} is not supported on a plain HF model: use 'logits' "
                "or None"
            )
        toks = self.to_tokens(input) if isinstance(input, str) else input
        with (
            sdpa_attention(hf),
            self._planned(hf),
        ):  # the logits of eager attention, without its [heads, n, n] matrices
            out = hf(input_ids=toks.to(self.cfg.device), use_cache=False, **kwargs)
        return None if return_type is None else out.logits

    def _planned(self, hf: torch.nn.Module) -> contextlib.AbstractContextManager:
        """The RoPE variants, plane ablations and replacements in force on this model, applied at
        the rotations its forward calls (:mod:`ropelens.backends.engine`)."""
        return planned_forward(self, hf)


def planned_forward(model: Any, hf: torch.nn.Module) -> contextlib.AbstractContextManager:
    """A block in which ``hf`` (the HF model under ``model``, or its view) runs with ``model``'s
    plan applied (the variants, ablations and replacements in force); nothing where none is."""
    plan = active_plan(model)
    if not plan:
        return contextlib.nullcontext()

    return rotation_plan(hf, unmodified_spec(model), plan, attns=attention_modules(hf))


def is_plain(model: Any) -> bool:
    """Whether ``model`` is a :class:`PlainModel` (an HF model ropelens runs without the bridge)."""
    return isinstance(model, PlainModel)


def refusal(cfg: PlainConfig | None, what: str) -> str:
    """One line: the architecture, that it runs without the bridge and why, what cannot run, and
    what can."""
    arch = getattr(cfg, "architecture", None) or "model"
    why = getattr(cfg, "why", None)
    why = (
        "loaded without the TransformerLens bridge (bridge=False)"
        if why in (None, "bridge=False")
        else why
    )
    return f"{arch}: {why}, so ropelens runs the plain HF model; {what}. What works: {WORKS}"


def what_works() -> str:
    """What runs on a plain HF model (the q/k analyses and the plain forward)."""
    return WORKS


def plain_model(hf: torch.nn.Module, tokenizer: Any, *, label: str, why: str) -> PlainModel:
    """Wrap an HF causal LM already on its device and dtype as a :class:`PlainModel` named
    ``label``."""
    cfg = _text_config(hf)
    if not isinstance(
        getattr(cfg, "num_hidden_layers", None), int
    ):  # BLT: a stack over bytes, one over patches, ...
        raise UnsupportedModelError(
            f"{type(hf).__name__}: its config counts no layers (num_hidden_layers): they are "
            "split over separate stacks "
            f"({', '.join(getattr(cfg, 'sub_configs', None) or ()) or 'sub-configs'}), not all "
            "over the input's tokens; ropelens measures one stack of layers over the input's "
            "tokens."
        )
    n_ctx = int(
        getattr(cfg, "max_position_embeddings", None) or getattr(cfg, "n_positions", 0) or 0
    )
    dtype = next((p.dtype for p in hf.parameters() if p.is_floating_point()), torch.float32)
    pc = PlainConfig(
        model_name=label,
        model_path=None,
        architecture=type(hf).__name__,
        n_layers=int(cfg.num_hidden_layers),
        n_ctx=n_ctx,
        d_vocab=int(getattr(cfg, "vocab_size", 0) or 0),
        device=device_of(hf),
        dtype=dtype,
        why=why,
    )
    return PlainModel(hf.eval(), tokenizer, pc).eval()


def vl_model(model_or_hf: Any, label: str | None = None) -> PlainModel:
    """A :class:`PlainModel` of an HF vision-language model, measured on its text tower
    (``model_or_hf`` itself where it is one already)."""
    if is_plain(model_or_hf):
        return model_or_hf
    if hasattr(model_or_hf, "original_model") or not hasattr(model_or_hf, "config"):
        raise UnsupportedModelError(
            f"{type(model_or_hf).__name__}: M-RoPE is measured on the plain HF model: pass the HF "
            "vision-language model itself, or ropelens.loading.vision_language.load_vl_model(path)"
        )
    name = label or getattr(model_or_hf.config, "_name_or_path", "") or type(model_or_hf).__name__
    return plain_model(
        model_or_hf,
        None,
        label=str(name),
        why="a vision-language model, measured on its text tower",
    )


# ------------------------------------------------------------------------------------------ capture
class _Stop(Exception):
    """Raised after the last layer asked for: the rest of the forward is skipped."""


def mixed_weights(module: torch.nn.Module, value: Tensor, out: tuple) -> Tensor | None:
    """The weights an HF eager attention function's output mixes the values with, ``[batch, head, q,
    k]``.

    That is the probabilities it returns, except where a module with learned ``sinks`` returns the
    softmax without them and scales each query's output after it (Granite SWA: ``sigmoid(logsumexp −
    sink)``, an extra logit in the softmax's denominator): then the returned probabilities times
    that scale, measured as the ratio of the output to the returned probabilities' mix of the
    values. An output that is no per-query multiple of that mix is left to the probe's probability
    check.
    """
    p = out[1] if isinstance(out, tuple) and len(out) > 1 else None
    if (
        not isinstance(p, Tensor)
        or not isinstance(getattr(module, "sinks", None), Tensor)
        or p.ndim != 4
    ):
        return p
    mixed = p.float() @ value.float().repeat_interleave(p.shape[1] // value.shape[1], dim=1)
    o = out[0].float().transpose(1, 2) if isinstance(out[0], Tensor) and out[0].ndim == 4 else None
    if o is None or o.shape != mixed.shape:
        return p
    scale = (o * mixed).sum(-1) / (mixed * mixed).sum(-1).clamp_min(1e-30)
    # a 16-bit output is rounded to its eps (bf16: 4e-3 relative): a per-query scale fits to 2e-2 of
    # the largest entry; any other change of the output after the mix is off by O(1)
    if (
        float((o - scale[..., None] * mixed).abs().max())
        > 2e-2 * float(o.abs().max().clamp_min(1e-30))
        or float((scale - 1).abs().max()) <= 1e-6
    ):  # the sinks already in the probabilities (gpt-oss)
        return p
    return (p.float() * scale[..., None]).to(p.dtype)


def _one_per_kv_head(k: Tensor, n_kv: int, cannot: Callable[[str], Exception], L: int) -> Tensor:
    """Keys ``[b, heads, pos, d]`` as the model holds them: one per KV head. Falcon's new decoder
    architecture broadcasts each group's key to its query heads (head h reads group h // group
    size); the copies must be equal."""
    if k.shape[1] == n_kv:
        return k
    g = k.shape[1] // n_kv
    if k.shape[1] % n_kv or not g:  # fewer keys than KV heads, or not a whole number of copies
        raise cannot(f"layer {L} rotates {k.shape[1]} keys that are not {n_kv} KV heads repeated")
    one = k[:, ::g]
    if not torch.equal(one.repeat_interleave(g, dim=1), k):
        raise cannot(f"layer {L} rotates {k.shape[1]} keys that are not {n_kv} KV heads repeated")
    return one


def _tiled_like(k: Tensor, k_rot: Tensor, k_post: Tensor) -> tuple[Tensor, Tensor]:
    """The rotation's keys ``[b, kv_heads, pos, d]`` tiled as they enter the score, where the model
    tiles them (JetMoE repeats all its KV heads once per expert slot: query head h reads key h mod
    kv_heads); else as given."""
    n, m = k_rot.shape[1], k_post.shape[1]
    if (
        k_rot.ndim != 4
        or k_post.ndim != 4
        or m <= n
        or m % n
        or k_rot.shape[2:] != k_post.shape[2:]
    ):
        return k, k_rot
    tiled = k_rot.repeat(1, m // n, 1, 1)
    if not torch.equal(
        tiled, k_post
    ):  # grouped copies, or a change after the rotation: left to the checks below
        return k, k_rot
    return k.repeat(1, m // n, 1, 1), tiled


class _LayerTaps:
    """One :func:`capture` forward: the layer running, what its taps saw, the layers done.

    ``current`` is a one-item list because the rotation taps (:func:`_single_tap`,
    :func:`_table_tap`) and :func:`outside_indexers` share it.
    """

    def __init__(
        self,
        spec,
        layers: Sequence[int],
        needs: frozenset[str],
        on_layer: Callable[[int, dict[str, Tensor]], object],
        cannot: Callable[[str], Exception],
        attns: list,
    ) -> None:
        self.spec, self.needs, self.on_layer, self.cannot = spec, needs, on_layer, cannot
        self.wanted, self.last = set(layers), max(layers)
        # layers reusing an earlier layer's keys -> that layer
        self.sources = {
            layer: source for layer, source in kv_sources(attns).items() if layer in self.wanted
        }
        self.rotated = self.wanted | set(
            self.sources.values()
        )  # the layers whose rotations are kept
        self.keys: dict[
            int, tuple[Tensor, Tensor]
        ] = {}  # a source layer's (pre-RoPE, rotated) keys
        self.current: list[int | None] = [None]
        self.got: dict[int, dict[str, tuple]] = {}
        self.done: set[int] = set()

    def tapped_rotation(self, rotation: Callable, flip: bool = False) -> Callable:
        """``rotation`` tapped: the first ``(q, k, q_rot, k_rot)`` of each wanted layer is kept.

        ``flip``: the rotation takes ``[batch, pos, head, dim]`` (Llama 4), kept with heads first.
        """
        if single_rotation(rotation):
            return _single_tap(rotation, self.current, self.rotated, self.got)
        if table_rotation(rotation):
            return _table_tap(rotation, self.current, self.rotated, self.got)

        def tapped(q, k=None, *args, **kwargs):
            out = rotation(q, k, *args, **kwargs)
            layer = self.current[0]
            # the layer's first rotation (k None: queries alone, Qwen4-Exp's indexer form, never
            # the layer's)
            if (
                layer in self.wanted
                and k is not None
                and "rot" not in self.got.setdefault(layer, {})
            ):
                tensors = (q, k, *out)
                if flip:
                    tensors = tuple(tensor.transpose(1, 2) for tensor in tensors)
                self.got[layer]["rot"] = tensors
            return out

        return tapped

    def tapped_attention(self, attention_function: Callable) -> Callable:
        """``eager_attention_forward`` tapped: a wanted layer's first query, key, weights, mask."""

        def tapped(module, query, key, value, attention_mask, *args, **kwargs):
            out = attention_function(module, query, key, value, attention_mask, *args, **kwargs)
            layer = self.current[0]
            if layer in self.wanted and "att" not in self.got.setdefault(layer, {}):
                weights = mixed_weights(module, value, out)
                self.got[layer]["att"] = (query, key, weights, attention_mask)
            return out

        return tapped

    def sdpa_seen(self, _module, query: Tensor, key: Tensor, attention_mask: Tensor | None) -> None:
        """The query, key and mask entering a wanted layer's sdpa attention (no pattern)."""
        layer = self.current[0]
        if layer in self.wanted and "att" not in self.got.setdefault(layer, {}):
            self.got[layer]["att"] = (query, key, None, attention_mask)

    def enter(self, layer: int) -> Callable[..., None]:
        """The pre-hook of layer ``layer``'s attention module."""

        def hook(_module, _args) -> None:
            self.current[0] = layer

        return hook

    def leave(self, layer: int) -> Callable[..., None]:
        """The hook after layer ``layer``'s attention: hand its tensors on, stop after the last."""

        def hook(_module, _args, output) -> None:
            self.current[0] = None
            self.finish_layer(layer, self.got.pop(layer, {}), output)
            if layer == self.last:
                raise _Stop

        return hook

    def finish_layer(self, layer: int, record: dict, output: Any) -> None:
        """Complete ``record`` (what layer ``layer``'s taps saw); hand it on if wanted."""
        if "calls" in record:
            # GPT-J's form: which call rotated the queries is read off the attention's inputs
            record["rot"] = _queries_and_keys(
                record.pop("calls"), record.get("att"), self.cannot, layer
            )
        if layer in self.sources.values() and "rot" in record:
            self.keys[layer] = (record["rot"][1], record["rot"][3])
        if layer in self.sources and "q_only" in record and self.sources[layer] in self.keys:
            # its keys: the source's, as they were stored
            (q, q_rotated), (k, k_rotated) = record.pop("q_only"), self.keys[self.sources[layer]]
            record["rot"] = (q, k, q_rotated, k_rotated)
        if layer in self.wanted:
            tensors = _assemble(self.spec[layer], record, output, self.needs, self.cannot)
            self.on_layer(layer, tensors)
            self.done.add(layer)

    def register(self, attns: list) -> list:
        """Hook the attention modules up to the last layer; return the handles."""
        handles = []
        for layer, attention in enumerate(attns[: self.last + 1]):
            if attention is not None:
                handles.append(attention.register_forward_pre_hook(self.enter(layer)))
                handles.append(attention.register_forward_hook(self.leave(layer)))
        # a sparse-attention indexer's rotation is not the layer's
        handles += outside_indexers(attns[: self.last + 1], self.current)
        return handles


@contextlib.contextmanager
def _replaced_functions(module: Any, replacements: dict[str, Callable]) -> Iterator[None]:
    """``module``'s functions named in ``replacements`` replaced while the block runs."""
    saved = {name: getattr(module, name) for name in replacements}
    for name, function in replacements.items():
        setattr(module, name, function)
    try:
        yield
    finally:
        for name, function in saved.items():
            setattr(module, name, function)


def _run_to_last_layer(
    hf: torch.nn.Module,
    tokens: Tensor,
    attention_mask: Tensor | None,
    *,
    sdpa_seen: Callable | None,
    attns: list,
    output_attentions: bool,
) -> None:
    """Run ``hf`` on ``tokens`` until its hooks stop it after the last layer wanted.

    With ``sdpa_seen``, the model runs its sdpa attention and ``sdpa_seen`` sees the inputs of
    ``attns``; else its eager attention.
    """
    sdpa_taps = (
        attention_tap([a for a in attns if a is not None], sdpa_seen, with_mask=True)
        if sdpa_seen is not None
        else contextlib.nullcontext()
    )
    implementation = "sdpa" if sdpa_seen is not None else "eager"
    try:
        with attention_implementation(hf, implementation), torch.no_grad(), sdpa_taps:
            hf(
                input_ids=tokens,
                attention_mask=attention_mask,
                use_cache=False,
                output_attentions=output_attentions,
            )
    except _Stop:
        pass


def _capture_refusal(cfg: PlainConfig | None, why: str) -> UnsupportedModelError:
    """The error :func:`capture` raises where it cannot read a family's queries and keys."""
    return UnsupportedModelError(
        refusal(cfg, f"its queries and keys cannot be read from the HF forward ({why})")
    )


def capture(
    model: PlainModel,
    spec,
    tokens: Tensor,
    valid: Tensor,
    layers: Sequence[int],
    needs: frozenset[str],
    on_layer: Callable[[int, dict[str, Tensor]], object],
    *,
    padded: bool,
) -> None:
    """Run the plain HF model on one batch; hand each of ``layers`` its ``needs`` to ``on_layer``.

    ``on_layer(layer, tensors)``: tensors are ``[batch, pos, head, d]`` (keys: KV heads) and the
    pattern ``[batch, head, q, k]``. Pre-RoPE q and k are what the family's
    ``apply_rotary_pos_emb`` receives (a partial-rotary slice completed by the dims that pass
    unrotated); post-RoPE q and k and the pattern are what its ``eager_attention_forward`` receives
    and returns, else the rotation's output and the attention module's returned probabilities.
    Without the pattern the model runs its sdpa attention where it has one, q and k read where
    they enter it. The forward stops after the last layer. A family this cannot read raises
    UnsupportedModelError.
    """
    hf = hf_view(model)
    cannot = functools.partial(_capture_refusal, model.cfg)
    module = importlib.import_module(type(hf).__module__)
    rotations = rotation_functions(module)
    eager_attention = getattr(module, "eager_attention_forward", None)
    if not rotations:
        raise cannot(
            f"{type(hf).__name__} has no apply_rotary_pos_emb(q, k, ...) or (x, cos, sin, ...) "
            "to tap"
        )
    attns = attention_modules(hf)
    taps = _LayerTaps(spec, layers, needs, on_layer, cannot, attns)
    replacements = {
        name: taps.tapped_rotation(
            rotation, name == "apply_rotary_emb" and complex_positions_axis(rotation) == 1
        )
        for name, rotation in rotations.items()
    }
    # q/k alone: the family's sdpa attention, its inputs tapped (eager attention would build every
    # [heads, n, n] score matrix only to throw it away: 128 heads of DeepSeek V3)
    fast = (
        "pattern" not in needs
        and eager_attention is not None
        and bool(getattr(hf, "_supports_sdpa", False))
    )
    if eager_attention is not None and not fast:
        replacements["eager_attention_forward"] = taps.tapped_attention(eager_attention)
    handles = taps.register(attns)
    try:
        with _replaced_functions(module, replacements):
            _run_to_last_layer(
                hf,
                tokens,
                valid.long() if padded else None,
                sdpa_seen=taps.sdpa_seen if fast else None,
                attns=attns,
                output_attentions=eager_attention is None and "pattern" in needs,
            )
    finally:
        for handle in handles:
            handle.remove()
    missing = sorted(taps.wanted - taps.done)
    if missing:
        raise cannot(f"layers {missing} ran no attention module ropelens could find")


def _single_tap(
    fn: Callable, current: list[int | None], wanted: set[int], got: dict[int, dict[str, tuple]]
) -> Callable:
    """``fn`` (the one-tensor form) tapped: a layer's first call rotates its queries, the second its
    keys; both are kept as ``(q, k, q_rot, k_rot)`` ``[batch, heads, pos, d]``, heads moved from
    where ``unsqueeze_dim`` puts them (the axis cos and sin broadcast over). A layer that rotates
    its queries only (its keys are an earlier layer's) keeps ``"q_only"``."""
    sig = inspect.signature(fn)

    def tapped(x, *args, **kwargs):
        out = fn(x, *args, **kwargs)
        L = current[0]
        rec = got.setdefault(L, {}) if L in wanted else {}
        if L in wanted and "rot" not in rec:
            bound = sig.bind(x, *args, **kwargs)
            bound.apply_defaults()
            heads = int(bound.arguments["unsqueeze_dim"])
            pair = (x.movedim(heads, 1), out.movedim(heads, 1))
            if "q_only" not in rec:
                rec["q_only"] = pair
            else:
                (q, q_rot), (k, k_rot) = rec.pop("q_only"), pair
                rec["rot"] = (q, k, q_rot, k_rot)
        return out

    return tapped


def _table_tap(
    fn: Callable, current: list[int | None], wanted: set[int], got: dict[int, dict[str, tuple]]
) -> Callable:
    """``fn`` (GPT-J's ``(tensor, sin, cos)`` form) tapped: a layer's first two calls are kept as
    (input, output) pairs; :func:`_queries_and_keys` tells queries from keys once the attention
    function's inputs are seen."""

    def tapped(x, *args, **kwargs):
        out = fn(x, *args, **kwargs)
        L = current[0]
        if L in wanted:
            calls = got.setdefault(L, {}).setdefault("calls", [])
            if len(calls) < 2:
                calls.append((x, out))
        return out

    return tapped


def _queries_and_keys(
    calls: list, att: tuple | None, cannot: Callable[[str], Exception], L: int
) -> tuple:
    """``(q, k, q_rot, k_rot)`` ``[batch, heads, pos, d]`` from two calls of a rotation that takes
    no head axis: each call's output, in either layout ([batch, pos, head, d] or [batch, head, pos,
    d]), is matched against the rotated slice of the query and key the attention function received
    (the order of the calls is the model's)."""
    if len(calls) != 2 or att is None:
        raise cannot(
            f"layer {L} made {len(calls)} rotation calls and {'no' if att is None else 'one'} "
            "attention-function call; ropelens reads q and k from two rotation calls (GPT-J's "
            "form) matched against the attention function's query and key"
        )
    query, key = att[0], att[1]

    def match(x: Tensor, out: Tensor, target: Tensor) -> tuple[Tensor, Tensor] | None:
        w = out.shape[-1]
        for lay in (lambda t: t.transpose(1, 2), lambda t: t):
            o = lay(out)
            if o.shape == target[..., :w].shape and torch.allclose(
                o, target[..., :w], rtol=1e-3, atol=1e-5
            ):
                return lay(x), o
        return None

    for qc, kc in (calls, calls[::-1]):
        q, k = match(*qc, query), match(*kc, key)
        if q is not None and k is not None:
            return (q[0], k[0], q[1], k[1])
    raise cannot(
        f"layer {L}'s two rotation outputs are not the rotated slices of the query and key its "
        "attention function receives"
    )


def kv_sources(attns: Sequence[torch.nn.Module | None]) -> dict[int, int]:
    """Layer → the earlier layer whose post-RoPE keys it reuses (Gemma 3n's and Gemma 4's
    ``num_kv_shared_layers``): the last layer before it of its layer type that stores its keys for
    sharing (``store_full_length_kv``)."""
    out = {}
    for i, a in enumerate(attns):
        if a is None or not getattr(a, "is_kv_shared_layer", False):
            continue
        kind = getattr(a, "layer_type", None)
        src = [
            j
            for j, b in enumerate(attns[:i])
            if b is not None
            and getattr(b, "store_full_length_kv", False)
            and getattr(b, "layer_type", None) == kind
        ]
        if src:
            out[i] = src[-1]
    return out


def can_tap(hf) -> bool:
    """Whether :func:`capture` finds a (q, k, ...) rotation to tap in ``hf``'s modeling module."""
    return bool(rotation_functions(importlib.import_module(type(hf).__module__)))


def _mla_tensors(
    lr, q: Tensor, k: Tensor, q_rot: Tensor, k_rot: Tensor, query: Tensor, key: Tensor
) -> dict[str, Tensor]:
    """An MLA layer's tensors in ropelens's head layout (rotary dims first:
    ``LayerRope.from_model``): the attention function's query and key (whole heads) with their
    rotary slice, at the spec's ``rotary_offset``, replaced by the rotation's input (pre-RoPE, in
    the plane layout the rotation writes) or output. The key's rotary slice is one head, shared by
    all."""
    o, r = lr.rotary_offset, lr.rotary_dim

    def placed(whole: Tensor, part: Tensor) -> Tensor:
        out = whole.clone()
        out[..., o : o + r] = part  # broadcasts the key's one shared head over every head
        return lr.from_model(out)

    return {
        "q_pre": placed(query, lr.pre_from_model(q)),
        "k_pre": placed(key, lr.pre_from_model(k)),
        "q_rot": placed(query, q_rot),
        "k_rot": placed(key, k_rot),
        "q_post": lr.from_model(query),
        "k_post": lr.from_model(key),
    }


def _selection(
    mask: Tensor | None, batch: int, n: int, cannot: Callable[[str], Exception], L: int
) -> Tensor:
    """``[batch, q, k]`` the keys the model's attention function lets each query see (its indexer's
    top-k folded into the causal mask): a boolean mask as given, an additive one where it is 0."""
    if (
        not isinstance(mask, Tensor)
        or mask.ndim != 4
        or mask.shape[-2:] != (n, n)
        or mask.shape[1] != 1
    ):
        got = "none" if not isinstance(mask, Tensor) else f"shape {tuple(mask.shape)}"
        raise cannot(
            f"layer {L} selects keys, but its attention function received no [batch, 1, {n}, "
            f"{n}] mask to read the selection from ({got})"
        )
    m = mask[:, 0] if mask.dtype == torch.bool else mask[:, 0] == 0
    return m.expand(batch, n, n).detach()


def _assemble(
    lr,
    rec: dict[str, tuple],
    output: Any,
    needs: frozenset[str],
    cannot: Callable[[str], Exception],
) -> dict[str, Tensor]:
    """One layer's tensors from what its rotation and attention function saw (see
    :func:`capture`)."""
    L = lr.layer
    if "rot" not in rec:
        raise cannot(f"layer {L} never called apply_rotary_pos_emb")
    q, k, q_rot, k_rot = rec["rot"]
    att = rec.get("att")
    if (
        lr.shared_rotary_key
    ):  # multi-head latent attention: a rotary slice after the no-position dims
        if att is None:
            raise cannot(
                f"layer {L}'s attention function was not seen, and its heads are made there"
            )
        mla = _mla_tensors(lr, q, k, q_rot, k_rot, att[0], att[1])
        q, k, q_rot, k_rot, q_post, k_post = (
            mla[n] for n in ("q_pre", "k_pre", "q_rot", "k_rot", "q_post", "k_post")
        )
    else:
        q_post, k_post = (att[0], att[1]) if att is not None else (q_rot, k_rot)
    k, k_rot = _tiled_like(k, k_rot, k_post)
    k, k_rot, k_post = (_one_per_kv_head(t, lr.n_kv_heads, cannot, L) for t in (k, k_rot, k_post))
    want_q, want_k = (lr.n_heads, lr.head_dim), (lr.n_kv_heads, lr.head_dim)
    if (
        (q_post.ndim, k_post.ndim) != (4, 4)
        or (q_post.shape[1], q_post.shape[-1]) != want_q
        or (k_post.shape[1], k_post.shape[-1]) != want_k
    ):
        raise cannot(
            f"layer {L}'s q {tuple(q_post.shape)} and k {tuple(k_post.shape)} are not [batch, "
            f"heads, pos, {lr.head_dim}] with {lr.n_heads} and {lr.n_kv_heads} heads"
        )
    w = q.shape[-1]
    if (
        w < lr.head_dim
    ):  # partial rotary: the dims after the rotated slice pass unrotated, so pre = post there
        q, k, q_rot, k_rot = (
            torch.cat([t, post[..., w:]], -1)
            for t, post in ((q, q_post), (k, k_post), (q_rot, q_post), (k_rot, k_post))
        )
    # q_rot/k_rot: the rotation's own output; q_post/k_post: what enters the score (they differ
    # under a norm after RoPE)
    out = {
        "q_pre": q,
        "k_pre": k,
        "q_rot": q_rot,
        "k_rot": k_rot,
        "q_post": q_post,
        "k_post": k_post,
    }
    tensors = {n: t.detach().transpose(1, 2) for n, t in out.items() if n in needs}
    if "selected" in needs and lr.selects(q_post.shape[2]):
        tensors["selected"] = _selection(
            att[3] if att is not None else None, q_post.shape[0], q_post.shape[2], cannot, L
        )
    if "pattern" in needs:
        pattern = (
            att[2]
            if att is not None
            else (output[1] if isinstance(output, tuple) and len(output) > 1 else None)
        )
        if not isinstance(pattern, Tensor):
            raise cannot(f"layer {L} returns no attention probabilities")
        tensors["pattern"] = pattern.detach()
    return tensors
