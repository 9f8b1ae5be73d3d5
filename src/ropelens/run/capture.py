"""Streaming per-head query/key capture.

One forward pass per batch; hooks hand each layer's tensors to *reducers*, which fold them into
running sums and drop them, so memory does not grow with the corpus. Reducers are mergeable:
partial results from separate runs add up exactly.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field

import torch
from jaxtyping import Int
from torch import Tensor
from tqdm.auto import tqdm

from ropelens.backends import backend_of
from ropelens.backends.acts import NEEDS, LayerActs, Reducer
from ropelens.backends.sdpa_capture import QK_NEEDS, fast_qk, right_padded
from ropelens.devices import device_of
from ropelens.errors import InputError
from ropelens.spec.reading import rope_spec
from ropelens.spec.rope import RopeSpec
from ropelens.spec.rotary_state import rotary_state_kept
from ropelens.spec.surface import running_model

__all__ = [
    "DeviceSums",
    "LayerActs",
    "Reducer",
    "Moments",
    "stream",
    "capture_qk",
    "batches",
    "sum_dtype",
]


def sum_dtype(device: torch.device) -> torch.dtype:
    """What running sums accumulate in on ``device``: float64, or float32 on MPS (which has no
    float64)."""
    return torch.float32 if device.type == "mps" else torch.float64


# band-logit entries per tile: 2^21 (8 MiB of float32) measured best on the CPU
# (benchmarks/core_bench.py --tile). On CUDA the cost is per tile (kernel launches, the tile's edge
# masks), so tiles are as large as memory allows: 2^28 entries (about 1 GB more at peak) ran band
# statistics 4.1x faster than 2^26 on an H200 (benchmarks/gpu_bench.py --tile-elements), capped at
# 1/64 of the device's memory so that small GPUs keep room for the model.
TILE_ELEMENTS = {"cpu": 1 << 21}
TILE_ELEMENTS_CUDA_MAX = 1 << 28
TILE_ELEMENTS_ACCELERATOR = 1 << 26
MIN_TILE = 16  # queries: below this, per-tile overhead dominates whatever the memory


def tile_elements(device: torch.device) -> int:
    """Band-logit entries one tile may hold on ``device``: fixed on the CPU and MPS; on CUDA
    :data:`TILE_ELEMENTS_CUDA_MAX`, or 1/64 of the device's total memory in bytes where that is
    less (a function of the device alone, so tiles, and the order sums are added in, repeat)."""
    if device.type in TILE_ELEMENTS:
        return TILE_ELEMENTS[device.type]
    if device.type == "cuda":
        total = torch.cuda.get_device_properties(device).total_memory
        return max(TILE_ELEMENTS_ACCELERATOR >> 2, min(TILE_ELEMENTS_CUDA_MAX, total // 64))
    return TILE_ELEMENTS_ACCELERATOR


def query_tile(device: torch.device, entries_per_query: int) -> int:
    """Queries per tile, so one tile holds about the device's element budget (at least MIN_TILE):
    the tiling policy of every tiled reducer (band statistics, sinks, distance, offsets)."""
    budget = tile_elements(device)
    return max(MIN_TILE, budget // max(1, entries_per_query))


class DeviceSums:
    """Base of reducers whose running sums ``self.sums`` (built on the CPU) live where the
    activations do: moved once, to the device the first activations live on, in :func:`sum_dtype` of
    it; layers a device map puts elsewhere send their per-batch results there. No host round trip
    per update."""

    sums: dict[str, Tensor]
    _placed = False

    def _on(self, device: torch.device) -> dict[str, Tensor]:
        """The running sums, moved once to the device the first activations live on (layers a device
        map puts elsewhere send their per-batch results there)."""
        if not self._placed:
            self.sums = {k: v.to(device, sum_dtype(device)) for k, v in self.sums.items()}
            self._placed = True
        return self.sums


@dataclass
class Moments:
    """Mergeable running count, sum and sum of squares of a tensor-valued statistic."""

    count: Tensor
    total: Tensor
    total_sq: Tensor

    @classmethod
    def zeros(cls, shape: Sequence[int]) -> Moments:
        def z():
            return torch.zeros(tuple(shape), dtype=torch.float64)

        return cls(z(), z(), z())

    def add(self, x: Tensor, weight: Tensor | float = 1.0, dim: int | Sequence[int] = 0) -> None:
        """Add samples ``x`` (weighted 0/1 to mask) summed over ``dim``."""
        x = x.double()
        w = torch.as_tensor(weight, dtype=torch.float64, device=x.device).expand_as(x)
        self.count += w.sum(dim).cpu()
        self.total += (x * w).sum(dim).cpu()
        self.total_sq += (x * x * w).sum(dim).cpu()

    def merge(self, other: Moments) -> Moments:
        return Moments(
            self.count + other.count, self.total + other.total, self.total_sq + other.total_sq
        )

    def to(self, device: torch.device | str, dtype: torch.dtype | None = None) -> Moments:
        """The same sums on ``device`` (in :func:`sum_dtype` of it unless ``dtype`` is given)."""
        device = torch.device(device)
        dtype = dtype or sum_dtype(device)
        return Moments(
            self.count.to(device, dtype),
            self.total.to(device, dtype),
            self.total_sq.to(device, dtype),
        )

    @property
    def mean(self) -> Tensor:
        return self.total / self.count.clamp_min(1)

    @property
    def std(self) -> Tensor:
        """Sample standard deviation (n − 1 denominator)."""
        n = self.count
        var = (self.total_sq - self.total**2 / n.clamp_min(1)) / (n - 1).clamp_min(1)
        return var.clamp_min(0).sqrt()

    def sem(self) -> Tensor:
        """Standard error of the mean."""
        return self.std / self.count.clamp_min(1).sqrt()

    def to_dict(self) -> dict[str, list]:
        return {
            "count": self.count.tolist(),
            "total": self.total.tolist(),
            "total_sq": self.total_sq.tolist(),
        }

    @classmethod
    def from_dict(cls, d: dict[str, list]) -> Moments:
        def t(v):
            return torch.tensor(v, dtype=torch.float64)

        return cls(t(d["count"]), t(d["total"]), t(d["total_sq"]))


def batches(tokens: Int[Tensor, "n pos"], batch_size: int) -> Iterator[Int[Tensor, "b pos"]]:
    """Split a window tensor into batches."""
    if tokens.ndim != 2:
        raise InputError(f"tokens must be [n_windows, n_ctx], got shape {tuple(tokens.shape)}")
    if batch_size < 1:
        raise InputError(f"batch_size must be ≥ 1, got {batch_size}")
    for i in range(0, tokens.shape[0], batch_size):
        yield tokens[i : i + batch_size]


def stream(
    model,
    data: Iterable[Tensor | tuple[Tensor, Tensor]],
    reducers: Sequence[Reducer],
    *,
    layers: Sequence[int] | None = None,
    spec: RopeSpec | None = None,
    progress: bool = True,
    desc: str = "ropelens",
    total: int | None = None,
    fast: bool = True,
) -> int:
    """Run the model over ``data`` (token batches, or ``(tokens, valid)`` pairs for right padding).

    ``valid`` marks each row's real tokens, which must come first (right padding): positions are
    indices in the window, so left padding or a gap is refused
    (:func:`ropelens.backends.sdpa_capture.right_padded`).

    Calls every reducer once per layer per batch; returns the number of valid tokens seen. The
    forward stops after the last requested layer (on the fast path, at its rotation). When the
    reducers need only queries and keys and ``fast`` is on, the HF model runs with its own sdpa
    attention (:mod:`ropelens.backends.sdpa_capture`) instead of the bridge, where the family allows
    it; the numbers are the same (your own bridge hooks do not fire on that path: pass
    ``fast=False`` to keep them). One host synchronisation per batch asks whether it holds padding;
    reducers read the answer from :attr:`LayerActs.padded`.
    """
    spec = spec if spec is not None else rope_spec(model)
    chosen, needs = _chosen_layers_and_needs(spec, layers, reducers)
    backend = backend_of(model)
    # the fast path taps rotations, which NoPE layers never make: those go through the backend's
    # capture
    use_fast = fast and needs <= QK_NEEDS and all(spec.layers[layer].rotary for layer in chosen)
    device = device_of(model)
    count = _TokenCount()
    with torch.no_grad(), contextlib.ExitStack() as session:
        run_batch = _BatchRunner(model, spec, chosen, reducers, needs, use_fast, backend, session)
        for item in tqdm(data, desc=desc, total=total, disable=not progress, unit="batch"):
            tokens, valid = _batch_on(device, item)
            _require_static_masks(spec, chosen, reducers, n_ctx=tokens.shape[1])
            # the one host synchronisation per batch: does it hold padding (then sdpa needs a mask),
            # and is it right padding (positions are indices in the window: anything else is
            # refused, not measured wrong)
            padded = right_padded(valid)
            count.add(valid, padded)
            # each batch from the rotary state a fresh model has, not the one the batch before left
            with rotary_state_kept(model):
                run_batch(tokens, valid, padded)
    return count.total()


def _chosen_layers_and_needs(
    spec: RopeSpec, layers: Sequence[int] | None, reducers: Sequence[Reducer]
) -> tuple[list[int], frozenset[str]]:
    """The layers to capture (NoPE layers only when named) and the tensors the reducers need."""
    chosen = spec.layer_indices(layers, rotary_only=layers is None)
    if not chosen:
        raise InputError("no layers selected: pass layer indices the model has")
    needs = frozenset().union(*(reducer.needs for reducer in reducers))
    unknown = needs - NEEDS
    if unknown:
        raise InputError(
            f"reducers ask for unknown tensors {sorted(unknown)}; known: {sorted(NEEDS)}"
        )
    return chosen, needs


def _batch_on(device: torch.device, item: Tensor | tuple[Tensor, Tensor]) -> tuple[Tensor, Tensor]:
    """A batch's tokens and valid mask (all valid when not given) on ``device``, shapes checked."""
    tokens, valid = item if isinstance(item, tuple) else (item, None)
    tokens = tokens.to(device)
    valid = torch.ones_like(tokens, dtype=torch.bool) if valid is None else valid.to(device).bool()
    if valid.shape != tokens.shape:
        raise InputError(
            f"valid mask shape {tuple(valid.shape)} != tokens shape {tuple(tokens.shape)}"
        )
    return tokens, valid


