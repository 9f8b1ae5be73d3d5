"""A dense float64 reference for band statistics and frequency usage, built from HF's own eager
attention.

ropelens's :class:`~ropelens.analyses.band_statistics.BandStatsReducer` sees only post-RoPE queries
and keys: it rebuilds each layer's scores tile by tile and applies the causal mask, sliding window,
soft-capping and sinks itself. Here every one of its sums is recomputed densely, plainly and
independently of that code (nothing below imports ropelens):

- queries, keys, score scale, mask and sinks are what HF's own ``eager_attention_forward`` receives
  (post-RoPE; keys in KV-head layout; ``scaling``; ``attention_mask``; ``s_aux``), taken from an
  eager forward (:func:`hf_layers`);
- query head h reads KV head ``h // group``, written out as an index, and band logits are einsums
  over each band's head dims on full ``[batch, head, q, k]`` tensors (float64);
- the mask is HF's own (the entries its additive mask leaves finite), else ``torch.tril`` and
  ``q − k < window`` with the window HF passes;
- the attended key is the argmax of HF's attention probabilities (``output_attentions``), so the
  soft-cap and the sinks choose it through HF's code, not ropelens's;
- the model's pattern in the JS divergence is HF's probabilities (times HF's sink factor where its
  sinks scale the output after the softmax, Granite SWA); band-only patterns apply the cap and the
  sinks with plain torch.

The caller gives the grouping of head dims into bands and the plane pairs, in HF's head layout.
"""

from __future__ import annotations

import importlib
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

__all__ = [
    "HFLayer",
    "allowed_keys",
    "band_logits",
    "dense_layer_sums",
    "dense_reference",
    "hf_layers",
    "js",
    "keys_per_head",
    "pattern_of",
    "plane_norm_means",
]


@dataclass
class HFLayer:
    """One layer as HF's eager attention sees it, for one batch (mutable: a test builds one from
    other tensors and sets its probabilities after computing them from it)."""

    q: Tensor  # [b, H, n, d] post-RoPE queries
    k: Tensor  # [b, KV, n, d] post-RoPE keys (KV heads)
    scale: float  # HF's ``scaling``
    window: int | None  # the sliding window HF passes (None: full causal)
    softcap: float | None  # the soft-cap HF passes
    sinks: Tensor | None  # [H] the sink logits HF passes (``s_aux``)
    probs: (
        Tensor | None
    )  # [b, H, n, n] HF's attention probabilities (None: HF returned none for this layer)
    allowed: Tensor | None = (
        None  # [n, n] the keys HF's own mask allows each query (None: from ``window``)
    )


def _allowed(mask: Tensor | None, n: int) -> Tensor | None:
    """``[n, n]`` bool of the keys HF's attention mask allows (additive: finite entries, boolean:
    True), or None.

    One mask for the whole batch and every head: the reference runs unpadded rows, so a mask that
    differs between rows or heads is not one it can take."""
    if mask is None:
        return None
    m = mask[..., :n, :n]
    ok = (
        m if m.dtype == torch.bool else m > torch.finfo(m.dtype).min / 2
    )  # HF masks with the dtype's minimum
    ok = ok.reshape(-1, n, n)
    if not bool((ok == ok[:1]).all()):
        raise ValueError("HF's attention mask differs between rows or heads: pass unpadded rows")
    return ok[0].cpu()


def _probs_by_layer(probs, layers: list[int]) -> dict[int, Tensor | None]:
    """HF's ``output_attentions`` keyed by layer: one map per attention layer, in order (a hybrid's
    other layers return none), or one per layer of the stack."""
    probs = tuple(probs or ())
    if len(probs) == len(layers):
        return {L: None if p is None else p.detach() for L, p in zip(layers, probs)}
    if layers and len(probs) > max(layers):
        return {L: None if probs[L] is None else probs[L].detach() for L in layers}
    return dict.fromkeys(layers)


