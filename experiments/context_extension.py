"""Context extension without (and with a little) fine-tuning: PI, NTK, dynamic NTK, YaRN, Llama 3,
LongRoPE.

A small Llama-style model trained at length L (``ropelens.training.train``'s model and data) is
evaluated at L, 2L, 4L and 8L under each method, applied at inference through ``apply_rope_variant``
(so YaRN's and LongRoPE's attention factors and LongRoPE's n̂ are honoured). LongRoPE's factors come
from ``search_longrope_factors`` at each target length, on held-out windows disjoint from the
evaluation windows. Then each method is fine-tuned briefly at 4L and evaluated again, and each
method's cost at the embedded SmolLM2's native length is measured. Perplexity with bootstrap CIs
over windows; resumable (runs in ``runs.json``, the trained model in ``model.pt``, search states per
length).

    python experiments/context_extension.py --quick
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import hashlib
import json
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _common
import torch

from ropelens import rope_spec
from ropelens.analyses.extension_planes import (
    LongRopeSearch,
    extension_planes,
    search_longrope_factors,
)
from ropelens.plots.extension_planes import compare_figure
from ropelens.results.provenance import Provenance
from ropelens.results.serialize import atomic_write_text, dump_json
from ropelens.run import data
from ropelens.run.evaluate import RunStore, bootstrap_ci, window_losses
from ropelens.run.intervene import apply_rope_variant
from ropelens.spec.variants import (
    NTK,
    Default,
    DynamicNTK,
    Linear,
    Llama3,
    LongRoPE,
    YaRN,
)
from ropelens.training import train as T

METHODS = ("none", "PI", "NTK", "DynamicNTK", "YaRN", "Llama3", "LongRoPE")
# Character tokens: a tiny model learns them in minutes and leans on position (spelling) far more
# than on subword tokens, so the methods separate; subword micro models stay near unigram
# perplexity.
QUICK = T.TrainConfig(
    d_model=64,
    n_layers=2,
    n_heads=2,
    head_dim=32,
    seq_len=64,
    batch_size=16,
    steps=400,
    warmup=40,
    tokenizer="tiny-char",
)
FULL = T.TrainConfig(seq_len=128, steps=800, tokenizer="tiny-char")


def parse(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--quick", action="store_true", help="micro model (L=64, 400 steps), 4 windows, tiny search"
    )
    ap.add_argument(
        "--multiples",
        type=int,
        nargs="+",
        default=[1, 2, 4, 8],
        help="eval lengths as multiples of L",
    )
    ap.add_argument(
        "--n-windows", type=int, default=None, help="eval windows per length (16; quick 8)"
    )
    ap.add_argument(
        "--search-population",
        type=int,
        default=None,
        help="LongRoPE search population (8; quick 6)",
    )
    ap.add_argument(
        "--search-generations", type=int, default=None, help="LongRoPE generations (4; quick 3)"
    )
    ap.add_argument(
        "--search-windows", type=int, default=4, help="held-out windows the search scores on"
    )
    ap.add_argument(
        "--finetune-steps",
        type=int,
        default=None,
        help="steps of fine-tuning at 4L (100; quick 30; 0 skips)",
    )
    ap.add_argument(
        "--smollm",
        default="smollm2-135m",
        help="embedded model for the in-distribution cost ('none' skips)",
    )
    ap.add_argument(
        "--smollm-ctx", type=int, default=None, help="eval length for the cost (2048; quick 512)"
    )
    ap.add_argument(
        "--smollm-windows", type=int, default=None, help="windows for the cost (8; quick 2)"
    )
    ap.add_argument(
        "--train-steps", type=int, default=None, help="override the small model's training steps"
    )
    ap.add_argument("--n-boot", type=int, default=2000)
    ap.add_argument("--out", default="results/context_extension")
    args = ap.parse_args(argv)
    q = args.quick
    args.n_windows = args.n_windows or (8 if q else 16)
    args.search_population = args.search_population or (6 if q else 8)
    args.search_generations = args.search_generations or (3 if q else 4)
    args.finetune_steps = (30 if q else 100) if args.finetune_steps is None else args.finetune_steps
    args.smollm_ctx = args.smollm_ctx or (512 if q else 2048)
    args.smollm_windows = args.smollm_windows or (2 if q else 8)
    if min(args.multiples) < 1 or args.n_windows < 1:
        ap.error(
            f"--multiples must be >= 1 and --n-windows >= 1, got {args.multiples}, {args.n_windows}"
        )
    return args


# --------------------------------------------------------------------------------------------
# the small model
# --------------------------------------------------------------------------------------------
def trained_model(config: T.TrainConfig, out: Path) -> tuple[Any, dict[str, Any]]:
    """The model ``config`` trains (cached in ``out/model-<config hash>.pt``), and its token
    streams."""
    train_ids, val_ids, vocab, bos = T.token_streams(
        config.corpus, config.tokenizer, config.val_fraction
    )
    key = hashlib.sha256(json.dumps(config.to_dict(), sort_keys=True).encode()).hexdigest()[:16]
    path = out / f"model-{key}.pt"
    model = T.build_model(config, vocab)
    if path.exists():
        model.load_state_dict(torch.load(path))
    else:
        _fit(model, T.cut_windows(train_ids, config.seq_len, bos), config, config.steps, config.lr)
        torch.save(model.state_dict(), path)
    return model.eval(), {"val_ids": val_ids, "train_ids": train_ids, "bos": bos, "key": key}


def _fit(
    model, batches: torch.Tensor, config: T.TrainConfig, steps: int, lr: float, variant=None
) -> None:
    """ropelens.training.train.fit with a 10% warm-up; through the bridge under ``variant`` when
    given."""

    def under_variant(m, batch):
        with apply_rope_variant(m, variant):
            return m(batch, return_type="loss")

    T.fit(
        model,
        batches,
        steps=steps,
        batch_size=config.batch_size,
        lr=lr,
        warmup=max(1, steps // 10),
        seed=config.seed,
        loss_fn=None if variant is None else under_variant,
    )


def _bridge(hf) -> Any:
    from ropelens.loading.models import wrap_hf_model
    from ropelens.testing import tiny_tokenizer

    # The tokenizer is a stand-in: inputs are the compact training ids, never text.
    return wrap_hf_model(
        hf,
        tiny_tokenizer(),
        device="cpu",
        label="context-extension-llama",
        hub_name="ropelens/tiny-llama",
    )


def method_variant(name: str, s: float, l0: int, searched: dict[int, LongRopeSearch], n_ctx: int):
    """The variant ``name`` stands for at extension ratio ``s`` (None: not defined there)."""
    if name == "LongRoPE":
        return searched[n_ctx].variant if n_ctx in searched else None
    return {
        "none": Default(),
        "PI": Linear(s),
        "NTK": NTK(s),
        "DynamicNTK": DynamicNTK(2.0, l0),
        "YaRN": YaRN(s, l0),
        "Llama3": Llama3(s, 1.0, 4.0, l0),
    }[name]


def _run(
    store: RunStore, cfg: dict[str, Any], model, variant, tokens, n_boot: int
) -> dict[str, Any]:
    done = store.get(cfg)
    if done is not None:
        return done
    t = time.perf_counter()
    with apply_rope_variant(model, variant):
        losses = window_losses(model, tokens, batch_size=4, progress=False)
    est = bootstrap_ci(losses, n_boot=n_boot)
    store.put(
        cfg,
        {
            "estimate": est.to_dict(),
            "window_losses": losses.tolist(),
            "seconds": time.perf_counter() - t,
        },
    )
    print(
        f"{cfg['stage']:9s} {cfg['method']:10s} n_ctx={cfg['n_ctx']:5d} ppl {est.perplexity}",
        flush=True,
    )
    return store.get(cfg)


def searches(bridge, info, l0: int, args, out: Path) -> dict[int, LongRopeSearch]:
    """LongRoPE factors per target length, scored on the tail of the val split (disjoint from
    eval)."""
    found = {}
    for k in (m for m in args.multiples if m > 1):
        n_ctx = k * l0
        tail = info["val_ids"][-args.search_windows * (n_ctx - 1) :]
        tokens = T.cut_windows(tail, n_ctx, info["bos"], args.search_windows)
        found[n_ctx] = search_longrope_factors(
            bridge,
            n_ctx,
            population=args.search_population,
            generations=args.search_generations,
            n_windows=args.search_windows,
            seed=0,
            original_ctx=l0,
            tokens=tokens,
            progress=False,
            state_path=out / f"search-{info['key']}-{n_ctx}.json",
        )
        found[n_ctx].save(out / f"longrope_search_{n_ctx}.json")
        r = found[n_ctx]
        print(
            f"search    {n_ctx:5d}: best {r.perplexity:.4g} (initial {r.initial_best:.4g}); PI "
            f"{r.baselines['PI']:.4g}, YaRN {r.baselines['YaRN']:.4g}; n_hat {r.n_hat}",
            flush=True,
        )
    return found


def extrapolation(
    bridge, hf, info, config: T.TrainConfig, args, store: RunStore, out: Path
) -> dict[int, LongRopeSearch]:
    """Every method at every length without fine-tuning, then after a short fine-tune at 4L; returns
    the LongRoPE searches by target length."""
    l0 = config.seq_len
    found = searches(bridge, info, l0, args, out)
    for k in args.multiples:
        n_ctx = k * l0
        tokens = T.cut_windows(info["val_ids"], n_ctx, info["bos"], args.n_windows)
        for name in METHODS:
            v = method_variant(name, float(k), l0, found, n_ctx)
            if v is not None:
                cfg = {
                    "model": info["key"],
                    "stage": "zero-shot",
                    "method": name,
                    "variant": v.to_dict(),
                    "n_ctx": n_ctx,
                    "n_windows": args.n_windows,
                }
                _run(store, cfg, bridge, v, tokens, args.n_boot)
    n_ft = 4 * l0
    if args.finetune_steps and n_ft in found:
        tokens = T.cut_windows(info["val_ids"], n_ft, info["bos"], args.n_windows)
        batches = T.cut_windows(info["train_ids"], n_ft, info["bos"])
        for name in METHODS:
            v = method_variant(name, 4.0, l0, found, n_ft)
            cfg = {
                "model": info["key"],
                "stage": "finetuned",
                "method": name,
                "variant": v.to_dict(),
                "n_ctx": n_ft,
                "n_windows": args.n_windows,
                "steps": args.finetune_steps,
            }
            if store.get(cfg) is None:
                tuned = _bridge(copy.deepcopy(hf))
                _fit(tuned, batches, config, args.finetune_steps, config.lr / 4, variant=v)
                _run(store, cfg, tuned, v, tokens, args.n_boot)
    layer = rope_spec(bridge)[0]
    views = [
        extension_planes(layer, method_variant(n, 4.0, l0, found, n_ft), l0, n_ft)
        for n in METHODS[1:]
        if method_variant(n, 4.0, l0, found, n_ft) is not None
    ]
    dump_json(out / "plane_views_4x.json", [v.to_dict() for v in views])
    atomic_write_text(
        out / "wavelengths_4x.html", compare_figure(views).to_html(include_plotlyjs="cdn")
    )
    return found


def search_rows(found: dict[int, LongRopeSearch]) -> list[dict[str, Any]]:
    """The searched factors' perplexity on the search windows against PI and YaRN, per target
    length."""
    return [
        {
            "target_len": n,
            "longrope": r.perplexity,
            "initial_best": r.initial_best,
            "PI": r.baselines["PI"],
            "YaRN": r.baselines["YaRN"],
            "gain_vs_PI": r.gain()["PI"],
            "gain_vs_YaRN": r.gain()["YaRN"],
            "n_hat": r.n_hat,
            "factors": list(r.factors),
            "evaluated": max(h["n_evaluated"] for h in r.history),
        }
        for n, r in sorted(found.items())
    ]


def smollm_cost(args, store: RunStore) -> None:
    """Each method, configured for 4× extension, at the embedded model's native length (in
    distribution)."""
    model, name = _common.load(args.smollm)
    layer = rope_spec(model)[0]
    l0 = int(layer.n_ctx)
    _, val = data.english().split()
    tokens = data.windows(val, model, args.smollm_ctx, n_windows=args.smollm_windows)
    yarn_factors = tuple(
        float(x) for x in (Default().inv_freq(layer) / YaRN(4.0, l0).inv_freq(layer))
    )
    variants = {
        "none": Default(),
        "PI": Linear(4.0),
        "NTK": NTK(4.0),
        "DynamicNTK": DynamicNTK(2.0, l0),
        "YaRN": YaRN(4.0, l0),
        "Llama3": Llama3(4.0, 1.0, 4.0, l0),
        "LongRoPE": LongRoPE((1.0,) * layer.n_planes, yarn_factors, l0, factor=4.0),
    }
    for method, v in variants.items():
        cfg = {
            "model": name,
            "stage": "native",
            "method": method,
            "variant": v.to_dict(),
            "n_ctx": args.smollm_ctx,
            "n_windows": args.smollm_windows,
        }
        _run(store, cfg, model, v, tokens, args.n_boot)


def table(store: RunStore) -> list[dict[str, Any]]:
    rows = []
    for run in store.runs.values():
        c, e = run["config"], run["estimate"]["perplexity"]
        rows.append(
            {
                "model": c["model"],
                "stage": c["stage"],
                "method": c["method"],
                "n_ctx": c["n_ctx"],
                "ppl": e["mean"],
                "ppl_lo": e["lo"],
                "ppl_hi": e["hi"],
                "n_windows": c["n_windows"],
            }
        )
    order = {m: i for i, m in enumerate(METHODS)}
    return sorted(
        rows, key=lambda r: (r["stage"] != "zero-shot", r["stage"], r["n_ctx"], order[r["method"]])
    )


def figure(rows: list[dict[str, Any]]):
    """Zero-shot perplexity vs length, one line per method."""
    import plotly.graph_objects as go

    fig = go.Figure()
    for m in METHODS:
        pts = sorted(
            (r for r in rows if r["stage"] == "zero-shot" and r["method"] == m),
            key=lambda r: r["n_ctx"],
        )
        if pts:
            fig.add_trace(
                go.Scatter(
                    x=[r["n_ctx"] for r in pts],
                    y=[r["ppl"] for r in pts],
                    name=m,
                    mode="lines+markers",
                    error_y={
                        "type": "data",
                        "symmetric": False,
                        "array": [r["ppl_hi"] - r["ppl"] for r in pts],
                        "arrayminus": [r["ppl"] - r["ppl_lo"] for r in pts],
                    },
                )
            )
    fig.update_layout(
        title="Perplexity beyond the training length, no fine-tuning",
        xaxis_type="log",
        yaxis_type="log",
        xaxis_title="context length",
        yaxis_title="perplexity (95% CI)",
    )
    return fig


def main(argv: list[str] | None = None) -> Path:
    """Run everything not already in the results; returns the result JSON path."""
    args = parse(argv)
    out = _common.out_dir(args.out)
    config = QUICK if args.quick else FULL
    if args.train_steps is not None:
        config = dataclasses.replace(
            config, steps=args.train_steps, warmup=min(config.warmup, args.train_steps)
        )
    store = RunStore(out / "runs.json", meta={"script": "context_extension", "args": vars(args)})
    hf, info = trained_model(config, out)
    found = extrapolation(_bridge(copy.deepcopy(hf)), hf, info, config, args, store, out)
    if args.smollm != "none":
        smollm_cost(args, store)
    rows = table(store)
    dump_json(
        out / "result.json",
        {
            "table": rows,
            "searches": search_rows(found),
            "train_config": config.to_dict(),
            "provenance": Provenance(
                model=f"llama-{config.n_layers}x{config.d_model}+{args.smollm}",
                corpus="english[val]",
                n_windows=args.n_windows,
                n_ctx=config.seq_len,
                config=vars(args),
            ).to_dict(),
        },
    )
    atomic_write_text(
        out / "perplexity_vs_length.html", figure(rows).to_html(include_plotlyjs="cdn")
    )
    print(f"{'stage':9s} {'method':10s} {'n_ctx':>5s} {'ppl':>9s}  95% CI")
    for r in rows:
        print(
            f"{r['stage']:9s} {r['method']:10s} {r['n_ctx']:5d} {r['ppl']:9.3f}  "
            f"[{r['ppl_lo']:.3f}, {r['ppl_hi']:.3f}]"
        )
    for r in search_rows(found):
        print(
            f"search {r['target_len']:5d}: LongRoPE {r['longrope']:.4g} vs PI {r['PI']:.4g} "
            f"({r['gain_vs_PI']:+.1%}) and YaRN {r['YaRN']:.4g} ({r['gain_vs_YaRN']:+.1%}), "
            f"n_hat {r['n_hat']}"
        )
    return out / "result.json"


if __name__ == "__main__":
    main()
