"""Band statistics' key scan as one Triton kernel: per (window, head, query block), one pass over
the key blocks the mask allows.

Per query it streams what :class:`~ropelens.analyses.band_statistics.BandStatsReducer`'s torch scan
carries across key tiles: the attended key (the first argmax of the soft-capped model score), each
band's term there, each band's own maximum and the keys tied at it, Σ|s_b| per band, Σ y² and Σ y·k
(y the model score, k the key: the within-query covariance sums). Each band's term comes from its
own head dims (a 0/1 membership column), so both plane pairings, partial rotary and any band split
are covered; grouped-query heads read their KV head's keys. The reducer turns these per-query
values into its statistics with the same code as its torch path.

Covered: causal and sliding-window masks, padding, soft-capping. Not covered (the torch path runs):
attention sinks, chunked attention, the JS divergence (it needs whole softmax rows).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
from torch import Tensor

try:
    import triton
    import triton.language as tl
except ImportError:  # the kernel is optional: band statistics run in torch without it
    triton = None
    tl = None

__all__ = ["KeyScan", "available", "covers", "key_scan"]

BLOCK_QUERIES = 32  # the blocks under Triton's interpreter (CPU) and where none are tuned
BLOCK_KEYS = 32
# (query block, key block, warps) tried once per shape on CUDA; the fastest is kept
TUNED_BLOCKS = (
    (16, 32, 4),
    (32, 32, 4),
    (32, 64, 4),
    (64, 32, 4),
    (64, 64, 8),
    (128, 32, 8),
)


def available(device: torch.device) -> bool:
    """Whether the kernel can run on ``device``: Triton importable and a CUDA device, or a CPU
    tensor under Triton's interpreter (``TRITON_INTERPRET=1``)."""
    if triton is None:
        return False
    if device.type == "cuda":
        return True
    return device.type == "cpu" and os.environ.get("TRITON_INTERPRET") == "1"


def covers(rope, jsd: bool) -> bool:
    """Whether the kernel computes every statistic of this layer: no sinks, no chunked attention,
    no JS divergence."""
    return not rope.sinks and not rope.chunk and not jsd


@dataclass(frozen=True)
class KeyScan:
    """Per (window, head, query), ``[batch, head, ...]``: the key scan's carried values."""

    attended_key: Tensor  # [batch, head, pos] long
    attended_band_logits: Tensor  # [batch, head, band, pos]
    band_max: Tensor  # [batch, head, band, pos]
    band_ties: Tensor  # [batch, head, band, pos]
    abs_logit_sum: Tensor  # [batch, head, band, pos]
    score_square_sum: Tensor  # [batch, head, pos]
    score_key_sum: Tensor  # [batch, head, pos, head_dim]


