"""``ropelens pe-geometry``: cosine similarity of position embeddings by distance, and its period."""

from __future__ import annotations

import argparse
import math

from ropelens.cli.common import (
    ModelOptions,
    OutputOptions,
    add_command,
    load_from_args,
    positive_int,
)
from ropelens.errors import InputError

__all__ = ["add_pe_geometry"]


def add_pe_geometry(subparsers: argparse._SubParsersAction) -> None:
    """``ropelens pe-geometry [--model M]``: period and strength of position-embedding similarity."""
    p = add_command(subparsers, "pe-geometry", run_pe_geometry)
    ModelOptions.add_to(p, flag_help="HF model directory or hub name with learned position embeddings")
    p.add_argument("--n-pos", type=positive_int, default=512, help="positions of the sinusoidal reference (default 512)")
    p.add_argument("--d", type=positive_int, default=128, help="width of the sinusoidal reference (even; default 128)")
    p.add_argument("--base", type=float, default=10000.0, help="sinusoidal base (default 10000)")
    OutputOptions.add_to(p)


def run_pe_geometry(args: argparse.Namespace) -> int:
    """Cosine similarity of position embeddings by distance: dominant period and strength

    Sinusoidal reference and, with --model, the learned absolute position table of a model that has one (GPT-2,
    OPT, BERT-like): the by-distance cosine similarity and its dominant period.
    """
    from ropelens.analyses.pe_geometry import learned_pe, pe_similarity, sinusoidal_pe
    from ropelens.devices import require_memory

    if args.n_pos < 2:
        raise InputError(f"--n-pos {args.n_pos}: the similarity by distance needs at least 2 positions: "
                         "pass --n-pos 2 or more, e.g. --n-pos 512")
    if args.d % 2:
        raise InputError(f"--d {args.d} must be even: sinusoidal embeddings pair a sine and a cosine per frequency: "
                         f"e.g. --d {args.d + 1}")
    if not (math.isfinite(args.base) and args.base > 1):
        raise InputError(f"--base {args.base:g} must be a finite number > 1 (θ_i = base^(−2i/d) must fall with i): "
                         "e.g. --base 10000")
    require_memory(12.0 * args.n_pos ** 2, f"--n-pos {args.n_pos:,} (an n × n similarity matrix)", "pass a smaller --n-pos")
    # the float64 angles, their sine and cosine and the float32 table: about 24 bytes per (position, dimension)
    require_memory(24.0 * args.n_pos * args.d, f"--d {args.d:,} at --n-pos {args.n_pos:,} (the n × d sinusoidal table)",
                   "pass a smaller --d, e.g. --d 128")
    sims = [pe_similarity(sinusoidal_pe(args.n_pos, args.d, args.base), name=f"sinusoidal {args.n_pos}x{args.d}")]
    if args.model is not None:
        sims.append(pe_similarity(learned_pe(load_from_args(args)), name=str(args.model)))
    rows = [{"name": s.name, "n_pos": s.n_pos, "d_model": s.d_model, "period": s.period,
             "period_strength": s.period_strength, "period_threshold": s.period_threshold} for s in sims]
    output = OutputOptions.from_args(args)
    if output.json:
        return output.emit(rows)
    for r in rows:
        period = f"{r['period']:.1f} tokens" if r["period"] else "none"
        print(f"{r['name']}: {r['n_pos']} positions x {r['d_model']} dims, period {period}, "
              f"strength {r['period_strength']:.3f} (threshold {r['period_threshold']:.3f})")
    return 0
