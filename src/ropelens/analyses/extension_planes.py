"""Context extension seen per plane: what each scaling method does to each frequency, and LongRoPE's
factors.

**Plane categories** (:func:`extension_planes`). A plane with frequency θ (before) and θ' (after the
method) that was trained on positions 0 … L₀ and now must serve 0 … L reaches the angle L·θ' at
most:

- ``"kept"``: θ' = θ and the plane already completed a turn within L₀ (λ = 2π/θ ≤ L₀), so every
  angle it meets at L was seen (mod 2π) in training: safe, unchanged;
- ``"interpolated"``: θ' ≠ θ (normally θ' < θ) and every angle it meets at L was seen in training,
  i.e. λ ≤ L₀ or L·θ' ≤ L₀·θ: in distribution, at the cost of coarser relative positions;
- ``"extrapolated"``: the plane never completed a turn within L₀ (λ > L₀) and reaches angles beyond
  the largest seen, L·θ' > L₀·θ: out of distribution (plain RoPE's failure, or too little scaling);
- ``"unrotated"``: θ = 0 before (NoPE planes), nothing to extend.

Equalities hold to a relative tolerance of 1e-6, so PI with factor L/L₀ interpolates exactly.

**LongRoPE search** (Ding et al., arXiv 2402.13753): evolutionary search of per-plane factors λ_i ≥
1, non-decreasing from the highest frequency, and n̂ leading positions left unscaled, by perplexity.

What the base itself predicts about a context length (the critical dimension, the extrapolation
limit, the critical base and the lower bound on the base) is in
:mod:`ropelens.analyses.base_predictions`.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch
from jaxtyping import Float, Float32
from torch import Tensor
from tqdm.auto import tqdm

from ropelens.errors import InputError
from ropelens.results.provenance import Provenance, placement
from ropelens.results.result import Result
from ropelens.results.serialize import dump_json
from ropelens.run import data
from ropelens.run.evaluate import window_losses
from ropelens.run.intervene import apply_rope_variant
from ropelens.spec.reading import model_label, rope_spec
from ropelens.spec.rope import LayerRope
from ropelens.spec.surface import running_model
from ropelens.spec.variants import (
    NTK,
    Default,
    DynamicNTK,
    Linear,
    LongRoPE,
    RopeVariant,
    YaRN,
)
from ropelens.validate import check_positive_int

__all__ = [
    "CATEGORIES",
    "LongRopeSearch",
    "ExtensionPlanes",
    "inv_freq_at",
    "extension_planes",
    "search_longrope_factors",
]

CATEGORIES = ("kept", "interpolated", "extrapolated", "unrotated")
_RTOL = 1e-6


# --------------------------------------------------------------------------------------------
# per-plane view
# --------------------------------------------------------------------------------------------
def inv_freq_at(variant: RopeVariant, layer: LayerRope, seq_len: int) -> Float[Tensor, " n_planes"]:
    """The variant's frequencies for an input of ``seq_len`` tokens (length-dependent methods
    included)."""
    if isinstance(variant, (DynamicNTK, LongRoPE)):
        return variant.inv_freq(layer, int(seq_len))
    return variant.inv_freq(layer)


def plane_categories(
    before: Tensor, after: Tensor, original_ctx: int, target_ctx: int
) -> tuple[str, ...]:
    out = []
    for t0, t1 in zip(before.double().tolist(), after.double().tolist(), strict=True):
        if t0 == 0.0:
            out.append("unrotated")
            continue
        seen = 2 * math.pi / t0 <= original_ctx * (
            1 + _RTOL
        ) or target_ctx * t1 <= original_ctx * t0 * (1 + _RTOL)
        same = abs(t1 - t0) <= _RTOL * t0
        out.append(("kept" if same else "interpolated") if seen else "extrapolated")
    return tuple(out)


# unversioned: files from before the result base carry neither type nor format
@dataclass(frozen=True)
class ExtensionPlanes(Result, previous_kinds=("PlaneView",), unversioned=True):
    """One layer's planes before and after a context-extension method, highest frequency first.

    Built by :func:`extension_planes`. Each plane is ``"kept"`` (unchanged, and it completed a turn
    within the trained context L₀), ``"interpolated"`` (rescaled so every angle it meets at the
    target length L was seen in training), ``"extrapolated"`` (it never turned within L₀ and now
    reaches angles beyond the largest seen: out of distribution) or ``"unrotated"`` (θ = 0).

    Attributes:
        variant (dict[str, Any]): The method, as ``RopeVariant.to_dict()`` (its ``"variant"`` key
            names it).
        layer (int): The layer index.
        original_ctx (int): The trained context length L₀, in tokens.
        target_ctx (int): The context length L the method extends to, in tokens.
        inv_freq_before (Tensor): ``[n_planes]`` float32 frequencies θ before (radians per token).
        inv_freq_after (Tensor): ``[n_planes]`` float32 frequencies θ' under the method at
            ``target_ctx`` tokens.
        attention_scaling (float): The factor the method multiplies cos and sin by, so the
            rotated q and k (and the logits by its square): YaRN's 0.1·ln(s) + 1; 1 for most
            methods.
        categories (tuple[str, ...]): Per plane, one of :data:`CATEGORIES`.

    Raises:
        InputError: When the frequencies and categories differ in length.

    Examples:
        >>> from ropelens import rope_spec
        >>> from ropelens.analyses import extension_planes
        >>> from ropelens.spec.variants import YaRN
        >>> from ropelens.testing import tiny_model
        >>> layer = rope_spec(tiny_model("llama")).layers[0]  # 8 planes, trained on 256 tokens
        >>> planes = extension_planes(layer, YaRN(4.0, 256), 256, 1024)
        >>> planes.label, planes.counts()
        ('YaRN', {'kept': 1, 'interpolated': 7, 'extrapolated': 0, 'unrotated': 0})
        >>> planes.scale.round(decimals=2).tolist()  # θ / θ': high frequencies kept, low ones ÷ 4
        [1.0, 1.23, 1.6, 2.29, 4.0, 4.0, 4.0, 4.0]
        >>> round(planes.attention_scaling, 4)  # 0.1·ln 4 + 1
        1.1386
    """

    variant: dict[str, Any]  # RopeVariant.to_dict()
    layer: int
    original_ctx: int
    target_ctx: int
    inv_freq_before: Float32[Tensor, " n_planes"]
    inv_freq_after: Float32[Tensor, " n_planes"]
    attention_scaling: float
    categories: tuple[str, ...]

    def __post_init__(self) -> None:
        n = self.inv_freq_before.shape
        if self.inv_freq_after.shape != n or len(self.categories) != n[0]:
            raise InputError(
                f"inv_freq_before {tuple(n)}, inv_freq_after {tuple(self.inv_freq_after.shape)} "
                f"and {len(self.categories)} categories must agree: one entry per plane"
            )

    @property
    def label(self) -> str:
        """The method's name (e.g. "YaRN")."""
        return self.variant.get("variant", "?")

    @property
    def wavelength_before(self) -> Float[Tensor, " n_planes"]:
        """Wavelength 2π/θ of each plane before, in tokens (inf for unrotated planes)."""
        return 2 * math.pi / self.inv_freq_before.double()

    @property
    def wavelength_after(self) -> Float[Tensor, " n_planes"]:
        """Wavelength 2π/θ' of each plane under the method, in tokens."""
        return 2 * math.pi / self.inv_freq_after.double()

    @property
    def scale(self) -> Float[Tensor, " n_planes"]:
        """θ_before / θ_after per plane (the method's rescale factor λ_i; PI gives the factor
        everywhere)."""
        return self.inv_freq_before.double() / self.inv_freq_after.double()

    def counts(self) -> dict[str, int]:
        """Planes per category."""
        return {c: self.categories.count(c) for c in CATEGORIES}

    def to_frame(self) -> pd.DataFrame:
        """One row per plane."""
        return pd.DataFrame(
            {
                "variant": self.label,
                "layer": self.layer,
                "plane": range(len(self.categories)),
                "inv_freq_before": self.inv_freq_before.double().numpy(),
                "inv_freq_after": self.inv_freq_after.double().numpy(),
                "wavelength_before": self.wavelength_before.numpy(),
                "wavelength_after": self.wavelength_after.numpy(),
                "scale": self.scale.numpy(),
                "category": list(self.categories),
            }
        )

    def _repr_html_(self) -> str:
        return self.to_frame().to_html(max_rows=40)


