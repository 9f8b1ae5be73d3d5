"""Context extension, plane by plane: ``ropelens extension-planes`` and the report's "Context
extension" section."""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import Any

import pandas as pd

from ropelens.analyses.base_predictions import (
    MAX_BOUND_CONTEXT,
    base_lower_bound,
    critical_dimension,
)
from ropelens.analyses.extension_planes import ExtensionPlanes, LongRopeSearch, extension_planes
from ropelens.analyses.registry import Analysis, draw
from ropelens.cli.common import (
    Command,
    ModelOptions,
    OutputOptions,
    load_from_args,
    positive_int,
    relay,
)
from ropelens.errors import InputError
from ropelens.plots.extension_planes import (
    compare_figure,
    extension_planes_figure,
    longrope_search_figure,
)
from ropelens.plots.style import style_figure
from ropelens.report.collect import ReportData
from ropelens.report.experiments import context_block
from ropelens.report.html import esc, figure_html, kv_table, table_html
from ropelens.report.registry import SectionSpec
from ropelens.report.section import Section
from ropelens.report.steps import CI_FORMATS, baseline, variant_lead, variant_losses
from ropelens.results.findings import Finding, signed
from ropelens.run.evaluate import bootstrap_ci
from ropelens.spec.reading import rope_spec
from ropelens.spec.variants import NTK, DynamicNTK, Linear, Llama3, YaRN

_CONTEXT_VARIANTS = ("pi", "ntk", "dynamic", "yarn", "llama3")


def options(p: argparse.ArgumentParser) -> None:
    """``ropelens extension-planes [MODEL] --to N``: what each context-extension method does per
    plane."""
    ModelOptions.add_to(p)
    p.add_argument(
        "--to",
        type=positive_int,
        required=True,
        metavar="N",
        help="the extended context length in tokens",
    )
    p.add_argument(
        "--native",
        type=positive_int,
        default=None,
        metavar="N",
        help="the trained context length (default: the model's n_ctx)",
    )
    p.add_argument(
        "--variants",
        default="pi,ntk,yarn,llama3",
        help=f"comma-separated, of {','.join(_CONTEXT_VARIANTS)}",
    )
    p.add_argument(
        "--layer",
        type=int,
        default=0,
        help="which layer's RoPE to show (default 0; -1 is the last)",
    )
    OutputOptions.add_to(p)


# extension_planes's arguments as this command spells them
_FLAGS = {"original_ctx": "--native", "target_ctx": "--to"}


def _variant_names(text: str) -> list[str]:
    """``--variants`` as a list of method names, each one of :data:`_CONTEXT_VARIANTS`."""
    names = [n.strip().lower() for n in text.split(",") if n.strip()]
    bad = [n for n in names if n not in _CONTEXT_VARIANTS]
    if bad or not names:
        raise InputError(
            f"--variants {text!r}: unknown {bad}; choose from {','.join(_CONTEXT_VARIANTS)}"
        )
    return names


def _cli_methods(factor: float, native_ctx: int) -> dict[str, Any]:
    """The variant of each ``--variants`` name, set to stretch ``native_ctx`` by ``factor``."""
    return {
        "pi": Linear(factor),
        "ntk": NTK(factor),
        "dynamic": DynamicNTK(2.0, native_ctx),
        "yarn": YaRN(factor, native_ctx),
        "llama3": Llama3(factor, 1.0, 4.0, native_ctx),
    }


def run(args: argparse.Namespace) -> int:
    """Per-plane view of context-extension methods and RoPE's base bounds

    Categorise each plane (kept/interpolated/extrapolated) under PI, NTK, dynamic NTK (factor 2),
    YaRN and Llama 3 scaling, with the critical dimension (arXiv 2310.05209) and the base lower
    bound (arXiv 2405.14591).
    """
    names = _variant_names(args.variants)
    if args.native is not None and args.to <= args.native:
        raise InputError(
            f"--to {args.to} must exceed --native {args.native}: pass the extended length as --to"
        )
    spec = rope_spec(load_from_args(args))
    layer = spec.layers[
        spec.layer_indices([args.layer], rotary_only=False)[0]
    ]  # names the range when out of it
    native_ctx = args.native or layer.n_ctx
    if not native_ctx or args.to <= native_ctx:
        raise InputError(
            f"--to {args.to} must exceed the native context {native_ctx}: pass --native N"
        )
    methods = _cli_methods(args.to / native_ctx, native_ctx)
    views = [
        relay(extension_planes, layer, methods[n], native_ctx, args.to, flags=_FLAGS) for n in names
    ]
    bounds = {
        "critical_dimension": critical_dimension(layer.base, layer.rotary_dim, native_ctx),
        "base": layer.base,
        "base_lower_bound_target": (
            base_lower_bound(layer.rotary_dim, args.to) if args.to <= MAX_BOUND_CONTEXT else None
        ),
    }
    output = OutputOptions.from_args(args)
    if output.json:
        return output.emit(
            {
                "layer": args.layer,
                "original_ctx": native_ctx,
                "target_ctx": args.to,
                **bounds,
                "views": [
                    {
                        **v.counts(),
                        "variant": v.variant,
                        "attention_scaling": v.attention_scaling,
                        "planes": v.to_frame().to_dict("records"),
                    }
                    for v in views
                ],
            }
        )
    _print_views(args, layer, native_ctx, bounds, dict(zip(names, views, strict=True)))
    return 0


