"""Two saved reports side by side: difference maps of what they measured, and what changed.

``compare_reports(A, B, OUT)`` reads two report directories written by ``ropelens report`` (two
models with the same layer and band layout, or one model run plainly and under a variant, or on
two corpora) and writes ``OUT/index.html`` (self-contained), ``OUT/compare.json`` and one CSV per
difference table. B − A throughout.
"""

from __future__ import annotations

import csv
import io
import json
import os
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd
import plotly.graph_objects as go
from plotly.offline import get_plotlyjs

from ropelens.errors import InputError
from ropelens.plots.style import style_figure
from ropelens.report.html import esc, figure_html, page, table_html
from ropelens.validate import check_output_path

__all__ = ["compare_reports"]


def _read(folder: Path) -> dict[str, Any]:
    if not folder.exists():
        raise InputError(
            f"report directory {folder} does not exist: pass two directories written by "
            "`ropelens report`"
        )
    if not folder.is_dir():
        raise InputError(
            f"{folder} is a file, not a report directory: pass two directories written by "
            "`ropelens report`"
        )
    report = folder / "report.json"
    if not report.is_file():
        raise InputError(
            f"{folder} holds no report.json: pass two directories written by `ropelens report`"
        )
    try:
        out: dict[str, Any] = {"report": json.loads(report.read_text())}
    except (ValueError, UnicodeDecodeError) as e:  # a damaged report.json
        raise InputError(
            f"{report} is damaged ({type(e).__name__}: {e}): write the report again with "
            "`ropelens report`"
        ) from e
    if not isinstance(out["report"], dict) or not {"model", "corpus"} <= set(out["report"]):
        raise InputError(
            f"{folder / 'report.json'} is not a ropelens report: pass directories written by "
            "`ropelens report`"
        )
    for name in ("energy", "band_statistics", "head_taxonomy", "sinks_layers"):
        f = folder / f"{name}.csv"
        out[name] = _read_table(f) if f.is_file() else None
    if out["energy"] is None or out["band_statistics"] is None:
        raise InputError(
            f"{folder} lacks energy.csv or band_statistics.csv: re-run `ropelens report` with "
            "this version"
        )
    layers = ((out["report"].get("provenance") or {}).get("config") or {}).get("layers")
    for name in ("energy", "band_statistics"):
        _check_complete(folder / f"{name}.csv", out[name], layers)
    return out


# The columns compare reads from each table of a report, and those of them that hold numbers
# (True/False for bools).
_COLUMNS = {
    "energy": ("which", "scope", "layer", "head", "band", "energy_share"),
    "band_statistics": ("layer", "head", "band", "margin_share"),
    "head_taxonomy": ("layer", "head", "positional", "kind"),
    "sinks_layers": ("layer", "sinking_share"),
}
_NUMBERS = {"layer", "head", "energy_share", "margin_share", "sinking_share"}
_BOOLS = {"positional"}


def _read_table(f: Path) -> pd.DataFrame:
    """A report's CSV, checked whole first: a row cut short or a missing column is named, with its
    row and line."""
    fix = "write the report again with `ropelens report`"
    try:
        text = f.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise InputError(
            f"{f} is not UTF-8 text (byte {e.start}): the file is damaged; {fix}"
        ) from e
    reader = csv.reader(io.StringIO(text))
    try:
        header = next(reader, None)
        if not header:
            raise InputError(f"{f} is empty (no header row): {fix}")
        missing = [c for c in _COLUMNS[f.stem] if c not in header]
        if missing:
            raise InputError(
                f"{f} lacks the column{'s' * (len(missing) > 1)} {', '.join(missing)} (its header: "
                f"{', '.join(header)}): {fix}"
            )
        n = 0
        for row in reader:
            if not row:  # a blank line
                continue
            n += 1
            if len(row) != len(header):
                raise InputError(
                    f"{f} is truncated or damaged: row {n} (line {reader.line_num}) has "
                    f"{len(row)} of the header's {len(header)} fields: {fix}"
                )
    except csv.Error as e:
        raise InputError(f"{f} is damaged at line {reader.line_num} ({e}): {fix}") from e
    if n and not text.endswith("\n"):
        raise InputError(
            f"{f} is truncated: its last row (row {n}, line {reader.line_num}) ends without a "
            f"newline, so it was cut short: {fix}"
        )
    df = pd.read_csv(io.StringIO(text))
    for c in _COLUMNS[f.stem]:
        want = "True or False" if c in _BOOLS else "a number" if c in _NUMBERS else None
        ok = (
            pd.api.types.is_bool_dtype(df[c])
            if c in _BOOLS
            else pd.api.types.is_numeric_dtype(df[c])
        )
        if want is not None and not ok:
            bad = next(
                i
                for i, v in enumerate(df[c])
                if not (str(v) in ("True", "False") if c in _BOOLS else _is_number(v))
            )
            raise InputError(
                f"{f}: column {c} holds {df[c].iloc[bad]!r} at row {bad + 1}, not {want}: {fix}"
            )
    return df