def extension_planes(
    layer_rope: LayerRope, variant: RopeVariant, original_ctx: int, target_ctx: int
) -> ExtensionPlanes:
    """How ``variant`` rescales each plane of ``layer_rope`` to serve ``target_ctx`` after
    ``original_ctx``.

    "Before" is the layer's own frequencies; "after" is the variant's for an input of ``target_ctx``
    tokens (dynamic NTK and LongRoPE depend on it). The layer is given n_ctx = ``target_ctx``, which
    HF's LongRoPE uses for its default factor. LongRoPE's n̂ unscaled first positions are not a
    frequency and do not show here. Each plane is put in a category (kept, interpolated,
    extrapolated, unrotated; see the module docstring), equalities to a relative tolerance of
    1e-6, so PI with factor L/L₀ interpolates exactly. Reads frequencies only: no model runs.

    Args:
        layer_rope (LayerRope): One layer's RoPE reading, e.g. ``ropelens.rope_spec(model)[i]``.
        variant (RopeVariant): The extension method (from :mod:`ropelens.spec.variants`: ``Linear``
            (PI), ``NTK``, ``DynamicNTK``, ``YaRN``, ``LongRoPE``, ...).
        original_ctx (int): The trained context length L₀, in tokens.
        target_ctx (int): The context length L to serve, in tokens.

    Returns:
        ExtensionPlanes: The frequencies before and after, the attention scaling and each plane's
        category.

    Raises:
        TypeError: When ``layer_rope`` is not a :class:`LayerRope`.
        InputError: When ``original_ctx`` or ``target_ctx`` is not a positive int.

    Examples:
        >>> from ropelens import rope_spec
        >>> from ropelens.analyses import extension_planes
        >>> from ropelens.spec.variants import NTK, Linear
        >>> from ropelens.testing import tiny_model
        >>> layer = rope_spec(tiny_model("llama")).layers[0]
        >>> extension_planes(layer, Linear(4.0), 256, 1024).counts()  # PI: every plane ÷ 4
        {'kept': 0, 'interpolated': 8, 'extrapolated': 0, 'unrotated': 0}
        >>> extension_planes(layer, NTK(4.0), 256, 1024).categories[3:7]
        ('interpolated', 'extrapolated', 'extrapolated', 'extrapolated')
    """
    if not isinstance(layer_rope, LayerRope):
        raise TypeError(
            "layer_rope must be a LayerRope (ropelens.rope_spec(model)[i]), got "
            f"{type(layer_rope).__name__}"
        )
    original_ctx = check_positive_int(original_ctx, "original_ctx", " (the trained context length)")
    target_ctx = check_positive_int(target_ctx, "target_ctx", " (the extended context length)")
    layer = dataclasses.replace(layer_rope, n_ctx=target_ctx)
    after = inv_freq_at(variant, layer, target_ctx).float()
    before = layer_rope.inv_freq.float()
    return ExtensionPlanes(
        variant=variant.to_dict(),
        layer=layer_rope.layer,
        original_ctx=original_ctx,
        target_ctx=target_ctx,
        inv_freq_before=before,
        inv_freq_after=after,
        attention_scaling=float(variant.attention_scaling(layer)),
        categories=plane_categories(before, after, original_ctx, target_ctx),
    )


