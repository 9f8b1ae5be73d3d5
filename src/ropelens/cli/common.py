"""Ingredients every ``ropelens`` subcommand is built from: option groups, argument types, JSON
output.

An option group is a small dataclass whose fields are its flags (field metadata holds the help
text) and whose methods do the group's work: :class:`ModelOptions` loads the model,
:class:`CorpusOptions` checks and loads the corpus, :class:`AnalysisOptions` parses bands and
layers, :class:`CheckpointOptions` resumes, :class:`OutputOptions` saves and prints strict JSON.
``Group.add_to(parser)`` declares the flags and ``Group.from_args(args)`` reads them back.
:class:`CorpusCommand` bundles the groups of the commands that stream a corpus.

A :class:`Command` is one subcommand: its name, ``options(parser)`` (which declares its flags from
these groups) and ``run(args) -> int``. Each analysis declares its command (``ropelens.catalog``)
and :mod:`ropelens.cli.main` adds every registered one. Bad input raises
:class:`ropelens.errors.InputError` (or ``OSError`` for files), which ``main`` reports as one line
with exit code 2.
"""

from __future__ import annotations

import argparse
import dataclasses
import inspect
import json
import math
import re
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from ropelens.cli.variant_syntax import parse_variant
from ropelens.errors import ExportUnavailableError, InputError, UsageError
from ropelens.loading.models import DEFAULT_MODEL, EMBEDDED_MODELS, load_model
from ropelens.loading.models import DTYPES as MODEL_DTYPES
from ropelens.results.result import check_result_path
from ropelens.results.serialize import atomic_write_text
from ropelens.run.data import load_corpus
from ropelens.run.distributed import is_main
from ropelens.run.intervene import with_rope_variant
from ropelens.spec.bands import Bands
from ropelens.spec.plan import describe_intervention
from ropelens.spec.reading import model_label, rope_spec
from ropelens.validate import check_output_path

DTYPES = {
    name: MODEL_DTYPES[name] for name in ("float32", "bfloat16", "float16")
}  # what --dtype offers

__all__ = [
    "DTYPES",
    "AnalysisOptions",
    "CheckpointOptions",
    "Command",
    "CorpusCommand",
    "CorpusOptions",
    "ModelOptions",
    "OutputOptions",
    "Parser",
    "add_command",
    "band_tokens",
    "emit",
    "jsonable",
    "layer_list",
    "check_windows_fit",
    "load_from_args",
    "most_windows",
    "non_negative_int",
    "note",
    "note_windows",
    "number_list",
    "positive_int",
    "relay",
    "signature_default",
    "window_length",
]


class Parser(argparse.ArgumentParser):
    """An ``ArgumentParser`` whose errors raise :class:`UsageError` instead of exiting."""

    def error(self, message: str):  # type: ignore[override]
        # argparse would print usage and exit; main reports one line instead.
        raise UsageError(f"{message} (see '{self.prog} --help')")

    def _get_values(self, action: argparse.Action, arg_strings: list[str]) -> Any:
        # `--heads ''` is a value the user typed and emptied, not an absent flag: refuse it here,
        # before a command's `if args.heads` reads it as absent.
        if action.option_strings and "" in arg_strings:
            raise UsageError(
                f"{'/'.join(action.option_strings)} was given an empty value '': pass a value or "
                f"leave the flag out (see '{self.prog} --help')"
            )
        # `--layers=--`: argparse drops a value of `--` (the end of options) and hands the type
        # function nothing, so a one-value flag would read as an empty list
        if action.option_strings and action.nargs is None and arg_strings == ["--"]:
            raise UsageError(
                f"{'/'.join(action.option_strings)} was given '--', which marks the end of "
                f"options, not a value: pass a value or leave the flag out (see '{self.prog} "
                "--help')"
            )
        return super()._get_values(action, arg_strings)

    def _get_value(self, action: argparse.Action, arg_string: str) -> Any:
        # a type function shared by several flags writes `{flag}` where its example needs the flag
        try:
            return super()._get_value(action, arg_string)
        except argparse.ArgumentError as e:
            if "{flag}" not in e.message:
                raise
            flag = "/".join(action.option_strings) or action.dest
            raise argparse.ArgumentError(action, e.message.replace("{flag}", flag)) from None


