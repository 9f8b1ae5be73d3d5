"""Massive values in queries and keys (Jin et al. 2025), and replacing them.

Jin et al. ("Massive Values in Self-Attention Modules are the Key to Contextual Knowledge
Understanding") find a few dimensions of the pre-RoPE queries and keys whose values are far larger
than the rest, concentrated in the low-frequency RoPE planes and absent from values. ropelens
measures, per layer × head (KV heads for keys) × dimension, the L2 norm of each dimension over the
tokens of a corpus, and calls a dimension *massive* when that norm exceeds ``factor`` times the mean
dimension norm of its head (5×, the rule of the public Llama-2-7B replication). Each dimension maps
to the RoPE plane it belongs to (``LayerRope.plane_dims``; plane 0 is the highest frequency), so a
result says which planes hold massive values, at what frequency, and in how many layers.

``MassiveReducer`` streams sums and sums of squares per dimension (mergeable exactly);
``massive_values`` runs it over a corpus. ``replace_massive`` sets the massive dimensions of q and k
to their corpus mean before RoPE (through the bridge's hooks, or at the rotation of the HF sdpa
forward that loss and passkey decoding run on), and its ``control=True`` form does the
same to as many randomly chosen non-massive dimensions of each head.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace
from typing import Any, Literal

import einops
import numpy as np
import pandas as pd
import torch
from jaxtyping import Bool, Float, Int
from torch import Tensor

from ropelens.backends import backend_of
from ropelens.backends.sdpa import planned
from ropelens.backends.sdpa_capture import intervened
from ropelens.errors import InputError
from ropelens.results.provenance import Provenance
from ropelens.results.result import Result
from ropelens.run.capture import LayerActs, Moments
from ropelens.run.measure import RunOptions, corpus_analysis, measure
from ropelens.spec.plan import ReplaceStep
from ropelens.spec.reading import rope_spec
from ropelens.spec.rope import RopeSpec, layer_ranges
from ropelens.spec.surface import running_model
from ropelens.validate import check_number

__all__ = ["MassiveReducer", "MassiveValues", "massive_values", "replace_massive"]

Which = Literal["q", "k"]
_WHICH = ("q", "k")


def _check_which(which: str) -> str:
    if which not in _WHICH:
        raise InputError(f"which must be 'q' (queries) or 'k' (keys), got {which!r}")
    return which


def _check_factor(factor: Any) -> float:
    return check_number(
        factor,
        "factor",
        above=1,
        hint=" (a dimension is massive when its norm exceeds factor × its head's mean; 5 is usual)",
    )


_HEADS = {"q": "head", "k": "kv_head"}  # the width axis of each one's heads


def _zero_moments(spec: RopeSpec, layers: Sequence[int], which: str) -> Moments:
    """``[layer, head, dim]`` moments (KV heads for keys), padded to the widest layer: NaN past a
    layer's own."""

    def z():
        return spec.padded_zeros(layers, _HEADS[which], "dim")

    return Moments(z(), z(), z())


def _dim_planes(spec: RopeSpec, layer: int) -> Int[Tensor, " d_head"]:
    """The RoPE plane each head dimension belongs to (−1 for dimensions that are not rotated)."""
    lr = spec.layers[layer]
    out = torch.full((lr.head_dim,), -1, dtype=torch.long)
    dims = lr.plane_dims  # [P, 2]
    out[dims[:, 0]] = torch.arange(lr.n_planes)
    out[dims[:, 1]] = torch.arange(lr.n_planes)
    return out


