"""Training trajectories: when the high-norm band, attention sinks, massive values and positional
heads appear.

Oka et al. report that the high-norm frequency band forms early in pretraining; Gu et al. that
attention sinks emerge during training. :func:`trajectory` measures a model's structures at each of
its training checkpoints (directories such as ``ropelens.training.train`` saves, or one hub
repository at several revisions, Pythia's ``step1000`` …) with the existing analyses on a small
token budget, and keeps a few summary numbers per checkpoint in one tidy table (step, analysis,
metric, layer, value):

- ``bands`` (:func:`ropelens.analyses.band_location.band_location` on the per-plane query norms of
  :func:`ropelens.analyses.frequency_usage.frequency_usage`): ``band_peak`` (the plane of largest
  mean norm), ``band_width`` and ``band_prominence`` (peak norm ÷ the median plane's), per layer and
  as the median over layers;
- ``sinks`` (:func:`ropelens.analyses.attention_sinks.attention_sinks`): ``sink_head_share`` (heads
  whose mean attention to position 0 exceeds Gu et al.'s ε) and ``sink_attention`` (mean attention
  to position 0);
- ``massive`` (:func:`ropelens.analyses.massive_values.massive_values`): ``massive_dims`` (query
  dimensions whose norm exceeds 5× their head's mean dimension norm) and ``massive_max_ratio``;
- ``heads`` (:func:`ropelens.analyses.head_taxonomy.head_taxonomy`): ``positional_heads`` and
  ``positional_share``.

Model-wide rows have ``layer`` −1. :meth:`Trajectory.emergence` gives, for each structure, the step
at which it appears (the rule is in its docstring). The figure, ``traj.figure()``, is drawn by
:func:`ropelens.plots.trajectory.trajectory_figure`; the page,
:func:`ropelens.report.trajectory.write_trajectory`.
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd
import torch

from ropelens.analyses.attention_sinks import attention_sinks
from ropelens.analyses.band_location import band_location
from ropelens.analyses.head_taxonomy import head_taxonomy
from ropelens.analyses.massive_values import massive_values
from ropelens.errors import InputError
from ropelens.loading.checkpoints import read_info, step_of
from ropelens.loading.models import load_model, weights_fingerprint
from ropelens.results.findings import Finding
from ropelens.results.provenance import Provenance
from ropelens.results.result import Result
from ropelens.run.data import load_corpus

__all__ = [
    "ANALYSES",
    "STRUCTURES",
    "Checkpoint",
    "Structure",
    "Trajectory",
    "resolve_checkpoints",
    "trajectory",
]

ANALYSES = ("bands", "sinks", "massive", "heads")
COLUMNS = ("step", "checkpoint", "analysis", "metric", "layer", "value")


@dataclass(frozen=True)
class Structure:
    """A structure a trajectory tracks: the model-wide metric that shows it and the level at which
    it counts as there."""

    name: str
    analysis: str
    metric: str
    threshold: float
    meaning: str


STRUCTURES: tuple[Structure, ...] = (
    Structure(
        "high-norm band",
        "bands",
        "band_prominence",
        2.0,
        "the peak plane's mean query norm is at least 2× the median plane's (median over layers)",
    ),
    Structure(
        "attention sinks",
        "sinks",
        "sink_head_share",
        0.25,
        "at least a quarter of all heads pay position 0 more than ε of their attention on average",
    ),
    Structure(
        "massive values",
        "massive",
        "massive_dims",
        1.0,
        "at least one query dimension's norm exceeds 5× its head's mean dimension norm",
    ),
    Structure(
        "positional heads",
        "heads",
        "positional_heads",
        1.0,
        "at least one head puts ≥ τ of its attention on one fixed offset on text and on random "
        "tokens",
    ),
)


@dataclass(frozen=True)
class Checkpoint:
    """One point of a trajectory: the training step and where its weights come from."""

    step: int
    source: str  # a directory, or a hub id
    revision: str | None = None

    @property
    def label(self) -> str:
        return self.source if self.revision is None else f"{self.source}@{self.revision}"


@dataclass(frozen=True)
class Trajectory(Result, derived=("columns",)):
    """Summary numbers of a model's structures at each training checkpoint, and when each appears.

    What :func:`trajectory` returns: one record per (checkpoint, metric, layer), model-wide rows at
    layer −1. :meth:`to_frame` gives the records as a table, :meth:`series` one metric against step,
    :meth:`emergence` the step at which each structure appears (first checkpoint at or above its
    threshold that stays there), and :meth:`figure` draws the metrics against step.

    Attributes:
        records (tuple[tuple[int, str, str, str, int, float], ...]): The rows: step, checkpoint,
            analysis, metric, layer (−1: model-wide) and value.
        checkpoints (tuple[Checkpoint, ...]): The checkpoints measured, in increasing step order.
        analyses (tuple[str, ...]): The analyses run, among :data:`ANALYSES` (``"bands"``,
            ``"sinks"``, ``"massive"``, ``"heads"``).
        structures (tuple[Structure, ...]): The structures tracked, each with the model-wide metric
            that shows it and its threshold (:data:`STRUCTURES`).
        provenance (Provenance): Corpus, token budget, seed, each checkpoint's weights fingerprint
            and the thresholds.
        seconds (tuple[float, ...]): Per checkpoint, the seconds to load and measure it.

    Raises:
        InputError: When an analysis is unknown or the checkpoints' steps are not distinct and
            increasing.

    Examples:
        >>> import tempfile
        >>> from pathlib import Path
        >>> from ropelens.analyses import trajectory
        >>> from ropelens.testing import tiny_model_dir
        >>> root = Path(tempfile.mkdtemp())
        >>> dirs = [tiny_model_dir("llama", root / f"step-{s}", seed=s) for s in (0, 100)]
        >>> traj = trajectory(dirs, analyses=["massive"], n_tokens=128, n_ctx=32)
        >>> traj.steps, sorted(set(traj.to_frame()["metric"]))
        ([0, 100], ['massive_dims', 'massive_max_ratio'])
        >>> traj.series("massive_dims").index.tolist()
        [0, 100]
        >>> traj.emergence()["structure"].tolist()
        ['massive values']
    """

    records: tuple[tuple[int, str, str, str, int, float], ...]  # rows of COLUMNS
    checkpoints: tuple[Checkpoint, ...]
    analyses: tuple[str, ...]
    structures: tuple[Structure, ...]
    provenance: Provenance
    seconds: tuple[float, ...] = field(default=())  # per checkpoint: load and measure

    def __post_init__(self) -> None:
        unknown = sorted(set(self.analyses) - set(ANALYSES))
        if unknown:
            raise InputError(f"unknown analyses {unknown}: choose from {', '.join(ANALYSES)}")
        steps = [c.step for c in self.checkpoints]
        if steps != sorted(set(steps)):
            raise InputError(
                f"checkpoints must have distinct steps in increasing order, got {steps}"
            )

    @property
    def steps(self) -> list[int]:
        """The training step of each checkpoint, in order."""
        return [c.step for c in self.checkpoints]

    @property
    def columns(self) -> tuple[str, ...]:
        """The names of each record's values (the file carries them beside the records)."""
        return COLUMNS

    # ---------------------------------------------------------------- tables
    def to_frame(self) -> pd.DataFrame:
        """One row per (checkpoint, metric, layer); layer −1 is the model-wide number."""
        return pd.DataFrame(list(self.records), columns=list(COLUMNS))

    def series(self, metric: str, layer: int = -1) -> pd.Series:
        """One metric against step (model-wide unless ``layer`` is given)."""
        df = self.to_frame()
        sel = df[(df["metric"] == metric) & (df["layer"] == layer)]
        if sel.empty:
            raise InputError(
                f"no {metric!r} at layer {layer} in this trajectory: its metrics are "
                f"{sorted(df['metric'].unique())}"
            )
        return sel.set_index("step")["value"].sort_index()

    def emergence(self, thresholds: dict[str, float] | None = None) -> pd.DataFrame:
        """For each structure measured, the step at which it appears.

        Rule: a structure emerges at the first checkpoint whose model-wide metric is at or above the
        structure's threshold and stays at or above it at every later checkpoint (a level crossed
        and lost again does not count); ``step`` is None (NaN in the table) when the last checkpoint
        is below it. ``thresholds`` (metric → level) overrides :data:`STRUCTURES`' levels.
        """
        thresholds = thresholds or {}
        rows = []
        for s in self.structures:
            if s.analysis not in self.analyses:
                continue
            level = float(thresholds.get(s.metric, s.threshold))
            v = self.series(s.metric)
            above = (v >= level).tolist()
            at = None
            for i in range(len(above)):
                if all(above[i:]):
                    at = int(v.index[i])
                    break
            rows.append(
                {
                    "structure": s.name,
                    "metric": s.metric,
                    "threshold": level,
                    "step": at,
                    "value_then": None if at is None else float(v.loc[at]),
                    "first": float(v.iloc[0]),
                    "last": float(v.iloc[-1]),
                }
            )
        df = pd.DataFrame(
            rows,
            columns=["structure", "metric", "threshold", "step", "value_then", "first", "last"],
        )
        df["step"] = df["step"].astype("Int64")  # None stays missing, steps stay integers
        return df

    def findings(self) -> list[Finding]:
        """One sentence per structure: the step it appears at, and its metric at the first and last
        checkpoint."""
        out = []
        lo, hi = self.steps[0], self.steps[-1]
        for r in self.emergence().to_dict("records"):
            step = None if pd.isna(r["step"]) else int(r["step"])
            when = (
                f"appears at step {step:,}"
                if step is not None
                else f"has not appeared by step {hi:,}"
            )
            text = (
                f"{r['structure'].capitalize()} ({r['metric']} ≥ {r['threshold']:g}): {when}; "
                f"{r['metric']} is {r['first']:.3g} at step {lo:,} and {r['last']:.3g} at step "
                f"{hi:,}."
            )
            values = {**r, "step": step, "value_then": None if step is None else r["value_then"]}
            out.append(Finding(f"emergence_{r['metric']}", "trajectory", text, values))
        return out

    # ---------------------------------------------------------------- persistence


