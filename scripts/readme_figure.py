"""Screenshot the report's frequency-usage figure for the README and the docs home page.

Runs ``ropelens report`` on the embedded SmolLM2 (its defaults: 32,768 tokens of the English
corpus) unless ``--report`` names a report folder that already holds ``index.html``, opens the page
offline in headless Chromium and saves the layer × plane map of its "Frequency usage" section with
the sink positions excluded (the section's second figure) as a PNG:

    .venv/bin/python scripts/readme_figure.py      # writes docs/assets/frequency_usage.png
    .venv/bin/python scripts/readme_figure.py --report ropelens-report --out /tmp/usage.png

``--usage FILE.json`` skips the rest of the report: it draws a saved frequency-usage result (e.g.
``ropelens frequency-usage --n-ctx 512 --tokens 4096 --save usage.json``) with the report's own
figure code on a page of the report's own look, and screenshots that. The committed PNG was made
so (a full report takes too long on a shared two-core machine):

    .venv/bin/ropelens frequency-usage --n-ctx 512 --tokens 4096 --save usage.json
    .venv/bin/python scripts/readme_figure.py --usage usage.json --report /tmp/usage-page

Needs Chromium at /usr/bin/chromium and the playwright package (``scripts/setup.sh --browser``).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

CHROMIUM = Path("/usr/bin/chromium")
SECTION = "frequency-usage"
FIGURE = 1  # the section's layer × plane maps: 0 with every position, 1 with the sinks excluded
LOCAL = ("file:", "data:", "blob:", "about:")
WIDTH = 1280  # the page's width; the figure takes the section's width


def ensure_report(report: Path, model: str | None) -> Path:
    """The report's ``index.html``, building the report first when the folder holds none."""
    index = report / "index.html"
    if not index.exists():
        from ropelens.report import build_report

        build_report(model, out=report)
    return index


def usage_page(usage_json: Path, folder: Path) -> Path:
    """A page holding the report's two layer × plane maps of a saved frequency-usage result, drawn
    by the report's own code; returns its ``index.html``."""
    import plotly.offline

    from ropelens.analyses import FrequencyUsage
    from ropelens.plots.frequency_usage import usage_figure
    from ropelens.plots.style import category_layers, style_figure
    from ropelens.report.html import figure_html, page

    usage = FrequencyUsage.load(usage_json)
    divs = []
    for scope in ("all", "no_sink"):  # as the report's section draws them
        fig = style_figure(
            usage_figure(usage, scope), height=max(320, 11 * len(usage.layers) + 140)
        )
        category_layers(fig, len(usage.layers))
        divs.append(figure_html(fig))
    prov = usage.provenance
    body = (
        f'<section id="{SECTION}"><h2>Frequency usage</h2><p class="lead">{prov.n_tokens:,} '
        f"tokens in {prov.n_windows} windows</p>{''.join(divs)}</section>"
    )
    folder.mkdir(parents=True, exist_ok=True)
    index = folder / "index.html"
    index.write_text(
        page(
            title=f"ropelens report — {prov.model}",
            subtitle="",
            nav=[(SECTION, "Frequency usage", True)],
            body=body,
            footer="",
            plotly_js=plotly.offline.get_plotlyjs(),
        ),
        encoding="utf-8",
    )
    return index


def screenshot_figure(
    index: Path, out: Path, section: str = SECTION, figure: int = FIGURE
) -> tuple[int, int]:
    """Save figure number ``figure`` of ``section`` in the page at ``index`` as a PNG at ``out``,
    opened offline; returns the PNG's (width, height) in pixels.

    Raises RuntimeError when the page logs a console error, asks for anything not on disk, or has
    no drawn figure in that section.
    """
    from playwright.sync_api import sync_playwright

    errors: list[str] = []
    external: list[str] = []

    def only_local(route):
        if route.request.url.startswith(LOCAL):
            route.continue_()
        else:
            external.append(route.request.url)
            route.abort()

    with sync_playwright() as p:
        browser = p.chromium.launch(
            executable_path=str(CHROMIUM), args=["--headless", "--no-sandbox", "--disable-gpu"]
        )
        page = browser.new_page(viewport={"width": WIDTH, "height": 900}, device_scale_factor=1)
        page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
        page.on("pageerror", lambda e: errors.append(str(e)))
        page.route("**/*", only_local)
        page.goto(index.resolve().as_uri(), wait_until="load")
        div = page.locator(f"section#{section} .plotly-graph-div").nth(figure)
        div.locator("svg.main-svg").first.wait_for(timeout=60_000)
        div.scroll_into_view_if_needed()
        page.wait_for_timeout(500)  # plotly's last layout pass
        out.parent.mkdir(parents=True, exist_ok=True)
        div.screenshot(path=str(out))
        box = div.bounding_box()
        browser.close()
    if errors or external:
        raise RuntimeError(f"the page is not clean offline: errors {errors}, requests {external}")
    return round(box["width"]), round(box["height"])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--report", type=Path, default=Path("ropelens-report"))
    parser.add_argument("--model", default=None, help="model for a new report (default: SmolLM2)")
    parser.add_argument("--usage", type=Path, default=None, help="a saved frequency-usage JSON")
    parser.add_argument("--out", type=Path, default=ROOT / "docs/assets/frequency_usage.png")
    args = parser.parse_args(argv)
    if args.usage is not None:
        index = usage_page(args.usage, args.report)
    else:
        index = ensure_report(args.report, args.model)
    width, height = screenshot_figure(index, args.out)
    print(f"{args.out}: {width} x {height} px, from {index}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