def add_command(
    subparsers: argparse._SubParsersAction,
    name: str,
    run: Callable[[argparse.Namespace], int],
    distributed: bool = False,
) -> argparse.ArgumentParser:
    """Subcommand ``name`` running ``run`` (its docstring is the help); ``distributed``: it splits
    under torchrun."""
    summary, _, description = inspect.cleandoc(run.__doc__ or name).partition("\n\n")
    p = subparsers.add_parser(
        name, help=summary, description=description.replace("\n", " ") or summary
    )
    p.set_defaults(func=run, distributed=distributed)
    return p


@dataclass(frozen=True)
class Command:
    """A ``ropelens NAME`` subcommand: ``options(parser)`` declares its flags, ``run(args) -> int``
    runs it.

    ``run``'s docstring is the help (first paragraph: the one-line summary in ``ropelens --help``;
    the rest: the description in ``ropelens NAME --help``). ``distributed``: the command splits its
    work under torchrun. An analysis declares its command
    (:class:`ropelens.analyses.registry.Analysis`); ``ropelens.cli.main`` adds every registered one
    to the parser.
    """

    name: str
    run: Callable[[argparse.Namespace], int]
    options: Callable[[argparse.ArgumentParser], Any]
    distributed: bool = False

    def __post_init__(self) -> None:
        if not callable(self.run) or not callable(self.options):
            raise InputError(
                f"command {self.name!r}: run and options must be functions, got {self.run!r}, "
                f"{self.options!r}"
            )

    def add_to(self, subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
        """Add this subcommand and its flags to ``subparsers``."""
        p = add_command(subparsers, self.name, self.run, distributed=self.distributed)
        self.options(p)
        return p


# ----------------------------------------------------------------------------------- argument types
def _int_at_least(text: str, low: int, what: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}") from None
    if value < low:
        raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}")
    return value


def positive_int(text: str) -> int:
    """``argparse`` type: an integer ≥ 1."""
    return _int_at_least(text, 1, "a positive integer")


def non_negative_int(text: str) -> int:
    """``argparse`` type: an integer ≥ 0."""
    return _int_at_least(text, 0, "an integer ≥ 0")


def window_length(text: str) -> int:
    """``argparse`` type: tokens per window, at least 2 (BOS and one token that can attend to
    it)."""
    value = positive_int(text)
    if value < 2:
        raise argparse.ArgumentTypeError(
            f"a window needs at least 2 tokens (BOS and one more), got {text!r}"
        )
    return value


def layer_list(text: str) -> list[int]:
    """``argparse`` type: comma-separated layer indices such as ``0,5,11``."""
    try:
        out = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected comma-separated indices such as 0,5,11, got {text!r}: e.g. {{flag}} 0,5,11"
        ) from None
    if not out:
        raise argparse.ArgumentTypeError(
            f"expected at least one comma-separated index, got {text!r}: e.g. {{flag}} 0,5,11"
        )
    return list(
        dict.fromkeys(out)
    )  # 0,0 is layer 0 once (aliases such as -1 and n−1 meet in layer_indices)


def number_list(text: str, kind, what: str, *, example: str) -> list:
    """``"1,2"`` → ``[1, 2]`` of ``kind`` for the flag ``what``; ``example`` is a value the flag
    accepts."""
    noun = "integers" if kind is int else "numbers"
    try:
        out = [kind(x) for x in text.split(",") if x.strip()]
    except ValueError as e:
        raise InputError(
            f"{what} must be a comma-separated list of {noun}, got {text!r}: e.g. {what} {example}"
        ) from e
    if not out:
        raise InputError(
            f"{what} is empty, got {text!r}: pass a comma-separated list of {noun}, e.g. {what} "
            f"{example}"
        )
    return out


def band_tokens(text: str) -> int | None:
    """``argparse`` type: a token count, or ``all`` (None)."""
    return None if text.strip().lower() == "all" else positive_int(text)


# ------------------------------------------------------------------------------ the library's word
def signature_default(function: Callable[..., Any], argument: str) -> Any:
    """``function``'s default for ``argument``: a command's default is the library's."""
    parameter = inspect.signature(function).parameters[argument]
    if parameter.default is inspect.Parameter.empty:
        raise TypeError(f"{function.__name__}'s argument {argument!r} has no default")
    return parameter.default


# library arguments whose flag is not their name with dashes
_RENAMED = {"max_tokens": "--tokens"}


def flag_of(argument: str) -> str:
    """The flag that spells a library argument: ``skip_queries`` → ``--skip-queries``."""
    return _RENAMED.get(argument, "--" + argument.replace("_", "-"))


