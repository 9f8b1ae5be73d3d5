"""Retrieval heads (Wu et al. 2024) and what their lowest-frequency planes do for passkey recall
(Bayram 2026).

*Score.* A head is a retrieval head when, while the model copies the needle into its answer, its
most attended key is the needle token being copied. ropelens measures this teacher-forced on the
passkey harness (:mod:`ropelens.analyses.passkey_retrieval`): one forward over the prompt followed
by the correct answer (`` 12345``), run on the HF model the bridge wraps
(:func:`ropelens.backends.sdpa_capture.hf_view`) with eager attention, whose attention modules hand
back their probabilities, and with every RoPE variant and plane ablation in force applied where it
rotates (the scores are those of the model as it runs); a hook keeps only the rows of the queries
that predict a passkey token. For the answer token at index i (one holding a digit) the query is
the position before it and its sources are the positions of the same token in every occurrence of
the answer's tokens inside the needle (the needle holds the passkey twice). A head's score is the
fraction of those copy steps, over all prompts, whose argmax key is a source. Wu et al. decode and
count a step only when the generated token is the attended one; teacher forcing counts every step
of the correct answer, the same steps where the model answers right.

*Ablation.* In the ``top_k`` highest-scoring heads the lowest-frequency quarter of the rotary planes
(Bayram's 32 of 128 dims; smallest ``inv_freq``) is zeroed in q and k
(:func:`ropelens.run.intervene.ablate_planes` per head, so exactly those heads lose those planes'
logit terms), against a control of as many planes drawn at random per head (seeded) in the same
heads; passkey recall is measured under each, on passkeys not used for scoring.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
import torch
from jaxtyping import Float, Int
from torch import Tensor

from ropelens.analyses.passkey_retrieval import (
    PasskeyPrompt,
    PasskeyRetrieval,
    make_passkey,
    passkey_prompt,
    passkey_retrieval,
)
from ropelens.backends import backend_of
from ropelens.backends.hf import attention_modules
from ropelens.backends.sdpa import on_sdpa
from ropelens.backends.sdpa_capture import attention_implementation, hf_view
from ropelens.devices import device_of, require_memory
from ropelens.errors import InputError, UnsupportedModelError
from ropelens.results.findings import Finding, head_name
from ropelens.results.provenance import Provenance, placement
from ropelens.results.result import Result
from ropelens.run.intervene import ablate_planes
from ropelens.run.memory import eager_forward_bytes
from ropelens.run.verify import verification
from ropelens.spec.plan import active_plan
from ropelens.spec.reading import model_label, rope_spec
from ropelens.spec.rope import RopeSpec
from ropelens.spec.rotary_state import rotary_state_kept
from ropelens.spec.surface import running_model
from ropelens.validate import check_number

__all__ = [
    "CONDITIONS",
    "CopyCase",
    "RetrievalHeads",
    "ablate_head_planes",
    "argmax_keys",
    "copy_case",
    "copy_scores",
    "lowest_planes",
    "random_planes",
    "retrieval_heads",
    "retrieval_scores",
]

CONDITIONS = ("base", "lowest band", "random planes")
RECALL_SEED_OFFSET = 1000  # recall passkeys are drawn under seed + this: held out from scoring


# --------------------------------------------------------------------------------------------
# copy steps and scores
# --------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class CopyCase:
    """One teacher-forced prompt: prompt + answer tokens, the query predicting each copied answer
    token and that token's source positions in the needle."""

    tokens: Int[Tensor, " pos"]
    queries: tuple[int, ...]
    sources: tuple[tuple[int, ...], ...]


