"""Band statistics over a corpus: each band's share of the logits, their variance and the attended-key margin,
from q and k in query × key tiles (the model's scores rebuilt per tile as the sum of the band terms)."""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import pandas as pd
import torch
from jaxtyping import Bool, Float
from torch import Tensor

from ropelens.analyses.attention_decomposition import js_divergence
from ropelens.errors import InputError
from ropelens.results.figures import figure_of
from ropelens.results.findings import Finding, band_winners, head_name
from ropelens.results.provenance import Provenance
from ropelens.results.result import Result
from ropelens.run.capture import DeviceSums, LayerActs, query_tile, sum_dtype
from ropelens.run.measure import RunOptions, corpus_analysis, measure
from ropelens.spec.bands import Bands, ResolvedBands
from ropelens.spec.rope import LayerRope, RopeSpec

__all__ = ["BandStatistics", "BandStatsReducer", "band_statistics"]

_SUMS_LHB = ("abs_sum", "cov", "margin", "jsd", "top1")
MARGIN_MAJORITY = 0.5  # "most of its margin", in findings: more than half
MAX_LISTED = 5  # heads a finding names at most
# keys every query of a tile sees, from which Σ y² and Σ y·k come from a running Σ k kᵀ (d² per query)
# rather than from the scores: below this the scores are cheaper (measured on the CPU)
GRAM_MIN_KEYS = 512
KEY_TILE = {
    "cpu": 512
}  # keys per tile: rows longer than this are carried across key tiles (online argmax)
KEY_TILE_ACCELERATOR = 8192


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

    static_mask = "band statistics"  # masks built from positions: refused where the model picks keys from the input
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
    ) -> None:
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
        """The running sums on the CPU: layers of different widths padded to the widest, NaN past their own
        heads and planes (:meth:`RopeSpec.padded_zeros`)."""
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
        """``[band, d_band]`` head-dim indices, bands padded to one width with index ``head_dim`` (a zero column)."""

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
        """(queries, keys) per tile: key tiles of at most KEY_TILE keys, query tiles filling the element budget."""
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
        i, rope, rb = self.pos[acts.layer], acts.rope, self.resolved[acts.layer]
        valid = acts.valid
        q_post, k_post = acts["q_post"], acts["k_post"]
        dev = q_post.device
        s = self._on(dev)
        b, n, H, d = q_post.shape
        KV, G, B = rope.n_kv_heads, rope.group_size, rb.n_bands
        vf = valid.float()
        # the score scale goes into q once, so every product below is already a logit; padded
        # queries and keys are zero vectors
        q = q_post.float() * (vf[:, :, None, None] * rope.score_scale)
        k = k_post.float() * vf[:, :, None, None]
        idx = self._band_index(acts.layer, rb, d, dev)
        if (
            len({len(dims) for dims in rb.dims}) > 1
        ):  # bands of different widths: padded with a zero column
            q_, k_ = (
                torch.cat([q, q.new_zeros(b, n, H, 1)], -1),
                torch.cat([k, k.new_zeros(b, n, KV, 1)], -1),
            )
        else:
            q_, k_ = q, k
        qb = q_[..., idx].view(b, n, KV, G, B, -1).permute(0, 2, 4, 3, 1, 5)  # [b,KV,B,G,n,db]
        kb = k_[..., idx].permute(0, 2, 3, 1, 4).contiguous()  # [b,KV,B,n,db]
        qh = q.view(b, n, KV, G, d).permute(0, 2, 3, 1, 4)  # [b,KV,G,n,d]
        kh = k.transpose(1, 2).contiguous()  # [b,KV,n,d]
        # Σ of the keys each query may attend to (prefix sums in float64: long windows cancel exactly)
        wide = sum_dtype(dev)
        kd = kh.to(wide)
        ksum = _window_sums(kd, rope).float()  # [b,KV,n,d]
        general = self._has_padding(valid, acts.padded)
        pos = torch.arange(n, device=dev)
        allowed = (
            pos + 1 if not rope.window else (pos + 1).clamp(max=rope.window)
        )  # keys per (unpadded) query
        if general:  # padding anywhere: count only the valid keys each query sees
            cv = valid.long().cumsum(1)
            lo = (pos - rope.window).clamp(min=-1) if rope.window else pos.new_full((n,), -1)
            before = torch.where(lo >= 0, cv.gather(1, lo.clamp(min=0)[None].expand(b, -1)), 0)
            rows = ((cv - before) * valid).float()  # [b, n]
        else:
            rows = allowed.float()[None].expand(b, n)
        ok = (rows >= 2).float()
        seen = (rows >= 1).float()
        here = s["var"].device
        s["n_entries"][i] += rows.sum().to(here)
        s["n_rows"][i] += ok.sum().to(here)
        s["n_queries"][i] += seen.sum().to(here)
        tq, tk = self._tiles(dev, b * H * B, n, rope.window)
        # each tile's terms are summed over its queries per window in float32 and added over windows and
        # tiles in float64 (the sums' dtype): a window's terms do not depend on the batch it came in
        acc = {
            k_: q.new_zeros(KV, B, G, dtype=wide) for k_ in ("abs", "cov", "margin", "top1", "jsd")
        }
        acc_var = q.new_zeros(KV, G, dtype=wide)
        acc_cs = {k_: q.new_zeros(KV, G, rope.n_planes, dtype=wide) for k_ in ("term", "bound")}

        def per_window(t, dim):
            return t.sum(dim).to(wide).sum(0)

        member = self._cached(
            (acts.layer, "member", dev), lambda: rb.dim_membership().to(dev)
        )  # [d, B]
        ninf = float("-inf")
        # Σ_k y² and Σ_k y·k over the keys every query of a tile attends to come from Σ k kᵀ over them
        # (y = q·k), carried from tile to tile in float64; only the tile's edge columns need the scores
        gram = _RunningGram(kd)
        member_w = self._cached((acts.layer, "member_wide", dev), lambda: member.to(wide))
        for c0 in range(0, n, tq):
            c1 = min(n, c0 + tq)
            c = c1 - c0
            k0 = max(0, c0 - rope.window + 1) if rope.window else 0
            full = (
                max(0, c1 - rope.window) if rope.window else 0,
                c0 + 1,
            )  # keys every query of the tile sees
            if (
                full[1] - full[0] < GRAM_MIN_KEYS
            ):  # few: cheaper as scores than as products with Σ k kᵀ
                full = (0, 0)
            qt = qh[:, :, :, c0:c1]  # [b,KV,G,c,d]
            qbt = qb[..., c0:c1, :].reshape(b, KV, B, G * c, -1)
            # per query, carried across key tiles (online, as FlashAttention carries its row max)
            best = q.new_full((b, KV, G, c), ninf)  # the attended key's score (soft-capped)
            att = torch.zeros(b, KV, G, c, dtype=torch.long, device=dev)
            xa = q.new_zeros(b, KV, B, G, c)  # band logits at the attended key
            bmax = q.new_full((b, KV, B, G, c), ninf)  # each band's own maximum
            absr = q.new_zeros(b, KV, B, G, c)
            ysq = q.new_zeros(b, KV, G, c)  # Σ y² over the edge columns
            yk = q.new_zeros(b, KV, G * c, d)  # Σ y·k over the edge columns
            step = (c1 - k0) if self.jsd else tk  # the JS divergence needs whole rows
            for j0 in range(k0, c1, step):
                j1 = min(c1, j0 + step)
                kt = j1 - j0
                x = torch.matmul(qbt, kb[..., j0:j1, :].transpose(-1, -2)).view(b, KV, B, G, c, kt)
                spans = self._spans(rope, valid if general else None, c0, c1, j0, j1, dev)
                for lo, hi, mx, _ in spans:
                    x[..., lo:hi].masked_fill_(mx, ninf)
                y = x.sum(2)  # [b,KV,G,c,kt]: the model's scores (masked entries −inf)
                if rope.softcap:  # the argmax of the model's pattern is taken after soft-capping
                    sc = torch.tanh(y / rope.softcap)
                    for lo, hi, _, my in spans:
                        sc[..., lo:hi].masked_fill_(my, ninf)
                else:
                    sc = y
                arg = sc.argmax(-1, keepdim=True)
                top = sc.gather(-1, arg)[..., 0]
                better = top > best  # strict: ties keep the earlier key, as argmax does
                best = torch.where(better, top, best)
                att = torch.where(better, arg[..., 0] + j0, att)
                del sc
                xat = x.gather(-1, arg[:, :, None].expand(-1, -1, B, -1, -1, -1))[..., 0]
                xa = torch.where(better[:, :, None], xat, xa)
                if self.agreement:
                    bmax = torch.maximum(bmax, x.amax(-1))
                if self.jsd:
                    pat = rope.probs(
                        y.reshape(b, H, c, kt)
                    )  # the model's own pattern, rebuilt from its scores
                    for j in range(B):
                        pb = rope.probs(x[:, :, j].reshape(b, H, c, kt))
                        acc["jsd"][:, j] += per_window(
                            js_divergence(pb, pat) * seen[:, None, c0:c1], 2
                        ).view(KV, G)
                for lo, hi, _, my in spans:
                    y[..., lo:hi].masked_fill_(my, 0.0)
                for lo, hi in _outside(j0, j1, *full):
                    ye = y[..., lo:hi]
                    ysq += (ye * ye).sum(-1)
                    yk += torch.matmul(
                        ye.reshape(b, KV, G * c, hi - lo), kh[:, :, j0 + lo : j0 + hi]
                    )
                del y
                x.abs_()
                for lo, hi, mx, _ in spans:
                    x[..., lo:hi].masked_fill_(mx, 0.0)
                absr += x.sum(-1)
                del x
            rq, okq, seenq = rows[:, c0:c1], ok[:, c0:c1], seen[:, c0:c1]  # [b,c]
            w4 = okq[:, None, None, None].bool()
            acc["abs"] += per_window(absr, 4)
            if self.agreement:  # band-only top-1: the attended key attains the band's own maximum
                acc["top1"] += (
                    ((xa >= bmax) & seenq[:, None, None, None].bool()).sum((0, 4)).to(wide)
                )
            # keys seen by the whole tile: Σ_k y·k_j = (Σ_k k kᵀ) q, so Σ_k x_b·y and Σ_k y² are products with q
            if full[1] > full[0]:
                qg = qt.to(wide)
                qgq = qg * torch.matmul(qg, gram.over(*full)[:, :, None])  # [b,KV,G,c,d]
                ysq = ysq + qgq.sum(-1)
                crossg = torch.matmul(qgq, member_w)
            else:
                crossg = 0.0
            # Σ_k x_b = q_b · Σ_k k_b; Σ_k x_b·y = q_b · (Σ_k y k_b): per-dim products summed into bands
            row_b = torch.matmul(qt * ksum[:, :, None, c0:c1], member).permute(
                0, 1, 4, 2, 3
            )  # [b,KV,B,G,c]
            cross = (torch.matmul(qt * yk.view(b, KV, G, c, d), member) + crossg).permute(
                0, 1, 4, 2, 3
            )
            ysum = row_b.sum(2)  # [b,KV,G,c]
            acc_var += per_window(
                torch.where(
                    okq[:, None, None].bool(), ysq - ysum**2 / rq.clamp_min(1)[:, None, None], 0
                ),
                3,
            )
            acc["cov"] += per_window(
                torch.where(
                    w4, cross - row_b * ysum[:, :, None] / rq.clamp_min(1)[:, None, None, None], 0
                ),
                4,
            )
            acc["margin"] += per_window(
                torch.where(w4, xa - (row_b - xa) / (rq - 1).clamp_min(1)[:, None, None, None], 0),
                4,
            )
            ka = kh.gather(2, att.view(b, KV, G * c, 1).expand(-1, -1, -1, d)).view(b, KV, G, c, d)
            w = okq[:, None, None, :, None].bool()  # per plane, [b,KV,G,c,P]
            acc_cs["term"] += per_window(torch.where(w, rope.plane_sums(qt * ka), 0), 3)
            acc_cs["bound"] += per_window(
                torch.where(w, rope.plane_norms(qt) * rope.plane_norms(ka), 0), 3
            )

        def to_hb(t):
            return t.permute(0, 2, 1).reshape(H, B).to(here, torch.float64)

        P = rope.n_planes  # a layer narrower than the widest adds into its leading heads and planes
        s["abs_sum"][i, :H] += to_hb(acc["abs"])
        s["cov"][i, :H] += to_hb(acc["cov"])
        s["margin"][i, :H] += to_hb(acc["margin"])
        s["top1"][i, :H] += to_hb(acc["top1"])
        s["jsd"][i, :H] += to_hb(acc["jsd"])
        s["var"][i, :H] += acc_var.reshape(H).to(here, torch.float64)
        s["cs_term"][i, :H, :P] += acc_cs["term"].reshape(H, -1).to(here, torch.float64)
        s["cs_bound"][i, :H, :P] += acc_cs["bound"].reshape(H, -1).to(here, torch.float64)

    def result(self, provenance: Provenance) -> BandStatistics:
        """The streamed sums as :class:`BandStatistics` (on the CPU, float64)."""
        sums = {k: v.detach().to("cpu", torch.float64) for k, v in self.sums.items()}
        return BandStatistics(
            tuple(self.layers), self.names, self.bands, self.spec, sums, provenance
        )