def hf_layers(hf, toks: Tensor) -> dict[int, HFLayer]:
    """Run HF's eager forward on ``toks`` and record, per layer, what its attention function
    received."""
    mod = importlib.import_module(type(hf).__module__)
    orig = getattr(mod, "eager_attention_forward", None)
    if orig is None:
        if any(
            callable(getattr(m, "_attn", None)) and isinstance(getattr(m, "layer_idx", None), int)
            for m in hf.modules()
        ):
            return _method_layers(hf, toks)
        return _inline_layers(hf, toks, mod)
    got: dict[int, dict] = {}

    def wrapped(module, query, key, value, attention_mask, *args, **kwargs):
        if isinstance(getattr(module, "layer_idx", None), int):  # a decoder layer's attention
            got[module.layer_idx] = dict(
                q=query.detach().clone(),
                k=key.detach().clone(),
                scale=float(kwargs.get("scaling", args[0] if args else 0)),
                window=kwargs.get("sliding_window"),
                softcap=kwargs.get("softcap"),
                allowed=_allowed(attention_mask, query.shape[2]),
                sinks=None if kwargs.get("s_aux") is None else kwargs["s_aux"].detach().clone(),
            )
        return orig(module, query, key, value, attention_mask, *args, **kwargs)

    mod.eager_attention_forward = wrapped
    try:
        with torch.no_grad():
            probs = hf(toks, output_attentions=True).attentions
    finally:
        mod.eager_attention_forward = orig
    by_layer = _probs_by_layer(probs, sorted(got))
    return {L: HFLayer(probs=by_layer[L], **got[L]) for L in sorted(got)}


def _method_layers(hf, toks: Tensor) -> dict[int, HFLayer]:
    """A family whose attention scores in its own ``_attn(query, key, value, attention_mask)``
    method (GPT-J, CodeGen, GPT-NeoX-Japanese): the query and key it receives, its mask, and one
    over the number it divides the scores by (``scale_attn``; GPT-NeoX-Japanese's
    ``norm_factor``)."""
    got: dict[int, dict] = {}
    patched = [
        m
        for m in hf.modules()
        if callable(getattr(m, "_attn", None)) and isinstance(getattr(m, "layer_idx", None), int)
    ]

    def tap(module, fn):
        def call(query, key, value, attention_mask=None, *args, **kwargs):
            got[module.layer_idx] = dict(
                q=query.detach().clone(),
                k=key.detach().clone(),
                scale=1.0 / _divisor(module),
                window=None,
                softcap=None,
                sinks=None,
                allowed=_allowed(attention_mask, query.shape[2]),
            )
            return fn(query, key, value, attention_mask, *args, **kwargs)

        return call

    for m in patched:
        m._attn = tap(m, m._attn)
    try:
        with torch.no_grad():
            probs = hf(toks, output_attentions=True).attentions
    finally:
        for m in patched:
            del m._attn  # the instance attribute goes; the class's method shows again
    by_layer = _probs_by_layer(probs, sorted(got))
    return {L: HFLayer(probs=by_layer[L], **got[L]) for L in sorted(got)}


def _divisor(module) -> float:
    """What an ``_attn`` method divides its scores by: ``scale_attn`` (GPT-J, CodeGen) or
    ``norm_factor``."""
    for name in ("scale_attn", "norm_factor"):
        if isinstance(getattr(module, name, None), (int, float, Tensor)):
            return float(getattr(module, name))
    raise ValueError(
        f"{type(module).__name__}._attn: no scale_attn or norm_factor to divide its scores by"
    )


