"""Figures for papers: any ropelens figure written as PNG, SVG or PDF.

Static export renders the figure in a headless Chromium-based browser through kaleido (a
dependency of ropelens), with the plotly.js that plotly ships and no MathJax, so nothing is fetched:
it works offline. The browser is the one ``BROWSER_PATH`` names, else the first Chrome or Chromium
found on ``PATH`` or in its usual place (Debian's ``/usr/bin/chromium``, which ``bash
scripts/setup.sh --browser`` installs). ::

    from ropelens.plots.export import write_figure
    write_figure(usage.figure(), "usage.pdf")

:func:`write_figures` writes several with one browser start (each start costs seconds).
"""

from __future__ import annotations

import asyncio
import html
import math
import os
import queue
import re
import struct
import threading
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import plotly.graph_objects as go
from plotly.basedatatypes import BaseTraceType

from ropelens.errors import ExportUnavailableError, InputError
from ropelens.results.serialize import atomic_write

__all__ = [
    "DEFAULT_HEIGHT",
    "DEFAULT_WIDTH",
    "FIGURE_FORMATS",
    "PNG_MAX_PIXELS",
    "PNG_MAX_SIDE",
    "PNG_SCALE",
    "export_unavailable",
    "find_browser",
    "write_figure",
    "write_figures",
]

FIGURE_FORMATS = ("png", "svg", "pdf")
# the page size of a figure that does not set its own (plotly's figures are as wide as their page)
DEFAULT_WIDTH, DEFAULT_HEIGHT = 900, 500
PNG_SCALE = 2  # PNG pixels per layout pixel: sharp in print; SVG and PDF are vector
# the largest PNG the browser draws (Chromium's canvas: at most 65,535 pixels a side and
# 16,384 × 16,384 in all); a larger one comes back as 3 bytes of nothing
PNG_MAX_SIDE = 65_535
PNG_MAX_PIXELS = 16_384 * 16_384
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
_SETUP_HINT = "run `bash scripts/setup.sh --browser` (Debian's chromium)"


def find_browser() -> str | None:
    """The browser export would use: ``BROWSER_PATH`` if set, else the first Chrome or Chromium
    on ``PATH`` or in its usual place; None if there is none (or kaleido is missing)."""
    named = os.environ.get("BROWSER_PATH")
    if named:
        return named if os.path.isfile(named) and os.access(named, os.X_OK) else None
    try:
        from choreographer.browsers.chromium import Chromium
    except ImportError:
        return None
    # skip_local: never a browser kaleido downloaded into its own cache, only an installed one
    return Chromium.find_browser(skip_local=True)


def export_unavailable() -> str | None:
    """Why static export cannot run here (the missing piece and the fix), or None if it can."""
    try:
        import kaleido  # noqa: F401
    except ImportError:
        return (
            "static figure export needs the kaleido package, which is not installed: pip install "
            "kaleido (or run `bash scripts/setup.sh`, which installs the tested version)"
        )
    if find_browser() is None:
        named = os.environ.get("BROWSER_PATH")
        where = (
            f"BROWSER_PATH={named!r} is not an executable file"
            if named
            else "no Chrome or Chromium was found on PATH or in /usr/bin"
        )
        return (
            f"static figure export renders in a headless Chromium-based browser, and {where}: "
            f"{_SETUP_HINT}, or set BROWSER_PATH to a Chrome or Chromium executable"
        )
    return None


def _format_of(path: Path) -> str:
    fmt = path.suffix.lower().lstrip(".")
    if fmt not in FIGURE_FORMATS:
        raise InputError(
            f"{path}: cannot write a figure as {path.suffix or 'a file without a suffix'!r}; "
            f"name it with one of {', '.join('.' + f for f in FIGURE_FORMATS)}"
        )
    return fmt


def _options(fig: go.Figure, fmt: str, width: int | None, height: int | None, scale: float | None):
    """kaleido's page options: the figure's own size unless given, PNG at :data:`PNG_SCALE`."""
    for name, value in (("width", width), ("height", height), ("scale", scale)):
        if value is not None and not (isinstance(value, int | float) and value > 0):
            raise InputError(f"{name} must be a positive number, got {value!r}")
    return {
        "format": fmt,
        "width": int(width or fig.layout.width or DEFAULT_WIDTH),
        "height": int(height or fig.layout.height or DEFAULT_HEIGHT),
        "scale": float(scale or (PNG_SCALE if fmt == "png" else 1)),
    }


