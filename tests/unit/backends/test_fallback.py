"""Models TransformerLens wraps without q/k hooks, and families whose structure the plain path must
be taught.

JetMoE's adapter has no per-head query hook and RecurrentGemma's wraps its attention whole:
load_model falls back to the plain HF model, which taps the family's own rotation. Every number is
checked against HF's eager attention on a tiny random model built from the family's config defaults
(:func:`tests.harness.sweep.shrink_config`).
"""

from __future__ import annotations

import functools
import importlib

import pytest
import torch
from transformers import AutoModelForCausalLM

import ropelens
from ropelens.backends.hf import PlainModel
from ropelens.run.capture import capture_qk
from ropelens.run.verify import verify_model
from ropelens.spec.reading import rope_spec
from ropelens.testing import tiny_tokenizer
from ropelens.testing.families import N_CHECK
from tests.harness.sweep import TOL, check_config, classify, shrink_config


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    """``tiny_dir(model_type)``: a saved tiny random model of the type's shrunk config defaults."""

    @functools.cache
    def make(model_type: str):
        path = tmp_path_factory.mktemp(model_type) / model_type
        torch.manual_seed(0)
        AutoModelForCausalLM.from_config(
            shrink_config(model_type), attn_implementation="eager"
        ).save_pretrained(path)
        tiny_tokenizer().save_pretrained(path)
        return path

    return make


def _toks(seed: int = 0) -> torch.Tensor:
    toks = torch.randint(4, 100, (1, N_CHECK), generator=torch.Generator().manual_seed(seed))
    toks[0, 0] = 1
    return toks


def _exact(model_type: str, tmp_path) -> None:
    """The sweep's check: spec, rotation, scores and patterns against HF's own (float32: errors
    ~1e-6, TOL 1e-4)."""
    check = check_config(model_type, shrink_config(model_type), workdir=tmp_path)
    status, detail = classify(check)
    assert status == "exact", detail
    assert all(
        0 <= getattr(check, k) <= TOL
        for k in ("inv_freq_err", "scores_err", "pattern_err", "pairing_err")
    )


@pytest.mark.parametrize(
    ("model_type", "hookless"),
    [
        ("jetmoe", "layer 0's attention (JetMoeAttention)"),
        ("recurrent_gemma", "layer 2's attention (RecurrentGemmaAttention)"),
    ],
)
def test_adapters_without_qk_hooks_fall_back_to_the_plain_model(
    model_type, hookless, tiny_dir, tmp_path
):
    """The bridge boots but cannot give the queries: load_model returns the plain HF model, which
    passes the probe."""
    model = ropelens.load_model(tiny_dir(model_type), device="cpu")
    assert isinstance(model, PlainModel)
    assert "exposes no per-head query hook for " + hookless in model.cfg.why
    assert verify_model(model).passed
    _exact(model_type, tmp_path)


def test_jetmoe_query_heads_read_tiled_keys(tiny_dir):
    """JetMoE tiles its KV heads once per expert slot (query head h reads key h mod kv_heads): the
    spec counts each query head's key copy, and the captured keys are HF's rotated keys tiled."""
    model = ropelens.load_model(tiny_dir("jetmoe"), device="cpu")
    hf = AutoModelForCausalLM.from_pretrained(
        tiny_dir("jetmoe"), attn_implementation="eager"
    ).eval()
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
        # two float32 forwards of the same weights (the experts' scatter sums in another order):
        # ~4e-8 apart; keys grouped instead of tiled would differ by O(1)
        torch.testing.assert_close(
            ours, theirs.repeat(1, cfg.num_experts_per_tok, 1, 1), rtol=1e-5, atol=1e-6
        )


def test_recurrent_gemma_lists_its_recurrent_layers(tiny_dir):
    """RecurrentGemma's RG-LRU layers are listed with their kind and class; its local attention is
    sliding, 8 tokens."""
    spec = rope_spec(ropelens.load_model(tiny_dir("recurrent_gemma"), device="cpu"))
    hf = AutoModelForCausalLM.from_pretrained(tiny_dir("recurrent_gemma")).eval()
    blocks = [type(layer.temporal_block).__name__ for layer in hf.model.layers]
    assert blocks == ["RecurrentGemmaRecurrentBlock"] * 2 + [
        "RecurrentGemmaAttention",
        "RecurrentGemmaRecurrentBlock",
    ]
    assert spec.kinds == {"recurrent": [0, 1, 3], "sliding": [2]}
    assert {spec[L].mixer for L in (0, 1, 3)} == {"RecurrentGemmaRecurrentBlock"}
    lr = spec[2]
    assert (lr.window, lr.rotary_dim, lr.head_dim) == (
        hf.config.attention_window_size,
        8,
        16,
    )  # partial rotary 0.5


