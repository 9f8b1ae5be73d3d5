"""Retrieval heads and their lowest frequencies: ``retrieval_heads`` and ``ropelens
retrieval-heads``."""

from __future__ import annotations

import argparse

from ropelens.analyses.registry import Analysis, draw
from ropelens.analyses.retrieval_heads import RetrievalHeads, retrieval_heads
from ropelens.cli.common import (
    Command,
    ModelOptions,
    OutputOptions,
    load_from_args,
    non_negative_int,
    note,
    number_list,
    positive_int,
)
from ropelens.errors import InputError
from ropelens.plots.retrieval_heads import retrieval_figure


def options(p: argparse.ArgumentParser) -> None:
    """``ropelens retrieval-heads [MODEL]``: retrieval heads, and passkey recall with their lowest
    band zeroed."""
    ModelOptions.add_to(p)
    p.add_argument(
        "--lengths",
        default="256,512",
        metavar="N,N,...",
        help="prompt lengths in tokens (default: 256,512)",
    )
    p.add_argument(
        "--depths",
        default="0.25,0.75",
        metavar="F,F,...",
        help="passkey depths (default: 0.25,0.75)",
    )
    p.add_argument(
        "--trials",
        type=positive_int,
        default=2,
        metavar="N",
        help="passkeys per (length, depth) (default: 2)",
    )
    p.add_argument(
        "--top-k", type=positive_int, default=16, metavar="N", help="heads to ablate (default: 16)"
    )
    p.add_argument(
        "--threshold",
        type=float,
        default=0.1,
        help="retrieval score that counts a head as a retrieval head (default: 0.1)",
    )
    p.add_argument(
        "--seed",
        type=non_negative_int,
        default=0,
        metavar="N",
        help="seed of the passkeys and the random planes (default: 0)",
    )
    OutputOptions.add_to(p, save="RetrievalHeads JSON")


def run(args: argparse.Namespace) -> int:
    """Retrieval heads (Wu et al. 2024) and their lowest-frequency planes (Bayram 2026)

    Scores every head by how often its most attended key is the needle token being copied while the
    answer to a passkey prompt is teacher-forced, then measures passkey recall with the lowest
    quarter of rotary planes zeroed in the top heads, against as many random planes (seeded) in the
    same heads.
    """

    lengths = number_list(args.lengths, int, "--lengths", example="256,512")
    depths = number_list(args.depths, float, "--depths", example="0.25,0.75")
    if not 0 <= args.threshold <= 1:
        raise InputError(
            f"--threshold must lie in [0, 1], got {args.threshold}: e.g. --threshold 0.1"
        )
    output = OutputOptions.from_args(args)
    output.check()
    r = retrieval_heads(
        load_from_args(args),
        lengths,
        depths,
        n_trials=args.trials,
        seed=args.seed,
        top_k=args.top_k,
        threshold=args.threshold,
        progress=output.progress,
    )
    if len(r.heads) < args.top_k:
        note(
            f"--top-k {args.top_k:,} is more than the model's {len(r.heads):,} rotary heads: "
            f"ablated all {len(r.heads):,}"
        )
    return output.save_and_show(
        r,
        r.to_frame(),
        "recall",
        head={"top_k": len(r.heads)},
        tail={
            "heads": [list(h) for h in r.heads],
            "scores": [float(r.scores[L, h]) for L, h in r.heads],
        },
    )


ANALYSIS = Analysis(
    "retrieval-heads",
    retrieval_heads,
    RetrievalHeads,
    draw(RetrievalHeads, figure=retrieval_figure),
    Command("retrieval-heads", run, options),
    summary="Heads that copy the passkey, and passkey recall with their lowest-frequency planes "
    "zeroed.",
)
