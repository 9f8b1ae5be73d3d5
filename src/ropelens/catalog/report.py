"""The frequency-usage report: ``build_report`` and ``ropelens report``."""

from __future__ import annotations

import argparse
import json

from ropelens.analyses.registry import Analysis
from ropelens.claims.result import BUDGETS
from ropelens.cli.common import (
    AnalysisOptions,
    Command,
    CorpusOptions,
    ModelOptions,
    OutputOptions,
    band_tokens,
    load_from_args,
)
from ropelens.plots.export import FIGURE_FORMATS
from ropelens.report.build import (
    DEFAULT_BAND_TOKENS,
    build_report,
    check_figures,
    check_output_dir,
    resolve_corpus,
)
from ropelens.report.experiments import load_experiments
from ropelens.run.distributed import is_main
from ropelens.validate import check_output_path


def options(p: argparse.ArgumentParser) -> None:
    """``ropelens report [MODEL]``: the HTML report."""
    ModelOptions.add_to(p)
    CorpusOptions.add_to(p, tokens=32_768, n_ctx=512)
    p.add_argument(
        "--out",
        default="ropelens-report",
        metavar="DIR",
        help="output directory (default: ropelens-report)",
    )
    AnalysisOptions.add_to(p)
    p.add_argument(
        "--band-tokens",
        type=band_tokens,
        default=DEFAULT_BAND_TOKENS,
        metavar="N|all",
        help="tokens band statistics see, from evenly spread windows, or 'all' (default: 8192; "
        "each window costs about 0.8x a forward pass on top of frequency usage at 512 tokens)",
    )
    p.add_argument(
        "--quick",
        action="store_true",
        help="smoke test: 4 windows of 256 tokens over a few layers (about a minute on a laptop "
        "CPU)",
    )
    p.add_argument(
        "--experiments",
        default=None,
        metavar="DIR",
        help="folder the experiment scripts wrote (e.g. results/): their tables for this model "
        "join the p-RoPE and context-extension sections",
    )
    p.add_argument(
        "--figures",
        choices=FIGURE_FORMATS,
        default=None,
        help="also write every figure of the page as a file beside it, "
        "OUT/figures/NN-SECTION.FORMAT (through kaleido and the installed chromium)",
    )
    p.add_argument(
        "--claims",
        choices=BUDGETS,
        default=None,
        metavar="BUDGET",
        help="also run the literature's RoPE claims on the model at this budget (quick, standard "
        "or thorough; as ropelens claims --budget) into the section 'What the literature claims, "
        "on this model' after the summary figure (default: no such section)",
    )
    OutputOptions.add_to(p)


def run(args: argparse.Namespace) -> int:
    """Write a self-contained HTML report (usage, band decomposition, findings)

    Measure frequency usage and the band decomposition of attention in one pass over a corpus, and
    write OUT/index.html (works offline), report.json and one CSV per table.
    """
    output = OutputOptions.from_args(args)
    AnalysisOptions.from_args(args)  # bad bands, output or corpus fail before the model loads
    out = check_output_path(args.out, "--out", directory=True)  # created once the model has loaded
    corpus, _ = resolve_corpus(args.corpus, args.text_column)

    load_experiments(args.experiments)
    # export unavailable here, or a figures file where figures/ goes: fail before the model loads
    check_output_dir(out, check_figures(args.figures))
    model = load_from_args(args)
    path = build_report(
        model,
        corpus=corpus,
        tokens=args.tokens,
        n_ctx=args.n_ctx,
        out=out,
        bands=args.bands,
        layers=args.layers,
        quick=args.quick,
        band_tokens=args.band_tokens,
        experiments=args.experiments,
        verify=not args.no_verify,
        figures=args.figures,
        claims=args.claims,
        progress=output.progress,
    )

    if not is_main():  # under torchrun rank 0 writes the report; the other ranks only measured
        return 0
    report = json.loads((path / "report.json").read_text())
    if output.json:
        prov = report["provenance"]
        return output.emit(
            {
                "out": str(path),
                "index": str(path / "index.html"),
                "findings": report["findings"],
                "seconds": prov["seconds"],
                "steps_seconds": prov["steps_seconds"],
            }
        )
    print(f"report: {path / 'index.html'}")
    for i, f in enumerate(report["findings"], start=1):
        print(f"  {i}. {f['text']}")
    return 0


ANALYSIS = Analysis(
    "report",
    build_report,
    command=Command("report", run, options, distributed=True),
    summary="One page of every registered section on one model, with generated findings, "
    "report.json and CSVs.",
)