class MassiveReducer:
    """Streams, per layer × head × dimension of the pre-RoPE q and k, the token count, sum and sum
    of squares.

    All sums are float64 and exact to merge: the L2 norm of a dimension over tokens is the square
    root of its sum of squares, the corpus mean its sum over the count.
    """

    def __init__(self, spec: RopeSpec, layers: Sequence[int]) -> None:
        self.spec, self.layers = spec, list(layers)
        if not self.layers:
            raise InputError("no layers selected: pass layer indices the model has")
        self.needs = frozenset({"q_pre", "k_pre"})
        self.pos = {L: i for i, L in enumerate(self.layers)}
        self.moments = {w: _zero_moments(spec, self.layers, w) for w in _WHICH}
        self._placed = False

    def state_dict(self) -> dict[str, Tensor]:
        """Every running sum by name (the tensors themselves): they add across runs and
        processes."""
        return {
            f"{w}/{f}": getattr(m, f)
            for w, m in self.moments.items()
            for f in ("count", "total", "total_sq")
        }

    def update(self, acts: LayerActs) -> None:
        """Add one layer's per-(head, dim) count, sum and sum of squares of pre-RoPE q and k."""
        layer_slot = self.pos[acts.layer]
        if not self._placed:
            # sums live where the first activations do (no host round trip per layer)
            self.moments = {
                which: moments.to(acts.valid.device) for which, moments in self.moments.items()
            }
            self._placed = True
        for which in _WHICH:
            moments = self.moments[which]
            sums_dtype, sums_device = moments.total.dtype, moments.total.device
            values = acts[f"{which}_pre"].to(sums_dtype)
            _, _, n_heads, head_dim = values.shape
            valid = einops.rearrange(acts.valid.to(sums_dtype), "batch pos -> batch pos 1 1")
            valid_values = values * valid
            # a narrower layer fills its leading heads and dims
            at = (layer_slot, slice(0, n_heads), slice(0, head_dim))
            moments.count[at] += valid.sum().to(sums_device)
            moments.total[at] += einops.reduce(
                valid_values, "batch pos head dim -> head dim", "sum"
            ).to(sums_device)
            moments.total_sq[at] += einops.reduce(
                valid_values * values, "batch pos head dim -> head dim", "sum"
            ).to(sums_device)

    def result(self, provenance: Provenance, factor: float = 5.0) -> MassiveValues:
        """The streamed sums as :class:`MassiveValues` thresholded at ``factor``."""
        return MassiveValues(
            layers=tuple(self.layers),
            spec=self.spec,
            moments={w: m.to("cpu", torch.float64) for w, m in self.moments.items()},
            factor=_check_factor(factor),
            provenance=provenance,
        )


