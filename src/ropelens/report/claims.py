"""The report's claims section, "What the literature claims, on this model": the literature's RoPE
claims run on the report's model (:func:`ropelens.claims.claims`) at the budget ``ropelens report
--claims BUDGET`` names, laid out right after the page's summary figure as the forest plot and the
claims table, with each verdict's reason.

The section is optional: without a budget the report has none. It measures with its own windows
and draws (the budget's), not the report's corpus windows.
"""

from __future__ import annotations

import math
from typing import Any

from ropelens.claims import claims
from ropelens.claims.markdown import MISSING, P_EXPLAINED, claims_table
from ropelens.claims.result import BUDGETS, VERDICTS, ClaimsResult
from ropelens.errors import InputError
from ropelens.plots.claims import VERDICT_COLORS, claims_figure
from ropelens.report import html as H
from ropelens.report.section import Section

__all__ = [
    "CLAIMS_KEY",
    "CLAIMS_TITLE",
    "check_claims_budget",
    "claims_html",
    "claims_numbers",
    "claims_section",
    "measure_claims",
]

CLAIMS_KEY = "claims"
CLAIMS_TITLE = "What the literature claims, on this model"


def check_claims_budget(budget: Any) -> str | None:
    """The claims budget asked for (None: no claims section), checked before anything runs."""
    if budget is None:
        return None
    if not isinstance(budget, str) or budget.strip().lower() not in BUDGETS:
        raise InputError(
            f"claims={budget!r} is not a claims budget: pass one of {', '.join(BUDGETS)} (e.g. "
            "--claims quick), or leave it out for no claims section"
        )
    return budget.strip().lower()


def measure_claims(model: Any, budget: str, progress: bool = False) -> ClaimsResult:
    """Every registered claim run on ``model`` at ``budget`` (:func:`ropelens.claims.claims`)."""
    return claims(model, budget=budget, progress=progress)


def _finite(x: float) -> float | None:
    return x if math.isfinite(x) else None


def claims_numbers(result: ClaimsResult) -> dict[str, Any]:
    """What ``report.json`` keeps of the claims: the budget, alpha, the verdict counts and each
    claim's verdict, effect with its CI and each control's p (raw and adjusted), floor and distinct
    sets."""
    return {
        "budget": result.budget,
        "alpha": result.alpha,
        "verdicts": {v: sum(r.verdict == v for r in result.rows) for v in VERDICTS},
        "claims": {
            r.name: {
                "verdict": r.verdict,
                "reason": r.reason,
                "metric": r.metric,
                "effect": _finite(r.effect),
                "lo": _finite(r.lo),
                "hi": _finite(r.hi),
                "n_windows": r.n_windows,
                "n_draws": r.n_draws,
                "controls": {
                    c.name: {
                        "p": _finite(c.p),
                        "p_adjusted": _finite(c.p_adjusted),
                        "p_floor": c.p_floor,
                        "n_distinct": c.n_distinct,
                        "n_possible": c.n_possible,
                        "exhaustive": c.exhaustive,
                    }
                    for c in r.controls
                },
            }
            for r in result.rows
        },
    }


def _verdict_html(verdict: str) -> str:
    return f'<b style="color:{VERDICT_COLORS[verdict]}">{H.esc(verdict)}</b>'


def _lead(result: ClaimsResult) -> str:
    counts = [(v, sum(r.verdict == v for r in result.rows)) for v in VERDICTS]
    said = ", ".join(f"{n} {_verdict_html(v)}" for v, n in counts if n)
    seconds = sum(r.seconds for r in result.rows)
    return (
        f"<p>{len(result.rows)} claims from the RoPE literature, each run as its declared "
        f"protocol on this model at the <b>{H.esc(result.budget)}</b> budget "
        f"({seconds:,.0f} s): {said}. A claim holds only where its effect's CI lies on the claimed "
        "side and every control that can resolve its p-value is beaten at a "
        f"Benjamini–Hochberg-adjusted p ≤ {result.alpha:g}; where the draws cannot decide it is "
        "inconclusive. The protocols and sources: <code>ropelens claims --help</code> and the "
        "claims page of the documentation.</p>"
    )


def _reasons(result: ClaimsResult) -> str:
    items = "".join(
        f"<li><b>{H.esc(r.name)}</b> ({H.esc(r.source)}): {_verdict_html(r.verdict)}: "
        f"{H.esc(r.reason)}<br>paper: {H.esc(r.paper or MISSING)} · this model: "
        f"{H.esc(r.model_number or MISSING)}</li>"
        for r in result.rows
    )
    return f'<ul class="claims-reasons">{items}</ul>'


def claims_html(result: ClaimsResult) -> str:
    """The section's body: what was run and how it came out, the forest plot, the claims table
    (:func:`ropelens.claims.markdown.claims_table`, its paper and model columns moved to the list
    below it) and each verdict's reason beside the paper's number and the model's."""
    caption = (
        "Each claim on its own metric's axis: the claimed set's effect (diamond, coloured by the "
        "verdict) with its 95% CI over windows, each control's mean effect with the middle 95% of "
        "its draws; dotted: the value the claim is judged against."
    )
    # the paper's and the model's numbers are sentences: they go with each claim's reason below
    table = claims_table(result).drop(columns=["paper", "model"])
    return (
        _lead(result)
        + H.figure_html(claims_figure(result), caption)
        + H.table_html(
            table,
            text_cols=table.columns,
            folded=False,
        )
        + f'<p class="caption">{H.esc(P_EXPLAINED)} The numbers: <a href="{CLAIMS_KEY}.csv">'
        f'{CLAIMS_KEY}.csv</a> (a row per claim), <a href="claims_controls.csv">'
        "claims_controls.csv</a> (a row per claim and control).</p>" + _reasons(result)
    )


def claims_section(result: ClaimsResult) -> Section:
    """The claims section: its body (:func:`claims_html`), the tables ``claims.csv`` (a row per
    claim, :meth:`ClaimsResult.to_frame`) and ``claims_controls.csv`` (a row per claim and
    control), and the numbers ``report.json`` keeps (:func:`claims_numbers`)."""
    with H.collecting_figures() as figures:
        body = claims_html(result)
    return Section(
        CLAIMS_KEY,
        CLAIMS_TITLE,
        body,
        figures=figures,
        tables={
            CLAIMS_KEY: result.to_frame(),
            "claims_controls": result.controls_frame(),
        },
        numbers=claims_numbers(result),
    )
