"""The documentation site builds with warnings as errors, documents every public name, links only
to pages and anchors that exist, loads nothing from outside, and draws its pages and notebook
figures in headless Chromium with no console error.

The site is built once per session (``mkdocs build --strict``, as scripts/build_docs.sh does) into
a temporary folder, and served from 127.0.0.1 for the browser tests (the search index is fetched,
which a page opened from disk may not do).
"""

from __future__ import annotations

import functools
import http.server
import importlib
import json
import logging
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from html.parser import HTMLParser
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urljoin, urlsplit

import pytest

from tests.browser import ARTIFACTS, chromium
from tests.unit.test_docstrings import PUBLIC_MODULES

pytestmark = pytest.mark.docs

ROOT = Path(__file__).resolve().parents[2]
API_PAGES = {  # module -> its page under docs/api/
    "ropelens": "ropelens",
    "ropelens.analyses": "analyses",
    "ropelens.errors": "errors",
    "ropelens.spec.variants": "variants",
    "ropelens.run.data": "data",
    "ropelens.run.stats": "stats",
    "ropelens.run.evaluate": "evaluate",
    "ropelens.testing": "testing",
    "ropelens.report": "report",
}
PLOTLY_MIME = "application/vnd.plotly.v1+json"
RESOURCE_ATTRS = {"script": "src", "img": "src", "link": "href", "iframe": "src", "source": "src"}


def build(config: Path, out: Path) -> float:
    """``mkdocs build --strict`` of ``config`` into ``out``; the seconds it took. Fails the test
    with mkdocs's output when the build fails or warns."""
    pytest.importorskip("mkdocs", reason="mkdocs is not installed (pip install -e '.[docs]')")
    pytest.importorskip("mkdocstrings_handlers.python", reason="mkdocstrings[python] is missing")
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1", "PYTHONPATH": str(ROOT / "src")}
    start = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(config), "-d", str(out)],
        cwd=config.parent,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    seconds = time.perf_counter() - start
    assert proc.returncode == 0, f"mkdocs build --strict failed:\n{proc.stdout}\n{proc.stderr}"
    return seconds


@pytest.fixture(scope="session")
def site(tmp_path_factory) -> Path:
    """The ropelens site, built once."""
    out = tmp_path_factory.mktemp("site") / "site"
    seconds = build(ROOT / "mkdocs.yml", out)
    pages = len(list(out.rglob("index.html")))  # one per page (the 404 page is 404.html)
    print(f"\nsite: {pages} pages built in {seconds:.1f} s")
    return out


