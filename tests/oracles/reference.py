"""Reference computations in plain torch and transformers, with no ropelens code.

Every number here is read from HF's own forward: the model runs with HF's eager attention, and the
modeling module's ``eager_attention_forward`` is wrapped to record what it receives (the rotated
query and key exactly as the score sees them, the mask, the scale, the soft-cap, the learned sinks)
and what it returns (the attention probabilities); where the module writes its attention inline
(Falcon), its rotation and its attention modules' hooks record the same. The per-plane split of a
head uses the plane layout a family declares (:class:`Layout`): which dims rotate, and how they
pair.

The definitions, in the words of ropelens's documentation:

- **frequency usage**: the mean 2-norm of each rotary plane of the queries and keys over tokens
  (before the rotation, which keeps every plane's norm); a band's energy share is the mean squared
  norm of its dims over the whole head's, the unrotated dims of a partial-rotary head forming the
  ``rest`` band;
- **plane logits**: the score q·k·scale is the sum of one term per plane (and one for the
  unrotated dims): term_i = scale · (q^(i) · k^(i)) on the rotated q and k;
- **band-only pattern**: the softmax over the allowed keys of the layer's score built from one
  band's terms alone (with the layer's soft-cap and sinks);
- **ablation**: the planes' dims of the rotated q and k set to zero, removing their term from the
  attention logits: in the chosen query heads, and in a KV head only when every query head
  sharing it is chosen; where a per-head norm follows the rotation (HunYuan dense, NanoChat, Llama
  4), at the rotation's output, the norm then rescaling the other planes;
- **loss**: the mean next-token cross-entropy over the predicted positions;
- **massive values** (Jin et al.): per layer, head and dimension, the L2 norm over tokens of the
  pre-RoPE q and k; a dimension is massive when it exceeds ``factor`` × its head's mean dimension
  norm;
- **frequency entropy**: per layer, head and plane, the normalised Shannon entropy of the power
  spectrum of the plane's query norm over positions (the window after its first ``skip``; mean
  removed, the F = ⌊n/2⌋ non-zero frequencies, divided by ln F so 1 = flat), against the same
  values in a shuffled order;
- **rotary offsets** (Jonasson): per plane the q/k outlier ratio (mean plane norm over the median
  of the head's other planes) and the circular mean angle between q and k at the key each query
  attends to (the argmax of the model's own scores), sink and content keys apart;
- **head taxonomy**: per head, the attention mass at each offset δ = q − k (keys from position 1)
  and on position 0, on text and on uniform random tokens, and per band the share of its logit's
  variance that lies between offsets (η²);
- **knockout**: the planes of a head set zeroed in the rotated q and k (where an ablation zeroes
  them), and the attention and loss that follow;
- **retrieval scores** (Wu et al.): the fraction of copy steps of the passkey answer whose most
  attended key is the needle token being copied; **passkey retrieval**: the greedy answer;
- **M-RoPE decomposition**: each logit split into one term per position axis (t, h, w) by the planes
  each axis turns, and ``rest``.
"""

from __future__ import annotations

import contextlib
import importlib
import inspect
import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

__all__ = [
    "AttentionCall",
    "Layout",
    "band_only_pattern",
    "energy_by_dims",
    "attended_keys",
    "dim_norms",
    "loss",
    "massive_mask",
    "plane_angles",
    "plane_terms",
    "pre_rope",
    "spectral_entropy",
    "recorded_attention",
    "scores",
]


@dataclass(frozen=True)
class Layout:
    """Where a head's rotary planes sit in the rotated query: ``n_rotary`` dims starting at
    ``offset``, paired as halves (i, i + n/2) or adjacent (2i, 2i + 1)."""

    head_dim: int
    n_rotary: int
    pairing: str = "half"
    offset: int = 0

    def plane_dims(self) -> list[tuple[int, int]]:
        """The two dims of every plane, highest frequency first."""
        n = self.n_rotary // 2
        if self.pairing == "half":
            return [(self.offset + i, self.offset + i + n) for i in range(n)]
        return [(self.offset + 2 * i, self.offset + 2 * i + 1) for i in range(n)]

    def unrotated_dims(self) -> list[int]:
        """Dims no plane holds (the part of a partial-rotary head that is never rotated)."""
        rotary = {d for pair in self.plane_dims() for d in pair}
        return [d for d in range(self.head_dim) if d not in rotary]


