"""Findings: sentences written from the measured numbers (never canned), with the numbers kept."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

__all__ = [
    "Finding", "band_winners", "count_of", "counted_nothing", "fixed", "head_name",
    "nothing_counted", "percent", "shape_predicate", "signed", "too_short", "withheld",
]  # fmt: skip

# How a curve's shape reads after its subject, singular and plural ("the logit decays", "the
# curves are U-shaped"): the shape labels are adjectives or verbs, never both.
_SHAPE_PREDICATES = {
    "flat": ("is flat", "are flat"),
    "decays": ("decays", "decay"),
    "grows": ("grows", "grow"),
    "U-shaped": ("is U-shaped", "are U-shaped"),
    "peaked": ("peaks", "peak"),
    "oscillating": ("oscillates", "oscillate"),
}


@dataclass(frozen=True)
class Finding:
    """One generated sentence, the section it summarises, and the numbers it quotes."""

    key: str
    section: str
    text: str
    values: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"key": self.key, "section": self.section, "text": self.text, "values": self.values}

    def __str__(self) -> str:
        return self.text


def head_name(layer: int, head: int) -> str:
    """A head as findings and tables name it: ``L3.H5``."""
    return f"L{layer}.H{head}"


def band_winners(per_layer: torch.Tensor, names: Sequence[str]) -> tuple[str, int, float]:
    """Band that wins most layers (argmax over the last axis), how many it wins, its mean winning
    value."""
    best = per_layer.argmax(-1)
    counts = torch.bincount(best, minlength=per_layer.shape[-1])
    b = int(counts.argmax())
    won = best == b
    return names[b], int(counts[b]), float(per_layer[won, b].mean())


def _unit(text: str, unit: str) -> str:
    return f"{text} {unit}" if unit else text


def fixed(x: float, digits: int = 2, unit: str = "") -> str:
    """``x`` to ``digits`` decimals, with ``unit`` after it; a value that rounds to zero prints as
    0 (never ``-0.00``), and minus is the minus sign."""
    text = f"{float(x):.{digits}f}"
    if float(text) == 0:
        text = text.lstrip("-")
    return _unit(text.replace("-", "−"), unit)


def signed(x: float, digits: int = 2, unit: str = "") -> str:
    """A change with its sign (``+2.43 nats``, ``−0.31 nats``); one that rounds to zero carries
    none (``0.00 nats``), so no ``-0.00`` reaches a sentence."""
    text = fixed(x, digits)
    return _unit(text if text.startswith("−") or float(text) == 0 else "+" + text, unit)


def percent(share: float, digits: int = 0) -> str:
    """A share in [0, 1] as a percentage (``0.537`` → ``54%``), never ``-0%``."""
    return fixed(100 * float(share), digits) + "%"


def count_of(n: int, total: int, noun: str, plural: str | None = None) -> str:
    """``n`` of ``total`` things as a sentence says it: "16 of 30 layers", "all 30 layers",
    "none of the 30 layers", "the one layer" (``total`` 1, ``n`` 1), "no layer" (``total`` 1,
    ``n`` 0)."""
    plural = plural or noun + "s"
    if total == 1:
        return f"the one {noun}" if n == 1 else f"no {noun}"
    if n == total:
        return f"all {total:,} {plural}"
    if n == 0:
        return f"none of the {total:,} {plural}"
    return f"{n:,} of {total:,} {plural}"


def shape_predicate(shape: str, plural: bool = False) -> str:
    """A curve shape as the verb phrase after its subject: "decays", "is U-shaped", "oscillates"
    (``plural``: "decay", "are U-shaped")."""
    one, many = _SHAPE_PREDICATES.get(shape, (f"is {shape}", f"are {shape}"))
    return many if plural else one


def too_short(n_ctx: int | None, minimum: int) -> bool:
    """Whether windows of ``n_ctx`` tokens are shorter than a finding's ``minimum`` (never for an
    unknown length, as in results saved before lengths were recorded)."""
    return n_ctx is not None and int(n_ctx) < minimum


def withheld(key: str, section: str, what: str, n_ctx: int, minimum: int, why: str) -> Finding:
    """The finding ``key`` withheld: windows of ``n_ctx`` tokens cannot hold it (it needs
    ``minimum``, because ``why``); its values say so (``withheld``, ``min_tokens``, ``n_ctx``)."""
    noun = "token" if n_ctx == 1 else "tokens"
    return Finding(
        key,
        section,
        f"No finding on {what}: windows of {n_ctx:,} {noun} are too short to hold one; it needs "
        f"at least {minimum:,} tokens per window ({why}).",
        {"withheld": True, "n_ctx": int(n_ctx), "min_tokens": int(minimum), "reason": why},
    )


def counted_nothing(provenance: Any) -> bool:
    """Whether a result's provenance records that it counted no token or no window (never for a
    result that does not record its counts, such as one computed from a spec alone)."""
    counts = (getattr(provenance, "n_tokens", None), getattr(provenance, "n_windows", None))
    return any(c is not None and int(c) <= 0 for c in counts)


def nothing_counted(section: str, provenance: Any) -> Finding:
    """The findings of ``section`` withheld: its result counted no token, so every mean in it is a
    mean of nothing (a zero, a NaN or a tie that would read as a measurement)."""
    n_tokens, n_windows = provenance.n_tokens, provenance.n_windows
    return Finding(
        f"{section}-withheld",
        section,
        f"No finding: the result counted no token ({n_tokens or 0:,} tokens in "
        f"{n_windows or 0:,} windows), so it has nothing to report; measure it again on a corpus "
        "with text.",
        {
            "withheld": True,
            "n_tokens": int(n_tokens or 0),
            "n_windows": int(n_windows or 0),
            "reason": "no token was counted",
        },
    )
