"""The look every ropelens page gives its figures: white template, system font, compact margins."""

from __future__ import annotations

import plotly.graph_objects as go

__all__ = ["FONT", "style_figure"]

# System fonts only: the report must look right offline, with nothing fetched.
FONT = '-apple-system, BlinkMacSystemFont, "Segoe UI", "Helvetica Neue", Helvetica, Arial, "Noto Sans", sans-serif'


def style_figure(fig: go.Figure, *, height: int | None = None) -> go.Figure:
    """The report's look for a figure: white template, system font, compact margins."""
    fig.update_layout(template="plotly_white", font={"family": FONT, "size": 12, "color": "#1f2430"},
                      title={"font": {"size": 14}, "x": 0.0, "xanchor": "left"},
                      margin={"t": 60, "l": 60, "r": 20, "b": 50})
    if height is not None:
        fig.update_layout(height=height)
    return fig
