"""Position-embedding similarity, periodicity, and RoPE decay curves: closed forms and round
trips."""

from __future__ import annotations

import math

import numpy as np
import plotly.graph_objects as go
import pytest
import torch

from ropelens.analyses.decay import (
    roformer_bound,
    rope_decay_by_distance,
    rope_decay_constant,
    rope_gaussian_expectation,
)
from ropelens.analyses.pe_geometry import (
    PESimilarity,
    learned_pe,
    pe_similarity,
    periodicity,
    sinusoidal_pe,
)
from ropelens.plots.curves import overlay
from ropelens.results.curves import DecayCurve, decay_verdict
from ropelens.spec.rope import LayerRope


def default_inv_freq(head_dim: int = 64, base: float = 10000.0) -> torch.Tensor:
    return base ** (-torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)


def periodic_embedding(
    n_pos: int, period: float, *, extra_dims: int = 0, noise: float = 0.05, seed: int = 0
):
    g = torch.Generator().manual_seed(seed)
    m = torch.arange(n_pos, dtype=torch.float64)
    e = torch.stack([torch.cos(2 * math.pi * m / period), torch.sin(2 * math.pi * m / period)], 1)
    e = torch.cat([e, torch.zeros(n_pos, extra_dims, dtype=torch.float64)], 1)
    return e + noise * torch.randn(e.shape, generator=g, dtype=torch.float64)


# ---------------------------------------------------------------------------------------------
# absolute position embeddings
# ---------------------------------------------------------------------------------------------
def test_sinusoidal_pe_is_the_interleaved_vaswani_form():
    pe = sinusoidal_pe(50, 8)
    omega = 10000 ** (-torch.arange(0, 8, 2, dtype=torch.float64) / 8)
    m = torch.arange(50, dtype=torch.float64)[:, None]
    torch.testing.assert_close(pe[:, 0::2].double(), torch.sin(m * omega), atol=1e-6, rtol=0)
    torch.testing.assert_close(pe[:, 1::2].double(), torch.cos(m * omega), atol=1e-6, rtol=0)


def test_sinusoidal_similarity_depends_only_on_distance_and_matches_closed_form():
    n, d = 128, 32
    sim = pe_similarity(sinusoidal_pe(n, d), name="sinusoidal")
    s = sim.similarity.double()
    for k in range(-n + 1, n):
        diag = s.diagonal(k)
        assert (diag - diag[0]).abs().max() < 1e-6, f"not Toeplitz at offset {k}"
    omega = 10000 ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)
    closed = torch.cos(torch.arange(n, dtype=torch.float64)[:, None] * omega).sum(1) / (d / 2)
    torch.testing.assert_close(sim.mean, closed, atol=1e-6, rtol=0)
    assert sim.std.max() < 1e-5  # every pair at a distance has the same similarity
    assert sim.count.tolist() == list(range(n, 0, -1))


@pytest.mark.parametrize("period", [5, 16, 37.5, 60])
def test_periodic_embedding_yields_its_period(period):
    sim = pe_similarity(periodic_embedding(256, period))
    assert sim.period is not None and abs(sim.period - period) <= 1, (
        sim.period,
        sim.period_strength,
    )
    assert sim.period_strength > 0.9


def test_concatenated_periodic_embedding_with_noise_dims_yields_its_period():
    e = periodic_embedding(300, 24, extra_dims=30, noise=0.02, seed=3)
    sim = pe_similarity(e, max_distance=200)
    assert sim.distance.tolist() == list(range(201))
    assert sim.period is not None and abs(sim.period - 24) <= 1


@pytest.mark.parametrize(("n_pos", "d", "seed"), [(256, 64, 0), (512, 16, 1), (40, 8, 2)])
def test_random_gaussian_embedding_has_no_periodicity(n_pos, d, seed):
    e = torch.randn(n_pos, d, generator=torch.Generator().manual_seed(seed))
    sim = pe_similarity(e)
    assert sim.period is None, (sim.period, sim.period_strength, sim.period_threshold)
    assert 0 <= sim.period_strength < sim.period_threshold


def test_smooth_decay_is_not_called_periodic():
    k = torch.arange(512, dtype=torch.float64)
    for curve in (torch.exp(-k / 50), 1 / (1 + k / 20)):
        period, strength, _ = periodicity(curve)
        assert period is None, strength


def test_short_curve_threshold_rises_above_noise():
    _, _, short = periodicity(torch.randn(20, dtype=torch.float64))
    _, _, long = periodicity(torch.randn(500, dtype=torch.float64))
    assert short > long >= 0.3
    assert periodicity(torch.ones(5)) == (None, 0.0, 1.0)


