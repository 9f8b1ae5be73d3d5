"""p-RoPE at inference: ``ropelens prope-sweep`` and the report's "p-RoPE inference sweep"
section."""

from __future__ import annotations

import argparse
from typing import Any

import pandas as pd
import plotly.graph_objects as go

from ropelens.analyses.registry import Analysis
from ropelens.cli.common import (
    Command,
    CorpusOptions,
    ModelOptions,
    OutputOptions,
    check_windows_fit,
    load_from_args,
    note_windows,
    number_list,
)
from ropelens.plots.style import style_figure
from ropelens.report.collect import ReportData
from ropelens.report.experiments import prope_block
from ropelens.report.html import figure_html, table_html
from ropelens.report.registry import SectionSpec
from ropelens.report.section import Section
from ropelens.report.steps import CI_FORMATS, eval_windows, variant_lead, variant_losses
from ropelens.results.findings import Finding, signed
from ropelens.run import data
from ropelens.run.evaluate import MIN_WINDOWS_FOR_CI, bootstrap_ci, interval_text, window_losses
from ropelens.run.intervene import apply_rope_variant
from ropelens.spec import variants as V
from ropelens.spec.variants import PRoPE, PRoPEPartial, PRoPEReversed, kept_planes
from ropelens.validate import check_number


def options(p: argparse.ArgumentParser) -> None:
    """``ropelens prope-sweep [MODEL]``: perplexity when only the highest fraction p of planes
    rotates."""
    ModelOptions.add_to(p)
    p.add_argument("--p", default="0,0.25,0.5,0.75,1", help="comma-separated fractions in [0, 1]")
    # eight validation windows of 256 tokens: enough for a CI, quick on a laptop
    CorpusOptions.add_to(p, tokens=8 * 256, n_ctx=256)
    p.add_argument(
        "--layer-kind", choices=["full", "sliding"], default=None, help="only layers of this kind"
    )
    OutputOptions.add_to(p)


