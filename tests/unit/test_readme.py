"""README.md and the guide pages: the README fits on two screens and keeps the two commands, its
Python and command-line examples run as printed, its table of analyses names every command and
function that exists, and every relative link in the README, docs/guide/*.md and
docs/contributing.md reaches an existing file and heading.

The examples run on the embedded SmolLM2 (marker ``integration``) exactly as printed; the unit
tests run the same blocks on a tiny random Llama (``load_model()`` and the model argument of each
command replaced by it), so a renamed function or flag fails without the real model.
"""

from __future__ import annotations

import contextlib
import doctest
import importlib
import importlib.util
import io
import os
import re
import shlex
import subprocess
import sys
import unicodedata
from pathlib import Path

import pytest

import ropelens

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
SETUP_AND_REPORT = "bash scripts/setup.sh && .venv/bin/ropelens report"
TEST_COMMAND = ".venv/bin/python -m pytest"
LINKED_PAGES = [
    README,
    ROOT / "CONTRIBUTING.md",
    ROOT / "docs/contributing.md",
    *sorted((ROOT / "docs/guide").glob("*.md")),
]
GUIDE_PAGES = (
    "install",
    "python",
    "report",
    "measures",
    "scaling",
    "compatibility",
    "experiments",
    "limitations",
)


def _readme() -> str:
    return README.read_text(encoding="utf-8")


def _section(text: str, title: str) -> str:
    """The body of the ``## title`` section of a markdown text."""
    head = f"\n## {title}\n"
    assert head in text, f"no '## {title}' section"
    return text.split(head, 1)[1].split("\n## ", 1)[0]


def _fenced(text: str, lang: str) -> list[str]:
    return re.findall(rf"```{lang}\n(.*?)```", text, re.S)


def python_example() -> tuple[str, str]:
    """The README's Python example and the output printed under it."""
    python = _section(_readme(), "Python")
    return _fenced(python, "python")[0], _fenced(python, "text")[0]


def cli_example() -> list[str]:
    """The README's command-line example, one command per line (comments dropped)."""
    block = _fenced(_section(_readme(), "Command line"), "bash")[0]
    return [line.split("  #")[0].strip() for line in block.splitlines() if line.strip()]


# -------------------------------------------------------------------------------- size and commands


def test_the_readme_fits_on_two_screens_and_keeps_the_two_commands():
    text = _readme()
    assert len(text.splitlines()) <= 200
    commands = _section(text, "Two commands")
    assert _fenced(commands, "bash") == [SETUP_AND_REPORT + "\n", TEST_COMMAND + "\n"]
    ci = (ROOT / ".ci/run").read_text()
    assert re.search(r"^\.venv/bin/python -m pytest\b", ci, re.M), "CI no longer runs the command"
    assert "bash scripts/setup.sh" in ci


def test_the_readme_opens_on_three_sentences_and_the_figure():
    text = _readme()
    intro = text.split("\n## ", 1)[0].split("\n\n")
    assert intro[0] == "# ropelens"
    sentences = re.findall(r"[^.]+\.(?:\s|$)", intro[1].replace("\n", " "))
    assert len(sentences) == 3, sentences
    image = re.fullmatch(r"!\[[^\]]+\]\(([^)]+)\)", intro[2].strip())
    assert image and image.group(1) == "docs/assets/frequency_usage.png"


