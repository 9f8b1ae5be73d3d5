"""Every figure the report draws, read back from its plotly data: log-axis ticks carry their decade,
no two legend entries share a colour, heads read ``L1.H3``, and the page says its settings in
words (no command-line spec such as ``quantiles:<=4`` outside the provenance record)."""

from __future__ import annotations

import html
import math
import re
from pathlib import Path

import plotly.graph_objects as go
import pytest

from ropelens.plots.style import log_tick_label, log_ticks
from ropelens.report import build_report
from ropelens.report.html import collecting_figures

N_CTX = 64
SUPERSCRIPT = str.maketrans("⁻⁰¹²³⁴⁵⁶⁷⁸⁹", "-0123456789")
SPEC = re.compile(r"\b(quantiles|wavelength|context|explicit):\S|\bm ≥ \d")


@pytest.fixture(scope="module")
def drawn(tiny, tmp_path_factory) -> tuple[Path, list[go.Figure]]:
    """The report on the tiny Llama and every figure it laid out, in page order."""
    out = tmp_path_factory.mktemp("report") / "out"
    with collecting_figures() as figures:
        build_report(tiny("llama"), tokens=4 * N_CTX, n_ctx=N_CTX, out=out, progress=False)
    return out, list(figures)


def label_value(label: str) -> float:
    """The number a tick label prints: ``0.02``, ``200``, ``10⁻⁴``, ``2×10⁵``."""
    if not any(c in label for c in "⁻⁰¹²³⁴⁵⁶⁷⁸⁹"):
        return float(label)
    mantissa, _, power = label.rpartition("×")
    assert power.startswith("10"), label
    return float(mantissa or 1) * 10.0 ** int(power[2:].translate(SUPERSCRIPT))


@pytest.mark.parametrize(
    ("value", "label"),
    [(200.0, "200"), (0.02, "0.02"), (1e-4, "10⁻⁴"), (2e5, "2×10⁵"), (1.0, "1"), (1e4, "10000"),
     (0.001, "0.001"), (5e-7, "5×10⁻⁷")],
)  # fmt: skip
def test_a_log_tick_label_carries_its_decade(value, label):
    assert log_tick_label(value) == label
    assert label_value(label) == pytest.approx(value, rel=1e-12)


def test_log_ticks_label_decades_or_one_two_five():
    major, minor = log_ticks(0.004, 0.9)  # over two decades: decades, 2…9 unlabelled between
    assert major == pytest.approx([0.01, 0.1])
    assert minor == pytest.approx([m * 10.0**k for k in (-3, -2, -1) for m in range(2, 10)][2:])
    assert log_ticks(120, 2000)[0] == pytest.approx([200, 500, 1000, 2000])  # under two: 1, 2, 5
    assert log_ticks(15, 40)[0] == pytest.approx([20, 30, 40])  # under one: 1…9
    assert log_ticks(2.0, 2.5) == ([], [])  # too narrow: plotly's own full numbers


def log_axes(fig: go.Figure) -> list:
    return [a for a in [*fig.select_xaxes(), *fig.select_yaxes()] if a.type == "log"]


def test_every_log_tick_of_the_report_carries_its_decade(drawn):
    _, figures = drawn
    axes = [(fig, a) for fig in figures for a in log_axes(fig)]
    assert axes, "the report draws no log axis"
    for fig, axis in axes:
        where = f"{fig.layout.title.text!r} {axis.plotly_name}"
        if axis.tickvals is None:  # under a decade: plotly prints full numbers, never SI prefixes
            assert axis.exponentformat == "power", where
            continue
        assert len(axis.tickvals) == len(axis.ticktext) >= 2, where
        for value, label in zip(axis.tickvals, axis.ticktext, strict=True):
            if label == "0" and value < 1:  # attention by distance draws δ = 0 at 0.5
                continue
            assert label_value(label) == pytest.approx(value, rel=1e-9), (where, value, label)
        assert all(math.log10(v) % 1 != 0 for v in axis.minor.tickvals or ()), where


def legend_colours(fig: go.Figure) -> dict[str, str]:
    """Legend entry name → the colour it is drawn in (its own, else the template's colour cycle)."""
    cycle = list(fig.layout.colorway or fig.layout.template.layout.colorway or [])
    shown = {}
    for i, trace in enumerate(fig.data):
        if trace.showlegend is False or not trace.name or trace.type in ("heatmap", "contour"):
            continue
        marker, line = getattr(trace, "marker", None), getattr(trace, "line", None)
        colour = next(
            (c for c in (marker and marker.color, line and line.color) if isinstance(c, str)),
            cycle[i % len(cycle)] if cycle else None,
        )
        shown.setdefault(trace.name, str(colour).lower())
    return shown


def test_no_two_legend_entries_of_a_figure_share_a_colour(drawn):
    _, figures = drawn
    checked = 0
    for fig in figures:
        shown = legend_colours(fig)
        if len(shown) < 2:
            continue
        checked += 1
        by_colour: dict[str, list[str]] = {}
        for name, colour in shown.items():
            by_colour.setdefault(colour, []).append(name)
        shared = {c: names for c, names in by_colour.items() if len(names) > 1}
        assert shared == {}, (fig.layout.title.text, shared)
    assert checked >= 3


def test_heads_read_as_layer_and_head(drawn):
    """A head is ``L1.H3`` on every axis and hover text: never ``1.3``, which reads as a number."""
    _, figures = drawn
    heads = 0
    for fig in figures:
        for trace in fig.data:
            for dim in ("x", "y", "text"):
                values = getattr(trace, dim, None)
                if values is None or isinstance(values, str):
                    continue
                labels = [v for v in values if isinstance(v, str)]
                assert not any(re.fullmatch(r"\d+\.\d+", v) for v in labels), (trace.name, dim)
                heads += sum(bool(re.match(r"L\d+\.H\d+\b", v)) for v in labels)
    assert heads >= 8  # the head taxonomy's heatmap rows and scatter points


def test_the_page_says_its_settings_in_words(drawn):
    out, figures = drawn
    page = (out / "index.html").read_text(encoding="utf-8")
    body = re.sub(r"<(script|style|iframe)\b.*?</\1>", " ", page, flags=re.S)
    body = body.split('<section id="provenance">')[0]  # the record keeps the command-line forms
    text = html.unescape(re.sub(r"<[^>]+>", " ", body))
    assert "equal plane counts" in text
    assert SPEC.search(text) is None, SPEC.search(text)
    for fig in figures:
        words = [fig.layout.title.text or "", *(a.text or "" for a in fig.layout.annotations)]
        words += [a.title.text or "" for a in [*fig.select_xaxes(), *fig.select_yaxes()]]
        assert not any(SPEC.search(w) for w in words), words
