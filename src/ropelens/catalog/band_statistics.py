"""Band statistics of attention logits: ``band_statistics``, ``ropelens band-statistics`` and the
report's band decomposition section."""

from __future__ import annotations

import argparse

import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from ropelens.analyses.band_statistics import BandStatistics, band_statistics
from ropelens.analyses.registry import Analysis, draw
from ropelens.cli.common import (
    Command,
    CorpusCommand,
    load_from_args,
    positive_int,
)
from ropelens.plots.band_statistics import band_statistics_figure, band_statistics_heatmap
from ropelens.plots.style import bands_in_words, category_layers, style_figure
from ropelens.report.collect import ReportData
from ropelens.report.html import esc, figure_html, table_html
from ropelens.report.registry import SectionSpec
from ropelens.report.section import Section
from ropelens.results import findings as fnd


def options(p: argparse.ArgumentParser) -> None:
    """``ropelens band-statistics [MODEL]``: the band decomposition's statistics over a corpus."""
    CorpusCommand.add_to(p, tokens=32_768, n_ctx=512, save="BandStatistics JSON")
    p.add_argument(
        "--jsd",
        action="store_true",
        help="also the JS divergence of each band-only pattern (slower)",
    )
    p.add_argument(
        "--batch-size",
        type=positive_int,
        default=4,
        metavar="N",
        help="windows per forward (default: 4)",
    )


def run(args: argparse.Namespace) -> int:
    """Band decomposition statistics over a corpus (margin, variance, |logit| shares)

    Streams the exact per-band decomposition of every attention logit over a corpus and prints, per
    layer and band (heads averaged), the share of the attended-key margin, of the within-query logit
    variance and of the mean |logit|, and band-only top-1 agreement.
    """
    run = CorpusCommand.from_args(args)
    corpus, kw = run.prepare(band_statistics)
    st = band_statistics(
        load_from_args(args), corpus, **kw, batch_size=args.batch_size, jsd=args.jsd
    )
    used = run.measured(st)
    run.output.save_result(st)
    df = (
        st.to_frame()
        .drop(columns="head")
        .groupby(["layer", "band"], sort=False)
        .mean()
        .reset_index()
    )
    if run.output.json:
        return run.output.emit(
            {
                "model": st.provenance.model,
                **used,
                "bands": list(st.band_names),
                "rows": df.to_dict("records"),
            }
        )
    prov = st.provenance
    print(
        f"{prov.model}: {prov.n_tokens:,} tokens of {prov.corpus} in {prov.n_windows} windows of "
        f"{prov.n_ctx}; bands {st.bands.describe()}, heads averaged"
    )
    cols = [c for c in ("margin_share", "var_share", "abs_share", "top1", "jsd") if c in df.columns]
    # n/a: a band with no plane in that layer, whose band-only agreement is not measurable
    print(df[["layer", "band", *cols]].to_string(index=False, float_format="%.3f", na_rep="n/a"))
    return 0


_METRICS = (
    ("margin_share", "margin share"),
    ("var_share", "variance share"),
    ("abs_share", "|logit| share"),
    ("top1", "band-only top-1"),
)


def _per_head_figure(data: ReportData) -> go.Figure:
    st = data.band_stats
    names = list(st.band_names)
    B, layers = len(names), list(st.layers)
    fig = make_subplots(
        rows=len(_METRICS),
        cols=B,
        shared_xaxes=True,
        shared_yaxes=True,
        column_titles=names,
        horizontal_spacing=0.012,
        vertical_spacing=0.035,
    )
    for r, (metric, title) in enumerate(_METRICS, start=1):
        z = getattr(st, metric)()  # [L, H, B]
        axis = "coloraxis2" if metric == "top1" else "coloraxis"
        for b in range(B):
            fig.add_trace(
                go.Heatmap(
                    z=z[..., b].numpy(),
                    x=list(range(z.shape[1])),
                    y=layers,
                    coloraxis=axis,
                    hovertemplate=f"layer %{{y}} head %{{x}}<br>{esc(names[b])}<br>{title} "
                    "%{z:.3f}<extra></extra>",
                ),
                row=r,
                col=b + 1,
            )
    fig.update_yaxes(autorange="reversed")
    for r, (_, title) in enumerate(_METRICS, start=1):
        fig.update_yaxes(
            title_text=f"<b>{title}</b><br>layer", title_font={"size": 11}, row=r, col=1
        )
    fig.update_xaxes(title_text="head", row=len(_METRICS))
    category_layers(fig, len(layers))
    fig.update_xaxes(dtick=1)
    panel = max(120, 7 * len(layers))
    fig.update_layout(
        title="Per head: each band's share of the attention logit, and how often the band alone "
        "picks the attended key",
        coloraxis={
            "colorscale": "RdBu",
            "cmin": -1,
            "cmax": 1,
            "cmid": 0,
            "colorbar": {"title": "share", "len": 0.72, "y": 1, "yanchor": "top", "x": 1.06},
        },
        coloraxis2={
            "colorscale": "Viridis",
            "cmin": 0,
            "cmax": 1,
            "colorbar": {"title": "top-1", "len": 0.24, "y": 0, "yanchor": "bottom", "x": 1.06},
        },
    )
    return style_figure(fig, height=len(_METRICS) * panel + 130)


