"""The concepts page and the command pages: every command has a page whose help is the current
``--help``, every name the pages point to exists, and the concepts figures' numbers are checked
against independent computations on the tiny models."""

from __future__ import annotations

import importlib
import importlib.util
import math
import re
import sys
from pathlib import Path

import pytest
import torch

import ropelens
from ropelens.cli.main import build_parser
from ropelens.testing import tiny_model

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
COMMANDS = DOCS / "commands"


def _script(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up while the class is built
    spec.loader.exec_module(module)
    return module


pages = _script("command_pages")
figures = _script("docs_figures")


def _commands() -> dict:
    sub = next(a for a in build_parser()._actions if a.dest == "command")
    return dict(sub.choices)


def _help_block(text: str) -> str:
    m = re.search(r"^## Help\n\n```text\n(.*?)^```$", text, flags=re.S | re.M)
    assert m, "no help block under '## Help'"
    return m.group(1)


def test_every_command_has_a_page_and_a_row_in_the_index():
    names = set(_commands())
    assert len(names) >= 20
    written = {p.stem for p in COMMANDS.glob("*.md")} - {"index"}
    assert written == names, (
        f"missing pages: {sorted(names - written)}; pages of no command: {sorted(written - names)}"
        " (run python scripts/command_pages.py)"
    )
    index = (COMMANDS / "index.md").read_text(encoding="utf-8")
    rows = re.findall(r"^\| \[`([a-z-]+)`\]\(\1\.md\) \|", index, flags=re.M)
    assert rows == list(_commands())


@pytest.mark.parametrize("name", sorted(_commands()))
def test_help_block_is_the_current_help(name, monkeypatch):
    monkeypatch.setenv("COLUMNS", str(pages.HELP_WIDTH))
    current = _commands()[name].format_help().rstrip() + "\n"
    page = (COMMANDS / f"{name}.md").read_text(encoding="utf-8")
    assert _help_block(page) == current, (
        f"docs/commands/{name}.md shows an old --help: run python scripts/command_pages.py "
        "--help-only"
    )


@pytest.mark.parametrize("name", sorted(_commands()))
def test_page_shows_a_run_of_its_own_command(name):
    page = (COMMANDS / f"{name}.md").read_text(encoding="utf-8")
    example = page[page.index("\n## Example\n") :]
    runs = re.findall(
        r"```bash\nropelens (\S+)[^\n]*\n```\n\n(?:```text\n[\s\S]+?\n```|It prints nothing)",
        example,
    )
    assert runs == [name], f"{name}.md shows no run of ropelens {name} and its output"
    assert "Traceback" not in example and "ropelens: error" not in example


def _resolves(dotted: str) -> bool:
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for attr in parts[cut:]:
            if not hasattr(obj, attr):
                return False
            obj = getattr(obj, attr)
        return True
    return False


def _dotted_names(text: str) -> set[str]:
    return set(re.findall(r"`(ropelens(?:\.[A-Za-z_]\w*)+)", text))


def test_every_python_name_the_pages_give_exists():
    names = set()
    for page in [DOCS / "concepts.md", *COMMANDS.glob("*.md")]:
        names |= _dotted_names(page.read_text(encoding="utf-8"))
    assert len(names) > 30
    missing = sorted(n for n in names if not _resolves(n))
    assert not missing, f"names in the docs that ropelens does not have: {missing}"


def test_a_name_that_does_not_exist_is_caught():
    assert _resolves("ropelens.analyses.frequency_usage")
    assert not _resolves("ropelens.analyses.frequency_usages")
    assert not _resolves("ropelens.nowhere.at_all")


def test_concepts_figures_exist_and_are_shown():
    text = (DOCS / "concepts.md").read_text(encoding="utf-8")
    shown = re.findall(r"!\[[^\]]*\]\(([^)]+)\)", text)
    assert len(shown) >= 3
    for rel in shown:
        path = DOCS / rel
        assert path.is_file() and path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", rel
    drawn = set(
        re.findall(r"OUT / \"(\w+\.png)\"", (ROOT / "scripts" / "docs_figures.py").read_text())
    )
    assert {Path(r).name for r in shown} == drawn


def test_concepts_covers_every_term():
    headings = re.findall(r"^## (.+)$", (DOCS / "concepts.md").read_text(encoding="utf-8"), re.M)
    for term in (
        "Plane",
        "Frequency",
        "Wavelength",
        "Pairing",
        "Band",
        "Score scale",
        "The exact decomposition",
        "Positional head",
        "Attention sink",
        "Massive value",
        "Variant",
        "Verification",
        "Backend",
        "Reducer",
    ):
        assert term in headings, term


def test_wavelengths_plotted_are_two_pi_over_the_config_frequencies():
    """The figure's wavelengths against θ_i = base^(−2i/d) computed from the tiny Gemma 3's
    config (sliding layers base 1e4, global layers base 1e6, head dim 16)."""
    spec = ropelens.rope_spec(tiny_model("gemma3"))
    records = {r["name"].split(",")[1].split()[0]: r for r in figures.wavelength_data(spec, "t")}
    for kind, base in (("sliding", 1e4), ("full", 1e6)):
        r = records[kind]
        expected = [2 * math.pi / base ** (-2 * i / 16) for i in range(8)]
        assert r["planes"] == list(range(8))
        assert r["wavelength"] == pytest.approx(expected, rel=1e-5)
        assert r["n_ctx"] == 256
    assert records["sliding"]["window"] == 8 and records["full"]["window"] is None


def test_pairing_plotted_is_rotate_half_and_every_two():
    d = figures.pairing_data(8)
    assert d["half"] == [i % 4 for i in range(8)]  # dims (i, i + 4) form plane i
    assert d["adjacent"] == [i // 2 for i in range(8)]  # dims (2i, 2i + 1) form plane i


def test_rotation_plotted_turns_by_m_theta():
    pts = figures.rotation_data((1.0, 0.08), positions=8)
    for theta, row in pts.items():
        for m, (x, y) in enumerate(row):
            assert math.atan2(y, x) == pytest.approx(
                math.remainder(m * theta, 2 * math.pi), abs=1e-12
            )
            assert math.hypot(x, y) == pytest.approx(1.0)


def test_decomposed_score_sums_to_the_score_of_hf_attention():
    model = tiny_model("llama-gqa")
    d = figures.decomposition_data(model, "abcabc abcabc", layer=1)
    n = d["query"] + 1
    assert len(d["tokens"]) == n and len(d["bands"]) == len(d["terms"]) == 4
    terms = torch.tensor(d["terms"], dtype=torch.float64)
    assert terms.shape == (4, n)
    assert d["sum"] == pytest.approx(terms.sum(0).tolist(), abs=1e-12)
    assert d["sum"] == pytest.approx(d["hf_score"], abs=1e-5)
    # the last query sees every key: its attention is the softmax of HF's scores
    expected = torch.softmax(torch.tensor(d["hf_score"], dtype=torch.float64), dim=0)
    assert d["attention"] == pytest.approx(expected.tolist(), abs=1e-5)


def test_hf_score_differs_where_the_model_differs():
    """The independent score is not a copy of the decomposition: another layer gives others."""
    model = tiny_model("llama")
    a = figures.decomposition_data(model, "abcabc", layer=0, head=0)
    b = figures.decomposition_data(model, "abcabc", layer=1, head=0)
    assert max(abs(x - y) for x, y in zip(a["hf_score"], b["hf_score"], strict=True)) > 1e-4
