"""Band statistics over a corpus: each band's share of the logits, their variance and the
attended-key margin, from q and k in query × key tiles (the model's scores rebuilt per tile as the
sum of the band terms)."""

from __future__ import annotations

import dataclasses
import functools
import math
import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import einops
import pandas as pd
import torch
from jaxtyping import Bool, Float
from torch import Tensor

from ropelens.analyses.attention_decomposition import js_divergence
from ropelens.errors import InputError
from ropelens.results.figures import figure_of
from ropelens.results.findings import (
    Finding,
    band_winners,
    count_of,
    head_name,
    too_short,
    withheld,
)
from ropelens.results.provenance import Provenance
from ropelens.results.result import Result
from ropelens.run.capture import DeviceSums, LayerActs, query_tile, sum_dtype
from ropelens.run.measure import RunOptions, corpus_analysis, measure
from ropelens.spec.bands import Bands, ResolvedBands
from ropelens.spec.reading import rope_spec
from ropelens.spec.rope import LayerRope, RopeSpec

__all__ = ["BandStatistics", "BandStatsReducer", "band_statistics"]

_SUMS_LHB = ("abs_sum", "cov", "margin", "jsd", "top1")
MARGIN_MAJORITY = 0.5  # "most of its margin", in findings: more than half
MAX_LISTED = 5  # heads a finding names at most
# keys every query of a tile sees, from which Σ y² and Σ y·k come from a running Σ k kᵀ (d² per
# query) rather than from the scores: below this the scores are cheaper (measured on the CPU)
GRAM_MIN_KEYS = 512
KEY_TILE = {
    "cpu": 512
}  # keys per tile: rows longer than this are carried across key tiles (online argmax)
KEY_TILE_ACCELERATOR = 8192
# "triton" asks for the fused key-scan kernel where it runs (CUDA with Triton) and covers the layer
KERNEL_ENV = "ROPELENS_BAND_KERNEL"


