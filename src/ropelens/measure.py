"""One entry point for every corpus analysis: windows, reducers, the run and its provenance.

A corpus analysis is a set of reducers folded over token windows. :func:`measure` does everything
around them the same way for every analysis: the model's RoPE spec and the chosen layers, the
windows (:func:`ropelens.data.analysis_windows`, or ready ones), the run
(:func:`ropelens.distributed.run_windows`: split across ranks inside a process group, checkpointed
and resumable, with progress), its timing and the result's :class:`Provenance`. An analysis builds
its reducers from the spec, layers and windows, calls :func:`measure`, and turns the filled
reducer into its result.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from torch import Tensor

from ropelens.capture import Reducer
from ropelens.data import analysis_windows
from ropelens.distributed import RunInfo, run_windows
from ropelens.errors import InputError
from ropelens.provenance import Provenance
from ropelens.rope import RopeSpec

__all__ = ["Build", "Measured", "Windows", "measure"]


@dataclass(frozen=True)
class Windows:
    """Token windows ``[n_windows, n_ctx]`` and the corpus they came from (name and sha256)."""

    tokens: Tensor
    corpus: str | None = None
    sha256: str | None = None

    @classmethod
    def of(cls, tokenizer: Any, corpus: Any, n_ctx: int, max_tokens: int | None) -> Windows:
        """The windows every corpus analysis runs on (see :func:`ropelens.data.analysis_windows`)."""
        return cls(*analysis_windows(tokenizer, corpus, n_ctx, max_tokens))

    @property
    def n_windows(self) -> int:
        return int(self.tokens.shape[0])

    @property
    def n_ctx(self) -> int:
        return int(self.tokens.shape[1])

    def subset(self, indices: Sequence[int]) -> Windows:
        """The windows at ``indices`` (same corpus)."""
        return Windows(self.tokens[list(indices)], self.corpus, self.sha256)


Build = Callable[[RopeSpec, list[int], Windows], "Reducer | Sequence[Reducer]"]
Config = Mapping[str, Any] | Callable[[tuple[Reducer, ...]], Mapping[str, Any]]


@dataclass(frozen=True)
class Measured:
    """A finished corpus run: the filled reducers, what they ran on, and the result's provenance."""

    reducers: tuple[Reducer, ...]
    provenance: Provenance
    run: RunInfo
    spec: RopeSpec
    layers: tuple[int, ...]
    windows: Windows

    @property
    def reducer(self) -> Reducer:
        """The first reducer (the only one, for most analyses)."""
        return self.reducers[0]


def measure(
    model,
    corpus: Any,
    build: Build,
    *,
    analysis: str,
    config: Config | None = None,
    n_ctx: int = 512,
    max_tokens: int | None = None,
    layers: Sequence[int] | None = None,
    batch_size: int = 4,
    progress: bool = True,
    checkpoint: str | os.PathLike[str] | None = None,
    checkpoint_every: int = 8,
    resume: Mapping[str, Any] | None = None,
    desc: str | None = None,
    windows: Windows | None = None,
    spec: RopeSpec | None = None,
    label: str | None = None,
) -> Measured:
    """Run the reducers ``build(spec, layers, windows)`` makes over a corpus; return them filled, with provenance.

    ``corpus`` (a Corpus, a corpus name or path, or a ready ``[n_windows, n_ctx]`` token tensor) is
    cut into windows of ``n_ctx`` up to ``max_tokens``, unless ready ``windows`` are given.
    ``config`` (a dict, or a function of the built reducers) holds the analysis's settings: the
    provenance records them with the chosen ``layers`` and how the run was split; a checkpoint
    resumes only a run with the same ``analysis``, settings and ``resume`` (settings that change
    the sums but are not recorded, such as tile sizes). Inside a ``torch.distributed`` process
    group each rank takes a share of the windows and every rank gets the whole corpus's sums.
    """
    from ropelens.reading import model_label, rope_spec

    spec = spec if spec is not None else rope_spec(model)
    chosen = spec.layer_indices(layers)
    if not chosen:
        raise InputError(f"no layers selected (layers={layers!r}): pass layer indices the model has")
    win = windows if windows is not None else Windows.of(model.tokenizer, corpus, n_ctx, max_tokens)
    built = build(spec, chosen, win)
    reducers = tuple(built) if isinstance(built, Sequence) else (built,)
    settings = dict(config(reducers) if callable(config) else config or {})
    settings["layers"] = list(chosen)  # every analysis records them; the same key where it already did
    t0 = time.perf_counter()
    run = run_windows(model, win.tokens, reducers, batch_size=batch_size, layers=chosen, spec=spec, progress=progress,
                      desc=desc or analysis, checkpoint=checkpoint, every=checkpoint_every,
                      config={"analysis": analysis, **settings, **(resume or {})})
    prov = Provenance(model=label or model_label(model), corpus=win.corpus, corpus_sha256=win.sha256,
                      n_tokens=run.n_tokens, n_windows=win.n_windows, n_ctx=win.n_ctx,
                      config={**settings, **run.to_config()}, seconds=time.perf_counter() - t0)
    return Measured(reducers, prov, run, spec, tuple(chosen), win)
