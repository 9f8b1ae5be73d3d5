"""The look every ropelens page gives its figures: white template, system font, compact margins."""

from __future__ import annotations

import math

import numpy as np
import plotly.graph_objects as go

from ropelens.spec.bands import Bands

__all__ = [
    "FONT",
    "bands_in_words",
    "category_layers",
    "hline_log",
    "log_tick_label",
    "log_ticks",
    "readable_log_axes",
    "style_figure",
]

# System fonts only: the report must look right offline, with nothing fetched.
FONT = (
    '-apple-system, BlinkMacSystemFont, "Segoe UI", "Helvetica Neue", Helvetica, Arial, "Noto '
    'Sans", sans-serif'
)


def style_figure(fig: go.Figure, *, height: int | None = None) -> go.Figure:
    """The report's look for a figure: white template, system font, compact margins."""
    fig.update_layout(
        template="plotly_white",
        font={"family": FONT, "size": 12, "color": "#1f2430"},
        # the title starts where the plot does, not at the figure's edge
        title={"font": {"size": 14}, "x": 0.0, "xanchor": "left", "xref": "paper"},
        margin={"t": 60, "l": 60, "r": 20, "b": 50},
    )
    if height is not None:
        fig.update_layout(height=height)
    return readable_log_axes(fig)


_SUPERSCRIPT = str.maketrans("-0123456789", "⁻⁰¹²³⁴⁵⁶⁷⁸⁹")


def log_tick_label(value: float) -> str:
    """A log axis's tick label that carries its decade: ``0.02``, ``200``, ``10⁻⁴``, ``2×10⁵``
    (never a bare ``2`` for 200, nor an SI prefix such as ``100μ`` for a probability)."""
    k = math.floor(math.log10(value) + 1e-9)
    mantissa = round(value / 10**k, 6)
    if mantissa >= 10:  # 9.9999999 rounded up
        mantissa, k = mantissa / 10, k + 1
    if -3 <= k <= 4:
        return f"{value:.{max(0, -k)}f}" if k < 0 else f"{round(value):d}"
    power = "10" + str(k).translate(_SUPERSCRIPT)
    return power if mantissa == 1 else f"{mantissa:g}×{power}"


def log_ticks(lo: float, hi: float) -> tuple[list[float], list[float]]:
    """Labelled and unlabelled ticks of a log axis over [lo, hi] (both > 0): decades (every n-th
    where there are many) with 2…9 between them over two decades or more; 1, 2, 5 times a power of
    ten over one to two; 1…9 times one below that. Empty where fewer than two would be labelled."""
    a, b = math.log10(lo), math.log10(hi)
    first, last = math.floor(a + 1e-9), math.ceil(b - 1e-9)
    span = b - a

    def inside(v: float) -> bool:
        return lo * (1 - 1e-9) <= v <= hi * (1 + 1e-9)

    if span >= 2:
        step = max(1, math.ceil((last - first) / 8))
        major = [10.0**k for k in range(first, last + 1) if k % step == 0]
        minor = (
            [m * 10.0**k for k in range(first, last + 1) for m in range(2, 10)] if step == 1 else []
        )
    else:
        mantissas = (1, 2, 5) if span >= 1 else range(1, 10)
        major = [m * 10.0**k for k in range(first, last + 1) for m in mantissas]
        minor = []
    major = [v for v in major if inside(v)]
    if len(major) < 2:
        return [], []
    return major, [v for v in minor if inside(v) and v not in major]


def _axis_span(fig: go.Figure, name: str, axis) -> tuple[float, float] | None:
    """The smallest and largest positive value drawn on log axis ``name`` (``xaxis2``): its set
    range, else the values of the traces on it; None where there are none."""
    if axis.range is not None and None not in axis.range:
        lo, hi = sorted(10.0 ** np.asarray(axis.range, dtype=float))
        return float(lo), float(hi)
    dim, ref = name[0], name[0] + name[len("xaxis") :]
    values = []
    for trace in fig.data:
        if (getattr(trace, f"{dim}axis", None) or dim) != ref or trace[dim] is None:
            continue
        try:
            v = np.asarray(trace[dim], dtype=float).ravel()
        except (TypeError, ValueError):  # categories, dates
            continue
        values.append(v[np.isfinite(v) & (v > 0)])
    drawn = np.concatenate(values) if values else np.empty(0)
    return (float(drawn.min()), float(drawn.max())) if drawn.size else None


def readable_log_axes(fig: go.Figure) -> go.Figure:
    """Every log axis of ``fig`` gets ticks that carry their decade (:func:`log_ticks`, labelled by
    :func:`log_tick_label`; ticks the figure chose itself keep their places and get those labels;
    labels it wrote itself are left alone); returns ``fig``."""
    for axis in [*fig.select_xaxes(), *fig.select_yaxes()]:
        if axis.type != "log" or axis.ticktext is not None:
            continue
        if axis.tickvals is not None:  # ticks the figure chose: labelled as the others are
            axis.update(ticktext=[log_tick_label(v) for v in axis.tickvals])
            continue
        span = _axis_span(fig, axis.plotly_name, axis)
        major, minor = log_ticks(*span) if span else ([], [])
        if not major:  # under a decade and few ticks: plotly's own full numbers
            axis.update(exponentformat="power")
            continue
        axis.update(
            tickmode="array",
            tickvals=major,
            ticktext=[log_tick_label(v) for v in major],
            minor={"tickvals": minor, "ticks": "outside", "ticklen": 3, "showgrid": False},
        )
    return fig


def bands_in_words(bands: Bands) -> str:
    """How ``bands`` split the rotary planes, as a page says it (``Bands.describe`` gives the
    command-line spec, ``quantiles:<=4``, which a figure title or a heading should not print)."""
    p = dict(bands.params)
    if bands.kind == "quantiles":
        n = p["n"]
        most = "up to " if p.get("fit") else ""
        return f"{most}{n} bands of equal plane counts, Q1 the highest frequencies"
    if bands.kind == "wavelength":
        edges = ", ".join(f"{e:,g}" for e in p["edges"])
        return f"bands cut at wavelengths of {edges} tokens"
    if bands.kind == "context":
        within = "the trained context" if p["n_ctx"] is None else f"{p['n_ctx']:,} tokens"
        times = "" if p["factor"] == 1 else f"{p['factor']:g} × "
        return f"planes that turn within {times}{within}, and those that do not"
    if bands.kind == "explicit":
        return "bands " + ", ".join(name for name, _ in p["groups"])
    return {"planes": "one band per plane", "all": "one band of every plane"}.get(
        bands.kind, bands.kind
    )


def category_layers(fig: go.Figure, n_rows: int) -> None:
    """Layer axes as categories: selected layers need not be contiguous, and each row is one
    layer."""
    fig.update_yaxes(type="category")
    if n_rows > 16:
        fig.update_yaxes(nticks=16)


def hline_log(fig: go.Figure, y: float, label: str, dash: str) -> None:
    """A labelled horizontal line on a log y axis (shapes take data values, annotations log10
    values)."""
    fig.add_shape(
        type="line",
        xref="paper",
        x0=0,
        x1=1,
        yref="y",
        y0=y,
        y1=y,
        layer="below",
        line={"dash": dash, "color": "#7a8294", "width": 1},
    )
    fig.add_annotation(
        xref="paper",
        x=0.005,
        yref="y",
        y=math.log10(y),
        text=label,
        showarrow=False,
        xanchor="left",
        yanchor="bottom",
        font={"size": 11, "color": "#5b6475"},
    )
