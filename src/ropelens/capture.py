"""Streaming per-head query/key capture.

One forward pass per batch; hooks hand each layer's tensors to *reducers*, which fold them into
running sums and drop them, so memory does not grow with the corpus. Reducers are mergeable:
partial results from separate runs add up exactly.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import torch
from jaxtyping import Bool, Int
from torch import Tensor
from tqdm.auto import tqdm

from ropelens.devices import device_of
from ropelens.errors import InputError, UnsupportedModelError
from ropelens.hooks import AttnHooks, attn_hooks, to_bphd
from ropelens.rope import LayerRope, RopeSpec

__all__ = ["DeviceSums", "LayerActs", "Reducer", "Moments", "stream", "capture_qk", "batches", "sum_dtype"]

# q_post/k_post: q and k where they enter the score; q_rot/k_rot: the rotation's own output (the same
# tensors, unless the layer changes them after RoPE: LayerRope.norm_after_rope)
# selected: [batch, q, k] the keys the model's indexer kept for each query (LayerRope.select_keys), where it drops some
NEEDS = frozenset({"q_pre", "k_pre", "q_rot", "k_rot", "q_post", "k_post", "pattern", "selected"})
_ATTENTION = "<attention function>"  # a tensor taken from the HF attention function's query/key, not a hook


@dataclass
class LayerActs:
    """One layer's tensors for one batch, named as in :data:`NEEDS`, each ``[batch, pos, head, d_head]`` (keys: KV heads)."""

    layer: int
    rope: LayerRope
    valid: Bool[Tensor, "batch pos"]  # False on right padding
    tensors: dict[str, Tensor] = field(default_factory=dict)
    padded: bool | None = None  # whether ``valid`` is False anywhere, when known (saves asking the device)

    def __getitem__(self, key: str) -> Tensor:
        return self.tensors[key]

    def mask(self) -> Bool[Tensor, "batch q k"]:
        """The keys each query attends to: the layer's causal (and sliding-window) mask over real tokens, and the
        model's own key selection where its indexer drops keys (captured as ``"selected"``)."""
        n = self.valid.shape[1]
        m = self.rope.mask(n, self.valid.device)[None] & self.valid[:, None, :] & self.valid[:, :, None]
        if not self.rope.selects(n):
            return m
        if "selected" not in self.tensors:
            raise UnsupportedModelError(
                f"layer {self.layer} keeps at most {self.rope.select_keys} keys per query, picked by the model's indexer, "
                f"and its selection was not captured: capture with which=(..., 'selected')")
        return m & self.tensors["selected"]


class Reducer(Protocol):
    """Folds per-layer activations into running statistics.

    A reducer that builds attention masks from positions (causal, sliding window) names itself in a
    ``static_mask`` attribute: :func:`stream` then refuses layers whose mask the model picks from the
    input on the windows given (:meth:`LayerRope.require_static_mask`).
    """

    needs: frozenset[str]

    def update(self, acts: LayerActs) -> None: ...


def sum_dtype(device: torch.device) -> torch.dtype:
    """What running sums accumulate in on ``device``: float64, or float32 on MPS (which has no float64)."""
    return torch.float32 if device.type == "mps" else torch.float64


