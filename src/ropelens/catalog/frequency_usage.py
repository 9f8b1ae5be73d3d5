"""Frequency usage: ``frequency_usage``, ``ropelens frequency-usage`` and the report's "Frequency
usage" section."""

from __future__ import annotations

import argparse
import math
from typing import Any

import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from ropelens.analyses.frequency_usage import FrequencyUsage, frequency_usage
from ropelens.analyses.registry import Analysis, draw
from ropelens.cli.common import (
    Command,
    CorpusCommand,
    load_from_args,
)
from ropelens.plots.frequency_usage import usage_figure, usage_heatmap
from ropelens.plots.style import category_layers, style_figure
from ropelens.report.collect import ReportData
from ropelens.report.html import figure_html
from ropelens.report.registry import SectionSpec
from ropelens.report.section import Section


def options(p: argparse.ArgumentParser) -> None:
    """``ropelens frequency-usage [MODEL]``: frequency usage per layer and band."""
    CorpusCommand.add_to(p, tokens=32_768, n_ctx=512, save="FrequencyUsage JSON")
    p.add_argument(
        "--source",
        choices=("pre", "post"),
        default="pre",
        help="measure the queries and keys entering the rotation (pre, the default) or as the "
        "attention scores them (post: after the rotation and any plane ablation)",
    )


def run(args: argparse.Namespace) -> int:
    """Per-plane norms of queries and keys over a corpus (energy per band, per layer)

    Mean 2-norm of every RoPE plane of the queries and keys over a corpus; prints each band's share
    of the energy per layer (sink positions excluded; the rest band holds the dims RoPE leaves
    unrotated).
    """
    run = CorpusCommand.from_args(args)
    corpus, kw = run.prepare(frequency_usage)
    u = frequency_usage(load_from_args(args), corpus, source=args.source, **kw)
    used = run.measured(u)
    run.output.save_result(u)
    bands = run.analysis.parsed_bands()
    names, q = u.band_share(bands, "q", "no_sink")
    _, k = u.band_share(bands, "k", "no_sink")
    q, k = q.nanmean(1), k.nanmean(1)  # heads averaged (heads a narrower layer lacks are NaN)
    if run.output.json:
        prov = u.provenance
        return run.output.emit(
            {
                "model": prov.model,
                "corpus": prov.corpus,
                **used,
                "layers": list(u.layers),
                "bands": list(names),
                "scope": "no_sink",
                "source": u.source,
                "measured_as": u.measured_as,
                "q_energy_share": q.tolist(),
                "k_energy_share": k.tolist(),
                "q_norm": u.norm("q", "no_sink").nanmean(1).tolist(),
                "k_norm": u.norm("k", "no_sink").nanmean(1).tolist(),
                "q_unrotated_norm": u.unrotated_norm("q", "no_sink").nanmean(1).tolist(),
                "k_unrotated_norm": u.unrotated_norm("k", "no_sink").nanmean(1).tolist(),
            }
        )
    prov = u.provenance
    print(
        f"{prov.model}: {prov.n_tokens:,} tokens of {prov.corpus} in {prov.n_windows} windows of "
        f"{prov.n_ctx}; share of energy per band, heads averaged, sink excluded; "
        f"{u.measured_as}"
    )
    if "rest" in names:
        print("rest: planes no band claims and the dims RoPE leaves unrotated")
    short = [
        n.split(" (")[0] for n in names
    ]  # "Q1 (highest)" → "Q1"; the order says which end is which
    # two spaces at least between columns: a label as wide as its column ran into the next one
    w = max(7, *(len(n) + 4 for n in short))
    print(
        "layer  "
        + "".join(f"{'q ' + n:>{w}}" for n in short)
        + "  "
        + "".join(f"{'k ' + n:>{w}}" for n in short)
    )
    for i, L in enumerate(u.layers):
        print(
            f"{L:5d}  "
            + "".join(f"{float(x):{w}.3f}" for x in q[i])
            + "  "
            + "".join(f"{float(x):{w}.3f}" for x in k[i])
        )
    return 0