class BandStatsReducer(DeviceSums):
    """Streams, per layer × head × band: mean |logit|, within-query covariance with the full
    logit, contribution to the attended key's margin, band-only top-1 agreement (and, with
    ``jsd=True``, the JS divergence of the band-only pattern); per plane, the Cauchy–Schwarz
    bound at the attended key.

    Needs only post-RoPE queries and keys, so the model runs with its own fast attention. Every
    statistic is computed in query tiles, FlashAttention-style: a tile holds each of its queries'
    whole key range (causal, sliding window), the model's scores are rebuilt in the tile as the sum
    of the band terms, and the layer's mask, soft-capping and sinks are applied there; memory is
    O(tile · n) per layer, and nothing of size ``[heads, n, n]`` exists. Keys stay in KV-head
    layout (grouped-query heads share one matmul). The score moments a tile needs over keys all its
    queries see (Σ y², Σ y·k) come from a running Σ k kᵀ once there are GRAM_MIN_KEYS of them, so
    the scores are summed only on the tile's causal and window edges. Sums accumulate in float64 on
    the model's device; the one host synchronisation per batch (whether it holds padding) is the
    capture's.
    """

    # masks built from positions: refused where the model picks keys from the input
    static_mask = "band statistics"
    needs = frozenset({"q_post", "k_post"})

    def __init__(
        self,
        spec: RopeSpec,
        layers: Sequence[int],
        bands: Bands,
        *,
        agreement: bool = True,
        jsd: bool = False,
        tile: int | tuple[int, int] | None = None,
        kernel: str | None = None,
    ) -> None:
        kernel = kernel or os.environ.get(KERNEL_ENV, "torch")
        if kernel not in ("torch", "triton"):
            raise InputError(
                f"kernel must be 'torch' or 'triton' (set by {KERNEL_ENV}); got {kernel!r}"
            )
        # "triton": the fused kernel where it runs and covers the layer (not measured yet, so
        # asked for explicitly); the torch scan everywhere else. Which ran goes into provenance.
        self.kernel, self.kernels_run = kernel, set()
        sizes = tile if isinstance(tile, tuple) else (tile,)
        if tile is not None and not (
            len(sizes) in (1, 2) and all(isinstance(t, int) and t >= 1 for t in sizes)
        ):
            raise InputError(
                f"tile must be a positive number of queries, a (queries, keys) pair, or None for "
                f"automatic; got {tile!r}"
            )
        self.spec, self.layers, self.bands, self.tile = spec, list(layers), bands, tile
        self.jsd = jsd
        self.agreement = agreement or jsd
        self.resolved = {L: bands.resolve(spec.layers[L]) for L in self.layers}
        bands.require_planes(
            [spec.layers[L] for L in self.layers]
        )  # a band with no plane anywhere: refused now
        names = {self.resolved[L].names for L in self.layers}
        if len(names) != 1:
            raise InputError(
                f"bands {bands.describe()} resolve to different band names across layers: {names}"
            )
        self.names = next(iter(names))
        self.sums = self._zeros()
        self.pos = {l_: i for i, l_ in enumerate(self.layers)}
        self._index: dict[tuple, Tensor] = {}
        self._padded: tuple[Tensor, bool] | None = None

    def _zeros(self) -> dict[str, Tensor]:
        """The running sums on the CPU: layers of different widths padded to the widest, NaN past
        their own heads and planes (:meth:`RopeSpec.padded_zeros`)."""
        z = functools.partial(self.spec.padded_zeros, self.layers)
        sums = {k: z("head", len(self.names)) for k in _SUMS_LHB}
        sums.update(
            var=z("head"),
            n_entries=z(),
            n_rows=z(),
            n_queries=z(),
            cs_term=z("head", "plane"),
            cs_bound=z("head", "plane"),
        )
        return sums

    def _has_padding(self, valid: Tensor, known: bool | None = None) -> bool:
        """Whether this batch holds padding (``known`` from the capture, else asked once per batch:
        every layer shares ``valid``)."""
        if known is not None:
            return known
        if self._padded is None or self._padded[0] is not valid:
            self._padded = (valid, not bool(valid.all()))
        return self._padded[1]

    def _band_index(
        self, layer: int, rb: ResolvedBands, head_dim: int, device: torch.device
    ) -> Tensor:
        """``[band, d_band]`` head-dim indices, bands padded to one width with index ``head_dim`` (a
        zero column)."""

        def make() -> Tensor:
            width = max(len(d) for d in rb.dims)
            rows = [
                torch.cat([d, torch.full((width - len(d),), head_dim, dtype=torch.long)])
                for d in rb.dims
            ]
            return torch.stack(rows).to(device)

        return self._cached((layer, "index", device), make)

    def _cached(self, key: tuple, make) -> Tensor:
        """Per-(layer, device) constants, built once."""
        if key not in self._index:
            self._index[key] = make()
        return self._index[key]

    def _tiles(
        self, device: torch.device, rows_per_query: int, n: int, window: int | None
    ) -> tuple[int, int]:
        """(queries, keys) per tile: key tiles of at most KEY_TILE keys, query tiles filling the
        element budget."""
        tk = KEY_TILE.get(device.type, KEY_TILE_ACCELERATOR)
        if isinstance(self.tile, tuple):
            return self.tile
        if self.tile:
            return self.tile, tk
        return query_tile(device, rows_per_query * min(tk, n, window or n)), tk

    @staticmethod
    def _spans(
        rope: LayerRope, valid: Tensor | None, c0: int, c1: int, j0: int, j1: int, dev: torch.device
    ) -> list[tuple]:
        """``(lo, hi, mask for x, mask for y)`` per column range of the tile holding masked entries.

        Without padding only the causal edge and the window's far edge are masked (computed from
        positions, no synchronisation); with padding the whole tile is masked against ``valid``.
        """
        qp = torch.arange(c0, c1, device=dev)[:, None]
        if valid is not None:
            kp = torch.arange(j0, j1, device=dev)[None]
            m = (kp <= qp) & ((qp - kp) < rope.window if rope.window else True)
            bad = ~(m[None] & valid[:, None, j0:j1])  # [b,c,kt]
            return [(0, j1 - j0, bad[:, None, None, None], bad[:, None, None])]
        out = []
        for lo, hi in _masked_spans_of(c0, c1, j0, j1, rope.window):
            kp = torch.arange(j0 + lo, j0 + hi, device=dev)[None]
            m = kp <= qp
            if rope.window:
                m &= (qp - kp) < rope.window
            out.append((lo, hi, ~m, ~m))
        return out

    @torch.no_grad()
    def update(self, acts: LayerActs) -> None:
        """Add one layer's batch to the per-(head, band) sums, query tile by query tile."""
        layer_slot, bands = self.pos[acts.layer], self.resolved[acts.layer]
        device = acts["q_post"].device
        sums = self._on(device)
        inputs = self._layer_inputs(acts, bands)
        has_padding = self._has_padding(acts.valid, acts.padded)
        keys_per_query = _keys_per_query(acts.valid, acts.rope, has_padding)
        counts = _RowCounts(
            keys=keys_per_query,
            scored=(keys_per_query >= 2).float(),
            seen=(keys_per_query >= 1).float(),
        )
        sums_device = sums["var"].device
        sums["n_entries"][layer_slot] += keys_per_query.sum().to(sums_device)
        sums["n_rows"][layer_slot] += counts.scored.sum().to(sums_device)
        sums["n_queries"][layer_slot] += counts.seen.sum().to(sums_device)
        batch, n_positions, n_heads, _ = inputs.head_queries_flat.shape
        query_tile_size, key_tile_size = self._tiles(
            device, batch * n_heads * bands.n_bands, n_positions, acts.rope.window
        )
        # each tile's terms are summed over its queries per window in float32 and added over
        # windows and tiles in float64 (the sums' dtype): a window's terms do not depend on the
        # batch it came in
        totals = _TileTotals.zeros(inputs, acts.rope, bands.n_bands, self.agreement)
        if self._kernel_runs(acts.rope, device):
            self.kernels_run.add("triton")
            scan = _kernel_scan(inputs, acts, n_kv_heads=acts.rope.n_kv_heads)
            totals.add_tile(inputs, counts, acts.rope, (0, n_positions), (0, 0), scan)
            totals.add_to(sums, layer_slot, n_heads, acts.rope.n_planes)
            return
        self.kernels_run.add("torch")
        for query_start in range(0, n_positions, query_tile_size):
            query_end = min(n_positions, query_start + query_tile_size)
            self._add_query_tile(
                inputs, counts, acts, has_padding, query_start, query_end, key_tile_size, totals
            )
        totals.add_to(sums, layer_slot, n_heads, acts.rope.n_planes)

    def _kernel_runs(self, rope: LayerRope, device: torch.device) -> bool:
        """Whether this layer's key scan runs in the Triton kernel: asked for, Triton runs on the
        device, and the kernel covers the layer."""
        if self.kernel != "triton":
            return False
        from ropelens.kernels import band_statistics_triton

        return band_statistics_triton.available(device) and band_statistics_triton.covers(
            rope, self.jsd
        )

    def _layer_inputs(self, acts: LayerActs, bands: ResolvedBands) -> _LayerInputs:
        """The batch's scaled queries and keys, by head and by band, and the tiles' constants."""
        rope = acts.rope
        q_post, k_post = acts["q_post"], acts["k_post"]
        device = q_post.device
        batch, n_positions, n_heads, head_dim = q_post.shape
        n_kv_heads = rope.n_kv_heads
        valid_float = acts.valid.float()[:, :, None, None]
        # the score scale goes into q once, so every product below is already a logit; padded
        # queries and keys are zero vectors
        queries = q_post.float() * (valid_float * rope.score_scale)
        keys = k_post.float() * valid_float
        band_index = self._band_index(acts.layer, bands, head_dim, device)
        if len({len(dims) for dims in bands.dims}) > 1:
            # bands of different widths: padded with a zero column
            queries_padded = torch.cat(
                [queries, queries.new_zeros(batch, n_positions, n_heads, 1)], -1
            )
            keys_padded = torch.cat([keys, keys.new_zeros(batch, n_positions, n_kv_heads, 1)], -1)
        else:
            queries_padded, keys_padded = queries, keys
        band_queries = einops.rearrange(
            queries_padded[..., band_index],
            "batch pos (kv_head group) band band_dim -> batch kv_head band group pos band_dim",
            kv_head=n_kv_heads,
        )
        band_keys = einops.rearrange(
            keys_padded[..., band_index],
            "batch pos kv_head band band_dim -> batch kv_head band pos band_dim",
        ).contiguous()
        head_queries = einops.rearrange(
            queries,
            "batch pos (kv_head group) head_dim -> batch kv_head group pos head_dim",
            kv_head=n_kv_heads,
        )
        head_keys = einops.rearrange(
            keys, "batch pos kv_head head_dim -> batch kv_head pos head_dim"
        ).contiguous()
        # Σ of the keys each query may attend to (prefix sums in float64: long windows cancel
        # exactly)
        wide = sum_dtype(device)
        wide_keys = head_keys.to(wide)
        membership = self._cached(
            (acts.layer, "member", device), lambda: bands.dim_membership().to(device)
        )
        return _LayerInputs(
            head_queries_flat=queries,
            band_queries=band_queries,
            band_keys=band_keys,
            head_queries=head_queries,
            head_keys=head_keys,
            window_key_sums=_window_sums(wide_keys, rope).float(),
            # Σ_k y² and Σ_k y·k over the keys every query of a tile attends to come from Σ k kᵀ
            # over them (y = q·k), carried from tile to tile in float64; only the tile's edge
            # columns need the scores
            gram=_RunningGram(wide_keys),
            membership=membership,
            membership_wide=self._cached(
                (acts.layer, "member_wide", device), lambda: membership.to(wide)
            ),
            wide=wide,
        )

    def _add_query_tile(
        self,
        inputs: _LayerInputs,
        counts: _RowCounts,
        acts: LayerActs,
        has_padding: bool,
        query_start: int,
        query_end: int,
        key_tile_size: int,
        totals: _TileTotals,
    ) -> None:
        """Add the statistics of the queries ``query_start:query_end`` to ``totals``."""
        rope = acts.rope
        first_key = max(0, query_start - rope.window + 1) if rope.window else 0
        # keys every query of the tile sees
        shared_keys = (max(0, query_end - rope.window) if rope.window else 0, query_start + 1)
        if shared_keys[1] - shared_keys[0] < GRAM_MIN_KEYS:
            # few: cheaper as scores than as products with Σ k kᵀ
            shared_keys = (0, 0)
        scan = self._scan_key_tiles(
            inputs,
            counts,
            acts,
            has_padding,
            (query_start, query_end),
            first_key,
            shared_keys,
            key_tile_size,
            totals,
        )
        totals.add_tile(inputs, counts, rope, (query_start, query_end), shared_keys, scan)

    def _scan_key_tiles(
        self,
        inputs: _LayerInputs,
        counts: _RowCounts,
        acts: LayerActs,
        has_padding: bool,
        query_range: tuple[int, int],
        first_key: int,
        shared_keys: tuple[int, int],
        key_tile_size: int,
        totals: _TileTotals,
    ) -> _TileScan:
        """Per query of the tile, carried across key tiles: the attended key and the band sums.

        Carried online, as FlashAttention carries its row maximum; with ``jsd`` each tile holds
        whole rows, and each band's JS divergence from the model's pattern goes into ``totals``.
        """
        rope = acts.rope
        query_start, query_end = query_range
        tile_band_queries = inputs.band_queries[..., query_start:query_end, :]
        batch, n_kv_heads, n_bands, group_size, n_tile_queries, _ = tile_band_queries.shape
        n_heads = n_kv_heads * group_size
        tile_band_queries = tile_band_queries.reshape(
            batch, n_kv_heads, n_bands, group_size * n_tile_queries, -1
        )
        scan = _TileScan.empty(inputs, batch, n_kv_heads, n_bands, group_size, n_tile_queries)
        key_step = (query_end - first_key) if self.jsd else key_tile_size
        for key_start in range(first_key, query_end, key_step):
            key_end = min(query_end, key_start + key_step)
            n_tile_keys = key_end - key_start
            # per band, [batch, kv_head, band, group, query, key]
            band_logits = torch.matmul(
                tile_band_queries, inputs.band_keys[..., key_start:key_end, :].transpose(-1, -2)
            ).view(batch, n_kv_heads, n_bands, group_size, n_tile_queries, n_tile_keys)
            spans = self._spans(
                rope,
                acts.valid if has_padding else None,
                query_start,
                query_end,
                key_start,
                key_end,
                band_logits.device,
            )
            for lo, hi, band_mask, _ in spans:
                band_logits[..., lo:hi].masked_fill_(band_mask, NEG_INF)
            # the model's scores (masked entries −inf): [batch, kv_head, group, query, key]
            scores = band_logits.sum(2)
            scan.attend(band_logits, scores, spans, rope.softcap, key_start, self.agreement)
            if self.jsd:
                # the model's own pattern, rebuilt from its scores
                model_pattern = rope.probs(
                    scores.reshape(batch, n_heads, n_tile_queries, n_tile_keys)
                )
                for band in range(n_bands):
                    band_pattern = rope.probs(
                        band_logits[:, :, band].reshape(batch, n_heads, n_tile_queries, n_tile_keys)
                    )
                    divergence = js_divergence(band_pattern, model_pattern)
                    totals.band["jsd"][:, band] += _sum_per_window(
                        divergence * counts.seen[:, None, query_start:query_end], 2, inputs.wide
                    ).view(n_kv_heads, group_size)
            for lo, hi, _, score_mask in spans:
                scores[..., lo:hi].masked_fill_(score_mask, 0.0)
            for lo, hi in _outside(key_start, key_end, *shared_keys):
                edge_scores = scores[..., lo:hi]
                scan.score_square_sum += (edge_scores * edge_scores).sum(-1)
                scan.score_key_sum += torch.matmul(
                    edge_scores.reshape(batch, n_kv_heads, group_size * n_tile_queries, hi - lo),
                    inputs.head_keys[:, :, key_start + lo : key_start + hi],
                )
            del scores
            band_logits.abs_()
            for lo, hi, band_mask, _ in spans:
                band_logits[..., lo:hi].masked_fill_(band_mask, 0.0)
            scan.abs_logit_sum += band_logits.sum(-1)
            del band_logits
        return scan

    def result(self, provenance: Provenance) -> BandStatistics:
        """The streamed sums as :class:`BandStatistics` (on the CPU, float64)."""
        sums = {k: v.detach().to("cpu", torch.float64) for k, v in self.sums.items()}
        if self.kernels_run:
            provenance = dataclasses.replace(
                provenance,
                config={**provenance.config, "band_statistics_kernel": sorted(self.kernels_run)},
            )
        return BandStatistics(
            tuple(self.layers), self.names, self.bands, self.spec, sums, provenance
        )


