"""Statistics for intervention experiments: paired bootstrap CIs over windows and layer-clustered
permutation tests.

*Paired bootstrap.* An intervention and its baseline run on the same windows, so the effect of
window i is d_i = a_i − b_i and the windows are resampled as pairs: :func:`paired_bootstrap_ci` is
the percentile bootstrap of mean(d) (:func:`ropelens.run.evaluate.percentile_ci` on the
differences).

*Layer-clustered permutation test.* Units (heads, or planes of heads) carry a cluster label (their
layer) and a treatment label (in the chosen set or not). The null hypothesis is that the treatment
labels are exchangeable within clusters: the treated set's statistic is distributed as that of a set
drawn uniformly at random with the same number of units in each cluster. A layer is never compared
with another layer, so depth effects (late layers matter more for the loss) cannot make a set look
special. :func:`clustered_permutation_test` computes the null by permuting labels within clusters
(all assignments when they are few, else ``n_perm`` seeded draws) and :func:`matched_random_sets`
draws such control sets for experiments that must run the model once per set. Monte Carlo p-values
are (1 + #{null ≥ observed}) / (1 + n) (:func:`permutation_p_value`): the observed set counts as one
draw of the null, so the test is valid at every n and never returns 0. See docs/statistics.md.
"""

from __future__ import annotations

import itertools
import math
import numbers
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from jaxtyping import Float
from torch import Tensor

from ropelens.errors import InputError
from ropelens.run.evaluate import Estimate, percentile_ci

__all__ = [
    "MAX_EXACT",
    "PermutationTest",
    "benjamini_hochberg",
    "clustered_permutation_test",
    "control_verdict",
    "distinct_sets",
    "every_matched_set",
    "matched_random_sets",
    "matched_set_count",
    "matched_set_overlap",
    "p_floor",
    "reaching_share_lower_bound",
    "paired_bootstrap_ci",
    "permutation_p_value",
]

MAX_EXACT = 200_000  # within-cluster assignments enumerated exactly; past this, pass n_perm
_ALTERNATIVES = ("greater", "less")


def _vector(x: Any, what: str) -> Tensor:
    try:
        v = torch.as_tensor(x, dtype=torch.float64).flatten()
    except (TypeError, ValueError, RuntimeError) as e:
        raise InputError(f"{what} must be a 1-D sequence of numbers, got {type(x).__name__}") from e
    if v.numel() == 0:
        raise InputError(f"{what} is empty: pass at least one value")
    if not torch.isfinite(v).all():
        raise InputError(
            f"{what} holds non-finite entries (e.g. {v[~torch.isfinite(v)][0].item()}): drop those "
            "windows or fix the run that produced them"
        )
    return v


def _level(level: Any) -> float:
    if isinstance(level, bool) or not isinstance(level, numbers.Real) or not 0 < level < 1:
        raise InputError(
            f"level must be strictly between 0 and 1, got {level!r} (0.95 for a 95% CI)"
        )
    return float(level)


def paired_bootstrap_ci(
    a: Float[Tensor, " n"] | Sequence[float],
    b: Float[Tensor, " n"] | Sequence[float],
    n_boot: int = 2000,
    level: float = 0.95,
    seed: int = 0,
) -> Estimate:
    """Mean of the paired differences ``a − b`` (one pair per window) with its percentile bootstrap
    CI.

    Windows are resampled as pairs, so what the two conditions share (the text of a window) cancels.
    It is :func:`ropelens.run.evaluate.percentile_ci` on the differences d_i = a_i − b_i.

    Args:
        a (Tensor | Sequence[float]): ``[n]`` values under the intervention, one per window.
        b (Tensor | Sequence[float]): ``[n]`` baseline values on the same windows, same order.
        n_boot (int): Bootstrap resamples, at least
            :data:`ropelens.run.evaluate.MIN_BOOT` (100) (default 2000).
        level (float): Confidence level, strictly between 0 and 1 (default 0.95).
        seed (int): Seed of the resampling generator: the same inputs give the same interval.

    Returns:
        Estimate: ``mean`` of the differences with its interval ``lo``, ``hi`` (NaN for a single
        window).

    Raises:
        InputError: If ``a`` and ``b`` differ in length, are empty or hold non-finite values, or
            ``level``, ``n_boot`` or ``seed`` is invalid.

    Examples:
        >>> ablated = [3.1, 2.9, 3.4, 3.0, 3.3, 2.8]  # loss per window
        >>> baseline = [3.0, 2.9, 3.1, 2.9, 3.0, 2.8]
        >>> effect = paired_bootstrap_ci(ablated, baseline)
        >>> print(effect)
        0.1333 [0.03333, 0.2333]
        >>> effect.excludes(0.0)  # the whole 95% interval lies above 0
        True
    """
    va, vb = _vector(a, "a"), _vector(b, "b")
    if va.numel() != vb.numel():
        raise InputError(
            f"a has {va.numel()} values and b {vb.numel()}: a paired CI needs one value of each "
            "per window"
        )
    return percentile_ci(va - vb, n_boot=n_boot, seed=seed, alpha=1 - _level(level))


