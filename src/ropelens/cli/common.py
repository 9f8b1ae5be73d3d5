"""Ingredients every ``ropelens`` subcommand is built from: shared options, argument types, loading.

Command modules (``ropelens.cli.inspect``, ``.analysis``, ``.report``, ``.variants``,
``.geometry``) import this module and nothing else of the CLI; :mod:`ropelens.cli.main` imports
them. Bad input raises :class:`ropelens.errors.InputError` (or ``OSError`` for files), which
``main`` reports as one line with exit code 2.
"""

from __future__ import annotations

import argparse
import json
import math
from typing import Any

import torch

from ropelens.errors import UsageError
from ropelens.models import DEFAULT_MODEL, EMBEDDED_MODELS, load_model

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}

__all__ = [
    "DTYPES", "Parser", "add_analysis_args", "add_common_options", "add_corpus_args", "add_model_arg", "band_tokens",
    "emit", "jsonable_row", "layer_list", "load_from_args", "positive_int",
]  # fmt: skip


class Parser(argparse.ArgumentParser):
    """An ``ArgumentParser`` whose errors raise :class:`UsageError` instead of exiting."""

    def error(self, message: str):  # type: ignore[override]
        # argparse would print usage and exit; main reports one line instead.
        raise UsageError(f"{message} (see '{self.prog} --help')")


# ---------------------------------------------------------------------------------------- argument types
def positive_int(text: str) -> int:
    """``argparse`` type: an integer ≥ 1."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {value}")
    return value


def layer_list(text: str) -> list[int]:
    """``argparse`` type: comma-separated layer indices such as ``0,5,11``."""
    try:
        out = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated layer indices such as 0,5,11, got {text!r}") from None
    if not out:
        raise argparse.ArgumentTypeError("expected at least one layer index, e.g. --layers 0,5,11")
    return out


def band_tokens(text: str) -> int | None:
    """``argparse`` type: a token count, or ``all`` (None)."""
    return None if text.strip().lower() == "all" else positive_int(text)


# ---------------------------------------------------------------------------------------- option groups
def add_common_options(parser: argparse.ArgumentParser) -> None:
    """Options every model-loading subcommand shares."""
    parser.add_argument(
        "--device",
        default=None,
        help="torch device to run the model on: cpu, cuda, cuda:N or mps (default: cuda if available, else cpu)",
    )
    parser.add_argument(
        "--dtype", choices=sorted(DTYPES), default="float32",
        help="weights and activations: float32 (default), bfloat16 or float16 (statistics accumulate in "
             "float32 or float64 either way)",
    )
    parser.add_argument(
        "--json", action="store_true", help="print machine-readable JSON instead of a table"
    )


def add_model_arg(p: argparse.ArgumentParser) -> None:
    """The optional positional MODEL."""
    p.add_argument("model", nargs="?", default=None,
                   help=f"embedded name ({', '.join(EMBEDDED_MODELS)}; default {DEFAULT_MODEL}), a .gguf file, "
                        "an HF model directory, or a hub name (needs the network)")


def add_corpus_args(p: argparse.ArgumentParser, *, tokens: int | None, n_ctx: int) -> None:
    """``--corpus``, ``--tokens`` (when ``tokens`` is given) and ``--n-ctx``."""
    p.add_argument("--corpus", default="english", metavar="PATH|english|python",
                   help="text to run on: a built-in corpus or a .txt/.md file or directory (default: english)")
    if tokens is not None:
        p.add_argument("--tokens", type=positive_int, default=tokens, metavar="N",
                       help=f"tokens to analyse, cut into windows of --n-ctx (default: {tokens:,})")
    p.add_argument("--n-ctx", type=positive_int, default=n_ctx, metavar="N",
                   help=f"tokens per window, BOS included (default: {n_ctx})")


def add_analysis_args(p: argparse.ArgumentParser) -> None:
    """``--bands`` and ``--layers``."""
    p.add_argument("--bands", default="quantiles:4", metavar="SPEC",
                   help="how planes group into bands: planes, all, quantiles:N, wavelength:E1,E2,..., context[:F] "
                        "(default: quantiles:4)")
    p.add_argument("--layers", type=layer_list, default=None, metavar="0,5,11",
                   help="layer indices to analyse (default: all)")


# ---------------------------------------------------------------------------------------- running
def load_from_args(args: argparse.Namespace):
    """Load ``args.model`` on ``args.device``: the shared first step of model subcommands."""
    from transformers.utils import logging as hf_logging

    # transformers draws a "Loading weights" bar on every load; ropelens' own bar (first
    # conversion, which takes a while) is the only one worth showing on the terminal.
    was_enabled = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        return load_model(args.model, device=args.device, dtype=DTYPES[getattr(args, "dtype", "float32")])
    finally:
        if was_enabled:
            hf_logging.enable_progress_bar()


def emit(obj: Any, indent: int = 2) -> None:
    """Print ``obj`` as strict JSON."""
    print(json.dumps(obj, indent=indent, allow_nan=False))


def jsonable_row(row: dict[str, Any]) -> dict[str, Any]:
    """A table row in strict JSON: NaN → null, ±inf → "inf"/"-inf", numpy scalars → Python."""
    # pandas turns a missing window into NaN, and unrotated planes give an infinite wavelength.
    out = {}
    for k, v in row.items():
        if hasattr(v, "item"):
            v = v.item()
        if isinstance(v, float) and math.isnan(v):
            v = None
        elif k == "window" and v is not None:
            v = int(v)
        elif isinstance(v, float) and math.isinf(v):
            v = "inf" if v > 0 else "-inf"
        out[k] = v
    return out
