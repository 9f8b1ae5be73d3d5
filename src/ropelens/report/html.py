"""The page: one self-contained HTML file (plotly.js embedded once, no network, no web fonts)."""

from __future__ import annotations

import contextlib
import contextvars
import html
import math
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from ropelens.plots.style import FONT, readable_log_axes

__all__ = [
    "COLUMN_LABELS", "collecting_figures", "column_label", "esc", "figure_html", "number", "page",
    "table_html", "table_summary",
]  # fmt: skip

# What a table's code-named columns are called on the page (the CSV files keep the code names):
# words a reader understands, with the unit where there is one.
COLUMN_LABELS = {
    "kind": "layer kind",
    "sinking_share": "heads that sink (share)",
    "mean_attention": "mean attention to position 0",
    "query_share": "queries above ε (share)",
    "plane_key_ratio": "key norm at position 0 ÷ other keys (×)",
    "which": "q or k",
    "inv_freq": "frequency (rad / token)",
    "wavelength": "wavelength λ (tokens)",
    "n_massive_dims": "massive dimensions",
    "n_massive": "heads holding one (layer × head)",
    "persistence": "layers where massive (share)",
    "max_head_persistence": "layers where massive, one head (share)",
    "top_plane": "top plane",
    "ppl": "perplexity",
    "ppl_lo": "perplexity, CI low",
    "ppl_hi": "perplexity, CI high",
    "Δ loss": "Δ loss (nats)",
    "Δ lo": "Δ loss, CI low (nats)",
    "Δ hi": "Δ loss, CI high (nats)",
    "δ*": "offset δ* (tokens)",
    "text": "description",
    "curve": "curve",
    "shape": "shape",
    "margin_share": "margin share",
    "energy_share": "energy share",
    "top1": "band-only top-1 agreement",
    "tightness": "Cauchy–Schwarz tightness",
    "attention ×": "attention scale (×)",
}
MAX_TABLE_HEIGHT = 440  # px: a longer table scrolls inside its own box

MONO = (
    'ui-monospace, SFMono-Regular, Menlo, Consolas, "DejaVu Sans Mono", "Liberation Mono", '
    "monospace"
)

