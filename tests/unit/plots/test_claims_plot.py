"""The claims forest plot: its points and bars are the result's (and the Markdown table's) numbers,
the verdict is written and coloured, no two legend entries share a colour, and each panel's axis
names its metric."""

from __future__ import annotations

import math
import re

import pytest

from ropelens.claims.markdown import claims_markdown
from ropelens.claims.result import ClaimsResult
from ropelens.plots.claims import (
    CLAIMED_SET,
    VERDICT_COLORS,
    claims_figure,
    control_color,
    x_axis_title,
)
from ropelens.plots.export import export_unavailable, write_figure
from ropelens.results.provenance import Provenance
from tests.unit.claims.test_markdown import made_up_result, table_rows


def _points(fig) -> dict[tuple[str, str], tuple[float, float, float, str]]:
    """(claim, y category) -> (x, lower end, upper end, colour) of every drawn point, the claim
    read from the trace's hover text."""
    out = {}
    for trace in fig.data:
        claim = re.match(r"<b>([^<]+)</b>", trace.hovertemplate)[1]
        x = trace.x[0]
        above, below = trace.error_x.array[0], trace.error_x.arrayminus[0]
        out[(claim, trace.y[0])] = (x, x - below, x + above, trace.marker.color)
    return out


def _same(a: float, b: float) -> bool:
    return (math.isnan(a) and math.isnan(b)) or a == pytest.approx(b, rel=1e-12, abs=1e-15)


def test_points_are_the_results_effects_and_intervals():
    result = made_up_result()
    points = _points(claims_figure(result))
    drawn = [r for r in result.rows if math.isfinite(r.effect)]
    assert len(points) == sum(1 + len(r.controls) for r in drawn)
    for row in drawn:
        x, lo, hi, color = points[(row.name, CLAIMED_SET)]
        assert _same(x, row.effect) and _same(lo, row.lo) and _same(hi, row.hi)
        assert color == VERDICT_COLORS[row.verdict]
    controls = result.controls_frame()
    for c in controls.itertuples():
        x, lo, hi, _ = points[(c.claim, c.control)]
        assert _same(x, c.effect) and _same(lo, c.lo) and _same(hi, c.hi)


def test_points_match_the_markdown_tables_effects():
    result = made_up_result()
    points = _points(claims_figure(result))
    header, _, *rows = table_rows(claims_markdown(result))
    for cells in rows:
        shown = dict(zip(header, cells, strict=True))
        numbers = re.findall(r"[-+]?\d+(?:\.\d+)?", shown["effect [95% CI]"])
        if not numbers:  # nothing measured: nothing drawn
            assert (shown["claim"], CLAIMED_SET) not in points
            continue
        x, lo, hi, _ = points[(shown["claim"], CLAIMED_SET)]
        drawn = [x] + ([lo, hi] if len(numbers) == 3 else [])
        assert [float(f"{v:.3g}") for v in drawn] == [float(n) for n in numbers]


def test_verdicts_are_written_in_each_panels_title_in_their_colour():
    result = made_up_result()
    fig = claims_figure(result)
    titles = [a.text for a in fig.layout.annotations if a.text.startswith("<b>")]
    assert len(titles) == len(result.rows)
    for row, title in zip(result.rows, titles, strict=True):
        assert f"<b>{row.name}</b>" in title
        assert f'color:{VERDICT_COLORS[row.verdict]}"><b>{row.verdict}</b>' in title
    written = [a.text for a in fig.layout.annotations if not a.text.startswith("<b>")]
    assert written == ["not applicable: the model has no local layers"]  # the one undrawn claim


def test_no_two_legend_entries_share_a_colour():
    fig = claims_figure(made_up_result())
    entries = [(t.name, t.marker.color) for t in fig.data if t.showlegend is not False]
    names = [n for n, _ in entries]
    colors = [c for _, c in entries]
    assert len(set(names)) == len(names) == 6  # 3 verdicts drawn and 3 controls
    assert len(set(colors)) == len(colors)
    # every trace of a legend entry has that entry's colour
    by_name = dict(entries)
    assert all(t.marker.color == by_name[t.name] for t in fig.data)


def test_each_panel_is_labelled_with_its_metric():
    result = made_up_result()
    fig = claims_figure(result)
    drawn = [r for r in result.rows if math.isfinite(r.effect)]
    titles = [
        fig.layout[f"xaxis{'' if i == 1 else i}"].title.text
        for i, r in enumerate(result.rows, start=1)
        if math.isfinite(r.effect)
    ]
    assert titles == [x_axis_title(r) for r in drawn]
    assert titles[0] == "Δ positional probe (unmodified: 0.613)"
    assert titles[2] == "low-band energy share"  # a descriptive claim: the statistic itself


def test_an_empty_result_draws_a_note():
    empty = ClaimsResult(rows=(), budget="quick", alpha=0.05, provenance=Provenance(model="m"))
    fig = claims_figure(empty)
    assert not fig.data and fig.layout.annotations[0].text == "no claims in this result"


def test_renders_as_png(tmp_path):
    why = export_unavailable()
    if why is not None:
        pytest.skip(why)
    path = write_figure(claims_figure(made_up_result()), tmp_path / "claims.png")
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")
    assert width > 0 and height > width  # one panel per claim, stacked


def test_result_draws_itself_with_the_forest_plot():
    result = made_up_result()
    drawn, direct = result.figure(), claims_figure(result)
    assert [t.x for t in drawn.data] == [t.x for t in direct.data]
    assert drawn.layout.title.text == direct.layout.title.text


def test_colours_stay_distinct_past_the_palette():
    colors = [control_color(i) for i in range(40)] + list(VERDICT_COLORS.values())
    assert len(set(colors)) == len(colors)
