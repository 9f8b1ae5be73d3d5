"""One validation, one default, one spelling: the library checks and the command line relays."""

from __future__ import annotations

import json

import pytest
import torch

from ropelens import rope_spec
from ropelens.analyses.attention_decomposition import DEFAULT_BANDS
from ropelens.analyses.attention_sinks import AttentionSinks, attention_sinks
from ropelens.analyses.head_taxonomy import head_taxonomy
from ropelens.analyses.knockout import knockout
from ropelens.cli import build_parser, main
from ropelens.cli.common import OutputOptions, in_flag_terms, relay
from ropelens.cli.variant_syntax import parse_variant
from ropelens.errors import InputError
from ropelens.spec.variants import YaRN

SMALL = ["--n-ctx", "32", "--tokens", "64", "--device", "cpu"]


def _defaults(command: str) -> dict:
    """The parsed defaults of ``ropelens COMMAND`` (no model is loaded)."""
    args = build_parser().parse_args([command])
    return vars(args)


def _error(capsys) -> str:
    return capsys.readouterr().err.strip().removeprefix("ropelens: error: ")


# ---------------------------------------------------------------------------------------- relaying
def test_in_flag_terms_names_flags_and_leaves_prose():
    message = (
        "the probe reads the positional heads: pass probe_heads=[(layer, head), ...] with your "
        "own head sets, or drop 'probe' from metrics"
    )
    assert in_flag_terms(
        message, {"probe_heads": "--probe-heads L.H,...", "metrics": "--metrics"}
    ) == (
        "the probe reads the positional heads: pass --probe-heads L.H,... with your own head sets, "
        "or drop 'probe' from --metrics"
    )
    prose = "epsilon must be > 0, got 2; the model has 4 layers (layers is fine)"
    assert in_flag_terms(
        prose, {"epsilon": "--epsilon", "layers": "--layers"}, subject_only=True
    ) == ("--epsilon must be > 0, got 2; the model has 4 layers (--layers is fine)")
    # a longer name is not rewritten through a shorter one it contains
    assert in_flag_terms("n_windows must be ≥ 1", {"n": "--n", "n_windows": "--tokens"}) == (
        "--tokens must be ≥ 1"
    )


def test_relay_reraises_in_flag_terms_and_keeps_other_errors():
    def check(*, skip_queries: int = 4) -> int:
        if skip_queries < 1:
            raise InputError(f"skip_queries must be >= 1, got {skip_queries}")
        return skip_queries

    with pytest.raises(InputError, match=r"^--skip-queries must be >= 1, got 0$"):
        relay(check, skip_queries=0)
    assert relay(check, skip_queries=2) == 2

    def unrelated() -> None:
        raise InputError("the corpus is empty")

    with pytest.raises(InputError, match="^the corpus is empty$"):
        relay(unrelated)


# ---------------------------------------------------------------------------------------- defaults
def test_command_defaults_are_the_library_defaults():
    import inspect

    def default(function, name):
        return inspect.signature(function).parameters[name].default

    assert _defaults("attention-sinks")["epsilon"] == default(attention_sinks, "epsilon") == 0.3
    taxonomy = _defaults("head-taxonomy")
    assert taxonomy["n_ctx"] == default(head_taxonomy, "n_ctx")
    assert taxonomy["tokens"] == default(head_taxonomy, "n_windows") * default(
        head_taxonomy, "n_ctx"
    )
    assert taxonomy["corpus"] == "english"
    ko = _defaults("knockout")
    assert ko["n_ctx"] == default(knockout, "n_ctx")
    assert ko["tokens"] == default(knockout, "n_windows") * default(knockout, "n_ctx")
    assert _defaults("attention-decomposition")["bands"] == DEFAULT_BANDS.describe() == "planes"


def test_the_section_summary_quotes_the_library_epsilon():
    from ropelens.catalog import analysis

    summary = analysis("attention-sinks").section.summary
    assert f"ε = {default_epsilon():g}" in summary


def default_epsilon() -> float:
    import inspect

    return inspect.signature(attention_sinks).parameters["epsilon"].default


# ------------------------------------------------------------------------------- attention-sinks
def test_epsilon_one_is_accepted_as_the_library_accepts_it(tiny_dir, tmp_path, capsys):
    path, saved = str(tiny_dir("llama")), tmp_path / "s.json"
    assert main(["attention-sinks", path, *SMALL, "--epsilon", "1", "--save", str(saved)]) == 0
    assert AttentionSinks.load(saved).epsilon == 1.0
    capsys.readouterr()
    assert main(["attention-sinks", path, *SMALL, "--epsilon", "0"]) == 2
    got = _error(capsys)
    assert got.startswith("--epsilon must be > 0 and <= 1, got 0.0")


