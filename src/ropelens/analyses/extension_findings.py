"""Findings of a context-extension study: sentences written from its measured numbers, never canned."""

from __future__ import annotations

import math
from typing import Any

from ropelens.results.findings import Finding

__all__ = ["DEFAULT_METHODS", "METHODS", "held_up_to", "ranking", "study_findings"]

# the methods an extension study compares: key → label (defined here, below the study, so that the study,
# its findings and its page read one list without importing each other in a circle)
METHODS: dict[str, str] = {"none": "unmodified", "pi": "PI", "ntk": "NTK", "dynamic": "dynamic NTK",
                           "yarn": "YaRN", "llama3": "Llama 3", "longrope": "LongRoPE", "prope": "p-RoPE",
                           "resonance": "Resonance-YaRN", "cope": "CoPE", "fope": "FoPE zeroing"}
# the methods a study runs unless others are asked for (Resonance-YaRN, CoPE and FoPE's zeroing when asked)
DEFAULT_METHODS: tuple[str, ...] = ("none", "pi", "ntk", "dynamic", "yarn", "llama3", "longrope", "prope")
ExtensionStudy = Any  # ropelens.analyses.extension.ExtensionStudy, not imported: it imports this module


def _n(x: float) -> str:
    return f"{int(x):,}" if math.isfinite(x) else "∞"


def held_up_to(study: ExtensionStudy, method: str) -> tuple[int, float, int]:
    """The longest length up to which ``method``'s loss stays within ``study.tolerance`` nats of its loss at
    the shortest length (every length between included: the shortest itself when the next one breaks it),
    the largest rise over those lengths, and the shortest length."""
    df = study.loss_frame()
    rows = df[df["method"] == method].sort_values("length")
    first = float(rows["loss"].iloc[0])
    held, rise = int(rows["length"].iloc[0]), 0.0
    for L, loss in zip(rows["length"], rows["loss"], strict=True):
        if loss - first > study.tolerance:
            break
        held, rise = int(L), max(rise, float(loss - first))
    return held, rise, int(rows["length"].iloc[0])


def ranking(study: ExtensionStudy) -> list[dict[str, Any]]:
    """Methods best first: passkey recall at the longest passkey length (more is better), then loss at the
    target (less is better); each with those numbers."""
    df = study.loss_frame()
    at = df[df["length"] == study.target].set_index("method")
    top = max(study.passkey_lengths) if study.passkey_lengths else None
    rows = []
    for m in study.methods:
        if m not in at.index:
            continue
        k, n = study.recall(m, top) if top is not None else (0, 0)
        rows.append({"method": m, "loss": float(at.loc[m, "loss"]), "perplexity": float(at.loc[m, "perplexity"]),
                     "recall": k / n if n else math.nan, "correct": k, "trials": n})
    return sorted(rows, key=lambda r: (-(r["recall"] if r["trials"] else 0.0), r["loss"]))


