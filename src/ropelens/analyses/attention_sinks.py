"""Attention sinks per head and per band (Gu et al. 2024, "When Attention Sink Emerges in Language Models").

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

import numpy as np
import pandas as pd
import torch
from jaxtyping import Bool, Float
from torch import Tensor

from ropelens.errors import InputError
from ropelens.results.findings import Finding
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

    static_mask = "attention sinks"  # masks built from positions: refused where the model picks keys from the input
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
                f"bands {self.bands.describe()} resolve to different band names across layers: {names}; "
                "pick layers of one kind (layers=...) or bands that name the same groups everywhere"
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
        i, rope, rb = self.pos[acts.layer], acts.rope, self.resolved[acts.layer]
        valid = acts.valid
        q_post, k_post, k_pre = acts["q_post"], acts["k_post"], acts["k_pre"]
        dev = q_post.device
        s = self._on(dev)
        here, sdt, dt = s["n_queries"].device, s["n_queries"].dtype, sum_dtype(dev)
        b, n, H, d = q_post.shape
        KV, G = rope.n_kv_heads, rope.group_size
        key = (acts.layer, str(dev))
        if key not in self._member:
            self._member[key] = rb.dim_membership().to(dev)
        member = self._member[key]
        vf = valid.float()
        q = q_post.float() * (
            vf[:, :, None, None] * rope.score_scale
        )  # [b,n,H,d], logits come out scaled
        k = k_post.float() * vf[:, :, None, None]  # [b,n,KV,d]
        pos = torch.arange(n, device=dev)
        n_keys = valid.long().cumsum(
            1
        )  # keys 0 … m that are real: all a query that sees key 0 may attend to
        reach = n if not rope.window else min(n, rope.window)  # queries m < reach see position 0
        used = (
            valid
            & valid[:, :1]
            & (pos >= self.skip_queries)[None]
            & (pos < reach)[None]
            & (n_keys >= 2)
        )
        uf = used.float()  # [b,n]
        s["n_queries"][i] += uf.sum().to(here, sdt)

        # band terms: logit at key 0 and the mean over the other allowed keys (keys 0 … m, by prefix sums)
        qg = q.view(b, n, KV, G, d)
        x0 = torch.matmul(qg * k[:, :1, :, None, :], member)  # [b,n,KV,G,B]
        ksum = k.to(dt).cumsum(1).float()  # [b,n,KV,d], summed in float64 (float32 on MPS)
        xrow = torch.matmul(qg * ksum[:, :, :, None, :], member)
        xo = (xrow - x0) / (n_keys - 1).clamp_min(1)[:, :, None, None, None].float()
        w = uf[:, :, None, None, None]
        P = rope.n_planes  # a layer narrower than the widest adds into its leading heads and planes
        s["x0_sum"][i, :H] += (x0 * w).to(dt).sum((0, 1)).reshape(H, -1).to(here, sdt)
        s["xo_sum"][i, :H] += (xo * w).to(dt).sum((0, 1)).reshape(H, -1).to(here, sdt)

        # the model's attention to position 0, rebuilt in query tiles that hold whole rows
        kh = k.permute(0, 2, 3, 1)  # [b,KV,d,n]
        qh = q.view(b, n, KV, G, d).permute(0, 2, 3, 1, 4)  # [b,KV,G,n,d]
        tq = self._tile(dev, b * H, reach)
        p0_sum, p0_over, mass = (q.new_zeros(H, dtype=dt) for _ in range(3))
        for c0 in range(min(self.skip_queries, reach), reach, tq):
            c1 = min(reach, c0 + tq)
            c = c1 - c0
            y = torch.matmul(qh[:, :, :, c0:c1].reshape(b, KV, G * c, d), kh[..., :c1]).view(
                b, H, c, c1
            )
            ok = (pos[None, :c1] <= pos[c0:c1, None])[None] & valid[
                :, None, :c1
            ]  # [b,c,c1]: keys 0 … m
            p = rope.probs(y.masked_fill(~ok[:, None], float("-inf")))  # [b,H,c,c1]
            u = uf[:, None, c0:c1]  # [b,1,c]
            p0 = p[..., 0]
            p0_sum += (p0 * u).to(dt).sum((0, 2))
            p0_over += ((p0 > self.epsilon).float() * u).to(dt).sum((0, 2))
            if rope.sinks is not None:
                mass += ((1 - p.sum(-1)).clamp_min(0) * u).to(dt).sum((0, 2))
            del y, p
        s["p0_sum"][i, :H] += p0_sum.to(here, sdt)
        s["p0_over"][i, :H] += p0_over.to(here, sdt)
        s["sink_mass"][i, :H] += mass.to(here, sdt)

        # key norms (pre-RoPE, as frequency usage measures them): position 0 against the rest
        kp = k_pre.float() * vf[:, :, None, None]
        planes = rope.plane_norms(kp)  # [b,n,KV,P]
        bandn = torch.matmul(kp * kp, member).clamp_min(0).sqrt()  # [b,n,KV,B]
        v0 = vf[:, 0]
        s["n_k0"][i] += v0.sum().to(here, sdt)
        s["n_kother"][i] += vf[:, 1:].sum().to(here, sdt)
        s["k0_band"][i, :KV] += (bandn[:, 0] * v0[:, None, None]).to(dt).sum(0).to(here, sdt)
        s["kother_band"][i, :KV] += bandn[:, 1:].to(dt).sum((0, 1)).to(here, sdt)
        s["k0_plane"][i, :KV, :P] += (planes[:, 0] * v0[:, None, None]).to(dt).sum(0).to(here, sdt)
        s["kother_plane"][i, :KV, :P] += planes[:, 1:].to(dt).sum((0, 1)).to(here, sdt)

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
    """Attention to the first position per layer × head, its band decomposition and the sink key's norms.

    Layers of different widths (Gemma 4's wider global heads) share one array per sum, padded to the most
    heads, KV heads and planes: every number past a layer's own reads NaN (:meth:`present`), tables leave
    those rows out, and findings and per-layer means skip them.
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
        """Each band's share of the full sink logit (sums to 1; negative where a band works against it)."""
        x = self.sink_logit()
        return x / x.sum(-1, keepdim=True)

    def key_norm(self, position: str = "sink") -> Float[Tensor, "layer kv_head band"]:
        """Mean norm of the pre-RoPE key's band part at position 0 (``"sink"``) or at the others (``"other"``)."""
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
        """Per layer: mean per-plane key norm at position 0 ÷ that at the other positions (heads and planes
        averaged) — the key sink ratio the frequency-usage report gives with ``n_sink=1`` on the same windows."""
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
        """One row per (layer, head) of the layer's own heads: attention to position 0, query share, sinking,
        learned sink, full sink logit and the band with the largest share of it."""
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
        """Tidy: one row per (layer, head, band) of the layer's own heads with the band's sink logit and share,
        the band's key-norm ratio of the head's KV head, and the head's attention to position 0."""
        L, H, B = self.sums["x0_sum"].shape
        layer, head, band = np.meshgrid(
            np.array(self.layers), np.arange(H), np.arange(B), indexing="ij"
        )
        # query head h reads KV head h // group, the group of its own layer (layers of other widths differ)
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
        """How many heads sink and where; which band makes position 0 attractive in them (when any sink);
        how the key at position 0 compares with the other keys."""
        sink = self.sinking()  # False for heads a layer lacks
        n, total = int(sink.sum()), int(self.present().sum())
        share = self.head_share()
        lo, hi = int(share.nan_to_num(2).argmin()), int(share.nan_to_num(-1).argmax())
        vals = {
            "sinking_heads": n,
            "heads": total,
            "mean_attention": round(float(self.mean_attention().nanmean()), 2),
        }
        out = [
            Finding(
                "sinks-0",
                "attention-sinks",
                f"{n} of {total} heads ({n / total:.0%}) sink on position 0 (mean attention over queries "
                f"m ≥ {self.skip_queries} above ε = {self.epsilon:g}); per layer the share runs from "
                f"{float(share[lo]):.0%} (layer {self.layers[lo]}) to {float(share[hi]):.0%} (layer "
                f"{self.layers[hi]}); mean attention to position 0 {vals['mean_attention']:.2f}.",
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
                f"{nm} {v:.2f}" for nm, v in by_band.items() if nm != self.band_names[j]
            )
            out.append(
                Finding(
                    "sinks-1",
                    "attention-sinks",
                    f"In sinking heads the sink logit averages {vals['sink_logit']:.2f}; band "
                    f"{self.band_names[j]} gives {by_band[self.band_names[j]]:.2f} of it "
                    f"({float(mean[j] / mean.sum()):.0%}), {others}.",
                    vals,
                )
            )
        r = self.plane_key_ratio()
        vals = {
            "median": round(float(r.nanmedian()), 2),
            "min": round(float(r.nan_to_num(float("inf")).min()), 2),
            "max": round(float(r.nan_to_num(float("-inf")).max()), 2),
        }
        out.append(
            Finding(
                "sinks-2",
                "attention-sinks",
                f"The key at position 0 has {vals['median']:.2f}× the mean per-plane norm of other keys "
                f"(median over layers; {vals['min']:.2f}× to {vals['max']:.2f}×).",
                vals,
            )
        )
        return out

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
    """Stream attention to the first position, its band decomposition and the sink key's norms over a
    corpus (see :class:`SinkReducer`). Windows start with BOS, so position 0 is the BOS token."""
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
