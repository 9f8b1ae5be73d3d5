"""The ``ropelens`` command line: one subcommand per job, each added by its own ``add_*`` function.

To add a subcommand, write ``add_NAME(subparsers)`` that builds its parser (calling
:func:`add_common_options` for ``--device``/``--json``) and sets ``func`` to a function
``(args) -> int``, then list it in :data:`SUBCOMMANDS`. Raise ``ValueError`` or ``OSError`` for bad
input: :func:`main` turns them into ``ropelens: error: ...`` and exit code 2.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from collections.abc import Callable, Sequence
from typing import Any

from ropelens import __version__
from ropelens.models import DEFAULT_MODEL, EMBEDDED_MODELS, load_model, rope_spec
from ropelens.report.commands import add_decompose, add_report, add_usage
from ropelens.rope import RopeSpec
from ropelens.variant_commands import add_truncate, add_variants

__all__ = ["SUBCOMMANDS", "add_common_options", "build_parser", "load_from_args", "main"]

EXIT_USAGE = 2


class UsageError(Exception):
    """Bad command-line input: reported as one line, exit code 2."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # type: ignore[override]
        # argparse would print usage and exit; main reports one line instead.
        raise UsageError(f"{message} (see '{self.prog} --help')")


def add_common_options(parser: argparse.ArgumentParser) -> None:
    """Options every model-loading subcommand shares."""
    parser.add_argument(
        "--device",
        default=None,
        help="torch device to run the model on: cpu, cuda, cuda:N or mps (default: cuda if available, else cpu)",
    )
    parser.add_argument(
        "--json", action="store_true", help="print machine-readable JSON instead of a table"
    )


def load_from_args(args: argparse.Namespace):
    """Load ``args.model`` on ``args.device``: the shared first step of model subcommands."""
    from transformers.utils import logging as hf_logging

    # transformers draws a "Loading weights" bar on every load; ropelens' own bar (first
    # conversion, which takes a while) is the only one worth showing on the terminal.
    was_enabled = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        return load_model(args.model, device=args.device)
    finally:
        if was_enabled:
            hf_logging.enable_progress_bar()


# --------------------------------------------------------------------------------------------
# inspect
# --------------------------------------------------------------------------------------------
def add_inspect(subparsers: argparse._SubParsersAction) -> None:
    """``ropelens inspect [MODEL]``: the RoPE spec of a model."""
    p = subparsers.add_parser(
        "inspect",
        help="show the RoPE a model applies (bases, planes, pairing, wavelengths)",
        description="Load a model and print the RoPE its attention layers apply, per layer kind.",
    )
    p.add_argument(
        "model",
        nargs="?",
        default=None,
        help=f"embedded name ({', '.join(EMBEDDED_MODELS)}; default {DEFAULT_MODEL}), "
        "a .gguf file, an HF model directory, or a hub name (needs the network)",
    )
    add_common_options(p)
    p.set_defaults(func=run_inspect)


def run_inspect(args: argparse.Namespace) -> int:
    """Print the spec of ``args.model`` as a table or JSON."""
    spec = rope_spec(load_from_args(args))
    if args.json:
        print(json.dumps(inspect_json(spec), indent=2, allow_nan=False))
    else:
        print(inspect_table(spec))
    return 0


def inspect_json(spec: RopeSpec) -> dict[str, Any]:
    """Spec summary per layer kind plus every layer (with inv_freq); loads with RopeSpec.from_dict."""
    d = spec.to_dict()
    summary = [_jsonable_row(row) for row in spec.summary().to_dict("records")]
    head = {k: v for k, v in d.items() if k != "layers"}
    return {**head, "n_layers": spec.n_layers, "summary": summary, "layers": d["layers"]}


def _jsonable_row(row: dict[str, Any]) -> dict[str, Any]:
    # pandas turns a missing window into NaN, and unrotated planes give an infinite wavelength;
    # strict JSON has neither, so use null and the string "inf".
    out = {}
    for k, v in row.items():
        if hasattr(v, "item"):
            v = v.item()
        if isinstance(v, float) and math.isnan(v):
            v = None
        elif k == "window" and v is not None:
            v = int(v)
        elif isinstance(v, float) and math.isinf(v):
            v = "inf" if v > 0 else "-inf"
        out[k] = v
    return out


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
    ("shortest wavelength", lambda r: f"{r['shortest_wavelength']:.4g} tokens"),
    ("longest wavelength", lambda r: f"{r['longest_wavelength']:.4g} tokens"),
    ("planes beyond n_ctx", lambda r: f"{r['planes_beyond_ctx']} of {r['n_planes']}"),
)


def _missing(v: Any) -> bool:
    return v is None or (isinstance(v, float) and math.isnan(v))


