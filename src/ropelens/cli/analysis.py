"""``ropelens usage``, ``decompose``, ``decompose-stats``, ``heads``, ``bands`` and ``entropy``: the corpus analyses,
printed as tables or JSON."""

from __future__ import annotations

import argparse
import math

from ropelens.cli.common import (
    AnalysisOptions,
    CheckpointOptions,
    CorpusCommand,
    CorpusOptions,
    ModelOptions,
    OutputOptions,
    add_command,
    check_windows_fit,
    load_from_args,
    note,
    note_windows,
    positive_int,
    window_length,
)
from ropelens.errors import InputError

__all__ = ["add_bands", "add_decompose", "add_decompose_stats", "add_entropy", "add_heads", "add_usage"]


def _fmt(x: float) -> str:
    """Two decimals, or n/a where the value is not measurable (a band with no plane in the layer)."""
    return "  n/a" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:5.2f}"


# ---------------------------------------------------------------------------------------- usage
def add_usage(subparsers: argparse._SubParsersAction) -> None:
    """``ropelens usage [MODEL]``: frequency usage per layer and band."""
    p = add_command(subparsers, "usage", run_usage, distributed=True)
    CorpusCommand.add_to(p, tokens=32_768, n_ctx=512, save="FrequencyUsage JSON")


def run_usage(args: argparse.Namespace) -> int:
    """Per-plane norms of queries and keys over a corpus (energy per band, per layer)

    Mean 2-norm of every RoPE plane of the queries and keys over a corpus; prints each band's share of the
    energy per layer (sink positions excluded).
    """
    from ropelens.analyses.usage import frequency_usage

    run = CorpusCommand.from_args(args)
    corpus, kw = run.prepare(frequency_usage)
    u = frequency_usage(load_from_args(args), corpus, **kw)
    used = run.measured(u)
    run.output.save_result(u)
    bands = run.analysis.parsed_bands()
    names, q = u.band_share(bands, "q", "no_sink")
    _, k = u.band_share(bands, "k", "no_sink")
    q, k = q.nanmean(1), k.nanmean(1)  # heads averaged (heads a narrower layer lacks are NaN)
    if run.output.json:
        prov = u.provenance
        return run.output.emit({
            "model": prov.model, "corpus": prov.corpus, **used,
            "layers": list(u.layers), "bands": list(names), "scope": "no_sink",
            "q_energy_share": q.tolist(), "k_energy_share": k.tolist(),
            "q_norm": u.norm("q", "no_sink").nanmean(1).tolist(), "k_norm": u.norm("k", "no_sink").nanmean(1).tolist()})
    prov = u.provenance
    print(f"{prov.model}: {prov.n_tokens:,} tokens of {prov.corpus} in {prov.n_windows} windows of {prov.n_ctx}; "
          "share of energy per band, heads averaged, sink excluded")
    short = [n.split(" (")[0] for n in names]  # "Q1 (highest)" → "Q1"; the order says which end is which
    w = max(6, *(len(n) + 2 for n in short))
    print("layer  " + "".join(f"{'q ' + n:>{w}}" for n in short) + "  " + "".join(f"{'k ' + n:>{w}}" for n in short))
    for i, L in enumerate(u.layers):
        print(f"{L:5d}  " + "".join(f"{float(x):{w}.3f}" for x in q[i]) + "  " + "".join(f"{float(x):{w}.3f}" for x in k[i]))
    return 0


def add_decompose_stats(subparsers: argparse._SubParsersAction) -> None:
    """``ropelens decompose-stats [MODEL]``: the band decomposition's statistics over a corpus."""
    p = add_command(subparsers, "decompose-stats", run_decompose_stats, distributed=True)
    CorpusCommand.add_to(p, tokens=32_768, n_ctx=512, save="BandStatistics JSON")
    p.add_argument("--jsd", action="store_true", help="also the JS divergence of each band-only pattern (slower)")
    p.add_argument("--batch-size", type=positive_int, default=4, metavar="N", help="windows per forward (default: 4)")


