"""The reading of a model's rotation: exact to float32 where the rotation is handed its tables
(GPT-J, CodeGen), and refused with the config field named where its base is not positive."""

from __future__ import annotations

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


@pytest.mark.parametrize("base", [0.0, -10000.0])
def test_a_base_that_is_not_positive_is_refused_naming_the_config_field(base):
    model = tiny_model("llama", rope_parameters={"rope_type": "default", "rope_theta": base})
    with pytest.raises(InputError, match=r"rope_parameters\['rope_theta'\] is " + str(base)):
        rope_spec(model)


def test_the_cli_exits_with_a_usage_error_on_a_base_of_zero(tmp_path, capsys):
    path = tiny_model_dir(
        "llama", tmp_path / "zero-base", rope_parameters={"rope_type": "default", "rope_theta": 0}
    )
    assert main(["rope-spec", str(path), "--device", "cpu"]) == 2
    assert "rope_theta'] is 0" in capsys.readouterr().err