def _png_pixels(opts: dict[str, Any]) -> tuple[int, int]:
    """(width, height) in pixels of the PNG kaleido draws with ``opts`` (the browser rounds
    down: 333 × 1.5 is 499 pixels)."""
    return math.floor(opts["width"] * opts["scale"]), math.floor(opts["height"] * opts["scale"])


def _check_png_size(path: Path, opts: dict[str, Any]) -> None:
    """Refuse a PNG larger than the browser draws (:data:`PNG_MAX_SIDE`, :data:`PNG_MAX_PIXELS`)
    before it starts, naming the size asked for and the limits."""
    width, height = _png_pixels(opts)
    if max(width, height) > PNG_MAX_SIDE or width * height > PNG_MAX_PIXELS:
        raise InputError(
            f"{path}: a PNG of {width:,} × {height:,} pixels ({opts['width']:,} × "
            f"{opts['height']:,} at scale {opts['scale']:g}) is larger than the exporter can "
            f"draw: at most {PNG_MAX_SIDE:,} pixels a side and {PNG_MAX_PIXELS:,} in all "
            "(16,384 × 16,384); lower width, height or scale, or write an SVG or PDF"
        )


def _check_rendered(path: Path, data: bytes, opts: dict[str, Any]) -> None:
    """Refuse bytes that are not the file asked for: a PNG opens with the PNG signature and an
    IHDR of the size asked for, an SVG with its ``<svg`` (or XML declaration), a PDF with
    ``%PDF-`` and ends with ``%%EOF``."""
    fmt = opts["format"]
    head = data[:16]
    if fmt == "png":
        ok = data[:8] == PNG_SIGNATURE and data[12:16] == b"IHDR" and len(data) > 64
        if ok:
            got = struct.unpack(">II", data[16:24])
            want = _png_pixels(opts)
            ok = all(abs(g - w) <= 1 for g, w in zip(got, want))
    elif fmt == "svg":
        ok = data.lstrip(b"\xef\xbb\xbf \t\r\n").startswith((b"<svg", b"<?xml"))
    else:
        ok = data.startswith(b"%PDF-") and data.rstrip().endswith(b"%%EOF")
    if not ok:
        raise ExportUnavailableError(
            f"{path}: the exporter returned {len(data):,} bytes that are not a {fmt.upper()} of "
            f"the size asked for (they start {head!r}), so nothing was written; try a smaller "
            "width, height or scale"
        )


def _figure_title(fig: go.Figure, path: Path) -> str:
    """The figure's title as plain text (its HTML tags and entities removed), else the file's
    name without its suffix."""
    text = fig.layout.title.text if fig.layout.title is not None else None
    plain = html.unescape(re.sub(r"<[^>]*>", " ", text or ""))
    plain = " ".join(plain.split())
    return plain or path.stem


def _titled_pdf(data: bytes, title: str) -> bytes:
    """The PDF ``data`` with its document title set to ``title``, by an incremental update (a new
    document information object and cross-reference section appended, as the PDF format allows):
    the browser titles every page it prints after its own page, "Kaleido-fier"."""
    trailer_at = data.rfind(b"trailer")
    start_at = data.rfind(b"startxref")
    if trailer_at < 0 or start_at < trailer_at:
        return data  # a cross-reference stream: left as the browser wrote it
    trailer = data[trailer_at:start_at]
    size = re.search(rb"/Size\s+(\d+)", trailer)
    root = re.search(rb"/Root\s+(\d+\s+\d+\s+R)", trailer)
    info = re.search(rb"/Info\s+(\d+)\s+(\d+)\s+R", trailer)
    previous = re.search(rb"startxref\s+(\d+)", data[start_at:])
    if size is None or root is None or previous is None:
        return data
    entries = b""
    if info is not None:  # keep what the browser recorded besides the title
        body = re.search(
            rb"\n" + info.group(1) + rb"\s+" + info.group(2) + rb"\s+obj\s*<<(.*?)>>\s*endobj",
            data,
            re.S,
        )
        if body is not None:
            entries = re.sub(rb"/Title\s*(\((?:\\.|[^\\)])*\)|<[0-9A-Fa-f]*>)", b"", body.group(1))
    number = int(info.group(1)) if info is not None else int(size.group(1))
    encoded = b"<FEFF" + title.encode("utf-16-be").hex().upper().encode() + b">"
    obj_at = len(data) + 1
    update = b"\n%d 0 obj\n<</Title %s\n%s>>\nendobj\n" % (number, encoded, entries.strip())
    xref_at = obj_at + len(update) - 1
    new_size = max(int(size.group(1)), number + 1)
    update += (
        b"xref\n0 1\n0000000000 65535 f \n%d 1\n%010d 00000 n \n" % (number, obj_at)
        + b"trailer\n<</Size %d\n/Root %s\n/Info %d 0 R\n/Prev %d>>\n"
        % (new_size, root.group(1), number, int(previous.group(1)))
        + b"startxref\n%d\n%%%%EOF\n" % xref_at
    )
    return data + update


