"""The ropelens report: one self-contained HTML page, report.json and tidy CSVs.

Everything is measured first (the streaming pass, then each section's measure step); renderers then
lay out what was measured and never run the model. The sections are those of the registered analyses
(:func:`ropelens.report.registry.sections`), each declared with its analysis in
``ropelens.catalog``.
"""

from ropelens.report.build import DEFAULT_BAND_TOKENS, build_report
from ropelens.report.registry import Section, SectionSpec, register_section, sections

__all__ = [
    "DEFAULT_BAND_TOKENS",
    "Section",
    "SectionSpec",
    "build_report",
    "register_section",
    "sections",
]