CSS = (
    """
:root {
  --ink:#1f2430;
  --muted:#5b6475;
  --line:#e3e6ec;
  --soft:#f5f6f9;
  --accent:#2f5fd0;
  --warn:#9a6700;
}
* { box-sizing:border-box; }
html { scroll-behavior:smooth; }
[id] { scroll-margin-top:calc(var(--nav-height, 96px) + 10px); }
body {
  margin:0;
  color:var(--ink);
  background:#fff;
  font:15px/1.55 FONT;
  font-feature-settings:"tnum" 1;
}
header.top { background:#1f2430; color:#fff; padding:22px 0 18px; }
header.top h1 { margin:0 0 4px; font-size:24px; font-weight:650; letter-spacing:-.01em; }
header.top .sub { color:#c9cfdb; font-size:14px; }
header.top .sub b { color:#fff; font-weight:600; }
nav.toc {
  position:sticky;
  top:0;
  z-index:5;
  background:rgba(255,255,255,.96);
  border-bottom:1px solid var(--line);
}
nav.toc .wrap { display:flex; flex-wrap:wrap; gap:2px 18px; padding:8px 24px; font-size:13.5px; }
nav.toc a { color:var(--muted); text-decoration:none; white-space:nowrap; }
nav.toc a:hover { color:var(--accent); }
nav.toc a.na { color:#a3a9b5; }
.wrap { max-width:1180px; margin:0 auto; padding:0 24px; }
main { padding-bottom:48px; }
section { padding:26px 0 8px; border-bottom:1px solid var(--line); }
section:last-of-type { border-bottom:0; }
h2 { font-size:20px; margin:0 0 6px; font-weight:650; letter-spacing:-.005em; }
h2 .tag {
  font-size:12px;
  font-weight:600;
  vertical-align:middle;
  margin-left:8px;
  padding:2px 8px;
  border-radius:10px;
          background:#fff4d6; color:var(--warn); border:1px solid #f0d48a; }
h3 { font-size:15.5px; margin:20px 0 4px; font-weight:620; }
h3.exp { margin-top:28px; padding-top:10px; border-top:1px dashed var(--line); }
h4 { font-size:14px; margin:14px 0 2px; font-weight:600; color:var(--muted); }
p.note { color:var(--muted); font-size:13.5px; font-style:italic; }
p { margin:6px 0 10px; max-width:82ch; }
p.lead { color:var(--muted); }
.caption { color:var(--muted); font-size:13.5px; max-width:92ch; margin:2px 0 14px; }
code, .mono { font-family:MONO; font-size:.92em; }
ul.findings { margin:8px 0 6px; padding-left:0; list-style:none; counter-reset:f; }
ul.findings li {
  position:relative;
  padding:8px 12px 8px 40px;
  margin:0 0 6px;
  background:var(--soft);
                 border-left:3px solid var(--accent); border-radius:3px; max-width:100ch; }
ul.findings li::before {
  counter-increment:f;
  content:counter(f);
  position:absolute;
  left:12px;
  top:8px;
                         font-weight:700; color:var(--accent); }
ul.findings li a { color:var(--muted); font-size:12.5px; margin-left:6px; text-decoration:none; }
.grid2 { display:grid; grid-template-columns:repeat(auto-fit, minmax(520px, 1fr)); gap:8px 18px; }
.fig { margin:4px 0 6px; }
.tablewrap { overflow:auto; max-width:100%; margin:6px 0 14px; }
details.table { margin:6px 0 14px; max-width:100%; }
details.table > summary {
  cursor:pointer;
  color:var(--muted);
  font-size:13.5px;
  padding:4px 0;
}
details.table > summary a { margin-left:6px; }
details.table .tablewrap { max-height:MAXHpx; margin-top:4px; border:1px solid var(--line); }
details.table table.t th { position:sticky; top:0; z-index:1; }
table.t td.txt.long { white-space:normal; min-width:24ch; max-width:80ch; text-align:left; }
.summaryfig { margin:4px 0 10px; }
ul.findings li .card { display:flex; gap:14px; align-items:flex-start; }
ul.findings li .card .words { flex:1 1 auto; min-width:0; }
ul.findings li .card svg.spark { flex:0 0 auto; }
@media (max-width: 700px) { ul.findings li .card { flex-direction:column; } }
table.t { border-collapse:collapse; font-size:13.5px; }
table.t th, table.t td {
  padding:4px 10px;
  border-bottom:1px solid var(--line);
  text-align:right;
  white-space:nowrap;
}
table.t th {
  white-space:normal;
  vertical-align:bottom;
  min-width:5ch;
  font-weight:600;
  color:var(--muted);
  border-bottom:1.5px solid #c9ced8;
  background:#fff;
}
table.t th:first-child, table.t td:first-child { text-align:left; }
table.t td.txt, table.t th.txt { text-align:left; }
table.t tbody tr:nth-child(even) { background:#fafbfc; }
table.t tbody tr:hover { background:#eef3ff; }
table.kv th { text-align:left; color:var(--muted); font-weight:500; padding-right:18px; }
table.kv td { text-align:left; white-space:normal; }
.placeholder {
  border:1.5px dashed #d6c48a;
  background:#fffbea;
  border-radius:6px;
  padding:12px 16px;
  max-width:90ch;
}
.placeholder b { color:var(--warn); }
.placeholder .req { color:var(--muted); font-size:13px; }
footer { color:var(--muted); font-size:12.5px; padding:18px 0 30px; }
@media (max-width: 1000px) { table.t th, table.t td { padding:4px 6px; } }
@media print { nav.toc { position:static; } }
""".replace("FONT", FONT)
    .replace("MONO", MONO)
    .replace("MAXH", str(MAX_TABLE_HEIGHT))
)


