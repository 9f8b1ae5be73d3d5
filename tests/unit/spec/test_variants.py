"""RoPE variants: frequencies against HF and closed forms, running a model under them, band
ablation."""

from __future__ import annotations

import dataclasses
import json
import math

import pytest
import torch

from ropelens import NotRotaryError, rope_spec
from ropelens.run.intervene import (
    ablate_planes,
    apply_rope_variant,
    spec_with_variant,
    with_rope_variant,
)
from ropelens.spec.variants import (
    NTK,
    BaseChange,
    Default,
    DynamicNTK,
    Linear,
    Llama3,
    LongRoPE,
    NoPE,
    PlaneMask,
    PRoPE,
    PRoPEPartial,
    PRoPEReversed,
    RopeVariant,
    YaRN,
    kept_planes,
    variant_from_dict,
)
from ropelens.testing import tiny_hf_model, tiny_model

THETA = 10000.0
SHORT = [1.0, 1.0, 1.1, 1.2, 1.5, 2.0, 2.5, 3.0]
LONG = [1.0, 1.5, 2.0, 3.0, 4.0, 6.0, 8.0, 16.0]

# (variant, the same method as HF rope_parameters on the tiny Llama, extra config)
HF_CASES = [
    (Default(), {"rope_type": "default"}, {}),
    (BaseChange(500.0), {"rope_type": "default", "rope_theta": 500.0}, {}),
    (PRoPE(0.75), {"rope_type": "proportional", "partial_rotary_factor": 0.75}, {}),
    (PRoPE(0.7), {"rope_type": "proportional", "partial_rotary_factor": 0.7}, {}),
    (PRoPE(1 / 3), {"rope_type": "proportional", "partial_rotary_factor": 1 / 3}, {}),
    (Linear(4.0), {"rope_type": "linear", "factor": 4.0}, {}),
    (
        YaRN(4.0, 64),
        {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64},
        {},
    ),
    (
        YaRN(4.0, 64, beta_fast=16, beta_slow=2, mscale=1.0, mscale_all_dim=0.5, truncate=False),
        {
            "rope_type": "yarn",
            "factor": 4.0,
            "original_max_position_embeddings": 64,
            "beta_fast": 16,
            "beta_slow": 2,
            "mscale": 1.0,
            "mscale_all_dim": 0.5,
            "truncate": False,
        },
        {},
    ),
    (
        Llama3(8.0, 1.0, 4.0, 64),
        {
            "rope_type": "llama3",
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 64,
        },
        {},
    ),
    (
        LongRoPE(SHORT, LONG, 16, factor=4.0),
        {
            "rope_type": "longrope",
            "short_factor": SHORT,
            "long_factor": LONG,
            "original_max_position_embeddings": 16,
            "factor": 4.0,
        },
        {},
    ),
    (DynamicNTK(4.0, 16), {"rope_type": "dynamic", "factor": 4.0}, {"max_position_embeddings": 16}),
]
IDS = [type(v).__name__ + str(i) for i, (v, _, _) in enumerate(HF_CASES)]

ALL_VARIANTS = [v for v, _, _ in HF_CASES] + [
    NoPE(),
    PRoPEReversed(0.75),
    PRoPEPartial(0.75),
    PlaneMask([1, 3]),
    NTK(4.0),
    LongRoPE(SHORT, LONG, 16, factor=4.0, n_hat=5),
]


def _params(rp: dict) -> dict:
    return {"rope_theta": THETA, **rp}


@pytest.fixture(scope="module")
def llama():
    return tiny_model("llama")


@pytest.fixture(scope="module")
def gqa():
    return tiny_model("llama-gqa")


@pytest.fixture(scope="module")
def gemma():
    return tiny_model("gemma3")


@pytest.fixture(scope="module")
def layer(llama):
    return rope_spec(llama)[0]


@pytest.fixture(scope="module")
def toks(llama):
    return llama.to_tokens(["The quick brown fox jumps over the lazy dog", "RoPE!"])


def _cache(model, toks, names):
    _, cache = model.run_with_cache(toks, names_filter=lambda n: n in names)
    return cache


# --------------------------------------------------------------------------------------------
# frequencies
# --------------------------------------------------------------------------------------------
@pytest.mark.parametrize(("variant", "rp", "extra"), HF_CASES, ids=IDS)
def test_frequencies_match_hf_rotary_module(variant, rp, extra, layer):
    rot = tiny_hf_model("llama", rope_parameters=_params(rp), **extra).model.rotary_emb
    assert variant.inv_freq(layer).dtype == torch.float32
    assert torch.equal(variant.inv_freq(layer), rot.inv_freq)
    assert variant.attention_scaling(layer) == rot.attention_scaling