def _inline_layers(hf, toks: Tensor, mod) -> dict[int, HFLayer]:
    """A family that scores inline (Falcon: q·kᵀ / √head_dim right after the rotation, no attention
    function): the q and k its ``apply_rotary_pos_emb`` returns, call i in layer i, keys as the
    score uses them."""
    orig = mod.apply_rotary_pos_emb
    got: list[dict] = []

    def wrapped(q, k, *args, **kwargs):
        q_rot, k_rot = orig(q, k, *args, **kwargs)
        got.append(dict(q=q_rot.detach().clone(), k=k_rot.detach().clone()))
        return q_rot, k_rot

    mod.apply_rotary_pos_emb = wrapped
    try:
        with torch.no_grad():
            probs = hf(toks, output_attentions=True).attentions
    finally:
        mod.apply_rotary_pos_emb = orig
    scale = (
        hf.config.hidden_size // hf.config.num_attention_heads
    ) ** -0.5  # Falcon divides by √head_dim in its code
    return {
        L: HFLayer(
            probs=probs[L].detach(), scale=scale, window=None, softcap=None, sinks=None, **got[L]
        )
        for L in range(len(probs))
    }


def allowed_keys(n: int, window: int | None) -> Tensor:
    """``[n, n]``: query m sees key j iff j ≤ m and (with a window) m − j < window."""
    ok = torch.tril(torch.ones(n, n, dtype=torch.bool))
    if window is not None:
        m, j = torch.arange(n)[:, None], torch.arange(n)[None, :]
        ok &= (m - j) < window
    return ok


