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
    """Cosine similarity of position-embedding rows: pairwise, by distance, and its dominant period.

    What :func:`pe_similarity` returns for a ``[n_pos, d]`` matrix of absolute position embeddings
    (learned, :func:`learned_pe`, or sinusoidal, :func:`sinusoidal_pe`), after Luo & Love. A
    by-distance curve like RoPE's decay curves: ``to_frame()`` gives one row per distance,
    ``figure()`` draws the curve and ``heatmap()`` the pairwise matrix. The period is the one
    sinusoid that best explains the detrended curve (:func:`periodicity`); it is reported only when
    its strength clears ``period_threshold``.

    Attributes:
        name (str): A label for the embeddings (a model's name, or "" for none).
        similarity (Tensor): Pairwise cosine similarity ``[n_pos, n_pos]``, float32 (saved exactly,
            as base64).
        distance (Tensor): Distances δ = |m − n| ``[n_dist]``: 0, 1, …, ``max_distance``.
        mean (Tensor): Mean similarity of the pairs at each distance ``[n_dist]`` (float64).
        std (Tensor): Their standard deviation (population) ``[n_dist]``.
        count (Tensor): How many pairs each distance has, ``n_pos − δ`` ``[n_dist]``.
        d_model (int): Width of the embeddings.
        period (float | None): Dominant period of the mean curve in tokens, or None when
            ``period_strength`` is below ``period_threshold``.
        period_strength (float): Fraction of the detrended by-distance variance that one sinusoid
            explains, in [0, 1].
        period_threshold (float): The strength a period had to reach: max(``min_strength``, the
            strength white noise of this curve length beats with probability 0.01).

    Examples:
        >>> from ropelens.analyses import pe_similarity, sinusoidal_pe
        >>> sim = pe_similarity(sinusoidal_pe(128, 2), name="one pair")
        >>> sim.n_pos, sim.d_model, tuple(sim.mean.shape)
        (128, 2, (128,))
        >>> sim.period_text()
        'period 6.3 tokens (strength 1.00 vs threshold 0.30)'
        >>> len(sim.figure().data) >= 1
        True
    """

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
    """Cosine similarity of position rows, its mean/std/count by distance |m − n|, and its period.

    Every pair of rows is compared (after Luo & Love, for learned and sinusoidal absolute
    embeddings); the pairs at each distance are averaged, and the dominant period of that mean
    curve is found by :func:`periodicity`: the partial R² of one sinusoid added to a linear trend,
    against a threshold that keeps white noise below it with probability 0.01. Needs
    ``12 · n_pos²`` bytes for the float64 matrix and its float32 copy.

    Args:
        embeddings (Tensor | numpy.ndarray): The ``[n_pos, d]`` position-embedding matrix, one row
            per position (n_pos ≥ 2, every row finite and nonzero).
        name (str): A label recorded in the result (default "").
        max_distance (int | None): The largest distance to average over, in [0, n_pos − 1]
            (default None: n_pos − 1).
        min_strength (float): The least period strength that counts as a period, whatever the
            curve's length (default 0.3: smooth decays reach about 0.2 after detrending, clean
            periods exceed 0.8).

    Returns:
        PESimilarity: The pairwise matrix, the by-distance mean/std/count ``[max_distance + 1]``
        and the period (None when too weak).

    Raises:
        TypeError: When ``embeddings`` is not a tensor or array of real numbers.
        InputError: When it is not a ``[n_pos, d]`` matrix with n_pos ≥ 2, a row holds NaN/inf or
            is all zero, ``max_distance`` is out of range, or the matrix does not fit in memory.

    Examples:
        >>> from ropelens.analyses import pe_similarity, sinusoidal_pe
        >>> sim = pe_similarity(sinusoidal_pe(128, 2), max_distance=32)
        >>> tuple(sim.distance.shape), round(float(sim.mean[1]), 4)
        ((33,), 0.5403)
        >>> f"{sim.period:.1f} tokens"
        '6.3 tokens'
    """
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
    """Sinusoidal position embeddings of Vaswani et al. (2017), the reference for learned ones.

    PE[m, 2i] = sin(m·ω_i), PE[m, 2i+1] = cos(m·ω_i), with ω_i = base^(−2i/d): computed in float64,
    returned in float32.

    Args:
        n_pos (int): Number of positions (rows), ≥ 1.
        d (int): Width of each embedding, a positive even number (sin and cos come in pairs).
        base (float): The frequency base, > 1 (default 10000, as in the paper).

    Returns:
        Tensor: The ``[n_pos, d]`` float32 embeddings, sin and cos of each frequency interleaved.

    Raises:
        InputError: When ``n_pos`` is not a positive int, ``d`` not a positive even int, or
            ``base`` not above 1.

    Examples:
        >>> from ropelens.analyses import sinusoidal_pe
        >>> pe = sinusoidal_pe(512, 128)
        >>> tuple(pe.shape)
        (512, 128)
        >>> [round(x, 4) for x in pe[1, :4].tolist()]
        [0.8415, 0.5403, 0.7617, 0.6479]
    """
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

    Found under the HF base model: GPT-2 / GPT-Neo ``wpe``; OPT (and Galactica)
    ``decoder.embed_positions`` without its 2 offset rows; BERT-like
    ``embeddings.position_embeddings`` (RoBERTa-like tables drop rows up to padding_idx). Pass the
    matrix to :func:`pe_similarity`.

    Args:
        model: A TransformerLens bridge (as :func:`ropelens.load_model` returns) or an HF model.

    Returns:
        Tensor: The ``[n_pos, d_model]`` position embeddings, one row per position, as a CPU
        float32 copy.

    Raises:
        InputError: When the model has no learned position table: a rotary model (the message
            names the RoPE geometry functions to use instead), or a table at none of the known
            paths.

    Examples:
        >>> from ropelens.analyses import learned_pe
        >>> from ropelens.testing import tiny_model
        >>> tuple(learned_pe(tiny_model("gpt2")).shape)
        (256, 64)
        >>> learned_pe(tiny_model("llama"))
        Traceback (most recent call last):
            ...
        ropelens.errors.InputError: tiny-llama has no learned position-embedding matrix: ...
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