def _require_static_masks(
    spec: RopeSpec, chosen: Sequence[int], reducers: Sequence[Reducer], n_ctx: int
) -> None:
    """Refuse a reducer that assumes the causal mask on a layer whose indexer drops keys at
    ``n_ctx``."""
    for layer in chosen:
        for reducer in reducers:
            if getattr(reducer, "static_mask", None):
                spec.layers[layer].require_static_mask(n_ctx, reducer.static_mask)


@dataclass
class _TokenCount:
    """Valid tokens seen: of unpadded batches counted on the host, of padded ones summed on the
    device (no host synchronisation per batch)."""

    on_host: int = 0
    on_device: Tensor | None = None

    def add(self, valid: Tensor, padded: bool) -> None:
        """Count one batch's valid tokens."""
        if padded:
            self.on_device = valid.sum() if self.on_device is None else self.on_device + valid.sum()
        else:
            self.on_host += valid.numel()

    def total(self) -> int:
        """Every valid token counted."""
        return self.on_host + (0 if self.on_device is None else int(self.on_device))


class _BatchRunner:
    """Captures one batch and folds each layer's tensors into the reducers: on the fast q/k path
    while the model takes it, otherwise (from then on) in the backend's capture session."""

    def __init__(
        self,
        model,
        spec: RopeSpec,
        chosen: Sequence[int],
        reducers: Sequence[Reducer],
        needs: frozenset[str],
        use_fast: bool,
        backend,
        session: contextlib.ExitStack,
    ) -> None:
        self.model, self.spec, self.chosen, self.reducers = model, spec, chosen, reducers
        self.needs, self.use_fast, self.backend, self.session = needs, use_fast, backend, session
        self.run = None  # the backend's capture session, opened on its first batch

    def __call__(self, tokens: Tensor, valid: Tensor, padded: bool) -> None:
        """Capture ``tokens`` and fold every chosen layer's tensors into the reducers."""

        def fold(layer: int, tensors: dict[str, Tensor]) -> None:
            acts = LayerActs(
                layer=layer,
                rope=self.spec.layers[layer],
                valid=valid,
                tensors=tensors,
                padded=padded,
            )
            for reducer in self.reducers:
                reducer.update(acts)

        if self.use_fast:
            got = fast_qk(
                self.model,
                self.spec,
                tokens,
                valid,
                self.chosen,
                keep=self.needs,
                on_layer=fold,
                padded=padded,
            )
            if got is not None:
                # layers not handed over while the forward ran (first batch)
                for layer in sorted(got):
                    fold(layer, got[layer])
                return
        # this model cannot take the fast path: every batch takes the backend's capture
        self.use_fast = False
        if self.run is None:
            self.run = self.session.enter_context(
                self.backend.capture_session(self.spec, self.chosen, self.reducers)
            )
        self.run(tokens, valid, padded, fold)