def test_one_tensor_rotation_is_tapped(tiny_dir, tmp_path):
    """Gemma 4 unified rotates q and k in two calls of apply_rotary_pos_emb(x, cos, sin,
    unsqueeze_dim=2), heads on axis 2: the plain path pairs the calls and measures it exactly."""
    model = ropelens.load_model(tiny_dir("gemma4_unified_text"), device="cpu")
    assert isinstance(model, PlainModel)
    assert verify_model(model).passed
    _exact("gemma4_unified_text", tmp_path)


def test_shared_kv_layers_read_their_source_layers_keys(tiny_dir, tmp_path):
    """Gemma 3n's last layers reuse the post-RoPE keys the last earlier layer of their type stored:
    ropelens takes them from that layer, also when only the sharing layer is asked for, and they are
    the keys HF scores with."""
    hf = AutoModelForCausalLM.from_pretrained(
        tiny_dir("gemma3n_text"), attn_implementation="eager"
    ).eval()
    modes = hf.config.kv_sharing_modes
    assert modes[-2:] == ["reuse", "reuse"] and modes[4:6] == ["store", "store"]
    model = ropelens.load_model(tiny_dir("gemma3n_text"), device="cpu")
    assert verify_model(model).passed
    mod = importlib.import_module(type(hf).__module__)
    orig, entered = mod.eager_attention_forward, {}

    def keep(module, query, key, *a, **kw):
        entered[module.layer_idx] = key  # [b, kv_heads, pos, d]: what layer i scores with
        return orig(module, query, key, *a, **kw)

    mod.eager_attention_forward = keep
    try:
        with torch.no_grad():
            hf(_toks())
    finally:
        mod.eager_attention_forward = orig
    for shared, source in ((6, 4), (7, 5)):  # 6 (sliding) reads 4's keys, 7 (full) reads 5's
        assert torch.equal(entered[shared], entered[source])
        alone = capture_qk(model, _toks(), layers=[shared], which=("k_pre", "k_post"), fast=False)[
            shared
        ]
        src = capture_qk(model, _toks(), layers=[source], which=("k_pre", "k_post"), fast=False)[
            source
        ]
        torch.testing.assert_close(alone["k_pre"], src["k_pre"], rtol=0, atol=0)
        # HF's forward and ropelens's plain capture (sdpa beside eager upstream), float32, same
        # weights: ~1e-6 apart; another layer's keys would be O(1) off
        torch.testing.assert_close(
            alone["k_post"], entered[shared].transpose(1, 2), rtol=1e-4, atol=1e-5
        )
    _exact("gemma3n_text", tmp_path)


