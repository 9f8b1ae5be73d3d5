"""The result of testing the literature's RoPE claims on one model: one row per claim.

:class:`ClaimsResult` holds a :class:`ClaimRow` per claim run by :func:`ropelens.claims.claims`:
the verdict with its reason, the claim's effect with its 95% CI, and a :class:`ControlOutcome` per
control (its p-value raw and Benjamini–Hochberg-adjusted across every control of every claim in the
result, the smallest p its draws allow and how many distinct control sets it drew), beside the
paper's number. The schema below is stable: readers (tables, figures, the report) may rely on every
field named here.

Verdicts are one of :data:`VERDICTS` (the rule, step by step, is :func:`ropelens.claims.decide.
decide`'s):

- ``"holds"``: the effect's CI lies beyond the claim's threshold in its direction and every control
  that can resolve a p-value is beaten at BH-adjusted p ≤ ``alpha`` (a knockout needs a plane
  control and a head control that can; a descriptive or exact claim has its CI alone);
- ``"does not hold"``: the effect's CI lies wholly on the wrong side of the threshold, a control's
  draws reach the claimed set (adjusted p > ``alpha``, p above its floor), or a second condition
  of the claim fails;
- ``"inconclusive"``: the numbers cannot decide (a CI across the threshold, a control's floor above
  ``alpha``, too few distinct control sets): the reason says which;
- ``"not applicable"``: the model lacks what the claim is about (no positional heads found, no
  local layers, no massive values): the reason says what.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from ropelens.claims.decide import adjust_rows
from ropelens.claims.schema import (
    BUDGETS,
    DOES_NOT_HOLD,
    HOLDS,
    INCONCLUSIVE,
    NOT_APPLICABLE,
    VERDICTS,
    ClaimRow,
    ControlOutcome,
)
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
        rows = adjust_rows((*self.rows, *other.rows), self.alpha)
        seconds = [s for s in (self.provenance.seconds, other.provenance.seconds) if s is not None]
        config = {**self.provenance.config, "claims": [r.name for r in rows]}
        return replace(
            self,
            rows=rows,
            provenance=replace(
                self.provenance, seconds=sum(seconds) if seconds else None, config=config
            ),
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
        floor, draws, distinct and possible sets, why withheld, whether the pool was enumerated."""
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
    "exhaustive",
)
