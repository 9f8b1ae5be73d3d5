"""The rotation a model's attention actually applies, measured from its own forward.

A short forward taps every ``apply_rotary*`` function of the model's modeling module and keeps, per
attention layer, the first tensor the layer hands its rotation and what comes back. From that pair
alone (no buffer, no table, no config) :func:`measure_rotation` reads what the rotation does: which
dims it pairs into planes, the angle it turns each plane by at each position, and the factor it
multiplies the norm by. Frequencies then follow from the angle at position 1, refined along the
probe's positions; a rotation that is not "plane i turns by m·θ_i, norm times one constant" is
described as observed (mixing across planes, angles not proportional to position, a scale that
changes with position) instead of read.

The fit reads θ to the precision of a float32 rotation of O(1) values (~1e-6 relative at the lowest
frequencies). Where the rotation is handed ``cos`` and ``sin`` tables, θ is read from them instead
(:func:`table_frequencies`, exact to float32), once the fitted rotation is shown to turn every plane
by those tables' angles at every position of the probe (:func:`proven_table_frequencies`).

This is what lets ropelens read a family whose release moves its sin/cos tables (GPT-J and CodeGen
keep theirs on a model-level module since transformers 5.24) without knowing where they went.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import inspect
import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

from ropelens.spec.forward_taps import attention_tap, layer_taps, probe_forward

__all__ = [
    "ObservedRotation",
    "measure_query_factors",
    "measure_rotation",
    "observe_rotations",
    "proven_table_frequencies",
    "table_frequencies",
]

# positions 0..6: odd, so the position axis is rarely confused with a head axis of the same size
PROBE_TOKENS = 7
_FIT_TOL = (
    1e-4  # float32 rotation of O(1) values fits to ~1e-6; a wrong pairing or a mixing is O(1) off
)
# radians a fitted angle may differ from m·θ of the tables the rotation was handed: a float32
# rotation of O(1) values fits each angle to ~3e-7 rad; θ misread by δ is m·δ off at position m
_TABLE_TOL = 1e-5


@dataclass(frozen=True)
class ObservedRotation:
    """What one layer's rotation did to the tensor it received, on positions 0..n−1."""

    width: int  # dims the rotation received (the rotary slice: rotary_dim)
    pairing: str | None  # "half" or "adjacent"; None where neither pairing fits
    angles: Tensor  # [pos, plane] radians each plane turned by at each position, in (−π, π]
    scale: Tensor  # [pos] norm ratio |out| / |in| per position
    fit_error: (
        float  # relative max error of "rotate each plane, times scale[pos]" against the output
    )
    # θ_i read from the cos/sin tables the rotation was handed, where the fit proved them applied
    table_inv_freq: Tensor | None = None

    @property
    def inv_freq(self) -> Tensor:
        """θ_i: from the rotation's own tables where they were proven applied, else as fitted."""
        return self.table_inv_freq if self.table_inv_freq is not None else self.fitted_inv_freq

    @functools.cached_property
    def fitted_inv_freq(self) -> Tensor:
        """θ_i from the angle at position 1, refined along later positions by unwrapping
        (float64)."""
        a = self.angles
        theta = a[1].clone()
        for p in range(2, a.shape[0]):
            turns = torch.round((p * theta - a[p]) / (2 * math.pi))
            theta = (a[p] + 2 * math.pi * turns) / p
        return theta.abs()

    @property
    def direction(self) -> int:
        """+1 where position 1 turns the planes forward (Llama's rotate_half), −1 where backward."""
        th = self.angles[1]
        return -1 if float(th[th.abs() > 1e-9].sum()) < 0 else 1

    @property
    def linear_error(self) -> float:
        """Largest gap (radians) between each plane's angle at position m and m·θ_i: 0 for RoPE."""
        m = torch.arange(self.angles.shape[0], dtype=torch.float64).unsqueeze(-1)
        gap = self.angles - self.direction * m * self.inv_freq
        return float(torch.atan2(gap.sin(), gap.cos()).abs().max())

    @property
    def scale_spread(self) -> float:
        """Relative spread of the norm ratio over positions: 0 when one constant multiplies every
        position."""
        s = self.scale[~self.scale.isnan()]
        return (
            float((s.max() - s.min()) / s.abs().max().clamp_min(1e-30)) if s.numel() else math.inf
        )

    def differs(self) -> str | None:
        """What makes this rotation not RoPE, as observed, or None where it is RoPE with one
        constant scaling."""
        if self.pairing is None:
            return (
                f"its rotation of a {self.width}-dim slice turns no pairing of dims as planes "
                f"(half-split and adjacent pairs both off by {self.fit_error:.2g} relative): it "
                "mixes dims across planes"
            )
        if self.scale_spread > _FIT_TOL:
            s = self.scale[~self.scale.isnan()].tolist()
            return (
                "its rotation multiplies the norm by a factor that changes with position "
                f"({s[0]:.6g} at position 0, {s[-1]:.6g} at position {len(s) - 1})"
            )
        if self.linear_error > 1e-3:
            return (
                "its rotation turns the planes by angles not proportional to position (off m·θ "
                f"by up to {self.linear_error:.2g} rad over positions "
                f"0..{self.angles.shape[0] - 1})"
            )
        return None


