"""The tested stack: the lock setup.sh installs, ``ropelens --version``, and the report's warning
off that stack."""

from __future__ import annotations

from pathlib import Path

import pytest

import ropelens
from ropelens.cli import main
from ropelens.report.build import _untested_html
from ropelens.results import provenance
from ropelens.results.provenance import ROPELENS_VERSION, versions

ROOT = Path(__file__).resolve().parents[3]


def test_the_lock_pins_the_stack_and_setup_installs_from_it():
    tested = provenance.tested_versions()
    for name in ("torch", "transformers", "transformer-lens", "numpy", "plotly", "kaleido"):
        assert tested.get(name), name
    setup = (ROOT / "scripts" / "setup.sh").read_text()
    assert "-c src/ropelens/tested_versions.txt" in setup and "--latest" in setup
    assert f'"torch=={tested["torch"]}"' in setup  # the pin setup installs first is the tested one


def test_version_prints_the_versions_in_use_and_what_is_off_the_tested_stack(monkeypatch, capsys):
    provenance.versions.cache_clear()
    have = provenance.versions()
    assert main(["--version"]) == 0
    out = capsys.readouterr().out
    assert f"transformers {have['transformers']}" in out and f"torch {have['torch']}" in out
    monkeypatch.setattr(
        provenance, "tested_versions", lambda: {"transformers": "0.0.1", "torch": have["torch"]}
    )
    assert provenance.untested_versions() == {"transformers": (have["transformers"], "0.0.1")}
    assert main(["--version"]) == 0
    assert (
        f"not the tested stack: transformers {have['transformers']} (tested 0.0.1)"
        in capsys.readouterr().out
    )


def test_the_report_says_when_versions_differ_from_the_tested_ones():
    assert _untested_html({"untested_versions": {}}) == ""
    html = _untested_html(
        {"untested_versions": {"transformers": {"installed": "5.25.0", "tested": "5.24.0"}}}
    )
    assert "Not the tested stack" in html and "transformers 5.25.0 (tested 5.24.0)" in html


def test_ropelens_version_is_the_code_s_and_the_package_s():
    """Results record the version of the code that ran, the one pyproject.toml builds."""
    tomllib = pytest.importorskip("tomllib", reason="Python 3.10 has no tomllib")
    root = Path(__file__).resolve().parents[3]
    built = tomllib.loads((root / "pyproject.toml").read_text())["project"]["version"]
    assert versions()["ropelens"] == ROPELENS_VERSION == ropelens.__version__ == built
