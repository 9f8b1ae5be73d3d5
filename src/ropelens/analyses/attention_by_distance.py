"""Attention by query–key distance, band by band (HoPE, Chen et al. ACL 2025).

HoPE reports that attention decays locally but is U-shaped globally, and that the rise at long
distances comes from the low-frequency components. :class:`DistanceReducer` measures it on a corpus:
per layer × head × band and per bin of the distance δ = m − n between a query at m and a key at n,
the mean band logit (the band's exact share of the score, as in
:mod:`ropelens.analyses.attention_decomposition`), the mean full logit and the mean attention
probability of the model's own pattern. :func:`describe_curve` says what shape a curve has
(monotone, flat, U-shaped, peaked, oscillating) with the numbers it rests on, and
:meth:`AttentionByDistance.u_shape_cause` which band makes the full logit rise again.

Bins are log-spaced: bin 0 is δ = 0 exactly, then δ = 1, 2–3, 4–7, … (octaves) or a finer log grid.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import einops
import numpy as np
import pandas as pd
import torch
from jaxtyping import Bool, Float, Int
from torch import Tensor

from ropelens.errors import InputError
from ropelens.results.curves import MARGIN, RECOVERY, CurveShape, at_distance, describe_curve
from ropelens.results.figures import figure_of
from ropelens.results.findings import Finding, count_of, shape_predicate
from ropelens.results.provenance import Provenance
from ropelens.results.result import Result
from ropelens.results.sums import count_or_nan
from ropelens.run.capture import DeviceSums, LayerActs, query_tile, sum_dtype
from ropelens.run.measure import RunOptions, corpus_analysis, measure
from ropelens.spec.bands import Bands, ResolvedBands
from ropelens.spec.rope import RopeSpec
from ropelens.validate import check_number

__all__ = [
    "AttentionByDistance",
    "DistanceReducer",
    "attention_by_distance",
    "distance_bins",
]

# score entries per tile: 2^21 (8 MiB of float32) on the CPU; accelerators take larger tiles


# ============================================================================ distance bins
def distance_bins(max_distance: int, n_bins: int | None = None) -> Int[Tensor, " n_edges"]:
    """Bin edges over δ = 0 … ``max_distance``: bin j holds ``edges[j] ≤ δ < edges[j + 1]``.

    Bin 0 is δ = 0 exactly and bin 1 is δ = 1. With ``n_bins`` None the rest are octaves (2–3, 4–7,
    8–15, …; the last one ends at ``max_distance``); with ``n_bins`` the edges are ``n_bins`` points
    spaced evenly in log from 1 to ``max_distance + 1`` (rounded; repeated edges merge, so short
    ranges get fewer bins).
    """
    max_distance = check_number(
        max_distance,
        "max_distance",
        at_least=0,
        integer=True,
        hint=" (the largest query–key distance: n_ctx − 1)",
    )
    end = max_distance + 1
    if n_bins is None:
        edges = [0]
        e = 1
        while e < end:
            edges.append(e)
            e *= 2
        edges.append(end)
    else:
        n_bins = check_number(
            n_bins,
            "n_bins",
            at_least=2,
            integer=True,
            hint=" (bin 0 is δ = 0, so at least one more bin is needed)",
        )
        grid = (
            np.unique(np.round(np.geomspace(1, end, n_bins)).astype(np.int64))
            if end > 1
            else np.array([1])
        )
        edges = [0, *grid.tolist()]
    return torch.tensor(sorted(set(edges)), dtype=torch.int64)


def bin_centres(edges: Tensor) -> Float[Tensor, " n_bins"]:
    """A representative distance per bin: δ itself for one-distance bins, else the geometric mean of
    its first and last distance (what a log axis shows as the middle)."""
    lo, last = edges[:-1].double(), (edges[1:] - 1).double()
    return torch.where(last > lo, (lo * last).clamp_min(0).sqrt(), lo)


def _bin_label(lo: int, hi: int) -> str:
    return f"{lo}" if hi - lo == 1 else f"{lo}–{hi - 1}"


# ============================================================================ the reducer
def _check_tile(tile: Any) -> int | None:
    if tile is not None and (isinstance(tile, bool) or not isinstance(tile, int) or tile < 1):
        raise InputError(
            f"tile must be a positive number of queries or None for automatic, got {tile!r}"
        )
    return tile


def _resolve_all(
    spec: RopeSpec, layers: Sequence[int], bands: Bands
) -> tuple[dict[int, ResolvedBands], tuple[str, ...]]:
    resolved = {L: bands.resolve(spec.layers[L]) for L in layers}
    names = {r.names for r in resolved.values()}
    if len(names) != 1:
        raise InputError(
            f"bands {bands.describe()} resolve to different band names across layers: {names}; "
            "pick layers of one kind (layers=...) or bands that name the same groups everywhere"
        )
    return resolved, next(iter(names))


class DistanceReducer(DeviceSums):
    """Streams, per layer × head × band × distance bin, the mean band logit; per layer × head × bin,
    the mean full logit (the sum of the bands, before any soft-cap) and the mean attention
    probability of the model's own pattern.

    Needs only post-RoPE queries and keys, so the model runs with its fast attention. The keys a
    query at m has in bin [lo, hi) are the contiguous run m − hi < j ≤ m − lo, so a band's logit
    summed over them is q_b(m) · Σ_j k_b(j), a difference of key prefix sums (float64): exact,
    O(n · bins · d) per layer, with no [query, key] tensor at all. Probabilities need whole rows:
    queries go in tiles that hold their whole key range (causal, sliding window), the scores are
    rebuilt there, masked and passed through :meth:`LayerRope.probs` (soft-cap and learned sinks as
    the model applies them), and the entries are summed into bins by one matmul with a one-hot
    ``[entries, bins]`` matrix. Memory is O(tile · n) per layer; nothing of size ``[heads, n, n]``
    exists.

    Keys at positions below ``n_sink`` (BOS, where attention sinks sit; see
    :mod:`ropelens.analyses.attention_sinks`) take part in every softmax but are left out of the
    by-distance averages: otherwise the sink, always the farthest key, dominates the longest
    distances. Pass ``n_sink=0`` to keep them.
    """

    # masks built from positions: refused where the model picks keys from the input
    static_mask = "attention by distance"
    needs = frozenset({"q_post", "k_post"})

    def __init__(
        self,
        spec: RopeSpec,
        layers: Sequence[int],
        bands: Bands | None = None,
        *,
        n_bins: int | None = None,
        max_distance: int | None = None,
        n_sink: int = 1,
        tile: int | None = None,
    ) -> None:
        self.spec, self.layers = spec, list(layers)
        if not self.layers:
            raise InputError("no layers selected: pass layer indices the model has")
        self.bands = bands or Bands.default()
        self.tile = _check_tile(tile)
        self.n_sink = check_number(
            n_sink,
            "n_sink",
            at_least=0,
            integer=True,
            hint=" (keys at positions below it are left out of the curves)",
        )
        self.max_distance = spec.n_ctx - 1 if max_distance is None else max_distance
        self.n_bins_arg = n_bins
        self.edges = distance_bins(self.max_distance, n_bins)
        self.max_distance = int(self.edges[-1]) - 1
        self.resolved, self.names = _resolve_all(spec, self.layers, self.bands)
        self.pos = {L: i for i, L in enumerate(self.layers)}
        B, nb = len(self.names), len(self.edges) - 1
        # layers of different widths padded to the most heads: NaN past a layer's own
        # (RopeSpec.padded_zeros)
        z = functools.partial(spec.padded_zeros, self.layers)
        self.sums: dict[str, Tensor] = {
            "band_sum": z("head", B, nb),
            "prob_sum": z("head", nb),
            "count": z(nb),
            "dist_sum": z(nb),
            "n_queries": z(),
        }
        self._cache: dict[tuple, Tensor] = {}

    def _cached(self, key: tuple, make) -> Tensor:
        if key not in self._cache:
            self._cache[key] = make()
        return self._cache[key]

    def _runs(self, n: int, window: int | None, dev: torch.device) -> tuple[Tensor, Tensor]:
        """``[n, bins]`` prefix-sum indices (start, stop): query m's keys in bin j are start ≤ t <
        stop."""

        def make() -> tuple[Tensor, Tensor]:
            m = torch.arange(n)[:, None]
            lo, hi = self.edges[None, :-1], self.edges[None, 1:]
            if window:
                hi = hi.clamp(max=window)
            stop = (m - lo + 1).clamp(0, n)
            start = torch.minimum((m - hi + 1).clamp(0, n), stop)
            return torch.stack([start, stop]).to(dev)

        return tuple(self._cached(("runs", n, window, str(dev)), make))  # type: ignore[return-value]

    @torch.no_grad()
    def update(self, acts: LayerActs) -> None:
        """Add one layer's per-bin key counts, distances, band logit sums and attention mass."""
        layer_slot, rope = self.pos[acts.layer], acts.rope
        valid = acts.valid
        q_post, k_post = acts["q_post"], acts["k_post"]
        device = q_post.device
        sums = self._on(device)
        sums_device, sums_dtype = sums["count"].device, sums["count"].dtype
        n_positions = q_post.shape[1]
        reach = n_positions - 1 if not rope.window else min(n_positions, rope.window) - 1
        if reach > self.max_distance:
            raise InputError(
                f"layer {acts.layer} sees distances up to {reach}, but the bins end at "
                f"{self.max_distance}: build the reducer with max_distance ≥ {reach} (n_ctx − 1)"
            )
        valid_float = valid.float()
        # the score scale goes into q once, so every product below is a logit; padded positions
        # are zero vectors
        per_position = einops.rearrange(valid_float, "batch pos -> batch pos 1 1")
        queries = q_post.float() * (per_position * rope.score_scale)
        keys = k_post.float() * per_position
        sums["n_queries"][layer_slot] += valid_float.sum().to(sums_device, sums_dtype)
        self._add_band_sums(sums, acts, queries, keys)
        self._add_probabilities(sums, acts, queries, keys)

    def _add_band_sums(
        self, sums: dict[str, Tensor], acts: LayerActs, queries: Tensor, keys: Tensor
    ) -> None:
        """Per bin, the key count, the summed distance and the band logits (by prefix sums)."""
        layer_slot, rope, valid = self.pos[acts.layer], acts.rope, acts.valid
        device = queries.device
        sums_device, sums_dtype = sums["count"].device, sums["count"].dtype
        wide = sum_dtype(device)
        batch, n_positions, n_heads, head_dim = queries.shape
        n_bins = len(self.edges) - 1
        bands = self.resolved[acts.layer]
        membership = self._cached(
            (acts.layer, "member", str(device)), lambda: bands.dim_membership().to(device, wide)
        )
        # keys below n_sink and padded keys count as zero vectors
        binned = valid.float().to(wide)
        binned[:, : self.n_sink] = 0
        binned_keys = keys.to(wide) * binned[:, :, None, None]

        def prefix(values: Tensor) -> Tensor:
            return torch.cat([torch.zeros_like(values[:, :1]), values.cumsum(1)], 1)

        positions = torch.arange(n_positions, device=device, dtype=wide)
        # Σ k, count and Σ j over binned keys
        key_prefix, count_prefix, position_prefix = (
            prefix(binned_keys),
            prefix(binned),
            prefix(binned * positions),
        )
        start, stop = self._runs(n_positions, rope.window, device)
        valid_queries = valid.float()[:, :, None].to(wide)
        # [batch, query, bin]
        counts = (count_prefix[:, stop] - count_prefix[:, start]) * valid_queries
        sums["count"][layer_slot] += counts.sum((0, 1)).to(sums_device, sums_dtype)
        position_totals = (position_prefix[:, stop] - position_prefix[:, start]) * valid_queries
        distance_sum = (counts * positions[None, :, None] - position_totals).sum((0, 1))
        sums["dist_sum"][layer_slot] += distance_sum.to(sums_device, sums_dtype)
        grouped_queries = einops.rearrange(
            queries,
            "batch pos (kv_head group) dim -> batch pos kv_head group dim",
            kv_head=rope.n_kv_heads,
        )
        band_sum = torch.zeros(
            n_bins, rope.n_kv_heads, rope.group_size, membership.shape[1], dtype=wide, device=device
        )
        tile_size = self.tile or query_tile(device, batch * n_bins * n_heads * head_dim)
        for query_start in range(0, n_positions, tile_size):
            query_end = min(n_positions, query_start + tile_size)
            # [batch, query, bin, kv_head, dim]: Σ of each bin's keys
            bin_key_sums = (
                key_prefix[:, stop[query_start:query_end]]
                - key_prefix[:, start[query_start:query_end]]
            )
            # in float64: a bin's key sum is large and its product with q cancels, so float32
            # would leave an error of eps32·|q||Σk| on a small mean
            tile_queries = grouped_queries[:, query_start:query_end, None].to(wide)
            band_sum += torch.matmul(tile_queries * bin_key_sums[:, :, :, :, None], membership).sum(
                (0, 1)
            )
        sums["band_sum"][layer_slot, :n_heads] += einops.rearrange(
            band_sum, "bin kv_head group band -> (kv_head group) band bin"
        ).to(sums_device, sums_dtype)

    def _add_probabilities(
        self, sums: dict[str, Tensor], acts: LayerActs, queries: Tensor, keys: Tensor
    ) -> None:
        """Per bin, the attention mass: query tiles holding whole rows, the pattern rebuilt."""
        layer_slot, rope, valid = self.pos[acts.layer], acts.rope, acts.valid
        device = queries.device
        sums_device, sums_dtype = sums["count"].device, sums["count"].dtype
        wide = sum_dtype(device)
        batch, n_positions, n_heads, head_dim = queries.shape
        n_kv_heads, group_size = rope.n_kv_heads, rope.group_size
        n_bins = len(self.edges) - 1
        head_queries = einops.rearrange(
            queries,
            "batch pos (kv_head group) dim -> batch kv_head group pos dim",
            kv_head=n_kv_heads,
        )
        head_keys = einops.rearrange(keys, "batch pos kv_head dim -> batch kv_head dim pos")
        bin_of = self._cached(
            ("bin_of", str(device)),
            lambda: (
                torch.bucketize(torch.arange(self.max_distance + 1), self.edges, right=True) - 1
            ).to(device),
        )
        tile_size = self.tile or query_tile(
            device, batch * n_heads * 2 * min(n_positions, rope.window or n_positions)
        )
        mass = torch.zeros(n_kv_heads, group_size, n_bins, dtype=wide, device=device)
        positions = torch.arange(n_positions, device=device)
        for query_start in range(0, n_positions, tile_size):
            query_end = min(n_positions, query_start + tile_size)
            n_tile = query_end - query_start
            first_key = max(0, query_start - rope.window + 1) if rope.window else 0
            n_tile_keys = query_end - first_key
            # [query, key]
            distance = positions[query_start:query_end, None] - positions[None, first_key:query_end]
            allowed = distance >= 0
            if rope.window:
                allowed &= distance < rope.window
            # [batch, query, key]
            attended = (
                allowed[None]
                & valid[:, query_start:query_end, None]
                & valid[:, None, first_key:query_end]
            )
            tile_queries = head_queries[:, :, :, query_start:query_end].reshape(
                batch, n_kv_heads, group_size * n_tile, head_dim
            )
            scores = torch.matmul(tile_queries, head_keys[..., first_key:query_end]).view(
                batch, n_heads, n_tile, n_tile_keys
            )
            # 0 on masked entries and padded rows
            probs = rope.probs(scores.masked_fill(~attended[:, None], float("-inf")))
            del scores
            binned = allowed & (positions[None, first_key:query_end] >= self.n_sink)
            binned = binned.to(probs.dtype).reshape(-1, 1)
            bin_one_hot = torch.nn.functional.one_hot(
                bin_of[distance.clamp(0, self.max_distance)].reshape(-1), n_bins
            ).to(probs.dtype)
            mass += (
                torch.matmul(
                    probs.reshape(batch, n_kv_heads, group_size, n_tile * n_tile_keys),
                    bin_one_hot * binned,
                )
                .to(wide)
                .sum(0)
            )
            del probs
        sums["prob_sum"][layer_slot, :n_heads] += mass.reshape(n_heads, n_bins).to(
            sums_device, sums_dtype
        )

    def config(self) -> dict[str, Any]:
        return {
            "bands": self.bands.describe(),
            "layers": list(self.layers),
            "n_bins": self.n_bins_arg,
            "max_distance": self.max_distance,
            "n_sink": self.n_sink,
        }

    def result(self, provenance: Provenance) -> AttentionByDistance:
        """The streamed sums as :class:`AttentionByDistance` (on the CPU, float64)."""
        sums = {k: v.detach().to("cpu", torch.float64) for k, v in self.sums.items()}
        return AttentionByDistance(
            tuple(self.layers),
            self.names,
            self.bands,
            self.spec,
            self.edges.clone(),
            self.n_sink,
            sums,
            provenance,
        )


