"""Next-token loss per window and bootstrap confidence intervals over windows.

Windows are the unit of resampling: tokens inside one window are correlated, windows cut from
different stretches of text far less so, so the CI of a mean loss is taken over windows.
"""

from __future__ import annotations

import json
import math
import numbers
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from jaxtyping import Float, Int
from torch import Tensor

from ropelens.backends import backend_of
from ropelens.backends.engine import check_model_state
from ropelens.devices import device_of
from ropelens.errors import InputError
from ropelens.results.serialize import dump_json
from ropelens.spec.surface import running_model

__all__ = [
    "MIN_BOOT",
    "MIN_WINDOWS_FOR_CI",
    "NO_INTERVAL",
    "Estimate",
    "LossEstimate",
    "RunStore",
    "bootstrap_ci",
    "check_n_boot",
    "ci_end",
    "interval_text",
    "is_bridge",
    "loss_estimate",
    "loss_path",
    "percentile_ci",
    "window_losses",
]


def _check_tokens(tokens: Any) -> Tensor:
    if (
        not isinstance(tokens, Tensor)
        or tokens.ndim != 2
        or tokens.dtype not in (torch.long, torch.int)
    ):
        got = (
            f"{tuple(tokens.shape)} {tokens.dtype}"
            if isinstance(tokens, Tensor)
            else type(tokens).__name__
        )
        raise InputError(
            f"tokens must be an integer tensor [n_windows, n_ctx], got {got}: build it with "
            "ropelens.run.data.windows(corpus, tokenizer, n_ctx)"
        )
    if tokens.shape[0] < 1 or tokens.shape[1] < 2:
        raise InputError(
            f"tokens has shape {tuple(tokens.shape)}: need at least one window of at least 2 tokens"
        )
    return tokens.long()


def is_bridge(model: Any) -> bool:
    """Whether ``model`` is a TransformerLens bridge (deprecated:
    ``ropelens.backends.backend_of(model).tl_view``).

    Args:
        model (Any): A model ropelens runs: a bridge, an HF model or an nnsight model.

    Returns:
        bool: True for a TransformerLens bridge (what :func:`ropelens.load_model` returns).

    Examples:
        >>> from ropelens.testing import tiny_hf_model, tiny_model
        >>> is_bridge(tiny_model("llama")), is_bridge(tiny_hf_model("llama"))
        (True, False)
    """
    return backend_of(model).tl_view


def loss_path(model: Any, path: str = "auto") -> str:
    """Which forward :func:`window_losses` runs: ``"sdpa"`` (the HF model with sdpa attention and
    every RoPE variant and plane ablation in force, :func:`ropelens.backends.sdpa.on_sdpa`),
    ``"bridge"`` or ``"hf"`` (a plain HF model).

    ``"auto"`` takes sdpa for a bridge where :func:`ropelens.backends.sdpa.sdpa_ready` holds, else
    the bridge (another hook or intervention is in force, or the family rotates where the sdpa path
    cannot reach).

    Args:
        model (Any): The model :func:`window_losses` would run.
        path (str): ``"auto"`` (default), ``"sdpa"`` or ``"bridge"``.

    Returns:
        str: ``"sdpa"``, ``"bridge"`` or ``"hf"``.

    Raises:
        InputError: If ``path`` is none of the three, or the model cannot be measured as it stands
            (:func:`ropelens.backends.engine.check_model_state`: in training mode, dropout makes
            every loss random; weights on the meta device).

    Examples:
        >>> from ropelens.testing import tiny_model
        >>> model = tiny_model("llama")
        >>> loss_path(model), loss_path(model, "bridge")
        ('sdpa', 'bridge')
    """
    if path not in ("auto", "sdpa", "bridge"):
        raise InputError(f"path must be 'auto', 'sdpa' or 'bridge', got {path!r}")
    # every loss and decoding ropelens measures runs the forward this names: a model left in
    # training mode is refused here, in one line, rather than measured through its dropout
    check_model_state(model)

    return backend_of(model).loss_path(path)