def _planes(x: Tensor, pairing: str) -> tuple[Tensor, Tensor]:
    h = x.shape[-1] // 2
    return (x[..., :h], x[..., h:]) if pairing == "half" else (x[..., 0::2], x[..., 1::2])


def _fit(x: Tensor, y: Tensor, pairing: str) -> tuple[Tensor, Tensor, float]:
    """Per-position, per-plane angle and per-position scale that best take ``x`` to ``y`` ([pos, n,
    d], float64)."""
    xa, xb = _planes(x, pairing)
    ya, yb = _planes(y, pairing)
    norm = torch.hypot(xa, xb)
    # a consensus angle per (position, plane), weighted by each vector's norm in the plane
    cross, dot = xa * yb - xb * ya, xa * ya + xb * yb
    angles = torch.atan2(cross.sum(1), dot.sum(1))  # [pos, plane]
    total = norm.sum((1, 2))
    # a position whose input is zero (a padding token's zero embedding) shows no rotation: its scale
    # is undefined
    scale = torch.where(
        total > 0, torch.hypot(ya, yb).sum((1, 2)) / total.clamp_min(1e-300), torch.nan
    )  # [pos]
    c, s = angles.cos().unsqueeze(1), angles.sin().unsqueeze(1)
    k = scale.nan_to_num(0.0).view(-1, 1, 1)
    pa, pb = k * (xa * c - xb * s), k * (xa * s + xb * c)
    err = float(
        torch.maximum((pa - ya).abs().max(), (pb - yb).abs().max()) / y.abs().max().clamp_min(1e-30)
    )
    return angles, scale, err


def measure_rotation(x: Tensor, y: Tensor, pos_axis: int) -> ObservedRotation:
    """What the rotation that took ``x`` to ``y`` (same shape, positions 0..n−1 along ``pos_axis``,
    the rotated dims last) did: the pairing that fits it best, each plane's angle per position, the
    norm ratio per position."""
    if x.shape != y.shape or x.shape[-1] % 2:
        raise ValueError(
            f"a rotation's input and output must have one even-width shape, got {tuple(x.shape)} "
            f"and {tuple(y.shape)}"
        )
    d = x.shape[-1]
    xs = x.detach().double().movedim(pos_axis, 0).reshape(x.shape[pos_axis], -1, d)
    ys = y.detach().double().movedim(pos_axis, 0).reshape(x.shape[pos_axis], -1, d)
    fits = {p: _fit(xs, ys, p) for p in ("half", "adjacent")}
    best = min(fits, key=lambda p: fits[p][2])
    angles, scale, err = fits[best]
    return ObservedRotation(
        width=d,
        pairing=best if err <= _FIT_TOL else None,
        angles=angles,
        scale=scale,
        fit_error=err,
    )


