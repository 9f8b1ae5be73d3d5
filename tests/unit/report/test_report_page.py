"""The report's page: sentences that read cleanly at edge values, folded tables with readable column
names, the finding cards' charts, the summary figure's numbers, and the band mixer's place."""

from __future__ import annotations

import html
import json
import re

import pandas as pd
import pytest
import torch

import ropelens.report.build as build_module
import ropelens.report.mixer as mixer_module
from ropelens.analyses.attention_by_distance import _shape_counts
from ropelens.analyses.attention_sinks import _layer_range, _sink_count
from ropelens.errors import InputError
from ropelens.report import build_report
from ropelens.report.cards import CHARTS, card_bars, finding_card, spark_svg
from ropelens.report.html import column_label, table_html
from ropelens.report.summary import summary_rows
from ropelens.results.findings import (
    Finding,
    count_of,
    fixed,
    percent,
    shape_predicate,
    signed,
)

N_CTX = 64


# ---------------------------------------------------------------------------------- sentence parts
@pytest.mark.parametrize(
    ("x", "want"),
    [(0.0, "0.00"), (-0.0, "0.00"), (-0.004, "0.00"), (0.004, "0.00"), (-0.33, "−0.33"),
     (2.4331, "2.43"), (-1e-12, "0.00")],
)  # fmt: skip
def test_fixed_never_prints_negative_zero(x, want):
    assert fixed(x) == want


@pytest.mark.parametrize(
    ("x", "want"),
    [(0.0, "0.00 nats"), (-0.0, "0.00 nats"), (-0.00057, "0.00 nats"), (0.0049, "0.00 nats"),
     (0.005001, "+0.01 nats"), (2.4331, "+2.43 nats"), (-1.731, "−1.73 nats")],
)  # fmt: skip
def test_signed_changes_carry_a_sign_only_when_nonzero(x, want):
    assert signed(x, unit="nats") == want


def test_percent_of_shares():
    assert percent(0.537) == "54%"
    assert percent(0.0) == percent(-0.0) == percent(-1e-9) == "0%"
    assert percent(1.0) == "100%"


@pytest.mark.parametrize(
    ("n", "total", "want"),
    [(16, 30, "16 of 30 layers"), (30, 30, "all 30 layers"), (0, 30, "none of the 30 layers"),
     (1, 1, "the one layer"), (0, 1, "no layer"), (1, 2, "1 of 2 layers"),
     (1200, 2400, "1,200 of 2,400 layers")],
)  # fmt: skip
def test_count_of(n, total, want):
    assert count_of(n, total, "layer") == want


def test_shape_predicates_are_verbs_or_adjectives_never_both():
    for shape in ("flat", "decays", "grows", "U-shaped", "peaked", "oscillating"):
        one, many = shape_predicate(shape), shape_predicate(shape, plural=True)
        assert not re.search(r"\b(is|are) (decays|grows|oscillating|peaked)\b", one + " " + many)
    assert shape_predicate("decays") == "decays"
    assert shape_predicate("U-shaped") == "is U-shaped"
    assert shape_predicate("oscillating", plural=True) == "oscillate"


@pytest.mark.parametrize(
    ("ranked", "total", "want"),
    [([("decays", 30)], 30, "decays in all 30 layers"),
     ([("decays", 1)], 1, "decays in the one layer"),
     ([("decays", 20), ("U-shaped", 10)], 30,
      "decays in 20 of 30 layers and is U-shaped in 10"),
     ([("flat", 2), ("grows", 1), ("oscillating", 1)], 4,
      "is flat in 2 of 4 layers, grows in 1 and oscillates in 1")],
)  # fmt: skip
def test_distance_summary_counts_shapes_grammatically(ranked, total, want):
    assert _shape_counts(ranked, total) == want


def test_sink_counts_at_the_edges():
    assert _sink_count(137, 270) == "137 of 270 heads (51%)"
    assert _sink_count(0, 270) == "None of the 270 heads"
    assert _sink_count(9, 9) == "All 9 heads"
    assert _sink_count(1, 1) == "The one head"
    assert _layer_range(torch.tensor([0.5]), [3]) == ""  # one layer: no range
    assert _layer_range(torch.tensor([1.0, 1.0]), [0, 1]) == "the share is 100% in every layer; "
    assert _layer_range(torch.tensor([0.0, 0.25]), [2, 5]) == (
        "per layer the share runs from 0% (layer 2) to 25% (layer 5); "
    )


