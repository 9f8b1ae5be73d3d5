"""``ropelens variants``, ``truncate``, ``context``, ``predict-base`` and ``passkey``: per-plane frequencies of
RoPE variants, perplexity under p-RoPE, what context-extension methods do to each plane, the base's predicted
extrapolation limits, and passkey retrieval."""

from __future__ import annotations

import argparse
import dataclasses
import math

from ropelens import variants as V
from ropelens.cli.common import (
    ModelOptions,
    OutputOptions,
    add_command,
    load_from_args,
    non_negative_int,
    positive_int,
    window_length,
)
from ropelens.errors import InputError
from ropelens.intervene import apply_rope_variant
from ropelens.reading import rope_spec

__all__ = ["add_context", "add_passkey", "add_predict_base", "add_truncate", "add_variants", "parse_variant",
           "variant_help"]


def _variant_classes() -> dict[str, type[V.RopeVariant]]:
    """The variant classes :mod:`ropelens.variants` exports, by lower-case class name, in its order."""
    exported = (getattr(V, n) for n in V.__all__)
    return {c.__name__.lower(): c for c in exported
            if isinstance(c, type) and issubclass(c, V.RopeVariant) and c is not V.RopeVariant}


def _params(cls: type[V.RopeVariant]) -> list[dataclasses.Field]:
    return [f for f in dataclasses.fields(cls) if f.init]


def variant_help() -> str:
    """The variant forms ``--variant`` accepts, e.g. ``prope:P``; values in [brackets] have defaults."""
    forms = []
    for name, cls in _variant_classes().items():
        parts = [name]
        for f in _params(cls):
            value = f.name.upper()
            required = f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
            parts.append(value if required else f"[{value}]")
        forms.append(":".join(parts))
    return ", ".join(forms)


def _value(text: str, f: dataclasses.Field, spec: str):
    kind = str(f.type)
    try:
        if "tuple" in kind or "list" in kind:  # per-plane lists: comma-separated
            item = int if "int" in kind else float
            return tuple(item(x) for x in text.split(",") if x.strip())
        if kind.startswith("bool"):
            if text not in ("true", "false"):
                raise ValueError(f"{f.name} must be true or false, got {text!r}")
            return text == "true"
        return int(text) if kind.startswith("int") else float(text)
    except ValueError as e:
        raise InputError(f"variant {spec!r}: bad {f.name.upper()} {text!r} ({e}): use one of {variant_help()}") from e


def parse_variant(text: str) -> V.RopeVariant:
    """``"prope:0.75"`` → ``PRoPE(0.75)``: a class name (any case, '-' ignored, or a unique prefix) and its values."""
    name, *values = text.strip().lower().split(":")
    classes = _variant_classes()
    key = name.replace("-", "").replace("_", "")
    matches = [key] if key in classes else [n for n in classes if key and n.startswith(key)]
    if len(matches) != 1:
        raise InputError(f"unknown variant {text!r}: use one of {variant_help()}")
    cls = classes[matches[0]]
    params = _params(cls)
    required = [f for f in params if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING]
    if not len(required) <= len(values) <= len(params):
        counts = f"{len(required)}" if len(required) == len(params) else f"{len(required)} to {len(params)}"
        raise InputError(f"variant {text!r} takes {counts} value(s) after the name: use one of {variant_help()}")
    return cls(*(_value(v, f, text) for v, f in zip(values, params)))


def add_variants(subparsers: argparse._SubParsersAction) -> None:
    """``ropelens variants [MODEL] --variant SPEC``: each plane's frequency before and after."""
    p = add_command(subparsers, "variants", run_variants)
    ModelOptions.add_to(p)
    p.add_argument("--variant", action="append", required=True, metavar="SPEC", help=variant_help() + " (repeatable)")
    OutputOptions.add_to(p)


