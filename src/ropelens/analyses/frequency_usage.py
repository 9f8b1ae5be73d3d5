"""Frequency usage: mean 2-norm of every RoPE plane of queries and keys (Barbero et al., Fig.
3-4), and of the part of each head that RoPE leaves unrotated."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

import einops
import numpy as np
import pandas as pd
import torch
from jaxtyping import Float
from torch import Tensor

from ropelens.errors import InputError
from ropelens.results.figures import figure_of
from ropelens.results.findings import (
    Finding,
    band_winners,
    count_of,
    percent,
    too_short,
    withheld,
)
from ropelens.results.provenance import Provenance
from ropelens.results.result import Result
from ropelens.run.capture import LayerActs, Moments
from ropelens.run.measure import RunOptions, corpus_analysis, measure
from ropelens.spec.bands import REST, Bands
from ropelens.spec.rope import RopeSpec

__all__ = ["FrequencyUsage", "UsageReducer", "frequency_usage"]

Which = Literal["q", "k"]
Scope = Literal["all", "no_sink"]


class UsageReducer:
    """Streams per-plane norms of q and k, and the norm of each head's unrotated dims: over tokens,
    and over per-window means (for CIs)."""

    def __init__(
        self, spec: RopeSpec, layers: Sequence[int], *, source: str = "pre", n_sink: int = 1
    ) -> None:
        if source not in ("pre", "post"):
            raise InputError(f"source must be 'pre' or 'post' (RoPE), got {source!r}")
        if n_sink < 0:
            raise InputError(f"n_sink must be ≥ 0, got {n_sink}")
        self.spec, self.layers, self.source, self.n_sink = spec, list(layers), source, n_sink
        self.needs = frozenset({f"q_{source}", f"k_{source}"})
        self.pos = {L: i for i, L in enumerate(self.layers)}
        keys = [(w, s) for w in "qk" for s in ("all", "no_sink")]
        # layers of other widths padded (see FrequencyUsage)
        planes = {w: _padded_shape(spec, self.layers, w) for w in "qk"}
        heads = {w: planes[w][:2] for w in "qk"}
        self.tok = {(w, s): Moments.zeros(planes[w]) for w, s in keys}
        self.win = {(w, s): Moments.zeros(planes[w]) for w, s in keys}
        self.utok = {(w, s): Moments.zeros(heads[w]) for w, s in keys}
        self.uwin = {(w, s): Moments.zeros(heads[w]) for w, s in keys}
        self._placed = False

    def _sums(self) -> tuple[tuple[str, dict[tuple[str, str], Moments]], ...]:
        return (("tok", self.tok), ("win", self.win), ("utok", self.utok), ("uwin", self.uwin))

    def state_dict(self) -> dict[str, Tensor]:
        """Every running sum by name (the tensors themselves): they add across runs and
        processes."""
        out = {}
        for kind, moments in self._sums():
            for (w, scope), m in moments.items():
                out.update(
                    {
                        f"{kind}/{w}/{scope}/count": m.count,
                        f"{kind}/{w}/{scope}/total": m.total,
                        f"{kind}/{w}/{scope}/total_sq": m.total_sq,
                    }
                )
        return out

    def _on(self, device: torch.device) -> None:
        """Keep the sums where the activations are (float64; float32 on MPS, which has no
        float64)."""
        if self._placed:  # placed once; layers elsewhere (device maps) send results here
            return
        self._placed = True
        for _, moments in self._sums():
            for key, m in moments.items():
                moments[key] = m.to(device)

    def update(self, acts: LayerActs) -> None:
        """Add one layer's per-plane norm sums and squares, and those of the unrotated dims' norm,
        over all positions and past the sink."""
        layer_slot, rope = self.pos[acts.layer], acts.rope
        self._on(acts.valid.device)
        valid = acts.valid.float()
        for which in "qk":
            x = acts[f"{which}_{self.source}"].float()
            norms = rope.plane_norms(x)
            if self.source == "post" and rope.attention_scaling != 1.0 and not rope.norm_after_rope:
                # cos/sin carry the scaling; undo it (a norm after RoPE did). The unrotated dims
                # never meet cos/sin, so they keep their norm as it is.
                norms = norms / rope.attention_scaling
            # ropelens's head layout puts the rotary dims first (LayerRope.from_model), so the
            # unrotated ones are the tail in every family, multi-head latent attention included
            unrotated = torch.linalg.vector_norm(x[..., rope.rotary_dim :], 2, dim=-1)
            self._fold(which, layer_slot, valid, norms, self.tok, self.win)
            self._fold(which, layer_slot, valid, unrotated[..., None], self.utok, self.uwin)

    def _fold(
        self,
        which: str,
        layer_slot: int,
        valid: Tensor,
        norms: Tensor,
        tok: dict[tuple[str, str], Moments],
        win: dict[tuple[str, str], Moments],
    ) -> None:
        """Fold norms ``[batch, pos, head, part]`` into ``tok``/``win`` for both scopes (a trailing
        part axis of 1 folds into ``[layer, head]`` sums)."""
        n_sink = self.n_sink
        # real positions per window: all, and those among the first n_sink
        counts = {"all": valid.sum(1), "sink": valid[:, :n_sink].sum(1)}
        # padded positions count for nothing (no host sync to ask)
        norms = norms * einops.rearrange(valid, "batch pos -> batch pos 1 1")
        # per-window sums over positions in float32 (≤ a few thousand terms), accumulated
        # across windows in float64: [batch, head, part]
        norm_sum = norms.sum(1).double()
        norm_square_sum = (torch.linalg.vector_norm(norms, 2, dim=1) ** 2).double()
        sink = norms[:, :n_sink]
        sink_sum, sink_square_sum = sink.sum(1).double(), (sink * sink).sum(1).double()
        per_scope = {
            "all": (counts["all"], norm_sum, norm_square_sum),
            "no_sink": (
                counts["all"] - counts["sink"],
                norm_sum - sink_sum,
                norm_square_sum - sink_square_sum,
            ),
        }
        for scope, (count, total, square_total) in per_scope.items():
            tok_w, win_w = tok[(which, scope)], win[(which, scope)]
            if tok_w.total.ndim == 2:  # [layer, head] sums: the part axis folds away
                total, square_total = total[..., 0], square_total[..., 0]
            _add(tok_w, win_w, layer_slot, count.double(), total, square_total)

    def result(self, provenance: Provenance) -> FrequencyUsage:
        """The streamed sums as a :class:`FrequencyUsage`."""

        def cpu(ms):
            return {k: m.to("cpu", torch.float64) for k, m in ms.items()}

        return FrequencyUsage(
            layers=tuple(self.layers),
            spec=self.spec,
            token=cpu(self.tok),
            window=cpu(self.win),
            n_sink=self.n_sink,
            source=self.source,
            provenance=provenance,
            unrotated_token=cpu(self.utok),
            unrotated_window=cpu(self.uwin),
        )


def _add(tok: Moments, win: Moments, i: int, cnt: Tensor, tot: Tensor, sq: Tensor) -> None:
    """Fold per-window sums ``[b, h, ...]`` (``cnt`` tokens per window) into token and window
    moments; a layer narrower than the widest fills its leading heads (and planes), the padding
    keeps count 0."""
    here = tok.total.device
    cnt, tot, sq = cnt.to(here), tot.to(here), sq.to(here)
    at = (i, *(slice(0, n) for n in tot.shape[1:]))
    tok.count[at] += cnt.sum()
    tok.total[at] += tot.sum(0)
    tok.total_sq[at] += sq.sum(0)
    # windows with tokens in scope (masking, not indexing: no host sync)
    keep = (cnt > 0).to(tot.dtype)
    per_window = (-1,) + (1,) * (tot.ndim - 1)
    means = tot / cnt.clamp_min(1).reshape(per_window) * keep.reshape(per_window)
    win.count[at] += keep.sum()
    win.total[at] += means.sum(0)
    win.total_sq[at] += (means * means).sum(0)


def _padded_shape(spec: RopeSpec, layers: Sequence[int], which: str) -> tuple[int, int, int]:
    """``[layer, head, plane]`` wide enough for every layer's heads (KV heads for keys) and
    planes."""
    return tuple(spec.present(layers, "head" if which == "q" else "kv_head", "plane").shape)  # type: ignore[return-value]


# unversioned: files from before the result base carry a type but no format
@dataclass(frozen=True)
class FrequencyUsage(
    Result,
    unversioned=True,
    merge_same=("layers", "n_sink", "source", "spec"),
    merge_sums=("token", "window", "unrotated_token", "unrotated_window"),
):
    """Per-plane norms of queries and keys, highest frequency first, and the norm of the part of
    each head that RoPE leaves unrotated.

    ``token`` moments are over tokens; ``window`` moments over per-window means (their spread
    gives the confidence interval). Each for scope ``"all"`` positions and ``"no_sink"`` (the
    first ``n_sink`` positions of every window, where attention sinks sit, excluded).

    A partial-rotary head (Phi, GPT-NeoX, GLM; the no-position dims of multi-head latent attention)
    has dims no plane holds: ``unrotated_token``/``unrotated_window`` hold the moments of their
    norm, per head, and :meth:`band_share` counts their energy in the ``rest`` band, so band shares
    are shares of the whole head. A layer without such dims has them exactly 0. A file written
    before ropelens measured them reads as unknown there (NaN: every band share of a partial-rotary
    layer is then NaN, since the whole is unknown); measure again to have them.

    ``source`` says what was measured: ``"pre"``, the queries and keys entering the rotation
    (Barbero et al.'s definition), or ``"post"``, those the attention scores (after the rotation,
    and after any plane ablation). Under an intervention (:attr:`intervened`), only ``"post"`` is
    what the attention uses: an ablated plane keeps its pre-rotation energy and has none after it.

    Layers of different widths (Gemma 4's wider global heads, with more planes and other KV head
    counts) share one ``[layer, head, plane]`` array: each layer fills its leading heads and planes,
    :meth:`present` marks them, and every number read from the result is NaN elsewhere.

    Built by :func:`~ropelens.analyses.frequency_usage`; the question it answers is which
    frequencies a model's queries and keys use (Barbero et al., 2025, "Round and Round We Go!":
    Gemma 7B puts most of its norm in the lowest frequencies).

    Attributes:
        layers (tuple[int, ...]): The measured layers, in the order of the ``layer`` axis.
        spec (RopeSpec): The model's RoPE reading (frequencies, pairing, heads per layer).
        token (dict[tuple[str, str], Moments]): Per ``(which, scope)`` — ``which`` ``"q"`` or
            ``"k"``, ``scope`` ``"all"`` or ``"no_sink"`` — count, sum and sum of squares of the
            plane norm over tokens, ``[layer, head, plane]`` (KV heads for keys).
        window (dict[tuple[str, str], Moments]): The same keys; moments over per-window means
            (for confidence intervals).
        n_sink (int): Leading positions of each window left out of scope ``"no_sink"``.
        source (str): ``"pre"`` (norms before RoPE, the default) or ``"post"`` (after: what the
            attention scores).
        provenance (Provenance): Model, corpus, token count and versions.
        unrotated_token (dict[tuple[str, str], Moments] | None): The same keys as ``token``;
            count, sum and sum of squares of the norm of each head's unrotated dims over tokens,
            ``[layer, head]`` (0 in a layer without such dims). None (a file written before they
            were measured) reads as unknown: NaN in a layer that has such dims.
        unrotated_window (dict[tuple[str, str], Moments] | None): The same, over per-window means.

    Examples:
        >>> import torch
        >>> from ropelens.analyses import frequency_usage
        >>> from ropelens.testing import tiny_model
        >>> tokens = torch.randint(4, 100, (2, 16), generator=torch.Generator().manual_seed(0))
        >>> usage = frequency_usage(tiny_model("llama"), tokens, progress=False)
        >>> usage.layers, tuple(usage.q_norm.shape)  # [layer, head, plane]
        ((0, 1), (2, 4, 8))
        >>> len(usage.figure().data)  # queries and keys
        2
        >>> usage.measured_as
        'queries and keys before the rotation'

        A partial-rotary head's unrotated dims count in the ``rest`` band:

        >>> from ropelens import Bands
        >>> gptj = frequency_usage(tiny_model("gptj"), tokens, progress=False)  # 8 of 16 dims
        >>> names, share = gptj.band_share(Bands.all(), "q")
        >>> names
        ['all', 'rest']
        >>> torch.allclose(share[..., 1], gptj.unrotated_share("q"))
        True
        >>> bool((share[..., 1] > 0.2).all())
        True
    """

    layers: tuple[int, ...]
    spec: RopeSpec
    token: dict[tuple[str, str], Moments]
    window: dict[tuple[str, str], Moments]
    n_sink: int
    source: str
    provenance: Provenance
    unrotated_token: dict[tuple[str, str], Moments] | None = None
    unrotated_window: dict[tuple[str, str], Moments] | None = None

    def __post_init__(self) -> None:
        for (w, s), mom in {**self.token, **self.window}.items():
            self._check_shape(
                f"{w}/{s} moments", mom.total, _padded_shape(self.spec, self.layers, w)
            )
        for name, planes in (("unrotated_token", self.token), ("unrotated_window", self.window)):
            if getattr(self, name) is None:
                object.__setattr__(self, name, self._unknown_unrotated(planes))
            for (w, s), mom in getattr(self, name).items():
                self._check_shape(
                    f"{name} {w}/{s} moments",
                    mom.total,
                    _padded_shape(self.spec, self.layers, w)[:2],
                )

    def _unknown_unrotated(
        self, planes: dict[tuple[str, str], Moments]
    ) -> dict[tuple[str, str], Moments]:
        """Unrotated moments for a file that lacks them: exactly 0 in a layer without unrotated
        dims (there is nothing to measure), NaN (unknown) in one with them."""
        width = torch.tensor([self.spec.layers[L].head_dim - self.spec.layers[L].rotary_dim
                              for L in self.layers])  # fmt: skip
        out = {}
        for key, mom in planes.items():
            count = mom.count[..., 0].clone()
            fill = torch.where(width > 0, math.nan, 0.0).to(count.dtype)[:, None].expand_as(count)
            out[key] = Moments(count, fill.clone(), fill.clone())
        return out

    # ---------------------------------------------------------------- numbers
    def present(self, which: Which = "q") -> Tensor:
        """``[layer, head, plane]`` bool: the entries a layer has (all True when every layer has one
        width)."""
        return self.spec.present(self.layers, "head" if which == "q" else "kv_head", "plane")

    def _masked(self, x: Tensor, which: Which) -> Tensor:
        return x.masked_fill(~self.present(which), float("nan"))

    @property
    def has_unrotated(self) -> bool:
        """Whether some measured layer has dims RoPE leaves unrotated (partial rotary, or the
        no-position dims of multi-head latent attention)."""
        return any(
            self.spec.layers[L].rotary_dim < self.spec.layers[L].head_dim for L in self.layers
        )

    @property
    def intervened(self) -> bool:
        """Whether an intervention (a RoPE variant, a plane ablation, a replacement) was in force
        when the usage was measured (:attr:`RopeSpec.interventions` of :attr:`spec`)."""
        return bool(self.spec.interventions)

    @property
    def measured_as(self) -> str:
        """What the norms are of, in words: before the rotation (``source="pre"``) or as the
        attention scores them (``"post"``), and whether an intervention was in force."""
        if self.source == "post":
            text = "queries and keys as the attention scores them (after the rotation)"
            return text + (", under the intervention in force" if self.intervened else "")
        text = "queries and keys before the rotation"
        if self.intervened:
            # an ablation zeroes planes after the rotation: pre-rotation norms still hold them
            text += (
                ", with an intervention in force whose effect after the rotation (a plane "
                "ablation) is not seen there; source 'post' measures what the attention scores"
            )
        return text

    @property
    def ragged(self) -> bool:
        """Whether the measured layers differ in heads or planes (entries past a layer's own are
        NaN)."""
        return not bool(self.present("q").all() and self.present("k").all())

    def norm(self, which: Which = "q", scope: Scope = "all") -> Float[Tensor, "layer head plane"]:
        """Mean ‖q^(i)‖ (or ‖k^(i)‖) over tokens: ``[layer, head, plane]`` (NaN past a layer's own
        heads and planes)."""
        return self._masked(self.token[(which, scope)].mean, which).float()

    @property
    def q_norm(self) -> Float[Tensor, "layer head plane"]:
        """Mean query plane norm over tokens, ``[layer, head, plane]``."""
        return self.norm("q")

    @property
    def k_norm(self) -> Float[Tensor, "layer kv_head plane"]:
        """Mean key plane norm over tokens, ``[layer, kv_head, plane]``."""
        return self.norm("k")

    def std(self, which: Which = "q", scope: Scope = "all") -> Float[Tensor, "layer head plane"]:
        """Standard deviation of the plane norm over tokens."""
        return self._masked(self.token[(which, scope)].std, which).float()

    def ci(
        self, which: Which = "q", scope: Scope = "all", z: float = 1.96
    ) -> Float[Tensor, "layer head plane"]:
        """Half-width of the normal CI of the mean norm, from the spread of per-window means."""
        return self._masked(self.window[(which, scope)].sem() * z, which).float()

    def unrotated_norm(
        self, which: Which = "q", scope: Scope = "all"
    ) -> Float[Tensor, "layer head"]:
        """Mean norm of each head's unrotated dims over tokens, ``[layer, head]``: 0 in a layer
        whose head RoPE rotates whole, NaN past a layer's heads (and where unknown: see the
        class)."""
        return self._masked_heads(self.unrotated_token[(which, scope)].mean, which).float()  # type: ignore[index]

    def unrotated_energy(
        self, which: Which = "q", scope: Scope = "all"
    ) -> Float[Tensor, "layer head"]:
        """Mean squared norm (energy) of each head's unrotated dims over tokens, ``[layer,
        head]``."""
        mom = self.unrotated_token[(which, scope)]  # type: ignore[index]
        return self._masked_heads(mom.total_sq / mom.count.clamp_min(1), which).float()

    def unrotated_share(
        self, which: Which = "q", scope: Scope = "all"
    ) -> Float[Tensor, "layer head"]:
        """The unrotated dims' share of each head's energy, ``[layer, head]`` (0 where RoPE
        rotates the whole head)."""
        return (self.unrotated_energy(which, scope) / self._head_energy(which, scope)).float()

    def _masked_heads(self, x: Tensor, which: Which) -> Tensor:
        return x.masked_fill(~self.present(which)[..., 0], float("nan"))

    def _plane_energy(self, which: Which, scope: Scope) -> Tensor:
        mom = self.token[(which, scope)]
        return self._masked(mom.total_sq / mom.count.clamp_min(1), which)  # [L, H, P]

    def _head_energy(self, which: Which, scope: Scope) -> Tensor:
        """Mean squared norm of the whole head, planes and unrotated dims, ``[layer, head]``
        (float64)."""
        mom = self.unrotated_token[(which, scope)]  # type: ignore[index]
        unrotated = self._masked_heads(mom.total_sq / mom.count.clamp_min(1), which)
        # the planes a layer lacks are NaN; a layer's own ones sum (NaN where the head is absent)
        planes = self._plane_energy(which, scope).nan_to_num(0.0).sum(-1)
        return (planes + unrotated).clamp_min(1e-30)

    def band_share(
        self, bands: Bands, which: Which = "q", scope: Scope = "all"
    ) -> tuple[list[str], Tensor]:
        """Share of the head's squared norm (energy) per band, ``[layer, head, band]``; sums to 1
        over bands.

        Exact from the streamed sums: E‖x_band‖² = Σ_{i∈band} E‖x^(i)‖², and the ``rest`` band
        also holds the energy of the dims RoPE leaves unrotated (a partial-rotary head's tail), so
        the shares are of the whole head. Bands are resolved per layer; where layers of different
        widths resolve to different bands, the bands are all of them, in order, and a band a layer
        lacks (like heads it lacks) is NaN there.
        """
        resolved = [bands.resolve(self.spec.layers[L]) for L in self.layers]
        names = list(dict.fromkeys(n for rb in resolved for n in rb.names))
        energy = self._plane_energy(which, scope)
        mom = self.unrotated_token[(which, scope)]  # type: ignore[index]
        unrotated = mom.total_sq / mom.count.clamp_min(1)  # [L, H]
        per_band = torch.full((*energy.shape[:2], len(names)), float("nan"), dtype=energy.dtype)
        for i, rb in enumerate(resolved):
            for name, planes in zip(rb.names, rb.planes):
                per_band[i, :, names.index(name)] = energy[i][:, list(planes)].sum(-1)
            if REST in rb.names:  # resolve() makes a rest band wherever there are unrotated dims
                per_band[i, :, names.index(REST)] += unrotated[i]
        return names, (per_band / self._head_energy(which, scope)[..., None]).float()

    def sink_ratios(self) -> dict[str, Tensor] | None:
        """Per layer: mean per-plane norm at the sink positions ÷ that at all other positions (q and
        k); None when some layer saw no sink position."""
        out = {}
        for w in "qk":
            a, ns = self.token[(w, "all")], self.token[(w, "no_sink")]
            n_sink = a.count - ns.count
            if not bool((n_sink > 0).all()):
                return None
            sink = self._masked((a.total - ns.total) / n_sink, w)  # type: ignore[arg-type]
            rest = self._masked(ns.mean, w)  # type: ignore[arg-type]
            out[w] = (sink.nanmean((1, 2)) / rest.nanmean((1, 2)).clamp_min(1e-30)).float()
        return out

    # ---------------------------------------------------------------- findings
    def findings(self, bands: Bands | None = None) -> list[Finding]:
        """Which band holds the most energy (over ``bands``, default quartiles; the ``rest`` band
        holds a partial-rotary head's unrotated dims), and the layer whose sink positions stand out
        most (when every layer saw one). Both compare positions past the ``n_sink`` sink positions,
        so windows need at least ``n_sink + 1`` tokens; shorter ones give the findings withheld,
        saying why. The energy finding says what was measured (:attr:`measured_as`)."""
        n_ctx, need = self.provenance.n_ctx, self.n_sink + 1
        if too_short(n_ctx, need):
            pos = "position" if self.n_sink == 1 else "positions"
            why = (
                f"both findings compare the positions after the first {self.n_sink} (sink) {pos} "
                "with others, so a window needs one position past them"
            )
            return [
                withheld(key, "frequency-usage", what, n_ctx, need, why)  # type: ignore[arg-type]
                for key, what in (("energy", "band energy"), ("sink", "sink positions"))
            ]
        out = [self._energy_finding(bands or Bands.default())]
        sink = self._sink_finding()
        return out if sink is None else [*out, sink]

    def _energy_finding(self, bands: Bands) -> Finding:
        vals: dict[str, Any] = {
            "scope": "no_sink",
            "n_layers": len(self.layers),
            "source": self.source,
            "intervened": self.intervened,
        }
        parts = []
        for which, noun in (("q", "Queries"), ("k", "keys")):
            names, share = self.band_share(bands, which, "no_sink")  # type: ignore[arg-type]
            # a band or head a layer lacks (layers of other widths) is NaN: it wins nowhere
            band, n, mean = band_winners(share.nanmean(1).nan_to_num(nan=-math.inf), names)
            vals[which] = {"band": band, "layers": n, "mean_share": round(mean, 2)}
            parts.append(
                f"{noun} hold the most energy (squared norm) in band {band} in "
                f"{count_of(n, len(self.layers), 'layer')} (mean share "
                f"{percent(vals[which]['mean_share'])} where it leads)"
            )
        return Finding(
            "energy",
            "frequency-usage",
            "; ".join(parts) + f" — sink positions excluded; {self.measured_as}.",
            vals,
        )

    def _sink_finding(self) -> Finding | None:
        """The layer whose sink keys differ most from other keys (norm ratio farthest from 1, either
        way)."""
        ratios = self.sink_ratios()
        if ratios is None:
            return None
        k, q = ratios["k"], ratios["q"]
        i = int(k.clamp_min(1e-30).log().abs().argmax())
        vals = {
            "layer": self.layers[i],
            "k_ratio": round(float(k[i]), 2),
            "q_ratio": round(float(q[i]), 2),
            "k_min": round(float(k.min()), 2),
            "k_max": round(float(k.max()), 2),
            "k_median": round(float(k.median()), 2),
            "n_sink": self.n_sink,
        }
        pos = "the first position" if self.n_sink == 1 else f"the first {self.n_sink} positions"
        way = "larger" if vals["k_ratio"] >= 1 else "smaller"
        text = (
            f"Sink keys differ most from other keys in layer {vals['layer']}: keys at {pos} "
            f"carry {vals['k_ratio']:.2f}× the mean per-plane norm of other positions ({way}; "
            f"queries {vals['q_ratio']:.2f}×); across layers the key ratio runs from "
            f"{vals['k_min']:.2f}× to {vals['k_max']:.2f}× (median {vals['k_median']:.2f}×)."
        )
        return Finding("sink", "frequency-usage", text, vals)

    def to_frame(self) -> pd.DataFrame:
        """Tidy table: one row per (which, scope, layer, head, plane) the layer has."""
        frames = []
        for (w, s), mom in self.token.items():
            L, H, P = mom.mean.shape
            layer, head, plane = np.meshgrid(
                np.array(self.layers), np.arange(H), np.arange(P), indexing="ij"
            )
            wl = self.wavelengths()  # [L, P]
            have = self.present(w).flatten().numpy()  # type: ignore[arg-type]
            frames.append(
                pd.DataFrame(
                    {
                        "which": w,
                        "scope": s,
                        "layer": layer.ravel(),
                        "head": head.ravel(),
                        "plane": plane.ravel(),
                        "wavelength": wl[:, None, :].expand(L, H, P).double().flatten().numpy(),
                        "mean_norm": mom.mean.double().flatten().numpy(),
                        "std": mom.std.double().flatten().numpy(),
                        "ci95": self.ci(w, s).double().flatten().numpy(),  # type: ignore[arg-type]
                    }
                )[have]
            )
        return pd.concat(frames, ignore_index=True)

    def wavelengths(self) -> Tensor:
        """``[layer, plane]`` wavelengths, NaN past a layer's planes."""
        P = max(self.spec.layers[L].n_planes for L in self.layers)
        out = torch.full((len(self.layers), P), float("nan"), dtype=torch.float64)
        for i, L in enumerate(self.layers):
            wl = self.spec.layers[L].wavelength
            out[i, : wl.numel()] = wl
        return out

    # ---------------------------------------------------------------- persistence
    # -------------------------------------------- figures (drawn by ropelens.plots.frequency_usage)
    def heatmap(
        self,
        which: Which = "q",
        scope: Scope = "all",
        *,
        layer: int | None = None,
        coloraxis: str | None = None,
    ) -> Any:
        """Layer × plane heatmap (head-averaged), or head × plane for one ``layer``."""
        return figure_of(FrequencyUsage, "heatmap")(
            self, which, scope, layer=layer, coloraxis=coloraxis
        )

    def figure(self, scope: Scope = "all", layer: int | None = None) -> Any:
        """q and k heatmaps side by side: layer × plane, or head × plane for ``layer``."""
        return figure_of(FrequencyUsage)(self, scope, layer)


@corpus_analysis()
def frequency_usage(
    model,
    corpus,
    run: RunOptions,
    *,
    n_sink: int = 1,
    source: str = "pre",
) -> FrequencyUsage:
    """Mean per-plane norms of q and k over a corpus (streamed; memory independent of its size).

    Each query and key is split into its RoPE planes (highest frequency first) and the norm of every
    plane is averaged over tokens, per layer × head (keys: per KV head), for all positions and with
    the first ``n_sink`` positions of every window (where attention sinks sit) left out; per-window
    means give the confidence intervals. Which planes carry the norm is the question of Barbero et
    al. (ICLR 2025, "Round and Round We Go! What makes Rotary Positional Encodings useful?"). The
    dims RoPE leaves unrotated (partial rotary; the no-position dims of multi-head latent
    attention) are measured too, as one part per head, and count in the ``rest`` band of
    :meth:`FrequencyUsage.band_share`.

    Run under an intervention (inside :func:`ropelens.ablate_planes` or
    :func:`ropelens.apply_rope_variant`), ``source="post"`` gives what the attention scores (an
    ablated plane has no energy there); ``"pre"`` gives the queries and keys entering the rotation,
    where an ablated plane keeps its energy. The result records which
    (:attr:`FrequencyUsage.source`, :attr:`FrequencyUsage.measured_as`).

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
        n_sink (int): Leading positions of each window left out of the ``"no_sink"`` scope (default
            1: BOS).
        source (str): ``"pre"`` (default): the queries and keys before rotation; ``"post"``: after
            it, as the attention scores them (the same norms unless the model normalises after
            rotating or an intervention zeroes planes after it; a rotary attention scaling is
            divided out).
        batch_size (int): Windows per forward pass (default 4).
        progress (bool): Show a progress bar (default True; rank 0 only under torchrun).
        checkpoint (str | os.PathLike | None): A directory to save progress to and resume a killed
            run from (default None: none; see :mod:`ropelens.run.distributed`).
        checkpoint_every (int): Batches between checkpoints (default 8).
        verify (bool): First check that ropelens's reading of RoPE reproduces the model's own
            attention (default True); False skips the check, and the result says "unverified".

    Returns:
        FrequencyUsage: Per-plane norm moments ``[layer, head, plane]`` (keys ``[layer, kv_head,
        plane]``) and those of the unrotated dims ``[layer, head]`` over tokens and over windows,
        for scopes ``"all"`` and ``"no_sink"``, with the spec and the provenance.

    Raises:
        InputError: When ``layers`` selects no layer the model has, the corpus cannot be read, or
            ``source`` is neither "pre" nor "post" (the message names the problem and the fix).
        UnsupportedModelError: When ``verify`` finds that the RoPE reading does not reproduce the
            model's own attention.

    Examples:
        >>> from ropelens.analyses import frequency_usage
        >>> from ropelens.testing import tiny_model
        >>> model = tiny_model("llama")
        >>> usage = frequency_usage(model, n_ctx=32, max_tokens=128, progress=False)
        >>> tuple(usage.q_norm.shape)  # [layer, head, plane]
        (2, 4, 8)
        >>> usage.provenance.n_windows, usage.provenance.config["verification"]["status"]
        (4, 'passed')
    """
    m = measure(
        model,
        corpus,
        lambda spec, chosen, _: UsageReducer(spec, chosen, source=source, n_sink=n_sink),
        run,
        analysis="usage",
        config={"n_sink": n_sink, "source": source},
        desc="frequency usage",
    )
    return m.reducer.result(m.provenance)
