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
    """Bad input to ropelens: the message names the offending value and how to fix it."""


class NotRotaryError(InputError):
    """The model has no rotary position embeddings, so there is nothing for ropelens to measure."""


class UnsupportedModelError(InputError):
    """The model uses RoPE in a way ropelens cannot measure exactly, so it refuses instead of
    guessing."""


class UsageError(InputError):
    """Bad command-line input (an unknown option, a malformed value): reported as one line."""


class ExportUnavailableError(InputError):
    """A figure cannot be written as PNG, SVG or PDF here: kaleido or a Chromium-based browser is
    missing (the message names which, and how to install it)."""


class RopelensWarning(UserWarning):
    """Something ropelens did to the input that the caller should know of (it went on)."""


class TruncatedInputWarning(RopelensWarning):
    """An input was cut to the model's context: only its first tokens were measured."""
