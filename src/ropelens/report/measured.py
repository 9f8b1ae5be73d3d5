"""Sections drawn from the one streaming pass: the model's RoPE, frequency usage, and the band decomposition of attention."""

from __future__ import annotations

import math
from typing import Any

import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from ropelens.plots.band_stats import band_stats_figure
from ropelens.plots.style import style_figure
from ropelens.plots.usage import usage_figure
from ropelens.report.collect import ReportData
from ropelens.report.html import esc, figure_html, number, table_html
from ropelens.report.section import Section
from ropelens.results import findings as fnd
from ropelens.spec.rope import layer_ranges

__all__ = ["render_bands", "render_spec", "render_usage", "showcase_layers"]

_BAND_FILL = ("rgba(47,95,208,0.07)", "rgba(0,0,0,0)")
_METRICS = (("margin_share", "margin share"), ("var_share", "variance share"),
            ("abs_share", "|logit| share"), ("top1", "band-only top-1"))


def showcase_layers(data: ReportData) -> list[int]:
    """Layers drawn head by head: first, middle and last, plus the first of any layer kind not yet in."""
    layers, spec = list(data.layers), data.spec
    picks = [layers[0], layers[-1]] if data.settings.get("quick") else [layers[0], layers[len(layers) // 2], layers[-1]]
    for kind in spec.rotary_kinds:
        mine = [L for L in layers if spec.layers[L].kind == kind]
        if mine and not any(spec.layers[p].kind == kind for p in picks):
            picks.append(mine[0])
    return sorted(set(picks))


def _span(planes: tuple[int, ...]) -> str:
    if not planes:
        return "–"
    return f"{planes[0]}" if len(planes) == 1 else f"{planes[0]}–{planes[-1]}"


# ---------------------------------------------------------------------------------------- spec
def _summary_table(data: ReportData) -> pd.DataFrame:
    spec, n_ctx = data.spec, data.n_ctx
    rows = []
    for r in spec.summary().to_dict("records"):
        lr = spec.layers[spec.kinds[r["kind"]][0]]
        rows.append({
            "kind": r["kind"], "layers": f"{r['layers']} ({r['n_layers']})",
            "base": "–" if r["base"] is None or (isinstance(r["base"], float) and math.isnan(r["base"])) else f"{r['base']:g}",
            "rope type": r["rope_type"], "rotary / head dim": f"{r['rotary_dim']} / {r['head_dim']}",
            "planes": r["n_planes"], "pairing": r["pairing"], "heads / kv": f"{r['heads']} / {r['kv_heads']}",
            "score scale": f"1/{1 / r['score_scale']:.4g}" if r["score_scale"] else "– (no softmax attention)",
            "window": "–" if lr.window is None else f"{lr.window:,}",
            "softcap / sinks": f"{'–' if lr.softcap is None else f'{lr.softcap:g}'} / {'learned' if lr.sinks else '–'}",
            "λ range (tokens)": f"{number(r['shortest_wavelength'])} – {number(r['longest_wavelength'])}",
            f"planes λ > {n_ctx}": int((lr.wavelength > n_ctx).sum()),
            f"planes λ > {spec.n_ctx:,}": r["planes_beyond_ctx"],
        })
    return pd.DataFrame(rows)


def _band_table(data: ReportData) -> pd.DataFrame:
    bands, spec = data.band_stats.bands, data.spec
    rows = []
    for kind, idx in spec.rotary_kinds.items():
        lr = spec.layers[idx[0]]
        rb = bands.resolve(lr)
        wl = lr.wavelength
        for name, planes in zip(rb.names, rb.planes, strict=True):
            lo, hi = (float(wl[planes[0]]), float(wl[planes[-1]])) if planes else (math.nan, math.nan)
            rows.append({"kind": kind, "band": name, "planes": _span(planes), "n": len(planes),
                         "λ from (tokens)": lo, "λ to (tokens)": hi})
    return pd.DataFrame(rows)


def _wavelength_figure(data: ReportData) -> go.Figure:
    spec, n_ctx = data.spec, data.n_ctx
    fig = go.Figure()
    first = spec.layers[data.layers[0]]
    for b, planes in enumerate(data.band_stats.bands.resolve(first).planes):
        if planes:
            fig.add_vrect(x0=planes[0] - 0.5, x1=planes[-1] + 0.5, fillcolor=_BAND_FILL[b % 2], line_width=0, layer="below")
    for kind, idx in spec.rotary_kinds.items():
        lr = spec.layers[idx[0]]
        wl = [w if math.isfinite(w) else None for w in lr.wavelength.tolist()]
        base = f", base {lr.base:g}" if lr.base else ""
        fig.add_trace(go.Scatter(
            x=list(range(lr.n_planes)), y=wl, mode="lines+markers", marker={"size": 5},
            name=f"{kind} layers{base}", customdata=lr.inv_freq.tolist(),
            hovertemplate="plane %{x}<br>λ = %{y:.4g} tokens<br>θ = %{customdata:.3g} rad/token<extra>" + esc(kind) + "</extra>"))
    marks: dict[int, list[str]] = {}
    marks.setdefault(n_ctx, []).append(f"analysis window {n_ctx:,}")
    marks.setdefault(spec.n_ctx, []).append(f"trained context {spec.n_ctx:,}")
    for kind, idx in spec.rotary_kinds.items():
        w = spec.layers[idx[0]].window
        if w:
            marks.setdefault(w, []).append(f"{kind} window {w:,}")
    for i, (y, labels) in enumerate(sorted((y, v) for y, v in marks.items() if y and y > 0)):  # a model with no
        _hline_log(fig, y, " · ".join(labels), "dash" if i % 2 == 0 else "dot")  # configured context: none drawn
    fig.update_yaxes(type="log", title_text="wavelength λ = 2π/θ (tokens)")
    fig.update_xaxes(title_text="plane (0 = highest frequency)")
    fig.update_layout(title="Wavelength of every plane against the context (shading: bands)",
                      legend={"orientation": "h", "y": -0.2})
    return style_figure(fig, height=420)


def _verification_html(v: dict[str, Any] | None) -> str:
    """Whether the reading below was checked against the model's own attention (prominent when it was not)."""
    if not v:
        return ""
    if v.get("status") != "passed":
        return ('<p class="placeholder"><b>Unverified.</b> ropelens\'s reading of this model (its rotation, scores, '
                "mask and softmax) was not checked against the model's own attention (verify=False / --no-verify): "
                "every number in this report may misdescribe the model.</p>")
    errs = ", ".join(f"{esc(k)} {e:.1e}" for k, e in v.get("errors", {}).items())
    unchecked = v.get("unchecked") or []
    return (f"<p><b>Verified</b> on a {v.get('n_tokens')}-token probe against {esc(v.get('reference', ''))}: in every "
            "rotary layer the captured post-RoPE q and k are the spec's rotation, and the rebuilt scores and "
            f"probabilities are the model's (largest errors: {errs})."
            + (f" Not checked: {esc('; '.join(unchecked))}." if unchecked else "") + "</p>")


def render_spec(data: ReportData) -> Section:
    """Spec per layer kind, the bands, and every plane's wavelength against the context."""
    spec = data.spec
    lr = spec.layers[data.layers[0]]
    widths = [(f"{h} query heads over {kv} KV heads, head dim {d}, {p} rotary planes per head", ls)
              for (d, h, kv, p), ls in spec.width_groups(data.layers).items()]
    shape = widths[0][0] if len(widths) == 1 else "; ".join(f"layers {layer_ranges(ls)}: {w}" for w, ls in widths)
    intro = (f"<p><b>{esc(data.label)}</b> ({esc(spec.architecture)}): {spec.n_layers} layers, {shape} "
             f"({esc(lr.pairing)} pairing), trained context {spec.n_ctx:,} tokens. Analysed here: "
             f"{len(data.layers)} layers, windows of {data.n_ctx:,} tokens.</p>")
    if data.settings.get("n_ctx_note"):
        intro += f"<p>{esc(data.settings['n_ctx_note'][0].upper() + data.settings['n_ctx_note'][1:])}.</p>"
    intro = _verification_html(data.settings.get("verification")) + intro
    nope = [L for L in range(spec.n_layers) if not spec.layers[L].rotary]
    if nope:
        listed = ", ".join(map(str, nope))
        intro += (f"<p>Layers {esc(listed)} apply no RoPE (NoPE layers): they have no planes, so the "
                  "per-plane sections below leave them out.</p>")
    frame = spec.to_frame()
    frame["beyond_window"] = frame["wavelength"] > data.n_ctx
    bt = _band_table(data)
    body = "".join([
        intro, "<h3>RoPE per layer kind</h3>",
        table_html(_summary_table(data), text_cols=("kind", "layers", "base", "rope type", "rotary / head dim",
                                                    "pairing", "heads / kv", "score scale", "window", "softcap / sinks",
                                                    "λ range (tokens)")),
        figure_html(_wavelength_figure(data),
                    "Planes above a line never complete a turn within that many tokens. Hover for θ."),
        f"<h3>Bands ({esc(data.band_stats.bands.describe())})</h3>",
        table_html(bt, text_cols=("kind", "band", "planes")),
    ])
    numbers = {"kinds": dict(spec.kinds), "verification": data.settings.get("verification"),
               "planes_beyond_window": {k: int((spec.layers[v[0]].wavelength > data.n_ctx).sum()) for k, v in spec.rotary_kinds.items()},
               "bands": bt.to_dict("records")}
    return Section("spec", "Model and RoPE", body, tables={"spec": frame}, numbers=numbers)


# ---------------------------------------------------------------------------------------- usage
def _energy_figure(data: ReportData) -> tuple[go.Figure, pd.DataFrame]:
    u, bands = data.usage, data.band_stats.bands
    fig = make_subplots(rows=1, cols=2, subplot_titles=["queries", "keys"], horizontal_spacing=0.1)
    frames = []
    for col, w in ((1, "q"), (2, "k")):
        for scope in ("all", "no_sink"):
            names, share = u.band_share(bands, w, scope)  # [L, H, B]
            L, H, B = share.shape
            idx = pd.MultiIndex.from_product([list(u.layers), range(H), names], names=["layer", "head", "band"])
            have = u.present(w)[..., :1].expand(L, H, B).reshape(-1).numpy()  # heads a layer lacks: no rows
            frames.append(pd.DataFrame({"which": w, "scope": scope, "energy_share": share.reshape(-1).numpy()},
                                       index=idx).reset_index()[have])
            if scope == "no_sink":
                fig.add_trace(go.Heatmap(z=share.nanmean(1).numpy(), x=list(names), y=list(u.layers), coloraxis="coloraxis",
                                         hovertemplate="layer %{y} · %{x}<br>energy share %{z:.3f}<extra>" + w + "</extra>"),
                              row=1, col=col)
    fig.update_yaxes(autorange="reversed")
    fig.update_yaxes(title_text="layer", col=1)
    _integer_ticks(fig, len(u.layers))
    fig.update_layout(coloraxis={"colorscale": "Viridis", "cmin": 0, "cmax": 1, "colorbar": {"title": "share"}},
                      title="Share of squared norm (energy) per band, heads averaged, sink positions excluded")
    cols = ["which", "scope", "layer", "head", "band", "energy_share"]
    return style_figure(fig, height=max(300, 12 * len(u.layers) + 140)), pd.concat(frames, ignore_index=True)[cols]


def _sink_figure(data: ReportData, ratios: dict[str, Any]) -> go.Figure:
    fig = go.Figure()
    for w, name in (("k", "keys"), ("q", "queries")):
        fig.add_trace(go.Scatter(x=list(data.usage.layers), y=ratios[w].tolist(), mode="lines+markers", name=name,
                                 hovertemplate="layer %{x}<br>sink ÷ other = %{y:.2f}×<extra>" + name + "</extra>"))
    fig.add_shape(type="line", xref="paper", x0=0, x1=1, yref="y", y0=1, y1=1, layer="below",
                  line={"color": "#9aa1ad", "width": 1})
    fig.update_yaxes(type="log", title_text="sink ÷ other positions", tickvals=_log_ticks(ratios))
    fig.update_xaxes(title_text="layer")
    fig.update_layout(title="Mean per-plane norm at the sink position relative to all other positions",
                      legend={"orientation": "h", "y": 1.12, "x": 1, "xanchor": "right"})
    return style_figure(fig, height=320)


def _integer_ticks(fig: go.Figure, n_rows: int) -> None:
    """Layer axes as categories: selected layers need not be contiguous, and each row is one layer."""
    fig.update_yaxes(type="category")
    if n_rows > 16:
        fig.update_yaxes(nticks=16)


def _hline_log(fig: go.Figure, y: float, label: str, dash: str) -> None:
    """A labelled horizontal line on a log y axis (shapes take data values, annotations log10 values)."""
    fig.add_shape(type="line", xref="paper", x0=0, x1=1, yref="y", y0=y, y1=y, layer="below",
                  line={"dash": dash, "color": "#7a8294", "width": 1})
    fig.add_annotation(xref="paper", x=0.005, yref="y", y=math.log10(y), text=label, showarrow=False,
                       xanchor="left", yanchor="bottom", font={"size": 11, "color": "#5b6475"})


def _layer_plane(u, scope: str) -> go.Figure:
    fig = style_figure(usage_figure(u, scope), height=max(320, 11 * len(u.layers) + 140))
    _integer_ticks(fig, len(u.layers))
    return fig


def _log_ticks(ratios: dict[str, Any]) -> list[float]:
    """1-2-5 ticks covering the ratios (plotly labels every minor step of a short log axis)."""
    lo = min(float(r.min()) for r in ratios.values())
    hi = max(float(r.max()) for r in ratios.values())
    lo, hi = max(min(lo, 1.0), 1e-6), max(hi, 1.0)
    ticks = [m * 10.0**e for e in range(math.floor(math.log10(lo)), math.ceil(math.log10(hi)) + 1) for m in (1, 2, 5)]
    return [t for t in ticks if lo / 2 <= t <= hi * 2]


def render_usage(data: ReportData) -> Section:
    """Layer × plane and head × plane norm heatmaps, band energy shares and sink ratios."""
    u = data.usage
    prov = u.provenance
    sink = "The first position" if u.n_sink == 1 else f"The first {u.n_sink} positions"
    intro = (f"<p class=\"lead\">Mean 2-norm of each rotary plane of the queries and keys before rotation "
             f"(Barbero et al.), over {prov.n_tokens:,} tokens in {prov.n_windows} windows of {data.n_ctx}; "
             f"plane 0 is the highest frequency. {sink} of each window (BOS, where attention sinks sit) has norms unlike "
             f"the rest (see <a href=\"#sink-norms\">sink norms</a>), so each map is shown with and without it.</p>")
    parts = [intro, "<h3>Layer × plane</h3>",
             figure_html(_layer_plane(u, "all")), figure_html(_layer_plane(u, "no_sink")),
             "<h3>Head × plane, selected layers (sink excluded)</h3>"]
    for L in showcase_layers(data):
        fig = style_figure(usage_figure(u, "no_sink", layer=L), height=300)
        fig.update_layout(title_text=f"Layer {L} ({data.spec.layers[L].kind}): head × plane, sink positions excluded")
        fig.update_yaxes(dtick=1)  # one tick per head
        parts.append(figure_html(fig))
    energy_fig, energy = _energy_figure(data)
    parts += ["<h3>Energy per band</h3>", figure_html(energy_fig)]
    findings = u.findings(data.band_stats.bands)
    numbers: dict[str, Any] = {"energy": findings[0].values}
    ratios = u.sink_ratios()
    if ratios is not None:
        parts += ['<h3 id="sink-norms">Sink norms</h3>', figure_html(_sink_figure(data, ratios))]
        numbers["sink_ratio"] = {w: [round(float(x), 4) for x in r] for w, r in ratios.items()}
    return Section("usage", "Frequency usage", "".join(parts), tables={"usage": u.to_frame(), "energy": energy},
                   numbers=numbers, findings=findings)


# ---------------------------------------------------------------------------------------- bands
def _per_head_figure(data: ReportData) -> go.Figure:
    st = data.band_stats
    names = list(st.band_names)
    B, layers = len(names), list(st.layers)
    fig = make_subplots(rows=len(_METRICS), cols=B, shared_xaxes=True, shared_yaxes=True,
                        column_titles=names, horizontal_spacing=0.012, vertical_spacing=0.035)
    for r, (metric, title) in enumerate(_METRICS, start=1):
        z = getattr(st, metric)()  # [L, H, B]
        axis = "coloraxis2" if metric == "top1" else "coloraxis"
        for b in range(B):
            fig.add_trace(go.Heatmap(z=z[..., b].numpy(), x=list(range(z.shape[1])), y=layers, coloraxis=axis,
                                     hovertemplate=f"layer %{{y}} head %{{x}}<br>{esc(names[b])}<br>{title} %{{z:.3f}}<extra></extra>"),
                          row=r, col=b + 1)
    fig.update_yaxes(autorange="reversed")
    for r, (_, title) in enumerate(_METRICS, start=1):
        fig.update_yaxes(title_text=f"<b>{title}</b><br>layer", title_font={"size": 11}, row=r, col=1)
    fig.update_xaxes(title_text="head", row=len(_METRICS))
    _integer_ticks(fig, len(layers))
    fig.update_xaxes(dtick=1)
    panel = max(120, 7 * len(layers))
    fig.update_layout(
        title="Per head: each band's share of the attention logit, and how often the band alone picks the attended key",
        coloraxis={"colorscale": "RdBu", "cmin": -1, "cmax": 1, "cmid": 0,
                   "colorbar": {"title": "share", "len": 0.72, "y": 1, "yanchor": "top", "x": 1.06}},
        coloraxis2={"colorscale": "Viridis", "cmin": 0, "cmax": 1,
                    "colorbar": {"title": "top-1", "len": 0.24, "y": 0, "yanchor": "bottom", "x": 1.06}})
    return style_figure(fig, height=len(_METRICS) * panel + 130)


def _tightness_figure(data: ReportData) -> go.Figure:
    t = data.band_stats.tightness().nanmean(1)  # [L, P]; NaN past a layer's own heads and planes
    fig = go.Figure(go.Heatmap(z=t.numpy(), x=list(range(t.shape[1])), y=list(data.band_stats.layers),
                               colorscale="RdBu", zmid=0, zmin=-1, zmax=1, colorbar={"title": "tightness"},
                               hovertemplate="layer %{y} plane %{x}<br>Σ term ÷ Σ ‖q‖‖k‖ = %{z:.3f}<extra></extra>"))
    fig.update_yaxes(autorange="reversed", title_text="layer")
    _integer_ticks(fig, len(data.band_stats.layers))
    fig.update_xaxes(title_text="plane (0 = highest frequency)")
    fig.update_layout(title="Cauchy–Schwarz tightness at the attended key, heads averaged (1 = q and k aligned)")
    return style_figure(fig, height=max(300, 11 * len(data.band_stats.layers) + 120))


def _top_heads(data: ReportData, n: int = 10) -> pd.DataFrame:
    st = data.band_stats
    frame = st.to_frame()
    first = frame[frame["band"] == st.band_names[0]].sort_values("margin_share", ascending=False).head(n)
    first = first.assign(head=[fnd.head_name(int(L), int(h)) for L, h in zip(first["layer"], first["head"], strict=True)])
    return first[["head", "margin_share", "var_share", "abs_share", "top1"]].rename(columns={
        "margin_share": "margin share", "var_share": "variance share", "abs_share": "|logit| share",
        "top1": "band-only top-1"})


def render_bands(data: ReportData) -> Section:
    """Band shares of the logit per layer and per head, band-only agreement and plane tightness."""
    st = data.band_stats
    prov = st.provenance
    sampled = "" if prov.n_windows == data.n_windows else f" ({prov.n_windows} of the {data.n_windows} windows, evenly spread)"
    intro = (f"<p class=\"lead\">Every attention logit is an exact sum of one term per band ({esc(st.bands.describe())}). "
             f"Over {prov.n_tokens:,} tokens{sampled}: each band's share of the mean |logit|, of the logit's variance "
             f"across keys of a query, and of the <i>margin</i> of the key the model attends to most (its logit minus "
             f"the mean over the other allowed keys); and how often the band's logits alone pick that key.</p>")
    findings = st.findings()
    per_layer = style_figure(band_stats_figure(st), height=max(360, 11 * len(st.layers) + 150))
    per_layer.update_yaxes(autorange="reversed")  # every panel, not only the first
    _integer_ticks(per_layer, len(st.layers))
    parts = [intro, "<h3>Per layer (heads averaged)</h3>", figure_html(per_layer),
             "<h3>Per head</h3>", figure_html(_per_head_figure(data)),
             f"<h3>Heads taking the most margin from {esc(st.band_names[0])}</h3>",
             table_html(_top_heads(data), text_cols=("head",)),
             "<h3>Plane tightness</h3>", figure_html(_tightness_figure(data))]
    t = st.tightness()
    L, H, P = t.shape
    tight_frame = pd.DataFrame({"layer": [st.layers[i] for i in range(L) for _ in range(H * P)],
                                "head": [h for _ in range(L) for h in range(H) for _ in range(P)],
                                "plane": list(range(P)) * (L * H), "tightness": t.reshape(-1).numpy()})
    # layers of different widths (Gemma 4): no rows past a layer's own heads and planes
    tight_frame = tight_frame[st.spec.present(st.layers, "head", "plane").reshape(-1).numpy()].reset_index(drop=True)
    numbers = {f.key: f.values for f in findings}
    numbers["windows"] = list(data.band_windows)
    return Section("bands", "Band decomposition of attention", "".join(parts),
                   tables={"band_stats": st.to_frame(), "tightness": tight_frame}, numbers=numbers, findings=findings)
