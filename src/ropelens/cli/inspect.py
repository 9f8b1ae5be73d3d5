"""``ropelens inspect [MODEL]``: the RoPE every layer kind of a model applies; ``--families``: the families ropelens
supports (exact, or refused and why), from the family matrix, without building a model."""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable
from typing import Any

from ropelens.cli.common import ModelOptions, OutputOptions, add_command, jsonable, load_from_args
from ropelens.errors import UsageError
from ropelens.spec.reading import rope_spec
from ropelens.spec.rope import RopeSpec

__all__ = ["add_inspect", "families_json", "families_table", "inspect_json", "inspect_table"]


def add_inspect(subparsers: argparse._SubParsersAction) -> None:
    """``ropelens inspect [MODEL]``: the RoPE spec of a model."""
    p = add_command(subparsers, "inspect", run_inspect)
    ModelOptions.add_to(p)
    OutputOptions.add_to(p)
    p.add_argument("--families", action="store_true",
                   help="list the model families ropelens supports (exact, or refused and why) instead of reading "
                        "a model; no model is loaded or built")


def run_inspect(args: argparse.Namespace) -> int:
    """Show the RoPE a model applies (bases, planes, pairing, wavelengths)

    Load a model and print the RoPE its attention layers apply, per layer kind. With --families,
    list the model families ropelens supports instead.
    """
    output = OutputOptions.from_args(args)
    if args.families:
        if args.model is not None:
            raise UsageError(f"--families lists the supported families without a model: drop {args.model!r}, or "
                             "drop --families to inspect it")
        if output.json:
            return output.emit(families_json())
        print(families_table())
        return 0
    spec = rope_spec(load_from_args(args))
    if output.json:
        return output.emit(inspect_json(spec))
    print(inspect_table(spec))
    return 0


_WHERE = {"load": "at load", "spec": "by rope_spec", "probe": "by the probe"}


def families_json() -> list[dict[str, Any]]:
    """One record per family of the matrix (:data:`ropelens.testing.families.FAMILIES`): exact or refused, and why."""
    import transformers

    from ropelens.testing.families import FAMILIES

    return [{"family": name, "config_class": fam.config_class, "status": "exact" if fam.refused is None else "refused",
             "refused_at": None if fam.refused is None else fam.refused_at, "reason": fam.refused, "needs": fam.needs,
             "in_transformers": hasattr(transformers, fam.config_class)} for name, fam in FAMILIES.items()]


def families_table() -> str:
    """Readable list of :func:`families_json`: family, status, what the family needs."""
    import transformers

    rows = [["family", "status", "what it needs"]]
    for f in families_json():
        status = "exact" if f["reason"] is None else f"refused {_WHERE[f['refused_at']]}: {f['reason']}"
        if not f["in_transformers"]:
            status += f" (transformers {transformers.__version__} has no {f['config_class']})"
        rows.append([f["family"], status, f["needs"]])
    widths = [max(len(r[i]) for r in rows) for i in range(2)]
    lines = ["  ".join([r[0].ljust(widths[0]), r[1].ljust(widths[1]), r[2]]).rstrip() for r in rows]
    n_exact = sum(f["reason"] is None for f in families_json())
    return "\n".join([f"{n_exact} of {len(rows) - 1} families exact, each a tiny random model checked against HF's "
                      "own eager attention (measured errors: docs/models.md)", "", *lines])


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


# rows for structures only some models have, shown where the spec's summary has their column
_OPTIONAL_ROWS: tuple[tuple[str, str, Callable[[dict[str, Any]], str]], ...] = (
    ("chunk", "chunk", lambda r: "-" if _missing(r["chunk"]) else f"{int(r['chunk'])} tokens"),
    ("select_keys", "keys kept", lambda r: "-" if _missing(r["select_keys"])
     else f"at most {int(r['select_keys'])} per query, picked by an indexer"),
    ("rotary_offset", "rotary slice", lambda r: f"dims {int(r['rotary_offset'])}+ of each head"
     + (", key shared by all heads" if r.get("shared_rotary_key") else "")),
    ("mrope_axes", "M-RoPE axes", lambda r: str(r["mrope_axes"]) or "-"),
    ("temperature", "query temperature", lambda r: "-" if not isinstance(r["temperature"], (tuple, list)) else
     f"1 + {r['temperature'][0]:g}·ln(1 + ⌊m/{int(r['temperature'][1])}⌋) after RoPE"),
)


def _missing(v: Any) -> bool:
    return v is None or (isinstance(v, float) and math.isnan(v))


def inspect_table(spec: RopeSpec) -> str:
    """Readable table: one column per layer kind, one row per property."""
    rows = spec.summary().to_dict("records")
    header = [""] + [str(r["kind"]) for r in rows]
    extra = [(label, fmt) for key, label, fmt in _OPTIONAL_ROWS if rows and key in rows[0]]
    body = [[label] + [fmt(r) for r in rows] for label, fmt in (*_TABLE_ROWS, *extra)]
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
