"""The command line on tiny models saved as HF directories."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from ropelens import RopeSpec, rope_spec
from ropelens.cli import main


def error_lines(err: str) -> list[str]:
    return [line for line in err.splitlines() if line.startswith("ropelens: error:")]


def test_inspect_table(tiny_dir, capsys):
    assert main(["rope-spec", str(tiny_dir("gemma3")), "--device", "cpu"]) == 0
    out = capsys.readouterr().out
    assert "Gemma3ForCausalLM" in out
    lines = {line.split("  ")[0]: line for line in out.splitlines()}
    assert lines[""].split() == ["sliding", "full"]
    assert lines["base"].split()[1:] == ["10000", "1e+06"]
    assert lines["layers"].split()[1:] == ["0-2", "(3)", "3", "(1)"]
    assert lines["window"].split()[1:] == ["8", "-"]
    assert lines["heads / kv heads"].split()[-3:] == ["4", "/", "2"]
    assert "16 of 16 (8 planes)" in lines["rotary dim"]
    assert "planes beyond n_ctx" in lines


def test_inspect_table_gptj(tiny_dir, capsys):
    assert main(["rope-spec", str(tiny_dir("gptj"))]) == 0
    out = capsys.readouterr().out
    assert "adjacent (2i, 2i+1)" in out
    assert "8 of 16 (4 planes)" in out


def test_inspect_json(tiny_dir, tiny, capsys):
    assert main(["rope-spec", str(tiny_dir("gemma3")), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)  # strict JSON: no NaN or Infinity
    assert [row["kind"] for row in data["summary"]] == ["sliding", "full"]
    assert [row["window"] for row in data["summary"]] == [8, None]
    assert data["n_layers"] == len(data["layers"]) == 4
    assert data["layers"][3]["base"] == 1e6
    spec = RopeSpec.from_dict(data)  # the JSON is a complete spec, inv_freq included
    for ours, theirs in zip(spec.layers, rope_spec(tiny("gemma3")).layers, strict=True):
        assert ours.same_rotation(theirs)


@pytest.mark.parametrize(
    ("argv", "match"),
    [
        (["rope-spec", "no-such-model"], "cannot load model 'no-such-model'"),
        (["rope-spec", "/no/such/model.gguf"], "does not exist"),
        (["rope-spec", "llama", "--device", "gpu0"], "unknown device 'gpu0'"),
        (["rope-spec", "--frobnicate"], "unrecognized arguments: --frobnicate"),
        (["frobnicate"], "invalid choice: 'frobnicate'"),
        ([], "required: COMMAND"),
    ],
)
def test_bad_input_exits_2_with_one_line(argv, match, capsys):
    assert main(argv) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert "Traceback" not in captured.err
    lines = error_lines(captured.err)
    assert len(lines) == 1 and match in lines[0], captured.err


def test_non_rope_model_exits_2(tiny_dir, capsys):
    assert main(["rope-spec", str(tiny_dir("gpt2"))]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    assert len(error_lines(err)) == 1 and "not RoPE" in error_lines(err)[0]


def test_bad_input_message_is_a_single_line_even_for_multiline_errors(
    tmp_path, capsys, monkeypatch
):
    monkeypatch.setenv("ROPELENS_CACHE", str(tmp_path / "cache"))
    (tmp_path / "x.gguf").write_bytes(b"garbage\n" * 50)
    assert main(["rope-spec", str(tmp_path / "x.gguf")]) == 2
    lines = error_lines(capsys.readouterr().err)
    assert len(lines) == 1 and "could not read GGUF file" in lines[0]


def test_debug_env_reraises(monkeypatch):
    monkeypatch.setenv("ROPELENS_DEBUG", "1")
    with pytest.raises(ValueError, match="unknown device"):
        main(["rope-spec", "x", "--device", "gpu0"])


def test_help_exits_0(capsys):
    assert main(["--help"]) == 0
    assert "rope-spec" in capsys.readouterr().out
    assert main(["rope-spec", "--help"]) == 0
    out = capsys.readouterr().out
    assert "--device" in out and "--json" in out


def test_python_dash_m(tiny_dir):
    done = subprocess.run(
        [sys.executable, "-m", "ropelens", "rope-spec", str(tiny_dir("llama")), "--json"],
        capture_output=True,
        text=True,
        stdin=subprocess.DEVNULL,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["architecture"] == "LlamaForCausalLM"
    assert done.stderr == ""  # no progress bars from a cached load of a local model


def test_variants_and_truncate_commands(tiny_dir, capsys):
    import json as _json

    from ropelens.cli import main

    path = str(tiny_dir("llama"))
    assert (
        main(["variant-frequencies", path, "--variant", "prope:0.5", "--variant", "nope", "--json"])
        == 0
    )
    rows = _json.loads(capsys.readouterr().out)
    after = rows[0]["inv_freq_after"]
    assert (
        len(after) == 8 and after[4:] == [0.0] * 4 and after[:4] == rows[0]["inv_freq_before"][:4]
    )
    assert all(v == 0.0 for v in rows[1]["inv_freq_after"])
    assert (
        main(["prope-sweep", path, "--p", "0,1", "--tokens", "64", "--n-ctx", "32", "--json"]) == 0
    )
    out = _json.loads(capsys.readouterr().out)
    assert [r["p"] for r in out["rows"]] == [0.0, 1.0] and all(
        r["ppl_lo"] <= r["ppl"] <= r["ppl_hi"] for r in out["rows"]
    )
    assert main(["variant-frequencies", path, "--variant", "warp:3"]) == 2
    assert "unknown variant" in capsys.readouterr().err
    assert main(["prope-sweep", path, "--p", "1.5"]) == 2


def test_dtype_option_loads_in_that_dtype(tiny_dir, monkeypatch, capsys):
    """--dtype bfloat16 reaches load_model; an unknown dtype is a one-line usage error."""
    from ropelens.cli import common

    seen = {}
    real = common.load_model

    def spy(name, **kw):
        seen.update(kw)
        return real(name, **kw)

    monkeypatch.setattr(common, "load_model", spy)
    assert (
        main(
            [
                "frequency-usage",
                str(tiny_dir("llama")),
                "--dtype",
                "bfloat16",
                "--tokens",
                "64",
                "--n-ctx",
                "32",
                "--json",
            ]
        )
        == 0
    )
    assert seen["dtype"] is torch.bfloat16
    out = json.loads(capsys.readouterr().out)
    assert all(abs(sum(row) - 1) < 1e-3 for row in out["q_energy_share"])
    assert main(["rope-spec", "--dtype", "int8"]) == 2
    assert "invalid choice: 'int8'" in capsys.readouterr().err


def test_sinks_distance_and_decompose_stats_commands(tiny_dir, tmp_path, capsys):
    """The commands run, print JSON that agrees with the saved results, and refuse bad input."""
    import json as _json

    from ropelens.analyses.attention_sinks import AttentionSinks
    from ropelens.analyses.band_statistics import BandStatistics

    path = str(tiny_dir("gemma3"))
    common = ["--n-ctx", "32", "--tokens", "64", "--device", "cpu"]
    assert (
        main(["attention-sinks", path, *common, "--json", "--save", str(tmp_path / "s.json")]) == 0
    )
    out = _json.loads(capsys.readouterr().out)
    saved = AttentionSinks.load(tmp_path / "s.json")
    assert [r["layer"] for r in out["layers"]] == list(saved.layers)
    assert main(["attention-by-distance", path, *common, "--json"]) == 0
    shapes = _json.loads(capsys.readouterr().out)["shapes"]
    assert {r["curve"] for r in shapes} >= {"logit", "prob"}
    assert (
        main(["band-statistics", path, *common, "--json", "--save", str(tmp_path / "b.json")]) == 0
    )
    rows = _json.loads(capsys.readouterr().out)["rows"]
    st = BandStatistics.load(tmp_path / "b.json")
    assert len(rows) == len(st.layers) * len(st.band_names)
    assert main(["attention-sinks", path, *common, "--epsilon", "1.5"]) == 2
    assert "--epsilon must be > 0 and <= 1, got 1.5" in capsys.readouterr().err


def test_massive_and_passkey_commands(tiny_dir, tmp_path, capsys):
    import json as _json

    from ropelens.analyses.massive_values import MassiveValues
    from ropelens.analyses.passkey_retrieval import PasskeyRetrieval

    path = str(tiny_dir("llama-gqa"))
    assert (
        main(
            [
                "massive-values",
                path,
                "--n-ctx",
                "32",
                "--tokens",
                "64",
                "--factor",
                "1.5",
                "--json",
                "--save",
                str(tmp_path / "m.json"),
            ]
        )
        == 0
    )
    out = _json.loads(capsys.readouterr().out)
    mv = MassiveValues.load(tmp_path / "m.json")
    assert mv.factor == 1.5 and sum(r["n_massive"] for r in out["planes"]) == int(
        mv.plane_mask("q").sum() + mv.plane_mask("k").sum()
    )
    assert (
        main(
            [
                "passkey-retrieval",
                path,
                "--lengths",
                "300",
                "--depths",
                "0.5",
                "--trials",
                "1",
                "--variant",
                "ntk:2",
                "--json",
                "--save",
                str(tmp_path / "p.json"),
            ]
        )
        == 0
    )
    cells = _json.loads(capsys.readouterr().out)["cells"]
    assert (
        len(cells) == 1 and PasskeyRetrieval.load(tmp_path / "p.json").variant["variant"] == "NTK"
    )
    assert main(["passkey-retrieval", path, "--lengths", "a,b"]) == 2
    assert "--lengths must be a comma-separated list" in capsys.readouterr().err
    assert main(["massive-values", path, "--factor", "0.5"]) == 2


def test_bands_and_entropy_commands(tiny_dir, tmp_path, capsys):
    """bands prints each layer's band and the intervention; entropy covers the NoPE layers of a
    SmolLM3."""
    from ropelens.analyses.band_location import BandLocation
    from ropelens.analyses.frequency_entropy import FrequencyEntropy
    from ropelens.testing.families import family_model_dir

    path = str(tiny_dir("llama-gqa"))
    assert (
        main(
            [
                "band-location",
                path,
                "--n-ctx",
                "32",
                "--tokens",
                "128",
                "--eval-windows",
                "2",
                "--seed",
                "3",
                "--json",
                "--save",
                str(tmp_path / "b.json"),
            ]
        )
        == 0
    )
    out = json.loads(capsys.readouterr().out)
    r = BandLocation.load(tmp_path / "b.json")
    assert [row["hi"] for row in out["layers"]] == r.bands().hi.tolist() and out["intervention"][
        "seed"
    ] == 3
    assert (
        main(
            [
                "band-location",
                path,
                "--n-ctx",
                "32",
                "--tokens",
                "128",
                "--no-intervene",
                "--which",
                "k",
            ]
        )
        == 0
    )
    text = capsys.readouterr().out
    assert "band of the keys" in text and "random planes" not in text
    assert main(["band-location", path, "--which", "v"]) == 2
    smol = str(family_model_dir("smollm3", tmp_path / "smollm3"))
    assert (
        main(
            [
                "frequency-entropy",
                smol,
                "--n-ctx",
                "32",
                "--tokens",
                "64",
                "--json",
                "--save",
                str(tmp_path / "e.json"),
            ]
        )
        == 0
    )
    out = json.loads(capsys.readouterr().out)
    e = FrequencyEntropy.load(tmp_path / "e.json")
    assert [row["kind"] for row in out["layers"]] == ["full", "nope", "full", "nope"]
    assert out["layers"][1]["entropy"] == pytest.approx(float(e.entropy()[1].nanmean()))
    assert main(["frequency-entropy", smol, "--n-ctx", "32", "--tokens", "64", "--skip", "30"]) == 2
    assert "a spectrum needs at least 4" in capsys.readouterr().err


def test_offsets_and_predict_base_commands(tiny_dir, capsys):
    import json as _json

    from ropelens import load_model
    from ropelens.analyses.base_predictions import critical_base, extrapolation_limit

    path = str(tiny_dir("llama-gqa"))
    assert main(["rotary-offsets", path, "--n-ctx", "32", "--tokens", "64", "--json"]) == 0
    summary = _json.loads(capsys.readouterr().out)["summary"]
    assert {r["cycle"] for r in summary} <= {"partial cycle", "full cycle"}
    assert main(["base-predictions", path, "--lengths", "64,512", "--json"]) == 0
    rows = _json.loads(capsys.readouterr().out)["rows"]
    spec = rope_spec(load_model(path, device="cpu"))
    lr = spec.layers[0]
    assert [r["length"] for r in rows] == [64, 512]
    assert rows[1]["t_extra"] == pytest.approx(
        extrapolation_limit(lr.base, lr.rotary_dim, spec.n_ctx)
    )
    assert rows[1]["critical_base"] == pytest.approx(critical_base(spec.n_ctx, 512, lr.base))
    assert main(["base-predictions", path, "--lengths", "x"]) == 2


CORPUS_COMMANDS = (
    "frequency-usage",
    "band-statistics",
    "attention-sinks",
    "attention-by-distance",
    "massive-values",
    "rotary-offsets",
    "band-location",
    "frequency-entropy",
    "positional-symbolic",
)


@pytest.mark.parametrize("command", CORPUS_COMMANDS)
def test_corpus_commands_share_their_options(command, tmp_path):
    """Every corpus command takes the same model, corpus, layers, checkpoint and output flags."""
    from ropelens.cli import build_parser

    args = build_parser().parse_args(
        [
            command,
            "some-model",
            "--save",
            str(tmp_path / "r.json"),
            "--json",
            "--device",
            "cpu",
            "--dtype",
            "bfloat16",
            "--layers",
            "0,2",
            "--corpus",
            "python",
            "--tokens",
            "64",
            "--n-ctx",
            "32",
            "--checkpoint",
            str(tmp_path),
            "--checkpoint-every",
            "3",
        ]
    )
    assert (args.model, args.save, args.json, args.device, args.dtype) == (
        "some-model",
        str(tmp_path / "r.json"),
        True,
        "cpu",
        "bfloat16",
    )
    assert (args.layers, args.corpus, args.tokens, args.n_ctx) == ([0, 2], "python", 64, 32)
    assert (args.checkpoint, args.checkpoint_every) == (str(tmp_path), 3)


@pytest.mark.parametrize("command", CORPUS_COMMANDS)
def test_fewer_tokens_than_one_window_is_one_message(command, capsys):
    """The check runs before any model loads (the model name does not exist) and reads the same
    everywhere."""
    assert main([command, "no-such-model", "--tokens", "16", "--n-ctx", "32"]) == 2
    lines = error_lines(capsys.readouterr().err)
    assert lines == [
        "ropelens: error: --tokens 16 is fewer than one window of --n-ctx 32: "
        "raise --tokens or lower --n-ctx"
    ]


def test_every_corpus_command_takes_checkpoint():
    """Every command that streams a corpus resumes from --checkpoint (heads too)."""
    from ropelens.cli.main import build_parser

    parser = build_parser()
    for command in (
        "frequency-usage",
        "band-statistics",
        "head-taxonomy",
        "attention-sinks",
        "attention-by-distance",
        "massive-values",
        "rotary-offsets",
    ):
        args = parser.parse_args([command, "--checkpoint", "ck", "--checkpoint-every", "3"])
        assert (args.checkpoint, args.checkpoint_every) == ("ck", 3), command


def test_heads_save_and_strict_json(tiny_dir, tmp_path, monkeypatch, capsys):
    """heads --save writes the taxonomy; a NaN in the table prints as null; --out still works, with
    a warning."""
    from ropelens.analyses.head_taxonomy import HeadTaxonomy

    real = HeadTaxonomy.to_frame

    def with_nan(self):
        df = real(self)
        df.loc[0, "mass_text"] = float("nan")
        return df

    monkeypatch.setattr(HeadTaxonomy, "to_frame", with_nan)
    path, saved = str(tiny_dir("llama")), tmp_path / "tx.json"
    assert (
        main(
            [
                "head-taxonomy",
                path,
                "--tokens",
                "64",
                "--n-ctx",
                "32",
                "--json",
                "--save",
                str(saved),
            ]
        )
        == 0
    )
    captured = capsys.readouterr()
    got = json.loads(captured.out, parse_constant=lambda c: pytest.fail(f"non-JSON constant {c}"))
    assert got["heads"][0]["mass_text"] is None
    assert HeadTaxonomy.load(saved).tau == got["tau"]


@pytest.mark.parametrize(
    "argv",
    [["variant-frequencies", "--variant", "warp:3"], ["passkey-retrieval", "--variant", "warp:3"]],
)
def test_unknown_variant_lists_the_registry(argv, capsys):
    """One error line naming every variant class ropelens.spec.variants exports (before any model
    loads)."""
    from ropelens.spec import variants as V

    assert main([argv[0], "no-such-model", *argv[1:]]) == 2
    lines = error_lines(capsys.readouterr().err)
    assert len(lines) == 1 and "unknown variant 'warp:3'" in lines[0]
    names = [n.lower() for n in V.__all__ if isinstance(getattr(V, n), type) and n != "RopeVariant"]
    listed = [form.split(":")[0] for form in lines[0].split("use one of ")[1].split(", ")]
    assert listed == names


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        ("prope-reversed:0.5", "PRoPEReversed(p=0.5)"),
        ("base:500000", "BaseChange(base=500000.0)"),
        ("yarn:4:2048", "YaRN(factor=4.0, original_max_position=2048"),
        ("llama3:8:1:4:8192", "Llama3(factor=8.0"),
    ],
)
def test_variant_spellings(spec, expected):
    from ropelens.cli.variant_syntax import parse_variant

    assert parse_variant(spec).name.startswith(expected)


def test_emit_is_strict_json(capsys):
    import numpy as np

    from ropelens.cli.common import emit

    emit(
        {
            "a": float("nan"),
            "b": [float("inf"), np.float32(1.5)],
            "window": 8.0,
            "c": (1, float("-inf")),
        }
    )
    assert json.loads(capsys.readouterr().out) == {
        "a": None,
        "b": ["inf", 1.5],
        "window": 8,
        "c": [1, "-inf"],
    }


def test_inspect_families_lists_the_matrix_without_a_model(capsys, monkeypatch):
    """Every family of the matrix, exact or refused with its reason, and no model loaded or
    built."""
    import ropelens.cli.common as common
    import ropelens.testing.families as families
    from ropelens.testing.families import FAMILIES

    def no_model(*_a, **_k):
        raise AssertionError("--families must not load or build a model")

    monkeypatch.setattr(common, "load_model", no_model)
    monkeypatch.setattr(families, "family_hf_model", no_model)
    assert main(["rope-spec", "--families"]) == 0
    rows = {line.split()[0]: line for line in capsys.readouterr().out.splitlines()[3:] if line}
    assert set(rows) == set(FAMILIES)
    for name, fam in FAMILIES.items():
        status = rows[name][len(name) :].split("  ")
        status = next(s.strip() for s in status if s.strip())
        assert (
            status == "exact"
            if fam.refused is None
            else status.startswith("refused") and fam.refused in status
        )
    assert rows["nanochat"].split()[1] == "exact" and rows["ministral"].split()[1] == "exact"
    assert "differential attention" in rows["diffllama"]
    assert main(["rope-spec", "--families", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert [d["family"] for d in data] == list(FAMILIES)
    assert {d["family"]: d["reason"] for d in data} == {n: f.refused for n, f in FAMILIES.items()}
    assert {d["status"] for d in data} == {"exact", "refused"}


def test_inspect_families_with_a_model_exits_2(capsys):
    assert main(["rope-spec", "llama", "--families"]) == 2
    lines = error_lines(capsys.readouterr().err)
    assert len(lines) == 1 and "--families lists the supported families without a model" in lines[0]


def test_no_adapter_message_names_the_families_listing(monkeypatch):
    """The one-line refusal of an architecture the bridge cannot wrap points to `ropelens rope-spec
    --families`."""
    from ropelens.errors import UnsupportedModelError
    from ropelens.loading import models

    class Model:
        config = None

    with (
        pytest.raises(UnsupportedModelError, match=r"ropelens rope-spec --families"),
        models._bridge_errors(Model()),
    ):
        raise ValueError("Could not determine supported architecture for Model")


def test_possym_command(tiny_dir, tmp_path, capsys):
    """possym prints JSON that agrees with the saved result and refuses a bad margin."""
    import json as _json

    from ropelens.analyses.positional_symbolic import PositionalSymbolic

    path = str(tiny_dir("llama-gqa"))
    common = ["--n-ctx", "32", "--tokens", "64", "--device", "cpu"]
    assert (
        main(["positional-symbolic", path, *common, "--json", "--save", str(tmp_path / "ps.json")])
        == 0
    )
    out = _json.loads(capsys.readouterr().out)
    saved = PositionalSymbolic.load(tmp_path / "ps.json")
    assert [r["call_logit"] for r in out["heads"]] == [
        c for row in saved.calls("logit") for c in row
    ]
    assert out["heads"][0]["positional_attention"] == pytest.approx(
        float(saved.scores("attention")[0][0, 0])
    )
    assert main(["positional-symbolic", path, *common, "--margin", "1.5"]) == 2
    assert "--margin must be >= 0 and <= 1, got 1.5" in capsys.readouterr().err


def test_extend_command_end_to_end(tmp_path, capsys):
    """ropelens extension-study writes the page, the tables and one cell per (method, length); a
    rerun reads them."""
    from ropelens.analyses.extension_study import ExtensionStudy
    from ropelens.testing import tiny_model_dir

    path = str(tiny_model_dir("llama", tmp_path / "m", max_position_embeddings=64))
    out = tmp_path / "ext"
    argv = [
        "extension-study",
        path,
        "--to",
        "256",
        "--start",
        "128",
        "--methods",
        "none,pi,yarn",
        "--windows",
        "1",
        "--passkey-lengths",
        "256",
        "--depths",
        "0.5",
        "--out",
        str(out),
    ]
    assert main([*argv, "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert {f["key"] for f in data["findings"]} >= {
        "recommend",
        "loss_yarn",
        "passkey",
        "planes_pi",
    }
    assert len(data["loss"]) == 3 * 2 and len(data["passkey"]) == 3
    assert (out / "index.html").exists() and len(list((out / "cells").glob("*.json"))) == 3 * 2 + 3
    st = ExtensionStudy.load(out / "study.json")
    assert st.methods == ("none", "pi", "yarn") and st.provenance.config["cells_reused"] == 0
    assert main(argv) == 0
    # one window per length gives no interval, so no method is recommended over another
    said = capsys.readouterr().out
    assert "no method is better beyond its interval" in said and " use " not in said
    assert "n/a (one window gives no spread)" in said
    assert ExtensionStudy.load(out / "study.json").provenance.config["cells_reused"] == 9


@pytest.mark.parametrize(
    ("extra", "match"),
    [
        (["--to", "64"], "the target 64 must exceed the native context 64"),
        (["--to", "256", "--native", "512"], "--to 256 must exceed --native 512"),
        (["--to", "256", "--methods", "yarn,rope2"], "--methods 'yarn,rope2': unknown ['rope2']"),
        (
            ["--to", "256", "--lengths", "a,b"],
            "--lengths must be a comma-separated list of integers",
        ),
        (
            ["--to", "100000000", "--lengths", "100000000"],
            "tokens but one window of n_ctx=100000000",
        ),
    ],
)
def test_extend_bad_input_is_one_line_exit_2(tmp_path, extra, match, capsys):
    from ropelens.testing import tiny_model_dir

    path = str(tiny_model_dir("llama", tmp_path / "m", max_position_embeddings=64))
    assert main(["extension-study", path, *extra, "--out", str(tmp_path / "ext")]) == 2
    captured = capsys.readouterr()
    assert "Traceback" not in captured.err
    lines = error_lines(captured.err)
    assert len(lines) == 1 and match in lines[0], captured.err


def test_retrieval_command(tiny_dir, tmp_path, capsys):
    """retrieval prints JSON that agrees with the saved result and refuses a bad threshold."""
    import json as _json

    from ropelens.analyses.retrieval_heads import RetrievalHeads

    path = str(tiny_dir("llama-gqa"))
    common = [
        "--lengths",
        "300",
        "--depths",
        "0.5",
        "--trials",
        "1",
        "--top-k",
        "2",
        "--device",
        "cpu",
    ]
    assert (
        main(["retrieval-heads", path, *common, "--json", "--save", str(tmp_path / "rh.json")]) == 0
    )
    out = _json.loads(capsys.readouterr().out)
    saved = RetrievalHeads.load(tmp_path / "rh.json")
    assert out["heads"] == [list(h) for h in saved.heads] and len(out["heads"]) == 2
    assert out["findings"] == [f.text for f in saved.findings()]
    assert [r["recall"] for r in out["recall"]] == saved.to_frame()["recall"].tolist()
    assert main(["retrieval-heads", path, *common, "--threshold", "1.5"]) == 2
    assert "--threshold must lie in [0, 1]" in capsys.readouterr().err


@pytest.mark.parametrize(
    "command", ["band-statistics", "frequency-usage", "attention-sinks", "frequency-entropy"]
)
def test_a_repeated_or_aliased_layer_is_measured_once(command, tiny_dir, tmp_path, capsys):
    """``--layers 0,0`` and ``--layers -1,1`` (two names of one layer) give the single layer's
    numbers: no row twice, shares that still sum to one, no zero or NaN row."""
    import json as _json

    path = str(tiny_dir("llama"))
    common = ["--n-ctx", "32", "--tokens", "64", "--device", "cpu", "--json"]
    outs = {}
    for layers in ("1", "1,1", "-1,1"):
        assert main([command, path, *common, f"--layers={layers}"]) == 0
        outs[layers] = _json.loads(capsys.readouterr().out)
    drop = {"provenance", "seconds", "created", "elapsed"}

    def clean(o):
        return {k: v for k, v in o.items() if k not in drop} if isinstance(o, dict) else o

    assert clean(outs["1,1"]) == clean(outs["1"]) == clean(outs["-1,1"])


def test_save_and_show_saves_then_prints_findings_and_table_or_one_json_object(tmp_path, capsys):
    """The tail of sinks, possym and retrieval: the result saved as it was, its findings, then its
    table; or, with --json, the leading fields, the findings, the rows and the trailing fields in
    that order."""
    import ropelens
    from ropelens.cli.common import OutputOptions

    saved = Path(__file__).parents[1] / "results" / "saved" / "AttentionSinks.json"
    r = ropelens.load_result(saved)
    frame = r.layers_frame()
    texts = [f.text for f in r.findings()]
    assert OutputOptions(save=str(tmp_path / "s.json")).save_and_show(r, frame, "layers") == 0
    assert (tmp_path / "s.json").read_bytes() == saved.read_bytes()
    lines = capsys.readouterr().out.splitlines()
    assert lines[: len(texts)] == texts and len(texts) >= 2
    assert lines[len(texts)].split() == list(frame.columns) and len(lines) == len(texts) + 1 + len(
        frame
    )
    assert (
        OutputOptions(json=True).save_and_show(
            r, frame, "layers", head={"n": 1}, tail={"last": True}
        )
        == 0
    )
    out = json.loads(capsys.readouterr().out)
    assert list(out) == ["n", "findings", "layers", "last"]
    assert (
        out["findings"] == texts
        and [row["layer"] for row in out["layers"]] == frame["layer"].tolist()
    )
