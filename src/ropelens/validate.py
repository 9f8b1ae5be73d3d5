"""Validation of user-given numbers, flags and index lists, with errors that name the fix."""

from __future__ import annotations

import math
import numbers
import operator
import os
import tempfile
from pathlib import Path
from typing import Any

from torch import Tensor

from ropelens.errors import InputError

__all__ = [
    "check_factors",
    "check_flag",
    "check_indices",
    "check_number",
    "check_output_path",
    "check_positive_int",
    "shown",
]

_OPS = {">": operator.gt, ">=": operator.ge, "<=": operator.le}
SHOWN_CHARS = 80  # the longest repr an error quotes; a longer one is named by its type


def shown(x: Any) -> str:
    """``x`` as an error quotes the value it was given: its repr where that is one short line, a
    long string's start, else its type (a model's repr runs to kilobytes).

    Examples:
        >>> shown(1.5), shown("half")
        ('1.5', "'half'")
        >>> shown("x" * 100) == repr("x" * SHOWN_CHARS) + "…"
        True
        >>> shown(list(range(100)))
        'a list'
    """
    if isinstance(x, str) and len(x) > SHOWN_CHARS:
        return repr(x[:SHOWN_CHARS]) + "…"
    text = repr(x)
    if len(text) <= SHOWN_CHARS and "\n" not in text:
        return text
    return f"a {type(x).__name__}"


def check_number(
    x: Any,
    what: str,
    *,
    above: float | None = None,
    at_least: float | None = None,
    at_most: float | None = None,
    integer: bool = False,
    hint: str = "",
) -> Any:
    """``x`` as a float (or int), or an InputError naming ``what``, the bounds and ``hint``."""
    kind = numbers.Integral if integer else numbers.Real
    if isinstance(x, bool) or not isinstance(x, kind) or not math.isfinite(x):
        raise InputError(
            f"{what} must be a finite {'integer' if integer else 'number'}, got {shown(x)}{hint}"
        )
    bounds = [
        (op, b) for op, b in ((">", above), (">=", at_least), ("<=", at_most)) if b is not None
    ]
    if not all(_OPS[op](x, b) for op, b in bounds):
        wanted = " and ".join(f"{op} {b:g}" for op, b in bounds)
        raise InputError(f"{what} must be {wanted}, got {x!r}{hint}")
    return int(x) if integer else float(x)


def check_positive_int(x: Any, what: str, hint: str = "") -> int:
    """``x`` as an int if it is a positive integer (not a bool), else an InputError naming
    ``what``."""
    if isinstance(x, bool) or not isinstance(x, numbers.Integral) or x <= 0:
        raise InputError(f"{what} must be a positive int, got {shown(x)}{hint}")
    return int(x)


def check_flag(x: Any, what: str) -> bool:
    """``x`` if it is a bool, else an InputError naming ``what``."""
    if not isinstance(x, bool):
        raise InputError(f"{what} must be True or False, got {shown(x)}")
    return x


def check_factors(xs: Any, what: str) -> tuple[float, ...]:
    """Positive finite per-plane factors as floats."""
    return tuple(
        check_number(x, f"each {what} entry", above=0, hint=" (a per-plane rescale factor)")
        for x in xs
    )


def check_indices(values: Any, what: str, n: int | None = None, owner: str = "") -> tuple[int, ...]:
    """Sorted unique non-negative ints (plane or head indices), optionally checked against ``n``."""
    if isinstance(values, Tensor):
        values = values.flatten().tolist()
    if isinstance(values, numbers.Integral) and not isinstance(values, bool):
        values = [values]
    for i in values:
        if isinstance(i, bool) or not isinstance(i, numbers.Integral) or i < 0:
            raise InputError(f"{what} indices must be non-negative ints, got {shown(i)}")
    out = tuple(sorted({int(i) for i in values}))
    bad = [i for i in out if n is not None and i >= n]
    if bad:
        raise InputError(f"{what} indices {bad} out of range: {owner} has {n} {what}s (0..{n - 1})")
    return out


def check_output_path(path: str | os.PathLike[str], what: str, *, directory: bool = False) -> Path:
    """``path`` as a Path if a file (or with ``directory`` a folder) can be written there; creates
    nothing.

    The nearest existing folder on the way must be a writable directory: a probe folder is made in
    it and removed at once, so a run that fails later (the model does not load, say) leaves no
    trace.
    """
    p = Path(path).expanduser()
    if directory and p.exists() and not p.is_dir():
        raise InputError(f"{what} {path} is a file: pass a directory (it is created if missing)")
    if not directory and p.is_dir():
        raise InputError(
            f"{what} {path} is a directory: pass a file path such as {p / 'result.json'}"
        )
    ancestor = p if directory else p.parent
    while not ancestor.exists() and ancestor != ancestor.parent:
        ancestor = ancestor.parent
    if not ancestor.is_dir():
        raise InputError(
            f"{what} {path}: {ancestor} is a file, not a directory: pass a path in a writable "
            "directory"
        )
    try:
        os.rmdir(tempfile.mkdtemp(prefix=".ropelens-probe-", dir=ancestor))
    except OSError as e:
        raise InputError(
            f"{what} {path}: cannot write in {ancestor} ({e.strerror or e}): "
            "pass a path in a writable directory"
        ) from e
    return p
