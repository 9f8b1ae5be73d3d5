"""What the RoPE base predicts about context length, and the loss by length to check it against.

RoPE rotates plane i of a d-dim head at θ_i = β^(−2i/d) for base β. Two lines of work turn that
into predictions about the lengths a model can serve:

**Critical dimension and extrapolation limit** (Liu et al., "Scaling Laws of RoPE-based
Extrapolation", arXiv 2310.05209): d_extra = 2⌈(d/2)·log_β(T_train/2π)⌉, the rotary dims whose
planes complete a turn within the training length (92 of 128 for Llama 2: base 1e4, 4096 tokens)
(:func:`critical_dimension`). From it, the same paper's extrapolation limit T_extra =
2π·β^(d_extra/d) (:func:`extrapolation_limit`: the wavelength of the first plane that never turned
in training) and critical base β₀ = β_train^(log_{T_train/2π}(T_tune/2π)) for tuning at T_tune
(:func:`critical_base`; the paper's β_train is LLaMA 2's 10000).

**Base lower bound** (Men et al., "Base of RoPE Bounds Context Length", arXiv 2405.14591): the
smallest base for which B(m) = Σ_i cos(m·θ_i) ≥ 0 for every m < L (:func:`base_lower_bound`;
:func:`bound_holds` checks one base directly, since feasibility is not monotone in the base;
the smallest base is found exactly, not on a grid).

:func:`base_predictions` tabulates both papers' predictions per context length and rotary layer
kind (:class:`BasePredictions`), and :func:`measured_extrapolation` measures the model's loss and
perplexity on real text at the same lengths (:class:`MeasuredExtrapolation`) to check them against.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd
from torch import Tensor

from ropelens.backends import backend_of
from ropelens.errors import InputError
from ropelens.results.figures import figure_of
from ropelens.results.provenance import Provenance, placement
from ropelens.results.result import Result
from ropelens.run.data import analysis_windows, load_corpus
from ropelens.run.evaluate import check_n_boot, ci_end, loss_estimate
from ropelens.spec.reading import model_label, rope_spec
from ropelens.spec.rope import LayerRope, RopeSpec
from ropelens.spec.surface import running_model
from ropelens.validate import check_positive_int

__all__ = [
    "MIN_PREDICTION_LENGTH",
    "BasePredictions",
    "MeasuredExtrapolation",
    "base_lower_bound",
    "base_predictions",
    "bound_holds",
    "critical_base",
    "critical_dimension",
    "extrapolation_limit",
    "measured_extrapolation",
]


# --------------------------------------------------------------------------------------------
# critical dimension (Liu et al.) and the lower bound on the base (Men et al., arXiv 2405.14591)
# --------------------------------------------------------------------------------------------
def critical_dimension(base: float, rotary_dim: int, train_ctx: int) -> int:
    """d_extra = 2⌈(d/2)·log_base(L/2π)⌉, clipped to [0, d] (arXiv 2310.05209)."""
    d = check_positive_int(rotary_dim, "rotary_dim")
    if d % 2:
        raise InputError(f"rotary_dim must be even (RoPE rotates pairs), got {d}")
    if not isinstance(base, numbers.Real) or not base > 1:
        raise InputError(f"base must be a number > 1 (rope_theta), got {base!r}")
    train_ctx = check_positive_int(train_ctx, "train_ctx", " (training length in tokens)")
    x = (d / 2) * math.log(train_ctx / (2 * math.pi)) / math.log(base)
    return int(min(d, max(0, 2 * math.ceil(x - 1e-12))))


def _first_violation(
    base: float, rotary_dim: int, context_len: int, hint: int | None = None, chunk: int = 1 << 13
) -> int | None:
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


def _violation_steps(m: np.ndarray, a: np.ndarray, theta: np.ndarray) -> np.ndarray:
    """Per m, how far log(base) may grow from here with B(m) < 0 throughout (0 where B(m) ≥ 0 now).

    With u = ln base, θ_i = e^(−a_i·u), a_i = 2i/d: B' = Σ sin(mθ_i)·m·a_i·θ_i and |B''| ≤ Σ
    (m·a_i·θ_i)² + m·a_i²·θ_i, a bound that holds at every larger u too (θ_i only shrinks). So B(u +
    t) ≤ B + B'·t + ½·M₂·t², which stays negative up to its positive root.
    """
    x = m[:, None] * theta
    b = np.cos(x).sum(1)
    mt = m[:, None] * (a * theta)
    b1 = (np.sin(x) * mt).sum(1)
    m2 = (mt * mt).sum(1) + mt @ a
    out = np.zeros_like(b)
    neg = b < 0
    bn, b1n = b[neg], b1[neg]
    out[neg] = (
        2 * -bn / (b1n + np.sqrt(b1n * b1n - 2 * m2[neg] * bn))
    )  # the root, without cancellation
    return out


# 262,144 tokens: the exact search's cost grows about 4× per doubling of L (rotary_dim 128 on 2 CPU
# cores: 4.7 s at 65,536, 18.7 s at 131,072, 122 s at 262,144), so past this it would run for many
# minutes
MAX_BOUND_CONTEXT = 1 << 18


def base_lower_bound(rotary_dim: int, context_len: int, *, max_base: float = 1e15) -> float:
    """Smallest base with Σ_i cos(m·θ_i) ≥ 0 for all m < L (arXiv 2405.14591), exact to float64.

    Feasibility is not monotone in the base, and feasible islands can be far narrower than any grid
    (4k at d 128: 26,952–26,973), so no base is skipped unchecked: the search walks u = ln(base) up
    from 0 and certifies every step infeasible. At u it takes an m with B(m) < 0 (a *witness*) and
    steps to the root of a quadratic upper bound of B(m) in u (:func:`_violation_steps`), so B(m)
    stays negative over the whole step; it follows the strongest few witnesses until all of them
    turn non-negative, then looks for new ones near the old (violations move slowly in m), then
    among every m. The first u where no m < L has B(m) < 0 (as :func:`bound_holds` evaluates it) is
    the answer. The certificate holds up to float64 rounding (of B, ~1e-14·L, and a few ulps of u
    per step). Cost: one pass over every m at the end, and small ones per step: 0.1 s at 4k, about 2
    s at 32k (d 64), 15 s at 64k (d 128).
    """
    d = check_positive_int(rotary_dim, "rotary_dim")
    context_len = check_positive_int(context_len, "context_len")
    if context_len > MAX_BOUND_CONTEXT:
        raise InputError(
            f"context length {context_len:,} is past {MAX_BOUND_CONTEXT:,} tokens, the longest "
            "whose base lower bound ropelens certifies (the search evaluates B(m) at every m < "
            "L: 2 minutes at that length, about 4× longer per doubling): pass a shorter length"
        )
    if d % 2:
        raise InputError(f"rotary_dim must be even (RoPE rotates pairs), got {d}")
    if context_len <= 2 or bound_holds(1.0 + 1e-9, d, context_len):
        return 1.0  # cos(0), cos(θ₀) = cos 1 > 0: any base works for L ≤ 2
    if d == 2:
        raise InputError(
            f"rotary_dim 2 has the single frequency θ₀ = 1 at every base and cos(2) < 0, so "
            f"no base satisfies the bound for context_len {context_len} > 2: use rotary_dim ≥ 4"
        )
    a = np.arange(0, d, 2, dtype=np.float64) / d
    u, u_max = 0.0, math.log(max_base)
    witnesses = np.zeros(0)
    while u <= u_max:
        theta = np.exp(-a * u)
        step = float(_violation_steps(witnesses, a, theta).max()) if witnesses.size else 0.0
        if step <= 8 * np.spacing(
            u
        ):  # the witnesses are spent: find new ones, or none (u is feasible)
            found = _new_witnesses(
                int(witnesses[0]) if witnesses.size else 0, context_len, a, theta
            )
            if found is None:
                if bound_holds(math.exp(u), d, context_len):
                    return math.exp(u)
                witnesses, step = (
                    np.zeros(0),
                    0.0,
                )  # B within rounding of 0 evaluated from the base: step on
            else:
                witnesses, step = found
        u += max(step, 4 * np.spacing(u))
    raise InputError(
        f"no base up to {max_base:g} satisfies the bound for rotary_dim {d}, context_len "
        f"{context_len}: raise max_base"
    )


def _new_witnesses(
    centre: int, n: int, a: np.ndarray, theta: np.ndarray, keep: int = 16, chunk: int = 4096
) -> tuple[np.ndarray, float] | None:
    """The ``keep`` m < n with the longest certified steps in the first window around ``centre``
    (then in chunks of every m) holding any B(m) < 0, and the longest step; None when no m < n has
    one."""
    seen = np.zeros(n, dtype=bool)
    for lo, hi in [
        (centre - 64, centre + 64),
        (centre - 1024, centre + 1024),
        *((s, s + chunk) for s in range(0, n, chunk)),
    ]:
        ms = np.flatnonzero(~seen[max(0, lo) : min(n, hi)]) + max(0, lo)
        if not ms.size:
            continue
        seen[ms] = True
        steps = _violation_steps(ms.astype(np.float64), a, theta)
        if (steps > 0).any():
            best = np.argsort(steps)[::-1][:keep]
            best = best[steps[best] > 0]
            return ms[best].astype(np.float64), float(steps[best[0]])
    return None


# --------------------------------------------------------------------------------------------
# base predictions (Liu et al., "Scaling Laws of RoPE-based Extrapolation", arXiv 2310.05209)
# --------------------------------------------------------------------------------------------
# The shortest context length Liu et al.'s formulas take: they use log(T/2π), so T must exceed 2π ≈
# 6.28 tokens.
MIN_PREDICTION_LENGTH = math.floor(2 * math.pi) + 1


def _ctx_over_2pi(x: Any, what: str) -> float:
    n = check_positive_int(x, what, " (a context length in tokens)")
    if n <= 2 * math.pi:
        raise InputError(
            f"{what} must exceed 2π ≈ 6.28 tokens (Liu's formulas take log(T/2π)), got {n}"
        )
    return n / (2 * math.pi)


def _check_base(base: Any, what: str = "base") -> float:
    if (
        isinstance(base, bool)
        or not isinstance(base, numbers.Real)
        or not math.isfinite(base)
        or not base > 1
    ):
        raise InputError(
            f"{what} must be a finite number > 1 (the RoPE base, rope_theta), got {base!r}"
        )
    return float(base)


def critical_base(train_ctx: int, tune_ctx: int, base: float = 10000.0) -> float:
    """Liu et al.'s critical base β₀ = base^(log_{T_train/2π}(T_tune/2π)) for tuning at
    ``tune_ctx``.

    The paper writes 10000 for ``base``: LLaMA 2's pre-training base, which fixed its critical
    dimension d_extra/d ≈ log_10000(T_train/2π). The formula solves T_tune = 2π·β₀^(d_extra/d) for
    β₀ with that (unrounded) critical dimension, so for a model pre-trained with another base the
    10000 becomes that base, which is what ``base`` is. In the paper's extended scaling law, tuning
    at ``tune_ctx`` with a base ≥ β₀ gives the extrapolation limit :func:`extrapolation_limit` (≥
    ``tune_ctx``: the critical dimension rounds up), set by the base; below β₀ the limit is
    ``tune_ctx``. ``tune_ctx`` = ``train_ctx`` gives ``base`` back.
    """
    b = _check_base(base)
    a, t = _ctx_over_2pi(train_ctx, "train_ctx"), _ctx_over_2pi(tune_ctx, "tune_ctx")
    try:
        return b ** (math.log(t) / math.log(a))
    except (
        OverflowError
    ):  # a training length just above 2π tuned far beyond it: past float64's range
        return math.inf


def extrapolation_limit(
    base: float, rotary_dim: int, train_ctx: int, *, train_base: float | None = None
) -> float:
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
        raise InputError(
            "lengths must be a list of context lengths in tokens, e.g. [2048, 8192], got "
            f"{lengths!r}"
        )
    out = tuple(
        check_positive_int(x, "each length", " (a context length in tokens)") for x in lengths
    )
    if not out:
        raise InputError("lengths is empty: pass the context lengths to predict, e.g. [2048, 8192]")
    return out


def _layer_base(lr: LayerRope) -> float:
    """The layer's base: the spec's, else read back from θ₁ = base^(−2/d) (plain RoPE only)."""
    if lr.base is not None:
        return float(lr.base)
    if lr.n_planes < 2:
        raise InputError(
            f"layer {lr.layer} has {lr.n_planes} plane(s) and records no base: pass base="
        )
    return float(lr.inv_freq[1].double() ** (-lr.rotary_dim / 2))


def _prediction_row(
    kind: str,
    layers: list[int],
    lr: LayerRope,
    base: float,
    train_ctx: int,
    length: int,
    men_cache: dict[tuple[int, int], float],
) -> dict[str, Any]:
    d = lr.rotary_dim
    eff = (
        min(length, lr.reach) if lr.reach else length
    )  # a window or chunk caps the distances a query meets
    key = (d, eff)
    if key not in men_cache:
        men_cache[key] = base_lower_bound(d, eff) if d > 2 or eff <= 2 else math.nan
    t_extra = extrapolation_limit(base, d, train_ctx)
    beta0 = critical_base(
        train_ctx, eff, base
    )  # eff > 2π: base_predictions refuses shorter lengths and windows
    return {
        "kind": kind,
        "layers": ",".join(map(str, layers)),
        "rope_type": lr.rope_type,
        "base": base,
        "rotary_dim": d,
        "window": lr.window,
        "train_ctx": train_ctx,
        "length": length,
        "effective_length": eff,
        "critical_dimension": critical_dimension(base, d, eff),
        "critical_dimension_train": critical_dimension(base, d, train_ctx),
        "t_extra": t_extra,
        "within_t_extra": bool(eff <= t_extra),
        "critical_base": beta0,
        "base_ge_critical": bool(base >= beta0 * (1 - 1e-9)),
        "men_lower_bound": men_cache[key],
        "men_bound_holds": bool(bound_holds(base, d, eff)),
    }


@dataclass(frozen=True)
class BasePredictions(Result):
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

    Built by :func:`base_predictions` (Liu et al., "Scaling Laws of RoPE-based Extrapolation",
    arXiv 2310.05209; Men et al., "Base of RoPE Bounds Context Length", arXiv 2405.14591); check
    it against the measured loss with :meth:`compare`.

    Attributes:
        rows (tuple[dict[str, Any], ...]): One dict per (layer kind, length) with the columns
            above and ``kind``, ``layers``, ``rope_type``, ``base``, ``rotary_dim``, ``window``,
            ``train_ctx``, ``length``.
        lengths (tuple[int, ...]): The context lengths predicted for, in tokens.
        provenance (Provenance): The model and the ``train_ctx``/``base`` options.

    Examples:
        >>> from ropelens.analyses import base_predictions
        >>> from ropelens.testing import tiny_model
        >>> pred = base_predictions(tiny_model("llama"), [128, 512])  # base 1e4, d 16, T 256
        >>> df = pred.to_frame()
        >>> df[["length", "critical_dimension_train", "within_t_extra"]].values.tolist()
        [[128, 8, True], [512, 8, True]]
        >>> round(float(df["t_extra"][0]), 1)  # 2π·10000^(8/16)
        628.3
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

    def _repr_html_(self) -> str:
        return self.to_frame().to_html(max_rows=60)


def base_predictions(
    spec_or_model,
    lengths: Sequence[int],
    *,
    train_ctx: int | None = None,
    base: float | None = None,
) -> BasePredictions:
    """Liu et al.'s and Men et al.'s predictions for each length, per rotary layer kind.

    Liu et al. (arXiv 2310.05209): the critical dimension d_extra = 2⌈(d/2)·log_β(T_train/2π)⌉
    (rotary dims whose planes complete a turn in training), the extrapolation limit
    T_extra = 2π·β^(d_extra/d) and the critical base for tuning at each length. Men et al. (arXiv
    2405.14591): the smallest base with B(m) = Σ_i cos(m·θ_i) ≥ 0 for every m < length, and
    whether the model's own base meets it. The formulas assume plain RoPE, θ_i = base^(−2i/d); a
    scaled layer (``rope_type`` not "default") is tabulated from its base all the same, and says
    so in its row.

    Args:
        spec_or_model: A :class:`ropelens.RopeSpec`, or a model whose spec is read.
        lengths (Sequence[int]): Context lengths in tokens, each ≥ ``MIN_PREDICTION_LENGTH`` (7:
            the formulas take log(T/2π)).
        train_ctx (int | None): The trained context length; None for the spec's ``n_ctx``.
        base (float | None): The RoPE base (> 1) for every layer kind; None for each kind's own
            (read from θ₁ when the spec records none).

    Returns:
        BasePredictions: One row per (rotary layer kind, length); ``.to_frame()`` gives the table.

    Raises:
        InputError: When a length is shorter than ``MIN_PREDICTION_LENGTH`` or not a positive int,
            ``lengths`` is empty, ``train_ctx`` is not a positive int above 2π, or ``base`` is not
            a finite number > 1.

    Examples:
        >>> from ropelens.analyses import base_predictions
        >>> from ropelens.testing import tiny_model
        >>> pred = base_predictions(tiny_model("llama"), [128, 512])
        >>> df = pred.to_frame()
        >>> list(df["kind"]), list(df["men_bound_holds"])  # base 1e4 is below Men's bound
        (['full', 'full'], [False, False])
        >>> [round(x) for x in df["men_lower_bound"]]
        [2768, 56383]
    """
    lens = _lengths(lengths)
    short = sorted({L for L in lens if L < MIN_PREDICTION_LENGTH})
    # Liu's critical base at such a length would be NaN: log(L/2π) < 0 for it, and for its training
    # length
    if short:
        raise InputError(
            f"length{'s' if len(short) > 1 else ''} {', '.join(map(str, short))} "
            f"{'are' if len(short) > 1 else 'is'} too short for the base's predictions: Liu et "
            "al.'s critical base takes log(L/2π), defined only for lengths above 2π ≈ 6.28 "
            f"tokens, so the shortest length with a critical base is {MIN_PREDICTION_LENGTH}: "
            f"pass lengths of {MIN_PREDICTION_LENGTH} tokens or more (--lengths)"
        )
    spec = spec_or_model if isinstance(spec_or_model, RopeSpec) else rope_spec(spec_or_model)
    t_train = check_positive_int(
        spec.n_ctx if train_ctx is None else train_ctx,
        "train_ctx",
        " (pass the trained context length)",
    )
    if base is not None:
        _check_base(base)
    rows, men = [], {}
    for kind, idx in spec.rotary_kinds.items():
        lr = spec.layers[idx[0]]
        b = float(base) if base is not None else _layer_base(lr)
        t_kind = min(t_train, lr.reach) if lr.reach else t_train
        _ctx_over_2pi(t_kind, "train_ctx")
        rows += [_prediction_row(kind, idx, lr, b, t_kind, L, men) for L in lens]
    label = spec.model_name if isinstance(spec_or_model, RopeSpec) else model_label(spec_or_model)
    return BasePredictions(
        rows=tuple(rows),
        lengths=lens,
        provenance=Provenance(model=label, config={"train_ctx": t_train, "base": base}),
    )


# --------------------------------------------------------------------------------------------
# measured loss by length
# --------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class MeasuredExtrapolation(Result):
    """Mean next-token loss (and perplexity) of a model on real text at each context length.

    Built by :func:`measured_extrapolation`; the measurement that checks the RoPE base's
    predictions (:class:`BasePredictions`, via ``BasePredictions.compare``). Each estimate carries
    a percentile bootstrap CI over windows.

    Attributes:
        lengths (tuple[int, ...]): The context lengths measured, in tokens.
        estimates (tuple[dict[str, Any], ...]): Per length, ``LossEstimate.to_dict()``: ``loss``
            and ``perplexity`` (each ``mean``, ``lo``, ``hi``), ``n_windows``, ``n_boot``,
            ``alpha``, ``seed``.
        window_losses (tuple[tuple[float, ...], ...]): Per length, each window's mean loss (nats).
        train_ctx (int): The trained context length (lengths past it are ``beyond_train``).
        provenance (Provenance): Model, corpus, windows and options.

    Raises:
        InputError: When ``lengths``, ``estimates`` and ``window_losses`` differ in length.

    Examples:
        >>> from ropelens.analyses import measured_extrapolation
        >>> from ropelens.testing import tiny_model
        >>> texts = ["The quick brown fox jumps over the lazy dog. " * 4]  # your own documents
        >>> m = measured_extrapolation(
        ...     tiny_model("llama"), [16, 32], n_windows=2, corpus=texts, progress=False
        ... )
        >>> df = m.to_frame()
        >>> list(df["length"]), list(df["beyond_train"]), list(df["n_windows"])
        ([16, 32], [False, False], [2, 2])
        >>> bool((df["loss_lo"] <= df["loss"]).all() and (df["loss"] <= df["loss_hi"]).all())
        True
    """

    lengths: tuple[int, ...]
    estimates: tuple[dict[str, Any], ...]  # LossEstimate.to_dict() per length
    window_losses: tuple[tuple[float, ...], ...]  # per length, each window's mean loss
    train_ctx: int
    provenance: Provenance = field(default_factory=lambda: Provenance(model="?"))

    def __post_init__(self) -> None:
        if not len(self.lengths) == len(self.estimates) == len(self.window_losses):
            raise InputError(
                f"{len(self.lengths)} lengths, {len(self.estimates)} estimates and "
                f"{len(self.window_losses)} loss lists must agree: one per length"
            )

    def to_frame(self) -> pd.DataFrame:
        """One row per length: loss and perplexity with their bootstrap CIs over windows."""
        rows = []
        for L, e in zip(self.lengths, self.estimates, strict=True):
            rows.append(
                {
                    "length": L,
                    "train_ctx": self.train_ctx,
                    "beyond_train": self.train_ctx < L,
                    "n_windows": e["n_windows"],
                    "loss": e["loss"]["mean"],
                    "loss_lo": ci_end(e["loss"]["lo"]),
                    "loss_hi": ci_end(e["loss"]["hi"]),
                    "perplexity": e["perplexity"]["mean"],
                    "perplexity_lo": ci_end(e["perplexity"]["lo"]),
                    "perplexity_hi": ci_end(e["perplexity"]["hi"]),
                }
            )
        return pd.DataFrame(rows)

    def figure(self, predictions: BasePredictions | None = None):
        """Perplexity by length (CI as error bars), the trained context and, given, Liu's
        T_extra."""
        return figure_of(MeasuredExtrapolation)(self, predictions)


def _loss_model(model, fast: bool):
    """The module whose losses are measured, and a factory of the context to run it in.

    A bridge rebuilds eager attention, whose [heads, n, n] scores take 10 GB at 16k tokens for
    SmolLM2; the HF model it wraps, with its sdpa attention, computes the same loss in O(n) memory.
    Under an intervention (a RoPE variant, an ablation: bridge hooks) the bridge runs as it is.
    """
    return backend_of(model).fast_forward(fast)


def measured_extrapolation(
    model,
    lengths: Sequence[int],
    *,
    n_windows: int = 4,
    corpus=None,
    batch_size: int = 1,
    train_ctx: int | None = None,
    fast: bool = True,
    progress: bool = True,
    text_column: str = "text",
    **bootstrap: Any,
) -> MeasuredExtrapolation:
    """Mean next-token loss at each length over ``n_windows`` windows of real text.

    Windows come from ``corpus`` through :func:`ropelens.run.data.analysis_windows`; at every
    length window i starts at the same token, so lengths differ only in how much context each
    prediction has. Each window starts with BOS. The loss is averaged over all positions of a
    window, with a bootstrap CI over windows (:func:`ropelens.run.evaluate.loss_estimate`).

    Args:
        model: A loaded model (``ropelens.load_model()``, a tiny test model, or a wrapped HF model).
        lengths (Sequence[int]): Context lengths in tokens, each ≥ 2.
        n_windows (int): Windows per length (default 4).
        corpus: A corpus name, path or :class:`ropelens.run.data.Corpus`; None for the embedded
            English text. Not a token tensor: windows are cut per length.
        batch_size (int): Windows per forward pass (default 1).
        train_ctx (int | None): The trained context length; None for the spec's ``n_ctx``.
        fast (bool): Measure a bridge through the HF model it wraps, with sdpa attention (same
            weights, same loss, memory linear in the length); default True.
        progress (bool): Show a progress bar.
        text_column (str): The text column of a table or dataset corpus.
        **bootstrap: Passed to :func:`ropelens.run.evaluate.bootstrap_ci`: ``n_boot`` (default
            2000, at least :data:`ropelens.run.evaluate.MIN_BOOT`), ``seed`` (0) and ``alpha``
            (0.05).

    Returns:
        MeasuredExtrapolation: Per length, the loss and perplexity with bootstrap CIs and each
        window's loss.

    Raises:
        InputError: When ``corpus`` is a token tensor, a length is below 2 or not a positive int,
            or ``n_windows`` or ``train_ctx`` is not a positive int.

    Examples:
        >>> from ropelens.analyses import measured_extrapolation
        >>> from ropelens.testing import tiny_model
        >>> texts = ["The quick brown fox jumps over the lazy dog. " * 4]  # or None: English
        >>> m = measured_extrapolation(
        ...     tiny_model("llama"), [16, 32], n_windows=2, corpus=texts, progress=False, n_boot=200
        ... )
        >>> m.lengths, [len(w) for w in m.window_losses], m.estimates[0]["n_boot"]
        ((16, 32), [2, 2], 200)
        >>> m.provenance.corpus, bool(1 < m.to_frame()["perplexity"][0] < 200)  # random: ≈ 101
        ('documents', True)
    """
    model = running_model(model)  # an nnsight model: the HF model it wraps
    lens = _lengths(lengths)
    n_windows = check_positive_int(n_windows, "n_windows")
    if "n_boot" in bootstrap:  # refused before any length is measured, not after the first
        check_n_boot(bootstrap["n_boot"])
    spec = rope_spec(model)
    t_train = check_positive_int(spec.n_ctx if train_ctx is None else train_ctx, "train_ctx")
    if isinstance(corpus, Tensor):
        raise InputError(
            "corpus must be a corpus name, path or ropelens.run.data.Corpus: windows are cut per "
            "length"
        )
    corpus = load_corpus(corpus, text_column=text_column)  # read once for every length
    runner, ctx = _loss_model(model, fast)
    estimates, per_window, name, sha = [], [], None, None
    for L in lens:
        if L < 2:
            raise InputError(f"length {L} is too short: a window needs at least 2 tokens")
        tokens, name, sha = analysis_windows(model.tokenizer, corpus, L, n_windows * L)
        with ctx():
            est, losses = loss_estimate(
                runner, tokens, batch_size=batch_size, progress=progress, **bootstrap
            )
        estimates.append(est.to_dict())
        per_window.append(tuple(float(x) for x in losses))
    return MeasuredExtrapolation(
        lengths=lens,
        estimates=tuple(estimates),
        window_losses=tuple(per_window),
        train_ctx=t_train,
        provenance=Provenance(
            **placement(model),
            model=model_label(model),
            corpus=name,
            corpus_sha256=sha,
            n_windows=n_windows,
            config={"lengths": list(lens), "batch_size": batch_size, "fast": fast},
        ),
    )
