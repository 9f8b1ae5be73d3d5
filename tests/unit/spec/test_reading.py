"""The reading of a model's rotation: exact to float32 where the rotation is handed its tables
(GPT-J, CodeGen), and refused with the config field named where its base is not positive."""

from __future__ import annotations

import json
import math
import re

import pytest
import torch
from transformers import AutoModelForCausalLM, CodeGenConfig

from ropelens.cli.main import main
from ropelens.errors import InputError
from ropelens.loading.models import wrap_hf_model
from ropelens.spec.reading import rope_spec
from ropelens.testing import tiny_model, tiny_model_dir, tiny_tokenizer


def _tiny_codegen():
    """A random CodeGen as small as the tiny GPT-J: 4 heads of 16 dims, 8 of them rotated."""
    config = CodeGenConfig(
        vocab_size=110, n_embd=64, n_layer=2, n_head=4, rotary_dim=8, n_positions=256
    )
    with torch.random.fork_rng():
        torch.manual_seed(0)
        hf = AutoModelForCausalLM.from_config(config).eval()
    return wrap_hf_model(hf, tiny_tokenizer(), device="cpu", label="tiny-codegen")


def _table_frequencies(table: torch.Tensor) -> torch.Tensor:
    """θ_i of a ``[position, sin | cos]`` table, fitted by least squares over all its rows.

    The phase of row m is the sum of the angle steps between consecutive rows (unwrapped, as every
    θ_i < π); θ_i = Σ m·phase(m) / Σ m², dominated by the far rows, where float32 rounding is a
    tiny part of the angle.
    """
    n_planes = table.shape[1] // 2
    rows = table.double()
    turn = torch.complex(rows[:, n_planes:], rows[:, :n_planes])  # cos + i·sin
    steps = torch.angle(turn[1:] * turn[:-1].conj())
    phase = torch.cat([torch.zeros(1, n_planes, dtype=torch.float64), steps.cumsum(0)])
    positions = torch.arange(rows.shape[0], dtype=torch.float64).unsqueeze(-1)
    return (positions * phase).sum(0) / (positions * positions).sum()


@pytest.mark.parametrize("family", ["gptj", "codegen"])
def test_gptj_and_codegen_read_their_tables_to_float32(family):
    """Their rotation is handed sin and cos from a table (no inv_freq buffer): the frequencies equal
    the table's to float32, where the fitted rotation alone is 3e-6 off in the lowest plane."""
    model = tiny_model("gptj") if family == "gptj" else _tiny_codegen()
    tables = [
        m.embed_positions for m in model.original_model.modules() if hasattr(m, "embed_positions")
    ]
    expected = _table_frequencies(tables[0])
    spec = rope_spec(model)
    assert spec.rotary_layers == [0, 1]
    for layer in spec.rotary_layers:
        assert spec[layer].pairing == "adjacent" and spec[layer].base == 10000.0
        torch.testing.assert_close(spec[layer].inv_freq.double(), expected, rtol=1e-6, atol=0)


_BAD_BASES = [0.0, -1.0, -10000.0, math.nan, math.inf]


def _with_base(family: str, base: float) -> dict:
    """Config overrides giving ``family`` the RoPE base ``base`` (Gemma 3: its global layers)."""
    if family == "gemma3":
        return {
            "rope_parameters": {
                "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                "full_attention": {"rope_type": "default", "rope_theta": base},
            }
        }
    return {"rope_parameters": {"rope_type": "default", "rope_theta": base}}


_FIELD = {
    "llama": r"rope_parameters\['rope_theta'\]",
    "llama-gqa": r"rope_parameters\['rope_theta'\]",
    "gptj": r"rope_parameters\['rope_theta'\]",
    "gemma3": r"rope_parameters\['full_attention'\]\['rope_theta'\]",
}


@pytest.mark.parametrize("base", _BAD_BASES)
@pytest.mark.parametrize("family", ["llama", "gemma3", "gptj"])
def test_a_base_that_is_not_positive_is_refused_naming_the_config_field(family, base):
    model = tiny_model(family, **_with_base(family, base))
    with pytest.raises(InputError) as refused:
        rope_spec(model)
    message = str(refused.value)
    assert re.search(_FIELD[family] + " is " + re.escape(repr(base)), message), message
    assert "must be a positive number" in message and "config.json" in message


