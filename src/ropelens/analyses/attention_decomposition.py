"""Exact per-plane and per-band decomposition of attention logits.

RoPE rotates each plane independently, so q_mᵀR((n−m)θ)k_n = Σ_i (q_m^(i))ᵀR((n−m)θ_i)k_n^(i):
with post-RoPE q and k, plane i's term is simply the 2-D dot product of their plane-i coordinates.
Band terms (sums of plane terms, plus non-rotary dims in ``rest``) times the model's score scale
add up to the model's own pre-softmax scores.
"""

from __future__ import annotations

import json
import operator
import time
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd
import torch
from jaxtyping import Bool, Float, Int
from torch import Tensor

from ropelens.devices import device_of, require_memory
from ropelens.errors import InputError, RopelensWarning
from ropelens.results.codec import decode, encode, field_types
from ropelens.results.figures import figure_of
from ropelens.results.provenance import Provenance, placement
from ropelens.results.result import Result
from ropelens.results.serialize import atomic_write
from ropelens.run.capture import LayerActs, capture_qk
from ropelens.run.memory import (
    band_mixer_bytes,
    band_terms_bytes,
    require_decomposition_room,
    trained_context,
)
from ropelens.run.texts import text_tokens
from ropelens.run.verify import verification
from ropelens.spec.bands import Bands, ResolvedBands
from ropelens.spec.reading import model_label, rope_spec
from ropelens.spec.rope import LayerRope, RopeSpec, expand_kv
from ropelens.spec.surface import running_model

# one input's logits are small enough to keep one band per plane (the command line's default too)
DEFAULT_BANDS = Bands.planes()

__all__ = ["AttentionDecomposition", "band_terms", "attention_decomposition", "js_divergence"]


def band_terms(
    q: Float[Tensor, "batch pos head d_head"],
    k: Float[Tensor, "batch pos kv_head d_head"],
    rope: LayerRope,
    bands: ResolvedBands,
) -> Float[Tensor, "batch head band q_pos k_pos"]:
    """Each band's share of every logit (post-RoPE q and k, times the model's score scale)."""
    k = expand_kv(k, rope)
    out = torch.stack(
        [torch.einsum("bqhd,bkhd->bhqk", q[..., d], k[..., d]) for d in bands.dims], dim=2
    )
    return out * rope.score_scale


def _turn_back(x: Float[Tensor, "batch pos head d"], rope: LayerRope) -> Tensor:
    """Head vectors at positions 0, 1, … turned back to what the rotation received."""
    pos = torch.arange(x.shape[1])
    back = rope.rotate(x.transpose(1, 2), -pos).transpose(1, 2)
    r = rope.rotary_dim  # rotate scaled the rotary dims once more: divide out both factors
    return torch.cat([back[..., :r] / rope.attention_scaling**2, back[..., r:]], dim=-1)


def _degrees_between(k: Tensor, q: Tensor) -> float:
    """The angle from 2-D vector ``k`` to ``q`` in degrees, in (−180, 180]."""
    diff = torch.atan2(q[1], q[0]) - torch.atan2(k[1], k[0])
    deg = float(torch.rad2deg(torch.atan2(diff.sin(), diff.cos())))
    return 180.0 if deg == -180.0 else deg


def js_divergence(p: Tensor, q: Tensor, dim: int = -1) -> Tensor:
    """Jensen–Shannon divergence (nats, in [0, ln 2]) between distributions along ``dim``."""
    m = 0.5 * (p + q)

    def kl(a):
        return torch.where(a > 0, a * (a.clamp_min(1e-30).log() - m.clamp_min(1e-30).log()), 0.0)

    return 0.5 * (kl(p).sum(dim) + kl(q).sum(dim))


SAFETENSORS_SUFFIX = (
    ".safetensors"  # a decomposition's file: tensors, with its header fields as JSON
)
# written as JSON in the safetensors header (token_text: absent from files written before it)
_HEADER_FIELDS = ("spec", "bands", "provenance", "token_text")


