"""Positional versus symbolic heads: ``positional_symbolic`` and ``ropelens
positional-symbolic``."""

from __future__ import annotations

import argparse

from ropelens.analyses.positional_symbolic import (
    MIN_KEYS,
    PositionalSymbolic,
    positional_symbolic,
    shortest_window,
)
from ropelens.analyses.registry import Analysis, draw
from ropelens.cli.common import (
    Command,
    CorpusCommand,
    load_from_args,
    relay,
    signature_default,
)
from ropelens.errors import InputError
from ropelens.plots.positional_symbolic import positional_symbolic_figure


def options(p: argparse.ArgumentParser) -> None:
    """``ropelens positional-symbolic [MODEL]``: positional versus symbolic heads under a
    key-content permutation."""
    CorpusCommand.add_to(p, tokens=2_048, n_ctx=256, save="PositionalSymbolic JSON", bands=False)
    margin, seed = (signature_default(positional_symbolic, name) for name in ("margin", "seed"))
    p.add_argument(
        "--margin",
        type=float,
        default=margin,
        help="P - S that calls a head positional (or S - P symbolic), in [0, 1] (default: "
        f"{margin})",
    )
    p.add_argument(
        "--seed", type=int, default=seed, help=f"seed of the key permutation (default: {seed})"
    )


def run(args: argparse.Namespace) -> int:
    """Positional versus symbolic heads (after Urrutia et al., ICLR 2026)

    Moves key contents to other positions (one seeded permutation, the model's own RoPE) and asks
    per head whether its logits stay put (positional, P) or follow the content (symbolic, S), on
    logits and on attention.
    """
    run = CorpusCommand.from_args(args)
    if (
        args.n_ctx < shortest_window()
    ):  # no query of a shorter window sees enough keys: every score would be NaN
        raise InputError(
            f"--n-ctx {args.n_ctx} is too short for positional/symbolic scoring: a query is "
            f"scored only when it sees {MIN_KEYS} keys besides BOS, so a window needs "
            f"{shortest_window()} tokens: use --n-ctx {shortest_window()} or more"
        )
    corpus, kw = run.prepare(positional_symbolic)
    model = load_from_args(args)
    r = relay(positional_symbolic, model, corpus, **kw, margin=args.margin, seed=args.seed)
    used = run.measured(r)
    return run.output.save_and_show(r, r.to_frame(), "heads", head=used)


ANALYSIS = Analysis(
    "positional-symbolic",
    positional_symbolic,
    PositionalSymbolic,
    draw(PositionalSymbolic, figure=positional_symbolic_figure),
    Command("positional-symbolic", run, options, distributed=True),
    summary="Whether each head's logits stay with positions or follow the content when keys move.",
)
