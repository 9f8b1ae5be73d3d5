"""Curves over distance: the result type RoPE's decay and position-embedding similarity share.

A by-distance curve holds the mean (and, when it is an estimate, the std and count) of a quantity
at each distance δ = m − n ≥ 0 between a query at m and a key at n. :func:`decay_verdict` calls a
curve "decays", "flat" or "grows"; :func:`ropelens.plots.curves.overlay` draws several on one axis.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, replace
from typing import Any, Literal

import numpy as np
import pandas as pd
import torch
from jaxtyping import Float, Int
from torch import Tensor

from ropelens.errors import InputError
from ropelens.results.figures import figure_of
from ropelens.results.result import Result
from ropelens.validate import check_number

__all__ = [
    "MARGIN", "RECOVERY", "ByDistance", "CurveShape", "DecayCurve", "DecayVerdict", "at_distance",
    "check_curve", "decay_verdict", "describe_curve", "max_distance_arg", "vector",
]  # fmt: skip

MARGIN = (
    0.1  # a rise or fall counts when it exceeds this fraction of the curve's range (and the noise)
)
# a U (or a peak) must come back at least this fraction of its first leg: a fall followed by a
# small rise is a decay that levels off, not a U
RECOVERY = 0.5
Shape = Literal["flat", "decays", "grows", "U-shaped", "peaked", "oscillating"]
MIN_SPEARMAN = 0.3  # |ρ| for a monotone trend; default RoPE constant curves give ρ ≈ −0.6 … −0.8


def vector(x: Any, what: str, dtype: torch.dtype = torch.float64) -> Tensor:
    t = torch.as_tensor(x).detach().cpu()
    if t.ndim != 1:
        raise InputError(f"{what} must be 1-D, got shape {tuple(t.shape)}")
    return t.to(dtype)


def max_distance_arg(max_distance: int | None, n_pos: int) -> int:
    """Default (n_pos − 1) or validate the largest distance to average over."""
    if max_distance is None:
        return n_pos - 1
    if (
        not isinstance(max_distance, int)
        or isinstance(max_distance, bool)
        or not 0 <= max_distance < n_pos
    ):
        raise InputError(
            f"max_distance must be an int in [0, {n_pos - 1}] for {n_pos} positions, got "
            f"{max_distance!r}"
        )
    return max_distance


def check_curve(distance: Tensor, arrays: dict[str, Tensor | None]) -> None:
    if (
        not isinstance(distance, Tensor)
        or distance.ndim != 1
        or distance.numel() == 0
        or distance.is_floating_point()
    ):
        raise InputError(f"distance must be a non-empty 1-D integer tensor, got {distance!r}")
    if (distance < 0).any() or (distance.diff() <= 0).any():
        raise InputError("distance must be non-negative and strictly increasing")
    for name, t in arrays.items():
        if t is None:
            continue
        if not isinstance(t, Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if tuple(t.shape) != tuple(distance.shape):
            raise InputError(f"{name} has shape {tuple(t.shape)}, distance {tuple(distance.shape)}")
        if t.is_floating_point() and not torch.isfinite(t).all():
            raise InputError(f"{name} has NaN or inf entries: check the input vectors")
        if not t.is_floating_point() and (t < 1).any():
            raise InputError(f"{name} must be ≥ 1 at every distance, got {t.tolist()[:8]}…")


class ByDistance:
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

    def line(self, name: str | None = None) -> Any:
        """The by-distance mean as a plotly line trace (for overlays and subplots)."""
        return figure_of(ByDistance, "line")(self, name)


# json_options: compact, and a curve is finite (check_curve)
@dataclass(frozen=True)
class DecayCurve(ByDistance, Result, json_options={"indent": None, "allow_nan": False}):
    """A logit (or similarity) curve over distance δ = m − n; std and count when it is an
    estimate."""

    name: str
    kind: str  # "constant", "roformer_bound", "gaussian", "gaussian_mc", "measured", ...
    distance: Int[Tensor, " n_dist"]
    mean: Float[Tensor, " n_dist"]
    std: Float[Tensor, " n_dist"] | None = None
    count: Int[Tensor, " n_dist"] | None = None

    def __post_init__(self) -> None:
        check_curve(self.distance, {"mean": self.mean, "std": self.std, "count": self.count})

    def normalised(self) -> DecayCurve:
        """A copy divided by its value at δ = 0."""
        if int(self.distance[0]) != 0:
            raise InputError(f"{self.name!r} starts at distance {int(self.distance[0])}, not 0")
        v0 = float(self.mean[0])
        if v0 == 0.0:
            raise InputError(
                f"{self.name!r} is 0 at distance 0 (e.g. a μ = 0 Gaussian): plot it raw"
            )
        std = None if self.std is None else self.std / abs(v0)
        return replace(self, mean=self.mean / v0, std=std, name=f"{self.name} (÷ value at 0)")

    def _repr_html_(self) -> str:
        head = (
            f"<b>{self.name}</b> [{self.kind}], distances "
            f"{int(self.distance[0])}…{int(self.distance[-1])}"
        )
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


def decay_verdict(curve: ByDistance, *, min_spearman: float = MIN_SPEARMAN) -> DecayVerdict:
    """Call a curve "decays", "flat" or "grows" from its rank trend and near-vs-far change.

    "decays": Spearman ρ(δ, mean) ≤ −min_spearman and far − near < −noise; "grows" mirrors it;
    otherwise "flat". δ = 0 is left out: it is the self-pair, special in every scheme. ``noise``
    uses the mean SEM, not SEM/√n, because estimates at nearby δ share samples and are correlated.
    """
    keep = curve.distance > 0
    x, y = curve.distance[keep].double().numpy(), curve.mean[keep].double().numpy()
    if len(y) < 4:
        raise InputError(
            f"need at least 4 distances δ ≥ 1 for a verdict, got {len(y)}: raise max_distance"
        )
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


# ========================================================================== the curve-shape verdict
@dataclass(frozen=True)
class CurveShape:
    """What a curve over distance does, with the numbers behind the sentence in :attr:`text`.

    A *leg* is a run between two turning points that moves by more than :attr:`threshold`
    (``margin`` × the curve's range, and at least the noise); smaller wiggles are ignored. One leg
    is a monotone curve, two legs a U (fall then rise) or a peak (rise then fall), three or more
    an oscillation.
    """

    shape: Shape
    text: str
    start: float
    end: float
    start_at: float
    end_at: float
    min_value: float
    min_at: float
    max_value: float
    max_at: float
    range: float
    threshold: float
    turns: tuple[float, ...] = ()  # distances of the interior turning points
    swings: tuple[float, ...] = ()  # |change| of every leg, in order
    upper: tuple[float, float] | None = None  # oscillating: first and last maximum between turns
    lower: tuple[float, float] | None = None  # oscillating: first and last minimum between turns
    midline: tuple[float, float] | None = (
        None  # oscillating: mean of the first and of the last two pivots
    )

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _fmt(x: float) -> str:
    if x == 0 or not math.isfinite(x):
        return f"{x:g}"
    a = abs(x)
    if a >= 1000 or a < 0.01:
        return f"{x:.3g}"
    return f"{x:.3f}" if a < 1 else f"{x:.2f}"


def at_distance(x: float) -> str:
    return f"δ = {x:g}" if float(x).is_integer() else f"δ ≈ {x:.0f}" if x >= 10 else f"δ ≈ {x:.1f}"


def _pivots(v: np.ndarray, h: float) -> list[int]:
    """Turning points that bound moves larger than ``h`` (a zigzag with hysteresis), first and last
    included."""
    hi = lo = 0
    direction = 0
    ext = 0
    pivots: list[int] = []
    for i in range(1, len(v)):
        if direction == 0:
            hi = i if v[i] > v[hi] else hi
            lo = i if v[i] < v[lo] else lo
            if v[hi] - v[lo] > h:
                if lo < hi:
                    pivots.append(lo)
                    direction, ext = 1, hi
                else:
                    pivots.append(hi)
                    direction, ext = -1, lo
        elif direction > 0:
            if v[i] > v[ext]:
                ext = i
            elif v[ext] - v[i] > h:
                pivots.append(ext)
                direction, ext = -1, i
        else:
            if v[i] < v[ext]:
                ext = i
            elif v[i] - v[ext] > h:
                pivots.append(ext)
                direction, ext = 1, i
    if direction != 0:
        pivots.append(ext)
    return pivots


def describe_curve(
    values: Any,
    distances: Any,
    *,
    margin: float = MARGIN,
    noise: Any = None,
    scale: float | None = None,
    log: bool = False,
    atol: float = 1e-9,
    recovery: float = RECOVERY,
) -> CurveShape:
    """The shape of a curve over distance, described as it is.

    - **flat**: its range is within ``margin`` × ``scale`` (default: its largest |value|), or below
      ``atol`` or the noise;
    - **decays** / **grows**: one leg (wiggles smaller than the threshold ignored);
    - **U-shaped**: falls, then rises again by more than the threshold and by at least
      ``recovery`` × the fall (default :data:`RECOVERY`, half); its minimum is named;
    - **peaked**: rises, then falls by at least ``recovery`` × the rise;
    - a fall followed by a smaller rise than that reads **decays** (a rise, then a smaller fall,
      **grows**), and the sentence gives the second leg as a share of the first;
    - **oscillating**: three or more legs; the sentence gives the number of turns, the swings
      (first, last, median) and the midline the curve oscillates around, from its start to its end,
      and the envelope (first and last maximum and minimum).

    The threshold a leg must exceed is ``margin`` × the curve's range, and at least twice the mean
    of ``noise`` (a standard error per point, or one number) when given. With ``log`` the shape is
    read from log10 of the (positive) values — for probabilities, which span orders of magnitude —
    so a leg must change the value by a factor, and flat means max ÷ min ≤ 1 + ``margin``; the
    sentence still quotes the values. NaN points are dropped. Unlike a rank-trend verdict, an
    oscillating curve is never called flat or monotone.
    """
    margin = check_number(
        margin, "margin", above=0, at_most=1, hint=" (a fraction of the curve's range)"
    )
    recovery = check_number(
        recovery, "recovery", at_least=0, at_most=1, hint=" (a fraction of the first leg)"
    )
    raw, positions, noise_level = _curve_points(values, distances, noise, log)
    curve = _Curve.of(raw, positions, margin, noise_level, log)
    flat = _flat_shape(curve, margin, noise_level, scale, atol)
    if flat is not None:
        return flat
    pivots = _pivots(curve.shape_values, curve.threshold)
    swings = tuple(
        float(abs(curve.shape_values[end] - curve.shape_values[start]))
        for start, end in zip(pivots, pivots[1:])
    )
    turns = tuple(float(positions[i]) for i in pivots[1:-1])
    n_legs = len(pivots) - 1
    rule = f"threshold {margin:.0%} of the {'log-' if log else ''}range"
    if n_legs <= 1:
        return _monotone_shape(curve, pivots, turns, swings)
    if n_legs == 2:
        return _one_turn_shape(curve, pivots, turns, swings, rule, recovery)
    return _oscillating_shape(curve, pivots, turns, swings)


def _curve_points(
    values: Any, distances: Any, noise: Any, log: bool
) -> tuple[np.ndarray, np.ndarray, float]:
    """The finite points (values, distances), checked, and the noise level (twice its mean)."""
    raw = torch.as_tensor(values, dtype=torch.float64).detach().cpu().flatten().numpy()
    positions = torch.as_tensor(distances, dtype=torch.float64).detach().cpu().flatten().numpy()
    if raw.shape != positions.shape:
        raise InputError(
            f"values ({raw.size}) and distances ({positions.size}) must have the same length"
        )
    noise_per_point = None
    if noise is not None:
        noise_per_point = np.broadcast_to(
            torch.as_tensor(noise, dtype=torch.float64).detach().cpu().numpy(), raw.shape
        )
    keep = np.isfinite(raw) & np.isfinite(positions)
    raw, positions = raw[keep], positions[keep]
    if raw.size < 3:
        raise InputError(f"need at least 3 finite points to describe a curve, got {raw.size}")
    if np.any(np.diff(positions) <= 0):
        raise InputError("distances must increase strictly")
    if log and np.any(raw <= 0):
        raise InputError(
            "log=True needs positive values (probabilities, norms): drop log for signed curves"
        )
    noise_level = 0.0
    if noise_per_point is not None:
        # in log10 units, a standard error σ of a value v is σ / (v ln 10)
        kept_noise = noise_per_point[keep] / raw / math.log(10) if log else noise_per_point[keep]
        noise_level = 2 * float(np.nanmean(np.abs(kept_noise)))
    return raw, positions, noise_level


@dataclass(frozen=True)
class _Curve:
    """A curve being described: its values, the values its shape is read from, and its numbers."""

    raw: np.ndarray
    positions: np.ndarray
    shape_values: np.ndarray  # log10 of the values with ``log``, else the values
    log: bool
    value_range: float  # of ``shape_values``
    threshold: float
    numbers: dict[str, float]  # the CurveShape fields every shape shares

    @classmethod
    def of(
        cls, raw: np.ndarray, positions: np.ndarray, margin: float, noise_level: float, log: bool
    ) -> _Curve:
        """The curve with its threshold (``margin`` × range, at least ``noise_level``)."""
        shape_values = np.log10(raw) if log else raw
        value_range = float(shape_values.max()) - float(shape_values.min())
        threshold = max(margin * value_range, noise_level)
        index_min, index_max = int(shape_values.argmin()), int(shape_values.argmax())
        numbers = dict(
            start=float(raw[0]),
            end=float(raw[-1]),
            start_at=float(positions[0]),
            end_at=float(positions[-1]),
            min_value=float(raw[index_min]),
            min_at=float(positions[index_min]),
            max_value=float(raw[index_max]),
            max_at=float(positions[index_max]),
            range=float(raw[index_max] - raw[index_min]),
            threshold=threshold,
        )
        return cls(raw, positions, shape_values, log, value_range, threshold, numbers)

    def point(self, i: int) -> str:
        """The value at point ``i`` and its distance, as a sentence quotes them."""
        return f"{_fmt(self.raw[i])} at {at_distance(self.positions[i])}"

    def swing(self, change: float) -> str:
        """A change of the shape values: a factor with ``log``, else a difference."""
        return f"×{10**change:.2f}" if self.log else _fmt(change)


def _flat_shape(
    curve: _Curve, margin: float, noise_level: float, scale: float | None, atol: float
) -> CurveShape | None:
    """The flat description, or None when the curve's range exceeds what flat allows."""
    raw, value_range = curve.raw, curve.value_range
    index_min, index_max = int(curve.shape_values.argmin()), int(curve.shape_values.argmax())
    if curve.log:
        flat = value_range <= max(math.log10(1 + margin), noise_level)
    else:
        largest = float(np.abs(curve.shape_values).max()) if scale is None else abs(float(scale))
        flat = value_range <= max(atol, margin * largest, noise_level)
    if not flat:
        return None
    low = raw[index_min] if curve.log else float(curve.shape_values.min())
    span = f"from {at_distance(curve.positions[0])} to {at_distance(curve.positions[-1])}"
    text = (
        f"flat: stays within {_fmt(low)} … {_fmt(raw[index_max])} "
        f"(mean {_fmt(float(raw.mean()))}) {span}"
    )
    if curve.log:
        text += f", max ÷ min {raw[index_max] / raw[index_min]:.2f}"
    elif value_range > atol and largest > 0:
        text += f", a range of {value_range / largest:.0%} of its largest magnitude"
    return CurveShape("flat", text, **curve.numbers)


def _monotone_shape(
    curve: _Curve, pivots: list[int], turns: tuple[float, ...], swings: tuple[float, ...]
) -> CurveShape:
    """One leg (or none above the threshold): decays or grows."""
    n_points = len(curve.shape_values)
    start, end = (pivots[0], pivots[-1]) if len(pivots) == 2 else (0, n_points - 1)
    shape: Shape = "decays" if curve.shape_values[end] < curve.shape_values[start] else "grows"
    verb = "falls" if shape == "decays" else "rises"
    text = f"monotone, {shape}: {verb} from {curve.point(start)} to {curve.point(end)}"
    if curve.raw[start] > 0 and curve.raw[end] > 0:
        ratio = curve.raw[end] / curve.raw[start]
        text += f" ({_fmt(ratio)}× its value at {at_distance(curve.positions[start])})"
    if end < n_points - 1:
        text += f", then changes by less than the threshold to {curve.point(n_points - 1)}"
    return CurveShape(shape, text, turns=turns, swings=swings, **curve.numbers)


def _one_turn_shape(
    curve: _Curve,
    pivots: list[int],
    turns: tuple[float, ...],
    swings: tuple[float, ...],
    rule: str,
    recovery: float,
) -> CurveShape:
    """Two legs: U-shaped (falls, then rises back at least ``recovery`` of the fall) or peaked
    (rises, then falls back as much); a smaller second leg leaves the curve monotone."""
    start, turn, end = pivots
    back = swings[1] / swings[0]
    falls = curve.shape_values[turn] < curve.shape_values[start]
    if back < recovery:
        shape: Shape = "decays" if falls else "grows"
        first, second, extremum, needs = (
            ("falls", "rises", "minimum", "a U-shape")
            if falls
            else ("rises", "falls", "maximum", "a peak")
        )
        text = (
            f"monotone, {shape}: {first} from {curve.point(start)} to its {extremum} "
            f"{curve.point(turn)}, then {second} back only {back:.0%} of the "
            f"{'log-' if curve.log else ''}{'fall' if falls else 'rise'} to "
            f"{curve.point(end)} ({needs} needs {recovery:.0%})"
        )
        return CurveShape(shape, text, turns=turns, swings=swings, **curve.numbers)
    if falls:
        text = (
            f"U-shaped: falls from {curve.point(start)} to its minimum {curve.point(turn)}, "
            f"then rises again to {curve.point(end)} (the rise is {back:.0%} of the fall, "
            f"at least the {recovery:.0%} a U-shape needs, and "
            f"{swings[1] / curve.value_range:.0%} of the "
            f"{'log-' if curve.log else ''}range; {rule})"
        )
        return CurveShape("U-shaped", text, turns=turns, swings=swings, **curve.numbers)
    text = (
        f"peaked: rises from {curve.point(start)} to its maximum {curve.point(turn)}, then "
        f"falls to {curve.point(end)} (the fall is {back:.0%} of the rise, at least the "
        f"{recovery:.0%} a peak needs; {rule})"
    )
    return CurveShape("peaked", text, turns=turns, swings=swings, **curve.numbers)


def _oscillating_shape(
    curve: _Curve, pivots: list[int], turns: tuple[float, ...], swings: tuple[float, ...]
) -> CurveShape:
    """Three or more legs: turns, swings, the midline and the envelope."""
    raw, shape_values = curve.raw, curve.shape_values
    # pivots alternate between maxima and minima; the first one only starts the first leg
    is_max = [
        bool(shape_values[p] > shape_values[pivots[j - 1]]) for j, p in enumerate(pivots) if j > 0
    ]
    maxima = [p for p, m in zip(pivots[1:], is_max) if m]
    minima = [p for p, m in zip(pivots[1:], is_max) if not m]
    upper = (float(raw[maxima[0]]), float(raw[maxima[-1]])) if maxima else None
    lower = (float(raw[minima[0]]), float(raw[minima[-1]])) if minima else None

    def mean_of(indices: list[int]) -> float:
        mean = shape_values[indices].mean()
        return float(10**mean) if curve.log else float(mean)

    midline = (mean_of(pivots[:2]), mean_of(pivots[-2:]))
    first_mean, last_mean = shape_values[pivots[:2]].mean(), shape_values[pivots[-2:]].mean()
    threshold = curve.threshold
    if last_mean < first_mean - threshold:
        trend = "falls"
    elif last_mean > first_mean + threshold:
        trend = "rises"
    else:
        trend = "stays level"
    text = (
        f"oscillating: {len(turns)} turns between {at_distance(turns[0])} and "
        f"{at_distance(turns[-1])} (starting from {curve.point(pivots[0])}); "
        f"swings from {curve.swing(swings[0])} to {curve.swing(swings[-1])} "
        f"(median {curve.swing(float(np.median(swings)))}) around "
        f"a midline that {trend} from {_fmt(midline[0])} to {_fmt(midline[1])}"
    )
    if upper and lower:
        text += (
            f"; envelope: maxima {_fmt(upper[0])} → {_fmt(upper[1])}, "
            f"minima {_fmt(lower[0])} → {_fmt(lower[1])}"
        )
    return CurveShape(
        "oscillating",
        text,
        turns=turns,
        swings=swings,
        upper=upper,
        lower=lower,
        midline=midline,
        **curve.numbers,
    )
