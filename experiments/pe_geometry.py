"""Position-embedding geometry: learned PE trained forward/backward/permuted vs init, and do real
RoPE heads decay?

Part 1 (Luo & Love, Fig. 7, in small): train GPT-style models with learned absolute position
embeddings on the embedded English text in each token order, plus the untrained init; for each, and
for the sinusoidal reference, the pairwise cosine similarity of position rows, its by-distance curve
and dominant period. Part 2 (Barbero et al.): for a real RoPE model, the mean post-RoPE q·k per
distance for every head, its decay verdict, counted per layer, beside the constant-vector and
Gaussian curves of the model's own frequencies. Resumable: finished pieces live in runs.json.

    python experiments/pe_geometry.py --quick
    python experiments/pe_geometry.py                 # CPU default
    python experiments/pe_geometry.py --scale 4 --device cuda
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _common
import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

import ropelens
from ropelens.analyses.decay import (
    roformer_bound,
    rope_decay_by_distance,
    rope_decay_constant,
    rope_gaussian_expectation,
)
from ropelens.analyses.pe_geometry import PESimilarity, pe_similarity, sinusoidal_pe
from ropelens.plots.curves import overlay
from ropelens.results.curves import decay_verdict
from ropelens.results.provenance import Provenance
from ropelens.results.serialize import atomic_write_text, dump_json
from ropelens.run import data
from ropelens.run.capture import capture_qk
from ropelens.run.evaluate import RunStore
from ropelens.training.pe_train import ORDERS, PETrainConfig, PETrainResult, train_pe_model

QUICK = PETrainConfig(
    n_positions=64,
    d_model=32,
    n_layers=1,
    n_heads=2,
    batch_size=4,
    steps=30,
    warmup=5,
    val_windows=4,
)
# CPU default: small enough for ~1–2 min per order on 2 shared cores.
DEFAULT = PETrainConfig(
    n_positions=128, d_model=64, n_layers=2, n_heads=4, batch_size=8, steps=200, lr=3e-3, warmup=20
)


def parse(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--quick", action="store_true", help="micro models (64 positions, 30 steps), 2 windows"
    )
    ap.add_argument(
        "--scale", type=float, default=1.0, help="width/depth/steps/positions × this (GPU runs)"
    )
    ap.add_argument("--steps", type=int, default=None, help="override training steps")
    ap.add_argument("--orders", nargs="+", default=list(ORDERS), choices=list(ORDERS))
    ap.add_argument(
        "--tokenizer", default="smollm2-135m", help="smollm2-135m, or tiny-char for tests"
    )
    ap.add_argument("--device", default="cpu", help="device to train the learned-PE models on")
    ap.add_argument(
        "--decay-model",
        default="smollm2-135m",
        help="RoPE model for the decay verdicts (embedded name or tiny-llama); 'none' skips",
    )
    ap.add_argument(
        "--decay-windows", type=int, default=None, help="English windows to capture (4; quick 2)"
    )
    ap.add_argument(
        "--decay-ctx", type=int, default=None, help="window length for the capture (256; quick 64)"
    )
    ap.add_argument("--out", default="results/pe_geometry")
    args = ap.parse_args(argv)
    args.decay_windows = args.decay_windows or (2 if args.quick else 4)
    args.decay_ctx = args.decay_ctx or (64 if args.quick else 256)
    if args.decay_windows < 1 or args.decay_ctx < 8:
        ap.error(
            f"--decay-windows must be >= 1 and --decay-ctx >= 8, got {args.decay_windows}, "
            f"{args.decay_ctx}"
        )
    if args.steps is not None and args.steps < 1:
        ap.error(f"--steps must be >= 1, got {args.steps}")
    return args


def train_config(args: argparse.Namespace) -> PETrainConfig:
    """The config every order shares, from --quick, --scale, --steps, --tokenizer and --device."""
    cfg = QUICK if args.quick else DEFAULT
    cfg = cfg.scaled(args.scale) if args.scale != 1.0 else cfg
    cfg = dataclasses.replace(cfg, tokenizer=args.tokenizer, device=args.device)
    return cfg if args.steps is None else dataclasses.replace(cfg, steps=args.steps)


def learned_models(
    cfg: PETrainConfig, orders: list[str], out: Path, store: RunStore
) -> dict[str, PETrainResult]:
    """Train each order not already in ``store`` (its result file beside runs.json); load the
    rest."""
    results = {}
    for order in orders:
        key = {"part": "learned_pe", "order": order, "config": cfg.to_dict()}
        done = store.get(key)
        if done is not None and (out / done["file"]).exists():
            results[order] = PETrainResult.load(out / done["file"])
            continue
        r = train_pe_model(order, cfg)
        digest = hashlib.sha256(RunStore.key(cfg.to_dict()).encode()).hexdigest()[:10]
        name = f"pe_{order}_{digest}.json"
        r.save(out / name)
        store.put(
            key,
            {
                "file": name,
                "final_train_loss": r.final_train_loss,
                "val_loss": r.val_loss,
                "seconds": r.wall_seconds,
            },
        )
        print(
            f"{order:9s} train loss {r.final_train_loss:.3f}  val loss {r.val_loss:.3f}  "
            f"{r.wall_seconds:.0f} s",
            flush=True,
        )
        results[order] = r
    return results


def similarity_summary(s: PESimilarity) -> dict[str, Any]:
    """Period, strength and the by-distance curve of one position table."""
    v = decay_verdict(s)
    return {
        "name": s.name,
        "n_pos": s.n_pos,
        "d_model": s.d_model,
        "period": s.period,
        "period_strength": s.period_strength,
        "period_threshold": s.period_threshold,
        "decay_verdict": v.verdict,
        "spearman": v.spearman,
        "near_mean": v.near_mean,
        "far_mean": v.far_mean,
        "by_distance": s.mean.tolist(),
    }


def heatmaps(sims: list[PESimilarity]) -> go.Figure:
    """Pairwise cosine-similarity heatmaps side by side (Luo & Love Fig. 7, top)."""
    fig = make_subplots(rows=1, cols=len(sims), subplot_titles=[s.name for s in sims])
    for i, s in enumerate(sims, start=1):
        fig.add_trace(s.heatmap().update(showscale=i == len(sims)), row=1, col=i)
        fig.update_yaxes(autorange="reversed", row=1, col=i)
    fig.update_layout(
        title="Cosine similarity of position embeddings (pairwise)",
        height=380,
        width=320 * len(sims),
    )
    return fig


def head_verdicts(model: Any, tokens: Any) -> list[dict[str, Any]]:
    """One row per (layer, query head): the verdict on its measured mean q·k by distance."""
    rows = []
    # One forward pass for every layer: a pass per layer would cost n_layers passes of the model.
    for layer, acts in sorted(capture_qk(model, tokens, which=("q_post", "k_post")).items()):
        q, k = acts["q_post"], acts["k_post"]
        for h in range(q.shape[2]):
            curve = rope_decay_by_distance(
                q[:, :, h],
                k[:, :, h // acts.rope.group_size],
                acts.rope,
                valid=acts.valid,
                name=f"L{layer}H{h}",
            )
            v = decay_verdict(curve)
            rows.append(
                {
                    "layer": layer,
                    "head": h,
                    "verdict": v.verdict,
                    "spearman": v.spearman,
                    "near_mean": v.near_mean,
                    "far_mean": v.far_mean,
                    "far_near_ratio": v.far_near_ratio,
                }
            )
    return rows


def count_verdicts(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Heads that decay / stay flat / grow, per layer and per third of the depth (early, middle,
    late)."""
    layers = sorted({r["layer"] for r in rows})

    def tally(sel):
        return {v: sum(r["verdict"] == v for r in sel) for v in ("decays", "flat", "grows")}

    per_layer = {str(layer): tally([r for r in rows if r["layer"] == layer]) for layer in layers}
    groups = {}
    for label, chunk in zip(
        ("early", "middle", "late"), np.array_split(np.array(layers), 3), strict=True
    ):
        if len(chunk):
            name = f"{label} (layers {chunk[0]}–{chunk[-1]})"
            groups[name] = tally([r for r in rows if chunk[0] <= r["layer"] <= chunk[-1]])
    return {"per_layer": per_layer, "per_group": groups, "total": tally(rows)}


