"""The sweep's checks past the logits: frequency usage and band statistics against dense references
built from what HF's eager attention receives, and a RoPE variant with its exact restore.

- **Frequency usage**: :class:`~ropelens.analyses.frequency_usage.UsageReducer` on the post-RoPE q
  and k against the per-plane norms of the q and k HF's attention function receives
  (:mod:`tests.harness.dense`), averaged over positions and divided by HF's own rotary
  ``attention_scaling`` (which multiplies its cos and sin), except where a norm after the rotation
  takes it out again, as ropelens reads.
- **Band statistics**: :class:`~ropelens.analyses.band_statistics.BandStatsReducer` streamed over
  the sweep's input against :func:`tests.harness.dense.dense_layer_sums` (float64, HF's mask,
  cap, sinks and attended key). Layers whose mask the model picks at run time (sparse attention's
  key selection, Llama 4's chunks) refuse band statistics on longer windows, so the input is cut
  into windows of at most that many tokens, where their mask is causal.
- **Variant and restore**: p-RoPE (p = 0.5; a base change where a layer has one plane) applied with
  :func:`ropelens.run.intervene.apply_rope_variant`: on one token repeated the rotated query turns
  by the variant's frequencies, and the logits after leaving the context equal the ones before, bit
  for bit. Every engine applies it (a plain HF model and a bridge rotating inside HF's module
  through :mod:`ropelens.backends.engine`).
- **Variant against HF's own rope type**: the logits under ``Linear(2)`` (PI) in the layers with
  default RoPE against HF's own ``"linear"`` rope type, factor 2, set in the config of the same
  weights (relative): the variant's tables checked against an implementation that shares none of
  ropelens's code.

The bands' grouping of head dims and the plane pairs come from the spec (in HF's head layout:
multi-head latent attention puts its rotary dims after the no-position ones); the sweep's rotation
check (``pairing_err``) holds the pairing against HF's own rotation independently.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

from ropelens.analyses.band_statistics import BandStatsReducer
from ropelens.analyses.frequency_usage import UsageReducer
from ropelens.backends.hf import BridgeOnlyError
from ropelens.errors import InputError, UnsupportedModelError
from ropelens.report.build import build_report
from ropelens.run.capture import capture_qk, stream
from ropelens.run.intervene import apply_rope_variant
from ropelens.run.verify import rotation_error, rotation_from_pre
from ropelens.spec.bands import Bands
from ropelens.spec.variants import BaseChange, Linear, PRoPE
from tests.harness.dense import HFLayer, dense_layer_sums, hf_layers, plane_norm_means
from tests.harness.families import FamilyCheck

__all__ = [
    "SweepCheck",
    "band_stats_error",
    "hf_attention_scaling",
    "hf_dims",
    "static_len",
    "sums_error",
    "hf_variant_error",
    "report_status",
    "usage_error",
    "variant_error",
]

NO_VARIANTS = "plain HF model: no variants"


@dataclass
class SweepCheck(FamilyCheck):
    """:class:`FamilyCheck`'s errors and the sweep's further ones (relative unless said
    otherwise)."""

    usage_err: float = math.nan  # per-plane mean q/k norms vs HF's attention inputs
    band_stats_err: float = math.nan  # every band-statistics sum vs the dense float64 reference
    variant_err: float = (
        math.nan
    )  # rotation under the variant vs its spec; NaN with variant_note: no variants
    restore_err: float = (
        math.nan
    )  # largest |logit change| after leaving the variant (absolute; must be 0)
    variant_note: str = ""  # why no variant ran (a plain HF model; a one-line refusal)
    hf_variant_err: float = (
        math.nan
    )  # logits under Linear(2) vs HF's own "linear" rope type, same weights (relative)
    hf_variant_note: str = ""  # why there is no such reference
    report: str = (
        ""  # "ok" or the first line of what stopped `ropelens report --quick` (only when asked for)
    )


def hf_dims(lr, idx: Tensor) -> Tensor:
    """Head dims as ropelens numbers them (rotary dims first) → as HF's attention receives them (the
    rotary dims at ``rotary_offset``, after the no-position ones, under multi-head latent
    attention)."""
    o, r = lr.rotary_offset, lr.rotary_dim
    if not o:
        return idx
    return torch.where(idx < r, idx + o, torch.where(idx < r + o, idx - r, idx))


def hf_attention_scaling(hf, lr) -> float:
    """The factor HF's rotary module multiplies its cos and sin by for this layer (1 where it keeps
    none)."""
    cfg = hf.config.get_text_config() if hasattr(hf.config, "get_text_config") else hf.config
    ltypes = getattr(cfg, "layer_types", None)
    for m in hf.modules():
        if "rotary" not in type(m).__name__.lower():
            continue
        if (
            ltypes
            and lr.layer < len(ltypes)
            and hasattr(m, f"{ltypes[lr.layer]}_attention_scaling")
        ):
            return float(getattr(m, f"{ltypes[lr.layer]}_attention_scaling"))
        if isinstance(getattr(m, "attention_scaling", None), (int, float, Tensor)):
            return float(m.attention_scaling)
    return 1.0


def static_len(spec, layers: list[int], n: int) -> int:
    """The longest window (≤ ``n``) on which every layer's mask is built from positions: at most the
    keys a sparse-attention layer keeps, at most a chunked layer's chunk."""
    return min([n] + [x for L in layers for x in (spec[L].select_keys, spec[L].chunk) if x])


