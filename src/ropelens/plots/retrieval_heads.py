"""Retrieval heads drawn: the retrieval score per layer and head."""

from __future__ import annotations

import plotly.graph_objects as go

from ropelens.analyses.retrieval_heads import RetrievalHeads

__all__ = ["retrieval_figure"]


def retrieval_figure(rh: RetrievalHeads) -> go.Figure:
    """Retrieval score heatmap, layer × head."""
    fig = go.Figure(
        go.Heatmap(
            z=rh.scores.numpy(), colorscale="Viridis", zmin=0, zmax=1, colorbar={"title": "score"}
        )
    )
    fig.update_layout(
        title=f"Retrieval scores — {rh.provenance.model}", xaxis_title="head", yaxis_title="layer"
    )
    return fig
