"""Rotary offsets drawn: outlier ratios and resultant lengths per plane, partial-cycle planes
marked."""

from __future__ import annotations

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from ropelens.analyses.rotary_offsets import RotaryOffsets
from ropelens.errors import InputError

__all__ = ["offsets_figure", "offsets_heatmap"]


def offsets_heatmap(
    off: RotaryOffsets,
    what: str = "q_ratio",
    layer: int | None = None,
    coloraxis: str | None = None,
) -> go.Heatmap:
    """Layer × plane (head mean) or, for ``layer``, head × plane of one statistic:
    ``q_ratio``, ``k_ratio``, ``resultant_post``, ``resultant_pre`` or ``mean_term``."""
    stats = {
        "q_ratio": lambda: off.outlier_ratio("q"),
        "k_ratio": lambda: off.by_head(off.outlier_ratio("k")),
        "resultant_post": lambda: off.resultant_length("post"),
        "resultant_pre": lambda: off.resultant_length("pre"),
        "mean_term": off.mean_term,
    }
    if what not in stats:
        raise InputError(f"what must be one of {sorted(stats)}, got {what!r}")
    z = stats[what]().float()
    if layer is None:
        z2, y, ylab = z.nanmean(1), list(off.layers), "layer"
    else:
        if layer not in off.layers:
            raise InputError(f"layer {layer} was not measured; measured layers: {list(off.layers)}")
        z2, y, ylab = z[off.layers.index(layer)], list(range(z.shape[1])), "head"
    return go.Heatmap(
        z=z2.numpy(),
        x=list(range(z.shape[-1])),
        y=y,
        coloraxis=coloraxis,
        hovertemplate=f"{ylab} %{{y}}<br>plane %{{x}}<br>{what} %{{z:.3g}}<extra></extra>",
    )


def offsets_figure(off: RotaryOffsets, layer: int | None = None) -> go.Figure:
    """Query and key outlier ratios and the post-RoPE resultant length, with the first
    partial-cycle plane marked (dashed line)."""
    what = ("q_ratio", "k_ratio", "resultant_post")
    titles = (
        "q norm / median of other planes",
        "k norm / median of other planes",
        "resultant length R (post-RoPE)",
    )
    fig = make_subplots(rows=1, cols=3, subplot_titles=titles, horizontal_spacing=0.06)
    for col, w in enumerate(what, start=1):
        fig.add_trace(
            offsets_heatmap(off, w, layer, coloraxis=f"coloraxis{col if col > 1 else ''}"),
            row=1,
            col=col,
        )
        fig.update_xaxes(title_text="plane (0 = highest frequency)", row=1, col=col)
    partial = off.partial_cycle.any(0).nonzero().flatten()
    if partial.numel():
        for col in (1, 2, 3):
            fig.add_vline(
                x=int(partial[0]) - 0.5, line_dash="dash", line_color="white", row=1, col=col
            )
    fig.update_yaxes(
        title_text="layer" if layer is None else "head", autorange="reversed", type="category"
    )
    fig.update_layout(
        coloraxis={"colorscale": "Viridis", "colorbar": {"x": 0.29, "len": 0.8}},
        coloraxis2={"colorscale": "Viridis", "colorbar": {"x": 0.645, "len": 0.8}},
        coloraxis3={
            "colorscale": "Viridis",
            "cmin": 0,
            "cmax": 1,
            "colorbar": {"x": 1.0, "len": 0.8},
        },
        title=f"Rotary outliers and offsets — {off.provenance.model} (partial-cycle planes right "
        "of the line)",
        height=420 if layer is None else 320,
    )
    return fig