def showcase_layers(data: ReportData) -> list[int]:
    """Layers drawn head by head: first, middle and last, plus the first of any layer kind not yet
    in."""
    layers, spec = list(data.layers), data.spec
    picks = (
        [layers[0], layers[-1]]
        if data.settings.get("quick")
        else [layers[0], layers[len(layers) // 2], layers[-1]]
    )
    for kind in spec.rotary_kinds:
        mine = [L for L in layers if spec.layers[L].kind == kind]
        if mine and not any(spec.layers[p].kind == kind for p in picks):
            picks.append(mine[0])
    return sorted(set(picks))


def _energy_figure(data: ReportData) -> tuple[go.Figure, pd.DataFrame]:
    u, bands = data.usage, data.band_stats.bands
    fig = make_subplots(rows=1, cols=2, subplot_titles=["queries", "keys"], horizontal_spacing=0.1)
    frames = []
    for col, w in ((1, "q"), (2, "k")):
        for scope in ("all", "no_sink"):
            names, share = u.band_share(bands, w, scope)  # [L, H, B]
            L, H, B = share.shape
            idx = pd.MultiIndex.from_product(
                [list(u.layers), range(H), names], names=["layer", "head", "band"]
            )
            have = (
                u.present(w)[..., :1].expand(L, H, B).reshape(-1).numpy()
            )  # heads a layer lacks: no rows
            frames.append(
                pd.DataFrame(
                    {"which": w, "scope": scope, "energy_share": share.reshape(-1).numpy()},
                    index=idx,
                ).reset_index()[have]
            )
            if scope == "no_sink":
                fig.add_trace(
                    go.Heatmap(
                        z=share.nanmean(1).numpy(),
                        x=list(names),
                        y=list(u.layers),
                        coloraxis="coloraxis",
                        hovertemplate="layer %{y} · %{x}<br>energy share %{z:.3f}<extra>"
                        + w
                        + "</extra>",
                    ),
                    row=1,
                    col=col,
                )
    fig.update_yaxes(autorange="reversed")
    fig.update_yaxes(title_text="layer", col=1)
    category_layers(fig, len(u.layers))
    fig.update_layout(
        coloraxis={"colorscale": "Viridis", "cmin": 0, "cmax": 1, "colorbar": {"title": "share"}},
        title="Share of squared norm (energy) per band, heads averaged, sink positions excluded"
        + ("; rest holds the unrotated dims" if u.has_unrotated else ""),
    )
    cols = ["which", "scope", "layer", "head", "band", "energy_share"]
    return style_figure(fig, height=max(300, 12 * len(u.layers) + 140)), pd.concat(
        frames, ignore_index=True
    )[cols]


def _sink_figure(data: ReportData, ratios: dict[str, Any]) -> go.Figure:
    fig = go.Figure()
    for w, name in (("k", "keys"), ("q", "queries")):
        fig.add_trace(
            go.Scatter(
                x=list(data.usage.layers),
                y=ratios[w].tolist(),
                mode="lines+markers",
                name=name,
                hovertemplate="layer %{x}<br>sink ÷ other = %{y:.2f}×<extra>" + name + "</extra>",
            )
        )
    fig.add_shape(
        type="line",
        xref="paper",
        x0=0,
        x1=1,
        yref="y",
        y0=1,
        y1=1,
        layer="below",
        line={"color": "#9aa1ad", "width": 1},
    )
    fig.update_yaxes(type="log", title_text="sink ÷ other positions", tickvals=_log_ticks(ratios))
    fig.update_xaxes(title_text="layer")
    fig.update_layout(
        title="Mean per-plane norm at the sink position relative to all other positions",
        legend={"orientation": "h", "y": 1.12, "x": 1, "xanchor": "right"},
    )
    return style_figure(fig, height=320)


def _layer_plane(u, scope: str) -> go.Figure:
    fig = style_figure(usage_figure(u, scope), height=max(320, 11 * len(u.layers) + 140))
    category_layers(fig, len(u.layers))
    return fig


def _log_ticks(ratios: dict[str, Any]) -> list[float]:
    """1-2-5 ticks covering the ratios (plotly labels every minor step of a short log axis)."""
    lo = min(float(r.min()) for r in ratios.values())
    hi = max(float(r.max()) for r in ratios.values())
    lo, hi = max(min(lo, 1.0), 1e-6), max(hi, 1.0)
    ticks = [
        m * 10.0**e
        for e in range(math.floor(math.log10(lo)), math.ceil(math.log10(hi)) + 1)
        for m in (1, 2, 5)
    ]
    return [t for t in ticks if lo / 2 <= t <= hi * 2]


def render(data: ReportData) -> Section:
    """Layer × plane and head × plane norm heatmaps, band energy shares and sink ratios."""
    u = data.usage
    prov = u.provenance
    sink = "The first position" if u.n_sink == 1 else f"The first {u.n_sink} positions"
    intro = (
        f'<p class="lead">Mean 2-norm of each rotary plane of the {u.measured_as} '
        f"(Barbero et al.), over {prov.n_tokens:,} tokens in {prov.n_windows} windows of "
        f"{data.n_ctx}; "
        f"plane 0 is the highest frequency. {sink} of each window (BOS, where attention sinks "
        "sit) has norms unlike "
        'the rest (see <a href="#sink-norms">sink norms</a>), so each map is shown with and '
        "without it.</p>"
    )
    parts = [
        intro,
        "<h3>Layer × plane</h3>",
        figure_html(_layer_plane(u, "all")),
        figure_html(_layer_plane(u, "no_sink")),
        "<h3>Head × plane, selected layers (sink excluded)</h3>",
    ]
    for L in showcase_layers(data):
        fig = style_figure(usage_figure(u, "no_sink", layer=L), height=300)
        fig.update_layout(
            title_text=f"Layer {L} ({data.spec.layers[L].kind}): head × plane, sink positions "
            "excluded"
        )
        fig.update_yaxes(dtick=1)  # one tick per head
        parts.append(figure_html(fig))
    energy_fig, energy = _energy_figure(data)
    parts += ["<h3>Energy per band</h3>", figure_html(energy_fig)]
    findings = u.findings(data.band_stats.bands)
    numbers: dict[str, Any] = {"energy": findings[0].values}
    ratios = u.sink_ratios()
    if ratios is not None:
        parts += ['<h3 id="sink-norms">Sink norms</h3>', figure_html(_sink_figure(data, ratios))]
        numbers["sink_ratio"] = {w: [round(float(x), 4) for x in r] for w, r in ratios.items()}
    return Section(
        "frequency-usage",
        "Frequency usage",
        "".join(parts),
        tables={"frequency_usage": u.to_frame(), "energy": energy},
        numbers=numbers,
        findings=findings,
    )


ANALYSIS = Analysis(
    "frequency-usage",
    frequency_usage,
    FrequencyUsage,
    draw(FrequencyUsage, figure=usage_figure, heatmap=usage_heatmap),
    Command("frequency-usage", run, options, distributed=True),
    SectionSpec(
        "frequency-usage",
        "Frequency usage",
        render,
        summary="Per-plane query and key norms over the corpus, by band.",
    ),
    summary="Per-plane query and key norms per layer and head over a corpus.",
)
