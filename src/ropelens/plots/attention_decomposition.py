"""Attention decomposition drawn: one head's logits band by band, beside the model's pattern."""

from __future__ import annotations

import plotly.graph_objects as go
import torch
from plotly.subplots import make_subplots

from ropelens.analyses.attention_decomposition import AttentionDecomposition

__all__ = ["decomposition_figure"]


def decomposition_figure(
    dec: AttentionDecomposition, layer: int | None = None, head: int = 0, batch: int = 0
) -> go.Figure:
    """One head (default: head 0 of the first layer): each band's logits as a heatmap, and the
    model's pattern."""
    layer = dec.layers[0] if layer is None else layer
    x = dec.band_logits(layer)[batch, head]
    names = dec.band_names(layer)
    fig = make_subplots(
        rows=1, cols=len(names) + 1, subplot_titles=[*names, "pattern"], horizontal_spacing=0.02
    )
    lim = float(x[torch.isfinite(x)].abs().max()) if torch.isfinite(x).any() else 1.0
    for b in range(len(names)):
        z = x[b].masked_fill(~torch.isfinite(x[b]), float("nan")).numpy()
        fig.add_trace(
            go.Heatmap(
                z=z,
                coloraxis="coloraxis",
                hovertemplate="q %{y} k %{x}<br>logit %{z:.3f}<extra></extra>",
            ),
            row=1,
            col=b + 1,
        )
    fig.add_trace(
        go.Heatmap(
            z=dec.pattern(layer)[batch, head].numpy(),
            colorscale="Greys",
            showscale=False,
            hovertemplate="q %{y} k %{x}<br>p %{z:.3f}<extra></extra>",
        ),
        row=1,
        col=len(names) + 1,
    )
    fig.update_yaxes(autorange="reversed")
    fig.update_layout(
        coloraxis={"colorscale": "RdBu", "cmin": -lim, "cmax": lim, "cmid": 0},
        title=f"Layer {layer} head {head}: logit by band",
        height=330,
    )
    return fig