def inspect_table(spec: RopeSpec) -> str:
    """Readable table: one column per layer kind, one row per property."""
    rows = spec.summary().to_dict("records")
    header = [""] + [str(r["kind"]) for r in rows]
    body = [[label] + [fmt(r) for r in rows] for label, fmt in _TABLE_ROWS]
    widths = [max(len(line[i]) for line in [header, *body]) for i in range(len(header))]
    lines = [
        f"{spec.model_name}  ({spec.architecture}, {spec.n_layers} layers, n_ctx {spec.n_ctx})",
        "",
        "  ".join(h.ljust(w) for h, w in zip(header, widths, strict=True)).rstrip(),
    ]
    lines += [
        "  ".join(c.ljust(w) for c, w in zip(line, widths, strict=True)).rstrip() for line in body
    ]
    return "\n".join(lines)


# --------------------------------------------------------------------------------------------
# heads
# --------------------------------------------------------------------------------------------
def add_heads(subparsers: argparse._SubParsersAction) -> None:
    """``ropelens heads [MODEL]``: classify heads as positional or content (ropelens.heads)."""
    p = subparsers.add_parser("heads", help="classify attention heads as positional (fixed offset), sink or content",
                              description="Score each head's attention at fixed offsets on text and random tokens.")
    p.add_argument("model", nargs="?", default=None, help=f"embedded name (default {DEFAULT_MODEL}), path or hub name")
    p.add_argument("--windows", type=int, default=8, help="text windows (and as many random-token windows)")
    p.add_argument("--n-ctx", type=int, default=256, help="tokens per window")
    p.add_argument("--out", default=None, help="save the HeadTaxonomy as JSON to this file")
    add_common_options(p)
    p.set_defaults(func=run_heads)


def run_heads(args: argparse.Namespace) -> int:
    """Print positional heads (or every head as JSON records)."""
    from ropelens.heads import classify_heads

    tx = classify_heads(load_from_args(args), n_ctx=args.n_ctx, n_windows=args.windows, progress=False)
    if args.out:
        tx.save(args.out)
    df = tx.to_frame()
    if args.json:
        print(json.dumps({"tau": tx.tau, "heads": df.to_dict("records")}, indent=2))
        return 0
    pos = df[df.positional].sort_values("robust_mass", ascending=False)
    print(f"tau {tx.tau:.3f}; {len(pos)} positional heads of {len(df)}")
    cols = ["layer", "head", "kind", "best_offset", "mass_text", "mass_random", "sink_text"]
    print(pos[cols].to_string(index=False, float_format="%.3f") if len(pos) else "(none)")
    return 0


# --------------------------------------------------------------------------------------------
# pe-geometry
# --------------------------------------------------------------------------------------------
def add_pe_geometry(subparsers: argparse._SubParsersAction) -> None:
    """``ropelens pe-geometry [--model M]``: period and strength of position-embedding similarity."""
    p = subparsers.add_parser(
        "pe-geometry",
        help="cosine similarity of position embeddings by distance: dominant period and strength",
        description="Sinusoidal reference and, with --model, the learned absolute position table of a model "
        "that has one (GPT-2, OPT, BERT-like): the by-distance cosine similarity and its dominant period.",
    )
    p.add_argument("--model", default=None, help="HF model directory or hub name with learned position embeddings")
    p.add_argument("--n-pos", type=int, default=512, help="positions of the sinusoidal reference (default 512)")
    p.add_argument("--d", type=int, default=128, help="width of the sinusoidal reference (even; default 128)")
    p.add_argument("--base", type=float, default=10000.0, help="sinusoidal base (default 10000)")
    add_common_options(p)
    p.set_defaults(func=run_pe_geometry)


def run_pe_geometry(args: argparse.Namespace) -> int:
    """Print period/strength for the sinusoidal reference and, with --model, its learned table."""
    from ropelens.geometry import learned_pe, pe_similarity, sinusoidal_pe

    sims = [pe_similarity(sinusoidal_pe(args.n_pos, args.d, args.base), name=f"sinusoidal {args.n_pos}x{args.d}")]
    if args.model is not None:
        sims.append(pe_similarity(learned_pe(load_from_args(args)), name=str(args.model)))
    rows = [{"name": s.name, "n_pos": s.n_pos, "d_model": s.d_model, "period": s.period,
             "period_strength": s.period_strength, "period_threshold": s.period_threshold} for s in sims]
    if args.json:
        print(json.dumps(rows, indent=2, allow_nan=False))
        return 0
    for r in rows:
        period = f"{r['period']:.1f} tokens" if r["period"] else "none"
        print(f"{r['name']}: {r['n_pos']} positions x {r['d_model']} dims, period {period}, "
              f"strength {r['period_strength']:.3f} (threshold {r['period_threshold']:.3f})")
    return 0


# --------------------------------------------------------------------------------------------
# entry point
# --------------------------------------------------------------------------------------------


# --------------------------------------------------------------------------------------------
# context (ropelens.context)
# --------------------------------------------------------------------------------------------
_CONTEXT_VARIANTS = ("pi", "ntk", "dynamic", "yarn", "llama3")


