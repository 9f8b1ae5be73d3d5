"""Positional heads: ``head_taxonomy``, ``ropelens head-taxonomy`` and the report's "Positional
heads" section."""

from __future__ import annotations

import argparse

import pandas as pd

from ropelens.analyses.head_taxonomy import HeadTaxonomy, head_taxonomy
from ropelens.analyses.registry import Analysis, draw
from ropelens.cli.common import (
    Command,
    CorpusCommand,
    load_from_args,
    relay,
    signature_default,
)
from ropelens.plots.head_taxonomy import heads_figure, heads_scatter
from ropelens.plots.style import style_figure
from ropelens.report.collect import ReportData
from ropelens.report.html import esc, figure_html, table_html
from ropelens.report.registry import SectionSpec
from ropelens.report.section import Measured, Section
from ropelens.results.findings import Finding, count_of, percent

# the command's defaults are the library's: as many tokens as head_taxonomy's default windows hold
N_CTX = signature_default(head_taxonomy, "n_ctx")
TOKENS = signature_default(head_taxonomy, "n_windows") * N_CTX


def options(p: argparse.ArgumentParser) -> None:
    """``ropelens head-taxonomy [MODEL]``: classify heads as positional or content."""
    CorpusCommand.add_to(p, tokens=TOKENS, n_ctx=N_CTX, save="HeadTaxonomy JSON", bands=False)


def run(args: argparse.Namespace) -> int:
    """Classify attention heads as positional (fixed offset), sink or content

    Score each head's attention at fixed offsets on text windows (--tokens in windows of --n-ctx)
    and on as many windows of random tokens.
    """
    command = CorpusCommand.from_args(args)
    corpus, kw = command.prepare(head_taxonomy)
    del kw["max_tokens"]  # head_taxonomy takes windows: --tokens // --n-ctx of them
    n_windows = command.corpus.n_windows(
        "head-taxonomy", default=command.corpus.tokens == command.tokens_default
    )
    tx = relay(head_taxonomy, load_from_args(args), corpus, n_windows=n_windows, **kw)
    measured = command.measured(tx)
    output = command.output
    output.save_result(tx)
    df = tx.to_frame()
    if output.json:
        return output.emit({**measured, "tau": tx.tau, "heads": df.to_dict("records")})
    pos = df[df.positional].sort_values("robust_mass", ascending=False)
    print(f"tau {tx.tau:.3f}; {len(pos)} positional heads of {len(df)}")
    cols = ["layer", "head", "kind", "best_offset", "mass_text", "mass_random", "sink_text"]
    print(pos[cols].to_string(index=False, float_format="%.3f") if len(pos) else "(none)")
    return 0


def measure(data: ReportData) -> Measured:
    """Positional heads scored on the report's first few windows and on seeded random tokens."""
    n_ctx = min(data.n_ctx, 256)
    n_windows = 2 if data.settings.get("quick") else 4
    tx = head_taxonomy(
        data.model,
        data.tokens[:n_windows, :n_ctx],
        n_ctx=n_ctx,
        n_windows=n_windows,
        layers=list(data.layers),
        bands=data.band_stats.bands,  # the report's bands, so its margin shares can be shared
        progress=False,  # the report's own bar counts its sections
    )
    return Measured(tx, n_ctx, n_windows)


def report_margins(data: ReportData, tx: HeadTaxonomy) -> tuple[pd.DataFrame, bool]:
    """``tx``'s table with its ``margin_share[BAND]`` columns taken from the report's band
    statistics (the sample band_statistics.csv and its findings quote), and whether they were; a
    head's margin share then reads the same everywhere in the report. Band statistics in other
    bands leave the taxonomy's own shares."""
    df = tx.to_frame()
    bs = data.band_stats
    if tuple(bs.band_names) != tuple(tx.band_names) or list(bs.layers) != list(tx.layers):
        return df, False
    shares = (
        bs.to_frame()
        .pivot(index=["layer", "head"], columns="band", values="margin_share")
        .rename(columns=lambda band: f"margin_share[{band}]")
    )
    cols = [f"margin_share[{band}]" for band in tx.band_names]
    keyed = df.set_index(["layer", "head"])
    keyed[cols] = shares.reindex(keyed.index)[cols].to_numpy()
    return keyed.reset_index()[df.columns], True