class _Page(HTMLParser):
    """The ids, links and resources of one HTML page."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.ids: set[str] = set()
        self.links: list[str] = []
        self.resources: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = {k: v for k, v in attrs if v is not None}
        for key in ("id", "name") if tag == "a" else ("id",):
            if key in a:
                self.ids.add(a[key])
        if tag == "a" and "href" in a:
            self.links.append(a["href"])
        attr = RESOURCE_ATTRS.get(tag)
        if attr and attr in a:
            self.resources.append(a[attr])


@functools.cache
def _parse(path: Path) -> _Page:
    page = _Page()
    page.feed(path.read_text(encoding="utf-8"))
    return page


def _pages(site: Path) -> list[Path]:
    return sorted(site.rglob("*.html"))


def _target(site: Path, page: Path, url: str) -> tuple[Path, str] | None:
    """The file and fragment a relative URL on ``page`` points to; None for an outside URL."""
    parts = urlsplit(url)
    if parts.scheme or url.startswith("//"):
        return None
    base = "/" + page.relative_to(site).as_posix()
    path = unquote(urlsplit(urljoin(base, parts.path)).path) if parts.path else base
    target = site / path.lstrip("/")
    if path.endswith("/") or target.is_dir():
        target = target / "index.html"
    return target, unquote(parts.fragment)


def test_site_has_every_page(site):
    """Home, concepts, a page per tutorial notebook and per command page, the API pages, the
    results pages, changelog, contributing and citation are all built."""
    docs = ROOT / "docs"
    expected = ["", "concepts", "changelog", "contributing", "citation", "api"]
    expected += [f"api/{name}" for name in API_PAGES.values()]
    expected += [f"tutorials/{p.stem}" for p in docs.glob("tutorials/*.ipynb")]
    expected += [f"commands/{p.stem}" for p in docs.glob("commands/*.md") if p.stem != "index"]
    expected += [f"guide/{p.stem}" for p in docs.glob("guide/*.md")]
    expected += ["results", "sweep", "statistics", "trajectories", "performance", "models"]
    missing = [e for e in expected if not (site / e / "index.html").is_file()]
    assert missing == []
    changelog = (site / "changelog" / "index.html").read_text(encoding="utf-8")
    first_entry = next(
        line[4:].strip()
        for line in (ROOT / "CHANGELOG.md").read_text(encoding="utf-8").splitlines()
        if line.startswith("### ")
    )
    assert first_entry in changelog  # CHANGELOG.md itself, included


def test_every_public_name_is_in_the_reference(site):
    """Each name in the ``__all__`` of a public module has its entry (an anchor named after it) on
    that module's API page; submodules and dunder names excepted."""
    assert set(API_PAGES) == set(PUBLIC_MODULES)
    missing = []
    for module_name, page in API_PAGES.items():
        ids = _parse(site / "api" / page / "index.html").ids
        module = importlib.import_module(module_name)
        for name in module.__all__:
            if name.startswith("__") or _is_module(getattr(module, name)):
                continue
            qualified = f"{module_name}.{name}"
            if qualified not in ids and f"{qualified}.{name}" not in ids:
                missing.append(qualified)
    assert missing == [], "add them to the module's API page (docs/api/) or to its __all__"


def test_examples_are_shown_as_python_sessions(site):
    """A docstring's ``Examples:`` is shown as a code block of ``>>>`` lines on every API page: not
    as Markdown, where ``>>>`` would nest quotes and a printed ``<s>`` would strike out the rest of
    the page."""
    for page in API_PAGES.values():
        text = (site / "api" / page / "index.html").read_text(encoding="utf-8")
        assert "<blockquote>" not in text, page
        assert "<s>" not in text and "<del>" not in text, page
    analyses = (site / "api" / "analyses" / "index.html").read_text(encoding="utf-8")
    assert analyses.count("&gt;&gt;&gt;") >= 10


def _is_module(obj: Any) -> bool:
    return type(obj).__name__ == "module"


def test_internal_links_and_anchors_resolve(site):
    """Every relative link, script, stylesheet and image of every page points to a file of the
    site, and every ``#fragment`` to an id on the page it names."""
    broken = []
    for page in _pages(site):
        parsed = _parse(page)
        for url in parsed.links + parsed.resources:
            if url.startswith(("mailto:", "javascript:", "data:")):
                continue
            target = _target(site, page, url)
            if target is None:
                continue
            path, fragment = target
            where = f"{page.relative_to(site)}: {url}"
            if not path.is_file():
                broken.append(f"{where} (no file)")
            elif fragment and path.suffix == ".html" and fragment not in _parse(path).ids:
                broken.append(f"{where} (no anchor)")
    assert broken == []


def test_nothing_is_loaded_from_outside(site):
    """No script, stylesheet, image or frame of any page comes from another host, and the theme
    loads no web font."""
    outside = [
        f"{page.relative_to(site)}: {url}"
        for page in _pages(site)
        for url in _parse(page).resources
        if urlsplit(url).scheme in ("http", "https") or url.startswith("//")
    ]
    assert outside == []
    css = "\n".join(p.read_text(encoding="utf-8") for p in site.rglob("*.css"))
    assert "fonts.googleapis" not in css and "fonts.gstatic" not in css


def test_plotly_js_is_the_installed_one(site):
    """The site carries one plotly.js, the installed plotly package's."""
    plotly = pytest.importorskip("plotly")
    shipped = Path(plotly.__file__).parent / "package_data" / "plotly.min.js"
    copies = list(site.rglob("plotly*.js"))
    assert [p.relative_to(site).as_posix() for p in copies] == ["assets/site/plotly.min.js"]
    assert copies[0].read_bytes() == shipped.read_bytes()