def copy_case(tokenizer: Any, prompt: PasskeyPrompt) -> CopyCase:
    """The copy steps of answering ``prompt`` with `` <passkey>``: every answer token holding a
    digit."""
    tok = getattr(tokenizer, "tokenizer", None) or tokenizer
    answer = list(tok(" " + prompt.passkey, add_special_tokens=False)["input_ids"])
    ids = prompt.tokens.tolist()
    n, m = len(ids), len(answer)
    starts = [o for o in range(prompt.needle_start, n - m + 1) if ids[o : o + m] == answer]
    if not starts:
        raise InputError(
            f"the answer tokens of passkey {prompt.passkey} do not occur in the needle as "
            "tokenized in the prompt: this tokenizer splits the number differently in context"
        )
    queries, sources = [], []
    for i, t in enumerate(answer):
        if any(c.isdigit() for c in tok.decode([t])):
            queries.append(n + i - 1)  # the position whose next-token prediction is answer[i]
            sources.append(tuple(o + i for o in starts))
    return CopyCase(
        tokens=torch.tensor(ids + answer, dtype=torch.long),
        queries=tuple(queries),
        sources=tuple(sources),
    )


def argmax_keys(
    model, tokens: Int[Tensor, " pos"], queries: Sequence[int]
) -> Int[Tensor, "layer head query"]:
    """The most attended key of every head at each of ``queries``, from one eager forward over
    ``tokens``, with every RoPE variant, plane ablation and massive-value replacement in force on
    ``model`` applied where it rotates (as :func:`ropelens.run.evaluate.window_losses` runs it)."""
    hf = hf_view(model)
    attns = attention_modules(hf)
    if not attns or any(a is None for a in attns):
        raise UnsupportedModelError(
            f"{type(hf).__name__}: a decoder layer has no softmax self-attention module, and "
            "retrieval scores read every layer's attention probabilities"
        )
    rows = torch.tensor(list(queries), dtype=torch.long)
    got: dict[int, Tensor] = {}

    def keep(i: int):
        def hook(_module, _args, out) -> None:
            w = out[1] if isinstance(out, tuple) and len(out) > 1 else None
            if isinstance(w, Tensor) and w.ndim == 4:
                got[i] = w[0][:, rows.to(w.device)].argmax(-1).cpu()

        return hook

    handles = [a.register_forward_hook(keep(i)) for i, a in enumerate(attns)]
    try:
        with (
            _interventions_applied(model) as hf,
            attention_implementation(hf, "eager"),
            torch.no_grad(),
            rotary_state_kept(model),
        ):
            hf(input_ids=tokens.long().to(device_of(model))[None], use_cache=False)
    finally:
        for h in handles:
            h.remove()
    if len(got) != len(attns):
        raise UnsupportedModelError(
            f"{type(hf).__name__}: eager attention returned probabilities in "
            f"{len(got)} of {len(attns)} layers"
        )
    return torch.stack([got[i] for i in range(len(attns))])


@contextlib.contextmanager
def _interventions_applied(model) -> Iterator[torch.nn.Module]:
    """The HF model under ``model`` with the interventions in force on it applied in its forward,
    tapped at the rotation (:func:`ropelens.backends.sdpa.on_sdpa`)."""
    if not active_plan(model):
        yield hf_view(model)
        return
    if backend_of(model).loss_path() != "sdpa":
        raise UnsupportedModelError(
            "retrieval scores read the HF model's eager attention, and the interventions in force "
            "cannot run there (another hook is on the bridge, or the family rotates where "
            "ropelens cannot tap it): measure them without the intervention"
        )
    with on_sdpa(model) as hf:
        yield hf


def copy_scores(
    argmax: Int[Tensor, "layer head query"], sources: Sequence[Sequence[int]]
) -> Int[Tensor, "layer head"]:
    """How many copy steps each head's argmax key lands on a source of the token being copied."""
    if argmax.shape[-1] != len(sources):
        raise InputError(f"{argmax.shape[-1]} argmax rows for {len(sources)} copy steps")
    hits = torch.zeros(argmax.shape[:2], dtype=torch.long)
    for j, src in enumerate(sources):
        hits += torch.isin(argmax[..., j], torch.tensor(list(src), dtype=argmax.dtype)).long()
    return hits


