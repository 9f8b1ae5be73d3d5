"""Passkey retrieval drawn: accuracy by depth and length."""

from __future__ import annotations

import numpy as np
import plotly.graph_objects as go

from ropelens.analyses.passkey_retrieval import PasskeyRetrieval

__all__ = ["passkey_figure"]


def passkey_figure(res: PasskeyRetrieval) -> go.Figure:
    """Accuracy heatmap: depth (rows) × length (columns), 0 red to 1 green."""
    acc = res.accuracy()
    x = [f"{L:,}" for L in res.lengths]
    text = [["–" if np.isnan(v) else f"{v:.0%}" for v in row] for row in acc]
    fig = go.Figure(
        go.Heatmap(
            z=acc,
            x=x,
            y=[f"{d:g}" for d in res.depths],
            zmin=0,
            zmax=1,
            colorscale="RdYlGn",
            text=text,
            texttemplate="%{text}",
            colorbar={"title": "accuracy"},
            hovertemplate="length %{x} tokens<br>depth %{y}<br>accuracy %{z:.2f}<extra></extra>",
        )
    )
    name = res.provenance.config.get("variant_name") or "unmodified"
    n = res.provenance.config.get("n_trials")
    fig.update_layout(
        title=f"Passkey retrieval — {res.provenance.model}, {name} ({n} trials per cell)",
        xaxis_title="prompt length (tokens)",
        yaxis_title="depth of the passkey",
        height=360,
        margin={"t": 60, "l": 70, "r": 20, "b": 50},
    )
    fig.update_yaxes(autorange="reversed")
    return fig