def test_the_figure_is_a_screenshot_of_a_whole_figure():
    png = (ROOT / "docs/assets/frequency_usage.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = int.from_bytes(png[16:20], "big"), int.from_bytes(png[20:24], "big")
    assert 800 <= width <= 2600 and 250 <= height <= 1600, (width, height)
    assert len(png) > 30_000  # a drawn heatmap, not an empty frame


# ------------------------------------------------------------------------------------- the table


def _table_rows() -> list[list[str]]:
    body = _section(_readme(), "Analyses")
    rows = [line for line in body.splitlines() if line.startswith("|")]
    assert rows[0].split("|")[1:-1] == [" function ", " command ", " what it answers ", " paper "]
    return [[cell.strip() for cell in row.split("|")[1:-1]] for row in rows[2:]]


def _resolve(name: str):
    """A name from the table; a bare one (``frequency_usage``) is in ``ropelens.analyses``."""
    if "." not in name:
        return getattr(ropelens.analyses, name)
    module, _, attr = name.rpartition(".")
    try:
        return getattr(importlib.import_module(module), attr)
    except ModuleNotFoundError:
        return importlib.import_module(name)


def test_the_table_of_analyses_names_every_command_and_existing_functions():
    from ropelens.catalog import analyses

    rows = _table_rows()
    listed = {c.strip("`") for row in rows for c in row[1].split(", ") if c}
    commands = {a.command.name for a in analyses() if a.command is not None}
    assert listed == commands, f"missing {commands - listed}, unknown {listed - commands}"
    for row in rows:
        for name in re.findall(r"`([A-Za-z_][\w.]*)`", row[0]):
            assert _resolve(name) is not None
        assert row[2], f"row {row[0]} {row[1]} says nothing"
    exported = {a.function.__name__ for a in analyses() if a.function is not None}
    named = {re.sub(r".*\.", "", n) for row in rows for n in re.findall(r"`([\w.]+)`", row[0])}
    assert exported <= named, f"analyses without a row: {exported - named}"


# ------------------------------------------------------------------------------------------ links


def _slug_toc(title: str) -> str:
    """Python-Markdown's toc slug (the site's anchors)."""
    value = unicodedata.normalize("NFKD", title).encode("ascii", "ignore").decode("ascii")
    value = re.sub(r"[^\w\s-]", "", value).strip().lower()
    return re.sub(r"[-\s]+", "-", value)


def _slug_github(title: str) -> str:
    """GitHub's heading anchor."""
    return re.sub(r"[^\w\- ]", "", title.strip().lower()).replace(" ", "-")


def _anchors(page: Path) -> set[str]:
    """Anchors that both GitHub and the site give the page's headings."""
    text = re.sub(r"```.*?```", "", page.read_text(encoding="utf-8"), flags=re.S)
    titles = [re.sub(r"[`*]", "", t) for t in re.findall(r"^#{1,6} +(.+?) *#*$", text, re.M)]
    return {_slug_toc(t) for t in titles} & {_slug_github(t) for t in titles}


def _links(page: Path) -> list[str]:
    text = re.sub(r"```.*?```", "", page.read_text(encoding="utf-8"), flags=re.S)
    text = re.sub(r"`[^`\n]*`", "", text)
    return re.findall(r"!?\[[^\]]*\]\(([^)\s]+)\)", text)


@pytest.mark.parametrize("page", LINKED_PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_reaches_a_file_and_a_heading(page):
    broken = []
    for link in _links(page):
        if re.match(r"[a-z]+:", link):
            continue  # https:, mailto:
        target, _, anchor = link.partition("#")
        path = (page.parent / target).resolve() if target else page
        if not path.is_file():
            broken.append(f"{link}: no file {path}")
        elif anchor and path.suffix == ".md" and anchor not in _anchors(path):
            broken.append(f"{link}: no heading #{anchor} in {path.name}")
    assert broken == []


def test_the_guide_pages_and_contributing_hold_what_the_readme_moved_there():
    for name in GUIDE_PAGES:
        text = (ROOT / f"docs/guide/{name}.md").read_text(encoding="utf-8")
        assert len(text.splitlines()) > 10, f"docs/guide/{name}.md is a skeleton"
    contributing = (ROOT / "docs/contributing.md").read_text(encoding="utf-8")
    for title in ("Package layout", "Add an analysis", "Run the checks"):
        assert f"\n## {title}\n" in contributing
    assert "docs/contributing.md" in (ROOT / "CONTRIBUTING.md").read_text(encoding="utf-8")
    readme = _readme()
    for name in GUIDE_PAGES:
        assert f"(docs/guide/{name}.md)" in readme, f"the README does not link guide/{name}.md"


# ------------------------------------------------------------------------------- the examples run


def _run_python(code: str, scope: dict, source: str = "README.md") -> str:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(code, source, "exec"), scope)
    return out.getvalue()


def _same_output(want: str, got: str) -> bool:
    flags = doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE
    return doctest.OutputChecker().check_output(want, got, flags)


def test_the_python_example_runs_on_a_tiny_model(tiny, tmp_path, monkeypatch):
    """The README's block with ``load_model()`` giving a tiny Llama: every name and call still
    exists, it prints as many lines as the README shows, and the saved result loads back."""
    code, printed = python_example()
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(ropelens, "load_model", lambda *a, **k: tiny("llama"))
    got = _run_python(code.replace("max_tokens=2048", "max_tokens=256"), {})
    assert len(got.strip().splitlines()) == len(printed.strip().splitlines())
    usage = ropelens.load_result("usage.json")
    assert got.splitlines()[1] == str(tuple(usage.q_norm.shape))


@pytest.mark.integration
def test_the_python_example_prints_what_the_readme_shows(tmp_path, monkeypatch):
    code, printed = python_example()
    monkeypatch.chdir(tmp_path)
    got = _run_python(code, {})
    assert _same_output(printed, got), f"the README shows\n{printed}\nthe code prints\n{got}"
    assert (tmp_path / "usage.json").is_file()


def test_the_command_line_example_runs_on_a_tiny_model(tiny_dir, tmp_path, monkeypatch, capsys):
    """Each line of the README's command-line example, in process, on a tiny model directory."""
    monkeypatch.chdir(tmp_path)
    path = str(tiny_dir("llama"))
    for line in cli_example():
        argv = shlex.split(line)
        assert argv[0] == "ropelens"
        argv = [argv[1], path, *argv[2:]]
        argv = [{"2048": "256", "256": "64"}.get(a, a) if a.isdigit() else a for a in argv]
        assert ropelens.cli.main(argv) == 0, line
    capsys.readouterr()
    assert ropelens.load_result("usage.json").q_norm.shape[-1] > 0
    assert (tmp_path / "mixer.html").stat().st_size > 10_000


@pytest.mark.integration
def test_the_command_line_example_runs_as_printed(smollm2, tmp_path):
    """The README's commands through the installed ``ropelens`` on the embedded SmolLM2: each exits
    0, and the saved usage has SmolLM2's layers, heads and planes."""
    env = dict(os.environ, PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "src"), env.get("PYTHONPATH", "")])
    for line in cli_example():
        done = subprocess.run(
            line, shell=True, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600
        )
        assert done.returncode == 0, f"{line}\n{done.stderr[-2000:]}"
        assert "ropelens: error" not in done.stderr
    usage = ropelens.load_result(tmp_path / "usage.json")
    spec = ropelens.rope_spec(smollm2)
    layer = spec.layers[0]
    assert tuple(usage.q_norm.shape) == (spec.n_layers, layer.n_heads, len(layer.inv_freq))
    assert (tmp_path / "mixer.html").stat().st_size > 10_000


