"""Attention by query–key distance, band by band (HoPE, Chen et al. ACL 2025).

HoPE reports that attention decays locally but is U-shaped globally, and that the rise at long
distances comes from the low-frequency components. :class:`DistanceReducer` measures it on a
corpus: per layer × head × band and per bin of the distance δ = m − n between a query at m and a
key at n, the mean band logit (the band's exact share of the score, as in
:mod:`ropelens.analyses.attention_decomposition`), the mean full logit and the mean attention probability of the model's
own pattern. :func:`describe_curve` says what shape a curve has (monotone, flat, U-shaped, peaked,
oscillating) with the numbers it rests on, and :meth:`AttentionByDistance.u_shape_cause` which band
makes the full logit rise again.

Bins are log-spaced: bin 0 is δ = 0 exactly, then δ = 1, 2–3, 4–7, … (octaves) or a finer log grid.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd
import torch
from jaxtyping import Bool, Float, Int
from torch import Tensor

from ropelens.errors import InputError
from ropelens.results.curves import MARGIN, CurveShape, at_distance, describe_curve
from ropelens.results.figures import figure_of
from ropelens.results.findings import Finding
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

    Keys at positions below ``n_sink`` (BOS, where attention sinks sit; see :mod:`ropelens.analyses.attention_sinks`)
    take part in every softmax but are left out of the by-distance averages: otherwise the sink,
    always the farthest key, dominates the longest distances. Pass ``n_sink=0`` to keep them.
    """

    static_mask = "attention by distance"  # masks built from positions: refused where the model picks keys from the input
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
        # layers of different widths padded to the most heads: NaN past a layer's own (RopeSpec.padded_zeros)
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
        """``[n, bins]`` prefix-sum indices (start, stop): query m's keys in bin j are start ≤ t < stop."""

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
        i, rope, rb = self.pos[acts.layer], acts.rope, self.resolved[acts.layer]
        valid = acts.valid
        q_post, k_post = acts["q_post"], acts["k_post"]
        dev = q_post.device
        s = self._on(dev)
        here, sdt, dt = s["count"].device, s["count"].dtype, sum_dtype(dev)
        b, n, H, d = q_post.shape
        reach = n - 1 if not rope.window else min(n, rope.window) - 1
        if reach > self.max_distance:
            raise InputError(
                f"layer {acts.layer} sees distances up to {reach}, but the bins end at "
                f"{self.max_distance}: build the reducer with max_distance ≥ {reach} (n_ctx − 1)"
            )
        KV, G = rope.n_kv_heads, rope.group_size
        nb = len(self.edges) - 1
        vf = valid.float()
        # the score scale goes into q once, so every product below is a logit; padded positions are zero vectors
        q = q_post.float() * (vf[:, :, None, None] * rope.score_scale)
        k = k_post.float() * vf[:, :, None, None]
        member = self._cached(
            (acts.layer, "member", str(dev)), lambda: rb.dim_membership().to(dev, dt)
        )
        s["n_queries"][i] += vf.sum().to(here, sdt)

        # band sums by prefix sums: keys below n_sink and padded keys count as zero vectors
        binned = vf.to(dt)
        binned[:, : self.n_sink] = 0
        kz = k.to(dt) * binned[:, :, None, None]

        def prefix(t):
            return torch.cat([torch.zeros_like(t[:, :1]), t.cumsum(1)], 1)

        pos = torch.arange(n, device=dev, dtype=dt)
        ksum, csum, jsum = (
            prefix(kz),
            prefix(binned),
            prefix(binned * pos),
        )  # Σ k, count and Σ j over binned keys
        start, stop = self._runs(n, rope.window, dev)
        cnt = (csum[:, stop] - csum[:, start]) * vf[:, :, None].to(dt)  # [b,n,nb]
        s["count"][i] += cnt.sum((0, 1)).to(here, sdt)
        jtot = (jsum[:, stop] - jsum[:, start]) * vf[:, :, None].to(dt)
        s["dist_sum"][i] += (cnt * pos[None, :, None] - jtot).sum((0, 1)).to(here, sdt)
        qg = q.view(b, n, KV, G, d)
        acc = torch.zeros(nb, KV, G, member.shape[1], dtype=dt, device=dev)
        tq = self.tile or query_tile(dev, b * nb * H * d)
        for c0 in range(0, n, tq):
            c1 = min(n, c0 + tq)
            run = (
                ksum[:, stop[c0:c1]] - ksum[:, start[c0:c1]]
            )  # [b,c,nb,KV,d]: Σ of each bin's keys
            # in float64: a bin's key sum is large and its product with q cancels, so float32 would
            # leave an error of eps32·|q||Σk| on a small mean
            acc += torch.matmul(qg[:, c0:c1, None].to(dt) * run[:, :, :, :, None], member).sum(
                (0, 1)
            )  # [nb,KV,G,B]
        s["band_sum"][i, :H] += acc.permute(1, 2, 3, 0).reshape(H, -1, nb).to(here, sdt)

        # probabilities: query tiles holding whole rows, the pattern rebuilt, summed into bins
        qh = q.view(b, n, KV, G, d).permute(0, 2, 3, 1, 4)  # [b,KV,G,n,d]
        kh = k.permute(0, 2, 3, 1)  # [b,KV,d,n]
        bin_of = self._cached(
            ("bin_of", str(dev)),
            lambda: (
                torch.bucketize(torch.arange(self.max_distance + 1), self.edges, right=True) - 1
            ).to(dev),
        )
        tq = self.tile or query_tile(dev, b * H * 2 * min(n, rope.window or n))
        prob = torch.zeros(KV, G, nb, dtype=dt, device=dev)
        ipos = torch.arange(n, device=dev)
        for c0 in range(0, n, tq):
            c1 = min(n, c0 + tq)
            c = c1 - c0
            k0 = max(0, c0 - rope.window + 1) if rope.window else 0
            kt = c1 - k0
            delta = ipos[c0:c1, None] - ipos[None, k0:c1]  # [c, kt]
            allowed = delta >= 0
            if rope.window:
                allowed &= delta < rope.window
            ok = allowed[None] & valid[:, c0:c1, None] & valid[:, None, k0:c1]  # [b,c,kt]
            y = torch.matmul(qh[:, :, :, c0:c1].reshape(b, KV, G * c, d), kh[..., k0:c1]).view(
                b, H, c, kt
            )
            p = rope.probs(
                y.masked_fill(~ok[:, None], float("-inf"))
            )  # 0 on masked entries and padded rows
            del y
            keep = (allowed & (ipos[None, k0:c1] >= self.n_sink)).to(p.dtype).reshape(-1, 1)
            oh = torch.nn.functional.one_hot(
                bin_of[delta.clamp(0, self.max_distance)].reshape(-1), nb
            ).to(p.dtype)
            prob += torch.matmul(p.reshape(b, KV, G, c * kt), oh * keep).to(dt).sum(0)
            del p
        s["prob_sum"][i, :H] += prob.reshape(H, nb).to(here, sdt)

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
    Result, merge_same=("layers", "band_names", "edges", "n_sink", "spec"), merge_sums=("sums",)
):
    """Mean band logit, full logit and attention probability per layer × head × distance bin.

    ``edges`` are the bin edges (bin j: ``edges[j] ≤ δ < edges[j + 1]``); bins a layer never sees
    (beyond its sliding window) have count 0 and NaN means. Layers of different widths (Gemma 4) share one
    array padded to the most heads: the curves of a head a layer lacks are NaN (:meth:`present`), head
    averages and tables leave them out.
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
        return len(self.edges) - 1

    @property
    def centres(self) -> Float[Tensor, " n_bins"]:
        """A representative distance per bin (geometric middle; δ itself for one-distance bins)."""
        return bin_centres(self.edges)

    def bin_labels(self) -> list[str]:
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
        """Mean full logit (the sum of the bands: the score before any soft-cap) per distance bin."""
        return self.sums["band_sum"].sum(2) / self._n()[:, None]

    def prob(self) -> Float[Tensor, "layer head bin"]:
        """Mean attention probability of the model's pattern per distance bin."""
        return self.sums["prob_sum"] / self._n()[:, None]

    def mass(self) -> Float[Tensor, "layer head bin"]:
        """Mean attention mass per query that falls in each bin (keys below ``n_sink`` not counted)."""
        return self.sums["prob_sum"] / self.sums["n_queries"].clamp_min(1)[:, None, None]

    def _band(self, name: str) -> int:
        if name not in self.band_names:
            raise InputError(
                f"unknown curve {name!r}: choose a band {list(self.band_names)}, 'logit' or 'prob'"
            )
        return self.band_names.index(name)

    def layer_index(self, layer: int) -> int:
        """Where ``layer`` sits among the measured layers (an error naming them when it was not measured)."""
        if layer not in self.layers:
            raise InputError(
                f"layer {layer} was not measured; measured layers: {list(self.layers)}"
            )
        return self.layers.index(layer)

    def curve(
        self, layer: int, curve: str = "logit", head: int | None = None
    ) -> Float[Tensor, " bin"]:
        """One curve over the bins: a band's mean logit, "logit" or "prob"; heads averaged unless ``head``."""
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
        """:func:`describe_curve` of one curve over the bins' centres. Logit curves share one scale per
        layer (the largest |mean logit| of the full logit and every band), so a band whose curve moves
        by little against the others is called flat; probabilities are read on a log scale."""
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
        """One row per layer (× head with ``heads``) × curve (each band, "logit", "prob"): the shape,
        its sentence, and for a U-shaped full logit the band that causes the rise."""
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
        """Sentences for the report: first the shapes of the full logit over all layers and the bands
        that cause the U-shapes, then per layer its full-logit shape, its cause when U-shaped, and the
        attention probability's shape."""
        shapes = self.shapes(margin=margin)
        out = [self._summary_finding(shapes)] if len(shapes) else []
        for layer in self.layers:
            if int(torch.isfinite(self.curve(layer)).sum()) < 3:
                continue
            sh = self.describe(layer, "logit", margin=margin)
            vals: dict[str, Any] = {"layer": layer, "shape": sh.shape}
            text = f"Layer {layer} ({self.spec.layers[layer].kind}), heads averaged: mean logit is {sh.text}"
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

    def _summary_finding(self, shapes: pd.DataFrame) -> Finding:
        full = shapes[shapes.curve == "logit"]
        counts = full["shape"].value_counts().to_dict()
        n_ctx = int(self.edges[-1])
        text = (
            f"By query–key distance (up to δ = {n_ctx - 1}, BOS excluded), the head-averaged full logit is "
            + ", ".join(f"{k} in {v}" for k, v in sorted(counts.items(), key=lambda kv: -kv[1]))
            + f" of {len(full)} layers"
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
        return Finding(
            "distance",
            "attention-by-distance",
            text + ".",
            {"full_logit_shapes": counts, "max_distance": n_ctx - 1},
        )

    # ---------------------------------------------------------------- tables and persistence
    def to_frame(self) -> pd.DataFrame:
        """Tidy: one row per (layer, head, curve, bin) of the layer's own heads; curve is a band name, "logit" or
        "prob"."""
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

    # ---------------------------------------------------------------- figures (drawn by ropelens.plots.attention_by_distance)
    def figure(self, layers: Sequence[int] | None = None, head: int | None = None) -> Any:
        """Per layer (default: up to four spread over the measured ones): mean band logits and the full
        logit by distance (left), and the mean attention probability (right), log-x; δ = 0 sits at ½."""
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
    """Stream mean band logits, full logit and attention probability by distance over a corpus
    (see :class:`DistanceReducer`); bins run to the window length ``n_ctx`` − 1."""
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
