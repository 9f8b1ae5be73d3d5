"""Attention decomposition drawn: one head's logits band by band, beside the model's pattern; and
the rotation behind them, q and k turning in each plane with position."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import plotly.graph_objects as go
import torch
from plotly.subplots import make_subplots

from ropelens.analyses.attention_decomposition import AttentionDecomposition
from ropelens.plots.style import style_figure

__all__ = ["decomposition_figure", "rotation_figure"]


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


Q_COLOUR = "#c0392b"
K_COLOURS = ("#1f5fa8", "#2a9d8f", "#7b4fa0", "#d08a18", "#5b6770", "#b5487e")
FAINT = 0.35  # opacity of the pre-RoPE vectors and the paths they turned along
COLS = 2  # panels per row: a band's fastest plane beside its slowest
# pixels: a panel's height, the gap between rows (their titles), above the panels (the figure's
# title and the legend) and below them
PANEL, GAP, TOP, BOTTOM, WIDTH = 320, 100, 110, 60, 1120


def _arc(radius: float, start: float, turn: float) -> tuple[list[float], list[float]]:
    """Points of the arc of ``radius`` from angle ``start`` through ``turn`` radians (a whole circle
    where the rotation went round more than once)."""
    sweep = max(-2 * math.pi, min(2 * math.pi, turn))
    n = max(2, int(abs(sweep) / (math.pi / 90)) + 1)
    angles = [start + sweep * i / (n - 1) for i in range(n)]
    return [radius * math.cos(a) for a in angles], [radius * math.sin(a) for a in angles]


def _vector_traces(row: Any, colour: str, first: bool) -> list[go.Scatter]:
    """One vector: its pre-RoPE arrow and the arc it turned along (faint), then the post-RoPE
    arrow to its labelled tip."""
    who = f"{row.role} at {row.position}"
    traces = []
    if math.isfinite(row.pre_x):
        start = math.atan2(row.pre_y, row.pre_x)
        ax, ay = _arc(math.hypot(row.x, row.y), start, row.turn)
        turns = abs(row.turn) / (2 * math.pi)
        traces.append(
            go.Scatter(
                x=[0.0, row.pre_x, None, *ax], y=[0.0, row.pre_y, None, *ay],
                mode="lines", line={"color": colour, "width": 1, "dash": "dot"}, opacity=FAINT,
                name="before RoPE (dotted), turned by position", legendgroup="pre",
                showlegend=first and row.role == "q",
                hovertemplate=f"{who} before RoPE<br>turned by {math.degrees(row.turn):.0f}° "
                f"({turns:.2f} turns)<extra></extra>",
            )
        )  # fmt: skip
    hover = f"{who} after RoPE<br>plane coords (%{{x:.3f}}, %{{y:.3f}})"
    label = f"{row.role} {row.position}"
    if row.role == "k":
        hover += f"<br>angle to q {row.angle:.0f}°<br>plane term {row.term:+.4f}"
    traces.append(
        go.Scatter(
            x=[0.0, row.x], y=[0.0, row.y], mode="lines+markers+text",
            line={"color": colour, "width": 2}, marker={"size": [0, 8], "color": colour},
            text=["", label], textposition="top center", textfont={"color": colour, "size": 10},
            name=label, legendgroup=label, showlegend=first,
            hovertemplate=hover + "<extra></extra>",
        )
    )  # fmt: skip
    return traces


def rotation_figure(
    dec: AttentionDecomposition,
    layer: int | None = None,
    head: int = 0,
    *,
    query: int | None = None,
    keys: Sequence[int] | None = None,
    planes: Sequence[int] | None = None,
    batch: int = 0,
) -> go.Figure:
    """The rotation drawn: in each plane (default: each band's fastest and slowest), q at the query
    and k at a few keys as 2-D vectors after RoPE, each with its pre-RoPE vector and the arc the
    rotation turned it along (faint); each panel lists the angle from each k to q and the plane's
    term of the logit (q·k × score scale). Axes share one scale, so circles are round."""
    layer = dec.layers[0] if layer is None else layer
    rot = dec.rotation(layer, head, query=query, keys=keys, planes=planes, batch=batch)
    panels = list(dict.fromkeys(rot["panel"]))
    rows = math.ceil(len(panels) / COLS)
    titles = []
    for panel in panels:
        r = rot[rot["panel"] == panel].iloc[0]
        titles.append(f"{panel}: plane {r.plane}, {r.wavelength:,.3g} tokens per turn")
    area = PANEL * rows + GAP * (rows - 1)
    fig = make_subplots(
        rows=rows, cols=COLS, subplot_titles=titles, horizontal_spacing=0.09,
        vertical_spacing=GAP / area if rows > 1 else 0.0,
    )  # fmt: skip
    keys_at = list(dict.fromkeys(rot.loc[rot["role"] == "k", "position"]))
    colours = {("q", int(rot.loc[rot["role"] == "q", "position"].iloc[0])): Q_COLOUR}
    colours |= {("k", n): K_COLOURS[j % len(K_COLOURS)] for j, n in enumerate(keys_at)}
    for i, panel in enumerate(panels):
        _panel(fig, rot[rot["panel"] == panel], i // COLS + 1, i % COLS + 1, colours, i == 0)
    for i in range(len(panels), rows * COLS):  # the empty cell after an odd number of panels
        fig.update_xaxes(visible=False, row=i // COLS + 1, col=i % COLS + 1)
        fig.update_yaxes(visible=False, row=i // COLS + 1, col=i % COLS + 1)
    (query_at,) = (n for role, n in colours if role == "q")
    style_figure(fig)
    height = TOP + area + BOTTOM
    fig.update_layout(
        title={
            "text": f"Layer {layer} head {head}: q at position {query_at} and k at earlier "
            "positions, turning with position in each plane",
            "x": 0.01, "y": 1 - 14 / height, "yanchor": "top", "yref": "container",
        },
        height=height, width=WIDTH, margin={"t": TOP, "l": 70, "r": 20, "b": BOTTOM},
        legend={
            "orientation": "h", "x": 0, "y": 1 - 48 / height, "yanchor": "top",
            "yref": "container",
        },
    )  # fmt: skip
    return fig


def _panel(
    fig: go.Figure, sub: Any, row: int, col: int, colours: dict[tuple[str, int], str], first: bool
) -> None:
    """One plane's panel: its vectors, square axes around the longest at the left of its cell,
    and each key's angle and term listed to its right."""
    for r in sub.itertuples():
        for trace in _vector_traces(r, colours[(r.role, r.position)], first):
            fig.add_trace(trace, row=row, col=col)
    lengths = (sub["x"] ** 2 + sub["y"] ** 2) ** 0.5
    pre = ((sub["pre_x"] ** 2 + sub["pre_y"] ** 2) ** 0.5).fillna(0.0)
    radius = 1.3 * float(max(lengths.max(), pre.max(), 1e-12))
    x_ref, y_ref = _refs(fig, row, col)
    keys = sub[sub["role"] == "k"]
    lines = [f"k {r.position}: {r.angle:+.0f}°, term {r.term:+.3g}" for r in keys.itertuples()]
    fig.add_annotation(
        text="angle k→q, term<br>" + "<br>".join(lines), xref=f"{x_ref} domain",
        yref=f"{y_ref} domain", x=1.04, y=1.0, xanchor="left", yanchor="top", align="left",
        showarrow=False, font={"size": 10},
    )  # fmt: skip
    axis = {"range": [-radius, radius], "zeroline": True, "constrain": "domain"}
    axis["constraintoward"] = "left"
    fig.update_xaxes(title_text="plane coordinate 1", row=row, col=col, **axis)
    fig.update_yaxes(
        title_text="plane coordinate 2", scaleanchor=x_ref, scaleratio=1, row=row, col=col, **axis
    )


def _refs(fig: go.Figure, row: int, col: int) -> tuple[str, str]:
    """The x and y axis references (``"x3"``, ``"y3"``) of a subplot."""
    sub = fig.get_subplot(row, col)
    return sub.xaxis.plotly_name.replace("axis", ""), sub.yaxis.plotly_name.replace("axis", "")
