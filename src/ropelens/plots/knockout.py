"""The knockout figure: effect against planes zeroed, a CI band per curve, one curve per head set
and direction."""

from __future__ import annotations

from typing import Any

import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from ropelens.errors import InputError

__all__ = ["knockout_figure"]

_DASH = {"high": "solid", "low": "solid", "random": "dot"}
_PALETTE = (
    "#1f77b4",
    "#d62728",
    "#2ca02c",
    "#9467bd",
    "#ff7f0e",
    "#8c564b",
    "#17becf",
    "#7f7f7f",
)


def _rgba(hex_color: str, alpha: float) -> str:
    """A ``#rrggbb`` colour with opacity ``alpha``, as a plotly ``rgba(...)`` string."""
    digits = hex_color.lstrip("#")
    red, green, blue = (int(digits[start : start + 2], 16) for start in (0, 2, 4))
    return f"rgba({red}, {green}, {blue}, {alpha})"


def _chosen_metrics(frame: pd.DataFrame, metric: str | None) -> list[str]:
    """The metrics to draw, in measured order: all of them, or only ``metric``."""
    metrics = list(dict.fromkeys(frame["metric"]))
    if metric is None:
        return metrics
    if metric not in metrics:
        raise InputError(f"metric {metric!r} was not measured: choose from {metrics}")
    return [metric]


def _curve_traces(
    rows: pd.DataFrame, name: str, color: str, direction: str, show_legend: bool
) -> list[go.Scatter]:
    """A dose-response curve (rows sorted by dose) and the shaded band of its CI."""
    doses = rows["dose"].tolist()
    band = go.Scatter(
        x=doses + doses[::-1],
        y=rows["hi"].tolist() + rows["lo"].tolist()[::-1],
        fill="toself",
        fillcolor=_rgba(color, 0.15),
        line={"width": 0},
        hoverinfo="skip",
        legendgroup=name,
        showlegend=False,
    )
    curve = go.Scatter(
        x=doses,
        y=rows["estimate"],
        mode="lines+markers",
        name=name,
        legendgroup=name,
        showlegend=show_legend,
        line={"color": color, "dash": _DASH[direction]},
    )
    return [band, curve]


def _point_trace(
    rows: pd.DataFrame, name: str, color: str, direction: str, show_legend: bool
) -> go.Scatter:
    """Whole-head knockouts or random head sets: points at their doses with CI error bars."""
    return go.Scatter(
        x=rows["dose"],
        y=rows["estimate"],
        mode="markers",
        name=name,
        legendgroup=name,
        showlegend=show_legend,
        marker={"color": color, "symbol": "diamond" if direction == "head" else "x", "size": 9},
        error_y={
            "type": "data",
            "symmetric": False,
            "array": (rows["hi"] - rows["estimate"]).tolist(),
            "arrayminus": (rows["estimate"] - rows["lo"]).tolist(),
        },
    )


def _metric_traces(
    frame: pd.DataFrame, colors: dict[tuple[str, str], str], show_legend: bool
) -> list[go.Scatter]:
    """Every head set's and direction's traces for one metric's rows."""
    traces: list[go.Scatter] = []
    for (head_set, direction), rows in frame.groupby(["head_set", "direction"], sort=False):
        rows = rows.sort_values("dose")
        name, color = f"{head_set}: {direction}", colors[(head_set, direction)]
        if direction in _DASH:
            traces += _curve_traces(rows, name, color, direction, show_legend)
        else:
            traces.append(_point_trace(rows, name, color, direction, show_legend))
    return traces


def knockout_figure(result: Any, metric: str | None = None) -> go.Figure:
    """One panel per metric (or only ``metric``): mean paired effect vs dose with its CI band for
    each head set's high/low/random curves; whole-head knockouts and their random-head controls as
    points with error bars.

    ``result`` is a :class:`ropelens.analyses.knockout.Knockout`.
    """
    frame = result.to_frame()
    metrics = _chosen_metrics(frame, metric)
    figure = make_subplots(
        rows=len(metrics),
        cols=1,
        shared_xaxes=True,
        subplot_titles=metrics,
        vertical_spacing=0.08 if len(metrics) > 1 else 0.0,
    )
    curves = dict.fromkeys(zip(frame["head_set"], frame["direction"], strict=True))
    colors = {curve: _PALETTE[index % len(_PALETTE)] for index, curve in enumerate(curves)}
    for row, metric_name in enumerate(metrics, start=1):
        metric_rows = frame[frame["metric"] == metric_name]
        for trace in _metric_traces(metric_rows, colors, show_legend=row == 1):
            figure.add_trace(trace, row=row, col=1)
        figure.update_yaxes(title_text="effect", row=row, col=1)
        figure.add_hline(y=0, line={"color": "grey", "width": 1}, row=row, col=1)
    figure.update_xaxes(
        title_text=f"planes zeroed per head (of {result.n_planes})", row=len(metrics), col=1
    )
    figure.update_layout(
        height=max(380, 280 * len(metrics)),
        title=f"Knockout dose-response — {result.provenance.model} (paired effect, "
        f"{100 * result.provenance.config.get('level', 0.95):.0f}% CI over windows)",
    )
    return figure
