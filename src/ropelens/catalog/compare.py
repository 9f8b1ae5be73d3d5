"""Two reports side by side: ``compare_reports`` and ``ropelens compare``."""

from __future__ import annotations

import argparse
import json

from ropelens.analyses.registry import Analysis
from ropelens.cli.common import Command
from ropelens.report.compare import compare_reports


def options(p: argparse.ArgumentParser) -> None:
    """``ropelens compare A B``: two saved reports side by side."""
    p.add_argument("a", metavar="A", help="the first report directory")
    p.add_argument("b", metavar="B", help="the second report directory")
    p.add_argument(
        "--out",
        default="ropelens-compare",
        metavar="DIR",
        help="output directory (default: ropelens-compare)",
    )


def run(args: argparse.Namespace) -> int:
    """Compare two saved reports: difference maps and what changed (B - A)

    Read two directories written by `ropelens report` (two models, a model and a variant of it, or
    two corpora) and write OUT/index.html with difference maps of frequency usage and the band
    decomposition, positional heads gained and lost, sinking heads per layer, and findings.
    """
    out = compare_reports(args.a, args.b, args.out)
    for f in json.loads((out / "compare.json").read_text())["findings"]:
        print(f)
    print(f"comparison: {out / 'index.html'}")
    return 0


ANALYSIS = Analysis(
    "compare",
    compare_reports,
    command=Command("compare", run, options),
    summary="Two or more reports' numbers side by side, with what differs.",
)