# --------------------------------------------------------------------------------------------
# LongRoPE factor search
# --------------------------------------------------------------------------------------------
# unversioned: files from before the result base carry neither type nor format
@dataclass(frozen=True)
class LongRopeSearch(Result, unversioned=True):
    """Best LongRoPE factors found for ``target_len`` and how they compare with PI and YaRN.

    Built by :func:`search_longrope_factors` (LongRoPE, Ding et al., arXiv 2402.13753). Saved with
    :meth:`save`; :meth:`load` also reads a hand-written factors file (``target_len``,
    ``original_ctx``, ``factors``, ``n_hat``), as ``ropelens extension-study --longrope`` takes.

    Attributes:
        target_len (int): The context length searched for, in tokens.
        original_ctx (int): The trained context length L₀ (the factor is target_len / L₀).
        factors (tuple[float, ...]): Rescale factor λ_i ≥ 1 per plane, highest frequency first,
            non-decreasing.
        n_hat (int): Leading positions left unscaled (LongRoPE's n̂).
        perplexity (float): The best candidate's perplexity on the search windows.
        initial_best (float): The best perplexity of the seeded initial population.
        baselines (dict[str, float]): Perplexity of ``"PI"`` and ``"YaRN"`` at the same target, on
            the same windows.
        history (tuple[dict[str, Any], ...]): Per generation: ``generation``, ``best``, ``mean``
            and ``n_evaluated`` (candidates measured so far).
        settings (dict[str, Any]): The search's settings (target, population, seed, windows,
            generations).
        provenance (Provenance): Model, corpus and windows.

    Examples:
        >>> from ropelens.analyses import search_longrope_factors
        >>> from ropelens.testing import tiny_model
        >>> found = search_longrope_factors(
        ...     tiny_model("llama"), 32, original_ctx=16, population=2, generations=1,
        ...     n_windows=1, progress=False,
        ... )
        >>> len(found.factors), sorted(found.gain())  # one factor per plane
        (8, ['PI', 'YaRN'])
        >>> found.variant.factor  # 32 / 16
        2.0
        >>> found.perplexity <= found.initial_best  # elitism: the best never gets worse
        True
    """

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
        """Relative perplexity reduction of the best candidate over each baseline (0.1 = 10%
        lower)."""
        return {k: 1 - self.perplexity / v for k, v in self.baselines.items()}

    def to_frame(self) -> pd.DataFrame:
        """One row per generation."""
        return pd.DataFrame(list(self.history))

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> LongRopeSearch:
        """Read a search saved by :meth:`save`, or a hand-written factors file
        (:data:`LONGROPE_FILE` says what it holds); every problem with the file is one InputError
        naming it and ``--longrope``."""
        p = Path(path)
        what = f"the LongRoPE factors file {path} (--longrope)"
        if not p.exists():
            raise InputError(f"{what} does not exist: check the path, or pass {LONGROPE_FILE}")
        if p.is_dir():
            raise InputError(f"{what} is a directory: pass {LONGROPE_FILE}")
        try:
            d = json.loads(p.read_bytes())
        except OSError as e:
            raise InputError(
                f"{what} cannot be read ({e.strerror or e}): pass a readable file"
            ) from e
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            where = (
                f"{e.msg} at line {e.lineno}"
                if isinstance(e, json.JSONDecodeError)
                else "not UTF-8 text"
            )
            raise InputError(f"{what} is not JSON ({where}): pass {LONGROPE_FILE}") from e
        return cls._from_file(d, path)

    @classmethod
    def _from_file(cls, d: Any, path: str | os.PathLike[str]) -> LongRopeSearch:
        what = f"the LongRoPE factors file {path} (--longrope)"
        if not isinstance(d, dict):
            raise InputError(
                f"{what} holds a JSON {type(d).__name__}, not an object: pass {LONGROPE_FILE}"
            )
        kind, fmt = d.get("type", cls.KIND), d.get("format", cls.FORMAT)
        if kind != cls.KIND:
            raise InputError(
                f"{what} holds a {kind!r} result, not {cls.KIND}: pass {LONGROPE_FILE}"
            )
        if fmt != cls.FORMAT:
            raise InputError(
                f"{what} has {cls.KIND} format {fmt!r}; this ropelens reads format {cls.FORMAT}: "
                "write it again with this version"
            )
        d = {**_LONGROPE_OPTIONAL, **d}
        fields = {f.name for f in dataclasses.fields(cls)} | {"type", "format"}
        missing, unknown = [k for k in _LONGROPE_NEEDS if k not in d], sorted(set(d) - fields)
        if missing or unknown:
            wrong = "; ".join(
                s
                for s in (
                    f"lacks {', '.join(missing)}" * bool(missing),
                    f"has unknown keys {', '.join(unknown)}" * bool(unknown),
                )
                if s
            )
            raise InputError(f"{what} {wrong}: pass {LONGROPE_FILE}")
        _check_longrope_file(d, what)
        try:
            return super()._from_file(d, path)
        except (TypeError, KeyError) as e:  # a malformed provenance or history entry
            raise InputError(f"{what} holds a malformed {e}: pass {LONGROPE_FILE}") from e