def test_attention_sublayers_are_layers(tiny_dir):
    """LongCat-Flash's decoder layers hold two attention sublayers each; HF numbers them 0..2n-1
    (layer_idx, as its cache does), and so does ropelens: layer L is sublayer L % 2 of decoder layer
    L // 2, read exactly."""
    from ropelens.backends.hf import attention_modules

    model = ropelens.load_model(tiny_dir("longcat_flash"), device="cpu")
    hf = model.original_model
    attns = attention_modules(hf)
    assert len(hf.model.layers) * 2 == len(attns) == hf.config.num_hidden_layers
    assert [a.layer_idx for a in attns] == list(range(len(attns)))
    assert all(attns[L] is hf.model.layers[L // 2].self_attn[L % 2] for L in range(len(attns)))
    spec = rope_spec(model)
    assert spec.n_layers == len(attns) and spec.kinds == {"full": list(range(len(attns)))}
    assert verify_model(
        model, spec
    ).passed  # rotation (interleaved pairs read, halves written), scores, patterns


def test_position_scaled_nope_layers_are_listed_not_measured(tiny_dir):
    """Beam's full-attention layers rotate nothing and scale each query by a factor of its position
    that the model passes in: listed as NoPE layers with that factor, left out of every default
    selection and refused in one line when named; its sliding rotary layers are measured and pass
    the probe."""
    from ropelens.errors import UnsupportedModelError

    model = ropelens.load_model(tiny_dir("beam"), device="cpu")
    spec = rope_spec(model)
    assert spec.kinds == {"sliding": [0, 1, 2, 3], "nope": [4]}
    assert (
        spec[4].query_scale == "a factor of m the model computes and passes in (attention_scaling)"
    )
    assert [lr.query_scale for lr in spec.layers[:4]] == [None] * 4
    assert spec.layer_indices(None, rotary_only=False) == [0, 1, 2, 3]
    with pytest.raises(
        UnsupportedModelError,
        match=r"layer 4 is a NoPE layer that scales each query at position m "
        r"by a factor of m .*attention_scaling",
    ) as err:
        spec.layer_indices([4], rotary_only=False)
    assert "\n" not in str(err.value)
    assert verify_model(model, spec).passed


_VISION = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2)


def _multimodal(kind: str):
    import transformers

    if kind == "gemma3":
        return transformers.Gemma3Config(
            text_config=shrink_config("gemma3_text").to_dict(),
            mm_tokens_per_image=4,
            vision_config=dict(_VISION, image_size=28, patch_size=14),
        )
    if kind == "gemma4":
        return transformers.Gemma4Config(
            text_config=shrink_config("gemma4_text").to_dict(),
            vision_config=_VISION,
            audio_config=None,
        )
    return transformers.Llama4Config(
        text_config=shrink_config("llama4_text").to_dict(),
        vision_config=dict(
            _VISION,
            image_size=28,
            patch_size=14,
            vision_output_dim=32,
            projector_input_dim=32,
            projector_output_dim=32,
        ),
    )


@pytest.mark.parametrize(
    ("kind", "arch"),
    [("gemma3", "Gemma3ForConditionalGeneration"), ("gemma4", "Gemma4ForConditionalGeneration")],
)
def test_multimodal_text_towers_are_measured_on_text(kind, arch, tmp_path, monkeypatch):
    """Gemma 3 and 4 with a vision tower: text-only input, the text tower's RoPE (not the vision
    tower's), exact. Booting them installs nothing: TransformerLens would pip-install torchvision
    (and a new torch with it) when the checkpoint's processor cannot load, as here (a tokenizer, no
    image processor)."""
    import subprocess

    installs: list = []

    def no_install(cmd, *args, **kwargs):
        installs.append(cmd)
        raise RuntimeError(f"a package install was attempted: {cmd}")

    monkeypatch.setattr(subprocess, "check_call", no_install)
    torch.manual_seed(0)
    hf = AutoModelForCausalLM.from_config(_multimodal(kind), attn_implementation="eager")
    assert type(hf).__name__ == arch
    hf.save_pretrained(tmp_path / kind)
    tiny_tokenizer().save_pretrained(tmp_path / kind)
    model = ropelens.load_model(tmp_path / kind, device="cpu")
    assert installs == []
    spec = rope_spec(model)
    assert spec.kinds == {"sliding": [0, 1, 2], "full": [3]}
    text = hf.model.language_model.rotary_emb
    for L, ltype in ((0, "sliding_attention"), (3, "full_attention")):
        torch.testing.assert_close(
            spec[L].inv_freq, getattr(text, f"{ltype}_inv_freq").float(), rtol=0, atol=0
        )
    assert verify_model(model, spec).passed


def test_llama4_multimodal_text_tower_is_measured(tmp_path):
    """Llama 4 with a vision tower: its text tower's chunked rotary layers, read and verified on
    text."""
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(
        _multimodal("llama4"), attn_implementation="eager"
    ).save_pretrained(tmp_path / "l4")
    tiny_tokenizer().save_pretrained(tmp_path / "l4")
    model = ropelens.load_model(tmp_path / "l4", device="cpu")
    spec = rope_spec(model)
    assert isinstance(model, PlainModel) and spec.kinds == {"chunked": [0, 1, 2], "nope": [3]}
    assert {spec[L].chunk for L in (0, 1, 2)} == {
        model.original_model.config.get_text_config().attention_chunk_size
    }
    assert verify_model(model, spec).passed


def test_wrapping_keeps_complex_buffers(tmp_path):
    """Wrapping Llama 4 with its vision tower casts its float weights to the dtype asked for and
    leaves the vision rotary's complex frequencies as they are (Module.to(float64) would keep their
    real part only)."""
    from transformers import Llama4ForConditionalGeneration

    from ropelens.loading.models import wrap_hf_model

    torch.manual_seed(0)
    hf = Llama4ForConditionalGeneration(_multimodal("llama4"))
    want = hf.vision_model.rotary_embedding.freqs_ci.clone()
    assert want.is_complex() and want.imag.abs().max() > 0.5
    wrapped = wrap_hf_model(hf, tiny_tokenizer(), device="cpu", label="l4-mm", dtype=torch.float64)
    got = dict(wrapped.original_model.named_buffers())["vision_model.rotary_embedding.freqs_ci"]
    assert torch.equal(got, want)
    assert all(p.dtype == torch.float64 for p in wrapped.original_model.parameters())
