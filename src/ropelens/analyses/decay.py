"""RoPE's "long-term decay" (Su et al.; Barbero et al.): the logit by distance for this model's
frequencies.

The decay exists for constant q = k = 1 (and in RoFormer's bound), not for random Gaussian q, k,
whose expected logit is flat; ``rope_decay_by_distance`` asks whether a real model's heads decay.
Distance convention: δ = m − n ≥ 0 for a query at m and a key at n; the logit is qᵀR((n − m)θ)k.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from jaxtyping import Bool, Float
from torch import Tensor

from ropelens.errors import InputError
from ropelens.results.curves import DecayCurve, max_distance_arg, vector
from ropelens.spec.rope import LayerRope

__all__ = [
    "roformer_bound",
    "rope_decay_by_distance",
    "rope_decay_constant",
    "rope_gaussian_expectation",
]


def _rope_args(inv_freq: Any, max_distance: int) -> tuple[Tensor, Tensor]:
    """Validated (inv_freq as float64, distances 0 … max_distance)."""
    theta = vector(inv_freq, "inv_freq")
    if theta.numel() == 0 or not torch.isfinite(theta).all() or (theta < 0).any():
        raise InputError(
            "inv_freq must be non-empty, finite and ≥ 0 (radians per token), got "
            f"{theta.tolist()[:8]}…"
        )
    if not isinstance(max_distance, int) or isinstance(max_distance, bool) or max_distance < 0:
        raise InputError(f"max_distance must be an int ≥ 0, got {max_distance!r}")
    return theta, torch.arange(max_distance + 1)


def rope_decay_constant(inv_freq: Float[Tensor, " n_planes"], max_distance: int) -> DecayCurve:
    """Logit of constant q = k = 1 at distance δ: Σ_i (1, 1)ᵀR(δθ_i)(1, 1) = Σ_i 2cos(δθ_i).

    This is the "long-term decay" of RoFormer (Su et al., 2021): it exists for these constant
    vectors, not for random ones (see :func:`rope_gaussian_expectation`). ``.normalised()`` divides
    by the δ = 0 value 2·n_planes = d_r, giving (1/d_r)·Σ_i 2cos(δθ_i).

    Args:
        inv_freq (Tensor): ``[n_planes]`` rotation frequencies θ_i in radians per token (e.g.
            ``LayerRope.inv_freq``); finite and ≥ 0.
        max_distance (int): Largest distance δ; the curve covers δ = 0 … max_distance.

    Returns:
        DecayCurve: ``kind="constant"``, exact (no ``std``/``count``), ``mean`` of shape
        ``[max_distance + 1]``.

    Raises:
        InputError: When ``inv_freq`` is empty, non-finite or negative, or ``max_distance`` is not
            an int ≥ 0.

    Examples:
        >>> from ropelens import rope_spec
        >>> from ropelens.analyses import rope_decay_constant
        >>> from ropelens.testing import tiny_model
        >>> inv_freq = rope_spec(tiny_model("llama")).layers[0].inv_freq  # 8 planes
        >>> curve = rope_decay_constant(inv_freq, 4)
        >>> curve.mean.round(decimals=2).tolist()
        [16.0, 14.97, 12.74, 11.09, 11.12]
        >>> round(float(curve.normalised().mean[1]), 3)
        0.936
    """
    theta, dist = _rope_args(inv_freq, max_distance)
    value = 2 * torch.cos(dist.double()[:, None] * theta).sum(dim=1)
    return DecayCurve(name="constant q = k = 1", kind="constant", distance=dist, mean=value)


def roformer_bound(inv_freq: Float[Tensor, " n_planes"], max_distance: int) -> DecayCurve:
    """RoFormer's relative upper bound (1/(d/2))·Σ_{j=1}^{d/2} |S_j|, S_j = Σ_{k<j} e^{iδθ_k}.

    Abel summation bounds |Σ_k h_k e^{iδθ_k}| by max_k |h_{k+1} − h_k| times d/2 of this; it is a
    bound on the sum's magnitude, not the logit of any particular q, k.
    """
    theta, dist = _rope_args(inv_freq, max_distance)
    phase = dist.double()[:, None] * theta
    partial = torch.complex(phase.cos(), phase.sin()).cumsum(dim=1)  # S_1 … S_{d/2}
    return DecayCurve(
        name="RoFormer relative upper bound",
        kind="roformer_bound",
        distance=dist,
        mean=partial.abs().mean(dim=1),
    )


def rope_gaussian_expectation(
    inv_freq: Float[Tensor, " n_planes"],
    max_distance: int,
    *,
    mean: float = 0.0,
    std: float = 1.0,
    n_samples: int | None = None,
    seed: int = 0,
) -> DecayCurve:
    """E[qᵀR(δθ)k] for q, k iid N(μ, σ²) per coordinate: Σ_i μ²·2cos(δθ_i), flat zero for μ = 0.

    Random zero-mean vectors show no long-term decay (Barbero et al., 2025, "Round and Round We
    Go!"); a decay needs a shared mean direction. Without ``n_samples`` the curve is exact and
    ``std`` is the exact spread of one product, √(d_r·σ²(2μ² + σ²)), the same at every δ because
    rotations keep norms. With ``n_samples`` it is a seeded Monte Carlo estimate (sample mean, std
    and count, hence ``sem``) for checking the closed form.

    Args:
        inv_freq (Tensor): ``[n_planes]`` rotation frequencies θ_i in radians per token; finite
            and ≥ 0.
        max_distance (int): Largest distance δ; the curve covers δ = 0 … max_distance.
        mean (float): Mean μ of every q and k coordinate (default 0: the flat case).
        std (float): Standard deviation σ ≥ 0 of every coordinate (default 1).
        n_samples (int | None): None (default) for the exact curve; an int ≥ 2 draws that many
            (q, k) pairs instead.
        seed (int): Seed of the Monte Carlo draw (ignored without ``n_samples``).

    Returns:
        DecayCurve: ``kind="gaussian"`` (exact ``mean`` and ``std``, no ``count``) or
        ``kind="gaussian_mc"`` (sample ``mean``, ``std`` and ``count``), each
        ``[max_distance + 1]``.

    Raises:
        InputError: When ``inv_freq`` or ``max_distance`` is invalid (as in
            :func:`rope_decay_constant`), ``mean``/``std`` is not finite or ``std < 0``, or
            ``n_samples`` is neither None nor an int ≥ 2.

    Examples:
        >>> import torch
        >>> from ropelens.analyses import rope_gaussian_expectation
        >>> inv_freq = 10000.0 ** -(torch.arange(8) / 8)  # 8 planes, head_dim 16
        >>> flat = rope_gaussian_expectation(inv_freq, 4)
        >>> flat.mean.tolist(), flat.std.tolist()  # std = √(16·1·(0 + 1)) = 4
        ([0.0, 0.0, 0.0, 0.0, 0.0], [4.0, 4.0, 4.0, 4.0, 4.0])
        >>> mc = rope_gaussian_expectation(inv_freq, 4, n_samples=2000, seed=0)
        >>> bool((mc.mean.abs() < 4 * mc.sem).all())  # the estimate agrees with zero
        True
    """
    theta, dist = _rope_args(inv_freq, max_distance)
    if not (math.isfinite(mean) and math.isfinite(std) and std >= 0):
        raise InputError(f"need a finite mean and std ≥ 0, got mean={mean!r}, std={std!r}")
    d_r = 2 * theta.numel()
    if n_samples is None:
        value = mean**2 * 2 * torch.cos(dist.double()[:, None] * theta).sum(dim=1)
        spread = torch.full_like(value, math.sqrt(d_r * std**2 * (2 * mean**2 + std**2)))
        return DecayCurve(
            name=f"Gaussian q, k (μ={mean:g}, σ={std:g})",
            kind="gaussian",
            distance=dist,
            mean=value,
            std=spread,
        )
    if not isinstance(n_samples, int) or n_samples < 2:
        raise InputError(
            f"n_samples must be an int ≥ 2 (or None for the exact curve), got {n_samples!r}"
        )
    g = torch.Generator().manual_seed(seed)
    q = mean + std * torch.randn(n_samples, theta.numel(), 2, generator=g, dtype=torch.float64)
    k = mean + std * torch.randn(n_samples, theta.numel(), 2, generator=g, dtype=torch.float64)
    phase = dist.double()[:, None] * theta
    cos, sin = phase.cos().T, phase.sin().T
    total = torch.zeros(len(dist), dtype=torch.float64)
    total_sq = torch.zeros_like(total)
    for s in range(0, n_samples, 4096):  # chunks bound memory at 4096 × n_dist
        qs, ks = q[s : s + 4096], k[s : s + 4096]
        dot = (qs * ks).sum(-1)
        cross = qs[..., 1] * ks[..., 0] - qs[..., 0] * ks[..., 1]
        logits = dot @ cos - cross @ sin  # qᵀR(−δθ)k = dot·cos(δθ) − cross·sin(δθ), per plane
        total += logits.sum(0)
        total_sq += (logits * logits).sum(0)
    avg = total / n_samples
    return DecayCurve(
        name=f"Gaussian q, k (μ={mean:g}, σ={std:g}), {n_samples} samples",
        kind="gaussian_mc",
        distance=dist,
        mean=avg,
        std=(total_sq / n_samples - avg**2).clamp(min=0).sqrt(),
        count=torch.full((len(dist),), n_samples, dtype=torch.int64),
    )


def rope_decay_by_distance(
    q: Float[Tensor, "batch pos d_head"],
    k: Float[Tensor, "batch pos d_head"],
    layer_rope: LayerRope,
    max_distance: int | None = None,
    *,
    valid: Bool[Tensor, "batch pos"] | None = None,
    name: str | None = None,
) -> DecayCurve:
    """Mean, std and count of q_m·k_n over causal pairs n ≤ m with m − n = δ, for one head.

    Asks whether a real head shows RoPE's long-term decay (Su et al.; Barbero et al.). ``q`` and
    ``k`` are post-RoPE with keys matched to the query head, e.g. from ``capture_qk``:
    ``acts["q_post"][:, :, h]``, ``acts["k_post"][:, :, h // acts.rope.group_size]``,
    ``valid=acts.valid`` (pairs touching padding are skipped). Values are raw dot products; times
    ``layer_rope.score_scale`` they are the pre-softmax logits (same verdict).

    Args:
        q (Tensor): ``[batch, pos, d_head]`` post-RoPE queries of one head.
        k (Tensor): ``[batch, pos, d_head]`` post-RoPE keys of the KV head that head reads.
        layer_rope (LayerRope): The layer's RoPE reading (its ``head_dim`` must match ``d_head``).
        max_distance (int | None): Largest distance δ; None for pos − 1.
        valid (Tensor | None): ``[batch, pos]`` bool, True on real tokens; None when every token
            is real.
        name (str | None): Curve name; default ``"layer {layer}"``.

    Returns:
        DecayCurve: ``kind="measured"`` with ``mean``, ``std`` and ``count`` (number of causal
        pairs) at each δ = 0 … max_distance.

    Raises:
        InputError: When ``q``/``k`` are not 3-D, their ``d_head`` differs from the layer's
            ``head_dim`` or from each other, ``valid`` has the wrong shape, some distance has no
            valid pair, or the tensors hold NaN/inf.

    Examples:
        >>> import torch
        >>> from ropelens import capture_qk
        >>> from ropelens.analyses import rope_decay_by_distance
        >>> from ropelens.testing import tiny_model
        >>> acts = capture_qk(tiny_model("llama"), torch.randint(4, 100, (2, 32)), layers=[0])[0]
        >>> h = 1
        >>> curve = rope_decay_by_distance(
        ...     acts["q_post"][:, :, h],
        ...     acts["k_post"][:, :, h // acts.rope.group_size],
        ...     acts.rope,
        ...     8,
        ...     valid=acts.valid,
        ... )
        >>> curve.name, curve.count.tolist()  # 2 rows × (32 − δ) pairs
        ('layer 0', [64, 62, 60, 58, 56, 54, 52, 50, 48])
    """
    for label, t in (("q", q), ("k", k)):
        if not isinstance(t, Tensor) or t.ndim != 3:
            raise InputError(
                f"{label} must be a [batch, pos, d_head] tensor, got {getattr(t, 'shape', type(t))}"
            )
        if t.shape[-1] != layer_rope.head_dim:
            raise InputError(
                f"{label} has d_head {t.shape[-1]} but layer {layer_rope.layer} has head_dim "
                f"{layer_rope.head_dim}: pass one head's vectors, not a concatenation"
            )
    if q.shape != k.shape:
        raise InputError(
            f"q {tuple(q.shape)} and k {tuple(k.shape)} differ: repeat KV heads to match first"
        )
    if valid is not None and tuple(valid.shape) != tuple(q.shape[:2]):
        raise InputError(
            f"valid has shape {tuple(valid.shape)}, expected [batch, pos] = {tuple(q.shape[:2])}"
        )
    n_pos = q.shape[1]
    max_distance = max_distance_arg(max_distance, n_pos)
    key = torch.arange(n_pos)[:, None] - torch.arange(max_distance + 1)  # [m, δ] → n = m − δ
    in_range, key = key >= 0, key.clamp(min=0)
    total = torch.zeros(max_distance + 1, dtype=torch.float64)
    total_sq, count = torch.zeros_like(total), torch.zeros_like(total)
    for b in range(
        q.shape[0]
    ):  # one [pos, pos] matrix at a time keeps memory at pos², not batch·pos²
        pair = (
            in_range if valid is None else in_range & valid[b][:, None].cpu() & valid[b].cpu()[key]
        )
        logits = (q[b].double() @ k[b].double().T).cpu()  # [query m, key n]
        vals = torch.where(pair, logits.gather(1, key), 0.0)
        total, total_sq, count = (
            total + vals.sum(0),
            total_sq + (vals * vals).sum(0),
            count + pair.sum(0),
        )
    if (count == 0).any():
        first = int((count == 0).nonzero()[0])
        raise InputError(f"no valid pairs at distance {first}: lower max_distance below {first}")
    mean = total / count
    if not torch.isfinite(mean).all():
        raise InputError("q or k hold NaN/inf: check the capture (dtype overflow?)")
    std = (total_sq / count - mean**2).clamp(min=0).sqrt()
    return DecayCurve(
        name=name or f"layer {layer_rope.layer}",
        kind="measured",
        distance=torch.arange(max_distance + 1),
        mean=mean,
        std=std,
        count=count.long(),
    )
