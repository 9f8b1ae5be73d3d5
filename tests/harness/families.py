"""The family matrix checked: ropelens on the tiny random model of every RoPE family HF ships
(:mod:`ropelens.testing.families`), against HF's own eager attention.

Each :class:`Family` is a real HF config class with a small config whose windows are shorter than
the check's input (so they matter) and whose q/k weights are scaled up (so attention is far from
uniform), plus what ropelens must read from it: pairing, rotary dims, windows, soft-capping,
sinks, NoPE layers. :func:`check_family` saves the model to a directory, loads it through
``load_model(path)`` and compares ropelens with independent computations:

- the spec with the HF rotary module's ``inv_freq`` buffers, the attention modules' ``scaling``
  and the family's expected structure;
- on an input with one token repeated (so every position has the same pre-RoPE query), the
  captured post-RoPE query at m with the spec's rotation of position 0 — a wrong plane pairing,
  which summed logits hide, fails here;
- the band logits summed with HF's pre-softmax, pre-cap scores (taken inside HF's
  ``eager_attention_forward``), and the pattern rebuilt from them with HF's probabilities
  (``output_attentions``).

Families ropelens cannot measure exactly must raise :class:`ropelens.errors.UnsupportedModelError`.
"""

from __future__ import annotations

import contextlib
import importlib
import math
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import torch

from ropelens.analyses.attention_decomposition import attention_decomposition
from ropelens.errors import InputError, UnsupportedModelError
from ropelens.loading.models import load_model
from ropelens.run.capture import capture_qk
from ropelens.run.verify import rotation_error, rotation_from_pre, verify_model
from ropelens.spec.bands import Bands
from ropelens.spec.reading import rope_spec
from ropelens.testing.families import N_CHECK, VOCAB, Family, family, family_model_dir

__all__ = [
    "FamilyCheck",
    "check_family",
    "hf_inv_freq",
    "hf_scores",
    "probs_by_layer",
]


@dataclass
class FamilyCheck:
    """Measured errors of ropelens on one family (absolute, float32), or the refusal it raised."""

    family: str
    architecture: str = ""
    refusal: str | None = None
    spec_errors: list[str] = field(default_factory=list)  # mismatches with the expected structure
    inv_freq_err: float = math.nan  # against the HF rotary module's buffers
    pairing_err: float = math.nan  # relative, post-RoPE q at m vs the spec's rotation of position 0
    scores_err: float = (
        math.nan
    )  # summed band logits vs HF's pre-softmax, pre-cap scores (relative to max)
    pattern_err: float = math.nan  # rebuilt pattern vs HF's attention probabilities
    band_pattern_err: float = math.nan  # Bands.all() band-only pattern vs HF (full-rotary layers)
    layers_checked: list[int] = field(default_factory=list)
    kinds: dict[str, list[int]] = field(default_factory=dict)

    @property
    def exact(self) -> bool:
        errs = (self.inv_freq_err, self.pairing_err, self.scores_err, self.pattern_err)
        return self.refusal is None and not self.spec_errors and all(e <= 1e-4 for e in errs)


