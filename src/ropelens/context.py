"""Context extension seen per plane: what each scaling method does to each frequency, and RoPE's bounds.

**Plane categories** (:func:`plane_view`). A plane with frequency θ (before) and θ' (after the method)
that was trained on positions 0 … L₀ and now must serve 0 … L reaches the angle L·θ' at most:

- ``"kept"``: θ' = θ and the plane already completed a turn within L₀ (λ = 2π/θ ≤ L₀), so every
  angle it meets at L was seen (mod 2π) in training: safe, unchanged;
- ``"interpolated"``: θ' ≠ θ (normally θ' < θ) and every angle it meets at L was seen in training,
  i.e. λ ≤ L₀ or L·θ' ≤ L₀·θ: in distribution, at the cost of coarser relative positions;
- ``"extrapolated"``: the plane never completed a turn within L₀ (λ > L₀) and reaches angles beyond
  the largest seen, L·θ' > L₀·θ: out of distribution (plain RoPE's failure, or too little scaling);
- ``"unrotated"``: θ = 0 before (NoPE planes), nothing to extend.

Equalities hold to a relative tolerance of 1e-6, so PI with factor L/L₀ interpolates exactly.

**Critical dimension** (Liu et al., "Scaling Laws of RoPE-based Extrapolation", arXiv 2310.05209):
d_extra = 2⌈(d/2)·log_base(L_train/2π)⌉, the rotary dims whose planes complete a turn within the
training length (92 of 128 for Llama 2: base 1e4, 4096 tokens). From it, the same paper's
extrapolation limit T_extra = 2π·β^(d_extra/d) (:func:`extrapolation_limit`: the wavelength of the
first plane that never turned in training) and critical base β₀ = β_train^(log_{T_train/2π}(T_tune/2π))
for tuning at T_tune (:func:`critical_base`; the paper's β_train is LLaMA 2's 10000), tabulated
per length with Men et al.'s bound by :func:`base_predictions` and checked against the loss
measured by length by :func:`measured_extrapolation`.

**Base lower bound** (Men et al., "Base of RoPE Bounds Context Length", arXiv 2405.14591): the
smallest base for which B(m) = Σ_i cos(m·θ_i) ≥ 0 for every m < L.

**LongRoPE search** (Ding et al., arXiv 2402.13753): evolutionary search of per-plane factors λ_i ≥ 1,
non-decreasing from the highest frequency, and n̂ leading positions left unscaled, by perplexity.
"""

from __future__ import annotations

import dataclasses
import json
import math
import numbers
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch
from jaxtyping import Float
from torch import Tensor

from ropelens.errors import InputError
from ropelens.intervene import apply_rope_variant
from ropelens.provenance import Provenance
from ropelens.rope import LayerRope
from ropelens.serialize import dump_json
from ropelens.variants import (
    NTK,
    Default,
    DynamicNTK,
    Linear,
    LongRoPE,
    RopeVariant,
    YaRN,
)

__all__ = [
    "CATEGORIES",
    "BasePredictions",
    "LongRopeSearch",
    "MeasuredExtrapolation",
    "PlaneView",
    "base_lower_bound",
    "base_predictions",
    "bound_holds",
    "compare_figure",
    "critical_base",
    "critical_dimension",
    "extrapolation_limit",
    "inv_freq_at",
    "measured_extrapolation",
    "plane_view",
    "search_longrope_factors",
]

CATEGORIES = ("kept", "interpolated", "extrapolated", "unrotated")
_RTOL = 1e-6


def _posint(x: Any, what: str, hint: str = "") -> int:
    if isinstance(x, bool) or not isinstance(x, numbers.Integral) or x <= 0:
        raise InputError(f"{what} must be a positive int, got {x!r}{hint}")
    return int(x)


# --------------------------------------------------------------------------------------------
# per-plane view
# --------------------------------------------------------------------------------------------
def inv_freq_at(variant: RopeVariant, layer: LayerRope, seq_len: int) -> Float[Tensor, " n_planes"]:
    """The variant's frequencies for an input of ``seq_len`` tokens (length-dependent methods included)."""
    if isinstance(variant, (DynamicNTK, LongRoPE)):
        return variant.inv_freq(layer, int(seq_len))
    return variant.inv_freq(layer)


def _categories(before: Tensor, after: Tensor, original_ctx: int, target_ctx: int) -> tuple[str, ...]:
    out = []
    for t0, t1 in zip(before.double().tolist(), after.double().tolist(), strict=True):
        if t0 == 0.0:
            out.append("unrotated")
            continue
        seen = 2 * math.pi / t0 <= original_ctx * (1 + _RTOL) or target_ctx * t1 <= original_ctx * t0 * (1 + _RTOL)
        same = abs(t1 - t0) <= _RTOL * t0
        out.append(("kept" if same else "interpolated") if seen else "extrapolated")
    return tuple(out)


