"""The rotation behind the plane terms: pre-RoPE q and k recovered from the post-RoPE ones match the
captured pre-RoPE vectors, and the drawn vectors, angles and terms are the decomposition's own.

Families: the tiny bridges (MHA, GQA, Gemma 3's windows and query scalar, GPT-J's adjacent pairs
and partial rotary) and HF directories of DeepSeek V3 (latent attention, interleaved rotation),
gpt-oss (YaRN's attention scaling, sinks) and HunYuan (q and k normalised after the rotation).
"""

from __future__ import annotations

import math

import pytest
import torch

import ropelens
from ropelens.analyses.attention_decomposition import attention_decomposition
from ropelens.errors import InputError
from ropelens.run.capture import capture_qk
from ropelens.spec.bands import Bands
from ropelens.spec.rope import expand_kv

SEQ = 20
BANDS = Bands.quantiles(2)
TINY = ("llama", "llama-gqa", "gemma3", "gptj")
FAMILY_DIRS = ("deepseek_v3", "gpt_oss")


def tokens(seq: int = SEQ) -> torch.Tensor:
    toks = torch.randint(4, 101, (1, seq), generator=torch.Generator().manual_seed(0))
    toks[:, 0] = 1
    return toks


@pytest.fixture(scope="module")
def decomposed(tiny, family_dir):
    """``decomposed(family)``: (model, decomposition of every layer in quantile bands)."""
    cache = {}

    def make(family: str):
        if family not in cache:
            model = (
                tiny(family)
                if family in TINY
                else ropelens.load_model(family_dir(family), device="cpu")
            )
            cache[family] = model, attention_decomposition(model, tokens(), bands=BANDS)
        return cache[family]

    return make


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b.double()).abs().max() / b.double().abs().max())


@pytest.mark.parametrize("family", TINY + FAMILY_DIRS)
def test_pre_rope_recovered_from_post_rope_matches_the_captured_pre_rope(decomposed, family):
    model, dec = decomposed(family)
    captured = capture_qk(model, tokens(), layers=dec.layers, which=("q_pre", "k_pre"))
    for layer in dec.layers:
        q_pre, k_pre = dec.pre_rope(layer)
        assert q_pre.shape == captured[layer]["q_pre"].shape
        assert rel_err(q_pre, captured[layer]["q_pre"]) < 1e-5, f"layer {layer} q"
        assert rel_err(k_pre, captured[layer]["k_pre"]) < 1e-5, f"layer {layer} k"
    if family == "gpt_oss":  # the attention scaling was divided out, not left in
        assert dec.spec.layers[dec.layers[0]].attention_scaling > 1.1


@pytest.mark.parametrize("family", TINY + FAMILY_DIRS)
def test_rotation_terms_are_the_plane_logits_and_the_geometry_of_the_vectors(decomposed, family):
    _, dec = decomposed(family)
    for layer in dec.layers:
        rope = dec.spec.layers[layer]
        head = rope.n_heads - 1  # the last head: under GQA it reads the last KV head
        rot = dec.rotation(layer, head)
        plane_logits = dec.plane_logits(layer)[0, head]
        q_rows = rot[rot.role == "q"].set_index("plane")
        (query,) = set(q_rows.position)
        assert query == SEQ - 1  # the last token by default
        for r in rot[rot.role == "k"].itertuples():
            q = q_rows.loc[r.plane]
            assert dec.mask(layer)[0, query, r.position]
            # the plane's term, as the decomposition gives it
            assert r.term == pytest.approx(
                float(plane_logits[r.plane, query, r.position]), rel=1e-5, abs=1e-7
            )
            # and as |q||k|cos(angle) × scale, from the drawn coordinates and angle
            norms = math.hypot(q.x, q.y) * math.hypot(r.x, r.y)
            expect = norms * math.cos(math.radians(r.angle)) * rope.score_scale
            assert r.term == pytest.approx(expect, rel=1e-6, abs=1e-9)
        for r in rot.itertuples():
            # the post-RoPE vector is the pre-RoPE one turned by position·θ (and scaled)
            turned = math.atan2(r.pre_y, r.pre_x) + r.turn - math.atan2(r.y, r.x)
            assert abs(math.remainder(turned, 2 * math.pi)) < 1e-4, r
            assert math.hypot(r.x, r.y) == pytest.approx(
                rope.attention_scaling * math.hypot(r.pre_x, r.pre_y), rel=1e-5, abs=1e-7
            )
            assert r.turn == pytest.approx(
                r.position * float(rope.inv_freq[r.plane]) * rope.direction, rel=1e-12
            )