def _require_eager_room(model, spec: RopeSpec, lengths: Sequence[int]) -> None:
    """Refuse, before the first forward, prompts whose eager attention (one layer's
    ``[head, n, n]`` probabilities at a time) the device has not the memory for."""
    longest = max((L for L in lengths if isinstance(L, int) and not isinstance(L, bool)), default=0)
    if longest <= 0:
        return  # no length to measure: passkey_prompt refuses them by name
    dtype = next((p.dtype for p in model.parameters() if p.is_floating_point()), torch.float32)
    require_memory(
        eager_forward_bytes(spec, range(len(spec.layers)), 1, longest, dtype),
        f"the eager forward of a {longest:,}-token prompt (retrieval scores read every layer's "
        f"[head, {longest}, {longest}] attention probabilities)",
        f"pass shorter prompt lengths (the longest is {longest:,} tokens now)",
        device_of(model),
    )


def retrieval_scores(
    model,
    lengths: Sequence[int] = (256, 512),
    depths: Sequence[float] = (0.25, 0.75),
    n_trials: int = 2,
    seed: int = 0,
) -> tuple[Float[Tensor, "layer head"], int]:
    """Every head's retrieval score over the passkey grid, and the number of copy steps it
    averages."""
    hits, steps = None, 0
    for L in lengths:
        for d in depths:
            for t in range(n_trials):
                case = copy_case(
                    model.tokenizer, passkey_prompt(model.tokenizer, L, d, make_passkey(seed, t))
                )
                h = copy_scores(argmax_keys(model, case.tokens, case.queries), case.sources)
                hits = h if hits is None else hits + h
                steps += len(case.queries)
    if hits is None or steps == 0:
        raise InputError("no copy steps: pass at least one length, depth and trial")
    return hits.double() / steps, steps


# --------------------------------------------------------------------------------------------
# plane choice and ablation
# --------------------------------------------------------------------------------------------
def lowest_planes(inv_freq: Tensor, fraction: float = 0.25) -> list[int]:
    """The ``round(fraction · n)`` planes with the smallest frequencies (ties: the later plane
    first)."""
    n = int(inv_freq.numel())
    k = int(round(fraction * n))
    order = sorted(range(n), key=lambda i: (float(inv_freq[i]), -i))
    return sorted(order[:k])


def random_planes(
    n_planes: int, k: int, heads: Sequence[tuple[int, int]], seed: int
) -> dict[tuple[int, int], list[int]]:
    """``k`` of ``n_planes`` planes drawn without replacement for each head, one seeded generator in
    head order."""
    rng = np.random.default_rng(seed)
    return {hd: sorted(int(p) for p in rng.choice(n_planes, size=k, replace=False)) for hd in heads}


@contextlib.contextmanager
def ablate_head_planes(model, planes: dict[tuple[int, int], Sequence[int]]) -> Iterator[None]:
    """Zero each ``(layer, head)``'s own planes of its rotated q and k while the block runs."""
    model = running_model(model)  # an nnsight model: the HF model it wraps
    with contextlib.ExitStack() as stack:
        for (L, h), ps in planes.items():
            if len(ps):
                stack.enter_context(ablate_planes(model, list(ps), layers=[L], heads=[h]))
        yield