def _rounded(x: float) -> float | None:
    """A band-only agreement as findings keep it: two decimals, None where not measurable (NaN: no
    plane there)."""
    return None if x != x else round(x, 2)


def _agreement_text(x: float | None) -> str:
    """A band-only agreement as findings quote it: two decimals, or "not measurable" (the band has
    no plane there)."""
    return "not measurable" if x is None or x != x else f"{x:.2f}"


NEG_INF = float("-inf")


def _sum_per_window(tensor: Tensor, dim: int, wide: torch.dtype) -> Tensor:
    """Sum over ``dim`` (the tile's queries) in the tensor's dtype, then over windows, wide."""
    return tensor.sum(dim).to(wide).sum(0)


def _keys_per_query(valid: Bool[Tensor, "batch pos"], rope: LayerRope, has_padding: bool) -> Tensor:
    """``[batch, pos]``: how many (valid) keys each query attends to, as floats."""
    batch, n_positions = valid.shape
    positions = torch.arange(n_positions, device=valid.device)
    if not has_padding:
        allowed = positions + 1 if not rope.window else (positions + 1).clamp(max=rope.window)
        return allowed.float()[None].expand(batch, n_positions)
    # padding anywhere: count only the valid keys each query sees
    valid_so_far = valid.long().cumsum(1)
    window_start = (
        (positions - rope.window).clamp(min=-1)
        if rope.window
        else positions.new_full((n_positions,), -1)
    )
    before_window = torch.where(
        window_start >= 0,
        valid_so_far.gather(1, window_start.clamp(min=0)[None].expand(batch, -1)),
        0,
    )
    return ((valid_so_far - before_window) * valid).float()