def test_rotation_draws_the_captured_post_rope_vectors_of_the_chosen_tokens(decomposed):
    _, dec = decomposed("llama-gqa")
    layer, head, query, keys = 1, 3, 12, [12, 4, 0]
    rot = dec.rotation(layer, head, query=query, keys=keys, planes=[5, 1])
    a, rope = dec.acts[layer], dec.spec.layers[layer]
    q = rope.split(a["q_post"][0, query, head])  # [planes, 2]
    k = rope.split(expand_kv(a["k_post"], rope)[0, :, head])  # [pos, planes, 2]
    assert list(dict.fromkeys(rot.plane)) == [5, 1]
    for r in rot.itertuples():
        want = q[r.plane] if r.role == "q" else k[r.position, r.plane]
        assert (r.x, r.y) == pytest.approx(tuple(want.double().tolist()), rel=1e-6)
    assert list(rot[rot.role == "k"].position) == keys * 2


def test_default_panels_are_each_bands_fastest_and_slowest_plane(decomposed):
    _, dec = decomposed("llama")
    layer = 1
    rb = dec.resolved(layer)
    freq = dec.spec.layers[layer].inv_freq
    expect = []
    for name, planes in zip(rb.names, rb.planes, strict=True):
        if planes:
            by_freq = sorted(planes, key=lambda p: -float(freq[p]))
            expect += [(f"{name}: fastest", by_freq[0]), (f"{name}: slowest", by_freq[-1])]
    rot = dec.rotation(layer)
    assert list(dict.fromkeys(zip(rot.panel, rot.plane))) == expect
    assert rot.groupby("panel").size().nunique() == 1  # one q and the same keys in each panel


def test_rotation_of_one_plane_bands_has_a_panel_per_band(tiny):
    dec = attention_decomposition(tiny("llama"), tokens(), bands=Bands.planes(), layers=[0])
    rot = dec.rotation(0, keys=[3])
    assert list(dict.fromkeys(rot.panel)) == dec.band_names(0)[: dec.spec.layers[0].n_planes]


def test_keys_the_query_does_not_see_are_refused(decomposed):
    _, gemma = decomposed("gemma3")  # sliding window 8 in layers 0-2
    with pytest.raises(InputError, match="sees"):
        gemma.rotation(0, query=15, keys=[2])
    assert not gemma.rotation(3, query=15, keys=[2]).empty  # the global layer sees it
    _, dec = decomposed("llama")
    with pytest.raises(InputError, match="sees"):
        dec.rotation(0, query=5, keys=[6])
    with pytest.raises(InputError, match="query"):
        dec.rotation(0, query=SEQ)
    with pytest.raises(InputError, match="head"):
        dec.rotation(0, 99)
    with pytest.raises(InputError, match="planes"):
        dec.rotation(0, planes=[99])
    with pytest.raises(InputError, match="not decomposed"):
        dec.rotation(7)


def test_a_layer_normalised_after_the_rotation_draws_no_pre_rope_vector(family_dir):
    model = ropelens.load_model(family_dir("hunyuan_v1_dense"), device="cpu")
    dec = attention_decomposition(model, tokens(), bands=BANDS, layers=[0])
    assert dec.spec.layers[0].norm_after_rope
    with pytest.raises(InputError, match="normalises q and k after"):
        dec.pre_rope(0)
    rot = dec.rotation(0)
    assert rot.pre_x.isna().all() and rot.pre_y.isna().all()
    k = rot[rot.role == "k"].iloc[0]
    assert k.term == pytest.approx(
        float(dec.plane_logits(0)[0, 0, k.plane, SEQ - 1, k.position]), rel=1e-5, abs=1e-7
    )
    assert len(dec.rotation_figure(0).data) > 0  # drawn without the faint pre-RoPE paths