# ------------------------------------------------------------------------------------ the figure


@pytest.mark.browser
def test_the_figure_script_screenshots_the_reports_frequency_usage_figure(tiny, tmp_path):
    """scripts/readme_figure.py on a tiny model's report: the PNG is the figure's box, drawn."""
    from ropelens.report import build_report
    from tests.browser import CHROMIUM

    if not CHROMIUM.exists():
        pytest.skip(f"{CHROMIUM} is absent: install Debian's chromium (scripts/setup.sh --browser)")
    pytest.importorskip("playwright.sync_api")
    spec = importlib.util.spec_from_file_location(
        "readme_figure", ROOT / "scripts/readme_figure.py"
    )
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    report = build_report(tiny("llama"), tokens=256, n_ctx=64, out=tmp_path / "r", progress=False)
    index = script.ensure_report(report, None)  # the page is there: nothing is rebuilt
    width, height = script.screenshot_figure(index, tmp_path / "usage.png")
    png = (tmp_path / "usage.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    assert abs(int.from_bytes(png[16:20], "big") - width) <= 1
    assert abs(int.from_bytes(png[20:24], "big") - height) <= 1
    assert height > 200 and len(png) > 10_000
    # --usage: a saved result drawn by the same code on a page of its own, the same figure size
    usage = ropelens.analyses.frequency_usage(
        tiny("llama"), "english", n_ctx=64, max_tokens=128, progress=False
    )
    usage.save(tmp_path / "usage.json")
    index = script.usage_page(tmp_path / "usage.json", tmp_path / "page")
    assert script.screenshot_figure(index, tmp_path / "usage2.png") == (width, height)


# ---------------------------------------------------------------------------- the guide's examples


@pytest.mark.browser  # usage.save_figure exports through the installed Chromium
def test_the_guide_python_examples_run_on_tiny_models(tiny, tmp_path, monkeypatch, capsys):
    """Every Python block of docs/guide/*.md, with the embedded SmolLM2 and Gemma 3 replaced by tiny
    random models of their families: layer 3 becomes layer 1 (a tiny model has two), 4,096 tokens
    become 256."""
    from tests.browser import CHROMIUM

    if not CHROMIUM.exists():
        pytest.skip(f"{CHROMIUM} is absent: install Debian's chromium (scripts/setup.sh --browser)")
    monkeypatch.chdir(tmp_path)
    models = {None: tiny("llama"), "smollm2-135m": tiny("llama"), "gemma-3-270m": tiny("gemma3")}
    monkeypatch.setattr(ropelens, "load_model", lambda name=None, **k: models[name])
    blocks = [
        (page.name, block)
        for page in sorted((ROOT / "docs/guide").glob("*.md"))
        for block in _fenced(page.read_text(encoding="utf-8"), "python")
    ]
    assert len(blocks) >= 2
    for name, block in blocks:
        code = block.replace("(3", "(1").replace("max_tokens=4096", "max_tokens=256")
        _run_python(code, {"model": models[None], "ropelens": ropelens}, f"docs/guide/{name}")
    capsys.readouterr()
    assert ropelens.load_result("usage.json").q_norm.shape[0] == models[None].cfg.n_layers
    assert (tmp_path / "usage.pdf").read_bytes()[:4] == b"%PDF"
    assert (tmp_path / "mixer.html").stat().st_size > 10_000
