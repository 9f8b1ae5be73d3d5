"""Context extension per plane: frequencies against HF, categories, RoPE bounds, LongRoPE factor search."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from ropelens import data, rope_spec
from ropelens.context import (
    LongRopeSearch,
    PlaneView,
    base_lower_bound,
    bound_holds,
    compare_figure,
    critical_dimension,
    plane_view,
    search_longrope_factors,
)
from ropelens.testing import tiny_hf_model
from ropelens.variants import NTK, Default, DynamicNTK, Linear, Llama3, LongRoPE, YaRN

L0, L = 32, 128
LONG = (1.0, 1.5, 2.0, 3.0, 4.0, 6.0, 8.0, 16.0)

# (variant, HF rope_parameters) pairs describing the same scaling.
CASES = [
    (Linear(4.0), {"rope_type": "linear", "factor": 4.0}),
    (YaRN(4.0, L0), {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": L0}),
    (Llama3(4.0, 1.0, 4.0, L0), {"rope_type": "llama3", "factor": 4.0, "low_freq_factor": 1.0,
                                 "high_freq_factor": 4.0, "original_max_position_embeddings": L0}),
    (LongRoPE((1.0,) * 8, LONG, L0, factor=4.0),
     {"rope_type": "longrope", "short_factor": [1.0] * 8, "long_factor": list(LONG), "factor": 4.0,
      "original_max_position_embeddings": L0}),
    (DynamicNTK(2.0, L0), {"rope_type": "dynamic", "factor": 2.0}),
]


@pytest.fixture(scope="module")
def layer(tiny):
    return rope_spec(tiny("llama"))[0]


@pytest.mark.parametrize(("variant", "params"), CASES, ids=lambda x: getattr(x, "name", "")[:12])
def test_plane_view_frequencies_are_hfs(layer, variant, params):
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    # max_position_embeddings = L0: HF's "original" length for dynamic NTK, and L0 < L selects long factors.
    hf = tiny_hf_model("llama", max_position_embeddings=L0, rope_parameters={"rope_theta": 10000.0, **params})
    want, scaling = ROPE_INIT_FUNCTIONS[params["rope_type"]](hf.config, None, seq_len=L)
    view = plane_view(layer, variant, L0, L)
    torch.testing.assert_close(view.inv_freq_after, want.float(), rtol=1e-6, atol=0)
    assert view.attention_scaling == pytest.approx(float(scaling))
    torch.testing.assert_close(view.scale, (view.inv_freq_before / want).double(), rtol=1e-6, atol=0)
    torch.testing.assert_close(view.wavelength_after, 2 * math.pi / want.double(), rtol=1e-6, atol=0)


def test_categories(layer):
    plain = plane_view(layer, Default(), L0, L)
    fits = (layer.wavelength <= L0).tolist()
    assert plain.categories == tuple("kept" if f else "extrapolated" for f in fits)
    assert set(plane_view(layer, Linear(L / L0), L0, L).categories) == {"interpolated"}
    # PI by half the needed factor leaves the slow planes beyond anything seen in training.
    half = plane_view(layer, Linear(2.0), L0, L)
    assert half.counts()["extrapolated"] == sum(not f for f in fits)
    ntk = plane_view(layer, NTK(4.0), L0, L)
    assert ntk.categories[0] == "kept" and ntk.counts()["extrapolated"] > 0
    yarn = plane_view(layer, YaRN(4.0, L0), L0, L)
    assert yarn.counts()["extrapolated"] == 0 and yarn.categories[0] == "kept"


def test_plane_view_roundtrip_and_figures(layer, tmp_path):
    views = [plane_view(layer, v, L0, L) for v in (Linear(4.0), NTK(4.0), YaRN(4.0, L0))]
    views[0].save(tmp_path / "v.json")
    back = PlaneView.load(tmp_path / "v.json")
    torch.testing.assert_close(back.inv_freq_after, views[0].inv_freq_after)
    assert back.categories == views[0].categories and back.variant == views[0].variant
    frame = views[1].to_frame()
    assert len(frame) == layer.n_planes and set(frame.category) <= {"kept", "interpolated", "extrapolated"}
    assert len(compare_figure(views).data) == 4 and views[2].figure().data
    with pytest.raises(ValueError, match="original_ctx"):
        plane_view(layer, Linear(4.0), 0, L)


def test_critical_dimension_hand_cases():
    assert critical_dimension(10000, 128, 4096) == 92  # Llama 2, as in arXiv 2310.05209
    # d = 4, base 100: wavelengths 2π and 20π ≈ 62.8.
    assert critical_dimension(100, 4, 5) == 0  # shorter than one turn of the fastest plane
    assert critical_dimension(100, 4, 10) == 2  # only plane 0 completes a turn
    assert critical_dimension(100, 4, 100) == 4  # both do
    with pytest.raises(ValueError, match="base"):
        critical_dimension(1.0, 4, 10)


def test_base_bound_closed_forms():
    # d = 4: B(m) = cos m + cos(m/√b); for L = 3 only m = 2 binds: 2/√b ≤ π − 2.
    assert base_lower_bound(4, 3) == pytest.approx((2 / (math.pi - 2)) ** 2, rel=2e-4)
    assert base_lower_bound(4, 4) == pytest.approx((3 / (math.pi - 3)) ** 2, rel=2e-4)
    assert base_lower_bound(4, 2) == 1.0 and base_lower_bound(2, 2) == 1.0
    with pytest.raises(ValueError, match="rotary_dim 2"):
        base_lower_bound(2, 3)  # θ₀ = 1 whatever the base, and cos 2 < 0


def _min_b(bases, d: int, n: int) -> np.ndarray:
    """min over m < n of B(m) = Σ_i cos(m·θ_i), θ_i = base^(−2i/d), per base: every m, float64."""
    theta = np.atleast_1d(np.asarray(bases, dtype=np.float64))[:, None] ** (-np.arange(0, d, 2) / d)
    m = np.arange(n, dtype=np.float64)
    return np.cos(m[None, :, None] * theta[:, None, :]).sum(-1).min(-1)


def test_base_bound_is_a_boundary():
    """At the returned base B(m) ≥ 0 for all m < L and just below it not, by direct evaluation of B."""
    b = base_lower_bound(16, 64, rtol=1e-4)
    assert _min_b(b, 16, 64)[0] >= 0 > _min_b(b * (1 - 3e-4), 16, 64)[0]
    # No smaller feasible base on a grid finer than the scan's.
    assert (_min_b(np.geomspace(1.01, b * 0.999, 2000), 16, 64) < 0).all()


# Men et al. 2024 ("Base of RoPE Bounds Context Length"), Table 2, head dim 128: context → base.
MEN_TABLE_2 = {1024: 4.3e3, 2048: 1.6e4, 4096: 2.7e4, 8192: 8.4e4, 16384: 3.1e5, 32768: 6.4e5, 65536: 2.1e6}


def test_men_et_al_table_2_checked_directly():
    """Which published bases keep B(m) ≥ 0 for every m < L (direct float64 evaluation); bound_holds agrees."""
    holds = {n: bool(_min_b(base, 128, n)[0] >= 0) for n, base in MEN_TABLE_2.items()}
    assert holds == {1024: True, 2048: True, 4096: False, 8192: True, 16384: False, 32768: False, 65536: True}
    assert {n: bound_holds(base, 128, n) for n, base in MEN_TABLE_2.items()} == holds


# (L, the scan's bound to 3 digits, recorded); 1k and 8k are Table 2's to 2 digits, at 2k the table's
# 1.6e4 holds but is not the smallest, at 32k the table's 6.4e5 violates the bound (B(30929) < 0).
@pytest.mark.parametrize(("n", "smallest"), [(1024, 4.29e3), (2048, 1.16e4), (8192, 8.38e4), (32768, 6.30e5)])
def test_base_bound_against_men_et_al_table_2(n, smallest):
    """base_lower_bound at head dim 128 against Table 2 and a direct evaluation of B at and below it."""
    b = base_lower_bound(128, n)
    assert float(f"{b:.2e}") == smallest
    assert _min_b(b, 128, n)[0] >= 0 > _min_b(b * (1 - 3e-4), 128, n)[0]
    if n in (1024, 8192):
        assert float(f"{b:.1e}") == MEN_TABLE_2[n]


@pytest.mark.xfail(strict=True, reason="known gap: the 200-per-decade log grid (1.2 % steps) misses the feasible "
                   "island 26,953–26,973 at 4k and returns 2.86e4 (also 16k and 64k; see docs/results.md)")
def test_base_bound_finds_narrow_feasible_islands():
    """At 4k (d 128) base 26,960 keeps B(m) ≥ 0 by direct evaluation, so the smallest base is at most that."""
    assert _min_b(26960, 128, 4096)[0] >= 0  # rounds to Table 2's 2.7e4, which itself violates
    assert base_lower_bound(128, 4096) <= 26960


# --------------------------------------------------------------------------------------------
# LongRoPE factor search
# --------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def search_setup(tiny):
    model = tiny("llama")
    tokens = data.windows(data.english().split()[1], model, L, n_windows=2)
    return model, tokens


def _search(search_setup, **kw):
    model, tokens = search_setup
    kw = {"population": 4, "generations": 2, "seed": 0, "original_ctx": L0, "tokens": tokens, "progress": False, **kw}
    return search_longrope_factors(model, L, **kw)


def test_search_improves_and_is_monotone(search_setup):
    res = _search(search_setup)
    assert res.perplexity <= res.initial_best
    bests = [h["best"] for h in res.history]
    assert bests == sorted(bests, reverse=True) and len(bests) == 3
    f = np.asarray(res.factors)
    assert (f >= 1).all() and (np.diff(f) >= 0).all() and len(f) == 8
    assert set(res.baselines) == {"PI", "YaRN"} and isinstance(res.variant, LongRoPE)


def test_search_reproduces_and_resumes(search_setup, tmp_path):
    a = _search(search_setup)
    b = _search(search_setup)
    assert (a.factors, a.n_hat, a.perplexity) == (b.factors, b.n_hat, b.perplexity)
    state = tmp_path / "state.json"
    _search(search_setup, generations=1, state_path=state)  # "interrupted" after one generation
    c = _search(search_setup, state_path=state)
    assert (c.factors, c.n_hat, c.perplexity, c.history) == (a.factors, a.n_hat, a.perplexity, a.history)
    with pytest.raises(ValueError, match="other settings"):
        _search(search_setup, seed=1, state_path=state)
    other = _search(search_setup, seed=1)
    assert other.history[0] != a.history[0] or other.factors != a.factors


def test_search_result_roundtrip(search_setup, tmp_path):
    res = _search(search_setup, generations=1)
    res.save(tmp_path / "s.json")
    back = LongRopeSearch.load(tmp_path / "s.json")
    assert back.factors == res.factors and back.history == res.history and back.baselines == res.baselines
    assert len(back.to_frame()) == 2 and back.figure().data
    assert set(res.gain()) == {"PI", "YaRN"}


def test_search_rejects_bad_input(search_setup):
    with pytest.raises(ValueError, match="must exceed original_ctx"):
        _search(search_setup, original_ctx=L)
    with pytest.raises(ValueError, match="population"):
        _search(search_setup, population=1)


def test_cli_context(tiny_dir, capsys):
    import json

    from ropelens.cli import main

    path = str(tiny_dir("llama"))
    assert main(["context", path, "--target", "1024", "--variants", "pi,yarn,dynamic", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["original_ctx"] == 256 and len(out["views"]) == 3
    assert out["views"][0]["interpolated"] == 8 and len(out["views"][1]["planes"]) == 8
    assert main(["context", path, "--target", "1024"]) == 0
    assert "critical dimension" in capsys.readouterr().out
    assert main(["context", path, "--target", "1024", "--variants", "bogus"]) == 2
    assert main(["context", path, "--target", "100"]) == 2


@pytest.mark.parametrize(("d", "n"), [(8, 100), (16, 300), (32, 1000)])
def test_base_bound_search_agrees_with_a_plain_scan(d, n):
    """The hinted search finds the same first feasible grid base as scanning every m for every base."""
    from ropelens.context import _first_violation

    def plain(base):
        m = np.arange(n, dtype=np.float64)[:, None]
        theta = base ** (-np.arange(0, d, 2, dtype=np.float64) / d)
        return bool((np.cos(m * theta).sum(1) >= 0).all())

    grid = [math.exp(k * math.log(10) / 200) for k in range(1, 200 * 7)]
    first = next(b for b in grid if plain(b))
    hint = None
    for b in grid:
        hint = _first_violation(b, d, n, hint)
        assert (hint is None) == plain(b)
        if hint is None:
            assert b == first
            break
    below = grid[grid.index(first) - 1]  # the bound is bisected between the grid points around it
    bound = base_lower_bound(d, n, rtol=1e-4)
    assert below < bound <= first and plain(bound)
