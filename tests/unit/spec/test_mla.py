"""Multi-head latent attention (DeepSeek V2/V3, MiniCPM3, GLM-4.7-Flash) read exactly.

Each MLA head is ``[no-position dims, rotary dims]`` with one rotary key shared by every head;
ropelens captures heads with the rotary dims first (the same permutation of q's and k's dims, so
every q·k is unchanged). The references are HF's own: its rotary and attention modules, its rotation
functions, its eager attention (through ``check_family``).
"""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

import ropelens
from ropelens.backends.hf import is_plain
from ropelens.errors import UnsupportedModelError
from ropelens.loading.models import wrap_hf_model
from ropelens.run.verify import verify_model
from ropelens.spec.reading import rope_spec
from ropelens.testing import tiny_tokenizer
from ropelens.testing.families import FAMILIES, N_CHECK
from tests.harness.families import check_family

MLA = ["deepseek_v3", "deepseek_v2", "glm4_moe_lite", "minicpm3"]


def _tokens(seed: int = 3) -> torch.Tensor:
    toks = torch.randint(4, 100, (2, N_CHECK), generator=torch.Generator().manual_seed(seed))
    toks[:, 0] = 1
    return toks


@pytest.mark.parametrize("family", MLA)
def test_mla_family_is_exact(family, family_dir):
    model = ropelens.load_model(family_dir(family), device="cpu")
    assert is_plain(model)  # the MLA bridge hooks no pre-RoPE q/k: measured on the plain HF model
    spec = rope_spec(model)
    cfg = FAMILIES[family].config
    for lr in spec.layers:
        assert (lr.head_dim, lr.rotary_dim, lr.rotary_offset) == (
            cfg["qk_nope_head_dim"] + cfg["qk_rope_head_dim"],
            cfg["qk_rope_head_dim"],
            cfg["qk_nope_head_dim"],
        )
        assert lr.shared_rotary_key and lr.n_kv_heads == lr.n_heads
    v = verify_model(model, spec)
    assert v.passed and max(v.errors[k] for k in ("rotation", "qk", "scores", "probs")) < 1e-5, (
        v.errors
    )


@pytest.mark.parametrize("interleave", [True, False])
def test_deepseek_v3_rotation_layouts(interleave, monkeypatch):
    """rope_interleave on (adjacent pairs read, halves written) and off (halves both ways): both
    exact."""
    fam = FAMILIES["deepseek_v3"]
    name = f"deepseek_v3_interleave_{interleave}"
    monkeypatch.setitem(
        FAMILIES,
        name,
        dataclasses.replace(fam, name=name, config={**fam.config, "rope_interleave": interleave}),
    )
    r = check_family(name)
    # float32 throughout: sums of a few dozen products, errors a few ulps (~1e-7) against 1e-4
    assert r.exact, (r.refusal, r.spec_errors, r.pairing_err, r.scores_err, r.pattern_err)


def test_layout_against_hf_rotations():
    """The spec's rotation of ropelens's pre-RoPE layout is HF's own rotation of the model's
    slice."""
    from transformers.models.deepseek_v2 import modeling_deepseek_v2 as v2
    from transformers.models.deepseek_v3 import modeling_deepseek_v3 as v3

    from ropelens.spec.rope import LayerRope

    g = torch.Generator().manual_seed(0)
    n, r = 6, 8
    inv = 1.0 / 10000 ** (torch.arange(0, r, 2).float() / r)
    q, k = torch.randn(1, 3, n, r, generator=g), torch.randn(1, 1, n, r, generator=g)
    pos = torch.arange(n)
    freqs = pos[:, None].float() * inv
    emb = torch.cat([freqs, freqs], -1)[None]
    cases = {
        "interleave": (
            v3.apply_rotary_pos_emb_interleave(q, k, emb.cos(), emb.sin()),
            "half",
            True,
        ),
        "halves": (v3.apply_rotary_pos_emb(q, k, emb.cos(), emb.sin()), "half", False),
        "complex": (
            v2.apply_rotary_emb(q, k, torch.polar(torch.ones_like(freqs), freqs)[None]),
            "adjacent",
            False,
        ),
    }
    for what, ((q_out, k_out), pairing, interleaved) in cases.items():
        lr = LayerRope(
            layer=0,
            inv_freq=inv,
            head_dim=r,
            rotary_dim=r,
            pairing=pairing,
            n_heads=3,
            n_kv_heads=1,
            score_scale=1.0,
            pre_interleaved=interleaved,
            shared_rotary_key=True,
        )
        for x, out in ((q, q_out), (k, k_out)):
            # float32 rotations of O(1) values: a few ulps; a wrong layout is O(1) off
            assert torch.allclose(lr.rotate(lr.pre_from_model(x), pos), out, atol=1e-5), what
        if interleaved:  # without the de-interleave the same spec is far off: the check has teeth
            assert (lr.rotate(q, pos) - q_out).abs().max() > 0.1