@dataclass(frozen=True)
class _RowCounts:
    """Per (batch, query): its keys, whether it has two or more (scored), one or more (seen)."""

    keys: Float[Tensor, "batch pos"]
    scored: Float[Tensor, "batch pos"]
    seen: Float[Tensor, "batch pos"]


@dataclass(frozen=True)
class _LayerInputs:
    """One layer's batch as the tiles read it: scaled queries and keys by head and by band."""

    head_queries_flat: Float[Tensor, "batch pos head head_dim"]
    band_queries: Float[Tensor, "batch kv_head band group pos band_dim"]
    band_keys: Float[Tensor, "batch kv_head band pos band_dim"]
    head_queries: Float[Tensor, "batch kv_head group pos head_dim"]
    head_keys: Float[Tensor, "batch kv_head pos head_dim"]
    window_key_sums: Float[Tensor, "batch kv_head pos head_dim"]
    gram: _RunningGram
    membership: Float[Tensor, "head_dim band"]
    membership_wide: Float[Tensor, "head_dim band"]
    wide: torch.dtype


@dataclass
class _TileScan:
    """Per query of one tile, carried across its key tiles: attended key, band logits and sums."""

    best_score: Tensor  # [batch, kv_head, group, query]: the attended key's (soft-capped) score
    attended_key: Tensor  # [batch, kv_head, group, query]
    attended_band_logits: Tensor  # [batch, kv_head, band, group, query]
    band_max: Tensor  # [batch, kv_head, band, group, query]: each band's own maximum
    band_ties: Tensor  # [batch, kv_head, band, group, query]: keys at that maximum
    abs_logit_sum: Tensor  # [batch, kv_head, band, group, query]
    score_square_sum: Tensor  # [batch, kv_head, group, query]: Σ y² over the edge columns
    score_key_sum: Tensor  # [batch, kv_head, group * query, head_dim]: Σ y·k, edge columns

    @classmethod
    def empty(
        cls,
        inputs: _LayerInputs,
        batch: int,
        n_kv_heads: int,
        n_bands: int,
        group_size: int,
        n_tile_queries: int,
    ) -> _TileScan:
        """Nothing seen yet: scores at −inf, sums at zero."""
        like = inputs.head_queries_flat
        head_dim = like.shape[-1]
        per_query = (batch, n_kv_heads, group_size, n_tile_queries)
        per_band = (batch, n_kv_heads, n_bands, group_size, n_tile_queries)
        return cls(
            best_score=like.new_full(per_query, NEG_INF),
            attended_key=torch.zeros(per_query, dtype=torch.long, device=like.device),
            attended_band_logits=like.new_zeros(per_band),
            band_max=like.new_full(per_band, NEG_INF),
            band_ties=like.new_zeros(per_band),
            abs_logit_sum=like.new_zeros(per_band),
            score_square_sum=like.new_zeros(per_query),
            score_key_sum=like.new_zeros(batch, n_kv_heads, group_size * n_tile_queries, head_dim),
        )

    def attend(
        self,
        band_logits: Tensor,
        scores: Tensor,
        spans: list[tuple],
        softcap: float | None,
        key_start: int,
        agreement: bool,
    ) -> None:
        """Carry the attended key (argmax after soft-capping) and its band logits over keys."""
        if softcap:  # the argmax of the model's pattern is taken after soft-capping
            capped_scores = torch.tanh(scores / softcap)
            for lo, hi, _, score_mask in spans:
                capped_scores[..., lo:hi].masked_fill_(score_mask, NEG_INF)
        else:
            capped_scores = scores
        tile_argmax = capped_scores.argmax(-1, keepdim=True)
        tile_top = capped_scores.gather(-1, tile_argmax)[..., 0]
        better = tile_top > self.best_score  # strict: ties keep the earlier key, as argmax does
        self.best_score = torch.where(better, tile_top, self.best_score)
        self.attended_key = torch.where(better, tile_argmax[..., 0] + key_start, self.attended_key)
        del capped_scores
        n_bands = band_logits.shape[2]
        tile_band_logits = band_logits.gather(
            -1, tile_argmax[:, :, None].expand(-1, -1, n_bands, -1, -1, -1)
        )[..., 0]
        self.attended_band_logits = torch.where(
            better[:, :, None], tile_band_logits, self.attended_band_logits
        )
        if agreement:
            # keys tied at a band's maximum share its pick: a band whose logits are all equal
            # (no plane left in the head, or ablated) agrees by chance, not always
            tile_max = band_logits.amax(-1)
            tile_ties = (band_logits == tile_max[..., None]).sum(-1).to(self.band_ties.dtype)
            self.band_ties = torch.where(
                tile_max > self.band_max,
                tile_ties,
                torch.where(tile_max == self.band_max, self.band_ties + tile_ties, self.band_ties),
            )
            self.band_max = torch.maximum(self.band_max, tile_max)


