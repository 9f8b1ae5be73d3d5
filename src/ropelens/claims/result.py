"""The result of testing the literature's RoPE claims on one model: one row per claim.

:class:`ClaimsResult` holds a :class:`ClaimRow` per claim run by :func:`ropelens.claims.claims`:
the verdict with its reason, the claim's effect with its 95% CI, and a :class:`ControlOutcome` per
control (its p-value raw and Benjamini–Hochberg-adjusted across every control of every claim in the
result, the smallest p its draws allow and how many distinct control sets it drew), beside the
paper's number. The schema below is stable: readers (tables, figures, the report) may rely on every
field named here.

Verdicts are one of :data:`VERDICTS`:

- ``"holds"``: the effect's CI excludes 0 in the claim's direction and every control that can
  resolve a p-value gives an adjusted p ≤ ``alpha`` (a descriptive claim without controls: its CI
  lies beyond the claim's threshold);
- ``"does not hold"``: the effect's CI lies on the wrong side of 0 (or of the threshold), or a
  control that can resolve its p-value reaches or beats the claimed set (adjusted p > ``alpha``
  while its floor is ≤ ``alpha``);
- ``"inconclusive"``: the draws cannot decide (a control's floor is above ``alpha``, too few
  distinct control sets, or a CI across 0): the reason says which;
- ``"not applicable"``: the model lacks what the claim is about (no positional heads found, no
  local layers, no unrotated part): the reason says what.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any

from ropelens.errors import InputError
from ropelens.results.findings import Finding
from ropelens.results.provenance import Provenance
from ropelens.results.result import Result

__all__ = [
    "DOES_NOT_HOLD",
    "HOLDS",
    "INCONCLUSIVE",
    "NOT_APPLICABLE",
    "VERDICTS",
    "ClaimRow",
    "ClaimsResult",
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
        p_adjusted (float): ``p`` adjusted by Benjamini–Hochberg across every stated p of every
            control of every claim in the result (:func:`ropelens.run.stats.benjamini_hochberg`);
            NaN where ``p`` is.
        p_floor (float): The smallest p the draws allow, 1 / (1 + n_draws)
            (:func:`ropelens.run.stats.p_floor`).
        n_draws (int): Control sets drawn.
        n_distinct (int): Distinct sets among the draws (a control drawn twice is computed once).
        n_possible (int): Distinct sets that exist (the claimed set included); -1 where too many to
            count.
        withheld (str): Why ``p`` is withheld (:func:`ropelens.run.stats.control_verdict`: the
            control cannot differ from the claimed set, or has fewer sets than draws); empty where
            ``p`` is stated.
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


@dataclass(frozen=True)
class ClaimsResult(Result, json_options={"indent": 1}):
    """The literature's RoPE claims tested on one model, one :class:`ClaimRow` per claim.

    Made by :func:`ropelens.claims.claims`; ``ropelens claims MODEL`` prints it. Two results of the
    same model, budget and ``alpha`` over different claims merge: their rows join and the
    Benjamini–Hochberg adjustment is made again across all of them.

    Attributes:
        rows (tuple[ClaimRow, ...]): One per claim, in the registry's order.
        budget (str): ``"quick"``, ``"standard"`` or ``"thorough"``.
        alpha (float): The level the adjusted p-values are compared with (default 0.05).
        provenance (Provenance): Model, settings and versions.
    """

    rows: tuple[ClaimRow, ...]
    budget: str
    alpha: float
    provenance: Provenance

    def __post_init__(self) -> None:
        if self.budget not in BUDGETS:
            raise InputError(f"budget must be one of {', '.join(BUDGETS)}, got {self.budget!r}")
        names = [r.name for r in self.rows]
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            raise InputError(f"claims {', '.join(twice)} appear twice in one ClaimsResult")

    def row(self, name: str) -> ClaimRow:
        """The row of claim ``name``."""
        for r in self.rows:
            if r.name == name:
                return r
        raise InputError(
            f"no claim {name!r} in this result; it holds {[r.name for r in self.rows]}"
        )

    def merge(self, other: ClaimsResult) -> ClaimsResult:
        """The rows of both (different claims, same model, budget and alpha), adjusted again."""
        if type(other) is not type(self):
            raise TypeError(
                f"can only merge ClaimsResult with ClaimsResult, got {type(other).__name__}"
            )
        for what in ("budget", "alpha"):
            if getattr(self, what) != getattr(other, what):
                raise InputError(
                    f"can only merge ClaimsResult of the same {what}: {getattr(self, what)!r} vs "
                    f"{getattr(other, what)!r}; run both claims with the same --budget"
                )
        if self.provenance.model != other.provenance.model:
            raise InputError(
                f"can only merge ClaimsResult of one model: {self.provenance.model!r} vs "
                f"{other.provenance.model!r}"
            )
        both = {r.name for r in self.rows} & {r.name for r in other.rows}
        if both:
            raise InputError(
                f"both results hold claim(s) {', '.join(sorted(both))}: merge results of "
                "different claims"
            )
        from ropelens.claims.decide import adjust_rows

        rows = adjust_rows((*self.rows, *other.rows), self.alpha)
        seconds = [s for s in (self.provenance.seconds, other.provenance.seconds) if s is not None]
        return replace(
            self,
            rows=rows,
            provenance=replace(self.provenance, seconds=sum(seconds) if seconds else None),
        )

    # ---------------------------------------------------------------- views
    def to_frame(self) -> Any:
        """One row per claim: name, verdict, reason, effect with its CI, baseline, windows, draws,
        seconds, and per control ``p[<control>]``, ``p_bh[<control>]``, ``floor[<control>]``,
        ``distinct[<control>]``."""
        import pandas as pd

        out = []
        for r in self.rows:
            d: dict[str, Any] = {
                "claim": r.name,
                "verdict": r.verdict,
                "reason": r.reason,
                "metric": r.metric,
                "baseline": r.baseline,
                "effect": r.effect,
                "lo": r.lo,
                "hi": r.hi,
                "model": r.model_number,
                "paper": r.paper,
                "n_windows": r.n_windows,
                "n_draws": r.n_draws,
                "seconds": r.seconds,
            }
            for c in r.controls:
                d[f"p[{c.name}]"] = c.p
                d[f"p_bh[{c.name}]"] = c.p_adjusted
                d[f"floor[{c.name}]"] = c.p_floor
                d[f"distinct[{c.name}]"] = c.n_distinct
            out.append(d)
        return pd.DataFrame(out)

    def controls_frame(self) -> Any:
        """One row per (claim, control): the control's effect and null spread, p raw and adjusted,
        floor, draws, distinct and possible sets, why withheld."""
        import pandas as pd

        return pd.DataFrame(
            [
                {"claim": r.name, "control": c.name, **{k: getattr(c, k) for k in _CONTROL_KEYS}}
                for r in self.rows
                for c in r.controls
            ]
        )

    def findings(self) -> list[Finding]:
        """A sentence per claim: its verdict and why."""
        return [
            Finding(
                r.name,
                "claims",
                f"{r.claim} ({r.source}): {r.verdict} — {r.reason}",
                {"verdict": r.verdict, "effect": r.effect, "lo": r.lo, "hi": r.hi},
            )
            for r in self.rows
        ]

    def _repr_text(self) -> str:
        counts = {v: sum(r.verdict == v for r in self.rows) for v in VERDICTS}
        said = ", ".join(f"{n} {v}" for v, n in counts.items() if n)
        return f"ClaimsResult({self.provenance.model}, {self.budget}: {said or 'no claims'})"


_CONTROL_KEYS = (
    "effect",
    "lo",
    "hi",
    "p",
    "p_adjusted",
    "p_floor",
    "n_draws",
    "n_distinct",
    "n_possible",
    "withheld",
)
