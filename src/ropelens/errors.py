"""Every error ropelens raises on purpose, in one place.

:class:`InputError` is the base for bad input (a wrong argument, a model ropelens cannot measure,
an unreadable file's content). It subclasses ``ValueError``, so ``except ValueError`` keeps working;
the command line catches it once and prints its message (which names the problem and the fix)
as one line with exit code 2. Anything else that escapes is a bug and keeps its traceback.
"""

from __future__ import annotations

__all__ = [
    "ExportUnavailableError",
    "InputError",
    "NotRotaryError",
    "RopelensWarning",
    "TruncatedInputWarning",
    "UnsupportedModelError",
    "UsageError",
]


class InputError(ValueError):
    """Bad input to ropelens: the message names the offending value and how to fix it.

    The base of every error ropelens raises on purpose about what it was given (a wrong argument,
    a model it cannot measure, an unreadable file's content). It subclasses ``ValueError``, so
    ``except ValueError`` keeps working; the command line catches it once and prints its message
    as one line with exit code 2.

    Examples:
        >>> from ropelens import Bands, InputError
        >>> try:
        ...     Bands.quantiles(0)
        ... except InputError as e:
        ...     print(e)
        quantiles needs a positive integer number of bands, got 0
        >>> issubclass(InputError, ValueError)
        True
    """


class NotRotaryError(InputError):
    """The model has no rotary position embeddings, so there is nothing for ropelens to measure.

    Raised when a spec is read from a model with learned or sinusoidal absolute position
    embeddings (GPT-2, OPT, ...); the message points to
    :func:`ropelens.analyses.pe_similarity`, which measures those.

    Examples:
        >>> from ropelens import NotRotaryError, rope_spec
        >>> from ropelens.testing import tiny_model
        >>> try:
        ...     rope_spec(tiny_model("gpt2"))
        ... except NotRotaryError as e:
        ...     print(e)
        GPT2LMHeadModel uses 'standard' position embeddings, not RoPE: ...
    """


class UnsupportedModelError(InputError):
    """The model uses RoPE in a way ropelens cannot measure exactly, so it refuses instead of
    guessing.

    A measurement that would silently be wrong (a mask that depends on the input, a rotation no
    backend can reach) raises this; the message says what was seen and what does work (shorter
    windows, another analysis, another loading path).

    Examples:
        A chunked-attention layer (Llama 4) refuses windows longer than its chunk wherever an
        analysis assumes the causal mask:

        >>> import torch
        >>> from ropelens import LayerRope, UnsupportedModelError
        >>> layer = LayerRope(
        ...     layer=0, inv_freq=10000.0 ** -(torch.arange(4) / 4), head_dim=8, rotary_dim=8,
        ...     pairing="half", n_heads=2, n_kv_heads=1, score_scale=8**-0.5, chunk=4,
        ... )
        >>> try:
        ...     layer.require_static_mask(8, "this analysis")
        ... except UnsupportedModelError as e:
        ...     print(e)
        layer 0 attends in chunks of 4 tokens ... use windows of at most 4 tokens (--n-ctx), ...
    """


class UsageError(InputError):
    """Bad command-line input (an unknown option, a malformed value): reported as one line.

    The ``ropelens`` command's parsers raise it instead of printing usage and exiting, so the
    command reports it like any other :class:`InputError` (one line, exit code 2).

    Examples:
        >>> from ropelens.cli.main import build_parser
        >>> from ropelens.errors import UsageError
        >>> try:
        ...     build_parser().parse_args(["frequency-usage", "--bogus"])
        ... except UsageError as e:
        ...     print(e)
        unrecognized arguments: --bogus (see 'ropelens --help')
    """


class ExportUnavailableError(InputError):
    """A figure cannot be written as PNG, SVG or PDF here: kaleido or a Chromium-based browser is
    missing (the message names which, and how to install it).

    Writing HTML never needs either; only the static formats do
    (:func:`ropelens.plots.export.write_figures`, ``--figures`` of the report).

    Examples:
        It is an :class:`InputError`, so one ``except`` covers every refusal:

        >>> from ropelens.errors import ExportUnavailableError, InputError
        >>> try:
        ...     raise ExportUnavailableError("kaleido is not installed: pip install kaleido")
        ... except InputError as e:
        ...     print(type(e).__name__, "-", e)
        ExportUnavailableError - kaleido is not installed: pip install kaleido
    """


class RopelensWarning(UserWarning):
    """Something ropelens did to the input that the caller should know of (it went on).

    The base of ropelens's warnings, so that one filter silences or escalates them all.

    Examples:
        >>> import warnings
        >>> from ropelens.errors import RopelensWarning, TruncatedInputWarning
        >>> issubclass(TruncatedInputWarning, RopelensWarning)
        True
        >>> with warnings.catch_warnings():
        ...     warnings.simplefilter("error", RopelensWarning)  # make every one an error
        ...     try:
        ...         warnings.warn("cut", TruncatedInputWarning)
        ...     except RopelensWarning as w:
        ...         print(type(w).__name__)
        TruncatedInputWarning
    """


class TruncatedInputWarning(RopelensWarning):
    """An input was cut to the model's context: only its first tokens were measured.

    Said once per call, naming each text that was cut, its length and the limit
    (:func:`ropelens.run.texts.text_tokens`, which the single-text analyses such as
    :func:`ropelens.analyses.attention_decomposition` use).

    Examples:
        >>> import warnings
        >>> from ropelens.errors import TruncatedInputWarning
        >>> from ropelens.run.texts import text_tokens
        >>> from ropelens.testing import tiny_model
        >>> model = tiny_model("llama")
        >>> with warnings.catch_warnings(record=True) as caught:
        ...     warnings.simplefilter("always")
        ...     cut = text_tokens(model, "The cat sat on the mat.", limit=8)
        >>> caught[0].category is TruncatedInputWarning
        True
        >>> print(caught[0].message)
        text is 24 tokens, longer than the model's trained context of 8: decomposed its first 8
    """
