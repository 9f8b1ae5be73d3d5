"""Shared fixtures: tiny random models (unit tests) and the real embedded models (integration)."""

from __future__ import annotations

import functools
import os

# Set before transformers or huggingface_hub is imported (they read it once): no test may reach the
# hub, and an unknown name must fail fast instead of retrying a network that is not there.
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest  # noqa: E402

import ropelens  # noqa: E402
from ropelens.testing import tiny_model, tiny_model_dir  # noqa: E402

ROPE_FAMILIES = ("llama", "llama-gqa", "gemma3", "gptj")


@pytest.fixture(scope="session")
def tiny():
    """``tiny(family)``: a tiny random bridge model, built once per family per session."""
    return functools.cache(tiny_model)


@pytest.fixture(scope="session", params=ROPE_FAMILIES)
def rope_family(request) -> str:
    """Each tiny RoPE family in turn."""
    return request.param


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory):
    """``tiny_dir(family)``: a tiny model saved as an HF directory, once per family per session."""

    @functools.cache
    def make(family: str):
        return tiny_model_dir(family, tmp_path_factory.mktemp(f"tiny-{family}"))

    return make


@pytest.fixture(scope="session")
def smollm2():
    """The embedded SmolLM2-135M, loaded once (converts the GGUF on the first run on a machine)."""
    return ropelens.load_model("smollm2-135m", device="cpu")


@pytest.fixture(scope="session")
def gemma3():
    """The embedded Gemma-3-270M, loaded once (converts the GGUF on the first run on a machine)."""
    return ropelens.load_model("gemma-3-270m", device="cpu")