def test_citation_file_is_valid_cff_of_this_version():
    """CITATION.cff has the keys CFF 1.2.0 requires, with the types it requires, and the version
    the package reports; the citation page quotes the same version."""
    yaml = pytest.importorskip("yaml")
    from ropelens.results.provenance import ROPELENS_VERSION

    cff = yaml.safe_load((ROOT / "CITATION.cff").read_text(encoding="utf-8"))
    assert cff["cff-version"] == "1.2.0"
    assert isinstance(cff["message"], str) and cff["message"].strip()
    assert isinstance(cff["title"], str) and cff["title"].strip()
    assert cff["authors"] and all(a.get("name") or a.get("family-names") for a in cff["authors"])
    assert cff["type"] in ("software", "dataset")
    assert str(cff["version"]) == ROPELENS_VERSION
    page = (ROOT / "docs" / "citation.md").read_text(encoding="utf-8")
    assert f"version = {{{ROPELENS_VERSION}}}" in page


def _hooks() -> Any:
    """scripts/docs_hooks.py as a module."""
    pytest.importorskip("mkdocs", reason="mkdocs is not installed (pip install -e '.[docs]')")
    import importlib.util

    spec = importlib.util.spec_from_file_location("docs_hooks", ROOT / "scripts" / "docs_hooks.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_only_real_documentation_problems_are_warned():
    """The build drops autorefs' warning for indexing that reads like a reference link; a broken
    reference to a name, a misnamed parameter and anything else still fail the strict build."""
    keep = _hooks()._FILTER.filter

    def record(message: str) -> logging.LogRecord:
        return logging.LogRecord("x", logging.WARNING, __file__, 1, message, None, None)

    dropped = [
        "api/analyses.md: from a.py:3: (f) Could not find cross-reference target ':, :, h'",
        "api/analyses.md: Could not find cross-reference target '\"n_boot\"'",
        "api/analyses.md: Could not find cross-reference target '0'",
    ]
    kept = [
        "api/analyses.md: Could not find cross-reference target 'ropelens.missing'",
        "api/analyses.md: Could not find cross-reference target 'Bands'",
        "griffe: src/ropelens/a.py:3: Parameter 'n_ctx' does not appear in the function signature",
        "griffe: src/ropelens/errors.py:31: Parameter '*args' does not appear in the function "
        "signature",
        "griffe: src/ropelens/a.py:3: Failed to get 'name: description' pair from 'x'",
    ]
    assert [keep(record(m)) for m in dropped] == [False] * len(dropped)
    assert [keep(record(m)) for m in kept] == [True] * len(kept)


def test_tutorials_are_listed_in_reading_order():
    hooks = _hooks()
    names = ["your_own_analysis", "zeta", "quickstart", "alpha", "truncated_rope"]
    ordered = sorted((Path(f"{n}.ipynb") for n in names), key=hooks._tutorial_key)
    assert [p.stem for p in ordered] == [
        "quickstart",
        "truncated_rope",
        "your_own_analysis",
        "alpha",
        "zeta",
    ]


# ---- in headless Chromium, served from 127.0.0.1 -------------------------------------------------


class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture(scope="module")
def served(site) -> Iterator[str]:
    handler = functools.partial(_Quiet, directory=str(site))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/"
    server.shutdown()
    server.server_close()


@pytest.fixture(scope="module")
def browser():
    yield from chromium()


def _open(browser: Any, url: str, origin: str) -> tuple[Any, list[str], list[str]]:
    """``url`` opened with every request outside ``origin`` refused and recorded; (page, console
    errors, outside requests)."""
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    page.set_default_timeout(120_000)  # a loaded machine; the pages are local
    errors: list[str] = []
    outside: list[str] = []
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda e: errors.append(str(e)))

    def only_local(route: Any) -> None:
        if route.request.url.startswith((origin, "data:", "blob:", "about:")):
            route.continue_()
        else:
            outside.append(route.request.url)
            route.abort()

    page.route("**/*", only_local)
    page.goto(url, wait_until="networkidle")
    return page, errors, outside