def permutation_p_value(
    observed: float, null: Sequence[float] | Tensor, alternative: str = "greater"
) -> float:
    """(1 + #{null ≥ observed}) / (1 + n) for ``alternative="greater"`` (≤ for ``"less"``): the
    Monte Carlo p-value of ``observed`` against ``n`` statistics drawn under the null.

    The observed statistic counts as one draw of the null, so the test is valid at every n and the
    p-value is never 0 (at least 1 / (1 + n)). Ties count as extreme, within a few ulps.

    Args:
        observed (float): The statistic of the actual (treated) set.
        null (Sequence[float] | Tensor): ``[n]`` statistics drawn under the null hypothesis.
        alternative (str): ``"greater"`` (default: is ``observed`` unusually large?) or
            ``"less"``.

    Returns:
        float: The p-value, in (0, 1].

    Raises:
        InputError: If ``alternative`` is neither, ``observed`` is not finite, or ``null`` is
            empty or holds non-finite values.

    Examples:
        >>> permutation_p_value(2.0, [0.5, 1.0, 2.5, 1.5])  # (1 + 1) / (1 + 4)
        0.4
        >>> permutation_p_value(0.2, [0.5, 1.0, 2.5, 1.5], alternative="less")  # (1 + 0) / 5
        0.2
    """
    if alternative not in _ALTERNATIVES:
        raise InputError(f"alternative must be one of {_ALTERNATIVES}, got {alternative!r}")
    obs = float(observed)
    if not math.isfinite(obs):
        raise InputError(f"observed must be a finite number, got {observed!r}")
    v = _vector(null, "null")
    return (1 + _count_extreme(v, obs, alternative)) / (1 + v.numel())


def _count_extreme(null: Tensor, observed: float, alternative: str) -> int:
    # a tolerance of a few ulps: a null draw equal to the observed set must count even after
    # re-summation
    tol = 1e-12 * max(1.0, abs(observed))
    hit = null >= observed - tol if alternative == "greater" else null <= observed + tol
    return int(hit.sum())


