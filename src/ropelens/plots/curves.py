"""By-distance curves drawn: one curve with its ±2 SEM band, and several overlaid on one axis."""

from __future__ import annotations

import plotly.graph_objects as go

from ropelens.errors import InputError
from ropelens.results.curves import ByDistance, DecayCurve

__all__ = ["curve_line", "decay_curve_figure", "overlay", "sem_band"]


def curve_line(c: ByDistance, name: str | None = None) -> go.Scatter:
    """The by-distance mean as a plotly line trace (for overlays and subplots)."""
    return go.Scatter(
        x=c.distance.tolist(),
        y=c.mean.tolist(),
        mode="lines",
        name=name or c.name or type(c).__name__,
    )


def sem_band(c: ByDistance) -> list[go.Scatter]:
    """±2 SEM band (about 95%) around the mean; empty when the curve is exact."""
    sem = c.sem
    if sem is None or not (sem > 0).any():
        return []
    x = c.distance.tolist()
    lo, hi = (c.mean - 2 * sem).tolist(), (c.mean + 2 * sem).tolist()
    return [
        go.Scatter(
            x=x + x[::-1],
            y=hi + lo[::-1],
            fill="toself",
            line={"width": 0},
            opacity=0.25,
            hoverinfo="skip",
            showlegend=False,
            name="±2 SEM",
        )
    ]


def decay_curve_figure(c: DecayCurve) -> go.Figure:
    """The curve over distance, with a ±2 SEM band when it is an estimate."""
    fig = go.Figure([*sem_band(c), curve_line(c)])
    fig.update_layout(
        title=f"{c.name} [{c.kind}]",
        xaxis_title="distance δ = m − n (tokens)",
        yaxis_title="mean logit q·k",
        showlegend=False,
    )
    return fig


def overlay(
    results: list[ByDistance] | tuple[ByDistance, ...],
    *,
    normalised: bool = False,
    title: str | None = None,
) -> go.Figure:
    """Several by-distance curves on one axis (models, schemes or heads side by side)."""
    if not results:
        raise InputError(
            "overlay needs at least one by-distance curve (PESimilarity or DecayCurve)"
        )
    fig = go.Figure()
    for i, r in enumerate(results):
        if not isinstance(r, ByDistance):
            raise TypeError(
                f"overlay draws PESimilarity or DecayCurve results, got {type(r).__name__} at {i}"
            )
        if normalised and isinstance(r, DecayCurve):
            r = r.normalised()
        fig.add_trace(curve_line(r, name=r.name or f"curve {i}"))
    y_title = "value ÷ value at δ = 0" if normalised else "mean by distance"
    fig.update_layout(
        title=title or "by distance", xaxis_title="distance (tokens)", yaxis_title=y_title
    )
    return fig
