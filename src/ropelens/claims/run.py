"""``claims(model)``: run the registered claims on one model and decide each one
(:mod:`ropelens.claims.decide`)."""

from __future__ import annotations

import sys
import time
from collections.abc import Sequence
from typing import Any

from ropelens.claims.context import ClaimContext
from ropelens.claims.context import budget as budget_of
from ropelens.claims.decide import adjust_rows
from ropelens.claims.protocol import CLAIMS, Claim, Measurement
from ropelens.claims.result import INCONCLUSIVE, NOT_APPLICABLE, ClaimRow, ClaimsResult
from ropelens.errors import InputError
from ropelens.results.provenance import Provenance

__all__ = ["claims"]


def _names(names: str | Sequence[str] | None) -> list[str]:
    if names is None:
        return list(CLAIMS)
    if isinstance(names, str):
        names = [n.strip() for n in names.split(",") if n.strip()]
    unknown = [n for n in names if n not in CLAIMS]
    if unknown:
        raise InputError(
            f"no claim {unknown[0]!r}; registered: {', '.join(CLAIMS)} (e.g. --claims "
            f"{next(iter(CLAIMS))})"
        )
    if not names:
        raise InputError(f"no claim named: pass one or more of {', '.join(CLAIMS)}")
    return list(dict.fromkeys(names))


def _row(c: Claim, m: Measurement, seconds: float) -> ClaimRow:
    detail = dict(m.detail)
    if m.fails:
        detail["fails"] = m.fails
    detail.setdefault("controlled", bool(c.controls))
    return ClaimRow(
        name=c.name,
        claim=c.claim,
        source=c.source,
        paper=c.paper,
        measured=c.measured,
        metric=c.metric,
        direction=c.direction,
        threshold=float(c.threshold),
        baseline=float(m.baseline),
        effect=float(m.effect),
        lo=float(m.lo),
        hi=float(m.hi),
        model_number=m.model_number,
        controls=tuple(m.controls),
        verdict=NOT_APPLICABLE if m.not_applicable else INCONCLUSIVE,
        reason=m.not_applicable or "not decided yet",
        n_windows=int(m.n_windows),
        n_draws=int(m.n_draws),
        seconds=float(seconds),
        detail=detail,
    )


def claims(
    model: Any,
    names: str | Sequence[str] | None = None,
    budget: str = "standard",
    *,
    alpha: float = 0.05,
    seed: int = 0,
    progress: bool = True,
) -> ClaimsResult:
    """Test the registered claims (:data:`ropelens.claims.protocol.CLAIMS`) on ``model``.

    Each claim's protocol measures its statistic and controls on the budget's windows and draws;
    the p-values of every control of every claim run are adjusted together (Benjamini–Hochberg)
    and each claim is decided by :func:`ropelens.claims.decide.decide`.

    Args:
        model: The loaded model (:func:`ropelens.load_model`, :func:`ropelens.testing.tiny_model`).
        names (str | Sequence[str] | None): Claims to run (a comma-separated string or a list);
            None: every registered claim, in registration order.
        budget (str): ``"quick"`` (minutes on a CPU: 4 windows, 39 draws per control, p floor
            0.025), ``"standard"`` (8 windows, 49 draws) or ``"thorough"`` (16 windows, 99 draws,
            p floor 0.01).
        alpha (float): The level BH-adjusted p-values are compared with (default 0.05).
        seed (int): Seed of every draw.
        progress (bool): Write a line per claim to stderr as it finishes.

    Returns:
        ClaimsResult: A row per claim.

    Raises:
        InputError: For an unknown claim name or budget, or ``alpha`` outside (0, 1).
    """
    chosen = _names(names)
    settings = budget_of(budget)
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or not 0 < alpha < 1:
        raise InputError(f"alpha must lie strictly between 0 and 1, got {alpha!r} (0.05 is usual)")
    context = ClaimContext(model, settings, seed)
    start = time.perf_counter()
    rows = []
    for name in chosen:
        c = CLAIMS[name]
        t = time.perf_counter()
        m = c.measure(context)
        rows.append(_row(c, m, time.perf_counter() - t))
        if progress:
            sys.stderr.write(f"{name}: measured in {time.perf_counter() - t:.1f} s\n")
    decided = adjust_rows(rows, alpha)
    provenance = Provenance(
        model=context.name,
        corpus="english",
        n_windows=settings.n_windows,
        config={
            "claims": chosen,
            "budget": settings.name,
            "alpha": alpha,
            "seed": seed,
            "settings": settings.__dict__,
        },
        seconds=time.perf_counter() - start,
    )
    return ClaimsResult(decided, settings.name, float(alpha), provenance)
