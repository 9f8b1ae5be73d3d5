"""The report's claims section on a tiny model: ``claims=BUDGET`` (``ropelens report --claims
BUDGET``) lays out "What the literature claims, on this model" right after the summary figure, with
the numbers of :func:`ropelens.claims.claims` run on the same model; without it there is no such
section."""

from __future__ import annotations

import html
import json
import math
import re
from pathlib import Path

import pandas as pd
import pytest

from ropelens.claims import claims
from ropelens.claims.markdown import claims_table
from ropelens.cli.main import build_parser, main
from ropelens.errors import InputError
from ropelens.report import build_report
from ropelens.report.claims import CLAIMS_TITLE

N_CTX = 32
CORPUS = ["The cat sat on the mat, and the dog lay by the door. " * 40]


def _report(model, out: Path, **kw) -> Path:
    return build_report(
        model, corpus=CORPUS, tokens=4 * N_CTX, n_ctx=N_CTX, out=out, progress=False, **kw
    )


@pytest.fixture(scope="module")
def claims_report(tiny, tmp_path_factory) -> Path:
    return _report(tiny("llama"), tmp_path_factory.mktemp("claims") / "out", claims="quick")


@pytest.fixture(scope="module")
def result(tiny):
    """The claims run on their own, on the same model, at the same budget (seeded: the same
    numbers)."""
    return claims(tiny("llama"), budget="quick", progress=False)


@pytest.fixture(scope="module")
def page(claims_report) -> str:
    return (claims_report / "index.html").read_text(encoding="utf-8")


@pytest.fixture(scope="module")
def report(claims_report) -> dict:
    return json.loads((claims_report / "report.json").read_text())


def _same(a, b) -> bool:
    if a is None or b is None:  # report.json writes NaN as null
        return (a is None or math.isnan(a)) and (b is None or math.isnan(b))
    return a == pytest.approx(b, rel=1e-9, abs=1e-12)


def test_section_comes_right_after_the_summary_figure(page):
    summary = page.index('<div class="summaryfig">')
    claims_at = page.index('<section id="claims">')
    cards = page.index('<p class="lead">Generated from the numbers')
    first_section = page.index('<section id="rope-spec">')
    assert summary < claims_at < cards < first_section
    # nothing but the summary figure between the findings heading and the claims
    between = page[page.index('<section id="findings">') : claims_at]
    assert between.count('class="plotly-graph-div"') == 1
    assert f"<h2>{html.escape(CLAIMS_TITLE)}</h2>" in page[claims_at:cards]
    assert page.count('<section id="claims">') == 1


def test_navigation_lists_the_section_after_the_findings(page):
    nav = re.findall(r'href="#([\w-]+)"', page[: page.index('<section id="findings">')])
    assert nav[:3] == ["findings", "claims", "rope-spec"]


def test_report_json_numbers_are_the_results(report, result):
    section = report["sections"][0]
    assert section["key"] == "claims" and section["title"] == CLAIMS_TITLE
    assert section["tables"] == ["claims.csv", "claims_controls.csv"]
    numbers = section["numbers"]
    assert numbers["budget"] == "quick" and numbers["alpha"] == result.alpha
    assert list(numbers["claims"]) == [r.name for r in result.rows]
    assert sum(numbers["verdicts"].values()) == len(result.rows)
    for row in result.rows:
        shown = numbers["claims"][row.name]
        assert shown["verdict"] == row.verdict and shown["reason"] == row.reason
        for key in ("effect", "lo", "hi"):
            assert _same(shown[key], getattr(row, key)), (row.name, key)
        assert list(shown["controls"]) == [c.name for c in row.controls]
        for c in row.controls:
            control = shown["controls"][c.name]
            assert _same(control["p"], c.p) and _same(control["p_adjusted"], c.p_adjusted)
            assert control["p_floor"] == c.p_floor and control["n_distinct"] == c.n_distinct
    assert report["provenance"]["config"]["claims"] == "quick"
    assert "claims" in report["provenance"]["steps_seconds"]


def test_csvs_are_the_results_frames(claims_report, result):
    for name, expected in (
        ("claims", result.to_frame()),
        ("claims_controls", result.controls_frame()),
    ):
        written = pd.read_csv(claims_report / f"{name}.csv", keep_default_na=False, na_values=[""])
        assert list(written.columns) == list(expected.columns)
        for column in expected.columns:
            if column == "seconds":  # wall time: another run's
                assert (written[column] >= 0).all()
            elif pd.api.types.is_numeric_dtype(expected[column]):
                assert written[column].to_numpy() == pytest.approx(
                    expected[column].to_numpy(), rel=1e-9, nan_ok=True
                ), column
            else:
                assert written[column].fillna("").astype(str).tolist() == [
                    str(v) for v in expected[column]
                ], column


def test_table_and_figure_show_the_results_numbers(page, result):
    section = page[page.index('<section id="claims">') : page.index('<p class="lead">Generated')]
    table = claims_table(result)
    for cells in table.drop(columns=["paper", "model"]).itertuples(index=False):
        for cell in cells:
            assert f">{html.escape(str(cell))}</td>" in section, cell
    for row in result.rows:
        assert html.escape(row.reason) in section
    # the forest plot: one plotly figure, the claimed sets' effects among its points
    assert section.count('class="plotly-graph-div"') == 1
    spec = json.loads(re.search(r"Plotly\.newPlot\(\s*\"[\w-]+\",\s*(\[.*?\]),\s*\{", section)[1])
    claimed = {
        re.match(r"<b>([^<]+)</b>", t["hovertemplate"])[1]: t["x"][0]
        for t in spec
        if t["y"] == ["claimed set"]
    }
    drawn = {r.name: r.effect for r in result.rows if math.isfinite(r.effect)}
    assert claimed.keys() == drawn.keys()
    for name, x in claimed.items():
        assert x == pytest.approx(drawn[name], rel=1e-12)


def test_no_section_without_a_budget(tiny, tmp_path):
    out = _report(tiny("llama"), tmp_path / "plain", quick=True)
    report = json.loads((out / "report.json").read_text())
    assert "claims" not in [s["key"] for s in report["sections"]]
    assert "claims" not in report["provenance"]["config"]
    assert not (out / "claims.csv").exists()
    assert '<section id="claims">' not in (out / "index.html").read_text(encoding="utf-8")


def test_a_budget_that_is_not_one_is_refused_before_the_model_loads(tmp_path):
    with pytest.raises(
        InputError, match=r"claims='fast' is not a claims budget: pass one of quick"
    ):
        build_report("no-such-model", out=tmp_path / "out", claims="fast")
    assert not (tmp_path / "out").exists()


def test_command_line_option(capsys):
    parser = build_parser()
    assert parser.parse_args(["report", "--claims", "thorough"]).claims == "thorough"
    assert parser.parse_args(["report"]).claims is None
    assert main(["report", "--claims", "fast"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert "argument --claims: invalid choice: 'fast' (choose from 'quick', 'standard'" in err
