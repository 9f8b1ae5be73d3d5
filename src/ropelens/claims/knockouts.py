"""The knockout protocol the head-set claims share: one end of the spectrum zeroed in a head set,
against random planes in the same heads, random heads in the same layers, random heads from any
layer, and the other end of the spectrum in the same heads.

The claimed set zeroes the main dose (a quarter of each head's planes) at ``end`` (``"high"``: the
highest frequencies; ``"low"``: the lowest). Every condition is one batch row
(:mod:`ropelens.claims.rows`); a condition drawn twice runs once. The effect of a condition on a
window is its metric minus the unmodified model's; the claim's effect is the mean over windows with
its paired bootstrap CI (:func:`ropelens.run.stats.paired_bootstrap_ci`); a control's p compares the
claimed set's mean effect with each draw's (:func:`ropelens.claims.decide.control_outcome`). A
control whose pool of sets is small (at most :data:`ENUMERATE_UP_TO` times the draws) measures
every set of the pool once instead, and its p is exact.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

import numpy as np
import torch

from ropelens.analyses.knockout import plane_order
from ropelens.claims.decide import control_outcome
from ropelens.claims.protocol import Measurement
from ropelens.claims.result import ControlOutcome
from ropelens.claims.rows import distinct_rows
from ropelens.run.stats import (
    every_matched_set,
    matched_random_sets,
    matched_set_count,
    matched_set_overlap,
    paired_bootstrap_ci,
)

__all__ = [
    "ANY_LAYER",
    "OTHER_END",
    "PLANES",
    "SAME_LAYERS",
    "condition_rows",
    "control_pools",
    "enumerated",
    "every_head",
    "heads_by_layer",
    "knockout_claim",
    "main_dose",
]

PLANES = "random planes, same heads"
SAME_LAYERS = "random heads, same layers"
ANY_LAYER = "random heads, any layer"
OTHER_END = "other end of the spectrum"
_CAP = 2**62  # set counts beyond this are written as -1 (too many to count)
# random heads of the same layers that hold at least this share of the claimed heads on average
# are mostly the claimed set: their p is withheld (random heads from any layer still separate it)
MOST_OF_THE_SET = 0.5
# a control whose pool holds at most this many times the budget's draws (the claimed set aside) is
# enumerated: every set measured once, its p exact, at no more than this many times the cost
ENUMERATE_UP_TO = 2


def heads_by_layer(spec) -> dict[int, list[int]]:
    """Every head of each rotary layer: the pool the head controls draw from."""
    return {L: list(range(spec[L].n_heads)) for L in spec.rotary_layers}


def every_head(spec) -> list[tuple[int, int]]:
    """Every (layer, head) of the rotary layers, in layer order."""
    return [(L, h) for L, hs in heads_by_layer(spec).items() for h in hs]


def main_dose(n_planes: int) -> int:
    """A quarter of the planes per head (at least one)."""
    return max(1, n_planes // 4)


def _end(spec, layer: int, end: str, k: int) -> tuple[int, ...]:
    return tuple(sorted(plane_order(spec[layer].inv_freq, end)[:k]))


def _count(n: int) -> int:
    return n if n <= _CAP else -1


def control_pools(spec, heads: Sequence[tuple[int, int]], k: int) -> dict[str, int]:
    """How many distinct sets each control can draw for ``heads`` at ``k`` planes per head, the
    claimed set included (-1: too many to count)."""
    return {
        PLANES: _count(math.prod(math.comb(spec[L].n_planes, k) for L, _ in heads)),
        SAME_LAYERS: _count(matched_set_count(heads, heads_by_layer(spec))),
        ANY_LAYER: _count(math.comb(len(every_head(spec)), len(heads))),
    }


def enumerated(pool: int, n_draws: int) -> bool:
    """Whether a control of ``pool`` sets (the claimed one included) is enumerated rather than
    drawn: where the other sets number at most :data:`ENUMERATE_UP_TO` times the draws, each is
    measured once and the p-value is exact."""
    return 0 < pool - 1 <= ENUMERATE_UP_TO * n_draws


def _every_set(spec, heads, end: str, k: int, name: str) -> list[dict]:
    """Every set of control ``name`` as condition rows, the claimed set among them."""
    if name == PLANES:
        per_head = [list(itertools.combinations(range(spec[L].n_planes), k)) for L, _ in heads]
        return [dict(zip(heads, pick)) for pick in itertools.product(*per_head)]
    if name == SAME_LAYERS:
        sets = every_matched_set(heads, heads_by_layer(spec))
    else:
        sets = list(itertools.combinations(every_head(spec), len(heads)))
    return [{hd: _end(spec, hd[0], end, k) for hd in cs} for cs in sets]


def condition_rows(
    spec,
    heads: Sequence[tuple[int, int]],
    end: str,
    n_draws: int,
    seed: int,
    dose: int | None = None,
) -> tuple[list[str], list[dict]]:
    """(labels, rows): the unmodified model, the claimed set, the other end in the same heads,
    then each control: random planes in the same heads, random head sets with as many heads per
    layer, random head sets from any rotary layer (each given its own layer's planes at ``end``);
    ``dose`` planes per head (default :func:`main_dose`).

    A control is ``n_draws`` random draws, or, where its pool is small enough
    (:func:`enumerated`), every set of the pool but the claimed one, each once."""
    k = dose or main_dose(spec[heads[0][0]].n_planes)
    other = "low" if end == "high" else "high"
    claimed = {hd: _end(spec, hd[0], end, k) for hd in heads}
    labels = ["model", "set", OTHER_END]
    rows: list[dict] = [{}, claimed, {hd: _end(spec, hd[0], other, k) for hd in heads}]
    pools = control_pools(spec, heads, k)

    def add(name: str, drawn: Callable[[], list[dict]]) -> None:
        if enumerated(pools[name], n_draws):
            sets = [r for r in _every_set(spec, heads, end, k, name) if r != claimed]
        else:
            sets = drawn()
        labels.extend([name] * len(sets))
        rows.extend(sets)

    rng = np.random.default_rng(seed)
    add(
        PLANES,
        lambda: [
            {
                hd: tuple(sorted(rng.choice(spec[hd[0]].n_planes, k, replace=False).tolist()))
                for hd in heads
            }
            for _ in range(n_draws)
        ],
    )
    add(
        SAME_LAYERS,
        lambda: [
            {hd: _end(spec, hd[0], end, k) for hd in cs}
            for cs in matched_random_sets(heads, heads_by_layer(spec), n_draws, seed + 1)
        ],
    )
    every = every_head(spec)

    def any_layer() -> list[dict]:
        out = []
        for _ in range(n_draws):
            pick = sorted(rng.choice(len(every), len(heads), replace=False).tolist())
            out.append({every[i]: _end(spec, every[i][0], end, k) for i in pick})
        return out

    add(ANY_LAYER, any_layer)
    return labels, rows


def _unless_mostly_the_set(
    control: ControlOutcome,
    heads: Sequence[tuple[int, int]],
    population: dict[int, list[int]],
) -> ControlOutcome:
    """The same-layer random heads control, its p withheld where its draws hold on average
    :data:`MOST_OF_THE_SET` or more of the claimed heads (a set that fills its layers, as
    Gemma-3-270M's retrieval heads fill three of layer 5's four): such draws are mostly the set
    itself, so reaching its effect says nothing against it."""
    shared = matched_set_overlap(heads, population)
    if control.withheld or shared < MOST_OF_THE_SET:
        return control
    in_layer: dict[int, int] = {}
    for L, _ in heads:
        in_layer[L] = in_layer.get(L, 0) + 1
    fullest = max(in_layer, key=lambda L: in_layer[L] / len(population[L]))
    why = (
        f"{control.name} hold on average {shared:.0%} of the tested heads (the set fills "
        f"{in_layer[fullest]} of layer {fullest}'s {len(population[fullest])} heads), so they "
        f"cannot tell it from its layers; {ANY_LAYER} can"
    )
    return replace(control, p=math.nan, p_adjusted=math.nan, withheld=why)


def knockout_claim(
    context: Any,
    heads: Sequence[tuple[int, int]],
    end: str,
    units: Sequence[Any],
    values: Callable[[Any, list[dict]], list[float]],
    direction: str,
    describe: Callable[[float, float], str],
    dose: int | None = None,
) -> Measurement:
    """Run the knockout of ``heads`` at ``end`` on every unit (window or prompt) and measure it.

    Args:
        context (ClaimContext): The model and budget.
        heads (Sequence[tuple[int, int]]): The claimed (layer, head) set.
        end (str): ``"high"`` or ``"low"``: which end of the spectrum the set zeroes.
        units (Sequence): The windows or prompts.
        values (Callable): ``values(unit, rows) -> [metric per row]`` on one unit.
        direction (str): ``"less"`` (the knockout lowers the metric) or ``"greater"``.
        describe (Callable): ``describe(baseline, knocked) -> str``: the model's number in the
            paper's terms.
        dose (int | None): Planes per head (default :func:`main_dose`, a quarter).

    Returns:
        Measurement: The set's effect with its CI, the four controls, the model's number, and in
        ``detail`` the heads, the dose, the distinct conditions and the other end's paired CI.
    """
    spec, b = context.spec, context.budget
    heads = [tuple(int(x) for x in hd) for hd in heads]
    k = dose or main_dose(spec[heads[0][0]].n_planes)
    labels, rows = condition_rows(spec, heads, end, b.n_draws, context.seed + 17, k)
    once, where = distinct_rows(rows)
    per_unit = []
    for unit in units:
        got = values(unit, once)
        per_unit.append([got[i] for i in where])
    m = torch.tensor(per_unit, dtype=torch.float64)  # [unit, row]
    diff = m - m[:, :1]
    effect = paired_bootstrap_ci(m[:, 1], m[:, 0], n_boot=b.n_boot, seed=context.seed)
    observed = float(diff[:, 1].mean())
    lab = np.array(labels)
    population = heads_by_layer(spec)
    possible = control_pools(spec, heads, k)
    controls: list[ControlOutcome] = []
    for name in (PLANES, SAME_LAYERS, ANY_LAYER):
        idx = np.flatnonzero(lab == name)
        draws = diff[:, idx].mean(0).tolist()
        sets = [tuple(sorted(rows[i].items())) for i in idx]
        exact = enumerated(possible[name], b.n_draws)
        controls.append(
            control_outcome(name, observed, draws, sets, possible[name], direction, exact)
        )
    controls = [
        _unless_mostly_the_set(c, heads, population) if c.name == SAME_LAYERS else c
        for c in controls
    ]
    other = float(diff[:, 2].mean())
    controls.append(
        ControlOutcome(
            OTHER_END,
            other,
            math.nan,
            math.nan,
            math.nan,
            math.nan,
            1.0,
            1,
            1,
            1,
            "one set: compared by its paired CI (detail), not by a p-value",
        )
    )
    versus = paired_bootstrap_ci(m[:, 1], m[:, 2], n_boot=b.n_boot, seed=context.seed)
    base = float(m[:, 0].mean())
    return Measurement(
        effect=observed,
        lo=float(effect.lo),
        hi=float(effect.hi),
        baseline=base,
        controls=controls,
        model_number=describe(base, base + observed),
        n_windows=len(units),
        n_draws=b.n_draws,
        detail={
            "heads": [list(hd) for hd in heads],
            "end": end,
            "dose": k,
            "required_controls": [[PLANES], [SAME_LAYERS, ANY_LAYER]],
            "n_rows": len(rows),
            "n_distinct_rows": len(once),
            "set_minus_other_end": {
                "mean": float(versus.mean),
                "lo": float(versus.lo),
                "hi": float(versus.hi),
            },
        },
    )