@pytest.mark.parametrize(
    ("bad", "match"),
    [
        (torch.zeros(5), "n_pos, d"),
        (torch.zeros(1, 4), "n_pos ≥ 2"),
        (torch.zeros(4, 0), "d ≥ 1"),
        (torch.zeros(2, 3, 4), "shape \\(2, 3, 4\\)"),
        (torch.tensor([[1.0, 0.0], [float("nan"), 1.0]]), "NaN/inf in rows \\[1\\]"),
        (torch.tensor([[1.0, 0.0], [1.0, float("inf")]]), "NaN/inf"),
        (torch.tensor([[1.0, 0.0], [0.0, 0.0]]), "rows \\[1\\] are all zero"),
    ],
)
def test_bad_embeddings_raise_clear_errors(bad, match):
    with pytest.raises(ValueError, match=match):
        pe_similarity(bad)


def test_bad_arguments_raise_clear_errors():
    with pytest.raises(TypeError, match="torch.Tensor or numpy"):
        pe_similarity([[1.0, 0.0], [0.0, 1.0]])
    with pytest.raises(ValueError, match="max_distance must be an int in \\[0, 9\\]"):
        pe_similarity(torch.randn(10, 4), max_distance=10)
    with pytest.raises(ValueError, match="even"):
        sinusoidal_pe(10, 7)


def test_numpy_input_and_integer_dtype_are_accepted():
    e = np.eye(6)
    sim = pe_similarity(e)
    torch.testing.assert_close(sim.similarity, torch.eye(6))
    assert sim.mean[1:].abs().max() == 0


# ---------------------------------------------------------------------------------------------
# learned PE from models
# ---------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def tiny_gpt2():
    from ropelens.testing import tiny_model

    return tiny_model("gpt2")


def test_learned_pe_of_tiny_gpt2_is_its_wpe(tiny_gpt2):
    pe = learned_pe(tiny_gpt2)
    assert pe.shape == (256, 64)
    assert torch.equal(pe, tiny_gpt2.original_model.transformer.wpe.weight.detach().float())
    sim = pe_similarity(pe, name="tiny gpt2")
    assert sim.n_pos == 256 and sim.d_model == 64
    # a randomly initialised table is Luo & Love's INIT baseline: flat, no period
    assert sim.period is None and decay_verdict(sim).verdict == "flat"


def test_learned_pe_drops_opt_offset_rows():
    from transformers import OPTConfig, OPTForCausalLM

    cfg = OPTConfig(
        vocab_size=50,
        hidden_size=16,
        num_hidden_layers=1,
        ffn_dim=32,
        num_attention_heads=2,
        max_position_embeddings=20,
        word_embed_proj_dim=16,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=0,
    )
    opt = OPTForCausalLM(cfg)
    table = opt.model.decoder.embed_positions.weight
    assert table.shape[0] == 22
    assert torch.equal(learned_pe(opt), table.detach()[2:])


def test_learned_pe_finds_bert_like_tables():
    from transformers import BertConfig, BertForMaskedLM

    bert = BertForMaskedLM(
        BertConfig(
            vocab_size=50,
            hidden_size=16,
            num_hidden_layers=1,
            num_attention_heads=2,
            intermediate_size=32,
            max_position_embeddings=24,
        )
    )
    assert torch.equal(learned_pe(bert), bert.bert.embeddings.position_embeddings.weight.detach())


def test_learned_pe_of_a_rope_model_says_what_to_use_instead():
    from ropelens.testing import tiny_model

    with pytest.raises(ValueError, match="rotary position embeddings.*rope_decay_constant"):
        learned_pe(tiny_model("llama"))


# ---------------------------------------------------------------------------------------------
# RoPE geometry
# ---------------------------------------------------------------------------------------------
def test_constant_curve_is_sum_of_2cos_and_decays_on_average():
    theta = default_inv_freq(64)
    curve = rope_decay_constant(theta, 512)
    delta = torch.arange(513, dtype=torch.float64)
    expected = (2 * torch.cos(delta[:, None] * theta)).sum(1)
    torch.testing.assert_close(curve.mean, expected, atol=1e-9, rtol=0)
    assert curve.mean[0] == 64  # d_r: every plane contributes 2 at δ = 0
    assert curve.mean[1:].mean() < curve.mean[0]
    torch.testing.assert_close(curve.normalised().mean, expected / 64)
    assert decay_verdict(curve).verdict == "decays"


def test_constant_curve_matches_rotating_all_ones_vectors():
    theta = default_inv_freq(16).float()
    lr = LayerRope(
        layer=0,
        inv_freq=theta,
        head_dim=16,
        rotary_dim=16,
        pairing="half",
        n_heads=1,
        n_kv_heads=1,
        score_scale=0.25,
    )
    pos = torch.arange(40)
    ones = torch.ones(1, 40, 16)
    q, k = lr.rotate(ones, pos), lr.rotate(ones, pos)
    measured = rope_decay_by_distance(q, k, lr, 39)
    torch.testing.assert_close(
        measured.mean, rope_decay_constant(theta, 39).mean, atol=1e-4, rtol=0
    )
    assert measured.std.max() < 1e-4 and measured.count.tolist() == list(range(40, 0, -1))