# --------------------------------------------------------------------------------------------
# result
# --------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class RetrievalHeads(Result):
    """Retrieval scores per head, the ablated heads and their planes, and passkey recall.

    What :func:`retrieval_heads` returns (Wu et al. 2024; Bayram 2026). :meth:`n_retrieval` counts
    the heads scoring at least ``threshold``, :meth:`heads_frame` gives one row per head,
    :meth:`to_frame` recall per condition and prompt length, and :meth:`findings` both in words.

    Attributes:
        scores (Tensor): Retrieval score per ``[layer, head]``: the fraction of copy steps whose
            most attended key is the needle token being copied, in [0, 1].
        n_steps (int): Copy steps the scores are over (all prompts together).
        threshold (float): The score from which a head counts as a retrieval head.
        heads (tuple[tuple[int, int], ...]): The ablated ``(layer, head)`` pairs, highest score
            first.
        band (dict[tuple[int, int], tuple[int, ...]]): Per ablated head, its lowest-frequency planes
            (the ones zeroed in the ``"lowest band"`` condition).
        control (dict[tuple[int, int], tuple[int, ...]]): Per ablated head, as many planes drawn at
            random (seeded; the ``"random planes"`` condition).
        recall (dict[str, PasskeyRetrieval]): Passkey recall on held-out passkeys per condition:
            ``"base"``, ``"lowest band"`` and ``"random planes"``.
        provenance (Provenance): Model, grid, settings, the scoring method and the verification.

    Raises:
        InputError: When ``recall`` does not hold exactly the three conditions.

    Examples:
        >>> from ropelens.analyses import retrieval_heads
        >>> from ropelens.testing import tiny_model
        >>> model = tiny_model("llama")
        >>> found = retrieval_heads(model, lengths=[250], depths=[0.5], n_trials=1, top_k=2)
        >>> found.n_retrieval() <= found.scores.numel()
        True
        >>> found.to_frame()["condition"].tolist()
        ['base', 'lowest band', 'random planes']
        >>> len(found.heads_frame())  # one row per head
        8
    """

    scores: Float[Tensor, "layer head"]
    n_steps: int
    threshold: float
    heads: tuple[tuple[int, int], ...]  # ablated, highest score first
    band: dict[tuple[int, int], tuple[int, ...]]
    control: dict[tuple[int, int], tuple[int, ...]]
    recall: dict[str, PasskeyRetrieval]
    provenance: Provenance

    def __post_init__(self) -> None:
        if set(self.recall) != set(CONDITIONS):
            raise InputError(
                f"recall must hold the conditions {list(CONDITIONS)}, got {sorted(self.recall)}"
            )

    def n_retrieval(self) -> int:
        """Heads scoring at least the threshold."""
        return int((self.scores >= self.threshold).sum())

    def to_frame(self) -> pd.DataFrame:
        """Recall per condition and prompt length."""
        rows = []
        for c in CONDITIONS:
            tf = self.recall[c].trials_frame()
            for L, g in tf.groupby("length"):
                rows.append(
                    {
                        "condition": c,
                        "length": int(L),
                        "n_trials": len(g),
                        "recall": float(g["correct"].mean()),
                    }
                )
        return pd.DataFrame(rows)

    def heads_frame(self) -> pd.DataFrame:
        """One row per head: its score, and whether it was ablated."""
        chosen = set(self.heads)
        return pd.DataFrame(
            [
                {
                    "layer": L,
                    "head": h,
                    "score": float(self.scores[L, h]),
                    "ablated": (L, h) in chosen,
                }
                for L in range(self.scores.shape[0])
                for h in range(self.scores.shape[1])
            ]
        )

    def findings(self) -> list[Finding]:
        """How many retrieval heads, and recall with their lowest band or random planes zeroed."""
        acc = {c: self.recall[c].mean_accuracy() for c in CONDITIONS}
        top = ", ".join(
            f"{head_name(L, h)} {float(self.scores[L, h]):.2f}" for L, h in self.heads[:5]
        )
        n_planes = len(next(iter(self.band.values()), ()))
        vals = {
            "n_retrieval": self.n_retrieval(),
            "n_heads": int(self.scores.numel()),
            "threshold": self.threshold,
            "n_steps": self.n_steps,
            **{c.replace(" ", "_"): round(v, 3) for c, v in acc.items()},
        }
        return [
            Finding(
                "retrieval-0",
                "retrieval-heads",
                f"{vals['n_retrieval']} of {vals['n_heads']} heads have a retrieval score ≥ "
                f"{self.threshold:g} over {self.n_steps} copy steps; the highest: {top}.",
                vals,
            ),
            Finding(
                "retrieval-1",
                "retrieval-heads",
                f"Zeroing the {n_planes} lowest-frequency planes in the top {len(self.heads)} "
                f"heads takes passkey recall from {acc['base']:.2f} to {acc['lowest band']:.2f}; "
                f"{n_planes} random planes per head leave {acc['random planes']:.2f}.",
                vals,
            ),
        ]

    # ---------------------------------------------------------------- persistence
    def _repr_text(self) -> str:
        return f"RetrievalHeads({self.provenance.model}, {self.n_retrieval()} retrieval heads)"


