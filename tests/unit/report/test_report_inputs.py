"""build_report's inputs (a name, a path or a loaded model, with device and dtype checked up front)
and its two phases: every section measures first, then renderers lay out what was measured."""

from __future__ import annotations

import json

import pytest
import torch

import ropelens
from ropelens.errors import InputError
from ropelens.report import build as build_module
from ropelens.report import build_report, sections

N_CTX = 64


@pytest.fixture
def core_only(registry):
    """Only the sections drawn from the streaming pass: enough to see what model a report was made
    of."""
    registry.keep_sections(lambda s: s.measure is None)


def _model_name(out) -> str:
    report = json.loads((out / "report.json").read_text())
    assert report["provenance"]["model"] == report["model"]["name"]
    return report["model"]["name"]


def test_accepts_a_name_a_path_and_a_loaded_model(tiny_embedded, tiny_dir, tmp_path, core_only):
    path = tiny_dir("llama")
    kw = {"quick": True, "n_ctx": N_CTX, "progress": False, "device": "cpu"}
    assert _model_name(build_report(tiny_embedded, out=tmp_path / "name", **kw)) == tiny_embedded
    assert _model_name(build_report(path, out=tmp_path / "path", dtype="float32", **kw)) == str(
        path
    )
    loaded = ropelens.load_model(path, device="cpu")
    assert _model_name(build_report(loaded, out=tmp_path / "loaded", **kw)) == str(path)


def test_report_loads_with_the_dtype_asked_for(tiny_dir, tmp_path, core_only, monkeypatch):
    seen = {}

    def load(model, device, dtype):
        seen["dtype"] = dtype
        return real(model, device, dtype)

    real = build_module._load
    monkeypatch.setattr(build_module, "_load", load)
    build_report(
        tiny_dir("llama"),
        quick=True,
        n_ctx=N_CTX,
        out=tmp_path / "r",
        progress=False,
        dtype="bfloat16",
    )
    assert seen["dtype"] == torch.bfloat16


def test_conflicting_placement_of_a_loaded_model_is_refused(tiny, tmp_path):
    model = tiny("llama")
    with pytest.raises(InputError, match=r"device 'meta': meta tensors hold shapes but no values"):
        build_report(model, device="meta", out=tmp_path / "r")
    with pytest.raises(
        InputError,
        match=r"dtype='bfloat16' conflicts with the loaded model, whose weights are torch.float32",
    ):
        build_report(model, dtype="bfloat16", out=tmp_path / "r")
    with pytest.raises(InputError, match="unknown dtype 'float8'"):
        build_report(model, dtype="float8", out=tmp_path / "r")
    with pytest.raises(InputError, match="a model from ropelens.load_model; got a Linear"):
        build_report(torch.nn.Linear(2, 2), out=tmp_path / "r")
    with pytest.raises(InputError, match="batch_size"):
        build_report(model, batch_size=0, out=tmp_path / "r")
    assert not (tmp_path / "r").exists()  # every input is checked before anything is written


def test_renderers_only_read_what_was_measured(tiny, tmp_path, monkeypatch):
    """Once every section has measured, the model refuses to run, and the report still renders
    (twice)."""
    model = tiny("llama")
    captured = {}

    def refuse(*_args, **_kwargs):
        raise AssertionError("a renderer ran the model")

    def measure_then_lock(data, progress=False):
        real(data, progress)
        captured["data"] = data
        monkeypatch.setattr(model, "forward", refuse)
        monkeypatch.setattr(model.original_model, "forward", refuse)

    real = build_module.measure_sections
    monkeypatch.setattr(build_module, "measure_sections", measure_then_lock)
    out = build_report(model, tokens=4 * N_CTX, n_ctx=N_CTX, out=tmp_path / "r", progress=False)
    data = captured["data"]
    measured = [s for s in sections() if s.measure is not None]
    assert set(data.results) == {s.key for s in measured} | {"variants_baseline"}
    assert {s.step for s in measured} | {"variants_baseline"} <= set(data.steps)
    with pytest.raises(AssertionError, match="a renderer ran the model"):
        model(model.to_tokens("check the lock holds"))
    again = build_module.render_sections(data)
    report = json.loads((out / "report.json").read_text())
    assert [s.key for s in again] == [s["key"] for s in report["sections"]]
    assert [f.text for s in again for f in s.findings] == [f["text"] for f in report["findings"]]
    assert [sorted(s.tables) for s in again] == [
        [t.removesuffix(".csv") for t in sorted(s["tables"])] for s in report["sections"]
    ]


def test_rendering_before_measuring_says_so(tiny, tmp_path, monkeypatch):
    monkeypatch.setattr(build_module, "measure_sections", lambda data, progress=False: None)
    with pytest.raises(InputError, match="has not been measured: run measure_sections"):
        build_report(
            tiny("llama"), tokens=2 * N_CTX, n_ctx=N_CTX, out=tmp_path / "r", progress=False
        )
