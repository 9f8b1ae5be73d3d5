"""Figures for papers: a ropelens figure written as PNG, SVG and PDF opens as what its suffix says.

The files are read back with the standard library alone: the PNG's header gives its pixel size, the
SVG parses as XML with an ``<svg>`` root of the page's size and the figure's axis titles in it, the
PDF starts with its signature and holds a page. Rendering needs kaleido and a Chromium-based
browser; where either is missing those tests skip, naming what is missing.
"""

from __future__ import annotations

import re
import struct
import sys
import xml.etree.ElementTree as ET

import pytest
import torch

from ropelens.analyses.frequency_usage import frequency_usage
from ropelens.errors import ExportUnavailableError, InputError
from ropelens.plots.export import (
    DEFAULT_WIDTH,
    FIGURE_FORMATS,
    PNG_SCALE,
    export_unavailable,
    write_figure,
    write_figures,
)

UNAVAILABLE = export_unavailable()
needs_browser = pytest.mark.skipif(UNAVAILABLE is not None, reason=str(UNAVAILABLE))


@pytest.fixture(scope="module")
def usage(tiny):
    """Frequency usage of a tiny GQA Llama on two random windows."""
    toks = torch.randint(4, 101, (2, 16), generator=torch.Generator().manual_seed(0))
    toks[:, 0] = 1
    return frequency_usage(tiny("llama-gqa"), toks, progress=False)


def png_size(data: bytes) -> tuple[int, int]:
    """(width, height) in pixels from a PNG's signature and IHDR chunk."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG signature"
    assert data[12:16] == b"IHDR", "the first chunk of a PNG is IHDR"
    return struct.unpack(">II", data[16:24])


def svg_root(data: bytes) -> ET.Element:
    """The parsed SVG's root element (XML that does not parse raises here)."""
    root = ET.fromstring(data)
    assert root.tag.rsplit("}", 1)[-1] == "svg", f"root element is {root.tag!r}"
    return root


def pdf_pages(data: bytes) -> int:
    """The number of page objects (``/Type /Page``, not ``/Pages``) in a PDF."""
    assert data.startswith(b"%PDF-"), "not a PDF signature"
    return len(re.findall(rb"/Type\s*/Page(?![a-zA-Z])", data))


@needs_browser
def test_one_figure_as_png_svg_and_pdf(usage, tmp_path):
    fig = usage.figure()
    width, height = 640, 360
    paths = [tmp_path / f"usage.{fmt}" for fmt in FIGURE_FORMATS]
    written = write_figures([(fig, p) for p in paths], width=width, height=height)
    assert written == paths

    png, svg, pdf = (p.read_bytes() for p in paths)
    assert png_size(png) == (width * PNG_SCALE, height * PNG_SCALE)

    root = svg_root(svg)
    assert (float(root.get("width")), float(root.get("height"))) == (width, height)
    texts = {t.strip() for t in root.itertext() if t.strip()}
    titles = {fig.layout.xaxis.title.text, fig.layout.yaxis.title.text} - {None}
    assert titles and titles <= texts, f"axis titles {titles} not among the SVG's texts"

    assert pdf_pages(pdf) == 1
    assert pdf.rstrip().endswith(b"%%EOF")
    # atomic writes leave no temporary file beside the figures
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(p.name for p in paths)


@needs_browser
def test_result_save_figure_draws_the_named_figure_at_its_own_size(usage, tmp_path):
    fig = usage.figure("no_sink", layer=1)
    path = usage.save_figure(tmp_path / "usage.png", None, "no_sink", layer=1, scale=1)
    assert path == tmp_path / "usage.png"
    expect = (fig.layout.width or DEFAULT_WIDTH, fig.layout.height)
    assert expect[1] is not None  # the usage figure sets its own height
    assert png_size(path.read_bytes()) == expect


@pytest.mark.parametrize("name", ["usage.jpg", "usage", "usage.PDF.txt"])
def test_another_suffix_is_refused_before_anything_is_written(usage, tmp_path, name):
    with pytest.raises(InputError, match=r"\.png, \.svg, \.pdf"):
        write_figure(usage.figure(), tmp_path / name)
    assert list(tmp_path.iterdir()) == []


def test_an_upper_case_suffix_names_its_format(usage, tmp_path, monkeypatch):
    # the suffix is read without case; the missing browser below stops it before rendering
    monkeypatch.setenv("BROWSER_PATH", str(tmp_path / "no-such-browser"))
    with pytest.raises(ExportUnavailableError):
        write_figure(usage.figure(), tmp_path / "usage.PDF")


def test_a_missing_browser_names_the_fix(usage, tmp_path, monkeypatch):
    missing = tmp_path / "no-such-browser"
    monkeypatch.setenv("BROWSER_PATH", str(missing))
    with pytest.raises(ExportUnavailableError, match="BROWSER_PATH") as err:
        write_figure(usage.figure(), tmp_path / "usage.svg")
    assert str(missing) in str(err.value) and "scripts/setup.sh --browser" in str(err.value)
    assert isinstance(err.value, InputError)  # the command line reports it as one line
    assert not (tmp_path / "usage.svg").exists()


def test_missing_kaleido_names_the_fix(usage, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "kaleido", None)  # import kaleido now raises ImportError
    with pytest.raises(ExportUnavailableError, match="kaleido") as err:
        write_figure(usage.figure(), tmp_path / "usage.png")
    assert "pip install kaleido" in str(err.value)


def test_something_else_than_a_figure_is_refused(tmp_path):
    with pytest.raises(InputError, match="plotly figure"):
        write_figure("not a figure", tmp_path / "x.png")


@needs_browser
def test_export_runs_inside_a_running_event_loop(usage, tmp_path):
    """Jupyter runs cells inside an event loop: export renders on a thread of its own."""
    import asyncio

    async def cell():
        return write_figure(usage.figure(), tmp_path / "usage.svg")

    path = asyncio.run(cell())
    assert svg_root(path.read_bytes()) is not None
