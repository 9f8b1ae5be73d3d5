"""Headless Chromium for the browser tests: the browser, and pages opened offline with their
console errors and outside requests recorded."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

CHROMIUM = Path("/usr/bin/chromium")
ARTIFACTS = Path(__file__).resolve().parents[1] / "artifacts"  # screenshots (not tracked)
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
LOCAL = ("file:", "data:", "blob:", "about:")


def chromium() -> Iterator[Any]:
    """A headless Chromium (playwright), skipping the test where either is absent."""
    if not CHROMIUM.exists():
        pytest.skip(f"{CHROMIUM} is absent: install Debian's chromium (scripts/setup.sh --browser)")
    sync_api = pytest.importorskip(
        "playwright.sync_api", reason="playwright (python package) is not installed"
    )
    with sync_api.sync_playwright() as p:
        b = p.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        yield b
        b.close()


def open_offline(
    browser: Any, path: Path, width: int = 1400, height: int = 1100
) -> tuple[Any, list[str], list[str]]:
    """``path`` opened from disk, every request that is not local refused and recorded; returns
    (page, console errors, outside requests)."""
    page = browser.new_page(viewport={"width": width, "height": height})
    errors: list[str] = []
    external: list[str] = []
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda e: errors.append(str(e)))

    def only_local(route):
        if route.request.url.startswith(LOCAL):
            route.continue_()
        else:
            external.append(route.request.url)
            route.abort()

    page.route("**/*", only_local)
    page.goto(path.as_uri(), wait_until="load")
    return page, errors, external
