"""Passkey retrieval under RoPE variants: ``passkey_retrieval`` and ``ropelens
passkey-retrieval``."""

from __future__ import annotations

import argparse

from ropelens.analyses.passkey_retrieval import PasskeyRetrieval, passkey_retrieval
from ropelens.analyses.registry import Analysis, draw
from ropelens.cli.common import (
    Command,
    ModelOptions,
    OutputOptions,
    load_from_args,
    non_negative_int,
    number_list,
    positive_int,
)
from ropelens.cli.variant_syntax import parse_variant, variant_help
from ropelens.plots.passkey_retrieval import passkey_figure
from ropelens.validate import check_number


def options(p: argparse.ArgumentParser) -> None:
    """``ropelens passkey-retrieval [MODEL]``: passkey retrieval accuracy by length and depth,
    optionally under a variant."""
    ModelOptions.add_to(p, taken=("variant", "variant_layers"))  # its own --variant below
    p.add_argument(
        "--lengths",
        default="1024",
        metavar="N,N,...",
        help="prompt lengths in tokens (default: 1024)",
    )
    p.add_argument(
        "--depths",
        default="0.1,0.5,0.9",
        metavar="F,F,...",
        help="passkey depths (default: 0.1,0.5,0.9)",
    )
    p.add_argument(
        "--trials",
        type=positive_int,
        default=3,
        metavar="N",
        help="passkeys per (length, depth) (default: 3)",
    )
    p.add_argument(
        "--seed",
        type=non_negative_int,
        default=0,
        metavar="N",
        help="seed of the passkeys (default: 0)",
    )
    p.add_argument("--variant", default=None, metavar="SPEC", help=variant_help())
    OutputOptions.add_to(p, save="PasskeyRetrieval JSON")


def run(args: argparse.Namespace) -> int:
    """Passkey retrieval accuracy over lengths x depths (optionally under a RoPE variant)

    Hide a random 5-digit passkey in filler text at each depth, ask it back at the end, decode
    greedily and score the first number (the YaRN/LongRoPE harness); seeded.
    """
    lengths = number_list(args.lengths, int, "--lengths", example="1024,4096")
    depths = number_list(args.depths, float, "--depths", example="0.1,0.5,0.9")
    for (
        n
    ) in lengths:  # the model-specific minimum (the prompt's own tokens) is checked once it loads
        check_number(
            n, "each of --lengths", at_least=2, integer=True, hint=": pass prompt lengths in tokens"
        )
    for d in depths:
        check_number(
            d,
            "each of --depths",
            at_least=0,
            at_most=1,
            hint=": pass fractions of the prompt, 0 (start) to 1 (end), e.g. --depths 0.1,0.5,0.9",
        )
    variant = parse_variant(args.variant) if args.variant else None
    output = OutputOptions.from_args(args)
    output.check()
    r = passkey_retrieval(
        load_from_args(args),
        lengths,
        depths,
        n_trials=args.trials,
        seed=args.seed,
        variant=variant,
        progress=output.progress,
    )
    output.save_result(r)
    frame = r.to_frame()
    if output.json:
        return output.emit({"mean_accuracy": r.mean_accuracy(), "cells": frame.to_dict("records")})
    print(frame.to_string(index=False, float_format="%.3f"))
    print(f"mean accuracy {r.mean_accuracy():.3f}")
    return 0


ANALYSIS = Analysis(
    "passkey-retrieval",
    passkey_retrieval,
    PasskeyRetrieval,
    draw(PasskeyRetrieval, figure=passkey_figure),
    Command("passkey-retrieval", run, options),
    summary="Whether the model recalls a passkey hidden at each depth of long prompts, under "
    "RoPE variants.",
)
