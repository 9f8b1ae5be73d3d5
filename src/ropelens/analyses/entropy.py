"""Frequency entropy: how periodic each plane's query norm is along the sequence.

A 2026 proposal reads, per RoPE plane, the norm of the query's 2-D component at every position of a
window, ‖q_t^(i)‖, as a signal over positions t; takes its power spectrum (FFT with the mean
removed, so the constant part does not count); normalises the spectrum to sum to 1; and takes its
Shannon entropy. A signal that repeats with a few periods puts its power in a few bins (low
entropy); one with no order spreads it over all of them (high entropy). The claim: the spectrum is
periodic in RoPE layers and not in NoPE layers (Llama 4).

ropelens computes, per window, layer, head and plane, the entropy H = −Σ_f p_f ln p_f over the
``F = ⌊(n − skip)/2⌋`` non-zero frequencies of the ``n − skip`` positions after the first ``skip``
(the attention-sink position, whose norms stand apart), divided by ln F so that 1 is a flat spectrum.
Planes are the rotary layers' own; a NoPE layer has none, so its head is split into the planes the
model's rotary layers use (same pairing and rotary width), which is what its queries would rotate.

As a control the same signal is read in one fixed random order of positions (seeded): that keeps every
value and destroys the order, so its entropy is what the plane's values give without any
periodicity (for white noise, ≈ 1 − (1 − γ)/ln F: a periodogram is not flat). A plane is periodic
where its entropy falls below its shuffled entropy.
The per-window entropies add up over windows, so the result merges exactly.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np
import pandas as pd
import plotly.graph_objects as go
import torch
from jaxtyping import Float
from plotly.subplots import make_subplots
from torch import Tensor

from ropelens.errors import InputError
from ropelens.results.findings import Finding
from ropelens.results.provenance import Provenance
from ropelens.results.result import Result
from ropelens.run.capture import DeviceSums, LayerActs
from ropelens.run.measure import RunOptions, corpus_analysis, measure
from ropelens.spec.rope import LayerRope, RopeSpec, plane_norms
from ropelens.validate import check_number

__all__ = ["EntropyReducer", "FrequencyEntropy", "frequency_entropy", "plane_layout", "spectral_entropy"]


def plane_layout(spec: RopeSpec, layer: int) -> tuple[int, str]:
    """(rotary width, pairing) a layer's head is split into planes with: its own, or for a NoPE layer
    that of the model's rotary layers with the same head width (else the whole head, halves paired)."""
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
        raise InputError(f"a spectrum needs at least 4 positions, got {n}: use longer windows (--n-ctx)")
    x = signal - signal.mean(-1, keepdim=True)
    power = torch.fft.rfft(x, dim=-1).abs().square()[..., 1 : F + 1]
    p = power / power.sum(-1, keepdim=True)  # 0/0 → NaN for a constant signal, kept as "no spectrum"
    h = -torch.xlogy(p, p).sum(-1) / math.log(F)
    return h, p


class EntropyReducer(DeviceSums):
    """Streams, per layer × head × plane, the sum over windows of the spectral entropy of ‖q_t^(i)‖
    (in order and in a fixed shuffled order), its square, the windows counted, and the summed spectrum."""

    def __init__(self, spec: RopeSpec, layers: Sequence[int], n_ctx: int, *, skip: int = 1, seed: int = 0) -> None:
        self.spec, self.layers, self.skip, self.seed = spec, list(layers), int(skip), int(seed)
        self.needs = frozenset({"q_pre"})
        widths = {plane_layout(spec, L) for L in self.layers}
        heads = {spec.layers[L].n_heads for L in self.layers}
        if len({w for w, _ in widths}) != 1 or len(heads) != 1:
            raise InputError("selected layers have different plane or head counts; analyse them separately with layers=[...]")
        self.n_pos = int(n_ctx) - self.skip
        if self.skip < 0 or self.n_pos < 4:
            raise InputError(f"skip={skip} leaves {self.n_pos} of {n_ctx} positions; a spectrum needs at least 4: "
                             "lower skip or use longer windows")
        P, H, F = widths.pop()[0] // 2, heads.pop(), self.n_pos // 2
        L = len(self.layers)
        self.pos = {layer: i for i, layer in enumerate(self.layers)}
        g = torch.Generator().manual_seed(self.seed)
        self.perm = torch.randperm(self.n_pos, generator=g)
        z = lambda *s: torch.zeros(s, dtype=torch.float64)  # noqa: E731
        self.sums = {"count": z(L, H, P), "h": z(L, H, P), "h_sq": z(L, H, P), "shuffled_count": z(L, H, P),
                     "shuffled": z(L, H, P), "shuffled_sq": z(L, H, P), "spectrum": z(L, P, F)}

    def state_dict(self) -> dict[str, Tensor]:
        """Every running sum by name (the tensors themselves): they add across runs and processes."""
        return self.sums

    def update(self, acts: LayerActs) -> None:
        if acts.padded:
            raise InputError("frequency entropy needs whole windows (a spectrum over positions): pass unpadded windows")
        sums = self._on(acts.valid.device)
        i = self.pos[acts.layer]
        width, pairing = plane_layout(self.spec, acts.layer)
        q = acts["q_pre"][:, self.skip :]
        if q.shape[1] != self.n_pos:
            raise InputError(f"windows of {q.shape[1] + self.skip} tokens reached a reducer built for "
                             f"{self.n_pos + self.skip}: build it with the windows' n_ctx")
        # float64: the spectrum of a norm that barely varies is a small difference of large sums
        norms = plane_norms(q.double(), width, pairing).permute(0, 2, 3, 1)  # [b, head, plane, pos]
        dt = sums["h"].dtype
        for key, signal in (("", norms), ("shuffled", norms[..., self.perm.to(norms.device)])):
            h, p = spectral_entropy(signal)
            ok = torch.isfinite(h)
            h = torch.where(ok, h, torch.zeros_like(h))
            name = key or "h"
            sums[f"{key}_count" if key else "count"][i] += ok.sum(0).to(dt)
            sums[name][i] += h.sum(0).to(dt)
            sums[f"{name}_sq"][i] += (h * h).sum(0).to(dt)
            if not key:
                sums["spectrum"][i] += torch.nan_to_num(p, nan=0.0).sum((0, 1)).to(dt)

    def result(self, provenance: Provenance) -> FrequencyEntropy:
        """The streamed sums as a :class:`FrequencyEntropy`."""
        return FrequencyEntropy(layers=tuple(self.layers), spec=self.spec, skip=self.skip, seed=self.seed,
                                n_pos=self.n_pos, sums={k: v.to("cpu", torch.float64) for k, v in self.sums.items()},
                                provenance=provenance)


