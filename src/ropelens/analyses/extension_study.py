"""Context-extension study: which scaling method to use for a model, measured at every length up to
a target.

:func:`extension_study` runs the model unmodified and under each context-extension method (PI, NTK,
dynamic NTK, YaRN, Llama 3, LongRoPE, p-RoPE), each set for ``to / native`` where it takes a factor,
and measures

- the mean next-token loss at every length from a short one to ``to``
  (:func:`ropelens.run.evaluate.window_losses` on the same windows for every method);
- passkey retrieval over length × depth
  (:func:`ropelens.analyses.passkey_retrieval.passkey_retrieval`);
- what the method does to every plane at ``to``
  (:func:`ropelens.analyses.extension_planes.extension_planes`);
- what the base predicts (:func:`ropelens.analyses.base_predictions.base_predictions`: Liu et al.'s
  critical dimension and extrapolation limit, Men et al.'s lower bound on the base);
- the attention at every length, on the loss windows
  (:class:`ropelens.analyses.frequency_entropy.AttentionStatsReducer`): the mean entropy of the
  query rows (nats), by layer kind; within the native context, the mean KL and Jensen–Shannon
  divergence of each method's attention rows from the unmodified model's on the same tokens (Zhong
  et al., COLING 2025: an extension method should leave the attention inside the trained context as
  it was); and per head the matrix entropy of the post-RoPE queries' Gram (the spectrum DoPE reads).

Resonance-YaRN (``resonance``), CoPE (``cope``) and FoPE's zeroing (``fope``) run when asked for in
``methods``; the others by default (:data:`DEFAULT_METHODS`).

Each (method, length) loss, passkey and attention measurement is one *cell*, saved atomically as its
own JSON file in ``out/cells`` (attention cells in ``out/cells/attention``) with the settings it was
measured under, so a rerun skips finished cells and a killed run resumes. The page and the tables
are written by :func:`ropelens.report.extension_study.write_study`, the figures drawn by
:mod:`ropelens.plots.extension_study`; the findings (:meth:`ExtensionStudy.findings`, sentences
written from the measured numbers) are written at the end of this module.
"""

from __future__ import annotations

import hashlib
import json
import math
import time
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch
from tqdm.auto import tqdm

from ropelens.analyses.base_predictions import MIN_PREDICTION_LENGTH, base_predictions
from ropelens.analyses.extension_planes import (
    ExtensionPlanes,
    LongRopeSearch,
    extension_planes,
    plane_categories,
)
from ropelens.analyses.frequency_entropy import AttentionStatsReducer
from ropelens.analyses.passkey_retrieval import make_passkey, passkey_prompt, passkey_retrieval
from ropelens.devices import device_of, forward_bytes, require_memory
from ropelens.errors import InputError
from ropelens.loading.models import weights_fingerprint
from ropelens.results.findings import Finding
from ropelens.results.provenance import Provenance, placement
from ropelens.results.result import Result
from ropelens.results.serialize import dump_json
from ropelens.run.capture import batches, capture_qk, stream
from ropelens.run.data import analysis_windows, load_corpus
from ropelens.run.evaluate import Estimate, bootstrap_ci, ci_end, loss_path, window_losses
from ropelens.run.intervene import apply_rope_variant, is_identity
from ropelens.run.stats import paired_bootstrap_ci
from ropelens.run.verify import verification
from ropelens.spec.reading import model_label, rope_spec
from ropelens.spec.surface import running_model
from ropelens.spec.variants import (
    NTK,
    CoPE,
    Default,
    DynamicNTK,
    FoPEZero,
    Linear,
    Llama3,
    LongRoPE,
    PRoPE,
    Resonance,
    RopeVariant,
    YaRN,
    variant_from_dict,
)
from ropelens.validate import check_number

__all__ = [
    "DEFAULT_METHODS",
    "METHODS",
    "ROLES",
    "ExtensionStudy",
    "default_longrope",
    "doubling_lengths",
    "extension_study",
    "extension_variants",
    "held_up_to",
    "plane_roles",
    "ranking",
    "study_findings",
]

# the methods an extension study compares: key → label; "none" is the unmodified model (short names
# are the CLI's and the cell files')
METHODS: dict[str, str] = {
    "none": "unmodified",
    "pi": "PI",
    "ntk": "NTK",
    "dynamic": "dynamic NTK",
    "yarn": "YaRN",
    "llama3": "Llama 3",
    "longrope": "LongRoPE",
    "prope": "p-RoPE",
    "resonance": "Resonance-YaRN",
    "cope": "CoPE",
    "fope": "FoPE zeroing",
}
# the methods a study runs unless others are asked for (Resonance-YaRN, CoPE and FoPE's zeroing when
# asked)
DEFAULT_METHODS: tuple[str, ...] = (
    "none",
    "pi",
    "ntk",
    "dynamic",
    "yarn",
    "llama3",
    "longrope",
    "prope",
)
_FORMAT = 1  # of the cell files


def default_longrope(layer, native: int, target: int) -> LongRoPE:
    """LongRoPE without a search: YaRN's per-plane rescale factors λ_i = θ_i / θ_i^YaRN
    (non-decreasing, ≥ 1), short factors 1, n̂ = 0 and LongRoPE's own attention factor √(1 + ln s /
    ln L₀).

    This is the YaRN member of the initial population of
    :func:`ropelens.analyses.extension_planes.search_longrope_factors`; pass a searched
    :class:`~ropelens.analyses.extension_planes.LongRopeSearch` to measure searched factors instead.
    """
    s = target / native
    lam = (Default().inv_freq(layer).double() / YaRN(s, native).inv_freq(layer).double()).numpy()
    lam = np.round(np.clip(np.sort(lam), 1.0, 2.0 * s), 6)
    return LongRoPE(
        short_factor=(1.0,) * len(lam),
        long_factor=tuple(float(x) for x in lam),
        original_max_position=native,
        factor=s,
    )


def extension_variants(
    layer,
    native: int,
    target: int,
    names: Sequence[str] = DEFAULT_METHODS,
    *,
    p: float = 0.75,
    longrope: Any = None,
) -> dict[str, RopeVariant | None]:
    """The variant of each method name for ``native`` → ``target`` (None for "none").

    Factor-taking methods get s = target / native: ``Linear(s)``, ``NTK(s)``, ``DynamicNTK(s,
    native)``, ``YaRN(s, native)``, ``Llama3(s, 1, 4, native)``; LongRoPE is ``longrope`` (a
    LongRoPE variant or a LongRopeSearch for this native → target) or :func:`default_longrope`;
    p-RoPE is ``PRoPE(p)``; ``resonance`` is Resonance-YaRN ``Resonance(s, native)``, ``cope``
    CoPE's taper ``CoPE()`` (its 20 lowest planes) and ``fope`` FoPE's zeroing ``FoPEZero(native)``.
    """
    unknown = [n for n in names if n not in METHODS]
    if unknown or not names:
        raise InputError(
            f"unknown extension method(s) {unknown or list(names)!r}: choose from "
            f"{','.join(METHODS)}"
        )
    s = target / native
    out: dict[str, RopeVariant | None] = {}
    for n in names:
        if n == "longrope":
            out[n] = _longrope_of(longrope, layer, native, target)
        else:
            out[n] = {
                "none": lambda: None,
                "pi": lambda: Linear(s),
                "ntk": lambda: NTK(s),
                "dynamic": lambda: DynamicNTK(s, native),
                "yarn": lambda: YaRN(s, native),
                "llama3": lambda: Llama3(s, 1.0, 4.0, native),
                "prope": lambda: PRoPE(p),
                "resonance": lambda: Resonance(s, native),
                "cope": lambda: CoPE(),
                "fope": lambda: FoPEZero(native),
            }[n]()
    return out