def _check_complete(f: Path, df: pd.DataFrame, layers: Any) -> None:
    """A table cut short at a row boundary: a layer the report measured has no rows, or the last
    rows' (layer, head, ...) group lacks bands the other groups of its layer have."""
    fix = "write the report again with `ropelens report`"
    if isinstance(layers, list) and layers and all(isinstance(L, int) for L in layers):
        absent = sorted(set(layers) - {int(L) for L in df["layer"].unique()})
        if absent:
            raise InputError(
                f"{f} is truncated: it has no rows for layer{'s' * (len(absent) > 1)} "
                f"{', '.join(map(str, absent))} though the report measured layers "
                f"{', '.join(map(str, layers))} (its last row is row {len(df)}): {fix}"
            )
    keys = [k for k in _COLUMNS[f.stem] if k not in ("band", "energy_share", "margin_share")]
    if not len(df):
        return
    groups = df.groupby(keys, sort=False)["band"].apply(frozenset)
    last = tuple(df.iloc[-1][k] for k in keys)
    layer = df.iloc[-1]["layer"]
    others = [g for key, g in groups.items() if key != last and key[keys.index("layer")] == layer]
    full = max(others, key=len, default=frozenset())
    if groups[last] < full:
        where = ", ".join(f"{k} {v}" for k, v in zip(keys, last))
        raise InputError(
            f"{f} is truncated: its last rows ({where}) lack "
            f"band{'s' * (len(full - groups[last]) > 1)} "
            f"{', '.join(sorted(full - groups[last]))} that the rest of layer {layer} has (its "
            f"last row is row {len(df)}): {fix}"
        )


def _is_number(v: Any) -> bool:
    try:
        float(v)
    except (TypeError, ValueError):
        return False
    return True


def _layer_band(df: pd.DataFrame, value: str, **where: str) -> pd.DataFrame:
    for k, v in where.items():
        df = df[df[k] == v]
    return df.groupby(["layer", "band"], sort=False)[value].mean().unstack("band")


def _diff_map(a: pd.DataFrame, b: pd.DataFrame, what: str) -> tuple[pd.DataFrame, go.Figure]:
    if list(a.index) != list(b.index) or list(a.columns) != list(b.columns):
        raise InputError(
            f"the reports' {what} cover different layers or bands ({list(a.index)} × "
            f"{list(a.columns)} against {list(b.index)} × {list(b.columns)}): compare reports "
            "with the same layers and --bands"
        )
    d = b - a
    lim = float(d.abs().to_numpy().max()) or 1.0
    fig = go.Figure(
        go.Heatmap(
            z=d.to_numpy(),
            x=list(d.columns),
            y=list(d.index),
            colorscale="RdBu",
            zmid=0,
            zmin=-lim,
            zmax=lim,
            hovertemplate="layer %{y} · %{x}<br>Δ %{z:.3f}<extra></extra>",
        )
    )
    fig.update_yaxes(autorange="reversed", title_text="layer")
    fig.update_layout(title=f"{what}: B − A (heads averaged)")
    return d, style_figure(fig, height=420)