def keys_per_head(k: Tensor, n_heads: int) -> Tensor:
    """``[b, KV, n, d]`` -> ``[b, H, n, d]``: query head h reads KV head h // (H / KV)."""
    group = n_heads // k.shape[1]
    return k[:, torch.arange(n_heads) // group]


def band_logits(lay: HFLayer, dims: list[Tensor]) -> Tensor:
    """``[b, H, band, q, k]``: each band's q·k terms times HF's score scale (float64, unmasked)."""
    q, k = lay.q.double(), keys_per_head(lay.k.double(), lay.q.shape[1])
    return (
        torch.stack([torch.einsum("bhqd,bhkd->bhqk", q[..., d], k[..., d]) for d in dims], dim=2)
        * lay.scale
    )


def pattern_of(lay: HFLayer, logits: Tensor, ok: Tensor) -> Tensor:
    """The layer's softmax of ``logits`` (head axis 1): soft-cap, mask, sinks joining the
    softmax."""
    x = logits
    if lay.softcap is not None:
        x = lay.softcap * torch.tanh(x / lay.softcap)
    x = x.masked_fill(~ok, float("-inf"))
    if lay.sinks is None:
        return torch.softmax(x, dim=-1)
    sink = lay.sinks.double().view(1, -1, *[1] * (x.ndim - 2)).expand(*x.shape[:-1], 1)
    return torch.softmax(torch.cat([x, sink], dim=-1), dim=-1)[..., :-1]


def js(p: Tensor, r: Tensor) -> Tensor:
    """Jensen–Shannon divergence in nats along the last axis (0·log 0 = 0)."""
    m = (p + r) / 2

    def kl(a):
        return torch.where(a > 0, a * (a / m).log(), 0.0).sum(-1)

    return (kl(p) + kl(r)) / 2


def _model_pattern(lay: HFLayer, scores: Tensor, ok: Tensor) -> Tensor:
    """HF's probabilities as its values see them: where its sinks are left out of the probabilities
    it returns (rows summing to 1) and scale the output after the softmax (Granite SWA), times
    ``sigmoid(lse − sink)``, the log-sum-exp over the allowed (capped) scores of the row."""
    p = lay.probs.double()
    if (
        lay.sinks is None or float((p.sum(-1) - 1).abs().max()) > 1e-5
    ):  # no sinks, or their mass is in p already
        return p
    x = lay.softcap * torch.tanh(scores / lay.softcap) if lay.softcap is not None else scores
    lse = torch.logsumexp(x.masked_fill(~ok, float("-inf")), dim=-1)
    return p * torch.sigmoid(lse - lay.sinks.double().view(1, -1, 1)).unsqueeze(-1)


def dense_layer_sums(lay: HFLayer, dims: list[Tensor], planes: Tensor) -> dict[str, Tensor]:
    """Every sum the band-statistics reducer streams, for one layer of one unpadded batch, over full
    tensors.

    ``dims``: each band's head dims; ``planes``: ``[P, 2]`` head dims of each plane (both in HF's
    layout)."""
    X = band_logits(lay, dims)  # [b,H,B,n,n]
    Y = X.sum(2)  # [b,H,n,n]: the model's (pre-cap) scores
    b, H, B, n, _ = X.shape
    ok = lay.allowed if lay.allowed is not None else allowed_keys(n, lay.window)
    okf = ok.double()
    cnt = okf.sum(-1)  # keys per query [n]
    two, one = (cnt >= 2).double(), (cnt >= 1).double()
    att = lay.probs.argmax(-1)  # [b,H,n]: the key HF's own pattern attends to most

    mean_x = (X * okf).sum(-1, keepdim=True) / cnt[:, None]
    mean_y = (Y * okf).sum(-1, keepdim=True) / cnt[:, None]
    dx, dy = (X - mean_x) * okf, (Y - mean_y) * okf
    xa = X.gather(-1, att[:, :, None, :, None].expand(b, H, B, n, 1))[
        ..., 0
    ]  # [b,H,B,n] band logit at attended key
    others = ((X * okf).sum(-1) - xa) / (cnt - 1).clamp(min=1)
    band_max = X.masked_fill(~ok, float("-inf")).amax(-1)
    # keys tied at a band's maximum share its pick
    ties = (X.masked_fill(~ok, float("-inf")) == band_max[..., None]).sum(-1).clamp(min=1)
    band_pattern = pattern_of(lay, X, ok)
    model_pattern = _model_pattern(lay, Y, ok)[:, :, None]

    q, k = lay.q.double(), keys_per_head(lay.k.double(), H)
    ka = k.gather(2, att[..., None].expand(-1, -1, -1, k.shape[-1]))  # [b,H,n,d] attended key
    q0, q1, k0, k1 = (
        q[..., planes[:, 0]],
        q[..., planes[:, 1]],
        ka[..., planes[:, 0]],
        ka[..., planes[:, 1]],
    )
    term = (q0 * k0 + q1 * k1) * lay.scale  # [b,H,n,P]
    bound = torch.hypot(q0, q1) * torch.hypot(k0, k1) * lay.scale
    return {
        "abs_sum": (X.abs() * okf).sum((0, 3, 4)),
        "cov": ((dx * dy[:, :, None]).sum(-1) * two).sum((0, 3)),
        "margin": ((xa - others) * two).sum((0, 3)),
        "top1": ((xa >= band_max).double() / ties * one).sum((0, 3)),
        "jsd": (js(band_pattern, model_pattern) * one).sum((0, 3)),
        "var": ((dy**2).sum(-1) * two).sum((0, 2)),
        "n_entries": cnt.sum() * b,
        "n_rows": two.sum() * b,
        "n_queries": one.sum() * b,
        "cs_term": (term * two[:, None]).sum((0, 2)),
        "cs_bound": (bound * two[:, None]).sum((0, 2)),
    }


def dense_reference(
    hf,
    runs: Sequence[Tensor],
    layers: Sequence[int],
    dims: dict[int, list[Tensor]],
    planes: dict[int, Tensor],
) -> dict[str, Tensor]:
    """Dense sums over separate unpadded runs (each a ``[b, n]`` token tensor), added up, ``[layer,
    ...]``."""
    total: dict[str, Tensor] = {}
    for toks in runs:
        lays = hf_layers(hf, toks)
        per_layer = [dense_layer_sums(lays[L], dims[L], planes[L]) for L in layers]
        for key in per_layer[0]:
            v = torch.stack([s[key] for s in per_layer])
            total[key] = total[key] + v if key in total else v
    return total


def plane_norm_means(x: Tensor, planes: Tensor) -> Tensor:
    """``[b, h, n, d]`` head vectors -> ``[h, P]``: each plane's 2-norm ‖(x_a, x_b)‖, averaged over
    rows and positions (float64), the planes given as ``[P, 2]`` head dims."""
    x = x.double()
    return torch.sqrt(x[..., planes[:, 0]] ** 2 + x[..., planes[:, 1]] ** 2).mean((0, 2))
