"""rope.py: plane pairing, rotation against HF's reference code, wavelengths, (de)serialisation."""

from __future__ import annotations

import json
import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from transformers.models.gptj.modeling_gptj import apply_rotary_pos_emb as gptj_apply_rotary
from transformers.models.gptj.modeling_gptj import create_sinusoidal_positions, rotate_every_two
from transformers.models.llama.modeling_llama import apply_rotary_pos_emb as llama_apply_rotary
from transformers.models.llama.modeling_llama import rotate_half

from ropelens.spec.rope import (
    LayerRope,
    RopeSpec,
    merge_planes,
    plane_dims,
    plane_norms,
    split_planes,
)

PAIRINGS = ("half", "adjacent")


def default_inv_freq(rotary_dim: int, base: float = 10000.0) -> torch.Tensor:
    return 1.0 / base ** (torch.arange(0, rotary_dim, 2, dtype=torch.float64) / rotary_dim)


def make_layer(
    head_dim=16, rotary_dim=None, pairing="half", base=10000.0, layer=0, **kw
) -> LayerRope:
    rotary_dim = head_dim if rotary_dim is None else rotary_dim
    defaults = dict(n_heads=4, n_kv_heads=2, score_scale=head_dim**-0.5, base=base, n_ctx=64)
    return LayerRope(
        layer=layer,
        inv_freq=default_inv_freq(rotary_dim, base).float(),
        head_dim=head_dim,
        rotary_dim=rotary_dim,
        pairing=pairing,
        **{**defaults, **kw},
    )


# --------------------------------------------------------------------------------------------
# planes
# --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("pairing", PAIRINGS)
@pytest.mark.parametrize(("head_dim", "rotary_dim"), [(16, 16), (16, 8), (10, 6)])
def test_split_merge_round_trip(pairing, head_dim, rotary_dim):
    x = torch.randn(3, 5, head_dim)
    planes = split_planes(x, rotary_dim, pairing)
    assert planes.shape == (3, 5, rotary_dim // 2, 2)
    torch.testing.assert_close(merge_planes(planes, pairing), x[..., :rotary_dim], rtol=0, atol=0)


@pytest.mark.parametrize("pairing", PAIRINGS)
def test_split_planes_agrees_with_plane_dims(pairing):
    x = torch.randn(2, 12)
    dims = plane_dims(8, pairing)
    planes = split_planes(x, 8, pairing)
    for i, (a, b) in enumerate(dims.tolist()):
        torch.testing.assert_close(planes[..., i, 0], x[..., a], rtol=0, atol=0)
        torch.testing.assert_close(planes[..., i, 1], x[..., b], rtol=0, atol=0)


def test_plane_dims_layout():
    assert plane_dims(8, "half").tolist() == [[0, 4], [1, 5], [2, 6], [3, 7]]
    assert plane_dims(8, "adjacent").tolist() == [[0, 1], [2, 3], [4, 5], [6, 7]]


@pytest.mark.parametrize("bad", [-2, 7])
def test_plane_dims_rejects_odd_or_negative(bad):
    with pytest.raises(ValueError, match=str(bad)):
        plane_dims(bad, "half")


def test_a_nope_layer_has_no_planes():
    assert plane_dims(0, "half").shape == (0, 2)
    lr = LayerRope(
        layer=0,
        inv_freq=torch.zeros(0),
        head_dim=8,
        rotary_dim=0,
        pairing="half",
        n_heads=2,
        n_kv_heads=2,
        score_scale=8**-0.5,
        kind="nope",
    )
    assert not lr.rotary and lr.n_planes == 0
    x = torch.randn(3, 5, 8)
    assert torch.equal(lr.rotate(x, torch.arange(5)), x)  # nothing turns
    with pytest.raises(ValueError, match="nope"):
        LayerRope(
            layer=0,
            inv_freq=torch.zeros(0),
            head_dim=8,
            rotary_dim=0,
            pairing="half",
            n_heads=2,
            n_kv_heads=2,
            score_scale=1.0,
        )  # zero planes must be called a NoPE layer


def test_layer_probs_apply_softcap_and_sinks():
    """Against the formulas written out: c·tanh(s/c), then a sink column in the softmax that is
    dropped."""
    s = torch.tensor([[[[1.0, 30.0, float("-inf")]]], [[[2.0, -4.0, 0.5]]]])  # [b=2, h=1, q=1, k=3]
    base = dict(
        layer=0,
        inv_freq=torch.ones(1),
        head_dim=2,
        rotary_dim=2,
        pairing="half",
        n_heads=1,
        n_kv_heads=1,
        score_scale=1.0,
    )
    capped = LayerRope(**base, softcap=10.0).probs(s)
    e = [math.exp(10 * math.tanh(0.1)), math.exp(10 * math.tanh(3.0))]
    assert capped[0, 0, 0].tolist() == pytest.approx([e[0] / sum(e), e[1] / sum(e), 0.0], rel=1e-6)
    sunk = LayerRope(**base, sinks=(1.5,)).probs(s)
    z = math.exp(2.0) + math.exp(-4.0) + math.exp(0.5) + math.exp(1.5)
    assert sunk[1, 0, 0].tolist() == pytest.approx(
        [math.exp(2.0) / z, math.exp(-4.0) / z, math.exp(0.5) / z], rel=1e-6
    )


def test_unknown_pairing_is_rejected():
    with pytest.raises(ValueError, match="'diagonal'"):
        plane_dims(8, "diagonal")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="'diagonal'"):
        split_planes(torch.zeros(8), 8, "diagonal")  # type: ignore[arg-type]