def _print_views(args, layer, native_ctx: int, bounds: dict[str, Any], views: dict) -> None:
    """The table ``ropelens extension-planes`` prints: the layer, its bounds, one row per method."""
    print(
        f"layer {args.layer}: base {layer.base:g}, {layer.n_planes} planes, {native_ctx} "
        f"-> {args.to} "
        f"tokens (x{args.to / native_ctx:g})"
    )
    bound = bounds["base_lower_bound_target"]
    bound = (
        f"{bound:.4g}" if bound is not None else f"not certified past {MAX_BOUND_CONTEXT:,} tokens"
    )
    print(
        f"critical dimension at {native_ctx}: {bounds['critical_dimension']} of "
        f"{layer.rotary_dim} dims; "
        f"base lower bound for {args.to}: {bound}"
    )
    print(
        f"{'variant':10s} {'kept':>5s} {'interp':>6s} {'extrap':>6s} {'min scale':>9s} "
        f"{'max scale':>9s} {'attn':>6s}"
    )
    for name, view in views.items():
        counts, scale = view.counts(), view.scale
        print(
            f"{name:10s} {counts['kept']:5d} {counts['interpolated']:6d} "
            f"{counts['extrapolated']:6d} "
            f"{float(scale.min()):9.4g} {float(scale.max()):9.4g} {view.attention_scaling:6.4g}"
        )


EXTENSION_FACTOR = (
    4  # the context-extension section configures every method for 4× the native context
)


def _methods(factor: float, l0: int) -> dict[str, Any]:

    return {
        "PI": Linear(factor),
        "NTK": NTK(factor),
        "dynamic NTK": DynamicNTK(factor, l0),
        "YaRN": YaRN(factor, l0),
        "Llama 3": Llama3(factor, 1.0, 4.0, l0),
    }


def _base_bounds(layer, l0: int, factor: int) -> dict[str, Any]:

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
    """Men et al.'s base lower bound for ``length`` tokens, or None and why there is none: past the
    longest length whose bound ropelens certifies (the search is quadratic in it), or no base up to
    the search's limit satisfies it (a rotary slice of few planes)."""
    if length > MAX_BOUND_CONTEXT:
        return None, f"not certified past {MAX_BOUND_CONTEXT:,} tokens"
    if rotary_dim < 4:
        return None, f"none: {rotary_dim} rotary dims hold one frequency, which no base moves"
    try:
        return base_lower_bound(rotary_dim, length), None
    except (
        InputError
    ) as e:  # no base up to the search's limit: the bound cannot be met with so few planes
        return None, str(e).split(":")[0].replace("no base", "none: no base")


def _bound(v: float | None, why: str | None = None) -> str:
    return (
        f"{v:,.0f}"
        if v is not None
        else (why or f"not certified past {MAX_BOUND_CONTEXT:,} tokens")
    )


@dataclass(frozen=True)
class ContextExtension:
    """What each scaling method does to one layer's planes at ``factor``× the native context, and
    its cost."""

    layer: int  # the layer shown: of the kind with the longest wavelengths
    kind: str | None  # the layer kind rescaled (None: every layer)
    native_ctx: int
    factor: int
    views: dict[str, Any]  # method -> its plane view
    identity: dict[str, bool]  # method -> rotates exactly as the model does at these lengths
    rows: tuple[
        dict[str, Any], ...
    ]  # one per method (and RoPE as trained): plane counts, perplexity, Δ loss
    bounds: dict[str, Any]  # base, critical dimension and Men et al.'s base lower bounds


