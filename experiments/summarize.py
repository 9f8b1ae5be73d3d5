"""Markdown tables of every experiment result under a results folder (what docs/results.md holds).

    python experiments/summarize.py                      # reads results/, prints markdown
    python experiments/summarize.py --out docs/results.md

Reads the ``result.json`` files the experiment scripts write (never re-running anything) and prints
one table per experiment with its provenance (commit, versions, settings).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from ropelens.report.experiments import load_experiments, main_result
from ropelens.results.serialize import atomic_write_text


def _ci(mean: float, lo: float, hi: float, digits: int = 4) -> str:
    return f"{mean:.{digits}g} [{lo:.{digits}g}, {hi:.{digits}g}]"


def _prov(res: dict[str, Any]) -> str:
    p = res.get("provenance") or {}
    commit = (p.get("commit") or "–")[:12]
    v = p.get("versions") or {}
    return (
        f"_Source: `{res['path']}`; commit `{commit}`; torch {v.get('torch', '?')}, transformers "
        f"{v.get('transformers', '?')}; created {p.get('created', '?')}._"
    )


def _table(header: list[str], rows: list[list[str]]) -> str:
    out = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    out += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(out)


def inference(results: list[dict[str, Any]]) -> str:
    parts = []
    for res in results:
        rows = res["table"]
        for model in sorted({r["model"] for r in rows}):
            for kind in sorted({r["layer_kind"] for r in rows if r["model"] == model}):
                sel = [r for r in rows if r["model"] == model and r["layer_kind"] == kind]
                lengths = sorted({r["n_ctx"] for r in sel})
                labels = sorted(
                    {(r["variant"], r["p"]) for r in sel},
                    key=lambda vp: (vp[0] != "PRoPE", vp[0], vp[1]),
                )
                body = []
                for v, p in labels:
                    name = {
                        "PRoPE": f"p = {p:g}",
                        "PRoPEReversed": f"reversed {p:g}",
                        "PRoPEPartial": f"partial {p:g}",
                    }.get(v, v)
                    cells = []
                    for n in lengths:
                        r = next(
                            (r for r in sel if (r["variant"], r["p"], r["n_ctx"]) == (v, p, n)),
                            None,
                        )
                        cells.append(_ci(r["ppl"], r["ppl_lo"], r["ppl_hi"]) if r else "–")
                    body.append([name, *cells])
                windows = {r["n_ctx"]: r["n_windows"] for r in sel}
                head = ["variant", *(f"L={n} ({windows[n]} win.)" for n in lengths)]
                parts.append(f"#### {model}, truncated layers: {kind}\n\n" + _table(head, body))
        parts.append(_prov(res))
    return "\n\n".join(parts)


def training(results: list[dict[str, Any]]) -> str:
    res = main_result(results)
    t = res["table"]
    base = ((res.get("provenance") or {}).get("config") or {}).get("base", {})
    order = sorted(t, key=lambda k: t[k]["val"]["ppl"])

    def paired(k: str) -> str:
        d = t[k].get("vs_rope_10k")
        return "–" if d is None else f"{d['dloss']:+.4f} [{d['lo']:+.4f}, {d['hi']:+.4f}]"

    rows = [
        [
            k,
            _ci(t[k]["val"]["ppl"], t[k]["val"]["lo"], t[k]["val"]["hi"]),
            _ci(t[k]["val_2x"]["ppl"], t[k]["val_2x"]["lo"], t[k]["val_2x"]["hi"]),
            paired(k),
            str(t[k]["val"]["n"]),
            f"{t[k]['paper_wiki']:.4f}",
        ]
        for k in order
    ]
    cfg = (
        (
            f"{base.get('n_layers')} layers, d_model {base.get('d_model')}, "
            f"{base.get('n_heads')} heads × {base.get('head_dim')}, {base.get('steps')} steps × "
            f"{base.get('batch_size')} × {base.get('seq_len')} tokens, lr {base.get('lr')}, "
            f"corpus {base.get('corpus')}"
        )
        if base
        else ""
    )
    cmp = res.get("comparison", {})
    return "\n\n".join(
        [
            f"Config: {cfg}.",
            _table(
                [
                    "variant",
                    "ppl at L (95% t-CI over seeds)",
                    "ppl at 2L",
                    "Δ loss vs RoPE θ=10k (paired by seed)",
                    "seeds",
                    "paper Wiki ppl",
                ],
                rows,
            ),
            f"Ours (best first): {' > '.join(cmp.get('ours', []))}  \nPaper: "
            f"{' > '.join(cmp.get('paper', []))}  \n"
            f"Kendall τ {cmp.get('kendall_tau', float('nan')):+.2f}. **{res.get('verdict', '')}**",
            _prov(res),
        ]
    )


def ablation(results: list[dict[str, Any]]) -> str:
    parts = []
    for res in results:
        rows = [r for r in res["table"] if r["layers"] == "all"]
        parts.append(
            _table(
                ["band (0 = highest)", "planes", "Δ loss (nats, 95% CI)"],
                [
                    [
                        str(r["band"]),
                        f"{r['planes'][0]}–{r['planes'][-1]}",
                        _ci(r["dloss"], r["lo"], r["hi"], 3),
                    ]
                    for r in rows
                ],
            )
        )
        per = [r for r in res["table"] if r["layers"] != "all"]
        if per:
            worst = sorted(per, key=lambda r: -r["dloss"])[:8]
            parts.append(
                "Largest single-layer effects:\n\n"
                + _table(
                    ["layer", "band", "Δ loss"],
                    [
                        [r["layers"], str(r["band"]), _ci(r["dloss"], r["lo"], r["hi"], 3)]
                        for r in worst
                    ],
                )
            )
        if res.get("planes"):
            parts.append(
                "Single planes (every layer):\n\n"
                + _table(
                    ["plane", "wavelength", "Δ loss"],
                    [
                        [
                            str(r["plane"]),
                            f"{r['wavelength']:.4g}",
                            _ci(r["dloss"], r["lo"], r["hi"], 3),
                        ]
                        for r in res["planes"]
                    ],
                )
            )
        parts.append(_prov(res))
    return "\n\n".join(parts)


def context(results: list[dict[str, Any]]) -> str:
    res = main_result(results)
    rows = res["table"]
    parts = []
    methods = list(dict.fromkeys(r["method"] for r in rows))
    for stage in dict.fromkeys(r["stage"] for r in rows):
        sel = [r for r in rows if r["stage"] == stage]
        lengths = sorted({r["n_ctx"] for r in sel})
        body = []
        for m in methods:
            cells = []
            for n in lengths:
                r = next((r for r in sel if (r["method"], r["n_ctx"]) == (m, n)), None)
                cells.append(_ci(r["ppl"], r["ppl_lo"], r["ppl_hi"]) if r else "–")
            if any(c != "–" for c in cells):
                body.append([m, *cells])
        model = sel[0]["model"]
        parts.append(
            f"#### {stage} ({model})\n\n" + _table(["method", *(f"L={n}" for n in lengths)], body)
        )
    if res.get("searches"):
        parts.append(
            "#### LongRoPE search (perplexity on the search windows, same target and windows)\n\n"
            + _table(
                [
                    "target",
                    "searched",
                    "best initial",
                    "PI",
                    "YaRN",
                    "gain vs PI",
                    "gain vs YaRN",
                    "n̂",
                    "candidates",
                ],
                [
                    [
                        str(r["target_len"]),
                        f"{r['longrope']:.4g}",
                        f"{r['initial_best']:.4g}",
                        f"{r['PI']:.4g}",
                        f"{r['YaRN']:.4g}",
                        f"{r['gain_vs_PI']:+.1%}",
                        f"{r['gain_vs_YaRN']:+.1%}",
                        str(r["n_hat"]),
                        str(r["evaluated"]),
                    ]
                    for r in res["searches"]
                ],
            )
        )
    parts.append(_prov(res))
    return "\n\n".join(parts)


def main(argv: list[str] | None = None) -> str:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--results", default="results")
    ap.add_argument(
        "--out", default=None, help="write the markdown here (atomically) instead of stdout"
    )
    args = ap.parse_args(argv)
    exps = load_experiments(args.results)
    sections = [
        ("p-RoPE at inference", "inference", inference),
        ("From-scratch training", "training", training),
        ("Band and plane ablation", "ablation", ablation),
        ("Context extension", "context", context),
    ]
    text = (
        "\n\n".join(f"## {title}\n\n{fn(exps[key])}" for title, key, fn in sections if key in exps)
        + "\n"
    )
    if args.out:
        atomic_write_text(Path(args.out), text)
    else:
        sys.stdout.write(text)
    return text


if __name__ == "__main__":
    main()
