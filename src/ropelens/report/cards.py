"""Finding cards: each finding's sentence beside a small bar chart of the numbers it states, drawn
from :attr:`Finding.values` as inline SVG (no script, a few hundred bytes each)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ropelens.report.html import esc
from ropelens.results.findings import Finding, fixed, head_name, percent, signed

__all__ = ["Bar", "card_bars", "finding_card", "spark_svg"]

WIDTH, LABEL_PX, VALUE_PX, ROW_PX = 270, 100, 70, 17


@dataclass(frozen=True)
class Bar:
    """One bar of a card's chart: its label, its value, and the value as the sentence writes it."""

    label: str
    value: float
    text: str


def _share(label: str, x: float) -> Bar:
    return Bar(label, float(x), percent(x))


def _nats(label: str, x: float) -> Bar:
    return Bar(label, float(x), signed(x, unit="nats"))


def _energy(v: dict[str, Any]) -> list[Bar]:
    n = v["n_layers"]
    return [
        Bar(f"{w}: {v[w]['band']}", v[w]["layers"] / n, f"{v[w]['layers']}/{n} layers")
        for w in ("q", "k")
    ]


def _sink(v: dict[str, Any]) -> list[Bar]:
    return [
        Bar(label, v[key], fixed(v[key]) + "×")
        for label, key in (
            ("k, lowest", "k_min"),
            ("k, median", "k_median"),
            ("k, highest", "k_max"),
        )
    ] + [Bar(f"q, layer {v['layer']}", v["q_ratio"], fixed(v["q_ratio"]) + "×")]


def _margin(v: dict[str, Any]) -> list[Bar]:
    return [
        Bar(head_name(h["layer"], h["head"]), h["margin_share"], fixed(h["margin_share"]))
        for h in v["heads"]
    ]


def _top1(v: dict[str, Any]) -> list[Bar]:
    bars = [Bar(v["band"], v["mean_top1"], fixed(v["mean_top1"]))]
    if v.get("first_band") not in (None, v["band"]) and v.get("first_top1") is not None:
        bars.append(Bar(v["first_band"], v["first_top1"], fixed(v["first_top1"])))
    return bars


def _tightness(v: dict[str, Any]) -> list[Bar]:
    return [
        Bar("plane 0, mean", v["mean"], fixed(v["mean"])),
        Bar(head_name(v["best_layer"], v["best_head"]), v["best"], fixed(v["best"])),
        Bar("lowest plane", v["lowest_mean"], fixed(v["lowest_mean"])),
    ]


def _heads(v: dict[str, Any]) -> list[Bar]:
    if v.get("margin_high_positional") is None:
        return [Bar(kind, n, f"{n:,}") for kind, n in v.get("kinds", {}).items()]
    return [
        _share("positional", v["margin_high_positional"]),
        _share("other heads", v["margin_high_other"]),
    ]


def _sinks0(v: dict[str, Any]) -> list[Bar]:
    n, total = v["sinking_heads"], v["heads"]
    return [
        Bar("heads that sink", n / total if total else 0.0, f"{n:,}/{total:,}"),
        _share("attention to 0", v["mean_attention"]),
    ]


def _sinks1(v: dict[str, Any]) -> list[Bar]:
    return [Bar(band, x, fixed(x)) for band, x in v["by_band"].items()]


def _distance(v: dict[str, Any]) -> list[Bar]:
    counts = sorted(v["full_logit_shapes"].items(), key=lambda kv: -kv[1])
    return [Bar(shape, n, f"{n} layers" if n != 1 else "1 layer") for shape, n in counts]


def _massive(v: dict[str, Any]) -> list[Bar]:
    return [Bar(f"{w} dims", v[f"n_massive_{w}"], f"{v[f'n_massive_{w}']:,}") for w in "qk"]


def _prope(v: dict[str, Any]) -> list[Bar]:
    return [
        _nats(label, v[key])
        for label, key in (
            ("NoPE", "nope_delta"),
            ("p = 0.75", "p075_delta"),
            ("reversed", "reversed_delta"),
            ("partial", "partial_delta"),
        )
    ]


