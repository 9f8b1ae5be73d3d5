"""The seed's causal claims on SmolLM2-135M and Gemma-3-270M, side by side, with power.

For each model: the head taxonomy on text (positional heads, and how content-dependent each band's
logit is), retrieval heads (copy score ≥ 0.1), then

- *positional knockout*: the highest frequencies zeroed in the positional heads (a dose curve; the
  main dose is a quarter of the planes), measured by the positional probe (the heads' attention at
  their own offset on short random-token windows), against random planes in the same heads and
  random head sets in the same layers given the same planes; Gemma's local (sliding-window) and
  global positional heads as separate sets;
- *retrieval knockout*: the lowest frequencies zeroed in the retrieval heads, measured by the copy
  loss and accuracy on passkey prompts, against the same two controls; Gemma's local and global
  retrieval heads also as sets of their own;
- *semantic-band knockout*: the lowest frequencies zeroed in the heads (neither positional nor
  retrieval) whose lowest-band logit varies most with content, measured by the next-token loss on
  content tokens and on function tokens of text, against the same two controls;
- *p-RoPE at inference*: the loss with the lowest fraction of frequencies kept rotating (per layer
  kind on Gemma).

Every control draw of a window runs as one batch row of one forward
(:func:`ropelens.analyses.knockout.knocked_out_rows`), so 99 draws cost one batched forward per
window. p-values are one-sided, (1 + #draws at least as harmful) / (1 + n): their floor is
1/(1 + n) and their Monte Carlo standard error sqrt(p(1 − p)/n). Resumable: each (model, step,
window) is kept in ``runs.json`` as it finishes. Writes ``result.json``, ``two_models.html`` and
``two_models.md``.

    python experiments/two_models.py --quick
    python experiments/two_models.py --models smollm2-135m gemma-3-270m --steps positional
"""

from __future__ import annotations

import argparse
import html
import math
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _common
import numpy as np
import torch

from ropelens.analyses.head_taxonomy import random_tokens
from ropelens.analyses.knockout import (
    knocked_out_rows,  # noqa: F401  (tests read it here)
    plane_order,
)
from ropelens.analyses.passkey_retrieval import make_passkey, passkey_prompt
from ropelens.analyses.retrieval_heads import copy_case
from ropelens.backends.hf import decoder_layers  # noqa: F401  (tests read it here)
from ropelens.claims.rows import (  # noqa: F401  (the unit tests read the machinery here too)
    by_layer_kind,
    copy_values,
    distinct_rows,
    find_heads,
    first_knocked_layer,
    head_sets,
    loss_values,
    probe_values,
    row_scores,
    token_classes,
)
from ropelens.results.serialize import atomic_write_text, dump_json
from ropelens.run import data
from ropelens.run.evaluate import RunStore, percentile_ci
from ropelens.run.intervene import apply_rope_variant
from ropelens.run.stats import matched_random_sets, permutation_p_value
from ropelens.spec.reading import hf_model_of, rope_spec
from ropelens.spec.variants import PRoPE

STEPS = ("heads", "positional", "retrieval", "semantic", "prope")
P_VALUES = (0.0, 0.25, 0.5, 0.75, 1.0)