@dataclass(frozen=True)
class PlaneView:
    """One layer's planes before and after a context-extension method, highest frequency first."""

    variant: dict[str, Any]  # RopeVariant.to_dict()
    layer: int
    original_ctx: int
    target_ctx: int
    inv_freq_before: Float[Tensor, " n_planes"]
    inv_freq_after: Float[Tensor, " n_planes"]
    attention_scaling: float
    categories: tuple[str, ...]

    def __post_init__(self) -> None:
        n = self.inv_freq_before.shape
        if self.inv_freq_after.shape != n or len(self.categories) != n[0]:
            raise InputError(
                f"inv_freq_before {tuple(n)}, inv_freq_after {tuple(self.inv_freq_after.shape)} and "
                f"{len(self.categories)} categories must agree: one entry per plane"
            )

    @property
    def label(self) -> str:
        return self.variant.get("variant", "?")

    @property
    def wavelength_before(self) -> Float[Tensor, " n_planes"]:
        return 2 * math.pi / self.inv_freq_before.double()

    @property
    def wavelength_after(self) -> Float[Tensor, " n_planes"]:
        return 2 * math.pi / self.inv_freq_after.double()

    @property
    def scale(self) -> Float[Tensor, " n_planes"]:
        """θ_before / θ_after per plane (the method's rescale factor λ_i; PI gives the factor everywhere)."""
        return self.inv_freq_before.double() / self.inv_freq_after.double()

    def counts(self) -> dict[str, int]:
        """Planes per category."""
        return {c: self.categories.count(c) for c in CATEGORIES}

    def to_frame(self) -> pd.DataFrame:
        """One row per plane."""
        return pd.DataFrame({
            "variant": self.label, "layer": self.layer, "plane": range(len(self.categories)),
            "inv_freq_before": self.inv_freq_before.double().numpy(),
            "inv_freq_after": self.inv_freq_after.double().numpy(),
            "wavelength_before": self.wavelength_before.numpy(),
            "wavelength_after": self.wavelength_after.numpy(), "scale": self.scale.numpy(),
            "category": list(self.categories),
        })

    def to_dict(self) -> dict[str, Any]:
        d = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        return {**d, "inv_freq_before": self.inv_freq_before.tolist(),
                "inv_freq_after": self.inv_freq_after.tolist(), "categories": list(self.categories)}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> PlaneView:
        return cls(**{**d, "inv_freq_before": torch.tensor(d["inv_freq_before"], dtype=torch.float32),
                      "inv_freq_after": torch.tensor(d["inv_freq_after"], dtype=torch.float32),
                      "categories": tuple(d["categories"])})

    def save(self, path: str | Path) -> None:
        """Write JSON atomically (frequencies, not wavelengths: unrotated planes have λ = ∞)."""
        dump_json(path, self.to_dict())

    @classmethod
    def load(cls, path: str | Path) -> PlaneView:
        return cls.from_dict(json.loads(Path(path).read_text()))

    def figure(self):
        """Wavelength before and after per plane, with the original and target context as lines."""
        return compare_figure([self])

    def _repr_html_(self) -> str:
        return self.to_frame().to_html(max_rows=40)


def plane_view(layer_rope: LayerRope, variant: RopeVariant, original_ctx: int, target_ctx: int) -> PlaneView:
    """How ``variant`` rescales each plane of ``layer_rope`` to serve ``target_ctx`` after ``original_ctx``.

    "Before" is the layer's own frequencies; "after" is the variant's for an input of ``target_ctx``
    tokens (dynamic NTK and LongRoPE depend on it). The layer is given n_ctx = ``target_ctx``, which
    HF's LongRoPE uses for its default factor. LongRoPE's n̂ unscaled first positions are not a
    frequency and do not show here.
    """
    if not isinstance(layer_rope, LayerRope):
        raise TypeError(f"layer_rope must be a LayerRope (ropelens.rope_spec(model)[i]), got {type(layer_rope).__name__}")
    original_ctx = _posint(original_ctx, "original_ctx", " (the trained context length)")
    target_ctx = _posint(target_ctx, "target_ctx", " (the extended context length)")
    layer = dataclasses.replace(layer_rope, n_ctx=target_ctx)
    after = inv_freq_at(variant, layer, target_ctx).float()
    before = layer_rope.inv_freq.float()
    return PlaneView(
        variant=variant.to_dict(), layer=layer_rope.layer, original_ctx=original_ctx, target_ctx=target_ctx,
        inv_freq_before=before, inv_freq_after=after, attention_scaling=float(variant.attention_scaling(layer)),
        categories=_categories(before, after, original_ctx, target_ctx),
    )


def compare_figure(views: Sequence[PlaneView]):
    """Wavelength per plane (log scale) before and after each view's method, with the context lines."""
    import plotly.graph_objects as go

    if not views:
        raise InputError("views is empty: pass one PlaneView per method, e.g. [plane_view(lr, Linear(4), L, 4 * L)]")
    fig = go.Figure()
    v0 = views[0]
    planes = list(range(len(v0.categories)))
    fig.add_trace(go.Scatter(x=planes, y=v0.wavelength_before.tolist(), name="before (trained)",
                             mode="lines+markers", line={"color": "black", "dash": "dot"}))
    for v in views:
        fig.add_trace(go.Scatter(x=planes, y=v.wavelength_after.tolist(), name=v.label, mode="lines+markers",
                                 text=list(v.categories), hovertemplate="plane %{x}: λ=%{y:.4g} (%{text})"))
    for ctx, name in ((v0.original_ctx, "original context"), (v0.target_ctx, "target context")):
        # On a log axis shapes take data values but annotations take log10 values (add_hline's
        # own annotation would land at 10^ctx).
        fig.add_shape(type="line", xref="paper", x0=0, x1=1, yref="y", y0=ctx, y1=ctx,
                      line={"dash": "dash", "color": "#7a8294", "width": 1})
        fig.add_annotation(xref="paper", x=0, yref="y", y=math.log10(ctx), text=f"{name} {ctx:,}",
                           showarrow=False, xanchor="left", yanchor="bottom", font={"size": 11})
    fig.update_layout(title=f"Wavelength per plane, layer {v0.layer}: {v0.original_ctx} → {v0.target_ctx} tokens",
                      xaxis_title="plane (0 = highest frequency)", yaxis_title="wavelength 2π/θ (tokens)",
                      yaxis_type="log")
    return fig