def _as_figure(fig: Any) -> go.Figure:
    """A figure from a figure, its dict, or a trace (or list of traces) a drawing method returns."""
    if isinstance(fig, go.Figure):
        return fig
    if isinstance(fig, dict):
        return go.Figure(fig)
    traces = fig if isinstance(fig, list | tuple) else [fig]
    if traces and all(isinstance(t, BaseTraceType) for t in traces):
        return go.Figure(list(traces))
    raise InputError(
        f"write_figure takes a plotly figure (e.g. result.figure()), got {type(fig).__name__}"
    )


async def _render(jobs: list[tuple[dict[str, Any], dict[str, Any]]], browser: str) -> list[bytes]:
    """Each (figure dict, options) rendered to bytes, in one browser session."""
    import kaleido

    out = []
    # mathjax False: ropelens figures use no LaTeX, and the default is a script from the network
    async with kaleido.Kaleido(n=1, mathjax=False, path=browser) as k:
        for fig, opts in jobs:
            out.append(await k.calc_fig(fig, opts=opts))
    return out


def _run(jobs: list[tuple[dict[str, Any], dict[str, Any]]], browser: str) -> list[bytes]:
    """:func:`_render` on a thread of its own, so that it runs from Jupyter's event loop too."""
    box: queue.Queue[Any] = queue.Queue(maxsize=1)

    def target() -> None:
        try:
            box.put(asyncio.run(_render(jobs, browser)))
        except BaseException as e:  # handed to the caller's thread below
            box.put(e)

    thread = threading.Thread(target=target, name="ropelens-export")
    thread.start()
    thread.join()
    result = box.get()
    if isinstance(result, BaseException):
        raise result
    return result


def write_figures(
    figures: Iterable[tuple[Any, str | os.PathLike[str]]],
    *,
    width: int | None = None,
    height: int | None = None,
    scale: float | None = None,
) -> list[Path]:
    """Write each ``(figure, path)`` as its path's suffix says (``.png``, ``.svg``, ``.pdf``), all
    in one browser session; returns the paths written.

    Each file is written atomically, and only once every rendered file has been checked to be
    what its suffix says (a PNG's signature and pixel size, an SVG's ``<svg``, a PDF's ``%PDF-``
    and ``%%EOF``); a PDF's document title is the figure's title (else the file's name).
    ``width`` and ``height`` (layout pixels) default to the figure's own, else
    :data:`DEFAULT_WIDTH` × :data:`DEFAULT_HEIGHT`; ``scale`` multiplies a PNG's pixels (default
    :data:`PNG_SCALE`). Raises :class:`~ropelens.errors.InputError` for another suffix or a PNG
    larger than the browser draws (:data:`PNG_MAX_SIDE` a side, :data:`PNG_MAX_PIXELS` in all),
    before the browser starts, and :class:`~ropelens.errors.ExportUnavailableError` (naming the
    fix) where kaleido or a browser is missing or what it returned is not the file asked for.
    """
    jobs, paths, titles = [], [], []
    for fig, path in figures:
        path = Path(path)
        figure = _as_figure(fig)
        opts = _options(figure, _format_of(path), width, height, scale)
        if opts["format"] == "png":
            _check_png_size(path, opts)
        jobs.append((figure.to_dict(), opts))
        paths.append(path)
        titles.append(_figure_title(figure, path))
    if not jobs:
        return []
    why = export_unavailable()
    if why is not None:
        raise ExportUnavailableError(why)
    rendered = _run(jobs, str(find_browser()))
    for path, data, (_, opts) in zip(paths, rendered, jobs, strict=True):
        _check_rendered(path, data, opts)  # every file checked before any is written
    for path, data, (_, opts), title in zip(paths, rendered, jobs, titles, strict=True):
        if opts["format"] == "pdf":
            data = _titled_pdf(data, title)
        with atomic_write(path, "wb") as f:
            f.write(data)
    return paths


def write_figure(
    fig: Any,
    path: str | os.PathLike[str],
    *,
    width: int | None = None,
    height: int | None = None,
    scale: float | None = None,
) -> Path:
    """Write a plotly figure as the suffix of ``path`` says: ``.png``, ``.svg`` or ``.pdf``
    (atomically); returns the path. See :func:`write_figures` for the options and errors."""
    (written,) = write_figures([(fig, path)], width=width, height=height, scale=scale)
    return written
