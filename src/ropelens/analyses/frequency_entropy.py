"""Entropies of RoPE models: how periodic each plane's query norm is along the sequence (frequency
entropy), and how spread each head's attention is (attention entropy, divergence from another
model's attention, matrix entropy).

**Attention entropy, divergence, matrix entropy** (:class:`AttentionStatsReducer`; used by the
context-extension study, :mod:`ropelens.analyses.extension_study`): from the post-RoPE queries and
keys, each head's attention probabilities are rebuilt in query tiles (memory linear in the length),
as the model makes them (score scale, mask, soft-capping, learned sinks: a sink's share is one more
outcome of the row). Per layer × head it sums

- the Shannon entropy of every query row, H = −Σ_k p_k ln p_k in nats (:func:`attention_entropy`; a
  row spread evenly over n keys has ln n);
- with a reference model's queries and keys on the same tokens (the unmodified model, for an
  extension method), the Kullback–Leibler divergence KL(P ‖ P_ref) = Σ_k p_k ln(p_k / p_ref,k) of
  each row from the reference's row, and the Jensen–Shannon divergence ½KL(P ‖ M) + ½KL(P_ref ‖ M),
  M = ½(P + P_ref), in nats (:func:`kl_divergence`, :func:`js_divergence`): the attention view of
  Zhong et al. (COLING 2025, "Understanding the RoPE Extensions of Long-Context LLMs: An Attention
  Perspective"), which compares an extension method's attention with the original model's within the
  trained context;
- the Gram matrix Σ_t q_t q_tᵀ of the head's post-RoPE queries, whose eigenvalues are the squared
  singular values of the query matrix Q (positions × head dim): its matrix entropy
  (:func:`matrix_entropy`) is the Shannon entropy of the eigenvalues normalised to sum to 1, −Σ_i
  λ̂_i ln λ̂_i (nats; exp of it is the effective rank). This is the spectral quantity "DoPE: Denoising
  Rotary Position Embedding" (arXiv 2511.09146) reads per head with its *truncated* matrix entropy;
  ropelens takes the whole spectrum (``top`` keeps the r largest eigenvalues, renormalised), of the
  queries' Gram.

**Frequency entropy** (the rest of this module):

A 2026 proposal reads, per RoPE plane, the norm of the query's 2-D component at every position of a
window, ‖q_t^(i)‖, as a signal over positions t; takes its power spectrum (FFT with the mean
removed, so the constant part does not count); normalises the spectrum to sum to 1; and takes its
Shannon entropy. A signal that repeats with a few periods puts its power in a few bins (low
entropy); one with no order spreads it over all of them (high entropy). The claim: the spectrum is
periodic in RoPE layers and not in NoPE layers (Llama 4).

ropelens computes, per window, layer, head and plane, the entropy H = −Σ_f p_f ln p_f over the ``F =
⌊(n − skip)/2⌋`` non-zero frequencies of the ``n − skip`` positions after the first ``skip`` (the
attention-sink position, whose norms stand apart), divided by ln F so that 1 is a flat spectrum.
Planes are the rotary layers' own; a NoPE layer has none, so its head is split into the planes the
model's rotary layers use (same pairing and rotary width), which is what its queries would rotate.

As a control the same signal is read in one fixed random order of positions (seeded): that keeps
every value and destroys the order, so its entropy is what the plane's values give without any
periodicity (for white noise, ≈ 1 − (1 − γ)/ln F: a periodogram is not flat). A plane is periodic
where its entropy falls below its shuffled entropy. The per-window entropies add up over windows, so
the result merges exactly.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import einops
import numpy as np
import pandas as pd
import torch
from jaxtyping import Float
from torch import Tensor

from ropelens.errors import InputError
from ropelens.results.findings import Finding
from ropelens.results.provenance import Provenance
from ropelens.results.result import Result
from ropelens.results.sums import count_or_nan
from ropelens.run.capture import DeviceSums, LayerActs, query_tile
from ropelens.run.measure import RunOptions, corpus_analysis, measure
from ropelens.spec.rope import LayerRope, RopeSpec, expand_kv, plane_norms
from ropelens.validate import check_number

__all__ = [
    "AttentionStatsReducer",
    "EntropyReducer",
    "FrequencyEntropy",
    "attention_entropy",
    "frequency_entropy",
    "js_divergence",
    "kl_divergence",
    "matrix_entropy",
    "plane_layout",
    "spectral_entropy",
]


def plane_layout(spec: RopeSpec, layer: int) -> tuple[int, str]:
    """(rotary width, pairing) a layer's head is split into planes with: its own, or for a NoPE
    layer that of the model's rotary layers with the same head width (else the whole head, halves
    paired)."""
    lr = spec.layers[layer]
    if lr.rotary:
        return lr.rotary_dim, lr.pairing
    for other in spec.layers:
        if other.rotary and other.head_dim == lr.head_dim:
            return other.rotary_dim, other.pairing
    return lr.head_dim - lr.head_dim % 2, "half"


def spectral_entropy(signal: Float[Tensor, "... pos"]) -> tuple[Tensor, Tensor]:
    """Normalised Shannon entropy of the power spectrum of ``signal`` along its last axis, and the
    normalised spectrum: mean removed, |rfft|² over the F = ⌊n/2⌋ non-zero frequencies, p = P/ΣP,
    H = −Σ p ln p / ln F. A constant signal (no power) gives NaN."""
    n = signal.shape[-1]
    F = n // 2
    if F < 2:
        raise InputError(
            f"a spectrum needs at least 4 positions, got {n}: use longer windows (--n-ctx)"
        )
    x = signal - signal.mean(-1, keepdim=True)
    power = torch.fft.rfft(x, dim=-1).abs().square()[..., 1 : F + 1]
    p = power / power.sum(
        -1, keepdim=True
    )  # 0/0 → NaN for a constant signal, kept as "no spectrum"
    h = -torch.xlogy(p, p).sum(-1) / math.log(F)
    return h, p


# --------------------------------------------------------------------------------------------
# attention entropy, divergence, matrix entropy
# --------------------------------------------------------------------------------------------
def attention_entropy(p: Float[Tensor, "... k"]) -> Float[Tensor, "..."]:
    """Shannon entropy −Σ_k p_k ln p_k (nats) of distributions along the last axis (0 ln 0 = 0)."""
    return -torch.xlogy(p, p).sum(-1)


def kl_divergence(p: Float[Tensor, "... k"], q: Float[Tensor, "... k"]) -> Float[Tensor, "..."]:
    """KL(p ‖ q) = Σ_k p_k ln(p_k / q_k) in nats along the last axis (terms with p_k = 0 are 0; inf
    where q_k = 0 < p_k)."""
    return (torch.xlogy(p, p) - torch.xlogy(p, q)).sum(-1)


def js_divergence(p: Float[Tensor, "... k"], q: Float[Tensor, "... k"]) -> Float[Tensor, "..."]:
    """Jensen–Shannon divergence ½KL(p ‖ m) + ½KL(q ‖ m), m = ½(p + q), in nats (at most ln 2)."""
    m = 0.5 * (p + q)
    return 0.5 * kl_divergence(p, m) + 0.5 * kl_divergence(q, m)


def matrix_entropy(gram: Float[Tensor, "... d d"], top: int | None = None) -> Float[Tensor, "..."]:
    """Entropy (nats) of the normalised eigenvalue spectrum of symmetric positive semi-definite
    ``gram``: λ̂ = λ/Σλ, −Σ λ̂ ln λ̂, over the ``top`` largest eigenvalues only (renormalised) where
    given. For a Gram QᵀQ the eigenvalues are the squared singular values of Q. NaN for a zero
    matrix."""
    lam = torch.linalg.eigvalsh(gram.double()).clamp_min(0).flip(-1)  # largest first
    if top is not None:
        top = int(check_number(top, "top", at_least=1, integer=True, hint=" (eigenvalues kept)"))
        lam = lam[..., :top]
    p = lam / lam.sum(-1, keepdim=True)
    return attention_entropy(p)


def _with_rest(p: Tensor, rope: LayerRope) -> Tensor:
    """Rows with the mass they leave to the layer's learned sinks as one more outcome (rows as they
    are without)."""
    if rope.sinks is None:
        return p
    return torch.cat([p, (1 - p.sum(-1, keepdim=True)).clamp_min(0)], dim=-1)


class AttentionStatsReducer(DeviceSums):
    """Streams, per layer × query head: query rows, summed row entropy, summed KL and JS divergence
    from a reference's attention on the same windows (``reference``:
    :func:`ropelens.run.capture.capture_qk` of the reference model on the same tokens, with
    ``q_post`` and ``k_post``), and the Gram matrix of the post-RoPE queries.

    Attention is rebuilt in query tiles holding whole rows, in float64.
    """

    # masks built from positions: refused where the model picks keys from the input
    static_mask = "attention entropy"

    def __init__(
        self,
        spec: RopeSpec,
        layers: Sequence[int],
        *,
        reference: dict[int, LayerActs] | None = None,
    ) -> None:
        self.spec, self.layers, self.reference = spec, list(layers), reference
        self.needs = frozenset({"q_post", "k_post"})
        if reference is not None and (missing := [L for L in self.layers if L not in reference]):
            raise InputError(
                f"the reference holds no queries and keys of layer(s) {missing}: capture every "
                "layer measured (capture_qk(..., which=('q_post', 'k_post')))"
            )
        self.pos = {L: i for i, L in enumerate(self.layers)}
        self.offset = dict.fromkeys(
            self.layers, 0
        )  # windows seen per layer: where the reference's rows are
        n, H = len(self.layers), max(spec.layers[L].n_heads for L in self.layers)
        d = max(spec.layers[L].head_dim for L in self.layers)

        def z(*s):
            return torch.zeros(s, dtype=torch.float64)

        self.sums = {
            "rows": z(n, H),
            "entropy": z(n, H),
            "kl": z(n, H),
            "js": z(n, H),
            "gram": z(n, H, d, d),
        }

    def state_dict(self) -> dict[str, Tensor]:
        """Every running sum by name: they add across runs."""
        return self.sums

    def _probs(self, rope: LayerRope, q: Tensor, k: Tensor, ok: Tensor, c0: int, c1: int) -> Tensor:
        """[b, head, c1 − c0, keys]: rows c0 … c1 − 1 of the attention (and the sinks' share last,
        where the layer has sinks)."""
        y = torch.einsum("bqhd,bkhd->bhqk", q[:, c0:c1], k[:, :c1]) * rope.score_scale
        return _with_rest(rope.probs(y.masked_fill(~ok[:, None], float("-inf"))), rope)

    def update(self, acts: LayerActs) -> None:
        sums = self._on(acts.valid.device)
        layer_slot, rope = self.pos[acts.layer], acts.rope
        sums_device, sums_dtype = sums["rows"].device, sums["rows"].dtype
        queries = acts["q_post"].double()
        keys = expand_kv(acts["k_post"].double(), rope)
        batch, n_positions, n_heads, head_dim = queries.shape
        mask = acts.mask()  # [batch, queries, keys]
        rows = mask.any(-1)  # [batch, queries]: queries with a key (every real token)
        reference = None
        if self.reference is not None:
            offset = self.offset[acts.layer]
            captured = self.reference[acts.layer]
            if (
                captured["q_post"].shape[0] < offset + batch
                or captured["q_post"].shape[1] != n_positions
            ):
                raise InputError(
                    f"the reference's queries of layer {acts.layer} are "
                    f"{tuple(captured['q_post'].shape)}, not windows {offset}…{offset + batch - 1} "
                    f"of {n_positions} tokens: capture the reference on the same tokens"
                )
            reference = (
                captured["q_post"][offset : offset + batch].to(queries.device, torch.float64),
                expand_kv(
                    captured["k_post"][offset : offset + batch].to(queries.device, torch.float64),
                    rope,
                ),
            )
            self.offset[acts.layer] = offset + batch
        tile_size = query_tile(queries.device, batch * n_heads * n_positions)
        for query_start in range(0, n_positions, tile_size):
            query_end = min(n_positions, query_start + tile_size)
            allowed = mask[:, query_start:query_end, :query_end]
            row_weights = rows[:, None, query_start:query_end].double()  # [batch, 1, query]
            probs = self._probs(rope, queries, keys, allowed, query_start, query_end)
            sums["entropy"][layer_slot, :n_heads] += (
                (attention_entropy(probs) * row_weights).sum((0, 2)).to(sums_device, sums_dtype)
            )
            sums["rows"][layer_slot, :n_heads] += (
                row_weights.expand(batch, n_heads, query_end - query_start)
                .sum((0, 2))
                .to(sums_device, sums_dtype)
            )
            if reference is not None:
                reference_probs = self._probs(
                    rope, reference[0], reference[1], allowed, query_start, query_end
                )
                sums["kl"][layer_slot, :n_heads] += (
                    (kl_divergence(probs, reference_probs) * row_weights)
                    .sum((0, 2))
                    .to(sums_device, sums_dtype)
                )
                sums["js"][layer_slot, :n_heads] += (
                    (js_divergence(probs, reference_probs) * row_weights)
                    .sum((0, 2))
                    .to(sums_device, sums_dtype)
                )
        real_queries = queries * rows[:, :, None, None].double()
        gram = einops.einsum(
            real_queries,
            real_queries,
            "batch pos head dim, batch pos head dim2 -> head dim dim2",
        )
        sums["gram"][layer_slot, :n_heads, :head_dim, :head_dim] += gram.to(sums_device, sums_dtype)

    def table(self, top: int | None = None) -> list[dict[str, Any]]:
        """One row per (layer, head): kind, query rows, mean row entropy, mean KL and JS (None
        without a reference), and the matrix entropy of the query Gram (``top``: of its largest
        eigenvalues)."""
        s = {k: v.to("cpu", torch.float64) for k, v in self.sums.items()}
        n = s["rows"]
        mean = {k: s[k] / count_or_nan(n) for k in ("entropy", "kl", "js")}
        out = []
        for i, L in enumerate(self.layers):
            lr = self.spec.layers[L]
            me = matrix_entropy(s["gram"][i, : lr.n_heads, : lr.head_dim, : lr.head_dim], top)
            for h in range(lr.n_heads):
                ref = self.reference is not None
                out.append(
                    {
                        "layer": L,
                        "kind": lr.kind,
                        "head": h,
                        "rows": float(n[i, h]),
                        "entropy": float(mean["entropy"][i, h]),
                        "kl": float(mean["kl"][i, h]) if ref else None,
                        "js": float(mean["js"][i, h]) if ref else None,
                        "matrix_entropy": float(me[h]),
                    }
                )
        return out


class EntropyReducer(DeviceSums):
    """Streams, per layer × head × plane, the sum over windows of the spectral entropy of ‖q_t^(i)‖
    (in order and in a fixed shuffled order), its square, the windows counted, and the summed
    spectrum."""

    def __init__(
        self, spec: RopeSpec, layers: Sequence[int], n_ctx: int, *, skip: int = 1, seed: int = 0
    ) -> None:
        self.spec, self.layers, self.skip, self.seed = spec, list(layers), int(skip), int(seed)
        self.needs = frozenset({"q_pre"})
        widths = {plane_layout(spec, L) for L in self.layers}
        heads = {spec.layers[L].n_heads for L in self.layers}
        if len({w for w, _ in widths}) != 1 or len(heads) != 1:
            raise InputError(
                "selected layers have different plane or head counts; analyse them separately "
                "with layers=[...]"
            )
        self.n_pos = int(n_ctx) - self.skip
        if self.skip < 0 or self.n_pos < 4:
            raise InputError(
                f"skip={skip} leaves {self.n_pos} of {n_ctx} positions; a spectrum needs at "
                "least 4: lower skip or use longer windows"
            )
        P, H, F = widths.pop()[0] // 2, heads.pop(), self.n_pos // 2
        L = len(self.layers)
        self.pos = {layer: i for i, layer in enumerate(self.layers)}
        g = torch.Generator().manual_seed(self.seed)
        self.perm = torch.randperm(self.n_pos, generator=g)

        def z(*s):
            return torch.zeros(s, dtype=torch.float64)

        self.sums = {
            "count": z(L, H, P),
            "h": z(L, H, P),
            "h_sq": z(L, H, P),
            "shuffled_count": z(L, H, P),
            "shuffled": z(L, H, P),
            "shuffled_sq": z(L, H, P),
            "spectrum": z(L, P, F),
        }

    def state_dict(self) -> dict[str, Tensor]:
        """Every running sum by name (the tensors themselves): they add across runs and
        processes."""
        return self.sums

    def update(self, acts: LayerActs) -> None:
        if acts.padded:
            raise InputError(
                "frequency entropy needs whole windows (a spectrum over positions): pass "
                "unpadded windows"
            )
        sums = self._on(acts.valid.device)
        layer_slot = self.pos[acts.layer]
        width, pairing = plane_layout(self.spec, acts.layer)
        queries = acts["q_pre"][:, self.skip :]
        if queries.shape[1] != self.n_pos:
            raise InputError(
                f"windows of {queries.shape[1] + self.skip} tokens reached a reducer built for "
                f"{self.n_pos + self.skip}: build it with the windows' n_ctx"
            )
        # float64: the spectrum of a norm that barely varies is a small difference of large sums
        norms = einops.rearrange(
            plane_norms(queries.double(), width, pairing),
            "batch pos head plane -> batch head plane pos",
        )
        sums_dtype = sums["h"].dtype
        for key, signal in (("", norms), ("shuffled", norms[..., self.perm.to(norms.device)])):
            entropy, spectrum = spectral_entropy(signal)
            finite = torch.isfinite(entropy)
            entropy = torch.where(finite, entropy, torch.zeros_like(entropy))
            name = key or "h"
            sums[f"{key}_count" if key else "count"][layer_slot] += finite.sum(0).to(sums_dtype)
            sums[name][layer_slot] += entropy.sum(0).to(sums_dtype)
            sums[f"{name}_sq"][layer_slot] += (entropy * entropy).sum(0).to(sums_dtype)
            if not key:
                sums["spectrum"][layer_slot] += (
                    torch.nan_to_num(spectrum, nan=0.0).sum((0, 1)).to(sums_dtype)
                )

    def result(self, provenance: Provenance) -> FrequencyEntropy:
        """The streamed sums as a :class:`FrequencyEntropy`."""
        return FrequencyEntropy(
            layers=tuple(self.layers),
            spec=self.spec,
            skip=self.skip,
            seed=self.seed,
            n_pos=self.n_pos,
            sums={k: v.to("cpu", torch.float64) for k, v in self.sums.items()},
            provenance=provenance,
        )


@dataclass(frozen=True)
class FrequencyEntropy(
    Result, merge_same=("layers", "skip", "seed", "n_pos", "spec"), merge_sums=("sums",)
):
    """Spectral entropy of each plane's query norm along the sequence, per layer × head × plane.

    ``sums`` holds, over windows, the count, sum and sum of squares of the normalised entropy, in
    order (``h``) and in one fixed shuffled order of positions (``shuffled``), and the summed
    normalised spectrum per layer × plane (heads together) over the ``n_pos // 2`` non-zero
    frequencies of ``n_pos`` positions (the window after its first ``skip``).

    Built by :func:`~ropelens.analyses.frequency_entropy`. The entropy is normalised by ln F (1 = a
    flat spectrum); the shuffled order is the control, so :meth:`gap` > 0 marks a plane whose norm
    is periodic beyond what its values alone give.

    Attributes:
        layers (tuple[int, ...]): The measured layers, in the order of the ``layer`` axis.
        spec (RopeSpec): The model's RoPE reading; NoPE layers are split into the rotary layers'
            planes.
        skip (int): Leading positions of each window left out (the attention-sink position).
        seed (int): Seed of the fixed shuffled order of positions (the control).
        n_pos (int): Positions per window after ``skip``; the spectrum has ``n_pos // 2``
            frequencies.
        sums (dict[str, Tensor]): Streamed sums over windows: ``count``, ``h``, ``h_sq`` and
            ``shuffled_count``, ``shuffled``, ``shuffled_sq``, each ``[layer, head, plane]``;
            ``spectrum``, ``[layer, plane, n_pos // 2]``.
        provenance (Provenance): Model, corpus, token count and versions.

    Examples:
        >>> import torch
        >>> from ropelens.analyses import frequency_entropy
        >>> from ropelens.testing import tiny_model
        >>> tokens = torch.randint(4, 100, (2, 16), generator=torch.Generator().manual_seed(0))
        >>> fe = frequency_entropy(tiny_model("llama"), tokens, progress=False)
        >>> fe.n_pos, tuple(fe.entropy().shape), tuple(fe.spectrum().shape)
        (15, (2, 4, 8), (2, 8, 7))
        >>> sorted(fe.by_kind())
        ['full']
    """

    layers: tuple[int, ...]
    spec: RopeSpec
    skip: int
    seed: int
    n_pos: int
    sums: dict[str, Tensor]
    provenance: Provenance

    def __post_init__(self) -> None:
        L, H = len(self.layers), self.spec.layers[self.layers[0]].n_heads
        P = plane_layout(self.spec, self.layers[0])[0] // 2
        for k in ("count", "h", "h_sq", "shuffled_count", "shuffled", "shuffled_sq"):
            self._check_shape(f"sums[{k!r}]", self.sums[k], (L, H, P))
        self._check_shape("sums['spectrum']", self.sums["spectrum"], (L, P, self.n_pos // 2))

    # ---------------------------------------------------------------- numbers
    def kind(self, layer: int) -> str:
        """The layer's kind: "nope", or the rotary kind ("full", "sliding")."""
        return self.spec.layers[layer].kind

    def entropy(self, shuffled: bool = False) -> Float[Tensor, "layer head plane"]:
        """Mean normalised spectral entropy over windows (in order, or in the shuffled order); NaN
        where no window had any variation."""
        key = "shuffled" if shuffled else "h"
        n = self.sums["shuffled_count" if shuffled else "count"]
        return self.sums[key] / count_or_nan(n)

    def gap(self) -> Float[Tensor, "layer head plane"]:
        """Shuffled minus in-order entropy: how much of the spectrum's concentration the order makes
        (> 0: periodic beyond what the values alone give)."""
        return self.entropy(shuffled=True) - self.entropy()

    def spectrum(self) -> Float[Tensor, "layer plane freq"]:
        """Mean normalised power spectrum per layer × plane (heads and windows averaged)."""
        n = self.sums["count"].sum(1, keepdim=True).clamp_min(1)  # [L, 1, P]
        return self.sums["spectrum"] / n.transpose(1, 2)

    def peak_period(self) -> Float[Tensor, "layer plane"]:
        """Period in tokens, n_pos / f, of the strongest frequency f of each plane's mean
        spectrum."""
        f = self.spectrum().argmax(-1).double() + 1
        return self.n_pos / f

    def by_kind(self) -> dict[str, dict[str, float]]:
        """Per layer kind: mean entropy (in order, shuffled) and mean gap over its layers, heads and
        planes."""
        out: dict[str, dict[str, float]] = {}
        h, s = self.entropy(), self.entropy(shuffled=True)
        for kind in dict.fromkeys(self.kind(L) for L in self.layers):
            idx = [i for i, L in enumerate(self.layers) if self.kind(L) == kind]
            a, b = h[idx], s[idx]
            out[kind] = {
                "n_layers": len(idx),
                "entropy": float(a.nanmean()),
                "shuffled": float(b.nanmean()),
                "gap": float((b - a).nanmean()),
                "periodic_share": float(((b - a) > 0).double().mean()),
            }
        return out

    # ---------------------------------------------------------------- findings
    def findings(self) -> list[Finding]:
        """Mean normalised entropy per layer kind, against the shuffled-order control."""
        kinds = self.by_kind()
        parts = []
        for kind, v in kinds.items():
            noun = "NoPE layers" if kind == "nope" else f"rotary ({kind}) layers"
            parts.append(
                f"{noun} ({v['n_layers']}): entropy {v['entropy']:.3f} vs {v['shuffled']:.3f} "
                f"shuffled (gap {v['gap']:+.3f}; {100 * v['periodic_share']:.0f}% of head-planes "
                "below their shuffled value)"
            )
        text = (
            "Spectral entropy of each plane's query norm along the sequence (1 = flat spectrum): "
            + "; ".join(parts)
            + "."
        )
        vals = {
            k: {n: round(x, 4) if isinstance(x, float) else x for n, x in v.items()}
            for k, v in kinds.items()
        }
        return [Finding("frequency_entropy", "entropy", text, vals)]

    def to_frame(self) -> pd.DataFrame:
        """Tidy table: one row per (layer, head, plane) with the layer kind, the plane's wavelength
        (inf in NoPE layers), entropy, shuffled entropy, gap, and the plane's peak period."""
        L, H, P = self.sums["h"].shape
        layer, head, plane = np.meshgrid(
            np.array(self.layers), np.arange(H), np.arange(P), indexing="ij"
        )
        wl = torch.stack([_wavelengths(self.spec.layers[x], P) for x in self.layers])  # [L, P]
        return pd.DataFrame(
            {
                "layer": layer.ravel(),
                "kind": [self.kind(int(x)) for x in layer.ravel()],
                "head": head.ravel(),
                "plane": plane.ravel(),
                "wavelength": wl[:, None, :].expand(L, H, P).flatten().numpy(),
                "entropy": self.entropy().flatten().numpy(),
                "shuffled": self.entropy(True).flatten().numpy(),
                "gap": self.gap().flatten().numpy(),
                "peak_period": self.peak_period()[:, None, :].expand(L, H, P).flatten().numpy(),
            }
        )

    # ---------------------------------------------------------------- persistence


def _wavelengths(lr: LayerRope, n_planes: int) -> Tensor:
    return lr.wavelength if lr.rotary else torch.full((n_planes,), math.inf, dtype=torch.float64)


@corpus_analysis(n_ctx=256, max_tokens=8192)
def frequency_entropy(
    model, corpus, run: RunOptions, *, skip: int = 1, seed: int = 0
) -> FrequencyEntropy:
    """Spectral entropy of every plane's query norm along the sequence, per layer × head (streamed).

    Per window, layer, head and plane, the norm of the query's 2-D component at each position is
    read as a signal; its power spectrum (mean removed) is normalised to sum to 1 and its Shannon
    entropy divided by ln F, so 1 is a flat spectrum and a periodic signal scores lower. The control
    reads the same values in one seeded random order of positions. A 2026 proposal claims the
    spectrum is periodic in RoPE layers and not in NoPE layers (Llama 4); NoPE layers may be
    measured too: their heads are split into the planes the model's rotary layers use.

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
        max_tokens (int | None): Corpus tokens to read (default 8192; None: all of it).
        layers (Sequence[int] | None): Layer indices to measure (default None: every layer, NoPE
            layers included).
        text_column (str): The column of a table or dataset corpus that holds the text (default
            "text").
        skip (int): Leading positions of each window left out (default 1: the attention sink, whose
            norms stand apart).
        seed (int): Seed of the shuffled order of positions in the control (default 0).
        batch_size (int): Windows per forward pass (default 4).
        progress (bool): Show a progress bar (default True; rank 0 only under torchrun).
        checkpoint (str | os.PathLike | None): A directory to save progress to and resume a killed
            run from (default None: none; see :mod:`ropelens.run.distributed`).
        checkpoint_every (int): Batches between checkpoints (default 8).
        verify (bool): First check that ropelens's reading of RoPE reproduces the model's own
            attention (default True); False skips the check, and the result says "unverified".

    Returns:
        FrequencyEntropy: Summed entropies (measured and shuffled) per ``[layer, head, plane]`` over
        windows, with the planes' wavelengths.

    Raises:
        InputError: When ``layers`` selects no layer the model has, the corpus cannot be read, or
            ``skip`` / ``seed`` is not a valid integer (the message names the problem and the fix).
        UnsupportedModelError: When ``verify`` finds that the RoPE reading does not reproduce the
            model's own attention.

    Examples:
        >>> from ropelens.analyses import frequency_entropy
        >>> from ropelens.testing import tiny_model
        >>> model = tiny_model("llama")
        >>> entropy = frequency_entropy(model, n_ctx=32, max_tokens=128, progress=False)
        >>> frame = entropy.to_frame()
        >>> sorted(set(frame["layer"])), bool(frame["entropy"].between(0, 1).all())
        ([0, 1], True)
    """
    skip = int(
        check_number(skip, "skip", at_least=0, integer=True, hint=" (leading positions left out)")
    )
    seed = int(check_number(seed, "seed", integer=True))
    m = measure(
        model,
        corpus,
        lambda spec, chosen, win: EntropyReducer(spec, chosen, win.n_ctx, skip=skip, seed=seed),
        run,
        analysis="frequency_entropy",
        config={"skip": skip, "seed": seed},
        desc="frequency entropy",
        rotary_only=False,
    )
    return m.reducer.result(m.provenance)
