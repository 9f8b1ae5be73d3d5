"""Partial-cycle planes, rotary outliers and rotary offset features (Jonasson 2025, "Rotary Outliers
and Rotary Offset Features in Large Language Models").

A plane i with θ_i·L_train < 2π never completes a turn within the training context: the relative
rotation (n − m)·θ_i of a query at m and a key at n ≤ m stays inside one arc, so the model can give
the plane a fixed query–key angle (an *offset*) and rely on it at every distance it was trained on.
Jonasson finds the outlier features of queries and keys in those planes, bounds the q–k angle they
allow, and shows how such an offset makes an attention sink. :class:`OffsetReducer` measures, per
layer × head × plane:

- **outlier magnitude**: the mean plane norm ‖q^(i)‖ and ‖k^(i)‖ over tokens (keys per KV head;
  query head h reads KV head h // group), and its ratio to the median over the head's other planes;
- **offset angle at the attended key**: the attended key is the argmax of the model's own scores
  (post-RoPE q·k × score scale, the layer's mask and soft-capping, rebuilt in query tiles), and
  the angle from q^(i) to k^(i) there, Δ_i = arg k^(i) − arg q^(i), is summarised by circular
  statistics: the mean resultant vector of the unit vectors (cos Δ_i, sin Δ_i), whose direction is
  the mean angle and whose length R ∈ [0, 1] is 1 when every query meets its key at one angle.
  Post-RoPE Δ is what the score sees; pre-RoPE Δ (the content angle, Δ_post = Δ_pre + (n − m)·θ_i)
  is what the projections write. Each is kept separately for queries whose attended key is a sink
  position (the first ``n_sink``) and for the rest, which separates sink-makers (a constant offset
  aimed at the sink) from content channels (angles that vary with the text).

A sliding-window layer never sees a relative distance past its window, so its L_train is the window
where that is shorter than the context (as in
:func:`ropelens.analyses.base_predictions.base_predictions`).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

import einops
import numpy as np
import pandas as pd
import torch
from jaxtyping import Bool, Float
from torch import Tensor

from ropelens.errors import InputError
from ropelens.results.figures import figure_of
from ropelens.results.provenance import Provenance
from ropelens.results.result import Result
from ropelens.results.sums import count_or_nan
from ropelens.run.capture import DeviceSums, LayerActs, Moments, query_tile
from ropelens.run.measure import RunOptions, corpus_analysis, measure
from ropelens.spec.reading import rope_spec
from ropelens.spec.rope import LayerRope, RopeSpec

__all__ = [
    "OffsetReducer",
    "RotaryOffsets",
    "layer_train_ctx",
    "partial_cycle_planes",
    "rotary_offsets",
]

Source = Literal["post", "pre"]
Scope = Literal["all", "sink", "content"]
SCOPES = ("sink", "content")  # stored; "all" is their sum
SOURCES = ("post", "pre")


def layer_train_ctx(rope: LayerRope, train_ctx: int) -> int:
    """The longest relative distance the layer met in training: ``train_ctx``, capped at its window
    or chunk."""
    return min(int(train_ctx), rope.reach) if rope.reach else int(train_ctx)


def _train_ctx(spec: RopeSpec, train_ctx: int | None) -> int:
    if train_ctx is None:
        if spec.n_ctx and spec.n_ctx > 0:
            return int(spec.n_ctx)
        reaches = [lr.reach for lr in spec.layers if lr.inv_freq.numel()]
        if reaches and all(reaches):
            # every rotary layer attends within a window (RecurrentGemma): the longest distance it
            # met in training is its window, whatever the context was
            return int(max(reaches))
        raise InputError(
            f"{spec.architecture}'s config names no trained context length "
            "(max_position_embeddings), which decides the partial-cycle planes: pass train_ctx, "
            "the context length the model was trained on"
        )
    t = train_ctx
    if isinstance(t, bool) or not isinstance(t, (int, np.integer)) or t <= 0:
        raise InputError(
            f"train_ctx must be a positive int (the trained context length in tokens), got {t!r}"
        )
    return int(t)


def partial_cycle_planes(
    spec: RopeSpec, layers: Sequence[int] | None = None, *, train_ctx: int | None = None
) -> Bool[Tensor, "layer plane"]:
    """``[layer, plane]``: True where θ_i·L_train < 2π (the plane never completes a turn in
    training).

    L_train is ``train_ctx`` (default the spec's context length), capped at a sliding window.
    Unrotated planes (θ = 0) count as partial: they never turn at all. Layers of different widths
    (Gemma 4) are padded to the most planes with False.
    """
    chosen = spec.layer_indices(layers)
    t = _train_ctx(spec, train_ctx)
    out = torch.zeros(spec.present(chosen, "plane").shape, dtype=torch.bool)
    for i, L in enumerate(chosen):
        row = spec.layers[L].inv_freq.double() * layer_train_ctx(spec.layers[L], t) < 2 * math.pi
        out[i, : row.numel()] = row
    return out


def _median_of_others(x: Float[Tensor, "... plane"]) -> Float[Tensor, "... plane"]:
    """For each plane, the median of the other planes' values (the lower median for an even
    count)."""
    P = x.shape[-1]
    if P < 2:
        return torch.full_like(x, math.nan)
    out = torch.empty_like(x)
    for i in range(P):
        others = torch.cat([x[..., :i], x[..., i + 1 :]], dim=-1)
        out[..., i] = others.nanmedian(
            dim=-1
        ).values  # NaN: planes a layer lacks (layers of other widths)
    return out


class OffsetReducer(DeviceSums):
    """Streams plane norms of q and k and, at each query's attended key, the q–k angle per plane.

    Needs post-RoPE queries and keys (the scores and the post-RoPE angles) and, with ``pre``, the
    pre-RoPE ones (the content angles); all come from the fast q/k path. Queries at positions below
    ``n_sink`` (BOS: it can only attend to itself) and padding are left out of every statistic;
    norms are over the same tokens. Sums are float64 on the CPU; scores are rebuilt in query tiles
    of about the device's element budget (:func:`ropelens.run.capture.query_tile`), so nothing of
    size ``[heads, n, n]`` is held for long n.
    """

    # masks built from positions: refused where the model picks keys from the input
    static_mask = "rotary offsets"

    def __init__(
        self,
        spec: RopeSpec,
        layers: Sequence[int],
        *,
        n_sink: int = 1,
        pre: bool = True,
        tile: int | None = None,
    ) -> None:
        if isinstance(n_sink, bool) or not isinstance(n_sink, int) or n_sink < 0:
            raise InputError(
                f"n_sink must be an int ≥ 0 (leading sink positions, 1 = BOS), got {n_sink!r}"
            )
        if tile is not None and (isinstance(tile, bool) or not isinstance(tile, int) or tile < 1):
            raise InputError(
                f"tile must be a positive number of queries or None for automatic, got {tile!r}"
            )
        self.spec, self.layers, self.n_sink, self.pre, self.tile = (
            spec,
            list(layers),
            n_sink,
            pre,
            tile,
        )
        if not self.layers:
            raise InputError("no layers selected: pass layer indices the model has")
        self.needs = frozenset({"q_post", "k_post"} | ({"q_pre", "k_pre"} if pre else set()))
        self.pos = {layer: i for i, layer in enumerate(self.layers)}
        # layers of different widths padded to the widest: NaN past a layer's own heads and planes
        z = functools.partial(spec.padded_zeros, self.layers)
        self.q = Moments(z("head", "plane"), z("head", "plane"), z("head", "plane"))
        self.k = Moments(z("kv_head", "plane"), z("kv_head", "plane"), z("kv_head", "plane"))
        self.sums: dict[str, Tensor] = {f"n/{sc}": z("head") for sc in SCOPES}
        for sc in SCOPES:
            self.sums[f"term/{sc}"] = z("head", "plane")
            for src in SOURCES if pre else ("post",):
                for stat in ("count", "cos", "sin"):
                    self.sums[f"{src}/{sc}/{stat}"] = z("head", "plane")

    def state_dict(self) -> dict[str, Tensor]:
        """Every running sum by name, the q and k norm moments with them (the tensors
        themselves)."""
        norms = {
            f"{w}_norm/{f}": getattr(m, f)
            for w, m in (("q", self.q), ("k", self.k))
            for f in ("count", "total", "total_sq")
        }
        return {**self.sums, **norms}

    @torch.no_grad()
    def update(self, acts: LayerActs) -> None:
        """Add one layer's plane-norm moments and, per scope, the attended key's plane angles."""
        layer_slot, rope = self.pos[acts.layer], acts.rope
        q_post, k_post = acts["q_post"].float(), acts["k_post"].float()
        _, n_positions, n_heads, _ = q_post.shape
        device = q_post.device
        if not self._placed:  # the moments live with the sums
            self.q, self.k = self.q.to(device), self.k.to(device)
        self._on(device)
        sums_device, sums_dtype = self.q.total.device, self.q.total.dtype
        positions = torch.arange(n_positions, device=device)
        valid = acts.valid.to(device)
        # [batch, pos]: the tokens that count
        counted = (valid & (positions >= self.n_sink)[None]).float()

        # per-window sums in float32 (≤ n_ctx terms), accumulated across windows in float64
        def add_windows(per_window: Tensor) -> Tensor:
            return per_window.to(sums_dtype).sum(0).to(sums_device)

        # a layer narrower than the widest adds into its leading heads and planes
        n_planes = rope.n_planes
        for moments, values in ((self.q, q_post), (self.k, k_post)):
            # cos/sin carry the scaling
            norms = rope.plane_norms(values) / rope.attention_scaling
            at = (layer_slot, slice(0, values.shape[2]), slice(0, n_planes))
            moments.count[at] += counted.sum().to(sums_device, sums_dtype)
            per_window = "batch pos head plane, batch pos -> batch head plane"
            moments.total[at] += add_windows(einops.einsum(norms, counted, per_window))
            moments.total_sq[at] += add_windows(einops.einsum(norms * norms, counted, per_window))
        attended = self.attended(rope, q_post, k_post, valid)  # [batch, pos, head]
        sink = attended < self.n_sink
        # [batch, pos, head, scope]
        scope_weights = torch.stack([sink, ~sink], -1).float() * counted[..., None, None]
        for j, scope in enumerate(SCOPES):
            self.sums[f"n/{scope}"][layer_slot, :n_heads] += add_windows(
                scope_weights[..., j].sum(1)
            )
        sources = {"post": (q_post, k_post)}
        if self.pre:
            sources["pre"] = (acts["q_pre"].float(), acts["k_pre"].float())
        for source, (queries, keys) in sources.items():
            stats = self._angles(
                rope, queries, keys, attended, scope_weights, term=source == "post"
            )
            for stat, per_scope in stats.items():
                for j, scope in enumerate(SCOPES):
                    key = f"term/{scope}" if stat == "term" else f"{source}/{scope}/{stat}"
                    self.sums[key][layer_slot, :n_heads, :n_planes] += add_windows(per_scope[:, j])

    @staticmethod
    def _angles(
        rope: LayerRope, q: Tensor, k: Tensor, att: Tensor, w: Tensor, term: bool = False
    ) -> dict[str, Tensor]:
        """Per window and scope, ``[b, scope, head, plane]``: the count and summed cos and sin of
        the q→k angle per plane at the attended keys (weights ``w`` ``[b, n, head, scope]``) and,
        with ``term``, the summed plane logit there."""
        b, n, H, d = q.shape
        kv = (torch.arange(H, device=q.device) // rope.group_size)[None, None].expand(b, n, H)
        ka = k[
            torch.arange(b, device=q.device)[:, None, None], att, kv
        ]  # [b, n, H, d]: attended key per head
        qp, kp = rope.split(q), rope.split(ka)  # [b, n, H, P, 2]
        dot = (qp * kp).sum(-1)
        cross = qp[..., 0] * kp[..., 1] - qp[..., 1] * kp[..., 0]
        norm = rope.plane_norms(q) * rope.plane_norms(ka)
        ok = (norm > 0).float()
        inv = ok / norm.clamp_min(torch.finfo(torch.float32).tiny)

        def red(x):
            return torch.einsum("bnhp,bnhs->bshp", x, w)

        out = {"count": red(ok), "cos": red(dot * inv), "sin": red(cross * inv)}
        if term:  # the plane's logit at the attended key
            out["term"] = red(dot * rope.score_scale)
        return out

    def attended(
        self,
        rope: LayerRope,
        q_post: Float[Tensor, "b n h d"],
        k_post: Float[Tensor, "b n kv d"],
        valid: Bool[Tensor, "b n"],
    ) -> Tensor:
        """``[b, n, head]``: the key each query attends most (argmax of the model's scores; ties go
        to the earlier key), rebuilt from post-RoPE q·k × score scale with the layer's mask and
        soft-capping."""
        b, n, H, d = q_post.shape
        KV, G = rope.n_kv_heads, rope.group_size
        qg = (q_post * rope.score_scale).view(b, n, KV, G, d)
        tile = self.tile or query_tile(q_post.device, b * H * min(n, rope.window or n))
        out = torch.empty(b, KV, G, n, dtype=torch.long, device=q_post.device)
        for c0 in range(0, n, tile):
            c1 = min(n, c0 + tile)
            k0 = max(0, c0 - rope.window + 1) if rope.window else 0
            s = torch.einsum("bckgd,bjkd->bkgcj", qg[:, c0:c1], k_post[:, k0:c1])
            if (
                rope.softcap
            ):  # the model's pattern is taken after soft-capping (tanh can tie what differed)
                s = torch.tanh(s / rope.softcap) * rope.softcap
            qp = torch.arange(c0, c1, device=s.device)[:, None]
            kp = torch.arange(k0, c1, device=s.device)[None]
            ok = kp <= qp
            if rope.window:
                ok = ok & ((qp - kp) < rope.window)
            ok = ok[None] & valid[:, None, k0:c1]  # [b, c, keys]
            s.masked_fill_(~ok[:, None, None], float("-inf"))
            out[..., c0:c1] = s.argmax(-1) + k0
        return out.view(b, H, n).transpose(1, 2)

    def result(self, provenance: Provenance, train_ctx: int | None = None) -> RotaryOffsets:
        """The streamed sums as :class:`RotaryOffsets`."""
        return RotaryOffsets(
            layers=tuple(self.layers),
            spec=self.spec,
            train_ctx=_train_ctx(self.spec, train_ctx),
            n_sink=self.n_sink,
            q=self.q.to("cpu", torch.float64),
            k=self.k.to("cpu", torch.float64),
            sums={k: v.to("cpu", torch.float64) for k, v in self.sums.items()},
            provenance=provenance,
        )


@dataclass(frozen=True)
class RotaryOffsets(
    Result, merge_same=("layers", "n_sink", "train_ctx", "spec"), merge_sums=("q", "k", "sums")
):
    """Per-plane q/k norms and the q–k angle at the attended key, per layer and head.

    What :func:`rotary_offsets` returns (after Jonasson 2025). :meth:`outlier_ratio` says how far a
    plane's norm stands above the head's other planes, :meth:`resultant_length` how constant the q–k
    angle at the attended key is (1: every query meets its key at one angle), :attr:`partial_cycle`
    which planes never complete a turn within ``train_ctx``, and :meth:`sink_fraction` how often a
    head attends to a sink position. Planes run highest frequency first.

    Layers of different widths (Gemma 4) share these arrays padded to the most heads and planes:
    every number past a layer's own reads NaN (:meth:`present`), and tables and medians leave it
    out.

    Attributes:
        layers (tuple[int, ...]): The measured layer indices.
        spec (RopeSpec): The model's RoPE spec (frequencies and wavelengths of the planes).
        train_ctx (int): The training length that decides which planes are partial-cycle.
        n_sink (int): Key positions below this count as sinks.
        q (Moments): Plane-norm moments of the queries ``[layer, head, plane]``.
        k (Moments): Plane-norm moments of the keys ``[layer, kv_head, plane]``.
        sums (dict[str, Tensor]): Per scope (``"sink"``: the attended key is one of the first
            ``n_sink`` positions; ``"content"``: any other), the number of queries ``n/<scope>``
            ``[layer, head]``, the plane's summed logit at the attended key ``term/<scope>`` and,
            per source (``"post"``, ``"pre"`` RoPE), the count and summed cos and sin of the angle
            ``<source>/<scope>/<stat>`` ``[layer, head, plane]``.
        provenance (Provenance): Model, corpus, tokens, settings and versions of the run.

    Examples:
        >>> from ropelens.analyses import rotary_offsets
        >>> from ropelens.testing import tiny_model
        >>> model = tiny_model("llama")
        >>> offsets = rotary_offsets(model, n_ctx=32, max_tokens=128, progress=False)
        >>> length = offsets.resultant_length()  # [layer, head, plane], in [0, 1]
        >>> tuple(length.shape), bool(((length >= 0) & (length <= 1 + 1e-9)).all())
        ((2, 4, 8), True)
        >>> len(offsets.figure().data) > 0
        True
    """

    layers: tuple[int, ...]
    spec: RopeSpec
    train_ctx: int
    n_sink: int
    q: Moments
    k: Moments
    sums: dict[str, Tensor]
    provenance: Provenance

    def __post_init__(self) -> None:
        L, H, P = self.spec.present(self.layers, "head", "plane").shape
        KV = self.spec.present(self.layers, "kv_head").shape[1]
        if tuple(self.q.total.shape) != (L, H, P) or tuple(self.k.total.shape) != (L, KV, P):
            raise InputError(
                f"q moments {tuple(self.q.total.shape)} and k moments {tuple(self.k.total.shape)} "
                f"must be {(L, H, P)} and {(L, KV, P)}: [layer, head, plane]"
            )
        for key, t in self.sums.items():
            want = (L, H) if key.startswith("n/") else (L, H, P)
            if tuple(t.shape) != want:
                raise InputError(f"sums[{key!r}] has shape {tuple(t.shape)}, expected {want}")

    # ---------------------------------------------------------------- numbers
    def present(self) -> Bool[Tensor, "layer head plane"]:
        """The (head, plane) entries each layer has (all True when the measured layers share one
        width)."""
        return ~self.q.count.isnan()

    @property
    def has_pre(self) -> bool:
        """Whether the pre-RoPE (content) angles were measured."""
        return "pre/sink/count" in self.sums

    @property
    def partial_cycle(self) -> Bool[Tensor, "layer plane"]:
        """θ_i·L_train < 2π per layer and plane (see :func:`partial_cycle_planes`)."""
        return partial_cycle_planes(self.spec, list(self.layers), train_ctx=self.train_ctx)

    def norm(self, which: Literal["q", "k"] = "q") -> Float[Tensor, "layer head plane"]:
        """Mean plane norm over tokens (``k``: per KV head)."""
        return self._mom(which).mean.float()

    def _mom(self, which: str) -> Moments:
        if which not in ("q", "k"):
            raise InputError(f"which must be 'q' or 'k', got {which!r}")
        return self.q if which == "q" else self.k

    def outlier_ratio(self, which: Literal["q", "k"] = "q") -> Float[Tensor, "layer head plane"]:
        """Mean plane norm over the median of the head's other planes' mean norms; NaN where that
        median is 0 (planes zeroed by an ablation leave no scale to measure against)."""
        m = self._mom(which).mean
        median = _median_of_others(m)
        return (m / median.masked_fill(median <= 0, math.nan)).float()

    def by_head(self, x: Float[Tensor, "layer kv_head plane"]) -> Float[Tensor, "layer head plane"]:
        """A KV-head statistic as seen by each query head (query head h reads KV head h // group,
        the group of its own layer; NaN for heads a layer lacks)."""
        H = self.q.total.shape[1]
        kv = torch.stack(
            [
                (torch.arange(H) // self.spec.layers[L].group_size).clamp_max(x.shape[1] - 1)
                for L in self.layers
            ]
        )  # [L, H]
        out = x.gather(1, kv[..., None].expand(-1, -1, x.shape[-1]))
        return out.masked_fill(~self.present(), math.nan)

    def _scoped(self, key: str, scope: Scope) -> Tensor:
        if scope not in ("all", *SCOPES):
            raise InputError(f"scope must be 'all', 'sink' or 'content', got {scope!r}")
        return (
            sum(self.sums[key.format(sc)] for sc in SCOPES)
            if scope == "all"
            else self.sums[key.format(scope)]
        )

    def resultant(
        self, source: Source = "post", scope: Scope = "all"
    ) -> Float[Tensor, "layer head plane 2"]:
        """Mean resultant vector (mean cos, mean sin) of the q→k angle at the attended key."""
        if source not in SOURCES or (source == "pre" and not self.has_pre):
            raise InputError(
                "source must be 'post' or 'pre' (pre only when measured with pre=True), got "
                f"{source!r}"
            )
        count = count_or_nan(self._scoped(f"{source}/{{}}/count", scope))
        cos_sum = self._scoped(f"{source}/{{}}/cos", scope)
        sin_sum = self._scoped(f"{source}/{{}}/sin", scope)
        return torch.stack([cos_sum / count, sin_sum / count], -1)

    def mean_angle(
        self, source: Source = "post", scope: Scope = "all"
    ) -> Float[Tensor, "layer head plane"]:
        """Circular mean of the q→k angle at the attended key, radians in (−π, π]."""
        r = self.resultant(source, scope)
        return torch.atan2(r[..., 1], r[..., 0])

    def resultant_length(
        self, source: Source = "post", scope: Scope = "all"
    ) -> Float[Tensor, "layer head plane"]:
        """Length R ∈ [0, 1] of the mean resultant vector: 1 = one fixed angle, ≈ 0 = no preferred
        angle."""
        return torch.linalg.vector_norm(self.resultant(source, scope), dim=-1)

    def mean_term(self, scope: Scope = "all") -> Float[Tensor, "layer head plane"]:
        """Mean logit contribution of each plane at the attended key."""
        n = self._scoped("n/{}", scope)[..., None]
        return self._scoped("term/{}", scope) / count_or_nan(n)

    def sink_fraction(self) -> Float[Tensor, "layer head"]:
        """Share of queries whose attended key is a sink position."""
        n = self._scoped("n/{}", "all")
        return self.sums["n/sink"] / count_or_nan(n)

    def summary(self) -> pd.DataFrame:
        """Partial-cycle planes against the others: medians over (layer, head, plane) entries."""
        df = self.to_frame()
        cols = [
            "q_ratio",
            "k_ratio",
            "q_norm",
            "k_norm",
            "resultant_post",
            "resultant_post_sink",
            "resultant_post_content",
            "abs_angle_post",
            "mean_term",
        ]
        df = df.assign(abs_angle_post=df["angle_post"].abs())
        out = df.groupby("partial_cycle")[cols].median()
        out.insert(0, "entries", df.groupby("partial_cycle").size())
        out.insert(1, "planes", df.groupby("partial_cycle")["plane"].nunique())
        return out.rename(index={True: "partial cycle", False: "full cycle"}).rename_axis("planes")

    def to_frame(self) -> pd.DataFrame:
        """Tidy table: one row per (layer, head, plane) of the layer's own heads and planes; k
        columns are the head's KV head."""
        L, H, P = self.q.total.shape
        layer, head, plane = np.meshgrid(
            np.array(self.layers), np.arange(H), np.arange(P), indexing="ij"
        )

        def flat(t):
            return t.double().reshape(-1).numpy()

        def per_lp(t):
            return flat(t[:, None, :].expand(L, H, P))

        inv = torch.full((L, P), math.nan, dtype=torch.float64)
        for j, i in enumerate(self.layers):
            inv[j, : self.spec.layers[i].n_planes] = self.spec.layers[i].inv_freq.double()
        group = np.repeat([self.spec.layers[i].group_size for i in self.layers], H * P)
        cols = {
            "layer": layer.ravel(),
            "kind": np.repeat([self.spec.layers[i].kind for i in self.layers], H * P),
            "head": head.ravel(),
            "kv_head": head.ravel() // group,
            "plane": plane.ravel(),
            "inv_freq": per_lp(inv),
            "wavelength": per_lp(2 * math.pi / inv),
            "train_ctx": np.repeat(
                [layer_train_ctx(self.spec.layers[i], self.train_ctx) for i in self.layers], H * P
            ),
            "partial_cycle": per_lp(self.partial_cycle).astype(bool),
            "q_norm": flat(self.norm("q")),
            "k_norm": flat(self.by_head(self.norm("k"))),
            "q_ratio": flat(self.outlier_ratio("q")),
            "k_ratio": flat(self.by_head(self.outlier_ratio("k"))),
        }
        for src in SOURCES if self.has_pre else ("post",):
            for sc in ("all", *SCOPES):
                tag = src if sc == "all" else f"{src}_{sc}"
                cols[f"angle_{tag}"] = flat(self.mean_angle(src, sc))
                cols[f"resultant_{tag}"] = flat(self.resultant_length(src, sc))
        cols["mean_term"] = flat(self.mean_term())
        cols["sink_fraction"] = flat(self.sink_fraction()[..., None].expand(L, H, P))
        cols["n_queries"] = flat(self._scoped("n/{}", "all")[..., None].expand(L, H, P))
        return pd.DataFrame(cols)[self.present().reshape(-1).numpy()].reset_index(drop=True)

    # ---------------------------------------------------------------- persistence
    # --------------------------------------------- figures (drawn by ropelens.plots.rotary_offsets)
    def heatmap(
        self, what: str = "q_ratio", layer: int | None = None, coloraxis: str | None = None
    ) -> Any:
        """Layer × plane (head mean) or, for ``layer``, head × plane of one statistic:
        ``q_ratio``, ``k_ratio``, ``resultant_post``, ``resultant_pre`` or ``mean_term``."""
        return figure_of(RotaryOffsets, "heatmap")(self, what, layer, coloraxis)

    def figure(self, layer: int | None = None) -> Any:
        """Query and key outlier ratios and the post-RoPE resultant length, with the first
        partial-cycle plane marked (dashed line)."""
        return figure_of(RotaryOffsets)(self, layer)


