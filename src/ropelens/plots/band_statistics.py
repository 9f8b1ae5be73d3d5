"""Band statistics drawn: layer × band (or head × band) heatmaps of each band's share of the
logit."""

from __future__ import annotations

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from ropelens.analyses.band_statistics import BandStatistics
from ropelens.plots.style import bands_in_words

__all__ = ["band_statistics_figure", "band_statistics_heatmap"]


def band_statistics_heatmap(
    st: BandStatistics,
    metric: str = "margin_share",
    layer: int | None = None,
    coloraxis: str | None = None,
) -> go.Heatmap:
    """Layer × band (head-averaged) or, for one layer, head × band."""
    z = getattr(st, metric)()
    if layer is None:
        z2, y, ylab = z.nanmean(1), list(st.layers), "layer"  # heads a layer lacks (NaN) left out
    else:
        li = st.layers.index(layer)
        n_heads = int(st.present()[li].sum())
        z2, y, ylab = z[li, :n_heads], list(range(n_heads)), "head"
    return go.Heatmap(
        z=z2.numpy(),
        x=list(st.band_names),
        y=y,
        coloraxis=coloraxis,
        hovertemplate=f"{ylab} %{{y}} · band %{{x}}<br>{metric} %{{z:.3f}}<extra></extra>",
    )


def band_statistics_figure(st: BandStatistics, layer: int | None = None) -> go.Figure:
    """Three layer × band heatmaps (head × band for ``layer``): shares of mean |logit|, within-query
    variance and attended-key margin."""
    titles = [
        "share of mean |logit|",
        "share of within-query variance",
        "share of attended-key margin",
    ]
    fig = make_subplots(rows=1, cols=3, subplot_titles=titles, horizontal_spacing=0.06)
    for c, metric in enumerate(("abs_share", "var_share", "margin_share"), start=1):
        fig.add_trace(
            band_statistics_heatmap(st, metric, layer, coloraxis="coloraxis"), row=1, col=c
        )
        fig.update_xaxes(title_text="band", row=1, col=c)
    # every panel: first layer (or head) at the top, one row per measured layer
    fig.update_yaxes(autorange="reversed", type="category")
    fig.update_yaxes(title_text="layer" if layer is None else "head", col=1)
    fig.update_layout(
        coloraxis={"colorscale": "RdBu", "cmid": 0},
        height=460,
        title=f"Band decomposition — {st.provenance.model} ({bands_in_words(st.bands)})",
    )
    return fig
