"""The band mixer as a command: ``ropelens explore``, one HTML page of
:meth:`AttentionDecomposition.explore`."""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

from ropelens.analyses import HeadTaxonomy, head_taxonomy, load_result
from ropelens.analyses.attention_decomposition import attention_decomposition
from ropelens.analyses.registry import Analysis
from ropelens.cli.common import (
    AnalysisOptions,
    Command,
    CorpusOptions,
    ModelOptions,
    OutputOptions,
    load_from_args,
    note,
    relay,
)
from ropelens.devices import device_of, require_memory
from ropelens.errors import InputError
from ropelens.run.data import read_text_file, windows
from ropelens.run.memory import decomposition_bytes, explore_bytes, trained_context
from ropelens.run.texts import cut_message, encode
from ropelens.spec.bands import Bands
from ropelens.spec.reading import model_label, rope_spec
from ropelens.validate import check_output_path

DEFAULT_BANDS = Bands.quantiles(4)  # four bands of planes, highest frequencies first
DEFAULT_TOKENS = 256  # tokens on the page, BOS included
MEASURE = "measure"  # --taxonomy measure: classify the heads now
LARGE_PAGE = 50_000_000  # bytes: a page this large is slow to open, so the command says so


def options(p: argparse.ArgumentParser) -> None:
    """``ropelens explore [MODEL]``: the band mixer page of one input."""
    ModelOptions.add_to(p)
    src = p.add_mutually_exclusive_group()
    src.add_argument("--text", default=None, help="the text to show (BOS is prepended)")
    src.add_argument(
        "--file",
        default=None,
        metavar="PATH",
        help="a text file to show (its first --n-ctx tokens, as --text)",
    )
    CorpusOptions.add_to(p, tokens=None, n_ctx=DEFAULT_TOKENS, corpus_group=src)
    AnalysisOptions.add_to(p, default_bands=DEFAULT_BANDS)
    p.add_argument(
        "--taxonomy",
        default=None,
        metavar=f"FILE.json|{MEASURE}",
        help="label heads positional / sink / other: a saved head taxonomy of the same model "
        f"(ropelens head-taxonomy --save FILE.json), or '{MEASURE}' to classify them first",
    )
    p.add_argument("--title", default=None, help="the page's title (default: the model's name)")
    p.add_argument(
        "--out",
        default="ropelens-explore.html",
        metavar="FILE.html",
        help="the page to write (default: ropelens-explore.html)",
    )
    OutputOptions.add_to(p)


def _read_text(args: argparse.Namespace) -> str | None:
    """``--text`` or the contents of ``--file`` (None: the corpus); checked before the model
    loads."""
    if args.file is not None:
        path = Path(args.file).expanduser()
        if not path.is_file():
            raise InputError(f"--file {args.file} is not a file: pass the path of a text file")
        try:  # the one decoding every text file goes through: UTF-8, or refused with the fix
            text = read_text_file(path)
        except InputError as e:
            raise InputError(f"--file {e}") from None
        if not text.strip():
            raise InputError(
                f"--file {args.file} is empty (no text besides whitespace): pass a file with "
                "text, or the text itself with --text"
            )
        return text
    if args.text is not None and not args.text.strip():
        raise InputError("--text is empty: pass some text, e.g. --text 'The cat sat on the mat.'")
    return args.text


def _load_taxonomy(spec: str | None) -> HeadTaxonomy | str | None:
    """The saved taxonomy ``--taxonomy`` names (or the word ``measure``)."""
    if spec is None or spec == MEASURE:
        return spec
    path = Path(spec).expanduser()
    if not path.is_file():
        raise InputError(
            f"--taxonomy {spec} is not a file: pass a head taxonomy saved by "
            f"'ropelens head-taxonomy --save FILE.json', or '{MEASURE}'"
        )
    result = load_result(path)
    if not isinstance(result, HeadTaxonomy):
        raise InputError(
            f"--taxonomy {spec} holds a {type(result).__name__}, not a head taxonomy: pass the "
            "file 'ropelens head-taxonomy --save' wrote"
        )
    return result


def _check_taxonomy_model(taxonomy: HeadTaxonomy, model, spec: str) -> None:
    """Refuse the ``--taxonomy`` file ``spec`` where it was measured on another model than
    ``model``: another name in its provenance, a layer the model lacks, or another number of heads
    in a layer."""
    measured_on, this_model = taxonomy.provenance.model, model_label(model)
    fix = (
        f"measure this model's own ('ropelens head-taxonomy {this_model} --save FILE.json') "
        f"or pass --taxonomy {MEASURE}"
    )
    if measured_on != this_model:
        raise InputError(
            f"--taxonomy {spec} was measured on {measured_on}, this model is {this_model}: {fix}"
        )
    model_spec = rope_spec(model)
    heads = taxonomy.present().sum(1).tolist()
    for layer, n_heads in zip(taxonomy.layers, heads, strict=True):
        if not 0 <= layer < model_spec.n_layers:
            raise InputError(
                f"--taxonomy {spec} (measured on {measured_on}) holds layer {layer}, this model "
                f"({this_model}) has {model_spec.n_layers} layers: {fix}"
            )
        if n_heads != model_spec[layer].n_heads:
            raise InputError(
                f"--taxonomy {spec} (measured on {measured_on}) has {n_heads} heads in layer "
                f"{layer}, this model ({this_model}) has {model_spec[layer].n_heads}: {fix}"
            )