@corpus_analysis(max_tokens=16_384)
def rotary_offsets(
    model,
    corpus,
    run: RunOptions,
    *,
    n_sink: int = 1,
    train_ctx: int | None = None,
    pre: bool = True,
) -> RotaryOffsets:
    """Rotary outliers and offset angles per plane over a corpus (see :class:`OffsetReducer`).

    After Jonasson (2025, "Rotary Outliers and Rotary Offset Features in Large Language Models"): a
    plane with θ·L_train < 2π never completes a turn within the training context, so the model can
    give it a fixed query–key angle (an offset). Per layer × head × plane it measures the mean plane
    norms of q and k (outliers: large against the head's other planes) and the angle from q to k at
    the attended key, summarised by its mean resultant vector, separately for queries that attend to
    a sink position and for the rest. Layers may differ in heads and planes (Gemma 4): each layer's
    numbers are those it has measured alone.

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
        max_tokens (int | None): Corpus tokens to read (default 16384; None: all of it).
        layers (Sequence[int] | None): Layer indices to measure (default None: every rotary layer).
        text_column (str): The column of a table or dataset corpus that holds the text (default
            "text").
        n_sink (int): Key positions below this count as sinks (default 1: BOS).
        train_ctx (int | None): The training length L_train that decides which planes are
            partial-cycle (default None: the model's context length, or its widest window where
            its config names none and every rotary layer is windowed; a sliding-window layer's
            window where shorter).
        pre (bool): Also measure the pre-RoPE (content) angle (default True).
        batch_size (int): Windows per forward pass (default 4).
        progress (bool): Show a progress bar (default True; rank 0 only under torchrun).
        checkpoint (str | os.PathLike | None): A directory to save progress to and resume a killed
            run from (default None: none; see :mod:`ropelens.run.distributed`).
        checkpoint_every (int): Batches between checkpoints (default 8).
        verify (bool): First check that ropelens's reading of RoPE reproduces the model's own
            attention (default True); False skips the check, and the result says "unverified".

    Returns:
        RotaryOffsets: Plane-norm moments of q ``[layer, head, plane]`` and k ``[layer, kv_head,
        plane]`` and the angle sums per scope (sink, content) and source (post, pre RoPE).

    Raises:
        InputError: When ``layers`` selects no layer the model has, the corpus cannot be read, or
            ``train_ctx`` is not a positive integer (the message names the problem and the fix).
        UnsupportedModelError: When ``verify`` finds that the RoPE reading does not reproduce the
            model's own attention.

    Examples:
        >>> from ropelens.analyses import rotary_offsets
        >>> from ropelens.testing import tiny_model
        >>> model = tiny_model("llama")
        >>> offsets = rotary_offsets(model, n_ctx=32, max_tokens=128, progress=False)
        >>> tuple(offsets.outlier_ratio("q").shape)  # [layer, head, plane]
        (2, 4, 8)
        >>> offsets.train_ctx, offsets.partial_cycle[0].tolist()  # partial-cycle planes
        (256, [False, False, False, False, True, True, True, True])
    """
    spec = rope_spec(model)  # read once: train_ctx needs it before the run
    t = _train_ctx(spec, train_ctx)
    m = measure(
        model,
        corpus,
        lambda spec, chosen, _: OffsetReducer(spec, chosen, n_sink=n_sink, pre=pre),
        run,
        analysis="rotary offsets",
        config={"n_sink": n_sink, "train_ctx": t, "pre": pre},
        spec=spec,
    )
    return m.reducer.result(m.provenance, t)
