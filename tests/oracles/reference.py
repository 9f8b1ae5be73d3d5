"""Reference computations in plain torch and transformers, with no ropelens code.

Every number here is read from HF's own forward: the model runs with HF's eager attention, and the
modeling module's ``eager_attention_forward`` is wrapped to record what it receives (the rotated
query and key exactly as the score sees them, the mask, the scale, the soft-cap, the learned sinks)
and what it returns (the attention probabilities). The per-plane split of a head uses the plane
layout a family declares (:class:`Layout`): which dims rotate, and how they pair.

The definitions, in the words of ropelens's documentation:

- **frequency usage**: the mean 2-norm of each rotary plane of the queries and keys over tokens
  (before the rotation, which keeps every plane's norm); a band's energy share is the mean squared
  norm of its dims over the whole head's, the unrotated dims of a partial-rotary head forming the
  ``rest`` band;
- **plane logits**: the score q·k·scale is the sum of one term per plane (and one for the
  unrotated dims): term_i = scale · (q^(i) · k^(i)) on the rotated q and k;
- **band-only pattern**: the softmax over the allowed keys of the layer's score built from one
  band's terms alone (with the layer's soft-cap and sinks);
- **ablation**: the planes' dims of the rotated query set to zero in the chosen heads, so their
  term leaves those heads' logits;
- **loss**: the mean next-token cross-entropy over the predicted positions.
"""

from __future__ import annotations

import contextlib
import importlib
import inspect
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

__all__ = [
    "AttentionCall",
    "Layout",
    "band_only_pattern",
    "energy_by_dims",
    "loss",
    "plane_terms",
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


@contextlib.contextmanager
def recorded_attention(hf, *, edit_query=None) -> Iterator[dict[int, AttentionCall]]:
    """Record every decoder layer's eager attention call (in float32 copies).

    ``edit_query(layer, query) -> query``, when given, replaces the rotated query before the score
    (the reference of a plane ablation).
    """
    if hf.config._attn_implementation != "eager":
        raise ValueError("the reference needs HF's eager attention (attn_implementation='eager')")
    module = importlib.import_module(type(hf).__module__)
    original = module.eager_attention_forward
    signature = inspect.signature(original)
    calls: dict[int, AttentionCall] = {}

    def wrapped(*args, **kwargs):
        bound = signature.bind(*args, **kwargs)
        bound.apply_defaults()
        att, named = bound.arguments["module"], bound.arguments
        layer = getattr(att, "layer_idx", None)
        if layer is not None and edit_query is not None:
            named["query"] = edit_query(layer, named["query"])
        out = original(*bound.args, **bound.kwargs)
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
            )
        return out

    module.eager_attention_forward = wrapped
    try:
        yield calls
    finally:
        module.eager_attention_forward = original


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
