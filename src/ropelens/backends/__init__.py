"""The backends: how ropelens runs a loaded model, chosen once per model
(:mod:`ropelens.backends.base`).

Every model runs on the HF model's own forward; the modules here are the only ones that know how:

- :mod:`~ropelens.backends.base`: :class:`Backend` (one per model, :func:`backend_of`) and the
  :class:`ModelHandle` every layer above reads a model through (:func:`handle`);
- :mod:`~ropelens.backends.engine`: RoPE variants, plane ablations and massive-value replacement
  applied at the rotation the HF forward calls; :mod:`~ropelens.backends.sdpa`: that forward with
  sdpa attention;
- :mod:`~ropelens.backends.sdpa_capture`: pre- and post-RoPE q and k from the HF forward with sdpa,
  stopped at the last rotation asked for;
- :mod:`~ropelens.backends.hf`: :class:`~ropelens.backends.hf.PlainModel`, an HF causal LM behind
  ropelens's surface, and the capture of q, k and patterns from its own eager attention;
- :mod:`~ropelens.backends.bridge_hooks` and :mod:`~ropelens.backends.bridge_capture`: the
  TransformerLens bridge's hook points, for users who want the TL view.
"""

from ropelens.backends.base import (
    Backend,
    BridgeBackend,
    CallableBackend,
    HFBackend,
    ModelHandle,
    backend_of,
    handle,
)

__all__ = [
    "Backend",
    "BridgeBackend",
    "CallableBackend",
    "HFBackend",
    "ModelHandle",
    "backend_of",
    "handle",
]
