"""Files ropelens wrote (tests/fixtures/results) still load, with the numbers recorded there."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

import ropelens

FIXTURES = Path(__file__).parents[2] / "fixtures" / "results"
NUMBERS = json.loads((FIXTURES / "numbers.json").read_text())
SAFETENSORS = ("AttentionDecomposition", "MRopeDecomposition")


def _close(got: float | None, want: float | None) -> bool:
    if want is None:  # NaN when recorded
        return got is None or math.isnan(got)
    return got is not None and math.isclose(got, want, rel_tol=1e-6, abs_tol=1e-9)


@pytest.mark.parametrize(
    "name",
    sorted(n for n in NUMBERS if n not in ("DecayCurve.json", "report.json")),
)
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
