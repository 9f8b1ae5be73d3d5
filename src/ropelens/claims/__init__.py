"""The literature's RoPE claims as declared protocols, tested on a model with honest verdicts.

``claims(model)`` runs every registered claim (:data:`CLAIMS`, in registration order) and returns a
:class:`ClaimsResult` with a row per claim: its verdict and why, its effect with a 95% CI, each
control's p (raw and Benjamini–Hochberg-adjusted across the run), the smallest p the draws allow,
the distinct control sets, and the paper's number beside the model's. Register a claim of your own
with :func:`register_claim`.
"""

from ropelens.claims import builtin as _builtin  # noqa: F401  (registers ropelens's claims)
from ropelens.claims.context import BUDGET_SETTINGS, Budget, ClaimContext
from ropelens.claims.decide import adjust_rows, control_outcome, decide
from ropelens.claims.protocol import CLAIMS, Claim, Measurement, claim, register_claim
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
from ropelens.claims.run import claims

__all__ = [
    "BUDGET_SETTINGS",
    "CLAIMS",
    "DOES_NOT_HOLD",
    "HOLDS",
    "INCONCLUSIVE",
    "NOT_APPLICABLE",
    "VERDICTS",
    "Budget",
    "Claim",
    "ClaimContext",
    "ClaimRow",
    "ClaimsResult",
    "ControlOutcome",
    "Measurement",
    "adjust_rows",
    "claim",
    "claims",
    "control_outcome",
    "decide",
    "register_claim",
]
