"""The decision rule every claim shares: from an effect, its CI and its controls to a verdict.

:func:`control_outcome` turns a control's draws into a :class:`~ropelens.claims.result.
ControlOutcome` (p-value, floor, distinct sets, withheld reason) with the statistics of
:mod:`ropelens.run.stats`; :func:`adjust_rows` adjusts every stated p across the claims run
(Benjamini–Hochberg) and decides each row again; :func:`decide` is the rule:

1. the model lacks what the claim is about → *not applicable* (the reason says what);
2. no effect, or no CI (one window) → *inconclusive*;
3. the effect's CI lies wholly on the wrong side of the threshold → *does not hold*;
4. the CI includes the threshold → *inconclusive* (power: more windows);
5. a control that can resolve its p-value (stated, floor ≤ alpha) with adjusted p > alpha, whose
   draws reach the claimed set so often that even the one-sided 95% Clopper–Pearson lower bound on
   the share of random sets reaching it lies above alpha → *does not hold* (more draws would not
   separate it); where that bound is alpha or below (a few draws reach it, or none and the
   adjustment lifts the floor above alpha) → *inconclusive* (more draws could decide). A control
   whose pool was enumerated (every set measured once) uses the exact share instead of the bound;
   below alpha it is *inconclusive* too, but no more draws can decide it: the model has too few
   such sets;
6. a group of controls the claim requires (a knockout's plane controls, its head controls) has
   none that can resolve its p-value, or no control at all can (every one withheld or with its
   floor above alpha) → *inconclusive*: a claim whose controls cannot separate never holds;
7. a second condition of the claim failed (``fails``) → *does not hold*;
8. otherwise (the CI beyond the threshold, every resolving control beaten at adjusted p ≤ alpha, at
   least one resolving) → *holds*. A claim declared without controls (descriptive, exact) holds on
   its CI alone.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Sequence
from dataclasses import replace

import torch

from ropelens.claims.schema import (
    DOES_NOT_HOLD,
    HOLDS,
    INCONCLUSIVE,
    NOT_APPLICABLE,
    ClaimRow,
    ControlOutcome,
)
from ropelens.errors import InputError
from ropelens.run.stats import (
    benjamini_hochberg,
    control_verdict,
    distinct_sets,
    p_floor,
    permutation_p_value,
    reaching_share_lower_bound,
)

__all__ = ["adjust_rows", "control_outcome", "decide"]


def control_outcome(
    name: str,
    observed: float,
    draws: Sequence[float],
    sets: Sequence[Hashable],
    n_possible: int,
    direction: str,
    exhaustive: bool = False,
) -> ControlOutcome:
    """A control's outcome from its draws: the one-sided permutation p of ``observed`` against the
    draws' effects in ``direction``, its floor, the distinct sets drawn and why the p is withheld.

    Where ``exhaustive``, the draws are every set of the pool but the claimed one, each once: the
    same formula, (1 + #reaching) / (1 + n), is then the exact share of the pool's sets at least as
    extreme as the claimed one, the claimed one included.

    Args:
        name (str): The control in words.
        observed (float): The claimed set's effect.
        draws (Sequence[float]): Each draw's effect (same metric, same windows).
        sets (Sequence[Hashable]): Each draw's set (to count distinct ones).
        n_possible (int): How many distinct sets exist (the claimed one included); -1: too many to
            count.
        direction (str): ``"greater"`` or ``"less"``: the claim's predicted sign.
        exhaustive (bool): Whether ``draws`` are the whole pool but the claimed set (``n_possible``
            is then ``len(draws) + 1``).

    Returns:
        ControlOutcome: With ``p_adjusted`` equal to ``p`` until :func:`adjust_rows` runs.

    Examples:
        >>> c = control_outcome("random planes", -0.5, [-0.1, -0.2, -0.15], [1, 2, 3], 100, "less")
        >>> round(c.p, 2), c.p_floor, c.n_distinct, c.withheld
        (0.25, 0.25, 3, '')
        >>> c = control_outcome("heads", -0.5, [-0.1, -0.6, -0.2], [1, 2, 3], 4, "less", True)
        >>> c.p, c.exhaustive  # exact: 2 of the pool's 4 sets reach -0.5
        (0.5, True)
    """
    n = len(draws)
    if exhaustive and n_possible != n + 1:
        raise InputError(
            f"an exhaustive control holds every set of its pool but the claimed one: "
            f"{n_possible} sets exist, {n} were given"
        )
    if n == 0:
        return ControlOutcome(
            name,
            math.nan,
            math.nan,
            math.nan,
            math.nan,
            math.nan,
            1.0,
            0,
            0,
            n_possible,
            "no control set could be drawn",
        )
    v = torch.tensor([float(x) for x in draws], dtype=torch.float64)
    n_distinct = distinct_sets(list(sets))
    why = control_verdict(n_possible if n_possible >= 0 else n + 1, n, n_distinct, name)
    p = (
        math.nan
        if why or not math.isfinite(observed)
        else permutation_p_value(observed, v, direction)
    )
    lo, hi = (
        (float(v.quantile(0.025)), float(v.quantile(0.975))) if n >= 2 else (math.nan, math.nan)
    )
    return ControlOutcome(
        name, float(v.mean()), lo, hi, p, p, p_floor(n), n, n_distinct, n_possible, why, exhaustive
    )


def _reached(control: ControlOutcome) -> int:
    """How many of the control's draws reached the claimed set: p = (1 + reached) / (1 + n)."""
    return max(0, round(control.p * (1 + control.n_draws)) - 1)


def _reaching_bound(control: ControlOutcome) -> float:
    """The share of the control's sets that reach the claimed set: exact where the pool was
    enumerated, else the one-sided 95% Clopper–Pearson lower bound from the draws."""
    if control.exhaustive:
        return _reached(control) / control.n_draws
    return reaching_share_lower_bound(_reached(control), control.n_draws)


def _draws_text(control: ControlOutcome) -> str:
    """``"3 of 49 draws of NAME"``, or for an enumerated pool ``"3 of the 63 other sets of NAME
    (every one measured)"``."""
    if control.exhaustive:
        return (
            f"{_reached(control)} of the {control.n_draws} other sets of {control.name} (every "
            "one measured)"
        )
    return f"{_reached(control)} of {control.n_draws} draws of {control.name}"


def _floor_text(control: ControlOutcome, alpha: float) -> str:
    if control.exhaustive:
        return (
            f"only {control.n_possible} sets exist, every one measured: floor "
            f"{control.p_floor:.3g} > {alpha:g}"
        )
    return f"floor {control.p_floor:.3g} > {alpha:g} with {control.n_draws} draws"


def decide(
    direction: str,
    threshold: float,
    effect: float,
    lo: float,
    hi: float,
    controls: Sequence[ControlOutcome],
    alpha: float = 0.05,
    not_applicable: str = "",
    controlled: bool = True,
    fails: str = "",
    required: Sequence[Sequence[str]] = (),
) -> tuple[str, str]:
    """The verdict and its reason (the rule in this module's docstring).

    Args:
        direction (str): ``"greater"`` or ``"less"``: the predicted side of ``threshold``.
        threshold (float): What the effect is compared with.
        effect (float): The claim's effect.
        lo (float): Lower end of its CI.
        hi (float): Upper end of its CI.
        controls (Sequence[ControlOutcome]): The controls, ``p_adjusted`` filled in.
        alpha (float): The level adjusted p-values are compared with.
        not_applicable (str): Why the claim does not apply to this model ("" where it does).
        controlled (bool): Whether the claim declares controls (False: descriptive or exact, its
            CI decides alone).
        fails (str): A second condition of the claim that failed: a claim that would hold on its
            statistic and controls does not hold, for this reason.
        required (Sequence[Sequence[str]]): Groups of control names of which at least one each
            must resolve its p-value (a knockout claim names its heads and its planes: a random
            planes control and a random heads control must each be able to separate it).

    Returns:
        tuple[str, str]: ``(verdict, reason)``.

    Examples:
        >>> decide("less", 0.0, -0.5, -0.6, -0.4, [], controlled=False)
        ('holds', 'the effect -0.5 [-0.6, -0.4] lies below 0 as claimed')
        >>> decide("less", 0.0, -0.5, -0.6, 0.1, [], controlled=False)[0]
        'inconclusive'
    """
    if not_applicable:
        return NOT_APPLICABLE, not_applicable
    if not math.isfinite(effect):
        return INCONCLUSIVE, "the effect could not be measured on these windows"
    shown = f"{effect:.4g} [{lo:.4g}, {hi:.4g}]"
    side = "above" if direction == "greater" else "below"
    if not (math.isfinite(lo) and math.isfinite(hi)):
        return INCONCLUSIVE, (
            f"the effect {effect:.4g} has no CI (it rests on one window or one unit): measure more"
        )
    beyond = lo > threshold if direction == "greater" else hi < threshold
    wrong = hi < threshold if direction == "greater" else lo > threshold
    if wrong:
        return DOES_NOT_HOLD, f"the effect {shown} lies wholly on the other side of {threshold:.4g}"
    if not beyond:
        return INCONCLUSIVE, (
            f"the effect {shown} includes {threshold:.4g}: too little power at these windows"
        )
    claimed = f"the effect {shown} lies {side} {threshold:.4g} as claimed"
    if not controlled:
        return (DOES_NOT_HOLD, f"{claimed}, but {fails}") if fails else (HOLDS, claimed)
    resolving = [
        c for c in controls if not c.withheld and math.isfinite(c.p) and c.p_floor <= alpha
    ]
    weak = [c for c in resolving if not c.p_adjusted <= alpha]
    decisive = [c for c in weak if _reaching_bound(c) > alpha]
    if decisive:
        c = decisive[0]
        share = (
            f"a share of {_reaching_bound(c):.3g} of such sets do (exact)"
            if c.exhaustive
            else f"at least {_reaching_bound(c):.3g} of such sets do (95% lower bound)"
        )
        return DOES_NOT_HOLD, (
            f"{claimed}, but {_draws_text(c)} reach it (p = {c.p:.3g}, BH-adjusted "
            f"{c.p_adjusted:.3g} > {alpha:g}): {share}, above {alpha:g}"
        )
    for group in required:
        if not any(c.name in group for c in resolving):
            whys = [c.withheld or _floor_text(c, alpha) for c in controls
                    if c.name in group]  # fmt: skip
            return INCONCLUSIVE, (
                f"{claimed}, but none of {', '.join(group)} can separate it "
                f"({'; '.join(whys) or 'not drawn'})"
            )
    if weak:
        c = weak[0]
        if c.exhaustive:
            return INCONCLUSIVE, (
                f"{claimed}; {_draws_text(c)} reach it (exact p = {c.p:.3g}, BH-adjusted "
                f"{c.p_adjusted:.3g} > {alpha:g}), and with all {c.n_possible} sets measured no "
                "more draws can separate it"
            )
        if _reached(c) == 0:
            return INCONCLUSIVE, (
                f"{claimed}; no draw of {c.name} reaches it, but its floor p = {c.p:.3g} "
                f"({c.n_draws} draws) is {c.p_adjusted:.3g} after the BH adjustment, above "
                f"{alpha:g}: more draws"
            )
        return INCONCLUSIVE, (
            f"{claimed}, but {_reached(c)} of {c.n_draws} draws of {c.name} reach it (p = "
            f"{c.p:.3g}, BH-adjusted {c.p_adjusted:.3g} > {alpha:g}); as few as "
            f"{_reaching_bound(c):.3g} of such sets may (95% lower bound), so more draws could "
            "separate it"
        )
    if not resolving:
        whys = [c.withheld or f"{c.name}: {_floor_text(c, alpha)}" for c in controls]
        return INCONCLUSIVE, (
            f"{claimed}, but no control can separate it: {'; '.join(whys) or 'none was drawn'}"
        )
    if fails:
        return DOES_NOT_HOLD, f"{claimed}, but {fails}"
    beaten = ", ".join(f"{c.name} (p = {c.p:.3g}, BH {c.p_adjusted:.3g})" for c in resolving)
    unresolved = [c.name for c in controls if c not in resolving]
    rest = f"; {', '.join(unresolved)} cannot resolve a p-value" if unresolved else ""
    return HOLDS, f"{claimed}, beyond {beaten}{rest}"


def adjust_rows(rows: Sequence[ClaimRow], alpha: float = 0.05) -> tuple[ClaimRow, ...]:
    """Every row with its controls' p-values adjusted by Benjamini–Hochberg across all the rows'
    stated p-values, and its verdict decided again from them (a not-applicable row stays so)."""
    flat = [c.p for r in rows for c in r.controls]
    adjusted = iter(benjamini_hochberg(flat))
    out = []
    for r in rows:
        controls = tuple(replace(c, p_adjusted=next(adjusted)) for c in r.controls)
        if r.verdict == NOT_APPLICABLE:
            out.append(replace(r, controls=controls))
            continue
        verdict, reason = decide(
            r.direction,
            r.threshold,
            r.effect,
            r.lo,
            r.hi,
            controls,
            alpha,
            controlled=bool(r.detail.get("controlled", bool(controls))),
            fails=str(r.detail.get("fails", "")),
            required=r.detail.get("required_controls", ()),
        )
        out.append(replace(r, controls=controls, verdict=verdict, reason=reason))
    return tuple(out)
