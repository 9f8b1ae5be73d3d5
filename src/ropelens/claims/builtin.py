"""The literature's RoPE claims ropelens tests, each a declared protocol (registered on import, in
this order)."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch

from ropelens.analyses.head_taxonomy import random_tokens
from ropelens.analyses.passkey_retrieval import make_passkey, passkey_prompt
from ropelens.analyses.retrieval_heads import copy_case
from ropelens.claims.decide import control_outcome
from ropelens.claims.knockouts import PLANES, every_head, knockout_claim
from ropelens.claims.protocol import Claim, Measurement, register_claim
from ropelens.claims.result import ControlOutcome
from ropelens.claims.rows import copy_values, loss_values, probe_values
from ropelens.run.evaluate import percentile_ci
from ropelens.run.stats import clustered_permutation_test, paired_bootstrap_ci
from ropelens.spec.reading import hf_model_of

__all__: list[str] = []

_KNOCKOUT_CONTROLS = (
    "random planes in the same heads",
    "random heads in the same layers",
    "random heads from any layer",
    "the other end of the spectrum in the same heads (paired CI, no p-value)",
)
_KNOCKOUT_RULE = (
    "the mean paired effect (knocked out − unmodified) over windows, 95% bootstrap CI; one-sided "
    "permutation p per control, BH-adjusted across the claims run; holds when the CI excludes 0 "
    "in the claimed direction and every control that can resolve p ≤ alpha is beaten"
)


def _heads(found: dict[str, Any], key: str) -> list[tuple[int, int]]:
    return sorted(tuple(int(x) for x in hd) for hd in found[key])


def _retrieval_heads(found: dict[str, Any]) -> list[tuple[int, int]]:
    return sorted(
        tuple(int(x) for x in k.split(".")) for k, v in found["retrieval_score"].items() if v >= 0.1
    )


def _found_on(c: Any) -> str:
    b = c.budget
    return f"head_taxonomy on {b.taxonomy_windows} × {b.taxonomy_ctx} tokens of English text"


def _prompts(c: Any) -> list[Any]:
    depths = np.linspace(0.1, 0.9, c.budget.n_windows).tolist()
    tok = c.model.tokenizer
    return [
        copy_case(tok, passkey_prompt(tok, c.prompt_len, d, make_passkey(c.seed + 2000, t)))
        for t, d in enumerate(depths)
    ]


def _share_of_quarters(x: torch.Tensor) -> torch.Tensor:
    """``[..., plane]`` → ``[..., 4]``: each quarter's share of the sum over planes (highest
    frequency first)."""
    P = x.shape[-1]
    edges = [round(i * P / 4) for i in range(5)]
    parts = torch.stack([x[..., a:b].sum(-1) for a, b in zip(edges, edges[1:])], -1)
    return parts / parts.sum(-1, keepdim=True)


# ------------------------------------------------------------------------------------------------
def _positional(c: Any) -> Measurement:
    heads = _heads(c.found, "positional")
    if not heads:
        return Measurement(not_applicable=f"no positional heads found ({_found_on(c)})")
    vocab = min(len(c.model.tokenizer), hf_model_of(c.model).get_input_embeddings().num_embeddings)
    bos = c.model.tokenizer.bos_token_id
    units = list(random_tokens(c.budget.n_windows, c.budget.probe_ctx, vocab, bos, c.seed + 1))

    def values(window: torch.Tensor, rows: list[dict]) -> list[float]:
        mass = torch.tensor(probe_values(c.model, c.spec, window, rows, heads, c.budget.row_tokens))
        own = mass[0].argmax(-1)  # each head's offset (0 or 1) on the unmodified model
        return (
            mass.gather(-1, own[None, :, None].expand(len(rows), -1, 1))[..., 0].mean(-1).tolist()
        )

    return knockout_claim(
        c,
        heads,
        "high",
        units,
        values,
        "less",
        lambda a, b: f"attention at the heads' own offset {a:.3f} → {b:.3f} ({len(heads)} heads)",
    )


register_claim(
    Claim(
        "positional-highest-band",
        "Positional heads take their position from the highest-frequency band.",
        "Barbero et al. 2025, Round and Round We Go! What makes Rotary Positional Encodings "
        "useful? (ICLR 2025)",
        "Gemma 7B: the positional (diagonal, previous-token) heads use the highest frequencies "
        "(read off the attention patterns, no knockout)",
        "head_taxonomy's positional heads; the highest quarter of each head's planes zeroed; "
        "metric: the heads' attention at their own offset (0 or 1) on seeded random-token windows",
        "positional probe",
        _KNOCKOUT_CONTROLS,
        _KNOCKOUT_RULE,
        "less",
        0.0,
        _positional,
    )
)


# ------------------------------------------------------------------------------------------------
def _plane_energy(usage: Any, which: str) -> torch.Tensor:
    """``[layer, head, plane]`` mean ‖q^(i)‖² (or ‖k^(i)‖²) over tokens, before the rotation: the
    running sum of squared plane norms over the token count (0 past a layer's own entries)."""
    m = usage.token[(which, "all")]
    energy = m.total_sq / m.count.clamp_min(1)
    return torch.where(usage.present(which), energy, torch.zeros_like(energy))


def _energy(c: Any) -> Measurement:
    from ropelens.analyses.frequency_usage import frequency_usage

    per_window, shares = [], []
    for w in c.text_windows:
        u = frequency_usage(c.model, w[None], n_ctx=w.numel(), progress=False, verify=False)
        q = [_plane_energy(u, x) for x in ("q", "k")]
        share = torch.stack([_share_of_quarters(e).nanmean((0, 1)) for e in q])
        share = share.mean(0)  # [quarter], queries and keys averaged
        shares.append(share)
        per_window.append(float(share[-1] - share[:-1].max()))
    est = percentile_ci(torch.tensor(per_window, dtype=torch.float64), n_boot=c.budget.n_boot)
    mean = torch.stack(shares).mean(0)
    return Measurement(
        effect=float(est.mean),
        lo=float(est.lo),
        hi=float(est.hi),
        model_number="energy share by quarter, highest frequency first: "
        + ", ".join(f"{float(s):.2f}" for s in mean),
        n_windows=len(per_window),
        detail={"controlled": False, "quarter_share": mean.tolist()},
    )


register_claim(
    Claim(
        "qk-energy-lowest-band",
        "Queries and keys hold most of their energy in the lowest-frequency band.",
        "Barbero et al. 2025 (ICLR 2025)",
        "Gemma 7B: the largest q and k norms sit in the lowest frequencies (their figure)",
        "frequency_usage on each held-out text window: per plane, mean squared norm of q and of k "
        "before the rotation, every layer and head; the share of each quarter",
        "lowest band's energy share minus the largest other quarter's",
        (),
        "the statistic's mean over windows with its 95% bootstrap CI; holds when the CI lies above "
        "0 (the lowest quarter holds more energy than any other)",
        "greater",
        0.0,
        _energy,
    )
)


# ------------------------------------------------------------------------------------------------
def _retrieval(c: Any) -> Measurement:
    heads = _retrieval_heads(c.found)
    if not heads:
        return Measurement(
            not_applicable=f"no retrieval heads (copy score ≥ 0.1 on {c.prompt_len}-token "
            "passkey prompts)"
        )

    def values(case: Any, rows: list[dict]) -> list[float]:
        return [acc for _, acc in copy_values(c.model, case, rows, c.budget.row_tokens)]

    m = knockout_claim(
        c,
        heads,
        "low",
        _prompts(c),
        values,
        "less",
        lambda a, b: f"copy accuracy {a:.2f} → {b:.2f} ({len(heads)} retrieval heads)",
    )
    if m.baseline == 0:
        m.not_applicable = (
            "the unmodified model never copies the passkey (copy accuracy 0): there is no "
            "retrieval to remove"
        )
    return m


register_claim(
    Claim(
        "retrieval-lowest-band",
        "Retrieval heads copy through the lowest-frequency band.",
        "Wu et al. 2024, Retrieval Head Mechanistically Explains Long-Context Factuality; Bayram "
        "2026, arXiv 2606.21249",
        "four 7–8B models: the lowest 32 of 128 dims of the 87 retrieval heads zeroed, needle "
        "recall 1.00 → 0.18 (random heads: no drop)",
        "heads with copy score ≥ 0.1 on passkey prompts; the lowest quarter of their planes "
        "zeroed; metric: copy accuracy at the passkey's copy steps",
        "copy accuracy",
        _KNOCKOUT_CONTROLS,
        _KNOCKOUT_RULE,
        "less",
        0.0,
        _retrieval,
    )
)


# ------------------------------------------------------------------------------------------------
def _semantic(c: Any) -> Measurement:
    sem = c.head_sets.get("semantic")
    if not sem:
        return Measurement(not_applicable="no head outside the positional and retrieval sets")
    heads = [tuple(hd) for hd in sem["heads"]]

    def values(window: torch.Tensor, rows: list[dict]) -> list[float]:
        got = loss_values(c.model, window, rows, c.budget.row_tokens)
        return [content - function for content, function in got]

    windows = [w for w in c.text_windows]
    return knockout_claim(
        c,
        heads,
        "low",
        windows,
        values,
        "greater",
        lambda a, b: f"content − function loss {a:.2f} → {b:.2f} nats ({len(heads)} heads)",
    )


register_claim(
    Claim(
        "semantic-lowest-band",
        "The lowest-frequency band is a semantic channel: removing it hurts content words more "
        "than function words.",
        "Barbero et al. 2025 (ICLR 2025)",
        "Gemma 7B: the lowest frequencies carry semantic information (argued from norms and a "
        "construction, no knockout)",
        "the 10 heads (neither positional nor retrieval) whose lowest-band logit varies most with "
        "content; their lowest quarter zeroed; metric: next-token loss on content-word targets "
        "minus that on function-word targets of held-out text",
        "content − function loss",
        _KNOCKOUT_CONTROLS,
        _KNOCKOUT_RULE,
        "greater",
        0.0,
        _semantic,
    )
)


# ------------------------------------------------------------------------------------------------
def _massive(c: Any) -> Measurement:
    from ropelens.analyses.massive_values import massive_values

    per_window, masks = [], []
    for w in c.text_windows:
        mv = massive_values(c.model, w[None], n_ctx=w.numel(), progress=False, verify=False)
        m = torch.cat([mv.plane_mask("q"), mv.plane_mask("k")], 1)  # [layer, head, plane]
        masks.append(m)
        P = m.shape[-1]
        rank = torch.arange(P, dtype=torch.float64) / max(1, P - 1)  # 0 highest, 1 lowest
        if m.any():
            per_window.append(float(rank.expand_as(m)[m].mean()))
    if not per_window:
        return Measurement(not_applicable="no massive q or k value (5× the head's mean dim norm)")
    est = percentile_ci(torch.tensor(per_window, dtype=torch.float64), n_boot=c.budget.n_boot)
    observed = float(est.mean)
    # null: the same number of massive planes per (layer, head) on each window, drawn uniformly
    rng = np.random.default_rng(c.seed + 5)
    draws, sets = [], []
    for d in range(c.budget.n_draws):
        means = []
        for m in masks:
            P = m.shape[-1]
            counts = m.sum(-1).flatten().tolist()
            picked = [rng.choice(P, int(k), replace=False) / max(1, P - 1) for k in counts if k]
            if picked:
                means.append(float(np.concatenate(picked).mean()))
        draws.append(float(np.mean(means)))
        sets.append(d)
    control = control_outcome("uniform planes", observed, draws, sets, -1, "greater")
    return Measurement(
        effect=observed,
        lo=float(est.lo),
        hi=float(est.hi),
        controls=[control],
        model_number=f"mean frequency rank of massive planes {observed:.2f} (uniform: 0.50; 1 = "
        "lowest frequency)",
        n_windows=len(per_window),
        n_draws=c.budget.n_draws,
        detail={"n_massive_planes": int(sum(int(m.sum()) for m in masks))},
    )


register_claim(
    Claim(
        "massive-values-low-frequency",
        "Massive query and key values concentrate in the low-frequency planes.",
        "Jin et al. 2025, Massive Values in Self-Attention Modules are the Key to Contextual "
        "Knowledge Understanding (ICML 2025)",
        "Llama, Qwen, Gemma (7–9B): massive values in q and k sit in the low-frequency dims",
        "massive_values on each held-out text window (a dim is massive above 5× its head's mean "
        "dim norm); statistic: mean frequency rank of the massive planes (0 highest, 1 lowest)",
        "frequency rank of massive planes",
        ("as many massive planes per head drawn uniformly",),
        "the rank's mean over windows with its 95% bootstrap CI against 0.5; one-sided p against "
        "uniform draws; holds when the CI lies above 0.5 and the draws are beaten",
        "greater",
        0.5,
        _massive,
    )
)


# ------------------------------------------------------------------------------------------------
def _sinks(c: Any) -> Measurement:
    from ropelens.analyses.attention_sinks import attention_sinks

    results = [
        attention_sinks(
            c.model, w[None], n_ctx=w.numel(), progress=False, verify=False, epsilon=0.3
        )
        for w in c.text_windows
    ]
    sinking = torch.stack([r.sinking() for r in results]).double().mean(0) >= 0.5
    rate = float(sinking.sum()) / float(results[0].present().sum())
    if not sinking.any():
        return Measurement(not_applicable="no head sinks on the first token (ε = 0.3)")
    per_window = []
    for r in results:
        x = r.sink_logit()[sinking]  # [sinking head, band], highest band first
        share = x.sum(0) / x.sum()
        per_window.append(float(share[-1] - share[:-1].max()))
    est = percentile_ci(torch.tensor(per_window, dtype=torch.float64), n_boot=c.budget.n_boot)
    return Measurement(
        effect=float(est.mean),
        lo=float(est.lo),
        hi=float(est.hi),
        model_number=f"sink rate {rate:.0%} of heads; lowest band's share of their sink logit "
        f"minus the largest other band's {float(est.mean):+.2f}",
        n_windows=len(per_window),
        detail={"controlled": False, "sink_rate": rate, "n_sinking": int(sinking.sum())},
    )


register_claim(
    Claim(
        "sink-lowest-band",
        "Heads sink on the first token, and the lowest band makes the sink logit.",
        "Gu et al. 2024, When Attention Sink Emerges in Language Models (ICLR 2025); Barbero et "
        "al. 2025",
        "sink rate at ε = 0.3 over many open models (Gu et al.); Gemma 7B: the sink uses the "
        "lowest frequencies (Barbero et al.)",
        "attention_sinks on each held-out text window (ε = 0.3, Gu et al.'s metric); the heads "
        "that sink on most windows; each band's share of their summed sink logit",
        "lowest band's share of the sink logit minus the largest other band's",
        (),
        "the statistic's mean over windows with its 95% bootstrap CI; not applicable where no "
        "head sinks; holds when the CI lies above 0",
        "greater",
        0.0,
        _sinks,
    )
)


# ------------------------------------------------------------------------------------------------
def _u_shape(c: Any) -> Measurement:
    from ropelens.analyses.attention_by_distance import attention_by_distance
    from ropelens.run import data

    # the rise at long distance needs long windows: at least 256 tokens
    _, val = data.english().split()
    n_ctx = max(256, c.budget.text_ctx)
    tokens = data.windows(val, c.model, n_ctx, n_windows=c.budget.n_windows)
    abd = attention_by_distance(
        c.model, tokens, n_ctx=tokens.shape[1], progress=False, verify=False
    )
    lowest = abd.band_names[-1]
    causes = []
    n_heads = abd.present().sum(1).tolist()
    for li, layer in enumerate(abd.layers):
        for head in range(n_heads[li]):
            cause = abd.u_shape_cause(layer, head)
            if cause is not None:
                causes.append(cause["cause"] == lowest)
    n_all = int(sum(n_heads))
    if not causes:
        return Measurement(
            not_applicable=f"no head's logit is U-shaped by distance on {tokens.shape[0]} × "
            f"{tokens.shape[1]} tokens"
        )
    x = torch.tensor(causes, dtype=torch.float64)
    est = percentile_ci(x, n_boot=c.budget.n_boot)
    return Measurement(
        effect=float(est.mean),
        lo=float(est.lo),
        hi=float(est.hi),
        model_number=f"{len(causes)} of {n_all} heads U-shaped; the lowest band causes the rise in "
        f"{int(x.sum())}",
        n_windows=int(tokens.shape[0]),
        detail={"controlled": False, "n_u_shaped": len(causes), "n_heads": n_all},
    )


register_claim(
    Claim(
        "u-shape-low-frequency",
        "Attention logits are U-shaped by distance, and the rise at long distance comes from the "
        "low frequencies.",
        "Chen et al. 2025, HoPE: A Novel Positional Encoding Without Long-Term Decay (ACL 2025)",
        "Llama-family models: attention decays locally but rises again at long distance, the rise "
        "from the low-frequency components",
        "attention_by_distance on held-out text windows of ≥ 256 tokens: per head, the mean logit "
        "by log-spaced distance bin; for each U-shaped head, the band with the largest share of "
        "the rise",
        "share of U-shaped heads whose rise comes from the lowest band",
        (),
        "the share with its 95% bootstrap CI over the U-shaped heads: holds when it lies above "
        "0.5; not applicable where no head is U-shaped",
        "greater",
        0.5,
        _u_shape,
    )
)


# ------------------------------------------------------------------------------------------------
def _prope(c: Any) -> Measurement:
    from ropelens.run.evaluate import window_losses
    from ropelens.run.intervene import apply_rope_variant
    from ropelens.spec.variants import PRoPE

    tokens = c.text_windows
    base = window_losses(c.model, tokens, 4, progress=False)
    with apply_rope_variant(c.model, PRoPE(0.75)):
        keep = window_losses(c.model, tokens, 4, progress=False)
    with apply_rope_variant(c.model, PRoPE(0.0)):
        nope = window_losses(c.model, tokens, 4, progress=False)
    n = c.budget.n_boot
    cost = paired_bootstrap_ci(keep, base, n_boot=n, seed=c.seed)
    nope_cost = paired_bootstrap_ci(nope, base, n_boot=n, seed=c.seed)
    fails = (
        ""
        if nope_cost.lo > 0.5
        else f"NoPE costs only {float(nope_cost.mean):+.3g} [{float(nope_cost.lo):+.3g}, "
        f"{float(nope_cost.hi):+.3g}] nats, not beyond 0.5"
    )
    return Measurement(
        effect=float(cost.mean),
        lo=float(cost.lo),
        hi=float(cost.hi),
        baseline=float(base.mean()),
        model_number=f"p = 0.75: {float(cost.mean):+.4f} nats; NoPE: {float(nope_cost.mean):+.3f}",
        n_windows=len(tokens),
        detail={
            "controlled": False,
            "fails": fails,
            "nope": {
                "mean": float(nope_cost.mean),
                "lo": float(nope_cost.lo),
                "hi": float(nope_cost.hi),
            },
        },
        fails=fails,
    )


register_claim(
    Claim(
        "prope-keeps-highest",
        "p-RoPE keeping the highest 75% of the frequencies costs little at inference; NoPE costs "
        "much.",
        "Barbero et al. 2025 (ICLR 2025)",
        "Gemma 2B/7B: p-RoPE with p = 0.75 matches or beats RoPE; NoPE is worst (their Table 2)",
        "next-token loss on held-out text windows with the lowest quarter of the frequencies "
        "no longer rotating (p = 0.75), and with none rotating (NoPE), every layer",
        "Δ loss at p = 0.75 (nats)",
        (),
        "p = 0.75's paired Δ loss with its 95% bootstrap CI: holds when the CI lies below 0.05 "
        "nats and NoPE's lies above 0.5 nats",
        "less",
        0.05,
        _prope,
    )
)


# ------------------------------------------------------------------------------------------------
def _min_b(base: float, rotary_dim: int, context: int) -> tuple[float, int]:
    """min over m < ``context`` of Men et al.'s B(m) = Σ_i cos(m θ_i), θ_i = base^(−2i/d), and the
    m where it is reached (float64, every m, in chunks)."""
    theta = base ** (-np.arange(0, rotary_dim, 2, dtype=np.float64) / rotary_dim)
    best, where = math.inf, 0
    for a in range(0, context, 1 << 12):
        m = np.arange(a, min(context, a + (1 << 12)), dtype=np.float64)
        b = np.cos(m[:, None] * theta[None, :]).sum(axis=1)
        i = int(b.argmin())
        if b[i] < best:
            best, where = float(b[i]), a + i
    return best, where


def _base_bound(c: Any) -> Measurement:
    from ropelens.analyses.base_predictions import base_lower_bound, bound_holds

    rows = []
    for kind, layers in _layer_groups(c).items():
        lr = c.spec[layers[0]]
        ctx = lr.window or c.spec.n_ctx
        if lr.base is None or not ctx or not lr.rotary_dim:
            continue
        low, at = _min_b(float(lr.base), lr.rotary_dim, int(ctx))
        rows.append(
            {
                "layers": kind,
                "base": float(lr.base),
                "rotary_dim": int(lr.rotary_dim),
                "context": int(ctx),
                "min_b": low,
                "min_b_at": at,
                "holds": bool(bound_holds(float(lr.base), lr.rotary_dim, int(ctx))),
                "smallest_base": base_lower_bound(lr.rotary_dim, int(ctx)),
            }
        )
    if not rows:
        return Measurement(not_applicable="no layer with a single RoPE base and a known context")
    worst = min(r["min_b"] for r in rows)
    return Measurement(
        effect=worst,
        lo=worst,
        hi=worst,
        model_number="; ".join(
            f"{r['layers']}: base {r['base']:.3g}, min B(m) {r['min_b']:+.3g} at m = "
            f"{r['min_b_at']:,} < {r['context']:,} (smallest feasible base "
            f"{r['smallest_base']:.3g})"
            for r in rows
        ),
        n_windows=0,
        detail={"controlled": False, "layers": rows},
    )


def _layer_groups(c: Any) -> dict[str, list[int]]:
    if not c.has_layer_kinds():
        return {"all": list(c.spec.rotary_layers)}
    return {
        kind: [
            L for L in c.spec.rotary_layers if (c.spec[L].window is not None) == (kind == "local")
        ]
        for kind in ("local", "global")
    }


register_claim(
    Claim(
        "base-bounds-context",
        "The RoPE base bounds the context length: the base must reach the smallest base whose "
        "B(m) = Σ cos(m θ_i) stays ≥ 0 for every m below the context.",
        "Men et al. 2024, Base of RoPE Bounds Context Length (NeurIPS 2024)",
        "head dim 128: 4.3e3 at 1k, 8.4e4 at 8k, 6.4e5 at 32k tokens (their Table 2)",
        "B(m) = Σ cos(m θ_i) at the model's own base for every m below each layer kind's context "
        "(its window for sliding-window layers), float64; the smallest feasible base beside it "
        "(feasibility is not monotone in the base, so the base must be checked itself)",
        "min over m and layer kinds of B(m)",
        (),
        "exact, no statistics: holds when B(m) > 0 at every m below the context in every layer "
        "kind",
        "greater",
        0.0,
        _base_bound,
        reads_weights=False,
    )
)


# ------------------------------------------------------------------------------------------------
def _oka_band(c: Any) -> Measurement:
    from ropelens.analyses.band_location import band_location, control_planes
    from ropelens.errors import UnsupportedModelError
    from ropelens.run.evaluate import window_losses
    from ropelens.run.intervene import apply_rope_variant
    from ropelens.spec.variants import PlaneMask

    tokens = c.text_windows
    loc = band_location(c.model, tokens, n_ctx=tokens.shape[1], intervene=False, progress=False)
    below = loc.below_band()
    layers = list(loc.layers)
    if not any(below):
        return Measurement(
            not_applicable="every layer's band reaches its lowest plane: no plane lies below it"
        )
    prominence = float(loc.bands().prominence.double().median())

    def losses(planes: list[tuple[int, ...]] | None) -> torch.Tensor:
        import contextlib

        with contextlib.ExitStack() as stack:
            for L, p in zip(layers, planes or [], strict=False):
                if p:
                    stack.enter_context(apply_rope_variant(c.model, PlaneMask(p), layers=[L]))
            return window_losses(c.model, tokens, 4, progress=False).double()

    try:
        base = losses(None)
        nope = losses(below)
    except UnsupportedModelError as e:
        return Measurement(not_applicable=f"planes cannot be unrotated here: {e}")
    n_planes = c.spec[layers[0]].n_planes
    counts = [len(p) for p in below]
    draws, sets = [], []
    for d in range(c.budget.n_draws):
        planes = control_planes(n_planes, counts, c.seed + 1 + d)
        draws.append(float((losses(planes) - base).mean()))
        sets.append(tuple(planes))
    cost = paired_bootstrap_ci(nope, base, n_boot=c.budget.n_boot, seed=c.seed)
    observed = float(cost.mean)
    n_possible = math.prod(math.comb(n_planes, k) for k in counts)
    control = control_outcome(
        "random planes, as many per layer", observed, draws, sets,
        n_possible if n_possible < 2**62 else -1, "less",
    )  # fmt: skip
    fails = "" if prominence >= 1.5 else f"no band stands out (median prominence {prominence:.2f}×)"
    return Measurement(
        effect=observed,
        lo=float(cost.lo),
        hi=float(cost.hi),
        baseline=float(base.mean()),
        controls=[control],
        model_number=f"{sum(counts)} planes below the bands unrotated: {observed:+.4f} nats; as "
        f"many random planes: {control.effect:+.4f}; band prominence {prominence:.2f}×",
        n_windows=int(tokens.shape[0]),
        n_draws=c.budget.n_draws,
        detail={"below": [list(p) for p in below], "prominence": prominence, "fails": fails},
        fails=fails,
    )


register_claim(
    Claim(
        "band-below-is-nope",
        "A high-norm band forms in q, and the planes below it can stop rotating at little cost.",
        "Oka et al. 2026, Frequency Bands in RoPE (ICLR 2026)",
        "their models: a band placed by base and training length; unrotating below it costs "
        "little (SmolLM2 in ropelens's docs: −0.0000 nats vs +0.206 for random planes)",
        "band_location on held-out text (band = planes ≥ half-way from the median norm to the "
        "peak); the planes below each layer's band unrotated; next-token loss",
        "Δ loss, planes below the band unrotated (nats)",
        ("as many random planes per layer unrotated",),
        "paired Δ loss with its 95% bootstrap CI below 0.05 nats, beating the random planes "
        "(one-sided p, less harm); a band must stand out (median prominence ≥ 1.5×)",
        "less",
        0.05,
        _oka_band,
    )
)


# ------------------------------------------------------------------------------------------------
def _late_dims(c: Any) -> Measurement:
    every = every_head(c.spec)
    dose = max(1, c.spec[every[0][0]].n_planes // 16)
    depths = np.linspace(0.05, 0.3, c.budget.n_windows).tolist()
    tok = c.model.tokenizer
    prompts = [
        copy_case(tok, passkey_prompt(tok, c.prompt_len, d, make_passkey(c.seed + 3000, t)))
        for t, d in enumerate(depths)
    ]

    def values(case: Any, rows: list[dict]) -> list[float]:
        return [acc for _, acc in copy_values(c.model, case, rows, c.budget.row_tokens)]

    m = knockout_claim(
        c, every, "low", prompts, values, "less",
        lambda a, b: f"copy accuracy at distance {a:.2f} → {b:.2f} ({dose} lowest planes per head)",
        dose=dose,
    )  # fmt: skip
    m.detail["required_controls"] = [[PLANES]]  # every head is knocked out: no head control
    if m.baseline == 0:
        m.not_applicable = "the unmodified model never copies the far passkey (copy accuracy 0)"
    versus = m.detail["set_minus_other_end"]
    if not versus["hi"] < 0:
        m.fails = (
            f"the lowest planes cost no more than the highest (accuracy difference "
            f"{versus['mean']:+.3g} [{versus['lo']:+.3g}, {versus['hi']:+.3g}])"
        )
    return m


register_claim(
    Claim(
        "late-dims-retrieve-far",
        "The late (low-frequency) dimensions matter more for retrieval over distance than the "
        "early ones.",
        "Chiang & Yogatama 2025, The Geometry of Tokens in Internal Representations of Large "
        "Language Models / RoPE dimension utility (ACL Findings 2025)",
        "masking the later dimensions hurts question answering over distant documents; the first "
        "dimensions are of little use",
        "passkey prompts with the passkey far back (depths 0.05–0.3); the lowest n/16 planes "
        "zeroed in every head; copy accuracy",
        "copy accuracy at distance",
        ("random planes in every head", "the highest n/16 planes in every head (paired CI)"),
        "paired accuracy change with its 95% bootstrap CI below 0, beating random planes; the "
        "lowest planes must cost more than the highest (paired CI of the difference below 0)",
        "less",
        0.0,
        _late_dims,
    )
)


# ------------------------------------------------------------------------------------------------
def _local_global(c: Any) -> Measurement:
    if not c.has_layer_kinds():
        return Measurement(not_applicable="the model has one kind of layer (no local and global)")
    pos = _heads(c.found, "positional")
    retr = _retrieval_heads(c.found)
    if not pos or not retr:
        return Measurement(
            not_applicable=f"needs positional and retrieval heads; found {len(pos)} and {len(retr)}"
        )
    every = every_head(c.spec)
    is_local = {hd: c.spec[hd[0]].window is not None for hd in every}
    local_share = sum(is_local.values()) / len(every)

    def local_excess(p: list) -> float:
        return sum(is_local[hd] for hd in p) / len(p) - local_share

    def global_excess(r: list) -> float:
        return sum(not is_local[hd] for hd in r) / len(r) - (1 - local_share)

    observed = min(local_excess(pos), global_excess(retr))
    controls = []
    for name, found, in_kind in (
        ("random heads for the positional set", pos, [float(is_local[hd]) for hd in every]),
        ("random heads for the retrieval set", retr, [1.0 - is_local[hd] for hd in every]),
    ):
        # one cluster (every head): exact over all sets of the found size where they are few
        test = clustered_permutation_test(
            in_kind, [0] * len(every), [hd in found for hd in every], c.budget.n_draws, c.seed + 9
        )
        n_draws = test.n_perm
        controls.append(
            ControlOutcome(
                name,
                0.0,
                math.nan,
                math.nan,
                test.p_value,
                test.p_value,
                test.p_floor,
                n_draws,
                test.n_sets if test.exact else n_draws,
                test.n_sets if test.n_sets < 2**62 else -1,
                test.withheld,
            )  # fmt: skip
        )
    n_pl = sum(is_local[hd] for hd in pos)
    n_rg = sum(not is_local[hd] for hd in retr)
    return Measurement(
        effect=observed,
        lo=observed,
        hi=observed,
        controls=controls,
        model_number=f"{n_pl} of {len(pos)} positional heads local, {n_rg} of {len(retr)} "
        f"retrieval heads global (local layers hold {local_share:.0%} of the heads)",
        n_windows=c.budget.taxonomy_windows,
        n_draws=c.budget.n_draws,
        detail={"positional": [list(h) for h in pos], "retrieval": [list(h) for h in retr]},
    )


register_claim(
    Claim(
        "local-position-global-copy",
        "In a model with local and global layers, position is read in the local layers and "
        "copying happens in the global ones.",
        "Gemma Team 2025, Gemma 3 Technical Report (the design's rationale); open in the "
        "literature",
        "not measured in the report (the 5:1 local:global design assumes it)",
        "head_taxonomy's positional heads and the retrieval heads (copy score ≥ 0.1), by layer "
        "kind; statistic: the smaller of (positional heads' local share − local layers' head "
        "share) and (retrieval heads' global share − global layers' head share)",
        "excess local share of positional and global share of retrieval heads",
        (
            "random head sets as large as the positional set, from any layer",
            "random head sets as large as the retrieval set, from any layer",
        ),
        "exact counts against the head shares (no CI: the sets are what was found); each half's "
        "share against random head sets of its size (one-sided permutation p, exact where the "
        "sets are few); holds when both excesses are above 0 and each beats its random sets",
        "greater",
        0.0,
        _local_global,
    )
)