def in_flag_terms(message: str, flags: dict[str, str], *, subject_only: bool = False) -> str:
    """``message`` with each argument name in ``flags`` spelled as its flag.

    A library error names an argument as Python spells it (``epsilon must be ...``,
    ``pass probe_heads=[...]``, ``drop 'probe' from metrics``); a command-line user needs the flag.
    Only whole names are replaced, and a Python list written after ``name=`` becomes the flag's
    metavar: ``flags`` may map ``probe_heads`` to ``"--probe-heads L.H,..."`` (the flag, then the
    form of its value). ``subject_only``: replace a name only where it is the subject of a check
    (``name must``, ``name is``), not in prose (``4 layers``) or Python (``name=[]`` in Python).
    """
    for argument, spelling in sorted(flags.items(), key=lambda item: -len(item[0])):
        name, flag = re.escape(argument), spelling.split(" ")[0]
        value = spelling if " " in spelling else f"{flag} VALUE"
        if subject_only:
            message = re.sub(rf"(?<![\w.'-]){name}(?=\s+(?:must|is)\b)", flag, message)
            continue
        message = re.sub(rf"(?<![\w.'-]){name}=\[[^\]]*\]", value, message)
        message = re.sub(rf"(?<![\w.'-]){name}=", f"{flag} ", message)
        message = re.sub(rf"(?<![\w.'-]){name}(?![\w'-])", flag, message)
    return message


def relay(
    function: Callable[..., Any], *args: Any, flags: dict[str, str] | None = None, **kwargs: Any
) -> Any:
    """``function(*args, **kwargs)``; an :class:`InputError` it raises is re-raised in flag terms.

    The library validates its arguments once; the command line relays its verdict. ``flags`` maps
    an argument to the command's flag wherever the message names it; any other keyword argument
    passed is spelled as :func:`flag_of` says where it is the subject of a check
    (``skip_queries must be ≥ 1``).
    """
    flags = flags or {}
    implied = {name: flag_of(name) for name in kwargs if name not in flags}
    try:
        return function(*args, **kwargs)
    except InputError as error:
        message = in_flag_terms(str(error), flags)
        message = in_flag_terms(message, implied, subject_only=True)
        if message == str(error):
            raise
        raise type(error)(message) from error


# ---------------------------------------------------------------------------------------- notes and
# limits
def note(message: str) -> None:
    """Say ``ropelens: note: MESSAGE`` once on stderr (on the main process only): a value was
    adjusted, not refused."""
    if is_main():
        print(f"ropelens: note: {' '.join(message.split())}", file=sys.stderr)


def most_windows(corpus: Any, n_ctx: int) -> int:
    """An upper bound on the windows of ``n_ctx`` tokens (BOS first) any tokenizer can cut from
    ``corpus``.

    A token spans at least one byte of text for every tokenizer in use (byte-level BPE,
    SentencePiece with byte fallback, WordPiece), and a document adds a separator and a prefix at
    most; twice that, for normalisers that expand a character, is a bound no real tokenizer reaches.
    """
    capacity = 2 * (sum(len(d.encode("utf-8")) for d in corpus.documents) + 2 * corpus.n_documents)
    return capacity // max(1, n_ctx - 1)


def check_windows_fit(
    corpus: Any, n_ctx: int, asked: int, flag: str, per_window: int = 1, other_corpus: bool = True
) -> None:
    """Refuse ``flag asked`` (``per_window`` of it per window) when ``corpus`` cannot hold that many
    windows.

    A value the corpus merely falls short of is measured on what it holds, with a
    :func:`note_windows`.
    """
    most = most_windows(corpus, n_ctx)
    if most and asked // per_window > most:
        size = sum(len(d.encode("utf-8")) for d in corpus.documents)
        raise InputError(
            f"{flag} {asked:,} is more than corpus {corpus.name!r} can hold: its {size:,} bytes "
            f"of text make at most {most:,} windows of --n-ctx {n_ctx} with any tokenizer: pass "
            f"{flag} {most * per_window} or "
            f"fewer{', or a larger --corpus' if other_corpus else ''}"
        )


