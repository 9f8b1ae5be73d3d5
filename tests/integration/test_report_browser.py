"""The quick report on the real SmolLM2 and the context-extension page render in headless Chromium:
no errors, every figure drawn, offline; the report opens on a figure, nothing runs past the page's
width and no subplot title lies over another plot, at 1400 and 900 px."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest

from ropelens.report import build_report
from tests.browser import ARTIFACTS, chromium, open_offline

pytestmark = [pytest.mark.integration, pytest.mark.browser]


@pytest.fixture(scope="module")
def browser():
    yield from chromium()


def _render(browser, index: Path, shot: str) -> tuple[list[str], list[str], int, int]:
    """Console errors, external requests, figures and drawn figures of a page opened offline; a
    screenshot."""
    page, errors, external = open_offline(browser, index, 1280, 900)
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


@pytest.fixture(scope="module")
def quick_report(smollm2, tmp_path_factory) -> Path:
    return build_report(
        smollm2, quick=True, out=tmp_path_factory.mktemp("quick") / "report", progress=False
    )


def test_quick_report_renders(quick_report, browser):
    out = quick_report
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


# Every text box plotly draws for a title (the figure's, ``.gtitle``; a subplot's, an annotation)
# against every subplot's plot area (``.nsewdrag``): a box that overlaps a plot area without lying
# inside it (an in-plot label) is a title printed over a plot.
OVERLAPS = """() => {
  const out = [];
  for (const div of document.querySelectorAll('.plotly-graph-div')) {
    const areas = [...div.querySelectorAll('.nsewdrag')].map(e => e.getBoundingClientRect());
    const texts = [...div.querySelectorAll('.gtitle, .annotation-text')];
    for (const t of texts) {
      const b = t.getBoundingClientRect();
      if (b.width === 0 || b.height === 0) continue;
      for (const a of areas) {
        const w = Math.min(b.right, a.right) - Math.max(b.left, a.left);
        const h = Math.min(b.bottom, a.bottom) - Math.max(b.top, a.top);
        const inside = b.left >= a.left - 1 && b.right <= a.right + 1 && b.top >= a.top - 1
          && b.bottom <= a.bottom + 1;
        if (w > 1 && h > 1 && !inside) {
          out.push({figure: div.id, text: t.textContent, overlap: [Math.round(w), Math.round(h)]});
        }
      }
    }
  }
  return out;
}"""


@pytest.mark.parametrize("width", [1400, 900])
def test_report_layout_fits_and_opens_on_a_figure(quick_report, browser, width):
    page = browser.new_page(viewport={"width": width, "height": 900})
    page.route(
        "**/*",
        lambda r: r.continue_() if r.request.url.startswith(("file:", "data:")) else r.abort(),
    )
    page.goto((quick_report / "index.html").as_uri(), wait_until="load")
    page.wait_for_function(
        "() => [...document.querySelectorAll('.plotly-graph-div')].every(d => "
        "d.querySelector('svg.main-svg'))",
        timeout=60_000,
    )
    page.wait_for_timeout(300)  # responsive figures settle at the viewport's width
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / f"report-first-screen-{width}.png"))
    page.screenshot(path=str(ARTIFACTS / f"report-{width}.png"), full_page=True)
    scroll_width = page.evaluate("() => document.documentElement.scrollWidth")
    assert scroll_width <= width
    wider = page.evaluate(
        "w => [...document.querySelectorAll('main *')].filter(e => "
        "e.getBoundingClientRect().right > w + 1 && !e.closest('.tablewrap')).map(e => "
        "e.tagName + '.' + e.className).slice(0, 5)",
        width,
    )
    assert wider == []  # nothing but a table's own scrolling box runs past the page
    assert page.evaluate(OVERLAPS) == []
    first = page.evaluate(
        "() => { const r = document.querySelector('.plotly-graph-div').getBoundingClientRect();"
        " return [r.top, r.bottom]; }"
    )
    assert 0 <= first[0] < 900 - 300  # the first screen shows most of a figure
    if width == 1400:
        assert first[1] <= 900  # all of it
    closed = page.evaluate("() => [...document.querySelectorAll('details.table')].map(d => d.open)")
    assert closed and not any(closed)  # tables folded until asked for
    page.close()


def test_report_mixer_redraws_its_positional_heads(quick_report, browser):
    """The band mixer embedded in the report runs inside its frame: it holds the layers of the
    positional heads the report names, its full pattern is a distribution over each query's keys,
    and the previous-token or diagonal head it opens on changes when its fastest band is dropped."""
    html = (quick_report / "index.html").read_text()
    named = re.search(r"with the positional heads (.*?)(?:; |\. Switch)", html)
    assert named, "the quick report found no positional head to show in the mixer"
    listed = named.group(1).split(" and ")[0].split(", ")  # "… and 3 more" names no head
    heads = [tuple(int(x) for x in re.findall(r"\d+", h)) for h in listed]
    page, errors, external = open_offline(browser, quick_report / "index.html", 1400, 900)
    frame = page.frame_locator("#band-mixer iframe")
    frame.locator("body").wait_for()
    mixer = next(f for f in page.frames if f != page.main_frame)
    mixer.wait_for_function("() => window.ropelensExplorer !== undefined", timeout=60_000)
    layers = mixer.evaluate("() => window.ropelensExplorer.layers()")
    assert {L for L, _ in heads} >= set(layers) and layers
    opened = mixer.evaluate("() => window.ropelensExplorer.state()")
    assert (opened["layer"], opened["head"]) == heads[0]  # the strongest positional head
    frame_height = page.evaluate(
        "() => document.querySelector('#band-mixer iframe').getBoundingClientRect().height"
    )
    inner = mixer.evaluate("() => document.documentElement.scrollHeight")
    assert frame_height >= inner  # the frame fits the mixer: nothing scrolls inside it
    L, h = next((L, h) for L, h in heads if L in layers)
    mixer.evaluate(f"() => {{ window.ropelensExplorer.setLayer({L}); "
                   f"window.ropelensExplorer.setHead({h}); }}")  # fmt: skip
    names = mixer.evaluate("() => window.ropelensExplorer.bandNames()")
    mixer.evaluate(f"() => window.ropelensExplorer.setBands({json.dumps(names)})")
    full = mixer.evaluate("() => window.ropelensExplorer.pattern()")
    for row in full:
        assert abs(sum(row) - 1.0) < 1e-3  # no sink parameters in SmolLM2: rows sum to 1
    mixer.evaluate(f"() => window.ropelensExplorer.setBands({json.dumps(names[1:])})")
    without_fastest = mixer.evaluate("() => window.ropelensExplorer.pattern()")
    change = max(abs(a - b) for r1, r2 in zip(full, without_fastest) for a, b in zip(r1, r2))
    assert change > 0.1
    mixer.evaluate(f"() => window.ropelensExplorer.setBands({json.dumps(names)})")
    height = "() => document.querySelector('#band-mixer iframe').getBoundingClientRect().height"
    page.wait_for_timeout(1_000)
    settled = page.evaluate(height)
    page.wait_for_timeout(20_000)  # the frame keeps its height: it grew by itself without end
    assert page.evaluate(height) == settled
    page.locator("#band-mixer").scroll_into_view_if_needed()
    page.wait_for_timeout(500)
    page.screenshot(path=str(ARTIFACTS / "report-band-mixer.png"))
    assert errors == [] and external == []
    page.close()