def table_frequencies(cos: Tensor, sin: Tensor, pairing: str, n_planes: int) -> Tensor | None:
    """θ_i (float64) from the ``cos`` and ``sin`` tables a rotation was handed: the angle of row 1.

    Rows (the second-to-last axis) are positions 0..n−1; columns one per plane (GPT-J's ``sin``,
    ``cos``) or one per rotated dim, each plane's twice as ``pairing`` lays them out (Llama's
    ``cat(freqs, freqs)``). A table scaled by an attention factor has the same angles. None where
    the tables have another layout.
    """
    if cos.shape != sin.shape or cos.ndim < 2 or cos.shape[-2] < 2 or cos.is_complex():
        return None
    cos_rows = cos.detach().double().cpu().reshape(-1, *cos.shape[-2:])[0]  # [pos, column]
    sin_rows = sin.detach().double().cpu().reshape(-1, *sin.shape[-2:])[0]
    if cos_rows.shape[-1] == 2 * n_planes:
        first, second = _planes(torch.stack([cos_rows, sin_rows]), pairing)
        if not torch.equal(first, second):
            return None
        cos_rows, sin_rows = first[0], first[1]
    elif cos_rows.shape[-1] != n_planes:
        return None
    return torch.atan2(sin_rows[1], cos_rows[1]).abs()


