"""``ropelens sinks``, ``distance``, ``massive``, ``offsets``, ``possym`` and ``retrieval``: where attention goes and what drives it."""

from __future__ import annotations

import argparse

from ropelens.cli.common import (
    CorpusCommand,
    ModelOptions,
    OutputOptions,
    add_command,
    load_from_args,
    non_negative_int,
    note,
    positive_int,
)
from ropelens.errors import InputError

__all__ = ["add_distance", "add_massive", "add_offsets", "add_possym", "add_retrieval", "add_sinks"]


def add_sinks(subparsers: argparse._SubParsersAction) -> None:
    """``ropelens sinks [MODEL]``: attention to position 0 per head, and the bands behind it."""
    p = add_command(subparsers, "sinks", run_sinks, distributed=True)
    CorpusCommand.add_to(p, tokens=4_096, n_ctx=256, save="AttentionSinks JSON")
    p.add_argument("--epsilon", type=float, default=0.3, help="sink threshold on mean attention (default: 0.3)")


def run_sinks(args: argparse.Namespace) -> int:
    """Attention sinks per head and the bands that make position 0 attractive

    Per layer and head: mean attention to position 0 (BOS), whether the head sinks (mean above epsilon, Gu et
    al. 2024), the band decomposition of the sink logit and the sink key's norm.
    """
    from ropelens.analyses.sinks import attention_sinks

    run = CorpusCommand.from_args(args)
    if not 0 < args.epsilon < 1:
        raise InputError(f"--epsilon must lie in (0, 1), got {args.epsilon}: e.g. --epsilon 0.3")
    corpus, kw = run.prepare(attention_sinks)
    r = attention_sinks(load_from_args(args), corpus, **kw, epsilon=args.epsilon)
    used = run.measured(r)
    return run.output.save_and_show(r, r.layers_frame(), "layers", head=used)


def add_distance(subparsers: argparse._SubParsersAction) -> None:
    """``ropelens distance [MODEL]``: band logits and attention by query-key distance."""
    p = add_command(subparsers, "distance", run_distance, distributed=True)
    CorpusCommand.add_to(p, tokens=4_096, n_ctx=512, save="AttentionByDistance JSON")
    p.add_argument("--keep-bos", action="store_true", help="keep BOS as a key (by default it is left out of the bins)")


def run_distance(args: argparse.Namespace) -> int:
    """Mean band logit and attention probability by query-key distance (U-shapes, their cause)

    Per layer: mean logit of each band and of the whole score, and mean attention probability, in log-spaced
    distance bins; each curve described as it is (decay, flat, U-shaped, peaked, oscillating), and the band that
    makes a U-shaped logit rise again.
    """
    from ropelens.analyses.distance import attention_by_distance

    run = CorpusCommand.from_args(args)
    shortest = 3 if args.keep_bos else 4  # distances 0, 1 and 2: the three bins a curve's shape needs
    if args.n_ctx < shortest:
        raise InputError(f"--n-ctx {args.n_ctx} is too short for distance curves: they need three distance bins "
                         f"(δ = 0, 1, 2{'' if args.keep_bos else ' between non-BOS tokens'}): use --n-ctx {shortest} or more")
    corpus, kw = run.prepare(attention_by_distance)
    r = attention_by_distance(load_from_args(args), corpus, **kw,
                              n_sink=0 if args.keep_bos else 1)
    used = run.measured(r)
    run.output.save_result(r)
    shapes = r.shapes()
    if run.output.json:
        return run.output.emit({**used, "shapes": shapes.to_dict("records")})
    full = shapes[shapes.curve == "logit"]
    print(full[["layer", "kind", "shape", "text"]].to_string(index=False))
    return 0


def add_massive(subparsers: argparse._SubParsersAction) -> None:
    """``ropelens massive [MODEL]``: massive dimensions of pre-RoPE queries and keys."""
    p = add_command(subparsers, "massive", run_massive, distributed=True)
    CorpusCommand.add_to(p, tokens=8_192, n_ctx=512, save="MassiveValues JSON", bands=False)
    p.add_argument("--factor", type=float, default=5.0, help="massive threshold over the head's mean (default: 5)")


def run_massive(args: argparse.Namespace) -> int:
    """Massive dimensions of pre-RoPE queries and keys, the planes they sit in

    Per layer, head and dimension: the L2 norm over tokens of the pre-RoPE q and k; a dimension is massive when
    it exceeds FACTOR x its head's mean dimension norm (Jin et al. 2025). Prints the planes holding massive
    dimensions, their wavelength and persistence across layers.
    """
    from ropelens.analyses.massive import massive_values

    run = CorpusCommand.from_args(args)
    if not args.factor > 1:
        raise InputError(f"--factor must exceed 1 (a multiple of the head's mean dimension norm), got {args.factor}")
    corpus, kw = run.prepare(massive_values)
    r = massive_values(load_from_args(args), corpus, **kw, factor=args.factor)
    used = run.measured(r)
    run.output.save_result(r)
    planes = r.planes_frame()
    planes = planes[planes.n_massive > 0]
    if run.output.json:
        return run.output.emit({**used, "planes": planes.to_dict("records"),
                                "massive": r.massive_frame().head(50).to_dict("records")})
    print(planes.to_string(index=False, float_format="%.3f") if len(planes) else "no massive dimension")
    return 0


def add_offsets(subparsers: argparse._SubParsersAction) -> None:
    """``ropelens offsets [MODEL]``: partial-cycle planes and the q-k angle per plane."""
    p = add_command(subparsers, "offsets", run_offsets, distributed=True)
    CorpusCommand.add_to(p, tokens=4_096, n_ctx=512, save="RotaryOffsets JSON", bands=False)