@dataclass
class AttentionCall:
    """One layer's call of HF's eager attention: its inputs and the probabilities it returned."""

    layer: int
    query: Tensor  # [batch, head, q, dim], rotated
    key: Tensor  # [batch, kv_head, k, dim], rotated
    mask: Tensor | None  # additive (or boolean) [batch, 1, q, k]
    scaling: float
    softcap: float | None
    sinks: Tensor | None  # [head] learned sink logits
    probs: Tensor  # [batch, head, q, k]
    # what HF's rotation received in this layer (None in a layer with no rotation), laid out as the
    # rotation writes its output: the query's and key's rotated dims before it turned them (all
    # dims, or only the rotary ones where the family splits them off first)
    rotation_input: tuple[Tensor, Tensor] | None = None


EDIT_POINTS = ("score", "rotation")


@contextlib.contextmanager
def recorded_attention(
    hf, *, edit_query=None, edit_key=None, edit_at: str = "score"
) -> Iterator[dict[int, AttentionCall]]:
    """Record every decoder layer's eager attention call (in float32 copies).

    ``edit_query(layer, query) -> query`` and ``edit_key(layer, key) -> key``, when given, replace
    the rotated query ``[batch, head, pos, dim]`` and key ``[batch, kv_head, pos, dim]`` (the
    reference of a plane ablation) where ``edit_at`` says:

    - ``"score"``: as the score receives them;
    - ``"rotation"``: as HF's own rotation function returns them, before whatever the layer does
      to q and k after it (the per-head norm of HunYuan dense, NanoChat and Llama 4), in the same
      layout (Llama 4's rotation, which writes ``[batch, pos, head, dim]``, hands the edits its
      output with the heads moved to axis 1, and takes them back); where a family rotates only
      the rotary dims split off first (multi-head latent attention), the edits see those alone.
      The layer is the one of the attention module running the rotation (a forward pre-hook on
      every module with a ``layer_idx`` whose class is an ``...Attention``).

    Falcon, whose attention is written inline, edits at its rotation's output either way (nothing
    follows the rotation before its score).
    """
    if hf.config._attn_implementation != "eager":
        raise ValueError("the reference needs HF's eager attention (attn_implementation='eager')")
    if edit_at not in EDIT_POINTS:
        raise ValueError(f"edit_at={edit_at!r}: choose one of {', '.join(EDIT_POINTS)}")
    module = importlib.import_module(type(hf).__module__)
    if not hasattr(module, "eager_attention_forward"):
        with _recorded_inline_attention(hf, module, edit_query, edit_key) as calls:
            yield calls
        return
    at_score = edit_at == "score"
    score_edit_query, score_edit_key = (edit_query, edit_key) if at_score else (None, None)
    original = module.eager_attention_forward
    signature = inspect.signature(original)
    calls: dict[int, AttentionCall] = {}
    rotations = {
        name: getattr(module, name)
        for name in ("apply_rotary_pos_emb", "apply_rotary_pos_emb_interleave", "apply_rotary_emb")
        if hasattr(module, name)
    }
    pending: list[tuple[Tensor, Tensor]] = []  # the rotation's inputs, until its layer's attention
    # Llama 4 rotates q and k as [batch, pos, head, dim], before the heads move to axis 1
    pos_first = module.__name__.endswith(".modeling_llama4")
    edits = contextlib.ExitStack()  # the hooks that tell a rotation its layer, for its edits
    edited = edits.enter_context(
        _rotation_edits(hf, module, edit_at == "rotation", edit_query, edit_key, pos_first)
    )

    def rotation_recorder(rotate):
        def recorded(q, k, cos, sin, *args, **kwargs):
            # the rotation by angle 0 lays the inputs out as the rotation writes its output (a
            # family that permutes dims inside its rotation permutes them here too)
            with torch.no_grad():
                still = rotate(q, k, torch.ones_like(cos), torch.zeros_like(sin), *args, **kwargs)
            pending.append((still[0].detach().float(), still[1].detach().float()))
            return edited(rotate(q, k, cos, sin, *args, **kwargs))

        return recorded

    def complex_rotation_recorder(rotate):
        # the complex-product rotation (DeepSeek-V2, Llama 4): q and k times e^{iθ}, by 1 here
        def recorded(q, k, freqs_cis, *args, **kwargs):
            with torch.no_grad():
                still = rotate(q, k, torch.ones_like(freqs_cis), *args, **kwargs)
            still = [x.transpose(1, 2) if pos_first else x for x in still]
            pending.append((still[0].detach().float(), still[1].detach().float()))
            return edited(rotate(q, k, freqs_cis, *args, **kwargs))

        return recorded

    def wrapped(*args, **kwargs):
        bound = signature.bind(*args, **kwargs)
        bound.apply_defaults()
        att, named = bound.arguments["module"], bound.arguments
        layer = getattr(att, "layer_idx", None)
        if layer is not None and score_edit_query is not None:
            named["query"] = score_edit_query(layer, named["query"])
        if layer is not None and score_edit_key is not None:
            named["key"] = score_edit_key(layer, named["key"])
        out = original(*bound.args, **bound.kwargs)
        rotation_input = pending.pop() if pending else None
        pending.clear()
        if layer is not None:
            extra = named.get("kwargs", {})
            softcap = named.get("softcap", extra.get("softcap"))
            sinks = getattr(att, "sinks", None)
            calls[layer] = AttentionCall(
                layer=layer,
                query=named["query"].detach().float(),
                key=named["key"].detach().float(),
                mask=None if named["attention_mask"] is None else named["attention_mask"].detach(),
                scaling=float(named["scaling"] if named["scaling"] is not None else 1.0),
                softcap=None if softcap is None else float(softcap),
                sinks=None if sinks is None else sinks.detach().float(),
                probs=out[1].detach().float(),
                rotation_input=rotation_input,
            )
        return out

    try:
        module.eager_attention_forward = wrapped
        for name, rotate in rotations.items():
            recorder = (
                complex_rotation_recorder if name == "apply_rotary_emb" else rotation_recorder
            )
            setattr(module, name, recorder(rotate))
        yield calls
    finally:
        module.eager_attention_forward = original
        for name, rotate in rotations.items():
            setattr(module, name, rotate)
        edits.close()


