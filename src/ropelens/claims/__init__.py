"""The literature's RoPE claims as declared protocols, tested on a model with honest verdicts."""

from ropelens.claims.result import (
    DOES_NOT_HOLD,
    HOLDS,
    INCONCLUSIVE,
    NOT_APPLICABLE,
    VERDICTS,
    ClaimRow,
    ClaimsResult,
    ControlOutcome,
)

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