def note_windows(
    corpus: str | None,
    used: int,
    n_ctx: int,
    asked: int,
    flag: str,
    per_window: int = 1,
    default: bool = False,
) -> None:
    """:func:`note` that ``corpus`` held ``used`` windows where ``flag asked`` (the command's
    default, with ``default``) wanted more."""
    if used < asked // per_window:
        said = f"the default {flag} {asked:,}" if default else f"{flag} {asked:,}"
        note(
            f"{said} asks for {asked // per_window:,} windows of {n_ctx} tokens but corpus "
            f"{corpus!r} holds {used:,}: measured all {used:,} ({used * n_ctx:,} tokens)"
        )


# ------------------------------------------------------------------------------------ option groups
def option(default: Any, help: str, **argparse_kw: Any) -> Any:
    """A dataclass field that is also the flag ``--field-name``; ``{default}`` in ``help`` is filled
    in."""
    return field(default=default, metadata={"help": help, **argparse_kw})


class OptionGroup:
    """A dataclass of flags: ``add_to`` declares them on a parser, ``from_args`` reads them back."""

    title: ClassVar[str]

    @classmethod
    def add_to(
        cls,
        parser: argparse.ArgumentParser,
        *,
        omit: Sequence[str] = (),
        taken: Sequence[str] = (),
        **defaults: Any,
    ) -> argparse._ArgumentGroup:
        """Declare every field not in ``omit`` or ``taken`` as a flag, under this group's heading;
        ``defaults`` override. ``taken``: fields whose flag the command declares itself with
        another meaning (passkey-retrieval's own ``--variant``), never read back as this group's."""
        group = parser.add_argument_group(cls.title)
        for f in dataclasses.fields(cls):  # type: ignore[arg-type]
            if f.name not in omit and f.name not in taken:
                _add_field(group, f, defaults.get(f.name, f.default))
        if taken:
            parser.set_defaults(**{_taken(cls): tuple(taken)})
        return group

    @classmethod
    def from_args(cls, args: argparse.Namespace):
        """The group as parsed; a field the command does not declare keeps its default."""
        given = vars(
            args
        )  # the parsed flags only: nnsight, once imported, gives every object a save
        taken = given.get(_taken(cls), ())
        names = [f.name for f in dataclasses.fields(cls) if f.name not in taken]  # type: ignore[arg-type]
        return cls(**{n: given[n] for n in names if n in given})


def _taken(group: type) -> str:
    """Where a parser keeps the fields of ``group`` whose flags the command took for itself."""
    return f"_taken_{group.__name__}"


def _add_field(
    group: argparse._ArgumentGroup | argparse.ArgumentParser,
    f: dataclasses.Field,
    default: Any,
    **override: Any,
) -> None:
    kw = {**f.metadata, **override}
    kw["help"] = kw["help"].format(default=default) if "{default" in kw["help"] else kw["help"]
    if kw.pop("positional", False):
        group.add_argument(f.name, nargs="?", default=default, **kw)
    else:
        group.add_argument("--" + f.name.replace("_", "-"), default=default, **kw)


MODEL_HELP = (
    f"embedded name ({', '.join(EMBEDDED_MODELS)}; default {DEFAULT_MODEL}), a .gguf file, "
    "an HF model directory, or a hub name (needs the network)"
)


