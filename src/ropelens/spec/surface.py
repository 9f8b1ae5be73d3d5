"""What a model's surface declares, read before any backend is chosen: whether it is a
TransformerLens bridge (its ``blocks`` and hook points), the flags such a bridge carries, and the
structures its hook points cannot capture; whether it is an nnsight model, and the model ropelens
runs for it (:func:`running_model`, filled in by :mod:`ropelens.backends`).

The one place below the backends that looks at a bridge's own attributes; :mod:`ropelens.backends`
chooses how a model runs from :func:`is_bridge`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

__all__ = [
    "bridge_refusal",
    "declared_adjacent_pairs",
    "drop_wrapper_forward",
    "is_bridge",
    "is_nnsight",
    "nnsight_module",
    "register_runner",
    "running_model",
]

# what turns a wrapper ropelens does not run itself into the model it runs (the backends register
# theirs on import: an nnsight model becomes the plain model of the HF model it wraps)
_RUNNERS: list[Callable[[Any], Any]] = []


def is_bridge(model) -> bool:
    """Whether ``model`` is a TransformerLens bridge: it wraps an HF model (``original_model``) in
    ``blocks``."""
    return hasattr(model, "original_model") and hasattr(model, "blocks")


def bridge_refusal(
    model,
    arch: str,
    *,
    chunked: str | None = None,
    mla: bool = False,
    kv_shared: list[int] | tuple[int, ...] = (),
) -> str | None:
    """Why TransformerLens bridge ``model`` cannot capture an architecture's q and k exactly (None:
    it can, or ``model`` is not a bridge): chunked attention (``chunked``: why), multi-head latent
    attention, layers reusing an earlier layer's keys (``kv_shared``). The plain HF model measures
    all three."""
    if not is_bridge(model):
        return None
    if chunked:
        return (
            f"{arch}: chunked attention is measured on the plain HF model ({chunked}): load it "
            "with ropelens.load_model, which runs it without the bridge."
        )
    if mla:
        return (
            f"{arch}: multi-head latent attention is measured on the plain HF model "
            "(TransformerLens's MLA bridge fires no pre-RoPE q/k hook): load it with "
            "ropelens.load_model, which runs it without the bridge."
        )
    if kv_shared:
        return (
            f"{arch}: layers {list(kv_shared)} reuse an earlier layer's keys "
            "(num_kv_shared_layers, Gemma 4 E2B/E4B) and compute none of their own, so ropelens "
            "cannot capture the keys their scores are made of."
        )
    return None


def declared_adjacent_pairs(model) -> bool | None:
    """Whether a bridge's config declares that its RoPE rotates adjacent pairs (GLM/ERNIE
    ``rotary_adjacent_pairs``, Cohere ``rotary_interleaved_cos_sin``); None where no such flags
    exist (a plain HF model): measure it then."""
    if not is_bridge(model):
        return None
    cfg = getattr(model, "cfg", None)
    return bool(getattr(cfg, "rotary_adjacent_pairs", False)) or bool(
        getattr(cfg, "rotary_interleaved_cos_sin", False)
    )


def nnsight_module(model) -> Any:
    """The module an nnsight wrapper (``nnsight.LanguageModel``, ``TransformersModel``,
    ``NNsight``) holds, or None for anything else: told by what the object is, an instance of a
    class from the ``nnsight`` package keeping its module (``_module``; ``_model`` in nnsight
    before 0.5), never by importing nnsight."""
    if not any(c.__module__.partition(".")[0] == "nnsight" for c in type(model).__mro__):
        return None
    held = getattr(model, "__dict__", {})
    return next((held[k] for k in ("_module", "_model") if held.get(k) is not None), None)


def is_nnsight(model) -> bool:
    """Whether ``model`` is an nnsight wrapper of a module (:func:`nnsight_module`)."""
    return nnsight_module(model) is not None


def register_runner(runner: Callable[[Any], Any]) -> None:
    """Add ``runner(model)``: the model ropelens runs for ``model``, ``model`` itself where the
    runner does not know it."""
    if runner not in _RUNNERS:
        _RUNNERS.append(runner)


def running_model(model) -> Any:
    """The model ropelens reads and runs for ``model``: ``model`` itself, or what a registered
    runner makes of a wrapper (an nnsight model: the plain model of the HF model it wraps)."""
    for runner in _RUNNERS:
        model = runner(model)
    return model


def drop_wrapper_forward(view, module) -> None:
    """Give ``view``, a shallow copy of ``module``, its class's forward where nnsight replaced the
    module's forward on the instance: nnsight's controller is bound to ``module`` itself (the copy
    would run the original), and outside nnsight's trace it runs the class's forward anyway."""
    forward = module.__dict__.get("forward")
    if forward is not None and type(forward).__module__.partition(".")[0] == "nnsight":
        view.__dict__.pop("forward", None)