def test_from_model_puts_rotary_dims_first_and_keeps_scores():
    from ropelens.spec.rope import LayerRope

    lr = LayerRope(
        layer=0,
        inv_freq=torch.ones(2),
        head_dim=7,
        rotary_dim=4,
        pairing="half",
        n_heads=1,
        n_kv_heads=1,
        score_scale=1.0,
        rotary_offset=3,
    )
    x = torch.arange(7.0)
    assert lr.from_model(x).tolist() == [3, 4, 5, 6, 0, 1, 2]
    a, b = torch.randn(2, 7, generator=torch.Generator().manual_seed(1))
    assert torch.allclose(
        lr.from_model(a) @ lr.from_model(b), a @ b
    )  # a permutation of q's and k's dims alike


def test_shared_rotary_key_has_equal_plane_norms_across_heads(family_dir):
    """k_pe is one vector for every head: usage's key norm of each plane is the same in every head;
    the no-position dims are per head, so the whole key is not."""
    model = ropelens.load_model(family_dir("deepseek_v3"), device="cpu")
    usage = ropelens.analyses.frequency_usage(model, _tokens(), progress=False)
    k = usage.k_norm  # [layer, head, plane]
    assert k.shape[1] == 4 and (k > 0).all()
    # the same float32 vector copied into every head: equal to rounding of the mean (a few ulps)
    assert torch.allclose(k, k[:, :1].expand_as(k), rtol=1e-5)
    acts = ropelens.capture_qk(model, _tokens(), which=("k_post",))
    rest = acts[0]["k_post"][..., 8:]  # the no-position dims differ between heads
    assert (rest[:, :, 0] - rest[:, :, 1]).abs().max() > 1e-2


def test_decomposition_sums_to_hf_scores_with_a_no_position_term(family_dir):
    """The rotary planes (band "all") and the no-position term (band "rest") are HF's own q·k over
    the config's rotary dims (the last qk_rope_head_dim of each head) and no-position dims (the
    first qk_nope_head_dim)."""
    import importlib

    from transformers import AutoModelForCausalLM

    path = family_dir("glm4_moe_lite")
    cfg = FAMILIES["glm4_moe_lite"].config
    nope = cfg["qk_nope_head_dim"]
    model = ropelens.load_model(path, device="cpu")
    toks = _tokens()[:1]
    dec = ropelens.analyses.attention_decomposition(model, toks, bands=ropelens.Bands.all())
    hf = AutoModelForCausalLM.from_pretrained(path, attn_implementation="eager").eval()
    mod = importlib.import_module(type(hf).__module__)
    orig, seen = mod.eager_attention_forward, {}

    def keep(module, query, key, value, mask, *args, **kwargs):
        seen[module.layer_idx] = (query.double(), key.double(), kwargs["scaling"])
        return orig(module, query, key, value, mask, *args, **kwargs)

    mod.eager_attention_forward = keep
    try:
        with torch.no_grad():
            probs = hf(toks, output_attentions=True).attentions
    finally:
        mod.eager_attention_forward = orig
    for L in rope_spec(model).rotary_layers:
        q, k, scale = seen[L]
        planes = (q[..., nope:] @ k[..., nope:].transpose(-1, -2) * scale)[0]
        rest = (q[..., :nope] @ k[..., :nope].transpose(-1, -2) * scale)[0]
        assert dec.band_names(L) == ["all", "rest"]
        bands = dec.band_logits(L)[0]  # [head, band, q, k]
        ok = torch.isfinite(bands[:, 0])
        assert (
            rest.abs().max() > 0.1 and planes.abs().max() > 0.1
        )  # both parts matter in this model
        # float32 sums of 4 and 12 products against float64 ones: ~1e-6 of O(10) logits
        for b, ref in enumerate((planes, rest)):
            assert torch.allclose(bands[:, b][ok].double(), ref[ok], atol=1e-5), (L, b)
        assert (
            dec.rebuilt_pattern(L) - probs[L]
        ).abs().max() < 1e-5  # float32 softmax of the same scores


def _real_v3(interleave: bool = True):
    """DeepSeek V3's real attention shapes (DeepseekV3Config defaults: 128 heads, 128 + 64 dims) and
    the checkpoint's YaRN, in one layer with a narrow residual stream."""
    from transformers import AutoModelForCausalLM, DeepseekV3Config

    d = DeepseekV3Config()
    assert (d.num_attention_heads, d.qk_rope_head_dim, d.qk_nope_head_dim) == (128, 64, 128)
    yarn = {
        "rope_type": "yarn",
        "factor": 40.0,
        "mscale": 1.0,
        "mscale_all_dim": 1.0,
        "original_max_position_embeddings": 4096,
        "rope_theta": 10000.0,
        "beta_fast": 32,
        "beta_slow": 1,
    }
    cfg = DeepseekV3Config(
        vocab_size=101,
        hidden_size=64,
        intermediate_size=64,
        moe_intermediate_size=16,
        num_hidden_layers=1,
        first_k_dense_replace=1,
        n_routed_experts=4,
        num_experts_per_tok=2,
        n_group=1,
        topk_group=1,
        q_lora_rank=32,
        kv_lora_rank=32,
        v_head_dim=8,
        rope_interleave=interleave,
        rope_scaling=yarn,
        max_position_embeddings=163840,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=3,
    )
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(cfg, attn_implementation="eager").eval()