@dataclass(frozen=True)
class MassiveValues(
    Result,
    merge_same=("layers", "factor", "spec"),
    merge_sums=("moments",),
    merge_hint="use .with_factor(f) to align the factors, or measure both with the same settings",
):
    """Per-dimension norms of the pre-RoPE queries and keys, and which dimensions are massive.

    What :func:`massive_values` returns (after Jin et al. 2025). A dimension is massive when its L2
    norm over tokens exceeds ``factor`` × the mean of its head's dimension norms; :meth:`mask` says
    which, :meth:`plane_mask` which RoPE planes hold them, :meth:`persistence` in how many layers,
    and :func:`replace_massive` replaces them with their corpus mean to test what they do.

    Layers of different widths (Gemma 4's wider global heads) share one array padded to the most
    heads and dimensions: every number past a layer's own reads NaN (:meth:`present`), is never
    massive, and tables leave it out; each layer's dimensions map to its own planes.

    Attributes:
        layers (tuple[int, ...]): The measured layer indices.
        spec (RopeSpec): The model's RoPE spec (maps each dimension to its plane).
        moments (dict[str, Moments]): ``moments[w]`` (``w`` in ``"q"``, ``"k"``) holds per ``[layer,
            head, dim]`` (keys: KV heads) the token count, the sum and the sum of squares over the
            corpus.
        factor (float): The threshold, > 1 (default 5 in :func:`massive_values`);
            :meth:`with_factor` gives a copy at another one.
        provenance (Provenance): Model, corpus, tokens, settings and versions of the run.

    Examples:
        >>> from ropelens.analyses import massive_values
        >>> from ropelens.testing import tiny_model
        >>> model = tiny_model("llama")
        >>> mv = massive_values(model, n_ctx=32, max_tokens=128, progress=False)
        >>> tuple(mv.ratio("q").shape)  # [layer, head, dim]
        (2, 4, 16)
        >>> bool((mv.with_factor(1.5).mask("q").sum() >= mv.mask("q").sum()).item())
        True
        >>> tuple(mv.plane_mask("k").shape)  # [layer, kv_head, plane]
        (2, 4, 8)
    """

    layers: tuple[int, ...]
    spec: RopeSpec
    moments: dict[str, Moments]
    factor: float
    provenance: Provenance

    def __post_init__(self) -> None:
        if not self.layers:
            raise InputError("MassiveValues needs at least one layer")
        want = {w: tuple(self.spec.present(self.layers, _HEADS[w], "dim").shape) for w in _WHICH}
        if set(self.moments) != set(_WHICH):
            raise InputError(f"moments must hold 'q' and 'k', got {sorted(self.moments)}")
        for w, mom in self.moments.items():
            if tuple(mom.total.shape) != want[w]:
                raise InputError(
                    f"{w} moments have shape {tuple(mom.total.shape)}, expected {want[w]}"
                )
        object.__setattr__(self, "factor", _check_factor(self.factor))

    # ---------------------------------------------------------------- numbers
    def present(self, which: Which = "q") -> Bool[Tensor, "layer head d_head"]:
        """The (head, dim) entries each layer has (all True when the measured layers share one
        width)."""
        return ~self.moments[_check_which(which)].count.isnan()

    @property
    def n_tokens(self) -> int:
        """Tokens the statistics are over (per layer; the same in every layer of one run)."""
        return int(self.moments["q"].count[0, 0, 0])

    def norm(self, which: Which = "q") -> Float[Tensor, "layer head d_head"]:
        """L2 norm of each dimension over all tokens, ‖x_d‖ = (Σ_t x_{t,d}²)^½."""
        return self.moments[_check_which(which)].total_sq.sqrt()

    def rms(self, which: Which = "q") -> Float[Tensor, "layer head d_head"]:
        """Root mean square of each dimension over tokens (the norm without its √n growth)."""
        mom = self.moments[_check_which(which)]
        return (mom.total_sq / mom.count.clamp_min(1)).sqrt()

    def mean(self, which: Which = "q") -> Float[Tensor, "layer head d_head"]:
        """Corpus mean of each dimension (what :func:`replace_massive` writes into massive
        dimensions)."""
        return self.moments[_check_which(which)].mean

    def ratio(self, which: Which = "q") -> Float[Tensor, "layer head d_head"]:
        """Each dimension's norm over the mean dimension norm of its head (massive where >
        factor)."""
        n = self.norm(which)
        return n / n.nanmean(-1, keepdim=True).clamp_min(1e-300)  # the head's own dimensions

    def mask(self, which: Which = "q") -> Bool[Tensor, "layer head d_head"]:
        """Massive dimensions: norm > factor × the head's mean dimension norm."""
        return self.ratio(which) > self.factor

    def with_factor(self, factor: float) -> MassiveValues:
        """The same statistics thresholded at another ``factor`` (nothing is re-run)."""
        return replace(self, factor=_check_factor(factor))

    def dim_planes(self, layer: int | None = None) -> Int[Tensor, " d_head"]:
        """Plane of each head dimension of ``layer`` (default: the first measured; 0 = highest
        frequency; −1 for unrotated dimensions)."""
        return _dim_planes(self.spec, self.layers[0] if layer is None else layer)

    def _dim_plane_table(self) -> Int[Tensor, "layer d_head"]:
        """Each measured layer's :meth:`dim_planes`, padded with −1 to the widest head."""
        out = torch.full(tuple(self.spec.present(self.layers, "dim").shape), -1, dtype=torch.long)
        for i, L in enumerate(self.layers):
            planes = _dim_planes(self.spec, L)
            out[i, : planes.numel()] = planes
        return out

    def plane_mask(self, which: Which = "q") -> Bool[Tensor, "layer head plane"]:
        """Planes holding at least one massive dimension (each layer's own planes; False past
        them)."""
        m = self.mask(which)
        out = torch.zeros(
            *m.shape[:2], self.spec.present(self.layers, "plane").shape[1], dtype=torch.bool
        )
        for i, L in enumerate(self.layers):
            dims = self.spec.layers[L].plane_dims  # [P, 2]
            out[i, :, : dims.shape[0]] = m[i][..., dims[:, 0]] | m[i][..., dims[:, 1]]
        return out

    def persistence(self, which: Which = "q", per_head: bool = False) -> Tensor:
        """Fraction of the measured layers in which each plane is massive: ``[plane]`` (in any head
        of the layer) or, with ``per_head``, ``[head, plane]`` (in that head index); over the layers
        that have the plane (and head), where layers of different widths are measured together."""
        pm = self.plane_mask(which).double()  # [L, H, P]
        if per_head:
            return pm.sum(0) / self.spec.present(self.layers, _HEADS[which], "plane").double().sum(
                0
            ).clamp_min(1)
        return pm.amax(1).sum(0) / self.spec.present(self.layers, "plane").double().sum(
            0
        ).clamp_min(1)

    def control_mask(self, which: Which = "q", seed: int = 0) -> Bool[Tensor, "layer head d_head"]:
        """As many dimensions per layer and head as :meth:`mask` has, drawn at random among the
        non-massive ones (seeded): the control of :func:`replace_massive`."""
        m = self.mask(which)
        out = torch.zeros_like(m)
        rng = np.random.default_rng([int(seed), _WHICH.index(_check_which(which))])
        have = self.present(which)
        for i in range(m.shape[0]):
            for h in range(m.shape[1]):
                n = int(m[i, h].sum())
                if n:
                    pool = (
                        torch.nonzero(~m[i, h] & have[i, h]).flatten().numpy()
                    )  # the layer's own dimensions
                    out[
                        i,
                        h,
                        torch.from_numpy(rng.choice(pool, size=min(n, len(pool)), replace=False)),
                    ] = True
        return out

    # ---------------------------------------------------------------- tables
    def to_frame(self) -> pd.DataFrame:
        """Tidy table: one row per (which, layer, head, dim) of the layer's own heads and
        dimensions, with its plane, the plane's frequency and wavelength, the dimension's norm, rms,
        mean, ratio to the head's mean norm, and massive."""
        frames = []
        planes = self._dim_plane_table()  # [L, D]
        for w in _WHICH:
            L, H, D = self.moments[w].total.shape
            layer, head, dim = np.meshgrid(
                np.array(self.layers), np.arange(H), np.arange(D), indexing="ij"
            )
            freq = torch.full((L, D), float("nan"), dtype=torch.float64)
            for i, lay in enumerate(self.layers):
                inv = self.spec.layers[lay].inv_freq.double()
                rot = planes[i] >= 0
                freq[i, rot] = inv[planes[i][rot]]
            freq = freq[:, None, :].expand(L, H, D)
            frames.append(
                pd.DataFrame(
                    {
                        "which": w,
                        "layer": layer.ravel(),
                        "head": head.ravel(),
                        "dim": dim.ravel(),
                        "plane": planes[:, None, :].expand(L, H, D).flatten().numpy(),
                        "inv_freq": freq.flatten().numpy(),
                        "wavelength": (2 * np.pi / freq).flatten().numpy(),
                        "norm": self.norm(w).flatten().numpy(),
                        "rms": self.rms(w).flatten().numpy(),
                        "mean": self.mean(w).flatten().numpy(),
                        "ratio": self.ratio(w).flatten().numpy(),
                        "massive": self.mask(w).flatten().numpy(),
                    }
                )[self.present(w).flatten().numpy()]
            )
        return pd.concat(frames, ignore_index=True)

    def massive_frame(self) -> pd.DataFrame:
        """The rows of :meth:`to_frame` that are massive, largest ratio first."""
        df = self.to_frame()
        return df[df["massive"]].sort_values("ratio", ascending=False, ignore_index=True)

    def planes_frame(self) -> pd.DataFrame:
        """One row per (which, plane): wavelength (first measured layer), how many massive
        dimensions the plane holds over layers and heads (``n_massive_dims``, which sums to
        :meth:`mask`'s count), how many (layer, head) pairs hold at least one (``n_massive``: a
        plane has two dimensions, so it can be fewer), and the plane's persistence across layers.
        Layers of different widths (Gemma 4) get rows per width group, each over that group's
        layers (``layers``)."""
        rows = []
        for group in self.spec.width_groups(self.layers).values():
            sub = self._subset(group)
            lr = self.spec.layers[group[0]]
            wl = lr.wavelength.tolist()
            dims = lr.plane_dims  # [P, 2]
            for w in _WHICH:
                pm, m = sub.plane_mask(w), sub.mask(w)
                per_plane = m[..., dims[:, 0]].sum((0, 1)) + m[..., dims[:, 1]].sum((0, 1))
                pers, pers_head = sub.persistence(w), sub.persistence(w, per_head=True)
                for p in range(lr.n_planes):
                    rows.append(
                        {
                            "which": w,
                            "layers": layer_ranges(group),
                            "plane": p,
                            "inv_freq": float(lr.inv_freq[p]),
                            "wavelength": wl[p],
                            "n_massive_dims": int(per_plane[p]),
                            "n_massive": int(pm[..., p].sum()),
                            "persistence": float(pers[p]),
                            "max_head_persistence": float(pers_head[:, p].max()),
                        }
                    )
        return pd.DataFrame(rows)

    def _subset(self, layers: Sequence[int]) -> MassiveValues:
        """The statistics of some of the measured layers (those of one width: the padding
        dropped)."""
        idx = [self.layers.index(L) for L in layers]
        moments = {}
        for w, m in self.moments.items():
            h, d = self.spec.present(list(layers), _HEADS[w], "dim").shape[1:]
            moments[w] = Moments(*(t[idx][:, :h, :d] for t in (m.count, m.total, m.total_sq)))
        return replace(self, layers=tuple(layers), moments=moments)

    # ---------------------------------------------------------------- persistence


