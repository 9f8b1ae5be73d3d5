"""Attention by query–key distance: ``attention_by_distance``, ``ropelens attention-by-distance``
and the report's section."""

from __future__ import annotations

import argparse

import pandas as pd

from ropelens.analyses.attention_by_distance import AttentionByDistance, attention_by_distance
from ropelens.analyses.registry import Analysis, draw
from ropelens.cli.common import (
    Command,
    CorpusCommand,
    load_from_args,
)
from ropelens.errors import InputError
from ropelens.plots.attention_by_distance import distance_figure
from ropelens.plots.curves import curve_line
from ropelens.plots.style import style_figure
from ropelens.report.collect import ReportData
from ropelens.report.html import esc, figure_html, table_html
from ropelens.report.registry import SectionSpec
from ropelens.report.section import Measured, Section
from ropelens.report.steps import rerun
from ropelens.results.curves import ByDistance


def options(p: argparse.ArgumentParser) -> None:
    """``ropelens attention-by-distance [MODEL]``: band logits and attention by query-key
    distance."""
    CorpusCommand.add_to(p, tokens=4_096, n_ctx=512, save="AttentionByDistance JSON")
    p.add_argument(
        "--keep-bos",
        action="store_true",
        help="keep BOS as a key (by default it is left out of the bins)",
    )


def run(args: argparse.Namespace) -> int:
    """Mean band logit and attention probability by query-key distance (U-shapes, their cause)

    Per layer: mean logit of each band and of the whole score, and mean attention probability, in
    log-spaced distance bins; each curve described as it is (decay, flat, U-shaped, peaked,
    oscillating), and the band that makes a U-shaped logit rise again.
    """
    run = CorpusCommand.from_args(args)
    shortest = (
        3 if args.keep_bos else 4
    )  # distances 0, 1 and 2: the three bins a curve's shape needs
    if args.n_ctx < shortest:
        raise InputError(
            f"--n-ctx {args.n_ctx} is too short for distance curves: they need three distance "
            f"bins (δ = 0, 1, 2{'' if args.keep_bos else ' between non-BOS tokens'}): use "
            f"--n-ctx {shortest} or more"
        )
    corpus, kw = run.prepare(attention_by_distance)
    r = attention_by_distance(load_from_args(args), corpus, **kw, n_sink=0 if args.keep_bos else 1)
    used = run.measured(r)
    run.output.save_result(r)
    shapes = r.shapes()
    if run.output.json:
        return run.output.emit({**used, "shapes": shapes.to_dict("records")})
    full = shapes[shapes.curve == "logit"]
    print(full[["layer", "kind", "shape", "text"]].to_string(index=False))
    return 0


def measure(data: ReportData) -> Measured:
    """Mean band logit and attention probability by query–key distance, on a few of the report's
    windows."""
    return rerun(data, attention_by_distance)


def render(_data: ReportData, distance: Measured) -> Section:
    """Mean logit per band and attention probability by query–key distance; U-shapes and their
    cause."""
    r, n_ctx, n_win = distance.value, distance.n_ctx, distance.n_windows
    shapes = r.shapes()
    finding = r.findings()[0]  # the summary over layers; the per-layer sentences follow it
    text, counts = finding.text, finding.values["full_logit_shapes"]
    table = shapes[["layer", "kind", "curve", "shape", "text"]]
    body = (
        '<p class="lead">HoPE (Chen et al. 2025): attention decays locally but can turn U-shaped '
        "globally "
        "through its low-frequency components. Mean band logit and attention probability in "
        "log-spaced distance "
        "bins; each curve is described as it is (decay, flat, U-shaped, peaked, oscillating). "
        f"Measured on {n_win} "
        f"window(s) of {n_ctx} tokens.</p><p>{esc(text)}</p>"
        + figure_html(_styled(distance_figure(r)))
        + table_html(
            table,
            text_cols=("kind", "curve", "shape", "text"),
            summary="The shape of every curve, per layer, described",
            csv="distance_shapes",
        )
    )
    return Section(
        "attention-by-distance",
        "Attention by distance",
        body,
        tables={"distance_shapes": pd.DataFrame(shapes)},
        numbers={"full_logit_shapes": counts},
        findings=[finding],
    )


ANALYSIS = Analysis(
    "attention-by-distance",
    attention_by_distance,
    AttentionByDistance,
    draw(AttentionByDistance, figure=distance_figure) + draw(ByDistance, line=curve_line),
    Command("attention-by-distance", run, options, distributed=True),
    SectionSpec(
        "attention-by-distance",
        "Attention by distance",
        render,
        measure,
        summary="Mean band logit and attention probability by query–key distance, with U-shapes "
        "and their cause.",
    ),
    summary="Mean band logit and attention probability by query–key distance, each curve's shape.",
)


def _styled(fig):
    """The report's look, keeping the figure's own height and top margin (its rows need them)."""
    height, top = fig.layout.height, fig.layout.margin.t
    style_figure(fig, height=height)
    fig.update_layout(margin={"t": top})
    return fig
