"""Files ropelens wrote (tests/fixtures/results) still load, with the numbers recorded there."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

import ropelens
from ropelens.errors import InputError
from ropelens.results.report_file import ReportSummary

FIXTURES = Path(__file__).parents[2] / "fixtures" / "results"
NUMBERS = json.loads((FIXTURES / "numbers.json").read_text())
SAFETENSORS = ("AttentionDecomposition", "MRopeDecomposition")


def _close(got: float | None, want: float | None) -> bool:
    if want is None:  # NaN when recorded
        return got is None or math.isnan(got)
    return got is not None and math.isclose(got, want, rel_tol=1e-6, abs_tol=1e-9)


@pytest.mark.parametrize("name", sorted(n for n in NUMBERS if n != "report.json"))
def test_saved_result_loads_with_its_numbers(name):
    """Each file loads as its kind; its table has the shape and column sums of the result saved."""
    recorded = NUMBERS[name]
    result = ropelens.load_result(FIXTURES / name)
    assert type(result).__name__ == recorded["kind"]
    frame = result.to_frame(0, 0) if recorded["kind"] in SAFETENSORS else result.to_frame()
    assert list(frame.shape) == recorded["shape"]
    numeric = frame.select_dtypes("number")
    assert sorted(map(str, numeric.columns)) == sorted(recorded["column_sums"])
    for column, want in recorded["column_sums"].items():
        got = float(numeric[column].sum(skipna=True))
        assert _close(got, want), (column, got, want)


def test_report_json_loads_as_its_sections_findings_and_numbers():
    """A report's report.json (which carries no type) loads as a summary of what it holds."""
    recorded = NUMBERS["report.json"]
    raw = json.loads((FIXTURES / "report.json").read_text())
    report = ropelens.load_result(FIXTURES / "report.json")
    assert isinstance(report, ReportSummary)
    assert [s.key for s in report.sections] == recorded["sections"]
    assert len(report.findings) == recorded["n_findings"]
    assert report.model["name"] == recorded["model"] == report.provenance.model
    assert report.findings[0].text == raw["findings"][0]["text"]
    usage = report.section("frequency-usage")
    assert usage.numbers == raw["sections"][1]["numbers"] == report.numbers["frequency-usage"]
    assert usage.tables == tuple(raw["sections"][1]["tables"])
    assert report.steps_seconds == raw["provenance"]["steps_seconds"]
    frame = report.to_frame()
    factor = frame[(frame.section == "massive-values") & (frame.number == "factor")]
    assert factor.value.tolist() == [raw["sections"][6]["numbers"]["factor"]]
    with pytest.raises(InputError, match="no section 'nonsense'.*frequency-usage"):
        report.section("nonsense")


def test_report_json_of_another_format_is_refused(tmp_path):
    raw = json.loads((FIXTURES / "report.json").read_text())
    (tmp_path / "report.json").write_text(json.dumps({**raw, "format": 99}))
    with pytest.raises(InputError, match="format 99.*build the report again"):
        ropelens.load_result(tmp_path / "report.json")
