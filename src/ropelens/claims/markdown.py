"""The claims table as text: a Markdown table for papers and READMEs, one row per claim.

:func:`claims_table` lays a :class:`~ropelens.claims.result.ClaimsResult` out as display strings
(verdict, effect with its 95% CI, p per control raw and Benjamini–Hochberg-adjusted, the smallest p
the draws allow, distinct control sets, the paper's number beside the model's, windows, draws);
:func:`claims_markdown` writes it as a Markdown table with each verdict's reason below it. The
report's claims section shows the same table. :func:`registry_markdown` writes every registered
claim's protocol and source, the list the documentation's claims page holds.
"""

from __future__ import annotations

import math
from typing import Any

import pandas as pd

from ropelens.claims.context import BUDGET_SETTINGS
from ropelens.claims.protocol import CLAIMS, Claim
from ropelens.claims.result import ClaimRow, ClaimsResult, ControlOutcome
from ropelens.run.evaluate import interval_text
from ropelens.run.stats import p_floor

__all__ = [
    "MISSING",
    "PAGE_END",
    "PAGE_START",
    "budgets_markdown",
    "claim_markdown",
    "claims_markdown",
    "claims_table",
    "control_names",
    "p_text",
    "registry_markdown",
]

MISSING = "–"  # a number the claim does not have (no control of that kind, nothing measured)
P_EXPLAINED = (
    "p: one-sided permutation p-value against the control's draws, (1 + #draws at least as "
    "extreme) / (1 + n), raw / Benjamini–Hochberg-adjusted across every control of the claims "
    "run; p floor: the smallest p the draws allow, 1 / (1 + n); distinct sets: distinct control "
    "sets among the draws, or 'all N' where the pool held few enough sets to measure every one "
    "once (its p is then exact, the share of the N sets at least as extreme). Effects: mean over "
    "windows with a 95% percentile bootstrap CI."
)


def control_names(result: ClaimsResult) -> list[str]:
    """Every control of the result, in the order the controls first appear."""
    return list(dict.fromkeys(c.name for r in result.rows for c in r.controls))


def p_text(control: ControlOutcome | None) -> str:
    """A control's p as ``raw / BH``, ``withheld`` where its p cannot be stated, or ``–``."""
    if control is None:
        return MISSING
    if control.withheld or not math.isfinite(control.p):
        return "withheld"
    return f"{control.p:.3g} / {control.p_adjusted:.3g}"


def effect_text(row: ClaimRow) -> str:
    """The claim's effect and its 95% CI, ``+0.5 [+0.4, +0.6]`` (``–`` where not measured)."""
    if not math.isfinite(row.effect):
        return MISSING
    return f"{row.effect:+.3g} {interval_text(row.lo, row.hi, '+.3g')}"


def _per_control(row: ClaimRow, names: list[str], value: Any) -> str:
    """``value(control)`` for each of the row's controls in column order, once where all agree."""
    by_name = {c.name: c for c in row.controls}
    texts = [value(by_name[n]) for n in names if n in by_name]
    if not texts:
        return MISSING
    return texts[0] if len(set(texts)) == 1 else " · ".join(texts)


def _row_cells(row: ClaimRow, names: list[str]) -> dict[str, str]:
    by_name = {c.name: c for c in row.controls}
    cells = {"claim": row.name, "verdict": row.verdict, "effect [95% CI]": effect_text(row)}
    cells |= {f"p vs {n} (raw / BH)": p_text(by_name.get(n)) for n in names}
    cells["p floor"] = _per_control(row, names, lambda c: f"{c.p_floor:.2g}")
    cells["distinct sets"] = _per_control(
        row, names, lambda c: f"all {c.n_possible}" if c.exhaustive else f"{c.n_distinct}"
    )
    cells["paper"] = row.paper or MISSING
    cells["model"] = row.model_number or MISSING
    cells["windows"] = str(row.n_windows)
    cells["draws"] = str(row.n_draws)
    return cells


