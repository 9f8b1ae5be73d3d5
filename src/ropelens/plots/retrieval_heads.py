"""Retrieval heads drawn: the retrieval score per layer and head."""

from __future__ import annotations

import plotly.graph_objects as go

from ropelens.analyses.retrieval_heads import RetrievalHeads

__all__ = ["retrieval_figure"]


def retrieval_figure(rh: RetrievalHeads) -> go.Figure:
    """Retrieval score heatmap, layer × head."""
    fig = go.Figure(
        go.Heatmap(
            z=rh.scores.numpy(),
            x=list(range(rh.scores.shape[1])),
            y=list(range(rh.scores.shape[0])),  # every layer is scored
            colorscale="Viridis",
            zmin=0,
            zmax=1,
            colorbar={"title": "score"},
            hovertemplate="layer %{y} head %{x}<br>retrieval score %{z:.3f}<extra></extra>",
        )
    )
    fig.update_layout(
        title=f"Retrieval scores — {rh.provenance.model}",
        xaxis_title="head",
        # layer 0 at the top and one row per layer, as in the other figures
        yaxis={"title": "layer", "autorange": "reversed", "type": "category"},
    )
    return fig