@contextlib.contextmanager
def _rotation_edits(hf, module, at_rotation: bool, edit_query, edit_key, pos_first: bool):
    """``edited(rotated) -> rotated``: HF's rotation's output (query, key) with the edits applied
    in the layer of the attention module running the rotation, read from a forward pre-hook on
    every module with a ``layer_idx`` whose class is an ``...Attention`` (the rotation's output as
    it is where ``at_rotation`` is false or no edit is given). ``pos_first``: the rotation writes
    ``[batch, pos, head, dim]`` (Llama 4), which the edits see with the heads on axis 1."""
    if not at_rotation or (edit_query is None and edit_key is None):
        yield lambda rotated: rotated
        return
    attentions = [
        m
        for m in hf.modules()
        if type(m).__name__.endswith("Attention") and getattr(m, "layer_idx", None) is not None
    ]
    if not attentions:
        raise ValueError(
            f"{module.__name__}: no attention module with a layer_idx tells the rotation's layer: "
            "edit at the score (edit_at='score')"
        )
    running: list[int] = []  # the layers of the attention modules whose forward is running

    def edited(rotated: tuple[Tensor, Tensor]) -> tuple[Tensor, Tensor]:
        if not running:
            raise RuntimeError(
                f"{module.__name__}: HF's rotation ran outside an attention module, so its layer "
                "is unknown: edit at the score (edit_at='score')"
            )
        query, key = [x.transpose(1, 2) if pos_first else x for x in rotated]
        if edit_query is not None:
            query = edit_query(running[-1], query)
        if edit_key is not None:
            key = edit_key(running[-1], key)
        return tuple(x.transpose(1, 2) if pos_first else x for x in (query, key))

    def enter(attention, _args) -> None:
        running.append(attention.layer_idx)

    def leave(_attention, _args, _out) -> None:  # returns None: the output stays as it is
        running.pop()

    handles = [a.register_forward_pre_hook(enter) for a in attentions]
    handles += [a.register_forward_hook(leave) for a in attentions]
    try:
        yield edited
    finally:
        for handle in handles:
            handle.remove()


