"""Fixtures of the corpus-run tests."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="module")
def gqa_dir(tiny_dir):
    """The tiny GQA Llama saved as an HF directory: the model the multi-process runs here launch
    on."""
    return tiny_dir("llama-gqa")
