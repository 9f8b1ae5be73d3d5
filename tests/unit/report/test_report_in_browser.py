"""The report's page in headless Chromium, on a tiny model with the band mixer embedded: the
mixer's frame keeps the height of what it draws, a jump from the navigation lands below the sticky
bar, and nothing runs past the page's width, at 1400 and 900 px."""

from __future__ import annotations

from pathlib import Path

import pytest

import ropelens.report.mixer as mixer_module
from ropelens.report import build_report
from tests.browser import chromium, open_offline

pytestmark = pytest.mark.browser

N_CTX = 64
WIDTHS = (1400, 900)


@pytest.fixture(scope="module")
def browser():
    yield from chromium()


@pytest.fixture(scope="module")
def report(tiny, tmp_path_factory) -> Path:
    """A report on the tiny Llama whose positional heads are taken to be L1.H0 and L0.H1, so that
    it embeds the band mixer for them."""
    out = tmp_path_factory.mktemp("report") / "out"
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(mixer_module, "positional_heads", lambda data: [(1, 0), (0, 1)])
        build_report(tiny("llama"), tokens=4 * N_CTX, n_ctx=N_CTX, out=out, progress=False)
    return out / "index.html"


def _frame_height(page) -> float:
    return page.evaluate(
        "() => document.querySelector('iframe.mixer').getBoundingClientRect().height"
    )


@pytest.mark.parametrize("width", WIDTHS)
def test_the_mixer_frame_keeps_its_height(report, browser, width):
    """The frame takes the height the mixer draws (all of its controls and plots, no scroll bar
    inside) and keeps it: its height is the same 2 s and 20 s after the page opens."""
    page, errors, external = open_offline(browser, report, width, 900)
    frame = page.frame_locator("iframe.mixer")
    frame.locator("#agreement tr").first.wait_for(timeout=30_000)
    page.wait_for_timeout(2_000)
    first = _frame_height(page)
    inner = page.frames[1]
    drawn = inner.evaluate(
        "() => Math.ceil(document.querySelector('main').getBoundingClientRect().bottom)"
    )
    assert drawn + 4 == pytest.approx(first, abs=3)  # sized to the mixer's content
    assert inner.evaluate(
        "() => document.documentElement.scrollHeight <= window.innerHeight + 1"
    )  # nothing inside the frame is cut off
    page.wait_for_timeout(18_000)
    assert _frame_height(page) == first
    assert 400 < first < 2_500
    assert errors == [] and external == []
    page.close()


@pytest.mark.parametrize("width", WIDTHS)
def test_a_jump_from_the_navigation_lands_below_it(report, browser, width):
    """After clicking a section's link in the sticky navigation, the section's heading is in view
    below the bar, not under it."""
    page, errors, external = open_offline(browser, report, width, 900)
    page.evaluate("() => { document.documentElement.style.scrollBehavior = 'auto'; }")
    anchors = page.evaluate(
        "() => [...document.querySelectorAll('nav.toc a:not(.na)')]"
        ".map(a => a.getAttribute('href'))"
    )
    assert len(anchors) >= 6
    for href in [anchors[2], anchors[len(anchors) // 2], anchors[-2]]:
        page.click(f"nav.toc a[href='{href}']")
        page.wait_for_timeout(300)
        nav_bottom = page.evaluate(
            "() => document.querySelector('nav.toc').getBoundingClientRect().bottom"
        )
        heading = page.evaluate(
            f"() => document.querySelector('{href} h2').getBoundingClientRect().toJSON()"
        )
        assert nav_bottom <= heading["top"] < 900 - heading["height"], (href, nav_bottom, heading)
    assert errors == [] and external == []
    page.close()


@pytest.mark.parametrize("width", WIDTHS)
def test_nothing_runs_past_its_box(report, browser, width):
    """Every table fits its box, its last column in view without scrolling (the RoPE table among
    them), and the page is no wider than the window."""
    page, errors, external = open_offline(browser, report, width, 900)
    assert page.evaluate("() => document.documentElement.scrollWidth") <= width
    wider = page.evaluate(
        """() => [...document.querySelectorAll('.tablewrap')]
            .filter(box => box.scrollWidth > box.clientWidth + 1)
            .map(box => [box.closest('section').id, box.clientWidth, box.scrollWidth])"""
    )
    assert wider == []
    assert page.evaluate("() => document.querySelectorAll('#rope-spec table').length") >= 2
    assert errors == [] and external == []
    page.close()
