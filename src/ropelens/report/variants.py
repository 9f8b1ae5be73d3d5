"""Sections that run the model again under RoPE variants: the p-RoPE sweep and context extension.

Both score the same held-out windows (the first few of the report's, cut to at most 256 tokens) and
compare each variant with the unmodified model window by window: the loss change Δ has a paired
bootstrap CI, far tighter than the CIs of two perplexities side by side. The unmodified model's
losses are a measured step of their own (``variants_baseline``), which both sections' measure
steps read from ``data.results``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pandas as pd
import plotly.graph_objects as go
from torch import Tensor

from ropelens.analyses.extrapolation import MAX_BOUND_CONTEXT
from ropelens.errors import InputError
from ropelens.plots.context import compare_figure
from ropelens.plots.style import style_figure
from ropelens.report.collect import ReportData
from ropelens.report.experiments import context_block, prope_block
from ropelens.report.html import esc, figure_html, kv_table, table_html
from ropelens.report.section import Section
from ropelens.results.findings import Finding
from ropelens.run.evaluate import bootstrap_ci, window_losses

__all__ = ["EXTENSION_FACTOR", "NEGLIGIBLE_NATS", "ContextExtension", "eval_windows", "measure_baseline",
           "measure_context", "measure_prope", "render_context", "render_prope", "variant_losses"]

NEGLIGIBLE_NATS = 0.05  # a loss change below this (upper CI end) counts as "keeps its perplexity"
EXTENSION_FACTOR = 4  # the context-extension section configures every method for 4× the native context
_EVAL = {"windows": 4, "n_ctx": 256}
_EVAL_QUICK = {"windows": 2, "n_ctx": 128}


def eval_windows(data: ReportData) -> Tensor:
    """The windows both sections score: the report's first few, cut to at most 256 tokens."""
    e = _EVAL_QUICK if data.settings.get("quick") else _EVAL
    return data.tokens[: e["windows"], : min(data.n_ctx, e["n_ctx"])]


def measure_baseline(data: ReportData) -> Tensor:
    """Per-window losses of the unmodified model on the windows both sections score."""
    return window_losses(data.model, eval_windows(data), batch_size=4, progress=False)


def _baseline(data: ReportData) -> Tensor:
    """The baseline losses the ``variants_baseline`` step measured."""
    if "variants_baseline" not in data.results:
        raise InputError("the variants_baseline step has not run: measure it first (measure_baseline) "
                         "and keep its losses in data.results['variants_baseline']")
    return data.results["variants_baseline"]


def variant_losses(data: ReportData, variant: Any, layer_kind: str | None = None) -> dict[str, Any]:
    """Perplexity and the paired loss change against the unmodified model for one variant (no forward
    pass when the variant rotates the chosen layers exactly as the model does)."""
    from ropelens.run.intervene import apply_rope_variant, is_identity

    base = _baseline(data)
    tokens = eval_windows(data)
    identity = is_identity(data.spec, variant, data.spec.layer_indices(None, layer_kind), int(tokens.shape[1]))
    if identity:
        losses = base
    else:
        with apply_rope_variant(data.model, variant, layer_kind=layer_kind):
            losses = window_losses(data.model, tokens, batch_size=4, progress=False)
    est = bootstrap_ci(losses)
    delta = bootstrap_ci(losses - base).loss
    return {"ppl": est.perplexity.mean, "ppl_lo": est.perplexity.lo, "ppl_hi": est.perplexity.hi,
            "Δ loss": delta.mean, "Δ lo": delta.lo, "Δ hi": delta.hi, "identity": identity}


def _lead(data: ReportData, what: str) -> str:
    t = eval_windows(data)
    return (f'<p class="lead">{what} Scored on {t.shape[0]} held-out windows of {t.shape[1]} tokens of the '
            "report's corpus; Δ loss is the change in mean next-token loss (nats) against the unmodified model "
            "on the same windows, with a paired 95% bootstrap CI over windows.</p>")


# --------------------------------------------------------------------------------------------
# p-RoPE
# --------------------------------------------------------------------------------------------
def _prope_variants() -> list[Any]:
    from ropelens.spec.variants import PRoPE, PRoPEPartial, PRoPEReversed

    return [*(PRoPE(p) for p in (1.0, 0.0, 0.125, 0.25, 0.5, 0.75, 0.875)), PRoPEReversed(0.75), PRoPEPartial(0.75)]


def _variant_name(v: Any) -> str:
    return {"PRoPE": "RoPE (p = 1)" if v.p == 1 else f"p-RoPE p = {v.p:g}",
            "PRoPEReversed": f"reversed p = {v.p:g} (lowest kept)",
            "PRoPEPartial": f"partial p = {v.p:g} (first dims)"}[type(v).__name__]


