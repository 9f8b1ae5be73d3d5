"""Frequency bands drawn: the per-layer band over the plane norms and the intervention's losses."""

from __future__ import annotations

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from ropelens.analyses.band_location import BandLocation

__all__ = ["band_location_figure"]


def band_location_figure(fb: BandLocation) -> go.Figure:
    """Layer × plane norms (each layer scaled to its peak) with the band and critical plane marked;
    the intervention's losses beside them when there is one."""
    prof = fb.profile()
    z = prof / prof.amax(-1, keepdim=True).clamp_min(1e-30)
    b, crit = fb.bands(), fb.critical_plane()
    cols = 2 if fb.intervention is not None else 1
    fig = make_subplots(
        rows=1,
        cols=cols,
        column_widths=[0.65, 0.35][:cols] if cols == 2 else None,
        subplot_titles=["norm ÷ layer peak, band and critical plane", "loss change vs RoPE (nats)"][
            :cols
        ],
    )
    fig.add_trace(
        go.Heatmap(
            z=z.numpy(),
            x=list(range(z.shape[-1])),
            y=list(fb.layers),
            colorscale="Viridis",
            colorbar={"title": "‖·‖ / peak"},
            hovertemplate="layer %{y}<br>plane %{x}<br>%{z:.2f}<extra></extra>",
        ),
        row=1,
        col=1,
    )
    y = list(fb.layers)
    for edge, name, sym in (
        (b.lo, "band start", "triangle-right"),
        (b.hi, "band end", "triangle-left"),
        (b.peak, "peak", "x"),
    ):
        fig.add_trace(
            go.Scatter(
                x=edge.tolist(),
                y=y,
                mode="markers",
                name=name,
                marker={"symbol": sym, "color": "red"},
            ),
            row=1,
            col=1,
        )
    fig.add_trace(
        go.Scatter(
            x=[c - 0.5 for c in crit],
            y=y,
            mode="lines",
            name="critical plane (λ = T_train)",
            line={"color": "white", "dash": "dash"},
        ),
        row=1,
        col=1,
    )
    if fb.intervention is not None:
        e = fb.intervention.estimates
        keys = ("nope_below-rope", "control-rope")
        fig.add_trace(
            go.Bar(
                x=["NoPE below band", "random control"],
                y=[e[k].loss.mean for k in keys],
                error_y={
                    "type": "data",
                    "symmetric": False,
                    "array": [e[k].loss.hi - e[k].loss.mean for k in keys],
                    "arrayminus": [e[k].loss.mean - e[k].loss.lo for k in keys],
                },
                name="Δ loss",
            ),
            row=1,
            col=2,
        )
    fig.update_xaxes(title_text="plane (0 = highest frequency)", row=1, col=1)
    fig.update_yaxes(title_text="layer", autorange="reversed", type="category", row=1, col=1)
    fig.update_layout(
        title=f"Frequency bands ({'queries' if fb.which == 'q' else 'keys'}) — "
        f"{fb.provenance.model}",
        height=440,
        margin={"t": 70, "l": 60, "r": 20, "b": 50},
    )
    return fig
