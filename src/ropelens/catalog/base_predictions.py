"""Predicted and measured extrapolation limits of RoPE's base: ``base_predictions`` and ``ropelens
base-predictions``."""

from __future__ import annotations

import argparse

from ropelens.analyses.base_predictions import (
    BasePredictions,
    MeasuredExtrapolation,
    base_predictions,
    measured_extrapolation,
)
from ropelens.analyses.registry import Analysis, draw
from ropelens.cli.common import (
    Command,
    ModelOptions,
    OutputOptions,
    load_from_args,
    non_negative_int,
    number_list,
)
from ropelens.errors import InputError
from ropelens.plots.base_predictions import base_predictions_figure, measured_extrapolation_figure


def options(p: argparse.ArgumentParser) -> None:
    """``ropelens base-predictions [MODEL]``: the base's predicted extrapolation limits per
    length."""
    ModelOptions.add_to(p)
    p.add_argument(
        "--lengths", default="2048,8192,16384,32768", metavar="N,N,...", help="evaluation lengths"
    )
    p.add_argument(
        "--measure",
        type=non_negative_int,
        default=0,
        metavar="WINDOWS",
        help="also measure the mean loss at each length over this many windows of real text (slow)",
    )
    OutputOptions.add_to(p, save="BasePredictions JSON")


def run(args: argparse.Namespace) -> int:
    """Liu et al.'s critical base and extrapolation limit, Men et al.'s bound, per length

    For each evaluation length: the critical dimension, Liu et al.'s extrapolation limit for the
    model's base and critical base for tuning to that length, Men et al.'s lower bound on the base,
    and whether the model's base satisfies each; --measure adds the measured loss by length.
    """
    lengths = number_list(args.lengths, int, "--lengths", example="2048,8192")
    if min(lengths) < 2:
        raise InputError(f"--lengths needs token counts ≥ 2, got {args.lengths!r}")
    output = OutputOptions.from_args(args)
    output.check()
    model = load_from_args(args)
    pred = base_predictions(model, lengths)
    output.save_result(pred)
    frame = (
        pred.compare(
            measured_extrapolation(model, lengths, n_windows=args.measure, progress=output.progress)
        )
        if args.measure
        else pred.to_frame()
    )
    if output.json:
        return output.emit({"rows": frame.to_dict("records")})
    print(frame.to_string(index=False))
    return 0


ANALYSIS = Analysis(
    "base-predictions",
    base_predictions,
    BasePredictions,
    draw(BasePredictions, figure=base_predictions_figure)
    + draw(MeasuredExtrapolation, figure=measured_extrapolation_figure),
    Command("base-predictions", run, options),
    summary="The context length each published rule predicts a RoPE base extrapolates to.",
)