def test_real_deepseek_v3_shapes_and_yarn_scale():
    hf = _real_v3()
    model = wrap_hf_model(hf, tiny_tokenizer(), device="cpu", label="dsv3")
    lr = rope_spec(model)[0]
    attn = hf.model.layers[0].self_attn
    rot = hf.model.rotary_emb
    assert (lr.n_heads, lr.head_dim, lr.rotary_dim, lr.rotary_offset) == (128, 192, 64, 128)
    assert (
        lr.pairing == "half"
        and lr.pre_interleaved
        and lr.shared_rotary_key
        and lr.rope_type == "yarn"
    )
    assert torch.equal(lr.inv_freq, rot.inv_freq.float())
    assert lr.attention_scaling == pytest.approx(float(rot.attention_scaling), rel=1e-12)
    assert lr.score_scale == pytest.approx(float(attn.scaling), rel=1e-12)
    # independently: qk_head_dim^-½ times YaRN's mscale² with mscale_all_dim 1, factor 40
    mscale = 0.1 * 1.0 * math.log(40.0) + 1.0
    assert lr.score_scale == pytest.approx(192**-0.5 * mscale**2, rel=1e-6)
    assert (
        lr.score_scale > 1.3 * 192**-0.5
    )  # the mscale² is no rounding: it changes the score by 37%
    assert verify_model(model).passed


def test_wrong_layout_readings_fail_the_probe(family_dir):
    """A spec without the de-interleave, or with the rotary dims read in place (offset 0), is
    refused by the probe."""
    model = ropelens.load_model(family_dir("deepseek_v3"), device="cpu")
    spec = rope_spec(model)
    for change, check in (({"pre_interleaved": False}, "rotation"), ({"rotary_offset": 0}, "qk")):
        wrong = dataclasses.replace(
            spec, layers=tuple(dataclasses.replace(lr, **change) for lr in spec.layers)
        )
        with pytest.raises(UnsupportedModelError, match=f"fails the {check} check"):
            verify_model(model, wrong)


def test_mla_bridge_is_refused_in_one_line(family_dir):
    """A bridge booted around an MLA model (not by ropelens) is refused: its hooks give no pre-RoPE
    q/k."""
    from types import SimpleNamespace

    from ropelens.spec.reading import _refuse_unsupported

    model = ropelens.load_model(family_dir("minicpm3"), device="cpu")
    bridge = SimpleNamespace(original_model=model.original_model, blocks=[], cfg=model.cfg)
    with pytest.raises(UnsupportedModelError, match="plain HF model"):
        _refuse_unsupported(bridge, model.original_model.config, "MiniCPM3ForCausalLM")


def test_summary_shows_where_the_planes_sit(family_dir):
    spec = rope_spec(ropelens.load_model(family_dir("glm4_moe_lite"), device="cpu"))
    row = spec.summary().iloc[0]
    assert (row["rotary_offset"], row["shared_rotary_key"], row["rotary_dim"], row["head_dim"]) == (
        12,
        True,
        4,
        16,
    )
    again = type(spec).from_dict(
        spec.to_dict()
    )  # the MLA fields round-trip through the spec's JSON
    assert again.to_json() == spec.to_json() and again.layers[0].rotary_offset == 12


def test_qk_capture_runs_sdpa_not_eager(family_dir, monkeypatch):
    """q/k alone never build eager attention's [heads, n, n] matrices: the family's sdpa runs, and
    its q/k equal the ones eager attention receives (captured with the pattern)."""
    import importlib

    model = ropelens.load_model(family_dir("deepseek_v3"), device="cpu")
    toks = _tokens()
    with_pattern = ropelens.capture_qk(
        model, toks, which=("q_pre", "k_pre", "q_post", "k_post", "pattern")
    )
    mod = importlib.import_module(type(model.original_model).__module__)

    def refuse(*_a, **_k):
        raise AssertionError("eager attention ran for a q/k-only capture")

    monkeypatch.setattr(mod, "eager_attention_forward", refuse)
    alone = ropelens.capture_qk(model, toks, which=("q_pre", "k_pre", "q_post", "k_post"))
    for L, acts in alone.items():
        for name, t in acts.tensors.items():
            # the same projections and rotation in float32 before either attention: equal to
            # rounding
            assert torch.allclose(t, with_pattern[L][name], atol=1e-6), (L, name)
