"""Positional vs content heads: offset-attention scores, a data-chosen threshold, band profiles.

A head is *positional* when one fixed relative offset δ* = q − k wins both on real text and on
uniformly random tokens (content removed) and holds attention mass ≥ τ on both. τ is Otsu's
threshold on the per-head *robust offset mass* (the smaller of the two masses at the text-best
offset), floored at :data:`TAU_FLOOR`: Otsu's split maximises the between-class variance, i.e. it
finds the valley of a bimodal distribution without binning; the floor keeps a unimodal
distribution of weak masses (no positional heads) from being split in two.

Band content vs position (:meth:`HeadTaxonomy.position_share`): for each band b, take its logit
term x_b(q, q − δ) at the local offsets δ = 0..max_offset (keys at position 0 excluded). By the law
of total variance, Var(x_b) = E_δ[Var(x_b | δ)] + Var_δ(E[x_b | δ]): the first term is variance
across content at a fixed offset, the second variance across offsets of the content-averaged logit.
``position_share`` = second / total (η² of offset); ``content_var`` = the first term. Neither is
shift-invariant-by-construction: a band whose q and k do not depend on the token has
position_share 1, one whose logit is content noise around a constant has 0.
"""

from __future__ import annotations

import functools
import math
import os
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import einops
import pandas as pd
import torch
from jaxtyping import Bool, Float, Int
from torch import Tensor

from ropelens.analyses.band_statistics import BandStatsReducer
from ropelens.errors import InputError
from ropelens.results.figures import figure_of
from ropelens.results.provenance import Provenance
from ropelens.results.result import Result
from ropelens.run import data
from ropelens.run.capture import DeviceSums, LayerActs, query_tile, sum_dtype
from ropelens.run.measure import RunOptions, Windows, measure
from ropelens.spec.bands import Bands
from ropelens.spec.reading import hf_model_of, rope_spec
from ropelens.spec.rope import LayerRope, RopeSpec, expand_kv
from ropelens.spec.surface import running_model

__all__ = [
    "HeadScoresReducer",
    "HeadTaxonomy",
    "TAU_FLOOR",
    "head_taxonomy",
    "otsu_threshold",
    "random_tokens",
]

TAU_FLOOR = 0.3  # below this an offset holds less than a third of attention: not "one fixed offset"
TAU_METHOD = f"otsu(robust offset mass), floor {TAU_FLOOR}"