@dataclass(frozen=True)
class PermutationTest:
    """A permutation test's observed statistic (mean over treated units), its p-value and how the
    null was made.

    Returned by :func:`clustered_permutation_test`.

    Attributes:
        observed (float): Mean of the values over the treated units.
        p_value (float): Exact #{null ≥ observed} / N when ``exact``, else the Monte Carlo
            (1 + #{null ≥ observed}) / (1 + n_perm) (≤ for ``alternative="less"``); NaN where
            ``withheld`` says why.
        n_perm (int): Null draws, or the number of within-cluster assignments when exact.
        exact (bool): Whether every assignment was enumerated.
        alternative (str): ``"greater"`` or ``"less"``.
        p_floor (float): The smallest p-value this null allows: 1 / N exact, 1 / (1 + n_perm)
            drawn.
        n_sets (int): How many distinct within-cluster assignments there are.
        withheld (str): Why ``p_value`` is withheld (empty where it is not): the treated set is
            every unit of its clusters, so the null cannot differ from it
            (:func:`control_verdict`).

    Examples:
        >>> test = clustered_permutation_test(
        ...     [0.9, 0.1, 0.2, 0.8, 0.1, 0.3], clusters=[0, 0, 0, 1, 1, 1],
        ...     treated=[True, False, False, True, False, False])
        >>> round(test.observed, 2), test.exact, test.n_perm
        (0.85, True, 9)
        >>> sorted(test.to_dict())
        ['alternative', 'exact', 'n_perm', 'n_sets', 'observed', 'p_floor', 'p_value', 'withheld']
    """

    observed: float
    p_value: float
    n_perm: int  # null draws, or the number of assignments when exact
    exact: bool
    alternative: str
    p_floor: float = math.nan  # the smallest p-value the null allows
    n_sets: int = 0  # distinct within-cluster assignments there are
    withheld: str = ""  # why p_value is NaN: a null that cannot differ from the treated set

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready fields."""
        return {
            "observed": self.observed,
            "p_value": None if math.isnan(self.p_value) else self.p_value,
            "n_perm": self.n_perm,
            "exact": self.exact,
            "alternative": self.alternative,
            "p_floor": self.p_floor,
            "n_sets": self.n_sets,
            "withheld": self.withheld,
        }


def _clusters(clusters: Sequence[Hashable], treated: Any, n: int) -> list[tuple[np.ndarray, int]]:
    """Per cluster: its units' indices and how many of them are treated."""
    if len(clusters) != n:
        raise InputError(
            f"clusters has {len(clusters)} labels for {n} values: give one cluster label per unit"
        )
    t = np.asarray(treated)
    if t.shape != (n,) or t.dtype != bool:
        raise InputError(
            f"treated must be {n} booleans (one per unit), got shape {t.shape} dtype {t.dtype}"
        )
    if not t.any():
        raise InputError("treated marks no unit: the test needs at least one treated unit")
    out = []
    for c in dict.fromkeys(clusters):
        idx = np.array([i for i, ci in enumerate(clusters) if ci == c])
        k = int(t[idx].sum())
        if k:
            out.append((idx, k))
    return out