@contextlib.contextmanager
def hf_scores(hf) -> Iterator[dict[int, torch.Tensor]]:
    """Capture HF's pre-softmax, pre-cap scores q·kᵀ·scaling inside its
    ``eager_attention_forward``."""
    mod = importlib.import_module(type(hf).__module__)
    orig = getattr(mod, "eager_attention_forward", None)
    out: dict[int, torch.Tensor] = {}
    if orig is None:
        with _softmax_inputs(out):
            yield out
        return

    def wrapped(module, query, key, value, attention_mask, *args, **kwargs):
        if hasattr(
            module, "layer_idx"
        ):  # a decoder layer's attention; a VL model's vision tower has no layer_idx
            scaling = kwargs.get("scaling", args[0] if args else None)
            k = key.repeat_interleave(query.shape[1] // key.shape[1], dim=1)
            out[module.layer_idx] = (query @ k.transpose(-1, -2) * scaling).detach()
        return orig(module, query, key, value, attention_mask, *args, **kwargs)

    mod.eager_attention_forward = wrapped
    try:
        yield out
    finally:
        mod.eager_attention_forward = orig


@contextlib.contextmanager
def _softmax_inputs(out: dict[int, torch.Tensor]) -> Iterator[None]:
    """For a family that scores inline (Falcon): what its attention hands ``F.softmax``, per call in
    layer order. That is the scaled scores plus the additive mask, which is 0 where a key is
    allowed: the scores there."""
    import torch.nn.functional as F

    orig = F.softmax

    def wrapped(x, *args, **kwargs):
        if x.ndim == 4:
            out[len(out)] = x.detach()
        return orig(x, *args, **kwargs)

    F.softmax = wrapped
    try:
        yield
    finally:
        F.softmax = orig


def _spec_errors(fam: Family, spec) -> list[str]:
    errs = []
    for lr in spec.layers:
        if (
            lr.layer in fam.mixer_layers or not lr.attention
        ):  # a hybrid's other layers: their kind, nothing else
            want = fam.mixer_layers.get(lr.layer, "an attention layer")
            if lr.kind != want or lr.attention or not lr.mixer:
                errs.append(f"layer {lr.layer} kind {lr.kind!r} ({lr.mixer}) != {want!r}")
            continue
        if lr.output_gate != fam.output_gate:
            errs.append(f"layer {lr.layer} output_gate {lr.output_gate} != {fam.output_gate}")
        if lr.mixer != fam.mixer:
            errs.append(f"layer {lr.layer} mixer {lr.mixer!r} != {fam.mixer!r}")
        nope = lr.layer in fam.nope_layers
        d = fam.layer_head_dim(lr.layer)
        want_rot = (
            0 if nope else d if lr.layer in fam.turning else 2 * int(d * fam.rotary_fraction / 2)
        )
        # planes that turn: all rotary planes, or the leading share of them under proportional RoPE
        want_turning = (
            int(fam.turning[lr.layer] * d // 2) if lr.layer in fam.turning else want_rot // 2
        )
        checks = {
            "kind": (
                lr.kind,
                "nope"
                if nope
                else "sliding"
                if lr.layer in fam.windows
                else "chunked"
                if lr.layer in fam.chunks
                else "full",
            ),
            "window": (lr.window, fam.windows.get(lr.layer)),
            "chunk": (lr.chunk, fam.chunks.get(lr.layer)),
            "rotary_dim": (lr.rotary_dim, want_rot),
            "turning planes": (
                (lr.inv_freq > 0).tolist(),
                [True] * want_turning + [False] * (want_rot // 2 - want_turning),
            ),
            "head_dim": (lr.head_dim, d),
            "softcap": (lr.softcap, fam.softcap),
            "sinks": (lr.sinks is not None, fam.sinks),
            "n_heads": (lr.n_heads, fam.config["num_attention_heads"]),
            "n_kv_heads": (
                lr.n_kv_heads,
                fam.kv_heads.get(
                    lr.layer,
                    fam.config.get(
                        "num_key_value_heads",
                        fam.config.get("num_kv_heads", fam.config["num_attention_heads"]),
                    ),
                ),
            ),  # Falcon names them num_kv_heads
        }
        if not nope:
            checks["pairing"] = (lr.pairing, fam.pairing)
        want_scale = fam.score_scale if fam.score_scale is not None else d**-0.5
        if not math.isclose(lr.score_scale, want_scale, rel_tol=1e-6):
            errs.append(f"layer {lr.layer} score_scale {lr.score_scale} != {want_scale}")
        errs += [
            f"layer {lr.layer} {k} {got!r} != {want!r}"
            for k, (got, want) in checks.items()
            if got != want
        ]
    return errs


def probs_by_layer(probs, spec) -> dict[int, torch.Tensor]:
    """HF's ``output_attentions`` keyed by layer: a hybrid returns one map per attention layer only,
    in order."""
    if probs is None:
        return {}
    layers = range(spec.n_layers) if len(probs) == spec.n_layers else spec.attention_layers
    return {L: p for L, p in zip(layers, probs) if p is not None}


def hf_inv_freq(hf, lr) -> torch.Tensor:
    """The frequencies HF's rotary module holds for this layer (layer-type buffers where it has
    them)."""
    cfg = hf.config.get_text_config() if hasattr(hf.config, "get_text_config") else hf.config
    ltypes = getattr(cfg, "layer_types", None)
    for m in hf.modules():
        if "rotary" not in type(m).__name__.lower():
            continue
        if ltypes and hasattr(m, f"{ltypes[lr.layer]}_inv_freq"):
            return getattr(m, f"{ltypes[lr.layer]}_inv_freq").float()
        if isinstance(getattr(m, "inv_freq", None), torch.Tensor):
            return m.inv_freq.float()
    raise InputError(f"{type(hf).__name__} has no rotary module with inv_freq")


def check_family(name: str, *, seed: int = 0, workdir: str | Path | None = None) -> FamilyCheck:
    """Load family ``name`` through ``load_model(path)`` and measure ropelens against HF (see module
    doc)."""
    from transformers import AutoModelForCausalLM

    fam = family(name)
    res = FamilyCheck(name)
    with tempfile.TemporaryDirectory(dir=workdir) as tmp:
        path = family_model_dir(name, Path(tmp) / name, seed=seed)
        hf = AutoModelForCausalLM.from_pretrained(path, attn_implementation="eager").eval()
        res.architecture = type(hf).__name__
        try:
            model = load_model(path, device="cpu")
            spec = rope_spec(model)
        except UnsupportedModelError as e:
            res.refusal = str(e)
            return res
        # the probe's verdict; the errors below are measured either way (they show what it caught)
        try:
            verify_model(model, spec)
        except UnsupportedModelError as e:
            res.refusal = str(e)
    res.kinds = spec.kinds
    res.spec_errors = _spec_errors(fam, spec)
    rotary = spec.rotary_layers
    res.layers_checked = rotary
    res.inv_freq_err = max(
        float((lr.inv_freq - hf_inv_freq(hf, lr)).abs().max()) for lr in (spec[i] for i in rotary)
    )

    g = torch.Generator().manual_seed(seed)
    toks = torch.randint(4, VOCAB, (1, N_CHECK), generator=g)
    toks[0, 0] = 1
    with torch.no_grad(), hf_scores(hf) as scores:
        probs = probs_by_layer(hf(toks, output_attentions=True).attentions, spec)
    dec = attention_decomposition(
        model, toks, bands=Bands.all(), layers=rotary, verify=False
    )  # this is the independent check
    res.scores_err = res.pattern_err = res.band_pattern_err = 0.0
    for L in rotary:
        ours = dec.logits(L)
        ok = torch.isfinite(ours)
        if L in scores:
            ref = scores[L]
            res.scores_err = max(
                res.scores_err, float((ours[ok] - ref[ok]).abs().max() / ref[ok].abs().max())
            )
        else:
            res.scores_err = math.nan
        res.pattern_err = max(
            res.pattern_err, float((dec.rebuilt_pattern(L) - probs[L]).abs().max())
        )
        if spec[L].rotary_dim == spec[L].head_dim:
            band = dec.band_patterns(L)[:, :, 0]
            res.band_pattern_err = max(res.band_pattern_err, float((band - probs[L]).abs().max()))

    # One token repeated: every position has the same pre-RoPE query in the first rotary layer (and
    # in later ones unless something position-dependent, such as a sink, reaches them: those are
    # skipped).
    same = torch.full((1, N_CHECK), 7)
    acts = capture_qk(model, same, layers=rotary, which=("q_pre", "q_rot"))
    res.pairing_err = 0.0
    for L in rotary:
        lr, q, pre = (
            spec[L],
            acts[L]["q_rot"][0],
            acts[L]["q_pre"][0],
        )  # [pos, head, d], before a norm after RoPE
        if float((pre - pre[:1]).abs().max()) > 1e-5 * float(pre.abs().max()):
            if rotary[0] != L:
                continue
            # a hybrid's linear-attention layers before the first attention layer mix positions: its
            # pre-RoPE queries differ, so the model's rotation is checked from them (captured before
            # and after it)
            res.pairing_err = max(res.pairing_err, rotation_from_pre(lr, pre, q))
            continue
        res.pairing_err = max(res.pairing_err, rotation_error(lr, q))
    return res
