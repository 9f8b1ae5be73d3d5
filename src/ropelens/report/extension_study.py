"""The context-extension study's page: one self-contained HTML file, its JSON and a CSV per
table."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import plotly.offline

from ropelens.analyses.extension_study import ExtensionStudy, ranking
from ropelens.plots.extension_study import (
    attention_figure,
    loss_figure,
    method_label,
    passkey_figure,
    planes_figure,
)
from ropelens.report import html as H
from ropelens.results.findings import Finding
from ropelens.results.serialize import atomic_write_text

__all__ = ["SECTIONS", "TABLES", "study_page", "write_study"]

SECTIONS = (
    ("summary", "Summary"),
    ("loss", "Loss by length"),
    ("passkey", "Passkey retrieval"),
    ("attention", "Attention entropy and divergence"),
    ("planes", "What each method does to every plane"),
    ("predictors", "What the base predicts"),
    ("provenance", "Provenance"),
)
TABLES = ("loss", "passkey", "attention", "attention_heads", "planes", "predictors", "ranking")


def _tables(study: ExtensionStudy) -> dict[str, pd.DataFrame]:
    """The study's tables by name (:data:`TABLES`), methods ranked best first."""
    rank = pd.DataFrame(ranking(study))
    if not rank.empty:
        rank.insert(0, "rank", range(1, len(rank) + 1))
        rank["limit"] = [study.in_distribution_limit(m) for m in rank["method"]]
    return {
        "loss": study.loss_frame(),
        "passkey": study.passkey_frame(),
        "attention": study.attention_frame(),
        "attention_heads": study.attention_heads_frame(),
        "planes": study.planes_frame(),
        "predictors": study.predictors_frame(),
        "ranking": rank,
    }


def _findings_html(findings: list[Finding], section: str) -> str:
    """The study's findings for one section as a list (empty when it has none)."""
    texts = [f.text for f in findings if f.section == section]
    if not texts:
        return ""
    return '<ul class="findings">' + "".join(f"<li>{H.esc(t)}</li>" for t in texts) + "</ul>"


def _by_method_label(frame: pd.DataFrame) -> pd.DataFrame:
    """A table with each method shown by its label (the ``label`` column becomes ``method``)."""
    return frame.drop(columns=["method"]).rename(columns={"label": "method"})


def _summary_html(tables: dict[str, pd.DataFrame]) -> str:
    """The methods ranked, with what the ranking means."""
    lead = (
        '<p class="lead">Methods ranked by passkey recall at the longest passkey length, then by '
        "loss at the target. <i>limit</i>: the longest input whose angles all stay within "
        "training (per-plane view).</p>"
    )
    rank = tables["ranking"]
    if rank.empty:
        return lead
    rank = rank.assign(method=[method_label(m) for m in rank["method"]])
    return lead + H.table_html(rank, text_cols=("method",))


def _loss_html(study: ExtensionStudy, tables: dict[str, pd.DataFrame]) -> str:
    """Loss by length per method: the figure and its table."""
    caption = (
        "Mean next-token loss over the same windows for every method; bars: 95% bootstrap CI "
        "over windows."
    )
    return H.figure_html(loss_figure(study), caption) + H.table_html(
        _by_method_label(tables["loss"]), text_cols=("method", "same_as")
    )


def _passkey_html(study: ExtensionStudy, tables: dict[str, pd.DataFrame]) -> str:
    """Passkey accuracy per method, length and depth: the figure and its table."""
    if not study.passkey_cells:
        return '<p class="note">No passkey lengths were measured.</p>'
    return H.figure_html(passkey_figure(study)) + H.table_html(
        _by_method_label(tables["passkey"]), text_cols=("method", "answers")
    )


def _attention_html(study: ExtensionStudy, tables: dict[str, pd.DataFrame]) -> str:
    """Attention entropy and divergence per method, length and layer kind."""
    if not study.attention_cells:
        return '<p class="note">No attention was measured.</p>'
    caption = (
        "Entropy: −Σ p ln p of every query row, averaged over the layers, heads and rows of a "
        "kind. JS: the Jensen–Shannon divergence of each row from the unmodified model's row on "
        "the same tokens, within the native context."
    )
    lead = (
        '<p class="lead">Per method, length and layer kind: mean row entropy, KL(method ‖ '
        "unmodified) and JS divergence from the unmodified model's attention (nats; lengths within "
        "the native context), and the mean matrix entropy of the heads' post-RoPE query Gram "
        "(entropy of its normalised eigenvalues; per head in <code>attention_heads.csv</code>).</p>"
    )
    table = H.table_html(
        _by_method_label(tables["attention"]), text_cols=("method", "kind", "same_as")
    )
    return H.figure_html(attention_figure(study), caption) + lead + table