@contextlib.contextmanager
def _recorded_inline_attention(
    hf, module, edit_query, edit_key
) -> Iterator[dict[int, AttentionCall]]:
    """Falcon writes its eager attention inside its attention module (the rotation, then
    softmax(q·kᵀ/√d + mask)), returning the probabilities: the rotation is wrapped to record (and
    edit) the rotated q and k, and each attention module's hooks record its mask and
    probabilities. Its fused qkv hands every query head a copy of its KV head's key: the key is
    recorded once per KV head."""
    rotate = module.apply_rotary_pos_emb
    attns = [m for m in hf.modules() if hasattr(m, "query_key_value") and hasattr(m, "layer_idx")]
    calls: dict[int, AttentionCall] = {}
    current: dict = {}

    def rotation(q, k, cos, sin, *args, **kwargs):
        attn = current["attn"]
        layer, group = attn.layer_idx, q.shape[1] // attn.num_kv_heads
        with torch.no_grad():
            still = rotate(q, k, torch.ones_like(cos), torch.zeros_like(sin), *args, **kwargs)
        q, k = rotate(q, k, cos, sin, *args, **kwargs)
        key = k[:, ::group]
        if edit_query is not None:
            q = edit_query(layer, q)
        if edit_key is not None:
            key = edit_key(layer, key)
            k = key.repeat_interleave(group, dim=1)
        received = (still[0].detach().float(), still[1][:, ::group].detach().float())
        current["rotated"] = (q.detach().float(), key.detach().float(), received)
        return q, k

    def before(attn, _args, kwargs):
        current["attn"], current["mask"] = attn, kwargs.get("attention_mask")

    def after(attn, _args, _kwargs, out):
        query, key, received = current.pop("rotated")
        mask = current.pop("mask")
        calls[attn.layer_idx] = AttentionCall(
            layer=attn.layer_idx,
            query=query,
            key=key,
            mask=None if mask is None else mask.detach(),
            scaling=1 / math.sqrt(attn.head_dim),
            softcap=None,
            sinks=None,
            probs=out[1].detach().float(),
            rotation_input=received,
        )

    handles = [a.register_forward_pre_hook(before, with_kwargs=True) for a in attns]
    handles += [a.register_forward_hook(after, with_kwargs=True) for a in attns]
    module.apply_rotary_pos_emb = rotation
    try:
        yield calls
    finally:
        module.apply_rotary_pos_emb = rotate
        for handle in handles:
            handle.remove()


def pre_rope(call: AttentionCall, layout: Layout) -> tuple[Tensor, Tensor]:
    """The query ``[batch, head, pos, dim]`` and key ``[batch, kv_head, pos, dim]`` before the
    rotation: the attention's inputs with the rotary dims as HF's rotation received them (a layer
    with no rotation: the attention's inputs themselves)."""
    if call.rotation_input is None:
        return call.query, call.key
    out = []
    for rotated, received in zip((call.query, call.key), call.rotation_input):
        if received.shape[-1] == rotated.shape[-1]:
            out.append(received.expand_as(rotated).clone())
            continue
        whole = rotated.clone()
        span = slice(layout.offset, layout.offset + layout.n_rotary)
        whole[..., span] = received.expand_as(whole[..., span])
        out.append(whole)
    return out[0], out[1]


