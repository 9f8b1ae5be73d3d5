"""The claims table as Markdown, on made-up rows whose every number is known: each cell says what
the row holds, in the columns a paper's table needs, and the table stays one line per claim."""

from __future__ import annotations

import math
import re
from dataclasses import replace

import pytest

from ropelens.catalog.claims import table
from ropelens.claims.markdown import MISSING, claims_markdown, claims_table
from ropelens.claims.result import (
    DOES_NOT_HOLD,
    HOLDS,
    INCONCLUSIVE,
    NOT_APPLICABLE,
    ClaimRow,
    ClaimsResult,
    ControlOutcome,
)
from ropelens.results.provenance import Provenance
from ropelens.run.stats import benjamini_hochberg

PLANES = "random planes, same heads"
HEADS = "random heads, same layers"
ANYWHERE = "random heads, any layer"
NAN = math.nan
# the stated p-values of the made-up result, in row order, and their Benjamini–Hochberg
# adjustments worked by hand: sorted 0.01, 0.01, 0.02, 0.06, 0.09 (m = 5) give p·m/rank 0.05,
# 0.025, 0.0333, 0.075, 0.09, then the running minimum from the largest down
RAW = {
    ("positional", PLANES): 0.01,
    ("positional", HEADS): 0.01,
    ("positional", ANYWHERE): 0.02,
    ("semantic", PLANES): 0.09,
    ("semantic", HEADS): 0.06,
}
ADJUSTED = {
    ("positional", PLANES): 0.025,
    ("positional", HEADS): 0.025,
    ("positional", ANYWHERE): 0.02 * 5 / 3,
    ("semantic", PLANES): 0.09,
    ("semantic", HEADS): 0.075,
}


def control(claim: str, name: str, effect: float, n_draws: int = 99, **kw) -> ControlOutcome:
    """A control of made-up numbers; its p and adjusted p from RAW and ADJUSTED."""
    withheld = kw.pop("withheld", "")
    p = NAN if withheld else RAW[(claim, name)]
    return ControlOutcome(
        name=name,
        effect=effect,
        lo=effect - 0.05,
        hi=effect + 0.05,
        p=p,
        p_adjusted=NAN if withheld else ADJUSTED[(claim, name)],
        p_floor=1 / (1 + n_draws),
        n_draws=n_draws,
        n_distinct=kw.pop("n_distinct", n_draws),
        n_possible=kw.pop("n_possible", -1),
        withheld=withheld,
    )


def row(name: str, verdict: str, effect: float, lo: float, hi: float, **kw) -> ClaimRow:
    fields = {
        "name": name,
        "claim": f"the {name} claim",
        "source": "Someone et al. 2025",
        "paper": "",
        "measured": "made up",
        "metric": "positional probe",
        "direction": "less",
        "threshold": 0.0,
        "baseline": 0.613,
        "effect": effect,
        "lo": lo,
        "hi": hi,
        "model_number": "",
        "controls": (),
        "verdict": verdict,
        "reason": f"{name} decided",
        "n_windows": 16,
        "n_draws": 99,
        "seconds": 1.5,
        "detail": {},
    }
    return ClaimRow(**{**fields, **kw})


def made_up_result() -> ClaimsResult:
    """Five claims, one of each verdict and a descriptive one: every number known in advance."""
    rows = (
        row(
            "positional",
            HOLDS,
            -0.54,
            -0.552,
            -0.525,
            paper="Gemma 7B: by eye",
            model_number="0.613 → 0.073",
            controls=(
                control("positional", PLANES, -0.167),
                control("positional", HEADS, -0.0851),
                control("positional", ANYWHERE, -0.05),
            ),
        ),
        row(
            "semantic",
            DOES_NOT_HOLD,
            0.954,
            0.647,
            1.2,
            metric="content − function",
            direction="greater",
            baseline=1.9,
            reason="8 of 99 random-plane draws | hurt as much",
            controls=(
                control("semantic", PLANES, 0.227),
                control("semantic", HEADS, 0.183, n_draws=19),
            ),
        ),
        row(
            "low-band-energy",
            HOLDS,
            0.72,
            0.70,
            0.74,
            metric="low-band energy share",
            direction="greater",
            threshold=0.5,
            baseline=NAN,
            n_draws=0,
        ),
        row(
            "local-global",
            NOT_APPLICABLE,
            NAN,
            NAN,
            NAN,
            metric="copy accuracy",
            reason="the model has no local layers",
            n_windows=0,
            n_draws=0,
        ),
        row(
            "retrieval",
            INCONCLUSIVE,
            -0.8,
            NAN,
            NAN,
            metric="copy accuracy",
            baseline=1.0,
            n_windows=1,
            reason="one window gives no CI",
            controls=(
                control(
                    "retrieval",
                    HEADS,
                    -0.2,
                    withheld="only 1 head set exists",
                    n_distinct=1,
                    n_possible=1,
                ),
            ),
        ),
    )
    return ClaimsResult(
        rows=rows, budget="standard", alpha=0.05, provenance=Provenance(model="made-up-model")
    )


def table_rows(markdown: str) -> list[list[str]]:
    """The pipe table's lines split into cells at unescaped pipes (escaped ones restored)."""
    lines = [line for line in markdown.splitlines() if line.startswith("|")]
    return [
        [cell.strip().replace(r"\|", "|") for cell in re.split(r"(?<!\\)\|", line)[1:-1]]
        for line in lines
    ]


