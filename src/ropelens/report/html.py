"""The page: one self-contained HTML file (plotly.js embedded once, no network, no web fonts)."""

from __future__ import annotations

import html
import math
from collections.abc import Iterable, Sequence
from typing import Any

import pandas as pd
import plotly.graph_objects as go

from ropelens.plots.style import FONT

__all__ = ["esc", "figure_html", "number", "page", "table_html"]

MONO = (
    'ui-monospace, SFMono-Regular, Menlo, Consolas, "DejaVu Sans Mono", "Liberation Mono", '
    "monospace"
)

CSS = """
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
.tablewrap { overflow-x:auto; margin:6px 0 14px; }
table.t { border-collapse:collapse; font-size:13.5px; }
table.t th, table.t td {
  padding:4px 10px;
  border-bottom:1px solid var(--line);
  text-align:right;
  white-space:nowrap;
}
table.t th {
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
@media print { nav.toc { position:static; } }
""".replace("FONT", FONT).replace("MONO", MONO)


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


def figure_html(fig: go.Figure, caption: str | None = None) -> str:
    """A figure as a div (plotly.js itself is embedded once, in the page head)."""
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


def table_html(
    df: pd.DataFrame,
    *,
    digits: int = 3,
    text_cols: Iterable[str] = (),
    formats: dict[str, Any] | None = None,
) -> str:
    """A readable table: numbers right-aligned and compact, text columns left-aligned."""
    formats = formats or {}
    text = set(text_cols)
    cols = list(df.columns)
    head = "".join(f'<th class="{"txt" if c in text else ""}">{esc(c)}</th>' for c in cols)
    rows = []
    for rec in df.itertuples(index=False):
        cells = []
        for c, v in zip(cols, rec, strict=True):
            shown = (
                formats[c](v) if c in formats else (esc(v) if c in text else esc(number(v, digits)))
            )
            cells.append(f'<td class="{"txt" if c in text else ""}">{shown}</td>')
        rows.append("<tr>" + "".join(cells) + "</tr>")
    return (
        f'<div class="tablewrap"><table class="t"><thead><tr>{head}</tr></thead>'
        f"<tbody>{''.join(rows)}</tbody></table></div>"
    )


def kv_table(items: Sequence[tuple[str, str]]) -> str:
    """Two-column key/value table (values are already HTML)."""
    rows = "".join(f"<tr><th>{esc(k)}</th><td>{v}</td></tr>" for k, v in items)
    return f'<div class="tablewrap"><table class="t kv"><tbody>{rows}</tbody></table></div>'


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
<main class="wrap">
{body}
</main>
<footer class="wrap">{footer}</footer>
</body>
</html>
"""