@dataclass
class _Keep:
    """Reducer that keeps the tensors (for small inputs: decomposition of given tokens)."""

    needs: frozenset[str]
    kept: dict[int, LayerActs] = field(default_factory=dict)

    def update(self, acts: LayerActs) -> None:
        prev = self.kept.get(acts.layer)
        if prev is None:
            self.kept[acts.layer] = acts
            return
        for k, v in acts.tensors.items():
            prev.tensors[k] = torch.cat([prev.tensors[k], v])
        prev.valid = torch.cat([prev.valid, acts.valid])


def capture_qk(
    model,
    tokens: Int[Tensor, "batch pos"],
    *,
    layers: Sequence[int] | None = None,
    which: Iterable[str] = ("q_pre", "k_pre", "q_post", "k_post"),
    batch_size: int = 8,
    progress: bool = False,
    fast: bool = True,
    spec: RopeSpec | None = None,
    valid: Tensor | None = None,
) -> dict[int, LayerActs]:
    """Capture per-head tensors for ``tokens`` and keep them: ``{layer: LayerActs}``.

    ``valid`` (``[batch, pos]`` bool, True on real tokens, which come first in each row) marks
    right padding: the model's attention masks it, and each layer's ``valid`` keeps it.

    Keys are KV heads (query head h reads KV head ``h // rope.group_size``). ``spec`` (default: read
    from the model) says how the tensors are laid out (the probe passes the reading it checks).

    Everything captured is kept in memory, so this suits a few texts; the corpus analyses stream
    instead (:func:`ropelens.run.measure.measure`), with memory independent of the corpus's size.

    Args:
        model: A model from :func:`ropelens.load_model` (or an nnsight model wrapping one).
        tokens (Tensor): ``[batch, pos]`` token ids (``model.to_tokens(...)``: BOS first).
        layers (Sequence[int] | None): Layers to capture; None: every rotary layer.
        which (Iterable[str]): Which tensors to keep: ``"q_pre"``/``"k_pre"`` (before the
            rotation), ``"q_rot"``/``"k_rot"`` (the rotation's output), ``"q_post"``/``"k_post"``
            (where they enter the score; the same as the rotated ones unless the layer changes
            them after RoPE), ``"pattern"`` (the attention pattern), ``"selected"`` (the keys a
            sparse-attention indexer kept).
        batch_size (int): Rows of ``tokens`` per forward pass.
        progress (bool): Show a progress bar.
        fast (bool): Compute q and k from the layer's inputs without running the rest of
            attention where the backend can (same numbers); False runs the full forward.
        spec (RopeSpec | None): The reading that lays the tensors out; None reads it from the
            model.
        valid (Tensor | None): ``[batch, pos]`` bool, True on real tokens (which come first in
            each row), for right-padded rows; None: every token is real.

    Returns:
        dict[int, LayerActs]: Layer index → its :class:`ropelens.backends.acts.LayerActs`:
        ``tensors`` (also ``acts[name]``) each ``[batch, pos, head, d_head]`` (keys over KV
        heads, rotary dims first), ``rope`` (the layer's :class:`LayerRope`) and ``valid``.

    Raises:
        InputError: When ``valid``'s shape is not ``tokens``'s, or ``which`` names an unknown
            tensor.

    Examples:
        The captured q and k give the model's pre-softmax scores, plane by plane:

        >>> import torch
        >>> from ropelens import capture_qk
        >>> from ropelens.testing import tiny_model
        >>> model = tiny_model("llama-gqa")
        >>> tokens = model.to_tokens("The cat sat on the mat.")  # [1, 24]
        >>> acts = capture_qk(model, tokens, layers=[1], which=("q_post", "k_post"))
        >>> layer = acts[1]
        >>> tuple(layer["q_post"].shape), tuple(layer["k_post"].shape)  # 4 query, 2 KV heads
        ((1, 24, 4, 16), (1, 24, 2, 16))
        >>> q = layer["q_post"][0]
        >>> k = layer["k_post"][0].repeat_interleave(layer.rope.group_size, dim=1)
        >>> planes = layer.rope.split(q)[:, None] * layer.rope.split(k)[None]  # [q, k, h, plane, 2]
        >>> per_plane = planes.sum(-1) * layer.rope.score_scale  # [q, k, head, plane]
        >>> scores = torch.einsum("qhd,khd->qkh", q, k) * layer.rope.score_scale
        >>> torch.allclose(per_plane.sum(-1), scores, atol=1e-6)
        True
    """
    model = running_model(model)  # an nnsight model: the HF model it wraps
    keep = _Keep(needs=frozenset(which))
    data: Iterable = batches(tokens, batch_size)
    if valid is not None:
        if tuple(valid.shape) != tuple(tokens.shape):
            raise InputError(
                f"valid mask shape {tuple(valid.shape)} != tokens shape {tuple(tokens.shape)}"
            )
        data = zip(data, batches(valid, batch_size), strict=True)
    stream(
        model,
        data,
        [keep],
        layers=layers,
        progress=progress,
        fast=fast,
        spec=spec,
    )
    return keep.kept