# ---------------------------------------------------------------------------------------- tables
def test_tables_fold_with_a_summary_and_their_csv():
    df = pd.DataFrame(
        {"layer": [0, 1, 2], "sinking_share": [0.0, 0.5, 1.0], "plane_key_ratio": [1.1, 0.2, 0.1]}
    )
    page = table_html(df, summary="Sinks per layer", csv="sinks_layers")
    assert page.startswith('<details class="table"><summary>')
    assert '<details class="table" open' not in page  # folded: rows on demand
    summary = page.split("<summary>")[1].split("</summary>")[0]
    assert summary == 'Sinks per layer (3 rows) · <a href="sinks_layers.csv">sinks_layers.csv</a>'
    header = re.findall(r"<th\b[^>]*>(.*?)</th>", page)
    assert header == [
        "layer",
        html.escape(column_label("sinking_share")),
        html.escape(column_label("plane_key_ratio")),
    ]
    assert "sinking_share" not in header[1] and "(×)" in header[2]
    assert page.count("<tr>") == 4
    open_table = table_html(df, folded=False)
    assert "<details" not in open_table and open_table.startswith('<div class="tablewrap">')
    one = table_html(df.head(1))
    assert "Table: 1 row (layer, " in one


def test_long_text_columns_wrap():
    df = pd.DataFrame({"curve": ["Q1"], "text": ["monotone, decays: falls " * 4]})
    page = table_html(df, text_cols=("curve", "text"))
    assert '<td class="txt long">' in page and '<td class="txt">Q1</td>' in page


# ---------------------------------------------------------------------------------------- cards
VALUES = {
    ("frequency-usage", "energy"): {
        "n_layers": 1,
        "q": {"band": "Q4", "layers": 1, "mean_share": 0.5},
        "k": {"band": "Q1", "layers": 0, "mean_share": 0.0},
    },
    ("prope-sweep", "prope"): {
        "nope_delta": 2.43,
        "p075_delta": -0.00057,
        "reversed_delta": 1.73,
        "partial_delta": -0.0,
    },
    ("attention-sinks", "sinks-1"): {"by_band": {"Q1": -0.03, "Q2": -0.0, "Q4": 9.2}},
    ("attention-by-distance", "distance"): {"full_logit_shapes": {"decays": 1}},
}


@pytest.mark.parametrize("where", list(VALUES))
def test_cards_chart_the_numbers_they_state(where):
    section, key = where
    f = Finding(key, section, "text", VALUES[where])
    bars = card_bars(f)
    assert bars
    svg = spark_svg(bars)
    assert svg.count("<rect") == len(bars)
    assert "-0.00" not in svg and "−0.00" not in svg
    for b in bars:
        assert html.escape(b.text) in svg


def test_card_bars_are_to_scale_and_signed():
    f = Finding("prope", "prope-sweep", "text", VALUES[("prope-sweep", "prope")])
    bars = card_bars(f)
    assert [b.text for b in bars] == ["+2.43 nats", "0.00 nats", "+1.73 nats", "0.00 nats"]
    widths = [
        float(w) for w in re.findall(r'<rect x="[^"]+" y="[^"]+" width="([^"]+)"', spark_svg(bars))
    ]
    assert widths[0] / widths[2] == pytest.approx(2.43 / 1.73, rel=0.01)
    neg = Finding("sinks-1", "attention-sinks", "t", {"by_band": {"Q1": -1.0, "Q4": 3.0}})
    svg = spark_svg(card_bars(neg))
    xs = [float(x) for x in re.findall(r'<rect x="([^"]+)"', svg)]
    assert xs[0] < xs[1]  # the negative bar starts left of zero, the positive one at zero


def test_a_finding_without_a_chart_or_with_missing_numbers_has_none():
    assert card_bars(Finding("other", "somewhere", "text", {"x": 1.0})) == []
    assert card_bars(Finding("prope", "prope-sweep", "text", {})) == []
    card = finding_card(Finding("other", "somewhere", "Some words.", {}), "Somewhere")
    assert "<svg" not in card and "Some words." in card


# ---------------------------------------------------------------------------------------- the page
@pytest.fixture(scope="module")
def built(tiny, tmp_path_factory):
    """A report on the tiny Llama, with the ReportData its page was laid out from."""
    seen = {}
    real = build_module.render_sections

    def keep(data, progress=False):
        seen["data"] = data
        return real(data, progress)

    mp = pytest.MonkeyPatch()
    mp.setattr(build_module, "render_sections", keep)
    try:
        out = build_report(
            tiny("llama"),
            tokens=2 * N_CTX,
            n_ctx=N_CTX,
            out=tmp_path_factory.mktemp("page") / "out",
            progress=False,
        )
    finally:
        mp.undo()
    return out, seen["data"]