def window_losses(
    model: Any,
    tokens: Int[Tensor, "n_windows n_ctx"],
    batch_size: int = 4,
    progress: bool = True,
    path: str = "auto",
) -> Float[Tensor, " n_windows"]:
    """Mean next-token loss (nats) of each window, without gradients, on CPU.

    ``model`` is a TransformerLens bridge (``ropelens.load_model``) or an HF causal LM; any RoPE
    variant or ablation context active around the call applies. ``path`` chooses the forward
    (:func:`loss_path`): by default a bridge runs as its HF model with sdpa attention, the
    interventions applied where it rotates, in memory linear in the length.

    Args:
        model (Any): A TransformerLens bridge, an HF causal LM, or an nnsight model wrapping one.
        tokens (Tensor): ``[n_windows, n_ctx]`` integer tokens (:func:`ropelens.run.data.windows`).
        batch_size (int): Windows per forward (default 4).
        progress (bool): Show a progress bar (default True).
        path (str): Which forward, as :func:`loss_path` (default ``"auto"``).

    Returns:
        Tensor: ``[n_windows]`` mean next-token cross-entropy of each window, in nats, on CPU.

    Raises:
        InputError: If ``tokens`` is not a 2-D integer tensor of at least one window of two
            tokens, ``batch_size`` is not a positive int, ``path`` is invalid, or the model is in
            training mode or has weights on the meta device (:func:`loss_path`).

    Examples:
        >>> import math
        >>> from ropelens.run.data import load_corpus, windows
        >>> from ropelens.testing import tiny_model
        >>> model = tiny_model("llama")
        >>> tokens = windows(load_corpus(), model, 32, n_windows=4)
        >>> losses = window_losses(model, tokens, progress=False)
        >>> losses.shape
        torch.Size([4])
        >>> bool(abs(losses.mean() - math.log(101)) < 0.5)  # random weights: near-uniform guess
        True
    """
    model = running_model(model)  # an nnsight model: the HF model it wraps
    tokens = _check_tokens(tokens)
    if (
        not isinstance(batch_size, numbers.Integral)
        or isinstance(batch_size, bool)
        or batch_size < 1
    ):
        raise InputError(f"batch_size must be a positive int, got {batch_size!r}")
    device = device_of(model)
    starts = range(0, tokens.shape[0], int(batch_size))
    if progress:
        from tqdm.auto import tqdm

        starts = tqdm(starts, desc="windows", unit="batch", leave=False)
    out = []

    with torch.no_grad(), backend_of(model).loss_forward(loss_path(model, path)) as losses:
        for s in starts:
            out.append(losses(tokens[s : s + batch_size].to(device)).cpu())
    return torch.cat(out)


# an interval over windows needs their spread: one window has none, so it gets no interval
MIN_WINDOWS_FOR_CI = 2
NO_INTERVAL = "n/a (one window gives no spread)"
# the fewest bootstrap resamples a percentile interval is drawn from: a 95% interval's ends are the
# 2.5% and 97.5% quantiles of the resampled means, and below 100 resamples each end rests on fewer
# than 2.5 of them (n_boot=1 gives a zero-width "interval")
MIN_BOOT = 100


