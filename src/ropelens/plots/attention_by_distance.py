"""Attention by distance drawn: band logits, the full logit and attention probability over
log-binned δ."""

from __future__ import annotations

from collections.abc import Sequence

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from ropelens.analyses.attention_by_distance import AttentionByDistance

__all__ = ["distance_figure"]


def distance_figure(
    res: AttentionByDistance, layers: Sequence[int] | None = None, head: int | None = None
) -> go.Figure:
    """Per layer (default: up to four spread over the measured ones): mean band logits and the full
    logit by distance (left), and the mean attention probability (right), log-x; δ = 0 sits at ½."""
    if layers is None:
        k = min(4, len(res.layers))
        layers = [res.layers[round(j * (len(res.layers) - 1) / max(1, k - 1))] for j in range(k)]
    layers = list(dict.fromkeys(layers))
    for layer in layers:
        res.layer_index(layer)
    titles = []
    for layer in layers:
        kind = res.spec.layers[layer].kind
        titles += [
            f"layer {layer} ({kind}): mean logit by band",
            f"layer {layer}: mean attention probability",
        ]
    fig = make_subplots(
        rows=len(layers),
        cols=2,
        subplot_titles=titles,
        horizontal_spacing=0.1,
        vertical_spacing=0.5 / max(1, len(layers)),
    )
    x = res.centres.clone()
    x[0] = 0.5  # δ = 0 on a log axis
    labels = res.bin_labels()
    palette = [
        "#1f77b4",
        "#ff7f0e",
        "#2ca02c",
        "#d62728",
        "#9467bd",
        "#8c564b",
        "#e377c2",
        "#7f7f7f",
    ]
    for r, layer in enumerate(layers, start=1):
        for j, name in enumerate(res.band_names):
            fig.add_trace(
                go.Scatter(
                    x=x.tolist(),
                    y=res.curve(layer, name, head).tolist(),
                    mode="lines+markers",
                    name=name,
                    legendgroup=name,
                    showlegend=r == 1,
                    line={"color": palette[j % len(palette)]},
                    customdata=labels,
                    hovertemplate="δ %{customdata}<br>%{y:.4f}<extra>" + name + "</extra>",
                ),
                row=r,
                col=1,
            )
        fig.add_trace(
            go.Scatter(
                x=x.tolist(),
                y=res.curve(layer, "logit", head).tolist(),
                mode="lines+markers",
                name="full logit",
                legendgroup="logit",
                showlegend=r == 1,
                line={"color": "black", "dash": "dash"},
                customdata=labels,
                hovertemplate="δ %{customdata}<br>%{y:.4f}<extra>full logit</extra>",
            ),
            row=r,
            col=1,
        )
        fig.add_trace(
            go.Scatter(
                x=x.tolist(),
                y=res.curve(layer, "prob", head).tolist(),
                mode="lines+markers",
                name="probability",
                legendgroup="prob",
                showlegend=r == 1,
                line={"color": "black"},
                customdata=labels,
                hovertemplate="δ %{customdata}<br>p %{y:.4g}<extra></extra>",
            ),
            row=r,
            col=2,
        )
    ticks = [v for v in (0.5, 1, 10, 100, 1000, 10000) if v <= max(1.0, float(x[-1]) * 1.5)]
    fig.update_xaxes(
        type="log",
        tickvals=ticks,
        ticktext=["0" if t == 0.5 else f"{t:g}" for t in ticks],
        title_text="distance δ = m − n (tokens)",
    )
    fig.update_yaxes(type="log", col=2)
    who = "heads averaged" if head is None else f"head {head}"
    fig.update_layout(
        title=f"Attention by distance — {res.provenance.model} ({res.bands.describe()}, {who})",
        height=300 * len(layers) + 80,
    )
    return fig
