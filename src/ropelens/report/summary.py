"""The figure the report opens on: per layer, the numbers the sections measured, as small multiples
sharing the layer axis (energy by band, positional heads, sinking heads, massive dimensions)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from ropelens.analyses.attention_sinks import AttentionSinks
from ropelens.analyses.head_taxonomy import HeadTaxonomy
from ropelens.analyses.massive_values import MassiveValues
from ropelens.plots.style import style_figure
from ropelens.report.collect import ReportData

__all__ = ["SummaryRow", "summary_figure", "summary_rows"]

ROW_PX = 112  # each small multiple's height
GAP_PX = 16
# one colour per legend entry of the whole figure: the energy row's bands take the first, the
# massive row's q and k the next (never a band's colour again)
BAND_COLOURS = (
    "#3b5bdb", "#4dabf7", "#f59f00", "#e8590c", "#7048e8", "#12b886", "#c2255c", "#5c940d",
    "#868e96", "#0b7285", "#e64980", "#8d6e63",
)  # fmt: skip
BAR_COLOUR = "#4c6ef5"


@dataclass(frozen=True)
class SummaryRow:
    """One small multiple: its y-axis title, its series as (name, layers, values), stacked, and the
    hover format of a value."""

    title: str
    series: tuple[tuple[str, tuple[int, ...], tuple[float, ...]], ...]
    hover: str  # the plotly hover format of a value
    y_max: float | None = None


def _result(data: ReportData, key: str, cls: type) -> Any:
    """What the section ``key`` measured, when it is a ``cls`` (None where the section was not
    measured or measures something else)."""
    measured = data.results.get(key)
    value = getattr(measured, "value", measured)
    return value if isinstance(value, cls) else None


def _energy_row(data: ReportData) -> SummaryRow:
    names, share = data.usage.band_share(data.band_stats.bands, "q", "no_sink")  # [L, H, B]
    per_layer = share.nanmean(1)  # [L, B]
    layers = tuple(int(x) for x in data.usage.layers)
    series = tuple(
        (name, layers, tuple(float(v) for v in per_layer[:, j])) for j, name in enumerate(names)
    )
    return SummaryRow("query energy<br>by band", series, "%{y:.0%}", y_max=1.0)


def _positional_row(tx: HeadTaxonomy) -> SummaryRow:
    counts = tx.positional().sum(1)
    layers = tuple(int(x) for x in tx.layers)
    return SummaryRow(
        "positional<br>heads", (("positional heads", layers, tuple(float(c) for c in counts)),),
        "%{y:.0f} heads",
    )  # fmt: skip


def _sink_row(sinks: AttentionSinks) -> SummaryRow:
    layers = tuple(int(x) for x in sinks.layers)
    share = tuple(float(s) for s in sinks.head_share())
    return SummaryRow(
        "heads that<br>sink", (("heads that sink", layers, share),), "%{y:.0%}", y_max=1.0
    )


def _massive_row(mv: MassiveValues) -> SummaryRow:
    layers = tuple(int(x) for x in mv.layers)
    series = tuple(
        (f"massive {w} dims", layers, tuple(float(n) for n in mv.mask(w).sum((1, 2))))
        for w in ("q", "k")
    )
    return SummaryRow("massive<br>dimensions", series, "%{y:.0f}")


def summary_rows(data: ReportData) -> list[SummaryRow]:
    """The small multiples the measured sections allow, top to bottom."""
    rows = [_energy_row(data)]
    tx = _result(data, "head-taxonomy", HeadTaxonomy)
    if tx is not None:
        rows.append(_positional_row(tx))
    sinks = _result(data, "attention-sinks", AttentionSinks)
    if sinks is not None:
        rows.append(_sink_row(sinks))
    mv = _result(data, "massive-values", MassiveValues)
    if mv is not None:
        rows.append(_massive_row(mv))
    return rows


def _add_row(fig: go.Figure, row: SummaryRow, index: int, first_colour: int) -> int:
    """Draws ``row`` as the figure's row ``index``, its legend entries coloured from
    ``BAND_COLOURS[first_colour]`` on; returns the next unused colour."""
    many = len(row.series) > 1
    for j, (name, layers, values) in enumerate(row.series):
        colour = BAND_COLOURS[(first_colour + j) % len(BAND_COLOURS)] if many else BAR_COLOUR
        fig.add_trace(
            go.Bar(
                x=list(layers),
                y=list(values),
                name=name,
                marker={"color": colour, "line": {"width": 0}},
                showlegend=many,
                legendgroup=f"row{index}",
                legendgrouptitle={"text": row.title.replace("<br>", " ")} if many else None,
                hovertemplate=f"layer %{{x}}<br>{row.hover}<extra>{name}</extra>",
            ),
            row=index,
            col=1,
        )
    fig.update_yaxes(
        title_text=row.title,
        title_font={"size": 11},
        rangemode="tozero",
        nticks=3,
        row=index,
        col=1,
        **({"range": [0, row.y_max]} if row.y_max else {}),
        **({"tickformat": ".0%"} if row.hover.startswith("%{y:.0%") else {}),
    )
    return first_colour + len(row.series) if many else first_colour


def summary_figure(data: ReportData) -> go.Figure:
    """Per layer: the queries' energy share by band (sink positions excluded), the positional heads,
    the share of heads that sink on position 0, and the massive q and k dimensions: each row drawn
    from the result its section measured (rows whose section did not run are left out)."""
    rows = summary_rows(data)
    n = len(rows)
    plots_px = n * ROW_PX + (n - 1) * GAP_PX
    fig = make_subplots(
        rows=n, cols=1, shared_xaxes=True, vertical_spacing=GAP_PX / plots_px if n > 1 else 0.0
    )
    colour = 0
    for index, row in enumerate(rows, start=1):
        colour = _add_row(fig, row, index, colour)
    fig.update_layout(barmode="stack")  # band shares stack to 1, q and k dimensions to their sum
    fig.update_xaxes(title_text="layer", row=n, col=1)
    shown = sorted({L for row in rows for _, layers, _ in row.series for L in layers})
    # layers as categories: the measured layers side by side, even when they skip some
    fig.update_xaxes(type="category", categoryorder="array", categoryarray=shown, showgrid=False)
    fig.update_layout(
        title="The model at a glance, per layer",
        legend={"groupclick": "toggleitem", "font": {"size": 11}, "tracegroupgap": 14},
        bargap=0.15,
    )
    style_figure(fig, height=plots_px + 110)
    fig.update_layout(margin={"t": 40, "b": 45, "l": 80})
    return fig