def esc(text: Any) -> str:
    """HTML-escape any value's string form."""
    return html.escape(str(text), quote=True)


def number(x: Any, digits: int = 3) -> str:
    """A compact human form of a number (ints as ints, inf as ∞, floats to ``digits``
    significant)."""
    if x is None:
        return "–"
    if isinstance(x, bool):
        return "yes" if x else "no"
    if isinstance(x, int):
        return f"{x:,}"
    try:
        v = float(x)
    except (TypeError, ValueError):
        return str(x)
    if math.isnan(v):
        return "–"
    if math.isinf(v):
        return "∞" if v > 0 else "−∞"
    if v == int(v) and abs(v) < 1e6:
        return f"{int(v):,}"
    return f"{v:.{digits}g}" if abs(v) < 1e4 else f"{v:.{digits}e}"


def _compact(fig: go.Figure) -> go.Figure:
    """The figure with its float data in single precision (7 significant digits, more than any
    hover shows): plotly writes numeric arrays as base64, 4 bytes a value instead of 8, or of the
    ~18 characters a float takes as JSON text."""
    for trace in fig.data:
        for name in ("x", "y", "z", "customdata"):
            if name not in trace:
                continue
            value = trace[name]
            if value is None or isinstance(value, str):
                continue
            try:
                a = np.asarray(value)
            except (ValueError, TypeError):
                continue
            if a.dtype.kind != "f" or a.size < 8 or a.dtype == np.float32:
                continue
            finite = a[np.isfinite(a)]
            if finite.size and float(np.abs(finite).max()) > 1e30:
                continue  # past single precision's range
            trace[name] = a.astype(np.float32)
    return fig


_COLLECTED: contextvars.ContextVar[list[go.Figure] | None] = contextvars.ContextVar(
    "ropelens_report_figures", default=None
)


@contextlib.contextmanager
def collecting_figures() -> Iterator[list[go.Figure]]:
    """Within the block, every figure :func:`figure_html` lays out is also appended to the list
    this yields, in page order (the report writes them as files with ``figures=``); a block within
    another hands its figures on to the outer one's list too."""
    figures: list[go.Figure] = []
    outer = _COLLECTED.get()
    token = _COLLECTED.set(figures)
    try:
        yield figures
    finally:
        _COLLECTED.reset(token)
        if outer is not None:
            outer.extend(figures)


def figure_html(fig: go.Figure, caption: str | None = None) -> str:
    """A figure as a div (plotly.js itself is embedded once, in the page head), its float data
    single precision."""
    readable_log_axes(fig)
    if fig.layout.title.text and fig.layout.title.xref is None:
        fig.update_layout(title_xref="paper")  # a title starts where its plot does, not at x = 0
    _compact(fig)
    collected = _COLLECTED.get()
    if collected is not None:
        collected.append(fig)
    height = fig.layout.height or 420
    div = fig.to_html(
        include_plotlyjs=False,
        full_html=False,
        default_height=f"{int(height)}px",
        config={
            "displaylogo": False,
            "responsive": True,
            "toImageButtonOptions": {"format": "svg", "scale": 1},
        },
    )
    cap = f'<div class="caption">{caption}</div>' if caption else ""
    return f'<div class="fig">{div}</div>{cap}'


def column_label(name: Any) -> str:
    """A column's name as the page shows it (:data:`COLUMN_LABELS`; other names as they are)."""
    return COLUMN_LABELS.get(str(name), str(name))


def _cell_class(col: Any, text: set, long: set) -> str:
    return ("txt long" if col in long else "txt") if col in text else ""


