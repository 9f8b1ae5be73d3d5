"""The look every ropelens page gives its figures: white template, system font, compact margins."""

from __future__ import annotations

import math

import plotly.graph_objects as go

__all__ = ["FONT", "category_layers", "hline_log", "style_figure"]

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
        title={"font": {"size": 14}, "x": 0.0, "xanchor": "left"},
        margin={"t": 60, "l": 60, "r": 20, "b": 50},
    )
    if height is not None:
        fig.update_layout(height=height)
    return fig


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
