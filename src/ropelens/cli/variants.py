"""``ropelens variants``, ``truncate``, ``context``, ``predict-base`` and ``passkey``: per-plane frequencies of
RoPE variants, perplexity under p-RoPE, what context-extension methods do to each plane, the base's predicted
extrapolation limits, and passkey retrieval."""

from __future__ import annotations

import argparse
import dataclasses
import math

from ropelens.cli.common import (
    ModelOptions,
    OutputOptions,
    add_command,
    check_windows_fit,
    load_from_args,
    non_negative_int,
    note_windows,
    positive_int,
    window_length,
)
from ropelens.errors import InputError
from ropelens.run.intervene import apply_rope_variant
from ropelens.spec import variants as V
from ropelens.spec.reading import rope_spec
from ropelens.validate import check_number

__all__ = ["add_context", "add_passkey", "add_predict_base", "add_truncate", "add_variants", "parse_variant",
           "variant_help"]


def _variant_classes() -> dict[str, type[V.RopeVariant]]:
    """The variant classes :mod:`ropelens.spec.variants` exports, by lower-case class name, in its order."""
    exported = (getattr(V, n) for n in V.__all__)
    return {c.__name__.lower(): c for c in exported
            if isinstance(c, type) and issubclass(c, V.RopeVariant) and c is not V.RopeVariant}


def _params(cls: type[V.RopeVariant]) -> list[dataclasses.Field]:
    return [f for f in dataclasses.fields(cls) if f.init]


def variant_help() -> str:
    """The variant forms ``--variant`` accepts, e.g. ``prope:P``; values in [brackets] have defaults."""
    return ", ".join(_form(name, cls) for name, cls in _variant_classes().items())


def _form(name: str, cls: type[V.RopeVariant]) -> str:
    parts = [name]
    for f in _params(cls):
        value = f.name.upper()
        required = f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
        parts.append(value if required else f"[{value}]")
    return ":".join(parts)


# A value of each variant that parse_variant accepts, shown in its error messages (tested to parse).
VARIANT_EXAMPLES = {
    "default": "default", "prope": "prope:0.75", "propereversed": "propereversed:0.75",
    "propepartial": "propepartial:0.75", "nope": "nope", "basechange": "basechange:500000",
    "planemask": "planemask:0,1,2,3", "linear": "linear:4", "ntk": "ntk:4", "dynamicntk": "dynamicntk:2:2048",
    "yarn": "yarn:4:2048", "llama3": "llama3:8:1:4:8192", "longrope": "longrope:1,1,1,1:1,2,4,8:2048",
    "resonance": "resonance:4:2048", "cope": "cope:20", "fopezero": "fopezero:2048",
}


def _example(name: str) -> str:
    return VARIANT_EXAMPLES.get(name, name)


def _value(text: str, f: dataclasses.Field, spec: str, name: str, flag: str):
    kind = str(f.type)
    if "None" in kind and text == "none":  # an optional value left at its default, to reach a later one
        return None
    if "tuple" in kind or "list" in kind:  # per-plane lists: comma-separated
        item, want = (int, "a comma-separated list of integers") if "int" in kind else \
            (float, "a comma-separated list of numbers")
    elif kind.startswith("bool"):
        item, want = None, "true or false"
    elif kind.startswith("int"):
        item, want = int, "an integer"
    else:
        item, want = float, "a number"
    listed = "tuple" in kind or "list" in kind
    tokens = [x.strip() for x in text.split(",") if x.strip()] if listed else [text]
    bad = next((t for t in tokens if not _parses(t, item)), None if tokens else text)
    if bad is not None:
        where = f"{bad!r} in {text!r}" if listed and bad != text else repr(text)
        raise InputError(f"{flag} {spec!r}: bad {f.name.upper()} {where}: {f.name.upper()} must be {want}: "
                         f"write {_form(name, _variant_classes()[name])}, e.g. {flag} {_example(name)}")
    if item is None:
        return text == "true"
    values = tuple(item(t) for t in tokens)
    return values if listed else values[0]