# What a LongRoPE factors file (``ropelens extension-study --longrope``) holds; the other
# LongRopeSearch fields may be left out.
LONGROPE_FILE = (
    "a JSON object with target_len and original_ctx (token counts, target_len > original_ctx), "
    "factors "
    "(one positive rescale factor per rotary plane, highest frequency first) and n_hat (leading "
    "positions "
    'left unscaled, ≥ 0), as LongRopeSearch.save writes, e.g. {"target_len": 8192, '
    '"original_ctx": 2048, '
    '"factors": [1.0, 1.5, 2.0, 4.0], "n_hat": 0}'
)
_LONGROPE_NEEDS = ("target_len", "original_ctx", "factors", "n_hat")
_LONGROPE_OPTIONAL: dict[str, Any] = {
    "perplexity": math.nan,
    "initial_best": math.nan,
    "baselines": {},
    "history": [],
    "settings": {},
    "provenance": {"model": "?"},
}


def _check_longrope_file(d: dict[str, Any], what: str) -> None:
    """Each field of a LongRoPE factors file has the type and range :data:`LONGROPE_FILE` names."""

    def whole(key: str, least: int) -> int:
        v = d[key]
        if isinstance(v, bool) or not isinstance(v, int) or v < least:
            raise InputError(
                f"{what}: {key} must be an integer ≥ {least}, got {v!r}: pass {LONGROPE_FILE}"
            )
        return v

    target, original = whole("target_len", 2), whole("original_ctx", 1)
    whole("n_hat", 0)
    if target <= original:
        raise InputError(
            f"{what}: target_len {target} must exceed original_ctx {original}: pass {LONGROPE_FILE}"
        )
    f = d["factors"]
    bad = (
        [
            x
            for x in f
            if isinstance(x, bool)
            or not isinstance(x, (int, float))
            or not math.isfinite(x)
            or x <= 0
        ]
        if isinstance(f, list)
        else None
    )
    if bad is None or bad or not f:
        shown = (
            f"{len(f)} entries, {len(bad)} of them not positive numbers (first {bad[0]!r})"
            if bad
            else ("an empty list" if f == [] else f"a JSON {type(f).__name__}")
        )
        raise InputError(
            f"{what}: factors must be a non-empty list of positive numbers, got {shown}: "
            f"pass {LONGROPE_FILE}"
        )
    for key, kind in (
        ("perplexity", (int, float)),
        ("initial_best", (int, float)),
        ("baselines", dict),
        ("history", list),
        ("settings", dict),
        ("provenance", dict),
    ):
        if isinstance(d[key], bool) or not isinstance(d[key], kind):
            raise InputError(
                f"{what}: {key} must be a JSON "
                f"{'number' if kind not in (dict, list) else kind.__name__}, got {d[key]!r}: "
                f"leave it out, or pass {LONGROPE_FILE}"
            )


