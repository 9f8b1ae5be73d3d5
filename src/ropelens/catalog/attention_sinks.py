"""Attention sinks by band: ``attention_sinks``, ``ropelens attention-sinks`` and the report's
section."""

from __future__ import annotations

import argparse

from ropelens.analyses.attention_sinks import EPSILON, AttentionSinks, attention_sinks
from ropelens.analyses.registry import Analysis, draw
from ropelens.cli.common import (
    Command,
    CorpusCommand,
    load_from_args,
    relay,
    signature_default,
)
from ropelens.plots.attention_sinks import sinks_figure
from ropelens.plots.style import style_figure
from ropelens.report.collect import ReportData
from ropelens.report.html import esc, figure_html, table_html
from ropelens.report.registry import SectionSpec
from ropelens.report.section import Measured, Section
from ropelens.report.steps import rerun


def options(p: argparse.ArgumentParser) -> None:
    """``ropelens attention-sinks [MODEL]``: attention to position 0 per head, and the bands behind
    it."""
    CorpusCommand.add_to(p, tokens=4_096, n_ctx=256, save="AttentionSinks JSON")
    epsilon = signature_default(attention_sinks, "epsilon")
    p.add_argument(
        "--epsilon",
        type=float,
        default=epsilon,
        help=f"sink threshold on mean attention, in (0, 1] (default: {epsilon:g})",
    )


def run(args: argparse.Namespace) -> int:
    """Attention sinks per head and the bands that make position 0 attractive

    Per layer and head: mean attention to position 0 (BOS), whether the head sinks (mean above
    epsilon, Gu et al. 2024), the band decomposition of the sink logit and the sink key's norm.
    """
    run = CorpusCommand.from_args(args)
    corpus, kw = run.prepare(attention_sinks)
    r = relay(attention_sinks, load_from_args(args), corpus, **kw, epsilon=args.epsilon)
    used = run.measured(r)
    return run.output.save_and_show(r, r.layers_frame(), "layers", head=used)


def measure(data: ReportData) -> Measured:
    """Attention to position 0 per head and its band split, on a few of the report's windows."""
    return rerun(data, attention_sinks)


def render(_data: ReportData, sinks: Measured) -> Section:
    """Gu et al.'s sink heads (attention to position 0 above ε), and the bands that make position 0
    attractive."""
    r, n_ctx, n_win = sinks.value, sinks.n_ctx, sinks.n_windows
    found = r.findings()
    sentences = [f.text for f in found]
    layers = r.layers_frame()
    body = (
        '<p class="lead">A head sinks when its mean attention to position 0 (the BOS token) '
        "exceeds "
        f"ε = {r.epsilon:g} (Gu et al. 2024). The sink logit (position 0 against the mean of the "
        "other keys) splits "
        "exactly into bands, which says which planes make position 0 attractive. Measured on "
        f"{n_win} window(s) of "
        f"{n_ctx} tokens.</p>"
        + "".join(f"<p>{esc(s)}</p>" for s in sentences)
        + figure_html(style_figure(sinks_figure(r), height=640))
        + table_html(layers, summary="Sinking heads and key norms per layer", csv="sinks_layers")
    )
    return Section(
        "attention-sinks",
        "Attention sinks by band",
        body,
        tables={"sinks_heads": r.heads_frame(), "sinks_layers": layers},
        numbers={"sentences": sentences},
        findings=[f for f in found if f.key != "sinks-2"],
    )  # the key-norm ratio: frequency usage's sink finding


ANALYSIS = Analysis(
    "attention-sinks",
    attention_sinks,
    AttentionSinks,
    draw(AttentionSinks, figure=sinks_figure),
    Command("attention-sinks", run, options, distributed=True),
    SectionSpec(
        "attention-sinks",
        "Attention sinks by band",
        render,
        measure,
        summary=f"Heads that sink on the first position (attention above ε = {EPSILON:g}) and "
        "the bands that make it attractive.",
    ),
    summary="Attention to position 0 per head, and the bands that make position 0 attractive.",
)