def run_variants(args: argparse.Namespace) -> int:
    """Per-plane frequencies of a RoPE variant on a model's layers

    Show θ_i and the wavelength of every plane before and after a RoPE variant, for one layer of each layer
    kind.
    """
    chosen = [parse_variant(s) for s in args.variant]
    spec = rope_spec(load_from_args(args))
    out = []
    for kind, idx in spec.kinds.items():
        layer = spec.layers[idx[0]]
        for v in chosen:
            inv = v.inv_freq(layer)
            out.append({"kind": kind, "layers": idx, "variant": v.to_dict(), "attention_scaling": v.attention_scaling(layer),
                        "inv_freq_before": layer.inv_freq.tolist(), "inv_freq_after": inv.tolist()})
    output = OutputOptions.from_args(args)
    if output.json:
        return output.emit(out, indent=1)
    for row in out:
        print(f"\n{row['variant']['variant']} on {row['kind']} layers (attention scaling {row['attention_scaling']:.4f})")
        print(f"{'plane':>5} {'θ before':>12} {'θ after':>12} {'λ before':>12} {'λ after':>12}")
        for i, (a, b) in enumerate(zip(row["inv_freq_before"], row["inv_freq_after"])):
            wl = lambda t: f"{2 * math.pi / t:12.1f}" if t > 0 else f"{'inf':>12}"  # noqa: E731
            print(f"{i:>5} {a:12.4g} {b:12.4g} {wl(a)} {wl(b)}")
    return 0


def add_truncate(subparsers: argparse._SubParsersAction) -> None:
    """``ropelens truncate [MODEL]``: perplexity when only the highest fraction p of planes rotates."""
    p = add_command(subparsers, "truncate", run_truncate)
    ModelOptions.add_to(p)
    p.add_argument("--p", default="0,0.25,0.5,0.75,1", help="comma-separated fractions in [0, 1]")
    p.add_argument("--n-ctx", type=window_length, default=256, metavar="N", help="tokens per window (default 256)")
    p.add_argument("--windows", type=positive_int, default=8, metavar="N", help="validation windows (default 8)")
    p.add_argument("--layer-kind", choices=["full", "sliding"], default=None, help="only layers of this kind")
    OutputOptions.add_to(p)


def run_truncate(args: argparse.Namespace) -> int:
    """Perplexity under p-RoPE (truncated RoPE) at inference

    Held-out perplexity of the model with p-RoPE applied to its running rotary tables (p = 1 is the model's
    RoPE, p = 0 NoPE), with bootstrap CIs over windows. experiments/truncated_rope_inference.py runs the full
    resumable sweep.
    """
    from ropelens import data
    from ropelens.evaluate import bootstrap_ci, window_losses

    ps = number_list(args.p, float, "--p")
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
    output = OutputOptions.from_args(args)
    if output.json:
        return output.emit({"n_ctx": args.n_ctx, "windows": int(toks.shape[0]), "rows": rows}, indent=1)
    print(f"{'p':>6} {'loss':>8} {'ppl':>9}  95% CI ({toks.shape[0]} windows of {args.n_ctx})")
    for r in rows:
        print(f"{r['p']:>6.3f} {r['loss']:8.4f} {r['ppl']:9.2f}  [{r['ppl_lo']:.2f}, {r['ppl_hi']:.2f}]")
    return 0


# ---------------------------------------------------------------------------------------- context
_CONTEXT_VARIANTS = ("pi", "ntk", "dynamic", "yarn", "llama3")


def add_context(subparsers: argparse._SubParsersAction) -> None:
    """``ropelens context [MODEL] --target N``: what each context-extension method does per plane."""
    p = add_command(subparsers, "context", run_context)
    ModelOptions.add_to(p)
    p.add_argument("--target", type=positive_int, required=True, metavar="N", help="the extended context length in tokens")
    p.add_argument("--original", type=positive_int, default=None, metavar="N",
                   help="the trained context length (default: the model's n_ctx)")
    p.add_argument("--variants", default="pi,ntk,yarn,llama3", help=f"comma-separated, of {','.join(_CONTEXT_VARIANTS)}")
    p.add_argument("--layer", type=int, default=0, help="which layer's RoPE to show (default 0; -1 is the last)")
    OutputOptions.add_to(p)


