"""Dose-response knockouts of rotary planes in head sets, with controls: ``knockout`` and ``ropelens
knockout``."""

from __future__ import annotations

import argparse
import math

from ropelens.analyses.knockout import HEAD_SETS, METRIC_GROUPS, MIN_WINDOWS, Knockout, knockout
from ropelens.analyses.registry import Analysis, draw
from ropelens.cli.common import (
    Command,
    CorpusOptions,
    ModelOptions,
    OutputOptions,
    check_windows_fit,
    in_flag_terms,
    load_from_args,
    non_negative_int,
    number_list,
    positive_int,
    relay,
    signature_default,
)
from ropelens.errors import InputError
from ropelens.plots.knockout import knockout_figure
from ropelens.results.findings import head_name
from ropelens.run.evaluate import MIN_BOOT, check_n_boot


def parse_heads(text: str) -> list[tuple[int, int]]:
    """``"3.1,5.0"`` → ``[(3, 1), (5, 0)]`` (layer.head pairs) for ``--heads``."""
    out = []
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        try:
            layer, head = part.split(".")
            out.append((int(layer), int(head)))
        except ValueError as e:
            raise InputError(
                f"--heads takes LAYER.HEAD pairs separated by commas, got {part!r}: e.g. --heads "
                "3.1,5.0"
            ) from e
    if not out:
        raise InputError(f"--heads names no head, got {text!r}: e.g. --heads 3.1,5.0")
    return out


def boot_count(text: str) -> int:
    """``argparse`` type of ``--boot``: bootstrap resamples, at least :data:`MIN_BOOT` (the check
    the library makes, in the flag's terms)."""
    try:
        return check_n_boot(positive_int(text))
    except InputError as e:
        raise argparse.ArgumentTypeError(in_flag_terms(str(e), {"n_boot": "--boot"})) from None


def _names(text: str, flag: str, allowed: tuple[str, ...]) -> list[str]:
    """A comma-separated list of names, each one of ``allowed``."""
    names = [n.strip() for n in text.split(",") if n.strip()]
    bad = [n for n in names if n not in allowed]
    if bad or not names:
        raise InputError(
            f"{flag} takes names from {', '.join(allowed)} separated by commas, got {text!r}: "
            f"e.g. {flag} {','.join(allowed[:2])}"
        )
    return names


# the command's defaults are the library's: as many tokens as knockout's default windows hold
N_CTX = signature_default(knockout, "n_ctx")
TOKENS = signature_default(knockout, "n_windows") * N_CTX
# knockout's arguments as this command spells them (n_windows is --tokens // --n-ctx, checked in
# those terms before the call)
_FLAGS = {
    "probe_heads": "--probe-heads L.H,...",
    "metrics": "--metrics",
    "sets": "--sets",
    "n_random": "--random",
    "n_control": "--controls",
    "n_boot": "--boot",
}


def options(p: argparse.ArgumentParser) -> None:
    """``ropelens knockout [MODEL]``: zero 0..K planes of head sets and measure loss, positional
    probe, retrieval."""
    ModelOptions.add_to(p)
    p.add_argument(
        "--sets",
        default="positional",
        metavar="NAME,...",
        help="head sets: positional, retrieval, sinks, others (default: positional)",
    )
    p.add_argument(
        "--heads",
        default=None,
        metavar="L.H,...",
        help="your own head set instead of --sets, as LAYER.HEAD pairs (e.g. 3.1,5.0)",
    )
    p.add_argument(
        "--probe-heads",
        default=None,
        metavar="L.H,...",
        help="heads the positional probe reads (default: the positional heads)",
    )
    p.add_argument(
        "--doses",
        default=None,
        metavar="K,K,...",
        help="planes zeroed per head (default: 0, n/8, n/4, n/2, n of the n planes)",
    )
    p.add_argument(
        "--directions",
        default="high,low",
        metavar="high,low",
        help="which planes first (default: high,low)",
    )
    p.add_argument(
        "--metrics",
        default="loss,probe",
        metavar="loss,probe,retrieval",
        help="what is measured per window (default: loss,probe)",
    )
    CorpusOptions.add_to(p, tokens=TOKENS, n_ctx=N_CTX)
    p.add_argument(
        "--prompt-len",
        type=positive_int,
        default=None,
        metavar="N",
        help="tokens per retrieval prompt (default: --n-ctx)",
    )
    p.add_argument(
        "--random",
        type=non_negative_int,
        default=9,
        metavar="N",
        help="random plane draws per control dose (default: 9)",
    )
    p.add_argument(
        "--controls",
        type=non_negative_int,
        default=9,
        metavar="N",
        help="random head sets (as many heads per layer) per control dose (default: 9)",
    )
    p.add_argument(
        "--control-doses",
        default=None,
        metavar="K,...",
        help="doses with controls (default: every nonzero dose)",
    )
    p.add_argument("--no-whole-head", action="store_true", help="skip the whole-head knockout")
    p.add_argument(
        "--boot",
        type=boot_count,
        default=2000,
        metavar="N",
        help=f"bootstrap resamples, at least {MIN_BOOT} (default: 2000)",
    )
    p.add_argument(
        "--seed",
        type=non_negative_int,
        default=0,
        metavar="N",
        help="seed of every draw (default: 0)",
    )
    OutputOptions.add_to(p, save="Knockout JSON")