def _longrope(factors: Sequence[float], n_hat: int, original_ctx: int, target_len: int) -> LongRoPE:
    return LongRoPE(
        short_factor=(1.0,) * len(factors),
        long_factor=tuple(float(f) for f in factors),
        original_max_position=original_ctx,
        factor=target_len / original_ctx,
        n_hat=int(n_hat),
    )


def _monotone(f: np.ndarray, hi: float) -> np.ndarray:
    """Sorted non-decreasing and clamped to [1, hi], rounded so candidates are JSON-stable keys."""
    return np.round(np.clip(np.sort(f), 1.0, hi), 6)


def _seed_population(
    layer: LayerRope, s: float, l0: int, size: int, hi: float, rng
) -> list[dict[str, Any]]:
    """PI, YaRN-like and NTK factors, then random monotone perturbations of them."""
    base = Default().inv_freq(layer).double()
    seeds = [np.full(layer.n_planes, s)]
    for v in (YaRN(s, l0), NTK(s)):
        seeds.append((base / v.inv_freq(layer).double()).numpy())
    pop = [{"factors": _monotone(f, hi).tolist(), "n_hat": 0} for f in seeds]
    while len(pop) < size:
        f = seeds[len(pop) % len(seeds)] * np.exp(rng.normal(0, 0.15, layer.n_planes))
        pop.append(
            {"factors": _monotone(f, hi).tolist(), "n_hat": int(rng.choice(_n_hat_grid(l0)))}
        )
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
    with apply_rope_variant(model, variant):
        return float(torch.exp(window_losses(model, tokens, batch_size=4, progress=False).mean()))