# ============================================================================ streaming scores
class HeadScoresReducer(DeviceSums):
    """Streams per layer × head: attention mass at each offset 0..max_offset and on position 0,
    and per band × offset the moments of the band logit term (for the content/position split).

    Needs only post-RoPE queries and keys (so the model runs with its own fast attention): the
    attention on position 0 and on the first offsets is rebuilt from the scores in query tiles that
    hold each query's whole key range, with the layer's mask, window, soft-capping and sinks; memory
    is O(tile · n). Sums accumulate in float64 (float32 on MPS) on the device of the first
    activations, with no host synchronisation per update."""

    # masks built from positions: refused where the model picks keys from the input
    static_mask = "head scores"
    needs = frozenset({"q_post", "k_post"})

    def __init__(
        self, spec: RopeSpec, layers: Sequence[int], bands: Bands, max_offset: int
    ) -> None:
        if not isinstance(max_offset, int) or max_offset < 1:
            raise InputError(
                f"max_offset must be an int ≥ 1 (1 = previous token), got {max_offset!r}"
            )
        self.spec, self.layers, self.max_offset = spec, list(layers), max_offset
        self.pos = {l_: i for i, l_ in enumerate(self.layers)}
        rbs = [bands.resolve(spec.layers[L]) for L in self.layers]
        self.band_names = rbs[0].names
        if any(rb.names != self.band_names for rb in rbs):
            raise InputError(
                f"bands {bands.describe()} resolve to different band names across layers"
            )
        self.member = {
            L: rb.dim_membership() for L, rb in zip(self.layers, rbs, strict=True)
        }  # dims → bands
        n_b, n_d = rbs[0].n_bands, max_offset + 1
        # layers of different widths padded to the most heads: NaN past a layer's own
        # (RopeSpec.padded_zeros)
        z = functools.partial(spec.padded_zeros, self.layers)
        self.sums = {
            "mass": z("head", n_d),
            "n_offset": z(n_d),
            "sink": z("head"),
            "n_sink": z(),
            "band_sum": z("head", n_b, n_d),
            "band_sq": z("head", n_b, n_d),
        }
        self._member: dict[tuple[int, torch.device], Tensor] = {}

    def _members(self, layer: int, device: torch.device) -> Tensor:
        """The layer's ``[d_head, band]`` membership on ``device``, copied there once."""
        key = (layer, device)
        if key not in self._member:
            self._member[key] = self.member[layer].to(device)
        return self._member[key]

    def _offsets(self, rope: LayerRope, n: int) -> range:
        """Offsets 0 … max_offset that some query of an ``n``-token window can attend at."""
        return range(min(self.max_offset + 1, n - 1, rope.window or n))

    def _attention(
        self, q: Tensor, k: Tensor, valid: Tensor, rope: LayerRope
    ) -> tuple[Tensor, Tensor]:
        """The model's attention on position 0 (queries 1 … n−1) and at each offset δ (queries
        δ+1 … n−1), ``[b, head, n-1]`` and ``[offset, b, head, n-1]`` (zero where there is no
        such query), rebuilt from the scaled scores ``q``·``k`` in query tiles that hold each
        query's whole key range: the layer's mask, window, soft-capping and sinks applied as the
        model applies them."""
        b, n, H, d = q.shape
        KV, G = rope.n_kv_heads, rope.group_size
        dev = q.device
        qh = q.view(b, n, KV, G, d).permute(0, 2, 3, 1, 4)  # [b,KV,G,n,d]
        kh = k.permute(0, 2, 3, 1)  # [b,KV,d,n]
        pos = torch.arange(n, device=dev)
        offsets = self._offsets(rope, n)
        sink = q.new_zeros(b, H, n)
        diag = q.new_zeros(len(offsets), b, H, n)
        tq = query_tile(dev, b * H * min(n, rope.window or n))
        for c0 in range(1, n, tq):
            c1 = min(n, c0 + tq)
            k0 = max(0, c0 - rope.window + 1) if rope.window else 0
            qp, kp = pos[c0:c1, None], pos[None, k0:c1]
            ok = (kp <= qp) & ((qp - kp) < rope.window if rope.window else True)
            ok = ok[None] & valid[:, None, k0:c1]  # [b,c,keys]
            y = torch.matmul(qh[:, :, :, c0:c1].reshape(b, KV, G * (c1 - c0), d), kh[..., k0:c1])
            p = rope.probs(y.view(b, H, c1 - c0, c1 - k0).masked_fill(~ok[:, None], float("-inf")))
            if k0 == 0:
                sink[..., c0:c1] = p[..., 0]
            for j, off in enumerate(offsets):
                lo = max(c0, off + 1)
                if lo < c1:
                    qi = torch.arange(lo, c1, device=dev)
                    diag[j, :, :, lo:c1] = p[:, :, qi - c0, qi - off - k0]
        return sink[..., 1:], diag[..., 1:]

    @torch.no_grad()
    def update(self, acts: LayerActs) -> None:
        """Add one layer's sink and per-offset attention mass and band logit moments.

        For an offset d, query i + d attends to key i (i ≥ 1): x is the band logit of that pair.
        """
        layer_slot, rope, valid = self.pos[acts.layer], acts.rope, acts.valid
        # scaled so plane products are logit terms
        queries = acts["q_post"].float() * rope.score_scale
        device = queries.device
        sums = self._on(device)
        sums_device, sums_dtype = sums["mass"].device, sums["mass"].dtype
        wide = sum_dtype(device)
        membership = self._members(acts.layer, device)
        # a layer narrower than the widest adds into its leading heads
        _, n_positions, n_heads, _ = queries.shape
        sink, diagonals = self._attention(queries, acts["k_post"].float(), valid, rope)
        keys = expand_kv(acts["k_post"].float(), rope)
        real_queries = (valid[:, 1:] & valid[:, :1]).float()  # queries ≥ 1 that are real
        sink_mass = einops.reduce(
            (sink * real_queries[:, None]).to(wide), "batch head query -> head", "sum"
        )
        sums["sink"][layer_slot, :n_heads] += sink_mass.to(sums_device, sums_dtype)
        sums["n_sink"][layer_slot] += real_queries.sum().to(sums_device, sums_dtype)
        for d in self._offsets(rope, n_positions):
            # keys at position 0 are excluded: mass there is the sink, not an offset;
            # [batch, pair]: the pairs (query i + d, key i), i ≥ 1
            pairs = (valid[:, d + 1 :] & valid[:, 1 : n_positions - d]).float()
            mass = einops.reduce(
                (diagonals[d][..., d:] * pairs[:, None]).to(wide), "batch head pair -> head", "sum"
            )
            sums["mass"][layer_slot, :n_heads, d] += mass.to(sums_device, sums_dtype)
            sums["n_offset"][layer_slot, d] += pairs.sum().to(sums_device, sums_dtype)
            # float64 sums: content variance is E[x²] − E[x]², which cancels for positional bands
            band_logits = ((queries[:, d + 1 :] * keys[:, 1 : n_positions - d]) @ membership).to(
                wide
            )
            weights = einops.rearrange(pairs.to(wide), "batch pair -> batch pair 1 1")
            band_sum = einops.reduce(
                band_logits * weights, "batch pair head band -> head band", "sum"
            )
            band_square_sum = einops.reduce(
                band_logits * band_logits * weights, "batch pair head band -> head band", "sum"
            )
            sums["band_sum"][layer_slot, :n_heads, :, d] += band_sum.to(sums_device, sums_dtype)
            sums["band_sq"][layer_slot, :n_heads, :, d] += band_square_sum.to(
                sums_device, sums_dtype
            )

    def scores(self, prefix: str) -> dict[str, Tensor]:
        """Mean offset mass, sink mass, band position share and content variance, keys prefixed (on
        the CPU, float64; NaN past a layer's own heads)."""
        s = {k: v.detach().to("cpu", torch.float64) for k, v in self.sums.items()}
        cnt = s["n_offset"][:, None, :].clamp_min(1)
        mean = s["band_sum"] / cnt[:, :, None]
        within = s["band_sq"] / cnt[:, :, None] - mean**2
        wt = s["n_offset"] / s["n_offset"].sum(-1, keepdim=True).clamp_min(1)  # [L, δ]
        wt = wt[:, None, None, :]
        content = (within * wt).sum(-1).clamp_min(0)
        grand = (mean * wt).sum(-1, keepdim=True)
        position = ((mean - grand) ** 2 * wt).sum(-1)
        return {
            f"mass_{prefix}": s["mass"] / cnt,
            f"sink_{prefix}": s["sink"] / s["n_sink"][:, None].clamp_min(1),
            f"position_share_{prefix}": position / (position + content).clamp_min(1e-30),
            f"content_var_{prefix}": content,
        }