@dataclass
class _TileTotals:
    """The layer's sums over tiles and windows, in float64, per (kv_head, band, group)."""

    band: dict[str, Tensor]  # abs, cov, margin, top1, jsd: [kv_head, band, group]
    score_variance: Tensor  # [kv_head, group]
    plane: dict[str, Tensor]  # term, bound: [kv_head, group, plane]
    agreement: bool

    @classmethod
    def zeros(
        cls, inputs: _LayerInputs, rope: LayerRope, n_bands: int, agreement: bool
    ) -> _TileTotals:
        """All sums at zero."""
        like, wide = inputs.head_queries_flat, inputs.wide
        n_kv_heads, group_size = rope.n_kv_heads, rope.group_size
        return cls(
            band={
                name: like.new_zeros(n_kv_heads, n_bands, group_size, dtype=wide)
                for name in ("abs", "cov", "margin", "top1", "jsd")
            },
            score_variance=like.new_zeros(n_kv_heads, group_size, dtype=wide),
            plane={
                name: like.new_zeros(n_kv_heads, group_size, rope.n_planes, dtype=wide)
                for name in ("term", "bound")
            },
            agreement=agreement,
        )

    def add_tile(
        self,
        inputs: _LayerInputs,
        counts: _RowCounts,
        rope: LayerRope,
        query_range: tuple[int, int],
        shared_keys: tuple[int, int],
        scan: _TileScan,
    ) -> None:
        """Add one query tile's rows: |logit|, covariance, margin, top-1, variance, planes."""
        query_start, query_end = query_range
        wide = inputs.wide
        tile_keys = counts.keys[:, query_start:query_end]
        tile_scored = counts.scored[:, query_start:query_end]
        tile_seen = counts.seen[:, query_start:query_end]
        tile_queries = inputs.head_queries[:, :, :, query_start:query_end]
        batch, n_kv_heads, group_size, n_tile_queries, head_dim = tile_queries.shape
        scored_rows = tile_scored[:, None, None, None].bool()
        self.band["abs"] += _sum_per_window(scan.abs_logit_sum, 4, wide)
        if self.agreement:
            # band-only top-1: the attended key attains the band's own maximum, shared among the
            # keys tied there (ties broken at random)
            attains = (scan.attended_band_logits >= scan.band_max) & tile_seen[
                :, None, None, None
            ].bool()
            agrees = attains.to(wide) / scan.band_ties.to(wide).clamp_min(1)
            self.band["top1"] += agrees.sum((0, 4))
        score_square_sum = scan.score_square_sum
        # keys seen by the whole tile: Σ_k y·k_j = (Σ_k k kᵀ) q, so Σ_k x_b·y and Σ_k y² are
        # products with q
        if shared_keys[1] > shared_keys[0]:
            wide_queries = tile_queries.to(wide)
            gram_products = wide_queries * torch.matmul(
                wide_queries, inputs.gram.over(*shared_keys)[:, :, None]
            )
            score_square_sum = score_square_sum + gram_products.sum(-1)
            shared_cross = torch.matmul(gram_products, inputs.membership_wide)
        else:
            shared_cross = 0.0
        # Σ_k x_b = q_b · Σ_k k_b; Σ_k x_b·y = q_b · (Σ_k y k_b): per-dim products summed into bands
        to_bands = "batch kv_head group query band -> batch kv_head band group query"
        band_row_sums = einops.rearrange(
            torch.matmul(
                tile_queries * inputs.window_key_sums[:, :, None, query_start:query_end],
                inputs.membership,
            ),
            to_bands,
        )
        score_key_sum = scan.score_key_sum.view(
            batch, n_kv_heads, group_size, n_tile_queries, head_dim
        )
        band_score_cross = einops.rearrange(
            torch.matmul(tile_queries * score_key_sum, inputs.membership) + shared_cross, to_bands
        )
        score_row_sums = band_row_sums.sum(2)
        keys_or_one = tile_keys.clamp_min(1)
        self.score_variance += _sum_per_window(
            torch.where(
                tile_scored[:, None, None].bool(),
                score_square_sum - score_row_sums**2 / keys_or_one[:, None, None],
                0,
            ),
            3,
            wide,
        )
        self.band["cov"] += _sum_per_window(
            torch.where(
                scored_rows,
                band_score_cross
                - band_row_sums * score_row_sums[:, :, None] / keys_or_one[:, None, None, None],
                0,
            ),
            4,
            wide,
        )
        attended = scan.attended_band_logits
        self.band["margin"] += _sum_per_window(
            torch.where(
                scored_rows,
                attended
                - (band_row_sums - attended) / (tile_keys - 1).clamp_min(1)[:, None, None, None],
                0,
            ),
            4,
            wide,
        )
        self._add_plane_terms(inputs, rope, scan, tile_queries, tile_scored)

    def _add_plane_terms(
        self,
        inputs: _LayerInputs,
        rope: LayerRope,
        scan: _TileScan,
        tile_queries: Tensor,
        tile_scored: Tensor,
    ) -> None:
        """Per plane, the attended key's logit term and its Cauchy–Schwarz bound |q||k|."""
        wide = inputs.wide
        batch, n_kv_heads, group_size, n_tile_queries, head_dim = tile_queries.shape
        attended_keys = inputs.head_keys.gather(
            2,
            scan.attended_key.view(batch, n_kv_heads, group_size * n_tile_queries, 1).expand(
                -1, -1, -1, head_dim
            ),
        ).view(batch, n_kv_heads, group_size, n_tile_queries, head_dim)
        scored_planes = tile_scored[:, None, None, :, None].bool()
        self.plane["term"] += _sum_per_window(
            torch.where(scored_planes, rope.plane_sums(tile_queries * attended_keys), 0), 3, wide
        )
        self.plane["bound"] += _sum_per_window(
            torch.where(
                scored_planes,
                rope.plane_norms(tile_queries) * rope.plane_norms(attended_keys),
                0,
            ),
            3,
            wide,
        )

    def add_to(self, sums: dict[str, Tensor], layer_slot: int, n_heads: int, n_planes: int) -> None:
        """Add the layer's totals to the running sums (a narrower layer fills its leading heads)."""
        sums_device = sums["var"].device

        def by_head(total: Tensor) -> Tensor:
            return einops.rearrange(total, "kv_head band group -> (kv_head group) band").to(
                sums_device, torch.float64
            )

        for name, key in (
            ("abs_sum", "abs"),
            ("cov", "cov"),
            ("margin", "margin"),
            ("top1", "top1"),
            ("jsd", "jsd"),
        ):
            sums[name][layer_slot, :n_heads] += by_head(self.band[key])
        sums["var"][layer_slot, :n_heads] += self.score_variance.reshape(n_heads).to(
            sums_device, torch.float64
        )
        for name, key in (("cs_term", "term"), ("cs_bound", "bound")):
            per_head = einops.rearrange(
                self.plane[key], "kv_head group plane -> (kv_head group) plane"
            )
            sums[name][layer_slot, :n_heads, :n_planes] += per_head.to(sums_device, torch.float64)