def table_html(
    df: pd.DataFrame,
    *,
    digits: int = 3,
    text_cols: Iterable[str] = (),
    formats: dict[str, Any] | None = None,
    csv: str | None = None,
    summary: str | None = None,
    folded: bool = True,
    labels: dict[str, str] | None = None,
) -> str:
    """A readable table: numbers right-aligned and compact, text columns left-aligned (long texts
    wrap), columns named in words (:func:`column_label`, or ``labels`` for this table's own, such
    as ``{"kind": "head kind"}``). ``folded`` (the default) puts it in a
    ``<details>`` whose one-line summary says what it holds (``summary``, else its size and
    columns) and links ``csv`` (the table's CSV file beside the page, without ``.csv``); the rows
    show on demand and scroll inside their own box."""
    formats = formats or {}
    text = set(text_cols)
    cols = list(df.columns)
    long = (
        {c for c in text if df[c].astype(str).str.len().max(skipna=True) > 40} if len(df) else set()
    )
    named = {c: (labels or {}).get(c, column_label(c)) for c in cols}
    head = "".join(f'<th class="{_cell_class(c, text, set())}">{esc(named[c])}</th>' for c in cols)
    rows = []
    for rec in df.itertuples(index=False):
        cells = []
        for c, v in zip(cols, rec, strict=True):
            shown = (
                formats[c](v) if c in formats else (esc(v) if c in text else esc(number(v, digits)))
            )
            cells.append(f'<td class="{_cell_class(c, text, long)}">{shown}</td>')
        rows.append("<tr>" + "".join(cells) + "</tr>")
    table = (
        f'<div class="tablewrap"><table class="t"><thead><tr>{head}</tr></thead>'
        f"<tbody>{''.join(rows)}</tbody></table></div>"
    )
    if not folded:
        return table
    return (
        f'<details class="table"><summary>{table_summary(df, summary, csv)}</summary>'
        f"{table}</details>"
    )


def table_summary(df: pd.DataFrame, summary: str | None = None, csv: str | None = None) -> str:
    """The one line a folded table shows: what it holds (``summary``, already HTML, or its size and
    first columns) and the link to its CSV file."""
    n = len(df)
    rows = f"{n:,} row{'' if n == 1 else 's'}"
    if summary is None:
        names = [column_label(c) for c in df.columns]
        shown = ", ".join(names[:4]) + (", …" if len(names) > 4 else "")
        summary = f"Table: {rows} ({esc(shown)})"
    else:
        summary = f"{summary} ({rows})"
    link = f' · <a href="{esc(csv)}.csv">{esc(csv)}.csv</a>' if csv else ""
    return summary + link


def kv_table(items: Sequence[tuple[str, str]]) -> str:
    """Two-column key/value table (values are already HTML)."""
    rows = "".join(f"<tr><th>{esc(k)}</th><td>{v}</td></tr>" for k, v in items)
    return f'<div class="tablewrap"><table class="t kv"><tbody>{rows}</tbody></table></div>'


# a jump from the navigation lands below it: the bar's height (it wraps on narrow windows) sets
# where an anchor scrolls to
_NAV_HEIGHT = (
    "(() => { const nav = document.querySelector('nav.toc'); const set = () => "
    "document.documentElement.style.setProperty('--nav-height', nav.offsetHeight + 'px'); set(); "
    "new ResizeObserver(set).observe(nav); })();"
)


def page(
    *,
    title: str,
    subtitle: str,
    nav: Sequence[tuple[str, str, bool]],
    body: str,
    footer: str,
    plotly_js: str,
) -> str:
    """The whole document; ``nav`` is (anchor, label, available) per section."""
    links = "".join(
        f'<a href="#{esc(a)}" class="{"" if ok else "na"}">{esc(label)}</a>' for a, label, ok in nav
    )
    return f"""<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<meta name="generator" content="ropelens">
<title>{esc(title)}</title>
<style>{CSS}</style>
<script type="text/javascript">{plotly_js}</script>
</head>
<body>
<header class="top"><div class="wrap"><h1>{esc(title)}</h1>
<div class="sub">{subtitle}</div></div></header>
<nav class="toc"><div class="wrap">{links}</div></nav>
<script>{_NAV_HEIGHT}</script>
<main class="wrap">
{body}
</main>
<footer class="wrap">{footer}</footer>
</body>
</html>
"""