def measure_prope(data: ReportData) -> pd.DataFrame:
    """Perplexity and loss change of every p-RoPE variant, one row each (reads the baseline step)."""
    from ropelens.spec.variants import kept_planes

    n_planes = data.spec.layers[data.layers[0]].n_planes
    rows = []
    for v in _prope_variants():  # p = 1 is the model itself: variant_losses reuses the baseline for it
        rows.append({"variant": _variant_name(v), "p": v.p, "planes rotating": kept_planes(v.p, n_planes)}
                    | {k: x for k, x in variant_losses(data, v).items() if k != "identity"})
    return pd.DataFrame(rows)


def render_prope(data: ReportData, frame: pd.DataFrame) -> Section:
    """Perplexity when only the highest fraction p of frequencies keeps rotating, in every layer."""
    from ropelens.spec.variants import kept_planes

    n_planes = data.spec.layers[data.layers[0]].n_planes
    fig = go.Figure()
    kinds = {"p-RoPE": frame[frame.variant.str.startswith(("p-RoPE", "RoPE"))].sort_values("p"),
             "reversed": frame[frame.variant.str.startswith("reversed")],
             "partial": frame[frame.variant.str.startswith("partial")]}
    for (label, sel), sym in zip(kinds.items(), ("circle", "triangle-down", "square"), strict=True):
        fig.add_trace(go.Scatter(
            x=sel.p, y=sel.ppl, name=label, mode="lines+markers" if label == "p-RoPE" else "markers",
            marker={"symbol": sym, "size": 9}, text=sel.variant,
            hovertemplate="%{text}<br>perplexity %{y:.4g}<extra></extra>",
            error_y={"type": "data", "symmetric": False, "array": (sel.ppl_hi - sel.ppl).tolist(),
                     "arrayminus": (sel.ppl - sel.ppl_lo).tolist()}))
    fig.update_xaxes(title_text="p: share of the highest frequencies that keep rotating (p = 0 is NoPE)")
    fig.update_yaxes(title_text="perplexity (95% CI over windows)", type="log")
    fig.update_layout(title="p-RoPE at inference: every layer, no retraining")

    prope = frame[frame.variant.str.startswith("p-RoPE")]
    ok = prope[prope["Δ hi"] < NEGLIGIBLE_NATS]
    p_min = float(ok.p.min()) if len(ok) else None
    nope = float(frame.loc[frame.p == 0.0, "Δ loss"].iloc[0])
    rev = frame[frame.variant.str.startswith("reversed")].iloc[0]
    part = frame[frame.variant.str.startswith("partial")].iloc[0]
    p75 = prope[prope.p == 0.75].iloc[0]
    if p_min is None:
        keeps = f"every truncation tested costs at least {NEGLIGIBLE_NATS} nats"
    else:
        keeps = (f"the model keeps its perplexity (Δ loss under {NEGLIGIBLE_NATS} nats, upper CI end) down to "
                 f"p = {p_min:.3f}, {kept_planes(p_min, n_planes)} of {n_planes} planes rotating")
    text = (f"Truncating RoPE at inference, {keeps}; NoPE (p = 0) costs {nope:+.2f} nats. At 0.75 of the planes, "
            f"keeping the highest frequencies costs {p75['Δ loss']:+.2f}, the lowest (reversed) {rev['Δ loss']:+.2f}, "
            f"and re-spread frequencies over the first dims (partial) {part['Δ loss']:+.2f}.")
    finding = Finding("prope", "prope-sweep", text,
                      {"p_min_negligible": p_min, "nope_delta": nope, "p075_delta": float(p75["Δ loss"]),
                       "reversed_delta": float(rev["Δ loss"]), "partial_delta": float(part["Δ loss"]),
                       "threshold_nats": NEGLIGIBLE_NATS})  # every float is quoted to 2 decimals
    extra, extra_tables = prope_block(data.experiments, data.label)
    body = (_lead(data, "Barbero et al.'s p-RoPE keeps rotating only the fraction p of the highest frequencies "
                        "and leaves the rest unrotated (θ = 0), in every layer, here without any retraining. "
                        "Reversed keeps the lowest frequencies instead; partial rotates the first dims with "
                        "frequencies re-spread over them, as in the paper's ablations.")
            + figure_html(style_figure(fig, height=420))
            + table_html(frame, text_cols=("variant",), formats={"planes rotating": lambda v: str(int(v))})
            + extra)
    return Section("prope-sweep", "p-RoPE inference sweep", body, tables={"prope_sweep": frame} | extra_tables,
                   numbers={"rows": frame.to_dict("records"), "n_windows": int(eval_windows(data).shape[0]),
                            "n_ctx": int(eval_windows(data).shape[1])}, findings=[finding])


