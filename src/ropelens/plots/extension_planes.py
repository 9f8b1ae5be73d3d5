"""Context extension drawn: wavelength per plane before and after a method, and the LongRoPE
search."""

from __future__ import annotations

import math
from collections.abc import Sequence

import plotly.graph_objects as go

from ropelens.analyses.extension_planes import ExtensionPlanes, LongRopeSearch
from ropelens.errors import InputError
from ropelens.plots.style import readable_log_axes

__all__ = ["compare_figure", "longrope_search_figure", "extension_planes_figure"]


def extension_planes_figure(view: ExtensionPlanes) -> go.Figure:
    """Wavelength before and after per plane, with the original and target context as lines."""
    return compare_figure([view])


def longrope_search_figure(search: LongRopeSearch) -> go.Figure:
    """Best and mean perplexity per generation, with PI and YaRN as horizontal lines."""
    gens = [h["generation"] for h in search.history]
    fig = go.Figure(
        [
            go.Scatter(x=gens, y=[h[k] for h in search.history], name=k, mode="lines+markers")
            for k in ("best", "mean")
        ]
    )
    for name, ppl in search.baselines.items():
        fig.add_hline(y=ppl, line_dash="dash", annotation_text=f"{name} {ppl:.4g}")
    fig.update_layout(
        title=f"LongRoPE factor search, {search.original_ctx} → {search.target_len} tokens",
        xaxis_title="generation",
        yaxis_title="perplexity (search windows)",
    )
    return fig


def compare_figure(views: Sequence[ExtensionPlanes]) -> go.Figure:
    """Wavelength per plane (log scale) before and after each view's method, with the context
    lines."""
    if not views:
        raise InputError(
            "views is empty: pass one ExtensionPlanes per method, e.g. [extension_planes(lr, "
            "Linear(4), L, 4 * L)]"
        )
    fig = go.Figure()
    v0 = views[0]
    planes = list(range(len(v0.categories)))
    fig.add_trace(
        go.Scatter(
            x=planes,
            y=v0.wavelength_before.tolist(),
            name="before (trained)",
            mode="lines+markers",
            line={"color": "black", "dash": "dot"},
        )
    )
    for v in views:
        fig.add_trace(
            go.Scatter(
                x=planes,
                y=v.wavelength_after.tolist(),
                name=v.label,
                mode="lines+markers",
                text=list(v.categories),
                hovertemplate="plane %{x}: λ=%{y:.4g} (%{text})",
            )
        )
    for ctx, name in ((v0.original_ctx, "original context"), (v0.target_ctx, "target context")):
        # On a log axis shapes take data values but annotations take log10 values (add_hline's
        # own annotation would land at 10^ctx).
        fig.add_shape(
            type="line",
            xref="paper",
            x0=0,
            x1=1,
            yref="y",
            y0=ctx,
            y1=ctx,
            line={"dash": "dash", "color": "#7a8294", "width": 1},
        )
        fig.add_annotation(
            xref="paper",
            x=0,
            yref="y",
            y=math.log10(ctx),
            text=f"{name} {ctx:,}",
            showarrow=False,
            xanchor="left",
            yanchor="bottom",
            font={"size": 11},
        )
    fig.update_layout(
        title=f"Wavelength per plane, layer {v0.layer}: {v0.original_ctx} → {v0.target_ctx} tokens",
        xaxis_title="plane (0 = highest frequency)",
        yaxis_title="wavelength 2π/θ (tokens)",
        yaxis_type="log",
    )
    return readable_log_axes(fig)