def run_context(args: argparse.Namespace) -> int:
    """Per-plane view of context-extension methods and RoPE's base bounds

    Categorise each plane (kept/interpolated/extrapolated) under PI, NTK, dynamic NTK (factor 2), YaRN and Llama
    3 scaling, with the critical dimension (arXiv 2310.05209) and the base lower bound (arXiv 2405.14591).
    """
    from ropelens.analyses import context as ctx
    from ropelens.analyses import extrapolation as ext

    names = [n.strip().lower() for n in args.variants.split(",") if n.strip()]
    bad = [n for n in names if n not in _CONTEXT_VARIANTS]
    if bad or not names:
        raise InputError(f"--variants {args.variants!r}: unknown {bad}; choose from {','.join(_CONTEXT_VARIANTS)}")
    if args.original is not None and args.target <= args.original:
        raise InputError(f"--target {args.target} must exceed --original {args.original}: "
                         "pass the extended length as --target")
    spec = rope_spec(load_from_args(args))
    layer = spec.layers[spec.layer_indices([args.layer], rotary_only=False)[0]]  # names the range when out of it
    l0 = args.original or layer.n_ctx
    if not l0 or args.target <= l0:
        raise InputError(f"--target {args.target} must exceed the original context {l0}: pass --original N")
    s = args.target / l0
    make = {"pi": lambda: V.Linear(s), "ntk": lambda: V.NTK(s), "dynamic": lambda: V.DynamicNTK(2.0, l0),
            "yarn": lambda: V.YaRN(s, l0), "llama3": lambda: V.Llama3(s, 1.0, 4.0, l0)}
    views = [ctx.plane_view(layer, make[n](), l0, args.target) for n in names]
    bounds = {"critical_dimension": ext.critical_dimension(layer.base, layer.rotary_dim, l0),
              "base": layer.base, "base_lower_bound_target": (ext.base_lower_bound(layer.rotary_dim, args.target)
                                                              if args.target <= ext.MAX_BOUND_CONTEXT else None)}
    output = OutputOptions.from_args(args)
    if output.json:
        return output.emit({"layer": args.layer, "original_ctx": l0, "target_ctx": args.target, **bounds,
                            "views": [{**v.counts(), "variant": v.variant, "attention_scaling": v.attention_scaling,
                                       "planes": v.to_frame().to_dict("records")} for v in views]})
    print(f"layer {args.layer}: base {layer.base:g}, {layer.n_planes} planes, {l0} -> {args.target} tokens (x{s:g})")
    bound = bounds["base_lower_bound_target"]
    bound = f"{bound:.4g}" if bound is not None else f"not certified past {ext.MAX_BOUND_CONTEXT:,} tokens"
    print(f"critical dimension at {l0}: {bounds['critical_dimension']} of {layer.rotary_dim} dims; base lower bound "
          f"for {args.target}: {bound}")
    print(f"{'variant':10s} {'kept':>5s} {'interp':>6s} {'extrap':>6s} {'min scale':>9s} {'max scale':>9s} {'attn':>6s}")
    for n, v in zip(names, views, strict=True):
        c, sc = v.counts(), v.scale
        print(f"{n:10s} {c['kept']:5d} {c['interpolated']:6d} {c['extrapolated']:6d} {float(sc.min()):9.4g} "
              f"{float(sc.max()):9.4g} {v.attention_scaling:6.4g}")
    return 0


def add_passkey(subparsers: argparse._SubParsersAction) -> None:
    """``ropelens passkey [MODEL]``: passkey retrieval accuracy by length and depth, optionally under a variant."""
    p = add_command(subparsers, "passkey", run_passkey)
    ModelOptions.add_to(p)
    p.add_argument("--lengths", default="1024", metavar="N,N,...", help="prompt lengths in tokens (default: 1024)")
    p.add_argument("--depths", default="0.1,0.5,0.9", metavar="F,F,...", help="passkey depths (default: 0.1,0.5,0.9)")
    p.add_argument("--trials", type=positive_int, default=3, metavar="N", help="passkeys per (length, depth) (default: 3)")
    p.add_argument("--seed", type=non_negative_int, default=0, metavar="N", help="seed of the passkeys (default: 0)")
    p.add_argument("--variant", default=None, metavar="SPEC", help=variant_help())
    OutputOptions.add_to(p, save="PasskeyResult JSON")


