"""Position-embedding geometry: similarity by distance and periodicity; the curves RoPE's decay shares.

Learned and sinusoidal absolute embeddings (Luo & Love): cosine similarity of every pair of
position rows, averaged by distance |m − n|, and the dominant period of that curve.

RoPE's "long-term decay" curves (:mod:`ropelens.decay`) are :class:`DecayCurve` objects defined
here and judged by :func:`decay_verdict`; they are importable from this module too.
Distance convention: δ = m − n ≥ 0 for a query at m and a key at n; the logit is qᵀR((n − m)θ)k.
"""

from __future__ import annotations

import base64
import json
import math
import os
import tempfile
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Literal

import numpy as np
import pandas as pd
import plotly.graph_objects as go
import torch
from jaxtyping import Float, Int
from plotly.subplots import make_subplots
from torch import Tensor

from ropelens.models import hf_model_of, model_label

__all__ = [
    "DecayCurve", "DecayVerdict", "PESimilarity", "decay_verdict", "learned_pe", "pe_similarity",
    "periodicity", "sinusoidal_pe",
]  # fmt: skip

MIN_PERIOD_STRENGTH = 0.3  # smooth decays reach ~0.2 after detrending; clean periods exceed 0.8
PERIOD_FALSE_ALARM = 0.01  # chance that white noise alone clears the length-dependent noise floor
MIN_SPEARMAN = 0.3  # |ρ| for a monotone trend; default RoPE constant curves give ρ ≈ −0.6 … −0.8
_FORMAT = 1
_HEATMAP_MAX_SIDE = 512  # browsers choke on multi-million-cell heatmaps; the matrix is kept whole


# --------------------------------------------------------------------------------------------
# shared: validation, JSON, by-distance curves
# --------------------------------------------------------------------------------------------
def _vector(x: Any, what: str, dtype: torch.dtype = torch.float64) -> Tensor:
    t = torch.as_tensor(x).detach().cpu()
    if t.ndim != 1:
        raise ValueError(f"{what} must be 1-D, got shape {tuple(t.shape)}")
    return t.to(dtype)


def _max_distance(max_distance: int | None, n_pos: int) -> int:
    """Default (n_pos − 1) or validate the largest distance to average over."""
    if max_distance is None:
        return n_pos - 1
    if not isinstance(max_distance, int) or isinstance(max_distance, bool) or not 0 <= max_distance < n_pos:
        raise ValueError(f"max_distance must be an int in [0, {n_pos - 1}] for {n_pos} positions, got {max_distance!r}")
    return max_distance