@dataclass
class ModelOptions(OptionGroup):
    """Which model to run, on which device, in which dtype."""

    title: ClassVar[str] = "model"
    model: str | None = option(None, MODEL_HELP, positional=True)
    device: str | None = option(
        None,
        "torch device to run the model on: cpu, cuda, cuda:N or mps (default: cuda if available, "
        "else cpu)",
    )
    dtype: str = option(
        "float32",
        "weights and activations: float32 (default), bfloat16 or float16 (statistics "
        "accumulate in float32 or float64 either way)",
        choices=sorted(DTYPES),
    )
    variant: str | None = option(
        None,
        "run the model under a RoPE variant (e.g. prope:0.75, nope, linear:4, yarn:4:8192): "
        "every number, spec and result then describes the model as it runs under it, and says "
        "so; `ropelens variant-frequencies --help` lists the forms",
        metavar="SPEC",
    )
    variant_layers: list[int] | None = option(
        None,
        "the layers --variant applies to (default: every rotary layer), e.g. 0,5,11",
        type=layer_list,
        metavar="LAYERS",
    )

    @classmethod
    def add_to(
        cls, parser: argparse.ArgumentParser, *, flag_help: str | None = None, **kw: Any
    ) -> argparse._ArgumentGroup:
        """MODEL as the optional positional, or as ``--model`` with ``flag_help`` (a command where
        it is optional)."""
        if flag_help is None:
            return super().add_to(parser, **kw)
        group = super().add_to(parser, omit=("model",), **kw)
        group.add_argument("--model", default=None, help=flag_help)
        return group

    def load(self):
        """The model, loaded by :func:`ropelens.loading.models.load_model` without transformers'
        progress bar."""
        from transformers.utils import logging as hf_logging

        # transformers draws a "Loading weights" bar on every load; ropelens' own bar (first
        # conversion, which takes a while) is the only one worth showing on the terminal.
        if self.variant_layers is not None and self.variant is None:
            raise InputError("--variant-layers needs --variant: name the variant to apply")
        variant = parse_variant(self.variant) if self.variant is not None else None
        was_enabled = hf_logging.is_progress_bar_enabled()
        hf_logging.disable_progress_bar()
        try:
            model = load_model(self.model, device=self.device, dtype=DTYPES[self.dtype])
        finally:
            if was_enabled:
                hf_logging.enable_progress_bar()
        if variant is None:
            return model
        try:
            model = with_rope_variant(model, variant, self.variant_layers, in_place=True)
        except InputError as err:
            raise InputError(in_flag_terms(str(err), {"layers": "--variant-layers"})) from None
        under = "; ".join(describe_intervention(i) for i in rope_spec(model).interventions)
        note(f"{model_label(model)} runs under {under}")
        return model


def load_from_args(args: argparse.Namespace):
    """The model a command's :class:`ModelOptions` name: every command loads through this one
    function."""
    return ModelOptions.from_args(args).load()


@dataclass
class CorpusOptions(OptionGroup):
    """The text a command streams, cut into windows of ``n_ctx`` tokens."""

    title: ClassVar[str] = "corpus"
    corpus: str = option(
        "english",
        "text to run on: a built-in corpus, a .txt/.md file, a .jsonl/.csv/.parquet file (one "
        "document per row), a folder or glob of them, or a datasets save_to_disk folder "
        "(default: english)",
        metavar="PATH|english|python",
    )
    text_column: str = option(
        "text",
        "the column of a .jsonl/.csv/.parquet file or dataset that holds the text (default: "
        "{default})",
        metavar="NAME",
    )
    tokens: int | None = option(
        None,
        "tokens to analyse, cut into windows of --n-ctx (default: {default:,})",
        type=positive_int,
        metavar="N",
    )
    n_ctx: int = option(
        512, "tokens per window, BOS included (default: {default})", type=window_length, metavar="N"
    )

    @classmethod
    def add_to(
        cls,
        parser: argparse.ArgumentParser,
        *,
        tokens: int | None,
        n_ctx: int,
        corpus_group: argparse._MutuallyExclusiveGroup | None = None,
    ) -> argparse._ArgumentGroup:
        """``--corpus``, ``--tokens`` (when ``tokens`` is given) and ``--n-ctx``; ``--corpus`` may
        join ``corpus_group``."""
        omit = ("tokens",) * (tokens is None) + ("corpus",) * (corpus_group is not None)
        group = super().add_to(parser, omit=omit, tokens=tokens, n_ctx=n_ctx)
        if corpus_group is not None:
            corpus = next(f for f in dataclasses.fields(cls) if f.name == "corpus")
            _add_field(corpus_group, corpus, corpus.default)
        return group

    @classmethod
    def add_text_column(cls, group: argparse._ArgumentGroup | argparse.ArgumentParser) -> None:
        """``--text-column`` alone, for a command that declares its own ``--corpus``."""
        column = next(f for f in dataclasses.fields(cls) if f.name == "text_column")
        _add_field(group, column, column.default)

    def check(self) -> None:
        """At least one window: ``--tokens`` ≥ ``--n-ctx``."""
        if self.tokens is not None and self.tokens < self.n_ctx:
            raise InputError(
                f"--tokens {self.tokens} is fewer than one window of --n-ctx {self.n_ctx}: "
                "raise --tokens or lower --n-ctx"
            )

    def load(self):
        """The corpus, after :meth:`check` (both fail before any model loads)."""
        self.check()
        return load_corpus(self.corpus, text_column=self.text_column)

    def n_windows(self, command: str, *, at_least: int = 1, default: bool = False) -> int:
        """The windows of ``--n-ctx`` tokens that ``--tokens`` makes (``tokens // n_ctx``), refused
        in the flags' terms, with the ``--tokens`` that would do, where ``command`` needs at least
        ``at_least``; ``default``: ``--tokens`` is the command's default, not typed."""
        made = self.tokens // self.n_ctx
        if made < at_least:
            said = "the default --tokens" if default else "--tokens"
            shorter = self.tokens // at_least  # the longest window that makes enough of them
            raise InputError(
                f"{said} {self.tokens} with --n-ctx {self.n_ctx} makes {made} "
                f"window{'' if made == 1 else 's'}; {command} needs at least {at_least}: pass "
                f"--tokens {at_least * self.n_ctx} or more"
                + (f", or --n-ctx {shorter} or less" if shorter >= 2 else "")
            )
        return made


