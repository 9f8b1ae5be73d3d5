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
    findings.

    A section's render step returns one (:class:`ropelens.report.SectionSpec`); the report lays out
    its ``body`` under ``title`` at the anchor ``key``, writes each table as ``NAME.csv`` beside
    the page and keeps its numbers and findings in ``report.json``.

    Attributes:
        key (str): The section's anchor in the page (``index.html#KEY``) and its key in
            ``report.json``.
        title (str): The heading.
        body (str): The section's HTML (figures as embedded plotly, tables, text).
        available (bool): False where the section could not be measured for this model (its body
            then says why); True by default.
        tables (dict[str, pd.DataFrame]): Tidy tables by name, each written as ``NAME.csv``.
        numbers (dict[str, Any]): JSON-ready numbers the section quotes (kept in ``report.json``).
        findings (list[Finding]): Generated sentences that summarise the section, each with the
            numbers it quotes.
        figures (list[Any]): The plotly figures its body lays out (written as files with the
            report's ``figures`` option).

    Examples:
        >>> import pandas as pd
        >>> from ropelens.report import Section
        >>> section = Section(
        ...     "notes", "Notes", "<p>Layer 0 reads the highest planes.</p>",
        ...     tables={"notes": pd.DataFrame({"layer": [0, 1], "score": [0.5, 0.25]})},
        ...     numbers={"n_layers": 2},
        ... )
        >>> section.available, list(section.tables), section.numbers["n_layers"]
        (True, ['notes'], 2)
    """

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
