"""The trajectory page: one self-contained HTML file (plotly.js embedded once), its table and its
JSON."""

from __future__ import annotations

from pathlib import Path

from ropelens.analyses.trajectory import Trajectory
from ropelens.plots.style import style_figure
from ropelens.plots.trajectory import trajectory_figure
from ropelens.report import html as H
from ropelens.results.serialize import atomic_write_text

__all__ = ["FILES", "trajectory_page", "write_trajectory"]

FILES = ("trajectory.json", "trajectory.csv", "trajectory.html")


def trajectory_page(traj: Trajectory) -> str:
    """The whole page as one HTML string: findings, the figure, the emergence table, the
    checkpoints."""
    import plotly.offline

    prov = traj.provenance
    em = traj.emergence()
    rule = (
        "A structure appears at the first checkpoint whose model-wide metric is at or above its "
        "threshold and stays there at every later checkpoint."
    )
    structures = H.table_html(
        em.assign(
            meaning=[
                next(s.meaning for s in traj.structures if s.metric == m) for m in em["metric"]
            ]
        ),
        text_cols=("structure", "metric", "meaning"),
    )
    cks = H.table_html(
        traj.to_frame()[["step", "checkpoint"]]
        .drop_duplicates()
        .assign(
            seconds=[round(s, 1) for s in traj.seconds]
            if len(traj.seconds) == len(traj.checkpoints)
            else None
        ),
        text_cols=("checkpoint",),
    )
    findings = (
        '<ul class="findings">'
        + "".join(f"<li>{H.esc(f.text)}</li>" for f in traj.findings())
        + "</ul>"
    )
    fig = H.figure_html(style_figure(trajectory_figure(traj)), caption=H.esc(rule))
    sections = [
        ("findings", "Findings", findings),
        ("figure", "Metrics over training", fig),
        ("emergence", "When each structure appears", f"<p>{H.esc(rule)}</p>{structures}"),
        ("checkpoints", "Checkpoints", cks),
        (
            "provenance",
            "Provenance",
            H.kv_table(
                [
                    ("model", H.esc(prov.model)),
                    ("corpus", H.esc(prov.corpus)),
                    ("tokens per analysis", H.number(prov.n_tokens)),
                    ("window", H.number(prov.n_ctx)),
                    ("analyses", H.esc(", ".join(traj.analyses))),
                    ("seconds", H.number(prov.seconds)),
                    ("versions", H.esc(", ".join(f"{k} {v}" for k, v in prov.versions.items()))),
                    ("commit", H.esc(prov.commit or "unknown")),
                    ("files", " ".join(f"<code>{n}</code>" for n in FILES)),
                ]
            ),
        ),
    ]
    body = "\n".join(f'<section id="{k}"><h2>{H.esc(t)}</h2>{b}</section>' for k, t, b in sections)
    return H.page(
        title=f"ropelens trajectory — {prov.model}",
        subtitle=f"<b>{len(traj.checkpoints)}</b> checkpoints · steps {traj.steps[0]:,} → "
        f"{traj.steps[-1]:,}",
        nav=[(k, t, True) for k, t, _ in sections],
        body=body,
        plotly_js=plotly.offline.get_plotlyjs(),
        footer="Made with ropelens. Self-contained: works offline; the numbers are in "
        "<code>trajectory.json</code> and <code>trajectory.csv</code> beside this page.",
    )


def write_trajectory(traj: Trajectory, out: str | Path) -> Path:
    """Write ``trajectory.json``, ``trajectory.csv`` (the tidy table) and ``trajectory.html`` into
    ``out``, each atomically; returns the page's path."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    traj.save(out / "trajectory.json")
    atomic_write_text(out / "trajectory.csv", traj.to_frame().to_csv(index=False))
    atomic_write_text(out / "trajectory.html", trajectory_page(traj))
    return out / "trajectory.html"
