"""Attention by distance drawn: band logits, the full logit and attention probability over
log-binned δ."""

from __future__ import annotations

from collections.abc import Sequence

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from ropelens.analyses.attention_by_distance import AttentionByDistance
from ropelens.plots.style import bands_in_words, readable_log_axes

__all__ = ["distance_figure"]

ROW_PX = 250  # each row's plot height
GAP_PX = 90  # between rows: the row above's tick labels, then this row's panel titles
MARGIN_PX = 150  # the figure's title and the bottom axis title
# the probability's own colour: its legend entry must not read as the full logit's (black)
PROBABILITY_COLOUR = "#17becf"


_PALETTE = (
    "#1f77b4",
    "#ff7f0e",
    "#2ca02c",
    "#d62728",
    "#9467bd",
    "#8c564b",
    "#e377c2",
    "#7f7f7f",
)


def _chosen_layers(result: AttentionByDistance, layers: Sequence[int] | None) -> list[int]:
    """The layers to draw, each checked to be measured: as given, or up to four spread over the
    measured ones."""
    if layers is None:
        n_shown = min(4, len(result.layers))
        last, steps = len(result.layers) - 1, max(1, n_shown - 1)
        layers = [result.layers[round(index * last / steps)] for index in range(n_shown)]
    layers = list(dict.fromkeys(layers))
    for layer in layers:
        result.layer_index(layer)
    return layers


def _panel_titles(result: AttentionByDistance, layers: Sequence[int]) -> list[str]:
    """Two panel titles per layer: band logits (with the layer's kind) and attention probability."""
    titles = []
    for layer in layers:
        kind = result.spec.layers[layer].kind
        titles += [
            f"layer {layer} ({kind}): mean logit by band",
            f"layer {layer}: mean attention probability",
        ]
    return titles


def _layer_traces(
    result: AttentionByDistance,
    layer: int,
    head: int | None,
    distances: list[float],
    show_legend: bool,
) -> list[tuple[go.Scatter, int]]:
    """One layer's curves with the panel column each goes in: every band's mean logit and the
    full logit (column 1), the attention probability (column 2)."""
    labels = result.bin_labels()

    def curve(which: str, name: str, group: str, line: dict, hover: str) -> go.Scatter:
        return go.Scatter(
            x=distances,
            y=result.curve(layer, which, head).tolist(),
            mode="lines+markers",
            name=name,
            legendgroup=group,
            showlegend=show_legend,
            line=line,
            customdata=labels,
            hovertemplate="δ %{customdata}<br>" + hover,
        )

    traces = [
        (
            curve(
                band,
                band,
                band,
                {"color": _PALETTE[index % len(_PALETTE)]},
                "%{y:.4f}<extra>" + band + "</extra>",
            ),
            1,
        )
        for index, band in enumerate(result.band_names)
    ]
    full_logit_line = {"color": "black", "dash": "dash"}
    full_logit_hover = "%{y:.4f}<extra>full logit</extra>"
    traces.append((curve("logit", "full logit", "logit", full_logit_line, full_logit_hover), 1))
    probability_hover = "p %{y:.4g}<extra></extra>"
    traces.append(
        (curve("prob", "probability", "prob", {"color": PROBABILITY_COLOUR}, probability_hover), 2)
    )
    return traces


def distance_figure(
    res: AttentionByDistance, layers: Sequence[int] | None = None, head: int | None = None
) -> go.Figure:
    """Per layer (default: up to four spread over the measured ones): mean band logits and the full
    logit by distance (left), and the mean attention probability (right), log-x; δ = 0 sits at ½."""
    layers = _chosen_layers(res, layers)
    rows = len(layers)
    plots_px = rows * ROW_PX + (rows - 1) * GAP_PX  # the plotting area: rows and the gaps between
    figure = make_subplots(
        rows=rows,
        cols=2,
        subplot_titles=_panel_titles(res, layers),
        horizontal_spacing=0.1,
        vertical_spacing=GAP_PX / plots_px if rows > 1 else 0.0,
    )
    distances = res.centres.clone()
    distances[0] = 0.5  # δ = 0 on a log axis
    for row, layer in enumerate(layers, start=1):
        for trace, col in _layer_traces(res, layer, head, distances.tolist(), row == 1):
            figure.add_trace(trace, row=row, col=col)
    largest = max(1.0, float(distances[-1]) * 1.5)
    ticks = [tick for tick in (0.5, 1, 10, 100, 1000, 10000) if tick <= largest]
    figure.update_xaxes(
        type="log",
        tickvals=ticks,
        ticktext=["0" if tick == 0.5 else f"{tick:g}" for tick in ticks],
    )
    figure.update_xaxes(title_text="distance δ = m − n (tokens)", row=rows)  # the bottom row only
    figure.update_yaxes(type="log", col=2)
    who = "heads averaged" if head is None else f"head {head}"
    figure.update_layout(
        title=(
            f"Attention by distance — {res.provenance.model} ({bands_in_words(res.bands)}, {who})"
        ),
        height=plots_px + MARGIN_PX,
        margin={"t": 90, "b": 60},
    )
    return readable_log_axes(figure)
