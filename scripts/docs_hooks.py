"""MkDocs hooks of the ropelens site: notebooks as pages, generated navigation, a local plotly.js.

- Every ``docs/tutorials/*.ipynb`` becomes a page, rendered from its stored outputs (nothing is
  executed at build time): markdown cells as markdown, code cells as highlighted Python, outputs as
  HTML. A plotly figure (``application/vnd.plotly.v1+json``) is drawn by the one local copy of
  plotly.js that this hook copies from the installed plotly package into the built site.
- The "Tutorials" and "How-to" sections of the navigation list the notebooks and the pages under
  ``docs/commands/`` that exist, so adding one needs no edit here.

Nothing here fetches anything: the site works offline.
"""

from __future__ import annotations

import base64
import html
import importlib
import importlib.util
import json
import logging
import re
import shutil
import sys
from pathlib import Path
from typing import Any

import nbformat
from mkdocs.structure.files import File, Files
from mkdocs.utils import get_relative_url

PLOTLY_JS = "assets/site/plotly.min.js"
PLOTLY_MIME = "application/vnd.plotly.v1+json"
TUTORIALS = "tutorials"
COMMANDS = "commands"
# the tutorials in the order a newcomer reads them; any other notebook follows, by file name
TUTORIAL_ORDER = (
    "quickstart",
    "positional_vs_semantic",
    "truncated_rope",
    "context_extension",
    "knockouts_and_statistics",
    "your_model_and_data",
    "many_processes",
    "your_own_analysis",
)
_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
_NB_LINK = re.compile(r"(\]\((?!https?:)[^)\s#]+)\.ipynb([#)])")
_PLACEHOLDER = "ropelens-nb-output-{}"
# a placeholder paragraph as Python-Markdown writes it
_PLACEHOLDER_HTML = re.compile(r"<p>ropelens-nb-output-(\d+)</p>")

# page src_uri -> the outputs' HTML by placeholder number; the pages that draw a plotly figure
_outputs: dict[str, list[str]] = {}
_needs_plotly: set[str] = set()


def _title(nb: Any, fallback: str) -> str:
    """The notebook's first markdown heading, else its file name."""
    for cell in nb.cells:
        if cell.cell_type == "markdown":
            m = re.search(r"^#{1,6}\s+(.+?)\s*$", cell.source, re.M)
            if m:
                return m.group(1)
    return fallback.replace("_", " ").replace("-", " ").capitalize()


def _tutorial_key(path: Path) -> tuple[int, str]:
    """The reading order of TUTORIAL_ORDER, then by file name."""
    if path.stem in TUTORIAL_ORDER:
        return (TUTORIAL_ORDER.index(path.stem), "")
    return (len(TUTORIAL_ORDER), path.name)


def _command_key(path: Path) -> tuple[int, str]:
    return (0 if path.stem == "index" else 1, path.name)


_UNRESOLVED = re.compile(r"Could not find cross-reference target '(.*)'$", re.S)
_IDENTIFIER = re.compile(r"[A-Za-z_][\w.]*\Z")
DOC_LOGGERS = (
    "mkdocs.plugins.mkdocs_autorefs._internal.plugin",
    "mkdocs.plugins.mkdocs_autorefs",
    "mkdocs.plugins.griffe",
)


class _OnlyRealProblems(logging.Filter):
    """Drop autorefs' unresolved cross-reference whose target is not a (dotted) name, keep every
    other warning: ``shares[:, :, h]`` or ``x["n"][0]`` in a docstring is indexing that reads like
    a reference link, and autorefs leaves its text as written."""

    def filter(self, record: logging.LogRecord) -> bool:
        m = _UNRESOLVED.search(record.getMessage())
        return m is None or bool(_IDENTIFIER.match(m.group(1)))


_FILTER = _OnlyRealProblems()


def on_config(config: Any, **kwargs: Any) -> Any:
    """Fill the "Tutorials" and "How-to" sections of the nav from the files that exist; import
    ropelens from this checkout's src/ (as the reference reads it)."""
    for name in DOC_LOGGERS:
        logger = logging.getLogger(name)
        if _FILTER not in logger.filters:
            logger.addFilter(_FILTER)
    src = str(Path(config["config_file_path"]).parent / "src")
    if src not in sys.path:
        sys.path.insert(0, src)
    docs = Path(config["docs_dir"])
    tutorials = sorted(docs.glob(f"{TUTORIALS}/*.ipynb"), key=_tutorial_key)
    commands = sorted(docs.glob(f"{COMMANDS}/*.md"), key=_command_key)
    tutorial_nav = [
        {_title(nbformat.read(p, as_version=4), p.stem): f"{TUTORIALS}/{p.stem}.md"}
        for p in tutorials
    ]
    command_nav = [
        (f"{COMMANDS}/{p.name}" if p.stem == "index" else {p.stem: f"{COMMANDS}/{p.name}"})
        for p in commands
    ]
    for i, entry in enumerate(config["nav"] or []):
        if not isinstance(entry, dict):
            continue
        (name, value), *_ = entry.items()
        if value == "generated:tutorials":
            config["nav"][i] = {name: tutorial_nav}
        elif value == "generated:commands":
            config["nav"][i] = {name: command_nav}
    return config


