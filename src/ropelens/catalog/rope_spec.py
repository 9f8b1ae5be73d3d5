"""Reading a model's RoPE: ``ropelens rope-spec`` and the report's "Model and RoPE" section."""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable
from typing import Any

import pandas as pd
import plotly.graph_objects as go

from ropelens.analyses.registry import Analysis
from ropelens.cli.common import Command, ModelOptions, OutputOptions, jsonable, load_from_args
from ropelens.errors import UsageError
from ropelens.plots.style import bands_in_words, hline_log, style_figure
from ropelens.report.collect import ReportData
from ropelens.report.html import esc, figure_html, number, table_html
from ropelens.report.registry import SectionSpec
from ropelens.report.section import Section
from ropelens.spec.plan import describe_intervention
from ropelens.spec.reading import rope_spec
from ropelens.spec.rope import RopeSpec, layer_ranges
from ropelens.testing.families import FAMILIES


def options(p: argparse.ArgumentParser) -> None:
    """``ropelens rope-spec [MODEL]``: the RoPE spec of a model."""
    ModelOptions.add_to(p)
    OutputOptions.add_to(p)
    p.add_argument(
        "--families",
        action="store_true",
        help="list the model families ropelens supports (exact, or refused and why) instead of "
        "reading a model; no model is loaded or built",
    )


def run(args: argparse.Namespace) -> int:
    """Show the RoPE a model applies (bases, planes, pairing, wavelengths)

    Load a model and print the RoPE its attention layers apply, per layer kind. With --families,
    list the model families ropelens supports instead.
    """
    output = OutputOptions.from_args(args)
    if args.families:
        if args.model is not None:
            raise UsageError(
                f"--families lists the supported families without a model: drop {args.model!r}, or "
                "drop --families to inspect it"
            )
        if output.json:
            return output.emit(families_json())
        print(families_table())
        return 0
    spec = rope_spec(load_from_args(args))
    if output.json:
        return output.emit(inspect_json(spec))
    print(inspect_table(spec))
    return 0


_WHERE = {"load": "at load", "spec": "by rope_spec", "probe": "by the probe"}


def families_json() -> list[dict[str, Any]]:
    """One record per family of the matrix (:data:`ropelens.testing.families.FAMILIES`): exact or
    refused, and why."""
    import transformers

    return [
        {
            "family": name,
            "config_class": fam.config_class,
            "status": "exact" if fam.refused is None else "refused",
            "refused_at": None if fam.refused is None else fam.refused_at,
            "reason": fam.refused,
            "needs": fam.needs,
            "in_transformers": hasattr(transformers, fam.config_class),
        }
        for name, fam in FAMILIES.items()
    ]


def families_table() -> str:
    """Readable list of :func:`families_json`: family, status, what the family needs."""
    import transformers

    rows = [["family", "status", "what it needs"]]
    for f in families_json():
        status = (
            "exact" if f["reason"] is None else f"refused {_WHERE[f['refused_at']]}: {f['reason']}"
        )
        if not f["in_transformers"]:
            status += f" (transformers {transformers.__version__} has no {f['config_class']})"
        rows.append([f["family"], status, f["needs"]])
    widths = [max(len(r[i]) for r in rows) for i in range(2)]
    lines = ["  ".join([r[0].ljust(widths[0]), r[1].ljust(widths[1]), r[2]]).rstrip() for r in rows]
    n_exact = sum(f["reason"] is None for f in families_json())
    return "\n".join(
        [
            f"{n_exact} of {len(rows) - 1} families exact, each a tiny random model checked "
            "against HF's own eager attention (measured errors: docs/models.md)",
            "",
            *lines,
        ]
    )


def inspect_json(spec: RopeSpec) -> dict[str, Any]:
    """Spec summary per layer kind plus every layer (with inv_freq); loads with
    RopeSpec.from_dict."""
    d = spec.to_dict()
    summary = jsonable(spec.summary().to_dict("records"))
    head = {k: v for k, v in d.items() if k != "layers"}
    return {**head, "n_layers": spec.n_layers, "summary": summary, "layers": d["layers"]}