def _notebook_with_figure(docs: Path) -> str | None:
    """The stem of the first tutorial whose stored outputs hold a plotly figure."""
    for path in sorted(docs.glob("tutorials/*.ipynb")):
        nb = json.loads(path.read_text(encoding="utf-8"))
        for cell in nb["cells"]:
            if any(PLOTLY_MIME in o.get("data", {}) for o in cell.get("outputs", [])):
                return path.stem
    return None


@pytest.mark.browser
def test_home_page_loads_offline_and_searches(served, browser):
    """The home page: no console error, no outside request, its figure shown, and the search finds
    a page with nothing but the site's own files."""
    page, errors, outside = _open(browser, served, served)
    assert page.title().startswith("ropelens")
    assert page.evaluate("() => [...document.images].every(i => i.complete && i.naturalWidth > 0)")
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "site-home.png"), full_page=False)
    page.click("input.md-search__input")
    page.keyboard.type("frequency")  # typed: the search answers key events
    page.wait_for_selector(".md-search-result__item", timeout=120_000)
    found = page.locator(".md-search-result__item").count()
    page.close()
    assert errors == []
    assert outside == []
    assert found > 0


@pytest.mark.browser
def test_api_page_loads_offline(served, browser):
    """The analyses' reference page loads with no console error and no outside request, and the
    browser finds the entry of every name the module exports."""
    names = [
        n for n in importlib.import_module("ropelens.analyses").__all__ if not n.startswith("__")
    ]
    page, errors, outside = _open(browser, served + "api/analyses/", served)
    page.wait_for_load_state("load")
    missing = page.evaluate(
        "names => names.filter(n => !document.getElementById('ropelens.analyses.' + n)"
        " && !document.getElementById('ropelens.analyses.' + n + '.' + n))",
        names,
    )
    page.close()
    assert errors == []
    assert outside == []
    assert missing == []


@pytest.mark.browser
def test_tutorial_figures_are_drawn(site, served, browser):
    """A tutorial stored with a plotly figure draws it, with the site's own plotly.js."""
    stem = _notebook_with_figure(ROOT / "docs")
    if stem is None:
        pytest.skip("no tutorial under docs/tutorials/ is stored with a plotly figure")
    page, errors, outside = _open(browser, f"{served}tutorials/{stem}/", served)
    page.wait_for_selector(".plotly-graph-div .main-svg", timeout=120_000)
    n_figures = page.locator(".plotly-graph-div").count()
    drawn = page.locator(".plotly-graph-div .main-svg").count()
    page.close()
    assert errors == []
    assert outside == []
    assert drawn >= n_figures > 0


# ---- the notebook hook on a small site of its own ------------------------------------------------


def _stored_notebook() -> Any:
    """A notebook as nbclient stores one: text, a stream, a table, a plotly figure and an error."""
    nbformat = pytest.importorskip("nbformat")
    go = pytest.importorskip("plotly.graph_objects")
    fig = go.Figure(go.Scatter(x=[0, 1, 2], y=[3, 1, 2], name="plane-energy"))
    fig.update_layout(showlegend=True)
    nb = nbformat.v4.new_notebook()
    code = nbformat.v4.new_code_cell("print(1 < 2)\nfig")
    code.outputs = [
        nbformat.v4.new_output("stream", name="stdout", text="True <ok>\n"),
        nbformat.v4.new_output("stream", name="stderr", text="\rloading:   0%|"),
        nbformat.v4.new_output("stream", name="stderr", text="\rloading:  50%|\rloading: 100%|\n"),
        nbformat.v4.new_output("display_data", data={PLOTLY_MIME: fig.to_plotly_json()}),
        nbformat.v4.new_output(
            "execute_result",
            data={
                "text/html": "<table class='frame'><tr><td>7</td></tr></table>",
                "text/plain": "7",
            },
            execution_count=1,
        ),
        nbformat.v4.new_output(
            "error", ename="ValueError", evalue="no", traceback=["\x1b[31mValueError\x1b[0m: no"]
        ),
    ]
    nb.cells = [
        nbformat.v4.new_markdown_cell(
            "# A stored notebook\n\nBack to [the home page](../index.md)."
        ),
        code,
    ]
    return nb