def _text(value: Any) -> str:
    return "".join(value) if isinstance(value, list) else str(value)


def _plotly_html(spec: dict[str, Any], n: int) -> str:
    """A div and the call that draws ``spec`` in it with the site's plotly.js."""
    div = f"ropelens-nb-plot-{n}"
    payload = json.dumps(
        {"data": spec.get("data", []), "layout": spec.get("layout", {}), "config": {}}
    ).replace("</", "<\\/")
    config = {"responsive": True, "displaylogo": False, **spec.get("config", {})}
    return (
        f'<div class="nb-plotly"><div id="{div}" class="plotly-graph-div"></div></div>\n'
        f"<script>(function(){{var f={payload};"
        f"Plotly.newPlot('{div}',f.data,f.layout,{json.dumps(config)});}})();</script>"
    )


def _data_html(data: dict[str, Any], n: int) -> tuple[str, bool]:
    """One display output's richest form as HTML; whether it is a plotly figure."""
    if PLOTLY_MIME in data:
        return _plotly_html(data[PLOTLY_MIME], n), True
    if "text/html" in data:
        return f'<div class="nb-html">{_text(data["text/html"])}</div>', False
    if "image/svg+xml" in data:
        return f'<div class="nb-image">{_text(data["image/svg+xml"])}</div>', False
    for mime in ("image/png", "image/jpeg"):
        if mime in data:
            b64 = _text(data[mime]).replace("\n", "")
            base64.b64decode(b64, validate=True)  # a corrupt image fails the build
            return (
                f'<div class="nb-image"><img alt="figure" src="data:{mime};base64,{b64}"></div>',
                False,
            )
    if "text/plain" in data:
        return _pre(_text(data["text/plain"]), "nb-text"), False
    return "", False


def _pre(text: str, cls: str) -> str:
    return f'<pre class="{cls}"><code>{html.escape(_ANSI.sub("", text))}</code></pre>'


def _terminal_text(text: str) -> str:
    """What a terminal would show of ``text``: colour codes dropped, each line as its last
    carriage return left it (a progress bar's final state)."""
    lines = _ANSI.sub("", text).split("\n")
    return "\n".join(line.rsplit("\r", 1)[-1] for line in lines)


def _output_html(output: Any, n: int) -> tuple[str, bool]:
    """One stored output as HTML; whether it is a plotly figure."""
    kind = output.output_type
    if kind == "stream":
        text = _terminal_text(_text(output.text))
        if not text.strip():
            return "", False
        cls = "nb-stderr" if output.name == "stderr" else "nb-stdout"
        return _pre(text.strip("\n"), cls), False
    if kind == "error":
        return _pre("\n".join(output.traceback), "nb-error"), False
    if kind in ("execute_result", "display_data"):
        return _data_html(output.data, n)
    return "", False


def _merged_streams(outputs: list[Any]) -> list[Any]:
    """Consecutive outputs of one stream (stdout or stderr) as one."""
    merged: list[Any] = []
    for output in outputs:
        last = merged[-1] if merged else None
        if (
            last is not None
            and output.output_type == "stream"
            and last.output_type == "stream"
            and last.name == output.name
        ):
            merged[-1] = {**last, "text": _text(last.text) + _text(output.text)}
            merged[-1] = type(output)(merged[-1])
        else:
            merged.append(output)
    return merged


def notebook_markdown(nb: Any) -> tuple[str, list[str], bool]:
    """The markdown of a notebook page, its outputs' HTML (one per placeholder), and whether it
    draws a plotly figure."""
    parts: list[str] = []
    outputs: list[str] = []
    needs_plotly = False
    for cell in nb.cells:
        if cell.cell_type == "markdown":
            parts.append(_NB_LINK.sub(r"\1.md\2", cell.source))
        elif cell.cell_type == "code" and cell.source.strip():
            parts.append(f"```python\n{cell.source.rstrip()}\n```")
            for output in _merged_streams(cell.get("outputs", [])):
                block, is_plot = _output_html(output, len(outputs))
                if block:
                    needs_plotly |= is_plot
                    parts.append(_PLACEHOLDER.format(len(outputs)))
                    outputs.append(block)
    return "\n\n".join(parts) + "\n", outputs, needs_plotly


