"""The context-extension study drawn: loss by length, attention, passkey accuracy and what each
method does to every plane."""

from __future__ import annotations

import math

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from ropelens.analyses.extension_study import METHODS, ExtensionStudy
from ropelens.plots.style import style_figure

__all__ = ["attention_figure", "loss_figure", "method_label", "passkey_figure", "planes_figure"]

_ROLE_COLOURS = {
    "kept": "#2e7d32",
    "interpolated": "#1f5fbf",
    "blended": "#8e6bd1",
    "extrapolated": "#c62828",
    "stopped": "#9e9e9e",
    "unrotated": "#d9d9d9",
}


def method_label(m: str) -> str:
    """A method's name as the study's pages and figures show it."""
    return METHODS.get(m, m)


def _vline(fig: go.Figure, x: float, text: str, dash: str, row: int | None = None) -> None:
    # log x axis: shapes take data values, annotations log10 values (as in
    # ropelens.plots.extension_planes.compare_figure)
    kw = {} if row is None else {"row": row, "col": 1}
    fig.add_vline(x=x, line_dash=dash, line_color="#7a8294", line_width=1, **kw)
    fig.add_annotation(
        x=math.log10(x),
        yref="paper",
        y=1.0,
        text=text,
        showarrow=False,
        textangle=-90,
        xanchor="right",
        yanchor="top",
        font={"size": 10, "color": "#5b6475"},
    )


def _predicted_lines(study: ExtensionStudy) -> list[tuple[float, str, str]]:
    """(length, label, dash) of the native context and the base's predicted limits within the
    plotted range."""
    lines = [(study.native, f"native {study.native:,}", "dash")]
    rows = study.predictors_frame()
    if not rows.empty:
        kind = rows["kind"].iloc[0]
        r = rows[rows["kind"] == kind]
        t = float(r["t_extra"].iloc[0])
        if math.isfinite(t) and t <= 2 * study.target:
            lines.append((t, f"Liu T_extra {t:,.0f}", "dot"))
        fails = [int(L) for L, h in zip(r["length"], r["men_bound_holds"], strict=True) if not h]
        if fails:
            lines.append((min(fails), f"Men bound fails {min(fails):,}", "dashdot"))
    return lines


def loss_figure(study: ExtensionStudy) -> go.Figure:
    """Mean loss by length per method (bootstrap CI over windows as error bars), with the native
    context, Liu et al.'s extrapolation limit and the first length whose base bound fails as
    vertical lines."""
    df = study.loss_frame()
    fig = go.Figure()
    for m in study.methods:
        g = df[df["method"] == m].sort_values("length")
        fig.add_trace(
            go.Scatter(
                x=g["length"],
                y=g["loss"],
                mode="lines+markers",
                name=method_label(m),
                error_y={
                    "type": "data",
                    "symmetric": False,
                    "array": g["loss_hi"] - g["loss"],
                    "arrayminus": g["loss"] - g["loss_lo"],
                },
                hovertemplate=f"{method_label(m)}<br>%{{x:,}} tokens<br>loss %{{y:.4f}} "
                "nats<extra></extra>",
            )
        )
    for x, text, dash in _predicted_lines(study):
        _vline(fig, x, text, dash)
    fig.update_layout(
        title=f"Loss by context length — {study.provenance.model}, methods set for "
        f"{study.native:,} → {study.target:,}",
        xaxis_type="log",
        xaxis_title="context length (tokens)",
        yaxis_title="mean loss (nats)",
        xaxis={"tickvals": list(study.lengths), "ticktext": [f"{n:,}" for n in study.lengths]},
    )
    return style_figure(fig, height=460)


def attention_figure(study: ExtensionStudy) -> go.Figure:
    """Per layer kind: mean attention entropy of the query rows by length per method (left), and the
    Jensen–Shannon divergence from the unmodified model's attention at the lengths within the native
    context (right)."""
    df = study.attention_frame()
    kinds = list(dict.fromkeys(df["kind"])) if not df.empty else []
    fig = make_subplots(
        rows=max(1, len(kinds)),
        cols=2,
        horizontal_spacing=0.1,
        vertical_spacing=0.12,
        subplot_titles=[
            t
            for k in kinds
            for t in (f"{k} layers: entropy (nats)", f"{k} layers: JS from unmodified (nats)")
        ],
    )
    for r, kind in enumerate(kinds, start=1):
        for m in study.methods:
            g = df[(df["method"] == m) & (df["kind"] == kind)].sort_values("length")
            near = g[g["length"] <= study.native]
            fig.add_trace(
                go.Scatter(
                    x=g["length"],
                    y=g["entropy"],
                    mode="lines+markers",
                    name=method_label(m),
                    legendgroup=m,
                    showlegend=r == 1,
                    hovertemplate=f"{method_label(m)}<br>%{{x:,}} tokens<br>entropy "
                    "%{y:.4f}<extra></extra>",
                ),
                row=r,
                col=1,
            )
            fig.add_trace(
                go.Scatter(
                    x=near["length"],
                    y=near["js"],
                    mode="lines+markers",
                    name=method_label(m),
                    legendgroup=m,
                    showlegend=False,
                    hovertemplate=f"{method_label(m)}<br>%{{x:,}} tokens<br>JS "
                    "%{y:.3g}<extra></extra>",
                ),
                row=r,
                col=2,
            )
        fig.update_xaxes(type="log", title_text="context length (tokens)", row=r)
    fig.update_layout(title=f"Attention per method — {study.provenance.model}")
    return style_figure(fig, height=320 * max(1, len(kinds)) + 80)