# ------------------------------------------------------------------------------------------------
# the checkpoints
# ------------------------------------------------------------------------------------------------
def resolve_checkpoints(
    checkpoints: str | os.PathLike[str] | Sequence[str | os.PathLike[str]],
    *,
    revisions: Sequence[str] | None = None,
    steps: Sequence[int] | None = None,
) -> list[Checkpoint]:
    """The checkpoints, sorted by step: directories (step from ``steps``, the ``step-N`` name or the
    saved training info), or one hub id at each of ``revisions`` (step from ``steps`` or the
    revision's name)."""
    items = [checkpoints] if isinstance(checkpoints, str | os.PathLike) else list(checkpoints)
    if not items:
        raise InputError(
            "no checkpoints given: pass checkpoint directories (step-N/, as "
            "ropelens.training.train saves them) or one hub id with revisions"
        )
    names = [os.fspath(c) for c in items]
    if revisions is not None:
        revisions = list(revisions)
        if not revisions:
            raise InputError(
                "revisions is empty: pass the hub revisions to measure (e.g. step1000 step8000)"
            )
        if len(names) != 1:
            raise InputError(
                f"revisions go with one hub id, got {len(names)} checkpoints: pass one owner/name"
            )
        if Path(names[0]).expanduser().exists() or names[0].startswith((".", "/", "~")):
            raise InputError(
                f"revisions given with the local path {names[0]!r}: a revision picks a version "
                "of a hub repository; pass the checkpoint directories themselves instead"
            )
        sources = [(names[0], r) for r in revisions]
    else:
        for n in names:
            p = Path(n).expanduser()
            if not p.is_dir():
                what = "is not a directory" if p.exists() else "does not exist"
                raise InputError(
                    f"checkpoint {n} {what}: pass checkpoint directories (config.json + "
                    "weights), or one hub id with revisions"
                )
        sources = [(n, None) for n in names]
    if steps is not None and len(list(steps)) != len(sources):
        raise InputError(
            f"{len(list(steps))} steps given for {len(sources)} checkpoints: give one step per "
            "checkpoint"
        )
    out = []
    for i, (src, rev) in enumerate(sources):
        step = int(list(steps)[i]) if steps is not None else _step(src, rev)
        out.append(Checkpoint(step, src, rev))
    out.sort(key=lambda c: c.step)
    seen = [c.step for c in out]
    dup = sorted({s for s in seen if seen.count(s) > 1})
    if dup:
        raise InputError(
            f"several checkpoints at step {dup[0]}: each checkpoint needs its own step"
        )
    return out