# --------------------------------------------------------------------------------------------
# context extension
# --------------------------------------------------------------------------------------------
def _methods(factor: float, l0: int) -> dict[str, Any]:
    from ropelens.spec.variants import NTK, DynamicNTK, Linear, Llama3, YaRN

    return {"PI": Linear(factor), "NTK": NTK(factor), "dynamic NTK": DynamicNTK(factor, l0),
            "YaRN": YaRN(factor, l0), "Llama 3": Llama3(factor, 1.0, 4.0, l0)}


def _base_bounds(layer, l0: int, factor: int) -> dict[str, Any]:
    from ropelens.analyses.extrapolation import critical_dimension

    out: dict[str, Any] = {"base": layer.base}
    if layer.base is None or layer.base <= 1:
        return out
    out["critical_dim"] = critical_dimension(layer.base, layer.rotary_dim, l0)
    for key, length in (("bound_native", l0), ("bound_extended", factor * l0)):
        out[key], why = _certified_bound(layer.rotary_dim, length)
        if why:
            out[f"{key}_note"] = why
    return out


def _certified_bound(rotary_dim: int, length: int) -> tuple[float | None, str | None]:
    """Men et al.'s base lower bound for ``length`` tokens, or None and why there is none: past the longest length
    whose bound ropelens certifies (the search is quadratic in it), or no base up to the search's limit satisfies it
    (a rotary slice of few planes)."""
    from ropelens.analyses.extrapolation import base_lower_bound

    if length > MAX_BOUND_CONTEXT:
        return None, f"not certified past {MAX_BOUND_CONTEXT:,} tokens"
    if rotary_dim < 4:
        return None, f"none: {rotary_dim} rotary dims hold one frequency, which no base moves"
    try:
        return base_lower_bound(rotary_dim, length), None
    except InputError as e:  # no base up to the search's limit: the bound cannot be met with so few planes
        return None, str(e).split(":")[0].replace("no base", "none: no base")


def _bound(v: float | None, why: str | None = None) -> str:
    return f"{v:,.0f}" if v is not None else (why or f"not certified past {MAX_BOUND_CONTEXT:,} tokens")


@dataclass(frozen=True)
class ContextExtension:
    """What each scaling method does to one layer's planes at ``factor``× the native context, and its cost."""

    layer: int  # the layer shown: of the kind with the longest wavelengths
    kind: str | None  # the layer kind rescaled (None: every layer)
    native_ctx: int
    factor: int
    views: dict[str, Any]  # method -> its plane view
    identity: dict[str, bool]  # method -> rotates exactly as the model does at these lengths
    rows: tuple[dict[str, Any], ...]  # one per method (and RoPE as trained): plane counts, perplexity, Δ loss
    bounds: dict[str, Any]  # base, critical dimension and Men et al.'s base lower bounds


def measure_context(data: ReportData) -> ContextExtension:
    """Plane views and in-distribution cost of PI, NTK, dynamic NTK, YaRN and Llama 3 (reads the baseline step)."""
    from ropelens.analyses.context import plane_view
    from ropelens.spec.variants import Linear

    spec = data.spec
    # The layer kind with the longest wavelengths is the one a longer context strains.
    idx = max((i[0] for i in spec.rotary_kinds.values()), key=lambda i: float(spec.layers[i].wavelength.max()))
    layer = spec.layers[idx]
    # Where layers differ (Gemma's sliding-window and global layers), only the kind whose context
    # grows is rescaled, as models with both kinds do; a sliding window's span does not change.
    kind = layer.kind if len(spec.rotary_kinds) > 1 else None
    l0 = int(spec.n_ctx or layer.n_ctx or data.n_ctx)
    factor = EXTENSION_FACTOR
    methods = _methods(float(factor), l0)
    views = {name: plane_view(layer, v, l0, factor * l0) for name, v in methods.items()}
    none_view = plane_view(layer, Linear(1.0), l0, factor * l0)  # the trained frequencies, unscaled
    b = bootstrap_ci(_baseline(data))
    rows = [{"method": "none (RoPE as trained)", **_counts(none_view), "attention ×": 1.0,
             "ppl": b.perplexity.mean, "Δ loss": 0.0, "Δ lo": 0.0, "Δ hi": 0.0}]
    costs = {name: variant_losses(data, v, layer_kind=kind) for name, v in methods.items()}
    for name in methods:
        row = {"method": name, **_counts(views[name]), "attention ×": views[name].attention_scaling}
        rows.append(row | {k: costs[name][k] for k in ("ppl", "Δ loss", "Δ lo", "Δ hi")})
    return ContextExtension(idx, kind, l0, factor, views, {m: bool(c["identity"]) for m, c in costs.items()},
                            tuple(rows), _base_bounds(layer, l0, factor))