def _rounded(x: float) -> float | None:
    """A band-only agreement as findings keep it: two decimals, None where not measurable (NaN: no plane there)."""
    return None if x != x else round(x, 2)


def _agreement_text(x: float | None) -> str:
    """A band-only agreement as findings quote it: two decimals, or "not measurable" (the band has no plane there)."""
    return "not measurable" if x is None or x != x else f"{x:.2f}"


def _window_sums(k: Float[Tensor, "b h pos d"], rope: LayerRope) -> Float[Tensor, "b h pos d"]:
    """Σ of keys each query may attend to: a prefix sum, minus the part before a sliding window."""
    csum = k.cumsum(2)
    if rope.window and rope.window < k.shape[2]:
        csum[:, :, rope.window :] -= csum[:, :, : -rope.window].clone()
    return csum


class _RunningGram:
    """Σ k kᵀ over any key range ``[lo, hi)`` whose ends only move forward: two running prefix sums."""

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
    """Column ranges (relative to ``j0``) of keys ``[j0, j1)`` outside ``[lo, hi)``: disjoint, in order."""
    if hi <= lo:
        return [(0, j1 - j0)]
    out = [(0, min(j1, lo) - j0)] if lo > j0 else []
    if j1 > hi:
        out.append((max(j0, hi) - j0, j1 - j0))
    return [(a, z) for a, z in out if z > a]


