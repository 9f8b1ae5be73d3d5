"""The context-extension study: ``extension_study`` and ``ropelens extension-study``."""

from __future__ import annotations

import argparse
from typing import Any

from ropelens.analyses.extension_planes import LongRopeSearch
from ropelens.analyses.extension_study import (
    METHODS,
    ExtensionStudy,
    extension_study,
)
from ropelens.analyses.registry import Analysis, draw
from ropelens.cli.common import (
    Command,
    CorpusOptions,
    ModelOptions,
    OutputOptions,
    load_from_args,
    non_negative_int,
    positive_int,
    relay,
    signature_default,
)
from ropelens.errors import InputError
from ropelens.plots.extension_study import loss_figure
from ropelens.report.extension_study import write_study
from ropelens.validate import check_output_path


def _ints(text: str, what: str) -> list[int]:
    """The comma-separated integers of ``text``; ``what`` names the flag in the error."""
    try:
        return [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise InputError(
            f"{what} must be a comma-separated list of integers, got {text!r}"
        ) from None


def _default(argument: str):
    """``extension_study``'s default for ``argument``: the command's default is the library's."""
    return signature_default(extension_study, argument)


def options(p: argparse.ArgumentParser) -> None:
    """``ropelens extension-study [MODEL] --to N``: the context-extension study and its page."""
    ModelOptions.add_to(p)
    study = p.add_argument_group("study")
    _length_options(study)
    _passkey_options(study)
    _method_options(study)
    OutputOptions.add_to(p)


def _length_options(group: argparse._ArgumentGroup) -> None:
    """The lengths studied: --to, --native, --lengths, --start, and the text of the loss."""
    group.add_argument(
        "--to",
        type=positive_int,
        required=True,
        metavar="N",
        help="the target context length in tokens",
    )
    group.add_argument(
        "--native",
        type=positive_int,
        default=None,
        metavar="N",
        help="the trained context length the methods extend (default: the model's)",
    )
    group.add_argument(
        "--lengths",
        default=None,
        metavar="N,N,...",
        help="loss lengths (default: doubling from --start up to --to)",
    )
    group.add_argument(
        "--start",
        type=positive_int,
        default=None,
        metavar="N",
        help="the shortest length when doubling (default: native / 4)",
    )
    windows = _default("n_windows")
    group.add_argument(
        "--windows",
        type=positive_int,
        default=windows,
        metavar="N",
        help=f"windows per length (default: {windows})",
    )
    group.add_argument(
        "--corpus",
        default="english",
        metavar="PATH|english|python",
        help="text for the loss: a built-in corpus, a .txt/.md, .jsonl, .csv or .parquet file, a "
        "folder or glob of them, or a datasets save_to_disk folder (default: english)",
    )
    CorpusOptions.add_text_column(group)


def _passkey_options(group: argparse._ArgumentGroup) -> None:
    """Passkey retrieval: --passkey-lengths, --depths, --trials, --seed."""
    group.add_argument(
        "--passkey-lengths",
        default=None,
        metavar="N,N,...|none",
        help="passkey prompt lengths (default: every loss length a prompt fits in; none to skip)",
    )
    depths = ",".join(f"{depth:g}" for depth in _default("depths"))
    group.add_argument(
        "--depths", default=depths, metavar="F,F,...", help=f"passkey depths (default: {depths})"
    )
    trials, seed = _default("n_trials"), _default("seed")
    group.add_argument(
        "--trials",
        type=positive_int,
        default=trials,
        metavar="N",
        help=f"passkeys per (length, depth) (default: {trials})",
    )
    group.add_argument(
        "--seed",
        type=non_negative_int,
        default=seed,
        metavar="N",
        help=f"seed of the passkeys (default: {seed})",
    )


def _method_options(group: argparse._ArgumentGroup) -> None:
    """The methods and what is kept of them: --methods, --p, --longrope, --tolerance, --out."""
    methods = ",".join(_default("methods"))
    group.add_argument(
        "--methods",
        default=methods,
        metavar="M,M,...",
        help=f"of {','.join(METHODS)} (default: {methods})",
    )
    kept, tolerance = _default("p"), _default("tolerance")
    group.add_argument(
        "--p",
        type=float,
        default=kept,
        metavar="P",
        help=f"p-RoPE's kept fraction (default: {kept})",
    )
    group.add_argument(
        "--longrope",
        default=None,
        metavar="FILE.json",
        help="a saved LongRopeSearch for this native -> target "
        "(default: YaRN's factors as LongRoPE)",
    )
    group.add_argument(
        "--tolerance",
        type=float,
        default=tolerance,
        metavar="NATS",
        help=f"loss rise the findings count as kept (default: {tolerance})",
    )
    group.add_argument(
        "--no-attention",
        dest="attention",
        action="store_false",
        help="skip the attention entropy, divergence and matrix entropy per method and length",
    )
    group.add_argument(
        "--out",
        default="ropelens-extend",
        metavar="DIR",
        help="page, tables and one saved cell per (method, length); rerun to resume "
        "(default: ropelens-extend)",
    )


def run(args: argparse.Namespace) -> int:
    """Context-extension study: loss by length, passkey, per-plane view and base predictions per
    method

    Run the model unmodified and under PI, NTK, dynamic NTK, YaRN, Llama 3, LongRoPE and p-RoPE
    (each set for --to / native; Resonance-YaRN, CoPE and FoPE zeroing when named in --methods),
    measure the loss at every length, passkey retrieval over length x depth and the attention (mean
    entropy of the query rows by layer kind, KL and Jensen-Shannon divergence from the unmodified
    model's attention within the native context, the heads' query matrix entropy), and write one
    page (index.html) with findings, study.json and a CSV per table. Every (method, length) cell is
    saved as it finishes, so the same command started again resumes.
    """
    parsed = _parsed_flags(args)
    check_output_path(args.out, "--out", directory=True)
    output = OutputOptions.from_args(args)
    study = relay(
        extension_study,
        load_from_args(args),
        args.to,
        flags={"n_windows": "--windows", "n_trials": "--trials"},
        native=args.native,
        start=args.start,
        n_windows=args.windows,
        corpus=args.corpus,
        text_column=args.text_column,
        n_trials=args.trials,
        seed=args.seed,
        p=args.p,
        tolerance=args.tolerance,
        out=args.out,
        progress=output.progress,
        attention=args.attention,
        **parsed,
    )
    page = write_study(study, args.out)
    findings = study.findings()
    if output.json:
        return output.emit(
            {
                "page": str(page),
                "findings": [finding.to_dict() for finding in findings],
                "loss": study.loss_frame().to_dict("records"),
                "passkey": study.passkey_frame().to_dict("records"),
                "attention": study.attention_frame().to_dict("records"),
            }
        )
    _print_study(study)
    for finding in findings:
        print(f"- {finding.text}")
    print(f"wrote {page}")
    return 0


def _parsed_flags(args: argparse.Namespace) -> dict[str, Any]:
    """The flags given as text, checked and parsed into ``extension_study``'s keyword arguments:
    methods, lengths, passkey_lengths, depths and longrope."""
    methods = [method.strip().lower() for method in args.methods.split(",") if method.strip()]
    unknown = [method for method in methods if method not in METHODS]
    if unknown or not methods:
        raise InputError(
            f"--methods {args.methods!r}: unknown {unknown}; choose from {','.join(METHODS)}"
        )
    if args.native is not None and args.to <= args.native:
        raise InputError(
            f"--to {args.to} must exceed --native {args.native}: pass the extended length as --to"
        )
    lengths = _ints(args.lengths, "--lengths") if args.lengths else None
    passkey_text = args.passkey_lengths
    if passkey_text and passkey_text.strip().lower() == "none":
        passkey_lengths = []
    else:
        passkey_lengths = _ints(passkey_text, "--passkey-lengths") if passkey_text else None
    return {
        "methods": methods,
        "lengths": lengths,
        "passkey_lengths": passkey_lengths,
        "depths": _floats(args.depths, "--depths"),
        "longrope": LongRopeSearch.load(args.longrope) if args.longrope else None,
    }


def _floats(text: str, what: str) -> list[float]:
    """The comma-separated numbers of ``text``; ``what`` names the flag in the error."""
    try:
        return [float(item) for item in text.split(",") if item.strip()]
    except ValueError:
        raise InputError(
            f"{what} must be a comma-separated list of numbers, got {text!r}"
        ) from None


def _print_study(study: ExtensionStudy) -> None:
    """Print the loss table, then the attention tables when the study measured attention."""
    print(
        study.loss_frame()
        .pivot(index="label", columns="length", values="loss")
        .to_string(float_format="%.4f")
    )
    attention = study.attention_frame()
    if attention.empty:
        return
    print("\nmean attention entropy of the query rows (nats), by layer kind:")
    print(
        attention.pivot(index=["label", "kind"], columns="length", values="entropy").to_string(
            float_format="%.4f"
        )
    )
    within_native = attention[attention["length"] <= study.native]
    print(
        "\ndivergence from the unmodified model's attention within the native "
        f"{study.native:,} tokens (nats; KL(method || unmodified), JS) and mean matrix "
        "entropy of the heads' query Gram:"
    )
    print(
        within_native[["label", "length", "kind", "kl", "js", "matrix_entropy"]].to_string(
            index=False, float_format="%.6f"
        )
    )


ANALYSIS = Analysis(
    "extension-study",
    extension_study,
    ExtensionStudy,
    draw(ExtensionStudy, figure=loss_figure),
    Command("extension-study", run, options),
    summary="Loss, passkey recall and attention of each context-extension method at lengths past "
    "the native context.",
)