def retrieval_heads(
    model,
    lengths: Sequence[int] = (256, 512),
    depths: Sequence[float] = (0.25, 0.75),
    n_trials: int = 2,
    seed: int = 0,
    *,
    top_k: int = 16,
    threshold: float = 0.1,
    fraction: float = 0.25,
    progress: bool = False,
    verify: bool = True,
) -> RetrievalHeads:
    """Score every head for retrieval, then measure passkey recall with its lowest planes zeroed.

    After Wu et al. (2024, retrieval heads) and Bayram (2026): a head's retrieval score is the
    fraction of copy steps (teacher-forced on the passkey harness, eager HF attention) whose most
    attended key is the needle token being copied. In the ``top_k`` highest-scoring rotary heads the
    lowest-frequency ``fraction`` of planes is zeroed in q and k
    (:func:`ropelens.run.intervene.ablate_planes` per head), against a control of as many planes
    drawn at random per head (seeded) in the same heads; passkey recall is measured unmodified and
    under each, on passkeys not used for scoring (seed + 1000).

    Args:
        model: The model: what :func:`ropelens.load_model` or :func:`ropelens.testing.tiny_model`
            returns, or an nnsight ``LanguageModel``; it needs a ``.tokenizer``.
        lengths (Sequence[int]): Passkey prompt sizes in tokens (default 256 and 512).
        depths (Sequence[float]): Fractions of the filler before the passkey (default 0.25 and
            0.75).
        n_trials (int): Passkeys per (length, depth) cell, for scoring and for each recall condition
            (default 2).
        seed (int): Seed of the passkeys and the random control planes (default 0).
        top_k (int): Heads to ablate, highest score first (default 16); past the model's rotary
            heads it takes all of them, and the provenance records the count used.
        threshold (float): The score in [0, 1] from which a head counts as a retrieval head (default
            0.1).
        fraction (float): The share of each head's planes zeroed, lowest frequencies first, in [0,
            1] (default 0.25: Bayram's 32 of 128 dims).
        progress (bool): Progress bars over the prompts (default False).
        verify (bool): First check that the RoPE reading reproduces the model's own attention
            (default True; the ablations zero the planes that reading names).

    Returns:
        RetrievalHeads: The scores ``[layer, head]``, the ablated heads and their planes, and
        passkey recall per condition.

    Raises:
        InputError: When a setting is out of range or the model has no tokenizer.
        UnsupportedModelError: When ``verify`` finds that the RoPE reading does not reproduce the
            model's own attention, or the ablated heads have different plane counts.

    Examples:
        >>> from ropelens.analyses import retrieval_heads
        >>> from ropelens.testing import tiny_model
        >>> model = tiny_model("llama")
        >>> found = retrieval_heads(model, lengths=[250], depths=[0.5], n_trials=1, top_k=2)
        >>> tuple(found.scores.shape), found.heads
        ((2, 4), ((0, 0), (0, 1)))
        >>> found.band  # the lowest quarter of 8 planes
        {(0, 0): (6, 7), (0, 1): (6, 7)}
    """
    model = running_model(model)  # an nnsight model: the HF model it wraps
    top_k = check_number(top_k, "top_k", at_least=1, integer=True, hint=" (heads to ablate)")
    threshold = check_number(threshold, "threshold", at_least=0, at_most=1)
    fraction = check_number(
        fraction, "fraction", at_least=0, at_most=1, hint=" (0.25 = Bayram's 32 of 128 dims)"
    )
    n_trials = check_number(n_trials, "n_trials", at_least=1, integer=True)
    seed = check_number(seed, "seed", integer=True)
    if getattr(model, "tokenizer", None) is None:
        raise InputError(
            f"{type(model).__name__} has no .tokenizer: pass a model from ropelens.load_model"
        )
    t0 = time.perf_counter()
    spec = rope_spec(model)
    verified = verification(
        model, spec, verify=verify
    )  # the ablations zero the spec's planes: prove its reading first
    _require_eager_room(model, spec, lengths)
    scores, steps = retrieval_scores(model, lengths, depths, n_trials, seed)
    # past the model's rotary heads: all of them, and the provenance says so
    heads = _top_heads(scores, spec.rotary_layers, top_k)
    top_k = len(heads)
    band, control = _ablated_planes(spec, heads, fraction, seed)
    recall = _recall_under_ablations(
        model, lengths, depths, band, control, n_trials=n_trials, seed=seed, progress=progress
    )
    prov = Provenance(
        **placement(model),
        model=model_label(model),
        corpus="passkey filler",
        n_tokens=steps,
        n_windows=None,
        n_ctx=max(lengths),
        config={
            "lengths": list(lengths),
            "depths": list(depths),
            "n_trials": n_trials,
            "seed": seed,
            "top_k": top_k,
            "threshold": threshold,
            "fraction": fraction,
            "score": "teacher-forced argmax on eager HF attention",
            "verification": verified.to_dict(),
        },
        seconds=time.perf_counter() - t0,
    )
    return RetrievalHeads(
        scores=scores,
        n_steps=steps,
        threshold=threshold,
        heads=heads,
        band=band,
        control=control,
        recall=recall,
        provenance=prov,
    )


