"""Do positional heads use the highest RoPE frequencies and content the lowest? (H1, H2, causal
check)

H1: heads classified positional draw a larger share of their attended-key margin from the highest
band than other heads (difference of means, Cohen's d, one-sided label-permutation p, seeded).
H2: across heads, the lowest band's logit is more content-dependent than the highest band's
(paired: content share = 1 − position_share, sign-flip permutation p, seeded).
Causal: zero the highest or the lowest band of the top positional heads only (then of the strongest
content heads only) and measure their offset mass at δ*, the agreement of their argmax key with
the clean model's, and the loss change. Table: per band logit vs Cauchy–Schwarz bound at the
attended key for the top positional heads. Resumable (results/…/runs.json).

    python experiments/positional_vs_semantic.py --quick
"""

from __future__ import annotations

import argparse
import contextlib
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _common
import torch

import ropelens
from ropelens.analyses.head_taxonomy import HeadTaxonomy, head_taxonomy
from ropelens.results.serialize import dump_json
from ropelens.run import data
from ropelens.run.capture import batches, stream
from ropelens.run.evaluate import RunStore, bootstrap_ci, window_losses
from ropelens.run.intervene import ablate_planes
from ropelens.spec.bands import REST, Bands

BANDS = Bands.quantiles(4)


def parse(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="smollm2-135m", help="embedded model name or tiny-llama")
    ap.add_argument(
        "--quick", action="store_true", help="8 windows of 128 tokens; 4 for the causal check"
    )
    ap.add_argument("--n-ctx", type=int, default=None, help="window length (256; quick 128)")
    ap.add_argument(
        "--n-windows", type=int, default=None, help="windows to classify on (16; quick 8)"
    )
    ap.add_argument(
        "--top-k", type=int, default=3, help="heads per group in the causal check and table"
    )
    ap.add_argument("--n-perm", type=int, default=10_000, help="permutations per test")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default="results/positional_vs_semantic")
    args = ap.parse_args(argv)
    args.n_ctx = args.n_ctx or (128 if args.quick else 256)
    args.n_windows = args.n_windows or (8 if args.quick else 16)
    return args


# ------------------------------------------------------------------------------------ statistics
def perm_diff(x: torch.Tensor, labels: torch.Tensor, n_perm: int, seed: int) -> dict[str, float]:
    """mean(x[labels]) − mean(x[~labels]), Cohen's d, one-sided label-permutation p."""
    x = x.double()

    def diff(lab):
        return x[lab].mean() - x[~lab].mean()

    obs = float(diff(labels))
    g = torch.Generator().manual_seed(seed)
    null = torch.stack([diff(labels[torch.randperm(len(x), generator=g)]) for _ in range(n_perm)])
    # one head in a group has no spread: d is undefined, the permutation p still stands
    small = min(int(labels.sum()), int((~labels).sum())) < 2
    pooled = (
        torch.tensor(float("nan"))
        if small
        else torch.sqrt((x[labels].var() + x[~labels].var()) / 2)
    )
    return {
        "diff": obs,
        "cohen_d": float(obs / pooled),
        "p": float(((null >= obs).sum() + 1) / (n_perm + 1)),
        "mean_in": float(x[labels].mean()),
        "mean_out": float(x[~labels].mean()),
        "n_in": int(labels.sum()),
        "n_out": int((~labels).sum()),
    }


def sign_flip(d: torch.Tensor, n_perm: int, seed: int) -> dict[str, float]:
    """Paired mean difference, d_z effect size, one-sided sign-flip permutation p."""
    d = d.double()
    g = torch.Generator().manual_seed(seed)
    signs = torch.randint(0, 2, (n_perm, len(d)), generator=g).double() * 2 - 1
    null = (signs * d).mean(1)
    obs = float(d.mean())
    return {
        "mean_diff": obs,
        "d_z": float(obs / d.std()),
        "p": float(((null >= obs).sum() + 1) / (n_perm + 1)),
        "frac_positive": float((d > 0).double().mean()),
        "n": len(d),
    }


def hypotheses(tx: HeadTaxonomy, args: argparse.Namespace) -> dict[str, Any]:
    names = [n for n in tx.band_names if n != REST]
    hi, lo = tx.band_names.index(names[0]), tx.band_names.index(names[-1])
    pos = tx.positional().flatten()
    out: dict[str, Any] = {"bands": {"highest": names[0], "lowest": names[-1]}}
    if 0 < int(pos.sum()) < pos.numel():
        out["H1"] = perm_diff(
            tx.scores["margin_share"][..., hi].flatten(), pos, args.n_perm, args.seed
        )
    else:
        out["H1"] = {"untestable": f"{int(pos.sum())} positional heads of {pos.numel()}"}
    ps = tx.scores["position_share_text"]
    out["H2"] = sign_flip(
        (ps[..., hi] - ps[..., lo]).flatten(), args.n_perm, args.seed
    )  # content_lo − content_hi
    cv = tx.scores["content_var_text"]
    out["H2_abs"] = sign_flip((cv[..., lo] - cv[..., hi]).flatten(), args.n_perm, args.seed + 1)
    return out


