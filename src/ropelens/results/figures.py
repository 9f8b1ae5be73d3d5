"""Where a result finds its figures: the numbers live in ``ropelens.analyses``, the drawing in
``ropelens.plots``.

Drawing functions are registered one per class and name (``register_figure(FrequencyUsage,
usage_figure)``, ``register_figure(FrequencyUsage, usage_heatmap, "heatmap")``); a result's
``figure()`` (and any other drawing method it has) looks the function up here and calls it with the
result first. Each analysis declares its figures (``Analysis(figures=draw(FrequencyUsage,
figure=usage_figure, heatmap=usage_heatmap))``) and registering the analysis registers them.
ropelens's own analyses are registered by ``ropelens.catalog``, which :func:`load_catalog` imports
the first time a figure or the registry is asked for: ``import ropelens`` defines names and imports
neither the catalog nor plotly.

Static export (PNG, SVG, PDF) lives in ``ropelens.plots.export``, above this layer: the catalog
registers its writer here (:func:`register_writer`), and a result's ``save_figure`` finds it through
:func:`figure_writer`, as ``figure()`` finds its drawing function.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

__all__ = [
    "figure_of",
    "figure_writer",
    "load_catalog",
    "register_figure",
    "register_writer",
    "registered_figures",
]

_FIGURES: dict[tuple[type, str], Callable[..., Any]] = {}
_WRITER: list[Callable[..., Any]] = []  # the static-export writer, once registered


def register_figure(cls: type, fn: Callable[..., Any], name: str = "figure") -> None:
    """Draw ``cls``'s ``name`` figure (its ``figure()`` by default) with ``fn(result, *args,
    **kwargs)``."""
    if not isinstance(cls, type) or not callable(fn) or not isinstance(name, str):
        raise TypeError(
            f"register_figure takes a class, a function and a name, got {cls!r}, {fn!r}, {name!r}"
        )
    _FIGURES[(cls, name)] = fn


def load_catalog() -> None:
    """Register ropelens's own analyses and their figures (once; the catalog is the package's top
    layer).

    The catalog is imported by name, not by an import statement: it sits above every layer that asks
    for it, and importing it registers 25 analyses and loads plotly, which ``import ropelens``
    should not.
    """
    importlib.import_module("ropelens.catalog")


def figure_of(cls: type, name: str = "figure") -> Callable[..., Any]:
    """The function registered for ``cls``'s ``name`` figure, or for the nearest base class that has
    one."""
    load_catalog()
    for klass in cls.__mro__:
        fn = _FIGURES.get((klass, name))
        if fn is not None:
            return fn
    raise NotImplementedError(
        f"{cls.__name__} has no {name!r} figure registered: an analysis declares its figures "
        "(Analysis(figures=draw(ResultClass, figure=fn))) and registering it registers them, or "
        "call register_figure(ResultClass, fn, name)"
    )


def registered_figures() -> dict[tuple[type, str], Callable[..., Any]]:
    """Every registered drawing function by (class, figure name)."""
    load_catalog()
    return dict(_FIGURES)


def register_writer(fn: Callable[..., Any]) -> None:
    """Write figures as files with ``fn(fig, path, **options) -> Path`` (the catalog registers
    ``ropelens.plots.export.write_figure``)."""
    if not callable(fn):
        raise TypeError(f"register_writer takes a function, got {fn!r}")
    _WRITER[:] = [fn]


def figure_writer() -> Callable[..., Any]:
    """The registered static-export writer (``write_figure(fig, path, **options) -> Path``)."""
    load_catalog()
    if not _WRITER:
        raise NotImplementedError(
            "no figure writer is registered: ropelens.catalog registers "
            "ropelens.plots.export.write_figure, or call register_writer(fn)"
        )
    return _WRITER[0]
