"""The exact per-plane decomposition of one input's attention logits: ``attention_decomposition``
and ``ropelens attention-decomposition``."""

from __future__ import annotations

import argparse
import math

from ropelens.analyses.attention_decomposition import (
    DEFAULT_BANDS,
    AttentionDecomposition,
    attention_decomposition,
)
from ropelens.analyses.band_statistics import band_statistics
from ropelens.analyses.registry import Analysis, draw
from ropelens.cli.common import (
    AnalysisOptions,
    Command,
    CorpusOptions,
    ModelOptions,
    OutputOptions,
    load_from_args,
    note,
)
from ropelens.errors import InputError
from ropelens.plots.attention_decomposition import (
    band_mixer,
    decomposition_figure,
    rotation_figure,
)
from ropelens.run.data import windows
from ropelens.run.memory import trained_context
from ropelens.run.texts import encode, text_tokens


def _fmt(x: float) -> str:
    """Two decimals, or n/a where the value is not measurable (a band with no plane in the
    layer)."""
    return "  n/a" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:5.2f}"


def options(p: argparse.ArgumentParser) -> None:
    """``ropelens attention-decomposition [MODEL]``: band shares of one text or corpus window, per
    head."""
    ModelOptions.add_to(p)
    src = p.add_mutually_exclusive_group()
    src.add_argument("--text", default=None, help="the text to decompose (BOS is prepended)")
    CorpusOptions.add_to(p, tokens=None, n_ctx=512, corpus_group=src)
    p.add_argument(
        "--window", type=int, default=0, metavar="I", help="which corpus window (default: 0)"
    )
    AnalysisOptions.add_to(p, default_bands=DEFAULT_BANDS)
    OutputOptions.add_to(p)


def _text_tokens(model, text: str):
    """``--text`` as ``[1, pos]`` tokens, BOS first (where the tokenizer has one, as corpus
    windows); past the model's context only its first n_ctx tokens, said as Python warns it."""
    encoded = text_tokens(
        model, text, limit=trained_context(model), names=["--text"], warn=False
    )  # the trained context, as attention_decomposition cuts a text
    for cut in encoded.cuts:
        note(cut)
    n = encoded.lengths[0]
    if encoded.cuts:
        whole = len(encode(model, text))
        return encoded.tokens, f"text (first {n:,} of {whole:,} tokens)"
    return encoded.tokens, "text"


def _one_window(model, args: argparse.Namespace, corpus):

    if corpus is None:
        return _text_tokens(model, args.text)
    toks = windows(corpus, model.tokenizer, args.n_ctx, n_windows=args.window + 1)
    if toks.shape[0] <= args.window:
        raise InputError(
            f"corpus {corpus.name!r} has {toks.shape[0]} windows of {args.n_ctx} tokens; "
            f"--window {args.window} does not exist: pick 0..{toks.shape[0] - 1}"
        )
    return toks[args.window : args.window + 1], f"{corpus.name} window {args.window}"


def run(args: argparse.Namespace) -> int:
    """Per-head band shares of the attention logits for one text or corpus window

    Decompose every attention logit of one input into bands and print, per head, each band's share
    of the attended-key margin and how often the band alone picks the attended key.
    """
    analysis, output = AnalysisOptions.from_args(args), OutputOptions.from_args(args)
    if args.text is not None and not args.text.strip():
        raise InputError(
            "--text is empty: pass the text to decompose, e.g. --text 'The cat sat on the mat.'"
        )
    if args.text is None and args.window < 0:
        raise InputError(
            f"--window must be ≥ 0, got {args.window}: pick a corpus window such as --window 0"
        )
    corpus = (
        None if args.text is not None else CorpusOptions.from_args(args).load()
    )  # fails before the model loads
    model = load_from_args(args)
    toks, what = _one_window(model, args, corpus)
    bands = analysis.parsed_bands()
    st = band_statistics(
        model,
        toks,
        bands=bands,
        layers=analysis.layers,
        batch_size=1,
        jsd=True,
        progress=False,
        verify=not analysis.no_verify,
    )
    frame = st.to_frame()
    if output.json:
        return output.emit(
            {
                "model": st.provenance.model,
                "input": what,
                "n_tokens": int(toks.shape[1]),
                "bands": list(st.band_names),
                "layers": list(st.layers),
                "heads": frame.to_dict("records"),
            }
        )
    print(f"{st.provenance.model}: {what}, {int(toks.shape[1])} tokens, bands {bands.describe()}")
    print("per head and band: share of the attended-key margin | band-only top-1 agreement")
    names = list(st.band_names)
    for L in st.layers:
        rows = frame[frame["layer"] == L]
        print(f"\nlayer {L}")
        print("head  " + "  ".join(f"{n[:13]:>13}" for n in names))
        for h, g in rows.groupby("head", sort=True):
            cells = [
                f"{_fmt(float(r.margin_share))}|{_fmt(float(r.top1)).strip():>5}"
                for r in g.itertuples()
            ]
            print(f"{int(h):4d}  " + "  ".join(f"{c:>13}" for c in cells))
    return 0


ANALYSIS = Analysis(
    "attention-decomposition",
    attention_decomposition,
    AttentionDecomposition,
    draw(
        AttentionDecomposition,
        figure=decomposition_figure,
        rotation=rotation_figure,
        explore=band_mixer,
    ),
    Command("attention-decomposition", run, options),
    summary="Every attention logit of one input as an exact sum of one term per plane, grouped "
    "into bands.",
)