def check_n_boot(n_boot: Any) -> int:
    """``n_boot`` as an int if it is at least :data:`MIN_BOOT` bootstrap resamples, else an
    InputError that says so and how to fix it.

    Every function that takes ``n_boot`` (and the command line's ``--boot``) checks it here: fewer
    resamples cannot place the ends of a 95% interval.

    Args:
        n_boot (Any): Bootstrap resamples.

    Returns:
        int: ``n_boot`` as an int.

    Raises:
        InputError: If ``n_boot`` is not an int ≥ :data:`MIN_BOOT`.

    Examples:
        >>> check_n_boot(2000)
        2000
        >>> check_n_boot(1)
        Traceback (most recent call last):
            ...
        ropelens.errors.InputError: n_boot must be an int >= 100 (bootstrap resamples), got 1: ...
    """
    if isinstance(n_boot, bool) or not isinstance(n_boot, numbers.Integral) or n_boot < MIN_BOOT:
        raise InputError(
            f"n_boot must be an int >= {MIN_BOOT} (bootstrap resamples), got {n_boot!r}: fewer "
            f"resamples cannot place the ends of a 95% interval (1 gives one of zero width); pass "
            f"n_boot={MIN_BOOT} or more (2000 is usual)"
        )
    return int(n_boot)


def interval_text(lo: float | None, hi: float | None, fmt: str = ".4g") -> str:
    """``[lo, hi]`` formatted with ``fmt``, or :data:`NO_INTERVAL` where there is no interval (NaN
    or None ends: fewer than two windows).

    Args:
        lo (float | None): Lower end (None or NaN: no interval).
        hi (float | None): Upper end (None or NaN: no interval).
        fmt (str): Format spec of each end (default ``".4g"``).

    Returns:
        str: ``"[lo, hi]"`` or ``"n/a (one window gives no spread)"``.

    Examples:
        >>> interval_text(1.23456, 2.5)
        '[1.235, 2.5]'
        >>> interval_text(None, None)
        'n/a (one window gives no spread)'
    """
    if lo is None or hi is None or not (math.isfinite(lo) and math.isfinite(hi)):
        return NO_INTERVAL
    return f"[{lo:{fmt}}, {hi:{fmt}}]"


def ci_end(x: float | None) -> float:
    """A CI end as written (None where there was no interval) as a float (NaN for None).

    Args:
        x (float | None): The end as JSON holds it.

    Returns:
        float: ``x``, or NaN for None.

    Examples:
        >>> ci_end(0.5), ci_end(None)
        (0.5, nan)
    """
    return math.nan if x is None else float(x)


def _or_none(x: float) -> float | None:
    return None if math.isnan(x) else x


@dataclass(frozen=True)
class Estimate:
    """A point estimate with a percentile bootstrap interval [lo, hi] at level 1 − alpha; lo and hi
    are NaN where there is no interval (fewer than :data:`MIN_WINDOWS_FOR_CI` windows: one window
    gives no spread), written as null.

    Made by :func:`percentile_ci` and :func:`ropelens.run.stats.paired_bootstrap_ci`.

    Attributes:
        mean (float): The point estimate (the mean over windows).
        lo (float): Lower end of the interval (NaN: none).
        hi (float): Upper end of the interval (NaN: none).

    Examples:
        >>> est = Estimate(2.0, 1.5, 2.5)
        >>> print(est)
        2 [1.5, 2.5]
        >>> est.excludes(0.0), est.excludes(2.2)
        (True, False)
        >>> Estimate.from_dict({"mean": 2.0, "lo": None, "hi": None}).has_interval
        False
    """

    mean: float
    lo: float
    hi: float

    @property
    def has_interval(self) -> bool:
        """Whether both ends are finite (False for a single window)."""
        return math.isfinite(self.lo) and math.isfinite(self.hi)

    def interval(self, fmt: str = ".4g") -> str:
        """``[lo, hi]``, or ``n/a (one window gives no spread)``."""
        return interval_text(self.lo, self.hi, fmt)

    def excludes(self, value: float = 0.0) -> bool:
        """Whether the interval lies wholly above or below ``value`` (False without one)."""
        return self.has_interval and (self.lo > value or self.hi < value)

    def to_dict(self) -> dict[str, float | None]:
        """JSON-ready ``{"mean", "lo", "hi"}``, a missing end as None."""
        return {"mean": self.mean, "lo": _or_none(self.lo), "hi": _or_none(self.hi)}

    @classmethod
    def from_dict(cls, d: dict[str, float | None]) -> Estimate:
        """The estimate :meth:`to_dict` wrote."""
        return cls(float(d["mean"]), ci_end(d["lo"]), ci_end(d["hi"]))  # type: ignore[arg-type]

    def __str__(self) -> str:
        return f"{self.mean:.4g} {self.interval()}"