def claims_table(result: ClaimsResult) -> pd.DataFrame:
    """One row of display strings per claim: claim, verdict, effect [95% CI], ``p vs CONTROL (raw
    / BH)`` per control, p floor, distinct sets, paper, model, windows, draws.

    A claim without a control of some kind shows ``–`` there; p floor and distinct sets are given
    once where the claim's controls agree, else per control (``·``-separated, in column order).
    """
    names = control_names(result)
    return pd.DataFrame([_row_cells(row, names) for row in result.rows])


def _cell(text: Any) -> str:
    """A table cell's text, its pipes escaped and lines joined, so the row stays one row."""
    return " ".join(str(text).split()).replace("|", r"\|")


def claims_markdown(result: ClaimsResult, reasons: bool = True) -> str:
    """The claims table as Markdown (GitHub's pipe tables), with what p means below it and, with
    ``reasons``, each verdict's reason and each withheld p's.

    Args:
        result (ClaimsResult): What :func:`ropelens.claims.claims` returned (or a loaded one).
        reasons (bool): List each claim's verdict and reason (and why a p is withheld) below the
            table.

    Returns:
        str: The Markdown, ending in a newline.
    """
    table = claims_table(result)
    if table.empty:
        return f"No claims were run on {result.provenance.model}.\n"
    lines = [
        "| " + " | ".join(_cell(c) for c in table.columns) + " |",
        "|" + "---|" * len(table.columns),
        *("| " + " | ".join(_cell(v) for v in values) + " |" for values in table.values),
        "",
        f"{result.provenance.model}, {result.budget} budget, alpha {result.alpha:g}. {P_EXPLAINED}",
    ]
    if reasons:
        lines.append("")
        for row in result.rows:
            lines.append(f"- `{row.name}` ({row.source}): **{row.verdict}**: {_cell(row.reason)}")
            lines += [
                f"  - {c.name}: p withheld: {_cell(c.withheld)}" for c in row.controls if c.withheld
            ]
    return "\n".join(lines) + "\n"


# ------------------------------------------------------------------------ the registry as a page
PAGE_START = "<!-- generated from the claims registry: python scripts/claims_page.py -->"
PAGE_END = "<!-- end of the generated list -->"


def _controls_text(controls: tuple[str, ...]) -> str:
    if not controls:
        return "none: the claim is judged on its effect's CI alone (descriptive or exact)"
    return "; ".join(controls)


def claim_markdown(claim: Claim) -> str:
    """One registered claim as a Markdown section: the claim, its source and the paper's number,
    what is measured, the controls, and the statistic with its decision rule."""
    side = "above" if claim.direction == "greater" else "below"
    return "\n".join(
        [
            f"### `{claim.name}`",
            "",
            f"> {claim.claim}",
            "",
            f"- **Source:** {claim.source}",
            f"- **The paper's number:** {claim.paper or 'none given'}",
            f"- **Measured:** {claim.measured}",
            f"- **Metric:** {claim.metric}; the claim predicts an effect {side} "
            f"{claim.threshold:g}",
            f"- **Controls:** {_controls_text(claim.controls)}",
            f"- **Statistic and decision:** {claim.statistic}",
            "",
        ]
    )


def budgets_markdown() -> str:
    """The budgets as a Markdown table: windows per claim, draws per control and the p floor they
    allow."""
    lines = [
        "| budget | windows per claim | draws per control | p floor |",
        "|---|---|---|---|",
        *(
            f"| `{b.name}` | {b.n_windows} | {b.n_draws} | {p_floor(b.n_draws):.2g} |"
            for b in BUDGET_SETTINGS.values()
        ),
    ]
    return "\n".join(lines) + "\n"


def registry_markdown() -> str:
    """The documentation's generated part: the budgets table, then every registered claim
    (:data:`ropelens.claims.protocol.CLAIMS`, in registration order) with its protocol and
    source, between :data:`PAGE_START` and :data:`PAGE_END`."""
    parts = [PAGE_START, "", "## Budgets", "", budgets_markdown(), "## The claims", ""]
    parts += [claim_markdown(c) for c in CLAIMS.values()]
    return "\n".join([*parts, PAGE_END]) + "\n"