_TABLE_ROWS: tuple[tuple[str, Callable[[dict[str, Any]], str]], ...] = (
    ("layers", lambda r: f"{r['layers']} ({r['n_layers']})"),
    ("base", lambda r: "-" if _missing(r["base"]) else f"{r['base']:g}"),
    ("rope type", lambda r: str(r["rope_type"])),
    ("rotary dim", lambda r: f"{r['rotary_dim']} of {r['head_dim']} ({r['n_planes']} planes)"),
    (
        "pairing",
        lambda r: {"half": "half (i, i+d/2)", "adjacent": "adjacent (2i, 2i+1)"}[r["pairing"]],
    ),
    ("heads / kv heads", lambda r: f"{r['heads']} / {r['kv_heads']}"),
    ("score scale", lambda r: f"{r['score_scale']:.6g} (1/{1 / r['score_scale']:.6g})"),
    ("attention scaling", lambda r: f"{r['attention_scaling']:g}"),
    ("window", lambda r: "-" if _missing(r["window"]) else f"{int(r['window'])}"),
    ("logit softcap", lambda r: "-" if _missing(r["softcap"]) else f"{r['softcap']:g}"),
    ("attention sinks", lambda r: "learned, per head" if r["sinks"] else "-"),
    (
        "shortest wavelength",
        lambda r: (
            "-" if _missing(r["shortest_wavelength"]) else f"{r['shortest_wavelength']:.4g} tokens"
        ),
    ),
    (
        "longest wavelength",
        lambda r: (
            "-" if _missing(r["longest_wavelength"]) else f"{r['longest_wavelength']:.4g} tokens"
        ),
    ),
    ("planes beyond n_ctx", lambda r: f"{r['planes_beyond_ctx']} of {r['n_planes']}"),
)


# rows for structures only some models have, shown where the spec's summary has their column
_OPTIONAL_ROWS: tuple[tuple[str, str, Callable[[dict[str, Any]], str]], ...] = (
    ("chunk", "chunk", lambda r: "-" if _missing(r["chunk"]) else f"{int(r['chunk'])} tokens"),
    (
        "select_keys",
        "keys kept",
        lambda r: (
            "-"
            if _missing(r["select_keys"])
            else f"at most {int(r['select_keys'])} per query, picked by an indexer"
        ),
    ),
    (
        "rotary_offset",
        "rotary slice",
        lambda r: (
            f"dims {int(r['rotary_offset'])}+ of each head"
            + (", key shared by all heads" if r.get("shared_rotary_key") else "")
        ),
    ),
    ("mrope_axes", "M-RoPE axes", lambda r: str(r["mrope_axes"]) or "-"),
    (
        "temperature",
        "query temperature",
        lambda r: (
            "-"
            if not isinstance(r["temperature"], (tuple, list))
            else f"1 + {r['temperature'][0]:g}·ln(1 + ⌊m/{int(r['temperature'][1])}⌋) after RoPE"
        ),
    ),
    (
        "stopped_planes",
        "planes stopped",
        lambda r: f"{_span(tuple(r['stopped_planes']))} (θ = 0)" if r["stopped_planes"] else "-",
    ),
    (
        "ablated_planes",
        "planes zeroed",
        lambda r: _span(tuple(r["ablated_planes"])) if r["ablated_planes"] else "-",
    ),
    (
        "valid_up_to",
        "frequencies hold",
        lambda r: (
            f"for inputs up to {int(r['valid_up_to']):,} tokens"
            + ("" if _missing(r["read_at_length"]) else f" (read at {int(r['read_at_length']):,})")
        ),
    ),
)


def _missing(v: Any) -> bool:
    return v is None or (isinstance(v, float) and math.isnan(v))


def inspect_table(spec: RopeSpec) -> str:
    """Readable table: one column per layer kind, one row per property."""
    rows = spec.summary().to_dict("records")
    header = [""] + [str(r["kind"]) for r in rows]
    extra = [(label, fmt) for key, label, fmt in _OPTIONAL_ROWS if rows and key in rows[0]]
    body = [[label] + [fmt(r) for r in rows] for label, fmt in (*_TABLE_ROWS, *extra)]
    widths = [max(len(line[i]) for line in [header, *body]) for i in range(len(header))]
    under = "; ".join(describe_intervention(i) for i in spec.interventions)
    lines = [
        f"{spec.model_name}  ({spec.architecture}, {spec.n_layers} layers, n_ctx {spec.n_ctx})"
        + (f"\nunder {under}" if under else ""),
        "",
        "  ".join(h.ljust(w) for h, w in zip(header, widths, strict=True)).rstrip(),
    ]
    lines += [
        "  ".join(c.ljust(w) for c, w in zip(line, widths, strict=True)).rstrip() for line in body
    ]
    return "\n".join(lines)


_BAND_FILL = ("rgba(47,95,208,0.07)", "rgba(0,0,0,0)")


