"""Where a result finds its figures: the numbers live in ``ropelens.analyses``, the drawing in
``ropelens.plots``.

Drawing functions are registered one per class and name (``register_figure(FrequencyUsage,
usage_figure)``, ``register_figure(FrequencyUsage, usage_heatmap, "heatmap")``); a result's
``figure()`` (and any other drawing method it has) looks the function up here and calls it with the
result first. Each analysis declares its figures (``Analysis(figures=draw(FrequencyUsage,
figure=usage_figure, heatmap=usage_heatmap))``) and registering the analysis registers them.
ropelens's own analyses are registered by ``ropelens.catalog``, the package's top layer. This layer
never imports it: the package root hands it a loader (:func:`register_loader`), which
:func:`load_catalog` calls the first time a figure, the writer or the registry is asked for. So
``from ropelens.analyses import frequency_usage`` and then ``usage.figure()`` draws, while ``import
ropelens`` defines names and imports neither the catalog nor plotly.

Static export (PNG, SVG, PDF) lives in ``ropelens.plots.export``, above this layer: the catalog
registers its writer here (:func:`register_writer`), and a result's ``save_figure`` finds it through
:func:`figure_writer`, as ``figure()`` finds its drawing function.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ropelens.errors import InputError

__all__ = [
    "figure_of",
    "figure_writer",
    "load_catalog",
    "register_figure",
    "register_loader",
    "register_writer",
    "registered_figures",
]

_FIGURES: dict[tuple[type, str], Callable[..., Any]] = {}
_WRITER: list[Callable[..., Any]] = []  # the static-export writer, once registered
_LOADERS: list[Callable[[], object]] = []  # what fills the registries, each called once


def register_figure(cls: type, fn: Callable[..., Any], name: str = "figure") -> None:
    """Draw ``cls``'s ``name`` figure (its ``figure()`` by default) with ``fn(result, *args,
    **kwargs)``."""
    if not isinstance(cls, type) or not callable(fn) or not isinstance(name, str):
        raise TypeError(
            f"register_figure takes a class, a function and a name, got {cls!r}, {fn!r}, {name!r}"
        )
    _FIGURES[(cls, name)] = fn


def register_loader(fn: Callable[[], object]) -> None:
    """Call ``fn()`` once, the first time a figure, the writer or the analysis registry is asked
    for (the package root registers the import of ``ropelens.catalog``)."""
    if not callable(fn):
        raise TypeError(f"register_loader takes a function, got {fn!r}")
    _LOADERS.append(fn)


def load_catalog() -> None:
    """Register ropelens's own analyses and their figures: call the registered loaders, once each.

    A loader is taken off the list before it runs, so that the registrations it makes, which ask
    for the registry themselves, do not run it again; one that fails stays, to be tried again.
    """
    while _LOADERS:
        fn = _LOADERS.pop(0)
        try:
            fn()
        except BaseException:
            _LOADERS.insert(0, fn)
            raise


def figure_of(cls: type, name: str = "figure") -> Callable[..., Any]:
    """The function registered for ``cls``'s ``name`` figure, or for the nearest base class that has
    one."""
    load_catalog()
    for klass in cls.__mro__:
        fn = _FIGURES.get((klass, name))
        if fn is not None:
            return fn
    names = sorted({n for (klass, n) in _FIGURES if klass in cls.__mro__})
    if names:  # a name the class does not draw: the names it does
        raise InputError(
            f"{cls.__name__} has no figure named {name!r}: choose one of "
            f"{', '.join(map(repr, names))}"
        )
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