def measure(data: ReportData) -> ContextExtension:
    """Plane views and in-distribution cost of PI, NTK, dynamic NTK, YaRN and Llama 3 (reads the
    baseline step)."""
    spec = data.spec
    # The layer kind with the longest wavelengths is the one a longer context strains.
    idx = max(
        (i[0] for i in spec.rotary_kinds.values()),
        key=lambda i: float(spec.layers[i].wavelength.max()),
    )
    layer = spec.layers[idx]
    # Where layers differ (Gemma's sliding-window and global layers), only the kind whose context
    # grows is rescaled, as models with both kinds do; a sliding window's span does not change.
    kind = layer.kind if len(spec.rotary_kinds) > 1 else None
    l0 = int(spec.n_ctx or layer.n_ctx or data.n_ctx)
    factor = EXTENSION_FACTOR
    methods = _methods(float(factor), l0)
    views = {name: extension_planes(layer, v, l0, factor * l0) for name, v in methods.items()}
    none_view = extension_planes(
        layer, Linear(1.0), l0, factor * l0
    )  # the trained frequencies, unscaled
    b = bootstrap_ci(baseline(data))
    rows = [
        {
            "method": "none (RoPE as trained)",
            **_counts(none_view),
            "attention ×": 1.0,
            "ppl": b.perplexity.mean,
            "Δ loss": 0.0,
            "Δ lo": 0.0,
            "Δ hi": 0.0,
        }
    ]
    costs = {name: variant_losses(data, v, layer_kind=kind) for name, v in methods.items()}
    for name in methods:
        row = {"method": name, **_counts(views[name]), "attention ×": views[name].attention_scaling}
        rows.append(row | {k: costs[name][k] for k in ("ppl", "Δ loss", "Δ lo", "Δ hi")})
    return ContextExtension(
        idx,
        kind,
        l0,
        factor,
        views,
        {m: bool(c["identity"]) for m, c in costs.items()},
        tuple(rows),
        _base_bounds(layer, l0, factor),
    )


def render(data: ReportData, ext: ContextExtension) -> Section:
    """What PI, NTK, dynamic NTK, YaRN and Llama 3 do to each plane at 4× the native context."""
    layer = data.spec.layers[ext.layer]
    frame = pd.DataFrame(list(ext.rows))
    finding = _extension_finding(ext, layer)
    extra, extra_tables = context_block(data.experiments)
    body = (
        variant_lead(data, _extension_lead(ext, layer))
        + kv_table(_bound_rows(ext, layer))
        + figure_html(style_figure(_extension_figure(ext, layer), height=430))
        + table_html(
            frame,
            text_cols=("method",),
            formats={
                **{
                    c: (lambda v: str(int(v)))
                    for c in ("kept", "interpolated", "extrapolated", "unrotated")
                },
                **CI_FORMATS,
            },
            summary="Planes kept, interpolated and extrapolated, and Δ loss, per method",
            csv="extension_planes",
        )
        + extra
    )
    return Section(
        "extension-planes",
        "Context extension",
        body,
        tables={"extension_planes": frame} | extra_tables,
        numbers={
            "rows": frame.to_dict("records"),
            "bounds": ext.bounds,
            "layer": ext.layer,
            "factor": ext.factor,
        },
        findings=[finding],
    )


def _extension_figure(ext: ContextExtension, layer) -> Any:
    """Wavelength per plane of the layer shown, as trained and under PI, NTK, YaRN and Llama 3."""
    shown = ("PI", "NTK", "YaRN", "Llama 3")
    fig = compare_figure([ext.views[name] for name in shown])
    for trace, name in zip(fig.data[1:], shown, strict=True):  # method names, not variant reprs
        trace.name = name
    fig.update_layout(
        title=f"Wavelength per plane, layer {ext.layer} ({layer.kind}): {ext.native_ctx:,} → "
        f"{ext.factor * ext.native_ctx:,} tokens"
    )
    return fig


def _extension_finding(ext: ContextExtension, layer) -> Finding:
    """The finding: planes beyond the native context, what PI and YaRN cost, the cheapest method."""
    native_ctx, factor, bounds = ext.native_ctx, ext.factor, ext.bounds
    n_planes = layer.n_planes
    beyond = int((layer.wavelength > native_ctx).sum())
    cost = {row["method"]: row for row in ext.rows}
    # Methods that are plain RoPE at these lengths (dynamic NTK inside the native context) cost
    # nothing by construction, so "cheapest" is among the others.
    order = sorted((m for m in ext.views if not ext.identity[m]), key=lambda m: cost[m]["Δ loss"])
    text = (
        f"{beyond} of {n_planes} planes of layer {ext.layer} never complete a turn within "
        "the native "
        f"{native_ctx:,} tokens (critical dimension {bounds.get('critical_dim', '–')} of "
        f"{layer.rotary_dim} dims). Set for {factor}× that context, PI interpolates "
        f"{cost['PI']['interpolated']} planes and costs "
        f"{signed(cost['PI']['Δ loss'], unit='nats')} in distribution; "
        f"YaRN interpolates {cost['YaRN']['interpolated']} and costs "
        f"{signed(cost['YaRN']['Δ loss'], unit='nats')}; "
        f"cheapest: {order[0]} ({signed(cost[order[0]]['Δ loss'], unit='nats')})."
    )
    if bounds.get("bound_native") is not None:
        text += " " + _bound_sentence(bounds, native_ctx, factor)
    numbers = {
        "layer": ext.layer,
        "rescaled_kind": ext.kind,
        "beyond_native": beyond,
        "n_planes": n_planes,
        "factor": factor,
        "native_ctx": native_ctx,
        **{k: v if v is None or isinstance(v, str) else round(v) for k, v in bounds.items()},
        "delta_pi": float(cost["PI"]["Δ loss"]),
        "delta_yarn": float(cost["YaRN"]["Δ loss"]),
        "cheapest": order[0],
        "delta_cheapest": float(cost[order[0]]["Δ loss"]),
    }
    return Finding("context", "extension-planes", text, numbers)


