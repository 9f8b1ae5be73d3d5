"""Every file the exporter writes is what its suffix says, of the size asked for, or nothing is
written: a PNG larger than the browser draws is refused before it starts, with the limit; bytes
that are not the format asked for are refused; a PDF carries the figure's title.

The PDF's title is read back by following its last cross-reference section, with the standard
library alone.
"""

from __future__ import annotations

import re
import struct

import plotly.graph_objects as go
import pytest

from ropelens.errors import ExportUnavailableError, InputError
from ropelens.plots import export
from ropelens.plots.export import (
    PNG_MAX_PIXELS,
    PNG_MAX_SIDE,
    export_unavailable,
    write_figure,
    write_figures,
)

needs_browser = pytest.mark.skipif(
    export_unavailable() is not None, reason=str(export_unavailable())
)


def _figure(title: str | None = "Band energy — δ by layer") -> go.Figure:
    layout = {"title": {"text": title}} if title is not None else {}
    return go.Figure(go.Scatter(x=[1, 2, 3], y=[1, 3, 2]), layout=layout)


def pdf_title(data: bytes) -> str:
    """The document title: the last ``startxref`` → its cross-reference section → the trailer's
    ``/Info`` object → its ``/Title`` (a UTF-16 hex string or a literal one)."""
    start = int(re.findall(rb"startxref\s+(\d+)\s+%%EOF", data)[-1])
    section = data[start:]
    assert section.startswith(b"xref"), "startxref points at a cross-reference section"
    trailer = section[section.index(b"trailer") :]
    info = int(re.search(rb"/Info\s+(\d+)\s+0\s+R", trailer).group(1))
    offsets = {}
    for first, count, rows in re.findall(rb"(\d+) (\d+)\n((?:\d{10} \d{5} [nf] \n)+)", section):
        for i in range(int(count)):
            row = rows[20 * i : 20 * i + 20]
            offsets[int(first) + i] = int(row[:10])
    at = offsets[info]
    assert data[at:].startswith(b"%d 0 obj" % info), "the offset points at the object"
    body = data[at : data.index(b"endobj", at)]
    hexed = re.search(rb"/Title\s*<([0-9A-Fa-f]+)>", body)
    if hexed is not None:
        raw = bytes.fromhex(hexed.group(1).decode())
        assert raw[:2] == b"\xfe\xff", "a UTF-16BE string opens with its byte-order mark"
        return raw[2:].decode("utf-16-be")
    return re.search(rb"/Title\s*\(((?:\\.|[^\\)])*)\)", body).group(1).decode("latin-1")


@pytest.mark.parametrize(
    ("width", "height", "scale", "pixels"),
    [
        (16_000, 16_000, None, "32,000 × 32,000"),  # the default PNG scale doubles each side
        (40_000, 100, 2, "80,000 × 200"),  # a side over the limit
        (8_193, 8_192, 2, "16,386 × 16,384"),  # a pixel count just over the limit
    ],
)
def test_a_png_larger_than_the_browser_draws_is_refused_before_it_starts(
    tmp_path, monkeypatch, width, height, scale, pixels
):
    def never(*_):
        raise AssertionError("the browser was started")

    monkeypatch.setattr(export, "_run", never)
    path = tmp_path / "wide.png"
    with pytest.raises(InputError) as caught:
        write_figure(_figure(), path, width=width, height=height, scale=scale)
    message = str(caught.value)
    assert message.startswith(f"{path}: a PNG of {pixels} pixels")
    assert f"{PNG_MAX_SIDE:,} pixels a side and {PNG_MAX_PIXELS:,} in all" in message
    assert not path.exists()


def test_the_limits_are_chromiums_canvas():
    """65,535 pixels a side, 16,384² in all (the sizes at which the browser's PNG went from an
    image to 3 bytes: 65,535 × 100 and 16,384 × 16,384 drew, 65,536 × 100 and 16,385 × 16,384
    did not)."""
    assert PNG_MAX_SIDE == 2**16 - 1
    assert PNG_MAX_PIXELS == 2**28


@pytest.mark.parametrize(
    ("name", "returned"),
    [
        ("fig.png", b"u\xabZ"),  # what the browser gives for a canvas it cannot draw
        ("fig.png", b"\x89PNG\r\n\x1a\n" + b"\0\0\0\rIHDR" + struct.pack(">II", 9, 9) + b"\0" * 60),
        ("fig.pdf", b"<html>error</html>"),
        ("fig.svg", b"%PDF-1.4"),
    ],
)
def test_bytes_that_are_not_the_file_asked_for_are_refused_and_nothing_is_written(
    tmp_path, monkeypatch, name, returned
):
    monkeypatch.setattr(export, "export_unavailable", lambda: None)
    monkeypatch.setattr(export, "find_browser", lambda: "/usr/bin/chromium")
    svg = b'<svg xmlns="http://www.w3.org/2000/svg" width="300" height="200"></svg>'
    monkeypatch.setattr(export, "_run", lambda jobs, browser: [svg, returned])
    good, bad = tmp_path / "first.svg", tmp_path / name
    with pytest.raises(ExportUnavailableError) as caught:
        write_figures([(_figure(), good), (_figure(), bad)], width=300, height=200)
    assert str(caught.value).startswith(f"{bad}: the exporter returned {len(returned):,} bytes")
    assert "nothing was written" in str(caught.value)
    assert list(tmp_path.iterdir()) == []  # the good SVG neither: all are checked first


@needs_browser
def test_a_pdf_is_titled_with_its_figure_and_a_wide_png_is_an_image(tmp_path):
    titled, untitled, wide = tmp_path / "t.pdf", tmp_path / "loss-curve.pdf", tmp_path / "w.png"
    write_figures([(_figure(), titled), (_figure(None), untitled)])
    write_figure(_figure(), wide, width=16_000, height=200, scale=1)
    for path in (titled, untitled):
        data = path.read_bytes()
        assert data.startswith(b"%PDF-") and data.rstrip().endswith(b"%%EOF")
        assert len(re.findall(rb"/Type\s*/Page(?![a-zA-Z])", data)) == 1
    assert pdf_title(titled.read_bytes()) == "Band energy — δ by layer"
    assert pdf_title(untitled.read_bytes()) == "loss-curve"  # no title: the file's name
    png = wide.read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    assert struct.unpack(">II", png[16:24]) == (16_000, 200)
    assert len(png) > 1000