# ------------------------------------------------------------------------------------ causal check
def pick_heads(tx: HeadTaxonomy, k: int) -> dict[str, list[tuple[int, int, int]]]:
    """Top-k positional heads by robust mass; top-k content heads by lowest-band margin share."""
    robust, best, kinds = tx.robust_mass(), tx.best_offset(), tx.kinds()
    lo = max(i for i, n in enumerate(tx.band_names) if n != REST)
    idx = [(li, h) for li in range(len(tx.layers)) for h in range(robust.shape[1])]
    posi = sorted((i for i in idx if tx.positional()[i]), key=lambda i: -float(robust[i]))[:k]
    cont = sorted(
        (i for i in idx if kinds[i[0]][i[1]] == "content"),
        key=lambda i: -float(tx.scores["margin_share"][i[0], i[1], lo]),
    )[:k]

    def as_t(ii):
        return [(tx.layers[li], h, int(best[li, h])) for li, h in ii]

    return {"positional": as_t(posi), "content": as_t(cont)}


class _Patterns:
    """Keeps the attention pattern of the chosen heads."""

    needs = frozenset({"pattern"})

    def __init__(self, heads: list[tuple[int, int, int]]) -> None:
        self.heads, self.kept = heads, {}

    def update(self, acts) -> None:
        for L, h, _ in self.heads:
            if acts.layer == L:
                p = acts["pattern"][:, h].float().cpu()
                self.kept[(L, h)] = torch.cat([self.kept[(L, h)], p]) if (L, h) in self.kept else p


def head_patterns(model, tokens, heads) -> dict[tuple[int, int], torch.Tensor]:
    red = _Patterns(heads)
    stream(
        model, batches(tokens, 2), [red], layers=sorted({L for L, _, _ in heads}), progress=False
    )
    return red.kept


def _ablate(model, spec, heads, band: int) -> contextlib.ExitStack:
    stack = contextlib.ExitStack()
    for L in sorted({L for L, _, _ in heads}):
        planes = BANDS.resolve(spec[L]).planes[band]
        stack.enter_context(
            ablate_planes(model, planes, layers=[L], heads=[h for LL, h, _ in heads if LL == L])
        )
    return stack


def _measure(pats, clean, heads) -> list[dict[str, float]]:
    out = []
    for L, h, d in heads:
        p, c = pats[(L, h)], clean[(L, h)]
        mass = p.diagonal(offset=-d, dim1=1, dim2=2)[:, 1:].mean()  # keys ≥ 1, as in the taxonomy
        agree = (p.argmax(-1) == c.argmax(-1))[:, 1:].double().mean()
        out.append(
            {
                "layer": L,
                "head": h,
                "offset": d,
                "offset_mass": float(mass),
                "argmax_agree": float(agree),
            }
        )
    return out


def causal(model, tx, args, store: RunStore) -> list[dict[str, Any]]:
    spec = ropelens.rope_spec(model)
    _, val = data.english().split()
    toks = data.windows(val, model, args.n_ctx, n_windows=4 if args.quick else 8)
    groups = pick_heads(tx, args.top_k)
    clean_loss = window_losses(model, toks, 2, progress=False)
    rows = []
    for group, heads in groups.items():
        if not heads:
            continue
        clean = head_patterns(model, toks, heads)
        for band in (0, 3):
            cfg = {
                "model": tx.provenance.model,
                "group": group,
                "heads": heads,
                "band": band,
                "n_ctx": args.n_ctx,
            }
            if store.get(cfg) is None:
                with _ablate(model, spec, heads, band):
                    pats = head_patterns(model, toks, heads)
                    loss = window_losses(model, toks, 2, progress=False)
                ci = bootstrap_ci((loss - clean_loss).tolist()).loss.to_dict()
                store.put(
                    cfg,
                    {
                        "clean": _measure(clean, clean, heads),
                        "ablated": _measure(pats, clean, heads),
                        "dloss": ci,
                    },
                )
            rows.append(store.get(cfg))
    return rows


def cs_table(model, heads: list[tuple[int, int, int]], toks: torch.Tensor) -> list[dict[str, Any]]:
    """Per band, mean logit term vs Cauchy–Schwarz bound Σ‖q_i‖‖k_i‖ at the head's own offset δ*
    (the key at q − δ*, as Barbero et al.'s 383.00 vs 483.97 for a diagonal head), keys past BOS."""
    if not heads:
        return []
    from ropelens.analyses.attention_decomposition import attention_decomposition

    dec = attention_decomposition(model, toks, bands=BANDS, layers=sorted({L for L, _, _ in heads}))
    out = []
    for L, h, d in heads:
        x = dec.band_logits(L, masked=False)[:, h]  # [b,B,q,k]
        bound_p = dec.cauchy_schwarz(L)[:, h]  # [b,P,q,k]
        rb = dec.resolved(L)
        n = x.shape[-1]
        q = torch.arange(d + 1, n)  # queries whose δ*-key is not BOS
        t = x[:, :, q, q - d].mean((0, 2))  # [B]
        bp = bound_p[:, :, q, q - d].mean((0, 2))  # [P]
        b = torch.stack([bp[list(p)].sum() if p else bp.new_zeros(()) for p in rb.planes])
        out.append(
            {
                "layer": L,
                "head": h,
                "offset": d,
                "logit": float(t.sum()),
                "bound": float(b.sum()),
                "bands": {nm: [float(t[i]), float(b[i])] for i, nm in enumerate(rb.names)},
            }
        )
    return out