# band-logit entries per tile: 2^21 (8 MiB of float32) measured best on the CPU (benchmarks/core_bench.py
# --tile); on accelerators larger tiles amortise kernel launches
TILE_ELEMENTS = {"cpu": 1 << 21}
TILE_ELEMENTS_ACCELERATOR = 1 << 26
MIN_TILE = 16  # queries: below this, per-tile overhead dominates whatever the memory
def query_tile(device: torch.device, entries_per_query: int) -> int:
    """Queries per tile, so one tile holds about the device's element budget (at least MIN_TILE): the
    tiling policy of every tiled reducer (band statistics, sinks, distance, offsets)."""
    budget = TILE_ELEMENTS.get(device.type, TILE_ELEMENTS_ACCELERATOR)
    return max(MIN_TILE, budget // max(1, entries_per_query))


class DeviceSums:
    """Base of reducers whose running sums ``self.sums`` (built on the CPU) live where the activations
    do: moved once, to the device the first activations live on, in :func:`sum_dtype` of it; layers a
    device map puts elsewhere send their per-batch results there. No host round trip per update."""

    sums: dict[str, Tensor]
    _placed = False

    def _on(self, device: torch.device) -> dict[str, Tensor]:
        """The running sums, moved once to the device the first activations live on (layers a device
        map puts elsewhere send their per-batch results there)."""
        if not self._placed:
            self.sums = {k: v.to(device, sum_dtype(device)) for k, v in self.sums.items()}
            self._placed = True
        return self.sums


@dataclass
class Moments:
    """Mergeable running count, sum and sum of squares of a tensor-valued statistic."""

    count: Tensor
    total: Tensor
    total_sq: Tensor

    @classmethod
    def zeros(cls, shape: Sequence[int]) -> Moments:
        z = lambda: torch.zeros(tuple(shape), dtype=torch.float64)  # noqa: E731
        return cls(z(), z(), z())

    def add(self, x: Tensor, weight: Tensor | float = 1.0, dim: int | Sequence[int] = 0) -> None:
        """Add samples ``x`` (weighted 0/1 to mask) summed over ``dim``."""
        x = x.double()
        w = torch.as_tensor(weight, dtype=torch.float64, device=x.device).expand_as(x)
        self.count += w.sum(dim).cpu()
        self.total += (x * w).sum(dim).cpu()
        self.total_sq += (x * x * w).sum(dim).cpu()

    def merge(self, other: Moments) -> Moments:
        return Moments(self.count + other.count, self.total + other.total, self.total_sq + other.total_sq)

    def to(self, device: torch.device | str, dtype: torch.dtype | None = None) -> Moments:
        """The same sums on ``device`` (in :func:`sum_dtype` of it unless ``dtype`` is given)."""
        device = torch.device(device)
        dtype = dtype or sum_dtype(device)
        return Moments(self.count.to(device, dtype), self.total.to(device, dtype), self.total_sq.to(device, dtype))

    @property
    def mean(self) -> Tensor:
        return self.total / self.count.clamp_min(1)

    @property
    def std(self) -> Tensor:
        """Sample standard deviation (n − 1 denominator)."""
        n = self.count
        var = (self.total_sq - self.total**2 / n.clamp_min(1)) / (n - 1).clamp_min(1)
        return var.clamp_min(0).sqrt()

    def sem(self) -> Tensor:
        """Standard error of the mean."""
        return self.std / self.count.clamp_min(1).sqrt()

    def to_dict(self) -> dict[str, list]:
        return {"count": self.count.tolist(), "total": self.total.tolist(), "total_sq": self.total_sq.tolist()}

    @classmethod
    def from_dict(cls, d: dict[str, list]) -> Moments:
        t = lambda v: torch.tensor(v, dtype=torch.float64)  # noqa: E731
        return cls(t(d["count"]), t(d["total"]), t(d["total_sq"]))


def _plane_tables(table: Tensor, rope: LayerRope, interleaved: bool) -> Tensor:
    """A ``[batch, pos, width]`` cos or sin table as one column per plane, ``[batch, pos, n_planes]``.

    Tables are half-width (one entry per plane), duplicated halves (Llama: ``cat(θ, θ)``) or
    interleaved (Cohere: ``repeat_interleave(θ, 2)``).
    """
    n = rope.n_planes
    if table.ndim == 2:
        table = table[None]
    if table.shape[-1] == n:
        return table
    if table.shape[-1] != 2 * n:
        raise InputError(f"layer {rope.layer}: a rotary table {table.shape[-1]} wide for {n} planes")
    return table[..., ::2] if interleaved else table[..., :n]


def batches(
    tokens: Int[Tensor, "n pos"], batch_size: int
) -> Iterator[Int[Tensor, "b pos"]]:
    """Split a window tensor into batches."""
    if tokens.ndim != 2:
        raise InputError(f"tokens must be [n_windows, n_ctx], got shape {tuple(tokens.shape)}")
    if batch_size < 1:
        raise InputError(f"batch_size must be ≥ 1, got {batch_size}")
    for i in range(0, tokens.shape[0], batch_size):
        yield tokens[i : i + batch_size]


def _hook_plan(hooks: AttnHooks, needs: frozenset[str], rope: LayerRope) -> dict[str, str]:
    """Map each needed tensor to the hook that provides it (the rotation's output falls back to pre + rotate;
    the score q/k of a layer with a norm after RoPE come from their hook, else from the attention function)."""
    plan: dict[str, str] = {}
    for which in ("q", "k"):
        if f"{which}_pre" in needs:
            plan[f"{which}_pre"] = hooks.pre(which)
        rotated = [f"{which}_rot"] + ([] if rope.norm_after_rope else [f"{which}_post"])
        score = hooks.score(which) or (_ATTENTION if hooks.calls_attention_function else None)
        if rope.norm_after_rope and score is None:  # a bridge that rebuilds attention without the norm: its own
            rotated.append(f"{which}_post")  # scores are made of the rotated q/k (the probe's q/k check refuses it)
        elif rope.norm_after_rope and f"{which}_post" in needs:
            plan[f"{which}_post"] = score
        for key in set(rotated) & needs:
            post = hooks.post(which)
            plan[key] = post if post is not None else hooks.pre(which)
            if post is None and hooks.cos is not None:  # rotate with the tables the attention received
                plan["cos"], plan["sin"] = hooks.cos, hooks.sin
    if "pattern" in needs:
        plan["pattern"] = hooks.pattern
    return plan


class _Collector:
    """Gathers a layer's tensors from its hooks and hands them to the reducers once complete."""

    def __init__(self, spec: RopeSpec, layers: Sequence[int], reducers: Sequence[Reducer], model,
                 hooks: bool = True) -> None:
        self.spec, self.reducers = spec, reducers
        self.needs = frozenset().union(*(r.needs for r in reducers))
        unknown = self.needs - NEEDS
        if unknown:
            raise InputError(f"reducers ask for unknown tensors {sorted(unknown)}; known: {sorted(NEEDS)}")
        from ropelens.plain import is_plain

        # a plain HF model has no bridge hooks: stream taps its forward instead
        self.hooks = {} if is_plain(model) or not hooks else {L: attn_hooks(model, L, norm_after_rope=spec.layers[L].norm_after_rope)
                                                  for L in layers}
        self.plans = {L: _hook_plan(h, self.needs, spec.layers[L]) for L, h in self.hooks.items()}
        self.attention = {id(model.blocks[L].attn.original_component): L for L, plan in self.plans.items()
                          if _ATTENTION in plan.values()}
        self.attention_modules = [model.blocks[L].attn.original_component for L in self.attention.values()]
        self.pending: dict[int, dict[str, Tensor]] = {}
        self.valid: Tensor | None = None
        self.padded: bool | None = None
        self.interleaved = bool(getattr(getattr(model, "cfg", None), "rotary_interleaved_cos_sin", False))

    def fwd_hooks(self) -> list[tuple[str, object]]:
        out = []
        for L, plan in self.plans.items():
            by_hook: dict[str, list[str]] = {}
            for key, name in plan.items():
                if name != _ATTENTION:
                    by_hook.setdefault(name, []).append(key)
            for name, keys in by_hook.items():
                out.append((name, self._hook_fn(L, tuple(keys))))
        return out

    def attention_tap(self) -> contextlib.AbstractContextManager:
        """Where a layer's score q/k come from the HF attention function (no bridge hook fires there): tap it."""
        from ropelens.taps import attention_tap

        if not self.attention:
            return contextlib.nullcontext()

        def on_call(module, query: Tensor, key: Tensor) -> None:
            L = self.attention.get(id(module))
            if L is not None:
                self._receive(L, ("q_post",), query.detach())
                self._receive(L, ("k_post",), key.detach())

        return attention_tap(self.attention_modules, on_call)

    def _hook_fn(self, layer: int, keys: tuple[str, ...]):
        def fn(x: Tensor, hook) -> Tensor:  # noqa: ARG001
            self._receive(layer, keys, x.detach())
            return x

        return fn

    def _receive(self, layer: int, keys: tuple[str, ...], x: Tensor) -> None:
        h = self.hooks[layer]
        rope = self.spec.layers[layer]
        got = self.pending.setdefault(layer, {})
        for key in keys:
            if key in ("pattern", "cos", "sin"):
                got[key] = x
                continue
            which, _ = key.split("_")
            name = self.plans[layer][key]
            n = rope.n_heads if which == "q" else rope.n_kv_heads
            got[key] = to_bphd(x, x.ndim == 4 and (name == _ATTENTION or h.heads_first(name)), n)
        if len(got) == len(self.plans[layer]):
            self._rotate_missing(layer)
            self._dispatch(layer)

    def _rotate_missing(self, layer: int) -> None:
        """Post-RoPE q/k of a layer that fires no post-RoPE hook: its pre-RoPE tensors rotated with the
        (cos, sin) tables its attention received (so RoPE variants are seen), else with the spec's."""
        h, rope, got = self.hooks[layer], self.spec.layers[layer], self.pending[layer]
        plan = self.plans[layer]
        cos, sin = got.pop("cos", None), got.pop("sin", None)
        for which in ("q", "k"):
            keys = [k for k in (f"{which}_rot", f"{which}_post") if k in got and h.post(which) is None
                    and plan[k] == h.pre(which)]
            if not keys:
                continue
            t = got[keys[0]].transpose(1, 2)  # [b, head, pos, d]
            if cos is not None:
                c, s = _plane_tables(cos, rope, self.interleaved), _plane_tables(sin, rope, self.interleaved)
                t = rope.rotate_by(t, c[:, None].to(t.dtype), s[:, None].to(t.dtype))
            else:
                t = rope.rotate(t, torch.arange(t.shape[2], device=t.device))
            for key in keys:
                got[key] = t.transpose(1, 2)
            if which == "q" and "q_post" in keys:  # rotated here: the query temperature is still to apply
                got["q_post"] = rope.tempered(got["q_post"])
        if rope.temperature is not None and "q_rot" in got and h.post("q") is not None and plan["q_rot"] == h.post("q"):
            # the bridge's hook_rot_q is the query entering the score: the rotation's own output is it untempered
            got["q_rot"] = rope.tempered(got["q_rot"], inverse=True)

    def _dispatch(self, layer: int) -> None:
        acts = LayerActs(layer=layer, rope=self.spec.layers[layer], valid=self.valid, tensors=self.pending.pop(layer),
                         padded=self.padded)
        for r in self.reducers:
            r.update(acts)

    def finish(self) -> None:
        """Complete layers whose pattern hook did not fire (GPT-J's bridge fires it only with
        output_attentions): the pattern is the softmax of the exact scores from q and k."""
        for layer in sorted(self.pending):
            got = self.pending[layer]
            if set(self.plans[layer]) - set(got) == {"pattern"} and {"q_post", "k_post"} <= set(got):
                self._rotate_missing(layer)
                rope = self.spec.layers[layer]
                k = got["k_post"].repeat_interleave(rope.group_size, dim=2)
                scores = torch.einsum("bqhd,bkhd->bhqk", got["q_post"], k) * rope.score_scale
                ok = rope.mask(scores.shape[-1], scores.device)[None] & self.valid[:, None, :]
                got["pattern"] = rope.probs(scores.masked_fill(~ok[:, None], float("-inf")))
                self._dispatch(layer)
        for layer in sorted(self.pending):
            if any(name == _ATTENTION and key not in self.pending[layer] for key, name in self.plans[layer].items()):
                raise UnsupportedModelError(
                    f"{self.spec.architecture}: layer {layer} changes q and k after RoPE (a norm), but the bridge "
                    "neither fires a hook where they enter the score nor calls the model's attention function: "
                    "it does not compute this model's attention, so ropelens cannot capture the q and k its scores "
                    "are made of")


def stream(
    model,
    data: Iterable[Tensor | tuple[Tensor, Tensor]],
    reducers: Sequence[Reducer],
    *,
    layers: Sequence[int] | None = None,
    spec: RopeSpec | None = None,
    progress: bool = True,
    desc: str = "ropelens",
    total: int | None = None,
    fast: bool = True,
) -> int:
    """Run the model over ``data`` (token batches, or ``(tokens, valid)`` pairs for right padding).

    ``valid`` marks each row's real tokens, which must come first (right padding): positions are
    indices in the window, so left padding or a gap is refused (:func:`ropelens.fastpath.right_padded`).

    Calls every reducer once per layer per batch; returns the number of valid tokens seen. The
    forward stops after the last requested layer (on the fast path, at its rotation). When the
    reducers need only queries and keys and ``fast`` is on, the HF model runs with its own sdpa
    attention (:mod:`ropelens.fastpath`) instead of the bridge, where the family allows it; the
    numbers are the same (your own bridge hooks do not fire on that path: pass ``fast=False`` to
    keep them). One host synchronisation per batch asks whether it holds padding; reducers read the
    answer from :attr:`LayerActs.padded`.
    """
    from ropelens.fastpath import QK_NEEDS, fast_qk, hf_view, right_padded
    from ropelens.plain import capture as plain_capture
    from ropelens.plain import is_plain, planned_forward
    from ropelens.reading import rope_spec
    from ropelens.sdpa import engine_plan

    # a plain HF model, or a bridge under an intervention only the engine applies: no bridge hook sees it
    on_engine = is_plain(model) or engine_plan(model)

    spec = spec if spec is not None else rope_spec(model)
    chosen = spec.layer_indices(layers, rotary_only=layers is None)  # NoPE layers only when named
    if not chosen:
        raise InputError("no layers selected: pass layer indices the model has")
    col = _Collector(spec, chosen, reducers, model, hooks=not on_engine)
    # the fast path taps rotations, which NoPE layers never make: those go through the bridge's hooks
    use_fast = fast and col.needs <= QK_NEEDS and all(spec.layers[L].rotary for L in chosen)
    stop = max(chosen) + 1
    n_tok, padded_tok = 0, None  # tokens of unpadded batches (known on the host), of padded ones (on the device)
    device = device_of(model)
    with torch.no_grad(), contextlib.ExitStack() as bridge:
        hooked = False
        for item in tqdm(data, desc=desc, total=total, disable=not progress, unit="batch"):
            toks, valid = item if isinstance(item, tuple) else (item, None)
            toks = toks.to(device)
            valid = torch.ones_like(toks, dtype=torch.bool) if valid is None else valid.to(device).bool()
            if valid.shape != toks.shape:
                raise InputError(f"valid mask shape {tuple(valid.shape)} != tokens shape {tuple(toks.shape)}")
            n = toks.shape[1]
            for L in chosen:  # an analysis that assumes the causal mask, on a layer whose indexer drops keys here
                for r in reducers:
                    if getattr(r, "static_mask", None):
                        spec.layers[L].require_static_mask(n, r.static_mask)
            # the one host synchronisation per batch: does it hold padding (then sdpa needs a mask), and is it
            # right padding (positions are indices in the window: anything else is refused, not measured wrong)
            col.valid, col.padded = valid, right_padded(valid)
            if col.padded:
                padded_tok = valid.sum() if padded_tok is None else padded_tok + valid.sum()
            else:
                n_tok += valid.numel()
            def fold(L: int, tensors: dict[str, Tensor], valid: Tensor = valid, padded: bool = col.padded) -> None:
                acts = LayerActs(layer=L, rope=spec.layers[L], valid=valid, tensors=tensors, padded=padded)
                for r in reducers:
                    r.update(acts)

            if use_fast:
                got = fast_qk(model, spec, toks, valid, chosen, keep=col.needs, on_layer=fold, padded=col.padded)
                if got is not None:
                    for L in sorted(got):  # layers not handed over while the forward ran (first batch)
                        fold(L, got[L])
                    continue
            use_fast = False  # this model cannot take the fast path: every batch goes through the bridge
            if on_engine:  # the HF model's own rotation and attention function, tapped, with the plan in force
                with planned_forward(model, hf_view(model)):
                    plain_capture(model, spec, toks, valid, chosen, col.needs, fold, padded=col.padded)
                continue
            if not hooked:
                bridge.enter_context(model.hooks(fwd_hooks=col.fwd_hooks()))
                bridge.enter_context(col.attention_tap())
                hooked = True
            model(toks, return_type=None, stop_at_layer=stop if stop < spec.n_layers else None)
            col.finish()
            if col.pending:
                raise RuntimeError(f"hooks for layers {sorted(col.pending)} fired incompletely")
    return n_tok + (0 if padded_tok is None else int(padded_tok))


@dataclass
class _Keep:
    """Reducer that keeps the tensors (for small inputs: decomposition of given tokens)."""

    needs: frozenset[str]
    kept: dict[int, LayerActs] = field(default_factory=dict)

    def update(self, acts: LayerActs) -> None:
        prev = self.kept.get(acts.layer)
        if prev is None:
            self.kept[acts.layer] = acts
            return
        for k, v in acts.tensors.items():
            prev.tensors[k] = torch.cat([prev.tensors[k], v])
        prev.valid = torch.cat([prev.valid, acts.valid])


def capture_qk(
    model,
    tokens: Int[Tensor, "batch pos"],
    *,
    layers: Sequence[int] | None = None,
    which: Iterable[str] = ("q_pre", "k_pre", "q_post", "k_post"),
    batch_size: int = 8,
    progress: bool = False,
    fast: bool = True,
    spec: RopeSpec | None = None,
) -> dict[int, LayerActs]:
    """Capture per-head tensors for ``tokens`` and keep them: ``{layer: LayerActs}``.

    Keys are KV heads (query head h reads KV head ``h // rope.group_size``). ``spec`` (default: read
    from the model) says how the tensors are laid out (the probe passes the reading it checks).
    """
    keep = _Keep(needs=frozenset(which))
    stream(model, batches(tokens, batch_size), [keep], layers=layers, progress=progress, fast=fast, spec=spec)
    return keep.kept
