"""Multimodal RoPE: the per-axis decomposition of image-and-text attention, checked against HF's
eager attention.

Tiny random Qwen2-VL, Qwen2.5-VL, Qwen3-VL and Qwen 3.5 models keep their family's real rotary shape
(64 planes in [16, 24, 24] contiguous sections, [24, 20, 20] interleaved; Qwen 3.5's 32 planes of a
256-dim head in [11, 11, 10] interleaved) and run on random pixel input with a few image tokens
among text. The reference is HF itself: the scores inside its ``eager_attention_forward``, its
attention probabilities, its rotary's cos/sin and its ``get_rope_index``. All float32: values are
O(10) and sums run over ≤ 128 dims, so agreement is ~1e-6 relative and 1e-5 leaves room; a wrong
axis at image tokens is off by O(1e-2) or more.
"""

from __future__ import annotations

import functools
import importlib

import pytest
import torch

from ropelens import Bands
from ropelens.analyses.attention_decomposition import attention_decomposition
from ropelens.analyses.mrope_decomposition import MRopeDecomposition, mrope_decomposition
from ropelens.errors import InputError, UnsupportedModelError
from ropelens.loading.vision_language import (
    as_plain_vl,
    capture_mrope,
    modality,
    mrope_angles,
    rotate_mrope,
)
from ropelens.results.result import load_result
from ropelens.spec.reading import rope_spec
from ropelens.spec.rope import LayerRope
from ropelens.testing.vl import VL_FAMILIES, expected_axes, vl_hf_model, vl_inputs
from tests.harness.families import hf_scores, probs_by_layer

GRIDS = ((1, 4, 6), (1, 2, 4))  # two images: 2×3 and 1×2 merged tokens, h ≠ w for most of them
TOL = 1e-5


@functools.cache
def _model(name: str):
    return vl_hf_model(name)


@functools.cache
def _decomposed(name: str) -> MRopeDecomposition:
    return mrope_decomposition(_model(name), **vl_inputs(_model(name), GRIDS))


def _hf_run(name: str):
    m = _model(name)
    inp = vl_inputs(m, GRIDS)
    with torch.no_grad(), hf_scores(m) as scores:
        out = m(
            **inp, mm_token_type_ids=modality(m, inp["input_ids"]).int(), output_attentions=True
        )
    return inp, scores, out.attentions


@pytest.mark.parametrize("name", list(VL_FAMILIES))
def test_axes_read_from_the_model_are_the_published_sections(name):
    spec = _decomposed(name).spec
    for L in spec.rotary_layers:
        assert spec[L].axes == expected_axes(name), L
    if name == "qwen2_vl":
        assert spec.summary().mrope_axes[0] == "t 0-15; h 16-39; w 40-63"


@pytest.mark.parametrize(
    "config",
    ["Qwen2VLTextConfig", "Qwen2_5_VLTextConfig", "Qwen3VLTextConfig", "Qwen3_5TextConfig"],
)
def test_documented_labelling_matches_hf_rotary_at_real_sizes(config):
    """The published defaults (64 planes; Qwen 3.5: 32 of a 256-dim head) under the documented rule
    reproduce HF's own rotary's cos/sin at random 3-D positions; the h and w sections swapped do
    not."""
    import transformers

    cfg = getattr(transformers, config)()
    mod = importlib.import_module(
        transformers.__dict__[config].__module__.replace("configuration", "modeling")
    )
    rot = next(
        getattr(mod, n) for n in dir(mod) if n.endswith("RotaryEmbedding") and "Vision" not in n
    )(cfg)
    name = {
        "Qwen2VLTextConfig": "qwen2_vl",
        "Qwen2_5_VLTextConfig": "qwen2_5_vl",
        "Qwen3VLTextConfig": "qwen3_vl",
        "Qwen3_5TextConfig": "qwen3_5",
    }[config]
    axes = expected_axes(name)
    n = rot.inv_freq.numel()
    assert len(axes) == n == {"qwen3_5": 32}.get(name, 64)
    pos = torch.randint(0, 5000, (3, 2, 7), generator=torch.Generator().manual_seed(0))
    cos, sin = rot(torch.zeros(1), pos)
    swapped = tuple({1: 2, 2: 1}.get(a, a) for a in axes)
    for labels, close in ((axes, True), (swapped, False)):
        lr = LayerRope(
            layer=0,
            inv_freq=rot.inv_freq.float(),
            head_dim=2 * n,
            rotary_dim=2 * n,
            pairing="half",
            n_heads=1,
            n_kv_heads=1,
            score_scale=1.0,
            axes=labels,
        )
        ang = mrope_angles(lr, pos)
        err = max(
            float((ang.cos() - cos[..., :n].double()).abs().max()),
            float((ang.sin() - sin[..., :n].double()).abs().max()),
        )
        # float32 cos/sin of angles up to 5000 rad: ~5000·6e-8 = 3e-4 from the angle's rounding
        assert (err < 2e-3) == close, (labels == axes, err)


