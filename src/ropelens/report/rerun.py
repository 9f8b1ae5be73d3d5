"""Sections measured again on a few of the report's windows: positional heads, attention sinks, attention by distance, massive values."""

from __future__ import annotations

import pandas as pd

from ropelens.plots.distance import distance_figure
from ropelens.plots.heads import heads_figure
from ropelens.plots.massive import massive_figure
from ropelens.plots.sinks import sinks_figure
from ropelens.plots.style import style_figure
from ropelens.report.collect import ReportData, evenly_spaced
from ropelens.report.html import esc, figure_html, table_html
from ropelens.report.section import Measured, Section
from ropelens.results.findings import Finding

__all__ = ["measure_distance", "measure_heads", "measure_massive", "measure_sinks", "render_distance", "render_heads",
           "render_massive", "render_sinks"]

N_WINDOWS = 2  # windows of at most MAX_CTX tokens: both analyses cost a few forward passes each
MAX_CTX = 512


def _windows(data: ReportData):
    n_ctx = min(data.n_ctx, MAX_CTX if not data.settings.get("quick") else 256)
    keep = evenly_spaced(data.n_windows, 1 if data.settings.get("quick") else N_WINDOWS)
    return data.tokens[keep, :n_ctx], n_ctx, len(keep)


def _rerun(data: ReportData, analysis) -> Measured:
    """``analysis`` on a few of the report's windows, over the report's layers."""
    toks, n_ctx, n_win = _windows(data)
    return Measured(analysis(data.model, toks, n_ctx=n_ctx, layers=list(data.layers), progress=False), n_ctx, n_win)


def measure_sinks(data: ReportData) -> Measured:
    """Attention to position 0 per head and its band split, on a few of the report's windows."""
    from ropelens.analyses.sinks import attention_sinks

    return _rerun(data, attention_sinks)


def render_sinks(_data: ReportData, sinks: Measured) -> Section:
    """Gu et al.'s sink heads (attention to position 0 above ε), and the bands that make position 0 attractive."""
    r, n_ctx, n_win = sinks.value, sinks.n_ctx, sinks.n_windows
    found = r.findings()
    sentences = [f.text for f in found]
    layers = r.layers_frame()
    body = (f"<p class=\"lead\">A head sinks when its mean attention to position 0 (the BOS token) exceeds "
            f"ε = {r.epsilon:g} (Gu et al. 2024). The sink logit (position 0 against the mean of the other keys) splits "
            f"exactly into bands, which says which planes make position 0 attractive. Measured on {n_win} window(s) of "
            f"{n_ctx} tokens.</p>" + "".join(f"<p>{esc(s)}</p>" for s in sentences)
            + figure_html(style_figure(sinks_figure(r), height=460)) + table_html(layers))
    return Section("attention-sinks", "Attention sinks by band", body, tables={"sinks_heads": r.heads_frame(),
                   "sinks_layers": layers}, numbers={"sentences": sentences},
                   findings=[f for f in found if f.key != "sinks-2"])  # the key-norm ratio: frequency usage's sink finding


def measure_distance(data: ReportData) -> Measured:
    """Mean band logit and attention probability by query–key distance, on a few of the report's windows."""
    from ropelens.analyses.distance import attention_by_distance

    return _rerun(data, attention_by_distance)


def render_distance(_data: ReportData, distance: Measured) -> Section:
    """Mean logit per band and attention probability by query–key distance; U-shapes and their cause."""
    r, n_ctx, n_win = distance.value, distance.n_ctx, distance.n_windows
    shapes = r.shapes()
    finding = r.findings()[0]  # the summary over layers; the per-layer sentences follow it
    text, counts = finding.text, finding.values["full_logit_shapes"]
    table = shapes[["layer", "kind", "curve", "shape", "text"]]
    body = ("<p class=\"lead\">HoPE (Chen et al. 2025): attention decays locally but can turn U-shaped globally "
            "through its low-frequency components. Mean band logit and attention probability in log-spaced distance "
            f"bins; each curve is described as it is (decay, flat, U-shaped, peaked, oscillating). Measured on {n_win} "
            f"window(s) of {n_ctx} tokens.</p><p>{esc(text)}</p>"
            + figure_html(style_figure(distance_figure(r), height=480)) + table_html(table, text_cols=("kind", "curve", "shape", "text")))
    return Section("attention-distance", "Attention by distance", body,
                   tables={"distance_shapes": pd.DataFrame(shapes)}, numbers={"full_logit_shapes": counts},
                   findings=[finding])


def measure_massive(data: ReportData) -> Measured:
    """Norms of each pre-RoPE query and key dimension, on a few of the report's windows."""
    from ropelens.analyses.massive import massive_values

    return _rerun(data, massive_values)