# The JS divergence of a row, in float32, carries an absolute error of a few float32 epsilons
# (~1e-7) whatever its size: the log of each ratio p/m near 1 rounds to ~6e-8, weighted by
# probabilities summing to 1. Where a band's pattern is nearly the model's (near-uniform attention)
# the sum itself is ~1e-5 a row, so its relative error is measured against at least JSD_FLOOR per
# query: 1e-6 a row at the tolerance 1e-4, ten times that rounding, while a wrong mask, cap or sink
# moves a row's JSD by O(0.1).
JSD_FLOOR = 1e-2


def sums_error(got: dict[str, Tensor], want: dict[str, Tensor]) -> float:
    """Largest error of any sum relative to that sum's largest |value| (the JS divergence's at least
    ``JSD_FLOOR`` per query; see above); inf where a sum is missing, misshapen or NaN."""
    err = 0.0
    for key, w in want.items():
        g = got.get(key)
        if g is None or g.shape != w.shape or bool(torch.isnan(g).any()):
            return math.inf
        g = g.detach().double().cpu()
        scale = w.abs().max()
        if key == "jsd":
            scale = torch.maximum(scale, JSD_FLOOR * want["n_queries"].max())
        err = max(err, float((g - w).abs().max() / scale.clamp_min(1e-30)))
    return err


def usage_error(
    model, spec, hf, lays: dict[int, HFLayer], toks: Tensor, layers: list[int]
) -> float:
    """Largest relative error of the mean per-plane q and k norms (every head, plane and layer)
    against the norms of the q and k HF's attention received on ``toks`` (``lays``), its attention
    scaling divided out."""
    if any(L not in lays for L in layers):
        return math.nan
    red = UsageReducer(spec, layers, source="post", n_sink=0)
    stream(model, [toks], [red], layers=layers, spec=spec, progress=False)
    err = 0.0
    for i, L in enumerate(layers):
        lr, lay = spec[L], lays[L]
        planes = hf_dims(lr, lr.plane_dims)
        scale = 1.0 if lr.norm_after_rope else hf_attention_scaling(hf, lr)
        for w, x in (("q", lay.q), ("k", lay.k)):
            want = plane_norm_means(x, planes) / scale  # [heads, planes]
            got = red.tok[(w, "all")].mean[i].cpu()
            if got.shape[0] < want.shape[0] or got.shape[1] < want.shape[1]:
                return math.inf
            got = got[: want.shape[0], : want.shape[1]]
            err = max(err, float((got - want).abs().max() / want.abs().max().clamp_min(1e-30)))
    return err


