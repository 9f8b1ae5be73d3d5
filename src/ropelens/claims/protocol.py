"""A claim, declared once as a protocol, and the registry of claims.

A :class:`Claim` states the claim in one sentence, its source (citation, the paper's model and
number), what is measured (analysis, head set, dose, metric, windows), its controls, the statistic
with its direction and threshold, and the function that measures it on a model
(:class:`Measurement`). :func:`register_claim` adds it to :data:`CLAIMS`, which
:func:`ropelens.claims.claims` and ``ropelens claims`` run, in registration order: a user registers
their own claim the way they register their own analysis
(:func:`ropelens.analyses.registry.register_analysis`).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ropelens.claims.result import ControlOutcome
from ropelens.errors import InputError

__all__ = ["CLAIMS", "Claim", "Measurement", "claim", "register_claim"]


@dataclass
class Measurement:
    """What a claim's protocol measured on one model; :func:`ropelens.claims.claims` decides the
    verdict from it (:func:`ropelens.claims.decide.decide`).

    Attributes:
        effect (float): The claim's statistic (a paired difference's mean over windows, or the
            descriptive statistic); NaN where not measured.
        lo (float): Lower end of its 95% CI.
        hi (float): Upper end of its 95% CI.
        baseline (float): The metric on the unmodified model (NaN where none).
        controls (list[ControlOutcome]): The controls' outcomes
            (:func:`ropelens.claims.decide.control_outcome`).
        model_number (str): The model's number in the paper's terms.
        n_windows (int): Windows or prompts measured.
        n_draws (int): Draws per control.
        detail (dict[str, Any]): Claim-specific JSON values (head sets, dose curve, ...).
        not_applicable (str): Why the claim does not apply to this model ("" where it does).
        fails (str): A second condition of the claim that failed ("" where none did): a claim
            that would hold on its statistic does not hold when this is set.
    """

    effect: float = math.nan
    lo: float = math.nan
    hi: float = math.nan
    baseline: float = math.nan
    controls: list[ControlOutcome] = field(default_factory=list)
    model_number: str = ""
    n_windows: int = 0
    n_draws: int = 0
    detail: dict[str, Any] = field(default_factory=dict)
    not_applicable: str = ""
    fails: str = ""


@dataclass(frozen=True)
class Claim:
    """One claim from the literature as a declared protocol.

    Attributes:
        name (str): Its registry name, as ``--claims`` takes it (``"positional-highest-band"``).
        claim (str): The claim in one sentence.
        source (str): Citation (authors, year, venue or arXiv id).
        paper (str): The paper's model and number, in words.
        measured (str): What is measured: analysis, how the head set is chosen, dose, metric,
            windows.
        metric (str): The metric's short name.
        controls (tuple[str, ...]): The controls in words (empty: descriptive or exact).
        statistic (str): The statistic and the decision rule in words.
        direction (str): ``"greater"`` or ``"less"``: the side of ``threshold`` the claim predicts.
        threshold (float): What the statistic is compared with.
        measure (Callable): ``measure(context) -> Measurement`` on a
            :class:`ropelens.claims.context.ClaimContext`.
        reads_weights (bool): Whether the verdict depends on the trained weights (False for a
            claim about the configuration alone, such as the base bound: it holds on random
            weights as on trained ones).

    Raises:
        InputError: When the name is empty, the direction is neither, or ``measure`` is not
            callable.
    """

    name: str
    claim: str
    source: str
    paper: str
    measured: str
    metric: str
    controls: tuple[str, ...]
    statistic: str
    direction: str
    threshold: float
    measure: Callable[[Any], Measurement]
    reads_weights: bool = True

    def __post_init__(self) -> None:
        if not self.name or " " in self.name or "," in self.name:
            raise InputError(
                f"a claim needs a name without spaces or commas (it is typed after --claims), got "
                f"{self.name!r}"
            )
        if self.direction not in ("greater", "less"):
            raise InputError(
                f"claim {self.name!r}: direction must be 'greater' or 'less', got "
                f"{self.direction!r}"
            )
        if not callable(self.measure):
            raise InputError(
                f"claim {self.name!r}: measure must be callable (context → Measurement)"
            )


CLAIMS: dict[str, Claim] = {}


def register_claim(c: Claim) -> Claim:
    """Add ``c`` to :data:`CLAIMS` (replacing a claim of the same name) and return it.

    Examples:
        >>> from ropelens.claims.protocol import CLAIMS, Claim, Measurement, register_claim
        >>> mine = register_claim(Claim(
        ...     "always-two", "Two is greater than one.", "arithmetic", "", "nothing", "number",
        ...     (), "the number against 1", "greater", 1.0,
        ...     lambda context: Measurement(effect=2.0, lo=2.0, hi=2.0)))
        >>> "always-two" in CLAIMS
        True
        >>> del CLAIMS["always-two"]
    """
    if not isinstance(c, Claim):
        raise InputError(f"register_claim takes a Claim, got {type(c).__name__}")
    CLAIMS[c.name] = c
    return c


def claim(name: str) -> Claim:
    """The registered claim ``name``."""
    try:
        return CLAIMS[name]
    except KeyError:
        raise InputError(f"no claim {name!r}; registered: {', '.join(CLAIMS)}") from None
