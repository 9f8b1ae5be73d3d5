"""The result base: one file format for every result, load_result dispatch, merge checks, Jupyter
view, findings."""

from __future__ import annotations

import dataclasses
import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import ropelens
from ropelens import Bands, Provenance
from ropelens.analyses import result_classes
from ropelens.analyses.attention_by_distance import attention_by_distance
from ropelens.analyses.attention_decomposition import attention_decomposition
from ropelens.analyses.attention_sinks import AttentionSinks, attention_sinks
from ropelens.analyses.band_statistics import band_statistics
from ropelens.analyses.base_predictions import MeasuredExtrapolation, base_predictions
from ropelens.analyses.decay import rope_decay_constant
from ropelens.analyses.extension_planes import LongRopeSearch, extension_planes
from ropelens.analyses.frequency_usage import FrequencyUsage, frequency_usage
from ropelens.analyses.head_taxonomy import head_taxonomy
from ropelens.analyses.massive_values import massive_values
from ropelens.analyses.passkey_retrieval import PasskeyRetrieval, PasskeyTrial
from ropelens.analyses.pe_geometry import pe_similarity, sinusoidal_pe
from ropelens.analyses.rotary_offsets import rotary_offsets
from ropelens.analyses.trajectory import ANALYSES, STRUCTURES, Checkpoint, Trajectory
from ropelens.errors import InputError
from ropelens.results import result as result_base
from ropelens.results.findings import Finding, fixed, percent
from ropelens.results.result import Result, load_result, registered
from ropelens.spec.reading import rope_spec
from ropelens.spec.variants import Linear

BANDS = Bands.quantiles(2)
SAFETENSORS = (
    "AttentionDecomposition",
    "MRopeDecomposition",
)  # kinds that save q/k as safetensors, not JSON
# files written by ropelens while each result class still set KIND, FORMAT and its merge fields in
# its body
SAVED = Path(__file__).parent / "saved"


def _tokens(n: int = 2, seq: int = 16, seed: int = 0) -> torch.Tensor:
    toks = torch.randint(4, 101, (n, seq), generator=torch.Generator().manual_seed(seed))
    toks[:, 0] = 1
    return toks


