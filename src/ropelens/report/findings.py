"""Findings: sentences written from the measured numbers (never canned), with the numbers kept."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from ropelens.analyses.decompose import BandStatistics
from ropelens.analyses.usage import FrequencyUsage
from ropelens.bands import Bands

__all__ = ["Finding", "energy_finding", "margin_finding", "sink_finding", "sink_ratios",
           "tightness_finding", "top1_finding", "head_name"]

MARGIN_MAJORITY = 0.5  # "most of its margin": more than half
MAX_LISTED = 5


@dataclass(frozen=True)
class Finding:
    """One generated sentence, the section it summarises, and the numbers it quotes."""

    key: str
    section: str
    text: str
    values: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"key": self.key, "section": self.section, "text": self.text, "values": self.values}


def head_name(layer: int, head: int) -> str:
    return f"L{layer}.H{head}"


def _winners(per_layer: torch.Tensor, names: tuple[str, ...] | list[str]) -> tuple[str, int, float]:
    """Band that wins most layers (argmax over the last axis), how many it wins, its mean winning value."""
    best = per_layer.argmax(-1)
    counts = torch.bincount(best, minlength=per_layer.shape[-1])
    b = int(counts.argmax())
    won = best == b
    return names[b], int(counts[b]), float(per_layer[won, b].mean())


def energy_finding(usage: FrequencyUsage, bands: Bands) -> Finding:
    """Which band holds the most query (and key) energy, in how many layers (sink positions excluded)."""
    vals: dict[str, Any] = {"scope": "no_sink", "n_layers": len(usage.layers)}
    parts = []
    for which, noun in (("q", "Queries"), ("k", "keys")):
        names, share = usage.band_share(bands, which, "no_sink")  # [L, H, B]
        band, n, mean = _winners(share.mean(1), names)
        vals[which] = {"band": band, "layers": n, "mean_share": round(mean, 2)}
        parts.append(f"{noun} hold the most energy (squared norm) in band {band} in {n} of "
                     f"{len(usage.layers)} layers (mean share {mean:.2f} where it leads)")
    text = "; ".join(parts) + " — sink positions excluded."
    return Finding("energy", "usage", text, vals)


def margin_finding(stats: BandStatistics) -> Finding | None:
    """Heads that get most of their attended-key margin from the highest-frequency band."""
    if len(stats.band_names) < 2:
        return None
    share = stats.margin_share()[..., 0]  # band 0: the highest frequencies
    top1 = stats.top1()[..., 0]
    band = stats.band_names[0]
    L, H = share.shape
    flat = [(float(share[i, h]), stats.layers[i], h, float(top1[i, h])) for i in range(L) for h in range(H)]
    flat.sort(key=lambda t: -t[0])
    major = [t for t in flat if t[0] > MARGIN_MAJORITY]
    listed = major[:MAX_LISTED] if major else flat[:1]  # only what the sentence quotes
    heads = [{"layer": lay, "head": h, "margin_share": round(s, 2), "top1": round(t, 2)} for s, lay, h, t in listed]
    shown = ", ".join(f"{head_name(x['layer'], x['head'])} {x['margin_share']:.2f} (band-only top-1 {x['top1']:.2f})"
                      for x in heads)
    vals = {"band": band, "n_heads": L * H, "n_majority": len(major), "heads": heads}
    if major:
        verb = "gets" if len(major) == 1 else "get"
        their = "its" if len(major) == 1 else "their"
        text = (f"{len(major)} of {L * H} heads {verb} more than half of {their} attended-key margin from band "
                f"{band}: {shown}.")
    else:
        top = heads[0]
        text = (f"No head gets more than half of its attended-key margin from band {band}; the largest share is "
                f"{top['margin_share']:.2f} ({head_name(top['layer'], top['head'])}, band-only top-1 {top['top1']:.2f}).")
    return Finding("margin", "bands", text, vals)


def sink_ratios(usage: FrequencyUsage) -> dict[str, torch.Tensor] | None:
    """Per layer: mean per-plane norm at the sink positions ÷ that at all other positions (q and k)."""
    out = {}
    for w in "qk":
        a, ns = usage.token[(w, "all")], usage.token[(w, "no_sink")]
        n_sink = a.count - ns.count
        if not bool((n_sink > 0).all()):
            return None
        sink = (a.total - ns.total) / n_sink
        out[w] = (sink.mean((1, 2)) / ns.mean.mean((1, 2)).clamp_min(1e-30)).float()
    return out


def sink_finding(usage: FrequencyUsage) -> Finding | None:
    """The layer whose sink positions stand out most (key norm ratio farthest from 1, either way)."""
    ratios = sink_ratios(usage)
    if ratios is None:
        return None
    k, q = ratios["k"], ratios["q"]
    i = int(k.clamp_min(1e-30).log().abs().argmax())
    vals = {"layer": usage.layers[i], "k_ratio": round(float(k[i]), 2), "q_ratio": round(float(q[i]), 2),
            "k_min": round(float(k.min()), 2), "k_max": round(float(k.max()), 2),
            "k_median": round(float(k.median()), 2), "n_sink": usage.n_sink}
    pos = "the first position" if usage.n_sink == 1 else f"the first {usage.n_sink} positions"
    way = "larger" if vals["k_ratio"] >= 1 else "smaller"
    text = (f"Sink keys differ most from other keys in layer {vals['layer']}: keys at {pos} carry {vals['k_ratio']:.2f}× "
            f"the mean per-plane norm of other positions ({way}; queries {vals['q_ratio']:.2f}×); across layers the key ratio runs "
            f"from {vals['k_min']:.2f}× to {vals['k_max']:.2f}× (median {vals['k_median']:.2f}×).")
    return Finding("sink", "usage", text, vals)


def tightness_finding(stats: BandStatistics) -> Finding:
    """Mean Cauchy–Schwarz tightness of the highest-frequency plane at the attended key."""
    t = stats.tightness()  # [L, H, P]
    L, H, P = t.shape
    top = t[..., 0]
    i, h = divmod(int(top.argmax()), H)
    wl = float(stats.spec.layers[stats.layers[0]].wavelength[0])
    vals = {"plane": 0, "wavelength": round(wl, 2), "mean": round(float(top.mean()), 2),
            "best_layer": stats.layers[i], "best_head": h, "best": round(float(top[i, h]), 2),
            "lowest_plane": P - 1, "lowest_mean": round(float(t[..., P - 1].mean()), 2), "n_heads": L * H}
    text = (f"At the attended key, plane 0 (highest frequency, λ = {vals['wavelength']:.2f} tokens) reaches on average "
            f"{vals['mean']:.2f} of its Cauchy–Schwarz bound over {L * H} heads (1 = q and k aligned); tightest "
            f"{head_name(vals['best_layer'], h)} at {vals['best']:.2f}. The lowest-frequency plane ({P - 1}) "
            f"averages {vals['lowest_mean']:.2f}.")
    return Finding("tightness", "bands", text, vals)


def top1_finding(stats: BandStatistics) -> Finding | None:
    """Which band alone most often picks the key the model attends to most."""
    if len(stats.band_names) < 2:
        return None
    top1 = stats.top1()  # [L, H, B]
    band, n, _ = _winners(top1.mean(1), stats.band_names)
    overall = top1.mean((0, 1))
    b = stats.band_names.index(band)
    vals = {"band": band, "layers": n, "n_layers": len(stats.layers), "mean_top1": round(float(overall[b]), 2),
            "first_band": stats.band_names[0], "first_top1": round(float(overall[0]), 2)}
    text = (f"Alone, band {band} most often picks the key the model attends to most: it leads in {n} of "
            f"{len(stats.layers)} layers, with top-1 agreement {vals['mean_top1']:.2f} over all heads")
    text += "." if b == 0 else f", against {vals['first_top1']:.2f} for band {vals['first_band']}."
    return Finding("top1", "bands", text, vals)