def render(data: ReportData, heads: Measured) -> Section:
    """Positional heads found by score on text and on seeded random tokens, with their band
    profile."""
    tx, n_ctx, n_windows = heads.value, heads.n_ctx, heads.n_windows
    df, shared = report_margins(data, tx)
    pos = df[df.positional].sort_values("robust_mass", ascending=False)
    high = tx.band_names[0]
    keep = [
        "layer",
        "head",
        "kind",
        "best_offset",
        "mass_text",
        "mass_random",
        f"margin_share[{high}]",
        "top_plane",
        "top_plane_tightness",
    ]
    keep = [c for c in keep if c in df.columns]
    table = pos[keep].rename(
        columns={
            "best_offset": "δ*",
            "mass_text": "mass (text)",
            "mass_random": "mass (random)",
            f"margin_share[{high}]": f"margin share {high}",
            "top_plane_tightness": "top-plane tightness",
        }
    )
    counts = df["kind"].value_counts().to_dict()
    col = f"margin_share[{high}]"
    if len(pos) and col in df.columns:
        m_pos, m_rest = float(pos[col].mean()), float(df[~df.positional][col].mean())
        heads = count_of(len(pos), len(df), "head")
        verb, they, their = (
            ("is", "it takes", "its") if len(pos) == 1 else ("are", "they take", "their")
        )
        text = (
            f"{heads[0].upper() + heads[1:]} {verb} positional (τ = {tx.tau:.2f} on attention "
            f"mass at one fixed offset, on text and on random tokens); {they} "
            f"{percent(m_pos)} of {their} attended-key margin from the highest-frequency band, "
            f"{high}"
            + (f", against {percent(m_rest)} for the other heads." if len(pos) < len(df) else ".")
        )
        numbers = {
            "n_positional": len(pos),
            "tau": tx.tau,
            "margin_high_positional": m_pos,
            "margin_high_other": m_rest,
        }
    else:
        text = (
            f"No head is positional at τ = {tx.tau:.2f} over the {n_windows} windows of "
            f"{n_ctx} tokens scored."
        )
        numbers = {"n_positional": 0, "tau": tx.tau}
    finding = Finding("heads", "head-taxonomy", text, numbers | {"kinds": counts})
    bs_tokens = data.band_stats.provenance.n_tokens
    body = (
        '<p class="lead">A head is positional when one fixed offset δ* = query − key holds at '
        "least τ of its "
        "attention on real text and on seeded random tokens (content removed); τ is Otsu's "
        "threshold on that "
        f"mass over all heads, floored at 0.3. Scored on {n_windows} windows of {n_ctx} tokens"
        + (
            f"; margin shares are the band statistics' ({bs_tokens:,} tokens), as in the "
            "band-statistics section. "
            if shared
            else ", margin shares too. "
        )
        + "Kinds: "
        + esc(", ".join(f"{k} {v}" for k, v in counts.items()))
        + ".</p>"
        + figure_html(style_figure(heads_figure(tx), height=460))
        + table_html(
            table,
            text_cols=("kind",),
            labels={"kind": "head kind"},
            summary="The positional heads, strongest first",
            csv="head_taxonomy",
        )
    )
    return Section(
        "head-taxonomy",
        "Positional heads",
        body,
        tables={"head_taxonomy": df},
        numbers={"tau": tx.tau, "kinds": counts, "positional": table.to_dict("records")},
        findings=[finding],
    )


ANALYSIS = Analysis(
    "head-taxonomy",
    head_taxonomy,
    HeadTaxonomy,
    draw(HeadTaxonomy, figure=heads_figure, scatter=heads_scatter),
    Command("head-taxonomy", run, options, distributed=True),
    SectionSpec(
        "head-taxonomy",
        "Positional heads",
        render,
        measure,
        summary="Heads scored by how much of their attention the highest-frequency planes decide "
        "(diagonal and previous-token heads), with each head's score, its pattern and the planes "
        "it uses.",
    ),
    summary="Heads whose attention one fixed offset decides, on text and on random tokens, and "
    "their bands.",
)