def band_stats_error(model, spec, hf, toks: Tensor, layers: list[int]) -> float:
    """Largest relative error of every band-statistics sum (one width group at a time) against the
    dense reference, over ``toks`` cut into windows no layer's model-picked mask reaches past
    (:func:`static_len`)."""

    n = static_len(spec, layers, toks.shape[1])
    rows = toks[0, : toks.shape[1] // n * n].reshape(-1, n)
    lays = hf_layers(hf, rows)
    if any(L not in lays or lays[L].probs is None for L in layers):
        return math.nan  # HF gave no attention inputs or no probabilities for a layer: no reference
    err = 0.0
    for group in spec.width_groups(layers).values():
        bands = Bands.quantiles(2) if spec[group[0]].n_planes >= 2 else Bands.all()
        red = BandStatsReducer(spec, group, bands, jsd=True)
        stream(model, [rows], [red], layers=group, spec=spec, progress=False)
        per = []
        for L in group:
            lr = spec[L]
            dims = list(bands.resolve(lr).dims)
            if sorted(torch.cat(dims).tolist()) != list(
                range(lr.head_dim)
            ):  # the reference sums its bands
                raise RuntimeError(f"layer {L}: bands {bands.describe()} do not partition the head")
            per.append(
                dense_layer_sums(
                    lays[L], [hf_dims(lr, d) for d in dims], hf_dims(lr, lr.plane_dims)
                )
            )
        want = {k: torch.stack([p[k] for p in per]) for k in per[0]}
        err = max(err, sums_error(red.sums, want))
    return err


def variant_error(model, spec, toks: Tensor, layers: list[int]) -> tuple[float, float, str]:
    """``(rotation error under the variant, largest |logit change| after leaving it, note)``: p-RoPE
    with p = 0.5 (a base change where the first layer has one plane); NaN and a note where the model
    has no variants."""
    variant = PRoPE(0.5) if spec[layers[0]].n_planes >= 2 else BaseChange(1e3)
    same = torch.full((1, toks.shape[1]), 7)
    with torch.no_grad():
        before = model(toks)
    try:
        with apply_rope_variant(model, variant) as vspec:
            acts = capture_qk(model, same, layers=layers, which=("q_pre", "q_rot"))
    except BridgeOnlyError:
        return math.nan, math.nan, NO_VARIANTS
    except (
        UnsupportedModelError,
        InputError,
    ) as e:  # variants refused in one line (attention rotating inside)
        return math.nan, math.nan, f"no variants: {str(e).strip().splitlines()[0][:160]}"
    with torch.no_grad():
        after = model(toks)
    restore = (
        0.0
        if torch.equal(after, before)
        else float((after - before).abs().max().nan_to_num(math.inf))
    )
    if restore == 0.0 and not torch.equal(
        after, before
    ):  # equal values, other bits (NaN, −0): still not restored
        restore = math.inf
    err = 0.0
    # as the sweep's rotation check: a layer whose pre-RoPE queries vary with position is skipped
    for L in layers:
        lr, q, pre = vspec[L], acts[L]["q_rot"][0], acts[L]["q_pre"][0]
        if float((pre - pre[:1]).abs().max()) > 1e-5 * float(pre.abs().max()):
            if (
                layers[0] == L
                # a hybrid's mixers before the first attention layer: rotate its own pre-RoPE
                # queries
            ):
                err = max(err, rotation_from_pre(lr, pre, q))
            continue
        err = max(err, rotation_error(lr, q))
    return err, restore, ""


def hf_variant_error(model, spec, hf, toks: Tensor) -> tuple[float, str]:
    """Relative max difference of the logits of ``model`` under ``Linear(2)`` in every rotary layer
    and HF's own ``"linear"`` rope type (factor 2) set in the config of ``hf``'s weights (per layer
    type where the config has one entry per type; the other rope parameters kept, so a query
    temperature stays), and ``""``; NaN and why there is no reference where HF's config takes no
    rope type, HF cannot build the family with it, or its forward ignores it."""
    import copy

    rp = getattr(
        hf.config.get_text_config() if hasattr(hf.config, "get_text_config") else hf.config,
        "rope_parameters",
        None,
    )
    if not isinstance(rp, dict) or not rp:
        return (
            math.nan,
            "no HF reference for PI: HF's config of this family holds no rope_parameters",
        )
    linear = {"rope_type": "linear", "factor": 2.0}
    per_type = any(isinstance(v, dict) for v in rp.values())
    default = [L for L in spec.rotary_layers if spec[L].rope_type == "default"]
    # every rope type set to linear; where HF cannot build that (Gemma 4's proportional layers), its
    # default ones only
    tries = [(spec.rotary_layers, lambda _: True)]
    if per_type and default and len(default) < len(spec.rotary_layers):
        tries.append((default, lambda v: v.get("rope_type", "default") == "default"))
    why = ""
    for layers, keep in tries:
        cfg = copy.deepcopy(hf.config)
        text = cfg.get_text_config() if hasattr(cfg, "get_text_config") else cfg
        text.rope_parameters = (
            {k: ({**v, **linear} if isinstance(v, dict) and keep(v) else v) for k, v in rp.items()}
            if per_type
            else {**rp, **linear}
        )
        try:
            ref_model = (
                type(hf)._from_config(cfg, attn_implementation="eager").eval()
            )  # the class under test itself
            ref_model.load_state_dict(hf.state_dict())
            with torch.no_grad():
                ref = ref_model(toks).logits
                plain = hf(toks).logits
        except Exception as e:
            first = str(e).strip().splitlines()[0][:120] if str(e).strip() else ""
            why = (
                why
                or "no HF reference for PI: HF cannot build it with rope type linear "
                f"({type(e).__name__}: {first})"
            )
            continue
        if torch.equal(ref, plain):
            return (
                math.nan,
                "no HF reference for PI: HF's forward ignores the rope type its config sets",
            )
        with apply_rope_variant(model, Linear(2.0), layers=layers), torch.no_grad():
            ours = model(toks)
        return float((ours - ref).abs().max() / ref.abs().max()), ""
    return math.nan, why


def report_status(model) -> str:
    """``"ok"`` when ``ropelens report --quick`` builds on ``model``, else the first line of what
    stopped it."""
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        try:
            build_report(model, out=f"{tmp}/report", quick=True, progress=False)
        except Exception as e:
            return (
                f"{type(e).__name__}: "
                f"{str(e).strip().splitlines()[0][:160] if str(e).strip() else ''}"
            )
    return "ok"
