"""One entry point for every corpus analysis: windows, reducers, the run and its provenance.

A corpus analysis is a set of reducers folded over token windows. :func:`measure` does everything
around them the same way for every analysis: the model's RoPE spec and the chosen layers, the
windows (:func:`ropelens.run.data.analysis_windows`, or ready ones), the run
(:func:`ropelens.run.distributed.run_windows`: split across ranks inside a process group,
checkpointed and resumable, with progress), its timing and the result's :class:`Provenance`. An
analysis builds its reducers from the spec, layers and windows, calls :func:`measure`, and turns the
filled reducer into its result.
"""

from __future__ import annotations

import functools
import hashlib
import inspect
import os
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, fields, replace
from typing import Any, TypeVar

import torch
from torch import Tensor

from ropelens.backends import handle
from ropelens.errors import InputError
from ropelens.results.provenance import Provenance, placement
from ropelens.run.capture import Reducer
from ropelens.run.data import analysis_windows, check_token_windows
from ropelens.run.distributed import RunInfo, run_windows
from ropelens.run.verify import verification
from ropelens.spec.reading import rope_spec
from ropelens.spec.rope import RopeSpec
from ropelens.spec.surface import running_model

__all__ = ["Build", "Measured", "RunOptions", "Windows", "corpus_analysis", "measure"]


@dataclass(frozen=True)
class RunOptions:
    """How a corpus analysis runs: its windows, layers, batches, progress bar, checkpoints and
    verification.

    Every corpus analysis takes these as keyword arguments (with its own defaults for ``n_ctx``
    and ``max_tokens``); :func:`corpus_analysis` gathers them into one ``RunOptions``.
    """

    n_ctx: int = 512  # tokens per window; every window starts with BOS
    max_tokens: int | None = 32_768  # corpus tokens to read (None: all of it)
    layers: Sequence[int] | None = None  # layer indices (None: every rotary layer)
    text_column: str = "text"  # the column of a table or dataset corpus that holds the text
    batch_size: int = 4  # windows per forward pass
    progress: bool = True  # a progress bar (rank 0 only under torchrun)
    checkpoint: str | os.PathLike[str] | None = (
        None  # directory to save progress to and resume from
    )
    checkpoint_every: int = 8  # batches between checkpoints
    # check the reading against the model's own attention first (False: results say unverified)
    verify: bool = True


_RUN_FIELDS = tuple(f.name for f in fields(RunOptions))
_LATE = (
    "batch_size",
    "progress",
    "checkpoint",
    "checkpoint_every",
    "verify",
)  # listed after the analysis's own settings
F = TypeVar("F", bound=Callable[..., Any])


def corpus_analysis(**defaults: Any) -> Callable[[F], F]:
    """Give ``fn(model, corpus, run: RunOptions, *, settings...)`` the run options as keyword
    arguments.

    The public function takes ``(model, corpus=None, *, n_ctx, max_tokens, layers, settings...,
    batch_size, progress, checkpoint, checkpoint_every, verify)`` with ``defaults`` overriding
    :class:`RunOptions`'s, and its signature (``help()``, Jupyter's ``?``) says so.
    """
    unknown = set(defaults) - set(_RUN_FIELDS)
    if unknown:
        raise TypeError(
            f"corpus_analysis: {sorted(unknown)} are not RunOptions fields ({list(_RUN_FIELDS)})"
        )
    base = RunOptions(**defaults)

    def wrap(fn: F) -> F:
        own = list(inspect.signature(fn).parameters.values())
        if [p.name for p in own[:3]] != ["model", "corpus", "run"]:
            raise TypeError(f"{fn.__name__} must take (model, corpus, run, *, settings...)")
        settings = own[3:]

        def kw(name):
            return inspect.Parameter(
                name,
                inspect.Parameter.KEYWORD_ONLY,
                default=getattr(base, name),
                annotation=RunOptions.__annotations__[name],
            )

        params = [
            own[0],
            own[1].replace(default=None),
            *(kw(n) for n in _RUN_FIELDS if n not in _LATE),
            *settings,
            *(kw(n) for n in _LATE),
        ]
        sig = inspect.Signature(params, return_annotation=inspect.signature(fn).return_annotation)

        @functools.wraps(fn)
        def analysis(*args: Any, **kwargs: Any) -> Any:
            bound = sig.bind(*args, **kwargs)  # a misspelt keyword fails here, naming it
            given = bound.arguments
            run = replace(base, **{k: given.pop(k) for k in _RUN_FIELDS if k in given})
            model = running_model(given.pop("model"))  # an nnsight model: the HF model it wraps
            return fn(model, given.pop("corpus", None), run, **given)

        analysis.__signature__ = sig  # type: ignore[attr-defined]
        return analysis  # type: ignore[return-value]

    return wrap