def proven_table_frequencies(observed: ObservedRotation, cos: Tensor, sin: Tensor) -> Tensor | None:
    """θ_i of the tables the rotation was handed, where the fitted rotation turns every plane by
    m·θ_i (within :data:`_TABLE_TOL` radians) at every position m of the probe; else None."""
    if observed.pairing is None:
        return None
    theta = table_frequencies(cos, sin, observed.pairing, observed.width // 2)
    if theta is None or cos.shape[-2] != observed.angles.shape[0]:
        return None
    positions = torch.arange(observed.angles.shape[0], dtype=torch.float64).unsqueeze(-1)
    gap = observed.angles - observed.direction * positions * theta
    wrapped = torch.atan2(gap.sin(), gap.cos())
    return theta if float(wrapped.abs().max()) <= _TABLE_TOL else None


def _handed_tables(
    parameters: list[str], args: tuple, kwargs: dict
) -> tuple[Tensor, Tensor] | None:
    """The (cos, sin) a rotation function was called with, where its parameters name them so."""
    named = dict(zip(parameters, args, strict=False)) | kwargs
    cos, sin = named.get("cos"), named.get("sin")
    if isinstance(cos, Tensor) and isinstance(sin, Tensor):
        return cos.detach().float().cpu(), sin.detach().float().cpu()
    return None


def _parameter_names(fn: Callable) -> list[str]:
    try:
        return list(inspect.signature(fn).parameters)
    except (TypeError, ValueError):  # a builtin without a signature hands no named tables
        return []


def _rotation_names(mod) -> list[str]:
    return [n for n, f in vars(mod).items() if n.startswith("apply_rotary") and callable(f)]


def observe_rotations(
    model, attns: list[torch.nn.Module | None], view: torch.nn.Module, device: torch.device
) -> dict[int, ObservedRotation] | None:
    """Layer → what its attention's first rotation call did, in one forward of ``view`` (the HF
    module tree) on :data:`PROBE_TOKENS` tokens; None where the forward cannot run. Layers whose
    attention calls no ``apply_rotary*`` function of the modeling module are absent. Cached on
    ``model``."""
    mod = importlib.import_module(type(view).__module__)
    names = _rotation_names(mod)
    key = (tuple(id(getattr(mod, n)) for n in names), len(attns))
    cached = getattr(model, "_ropelens_observed_rotations", None)
    if cached is not None and cached[0] == key:
        return cached[1]
    current: list = [None]
    depth = [0]
    seen: dict[int, tuple[Tensor, Tensor, tuple[Tensor, Tensor] | None]] = {}

    def tapped(fn: Callable) -> Callable:
        parameters = _parameter_names(fn)

        def call(*args, **kwargs):
            depth[0] += 1
            try:
                out = fn(*args, **kwargs)
            finally:
                depth[0] -= 1
            layer = current[0]
            x = args[0] if args else next(iter(kwargs.values()), None)
            y = out[0] if isinstance(out, tuple) else out
            if (
                layer is not None
                and depth[0] == 0
                and layer not in seen
                and isinstance(x, Tensor)
                and isinstance(y, Tensor)
                and x.shape == y.shape
                and not x.is_complex()
            ):
                tables = _handed_tables(parameters, args, kwargs)
                seen[layer] = (x.detach().float().cpu(), y.detach().float().cpu(), tables)
            return out

        return call

    with layer_taps(
        view, attns, current, mod, {n: tapped(getattr(mod, n)) for n in names}
    ) as tapping:
        if not tapping or not probe_forward(view, device, PROBE_TOKENS):
            return None
    result = {}
    for layer, (x, y, tables) in seen.items():
        # positions on axis 1 ([batch, pos, head, d]: GPT-J) or 2 ([batch, head, pos, d]); where
        # heads are as many as the probe's tokens, both are measured and the reading that is RoPE
        # (else fits best) is kept
        fits = [
            measure_rotation(x, y, a) for a in (1, 2) if x.ndim == 4 and x.shape[a] == PROBE_TOKENS
        ]
        if fits:
            best = min(fits, key=lambda o: (o.differs() is not None, o.fit_error))
            proven = proven_table_frequencies(best, *tables) if tables is not None else None
            result[layer] = (
                dataclasses.replace(best, table_inv_freq=proven) if proven is not None else best
            )
    object.__setattr__(model, "_ropelens_observed_rotations", (key, result))
    return result


def measure_query_factors(
    attns: list[torch.nn.Module | None],
    view: torch.nn.Module,
    device: torch.device,
    positions: list[int],
) -> dict[int, Tensor | None] | None:
    """Layer → the factor each position's rotated query is multiplied by before the score,
    ``[len(positions)]``, in one forward of ``view`` (the HF module tree) at ``positions``
    (increasing position ids): the query its attention function receives divided by the output of
    its first ``apply_rotary*`` call (for multi-head latent attention, the query's trailing rotary
    dims). None for a layer where that query is not one factor per position times the rotated one;
    None overall where the forward cannot run. Layers that call no rotation are absent."""
    mod = importlib.import_module(type(view).__module__)
    current: list = [None]
    rotated: dict[int, Tensor] = {}
    scored: dict[int, Tensor] = {}

    def tapped(fn: Callable) -> Callable:
        def call(*args, **kwargs):
            out = fn(*args, **kwargs)
            layer = current[0]
            y = out[0] if isinstance(out, tuple) else out
            if (
                layer is not None
                and layer not in rotated
                and isinstance(y, Tensor)
                and not y.is_complex()
            ):
                rotated[layer] = y.detach().double().cpu()
            return out

        return call

    def score(_module, query: Tensor, _key: Tensor) -> None:
        if current[0] in rotated and current[0] not in scored:
            scored[current[0]] = query.detach().double().cpu()

    kinds = {type(a) for a in attns if a is not None}
    mods = [m for m in view.modules() if type(m) in kinds]
    patches = {n: tapped(getattr(mod, n)) for n in _rotation_names(mod)}
    with layer_taps(view, attns, current, mod, patches) as tapping:
        if not tapping or not probe_forward(
            view, device, len(positions), attention_tap(mods, score), positions
        ):
            return None
    out: dict[int, Tensor | None] = {}
    for layer, y in rotated.items():
        q = scored.get(layer)
        out[layer] = None
        if (
            q is None
            or q.ndim != 4
            or y.ndim != 4
            or q.shape[:3] != y.shape[:3]
            or q.shape[-1] < y.shape[-1]
        ):
            continue
        q = q[
            ..., q.shape[-1] - y.shape[-1] :
        ]  # [batch, head, pos, d]; MLA's rotary dims come last
        f = (q * y).sum((0, 1, 3)) / (y * y).sum((0, 1, 3)).clamp_min(1e-300)
        if float((q - f[None, None, :, None] * y).abs().max()) <= _FIT_TOL * float(
            q.abs().max().clamp_min(1e-30)
        ):
            out[layer] = f
    return out