def test_roformer_bound_closed_form():
    theta = default_inv_freq(8)
    bound = roformer_bound(theta, 30)
    assert bound.mean[0] == pytest.approx((4 + 1) / 2)  # (1/n)·Σ_j j at δ = 0
    d = 7
    s = np.cumsum(np.exp(1j * d * theta.numpy()))
    assert bound.mean[d].item() == pytest.approx(np.abs(s).mean())
    assert decay_verdict(roformer_bound(default_inv_freq(128), 512)).verdict == "decays"


def test_gaussian_expectation_is_flat_and_monte_carlo_agrees():
    theta = default_inv_freq(32)
    flat = rope_gaussian_expectation(theta, 200)
    assert flat.mean.abs().max() == 0
    assert decay_verdict(flat).verdict == "flat"
    mc0 = rope_gaussian_expectation(theta, 200, n_samples=4000, seed=1)
    assert ((mc0.mean - flat.mean).abs() <= 4 * mc0.sem).all()
    assert decay_verdict(mc0).verdict == "flat"
    exact = rope_gaussian_expectation(theta, 200, mean=0.5, std=1.5)
    mc = rope_gaussian_expectation(theta, 200, mean=0.5, std=1.5, n_samples=4000, seed=2)
    torch.testing.assert_close(exact.mean, 0.25 * rope_decay_constant(theta, 200).mean)
    assert ((mc.mean - exact.mean).abs() <= 4 * mc.sem).all()
    torch.testing.assert_close(mc.std, exact.std, rtol=0.1, atol=0)  # √(d_r σ²(2μ² + σ²))
    assert exact.sem is None and mc.count.unique().tolist() == [4000]


@pytest.mark.parametrize("seed", range(6))
def test_monte_carlo_noise_is_not_called_a_decay(seed):
    # one sample set serves every δ, so MC noise is a smooth random mix of cos(δθ_i): the verdict's
    # noise bound, not Spearman alone, must keep it "flat"
    mc = rope_gaussian_expectation(default_inv_freq(32), 200, n_samples=4000, seed=seed)
    v = decay_verdict(mc)
    assert v.verdict == "flat" and v.noise > 0


def test_monte_carlo_is_seeded():
    theta = default_inv_freq(8)
    a = rope_gaussian_expectation(theta, 10, n_samples=100, seed=5)
    b = rope_gaussian_expectation(theta, 10, n_samples=100, seed=5)
    assert torch.equal(a.mean, b.mean)


def test_rope_arguments_are_validated():
    with pytest.raises(ValueError, match="inv_freq must be non-empty"):
        rope_decay_constant(torch.tensor([1.0, float("nan")]), 10)
    with pytest.raises(ValueError, match="max_distance must be an int ≥ 0"):
        roformer_bound(default_inv_freq(8), -1)
    with pytest.raises(ValueError, match="n_samples must be an int ≥ 2"):
        rope_gaussian_expectation(default_inv_freq(8), 10, n_samples=1)


def test_decay_by_distance_counts_causal_pairs():
    lr = LayerRope(
        layer=3,
        inv_freq=default_inv_freq(8).float(),
        head_dim=8,
        rotary_dim=8,
        pairing="half",
        n_heads=1,
        n_kv_heads=1,
        score_scale=1.0,
    )
    g = torch.Generator().manual_seed(0)
    q, k = torch.randn(2, 12, 8, generator=g), torch.randn(2, 12, 8, generator=g)
    curve = rope_decay_by_distance(q, k, lr, 5)
    logits = q @ k.transpose(1, 2)
    for d in range(6):
        vals = logits.diagonal(-d, dim1=1, dim2=2).flatten().double()
        assert curve.mean[d].item() == pytest.approx(vals.mean().item(), abs=1e-6)
        assert curve.std[d].item() == pytest.approx(vals.std(correction=0).item(), abs=1e-6)
        assert curve.count[d] == 2 * (12 - d)
    assert curve.name == "layer 3"
    valid = torch.ones(2, 12, dtype=torch.bool)
    valid[1, 9:] = False  # right padding: its pairs must not count
    masked = rope_decay_by_distance(q, k, lr, 5, valid=valid)
    for d in range(6):
        vals = torch.cat([logits[0].diagonal(-d), logits[1, :9, :9].diagonal(-d)]).double()
        assert masked.mean[d].item() == pytest.approx(vals.mean().item(), abs=1e-6)
        assert masked.count[d] == vals.numel()
    with pytest.raises(ValueError, match="no valid pairs at distance 3"):
        rope_decay_by_distance(q, k, lr, 5, valid=torch.arange(12).expand(2, 12) < 3)
    with pytest.raises(ValueError, match="head_dim 8"):
        rope_decay_by_distance(q[..., :4], k[..., :4], lr)
    with pytest.raises(ValueError, match="repeat KV heads"):
        rope_decay_by_distance(q, k[:, :6], lr)