def _span(planes: tuple[int, ...]) -> str:
    if not planes:
        return "–"
    return f"{planes[0]}" if len(planes) == 1 else f"{planes[0]}–{planes[-1]}"


def _summary_table(data: ReportData) -> pd.DataFrame:
    spec, n_ctx = data.spec, data.n_ctx
    rows = []
    for r in spec.summary().to_dict("records"):
        lr = spec.layers[spec.kinds[r["kind"]][0]]
        rows.append(
            {
                "kind": r["kind"],
                "layers": f"{r['layers']} ({r['n_layers']})",
                "base": "–"
                if r["base"] is None or (isinstance(r["base"], float) and math.isnan(r["base"]))
                else f"{r['base']:g}",
                "rope type": r["rope_type"],
                "rotary / head dim": f"{r['rotary_dim']} / {r['head_dim']}",
                "planes": r["n_planes"],
                "pairing": r["pairing"],
                "heads / kv": f"{r['heads']} / {r['kv_heads']}",
                "score scale": f"1/{1 / r['score_scale']:.4g}"
                if r["score_scale"]
                else "– (no softmax attention)",
                "window": "–" if lr.window is None else f"{lr.window:,}",
                "softcap / sinks": f"{'–' if lr.softcap is None else f'{lr.softcap:g}'} / "
                f"{'learned' if lr.sinks else '–'}",
                "λ range (tokens)": f"{number(r['shortest_wavelength'])} – "
                f"{number(r['longest_wavelength'])}",
                f"planes λ > {n_ctx}": int((lr.wavelength > n_ctx).sum()),
                f"planes λ > {spec.n_ctx:,}": r["planes_beyond_ctx"],
            }
        )
    return pd.DataFrame(rows)


def _band_table(data: ReportData) -> pd.DataFrame:
    bands, spec = data.band_stats.bands, data.spec
    rows = []
    for kind, idx in spec.rotary_kinds.items():
        lr = spec.layers[idx[0]]
        rb = bands.resolve(lr)
        wl = lr.wavelength
        for name, planes in zip(rb.names, rb.planes, strict=True):
            lo, hi = (
                (float(wl[planes[0]]), float(wl[planes[-1]])) if planes else (math.nan, math.nan)
            )
            rows.append(
                {
                    "kind": kind,
                    "band": name,
                    "planes": _span(planes),
                    "n": len(planes),
                    "λ from (tokens)": lo,
                    "λ to (tokens)": hi,
                }
            )
    return pd.DataFrame(rows)


def _wavelength_figure(data: ReportData) -> go.Figure:
    spec, n_ctx = data.spec, data.n_ctx
    fig = go.Figure()
    first = spec.layers[data.layers[0]]
    for b, planes in enumerate(data.band_stats.bands.resolve(first).planes):
        if planes:
            fig.add_vrect(
                x0=planes[0] - 0.5,
                x1=planes[-1] + 0.5,
                fillcolor=_BAND_FILL[b % 2],
                line_width=0,
                layer="below",
            )
    for kind, idx in spec.rotary_kinds.items():
        lr = spec.layers[idx[0]]
        wl = [w if math.isfinite(w) else None for w in lr.wavelength.tolist()]
        base = f", base {lr.base:g}" if lr.base else ""
        fig.add_trace(
            go.Scatter(
                x=list(range(lr.n_planes)),
                y=wl,
                mode="lines+markers",
                marker={"size": 5},
                name=f"{kind} layers{base}",
                customdata=lr.inv_freq.tolist(),
                hovertemplate="plane %{x}<br>λ = %{y:.4g} tokens<br>θ = %{customdata:.3g} "
                "rad/token<extra>" + esc(kind) + "</extra>",
            )
        )
    marks: dict[int, list[str]] = {}
    marks.setdefault(n_ctx, []).append(f"analysis window {n_ctx:,}")
    marks.setdefault(spec.n_ctx, []).append(f"trained context {spec.n_ctx:,}")
    for kind, idx in spec.rotary_kinds.items():
        w = spec.layers[idx[0]].window
        if w:
            marks.setdefault(w, []).append(f"{kind} window {w:,}")
    for i, (y, labels) in enumerate(
        sorted((y, v) for y, v in marks.items() if y and y > 0)
    ):  # a model with no
        hline_log(
            fig, y, " · ".join(labels), "dash" if i % 2 == 0 else "dot"
        )  # configured context: none drawn
    fig.update_yaxes(type="log", title_text="wavelength λ = 2π/θ (tokens)")
    fig.update_xaxes(title_text="plane (0 = highest frequency)")
    fig.update_layout(
        title="Wavelength of every plane against the context (shading: bands)",
        legend={"orientation": "h", "y": -0.2},
    )
    return style_figure(fig, height=420)