def _parses(token: str, item: type | None) -> bool:
    """Whether ``token`` reads as ``item`` (None: a bool written true or false)."""
    if item is None:
        return token in ("true", "false")
    try:
        item(token)
    except ValueError:
        return False
    return True


def parse_variant(text: str, flag: str = "--variant") -> V.RopeVariant:
    """``"prope:0.75"`` → ``PRoPE(0.75)``: a class name (any case, '-' ignored, or a unique prefix) and its values.

    Errors name ``flag``, the bad token and the form of the variant, with an example that parses.
    """
    name, *values = text.strip().lower().split(":")
    classes = _variant_classes()
    key = name.replace("-", "").replace("_", "")
    matches = [key] if key in classes else [n for n in classes if key and n.startswith(key)]
    if len(matches) != 1:
        raise InputError(f"{flag}: unknown variant {text!r}: write NAME:VALUE:..., e.g. {flag} {_example('yarn')}; "
                         f"use one of {variant_help()}")
    name = matches[0]
    cls = classes[name]
    params = _params(cls)
    required = [f for f in params if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING]
    if not len(required) <= len(values) <= len(params):
        counts = f"{len(required)}" if len(required) == len(params) else f"{len(required)} to {len(params)}"
        raise InputError(f"{flag} {text!r}: {name} takes {counts} value(s) after the name, got {len(values)}: "
                         f"write {_form(name, cls)}, e.g. {flag} {_example(name)}")
    parsed = [_value(v, f, text, name, flag) for v, f in zip(values, params)]
    try:
        return cls(*parsed)
    except InputError as e:  # a value out of its range (p > 1, a factor ≤ 0, lists of different lengths)
        raise InputError(f"{flag} {text!r}: {e}: e.g. {flag} {_example(name)}") from e


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
    from ropelens.run import data
    from ropelens.run.evaluate import bootstrap_ci, window_losses

    ps = number_list(args.p, float, "--p", example="0,0.5,1")
    for p in ps:
        check_number(p, "each of --p", at_least=0, at_most=1,
                     hint=": pass the share of planes that rotate, 0 (NoPE) to 1 (the model's RoPE), e.g. --p 0,0.5,1")
    variants = [V.PRoPE(p) for p in ps]
    _, val = data.english().split()
    check_windows_fit(val, args.n_ctx, args.windows, "--windows", other_corpus=False)
    model = load_from_args(args)
    toks = data.windows(val, model.tokenizer, args.n_ctx, n_windows=args.windows)
    note_windows(val.name, int(toks.shape[0]), args.n_ctx, args.windows, "--windows")
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


def number_list(text: str, kind, what: str, *, example: str) -> list:
    """``"1,2"`` → ``[1, 2]`` of ``kind`` for the flag ``what``; ``example`` is a value the flag accepts."""
    noun = "integers" if kind is int else "numbers"
    try:
        out = [kind(x) for x in text.split(",") if x.strip()]
    except ValueError as e:
        raise InputError(f"{what} must be a comma-separated list of {noun}, got {text!r}: e.g. {what} {example}") from e
    if not out:
        raise InputError(f"{what} is empty: pass a comma-separated list of {noun}, e.g. {what} {example}")
    return out


def run_passkey(args: argparse.Namespace) -> int:
    """Passkey retrieval accuracy over lengths x depths (optionally under a RoPE variant)

    Hide a random 5-digit passkey in filler text at each depth, ask it back at the end, decode greedily and
    score the first number (the YaRN/LongRoPE harness); seeded.
    """
    from ropelens.analyses.passkey import passkey_retrieval

    lengths = number_list(args.lengths, int, "--lengths", example="1024,4096")
    depths = number_list(args.depths, float, "--depths", example="0.1,0.5,0.9")
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

    lengths = number_list(args.lengths, int, "--lengths", example="2048,8192")
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