@corpus_analysis()
def massive_values(
    model,
    corpus,
    run: RunOptions,
    *,
    factor: float = 5.0,
) -> MassiveValues:
    """Per-dimension norms of the pre-RoPE q and k over a corpus, and the massive dimensions.

    After Jin et al. (2025, "Massive Values in Self-Attention Modules are the Key to Contextual
    Knowledge Understanding"): per layer × head (keys: KV heads) × dimension, the L2 norm of each
    dimension over the corpus's tokens; a dimension is *massive* when that norm exceeds ``factor``
    times the mean dimension norm of its head. Each dimension maps to its RoPE plane, so the result
    says which frequencies hold massive values. Windows start with BOS.

    Streamed: memory does not grow with the corpus. Inside a ``torch.distributed`` process group
    each rank takes a share of the windows and every rank returns the whole corpus's result;
    ``checkpoint`` saves progress to resume a killed run.

    Args:
        model: The model: what :func:`ropelens.load_model` or :func:`ropelens.testing.tiny_model`
            returns (a TransformerLens bridge, or the plain HF model with ``bridge=False``), or an
            nnsight ``LanguageModel``.
        corpus: The text to measure: any form :func:`ropelens.run.data.load_corpus` reads (a
            built-in corpus name, "english" or "python"; a path; a list of documents; a ``datasets``
            dataset, with ``text_column``), or a ready ``[n_windows, n_ctx]`` integer token tensor,
            used whole (default None: the built-in "english" corpus).
        n_ctx (int): Tokens per window, BOS first (default 512).
        max_tokens (int | None): Corpus tokens to read (default 32768; None: all of it).
        layers (Sequence[int] | None): Layer indices to measure (default None: every rotary layer).
        text_column (str): The column of a table or dataset corpus that holds the text (default
            "text").
        factor (float): The threshold, > 1: a dimension is massive when its norm exceeds ``factor``
            × its head's mean dimension norm (default 5, the rule of the public Llama-2-7B
            replication; :meth:`MassiveValues.with_factor` changes it without re-running).
        batch_size (int): Windows per forward pass (default 4).
        progress (bool): Show a progress bar (default True; rank 0 only under torchrun).
        checkpoint (str | os.PathLike | None): A directory to save progress to and resume a killed
            run from (default None: none; see :mod:`ropelens.run.distributed`).
        checkpoint_every (int): Batches between checkpoints (default 8).
        verify (bool): First check that ropelens's reading of RoPE reproduces the model's own
            attention (default True); False skips the check, and the result says "unverified".

    Returns:
        MassiveValues: Token count, sum and sum of squares per ``[layer, head, dim]`` for q and
        ``[layer, kv_head, dim]`` for k, thresholded at ``factor``.

    Raises:
        InputError: When ``layers`` selects no layer the model has, the corpus cannot be read, or
            ``factor`` is not above 1 (the message names the problem and the fix).
        UnsupportedModelError: When ``verify`` finds that the RoPE reading does not reproduce the
            model's own attention.

    Examples:
        >>> from ropelens.analyses import massive_values
        >>> from ropelens.testing import tiny_model
        >>> model = tiny_model("llama-gqa")
        >>> mv = massive_values(model, n_ctx=32, max_tokens=128, progress=False)
        >>> tuple(mv.norm("q").shape), tuple(mv.norm("k").shape)  # [layer, (kv_)head, dim]
        ((2, 4, 16), (2, 2, 16))
        >>> mv.n_tokens, mv.factor
        (128, 5.0)
    """
    factor = _check_factor(factor)
    m = measure(
        model,
        corpus,
        lambda spec, chosen, _: MassiveReducer(spec, chosen),
        run,
        analysis="massive values",
        config={"factor": factor, "source": "pre"},
    )
    return m.reducer.result(m.provenance, factor)