def _verification_html(v: dict[str, Any] | None) -> str:
    """Whether the reading below was checked against the model's own attention (prominent when it
    was not)."""
    if not v:
        return ""
    if v.get("status") != "passed":
        return (
            '<p class="placeholder"><b>Unverified.</b> ropelens\'s reading of this model (its '
            "rotation, scores, "
            "mask and softmax) was not checked against the model's own attention (verify=False / "
            "--no-verify): "
            "every number in this report may misdescribe the model.</p>"
        )
    errs = ", ".join(f"{esc(k)} {e:.1e}" for k, e in v.get("errors", {}).items())
    unchecked = v.get("unchecked") or []
    return (
        f"<p><b>Verified</b> on a {v.get('n_tokens')}-token probe against "
        f"{esc(v.get('reference', ''))}: in every rotary layer the captured post-RoPE q and k "
        "are the spec's rotation, and the rebuilt scores and probabilities are the model's "
        f"(largest errors: {errs})."
        + (f" Not checked: {esc('; '.join(unchecked))}." if unchecked else "")
        + "</p>"
    )


def render(data: ReportData) -> Section:
    """Spec per layer kind, the bands, and every plane's wavelength against the context."""
    spec = data.spec
    lr = spec.layers[data.layers[0]]
    widths = [
        (f"{h} query heads over {kv} KV heads, head dim {d}, {p} rotary planes per head", ls)
        for (d, h, kv, p), ls in spec.width_groups(data.layers).items()
    ]
    shape = (
        widths[0][0]
        if len(widths) == 1
        else "; ".join(f"layers {layer_ranges(ls)}: {w}" for w, ls in widths)
    )
    intro = (
        f"<p><b>{esc(data.label)}</b> ({esc(spec.architecture)}): {spec.n_layers} layers, {shape} "
        f"({esc(lr.pairing)} pairing), trained context {spec.n_ctx:,} tokens. Analysed here: "
        f"{len(data.layers)} layers, windows of {data.n_ctx:,} tokens.</p>"
    )
    if data.settings.get("n_ctx_note"):
        note = data.settings["n_ctx_note"]
        intro += f"<p>{esc(note[0].upper() + note[1:])}.</p>"
    intro = _verification_html(data.settings.get("verification")) + intro
    nope = [L for L in range(spec.n_layers) if not spec.layers[L].rotary]
    if nope:
        listed = ", ".join(map(str, nope))
        intro += (
            f"<p>Layers {esc(listed)} apply no RoPE (NoPE layers): they have no planes, so the "
            "per-plane sections below leave them out.</p>"
        )
    frame = spec.to_frame()
    frame["beyond_window"] = frame["wavelength"] > data.n_ctx
    bt = _band_table(data)
    body = "".join(
        [
            intro,
            "<h3>RoPE per layer kind</h3>",
            table_html(
                _summary_table(data),
                text_cols=(
                    "kind",
                    "layers",
                    "base",
                    "rope type",
                    "rotary / head dim",
                    "pairing",
                    "heads / kv",
                    "score scale",
                    "window",
                    "softcap / sinks",
                    "λ range (tokens)",
                ),
                folded=False,  # the model's RoPE in one row per layer kind: the section's point
            ),
            figure_html(
                _wavelength_figure(data),
                "Planes above a line never complete a turn within that many tokens. Hover for θ.",
            ),
            f"<h3>Bands ({esc(bands_in_words(data.band_stats.bands))})</h3>",
            table_html(bt, text_cols=("kind", "band", "planes"), folded=False),
        ]
    )
    numbers = {
        "kinds": dict(spec.kinds),
        "verification": data.settings.get("verification"),
        "planes_beyond_window": {
            k: int((spec.layers[v[0]].wavelength > data.n_ctx).sum())
            for k, v in spec.rotary_kinds.items()
        },
        "bands": bt.to_dict("records"),
    }
    return Section(
        "rope-spec", "Model and RoPE", body, tables={"rope_spec": frame}, numbers=numbers
    )


ANALYSIS = Analysis(
    "rope-spec",
    rope_spec,
    command=Command("rope-spec", run, options),
    section=SectionSpec(
        "rope-spec",
        "Model and RoPE",
        render,
        summary="What each layer rotates, as read and verified.",
    ),
    summary="What each layer of a model rotates: frequencies, wavelengths, pairing, heads and "
    "layer kinds.",
)
