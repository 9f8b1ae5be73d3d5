"""The band decomposition sums back to the model's own scores, on every tiny family."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import ropelens
from ropelens.analyses.attention_decomposition import (
    AttentionDecomposition,
    attention_decomposition,
    band_terms,
    js_divergence,
)
from ropelens.analyses.band_statistics import BandStatistics, band_statistics
from ropelens.spec.bands import Bands
from ropelens.spec.rope import LayerRope

# Sliding window of the tiny gemma3 is 8: 40 tokens are well past it.
SEQ = 40


def tokens(batch=2, seq=SEQ, seed=0):
    g = torch.Generator().manual_seed(seed)
    t = torch.randint(4, 101, (batch, seq), generator=g)
    t[:, 0] = 1
    return t


def reference_scores(model, toks, layer):
    """The model's pre-softmax scores, recomputed from HF internals where the bridge hook is
    wrong."""
    _, cache = model.run_with_cache(toks)
    if ropelens.rope_spec(model).architecture.startswith("GPTJ"):
        return None, cache[
            f"blocks.{layer}.attn.hook_pattern"
        ]  # GPT-J's hook_attn_scores holds the pattern
    return cache[f"blocks.{layer}.attn.hook_attn_scores"], cache[
        f"blocks.{layer}.attn.hook_pattern"
    ]


@pytest.mark.parametrize(
    "bands", [Bands.quantiles(2), Bands.planes(), Bands.by_context(), Bands.explicit({"a": [0]})]
)
def test_bands_sum_to_model_scores(tiny, rope_family, bands):
    model = tiny(rope_family)
    toks = tokens()
    dec = attention_decomposition(model, toks, bands=bands)
    for L in dec.layers:
        scores, pattern = reference_scores(model, toks, L)
        total = dec.band_logits(L, masked=False).sum(2)
        mask = dec.mask(L)[:, None].expand_as(total)
        if scores is not None:
            assert (total - scores)[mask].abs().max() <= 1e-4
            assert torch.equal(torch.isfinite(dec.logits(L)), mask)
        # softmax of the summed bands is the model's own pattern
        assert (torch.softmax(dec.logits(L), -1) - pattern).abs().max() <= 1e-5


def test_single_all_band_pattern_equals_hook_pattern(tiny):
    for fam in ("llama", "llama-gqa", "gemma3"):  # full rotary: "all" is the whole head
        model = tiny(fam)
        toks = tokens()
        dec = attention_decomposition(model, toks, bands=Bands.all())
        for L in dec.layers:
            _, pattern = reference_scores(model, toks, L)
            assert dec.band_names(L) == ["all"]
            assert (dec.band_patterns(L)[:, :, 0] - pattern).abs().max() <= 1e-6


def test_sliding_window_mask_matches_model(tiny):
    model = tiny("gemma3")
    spec = ropelens.rope_spec(model)
    toks = tokens(1)
    dec = attention_decomposition(model, toks)
    for L in dec.layers:
        _, pattern = reference_scores(model, toks, L)
        ok = spec.layers[L].mask(SEQ)
        assert torch.equal(pattern[0, 0] > 0, ok), f"layer {L} ({spec.layers[L].kind})"
    assert spec.layers[0].kind == "sliding" and not spec.layers[0].mask(SEQ)[20, 5]


def test_plane_terms_are_bounded_by_cauchy_schwarz(tiny):
    dec = attention_decomposition(tiny("llama-gqa"), tokens(1), layers=[1])
    terms, bound = dec.plane_logits(1), dec.cauchy_schwarz(1)
    assert (terms.abs() <= bound + 1e-6).all()
    assert terms.shape == bound.shape == (1, 4, 8, SEQ, SEQ)


def test_cauchy_schwarz_bound_is_attained_when_k_equals_q(tmp_path):
    """Tiny Llama with W_k = W_q (heads 0, 1) and W_k = −W_q (heads 2, 3): pre-RoPE k = ±q at
    every position, so at zero relative rotation (the diagonal) every plane term is ±‖q^(i)‖‖k^(i)‖
    exactly. An inflated or deflated bound fails; the bound's value is also recomputed by hand from
    the raw hook_q: ‖q^(i)‖² (pairs (i, i + 8)) times 1/√16."""
    from ropelens.testing import tiny_hf_model, tiny_tokenizer

    hf = tiny_hf_model("llama")
    sign = torch.tensor([1.0, 1.0, -1.0, -1.0]).repeat_interleave(16)[:, None]
    with torch.no_grad():
        for layer in hf.model.layers:
            layer.self_attn.k_proj.weight.copy_(layer.self_attn.q_proj.weight * sign)
    hf.save_pretrained(tmp_path)
    tiny_tokenizer().save_pretrained(tmp_path)
    model = ropelens.load_model(tmp_path, device="cpu")
    toks = tokens(1)
    dec = attention_decomposition(model, toks)
    _, cache = model.run_with_cache(toks)
    for L in dec.layers:
        terms, bound = dec.plane_logits(L), dec.cauchy_schwarz(L)  # [b, h, P, q, k]
        assert (terms.abs() <= bound * (1 + 1e-5) + 1e-7).all()
        diag_t, diag_b = (
            terms.diagonal(dim1=-2, dim2=-1),
            bound.diagonal(dim1=-2, dim2=-1),
        )  # [b, h, P, pos]
        torch.testing.assert_close(
            diag_t, diag_b * sign[::16, 0][None, :, None, None], rtol=1e-5, atol=1e-7
        )
        q = cache[f"blocks.{L}.attn.hook_q"][0]  # [pos, h, 16], pre-RoPE
        by_hand = (
            q[..., :8] ** 2 + q[..., 8:] ** 2
        ) / 4.0  # ‖q^(i)‖·‖k^(i)‖ = ‖q^(i)‖² when k = ±q
        torch.testing.assert_close(diag_b[0], by_hand.permute(1, 2, 0), rtol=1e-5, atol=1e-7)
        assert diag_b.min() > 0 and (terms.abs() < bound * 0.99).any()  # off-diagonal: not attained


def test_decomposition_from_text_and_save_load(tiny, tmp_path):
    model = tiny("llama")
    dec = attention_decomposition(
        model, "The quick brown fox jumps over the lazy dog.", bands=Bands.quantiles(2)
    )
    dec.save(tmp_path / "dec.safetensors")
    back = AttentionDecomposition.load(tmp_path / "dec.safetensors")
    assert back.layers == dec.layers and back.bands == dec.bands
    assert torch.equal(back.band_logits(0), dec.band_logits(0))
    df = dec.agreement(0)
    assert set(df.columns) >= {"head", "band", "jsd", "top1"} and len(df) == 4 * 2
    assert len(dec.figure(0, 1).data) == 3
    assert len(dec.to_frame(0, 0)) == 2 * dec.mask(0)[0].sum()


def test_decompose_rejects_bad_layers(tiny):
    with pytest.raises(ValueError, match="out of range"):
        attention_decomposition(tiny("llama"), tokens(1), layers=[5])
    dec = attention_decomposition(tiny("llama"), tokens(1), layers=[0])
    with pytest.raises(ValueError, match="not decomposed"):
        dec.band_logits(1)


# ----------------------------------------------------------------------------- properties
@settings(max_examples=40, deadline=None)
@given(
    n_planes=st.integers(1, 6),
    extra=st.integers(0, 3),
    kv=st.integers(1, 3),
    group=st.integers(1, 3),
    pairing=st.sampled_from(["half", "adjacent"]),
    n_bands=st.integers(1, 6),
    seq=st.integers(1, 9),
    seed=st.integers(0, 10_000),
)
def test_band_terms_sum_to_rotated_dot_products(
    n_planes, extra, kv, group, pairing, n_bands, seq, seed
):
    """For random shapes, GQA groupings, pairings and band layouts the bands add up exactly to
    (R_m q)·(R_n k) × scale, which equals qᵀR((n−m)θ)k (relative position only)."""
    g = torch.Generator().manual_seed(seed)
    head_dim = 2 * n_planes + 2 * extra
    lr = LayerRope(
        layer=0,
        inv_freq=torch.rand(n_planes, generator=g) * 1.5,
        head_dim=head_dim,
        rotary_dim=2 * n_planes,
        pairing=pairing,
        n_heads=kv * group,
        n_kv_heads=kv,
        score_scale=0.3,
    )
    q = torch.randn(1, seq, kv * group, head_dim, generator=g, dtype=torch.float64)
    k = torch.randn(1, seq, kv, head_dim, generator=g, dtype=torch.float64)
    pos = torch.arange(seq)
    qr = lr.rotate(q.transpose(1, 2), pos).transpose(1, 2)
    kr = lr.rotate(k.transpose(1, 2), pos).transpose(1, 2)
    bands = Bands.quantiles(min(n_bands, n_planes)).resolve(lr)
    x = band_terms(qr, kr, lr, bands)
    kx = k.repeat_interleave(group, dim=2)
    direct = torch.einsum("bqhd,bkhd->bhqk", qr, kr.repeat_interleave(group, dim=2)) * 0.3
    assert torch.allclose(x.sum(2), direct, atol=1e-10)
    # relative form: plane i's term = q^(i)ᵀ R((n−m)θ_i) k^(i) from unrotated vectors
    qp, kp = lr.split(q), lr.split(kx)  # [1,pos,h,P,2]
    d = (pos[None, :] - pos[:, None]).double()[..., None] * lr.inv_freq.double()  # [q,k,P]
    c, s = d.cos(), d.sin()
    rel = qp[0, :, None, :, :, 0] * (
        c[:, :, None] * kp[0, None, :, :, :, 0] - s[:, :, None] * kp[0, None, :, :, :, 1]
    ) + qp[0, :, None, :, :, 1] * (
        s[:, :, None] * kp[0, None, :, :, :, 0] + c[:, :, None] * kp[0, None, :, :, :, 1]
    )
    plane = band_terms(qr, kr, lr, Bands.planes().resolve(lr))[0, :, :n_planes]  # [h,P,q,k]
    assert torch.allclose(plane, rel.permute(2, 3, 0, 1) * 0.3, atol=1e-10)


def test_js_divergence_properties():
    p = torch.softmax(torch.randn(5, 7), -1)
    q = torch.softmax(torch.randn(5, 7), -1)
    j = js_divergence(p, q)
    assert torch.allclose(js_divergence(p, p), torch.zeros(5), atol=1e-7)
    assert (
        torch.allclose(j, js_divergence(q, p)) and (j <= torch.log(torch.tensor(2.0)) + 1e-6).all()
    )


def test_js_divergence_values():
    """Hand-computed values (natural log), including zero-probability entries."""
    ln = math.log
    # disjoint supports: exactly ln 2, the maximum
    assert js_divergence(
        torch.tensor([1.0, 0.0]), torch.tensor([0.0, 1.0])
    ).item() == pytest.approx(ln(2), rel=1e-6)
    # p = (1, 0), q = (½, ½): m = (¾, ¼); KL(p‖m) = ln(4/3), KL(q‖m) = ½ ln(2/3) + ½ ln 2 = ½
    # ln(4/3) JSD = ½ (ln(4/3) + ½ ln(4/3)) = ¾ ln(4/3)
    got = js_divergence(torch.tensor([1.0, 0.0]), torch.tensor([0.5, 0.5])).item()
    assert got == pytest.approx(0.75 * ln(4 / 3), rel=1e-6)
    # a general pair, written out term by term with numpy, along dim 0 of a [3, 2] batch
    p, q = np.array([0.2, 0.3, 0.5]), np.array([0.6, 0.3, 0.1])
    m = (p + q) / 2
    want = 0.5 * np.sum(p * np.log(p / m)) + 0.5 * np.sum(q * np.log(q / m))
    batch_p, batch_q = torch.tensor(np.stack([p, q], 1)), torch.tensor(np.stack([q, q], 1))
    got = js_divergence(batch_p, batch_q, dim=0)
    assert got.tolist() == pytest.approx([want, 0.0], rel=1e-9, abs=1e-12)
    # by hand: m = (.4, .3, .3); KL(p‖m) = .2 ln .5 + .5 ln(5/3) = 0.11678, KL(q‖m) = .6 ln 1.5 + .1
    # ln(1/3) = 0.13342
    assert want == pytest.approx(0.12510, abs=1e-5)


# ----------------------------------------------------------------------------- corpus statistics
def test_band_statistics_shares_and_merge(tiny, tmp_path):
    model = tiny("gemma3")
    toks = tokens(4, seed=3)
    full = band_statistics(
        model, toks, bands=Bands.quantiles(2), progress=False, batch_size=3, jsd=True
    )
    a = band_statistics(model, toks[:2], bands=Bands.quantiles(2), progress=False, jsd=True)
    b = band_statistics(model, toks[2:], bands=Bands.quantiles(2), progress=False, jsd=True)
    merged = a.merge(b)
    for k in full.sums:
        # sums merge exactly (float64); per-batch float32 BLAS blocking differs at ~1e-8
        assert torch.allclose(merged.sums[k], full.sums[k], rtol=1e-6, atol=1e-6), k
    for share in (full.abs_share(), full.var_share(), full.margin_share()):
        assert torch.allclose(share.sum(-1), torch.ones(()), atol=1e-4)
    assert ((full.top1() >= 0) & (full.top1() <= 1)).all()
    assert (full.tightness().abs() <= 1 + 1e-6).all()
    full.save(tmp_path / "s.json")
    back = BandStatistics.load(tmp_path / "s.json")
    assert back.to_frame().equals(full.to_frame())
    assert len(full.figure().data) == 3 and len(full.figure(layer=3).data) == 3


@pytest.mark.parametrize("family", ["llama-gqa", "gemma3"])  # gemma3: sliding window 8 < 24 tokens
def test_band_statistics_match_direct_computation(tiny, family):
    """Streamed shares equal the same quantities computed from the kept decomposition."""
    model = tiny(family)
    toks = tokens(2, seq=24)
    st_ = band_statistics(model, toks, bands=Bands.quantiles(2), progress=False)
    dec = attention_decomposition(model, toks, bands=Bands.quantiles(2))
    for i, L in enumerate(st_.layers):
        x = dec.band_logits(L, masked=False)  # [b,h,B,q,k]
        m = dec.mask(L)[:, None, None]
        abs_sum = (x.abs() * m).sum((0, 3, 4))
        assert torch.allclose(st_.sums["abs_sum"][i].float(), abs_sum, rtol=1e-5)
        att = dec.pattern(L).argmax(-1)  # [b,h,q]
        xa = x.gather(-1, att[:, :, None, :, None].expand(-1, -1, x.shape[2], -1, 1))[..., 0]
        n = m[:, :, :, :, :].sum(-1).float()  # [b,1,1,q]
        others = ((x * m).sum(-1) - xa) / (n - 1).clamp_min(1)
        ok = n >= 2
        margin = ((xa - others) * ok).sum((0, 3)) / ok.sum((0, 3))
        assert torch.allclose(st_.margin()[i], margin, rtol=1e-4, atol=1e-6)
        top1 = (
            (torch.softmax(dec.band_logits(L), -1).argmax(-1) == att[:, :, None])
            .float()
            .mean((0, 3))
        )
        assert torch.allclose(st_.top1()[i], top1, atol=1e-6)
        # within-query covariance of each band with the full logit, centred over allowed keys
        tot = (x * m).sum(2, keepdim=True)
        xc = (x - (x * m).sum(-1, keepdim=True) / n[..., None]) * m
        tc = (tot - (tot * m).sum(-1, keepdim=True) / n[..., None]) * m
        cov = ((xc * tc).sum(-1) * ok).sum((0, 3))
        assert torch.allclose(st_.sums["cov"][i].float(), cov, rtol=1e-4, atol=1e-5)


def test_statistics_invariant_to_batch_size_and_padding(tiny):
    model = tiny("llama")
    toks = tokens(3, seq=20)
    one = band_statistics(model, toks, progress=False, batch_size=1)
    three = band_statistics(model, toks, progress=False, batch_size=3)
    for k in one.sums:
        assert torch.allclose(one.sums[k], three.sums[k], rtol=1e-5, atol=1e-6), k


def test_statistics_without_agreement_skip_top1_but_keep_shares(tiny):
    model = tiny("llama")
    toks = tokens(2, seq=20)
    lean = band_statistics(model, toks, progress=False, agreement=False)
    full = band_statistics(model, toks, progress=False)
    for k in ("abs_sum", "cov", "margin", "var", "cs_term", "cs_bound"):
        assert torch.allclose(lean.sums[k], full.sums[k]), k
    assert "top1" not in lean.to_frame().columns
    with pytest.raises(ValueError, match="agreement=True"):
        lean.top1()
    with pytest.raises(ValueError, match="jsd=True"):
        full.jsd()


@pytest.mark.parametrize("bridge", [True, False])
def test_an_empty_text_without_a_bos_token_is_one_input_error(bridge):
    """A tokenizer that adds no BOS token (Qwen2's) gives an empty text no tokens at all: one
    InputError saying so, not a failure deep in the reading; an empty list or a tensor without
    positions too."""
    from ropelens.loading.models import wrap_hf_model
    from ropelens.testing import tiny_hf_model, tiny_tokenizer

    tokenizer = tiny_tokenizer()
    tokenizer.bos_token = None
    model = wrap_hf_model(
        tiny_hf_model("llama"), tokenizer, device="cpu", label="no-bos", bridge=bridge
    )
    # ropelens's own BOS policy (not TransformerLens's, which puts a token of its own first where
    # the tokenizer has no BOS): an empty text is refused on both paths
    with pytest.raises(ropelens.InputError, match="text is empty: pass some text"):
        attention_decomposition(model, "")
    with pytest.raises(ropelens.InputError, match="no texts to decompose"):
        attention_decomposition(model, [])
    with pytest.raises(ropelens.InputError, match=r"tokens of shape \[2, 0\]"):
        attention_decomposition(model, torch.zeros(2, 0, dtype=torch.long))
