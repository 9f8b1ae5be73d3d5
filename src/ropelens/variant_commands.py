"""CLI glue for RoPE variants: ``ropelens variants`` (per-plane frequencies) and ``ropelens truncate``
(perplexity under p-RoPE at inference)."""

from __future__ import annotations

import argparse
import json
import math

from ropelens import variants as V
from ropelens.intervene import apply_rope_variant

__all__ = ["add_truncate", "add_variants", "parse_variant"]

_SPECS = {
    "default": (V.Default, ()),
    "nope": (V.NoPE, ()),
    "prope": (V.PRoPE, (float,)),
    "prope-reversed": (V.PRoPEReversed, (float,)),
    "prope-partial": (V.PRoPEPartial, (float,)),
    "base": (V.BaseChange, (float,)),
    "linear": (V.Linear, (float,)),
    "ntk": (V.NTK, (float,)),
    "yarn": (V.YaRN, (float, int)),
    "llama3": (V.Llama3, (float, float, float, int)),
}
SPEC_HELP = ("default, nope, prope:P, prope-reversed:P, prope-partial:P, base:THETA, linear:S, ntk:S, "
             "yarn:S:ORIGINAL_CTX, llama3:S:LOW:HIGH:ORIGINAL_CTX")


def parse_variant(text: str) -> V.RopeVariant:
    """``"prope:0.75"`` → ``PRoPE(0.75)``; see :data:`SPEC_HELP` for the forms."""
    name, *args = text.strip().lower().split(":")
    if name not in _SPECS:
        raise ValueError(f"unknown variant {text!r}: use one of {SPEC_HELP}")
    cls, types = _SPECS[name]
    if len(args) != len(types):
        raise ValueError(f"variant {text!r} takes {len(types)} value(s) after the name: use one of {SPEC_HELP}")
    try:
        values = [t(a) for t, a in zip(types, args)]
    except ValueError as e:
        raise ValueError(f"variant {text!r}: {e}") from e
    return cls(*values)


def add_variants(subparsers: argparse._SubParsersAction) -> None:
    """``ropelens variants [MODEL] --variant SPEC``: each plane's frequency before and after."""
    from ropelens.cli import add_common_options

    p = subparsers.add_parser("variants", help="per-plane frequencies of a RoPE variant on a model's layers",
                              description="Show θ_i and the wavelength of every plane before and after a RoPE "
                              "variant, for one layer of each layer kind.")
    p.add_argument("model", nargs="?", default=None, help="embedded name, path or hub name")
    p.add_argument("--variant", action="append", required=True, metavar="SPEC", help=SPEC_HELP + " (repeatable)")
    add_common_options(p)
    p.set_defaults(func=run_variants)


def run_variants(args: argparse.Namespace) -> int:
    from ropelens.cli import load_from_args
    from ropelens.models import rope_spec

    chosen = [parse_variant(s) for s in args.variant]
    spec = rope_spec(load_from_args(args))
    out = []
    for kind, idx in spec.kinds.items():
        layer = spec.layers[idx[0]]
        for v in chosen:
            inv = v.inv_freq(layer)
            out.append({"kind": kind, "layers": idx, "variant": v.to_dict(), "attention_scaling": v.attention_scaling(layer),
                        "inv_freq_before": layer.inv_freq.tolist(), "inv_freq_after": inv.tolist()})
    if args.json:
        print(json.dumps(out, indent=1))
        return 0
    for row in out:
        print(f"\n{row['variant']['variant']} on {row['kind']} layers (attention scaling {row['attention_scaling']:.4f})")
        print(f"{'plane':>5} {'θ before':>12} {'θ after':>12} {'λ before':>12} {'λ after':>12}")
        for i, (a, b) in enumerate(zip(row["inv_freq_before"], row["inv_freq_after"])):
            wl = lambda t: f"{2 * math.pi / t:12.1f}" if t > 0 else f"{'inf':>12}"  # noqa: E731
            print(f"{i:>5} {a:12.4g} {b:12.4g} {wl(a)} {wl(b)}")
    return 0


def add_truncate(subparsers: argparse._SubParsersAction) -> None:
    """``ropelens truncate [MODEL]``: perplexity when only the highest fraction p of planes rotates."""
    from ropelens.cli import add_common_options

    p = subparsers.add_parser("truncate", help="perplexity under p-RoPE (truncated RoPE) at inference",
                              description="Held-out perplexity of the model with p-RoPE applied to its running "
                              "rotary tables (p = 1 is the model's RoPE, p = 0 NoPE), with bootstrap CIs over windows. "
                              "experiments/truncated_rope_inference.py runs the full resumable sweep.")
    p.add_argument("model", nargs="?", default=None, help="embedded name, path or hub name")
    p.add_argument("--p", default="0,0.25,0.5,0.75,1", help="comma-separated fractions in [0, 1]")
    p.add_argument("--n-ctx", type=int, default=256, help="tokens per window (default 256)")
    p.add_argument("--windows", type=int, default=8, help="validation windows (default 8)")
    p.add_argument("--layer-kind", choices=["full", "sliding"], default=None, help="only layers of this kind")
    add_common_options(p)
    p.set_defaults(func=run_truncate)


def run_truncate(args: argparse.Namespace) -> int:
    from ropelens import data
    from ropelens.cli import load_from_args
    from ropelens.evaluate import bootstrap_ci, window_losses

    ps = [float(x) for x in args.p.split(",") if x.strip()]
    variants = [V.PRoPE(p) for p in ps]  # validates p before the model loads
    model = load_from_args(args)
    _, val = data.english().split()
    toks = data.windows(val, model.tokenizer, args.n_ctx, n_windows=args.windows)
    rows = []
    for p, v in zip(ps, variants):
        with apply_rope_variant(model, v, layer_kind=args.layer_kind):
            est = bootstrap_ci(window_losses(model, toks, progress=False))
        rows.append({"p": p, "loss": est.loss.mean, "ppl": est.perplexity.mean, "ppl_lo": est.perplexity.lo,
                     "ppl_hi": est.perplexity.hi})
    if args.json:
        print(json.dumps({"n_ctx": args.n_ctx, "windows": int(toks.shape[0]), "rows": rows}, indent=1))
        return 0
    print(f"{'p':>6} {'loss':>8} {'ppl':>9}  95% CI ({toks.shape[0]} windows of {args.n_ctx})")
    for r in rows:
        print(f"{r['p']:>6.3f} {r['loss']:8.4f} {r['ppl']:9.2f}  [{r['ppl_lo']:.2f}, {r['ppl_hi']:.2f}]")
    return 0
