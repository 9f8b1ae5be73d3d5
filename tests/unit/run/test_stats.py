"""Statistics: bootstrap coverage and the closed-form CI, the clustered permutation test's size,
power and exact p."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from ropelens.errors import InputError
from ropelens.run.evaluate import bootstrap_ci, percentile_ci
from ropelens.run.stats import (
    clustered_permutation_test,
    every_matched_set,
    matched_random_sets,
    matched_set_count,
    paired_bootstrap_ci,
    permutation_p_value,
)


def _binomial_band(p: float, n: int, z: float = 3.5) -> float:
    return z * math.sqrt(p * (1 - p) / n)


def test_paired_bootstrap_covers_the_true_mean_difference_near_the_nominal_rate():
    """500 seeded samples of 60 paired windows: the 95% interval holds the true difference about 95%
    of the time."""
    rng = np.random.default_rng(0)
    reps, n, true = 500, 60, 0.3
    hits = 0
    for r in range(reps):
        shared = rng.normal(size=n)  # what both conditions share (the text) cancels in the pairs
        a = shared + true + rng.normal(scale=0.5, size=n)
        b = shared + rng.normal(scale=0.5, size=n)
        est = paired_bootstrap_ci(a, b, n_boot=1000, level=0.95, seed=r)
        hits += est.lo <= true <= est.hi
    assert abs(hits / reps - 0.95) <= _binomial_band(0.95, reps), hits / reps


def test_bootstrap_ci_of_a_mean_matches_the_normal_interval_for_large_n():
    """n = 20,000 normal values: mean ± 1.96·s/√n, to 8% of the half-width."""
    x = torch.from_numpy(np.random.default_rng(1).normal(2.0, 3.0, size=20_000))
    est = percentile_ci(x, n_boot=4000, seed=0, alpha=0.05)
    half = 1.959964 * float(x.std()) / math.sqrt(x.numel())
    assert est.mean == pytest.approx(float(x.mean()), abs=1e-12)
    assert est.lo == pytest.approx(float(x.mean()) - half, abs=0.08 * half)
    assert est.hi == pytest.approx(float(x.mean()) + half, abs=0.08 * half)


def test_paired_ci_is_the_ci_of_the_differences_and_bootstrap_ci_is_unchanged():
    a = torch.tensor([1.0, 2.5, 0.5, 4.0, 3.0])
    b = torch.tensor([0.5, 2.0, 1.0, 3.0, 1.0])
    est = paired_bootstrap_ci(a, b, n_boot=500, seed=3)
    assert est.mean == pytest.approx(float((a - b).mean()))
    assert est == percentile_ci(a - b, n_boot=500, seed=3)
    assert est.lo <= est.mean <= est.hi
    loss = bootstrap_ci(
        a, n_boot=500, seed=3
    )  # the loss CI is this percentile CI, mapped through exp for perplexity
    assert loss.loss == percentile_ci(a, n_boot=500, seed=3)
    assert loss.perplexity.lo == pytest.approx(math.exp(loss.loss.lo))


def test_paired_ci_refuses_unpaired_or_bad_input():
    with pytest.raises(InputError, match="one value of each per window"):
        paired_bootstrap_ci([1.0, 2.0], [1.0])
    with pytest.raises(InputError, match="level must be strictly between 0 and 1"):
        paired_bootstrap_ci([1.0, 2.0], [1.0, 0.0], level=95)
    with pytest.raises(InputError, match="non-finite"):
        paired_bootstrap_ci([1.0, float("nan")], [1.0, 0.0])


def _layers(n_layers: int, per_layer: int) -> list[int]:
    return [L for L in range(n_layers) for _ in range(per_layer)]


def test_p_value_is_exact_enumeration_on_a_tiny_case():
    """Two clusters of 3 and 4 units, 1 and 2 treated: 3·6 = 18 assignments, counted here by brute
    force."""
    values = [0.3, 1.2, -0.4, 0.9, 2.0, 0.1, 1.5]
    clusters = [0, 0, 0, 1, 1, 1, 1]
    treated = np.array([False, True, False, False, True, False, True])
    obs = (1.2 + 2.0 + 1.5) / 3
    stats = [
        (values[i] + values[j] + values[k]) / 3
        for i in range(3)
        for j, k in itertools.combinations(range(3, 7), 2)
    ]
    assert len(stats) == 18
    want = sum(s >= obs - 1e-12 for s in stats) / 18
    got = clustered_permutation_test(values, clusters, treated)
    assert got.exact and got.n_perm == 18
    assert got.observed == pytest.approx(obs)
    assert got.p_value == pytest.approx(want)
    less = clustered_permutation_test(values, clusters, treated, alternative="less")
    assert less.p_value == pytest.approx(sum(s <= obs + 1e-12 for s in stats) / 18)
    # Monte Carlo draws converge on the exact value
    mc = clustered_permutation_test(values, clusters, treated, n_perm=20_000, seed=0)
    assert mc.p_value == pytest.approx(want, abs=0.01)


def test_permutation_test_rejects_at_its_nominal_rate_without_an_effect():
    """Null data (no effect), 3 treated of 8 units in each of 4 layers, layers of different means:
    over 600 seeded simulations p ≤ 0.05 about 5% of the time."""
    rng = np.random.default_rng(2)
    clusters = _layers(4, 8)
    reps, rejections = 600, 0
    for r in range(reps):
        values = rng.normal(size=32) + np.repeat([0.0, 1.0, 3.0, 10.0], 8)
        treated = np.zeros(32, dtype=bool)
        for L in range(4):
            treated[L * 8 + rng.choice(8, 3, replace=False)] = True
        rejections += (
            clustered_permutation_test(values, clusters, treated, n_perm=199, seed=r).p_value
            <= 0.05
        )
    assert abs(rejections / reps - 0.05) <= _binomial_band(0.05, reps), rejections / reps


def test_permutation_test_rejects_a_strong_effect():
    rng = np.random.default_rng(3)
    clusters = _layers(4, 8)
    treated = np.zeros(32, dtype=bool)
    treated[[0, 1, 8, 9, 16, 17, 24, 25]] = True
    values = rng.normal(size=32) + 3.0 * treated
    t = clustered_permutation_test(values, clusters, treated, n_perm=999, seed=0)
    assert t.p_value == pytest.approx(
        1 / 1000
    )  # no draw reaches it: the smallest p the correction allows
    assert (
        clustered_permutation_test(
            -values, clusters, treated, n_perm=999, seed=0, alternative="less"
        ).p_value
        < 0.01
    )


def test_clustering_keeps_a_layer_effect_from_passing_as_a_set_effect():
    """Treated units sit in the layer with the largest values but are typical there: a pooled test
    would reject, the layer-clustered one does not."""
    rng = np.random.default_rng(4)
    values = rng.normal(size=40) + np.repeat([0.0, 0.0, 0.0, 5.0], 10)
    treated = np.zeros(40, dtype=bool)
    treated[30:33] = True
    clustered = clustered_permutation_test(values, _layers(4, 10), treated, n_perm=999, seed=0)
    pooled = clustered_permutation_test(values, [0] * 40, treated, n_perm=999, seed=0)
    assert pooled.p_value < 0.05 < clustered.p_value


def test_monte_carlo_p_value_counts_the_observed_draw():
    assert permutation_p_value(1.0, [0.0, 0.5, 2.0, 1.0]) == pytest.approx((1 + 2) / 5)
    assert permutation_p_value(1.0, [0.0, 0.5, 2.0, 1.0], alternative="less") == pytest.approx(
        (1 + 3) / 5
    )
    assert permutation_p_value(10.0, [0.0] * 19) == pytest.approx(0.05)


def test_matched_random_sets_keep_the_count_per_layer_and_are_seeded():
    treated = [(0, 1), (0, 3), (2, 0)]
    population = {0: range(6), 2: range(4)}
    sets = matched_random_sets(treated, population, 50, seed=7)
    assert sets == matched_random_sets(treated, population, 50, seed=7)
    for s in sets:
        assert (
            [L for L, _ in s].count(0) == 2 and [L for L, _ in s].count(2) == 1 and len(set(s)) == 3
        )
    assert len(set(sets)) > 1
    with pytest.raises(InputError, match="cluster 2 has 1 treated units but only 0"):
        matched_random_sets(treated, {0: range(6)}, 5)


@settings(max_examples=40, deadline=None)
@given(st.data())
def test_every_matched_set_is_the_whole_pool_the_draws_come_from(data):
    sizes = data.draw(st.lists(st.integers(1, 5), min_size=1, max_size=3))
    population = {2 * c: range(n) for c, n in enumerate(sizes)}
    treated = [
        (c, u)
        for c, n in population.items()
        for u in data.draw(st.lists(st.integers(0, len(n) - 1), max_size=len(n), unique=True))
    ]
    if not treated:
        return
    every = every_matched_set(treated, population)
    assert len(every) == len(set(every)) == matched_set_count(treated, population)
    assert tuple(sorted(treated)) in every
    count = [L for L, _ in treated]
    assert all(sorted(L for L, _ in s) == sorted(count) for s in every)
    assert set(matched_random_sets(treated, population, 200, seed=3)) <= set(every)


def test_permutation_test_refuses_bad_input():
    with pytest.raises(InputError, match="one cluster label per unit"):
        clustered_permutation_test([1.0, 2.0], [0], [True, False])
    with pytest.raises(InputError, match="marks no unit"):
        clustered_permutation_test([1.0, 2.0], [0, 0], [False, False])
    with pytest.raises(InputError, match="pass n_perm"):
        clustered_permutation_test(np.zeros(60), [0] * 60, np.arange(60) < 30)
    with pytest.raises(InputError, match="alternative must be one of"):
        clustered_permutation_test([1.0, 2.0], [0, 0], [True, False], alternative="two")