def _step(source: str, revision: str | None) -> int:
    if revision is not None:
        step = step_of(revision)
        where = f"revision {revision!r}"
    else:
        info = read_info(source)
        step = int(info["step"]) if info is not None and "step" in info else step_of(source)
        where = f"checkpoint {source}"
    if step is None:
        raise InputError(
            f"{where} states no training step (no step-N in its name): pass the steps explicitly"
        )
    return step


# ------------------------------------------------------------------------------------------------
# measuring
# ------------------------------------------------------------------------------------------------
def _run(kw: dict[str, Any]) -> dict[str, Any]:
    """The run options a corpus analysis takes (the heads analysis's seed left out)."""
    return {k: v for k, v in kw.items() if k != "seed"}


def _median(x: torch.Tensor) -> float:
    """The median over layers, the two middle values averaged for an even count (torch's median
    takes the lower)."""
    return float(x.double().nanquantile(0.5))


def _bands(model, corpus, kw: dict[str, Any]) -> tuple[list[tuple[str, int, float]], Provenance]:
    r = band_location(model, corpus, intervene=False, **_run(kw))
    b = r.bands()
    rows = []
    for name, t in (
        ("band_peak", b.peak),
        ("band_width", b.width),
        ("band_prominence", b.prominence),
    ):
        rows += [(name, L, float(t[i])) for i, L in enumerate(r.layers)] + [(name, -1, _median(t))]
    return rows, r.provenance