def _geometry(v: dict[str, Any]) -> list[Bar]:
    return [
        Bar(f"{kind}, δ = {v['n_ctx']:,}", x["constant_at_window"], fixed(x["constant_at_window"]))
        for kind, x in v.items()
        if isinstance(x, dict)
    ]


def _context(v: dict[str, Any]) -> list[Bar]:
    bars = [_nats("PI", v["delta_pi"]), _nats("YaRN", v["delta_yarn"])]
    if v.get("cheapest") not in (None, "PI", "YaRN"):
        bars.append(_nats(v["cheapest"], v["delta_cheapest"]))
    return bars


# The numbers each finding states, by (section, key), as bars.
CHARTS: dict[tuple[str, str], Callable[[dict[str, Any]], list[Bar]]] = {
    ("frequency-usage", "energy"): _energy,
    ("frequency-usage", "sink"): _sink,
    ("band-statistics", "margin"): _margin,
    ("band-statistics", "top1"): _top1,
    ("band-statistics", "tightness"): _tightness,
    ("head-taxonomy", "heads"): _heads,
    ("attention-sinks", "sinks-0"): _sinks0,
    ("attention-sinks", "sinks-1"): _sinks1,
    ("attention-by-distance", "distance"): _distance,
    ("massive-values", "massive"): _massive,
    ("prope-sweep", "prope"): _prope,
    ("pe-geometry", "geometry"): _geometry,
    ("extension-planes", "context"): _context,
}


def card_bars(finding: Finding) -> list[Bar]:
    """The bars of a finding's chart ([] for a finding with no chart, or whose numbers are
    missing)."""
    chart = CHARTS.get((finding.section, finding.key))
    if chart is None or finding.values.get("withheld"):  # a withheld finding states no number
        return []
    try:
        bars = chart(finding.values)
    except (KeyError, TypeError, ZeroDivisionError):
        return []
    return [b for b in bars if b.value == b.value]  # NaN: no bar


def spark_svg(bars: list[Bar], title: str = "") -> str:
    """Horizontal bars, one row each: label, bar from zero (both ways when a value is negative),
    the value as the sentence states it."""
    if not bars:
        return ""
    lo = min(0.0, *(b.value for b in bars))
    hi = max(0.0, *(b.value for b in bars))
    span = (hi - lo) or 1.0
    plot = WIDTH - LABEL_PX - VALUE_PX
    zero = LABEL_PX + plot * (-lo / span)
    height = ROW_PX * len(bars) + 4
    rows = []
    for i, b in enumerate(bars):
        y = 2 + i * ROW_PX
        x0 = zero + plot * min(0.0, b.value) / span
        w = max(plot * abs(b.value) / span, 1.0 if b.value else 0.0)
        colour = "#e8590c" if b.value < 0 else "#4c6ef5"
        rows.append(
            f'<text x="{LABEL_PX - 4}" y="{y + 12}" text-anchor="end">{esc(b.label)}</text>'
            f'<rect x="{x0:.1f}" y="{y + 3}" width="{w:.1f}" height="{ROW_PX - 6}" '
            f'fill="{colour}"><title>{esc(b.label)}: {esc(b.text)}</title></rect>'
            f'<text x="{WIDTH - VALUE_PX + 4}" y="{y + 12}">{esc(b.text)}</text>'
        )
    axis = (
        f'<line x1="{zero:.1f}" x2="{zero:.1f}" y1="1" y2="{height - 1}" stroke="#9aa1ad" '
        'stroke-width="1"/>'
    )
    label = f' aria-label="{esc(title)}"' if title else ""
    return (
        f'<svg class="spark" role="img"{label} width="{WIDTH}" height="{height}" '
        f'viewBox="0 0 {WIDTH} {height}" font-size="10.5" fill="#5b6475">'
        + axis
        + "".join(rows)
        + "</svg>"
    )


def finding_card(finding: Finding, section_title: str) -> str:
    """A finding's list item: its sentence and link to its section, and its chart beside them."""
    words = (
        f'<div class="words">{esc(finding.text)}'
        f'<a href="#{esc(finding.section)}">→ {esc(section_title)}</a></div>'
    )
    chart = spark_svg(card_bars(finding), f"the numbers of finding {finding.key}")
    return f'<li data-finding="{esc(finding.key)}"><div class="card">{words}{chart}</div></li>'
