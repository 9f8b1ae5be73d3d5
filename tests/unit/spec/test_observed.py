"""The rotation measured from the model's own forward: exact where a release moves the tables, and a
rotation that is not RoPE described as observed."""

from __future__ import annotations

import math

import pytest
import torch

import ropelens
from ropelens.errors import UnsupportedModelError
from ropelens.loading.models import wrap_hf_model
from ropelens.run.verify import verify_model
from ropelens.spec.observed import measure_rotation, proven_table_frequencies
from ropelens.spec.rope import LayerRope
from ropelens.testing import tiny_hf_model, tiny_tokenizer


def _layer(pairing: str, d: int = 16, base: float = 100.0, direction: int = 1) -> LayerRope:
    inv = base ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)
    return LayerRope(
        layer=0,
        inv_freq=inv.float(),
        head_dim=d,
        rotary_dim=d,
        pairing=pairing,
        n_heads=3,
        n_kv_heads=3,
        score_scale=1.0,
        direction=direction,
    )


@pytest.mark.parametrize("pairing", ["half", "adjacent"])
@pytest.mark.parametrize("direction", [1, -1])
def test_measured_rotation_gives_pairing_frequencies_and_direction(pairing, direction):
    lr = _layer(pairing, direction=direction)
    x = torch.randn(2, 3, 7, 16, generator=torch.Generator().manual_seed(0))
    y = lr.rotate(x, torch.arange(7)) * 1.25  # an attention scaling folded into cos and sin
    obs = measure_rotation(x, y, 2)
    assert obs.pairing == pairing and obs.direction == direction and obs.differs() is None
    torch.testing.assert_close(obs.inv_freq.float(), lr.inv_freq, rtol=1e-6, atol=1e-7)
    assert math.isclose(float(obs.scale[0]), 1.25, rel_tol=1e-6)


@pytest.mark.parametrize("pairing", ["half", "adjacent"])
def test_tables_handed_to_a_rotation_are_read_only_where_the_rotation_applies_them(pairing):
    """θ from the tables' row 1 where the fitted rotation turns every plane by their angles; tables
    the rotation does not apply (another base) are not taken."""
    lr = _layer(pairing)
    x = torch.randn(2, 3, 7, 16, generator=torch.Generator().manual_seed(0))
    observed = measure_rotation(x, lr.rotate(x, torch.arange(7)), 2)
    angles = torch.arange(7, dtype=torch.float32)[:, None] * lr.inv_freq[None]  # [pos, plane]
    doubled = (
        torch.cat([angles, angles], -1) if pairing == "half" else angles.repeat_interleave(2, -1)
    )
    read = proven_table_frequencies(observed, doubled.cos()[None], doubled.sin()[None])
    torch.testing.assert_close(read, lr.inv_freq.double(), rtol=1e-7, atol=0)
    per_plane = proven_table_frequencies(observed, angles.cos()[None], angles.sin()[None])
    torch.testing.assert_close(per_plane, lr.inv_freq.double(), rtol=1e-7, atol=0)
    other = torch.arange(7, dtype=torch.float32)[:, None] * _layer(pairing, base=101.0).inv_freq
    assert proven_table_frequencies(observed, other.cos()[None], other.sin()[None]) is None


def test_a_rotation_that_is_not_rope_is_described_as_observed():
    lr = _layer("half")
    x = torch.randn(1, 7, 3, 16, generator=torch.Generator().manual_seed(1))
    pos = torch.arange(7)
    rotated = lr.rotate(x.transpose(1, 2), pos).transpose(1, 2)
    temperature = (1 + 0.1 * torch.log1p(torch.floor(pos / 3.0))).view(1, 7, 1, 1)
    assert "changes with position" in measure_rotation(x, rotated * temperature, 1).differs()
    mixed = rotated @ torch.randn(16, 16, generator=torch.Generator().manual_seed(2))
    assert "mixes dims across planes" in measure_rotation(x, mixed, 1).differs()
    squared = lr.rotate(x.transpose(1, 2), pos**2).transpose(1, 2)
    assert "not proportional to position" in measure_rotation(x, squared, 1).differs()