@dataclass(frozen=True)
class LossEstimate:
    """Mean loss over windows and the perplexity exp(loss), each with its bootstrap CI.

    Made by :func:`bootstrap_ci` and :func:`loss_estimate`.

    Attributes:
        loss (Estimate): Mean next-token loss over windows (nats) with its interval.
        perplexity (Estimate): exp of the loss and of its interval's ends.
        n_windows (int): Windows the mean is over.
        n_boot (int): Bootstrap resamples.
        alpha (float): 1 − the confidence level (0.05: a 95% interval).
        seed (int): Seed of the resampling generator.

    Examples:
        >>> est = bootstrap_ci([2.0, 2.2, 1.9, 2.4, 2.1])
        >>> print(est.loss)
        2.12 [1.98, 2.28]
        >>> round(est.perplexity.mean, 3), est.n_windows  # exp(2.12)
        (8.331, 5)
        >>> LossEstimate.from_dict(est.to_dict()) == est
        True
    """

    loss: Estimate
    perplexity: Estimate
    n_windows: int
    n_boot: int
    alpha: float
    seed: int

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready fields (the estimates as dicts)."""
        return {
            "loss": self.loss.to_dict(),
            "perplexity": self.perplexity.to_dict(),
            "n_windows": self.n_windows,
            "n_boot": self.n_boot,
            "alpha": self.alpha,
            "seed": self.seed,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> LossEstimate:
        """The estimate :meth:`to_dict` wrote."""
        return cls(
            Estimate.from_dict(d["loss"]),
            Estimate.from_dict(d["perplexity"]),
            int(d["n_windows"]),
            int(d["n_boot"]),
            float(d["alpha"]),
            int(d["seed"]),
        )


def _as_values(values: Any) -> Tensor:
    try:
        v = torch.as_tensor(values, dtype=torch.float64).flatten()
    except (TypeError, ValueError, RuntimeError) as e:
        raise InputError(
            f"values must be a 1-D sequence of numbers, got {type(values).__name__}"
        ) from e
    if v.numel() == 0:
        raise InputError("values is empty: the bootstrap needs at least one window's loss")
    if not torch.isfinite(v).all():
        raise InputError(
            f"values holds non-finite entries (e.g. {v[~torch.isfinite(v)][0].item()}): a window "
            "diverged; check the model or drop those windows"
        )
    return v


def percentile_ci(
    values: Float[Tensor, " n"] | Sequence[float],
    n_boot: int = 2000,
    seed: int = 0,
    alpha: float = 0.05,
) -> Estimate:
    """Mean of ``values`` with its percentile bootstrap CI at level 1 − ``alpha`` (windows resampled
    with replacement, ``n_boot`` times, from a generator seeded with ``seed``).

    Percentile intervals of very skewed samples can exclude the sample mean; the interval is widened
    to keep it. Fewer than :data:`MIN_WINDOWS_FOR_CI` values give no interval: ``lo`` and ``hi``
    are NaN (one window gives no spread; resampling it returns it every time).

    Args:
        values (Tensor | Sequence[float]): ``[n]`` values, one per window.
        n_boot (int): Bootstrap resamples, at least :data:`MIN_BOOT` (100) (default 2000).
        seed (int): Seed of the resampling generator: the same inputs give the same interval.
        alpha (float): 1 − the confidence level, strictly between 0 and 1 (default 0.05).

    Returns:
        Estimate: The mean with its interval.

    Raises:
        InputError: If ``values`` is empty or holds non-finite values, ``n_boot`` is below
            :data:`MIN_BOOT`, or ``alpha`` or ``seed`` is invalid.

    Examples:
        >>> print(percentile_ci([2.0, 2.2, 1.9, 2.4, 2.1]))
        2.12 [1.98, 2.28]
        >>> print(percentile_ci([2.0]))  # one window: no interval
        2 n/a (one window gives no spread)
    """
    v = _as_values(values)
    n_boot = check_n_boot(n_boot)
    if not isinstance(alpha, numbers.Real) or isinstance(alpha, bool) or not 0 < alpha < 1:
        raise InputError(
            f"alpha must be strictly between 0 and 1, got {alpha!r} (0.05 for a 95% CI)"
        )
    if not isinstance(seed, numbers.Integral) or isinstance(seed, bool):
        raise InputError(f"seed must be an int, got {seed!r}")
    if v.numel() < MIN_WINDOWS_FOR_CI:
        return Estimate(v.mean().item(), math.nan, math.nan)
    g = torch.Generator().manual_seed(int(seed))
    idx = torch.randint(0, v.numel(), (int(n_boot), v.numel()), generator=g)
    means = v[idx].mean(dim=1)
    mean = v.mean().item()
    lo, hi = torch.quantile(
        means, torch.tensor([alpha / 2, 1 - alpha / 2], dtype=torch.float64)
    ).tolist()
    return Estimate(mean, min(lo, mean), max(hi, mean))


def bootstrap_ci(
    values: Float[Tensor, " n"] | Sequence[float],
    n_boot: int = 2000,
    seed: int = 0,
    alpha: float = 0.05,
) -> LossEstimate:
    """Mean of ``values`` (per-window losses) with a percentile bootstrap CI, and of exp(mean).

    The perplexity CI is the loss CI mapped through exp, which is monotone, so it is exactly the
    percentile interval of the resampled perplexities. Seeded: the same inputs give the same CI.

    Args:
        values (Tensor | Sequence[float]): ``[n_windows]`` losses in nats.
        n_boot (int): Bootstrap resamples, at least :data:`MIN_BOOT` (100) (default 2000).
        seed (int): Seed of the resampling generator.
        alpha (float): 1 − the confidence level (default 0.05).

    Returns:
        LossEstimate: Loss and perplexity with their intervals, and how they were made.

    Raises:
        InputError: As :func:`percentile_ci`.

    Examples:
        >>> est = bootstrap_ci([2.0, 2.2, 1.9, 2.4, 2.1], n_boot=2000, seed=0)
        >>> print(est.loss)
        2.12 [1.98, 2.28]
        >>> print(est.perplexity)  # the loss interval through exp
        8.331 [7.243, 9.777]
    """
    est = percentile_ci(values, n_boot, seed, alpha)
    mean, lo, hi = est.mean, est.lo, est.hi
    return LossEstimate(
        loss=est,
        perplexity=Estimate(math.exp(mean), math.exp(lo), math.exp(hi)),
        n_windows=int(_as_values(values).numel()),
        n_boot=int(n_boot),
        alpha=float(alpha),
        seed=int(seed),
    )


def loss_estimate(
    model: Any,
    tokens: Int[Tensor, "n_windows n_ctx"],
    batch_size: int = 4,
    progress: bool = True,
    path: str = "auto",
    **bootstrap: Any,
) -> tuple[LossEstimate, Float[Tensor, " n_windows"]]:
    """``bootstrap_ci(window_losses(model, tokens))`` and the per-window losses.

    Args:
        model (Any): A TransformerLens bridge, an HF causal LM, or an nnsight model wrapping one;
            any RoPE variant or ablation context active around the call applies.
        tokens (Tensor): ``[n_windows, n_ctx]`` integer tokens.
        batch_size (int): Windows per forward (default 4).
        progress (bool): Show a progress bar (default True).
        path (str): Which forward, as :func:`loss_path` (default ``"auto"``).
        **bootstrap: ``n_boot``, ``seed`` and ``alpha`` for :func:`bootstrap_ci`.

    Returns:
        tuple[LossEstimate, Tensor]: The estimate and the ``[n_windows]`` losses (nats).

    Raises:
        InputError: As :func:`window_losses` and :func:`bootstrap_ci`.

    Examples:
        >>> from ropelens import apply_rope_variant
        >>> from ropelens.run.data import load_corpus, windows
        >>> from ropelens.spec.variants import NoPE
        >>> from ropelens.testing import tiny_model
        >>> model = tiny_model("llama")
        >>> tokens = windows(load_corpus(), model, 32, n_windows=4)
        >>> with apply_rope_variant(model, NoPE()):
        ...     est, losses = loss_estimate(model, tokens, progress=False, n_boot=500)
        >>> est.n_windows, est.n_boot, est.loss.has_interval, losses.shape
        (4, 500, True, torch.Size([4]))
    """
    if "n_boot" in bootstrap:  # refused before the forward passes, not after them
        check_n_boot(bootstrap["n_boot"])
    model = running_model(model)  # an nnsight model: the HF model it wraps
    losses = window_losses(model, tokens, batch_size=batch_size, progress=progress, path=path)
    return bootstrap_ci(losses, **bootstrap), losses


class RunStore:
    """Finished runs keyed by their config in one JSON file, rewritten atomically after each run.

    Experiments call :meth:`get` before a run and :meth:`put` after it, so a rerun skips what is
    done and a killed sweep loses at most the run in progress. Two sweeps writing one file keep
    each other's runs (each write merges what is on disk), though not across a simultaneous write.

    Args:
        path (str | PathLike): The JSON file; it need not exist yet.
        meta (dict[str, Any] | None): Written beside the runs (what the sweep is), e.g. the model.

    Raises:
        InputError: If ``path`` exists and is not valid JSON (move it aside to start over).

    Examples:
        >>> import os, tempfile
        >>> path = os.path.join(tempfile.mkdtemp(), "runs.json")
        >>> store = RunStore(path, meta={"model": "tiny llama"})
        >>> store.get({"variant": "NoPE"}) is None  # not run yet
        True
        >>> store.put({"variant": "NoPE"}, {"loss": 4.7})
        >>> RunStore(path).get({"variant": "NoPE"})  # a rerun finds it on disk
        {'config': {'variant': 'NoPE'}, 'loss': 4.7}
    """

    def __init__(self, path: str | os.PathLike[str], meta: dict[str, Any] | None = None):
        self.path = Path(path)
        self.meta = dict(meta or {})
        self.runs: dict[str, dict[str, Any]] = self._saved()

    def _saved(self) -> dict[str, dict[str, Any]]:
        if not self.path.exists():
            return {}
        try:
            saved = json.loads(self.path.read_text())
        except json.JSONDecodeError as e:
            raise InputError(
                f"{self.path} is not valid JSON ({e.msg} at line {e.lineno}): move it aside to "
                "start over"
            ) from e
        return dict(saved.get("runs", {}))

    @staticmethod
    def key(config: dict[str, Any]) -> str:
        """The canonical key of a run config (sorted JSON)."""
        return json.dumps(config, sort_keys=True, separators=(",", ":"))

    def get(self, config: dict[str, Any]) -> dict[str, Any] | None:
        """The stored run of ``config`` (``{"config": ..., **result}``), or None if not run."""
        return self.runs.get(self.key(config))

    def put(self, config: dict[str, Any], result: dict[str, Any]) -> None:
        """Store one run; runs another process saved to the same file since are kept, not
        overwritten."""
        self.runs = {**self._saved(), **self.runs, self.key(config): {"config": config, **result}}
        dump_json(self.path, {"meta": self.meta, "runs": self.runs})

    def __len__(self) -> int:
        return len(self.runs)