@dataclass(frozen=True)
class FrequencyEntropy(Result):
    """Spectral entropy of each plane's query norm along the sequence, per layer × head × plane.

    ``sums`` holds, over windows, the count, sum and sum of squares of the normalised entropy, in
    order (``h``) and in one fixed shuffled order of positions (``shuffled``), and the summed
    normalised spectrum per layer × plane (heads together) over the ``n_pos // 2`` non-zero
    frequencies of ``n_pos`` positions (the window after its first ``skip``).
    """

    layers: tuple[int, ...]
    spec: RopeSpec
    skip: int
    seed: int
    n_pos: int
    sums: dict[str, Tensor]
    provenance: Provenance

    KIND: ClassVar[str] = "FrequencyEntropy"
    FORMAT: ClassVar[int] = 1
    MERGE_SAME: ClassVar[tuple[str, ...]] = ("layers", "skip", "seed", "n_pos", "spec")
    MERGE_SUMS: ClassVar[tuple[str, ...]] = ("sums",)

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
        """Mean normalised spectral entropy over windows (in order, or in the shuffled order); NaN where
        no window had any variation."""
        key = "shuffled" if shuffled else "h"
        n = self.sums["shuffled_count" if shuffled else "count"]
        return torch.where(n > 0, self.sums[key] / n.clamp_min(1), torch.full_like(n, math.nan))

    def gap(self) -> Float[Tensor, "layer head plane"]:
        """Shuffled minus in-order entropy: how much of the spectrum's concentration the order makes
        (> 0: periodic beyond what the values alone give)."""
        return self.entropy(shuffled=True) - self.entropy()

    def spectrum(self) -> Float[Tensor, "layer plane freq"]:
        """Mean normalised power spectrum per layer × plane (heads and windows averaged)."""
        n = self.sums["count"].sum(1, keepdim=True).clamp_min(1)  # [L, 1, P]
        return self.sums["spectrum"] / n.transpose(1, 2)

    def peak_period(self) -> Float[Tensor, "layer plane"]:
        """Period in tokens, n_pos / f, of the strongest frequency f of each plane's mean spectrum."""
        f = self.spectrum().argmax(-1).double() + 1
        return self.n_pos / f

    def by_kind(self) -> dict[str, dict[str, float]]:
        """Per layer kind: mean entropy (in order, shuffled) and mean gap over its layers, heads and planes."""
        out: dict[str, dict[str, float]] = {}
        h, s = self.entropy(), self.entropy(shuffled=True)
        for kind in dict.fromkeys(self.kind(L) for L in self.layers):
            idx = [i for i, L in enumerate(self.layers) if self.kind(L) == kind]
            a, b = h[idx], s[idx]
            out[kind] = {"n_layers": len(idx), "entropy": float(a.nanmean()), "shuffled": float(b.nanmean()),
                         "gap": float((b - a).nanmean()), "periodic_share": float(((b - a) > 0).double().mean())}
        return out

    # ---------------------------------------------------------------- findings
    def findings(self) -> list[Finding]:
        """Mean normalised entropy per layer kind, against the shuffled-order control."""
        kinds = self.by_kind()
        parts = []
        for kind, v in kinds.items():
            noun = "NoPE layers" if kind == "nope" else f"rotary ({kind}) layers"
            parts.append(f"{noun} ({v['n_layers']}): entropy {v['entropy']:.3f} vs {v['shuffled']:.3f} shuffled "
                         f"(gap {v['gap']:+.3f}; {100 * v['periodic_share']:.0f}% of head-planes below their shuffled value)")
        text = ("Spectral entropy of each plane's query norm along the sequence (1 = flat spectrum): "
                + "; ".join(parts) + ".")
        vals = {k: {n: round(x, 4) if isinstance(x, float) else x for n, x in v.items()} for k, v in kinds.items()}
        return [Finding("frequency_entropy", "entropy", text, vals)]

    def to_frame(self) -> pd.DataFrame:
        """Tidy table: one row per (layer, head, plane) with the layer kind, the plane's wavelength
        (inf in NoPE layers), entropy, shuffled entropy, gap, and the plane's peak period."""
        L, H, P = self.sums["h"].shape
        layer, head, plane = np.meshgrid(np.array(self.layers), np.arange(H), np.arange(P), indexing="ij")
        wl = torch.stack([_wavelengths(self.spec.layers[x], P) for x in self.layers])  # [L, P]
        return pd.DataFrame({
            "layer": layer.ravel(), "kind": [self.kind(int(x)) for x in layer.ravel()], "head": head.ravel(),
            "plane": plane.ravel(), "wavelength": wl[:, None, :].expand(L, H, P).flatten().numpy(),
            "entropy": self.entropy().flatten().numpy(), "shuffled": self.entropy(True).flatten().numpy(),
            "gap": self.gap().flatten().numpy(),
            "peak_period": self.peak_period()[:, None, :].expand(L, H, P).flatten().numpy(),
        })

    # ---------------------------------------------------------------- persistence
    def to_dict(self) -> dict[str, Any]:
        return {"layers": list(self.layers), "spec": self.spec.to_dict(), "skip": self.skip, "seed": self.seed,
                "n_pos": self.n_pos, "sums": {k: v.tolist() for k, v in self.sums.items()},
                "provenance": self.provenance.to_dict()}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> FrequencyEntropy:
        return cls(layers=tuple(d["layers"]), spec=RopeSpec.from_dict(d["spec"]), skip=int(d["skip"]),
                   seed=int(d["seed"]), n_pos=int(d["n_pos"]),
                   sums={k: torch.tensor(v, dtype=torch.float64) for k, v in d["sums"].items()},
                   provenance=Provenance.from_dict(d["provenance"]))

    # ---------------------------------------------------------------- figures
    def figure(self) -> go.Figure:
        """Layer × plane entropy (heads averaged), and per layer the mean entropy in order and shuffled."""
        h = self.entropy().nanmean(1)
        names = [f"{L} ({self.kind(L)})" for L in self.layers]
        fig = make_subplots(rows=1, cols=2, column_widths=[0.6, 0.4], horizontal_spacing=0.12,
                            subplot_titles=["entropy: layer × plane (heads averaged)", "per layer: in order vs shuffled"])
        fig.add_trace(go.Heatmap(z=h.numpy(), x=list(range(h.shape[-1])), y=names, colorscale="Viridis",
                                 colorbar={"title": "H / ln F", "x": 0.5},
                                 hovertemplate="layer %{y}<br>plane %{x}<br>entropy %{z:.3f}<extra></extra>"),
                      row=1, col=1)
        per = self.entropy().nanmean((1, 2)).numpy(), self.entropy(True).nanmean((1, 2)).numpy()
        for vals, name in zip(per, ("in order", "shuffled"), strict=True):
            fig.add_trace(go.Scatter(x=vals, y=names, mode="markers", name=name), row=1, col=2)
        fig.update_xaxes(title_text="plane (0 = highest frequency)", row=1, col=1)
        fig.update_xaxes(title_text="mean entropy", row=1, col=2)
        fig.update_yaxes(autorange="reversed")
        fig.update_layout(title=f"Frequency entropy — {self.provenance.model}", height=420,
                          margin={"t": 70, "l": 80, "r": 20, "b": 50})
        return fig


def _wavelengths(lr: LayerRope, n_planes: int) -> Tensor:
    return lr.wavelength if lr.rotary else torch.full((n_planes,), math.inf, dtype=torch.float64)


@corpus_analysis(n_ctx=256, max_tokens=8192)
def frequency_entropy(model, corpus, run: RunOptions, *, skip: int = 1, seed: int = 0) -> FrequencyEntropy:
    """Spectral entropy of every plane's query norm along the sequence, per layer × head (streamed).

    ``layers`` (default: every layer) may name NoPE layers: their heads are split into the planes
    the model's rotary layers use. ``skip`` leading positions of each window are left out (the
    attention sink); ``seed`` fixes the shuffled order of the control.
    """
    skip = int(check_number(skip, "skip", at_least=0, integer=True, hint=" (leading positions left out)"))
    seed = int(check_number(seed, "seed", integer=True))
    m = measure(model, corpus, lambda spec, chosen, win: EntropyReducer(spec, chosen, win.n_ctx, skip=skip, seed=seed),
                run, analysis="frequency_entropy", config={"skip": skip, "seed": seed}, desc="frequency entropy",
                rotary_only=False)
    return m.reducer.result(m.provenance)