def render_context(data: ReportData, ext: ContextExtension) -> Section:
    """What PI, NTK, dynamic NTK, YaRN and Llama 3 do to each plane at 4× the native context, and their cost."""
    idx, kind, l0, factor, views, rows, bounds = (ext.layer, ext.kind, ext.native_ctx, ext.factor, ext.views,
                                                  list(ext.rows), ext.bounds)
    layer = data.spec.layers[idx]
    frame = pd.DataFrame(rows)

    shown = ("PI", "NTK", "YaRN", "Llama 3")
    fig = compare_figure([views[n] for n in shown])
    for trace, name in zip(fig.data[1:], shown, strict=True):  # method names, not variant reprs
        trace.name = name
    fig.update_layout(title=f"Wavelength per plane, layer {idx} ({layer.kind}): {l0:,} → {factor * l0:,} tokens")
    n = layer.n_planes
    beyond = int((layer.wavelength > l0).sum())
    cost = {r["method"]: r for r in rows}
    # Methods that are plain RoPE at these lengths (dynamic NTK inside the native context) cost
    # nothing by construction, so "cheapest" is among the others.
    order = sorted((m for m in views if not ext.identity[m]), key=lambda m: cost[m]["Δ loss"])
    text = (f"{beyond} of {n} planes of layer {idx} never complete a turn within the native {l0:,} tokens "
            f"(critical dimension {bounds.get('critical_dim', '–')} of {layer.rotary_dim} dims). Set for "
            f"{factor}× that context, PI interpolates {cost['PI']['interpolated']} planes and costs "
            f"{cost['PI']['Δ loss']:+.2f} nats in distribution; YaRN interpolates {cost['YaRN']['interpolated']} and "
            f"costs {cost['YaRN']['Δ loss']:+.2f}; cheapest: {order[0]} ({cost[order[0]]['Δ loss']:+.2f}).")
    if bounds.get("bound_native") is not None:
        text += (f" The base {bounds['base']:,.0f} is {'above' if bounds['base'] >= bounds['bound_native'] else 'BELOW'} "
                 f"Men et al.'s lower bound for {l0:,} tokens ({bounds['bound_native']:,.0f}); "
                 + (f"{factor * l0:,} tokens need {bounds['bound_extended']:,.0f}." if bounds["bound_extended"] is not None
                    else f"for {factor * l0:,} tokens the bound is {bounds.get('bound_extended_note', 'not certified')}."))
    finding = Finding("context", "context-extension", text,
                      {"layer": idx, "rescaled_kind": kind, "beyond_native": beyond, "n_planes": n, "factor": factor, "native_ctx": l0,
                       **{k: v if v is None or isinstance(v, str) else round(v) for k, v in bounds.items()},
                       "delta_pi": float(cost["PI"]["Δ loss"]), "delta_yarn": float(cost["YaRN"]["Δ loss"]),
                       "cheapest": order[0], "delta_cheapest": float(cost[order[0]]["Δ loss"])})
    bound_rows = [("layer shown", f"{idx} ({esc(layer.kind)}), {n} planes, base {esc(layer.base)}"),
                  ("native context L₀", f"{l0:,} tokens (the model's configured maximum)"),
                  ("planes with wavelength > L₀", f"{beyond} of {n}")]
    if "bound_native" in bounds:
        bound_rows += [("critical dimension (Liu et al.)", f"{bounds['critical_dim']} of {layer.rotary_dim} dims"),
                       (f"base lower bound for {l0:,} (Men et al.)", _bound(bounds["bound_native"], bounds.get("bound_native_note"))),
                       (f"base lower bound for {factor * l0:,}", _bound(bounds["bound_extended"], bounds.get("bound_extended_note")))]
    extra, extra_tables = context_block(data.experiments)
    body = (_lead(data, f"Each method configured to stretch the native {l0:,}-token context {factor}×. A plane is "
                        "<i>interpolated</i> when every angle it meets at the target length was seen in training, "
                        "<i>extrapolated</i> when it meets angles never seen (it had not completed a turn by L₀), "
                        "<i>kept</i> when it is unchanged and already turned within L₀. The cost is measured in "
                        "distribution, at the windows' length: what a method gives up before any long input."
                        + (f" Only the {layer.kind} layers are rescaled; the others keep their RoPE." if kind else ""))
            + kv_table(bound_rows) + figure_html(style_figure(fig, height=430))
            + table_html(frame, text_cols=("method",),
                         formats={c: (lambda v: str(int(v))) for c in ("kept", "interpolated", "extrapolated", "unrotated")})
            + extra)
    return Section("context-extension", "Context extension", body, tables={"context_extension": frame} | extra_tables,
                   numbers={"rows": frame.to_dict("records"), "bounds": bounds, "layer": idx, "factor": factor},
                   findings=[finding])


def _counts(view) -> dict[str, int]:
    c = view.counts()
    return {k: int(c.get(k, 0)) for k in ("kept", "interpolated", "extrapolated", "unrotated")}