def _longrope_of(longrope: Any, layer, native: int, target: int) -> LongRoPE:
    if longrope is None:
        return default_longrope(layer, native, target)
    if isinstance(longrope, LongRoPE):
        if len(longrope.long_factor) != layer.n_planes:
            raise InputError(
                f"the LongRoPE variant holds {len(longrope.long_factor)} factors but layer "
                f"{layer.layer} has {layer.n_planes} rotary planes: pass one factor per plane"
            )
        return longrope

    if isinstance(longrope, LongRopeSearch):
        if (longrope.original_ctx, longrope.target_len) != (native, target):
            raise InputError(
                f"the LongRoPE search is for {longrope.original_ctx} → {longrope.target_len} "
                f"tokens, the study for {native} → {target}: search for this target (--to "
                f"{longrope.target_len} --native {longrope.original_ctx} match it) or leave "
                "longrope (--longrope) unset"
            )
        if (
            len(longrope.factors) != layer.n_planes
        ):  # checked before any cell runs, not when LongRoPE's cells come
            raise InputError(
                f"the LongRoPE search (--longrope) holds {len(longrope.factors)} factors but "
                f"layer {layer.layer} has {layer.n_planes} rotary planes: pass factors searched "
                "on this model, one per plane"
            )
        return longrope.variant
    raise InputError(
        f"longrope must be a LongRoPE variant or a LongRopeSearch, got {type(longrope).__name__}"
    )


ROLES = ("kept", "interpolated", "blended", "extrapolated", "stopped", "unrotated")


def plane_roles(view, factor: float) -> tuple[str, ...]:
    """What a method does to each plane: ``kept`` (unchanged, in distribution), ``interpolated`` (θ
    divided by the whole factor or more), ``blended`` (by less: YaRN's ramp, NTK's low-to-high
    spread), ``extrapolated`` (meets angles training never reached), ``stopped`` (θ set to 0:
    p-RoPE) or ``unrotated`` (θ = 0 already)."""
    out = []
    for t0, t1, cat in zip(
        view.inv_freq_before.double().tolist(),
        view.inv_freq_after.double().tolist(),
        view.categories,
        strict=True,
    ):
        if t0 == 0:
            out.append("unrotated")
        elif t1 == 0:
            out.append("stopped")
        elif cat == "extrapolated":
            out.append("extrapolated")
        elif abs(t0 / t1 - 1) <= 1e-6:
            out.append("kept")
        else:
            out.append("interpolated" if t0 / t1 >= factor * (1 - 1e-6) else "blended")
    return tuple(out)


def _identity_view(layer, native: int, target: int):
    """The unmodified model's planes: the same frequencies at the target (categories as
    extension_planes gives them)."""
    inv = layer.inv_freq.float()
    return ExtensionPlanes(
        variant={"variant": "unmodified"},
        layer=layer.layer,
        original_ctx=native,
        target_ctx=target,
        inv_freq_before=inv,
        inv_freq_after=inv.clone(),
        attention_scaling=float(layer.attention_scaling),
        categories=plane_categories(inv, inv, native, target),
    )


def doubling_lengths(start: int, target: int) -> tuple[int, ...]:
    """start, 2·start, 4·start, … below ``target``, then ``target``."""
    out, n = [], start
    while n < target:
        out.append(n)
        n *= 2
    return (*out, target)


# --------------------------------------------------------------------------------------------
# cells
# --------------------------------------------------------------------------------------------
class _Cells:
    """One JSON file per cell under ``folder``, bound to the settings it was measured with."""

    def __init__(self, folder: Path | None):
        self.folder = folder
        self.reused = 0

    def path(self, kind: str, name: str, length: int) -> Path | None:
        return None if self.folder is None else self.folder / f"{kind}-{name}-{length}.json"

    def get(
        self, kind: str, name: str, length: int, config: dict[str, Any]
    ) -> dict[str, Any] | None:
        path = self.path(kind, name, length)
        if path is None or not path.exists():
            return None
        try:
            saved = json.loads(path.read_text())
            if not isinstance(saved, dict) or saved.get("format") != _FORMAT or "cell" not in saved:
                raise ValueError("not a ropelens extension cell")
            found = saved["config"]
        except (ValueError, KeyError, UnicodeDecodeError) as e:
            warnings.warn(
                f"ropelens: cell file {path} is damaged ({e}); measuring that cell again",
                stacklevel=3,
            )
            return None
        if found != config:
            diff = sorted(k for k in {*found, *config} if found.get(k) != config.get(k))
            raise InputError(
                f"{path} holds a cell measured with other settings ({', '.join(diff)} differ): "
                "pass another output folder or delete that one to start over"
            )
        self.reused += 1
        return saved["cell"]

    def put(
        self, kind: str, name: str, length: int, config: dict[str, Any], cell: dict[str, Any]
    ) -> None:
        path = self.path(kind, name, length)
        if path is not None:
            dump_json(path, {"format": _FORMAT, "config": config, "cell": cell})


def _tokens_sha(tokens: torch.Tensor) -> str:
    return hashlib.sha256(tokens.long().numpy().tobytes()).hexdigest()[:16]


def _prompt_fits(tokenizer, length: int, depth: float = 0.5, passkey: str = "12345") -> bool:
    try:
        passkey_prompt(tokenizer, length, depth, passkey)
    except InputError:
        return False
    return True


def _check_passkey_lengths(
    model, lengths: Sequence[int], depths: Sequence[float], seed: int
) -> None:
    """InputError, before anything runs, when a passkey prompt cannot fit the shortest of
    ``lengths`` (its fixed parts alone are longer) or the longest would not fit in memory; each
    names ``--passkey-lengths``."""
    # memory first: building a prompt of an impossible length would itself take the machine
    require_memory(
        forward_bytes(model, max(lengths)),
        f"a passkey prompt of {max(lengths):,} tokens",
        "pass shorter --passkey-lengths",
        device_of(model),
    )
    # the fixed parts (task line, needle, question) set the shortest prompt, so a prompt that fits a
    # length fits every longer one: a long shortest length is tried at 4,096 tokens first (cheap),
    # and itself only if that fails
    shortest = min(lengths)
    for d in depths or (0.5,):
        try:
            if shortest > 4096 and _prompt_fits(model.tokenizer, 4096, d, make_passkey(seed, 0)):
                continue
            passkey_prompt(model.tokenizer, shortest, d, make_passkey(seed, 0))
        except InputError as e:
            raise InputError(
                f"--passkey-lengths: passkey {e} (or pass --passkey-lengths none to skip passkey; "
                "passkey_lengths=[] in Python)"
            ) from None


# --------------------------------------------------------------------------------------------
# the study
# --------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class _StudyPlan:
    """What every cell of one study is measured under: model, methods, lengths and windows."""

    model: Any
    spec: Any
    native: int
    variants: dict[str, RopeVariant | None]
    lengths: tuple[int, ...]
    passkey_lengths: tuple[int, ...]
    depths: tuple[float, ...]
    windows: dict[int, tuple[torch.Tensor, str, str | None]]
    n_windows: int
    n_trials: int
    seed: int
    batch_size: int
    base_config: dict[str, Any]


