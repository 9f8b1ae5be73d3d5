"""The context-extension study's page: one self-contained HTML file, its JSON and a CSV per table."""

from __future__ import annotations

import json
from pathlib import Path

from ropelens.analyses.extension_study import ExtensionStudy
from ropelens.plots.extension_study import (
    attention_figure,
    loss_figure,
    method_label,
    passkey_figure,
    planes_figure,
)
from ropelens.report import html as H
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


def _tables(study: ExtensionStudy) -> dict:
    import pandas as pd

    from ropelens.analyses.extension_study import ranking

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


def study_page(study: ExtensionStudy) -> str:
    """The whole page as one HTML string (plotly.js embedded once, nothing fetched)."""
    import plotly.offline

    tables = _tables(study)
    findings = study.findings()
    by_section: dict[str, list] = {}
    for f in findings:
        by_section.setdefault(f.section, []).append(f)

    def items(section: str) -> str:
        fs = by_section.get(section, [])
        return (
            '<ul class="findings">' + "".join(f"<li>{H.esc(f.text)}</li>" for f in fs) + "</ul>"
            if fs
            else ""
        )

    loss = tables["loss"].drop(columns=["method"]).rename(columns={"label": "method"})
    rank = tables["ranking"]
    if not rank.empty:
        rank = rank.assign(method=[method_label(m) for m in rank["method"]])
    pk = tables["passkey"]
    planes_counts = (
        tables["planes"]
        .groupby(["kind", "variant", "role"])
        .size()
        .unstack(fill_value=0)
        .reset_index()
        if not tables["planes"].empty
        else tables["planes"]
    )
    s = study.provenance.config
    body = {
        "summary": items("summary")
        + '<p class="lead">Methods ranked by passkey recall at the longest passkey '
        "length, then by loss at the target. <i>limit</i>: the longest input whose angles all stay within "
        "training (per-plane view).</p>"
        + (H.table_html(rank, text_cols=("method",)) if not rank.empty else ""),
        "loss": items("loss")
        + H.figure_html(
            loss_figure(study),
            "Mean next-token loss over the same windows for "
            "every method; bars: 95% bootstrap CI over windows.",
        )
        + H.table_html(loss, text_cols=("method", "same_as")),
        "passkey": (
            items("passkey")
            + H.figure_html(passkey_figure(study))
            + H.table_html(
                pk.drop(columns=["method"]).rename(columns={"label": "method"}),
                text_cols=("method", "answers"),
            )
        )
        if study.passkey_cells
        else '<p class="note">No passkey lengths were measured.</p>',
        "attention": (
            items("attention")
            + H.figure_html(
                attention_figure(study),
                "Entropy: −Σ p ln p of every query row, averaged over the layers, heads and "
                "rows of a kind. JS: the Jensen–Shannon divergence of each row from the unmodified model's row on the same "
                "tokens, within the native context.",
            )
            + '<p class="lead">Per method, length and layer kind: mean row entropy, KL(method ‖ unmodified) and JS '
            "divergence from the unmodified model's attention (nats; lengths within the native context), and the mean "
            "matrix entropy of the heads' post-RoPE query Gram (entropy of its normalised eigenvalues; per head in "
            "<code>attention_heads.csv</code>).</p>"
            + H.table_html(
                tables["attention"].drop(columns=["method"]).rename(columns={"label": "method"}),
                text_cols=("method", "kind", "same_as"),
            )
        )
        if study.attention_cells
        else '<p class="note">No attention was measured.</p>',
        "planes": items("planes")
        + "".join(
            H.figure_html(planes_figure(study, k))
            for k in dict.fromkeys(p["kind"] for p in study.planes)
        )
        + H.table_html(planes_counts, text_cols=("kind", "variant")),
        "predictors": items("predictors")
        + H.table_html(tables["predictors"], text_cols=("kind", "layers", "rope_type")),
        "provenance": H.kv_table(
            [
                ("model", H.esc(study.provenance.model)),
                (
                    "corpus",
                    f"{H.esc(study.provenance.corpus)} <code>{H.esc(study.provenance.corpus_sha256 or '–')}</code>",
                ),
                ("settings", "<code>" + H.esc(json.dumps(s)) + "</code>"),
                ("variants", "<code>" + H.esc(json.dumps(study.variants)) + "</code>"),
                (
                    "versions",
                    H.esc(", ".join(f"{k} {v}" for k, v in study.provenance.versions.items())),
                ),
                ("commit", f"<code>{H.esc(study.provenance.commit or '–')}</code>"),
                ("created", H.esc(study.provenance.created)),
                (
                    "run time",
                    f"{study.provenance.seconds or 0:.1f} s ({s.get('cells_reused', 0)} cells read from disk)",
                ),
                (
                    "files",
                    " ".join(
                        f"<code>{n}</code>" for n in ("study.json", *(f"{t}.csv" for t in TABLES))
                    ),
                ),
            ]
        ),
    }
    blocks = [f'<section id="{k}"><h2>{H.esc(t)}</h2>{body[k]}</section>' for k, t in SECTIONS]
    return H.page(
        title=f"ropelens extension-planes extension — {study.provenance.model}",
        subtitle=f"<b>{study.native:,}</b> → <b>{study.target:,}</b> tokens · "
        f"{len(study.methods)} methods · lengths {', '.join(f'{n:,}' for n in study.lengths)}",
        nav=[(k, t, True) for k, t in SECTIONS],
        body="\n".join(blocks),
        plotly_js=plotly.offline.get_plotlyjs(),
        footer="Made with ropelens. Self-contained: works offline; the numbers are in "
        "<code>study.json</code> and the CSV files beside this page.",
    )


def write_study(study: ExtensionStudy, out: str | Path) -> Path:
    """Write ``study.json``, a CSV per table and ``index.html`` (last) into ``out``, each atomically."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    for name, frame in _tables(study).items():
        atomic_write_text(out / f"{name}.csv", frame.to_csv(index=False))
    study.save(out / "study.json")
    atomic_write_text(out / "index.html", study_page(study))
    return out / "index.html"