class _MovedTables(torch.nn.Module):
    """A model-level module, named nothing like "rotary", that hands the attention its (cos, sin)
    from a table: what a release that moves the buffers looks like to a reader that looks for them
    by name."""

    def __init__(self, inv_freq: torch.Tensor, n: int = 512) -> None:
        super().__init__()
        ang = torch.arange(n, dtype=torch.float32)[:, None] * inv_freq.float()[None]
        self.register_buffer("table", torch.cat([ang, ang], -1), persistent=False)

    def forward(self, x, position_ids):
        a = self.table[position_ids]
        return a.cos().to(x.dtype), a.sin().to(x.dtype)


@pytest.mark.parametrize("bridge", [True, False])
def test_tables_moved_to_another_module_keep_the_reading_exact(bridge):
    hf = tiny_hf_model("llama")
    expected = hf.model.rotary_emb.inv_freq.clone()
    hf.model.rotary_emb = _MovedTables(expected)  # no inv_freq left where ropelens looked for it
    model = wrap_hf_model(hf, tiny_tokenizer(), device="cpu", label="moved", bridge=bridge)
    spec = ropelens.rope_spec(model)
    for lr in spec.layers:
        torch.testing.assert_close(lr.inv_freq, expected.float(), rtol=1e-6, atol=1e-7)
        assert lr.pairing == "half" and lr.direction == 1
    v = verify_model(model)
    assert v.passed and v.errors["rotation"] < 1e-5 and v.errors["probs"] < 1e-5


def test_a_moved_table_that_is_not_rope_is_refused_with_what_was_seen():
    hf = tiny_hf_model("llama")
    inv = hf.model.rotary_emb.inv_freq.clone()
    tables = _MovedTables(inv)
    tables.table[:, : inv.numel()] = (
        tables.table[:, : inv.numel()] ** 1.5
    )  # angles not m·θ: first half only
    hf.model.rotary_emb = tables
    model = wrap_hf_model(hf, tiny_tokenizer(), device="cpu", label="moved", bridge=False)
    with pytest.raises(UnsupportedModelError, match="layer 0: its rotation") as err:
        ropelens.rope_spec(model)
    assert "\n" not in str(err.value)


def test_a_recurrent_section_is_refused_with_its_loop_count(tmp_path):
    """Dory (transformers ≥ 5.24) runs its middle layers n_recurrent_loops times per forward:
    refused, and why."""
    pytest.importorskip("transformers.models.dory")
    from tests.harness.sweep import sweep_one

    row = sweep_one("dory", workdir=tmp_path)
    assert row.status == "refused", row.detail
    assert "runs 2 times per forward (n_recurrent_loops)" in row.detail


def test_an_adapter_whose_forward_fails_falls_back_to_the_hf_model(monkeypatch):
    """An adapter written against another transformers release can boot and then fail when it runs
    (TransformerLens 4.3's CodeGen attention reads a buffer transformers 5.24 moved): the HF model
    is measured instead."""
    from transformer_lens.model_bridge import TransformerBridge

    from ropelens.backends.hf import is_plain

    def broken(self, *args, **kwargs):
        raise AttributeError("'LlamaAttention' object has no attribute 'moved_buffer'")

    monkeypatch.setattr(TransformerBridge, "forward", broken)
    model = wrap_hf_model(tiny_hf_model("llama"), tiny_tokenizer(), device="cpu", label="fallback")
    assert is_plain(model)
    assert "fails in its forward" in model.cfg.why and "moved_buffer" in model.cfg.why
    assert verify_model(model).passed


def _ministral3(tmp_path, beta: float = 0.5, l0: int = 8):
    from transformers import AutoModelForCausalLM

    from tests.harness.shrink import shrink_config

    cfg = shrink_config("ministral3")
    cfg.rope_parameters["original_max_position_embeddings"] = l0  # the probe's 32 tokens pass it
    cfg.rope_parameters["llama_4_scaling_beta"] = beta
    torch.manual_seed(0)
    hf = AutoModelForCausalLM.from_config(cfg).eval()
    hf.save_pretrained(tmp_path)
    tiny_tokenizer().save_pretrained(tmp_path)
    return cfg