def run_decompose_stats(args: argparse.Namespace) -> int:
    """Band decomposition statistics over a corpus (margin, variance, |logit| shares)

    Streams the exact per-band decomposition of every attention logit over a corpus and prints, per layer and
    band (heads averaged), the share of the attended-key margin, of the within-query logit variance and of the
    mean |logit|, and band-only top-1 agreement.
    """
    from ropelens.analyses.band_stats import band_statistics

    run = CorpusCommand.from_args(args)
    corpus, kw = run.prepare(band_statistics)
    st = band_statistics(load_from_args(args), corpus, **kw, batch_size=args.batch_size, jsd=args.jsd)
    used = run.measured(st)
    run.output.save_result(st)
    df = st.to_frame().drop(columns="head").groupby(["layer", "band"], sort=False).mean().reset_index()
    if run.output.json:
        return run.output.emit({"model": st.provenance.model, **used,
                                "bands": list(st.band_names), "rows": df.to_dict("records")})
    prov = st.provenance
    print(f"{prov.model}: {prov.n_tokens:,} tokens of {prov.corpus} in {prov.n_windows} windows of {prov.n_ctx}; "
          f"bands {st.bands.describe()}, heads averaged")
    cols = [c for c in ("margin_share", "var_share", "abs_share", "top1", "jsd") if c in df.columns]
    # n/a: a band with no plane in that layer, whose band-only agreement is not measurable
    print(df[["layer", "band", *cols]].to_string(index=False, float_format="%.3f", na_rep="n/a"))
    return 0


# ---------------------------------------------------------------------------------------- decompose
def add_decompose(subparsers: argparse._SubParsersAction) -> None:
    """``ropelens decompose [MODEL]``: band shares of one text or corpus window, per head."""
    p = add_command(subparsers, "decompose", run_decompose)
    ModelOptions.add_to(p)
    src = p.add_mutually_exclusive_group()
    src.add_argument("--text", default=None, help="the text to decompose (BOS is prepended)")
    CorpusOptions.add_to(p, tokens=None, n_ctx=512, corpus_group=src)
    p.add_argument("--window", type=int, default=0, metavar="I", help="which corpus window (default: 0)")
    AnalysisOptions.add_to(p)
    OutputOptions.add_to(p)


def _text_tokens(model, text: str):
    """``--text`` as ``[1, pos]`` tokens, BOS first; past the model's context only its first n_ctx tokens, with a note."""
    import inspect

    whole = {"truncate": False} if "truncate" in inspect.signature(model.to_tokens).parameters else {}
    toks = model.to_tokens(text, **whole)
    n, limit = int(toks.shape[1]), int(getattr(model.cfg, "n_ctx", 0) or 0)
    if limit and n > limit:
        note(f"--text is {n:,} tokens, longer than the model's context of {limit:,}: decomposed its first {limit:,}")
        return toks[:, :limit], f"text (first {limit:,} of {n:,} tokens)"
    return toks, "text"


def _one_window(model, args: argparse.Namespace, corpus):
    from ropelens.run.data import windows

    if corpus is None:
        return _text_tokens(model, args.text)
    toks = windows(corpus, model.tokenizer, args.n_ctx, n_windows=args.window + 1)
    if toks.shape[0] <= args.window:
        raise InputError(f"corpus {corpus.name!r} has {toks.shape[0]} windows of {args.n_ctx} tokens; "
                         f"--window {args.window} does not exist: pick 0..{toks.shape[0] - 1}")
    return toks[args.window : args.window + 1], f"{corpus.name} window {args.window}"