@pytest.mark.parametrize("name", list(VL_FAMILIES))
def test_axis_terms_sum_to_hf_scores_and_rebuild_its_pattern(name):
    dec = _decomposed(name)
    inp, scores, attentions = _hf_run(name)
    probs = probs_by_layer(attentions, dec.spec)
    for L in dec.layers:
        ours, ref = dec.logits(L), scores[L]
        ok = torch.isfinite(ours)
        assert float((ours[ok] - ref[ok]).abs().max() / ref[ok].abs().max()) < TOL
        names, cut = dec.axis_band_logits(L, Bands.quantiles(4))
        by_band = cut.sum(2)
        assert float((by_band[ok] - ref[ok]).abs().max() / ref[ok].abs().max()) < TOL
        assert float((dec.rebuilt_pattern(L) - probs[L]).abs().max()) < TOL
        # far from uniform: the check above would pass on flat patterns too easily
        assert float(probs[L][0, :, -1].max()) > 3.0 / probs[L].shape[-1]
    assert torch.equal(dec.tokens, inp["input_ids"])


@pytest.mark.parametrize("name", ["qwen2_vl", "qwen3_vl"])
def test_position_ids_are_the_ones_the_model_builds(name):
    dec, m = _decomposed(name), _model(name)
    inp = vl_inputs(m, GRIDS)
    ref, _ = m.model.get_rope_index(
        inp["input_ids"],
        mm_token_type_ids=modality(m, inp["input_ids"]).int(),
        image_grid_thw=inp["image_grid_thw"],
    )
    assert torch.equal(dec.position_ids, ref)
    vision = dec.modality[0] != 0
    assert (
        int(vision.sum()) == 8
        and (dec.position_ids[1, 0, vision] != dec.position_ids[2, 0, vision]).any()
    )


@pytest.mark.parametrize("name", list(VL_FAMILIES))
def test_rotation_of_pre_rope_q_k_rebuilds_hf_scores_only_with_the_right_axes(name):
    """Scores made from the pre-RoPE q and k rotated by the spec's 3-D rotation equal HF's; with the
    h and w planes swapped they do not (a wrong plane-to-axis assignment is caught)."""
    m = _model(name)
    model = as_plain_vl(m)
    spec = rope_spec(model)
    inp = vl_inputs(m, GRIDS)
    cap = capture_mrope(
        model,
        spec,
        inp["input_ids"],
        spec.rotary_layers,
        verify=False,
        pixel_values=inp["pixel_values"],
        image_grid_thw=inp["image_grid_thw"],
    )
    _, scores, _ = _hf_run(name)
    for L in spec.rotary_layers:
        lr, t = spec[L], cap.tensors[L]
        swapped = LayerRope(
            **{**lr.__dict__, "axes": tuple({1: 2, 2: 1}.get(a, a) for a in lr.axes)}
        )
        for rope, right in ((lr, True), (swapped, False)):
            q = rotate_mrope(rope, t["q_pre"].double(), cap.position_ids)
            k = rotate_mrope(rope, t["k_pre"].double(), cap.position_ids).repeat_interleave(
                lr.group_size, dim=2
            )
            ours = torch.einsum("bqhd,bkhd->bhqk", q, k) * lr.score_scale
            causal = lr.mask(q.shape[1])[None, None].expand_as(ours)
            err = float(
                (ours[causal] - scores[L].double()[causal]).abs().max() / scores[L].abs().max()
            )
            assert (err < TOL) == right, (L, right, err)


@pytest.mark.parametrize("name", ["qwen2_vl", "qwen3_vl"])
def test_swapped_sections_are_refused(name, monkeypatch):
    import ropelens.spec.reading as reading

    read = reading.plane_axes
    monkeypatch.setattr(
        reading, "plane_axes", lambda *a: tuple({1: 2, 2: 1}.get(x, x) for x in read(*a))
    )
    m = _model(name)
    with pytest.raises(UnsupportedModelError, match=r"does not match the model \(rotation error"):
        mrope_decomposition(m, **vl_inputs(m, GRIDS))


@pytest.mark.parametrize("name", ["qwen2_vl", "qwen3_vl", "qwen3_5"])
def test_text_only_tower_is_measured_as_1d_rope(name):
    """Text alone (t = h = w): the plain decomposition equals HF's scores and pattern, and the spec
    reads the text rotary's frequencies, not the vision tower's (which come first in the module
    tree)."""
    m = _model(name)
    model = as_plain_vl(m)
    spec = rope_spec(model)
    text_rot = m.model.language_model.rotary_emb
    for L in spec.rotary_layers:
        assert torch.equal(spec[L].inv_freq, text_rot.inv_freq.float())
    toks = vl_inputs(m, ())["input_ids"]
    with torch.no_grad(), hf_scores(m) as scores:
        probs = probs_by_layer(m(input_ids=toks, output_attentions=True).attentions, spec)
    dec = attention_decomposition(
        model, toks, bands=Bands.quantiles(4)
    )  # the verification probe runs first
    assert dec.provenance.config["verification"]["status"] == "passed"
    for L in dec.layers:
        ours = dec.logits(L)
        ok = torch.isfinite(ours)
        assert float((ours[ok] - scores[L][ok]).abs().max() / scores[L][ok].abs().max()) < TOL
        assert float((dec.rebuilt_pattern(L) - probs[L]).abs().max()) < TOL
    text = mrope_decomposition(m, toks)  # no pixels: every axis at the token's position
    assert torch.equal(text.position_ids, torch.arange(toks.shape[1]).expand(3, 1, -1))