@pytest.fixture(scope="module")
def results(tiny, tmp_path_factory) -> dict[str, Result]:
    """One of every registered result, as small as each can be."""
    from ropelens.analyses.band_location import band_location
    from ropelens.analyses.extension_study import extension_study
    from ropelens.analyses.frequency_entropy import frequency_entropy
    from ropelens.analyses.intervention_effect import intervention_effect
    from ropelens.analyses.knockout import knockout
    from ropelens.analyses.mrope_decomposition import mrope_decomposition
    from ropelens.analyses.positional_symbolic import positional_symbolic
    from ropelens.analyses.retrieval_heads import retrieval_heads
    from ropelens.claims import claims
    from ropelens.spec.variants import PRoPE
    from ropelens.testing import tiny_model
    from ropelens.testing.vl import vl_hf_model, vl_inputs

    model = tiny("llama-gqa")
    vl = vl_hf_model("qwen2_vl")
    toks = _tokens()
    kw = {"progress": False}
    prov = Provenance(model="tiny")
    trial = PasskeyTrial(
        length=64,
        depth=0.5,
        trial=0,
        passkey="12345",
        n_tokens=64,
        token_depth=0.5,
        response="12345",
        answer="12345",
        correct=True,
    )
    return {
        r.KIND: r
        for r in (
            frequency_usage(model, toks, **kw),
            band_statistics(model, toks, bands=BANDS, **kw),
            attention_sinks(model, toks, bands=BANDS, **kw),
            attention_by_distance(model, toks, bands=BANDS, **kw),
            massive_values(model, toks, **kw),
            rotary_offsets(model, toks, **kw),
            head_taxonomy(model, toks, n_ctx=16, n_windows=2, max_offset=2, layers=[0], **kw),
            intervention_effect(model, PRoPE(0.5), toks, layers=[1]),
            attention_decomposition(model, toks[:1], bands=BANDS, layers=[0]),
            mrope_decomposition(vl, **vl_inputs(vl), layers=[0]),
            PasskeyRetrieval(lengths=(64,), depths=(0.5,), trials=(trial,), provenance=prov),
            base_predictions(rope_spec(model), [64, 128]),
            MeasuredExtrapolation(
                lengths=(64,),
                estimates=(
                    {
                        "n_windows": 2,
                        "loss": {"mean": 1.0, "lo": 0.9, "hi": 1.1},
                        "perplexity": {"mean": 2.7, "lo": 2.5, "hi": 3.0},
                    },
                ),
                window_losses=((1.0, 1.0),),
                train_ctx=32,
                provenance=prov,
            ),
            extension_planes(rope_spec(model)[0], Linear(2.0), 32, 64),
            pe_similarity(sinusoidal_pe(32, 16), name="sinusoidal"),
            LongRopeSearch(
                target_len=64,
                original_ctx=32,
                factors=(1.0, 2.0),
                n_hat=0,
                perplexity=3.0,
                initial_best=3.5,
                baselines={"PI": 4.0},
                history=({"generation": 0, "best": 3.0, "mean": 3.5, "n_evaluated": 4},),
                settings={},
                provenance=prov,
            ),
            frequency_entropy(model, toks, n_ctx=16, **kw),
            band_location(model, toks, n_ctx=16, intervene=False, **kw),
            positional_symbolic(model, toks, n_ctx=16, min_keys=4, layers=[0], **kw),
            retrieval_heads(model, lengths=[300], depths=[0.5], n_trials=1, top_k=2, seed=2),
            knockout(
                model,
                {"set": [(0, 0), (1, 2)]},
                doses=[0, 2],
                metrics=("loss",),
                corpus=toks,
                n_random=1,
                n_control=1,
                n_boot=100,
                verify=False,
            ),
            extension_study(
                tiny_model("llama", max_position_embeddings=64),
                128,
                methods=("none", "pi"),
                start=64,
                n_windows=1,
                depths=(0.5,),
                out=tmp_path_factory.mktemp("study"),
                **kw,
            ),
            rope_decay_constant(torch.tensor([1.0, 0.1]), 8),
            claims(model, "base-bounds-context,qk-energy-lowest-band", "quick", progress=False),
            Trajectory(
                records=tuple(
                    (s, f"step-{s}", st.analysis, st.metric, -1, float(v))
                    for st in STRUCTURES
                    for s, v in ((0, 0.0), (100, 3.0))
                ),
                checkpoints=(Checkpoint(0, "step-0"), Checkpoint(100, "step-100")),
                analyses=ANALYSES,
                structures=STRUCTURES,
                provenance=prov,
            ),
        )
    }


def test_every_result_kind_is_registered_and_tested(results):
    """Every class is registered under its kind (its name) and previous kinds, and tested here."""
    assert result_classes() == registered()
    assert set(results) == {cls.KIND for cls in registered().values()}
    for kind, cls in registered().items():
        assert kind in (cls.KIND, *cls.PREVIOUS_KINDS) and cls.__name__ == cls.KIND
        assert cls.FORMAT == 1