# --------------------------------------------------------------------------------------------
# bounds
# --------------------------------------------------------------------------------------------
def critical_dimension(base: float, rotary_dim: int, train_ctx: int) -> int:
    """d_extra = 2⌈(d/2)·log_base(L/2π)⌉, clipped to [0, d] (arXiv 2310.05209)."""
    d = _posint(rotary_dim, "rotary_dim")
    if d % 2:
        raise InputError(f"rotary_dim must be even (RoPE rotates pairs), got {d}")
    if not isinstance(base, numbers.Real) or not base > 1:
        raise InputError(f"base must be a number > 1 (rope_theta), got {base!r}")
    train_ctx = _posint(train_ctx, "train_ctx", " (training length in tokens)")
    x = (d / 2) * math.log(train_ctx / (2 * math.pi)) / math.log(base)
    return int(min(d, max(0, 2 * math.ceil(x - 1e-12))))


def _first_violation(base: float, rotary_dim: int, context_len: int, hint: int | None = None,
                     chunk: int = 1 << 13) -> int | None:
    """Some m < context_len with Σ_i cos(m·θ_i) < 0, or None when there is none (float64).

    Any violation settles an infeasible base, so the search looks where one is likely first: the
    first 512 positions (most bases fail there), then widening windows around ``hint`` (where the
    previous base on a fine grid failed: neighbours fail nearby), then everything else in chunks.
    """
    theta = base ** (-np.arange(0, rotary_dim, 2, dtype=np.float64) / rotary_dim)
    seen: list[tuple[int, int]] = []

    def scan(a: int, b: int) -> int | None:
        for s0, s1 in seen:  # skip what an earlier window covered
            if s0 <= a < s1:
                a = s1
            if s0 < b <= s1:
                b = s0
        if b <= a:
            return None
        seen.append((a, b))
        m = np.arange(a, b, dtype=np.float64)
        bad = np.flatnonzero(np.cos(m[:, None] * theta[None, :]).sum(axis=1) < 0)
        return int(a + bad[0]) if bad.size else None

    windows = [(0, min(context_len, 512))]
    if hint is not None:
        windows += [(max(0, hint - w), min(context_len, hint + w)) for w in (32, 512, chunk)]
    windows += [(a, min(context_len, a + chunk)) for a in range(512, context_len, chunk)]
    for a, b in windows:
        found = scan(a, b)
        if found is not None:
            return found
    return None


def bound_holds(base: float, rotary_dim: int, context_len: int, chunk: int = 1 << 13) -> bool:
    """Whether B(m) = Σ_i cos(m·θ_i) ≥ 0 for every m < context_len, θ_i = base^(−2i/d) (float64)."""
    return _first_violation(base, rotary_dim, context_len, chunk=chunk) is None


def base_lower_bound(rotary_dim: int, context_len: int, *, rtol: float = 1e-4, max_base: float = 1e15,
                     per_decade: int = 200) -> float:
    """Smallest base with Σ_i cos(m·θ_i) ≥ 0 for all m < L (arXiv 2405.14591), to relative ``rtol``.

    Feasibility is not monotone in the base, so the search scans a log grid (``per_decade`` points
    per decade) up from 1 for the first feasible base, then bisects log(base) between it and the grid
    point below until they differ by less than ``rtol``. Returns the upper (feasible) end: the bound
    holds there and fails just below it. A feasible island narrower than a grid step is missed.
    """
    d = _posint(rotary_dim, "rotary_dim")
    context_len = _posint(context_len, "context_len")
    if d % 2:
        raise InputError(f"rotary_dim must be even (RoPE rotates pairs), got {d}")
    if context_len <= 2 or bound_holds(1.0 + 1e-9, d, context_len):
        return 1.0  # cos(0), cos(θ₀) = cos 1 > 0: any base works for L ≤ 2
    if d == 2:
        raise InputError(f"rotary_dim 2 has the single frequency θ₀ = 1 at every base and cos(2) < 0, so "
                         f"no base satisfies the bound for context_len {context_len} > 2: use rotary_dim ≥ 4")
    lo = 0.0
    hi = None
    hint = None
    for k in range(1, int(per_decade * math.log10(max_base)) + 1):
        ln = k * math.log(10) / per_decade
        hint = _first_violation(math.exp(ln), d, context_len, hint)
        if hint is None:
            hi = ln
            break
        lo = ln
    if hi is None:
        raise InputError(f"no base up to {max_base:g} satisfies the bound for rotary_dim {d}, context_len "
                         f"{context_len}: raise max_base")
    while hi - lo > math.log1p(rtol):
        mid = 0.5 * (lo + hi)
        lo, hi = (lo, mid) if bound_holds(math.exp(mid), d, context_len) else (mid, hi)
    return math.exp(hi)


