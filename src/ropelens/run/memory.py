"""Memory of whole attention matrices, estimated before an analysis allocates them, and the
context a model was trained on.

Most analyses never hold a ``[heads, n, n]`` matrix: band statistics, sinks, distance, offsets and
symbolic fits rebuild the scores in query tiles sized to the device (:func:`ropelens.run.capture
.query_tile`), so their memory is O(tile · n). Three things keep whole matrices, because what they
return is the matrix itself:

- :func:`ropelens.analyses.attention_decomposition` (and
  :func:`ropelens.analyses.mrope_decomposition`) keeps every chosen layer's attention pattern
  ``[batch, head, n, n]`` (the forward makes it with eager attention);
- the band mixer (:meth:`AttentionDecomposition.explore`, ``ropelens explore``) judges how q and k
  can be stored from the float64 pattern of every band, of every band's complement and of all dims,
  once exact and once as stored: ``2 · (1 + 2 · bands) + 3`` float64 ``[head, n, n]`` matrices of
  one layer at a time;
- the band and plane terms (:meth:`AttentionDecomposition.band_logits`, ``band_patterns``,
  ``plane_logits``, ``logits``, ``rebuilt_pattern``, ``cauchy_schwarz``)
  ``[batch, head, terms, n, n]``, up to three copies of them.

An eager forward makes one layer's ``[batch, head, n, n]`` scores at a time even where nothing is
kept; :func:`ropelens.analyses.retrieval_heads`, which reads every layer's probabilities from one,
estimates it too (:func:`eager_forward_bytes`).

Each estimates its peak here, from the shapes and the dtype, and hands it to
:func:`ropelens.devices.require_memory`, which refuses in one line naming the estimate, the memory
free (``/proc/meminfo``'s MemAvailable on the CPU, ``torch.cuda.mem_get_info`` on CUDA) and the
argument or flag that lowers it, before anything of that size exists.

How close the estimates are (tiny Llama, 2 layers × 4 heads, four bands, float32, CPU; the peak
RSS, ``resource.getrusage``, over the model's own): the decomposition of 2,000 tokens took 218 MB
against 272 MB estimated (the estimate 25 % above); the band mixer of 1,600 tokens (decomposition
and page) 1.83 GB against 1.80 GB (1.4 % below); the page's float64 matrices of 1,200 tokens
0.99 GB against 0.97 GB (2 % below), which tests/unit/run/test_memory_guard.py measures on every
run. Below about 1,000 tokens the measured peak runs up to 2.5× the estimate, from the C allocator
keeping freed matrices under its 32 MB mmap threshold; those sizes are far below any machine's
memory, so the guard refuses the same runs either way.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import torch

from ropelens.devices import require_memory
from ropelens.spec.bands import Bands
from ropelens.spec.reading import hf_model_of
from ropelens.spec.rope import RopeSpec

__all__ = [
    "band_mixer_bytes",
    "band_terms_bytes",
    "decomposition_bytes",
    "eager_forward_bytes",
    "explore_bytes",
    "require_decomposition_room",
    "trained_context",
]

# live [batch, head, n, n] score matrices of one eager attention layer during the forward: its
# scores and their softmax (a capture hook keeps the softmax; the masked scores are freed after)
FORWARD_SCORE_COPIES = 2
# the band mixer's transient float64 matrices beside the two sets of subset patterns: the scores,
# their masked copy and the softmax of one subset (rope.probs), or the difference and its |.|
MIXER_TRANSIENT_COPIES = 3
# copies of [batch, head, terms, n, n] alive while the terms are built, masked or softmaxed
TERMS_COPIES = 3
FLOAT64 = 8


def _width(dtype: torch.dtype) -> int:
    return torch.empty((), dtype=dtype).element_size()


def _heads(spec: RopeSpec, layers: Iterable[int]) -> list[int]:
    return [int(spec.layers[L].n_heads) for L in layers]


def decomposition_bytes(
    spec: RopeSpec, layers: Iterable[int], rows: int, n: int, dtype: torch.dtype, batch_size: int
) -> int:
    """Peak bytes of :func:`ropelens.analyses.attention_decomposition` on ``rows`` inputs of ``n``
    tokens: every chosen layer's pattern ``[rows, head, n, n]`` kept, and one layer's eager
    scores for ``batch_size`` rows, with its ``[n, n]`` mask, during the forward."""
    layers = list(layers)
    kept = sum(_heads(spec, layers)) * rows * n * n * _width(dtype)
    return kept + eager_forward_bytes(spec, layers, min(rows, batch_size), n, dtype)


def eager_forward_bytes(
    spec: RopeSpec, layers: Iterable[int], rows: int, n: int, dtype: torch.dtype
) -> int:
    """Peak bytes of the score matrices of an eager forward of ``rows`` inputs of ``n`` tokens:
    the layer with the most heads among ``layers``, its scores and their softmax, and the
    ``[n, n]`` mask."""
    heads = max(_heads(spec, layers), default=0)
    return rows * (FORWARD_SCORE_COPIES * heads + 1) * n * n * _width(dtype)


def require_decomposition_room(
    spec: RopeSpec,
    layers: Sequence[int],
    rows: int,
    n: int,
    dtype: torch.dtype,
    batch_size: int,
    device: torch.device,
) -> None:
    """Refuse, before the forward, a decomposition whose kept patterns and forward
    (:func:`decomposition_bytes`) do not fit in the memory free: on ``device``, and on the host
    too where the patterns come back to it from an accelerator."""
    what = (
        f"decomposing {rows} × {n:,} tokens in {len(layers)} layer(s) (each layer's "
        f"[{rows}, head, {n}, {n}] attention pattern is kept)"
    )
    lower = (
        f"pass fewer tokens (a shorter text; {n:,} now), fewer layers (layers=[...]; "
        f"{len(layers)} now) or fewer texts"
    )
    require_memory(
        decomposition_bytes(spec, layers, rows, n, dtype, batch_size), what, lower, device
    )
    if torch.device(device).type != "cpu":
        require_memory(decomposition_bytes(spec, layers, rows, n, dtype, 0), what, lower, "cpu")


def band_mixer_bytes(spec: RopeSpec, layers: Iterable[int], n: int, bands: Bands) -> int:
    """Peak bytes the band mixer page of one ``n``-token row builds beside the decomposition: its
    largest layer's ``2 · (1 + 2 · bands) + 3`` float64 ``[head, n, n]`` matrices (see the
    module's doc)."""
    worst = 0
    for L in layers:
        subsets = 1 + 2 * bands.resolve(spec.layers[L]).n_bands
        matrices = 2 * subsets + MIXER_TRANSIENT_COPIES
        worst = max(worst, matrices * int(spec.layers[L].n_heads) * n * n * FLOAT64)
    return worst


