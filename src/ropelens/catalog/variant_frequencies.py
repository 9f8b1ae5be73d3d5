"""Each plane's frequency under a RoPE variant: ``ropelens variant-frequencies``."""

from __future__ import annotations

import argparse
import math

from ropelens.analyses.registry import Analysis
from ropelens.cli.common import (
    Command,
    ModelOptions,
    OutputOptions,
    load_from_args,
)
from ropelens.cli.variant_syntax import parse_variant, variant_help
from ropelens.spec.reading import rope_spec


def options(p: argparse.ArgumentParser) -> None:
    """``ropelens variant-frequencies [MODEL] --variant SPEC``: each plane's frequency before and
    after."""
    ModelOptions.add_to(p, taken=("variant", "variant_layers"))  # its own --variant below
    p.add_argument(
        "--variant",
        action="append",
        required=True,
        metavar="SPEC",
        help=variant_help() + " (repeatable)",
    )
    OutputOptions.add_to(p)


def run(args: argparse.Namespace) -> int:
    """Per-plane frequencies of a RoPE variant on a model's layers

    Show θ_i and the wavelength of every plane before and after a RoPE variant, for one layer of
    each layer kind.
    """
    chosen = [parse_variant(s) for s in args.variant]
    spec = rope_spec(load_from_args(args))
    out = []
    for kind, idx in spec.kinds.items():
        layer = spec.layers[idx[0]]
        for v in chosen:
            inv = v.inv_freq(layer)
            out.append(
                {
                    "kind": kind,
                    "layers": idx,
                    "variant": v.to_dict(),
                    "attention_scaling": v.attention_scaling(layer),
                    "inv_freq_before": layer.inv_freq.tolist(),
                    "inv_freq_after": inv.tolist(),
                }
            )
    output = OutputOptions.from_args(args)
    if output.json:
        return output.emit(out, indent=1)
    for row in out:
        print(
            f"\n{row['variant']['variant']} on {row['kind']} layers (attention scaling "
            f"{row['attention_scaling']:.4f})"
        )
        print(f"{'plane':>5} {'θ before':>12} {'θ after':>12} {'λ before':>12} {'λ after':>12}")
        for i, (a, b) in enumerate(zip(row["inv_freq_before"], row["inv_freq_after"])):

            def wl(t):
                return f"{2 * math.pi / t:12.1f}" if t > 0 else f"{'inf':>12}"

            print(f"{i:>5} {a:12.4g} {b:12.4g} {wl(a)} {wl(b)}")
    return 0


ANALYSIS = Analysis(
    "variant-frequencies",
    command=Command("variant-frequencies", run, options),
    summary="Each plane's frequency and wavelength before and after a RoPE variant, per layer "
    "kind.",
)