def clustered_permutation_test(
    values: Float[Tensor, " n"] | Sequence[float],
    clusters: Sequence[Hashable],
    treated: Sequence[bool] | np.ndarray | Tensor,
    n_perm: int | None = None,
    seed: int = 0,
    alternative: str = "greater",
) -> PermutationTest:
    """Is the mean of ``values`` over the ``treated`` units larger (``"less"``: smaller) than for
    random sets with as many units in every cluster?

    Null: the treatment labels are exchangeable within clusters (layers). ``n_perm=None`` enumerates
    every within-cluster assignment (at most :data:`MAX_EXACT`) and returns the exact p-value #{stat
    ≥ observed} / N; an int below the number of assignments draws ``n_perm`` of them from a
    generator seeded with ``seed`` and returns (1 + #{stat ≥ observed}) / (1 + n_perm).

    A layer is never compared with another layer, so depth effects (late layers matter more for
    the loss) cannot make a set look special. Clusters without a treated unit take no part.

    Args:
        values (Tensor | Sequence[float]): ``[n]`` statistic of each unit (head, or plane of a
            head), e.g. the loss increase when it is knocked out.
        clusters (Sequence[Hashable]): ``[n]`` cluster label of each unit (its layer).
        treated (Sequence[bool] | ndarray | Tensor): ``[n]`` booleans: the chosen set; at least
            one True.
        n_perm (int | None): Monte Carlo draws; None (default) enumerates exactly.
        seed (int): Seed of the Monte Carlo generator.
        alternative (str): ``"greater"`` (default) or ``"less"``.

    Where there are no more assignments than ``n_perm`` draws, every one is counted instead (the
    exact test): draws would repeat them, claiming a floor 1 / (1 + n_perm) finer than the null can
    resolve. A null that cannot differ from the treated set (it is every unit of its clusters, so
    the only assignment is the set itself) withholds its p-value: NaN, with the reason in
    ``withheld``, never a p of 1 from the set compared with itself.

    Returns:
        PermutationTest: The observed mean, the p-value, its floor and how the null was made.

    Raises:
        InputError: If the lengths differ, ``treated`` is not booleans or marks no unit,
            ``alternative``, ``n_perm`` or ``seed`` is invalid, or ``n_perm`` is None and there
            are more than :data:`MAX_EXACT` assignments (the message says to pass ``n_perm``).

    Examples:
        >>> values = [0.9, 0.1, 0.2, 0.8, 0.1, 0.3]  # 3 heads in each of 2 layers
        >>> layers = [0, 0, 0, 1, 1, 1]
        >>> chosen = [True, False, False, True, False, False]
        >>> test = clustered_permutation_test(values, layers, chosen)
        >>> test.n_perm, round(test.p_value, 4)  # 3 × 3 assignments; the chosen set is the top
        (9, 0.1111)
        >>> drawn = clustered_permutation_test(values, layers, chosen, n_perm=999)
        >>> drawn.exact, round(drawn.p_value, 4)  # 999 draws of 9 sets would repeat: all 9 counted
        (True, 0.1111)
        >>> every = [True, True, True, False, False, False]  # all of layer 0: it cannot differ
        >>> clustered_permutation_test(values, layers, every).withheld[:48]
        'the permutation null cannot differ from the test'
    """
    v = _vector(values, "values")
    t = np.asarray(treated.cpu() if isinstance(treated, Tensor) else treated)
    groups = _clusters(list(clusters), t, v.numel())
    if alternative not in _ALTERNATIVES:
        raise InputError(f"alternative must be one of {_ALTERNATIVES}, got {alternative!r}")
    total = sum(k for _, k in groups)
    observed = float(v[torch.from_numpy(np.flatnonzero(t))].sum()) / total
    n_exact = math.prod(math.comb(len(idx), k) for idx, k in groups)
    if n_perm is not None and (
        isinstance(n_perm, bool) or not isinstance(n_perm, numbers.Integral) or n_perm < 1
    ):
        raise InputError(
            f"n_perm must be a positive int or None (exact), got {n_perm!r} (9999 is usual)"
        )
    # fewer assignments than draws: the draws would repeat them, so every one is counted instead
    if n_perm is None or n_exact <= n_perm:
        if n_exact > MAX_EXACT:
            raise InputError(
                f"{n_exact:,} within-cluster assignments are too many to enumerate (limit "
                f"{MAX_EXACT:,}): pass n_perm (e.g. 9999) for a Monte Carlo test"
            )
        sums = [
            torch.tensor(
                [float(v[list(c)].sum()) for c in itertools.combinations(idx.tolist(), k)],
                dtype=torch.float64,
            )
            for idx, k in groups
        ]
        null = sums[0]
        for s in sums[1:]:
            null = (null[:, None] + s[None, :]).flatten()
        null = null / total
        why = control_verdict(n_exact, n_exact, n_exact, "the permutation null")
        return PermutationTest(
            observed,
            math.nan if why else _count_extreme(null, observed, alternative) / null.numel(),
            int(null.numel()),
            True,
            alternative,
            p_floor=1 / n_exact,
            n_sets=n_exact,
            withheld=why,
        )
    if isinstance(seed, bool) or not isinstance(seed, numbers.Integral):
        raise InputError(f"seed must be an int, got {seed!r}")
    g = torch.Generator().manual_seed(int(seed))
    null = torch.zeros(int(n_perm), dtype=torch.float64)
    for idx, k in groups:
        # a uniform random k-subset of the cluster per draw: the first k of a random permutation
        pick = torch.rand(int(n_perm), len(idx), generator=g).argsort(dim=1)[:, :k]
        null += v[torch.from_numpy(idx)][pick].sum(dim=1)
    null = null / total
    return PermutationTest(
        observed,
        permutation_p_value(observed, null, alternative),
        int(n_perm),
        False,
        alternative,
        p_floor=p_floor(int(n_perm)),
        n_sets=n_exact,
    )


def _units_per_cluster(treated: Sequence[tuple[int, int]]) -> dict[int, int]:
    """How many of ``treated``'s (cluster, unit) pairs each cluster holds, in first-seen order."""
    counts: dict[int, int] = {}
    for c, _ in treated:
        counts[c] = counts.get(c, 0) + 1
    return counts