def test_ministral3_query_temperature_is_read_and_exact_past_its_original_context(tmp_path):
    """Ministral 3 multiplies its rotated queries by 1 + β·ln(1 + ⌊m/L₀⌋): read as the layer's
    temperature, confirmed on the model's own forward past L₀, and every logit past L₀ is the
    model's own on both capture paths."""
    from tests.harness.sweep import check_config, classify

    cfg = _ministral3(tmp_path)
    model = ropelens.load_model(str(tmp_path), device="cpu")
    spec = ropelens.rope_spec(model)
    assert all(spec[L].temperature == (0.5, 8) for L in spec.rotary_layers)
    factor = spec[0].query_temperature(torch.arange(24))
    assert float(factor[7]) == 1.0 and math.isclose(
        float(factor[8]), 1 + 0.5 * math.log(2), rel_tol=1e-6
    )
    assert verify_model(model).passed
    toks = torch.randint(4, 100, (1, 24), generator=torch.Generator().manual_seed(0))
    fast, bridge = (
        ropelens.capture_qk(model, toks, layers=[0], which=("q_pre", "q_rot", "q_post"), fast=f)[0]
        for f in (True, False)
    )
    for acts in (fast, bridge):  # q_rot: the rotation alone; q_post: the query entering the score
        rot = spec[0].rotate(acts["q_pre"].transpose(1, 2), torch.arange(24)).transpose(1, 2)
        torch.testing.assert_close(acts["q_rot"], rot, rtol=0, atol=1e-6)
        torch.testing.assert_close(
            acts["q_post"], rot * factor[None, :, None, None], rtol=0, atol=1e-6
        )
    # logits, pattern, usage, band statistics and a variant against HF's own eager attention, past
    # L₀
    status, detail = classify(check_config("ministral3", cfg))
    assert status == "exact", detail


def test_a_query_temperature_the_forward_does_not_apply_as_configured_is_refused_with_the_factors(
    tmp_path, monkeypatch
):
    """A forward (patched by its user) whose query factor is not the config's formula is refused
    naming the factors measured at positions past L₀; one that applies no factor at all is read
    without a temperature."""
    import transformers.models.ministral3.modeling_ministral3 as mm

    _ministral3(tmp_path)

    def linear(pos, beta, l0):
        return (1 + beta * pos / l0)[:, None, :, None]

    monkeypatch.setattr(mm, "get_llama_4_attn_scale", linear)
    model = ropelens.load_model(str(tmp_path), device="cpu")
    with pytest.raises(
        UnsupportedModelError,
        match=r"layer 0's config names a query temperature 1 \+ 0\.5·ln\(1 \+ ⌊m/8⌋\).* at "
        r"positions \[0, 7, 8, 24\] the query entering its score is factors 1, 1\.4375, 1\.5, "
        r"2\.5 \(expected 1, 1, 1\.34657, 1\.69315\)",
    ):
        ropelens.rope_spec(model)
    monkeypatch.setattr(
        mm, "get_llama_4_attn_scale", lambda pos, beta, l0: torch.ones(1)[:, None, None, None]
    )
    model = ropelens.load_model(str(tmp_path), device="cpu")
    assert ropelens.rope_spec(model)[0].temperature is None


def test_a_failed_rotation_check_says_what_the_rotation_was_measured_to_do():
    """A rotation whose norm factor grows with position (a temperature the reading missed) is
    described by the factor measured, not a guessed cause."""
    from ropelens.run.verify import rotation_mismatch

    lr = _layer("half")
    x = torch.randn(32, 3, 16, generator=torch.Generator().manual_seed(2))
    scale = 1 + 0.1 * torch.log(1 + torch.floor(torch.arange(32) / 8.0))
    post = lr.rotate(x.transpose(0, 1), torch.arange(32)).transpose(0, 1) * scale[:, None, None]
    assert rotation_mismatch(lr, x, post) == (
        "rotation multiplies the norm by a factor that changes with "
        "position (1 at position 0, 1.13863 at position 31)"
    )


def test_a_misread_frequency_is_named_with_both_values():
    from ropelens.run.verify import rotation_mismatch

    lr = _layer("half")
    x = torch.randn(7, 3, 16, generator=torch.Generator().manual_seed(3))
    true = _layer("half", base=200.0)
    post = true.rotate(x.transpose(0, 1), torch.arange(7)).transpose(0, 1)
    assert rotation_mismatch(lr, x, post) == (
        "the rotation turns plane 7 by θ = 0.00969613 per token where the reading says 0.0177828"
    )
    assert "pairs dims adjacent" in rotation_mismatch(
        lr, x, _layer("adjacent").rotate(x.transpose(0, 1), torch.arange(7)).transpose(0, 1)
    )