# --------------------------------------------------------------------------------------------
# settings
# --------------------------------------------------------------------------------------------
def parse(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", nargs="+", default=["smollm2-135m", "gemma-3-270m"])
    ap.add_argument("--steps", nargs="+", default=list(STEPS), choices=STEPS)
    ap.add_argument(
        "--sets", nargs="+", default=None, help="only these head sets (e.g. 'positional local')"
    )
    ap.add_argument("--n-windows", type=int, default=None, help="windows per metric (16)")
    ap.add_argument("--n-draws", type=int, default=None, help="draws per control (99)")
    ap.add_argument("--retrieval-draws", type=int, default=None, help="(default --n-draws)")
    ap.add_argument("--semantic-draws", type=int, default=None, help="(default --n-draws)")
    ap.add_argument("--probe-ctx", type=int, default=None, help="random-token window (32)")
    ap.add_argument("--text-ctx", type=int, default=None, help="text window (128)")
    ap.add_argument("--prompt-len", type=int, default=None, help="passkey prompt tokens (256)")
    ap.add_argument("--taxonomy-windows", type=int, default=None, help="text windows (8)")
    ap.add_argument("--taxonomy-ctx", type=int, default=None, help="their tokens (256)")
    ap.add_argument("--semantic-heads", type=int, default=10)
    ap.add_argument("--row-tokens", type=int, default=None, help="batch rows × tokens per forward")
    ap.add_argument("--n-boot", type=int, default=2000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument(
        "--report", action="store_true", help="only write the page from what runs.json holds"
    )
    ap.add_argument("--quick", action="store_true", help="tiny-gemma3, 3 windows, 4 draws")
    ap.add_argument("--out", default="results/two_models")
    args = ap.parse_args(argv)
    q = args.quick
    args.n_windows = args.n_windows or (3 if q else 16)
    args.n_draws = args.n_draws or (4 if q else 99)
    args.retrieval_draws = args.retrieval_draws or args.n_draws
    args.semantic_draws = args.semantic_draws or args.n_draws
    args.probe_ctx = args.probe_ctx or (12 if q else 32)
    args.text_ctx = args.text_ctx or (24 if q else 128)
    args.prompt_len = args.prompt_len or (280 if q else 256)
    args.taxonomy_windows = args.taxonomy_windows or (2 if q else 8)
    args.taxonomy_ctx = args.taxonomy_ctx or (32 if q else 256)
    args.row_tokens = args.row_tokens or (4096 if q else 8192)
    if q and args.models == ["smollm2-135m", "gemma-3-270m"]:
        args.models = ["tiny-gemma3"]
    if min(args.n_windows, args.n_draws, args.retrieval_draws, args.semantic_draws) < 2:
        ap.error("--n-windows and the draw counts must be ≥ 2")
    return args


# --------------------------------------------------------------------------------------------
# heads
# --------------------------------------------------------------------------------------------
def heads_step(model, name: str, args, store: RunStore) -> dict[str, Any]:
    """Positional heads, per-band content share and content variance, retrieval scores."""
    cfg = {
        "model": name,
        "step": "heads",
        "windows": args.taxonomy_windows,
        "n_ctx": args.taxonomy_ctx,
        "prompt_len": args.prompt_len,
        "seed": args.seed,
    }
    done = store.get(cfg)
    if done is not None:
        return done
    t = time.perf_counter()
    found = find_heads(model, args.taxonomy_windows, args.taxonomy_ctx, args.prompt_len, args.seed)
    out = {**found, "seconds": time.perf_counter() - t}
    store.put(cfg, out)
    print(
        f"{name}: heads in {out['seconds']:.0f} s: {len(out['positional'])} positional", flush=True
    )
    return out


# --------------------------------------------------------------------------------------------
# conditions: one batch row each
# --------------------------------------------------------------------------------------------
def doses_of(n_planes: int) -> tuple[list[int], int]:
    """The dose curve (n/16, n/8, n/4, n/2 planes per head) and the main dose (n/4)."""
    doses = sorted({max(1, n_planes // d) for d in (16, 8, 4, 2)})
    return doses, max(1, n_planes // 4)


def condition_rows(spec, heads, direction: str, n_draws: int, seed: int):
    """(labels, rows): the unmodified model, the set at each dose, ``n_draws`` random-plane draws
    in the same heads and ``n_draws`` random head sets in the same layers at the main dose."""
    n_planes = spec[heads[0][0]].n_planes
    doses, main = doses_of(n_planes)

    def top(layer: int, k: int) -> tuple[int, ...]:
        return tuple(sorted(plane_order(spec[layer].inv_freq, direction)[:k]))

    labels: list[str] = ["model"]
    rows: list[dict] = [{}]
    for k in doses:
        labels.append(f"set {k}")
        rows.append({hd: top(hd[0], k) for hd in heads})
    rng = np.random.default_rng(seed)
    for _ in range(n_draws):
        labels.append("random planes")
        rows.append(
            {hd: tuple(sorted(rng.choice(n_planes, main, replace=False).tolist())) for hd in heads}
        )
    population = {L: list(range(spec[L].n_heads)) for L in spec.rotary_layers}
    for cs in matched_random_sets(heads, population, n_draws, seed + 1):
        labels.append("random heads")
        rows.append({hd: top(hd[0], main) for hd in cs})
    return labels, rows


# --------------------------------------------------------------------------------------------
# running the knockouts, one window at a time
# --------------------------------------------------------------------------------------------
def units(model, step: str, args) -> list[Any]:
    """The windows a step measures: random tokens (positional), passkey prompts (retrieval) or
    text windows (semantic)."""
    n = args.n_windows
    if step == "positional":
        vocab = min(len(model.tokenizer), hf_model_of(model).get_input_embeddings().num_embeddings)
        bos = model.tokenizer.bos_token_id
        return list(random_tokens(n, args.probe_ctx, vocab, bos, args.seed + 1))
    if step == "retrieval":
        depths = np.linspace(0.1, 0.9, n).tolist()
        return [
            copy_case(
                model.tokenizer,
                passkey_prompt(
                    model.tokenizer, args.prompt_len, d, make_passkey(args.seed + 2000, t)
                ),
            )
            for t, d in enumerate(depths)
        ]
    _, val = data.english().split()
    return list(data.windows(val, model, args.text_ctx, n_windows=n))


def draws_of(step: str, args) -> int:
    return {"retrieval": args.retrieval_draws, "semantic": args.semantic_draws}.get(
        step, args.n_draws
    )


def knockout_step(model, name: str, set_name: str, hs: dict[str, Any], args, store) -> None:
    """Every window of one head set's knockout not already in ``store``."""
    spec = rope_spec(model)
    heads = [tuple(hd) for hd in hs["heads"]]
    step = hs["step"]
    n_draws = draws_of(step, args)
    labels, rows = condition_rows(spec, heads, hs["direction"], n_draws, args.seed + 17)
    base = {
        "model": name,
        "step": step,
        "set": set_name,
        "heads": [list(hd) for hd in heads],
        "n_draws": n_draws,
        "seed": args.seed,
    }
    once, where = distinct_rows(rows)  # a control may draw the same condition twice
    todo = units(model, step, args)
    for w, unit in enumerate(todo):
        cfg = {**base, "window": w, "n_windows": len(todo), **_unit_cfg(step, args)}
        if store.get(cfg) is not None:
            continue
        t = time.perf_counter()
        if step == "positional":
            distinct = probe_values(model, spec, unit, once, heads, args.row_tokens)
        elif step == "retrieval":
            distinct = copy_values(model, unit, once, args.row_tokens)
        else:
            distinct = loss_values(model, unit, once, args.row_tokens)
        values = [distinct[i] for i in where]
        store.put(cfg, {"labels": labels, "values": values, "seconds": time.perf_counter() - t})
        print(
            f"{name} {set_name}: window {w + 1}/{len(todo)}, {len(rows)} rows in "
            f"{time.perf_counter() - t:.1f} s",
            flush=True,
        )


def _unit_cfg(step: str, args) -> dict[str, int]:
    return {
        "positional": {"n_ctx": args.probe_ctx},
        "retrieval": {"n_ctx": args.prompt_len},
        "semantic": {"n_ctx": args.text_ctx},
    }[step]


def prope_step(model, name: str, args, store) -> None:
    """The mean next-token loss with p-RoPE (the lowest fraction 1 − p of frequencies no longer
    rotating) per layer kind, on held-out text windows."""
    from ropelens.run.evaluate import window_losses

    _, val = data.english().split()
    tokens = data.windows(val, model, args.text_ctx, n_windows=args.n_windows)
    for kind in _common.layer_kinds(name, "all", model):
        for p in P_VALUES:
            cfg = {"model": name, "step": "prope", "kind": kind, "p": p, "n_ctx": args.text_ctx}
            cfg["n_windows"] = args.n_windows
            if store.get(cfg) is not None:
                continue
            t = time.perf_counter()
            with apply_rope_variant(model, PRoPE(p), layer_kind=_common.LAYER_KINDS[kind]):
                losses = window_losses(model, tokens, 4, progress=False)
            store.put(cfg, {"losses": losses.tolist(), "seconds": time.perf_counter() - t})
            print(f"{name} p-RoPE {kind} p={p}: {float(losses.mean()):.3f}", flush=True)


# --------------------------------------------------------------------------------------------
# tables
# --------------------------------------------------------------------------------------------
HARM = {
    "positional probe": -1.0,
    "copy loss": 1.0,
    "copy accuracy": -1.0,
    "content loss": 1.0,
    "function loss": 1.0,
    "content − function": 1.0,
}


def metrics_of(step: str, values: np.ndarray) -> dict[str, np.ndarray]:
    """Per (window, row) values of each metric of a step from the stored per-row numbers."""
    if step == "positional":  # [window, row, head, offset]
        own = values[:, 0].mean(0).argmax(-1)  # each head's offset on the unmodified model
        per_head = np.take_along_axis(values, own[None, None, :, None], -1)[..., 0]
        return {"positional probe": per_head.mean(-1)}
    if step == "retrieval":
        return {"copy loss": values[..., 0], "copy accuracy": values[..., 1]}
    return {
        "content loss": values[..., 0],
        "function loss": values[..., 1],
        "content − function": values[..., 0] - values[..., 1],
    }


def p_entry(observed: float, null: np.ndarray, harm: float) -> dict[str, float]:
    """One-sided permutation p with its floor and Monte Carlo standard error."""
    n = len(null)
    p = permutation_p_value(harm * observed, (harm * null).tolist())
    return {"p": p, "floor": 1 / (1 + n), "mc_se": math.sqrt(p * (1 - p) / n), "n": n}


def _ci(x: np.ndarray, n_boot: int) -> dict[str, float]:
    est = percentile_ci(torch.from_numpy(np.ascontiguousarray(x, dtype=np.float64)), n_boot=n_boot)
    return {"estimate": float(est.mean), "lo": float(est.lo), "hi": float(est.hi)}


def summarize_set(runs: list[dict], step: str, n_boot: int) -> list[dict[str, Any]]:
    """Rows of one head set's table: each dose, both controls at the main dose, p-values."""
    labels = runs[0]["labels"]
    values = np.array([r["values"] for r in runs], dtype=np.float64)
    lab = np.array(labels)
    doses = [int(x.split()[1]) for x in labels if x.startswith("set ")]
    main = doses[-2] if len(doses) > 1 else doses[-1]  # n/4 of n/16, n/8, n/4, n/2
    out = []
    for metric, m in metrics_of(step, values).items():
        effect = m - m[:, :1]
        base = float(m[:, 0].mean())
        planes, heads = effect[:, lab == "random planes"], effect[:, lab == "random heads"]
        for k in doses:
            col = effect[:, labels.index(f"set {k}")]
            row = {"metric": metric, "condition": f"set, {k} planes", "dose": k, "base": base}
            row.update(_ci(col, n_boot))
            if k == main:
                obs = float(col.mean())
                row["p_planes"] = p_entry(obs, planes.mean(0), HARM[metric])
                row["p_heads"] = p_entry(obs, heads.mean(0), HARM[metric])
            out.append(row)
        for name, block in (("random planes", planes), ("random heads", heads)):
            row = {"metric": metric, "condition": f"{name} (mean of {block.shape[1]})"}
            row.update({"dose": main, "base": base, **_ci(block.mean(1), n_boot)})
            out.append(row)
    for row in out:
        row["n_windows"] = len(runs)
    return out


def gather(store: RunStore) -> dict[str, Any]:
    """Every model's finished knockouts as tables, its heads and its p-RoPE losses."""
    by_set: dict[tuple, list] = {}
    heads: dict[str, Any] = {}
    prope: dict[tuple, dict] = {}
    for run in store.runs.values():
        c = run["config"]
        if c["step"] == "heads":
            heads[c["model"]] = run
        elif c["step"] == "prope":
            prope[(c["model"], c["kind"], c["p"])] = run
        else:
            by_set.setdefault((c["model"], c["step"], c["set"], c["n_draws"]), []).append(run)
    most: dict[tuple, int] = {}  # a set run with several draw counts: the most draws shown
    for model, step, set_name, n_draws in by_set:
        key = (model, step, set_name)
        most[key] = max(most.get(key, 0), n_draws)
    tables = []
    for (model, step, set_name, n_draws), runs in sorted(by_set.items()):
        if n_draws < most[(model, step, set_name)]:
            continue
        runs = sorted(runs, key=lambda r: r["config"]["window"])
        seconds = sum(r["seconds"] for r in runs)
        tables.append(
            {
                "model": model,
                "step": step,
                "set": set_name,
                "heads": runs[0]["config"]["heads"],
                "n_draws": n_draws,
                "n_windows": len(runs),
                "n_ctx": runs[0]["config"]["n_ctx"],
                "n_rows": len(runs[0]["labels"]),
                "seconds": seconds,
                "rows": summarize_set(runs, step, 2000) if len(runs) >= 2 else [],
            }
        )
    return {"tables": tables, "heads": heads, "prope": prope}


def band_table(found: dict[str, Any]) -> list[dict[str, Any]]:
    """Per layer kind and band: the mean content share of the band's logit (1 − its position
    share, on text) in the positional heads and in the others, and the mean content variance."""
    share = torch.tensor(found["position_share"], dtype=torch.float64)  # [layer, head, band]
    var = torch.tensor(found["content_var"], dtype=torch.float64)
    pos = {tuple(hd) for hd in found["positional"]}
    out = []
    for kind in sorted(set(found["kinds"].values())):
        for b, band in enumerate(found["band_names"]):
            groups: dict[str, list[float]] = {"positional": [], "other": [], "var": []}
            for i, L in enumerate(found["layers"]):
                if found["kinds"][str(L)] != kind:
                    continue
                for h in range(share.shape[1]):
                    s = float(share[i, h, b])
                    if math.isnan(s):
                        continue
                    groups["positional" if (L, h) in pos else "other"].append(1 - s)
                    groups["var"].append(float(var[i, h, b]))
            out.append(
                {
                    "kind": kind,
                    "band": band,
                    "content_share_positional": _mean(groups["positional"]),
                    "content_share_other": _mean(groups["other"]),
                    "content_var": _mean(groups["var"]),
                    "n_positional": len(groups["positional"]),
                    "n_other": len(groups["other"]),
                }
            )
    return out


def _mean(x: list[float]) -> float:
    return float(np.mean(x)) if x else math.nan


def prope_table(prope: dict[tuple, dict], n_boot: int) -> list[dict[str, Any]]:
    rows = []
    for (model, kind, p), run in sorted(prope.items()):
        ci = _ci(np.array(run["losses"]), n_boot)
        rows.append({"model": model, "kind": kind, "p": p, **ci, "seconds": run["seconds"]})
    return rows


# --------------------------------------------------------------------------------------------
# the page and the markdown
# --------------------------------------------------------------------------------------------
def fmt_p(entry: dict[str, float] | None) -> str:
    if not entry:
        return ""
    return f"{entry['p']:.3g} ± {entry['mc_se']:.2g} (floor {entry['floor']:.2g}, n = {entry['n']})"


def heads_text(heads: list) -> str:
    return ", ".join(f"L{L}.H{h}" for L, h in heads)


def knockout_markdown(tables: list[dict[str, Any]]) -> list[str]:
    lines = [
        "| model | head set | metric | condition | effect [95% CI] | unmodified | "
        "p (random planes) | p (random heads) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for t in tables:
        for r in t["rows"]:
            lines.append(
                f"| {t['model']} | {t['set']} ({len(t['heads'])}) | {r['metric']} | "
                f"{r['condition']} | {r['estimate']:+.4g} [{r['lo']:+.4g}, {r['hi']:+.4g}] | "
                f"{r['base']:.4g} | {fmt_p(r.get('p_planes'))} | {fmt_p(r.get('p_heads'))} |"
            )
    return lines


def _effect(r: dict[str, Any]) -> str:
    return f"{r['estimate']:+.3g} [{r['lo']:+.3g}, {r['hi']:+.3g}]"


def summary_markdown(tables: list[dict[str, Any]]) -> list[str]:
    """One row per model, head set and metric: the main dose against both controls, the p-values
    with their floors, and the dose curve."""
    lines = [
        "| model | head set | metric | unmodified | set, main dose | random planes | "
        "random heads | p (planes) | p (heads) | dose curve |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for t in tables:
        for metric in dict.fromkeys(r["metric"] for r in t["rows"]):
            rows = [r for r in t["rows"] if r["metric"] == metric]
            main = next(r for r in rows if "p_planes" in r)
            planes = next(r for r in rows if r["condition"].startswith("random planes"))
            heads = next(r for r in rows if r["condition"].startswith("random heads"))
            curve = ", ".join(
                f"{r['dose']}: {r['estimate']:+.3g}"
                for r in rows
                if r["condition"].startswith("set")
            )
            lines.append(
                f"| {t['model']} | {t['set']} ({len(t['heads'])}) | {metric} | {main['base']:.3g} "
                f"| {main['dose']} planes: {_effect(main)} | {_effect(planes)} | {_effect(heads)} "
                f"| {fmt_p(main['p_planes'])} | {fmt_p(main['p_heads'])} | {curve} |"
            )
    return lines


def markdown(g: dict[str, Any], bands: dict[str, list], prope: list) -> str:
    out = ["### Both embedded models: knockouts, semantic band, p-RoPE", ""]
    out.append(
        "`python experiments/two_models.py`: the main dose is a quarter of the planes per head; "
        "p: one-sided, (1 + #draws at least as harmful)/(1 + n), ± its Monte Carlo standard "
        "error sqrt(p(1 − p)/n), floor 1/(1 + n); 95% percentile bootstrap CIs over windows."
    )
    out.append("")
    for model, run in g["heads"].items():
        out.append(
            f"- {model}: {len(run['positional'])} positional heads "
            f"({heads_text(run['positional'])}); heads step {run['seconds']:.0f} s."
        )
    for t in g["tables"]:
        out.append(
            f"- {t['model']} {t['set']}: {t['n_windows']} windows of {t['n_ctx']} tokens × "
            f"{t['n_rows']} rows ({t['n_draws']} draws per control) "
            f"in {t['seconds']:.0f} s; heads {heads_text(t['heads'])}."
        )
    out += ["", *summary_markdown([t for t in g["tables"] if t["rows"]]), ""]
    out += [
        "| model | layer kind | band | content share, positional heads | content share, others "
        "| content variance |",
        "|---|---|---|---|---|---|",
    ]
    for model, rows in bands.items():
        for r in rows:
            out.append(
                f"| {model} | {r['kind']} | {r['band']} | {r['content_share_positional']:.3f} "
                f"(n = {r['n_positional']}) | {r['content_share_other']:.3f} (n = {r['n_other']}) "
                f"| {r['content_var']:.3g} |"
            )
    out += ["", "| model | layer kind | p | loss [95% CI] |", "|---|---|---|---|"]
    for r in prope:
        out.append(
            f"| {r['model']} | {r['kind']} | {r['p']} | {r['estimate']:.3f} "
            f"[{r['lo']:.3f}, {r['hi']:.3f}] |"
        )
    return "\n".join(out) + "\n"


PRIMARY = {
    "positional": "positional probe",
    "retrieval": "copy accuracy",
    "semantic": "content − function",
}


def dose_figure(tables: list[dict[str, Any]]):
    """Effect against planes zeroed per head, one panel per knockout, one curve per model and head
    set; the controls at the main dose as open markers."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    steps = [s for s in PRIMARY if any(t["step"] == s for t in tables)]
    fig = make_subplots(
        rows=1, cols=max(1, len(steps)), subplot_titles=[f"{s}: {PRIMARY[s]}" for s in steps]
    )
    for col, step in enumerate(steps, 1):
        for t in (t for t in tables if t["step"] == step and t["rows"]):
            rows = [r for r in t["rows"] if r["metric"] == PRIMARY[step]]
            own = [r for r in rows if r["condition"].startswith("set")]
            label = f"{t['model']} {t['set']}"
            fig.add_trace(
                go.Scatter(
                    x=[r["dose"] for r in own],
                    y=[r["estimate"] for r in own],
                    error_y=_ci_bars(own),
                    mode="lines+markers",
                    name=label,
                ),
                row=1,
                col=col,
            )
            for r in rows:
                if not r["condition"].startswith("set"):
                    fig.add_trace(
                        go.Scatter(
                            x=[r["dose"]],
                            y=[r["estimate"]],
                            mode="markers",
                            marker={"symbol": "circle-open", "size": 10},
                            name=f"{label}: {r['condition']}",
                        ),
                        row=1,
                        col=col,
                    )
        ticks = sorted({r["dose"] for t in tables if t["step"] == step for r in t["rows"]})
        fig.update_xaxes(
            title_text="planes zeroed per head", type="log", tickvals=ticks, row=1, col=col
        )
        fig.update_yaxes(title_text="effect (knocked out − unmodified)", row=1, col=col)
    fig.update_layout(height=480, width=1400, template="plotly_white")
    return fig


def band_figure(bands: dict[str, list]):
    """Content share of each band's logit, positional heads and others, per model and layer
    kind."""
    import plotly.graph_objects as go

    fig = go.Figure()
    for model, rows in bands.items():
        for kind in sorted({r["kind"] for r in rows}):
            sub = [r for r in rows if r["kind"] == kind]
            for who in ("positional", "other"):
                fig.add_trace(
                    go.Bar(
                        x=[r["band"] for r in sub],
                        y=[r[f"content_share_{who}"] for r in sub],
                        name=f"{model} {kind}, {who} heads",
                    )
                )
    fig.update_layout(
        barmode="group",
        height=420,
        width=1000,
        template="plotly_white",
        yaxis_title="content share of the band's logit (text)",
        xaxis_title="band (highest frequency first)",
    )
    return fig


def _ci_bars(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Plotly error bars from each row's CI ends around its estimate."""
    return {
        "type": "data",
        "symmetric": False,
        "array": [r["hi"] - r["estimate"] for r in rows],
        "arrayminus": [r["estimate"] - r["lo"] for r in rows],
    }


def prope_figure(prope: list[dict[str, Any]]):
    import plotly.graph_objects as go

    fig = go.Figure()
    for key in sorted({(r["model"], r["kind"]) for r in prope}):
        sub = [r for r in prope if (r["model"], r["kind"]) == key]
        fig.add_trace(
            go.Scatter(
                x=[r["p"] for r in sub],
                y=[r["estimate"] for r in sub],
                error_y=_ci_bars(sub),
                mode="lines+markers",
                name=f"{key[0]} ({key[1]} layers)",
            )
        )
    fig.update_layout(
        height=420,
        width=900,
        template="plotly_white",
        xaxis_title="p (fraction of frequencies kept rotating)",
        yaxis_title="next-token loss (nats)",
    )
    return fig


def _tables_html(md_text: str) -> str:
    """The markdown's tables as HTML tables, other lines as paragraphs."""
    out, rows = [], []
    for line in md_text.splitlines() + [""]:
        if line.startswith("|"):
            if not set(line) <= set("|-"):
                rows.append([html.escape(c.strip()) for c in line.strip("|").split("|")])
            continue
        if rows:
            head = "".join(f"<th>{c}</th>" for c in rows[0])
            body = "".join("<tr>" + "".join(f"<td>{c}</td>" for c in r) + "</tr>" for r in rows[1:])
            out.append(f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>")
            rows = []
        if line.startswith("#"):
            out.append(f"<h2>{html.escape(line.lstrip('# '))}</h2>")
        elif line.strip():
            out.append(f"<p>{html.escape(line)}</p>")
    return "\n".join(out)


def _page(md_text: str, figures: list, models: str) -> str:
    """One offline HTML page: the figures (plotly inlined once) and the tables."""
    parts = [
        fig.to_html(full_html=False, include_plotlyjs=(i == 0)) for i, fig in enumerate(figures)
    ]
    style = (
        "body{font-family:sans-serif;margin:2em;max-width:1500px}"
        "table{border-collapse:collapse;margin:1em 0;font-size:13px}"
        "td,th{border:1px solid #ccc;padding:3px 6px}th{background:#f3f3f3}"
    )
    return (
        "<!doctype html><html><head><meta charset='utf-8'><title>ropelens: two models</title>"
        f"<style>{style}</style></head><body><h1>RoPE knockouts on {html.escape(models)}</h1>"
        + "\n".join(parts)
        + _tables_html(md_text)
        + "</body></html>"
    )


# --------------------------------------------------------------------------------------------
# main
# --------------------------------------------------------------------------------------------
def run_model(name: str, args, store: RunStore) -> None:
    model, name = _common.load(name)
    spec = rope_spec(model)
    found = heads_step(model, name, args, store)
    sets = head_sets(spec, found, args.semantic_heads, args.quick)
    for step in ("positional", "retrieval", "semantic"):
        if step not in args.steps:
            continue
        for set_name, hs in sets.items():
            if hs["step"] == step and (args.sets is None or set_name in args.sets):
                knockout_step(model, name, set_name, hs, args, store)
    if "prope" in args.steps:
        prope_step(model, name, args, store)


def main(argv: list[str] | None = None) -> Path:
    """Run what is not yet in ``runs.json`` and write the page; returns the result JSON path."""
    args = parse(argv)
    out = _common.out_dir(args.out)
    store = RunStore(out / "runs.json", meta={"script": "two_models", "args": vars(args)})
    started = time.perf_counter()
    for name in [] if args.report else args.models:
        run_model(name, args, store)
    g = gather(store)
    bands = {model: band_table(run) for model, run in g["heads"].items()}
    prope = prope_table(g["prope"], args.n_boot)
    md_text = markdown(g, bands, prope)
    figures = [dose_figure(g["tables"]), band_figure(bands)]
    if prope:
        figures.append(prope_figure(prope))
    atomic_write_text(out / "two_models.md", md_text)
    models = ", ".join(g["heads"])
    full = md_text + "\n" + "\n".join(knockout_markdown(g["tables"])) + "\n"
    atomic_write_text(out / "two_models.html", _page(full, figures, models))
    result = {"tables": g["tables"], "bands": bands, "prope": prope, "args": vars(args)}
    result["seconds_this_run"] = time.perf_counter() - started
    dump_json(out / "result.json", result)
    print(md_text)
    return out / "result.json"


if __name__ == "__main__":
    main()
