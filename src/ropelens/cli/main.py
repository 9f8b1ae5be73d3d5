"""``ropelens COMMAND``: the entry point. Its subcommands are the commands of the registered
analyses.

An analysis declares its command (:class:`ropelens.cli.common.Command`: a name, an
``options(parser)`` that declares its flags from the option groups in :mod:`ropelens.cli.common`,
and a ``run(args) -> int``) in its :class:`ropelens.analyses.registry.Analysis`; ropelens's own are
in ``ropelens.catalog``. Bad input raises :class:`ropelens.errors.InputError` (or ``OSError`` for a
file): ``main`` prints it as ``ropelens: error: ...`` and returns 2.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

from ropelens.analyses.registry import parts
from ropelens.cli.common import Parser
from ropelens.errors import InputError
from ropelens.results.provenance import version_report
from ropelens.run.distributed import RankFailedError, init_from_env, is_main

__all__ = ["build_parser", "main"]

EXIT_USAGE = 2


class _Version(argparse.Action):
    """``--version``: the versions in use, read when asked (not at import)."""

    def __init__(
        self, option_strings, dest=argparse.SUPPRESS, default=argparse.SUPPRESS, help=None
    ):
        super().__init__(option_strings, dest=dest, default=default, nargs=0, help=help)

    def __call__(self, parser, namespace, values, option_string=None):  # noqa: ARG002

        print(version_report())
        parser.exit()


def build_parser() -> argparse.ArgumentParser:
    """The top-level parser, with the command of every registered analysis
    (:mod:`ropelens.analyses.registry`)."""
    parser = Parser(
        prog="ropelens",
        description="Mechanistic interpretability of rotary position embeddings (RoPE).",
    )
    parser.add_argument(
        "--version",
        action=_Version,
        help="print the versions in use (ropelens, torch, transformers, "
        "TransformerLens, ...) and which differ from the tested stack, and exit",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for command in parts("command"):
        command.add_to(sub)
    return parser


def _join_process_group(args: argparse.Namespace) -> None:
    """Under torchrun: join the process group, take this rank's device, and let only rank 0
    print."""
    if int(os.environ.get("WORLD_SIZE", "1")) > 1 and not getattr(args, "distributed", False):
        sub = next(a for a in build_parser()._actions if a.dest == "command")
        names = [n for n, p in sub.choices.items() if p.get_default("distributed")]
        raise InputError(
            f"ropelens {args.command} does not split its work across processes: run it without "
            f"torchrun ({', '.join(names[:-1])} and {names[-1]} do)"
        )
    device = init_from_env(getattr(args, "device", None))
    if device is None:
        return
    if hasattr(args, "device"):
        args.device = device
    if not is_main():  # other ranks print nothing but errors (stderr stays open)
        sys.stdout = open(os.devnull, "w")  # noqa: SIM115


def _one_line(e: BaseException) -> str:
    return " ".join(str(e).split()) or type(e).__name__


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``ropelens ARGS``; returns the exit code (0 ok, 2 bad input; ROPELENS_DEBUG=1
    re-raises)."""
    try:
        args = build_parser().parse_args(argv)
        _join_process_group(args)
        return int(args.func(args))
    except RankFailedError as e:  # another rank's error, already reported by that rank
        print(f"ropelens: error: {_one_line(e)}", file=sys.stderr)
        return 1
    except SystemExit as e:  # --help and --version exit through argparse
        return e.code if isinstance(e.code, int) else 0
    except BrokenPipeError:  # `ropelens rope-spec | head`: the reader left, nothing to report
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 1
    except (
        InputError,
        OSError,
    ) as e:  # bad option, model name/path/device, non-RoPE model, broken file
        if os.environ.get("ROPELENS_DEBUG"):  # the traceback, for bugs that look like bad input
            raise
        print(f"ropelens: error: {_one_line(e)}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        return 130