def render_massive(data: ReportData, massive: Measured) -> Section:
    """Jin et al.'s massive dimensions of pre-RoPE q and k: where they sit in frequency, how they persist."""
    mv, n_ctx, n_win = massive.value, massive.n_ctx, massive.n_windows
    planes = mv.planes_frame()
    hit = planes[planes.n_massive > 0]
    ctx = data.spec.n_ctx
    parts = []
    for w in ("q", "k"):
        m = mv.mask(w)
        n, total = int(m.sum()), m.numel()
        rows = hit[hit.which == w]
        beyond = int(rows[rows.wavelength > ctx].n_massive.sum())
        top = rows.sort_values("persistence", ascending=False).head(1)
        tail = (f", most persistent plane {int(top.plane.iloc[0])} (wavelength {top.wavelength.iloc[0]:,.0f} tokens, "
                f"massive in {top.persistence.iloc[0]:.0%} of layers)") if len(top) else ""
        parts.append(f"{w}: {n} of {total} dimensions massive, {beyond} of them in planes whose wavelength exceeds "
                     f"the trained context of {ctx:,}{tail}")
    text = (f"Massive dimensions (L2 norm over tokens above {mv.factor:.2f}× the head's mean dimension norm) — "
            + "; ".join(parts) + ".")
    finding = Finding("massive", "massive-values", text,
                      {"factor": mv.factor, "n_massive_q": int(mv.mask("q").sum()), "n_massive_k": int(mv.mask("k").sum())})
    body = ("<p class=\"lead\">Jin et al. 2025: a few dimensions of the queries and keys carry far larger norms than "
            "the rest, concentrated in low-frequency planes, and contextual knowledge depends on them. Measured before "
            f"RoPE on {n_win} window(s) of {n_ctx} tokens. Replace them with their mean "
            "(<code>ropelens.analyses.massive.replace_massive</code>) to test what they do.</p>"
            f"<p>{esc(text)}</p>" + figure_html(style_figure(massive_figure(mv), height=460)) + table_html(hit, text_cols=("which",)))
    return Section("massive-values", "Massive values", body, tables={"massive_planes": planes},
                   numbers=finding.values, findings=[finding])


def measure_heads(data: ReportData) -> Measured:
    """Positional heads scored on the report's first few windows and on seeded random tokens."""
    from ropelens.analyses.heads import classify_heads

    n_ctx = min(data.n_ctx, 256)
    n_windows = 2 if data.settings.get("quick") else 4
    tx = classify_heads(data.model, data.tokens[:n_windows, :n_ctx], n_ctx=n_ctx, n_windows=n_windows,
                        layers=list(data.layers), progress=True)
    return Measured(tx, n_ctx, n_windows)


def render_heads(_data: ReportData, heads: Measured) -> Section:
    """Positional heads found by score on text and on seeded random tokens, with their band profile."""
    tx, n_ctx, n_windows = heads.value, heads.n_ctx, heads.n_windows
    df = tx.to_frame()
    pos = df[df.positional].sort_values("robust_mass", ascending=False)
    high = tx.band_names[0]
    keep = ["layer", "head", "kind", "best_offset", "mass_text", "mass_random", f"margin_share[{high}]",
            "top_plane", "top_plane_tightness"]
    keep = [c for c in keep if c in df.columns]
    table = pos[keep].rename(columns={"best_offset": "δ*", "mass_text": "mass (text)", "mass_random": "mass (random)",
                                      f"margin_share[{high}]": f"margin share {high}",
                                      "top_plane_tightness": "top-plane tightness"})
    counts = df["kind"].value_counts().to_dict()
    col = f"margin_share[{high}]"
    if len(pos) and col in df.columns:
        m_pos, m_rest = float(pos[col].mean()), float(df[~df.positional][col].mean())
        text = (f"{len(pos)} of {len(df)} heads are positional (τ = {tx.tau:.2f} on attention mass at one fixed offset, "
                f"on text and on random tokens); they take {m_pos:.2f} of their attended-key margin from the "
                f"highest-frequency band {high}, against {m_rest:.2f} for the other heads.")
        numbers = {"n_positional": len(pos), "tau": tx.tau, "margin_high_positional": m_pos, "margin_high_other": m_rest}
    else:
        text = f"No head is positional at τ = {tx.tau:.2f} over the {n_windows} windows of {n_ctx} tokens scored."
        numbers = {"n_positional": 0, "tau": tx.tau}
    finding = Finding("heads", "positional-heads", text, numbers | {"kinds": counts})
    body = ("<p class=\"lead\">A head is positional when one fixed offset δ* = query − key holds at least τ of its "
            "attention on real text and on seeded random tokens (content removed); τ is Otsu's threshold on that "
            f"mass over all heads, floored at 0.3. Scored on {n_windows} windows of {n_ctx} tokens. Kinds: "
            + esc(", ".join(f"{k} {v}" for k, v in counts.items())) + ".</p>"
            + figure_html(style_figure(heads_figure(tx), height=460)) + table_html(table, text_cols=("kind",)))
    return Section("positional-heads", "Positional heads", body, tables={"heads": df},
                   numbers={"tau": tx.tau, "kinds": counts, "positional": table.to_dict("records")}, findings=[finding])
