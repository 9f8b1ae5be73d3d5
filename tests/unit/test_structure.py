"""The package's import graph: one-way imports, no private names across modules, one public API.

Built from the source with ``ast`` (every import, including the ones inside functions, and every
module named to ``importlib.import_module`` or ``__import__``), so a cycle, an import up the layers
or a reach into another module's private helper fails here, whatever order modules load in.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

import ropelens

SRC = Path(ropelens.__file__).parent


def _module_name(path: Path, src: Path = SRC) -> str:
    parts = path.relative_to(src.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


_BY_STRING = ("import_module", "__import__")


def _literal_prefix(node: ast.expr) -> str | None:
    """The text a string argument starts with: all of a literal, the leading part of an f-string."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr) and node.values:
        first = node.values[0]
        if isinstance(first, ast.Constant) and isinstance(first.value, str):
            return first.value
    return None


def string_imports(tree: ast.AST) -> list[str]:
    """The ropelens modules one file imports by name (``importlib.import_module("ropelens.x")``,
    ``__import__``, an f-string's leading part), which an import statement's graph would miss."""
    out = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        called = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
        if called not in _BY_STRING:
            continue
        named = [node.args[0]] if node.args else []
        named += [k.value for k in node.keywords if k.arg in ("name", "package")]
        for arg in named:
            text = _literal_prefix(arg)
            if text is not None and text.split(".")[0] == "ropelens":
                out.append(text)
    return out


def _module_named(text: str, modules: set[str]) -> str | None:
    """The module a (possibly partial) dotted name imports: the longest one of ``modules`` it
    starts with."""
    parts = text.rstrip(".").split(".")
    for n in range(len(parts), 0, -1):
        if ".".join(parts[:n]) in modules:
            return ".".join(parts[:n])
    return None


def _imports(path: Path, modules: set[str], src: Path) -> list[tuple[str, str]]:
    """(imported module, imported name or '') for every ropelens import in one file, by statement
    or by string."""
    name = _module_name(path, src)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out = []
    tree = ast.parse(path.read_text())
    for text in string_imports(tree):
        target = _module_named(text, modules)
        if target is not None:
            out.append((target, ""))
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                target = ".".join([*base, *([node.module] if node.module else [])])
            else:
                target = node.module or ""
            for alias in node.names:
                if f"{target}.{alias.name}" in modules:  # `from ropelens import heads`
                    out.append((f"{target}.{alias.name}", ""))
                elif target in modules:
                    out.append((target, alias.name))
        elif isinstance(node, ast.Import):
            out += [(a.name, "") for a in node.names if a.name in modules]
    return out


def import_graph(src: Path = SRC) -> tuple[dict[str, set[str]], list[tuple[str, str, str]]]:
    """Module → modules it imports, and (importer, module, name) for each private name imported."""
    files = {_module_name(p, src): p for p in src.rglob("*.py")}
    graph: dict[str, set[str]] = {m: set() for m in files}
    private = []
    for m, path in files.items():
        for target, name in _imports(path, set(files), src):
            if target != m:
                graph[m].add(target)
            if name.startswith("_") and not name.startswith("__") and target != m:
                private.append((m, target, name))
    return graph, private


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_no_import_cycles():
    graph, _ = import_graph()
    assert len(graph) > 30  # the walk found the package
    assert cycles(graph) == []


def test_no_module_is_imported_by_string():
    """Every import of a ropelens module is a statement: one named in a string hides an edge of the
    graph (a cycle, or a reach up the layers) from anyone reading the imports."""
    found = {
        _module_name(p): named
        for p in SRC.rglob("*.py")
        if (named := string_imports(ast.parse(p.read_text())))
    }
    assert found == {}


def test_no_private_names_across_modules():
    _, private = import_graph()
    assert private == []


