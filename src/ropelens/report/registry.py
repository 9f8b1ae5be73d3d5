"""The report's sections: what each shows, and the steps that measure and lay it out.

A section belongs to an analysis: its :class:`SectionSpec` is the ``section`` of an
:class:`ropelens.analyses.registry.Analysis`, and the report lays out the registered analyses'
sections in the order they were registered (``ropelens/catalog/__init__.py``).

A section that runs an analysis of its own has two steps: ``measure(data: ReportData) -> result``,
run before anything is laid out (its result kept in ``data.results[key]``), and ``render(data,
result) -> Section``, which only lays out what was measured. A section drawn from what the streaming
pass measured has a renderer alone, ``render(data) -> Section``. Work several sections share is a
measured step of its own (:data:`SHARED_STEPS`), which those sections name in ``needs``. Entries
hold the step functions themselves.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ropelens.analyses.registry import Analysis, analyses, parts, register_analysis
from ropelens.errors import InputError
from ropelens.report.section import Measured, Section
from ropelens.report.steps import measure_baseline

__all__ = ["SHARED_STEPS", "Measured", "Section", "SectionSpec", "register_section", "sections"]


@dataclass(frozen=True)
class SectionSpec:
    """A section of the report: its anchor, title, and its render (and measure) steps.

    It is the ``section`` of an :class:`ropelens.analyses.registry.Analysis`, or given to the
    report on its own with :func:`register_section`. With a measure step, ``measure(data)`` runs
    before anything is laid out and ``render(data, result)`` lays out its result; without one,
    ``render(data)`` lays out what the streaming pass measured (``data`` is the report's
    ``ReportData``: the model's spec, layers, windows and results).

    Attributes:
        key (str): The section's anchor and key (see :class:`Section`), unique in the report.
        title (str): The heading.
        render (Callable[..., Section]): The layout step: ``(data, result) -> Section`` with a
            measure step, else ``(data) -> Section``. It never runs the model.
        measure (Callable[[Any], Any] | None): ``data -> result``, the section's own measurement
            (kept in ``data.results[key]``); None for a section of the streaming pass alone.
        needs (tuple[str, ...]): Shared measured steps (:data:`SHARED_STEPS`) the measure step
            reads from ``data.results``.
        summary (str): What the section shows, in one sentence.

    Raises:
        InputError: When ``render`` or ``measure`` is not a function, or ``needs`` names an
            unknown shared step.

    Examples:
        >>> from ropelens.report import Section, SectionSpec
        >>> def render(data):
        ...     return Section("notes", "Notes", f"<p>{len(data.layers)} layers measured</p>")
        >>> spec = SectionSpec("notes", "Notes", render, summary="How many layers were measured.")
        >>> spec.measure is None, spec.step
        (True, 'notes')
        >>> SectionSpec("notes", "Notes", "mymodule:render")
        Traceback (most recent call last):
        ...
        ropelens.errors.InputError: section 'notes': render and measure must be functions ...
    """

    key: str
    title: str
    render: Callable[
        ..., Section
    ]  # (ReportData, result) -> Section with a measure step, else (ReportData)
    measure: Callable[[Any], Any] | None = None  # ReportData -> what render lays out
    needs: tuple[str, ...] = ()  # SHARED_STEPS the measure step reads from data.results
    summary: str = ""  # what the section shows, in one sentence

    def __post_init__(self) -> None:
        if not callable(self.render) or (self.measure is not None and not callable(self.measure)):
            raise InputError(
                f"section {self.key!r}: render and measure must be functions (the steps themselves)"
            )
        unknown = [n for n in self.needs if n not in SHARED_STEPS]
        if unknown:
            raise InputError(
                f"section {self.key!r} needs unknown shared steps {unknown}: name some of "
                f"{sorted(SHARED_STEPS)}"
            )

    @property
    def step(self) -> str:
        """The name the measure step is timed under in the report's provenance."""
        return self.key.replace("-", "_")


SHARED_STEPS: dict[str, Callable[[Any], Any]] = {
    # the unmodified model's per-window losses, which the p-RoPE and context sections compare
    # against
    "variants_baseline": measure_baseline,
}


def sections() -> list[SectionSpec]:
    """The sections of the registered analyses, in the order the analyses were registered.

    The report lays them out in this order (``ropelens/catalog/__init__.py`` registers
    ropelens's own); :func:`register_section` adds or replaces one.

    Returns:
        list[SectionSpec]: Every section, first laid out first.

    Examples:
        >>> from ropelens.report import sections
        >>> [s.key for s in sections()][:3]
        ['rope-spec', 'frequency-usage', 'band-statistics']
    """
    return parts("section")


def register_section(spec: SectionSpec, *, before: str | None = None) -> None:
    """Give the report ``spec``: the section of the analysis that has this key is replaced (keeping
    its place); a new key becomes an analysis of its own, with no command, ahead of the section
    ``before`` or last.

    The registry is the process's: every report built afterwards in this process has the section.

    Args:
        spec (SectionSpec): The section.
        before (str | None): Key of the section to lay the new one out ahead of; None: last. Not
            used when ``spec.key`` replaces a section.

    Raises:
        InputError: When ``spec`` is not a :class:`SectionSpec`, or ``before`` names no section.

    Examples:
        >>> from ropelens.analyses import registry
        >>> from ropelens.report import Section, SectionSpec, register_section, sections
        >>> saved = {a.name: a for a in registry.analyses()}  # to put back after this example
        >>> notes = SectionSpec(
        ...     "notes", "Notes", lambda data: Section("notes", "Notes", "<p>A note.</p>")
        ... )
        >>> register_section(notes, before="frequency-usage")
        >>> [s.key for s in sections()][:3]
        ['rope-spec', 'notes', 'frequency-usage']
        >>> registry.ANALYSES.clear()
        >>> registry.ANALYSES.update(saved)
    """
    if not isinstance(spec, SectionSpec):
        raise InputError(f"register_section takes a SectionSpec, got {type(spec).__name__}")
    owner = next(
        (a for a in analyses() if a.section is not None and a.section.key == spec.key), None
    )
    if owner is not None:
        register_analysis(dataclasses.replace(owner, section=spec))
        return
    ahead = None
    if before is not None:
        ahead = next(
            (a.name for a in analyses() if a.section is not None and a.section.key == before), None
        )
        if ahead is None:
            raise InputError(
                f"no section {before!r} to insert before; sections: {[s.key for s in sections()]}"
            )
    register_analysis(Analysis(spec.key, section=spec), before=ahead)
