"""RoPE variants, plane ablations and massive-value replacement on the HF sdpa forward equal the
bridge's, restore exactly, decode with a KV cache and honour the rotation direction."""

from __future__ import annotations

import importlib

import pytest
import torch

import ropelens
from ropelens.analyses.massive_values import massive_values, replace_massive
from ropelens.analyses.passkey_retrieval import greedy_continuation
from ropelens.backends import sdpa
from ropelens.errors import UnsupportedModelError
from ropelens.run.evaluate import loss_path, window_losses
from ropelens.run.intervene import ablate_planes, apply_rope_variant
from ropelens.spec.reading import hf_model_of, rope_spec
from ropelens.spec.variants import NoPE, PlaneMask, PRoPE, YaRN
from ropelens.testing.families import N_CHECK, family_model_dir

FAMILIES = [
    "llama",
    "qwen2",
    "gemma3_text",
    "phi3",
    "smollm3",
]  # GQA, windows, local/global, partial, NoPE layers
VARIANTS = [PRoPE(0.5), YaRN(4.0, 8), NoPE(), PlaneMask((0, 2))]
# float32 forwards of a 4-layer model; sdpa and the bridge's eager attention sum in different
# orders, ~1e-6 apart
TOL = 1e-5


def _tokens(seed: int = 0, n: int = N_CHECK) -> torch.Tensor:
    toks = torch.randint(4, 100, (2, n), generator=torch.Generator().manual_seed(seed))
    toks[:, 0] = 1
    return toks


def _sdpa_logits(model, toks):
    with torch.no_grad(), sdpa.on_sdpa(model) as hf:
        return hf(input_ids=toks, use_cache=False).logits


def _bridge_logits(model, toks):
    with torch.no_grad():
        return model(toks)


def _close(a, b) -> float:
    return float((a - b).abs().max() / b.abs().max().clamp_min(1.0))


@pytest.mark.parametrize("family", FAMILIES)
def test_variants_and_ablation_equal_the_bridge_and_restore(family, family_model):
    model, _ = family_model(family)
    toks = _tokens()
    mod = importlib.import_module(type(hf_model_of(model)).__module__)
    rope_fn = mod.apply_rotary_pos_emb
    before_sdpa, before_bridge = _sdpa_logits(model, toks), _bridge_logits(model, toks)
    assert _close(before_sdpa, before_bridge) <= TOL
    for variant in VARIANTS:
        with apply_rope_variant(model, variant):
            assert loss_path(model) == "sdpa"
            ours, ref = _sdpa_logits(model, toks), _bridge_logits(model, toks)
            losses = (
                window_losses(model, toks, progress=False),
                window_losses(model, toks, progress=False, path="bridge"),
            )
        assert _close(ours, ref) <= TOL, variant.name
        assert _close(ours, before_bridge) > 1e-3, variant.name  # the variant changed the model
        assert float((losses[0] - losses[1]).abs().max()) <= TOL, variant.name
    with ablate_planes(model, [0, 1], heads=[0, 1]), apply_rope_variant(model, PRoPE(0.75)):
        ours, ref = _sdpa_logits(model, toks), _bridge_logits(model, toks)
    assert _close(ours, ref) <= TOL
    assert _close(ours, before_bridge) > 1e-3
    # restored to the bit: the rotation function, no plan, no hook, the same logits on both paths
    assert mod.apply_rotary_pos_emb is rope_fn and sdpa.active_plan(model) == ()
    assert torch.equal(_sdpa_logits(model, toks), before_sdpa)
    assert torch.equal(_bridge_logits(model, toks), before_bridge)


@pytest.mark.parametrize(
    "family", ["llama", "gemma3_text", "phi3"]
)  # plain, q/k norms before RoPE, partial
@pytest.mark.parametrize("control", [False, True])
def test_massive_replacement_on_sdpa_equals_the_bridge(family, control, family_model):
    """The pre-RoPE entries replace_massive writes through the bridge's hooks are written at the
    sdpa forward's rotation too: logits and losses agree with the bridge, under a variant as well,
    and restore."""
    model, _ = family_model(family)
    toks = _tokens(3)
    mv = massive_values(
        model, toks, progress=False, factor=1.3
    )  # a low factor: several dims per head
    assert int(mv.mask("q").sum()) > 0 and int(mv.mask("k").sum()) > 0
    before = _sdpa_logits(model, toks)
    with replace_massive(model, mv, control=control, seed=1):
        assert loss_path(model) == "sdpa"
        ours, ref = _sdpa_logits(model, toks), _bridge_logits(model, toks)
        losses = (
            window_losses(model, toks, progress=False),
            window_losses(model, toks, progress=False, path="bridge"),
        )
        with apply_rope_variant(model, PRoPE(0.5)):
            assert _close(_sdpa_logits(model, toks), _bridge_logits(model, toks)) <= TOL
    assert _close(ours, ref) <= TOL
    assert _close(ours, before) > 1e-3  # the replacement changed the model
    assert float((losses[0] - losses[1]).abs().max()) <= TOL
    assert sdpa.active_plan(model) == () and torch.equal(_sdpa_logits(model, toks), before)


