"""Massive values of pre-RoPE queries and keys: ``massive_values``, ``ropelens massive-values`` and
the report's section."""

from __future__ import annotations

import argparse

from ropelens.analyses.massive_values import MassiveValues, massive_values
from ropelens.analyses.registry import Analysis, draw
from ropelens.cli.common import (
    Command,
    CorpusCommand,
    load_from_args,
)
from ropelens.errors import InputError
from ropelens.plots.massive_values import massive_figure
from ropelens.plots.style import style_figure
from ropelens.report.collect import ReportData
from ropelens.report.html import esc, figure_html, table_html
from ropelens.report.registry import SectionSpec
from ropelens.report.section import Measured, Section
from ropelens.report.steps import rerun
from ropelens.results.findings import Finding


def options(p: argparse.ArgumentParser) -> None:
    """``ropelens massive-values [MODEL]``: massive dimensions of pre-RoPE queries and keys."""
    CorpusCommand.add_to(p, tokens=8_192, n_ctx=512, save="MassiveValues JSON", bands=False)
    p.add_argument(
        "--factor",
        type=float,
        default=5.0,
        help="massive threshold over the head's mean (default: 5)",
    )


def run(args: argparse.Namespace) -> int:
    """Massive dimensions of pre-RoPE queries and keys, the planes they sit in

    Per layer, head and dimension: the L2 norm over tokens of the pre-RoPE q and k; a dimension is
    massive when it exceeds FACTOR x its head's mean dimension norm (Jin et al. 2025). Prints the
    planes holding massive dimensions, their wavelength and persistence across layers.
    """
    run = CorpusCommand.from_args(args)
    if not args.factor > 1:
        raise InputError(
            "--factor must exceed 1 (a multiple of the head's mean dimension norm), got "
            f"{args.factor}"
        )
    corpus, kw = run.prepare(massive_values)
    r = massive_values(load_from_args(args), corpus, **kw, factor=args.factor)
    used = run.measured(r)
    run.output.save_result(r)
    planes = r.planes_frame()
    planes = planes[planes.n_massive > 0]
    if run.output.json:
        return run.output.emit(
            {
                **used,
                "planes": planes.to_dict("records"),
                "massive": r.massive_frame().head(50).to_dict("records"),
            }
        )
    print(
        planes.to_string(index=False, float_format="%.3f")
        if len(planes)
        else "no massive dimension"
    )
    return 0


def measure(data: ReportData) -> Measured:
    """Norms of each pre-RoPE query and key dimension, on a few of the report's windows."""
    return rerun(data, massive_values)


def render(data: ReportData, massive: Measured) -> Section:
    """Jin et al.'s massive dimensions of pre-RoPE q and k: where they sit in frequency, how they
    persist."""
    mv, n_ctx, n_win = massive.value, massive.n_ctx, massive.n_windows
    planes = mv.planes_frame()
    hit = planes[planes.n_massive > 0]
    ctx = data.spec.n_ctx
    parts, numbers = [], {"factor": mv.factor}
    for w in ("q", "k"):
        # every count is a sum over the massive_planes table, so the sentence and the CSV agree
        rows = hit[hit.which == w]
        n_planes = int(rows.n_massive_dims.sum())
        unrotated = int(mv.mask(w).sum()) - n_planes  # dimensions outside every rotary plane
        total = int(mv.present(w).sum())
        beyond = int(rows[rows.wavelength > ctx].n_massive_dims.sum())
        numbers |= {f"n_massive_{w}": n_planes + unrotated, f"n_dims_{w}": total,
                    f"n_beyond_{w}": beyond}  # fmt: skip
        top = rows.sort_values("persistence", ascending=False).head(1)
        tail = ""
        if len(top):
            numbers |= {
                f"top_plane_{w}": int(top.plane.iloc[0]),
                f"top_wavelength_{w}": float(top.wavelength.iloc[0]),
                f"top_persistence_{w}": float(top.persistence.iloc[0]),
            }
            tail = (
                f", most persistent plane {int(top.plane.iloc[0])} (wavelength "
                f"{top.wavelength.iloc[0]:,.0f} tokens, massive in {top.persistence.iloc[0]:.0%} "
                "of layers)"
            )
        extra = f" and {unrotated:,} in unrotated dimensions" if unrotated else ""
        parts.append(
            f"{w}: {n_planes + unrotated:,} of {total:,} dimensions massive, {beyond:,} of them in "
            f"planes whose wavelength exceeds the trained context of {ctx:,}{extra}{tail}"
        )
    text = (
        f"Massive dimensions (L2 norm over tokens above {mv.factor:.2f}× the head's mean "
        "dimension norm) — " + "; ".join(parts) + "."
    )
    finding = Finding("massive", "massive-values", text, numbers)
    body = (
        '<p class="lead">Jin et al. 2025: a few dimensions of the queries and keys carry far '
        "larger norms than "
        "the rest, concentrated in low-frequency planes, and contextual knowledge depends on "
        "them. Measured before "
        f"RoPE on {n_win} window(s) of {n_ctx} tokens. Replace them with their mean "
        "(<code>ropelens.analyses.massive_values.replace_massive</code>) to test what they do.</p>"
        f"<p>{esc(text)}</p>"
        + figure_html(style_figure(massive_figure(mv), height=460))
        + table_html(
            hit,
            text_cols=("which",),
            summary="The planes that hold a massive dimension",
            csv="massive_planes",
        )
    )
    return Section(
        "massive-values",
        "Massive values",
        body,
        tables={"massive_planes": planes},
        numbers=finding.values,
        findings=[finding],
    )


ANALYSIS = Analysis(
    "massive-values",
    massive_values,
    MassiveValues,
    draw(MassiveValues, figure=massive_figure),
    Command("massive-values", run, options, distributed=True),
    SectionSpec(
        "massive-values",
        "Massive values",
        render,
        measure,
        summary="Dimensions of the pre-RoPE queries and keys with outsized norms, and the planes "
        "they sit in.",
    ),
    summary="Dimensions of the pre-RoPE queries and keys with outsized norms, and the planes "
    "they sit in.",
)
