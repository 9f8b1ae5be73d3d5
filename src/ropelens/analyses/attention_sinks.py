"""Attention sinks per head and per band (Gu et al. 2024, "When Attention Sink Emerges in Language
Models").

Gu et al. say a head *sinks* on a token when its attention to that token, averaged over the queries
that see it, exceeds ε = 0.3. :class:`SinkReducer` measures that for the first position of every
window (BOS) per layer × head, with the share of queries whose own attention to it exceeds ε, and
asks which RoPE bands make the first position attractive: the sink logit (the logit at key 0 minus
the mean logit over the query's other keys) splits exactly into one term per band. It also
compares the key at position 0 with the other keys, band by band and plane by plane (the plane
ratio is the sink-key norm ratio :class:`ropelens.analyses.frequency_usage.FrequencyUsage` reports).
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import einops
import numpy as np
import pandas as pd
import torch
from jaxtyping import Bool, Float
from torch import Tensor

from ropelens.errors import InputError
from ropelens.results.findings import Finding, count_of, fixed, percent, too_short, withheld
from ropelens.results.provenance import Provenance
from ropelens.results.result import Result
from ropelens.results.sums import count_or_nan
from ropelens.run.capture import DeviceSums, LayerActs, query_tile, sum_dtype
from ropelens.run.measure import RunOptions, corpus_analysis, measure
from ropelens.spec.bands import Bands
from ropelens.spec.rope import RopeSpec
from ropelens.validate import check_number

__all__ = ["EPSILON", "AttentionSinks", "SinkReducer", "attention_sinks"]

EPSILON = 0.3  # Gu et al.'s threshold on the attention a sinking head pays to the sink token
# score entries per tile: 2^22 on the CPU; accelerators take larger tiles


class SinkReducer(DeviceSums):
    """Streams, per layer × head, the attention to position 0 and its band decomposition.

    For each query at position m ≥ ``skip_queries`` that may attend to position 0 (within its
    sliding window): the model's attention to position 0, rebuilt from post-RoPE q and k through
    :meth:`LayerRope.probs` (soft-cap and learned sinks as the model applies them), whether it
    exceeds ``epsilon``, the attention a learned sink takes (gpt-oss), and per band the logit at
    key 0 and the mean logit over the query's other allowed keys. Per KV head: the norm of the
    pre-RoPE key at position 0 and at the other positions, per band and per plane.

    Attention needs whole rows, so query tiles hold keys 0 … m; only queries that see position 0
    are scored, and nothing of size ``[heads, n, n]`` exists. The band terms need no tiles: the
    logit at key 0 is q_b·k_b(0) and the row sum is q_b·Σ_j k_b(j), a prefix sum.
    """

    # masks built from positions: refused where the model picks keys from the input
    static_mask = "attention sinks"
    needs = frozenset({"q_post", "k_post", "k_pre"})

    def __init__(
        self,
        spec: RopeSpec,
        layers: Sequence[int],
        bands: Bands | None = None,
        *,
        epsilon: float = EPSILON,
        skip_queries: int = 4,
        tile: int | None = None,
    ) -> None:
        self.spec, self.layers = spec, list(layers)
        if not self.layers:
            raise InputError("no layers selected: pass layer indices the model has")
        self.bands = bands or Bands.default()
        self.epsilon = check_number(
            epsilon,
            "epsilon",
            above=0,
            at_most=1,
            hint=" (the attention share that makes a head sink; Gu et al. use 0.3)",
        )
        self.skip_queries = check_number(
            skip_queries,
            "skip_queries",
            at_least=1,
            integer=True,
            hint=" (queries before it are left out: position 0 sees only itself)",
        )
        if tile is not None and (isinstance(tile, bool) or not isinstance(tile, int) or tile < 1):
            raise InputError(
                f"tile must be a positive number of queries or None for automatic, got {tile!r}"
            )
        self.tile = tile
        self.resolved = {L: self.bands.resolve(spec.layers[L]) for L in self.layers}
        names = {r.names for r in self.resolved.values()}
        if len(names) != 1:
            raise InputError(
                f"bands {self.bands.describe()} resolve to different band names across layers: "
                f"{names}; pick layers of one kind (layers=...) or bands that name the same "
                "groups everywhere"
            )
        self.names = next(iter(names))
        B = len(self.names)
        # layers of different widths padded to the widest: NaN past a layer's own heads and planes
        z = functools.partial(spec.padded_zeros, self.layers)
        self.sums: dict[str, Tensor] = {
            "n_queries": z(),
            "p0_sum": z("head"),
            "p0_over": z("head"),
            "sink_mass": z("head"),
            "x0_sum": z("head", B),
            "xo_sum": z("head", B),
            "n_k0": z(),
            "n_kother": z(),
            "k0_band": z("kv_head", B),
            "kother_band": z("kv_head", B),
            "k0_plane": z("kv_head", "plane"),
            "kother_plane": z("kv_head", "plane"),
        }
        self.pos = {L: i for i, L in enumerate(self.layers)}
        self._member: dict[tuple[int, str], Tensor] = {}

    def _tile(self, device: torch.device, rows: int, keys: int) -> int:
        if self.tile:
            return self.tile
        return query_tile(device, rows * keys)

    @torch.no_grad()
    def update(self, acts: LayerActs) -> None:
        """Add one layer's band logits at key 0, attention to position 0, and key norms."""
        layer_slot, rope = self.pos[acts.layer], acts.rope
        valid = acts.valid
        q_post, k_post = acts["q_post"], acts["k_post"]
        device = q_post.device
        sums = self._on(device)
        _, n_positions, _, _ = q_post.shape
        key = (acts.layer, str(device))
        if key not in self._member:
            self._member[key] = self.resolved[acts.layer].dim_membership().to(device)
        membership = self._member[key]
        valid_float = einops.rearrange(valid.float(), "batch pos -> batch pos 1 1")
        # logits come out scaled
        queries = q_post.float() * (valid_float * rope.score_scale)
        keys = k_post.float() * valid_float
        positions = torch.arange(n_positions, device=device)
        # keys 0 … m that are real: all a query that sees key 0 may attend to
        n_keys = valid.long().cumsum(1)
        # queries m < reach see position 0
        reach = n_positions if not rope.window else min(n_positions, rope.window)
        used = (
            valid
            & valid[:, :1]
            & (positions >= self.skip_queries)[None]
            & (positions < reach)[None]
            & (n_keys >= 2)
        )
        used_float = used.float()
        sums["n_queries"][layer_slot] += used_float.sum().to(
            sums["n_queries"].device, sums["n_queries"].dtype
        )
        self._add_band_terms(sums, layer_slot, rope, queries, keys, membership, n_keys, used_float)
        self._add_attention_to_first(
            sums, layer_slot, rope, queries, keys, valid, used_float, reach
        )
        self._add_key_norms(sums, layer_slot, rope, acts["k_pre"], valid, membership)

    def _add_band_terms(
        self,
        sums: dict[str, Tensor],
        layer_slot: int,
        rope,
        queries: Tensor,
        keys: Tensor,
        membership: Tensor,
        n_keys: Tensor,
        used_float: Tensor,
    ) -> None:
        """Per band, the logit at key 0 and the mean over the other allowed keys (prefix sums)."""
        sums_device, sums_dtype = sums["n_queries"].device, sums["n_queries"].dtype
        wide = sum_dtype(queries.device)
        n_heads = queries.shape[2]
        grouped_queries = einops.rearrange(
            queries,
            "batch pos (kv_head group) dim -> batch pos kv_head group dim",
            kv_head=rope.n_kv_heads,
        )
        # [batch, pos, kv_head, group, band]
        first_key_logits = torch.matmul(grouped_queries * keys[:, :1, :, None, :], membership)
        # summed in float64 (float32 on MPS)
        key_prefix_sums = keys.to(wide).cumsum(1).float()
        row_logits = torch.matmul(grouped_queries * key_prefix_sums[:, :, :, None, :], membership)
        other_keys = (n_keys - 1).clamp_min(1).float()
        other_key_logits = (row_logits - first_key_logits) / einops.rearrange(
            other_keys, "batch pos -> batch pos 1 1 1"
        )
        weights = einops.rearrange(used_float, "batch pos -> batch pos 1 1 1")
        to_heads = "batch pos kv_head group band -> (kv_head group) band"
        # a layer narrower than the widest adds into its leading heads and planes
        sums["x0_sum"][layer_slot, :n_heads] += einops.reduce(
            (first_key_logits * weights).to(wide), to_heads, "sum"
        ).to(sums_device, sums_dtype)
        sums["xo_sum"][layer_slot, :n_heads] += einops.reduce(
            (other_key_logits * weights).to(wide), to_heads, "sum"
        ).to(sums_device, sums_dtype)

    def _add_attention_to_first(
        self,
        sums: dict[str, Tensor],
        layer_slot: int,
        rope,
        queries: Tensor,
        keys: Tensor,
        valid: Tensor,
        used_float: Tensor,
        reach: int,
    ) -> None:
        """The model's attention to position 0, rebuilt in query tiles that hold whole rows."""
        sums_device, sums_dtype = sums["n_queries"].device, sums["n_queries"].dtype
        device = queries.device
        wide = sum_dtype(device)
        batch, _, n_heads, head_dim = queries.shape
        n_kv_heads = rope.n_kv_heads
        head_keys = einops.rearrange(keys, "batch pos kv_head dim -> batch kv_head dim pos")
        head_queries = einops.rearrange(
            queries,
            "batch pos (kv_head group) dim -> batch kv_head group pos dim",
            kv_head=n_kv_heads,
        )
        positions = torch.arange(queries.shape[1], device=device)
        tile_size = self._tile(device, batch * n_heads, reach)
        first_sum, first_over, sink_mass = (
            queries.new_zeros(n_heads, dtype=wide) for _ in range(3)
        )
        for query_start in range(min(self.skip_queries, reach), reach, tile_size):
            query_end = min(reach, query_start + tile_size)
            n_tile = query_end - query_start
            tile_queries = head_queries[:, :, :, query_start:query_end].reshape(
                batch, n_kv_heads, -1, head_dim
            )
            scores = torch.matmul(tile_queries, head_keys[..., :query_end]).view(
                batch, n_heads, n_tile, query_end
            )
            # [batch, query, key]: keys 0 … m
            allowed = (positions[None, :query_end] <= positions[query_start:query_end, None])[
                None
            ] & valid[:, None, :query_end]
            probs = rope.probs(scores.masked_fill(~allowed[:, None], float("-inf")))
            used_tile = used_float[:, None, query_start:query_end]
            first_probs = probs[..., 0]
            first_sum += (first_probs * used_tile).to(wide).sum((0, 2))
            first_over += ((first_probs > self.epsilon).float() * used_tile).to(wide).sum((0, 2))
            if rope.sinks is not None:
                sink_mass += ((1 - probs.sum(-1)).clamp_min(0) * used_tile).to(wide).sum((0, 2))
            del scores, probs
        sums["p0_sum"][layer_slot, :n_heads] += first_sum.to(sums_device, sums_dtype)
        sums["p0_over"][layer_slot, :n_heads] += first_over.to(sums_device, sums_dtype)
        sums["sink_mass"][layer_slot, :n_heads] += sink_mass.to(sums_device, sums_dtype)

    @staticmethod
    def _add_key_norms(
        sums: dict[str, Tensor],
        layer_slot: int,
        rope,
        k_pre: Tensor,
        valid: Tensor,
        membership: Tensor,
    ) -> None:
        """Key norms (pre-RoPE, as frequency usage measures them): position 0 against the rest."""
        sums_device, sums_dtype = sums["n_queries"].device, sums["n_queries"].dtype
        wide = sum_dtype(k_pre.device)
        n_kv_heads, n_planes = rope.n_kv_heads, rope.n_planes
        valid_float = valid.float()
        keys = k_pre.float() * einops.rearrange(valid_float, "batch pos -> batch pos 1 1")
        plane_norms = rope.plane_norms(keys)  # [batch, pos, kv_head, plane]
        band_norms = torch.matmul(keys * keys, membership).clamp_min(0).sqrt()
        first_valid = valid_float[:, 0]
        first_weight = first_valid[:, None, None]
        sums["n_k0"][layer_slot] += first_valid.sum().to(sums_device, sums_dtype)
        sums["n_kother"][layer_slot] += valid_float[:, 1:].sum().to(sums_device, sums_dtype)
        sums["k0_band"][layer_slot, :n_kv_heads] += (
            (band_norms[:, 0] * first_weight).to(wide).sum(0).to(sums_device, sums_dtype)
        )
        sums["kother_band"][layer_slot, :n_kv_heads] += (
            band_norms[:, 1:].to(wide).sum((0, 1)).to(sums_device, sums_dtype)
        )
        sums["k0_plane"][layer_slot, :n_kv_heads, :n_planes] += (
            (plane_norms[:, 0] * first_weight).to(wide).sum(0).to(sums_device, sums_dtype)
        )
        sums["kother_plane"][layer_slot, :n_kv_heads, :n_planes] += (
            plane_norms[:, 1:].to(wide).sum((0, 1)).to(sums_device, sums_dtype)
        )

    def config(self) -> dict[str, Any]:
        return {
            "bands": self.bands.describe(),
            "layers": list(self.layers),
            "epsilon": self.epsilon,
            "skip_queries": self.skip_queries,
        }

    def result(self, provenance: Provenance) -> AttentionSinks:
        """The streamed sums as :class:`AttentionSinks` (on the CPU, float64)."""
        sums = {k: v.detach().to("cpu", torch.float64) for k, v in self.sums.items()}
        return AttentionSinks(
            tuple(self.layers),
            self.names,
            self.bands,
            self.spec,
            self.epsilon,
            self.skip_queries,
            sums,
            provenance,
        )


