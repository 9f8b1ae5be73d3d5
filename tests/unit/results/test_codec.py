"""The field codec: each dataclass field written and read as its declared type says."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import pytest
import torch
from jaxtyping import Float, Float32, Int
from torch import Tensor

from ropelens.errors import InputError
from ropelens.results import result as result_base
from ropelens.results.codec import BASE64, fields_from_dict, fields_to_dict
from ropelens.results.provenance import Provenance
from ropelens.results.result import Result
from ropelens.spec.bands import Bands


@dataclass(frozen=True)
class Trial:
    length: int
    depth: float
    answer: str | None = None


@dataclass(frozen=True)
class Probe:
    counts: Int[Tensor, " n"]
    means: Float[Tensor, " n"]
    table: Float32[Tensor, "n n"] = field(metadata=BASE64)
    sums: dict[str, Tensor] = field(default_factory=dict)
    planes: dict[tuple[int, int], tuple[int, ...]] = field(default_factory=dict)
    pairs: tuple[tuple[int, str], ...] = ()
    trials: tuple[Trial, ...] = ()
    bands: Bands | None = None
    extra: dict[str, Any] = field(default_factory=dict)


def _probe() -> Probe:
    return Probe(
        counts=torch.tensor([3, 0, 2]),
        means=torch.tensor([0.1, float("nan"), 1 / 3], dtype=torch.float64),
        table=torch.randn(3, 3, generator=torch.Generator().manual_seed(0)),
        sums={"n": torch.tensor([[1.0, 2.0]], dtype=torch.float64)},
        planes={(0, 1): (3, 4), (2, 0): ()},
        pairs=((1, "a"), (2, "b")),
        trials=(Trial(64, 0.5, "123"), Trial(128, 1.0)),
        bands=Bands.quantiles(2),
        extra={"free": [1, "x", None]},
    )


def test_every_field_round_trips_through_json_with_its_type_and_dtype():
    probe = _probe()
    written = json.loads(json.dumps(fields_to_dict(probe)))  # through JSON text, as on disk
    back = fields_from_dict(Probe, written)
    assert back.counts.dtype == torch.int64 and torch.equal(back.counts, probe.counts)
    assert back.means.dtype == torch.float64
    assert torch.equal(back.means.isnan(), probe.means.isnan())
    assert back.means[0] == probe.means[0] and back.means[2] == probe.means[2]  # float64 exact
    assert back.table.dtype == torch.float32 and torch.equal(back.table, probe.table)
    assert torch.equal(back.sums["n"], probe.sums["n"]) and back.sums["n"].dtype == torch.float64
    assert back.planes == probe.planes and back.pairs == probe.pairs
    assert back.trials == probe.trials and back.bands == probe.bands
    assert back.extra == probe.extra


def test_layout_on_disk():
    """Tensors as lists (base64 where declared), tuple keys joined by '/', dataclasses as dicts."""
    written = fields_to_dict(_probe())
    assert written["counts"] == [3, 0, 2]
    assert set(written["table"]) == {"shape", "dtype", "base64"}
    assert written["planes"] == {"0/1": [3, 4], "2/0": []}
    assert written["pairs"] == [[1, "a"], [2, "b"]]
    assert written["trials"][1] == {"length": 128, "depth": 1.0, "answer": None}
    assert written["bands"] == Bands.quantiles(2).to_dict()


def test_tuple_keys_also_read_from_rows():
    """Tuple-keyed dicts once were written as [*key, value] rows: those files still load."""
    written = fields_to_dict(_probe())
    back = fields_from_dict(Probe, {**written, "planes": [[0, 1, [3, 4]], [2, 0, []]]})
    assert back.planes == {(0, 1): (3, 4), (2, 0): ()}


def test_defaults_fill_missing_fields_and_strangers_are_named():
    written = fields_to_dict(_probe())
    minimal = {k: written[k] for k in ("counts", "means", "table")}
    assert fields_from_dict(Probe, minimal).trials == ()
    with pytest.raises(InputError, match="Probe needs 'means', which the file lacks"):
        fields_from_dict(Probe, {"counts": [1], "table": written["table"]})
    with pytest.raises(InputError, match="Probe has no field 'meens'"):
        fields_from_dict(Probe, {**written, "meens": []})
    with pytest.raises(InputError, match="Trial.length is the string 'long', expected an integer"):
        fields_from_dict(Trial, {"length": "long", "depth": 0.5})


def test_result_writes_derived_values_and_reads_past_them(monkeypatch, tmp_path):
    """``derived`` attributes are written after the fields, for readers, and never read back."""
    monkeypatch.setattr(result_base, "_REGISTRY", dict(result_base.registered()))

    @dataclass(frozen=True)
    class Counted(Result, derived=("total", "doubled")):
        counts: tuple[int, ...]
        provenance: Provenance

        @property
        def total(self) -> int:
            return sum(self.counts)

        def doubled(self) -> list[int]:
            return [2 * c for c in self.counts]

    counted = Counted((1, 2), Provenance(model="tiny"))
    counted.save(tmp_path / "c.json")
    on_disk = json.loads((tmp_path / "c.json").read_text())
    assert list(on_disk) == ["type", "format", "counts", "provenance", "total", "doubled"]
    assert (on_disk["total"], on_disk["doubled"]) == (3, [2, 4])
    assert Counted.load(tmp_path / "c.json") == counted