def _masked_spans_of(
    c0: int, c1: int, j0: int, j1: int, window: int | None
) -> list[tuple[int, int]]:
    """Column ranges (relative to key ``j0``) of the tile queries ``[c0, c1)`` × keys ``[j0, j1)`` that
    hold masked entries: keys after the tile's first query (causal) and, with a sliding window,
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

    Layers of different widths (Gemma 4's wider global heads) share one ``[layer, head, ...]`` array: each
    fills its leading heads and planes, and every number past them reads NaN (:meth:`present` marks a
    layer's own heads); tables leave those rows out, and findings skip them.
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
        """Share of within-query logit variance: Cov(band, logit)/Var(logit); sums to 1 (may be <0)."""
        return (self.sums["cov"] / self.sums["var"][..., None].clamp_min(1e-30)).float()

    def margin(self) -> Float[Tensor, "layer head band"]:
        """Mean contribution to the margin: logit at the attended key minus the mean over other keys."""
        return (self.sums["margin"] / self.sums["n_rows"][:, None, None].clamp_min(1)).float()

    def margin_share(self) -> Float[Tensor, "layer head band"]:
        """Each band's fraction of the total attended-key margin (sums to 1; may be <0)."""
        m = self.sums["margin"]
        return (m / m.sum(-1, keepdim=True)).float()

    def measurable(self) -> Bool[Tensor, "layer band"]:
        """Whether each band holds a dimension in each layer. A band with none there has no logits of its own (all 0),
        so what it does alone (:meth:`top1`, :meth:`jsd`) is not measurable in that layer and reads NaN."""
        rows = [
            [len(d) > 0 for d in self.bands.resolve(self.spec.layers[L]).dims] for L in self.layers
        ]
        return torch.tensor(rows, dtype=torch.bool).reshape(len(self.layers), len(self.band_names))

    def _band_only(self, key: str) -> Float[Tensor, "layer head band"]:
        x = (self.sums[key] / self.sums["n_queries"][:, None, None].clamp_min(1)).float()
        return torch.where(self.measurable()[:, None, :], x, torch.nan)

    def top1(self) -> Float[Tensor, "layer head band"]:
        """Fraction of queries whose band-only argmax is the key the model attends to most (NaN where the band holds
        no plane in the layer: its all-zero logits would tie every key, not agree)."""
        if not self.provenance.config.get("agreement", True):
            raise InputError(
                "band-only agreement was not streamed: run band_statistics(..., agreement=True)"
            )
        return self._band_only("top1")

    def jsd(self) -> Float[Tensor, "layer head band"]:
        """Mean JS divergence (nats) of the band-only pattern from the model's (needs jsd=True; NaN where the band
        holds no plane in the layer)."""
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
        """Heads taking most of their margin from the highest-frequency band, the band whose logits alone
        most often pick the attended key (both with two bands or more), and plane 0's tightness."""
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
        vals = {"band": band, "n_heads": n_heads, "n_majority": len(major), "heads": heads}
        if major:
            verb, their = ("gets", "its") if len(major) == 1 else ("get", "their")
            text = (
                f"{len(major)} of {n_heads} heads {verb} more than half of {their} attended-key margin from band "
                f"{band}: {shown}."
            )
        else:
            top = heads[0]
            text = (
                f"No head gets more than half of its attended-key margin from band {band}; the largest share is "
                f"{top['margin_share']:.2f} ({head_name(top['layer'], top['head'])}, band-only top-1 "
                f"{_agreement_text(top['top1'])})."
            )
        return Finding("margin", "band-statistics", text, vals)

    def _top1_finding(self) -> Finding | None:
        if len(self.band_names) < 2:
            return None
        top1 = self.top1()  # [L, H, B]; NaN where a band holds no plane in the layer
        # an empty band never leads; heads a layer lacks (layers of other widths) are NaN and left out
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
            f"Alone, band {band} most often picks the key the model attends to most: it leads in {n} of "
            f"{len(self.layers)} layers, with top-1 agreement {vals['mean_top1']:.2f} over all heads"
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
            f"At the attended key, plane 0 (highest frequency, λ = {wl} tokens) reaches on average "
            f"{vals['mean']:.2f} of its Cauchy–Schwarz bound over {n_heads} heads (1 = q and k aligned); tightest "
            f"{head_name(vals['best_layer'], h)} at {vals['best']:.2f}. The lowest-frequency {planes} "
            f"averages {vals['lowest_mean']:.2f}."
        )
        return Finding("tightness", "band-statistics", text, vals)

    # ---------------------------------------------------------------- persistence
    def heatmap(
        self, metric: str = "margin_share", layer: int | None = None, coloraxis: str | None = None
    ) -> Any:
        """Layer × band (head-averaged) or, for one layer, head × band."""
        return figure_of(BandStatistics, "heatmap")(self, metric, layer, coloraxis)

    def figure(self, layer: int | None = None) -> Any:
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
    """Stream the band decomposition over a corpus (see :class:`BandStatsReducer`).

    Inside a ``torch.distributed`` process group each rank takes a share of the windows and every
    rank returns the whole corpus's statistics; ``checkpoint`` (a directory) saves progress to
    resume a killed run (see :mod:`ropelens.run.distributed`).
    """
    from ropelens.spec.reading import rope_spec

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