# --------------------------------------------------------------------------------------------
# LongRoPE factor search
# --------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class LongRopeSearch:
    """Best LongRoPE factors found for ``target_len`` and how they compare with PI and YaRN."""

    target_len: int
    original_ctx: int
    factors: tuple[float, ...]  # λ_i per plane, highest frequency first, non-decreasing, ≥ 1
    n_hat: int
    perplexity: float  # of the best candidate on the search windows
    initial_best: float  # best perplexity of the seeded initial population
    baselines: dict[str, float]  # PI (Linear) and YaRN at the same target, on the same windows
    history: tuple[dict[str, Any], ...]  # per generation: best, mean, n_evaluated
    settings: dict[str, Any]
    provenance: Provenance = field(default_factory=lambda: Provenance(model="?"))

    @property
    def variant(self) -> LongRoPE:
        """The best candidate as a variant (short factors 1: inputs ≤ L₀ keep plain RoPE)."""
        return _longrope(self.factors, self.n_hat, self.original_ctx, self.target_len)

    def gain(self) -> dict[str, float]:
        """Relative perplexity reduction of the best candidate over each baseline (0.1 = 10% lower)."""
        return {k: 1 - self.perplexity / v for k, v in self.baselines.items()}

    def to_frame(self) -> pd.DataFrame:
        """One row per generation."""
        return pd.DataFrame(list(self.history))

    def to_dict(self) -> dict[str, Any]:
        d = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        return {**d, "factors": list(self.factors), "history": list(self.history),
                "provenance": self.provenance.to_dict()}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> LongRopeSearch:
        return cls(**{**d, "factors": tuple(d["factors"]), "history": tuple(d["history"]),
                      "provenance": Provenance.from_dict(d["provenance"])})

    def save(self, path: str | Path) -> None:
        dump_json(path, self.to_dict())

    @classmethod
    def load(cls, path: str | Path) -> LongRopeSearch:
        return cls.from_dict(json.loads(Path(path).read_text()))

    def figure(self):
        """Best and mean perplexity per generation, with PI and YaRN as horizontal lines."""
        import plotly.graph_objects as go

        gens = [h["generation"] for h in self.history]
        fig = go.Figure([go.Scatter(x=gens, y=[h[k] for h in self.history], name=k, mode="lines+markers")
                         for k in ("best", "mean")])
        for name, ppl in self.baselines.items():
            fig.add_hline(y=ppl, line_dash="dash", annotation_text=f"{name} {ppl:.4g}")
        fig.update_layout(title=f"LongRoPE factor search, {self.original_ctx} → {self.target_len} tokens",
                          xaxis_title="generation", yaxis_title="perplexity (search windows)")
        return fig


def _longrope(factors: Sequence[float], n_hat: int, original_ctx: int, target_len: int) -> LongRoPE:
    return LongRoPE(short_factor=(1.0,) * len(factors), long_factor=tuple(float(f) for f in factors),
                    original_max_position=original_ctx, factor=target_len / original_ctx, n_hat=int(n_hat))


def _monotone(f: np.ndarray, hi: float) -> np.ndarray:
    """Sorted non-decreasing and clamped to [1, hi], rounded so candidates are JSON-stable keys."""
    return np.round(np.clip(np.sort(f), 1.0, hi), 6)


def _seed_population(layer: LayerRope, s: float, l0: int, size: int, hi: float, rng) -> list[dict[str, Any]]:
    """PI, YaRN-like and NTK factors, then random monotone perturbations of them."""
    base = Default().inv_freq(layer).double()
    seeds = [np.full(layer.n_planes, s)]
    for v in (YaRN(s, l0), NTK(s)):
        seeds.append((base / v.inv_freq(layer).double()).numpy())
    pop = [{"factors": _monotone(f, hi).tolist(), "n_hat": 0} for f in seeds]
    while len(pop) < size:
        f = seeds[len(pop) % len(seeds)] * np.exp(rng.normal(0, 0.15, layer.n_planes))
        pop.append({"factors": _monotone(f, hi).tolist(), "n_hat": int(rng.choice(_n_hat_grid(l0)))})
    return pop[:size]