def _bound_sentence(bounds: dict[str, Any], native_ctx: int, factor: int) -> str:
    """Whether the base clears Men et al.'s bound at the native context; what extending needs."""
    side = "above" if bounds["base"] >= bounds["bound_native"] else "below"
    extended = factor * native_ctx
    needs = (
        f"{extended:,} tokens need {bounds['bound_extended']:,.0f}."
        if bounds["bound_extended"] is not None
        else f"for {extended:,} tokens the bound is "
        f"{bounds.get('bound_extended_note', 'not certified')}."
    )
    return (
        f"The base {bounds['base']:,.0f} is {side} Men et al.'s lower bound for "
        f"{native_ctx:,} tokens "
        f"({bounds['bound_native']:,.0f}); {needs}"
    )


def _bound_rows(ext: ContextExtension, layer) -> list[tuple[str, str]]:
    """The key-value table: the layer shown, the native context, and the base bounds that exist."""
    native_ctx, bounds, n_planes = ext.native_ctx, ext.bounds, layer.n_planes
    beyond = int((layer.wavelength > native_ctx).sum())
    rows = [
        (
            "layer shown",
            f"{ext.layer} ({esc(layer.kind)}), {n_planes} planes, base {esc(layer.base)}",
        ),
        ("native context L₀", f"{native_ctx:,} tokens (the model's configured maximum)"),
        ("planes with wavelength > L₀", f"{beyond} of {n_planes}"),
    ]
    if "bound_native" in bounds:
        rows += [
            (
                "critical dimension (Liu et al.)",
                f"{bounds['critical_dim']} of {layer.rotary_dim} dims",
            ),
            (
                f"base lower bound for {native_ctx:,} (Men et al.)",
                _bound(bounds["bound_native"], bounds.get("bound_native_note")),
            ),
            (
                f"base lower bound for {ext.factor * native_ctx:,}",
                _bound(bounds["bound_extended"], bounds.get("bound_extended_note")),
            ),
        ]
    return rows


def _extension_lead(ext: ContextExtension, layer) -> str:
    """The section's opening paragraph: what kept, interpolated and extrapolated mean here."""
    rescaled = (
        f" Only the {layer.kind} layers are rescaled; the others keep their RoPE."
        if ext.kind
        else ""
    )
    return (
        f"Each method configured to stretch the native {ext.native_ctx:,}-token context "
        f"{ext.factor}×. "
        "A plane is <i>interpolated</i> when every angle it meets at the target length was seen in "
        "training, <i>extrapolated</i> when it meets angles never seen (it had not "
        "completed a turn by "
        "L₀), <i>kept</i> when it is unchanged and already turned within L₀. The cost is "
        "measured in "
        "distribution, at the windows' length: what a method gives up before any long input."
        + rescaled
    )


def _counts(view) -> dict[str, int]:
    c = view.counts()
    return {k: int(c.get(k, 0)) for k in ("kept", "interpolated", "extrapolated", "unrotated")}


ANALYSIS = Analysis(
    "extension-planes",
    extension_planes,
    ExtensionPlanes,
    draw(ExtensionPlanes, figure=extension_planes_figure)
    + draw(LongRopeSearch, figure=longrope_search_figure),
    Command("extension-planes", run, options),
    SectionSpec(
        "extension-planes",
        "Context extension",
        render,
        measure,
        needs=("variants_baseline",),
        summary="Perplexity beyond the trained context under position interpolation, NTK, YaRN, "
        "Llama 3 and LongRoPE scaling of these frequencies.",
    ),
    summary="What each context-extension method does to each plane, and RoPE's base bounds.",
)