def _with_download(markdown: str, name: str) -> str:
    """The page's markdown with a line under its title that offers the notebook itself."""
    note = (
        f"*This page is the notebook `docs/{TUTORIALS}/{name}` with its stored outputs: "
        f"[download it]({name}) to run it yourself.*\n"
    )
    if re.match(r"#\s", markdown):
        return re.sub(r"^(#\s.*\n)", lambda m: m.group(1) + "\n" + note, markdown, count=1)
    return note + "\n" + markdown


def on_files(files: Files, config: Any, **kwargs: Any) -> Files:
    """Add a generated markdown page beside each tutorial notebook (which stays in the site, to be
    downloaded)."""
    for file in list(files):
        uri = file.src_uri
        if not (uri.startswith(f"{TUTORIALS}/") and uri.endswith(".ipynb")):
            continue
        nb = nbformat.read(file.abs_src_path, as_version=4)
        markdown, outputs, needs_plotly = notebook_markdown(nb)
        markdown = _with_download(markdown, uri.rsplit("/", 1)[-1])
        md_uri = uri[: -len(".ipynb")] + ".md"
        _outputs[md_uri] = outputs
        if needs_plotly:
            _needs_plotly.add(md_uri)
        files.append(File.generated(config, md_uri, content=markdown))
    return files


# math as pymdownx.arithmatex writes it in generic mode: \(inline\) in a span, \[display\] in a div
_MATH = re.compile(r'<(span|div) class="arithmatex">\s*\\[(\[](.*?)\\[)\]]\s*</\1>', re.S)
log = logging.getLogger("mkdocs.plugins.ropelens")


def _mathml(m: re.Match[str]) -> str:
    """One formula as MathML, which the browser draws itself: no script, nothing fetched."""
    from latex2mathml.converter import convert

    tag, latex = m.group(1), html.unescape(m.group(2)).strip()
    try:
        mathml = convert(latex, display="block" if tag == "div" else "inline")
    except Exception as e:  # a formula latex2mathml cannot read: a warning fails --strict
        log.warning("formula %r could not be converted to MathML: %s", latex, e)
        return m.group(0)
    return f'<{tag} class="arithmatex">{mathml}</{tag}>'


# reST roles and literal-block markers some docstrings use, as rendered: shown as plain code
_REST_ROLE = re.compile(r":(?:func|class|meth|mod|data|attr|exc|obj|const):(?=<code>)")
_REST_LITERAL = re.compile(r"::(</p>)")


def on_page_content(html_text: str, page: Any, config: Any, **kwargs: Any) -> str:
    """Put each notebook output in place of its placeholder paragraph; load plotly.js first on a
    page that draws a figure. On an API page, drop the reST role names in front of code. Formulas
    become MathML."""
    uri = page.file.src_uri
    html_text = _MATH.sub(_mathml, html_text)
    if uri.startswith("api/"):
        return _REST_LITERAL.sub(r":\1", _REST_ROLE.sub("", html_text))
    outputs = _outputs.get(uri)
    if outputs is None:
        return html_text
    html_text = _PLACEHOLDER_HTML.sub(lambda m: outputs[int(m.group(1))], html_text)
    if uri in _needs_plotly:
        src = get_relative_url(PLOTLY_JS, page.file.url)
        html_text = f'<script src="{src}"></script>\n' + html_text
    return html_text


def _shadowed(module_name: str) -> list[str]:
    """The names in a module's ``__all__`` that are functions named after a submodule (``from
    .frequency_usage import frequency_usage``): a static reader sees the submodule there, so the
    reference names the function by its full path."""
    module = importlib.import_module(module_name)
    if not hasattr(module, "__path__"):  # a module, not a package: no submodules
        return []
    return [
        name
        for name in getattr(module, "__all__", ())
        if callable(getattr(module, name, None))
        and not isinstance(getattr(module, name), type)
        and importlib.util.find_spec(f"{module_name}.{name}") is not None
    ]


def on_page_markdown(markdown: str, page: Any, config: Any, **kwargs: Any) -> str:
    """On an API page, follow ``::: MODULE`` by the functions the module exports under the name of
    one of its submodules."""
    if not page.file.src_uri.startswith("api/"):
        return markdown

    def expand(m: re.Match[str]) -> str:
        names = _shadowed(m.group(1))
        if not names:
            return m.group(0)
        blocks = [
            f"::: {m.group(1)}.{name}.{name}\n"
            "    options:\n      show_root_full_path: false\n      heading_level: 3"
            for name in names
        ]
        return m.group(0) + "\n\n## Analysis functions\n\n" + "\n\n".join(blocks) + "\n"

    return re.sub(r"^::: ([\w.]+)[ \t]*$", expand, markdown, flags=re.M)


def on_post_build(config: Any, **kwargs: Any) -> None:
    """Copy the installed plotly package's plotly.min.js into the site, once."""
    import plotly

    source = Path(plotly.__file__).parent / "package_data" / "plotly.min.js"
    target = Path(config["site_dir"]) / PLOTLY_JS
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(source, target)
