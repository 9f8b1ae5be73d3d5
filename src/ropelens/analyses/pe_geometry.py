"""Position-embedding geometry: similarity of absolute position embeddings by distance, and
periodicity.

Learned and sinusoidal absolute embeddings (Luo & Love): cosine similarity of every pair of
position rows, averaged by distance |m − n|, and the dominant period of that curve.

:class:`PESimilarity` is a by-distance curve (:mod:`ropelens.results.curves`), like RoPE's decay
curves (:mod:`ropelens.analyses.decay`), so both are judged by ``decay_verdict`` and drawn together
by :func:`ropelens.plots.curves.overlay`. Distance convention: δ = m − n ≥ 0 for a query at m and a
key at n; the logit is qᵀR((n − m)θ)k.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from jaxtyping import Float, Float32, Int
from torch import Tensor

from ropelens.devices import require_memory
from ropelens.errors import InputError
from ropelens.results.codec import BASE64
from ropelens.results.curves import (
    ByDistance,
    check_curve,
    max_distance_arg,
    vector,
)
from ropelens.results.figures import figure_of
from ropelens.results.result import Result
from ropelens.spec.reading import hf_model_of, model_label

__all__ = [
    "PESimilarity", "learned_pe", "pe_similarity", "periodicity", "sinusoidal_pe",
]  # fmt: skip

MIN_PERIOD_STRENGTH = 0.3  # smooth decays reach ~0.2 after detrending; clean periods exceed 0.8
PERIOD_FALSE_ALARM = 0.01  # chance that white noise alone clears the length-dependent noise floor


# --------------------------------------------------------------------------------------------
# result types
# --------------------------------------------------------------------------------------------
# json_options: compact JSON, since the matrix is base64 already
@dataclass(frozen=True)
class PESimilarity(ByDistance, Result, json_options={"indent": None, "allow_nan": False}):
    """Cosine similarity of position-embedding rows: pairwise, by distance, and its dominant
    period."""

    name: str
    # float32, written as base64 (exact); by-distance stats come from float64
    similarity: Float32[Tensor, "n_pos n_pos"] = field(metadata=BASE64)
    distance: Int[Tensor, " n_dist"]
    mean: Float[Tensor, " n_dist"]
    std: Float[Tensor, " n_dist"]
    count: Int[Tensor, " n_dist"]
    d_model: int
    period: float | None  # tokens; None when strength < period_threshold
    period_strength: float  # fraction of detrended by-distance variance one sinusoid explains
    period_threshold: float  # max(min_strength, white-noise floor for this curve length)

    def __post_init__(self) -> None:
        s = self.similarity
        if s.ndim != 2 or s.shape[0] != s.shape[1] or s.shape[0] < 2:
            raise InputError(
                f"similarity must be a square [n_pos, n_pos] matrix, got {tuple(s.shape)}"
            )
        check_curve(self.distance, {"mean": self.mean, "std": self.std, "count": self.count})
        if int(self.distance[-1]) >= s.shape[0]:
            raise InputError(f"distance reaches {int(self.distance[-1])} but n_pos is {s.shape[0]}")
        if not 0.0 <= self.period_strength <= 1.0:
            raise InputError(f"period_strength must be in [0, 1], got {self.period_strength}")
        if self.period is not None and not self.period >= 2.0:
            raise InputError(f"period must be ≥ 2 tokens or None, got {self.period}")

    @property
    def n_pos(self) -> int:
        """Number of positions (rows of the embedding matrix)."""
        return self.similarity.shape[0]

    def heatmap(self) -> Any:
        """Pairwise cosine similarity, strided to at most 512 positions a side for display."""
        return figure_of(PESimilarity, "heatmap")(self)

    def period_text(self) -> str:
        """The periodicity found (its period in tokens) or its absence, with the strength against
        the threshold."""
        s = f"strength {self.period_strength:.2f} vs threshold {self.period_threshold:.2f}"
        return f"period {self.period:.1f} tokens ({s})" if self.period else f"no periodicity ({s})"

    def _repr_html_(self) -> str:
        head = (
            f"<b>{self.name or 'PESimilarity'}</b>: {self.n_pos} positions × {self.d_model} dims, "
        )
        return head + self.period_text() + self.to_frame().head(8).to_html(index=False)


# --------------------------------------------------------------------------------------------
# absolute position embeddings
# --------------------------------------------------------------------------------------------
def _check_embeddings(embeddings: Any) -> Float[Tensor, "n_pos d"]:
    if not isinstance(embeddings, (Tensor, np.ndarray)):
        raise TypeError(
            f"embeddings must be a torch.Tensor or numpy array, got {type(embeddings).__name__}"
        )
    e = torch.as_tensor(embeddings).detach().cpu()
    if e.is_complex() or e.dtype == torch.bool:
        raise TypeError(f"embeddings must be real numbers, got dtype {e.dtype}")
    if e.ndim != 2 or e.shape[0] < 2 or e.shape[1] < 1:
        raise InputError(
            "embeddings must be a [n_pos, d] matrix with n_pos ≥ 2 and d ≥ 1, got shape "
            f"{tuple(e.shape)}"
        )
    e = e.double()
    bad = (~torch.isfinite(e)).any(dim=1).nonzero().flatten()
    if bad.numel():
        raise InputError(f"embeddings have NaN/inf in rows {bad[:10].tolist()}: clean them first")
    zero = (e.norm(dim=1) == 0).nonzero().flatten()
    if zero.numel():
        raise InputError(
            f"rows {zero[:10].tolist()} are all zero, so cosine is undefined: drop them"
        )
    return e


def pe_similarity(
    embeddings: Float[Tensor, "n_pos d"] | np.ndarray,
    *,
    name: str = "",
    max_distance: int | None = None,
    min_strength: float = MIN_PERIOD_STRENGTH,
) -> PESimilarity:
    """Cosine similarity of position rows, its mean/std/count by distance |m − n|, and its
    period."""
    e = _check_embeddings(embeddings)
    n = e.shape[0]
    max_distance = max_distance_arg(max_distance, n)

    # the float64 similarity matrix, its float32 copy and one diagonal at a time
    require_memory(
        12.0 * e.shape[0] ** 2,
        f"the {e.shape[0]:,} × {e.shape[0]:,} similarity matrix",
        "pass fewer positions",
        e.device,
    )
    u = e / e.norm(dim=1, keepdim=True)
    sim = u @ u.T
    diags = [
        sim.diagonal(-k) for k in range(max_distance + 1)
    ]  # symmetric: one side covers |m − n|
    mean = torch.stack([t.mean() for t in diags])
    std = torch.stack([t.std(correction=0) for t in diags])
    period, strength, threshold = periodicity(mean, min_strength=min_strength)
    return PESimilarity(
        name=name,
        similarity=sim.float(),
        distance=torch.arange(max_distance + 1),
        mean=mean,
        std=std,
        count=torch.tensor([t.numel() for t in diags]),
        d_model=e.shape[1],
        period=period,
        period_strength=strength,
        period_threshold=threshold,
    )


def periodicity(
    curve: Float[Tensor, " n_dist"],
    *,
    min_strength: float = MIN_PERIOD_STRENGTH,
    false_alarm: float = PERIOD_FALSE_ALARM,
) -> tuple[float | None, float, float]:
    """Dominant period (tokens, or None), its strength in [0, 1], and the threshold it had to reach.

    The curve at distances 1, 2, … (δ = 0 is the self-pair spike) is detrended with a line; strength
    is the partial R² of one sinusoid added to that line, at the frequency that maximises it among
    those with ≥ 2 full cycles in the window (so a leftover trend cannot pass for a period) and
    period ≥ 2. The threshold is max(min_strength, the strength white noise of this length beats
    with probability ``false_alarm``): partial R² of one of ~n/2 independent frequencies, P(max ≥ g)
    ≈ (n/2)(1 − g)^((n−4)/2). Fewer than 8 distances past δ = 0 is too short to call: (None, 0.0,
    1.0).
    """
    y = vector(curve, "curve").numpy()[1:]
    if not np.isfinite(y).all():
        raise InputError("curve has NaN or inf entries: compute it from finite embeddings")
    n = len(y)
    if n < 8:
        return None, 0.0, 1.0
    x = np.arange(1, n + 1, dtype=np.float64)
    trend = np.stack([np.ones(n), (x - x.mean()) / n], axis=1)
    resid = y - trend @ np.linalg.lstsq(trend, y, rcond=None)[0]
    ss = float(resid @ resid)
    threshold = max(min_strength, 1.0 - (false_alarm / (n // 2)) ** (2.0 / (n - 4)))
    if ss <= 1e-24 * max(1.0, float(y @ y)):
        return None, 0.0, threshold
    pad = 8 * n  # zero-padding only locates the peak; the fit below refines it
    power = np.abs(np.fft.rfft(resid, n=pad)) ** 2
    freqs = np.fft.rfftfreq(pad)
    power[freqs < 2.0 / n] = -1.0
    f0 = freqs[int(np.argmax(power))]
    best_f, best_r2 = f0, -1.0
    for f in np.linspace(f0 - 1.0 / pad, f0 + 1.0 / pad, 33):
        if not 2.0 / n <= f <= 0.5:
            continue
        design = np.concatenate(
            [trend, np.stack([np.cos(2 * np.pi * f * x), np.sin(2 * np.pi * f * x)], 1)], 1
        )
        r = y - design @ np.linalg.lstsq(design, y, rcond=None)[0]
        r2 = 1.0 - float(r @ r) / ss
        if r2 > best_r2:
            best_f, best_r2 = f, r2
    strength = float(min(1.0, max(0.0, best_r2)))
    return (1.0 / best_f if strength >= threshold else None), strength, threshold


def sinusoidal_pe(n_pos: int, d: int, base: float = 10000.0) -> Float[Tensor, "n_pos d"]:
    """Vaswani et al. embeddings: PE[m, 2i] = sin(m·ω_i), PE[m, 2i+1] = cos(m·ω_i), ω_i =
    base^(−2i/d)."""
    if not isinstance(n_pos, int) or n_pos < 1:
        raise InputError(f"n_pos must be a positive int, got {n_pos!r}")
    if not isinstance(d, int) or d < 2 or d % 2:
        raise InputError(f"d must be a positive even int (sin/cos come in pairs), got {d!r}")
    if not base > 1:
        raise InputError(f"base must be > 1, got {base!r}")
    omega = float(base) ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)
    angle = torch.arange(n_pos, dtype=torch.float64)[:, None] * omega
    return torch.stack([angle.sin(), angle.cos()], dim=-1).flatten(1).float()


# Paths under the HF base model (GPT2Model, OPTModel, BertModel, ...) of learned position tables.
_PE_PATHS = (
    "wpe",
    "decoder.embed_positions",
    "embeddings.position_embeddings",
    "encoder.embed_positions",
    "embed_positions",
)


def learned_pe(model: Any) -> Float[Tensor, "n_pos d_model"]:
    """The learned absolute position-embedding matrix of a bridge or HF model (CPU float32 copy).

    GPT-2 / GPT-Neo ``wpe``; OPT (and Galactica) ``decoder.embed_positions`` without its 2 offset
    rows; BERT-like ``embeddings.position_embeddings`` (RoBERTa-like tables drop rows up to
    padding_idx).
    """
    hf = hf_model_of(model)
    base = getattr(hf, "base_model", hf)
    for path in _PE_PATHS:
        try:
            mod = base.get_submodule(path)
        except AttributeError:
            continue
        mod = getattr(mod, "original_component", None) or mod  # unwrap TransformerLens bridges
        weight = getattr(mod, "weight", None)
        if not isinstance(weight, Tensor) or weight.ndim != 2:
            continue
        offset = getattr(mod, "offset", None)  # OPTLearnedPositionalEmbedding: ids start at 2
        if offset is None:
            pad = getattr(mod, "padding_idx", None)
            offset = 0 if pad is None else pad + 1  # RoBERTa: positions start after padding_idx
        return weight.detach()[int(offset) :].to("cpu", torch.float32).clone()
    label = model_label(model) if hasattr(model, "cfg") else type(hf).__name__
    if _has_rope(hf):
        raise InputError(
            f"{label} has no learned position-embedding matrix: it uses rotary position "
            "embeddings. Use the RoPE geometry instead: rope_decay_constant / "
            "rope_gaussian_expectation / roformer_bound with rope_spec(model)[layer].inv_freq, "
            "or rope_decay_by_distance on captured queries and keys."
        )
    raise InputError(
        f"{label} has no learned position table at any of {list(_PE_PATHS)} under its base model: "
        "pass the [n_pos, d] matrix to pe_similarity directly"
    )


def _has_rope(hf: Any) -> bool:
    cfg = hf.config.to_dict() if hasattr(hf, "config") else {}
    keys = ("rope_theta", "rope_parameters", "rope_scaling", "rotary_dim", "rotary_pct")
    return any(cfg.get(k) is not None for k in keys) or any(
        "rotary" in type(m).__name__.lower() for m in hf.modules()
    )
