"""Frequency entropy drawn: layer × plane entropy, and per layer in order against shuffled."""

from __future__ import annotations

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from ropelens.analyses.frequency_entropy import FrequencyEntropy

__all__ = ["entropy_figure"]


def entropy_figure(fe: FrequencyEntropy) -> go.Figure:
    """Layer × plane entropy (heads averaged), and per layer the mean entropy in order and
    shuffled."""
    h = fe.entropy().nanmean(1)
    names = [f"{L} ({fe.kind(L)})" for L in fe.layers]
    fig = make_subplots(
        rows=1,
        cols=2,
        column_widths=[0.6, 0.4],
        horizontal_spacing=0.12,
        subplot_titles=[
            "entropy: layer × plane (heads averaged)",
            "per layer: in order vs shuffled",
        ],
    )
    fig.add_trace(
        go.Heatmap(
            z=h.numpy(),
            x=list(range(h.shape[-1])),
            y=names,
            colorscale="Viridis",
            colorbar={"title": "H / ln F", "x": 0.5},
            hovertemplate="layer %{y}<br>plane %{x}<br>entropy %{z:.3f}<extra></extra>",
        ),
        row=1,
        col=1,
    )
    per = fe.entropy().nanmean((1, 2)).numpy(), fe.entropy(True).nanmean((1, 2)).numpy()
    for vals, name in zip(per, ("in order", "shuffled"), strict=True):
        fig.add_trace(go.Scatter(x=vals, y=names, mode="markers", name=name), row=1, col=2)
    fig.update_xaxes(title_text="plane (0 = highest frequency)", row=1, col=1)
    fig.update_xaxes(title_text="mean entropy", row=1, col=2)
    fig.update_yaxes(autorange="reversed")
    fig.update_layout(
        title=f"Frequency entropy — {fe.provenance.model}",
        height=420,
        margin={"t": 70, "l": 80, "r": 20, "b": 50},
    )
    return fig
