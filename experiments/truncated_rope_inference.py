"""Perplexity of pretrained models when their RoPE is truncated at inference (p-RoPE, reversed,
partial).

For each model, variant (p ∈ {0 … 1}, reversed and partial 0.75), context length and layer kind
(Gemma: global, local or both), the mean next-token loss over held-out windows of the embedded
English text, with a bootstrap CI over windows. Resumable: finished runs live in the results JSON.

    python experiments/truncated_rope_inference.py --quick
    python experiments/truncated_rope_inference.py --model gemma-3-270m --layer-kind both
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _common

from ropelens import rope_spec
from ropelens.results.provenance import Provenance
from ropelens.results.serialize import atomic_write_text
from ropelens.run import data
from ropelens.run.evaluate import RunStore, bootstrap_ci, window_losses
from ropelens.run.intervene import apply_rope_variant, is_identity
from ropelens.spec.variants import PRoPE, PRoPEPartial, PRoPEReversed

P_VALUES = (0.0, 0.125, 0.25, 0.5, 0.75, 0.875, 1.0)
VARIANTS = tuple(PRoPE(p) for p in P_VALUES) + (PRoPEReversed(0.75), PRoPEPartial(0.75))


def parse(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--model",
        nargs="+",
        default=["smollm2-135m", "gemma-3-270m"],
        help="embedded model names, or tiny-llama / tiny-gemma3 (random, for tests)",
    )
    ap.add_argument(
        "--lengths",
        type=int,
        nargs="+",
        default=None,
        help="context lengths (default 128 256 512 1024 2048; quick: 128 256)",
    )
    ap.add_argument(
        "--n-windows", type=int, default=None, help="held-out windows per length (16; quick 4)"
    )
    ap.add_argument(
        "--tokens",
        type=int,
        default=None,
        help="token budget per length instead of a fixed --n-windows: max(4, tokens // n_ctx) "
        "windows, so long contexts cost no more than short ones (e.g. 8192)",
    )
    ap.add_argument(
        "--min-windows", type=int, default=4, help="fewest windows per length under --tokens"
    )
    ap.add_argument(
        "--layer-kind",
        default="all",
        choices=["global", "local", "both", "all"],
        help="Gemma: truncate global (full), local (sliding) or both kinds; all = each",
    )
    ap.add_argument("--batch-size", type=int, default=2)
    ap.add_argument("--n-boot", type=int, default=2000)
    ap.add_argument("--quick", action="store_true", help="4 windows, lengths 128 256")
    ap.add_argument("--out", default="results/truncated_rope_inference")
    args = ap.parse_args(argv)
    # Explicit options win over --quick's defaults.
    args.lengths = args.lengths or ([128, 256] if args.quick else [128, 256, 512, 1024, 2048])
    args.n_windows = args.n_windows or (4 if args.quick else 16)
    bad = [n for n in args.lengths if n < 2]
    if args.tokens is not None and (args.tokens < 2 or args.min_windows < 1):
        ap.error(
            f"--tokens must be >= 2 and --min-windows >= 1, got {args.tokens}, {args.min_windows}"
        )
    if bad or args.n_windows < 1:
        ap.error(f"lengths must be >= 2 and --n-windows >= 1 (got {bad or args.n_windows})")
    return args


def windows_for(args: argparse.Namespace, n_ctx: int) -> int:
    """Windows evaluated at ``n_ctx``: fixed, or a token budget spread over at least
    --min-windows."""
    return args.n_windows if args.tokens is None else max(args.min_windows, args.tokens // n_ctx)


def _identity_run(
    store: RunStore, cfg: dict[str, Any], variant: Any, model: Any
) -> dict[str, Any] | None:
    """A finished run of the same variant under another layer kind, when the variant leaves every
    layer rotating exactly as the model does (p = 1): then the layers it is applied to do not
    matter."""
    spec = rope_spec(model)
    if not is_identity(spec, variant, spec.layer_indices(None), cfg["n_ctx"]):
        return None
    for kind in ("all", "global", "local", "both"):
        done = store.get({**cfg, "layer_kind": kind})
        if done is not None:
            return {k: v for k, v in done.items() if k != "config"}
    return None


def sweep_model(model: Any, name: str, args: argparse.Namespace, store: RunStore) -> None:
    """Every (layer kind, length, variant) of one model not already in ``store``."""
    _, val = data.english().split()
    for kind in _common.layer_kinds(name, args.layer_kind, model):
        for n_ctx in args.lengths:
            n_windows = windows_for(args, n_ctx)
            tokens = data.windows(val, model, n_ctx, n_windows=n_windows)
            for variant in VARIANTS:
                cfg = {
                    "model": name,
                    "variant": variant.to_dict(),
                    "n_ctx": n_ctx,
                    "layer_kind": kind,
                    "n_windows": n_windows,
                }
                if store.get(cfg) is not None:
                    continue
                same = _identity_run(store, cfg, variant, model)
                if same is not None:
                    store.put(cfg, same)
                    continue
                t = time.perf_counter()
                with apply_rope_variant(model, variant, layer_kind=_common.LAYER_KINDS[kind]):
                    losses = window_losses(model, tokens, args.batch_size, progress=False)
                est = bootstrap_ci(losses, n_boot=args.n_boot)
                store.put(
                    cfg,
                    {
                        "label": variant.name,
                        "estimate": est.to_dict(),
                        "window_losses": losses.tolist(),
                        "n_windows_used": int(tokens.shape[0]),
                        "seconds": time.perf_counter() - t,
                    },
                )
                print(
                    f"{name:14s} {kind:6s} n_ctx={n_ctx:5d} {variant.name:32s} "
                    f"ppl {est.perplexity}",
                    flush=True,
                )


def table(store: RunStore) -> list[dict[str, Any]]:
    """One tidy row per finished run."""
    rows = []
    for run in store.runs.values():
        c, e = run["config"], run["estimate"]
        rows.append(
            {
                "model": c["model"],
                "layer_kind": c["layer_kind"],
                "n_ctx": c["n_ctx"],
                "variant": c["variant"]["variant"],
                "p": c["variant"]["p"],
                "loss": e["loss"]["mean"],
                "ppl": e["perplexity"]["mean"],
                "ppl_lo": e["perplexity"]["lo"],
                "ppl_hi": e["perplexity"]["hi"],
                "n_windows": run["n_windows_used"],
            }
        )
    return sorted(
        rows, key=lambda r: (r["model"], r["layer_kind"], r["n_ctx"], r["variant"], r["p"])
    )


def figure(rows: list[dict[str, Any]]):
    """Perplexity vs p, one line per (model, layer kind, length); reversed/partial as markers."""
    import plotly.graph_objects as go

    fig = go.Figure()
    groups = sorted({(r["model"], r["layer_kind"], r["n_ctx"]) for r in rows})
    for model, kind, n_ctx in groups:
        sel = [r for r in rows if (r["model"], r["layer_kind"], r["n_ctx"]) == (model, kind, n_ctx)]
        for variant, mode, symbol in (
            ("PRoPE", "lines+markers", "circle"),
            ("PRoPEReversed", "markers", "triangle-down"),
            ("PRoPEPartial", "markers", "square"),
        ):
            pts = sorted((r for r in sel if r["variant"] == variant), key=lambda r: r["p"])
            if not pts:
                continue
            fig.add_trace(
                go.Scatter(
                    x=[r["p"] for r in pts],
                    y=[r["ppl"] for r in pts],
                    mode=mode,
                    marker_symbol=symbol,
                    name=f"{model} {kind} L={n_ctx} {variant}",
                    error_y={
                        "type": "data",
                        "symmetric": False,
                        "array": [r["ppl_hi"] - r["ppl"] for r in pts],
                        "arrayminus": [r["ppl"] - r["ppl_lo"] for r in pts],
                    },
                )
            )
    fig.update_layout(
        title="Held-out perplexity under p-RoPE truncation at inference",
        xaxis_title="p (share of highest frequencies kept)",
        yaxis_title="perplexity (95% bootstrap CI over windows)",
        yaxis_type="log",
    )
    return fig


def main(argv: list[str] | None = None, model: Any = None) -> Path:
    """Run the sweep (``model`` overrides ``--model`` with an object); returns the results JSON
    path."""
    args = parse(argv)
    out = _common.out_dir(args.out)
    store = RunStore(
        out / "runs.json", meta={"script": "truncated_rope_inference", "args": vars(args)}
    )
    for spec in [model] if model is not None else args.model:
        loaded, name = _common.load(spec)
        sweep_model(loaded, name, args, store)
    rows = table(store)
    result = {
        "table": rows,
        "provenance": Provenance(
            model=",".join(sorted({r["model"] for r in rows})),
            corpus="english[val]",
            n_windows=args.n_windows,
            config=vars(args),
        ).to_dict(),
    }
    from ropelens.results.serialize import dump_json

    dump_json(out / "result.json", result)
    atomic_write_text(out / "perplexity_vs_p.html", figure(rows).to_html(include_plotlyjs="cdn"))
    print(f"{'model':14s} {'kind':6s} {'n_ctx':>5s} {'variant':14s} {'p':>5s} {'ppl':>9s}  95% CI")
    for r in rows:
        print(
            f"{r['model']:14s} {r['layer_kind']:6s} {r['n_ctx']:5d} {r['variant']:14s} "
            f"{r['p']:5.3f} {r['ppl']:9.3f}  [{r['ppl_lo']:.3f}, {r['ppl_hi']:.3f}]"
        )
    return out / "result.json"


if __name__ == "__main__":
    main()