@dataclass(frozen=True)
class Windows:
    """Token windows ``[n_windows, n_ctx]`` and the corpus they came from (name and sha256)."""

    tokens: Tensor
    corpus: str | None = None
    sha256: str | None = None
    # where each window sits among the windows first cut (None: 0 … n_windows - 1), and the
    # fingerprint of what they were cut from (None: computed from the corpus's sha256 or tokens)
    indices: tuple[int, ...] | None = None
    origin: str | None = None

    def __post_init__(self) -> None:
        check_token_windows(self.tokens)  # sums over no window would read as a measurement
        if self.origin is None:
            object.__setattr__(self, "origin", self._fingerprint())

    def _fingerprint(self) -> str:
        """The corpus's sha256 where it has one (its windows are cut from the start of its token
        stream, BOS and then ``n_ctx - 1`` text tokens each), else a digest of the tokens."""
        if self.sha256 is not None:
            return f"corpus:{self.sha256}"
        data = self.tokens.detach().cpu().contiguous().to(torch.int64).numpy().tobytes()
        return f"tokens:{hashlib.sha256(data).hexdigest()}"

    @property
    def spans(self) -> dict[str, list[list[int]]]:
        """Which tokens these windows hold, as :attr:`Provenance.spans` records them: window i is
        the corpus stream's text tokens ``[i·(n_ctx−1), (i+1)·(n_ctx−1))`` (BOS aside), or, for
        ready tokens, their positions ``[i·n_ctx, (i+1)·n_ctx)``."""
        assert self.origin is not None
        per = self.n_ctx - 1 if self.origin.startswith("corpus:") else self.n_ctx
        where = self.indices if self.indices is not None else range(self.n_windows)
        ranges: list[list[int]] = []
        for i in sorted(where):
            if ranges and ranges[-1][1] == i * per:
                ranges[-1][1] += per
            else:
                ranges.append([i * per, (i + 1) * per])
        return {self.origin: ranges}

    @classmethod
    def of(
        cls,
        tokenizer: Any,
        corpus: Any,
        n_ctx: int,
        max_tokens: int | None,
        text_column: str = "text",
    ) -> Windows:
        """The windows every corpus analysis runs on (see
        :func:`ropelens.run.data.analysis_windows`)."""
        return cls(*analysis_windows(tokenizer, corpus, n_ctx, max_tokens, text_column))

    @property
    def n_windows(self) -> int:
        return int(self.tokens.shape[0])

    @property
    def n_ctx(self) -> int:
        return int(self.tokens.shape[1])

    def subset(self, indices: Sequence[int]) -> Windows:
        """The windows at ``indices`` (same corpus)."""
        where = self.indices if self.indices is not None else range(self.n_windows)
        return Windows(
            self.tokens[list(indices)],
            self.corpus,
            self.sha256,
            indices=tuple(where[i] for i in indices),
            origin=self.origin,
        )


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
    run: RunOptions = RunOptions(),
    *,
    analysis: str,
    config: Config | None = None,
    resume: Mapping[str, Any] | None = None,
    desc: str | None = None,
    windows: Windows | None = None,
    spec: RopeSpec | None = None,
    label: str | None = None,
    rotary_only: bool = True,
) -> Measured:
    """Run the reducers ``build(spec, layers, windows)`` makes over a corpus; return them filled,
    with provenance.

    ``corpus`` (a Corpus, a corpus name or path, or a ready ``[n_windows, n_ctx]`` token tensor) is
    cut into windows of ``run.n_ctx`` up to ``run.max_tokens``, unless ready ``windows`` are given.
    ``config`` (a dict, or a function of the built reducers) holds the analysis's settings: the
    provenance records them with the chosen ``layers``, the batch size and how the run was split; a
    checkpoint resumes only a run with the same ``analysis``, settings and ``resume`` (settings that
    change the sums but are not recorded, such as tile sizes). Inside a ``torch.distributed``
    process group each rank takes a share of the windows and every rank gets the whole corpus's
    sums.

    Before any window runs, :func:`ropelens.run.verify.verification` checks that ``spec`` describes
    the model's own attention (once per model; UnsupportedModelError when it does not); the
    provenance records the outcome under ``config["verification"]``, or "unverified" with
    ``run.verify`` False.

    ``rotary_only=False`` lets ``run.layers`` name NoPE layers too (None then selects every layer),
    for analyses that measure what a layer does without rotating.
    """
    model = running_model(model)  # an nnsight model: the HF model it wraps
    h = handle(model)  # the spec read once per model, not once per analysis
    spec = spec if spec is not None else h.spec
    chosen = spec.layer_indices(run.layers, rotary_only=rotary_only)
    if not chosen:
        raise InputError(
            f"no layers selected (layers={run.layers!r}): pass layer indices the model has"
        )
    win = (
        windows
        if windows is not None
        else Windows.of(model.tokenizer, corpus, run.n_ctx, run.max_tokens, run.text_column)
    )
    if spec.valid_up_to is not None:  # frequencies that change with the input's length, as applied
        spec = rope_spec(model, length=win.n_ctx)
    length = spec.length
    verified = verification(model, spec, verify=run.verify, length=length)
    built = build(spec, chosen, win)
    reducers = tuple(built) if isinstance(built, Sequence) else (built,)
    settings = dict(config(reducers) if callable(config) else config or {})
    settings["layers"] = list(
        chosen
    )  # every analysis records them; the same key where it already did
    if (
        length is not None
    ):  # the rotary frequencies were read as a forward of this many tokens applies them
        settings["rope_read_at_length"] = length
    settings.setdefault("batch_size", run.batch_size)
    t0 = time.perf_counter()
    info = run_windows(
        model,
        win.tokens,
        reducers,
        batch_size=run.batch_size,
        layers=chosen,
        spec=spec,
        progress=run.progress,
        desc=desc or analysis,
        checkpoint=run.checkpoint,
        every=run.checkpoint_every,
        config={"analysis": analysis, **settings, **(resume or {})},
    )
    prov = Provenance(
        model=label or h.label,
        corpus=win.corpus,
        corpus_sha256=win.sha256,
        n_tokens=info.n_tokens,
        n_windows=win.n_windows,
        n_ctx=win.n_ctx,
        config={**settings, **info.to_config(), "verification": verified.to_dict()},
        seconds=time.perf_counter() - t0,
        spans=win.spans,
        **placement(model),
    )
    return Measured(reducers, prov, info, spec, tuple(chosen), win)
