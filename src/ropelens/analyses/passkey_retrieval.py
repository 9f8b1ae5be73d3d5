"""Passkey retrieval: a number hidden in filler text, asked back at the end (the YaRN / LongRoPE
harness).

Each prompt is the harness's task line, filler sentences ("The grass is green. The sky is blue. The
sun is yellow. Here we go. There and back again." repeated), the needle line "The pass key is 12345.
Remember it. 12345 is the pass key." at a chosen depth (the fraction of filler sentences before it),
more filler, and "What is the pass key? The pass key is". The filler is as long as fits in the
target token length. The model continues greedily for a few tokens and is right when the first
integer of its answer is the passkey (the harness's rule).

Decoding runs on the HF model the bridge wraps with sdpa attention, with any RoPE variant
(``apply_rope_variant``) or plane ablation (``ablate_planes``) in force applied where it rotates
(:func:`ropelens.backends.sdpa.on_sdpa`); under any other hook intervention it runs on the bridge.
The prompt is prefilled in chunks into the HF key/value cache, then decoded one token at a time.
Variants whose rotation depends on the input's length (dynamic NTK, LongRoPE) decode with full
forwards instead, so every step sees the whole sequence at its own length.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import re
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
import torch
from jaxtyping import Int
from torch import Tensor
from tqdm.auto import tqdm

from ropelens.backends import backend_of
from ropelens.devices import device_of, forward_bytes, require_memory
from ropelens.errors import InputError
from ropelens.results.provenance import Provenance, placement
from ropelens.results.result import Result
from ropelens.run.evaluate import loss_path
from ropelens.run.intervene import apply_rope_variant
from ropelens.run.texts import bos_token_id
from ropelens.spec.surface import running_model
from ropelens.spec.variants import DynamicNTK, LongRoPE, RopeVariant, check_variant
from ropelens.validate import check_number

__all__ = [
    "FILLER",
    "QUESTION",
    "TASK",
    "PasskeyPrompt",
    "PasskeyRetrieval",
    "PasskeyTrial",
    "greedy_continuation",
    "make_passkey",
    "needle",
    "passkey_prompt",
    "passkey_retrieval",
    "score_answer",
]

TASK = (
    "There is an important info hidden inside a lot of irrelevant text. Find it and memorize them. "
    "I will quiz you about the important information there."
)
FILLER = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again."
QUESTION = "What is the pass key? The pass key is"
_SENTENCES = tuple(s if s.endswith(".") else s + "." for s in FILLER.split(". "))
_NUMBER = re.compile(r"\d+")
_DONE = re.compile(r"\d+\D")  # a whole number has been written


def needle(passkey: str) -> str:
    """The line that hides the passkey."""
    return f"The pass key is {passkey}. Remember it. {passkey} is the pass key."


def make_passkey(seed: int, trial: int) -> str:
    """The 5-digit passkey of ``trial`` under ``seed`` (the same at every length and depth, so cells
    of a grid differ only in what the grid varies)."""
    rng = np.random.default_rng([int(seed), int(trial)])
    return str(int(rng.integers(10_000, 100_000)))


def score_answer(response: str, passkey: str) -> tuple[str | None, bool]:
    """The first integer in ``response`` and whether it is the passkey (the YaRN harness's rule)."""
    m = _NUMBER.search(response)
    found = None if m is None else m.group()
    return found, found == str(passkey)


# --------------------------------------------------------------------------------------------
# prompts
# --------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class PasskeyPrompt:
    """One prompt: its text and tokens (BOS first where the tokenizer has one), the passkey and
    where the needle sits: ``n_before`` of ``n_filler`` filler sentences precede it (``round(depth ·
    n_filler)``), and ``token_depth`` is the fraction of the filler's tokens before it."""

    text: str
    tokens: Int[Tensor, " pos"]
    passkey: str
    depth: float
    target_len: int
    n_filler: int
    n_before: int
    needle_start: int  # token index of the needle's first token
    token_depth: float

    @property
    def n_tokens(self) -> int:
        return int(self.tokens.numel())


def _layout(n_filler: int, depth: float, passkey: str) -> tuple[str, int, dict[str, int]]:
    """Text with ``n_filler`` sentences and the needle after ``round(depth·n)`` of them, and the
    character offsets of the filler start, needle start and end, and question start."""
    k = int(math.floor(depth * n_filler + 0.5))
    sents = [_SENTENCES[i % len(_SENTENCES)] for i in range(n_filler)]
    prefix, suffix = " ".join(sents[:k]), " ".join(sents[k:])
    parts = [TASK, prefix, needle(passkey), suffix, QUESTION]
    text = "\n".join(parts)
    starts, pos = [], 0
    for p in parts:
        starts.append(pos)
        pos += len(p) + 1
    return (
        text,
        k,
        {
            "filler": starts[1],
            "needle": starts[2],
            "needle_end": starts[2] + len(parts[2]),
            "question": starts[4],
        },
    )


def _encode(tok: Any, text: str, bos: bool) -> tuple[list[int], list[tuple[int, int]] | None]:
    if getattr(tok, "is_fast", False):
        enc = tok(text, add_special_tokens=False, return_offsets_mapping=True, verbose=False)
        ids, offsets = list(enc["input_ids"]), [tuple(o) for o in enc["offset_mapping"]]
    else:
        ids, offsets = list(tok(text, add_special_tokens=False, verbose=False)["input_ids"]), None
    if bos:
        ids = [bos_token_id(tok), *ids]
        offsets = None if offsets is None else [(0, 0), *offsets]
    return ids, offsets


def _token_at(
    tok: Any, text: str, offsets: list[tuple[int, int]] | None, char: int, bos: bool
) -> int:
    """Index of the first token that ends after character ``char``."""
    if offsets is not None:
        for i, (_, end) in enumerate(offsets):
            if end > char:
                return i
        return len(offsets)
    return len(_encode(tok, text[:char], bos)[0])


def passkey_prompt(
    tokenizer: Any, length: int, depth: float, passkey: str, *, bos: bool = True
) -> PasskeyPrompt:
    """The longest prompt of at most ``length`` tokens with ``passkey`` at ``depth`` (0 = right
    after the task line, 1 = right before the question).

    ``tokenizer`` is an HF tokenizer or a model with ``.tokenizer``; ``bos`` prepends its BOS token,
    as ``model.to_tokens`` does.
    """
    tok = getattr(tokenizer, "tokenizer", None) or tokenizer
    length = check_number(
        length, "length", at_least=2, integer=True, hint=" (the prompt's size in tokens)"
    )
    depth = check_number(
        depth,
        "depth",
        at_least=0,
        at_most=1,
        hint=" (the fraction of the filler before the passkey)",
    )
    if not (isinstance(passkey, str) and passkey.isdigit()):
        raise InputError(f"passkey must be a string of digits, got {passkey!r}")
    bos = bool(bos) and bos_token_id(tok) is not None  # the BOS policy of every ropelens input

    def n_tok(n: int) -> int:
        return len(_encode(tok, _layout(n, depth, passkey)[0], bos)[0])

    if n_tok(0) > length:
        raise InputError(
            f"length {length} is too short: the task line, the needle and the question alone take "
            f"{n_tok(0)} tokens; ask for at least {n_tok(0) + 20}"
        )
    lo, hi = 0, 1
    while n_tok(hi) <= length:  # lo fits, hi does not
        lo, hi = hi, 2 * hi
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if n_tok(mid) <= length else (lo, mid)
    text, k, chars = _layout(lo, depth, passkey)
    ids, offsets = _encode(tok, text, bos)
    at = {name: _token_at(tok, text, offsets, c, bos) for name, c in chars.items()}
    before, after = at["needle"] - at["filler"], at["question"] - at["needle_end"]
    return PasskeyPrompt(
        text=text,
        tokens=torch.tensor(ids, dtype=torch.long),
        passkey=passkey,
        depth=float(depth),
        target_len=int(length),
        n_filler=lo,
        n_before=k,
        needle_start=at["needle"],
        token_depth=before / (before + after) if before + after > 0 else float(depth),
    )


# --------------------------------------------------------------------------------------------
# greedy decoding
# --------------------------------------------------------------------------------------------
def greedy_continuation(
    model: Any,
    tokens: Int[Tensor, " pos"],
    max_new_tokens: int = 8,
    *,
    prefill_chunk: int | None = 256,
    cache: bool = True,
    stop_after_number: bool = True,
    path: str = "auto",
) -> list[int]:
    """Greedy (argmax) continuation of ``tokens`` for up to ``max_new_tokens`` tokens.

    On a bridge with ``cache`` the prompt is prefilled in chunks of ``prefill_chunk`` tokens (None:
    one forward) into HF's key/value cache and then decoded a token at a time; otherwise (or for any
    other model: an HF causal LM, or a callable taking ``input_ids`` and returning logits) every
    step is a full forward. ``path`` (:func:`ropelens.run.evaluate.loss_path`): by default a bridge
    decodes as its HF model with sdpa attention, every RoPE variant and plane ablation in force
    applied where it rotates (:func:`ropelens.backends.sdpa.on_sdpa`), so long prompts need memory
    linear in their length; the bridge where that cannot be. Stops early at EOS and, with
    ``stop_after_number``, once a whole number has been written.
    """
    model = running_model(model)  # an nnsight model: the HF model it wraps
    max_new_tokens = check_number(max_new_tokens, "max_new_tokens", at_least=1, integer=True)
    if prefill_chunk is not None:
        prefill_chunk = check_number(
            prefill_chunk,
            "prefill_chunk",
            at_least=1,
            integer=True,
            hint=" (tokens per prefill forward; None for one forward)",
        )
    if tokens.ndim != 1 or tokens.numel() < 1:
        raise InputError(
            f"tokens must be a non-empty 1-D token tensor, got shape {tuple(tokens.shape)}"
        )
    tok = getattr(model, "tokenizer", None)
    eos = getattr(tok, "eos_token_id", None)
    seq = tokens.long().to(device_of(model))[None]
    out: list[int] = []
    with (
        torch.no_grad(),
        backend_of(model).decoding(loss_path(model, path), cache, prefill_chunk) as (step, _),
    ):
        logits = step(seq, seq)
        for i in range(max_new_tokens):
            nxt = int(logits.argmax())
            out.append(nxt)
            if nxt == eos or i == max_new_tokens - 1:
                break
            if stop_after_number and tok is not None and _DONE.search(tok.decode(out)):
                break
            new = torch.tensor([[nxt]], device=seq.device)
            seq = torch.cat([seq, new], dim=1)
            logits = step(new, seq)
    return out


# --------------------------------------------------------------------------------------------
# results
# --------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class PasskeyTrial:
    """One prompt's outcome."""

    length: int  # target length in tokens
    depth: float
    trial: int
    passkey: str
    n_tokens: int  # the prompt's actual length (≤ length)
    token_depth: float
    response: str
    answer: str | None  # first integer of the response
    correct: bool

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclass(frozen=True)
class PasskeyRetrieval(Result, previous_kinds=("PasskeyResult",)):
    """Passkey retrieval accuracy over depths × lengths, with every trial's prompt size and answer.

    What :func:`passkey_retrieval` returns. :meth:`accuracy` gives the ``[depth, length]`` grid of
    accuracies, :meth:`to_frame` one row per cell, :meth:`trials_frame` one row per trial, and
    :meth:`merge` joins results of other lengths, depths or trials of the same model and variant.

    Attributes:
        lengths (tuple[int, ...]): Target prompt sizes in tokens.
        depths (tuple[float, ...]): Fractions of the filler before the passkey, in [0, 1].
        trials (tuple[PasskeyTrial, ...]): Every trial: its length, depth, trial index, passkey,
            actual prompt size ``n_tokens`` (≤ length), depth in tokens, response, the first integer
            of the response and whether it is the passkey.
        provenance (Provenance): Model, grid, seed, RoPE variant, decoding path and the harness's
            filler and question.

    Raises:
        InputError: When a trial lies outside the ``lengths`` × ``depths`` grid.

    Examples:
        >>> from ropelens.analyses import passkey_retrieval
        >>> from ropelens.testing import tiny_model
        >>> model = tiny_model("llama")
        >>> result = passkey_retrieval(model, [250], depths=[0.1, 0.9], n_trials=1, progress=False)
        >>> result.accuracy().shape  # [depth, length]
        (2, 1)
        >>> list(result.to_frame().columns)
        ['depth', 'length', 'n_trials', 'n_correct', 'accuracy', 'mean_tokens']
        >>> len(result.trials_frame())
        2
    """

    lengths: tuple[int, ...]
    depths: tuple[float, ...]
    trials: tuple[PasskeyTrial, ...]
    provenance: Provenance

    def __post_init__(self) -> None:
        cells = {(t.length, t.depth) for t in self.trials}
        stray = cells - {(L, d) for L in self.lengths for d in self.depths}
        if stray:
            raise InputError(
                f"trials at (length, depth) {sorted(stray)} are outside the result's grid"
            )

    @property
    def variant(self) -> dict[str, Any] | None:
        """The RoPE variant the model ran under (``RopeVariant.to_dict()``), or None."""
        return self.provenance.config.get("variant")

    def _cell(self, length: int, depth: float) -> list[PasskeyTrial]:
        return [t for t in self.trials if t.length == length and t.depth == depth]

    def accuracy(self) -> np.ndarray:
        """Fraction of trials answered correctly, ``[depth, length]`` (NaN where a cell has no
        trials)."""
        acc = np.full((len(self.depths), len(self.lengths)), np.nan)
        for i, d in enumerate(self.depths):
            for j, L in enumerate(self.lengths):
                cell = self._cell(L, d)
                if cell:
                    acc[i, j] = np.mean([t.correct for t in cell])
        return acc

    def mean_accuracy(self) -> float:
        """Accuracy over all trials."""
        return float(np.mean([t.correct for t in self.trials])) if self.trials else float("nan")

    def to_frame(self) -> pd.DataFrame:
        """One row per (depth, length): accuracy, trials, correct ones and the mean prompt size."""
        rows = []
        for d in self.depths:
            for L in self.lengths:
                cell = self._cell(L, d)
                rows.append(
                    {
                        "depth": d,
                        "length": L,
                        "n_trials": len(cell),
                        "n_correct": sum(t.correct for t in cell),
                        "accuracy": np.mean([t.correct for t in cell]) if cell else np.nan,
                        "mean_tokens": np.mean([t.n_tokens for t in cell]) if cell else np.nan,
                    }
                )
        return pd.DataFrame(rows)

    def trials_frame(self) -> pd.DataFrame:
        """One row per trial."""
        return pd.DataFrame([t.to_dict() for t in self.trials])

    def merge(self, other: PasskeyRetrieval) -> PasskeyRetrieval:
        """Both results' trials on the union of their grids (same model, seed and variant)."""
        if not isinstance(other, PasskeyRetrieval):
            raise TypeError(f"can only merge PasskeyRetrieval, got {type(other).__name__}")
        keys = ("seed", "variant", "max_new_tokens")
        a, b = self.provenance, other.provenance
        if a.model != b.model or any(a.config.get(k) != b.config.get(k) for k in keys):
            raise InputError(
                f"can only merge passkey results of the same model and {', '.join(keys)}"
            )
        mine = {(t.length, t.depth, t.trial) for t in self.trials}
        dup = sorted(mine & {(t.length, t.depth, t.trial) for t in other.trials})
        if dup:
            raise InputError(
                f"both results hold trials {dup[:3]}: merge results of different lengths, "
                "depths or trials"
            )
        prov = dataclasses.replace(
            a.merged(b, n_ctx=max(a.n_ctx or 0, b.n_ctx or 0) or None),
            config={
                **a.config,
                "lengths": sorted({*self.lengths, *other.lengths}),
                "depths": sorted({*self.depths, *other.depths}),
            },
        )
        return PasskeyRetrieval(
            lengths=tuple(sorted({*self.lengths, *other.lengths})),
            depths=tuple(sorted({*self.depths, *other.depths})),
            trials=self.trials + other.trials,
            provenance=prov,
        )

    # ---------------------------------------------------------------- persistence
    def _repr_text(self) -> str:
        return f"PasskeyRetrieval({self.provenance.model}, accuracy {self.mean_accuracy():.2f})"


def _check_list(values: Any, what: str, **bounds: Any) -> tuple:
    if isinstance(values, (int, float)) and not isinstance(values, bool):
        values = [values]
    try:
        items = list(values)
    except TypeError:
        raise InputError(f"{what} must be a list of numbers, got {values!r}") from None
    if not items:
        raise InputError(f"{what} is empty: pass at least one")
    out = tuple(check_number(v, f"each of {what}", **bounds) for v in items)
    if len(set(out)) != len(out):
        raise InputError(f"{what} has repeated entries: {list(out)}")
    return out


def passkey_retrieval(
    model,
    lengths: Sequence[int] | int,
    depths: Sequence[float] | float = (0.1, 0.5, 0.9),
    n_trials: int = 3,
    seed: int = 0,
    variant: RopeVariant | None = None,
    *,
    max_new_tokens: int = 8,
    prefill_chunk: int | None = 256,
    note: str | None = None,
    progress: bool = True,
    path: str = "auto",
) -> PasskeyRetrieval:
    """Passkey retrieval accuracy at every (depth, length), ``n_trials`` passkeys per cell.

    The YaRN / LongRoPE harness: a 5-digit passkey hidden in filler text at a chosen depth, asked
    back at the end; the model continues greedily and is right when the first integer of its answer
    is the passkey. Trial t uses :func:`make_passkey` ``(seed, t)`` at every cell, so cells differ
    only in what the grid varies. Other interventions
    (``ropelens.analyses.massive_values.replace_massive``, ``ablate_planes``) can be applied around
    the call; ``note`` records them in the provenance.

    Args:
        model: The model: what :func:`ropelens.load_model` or :func:`ropelens.testing.tiny_model`
            returns, or an nnsight ``LanguageModel``; it needs a ``.tokenizer``.
        lengths (Sequence[int] | int): Prompt sizes in tokens (each prompt is the longest that fits;
            the bare task, needle and question must fit).
        depths (Sequence[float] | float): Fractions of the filler before the passkey, in [0, 1]
            (default 0.1, 0.5 and 0.9).
        n_trials (int): Passkeys per cell (default 3).
        seed (int): Seed of the passkeys (default 0).
        variant (RopeVariant | None): Run the whole grid under this RoPE variant
            (:func:`ropelens.run.intervene.apply_rope_variant`; e.g. ``YaRN(2.0, 8192)``), or None
            (default) for the model as it is.
        max_new_tokens (int): Tokens decoded per answer at most (default 8).
        prefill_chunk (int | None): Prompt tokens prefilled into the key/value cache per forward
            (default 256; None: all at once). Variants whose rotation depends on the input's length
            (dynamic NTK, LongRoPE) decode with full forwards instead.
        note (str | None): A note for the provenance, e.g. the intervention applied around the call.
        progress (bool): A progress bar over the prompts (default True).
        path (str): The forward decoding runs on, as :func:`greedy_continuation` takes it (default
            ``"auto"``: the HF sdpa forward, the bridge where it cannot be).

    Returns:
        PasskeyRetrieval: Every trial's prompt size, response and correctness on the ``lengths`` ×
        ``depths`` grid; ``accuracy()`` is ``[depth, length]``.

    Raises:
        InputError: When ``lengths`` or ``depths`` is empty, repeated or out of range, a length is
            too short for the bare prompt, ``variant`` is not a RoPE variant, the model has no
            tokenizer, or the longest prompt does not fit in memory.

    Examples:
        >>> from ropelens.analyses import passkey_retrieval
        >>> from ropelens.testing import tiny_model
        >>> model = tiny_model("llama")
        >>> result = passkey_retrieval(model, [250], depths=[0.1, 0.9], n_trials=1, progress=False)
        >>> result.lengths, result.depths
        ((250,), (0.1, 0.9))
        >>> [t.n_tokens <= 250 for t in result.trials]
        [True, True]
        >>> passkey_retrieval(model, [100], progress=False)
        Traceback (most recent call last):
            ...
        ropelens.errors.InputError: length 100 is too short: ...
    """
    model = running_model(model)  # an nnsight model: the HF model it wraps
    backend = backend_of(model)
    lengths = _check_list(lengths, "lengths", at_least=2, integer=True)
    depths = _check_list(depths, "depths", at_least=0, at_most=1)
    n_trials = check_number(n_trials, "n_trials", at_least=1, integer=True)
    seed = check_number(seed, "seed", integer=True)
    if variant is not None:
        try:
            check_variant(variant)
        except TypeError as e:
            raise InputError(f"variant: {e}; or None for the model as it is") from None
    if getattr(model, "tokenizer", None) is None:
        raise InputError(
            f"{type(model).__name__} has no .tokenizer: pass a model from ropelens.load_model"
        )
    require_memory(
        forward_bytes(model, max(lengths)),
        f"a passkey prompt of {max(lengths):,} tokens",
        "pass shorter lengths",
        device_of(model),
    )
    # A rotation that depends on the input's length must see the whole input at once.
    exact = isinstance(variant, (DynamicNTK, LongRoPE))
    grid = [
        (length, depth, trial)
        for length in lengths
        for depth in depths
        for trial in range(n_trials)
    ]
    started = time.perf_counter()
    with contextlib.nullcontext() if variant is None else apply_rope_variant(model, variant):
        forward = loss_path(model, path)
        trials = _run_trials(
            model,
            grid,
            seed,
            max_new_tokens=max_new_tokens,
            exact=exact,
            prefill_chunk=prefill_chunk,
            path=path,
            progress=progress,
        )
    provenance = Provenance(
        **placement(model),
        model=backend.label,
        corpus="passkey filler",
        n_tokens=sum(trial.n_tokens for trial in trials),
        n_windows=len(trials),
        n_ctx=max(lengths),
        config={
            "lengths": list(lengths),
            "depths": list(depths),
            "n_trials": n_trials,
            "seed": seed,
            "variant": None if variant is None else variant.to_dict(),
            "variant_name": None if variant is None else variant.name,
            "max_new_tokens": max_new_tokens,
            "prefill_chunk": None if exact else prefill_chunk,
            "cached_decoding": not exact and forward != "hf",
            "forward": forward,
            "note": note,
            "filler": FILLER,
            "question": QUESTION,
        },
        seconds=time.perf_counter() - started,
    )
    return PasskeyRetrieval(
        lengths=lengths, depths=depths, trials=tuple(trials), provenance=provenance
    )


def _run_trials(
    model,
    grid: Sequence[tuple[int, float, int]],
    seed: int,
    *,
    max_new_tokens: int,
    exact: bool,
    prefill_chunk: int | None,
    path: str,
    progress: bool,
) -> list[PasskeyTrial]:
    """One scored greedy answer per (length, depth, trial) of ``grid``.

    ``exact``: the whole prompt in one forward and no cache (a rotation that depends on the
    input's length).
    """
    trials = []
    for length, depth, trial in tqdm(grid, desc="passkey", disable=not progress, unit="prompt"):
        prompt = passkey_prompt(model.tokenizer, length, depth, make_passkey(seed, trial))
        ids = greedy_continuation(
            model,
            prompt.tokens,
            max_new_tokens,
            cache=not exact,
            prefill_chunk=None if exact else prefill_chunk,
            path=path,
        )
        response = model.tokenizer.decode(ids)
        answer, correct = score_answer(response, prompt.passkey)
        trials.append(
            PasskeyTrial(
                length=length,
                depth=depth,
                trial=trial,
                passkey=prompt.passkey,
                n_tokens=prompt.n_tokens,
                token_depth=prompt.token_depth,
                response=response,
                answer=answer,
                correct=correct,
            )
        )
    return trials
