"""M-RoPE decomposition drawn: each axis's share of the logit and attention by distance along each
axis."""

from __future__ import annotations

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from ropelens.analyses.mrope_decomposition import MRopeDecomposition

__all__ = ["mrope_figure"]


def mrope_figure(
    dec: MRopeDecomposition, layer: int | None = None, head: int | None = None, batch: int = 0
) -> go.Figure:
    """Each axis's share of |logit| per head on vision pairs, and attention by distance along each
    axis (``head``: one head; default the mean over heads); ``figure(layer, head=h)`` of the base
    class draws logits."""
    layer = dec.layers[0] if layer is None else layer
    s = dec.axis_shares()
    s = s[(s.layer == layer) & (s.pair == "vision→vision")]
    d = dec.by_distance(layer)
    if head is not None:
        d = d[d["head"] == head]
    d = d.groupby(["axis", "distance"], as_index=False).attention.mean()
    fig = make_subplots(
        rows=1,
        cols=2,
        subplot_titles=[
            "share of |logit| on vision pairs",
            "attention by distance along each axis",
        ],
    )
    for axis, g in s.groupby("axis", sort=False):
        fig.add_trace(go.Bar(x=g["head"], y=g.abs_share, name=f"{axis} share"), row=1, col=1)
    for axis, g in d.groupby("axis", sort=False):
        fig.add_trace(
            go.Scatter(x=g.distance, y=g.attention, mode="lines+markers", name=f"{axis} distance"),
            row=1,
            col=2,
        )
    fig.update_xaxes(title_text="head", row=1, col=1)
    fig.update_yaxes(title_text="share of |logit|", row=1, col=1)
    fig.update_xaxes(title_text="distance along the axis", row=1, col=2)
    fig.update_yaxes(title_text="mean attention", row=1, col=2)
    fig.update_layout(
        barmode="stack", title=f"Layer {layer}: M-RoPE axes (batch {batch})", height=360
    )
    return fig