# ============================================================================ threshold
def otsu_threshold(values: Float[Tensor, " n"]) -> float:
    """Otsu's threshold of a 1-D sample: the cut maximising between-class variance (exact, no
    bins)."""
    v = torch.as_tensor(values, dtype=torch.float64).flatten().sort().values
    if v.numel() < 2 or float(v[-1] - v[0]) == 0.0:
        raise InputError(f"Otsu needs at least two distinct values, got {v.tolist()}")
    n = v.numel()
    csum = v.cumsum(0)
    k = torch.arange(1, n, dtype=torch.float64)  # size of the lower class
    mu0 = csum[:-1] / k
    mu1 = (csum[-1] - csum[:-1]) / (n - k)
    between = (k / n) * (1 - k / n) * (mu0 - mu1) ** 2
    between[v[1:] == v[:-1]] = -1.0  # cannot cut between equal values
    j = int(between.argmax())
    return float((v[j] + v[j + 1]) / 2)


# ============================================================================ result
# unversioned: files from before the result base carry a type but no format
@dataclass(frozen=True)
class HeadTaxonomy(Result, unversioned=True):
    """Per-head positional scores (text and random tokens), τ, and band profiles.

    Layers of different widths (Gemma 4) share one ``[layer, head, ...]`` array per score, padded to
    the most heads: every score of a head a layer lacks is NaN (:meth:`present`), and the
    classification, the tables and τ's threshold leave those heads out.

    Built by :func:`head_taxonomy`. A head is *positional* (:meth:`positional`) when one fixed
    offset δ* = q − k wins on real text and on seeded random tokens and its *robust offset mass*
    (the smaller of the two masses at δ*, :meth:`robust_mass`) is ≥ τ. Barbero et al. (2025,
    "Round and Round We Go!") found such diagonal and previous-token heads in Gemma 7B by eye and
    saw them use the highest frequencies; the band profiles here (``margin_share``,
    ``position_share_*``) test that per head.

    Attributes:
        layers (tuple[int, ...]): The measured layers, in the order of the ``layer`` axis.
        band_names (tuple[str, ...]): Band names, in the order of the ``band`` axis.
        scores (dict[str, Tensor]): Per-head scores, all ``[layer, head, ...]``: ``mass_text`` and
            ``mass_random`` ``[layer, head, offset]`` (attention mass at offsets
            0..max_offset); ``sink_text``, ``sink_random`` (mass on position 0), ``top_plane`` and
            ``top_plane_tightness`` ``[layer, head]``; ``position_share_text``,
            ``position_share_random``, ``content_var_text``, ``content_var_random``,
            ``margin_share``, ``var_share``, ``cs_term`` and ``cs_bound``
            ``[layer, head, band]``.
        tau (float): Threshold on the robust offset mass, in [0, 1]: Otsu's split of the heads'
            robust masses, floored at ``TAU_FLOOR`` = 0.3, unless given.
        provenance (Provenance): Model, corpus, token count, options (bands, max_offset, seed,
            the Otsu value) and versions.

    Raises:
        InputError: When ``scores["mass_text"]`` does not have one row per layer or ``tau`` is
            outside [0, 1].

    Examples:
        >>> import torch
        >>> from ropelens.analyses import head_taxonomy
        >>> from ropelens.testing import tiny_model
        >>> tokens = torch.randint(4, 100, (2, 16), generator=torch.Generator().manual_seed(0))
        >>> model = tiny_model("llama")
        >>> tax = head_taxonomy(model, tokens, max_offset=2, layers=[1], progress=False)
        >>> tax.max_offset, tuple(tax.scores["mass_text"].shape)  # [layer, head, offset]
        (2, (1, 4, 3))
        >>> [len(row) for row in tax.kinds()]  # one kind per head of each layer
        [4]
        >>> tax.with_tau(1.0).positional().any().item()  # no head holds all its attention
        False
    """

    layers: tuple[int, ...]
    band_names: tuple[str, ...]
    scores: dict[str, Tensor]  # see head_taxonomy for the keys and shapes
    tau: float
    provenance: Provenance

    def __post_init__(self) -> None:
        shape = tuple(self.scores["mass_text"].shape)
        if shape[0] != len(self.layers):
            raise InputError(
                f"mass_text has shape {shape}, expected ({len(self.layers)}, heads, offsets)"
            )
        if not 0.0 <= self.tau <= 1.0:
            raise InputError(f"tau is an attention mass in [0, 1], got {self.tau}")

    def present(self) -> Bool[Tensor, "layer head"]:
        """The heads each layer has (all True when the measured layers share one width)."""
        return ~self.scores["sink_text"].isnan()

    @property
    def max_offset(self) -> int:
        """The largest offset scored (offsets run 0..max_offset)."""
        return self.scores["mass_text"].shape[-1] - 1

    def best_offset(self) -> Int[Tensor, "layer head"]:
        """Offset with the most mass on real text (0 for heads a layer lacks)."""
        return self.scores["mass_text"].nan_to_num(nan=-math.inf).argmax(-1)

    def offset_mass(self) -> tuple[Float[Tensor, "layer head"], Float[Tensor, "layer head"]]:
        """Mass at the text-best offset on text and on random tokens."""
        best = self.best_offset()[..., None]
        return self.scores["mass_text"].gather(-1, best)[..., 0], self.scores["mass_random"].gather(
            -1, best
        )[..., 0]

    def robust_mass(self) -> Float[Tensor, "layer head"]:
        """min(text, random) mass at the text-best offset; 0 where random tokens prefer another
        offset (NaN for heads a layer lacks)."""
        text, rand = self.offset_mass()
        agree = self.best_offset() == self.scores["mass_random"].nan_to_num(nan=-math.inf).argmax(
            -1
        )
        robust = torch.where(agree, torch.minimum(text, rand), torch.zeros_like(text))
        return robust.masked_fill(~self.present(), math.nan)

    def positional(self) -> Bool[Tensor, "layer head"]:
        """Whether each head's robust offset mass reaches τ."""
        return self.robust_mass() >= self.tau

    def kinds(self) -> list[list[str]]:
        """diagonal / previous-token / offset-δ / sink / content for each (layer, head), each
        layer's row as long as its own heads."""
        pos, best, (text, _) = self.positional(), self.best_offset(), self.offset_mass()
        sink = self.scores["sink_text"]
        names = {0: "diagonal", 1: "previous-token"}
        n_heads = self.present().sum(1).tolist()
        out = []
        for li in range(len(self.layers)):
            row = []
            for h in range(n_heads[li]):
                if pos[li, h]:
                    row.append(names.get(int(best[li, h]), f"offset-{int(best[li, h])}"))
                elif sink[li, h] >= self.tau and sink[li, h] >= text[li, h]:
                    row.append("sink")
                else:
                    row.append("content")
            out.append(row)
        return out

    def with_tau(self, tau: float) -> HeadTaxonomy:
        """A copy classified with another threshold."""
        return replace(self, tau=float(tau))

    def to_frame(self) -> pd.DataFrame:
        """One row per (layer, head) of the layer's own heads: offset masses, flag, kind, band
        profiles, top-plane tightness."""
        s, (text, rand) = self.scores, self.offset_mass()
        n_l, n_h = text.shape
        have = self.present().flatten().numpy()
        cols: dict[str, Any] = {
            "layer": [L for L in self.layers for _ in range(n_h)],
            "head": list(range(n_h)) * n_l,
            "positional": self.positional().flatten().tolist(),
            "best_offset": self.best_offset().flatten().tolist(),
            "mass_text": text.flatten().tolist(),
            "mass_random": rand.flatten().tolist(),
            "robust_mass": self.robust_mass().flatten().tolist(),
            "sink_text": s["sink_text"].flatten().tolist(),
            "sink_random": s["sink_random"].flatten().tolist(),
            "top_plane": s["top_plane"].flatten().long().tolist(),
            "top_plane_tightness": s["top_plane_tightness"].flatten().tolist(),
        }
        for d in range(self.max_offset + 1):
            cols[f"text_d{d}"] = s["mass_text"][..., d].flatten().tolist()
            cols[f"random_d{d}"] = s["mass_random"][..., d].flatten().tolist()
        for key in (
            "margin_share",
            "var_share",
            "position_share_text",
            "position_share_random",
            "content_var_text",
        ):
            for b, name in enumerate(self.band_names):
                cols[f"{key}[{name}]"] = s[key][..., b].flatten().tolist()
        df = pd.DataFrame(cols)[have].reset_index(drop=True)
        df.insert(2, "kind", [k for row in self.kinds() for k in row])
        return df

    def scatter(self) -> Any:
        """Offset mass on text vs random tokens, one trace per kind."""
        return figure_of(HeadTaxonomy, "scatter")(self)

    def _repr_html_(self) -> str:
        return self.figure().to_html(include_plotlyjs="cdn", full_html=False)