def test_class_statement_declares_the_file(monkeypatch):
    """Kind (the class name unless given) and format 1 by default, registered at creation; merge
    fields, hint and JSON options pass to subclasses, kind, format and unversioned do not."""
    monkeypatch.setattr(
        result_base, "_REGISTRY", dict(result_base.registered())
    )  # the probes below leave no trace

    class Probe(
        Result,
        merge_same=("layers",),
        merge_sums=("sums",),
        merge_hint="align them",
        unversioned=True,
        json_options={"indent": None},
    ):
        pass

    class Renamed(Probe, kind="ProbeV2", format=2):
        pass

    assert (Probe.KIND, Probe.FORMAT, Probe.UNVERSIONED) == ("Probe", 1, True)
    assert (Renamed.KIND, Renamed.FORMAT, Renamed.UNVERSIONED) == ("ProbeV2", 2, False)
    assert (Renamed.MERGE_SAME, Renamed.MERGE_SUMS, Renamed.MERGE_HINT) == (
        ("layers",),
        ("sums",),
        "align them",
    )
    assert Renamed.JSON_OPTIONS == {"indent": None}
    assert registered()["Probe"] is Probe and registered()["ProbeV2"] is Renamed
    assert (FrequencyUsage.MERGE_SAME, FrequencyUsage.MERGE_SUMS) == (
        ("layers", "n_sink", "source", "spec"),
        ("token", "window", "unrotated_token", "unrotated_window"),
    )
    with pytest.raises(
        TypeError,
        match="'FrequencyUsage' is taken by ropelens.analyses.frequency_usage.FrequencyUsage",
    ):

        class Clash(Result, kind="FrequencyUsage"):
            pass

    with pytest.raises(
        TypeError, match="sets FORMAT, KIND in its body: declare them in the class statement"
    ):

        class InBody(Result):
            KIND = "InBody"
            FORMAT = 1

    assert "Clash" not in registered() and "InBody" not in registered()


def _json_value(path: Path, kind: str | None = None) -> str:
    """A JSON file's content, independent of key order and layout (NaN written as NaN); ``kind``
    replaces its type."""
    content = json.loads(path.read_text())
    if kind is not None:
        content["type"] = kind
    return json.dumps(content, sort_keys=True)


@pytest.mark.parametrize("path", sorted(SAVED.glob("*.json")), ids=lambda p: p.stem)
def test_files_saved_before_load_and_save_back_identical(path, tmp_path):
    """Files written by hand-written to_dict methods load, and save back holding the same JSON."""
    r = ropelens.load_result(path)
    assert path.stem in (type(r).KIND, *type(r).PREVIOUS_KINDS)
    r.save(tmp_path / path.name)  # a previous kind is written again under the class's own
    assert _json_value(tmp_path / path.name) == _json_value(path, type(r).KIND)


def test_load_result_knows_every_kind_in_a_fresh_process():
    """ropelens.load_result reads a kind whose module the caller never imported."""
    code = "import sys, ropelens; print(type(ropelens.load_result(sys.argv[1])).__name__)"
    for kind in ("FrequencyEntropy", "PositionalSymbolic"):
        out = subprocess.run(
            [sys.executable, "-c", code, str(SAVED / f"{kind}.json")],
            capture_output=True,
            text=True,
            check=True,
        )
        assert out.stdout.split()[-1] == kind


def test_load_result_dispatches_on_kind(results, tmp_path):
    for kind, r in results.items():
        path = tmp_path / (f"{kind}.safetensors" if kind in SAFETENSORS else f"{kind}.json")
        r.save(path)
        back = load_result(path)
        assert type(back) is type(r), kind
        assert (
            type(r).load(path).to_frame(*(() if kind not in SAFETENSORS else (0, 0))).shape
            == back.to_frame(*(() if kind not in SAFETENSORS else (0, 0))).shape
        )
        if kind not in SAFETENSORS:
            d = json.loads(path.read_text())
            assert (d["type"], d["format"]) == (kind, type(r).FORMAT)


def test_wrong_kind_or_format_is_named(results, tmp_path):
    path = tmp_path / "u.json"
    results["FrequencyUsage"].save(path)
    with pytest.raises(InputError, match="does not hold AttentionSinks.*'FrequencyUsage'"):
        AttentionSinks.load(path)
    d = json.loads(path.read_text())
    path.write_text(json.dumps({**d, "format": 99}))
    with pytest.raises(InputError, match="format 99"):
        FrequencyUsage.load(path)
    with pytest.raises(InputError, match="format 99"):
        load_result(path)
    path.write_text(json.dumps({**d, "type": "Nonsense"}))
    with pytest.raises(InputError, match="'Nonsense'"):
        load_result(path)
    path.write_text("[1, 2]")
    with pytest.raises(InputError, match="not a ropelens result"):
        load_result(path)