def test_text_tower_found_when_the_vision_tower_is_as_deep():
    """The vision blocks come first in the module tree: with as many of them as decoder layers, the
    layers are still the text tower's (head dim 128, not the vision heads' 16)."""
    m = vl_hf_model("qwen2_vl", depth=2)
    spec = rope_spec(as_plain_vl(m))
    assert [lr.head_dim for lr in spec.layers] == [128, 128] and spec[0].axes == expected_axes(
        "qwen2_vl"
    )
    dec = mrope_decomposition(m, **vl_inputs(m, GRIDS))
    assert dec.provenance.config["verification"]["status"] == "passed"


def test_shares_frequencies_and_distance_against_loops():
    dec = _decomposed("qwen2_vl")
    shares = dec.axis_shares()
    sums = shares.groupby(["layer", "head", "pair"]).abs_share.sum()
    assert ((sums - 1).abs() < 1e-9).all()
    L, h = dec.layers[0], 1
    x = dec.band_logits(L, masked=False)[0, h].double()  # [axis, q, k]
    m = dec.pair_mask(L, "vision→vision")[0]
    ab = x[:, m].abs().sum(-1)
    row = shares[
        (shares.layer == L) & (shares["head"] == h) & (shares.pair == "vision→vision")
    ].set_index("axis")
    for b, name in enumerate(dec.band_names(L)):
        assert abs(row.loc[name, "abs_share"] - float(ab[b] / ab.sum())) < 1e-12
    f = dec.axis_frequencies()
    f = f[f.layer == L].set_index("axis")
    inv = dec.spec[L].inv_freq.double()
    assert f.loc["t", "planes"] == "0-15" and f.loc["t", "theta_max"] == 1.0
    assert f.loc["w", "theta_min"] == pytest.approx(float(inv[63]))
    d = dec.by_distance(L)
    pos, mod, pat = dec.position_ids[:, 0], dec.modality[0], dec.pattern(L)[0, h]
    # causal pairs inside one image (every token from the key to the query is a vision token), one
    # column left
    w = dec.band_names(L).index("w")
    pairs = [
        (q, k)
        for q in range(pos.shape[1])
        for k in range(q + 1)
        if bool((mod[k : q + 1] != 0).all()) and int(pos[2, q] - pos[2, k]) == -1
    ]
    vals = [float(pat[q, k]) for q, k in pairs]
    got = d[(d["head"] == h) & (d.axis == "w") & (d.distance == -1)]
    assert int(got.n_pairs.iloc[0]) == len(vals) and got.attention.iloc[0] == pytest.approx(
        sum(vals) / len(vals)
    )
    assert got.logit.iloc[0] == pytest.approx(
        sum(float(x[:, q, k].sum()) for q, k in pairs) / len(pairs)
    )
    assert got.axis_logit.iloc[0] == pytest.approx(
        sum(float(x[w, q, k]) for q, k in pairs) / len(pairs)
    )


def test_findings_figure_and_round_trip(tmp_path):
    dec = _decomposed("qwen3_vl")
    found = dec.findings()
    assert [f.key for f in found] == ["mrope-vision→vision", "mrope-text→vision"]
    for f in found:
        for v in f.values.values():
            assert f"{v:.1f}%" in f.text
    assert len(dec.figure().data) == 6
    path = tmp_path / "m.safetensors"
    dec.save(path)
    back = load_result(path)
    assert type(back) is MRopeDecomposition
    assert torch.equal(back.position_ids, dec.position_ids) and torch.equal(
        back.modality, dec.modality
    )
    torch.testing.assert_close(back.logits(1), dec.logits(1))
    assert back.axis_shares().equals(dec.axis_shares())


def test_one_d_models_are_refused_in_one_line(tiny):
    from ropelens.testing import tiny_hf_model

    with pytest.raises(UnsupportedModelError, match="pass the HF vision-language model itself"):
        mrope_decomposition(tiny("llama"), torch.tensor([[1, 5, 6]]))
    with pytest.raises(InputError, match="applies 1-D RoPE"):
        mrope_decomposition(tiny_hf_model("llama"), torch.tensor([[1, 5, 6]]))
    with pytest.raises(InputError, match="integer"):
        mrope_decomposition(_model("qwen2_vl"), torch.zeros(1, 3))
