"""Every public function and class documents itself in Google style, and its example runs.

The public modules are the ones the API reference is generated from (``docs/api/``). For each
function and class in their ``__all__``:

- a docstring whose first line is a sentence;
- ``Args:`` naming every parameter (classes: the constructor's; dataclasses may use
  ``Attributes:`` for their fields instead);
- ``Returns:`` (or ``Yields:``) when a function returns something;
- ``Raises:`` when its own body raises;
- ``Examples:`` with ``>>>`` lines, which run as printed (doctest, on a tiny model where the real
  one is too slow). The plural is the section name the API reference's parser reads; a singular
  ``Example:`` would render as a note with its code quoted.
"""

from __future__ import annotations

import dataclasses
import doctest
import importlib
import inspect
import re
import textwrap

import pytest

PUBLIC_MODULES = (
    "ropelens",
    "ropelens.analyses",
    "ropelens.errors",
    "ropelens.spec.variants",
    "ropelens.run.data",
    "ropelens.run.stats",
    "ropelens.run.evaluate",
    "ropelens.testing",
    "ropelens.report",
)

SECTIONS = (
    "Args",
    "Attributes",
    "Returns",
    "Yields",
    "Raises",
    "Examples",
    "Note",
    "Notes",
    "References",
    "See Also",
    "Warning",
)


def public_objects() -> list[tuple[str, object]]:
    """(qualified name, object) of each public function and class, each object once."""
    seen: set[int] = set()
    out = []
    for modname in PUBLIC_MODULES:
        module = importlib.import_module(modname)
        for name in module.__all__:
            obj = getattr(module, name)
            if hasattr(obj, "cache_info"):  # functools.lru_cache: the function it wraps
                obj = obj.__wrapped__
            if not (inspect.isfunction(obj) or inspect.isclass(obj)) or id(obj) in seen:
                continue
            seen.add(id(obj))
            out.append((f"{modname}.{name}", obj))
    return out


OBJECTS = public_objects()


def sections(doc: str) -> dict[str, str]:
    """Google-style sections of a docstring: header → body (dedented)."""
    found: dict[str, list[str]] = {}
    current = None
    for line in inspect.cleandoc(doc).splitlines():
        head = line.strip().rstrip(":")
        if line and not line[0].isspace() and line.rstrip().endswith(":") and head in SECTIONS:
            current = head
            found[current] = []
        elif current is not None:
            if line and not line[0].isspace():
                current = None
            else:
                found[current].append(line)
    return {k: textwrap.dedent("\n".join(v)) for k, v in found.items()}


def parameters(obj: object) -> list[str]:
    """The names a caller passes: the function's, or the class constructor's."""
    target = obj.__init__ if inspect.isclass(obj) else obj
    if not inspect.isfunction(target):  # a builtin's constructor (an exception's): the message only
        return []
    try:
        sig = inspect.signature(target)
    except (TypeError, ValueError):
        return []
    names = []
    for p in sig.parameters.values():
        if p.name in ("self", "cls"):
            continue
        prefix = {p.VAR_POSITIONAL: "*", p.VAR_KEYWORD: "**"}.get(p.kind, "")
        names.append(prefix + p.name)
    return names


def documented(block: str) -> set[str]:
    """Names listed in an ``Args:``/``Attributes:`` block (``name (type): text`` lines)."""
    out = set()
    for line in block.splitlines():
        m = re.match(r"^(\*{0,2}[A-Za-z_][A-Za-z0-9_]*)\s*(\([^)]*\))?\s*:", line)
        if m:
            out.add(m.group(1))
    return out


def own_source(obj: object) -> str:
    try:
        return inspect.getsource(obj)
    except (OSError, TypeError):
        return ""


def returns_something(fn: object) -> bool:
    ann = inspect.signature(fn).return_annotation
    return ann not in (None, "None", inspect.Signature.empty) or "return " in own_source(fn)


def problems(obj: object) -> list[str]:
    doc = inspect.getdoc(obj) if inspect.isfunction(obj) else obj.__dict__.get("__doc__")
    if not doc or not doc.strip() or doc.startswith(f"{obj.__name__}("):  # dataclass default
        return ["no docstring"]
    out = []
    secs = sections(doc)
    params = parameters(obj)
    is_dataclass = inspect.isclass(obj) and dataclasses.is_dataclass(obj)
    block = secs.get("Args", "") + "\n" + (secs.get("Attributes", "") if is_dataclass else "")
    if params and not (secs.get("Args") or (is_dataclass and secs.get("Attributes"))):
        out.append("no Args: section" + (" (or Attributes:)" if is_dataclass else ""))
    missing = [p for p in params if p not in documented(block)]
    if params and missing:
        out.append(f"Args: does not name {', '.join(missing)}")
    gives = inspect.isfunction(obj) and returns_something(obj)
    if gives and "Returns" not in secs and "Yields" not in secs:
        out.append("no Returns: section")
    body = own_source(obj) if inspect.isfunction(obj) else own_source(obj.__init__)
    if re.search(r"^\s+raise \w", body, re.M) and "Raises" not in secs:
        out.append("raises, but has no Raises: section")
    if ">>>" not in secs.get("Examples", ""):
        out.append("no Examples: section with >>> lines")
    return out


@pytest.mark.parametrize("name,obj", OBJECTS, ids=[n for n, _ in OBJECTS])
def test_public_docstring(name, obj):
    found = problems(obj)
    assert not found, f"{name}: " + "; ".join(found)


def test_rule_catches_a_bad_docstring():
    def bare(model, layers=None):
        """Do a thing."""
        return model

    def good(model, layers=None):
        """Do a thing.

        Args:
            model: The model.
            layers (list[int] | None): Which layers.

        Returns:
            The model.

        Examples:
            >>> good(1)
            1
        """
        return model

    assert problems(good) == []
    found = problems(bare)
    assert "no Args: section" in found
    assert "no Returns: section" in found
    assert "no Examples: section with >>> lines" in found


EXAMPLES = [(n, o) for n, o in OBJECTS if ">>>" in (inspect.getdoc(o) or "")]


@pytest.mark.parametrize("name,obj", EXAMPLES, ids=[n for n, _ in EXAMPLES])
def test_docstring_example_runs(name, obj):
    finder = doctest.DocTestFinder(recurse=False)
    module = inspect.getmodule(obj)
    tests = finder.find(obj, name, module=module, globs=dict(vars(module)))
    flags = doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE
    runner = doctest.DocTestRunner(optionflags=flags)
    for t in tests:
        runner.run(t)
    result = runner.summarize(verbose=False)
    assert result.failed == 0, f"{name}: {result.failed} of {result.attempted} example lines failed"