def _tightness_figure(data: ReportData) -> go.Figure:
    t = data.band_stats.tightness().nanmean(1)  # [L, P]; NaN past a layer's own heads and planes
    fig = go.Figure(
        go.Heatmap(
            z=t.numpy(),
            x=list(range(t.shape[1])),
            y=list(data.band_stats.layers),
            colorscale="RdBu",
            zmid=0,
            zmin=-1,
            zmax=1,
            colorbar={"title": "tightness"},
            hovertemplate="layer %{y} plane %{x}<br>Σ term ÷ Σ ‖q‖‖k‖ = %{z:.3f}<extra></extra>",
        )
    )
    fig.update_yaxes(autorange="reversed", title_text="layer")
    category_layers(fig, len(data.band_stats.layers))
    fig.update_xaxes(title_text="plane (0 = highest frequency)")
    fig.update_layout(
        title="Cauchy–Schwarz tightness at the attended key, heads averaged (1 = q and k aligned)"
    )
    return style_figure(fig, height=max(300, 11 * len(data.band_stats.layers) + 120))


def _top_heads(data: ReportData, n: int = 10) -> pd.DataFrame:
    st = data.band_stats
    frame = st.to_frame()
    first = (
        frame[frame["band"] == st.band_names[0]]
        .sort_values("margin_share", ascending=False)
        .head(n)
    )
    first = first.assign(
        head=[
            fnd.head_name(int(L), int(h))
            for L, h in zip(first["layer"], first["head"], strict=True)
        ]
    )
    return first[["head", "margin_share", "var_share", "abs_share", "top1"]].rename(
        columns={
            "margin_share": "margin share",
            "var_share": "variance share",
            "abs_share": "|logit| share",
            "top1": "band-only top-1",
        }
    )


def render(data: ReportData) -> Section:
    """Band shares of the logit per layer and per head, band-only agreement and plane tightness."""
    st = data.band_stats
    prov = st.provenance
    sampled = (
        ""
        if prov.n_windows == data.n_windows
        else f" ({prov.n_windows} of the {data.n_windows} windows, evenly spread)"
    )
    intro = (
        '<p class="lead">Every attention logit is an exact sum of one term per band '
        f"({esc(bands_in_words(st.bands))}). "
        f"Over {prov.n_tokens:,} tokens{sampled}: each band's share of the mean |logit|, of the "
        "logit's variance "
        "across keys of a query, and of the <i>margin</i> of the key the model attends to most "
        "(its logit minus "
        "the mean over the other allowed keys); and how often the band's logits alone pick that "
        "key.</p>"
    )
    findings = st.findings()
    per_layer = style_figure(band_statistics_figure(st), height=max(360, 11 * len(st.layers) + 150))
    per_layer.update_yaxes(autorange="reversed")  # every panel, not only the first
    category_layers(per_layer, len(st.layers))
    parts = [
        intro,
        "<h3>Per layer (heads averaged)</h3>",
        figure_html(per_layer),
        "<h3>Per head</h3>",
        figure_html(_per_head_figure(data)),
        f"<h3>Heads taking the most margin from {esc(st.band_names[0])}</h3>",
        table_html(
            _top_heads(data),
            text_cols=("head",),
            summary="The heads with the largest margin share per band",
            csv="band_statistics",
        ),
        "<h3>Plane tightness</h3>",
        figure_html(_tightness_figure(data)),
    ]
    t = st.tightness()
    L, H, P = t.shape
    tight_frame = pd.DataFrame(
        {
            "layer": [st.layers[i] for i in range(L) for _ in range(H * P)],
            "head": [h for _ in range(L) for h in range(H) for _ in range(P)],
            "plane": list(range(P)) * (L * H),
            "tightness": t.reshape(-1).numpy(),
        }
    )
    # layers of different widths (Gemma 4): no rows past a layer's own heads and planes
    tight_frame = tight_frame[
        st.spec.present(st.layers, "head", "plane").reshape(-1).numpy()
    ].reset_index(drop=True)
    numbers = {f.key: f.values for f in findings}
    numbers["windows"] = list(data.band_windows)
    return Section(
        "band-statistics",
        "Band decomposition of attention",
        "".join(parts),
        tables={"band_statistics": st.to_frame(), "tightness": tight_frame},
        numbers=numbers,
        findings=findings,
    )


ANALYSIS = Analysis(
    "band-statistics",
    band_statistics,
    BandStatistics,
    draw(BandStatistics, figure=band_statistics_figure, heatmap=band_statistics_heatmap),
    Command("band-statistics", run, options, distributed=True),
    SectionSpec(
        "band-statistics",
        "Band decomposition of attention",
        render,
        summary="Each band's share of the attended key's margin, of the logit variance and of "
        "|logit|.",
    ),
    summary="Each band's share of the attention logits over a corpus: margin, variance, |logit|, "
    "top-1 agreement.",
)