def _kernel_scan(inputs: _LayerInputs, acts: LayerActs, n_kv_heads: int) -> _TileScan:
    """The whole layer's key scan from the Triton kernel, laid out as the torch scan's."""
    from ropelens.kernels.band_statistics_triton import key_scan

    rope = acts.rope
    kernel_scan = key_scan(
        inputs.head_queries_flat,
        inputs.head_keys,
        acts.valid,
        inputs.membership,
        window=rope.window,
        softcap=rope.softcap,
    )
    batch, n_heads, n_positions = kernel_scan.attended_key.shape
    per_query = (batch, n_kv_heads, n_heads // n_kv_heads, n_positions)
    to_groups = "batch (kv_head group) band pos -> batch kv_head band group pos"

    def per_band(tensor: Tensor) -> Tensor:
        return einops.rearrange(tensor, to_groups, kv_head=n_kv_heads)

    return _TileScan(
        best_score=kernel_scan.score_square_sum.new_zeros(per_query),
        attended_key=kernel_scan.attended_key.view(per_query),
        attended_band_logits=per_band(kernel_scan.attended_band_logits),
        band_max=per_band(kernel_scan.band_max),
        band_ties=per_band(kernel_scan.band_ties),
        abs_logit_sum=per_band(kernel_scan.abs_logit_sum),
        score_square_sum=kernel_scan.score_square_sum.view(per_query),
        score_key_sum=kernel_scan.score_key_sum.reshape(
            batch, n_kv_heads, per_query[2] * n_positions, -1
        ),
    )


def _window_sums(k: Float[Tensor, "b h pos d"], rope: LayerRope) -> Float[Tensor, "b h pos d"]:
    """Σ of keys each query may attend to: a prefix sum, minus the part before a sliding window."""
    csum = k.cumsum(2)
    if rope.window and rope.window < k.shape[2]:
        csum[:, :, rope.window :] -= csum[:, :, : -rope.window].clone()
    return csum


class _RunningGram:
    """Σ k kᵀ over any key range ``[lo, hi)`` whose ends only move forward: two running prefix
    sums."""

    def __init__(self, k: Float[Tensor, "b h pos d"]) -> None:
        self.k = k
        b, h, _, d = k.shape
        self.ends = [0, 0]
        self.sums = [k.new_zeros(b, h, d, d), k.new_zeros(b, h, d, d)]

    def _upto(self, which: int, end: int) -> Tensor:
        start = self.ends[which]
        if end > start:
            seg = self.k[:, :, start:end]
            self.sums[which] += torch.matmul(seg.transpose(-1, -2), seg)
            self.ends[which] = end
        return self.sums[which]

    def over(self, lo: int, hi: int) -> Tensor:
        """Σ_{lo ≤ j < hi} k_j k_jᵀ, ``[b, h, d, d]``, for ``lo < hi``."""
        return self._upto(1, hi) - self._upto(0, lo)


def _outside(j0: int, j1: int, lo: int, hi: int) -> list[tuple[int, int]]:
    """Column ranges (relative to ``j0``) of keys ``[j0, j1)`` outside ``[lo, hi)``: disjoint, in
    order."""
    if hi <= lo:
        return [(0, j1 - j0)]
    out = [(0, min(j1, lo) - j0)] if lo > j0 else []
    if j1 > hi:
        out.append((max(j0, hi) - j0, j1 - j0))
    return [(a, z) for a, z in out if z > a]


def _masked_spans_of(
    c0: int, c1: int, j0: int, j1: int, window: int | None
) -> list[tuple[int, int]]:
    """Column ranges (relative to key ``j0``) of the tile queries ``[c0, c1)`` × keys ``[j0, j1)``
    that hold masked entries: keys after the tile's first query (causal) and, with a sliding window,
    keys some query of the tile has left behind. Other columns are allowed for every query."""
    spans = []
    if window and min(j1, c1 - window) > j0:
        spans.append((0, min(j1, c1 - window) - j0))
    if j1 > c0 + 1:
        spans.append((max(j0, c0 + 1) - j0, j1 - j0))
    return spans


# unversioned: files from before the result base carry a type but no format
@dataclass(frozen=True)
class BandStatistics(
    Result, unversioned=True, merge_same=("layers", "band_names", "spec"), merge_sums=("sums",)
):
    """Corpus statistics of the band decomposition, per layer × head × band.

    Layers of different widths (Gemma 4's wider global heads) share one ``[layer, head, ...]``
    array: each fills its leading heads and planes, and every number past them reads NaN
    (:meth:`present` marks a layer's own heads); tables leave those rows out, and findings skip
    them.

    Built by :func:`~ropelens.analyses.band_statistics`. The logit is exactly the sum of its band
    terms, so each band's share of the mean |logit| (:meth:`abs_share`), of the within-query logit
    variance (:meth:`var_share`) and of the attended key's margin (:meth:`margin_share`) sums to 1
    over bands; :meth:`top1` says how often a band alone picks the key the model attends to most.

    Attributes:
        layers (tuple[int, ...]): The measured layers, in the order of the ``layer`` axis.
        band_names (tuple[str, ...]): Band names, in the order of the ``band`` axis (highest
            frequency first).
        bands (Bands): The band definition the names were resolved from (default quartiles).
        spec (RopeSpec): The model's RoPE reading.
        sums (dict[str, Tensor]): Streamed float64 sums: ``abs_sum``, ``cov``, ``margin``,
            ``top1`` and ``jsd`` ``[layer, head, band]``; ``var`` ``[layer, head]``; ``cs_term``
            and ``cs_bound`` ``[layer, head, plane]``; counts ``n_entries``, ``n_rows`` and
            ``n_queries`` ``[layer]``.
        provenance (Provenance): Model, corpus, token count, options (``agreement``, ``jsd``) and
            versions.

    Examples:
        >>> import torch
        >>> from ropelens.analyses import band_statistics
        >>> from ropelens.testing import tiny_model
        >>> tokens = torch.randint(4, 100, (2, 16), generator=torch.Generator().manual_seed(0))
        >>> st = band_statistics(tiny_model("llama"), tokens, progress=False)
        >>> st.band_names
        ('Q1 (highest)', 'Q2', 'Q3', 'Q4 (lowest)')
        >>> share = st.var_share()  # [layer, head, band]
        >>> tuple(share.shape), bool(torch.allclose(share.sum(-1), torch.ones(2, 4), atol=1e-4))
        ((2, 4, 4), True)
        >>> len(st.figure().data)  # |logit|, variance and margin shares
        3
    """

    layers: tuple[int, ...]
    band_names: tuple[str, ...]
    bands: Bands
    spec: RopeSpec
    sums: dict[str, Tensor]
    provenance: Provenance

    def __post_init__(self) -> None:
        self._check_shape(
            "abs_sum",
            self.sums["abs_sum"],
            (len(self.layers), None, len(self.band_names)),
            " [layer, head, band]",
        )

    def present(self) -> Bool[Tensor, "layer head"]:
        """The heads each layer has (all True when the measured layers share one width)."""
        return ~self.sums["var"].isnan()

    def abs_share(self) -> Float[Tensor, "layer head band"]:
        """Each band's share of the mean |logit| (sums to 1 over bands)."""
        a = self.sums["abs_sum"]
        return (a / a.sum(-1, keepdim=True).clamp_min(1e-30)).float()

    def mean_abs(self) -> Float[Tensor, "layer head band"]:
        """Mean |band logit| over allowed (query, key) pairs."""
        return (self.sums["abs_sum"] / self.sums["n_entries"][:, None, None].clamp_min(1)).float()

    def var_share(self) -> Float[Tensor, "layer head band"]:
        """Share of within-query logit variance: Cov(band, logit)/Var(logit); sums to 1 (may be
        <0)."""
        return (self.sums["cov"] / self.sums["var"][..., None].clamp_min(1e-30)).float()

    def margin(self) -> Float[Tensor, "layer head band"]:
        """Mean contribution to the margin: logit at the attended key minus the mean over other
        keys."""
        return (self.sums["margin"] / self.sums["n_rows"][:, None, None].clamp_min(1)).float()

    def margin_share(self) -> Float[Tensor, "layer head band"]:
        """Each band's fraction of the total attended-key margin (sums to 1; may be <0)."""
        m = self.sums["margin"]
        return (m / m.sum(-1, keepdim=True)).float()

    def measurable(self) -> Bool[Tensor, "layer band"]:
        """Whether each band holds a dimension in each layer. A band with none there has no logits
        of its own (all 0), so what it does alone (:meth:`top1`, :meth:`jsd`) is not measurable in
        that layer and reads NaN."""
        rows = [
            [len(d) > 0 for d in self.bands.resolve(self.spec.layers[L]).dims] for L in self.layers
        ]
        return torch.tensor(rows, dtype=torch.bool).reshape(len(self.layers), len(self.band_names))

    def _band_only(self, key: str) -> Float[Tensor, "layer head band"]:
        x = (self.sums[key] / self.sums["n_queries"][:, None, None].clamp_min(1)).float()
        return torch.where(self.measurable()[:, None, :], x, torch.nan)

    def top1(self) -> Float[Tensor, "layer head band"]:
        """Fraction of queries whose band-only argmax is the key the model attends to most, keys
        tied at the band's maximum sharing the pick (a query whose band ties k keys, the attended
        one among them, counts 1/k: an ablated band agrees by chance, not always); NaN where the
        band holds no plane in the layer."""
        if not self.provenance.config.get("agreement", True):
            raise InputError(
                "band-only agreement was not streamed: run band_statistics(..., agreement=True)"
            )
        return self._band_only("top1")

    def jsd(self) -> Float[Tensor, "layer head band"]:
        """Mean JS divergence (nats) of the band-only pattern from the model's (needs jsd=True; NaN
        where the band holds no plane in the layer)."""
        if not self.provenance.config.get("jsd", False):
            raise InputError("JS divergence was not streamed: run band_statistics(..., jsd=True)")
        return self._band_only("jsd")

    def tightness(self) -> Float[Tensor, "layer head plane"]:
        """Per plane at the attended key: Σ term / Σ ‖q‖‖k‖ (1 = q and k perfectly aligned)."""
        return (self.sums["cs_term"] / self.sums["cs_bound"].clamp_min(1e-30)).float()

    def to_frame(self) -> pd.DataFrame:
        """Tidy: one row per (layer, head, band) of the layer's own heads."""
        metrics = {
            "abs_share": self.abs_share(),
            "mean_abs": self.mean_abs(),
            "var_share": self.var_share(),
            "margin": self.margin(),
            "margin_share": self.margin_share(),
        }
        if self.provenance.config.get("agreement", True):
            metrics["top1"] = self.top1()
        if self.provenance.config.get("jsd", False):
            metrics["jsd"] = self.jsd()
        L, H, B = metrics["abs_share"].shape
        idx = pd.MultiIndex.from_product(
            [self.layers, range(H), self.band_names], names=["layer", "head", "band"]
        )
        have = self.present()[..., None].expand(L, H, B).reshape(-1).numpy()
        df = pd.DataFrame(
            {k: v.reshape(-1).numpy() for k, v in metrics.items()}, index=idx
        ).reset_index()
        return df[have].reset_index(drop=True)

    # ---------------------------------------------------------------- findings
    def findings(self) -> list[Finding]:
        """Heads taking most of their margin from the highest-frequency band, the band whose logits
        alone most often pick the attended key (both with two bands or more), and plane 0's
        tightness. Each needs a query that chooses between keys, so windows need at least 2
        tokens; shorter ones give the findings withheld, saying why."""
        n_ctx = self.provenance.n_ctx
        if too_short(n_ctx, 2):
            why = "a query needs two keys to choose between for a margin or a top-1 pick"
            return [withheld("bands", "band-statistics", "the bands", n_ctx, 2, why)]  # type: ignore[arg-type]
        found = (self._margin_finding(), self._top1_finding(), self._tightness_finding())
        return [f for f in found if f is not None]

    def _margin_finding(self) -> Finding | None:
        if len(self.band_names) < 2:
            return None
        share = self.margin_share()[..., 0]  # band 0: the highest frequencies
        top1 = self.top1()[..., 0]
        band = self.band_names[0]
        have = self.present()
        flat = sorted(
            (
                (float(share[i, h]), self.layers[i], h, float(top1[i, h]))
                for i, h in have.nonzero().tolist()
            ),
            key=lambda t: -t[0],
        )
        n_heads = len(flat)
        major = [t for t in flat if t[0] > MARGIN_MAJORITY]
        listed = major[:MAX_LISTED] if major else flat[:1]  # only what the sentence quotes
        heads = [
            {"layer": lay, "head": h, "margin_share": round(s, 2), "top1": _rounded(t)}
            for s, lay, h, t in listed
        ]
        shown = ", ".join(
            f"{head_name(x['layer'], x['head'])} {x['margin_share']:.2f} (band-only top-1 "
            f"{_agreement_text(x['top1'])})"
            for x in heads
        )
        vals = {
            "band": band,
            "n_heads": n_heads,
            "n_majority": len(major),
            "n_shown": len(heads),
            "heads": heads,
        }
        if major:
            verb, their = ("gets", "its") if len(major) == 1 else ("get", "their")
            # a list cut short says so, or a reader takes the heads named for all of them
            cut = f" ({len(heads)} shown, largest first)" if len(heads) < len(major) else ""
            text = (
                f"{len(major)} of {n_heads} heads{cut} {verb} more than half of {their} "
                f"attended-key margin from band {band}: {shown}."
            )
        else:
            top = heads[0]
            text = (
                f"No head gets more than half of its attended-key margin from band {band}; the "
                f"largest share is {top['margin_share']:.2f} "
                f"({head_name(top['layer'], top['head'])}, band-only top-1 "
                f"{_agreement_text(top['top1'])})."
            )
        return Finding("margin", "band-statistics", text, vals)

    def _top1_finding(self) -> Finding | None:
        if len(self.band_names) < 2:
            return None
        top1 = self.top1()  # [L, H, B]; NaN where a band holds no plane in the layer
        # an empty band never leads; heads a layer lacks (layers of other widths) are NaN and left
        # out
        band, n, _ = band_winners(top1.nanmean(1).nan_to_num(nan=-1.0), self.band_names)
        overall = top1.nanmean((0, 1))
        b = self.band_names.index(band)
        vals = {
            "band": band,
            "layers": n,
            "n_layers": len(self.layers),
            "mean_top1": round(float(overall[b]), 2),
            "first_band": self.band_names[0],
            "first_top1": _rounded(float(overall[0])),
        }
        text = (
            f"Alone, band {band} most often picks the key the model attends to most: it leads in "
            f"{count_of(n, len(self.layers), 'layer')}, with top-1 agreement "
            f"{vals['mean_top1']:.2f} over all heads"
        )
        text += (
            "."
            if b == 0
            else f", against {_agreement_text(vals['first_top1'])} for band {vals['first_band']}."
        )
        return Finding("top1", "band-statistics", text, vals)

    def _tightness_finding(self) -> Finding:
        t = self.tightness()  # [L, H, P]; NaN past a layer's own heads and planes
        H = t.shape[1]
        top = t[..., 0]
        i, h = divmod(int(top.nan_to_num(nan=-math.inf).argmax()), H)
        wls = [float(self.spec.layers[L].wavelength[0]) for L in self.layers]
        # each layer's own lowest-frequency plane (layers of other widths have other counts)
        last = [self.spec.layers[L].n_planes - 1 for L in self.layers]
        lowest = torch.stack([t[j, :, p] for j, p in enumerate(last)])  # [L, H]
        n_heads = int(self.present().sum())
        vals = {
            "plane": 0,
            "wavelength": round(wls[0], 2),
            "mean": round(float(top.nanmean()), 2),
            "best_layer": self.layers[i],
            "best_head": h,
            "best": round(float(top[i, h]), 2),
            "lowest_plane": last[0] if len(set(last)) == 1 else sorted(set(last)),
            "lowest_mean": round(float(lowest.nanmean()), 2),
            "n_heads": n_heads,
        }
        wl = (
            f"{vals['wavelength']:.2f}"
            if len({round(w, 2) for w in wls}) == 1
            else f"{min(wls):.2f} to {max(wls):.2f}"
        )
        planes = (
            f"plane ({last[0]})"
            if len(set(last)) == 1
            else "plane of each layer (" + ", ".join(map(str, sorted(set(last)))) + ")"
        )
        text = (
            f"At the attended key, plane 0 (highest frequency, λ = {wl} tokens) reaches on "
            f"average {vals['mean']:.2f} of its Cauchy–Schwarz bound over {n_heads} heads (1 = q "
            f"and k aligned); tightest {head_name(vals['best_layer'], h)} at {vals['best']:.2f}. "
            f"The lowest-frequency {planes} averages {vals['lowest_mean']:.2f}."
        )
        return Finding("tightness", "band-statistics", text, vals)

    # ---------------------------------------------------------------- persistence
    def heatmap(
        self, metric: str = "margin_share", layer: int | None = None, coloraxis: str | None = None
    ) -> Any:
        """Layer × band (head-averaged) or, for one layer, head × band."""
        return figure_of(BandStatistics, "heatmap")(self, metric, layer, coloraxis)

    def figure(self, layer: int | None = None) -> Any:
        """|logit|, variance and margin shares per band: layer × band, or head × band for one
        layer."""
        return figure_of(BandStatistics)(self, layer)


@corpus_analysis()
def band_statistics(
    model,
    corpus,
    run: RunOptions,
    *,
    bands: Bands | None = None,
    agreement: bool = True,
    jsd: bool = False,
) -> BandStatistics:
    """Each band's share of the logits over a corpus: |logit|, variance, margin and agreement.

    Every logit splits exactly into one term per band of RoPE planes. Per layer × head × band it
    streams the mean |band logit|, the band's covariance with the full logit within each query, its
    contribution to the margin of the attended key (the key the model attends to most), and how
    often the band alone picks that key (top-1 agreement); per plane, how close the plane comes to
    its Cauchy–Schwarz bound at the attended key (see :class:`BandStatsReducer`). Scores are rebuilt
    in query × key tiles, so nothing of size ``[heads, n, n]`` is held.

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
        agreement (bool): Also measure each band's top-1 agreement with the model's attended key
            (default True).
        jsd (bool): Also measure the Jensen–Shannon divergence of each band-only attention pattern
            from the model's (default False; implies ``agreement``).
        batch_size (int): Windows per forward pass (default 4).
        progress (bool): Show a progress bar (default True; rank 0 only under torchrun).
        checkpoint (str | os.PathLike | None): A directory to save progress to and resume a killed
            run from (default None: none; see :mod:`ropelens.run.distributed`).
        checkpoint_every (int): Batches between checkpoints (default 8).
        verify (bool): First check that ropelens's reading of RoPE reproduces the model's own
            attention (default True); False skips the check, and the result says "unverified".

    Returns:
        BandStatistics: Sums per ``[layer, head, band]`` (and per plane), read by its methods and
        ``to_frame()``; ``findings()`` says which band dominates the margin.

    Raises:
        InputError: When ``layers`` selects no layer the model has, the corpus cannot be read, or a
            band has no plane in any chosen layer (the message names the problem and the fix).
        UnsupportedModelError: When ``verify`` finds that the RoPE reading does not reproduce the
            model's own attention.

    Examples:
        >>> from ropelens.analyses import band_statistics
        >>> from ropelens.testing import tiny_model
        >>> model = tiny_model("llama")
        >>> stats = band_statistics(model, n_ctx=32, max_tokens=128, progress=False)
        >>> stats.band_names
        ('Q1 (highest)', 'Q2', 'Q3', 'Q4 (lowest)')
        >>> sorted(set(stats.to_frame()["band"]))
        ['Q1 (highest)', 'Q2', 'Q3', 'Q4 (lowest)']
    """
    bands = bands or Bands.default()
    spec = rope_spec(model)
    chosen = spec.layer_indices(run.layers)
    bands.require_planes(
        [spec.layers[L] for L in chosen]
    )  # a band with no plane anywhere: refused before the model runs
    m = measure(
        model,
        corpus,
        lambda spec, chosen, _: BandStatsReducer(spec, chosen, bands, agreement=agreement, jsd=jsd),
        run,
        analysis="band statistics",
        config={"bands": bands.describe(), "agreement": agreement or jsd, "jsd": jsd},
        desc="band statistics",
        spec=spec,
    )
    return m.reducer.result(m.provenance)
