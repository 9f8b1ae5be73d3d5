"""What several sections' measure steps share: an analysis re-run on a few of the report's windows,
and the unmodified model's per-window losses that the variant sections compare against.

The p-RoPE and context-extension sections score the same held-out windows (the first few of the
report's, cut to at most 256 tokens) and compare each variant with the unmodified model window by
window: the loss change Δ has a paired bootstrap CI, far tighter than the CIs of two perplexities
side by side. The unmodified model's losses are a measured step of their own (``variants_baseline``,
:func:`measure_baseline`), which both sections name in ``needs`` and read from ``data.results``.
"""

from __future__ import annotations

from typing import Any

from torch import Tensor

from ropelens.errors import InputError
from ropelens.report.collect import ReportData, evenly_spaced
from ropelens.report.html import number
from ropelens.report.section import Measured
from ropelens.run.evaluate import MIN_WINDOWS_FOR_CI, NO_INTERVAL, bootstrap_ci, window_losses
from ropelens.run.intervene import apply_rope_variant, is_identity

__all__ = [
    "CI_FORMATS",
    "MAX_CTX",
    "N_WINDOWS",
    "baseline",
    "eval_windows",
    "measure_baseline",
    "rerun",
    "variant_lead",
    "variant_losses",
]


def _ci_end(v: Any) -> str:
    """A CI end in a table: the number, or n/a where there is no interval (one window)."""
    return "n/a" if v is None or v != v else number(v)


# the CI columns of the variant tables: n/a where one window gave no interval
CI_FORMATS = {c: _ci_end for c in ("ppl_lo", "ppl_hi", "Δ lo", "Δ hi")}

N_WINDOWS = 2  # windows of at most MAX_CTX tokens: a re-run costs a few forward passes
MAX_CTX = 512
_EVAL = {"windows": 4, "n_ctx": 256}
_EVAL_QUICK = {"windows": 2, "n_ctx": 128}


def rerun(data: ReportData, analysis) -> Measured:
    """``analysis`` on a few of the report's windows (evenly spread, at most 512 tokens), over the
    report's layers."""
    n_ctx = min(data.n_ctx, MAX_CTX if not data.settings.get("quick") else 256)
    keep = evenly_spaced(data.n_windows, 1 if data.settings.get("quick") else N_WINDOWS)
    toks = data.tokens[keep, :n_ctx]
    return Measured(
        analysis(data.model, toks, n_ctx=n_ctx, layers=list(data.layers), progress=False),
        n_ctx,
        len(keep),
    )


def eval_windows(data: ReportData) -> Tensor:
    """The windows the variant sections score: the report's first few, cut to at most 256 tokens."""
    e = _EVAL_QUICK if data.settings.get("quick") else _EVAL
    return data.tokens[: e["windows"], : min(data.n_ctx, e["n_ctx"])]


def measure_baseline(data: ReportData) -> Tensor:
    """Per-window losses of the unmodified model on the windows the variant sections score."""
    return window_losses(data.model, eval_windows(data), batch_size=4, progress=False)


def baseline(data: ReportData) -> Tensor:
    """The baseline losses the ``variants_baseline`` step measured."""
    if "variants_baseline" not in data.results:
        raise InputError(
            "the variants_baseline step has not run: measure it first (measure_baseline) "
            "and keep its losses in data.results['variants_baseline']"
        )
    return data.results["variants_baseline"]


def variant_losses(data: ReportData, variant: Any, layer_kind: str | None = None) -> dict[str, Any]:
    """Perplexity and the paired loss change against the unmodified model for one variant (no
    forward pass when the variant rotates the chosen layers exactly as the model does)."""
    base = baseline(data)
    tokens = eval_windows(data)
    identity = is_identity(
        data.spec, variant, data.spec.layer_indices(None, layer_kind), int(tokens.shape[1])
    )
    if identity:
        losses = base
    else:
        with apply_rope_variant(data.model, variant, layer_kind=layer_kind):
            losses = window_losses(data.model, tokens, batch_size=4, progress=False)
    est = bootstrap_ci(losses)
    delta = bootstrap_ci(losses - base).loss
    return {
        "ppl": est.perplexity.mean,
        "ppl_lo": est.perplexity.lo,
        "ppl_hi": est.perplexity.hi,
        "Δ loss": delta.mean,
        "Δ lo": delta.lo,
        "Δ hi": delta.hi,
        "identity": identity,
    }


def variant_lead(data: ReportData, what: str) -> str:
    """A variant section's lead paragraph: ``what``, and the windows and the paired CI it is scored
    with."""
    t = eval_windows(data)
    ci = (
        "with a paired 95% bootstrap CI over windows"
        if t.shape[0] >= MIN_WINDOWS_FOR_CI
        else f"with no CI: {NO_INTERVAL}"
    )
    return (
        f'<p class="lead">{what} Scored on {t.shape[0]} held-out windows of {t.shape[1]} tokens '
        "of the "
        "report's corpus; Δ loss is the change in mean next-token loss (nats) against the "
        "unmodified model "
        f"on the same windows, {ci}.</p>"
    )
