"""The quick report on the real SmolLM2 and the context-extension page render in headless Chromium:
no errors, every figure drawn, offline."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from ropelens.report import build_report

CHROMIUM = Path("/usr/bin/chromium")
ARTIFACTS = Path(__file__).resolve().parents[2] / "artifacts"
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]

pytestmark = [pytest.mark.integration, pytest.mark.browser]


@pytest.fixture(scope="module")
def browser():
    if not CHROMIUM.exists():
        pytest.skip(f"{CHROMIUM} is absent: install Debian's chromium (scripts/setup.sh --browser)")
    sync_api = pytest.importorskip(
        "playwright.sync_api", reason="playwright (python package) is not installed"
    )
    with sync_api.sync_playwright() as p:
        b = p.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        yield b
        b.close()


def _render(browser, index: Path, shot: str) -> tuple[list[str], list[str], int, int]:
    """Console errors, external requests, figures and drawn figures of a page opened offline; a
    screenshot."""
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    errors: list[str] = []
    external: list[str] = []
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda e: errors.append(str(e)))

    def only_local(route):
        if route.request.url.startswith(("file:", "data:", "blob:", "about:")):
            route.continue_()
        else:
            external.append(route.request.url)
            route.abort()

    page.route("**/*", only_local)
    page.goto(index.as_uri(), wait_until="load")
    page.wait_for_function(
        "() => [...document.querySelectorAll('.plotly-graph-div')].every(d => "
        "d.querySelector('svg.main-svg'))",
        timeout=60_000,
    )
    n_figures = page.evaluate("() => document.querySelectorAll('.plotly-graph-div').length")
    drawn = page.evaluate(
        "() => document.querySelectorAll('.plotly-graph-div svg.main-svg').length"
    )
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / shot), full_page=True)
    page.close()
    return errors, external, n_figures, drawn


def test_quick_report_renders(smollm2, browser, tmp_path):
    out = build_report(smollm2, quick=True, out=tmp_path / "report", progress=False)
    errors, external, n_figures, drawn = _render(browser, out / "index.html", "report.png")
    assert errors == []
    assert external == []
    assert n_figures >= 10 and drawn >= n_figures
    assert os.path.getsize(ARTIFACTS / "report.png") > 50_000


def test_extension_study_page_renders(browser, tmp_path):
    """The extend page (loss by length, passkey grid, per-plane view, predictors) draws every figure
    offline."""
    from ropelens.analyses.extension_study import extension_study
    from ropelens.report.extension_study import write_study
    from ropelens.testing import tiny_model

    model = tiny_model("llama", max_position_embeddings=64)
    study = extension_study(
        model,
        512,
        start=64,
        n_windows=1,
        depths=(0.5,),
        methods=("none", "pi", "yarn", "prope"),
        passkey_lengths=(512,),
        progress=False,
    )
    index = write_study(study, tmp_path / "extend")
    errors, external, n_figures, drawn = _render(browser, index, "extend.png")
    assert errors == []
    assert external == []
    assert n_figures >= 3 and drawn >= n_figures
    html = index.read_text()
    for method in ("PI", "YaRN", "p-RoPE"):
        assert method in html