def _choices(args: argparse.Namespace) -> tuple:
    """--heads or --sets, --directions, --metrics, --doses and --control-doses, parsed and named."""
    sets = (
        {"custom": parse_heads(args.heads)}
        if args.heads
        else _names(args.sets, "--sets", HEAD_SETS)
    )
    directions = _names(args.directions, "--directions", ("high", "low"))
    metrics = _names(args.metrics, "--metrics", tuple(METRIC_GROUPS))
    # numbers, not integers: whether a dose is a whole plane count is the library's one check
    doses = number_list(args.doses, float, "--doses", example="0,2,4,8") if args.doses else None
    control = (
        number_list(args.control_doses, float, "--control-doses", example="8")
        if args.control_doses
        else None
    )
    return sets, directions, metrics, doses, control


def run(args: argparse.Namespace) -> int:
    """Dose-response knockouts of RoPE planes in head sets

    Zeroes k planes (highest frequencies first, lowest first, or random: the control) of the rotated
    queries and keys of a head set, for each dose k, and every whole head; reports the paired effect
    on loss, the positional probe (previous-token and diagonal attention on random tokens) and
    retrieval (passkey copy steps) with bootstrap CIs over windows, and layer-clustered permutation
    p-values against random planes and random head sets.
    """

    output = OutputOptions.from_args(args)
    output.check()
    corpus_options = CorpusOptions.from_args(args)
    n_windows = corpus_options.n_windows(
        "knockout", at_least=MIN_WINDOWS, default=corpus_options.tokens == TOKENS
    )
    corpus = corpus_options.load()
    if corpus_options.tokens != TOKENS:  # the default is not the user's request
        check_windows_fit(
            corpus,
            corpus_options.n_ctx,
            corpus_options.tokens,
            "--tokens",
            per_window=corpus_options.n_ctx,
        )
    sets, directions, metrics, doses, control = _choices(args)
    r = relay(
        knockout,
        load_from_args(args),
        sets,
        flags=_FLAGS,
        doses=doses,
        control_doses=control,
        directions=directions,
        metrics=metrics,
        corpus=corpus,
        n_ctx=corpus_options.n_ctx,
        n_windows=n_windows,
        prompt_len=args.prompt_len,
        n_random=args.random,
        n_control=args.controls,
        whole_head=not args.no_whole_head,
        probe_heads=parse_heads(args.probe_heads) if args.probe_heads else None,
        n_boot=args.boot,
        seed=args.seed,
        progress=output.progress,
    )
    output.save_result(r)
    frame = r.to_frame()
    if output.json:
        records = [
            {k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in row.items()}
            for row in frame.to_dict("records")
        ]
        return output.emit(
            {
                "heads": {k: [list(h) for h in v] for k, v in r.heads.items()},
                "findings": [f.text for f in r.findings()],
                "rows": records,
            }
        )
    for name, heads in r.heads.items():
        print(f"{name} heads ({len(heads)}): {', '.join(head_name(L, h) for L, h in heads)}")
    print(frame.drop(columns=["n_heads", "p_withheld"]).to_string(index=False, float_format="%.4g"))
    for reason in dict.fromkeys(r for why in frame["p_withheld"] if why for r in why.split(" | ")):
        print(reason)  # a p left blank above, and why
    return 0


ANALYSIS = Analysis(
    "knockout",
    knockout,
    Knockout,
    draw(Knockout, figure=knockout_figure),
    Command("knockout", run, options),
    summary="Loss, positional probe and passkey copy as planes are removed from head sets, "
    "against matched controls.",
)
