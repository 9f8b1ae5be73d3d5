"""Sections computed from the spec alone: PE geometry (RoPE's "long-term decay" for this model's frequencies)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import pandas as pd
import plotly.graph_objects as go
import torch

from ropelens.plots.style import style_figure
from ropelens.report.collect import ReportData
from ropelens.report.html import esc, figure_html, table_html
from ropelens.report.section import Section
from ropelens.results.findings import Finding

__all__ = ["DecayCurves", "measure_geometry", "render_geometry"]

MAX_DISTANCE = 32_768
POINTS = 1_500  # per curve: more than a log axis resolves, and the page stays small
_DASH = {"constant": "solid", "roformer_bound": "dash", "gaussian": "dot"}


def log_grid(n: int, points: int = POINTS) -> torch.Tensor:
    """Distances 1 … n, all of them up to ~points/4, then spaced evenly in log (what a log axis can show)."""
    grid = torch.logspace(0, math.log10(n), points, dtype=torch.float64).round().long()
    return torch.unique(torch.cat([torch.arange(1, min(n, points // 4) + 1), grid.clamp(1, n)]))


def _shape_words(shape: str) -> str:
    """A curve shape as the sentence needs it ("decays" → "decaying")."""
    return {"decays": "decaying", "grows": "growing", "flat": "flat", "U-shaped": "U-shaped", "peaked": "peaked",
            "oscillating": "oscillating"}.get(shape, shape)


@dataclass(frozen=True)
class DecayCurves:
    """RoPE's decay curves for each layer kind's frequencies, with each curve's verdict and shape."""

    max_distance: int
    curves: dict[str, tuple[Any, ...]]  # kind -> its (constant, RoFormer bound, Gaussian) curves
    rows: tuple[dict[str, Any], ...]  # one per curve, in that order: verdict, shape, value at the window


def measure_geometry(data: ReportData) -> DecayCurves:
    """Constant-vector decay, RoFormer's bound and the Gaussian expectation for this model's frequencies."""
    from ropelens.analyses.decay import (
        roformer_bound,
        rope_decay_constant,
        rope_gaussian_expectation,
    )
    from ropelens.results.curves import decay_verdict, describe_curve

    spec, n_ctx = data.spec, data.n_ctx
    D = max(min(spec.n_ctx, MAX_DISTANCE), n_ctx)
    curves, rows = {}, []
    for kind, idx in spec.rotary_kinds.items():
        theta = spec.layers[idx[0]].inv_freq
        curves[kind] = (rope_decay_constant(theta, D).normalised(), roformer_bound(theta, D).normalised(),
                        rope_gaussian_expectation(theta, D))
        for c in curves[kind]:
            v = decay_verdict(c)
            upto = c.distance <= n_ctx  # the shape as it is up to the analysis window (oscillations included)
            shape = describe_curve(c.mean[upto], c.distance[upto].double())
            rows.append({"kind": kind, "curve": c.name, "verdict": v.verdict, "shape": shape.shape, "Spearman ρ": v.spearman,
                         "far ÷ near": v.far_near_ratio, f"value at δ = {n_ctx}": float(c.mean[n_ctx]),
                         "description": shape.text})
    return DecayCurves(D, curves, tuple(rows))


def render_geometry(data: ReportData, decay: DecayCurves) -> Section:
    """The decay curves on a log axis, their verdicts, and the finding on constant versus Gaussian q and k."""
    n_ctx, D = data.n_ctx, decay.max_distance
    fig, at_ctx = go.Figure(), {}
    shown = log_grid(D)
    for kind, curves in decay.curves.items():
        for c in curves:
            fig.add_trace(go.Scatter(x=c.distance[shown].numpy(), y=c.mean[shown].numpy(), mode="lines",
                                     line={"dash": _DASH[c.kind], "width": 1.4}, name=f"{kind}: {c.name}",
                                     hovertemplate="δ = %{x}<br>%{y:.3f}<extra>" + esc(kind) + "</extra>"))
        mine = [r for r in decay.rows if r["kind"] == kind]  # constant, bound, Gaussian
        at_ctx[kind] = (mine[0][f"value at δ = {n_ctx}"], mine[0]["shape"], mine[-1]["verdict"])
    # On a log axis shapes take data values and annotations log10 values.
    fig.add_shape(type="line", yref="paper", y0=0, y1=1, xref="x", x0=n_ctx, x1=n_ctx, layer="below",
                  line={"dash": "dash", "color": "#7a8294", "width": 1})
    fig.add_annotation(yref="paper", y=1, xref="x", x=math.log10(n_ctx), text=f"analysis window {n_ctx:,}",
                       showarrow=False, xanchor="left", yanchor="top", font={"size": 11, "color": "#5b6475"})
    fig.update_xaxes(type="log", title_text="distance δ = m − n (tokens)")
    fig.update_yaxes(title_text="logit ÷ logit at δ = 0 (Gaussian: raw)")
    fig.update_layout(title="RoPE \"long-term decay\" for this model's frequencies",
                      legend={"orientation": "h", "y": -0.25, "font": {"size": 11}})
    kinds = list(at_ctx)
    text = "; ".join(f"{k} layers: constant q = k = 1 logits are {_shape_words(at_ctx[k][1])} up to δ = {n_ctx}, where "
                     f"they stand at {at_ctx[k][0]:.2f} of their δ = 0 value" for k in kinds)
    text += f", while for Gaussian q, k the expected logit is 0 at every distance ({at_ctx[kinds[0]][2]})."
    finding = Finding("geometry", "pe-geometry", text[0].upper() + text[1:],
                      {k: {"constant_at_window": round(v[0], 2), "constant": v[1], "gaussian": v[2]}
                       for k, v in at_ctx.items()} | {"n_ctx": n_ctx})
    frame = pd.DataFrame(list(decay.rows))
    body = ("<p class=\"lead\">Barbero et al.: RoPE's decay with distance holds for constant query and key vectors, "
            "not for random ones, whose expected logit is flat. Curves for the frequencies each layer kind applies, "
            f"to δ = {D:,}.</p>" + figure_html(style_figure(fig, height=430))
            + table_html(frame, text_cols=("kind", "curve", "verdict", "shape", "description")))
    return Section("pe-geometry", "PE geometry", body, tables={"geometry": frame},
                   numbers={"verdicts": frame.to_dict("records")}, findings=[finding])