def _search_setup(
    model, target_len, original_ctx, n_windows, tokens
) -> tuple[LayerRope, int, Tensor]:
    spec = rope_spec(model)
    layer = spec[spec.layer_indices()[0]]
    if any(not lr.same_rotation(layer) for lr in spec.layers):
        raise InputError(
            "search_longrope_factors applies one factor vector to every layer, but this model's "
            "layers rotate differently (e.g. Gemma local/global): search a uniform-RoPE model"
        )
    l0 = check_positive_int(
        original_ctx if original_ctx is not None else layer.n_ctx,
        "original_ctx",
        " (pass the trained context length)",
    )
    if check_positive_int(target_len, "target_len") <= l0:
        raise InputError(
            f"target_len {target_len} must exceed original_ctx {l0}: the search extends context"
        )
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
        raise InputError(
            f"{path} holds a search with other settings ({state.get('settings')}); pass another "
            "state_path or delete it to start over"
        )
    return state


def search_longrope_factors(
    model,
    target_len: int,
    *,
    population: int = 8,
    generations: int = 4,
    n_windows: int = 4,
    seed: int = 0,
    original_ctx: int | None = None,
    tokens: Tensor | None = None,
    progress: bool = True,
    state_path: str | Path | None = None,
) -> LongRopeSearch:
    """Evolutionary search of LongRoPE factors and n̂ minimising perplexity at ``target_len``.

    LongRoPE (Ding et al., arXiv 2402.13753) rescales plane i by its own factor λ_i ≥ 1,
    non-decreasing from the highest frequency, and leaves the first n̂ positions unscaled.
    Generation 0 is PI, YaRN-like and NTK factors plus random monotone perturbations; each
    generation keeps the better half (elitism, so the best never gets worse) and refills the rest
    with crossover + mutation children of it. Generation g draws from ``default_rng([seed, g])`` and
    the state (population, every perplexity so far) is written atomically to ``state_path`` after
    each generation, so a rerun continues and ends where an uninterrupted run would. One factor
    vector serves every layer, so the model's layers must rotate alike.

    Args:
        model: A loaded model (``ropelens.load_model()``, a tiny test model, or a wrapped HF model).
        target_len (int): The context length to extend to, in tokens (> ``original_ctx``).
        population (int): Candidates per generation, ≥ 2 (default 8).
        generations (int): Generations after the initial one (default 4; 0 scores only the
            seeded population).
        n_windows (int): Held-out windows of the embedded English text to score on, when
            ``tokens`` is None.
        seed (int): Seed of the initial population and of every generation.
        original_ctx (int | None): The trained context length; None for the spec's ``n_ctx``.
        tokens (Tensor | None): ``[n, target_len]`` token ids to score on instead.
        progress (bool): Show a progress bar over generations.
        state_path (str | Path | None): A JSON file to save the search to after each generation
            and resume from; None for none.

    Returns:
        LongRopeSearch: The best factors and n̂, their perplexity, PI's and YaRN's on the same
        windows, and the per-generation history.

    Raises:
        InputError: When ``population`` < 2, ``target_len`` ≤ ``original_ctx``, the layers rotate
            differently, ``tokens`` has the wrong shape, or ``state_path`` holds a search with
            other settings or more generations.

    Examples:
        >>> from ropelens.analyses import search_longrope_factors
        >>> from ropelens.testing import tiny_model
        >>> found = search_longrope_factors(
        ...     tiny_model("llama"), 32, original_ctx=16, population=2, generations=1,
        ...     n_windows=1, progress=False,
        ... )
        >>> [row["generation"] for row in found.history], found.settings["generations"]
        ([0, 1], 1)
        >>> all(a <= b for a, b in zip(found.factors, found.factors[1:]))  # non-decreasing
        True
    """
    model = running_model(model)  # an nnsight model: the HF model it wraps
    population = check_positive_int(population, "population", " (candidates per generation, ≥ 2)")
    if population < 2:
        raise InputError(f"population must be at least 2 (parents and children), got {population}")
    generations = check_positive_int(generations, "generations") if generations else 0
    corpus = "english[val]" if tokens is None else "given tokens"
    layer, original_ctx, tokens = _search_setup(model, target_len, original_ctx, n_windows, tokens)
    scale, max_factor = target_len / original_ctx, 2.0 * target_len / original_ctx
    settings = {
        "target_len": target_len,
        "original_ctx": original_ctx,
        "population": population,
        "seed": int(seed),
        "n_windows": int(tokens.shape[0]),
        "tokens_sum": int(tokens.sum()),
    }
    path = None if state_path is None else Path(state_path)
    state = _load_state(path, settings) or {
        "settings": settings,
        "generation": -1,
        "population": [],
        "evals": {},
        "history": [],
    }
    search = _SearchRun(model, tokens, original_ctx, target_len, path, state)
    if state["generation"] > generations:
        raise InputError(
            f"{path} already holds {state['generation']} generations, more than generations="
            f"{generations}: pass generations >= {state['generation']} or another state_path"
        )
    if state["generation"] < 0:
        first = _seed_population(
            layer, scale, original_ctx, population, max_factor, np.random.default_rng([seed, 0])
        )
        search.finish(0, first)
    _evolve(search, population, generations, seed, max_factor, progress)
    best = state["population"][0]
    baselines = {
        "PI": _evaluate(model, Linear(scale), tokens),
        "YaRN": _evaluate(model, YaRN(scale, original_ctx), tokens),
    }
    return LongRopeSearch(
        target_len=target_len,
        original_ctx=original_ctx,
        factors=tuple(best["factors"]),
        n_hat=best["n_hat"],
        perplexity=search.score(best),
        initial_best=state["history"][0]["best"],
        baselines=baselines,
        history=tuple(row for row in state["history"] if row["generation"] <= generations),
        settings={**settings, "generations": generations},
        provenance=Provenance(
            **placement(model),
            model=_model_name(model),
            corpus=corpus,
            n_windows=int(tokens.shape[0]),
            n_ctx=target_len,
        ),
    )


