"""Extrapolation drawn: the base each length needs, and measured perplexity by length."""

from __future__ import annotations

import math

import plotly.graph_objects as go

from ropelens.analyses.base_predictions import BasePredictions, MeasuredExtrapolation
from ropelens.plots.style import readable_log_axes

__all__ = ["base_predictions_figure", "measured_extrapolation_figure"]


def base_predictions_figure(pred: BasePredictions) -> go.Figure:
    """Base each length needs (Liu's β₀, Men's bound) against the layer's base, log-log."""
    fig = go.Figure()
    df = pred.to_frame()
    for kind, g in df.groupby("kind", sort=False):
        fig.add_trace(
            go.Scatter(
                x=g["length"],
                y=g["critical_base"],
                mode="lines+markers",
                name=f"{kind}: Liu critical base β₀",
            )
        )
        fig.add_trace(
            go.Scatter(
                x=g["length"],
                y=g["men_lower_bound"],
                mode="lines+markers",
                name=f"{kind}: Men lower bound",
                line={"dash": "dot"},
            )
        )
        fig.add_trace(
            go.Scatter(
                x=g["length"],
                y=g["base"],
                mode="lines",
                name=f"{kind}: model base",
                line={"color": "black", "dash": "dash", "width": 1},
            )
        )
    fig.update_layout(
        title=f"Base needed per context length — {pred.provenance.model}",
        xaxis_type="log",
        yaxis_type="log",
        xaxis_title="context length (tokens)",
        yaxis_title="RoPE base",
    )
    return readable_log_axes(fig)


def measured_extrapolation_figure(
    meas: MeasuredExtrapolation, predictions: BasePredictions | None = None
) -> go.Figure:
    """Perplexity by length (CI as error bars), the trained context and, given, Liu's T_extra."""
    df = meas.to_frame()
    fig = go.Figure(
        go.Scatter(
            x=df["length"],
            y=df["perplexity"],
            mode="lines+markers",
            name="measured perplexity",
            error_y={
                "type": "data",
                "symmetric": False,
                "array": df["perplexity_hi"] - df["perplexity"],
                "arrayminus": df["perplexity"] - df["perplexity_lo"],
            },
        )
    )
    fig.add_vline(x=meas.train_ctx, line_dash="dash", annotation_text=f"trained {meas.train_ctx:,}")
    if predictions is not None:
        for kind, t in {r["kind"]: r["t_extra"] for r in predictions.rows}.items():
            if math.isfinite(t):
                fig.add_vline(x=t, line_dash="dot", annotation_text=f"T_extra ({kind}) {t:,.0f}")
    fig.update_layout(
        title=f"Perplexity by context length — {meas.provenance.model}",
        xaxis_type="log",
        xaxis_title="context length (tokens)",
        yaxis_title="perplexity",
    )
    return readable_log_axes(fig)