def test_decay_verdict_rule():
    d = torch.arange(50)

    def make(y):
        return DecayCurve(name="t", kind="test", distance=d, mean=y.double())

    assert decay_verdict(make(10 - 0.1 * d)).verdict == "decays"
    assert decay_verdict(make(1 + 0.1 * d)).verdict == "grows"
    assert decay_verdict(make(torch.cos(d * 2 * math.pi / 7))).verdict == "flat"
    v = decay_verdict(make(10 - 0.1 * d))
    assert v.far_near_ratio < 1 and v.spearman == pytest.approx(-1) and v.n_distances == 49
    with pytest.raises(ValueError, match="at least 4 distances"):
        decay_verdict(
            DecayCurve(name="t", kind="test", distance=torch.arange(3), mean=torch.zeros(3))
        )


# ---------------------------------------------------------------------------------------------
# results: validation, save/load, figures
# ---------------------------------------------------------------------------------------------
def test_results_validate_shapes():
    with pytest.raises(ValueError, match="mean has shape"):
        DecayCurve(name="x", kind="k", distance=torch.arange(4), mean=torch.zeros(3))
    with pytest.raises(ValueError, match="strictly increasing"):
        DecayCurve(name="x", kind="k", distance=torch.tensor([0, 2, 1]), mean=torch.zeros(3))
    sim = pe_similarity(torch.randn(10, 4))
    with pytest.raises(ValueError, match="square"):
        PESimilarity(**{**sim.__dict__, "similarity": torch.zeros(10, 9)})
    with pytest.raises(ValueError, match="normalise|plot it raw"):
        rope_gaussian_expectation(default_inv_freq(8), 5).normalised()


def test_pe_similarity_save_load_round_trip(tmp_path):
    sim = pe_similarity(periodic_embedding(64, 10), name="periodic")
    path = tmp_path / "sub" / "sim.json"
    sim.save(path)
    back = PESimilarity.load(path)
    assert torch.equal(back.similarity, sim.similarity)
    for f in ("distance", "mean", "std", "count"):
        assert torch.equal(getattr(back, f), getattr(sim, f)), f
    assert (back.name, back.period, back.period_strength, back.d_model) == (
        sim.name,
        sim.period,
        sim.period_strength,
        sim.d_model,
    )
    assert [p.name for p in path.parent.iterdir()] == ["sim.json"]  # no temp file left behind
    with pytest.raises(ValueError, match="not 'DecayCurve'"):
        DecayCurve.load(path)


@pytest.mark.parametrize("n_samples", [None, 50])
def test_decay_curve_save_load_round_trip(tmp_path, n_samples):
    curve = rope_gaussian_expectation(default_inv_freq(8), 20, mean=0.3, n_samples=n_samples)
    curve.save(tmp_path / "c.json")
    back = DecayCurve.load(tmp_path / "c.json")
    assert (back.name, back.kind) == (curve.name, curve.kind)
    assert torch.equal(back.mean, curve.mean) and torch.equal(back.std, curve.std)
    assert (back.count is None) == (curve.count is None)
    assert back.to_frame().equals(curve.to_frame())


def test_figures_and_frames():
    sim = pe_similarity(sinusoidal_pe(64, 16), name="sinusoidal")
    fig = sim.figure()
    assert isinstance(fig, go.Figure) and len(fig.data) >= 2
    assert isinstance(fig.data[0], go.Heatmap)
    frame = sim.to_frame()
    assert (
        list(frame.columns) == ["name", "distance", "mean", "std", "count", "sem"]
        and len(frame) == 64
    )
    assert "sinusoidal" in sim._repr_html_()
    theta = default_inv_freq(16)
    mc = rope_gaussian_expectation(theta, 30, mean=0.5, n_samples=200)
    assert len(mc.figure().data) == 2  # band + line
    assert len(rope_decay_constant(theta, 30).figure().data) == 1
    assert "decays" in rope_decay_constant(theta, 100)._repr_html_()
    both = overlay([sim, rope_decay_constant(theta, 30), mc], normalised=True)
    assert len(both.data) == 3
    with pytest.raises(ValueError, match="at least one"):
        overlay([])


def test_large_heatmap_is_strided_for_display():
    sim = pe_similarity(
        torch.randn(1100, 4, generator=torch.Generator().manual_seed(0)), max_distance=50
    )
    assert len(sim.heatmap().z) <= 512 and sim.similarity.shape == (1100, 1100)