@dataclass
class AnalysisOptions(OptionGroup):
    """Which bands planes group into, which layers to analyse, and whether the reading is verified
    first."""

    title: ClassVar[str] = "analysis"
    bands: str | None = option(
        None,
        "how planes group into bands: planes, all, quantiles:N, wavelength:E1,E2,..., "
        "context[:F] (default: quantiles:<=4, four bands or one per plane where a layer has fewer)",
        metavar="SPEC",
    )
    layers: list[int] | None = option(
        None, "layer indices to analyse (default: all)", type=layer_list, metavar="0,5,11"
    )
    no_verify: bool = option(
        False,
        "measure without first checking ropelens's reading against the model's own "
        "attention (results are marked unverified)",
        action="store_true",
    )

    @classmethod
    def add_to(
        cls, parser: argparse.ArgumentParser, *, bands: bool = True, default_bands: Any = None
    ) -> argparse._ArgumentGroup:
        """``--layers``, and ``--bands`` unless ``bands=False``; ``default_bands``: the analysis's
        own default :class:`ropelens.spec.bands.Bands` (default: ``Bands.default()``, as most
        analyses)."""
        default = (default_bands or Bands.default()).describe()
        group = super().add_to(parser, omit=("bands",), bands=default)
        if bands:
            field = next(f for f in dataclasses.fields(cls) if f.name == "bands")
            help_text = field.metadata["help"].split(" (default")[0] + f" (default: {default})"
            _add_field(group, field, default, help=help_text)
        return group

    def parsed_bands(self):
        """The :class:`ropelens.spec.bands.Bands` of ``--bands`` (None without the flag)."""
        return None if self.bands is None else Bands.parse(self.bands, flag="--bands")

    def __post_init__(self) -> None:
        if isinstance(self.bands, str):
            self.parsed_bands()  # a bad --bands fails before the corpus or the model loads


@dataclass
class CheckpointOptions(OptionGroup):
    """Resumable streaming: save progress to a directory, pick up there when started again."""

    title: ClassVar[str] = "checkpoint"
    checkpoint: str | None = option(
        None, "save progress to DIR; the same command started again resumes there", metavar="DIR"
    )
    checkpoint_every: int = option(
        8, "batches between checkpoints (default: {default})", type=positive_int, metavar="N"
    )

    def kwargs(self) -> dict[str, Any]:
        """``checkpoint``/``checkpoint_every`` for the analysis when ``--checkpoint`` is set (every
        corpus analysis resumes)."""
        if self.checkpoint is None:
            return {}
        check_output_path(self.checkpoint, "--checkpoint", directory=True)  # before the model loads
        return {"checkpoint": self.checkpoint, "checkpoint_every": self.checkpoint_every}


