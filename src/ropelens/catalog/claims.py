"""The literature's RoPE claims tested on a model: ``claims`` and ``ropelens claims``."""

from __future__ import annotations

import argparse
import math

from ropelens.analyses.registry import Analysis, draw
from ropelens.claims import CLAIMS, ClaimsResult, claims
from ropelens.claims.knockouts import OTHER_END
from ropelens.claims.result import BUDGETS
from ropelens.cli.common import Command, ModelOptions, OutputOptions, load_from_args
from ropelens.errors import InputError
from ropelens.plots.claims import claims_figure


def options(p: argparse.ArgumentParser) -> None:
    """``ropelens claims [MODEL] [--claims NAME,...] [--budget quick|standard|thorough]``."""
    ModelOptions.add_to(p)
    p.add_argument(
        "--claims",
        default=None,
        metavar="NAME,...",
        help=f"claims to test (default: all): {', '.join(CLAIMS)}",
    )
    p.add_argument(
        "--budget",
        default="standard",
        metavar="BUDGET",
        help="quick (minutes on a CPU, 39 draws, 4 windows), standard (49 draws, 8 windows) or "
        "thorough (99 draws, 16 windows, p floor 0.01); default standard",
    )
    OutputOptions.add_to(p, save="ClaimsResult JSON")


def _p(x: float) -> str:
    return "—" if math.isnan(x) else f"{x:.3g}"


def table(result: ClaimsResult) -> str:
    """The result as plain-text lines: a line per claim, then its controls and reason."""
    lines = []
    for r in result.rows:
        ci = "" if math.isnan(r.effect) else f"{r.effect:+.4g} [{r.lo:+.4g}, {r.hi:+.4g}]"
        lines.append(
            f"{r.name:30} {r.verdict:15} {ci:36} windows {r.n_windows}, draws {r.n_draws}, "
            f"{r.seconds:.0f} s"
        )
        for c in r.controls:
            versus = r.detail.get("set_minus_other_end")
            if c.name == OTHER_END and versus:  # one set: its paired CI, not a p-value
                lines.append(
                    f"    {c.name:34} effect {c.effect:+.4g}; set − it {versus['mean']:+.4g} "
                    f"[{versus['lo']:+.4g}, {versus['hi']:+.4g}]"
                )
                continue
            why = f"; {c.withheld}" if c.withheld else ""
            sets = (
                f"all {c.n_possible} sets measured, p exact"
                if c.exhaustive
                else f"{c.n_distinct} distinct sets"
            )
            lines.append(
                f"    {c.name:34} p {_p(c.p):>6} (BH {_p(c.p_adjusted)}, floor {c.p_floor:.2g}, "
                f"{sets}{why})"
            )
        if r.model_number:
            lines.append(f"    model: {r.model_number}")
        if r.paper:
            lines.append(f"    paper: {r.paper}")
        lines.append(f"    {r.reason}")
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    """Test the literature's RoPE claims on the model, each with its controls and an honest verdict

    Each claim runs its declared protocol (knockouts against random planes in the same heads,
    random heads in the same layers and from any layer; descriptive statistics with bootstrap CIs;
    exact bounds) and is decided as holds, does not hold, inconclusive (with why) or not
    applicable (with why), with p-values adjusted by Benjamini–Hochberg across the claims run.
    """
    if args.budget not in BUDGETS:
        raise InputError(
            f"--budget must be one of {', '.join(BUDGETS)}, got {args.budget!r} (e.g. --budget "
            "quick)"
        )
    names = None
    if args.claims is not None:
        names = [n.strip() for n in args.claims.split(",") if n.strip()]
        unknown = [n for n in names if n not in CLAIMS]
        if unknown or not names:
            what = f"no claim {unknown[0]!r}" if unknown else "no claim named"
            raise InputError(
                f"--claims {args.claims!r}: {what}; choose from {', '.join(CLAIMS)} (e.g. "
                f"--claims {next(iter(CLAIMS))})"
            )
    output = OutputOptions.from_args(args)
    output.check()
    model = load_from_args(args)
    result = claims(model, names, args.budget, progress=not (output.json or output.quiet))
    output.save_result(result)
    if output.json:
        return output.emit(result.to_dict())
    print(table(result))
    return 0


ANALYSIS = Analysis(
    "claims",
    claims,
    ClaimsResult,
    draw(ClaimsResult, figure=claims_figure),
    Command("claims", run, options),
    summary="The literature's RoPE claims as protocols with controls and honest verdicts.",
)
