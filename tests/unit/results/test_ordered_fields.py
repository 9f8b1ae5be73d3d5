"""Fields a result declares ``increasing`` (``AttentionByDistance.edges``: distance bin edges) are
checked on load: a file whose values do not increase strictly is refused in one line naming the
file and the field, before any figure or finding reads it."""

from __future__ import annotations

import gzip
import json
from dataclasses import dataclass
from pathlib import Path

import pytest

import ropelens
from ropelens.analyses import AttentionByDistance
from ropelens.errors import InputError
from ropelens.results import result as result_base
from ropelens.results.result import Result

SAVED = Path(__file__).parent / "saved" / "AttentionByDistance.json"


def saved_with_edges(tmp_path: Path, edges, name: str = "abd.json") -> Path:
    """The saved AttentionByDistance file with its ``edges`` replaced, written under ``tmp_path``
    (gzip-compressed where ``name`` ends in ``.gz``)."""
    content = json.loads(SAVED.read_text())
    content["edges"] = edges(content["edges"])
    path = tmp_path / name
    text = json.dumps(content).encode()
    path.write_bytes(gzip.compress(text) if name.endswith(".gz") else text)
    return path


def test_increasing_edges_load():
    abd = ropelens.load_result(SAVED)
    assert abd.edges.tolist() == [0, 1, 2, 4, 8, 16]
    assert abd.findings()  # the curves read the edges they were measured in


@pytest.mark.parametrize(
    ("edges", "message"),
    [
        (lambda e: e[::-1], "AttentionByDistance.edges[1] is 8 after 16"),
        (lambda e: [*e[:3], e[2], *e[4:]], "AttentionByDistance.edges[3] is 2 after 2"),
    ],
    ids=["reversed", "repeated"],
)
@pytest.mark.parametrize("name", ["abd.json", "abd.json.gz"])
def test_edges_that_do_not_increase_are_refused_on_load(tmp_path, edges, message, name):
    path = saved_with_edges(tmp_path, edges, name)
    with pytest.raises(InputError) as caught:
        ropelens.load_result(path)
    text = str(caught.value)
    assert text == f"{path}: {message}, expected values that increase strictly"
    with pytest.raises(InputError) as caught:
        AttentionByDistance.load(path)  # the class's own load checks them too
    assert str(caught.value) == text


def test_the_declaration_checks_any_result_class(monkeypatch):
    """``increasing=`` in the class statement is the whole declaration: from_dict checks it, and
    a subclass inherits it."""
    monkeypatch.setattr(result_base, "_REGISTRY", dict(result_base.registered()))  # leaves no trace

    @dataclass(frozen=True)
    class LengthCurve(Result, increasing=("lengths",)):
        lengths: tuple[int, ...]
        values: tuple[float, ...]

    class LongerCurve(LengthCurve):
        pass

    assert LengthCurve.INCREASING == LongerCurve.INCREASING == ("lengths",)
    good = LengthCurve.from_dict({"lengths": [64, 128, 256], "values": [1.0, 0.5, 0.25]})
    assert good.lengths == (64, 128, 256)
    bad = {"lengths": [64, 256, 128], "values": [1.0, 0.5, 0.25]}
    for cls in (LengthCurve, LongerCurve):
        with pytest.raises(InputError, match=r"\.lengths\[2\] is 128 after 256, expected"):
            cls.from_dict(bad)
