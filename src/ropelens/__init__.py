"""ropelens: which RoPE frequencies a model uses, and for what."""

from ropelens.models import (
    DEFAULT_MODEL,
    EMBEDDED_MODELS,
    NotRotaryError,
    cache_dir,
    load_model,
    rope_spec,
)
from ropelens.rope import LayerRope, RopeSpec

__version__ = "0.1.0"

__all__ = [
    "DEFAULT_MODEL",
    "EMBEDDED_MODELS",
    "LayerRope",
    "NotRotaryError",
    "RopeSpec",
    "cache_dir",
    "load_model",
    "rope_spec",
]