# ============================================================================ one input
@dataclass(frozen=True)
class AttentionDecomposition(Result):
    """Per-band attention logits for given tokens (kept in memory; for corpora use band_statistics).

    Saved as safetensors (captured q and k are too large for JSON), with the kind and format in its
    metadata.

    Built by :func:`attention_decomposition`. RoPE rotates each plane on its own, so every logit
    is exactly the sum of its plane terms; the band terms times the score scale add up to the
    model's own pre-softmax scores (:meth:`logits`), and through the layer's softmax they rebuild
    its pattern (:meth:`rebuilt_pattern`). :meth:`band_patterns` shows what each band attends to
    alone (Barbero et al., 2025, "Round and Round We Go!").

    Attributes:
        tokens (Tensor): ``[batch, pos]`` the token ids decomposed.
        spec (RopeSpec): The model's RoPE reading at this input's length.
        bands (Bands): The bands the logits are split into (default: one band per plane).
        acts (dict[int, LayerActs]): Per decomposed layer, the captured post-RoPE ``q_post``
            ``[batch, pos, head, d_head]``, ``k_post`` ``[batch, pos, kv_head, d_head]`` and
            ``pattern`` ``[batch, head, q, k]`` (on the CPU), with the layer's RoPE and valid
            mask.
        provenance (Provenance): Model, token count, bands, layers and the verification verdict.
        token_text (tuple[tuple[str, ...], ...] | None): Each token as the tokenizer decodes it,
            per batch row; None for a model without a tokenizer.

    Examples:
        >>> import torch
        >>> from ropelens import Bands
        >>> from ropelens.analyses import attention_decomposition
        >>> from ropelens.testing import tiny_model
        >>> model = tiny_model("llama")
        >>> dec = attention_decomposition(
        ...     model, "The cat sat.", bands=Bands.quantiles(2), layers=[1], verify=False
        ... )
        >>> dec.layers, dec.band_names(1)
        ([1], ['Q1 (highest)', 'Q2 (lowest)'])
        >>> tuple(dec.band_logits(1).shape)  # [batch, head, band, q, k]
        (1, 4, 2, 13, 13)
        >>> bool(torch.allclose(dec.rebuilt_pattern(1), dec.pattern(1), atol=1e-5))
        True
    """

    tokens: Int[Tensor, "batch pos"]
    spec: RopeSpec
    bands: Bands
    acts: dict[int, LayerActs]
    provenance: Provenance
    # each token as text, per batch row (what the model's tokenizer decodes it to), where known
    token_text: tuple[tuple[str, ...], ...] | None = field(default=None, kw_only=True)

    @property
    def layers(self) -> list[int]:
        """The decomposed layers, in order."""
        return sorted(self.acts)

    def _acts(self, layer: int) -> LayerActs:
        if layer not in self.acts:
            raise InputError(f"layer {layer} was not decomposed; decomposed layers: {self.layers}")
        return self.acts[layer]

    def resolved(self, layer: int) -> ResolvedBands:
        """The bands resolved on ``layer``'s planes (names, planes and dims of each)."""
        return self.bands.resolve(self.spec.layers[layer])

    def band_names(self, layer: int) -> list[str]:
        """The names of the bands on ``layer``, highest frequency first."""
        return list(self.resolved(layer).names)

    def mask(self, layer: int) -> Bool[Tensor, "batch q k"]:
        """The keys each query attends to (causal, window, padding, and the model's own key
        selection)."""
        return self._acts(layer).mask()

    def band_logits(
        self, layer: int, *, masked: bool = True
    ) -> Float[Tensor, "batch head band q k"]:
        """Band terms of every logit; masked entries are −inf (so they sum like the model's
        scores)."""
        a = self._acts(layer)
        self._require_terms_room(layer, self.resolved(layer).n_bands, "band")
        x = band_terms(a["q_post"], a["k_post"], a.rope, self.resolved(layer))
        if masked:
            x = x.masked_fill(~self.mask(layer)[:, None, None], float("-inf"))
        return x

    def logits(self, layer: int) -> Float[Tensor, "batch head q k"]:
        """Sum over bands: the model's pre-softmax scores (masked entries −inf)."""
        x = self.band_logits(layer, masked=False).sum(2)
        return x.masked_fill(~self.mask(layer)[:, None], float("-inf"))

    def pattern(self, layer: int) -> Float[Tensor, "batch head q k"]:
        """The model's own attention pattern (captured from the forward pass)."""
        return self._acts(layer)["pattern"]

    def band_patterns(self, layer: int) -> Float[Tensor, "batch head band q k"]:
        """The pattern each band's logits make alone, through the layer's own softmax (causal
        mask, sliding window, logit soft-capping and attention sinks applied as the model applies
        them)."""
        return self._acts(layer).rope.probs(self.band_logits(layer))

    def rebuilt_pattern(self, layer: int) -> Float[Tensor, "batch head q k"]:
        """The attention pattern rebuilt from the summed bands: equals the model's own pattern."""
        return self._acts(layer).rope.probs(self.logits(layer))

    def band_pattern(
        self,
        layer: int,
        bands: Sequence[str | int] | None = None,
        *,
        planes: Sequence[int] | None = None,
    ) -> Float[Tensor, "batch head q k"]:
        """The attention the model would have from the chosen bands (or planes) alone.

        The softmax of the chosen terms' summed logits, through the layer's own score scale,
        soft-capping, causal mask, sliding window and sinks: all bands give the model's pattern,
        none gives the pattern of all-zero logits (uniform over the allowed keys, less the sinks'
        share). ``bands``: names (``"Q1 (highest)"``, or its first word ``"Q1"``) or indices into
        :meth:`band_names`, ``"rest"`` being the dims no plane holds; ``planes``: plane indices,
        alone or added to ``bands``. Neither given: every band.
        """
        a = self._acts(layer)
        dims = self._chosen_dims(layer, bands, planes)
        q, k = a["q_post"][..., dims], expand_kv(a["k_post"], a.rope)[..., dims]
        scores = torch.einsum("bqhd,bkhd->bhqk", q, k) * a.rope.score_scale
        return a.rope.probs(scores.masked_fill(~self.mask(layer)[:, None], float("-inf")))

    def _chosen_dims(
        self, layer: int, bands: Sequence[str | int] | None, planes: Sequence[int] | None
    ) -> Tensor:
        """Head-dim indices of the chosen bands and planes (every dim when neither is given)."""
        rb = self.resolved(layer)
        if bands is None and planes is None:
            bands = range(rb.n_bands)
        bands, planes = _listed(bands), _listed(planes)
        chosen = [rb.dims[self._band_index(layer, b)] for b in bands]
        n_planes = self.spec.layers[layer].n_planes
        by_plane = Bands.planes().resolve(self.spec.layers[layer])
        for p in planes:
            if isinstance(p, bool) or not isinstance(p, int) or not 0 <= p < n_planes:
                raise InputError(
                    f"plane {p!r} is not a plane of layer {layer}: it has planes 0..{n_planes - 1}"
                )
            chosen.append(by_plane.dims[p])
        if not chosen:
            return torch.zeros(0, dtype=torch.long)
        return torch.unique(torch.cat(chosen))

    def _band_index(self, layer: int, band: str | int) -> int:
        """Index into :meth:`band_names` of a band given by index, name or its name's first word."""
        names = self.band_names(layer)
        if isinstance(band, int) and not isinstance(band, bool) and 0 <= band < len(names):
            return band
        if isinstance(band, str):
            exact = [i for i, n in enumerate(names) if n == band]
            short = [i for i, n in enumerate(names) if n.split(" ")[0] == band]
            if exact or len(short) == 1:
                return (exact or short)[0]
        raise InputError(
            f"band {band!r} is not a band of layer {layer}: choose from {names} (names, their "
            f"first word, or indices 0..{len(names) - 1})"
        )

    def _require_terms_room(self, layer: int, terms: int, what: str) -> None:
        """Refuse, before they exist, ``terms`` terms of every logit ``[batch, head, terms, n, n]``
        that the machine has not the room for (:mod:`ropelens.run.memory`)."""
        a = self._acts(layer)
        rows, n = int(self.tokens.shape[0]), int(self.tokens.shape[1])
        need = band_terms_bytes(rows, a.rope.n_heads, terms, n, a["q_post"].dtype)
        require_memory(
            need,
            f"the {terms} {what} terms of every logit of layer {layer} ([{rows}, "
            f"{a.rope.n_heads}, {terms}, {n}, {n}])",
            "decompose fewer tokens or texts, or fewer bands (bands=Bands.quantiles(4)); "
            "band_pattern(layer, bands) needs one [batch, head, n, n] pattern only",
            a["q_post"].device,
        )

    def plane_logits(self, layer: int) -> Float[Tensor, "batch head plane q k"]:
        """Per-plane terms (the single-plane decomposition), unmasked."""
        a = self._acts(layer)
        self._require_terms_room(layer, len(Bands.planes().resolve(a.rope).names), "plane")
        return band_terms(a["q_post"], a["k_post"], a.rope, Bands.planes().resolve(a.rope))[
            :, :, : a.rope.n_planes
        ]

    def pre_rope(
        self, layer: int
    ) -> tuple[Float[Tensor, "batch pos head d_head"], Float[Tensor, "batch pos kv_head d_head"]]:
        """The q and k the rotation received: the captured post-RoPE ones turned back by their
        position (:meth:`LayerRope.rotate` at −m, its attention scaling divided out, a query
        temperature undone), float64.

        Refused for a layer that normalises q and k after the rotation (``norm_after_rope``): the
        norm's per-position factors cannot be undone from its output.
        """
        a = self._acts(layer)
        rope = a.rope
        if rope.norm_after_rope or not rope.rotary:
            raise InputError(
                f"layer {layer} {'normalises q and k after' if rope.rotary else 'has no'} "
                "rotation: its pre-RoPE q and k cannot be recovered from the post-RoPE ones; "
                "capture them with ropelens.run.capture.capture_qk(which=('q_pre', 'k_pre'))"
            )
        q = rope.tempered(a["q_post"].to(torch.float64), inverse=True)
        return _turn_back(q, rope), _turn_back(a["k_post"].to(torch.float64), rope)

    def rotation(
        self,
        layer: int,
        head: int = 0,
        *,
        query: int | None = None,
        keys: Sequence[int] | None = None,
        planes: Sequence[int] | None = None,
        batch: int = 0,
    ) -> pd.DataFrame:
        """The rotation behind one head's plane terms: q at position ``query`` and k at ``keys`` as
        2-D vectors in each plane, before and after RoPE, with the angle between them and the
        plane's term of the logit.

        One row per (plane, vector): ``panel`` (which band's fastest or slowest plane), ``plane``,
        ``band``, ``wavelength`` (tokens per turn), ``role`` (``"q"``/``"k"``), ``position``, ``x``
        and ``y`` (post-RoPE plane coordinates, as they enter the score), ``pre_x``/``pre_y`` (the
        vector the rotation received: :meth:`pre_rope`; NaN where it cannot be recovered),
        ``turn`` (radians the rotation turned it: position·θ, signed by the model's direction) and,
        on key rows, ``angle`` (degrees from k to q, in (−180, 180]) and ``term`` (the plane's term
        of the logit, q^(i)·k^(i) × the score scale, as :meth:`plane_logits` gives it).

        Defaults: ``query`` the last real token, ``keys`` the query itself, the token before it,
        the middle one and the first (those the query sees), ``planes`` each band's fastest and
        slowest plane.
        """
        a = self._acts(layer)
        rope = a.rope
        query, keys = self._query_keys(layer, batch, query, keys)
        if not 0 <= head < rope.n_heads:
            raise InputError(
                f"head {head} is not a head of layer {layer}: pick 0..{rope.n_heads - 1}"
            )
        panels = self._rotation_panels(layer, planes)
        q = rope.split(a["q_post"][batch, query, head].to(torch.float64))
        k = rope.split(expand_kv(a["k_post"], rope)[batch, keys, head].to(torch.float64))
        try:
            q_pre, k_pre = self.pre_rope(layer)
            qp = rope.split(q_pre[batch, query, head])
            kp = rope.split(expand_kv(k_pre, rope)[batch, keys, head])
        except InputError:
            qp = torch.full_like(q, float("nan"))
            kp = torch.full_like(k, float("nan"))
        turn = rope.angles(torch.tensor([query, *keys]))  # [1 + keys, P]
        rows = []
        for label, band, p in panels:
            common = {"panel": label, "plane": p, "band": band}
            common["wavelength"] = float(rope.wavelength[p])
            vectors = [("q", query, q[p], qp[p], turn[0, p])]
            vectors += [("k", n, k[j, p], kp[j, p], turn[1 + j, p]) for j, n in enumerate(keys)]
            for role, pos, post, pre, t in vectors:
                row = {**common, "role": role, "position": pos, "x": float(post[0])}
                row |= {"y": float(post[1]), "pre_x": float(pre[0]), "pre_y": float(pre[1])}
                row["turn"] = float(t)
                if role == "k":
                    row["angle"] = _degrees_between(post, q[p])
                    row["term"] = float(post @ q[p]) * rope.score_scale
                rows.append(row)
        return pd.DataFrame(rows)

    def _query_keys(
        self, layer: int, batch: int, query: int | None, keys: Sequence[int] | None
    ) -> tuple[int, list[int]]:
        """The query position and key positions of :meth:`rotation`, checked against the mask."""
        mask = self.mask(layer)
        if not 0 <= batch < mask.shape[0]:
            raise InputError(f"batch {batch} does not exist: pick 0..{mask.shape[0] - 1}")
        real = int(self._acts(layer).valid[batch].sum())
        query = real - 1 if query is None else query
        if not isinstance(query, int) or not 0 <= query < real:
            raise InputError(f"query {query!r} is not a token of row {batch}: pick 0..{real - 1}")
        seen = mask[batch, query]
        if keys is None:
            keys = [n for n in dict.fromkeys([query, query - 1, query // 2, 0]) if n >= 0]
            keys = [n for n in keys if seen[n]]
        keys = list(keys)
        bad = [n for n in keys if not isinstance(n, int) or not 0 <= n < real or not seen[n]]
        if bad or not keys:
            allowed = torch.nonzero(seen).flatten().tolist()
            raise InputError(
                f"keys {bad or keys} are not keys the query at {query} sees (causal mask, window, "
                f"padding): pick from {allowed[:8]}{' …' if len(allowed) > 8 else ''}"
            )
        return query, keys

    def _rotation_panels(
        self, layer: int, planes: Sequence[int] | None
    ) -> list[tuple[str, str, int]]:
        """(panel label, band name, plane) of :meth:`rotation`: the given planes, or each band's
        fastest and slowest plane."""
        rb = self.resolved(layer)
        band_of = {p: rb.names[b] for b, ps in enumerate(rb.planes) for p in ps}
        n_planes = rb.n_planes
        if planes is not None:
            bad = [p for p in planes if not isinstance(p, int) or not 0 <= p < n_planes]
            if bad or isinstance(planes, int) or not planes:
                raise InputError(
                    f"planes {planes!r}: give a list of plane indices of layer {layer}, "
                    f"0..{n_planes - 1}"
                )
            return [(f"plane {p}", band_of.get(p, ""), p) for p in dict.fromkeys(planes)]
        freq = self.spec.layers[layer].inv_freq
        panels = []
        for name, ps in zip(rb.names, rb.planes, strict=True):
            if not ps:
                continue
            fast = max(ps, key=lambda p: float(freq[p]))
            slow = min(ps, key=lambda p: float(freq[p]))
            panels.append((f"{name}: fastest" if slow != fast else name, name, fast))
            if slow != fast:
                panels.append((f"{name}: slowest", name, slow))
        return panels

    def cauchy_schwarz(self, layer: int) -> Float[Tensor, "batch head plane q k"]:
        """Per-plane bound ‖q^(i)‖‖k^(i)‖ (times score scale) on |plane term|."""
        a = self._acts(layer)
        self._require_terms_room(layer, a.rope.n_planes, "plane")
        qn = a.rope.split(a["q_post"]).norm(dim=-1)  # [b,q,h,P]
        kn = a.rope.split(expand_kv(a["k_post"], a.rope)).norm(dim=-1)
        return torch.einsum("bqhp,bkhp->bhpqk", qn, kn) * a.rope.score_scale

    def agreement(self, layer: int) -> pd.DataFrame:
        """Per head × band: mean JS divergence of the band-only pattern from the model's, and top-1
        agreement.

        Both are NaN for a band that holds no plane in this layer: its logits are all 0, so its
        pattern is uniform and its argmax an arbitrary tie, not a measurement."""
        pat = self.pattern(layer)[:, :, None]  # [b,h,1,q,k]
        bp = self.band_patterns(layer)
        real = self._acts(layer).valid  # [b,q]: a padded query is not counted
        jsd = _over_real(js_divergence(bp, pat), real)  # [h,B]
        # keys tied at the band's maximum share its pick (ties broken at random), as
        # band_statistics counts them
        tied = bp == bp.amax(-1, keepdim=True)
        attended = pat.argmax(-1, keepdim=True).expand(*tied.shape[:-1], 1)
        picks = tied.gather(-1, attended)[..., 0].double() / tied.sum(-1).double()
        top1 = _over_real(picks, real)
        rows = []
        names = self.band_names(layer)
        empty = set(self.bands.empty_bands(self.spec.layers[layer]))
        for h in range(jsd.shape[0]):
            for b, name in enumerate(names):
                none = name in empty
                rows.append(
                    {
                        "layer": layer,
                        "head": h,
                        "band": name,
                        "jsd": float("nan") if none else float(jsd[h, b]),
                        "top1": float("nan") if none else float(top1[h, b]),
                    }
                )
        return pd.DataFrame(rows)

    def to_frame(self, layer: int, head: int, batch: int = 0) -> pd.DataFrame:
        """Tidy per-band logits of one head: one row per (band, query, key) allowed by the mask."""
        x = self.band_logits(layer, masked=False)[batch, head]  # [B,q,k]
        m = self.mask(layer)[batch]
        qi, ki = torch.nonzero(m, as_tuple=True)
        frames = [
            pd.DataFrame(
                {
                    "band": name,
                    "q_pos": qi.numpy(),
                    "k_pos": ki.numpy(),
                    "logit": x[b][qi, ki].numpy(),
                }
            )
            for b, name in enumerate(self.band_names(layer))
        ]
        return pd.concat(frames, ignore_index=True).assign(layer=layer, head=head)

    def figure(self, layer: int | None = None, head: int = 0, batch: int = 0) -> Any:
        """One head (default: head 0 of the first layer): each band's logits as a heatmap, and the
        model's pattern."""
        return figure_of(AttentionDecomposition)(self, layer, head, batch)

    def rotation_figure(
        self,
        layer: int | None = None,
        head: int = 0,
        *,
        query: int | None = None,
        keys: Sequence[int] | None = None,
        planes: Sequence[int] | None = None,
        batch: int = 0,
    ) -> Any:
        """The rotation drawn (:meth:`rotation`): q and k of a few tokens turning in each band's
        fastest and slowest plane, with the angle between them and the plane's term of the
        logit."""
        return figure_of(AttentionDecomposition, "rotation")(
            self, layer, head, query=query, keys=keys, planes=planes, batch=batch
        )

    def explore(
        self,
        *,
        taxonomy: Any = None,
        batch: int = 0,
        layers: Sequence[int] | None = None,
        title: str | None = None,
        open_on: tuple[int, int] | None = None,
    ) -> Any:
        """An interactive page, the band mixer: choose a layer and head, switch bands and planes on
        and off, and see the attention the model would have from them alone (:meth:`band_pattern`,
        recomputed in the page from the captured q and k), each query's attention band by band,
        and each band's top-1 agreement with the model.

        Runs with no server and no network: ``.save(path)`` writes one HTML file, and in Jupyter,
        VS Code or Colab the object shows itself. ``taxonomy``: a :class:`HeadTaxonomy` of the
        same model, whose classes label the heads (positional, sink, other); ``batch``: which
        input row; ``layers``: which decomposed layers the page holds (default: all of them);
        ``open_on``: the (layer, head) the page opens on (default: with a ``taxonomy``, its
        strongest positional head on the page; otherwise head 0 of its first layer).

        The page is built one layer at a time from float64 patterns of every band (see
        :mod:`ropelens.run.memory`); one that the machine has not the room for is refused first.
        """
        if layers is None or (
            isinstance(layers, Sequence) and all(L in self.acts for L in layers)
        ):  # what else the page is given, it refuses itself
            n = int(self.tokens.shape[1])
            chosen = self.layers if layers is None else list(layers)
            require_memory(
                band_mixer_bytes(self.spec, chosen, n, self.bands),
                f"the band mixer page of {n:,} tokens (float64 [head, {n}, {n}] patterns of "
                "every band, one layer at a time)",
                "decompose fewer tokens (a shorter text); the page's memory grows with their "
                "square",
            )
        return figure_of(AttentionDecomposition, "explore")(
            self, taxonomy=taxonomy, batch=batch, layers=layers, title=title, open_on=open_on
        )

    def _file_tensors(self) -> dict[str, Tensor]:
        """The tensors the file holds: tokens, and each layer's captured tensors under
        ``"{layer}/{name}"``."""
        tensors = {"tokens": self.tokens.contiguous()}
        for L, a in self.acts.items():
            for k, v in a.tensors.items():
                tensors[f"{L}/{k}"] = v.clone().contiguous()
            tensors[f"{L}/valid"] = a.valid.clone().contiguous()
        return tensors

    def save(self, path: str | Path) -> None:
        """Save tokens, captured q/k and metadata to a ``.safetensors`` file (atomic)."""
        # safetensors is only needed to save and load decompositions
        from safetensors.torch import save

        path = Path(path)
        if path.suffix.lower() != SAFETENSORS_SUFFIX:
            raise InputError(
                f"{path}: {self.KIND} results are written as safetensors (binary), not JSON: "
                f"name the file "
                f"{path.with_suffix(SAFETENSORS_SUFFIX).name}"
            )
        hints = field_types(type(self))
        meta = {
            "type": self.KIND,
            "format": str(self.FORMAT),
            **{
                name: json.dumps(encode(getattr(self, name), hints[name]))
                for name in _HEADER_FIELDS
            },
        }
        with atomic_write(path, "wb") as f:
            f.write(save(self._file_tensors(), metadata=meta))

    @classmethod
    def load(cls, path: str | Path) -> AttentionDecomposition:
        """Read a decomposition saved by :meth:`save` (safetensors)."""
        _, fields = cls._read(path)
        return cls(**fields)

    @classmethod
    def _read(cls, path: str | Path) -> tuple[dict[str, Tensor], dict]:
        """Every tensor in the file, and the fields of this class that the file holds."""
        from safetensors import safe_open

        with safe_open(str(path), "pt") as f:
            meta = f.metadata()
            t = {k: f.get_tensor(k) for k in f.keys()}  # noqa: SIM118 (safe_open is not iterable)
        # files from before the result base carry neither key
        kind, fmt = meta.get("type", cls.KIND), meta.get("format", str(cls.FORMAT))
        if kind != cls.KIND or fmt != str(cls.FORMAT):
            raise InputError(
                f"{path} holds a {kind!r} result of format {fmt}, not {cls.KIND!r} format "
                f"{cls.FORMAT}: load it with ropelens.load_result(path)"
            )
        hints = field_types(cls)
        header = {
            name: decode(json.loads(meta.get(name, "null")), hints[name]) for name in _HEADER_FIELDS
        }
        spec = header["spec"]
        acts: dict[int, LayerActs] = {}
        for key, v in t.items():
            if "/" not in key:
                continue
            L, name = key.split("/")
            a = acts.setdefault(
                int(L), LayerActs(layer=int(L), rope=spec.layers[int(L)], valid=None)
            )  # type: ignore[arg-type]
            if name == "valid":
                a.valid = v
            else:
                a.tensors[name] = v
        return t, {"tokens": t["tokens"], "acts": acts, **header}

    def _repr_html_(self) -> str:
        L = self.layers[0]
        return self.agreement(L).pivot(index="head", columns="band", values="top1").to_html()


def _over_real(x: Float[Tensor, "batch head band q"], real: Bool[Tensor, "batch q"]) -> Tensor:
    """Mean over the real (unpadded) queries of every row: ``[head, band]``."""
    w = real[:, None, None, :].to(torch.float64)
    return (x.double().nan_to_num() * w).sum((0, 3)) / w.sum((0, 3))


def _listed(chosen: Any) -> list:
    """A band or plane choice as a list (None: empty), numpy and torch integers as Python ints."""
    if chosen is None:
        return []
    if (
        isinstance(chosen, str)
        or getattr(chosen, "ndim", 1) == 0
        or not hasattr(chosen, "__iter__")
    ):
        raise InputError(
            "bands and planes are lists: band_pattern(layer, bands=['Q1']) or planes=[0, 3]"
        )
    return [_plain_index(x) for x in chosen]


def _plain_index(x: Any) -> Any:
    """A numpy or torch integer as a Python int; anything else as given (refused where it names no
    band or plane)."""
    if isinstance(x, str | bool):
        return x
    try:
        return operator.index(x)
    except TypeError:
        return x


def attention_decomposition(
    model,
    tokens: Int[Tensor, "batch pos"] | str | Sequence[str],
    *,
    bands: Bands | None = None,
    layers: Sequence[int] | None = None,
    batch_size: int = 8,
    verify: bool = True,
) -> AttentionDecomposition:
    """Capture post-RoPE q/k and patterns for ``tokens`` and decompose every logit into bands.

    RoPE rotates each plane independently, so q_mᵀR((n−m)θ)k_n = Σ_i (q_m^(i))ᵀR((n−m)θ_i)k_n^(i):
    each band's term is exact, and the terms add up to the model's scores. The result keeps the
    captured tensors in memory, so this is for a few inputs; for a corpus use
    :func:`~ropelens.analyses.band_statistics`.

    Texts start with the tokenizer's BOS (where it has one, as corpus windows do), are cut to the
    context the model was trained on (its config's ``max_position_embeddings``,
    :func:`ropelens.run.memory.trained_context`) with a
    :class:`ropelens.errors.TruncatedInputWarning`, as ``ropelens attention-decomposition``
    and ``ropelens explore`` cut ``--text``; a token tensor is used whole, with a
    :class:`ropelens.errors.RopelensWarning` where it runs past that context. Every chosen layer's
    ``[batch, head, n, n]`` pattern is kept: a decomposition the machine has not the memory for is
    refused before the forward, naming the estimate (:mod:`ropelens.run.memory`). Ragged texts are
    padded on the right with the padding masked: a batch gives each text the numbers it gives
    alone, and no statistic counts a padded position.

    Args:
        model: A loaded model (``ropelens.load_model()``, a tiny test model, or an nnsight or
            TransformerLens wrapper of a HF model).
        tokens (Tensor | str | Sequence[str]): A text, a list of texts or a ``[batch, pos]``
            integer token tensor.
        bands (Bands | None): How to group planes; None for one band per plane
            (``Bands.planes()``).
        layers (Sequence[int] | None): Layers to decompose; None for every attention layer.
        batch_size (int): Rows per forward pass (default 8).
        verify (bool): First check the RoPE reading against the model's own attention
            (:mod:`ropelens.run.verify`; default True); False runs anyway and the provenance says
            "unverified".

    Returns:
        AttentionDecomposition: The captured q, k and patterns per layer, with methods for band
        logits ``[batch, head, band, q, k]``, band-only patterns and figures.

    Raises:
        InputError: When ``tokens`` is an empty list, has no tokens, or is neither text nor a 2-D
            integer tensor, or when the patterns would not fit in the memory free.

    Examples:
        >>> from ropelens.analyses import attention_decomposition
        >>> from ropelens.testing import tiny_model
        >>> dec = attention_decomposition(tiny_model("llama"), "The cat sat on the mat.")
        >>> dec.layers, tuple(dec.tokens.shape), len(dec.band_names(0))  # BOS + 23 characters
        ([0, 1], (1, 24), 8)
        >>> dec.provenance.config["verification"]["status"]
        'passed'
        >>> dec.token_text[0][:4]
        ('<s>', 'T', 'h', 'e')
    """
    model = running_model(model)  # an nnsight model: the HF model it wraps
    if isinstance(tokens, list | tuple) and not tokens:
        raise InputError("no texts to decompose (an empty list): pass a text or a list of texts")
    valid = None
    trained = trained_context(model)
    if isinstance(tokens, str | list | tuple):
        # BOS policy, cut to the trained context (warned), padded
        encoded = text_tokens(model, tokens, limit=trained)
        tokens, valid = encoded.tokens, encoded.valid if encoded.padded else None
    if not isinstance(tokens, Tensor) or tokens.ndim != 2:
        raise InputError(
            "tokens must be text, a list of texts or an integer [batch, pos] tensor (e.g. "
            "ropelens.run.texts.text_tokens(model, text).tokens)"
        )
    if tokens.shape[0] == 0 or tokens.shape[1] == 0:
        raise InputError(
            f"no tokens to decompose (tokens of shape {list(tokens.shape)}): an empty text gives "
            "none where the tokenizer adds no BOS token; pass some text"
        )
    # frequencies that change with the input's length, as a forward of this length applies them
    spec = rope_spec(model, length=int(tokens.shape[1]))
    chosen = spec.layer_indices(layers)
    dtype = next((p.dtype for p in model.parameters() if p.is_floating_point()), torch.float32)
    rows, n = int(tokens.shape[0]), int(tokens.shape[1])
    require_decomposition_room(spec, chosen, rows, n, dtype, batch_size, device_of(model))
    if trained and tokens.shape[1] > trained:  # ready tokens are used whole: say what they pass
        warnings.warn(
            f"tokens are {tokens.shape[1]:,} positions, past the model's trained context of "
            f"{trained:,}: positions from {trained:,} on were never trained on; decomposed all "
            f"{tokens.shape[1]:,} (a text is cut to the trained context)",
            RopelensWarning,
            stacklevel=2,
        )
    verified = verification(model, spec, verify=verify, length=spec.length)
    t0 = time.perf_counter()
    # a layer whose indexer drops keys on windows this long: its selection is captured with q and k
    selected = ("selected",) if any(spec.layers[L].selects(tokens.shape[1]) for L in chosen) else ()
    acts = capture_qk(
        model,
        tokens,
        layers=chosen,
        which=("q_post", "k_post", "pattern", *selected),
        batch_size=batch_size,
        spec=spec,
        valid=valid,
    )
    acts = {
        L: LayerActs(a.layer, a.rope, a.valid.cpu(), {k: v.cpu() for k, v in a.tensors.items()})
        for L, a in acts.items()
    }
    bands = bands or DEFAULT_BANDS
    tokens = tokens.cpu()
    prov = Provenance(
        **placement(model),
        model=model_label(model),
        n_tokens=int(tokens.numel() if valid is None else valid.sum()),
        n_windows=int(tokens.shape[0]),
        n_ctx=int(tokens.shape[1]),
        config={"bands": bands.describe(), "layers": chosen, "verification": verified.to_dict()},
        seconds=time.perf_counter() - t0,
    )
    return AttentionDecomposition(
        tokens=tokens,
        spec=spec,
        bands=bands,
        acts=acts,
        provenance=prov,
        token_text=decoded_tokens(model, tokens),
    )


def decoded_tokens(
    model: Any, tokens: Int[Tensor, "batch pos"]
) -> tuple[tuple[str, ...], ...] | None:
    """Each token as the text the model's tokenizer decodes it to (None for a model without a
    tokenizer)."""
    tok = getattr(model, "tokenizer", None)
    if tok is None or not hasattr(tok, "decode"):
        return None
    return tuple(tuple(tok.decode([int(i)]) for i in row) for row in tokens.tolist())