# ------------------------------------------------------------------------------------ main
def taxonomy(model, name, args, out: Path) -> HeadTaxonomy:
    path = out / f"taxonomy-{name}-{args.n_ctx}x{args.n_windows}-s{args.seed}.json"
    if path.exists():
        return HeadTaxonomy.load(path)
    tx = head_taxonomy(
        model, n_ctx=args.n_ctx, n_windows=args.n_windows, seed=args.seed, bands=BANDS
    )
    tx.save(path)
    return tx


def report(tx, hyp, rows, table) -> None:
    df = tx.to_frame()
    print(
        f"τ = {tx.tau:.3f} ({tx.provenance.config['tau_method']}); "
        f"{int(tx.positional().sum())} positional heads of {len(df)}"
    )
    print(df["kind"].value_counts().to_string())
    for r in df[df.positional].sort_values("robust_mass", ascending=False).itertuples():
        print(
            f"  L{r.layer:>2d} H{r.head}  {r.kind:<15s} mass text {r.mass_text:.3f}  random "
            f"{r.mass_random:.3f}"
        )
    h1, h2, h2a = hyp["H1"], hyp["H2"], hyp["H2_abs"]
    if "untestable" in h1:
        print(f"H1 untestable: {h1['untestable']}")
    else:
        verdict = "holds" if h1["p"] < 0.05 and h1["diff"] > 0 else "fails"
        print(
            f"H1 {verdict} on this model: highest-band margin share positional "
            f"{h1['mean_in']:.3f} (n={h1['n_in']}) vs other {h1['mean_out']:.3f} "
            f"(n={h1['n_out']}); diff {h1['diff']:+.3f}, d={h1['cohen_d']:.2f}, permutation "
            f"p={h1['p']:.4f}"
        )
    verdict = "holds" if h2["p"] < 0.05 and h2["mean_diff"] > 0 else "fails"
    print(
        f"H2 {verdict} on this model: content share lowest − highest band {h2['mean_diff']:+.3f} "
        f"(d_z={h2['d_z']:.2f}, {h2['frac_positive']:.0%} of {h2['n']} heads > 0, sign-flip "
        f"p={h2['p']:.4f}); absolute content variance lowest − highest {h2a['mean_diff']:+.3f} "
        f"(p={h2a['p']:.4f})"
    )
    for r in rows:
        c = r["config"]
        for a, b in zip(r["clean"], r["ablated"], strict=True):
            print(
                f"  ablate band {c['band']} of {c['group']:<10s} L{a['layer']:>2d} H{a['head']} "
                f"δ*={a['offset']}: offset mass {a['offset_mass']:.3f} → {b['offset_mass']:.3f}, "
                f"argmax kept {b['argmax_agree']:.2f}"
            )
        print(
            f"    Δloss {r['dloss']['mean']:+.4f} [{r['dloss']['lo']:+.4f}, "
            f"{r['dloss']['hi']:+.4f}]"
        )
    for t in table:
        bands = "  ".join(f"{n}: {v[0]:.2f}/{v[1]:.2f}" for n, v in t["bands"].items())
        print(
            f"  L{t['layer']} H{t['head']} δ*={t['offset']}: logit {t['logit']:.2f} vs Σ bound "
            f"{t['bound']:.2f} | {bands}"
        )


def main(argv: list[str] | None = None, model: Any = None) -> Path:
    """Classify heads, test H1/H2, run the causal check; returns the result JSON path."""
    args = parse(argv)
    out = _common.out_dir(args.out)
    loaded, name = _common.load(model if model is not None else args.model)
    tx = taxonomy(loaded, name, args, out)
    hyp = hypotheses(tx, args)
    store = RunStore(out / "runs.json", meta={"script": "positional_vs_semantic"})
    rows = causal(loaded, tx, args, store)
    _, val = data.english().split()
    cs_toks = data.windows(val, loaded, args.n_ctx, n_windows=2 if args.quick else 4)
    table = cs_table(loaded, pick_heads(tx, args.top_k)["positional"], cs_toks)
    result = out / f"result-{name}.json"
    dump_json(
        result,
        {
            "tau": tx.tau,
            "hypotheses": hyp,
            "causal": rows,
            "cs_table": table,
            "heads": tx.to_frame().to_dict("records"),
            "provenance": tx.provenance.to_dict(),
            "args": vars(args),
        },
    )
    report(tx, hyp, rows, table)
    return result


if __name__ == "__main__":
    main()