def test_page_opens_on_the_summary_figure_then_cards(built):
    out, _ = built
    page = (out / "index.html").read_text()
    findings = page.split('<section id="findings">')[1].split("</section>")[0]
    assert findings.index('class="plotly-graph-div"') < findings.index('<ul class="findings">')
    cards = re.findall(r'<li data-finding="([^"]+)">', findings)
    assert len(cards) >= 10
    assert findings.count('<svg class="spark"') == len(cards)  # every report finding has a chart
    texts = [f["text"] for f in json.loads((out / "report.json").read_text())["findings"]]
    for text in texts:
        assert not re.search(r"\b(is|are) (decays|grows|oscillating)\b", text), text
        assert not re.search(r"[-−]0\.0+(?!\d*[1-9])", text), text


def test_folded_tables_link_csvs_that_keep_their_columns(built):
    out, _ = built
    page = (out / "index.html").read_text()
    links = re.findall(r'<summary>[^<]*(?:<a href="([^"]+\.csv)">)?', page)
    linked = {x for x in links if x}
    assert {"sinks_layers.csv", "distance_shapes.csv", "massive_planes.csv"} <= linked
    for name in linked:
        assert (out / name).exists()
    assert "sinking_share" in pd.read_csv(out / "sinks_layers.csv").columns
    sinks = page.split('<section id="attention-sinks">')[1].split("</section>")[0]
    assert "<th" in sinks and ">sinking_share<" not in sinks
    assert html.escape(column_label("plane_key_ratio")) in sinks


def test_summary_rows_match_the_sections_csvs(built):
    out, data = built
    rows = {r.title.replace("<br>", " "): r for r in summary_rows(data)}
    assert list(rows) == [
        "query energy by band",
        "positional heads",
        "heads that sink",
        "massive dimensions",
    ]
    heads = pd.read_csv(out / "head_taxonomy.csv")
    want = heads.groupby("layer")["positional"].sum()
    ((_, layers, counts),) = rows["positional heads"].series
    assert dict(zip(layers, counts, strict=True)) == {int(k): float(v) for k, v in want.items()}
    sinks = pd.read_csv(out / "sinks_layers.csv").set_index("layer")["sinking_share"]
    ((_, layers, share),) = rows["heads that sink"].series
    assert share == pytest.approx([float(sinks[L]) for L in layers])
    energy = pd.read_csv(out / "energy.csv")
    q = energy[(energy.which == "q") & (energy.scope == "no_sink")]
    per_layer = q.groupby(["layer", "band"], sort=False)["energy_share"].mean().unstack()
    for band, layers, values in rows["query energy by band"].series:
        assert values == pytest.approx([per_layer.loc[L, band] for L in layers], abs=1e-6)
    mv = data.results["massive-values"].value
    for name, layers, values in rows["massive dimensions"].series:
        norm = mv.moments[name.split()[1]].total_sq.sqrt()  # [layer, head, dim]
        want = (norm > mv.factor * norm.mean(-1, keepdim=True)).sum((1, 2))
        assert list(layers) == list(mv.layers) and list(values) == [float(n) for n in want]


def test_mixer_goes_after_the_positional_heads(built, monkeypatch):
    _, data = built
    monkeypatch.setattr(mixer_module, "positional_heads", lambda data: [])
    assert mixer_module.band_mixer_html(data) == ""  # no positional head: no section
    monkeypatch.setattr(mixer_module, "positional_heads", lambda data: [(1, 0)])
    monkeypatch.setattr(
        mixer_module, "mixer_page", lambda data, heads: "<p>mixer for L1.H0 & co</p>"
    )
    block = mixer_module.band_mixer_html(data)
    assert block.startswith(f'<section id="{mixer_module.MIXER_KEY}">')
    assert 'srcdoc="&lt;p&gt;mixer for L1.H0 &amp; co&lt;/p&gt;"' in block
    sections = build_module.render_sections(data)
    page = build_module._render_page(data, sections, _fake_report(data))
    order = [m.group(1) for m in re.finditer(r'<section id="([^"]+)">', page)]
    assert order[order.index(mixer_module.MIXER_AFTER) + 1] == mixer_module.MIXER_KEY