def _n_hat_grid(l0: int) -> list[int]:
    return [0] + [2**k for k in range(int(math.log2(max(1, l0 // 2))) + 1)]


def _child(a: dict[str, Any], b: dict[str, Any], l0: int, hi: float, rng) -> dict[str, Any]:
    """Uniform crossover of two parents, then multiplicative noise, re-sorted and clamped."""
    fa, fb = np.asarray(a["factors"]), np.asarray(b["factors"])
    f = np.where(rng.random(fa.size) < 0.5, fa, fb) * np.exp(rng.normal(0, 0.1, fa.size))
    n_hat = a["n_hat"] if rng.random() < 0.5 else b["n_hat"]
    if rng.random() < 0.3:
        n_hat = int(rng.choice(_n_hat_grid(l0)))
    return {"factors": _monotone(f, hi).tolist(), "n_hat": int(n_hat)}


def _key(c: dict[str, Any]) -> str:
    return json.dumps(c, sort_keys=True)


def _evaluate(model, variant: RopeVariant, tokens: Tensor) -> float:
    from ropelens.evaluate import window_losses

    with apply_rope_variant(model, variant):
        return float(torch.exp(window_losses(model, tokens, batch_size=4, progress=False).mean()))


def _search_setup(model, target_len, original_ctx, n_windows, tokens) -> tuple[LayerRope, int, Tensor]:
    from ropelens import data
    from ropelens.spec import rope_spec

    spec = rope_spec(model)
    layer = spec[spec.layer_indices()[0]]
    if any(not lr.same_rotation(layer) for lr in spec.layers):
        raise InputError("search_longrope_factors applies one factor vector to every layer, but this model's "
                         "layers rotate differently (e.g. Gemma local/global): search a uniform-RoPE model")
    l0 = _posint(original_ctx if original_ctx is not None else layer.n_ctx, "original_ctx",
                 " (pass the trained context length)")
    if _posint(target_len, "target_len") <= l0:
        raise InputError(f"target_len {target_len} must exceed original_ctx {l0}: the search extends context")
    if tokens is None:
        tokens = data.windows(data.english().split()[1], model, target_len, n_windows=n_windows)
    if tokens.ndim != 2 or tokens.shape[1] != target_len:
        raise InputError(f"tokens must be [n_windows, {target_len}], got {tuple(tokens.shape)}")
    return layer, l0, tokens


def _load_state(path: Path | None, settings: dict[str, Any]) -> dict[str, Any] | None:
    if path is None or not path.exists():
        return None
    state = json.loads(path.read_text())
    if state.get("settings") != settings:
        raise InputError(f"{path} holds a search with other settings ({state.get('settings')}); pass another "
                         "state_path or delete it to start over")
    return state


def search_longrope_factors(model, target_len: int, *, population: int = 8, generations: int = 4,
                            n_windows: int = 4, seed: int = 0, original_ctx: int | None = None,
                            tokens: Tensor | None = None, progress: bool = True,
                            state_path: str | Path | None = None) -> LongRopeSearch:
    """Evolutionary search of LongRoPE factors and n̂ minimising perplexity at ``target_len``.

    Generation 0 is PI, YaRN-like and NTK factors plus random monotone perturbations; each
    generation keeps the better half (elitism, so the best never gets worse) and refills the rest
    with crossover + mutation children of it. Generation g draws from ``default_rng([seed, g])`` and
    the state (population, every perplexity so far) is written atomically to ``state_path`` after each
    generation, so a rerun continues and ends where an uninterrupted run would. ``tokens``
    (``[n, target_len]``) default to ``n_windows`` held-out windows of the embedded English text.
    """
    population = _posint(population, "population", " (candidates per generation, ≥ 2)")
    if population < 2:
        raise InputError(f"population must be at least 2 (parents and children), got {population}")
    generations = _posint(generations, "generations") if generations else 0
    corpus = "english[val]" if tokens is None else "given tokens"
    layer, l0, tokens = _search_setup(model, target_len, original_ctx, n_windows, tokens)
    s, hi = target_len / l0, 2.0 * target_len / l0
    settings = {"target_len": target_len, "original_ctx": l0, "population": population, "seed": int(seed),
                "n_windows": int(tokens.shape[0]), "tokens_sum": int(tokens.sum())}
    path = None if state_path is None else Path(state_path)
    state = _load_state(path, settings) or {"settings": settings, "generation": -1, "population": [],
                                            "evals": {}, "history": []}

    def score(c: dict[str, Any]) -> float:
        k = _key(c)
        if k not in state["evals"]:
            state["evals"][k] = _evaluate(model, _longrope(c["factors"], c["n_hat"], l0, target_len), tokens)
        return state["evals"][k]

    def finish(gen: int, pop: list[dict[str, Any]]) -> None:
        ppl = [score(c) for c in pop]
        pop = [pop[i] for i in np.argsort(ppl, kind="stable")]
        state.update(generation=gen, population=pop)
        state["history"].append({"generation": gen, "best": min(ppl), "mean": float(np.mean(ppl)),
                                 "n_evaluated": len(state["evals"])})
        if path is not None:
            dump_json(path, state)

    if state["generation"] > generations:
        raise InputError(f"{path} already holds {state['generation']} generations, more than generations="
                         f"{generations}: pass generations >= {state['generation']} or another state_path")
    if state["generation"] < 0:
        finish(0, _seed_population(layer, s, l0, population, hi, np.random.default_rng([seed, 0])))
    gens = range(state["generation"] + 1, generations + 1)
    if progress:
        from tqdm.auto import tqdm

        gens = tqdm(gens, desc=f"LongRoPE search → {target_len}", unit="gen")
    for g in gens:
        rng = np.random.default_rng([seed, g])
        parents = state["population"][: max(2, population // 2)]
        children = [_child(*[parents[i] for i in rng.choice(len(parents), 2, replace=False)], l0, hi, rng)
                    for _ in range(population - len(parents))]
        finish(g, parents + children)
        if progress:
            gens.set_postfix(best=f"{state['history'][-1]['best']:.4g}")
    best = state["population"][0]
    baselines = {"PI": _evaluate(model, Linear(s), tokens), "YaRN": _evaluate(model, YaRN(s, l0), tokens)}
    return LongRopeSearch(
        target_len=target_len, original_ctx=l0, factors=tuple(best["factors"]), n_hat=best["n_hat"],
        perplexity=score(best), initial_best=state["history"][0]["best"], baselines=baselines,
        history=tuple(h for h in state["history"] if h["generation"] <= generations),
        settings={**settings, "generations": generations},
        provenance=Provenance(model=_model_name(model), corpus=corpus,
                              n_windows=int(tokens.shape[0]), n_ctx=target_len),
    )


def _model_name(model) -> str:
    from ropelens.spec import model_label

    try:
        return model_label(model)
    except Exception:  # noqa: BLE001 - a label is provenance, never worth failing a search over
        return type(model).__name__



# --------------------------------------------------------------------------------------------
# base predictions (Liu et al., "Scaling Laws of RoPE-based Extrapolation", arXiv 2310.05209)
# --------------------------------------------------------------------------------------------
def _ctx_over_2pi(x: Any, what: str) -> float:
    n = _posint(x, what, " (a context length in tokens)")
    if n <= 2 * math.pi:
        raise InputError(f"{what} must exceed 2π ≈ 6.28 tokens (Liu's formulas take log(T/2π)), got {n}")
    return n / (2 * math.pi)


def _check_base(base: Any, what: str = "base") -> float:
    if isinstance(base, bool) or not isinstance(base, numbers.Real) or not math.isfinite(base) or not base > 1:
        raise InputError(f"{what} must be a finite number > 1 (the RoPE base, rope_theta), got {base!r}")
    return float(base)


def critical_base(train_ctx: int, tune_ctx: int, base: float = 10000.0) -> float:
    """Liu et al.'s critical base β₀ = base^(log_{T_train/2π}(T_tune/2π)) for tuning at ``tune_ctx``.

    The paper writes 10000 for ``base``: LLaMA 2's pre-training base, which fixed its critical
    dimension d_extra/d ≈ log_10000(T_train/2π). The formula solves T_tune = 2π·β₀^(d_extra/d) for β₀
    with that (unrounded) critical dimension, so for a model pre-trained with another base the 10000
    becomes that base, which is what ``base`` is. In the paper's extended scaling law, tuning at
    ``tune_ctx`` with a base ≥ β₀ gives the extrapolation limit :func:`extrapolation_limit` (≥
    ``tune_ctx``: the critical dimension rounds up), set by the base; below β₀ the limit is
    ``tune_ctx``. ``tune_ctx`` = ``train_ctx`` gives ``base`` back.
    """
    b = _check_base(base)
    a, t = _ctx_over_2pi(train_ctx, "train_ctx"), _ctx_over_2pi(tune_ctx, "tune_ctx")
    return b ** (math.log(t) / math.log(a))


def extrapolation_limit(base: float, rotary_dim: int, train_ctx: int, *, train_base: float | None = None) -> float:
    """Liu et al.'s extrapolation limit T_extra = 2π·β^(d_extra/d), in tokens.

    d_extra is :func:`critical_dimension` of the *pre-training* base ``train_base`` (default
    ``base``: the model as trained) at ``train_ctx``. The planes past it never completed a turn in
    pre-training; T_extra is the wavelength, at base β = ``base``, of the first of them (plane
    d_extra/2), beyond which that plane meets angles training did not cover. When every plane
    completes a turn (d_extra = d) nothing limits it and the result is ``inf``.
    """
    b = _check_base(base)
    tb = b if train_base is None else _check_base(train_base, "train_base")
    d_extra = critical_dimension(tb, rotary_dim, train_ctx)
    if d_extra >= rotary_dim:
        return math.inf
    return 2 * math.pi * b ** (d_extra / rotary_dim)


def _lengths(lengths: Any) -> tuple[int, ...]:
    if isinstance(lengths, numbers.Integral) and not isinstance(lengths, bool):
        lengths = [lengths]
    if isinstance(lengths, (str, bytes)) or not isinstance(lengths, (Sequence, np.ndarray)):
        raise InputError(f"lengths must be a list of context lengths in tokens, e.g. [2048, 8192], got {lengths!r}")
    out = tuple(_posint(x, "each length", " (a context length in tokens)") for x in lengths)
    if not out:
        raise InputError("lengths is empty: pass the context lengths to predict, e.g. [2048, 8192]")
    return out


def _layer_base(lr: LayerRope) -> float:
    """The layer's base: the spec's, else read back from θ₁ = base^(−2/d) (plain RoPE only)."""
    if lr.base is not None:
        return float(lr.base)
    if lr.n_planes < 2:
        raise InputError(f"layer {lr.layer} has {lr.n_planes} plane(s) and records no base: pass base=")
    return float(lr.inv_freq[1].double() ** (-lr.rotary_dim / 2))


def _prediction_row(kind: str, layers: list[int], lr: LayerRope, base: float, train_ctx: int,
                    length: int, men_cache: dict[tuple[int, int], float]) -> dict[str, Any]:
    d = lr.rotary_dim
    eff = min(length, lr.window) if lr.window else length
    key = (d, eff)
    if key not in men_cache:
        men_cache[key] = base_lower_bound(d, eff) if d > 2 or eff <= 2 else math.nan
    t_extra = extrapolation_limit(base, d, train_ctx)
    beta0 = critical_base(train_ctx, eff, base) if eff > 2 * math.pi else math.nan
    return {
        "kind": kind, "layers": ",".join(map(str, layers)), "rope_type": lr.rope_type, "base": base,
        "rotary_dim": d, "window": lr.window, "train_ctx": train_ctx, "length": length, "effective_length": eff,
        "critical_dimension": critical_dimension(base, d, eff),
        "critical_dimension_train": critical_dimension(base, d, train_ctx),
        "t_extra": t_extra, "within_t_extra": bool(eff <= t_extra),
        "critical_base": beta0, "base_ge_critical": bool(base >= beta0 * (1 - 1e-9)),
        "men_lower_bound": men_cache[key], "men_bound_holds": bool(bound_holds(base, d, eff)),
    }


@dataclass(frozen=True)
class BasePredictions:
    """What the RoPE base predicts about each context length, per rotary layer kind.

    One row per (layer kind, length). With β the layer's base, d its rotary dim and T_train the
    trained context, the columns are: ``critical_dimension`` (rotary dims whose planes complete a
    turn within the length) and ``critical_dimension_train`` (within T_train, Liu's d_extra);
    Liu's ``t_extra`` = 2π·β^(d_extra/d) and ``within_t_extra`` (length ≤ T_extra); Liu's
    ``critical_base`` β₀ for tuning at the length (the base that makes T_extra reach it) and
    ``base_ge_critical``; Men et al.'s ``men_lower_bound`` on the base and ``men_bound_holds``,
    whether B(m) = Σ cos(m·θ_i) ≥ 0 for all m < length at β itself (checked directly: feasibility
    is not monotone in the base). A sliding-window layer never sees a relative distance past its
    window, so its ``effective_length`` (and T_train) is capped at the window.
    """

    rows: tuple[dict[str, Any], ...]
    lengths: tuple[int, ...]
    provenance: Provenance = field(default_factory=lambda: Provenance(model="?"))

    def to_frame(self) -> pd.DataFrame:
        """One row per (kind, length)."""
        return pd.DataFrame(list(self.rows))

    def compare(self, measured: MeasuredExtrapolation) -> pd.DataFrame:
        """This table joined on length with measured loss and perplexity (lengths both hold)."""
        m = measured.to_frame().drop(columns=["train_ctx"], errors="ignore")
        return self.to_frame().merge(m, on="length", how="inner")

    def to_dict(self) -> dict[str, Any]:
        return {"type": "BasePredictions", "format": 1, "rows": list(self.rows), "lengths": list(self.lengths),
                "provenance": self.provenance.to_dict()}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> BasePredictions:
        return cls(rows=tuple(d["rows"]), lengths=tuple(d["lengths"]), provenance=Provenance.from_dict(d["provenance"]))

    def save(self, path: str | Path) -> None:
        """Write JSON atomically (T_extra = ∞ is written as Infinity)."""
        dump_json(path, self.to_dict())

    @classmethod
    def load(cls, path: str | Path) -> BasePredictions:
        from ropelens.serialize import read_result_json

        return cls.from_dict(read_result_json(path, "BasePredictions", 1))

    def figure(self):
        """Base each length needs (Liu's β₀, Men's bound) against the layer's base, log-log."""
        import plotly.graph_objects as go

        fig = go.Figure()
        df = self.to_frame()
        for kind, g in df.groupby("kind", sort=False):
            fig.add_trace(go.Scatter(x=g["length"], y=g["critical_base"], mode="lines+markers",
                                     name=f"{kind}: Liu critical base β₀"))
            fig.add_trace(go.Scatter(x=g["length"], y=g["men_lower_bound"], mode="lines+markers",
                                     name=f"{kind}: Men lower bound", line={"dash": "dot"}))
            fig.add_trace(go.Scatter(x=g["length"], y=g["base"], mode="lines", name=f"{kind}: model base",
                                     line={"color": "black", "dash": "dash", "width": 1}))
        fig.update_layout(title=f"Base needed per context length — {self.provenance.model}", xaxis_type="log",
                          yaxis_type="log", xaxis_title="context length (tokens)", yaxis_title="RoPE base")
        return fig

    def _repr_html_(self) -> str:
        return self.to_frame().to_html(max_rows=60)


def base_predictions(spec_or_model, lengths: Sequence[int], *, train_ctx: int | None = None,
                     base: float | None = None) -> BasePredictions:
    """Liu et al.'s and Men et al.'s predictions for each length, per rotary layer kind.

    ``spec_or_model`` is a :class:`ropelens.RopeSpec` or a model (its spec is read). ``train_ctx``
    defaults to the spec's context length and ``base`` to each layer kind's own (read from θ₁ when
    the spec records none). The formulas assume plain RoPE, θ_i = base^(−2i/d); a scaled layer
    (``rope_type`` not "default") is tabulated from its base all the same, and says so in its row.
    """
    from ropelens.rope import RopeSpec
    from ropelens.spec import model_label, rope_spec

    spec = spec_or_model if isinstance(spec_or_model, RopeSpec) else rope_spec(spec_or_model)
    lens = _lengths(lengths)
    t_train = _posint(spec.n_ctx if train_ctx is None else train_ctx, "train_ctx", " (pass the trained context length)")
    if base is not None:
        _check_base(base)
    rows, men = [], {}
    for kind, idx in spec.rotary_kinds.items():
        lr = spec.layers[idx[0]]
        b = float(base) if base is not None else _layer_base(lr)
        t_kind = min(t_train, lr.window) if lr.window else t_train
        _ctx_over_2pi(t_kind, "train_ctx")
        rows += [_prediction_row(kind, idx, lr, b, t_kind, L, men) for L in lens]
    label = spec.model_name if isinstance(spec_or_model, RopeSpec) else model_label(spec_or_model)
    return BasePredictions(rows=tuple(rows), lengths=lens,
                           provenance=Provenance(model=label, config={"train_ctx": t_train, "base": base}))


# --------------------------------------------------------------------------------------------
# measured loss by length
# --------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class MeasuredExtrapolation:
    """Mean next-token loss (and perplexity) of a model on real text at each context length."""

    lengths: tuple[int, ...]
    estimates: tuple[dict[str, Any], ...]  # LossEstimate.to_dict() per length
    window_losses: tuple[tuple[float, ...], ...]  # per length, each window's mean loss
    train_ctx: int
    provenance: Provenance = field(default_factory=lambda: Provenance(model="?"))

    def __post_init__(self) -> None:
        if not len(self.lengths) == len(self.estimates) == len(self.window_losses):
            raise InputError(f"{len(self.lengths)} lengths, {len(self.estimates)} estimates and "
                             f"{len(self.window_losses)} loss lists must agree: one per length")

    def to_frame(self) -> pd.DataFrame:
        """One row per length: loss and perplexity with their bootstrap CIs over windows."""
        rows = []
        for L, e in zip(self.lengths, self.estimates, strict=True):
            rows.append({"length": L, "train_ctx": self.train_ctx, "beyond_train": self.train_ctx < L,
                         "n_windows": e["n_windows"], "loss": e["loss"]["mean"], "loss_lo": e["loss"]["lo"],
                         "loss_hi": e["loss"]["hi"], "perplexity": e["perplexity"]["mean"],
                         "perplexity_lo": e["perplexity"]["lo"], "perplexity_hi": e["perplexity"]["hi"]})
        return pd.DataFrame(rows)

    def to_dict(self) -> dict[str, Any]:
        return {"type": "MeasuredExtrapolation", "format": 1, "lengths": list(self.lengths),
                "estimates": list(self.estimates), "window_losses": [list(w) for w in self.window_losses],
                "train_ctx": self.train_ctx, "provenance": self.provenance.to_dict()}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> MeasuredExtrapolation:
        return cls(lengths=tuple(d["lengths"]), estimates=tuple(d["estimates"]),
                   window_losses=tuple(tuple(w) for w in d["window_losses"]), train_ctx=int(d["train_ctx"]),
                   provenance=Provenance.from_dict(d["provenance"]))

    def save(self, path: str | Path) -> None:
        dump_json(path, self.to_dict())

    @classmethod
    def load(cls, path: str | Path) -> MeasuredExtrapolation:
        from ropelens.serialize import read_result_json

        return cls.from_dict(read_result_json(path, "MeasuredExtrapolation", 1))

    def figure(self, predictions: BasePredictions | None = None):
        """Perplexity by length (CI as error bars), the trained context and, given, Liu's T_extra."""
        import plotly.graph_objects as go

        df = self.to_frame()
        fig = go.Figure(go.Scatter(
            x=df["length"], y=df["perplexity"], mode="lines+markers", name="measured perplexity",
            error_y={"type": "data", "symmetric": False, "array": df["perplexity_hi"] - df["perplexity"],
                     "arrayminus": df["perplexity"] - df["perplexity_lo"]}))
        fig.add_vline(x=self.train_ctx, line_dash="dash", annotation_text=f"trained {self.train_ctx:,}")
        if predictions is not None:
            for kind, t in {r["kind"]: r["t_extra"] for r in predictions.rows}.items():
                if math.isfinite(t):
                    fig.add_vline(x=t, line_dash="dot", annotation_text=f"T_extra ({kind}) {t:,.0f}")
        fig.update_layout(title=f"Perplexity by context length — {self.provenance.model}", xaxis_type="log",
                          xaxis_title="context length (tokens)", yaxis_title="perplexity")
        return fig


def _loss_model(model, fast: bool):
    """The module whose losses are measured, and a factory of the context to run it in.

    A bridge rebuilds eager attention, whose [heads, n, n] scores take 10 GB at 16k tokens for
    SmolLM2; the HF model it wraps, with its sdpa attention, computes the same loss in O(n) memory.
    Under an intervention (a RoPE variant, an ablation: bridge hooks) the bridge runs as it is.
    """
    import contextlib
    import functools

    from ropelens.fastpath import hf_view, sdpa_attention

    is_bridge = hasattr(model, "original_model") and hasattr(model, "blocks")
    # the marker ropelens.fastpath.intervened sets while a variant or an ablation is applied
    if not (fast and is_bridge) or getattr(model, "_ropelens_interventions", 0):
        return model, contextlib.nullcontext
    hf = hf_view(model)
    return hf, functools.partial(sdpa_attention, hf)


def measured_extrapolation(model, lengths: Sequence[int], *, n_windows: int = 4, corpus=None,
                           batch_size: int = 1, train_ctx: int | None = None, fast: bool = True,
                           progress: bool = True, **bootstrap: Any) -> MeasuredExtrapolation:
    """Mean next-token loss at each length over ``n_windows`` windows of real text.

    Windows come from ``corpus`` (default: the embedded English text) through
    :func:`ropelens.data.analysis_windows`; at every length window i starts at the same token,
    so lengths differ only in how much context each prediction has. Each window starts with BOS.
    The loss is averaged over all positions of a window, with a bootstrap CI over windows
    (:func:`ropelens.evaluate.loss_estimate`). With ``fast`` a bridge is measured through the HF
    model it wraps with sdpa attention (same weights, same loss, memory linear in the length).
    """
    from ropelens.data import analysis_windows
    from ropelens.evaluate import loss_estimate
    from ropelens.spec import model_label, rope_spec

    lens = _lengths(lengths)
    n_windows = _posint(n_windows, "n_windows")
    spec = rope_spec(model)
    t_train = _posint(spec.n_ctx if train_ctx is None else train_ctx, "train_ctx")
    if isinstance(corpus, Tensor):
        raise InputError("corpus must be a corpus name, path or ropelens.data.Corpus: windows are cut per length")
    runner, ctx = _loss_model(model, fast)
    estimates, per_window, name, sha = [], [], None, None
    for L in lens:
        if L < 2:
            raise InputError(f"length {L} is too short: a window needs at least 2 tokens")
        tokens, name, sha = analysis_windows(model.tokenizer, corpus, L, n_windows * L)
        with ctx():
            est, losses = loss_estimate(runner, tokens, batch_size=batch_size, progress=progress, **bootstrap)
        estimates.append(est.to_dict())
        per_window.append(tuple(float(x) for x in losses))
    return MeasuredExtrapolation(
        lengths=lens, estimates=tuple(estimates), window_losses=tuple(per_window), train_ctx=t_train,
        provenance=Provenance(model=model_label(model), corpus=name, corpus_sha256=sha, n_windows=n_windows,
                              config={"lengths": list(lens), "batch_size": batch_size, "fast": fast}),
    )
