"""The trajectory figure: each structure's metric against training step, with the step it appears at
marked."""

from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from ropelens.analyses.trajectory import Trajectory
from ropelens.errors import InputError
from ropelens.plots.style import readable_log_axes

__all__ = ["trajectory_figure"]


def trajectory_figure(
    traj: Trajectory, thresholds: dict[str, float] | None = None, *, log_steps: bool | None = None
) -> go.Figure:
    """One panel per structure: its model-wide metric at each checkpoint, the threshold (dotted) and
    the emergence step (:meth:`Trajectory.emergence`, dashed vertical line).

    ``log_steps``: a log step axis (None: when the first step is positive and the last is ≥ 100× it,
    as Pythia's revisions are).
    """
    em = traj.emergence(thresholds)
    if em.empty:
        raise InputError(
            "this trajectory measured none of the tracked structures' metrics: measure one of "
            f"{', '.join(s.analysis for s in traj.structures)}"
        )
    steps = traj.steps
    if log_steps is None:
        log_steps = steps[0] > 0 and steps[-1] >= 100 * steps[0]
    fig = make_subplots(
        rows=len(em),
        cols=1,
        shared_xaxes=True,
        vertical_spacing=0.06,
        subplot_titles=[f"{r.structure} — {r.metric}" for r in em.itertuples()],
    )
    for i, r in enumerate(em.itertuples(), start=1):
        v = traj.series(r.metric)
        fig.add_trace(
            go.Scatter(
                x=v.index.tolist(),
                y=v.tolist(),
                mode="lines+markers",
                name=r.structure,
                hovertemplate="step %{x:,}<br>" + r.metric + " %{y:.4g}<extra></extra>",
            ),
            row=i,
            col=1,
        )
        fig.add_hline(
            y=r.threshold,
            line={"dash": "dot", "color": "#888", "width": 1},
            row=i,
            col=1,
            annotation_text=f"threshold {r.threshold:g}",
            annotation_position="top left",
        )
        if not pd.isna(r.step):
            fig.add_vline(
                x=int(r.step),
                line={"dash": "dash", "color": "#c0392b", "width": 1.5},
                row=i,
                col=1,
                annotation_text=f"appears at step {int(r.step):,}",
                annotation_position="top right",
            )
        fig.update_yaxes(title_text=r.metric, row=i, col=1)
    fig.update_xaxes(type="log" if log_steps else "linear")
    fig.update_xaxes(title_text="training step", row=len(em), col=1)
    fig.update_layout(
        height=230 * len(em) + 80,
        showlegend=False,
        title=f"Structures over training — {traj.provenance.model}",
    )
    return readable_log_axes(fig)
