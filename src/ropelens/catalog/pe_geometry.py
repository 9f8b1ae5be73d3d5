"""Geometry of positional embeddings: ``pe_similarity``, ``ropelens pe-geometry`` and the report's
"PE geometry" section."""

from __future__ import annotations

import argparse
import math
from dataclasses import dataclass
from typing import Any

import pandas as pd
import plotly.graph_objects as go
import torch

from ropelens.analyses.decay import roformer_bound, rope_decay_constant, rope_gaussian_expectation
from ropelens.analyses.pe_geometry import PESimilarity, learned_pe, pe_similarity, sinusoidal_pe
from ropelens.analyses.registry import Analysis, draw
from ropelens.cli.common import (
    Command,
    ModelOptions,
    OutputOptions,
    load_from_args,
    positive_int,
)
from ropelens.devices import require_memory
from ropelens.errors import InputError
from ropelens.plots.curves import decay_curve_figure
from ropelens.plots.pe_geometry import pe_heatmap, pe_similarity_figure
from ropelens.plots.style import style_figure
from ropelens.report.collect import ReportData
from ropelens.report.html import esc, figure_html, table_html
from ropelens.report.registry import SectionSpec
from ropelens.report.section import Section
from ropelens.results.curves import DecayCurve, decay_verdict, describe_curve
from ropelens.results.findings import Finding, fixed, shape_predicate


def options(p: argparse.ArgumentParser) -> None:
    """``ropelens pe-geometry [--model M]``: period and strength of position-embedding
    similarity."""
    ModelOptions.add_to(
        p, flag_help="HF model directory or hub name with learned position embeddings"
    )
    p.add_argument(
        "--n-pos",
        type=positive_int,
        default=512,
        help="positions of the sinusoidal reference (default 512)",
    )
    p.add_argument(
        "--d",
        type=positive_int,
        default=128,
        help="width of the sinusoidal reference (even; default 128)",
    )
    p.add_argument("--base", type=float, default=10000.0, help="sinusoidal base (default 10000)")
    OutputOptions.add_to(p)


def run(args: argparse.Namespace) -> int:
    """Cosine similarity of position embeddings by distance: dominant period and strength

    Sinusoidal reference and, with --model, the learned absolute position table of a model that has
    one (GPT-2, OPT, BERT-like): the by-distance cosine similarity and its dominant period.
    """
    if args.n_pos < 2:
        raise InputError(
            f"--n-pos {args.n_pos}: the similarity by distance needs at least 2 positions: "
            "pass --n-pos 2 or more, e.g. --n-pos 512"
        )
    if args.d % 2:
        raise InputError(
            f"--d {args.d} must be even: sinusoidal embeddings pair a sine and a cosine per "
            f"frequency: e.g. --d {args.d + 1}"
        )
    if not (math.isfinite(args.base) and args.base > 1):
        raise InputError(
            f"--base {args.base:g} must be a finite number > 1 (θ_i = base^(−2i/d) must fall "
            "with i): e.g. --base 10000"
        )
    require_memory(
        12.0 * args.n_pos**2,
        f"--n-pos {args.n_pos:,} (an n × n similarity matrix)",
        "pass a smaller --n-pos",
    )
    # the float64 angles, their sine and cosine and the float32 table: about 24 bytes per (position,
    # dimension)
    require_memory(
        24.0 * args.n_pos * args.d,
        f"--d {args.d:,} at --n-pos {args.n_pos:,} (the n × d sinusoidal table)",
        "pass a smaller --d, e.g. --d 128",
    )
    sims = [
        pe_similarity(
            sinusoidal_pe(args.n_pos, args.d, args.base), name=f"sinusoidal {args.n_pos}x{args.d}"
        )
    ]
    if args.model is not None:
        sims.append(pe_similarity(learned_pe(load_from_args(args)), name=str(args.model)))
    rows = [
        {
            "name": s.name,
            "n_pos": s.n_pos,
            "d_model": s.d_model,
            "period": s.period,
            "period_strength": s.period_strength,
            "period_threshold": s.period_threshold,
        }
        for s in sims
    ]
    output = OutputOptions.from_args(args)
    if output.json:
        return output.emit(rows)
    for r in rows:
        period = f"{r['period']:.1f} tokens" if r["period"] else "none"
        print(
            f"{r['name']}: {r['n_pos']} positions x {r['d_model']} dims, period {period}, "
            f"strength {r['period_strength']:.3f} (threshold {r['period_threshold']:.3f})"
        )
    return 0


MAX_DISTANCE = 32_768


POINTS = 1_500  # per curve: more than a log axis resolves, and the page stays small


_DASH = {"constant": "solid", "roformer_bound": "dash", "gaussian": "dot"}


