"""Every analysis ropelens offers, declared once: its function, its result, its figures, its
command, its section.

An :class:`Analysis` gathers what one analysis is made of at every layer: the function that measures
(``ropelens.analyses``), the :class:`~ropelens.results.result.Result` it returns, the functions that
draw that result (``ropelens.plots``), the ``ropelens`` subcommand that runs it from a shell
(:class:`ropelens.cli.common.Command`) and the section it adds to the report
(:class:`ropelens.report.registry.SectionSpec`). Each part but the name is optional: a command with
no result of its own (``ropelens report``), a result with no command (the vision-language
decomposition).

ropelens declares its own analyses in ``ropelens.catalog`` (one module each) and registers them, in
order, in one place: ``ropelens/catalog/__init__.py``. The command line builds its subcommands, and
the report its sections, from what is registered here, so a new analysis is one module and one
:func:`register_analysis` line, whether it ships with ropelens or lives in a user's notebook.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from ropelens.errors import InputError
from ropelens.results.figures import load_catalog, register_figure

__all__ = ["ANALYSES", "Analysis", "analyses", "analysis", "draw", "parts", "register_analysis"]

Figure = tuple[type, str, Callable[..., Any]]  # (result class, figure name, drawing function)


def draw(cls: type, **figures: Callable[..., Any]) -> tuple[Figure, ...]:
    """The figures of ``cls`` by name: ``draw(FrequencyUsage, figure=usage_figure,
    heatmap=usage_heatmap)``."""
    return tuple((cls, name, fn) for name, fn in figures.items())


@dataclass(frozen=True)
class Analysis:
    """One analysis, declared once: its function, result, figures, command and report section.

    Every part but ``name`` is optional. The declaration is checked when it is made: a part of the
    wrong kind is refused with :class:`~ropelens.errors.InputError` naming the part. Pass it to
    :func:`register_analysis` to add it to the command line and the report.

    Attributes:
        name (str): What it is called: the subcommand's name where it has one.
        function (Callable | None): The function a notebook calls (None: none of its own).
        result (type | None): The :class:`~ropelens.results.result.Result` class the function
            returns.
        figures (tuple): The drawing functions of the result, as :func:`draw` makes them:
            ``draw(ResultClass, figure=fn, heatmap=fn2)`` gives ``(class, name, function)`` triples.
        command (Command | None): The ``ropelens NAME`` subcommand
            (:class:`ropelens.cli.common.Command`), or None for no command.
        section (SectionSpec | None): Its section of the report
            (:class:`ropelens.report.registry.SectionSpec`), or None for no section.
        summary (str): What it measures, in one sentence.

    Raises:
        InputError: When ``name`` is empty, ``function`` is not callable, ``result`` is not a
            class, a figure is not a ``(class, name, function)`` triple, or ``command`` /
            ``section`` lacks ``add_to`` / ``render``.

    Examples:
        >>> from ropelens.analyses import Analysis, pe_similarity, PESimilarity
        >>> a = Analysis(
        ...     "pe-similarity", function=pe_similarity, result=PESimilarity,
        ...     summary="How similar position embeddings are, by distance.",
        ... )
        >>> a.name, a.command is None
        ('pe-similarity', True)
        >>> Analysis("")
        Traceback (most recent call last):
            ...
        ropelens.errors.InputError: an analysis needs a name, got ''
    """

    name: str  # what it is called: the subcommand's name where it has one
    function: Callable[..., Any] | None = None  # the function a notebook calls
    result: type | None = None  # the Result class the function returns
    figures: tuple[Figure, ...] = ()  # draw(ResultClass, figure=fn, heatmap=fn2, ...)
    command: Any = None  # ropelens.cli.common.Command: the ``ropelens NAME`` subcommand
    section: Any = None  # ropelens.report.registry.SectionSpec: its section of the report
    summary: str = ""  # what it measures, in one sentence

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise InputError(f"an analysis needs a name, got {self.name!r}")
        if self.function is not None and not callable(self.function):
            raise InputError(
                f"analysis {self.name!r}: function must be the function itself, got "
                f"{self.function!r}"
            )
        if self.result is not None and not isinstance(self.result, type):
            raise InputError(f"analysis {self.name!r}: result must be a class, got {self.result!r}")
        for fig in self.figures:
            if (
                len(fig) != 3
                or not isinstance(fig[0], type)
                or not isinstance(fig[1], str)
                or not callable(fig[2])
            ):
                raise InputError(
                    f"analysis {self.name!r}: each figure is (class, name, function), as draw() "
                    f"makes them; got {fig!r}"
                )
        for part, needs in (("command", "add_to"), ("section", "render")):
            value = getattr(self, part)
            if value is not None and not hasattr(value, needs):
                raise InputError(
                    f"analysis {self.name!r}: {part} must be a "
                    f"{'ropelens.cli.common.Command' if part == 'command' else 'SectionSpec'}, "
                    f"got {value!r}"
                )


# every registered analysis by name, in registration order (which is the order of the CLI's commands
# and of the report's sections)
ANALYSES: dict[str, Analysis] = {}


def register_analysis(a: Analysis, *, before: str | None = None) -> Analysis:
    """Register an analysis (replacing the one of the same name in its place), and its figures.

    Once registered, its command joins ``ropelens --help`` and its section the report, in
    registration order; ropelens's own analyses (``ropelens.catalog``) are registered first, so
    ``before`` can name them. A command or report section whose name another analysis already uses
    is refused.

    Args:
        a (Analysis): The analysis to register.
        before (str | None): The name of a registered analysis to put a new one ahead of (its
            command and section come first). None (default): last. An analysis that replaces one of
            the same name keeps that one's place.

    Returns:
        Analysis: ``a`` itself.

    Raises:
        InputError: When ``a`` is not an :class:`Analysis`, its command or section name is already
            another analysis's, or ``before`` names no registered analysis.

    Examples:
        >>> from ropelens.analyses import Analysis, register_analysis
        >>> from ropelens.analyses.registry import ANALYSES, analyses
        >>> def plane_count(model):
        ...     "How many rotary planes each layer of ``model`` has."
        ...     return 8
        >>> a = register_analysis(
        ...     Analysis("plane-count", function=plane_count), before="frequency-usage"
        ... )
        >>> names = [x.name for x in analyses()]
        >>> names.index("plane-count") + 1 == names.index("frequency-usage")
        True
        >>> register_analysis(Analysis("x"), before="no-such-analysis")
        Traceback (most recent call last):
            ...
        ropelens.errors.InputError: no analysis 'no-such-analysis' to register 'x' before; ...
        >>> del ANALYSES["plane-count"]
    """
    if not isinstance(a, Analysis):
        raise InputError(f"register_analysis takes an Analysis, got {type(a).__name__}")
    load_catalog()  # ropelens's own analyses come first, so that ``before=`` can name them
    for part, key in (("command", "name"), ("section", "key")):
        value = getattr(a, part)
        if value is None:
            continue
        clash = [
            o.name
            for o in ANALYSES.values()
            if o.name != a.name
            and getattr(o, part) is not None
            and getattr(getattr(o, part), key) == getattr(value, key)
        ]
        if clash:
            raise InputError(
                f"analysis {a.name!r}: its {part} {getattr(value, key)!r} is already analysis "
                f"{clash[0]!r}'s: give it another name, or register it under {clash[0]!r} to "
                "replace it"
            )
    if a.name in ANALYSES or before is None:
        ANALYSES[a.name] = a
    else:
        if before not in ANALYSES:
            raise InputError(
                f"no analysis {before!r} to register {a.name!r} before; registered: "
                f"{list(ANALYSES)}"
            )
        items = list(ANALYSES.items())
        at = [n for n, _ in items].index(before)
        ANALYSES.clear()
        ANALYSES.update([*items[:at], (a.name, a), *items[at:]])
    for cls, name, fn in a.figures:
        register_figure(cls, fn, name)
    return a


def analyses() -> tuple[Analysis, ...]:
    """Every registered analysis, in order."""
    load_catalog()
    return tuple(ANALYSES.values())


def analysis(name: str) -> Analysis:
    """The registered analysis called ``name``."""
    load_catalog()
    try:
        return ANALYSES[name]
    except KeyError:
        raise InputError(f"no analysis {name!r}; registered: {', '.join(ANALYSES)}") from None


def parts(kind: str, among: Iterable[Analysis] | None = None) -> list[Any]:
    """The registered commands (``kind="command"``) or report sections (``"section"``), in order."""
    if kind not in ("command", "section"):
        raise InputError(f"parts of an analysis are 'command' or 'section', got {kind!r}")
    return [
        getattr(a, kind)
        for a in (analyses() if among is None else among)
        if getattr(a, kind) is not None
    ]