# ============================================================================ entry point
def random_tokens(
    n_windows: int, n_ctx: int, vocab: int, bos: int | None, seed: int
) -> Int[Tensor, "n pos"]:
    """Uniform token ids over ``vocab`` (BOS first when given), from a seeded generator."""
    if vocab < 2:
        raise InputError(f"vocab must be ≥ 2 to draw random tokens, got {vocab}")
    g = torch.Generator().manual_seed(int(seed))
    toks = torch.randint(0, vocab, (n_windows, n_ctx), generator=g)
    if bos is not None:
        toks[:, 0] = bos
    return toks


def _band_profile(band: BandStatsReducer, prov: Provenance) -> dict[str, Tensor]:
    """Margin/variance share per band, attended-key logit and CS bound per band, top-plane
    tightness."""
    st = band.result(prov)
    term, bound = st.sums["cs_term"], st.sums["cs_bound"]  # [L,H,P], sums over queries
    n = st.sums["n_rows"][:, None, None].clamp_min(1)
    rb = [band.resolved[L] for L in band.layers]

    def per_band(x):
        return torch.stack(
            [
                torch.stack([x[i][:, list(p)].sum(-1) for p in r.planes], -1)
                for i, r in enumerate(rb)
            ]
        )

    top = term.nan_to_num(nan=-math.inf).argmax(
        -1
    )  # over the layer's own planes (the rest are NaN)
    missing = ~st.present()
    return {
        "margin_share": st.margin_share().double(),
        "var_share": st.var_share().double(),
        "cs_term": per_band(term / n),
        "cs_bound": per_band(bound / n),
        "top_plane": top.double().masked_fill(missing, math.nan),
        "top_plane_tightness": st.tightness().double().gather(-1, top[..., None])[..., 0],
    }