def run_offsets(args: argparse.Namespace) -> int:
    """Partial-cycle planes, rotary outliers and the q-k angle per plane at the attended key

    Flags the planes that never complete a turn within the trained context (Jonasson 2025), and measures per
    plane the q/k outlier ratio and the circular mean angle between q and k at the key each query attends to
    (sink and content keys apart).
    """
    from ropelens.analyses.offsets import rotary_offsets

    run = CorpusCommand.from_args(args)
    corpus, kw = run.prepare(rotary_offsets)
    r = rotary_offsets(load_from_args(args), corpus, **kw)
    used = run.measured(r)
    run.output.save_result(r)
    summary = r.summary().rename_axis("cycle").reset_index()  # partial-cycle planes against the others
    if run.output.json:
        return run.output.emit({**used, "summary": summary.to_dict("records")})
    print(summary.to_string(index=False, float_format="%.3f"))
    return 0


def add_possym(subparsers: argparse._SubParsersAction) -> None:
    """``ropelens possym [MODEL]``: positional versus symbolic heads under a key-content permutation."""
    p = add_command(subparsers, "possym", run_possym, distributed=True)
    CorpusCommand.add_to(p, tokens=2_048, n_ctx=256, save="PositionalSymbolic JSON", bands=False)
    p.add_argument("--margin", type=float, default=0.25,
                   help="P - S that calls a head positional (or S - P symbolic) (default: 0.25)")
    p.add_argument("--seed", type=int, default=0, help="seed of the key permutation (default: 0)")


def run_possym(args: argparse.Namespace) -> int:
    """Positional versus symbolic heads (after Urrutia et al., ICLR 2026)

    Moves key contents to other positions (one seeded permutation, the model's own RoPE) and asks per head
    whether its logits stay put (positional, P) or follow the content (symbolic, S), on logits and on attention.
    """
    from ropelens.analyses.positional_symbolic import MIN_KEYS, positional_symbolic, shortest_window

    run = CorpusCommand.from_args(args)
    if args.n_ctx < shortest_window():  # no query of a shorter window sees enough keys: every score would be NaN
        raise InputError(f"--n-ctx {args.n_ctx} is too short for positional/symbolic scoring: a query is scored only "
                         f"when it sees {MIN_KEYS} keys besides BOS, so a window needs {shortest_window()} tokens: "
                         f"use --n-ctx {shortest_window()} or more")
    if not 0 <= args.margin <= 1:
        raise InputError(f"--margin must lie in [0, 1], got {args.margin}: e.g. --margin 0.25")
    corpus, kw = run.prepare(positional_symbolic)
    r = positional_symbolic(load_from_args(args), corpus, **kw, margin=args.margin, seed=args.seed)
    used = run.measured(r)
    return run.output.save_and_show(r, r.to_frame(), "heads", head=used)


def add_retrieval(subparsers: argparse._SubParsersAction) -> None:
    """``ropelens retrieval [MODEL]``: retrieval heads, and passkey recall with their lowest band zeroed."""
    p = add_command(subparsers, "retrieval", run_retrieval)
    ModelOptions.add_to(p)
    p.add_argument("--lengths", default="256,512", metavar="N,N,...", help="prompt lengths in tokens (default: 256,512)")
    p.add_argument("--depths", default="0.25,0.75", metavar="F,F,...", help="passkey depths (default: 0.25,0.75)")
    p.add_argument("--trials", type=positive_int, default=2, metavar="N", help="passkeys per (length, depth) (default: 2)")
    p.add_argument("--top-k", type=positive_int, default=16, metavar="N", help="heads to ablate (default: 16)")
    p.add_argument("--threshold", type=float, default=0.1,
                   help="retrieval score that counts a head as a retrieval head (default: 0.1)")
    p.add_argument("--seed", type=non_negative_int, default=0, metavar="N",
                   help="seed of the passkeys and the random planes (default: 0)")
    OutputOptions.add_to(p, save="RetrievalHeads JSON")


def run_retrieval(args: argparse.Namespace) -> int:
    """Retrieval heads (Wu et al. 2024) and their lowest-frequency planes (Bayram 2026)

    Scores every head by how often its most attended key is the needle token being copied while the answer to a
    passkey prompt is teacher-forced, then measures passkey recall with the lowest quarter of rotary planes
    zeroed in the top heads, against as many random planes (seeded) in the same heads.
    """
    from ropelens.analyses.retrieval import retrieval_heads
    from ropelens.cli.variants import number_list

    lengths = number_list(args.lengths, int, "--lengths", example="256,512")
    depths = number_list(args.depths, float, "--depths", example="0.25,0.75")
    if not 0 <= args.threshold <= 1:
        raise InputError(f"--threshold must lie in [0, 1], got {args.threshold}: e.g. --threshold 0.1")
    output = OutputOptions.from_args(args)
    output.check()
    r = retrieval_heads(load_from_args(args), lengths, depths, n_trials=args.trials, seed=args.seed, top_k=args.top_k,
                        threshold=args.threshold, progress=output.progress)
    if len(r.heads) < args.top_k:
        note(f"--top-k {args.top_k:,} is more than the model's {len(r.heads):,} rotary heads: ablated all "
             f"{len(r.heads):,}")
    return output.save_and_show(r, r.to_frame(), "recall", head={"top_k": len(r.heads)},
                                tail={"heads": [list(h) for h in r.heads],
                                      "scores": [float(r.scores[L, h]) for L, h in r.heads]})