def _largest(d: pd.DataFrame) -> tuple[int, str, float]:
    s = d.stack()
    idx = s.abs().idxmax()
    return int(idx[0]), str(idx[1]), float(s[idx])


@dataclass
class _Comparison:
    """What the comparison page holds: findings, sections and the tables written beside it."""

    findings: list[str] = field(default_factory=list)
    sections: list[tuple[str, str]] = field(default_factory=list)  # (title, html)
    tables: dict[str, pd.DataFrame] = field(default_factory=dict)


def _report_name(report: dict[str, Any]) -> str:
    """``MODEL on CORPUS`` for a report read by :func:`_read`."""
    return f"{report['report']['model']['name']} on {report['report']['corpus'].get('name')}"


def _compare_energy(a: dict[str, Any], b: dict[str, Any], comparison: _Comparison) -> None:
    """Query energy share per layer and band (sink positions excluded), B − A."""
    energy_a = _layer_band(a["energy"], "energy_share", which="q", scope="no_sink")
    energy_b = _layer_band(b["energy"], "energy_share", which="q", scope="no_sink")
    diff, fig = _diff_map(energy_a, energy_b, "query energy share")
    comparison.tables["energy_diff"] = diff.reset_index()
    layer, band, change = _largest(diff)
    comparison.findings.append(
        f"Query energy moved most in layer {layer}, band {band}: {change:+.3f} of the layer's "
        "energy (B − A)."
    )
    comparison.sections.append(("Frequency usage", figure_html(fig)))


def _compare_margin(a: dict[str, Any], b: dict[str, Any], comparison: _Comparison) -> None:
    """Each band's share of the attended-key margin per layer, B − A."""
    margin_a = _layer_band(a["band_statistics"], "margin_share")
    margin_b = _layer_band(b["band_statistics"], "margin_share")
    diff, fig = _diff_map(margin_a, margin_b, "share of the attended-key margin")
    comparison.tables["margin_diff"] = diff.reset_index()
    layer, band, change = _largest(diff)
    comparison.findings.append(
        f"The attended-key margin moved most in layer {layer}, band {band}: {change:+.3f} of the "
        "margin."
    )
    comparison.sections.append(("Band decomposition", figure_html(fig)))


def _positional_heads(heads: pd.DataFrame) -> dict[tuple[int, int], str]:
    """(layer, head) -> kind of every positional head in a report's heads table."""
    return {(int(r.layer), int(r.head)): r.kind for r in heads[heads.positional].itertuples()}


def _compare_heads(a: dict[str, Any], b: dict[str, Any], comparison: _Comparison) -> None:
    """The positional heads B gained and lost against A (when both reports scored heads)."""
    if a["head_taxonomy"] is None or b["head_taxonomy"] is None:
        return
    heads_a, heads_b = _positional_heads(a["head_taxonomy"]), _positional_heads(b["head_taxonomy"])
    gained, lost = sorted(set(heads_b) - set(heads_a)), sorted(set(heads_a) - set(heads_b))
    rows = [{"layer": L, "head": h, "change": "gained", "kind": heads_b[L, h]} for L, h in gained]
    rows += [{"layer": L, "head": h, "change": "lost", "kind": heads_a[L, h]} for L, h in lost]
    frame = pd.DataFrame(rows, columns=["layer", "head", "change", "kind"])
    comparison.tables["heads_diff"] = frame
    comparison.findings.append(
        f"Positional heads: {len(heads_a)} in A, {len(heads_b)} in B; {len(gained)} gained and "
        f"{len(lost)} lost."
    )
    comparison.sections.append(
        ("Positional heads", table_html(frame, text_cols=("change", "kind")))
    )


