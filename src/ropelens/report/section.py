"""What a report section contributes (:class:`Section`) and what a measure step hands its layout
(:class:`Measured`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pandas as pd

from ropelens.results.findings import Finding

__all__ = ["Measured", "Section"]


@dataclass
class Section:
    """What one section contributes: its HTML, tidy tables (written as CSV), numbers and
    findings."""

    key: str
    title: str
    body: str
    available: bool = True
    tables: dict[str, pd.DataFrame] = field(default_factory=dict)
    numbers: dict[str, Any] = field(default_factory=dict)
    findings: list[Finding] = field(default_factory=list)
    figures: list[Any] = field(default_factory=list)  # the plotly figures its body lays out


@dataclass(frozen=True)
class Measured:
    """What a section measured on a few of the report's windows, and the windows' size."""

    value: Any
    n_ctx: int
    n_windows: int