def test_files_from_before_the_result_base_still_load(results, tmp_path):
    """Usage, band statistics and head scores wrote a type and no format; plane views and searches
    neither."""
    for kind in (
        "FrequencyUsage",
        "BandStatistics",
        "HeadTaxonomy",
        "ExtensionPlanes",
        "LongRopeSearch",
    ):
        r = results[kind]
        old = (
            r.to_dict()
            if kind in ("ExtensionPlanes", "LongRopeSearch")
            else {"type": kind, **r.to_dict()}
        )
        path = tmp_path / f"{kind}.json"
        path.write_text(json.dumps(old))
        assert type(r).load(path).to_frame().shape == r.to_frame().shape
        if "type" in old:
            assert type(load_result(path)) is type(r)
    with pytest.raises(InputError, match="does not hold AttentionSinks"):
        AttentionSinks.load(tmp_path / "FrequencyUsage.json")
    untyped = {
        "type": "AttentionSinks",
        **{k: v for k, v in results["AttentionSinks"].to_dict().items()},
    }
    (tmp_path / "s.json").write_text(json.dumps(untyped))
    with pytest.raises(InputError, match="format None"):  # sinks always wrote a format
        AttentionSinks.load(tmp_path / "s.json")


def _elsewhere(r):
    """``r`` as if measured on other windows (the same sums): merging it with ``r`` doubles them."""
    prov = dataclasses.replace(r.provenance, spans={"tokens:elsewhere": [[0, 1]]})
    return dataclasses.replace(r, provenance=prov)


def test_merge_adds_sums_and_refuses_other_settings(results, tiny):
    model = tiny("llama-gqa")
    u = results["FrequencyUsage"]
    with pytest.raises(InputError, match="count them twice"):
        u.merge(u)  # the same windows twice
    twice = u.merge(_elsewhere(u))
    torch.testing.assert_close(twice.token[("q", "all")].total, 2 * u.token[("q", "all")].total)
    assert twice.provenance.n_tokens == 2 * u.provenance.n_tokens
    s = results["AttentionSinks"]
    torch.testing.assert_close(s.merge(_elsewhere(s)).sums["p0_sum"], 2 * s.sums["p0_sum"])
    other = attention_sinks(model, _tokens(), bands=BANDS, epsilon=0.5, progress=False)
    with pytest.raises(InputError, match=r"same layers.*epsilon differs \(0.3 vs 0.5\)"):
        s.merge(other)
    d = results["AttentionByDistance"]
    with pytest.raises(InputError, match="n_sink differs"):
        d.merge(attention_by_distance(model, _tokens(), bands=BANDS, n_sink=0, progress=False))
    m = results["MassiveValues"]
    with pytest.raises(InputError, match="factor differs.*with_factor"):
        m.merge(m.with_factor(9.0))
    o = results["RotaryOffsets"]
    with pytest.raises(InputError, match="sums keys differs"):
        o.merge(rotary_offsets(model, _tokens(), pre=False, progress=False))
    torch.testing.assert_close(o.merge(_elsewhere(o)).q.total, 2 * o.q.total)
    with pytest.raises(TypeError, match="AttentionSinks"):
        s.merge(u)
    with pytest.raises(InputError, match="do not merge"):
        results["HeadTaxonomy"].merge(results["HeadTaxonomy"])


def test_jupyter_shows_the_plotly_figure(results):
    for kind, r in results.items():
        bundle = r._repr_mimebundle_()
        assert "data" in bundle["application/vnd.plotly.v1+json"], kind
        assert bundle["text/plain"].startswith(kind)
    assert "tiny-llama-gqa" in results["FrequencyUsage"]._repr_mimebundle_()["text/plain"]
    assert "layers [0" in results["FrequencyUsage"]._repr_mimebundle_()["text/plain"]


