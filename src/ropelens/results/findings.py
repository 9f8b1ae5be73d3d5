"""Findings: sentences written from the measured numbers (never canned), with the numbers kept."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

__all__ = ["Finding", "band_winners", "head_name"]


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