# ============================================================================ the result
@dataclass(frozen=True)
class AttentionByDistance(
    Result,
    merge_same=("layers", "band_names", "edges", "n_sink", "spec"),
    merge_sums=("sums",),
    increasing=("edges",),
):
    """Mean band logit, full logit and attention probability per layer × head × distance bin.

    ``edges`` are the bin edges (bin j: ``edges[j] ≤ δ < edges[j + 1]``); bins a layer never sees
    (beyond its sliding window) have count 0 and NaN means. Layers of different widths (Gemma 4)
    share one array padded to the most heads: the curves of a head a layer lacks are NaN
    (:meth:`present`), head averages and tables leave them out.

    Built by :func:`~ropelens.analyses.attention_by_distance`, after HoPE (Chen et al., ACL 2025):
    attention decays locally but is U-shaped globally, the rise at long distances coming from the
    low-frequency bands. :meth:`describe` names a curve's shape with the numbers it rests on, and
    :meth:`u_shape_cause` says which band makes the full logit rise again.

    Attributes:
        layers (tuple[int, ...]): The measured layers, in the order of the ``layer`` axis.
        band_names (tuple[str, ...]): Band names, in the order of the ``band`` axis.
        bands (Bands): The band definition the names were resolved from (default quartiles).
        spec (RopeSpec): The model's RoPE reading.
        edges (Tensor): ``[n_bins + 1]`` integer bin edges of the distance δ = m − n (log-spaced:
            0, 1, 2, 4, 8, …).
        n_sink (int): Keys below this position join every softmax but are left out of the
            by-distance averages (default 1: BOS).
        sums (dict[str, Tensor]): Streamed float64 sums: ``band_sum`` ``[layer, head, band,
            bin]``; ``prob_sum`` ``[layer, head, bin]``; ``count`` and ``dist_sum``
            ``[layer, bin]``; ``n_queries`` ``[layer]``.
        provenance (Provenance): Model, corpus, token count and versions.

    Examples:
        >>> import torch
        >>> from ropelens.analyses import attention_by_distance
        >>> from ropelens.testing import tiny_model
        >>> tokens = torch.randint(4, 100, (2, 16), generator=torch.Generator().manual_seed(0))
        >>> abd = attention_by_distance(tiny_model("llama"), tokens, progress=False)
        >>> abd.edges.tolist(), abd.bin_labels()
        ([0, 1, 2, 4, 8, 16], ['0', '1', '2–3', '4–7', '8–15'])
        >>> tuple(abd.band_logit().shape)  # [layer, head, band, bin]
        (2, 4, 4, 5)
        >>> shapes = ("flat", "decays", "grows", "U-shaped", "peaked", "oscillating")
        >>> abd.describe(0, "logit").shape in shapes  # layer 0, heads averaged
        True
    """

    layers: tuple[int, ...]
    band_names: tuple[str, ...]
    bands: Bands
    spec: RopeSpec
    edges: Int[Tensor, " n_edges"]
    n_sink: int
    sums: dict[str, Tensor]
    provenance: Provenance
    # a cache of described curves: not an argument, so a merged or replaced copy starts empty
    _shapes: dict = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_shapes", {})
        L, B, nb = len(self.layers), len(self.band_names), len(self.edges) - 1
        self._check_shape(
            "band_sum", self.sums["band_sum"], (L, None, B, nb), " [layer, head, band, bin]"
        )

    # ---------------------------------------------------------------- numbers
    def present(self) -> Bool[Tensor, "layer head"]:
        """The heads each layer has (all True when the measured layers share one width)."""
        return ~self.sums["prob_sum"][..., 0].isnan()

    @property
    def n_bins(self) -> int:
        """The number of distance bins."""
        return len(self.edges) - 1

    @property
    def centres(self) -> Float[Tensor, " n_bins"]:
        """A representative distance per bin (geometric middle; δ itself for one-distance bins)."""
        return bin_centres(self.edges)

    def bin_labels(self) -> list[str]:
        """Each bin's distances as text ("0", "1", "2–3", …)."""
        e = self.edges.tolist()
        return [_bin_label(a, b) for a, b in zip(e, e[1:])]

    def count(self) -> Float[Tensor, "layer bin"]:
        """Query–key pairs averaged in each bin."""
        return self.sums["count"].clone()

    def mean_distance(self) -> Float[Tensor, "layer bin"]:
        """The mean δ of the pairs in each bin (NaN for empty bins)."""
        return self.sums["dist_sum"] / self._n()

    def _n(self) -> Tensor:
        return count_or_nan(self.sums["count"])

    def band_logit(self) -> Float[Tensor, "layer head band bin"]:
        """Mean band logit per distance bin (each band's exact share of the score)."""
        return self.sums["band_sum"] / self._n()[:, None, None]

    def logit(self) -> Float[Tensor, "layer head bin"]:
        """Mean full logit (the sum of the bands: the score before any soft-cap) per distance
        bin."""
        return self.sums["band_sum"].sum(2) / self._n()[:, None]

    def prob(self) -> Float[Tensor, "layer head bin"]:
        """Mean attention probability of the model's pattern per distance bin."""
        return self.sums["prob_sum"] / self._n()[:, None]

    def mass(self) -> Float[Tensor, "layer head bin"]:
        """Mean attention mass per query that falls in each bin (keys below ``n_sink`` not
        counted)."""
        return self.sums["prob_sum"] / self.sums["n_queries"].clamp_min(1)[:, None, None]

    def _band(self, name: str) -> int:
        if name not in self.band_names:
            raise InputError(
                f"unknown curve {name!r}: choose a band {list(self.band_names)}, 'logit' or 'prob'"
            )
        return self.band_names.index(name)

    def layer_index(self, layer: int) -> int:
        """Where ``layer`` sits among the measured layers (an error naming them when it was not
        measured)."""
        if layer not in self.layers:
            raise InputError(
                f"layer {layer} was not measured; measured layers: {list(self.layers)}"
            )
        return self.layers.index(layer)

    def curve(
        self, layer: int, curve: str = "logit", head: int | None = None
    ) -> Float[Tensor, " bin"]:
        """One curve over the bins: a band's mean logit, "logit" or "prob"; heads averaged unless
        ``head``."""
        li = self.layer_index(layer)
        if curve == "logit":
            t = self.logit()[li]
        elif curve == "prob":
            t = self.prob()[li]
        else:
            t = self.band_logit()[li, :, self._band(curve)]
        n_heads = int(self.present()[li].sum())
        if head is None:
            return t[:n_heads].mean(0)  # the layer's own heads
        if not 0 <= head < n_heads:
            raise InputError(f"head {head} out of range: layer {layer} has heads 0..{n_heads - 1}")
        return t[head]

    # ---------------------------------------------------------------- shapes
    def describe(
        self, layer: int, curve: str = "logit", head: int | None = None, *, margin: float = MARGIN
    ) -> CurveShape:
        """:func:`describe_curve` of one curve over the bins' centres. Logit curves share one scale
        per layer (the largest |mean logit| of the full logit and every band), so a band whose curve
        moves by little against the others is called flat; probabilities are read on a log scale."""
        key = (layer, curve, head, margin)
        if key not in self._shapes:
            v = self.curve(layer, curve, head)
            scale = None
            if curve != "prob":
                everything = torch.stack(
                    [self.curve(layer, c, head) for c in ("logit", *self.band_names)]
                )
                scale = float(everything.abs().nan_to_num(0).max())
            positive = curve == "prob" and bool((v[torch.isfinite(v)] > 0).all())
            self._shapes[key] = describe_curve(
                v, self.centres, margin=margin, scale=scale, log=positive
            )
        return self._shapes[key]

    def u_shape_cause(
        self, layer: int, head: int | None = None, *, margin: float = MARGIN
    ) -> dict[str, Any] | None:
        """Which band makes the full logit rise again, when the full logit is U-shaped (else None).

        The rise from the minimum bin to the highest bin after it splits exactly into the bands'
        rises over the same two bins (band means add up to the full mean); the band with the largest
        share is the cause. Returns the bins, the rise, and each band's share of it.
        """
        shape = self.describe(layer, "logit", head, margin=margin)
        if shape.shape != "U-shaped":
            return None
        v = self.curve(layer, "logit", head)
        c = self.centres
        i_min = int(torch.nonzero(c == shape.min_at)[0])
        after = v[i_min:].nan_to_num(float("-inf"))
        i_top = i_min + int(after.argmax())
        rises = {
            name: float(self.curve(layer, name, head)[i_top] - self.curve(layer, name, head)[i_min])
            for name in self.band_names
        }
        total = float(v[i_top] - v[i_min])
        share = {k: r / total for k, r in rises.items()}
        cause = max(share, key=lambda k: share[k])
        return {
            "layer": layer,
            "head": head,
            "min_at": float(c[i_min]),
            "top_at": float(c[i_top]),
            "rise": total,
            "band_rise": rises,
            "band_share": share,
            "cause": cause,
        }

    def shapes(self, *, margin: float = MARGIN, heads: bool = False) -> pd.DataFrame:
        """One row per layer (× head with ``heads``) × curve (each band, "logit", "prob"): the
        shape, its sentence, and for a U-shaped full logit the band that causes the rise."""
        rows = []
        n_heads = self.present().sum(1).tolist()
        for li, layer in enumerate(self.layers):
            for head in range(n_heads[li]) if heads else [None]:
                for curve in (*self.band_names, "logit", "prob"):
                    v = self.curve(layer, curve, head)
                    if int(torch.isfinite(v).sum()) < 3:
                        continue
                    sh = self.describe(layer, curve, head, margin=margin)
                    row = {
                        "layer": layer,
                        "kind": self.spec.layers[layer].kind,
                        "curve": curve,
                        "shape": sh.shape,
                        "min_at": sh.min_at,
                        "max_at": sh.max_at,
                        "n_turns": len(sh.turns),
                        "text": sh.text,
                    }
                    if heads:
                        row["head"] = head
                    if curve == "logit":
                        cause = self.u_shape_cause(layer, head, margin=margin)
                        row["u_cause"] = None if cause is None else cause["cause"]
                        row["u_cause_share"] = (
                            None if cause is None else cause["band_share"][cause["cause"]]
                        )
                    rows.append(row)
        return pd.DataFrame(rows)

    def findings(self, *, margin: float = MARGIN) -> list[Finding]:
        """Sentences for the report: first the shapes of the full logit over all layers and the
        bands that cause the U-shapes, then per layer its full-logit shape, its cause when U-shaped,
        and the attention probability's shape."""
        shapes = self.shapes(margin=margin)
        out = [self._summary_finding(shapes, margin)] if len(shapes) else []
        for layer in self.layers:
            if int(torch.isfinite(self.curve(layer)).sum()) < 3:
                continue
            sh = self.describe(layer, "logit", margin=margin)
            vals: dict[str, Any] = {"layer": layer, "shape": sh.shape}
            text = (
                f"Layer {layer} ({self.spec.layers[layer].kind}), heads averaged: mean logit "
                f"is {sh.text}"
            )
            cause = self.u_shape_cause(layer, margin=margin)
            if cause is not None:
                vals.update(
                    cause=cause["cause"],
                    cause_percent=round(100 * cause["band_share"][cause["cause"]]),
                )
                text += (
                    f"; band {cause['cause']} carries {vals['cause_percent']}% of the rise from "
                    f"{at_distance(cause['min_at'])} to {at_distance(cause['top_at'])}"
                )
            prob = self.describe(layer, "prob", margin=margin)
            vals["prob_shape"] = prob.shape
            out.append(
                Finding(
                    f"distance-layer-{layer}",
                    "attention-distance",
                    text + f". Attention probability: {prob.text}.",
                    vals,
                )
            )
        return out

    def _summary_finding(self, shapes: pd.DataFrame, margin: float = MARGIN) -> Finding:
        full = shapes[shapes.curve == "logit"]
        counts = full["shape"].value_counts().to_dict()
        n_ctx = int(self.edges[-1])
        ranked = sorted(counts.items(), key=lambda kv: -kv[1])
        text = (
            f"By query–key distance (up to δ = {n_ctx - 1:,} tokens, BOS excluded), the "
            "head-averaged full logit " + _shape_counts(ranked, len(full))
        )
        u = full[full["shape"] == "U-shaped"]
        if len(u):
            text += "; the U-shapes come from band " + ", ".join(
                f"{c} ({n})" for c, n in u["u_cause"].value_counts().items()
            )
        band_u = shapes[(shapes["shape"] == "U-shaped") & ~shapes.curve.isin(["logit", "prob"])]
        if len(band_u):
            text += (
                f"; alone, bands are U-shaped in {len(band_u)} (layer, band) curves, most often "
                f"{band_u.curve.value_counts().index[0]}"
            )
        if len(u) or len(band_u):
            # the criterion, so a reader knows what a U means here
            text += (
                f" (U-shaped: a fall, then a rise of at least {RECOVERY:.0%} of the fall and "
                f"{margin:.0%} of the range)"
            )
        return Finding(
            "distance",
            "attention-by-distance",
            text + ".",
            {
                "full_logit_shapes": counts,
                "max_distance": n_ctx - 1,
                # the values a finding holds are those its text quotes
                **({"n_band_u": len(band_u)} if len(band_u) else {}),
                **({"u_recovery": RECOVERY} if len(u) or len(band_u) else {}),
            },
        )

    # ---------------------------------------------------------------- tables and persistence
    def to_frame(self) -> pd.DataFrame:
        """Tidy: one row per (layer, head, curve, bin) of the layer's own heads; curve is a band
        name, "logit" or "prob"."""
        L, H, B, nb = self.sums["band_sum"].shape
        e = self.edges
        frames = []
        curves = {name: self.band_logit()[:, :, j] for j, name in enumerate(self.band_names)}
        curves["logit"] = self.logit()
        curves["prob"] = self.prob()
        layer, head, bin_ = np.meshgrid(
            np.array(self.layers), np.arange(H), np.arange(nb), indexing="ij"
        )
        count = self.sums["count"][:, None, :].expand(L, H, nb)
        have = self.present()[..., None].expand(L, H, nb).reshape(-1).numpy()
        for name, mean in curves.items():
            frames.append(
                pd.DataFrame(
                    {
                        "layer": layer.ravel(),
                        "head": head.ravel(),
                        "curve": name,
                        "bin": bin_.ravel(),
                        "d_lo": e[:-1][bin_.ravel()].numpy(),
                        "d_hi": (e[1:] - 1)[bin_.ravel()].numpy(),
                        "centre": self.centres[bin_.ravel()].numpy(),
                        "count": count.reshape(-1).numpy(),
                        "mean": mean.reshape(-1).numpy(),
                    }
                )[have]
            )
        return pd.concat(frames, ignore_index=True)

    # -------------------------------------- figures (drawn by ropelens.plots.attention_by_distance)
    def figure(self, layers: Sequence[int] | None = None, head: int | None = None) -> Any:
        """Per layer (default: up to four spread over the measured ones): mean band logits and the
        full logit by distance (left), and the mean attention probability (right), log-x; δ = 0 sits
        at ½."""
        return figure_of(AttentionByDistance)(self, layers, head)