@dataclass(frozen=True)
class AttentionSinks(
    Result,
    merge_same=("layers", "band_names", "epsilon", "skip_queries", "spec"),
    merge_sums=("sums",),
):
    """Attention to the first position per layer × head, its band decomposition and the sink key's
    norms.

    Layers of different widths (Gemma 4's wider global heads) share one array per sum, padded to the
    most heads, KV heads and planes: every number past a layer's own reads NaN (:meth:`present`),
    tables leave those rows out, and findings and per-layer means skip them.

    Built by :func:`~ropelens.analyses.attention_sinks`. A head *sinks* (Gu et al. 2024, "When
    Attention Sink Emerges in Language Models") when its mean attention to position 0 over the
    queries that see it exceeds ε = 0.3 (:meth:`sinking`); the sink logit (logit at key 0 minus the
    mean over the query's other keys) splits exactly into one term per band (:meth:`sink_logit`).

    Attributes:
        layers (tuple[int, ...]): The measured layers, in the order of the ``layer`` axis.
        band_names (tuple[str, ...]): Band names, in the order of the ``band`` axis.
        bands (Bands): The band definition the names were resolved from (default quartiles).
        spec (RopeSpec): The model's RoPE reading.
        epsilon (float): Gu et al.'s threshold on the attention to position 0 (default 0.3).
        skip_queries (int): Queries at positions below this are not scored (default 4).
        sums (dict[str, Tensor]): Streamed float64 sums: ``n_queries``, ``n_k0``, ``n_kother``
            ``[layer]``; ``p0_sum``, ``p0_over``, ``sink_mass`` ``[layer, head]``; ``x0_sum``,
            ``xo_sum`` ``[layer, head, band]``; ``k0_band``, ``kother_band``
            ``[layer, kv_head, band]``; ``k0_plane``, ``kother_plane`` ``[layer, kv_head, plane]``.
        provenance (Provenance): Model, corpus, token count and versions.

    Examples:
        >>> import torch
        >>> from ropelens.analyses import attention_sinks
        >>> from ropelens.testing import tiny_model
        >>> tokens = torch.randint(4, 100, (2, 16), generator=torch.Generator().manual_seed(0))
        >>> sinks = attention_sinks(tiny_model("llama"), tokens, progress=False)
        >>> sinks.epsilon, tuple(sinks.mean_attention().shape)  # [layer, head]
        (0.3, (2, 4))
        >>> share = sinks.sink_logit_share()  # [layer, head, band], sums to 1 over bands
        >>> bool(torch.allclose(share.sum(-1), torch.ones(2, 4, dtype=torch.float64)))
        True
        >>> list(sinks.heads_frame().columns[:4])
        ['layer', 'head', 'kind', 'mean_attention']
    """

    layers: tuple[int, ...]
    band_names: tuple[str, ...]
    bands: Bands
    spec: RopeSpec
    epsilon: float
    skip_queries: int
    sums: dict[str, Tensor]
    provenance: Provenance

    def __post_init__(self) -> None:
        self._check_shape(
            "x0_sum",
            self.sums["x0_sum"],
            (len(self.layers), None, len(self.band_names)),
            " [layer, head, band]",
        )

    # ---------------------------------------------------------------- numbers
    def present(self) -> Bool[Tensor, "layer head"]:
        """The heads each layer has (all True when the measured layers share one width)."""
        return ~self.sums["p0_sum"].isnan()

    def _per_query(self, key: str) -> Tensor:
        n = count_or_nan(self.sums["n_queries"])
        t = self.sums[key]
        return t / n.view(-1, *[1] * (t.ndim - 1))

    def mean_attention(self) -> Float[Tensor, "layer head"]:
        """Mean attention to position 0 over the queries that see it (from ``skip_queries`` on)."""
        return self._per_query("p0_sum")

    def query_share(self) -> Float[Tensor, "layer head"]:
        """Share of those queries whose attention to position 0 exceeds ε."""
        return self._per_query("p0_over")

    def learned_sink(self) -> Float[Tensor, "layer head"]:
        """Mean attention a learned sink logit takes (gpt-oss; 0 where the layer has none)."""
        return self._per_query("sink_mass")

    def sinking(self) -> Bool[Tensor, "layer head"]:
        """Gu et al.'s criterion: the head's mean attention to position 0 exceeds ε."""
        return self.mean_attention() > self.epsilon

    def head_share(self) -> Float[Tensor, " layer"]:
        """Per layer, the share of its heads that sink on position 0."""
        return self.sinking().double().sum(1) / self.present().sum(1)

    def sink_logit(self) -> Float[Tensor, "layer head band"]:
        """Per band: mean band logit at key 0 minus the mean band logit over the query's other keys.
        Sums over bands to the full sink logit (before any soft-cap); positive bands make
        position 0 attractive."""
        return self._per_query("x0_sum") - self._per_query("xo_sum")

    def sink_logit_share(self) -> Float[Tensor, "layer head band"]:
        """Each band's share of the full sink logit (sums to 1; negative where a band works against
        it)."""
        x = self.sink_logit()
        return x / x.sum(-1, keepdim=True)

    def key_norm(self, position: str = "sink") -> Float[Tensor, "layer kv_head band"]:
        """Mean norm of the pre-RoPE key's band part at position 0 (``"sink"``) or at the others
        (``"other"``)."""
        if position not in ("sink", "other"):
            raise InputError(f"position must be 'sink' or 'other', got {position!r}")
        tot, n = (
            (self.sums["k0_band"], self.sums["n_k0"])
            if position == "sink"
            else (self.sums["kother_band"], self.sums["n_kother"])
        )
        return tot / count_or_nan(n)[:, None, None]

    def key_norm_ratio(self) -> Float[Tensor, "layer kv_head band"]:
        """Band norm of the key at position 0 ÷ its mean at the other positions."""
        return self.key_norm("sink") / self.key_norm("other")

    def plane_key_ratio(self) -> Float[Tensor, " layer"]:
        """Per layer: mean per-plane key norm at position 0 ÷ that at the other positions (heads and
        planes averaged) — the key sink ratio the frequency-usage report gives with ``n_sink=1`` on
        the same windows."""
        n0, no = self.sums["n_k0"], self.sums["n_kother"]
        sink = self.sums["k0_plane"] / count_or_nan(n0)[:, None, None]
        other = self.sums["kother_plane"] / count_or_nan(no)[:, None, None]
        return sink.nanmean((1, 2)) / other.nanmean((1, 2))  # the layer's own KV heads and planes

    def _li(self, layer: int) -> int:
        if layer not in self.layers:
            raise InputError(
                f"layer {layer} was not measured; measured layers: {list(self.layers)}"
            )
        return self.layers.index(layer)

    # ---------------------------------------------------------------- tables
    def heads_frame(self) -> pd.DataFrame:
        """One row per (layer, head) of the layer's own heads: attention to position 0, query share,
        sinking, learned sink, full sink logit and the band with the largest share of it."""
        L, H = self.sums["p0_sum"].shape
        x = self.sink_logit()
        top = x.nan_to_num(float("-inf")).argmax(-1)
        layer, head = np.meshgrid(np.array(self.layers), np.arange(H), indexing="ij")
        have = self.present().reshape(-1).numpy()
        return pd.DataFrame(
            {
                "layer": layer.ravel(),
                "head": head.ravel(),
                "kind": [self.spec.layers[int(lay)].kind for lay in layer.ravel()],
                "mean_attention": self.mean_attention().reshape(-1).numpy(),
                "query_share": self.query_share().reshape(-1).numpy(),
                "sinking": self.sinking().reshape(-1).numpy(),
                "learned_sink": self.learned_sink().reshape(-1).numpy(),
                "sink_logit": x.sum(-1).reshape(-1).numpy(),
                "top_band": [self.band_names[int(j)] for j in top.reshape(-1)],
                "n_queries": self.sums["n_queries"][:, None].expand(L, H).reshape(-1).numpy(),
            }
        )[have].reset_index(drop=True)

    def layers_frame(self) -> pd.DataFrame:
        """One row per layer: share of sinking heads, mean attention to position 0, key ratio."""
        return pd.DataFrame(
            {
                "layer": list(self.layers),
                "kind": [self.spec.layers[lay].kind for lay in self.layers],
                "sinking_share": self.head_share().numpy(),
                "mean_attention": self.mean_attention().nanmean(1).numpy(),
                "query_share": self.query_share().nanmean(1).numpy(),
                "plane_key_ratio": self.plane_key_ratio().numpy(),
            }
        )

    def to_frame(self) -> pd.DataFrame:
        """Tidy: one row per (layer, head, band) of the layer's own heads with the band's sink logit
        and share, the band's key-norm ratio of the head's KV head, and the head's attention to
        position 0."""
        L, H, B = self.sums["x0_sum"].shape
        layer, head, band = np.meshgrid(
            np.array(self.layers), np.arange(H), np.arange(B), indexing="ij"
        )
        # query head h reads KV head h // group, the group of its own layer (layers of other widths
        # differ)
        kv = torch.stack(
            [
                (torch.arange(H) // self.spec.layers[lay].group_size).clamp_max(
                    self.sums["k0_band"].shape[1] - 1
                )
                for lay in self.layers
            ]
        )  # [L,H]
        ratio = self.key_norm_ratio().gather(1, kv[..., None].expand(L, H, B))  # [L,H,B]
        have = self.present()[..., None].expand(L, H, B).reshape(-1).numpy()
        return pd.DataFrame(
            {
                "layer": layer.ravel(),
                "head": head.ravel(),
                "band": [self.band_names[j] for j in band.ravel()],
                "sink_logit": self.sink_logit().reshape(-1).numpy(),
                "sink_logit_share": self.sink_logit_share().reshape(-1).numpy(),
                "key_norm_ratio": ratio.reshape(-1).numpy(),
                "mean_attention": self.mean_attention()[:, :, None]
                .expand(L, H, B)
                .reshape(-1)
                .numpy(),
                "query_share": self.query_share()[:, :, None].expand(L, H, B).reshape(-1).numpy(),
                "sinking": self.sinking()[:, :, None].expand(L, H, B).reshape(-1).numpy(),
            }
        )[have].reset_index(drop=True)

    def findings(self) -> list[Finding]:
        """How many heads sink and where; which band makes position 0 attractive in them (when any
        sink); how the key at position 0 compares with the other keys. Windows too short for a
        finding (no query at m ≥ ``skip_queries``; no key besides position 0) give it withheld."""
        n_ctx = self.provenance.n_ctx
        if too_short(n_ctx, 2):
            why = "the key at position 0 is compared with the keys after it"
            return [withheld("sinks-2", "attention-sinks", "the sink key", n_ctx, 2, why)]  # type: ignore[arg-type]
        if too_short(n_ctx, self.skip_queries + 1):
            why = (
                f"a head sinks by its attention from queries at m ≥ {self.skip_queries} "
                f"(skip_queries={self.skip_queries})"
            )
            need = self.skip_queries + 1
            return [
                withheld("sinks-0", "attention-sinks", "sinking heads", n_ctx, need, why),  # type: ignore[arg-type]
                self._key_finding(),
            ]
        sink = self.sinking()  # False for heads a layer lacks
        n, total = int(sink.sum()), int(self.present().sum())
        share = self.head_share()
        vals = {
            "sinking_heads": n,
            "heads": total,
            "mean_attention": round(float(self.mean_attention().nanmean()), 2),
        }
        out = [
            Finding(
                "sinks-0",
                "attention-sinks",
                _sink_count(n, total)
                + f" sink on position 0 (over the queries from position {self.skip_queries} on, "
                f"a mean attention to it above {self.epsilon:g}); "
                + _layer_range(share, self.layers)
                + f"on average a head gives position 0 {percent(vals['mean_attention'])} of its "
                "attention.",
                vals,
            )
        ]
        if n:
            mean = self.sink_logit()[sink].mean(0)  # [B]
            j = int(mean.argmax())
            by_band = {nm: round(float(v), 2) for nm, v in zip(self.band_names, mean)}
            vals = {
                "sink_logit": round(float(mean.sum()), 2),
                "band": self.band_names[j],
                "by_band": by_band,
            }
            others = ", ".join(
                f"{nm} {fixed(v)}" for nm, v in by_band.items() if nm != self.band_names[j]
            )
            out.append(
                Finding(
                    "sinks-1",
                    "attention-sinks",
                    f"In sinking heads the sink logit averages {fixed(vals['sink_logit'])}; band "
                    f"{self.band_names[j]} gives {fixed(by_band[self.band_names[j]])} of it "
                    f"({percent(float(mean[j] / mean.sum()))})"
                    + (f"; the other bands {others}." if others else "."),
                    vals,
                )
            )
        out.append(self._key_finding())
        return out

    def _key_finding(self) -> Finding:
        """How the key at position 0 compares with the other keys, plane by plane."""
        r = self.plane_key_ratio()
        vals = {
            "median": round(float(r.nanmedian()), 2),
            "min": round(float(r.nan_to_num(float("inf")).min()), 2),
            "max": round(float(r.nan_to_num(float("-inf")).max()), 2),
        }
        return Finding(
            "sinks-2",
            "attention-sinks",
            f"The key at position 0 has {vals['median']:.2f}× the mean per-plane norm of "
            f"other keys (median over layers; {vals['min']:.2f}× to {vals['max']:.2f}×).",
            vals,
        )

    # ---------------------------------------------------------------- persistence