def add_context(subparsers: argparse._SubParsersAction) -> None:
    """``ropelens context [MODEL] --target N``: what each context-extension method does per plane."""
    p = subparsers.add_parser("context", help="per-plane view of context-extension methods and RoPE's base bounds",
                              description="Categorise each plane (kept/interpolated/extrapolated) under PI, NTK, "
                              "dynamic NTK (factor 2), YaRN and Llama 3 scaling, with the critical dimension "
                              "(arXiv 2310.05209) and the base lower bound (arXiv 2405.14591).")
    p.add_argument("model", nargs="?", default=None, help=f"embedded name (default {DEFAULT_MODEL}), path or hub name")
    p.add_argument("--target", type=int, required=True, help="the extended context length in tokens")
    p.add_argument("--original", type=int, default=None, help="the trained context length (default: the model's n_ctx)")
    p.add_argument("--variants", default="pi,ntk,yarn,llama3", help=f"comma-separated, of {','.join(_CONTEXT_VARIANTS)}")
    p.add_argument("--layer", type=int, default=0, help="which layer's RoPE to show (default 0)")
    add_common_options(p)
    p.set_defaults(func=run_context)


def run_context(args: argparse.Namespace) -> int:
    """Print per-variant plane categories and the bounds (or JSON with every plane)."""
    from ropelens import context as ctx
    from ropelens import variants as V

    names = [n.strip().lower() for n in args.variants.split(",") if n.strip()]
    bad = [n for n in names if n not in _CONTEXT_VARIANTS]
    if bad or not names:
        raise ValueError(f"--variants {args.variants!r}: unknown {bad}; choose from {','.join(_CONTEXT_VARIANTS)}")
    layer = rope_spec(load_from_args(args))[args.layer]
    l0 = args.original or layer.n_ctx
    if not l0 or args.target <= l0:
        raise ValueError(f"--target {args.target} must exceed the original context {l0}: pass --original N")
    s = args.target / l0
    make = {"pi": lambda: V.Linear(s), "ntk": lambda: V.NTK(s), "dynamic": lambda: V.DynamicNTK(2.0, l0),
            "yarn": lambda: V.YaRN(s, l0), "llama3": lambda: V.Llama3(s, 1.0, 4.0, l0)}
    views = [ctx.plane_view(layer, make[n](), l0, args.target) for n in names]
    bounds = {"critical_dimension": ctx.critical_dimension(layer.base, layer.rotary_dim, l0),
              "base": layer.base, "base_lower_bound_target": ctx.base_lower_bound(layer.rotary_dim, args.target)}
    if args.json:
        out = {"layer": args.layer, "original_ctx": l0, "target_ctx": args.target, **bounds,
               "views": [{**v.counts(), "variant": v.variant, "attention_scaling": v.attention_scaling,
                          "planes": [_jsonable_row(r) for r in v.to_frame().to_dict("records")]} for v in views]}
        print(json.dumps(out, indent=2, allow_nan=False))
        return 0
    print(f"layer {args.layer}: base {layer.base:g}, {layer.n_planes} planes, {l0} -> {args.target} tokens (x{s:g})")
    print(f"critical dimension at {l0}: {bounds['critical_dimension']} of {layer.rotary_dim} dims; base lower bound "
          f"for {args.target}: {bounds['base_lower_bound_target']:.4g}")
    print(f"{'variant':10s} {'kept':>5s} {'interp':>6s} {'extrap':>6s} {'min scale':>9s} {'max scale':>9s} {'attn':>6s}")
    for n, v in zip(names, views, strict=True):
        c, sc = v.counts(), v.scale
        print(f"{n:10s} {c['kept']:5d} {c['interpolated']:6d} {c['extrapolated']:6d} {float(sc.min()):9.4g} "
              f"{float(sc.max()):9.4g} {v.attention_scaling:6.4g}")
    return 0


SUBCOMMANDS: tuple[Callable[[argparse._SubParsersAction], None], ...] = (
    add_inspect, add_report, add_usage, add_decompose, add_heads, add_variants, add_truncate, add_context,
    add_pe_geometry,
)


def build_parser() -> argparse.ArgumentParser:
    """The top-level parser with every subcommand in :data:`SUBCOMMANDS`."""
    parser = _Parser(
        prog="ropelens",
        description="Mechanistic interpretability of rotary position embeddings (RoPE).",
    )
    parser.add_argument("--version", action="version", version=f"ropelens {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for add in SUBCOMMANDS:
        add(sub)
    return parser


def _one_line(e: BaseException) -> str:
    return " ".join(str(e).split()) or type(e).__name__


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``ropelens ARGS``; returns the exit code (0 ok, 2 bad input; ROPELENS_DEBUG=1 re-raises)."""
    try:
        args = build_parser().parse_args(argv)
        return int(args.func(args))
    except SystemExit as e:  # --help and --version exit through argparse
        return e.code if isinstance(e.code, int) else 0
    except BrokenPipeError:  # `ropelens inspect | head`: the reader left, nothing to report
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 1
    except UsageError as e:
        print(f"ropelens: error: {_one_line(e)}", file=sys.stderr)
        return EXIT_USAGE
    except (ValueError, OSError) as e:  # bad model name/path/device, non-RoPE model, broken file
        if os.environ.get("ROPELENS_DEBUG"):  # the traceback, for bugs that look like bad input
            raise
        print(f"ropelens: error: {_one_line(e)}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        return 130