def study_findings(study: ExtensionStudy) -> list[Finding]:
    """Recommendation, loss held per method, passkey recall, planes and the base's predictions."""
    out: list[Finding] = []
    lab = lambda m: METHODS.get(m, m)  # noqa: E731
    T, L0 = study.target, study.native
    rank = ranking(study)
    top = max(study.passkey_lengths) if study.passkey_lengths else None
    if rank:
        best = rank[0]
        recall = f" and recalls {best['correct']} of {best['trials']} passkeys at {top:,}" if best["trials"] else ""
        others = "; ".join(f"{lab(r['method'])} {r['loss']:.3f}" + (f" ({r['correct']}/{r['trials']})" if r["trials"] else "")
                           for r in rank[1:4])
        out.append(Finding("recommend", "summary",
                           f"For {L0:,} → {T:,} tokens use {lab(best['method'])}: at {T:,} tokens its loss is "
                           f"{best['loss']:.3f} nats (perplexity {best['perplexity']:.3g}){recall}. Next: {others}.",
                           {"ranking": rank, "target": T, "passkey_length": top}))
    df = study.loss_frame()
    for m in study.methods:
        held, rise, first = held_up_to(study, m)
        at = df[(df["method"] == m) & (df["length"] == T)]
        loss_t = float(at["loss"].iloc[0]) if len(at) else math.nan
        base = float(df[(df["method"] == m) & (df["length"] == first)]["loss"].iloc[0])
        if held == first and len(study.lengths) > 1:
            text = (f"{lab(m)} leaves the loss band at once: {base:.3f} nats at {first:,}, more than "
                    f"{study.tolerance:g} nats higher at the next length ({loss_t:.3f} at {T:,}).")
        elif held >= T:
            text = (f"{lab(m)} keeps the loss within {study.tolerance:g} nats of its {first:,}-token value "
                    f"({base:.3f}) up to {T:,} (largest rise {rise:+.3f}; {loss_t:.3f} at {T:,}).")
        else:
            text = (f"{lab(m)} keeps the loss within {study.tolerance:g} nats of its {first:,}-token value "
                    f"({base:.3f}) up to {held:,} only; at {T:,} it is {loss_t:.3f} ({loss_t - base:+.3f}).")
        out.append(Finding(f"loss_{m}", "loss", text, {"method": m, "held_up_to": held, "largest_rise": rise,
                                                         "loss_short": base, "loss_target": loss_t, "short": first}))
    if top is not None:
        parts = []
        for m in study.methods:
            k, n = study.recall(m, top)
            parts.append(f"{lab(m)} {k}/{n}")
        out.append(Finding("passkey", "passkey", f"Passkey recall at {top:,} tokens: " + ", ".join(parts) + ".",
                           {m: study.recall(m, top) for m in study.methods} | {"length": top}))
    views = study.planes
    kind = views[0]["kind"] if views else None
    for p in (v for v in views if v["kind"] == kind):
        roles = p["roles"]
        counts = {r: roles.count(r) for r in dict.fromkeys(roles)}
        limit = study.in_distribution_limit(p["method"], kind)
        shown = ", ".join(f"{n} {r}" for r, n in counts.items())
        out.append(Finding(f"planes_{p['method']}", "planes",
                           f"{lab(p['method'])} at {T:,} ({kind} layers, {len(roles)} planes): {shown}; every angle "
                           f"stays within training up to {_n(limit)} tokens.",
                           {"counts": counts, "in_distribution_limit": limit, "kind": kind}))
    out += _predictor_findings(study)
    return out


def _predictor_findings(study: ExtensionStudy) -> list[Finding]:
    rows = study.predictors_frame()
    if rows.empty:
        return []
    out = []
    kind = rows["kind"].iloc[0]
    r = rows[rows["kind"] == kind]
    at_t = r[r["length"] == study.target].iloc[0]
    t_extra = float(at_t["t_extra"])
    df = study.loss_frame()
    none = df[df["method"] == "none"].set_index("length")["loss"] if "none" in study.methods else None
    measured = ""
    if none is not None and len(none) > 1:
        inside = [n for n in none.index if min(t_extra, study.native) >= n]
        beyond = [n for n in none.index if t_extra < n]
        if inside and beyond:
            a, b = max(inside), min(beyond)
            measured = (f"; the unmodified loss goes from {none[a]:.3f} at {a:,} to {none[b]:.3f} at {b:,} "
                        f"({none[b] - none[a]:+.3f})")
    out.append(Finding("critical_dimension", "predictors",
                       f"Critical dimension ({kind} layers, base {at_t['base']:.4g}): {int(at_t['critical_dimension_train'])} "
                       f"of {int(at_t['rotary_dim'])} rotary dims turn within {study.native:,} tokens, so Liu et al.'s "
                       f"extrapolation limit is {_n(t_extra)} tokens{measured}.",
                       {"kind": kind, "critical_dimension": int(at_t["critical_dimension_train"]), "t_extra": t_extra}))
    holds = bool(at_t["men_bound_holds"])
    fails = [int(L) for L, h in zip(r["length"], r["men_bound_holds"], strict=True) if not h]
    out.append(Finding("base_bound", "predictors",
                       f"Men et al.'s lower bound on the base for {study.target:,} tokens is {at_t['men_lower_bound']:.4g}; "
                       f"the model's base {at_t['base']:.4g} {'satisfies' if holds else 'violates'} it"
                       + (f" (violated from {min(fails):,} tokens)" if fails else "")
                       + f"; Liu's critical base for tuning at {study.target:,} is {at_t['critical_base']:.4g}.",
                       {"kind": kind, "men_lower_bound": float(at_t["men_lower_bound"]), "holds": holds,
                        "first_violation": min(fails) if fails else None,
                        "critical_base": float(at_t["critical_base"])}))
    return out