@dataclass
class OutputOptions(OptionGroup):
    """Where the full result is saved, and whether the printout is a table or JSON."""

    title: ClassVar[str] = "output"
    save: str | None = option(None, "also save the full result as JSON", metavar="FILE.json")
    json: bool = option(
        False, "print machine-readable JSON instead of a table", action="store_true"
    )
    quiet: bool = option(
        False, "no progress bars (they show on a terminal's stderr otherwise)", action="store_true"
    )

    @classmethod
    def add_to(
        cls,
        parser: argparse.ArgumentParser,
        *,
        save: str | None = None,
        deprecated_out: bool = False,
    ) -> argparse._ArgumentGroup:
        """``--json``, and ``--save`` when ``save`` names what is saved (e.g. ``"AttentionSinks
        JSON"``)."""
        group = parser.add_argument_group(cls.title)
        fields = {f.name: f for f in dataclasses.fields(cls)}
        if save is not None:
            _add_field(group, fields["save"], None, help=f"also save the full result ({save})")
            if deprecated_out:  # the old spelling keeps working, out of --help
                group.add_argument(
                    "--out", dest="save", action=_DeprecatedAlias, help=argparse.SUPPRESS
                )
        _add_field(group, fields["json"], False)
        _add_field(group, fields["quiet"], False)
        return group

    @property
    def progress(self) -> bool:
        """Progress bars (tqdm, on stderr) only on a terminal, with a table, and without
        ``--quiet``."""
        # a bar would garble JSON read by a program, and fills a log file with carriage returns
        return not (self.json or self.quiet) and sys.stderr.isatty()

    def check(self) -> None:
        """``--save`` names a file in a writable directory (created only when the result is
        saved), as JSON (``.json``, or ``.json.gz`` compressed)."""
        if self.save:
            check_output_path(self.save, "--save")
            try:
                check_result_path(self.save)
            except InputError as e:
                raise InputError(f"--save {e}") from e

    def save_result(self, result: Any) -> None:
        """``result.save(--save)`` on the main process, when ``--save`` is given."""
        if self.save and is_main():
            result.save(self.save)

    def save_and_show(
        self,
        result: Any,
        frame: Any,
        rows: str,
        head: dict[str, Any] | None = None,
        tail: dict[str, Any] | None = None,
    ) -> int:
        """Save ``result`` (when ``--save`` is given), then print its findings and ``frame`` as a
        table; with ``--json``, one object instead: ``head``, the findings, ``frame``'s records
        under ``rows``, ``tail``. 0, the command's exit code."""
        self.save_result(result)
        findings = [f.text for f in result.findings()]
        if self.json:
            return self.emit(
                {
                    **(head or {}),
                    "findings": findings,
                    rows: frame.to_dict("records"),
                    **(tail or {}),
                }
            )
        for text in findings:
            print(text)
        print(frame.to_string(index=False, float_format="%.3f"))
        return 0

    def emit(self, obj: Any, indent: int = 2) -> int:
        """Print ``obj`` as strict JSON (:func:`emit`); 0, the command's exit code."""
        emit(obj, indent=indent)
        return 0


FIGURE_SUFFIXES = (".html", ".png", ".pdf", ".svg")  # what --figure writes, told by its suffix


def check_figure_path(path: str, flag: str = "--figure", *, save: str | None = None) -> Path:
    """``path`` for ``flag``, checked before the run: a file in a writable directory, named
    ``.html`` (a self-contained page) or ``.png``, ``.pdf``, ``.svg`` (static export, which must
    work here), and not the file ``--save`` writes."""
    p = check_output_path(path, flag)
    suffix = p.suffix.lower()
    if suffix not in FIGURE_SUFFIXES:
        what = repr(suffix) if suffix else "a name without one"
        raise InputError(
            f"{flag} {path}: the suffix chooses the figure's format, and {what} is not one of "
            f"{', '.join(FIGURE_SUFFIXES)}: name it {p.with_suffix('.html').name} (or .png, "
            ".pdf, .svg)"
        )
    if save is not None and _same_file(p, Path(save)):
        raise InputError(
            f"--save and {flag} both name {path}: the one would overwrite the other; pass two "
            f"files, such as --save {p.with_suffix('.json').name} {flag} {p.name}"
        )
    if suffix != ".html":
        from ropelens.plots.export import export_unavailable

        why = export_unavailable()
        if why is not None:
            raise ExportUnavailableError(f"{flag} {path}: {why}; or name it .html")
    return p


def _same_file(a: Path, b: Path) -> bool:
    return a.expanduser().resolve() == b.expanduser().resolve()


def write_figure_file(fig: Any, path: str | Path) -> Path:
    """Write ``fig`` as :func:`check_figure_path`'s ``path`` says: a self-contained HTML page
    (plotly.js inside, works offline) or a PNG, PDF or SVG; atomically. The path written."""
    path = Path(path)
    if path.suffix.lower() == ".html":
        atomic_write_text(path, fig.to_html(include_plotlyjs=True))
        return path
    from ropelens.plots.export import write_figure

    return write_figure(fig, path)


class _DeprecatedAlias(argparse.Action):
    """An old spelling of a flag: stores like the new one and says which to use."""

    def __call__(self, parser, namespace, values, option_string=None):  # noqa: ARG002
        print(
            f"ropelens: warning: {option_string} is deprecated; use --{self.dest}", file=sys.stderr
        )
        setattr(namespace, self.dest, values)