def _tokens(model, text: str | None, args: argparse.Namespace):
    """``[1, pos]`` tokens of the input, at most ``--n-ctx`` of them and never past the context
    the model was trained on (cut as :func:`attention_decomposition` cuts a text, said in its
    words), and what they are."""
    trained = trained_context(model)
    limit = args.n_ctx if not trained else min(args.n_ctx, trained)
    if trained and args.n_ctx > trained:
        note(
            f"--n-ctx {args.n_ctx:,} is past the model's trained context of {trained:,}: "
            f"the page shows at most {trained:,} tokens"
        )
    if text is None:
        corpus = CorpusOptions.from_args(args).load()
        toks = windows(corpus, model.tokenizer, limit, n_windows=1)
        return toks, f"the first {limit} tokens of corpus {corpus.name!r}"
    toks = torch.tensor([encode(model, text)])  # BOS first where the tokenizer has one
    n = int(toks.shape[1])
    if n > limit:
        what = "--file" if getattr(args, "file", None) is not None else "--text"
        if limit == args.n_ctx:
            note(f"the text is {n:,} tokens: the page shows its first {limit:,} (--n-ctx)")
        else:
            note(cut_message(what, n, limit))
        return toks[:, :limit], f"the first {limit} of {n:,} tokens of the text"
    return toks, f"{n} tokens of text"


def _require_room(model, toks, analysis: AnalysisOptions, bands) -> None:
    """Refuse, before the forward, a page whose patterns the machine has not the memory for
    (:func:`ropelens.run.memory.explore_bytes`), naming the flags that lower it."""
    spec = rope_spec(model)  # shapes alone: heads per layer, planes per band
    chosen = relay(spec.layer_indices, layers=analysis.layers)
    n = int(toks.shape[1])
    dtype = next((p.dtype for p in model.parameters() if p.is_floating_point()), torch.float32)
    what = (
        f"the band mixer of {n:,} tokens in {len(chosen)} layer(s) ([head, {n}, {n}] patterns "
        "of every band)"
    )
    lower = (
        f"lower --n-ctx ({n:,} tokens now; the memory grows with their square), or pass fewer "
        f"--layers ({len(chosen)} now) or fewer --bands"
    )
    require_memory(explore_bytes(spec, chosen, n, bands, dtype), what, lower)  # the page: host
    device = device_of(model)
    if device.type != "cpu":  # the forward and its patterns, on the accelerator
        require_memory(decomposition_bytes(spec, chosen, 1, n, dtype, 1), what, lower, device)


def run(args: argparse.Namespace) -> int:
    """Write the band mixer: one input's attention, recomputed from any set of bands

    Decompose one input's attention (the first --n-ctx tokens of the English corpus, or --text, or
    --file) and write one HTML page that runs with no server and no network: choose a layer and a
    head, switch bands and planes on and off, and see the pattern the model would have from them
    alone, each query's attention band by band, and each band's top-1 agreement with the model.
    """
    analysis, output = AnalysisOptions.from_args(args), OutputOptions.from_args(args)
    out = check_output_path(args.out, "--out")
    if out.suffix.lower() not in (".html", ".htm"):
        raise InputError(f"--out {args.out}: the page is HTML: name it {out.stem}.html")
    text = _read_text(args)
    taxonomy = _load_taxonomy(args.taxonomy)  # all fail before the model loads
    if text is None:
        CorpusOptions.from_args(args).check()
    model = load_from_args(args)
    if isinstance(taxonomy, HeadTaxonomy):
        _check_taxonomy_model(taxonomy, model, args.taxonomy)
    toks, what = _tokens(model, text, args)
    bands = analysis.parsed_bands() or DEFAULT_BANDS
    _require_room(model, toks, analysis, bands)
    dec = relay(
        attention_decomposition,
        model,
        toks,
        bands=bands,
        layers=analysis.layers,
        batch_size=1,
        verify=not analysis.no_verify,
    )
    if taxonomy == MEASURE:
        taxonomy = head_taxonomy(
            model, layers=dec.layers, progress=output.progress, verify=not analysis.no_verify
        )
    page = relay(dec.explore, taxonomy=taxonomy, title=args.title)
    page.save(out)
    size = out.stat().st_size
    if size > LARGE_PAGE:
        note(
            f"the page is {size / 1e6:.0f} MB (each layer holds its q and k): --layers or a "
            "shorter --n-ctx makes it smaller"
        )
    summary = {
        "out": str(out),
        "bytes": size,
        "input": what,
        "n_tokens": int(toks.shape[1]),
        "layers": list(page.layers),
        "bands": dec.band_names(dec.layers[0]),
        "precision": {str(k): v for k, v in page.precision.items()},
        "labelled_heads": taxonomy is not None,
    }
    if output.json:
        return output.emit(summary)
    print(
        f"band mixer: {out} ({size / 1e6:.1f} MB; {what}; layers {dec.layers[0]}..{dec.layers[-1]}"
        f" ({len(page.layers)}); bands {', '.join(summary['bands'])})"
    )
    return 0


ANALYSIS = Analysis(
    "explore",
    command=Command("explore", run, options),
    summary="The band mixer: one HTML page that recomputes a head's attention from any set of "
    "bands and planes.",
)