def _quoted(values, text: str) -> None:
    if isinstance(values, dict):
        for v in values.values():
            _quoted(v, text)
    elif isinstance(values, list | tuple):
        for v in values:
            _quoted(v, text)
    elif isinstance(values, float):  # to 2 decimals, with no negative zero, or as a percentage
        quoted = {f"{values:.2f}", fixed(values), percent(values)}
        assert any(q in text for q in quoted), (values, text)
    elif isinstance(values, int) and not isinstance(values, bool):
        assert str(values) in text, (values, text)


def test_findings_quote_their_values(results):
    keys = {}
    for kind in ("FrequencyUsage", "BandStatistics", "AttentionSinks", "AttentionByDistance"):
        found = results[kind].findings()
        assert found and all(isinstance(f, Finding) for f in found), kind
        for f in found:
            _quoted(f.values, f.text)
        keys[kind] = [f.key for f in found]
    assert keys["FrequencyUsage"] == ["energy", "sink"]
    assert keys["BandStatistics"] == ["margin", "top1", "tightness"]
    assert keys["AttentionSinks"][0] == "sinks-0" and keys["AttentionSinks"][-1] == "sinks-2"
    assert keys["AttentionByDistance"][0] == "distance"
    assert all(k.startswith("distance-layer-") for k in keys["AttentionByDistance"][1:])
    assert (
        results["FrequencyUsage"]
        .findings(Bands.quantiles(4))[0]
        .values["q"]["band"]
        .startswith("Q")
    )
    assert results["PasskeyRetrieval"].findings() == []


def _assert_same(saved, loaded, where: str) -> None:
    """``loaded`` equals ``saved`` exactly: same types, tensor dtypes, values (NaN where NaN)."""
    if isinstance(saved, torch.Tensor):
        assert isinstance(loaded, torch.Tensor) and loaded.dtype == saved.dtype, where
        assert torch.equal(loaded.isnan(), saved.isnan()) if saved.is_floating_point() else True
        assert torch.equal(loaded.nan_to_num(0.5), saved.nan_to_num(0.5)), where
    elif dataclasses.is_dataclass(saved):
        assert type(loaded) is type(saved), where
        for f in dataclasses.fields(saved):
            if f.init:
                _assert_same(getattr(saved, f.name), getattr(loaded, f.name), f"{where}.{f.name}")
    elif isinstance(saved, dict):
        assert type(loaded) is dict and set(loaded) == set(saved), where
        for key, value in saved.items():
            _assert_same(value, loaded[key], f"{where}[{key!r}]")
    elif isinstance(saved, (tuple, list)):
        assert type(loaded) is type(saved) and len(loaded) == len(saved), where
        for i, (a, b) in enumerate(zip(saved, loaded)):
            _assert_same(a, b, f"{where}[{i}]")
    elif isinstance(saved, float) and math.isnan(saved):
        assert isinstance(loaded, float) and math.isnan(loaded), where
    else:
        assert loaded == saved, (where, saved, loaded)


def test_save_load_round_trip_is_exact_for_every_class(results, tmp_path):
    """Every registered result class saves and loads back field for field: values, types, dtypes."""
    assert {type(r) for r in results.values()} == set(result_classes().values())
    for kind, r in results.items():
        path = tmp_path / (f"{kind}.safetensors" if kind in SAFETENSORS else f"{kind}.json")
        r.save(path)
        _assert_same(r, type(r).load(path), kind)


def test_file_name_says_its_format(results, tmp_path):
    """A decomposition is safetensors and a JSON result JSON: a name saying otherwise is refused."""
    with pytest.raises(
        InputError,
        match=r"dec.json: AttentionDecomposition results are written as "
        r"safetensors.*name the file dec.safetensors",
    ):
        results["AttentionDecomposition"].save(tmp_path / "dec.json")
    with pytest.raises(InputError, match="written as JSON, not safetensors.*u.json"):
        results["FrequencyUsage"].save(tmp_path / "u.safetensors")
    assert not list(tmp_path.iterdir())