def passkey_figure(study: ExtensionStudy) -> go.Figure:
    """Passkey accuracy per method: one depth × length heatmap each, 0 red to 1 green."""
    df = study.passkey_frame()
    methods = list(study.methods)
    fig = make_subplots(
        rows=1,
        cols=len(methods),
        subplot_titles=[method_label(m) for m in methods],
        shared_yaxes=True,
        horizontal_spacing=0.02,
    )
    for i, m in enumerate(methods, start=1):
        g = df[df["method"] == m]
        z = [
            [
                float(g[(g["depth"] == d) & (g["length"] == L)]["accuracy"].iloc[0])
                for L in study.passkey_lengths
            ]
            for d in study.depths
        ]
        fig.add_trace(
            go.Heatmap(
                z=z,
                x=[f"{L:,}" for L in study.passkey_lengths],
                y=[f"{d:g}" for d in study.depths],
                zmin=0,
                zmax=1,
                colorscale="RdYlGn",
                showscale=i == len(methods),
                texttemplate="%{z:.0%}",
                hovertemplate=f"{method_label(m)}<br>%{{x}} tokens, depth %{{y}}<br>accuracy "
                "%{z:.2f}<extra></extra>",
            ),
            row=1,
            col=i,
        )
    fig.update_yaxes(autorange="reversed", title_text="depth", row=1, col=1)
    fig.update_layout(
        title=f"Passkey retrieval ({study.n_trials} trial(s) per cell) — x: prompt length (tokens)"
    )
    return style_figure(fig, height=320)


def planes_figure(study: ExtensionStudy, kind: str | None = None) -> go.Figure:
    """Wavelength per plane before and after each method (top) and what each does to each plane
    (bottom)."""
    views = study.plane_views(kind)
    kind = kind or study.planes[0]["kind"]
    roles = {p["method"]: p["roles"] for p in study.planes if p["kind"] == kind}
    fig = make_subplots(
        rows=2,
        cols=1,
        row_heights=[0.62, 0.38],
        vertical_spacing=0.12,
        subplot_titles=[
            "wavelength 2π/θ per plane (tokens)",
            "what each method does to each plane",
        ],
    )
    first = next(iter(views.values()))
    planes = list(range(len(first.categories)))
    fig.add_trace(
        go.Scatter(
            x=planes,
            y=first.wavelength_before.tolist(),
            name="trained",
            mode="lines",
            line={"color": "black", "dash": "dot"},
        ),
        row=1,
        col=1,
    )
    for m, v in views.items():
        if m != "none":
            fig.add_trace(
                go.Scatter(
                    x=planes,
                    y=v.wavelength_after.tolist(),
                    name=method_label(m),
                    mode="lines+markers",
                    marker={"size": 4},
                ),
                row=1,
                col=1,
            )
    for y, name in ((study.native, "native"), (study.target, "target")):
        # log y axis: the shape takes the value, the annotation its log10
        fig.add_shape(
            type="line",
            xref="x domain",
            x0=0,
            x1=1,
            yref="y",
            y0=y,
            y1=y,
            line={"dash": "dash", "color": "#7a8294", "width": 1},
        )
        fig.add_annotation(
            xref="x domain",
            x=0,
            yref="y",
            y=math.log10(y),
            text=f"{name} {y:,}",
            showarrow=False,
            xanchor="left",
            yanchor="bottom",
            font={"size": 10},
        )
    fig.update_yaxes(type="log", row=1, col=1)
    names = list(roles)
    for role, colour in _ROLE_COLOURS.items():
        xs = [i for m in names for i, r in enumerate(roles[m]) if r == role]
        ys = [method_label(m) for m in names for r in roles[m] if r == role]
        if xs:
            fig.add_trace(
                go.Scatter(
                    x=xs,
                    y=ys,
                    mode="markers",
                    name=role,
                    legendgroup="roles",
                    marker={"symbol": "square", "size": 9, "color": colour},
                    hovertemplate="%{y}, plane %{x}: " + role + "<extra></extra>",
                ),
                row=2,
                col=1,
            )
    fig.update_xaxes(title_text="plane (0 = highest frequency)", row=2, col=1)
    fig.update_layout(title=f"Planes of the {kind} layers at {study.target:,} tokens")
    return style_figure(fig, height=640)