def run_decompose(args: argparse.Namespace) -> int:
    """Per-head band shares of the attention logits for one text or corpus window

    Decompose every attention logit of one input into bands and print, per head, each band's share of the
    attended-key margin and how often the band alone picks the attended key.
    """
    from ropelens.analyses.band_stats import band_statistics

    analysis, output = AnalysisOptions.from_args(args), OutputOptions.from_args(args)
    if args.text is not None and not args.text.strip():
        raise InputError("--text is empty: pass the text to decompose, e.g. --text 'The cat sat on the mat.'")
    if args.text is None and args.window < 0:
        raise InputError(f"--window must be ≥ 0, got {args.window}: pick a corpus window such as --window 0")
    corpus = None if args.text is not None else CorpusOptions.from_args(args).load()  # fails before the model loads
    model = load_from_args(args)
    toks, what = _one_window(model, args, corpus)
    bands = analysis.parsed_bands()
    st = band_statistics(model, toks, bands=bands, layers=analysis.layers, batch_size=1, jsd=True,
                         progress=False, verify=not analysis.no_verify)
    frame = st.to_frame()
    if output.json:
        return output.emit({"model": st.provenance.model, "input": what, "n_tokens": int(toks.shape[1]),
                            "bands": list(st.band_names), "layers": list(st.layers), "heads": frame.to_dict("records")})
    print(f"{st.provenance.model}: {what}, {int(toks.shape[1])} tokens, bands {bands.describe()}")
    print("per head and band: share of the attended-key margin | band-only top-1 agreement")
    names = list(st.band_names)
    for L in st.layers:
        rows = frame[frame["layer"] == L]
        print(f"\nlayer {L}")
        print("head  " + "  ".join(f"{n[:13]:>13}" for n in names))
        for h, g in rows.groupby("head", sort=True):
            cells = [f"{_fmt(float(r.margin_share))}|{_fmt(float(r.top1)).strip():>5}" for r in g.itertuples()]
            print(f"{int(h):4d}  " + "  ".join(f"{c:>13}" for c in cells))
    return 0


# ---------------------------------------------------------------------------------------- heads
def add_heads(subparsers: argparse._SubParsersAction) -> None:
    """``ropelens heads [MODEL]``: classify heads as positional or content (ropelens.analyses.heads)."""
    p = add_command(subparsers, "heads", run_heads, distributed=True)
    ModelOptions.add_to(p)
    p.add_argument("--windows", type=positive_int, default=8, metavar="N",
                   help="text windows (and as many random-token windows)")
    p.add_argument("--n-ctx", type=window_length, default=256, metavar="N", help="tokens per window")
    AnalysisOptions.add_to(p, bands=False)
    CheckpointOptions.add_to(p)
    OutputOptions.add_to(p, save="HeadTaxonomy JSON", deprecated_out=True)


def run_heads(args: argparse.Namespace) -> int:
    """Classify attention heads as positional (fixed offset), sink or content

    Score each head's attention at fixed offsets on text and random tokens.
    """
    from ropelens.analyses.heads import classify_heads
    from ropelens.run.data import load_corpus

    output = OutputOptions.from_args(args)
    output.check()
    checkpoint = CheckpointOptions.from_args(args).kwargs()  # a bad --checkpoint fails before the model loads
    analysis = AnalysisOptions.from_args(args)
    check_windows_fit(load_corpus("english"), args.n_ctx, args.windows, "--windows", other_corpus=False)
    tx = classify_heads(load_from_args(args), n_ctx=args.n_ctx, n_windows=args.windows, layers=analysis.layers,
                        verify=not analysis.no_verify, progress=False, **checkpoint)
    prov = tx.provenance
    note_windows(prov.corpus, prov.n_windows, args.n_ctx, args.windows, "--windows")
    output.save_result(tx)
    df = tx.to_frame()
    if output.json:
        return output.emit({"n_ctx": prov.n_ctx, "n_windows": prov.n_windows, "tau": tx.tau,
                            "heads": df.to_dict("records")})
    pos = df[df.positional].sort_values("robust_mass", ascending=False)
    print(f"tau {tx.tau:.3f}; {len(pos)} positional heads of {len(df)}")
    cols = ["layer", "head", "kind", "best_offset", "mass_text", "mass_random", "sink_text"]
    print(pos[cols].to_string(index=False, float_format="%.3f") if len(pos) else "(none)")
    return 0


# ---------------------------------------------------------------------------------------- bands
def add_bands(subparsers: argparse._SubParsersAction) -> None:
    """``ropelens bands [MODEL]``: where the high-norm frequency band sits, and NoPE below it."""
    p = add_command(subparsers, "bands", run_bands)
    CorpusCommand.add_to(p, tokens=4096, n_ctx=256, save="FrequencyBands JSON", bands=False)
    p.add_argument("--which", choices=("q", "k"), default="q", help="locate the band in queries or keys (default: q)")
    p.add_argument("--no-intervene", action="store_true",
                   help="only locate the band (skip the loss of unrotating the planes below it)")
    p.add_argument("--eval-windows", type=positive_int, default=8, metavar="N",
                   help="windows the intervention's loss is measured on (default: 8)")
    p.add_argument("--seed", type=int, default=0, help="seed of the random control planes (default: 0)")