@dataclass
class _SearchRun:
    """A LongRoPE search under way: its state (as saved) and how a candidate is scored."""

    model: Any
    tokens: Tensor
    original_ctx: int
    target_len: int
    path: Path | None
    state: dict[str, Any]

    def score(self, candidate: dict[str, Any]) -> float:
        """The candidate's perplexity on the tokens, measured once and remembered."""
        key = _key(candidate)
        if key not in self.state["evals"]:
            variant = _longrope(
                candidate["factors"], candidate["n_hat"], self.original_ctx, self.target_len
            )
            self.state["evals"][key] = _evaluate(self.model, variant, self.tokens)
        return self.state["evals"][key]

    def finish(self, generation: int, candidates: list[dict[str, Any]]) -> None:
        """Rank a generation by perplexity, record it, and save the state (when a path is set)."""
        perplexities = [self.score(candidate) for candidate in candidates]
        ranked = [candidates[i] for i in np.argsort(perplexities, kind="stable")]
        self.state.update(generation=generation, population=ranked)
        self.state["history"].append(
            {
                "generation": generation,
                "best": min(perplexities),
                "mean": float(np.mean(perplexities)),
                "n_evaluated": len(self.state["evals"]),
            }
        )
        if self.path is not None:
            dump_json(self.path, self.state)


def _evolve(
    search: _SearchRun,
    population: int,
    generations: int,
    seed: int,
    max_factor: float,
    progress: bool,
) -> None:
    """Run the generations the state lacks: keep the better half, refill it with children."""
    bar = tqdm(
        range(search.state["generation"] + 1, generations + 1),
        desc=f"LongRoPE search → {search.target_len}",
        unit="gen",
        disable=not progress,
    )
    for generation in bar:
        rng = np.random.default_rng([seed, generation])
        parents = search.state["population"][: max(2, population // 2)]
        children = [
            _child(
                *[parents[i] for i in rng.choice(len(parents), 2, replace=False)],
                search.original_ctx,
                max_factor,
                rng,
            )
            for _ in range(population - len(parents))
        ]
        search.finish(generation, parents + children)
        bar.set_postfix(best=f"{search.state['history'][-1]['best']:.4g}")


def _model_name(model) -> str:
    try:
        return model_label(model)
    except Exception:
        return type(model).__name__
