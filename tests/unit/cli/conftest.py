"""Fixtures of the command-line tests."""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def _no_debug(monkeypatch):
    """ROPELENS_DEBUG unset: it turns the one-line errors these tests read into tracebacks."""
    monkeypatch.delenv("ROPELENS_DEBUG", raising=False)
