"""Findings: sentences written from the measured numbers; each result writes its own (``result.findings()``)."""

from ropelens.results.findings import Finding, head_name

__all__ = ["Finding", "head_name"]