def _check_curve(distance: Tensor, arrays: dict[str, Tensor | None]) -> None:
    if not isinstance(distance, Tensor) or distance.ndim != 1 or distance.numel() == 0 or distance.is_floating_point():
        raise ValueError(f"distance must be a non-empty 1-D integer tensor, got {distance!r}")
    if (distance < 0).any() or (distance.diff() <= 0).any():
        raise ValueError("distance must be non-negative and strictly increasing")
    for name, t in arrays.items():
        if t is None:
            continue
        if not isinstance(t, Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if tuple(t.shape) != tuple(distance.shape):
            raise ValueError(f"{name} has shape {tuple(t.shape)}, distance {tuple(distance.shape)}")
        if t.is_floating_point() and not torch.isfinite(t).all():
            raise ValueError(f"{name} has NaN or inf entries: check the input vectors")
        if not t.is_floating_point() and (t < 1).any():
            raise ValueError(f"{name} must be ≥ 1 at every distance, got {t.tolist()[:8]}…")


def _tensor_json(t: Tensor) -> dict[str, Any]:
    """Float32 little-endian bytes in base64: a 2048² matrix is 22 MB this way, ~90 MB as text."""
    raw = t.detach().cpu().to(torch.float32).numpy().astype("<f4").tobytes()
    return {"shape": list(t.shape), "dtype": "float32", "base64": base64.b64encode(raw).decode()}


def _tensor_from_json(d: dict[str, Any]) -> Tensor:
    arr = np.frombuffer(base64.b64decode(d["base64"]), dtype="<f4").reshape(d["shape"])
    return torch.from_numpy(arr.copy())


def _atomic_write_json(path: str | os.PathLike, obj: dict[str, Any]) -> None:
    """Write to a temp file beside ``path`` then rename, so readers never see half a file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(obj, f, allow_nan=False)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _read_json(path: str | os.PathLike, kind: str) -> dict[str, Any]:
    d = json.loads(Path(path).read_text())
    if d.get("type") != kind:
        raise ValueError(f"{path} holds a {d.get('type')!r} result, not {kind!r}: load it with that class")
    if d.get("format") != _FORMAT:
        raise ValueError(f"{path} has format {d.get('format')!r}; this ropelens reads format {_FORMAT}")
    return d


def _curve_json(c: Any) -> dict[str, Any]:
    opt = {k: (None if getattr(c, k) is None else getattr(c, k).tolist()) for k in ("std", "count")}
    return {"distance": c.distance.tolist(), "mean": c.mean.tolist(), **opt}


def _curve_from_json(d: dict[str, Any]) -> dict[str, Any]:
    f64 = lambda k: None if d[k] is None else torch.tensor(d[k], dtype=torch.float64)  # noqa: E731
    count = None if d["count"] is None else torch.tensor(d["count"], dtype=torch.int64)
    return {"distance": torch.tensor(d["distance"], dtype=torch.int64), "mean": f64("mean"),
            "std": f64("std"), "count": count}


class _ByDistance:
    """Methods shared by results that hold a curve over distance (mean, std, count per distance)."""

    name: str
    distance: Int[Tensor, " n_dist"]
    mean: Float[Tensor, " n_dist"]
    std: Float[Tensor, " n_dist"] | None
    count: Int[Tensor, " n_dist"] | None

    @property
    def sem(self) -> Float[Tensor, " n_dist"] | None:
        """Standard error of the mean at each distance (None when the curve is exact)."""
        if self.std is None or self.count is None:
            return None
        return self.std / self.count.clamp(min=1).double().sqrt()

    def to_frame(self) -> pd.DataFrame:
        """Tidy by-distance curve: one row per distance."""
        cols = {"name": self.name, "distance": self.distance.numpy(), "mean": self.mean.numpy()}
        for key, t in (("std", self.std), ("count", self.count), ("sem", self.sem)):
            if t is not None:
                cols[key] = t.numpy()
        return pd.DataFrame(cols)

    def line(self, name: str | None = None) -> go.Scatter:
        """The by-distance mean as a plotly line trace (for overlays and subplots)."""
        return go.Scatter(x=self.distance.tolist(), y=self.mean.tolist(), mode="lines",
                          name=name or self.name or type(self).__name__)

    def _band(self) -> list[go.Scatter]:
        """±2 SEM band (about 95%) around the mean; empty when the curve is exact."""
        sem = self.sem
        if sem is None or not (sem > 0).any():
            return []
        x = self.distance.tolist()
        lo, hi = (self.mean - 2 * sem).tolist(), (self.mean + 2 * sem).tolist()
        return [go.Scatter(x=x + x[::-1], y=hi + lo[::-1], fill="toself", line={"width": 0},
                           opacity=0.25, hoverinfo="skip", showlegend=False, name="±2 SEM")]


# --------------------------------------------------------------------------------------------
# result types
# --------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class PESimilarity(_ByDistance):
    """Cosine similarity of position-embedding rows: pairwise, by distance, and its dominant period."""

    name: str
    similarity: Float[Tensor, "n_pos n_pos"]  # float32; by-distance stats come from float64
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
            raise ValueError(f"similarity must be a square [n_pos, n_pos] matrix, got {tuple(s.shape)}")
        _check_curve(self.distance, {"mean": self.mean, "std": self.std, "count": self.count})
        if int(self.distance[-1]) >= s.shape[0]:
            raise ValueError(f"distance reaches {int(self.distance[-1])} but n_pos is {s.shape[0]}")
        if not 0.0 <= self.period_strength <= 1.0:
            raise ValueError(f"period_strength must be in [0, 1], got {self.period_strength}")
        if self.period is not None and not self.period >= 2.0:
            raise ValueError(f"period must be ≥ 2 tokens or None, got {self.period}")

    @property
    def n_pos(self) -> int:
        """Number of positions (rows of the embedding matrix)."""
        return self.similarity.shape[0]

    def save(self, path: str | os.PathLike) -> None:
        """Write JSON atomically (the pairwise matrix as base64 float32)."""
        scalars = ("name", "d_model", "period", "period_strength", "period_threshold")
        _atomic_write_json(path, {"type": "PESimilarity", "format": _FORMAT, **{k: getattr(self, k) for k in scalars},
                                  "similarity": _tensor_json(self.similarity), **_curve_json(self)})

    @classmethod
    def load(cls, path: str | os.PathLike) -> PESimilarity:
        """Read a result written by :meth:`save`."""
        d = _read_json(path, "PESimilarity")
        return cls(name=d["name"], similarity=_tensor_from_json(d["similarity"]), d_model=d["d_model"],
                   period=d["period"], period_strength=d["period_strength"],
                   period_threshold=d["period_threshold"], **_curve_from_json(d))

    def heatmap(self) -> go.Heatmap:
        """Pairwise cosine similarity, strided to at most 512 positions a side for display."""
        step = max(1, math.ceil(self.n_pos / _HEATMAP_MAX_SIDE))
        pos = list(range(0, self.n_pos, step))
        z = self.similarity[::step, ::step].tolist()
        return go.Heatmap(z=z, x=pos, y=pos, zmin=-1, zmax=1, colorscale="RdBu_r",
                          colorbar={"title": "cos"}, name=self.name)

    def figure(self) -> go.Figure:
        """Pairwise heatmap beside the by-distance curve."""
        fig = make_subplots(rows=1, cols=2, subplot_titles=("pairwise", "by distance |m − n|"))
        fig.add_trace(self.heatmap(), row=1, col=1)
        for tr in [*self._band(), self.line()]:
            fig.add_trace(tr, row=1, col=2)
        fig.update_layout(
            title=f"{self.name or 'position embeddings'}: {self._period_text()}", showlegend=False,
            xaxis={"title": "position n"}, yaxis={"title": "position m", "autorange": "reversed"},
            xaxis2={"title": "distance (tokens)"}, yaxis2={"title": "mean cosine similarity"},
        )
        return fig

    def _period_text(self) -> str:
        s = f"strength {self.period_strength:.2f} vs threshold {self.period_threshold:.2f}"
        return f"period {self.period:.1f} tokens ({s})" if self.period else f"no periodicity ({s})"

    def _repr_html_(self) -> str:
        head = f"<b>{self.name or 'PESimilarity'}</b>: {self.n_pos} positions × {self.d_model} dims, "
        return head + self._period_text() + self.to_frame().head(8).to_html(index=False)


@dataclass(frozen=True)
class DecayCurve(_ByDistance):
    """A logit (or similarity) curve over distance δ = m − n; std and count when it is an estimate."""

    name: str
    kind: str  # "constant", "roformer_bound", "gaussian", "gaussian_mc", "measured", ...
    distance: Int[Tensor, " n_dist"]
    mean: Float[Tensor, " n_dist"]
    std: Float[Tensor, " n_dist"] | None = None
    count: Int[Tensor, " n_dist"] | None = None

    def __post_init__(self) -> None:
        _check_curve(self.distance, {"mean": self.mean, "std": self.std, "count": self.count})

    def normalised(self) -> DecayCurve:
        """A copy divided by its value at δ = 0."""
        if int(self.distance[0]) != 0:
            raise ValueError(f"{self.name!r} starts at distance {int(self.distance[0])}, not 0")
        v0 = float(self.mean[0])
        if v0 == 0.0:
            raise ValueError(f"{self.name!r} is 0 at distance 0 (e.g. a μ = 0 Gaussian): plot it raw")
        std = None if self.std is None else self.std / abs(v0)
        return replace(self, mean=self.mean / v0, std=std, name=f"{self.name} (÷ value at 0)")

    def save(self, path: str | os.PathLike) -> None:
        """Write JSON atomically."""
        _atomic_write_json(path, {"type": "DecayCurve", "format": _FORMAT, "name": self.name,
                                  "kind": self.kind, **_curve_json(self)})

    @classmethod
    def load(cls, path: str | os.PathLike) -> DecayCurve:
        """Read a result written by :meth:`save`."""
        d = _read_json(path, "DecayCurve")
        return cls(name=d["name"], kind=d["kind"], **_curve_from_json(d))

    def figure(self) -> go.Figure:
        """The curve over distance, with a ±2 SEM band when it is an estimate."""
        fig = go.Figure([*self._band(), self.line()])
        fig.update_layout(title=f"{self.name} [{self.kind}]", xaxis_title="distance δ = m − n (tokens)",
                          yaxis_title="mean logit q·k", showlegend=False)
        return fig

    def _repr_html_(self) -> str:
        head = f"<b>{self.name}</b> [{self.kind}], distances {int(self.distance[0])}…{int(self.distance[-1])}"
        if int((self.distance > 0).sum()) >= 4:
            v = decay_verdict(self)
            head += f": {v.verdict} (Spearman {v.spearman:.2f}, far/near {v.far_near_ratio:.2f})"
        return head + self.to_frame().head(8).to_html(index=False)


@dataclass(frozen=True)
class DecayVerdict:
    """Whether a by-distance curve decays, stays flat or grows, and the statistics behind it."""

    verdict: Literal["decays", "flat", "grows"]
    spearman: float  # rank correlation of mean with distance over δ ≥ 1 (NaN for a constant curve)
    near_mean: float  # mean over the nearest quarter of distances δ ≥ 1
    far_mean: float  # mean over the farthest quarter
    far_near_ratio: float  # far_mean / near_mean (NaN when near_mean is 0)
    noise: float  # |far − near| must exceed this: 2·(mean SEM near + mean SEM far); 0 if exact
    n_distances: int


def decay_verdict(curve: DecayCurve | PESimilarity, *, min_spearman: float = MIN_SPEARMAN) -> DecayVerdict:
    """Call a curve "decays", "flat" or "grows" from its rank trend and near-vs-far change.

    "decays": Spearman ρ(δ, mean) ≤ −min_spearman and far − near < −noise; "grows" mirrors it;
    otherwise "flat". δ = 0 is left out: it is the self-pair, special in every scheme. ``noise`` uses
    the mean SEM, not SEM/√n, because estimates at nearby δ share samples and are correlated.
    """
    keep = curve.distance > 0
    x, y = curve.distance[keep].double().numpy(), curve.mean[keep].double().numpy()
    if len(y) < 4:
        raise ValueError(f"need at least 4 distances δ ≥ 1 for a verdict, got {len(y)}: raise max_distance")
    ry = pd.Series(y).rank().to_numpy()  # average ranks for ties, as Spearman's ρ wants
    rho = float("nan") if ry.std() == 0 else float(np.corrcoef(pd.Series(x).rank(), ry)[0, 1])
    q = max(1, len(y) // 4)
    near, far = float(y[:q].mean()), float(y[-q:].mean())
    sem = curve.sem
    noise = 0.0 if sem is None else 2 * float(sem[keep][:q].mean() + sem[keep][-q:].mean())
    verdict: Literal["decays", "flat", "grows"] = "flat"
    if rho <= -min_spearman and far - near < -noise:
        verdict = "decays"
    elif rho >= min_spearman and far - near > noise:
        verdict = "grows"
    ratio = far / near if near != 0 else float("nan")
    return DecayVerdict(verdict, rho, near, far, ratio, noise, len(y))


# --------------------------------------------------------------------------------------------
# absolute position embeddings
# --------------------------------------------------------------------------------------------
def _check_embeddings(embeddings: Any) -> Float[Tensor, "n_pos d"]:
    if not isinstance(embeddings, (Tensor, np.ndarray)):
        raise TypeError(f"embeddings must be a torch.Tensor or numpy array, got {type(embeddings).__name__}")
    e = torch.as_tensor(embeddings).detach().cpu()
    if e.is_complex() or e.dtype == torch.bool:
        raise TypeError(f"embeddings must be real numbers, got dtype {e.dtype}")
    if e.ndim != 2 or e.shape[0] < 2 or e.shape[1] < 1:
        raise ValueError(
            f"embeddings must be a [n_pos, d] matrix with n_pos ≥ 2 and d ≥ 1, got shape {tuple(e.shape)}"
        )
    e = e.double()
    bad = (~torch.isfinite(e)).any(dim=1).nonzero().flatten()
    if bad.numel():
        raise ValueError(f"embeddings have NaN/inf in rows {bad[:10].tolist()}: clean them first")
    zero = (e.norm(dim=1) == 0).nonzero().flatten()
    if zero.numel():
        raise ValueError(f"rows {zero[:10].tolist()} are all zero, so cosine is undefined: drop them")
    return e


def pe_similarity(
    embeddings: Float[Tensor, "n_pos d"] | np.ndarray,
    *,
    name: str = "",
    max_distance: int | None = None,
    min_strength: float = MIN_PERIOD_STRENGTH,
) -> PESimilarity:
    """Cosine similarity of position rows, its mean/std/count by distance |m − n|, and its period."""
    e = _check_embeddings(embeddings)
    n = e.shape[0]
    max_distance = _max_distance(max_distance, n)
    u = e / e.norm(dim=1, keepdim=True)
    sim = u @ u.T
    diags = [sim.diagonal(-k) for k in range(max_distance + 1)]  # symmetric: one side covers |m − n|
    mean = torch.stack([t.mean() for t in diags])
    std = torch.stack([t.std(correction=0) for t in diags])
    period, strength, threshold = periodicity(mean, min_strength=min_strength)
    return PESimilarity(
        name=name, similarity=sim.float(), distance=torch.arange(max_distance + 1), mean=mean,
        std=std, count=torch.tensor([t.numel() for t in diags]), d_model=e.shape[1], period=period,
        period_strength=strength, period_threshold=threshold,
    )


def periodicity(
    curve: Float[Tensor, " n_dist"], *, min_strength: float = MIN_PERIOD_STRENGTH,
    false_alarm: float = PERIOD_FALSE_ALARM,
) -> tuple[float | None, float, float]:
    """Dominant period (tokens, or None), its strength in [0, 1], and the threshold it had to reach.

    The curve at distances 1, 2, … (δ = 0 is the self-pair spike) is detrended with a line; strength is
    the partial R² of one sinusoid added to that line, at the frequency that maximises it among those
    with ≥ 2 full cycles in the window (so a leftover trend cannot pass for a period) and period ≥ 2.
    The threshold is max(min_strength, the strength white noise of this length beats with probability
    ``false_alarm``): partial R² of one of ~n/2 independent frequencies, P(max ≥ g) ≈ (n/2)(1 − g)^((n−4)/2).
    Fewer than 8 distances past δ = 0 is too short to call: (None, 0.0, 1.0).
    """
    y = _vector(curve, "curve").numpy()[1:]
    if not np.isfinite(y).all():
        raise ValueError("curve has NaN or inf entries: compute it from finite embeddings")
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
        design = np.concatenate([trend, np.stack([np.cos(2 * np.pi * f * x), np.sin(2 * np.pi * f * x)], 1)], 1)
        r = y - design @ np.linalg.lstsq(design, y, rcond=None)[0]
        r2 = 1.0 - float(r @ r) / ss
        if r2 > best_r2:
            best_f, best_r2 = f, r2
    strength = float(min(1.0, max(0.0, best_r2)))
    return (1.0 / best_f if strength >= threshold else None), strength, threshold


def sinusoidal_pe(n_pos: int, d: int, base: float = 10000.0) -> Float[Tensor, "n_pos d"]:
    """Vaswani et al. embeddings: PE[m, 2i] = sin(m·ω_i), PE[m, 2i+1] = cos(m·ω_i), ω_i = base^(−2i/d)."""
    if not isinstance(n_pos, int) or n_pos < 1:
        raise ValueError(f"n_pos must be a positive int, got {n_pos!r}")
    if not isinstance(d, int) or d < 2 or d % 2:
        raise ValueError(f"d must be a positive even int (sin/cos come in pairs), got {d!r}")
    if not base > 1:
        raise ValueError(f"base must be > 1, got {base!r}")
    omega = float(base) ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)
    angle = torch.arange(n_pos, dtype=torch.float64)[:, None] * omega
    return torch.stack([angle.sin(), angle.cos()], dim=-1).flatten(1).float()


# Paths under the HF base model (GPT2Model, OPTModel, BertModel, ...) of learned position tables.
_PE_PATHS = ("wpe", "decoder.embed_positions", "embeddings.position_embeddings",
             "encoder.embed_positions", "embed_positions")


def learned_pe(model: Any) -> Float[Tensor, "n_pos d_model"]:
    """The learned absolute position-embedding matrix of a bridge or HF model (CPU float32 copy).

    GPT-2 / GPT-Neo ``wpe``; OPT (and Galactica) ``decoder.embed_positions`` without its 2 offset rows;
    BERT-like ``embeddings.position_embeddings`` (RoBERTa-like tables drop rows up to padding_idx).
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
        return weight.detach()[int(offset):].to("cpu", torch.float32).clone()
    label = model_label(model) if hasattr(model, "cfg") else type(hf).__name__
    if _has_rope(hf):
        raise ValueError(
            f"{label} has no learned position-embedding matrix: it uses rotary position embeddings. "
            "Use the RoPE geometry instead: rope_decay_constant / rope_gaussian_expectation / "
            "roformer_bound with rope_spec(model)[layer].inv_freq, or rope_decay_by_distance on "
            "captured queries and keys."
        )
    raise ValueError(
        f"{label} has no learned position table at any of {list(_PE_PATHS)} under its base model: "
        "pass the [n_pos, d] matrix to pe_similarity directly"
    )


def _has_rope(hf: Any) -> bool:
    cfg = hf.config.to_dict() if hasattr(hf, "config") else {}
    keys = ("rope_theta", "rope_parameters", "rope_scaling", "rotary_dim", "rotary_pct")
    return any(cfg.get(k) is not None for k in keys) or any("rotary" in type(m).__name__.lower() for m in hf.modules())