def test_split_planes_rejects_short_vectors():
    with pytest.raises(ValueError, match="smaller than rotary_dim"):
        split_planes(torch.zeros(4), 8, "half")


# --------------------------------------------------------------------------------------------
# rotation against HF's reference implementations
# --------------------------------------------------------------------------------------------
def test_rotate_matches_hf_llama_rotate_half():
    lr = make_layer(head_dim=16, pairing="half")
    q, k = torch.randn(2, 4, 7, 16), torch.randn(2, 2, 7, 16)  # [batch, head, pos, d]
    pos = torch.arange(7)
    freqs = pos[:, None].float() * lr.inv_freq[None, :]
    emb = torch.cat([freqs, freqs], dim=-1)[None]  # HF layout: [batch, pos, d], halves repeated
    q_hf, k_hf = llama_apply_rotary(q, k, emb.cos(), emb.sin())
    torch.testing.assert_close(lr.rotate(q, pos), q_hf, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(lr.rotate(k, pos), k_hf, rtol=1e-5, atol=1e-5)


def test_rotate_half_is_a_quarter_turn_of_every_plane():
    lr = make_layer(head_dim=8, pairing="half")
    x = torch.randn(3, 8)
    quarter = merge_planes(torch.stack([-lr.split(x)[..., 1], lr.split(x)[..., 0]], -1), "half")
    torch.testing.assert_close(quarter, rotate_half(x))


@pytest.mark.parametrize("head_dim", [8, 16])
def test_rotate_matches_hf_gptj_adjacent_pairs(head_dim):
    rotary_dim = 8
    lr = make_layer(head_dim=head_dim, rotary_dim=rotary_dim, pairing="adjacent")
    x = torch.randn(2, 9, 4, head_dim)  # GPT-J layout: [batch, pos, head, d]
    sincos = create_sinusoidal_positions(9, rotary_dim)[None].expand(2, -1, -1)
    sin, cos = sincos.split(rotary_dim // 2, dim=-1)
    rot = gptj_apply_rotary(x[..., :rotary_dim], sin, cos)
    expected = torch.cat([rot, x[..., rotary_dim:]], dim=-1)
    ours = lr.rotate(x.transpose(1, 2), torch.arange(9)).transpose(1, 2)
    torch.testing.assert_close(ours, expected, rtol=1e-5, atol=1e-5)


def test_rotate_every_two_is_a_quarter_turn_of_every_plane():
    x = torch.randn(1, 1, 1, 8)
    p = split_planes(x, 8, "adjacent")
    torch.testing.assert_close(
        merge_planes(torch.stack([-p[..., 1], p[..., 0]], -1), "adjacent"), rotate_every_two(x)
    )


@pytest.mark.parametrize("pairing", PAIRINGS)
def test_rotation_preserves_plane_norms_and_passes_unrotated_dims(pairing):
    lr = make_layer(head_dim=16, rotary_dim=12, pairing=pairing)
    x = torch.randn(4, 20, 16, dtype=torch.float64)
    out = lr.rotate(x, torch.arange(20))
    torch.testing.assert_close(lr.split(out).norm(dim=-1), lr.split(x).norm(dim=-1))
    torch.testing.assert_close(out[..., 12:], x[..., 12:], rtol=0, atol=0)


@settings(max_examples=30, deadline=None)
@given(
    m=st.integers(0, 4096),
    n=st.integers(0, 4096),
    pairing=st.sampled_from(PAIRINGS),
    seed=st.integers(0, 2**16),
)
def test_score_depends_only_on_relative_position(m, n, pairing, seed):
    """(R(mθ)q)ᵀ(R(nθ)k) = qᵀR((n−m)θ)k = Σ_i q⁽ⁱ⁾ᵀR((n−m)θ_i)k⁽ⁱ⁾, plane by plane."""
    lr = make_layer(head_dim=16, pairing=pairing, base=10000.0)
    g = torch.Generator().manual_seed(seed)
    q, k = (
        torch.randn(16, generator=g, dtype=torch.float64),
        torch.randn(16, generator=g, dtype=torch.float64),
    )
    absolute = lr.rotate(q[None], torch.tensor([m])) @ lr.rotate(k[None], torch.tensor([n]))[0]
    relative = q @ lr.rotate(k[None], torch.tensor([n - m]))[0]
    ang = (n - m) * lr.inv_freq.double()
    qp, kp = lr.split(q), lr.split(k)
    per_plane = (qp[:, 0] * (ang.cos() * kp[:, 0] - ang.sin() * kp[:, 1])) + (
        qp[:, 1] * (ang.sin() * kp[:, 0] + ang.cos() * kp[:, 1])
    )
    torch.testing.assert_close(absolute[0], relative, rtol=1e-9, atol=1e-9)
    torch.testing.assert_close(per_plane.sum(), relative, rtol=1e-9, atol=1e-9)


def test_attention_scaling_multiplies_rotated_vectors():
    lr = make_layer(head_dim=8, attention_scaling=1.5)
    x = torch.randn(5, 8, dtype=torch.float64)
    torch.testing.assert_close(
        lr.split(lr.rotate(x, torch.arange(5))).norm(dim=-1), 1.5 * lr.split(x).norm(dim=-1)
    )


# --------------------------------------------------------------------------------------------
# wavelengths
# --------------------------------------------------------------------------------------------
def test_wavelength_is_two_pi_over_theta():
    lr = make_layer(head_dim=16, base=10000.0)
    torch.testing.assert_close(lr.wavelength, 2 * math.pi / lr.inv_freq.double())
    assert lr.wavelength[0].item() == pytest.approx(2 * math.pi)  # θ₀ = 1: the highest frequency
    assert torch.all(lr.wavelength[1:] > lr.wavelength[:-1])


def test_unrotated_planes_have_infinite_wavelength():
    lr = make_layer(head_dim=8)
    lr = LayerRope(**{**lr.__dict__, "inv_freq": torch.tensor([1.0, 0.1, 0.0, 0.0])})
    assert torch.isinf(lr.wavelength[2:]).all()
    assert lr.planes_beyond(100).tolist() == [2, 3]


def test_planes_beyond():
    lr = make_layer(head_dim=16, base=10000.0, n_ctx=64)
    expected = [i for i, w in enumerate(lr.wavelength.tolist()) if w > 64]
    assert lr.planes_beyond().tolist() == expected
    assert lr.planes_beyond(10**9).tolist() == []
    assert lr.planes_beyond(1).tolist() == list(range(lr.n_planes))


def test_planes_beyond_needs_a_context_length():
    lr = make_layer(n_ctx=None)
    with pytest.raises(ValueError, match="n_ctx"):
        lr.planes_beyond()


# --------------------------------------------------------------------------------------------
# LayerRope / RopeSpec
# --------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("changes", "match"),
    [
        ({"inv_freq": torch.ones(2, 4)}, "1-D"),
        ({"rotary_dim": 6}, "rotary_dim is 6"),
        ({"head_dim": 4}, "exceeds head_dim"),
        ({"n_heads": 3, "n_kv_heads": 2}, "multiple"),
        ({"n_kv_heads": 0}, "multiple"),
    ],
)
def test_layer_rope_rejects_inconsistent_fields(changes, match):
    base = make_layer(head_dim=8).__dict__
    with pytest.raises(ValueError, match=match):
        LayerRope(**{**base, **changes})


def gemma_like_spec() -> RopeSpec:
    layers = []
    for i in range(6):
        full = i == 5
        layers.append(
            make_layer(
                layer=i,
                base=1e6 if full else 1e4,
                kind="full" if full else "sliding",
                window=None if full else 8,
                rope_parameters={"rope_type": "default", "rope_theta": 1e6 if full else 1e4},
            )
        )
    return RopeSpec(model_name="toy", architecture="Toy", layers=tuple(layers), n_ctx=64)


def test_spec_round_trips_through_dict_and_json():
    spec = gemma_like_spec()
    back = RopeSpec.from_dict(spec.to_dict())
    assert back.to_dict() == spec.to_dict()
    for a, b in zip(spec.layers, back.layers, strict=True):
        assert torch.equal(a.inv_freq, b.inv_freq)
        assert a.same_rotation(b)
    assert RopeSpec.from_dict(json.loads(spec.to_json())).to_dict() == spec.to_dict()


def test_spec_kinds_and_summary():
    spec = gemma_like_spec()
    assert spec.kinds == {"sliding": [0, 1, 2, 3, 4], "full": [5]}
    summary = spec.summary().set_index("kind")
    assert summary.loc["sliding", "layers"] == "0-4"
    assert summary.loc["full", "base"] == 1e6
    assert summary.loc["sliding", "window"] == 8
    frame = spec.to_frame()
    assert len(frame) == spec.n_layers * spec[0].n_planes


def test_spec_rejects_out_of_order_layers():
    a, b = make_layer(layer=0), make_layer(layer=1)
    with pytest.raises(ValueError, match="position 0 holds layer 1"):
        RopeSpec(model_name="x", architecture="X", layers=(b, a), n_ctx=8)
    with pytest.raises(ValueError, match="at least one layer"):
        RopeSpec(model_name="x", architecture="X", layers=(), n_ctx=8)


def test_layer_indices_selects_and_wraps():
    spec = gemma_like_spec()
    assert spec.layer_indices() == list(range(6))
    assert spec.layer_indices([0, -1]) == [0, 5]
    assert spec.layer_indices(kind="full") == [5]
    assert spec.layer_indices([4, 5], kind="sliding") == [4]


@pytest.mark.parametrize(
    ("layers", "kind", "error", "match"),
    [
        ([6], None, ValueError, "layer 6 out of range.*6 layers"),
        ([-7], None, ValueError, "out of range"),
        ([1.0], None, TypeError, "must be ints"),
        ([True], None, TypeError, "must be ints"),
        (["0"], None, TypeError, "must be ints"),
        (None, "global", ValueError, "'global' not in this model"),
    ],
)
def test_layer_indices_errors(layers, kind, error, match):
    with pytest.raises(error, match=match):
        gemma_like_spec().layer_indices(layers, kind=kind)


@pytest.mark.parametrize("pairing", ["half", "adjacent"])
def test_plane_norms_equal_norms_of_split_planes(pairing):
    x = torch.randn(3, 5, 2, 12)
    assert torch.allclose(
        plane_norms(x, 8, pairing), split_planes(x, 8, pairing).norm(dim=-1), atol=1e-6
    )


@pytest.mark.parametrize("pairing", ["half", "adjacent"])
def test_plane_sums_and_norms_match_the_split_planes(pairing):
    """plane_sums(q * k) is each plane's q^(i)·k^(i) and plane_norms each plane's 2-norm, as from
    split_planes, with the non-rotary dims of a partial-rotary head left out."""
    from ropelens.spec.rope import plane_norms, plane_sums, split_planes

    g = torch.Generator().manual_seed(0)
    q, k = (
        torch.randn(3, 5, 40, generator=g, dtype=torch.float64),
        torch.randn(3, 5, 40, generator=g, dtype=torch.float64),
    )
    qs, ks = split_planes(q, 32, pairing), split_planes(k, 32, pairing)
    torch.testing.assert_close(
        plane_sums(q * k, 32, pairing), (qs * ks).sum(-1), rtol=1e-12, atol=1e-12
    )
    torch.testing.assert_close(plane_norms(q, 32, pairing), qs.norm(dim=-1), rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(
        plane_sums(q * k, 32, pairing).sum(-1), (q[..., :32] * k[..., :32]).sum(-1)
    )