def run_bands(args: argparse.Namespace) -> int:
    """Locate the high-norm frequency band per layer (Oka et al.) and make the planes below it NoPE

    From the per-plane mean norms over a corpus: each layer's band (the contiguous planes around the peak at
    or above half-way from the median to the peak), its wavelengths against the training length and the
    critical plane; then the loss with the planes below the band unrotated, against as many random planes.
    """
    from ropelens.analyses.band_location import frequency_bands

    run = CorpusCommand.from_args(args)
    corpus, kw = run.prepare(frequency_bands)
    r = frequency_bands(load_from_args(args), corpus, **kw, which=args.which, intervene=not args.no_intervene,
                        eval_windows=args.eval_windows, seed=args.seed)
    used = run.measured(r)
    run.output.save_result(r)
    df = r.to_frame()
    layers = df[df["head"] == -1].drop(columns="head")
    found = r.findings()
    if run.output.json:
        return run.output.emit({"model": r.provenance.model, **used, "train_ctx": r.spec.n_ctx, "which": r.which,
                                "layers": layers.to_dict("records"), "findings": [f.to_dict() for f in found],
                                "intervention": None if r.intervention is None else r.intervention.to_dict()})
    prov = r.provenance
    print(f"{prov.model}: {prov.n_tokens:,} tokens of {prov.corpus} in {prov.n_windows} windows of {prov.n_ctx}; "
          f"band of the {'queries' if r.which == 'q' else 'keys'}, heads averaged, sink excluded")
    cols = ["layer", "peak", "lo", "hi", "prominence", "peak_wavelength", "critical_plane", "n_below"]
    print(layers[cols].to_string(index=False, float_format="%.2f"))
    for f in found:
        print(f.text)
    return 0


# ---------------------------------------------------------------------------------------- entropy
def add_entropy(subparsers: argparse._SubParsersAction) -> None:
    """``ropelens entropy [MODEL]``: spectral entropy of each plane's query norm along the sequence."""
    p = add_command(subparsers, "entropy", run_entropy, distributed=True)
    CorpusCommand.add_to(p, tokens=8192, n_ctx=256, save="FrequencyEntropy JSON", bands=False)
    p.add_argument("--skip", type=int, default=1, metavar="N",
                   help="leading positions of each window left out (the attention sink; default: 1)")
    p.add_argument("--seed", type=int, default=0, help="seed of the shuffled-order control (default: 0)")


def run_entropy(args: argparse.Namespace) -> int:
    """Spectral entropy of each plane's query norm along the sequence, NoPE layers included

    Per layer, head and plane: the normalised Shannon entropy of the power spectrum of the plane's query norm
    over positions (1 = flat), against the same values in a shuffled order; printed per layer, heads and
    planes averaged.
    """
    from ropelens.analyses.entropy import frequency_entropy

    run = CorpusCommand.from_args(args)
    corpus, kw = run.prepare(frequency_entropy)
    r = frequency_entropy(load_from_args(args), corpus, **kw, skip=args.skip, seed=args.seed)
    used = run.measured(r)
    run.output.save_result(r)
    h, s = r.entropy().nanmean((1, 2)), r.entropy(shuffled=True).nanmean((1, 2))
    rows = [{"layer": L, "kind": r.kind(L), "entropy": float(h[i]), "shuffled": float(s[i]),
             "gap": float(s[i] - h[i])} for i, L in enumerate(r.layers)]
    found = r.findings()
    if run.output.json:
        return run.output.emit({"model": r.provenance.model, **used, "n_pos": r.n_pos, "layers": rows,
                                "by_kind": r.by_kind(), "findings": [f.to_dict() for f in found]})
    prov = r.provenance
    print(f"{prov.model}: {prov.n_tokens:,} tokens of {prov.corpus} in {prov.n_windows} windows of {prov.n_ctx}; "
          "normalised spectral entropy of each plane's query norm, heads and planes averaged")
    print("layer  kind   entropy  shuffled     gap")
    for row in rows:
        print(f"{row['layer']:5d}  {row['kind']:<5} {row['entropy']:8.4f}  {row['shuffled']:8.4f}  {row['gap']:+7.4f}")
    for f in found:
        print(f.text)
    return 0
