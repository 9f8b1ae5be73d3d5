"""Head taxonomy drawn: offset mass on text against random tokens, beside the band margin shares."""

from __future__ import annotations

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from ropelens.analyses.head_taxonomy import HeadTaxonomy
from ropelens.results.findings import head_name

__all__ = [
    "HEADS_FIGURE_MAX_PX",
    "KIND_COLOURS",
    "heads_figure",
    "heads_figure_height",
    "heads_scatter",
]

HEADS_FIGURE_MAX_PX = 720  # a taller figure squashes the scatter beside the heatmap into a strip


def heads_figure_height(n_rows: int) -> int:
    """The figure's height for a heatmap of ``n_rows`` heads: 8 px a row between 460 and
    :data:`HEADS_FIGURE_MAX_PX` (a model with hundreds of heads draws them thinner, and the
    heatmap labels every few rows)."""
    return min(HEADS_FIGURE_MAX_PX, max(460, 8 * n_rows))


# a colour per kind of head, far apart: content heads grey, sinks brown, positional kinds bright
KIND_COLOURS = {
    "content": "#8c959f",
    "sink": "#8c510a",
    "diagonal": "#1f77b4",
    "previous-token": "#d62728",
    "offset-δ": "#2ca02c",
}


def heads_scatter(tax: HeadTaxonomy) -> list[go.Scatter]:
    """Offset mass on text vs random tokens, one trace per kind."""
    df = tax.to_frame()
    df["family"] = df["kind"].where(~df["kind"].str.startswith("offset-"), "offset-δ")
    return [
        go.Scatter(
            x=g["mass_text"],
            y=g["mass_random"],
            mode="markers",
            name=kind,
            marker={"color": KIND_COLOURS.get(kind, "#17becf")},
            text=[f"{head_name(r.layer, r.head)} δ*={r.best_offset}" for r in g.itertuples()],
            hovertemplate="%{text}<br>text %{x:.3f}, random %{y:.3f}<extra></extra>",
        )
        for kind, g in df.groupby("family")
    ]


def heads_figure(tax: HeadTaxonomy) -> go.Figure:
    """Heads scatter (text vs random offset mass, τ lines) beside the band margin-share heatmap."""
    fig = make_subplots(
        rows=1,
        cols=2,
        column_widths=[0.45, 0.55],
        horizontal_spacing=0.1,
        subplot_titles=[
            "offset mass at δ*: text vs random tokens",
            "margin share per band (rows: layer.head)",
        ],
    )
    for tr in heads_scatter(tax):
        fig.add_trace(tr, row=1, col=1)
    fig.add_vline(x=tax.tau, line_dash="dot", row=1, col=1)
    fig.add_hline(y=tax.tau, line_dash="dot", row=1, col=1)
    have = tax.present().flatten()
    z = tax.scores["margin_share"].flatten(0, 1)[have]
    ylab = [head_name(L, h) for L in tax.layers for h in range(tax.scores["margin_share"].shape[1])]
    ylab = [y for y, h in zip(ylab, have.tolist(), strict=True) if h]
    fig.add_trace(
        go.Heatmap(
            z=z.numpy(),
            x=list(tax.band_names),
            y=ylab,
            colorscale="RdBu",
            zmid=0,
            colorbar={"title": "margin share"},
        ),
        row=1,
        col=2,
    )
    fig.update_yaxes(autorange="reversed", title_text="layer.head", row=1, col=2)
    fig.update_xaxes(title_text="band", row=1, col=2)
    fig.update_xaxes(title_text="text", range=[0, 1.02], row=1, col=1)
    fig.update_yaxes(title_text="random tokens", range=[0, 1.02], row=1, col=1)
    # The legend goes under the plots, so it never covers the heatmap's colorbar on the right.
    fig.update_layout(
        height=heads_figure_height(len(ylab)),
        title=f"Head taxonomy — {tax.provenance.model} (τ = {tax.tau:.3f})",
        legend={"orientation": "h", "x": 0, "xanchor": "left", "y": -0.12, "yanchor": "top"},
        margin={"b": 110},
    )
    return fig