def _compare_sinks(a: dict[str, Any], b: dict[str, Any], comparison: _Comparison) -> None:
    """The share of sinking heads per layer in A and B (when both reports measured sinks)."""
    if a["sinks_layers"] is None or b["sinks_layers"] is None:
        return
    shares = a["sinks_layers"][["layer", "sinking_share"]].merge(
        b["sinks_layers"][["layer", "sinking_share"]], on="layer", suffixes=(" A", " B")
    )
    shares["Δ"] = shares["sinking_share B"] - shares["sinking_share A"]
    comparison.tables["sinks_diff"] = shares
    top = shares.iloc[int(shares["Δ"].abs().to_numpy().argmax())]
    comparison.findings.append(
        f"Sinking heads: {shares['sinking_share A'].mean():.2f} of heads per layer in A, "
        f"{shares['sinking_share B'].mean():.2f} in B; the largest change is layer "
        f"{int(top.layer)} ({top['Δ']:+.2f})."
    )
    fig = go.Figure(
        [go.Bar(x=shares.layer, y=shares[f"sinking_share {k}"], name=k) for k in ("A", "B")]
    )
    fig.update_layout(title="share of heads that sink, per layer", barmode="group")
    fig.update_xaxes(title_text="layer", type="category")  # a bar per measured layer
    comparison.sections.append(("Attention sinks", figure_html(style_figure(fig, height=360))))


def _comparison_html(comparison: _Comparison, name_a: str, name_b: str) -> str:
    """The comparison page: what changed, then one section per comparison."""
    sections = comparison.sections
    body = (
        '<section id="findings"><h2>What changed</h2><ul>'
        + "".join(f"<li>{esc(f)}</li>" for f in comparison.findings)
        + "</ul></section>"
        + "".join(
            f'<section id="s{i}"><h2>{esc(t)}</h2>{h}</section>'
            for i, (t, h) in enumerate(sections)
        )
    )
    return page(
        title="ropelens comparison",
        subtitle=f"A: <b>{esc(name_a)}</b> · B: <b>{esc(name_b)}</b> · B − A",
        nav=[
            ("findings", "What changed", True),
            *((f"s{i}", t, True) for i, (t, _) in enumerate(sections)),
        ],
        body=body,
        footer="ropelens compare",
        plotly_js=get_plotlyjs(),
    )


def _write_comparison(
    out_dir: Path, tables: dict[str, pd.DataFrame], summary: dict[str, Any], html: str
) -> None:
    """Write the tables, ``compare.json`` and ``index.html`` into ``out_dir``, each atomically."""
    out_dir.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".ropelens-compare-", dir=out_dir))
    try:
        for key, frame in tables.items():
            frame.to_csv(tmp / f"{key}.csv", index=False)
        (tmp / "compare.json").write_text(json.dumps(summary, indent=1))
        (tmp / "index.html").write_text(html, encoding="utf-8")
        for f in [*(f"{key}.csv" for key in tables), "compare.json", "index.html"]:
            os.replace(tmp / f, out_dir / f)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def compare_reports(
    a: str | os.PathLike[str], b: str | os.PathLike[str], out: str | os.PathLike[str]
) -> Path:
    """Write the comparison page of report directories ``a`` and ``b`` into ``out`` (atomically per
    file)."""
    report_a, report_b = _read(Path(a)), _read(Path(b))
    for flag, folder in (("A", a), ("B", b)):
        if Path(out).expanduser().resolve() == Path(folder).expanduser().resolve():
            raise InputError(
                f"the output directory {out} is report {flag}: writing there would mix the "
                "comparison into the report; pass another --out"
            )
    check_output_path(out, "--out", directory=True)
    name_a, name_b = _report_name(report_a), _report_name(report_b)
    comparison = _Comparison()
    for compare in (_compare_energy, _compare_margin, _compare_heads, _compare_sinks):
        compare(report_a, report_b, comparison)
    summary = {
        "a": str(a),
        "b": str(b),
        "a_model": name_a,
        "b_model": name_b,
        "findings": comparison.findings,
        "tables": [f"{key}.csv" for key in comparison.tables],
    }
    out_dir = Path(out)
    html = _comparison_html(comparison, name_a, name_b)
    _write_comparison(out_dir, comparison.tables, summary, html)
    return out_dir