@corpus_analysis(n_ctx=256, max_tokens=16_384)
def attention_sinks(
    model,
    corpus,
    run: RunOptions,
    *,
    bands: Bands | None = None,
    epsilon: float = EPSILON,
    skip_queries: int = 4,
    tile: int | None = None,
) -> AttentionSinks:
    """Attention to the first position, split by band, and the sink key's norms over a corpus.

    After Gu et al. (2024, "When Attention Sink Emerges in Language Models"): a head *sinks* on
    position 0 (the BOS token, since windows start with it) when its attention there, averaged over
    the queries at positions ≥ ``skip_queries`` that see it, exceeds ``epsilon``. Per layer × head
    it also splits the sink logit (the logit at key 0 minus the mean logit over the query's other
    keys) exactly into one term per band, and compares the key at position 0 with the other keys,
    band by band (see :class:`SinkReducer`).

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
        n_ctx (int): Tokens per window, BOS first (default 256).
        max_tokens (int | None): Corpus tokens to read (default 16384; None: all of it).
        layers (Sequence[int] | None): Layer indices to measure (default None: every rotary layer).
        text_column (str): The column of a table or dataset corpus that holds the text (default
            "text").
        bands (Bands | None): The plane groups (default None: :meth:`Bands.default`, four
            quantiles).
        epsilon (float): The attention to position 0 above which a head sinks (default 0.3, Gu et
            al.'s threshold).
        skip_queries (int): Queries at positions below this are left out, ≥ 1 (default 4; position 0
            sees only itself).
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
        AttentionSinks: Sums per ``[layer, head]`` (attention to position 0, share of queries above
        ``epsilon``), ``[layer, head, band]`` (sink logit terms) and ``[layer, kv_head, band]`` (key
        norms at position 0 and elsewhere); ``sinking()`` calls the heads.

    Raises:
        InputError: When ``layers`` selects no layer the model has, the corpus cannot be read, or
            ``epsilon`` / ``skip_queries`` / ``tile`` is out of range (the message names the problem
            and the fix).
        UnsupportedModelError: When ``verify`` finds that the RoPE reading does not reproduce the
            model's own attention.

    Examples:
        >>> from ropelens.analyses import attention_sinks
        >>> from ropelens.testing import tiny_model
        >>> model = tiny_model("llama")
        >>> sinks = attention_sinks(model, n_ctx=32, max_tokens=128, progress=False)
        >>> sinks.epsilon, tuple(sinks.mean_attention().shape)  # [layer, head]
        (0.3, (2, 4))
        >>> sinks.band_names
        ('Q1 (highest)', 'Q2', 'Q3', 'Q4 (lowest)')
    """
    bands = bands or Bands.default()
    m = measure(
        model,
        corpus,
        lambda spec, chosen, _: SinkReducer(
            spec, chosen, bands, epsilon=epsilon, skip_queries=skip_queries, tile=tile
        ),
        run,
        analysis="attention sinks",
        config=lambda reds: reds[0].config(),
        resume={"tile": tile},
    )
    return m.reducer.result(m.provenance)


def _sink_count(n: int, total: int) -> str:
    """The sinking heads, counted: "137 of 270 heads (51%)", "all 9 heads", "the one head"."""
    text = count_of(n, total, "head")
    text = text[0].upper() + text[1:]
    return text + (f" ({percent(n / total)})" if 0 < n < total else "")


def _layer_range(share: Tensor, layers: Sequence[int]) -> str:
    """How the share of sinking heads varies over layers ("" for one layer or none measured)."""
    if len(layers) < 2:
        return ""
    lo, hi = int(share.nan_to_num(2).argmin()), int(share.nan_to_num(-1).argmax())
    if float(share[lo]) == float(share[hi]):
        return f"the share is {percent(float(share[lo]))} in every layer; "
    return (
        f"per layer the share runs from {percent(float(share[lo]))} (layer {layers[lo]}) to "
        f"{percent(float(share[hi]))} (layer {layers[hi]}); "
    )