def test_default_is_the_models_own_rope(llama, gemma):
    for model in (llama, gemma):
        for lr in rope_spec(model).layers:
            assert torch.equal(Default().inv_freq(lr), lr.inv_freq)


def test_p_rope_endpoints(layer):
    default, nope = Default().inv_freq(layer), NoPE().inv_freq(layer)
    assert torch.equal(nope, torch.zeros(8))
    for cls in (PRoPE, PRoPEReversed, PRoPEPartial):
        assert torch.equal(cls(1).inv_freq(layer), default), cls
        assert torch.equal(cls(0).inv_freq(layer), nope), cls


def test_odd_splits_round_down_like_hf(layer):
    # 0.7 of 8 planes = 5.6 planes: all three keep 5.
    default = Default().inv_freq(layer)
    assert kept_planes(0.7, 8) == 5
    p = PRoPE(0.7).inv_freq(layer)
    assert torch.equal(p[:5], default[:5]) and not p[5:].any()
    r = PRoPEReversed(0.7).inv_freq(layer)
    assert not r[:3].any() and torch.equal(r[3:], default[3:])
    part = PRoPEPartial(0.7).inv_freq(layer)
    assert torch.equal(part[:5], 1.0 / THETA ** (torch.arange(0, 10, 2, dtype=torch.float) / 10))
    assert not part[5:].any()
    # HF floors p·d in floating point: 0.58·100 = 57.99999999999999 keeps 28 planes, not 29.
    wide = dataclasses.replace(layer, inv_freq=torch.ones(50), head_dim=100, rotary_dim=100)
    assert kept_planes(0.58, 50) == 28
    assert int((PRoPE(0.58).inv_freq(wide) > 0).sum()) == 28
    assert int((PRoPEReversed(0.58).inv_freq(wide) > 0).sum()) == 28


def test_partial_is_hf_partial_rotary_frequencies(layer):
    from transformers import LlamaConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    cfg = LlamaConfig(
        hidden_size=64,
        num_attention_heads=4,
        head_dim=16,
        rope_parameters={
            "rope_type": "linear",
            "factor": 1.0,
            "rope_theta": THETA,
            "partial_rotary_factor": 0.5,
        },
    )
    hf, _ = ROPE_INIT_FUNCTIONS["linear"](cfg)
    ours = PRoPEPartial(0.5).inv_freq(layer)
    assert torch.equal(ours[:4], hf) and not ours[4:].any()


def test_closed_forms(layer):
    i = torch.arange(8, dtype=torch.float64)
    d = 16
    base = THETA * 4.0 ** (d / (d - 2))
    assert torch.allclose(NTK(4.0).inv_freq(layer).double(), base ** (-2 * i / d), rtol=1e-6)
    # Static NTK at factor 4 is HF's dynamic NTK at the length where its base scale reaches 4.
    dyn = DynamicNTK(2.0, 16).inv_freq(layer, seq_len=40)  # 2·40/16 − (2 − 1) = 4
    assert torch.allclose(NTK(4.0).inv_freq(layer), dyn, rtol=1e-5)
    assert torch.equal(DynamicNTK(2.0, 16).inv_freq(layer, seq_len=16), Default().inv_freq(layer))
    assert torch.allclose(
        BaseChange(500.0).inv_freq(layer).double(), 500.0 ** (-2 * i / d), rtol=1e-6
    )
    mask = PlaneMask([1, 3]).inv_freq(layer)
    expect = Default().inv_freq(layer)
    expect[[1, 3]] = 0
    assert torch.equal(mask, expect)
    lr = LongRoPE(SHORT, LONG, 16, factor=4.0)
    assert lr.attention_scaling(layer) == pytest.approx(math.sqrt(1 + math.log(4) / math.log(16)))
    assert torch.allclose(
        lr.inv_freq(layer, seq_len=17).double(), THETA ** (-2 * i / d) / torch.tensor(LONG).double()
    )
    assert torch.allclose(
        lr.inv_freq(layer, seq_len=16).double(),
        THETA ** (-2 * i / d) / torch.tensor(SHORT).double(),
    )


def test_longrope_first_positions_are_uninterpolated(layer):
    pos = torch.arange(24)[None]
    ang = LongRoPE(SHORT, LONG, 16, factor=4.0, n_hat=5).angles(layer, pos)
    plain, scaled = (
        Default().angles(layer, pos),
        LongRoPE(SHORT, LONG, 16, factor=4.0).angles(layer, pos),
    )
    assert torch.equal(ang[:, :5], plain[:, :5])
    assert torch.equal(ang[:, 5:], scaled[:, 5:])
    assert not torch.equal(scaled[:, 5:], plain[:, 5:])  # 24 tokens > 16: the long factors


