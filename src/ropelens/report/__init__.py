"""The ropelens report: one self-contained HTML page, report.json and tidy CSVs.

Everything is measured first (the streaming pass, then each section's measure step); renderers
then lay out what was measured and never run the model.
"""

from ropelens.report.build import DEFAULT_BAND_TOKENS, build_report
from ropelens.report.registry import SECTIONS, Section, SectionSpec, register_section

__all__ = ["DEFAULT_BAND_TOKENS", "SECTIONS", "Section", "SectionSpec", "build_report", "register_section"]