def theory_curves(model: Any, max_distance: int) -> list[Any]:
    """Constant-vector, RoFormer-bound and Gaussian curves for the model's layer-0 frequencies."""
    inv = ropelens.rope_spec(model).layers[0].inv_freq
    return [
        rope_decay_constant(inv, max_distance).normalised(),
        roformer_bound(inv, max_distance),
        rope_gaussian_expectation(inv, max_distance),
        rope_gaussian_expectation(inv, max_distance, mean=0.5).normalised(),
    ]


def decay_part(
    args: argparse.Namespace, model: Any, store: RunStore, out: Path
) -> dict[str, Any] | None:
    """Per-head decay verdicts of a real RoPE model plus its theory curves (resumable as one
    piece)."""
    if model is None and args.decay_model == "none":
        return None
    loaded, name = _common.load(model if model is not None else args.decay_model)
    key = {"part": "decay", "model": name, "n_ctx": args.decay_ctx, "n_windows": args.decay_windows}
    done = store.get(key)
    theory = theory_curves(loaded, args.decay_ctx - 1)
    if done is None:
        _, val = data.english().split()
        tokens = data.windows(val, loaded, args.decay_ctx, n_windows=args.decay_windows)
        rows = head_verdicts(loaded, tokens)
        done = {
            "heads": rows,
            "counts": count_verdicts(rows),
            "n_windows_used": int(tokens.shape[0]),
        }
        store.put(key, done)
    atomic_write_text(
        out / "rope_theory.html",
        overlay(
            theory,
            title=f"{name}: RoPE curves for its "
            "layer-0 frequencies (constant and μ=0.5 ÷ value at 0)",
        ).to_html(include_plotlyjs="cdn"),
    )
    atomic_write_text(
        out / "rope_heads.html", spearman_map(done["heads"], name).to_html(include_plotlyjs="cdn")
    )
    verdicts = {c.name: decay_verdict(c).verdict for c in theory}
    return {
        "model": name,
        "counts": done["counts"],
        "heads": done["heads"],
        "theory_verdicts": verdicts,
    }


