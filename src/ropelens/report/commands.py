"""The ``report``, ``usage`` and ``decompose`` subcommands of the ``ropelens`` command line.

Each ``add_*`` builds its parser on the shared options of :mod:`ropelens.cli`; bad input raises
``ValueError``/``OSError``, which the CLI reports as one line with exit code 2.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from typing import Any

__all__ = ["add_decompose", "add_report", "add_usage"]


# ---------------------------------------------------------------------------------------- argument types
def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {value}")
    return value


def _layers(text: str) -> list[int]:
    try:
        out = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated layer indices such as 0,5,11, got {text!r}") from None
    if not out:
        raise argparse.ArgumentTypeError("expected at least one layer index, e.g. --layers 0,5,11")
    return out


def _band_tokens(text: str) -> int | None:
    return None if text.strip().lower() == "all" else _positive_int(text)


def _model_arg(p: argparse.ArgumentParser) -> None:
    from ropelens.models import DEFAULT_MODEL, EMBEDDED_MODELS

    p.add_argument("model", nargs="?", default=None,
                   help=f"embedded name ({', '.join(EMBEDDED_MODELS)}; default {DEFAULT_MODEL}), a .gguf file, "
                        "an HF model directory, or a hub name (needs the network)")


def _corpus_args(p: argparse.ArgumentParser, *, tokens: int | None, n_ctx: int) -> None:
    p.add_argument("--corpus", default="english", metavar="PATH|english|python",
                   help="text to run on: a built-in corpus or a .txt/.md file or directory (default: english)")
    if tokens is not None:
        p.add_argument("--tokens", type=_positive_int, default=tokens, metavar="N",
                       help=f"tokens to analyse, cut into windows of --n-ctx (default: {tokens:,})")
    p.add_argument("--n-ctx", type=_positive_int, default=n_ctx, metavar="N",
                   help=f"tokens per window, BOS included (default: {n_ctx})")


def _analysis_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--bands", default="quantiles:4", metavar="SPEC",
                   help="how planes group into bands: planes, all, quantiles:N, wavelength:E1,E2,..., context[:F] "
                        "(default: quantiles:4)")
    p.add_argument("--layers", type=_layers, default=None, metavar="0,5,11",
                   help="layer indices to analyse (default: all)")


def _common(p: argparse.ArgumentParser) -> None:
    from ropelens.cli import add_common_options

    add_common_options(p)


def _load(args: argparse.Namespace):
    from ropelens.cli import load_from_args

    return load_from_args(args)


def _say(line: str = "") -> None:
    """One line of command output on stdout (this module is command-line code)."""
    sys.stdout.write(line + "\n")


def _emit(obj: Any) -> None:
    _say(json.dumps(obj, indent=2, allow_nan=False))


def _fmt(x: float) -> str:
    return "    –" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:5.2f}"


# ---------------------------------------------------------------------------------------- report
def add_report(subparsers: argparse._SubParsersAction) -> None:
    """``ropelens report [MODEL]``: the HTML report."""
    from ropelens.report.build import DEFAULT_BAND_TOKENS

    p = subparsers.add_parser(
        "report", help="write a self-contained HTML report (usage, band decomposition, findings)",
        description="Measure frequency usage and the band decomposition of attention in one pass over a corpus, "
                    "and write OUT/index.html (works offline), report.json and one CSV per table.")
    _model_arg(p)
    _corpus_args(p, tokens=32_768, n_ctx=512)
    p.add_argument("--out", default="ropelens-report", metavar="DIR", help="output directory (default: ropelens-report)")
    _analysis_args(p)
    p.add_argument("--band-tokens", type=_band_tokens, default=DEFAULT_BAND_TOKENS, metavar="N|all",
                   help=f"tokens band statistics see, from evenly spread windows (default: {DEFAULT_BAND_TOKENS:,}; "
                        "'all' for every window; each window costs about 0.6x a forward pass on top of frequency usage)")
    p.add_argument("--quick", action="store_true",
                   help="smoke test: 4 windows of 256 tokens over a few layers (about a minute on a laptop CPU)")
    p.add_argument("--experiments", default=None, metavar="DIR",
                   help="folder the experiment scripts wrote (e.g. results/): their tables for this model join "
                        "the p-RoPE and context-extension sections")
    _common(p)
    p.set_defaults(func=run_report)


def run_report(args: argparse.Namespace) -> int:
    """Build the report and print where it is (and the findings)."""
    from ropelens.bands import Bands
    from ropelens.report.build import build_report, check_output_dir, resolve_corpus

    Bands.parse(args.bands)  # bad bands, output or corpus fail before the model loads
    out = check_output_dir(args.out)
    corpus, _ = resolve_corpus(args.corpus)
    from ropelens.report.experiments import load_experiments

    load_experiments(args.experiments)
    model = _load(args)
    path = build_report(model, corpus=corpus, tokens=args.tokens, n_ctx=args.n_ctx, out=out, bands=args.bands,
                        layers=args.layers, quick=args.quick, band_tokens=args.band_tokens,
                        experiments=args.experiments)
    report = json.loads((path / "report.json").read_text())
    if args.json:
        _emit({"out": str(path), "index": str(path / "index.html"), "findings": report["findings"],
               "seconds": report["provenance"]["seconds"], "steps_seconds": report["provenance"]["steps_seconds"]})
        return 0
    _say(f"report: {path / 'index.html'}")
    for i, f in enumerate(report["findings"], start=1):
        _say(f"  {i}. {f['text']}")
    return 0


# ---------------------------------------------------------------------------------------- usage
def add_usage(subparsers: argparse._SubParsersAction) -> None:
    """``ropelens usage [MODEL]``: frequency usage per layer and band."""
    p = subparsers.add_parser(
        "usage", help="per-plane norms of queries and keys over a corpus (energy per band, per layer)",
        description="Mean 2-norm of every RoPE plane of the queries and keys over a corpus; prints each band's "
                    "share of the energy per layer (sink positions excluded).")
    _model_arg(p)
    _corpus_args(p, tokens=32_768, n_ctx=512)
    _analysis_args(p)
    p.add_argument("--save", default=None, metavar="FILE.json", help="also save the full result (FrequencyUsage JSON)")
    _common(p)
    p.set_defaults(func=run_usage)


def run_usage(args: argparse.Namespace) -> int:
    """Stream frequency usage and print the energy share of each band per layer."""
    from ropelens.bands import Bands
    from ropelens.data import load_corpus
    from ropelens.report.build import check_output_dir
    from ropelens.usage import frequency_usage

    bands = Bands.parse(args.bands)
    corpus = load_corpus(args.corpus)
    if args.save:
        check_output_dir(_parent(args.save))
    if args.tokens < args.n_ctx:
        raise ValueError(f"--tokens {args.tokens} is fewer than one window of --n-ctx {args.n_ctx}: raise --tokens or lower --n-ctx")
    model = _load(args)
    u = frequency_usage(model, corpus, n_ctx=args.n_ctx, max_tokens=args.tokens, layers=args.layers,
                        progress=not args.json)
    if args.save:
        u.save(args.save)
    names, q = u.band_share(bands, "q", "no_sink")
    _, k = u.band_share(bands, "k", "no_sink")
    q, k = q.mean(1), k.mean(1)  # heads averaged
    if args.json:
        _emit({"model": u.provenance.model, "corpus": u.provenance.corpus, "n_tokens": u.provenance.n_tokens,
               "n_ctx": u.provenance.n_ctx, "layers": list(u.layers), "bands": list(names), "scope": "no_sink",
               "q_energy_share": q.tolist(), "k_energy_share": k.tolist(),
               "q_norm": u.norm("q", "no_sink").mean(1).tolist(), "k_norm": u.norm("k", "no_sink").mean(1).tolist()})
        return 0
    prov = u.provenance
    _say(f"{prov.model}: {prov.n_tokens:,} tokens of {prov.corpus} in {prov.n_windows} windows of {prov.n_ctx}; "
          "share of energy per band, heads averaged, sink excluded")
    short = [n.split(" (")[0] for n in names]  # "Q1 (highest)" → "Q1"; the order says which end is which
    w = max(6, *(len(n) + 2 for n in short))
    _say("layer  " + "".join(f"{'q ' + n:>{w}}" for n in short) + "  " + "".join(f"{'k ' + n:>{w}}" for n in short))
    for i, L in enumerate(u.layers):
        _say(f"{L:5d}  " + "".join(f"{float(x):{w}.3f}" for x in q[i]) + "  " + "".join(f"{float(x):{w}.3f}" for x in k[i]))
    return 0


def _parent(path: str) -> str:
    from pathlib import Path

    return str(Path(path).expanduser().resolve().parent)


# ---------------------------------------------------------------------------------------- decompose
def add_decompose(subparsers: argparse._SubParsersAction) -> None:
    """``ropelens decompose [MODEL]``: band shares of one text or corpus window, per head."""
    p = subparsers.add_parser(
        "decompose", help="per-head band shares of the attention logits for one text or corpus window",
        description="Decompose every attention logit of one input into bands and print, per head, each band's share "
                    "of the attended-key margin and how often the band alone picks the attended key.")
    _model_arg(p)
    src = p.add_mutually_exclusive_group()
    src.add_argument("--text", default=None, help="the text to decompose (BOS is prepended)")
    src.add_argument("--corpus", default=None, metavar="PATH|english|python",
                     help="take one window of this corpus instead (default: english)")
    p.add_argument("--window", type=int, default=0, metavar="I", help="which corpus window (default: 0)")
    p.add_argument("--n-ctx", type=_positive_int, default=512, metavar="N", help="tokens in the corpus window (default: 512)")
    _analysis_args(p)
    _common(p)
    p.set_defaults(func=run_decompose)


def _one_window(model, args: argparse.Namespace):
    from ropelens.data import load_corpus, windows

    if args.text is not None:
        if not args.text.strip():
            raise ValueError("--text is empty: pass the text to decompose, e.g. --text 'The cat sat on the mat.'")
        return model.to_tokens(args.text), "text"
    if args.window < 0:
        raise ValueError(f"--window must be ≥ 0, got {args.window}")
    corpus = load_corpus(args.corpus or "english")
    toks = windows(corpus, model.tokenizer, args.n_ctx, n_windows=args.window + 1)
    if toks.shape[0] <= args.window:
        raise ValueError(f"corpus {corpus.name!r} has {toks.shape[0]} windows of {args.n_ctx} tokens; "
                         f"--window {args.window} does not exist: pick 0..{toks.shape[0] - 1}")
    return toks[args.window : args.window + 1], f"{corpus.name} window {args.window}"


def run_decompose(args: argparse.Namespace) -> int:
    """Band statistics of one input, printed per layer and head."""
    from ropelens.bands import Bands
    from ropelens.data import load_corpus
    from ropelens.decompose import band_statistics

    bands = Bands.parse(args.bands)
    if args.text is not None and not args.text.strip():
        raise ValueError("--text is empty: pass the text to decompose, e.g. --text 'The cat sat on the mat.'")
    if args.text is None:
        load_corpus(args.corpus or "english")  # an unreadable corpus fails before the model loads
    model = _load(args)
    toks, what = _one_window(model, args)
    st = band_statistics(model, toks, bands=bands, layers=args.layers, batch_size=1, jsd=True, progress=False)
    frame = st.to_frame()
    if args.json:
        _emit({"model": st.provenance.model, "input": what, "n_tokens": int(toks.shape[1]), "bands": list(st.band_names),
               "layers": list(st.layers),
               "heads": [{k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in r.items()}
                         for r in frame.to_dict("records")]})
        return 0
    _say(f"{st.provenance.model}: {what}, {int(toks.shape[1])} tokens, bands {bands.describe()}")
    _say("per head and band: share of the attended-key margin | band-only top-1 agreement")
    names = list(st.band_names)
    for L in st.layers:
        rows = frame[frame["layer"] == L]
        _say(f"\nlayer {L}")
        _say("head  " + "  ".join(f"{n[:13]:>13}" for n in names))
        for h, g in rows.groupby("head", sort=True):
            cells = [f"{_fmt(float(r.margin_share))}|{_fmt(float(r.top1)).strip():>5}" for r in g.itertuples()]
            _say(f"{int(h):4d}  " + "  ".join(f"{c:>13}" for c in cells))
    return 0
