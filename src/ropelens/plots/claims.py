"""The claims figure: a forest plot, one panel per claim, the claimed set's effect beside each
control's with their intervals, the verdict in the panel's title and the claimed point's colour."""

from __future__ import annotations

import math

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from ropelens.claims.result import (
    DOES_NOT_HOLD,
    HOLDS,
    INCONCLUSIVE,
    NOT_APPLICABLE,
    ClaimRow,
    ClaimsResult,
    ControlOutcome,
)
from ropelens.plots.style import style_figure

__all__ = [
    "CLAIMED_SET",
    "CONTROL_COLORS",
    "VERDICT_COLORS",
    "claims_figure",
    "control_color",
    "x_axis_title",
]

CLAIMED_SET = "claimed set"
# one colour per verdict and one per control, none shared, so no two legend entries look alike
VERDICT_COLORS = {
    HOLDS: "#2ca02c",
    DOES_NOT_HOLD: "#d62728",
    INCONCLUSIVE: "#ff7f0e",
    NOT_APPLICABLE: "#7f7f7f",
}
CONTROL_COLORS = (
    "#1f77b4",
    "#9467bd",
    "#17becf",
    "#8c564b",
    "#e377c2",
    "#bcbd22",
)
PANEL_PX = 34  # height of one row (the claimed set or a control) of a panel
GAP_PX = 92  # room between panels for the next panel's title and this one's axis title
LEGEND_PX = 60  # room below the last panel's axis title for the legend


def x_axis_title(row: ClaimRow) -> str:
    """The x axis of a claim's panel: the metric, as a change from the unmodified model where the
    claim has one."""
    if math.isfinite(row.baseline):
        change = row.metric if row.metric.startswith("Δ") else f"Δ {row.metric}"
        return f"{change} (unmodified: {row.baseline:.3g})"
    return row.metric


def _interval(effect: float, lo: float, hi: float) -> tuple[float, float]:
    """The distances from ``effect`` to the interval's ends, as error bars take them (NaN: none)."""
    return hi - effect, effect - lo


def _p_text(control: ControlOutcome) -> str:
    if control.withheld:
        return f"p withheld: {control.withheld}"
    return (
        f"p {control.p:.3g} (BH {control.p_adjusted:.3g}, floor {control.p_floor:.3g}, "
        f"{control.n_distinct} distinct of {control.n_draws} draws)"
    )


def _claimed_trace(row: ClaimRow, legend: set[str]) -> go.Scatter:
    """The claimed set's effect and its 95% CI over windows, coloured by the verdict."""
    above, below = _interval(row.effect, row.lo, row.hi)
    color = VERDICT_COLORS[row.verdict]
    name = f"{CLAIMED_SET}: {row.verdict}"
    trace = go.Scatter(
        x=[row.effect],
        y=[CLAIMED_SET],
        mode="markers",
        name=name,
        legendgroup=name,
        showlegend=name not in legend,
        marker={"color": color, "symbol": "diamond", "size": 12},
        error_x={"type": "data", "symmetric": False, "array": [above], "arrayminus": [below]},
        customdata=[[row.lo, row.hi, row.verdict, row.reason]],
        hovertemplate=f"<b>{row.name}</b><br>effect %{{x:.4g}} [%{{customdata[0]:.4g}}, "
        "%{customdata[1]:.4g}] (95% CI over windows)<br>%{customdata[2]}: %{customdata[3]}"
        "<extra></extra>",
    )
    legend.add(name)
    return trace


def _control_trace(
    row: ClaimRow, control: ControlOutcome, color: str, legend: set[str]
) -> go.Scatter:
    """A control's mean effect over its draws and the middle 95% of the draws' effects."""
    above, below = _interval(control.effect, control.lo, control.hi)
    trace = go.Scatter(
        x=[control.effect],
        y=[control.name],
        mode="markers",
        name=control.name,
        legendgroup=control.name,
        showlegend=control.name not in legend,
        marker={"color": color, "symbol": "circle", "size": 9},
        error_x={"type": "data", "symmetric": False, "array": [above], "arrayminus": [below]},
        customdata=[[control.lo, control.hi, _p_text(control)]],
        hovertemplate=f"<b>{row.name}</b>: {control.name}<br>mean of the draws %{{x:.4g}}, "
        "middle 95% of draws [%{customdata[0]:.4g}, %{customdata[1]:.4g}]<br>%{customdata[2]}"
        "<extra></extra>",
    )
    legend.add(control.name)
    return trace