def test_layer_kind_variant_on_gemma3_global_layers(family_model):
    model, _ = family_model("gemma3_text")
    toks = _tokens(1)
    with apply_rope_variant(model, PRoPE(0.25), layer_kind="full"):
        assert _close(_sdpa_logits(model, toks), _bridge_logits(model, toks)) <= TOL


@pytest.mark.parametrize("family", ["llama", "gemma3_text"])
def test_cached_decoding_under_a_variant_equals_full_forwards(family, family_model):
    model, _ = family_model(family)
    prompt = _tokens(2, 21)[0]
    with apply_rope_variant(model, YaRN(4.0, 8)), ablate_planes(model, [1]):
        cached = greedy_continuation(model, prompt, 10, prefill_chunk=5, stop_after_number=False)
        full = greedy_continuation(model, prompt, 10, cache=False, stop_after_number=False)
        bridge = greedy_continuation(
            model, prompt, 10, cache=False, stop_after_number=False, path="bridge"
        )
        # the independent check: argmax of one no-cache forward over the whole generated sequence
        seq = torch.cat([prompt, torch.tensor(cached)])[None]
        with torch.no_grad():
            forward = model(seq)[0, prompt.numel() - 1 : -1].argmax(-1).tolist()
    assert cached == full == bridge == forward


def test_other_hooks_keep_the_bridge(family_model):
    model, _ = family_model("llama")
    toks = _tokens(3)
    with model.hooks(fwd_hooks=[("blocks.0.hook_resid_pre", lambda x, hook: x * 0.5)]):
        assert loss_path(model) == "bridge"
        with pytest.raises(UnsupportedModelError, match="bridge"):
            _sdpa_logits(model, toks)
        halved = window_losses(model, toks, progress=False)
    assert float((halved - window_losses(model, toks, progress=False)).abs().max()) > 1e-3


# --------------------------------------------------------------------------------------------
# rotation direction
# --------------------------------------------------------------------------------------------
def _flip_rotate_half(x):
    x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2 :]
    return torch.cat((x2, -x1), dim=-1)


def _mirrored(model) -> None:
    """Negate the second coordinate of every plane of q and k (rows d/2.. of each head): turning the
    other way is this reflection, so the mirrored model turning the usual way gives the reversed
    model's logits."""
    hf = hf_model_of(model)
    with torch.no_grad():
        for layer in hf.model.layers:
            for proj in (layer.self_attn.q_proj, layer.self_attn.k_proj):
                w = proj.weight.view(
                    -1, 16, proj.weight.shape[-1]
                )  # head_dim 16 in the llama family
                w[:, 8:] *= -1


@pytest.mark.parametrize("how", ["rotate_half", "tables"])
def test_variants_honour_a_reversed_rotation(how, tmp_path, monkeypatch):
    from transformers.models.llama import modeling_llama

    path = family_model_dir("llama", tmp_path / "llama")
    mirror = ropelens.load_model(path, device="cpu")
    _mirrored(mirror)
    toks = _tokens(4)
    variants = (PRoPE(0.5), YaRN(4.0, 8), PlaneMask((1,)))
    want = [_bridge_logits(mirror, toks)]  # the mirrored model turning the usual way
    for variant in variants:
        with apply_rope_variant(mirror, variant):
            want.append(_bridge_logits(mirror, toks))
    if how == "rotate_half":  # the rotation function turns the other way (NanoChat)
        monkeypatch.setattr(modeling_llama, "rotate_half", _flip_rotate_half)
    else:  # the tables turn the other way: sin(−mθ)
        forward = modeling_llama.LlamaRotaryEmbedding.forward

        def negated(self, x, position_ids):
            cos, sin = forward(self, x, position_ids)
            return cos, -sin

        monkeypatch.setattr(modeling_llama.LlamaRotaryEmbedding, "forward", negated)
    model = ropelens.load_model(path, device="cpu")
    assert {lr.direction for lr in rope_spec(model).layers} == {-1}
    assert _close(_sdpa_logits(model, toks), want[0]) <= TOL
    assert _close(_bridge_logits(model, toks), want[0]) <= TOL
    for variant, expected in zip(variants, want[1:], strict=True):
        with apply_rope_variant(model, variant):
            assert _close(_sdpa_logits(model, toks), expected) <= TOL, variant.name
            assert _close(_bridge_logits(model, toks), expected) <= TOL, variant.name
        assert _close(expected, want[0]) > 1e-3
