"""What an intervention changes, drawn: band energy and band |logit| share, with minus without,
and heads of each kind per layer, without and with."""

from __future__ import annotations

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from ropelens.analyses.intervention_effect import CONDITIONS, HEAD_GROUPS, InterventionEffect
from ropelens.plots.style import style_figure

__all__ = ["effect_figure"]

_GROUP_COLOURS = dict(zip(HEAD_GROUPS, ("#2f5fd0", "#d0842f", "#7a7a7a"), strict=True))


def _change_heatmap(effect: InterventionEffect, what: str, label: str, x: float) -> go.Heatmap:
    d = effect.change(what).numpy()
    bound = max(float(abs(d[d == d]).max()) if (d == d).any() else 0.0, 1e-9)
    return go.Heatmap(
        z=d,
        x=effect.band_names,
        y=[str(L) for L in effect.layers],
        zmin=-bound,
        zmax=bound,
        colorscale="RdBu_r",
        colorbar={"x": x, "thickness": 12, "len": 0.9, "title": {"text": "Δ"}},
        hovertemplate=f"layer %{{y}} band %{{x}}<br>{label} change: %{{z:+.4f}}<extra></extra>",
    )


def effect_figure(effect: InterventionEffect) -> go.Figure:
    """Layer × band change of query energy share and of |logit| share (with − without), and heads
    of each kind per layer without (solid) and with (hatched) the intervention."""
    fig = make_subplots(
        rows=1,
        cols=3,
        subplot_titles=[
            "query energy share: with − without",
            "band |logit| share: with − without",
            "heads of each kind per layer",
        ],
        horizontal_spacing=0.12,
    )
    fig.add_trace(_change_heatmap(effect, "energy", "energy share", 0.255), row=1, col=1)
    fig.add_trace(_change_heatmap(effect, "logit_share", "|logit| share", 0.625), row=1, col=2)
    counts = effect.head_counts()
    for condition in CONDITIONS:
        for kind, colour in _GROUP_COLOURS.items():
            part = counts[(counts.condition == condition) & (counts.kind == kind)]
            fig.add_trace(
                go.Bar(
                    x=part.heads,
                    y=[f"{L} {condition}" for L in part.layer],
                    orientation="h",
                    name=f"{kind} ({condition})",
                    marker={
                        "color": colour,
                        "pattern": {"shape": "/" if condition == "with" else ""},
                    },
                    legendgroup=kind,
                    hovertemplate=f"layer %{{customdata}} {condition}: %{{x}} {kind} heads"
                    "<extra></extra>",
                    customdata=list(part.layer),
                ),
                row=1,
                col=3,
            )
    fig.update_layout(barmode="stack")
    fig.update_yaxes(title_text="layer", type="category", autorange="reversed", row=1, col=1)
    fig.update_yaxes(type="category", autorange="reversed", row=1, col=2)
    order = [f"{L} {c}" for L in effect.layers for c in CONDITIONS]
    fig.update_yaxes(
        type="category", categoryorder="array", categoryarray=order[::-1], row=1, col=3
    )
    fig.update_xaxes(title_text="band", row=1, col=1)
    fig.update_xaxes(title_text="band", row=1, col=2)
    fig.update_xaxes(title_text="heads", row=1, col=3)
    height = max(420, 40 + 18 * 2 * len(effect.layers))
    style_figure(fig, height=height)
    fig.update_layout(title_text=f"Under {effect.under}: what changes")
    return fig