def test_library_never_imports_the_command_line():
    graph, _ = import_graph()
    for module, targets in graph.items():
        if module == "ropelens.__main__" or module.startswith(
            "ropelens.catalog"
        ):  # the command line, and the
            # declarations of the analyses, whose commands are built from its option groups
            continue
        if not module.startswith("ropelens.cli"):
            assert not any(t.startswith("ropelens.cli") for t in targets), module
        elif module not in ("ropelens.cli", "ropelens.cli.main"):
            assert "ropelens.cli.main" not in targets and "ropelens.cli" not in targets, module


@pytest.mark.parametrize(
    "leaf",
    [
        "ropelens.errors",
        "ropelens.results.serialize",
        "ropelens.validate",
        "ropelens.results.curves",
        "ropelens.spec.rope",
        "ropelens.run.data",
        "ropelens.run.tables",
        "ropelens.run.texts",
        "ropelens.results.figures",
    ],
)
def test_leaf_modules_import_nothing_above_them(leaf):
    graph, _ = import_graph()
    allowed = {
        "ropelens.errors",
        "ropelens.results.serialize",
        "ropelens.validate",
        "ropelens.spec.rope",
        "ropelens.run.tables",  # the corpora's table and dataset readers, a leaf as well
        "ropelens.run.texts",  # the one BOS policy, a leaf as well
        "ropelens.results.figures",
        "ropelens.results.result",  # the result base: DecayCurve is a Result
    }
    assert graph[leaf] <= allowed, graph[leaf] - allowed


def test_checks_catch_what_they_look_for(tmp_path):
    """The graph walk sees a planted cycle, a function-level import, a private import, imports by
    string (a cycle through one of them, too) and an import up the layers."""
    pkg = tmp_path / "ropelens"
    (pkg / "errors").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "errors" / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from ropelens.b import _helper\n")
    (pkg / "b.py").write_text("def f():\n    from ropelens import a\n")
    (pkg / "c.py").write_text("import importlib\nimportlib.import_module('ropelens.d')\n")
    (pkg / "d.py").write_text("def f(n):\n    __import__(f'ropelens.c.{n}')\n")
    (pkg / "errors" / "by_name.py").write_text(
        "import importlib\nimportlib.import_module('ropelens.catalog')\n"
    )
    (pkg / "errors" / "up.py").write_text("from ropelens import catalog\n")
    (pkg / "catalog.py").write_text("")
    graph, private = import_graph(pkg)
    assert cycles(graph) == [["ropelens.a", "ropelens.b"], ["ropelens.c", "ropelens.d"]]
    assert private == [("ropelens.a", "ropelens.b", "_helper")]
    assert string_imports(ast.parse((pkg / "d.py").read_text())) == ["ropelens.c."]
    assert string_imports(ast.parse("import importlib\nimportlib.import_module('torch')")) == []
    low = {m: t for m, t in graph.items() if m.startswith("ropelens.errors")}
    assert upward_imports(low) == {
        ("ropelens.errors.up", "ropelens.catalog"),
        ("ropelens.errors.by_name", "ropelens.catalog"),
    }


def test_public_api_exports_exist():
    for name in ropelens.__all__:
        assert hasattr(ropelens, name), name
    assert (
        len(ropelens.__all__) <= 20
    )  # the root is the core: loading, reading, bands, results, errors


def test_every_analysis_exports_its_function_and_result_from_one_namespace():
    from ropelens.analyses.registry import analyses

    for a in analyses():
        for part in (a.function, a.result):
            if part is None or part.__module__.startswith(("ropelens.catalog", "ropelens.report")):
                continue  # the report's own commands (report, compare)
            if part.__module__.startswith("ropelens.analyses."):
                assert getattr(ropelens.analyses, part.__name__, None) is part, (
                    a.name,
                    part.__name__,
                )
                assert part.__name__ in ropelens.analyses.__all__