@corpus_analysis()
def attention_by_distance(
    model,
    corpus,
    run: RunOptions,
    *,
    bands: Bands | None = None,
    n_bins: int | None = None,
    n_sink: int = 1,
    tile: int | None = None,
) -> AttentionByDistance:
    """Mean band logits, full logit and attention probability by query–key distance over a corpus.

    After HoPE (Chen et al., ACL 2025), which reports attention decaying locally but U-shaped
    globally, with the long-distance rise coming from the low-frequency planes: per layer × head and
    per log-spaced bin of the distance δ = m − n (bin 0 is δ = 0, then 1, 2–3, 4–7, …, up to
    ``n_ctx`` − 1), the mean logit of each band (its exact share of the score), the mean full logit
    and the mean attention probability of the model's own pattern (see :class:`DistanceReducer`).
    Keys below ``n_sink`` take part in every softmax but are left out of the averages.

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
        bands (Bands | None): The plane groups (default None: :meth:`Bands.default`, four
            quantiles).
        n_bins (int | None): Number of distance bins (default None: octaves, δ = 0, 1, 2–3, 4–7, …;
            more bins give a finer log grid).
        n_sink (int): Leading key positions (BOS, where attention sinks sit) left out of the
            by-distance averages (default 1; 0 keeps them).
        tile (int | None): Queries per tile when the probabilities are rebuilt (default None: sized
            to the device's memory budget); it changes memory use, not the numbers.
        batch_size (int): Windows per forward pass (default 4).
        progress (bool): Show a progress bar (default True; rank 0 only under torchrun).
        checkpoint (str | os.PathLike | None): A directory to save progress to and resume a killed
            run from (default None: none; see :mod:`ropelens.run.distributed`).
        checkpoint_every (int): Batches between checkpoints (default 8).
        verify (bool): First check that ropelens's reading of RoPE reproduces the model's own
            attention (default True); False skips the check, and the result says "unverified".

    Returns:
        AttentionByDistance: Sums per ``[layer, head, band, bin]`` (band logits) and ``[layer, head,
        bin]`` (full logit, probability), with the bin ``edges``; ``curve()``, ``describe()`` and
        ``u_shape_cause()`` read them.

    Raises:
        InputError: When ``layers`` selects no layer the model has, the corpus cannot be read, or
            ``tile`` / ``n_sink`` / ``n_bins`` is out of range (the message names the problem and
            the fix).
        UnsupportedModelError: When ``verify`` finds that the RoPE reading does not reproduce the
            model's own attention.

    Examples:
        >>> from ropelens.analyses import attention_by_distance
        >>> from ropelens.testing import tiny_model
        >>> model = tiny_model("llama")
        >>> by_distance = attention_by_distance(model, n_ctx=32, max_tokens=128, progress=False)
        >>> by_distance.edges.tolist()  # bin j holds edges[j] <= δ < edges[j + 1]
        [0, 1, 2, 4, 8, 16, 32]
        >>> tuple(by_distance.band_logit().shape)  # [layer, head, band, bin]
        (2, 4, 4, 6)
    """
    bands = bands or Bands.default()

    def build(spec, chosen, win):
        return DistanceReducer(
            spec,
            chosen,
            bands,
            n_bins=n_bins,
            max_distance=win.n_ctx - 1,
            n_sink=n_sink,
            tile=tile,
        )

    m = measure(
        model,
        corpus,
        build,
        run,
        analysis="attention by distance",
        config=lambda reds: reds[0].config(),
        resume={"tile": tile},
    )
    return m.reducer.result(m.provenance)


def _shape_counts(ranked: list[tuple[str, int]], total: int) -> str:
    """How many layers' curves take each shape, most common first: "decays in all 30 layers",
    "decays in 20 of 30 layers and is U-shaped in 10", "is flat in the one layer"."""
    first, n = ranked[0]
    parts = [f"{shape_predicate(first)} in {count_of(n, total, 'layer')}"]
    parts += [f"{shape_predicate(shape)} in {k}" for shape, k in ranked[1:]]
    return parts[0] if len(parts) == 1 else ", ".join(parts[:-1]) + " and " + parts[-1]