def _planes_html(study: ExtensionStudy, tables: dict[str, pd.DataFrame]) -> str:
    """What each method does to every plane: a figure per layer kind, and the roles counted."""
    planes = tables["planes"]
    counts = (
        planes.groupby(["kind", "variant", "role"]).size().unstack(fill_value=0).reset_index()
        if not planes.empty
        else planes
    )
    kinds = dict.fromkeys(p["kind"] for p in study.planes)
    figures = "".join(H.figure_html(planes_figure(study, kind)) for kind in kinds)
    return figures + H.table_html(counts, text_cols=("kind", "variant"))


def _provenance_html(study: ExtensionStudy) -> str:
    """Where the study's numbers come from: model, corpus, settings, versions, time and files."""
    prov, settings = study.provenance, study.provenance.config
    corpus = f"{H.esc(prov.corpus)} <code>{H.esc(prov.corpus_sha256 or '–')}</code>"
    run_time = f"{prov.seconds or 0:.1f} s ({settings.get('cells_reused', 0)} cells read from disk)"
    files = ("study.json", *(f"{t}.csv" for t in TABLES))
    return H.kv_table(
        [
            ("model", H.esc(prov.model)),
            ("corpus", corpus),
            ("settings", "<code>" + H.esc(json.dumps(settings)) + "</code>"),
            ("variants", "<code>" + H.esc(json.dumps(study.variants)) + "</code>"),
            ("versions", H.esc(", ".join(f"{k} {v}" for k, v in prov.versions.items()))),
            ("commit", f"<code>{H.esc(prov.commit or '–')}</code>"),
            ("created", H.esc(prov.created)),
            ("run time", run_time),
            ("files", " ".join(f"<code>{name}</code>" for name in files)),
        ]
    )


def study_page(study: ExtensionStudy) -> str:
    """The whole page as one HTML string (plotly.js embedded once, nothing fetched)."""
    tables = _tables(study)
    findings = study.findings()
    drawn = {
        "summary": _summary_html(tables),
        "loss": _loss_html(study, tables),
        "passkey": _passkey_html(study, tables),
        "attention": _attention_html(study, tables),
        "planes": _planes_html(study, tables),
        "predictors": H.table_html(tables["predictors"], text_cols=("kind", "layers", "rope_type")),
    }
    # a section's findings lead it; a section with nothing measured shows its note alone
    measured = {"passkey": study.passkey_cells, "attention": study.attention_cells}
    body = {
        key: (_findings_html(findings, key) if measured.get(key, True) else "") + html
        for key, html in drawn.items()
    }
    body["provenance"] = _provenance_html(study)
    blocks = [f'<section id="{k}"><h2>{H.esc(t)}</h2>{body[k]}</section>' for k, t in SECTIONS]
    lengths = ", ".join(f"{n:,}" for n in study.lengths)
    return H.page(
        title=f"ropelens context extension — {study.provenance.model}",
        subtitle=f"<b>{study.native:,}</b> → <b>{study.target:,}</b> tokens · "
        f"{len(study.methods)} methods · lengths {lengths}",
        nav=[(k, t, True) for k, t in SECTIONS],
        body="\n".join(blocks),
        plotly_js=plotly.offline.get_plotlyjs(),
        footer="Made with ropelens. Self-contained: works offline; the numbers are in "
        "<code>study.json</code> and the CSV files beside this page.",
    )


def write_study(study: ExtensionStudy, out: str | Path) -> Path:
    """Write ``study.json``, a CSV per table and ``index.html`` (last) into ``out``, each
    atomically."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    for name, frame in _tables(study).items():
        atomic_write_text(out / f"{name}.csv", frame.to_csv(index=False))
    study.save(out / "study.json")
    atomic_write_text(out / "index.html", study_page(study))
    return out / "index.html"