def matched_random_sets(
    treated: Sequence[tuple[int, int]],
    population: Mapping[int, Sequence[int]],
    n_sets: int,
    seed: int = 0,
) -> list[tuple[tuple[int, int], ...]]:
    """``n_sets`` random sets of (cluster, unit) pairs with as many units in each cluster as
    ``treated`` has, each drawn uniformly without replacement from ``population[cluster]`` (one
    seeded generator, in cluster order).

    These are draws of the within-cluster permutation null of :func:`clustered_permutation_test`: a
    draw may coincide with the treated set, as the null allows.

    Args:
        treated (Sequence[tuple[int, int]]): The chosen (cluster, unit) pairs, e.g. (layer, head).
        population (Mapping[int, Sequence[int]]): Every unit of each cluster, treated ones
            included.
        n_sets (int): How many control sets to draw (≥ 1).
        seed (int): Seed of the generator.

    Returns:
        list[tuple[tuple[int, int], ...]]: ``n_sets`` control sets, each sorted (cluster, unit)
        pairs.

    Raises:
        InputError: If ``n_sets`` is not a positive int, ``treated`` is empty, or a cluster has
            fewer units in ``population`` than treated ones.

    Examples:
        >>> heads = {0: [0, 1, 2, 3], 1: [0, 1, 2, 3]}  # 4 heads in each of 2 layers
        >>> sets = matched_random_sets([(0, 1), (1, 2)], heads, n_sets=3)
        >>> len(sets), [sorted({layer for layer, _ in s}) for s in sets]
        (3, [[0, 1], [0, 1], [0, 1]])
    """
    if isinstance(n_sets, bool) or not isinstance(n_sets, numbers.Integral) or n_sets < 1:
        raise InputError(f"n_sets must be a positive int, got {n_sets!r}")
    counts = _units_per_cluster(treated)
    if not counts:
        raise InputError("treated is empty: pass at least one (layer, head)")
    for c, k in counts.items():
        have = len(population.get(c, ()))
        if have < k:
            raise InputError(
                f"cluster {c} has {k} treated units but only {have} to draw from: the population "
                "must hold every unit of the cluster, treated ones included"
            )
    rng = np.random.default_rng(int(seed))
    out = []
    for _ in range(int(n_sets)):
        drawn = [
            (c, int(u))
            for c in sorted(counts)
            for u in rng.choice(list(population[c]), counts[c], replace=False)
        ]
        out.append(tuple(sorted(drawn)))
    return out


def every_matched_set(
    treated: Sequence[tuple[int, int]], population: Mapping[int, Sequence[int]]
) -> list[tuple[tuple[int, int], ...]]:
    """Every set :func:`matched_random_sets` can draw for ``treated``, each once, ``treated``
    among them: the whole within-cluster permutation null, for pools small enough to enumerate
    (:func:`matched_set_count` says how many).

    Args:
        treated (Sequence[tuple[int, int]]): The chosen (cluster, unit) pairs.
        population (Mapping[int, Sequence[int]]): Every unit of each cluster, treated ones
            included.

    Returns:
        list[tuple[tuple[int, int], ...]]: Each set as sorted (cluster, unit) pairs, in
        lexicographic order.

    Examples:
        >>> every_matched_set([(0, 1), (1, 2)], {0: range(2), 1: range(2)})
        [((0, 0), (1, 0)), ((0, 0), (1, 1)), ((0, 1), (1, 0)), ((0, 1), (1, 1))]
    """
    counts = _units_per_cluster(treated)
    per_cluster = [
        [
            tuple((c, int(u)) for u in pick)
            for pick in itertools.combinations(sorted(population[c]), k)
        ]
        for c, k in sorted(counts.items())
    ]
    return [tuple(sorted(itertools.chain(*parts))) for parts in itertools.product(*per_cluster)]