def _top_heads(
    scores: Tensor, rotary_layers: Sequence[int], top_k: int
) -> tuple[tuple[int, int], ...]:
    """The ``top_k`` rotary heads by retrieval score (ties: lower layer, then head, first)."""
    n_heads = scores.shape[1]
    ranked = sorted(
        (
            (float(scores[layer, head]), layer, head)
            for layer in set(rotary_layers)
            for head in range(n_heads)
        ),
        key=lambda entry: (-entry[0], entry[1], entry[2]),
    )
    return tuple((layer, head) for _, layer, head in ranked[: min(top_k, len(ranked))])


def _ablated_planes(
    spec, heads: Sequence[tuple[int, int]], fraction: float, seed: int
) -> tuple[dict[tuple[int, int], tuple[int, ...]], dict[tuple[int, int], tuple[int, ...]]]:
    """Per head, its lowest-frequency ``fraction`` of planes, and as many random planes."""
    band = {
        (layer, head): tuple(lowest_planes(spec[layer].inv_freq, fraction)) for layer, head in heads
    }
    counts = {len(planes) for planes in band.values()}
    if len(counts) != 1 or len({spec[layer].n_planes for layer, _ in heads}) != 1:
        raise UnsupportedModelError(
            "the ablated heads have different plane counts: ropelens's random control "
            "draws one count from one plane range"
        )
    n_ablated, n_planes = counts.pop(), spec[heads[0][0]].n_planes
    control = {
        head: tuple(planes)
        for head, planes in random_planes(n_planes, n_ablated, heads, seed).items()
    }
    return band, control


def _recall_under_ablations(
    model,
    lengths: Sequence[int],
    depths: Sequence[float],
    band: dict[tuple[int, int], tuple[int, ...]],
    control: dict[tuple[int, int], tuple[int, ...]],
    *,
    n_trials: int,
    seed: int,
    progress: bool,
) -> dict[str, PasskeyRetrieval]:
    """Passkey recall unmodified, with the lowest band zeroed, and with random planes zeroed."""
    n_ablated, n_heads = len(next(iter(band.values()))), len(band)
    options = {"n_trials": n_trials, "seed": seed + RECALL_SEED_OFFSET, "progress": progress}
    recall = {"base": passkey_retrieval(model, list(lengths), list(depths), **options)}
    with ablate_head_planes(model, band):
        recall["lowest band"] = passkey_retrieval(
            model,
            list(lengths),
            list(depths),
            **options,
            note=f"lowest {n_ablated} planes zeroed in {n_heads} retrieval heads",
        )
    with ablate_head_planes(model, control):
        recall["random planes"] = passkey_retrieval(
            model,
            list(lengths),
            list(depths),
            **options,
            note=f"{n_ablated} random planes zeroed in {n_heads} retrieval heads",
        )
    return recall
