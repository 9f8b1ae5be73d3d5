"""A report's ``report.json`` read back: the model, each section's numbers and the findings.

``ropelens report`` writes ``report.json`` beside its page (:mod:`ropelens.report.build`);
``ropelens.load_result("out/report.json")`` returns it as a :class:`ReportSummary`.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from ropelens.errors import InputError
from ropelens.results.codec import fields_from_dict
from ropelens.results.findings import Finding
from ropelens.results.provenance import Provenance

__all__ = ["REPORT_FORMAT", "ReportSection", "ReportSummary", "is_report"]

REPORT_FORMAT = 1  # the format ropelens.report.build writes
_REPORT_KEYS = frozenset({"model", "sections", "findings"})


def is_report(data: dict[str, Any]) -> bool:
    """Whether JSON ``data`` is a report's ``report.json`` (which carries no ``type``)."""
    return set(data) >= _REPORT_KEYS


@dataclass(frozen=True)
class ReportSection:
    """One section of a report: key, title, whether it ran, its numbers and its CSV tables."""

    key: str
    title: str
    available: bool
    numbers: dict[str, Any]
    tables: tuple[str, ...]


@dataclass(frozen=True)
class ReportSummary:
    """What a report measured: the model, each section's numbers, the findings, the provenance."""

    model: dict[str, Any]
    corpus: dict[str, Any]
    measured: dict[str, Any]
    findings: tuple[Finding, ...]
    sections: tuple[ReportSection, ...]
    provenance: Provenance
    steps_seconds: dict[str, float]  # seconds each step of the report took
    untested_versions: dict[str, dict[str, str]]  # package -> {"installed": ..., "tested": ...}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ReportSummary:
        """Read the content of a ``report.json`` (its provenance also holds the step timings)."""
        if data.get("format") != REPORT_FORMAT:
            raise InputError(
                f"report.json has format {data.get('format')!r}; this ropelens reads format "
                f"{REPORT_FORMAT}: build the report again with this version"
            )
        provenance = data.get("provenance")
        if not isinstance(provenance, dict):
            found = "missing" if provenance is None else f"a {type(provenance).__name__}"
            raise InputError(
                f"ReportSummary.provenance is {found}, expected a Provenance object: pass the "
                "report.json `ropelens report` wrote, unedited"
            )
        provenance = dict(provenance)
        extras = {
            "steps_seconds": provenance.pop("steps_seconds", {}),
            "untested_versions": provenance.pop("untested_versions", {}),
        }
        content = {k: v for k, v in data.items() if k not in ("format", "provenance")}
        return fields_from_dict(cls, {**content, "provenance": provenance, **extras})

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> ReportSummary:
        """Read ``path``, a report's ``report.json``."""
        try:
            data = json.loads(Path(path).read_text())
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            raise InputError(f"{path} is not a report's report.json ({e})") from e
        if not isinstance(data, dict) or not is_report(data):
            raise InputError(
                f"{path} is not a report's report.json: pass the one `ropelens report` wrote"
            )
        return cls.from_dict(data)

    def section(self, key: str) -> ReportSection:
        """The section called ``key`` (e.g. ``"frequency-usage"``)."""
        for section in self.sections:
            if section.key == key:
                return section
        keys = ", ".join(s.key for s in self.sections)
        raise InputError(f"the report has no section {key!r}; its sections: {keys}")

    @property
    def numbers(self) -> dict[str, dict[str, Any]]:
        """Each section's numbers, by section key."""
        return {section.key: section.numbers for section in self.sections}

    def to_frame(self) -> pd.DataFrame:
        """Tidy numbers: one row per (section, number), nested names joined by dots."""
        rows = [
            {"section": section.key, "number": name, "value": value}
            for section in self.sections
            for name, value in _flatten(section.numbers)
        ]
        return pd.DataFrame(rows, columns=["section", "number", "value"])

    def __str__(self) -> str:
        ran = sum(section.available for section in self.sections)
        return (
            f"ReportSummary({self.model.get('name')}: {ran} of {len(self.sections)} sections, "
            f"{len(self.findings)} findings)"
        )


def _flatten(value: Any, prefix: str = "") -> Iterator[tuple[str, Any]]:
    """(dotted name, scalar) for every scalar in nested dicts and lists."""
    if isinstance(value, dict):
        items = [(str(k), v) for k, v in value.items()]
    elif isinstance(value, list):
        items = [(str(i), v) for i, v in enumerate(value)]
    else:
        yield prefix, value
        return
    for name, item in items:
        yield from _flatten(item, f"{prefix}.{name}" if prefix else name)