def head_taxonomy(
    model,
    corpus=None,
    *,
    n_ctx: int = 256,
    n_windows: int = 8,
    max_offset: int = 16,
    bands: Bands | None = None,
    layers: Sequence[int] | None = None,
    seed: int = 0,
    batch_size: int = 4,
    tau: float | None = None,
    progress: bool = True,
    checkpoint: str | os.PathLike[str] | None = None,
    checkpoint_every: int = 8,
    verify: bool = True,
    text_column: str = "text",
) -> HeadTaxonomy:
    """Score every head on text windows and on seeded random tokens, and classify it.

    Each head's attention mass at the offsets 0..max_offset and on position 0 is measured twice:
    on the corpus and on uniformly random tokens of the same shape (content removed). A head whose
    best offset is the same on both and holds mass ≥ τ on both is positional (diagonal,
    previous-token or offset-δ); one that puts ≥ τ on position 0 instead is a sink; the rest are
    content heads. τ is Otsu's threshold on the robust offset mass, floored at ``TAU_FLOOR`` = 0.3.
    Score keys, all ``[layer, head, ...]``: ``mass_{text,random}`` (offset),
    ``sink_{text,random}``, ``position_share_{text,random}`` and ``content_var_{text,random}``
    (band), ``margin_share``, ``var_share``, ``cs_term``, ``cs_bound`` (band, at the attended key),
    ``top_plane``, ``top_plane_tightness``.

    Args:
        model: A loaded model (``ropelens.load_model()``, a tiny test model, or a wrapped HF model).
        corpus: A corpus, its name, or an integer ``[n_windows, n_ctx]`` token tensor; None for
            the default (english).
        n_ctx (int): Tokens per window cut from a corpus (ignored for a token tensor).
        n_windows (int): Windows cut from a corpus (ignored for a token tensor).
        max_offset (int): Largest offset δ = q − k scored (default 16).
        bands (Bands | None): Bands of the band profiles; None for ``Bands.default()``
            (quartiles).
        layers (Sequence[int] | None): Layers to measure; None for every attention layer.
        seed (int): Seed of the random tokens.
        batch_size (int): Windows per forward pass.
        tau (float | None): A threshold in [0, 1] to use instead of Otsu's.
        progress (bool): Show a progress bar.
        checkpoint (str | PathLike | None): A directory that saves both passes' progress to resume
            a killed run (``text/`` and ``random/`` in it); None for none.
        checkpoint_every (int): Batches between checkpoints.
        verify (bool): Check the RoPE reading against the model's own attention first (False:
            results say unverified).
        text_column (str): The text column of a table or dataset corpus.

    Returns:
        HeadTaxonomy: The per-head scores, τ and band profiles; ``kinds()`` names each head.

    Examples:
        >>> import torch
        >>> from ropelens.analyses import head_taxonomy
        >>> from ropelens.testing import tiny_model
        >>> tokens = torch.randint(4, 100, (2, 16), generator=torch.Generator().manual_seed(0))
        >>> model = tiny_model("llama")
        >>> tax = head_taxonomy(model, tokens, max_offset=2, layers=[0], progress=False)
        >>> tax.tau >= 0.3  # Otsu's threshold, floored at TAU_FLOOR
        True
        >>> set(tax.kinds()[0]) <= {"diagonal", "previous-token", "offset-2", "sink", "content"}
        True
        >>> tax.provenance.config["tau_method"]
        'otsu(robust offset mass), floor 0.3'
    """
    model = running_model(model)  # an nnsight model: the HF model it wraps
    bands = bands or Bands.default()
    spec = rope_spec(model)
    if isinstance(corpus, Tensor):
        text = Windows(corpus.long(), "tokens", None)
    else:
        c = data.load_corpus(corpus, text_column=text_column)
        text = Windows(
            data.windows(c, model.tokenizer, n_ctx, n_windows=n_windows), c.name, c.sha256
        )
    vocab = min(len(model.tokenizer), hf_model_of(model).get_input_embeddings().num_embeddings)
    rand = random_tokens(text.n_windows, text.n_ctx, vocab, model.tokenizer.bos_token_id, seed)
    chosen = spec.layer_indices(layers)
    # both passes' reducers exist before the first forward: a bad setting fails before any work
    heads_text, heads_rand = (HeadScoresReducer(spec, chosen, bands, max_offset) for _ in range(2))
    run = RunOptions(
        layers=chosen,
        batch_size=batch_size,
        progress=progress,
        checkpoint_every=checkpoint_every,
        verify=verify,
    )

    def ck(part: str) -> str | None:  # each pass resumes from its own folder
        return None if checkpoint is None else os.path.join(checkpoint, part)

    m = measure(
        model,
        None,
        lambda *_: [heads_text, BandStatsReducer(spec, chosen, bands)],
        replace(run, checkpoint=ck("text")),
        windows=text,
        spec=spec,
        analysis="heads",
        config={
            "bands": bands.describe(),
            "max_offset": max_offset,
            "seed": seed,
            "random_vocab": vocab,
            "tau_method": TAU_METHOD if tau is None else "given",
        },
        desc="heads: text",
    )
    band = m.reducers[1]
    rm = measure(
        model,
        None,
        lambda *_: heads_rand,
        replace(run, checkpoint=ck("random")),
        windows=Windows(rand),
        spec=spec,
        analysis="heads: random tokens",
        desc="heads: random tokens",
    )
    prov = replace(m.provenance, seconds=m.provenance.seconds + rm.provenance.seconds)
    scores = {
        **heads_text.scores("text"),
        **heads_rand.scores("random"),
        **_band_profile(band, prov),
    }
    tx = HeadTaxonomy(tuple(chosen), tuple(heads_text.band_names), scores, 0.0, prov)
    if tau is None:
        robust = tx.robust_mass()[
            tx.present()
        ]  # heads a layer lacks (layers of other widths) take no part
        otsu = otsu_threshold(robust) if robust.unique().numel() > 1 else None
        prov.config["otsu"] = otsu  # reported even when the floor wins
        tau = TAU_FLOOR if otsu is None else max(TAU_FLOOR, otsu)
    return tx.with_tau(tau)
