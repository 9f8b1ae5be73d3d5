"""Every number the report's findings print on the embedded models, read back from the CSVs beside
them (the checks of tests/unit/report/test_findings_from_tables.py, on a small token budget)."""

from __future__ import annotations

import pytest

from ropelens.report import build_report
from tests.unit.report.test_findings_from_tables import CHECKS, check_report

pytestmark = pytest.mark.integration


@pytest.mark.parametrize("name", ["smollm2", "gemma3"])
def test_findings_quote_their_tables(name, request, tmp_path):
    out = build_report(
        request.getfixturevalue(name), corpus="english", tokens=2048, n_ctx=512,
        band_tokens=1024, out=tmp_path / "report", progress=False,
    )  # fmt: skip
    n_findings, n_numbers = check_report(out)
    assert n_findings >= len(CHECKS) - 1 and n_numbers >= 60