def test_mixer_page_holds_the_layers_of_the_strongest_positional_heads(built, monkeypatch):
    """The page the report embeds is the band mixer of the report's first window, on the layers of
    the positional heads (at most MIXER_MAX_LAYERS, strongest first), in the report's bands."""
    _, data = built
    layers = list(data.layers)
    heads = [(layers[-1], 0), (layers[0], 1), (layers[-1], 1)]
    monkeypatch.setattr(mixer_module, "positional_heads", lambda data: heads)
    monkeypatch.setitem(data.results, mixer_module.MIXER_KEY, None)
    mixer_module.measure_mixer(data)
    html = data.results[mixer_module.MIXER_KEY]
    found = re.search(r"id='ropelens-data'>(.*?)</script>", html)
    page = json.loads(found.group(1).replace("<\\/", "</"))
    assert [e["layer"] for e in page["layers"]] == sorted({layers[-1], layers[0]})
    band_names = [b["name"] for b in page["layers"][0]["bands"]]
    assert band_names[: len(data.band_stats.band_names)] == list(data.band_stats.band_names)
    n = min(mixer_module.MIXER_TOKENS, data.n_ctx)
    assert len(page["tokens"]) == n
    assert page["open"] == {"layer": layers[-1], "head": 0}  # the strongest positional head
    block = mixer_module.band_mixer_html(data)
    assert "<iframe" in block and "L" + str(layers[-1]) + ".H0" in block


def test_mixer_introduction_names_only_the_heads_the_mixer_holds():
    """Positional heads in more layers than the mixer holds: the introduction names the layers it
    holds and their heads, and counts the rest as left out, naming none of them."""
    heads = [(16, 0), (1, 2), (2, 1), (11, 1), (29, 1), (29, 4), (19, 3), (2, 0)]
    assert mixer_module.MIXER_MAX_LAYERS == 4
    assert mixer_module.mixer_layers(heads) == [1, 2, 11, 16]
    block = mixer_module.mixer_section("<p>page</p>", heads)
    lead = re.search(r'<p class="lead">(.*?)</p>', block).group(1)
    named = re.findall(r"L(\d+)\.H(\d+)", lead)
    assert [(int(L), int(h)) for L, h in named] == [(16, 0), (1, 2), (2, 1), (11, 1), (2, 0)]
    assert "layers 1, 2, 11, 16" in lead and "3 of 8 positional heads sit in other layers" in lead
    one = mixer_module.mixer_section("<p>page</p>", [(3, 0), (3, 1)])
    assert "holds layer 3, with the positional heads L3.H0, L3.H1." in one


def _fake_report(data) -> dict:
    return build_module._report_json(data, build_module.render_sections(data), {}, 0.0)


def test_every_report_finding_has_a_chart():
    keys = {
        ("frequency-usage", "energy"), ("frequency-usage", "sink"), ("band-statistics", "margin"),
        ("band-statistics", "top1"), ("band-statistics", "tightness"),
        ("head-taxonomy", "heads"), ("attention-sinks", "sinks-0"),
        ("attention-sinks", "sinks-1"), ("attention-by-distance", "distance"),
        ("massive-values", "massive"), ("prope-sweep", "prope"), ("pe-geometry", "geometry"),
        ("extension-planes", "context"),
    }  # fmt: skip
    assert keys == set(CHARTS)


# ---------------------------------------------------------------------------------------- figures
def test_figures_are_written_beside_the_page(built, tmp_path):
    from xml.etree import ElementTree

    from ropelens.plots.export import export_unavailable

    if export_unavailable() is not None:
        pytest.skip(export_unavailable())
    _, data = built
    sections = build_module.render_sections(data)
    out = tmp_path / "out"
    (out / "figures").mkdir(parents=True)
    (out / "figures" / "99-old.svg").write_text("<svg/>")  # an earlier report's: removed
    (out / "figures" / "notes.txt").write_text("mine")  # not a report figure: kept
    build_module._write(out, data, sections, {}, 0.0, figures="svg")
    page = (out / "index.html").read_text()
    listed = json.loads((out / "report.json").read_text())["figures"]
    n_figures = page.count('class="plotly-graph-div"')
    assert len(listed) == n_figures == 1 + sum(len(s.figures) for s in sections)
    assert listed[0] == "figures/01-summary.svg"
    assert sorted(p.name for p in (out / "figures").iterdir()) == sorted(
        [name.split("/")[1] for name in listed] + ["notes.txt"]
    )
    for name in listed:
        assert re.fullmatch(r"figures/\d\d-[a-z0-9-]+\.svg", name)
        root = ElementTree.parse(out / name).getroot()
        assert root.tag.endswith("svg")


def test_figure_format_is_checked_before_the_model_loads(tmp_path):
    with pytest.raises(InputError, match="not a figure format"):
        build_report("no-such-model", out=tmp_path / "r", figures="gif")
    assert not (tmp_path / "r").exists()