@pytest.fixture(scope="module")
def small_site(tmp_path_factory) -> Path:
    """A site of one page and one notebook, built with the ropelens hooks."""
    nbformat = pytest.importorskip("nbformat")
    root = tmp_path_factory.mktemp("small")
    (root / "docs" / "tutorials").mkdir(parents=True)
    home = "# Home\n\nPlane $i$ turns by $\\theta_i = b^{-2i/d}$ per token, and $a < b$.\n\n"
    home += "$$\n\\sum_i q_i^\\top R(\\theta_i (n - m)) k_i\n$$\n"
    (root / "docs" / "index.md").write_text(home, encoding="utf-8")
    nbformat.write(_stored_notebook(), root / "docs" / "tutorials" / "stored.ipynb")
    config = {
        "site_name": "small",
        "theme": {"name": "material", "font": False},
        "hooks": [str(ROOT / "scripts" / "docs_hooks.py")],
        "nav": [{"Home": "index.md"}, {"Tutorials": "generated:tutorials"}],
        "markdown_extensions": [{"pymdownx.arithmatex": {"generic": True}}],
    }
    (root / "mkdocs.yml").write_text(json.dumps(config), encoding="utf-8")  # JSON is YAML
    build(root / "mkdocs.yml", root / "site")
    return root / "site"


def test_notebook_page_keeps_its_outputs(small_site):
    """The notebook page shows its code, its escaped stream, its table and its error (without
    terminal colour codes), links to the page its markdown names, and is listed in the nav under
    its first heading."""
    page = (small_site / "tutorials" / "stored" / "index.html").read_text(encoding="utf-8")
    assert "True &lt;ok&gt;" in page
    assert page.count("loading:") == 1 and "loading: 100%|" in page  # a progress bar, last state
    assert "<table class='frame'><tr><td>7</td></tr></table>" in page
    assert "ValueError</code>" not in page and "ValueError: no" in page and "\x1b" not in page
    assert "ropelens-nb-output" not in page  # every placeholder replaced
    assert 'href="../.."' in page or 'href="../../"' in page
    assert 'href="../stored.ipynb"' in page  # the notebook itself, to download
    assert (small_site / "tutorials" / "stored.ipynb").is_file()
    home = (small_site / "index.html").read_text(encoding="utf-8")
    assert "A stored notebook" in home


def test_formulas_are_mathml(small_site):
    """Inline and display formulas are written as MathML (no math script): the inline ones in
    spans, the display one in a block, each symbol as its MathML element."""
    page = (small_site / "index.html").read_text(encoding="utf-8")
    assert page.count('<math xmlns="http://www.w3.org/1998/Math/MathML" display="inline"') == 3
    assert page.count('display="block"') == 1
    assert "&#x003B8;" in page  # θ
    assert "\\(" not in page and "\\[" not in page
    assert "mathjax" not in page.lower() and "katex" not in page.lower()


@pytest.mark.browser
def test_notebook_plotly_figure_is_drawn(small_site, browser):
    """The stored plotly figure is drawn by the site's plotly.js, its trace named in the legend."""
    handler = functools.partial(_Quiet, directory=str(small_site))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    origin = f"http://127.0.0.1:{server.server_address[1]}/"
    try:
        page, errors, outside = _open(browser, origin + "tutorials/stored/", origin)
        page.wait_for_selector(".plotly-graph-div .main-svg", timeout=120_000)
        legend = page.locator(".plotly-graph-div .legendtext").all_text_contents()
        points = page.locator(".plotly-graph-div .scatterlayer .trace").count()
        page.close()
    finally:
        server.shutdown()
        server.server_close()
    assert errors == []
    assert outside == []
    assert points == 1
    assert legend == ["plane-energy"]