def log_grid(n: int, points: int = POINTS) -> torch.Tensor:
    """Distances 1 … n, all of them up to ~points/4, then spaced evenly in log (what a log axis can
    show)."""
    grid = torch.logspace(0, math.log10(n), points, dtype=torch.float64).round().long()
    return torch.unique(torch.cat([torch.arange(1, min(n, points // 4) + 1), grid.clamp(1, n)]))


@dataclass(frozen=True)
class DecayCurves:
    """RoPE's decay curves for each layer kind's frequencies, with each curve's verdict and
    shape."""

    max_distance: int
    curves: dict[str, tuple[Any, ...]]  # kind -> its (constant, RoFormer bound, Gaussian) curves
    rows: tuple[
        dict[str, Any], ...
    ]  # one per curve, in that order: verdict, shape, value at the window


def measure(data: ReportData) -> DecayCurves:
    """Constant-vector decay, RoFormer's bound and the Gaussian expectation for this model's
    frequencies."""
    spec, n_ctx = data.spec, data.n_ctx
    D = max(min(spec.n_ctx, MAX_DISTANCE), n_ctx)
    curves, rows = {}, []
    for kind, idx in spec.rotary_kinds.items():
        theta = spec.layers[idx[0]].inv_freq
        curves[kind] = (
            rope_decay_constant(theta, D).normalised(),
            roformer_bound(theta, D).normalised(),
            rope_gaussian_expectation(theta, D),
        )
        for c in curves[kind]:
            v = decay_verdict(c)
            upto = (
                c.distance <= n_ctx
            )  # the shape as it is up to the analysis window (oscillations included)
            shape = describe_curve(c.mean[upto], c.distance[upto].double())
            rows.append(
                {
                    "kind": kind,
                    "curve": c.name,
                    "verdict": v.verdict,
                    "shape": shape.shape,
                    "Spearman ρ": v.spearman,
                    "far ÷ near": v.far_near_ratio,
                    f"value at δ = {n_ctx}": float(c.mean[n_ctx]),
                    "description": shape.text,
                }
            )
    return DecayCurves(D, curves, tuple(rows))


def render(data: ReportData, decay: DecayCurves) -> Section:
    """The decay curves on a log axis, their verdicts, and the finding on constant versus Gaussian q
    and k."""
    n_ctx, D = data.n_ctx, decay.max_distance
    fig, at_ctx = go.Figure(), {}
    shown = log_grid(D)
    for kind, curves in decay.curves.items():
        for c in curves:
            fig.add_trace(
                go.Scatter(
                    x=c.distance[shown].numpy(),
                    y=c.mean[shown].numpy(),
                    mode="lines",
                    line={"dash": _DASH[c.kind], "width": 1.4},
                    name=f"{kind}: {c.name}",
                    hovertemplate="δ = %{x}<br>%{y:.3f}<extra>" + esc(kind) + "</extra>",
                )
            )
        mine = [r for r in decay.rows if r["kind"] == kind]  # constant, bound, Gaussian
        at_ctx[kind] = (mine[0][f"value at δ = {n_ctx}"], mine[0]["shape"], mine[-1]["verdict"])
    # On a log axis shapes take data values and annotations log10 values.
    fig.add_shape(
        type="line",
        yref="paper",
        y0=0,
        y1=1,
        xref="x",
        x0=n_ctx,
        x1=n_ctx,
        layer="below",
        line={"dash": "dash", "color": "#7a8294", "width": 1},
    )
    fig.add_annotation(
        yref="paper",
        y=1,
        xref="x",
        x=math.log10(n_ctx),
        text=f"analysis window {n_ctx:,}",
        showarrow=False,
        xanchor="left",
        yanchor="top",
        font={"size": 11, "color": "#5b6475"},
    )
    fig.update_xaxes(type="log", title_text="distance δ = m − n (tokens)")
    fig.update_yaxes(title_text="logit ÷ logit at δ = 0 (Gaussian: raw)")
    fig.update_layout(
        title='RoPE "long-term decay" for this model\'s frequencies',
        legend={"orientation": "h", "y": -0.25, "font": {"size": 11}},
    )
    kinds = list(at_ctx)
    text = "; ".join(
        f"{k} layers: constant q = k = 1 logits {shape_predicate(at_ctx[k][1], plural=True)} up "
        f"to δ = {n_ctx:,} tokens, where they stand at {fixed(at_ctx[k][0])} of their δ = 0 "
        "value"
        for k in kinds
    )
    text += (
        ", while for Gaussian q, k the expected logit is 0 at every distance (the measured "
        f"curve {shape_predicate(at_ctx[kinds[0]][2])})."
    )
    finding = Finding(
        "geometry",
        "pe-geometry",
        text[0].upper() + text[1:],
        {
            k: {"constant_at_window": round(v[0], 2), "constant": v[1], "gaussian": v[2]}
            for k, v in at_ctx.items()
        }
        | {"n_ctx": n_ctx},
    )
    frame = pd.DataFrame(list(decay.rows))
    body = (
        '<p class="lead">Barbero et al.: RoPE\'s decay with distance holds for constant query '
        "and key vectors, "
        "not for random ones, whose expected logit is flat. Curves for the frequencies each "
        "layer kind applies, "
        f"to δ = {D:,}.</p>"
        + figure_html(style_figure(fig, height=430))
        + table_html(
            frame,
            text_cols=("kind", "curve", "verdict", "shape", "description"),
            summary="The verdict and shape of each curve",
            csv="geometry",
        )
    )
    return Section(
        "pe-geometry",
        "PE geometry",
        body,
        tables={"geometry": frame},
        numbers={"verdicts": frame.to_dict("records")},
        findings=[finding],
    )


ANALYSIS = Analysis(
    "pe-geometry",
    pe_similarity,
    PESimilarity,
    draw(PESimilarity, figure=pe_similarity_figure, heatmap=pe_heatmap)
    + draw(DecayCurve, figure=decay_curve_figure),
    Command("pe-geometry", run, options),
    SectionSpec(
        "pe-geometry",
        "PE geometry",
        render,
        measure,
        summary="RoPE's \"long-term decay\" for this model's frequencies: constant versus "
        "Gaussian q and k.",
    ),
    summary="Similarity of positional embeddings by distance: learned, sinusoidal, and RoPE's "
    "decay.",
)