def test_margin_is_checked_by_the_library_and_named_as_the_flag(tiny_dir, capsys):
    path = str(tiny_dir("llama"))
    assert _defaults("positional-symbolic")["margin"] == 0.25
    argv = ["positional-symbolic", path, "--n-ctx", "64", "--tokens", "128", "--margin", "2"]
    assert main(argv) == 2
    assert _error(capsys).startswith("--margin must be >= 0 and <= 1, got 2.0")


# ---------------------------------------------------------------------------------- one spelling
def test_head_taxonomy_takes_tokens_and_corpus(tiny_dir, tmp_path, capsys):
    path = str(tiny_dir("llama"))
    python = tmp_path / "code.txt"
    python.write_text("def f(x):\n    return x + 1\n" * 400)
    argv = ["head-taxonomy", path, "--n-ctx", "32", "--tokens", "96", "--corpus", str(python)]
    assert main([*argv, "--json", "--quiet"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["n_windows"] == 3 and out["n_ctx"] == 32 and out["n_tokens"] == 96


def test_knockout_probe_error_names_the_flag(tiny_dir, tiny, capsys):
    path = str(tiny_dir("llama"))
    argv = ["knockout", path, "--heads", "0.1", "--metrics", "loss,probe", *SMALL, "--quiet"]
    assert main(argv) == 2
    got = _error(capsys)
    assert "pass --probe-heads L.H,..." in got and "drop 'probe' from --metrics" in got
    assert "probe_heads=" not in got
    with pytest.raises(InputError, match=r"pass probe_heads=\[\(layer, head\), \.\.\.\]"):
        knockout(
            tiny("llama"), {"custom": [(0, 1)]}, metrics=("loss", "probe"), n_ctx=32, n_windows=2
        )


def test_knockout_and_prope_sweep_take_corpus(tmp_path):
    for command in ("knockout", "prope-sweep"):
        args = build_parser().parse_args([command, "--corpus", str(tmp_path), "--tokens", "64"])
        assert args.corpus == str(tmp_path) and args.tokens == 64


def test_extension_planes_takes_to_and_native_like_extension_study(tiny_dir, capsys):
    path = str(tiny_dir("llama"))
    assert main(["extension-planes", path, "--to", "1024", "--native", "256", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["target_ctx"] == 1024 and out["original_ctx"] == 256
    study = build_parser().parse_args(["extension-study", "--to", "1024", "--native", "256"])
    assert (study.to, study.native) == (1024, 256)
    assert main(["extension-planes", path, "--to", "1024", "--target", "1024"]) == 2
    assert "unrecognized arguments: --target" in _error(capsys)


def test_attention_decomposition_bands_default_to_one_per_plane(tiny_dir, capsys):
    path = str(tiny_dir("llama"))
    assert main(["attention-decomposition", path, "--text", "The cat sat.", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    n_planes = rope_spec(_model(tiny_dir)).layers[0].n_planes
    assert len([b for b in out["bands"] if b != "rest"]) == n_planes


def _model(tiny_dir):
    from ropelens.loading.models import load_model

    return load_model(str(tiny_dir("llama")), device="cpu")


# ---------------------------------------------------------------------------------------- progress
def test_progress_only_on_a_terminal_without_quiet_or_json(monkeypatch):
    import sys

    monkeypatch.setattr(sys.stderr, "isatty", lambda: True, raising=False)
    assert OutputOptions().progress
    assert not OutputOptions(quiet=True).progress and not OutputOptions(json=True).progress
    monkeypatch.setattr(sys.stderr, "isatty", lambda: False, raising=False)
    assert not OutputOptions().progress


# ---------------------------------------------------------------------------------------- --variant
def test_variant_values_by_name(tiny):
    layer = rope_spec(tiny("llama")).layers[0]
    assert parse_variant("yarn:factor=4") == YaRN(4.0)
    assert parse_variant("yarn:4:original_max_position=2048") == YaRN(4.0, 2048)
    assert parse_variant("yarn:beta_fast=16:factor=4") == YaRN(4.0, beta_fast=16.0)
    # without original_max_position, YaRN is relative to the layer's trained context
    torch.testing.assert_close(
        YaRN(4.0).inv_freq(layer), YaRN(4.0, layer.n_ctx).inv_freq(layer), rtol=0, atol=0
    )


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("yarn:size=4", "--variant 'yarn:size=4': yarn has no value named 'size'"),
        ("yarn:factor=4:2048", "'2048' follows a named value"),
        ("yarn:4:factor=8", "factor is given twice"),
        ("yarn:factor=x", "bad FACTOR 'x'"),
        ("yarn", "yarn takes 1 to"),
    ],
)
def test_variant_values_by_name_errors(text, message):
    with pytest.raises(InputError, match="^--variant") as caught:
        parse_variant(text)
    assert message in str(caught.value)