@dataclass
class CorpusCommand:
    """The option groups of a command that streams a corpus through a model."""

    command: str
    corpus: CorpusOptions
    analysis: AnalysisOptions
    checkpoint: CheckpointOptions
    output: OutputOptions
    tokens_default: int | None = None  # the command's --tokens when none is given

    @staticmethod
    def add_to(
        parser: argparse.ArgumentParser, *, tokens: int, n_ctx: int, save: str, bands: bool = True
    ) -> None:
        """Model, corpus, analysis, checkpoint and output flags; ``save`` names the saved result."""
        ModelOptions.add_to(parser)
        CorpusOptions.add_to(parser, tokens=tokens, n_ctx=n_ctx)
        parser.set_defaults(tokens_default=tokens)
        AnalysisOptions.add_to(parser, bands=bands)
        CheckpointOptions.add_to(parser)
        OutputOptions.add_to(parser, save=save)

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> CorpusCommand:
        """Every group but the model's (:func:`load_from_args` loads it) as parsed; a bad
        ``--bands`` fails here."""
        return cls(
            args.command,
            CorpusOptions.from_args(args),
            AnalysisOptions.from_args(args),
            CheckpointOptions.from_args(args),
            OutputOptions.from_args(args),
            getattr(args, "tokens_default", None),
        )

    def prepare(self, analysis: Callable[..., Any]) -> tuple[Any, dict[str, Any]]:
        """The checked corpus and the keyword arguments of ``analysis``: all that can fail before
        the model loads.

        A ``--tokens`` no tokenizer could cut from the corpus is refused; one the corpus falls short
        of is measured on the whole corpus, and :meth:`measured` says so.
        """
        corpus = self.corpus.load()
        tokens = self.corpus.tokens
        if (
            tokens is not None and tokens != self.tokens_default
        ):  # the default is not the user's request
            check_windows_fit(
                corpus, self.corpus.n_ctx, tokens, "--tokens", per_window=self.corpus.n_ctx
            )
        self.output.check()
        kw: dict[str, Any] = {
            "n_ctx": self.corpus.n_ctx,
            "max_tokens": self.corpus.tokens,
            "layers": self.analysis.layers,
            "progress": self.output.progress,
        }
        bands = self.analysis.parsed_bands()
        # frequency_usage takes no bands: usage's bands only group its printout
        if bands is not None and "bands" in inspect.signature(analysis).parameters:
            kw["bands"] = bands
        if self.analysis.no_verify:
            kw["verify"] = False
        return corpus, {**kw, **self.checkpoint.kwargs()}

    def measured(self, result: Any) -> dict[str, Any]:
        """What ``result`` ran on (``n_ctx``, ``n_windows``, ``n_tokens`` from its provenance), for
        the JSON; a corpus that held fewer windows than ``--tokens`` asked for gets one note."""
        prov = result.provenance
        tokens = self.corpus.tokens
        if tokens is not None and prov.n_windows is not None:
            note_windows(
                prov.corpus,
                prov.n_windows,
                self.corpus.n_ctx,
                tokens,
                "--tokens",
                per_window=self.corpus.n_ctx,
                default=tokens == self.tokens_default,
            )
        return {"n_ctx": prov.n_ctx, "n_windows": prov.n_windows, "n_tokens": prov.n_tokens}


# -------------------------------------------------------------------------------------- JSON output
def jsonable(obj: Any, key: str | None = None) -> Any:
    """``obj`` in strict JSON: NaN → null, ±inf → "inf"/"-inf", numpy → Python, tuples → lists."""
    # pandas turns a missing window into NaN, and unrotated planes give an infinite wavelength.
    if isinstance(obj, dict):
        return {k: jsonable(v, k) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [jsonable(v) for v in obj]
    if isinstance(obj, np.ndarray):
        return jsonable(obj.tolist())
    if isinstance(obj, np.generic):
        obj = obj.item()
    if isinstance(obj, float):
        if math.isnan(obj):
            return None
        if math.isinf(obj):
            return "inf" if obj > 0 else "-inf"
        if key == "window":  # a window size column pandas made float to hold a NaN
            return int(obj)
    return obj


def emit(obj: Any, indent: int = 2) -> None:
    """Print ``obj`` as strict JSON (:func:`jsonable` first, so NaN and inf cannot break it)."""
    print(json.dumps(jsonable(obj), indent=indent, allow_nan=False))