# --------------------------------------------------------------------------------------------
# frequencies against the papers' formulas, written out here in float64 (not HF's code)
# --------------------------------------------------------------------------------------------
def _theta(base: float, d: int) -> torch.Tensor:
    """θ_i = base^(−2i/d), i = 0 … d/2 − 1 (Su et al.), float64."""
    return base ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)


def _shaped(layer, d: int, base: float):
    """The tiny layer's spec with another head dim and base (variants read only those)."""
    return dataclasses.replace(
        layer, inv_freq=_theta(base, d).float(), head_dim=d, rotary_dim=d, base=base
    )


# (s, L0, base, d, truncate, last kept plane, first fully interpolated plane): the planes worked out
# by hand from the turns L0·θ_i/2π each plane completes in L0 (≥ β_fast = 32: kept; ≤ β_slow = 1:
# θ/s). Llama 2's 4k → 32k: plane 20 turns 36.7 times, 21 31.7, 45 1.004, 46 0.87.
YARN_CASES = [
    (8.0, 4096, 1e4, 128, True, 20, 46),
    (4.0, 8192, 5e5, 64, True, 9, 18),
    (16.0, 2048, 1e4, 64, False, 8, 21),
]


@pytest.mark.parametrize(
    ("s", "L0", "base", "d", "truncate", "last_kept", "first_interp"), YARN_CASES
)
def test_yarn_per_plane_ramp_by_hand(layer, s, L0, base, d, truncate, last_kept, first_interp):
    """YaRN against Peng et al.'s reference ramp (jquesnelle/yarn, which HF follows) and mscale
    0.1·ln s + 1."""
    theta = _theta(base, d)
    i = torch.arange(d // 2, dtype=torch.float64)
    turns = L0 * theta / (2 * math.pi)
    assert i[turns >= 32].max() == last_kept and i[turns <= 1].min() == first_interp
    # The reference ramp is linear in the plane index (the paper's eq. is linear in turns r). With
    # truncation (floor/ceil, HF's default) it runs from the last kept plane to the first
    # interpolated one; without, between the real plane indices where L0·θ_i/2π = 32 and = 1.
    if truncate:
        lo, hi = last_kept, first_interp
    else:
        lo, hi = ((d / 2) * math.log(L0 / (2 * math.pi * r)) / math.log(base) for r in (32, 1))
    ramp = ((i - lo) / (hi - lo)).clamp(0, 1)  # 0: θ_i (extrapolated), 1: θ_i / s (interpolated)
    expect = theta * (1 - ramp) + theta / s * ramp

    variant = YaRN(s, L0, truncate=truncate)
    lr = _shaped(layer, d, base)
    got = variant.inv_freq(lr).double()
    torch.testing.assert_close(got, expect, rtol=2e-6, atol=0)
    # The three groups, spelled out: kept, interpolated, strictly between.
    kept, interp, blend = (
        slice(0, last_kept + 1),
        slice(first_interp, None),
        slice(last_kept + 1, first_interp),
    )
    assert torch.allclose(got[kept], theta[kept], rtol=2e-6, atol=0)
    assert torch.allclose(got[interp], theta[interp] / s, rtol=2e-6, atol=0)
    assert bool(((got[blend] < theta[blend]) & (got[blend] > theta[blend] / s)).all())
    assert variant.attention_scaling(lr) == pytest.approx(0.1 * math.log(s) + 1, rel=1e-12)


# (factor, low, high, L0, base, d, planes kept, planes divided by the factor), counted by hand from
# λ_i = 2π·base^(2i/d): Llama 3.1 8B's own setting (base 5e5) keeps planes 0–28 (λ_28 = 1,956 <
# 8192/4), divides 35–63 (λ_35 = 8,219 > 8192/1) and blends 29–34.
LLAMA3_CASES = [
    (8.0, 1.0, 4.0, 8192, 5e5, 128, 29, 29),
    (4.0, 1.0, 4.0, 4096, 1e4, 64, 18, 9),
    (8.0, 2.0, 8.0, 8192, 5e5, 64, 13, 16),
]


@pytest.mark.parametrize(
    ("factor", "low", "high", "L0", "base", "d", "n_kept", "n_div"), LLAMA3_CASES
)
def test_llama3_wavelength_bands_by_hand(layer, factor, low, high, L0, base, d, n_kept, n_div):
    """Llama 3.1's rule (Meta's reference apply_scaling): λ < L0/high kept, λ > L0/low ÷ factor,
    smooth between."""
    theta = _theta(base, d)
    lam = 2 * math.pi / theta
    kept, divided = lam < L0 / high, lam > L0 / low
    assert (int(kept.sum()), int(divided.sum())) == (n_kept, n_div)
    # No wavelength within float32 rounding of a band edge, so the bands cannot flip in HF's
    # float32.
    assert ((lam / (L0 / high) - 1).abs().min() > 1e-3) and (
        (lam / (L0 / low) - 1).abs().min() > 1e-3
    )
    smooth = (L0 / lam - low) / (high - low)
    blended = (1 - smooth) * theta / factor + smooth * theta
    expect = torch.where(kept, theta, torch.where(divided, theta / factor, blended))

    variant = Llama3(factor, low, high, L0)
    if (factor, low, high, L0) == (8.0, 1.0, 4.0, 8192):
        assert variant == Llama3()  # Meta's published defaults
    got = variant.inv_freq(_shaped(layer, d, base)).double()
    torch.testing.assert_close(got, expect, rtol=2e-6, atol=0)
    assert variant.attention_scaling(_shaped(layer, d, base)) == 1.0


@pytest.mark.parametrize(("s", "base", "d"), [(4.0, 1e4, 16), (2.5, 5e5, 128), (16.0, 1e6, 64)])
def test_pi_divides_every_frequency_by_the_factor(layer, s, base, d):
    """Position interpolation (Chen et al. 2023): position m read as m/s, i.e. θ_i / s on every
    plane."""
    lr = _shaped(layer, d, base)
    torch.testing.assert_close(
        Linear(s).inv_freq(lr).double(), _theta(base, d) / s, rtol=1e-6, atol=0
    )
    assert Linear(s).attention_scaling(lr) == 1.0


@pytest.mark.parametrize(("s", "base", "d"), [(4.0, 1e4, 128), (8.0, 5e5, 64), (2.0, 1e4, 16)])
def test_ntk_base_by_hand(layer, s, base, d):
    """NTK-aware scaling (bloc97): base' = base·s^(d/(d−2)), so θ_0 stays 1 and the lowest plane is
    θ/s."""
    got = NTK(s).inv_freq(_shaped(layer, d, base)).double()
    torch.testing.assert_close(got, _theta(base * s ** (d / (d - 2)), d), rtol=2e-6, atol=0)
    assert got[0] == 1.0
    torch.testing.assert_close(got[-1], _theta(base, d)[-1] / s, rtol=2e-6, atol=0)


# (p, base, d, planes kept, counted by hand as ⌊p·d/2⌋)
PROPE_CASES = [(0.75, 1e4, 128, 48), (0.25, 5e5, 64, 8), (0.7, 1e4, 16, 5), (0.5, 1e6, 256, 64)]


@pytest.mark.parametrize(("p", "base", "d", "k"), PROPE_CASES)
def test_p_rope_keeps_the_highest_frequencies_by_hand(layer, p, base, d, k):
    """p-RoPE (Barbero et al. 2025): planes 0 … k−1 rotate at base^(−2i/d) over the full d, the rest
    are 0."""
    got = PRoPE(p).inv_freq(_shaped(layer, d, base))
    torch.testing.assert_close(got[:k].double(), _theta(base, d)[:k], rtol=1e-6, atol=0)
    assert (got[:k] > 0).all()
    assert torch.equal(got[k:], torch.zeros(d // 2 - k))


# (p as k/100, planes) where HF's float p·(2n) lands just below the even integer 2⌊p·n⌋ and keeps
# one plane fewer than exact arithmetic: found by sweeping k = 0…100, n = 1…128.
_HF_ROUNDS_DOWN = {(29, 100), (57, 100), (58, 50), (58, 100), (70, 90)}


def test_kept_planes_is_the_floor_of_p_n():
    """kept_planes(p, n) against ⌊k·n/100⌋ in integer arithmetic for p = k/100, bar HF's five float
    cases."""
    for k in range(101):
        for n in range(1, 129):
            exact = k * n // 100
            if (k, n) in _HF_ROUNDS_DOWN:
                assert (k / 100) * (2 * n) < 2 * exact  # e.g. 0.58·100 = 57.99999999999999
                assert kept_planes(k / 100, n) == exact - 1, (k, n)
            else:
                assert kept_planes(k / 100, n) == exact, (k, n)
    assert (
        kept_planes(0.75, 8),
        kept_planes(0.0, 8),
        kept_planes(1.0, 8),
        kept_planes(0.5, 7),
    ) == (6, 0, 8, 3)


@pytest.mark.parametrize("variant", ALL_VARIANTS, ids=lambda v: type(v).__name__)
def test_provenance_round_trip(variant, layer):
    d = json.loads(json.dumps(variant.to_dict()))
    back = variant_from_dict(d)
    assert back == variant and back.name == variant.name
    assert torch.equal(back.inv_freq(layer), variant.inv_freq(layer))
    assert variant.inv_freq(layer).shape == (layer.n_planes,)


# --------------------------------------------------------------------------------------------
# running a model under a variant
# --------------------------------------------------------------------------------------------
@pytest.mark.parametrize(("variant", "rp", "extra"), HF_CASES, ids=IDS)
def test_logits_equal_hf_model_with_that_rope(variant, rp, extra, llama, toks):
    hf = tiny_model("llama", rope_parameters=_params(rp), **extra)
    # Short, then past LongRoPE's/dynamic NTK's original 16 positions (HF's dynamic module only
    # grows).
    for t in (toks[:, :10], toks[:1, :24]):
        with apply_rope_variant(llama, variant) as spec:
            got = llama(t)
        assert torch.equal(got, hf(t)), (variant.name, t.shape)
    assert torch.equal(spec[1].inv_freq, variant.inv_freq(spec[1]))


def test_gemma_layer_kinds_equal_hf_per_type_rope(gemma, toks):
    cases = [
        (
            Linear(4.0),
            "full",
            {"full_attention": {"rope_type": "linear", "factor": 4.0, "rope_theta": 1e6}},
        ),
        (
            PRoPE(0.5),
            "sliding",
            {
                "sliding_attention": {
                    "rope_type": "proportional",
                    "partial_rotary_factor": 0.5,
                    "rope_theta": 1e4,
                }
            },
        ),
    ]
    for variant, kind, rp in cases:
        rope = {
            "sliding_attention": {"rope_type": "default", "rope_theta": 1e4},
            "full_attention": {"rope_type": "default", "rope_theta": 1e6},
            **rp,
        }
        with apply_rope_variant(gemma, variant, layer_kind=kind):
            got = gemma(toks)
        assert torch.equal(got, tiny_model("gemma3", rope_parameters=rope)(toks)), kind


def test_models_own_dynamic_rope_does_not_fight_the_variant(llama, toks):
    # HF's dynamic module regrows its own inv_freq past 16 tokens; the variant must still win.
    dynamic = tiny_model(
        "llama",
        max_position_embeddings=16,
        rope_parameters=_params({"rope_type": "dynamic", "factor": 4.0}),
    )
    t = toks[:1, :24]
    with apply_rope_variant(dynamic, Default()):
        assert torch.equal(dynamic(t), llama(t))


def test_nested_variants_innermost_wins(llama, toks):
    with apply_rope_variant(llama, NoPE()), apply_rope_variant(llama, Linear(4.0)):
        got = llama(toks)
    assert torch.equal(
        got,
        tiny_model("llama", rope_parameters=_params({"rope_type": "linear", "factor": 4.0}))(toks),
    )


def test_leaving_restores_model_exactly(gqa, toks):
    rot = gqa.rotary_emb.original_component
    before, buffers = gqa(toks), {k: v.clone() for k, v in rot.named_buffers()}
    with apply_rope_variant(gqa, YaRN(4.0, 64)):
        assert not torch.equal(gqa(toks), before)
    assert torch.equal(gqa(toks), before)
    with pytest.raises(KeyError), apply_rope_variant(gqa, PRoPE(0.25)):
        raise KeyError("boom")
    assert torch.equal(gqa(toks), before)
    assert all(torch.equal(v, buffers[k]) for k, v in rot.named_buffers())
    assert rot.attention_scaling == 1.0
    assert not any(b.attn._forward_pre_hooks for b in gqa.blocks)


_TORCH_HOOKS = ("_forward_hooks", "_forward_pre_hooks", "_backward_hooks", "_backward_pre_hooks")


def _all_hooks(model) -> set[tuple]:
    """Every hook on ``model``: torch's per-module and global registries, TransformerLens' HookPoint
    lists."""
    mods = {id(m): m for m in model.modules()} | {id(h): h for h in model.hook_dict.values()}
    found = set()
    for m in mods.values():
        for attr in _TORCH_HOOKS:
            found |= {(attr, id(m), key) for key in getattr(m, attr)}
        for attr in ("fwd_hooks", "bwd_hooks"):  # HookPoint's LensHandles (permanent ones too)
            found |= {(attr, id(m), id(h)) for h in getattr(m, attr, ())}
    glob = torch.nn.modules.module
    for attr in ("_global_forward_hooks", "_global_forward_pre_hooks", "_global_backward_hooks"):
        found |= {(attr, key) for key in getattr(glob, attr)}
    return found


RESTORE_CASES = {
    "dynamic-ntk-past-L0": lambda m: apply_rope_variant(m, DynamicNTK(4.0, 16)),
    "longrope-past-L0": lambda m: apply_rope_variant(
        m, LongRoPE(SHORT, LONG, 16, factor=4.0, n_hat=3)
    ),
    "ablate-planes": lambda m: ablate_planes(m, [0, 5], heads=[1]),
}


@pytest.mark.parametrize("case", RESTORE_CASES)
def test_leaving_restores_logits_and_removes_every_hook(tiny, case):
    """Logits after leaving equal the ones before, bit for bit; the hook registries equal a snapshot
    taken before."""
    model = tiny("llama-gqa")
    toks = torch.randint(
        0, 100, (2, 24), generator=torch.Generator().manual_seed(0)
    )  # 24 > L0 = 16
    before = model(toks)
    hooks = _all_hooks(
        model
    )  # after a forward: the bridge adds its own capture hooks on the first one
    with RESTORE_CASES[case](model):
        assert _all_hooks(model) > hooks  # what it installs is visible to the snapshot
        assert not torch.equal(model(toks), before)
    assert _all_hooks(model) == hooks
    with pytest.raises(KeyError), RESTORE_CASES[case](model):  # leaving by an exception
        raise KeyError("boom")
    assert _all_hooks(model) == hooks
    assert torch.equal(model(toks), before)


def test_only_the_asked_layers_change(llama, toks):
    names = {f"blocks.{i}.attn.{h}" for i in (0, 1) for h in ("hook_cos", "hook_attn_scores")}
    ref = _cache(llama, toks, names)
    with apply_rope_variant(llama, NoPE(), layers=[1]):
        got = _cache(llama, toks, names)
    assert torch.equal(got["blocks.0.attn.hook_attn_scores"], ref["blocks.0.attn.hook_attn_scores"])
    assert torch.equal(got["blocks.0.attn.hook_cos"], ref["blocks.0.attn.hook_cos"])
    assert torch.equal(
        got["blocks.1.attn.hook_cos"], torch.ones_like(ref["blocks.1.attn.hook_cos"])
    )


@pytest.mark.parametrize(
    ("layers", "kind", "changed"),
    [
        (None, "full", {3}),
        (None, "sliding", {0, 1, 2}),
        ([1, 3], "sliding", {1}),
        ([2, 3], None, {2, 3}),
    ],
)
def test_only_the_asked_layer_kinds_change(gemma, toks, layers, kind, changed):
    names = {
        f"blocks.{i}.attn.{h}"
        for i in range(4)
        for h in ("hook_cos", "hook_sin", "hook_attn_scores")
    }
    ref = _cache(gemma, toks, names)
    spec = rope_spec(gemma)
    with apply_rope_variant(gemma, Linear(2.0), layers=layers, layer_kind=kind):
        got = _cache(gemma, toks, names)
    pos = torch.arange(toks.shape[1])[None]
    for i in range(4):
        cos = got[f"blocks.{i}.attn.hook_cos"]
        if i in changed:
            ang = Linear(2.0).angles(spec[i], pos)
            assert torch.equal(cos, torch.cat([ang, ang], -1).cos())
        else:
            assert torch.equal(cos, ref[f"blocks.{i}.attn.hook_cos"])
        if i < min(changed):  # layers before the first changed one see identical inputs
            assert torch.equal(
                got[f"blocks.{i}.attn.hook_attn_scores"], ref[f"blocks.{i}.attn.hook_attn_scores"]
            )
        if i in changed:
            assert not torch.equal(
                got[f"blocks.{i}.attn.hook_attn_scores"], ref[f"blocks.{i}.attn.hook_attn_scores"]
            )


def test_longrope_n_hat_tables_in_the_model(llama, toks):
    v = LongRoPE(SHORT, LONG, 16, factor=4.0, n_hat=5)
    long = toks[:1, :24]
    with apply_rope_variant(llama, v):
        cos = _cache(llama, long, {"blocks.0.attn.hook_cos"})["blocks.0.attn.hook_cos"]
    lr = rope_spec(llama)[0]
    plain = Default().angles(lr, torch.arange(5)[None])
    assert torch.equal(cos[:, :5], torch.cat([plain, plain], -1).cos() * v.attention_scaling(lr))


def test_with_rope_variant_is_a_modified_copy(llama, toks):
    before = llama(toks)
    copy = with_rope_variant(llama, PRoPE(0.5), layers=[0])
    with apply_rope_variant(llama, PRoPE(0.5), layers=[0]):
        inside = llama(toks)
    assert torch.equal(copy(toks), inside)
    assert torch.equal(llama(toks), before)
    assert copy.ropelens_rope_variant == {"variant": {"variant": "PRoPE", "p": 0.5}, "layers": [0]}


def test_spec_with_variant(llama):
    spec = spec_with_variant(rope_spec(llama), YaRN(4.0, 64), layers=[1])
    assert torch.equal(spec[0].inv_freq, rope_spec(llama)[0].inv_freq)
    # By hand: d = 16, base 1e4, L0 = 64. Plane i turns 64·10^(−i/2)/2π times: 10.2 for plane 0 (the
    # reference code clamps the ramp's start at plane 0, so it is kept), 1.02 for plane 2, 0.32 for
    # plane 3. The truncated ramp runs from plane 0 to plane 3: weights of θ/4 are 0, 1/3, 2/3, 1,
    # ….
    theta = _theta(THETA, 16)
    ramp = torch.tensor([0, 1 / 3, 2 / 3, 1, 1, 1, 1, 1], dtype=torch.float64)
    torch.testing.assert_close(
        spec[1].inv_freq.double(), theta * (1 - ramp) + theta / 4 * ramp, rtol=2e-6, atol=0
    )
    assert spec[1].attention_scaling == pytest.approx(0.1 * math.log(4) + 1)
    assert spec[1].rope_type == "yarn"


# --------------------------------------------------------------------------------------------
# band ablation
# --------------------------------------------------------------------------------------------
def _scores(model, toks, layer=0):
    p = f"blocks.{layer}.attn."
    cache = _cache(model, toks, {p + "hook_attn_scores", p + "hook_rot_q", p + "hook_rot_k"})
    return cache[p + "hook_attn_scores"], cache[p + "hook_rot_q"], cache[p + "hook_rot_k"]


def test_ablating_all_planes_zeroes_the_scores(gqa, toks):
    before = gqa(toks)
    allowed = torch.ones(toks.shape[1], toks.shape[1]).tril().bool()
    with ablate_planes(gqa, range(8)):
        for layer in (0, 1):
            scores, _, _ = _scores(gqa, toks, layer)
            assert not scores[..., allowed].any()
    assert torch.equal(gqa(toks), before)


def test_ablation_removes_exactly_the_planes_terms(gqa, toks):
    lr = rope_spec(gqa)[0]
    scores, q, k = _scores(gqa, toks)
    k = k.repeat_interleave(lr.group_size, dim=2)  # query head h reads KV head h // group
    terms = torch.einsum("bqhpc,bkhpc->bhqkp", lr.split(q), lr.split(k)) * lr.score_scale
    allowed = torch.ones(toks.shape[1], toks.shape[1]).tril().bool()
    with ablate_planes(gqa, [0, 5], layers=[0]):
        ablated, _, _ = _scores(gqa, toks)
    expect = scores - terms[..., [0, 5]].sum(-1)
    assert torch.allclose(ablated[..., allowed], expect[..., allowed], atol=1e-5)


def test_gqa_head_ablation_leaves_other_heads(gqa, toks):
    scores, _, k = _scores(gqa, toks)
    with ablate_planes(gqa, [0, 1], layers=[0], heads=[0]):
        s1, _, k1 = _scores(gqa, toks)
        gqa.reset_hooks()  # the ablation must survive users' hook resets
        s2, _, _ = _scores(gqa, toks)
    assert not torch.equal(s1[:, 0], scores[:, 0])
    assert torch.equal(s1[:, 1:], scores[:, 1:])  # head 1 shares KV head 0 with head 0
    assert torch.equal(k1, k)
    assert torch.equal(s2, s1)
    with ablate_planes(gqa, [0, 1], layers=[0], heads=[0, 1]):
        _, _, k2 = _scores(gqa, toks)
    assert not k2[:, :, 0, [0, 1, 8, 9]].any() and torch.equal(k2[:, :, 1], k[:, :, 1])


# --------------------------------------------------------------------------------------------
# errors
# --------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("make", "match"),
    [
        (lambda: PRoPE(1.5), r"p must be >= 0 and <= 1, got 1.5 \(p is the share"),
        (lambda: PRoPEReversed(-0.1), "p must be >= 0 and <= 1"),
        (lambda: PRoPEPartial(True), "p must be a finite number"),
        (lambda: Linear(0), "factor must be > 0, got"),
        (lambda: NTK(-2.0), "factor must be > 0, got"),
        (lambda: DynamicNTK(2.0, 0), "original_max_position must be >= 1"),
        (lambda: YaRN(4.0, 64, mscale=1.0), "mscale and mscale_all_dim together"),
        (lambda: YaRN(4.0, 64, beta_fast=1, beta_slow=2), "beta_fast"),
        (lambda: Llama3(high_freq_factor=1.0), "high_freq_factor"),
        (lambda: LongRoPE([1.0] * 8, [1.0] * 7, 16), "long_factor 7"),
        (lambda: LongRoPE([1.0] * 8, [0.0] * 8, 16), "long_factor entry must be > 0"),
        (lambda: PlaneMask([-1]), "plane indices must be non-negative"),
        (lambda: BaseChange(1.0), "base must be > 1"),
    ],
)
def test_bad_parameters_raise(make, match):
    with pytest.raises(ValueError, match=match):
        make()


def test_bad_layer_fit_raises(layer):
    with pytest.raises(ValueError, match="7 rescale factors but layer 0 has 8 planes"):
        LongRoPE([1.0] * 7, [1.0] * 7, 16).inv_freq(layer)
    with pytest.raises(ValueError, match=r"plane indices \[8\] out of range"):
        PlaneMask([2, 8]).inv_freq(layer)
    with pytest.raises(ValueError, match="records no RoPE base"):
        Default().inv_freq(dataclasses.replace(layer, base=None))


def test_bad_application_raises(llama, toks):
    before = llama(toks)
    with (
        pytest.raises(TypeError, match="expected a RoPE variant"),
        apply_rope_variant(llama, "yarn"),
    ):
        pass
    with (
        pytest.raises(ValueError, match="layer 5 out of range"),
        apply_rope_variant(llama, NoPE(), layers=[5]),
    ):
        pass
    with (
        pytest.raises(ValueError, match="layer kind 'sliding'"),
        apply_rope_variant(llama, NoPE(), layer_kind="sliding"),
    ):
        pass
    with pytest.raises(ValueError, match="8 planes"), apply_rope_variant(llama, PlaneMask([9])):
        pass
    with pytest.raises(ValueError, match=r"plane indices \[8\]"), ablate_planes(llama, [8]):
        pass
    with (
        pytest.raises(ValueError, match=r"head indices \[4\] out of range"),
        ablate_planes(llama, [0], heads=[4]),
    ):
        pass
    assert torch.equal(llama(toks), before)


def test_models_without_usable_rope_raise():
    with pytest.raises(NotRotaryError), apply_rope_variant(tiny_model("gpt2"), NoPE()):
        pass


def test_a_model_rotating_inside_its_hf_module_takes_variants():
    """GPT-J rotates inside its HF attention module (no (cos, sin) handed to the bridge's
    attention): the engine applies the variant at that rotation. Under NoPE the rotated queries are
    the pre-RoPE ones."""
    from ropelens.run.capture import capture_qk

    gptj = tiny_model("gptj")
    toks = torch.randint(4, 100, (1, 12), generator=torch.Generator().manual_seed(0))
    with apply_rope_variant(gptj, NoPE()):
        acts = capture_qk(gptj, toks, layers=[0], which=("q_pre", "q_rot"))[0]
    torch.testing.assert_close(acts["q_rot"], acts["q_pre"], rtol=0, atol=1e-6)


def test_variant_base_class_is_abstract(layer):
    with pytest.raises(NotImplementedError):
        RopeVariant().inv_freq(layer)


@pytest.mark.parametrize("family", ["llama", "gemma3"])
def test_is_identity_only_for_variants_that_change_nothing(tiny, family):
    """Exactly the variants whose logits equal the unmodified model's are identities."""
    from ropelens.run.intervene import is_identity

    model = tiny(family)
    spec = rope_spec(model)
    layers, n = list(range(spec.n_layers)), spec.n_ctx
    toks = torch.randint(0, 50, (1, 48), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        before = model(toks)
    for variant, expected in [
        (PRoPE(1.0), True),
        (DynamicNTK(4.0, n), True),
        (Default(), True),
        (PRoPE(0.5), False),
        (YaRN(4.0, n), False),
        (NoPE(), False),
    ]:
        assert is_identity(spec, variant, layers, 48) is expected, variant
        with torch.no_grad(), apply_rope_variant(model, variant):
            same = torch.equal(model(toks), before)
        assert same is expected, variant
    assert not is_identity(
        spec, DynamicNTK(4.0, n // 4), layers, n
    )  # past its original length it scales


def test_yarn_on_an_odd_frequency_width():
    """MiMo-V2-Flash's rotary frequencies follow base^(−2i/5) over 3 planes: YaRN keeps the fast
    plane and interpolates the slow ones, over every plane (HF's own ramp has d // 2 = 2 entries
    there)."""
    from ropelens.spec.rope import LayerRope
    from ropelens.spec.variants import YaRN, freq_dim

    base, d = 10000.0, 5
    theta = base ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)
    lr = LayerRope(
        layer=0,
        inv_freq=theta.float(),
        head_dim=8,
        rotary_dim=6,
        pairing="half",
        n_heads=2,
        n_kv_heads=2,
        score_scale=8**-0.5,
        base=base,
        n_ctx=16,
    )
    assert freq_dim(lr) == 5
    # YaRN's correction range at 16 tokens (β_fast 32, β_slow 1): planes below d·ln(16/2π)/(2·ln
    # base) ≈ 0.25 keep their frequency, the rest are interpolated by the factor
    got = YaRN(4.0, 16).inv_freq(lr).double()
    torch.testing.assert_close(
        got, torch.stack([theta[0], theta[1] / 4, theta[2] / 4]), rtol=1e-6, atol=0
    )