def _sinks(model, corpus, kw: dict[str, Any]) -> tuple[list[tuple[str, int, float]], Provenance]:
    r = attention_sinks(model, corpus, **_run(kw))
    present, sinking, att = r.present(), r.sinking(), r.mean_attention()
    share = r.head_share()
    rows = [("sink_head_share", L, float(share[i])) for i, L in enumerate(r.layers)]
    rows += [
        ("sink_head_share", -1, float(sinking[present].double().mean())),
        ("sink_attention", -1, float(att[present].double().mean())),
    ]
    return rows, r.provenance


def _massive(model, corpus, kw: dict[str, Any]) -> tuple[list[tuple[str, int, float]], Provenance]:
    r = massive_values(model, corpus, **_run(kw))
    mask, ratio = r.mask("q"), r.ratio("q").nan_to_num(nan=0.0)
    rows = [("massive_dims", L, float(mask[i].sum())) for i, L in enumerate(r.layers)]
    rows += [("massive_dims", -1, float(mask.sum())), ("massive_max_ratio", -1, float(ratio.max()))]
    return rows, r.provenance


def _heads(model, corpus, kw: dict[str, Any]) -> tuple[list[tuple[str, int, float]], Provenance]:
    n_windows = max(1, kw["max_tokens"] // kw["n_ctx"])
    r = head_taxonomy(
        model,
        corpus,
        n_ctx=kw["n_ctx"],
        n_windows=n_windows,
        seed=kw["seed"],
        progress=kw["progress"],
        verify=kw["verify"],
    )
    pos, present = r.positional(), r.present()
    rows = [("positional_heads", L, float(pos[i].sum())) for i, L in enumerate(r.layers)]
    rows += [
        ("positional_heads", -1, float(pos.sum())),
        ("positional_share", -1, float(pos[present].double().mean())),
    ]
    return rows, r.provenance


_MEASURE = {"bands": _bands, "sinks": _sinks, "massive": _massive, "heads": _heads}


def _setting(ck: Checkpoint, key: str) -> Any:
    """A setting of the run that trained a checkpoint directory (its corpus, its training length),
    if saved."""
    info = read_info(ck.source) if ck.revision is None else None
    return None if info is None else info.get("config", {}).get(key)


def trajectory(
    checkpoints: str | os.PathLike[str] | Sequence[str | os.PathLike[str]],
    *,
    revisions: Sequence[str] | None = None,
    steps: Sequence[int] | None = None,
    analyses: Sequence[str] = ANALYSES,
    corpus: Any = None,
    n_tokens: int = 2048,
    n_ctx: int | None = None,
    device: str | torch.device | None = None,
    seed: int = 0,
    progress: bool = False,
    verify: bool = True,
    text_column: str = "text",
) -> Trajectory:
    """Measure a model's structures at each training checkpoint and keep their summary numbers.

    Oka et al. report that the high-norm frequency band forms early in pretraining; Gu et al. that
    attention sinks emerge during training. Each checkpoint is loaded in turn and measured by the
    chosen analyses on a small token budget: ``bands`` (band peak, width and prominence,
    :func:`band_location`), ``sinks`` (share of sinking heads and mean attention to position 0,
    :func:`attention_sinks`), ``massive`` (massive query dimensions and the largest ratio,
    :func:`massive_values`) and ``heads`` (positional heads, :func:`head_taxonomy`); see the module
    docstring for every metric.

    Args:
        checkpoints (str | os.PathLike | Sequence[str | os.PathLike]): Checkpoint directories (such
            as ``ropelens.training.train`` saves, ``step-N/``), or one hub id with ``revisions``
            (needs the network).
        revisions (Sequence[str] | None): The hub revisions to measure (e.g. Pythia's ``step1000``),
            with one hub id (default None).
        steps (Sequence[int] | None): The training step of each checkpoint, where names do not state
            them (default None: from the ``step-N`` name, the saved training info or the revision).
        analyses (Sequence[str]): Which of :data:`ANALYSES` to run (default all four).
        corpus: The text measured: any form :func:`ropelens.run.data.load_corpus` reads (default
            None: the corpus a ropelens checkpoint was trained on, else "english").
        n_tokens (int): Tokens per analysis and checkpoint, ≥ 2 (default 2048).
        n_ctx (int | None): Tokens per window (default None: a ropelens checkpoint's training
            length, else 256; at most ``n_tokens``).
        device (str | torch.device | None): Where each checkpoint is loaded (default None: CUDA
            where available, else the CPU).
        seed (int): Seed of the heads analysis's random tokens (default 0).
        progress (bool): Progress bars (default False).
        verify (bool): Verify each checkpoint's RoPE reading against its own attention (default
            True).
        text_column (str): The column of a table or dataset corpus that holds the text (default
            "text").

    Returns:
        Trajectory: One record per (checkpoint, metric, layer), the checkpoints, and the structures
        whose emergence it can date.

    Raises:
        InputError: When an analysis is unknown or none is given, ``n_tokens`` is below 2 or below
            a given ``n_ctx``, or the checkpoints cannot be resolved (none given, ``revisions``
            without one hub id, steps missing or repeated).

    Examples:
        >>> import tempfile
        >>> from pathlib import Path
        >>> from ropelens.analyses import trajectory
        >>> from ropelens.testing import tiny_model_dir
        >>> root = Path(tempfile.mkdtemp())
        >>> dirs = [tiny_model_dir("llama", root / f"step-{s}", seed=s) for s in (0, 100)]
        >>> traj = trajectory(dirs, analyses=["massive"], n_tokens=128, n_ctx=32)
        >>> traj.analyses, [c.step for c in traj.checkpoints]
        (('massive',), [0, 100])
        >>> int((traj.to_frame()["layer"] == -1).sum())  # model-wide rows: 2 metrics × 2 steps
        4
    """
    analyses = tuple(dict.fromkeys(analyses))
    unknown = [a for a in analyses if a not in ANALYSES]
    if unknown or not analyses:
        raise InputError(f"unknown analyses {unknown}: choose one or more of {', '.join(ANALYSES)}")
    if isinstance(n_tokens, bool) or not isinstance(n_tokens, int) or n_tokens < 2:
        raise InputError(
            f"n_tokens must be an int >= 2 (tokens per analysis and checkpoint), got {n_tokens!r}"
        )
    cks = resolve_checkpoints(checkpoints, revisions=revisions, steps=steps)
    corpus = corpus if corpus is not None else (_setting(cks[0], "corpus") or "english")
    corpus = load_corpus(corpus, text_column=text_column)  # read once, for every checkpoint
    if n_ctx is not None and n_tokens < n_ctx:  # a length asked for is never shortened unasked
        raise InputError(
            f"n_tokens={n_tokens} is less than one window of n_ctx={n_ctx}: raise n_tokens or "
            "lower n_ctx"
        )
    n_ctx = min(int(n_ctx or _setting(cks[0], "seq_len") or 256), n_tokens)
    kw = {"n_ctx": n_ctx, "max_tokens": n_tokens, "progress": progress, "verify": verify}
    records: list[tuple[int, str, str, str, int, float]] = []
    seconds: list[float] = []
    provs: list[Provenance] = []
    weights: list[str] = []
    start = time.perf_counter()
    for ck in cks:
        t0 = time.perf_counter()
        model = load_model(ck.source, device=device, revision=ck.revision)
        weights.append(weights_fingerprint(model)["weights_sha256"])
        for name in analyses:
            rows, prov = _MEASURE[name](model, corpus, {**kw, "seed": seed})
            provs.append(prov)
            records += [
                (ck.step, ck.label, name, metric, layer, value) for metric, layer, value in rows
            ]
        del model
        seconds.append(time.perf_counter() - t0)
    prov = Provenance(
        model=_model_name(cks),
        corpus=provs[0].corpus,
        corpus_sha256=provs[0].corpus_sha256,
        n_tokens=n_tokens,
        n_ctx=n_ctx,
        seconds=time.perf_counter() - start,
        config={
            "analyses": list(analyses),
            "seed": seed,
            "verify": verify,
            "checkpoints": [
                {"step": c.step, "source": c.source, "revision": c.revision, "weights_sha256": w}
                for c, w in zip(cks, weights, strict=True)
            ],
            "thresholds": {s.metric: s.threshold for s in STRUCTURES},
        },
    )
    return Trajectory(
        records=tuple(records),
        checkpoints=tuple(cks),
        analyses=analyses,
        structures=STRUCTURES,
        provenance=prov,
        seconds=tuple(seconds),
    )


def _model_name(cks: Sequence[Checkpoint]) -> str:
    """The hub id, or the folder the checkpoint directories share (else the first one's path)."""
    if cks[0].revision is not None:
        return cks[0].source
    parents = {str(Path(c.source).expanduser().resolve().parent) for c in cks}
    return parents.pop() if len(parents) == 1 else cks[0].source
