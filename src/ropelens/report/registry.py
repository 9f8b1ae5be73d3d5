"""The report's sections: a registry of what to show, in order, and how a section is laid out.

A section that runs an analysis of its own has two steps, each named by a ``"module:function"``
path: ``measure(data: ReportData) -> result``, run before anything is laid out (its result kept
in ``data.results[key]``), and ``render(data, result) -> Section``, which only lays out what was
measured. A section drawn from what the streaming pass measured has a renderer alone,
``render(data) -> Section``. Work several sections share is a measured step of its own
(:data:`SHARED_STEPS`), which those sections name in ``needs``. Optional sections also name the
analysis they need (``requires``); until that analysis and a renderer exist they show as a marked
placeholder. To add one, write its steps and point the registry entry at them (or call
:func:`register_section`); the page layout does not change.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pandas as pd

from ropelens.errors import InputError
from ropelens.report.findings import Finding
from ropelens.report.html import esc

__all__ = ["SECTIONS", "SHARED_STEPS", "Measured", "Section", "SectionSpec", "register_section", "resolve"]


@dataclass
class Section:
    """What one section contributes: its HTML, tidy tables (written as CSV), numbers and findings."""

    key: str
    title: str
    body: str
    available: bool = True
    tables: dict[str, pd.DataFrame] = field(default_factory=dict)
    numbers: dict[str, Any] = field(default_factory=dict)
    findings: list[Finding] = field(default_factory=list)


@dataclass(frozen=True)
class Measured:
    """What a section measured on a few of the report's windows, and the windows' size."""

    value: Any
    n_ctx: int
    n_windows: int


@dataclass(frozen=True)
class SectionSpec:
    """A registry entry: a section's anchor, title, measure and render steps, and the analysis it needs."""

    key: str
    title: str
    render: str | None  # "module:function": (ReportData, result) -> Section with a measure, else (ReportData)
    requires: tuple[str, ...] = ()  # "module:attribute" the steps rely on
    planned: str = ""  # what the section shows, for its placeholder
    measure: str | None = None  # "module:function" taking ReportData and returning what render lays out
    needs: tuple[str, ...] = ()  # SHARED_STEPS the measure step reads from data.results

    @property
    def step(self) -> str:
        """The name the measure step is timed under in the report's provenance."""
        return self.key.replace("-", "_")

    def missing(self) -> list[str]:
        """Requirements (and the steps) that do not import."""
        steps = [p for p in (self.render, self.measure) if p]
        steps += [SHARED_STEPS[n] for n in self.needs if n in SHARED_STEPS]
        return [r for r in (*self.requires, *steps) if resolve(r) is None]

    def available(self) -> bool:
        return self.render is not None and not self.missing()

    def renderer(self) -> Callable[..., Section]:
        fn = resolve(self.render) if self.render else None
        if fn is None:
            raise InputError(f"section {self.key!r} has no importable renderer ({self.render!r})")
        return fn

    def measurer(self) -> Callable[..., Any] | None:
        """The measure step, or None for a section laid out from the streaming pass alone."""
        if self.measure is None:
            return None
        fn = resolve(self.measure)
        if fn is None:
            raise InputError(f"section {self.key!r} has no importable measure step ({self.measure!r})")
        return fn

    def placeholder(self) -> Section:
        """The marked "not yet available" block shown instead of the section."""
        code = lambda rs: ", ".join(f"<code>{esc(r.replace(':', '.'))}</code>" for r in rs)  # noqa: E731
        missing = [r for r in self.requires if resolve(r) is None]
        if missing:
            why = f"Appears once {code(missing)} exists."
        else:
            why = f"The analysis ({code(self.requires)}) exists; its report section is not written yet."
        body = (f'<div class="placeholder"><b>Not yet available in this version of ropelens.</b> '
                f'{esc(self.planned)}<div class="req">{why}</div></div>')
        return Section(self.key, self.title, body, available=False)


def resolve(path: str) -> Any | None:
    """The object at ``"module:attribute"``, or None if the module (or a dependency of it) is not installed.

    Only ImportError means "not available": any other exception while importing is a bug in the
    analysis and propagates, rather than showing as a placeholder.
    """
    module, _, attr = path.partition(":")
    try:
        mod = importlib.import_module(module)
    except ImportError:
        return None
    return getattr(mod, attr, None) if attr else mod