if triton is not None:

    @triton.jit
    def _tanh(x):
        """tanh from exp, sign-symmetric (no overflow)."""
        e = tl.exp(-2.0 * tl.abs(x))
        t = (1.0 - e) / (1.0 + e)
        return tl.where(x < 0, -t, t)

    @triton.jit
    def _key_scan_kernel(
        q_ptr,  # [batch, pos, head, head_dim] float32, scaled
        k_ptr,  # [batch, kv_head, pos, head_dim] float32
        valid_ptr,  # [batch, pos] int8
        member_ptr,  # [head_dim, band] float32
        attended_ptr,  # [batch, head, pos] int64
        attended_band_ptr,  # [batch, head, band, pos]
        band_max_ptr,
        band_ties_ptr,
        abs_sum_ptr,
        square_sum_ptr,  # [batch, head, pos]
        key_sum_ptr,  # [batch, head, pos, head_dim]
        n_positions,
        n_heads,
        n_kv_heads,
        head_dim,
        window,  # 0: none
        softcap,  # 0.0: none
        N_BANDS: tl.constexpr,
        BANDS_PAD: tl.constexpr,
        DIM_PAD: tl.constexpr,
        BLOCK_Q: tl.constexpr,
        BLOCK_K: tl.constexpr,
    ):
        batch_head = tl.program_id(0)
        query_block = tl.program_id(1)
        b = batch_head // n_heads
        h = batch_head % n_heads
        kv_h = h // (n_heads // n_kv_heads)
        q_start = query_block * BLOCK_Q
        q_pos = q_start + tl.arange(0, BLOCK_Q)
        dims = tl.arange(0, DIM_PAD)
        band_cols = tl.arange(0, BANDS_PAD)
        q_in = q_pos < n_positions
        dim_in = dims < head_dim
        q = tl.load(
            q_ptr + ((b * n_positions + q_pos[:, None]) * n_heads + h) * head_dim + dims[None, :],
            mask=q_in[:, None] & dim_in[None, :],
            other=0.0,
        )
        best = tl.full((BLOCK_Q,), float("-inf"), tl.float32)
        attended = tl.zeros((BLOCK_Q,), tl.int32)
        attended_bands = tl.zeros((BLOCK_Q, BANDS_PAD), tl.float32)
        band_max = tl.full((BLOCK_Q, BANDS_PAD), float("-inf"), tl.float32)
        band_ties = tl.zeros((BLOCK_Q, BANDS_PAD), tl.float32)
        abs_sum = tl.zeros((BLOCK_Q, BANDS_PAD), tl.float32)
        square_sum = tl.zeros((BLOCK_Q,), tl.float32)
        key_sum = tl.zeros((BLOCK_Q, DIM_PAD), tl.float32)
        first_key = q_start * 0  # one integer type in both branches, as compiled Triton needs
        if window > 0:
            first_key = tl.maximum(q_start - window + 1, 0)
        first_key = (first_key // BLOCK_K) * BLOCK_K
        last_key = tl.minimum(q_start + BLOCK_Q, n_positions)
        for key_start in range(first_key, last_key, BLOCK_K):
            k_pos = key_start + tl.arange(0, BLOCK_K)
            k_in = k_pos < n_positions
            k = tl.load(
                k_ptr
                + ((b * n_kv_heads + kv_h) * n_positions + k_pos[:, None]) * head_dim
                + dims[None, :],
                mask=k_in[:, None] & dim_in[None, :],
                other=0.0,
            )
            k_valid = tl.load(valid_ptr + b * n_positions + k_pos, mask=k_in, other=0) != 0
            allowed = (k_pos[None, :] <= q_pos[:, None]) & k_valid[None, :] & q_in[:, None]
            if window > 0:
                allowed = allowed & ((q_pos[:, None] - k_pos[None, :]) < window)
            # the model's score as the sum of its band terms
            score = tl.zeros((BLOCK_Q, BLOCK_K), tl.float32)
            for band in tl.static_range(N_BANDS):
                member = tl.load(member_ptr + dims * N_BANDS + band, mask=dim_in, other=0.0)
                score += tl.dot(q * member[None, :], tl.trans(k), input_precision="ieee")
            score = tl.where(allowed, score, 0.0)
            square_sum += tl.sum(score * score, axis=1)
            key_sum += tl.dot(score, k, input_precision="ieee")
            capped = score
            if softcap > 0:
                capped = _tanh(score / softcap)
            capped = tl.where(allowed, capped, float("-inf"))
            block_top = tl.max(capped, axis=1)
            # the first key at the block's maximum, as torch's argmax picks it
            at_top = (capped == block_top[:, None]) & allowed
            block_arg = tl.min(tl.where(at_top, k_pos[None, :], 2147483647), axis=1)
            better = block_top > best  # strict: ties keep the earlier key
            best = tl.where(better, block_top, best)
            attended = tl.where(better, block_arg, attended)
            for band in tl.static_range(N_BANDS):
                member = tl.load(member_ptr + dims * N_BANDS + band, mask=dim_in, other=0.0)
                band_logit = tl.dot(q * member[None, :], tl.trans(k), input_precision="ieee")
                column = band_cols[None, :] == band
                abs_sum += tl.where(
                    column, tl.sum(tl.where(allowed, tl.abs(band_logit), 0.0), axis=1)[:, None], 0.0
                )
                at_arg = k_pos[None, :] == block_arg[:, None]
                arg_logit = tl.sum(tl.where(at_arg, band_logit, 0.0), axis=1)
                attended_bands = tl.where(
                    column & better[:, None], arg_logit[:, None], attended_bands
                )
                masked = tl.where(allowed, band_logit, float("-inf"))
                tile_max = tl.max(masked, axis=1)
                tile_ties = tl.sum(((masked == tile_max[:, None]) & allowed).to(tl.float32), axis=1)
                old_max = tl.max(tl.where(column, band_max, float("-inf")), axis=1)
                old_ties = tl.sum(tl.where(column, band_ties, 0.0), axis=1)
                new_ties = tl.where(
                    tile_max > old_max,
                    tile_ties,
                    tl.where(tile_max == old_max, old_ties + tile_ties, old_ties),
                )
                band_ties = tl.where(column, new_ties[:, None], band_ties)
                band_max = tl.where(column, tl.maximum(old_max, tile_max)[:, None], band_max)
        row = batch_head * n_positions + q_pos
        tl.store(attended_ptr + row, attended.to(tl.int64), mask=q_in)
        tl.store(square_sum_ptr + row, square_sum, mask=q_in)
        tl.store(
            key_sum_ptr + row[:, None] * head_dim + dims[None, :],
            key_sum,
            mask=q_in[:, None] & dim_in[None, :],
        )
        band_offsets = (batch_head * N_BANDS + band_cols[None, :]) * n_positions + q_pos[:, None]
        band_in = q_in[:, None] & (band_cols[None, :] < N_BANDS)
        tl.store(attended_band_ptr + band_offsets, attended_bands, mask=band_in)
        tl.store(band_max_ptr + band_offsets, band_max, mask=band_in)
        tl.store(band_ties_ptr + band_offsets, band_ties, mask=band_in)
        tl.store(abs_sum_ptr + band_offsets, abs_sum, mask=band_in)

    # every output is stored whole by each launch, so the tuner's repeated launches are harmless
    _tuned_key_scan_kernel = triton.autotune(
        configs=[
            triton.Config({"BLOCK_Q": q, "BLOCK_K": k}, num_warps=w) for q, k, w in TUNED_BLOCKS
        ],
        key=["n_positions", "head_dim", "window", "N_BANDS"],
    )(_key_scan_kernel)


def key_scan(
    queries: Tensor,
    keys: Tensor,
    valid: Tensor,
    membership: Tensor,
    *,
    window: int | None,
    softcap: float | None,
    blocks: tuple[int, int] | None = None,
) -> KeyScan:
    """Run the kernel: on CUDA with the blocks of :data:`TUNED_BLOCKS` fastest for the shape
    (tried once per shape, every output rewritten whole each try), under the interpreter with
    32 × 32 blocks; ``blocks`` (query block, key block; powers of two ≥ 16) fixes them.

    Args:
        queries: ``[batch, pos, head, head_dim]`` float32, already multiplied by the score scale.
        keys: ``[batch, kv_head, pos, head_dim]`` float32.
        valid: ``[batch, pos]`` bool: keys that may be attended to.
        membership: ``[head_dim, band]`` 0/1: the head dims of each band.
        window: sliding window (a query at m sees keys n with m − window < n ≤ m), or None.
        softcap: soft-capping c (the argmax is taken on c·tanh(s/c)), or None.
        blocks: (query block, key block), or None.
    """
    if triton is None:
        raise RuntimeError("the band statistics kernel needs Triton: pip install 'ropelens[gpu]'")
    if blocks is not None and not all(b >= 16 and b & (b - 1) == 0 for b in blocks):
        raise ValueError(f"blocks must be powers of two of at least 16, got {blocks}")
    batch, n_positions, n_heads, head_dim = queries.shape
    n_kv_heads = keys.shape[1]
    n_bands = membership.shape[1]
    like = queries
    outputs = KeyScan(
        attended_key=torch.zeros(batch, n_heads, n_positions, dtype=torch.long, device=like.device),
        attended_band_logits=like.new_zeros(batch, n_heads, n_bands, n_positions),
        band_max=like.new_zeros(batch, n_heads, n_bands, n_positions),
        band_ties=like.new_zeros(batch, n_heads, n_bands, n_positions),
        abs_logit_sum=like.new_zeros(batch, n_heads, n_bands, n_positions),
        score_square_sum=like.new_zeros(batch, n_heads, n_positions),
        score_key_sum=like.new_zeros(batch, n_heads, n_positions, head_dim),
    )
    tuned = blocks is None and queries.device.type == "cuda"
    kernel = _tuned_key_scan_kernel if tuned else _key_scan_kernel
    block_q, block_k = blocks or (BLOCK_QUERIES, BLOCK_KEYS)
    fixed = {} if tuned else {"BLOCK_Q": block_q, "BLOCK_K": block_k}

    def grid(meta):
        return (batch * n_heads, triton.cdiv(n_positions, meta["BLOCK_Q"]))

    kernel[grid](
        queries.contiguous(),
        keys.contiguous(),
        valid.to(torch.int8).contiguous(),
        membership.float().contiguous(),
        outputs.attended_key,
        outputs.attended_band_logits,
        outputs.band_max,
        outputs.band_ties,
        outputs.abs_logit_sum,
        outputs.score_square_sum,
        outputs.score_key_sum,
        n_positions,
        n_heads,
        n_kv_heads,
        head_dim,
        window or 0,
        float(softcap or 0.0),
        N_BANDS=n_bands,
        BANDS_PAD=max(2, triton.next_power_of_2(n_bands)),
        DIM_PAD=max(16, triton.next_power_of_2(head_dim)),
        **fixed,
    )
    return outputs
