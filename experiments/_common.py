"""Shared pieces of the experiment scripts: loading a model by name, provenance, output paths."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import ropelens
from ropelens.spec.reading import model_label

# --layer-kind → the layer_kind ropelens.spec.variants takes (None: every layer).
LAYER_KINDS = {"global": "full", "local": "sliding", "both": None, "all": None}


def load(model: Any) -> tuple[Any, str]:
    """(bridge, name) from a model object, ``tiny-llama``/``tiny-gemma3`` or an embedded name."""
    if not isinstance(model, str):
        return model, model_label(model)
    if model.startswith("tiny-"):
        from ropelens.testing import tiny_model

        return tiny_model(model.removeprefix("tiny-")), model
    return ropelens.load_model(model, device="cpu"), model


def layer_kinds(name: str, requested: str, model: Any) -> list[str]:
    """The layer kinds to sweep: global/local/both only mean something where both kinds exist."""
    kinds = {lr.kind for lr in ropelens.rope_spec(model).layers}
    if len(kinds) < 2:
        return ["all"]
    if requested not in ("global", "local", "both", "all"):
        raise ValueError(
            f"--layer-kind must be global, local or both for {name}, got {requested!r}"
        )
    return ["global", "local", "both"] if requested == "all" else [requested]


def out_dir(path: str | os.PathLike[str]) -> Path:
    p = Path(path)
    p.mkdir(parents=True, exist_ok=True)
    return p