SHARED_STEPS: dict[str, str] = {
    # the unmodified model's per-window losses, which the p-RoPE and context sections compare against
    "variants_baseline": "ropelens.report.variants:measure_baseline",
}

SECTIONS: list[SectionSpec] = [
    SectionSpec("spec", "Model and RoPE", "ropelens.report.measured:render_spec", ("ropelens.spec.rope:RopeSpec",)),
    SectionSpec("usage", "Frequency usage", "ropelens.report.measured:render_usage", ("ropelens.analyses.usage:FrequencyUsage",)),
    SectionSpec("bands", "Band decomposition of attention", "ropelens.report.measured:render_bands",
                ("ropelens.analyses.band_stats:BandStatistics",)),
    SectionSpec("positional-heads", "Positional heads", "ropelens.report.rerun:render_heads", ("ropelens.analyses.heads:classify_heads",),
                "Heads scored by how much of their attention the highest-frequency planes decide (diagonal "
                "and previous-token heads), with each head's score, its pattern and the planes it uses.",
                measure="ropelens.report.rerun:measure_heads"),
    SectionSpec("attention-sinks", "Attention sinks by band", "ropelens.report.rerun:render_sinks",
                ("ropelens.analyses.sinks:attention_sinks",),
                "Heads that sink on the first position (attention above ε = 0.3) and the bands that make it attractive.",
                measure="ropelens.report.rerun:measure_sinks"),
    SectionSpec("attention-distance", "Attention by distance", "ropelens.report.rerun:render_distance",
                ("ropelens.analyses.distance:attention_by_distance",),
                "Mean band logit and attention probability by query–key distance, with U-shapes and their cause.",
                measure="ropelens.report.rerun:measure_distance"),
    SectionSpec("massive-values", "Massive values", "ropelens.report.rerun:render_massive",
                ("ropelens.analyses.massive:massive_values",),
                "Dimensions of the pre-RoPE queries and keys with outsized norms, and the planes they sit in.",
                measure="ropelens.report.rerun:measure_massive"),
    SectionSpec("prope-sweep", "p-RoPE inference sweep", "ropelens.report.variants:render_prope", ("ropelens.run.evaluate:window_losses", "ropelens.spec.variants:PRoPE"),
                "Perplexity when only the fraction p of the highest frequencies keeps rotating at inference "
                "(p = 1 is RoPE, p = 0 NoPE), with the reversed and partial variants.",
                measure="ropelens.report.variants:measure_prope", needs=("variants_baseline",)),
    SectionSpec("pe-geometry", "PE geometry", "ropelens.report.theory:render_geometry",
                ("ropelens.analyses.decay:rope_decay_constant", "ropelens.analyses.decay:rope_gaussian_expectation"),
                "RoPE's \"long-term decay\" for this model's frequencies: constant versus Gaussian q and k.",
                measure="ropelens.report.theory:measure_geometry"),
    SectionSpec("context-extension", "Context extension", "ropelens.report.variants:render_context",
                ("ropelens.analyses.context:plane_view", "ropelens.analyses.extrapolation:base_lower_bound"),
                "Perplexity beyond the trained context under position interpolation, NTK, YaRN, Llama 3 "
                "and LongRoPE scaling of these frequencies.",
                measure="ropelens.report.variants:measure_context", needs=("variants_baseline",)),
]


def register_section(spec: SectionSpec, *, before: str | None = None) -> None:
    """Add a section, or replace the one with the same key (keeping its place)."""
    unknown = [n for n in spec.needs if n not in SHARED_STEPS]
    if unknown:
        raise InputError(f"section {spec.key!r} needs unknown shared steps {unknown}: name some of {sorted(SHARED_STEPS)}")
    keys = [s.key for s in SECTIONS]
    if spec.key in keys:
        SECTIONS[keys.index(spec.key)] = spec
    elif before is not None:
        if before not in keys:
            raise InputError(f"no section {before!r} to insert before; sections: {keys}")
        SECTIONS.insert(keys.index(before), spec)
    else:
        SECTIONS.append(spec)
