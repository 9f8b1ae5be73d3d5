"""Where the high-norm frequency band sits (Oka et al., ICLR 2026), and making the planes below it
NoPE.

Oka et al. ("Frequency Bands in RoPE") report that a band of high per-plane norm forms in queries
and keys, placed by the RoPE base and the training length, and that the planes below it (lower
frequencies) can stop rotating with little loss. ropelens locates the band from the per-plane mean
norms that :func:`ropelens.analyses.frequency_usage.frequency_usage` measures (sink positions
excluded), per layer (heads averaged) and per head:

- the *peak* is the plane of largest mean norm;
- the *band* is the contiguous run of planes around the peak whose norm is at least half-way from
  the profile's median to the peak (a full width at half maximum above the median, so a profile
  that is high everywhere does not make everything "band");
- the *prominence* is peak ÷ median (near 1: no band stands out).

It relates the band to the training length T (the spec's ``n_ctx``): each plane's wavelength over
T, and the *critical plane*, the number of planes that complete a turn within T (Liu et al.'s
critical dimension d_extra / 2, :func:`ropelens.analyses.base_predictions.critical_dimension`, for
default RoPE).

:func:`nope_below_band` runs the model with the planes below each layer's band (higher index, lower
frequency) unrotated (:class:`ropelens.spec.variants.PlaneMask`), and, as the control, with as many
planes of that layer drawn at random (seeded); the loss of each is measured on corpus windows with
:func:`ropelens.run.evaluate.window_losses`, with bootstrap CIs of the per-window differences.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace
from typing import Any, Literal

import numpy as np
import pandas as pd
import torch
from jaxtyping import Float
from torch import Tensor

from ropelens.analyses.frequency_usage import FrequencyUsage, frequency_usage
from ropelens.errors import InputError, UnsupportedModelError
from ropelens.results.findings import Finding
from ropelens.results.provenance import Provenance
from ropelens.results.result import Result
from ropelens.run.evaluate import LossEstimate, bootstrap_ci, window_losses
from ropelens.run.intervene import apply_rope_variant, is_identity
from ropelens.run.measure import RunOptions, Windows, corpus_analysis
from ropelens.spec.plan import describe_intervention
from ropelens.spec.rope import RopeSpec
from ropelens.spec.surface import running_model
from ropelens.spec.variants import PlaneMask
from ropelens.validate import check_number

__all__ = [
    "BandEdges",
    "BandIntervention",
    "BandLocation",
    "control_planes",
    "band_location",
    "locate_band",
    "nope_below_band",
]

Which = Literal["q", "k"]
CONDITIONS = ("rope", "nope_below", "control")


@dataclass(frozen=True)
class BandEdges:
    """The band of each profile ``[..., plane]``: peak plane, first and last plane (inclusive),
    prominence."""

    peak: Tensor
    lo: Tensor
    hi: Tensor
    prominence: Tensor

    @property
    def width(self) -> Tensor:
        return self.hi - self.lo + 1


def locate_band(profile: Float[Tensor, "... plane"]) -> BandEdges:
    """The high-norm band of each per-plane profile: the contiguous planes around the peak at or
    above median + (peak − median)/2 (see the module docstring)."""
    x = torch.as_tensor(profile, dtype=torch.float64)
    if x.ndim < 1 or x.shape[-1] < 1 or not bool(torch.isfinite(x).all()):
        raise InputError(
            f"profile must be finite per-plane norms [..., plane], got shape {tuple(x.shape)}"
        )
    flat = x.reshape(-1, x.shape[-1]).numpy()
    out = np.zeros((flat.shape[0], 4))
    for r, row in enumerate(flat):
        peak = int(row.argmax())
        med = float(np.median(row))
        level = med + (row[peak] - med) / 2
        lo = peak
        while lo > 0 and row[lo - 1] >= level:
            lo -= 1
        hi = peak
        while hi < len(row) - 1 and row[hi + 1] >= level:
            hi += 1
        out[r] = (peak, lo, hi, row[peak] / med if med > 0 else np.inf)
    shape = x.shape[:-1]

    def col(j, dt):
        return torch.from_numpy(out[:, j]).to(dt).reshape(shape)

    return BandEdges(
        col(0, torch.long), col(1, torch.long), col(2, torch.long), col(3, torch.float64)
    )


def control_planes(n_planes: int, counts: Sequence[int], seed: int) -> list[tuple[int, ...]]:
    """For each entry of ``counts``, that many distinct planes of ``n_planes`` drawn uniformly
    (seeded: entry i draws from its own stream, so a layer's control does not depend on the
    others)."""
    out = []
    for i, n in enumerate(counts):
        rng = np.random.default_rng([int(seed), i])
        out.append(tuple(sorted(int(p) for p in rng.choice(n_planes, size=int(n), replace=False))))
    return out


@dataclass(frozen=True)
class BandIntervention:
    """Losses with the planes below each layer's band unrotated, and with as many random planes
    unrotated."""

    layers: tuple[int, ...]
    below: tuple[tuple[int, ...], ...]  # per layer, the planes made NoPE
    control: tuple[tuple[int, ...], ...]  # per layer, as many planes drawn at random
    seed: int
    losses: dict[str, list[float]]  # per condition, the mean loss of each window
    estimates: dict[
        str, LossEstimate
    ]  # per condition, the loss; and "nope_below-rope", "control-rope" (paired)


@dataclass(frozen=True)
class BandLocation(
    Result, previous_kinds=("FrequencyBands",), merge_same=("which",), merge_sums=("usage",)
):
    """The high-norm band per layer and head, from measured per-plane norms, and optionally the loss
    of making the planes below it NoPE against a random control.

    Built by :func:`~ropelens.analyses.band_location` (Oka et al., ICLR 2026, "Frequency Bands in
    RoPE"). The band is the contiguous run of planes around the peak norm that stays at least
    half-way from the profile's median to the peak; :meth:`critical_plane` is the number of planes
    that complete a turn within the training length (Liu et al.'s d_extra / 2).

    Attributes:
        usage (FrequencyUsage): The per-plane norms the band is read from (sink positions
            excluded); ``layers``, ``spec`` and ``provenance`` are its own.
        which (str): ``"q"`` (queries, the default) or ``"k"`` (keys).
        intervention (BandIntervention | None): Losses with the planes below each layer's band
            unrotated and with as many random planes unrotated (the control), with paired
            bootstrap CIs; None when run with ``intervene=False``.

    Raises:
        InputError: When ``which`` is neither ``"q"`` nor ``"k"``.

    Examples:
        >>> import torch
        >>> from ropelens.analyses import band_location
        >>> from ropelens.testing import tiny_model
        >>> tokens = torch.randint(4, 100, (2, 16), generator=torch.Generator().manual_seed(0))
        >>> loc = band_location(tiny_model("llama"), tokens, intervene=False, progress=False)
        >>> tuple(loc.profile().shape)  # [layer, plane], heads averaged
        (2, 8)
        >>> edges = loc.bands()
        >>> bool((edges.lo <= edges.peak).all() and (edges.peak <= edges.hi).all())
        True
        >>> loc.critical_plane()  # planes with a wavelength within n_ctx = 256
        [4, 4]
    """

    usage: FrequencyUsage
    which: str = "q"
    intervention: BandIntervention | None = None

    def __post_init__(self) -> None:
        if self.which not in ("q", "k"):
            raise InputError(f"which must be 'q' (queries) or 'k' (keys), got {self.which!r}")

    @property
    def provenance(self) -> Provenance:
        """The provenance of the measured norms."""
        return self.usage.provenance

    @property
    def layers(self) -> tuple[int, ...]:
        """The measured layers."""
        return self.usage.layers

    @property
    def spec(self) -> RopeSpec:
        """The model's RoPE reading."""
        return self.usage.spec

    def merge(self, other: BandLocation) -> BandLocation:
        """Exact merge of the norms of two runs (the intervention, a loss on given windows, does not
        merge)."""
        if self.intervention is not None or getattr(other, "intervention", None) is not None:
            raise InputError(
                "BandLocation with an intervention do not merge: merge the runs without it "
                "(intervene=False), then run nope_below_band on the merged result"
            )
        self._check_mergeable(other)
        return replace(self, usage=self.usage.merge(other.usage))

    # ---------------------------------------------------------------- numbers
    def profile(self, per_head: bool = False) -> Float[Tensor, "layer plane"]:
        """Mean per-plane norm, sink positions excluded: ``[layer, plane]`` (heads averaged) or
        ``[layer, head, plane]``."""
        n = self.usage.norm(self.which, "no_sink").double()  # type: ignore[arg-type]
        return n if per_head else n.mean(1)

    def bands(self, per_head: bool = False) -> BandEdges:
        """The band of every layer (heads averaged) or of every head."""
        return locate_band(self.profile(per_head))

    def critical_plane(self) -> list[int]:
        """Per layer, the planes that complete a turn within the training length (Liu's d_extra /
        2)."""
        return [int((self.spec.layers[L].wavelength <= self.spec.n_ctx).sum()) for L in self.layers]

    def below_band(self) -> list[tuple[int, ...]]:
        """Per layer, the planes below its band (lower frequency than its last plane)."""
        hi, P = self.bands().hi, self.spec.layers[self.layers[0]].n_planes
        return [tuple(range(int(h) + 1, P)) for h in hi]

    # ---------------------------------------------------------------- findings
    def findings(self) -> list[Finding]:
        """Where the band sits against the training length; the intervention's cost against its
        control."""
        df = self.to_frame()
        lay = df[df["head"] == -1]
        T = self.spec.n_ctx
        vals: dict[str, Any] = {
            "which": self.which,
            "n_layers": len(lay),
            "train_ctx": T,
            "median_peak": float(lay["peak"].median()),
            "median_lo": float(lay["lo"].median()),
            "median_hi": float(lay["hi"].median()),
            "median_prominence": round(float(lay["prominence"].median()), 2),
            "median_peak_wavelength_over_ctx": round(
                float(lay["peak_wavelength_over_ctx"].median()), 3
            ),
            "median_critical_plane": float(lay["critical_plane"].median()),
            "layers_band_at_or_below_critical": int((lay["hi"] < lay["critical_plane"]).sum()),
        }
        noun = "queries" if self.which == "q" else "keys"
        text = (
            f"The high-norm band of the {noun} (heads averaged) sits at planes "
            f"{vals['median_lo']:.0f}–{vals['median_hi']:.0f} (peak {vals['median_peak']:.0f}, "
            f"prominence {vals['median_prominence']:.2f}×; medians over {len(lay)} layers); the "
            f"peak plane's wavelength is {vals['median_peak_wavelength_over_ctx']:.3g}× the "
            f"training length {T:,}, whose critical plane is "
            f"{vals['median_critical_plane']:.0f}; the band ends before the critical plane in "
            f"{vals['layers_band_at_or_below_critical']} layers."
        )
        out = [Finding("band_location", "bands", text, vals)]
        if self.intervention is not None:
            e = self.intervention.estimates
            d_b, d_c = e["nope_below-rope"].loss, e["control-rope"].loss
            n = sum(len(p) for p in self.intervention.below)
            iv = {
                "rope": e["rope"].loss.mean,
                "nope_below_delta": d_b.to_dict(),
                "control_delta": d_c.to_dict(),
                "planes_unrotated": n,
                "seed": self.intervention.seed,
            }
            out.append(
                Finding(
                    "nope_below_band",
                    "bands",
                    f"Unrotating the {n} planes below the band (all layers) changes the loss by "
                    f"{d_b.mean:+.4f} {d_b.interval('+.4f')} nats; as many random "
                    f"planes, {d_c.mean:+.4f} {d_c.interval('+.4f')} (baseline "
                    f"{e['rope'].loss.mean:.4f}).",
                    iv,
                )
            )
        return out

    def to_frame(self) -> pd.DataFrame:
        """One row per layer (head −1: heads averaged) and per (layer, head): the band's planes,
        their wavelengths, the peak wavelength over the training length, the critical plane and the
        planes below."""
        rows = []
        crit = self.critical_plane()
        for per_head in (False, True):
            b = self.bands(per_head)
            for i, L in enumerate(self.layers):
                wl = self.spec.layers[L].wavelength
                heads = range(b.peak.shape[1]) if per_head else [-1]
                for h in heads:
                    at = (i, h) if per_head else (i,)
                    pk, lo, hi = int(b.peak[at]), int(b.lo[at]), int(b.hi[at])
                    rows.append(
                        {
                            "layer": L,
                            "head": h,
                            "peak": pk,
                            "lo": lo,
                            "hi": hi,
                            "width": hi - lo + 1,
                            "prominence": float(b.prominence[at]),
                            "peak_wavelength": float(wl[pk]),
                            "lo_wavelength": float(wl[lo]),
                            "hi_wavelength": float(wl[hi]),
                            "peak_wavelength_over_ctx": float(wl[pk]) / self.spec.n_ctx,
                            "critical_plane": crit[i],
                            "n_below": len(wl) - 1 - hi,
                        }
                    )
        return pd.DataFrame(rows)

    # ---------------------------------------------------------------- persistence


def nope_below_band(
    model,
    bands: BandLocation,
    tokens: Tensor,
    *,
    seed: int = 0,
    batch_size: int = 4,
    progress: bool = False,
) -> BandIntervention:
    """Loss on ``tokens`` with RoPE, with the planes below each layer's band unrotated, and with as
    many planes per layer drawn at random (seeded) unrotated; paired bootstrap CIs of the
    differences."""
    model = running_model(model)  # an nnsight model: the HF model it wraps
    spec, layers = bands.spec, list(bands.layers)
    variants = [i for i in spec.interventions if i.get("intervention") == "rope variant"]
    if variants:
        raise UnsupportedModelError(
            f"{spec.model_name} runs under {describe_intervention(variants[-1])}: the NoPE test "
            "unrotates planes with PlaneMask variants, which would replace it in those layers; "
            "measure it with intervene=False, or on the model without the variant"
        )
    if not is_identity(spec, PlaneMask(()), layers, int(tokens.shape[1])):
        raise UnsupportedModelError(
            f"{spec.model_name}: its RoPE is not plain default RoPE in layers {layers}, and "
            "PlaneMask rebuilds default frequencies: the intervention would change every plane"
        )
    below = bands.below_band()
    control = control_planes(spec.layers[layers[0]].n_planes, [len(p) for p in below], seed)
    losses: dict[str, Tensor] = {}
    for cond, planes in (("rope", None), ("nope_below", below), ("control", control)):
        with contextlib.ExitStack() as stack:
            for L, p in zip(layers, planes or [], strict=False):
                if p:
                    stack.enter_context(apply_rope_variant(model, PlaneMask(p), layers=[L]))
            losses[cond] = window_losses(
                model, tokens, batch_size=batch_size, progress=progress
            ).double()
    est = {c: bootstrap_ci(v, seed=seed) for c, v in losses.items()}
    for c in ("nope_below", "control"):
        est[f"{c}-rope"] = bootstrap_ci(
            losses[c] - losses["rope"], seed=seed
        )  # paired: same windows
    return BandIntervention(
        layers=tuple(layers),
        below=tuple(below),
        control=tuple(control),
        seed=int(seed),
        losses={c: v.tolist() for c, v in losses.items()},
        estimates=est,
    )


@corpus_analysis(n_ctx=256, max_tokens=4096)
def band_location(
    model,
    corpus,
    run: RunOptions,
    *,
    which: Which = "q",
    n_sink: int = 1,
    intervene: bool = True,
    eval_windows: int = 8,
    seed: int = 0,
) -> BandLocation:
    """Locate the high-norm band of planes per layer and head, and the cost of unrotating below it.

    After Oka et al. (ICLR 2026, "Frequency Bands in RoPE"): from the per-plane mean norms of
    :func:`frequency_usage` (sink positions excluded), the *peak* is the plane of largest mean norm,
    the *band* the contiguous run around it whose norm is at least half-way from the profile's
    median to the peak, and the *prominence* peak ÷ median (near 1: no band stands out); each is
    related to the training length through the planes' wavelengths. With ``intervene``, the planes
    below each layer's band (lower frequencies) stop rotating on the first ``eval_windows`` windows,
    against as many random planes (seeded), and the loss change of each is measured with bootstrap
    CIs (:func:`nope_below_band`).

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
        max_tokens (int | None): Corpus tokens to read (default 4096; None: all of it).
        layers (Sequence[int] | None): Layer indices to measure (default None: every rotary layer).
        text_column (str): The column of a table or dataset corpus that holds the text (default
            "text").
        which (str): Locate the band in the queries (``"q"``, default) or the keys (``"k"``).
        n_sink (int): Leading positions of each window left out of the norms (default 1: BOS).
        intervene (bool): Also measure the loss of unrotating the planes below the band, against a
            random control (default True).
        eval_windows (int): Windows the loss is measured on, ≥ 1 (default 8).
        seed (int): Seed of the random control planes (default 0).
        batch_size (int): Windows per forward pass (default 4).
        progress (bool): Show a progress bar (default True; rank 0 only under torchrun).
        checkpoint (str | os.PathLike | None): A directory to save progress to and resume a killed
            run from (default None: none; see :mod:`ropelens.run.distributed`).
        checkpoint_every (int): Batches between checkpoints (default 8).
        verify (bool): First check that ropelens's reading of RoPE reproduces the model's own
            attention (default True); False skips the check, and the result says "unverified".

    Returns:
        BandLocation: The frequency usage it was located from, the band per layer and head (peak,
        edges, prominence, wavelengths) and, with ``intervene``, the loss changes of unrotating
        below the band and of the control.

    Raises:
        InputError: When ``layers`` selects no layer the model has, the corpus cannot be read,
            ``which`` is not "q" or "k", or ``eval_windows`` / ``seed`` is not a valid integer (the
            message names the problem and the fix).
        UnsupportedModelError: When ``verify`` finds that the RoPE reading does not reproduce the
            model's own attention.

    Examples:
        >>> from ropelens.analyses import band_location
        >>> from ropelens.testing import tiny_model
        >>> model = tiny_model("llama")
        >>> location = band_location(
        ...     model, n_ctx=32, max_tokens=128, progress=False, intervene=False
        ... )
        >>> location.which, location.intervention is None
        ('q', True)
        >>> len(location.to_frame()) > 0
        True
    """
    if which not in ("q", "k"):
        raise InputError(f"which must be 'q' (queries) or 'k' (keys), got {which!r}")
    eval_windows = int(
        check_number(
            eval_windows,
            "eval_windows",
            at_least=1,
            integer=True,
            hint=" (windows the loss is measured on)",
        )
    )
    seed = int(check_number(seed, "seed", integer=True))
    usage = frequency_usage(model, corpus, **asdict(run), n_sink=n_sink)
    result = BandLocation(usage=usage, which=which)
    if not intervene:
        return result
    win = Windows.of(model.tokenizer, corpus, run.n_ctx, run.max_tokens, run.text_column)
    toks = win.tokens[: min(eval_windows, win.n_windows)]
    iv = nope_below_band(
        model, result, toks, seed=seed, batch_size=run.batch_size, progress=run.progress
    )
    return replace(result, intervention=iv)