def spearman_map(rows: list[dict[str, Any]], name: str) -> go.Figure:
    """Layer × head heatmap of the rank correlation of mean q·k with distance (negative =
    decays)."""
    n_layers, n_heads = 1 + max(r["layer"] for r in rows), 1 + max(r["head"] for r in rows)
    z = np.full((n_layers, n_heads), np.nan)
    for r in rows:
        z[r["layer"], r["head"]] = r["spearman"]
    fig = go.Figure(
        go.Heatmap(z=z.tolist(), zmin=-1, zmax=1, colorscale="RdBu_r", colorbar={"title": "ρ"})
    )
    fig.update_layout(
        title=f"{name}: Spearman ρ of mean post-RoPE q·k vs distance, per head",
        xaxis_title="query head",
        yaxis_title="layer",
    )
    return fig


def report(result: dict[str, Any]) -> None:
    """Print the period table and the per-group decay counts."""
    print(
        f"{'model':12s} {'period':>8s} {'strength':>9s} {'threshold':>9s} {'verdict':>8s} "
        f"{'val loss':>9s}"
    )
    for order, s in result["learned_pe"].items():
        period = f"{s['period']:.1f}" if s["period"] else "-"
        loss = f"{s['val_loss']:.3f}" if "val_loss" in s else "-"
        print(
            f"{order:12s} {period:>8s} {s['period_strength']:9.3f} {s['period_threshold']:9.3f} "
            f"{s['decay_verdict']:>8s} {loss:>9s}"
        )
    if result["rope_decay"]:
        d = result["rope_decay"]
        print(
            f"\n{d['model']}: heads whose mean post-RoPE q·k decays / is flat / grows with distance"
        )
        for group, c in {**d["counts"]["per_group"], "all": d["counts"]["total"]}.items():
            print(
                f"  {group:26s} decays {c['decays']:3d}  flat {c['flat']:3d}  grows {c['grows']:3d}"
            )
        print("  theory: " + "; ".join(f"{k}: {v}" for k, v in d["theory_verdicts"].items()))


def main(argv: list[str] | None = None, model: Any = None) -> Path:
    """Run both parts (``model`` overrides ``--decay-model`` with an object); returns the results
    JSON path."""
    args = parse(argv)
    out = _common.out_dir(args.out)
    store = RunStore(out / "runs.json", meta={"script": "pe_geometry", "args": vars(args)})
    cfg = train_config(args)
    trained = learned_models(cfg, args.orders, out, store)
    sims = [pe_similarity(r.pe, name=order) for order, r in trained.items()]
    sims.append(pe_similarity(sinusoidal_pe(cfg.n_positions, cfg.d_model), name="sinusoidal"))
    learned = {s.name: similarity_summary(s) for s in sims}
    for order, r in trained.items():
        learned[order].update(
            final_train_loss=r.final_train_loss, val_loss=r.val_loss, seconds=r.wall_seconds
        )
    atomic_write_text(out / "pe_heatmaps.html", heatmaps(sims).to_html(include_plotlyjs="cdn"))
    atomic_write_text(
        out / "pe_by_distance.html",
        overlay(sims, title="Position-embedding cosine similarity by distance").to_html(
            include_plotlyjs="cdn"
        ),
    )
    result = {
        "learned_pe": learned,
        "config": cfg.to_dict(),
        "rope_decay": decay_part(args, model, store, out),
        "provenance": Provenance(
            model=f"gpt2-learned-pe + {args.decay_model}",
            corpus="english",
            n_ctx=cfg.n_positions,
            config=vars(args),
        ).to_dict(),
    }
    dump_json(out / "result.json", result)
    report(result)
    return out / "result.json"


if __name__ == "__main__":
    main()
