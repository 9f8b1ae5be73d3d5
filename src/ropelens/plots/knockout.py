"""The knockout figure: effect against planes zeroed, a CI band per curve, one curve per head set
and direction."""

from __future__ import annotations

from typing import Any

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from ropelens.errors import InputError

__all__ = ["knockout_figure"]

_DASH = {"high": "solid", "low": "solid", "random": "dot"}


def _rgba(hex_color: str, alpha: float) -> str:
    h = hex_color.lstrip("#")
    return f"rgba({int(h[0:2], 16)}, {int(h[2:4], 16)}, {int(h[4:6], 16)}, {alpha})"


def knockout_figure(result: Any, metric: str | None = None) -> go.Figure:
    """One panel per metric (or only ``metric``): mean paired effect vs dose with its CI band for
    each head set's high/low/random curves; whole-head knockouts and their random-head controls as
    points with error bars.

    ``result`` is a :class:`ropelens.analyses.knockout.Knockout`.
    """
    df = result.to_frame()
    metrics = list(dict.fromkeys(df["metric"]))
    if metric is not None:
        if metric not in metrics:
            raise InputError(f"metric {metric!r} was not measured: choose from {metrics}")
        metrics = [metric]
    fig = make_subplots(
        rows=len(metrics),
        cols=1,
        shared_xaxes=True,
        subplot_titles=metrics,
        vertical_spacing=0.08 if len(metrics) > 1 else 0.0,
    )
    palette = [
        "#1f77b4",
        "#d62728",
        "#2ca02c",
        "#9467bd",
        "#ff7f0e",
        "#8c564b",
        "#17becf",
        "#7f7f7f",
    ]
    curves = [(s, d) for s, d in dict.fromkeys(zip(df["head_set"], df["direction"], strict=True))]
    colors = {c: palette[i % len(palette)] for i, c in enumerate(curves)}
    for row, m in enumerate(metrics, start=1):
        sub = df[df["metric"] == m]
        for (s, d), g in sub.groupby(["head_set", "direction"], sort=False):
            g = g.sort_values("dose")
            name, color, first = f"{s}: {d}", colors[(s, d)], row == 1
            if d in _DASH:
                x = g["dose"].tolist()
                fig.add_trace(
                    go.Scatter(
                        x=x + x[::-1],
                        y=g["hi"].tolist() + g["lo"].tolist()[::-1],
                        fill="toself",
                        fillcolor=_rgba(color, 0.15),
                        line={"width": 0},
                        hoverinfo="skip",
                        legendgroup=name,
                        showlegend=False,
                    ),
                    row=row,
                    col=1,
                )
                fig.add_trace(
                    go.Scatter(
                        x=x,
                        y=g["estimate"],
                        mode="lines+markers",
                        name=name,
                        legendgroup=name,
                        showlegend=first,
                        line={"color": color, "dash": _DASH[d]},
                    ),
                    row=row,
                    col=1,
                )
            else:  # whole heads and random head sets: points at their doses
                fig.add_trace(
                    go.Scatter(
                        x=g["dose"],
                        y=g["estimate"],
                        mode="markers",
                        name=name,
                        legendgroup=name,
                        showlegend=first,
                        marker={
                            "color": color,
                            "symbol": "diamond" if d == "head" else "x",
                            "size": 9,
                        },
                        error_y={
                            "type": "data",
                            "symmetric": False,
                            "array": (g["hi"] - g["estimate"]).tolist(),
                            "arrayminus": (g["estimate"] - g["lo"]).tolist(),
                        },
                    ),
                    row=row,
                    col=1,
                )
        fig.update_yaxes(title_text="effect", row=row, col=1)
        fig.add_hline(y=0, line={"color": "grey", "width": 1}, row=row, col=1)
    fig.update_xaxes(
        title_text=f"planes zeroed per head (of {result.n_planes})", row=len(metrics), col=1
    )
    fig.update_layout(
        height=max(380, 280 * len(metrics)),
        title=f"Knockout dose-response — {result.provenance.model} (paired effect, "
        f"{100 * result.provenance.config.get('level', 0.95):.0f}% CI over windows)",
    )
    return fig
