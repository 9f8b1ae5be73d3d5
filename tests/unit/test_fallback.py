"""Models TransformerLens wraps without q/k hooks, and families whose structure the plain path must be taught.

JetMoE's adapter has no per-head query hook and RecurrentGemma's wraps its attention whole: load_model
falls back to the plain HF model, which taps the family's own rotation. Every number is checked against
HF's eager attention on a tiny random model built from the family's config defaults
(:func:`ropelens.testing.sweep.shrink_config`).
"""

from __future__ import annotations

import functools
import importlib

import pytest
import torch
from transformers import AutoModelForCausalLM

import ropelens
from ropelens.capture import capture_qk
from ropelens.plain import PlainModel
from ropelens.reading import rope_spec
from ropelens.testing import tiny_tokenizer
from ropelens.testing.families import N_CHECK
from ropelens.testing.sweep import TOL, check_config, classify, shrink_config
from ropelens.verify import verify_model


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    """``tiny_dir(model_type)``: a saved tiny random model of the type's shrunk config defaults."""

    @functools.cache
    def make(model_type: str):
        path = tmp_path_factory.mktemp(model_type) / model_type
        torch.manual_seed(0)
        AutoModelForCausalLM.from_config(shrink_config(model_type), attn_implementation="eager").save_pretrained(path)
        tiny_tokenizer().save_pretrained(path)
        return path

    return make


def _toks(seed: int = 0) -> torch.Tensor:
    toks = torch.randint(4, 100, (1, N_CHECK), generator=torch.Generator().manual_seed(seed))
    toks[0, 0] = 1
    return toks


def _exact(model_type: str, tmp_path) -> None:
    """The sweep's check: spec, rotation, scores and patterns against HF's own (float32: errors ~1e-6, TOL 1e-4)."""
    check = check_config(model_type, shrink_config(model_type), workdir=tmp_path)
    status, detail = classify(check)
    assert status == "exact", detail
    assert all(0 <= getattr(check, k) <= TOL for k in ("inv_freq_err", "scores_err", "pattern_err", "pairing_err"))


@pytest.mark.parametrize(("model_type", "hookless"), [("jetmoe", "layer 0's attention (JetMoeAttention)"),
                                                      ("recurrent_gemma", "layer 2's attention (RecurrentGemmaAttention)")])
def test_adapters_without_qk_hooks_fall_back_to_the_plain_model(model_type, hookless, tiny_dir, tmp_path):
    """The bridge boots but cannot give the queries: load_model returns the plain HF model, which passes the probe."""
    model = ropelens.load_model(tiny_dir(model_type), device="cpu")
    assert isinstance(model, PlainModel)
    assert "exposes no per-head query hook for " + hookless in model.cfg.why
    assert verify_model(model).passed
    _exact(model_type, tmp_path)


def test_jetmoe_query_heads_read_tiled_keys(tiny_dir):
    """JetMoE tiles its KV heads once per expert slot (query head h reads key h mod kv_heads): the spec counts each
    query head's key copy, and the captured keys are HF's rotated keys tiled."""
    model = ropelens.load_model(tiny_dir("jetmoe"), device="cpu")
    hf = AutoModelForCausalLM.from_pretrained(tiny_dir("jetmoe"), attn_implementation="eager").eval()
    cfg = hf.config
    spec = rope_spec(model)
    assert cfg.num_attention_heads == cfg.num_key_value_heads * cfg.num_experts_per_tok == 4
    assert {(lr.n_heads, lr.n_kv_heads) for lr in spec.layers} == {(4, 4)}
    mod = importlib.import_module(type(hf).__module__)
    orig, seen = mod.apply_rotary_pos_emb, []

    def keep(q, k, *a, **kw):
        out = orig(q, k, *a, **kw)
        seen.append(out[1])  # [b, kv_heads, pos, d]
        return out

    mod.apply_rotary_pos_emb = keep
    try:
        with torch.no_grad():
            hf(_toks())
    finally:
        mod.apply_rotary_pos_emb = orig
    acts = capture_qk(model, _toks(), which=("k_post",), fast=False)
    for L, theirs in enumerate(seen):
        assert theirs.shape[1] == cfg.num_key_value_heads
        ours = acts[L]["k_post"].transpose(1, 2)
        # two float32 forwards of the same weights (the experts' scatter sums in another order): ~4e-8 apart; keys
        # grouped instead of tiled would differ by O(1)
        torch.testing.assert_close(ours, theirs.repeat(1, cfg.num_experts_per_tok, 1, 1), rtol=1e-5, atol=1e-6)


def test_recurrent_gemma_lists_its_recurrent_layers(tiny_dir):
    """RecurrentGemma's RG-LRU layers are listed with their kind and class; its local attention is sliding, 8 tokens."""
    spec = rope_spec(ropelens.load_model(tiny_dir("recurrent_gemma"), device="cpu"))
    hf = AutoModelForCausalLM.from_pretrained(tiny_dir("recurrent_gemma")).eval()
    blocks = [type(layer.temporal_block).__name__ for layer in hf.model.layers]
    assert blocks == ["RecurrentGemmaRecurrentBlock"] * 2 + ["RecurrentGemmaAttention", "RecurrentGemmaRecurrentBlock"]
    assert spec.kinds == {"recurrent": [0, 1, 3], "sliding": [2]}
    assert {spec[L].mixer for L in (0, 1, 3)} == {"RecurrentGemmaRecurrentBlock"}
    lr = spec[2]
    assert (lr.window, lr.rotary_dim, lr.head_dim) == (hf.config.attention_window_size, 8, 16)  # partial rotary 0.5


def test_one_tensor_rotation_is_tapped(tiny_dir, tmp_path):
    """Gemma 4 unified rotates q and k in two calls of apply_rotary_pos_emb(x, cos, sin, unsqueeze_dim=2), heads on
    axis 2: the plain path pairs the calls and measures it exactly."""
    model = ropelens.load_model(tiny_dir("gemma4_unified_text"), device="cpu")
    assert isinstance(model, PlainModel)
    assert verify_model(model).passed
    _exact("gemma4_unified_text", tmp_path)