def _check_contexts(
    spec, to: int, native: int | None, lengths: Sequence[int] | None, start: int | None
) -> tuple[int, int, tuple[int, ...]]:
    """The checked target, native context and sorted distinct loss lengths (doubling by default)."""
    to = check_number(to, "to", at_least=2, integer=True, hint=" (the target context in tokens)")
    native = (
        spec.n_ctx if native is None else check_number(native, "native", at_least=2, integer=True)
    )
    if not native:
        raise InputError("the model records no trained context length: pass native=N (--native N)")
    if to <= native:
        raise InputError(
            f"the target {to} must exceed the native context {native}: extension studies "
            f"lengths beyond it, e.g. to={2 * native}"
        )
    if lengths is None:
        lengths = doubling_lengths(max(2, start or native // 4), to)
    checked = {
        check_number(
            length,
            "each length",
            at_least=2,
            at_most=to,
            integer=True,
            hint=f" (a context length up to the target {to})",
        )
        for length in lengths
    }
    return to, native, tuple(sorted(checked))


def _check_given_passkey_lengths(passkey_lengths: Sequence[int]) -> tuple[int, ...]:
    """The given passkey lengths, checked, distinct and sorted."""
    checked = {
        check_number(
            length,
            "each passkey length",
            at_least=2,
            integer=True,
            hint=" (--passkey-lengths: prompt lengths in tokens)",
        )
        for length in passkey_lengths
    }
    return tuple(sorted(checked))


def _cut_windows(
    tokenizer, corpus: Any, lengths: Sequence[int], n_windows: int
) -> dict[int, tuple[torch.Tensor, str, str | None]]:
    """Per length, its ``n_windows`` windows of ``corpus`` with the corpus's name and SHA-256."""
    windows: dict[int, tuple[torch.Tensor, str, str | None]] = {}
    for length in lengths:
        tokens, corpus_name, corpus_sha = analysis_windows(
            tokenizer, corpus, length, n_windows * length
        )
        if isinstance(corpus, torch.Tensor):  # ready windows: each length reads their first tokens
            if tokens.shape[1] < length:
                raise InputError(
                    f"the token tensor's windows hold {tokens.shape[1]} tokens, fewer than the "
                    f"length {length}: pass windows of at least {max(lengths)} tokens, or lower "
                    "to= / lengths="
                )
            tokens = tokens[:, :length]
        if tokens.shape[0] < n_windows:
            raise InputError(
                f"the corpus holds {tokens.shape[0]} window(s) of {length} tokens, fewer than "
                f"n_windows={n_windows}: lower --windows or --to, or pass a larger corpus"
            )
        windows[length] = (tokens, corpus_name, corpus_sha)
    return windows


def _fitting_passkey_lengths(tokenizer, lengths: Sequence[int]) -> tuple[int, ...]:
    """The lengths at which a passkey prompt fits (one that fits 4,096 tokens fits any longer)."""
    return tuple(
        length
        for length in lengths
        if (length > 4096 and _prompt_fits(tokenizer, 4096)) or _prompt_fits(tokenizer, length)
    )


def _plane_rows(
    spec, variants: dict[str, RopeVariant | None], native: int, to: int
) -> list[dict[str, Any]]:
    """Per layer kind and method, what the method does to every plane at the target, and roles."""
    planes = []
    for kind, layer_indices in spec.rotary_kinds.items():
        for name, variant in variants.items():
            layer = spec[layer_indices[0]]
            view = (
                _identity_view(layer, native, to)
                if variant is None
                else extension_planes(layer, variant, native, to)
            )
            planes.append(
                {
                    "kind": kind,
                    "method": name,
                    **view.to_dict(),
                    "roles": list(plane_roles(view, to / native)),
                }
            )
    return planes


@dataclass(frozen=True)
class _StudySettings:
    """The checked keyword settings of one study, passed from its checks to its steps."""

    target: int
    native: int
    lengths: tuple[int, ...]
    # per method, its variant (None: the unmodified model), the unmodified model first
    variants: dict[str, RopeVariant | None]
    # None: every loss length a passkey prompt fits (found once the windows are cut)
    passkey_lengths: tuple[int, ...] | None
    depths: tuple[float, ...]
    n_windows: int
    n_trials: int
    seed: int
    p: float
    tolerance: float
    corpus: Any


@dataclass(frozen=True)
class _RunOptions:
    """How a study's cells are run, kept and shown: none of them changes a measured number."""

    batch_size: int
    out: str | Path | None
    progress: bool
    verify: bool
    attention: bool


def extension_study(
    model,
    to: int,
    *,
    native: int | None = None,
    lengths: Sequence[int] | None = None,
    start: int | None = None,
    methods: Sequence[str] = DEFAULT_METHODS,
    n_windows: int = 2,
    corpus: Any = None,
    passkey_lengths: Sequence[int] | None = None,
    depths: Sequence[float] = (0.1, 0.5, 0.9),
    n_trials: int = 1,
    seed: int = 0,
    p: float = 0.75,
    longrope: Any = None,
    tolerance: float = 0.1,
    batch_size: int = 1,
    out: str | Path | None = None,
    progress: bool = True,
    verify: bool = True,
    attention: bool = True,
    text_column: str = "text",
) -> ExtensionStudy:
    """Loss by length, passkey retrieval, per-plane effect and base predictions of each method.

    Runs the model unmodified and under each context-extension method (PI, NTK, dynamic NTK,
    YaRN, Llama 3, LongRoPE, p-RoPE by default; Resonance-YaRN, CoPE and FoPE's zeroing when
    asked), each set for ``to / native`` where it takes a factor. Every method's loss at a length
    is measured on the same windows, so differences between methods are paired. With ``out``,
    every cell is saved in ``out/cells`` as it finishes, and cells already there (same settings)
    are read instead of measured, so a killed run resumes. The attention measurement (Zhong et al.,
    COLING 2025: an extension method should leave the attention inside the trained context as it
    was) holds the unmodified model's post-RoPE queries and keys of every layer for the windows of
    one length at a time (n_windows × length × layers × (heads + KV heads) × head_dim floats).

    Args:
        model: A loaded model with a tokenizer (``ropelens.load_model()``, a tiny test model).
        to (int): The target context length, in tokens (> ``native``).
        native (int | None): The trained context length; None for the model's.
        lengths (Sequence[int] | None): Loss lengths; None doubles from ``start`` up to ``to``.
        start (int | None): The first doubling length; None for ``native / 4`` (at least 2).
        methods (Sequence[str]): Keys of :data:`METHODS` (default :data:`DEFAULT_METHODS`).
        n_windows (int): Windows of ``corpus`` per length (default 2).
        corpus: A corpus name, path or ``Corpus``; None for the embedded English text. A
            ``[n_windows, n_ctx]`` token tensor is also taken: each length measures the first
            ``length`` tokens of its rows, so ``n_ctx`` must reach the longest length.
        passkey_lengths (Sequence[int] | None): Passkey lengths; None for every loss length a
            passkey prompt fits; an empty list skips passkey retrieval.
        depths (Sequence[float]): Passkey depths in [0, 1] (default 0.1, 0.5, 0.9).
        n_trials (int): Passkey trials per (length, depth).
        seed (int): Seed of the passkeys.
        p (float): The fraction of frequencies p-RoPE keeps (default 0.75).
        longrope: LongRoPE's factors: a :class:`LongRopeSearch`, a path to its file, or None for
            the default factors.
        tolerance (float): The loss rise (nats) the findings still call keeping the loss
            (default 0.1).
        batch_size (int): Windows per forward pass.
        out (str | Path | None): A folder to save (and resume) cells in; None keeps them in
            memory.
        progress (bool): Show progress bars.
        verify (bool): Check the RoPE reading against the model's own attention first.
        attention (bool): Also measure, per method and length, the attention entropy, the KL and
            JS divergence from the unmodified model's attention (lengths within ``native``) and
            the heads' matrix entropy, on the loss windows (default True).
        text_column (str): The text column of a table or dataset corpus.

    Returns:
        ExtensionStudy: Every cell, the per-plane view, the base's predictions and findings.

    Raises:
        InputError: When the model has no tokenizer, ``to`` does not exceed ``native``, a method
            is unknown, a number is out of range, or a given passkey prompt cannot fit.

    Examples:
        >>> from ropelens.analyses import extension_study
        >>> from ropelens.testing import tiny_model
        >>> texts = ["The quick brown fox jumps over the lazy dog. " * 4]  # or None: English
        >>> study = extension_study(
        ...     tiny_model("llama"), 64, native=32, lengths=[32, 64], methods=["none", "pi"],
        ...     corpus=texts, n_windows=1, passkey_lengths=[], attention=False, progress=False,
        ... )
        >>> study.native, study.target, study.lengths
        (32, 64, (32, 64))
        >>> frame = study.planes_frame()  # per plane at the target: PI interpolates every one
        >>> sorted(set(frame[frame["method"] == "pi"]["category"]))
        ['interpolated']
        >>> study.findings()[0].text
        'For 32 → 64 tokens ...'
    """
    model = running_model(model)  # an nnsight model: the HF model it wraps
    if getattr(model, "tokenizer", None) is None:
        raise InputError(
            f"{type(model).__name__} has no .tokenizer: pass a model from ropelens.load_model"
        )
    spec = rope_spec(model)
    settings = _check_settings(
        model,
        spec,
        to,
        native=native,
        lengths=lengths,
        start=start,
        methods=methods,
        n_windows=n_windows,
        corpus=corpus
        if isinstance(corpus, torch.Tensor)
        else load_corpus(corpus, text_column=text_column),
        passkey_lengths=passkey_lengths,
        depths=depths,
        n_trials=n_trials,
        seed=seed,
        p=p,
        longrope=longrope,
        tolerance=tolerance,
    )
    options = _RunOptions(batch_size, out, progress, verify, attention)
    return _run_study(model, spec, settings, options)


def _check_settings(
    model,
    spec,
    to: int,
    *,
    native: int | None,
    lengths: Sequence[int] | None,
    start: int | None,
    methods: Sequence[str],
    n_windows: int,
    corpus: Any,
    passkey_lengths: Sequence[int] | None,
    depths: Sequence[float],
    n_trials: int,
    seed: int,
    p: float,
    longrope: Any,
    tolerance: float,
) -> _StudySettings:
    """The study's settings, checked in this order before any window is cut or cell run."""
    to, native, lengths = _check_contexts(spec, to, native, lengths, start)
    n_windows = check_number(n_windows, "n_windows", at_least=1, integer=True)
    tolerance = check_number(tolerance, "tolerance", at_least=0)
    n_trials = check_number(n_trials, "n_trials", at_least=1, integer=True)
    depths = tuple(check_number(depth, "each depth", at_least=0, at_most=1) for depth in depths)
    methods = sorted(
        dict.fromkeys(methods),
        key=lambda name: list(METHODS).index(name) if name in METHODS else -1,
    )
    # the unmodified model first: methods that rotate as it does at a length reuse its cells
    first_rotary_layer = spec[spec.layer_indices()[0]]
    variants = extension_variants(first_rotary_layer, native, to, methods, p=p, longrope=longrope)
    if passkey_lengths is not None:
        # given ones are checked now, before the loss phase a prompt that cannot fit follows
        passkey_lengths = _check_given_passkey_lengths(passkey_lengths)
        if passkey_lengths:
            _check_passkey_lengths(model, passkey_lengths, depths, seed)
    return _StudySettings(
        target=to,
        native=native,
        lengths=lengths,
        variants=variants,
        passkey_lengths=passkey_lengths,
        depths=depths,
        n_windows=n_windows,
        n_trials=n_trials,
        seed=seed,
        p=p,
        tolerance=tolerance,
        corpus=corpus,
    )


def _run_study(model, spec, settings: _StudySettings, options: _RunOptions) -> ExtensionStudy:
    """Cut the windows, compute what needs no model run, then measure (or read back) every cell."""
    started = time.perf_counter()
    # cut first: a target the corpus cannot fill fails before anything runs
    windows = _cut_windows(model.tokenizer, settings.corpus, settings.lengths, settings.n_windows)
    passkey_lengths = _resolve_passkey_lengths(model.tokenizer, settings)
    # the per-plane view and the base's predictions need no model run: computed now, so what they
    # refuse (a target past the longest certified base bound, say) fails before any cell is measured
    planes = _plane_rows(spec, settings.variants, settings.native, settings.target)
    # the findings speak of the target; lengths too short for Liu's formulas (at most 2π tokens)
    # have no prediction
    predicted_lengths = {*settings.lengths, settings.native, settings.target}
    predictions = base_predictions(
        spec,
        sorted(length for length in predicted_lengths if length >= MIN_PREDICTION_LENGTH),
        train_ctx=settings.native,
    )
    # the variants rebuild the spec's rotation: prove it first
    verified = verification(model, spec, verify=options.verify)
    plan = _study_plan(model, spec, settings, windows, passkey_lengths, options.batch_size)
    cells = _Cells(None if options.out is None else Path(options.out) / "cells")
    attention_store = _Cells(None if cells.folder is None else cells.folder / "attention")
    finished = _run_cells(
        plan, cells, attention_store, attention=options.attention, progress=options.progress
    )
    return _study_result(
        plan,
        finished,
        planes=planes,
        predictions=predictions,
        settings=_settings_record(
            model, plan, settings, options, verified, (cells, attention_store)
        ),
        model_name=model_label(model),
        started=started,
        placed=placement(model),
    )


def _resolve_passkey_lengths(tokenizer, settings: _StudySettings) -> tuple[int, ...]:
    """The passkey lengths, sorted: the given ones, or every loss length a prompt fits."""
    passkey_lengths = settings.passkey_lengths
    if passkey_lengths is None:
        # every length a prompt fits (after the cut: no prompt of an impossible length is built)
        passkey_lengths = _fitting_passkey_lengths(tokenizer, settings.lengths)
    passkey_lengths = tuple(sorted(passkey_lengths))
    if passkey_lengths and not settings.depths:
        raise InputError(
            "depths is empty: pass passkey depths, e.g. (0.1, 0.5, 0.9), or no passkey lengths"
        )
    return passkey_lengths


def _study_plan(
    model,
    spec,
    settings: _StudySettings,
    windows: dict[int, tuple[torch.Tensor, str, str | None]],
    passkey_lengths: tuple[int, ...],
    batch_size: int,
) -> _StudyPlan:
    """What every cell is measured under, and the model, weights and contexts each cell names."""
    return _StudyPlan(
        model=model,
        spec=spec,
        native=settings.native,
        variants=settings.variants,
        lengths=settings.lengths,
        passkey_lengths=passkey_lengths,
        depths=settings.depths,
        windows=windows,
        n_windows=settings.n_windows,
        n_trials=settings.n_trials,
        seed=settings.seed,
        batch_size=batch_size,
        base_config={
            "model": model_label(model),
            "weights": weights_fingerprint(model)["weights_sha256"],
            "native": settings.native,
            "target": settings.target,
        },
    )


def _settings_record(
    model,
    plan: _StudyPlan,
    settings: _StudySettings,
    options: _RunOptions,
    verified: Any,
    stores: tuple[_Cells, _Cells],
) -> dict[str, Any]:
    """The settings the study saves in its provenance: what it measured, how, and what it reused."""
    cells, attention_store = stores
    return {
        "native": settings.native,
        "target": settings.target,
        "lengths": list(settings.lengths),
        "passkey_lengths": list(plan.passkey_lengths),
        "depths": list(settings.depths),
        "n_trials": settings.n_trials,
        "seed": settings.seed,
        "p": settings.p,
        "tolerance": settings.tolerance,
        "weights_sha256": plan.base_config["weights"],
        "dtype": str(next(model.parameters()).dtype).removeprefix("torch."),
        "forward": loss_path(model),
        "cells_reused": cells.reused,
        "attention": bool(options.attention),
        "attention_cells_reused": attention_store.reused,
        "out": None if options.out is None else str(options.out),
        "verification": verified.to_dict(),
    }


def _study_result(
    plan: _StudyPlan,
    finished: tuple[CellsByKey, CellsByKey, CellsByKey],
    *,
    planes: list[dict[str, Any]],
    predictions: Any,
    settings: dict[str, Any],
    model_name: str,
    started: float,
    placed: dict[str, str | None] | None = None,
) -> ExtensionStudy:
    """The study from its measured cells, per-plane views, predictions and settings."""
    loss_cells, passkey_cells, attention_cells = finished
    first_windows = plan.windows[plan.lengths[0]]
    provenance = Provenance(
        model=model_name,
        corpus=first_windows[1],
        corpus_sha256=first_windows[2],
        n_windows=plan.n_windows,
        n_ctx=settings["target"],
        seconds=time.perf_counter() - started,
        config=settings,
        **(placed or {}),
    )
    return ExtensionStudy(
        native=plan.native,
        target=settings["target"],
        lengths=plan.lengths,
        passkey_lengths=plan.passkey_lengths,
        depths=plan.depths,
        n_trials=plan.n_trials,
        tolerance=float(settings["tolerance"]),
        variants={
            name: (None if variant is None else variant.to_dict())
            for name, variant in plan.variants.items()
        },
        loss_cells=_loss_rows(loss_cells, plan.seed),
        passkey_cells=tuple(
            {
                "method": name,
                "length": length,
                "trials": cell["trials"],
                "same_as": cell.get("same_as"),
            }
            for (name, length), cell in passkey_cells.items()
        ),
        planes=tuple(planes),
        predictions=predictions.to_dict(),
        provenance=provenance,
        attention_cells=tuple(
            {
                "method": name,
                "length": length,
                "heads": cell["heads"],
                "same_as": cell.get("same_as"),
            }
            for (name, length), cell in attention_cells.items()
        ),
    )


def _loss_rows(
    loss_cells: dict[tuple[str, int], dict[str, Any]], seed: int
) -> tuple[dict[str, Any], ...]:
    """One row per (method, length): the per-window losses and their bootstrap estimate."""
    rows = []
    for (name, length), cell in loss_cells.items():
        estimate = cell.get("estimate") or bootstrap_ci(cell["losses"], seed=seed).to_dict()
        rows.append(
            {
                "method": name,
                "length": length,
                "losses": cell["losses"],
                "estimate": estimate,
                "same_as": cell.get("same_as"),
            }
        )
    return tuple(rows)


CellsByKey = dict[tuple[str, int], dict[str, Any]]


def _run_cells(
    plan: _StudyPlan, cells: _Cells, attention_store: _Cells, *, attention: bool, progress: bool
) -> tuple[CellsByKey, CellsByKey, CellsByKey]:
    """Measure (or read back) every loss, passkey and attention cell, per (method, length)."""
    jobs = [("loss", name, length) for name in plan.variants for length in plan.lengths]
    jobs += [("passkey", name, length) for name in plan.variants for length in plan.passkey_lengths]
    # attention length by length: one length's reference (the unmodified model's queries and
    # keys) at a time
    jobs += [
        ("attention", name, length)
        for length in (plan.lengths if attention else ())
        for name in plan.variants
    ]
    finished: dict[str, CellsByKey] = {"loss": {}, "passkey": {}, "attention": {}}
    reference: dict[str, Any] = {}
    bar = tqdm(jobs, desc="extend", unit="cell", disable=not progress)
    for kind, name, length in bar:
        variant = plan.variants[name]
        bar.set_postfix_str(f"{kind} {METHODS[name]} {length}")
        variant_config = None if variant is None else variant.to_dict()
        if kind == "attention":
            finished[kind][(name, length)] = _attention_cell(
                plan.model,
                plan.spec,
                name,
                variant,
                length,
                plan.native,
                plan.windows[length][0],
                plan.base_config,
                variant_config,
                attention_store,
                finished[kind],
                reference,
                plan.batch_size,
                is_identity,
            )
        else:
            finished[kind][(name, length)] = _loss_or_passkey_cell(
                plan, cells, kind, name, length, variant_config, finished[kind]
            )
    bar.close()
    return finished["loss"], finished["passkey"], finished["attention"]


def _cell_config(
    plan: _StudyPlan, kind: str, length: int, variant_config: dict[str, Any] | None
) -> dict[str, Any]:
    """The settings a loss or passkey cell is saved under (a saved cell is reused if they match)."""
    if kind == "loss":
        tokens, corpus_name, corpus_sha = plan.windows[length]
        return {
            **plan.base_config,
            "kind": "loss",
            "variant": variant_config,
            "length": length,
            "n_windows": plan.n_windows,
            "corpus": corpus_name,
            "corpus_sha256": corpus_sha,
            "tokens_sha256": _tokens_sha(tokens),
        }
    return {
        **plan.base_config,
        "kind": "passkey",
        "variant": variant_config,
        "length": length,
        "depths": list(plan.depths),
        "n_trials": plan.n_trials,
        "seed": plan.seed,
    }


def _loss_or_passkey_cell(
    plan: _StudyPlan,
    cells: _Cells,
    kind: str,
    name: str,
    length: int,
    variant_config: dict[str, Any] | None,
    finished: CellsByKey,
) -> dict[str, Any]:
    """One loss or passkey cell: read back, copied from the unmodified model's, or measured."""
    config = _cell_config(plan, kind, length, variant_config)
    cell = cells.get(kind, name, length, config)
    if cell is not None:
        return cell
    variant = plan.variants[name]
    # A variant that rotates exactly as the model at this length (dynamic NTK within the native
    # context) gives the unmodified model's numbers: copy them instead of running again.
    n_positions = length if kind == "loss" else length + 8
    rotary_layers = plan.spec.layer_indices()
    if (
        variant is not None
        and ("none", length) in finished
        and is_identity(plan.spec, variant, rotary_layers, n_positions)
    ):
        cell = {**finished[("none", length)], "same_as": "none"}
    else:
        started = time.perf_counter()
        cell = _measure(
            plan.model,
            kind,
            variant,
            length,
            plan.windows,
            plan.depths,
            plan.n_trials,
            plan.seed,
            plan.batch_size,
            apply_rope_variant,
            loss_path,
        )
        cell["seconds"] = time.perf_counter() - started
    cells.put(kind, name, length, config, cell)
    return cell


def _attention_cell(
    model,
    spec,
    name,
    v,
    L,
    native,
    tokens,
    base_cfg,
    vcfg,
    cells,
    done,
    reference,
    batch_size,
    is_identity,
) -> dict[str, Any]:
    """One attention cell: per (layer, head) the mean row entropy, the divergence from the
    unmodified model within the native context, and the matrix entropy of the query Gram
    (:class:`AttentionStatsReducer`)."""
    layers = spec.attention_layers
    diverge = native >= L
    cfg = {
        **base_cfg,
        "kind": "attention",
        "variant": vcfg,
        "length": L,
        "n_windows": int(tokens.shape[0]),
        "tokens_sha256": _tokens_sha(tokens),
        "divergence": diverge,
    }
    cell = cells.get("attention", name, L, cfg)
    if cell is not None:
        return cell
    if v is not None and ("none", L) in done and is_identity(spec, v, spec.rotary_layers, L):
        cell = {**done[("none", L)], "same_as": "none"}
    else:
        if (
            diverge and reference.get("length") != L
        ):  # the unmodified model's queries and keys on these windows
            reference.clear()
            reference.update(
                length=L,
                acts=capture_qk(
                    model, tokens, layers=layers, which=("q_post", "k_post"), batch_size=batch_size
                ),
            )
        t1 = time.perf_counter()
        cell = _measure_attention(
            model, spec, v, tokens, layers, reference["acts"] if diverge else None, batch_size
        )
        cell["seconds"] = time.perf_counter() - t1
    cells.put("attention", name, L, cfg, cell)
    return cell


def _measure_attention(model, spec, v, tokens, layers, reference, batch_size) -> dict[str, Any]:
    """The per-head attention statistics of ``v`` (None: the unmodified model) on ``tokens``."""
    import contextlib

    red = AttentionStatsReducer(spec, layers, reference=reference)
    with contextlib.nullcontext() if v is None else apply_rope_variant(model, v):
        stream(model, batches(tokens, batch_size), [red], layers=layers, progress=False)
    return {"heads": red.table()}


def _measure(
    model, kind, v, L, windows, depths, n_trials, seed, batch_size, apply_rope_variant, loss_path
):
    """One cell: the per-window losses, or the passkey trials, of ``v`` at ``L``."""
    import contextlib

    if kind == "passkey":
        r = passkey_retrieval(
            model, [L], depths, n_trials=n_trials, seed=seed, variant=v, progress=False
        )
        return {
            "trials": [t.to_dict() for t in r.trials],
            "forward": r.provenance.config.get("forward"),
        }
    ctx = contextlib.nullcontext() if v is None else apply_rope_variant(model, v)
    with ctx:
        losses = window_losses(model, windows[L][0], batch_size=batch_size, progress=False)
        forward = loss_path(model)
    return {
        "losses": [float(x) for x in losses],
        "estimate": bootstrap_ci(losses).to_dict(),
        "forward": forward,
    }


# --------------------------------------------------------------------------------------------
# result
# --------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class ExtensionStudy(Result, derived=("findings",)):
    """Every method's loss by length, passkey grid and per-plane effect, and the base's
    predictions.

    Built by :func:`extension_study`: which context-extension method to use for a model. Each
    (method, length) measurement is a *cell*; the tables (:meth:`loss_frame`,
    :meth:`passkey_frame`, :meth:`attention_frame`, :meth:`planes_frame`,
    :meth:`predictors_frame`) and :meth:`findings` (sentences written from the measured numbers,
    with paired bootstrap CIs) read them.

    Attributes:
        native (int): The trained context length, in tokens.
        target (int): The context length every method is set to extend to.
        lengths (tuple[int, ...]): The lengths the loss was measured at.
        passkey_lengths (tuple[int, ...]): The lengths passkey retrieval ran at (empty: skipped).
        depths (tuple[float, ...]): Passkey depths, as fractions of the prompt (0 = start).
        n_trials (int): Passkey trials per (length, depth).
        tolerance (float): The loss rise (nats) the findings still call keeping the loss.
        variants (dict[str, dict[str, Any] | None]): Method name (a key of :data:`METHODS`) →
            ``RopeVariant.to_dict()``; None for ``"none"``, the unmodified model.
        loss_cells (tuple[dict[str, Any], ...]): Per (method, length): ``method``, ``length``,
            ``losses`` (each window's mean loss) and ``estimate`` (a ``LossEstimate`` dict).
        passkey_cells (tuple[dict[str, Any], ...]): Per (method, length): ``method``, ``length``
            and ``trials`` (``PasskeyTrial`` dicts).
        planes (tuple[dict[str, Any], ...]): Per (layer kind, method): ``kind``, ``method``,
            ``roles`` and the fields of its :class:`ExtensionPlanes` at the target.
        predictions (dict[str, Any]): ``BasePredictions.to_dict()`` at the lengths, native and
            target.
        provenance (Provenance): Model, corpus, windows, settings and verification.
        attention_cells (tuple[dict[str, Any], ...]): Per (method, length): ``method``,
            ``length``, ``heads`` (one row per layer × head: entropy, KL, JS, matrix entropy) and
            ``same_as``; empty when run with ``attention=False``.

    Examples:
        >>> from ropelens.analyses import extension_study
        >>> from ropelens.testing import tiny_model
        >>> texts = ["The quick brown fox jumps over the lazy dog. " * 4]  # or None: English
        >>> study = extension_study(
        ...     tiny_model("llama"), 64, native=32, lengths=[32, 64], methods=["none", "pi"],
        ...     corpus=texts, n_windows=1, passkey_lengths=[], attention=False, progress=False,
        ... )
        >>> study.methods, study.variant("pi")
        (('none', 'pi'), Linear(factor=2.0))
        >>> study.loss_frame()[["method", "length"]].values.tolist()
        [['none', 32], ['none', 64], ['pi', 32], ['pi', 64]]
        >>> study.in_distribution_limit("pi"), study.in_distribution_limit("none")  # tokens
        (64.0, 32.0)
    """

    native: int
    target: int
    lengths: tuple[int, ...]
    passkey_lengths: tuple[int, ...]
    depths: tuple[float, ...]
    n_trials: int
    tolerance: float
    variants: dict[
        str, dict[str, Any] | None
    ]  # method name → RopeVariant.to_dict() (None: unmodified)
    loss_cells: tuple[
        dict[str, Any], ...
    ]  # method, length, losses (per window), estimate (LossEstimate dict)
    passkey_cells: tuple[dict[str, Any], ...]  # method, length, trials (PasskeyTrial dicts)
    planes: tuple[dict[str, Any], ...]  # kind, method and ExtensionPlanes.to_dict() at the target
    predictions: dict[str, Any]  # BasePredictions.to_dict()
    provenance: Provenance
    # method, length, heads (one AttentionStatsReducer.table() row per layer × head), same_as
    attention_cells: tuple[dict[str, Any], ...] = ()

    @property
    def methods(self) -> tuple[str, ...]:
        """The methods measured, the unmodified model (``"none"``) first."""
        return tuple(self.variants)

    def variant(self, method: str) -> RopeVariant | None:
        """The RoPE variant a method ran under (None: the unmodified model)."""
        d = self.variants[method]
        return None if d is None else variant_from_dict(d)

    # ---------------------------------------------------------------- tables
    def loss_frame(self) -> pd.DataFrame:
        """One row per (method, length): mean loss and perplexity with their bootstrap CIs over
        windows."""
        rows = []
        for c in self.loss_cells:
            e = c["estimate"]
            rows.append(
                {
                    "method": c["method"],
                    "label": METHODS.get(c["method"], c["method"]),
                    "length": c["length"],
                    "n_windows": e["n_windows"],
                    "loss": e["loss"]["mean"],
                    "loss_lo": ci_end(e["loss"]["lo"]),
                    "loss_hi": ci_end(e["loss"]["hi"]),
                    "perplexity": e["perplexity"]["mean"],
                    "same_as": c.get("same_as"),
                }
            )
        df = pd.DataFrame(rows)
        if not df.empty:
            first = df.loc[df.groupby("method")["length"].idxmin()].set_index("method")["loss"]
            df["delta_vs_shortest"] = df["loss"] - df["method"].map(first)
        return df

    def attention_heads_frame(self) -> pd.DataFrame:
        """One row per (method, length, layer, head): query rows, mean row entropy (nats), mean KL
        and JS divergence from the unmodified model's attention (NaN past the native context) and
        the query Gram's matrix entropy."""
        rows = [
            {
                "method": c["method"],
                "label": METHODS.get(c["method"], c["method"]),
                "length": c["length"],
                **h,
            }
            for c in self.attention_cells
            for h in c["heads"]
        ]
        return pd.DataFrame(rows).astype({"kl": float, "js": float}) if rows else pd.DataFrame()

    def attention_frame(self) -> pd.DataFrame:
        """One row per (method, length, layer kind): the mean over the kind's layers, heads and
        query rows of the row entropy (nats), the KL(method ‖ unmodified) and Jensen–Shannon
        divergences (nats; NaN past the native context), and the mean matrix entropy of the heads'
        query Gram."""
        df = self.attention_heads_frame()
        if df.empty:
            return df
        same = {(c["method"], c["length"]): c.get("same_as") for c in self.attention_cells}
        out = []
        for (method, length, kind), g in df.groupby(["method", "length", "kind"], sort=False):
            w = g["rows"] / g["rows"].sum()
            out.append(
                {
                    "method": method,
                    "label": METHODS.get(method, method),
                    "length": length,
                    "kind": kind,
                    "n_heads": len(g),
                    "entropy": float((g["entropy"] * w).sum()),
                    "kl": float((g["kl"] * w).sum(min_count=1)),
                    "js": float((g["js"] * w).sum(min_count=1)),
                    "matrix_entropy": float(g["matrix_entropy"].mean()),
                    "same_as": same[(method, length)],
                }
            )
        return pd.DataFrame(out)

    def passkey_frame(self) -> pd.DataFrame:
        """One row per (method, length, depth): trials, correct ones and accuracy."""
        rows = []
        for c in self.passkey_cells:
            for d in self.depths:
                ts = [t for t in c["trials"] if t["depth"] == d]
                rows.append(
                    {
                        "method": c["method"],
                        "label": METHODS.get(c["method"], c["method"]),
                        "length": c["length"],
                        "depth": d,
                        "n_trials": len(ts),
                        "n_correct": sum(bool(t["correct"]) for t in ts),
                        "accuracy": float(np.mean([t["correct"] for t in ts])) if ts else math.nan,
                        "answers": " ".join(str(t["answer"]) for t in ts),
                    }
                )
        return pd.DataFrame(rows)

    def recall(self, method: str, length: int) -> tuple[int, int]:
        """Correct passkeys and trials of ``method`` at ``length`` over every depth."""
        for c in self.passkey_cells:
            if c["method"] == method and c["length"] == length:
                return sum(bool(t["correct"]) for t in c["trials"]), len(c["trials"])
        raise KeyError((method, length))

    def plane_views(self, kind: str | None = None):
        """The :class:`~ropelens.analyses.extension_planes.ExtensionPlanes` of every method for
        layer kind ``kind`` (default: the first)."""
        kind = kind or self.planes[0]["kind"]
        keep = ("kind", "method", "roles")
        return {
            p["method"]: ExtensionPlanes.from_dict({k: v for k, v in p.items() if k not in keep})
            for p in self.planes
            if p["kind"] == kind
        }

    def planes_frame(self) -> pd.DataFrame:
        """One row per (layer kind, method, plane): wavelength before and after, scale and
        category."""
        frames = []
        for kind in dict.fromkeys(p["kind"] for p in self.planes):
            for method, view in self.plane_views(kind).items():
                roles = next(
                    p["roles"] for p in self.planes if p["kind"] == kind and p["method"] == method
                )
                frames.append(
                    view.to_frame().assign(
                        kind=kind, method=method, variant=METHODS[method], role=roles
                    )
                )
        return pd.concat(frames, ignore_index=True)

    def in_distribution_limit(self, method: str, kind: str | None = None) -> float:
        """Longest input whose angles all stay within training: L₀ · min θ_i/θ'_i over planes that
        never completed a turn in L₀ (∞ where there are none or the method stops them rotating)."""
        v = self.plane_views(kind)[method]
        before, after = v.inv_freq_before.double(), v.inv_freq_after.double()
        slow = (before > 0) & (2 * math.pi / before.clamp_min(1e-30) > self.native)
        if not bool(slow.any()):
            return math.inf
        ratio = torch.where(after[slow] > 0, before[slow] / after[slow].clamp_min(1e-30), torch.inf)
        return float(self.native * ratio.min())

    def predictors_frame(self) -> pd.DataFrame:
        """The base's predictions per (rotary layer kind, length) (:class:`BasePredictions`
        rows)."""
        return pd.DataFrame(list(self.predictions["rows"]))

    def to_frame(self) -> pd.DataFrame:
        """The loss table (:meth:`loss_frame`)."""
        return self.loss_frame()

    # ---------------------------------------------------------------- persistence
    # ---------------------------------------------------------------- views
    def findings(self):
        """Sentences written from the measured numbers: the recommended method, each method's
        loss, passkey recall, plane categories and the base's predictions."""
        return study_findings(self)

    def _repr_text(self) -> str:
        return f"ExtensionStudy({self.provenance.model}, {self.native} → {self.target})"


# ---------------------------------------------------------------------------------------- findings
def _n(x: float) -> str:
    """A token count with thousands separators, or ∞."""
    return f"{int(x):,}" if math.isfinite(x) else "∞"


def held_up_to(study: ExtensionStudy, method: str) -> tuple[int, float, int]:
    """The longest length up to which ``method``'s loss stays within ``study.tolerance`` nats of its
    loss at the shortest length (every length between included: the shortest itself when the next
    one breaks it), the largest rise over those lengths, and the shortest length."""
    df = study.loss_frame()
    rows = df[df["method"] == method].sort_values("length")
    first = float(rows["loss"].iloc[0])
    held, rise = int(rows["length"].iloc[0]), 0.0
    for L, loss in zip(rows["length"], rows["loss"], strict=True):
        if loss - first > study.tolerance:
            break
        held, rise = int(L), max(rise, float(loss - first))
    return held, rise, int(rows["length"].iloc[0])


def ranking(study: ExtensionStudy) -> list[dict[str, Any]]:
    """Methods best first: passkey recall at the longest passkey length (more is better), then loss
    at the target (less is better); each with those numbers."""
    df = study.loss_frame()
    at = df[df["length"] == study.target].set_index("method")
    top = max(study.passkey_lengths) if study.passkey_lengths else None
    rows = []
    for m in study.methods:
        if m not in at.index:
            continue
        k, n = study.recall(m, top) if top is not None else (0, 0)
        rows.append(
            {
                "method": m,
                "loss": float(at.loc[m, "loss"]),
                "perplexity": float(at.loc[m, "perplexity"]),
                "recall": k / n if n else math.nan,
                "correct": k,
                "trials": n,
            }
        )
    return sorted(rows, key=lambda r: (-(r["recall"] if r["trials"] else 0.0), r["loss"]))


def _label(method: str) -> str:
    """The method's label in findings (its key when it has none)."""
    return METHODS.get(method, method)


def study_findings(study: ExtensionStudy) -> list[Finding]:
    """Recommendation, loss held per method, passkey recall, planes and the base's predictions."""
    findings = _recommendation_findings(study)
    loss_frame = study.loss_frame()
    findings += [_loss_finding(study, method, loss_frame) for method in study.methods]
    findings += _passkey_findings(study)
    findings += _plane_findings(study)
    findings += _predictor_findings(study)
    return findings


def _paired_values(study: ExtensionStudy, method: str, on: str) -> list[float]:
    """``method``'s per-window losses at the target (``on="loss"``), or its passkey trials at the
    longest passkey length as 1 (right) and 0 (``on="recall"``): one value per shared window or
    prompt, in order."""
    if on == "loss":
        return next(
            [float(x) for x in c["losses"]]
            for c in study.loss_cells
            if c["method"] == method and c["length"] == study.target
        )
    top = max(study.passkey_lengths)
    return next(
        [float(bool(t["correct"])) for t in c["trials"]]
        for c in study.passkey_cells
        if c["method"] == method and c["length"] == top
    )


def lead_over_next(study: ExtensionStudy, rank: list[dict[str, Any]]) -> tuple[str, Estimate]:
    """What puts the first method of ``rank`` ahead of the second, and by how much with its paired
    95% bootstrap CI (windows or prompts resampled as pairs): passkey recall where their recalls
    differ (the first's minus the second's), else the loss at the target (the second's minus the
    first's); positive favours the first. No interval from fewer than two pairs."""
    best, runner = rank[0], rank[1]
    on = "recall" if best["trials"] and best["recall"] != runner["recall"] else "loss"
    a, b = (_paired_values(study, m["method"], on) for m in (best, runner))
    if len(a) != len(b):  # different prompts: nothing to pair, so nothing beyond an interval
        return on, Estimate(float(np.mean(a) - np.mean(b)), math.nan, math.nan)
    ci = paired_bootstrap_ci(a, b) if on == "recall" else paired_bootstrap_ci(b, a)
    return on, ci


def _recommendation_findings(study: ExtensionStudy) -> list[Finding]:
    """The method to use (the best of :func:`ranking`, where it leads the next beyond the paired
    CI of the difference that ranks them; otherwise none) and the three next, with their
    numbers."""
    rank = ranking(study)
    if not rank:
        return []
    target, native = study.target, study.native
    top = max(study.passkey_lengths) if study.passkey_lengths else None
    best = rank[0]
    recall = (
        f" and recalls {best['correct']} of {best['trials']} passkeys at {top:,}"
        if best["trials"]
        else ""
    )
    others = "; ".join(
        f"{_label(row['method'])} {row['loss']:.3f}"
        + (f" ({row['correct']}/{row['trials']})" if row["trials"] else "")
        for row in rank[1:4]
    )
    numbers: dict[str, Any] = {"ranking": rank, "target": target, "passkey_length": top}
    if len(rank) == 1:
        text = f"Only {_label(best['method'])} was measured: there is no method to compare it with."
        return [Finding("recommend", "summary", text, {**numbers, "recommended": None})]
    on, lead = lead_over_next(study, rank)
    numbers |= {"decided_by": on, "lead": lead.to_dict()}
    what = "passkey recall" if on == "recall" else f"loss at {target:,} tokens (nats)"
    margin = f"{lead.mean:+.3g}, 95% CI {lead.interval('+.3g')}"
    if lead.has_interval and lead.lo > 0:
        text = (
            f"For {native:,} → {target:,} tokens use {_label(best['method'])}: at {target:,} "
            f"tokens its loss is {best['loss']:.3f} nats (perplexity {best['perplexity']:.3g})"
            f"{recall}; it leads {_label(rank[1]['method'])} in {what} by {margin}. "
            f"Next: {others}."
        )
        return [Finding("recommend", "summary", text, {**numbers, "recommended": best["method"]})]
    text = (
        f"For {native:,} → {target:,} tokens no method is better beyond its interval: "
        f"{_label(best['method'])} leads {_label(rank[1]['method'])} in {what} by {margin} "
        f"(loss {best['loss']:.3f} nats{recall}). Next: {others}."
    )
    return [Finding("recommend", "summary", text, {**numbers, "recommended": None})]


def _loss_finding(study: ExtensionStudy, method: str, loss_frame: pd.DataFrame) -> Finding:
    """How far ``method`` keeps the loss within the tolerance of its shortest length's."""
    target, label, tolerance = study.target, _label(method), study.tolerance
    held, rise, first = held_up_to(study, method)
    rows = loss_frame[loss_frame["method"] == method]
    at_target = rows[rows["length"] == target]
    loss_target = float(at_target["loss"].iloc[0]) if len(at_target) else math.nan
    loss_short = float(rows[rows["length"] == first]["loss"].iloc[0])
    if held == first and len(study.lengths) > 1:
        text = (
            f"{label} leaves the loss band at once: {loss_short:.3f} nats at {first:,}, more than "
            f"{tolerance:g} nats higher at the next length ({loss_target:.3f} at {target:,})."
        )
    elif held >= target:
        text = (
            f"{label} keeps the loss within {tolerance:g} nats of its {first:,}-token value "
            f"({loss_short:.3f}) up to {target:,} (largest rise {rise:+.3f}; {loss_target:.3f} "
            f"at {target:,})."
        )
    else:
        text = (
            f"{label} keeps the loss within {tolerance:g} nats of its {first:,}-token value "
            f"({loss_short:.3f}) up to {held:,} only; at {target:,} it is {loss_target:.3f} "
            f"({loss_target - loss_short:+.3f})."
        )
    numbers = {
        "method": method,
        "held_up_to": held,
        "largest_rise": rise,
        "loss_short": loss_short,
        "loss_target": loss_target,
        "short": first,
    }
    return Finding(f"loss_{method}", "loss", text, numbers)


def _passkey_findings(study: ExtensionStudy) -> list[Finding]:
    """Every method's passkey recall at the longest passkey length (none without passkey)."""
    if not study.passkey_lengths:
        return []
    top = max(study.passkey_lengths)
    recalls = {method: study.recall(method, top) for method in study.methods}
    shown = ", ".join(
        f"{_label(method)} {correct}/{trials}" for method, (correct, trials) in recalls.items()
    )
    text = f"Passkey recall at {top:,} tokens: {shown}."
    return [Finding("passkey", "passkey", text, recalls | {"length": top})]


def _plane_findings(study: ExtensionStudy) -> list[Finding]:
    """Per method, its planes' roles at the target and how far every angle stays in training,
    for the first layer kind."""
    views = study.planes
    kind = views[0]["kind"] if views else None
    findings = []
    for view in (view for view in views if view["kind"] == kind):
        roles = view["roles"]
        counts = {role: roles.count(role) for role in dict.fromkeys(roles)}
        limit = study.in_distribution_limit(view["method"], kind)
        shown = ", ".join(f"{count} {role}" for role, count in counts.items())
        text = (
            f"{_label(view['method'])} at {study.target:,} ({kind} layers, {len(roles)} planes): "
            f"{shown}; every angle stays within training up to {_n(limit)} tokens."
        )
        numbers = {"counts": counts, "in_distribution_limit": limit, "kind": kind}
        findings.append(Finding(f"planes_{view['method']}", "planes", text, numbers))
    return findings


def _predictor_findings(study: ExtensionStudy) -> list[Finding]:
    """Liu et al.'s critical dimension and Men et al.'s bound on the base, for the first layer
    kind at the target (none when no length has a prediction)."""
    rows = study.predictors_frame()
    if rows.empty:
        return []
    out = []
    kind = rows["kind"].iloc[0]
    r = rows[rows["kind"] == kind]
    at_t = r[r["length"] == study.target].iloc[0]
    t_extra = float(at_t["t_extra"])
    df = study.loss_frame()
    none = (
        df[df["method"] == "none"].set_index("length")["loss"] if "none" in study.methods else None
    )
    measured = ""
    if none is not None and len(none) > 1:
        inside = [n for n in none.index if min(t_extra, study.native) >= n]
        beyond = [n for n in none.index if t_extra < n]
        if inside and beyond:
            a, b = max(inside), min(beyond)
            measured = (
                f"; the unmodified loss goes from {none[a]:.3f} at {a:,} to {none[b]:.3f} at {b:,} "
                f"({none[b] - none[a]:+.3f})"
            )
    out.append(
        Finding(
            "critical_dimension",
            "predictors",
            f"Critical dimension ({kind} layers, base {at_t['base']:.4g}): "
            f"{int(at_t['critical_dimension_train'])} of {int(at_t['rotary_dim'])} rotary dims "
            f"turn within {study.native:,} tokens, so Liu et al.'s extrapolation limit is "
            f"{_n(t_extra)} tokens{measured}.",
            {
                "kind": kind,
                "critical_dimension": int(at_t["critical_dimension_train"]),
                "t_extra": t_extra,
            },
        )
    )
    holds = bool(at_t["men_bound_holds"])
    fails = [int(L) for L, h in zip(r["length"], r["men_bound_holds"], strict=True) if not h]
    out.append(
        Finding(
            "base_bound",
            "predictors",
            f"Men et al.'s lower bound on the base for {study.target:,} tokens is "
            f"{at_t['men_lower_bound']:.4g}; the model's base {at_t['base']:.4g} "
            f"{'satisfies' if holds else 'violates'} it"
            + (f" (violated from {min(fails):,} tokens)" if fails else "")
            + f"; Liu's critical base for tuning at {study.target:,} is "
            f"{at_t['critical_base']:.4g}.",
            {
                "kind": kind,
                "men_lower_bound": float(at_t["men_lower_bound"]),
                "holds": holds,
                "first_violation": min(fails) if fails else None,
                "critical_base": float(at_t["critical_base"]),
            },
        )
    )
    return out
