"""The row schema of :class:`ropelens.claims.result.ClaimsResult`: a :class:`ClaimRow` per claim,
a :class:`ControlOutcome` per control, and the verdicts (their meaning is in
:mod:`ropelens.claims.result` and the rule in :mod:`ropelens.claims.decide`)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from ropelens.errors import InputError

__all__ = [
    "BUDGETS",
    "DOES_NOT_HOLD",
    "HOLDS",
    "INCONCLUSIVE",
    "NOT_APPLICABLE",
    "VERDICTS",
    "ClaimRow",
    "ControlOutcome",
]

HOLDS = "holds"
DOES_NOT_HOLD = "does not hold"
INCONCLUSIVE = "inconclusive"
NOT_APPLICABLE = "not applicable"
VERDICTS = (HOLDS, DOES_NOT_HOLD, INCONCLUSIVE, NOT_APPLICABLE)
BUDGETS = ("quick", "standard", "thorough")


@dataclass(frozen=True)
class ControlOutcome:
    """One control of one claim: what the claimed set is compared with, and how it fared.

    Attributes:
        name (str): The control in words: ``"random planes, same heads"``, ``"random heads, same
            layers"``, ``"random heads, any layer"``, ``"other end of the spectrum"``,
            ``"uniform planes"``.
        effect (float): Mean over the control's draws of each draw's effect (the same metric and
            paired difference as the claim's effect); NaN where nothing was drawn.
        lo (float): 2.5th percentile of the draws' effects (the spread of the null, not a CI of its
            mean); NaN with fewer than 2 draws.
        hi (float): 97.5th percentile of the draws' effects; NaN with fewer than 2 draws.
        p (float): One-sided permutation p-value, (1 + #{draws at least as extreme as the claimed
            set, in the claim's direction}) / (1 + n_draws)
            (:func:`ropelens.run.stats.permutation_p_value`); NaN where ``withheld`` says why.
            Where ``exhaustive``, the draws are every other set of the pool, each once, and ``p``
            is the exact share of the pool's sets (the claimed one included) at least as extreme.
        p_adjusted (float): ``p`` adjusted by Benjamini–Hochberg across every stated p of every
            control of every claim in the result (:func:`ropelens.run.stats.benjamini_hochberg`);
            NaN where ``p`` is.
        p_floor (float): The smallest p the draws allow, 1 / (1 + n_draws)
            (:func:`ropelens.run.stats.p_floor`); where ``exhaustive``, 1 / (sets in the pool).
        n_draws (int): Control sets drawn (where ``exhaustive``: the pool's sets but the claimed
            one).
        n_distinct (int): Distinct sets among the draws (a control drawn twice is computed once).
        n_possible (int): Distinct sets that exist (the claimed set included); -1 where too many to
            count.
        withheld (str): Why ``p`` is withheld (:func:`ropelens.run.stats.control_verdict`: the
            control cannot differ from the claimed set, or has fewer sets than draws); empty where
            ``p`` is stated.
        exhaustive (bool): Whether the pool was enumerated (every set measured once) rather than
            drawn from: ``p`` is then exact, and the share of sets reaching the claimed one is
            known rather than bounded.
    """

    name: str
    effect: float
    lo: float
    hi: float
    p: float
    p_adjusted: float
    p_floor: float
    n_draws: int
    n_distinct: int
    n_possible: int
    withheld: str = ""
    exhaustive: bool = False


@dataclass(frozen=True)
class ClaimRow:
    """One claim tested on one model: the protocol in words, the numbers, the verdict.

    Attributes:
        name (str): The claim's registry name (``"positional-highest-band"``).
        claim (str): The claim in one sentence.
        source (str): Its citation (authors, year, venue or arXiv id).
        paper (str): The paper's model and number, in words (``"Gemma 7B: by eye, …"``); empty
            where the paper gives none.
        measured (str): What was measured, in words: analysis, head set, dose, metric, windows.
        metric (str): The metric's name (``"positional probe"``, ``"copy accuracy"``,
            ``"low-band energy share"``).
        direction (str): ``"greater"`` or ``"less"``: the sign of effect the claim predicts
            (``"less"``: knocking out lowers the metric).
        threshold (float): The value the effect is compared with (0 for a knockout's paired
            difference; 0.5 for "most of the energy"; the claim's stated bound elsewhere).
        baseline (float): The metric on the unmodified model (NaN where the claim has none).
        effect (float): The claim's effect (the paired difference knocked out − unmodified, mean
            over windows, or the descriptive statistic itself); NaN where not measured.
        lo (float): Lower end of the effect's 95% CI (percentile bootstrap over windows); NaN where
            not measured or one window.
        hi (float): Upper end of the effect's 95% CI.
        model_number (str): The model's number in the paper's terms, beside ``paper``
            (``"0.613 → 0.073"``); empty where not measured.
        controls (tuple[ControlOutcome, ...]): Each control's outcome (empty for a descriptive or
            exact claim).
        verdict (str): One of :data:`VERDICTS`.
        reason (str): Why, in one sentence naming the numbers that decided it.
        n_windows (int): Windows (or prompts) measured.
        n_draws (int): Draws per control (0 for a claim without controls).
        seconds (float): Wall-clock seconds the claim took.
        detail (dict[str, Any]): Claim-specific numbers (head sets, dose curve, per-band values):
            JSON values, for readers who want more than the row.
    """

    name: str
    claim: str
    source: str
    paper: str
    measured: str
    metric: str
    direction: str
    threshold: float
    baseline: float
    effect: float
    lo: float
    hi: float
    model_number: str
    controls: tuple[ControlOutcome, ...]
    verdict: str
    reason: str
    n_windows: int
    n_draws: int
    seconds: float
    detail: dict[str, Any]

    def __post_init__(self) -> None:
        if self.verdict not in VERDICTS:
            raise InputError(
                f"claim {self.name!r} has verdict {self.verdict!r}: it must be one of "
                f"{', '.join(VERDICTS)}"
            )
        if self.direction not in ("greater", "less"):
            raise InputError(
                f"claim {self.name!r} has direction {self.direction!r}: it must be 'greater' or "
                "'less'"
            )

    @property
    def min_p_floor(self) -> float:
        """The largest of the controls' floors: the smallest p every control could reach (NaN
        without controls)."""
        return max((c.p_floor for c in self.controls), default=math.nan)