def p_floor(n_draws: int) -> float:
    """The smallest p-value ``n_draws`` null draws allow, 1 / (1 + n_draws): a p-value at this
    floor says only that no draw reached the observed set.

    Args:
        n_draws (int): Null draws (≥ 0).

    Returns:
        float: 1 / (1 + ``n_draws``).

    Raises:
        InputError: If ``n_draws`` is not an int ≥ 0.

    Examples:
        >>> p_floor(9), p_floor(999)
        (0.1, 0.001)
    """
    if isinstance(n_draws, bool) or not isinstance(n_draws, numbers.Integral) or n_draws < 0:
        raise InputError(f"n_draws must be an int >= 0, got {n_draws!r}")
    return 1 / (1 + int(n_draws))


def matched_set_count(
    treated: Sequence[tuple[int, int]], population: Mapping[int, Sequence[int]]
) -> int:
    """How many distinct sets :func:`matched_random_sets` can draw for ``treated``: the product over
    clusters of C(units in the cluster, treated units in it). 1 means the only such set is
    ``treated`` itself.

    Args:
        treated (Sequence[tuple[int, int]]): The chosen (cluster, unit) pairs.
        population (Mapping[int, Sequence[int]]): Every unit of each cluster, treated ones
            included.

    Returns:
        int: The number of distinct matched sets, ``treated`` among them.

    Examples:
        >>> matched_set_count([(0, 1), (1, 2)], {0: range(4), 1: range(4)})  # 4 · 4
        16
        >>> matched_set_count([(0, 0), (0, 1)], {0: range(2)})  # every unit: the set itself
        1
    """
    counts = _units_per_cluster(treated)
    return math.prod(math.comb(len(population.get(c, ())), k) for c, k in counts.items())


def matched_set_overlap(
    treated: Sequence[tuple[int, int]], population: Mapping[int, Sequence[int]]
) -> float:
    """The share of ``treated`` that a set :func:`matched_random_sets` draws holds on average:
    drawing k of a cluster's n units holds k·k/n of its k treated ones in expectation
    (hypergeometric), summed over clusters and divided by the treated count. A set that fills its
    clusters shares most of itself with every draw, which then cannot tell it apart.

    Args:
        treated (Sequence[tuple[int, int]]): The chosen (cluster, unit) pairs.
        population (Mapping[int, Sequence[int]]): Every unit of each cluster, treated ones
            included.

    Returns:
        float: In (0, 1]; 1 where the only matched set is ``treated`` itself.

    Examples:
        >>> matched_set_overlap([(0, 1), (1, 2)], {0: range(4), 1: range(4)})  # 1/4 in each
        0.25
        >>> matched_set_overlap([(5, 0), (5, 1), (5, 2), (7, 0)], {5: range(4), 7: range(4)})
        0.625
    """
    counts = _units_per_cluster(treated)
    held = sum(k * k / len(population[c]) for c, k in counts.items())
    return held / len(treated)


def reaching_share_lower_bound(reached: int, n_draws: int, confidence: float = 0.95) -> float:
    """One-sided Clopper–Pearson lower bound on the share of random sets that reach the tested
    set, from ``reached`` of ``n_draws`` draws that did: the smallest share s at which ``reached``
    or more of ``n_draws`` would be seen with probability ``1 − confidence``. Where it lies above
    alpha, more draws would not bring the permutation p below alpha (with that confidence); where
    it does not, they might.

    Args:
        reached (int): Draws at least as extreme as the tested set.
        n_draws (int): Draws in all.
        confidence (float): One-sided confidence of the bound.

    Returns:
        float: The bound, 0 where no draw reached the set.

    Examples:
        >>> round(reaching_share_lower_bound(1, 1), 4)  # s = 0.05
        0.05
        >>> round(reaching_share_lower_bound(2, 49), 4)  # 2 of 49 reach it: it may be 0.7%
        0.0073
        >>> round(reaching_share_lower_bound(13, 49), 3)  # 13 of 49: at least 16.5%
        0.165
    """
    if reached <= 0:
        return 0.0
    reached, n = min(int(reached), int(n_draws)), int(n_draws)
    target = 1.0 - confidence

    def at_least(share: float) -> float:  # P(X ≥ reached) for X ~ Binomial(n, share)
        if share <= 0.0:
            return 0.0
        if share >= 1.0:
            return 1.0
        below = 0.0
        for i in range(reached):
            log_term = (
                math.lgamma(n + 1) - math.lgamma(i + 1) - math.lgamma(n - i + 1)
                + i * math.log(share) + (n - i) * math.log1p(-share)
            )  # fmt: skip
            below += math.exp(log_term)
        return 1.0 - below

    lo, hi = 0.0, 1.0
    for _ in range(80):  # the tail grows with the share: bisect to float precision
        mid = (lo + hi) / 2
        if at_least(mid) < target:
            lo = mid
        else:
            hi = mid
    return hi


