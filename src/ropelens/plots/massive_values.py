"""Massive values drawn: layer × plane norm ratios of q and k, the massive planes marked."""

from __future__ import annotations

import math

import numpy as np
import plotly.graph_objects as go
import torch
from plotly.subplots import make_subplots

from ropelens.analyses.massive_values import MassiveValues

__all__ = ["massive_figure"]


def massive_figure(mv: MassiveValues) -> go.Figure:
    """Layer × plane heatmaps of q and k: the largest norm ratio over the plane's dims and the heads
    (log colour scale); massive planes are marked with a cross. Each layer's own planes (empty past
    them)."""
    P = int(mv.spec.present(mv.layers, "plane").shape[1])
    wl = torch.full((len(mv.layers), P), float("nan"), dtype=torch.float64)
    for i, L in enumerate(mv.layers):
        wl[i, : mv.spec.layers[L].n_planes] = mv.spec.layers[L].wavelength.double()
    fig = make_subplots(
        rows=1,
        cols=2,
        horizontal_spacing=0.08,
        subplot_titles=["queries: layer × plane", "keys: layer × plane"],
    )
    for col, w in ((1, "q"), (2, "k")):
        r = mv.ratio(w)
        z = torch.full((len(mv.layers), P), float("nan"), dtype=torch.float64)
        for i, L in enumerate(mv.layers):
            dims = mv.spec.layers[L].plane_dims
            z[i, : dims.shape[0]] = (
                torch.maximum(r[i][..., dims[:, 0]], r[i][..., dims[:, 1]])
                .nan_to_num(nan=-math.inf)
                .amax(0)
            )
        fig.add_trace(
            go.Heatmap(
                z=z.clamp_min(1e-6).log10().numpy(),
                x=list(range(P)),
                y=list(mv.layers),
                coloraxis="coloraxis",
                customdata=np.stack([z.numpy(), wl.numpy()], axis=-1),
                hovertemplate="layer %{y} plane %{x} (λ=%{customdata[1]:.1f} tokens)<br>"
                f"max norm ratio %{{customdata[0]:.2f}}<extra>{w}</extra>",
            ),
            row=1,
            col=col,
        )
        li, pi = torch.nonzero(mv.plane_mask(w).any(1), as_tuple=True)
        fig.add_trace(
            go.Scatter(
                x=pi.tolist(),
                y=[mv.layers[i] for i in li.tolist()],
                mode="markers",
                marker={"symbol": "x", "color": "white", "size": 7},
                name=f"massive ({w})",
                showlegend=False,
                hoverinfo="skip",
            ),
            row=1,
            col=col,
        )
        fig.update_xaxes(title_text="plane (0 = highest frequency)", row=1, col=col)
    fig.update_yaxes(title_text="layer", autorange="reversed", type="category")
    fig.update_layout(
        coloraxis={"colorscale": "Viridis", "colorbar": {"title": "log10 ratio"}},
        title=f"Massive values — {mv.provenance.model} (× = norm > {mv.factor:g}× head mean)",
        height=420,
        margin={"t": 70, "l": 60, "r": 20, "b": 50},
    )
    return fig
