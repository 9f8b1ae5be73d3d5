"""``ropelens sinks``, ``distance``, ``massive``, ``offsets`` and ``predict-base``: analyses beyond frequency usage."""

from __future__ import annotations

import argparse
from pathlib import Path

from ropelens.cli.analysis import add_checkpoint_arg
from ropelens.cli.common import (
    add_analysis_args,
    add_common_options,
    add_corpus_args,
    add_model_arg,
    emit,
    jsonable_row,
    layer_list,
    load_from_args,
)
from ropelens.distributed import is_main
from ropelens.errors import InputError

__all__ = ["add_distance", "add_massive", "add_offsets", "add_predict_base", "add_sinks"]


def _check(args: argparse.Namespace) -> None:
    if args.tokens < args.n_ctx:
        raise InputError(f"--tokens {args.tokens} is fewer than one window of --n-ctx {args.n_ctx}: raise --tokens or lower --n-ctx")
    if args.save:
        from ropelens.report.build import check_output_dir

        check_output_dir(str(Path(args.save).resolve().parent))


def add_sinks(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "sinks", help="attention sinks per head and the bands that make position 0 attractive",
        description="Per layer and head: mean attention to position 0 (BOS), whether the head sinks (mean above "
                    "epsilon, Gu et al. 2024), the band decomposition of the sink logit and the sink key's norm.")
    add_model_arg(p)
    add_corpus_args(p, tokens=4_096, n_ctx=256)
    add_analysis_args(p)
    p.add_argument("--epsilon", type=float, default=0.3, help="sink threshold on mean attention (default: 0.3)")
    p.add_argument("--save", default=None, metavar="FILE.json", help="also save the full result (AttentionSinks JSON)")
    add_checkpoint_arg(p)
    add_common_options(p)
    p.set_defaults(func=run_sinks, distributed=True)


def run_sinks(args: argparse.Namespace) -> int:
    from ropelens.bands import Bands
    from ropelens.data import load_corpus
    from ropelens.sinks import attention_sinks

    _check(args)
    if not 0 < args.epsilon < 1:
        raise InputError(f"--epsilon must lie in (0, 1), got {args.epsilon}")
    bands, corpus = Bands.parse(args.bands), load_corpus(args.corpus)
    model = load_from_args(args)
    r = attention_sinks(model, corpus, n_ctx=args.n_ctx, max_tokens=args.tokens, layers=args.layers, bands=bands,
                        epsilon=args.epsilon, progress=not args.json,
                        checkpoint=args.checkpoint, checkpoint_every=args.checkpoint_every)
    if args.save and is_main():  # every rank holds the result; one writes it
        r.save(args.save)
    frame = r.layers_frame()
    if args.json:
        emit({"findings": r.findings(), "layers": [jsonable_row(x) for x in frame.to_dict("records")]})
        return 0
    for s in r.findings():
        print(s)
    print(frame.to_string(index=False, float_format="%.3f"))
    return 0


def add_distance(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "distance", help="mean band logit and attention probability by query-key distance (U-shapes, their cause)",
        description="Per layer: mean logit of each band and of the whole score, and mean attention probability, in "
                    "log-spaced distance bins; each curve described as it is (decay, flat, U-shaped, peaked, "
                    "oscillating), and the band that makes a U-shaped logit rise again.")
    add_model_arg(p)
    add_corpus_args(p, tokens=4_096, n_ctx=512)
    add_analysis_args(p)
    p.add_argument("--keep-bos", action="store_true", help="keep BOS as a key (by default it is left out of the bins)")
    p.add_argument("--save", default=None, metavar="FILE.json", help="also save the full result (AttentionByDistance JSON)")
    add_checkpoint_arg(p)
    add_common_options(p)
    p.set_defaults(func=run_distance, distributed=True)


def run_distance(args: argparse.Namespace) -> int:
    from ropelens.bands import Bands
    from ropelens.data import load_corpus
    from ropelens.distance import attention_by_distance

    _check(args)
    bands, corpus = Bands.parse(args.bands), load_corpus(args.corpus)
    model = load_from_args(args)
    r = attention_by_distance(model, corpus, n_ctx=args.n_ctx, max_tokens=args.tokens, layers=args.layers,
                              bands=bands, n_sink=0 if args.keep_bos else 1, progress=not args.json,
                              checkpoint=args.checkpoint, checkpoint_every=args.checkpoint_every)
    if args.save and is_main():  # every rank holds the result; one writes it
        r.save(args.save)
    shapes = r.shapes()
    if args.json:
        emit({"shapes": [jsonable_row(x) for x in shapes.to_dict("records")]})
        return 0
    full = shapes[shapes.curve == "logit"]
    print(full[["layer", "kind", "shape", "text"]].to_string(index=False))
    return 0


