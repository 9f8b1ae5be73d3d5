"""Attention sinks drawn: attention to position 0, sinking heads, sink logit and key norm by
band."""

from __future__ import annotations

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from ropelens.analyses.attention_sinks import AttentionSinks
from ropelens.plots.style import bands_in_words

__all__ = ["sinks_figure"]


def sinks_figure(snk: AttentionSinks) -> go.Figure:
    """Layer × head attention to position 0; per layer the share of sinking heads; layer × band sink
    logit (heads averaged); layer × band key-norm ratio (KV heads averaged)."""
    titles = [
        "mean attention to position 0 (layer × head)",
        f"share of heads that sink (> ε = {snk.epsilon:g})",
        "sink logit by band, heads averaged",
        "key norm at position 0 ÷ other positions, by band",
    ]
    # Layer axes are categories: one row (or bar) per measured layer, even when they skip some.
    fig = make_subplots(
        rows=2, cols=2, subplot_titles=titles, horizontal_spacing=0.2, vertical_spacing=0.2
    )  # room between the columns for the left colour bars, between the rows for axis titles
    n_heads = snk.sums["p0_sum"].shape[1]
    fig.add_trace(
        go.Heatmap(
            z=snk.mean_attention().numpy(),  # NaN (heads a layer lacks) draws as an empty cell
            x=list(range(n_heads)),
            y=list(snk.layers),
            zmin=0,
            zmax=1,
            colorscale="Viridis",
            colorbar={"x": 0.41, "xanchor": "left", "thickness": 12, "len": 0.4, "y": 0.8},
            hovertemplate="layer %{y} head %{x}<br>attention to 0: %{z:.3f}<extra></extra>",
        ),
        row=1,
        col=1,
    )
    fig.add_trace(
        go.Bar(
            x=list(snk.layers),
            y=snk.head_share().numpy(),
            marker_color="#4c78a8",
            hovertemplate="layer %{x}<br>%{y:.0%} of heads sink<extra></extra>",
        ),
        row=1,
        col=2,
    )
    x = snk.sink_logit().nanmean(1)
    lim = float(x.abs().nan_to_num(0).max()) or 1.0
    fig.add_trace(
        go.Heatmap(
            z=x.numpy(),
            x=list(snk.band_names),
            y=list(snk.layers),
            colorscale="RdBu",
            zmid=0,
            zmin=-lim,
            zmax=lim,
            colorbar={"x": 0.41, "xanchor": "left", "thickness": 12, "len": 0.4, "y": 0.2},
            hovertemplate="layer %{y} · band %{x}<br>sink logit %{z:.3f}<extra></extra>",
        ),
        row=2,
        col=1,
    )
    r = snk.key_norm_ratio().nanmean(1)
    fig.add_trace(
        go.Heatmap(
            z=r.log2().numpy(),
            x=list(snk.band_names),
            y=list(snk.layers),
            colorscale="PuOr",
            zmid=0,
            customdata=r.numpy(),
            colorbar={"title": "log₂", "thickness": 12, "len": 0.4, "y": 0.2},
            hovertemplate="layer %{y} · band %{x}<br>%{customdata:.2f}×<extra></extra>",
        ),
        row=2,
        col=2,
    )
    for rr, cc in ((1, 1), (2, 1), (2, 2)):
        fig.update_yaxes(autorange="reversed", title_text="layer", type="category", row=rr, col=cc)
    fig.update_xaxes(title_text="head", row=1, col=1)
    fig.update_xaxes(title_text="layer", type="category", row=1, col=2)
    fig.update_xaxes(title_text="band", row=2)
    fig.update_yaxes(range=[0, 1], tickformat=".0%", row=1, col=2)
    fig.update_layout(
        title=f"Attention sinks — {snk.provenance.model} ({bands_in_words(snk.bands)})",
        height=760,
        showlegend=False,
    )
    return fig