def number_list(text: str, kind, what: str) -> list:
    noun = "integers" if kind is int else "numbers"
    try:
        out = [kind(x) for x in text.split(",") if x.strip()]
    except ValueError as e:
        raise InputError(f"{what} must be a comma-separated list of {noun}, got {text!r}") from e
    if not out:
        raise InputError(f"{what} is empty: pass a comma-separated list of {noun}, e.g. {what} 1,2")
    return out


def run_passkey(args: argparse.Namespace) -> int:
    """Passkey retrieval accuracy over lengths x depths (optionally under a RoPE variant)

    Hide a random 5-digit passkey in filler text at each depth, ask it back at the end, decode greedily and
    score the first number (the YaRN/LongRoPE harness); seeded.
    """
    from ropelens.analyses.passkey import passkey_retrieval
    from ropelens.validate import check_number

    lengths, depths = number_list(args.lengths, int, "--lengths"), number_list(args.depths, float, "--depths")
    for n in lengths:  # the model-specific minimum (the prompt's own tokens) is checked once it loads
        check_number(n, "each of --lengths", at_least=2, integer=True, hint=": pass prompt lengths in tokens")
    for d in depths:
        check_number(d, "each of --depths", at_least=0, at_most=1,
                     hint=": pass fractions of the prompt, 0 (start) to 1 (end), e.g. --depths 0.1,0.5,0.9")
    variant = parse_variant(args.variant) if args.variant else None
    output = OutputOptions.from_args(args)
    output.check()
    r = passkey_retrieval(load_from_args(args), lengths, depths, n_trials=args.trials, seed=args.seed,
                          variant=variant, progress=output.progress)
    output.save_result(r)
    frame = r.to_frame()
    if output.json:
        return output.emit({"mean_accuracy": r.mean_accuracy(), "cells": frame.to_dict("records")})
    print(frame.to_string(index=False, float_format="%.3f"))
    print(f"mean accuracy {r.mean_accuracy():.3f}")
    return 0


# ---------------------------------------------------------------------------------------- predict-base
def add_predict_base(subparsers: argparse._SubParsersAction) -> None:
    """``ropelens predict-base [MODEL]``: the base's predicted extrapolation limits per length."""
    p = add_command(subparsers, "predict-base", run_predict_base)
    ModelOptions.add_to(p)
    p.add_argument("--lengths", default="2048,8192,16384,32768", metavar="N,N,...", help="evaluation lengths")
    p.add_argument("--measure", type=non_negative_int, default=0, metavar="WINDOWS",
                   help="also measure the mean loss at each length over this many windows of real text (slow)")
    OutputOptions.add_to(p, save="BasePredictions JSON")


def run_predict_base(args: argparse.Namespace) -> int:
    """Liu et al.'s critical base and extrapolation limit, Men et al.'s bound, per length

    For each evaluation length: the critical dimension, Liu et al.'s extrapolation limit for the model's base
    and critical base for tuning to that length, Men et al.'s lower bound on the base, and whether the model's
    base satisfies each; --measure adds the measured loss by length.
    """
    from ropelens.analyses.extrapolation import base_predictions, measured_extrapolation

    lengths = number_list(args.lengths, int, "--lengths")
    if min(lengths) < 2:
        raise InputError(f"--lengths needs token counts ≥ 2, got {args.lengths!r}")
    output = OutputOptions.from_args(args)
    output.check()
    model = load_from_args(args)
    pred = base_predictions(model, lengths)
    output.save_result(pred)
    frame = pred.compare(measured_extrapolation(model, lengths, n_windows=args.measure, progress=output.progress)) \
        if args.measure else pred.to_frame()
    if output.json:
        return output.emit({"rows": frame.to_dict("records")})
    print(frame.to_string(index=False))
    return 0