def _repeat_kv(key: Tensor, n_heads: int) -> Tensor:
    return key.repeat_interleave(n_heads // key.shape[1], dim=1)


def allowed(call: AttentionCall) -> Tensor:
    """``[batch, 1, q, k]`` bool: the keys each query may attend to."""
    b, _, nq, _ = call.query.shape
    nk = call.key.shape[2]
    if call.mask is None:
        return torch.ones(b, 1, nq, nk, dtype=torch.bool)
    if call.mask.dtype == torch.bool:
        return call.mask[..., :nk]
    return call.mask[..., :nk] > torch.finfo(call.mask.dtype).min / 2


def plane_terms(call: AttentionCall, layout: Layout) -> tuple[Tensor, Tensor]:
    """Per-plane score terms ``[batch, head, plane, q, k]`` and the unrotated dims' term
    ``[batch, head, q, k]``, scaled by the layer's score scale; they sum to the score."""
    q, k = call.query, _repeat_kv(call.key, call.query.shape[1])
    terms = [
        torch.einsum("bhqd,bhkd->bhqk", q[..., list(p)], k[..., list(p)]) * call.scaling
        for p in layout.plane_dims()
    ]
    rest = layout.unrotated_dims()
    rest_term = torch.einsum("bhqd,bhkd->bhqk", q[..., rest], k[..., rest]) * call.scaling
    return torch.stack(terms, 2), rest_term


def scores(call: AttentionCall) -> Tensor:
    """The pre-softmax, pre-cap score q·k·scale ``[batch, head, q, k]``."""
    k = _repeat_kv(call.key, call.query.shape[1])
    return torch.einsum("bhqd,bhkd->bhqk", call.query, k) * call.scaling


def softmax_of(call: AttentionCall, logits: Tensor) -> Tensor:
    """The layer's probabilities from a score: soft-cap, mask, sinks, softmax."""
    if call.softcap is not None:
        logits = torch.tanh(logits / call.softcap) * call.softcap
    logits = logits.masked_fill(~allowed(call), float("-inf"))
    if call.sinks is None:
        return torch.softmax(logits, -1)
    b, h, nq, _ = logits.shape
    sink = call.sinks.reshape(1, h, 1, 1).expand(b, h, nq, 1)
    return torch.softmax(torch.cat([logits, sink], -1), -1)[..., :-1]


def band_only_pattern(call: AttentionCall, layout: Layout, planes: Sequence[int]) -> Tensor:
    """The pattern the layer would have from ``planes``' terms alone ``[batch, head, q, k]``."""
    terms, _ = plane_terms(call, layout)
    return softmax_of(call, terms[:, :, list(planes)].sum(2))


def energy_by_dims(x: Tensor, dims: Sequence[int], valid: Tensor | None = None) -> Tensor:
    """Mean over tokens of ‖x[..., dims]‖², per head: ``x`` is ``[batch, head, pos, dim]``."""
    sq = x[..., list(dims)].double().pow(2).sum(-1)  # [batch, head, pos]
    if valid is None:
        return sq.mean((0, 2))
    w = valid[:, None, :].double()
    return (sq * w).sum((0, 2)) / w.sum((0, 2))


def plane_norm_mean(x: Tensor, pair: tuple[int, int], valid: Tensor | None = None) -> Tensor:
    """Mean over tokens of one plane's 2-norm, per head."""
    norm = x[..., list(pair)].double().pow(2).sum(-1).sqrt()
    if valid is None:
        return norm.mean((0, 2))
    w = valid[:, None, :].double()
    return (norm * w).sum((0, 2)) / w.sum((0, 2))


def loss(hf, input_ids: Tensor, attention_mask: Tensor | None = None) -> float:
    """Mean next-token cross-entropy of HF's forward over the predicted (real) positions."""
    with torch.no_grad():
        logits = hf(input_ids=input_ids, attention_mask=attention_mask).logits.float()
    target = input_ids[:, 1:]
    ce = F.cross_entropy(logits[:, :-1].flatten(0, 1), target.flatten(), reduction="none")
    if attention_mask is None:
        return float(ce.mean())
    keep = attention_mask[:, 1:].flatten().bool()
    return float(ce[keep].mean())


def dim_norms(x: Tensor, valid: Tensor | None = None) -> Tensor:
    """L2 norm over the (valid) tokens of every dimension, ``[head, dim]``: ``x`` is
    ``[batch, head, pos, dim]``."""
    sq = x.double().pow(2)
    if valid is not None:
        sq = sq * valid[:, None, :, None].double()
    return sq.sum((0, 2)).sqrt()


def massive_mask(norms: Tensor, factor: float) -> tuple[Tensor, Tensor]:
    """Each dimension's norm over its head's mean dimension norm, and where it exceeds
    ``factor``."""
    ratio = norms / norms.mean(-1, keepdim=True)
    return ratio, ratio > factor


def spectral_entropy(signal: Tensor) -> tuple[Tensor, Tensor]:
    """Normalised Shannon entropy of the power spectrum of ``signal`` along its last axis (numpy's
    FFT, mean removed, the F = ⌊n/2⌋ non-zero frequencies, divided by ln F), and the spectrum
    normalised to sum to 1; NaN where the signal is constant."""
    x = signal.double().numpy()
    n = x.shape[-1]
    F = n // 2
    power = np.abs(np.fft.rfft(x - x.mean(-1, keepdims=True), axis=-1)[..., 1 : F + 1]) ** 2
    with np.errstate(invalid="ignore", divide="ignore"):
        p = power / power.sum(-1, keepdims=True)
        h = -np.where(p > 0, p * np.log(p), 0.0).sum(-1) / math.log(F)
    h = np.where(np.isfinite(p).all(-1), h, np.nan)
    return torch.from_numpy(h), torch.from_numpy(p)


def attended_keys(call: AttentionCall) -> tuple[Tensor, Tensor]:
    """The key each query attends most, ``[batch, head, q]`` (the argmax of the model's own score,
    soft-capped, over the allowed keys; the earlier key on a tie), and the margin of that key's
    score over the next allowed key's (``inf`` where only one key is allowed)."""
    score = scores(call)
    if call.softcap is not None:
        score = torch.tanh(score / call.softcap) * call.softcap
    score = score.masked_fill(~allowed(call), float("-inf"))
    top = score.topk(min(2, score.shape[-1]), -1).values
    margin = top[..., 0] - top[..., 1] if top.shape[-1] > 1 else torch.full_like(top[..., 0], 1e30)
    margin = torch.where(torch.isfinite(margin), margin, torch.full_like(margin, float("inf")))
    best = score.amax(-1, keepdim=True)
    index = torch.arange(score.shape[-1]).expand_as(score)
    first = torch.where(score == best, index, score.shape[-1]).amin(-1)
    return first, margin


def plane_angles(
    query: Tensor, key: Tensor, attended: Tensor, layout: Layout
) -> tuple[Tensor, Tensor, Tensor]:
    """At each query's attended key, per plane ``[batch, head, q, plane]``: cos and sin of the
    angle from q's 2-D component to k's (Δ = arg k − arg q), and the dot product q·k there."""
    k = _repeat_kv(key, query.shape[1])
    index = attended[..., None].expand(*attended.shape, k.shape[-1])
    k_at = k.gather(2, index)  # [batch, head, q, dim]
    cos, sin, dot = [], [], []
    for a, b in layout.plane_dims():
        qa, qb, ka, kb = query[..., a], query[..., b], k_at[..., a], k_at[..., b]
        norm = torch.sqrt((qa * qa + qb * qb) * (ka * ka + kb * kb))
        d, cross = qa * ka + qb * kb, qa * kb - qb * ka
        cos.append(torch.where(norm > 0, d / norm, torch.nan))
        sin.append(torch.where(norm > 0, cross / norm, torch.nan))
        dot.append(d)
    return torch.stack(cos, -1), torch.stack(sin, -1), torch.stack(dot, -1)