def explore_bytes(
    spec: RopeSpec, layers: Iterable[int], n: int, bands: Bands, dtype: torch.dtype
) -> int:
    """Peak bytes of ``ropelens explore`` on one ``n``-token input: the decomposition's patterns
    (kept while the page is built) and the page's matrices, or the forward where it is larger."""
    layers = list(layers)
    width = _width(dtype)
    kept = sum(_heads(spec, layers)) * n * n * width
    forward = decomposition_bytes(spec, layers, 1, n, dtype, 1) - kept
    return kept + max(forward, band_mixer_bytes(spec, layers, n, bands))


def band_terms_bytes(rows: int, heads: int, terms: int, n: int, dtype: torch.dtype) -> int:
    """Peak bytes of ``terms`` band or plane terms of every logit, ``[rows, head, terms, n, n]``
    (:meth:`AttentionDecomposition.band_logits` and the methods built on it)."""
    return TERMS_COPIES * rows * heads * terms * n * n * _width(dtype)


def trained_context(model: Any) -> int | None:
    """The context ``model`` was trained on, in tokens: its config's ``max_position_embeddings``
    (``n_positions``), else its rotary parameters' ``original_max_position_embeddings``, else a
    bridge's ``cfg.n_ctx``; None where nothing says."""
    try:
        hf = hf_model_of(model)
    except TypeError:  # neither a bridge nor an HF model: a bridge-like config alone may say
        hf = None
    config = getattr(hf, "config", None)
    if config is not None and hasattr(config, "get_text_config"):
        config = config.get_text_config()
    for name in ("max_position_embeddings", "n_positions"):
        value = getattr(config, name, None)
        if isinstance(value, int) and value > 0:
            return value
    rope = getattr(config, "rope_parameters", None) or getattr(config, "rope_scaling", None)
    if isinstance(rope, dict):
        value = rope.get("original_max_position_embeddings")
        if isinstance(value, int) and value > 0:
            return value
    value = getattr(getattr(model, "cfg", None), "n_ctx", None)
    return value if isinstance(value, int) and value > 0 else None