# --------------------------------------------------------------------------------------------
# the intervention
# --------------------------------------------------------------------------------------------
@contextlib.contextmanager
def replace_massive(
    model,
    mv: MassiveValues,
    layers: Sequence[int] | None = None,
    *,
    which: Sequence[str] = ("q", "k"),
    control: bool = False,
    seed: int = 0,
) -> Iterator[dict[int, dict[str, Bool[Tensor, "head d_head"]]]]:
    """Replace the massive dimensions of the pre-RoPE q and k with their corpus mean, in ``layers``
    (default: every layer ``mv`` measured).

    Works through the bridge's pre-RoPE hooks (``hook_q``/``hook_k``, Gemma's ``hook_q_normed``/
    ``hook_k_normed``), so every forward inside the block, cached decoding included, sees the
    replacement; the fast q/k path is skipped while it lasts. Loss and passkey decoding inside the
    block run on the HF sdpa forward where the family allows it (:mod:`ropelens.backends.sdpa`: the
    same entries are written into the q and k entering its ``apply_rotary_pos_emb``), else on the
    bridge. ``control=True`` replaces as many randomly chosen non-massive dimensions per head
    instead (:meth:`MassiveValues.control_mask`, seeded). Yields ``{layer: {"q": mask, "k":
    mask}}``, the ``[head, d_head]`` entries replaced. Leaving the block, also on an exception,
    removes the hooks: the model is exactly as before.
    """
    model = running_model(model)  # an nnsight model: the HF model it wraps
    if not isinstance(mv, MassiveValues):
        raise TypeError(
            f"expected MassiveValues from ropelens.analyses.massive_values, got {type(mv).__name__}"
        )
    parts = tuple(_check_which(w) for w in ([which] if isinstance(which, str) else which))
    if not parts:
        raise InputError("which is empty: pass 'q', 'k' or both")
    spec = rope_spec(model)
    chosen = list(mv.layers) if layers is None else spec.layer_indices(layers)
    missing = [L for L in chosen if L not in mv.layers]
    if missing:
        raise InputError(
            f"layers {missing} were not measured; these MassiveValues cover layers "
            f"{list(mv.layers)}: measure them with massive_values(model, layers=[...])"
        )
    for L in chosen:
        if spec.layers[L].to_dict() != mv.spec.layers[L].to_dict():
            raise InputError(
                f"layer {L} of this model rotates differently from the model these MassiveValues "
                "were measured on: measure this model with massive_values(model)"
            )
    masks = {w: (mv.control_mask(w, seed) if control else mv.mask(w)) for w in parts}
    used: dict[int, dict[str, Tensor]] = {}
    step: dict[int, dict[str, tuple[Tensor, Tensor]]] = {}
    removers: list[Callable[[], None]] = []

    try:
        for L in chosen:
            i, lr = mv.layers.index(L), mv.spec.layers[L]
            used[L] = {}
            for w in parts:
                own = (
                    slice(0, lr.n_heads if w == "q" else lr.n_kv_heads),
                    slice(0, lr.head_dim),
                )  # padding dropped
                mask = masks[w][i][own]
                used[L][w] = mask.clone()
                if bool(mask.any()):
                    step.setdefault(L, {})[w] = (mask.clone(), mv.mean(w)[i][own].float())
        removers, engine = backend_of(model).replacement_hooks(step, chosen, parts)
        # the fast q/k path would bypass these hooks; the sdpa forward reads the plan and writes
        # them at the rotation
        with intervened(model), planned(model, ReplaceStep(step, len(removers), engine)):
            yield used
    finally:
        for remove in removers:
            remove()
