"""``ropelens inspect [MODEL]``: the RoPE every layer kind of a model applies."""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable
from typing import Any

from ropelens.cli.common import ModelOptions, OutputOptions, add_command, jsonable, load_from_args
from ropelens.reading import rope_spec
from ropelens.rope import RopeSpec

__all__ = ["add_inspect", "inspect_json", "inspect_table"]


def add_inspect(subparsers: argparse._SubParsersAction) -> None:
    """``ropelens inspect [MODEL]``: the RoPE spec of a model."""
    p = add_command(subparsers, "inspect", run_inspect)
    ModelOptions.add_to(p)
    OutputOptions.add_to(p)


def run_inspect(args: argparse.Namespace) -> int:
    """Show the RoPE a model applies (bases, planes, pairing, wavelengths)

    Load a model and print the RoPE its attention layers apply, per layer kind.
    """
    spec = rope_spec(load_from_args(args))
    output = OutputOptions.from_args(args)
    if output.json:
        return output.emit(inspect_json(spec))
    print(inspect_table(spec))
    return 0


def inspect_json(spec: RopeSpec) -> dict[str, Any]:
    """Spec summary per layer kind plus every layer (with inv_freq); loads with RopeSpec.from_dict."""
    d = spec.to_dict()
    summary = jsonable(spec.summary().to_dict("records"))
    head = {k: v for k, v in d.items() if k != "layers"}
    return {**head, "n_layers": spec.n_layers, "summary": summary, "layers": d["layers"]}


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
    ("logit softcap", lambda r: "-" if _missing(r["softcap"]) else f"{r['softcap']:g}"),
    ("attention sinks", lambda r: "learned, per head" if r["sinks"] else "-"),
    ("shortest wavelength", lambda r: "-" if _missing(r["shortest_wavelength"]) else f"{r['shortest_wavelength']:.4g} tokens"),
    ("longest wavelength", lambda r: "-" if _missing(r["longest_wavelength"]) else f"{r['longest_wavelength']:.4g} tokens"),
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
