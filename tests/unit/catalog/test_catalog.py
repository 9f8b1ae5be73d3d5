"""The analysis declarations: every command and report section comes from one, each registered in
one place."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

import ropelens
from ropelens.analyses import result_classes
from ropelens.analyses.registry import Analysis, analyses, draw, register_analysis
from ropelens.cli.common import Command
from ropelens.cli.main import build_parser
from ropelens.errors import InputError
from ropelens.report.registry import SectionSpec, register_section, sections
from ropelens.report.section import Section
from ropelens.results.figures import figure_of, registered_figures

SRC = Path(ropelens.__file__).parent
CATALOG = SRC / "catalog"


def _subcommands() -> list[str]:
    sub = next(a for a in build_parser()._actions if a.dest == "command")
    return list(sub.choices)


def _calls(path: Path, names: set[str]) -> list[str]:
    """The names in ``names`` that ``path`` calls (by bare name or as an attribute)."""
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Call):
            f = node.func
            name = (
                f.id
                if isinstance(f, ast.Name)
                else f.attr
                if isinstance(f, ast.Attribute)
                else None
            )
            if name in names:
                out.append(name)
    return out


def test_every_command_is_a_declared_analysis_command():
    declared = [a.command.name for a in analyses() if a.command is not None]
    assert _subcommands() == declared
    assert len(declared) == len(set(declared)) >= 24


def test_every_report_section_is_a_declared_analysis_section():
    assert sections() == [a.section for a in analyses() if a.section is not None]
    assert [s.key for s in sections()] == [
        "rope-spec",
        "frequency-usage",
        "band-statistics",
        "head-taxonomy",
        "attention-sinks",
        "attention-by-distance",
        "massive-values",
        "prope-sweep",
        "pe-geometry",
        "extension-planes",
    ]


def test_commands_and_sections_are_made_only_in_declarations():
    """Outside ropelens.catalog no module makes a Command or a SectionSpec, so none can bypass a
    declaration."""
    makers = {
        p.relative_to(SRC).as_posix(): _calls(p, {"Command", "SectionSpec", "add_parser"})
        for p in SRC.rglob("*.py")
        if "catalog" not in p.parts
    }
    made = {p: c for p, c in makers.items() if c}
    # add_command (cli/common) adds the parser a Command declares; register_section wraps a
    # SectionSpec it is given
    assert made == {"cli/common.py": ["add_parser"]}


def test_analyses_are_registered_in_one_place():
    """register_analysis is called in ropelens/catalog/__init__.py alone (and by register_section,
    its wrapper)."""
    callers = {
        p.relative_to(SRC).as_posix(): len(_calls(p, {"register_analysis"}))
        for p in SRC.rglob("*.py")
    }
    assert {p: n for p, n in callers.items() if n} == {
        "catalog/__init__.py": len(analyses()),
        "report/registry.py": 2,
    }


def test_every_catalog_module_is_registered_and_declares_one_analysis():
    registered = {id(a) for a in analyses()}
    modules = sorted(p.stem for p in CATALOG.glob("*.py") if p.stem != "__init__")
    assert len(modules) == len(analyses())
    for name in modules:
        module = importlib.import_module(f"ropelens.catalog.{name}")
        assert isinstance(module.ANALYSIS, Analysis), name
        assert id(module.ANALYSIS) in registered, name


def test_every_result_is_declared_with_its_figures():
    """Each result kind ropelens saves belongs to an analysis, and each draws through a declared
    figure."""
    declared = {a.result for a in analyses() if a.result is not None}
    drawn = {cls for a in analyses() for cls, _, _ in a.figures}
    for kind, cls in result_classes().items():
        assert (
            cls in declared or cls in drawn or any(issubclass(cls, d) for d in declared | drawn)
        ), kind
        assert callable(figure_of(cls)), kind
    assert {(c, n) for a in analyses() for c, n, _ in a.figures} == set(registered_figures())


def test_public_namespace_offers_the_registry():
    assert (
        ropelens.catalog.analyses is analyses
        and ropelens.analyses.register_analysis is register_analysis
    )
    # the namespace offers each analysis's function under the analysis's name
    module = importlib.import_module("ropelens.analyses.attention_sinks")
    assert module.attention_sinks is ropelens.analyses.attention_sinks
    assert [a.name for a in ropelens.catalog.analyses()][:3] == [
        "rope-spec",
        "report",
        "frequency-usage",
    ]


# -------------------------------------------------------------------------------------- registering
def _render(data) -> Section:
    return Section("extra", "Extra", "<p>extra</p>")


def _run(args) -> int:
    """Print nothing

    A command for the registry's tests.
    """
    return 0


def test_register_replaces_in_place_and_inserts_before(registry):
    names = [a.name for a in analyses()]
    sinks = registry.module.analysis("attention-sinks")
    register_analysis(
        Analysis(
            "attention-sinks", sinks.function, sinks.result, sinks.figures, sinks.command, None
        )
    )
    assert [a.name for a in analyses()] == names  # same place
    assert "attention-sinks" not in [s.key for s in sections()]
    extra = Analysis(
        "extra",
        command=Command("extra", _run, lambda p: None),
        section=SectionSpec("extra", "Extra", _render),
    )
    register_analysis(extra, before="frequency-usage")
    assert [a.name for a in analyses()].index("extra") == names.index("frequency-usage")
    assert _subcommands().index("extra") == _subcommands().index("frequency-usage") - 1
    assert ropelens.cli.main(["extra"]) == 0


def test_register_refuses_what_would_clash_or_is_not_a_declaration(registry):
    with pytest.raises(
        InputError, match="its command 'attention-sinks' is already analysis 'attention-sinks'"
    ):
        register_analysis(
            Analysis("sinks2", command=Command("attention-sinks", _run, lambda p: None))
        )
    with pytest.raises(
        InputError, match="its section 'frequency-usage' is already analysis 'frequency-usage'"
    ):
        register_analysis(
            Analysis("usage2", section=SectionSpec("frequency-usage", "Usage", _render))
        )
    with pytest.raises(InputError, match="no analysis 'nope' to register"):
        register_analysis(Analysis("new"), before="nope")
    with pytest.raises(InputError, match="takes an Analysis"):
        register_analysis("sinks")
    with pytest.raises(InputError, match="command must be a ropelens.cli.common.Command"):
        Analysis("x", command=_run)
    with pytest.raises(InputError, match=r"each figure is \(class, name, function\)"):
        Analysis("x", figures=((Section, _render),))
    with pytest.raises(InputError, match="render and measure must be functions"):
        SectionSpec("x", "X", "module:render")
    with pytest.raises(InputError, match="no section 'nope' to insert before"):
        register_section(SectionSpec("x", "X", _render), before="nope")


def test_register_section_makes_a_section_only_analysis(registry):
    register_section(SectionSpec("extra", "Extra", _render), before="frequency-usage")
    keys = [s.key for s in sections()]
    assert keys.index("extra") == keys.index("frequency-usage") - 1
    assert registry.module.analysis("extra").command is None


def test_figures_register_with_their_analysis(registry):
    class Thing:
        pass

    register_analysis(
        Analysis("thing", figures=draw(Thing, figure=lambda r: "drawn", heatmap=lambda r: "map"))
    )
    assert figure_of(Thing)(None) == "drawn" and figure_of(Thing, "heatmap")(None) == "map"


# ---------------------------------------------------------------------------------------- old names


def test_the_contributing_page_declaration_makes_a_command_and_a_section(
    tiny, tiny_dir, tmp_path, monkeypatch, registry, capsys
):
    """The contributing page's KeyNorm, declared as printed there: `ropelens key-norm` runs it
    (table and JSON) and the report gains its section, whose numbers equal the analysis run directly
    on the same windows."""
    import json
    import re

    import pandas as pd
    import torch

    readme = (Path(__file__).parents[3] / "docs/contributing.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", readme, re.S)
    analysis = next(b for b in blocks if "class KeyNorm" in b)
    declaration = next(b for b in blocks if "register_analysis(\n    Analysis(" in b)
    monkeypatch.chdir(tmp_path)
    model = tiny("llama")
    path = str(tiny_dir("llama"))
    scope = {"model": model, "ropelens": ropelens}
    exec(analysis.replace("max_tokens=4096", "max_tokens=256"), scope)
    declaration = declaration.replace(
        '["key-norm", "--tokens", "1024", "--layers", "0,1"]',
        f'["key-norm", {path!r}, "--tokens", "128", "--n-ctx", "64", "--layers", "0,1"]',
    )
    declaration = declaration.replace(
        'build_report(model, out="report-with-key-norm")',
        'build_report(model, tokens=256, n_ctx=64, out="report-with-key-norm", progress=False)',
    )
    capsys.readouterr()
    exec(declaration, scope)
    printed = capsys.readouterr().out
    assert "key norm" in printed and len(printed.strip().splitlines()) == 3  # header and two layers
    assert "key-norm" in _subcommands()
    assert ropelens.cli.main(["key-norm", path, "--tokens", "128", "--n-ctx", "64", "--json"]) == 0
    assert len(json.loads(capsys.readouterr().out)["key_norm"]) == model.cfg.n_layers
    out = tmp_path / "report-with-key-norm"
    html = (out / "index.html").read_text()
    assert '<section id="key-norm">' in html
    frame = pd.read_csv(out / "key_norm.csv")
    report = json.loads((out / "report.json").read_text())
    from ropelens.report.collect import evenly_spaced
    from ropelens.run.data import analysis_windows

    n_ctx, n_windows = report["provenance"]["n_ctx"], report["provenance"]["n_windows"]
    tokens = analysis_windows(model.tokenizer, "english", n_ctx, 256)[0]
    assert len(tokens) == n_windows
    # the section re-ran the analysis on two evenly spread windows of the report's
    direct, _ = scope["key_norm"](
        model, tokens[evenly_spaced(n_windows, 2)], n_ctx=n_ctx, progress=False
    )
    assert len(frame) == model.cfg.n_layers
    torch.testing.assert_close(
        torch.tensor(frame.key_norm.values), direct.double(), rtol=1e-6, atol=0
    )
    assert (
        ropelens.cli.main(["key-norm", path, "--tokens", "10", "--n-ctx", "64"]) == 2
    )  # a one-line error