def add_massive(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "massive", help="massive dimensions of pre-RoPE queries and keys, the planes they sit in",
        description="Per layer, head and dimension: the L2 norm over tokens of the pre-RoPE q and k; a dimension is "
                    "massive when it exceeds FACTOR x its head's mean dimension norm (Jin et al. 2025). Prints the "
                    "planes holding massive dimensions, their wavelength and persistence across layers.")
    add_model_arg(p)
    add_corpus_args(p, tokens=8_192, n_ctx=512)
    p.add_argument("--layers", type=layer_list, default=None, metavar="0,5,11", help="layer indices (default: all)")
    p.add_argument("--factor", type=float, default=5.0, help="massive threshold over the head's mean (default: 5)")
    p.add_argument("--save", default=None, metavar="FILE.json", help="also save the full result (MassiveValues JSON)")
    add_checkpoint_arg(p)
    add_common_options(p)
    p.set_defaults(func=run_massive, distributed=True)


def run_massive(args: argparse.Namespace) -> int:
    from ropelens.data import load_corpus
    from ropelens.massive import massive_values

    _check(args)
    if not args.factor > 1:
        raise InputError(f"--factor must exceed 1 (a multiple of the head's mean dimension norm), got {args.factor}")
    model = load_from_args(args)
    r = massive_values(model, load_corpus(args.corpus), n_ctx=args.n_ctx, max_tokens=args.tokens, layers=args.layers,
                       factor=args.factor, progress=not args.json, checkpoint=args.checkpoint,
                       checkpoint_every=args.checkpoint_every)
    if args.save and is_main():  # every rank holds the result; one writes it
        r.save(args.save)
    planes = r.planes_frame()
    planes = planes[planes.n_massive > 0]
    if args.json:
        emit({"planes": [jsonable_row(x) for x in planes.to_dict("records")],
              "massive": [jsonable_row(x) for x in r.massive_frame().head(50).to_dict("records")]})
        return 0
    print(planes.to_string(index=False, float_format="%.3f") if len(planes) else "no massive dimension")
    return 0


def add_offsets(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "offsets", help="partial-cycle planes, rotary outliers and the q-k angle per plane at the attended key",
        description="Flags the planes that never complete a turn within the trained context (Jonasson 2025), and "
                    "measures per plane the q/k outlier ratio and the circular mean angle between q and k at the "
                    "key each query attends to (sink and content keys apart).")
    add_model_arg(p)
    add_corpus_args(p, tokens=4_096, n_ctx=512)
    p.add_argument("--layers", type=layer_list, default=None, metavar="0,5,11", help="layer indices (default: all)")
    p.add_argument("--save", default=None, metavar="FILE.json", help="also save the full result (RotaryOffsets JSON)")
    add_checkpoint_arg(p)
    add_common_options(p)
    p.set_defaults(func=run_offsets, distributed=True)


def run_offsets(args: argparse.Namespace) -> int:
    from ropelens.data import load_corpus
    from ropelens.offsets import rotary_offsets

    _check(args)
    model = load_from_args(args)
    r = rotary_offsets(model, load_corpus(args.corpus), n_ctx=args.n_ctx, max_tokens=args.tokens, layers=args.layers,
                       progress=not args.json, checkpoint=args.checkpoint, checkpoint_every=args.checkpoint_every)
    if args.save and is_main():  # every rank holds the result; one writes it
        r.save(args.save)
    summary = r.summary().rename_axis("cycle").reset_index()  # partial-cycle planes against the others
    if args.json:
        emit({"summary": [jsonable_row(x) for x in summary.to_dict("records")]})
        return 0
    print(summary.to_string(index=False, float_format="%.3f"))
    return 0


def add_predict_base(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "predict-base", help="Liu et al.'s critical base and extrapolation limit, Men et al.'s bound, per length",
        description="For each evaluation length: the critical dimension, Liu et al.'s extrapolation limit for the "
                    "model's base and critical base for tuning to that length, Men et al.'s lower bound on the base, "
                    "and whether the model's base satisfies each; --measure adds the measured loss by length.")
    add_model_arg(p)
    p.add_argument("--lengths", default="2048,8192,16384,32768", metavar="N,N,...", help="evaluation lengths")
    p.add_argument("--measure", type=int, default=0, metavar="WINDOWS",
                   help="also measure the mean loss at each length over this many windows of real text (slow)")
    p.add_argument("--save", default=None, metavar="FILE.json", help="also save the predictions (BasePredictions JSON)")
    add_common_options(p)
    p.set_defaults(func=run_predict_base)


def run_predict_base(args: argparse.Namespace) -> int:
    from ropelens.extrapolation import base_predictions, measured_extrapolation

    try:
        lengths = [int(x) for x in args.lengths.split(",") if x.strip()]
    except ValueError as e:
        raise InputError(f"--lengths must be a comma-separated list of token counts, got {args.lengths!r}") from e
    if not lengths or min(lengths) < 2:
        raise InputError(f"--lengths needs token counts ≥ 2, got {args.lengths!r}")
    if args.measure < 0:
        raise InputError(f"--measure must be ≥ 0 windows, got {args.measure}")
    model = load_from_args(args)
    pred = base_predictions(model, lengths)
    if args.save:
        pred.save(args.save)
    frame = pred.compare(measured_extrapolation(model, lengths, n_windows=args.measure, progress=not args.json)) \
        if args.measure else pred.to_frame()
    if args.json:
        emit({"rows": [jsonable_row(x) for x in frame.to_dict("records")]})
        return 0
    print(frame.to_string(index=False))
    return 0