def _panel_title(row: ClaimRow) -> str:
    color = VERDICT_COLORS[row.verdict]
    return f'<b>{row.name}</b> — <span style="color:{color}"><b>{row.verdict}</b></span>'


def control_color(index: int) -> str:
    """The colour of the ``index``-th control: the palette's, then hues a golden angle apart (never
    a colour another control or a verdict has)."""
    if index < len(CONTROL_COLORS):
        return CONTROL_COLORS[index]
    return f"hsl({(index * 137.508) % 360:.1f}, 60%, 40%)"


def _control_colors(result: ClaimsResult) -> dict[str, str]:
    """A colour per control name, in the order the controls first appear."""
    names = dict.fromkeys(c.name for r in result.rows for c in r.controls)
    return {name: control_color(i) for i, name in enumerate(names)}


def _panel_rows(row: ClaimRow) -> int:
    return 1 + len(row.controls)


def _add_panel(
    fig: go.Figure, index: int, row: ClaimRow, colors: dict[str, str], legend: set[str]
) -> None:
    """One claim's panel: its points, the threshold line, the metric on the x axis, and the reason
    written in where the claim has no effect to draw."""
    if not math.isfinite(row.effect):
        # in paper coordinates: plotly.js places a domain reference to an axis with no trace on
        # the first subplot
        bottom, top = fig.get_subplot(index, 1).yaxis.domain
        fig.add_annotation(
            text=f"{row.verdict}: {row.reason}",
            xref="paper",
            yref="paper",
            x=0.5,
            y=(bottom + top) / 2,
            showarrow=False,
            font={"color": VERDICT_COLORS[row.verdict]},
        )
        fig.update_xaxes(visible=False, row=index, col=1)
        fig.update_yaxes(visible=False, row=index, col=1)
        return
    fig.add_trace(_claimed_trace(row, legend), row=index, col=1)
    for control in row.controls:
        fig.add_trace(_control_trace(row, control, colors[control.name], legend), row=index, col=1)
    fig.add_vline(
        x=row.threshold, line={"color": "#7a8294", "width": 1, "dash": "dot"}, row=index, col=1
    )
    categories = [CLAIMED_SET, *(c.name for c in row.controls)]
    fig.update_yaxes(
        type="category",
        categoryorder="array",
        categoryarray=categories,
        autorange="reversed",
        row=index,
        col=1,
    )
    fig.update_xaxes(title_text=x_axis_title(row), zeroline=False, row=index, col=1)


def claims_figure(result: ClaimsResult) -> go.Figure:
    """A forest plot of a :class:`ropelens.claims.ClaimsResult`: one panel per claim, each on its
    own metric's axis.

    In each panel the claimed set's effect (a diamond, coloured by the verdict) with its 95%
    bootstrap CI over windows sits above each control's mean effect over its draws (a circle, one
    colour per control) with the middle 95% of the draws' effects; the dotted line is the value the
    claim compares its effect with. The verdict is written in the panel's title; a claim with no
    effect to draw (not applicable) shows its reason instead.
    """
    rows = result.rows
    if not rows:
        fig = go.Figure()
        fig.add_annotation(text="no claims in this result", showarrow=False)
        return style_figure(fig, height=200)
    heights = [PANEL_PX * _panel_rows(r) for r in rows]
    total = sum(heights) + GAP_PX * len(rows) + 40
    fig = make_subplots(
        rows=len(rows),
        cols=1,
        row_heights=heights,
        vertical_spacing=GAP_PX / total if len(rows) > 1 else 0.0,
        subplot_titles=[_panel_title(r) for r in rows],
    )
    colors = _control_colors(result)
    legend: set[str] = set()
    for index, row in enumerate(rows, start=1):
        _add_panel(fig, index, row, colors, legend)
    fig.update_annotations(font_size=12, selector={"xanchor": "center"})
    plot_px = total + 2 * LEGEND_PX
    fig.update_layout(
        title=f"Claims on {result.provenance.model}, {result.budget} budget<br><sup>each claimed "
        "set's effect (95% CI over windows) beside its controls' (mean and middle 95% of their "
        "draws); dotted: the value the claim is judged against</sup>",
        legend={
            "orientation": "h",
            "y": -LEGEND_PX / plot_px,
            "yanchor": "top",
            "x": 0,
            "xanchor": "left",
        },
    )
    style_figure(fig, height=plot_px + 130)
    fig.update_layout(margin={"t": 80, "b": 2 * LEGEND_PX})
    return fig
