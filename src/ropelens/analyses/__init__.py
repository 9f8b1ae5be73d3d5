"""The measurements: one module per analysis, each a reducer (or a function of the spec) and its result.

Corpus analyses (usage, band statistics, heads, sinks, distance, massive values, rotary offsets)
stream windows through :func:`ropelens.run.measure.measure`; the others read the spec (decay, context
extension, base predictors), a single input (decomposition) or run the model under a variant
(passkey). Import the public names from :mod:`ropelens`; this package only groups the modules.
"""

from __future__ import annotations

import os

from ropelens.results import result as _result_base

__all__ = ["load_result", "result_classes"]


def result_classes() -> dict[str, type[_result_base.Result]]:
    """Every result class by the kind its files carry.

    A class registers its kind when it is created, so a kind is known once its module is imported; this
    imports every analysis module that defines a result, whatever the caller imported before.
    """
    from ropelens.analyses import (  # noqa: F401  (importing a module registers its result classes)
        band_location,
        band_stats,
        context,
        decompose,
        distance,
        entropy,
        extension,
        extrapolation,
        heads,
        knockout,
        massive,
        mrope,
        offsets,
        passkey,
        pe_geometry,
        positional_symbolic,
        retrieval,
        sinks,
        trajectory,
        usage,
    )

    return _result_base.registered()


def load_result(path: str | os.PathLike[str]) -> _result_base.Result:
    """Read any result file ropelens writes, whichever analysis wrote it (dispatched on the file's ``type``)."""
    result_classes()
    return _result_base.load_result(path)
