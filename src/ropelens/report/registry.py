"""The report's sections: a registry of what to show, in order, and the steps that measure and lay out each.

A section that runs an analysis of its own has two steps: ``measure(data: ReportData) -> result``, run before
anything is laid out (its result kept in ``data.results[key]``), and ``render(data, result) -> Section``, which only
lays out what was measured. A section drawn from what the streaming pass measured has a renderer alone,
``render(data) -> Section``. Work several sections share is a measured step of its own (:data:`SHARED_STEPS`),
which those sections name in ``needs``. Entries hold the step functions themselves. To add a section, write its
steps and register them (:func:`register_section`); the page layout does not change.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ropelens.errors import InputError
from ropelens.report import measured, rerun, theory, variants
from ropelens.report.section import Measured, Section

__all__ = ["SECTIONS", "SHARED_STEPS", "Measured", "Section", "SectionSpec", "register_section"]


@dataclass(frozen=True)
class SectionSpec:
    """A registry entry: a section's anchor, title, and its render (and measure) steps."""

    key: str
    title: str
    render: Callable[..., Section]  # (ReportData, result) -> Section with a measure step, else (ReportData)
    measure: Callable[[Any], Any] | None = None  # ReportData -> what render lays out
    needs: tuple[str, ...] = ()  # SHARED_STEPS the measure step reads from data.results
    summary: str = ""  # what the section shows, in one sentence

    @property
    def step(self) -> str:
        """The name the measure step is timed under in the report's provenance."""
        return self.key.replace("-", "_")


SHARED_STEPS: dict[str, Callable[[Any], Any]] = {
    # the unmodified model's per-window losses, which the p-RoPE and context sections compare against
    "variants_baseline": variants.measure_baseline,
}

SECTIONS: list[SectionSpec] = [
    SectionSpec("spec", "Model and RoPE", measured.render_spec, summary="What each layer rotates, as read and verified."),
    SectionSpec("usage", "Frequency usage", measured.render_usage,
                summary="Per-plane query and key norms over the corpus, by band."),
    SectionSpec("bands", "Band decomposition of attention", measured.render_bands,
                summary="Each band's share of the attended key's margin, of the logit variance and of |logit|."),
    SectionSpec("positional-heads", "Positional heads", rerun.render_heads, rerun.measure_heads,
                summary="Heads scored by how much of their attention the highest-frequency planes decide (diagonal "
                        "and previous-token heads), with each head's score, its pattern and the planes it uses."),
    SectionSpec("attention-sinks", "Attention sinks by band", rerun.render_sinks, rerun.measure_sinks,
                summary="Heads that sink on the first position (attention above ε = 0.3) and the bands that make it "
                        "attractive."),
    SectionSpec("attention-distance", "Attention by distance", rerun.render_distance, rerun.measure_distance,
                summary="Mean band logit and attention probability by query–key distance, with U-shapes and their "
                        "cause."),
    SectionSpec("massive-values", "Massive values", rerun.render_massive, rerun.measure_massive,
                summary="Dimensions of the pre-RoPE queries and keys with outsized norms, and the planes they sit in."),
    SectionSpec("prope-sweep", "p-RoPE inference sweep", variants.render_prope, variants.measure_prope,
                needs=("variants_baseline",),
                summary="Perplexity when only the fraction p of the highest frequencies keeps rotating at inference "
                        "(p = 1 is RoPE, p = 0 NoPE), with the reversed and partial variants."),
    SectionSpec("pe-geometry", "PE geometry", theory.render_geometry, theory.measure_geometry,
                summary="RoPE's \"long-term decay\" for this model's frequencies: constant versus Gaussian q and k."),
    SectionSpec("context-extension", "Context extension", variants.render_context, variants.measure_context,
                needs=("variants_baseline",),
                summary="Perplexity beyond the trained context under position interpolation, NTK, YaRN, Llama 3 "
                        "and LongRoPE scaling of these frequencies."),
]


def register_section(spec: SectionSpec, *, before: str | None = None) -> None:
    """Add a section, or replace the one with the same key (keeping its place)."""
    if not callable(spec.render) or (spec.measure is not None and not callable(spec.measure)):
        raise InputError(f"section {spec.key!r}: render and measure must be functions (the steps themselves)")
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
