"""Position-embedding similarity drawn: the pairwise heatmap beside the by-distance curve."""

from __future__ import annotations

import math

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from ropelens.analyses.pe_geometry import PESimilarity
from ropelens.plots.curves import curve_line, sem_band

__all__ = ["pe_heatmap", "pe_similarity_figure"]

HEATMAP_MAX_SIDE = 512  # browsers choke on multi-million-cell heatmaps; the matrix is kept whole


def pe_heatmap(sim: PESimilarity) -> go.Heatmap:
    """Pairwise cosine similarity, strided to at most 512 positions a side for display."""
    step = max(1, math.ceil(sim.n_pos / HEATMAP_MAX_SIDE))
    pos = list(range(0, sim.n_pos, step))
    z = sim.similarity[::step, ::step].tolist()
    return go.Heatmap(
        z=z,
        x=pos,
        y=pos,
        zmin=-1,
        zmax=1,
        colorscale="RdBu_r",
        colorbar={"title": "cos"},
        name=sim.name,
    )


def pe_similarity_figure(sim: PESimilarity) -> go.Figure:
    """Pairwise heatmap beside the by-distance curve."""
    fig = make_subplots(rows=1, cols=2, subplot_titles=("pairwise", "by distance |m − n|"))
    fig.add_trace(pe_heatmap(sim), row=1, col=1)
    for tr in [*sem_band(sim), curve_line(sim)]:
        fig.add_trace(tr, row=1, col=2)
    fig.update_layout(
        title=f"{sim.name or 'position embeddings'}: {sim.period_text()}",
        showlegend=False,
        xaxis={"title": "position n"},
        yaxis={"title": "position m", "autorange": "reversed"},
        xaxis2={"title": "distance (tokens)"},
        yaxis2={"title": "mean cosine similarity"},
    )
    return fig
