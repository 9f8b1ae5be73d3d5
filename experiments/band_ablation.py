"""Loss change from zeroing each quartile band of RoPE planes, in all layers at once and layer by
layer, and from zeroing each single plane in all layers.

Bands are ``Bands.quantiles(4)`` resolved per layer (band 0 holds the highest frequencies);
``ablate_planes`` zeroes them in the rotated queries and keys, removing their logit terms. The
change is paired per window (ablated − clean loss) with a bootstrap CI over windows. Resumable.

    python experiments/band_ablation.py --quick
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _common

import ropelens
from ropelens.results.provenance import Provenance
from ropelens.results.serialize import atomic_write_text, dump_json
from ropelens.run import data
from ropelens.run.evaluate import RunStore, bootstrap_ci, window_losses
from ropelens.run.intervene import ablate_planes
from ropelens.spec.bands import Bands

N_BANDS = 4


def parse(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="smollm2-135m", help="embedded model name or tiny-llama")
    ap.add_argument("--n-ctx", type=int, default=None, help="window length (512; quick 128)")
    ap.add_argument("--n-windows", type=int, default=None, help="windows (16; quick 4)")
    ap.add_argument(
        "--per-layer",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="also ablate each band in each layer alone",
    )
    ap.add_argument(
        "--planes",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="also ablate each single plane (in every layer at once)",
    )
    ap.add_argument("--batch-size", type=int, default=2)
    ap.add_argument("--quick", action="store_true", help="4 windows of 128 tokens")
    ap.add_argument("--out", default="results/band_ablation")
    args = ap.parse_args(argv)
    # Explicit options win over --quick's defaults.
    args.n_ctx = args.n_ctx or (128 if args.quick else 512)
    args.n_windows = args.n_windows or (4 if args.quick else 16)
    return args


def _ablate(model: Any, spec: Any, band: int, layers: list[int]) -> contextlib.ExitStack:
    """Zero quartile ``band`` in ``layers``; each layer resolves its own planes."""
    stack = contextlib.ExitStack()
    for i in layers:
        planes = Bands.quantiles(N_BANDS).resolve(spec[i]).planes[band]
        stack.enter_context(ablate_planes(model, planes, layers=[i]))
    return stack


def run(model: Any, name: str, args: argparse.Namespace, store: RunStore) -> None:
    """The clean loss, then every (band, layers) ablation not already in ``store``."""
    spec = ropelens.rope_spec(model)
    _, val = data.english().split()
    tokens = data.windows(val, model, args.n_ctx, n_windows=args.n_windows)
    base_cfg = {"model": name, "n_ctx": args.n_ctx, "n_windows": args.n_windows}
    clean_cfg = {**base_cfg, "ablation": "none"}
    if store.get(clean_cfg) is None:
        store.put(
            clean_cfg,
            {"window_losses": window_losses(model, tokens, args.batch_size, False).tolist()},
        )
    clean = store.get(clean_cfg)["window_losses"]
    all_layers = list(range(len(spec.layers)))
    scopes = [("all", all_layers)] + ([(str(i), [i]) for i in all_layers] if args.per_layer else [])
    for scope, layers in scopes:
        for band in range(N_BANDS):
            cfg = {**base_cfg, "ablation": "quartile", "band": band, "layers": scope}
            if store.get(cfg) is not None:
                continue
            t = time.perf_counter()
            with _ablate(model, spec, band, layers):
                losses = window_losses(model, tokens, args.batch_size, progress=False)
            delta = bootstrap_ci([a - b for a, b in zip(losses.tolist(), clean, strict=True)])
            store.put(
                cfg,
                {
                    "window_losses": losses.tolist(),
                    "delta": delta.loss.to_dict(),
                    "planes": list(Bands.quantiles(N_BANDS).resolve(spec[layers[0]]).planes[band]),
                    "seconds": time.perf_counter() - t,
                },
            )
            if scope == "all":
                print(f"band {band} all layers: Δloss {delta.loss}", flush=True)
    for plane in range(spec[0].n_planes) if args.planes else ():
        cfg = {**base_cfg, "ablation": "plane", "plane": plane, "layers": "all"}
        if store.get(cfg) is not None:
            continue
        t = time.perf_counter()
        with ablate_planes(model, [plane]):
            losses = window_losses(model, tokens, args.batch_size, progress=False)
        delta = bootstrap_ci([a - b for a, b in zip(losses.tolist(), clean, strict=True)])
        store.put(
            cfg,
            {
                "window_losses": losses.tolist(),
                "delta": delta.loss.to_dict(),
                "wavelength": float(spec[0].wavelength[plane]),
                "seconds": time.perf_counter() - t,
            },
        )
        print(
            f"plane {plane:3d} (λ = {float(spec[0].wavelength[plane]):.4g}) all layers: Δloss "
            f"{delta.loss}",
            flush=True,
        )


def plane_rows(store: RunStore) -> list[dict[str, Any]]:
    """One row per single-plane ablation (all layers), highest frequency first."""
    out = [
        {
            "model": r["config"]["model"],
            "plane": r["config"]["plane"],
            "wavelength": r["wavelength"],
            "dloss": r["delta"]["mean"],
            "lo": r["delta"]["lo"],
            "hi": r["delta"]["hi"],
        }
        for r in store.runs.values()
        if r["config"]["ablation"] == "plane"
    ]
    return sorted(out, key=lambda r: (r["model"], r["plane"]))


def plane_figure(table: list[dict[str, Any]]):
    """Δloss per single plane against its wavelength (log axis)."""
    import plotly.graph_objects as go

    fig = go.Figure(
        go.Scatter(
            x=[r["wavelength"] for r in table],
            y=[r["dloss"] for r in table],
            mode="markers+lines",
            text=[f"plane {r['plane']}" for r in table],
            error_y={
                "type": "data",
                "symmetric": False,
                "array": [r["hi"] - r["dloss"] for r in table],
                "arrayminus": [r["dloss"] - r["lo"] for r in table],
            },
        )
    )
    fig.update_layout(
        title="Loss change from zeroing one plane in every layer",
        xaxis_type="log",
        xaxis_title="wavelength 2π/θ (tokens)",
        yaxis_title="Δ loss (nats, 95% CI)",
    )
    return fig


def rows(store: RunStore) -> list[dict[str, Any]]:
    out = []
    for r in store.runs.values():
        c = r["config"]
        if c["ablation"] == "quartile":
            out.append(
                {
                    "model": c["model"],
                    "layers": c["layers"],
                    "band": c["band"],
                    "planes": r["planes"],
                    "dloss": r["delta"]["mean"],
                    "lo": r["delta"]["lo"],
                    "hi": r["delta"]["hi"],
                }
            )
    return sorted(
        out,
        key=lambda r: (
            r["model"],
            r["layers"] != "all",
            int(r["layers"]) if r["layers"] != "all" else -1,
            r["band"],
        ),
    )


def figure(table: list[dict[str, Any]]):
    """Heatmap of Δloss, layer × band (the all-layers row on top)."""
    import plotly.graph_objects as go

    per = [r for r in table if r["layers"] != "all"]
    layers = sorted({int(r["layers"]) for r in per})
    z = [
        [
            next((r["dloss"] for r in per if int(r["layers"]) == i and r["band"] == b), None)
            for b in range(N_BANDS)
        ]
        for i in layers
    ]
    fig = go.Figure(
        go.Heatmap(z=z, x=[f"band {b}" for b in range(N_BANDS)], y=layers, colorbar_title="Δ loss")
    )
    fig.update_layout(
        title="Loss change from zeroing one quartile band in one layer "
        "(band 0 = highest frequencies)",
        yaxis_title="layer",
    )
    return fig


def main(argv: list[str] | None = None, model: Any = None) -> Path:
    """Run the ablations (``model`` overrides ``--model``); returns the result JSON path."""
    args = parse(argv)
    out = _common.out_dir(args.out)
    store = RunStore(out / "runs.json", meta={"script": "band_ablation", "args": vars(args)})
    loaded, name = _common.load(model if model is not None else args.model)
    run(loaded, name, args, store)
    table, planes = rows(store), plane_rows(store)
    dump_json(
        out / "result.json",
        {
            "table": table,
            "planes": planes,
            "provenance": Provenance(
                model=name,
                corpus="english[val]",
                n_windows=args.n_windows,
                n_ctx=args.n_ctx,
                config=vars(args),
            ).to_dict(),
        },
    )
    atomic_write_text(out / "band_ablation.html", figure(table).to_html(include_plotlyjs="cdn"))
    if planes:
        atomic_write_text(
            out / "plane_ablation.html", plane_figure(planes).to_html(include_plotlyjs="cdn")
        )
    print(f"{'layers':>6s} {'band':>4s} {'planes':>14s} {'Δloss':>9s}  95% CI")
    for r in table:
        pl = f"{r['planes'][0]}-{r['planes'][-1]}" if r["planes"] else "-"
        print(
            f"{r['layers']:>6s} {r['band']:4d} {pl:>14s} {r['dloss']:9.4f}  [{r['lo']:.4f}, "
            f"{r['hi']:.4f}]"
        )
    for r in planes:
        print(
            f" plane {r['plane']:4d} λ {r['wavelength']:12.4g} {r['dloss']:9.4f}  "
            f"[{r['lo']:.4f}, {r['hi']:.4f}]"
        )
    return out / "result.json"


if __name__ == "__main__":
    main()
