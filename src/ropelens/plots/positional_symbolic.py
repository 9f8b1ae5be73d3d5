"""Positional and symbolic heads drawn: P − S per layer and head, and every head on the P–S
plane."""

from __future__ import annotations

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from ropelens.analyses.positional_symbolic import CALLS, PositionalSymbolic

__all__ = ["positional_symbolic_figure"]


def positional_symbolic_figure(ps: PositionalSymbolic) -> go.Figure:
    """Layer × head P − S for both measures, and every head on the positional–symbolic plane."""
    titles = [
        "P − S, logit (layer × head)",
        "P − S, attention (layer × head)",
        "positional–symbolic plane (logit)",
    ]
    fig = make_subplots(rows=1, cols=3, subplot_titles=titles, horizontal_spacing=0.08)
    H = ps.sums["pos_logit"].shape[1]
    for col, m in ((1, "logit"), (2, "attention")):
        fig.add_trace(
            go.Heatmap(
                z=ps.positionality(m).numpy(),
                x=list(range(H)),
                y=list(ps.layers),
                colorscale="RdBu",
                zmid=0,
                showscale=col == 2,
                hovertemplate="layer %{y} head %{x}<br>P − S %{z:.3f}<extra></extra>",
            ),
            row=1,
            col=col,
        )
        fig.update_yaxes(autorange="reversed", title_text="layer", type="category", row=1, col=col)
        fig.update_xaxes(title_text="head", row=1, col=col)
    p, s = ps.scores("logit")
    have = ps.present().reshape(-1)
    p, s = p.reshape(-1)[have], s.reshape(-1)[have]  # the layers' own heads
    calls = [c for row in ps.calls("logit") for c in row]
    names = [
        f"L{L}.H{h}" for L, n in zip(ps.layers, ps.present().sum(1).tolist()) for h in range(n)
    ]
    colours = {"positional": "#e45756", "mixed": "#bab0ac", "symbolic": "#4c78a8"}
    for c in CALLS:
        idx = [k for k, v in enumerate(calls) if v == c]
        fig.add_trace(
            go.Scatter(
                x=s[idx].numpy(),
                y=p[idx].numpy(),
                mode="markers",
                name=c,
                marker={"color": colours[c], "size": 6},
                text=[names[k] for k in idx],
                hovertemplate="%{text}<br>S %{x:.3f}, P %{y:.3f}<extra></extra>",
            ),
            row=1,
            col=3,
        )
    fig.update_xaxes(title_text="symbolic S", row=1, col=3)
    fig.update_yaxes(title_text="positional P", row=1, col=3)
    fig.update_layout(
        title=f"Positional vs symbolic heads — {ps.provenance.model} (margin {ps.margin:g})",
        height=520,
        legend={"orientation": "h", "x": 0.7, "y": -0.15},
    )
    return fig