@pytest.mark.parametrize("base", [0.0, -1.0, math.nan, math.inf])
def test_every_analysis_names_the_bad_base_before_verifying_anything(base, monkeypatch):
    """The refusal comes from the reading every analysis starts with, never from the verification
    (which would blame the plane pairing)."""
    import ropelens.run.verify as verify
    from ropelens.analyses import attention_decomposition, band_statistics, frequency_usage

    def never(*args, **kwargs):
        raise AssertionError("verification ran on a model whose RoPE cannot be right")

    monkeypatch.setattr(verify, "verify_model", never)
    model = tiny_model("llama-gqa", **_with_base("llama-gqa", base))
    texts = ["The cat sat on the mat, and the dog sat on the rug."] * 4
    calls = [
        lambda: frequency_usage(model, texts, n_ctx=16, max_tokens=64, progress=False),
        lambda: band_statistics(model, texts, n_ctx=16, max_tokens=64, progress=False),
        lambda: attention_decomposition(model, texts[0]),
        lambda: rope_spec(model),
    ]
    for call in calls:
        with pytest.raises(InputError, match=_FIELD["llama-gqa"] + " is " + re.escape(repr(base))):
            call()


@pytest.mark.parametrize("base", ["0", "-1", "NaN", "Infinity", '"abc"', "null"])
def test_the_cli_refuses_a_bad_base_in_config_json_in_one_line(base, tmp_path, capsys):
    path = tiny_model_dir("llama", tmp_path / "bad-base")
    config = path / "config.json"
    raw = json.loads(config.read_text())
    raw["rope_parameters"] = {"rope_type": "default", "rope_theta": "BASE"}
    config.write_text(json.dumps(raw).replace('"BASE"', base))
    capsys.readouterr()  # the directory's own writing
    assert main(["rope-spec", str(path), "--device", "cpu"]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    assert "rope_theta'] is " in err and "must be a positive number" in err


def _inv_freq_buffers(model) -> list[torch.Tensor]:
    hf = model.original_model
    return [b for name, b in hf.named_buffers() if name.endswith("inv_freq")]


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf, -0.5])
@pytest.mark.parametrize("family", ["llama", "gemma3"])
def test_an_inv_freq_buffer_that_cannot_be_right_is_named(family, value):
    model = tiny_model(family)
    buffers = _inv_freq_buffers(model)
    assert buffers
    with torch.no_grad():
        buffers[-1][2] = value
    with pytest.raises(InputError) as refused:
        rope_spec(model)
    message = str(refused.value)
    assert f"holds {value!r} at entry 2" in message and "inv_freq" in message, message
    assert "_original_component" not in message and "reload the model" in message


@pytest.mark.parametrize("value", [math.nan, math.inf])
def test_a_rotary_table_holding_nan_or_inf_is_named(value):
    """GPT-J keeps a sin|cos table, not inv_freq: a non-finite entry is named the same way."""
    model = tiny_model("gptj")
    (table,) = [b for n, b in model.original_model.named_buffers() if "embed_positions" in n]
    with torch.no_grad():
        table[3, 1] = value
    with pytest.raises(InputError, match=r"embed_positions holds .* must hold finite numbers"):
        rope_spec(model)


def test_planes_at_frequency_zero_are_read_not_refused():
    """A frequency of 0 is a plane that does not rotate (proportional RoPE): kept as read."""
    model = tiny_model("llama")
    (buffer,) = [b for n, b in model.original_model.named_buffers() if n.endswith(".inv_freq")]
    with torch.no_grad():
        buffer[-2:] = 0.0
    spec = rope_spec(model)
    torch.testing.assert_close(spec[0].inv_freq, buffer.float().cpu(), rtol=0, atol=0)


def test_a_model_on_the_meta_device_is_refused_in_one_line():
    model = tiny_model("llama")
    model.original_model.to("meta")
    with pytest.raises(InputError, match="meta device, whose tensors hold shapes but no values"):
        rope_spec(model)


def test_the_cli_exits_with_a_usage_error_on_a_base_of_zero(tmp_path, capsys):
    path = tiny_model_dir(
        "llama", tmp_path / "zero-base", rope_parameters={"rope_type": "default", "rope_theta": 0}
    )
    assert main(["rope-spec", str(path), "--device", "cpu"]) == 2
    assert "rope_theta'] is 0" in capsys.readouterr().err
