"""Results of the experiment scripts, shown in the report when ``--experiments DIR`` points at them.

The scripts in ``experiments/`` write ``DIR/<name>/result.json``; the report reads them as they are
(never re-running anything) and shows the rows for the report's model, plus the model-independent
from-scratch training table. A missing experiment is named with the command that produces it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pandas as pd
import plotly.graph_objects as go

from ropelens.errors import InputError
from ropelens.plots.style import style_figure
from ropelens.report.html import esc, figure_html, table_html

__all__ = ["context_block", "load_experiments", "main_result", "prope_block"]

# result file pattern (under DIR) → what produces it
SOURCES = {
    "inference": (
        "truncated_rope_inference*/result.json",
        "python experiments/truncated_rope_inference.py",
    ),
    "training": (
        "truncated_rope_training*/result.json",
        "python experiments/truncated_rope_training.py",
    ),
    "ablation": ("band_ablation*/result.json", "python experiments/band_ablation.py"),
    "context": ("context_extension*/result.json", "python experiments/context_extension.py"),
}


def load_experiments(directory: str | Path | None) -> dict[str, list[dict[str, Any]]]:
    """Every result file found under ``directory``, by experiment (an empty dict when None)."""
    if directory is None:
        return {}
    root = Path(directory).expanduser()
    if not root.is_dir():
        raise NotADirectoryError(
            f"--experiments {root} is not a directory: pass the folder the experiment "
            "scripts wrote into (by default results/)"
        )
    found: dict[str, list[dict[str, Any]]] = {}
    for key, (pattern, _) in SOURCES.items():
        for path in sorted(root.glob(pattern)):
            try:
                found.setdefault(key, []).append(
                    {"path": str(path), **json.loads(path.read_text())}
                )
            except (OSError, json.JSONDecodeError) as e:
                raise InputError(
                    f"cannot read experiment result {path} ({e}): rerun the script that wrote it "
                    "or move the file aside"
                ) from e
    return found


def main_result(results: list[dict[str, Any]]) -> dict[str, Any]:
    """The run to show where one table is shown: a full run over a ``--quick`` one, then the
    newest."""

    def rank(r: dict[str, Any]) -> tuple[bool, str]:
        prov = r.get("provenance") or {}
        return (not (prov.get("config") or {}).get("quick", False), str(prov.get("created", "")))

    return max(results, key=rank)


def _missing(key: str) -> str:
    return (
        f'<p class="note">No <code>{esc(SOURCES[key][0])}</code> under the experiments folder; '
        f"<code>{esc(SOURCES[key][1])}</code> produces it.</p>"
    )


def _source(results: list[dict[str, Any]]) -> str:
    commits = {(r.get("provenance") or {}).get("commit") for r in results} - {None}
    files = ", ".join(f"<code>{esc(r['path'])}</code>" for r in results)
    return (
        f'<div class="caption">From {files}'
        + (f" (commit {esc(', '.join(c[:12] for c in sorted(commits)))})" if commits else "")
        + ".</div>"
    )


def _ci(
    row: dict[str, Any] | pd.Series, mean: str = "ppl", lo: str = "ppl_lo", hi: str = "ppl_hi"
) -> str:
    return f"{row[mean]:.4g} [{row[lo]:.4g}, {row[hi]:.4g}]"


def _inference(results: list[dict[str, Any]], model: str) -> tuple[str, pd.DataFrame]:
    rows = [r for res in results for r in res.get("table", []) if r["model"] == model]
    if not rows:
        return (
            '<p class="note">The inference sweep results hold no rows for '
            f"<b>{esc(model)}</b>.</p>",
            pd.DataFrame(),
        )
    df = pd.DataFrame(rows)
    df["variant_label"] = [
        {
            "PRoPE": f"p = {p:g}",
            "PRoPEReversed": f"reversed {p:g}",
            "PRoPEPartial": f"partial {p:g}",
        }.get(v, v)
        for v, p in zip(df.variant, df.p, strict=True)
    ]
    df["cell"] = [_ci(r) for _, r in df.iterrows()]
    order = {
        v: i
        for i, v in enumerate(
            sorted(df.variant_label.unique(), key=lambda s: (not s.startswith("p ="), s))
        )
    }
    html = []
    fig = go.Figure()
    for kind, sel in df.groupby("layer_kind", sort=True):
        pivot = sel.pivot_table(
            index="variant_label", columns="n_ctx", values="cell", aggfunc="first"
        ).fillna("–")
        pivot = pivot.loc[sorted(pivot.index, key=order.get)]
        windows = sel.groupby("n_ctx").n_windows.first().to_dict()
        pivot.columns = [f"L = {c} ({windows[c]} win.)" for c in pivot.columns]
        pivot = pivot.reset_index().rename(columns={"variant_label": "variant"})
        html.append(
            f"<h4>Layers truncated: {esc(kind)}</h4>"
            + table_html(pivot, text_cols=tuple(pivot.columns))
        )
        pr = sel[sel.variant == "PRoPE"]
        for n_ctx, line in pr.groupby("n_ctx"):
            line = line.sort_values("p")
            fig.add_trace(
                go.Scatter(x=line.p, y=line.ppl, mode="lines+markers", name=f"{kind}, L = {n_ctx}")
            )
    fig.update_xaxes(title_text="p (share of the highest frequencies kept)")
    fig.update_yaxes(title_text="perplexity", type="log")
    fig.update_layout(title=f"{model}: p-RoPE at inference by context length (experiment)")
    body = (
        f"<h3>Full inference sweep ({esc(model)})</h3><p>Perplexity [95% bootstrap CI over "
        "windows] on held-out English windows, per context length L.</p>"
        + figure_html(style_figure(fig, height=420))
        + "".join(html)
        + _source(results)
    )
    return body, df.drop(columns=["cell", "variant_label"])


def _training(results: list[dict[str, Any]]) -> tuple[str, pd.DataFrame]:
    res = main_result(results)
    table = res["table"]
    rows = [
        {
            "variant": k,
            "ppl at L": v["val"]["ppl"],
            "lo": v["val"]["lo"],
            "hi": v["val"]["hi"],
            "ppl at 2L": v["val_2x"]["ppl"],
            "lo (2L)": v["val_2x"]["lo"],
            "hi (2L)": v["val_2x"]["hi"],
            "Δ loss vs RoPE θ=10k": (v.get("vs_rope_10k") or {}).get("dloss"),
            "Δ lo": (v.get("vs_rope_10k") or {}).get("lo"),
            "Δ hi": (v.get("vs_rope_10k") or {}).get("hi"),
            "seeds": v["val"]["n"],
            "paper (Wiki)": v["paper_wiki"],
        }
        for k, v in sorted(table.items(), key=lambda kv: kv[1]["val"]["ppl"])
    ]
    df = pd.DataFrame(rows)
    cfg = ((res.get("provenance") or {}).get("config") or {}).get("base", {})
    shape = (
        f"{cfg.get('n_layers')} layers × d {cfg.get('d_model')}, {cfg.get('steps')} steps × "
        f"{cfg.get('batch_size')} × {cfg.get('seq_len')} tokens"
        if cfg
        else ""
    )
    body = (
        "<h3>From-scratch training (Barbero et al. Table 2, small)</h3><p>Llama-style models "
        f"{esc(shape)}, validation perplexity at the training length L and at 2L, mean over "
        "seeds with a 95% t-interval, and the loss difference to RoPE θ=10k paired by seed "
        "(same initialisation and data order); best first. The paper's column is its Wiki "
        "perplexity at 2B parameters.</p>"
        + table_html(df, text_cols=("variant",), formats={"seeds": lambda v: str(int(v))})
        + f"<p><b>{esc(res.get('verdict', ''))}</b></p>"
        + _source([res])
    )
    return body, df


def _ablation(results: list[dict[str, Any]], model: str) -> tuple[str, pd.DataFrame]:
    rows = [
        r
        for res in results
        for r in res.get("table", [])
        if r["model"] == model and r["layers"] == "all"
    ]
    planes = [r for res in results for r in res.get("planes", []) if r["model"] == model]
    if not rows and not planes:
        return "", pd.DataFrame()
    df = pd.DataFrame(
        [
            {
                "band": r["band"],
                "planes": f"{r['planes'][0]}–{r['planes'][-1]}" if r["planes"] else "–",
                "Δ loss": r["dloss"],
                "lo": r["lo"],
                "hi": r["hi"],
            }
            for r in rows
        ]
    )
    body = (
        f"<h3>Band ablation ({esc(model)})</h3><p>Loss change from zeroing a quartile band of "
        "planes in q and k (removing its logit terms, unlike truncation, which only stops it "
        "rotating) in every layer; band 0 holds the highest frequencies.</p>"
        + (table_html(df, text_cols=("planes",)) if rows else "")
    )
    if planes:
        fig = go.Figure(
            go.Scatter(
                x=[r["wavelength"] for r in planes],
                y=[r["dloss"] for r in planes],
                mode="markers+lines",
                text=[f"plane {r['plane']}" for r in planes],
                hovertemplate="%{text}: Δ %{y:.3f}<extra></extra>",
                error_y={
                    "type": "data",
                    "symmetric": False,
                    "array": [r["hi"] - r["dloss"] for r in planes],
                    "arrayminus": [r["dloss"] - r["lo"] for r in planes],
                },
            )
        )
        fig.update_xaxes(type="log", title_text="wavelength 2π/θ (tokens)")
        fig.update_yaxes(title_text="Δ loss (nats, 95% CI)")
        fig.update_layout(title="Zeroing one plane in every layer")
        body += figure_html(style_figure(fig, height=380))
    return body + _source(results), df


def prope_block(
    exps: dict[str, list[dict[str, Any]]], model: str
) -> tuple[str, dict[str, pd.DataFrame]]:
    """HTML and tables for the p-RoPE section from the experiments (empty when none were given)."""
    if not exps:
        return "", {}
    parts, tables = ['<h3 class="exp">From the experiment scripts</h3>'], {}
    if "inference" in exps:
        html, df = _inference(exps["inference"], model)
        parts.append(html)
        if len(df):
            tables["exp_prope_inference"] = df
    else:
        parts.append(_missing("inference"))
    if "training" in exps:
        html, df = _training(exps["training"])
        parts.append(html)
        tables["exp_prope_training"] = df
    else:
        parts.append(_missing("training"))
    if "ablation" in exps:
        html, df = _ablation(exps["ablation"], model)
        parts.append(html)
        if len(df):
            tables["exp_band_ablation"] = df
    return "".join(parts), tables


def context_block(exps: dict[str, list[dict[str, Any]]]) -> tuple[str, dict[str, pd.DataFrame]]:
    """HTML and the table for the context-extension section from the experiment (empty when none
    given)."""
    if not exps:
        return "", {}
    if "context" not in exps:
        return '<h3 class="exp">From the experiment scripts</h3>' + _missing("context"), {}
    res = main_result(exps["context"])
    df = pd.DataFrame(res["table"])
    df["cell"] = [_ci(r) for _, r in df.iterrows()]
    parts = ['<h3 class="exp">From the experiment scripts</h3>']
    methods = list(dict.fromkeys(df.method))
    for (stage, model), sel in df.groupby(["stage", "model"], sort=False):
        pivot = sel.pivot_table(
            index="method", columns="n_ctx", values="cell", aggfunc="first"
        ).fillna("–")
        pivot = pivot.loc[[m for m in methods if m in pivot.index]]
        pivot.columns = [f"L = {c}" for c in pivot.columns]
        pivot = pivot.reset_index()
        what = {
            "zero-shot": "no fine-tuning",
            "finetuned": "after a short fine-tune at the longest trained target",
            "native": "each method set for 4× the native context, measured at a length within it "
            "(its cost in distribution)",
        }.get(stage, stage)
        parts.append(
            f"<h4>{esc(model)}: {esc(what)}</h4>"
            + table_html(pivot, text_cols=tuple(pivot.columns))
        )
    zs = df[df.stage == "zero-shot"]
    if len(zs):
        fig = go.Figure()
        for m in methods:
            line = zs[zs.method == m].sort_values("n_ctx")
            if len(line):
                fig.add_trace(
                    go.Scatter(
                        x=line.n_ctx,
                        y=line.ppl,
                        name=m,
                        mode="lines+markers",
                        error_y={
                            "type": "data",
                            "symmetric": False,
                            "array": (line.ppl_hi - line.ppl).tolist(),
                            "arrayminus": (line.ppl - line.ppl_lo).tolist(),
                        },
                    )
                )
        fig.update_xaxes(type="log", title_text="evaluation length (tokens)")
        fig.update_yaxes(type="log", title_text="perplexity (95% CI)")
        fig.update_layout(title="Small model trained at L, evaluated beyond it (experiment)")
        parts.insert(1, figure_html(style_figure(fig, height=420)))
    parts.append(_source([res]))
    return "".join(parts), {"exp_context_extension": df.drop(columns=["cell"])}
