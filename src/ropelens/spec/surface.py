"""What a model's surface declares, read before any backend is chosen: whether it is a
TransformerLens bridge (its ``blocks`` and hook points), the flags such a bridge carries, and the
structures its hook points cannot capture.

The one place below the backends that looks at a bridge's own attributes; :mod:`ropelens.backends`
chooses how a model runs from :func:`is_bridge`.
"""

from __future__ import annotations

__all__ = ["bridge_refusal", "declared_adjacent_pairs", "is_bridge"]


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