def run(args: argparse.Namespace) -> int:
    """Perplexity under p-RoPE (truncated RoPE) at inference

    Held-out perplexity of the model with p-RoPE applied to its running rotary tables (p = 1 is the
    model's RoPE, p = 0 NoPE), with bootstrap CIs over windows.
    experiments/truncated_rope_inference.py runs the full resumable sweep.
    """
    ps = number_list(args.p, float, "--p", example="0,0.5,1")
    for p in ps:
        check_number(
            p,
            "each of --p",
            at_least=0,
            at_most=1,
            hint=": pass the share of planes that rotate, 0 (NoPE) to 1 (the model's RoPE), e.g. "
            "--p 0,0.5,1",
        )
    variants = [V.PRoPE(p) for p in ps]
    corpus = CorpusOptions.from_args(args)
    _, val = corpus.load().split()  # held-out text: the validation split
    n_windows = max(1, corpus.tokens // corpus.n_ctx)
    check_windows_fit(val, corpus.n_ctx, corpus.tokens, "--tokens", per_window=corpus.n_ctx)
    model = load_from_args(args)
    toks = data.windows(val, model.tokenizer, args.n_ctx, n_windows=n_windows)
    note_windows(
        val.name, int(toks.shape[0]), args.n_ctx, corpus.tokens, "--tokens", per_window=args.n_ctx
    )
    rows = []
    for p, v in zip(ps, variants):
        with apply_rope_variant(model, v, layer_kind=args.layer_kind):
            est = bootstrap_ci(window_losses(model, toks, progress=False))
        rows.append(
            {
                "p": p,
                "loss": est.loss.mean,
                "ppl": est.perplexity.mean,
                "ppl_lo": est.perplexity.lo,
                "ppl_hi": est.perplexity.hi,
            }
        )
    output = OutputOptions.from_args(args)
    if output.json:
        return output.emit(
            {"n_ctx": args.n_ctx, "windows": int(toks.shape[0]), "rows": rows}, indent=1
        )
    print(f"{'p':>6} {'loss':>8} {'ppl':>9}  95% CI ({toks.shape[0]} windows of {args.n_ctx})")
    for r in rows:
        print(
            f"{r['p']:>6.3f} {r['loss']:8.4f} {r['ppl']:9.2f}  "
            f"{interval_text(r['ppl_lo'], r['ppl_hi'], '.2f')}"
        )
    return 0


NEGLIGIBLE_NATS = 0.05  # a loss change below this (upper CI end) counts as "keeps its perplexity"


def _prope_variants() -> list[Any]:

    return [
        *(PRoPE(p) for p in (1.0, 0.0, 0.125, 0.25, 0.5, 0.75, 0.875)),
        PRoPEReversed(0.75),
        PRoPEPartial(0.75),
    ]


def _variant_name(v: Any) -> str:
    return {
        "PRoPE": "RoPE (p = 1)" if v.p == 1 else f"p-RoPE p = {v.p:g}",
        "PRoPEReversed": f"reversed p = {v.p:g} (lowest kept)",
        "PRoPEPartial": f"partial p = {v.p:g} (first dims)",
    }[type(v).__name__]


def measure(data: ReportData) -> pd.DataFrame:
    """Perplexity and loss change of every p-RoPE variant, one row each (reads the baseline
    step)."""
    n_planes = data.spec.layers[data.layers[0]].n_planes
    rows = []
    for (
        v
    ) in _prope_variants():  # p = 1 is the model itself: variant_losses reuses the baseline for it
        rows.append(
            {"variant": _variant_name(v), "p": v.p, "planes rotating": kept_planes(v.p, n_planes)}
            | {k: x for k, x in variant_losses(data, v).items() if k != "identity"}
        )
    return pd.DataFrame(rows)


def render(data: ReportData, frame: pd.DataFrame) -> Section:
    """Perplexity when only the highest fraction p of frequencies keeps rotating, in every layer."""
    n_planes = data.spec.layers[data.layers[0]].n_planes
    fig = go.Figure()
    kinds = {
        "p-RoPE": frame[frame.variant.str.startswith(("p-RoPE", "RoPE"))].sort_values("p"),
        "reversed": frame[frame.variant.str.startswith("reversed")],
        "partial": frame[frame.variant.str.startswith("partial")],
    }
    for (label, sel), sym in zip(kinds.items(), ("circle", "triangle-down", "square"), strict=True):
        fig.add_trace(
            go.Scatter(
                x=sel.p,
                y=sel.ppl,
                name=label,
                mode="lines+markers" if label == "p-RoPE" else "markers",
                marker={"symbol": sym, "size": 9},
                text=sel.variant,
                hovertemplate="%{text}<br>perplexity %{y:.4g}<extra></extra>",
                error_y={
                    "type": "data",
                    "symmetric": False,
                    "array": (sel.ppl_hi - sel.ppl).tolist(),
                    "arrayminus": (sel.ppl - sel.ppl_lo).tolist(),
                },
            )
        )
    fig.update_xaxes(
        title_text="p: share of the highest frequencies that keep rotating (p = 0 is NoPE)"
    )
    fig.update_yaxes(title_text="perplexity (95% CI over windows)", type="log")
    fig.update_layout(title="p-RoPE at inference: every layer, no retraining")

    prope = frame[frame.variant.str.startswith("p-RoPE")]
    ok = prope[prope["Δ hi"] < NEGLIGIBLE_NATS]
    p_min = float(ok.p.min()) if len(ok) else None
    n_windows = int(eval_windows(data).shape[0])
    nope = float(frame.loc[frame.p == 0.0, "Δ loss"].iloc[0])
    rev = frame[frame.variant.str.startswith("reversed")].iloc[0]
    part = frame[frame.variant.str.startswith("partial")].iloc[0]
    p75 = prope[prope.p == 0.75].iloc[0]
    if n_windows < MIN_WINDOWS_FOR_CI:
        keeps = (
            "the loss changes have no interval (one window gives no spread), so no truncation "
            "is judged to keep the perplexity"
        )
    elif p_min is None:
        keeps = f"every truncation tested costs at least {NEGLIGIBLE_NATS} nats"
    else:
        keeps = (
            f"the model keeps its perplexity (Δ loss under {NEGLIGIBLE_NATS} nats, upper CI end) "
            f"down to p = {p_min:.3f}, {kept_planes(p_min, n_planes)} of {n_planes} planes "
            "rotating"
        )
    text = (
        f"Truncating RoPE at inference, {keeps}; NoPE (p = 0) costs {signed(nope, unit='nats')}. "
        f"At 0.75 of the planes, keeping the highest frequencies costs "
        f"{signed(p75['Δ loss'], unit='nats')}, the lowest (reversed) "
        f"{signed(rev['Δ loss'], unit='nats')}, and re-spread frequencies over the first dims "
        f"(partial) {signed(part['Δ loss'], unit='nats')}."
    )
    finding = Finding(
        "prope",
        "prope-sweep",
        text,
        {
            "p_min_negligible": p_min,
            "nope_delta": nope,
            "p075_delta": float(p75["Δ loss"]),
            "reversed_delta": float(rev["Δ loss"]),
            "partial_delta": float(part["Δ loss"]),
            "threshold_nats": NEGLIGIBLE_NATS,
        },
    )  # every float is quoted to 2 decimals
    extra, extra_tables = prope_block(data.experiments, data.label)
    body = (
        variant_lead(
            data,
            "Barbero et al.'s p-RoPE keeps rotating only the fraction p of the highest frequencies "
            "and leaves the rest unrotated (θ = 0), in every layer, here without any retraining. "
            "Reversed keeps the lowest frequencies instead; partial rotates the first dims with "
            "frequencies re-spread over them, as in the paper's ablations.",
        )
        + figure_html(style_figure(fig, height=420))
        + table_html(
            frame,
            text_cols=("variant",),
            formats={"planes rotating": lambda v: str(int(v)), **CI_FORMATS},
            summary="Perplexity and Δ loss per variant, with 95% CIs",
            csv="prope_sweep",
        )
        + extra
    )
    return Section(
        "prope-sweep",
        "p-RoPE inference sweep",
        body,
        tables={"prope_sweep": frame} | extra_tables,
        numbers={
            "rows": frame.to_dict("records"),
            "n_windows": int(eval_windows(data).shape[0]),
            "n_ctx": int(eval_windows(data).shape[1]),
        },
        findings=[finding],
    )


ANALYSIS = Analysis(
    "prope-sweep",
    command=Command("prope-sweep", run, options),
    section=SectionSpec(
        "prope-sweep",
        "p-RoPE inference sweep",
        render,
        measure,
        needs=("variants_baseline",),
        summary="Perplexity when only the fraction p of the highest frequencies keeps rotating at "
        "inference (p = 1 is RoPE, p = 0 NoPE), with the reversed and partial variants.",
    ),
    summary="Perplexity with only the highest fraction p of the frequencies rotating (p-RoPE), "
    "with bootstrap CIs.",
)
