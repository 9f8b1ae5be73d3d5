"""The quickstart notebook runs top to bottom on the embedded model."""

from __future__ import annotations

from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")

NOTEBOOK = Path(__file__).resolve().parents[2] / "docs" / "tutorials" / "quickstart.ipynb"

pytestmark = pytest.mark.integration


def test_quickstart_executes(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # the kernel inherits it: nothing reaches the hub
    nb = nbformat.read(NOTEBOOK, as_version=4)
    client = nbclient.NotebookClient(
        nb, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}
    )
    client.execute()
    errors = [
        o
        for c in nb.cells
        if c.cell_type == "code"
        for o in c.get("outputs", [])
        if o.output_type == "error"
    ]
    assert not errors
    outputs = [o for c in nb.cells for o in c.get("outputs", [])]
    figures = [o for o in outputs if "application/vnd.plotly.v1+json" in o.get("data", {})]
    assert (
        len(figures) == 4
    )  # two usage maps, the one-head decomposition and YaRN's planes, drawn inline
    text = "".join(o.get("text", "") for o in outputs if o.output_type == "stream")
    assert "of its attended-key margin from" in text
    deltas = {
        line.split(" Δ loss ")[0].strip(): float(line.split(" Δ loss ")[1])
        for line in text.splitlines()
        if " Δ loss " in line
    }
    assert (
        deltas["PRoPE(p=0.0)"] > deltas["PRoPE(p=0.75)"]
    )  # NoPE costs more than dropping the slowest quarter
    assert "'interpolated'" in text