def test_made_up_adjustments_are_benjamini_hochberg():
    adjusted = benjamini_hochberg(list(RAW.values()))
    assert adjusted == pytest.approx(list(ADJUSTED.values()), rel=1e-12)


def test_columns_are_the_paper_table_in_order():
    header = table_rows(claims_markdown(made_up_result()))[0]
    assert header == [
        "claim",
        "verdict",
        "effect [95% CI]",
        f"p vs {PLANES} (raw / BH)",
        f"p vs {HEADS} (raw / BH)",
        f"p vs {ANYWHERE} (raw / BH)",
        "p floor",
        "distinct sets",
        "paper",
        "model",
        "windows",
        "draws",
    ]


def test_every_row_is_one_line_with_every_cell():
    rows = table_rows(claims_markdown(made_up_result()))
    assert rows[1] == ["---"] * 12  # the delimiter row
    assert [r[0] for r in rows[2:]] == [
        "positional",
        "semantic",
        "low-band-energy",
        "local-global",
        "retrieval",
    ]
    assert all(len(r) == 12 for r in rows)  # a pipe in a reason or name never splits a row


def test_cells_state_the_rows_numbers():
    header, _, *rows = table_rows(claims_markdown(made_up_result()))
    cells = {r[0]: dict(zip(header, r, strict=True)) for r in rows}
    positional = cells["positional"]
    assert positional["verdict"] == "holds"
    assert positional["effect [95% CI]"] == "-0.54 [-0.552, -0.525]"
    assert positional[f"p vs {PLANES} (raw / BH)"] == "0.01 / 0.025"
    assert positional[f"p vs {ANYWHERE} (raw / BH)"] == "0.02 / 0.0333"
    assert positional["p floor"] == "0.01"  # the same for every control: said once
    assert positional["distinct sets"] == "99"
    assert positional["paper"] == "Gemma 7B: by eye"
    assert positional["model"] == "0.613 → 0.073"
    assert (positional["windows"], positional["draws"]) == ("16", "99")

    semantic = cells["semantic"]
    assert semantic["effect [95% CI]"] == "+0.954 [+0.647, +1.2]"
    assert semantic[f"p vs {HEADS} (raw / BH)"] == "0.06 / 0.075"
    assert semantic[f"p vs {ANYWHERE} (raw / BH)"] == MISSING  # the claim has no such control
    assert semantic["p floor"] == "0.01 · 0.05"  # 99 and 19 draws, in column order
    assert semantic["distinct sets"] == "99 · 19"
    assert semantic["paper"] == MISSING and semantic["model"] == MISSING


def test_claims_without_numbers_or_controls_say_so():
    cells = {r[0]: r for r in table_rows(claims_markdown(made_up_result()))[2:]}
    energy = cells["low-band-energy"]
    assert energy[2] == "+0.72 [+0.7, +0.74]"
    assert energy[3:8] == [MISSING] * 5  # no control, so no p, floor or distinct sets
    absent = cells["local-global"]
    assert absent[1] == "not applicable" and absent[2] == MISSING
    retrieval = cells["retrieval"]
    assert retrieval[2] == "-0.8 n/a (one window gives no spread)"
    assert retrieval[4] == "withheld"
    assert retrieval[7] == "1"


def test_reasons_and_withheld_p_listed_below_the_table():
    text = claims_markdown(made_up_result())
    assert (
        "- `semantic` (Someone et al. 2025): **does not hold**: 8 of 99 random-plane draws \\| "
        "hurt as much" in text
    )
    assert (
        "- `local-global` (Someone et al. 2025): **not applicable**: the model has no local" in text
    )
    assert f"  - {HEADS}: p withheld: only 1 head set exists" in text
    assert "made-up-model, standard budget, alpha 0.05." in text
    bare = claims_markdown(made_up_result(), reasons=False)
    assert "decided" not in bare and "p withheld" not in bare
    assert table_rows(bare) == table_rows(text)


def test_table_frame_is_what_the_markdown_shows():
    frame = claims_table(made_up_result())
    assert table_rows(claims_markdown(made_up_result()))[2:] == frame.values.tolist()


def test_no_claims_is_one_sentence():
    empty = ClaimsResult(rows=(), budget="quick", alpha=0.05, provenance=Provenance(model="m"))
    assert claims_markdown(empty) == "No claims were run on m.\n"


def test_an_enumerated_pool_is_written_as_all_of_its_sets():
    whole = replace(
        control("positional", HEADS, -0.0851, n_draws=63), n_possible=64, exhaustive=True
    )
    result = made_up_result()
    first = result.rows[0]
    controls = (first.controls[0], whole, first.controls[2])
    mixed = replace(result, rows=(replace(first, controls=controls), *result.rows[1:]))
    header, _, *rows = table_rows(claims_markdown(mixed))
    cells = {r[0]: dict(zip(header, r, strict=True)) for r in rows}
    assert cells["positional"]["distinct sets"] == "99 · all 64 · 99"
    assert cells["positional"]["p floor"] == "0.01 · 0.016 · 0.01"
    printed = table(mixed).splitlines()  # what ropelens claims prints
    assert any(HEADS in line and "all 64 sets measured, p exact" in line for line in printed)
    assert sum("99 distinct sets" in line for line in printed[:5]) == 2