def test_one_name_per_analysis_at_every_layer():
    """analyses/NAME.py, plots/NAME.py, catalog/NAME.py, the command NAME-with-hyphens, the section
    key."""
    from ropelens.analyses.registry import analyses

    for a in analyses():
        module = a.name.replace("-", "_")
        assert (SRC / "catalog" / f"{module}.py").is_file(), a.name
        if a.command is not None:
            assert a.command.name == a.name
        if a.section is not None:
            assert a.section.key == a.name
        if a.result is not None and a.result.__module__.startswith("ropelens.analyses."):
            assert a.result.__module__ == f"ropelens.analyses.{module}", a.name
            for cls, _, draw in a.figures:
                if cls is a.result:  # a secondary result may be drawn by a shared module (curves)
                    assert draw.__module__ == f"ropelens.plots.{module}", (
                        a.name,
                        draw.__name__,
                    )


def test_import_ropelens_defines_names_and_does_nothing_else():
    code = (
        "import sys, ropelens; assert not [m for m in sys.modules if m.startswith(('plotly', "
        "'ropelens.catalog', 'ropelens.plots'))]; assert not [f for f in sys.meta_path if "
        "type(f).__module__.startswith('ropelens')]"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_a_result_draws_from_its_analyses_namespace_alone():
    """A notebook that imports only ``ropelens.analyses`` draws a result: the package root, which
    every import of ropelens runs first, has handed the figures the catalog's import."""
    fixture = Path(__file__).parents[1] / "fixtures" / "results" / "FrequencyUsage.json"
    code = (
        "import sys\n"
        "from ropelens.analyses import FrequencyUsage\n"
        "assert 'ropelens.catalog' not in sys.modules\n"
        f"fig = FrequencyUsage.load({str(fixture)!r}).figure()\n"
        "assert type(fig).__name__ == 'Figure' and 'ropelens.catalog' in sys.modules\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_errors_are_value_errors():
    from ropelens import errors

    for cls in (errors.NotRotaryError, errors.UnsupportedModelError, errors.UsageError):
        assert issubclass(cls, errors.InputError)
    assert issubclass(errors.InputError, ValueError)


# the layers, bottom to top: a module imports only from its own layer and those below; the package
# root (``ropelens/__init__.py``) is above them all, re-exporting the core and handing the layers
# below the catalog's import
LAYERS = (
    "errors",
    "validate",
    "devices",
    "results",
    "spec",
    "backends",
    "kernels",
    "loading",
    "run",
    "analyses",
    "claims",
    "plots",
    "report",
    "testing",
    "training",
    "cli",
    "catalog",
    "__main__",
)


def _layer(module: str) -> int:
    parts = module.split(".")
    return len(LAYERS) if len(parts) == 1 else LAYERS.index(parts[1])


def upward_imports(graph: dict[str, set[str]]) -> set[tuple[str, str]]:
    """(importer, imported) for each import of a module in a layer above the importer's."""
    return {(m, t) for m, targets in graph.items() for t in targets if _layer(t) > _layer(m)}


def test_the_package_ships_tiny_models_not_the_test_harness():
    """``ropelens.testing`` is what a user's own tests build on; the family matrix's checks, the
    sweep, its shrinking and the dense reference live in tests/harness, outside the wheel."""
    assert sorted(p.stem for p in (SRC / "testing").glob("*.py")) == ["__init__", "families", "vl"]


def test_package_root_holds_a_handful_of_modules():
    root = sorted(p.stem for p in SRC.glob("*.py"))
    assert root == ["__init__", "__main__", "devices", "errors", "validate"]
    assert sorted(
        p.name for p in SRC.iterdir() if p.is_dir() and (p / "__init__.py").exists()
    ) == sorted(layer for layer in LAYERS if (SRC / layer).is_dir())


def test_no_import_runs_back_up_the_layers():
    """Data flows one way, model to report: a lower layer reaches a higher one's code only through a
    registry the higher one fills, never by importing it (by statement or by string)."""
    graph, _ = import_graph()
    assert upward_imports(graph) == set()


# the layers that hold numbers draw nothing: figures live in ropelens.plots
UNPLOTTED = ("analyses", "spec", "results", "backends", "loading", "run")


def _imports_plotly(path: Path) -> bool:
    """Whether a file imports plotly anywhere (at the top or inside a function)."""
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import) and any(
            a.name.split(".")[0] == "plotly" for a in node.names
        ):
            return True
        if (
            isinstance(node, ast.ImportFrom)
            and not node.level
            and (node.module or "").split(".")[0] == "plotly"
        ):
            return True
    return False


def test_only_the_plots_and_above_import_plotly(tmp_path):
    drawing = sorted(
        _module_name(p)
        for layer in UNPLOTTED
        for p in (SRC / layer).rglob("*.py")
        if _imports_plotly(p)
    )
    assert drawing == []
    assert all(_imports_plotly(p) for p in (SRC / "plots").glob("*.py") if p.name != "__init__.py")
    planted = tmp_path / "planted.py"
    planted.write_text("def f():\n    from plotly.subplots import make_subplots\n")
    assert _imports_plotly(planted)


# drawings besides figure(), by result class (a by-distance curve's line() is drawn by
# ropelens.plots.curves)
NAMED_DRAWINGS = {
    "FrequencyUsage": ("heatmap",),
    "BandStatistics": ("heatmap",),
    "RotaryOffsets": ("heatmap",),
    "PESimilarity": ("heatmap",),
    "HeadTaxonomy": ("scatter",),
}


def test_every_analysis_result_draws_through_its_plots_module(monkeypatch):
    """Each result class of ropelens.analyses keeps figure() (and its other drawings), drawn by the
    module of ropelens.plots named after its analysis."""
    from ropelens.results import result as result_module
    from ropelens.results.figures import figure_of
    from ropelens.results.result import Result, registered

    analyses = {
        cls for cls in registered().values() if cls.__module__.startswith("ropelens.analyses.")
    }
    assert len(analyses) >= 18
    for cls in analyses:
        plots = cls.__module__.replace("ropelens.analyses.", "ropelens.plots.")
        for name in ("figure", *NAMED_DRAWINGS.get(cls.__name__, ())):
            assert callable(getattr(cls, name)), (cls, name)
            assert figure_of(cls, name).__module__ == plots, (cls, name)
    assert {c.__name__ for c in analyses} >= set(NAMED_DRAWINGS)

    monkeypatch.setattr(
        result_module, "_REGISTRY", dict(registered())
    )  # the class below registers in a copy

    class Undrawn(Result):
        pass

    with pytest.raises(
        NotImplementedError, match="no .figure. figure registered: an analysis declares its figures"
    ):
        Undrawn().figure()


def test_no_module_is_imported_through_a_namespace_that_shadows_it():
    """``ropelens.analyses`` exports each analysis's function under its module's name, so ``from
    ropelens.analyses import band_statistics`` is the function, never the module. Such a name is
    only called; code that wants the module imports names from it (``from
    ropelens.analyses.band_statistics import GRAM_MIN_KEYS``) or, to patch it, takes it from
    ``importlib.import_module``."""
    import ropelens.analyses

    shadowed = {
        name for name in ropelens.analyses.__all__ if (SRC / "analyses" / f"{name}.py").is_file()
    }
    roots = [SRC, SRC.parent.parent / "tests", SRC.parent.parent / "experiments"]
    found = []
    for path in (p for root in roots for p in root.rglob("*.py")):
        tree = ast.parse(path.read_text())
        imported = {
            alias.asname or alias.name
            for node in ast.walk(tree)
            if isinstance(node, ast.ImportFrom) and node.module == "ropelens.analyses"
            for alias in node.names
            if alias.name in shadowed
        }
        for name in imported:
            loads = [
                n
                for n in ast.walk(tree)
                if isinstance(n, ast.Name) and n.id == name and isinstance(n.ctx, ast.Load)
            ]
            calls = [
                n
                for n in ast.walk(tree)
                if isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id == name
            ]
            if len(loads) > len(calls):
                found.append(f"{path.relative_to(SRC.parent.parent)}: {name} used as a module")
    assert not found, found
