"""The claims' decision rule on made-up numbers, at each boundary: a claim whose controls cannot
separate it is inconclusive, never holds."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ropelens.claims import (
    DOES_NOT_HOLD,
    HOLDS,
    INCONCLUSIVE,
    NOT_APPLICABLE,
    ControlOutcome,
    adjust_rows,
    control_outcome,
    decide,
)
from ropelens.claims.result import ClaimRow
from ropelens.errors import InputError
from ropelens.run.stats import benjamini_hochberg, reaching_share_lower_bound


def _control(p: float, n: int = 99, withheld: str = "", adjusted: float | None = None):
    return ControlOutcome(
        "random planes, same heads",
        -0.1,
        -0.2,
        0.0,
        p,
        p if adjusted is None else adjusted,
        1 / (1 + n),
        n,
        n,
        10**6,
        withheld,
    )


# a knockout that lowers its metric: effect −0.5 [−0.6, −0.4]
LESS = ("less", 0.0, -0.5, -0.6, -0.4)


def test_holds_when_the_ci_excludes_zero_and_every_resolving_control_is_beaten():
    verdict, reason = decide(*LESS, [_control(0.01), _control(0.02)])
    assert verdict == HOLDS
    assert "beyond random planes" in reason


def test_does_not_hold_when_a_control_reaches_the_set_too_often_for_more_draws_to_help():
    # 10 of 99 draws as harmful: p = 11/100; at least 5.6% of random sets do (95% lower bound)
    verdict, reason = decide(*LESS, [_control(0.01), _control(0.11)])
    assert verdict == DOES_NOT_HOLD
    assert "10 of 99 draws" in reason and "at least 0.0558 of such sets do" in reason


def test_a_control_reached_by_a_few_draws_is_inconclusive():
    # 9 of 99: the lower bound 4.8% is not above alpha, so more draws could still separate it;
    # 4 of 99 (p = 5/100, adjusted above alpha) likewise
    for p, reached, bound in ((0.10, 9, "0.0482"), (0.05, 4, "0.0139")):
        verdict, reason = decide(*LESS, [_control(0.01), _control(p, adjusted=max(p, 0.06))])
        assert verdict == INCONCLUSIVE, (p, reason)
        assert f"{reached} of 99 draws" in reason and f"as few as {bound}" in reason


@pytest.mark.parametrize(("n", "first_decisive"), [(39, 5), (49, 6), (99, 10)])
def test_the_boundary_between_inconclusive_and_does_not_hold(n, first_decisive):
    """At each budget's draw count: one draw fewer reaching the set than the first count whose
    lower bound exceeds alpha is inconclusive."""
    for reached, verdict in ((first_decisive - 1, INCONCLUSIVE), (first_decisive, DOES_NOT_HOLD)):
        p = (1 + reached) / (1 + n)
        assert decide(*LESS, [_control(p, n=n)])[0] == verdict, (n, reached)


def test_the_lower_bound_against_the_binomial_tail():
    """Clopper–Pearson: at the bound, seeing at least k of n has probability 0.05 exactly."""
    for k, n in ((1, 49), (6, 49), (10, 99), (29, 49), (49, 49)):
        s = reaching_share_lower_bound(k, n)
        tail = sum(math.comb(n, i) * s**i * (1 - s) ** (n - i) for i in range(k, n + 1))
        assert tail == pytest.approx(0.05, abs=1e-9), (k, n)
    assert reaching_share_lower_bound(0, 49) == 0.0


def test_at_alpha_exactly_the_control_is_beaten():
    assert decide(*LESS, [_control(0.05)])[0] == HOLDS
    assert decide(*LESS, [_control(0.0500001, n=199)])[0] == INCONCLUSIVE  # 9 of 199 reach it


def test_a_control_at_its_floor_above_alpha_only_after_adjustment_is_inconclusive():
    # 19 draws: floor 0.05, no draw reaches the set, BH lifts it to 0.1
    verdict, reason = decide(*LESS, [_control(0.05, n=19, adjusted=0.1)])
    assert verdict == INCONCLUSIVE
    assert "more draws" in reason


def test_controls_that_cannot_separate_are_inconclusive_never_holds():
    # floor 0.1 (9 draws) above alpha, and a control withheld as the whole pool
    few = _control(0.1, n=9)
    pool = _control(math.nan, withheld="random heads cannot differ from the tested set")
    verdict, reason = decide(*LESS, [few, pool])
    assert verdict == INCONCLUSIVE
    assert "no control can separate" in reason and "cannot differ" in reason
    assert decide(*LESS, [])[0] == INCONCLUSIVE  # controlled, but none drawn


def test_a_withheld_control_beside_a_beaten_one_does_not_block_holds():
    pool = _control(math.nan, withheld="only 64 distinct sets exist")
    verdict, reason = decide(*LESS, [_control(0.01), pool])
    assert verdict == HOLDS
    assert "cannot resolve" in reason


@pytest.mark.parametrize(
    ("lo", "hi", "verdict"),
    [
        (-0.6, -1e-9, HOLDS),  # just below 0
        (-0.6, 0.0, INCONCLUSIVE),  # touches 0
        (-0.6, 0.2, INCONCLUSIVE),  # across 0
        (0.0, 0.2, INCONCLUSIVE),  # touches 0 from the wrong side
        (1e-9, 0.2, DOES_NOT_HOLD),  # wholly on the wrong side
    ],
)
def test_the_ci_against_the_threshold(lo, hi, verdict):
    assert decide("less", 0.0, (lo + hi) / 2, lo, hi, [_control(0.01)])[0] == verdict


def test_greater_direction_and_a_threshold():
    assert decide("greater", 0.5, 0.7, 0.6, 0.8, [], controlled=False)[0] == HOLDS
    assert decide("greater", 0.5, 0.45, 0.4, 0.49, [], controlled=False)[0] == DOES_NOT_HOLD
    assert decide("greater", 0.5, 0.55, 0.49, 0.6, [], controlled=False)[0] == INCONCLUSIVE


def test_not_applicable_missing_numbers_and_a_failed_second_condition():
    assert decide(*LESS, [], not_applicable="no positional heads found") == (
        NOT_APPLICABLE,
        "no positional heads found",
    )
    assert decide("less", 0.0, math.nan, math.nan, math.nan, [])[0] == INCONCLUSIVE
    assert decide("less", 0.0, -0.5, math.nan, math.nan, [], controlled=False)[0] == INCONCLUSIVE
    verdict, reason = decide(*LESS, [], controlled=False, fails="NoPE costs only +0.01 nats")
    assert verdict == DOES_NOT_HOLD and "NoPE" in reason


def test_control_outcome_counts_draws_at_least_as_extreme():
    # claimed −0.5; draws −0.6 and −0.5 reach it (≤ for "less"), −0.1 does not: p = (1 + 2) / 4
    c = control_outcome("x", -0.5, [-0.6, -0.5, -0.1], [1, 2, 3], 1000, "less")
    assert c.p == pytest.approx(0.75)
    assert c.p_floor == pytest.approx(0.25)
    assert c.effect == pytest.approx(-0.4)
    up = control_outcome("x", 0.5, [0.6, 0.1, 0.2], [1, 2, 3], 1000, "greater")
    assert up.p == pytest.approx(0.5)


def test_control_outcome_withholds_p_where_the_pool_is_too_small():
    # 3 draws of a pool with 2 sets: the draws repeat
    c = control_outcome("random heads", -0.5, [-0.1, -0.2, -0.1], [1, 2, 1], 2, "less")
    assert math.isnan(c.p) and c.n_distinct == 2 and "only 2 distinct sets" in c.withheld
    whole = control_outcome("random heads", -0.5, [-0.5] * 4, [1] * 4, 1, "less")
    assert math.isnan(whole.p) and "cannot differ" in whole.withheld


def _row(name: str, p: float, n: int = 99) -> ClaimRow:
    return ClaimRow(
        name, "c", "s", "", "m", "metric", "less", 0.0, 1.0, -0.5, -0.6, -0.4, "",
        (_control(p, n),), INCONCLUSIVE, "", 8, n, 1.0, {},
    )  # fmt: skip


def test_adjust_rows_applies_bh_across_claims_and_decides_again():
    rows = adjust_rows([_row("a", 0.01), _row("b", 0.04), _row("c", 0.03)], alpha=0.05)
    want = benjamini_hochberg([0.01, 0.04, 0.03])
    assert [r.controls[0].p_adjusted for r in rows] == pytest.approx(want)
    assert want == pytest.approx([0.03, 0.04, 0.04])  # by hand: 0.01·3/1, 0.04·3/3, 0.03·3/2
    assert [r.verdict for r in rows] == [HOLDS, HOLDS, HOLDS]
    # a fourth claim at 0.5 raises m: 0.04 · 4/3 > 0.05, with only 2 and 3 of 99 draws reaching
    # b and c (more draws could separate them); half the draws reach d
    rows = adjust_rows([*rows, _row("d", 0.5)], alpha=0.05)
    assert [r.verdict for r in rows] == [HOLDS, INCONCLUSIVE, INCONCLUSIVE, DOES_NOT_HOLD]


def test_benjamini_hochberg_against_a_direct_computation():
    p = [0.2, 0.001, math.nan, 0.03, 0.04, 0.5]
    got = benjamini_hochberg(p)
    stated = [x for x in p if not math.isnan(x)]
    m = len(stated)
    ranked = sorted(stated)
    for x, g in zip(p, got):
        if math.isnan(x):
            assert math.isnan(g)
            continue
        want = min(min(1.0, ranked[j] * m / (j + 1)) for j in range(m) if ranked[j] >= x)
        assert g == pytest.approx(want)
    with pytest.raises(Exception, match=r"\[0, 1\]"):
        benjamini_hochberg([1.5])


def test_a_required_group_that_cannot_separate_makes_it_inconclusive():
    planes = _control(0.01)
    heads = replace(_control(math.nan), name="random heads, same layers", withheld="whole pool")
    required = [["random planes, same heads"], ["random heads, same layers"]]
    verdict, reason = decide(*LESS, [planes, heads], required=required)
    assert verdict == INCONCLUSIVE and "none of random heads, same layers" in reason
    resolving = replace(heads, p=0.01, p_adjusted=0.01, withheld="")
    assert decide(*LESS, [planes, resolving], required=required)[0] == HOLDS


def test_same_layer_heads_that_are_mostly_the_set_are_withheld():
    """A set holding 3 of layer 5's 4 heads (and one head in each of layers 7 and 11): same-layer
    draws hold 55% of it on average, so their p is withheld and random heads from any layer decide;
    a set of one head per layer (25%) keeps its same-layer p."""
    from ropelens.claims.knockouts import ANY_LAYER, SAME_LAYERS, _unless_mostly_the_set
    from ropelens.run.stats import matched_set_overlap

    population = {L: list(range(4)) for L in range(18)}
    filling = [(5, 0), (5, 1), (5, 2), (7, 0), (11, 2)]
    # by hand: (3·3/4 + 1·1/4 + 1·1/4) / 5
    assert matched_set_overlap(filling, population) == pytest.approx((9 / 4 + 2 / 4) / 5)
    same = replace(_control(0.28, n=49), name=SAME_LAYERS)
    withheld = _unless_mostly_the_set(same, filling, population)
    assert math.isnan(withheld.p) and math.isnan(withheld.p_adjusted)
    assert withheld.withheld == (
        f"{SAME_LAYERS} hold on average 55% of the tested heads (the set fills 3 of layer 5's 4 "
        f"heads), so they cannot tell it from its layers; {ANY_LAYER} can"
    )
    spread = [(5, 0), (7, 0), (11, 2)]
    assert _unless_mostly_the_set(same, spread, population) == same
    # the verdict then rests on the other head control: beaten → holds
    planes, anywhere = _control(0.02, n=49), replace(_control(0.02, n=49), name=ANY_LAYER)
    verdict, _ = decide(
        *LESS, [planes, withheld, anywhere], required=[[planes.name], [SAME_LAYERS, ANY_LAYER]]
    )
    assert verdict == HOLDS


def _pool(p: float, n_sets: int, adjusted: float | None = None) -> ControlOutcome:
    """A control that measured every one of ``n_sets`` sets (the claimed one and n_sets − 1
    others)."""
    return replace(_control(p, n=n_sets - 1, adjusted=adjusted), n_possible=n_sets, exhaustive=True)


@settings(max_examples=60, deadline=None)
@given(
    # effects on a grid of quarters: ties are exact (the p-value counts values within a few ulps
    # of the claimed one as ties, which a count by hand would not)
    st.lists(st.integers(-8, 8).map(lambda i: i / 4), min_size=1, max_size=40),
    st.integers(-8, 8).map(lambda i: i / 4),
    st.sampled_from(["less", "greater"]),
)
def test_an_enumerated_pool_gives_the_exact_share_of_sets_as_extreme(others, observed, direction):
    """Every set of the pool measured once: p is the share of the pool's sets (the claimed one
    included) at least as extreme as the claimed one, counted by hand."""
    c = control_outcome("x", observed, others, range(len(others)), len(others) + 1, direction, True)
    pool = [observed, *others]
    reach = sum((v <= observed) if direction == "less" else (v >= observed) for v in pool)
    assert c.exhaustive and not c.withheld
    assert c.p == pytest.approx(reach / len(pool))
    assert c.p_floor == pytest.approx(1 / len(pool))


def test_an_enumerated_pool_must_hold_every_other_set():
    with pytest.raises(InputError, match="5 sets exist, 3 were given"):
        control_outcome("x", -0.5, [-0.1, -0.2, -0.3], [1, 2, 3], 5, "less", True)


def test_an_enumerated_pool_decides_on_its_exact_share():
    # 63 other sets: 3 reach the claimed one, a share of 3/63 = 0.048 (the bound from 3 of 63
    # random draws would be 0.013): inconclusive, and no more draws can decide it
    verdict, reason = decide(*LESS, [_control(0.01), _pool(4 / 64, 64)])
    assert verdict == INCONCLUSIVE
    assert "3 of the 63 other sets" in reason and "no more draws can separate it" in reason
    # 4 of 63: an exact share 0.063 above alpha, where 4 of 63 random draws (bound 0.022) would
    # have left it open
    verdict, reason = decide(*LESS, [_control(0.01), _pool(5 / 64, 64)])
    assert verdict == DOES_NOT_HOLD
    assert "4 of the 63 other sets" in reason and "0.0635 of such sets do (exact)" in reason
    assert reaching_share_lower_bound(4, 63) < 0.05
    # none of 63 reach it: exact p = 1/64 beats alpha
    assert decide(*LESS, [_control(0.01), _pool(1 / 64, 64)])[0] == HOLDS
    # a pool of 10: floor 0.1, nothing to resolve, and the reason says the pool is the limit
    verdict, reason = decide(*LESS, [_pool(0.1, 10)])
    assert verdict == INCONCLUSIVE and "only 10 sets exist, every one measured" in reason