def distinct_sets(sets: Sequence[Any]) -> int:
    """How many distinct sets (or other hashable draws) ``sets`` holds.

    Args:
        sets (Sequence[Any]): The drawn sets, each hashable (a tuple of pairs).

    Returns:
        int: How many of them differ.

    Examples:
        >>> distinct_sets([((0, 1),), ((0, 1),), ((0, 2),)])
        2
    """
    return len(set(sets))


def control_verdict(n_possible: int, n_draws: int, n_distinct: int, control: str) -> str:
    """Why a control's p-value must be withheld, or "" where it may be stated.

    A control that cannot differ from the tested set (``n_possible`` is 1: the set is the whole
    pool, so every draw is the set itself) gives p = 1 by construction; one with fewer distinct sets
    than ``n_draws`` repeats its draws, so its floor 1 / (1 + n_draws) claims a resolution it lacks.
    Either is named, with its count of distinct sets, instead of a p-value.

    Args:
        n_possible (int): How many distinct control sets exist (the tested set included).
        n_draws (int): How many were drawn.
        n_distinct (int): How many distinct ones the draws hold.
        control (str): The control in words ("the random head sets").

    Returns:
        str: The reason, or "" where the control can differ and has as many sets as draws.

    Examples:
        >>> control_verdict(1, 9, 1, "the random head sets")[:58]
        'the random head sets cannot differ from the tested set: it'
        >>> control_verdict(4, 9, 4, "the random head sets")[:58]
        'the random head sets cannot resolve a p-value from 9 draws'
        >>> control_verdict(24, 9, 9, "the random head sets")
        ''
    """
    if n_draws < 1:
        return ""
    sets = f"{n_distinct} distinct set{'' if n_distinct == 1 else 's'}"
    if n_possible <= 1:
        return (
            f"{control} cannot differ from the tested set: it is the whole pool, so each of the "
            f"{n_draws} draws is the set itself ({sets})"
        )
    if n_possible < n_draws:
        return (
            f"{control} cannot resolve a p-value from {n_draws} draws: only {n_possible} distinct "
            f"sets exist, so the draws repeat ({sets} drawn); draw at most {n_possible}, or test "
            "a set from a larger pool"
        )
    return ""


def benjamini_hochberg(p_values: Sequence[float]) -> list[float]:
    """Benjamini–Hochberg adjusted p-values (false discovery rate), in the order given; NaN entries
    (withheld p-values) stay NaN and do not count among the tests.

    The adjusted value of the i-th smallest of m p-values is min over j ≥ i of p_(j) · m / j,
    capped at 1: a test is a discovery at FDR level q where its adjusted p is ≤ q.

    Args:
        p_values (Sequence[float]): Raw p-values in [0, 1], or NaN.

    Returns:
        list[float]: The adjusted p-values, same order and length.

    Raises:
        InputError: If a p-value is outside [0, 1].

    Examples:
        >>> benjamini_hochberg([0.01, 0.04, 0.03, float("nan")])  # m = 3 stated
        [0.03, 0.04, 0.04, nan]
    """
    p = [float(x) for x in p_values]
    bad = [x for x in p if not math.isnan(x) and not 0 <= x <= 1]
    if bad:
        raise InputError(f"p-values must lie in [0, 1], got {bad[0]!r}")
    stated = sorted((x, i) for i, x in enumerate(p) if not math.isnan(x))
    m = len(stated)
    out = [math.nan] * len(p)
    running = 1.0
    for rank in range(m, 0, -1):
        x, i = stated[rank - 1]
        running = min(running, x * m / rank)
        out[i] = running
    return out
