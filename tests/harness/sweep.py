"""An automatic sweep of every RoPE causal LM in the installed transformers, checked like the family
matrix.

:func:`rope_model_types` lists the causal-LM model types whose modeling code applies rotary
embeddings; :func:`tests.harness.shrink.shrink_config` turns a config class's defaults into a
tiny config that keeps the structure (layer-type patterns, sliding windows cut to at most 8 so a
24-token input is longer than any window, a few experts, the partial rotary factor, MLA ranks scaled
together, NoPE layers, soft-caps) with small widths, a vocabulary of 101 and 2-4 layers holding
every kind of layer, each sub-config of a composite config (DBRX's attention, Moshi's depth decoder,
Mllama's vision tower) shrunk alike; :func:`check_config` measures ropelens on it against HF's eager
attention exactly as :func:`tests.harness.families.check_family` does, and :func:`classify` gives
one status per family: ``exact``, ``refused``, ``wrong`` (ropelens gave a number HF disagrees with:
a bug), ``crashed`` (ropelens raised something other than a refusal: a bug), ``unverified``, ``no
RoPE`` (HF's forward rotates nothing, e.g. Jamba's attention layers, and ropelens says so: not a
RoPE family, though its modeling code defines a rotation) or ``not built`` (where HF's modeling code
failed, and whether HF's own default config fails the same way: a transformers bug, not the
shrinking's).
"""

from __future__ import annotations

import contextlib
import importlib
import inspect
import math
import re
import tempfile
import traceback
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import Tensor

from ropelens.analyses.attention_decomposition import attention_decomposition
from ropelens.errors import InputError, NotRotaryError, UnsupportedModelError
from ropelens.loading.models import load_model
from ropelens.run.capture import capture_qk
from ropelens.run.verify import rotation_error, rotation_from_pre, verify_model
from ropelens.spec import reading
from ropelens.spec.bands import Bands
from ropelens.testing import spread_weights, tiny_tokenizer
from ropelens.testing.families import N_CHECK, VOCAB
from tests.harness.dense import hf_layers
from tests.harness.families import hf_inv_freq, hf_scores, probs_by_layer
from tests.harness.shrink import NotBuilt, describe_config, one_line, shrink_config
from tests.harness.sweep_checks import (
    SweepCheck,
    band_stats_error,
    hf_variant_error,
    report_status,
    usage_error,
    variant_error,
)

__all__ = [
    "NoRope",
    "NotBuilt",
    "SweepRow",
    "SweepTarget",
    "check_config",
    "classify",
    "rope_model_types",
    "save_tiny",
    "shrink_config",
    "sweep_one",
    "table_phase_steps",
]

# float32: captured and HF tensors come from the same ops (errors ~1e-6); a misreading moves them
# O(1)
TOL = 1e-4
MAX_PARAMS = (
    20_000_000  # a shrunk config above this kept a full-size width somewhere: not built, say which
)
_ROPE_SOURCE = re.compile(r"apply_rotary_pos_emb|rotary_emb|RotaryEmbedding")
_SHARPEN = (
    "q_proj",
    "k_proj",
    "qkv",
    "query_key_value",
    "q_a_proj",
    "q_b_proj",
    "kv_a_proj",
    "kv_b_proj",
    "Wqkv",
    "c_attn",
    ".wq",
    ".wk",
    "query",
    "key",
)


# Roles of config keys (the canonical names to_dict writes; older families keep their own).
class NoRope(Exception):
    """HF's model of this type rotates nothing in its forward, and ropelens says it is not rotary:
    not a RoPE family."""


@dataclass(frozen=True)
class SweepTarget:
    """One causal-LM model type whose modeling code applies rotary embeddings."""

    model_type: str
    model_class: str
    module: str
    text_of: str | None = None  # the composite model type whose text tower this is


@dataclass
class SweepRow:
    """One family's sweep result: its status, the reason or the measured errors, and the structure
    kept."""

    model_type: str
    status: str  # exact | refused | wrong | crashed | unverified | no RoPE | not built
    detail: str = ""
    architecture: str = ""
    structure: str = ""
    kinds: dict[str, list[int]] = field(default_factory=dict)
    errors: dict[str, float] = field(default_factory=dict)
    seconds: float = 0.0
    report: str = ""  # "ok", or what stopped `ropelens report --quick` (only when asked for)


def _module_source(module: str) -> str:
    try:
        return inspect.getsource(importlib.import_module(module))
    except (ImportError, OSError, TypeError):
        return ""


def rope_model_types(only: set[str] | None = None) -> list[SweepTarget]:
    """Every model type of MODEL_FOR_CAUSAL_LM_MAPPING_NAMES (or of ``only``) whose modeling module
    applies RoPE."""
    import transformers
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    out = []
    for mt, cls_name in sorted(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.items()):
        if only is not None and mt not in only:
            continue
        try:
            cls = getattr(transformers, cls_name)
        except (AttributeError, ImportError):
            continue
        if _ROPE_SOURCE.search(_module_source(cls.__module__)):
            out.append(SweepTarget(mt, cls_name, cls.__module__))
    return out


# ------------------------------------------------------------------------------------ shrinking
def _hf_model(config, seed: int):
    """The tiny HF model of ``config`` (eager, float32, q/k weights ×4 so attention is far from
    uniform)."""
    from transformers import AutoModelForCausalLM

    try:
        with torch.random.fork_rng():
            torch.manual_seed(seed)
            model = AutoModelForCausalLM.from_config(
                config, attn_implementation="eager", dtype=torch.float32
            )
    except Exception as e:
        raise NotBuilt(_init_failure(config, e)) from None
    n = sum(p.numel() for p in model.parameters())
    if n > MAX_PARAMS:
        big = max(model.named_parameters(), key=lambda kv: kv[1].numel())
        raise NotBuilt(
            f"{n / 1e6:.0f}M parameters after shrinking (largest: {big[0]} {tuple(big[1].shape)})"
        )
    spread_weights(model, seed)
    with torch.no_grad():
        for pname, p in model.named_parameters():
            if p.ndim == 2 and any(s in pname for s in _SHARPEN):
                p.mul_(4.0)
        g = torch.Generator().manual_seed(seed + 2)
        for m in (
            model.modules()
        ):  # learned sinks start at 0 (Granite SWA): spread, so a sign or a sink misplaced shows
            if isinstance(getattr(m, "sinks", None), torch.nn.Parameter):
                m.sinks.copy_(torch.randn(m.sinks.shape, generator=g) * 2)
    return model.eval()


def save_tiny(model_type: str, path: str | Path, *, seed: int = 0) -> Path:
    """Save the sweep's tiny random model of ``model_type`` (:func:`shrink_config`, attention
    sharpened) and a tokenizer to ``path``, for ``ropelens.load_model(path)``; raises
    :class:`NotBuilt` where HF cannot build it."""
    path = Path(path)
    config = shrink_config(model_type)
    _save(_hf_model(config, seed), config, path)
    tiny_tokenizer().save_pretrained(path)
    return path


def _save(model, config, path: Path) -> None:
    """Save ``model`` with ``config``: a text tower built alone from a composite config (Mllama,
    Emu3) keeps the composite config.json, the one its checkpoints carry and the only one
    AutoModelForCausalLM maps to its class."""
    model.save_pretrained(path)
    if type(model.config) is not type(config):
        config.architectures = [type(model).__name__]
        config.save_pretrained(path)


def _init_failure(config, e: BaseException) -> str:
    """Why HF cannot build ``config``'s model, in one line: where its modeling code failed, and
    whether its config class's own defaults fail the same way (a transformers bug, not the
    shrinking's) or build (the shrinking's)."""
    from transformers import AutoModelForCausalLM

    frames = [
        f
        for f in traceback.extract_tb(e.__traceback__)
        if "/transformers/models/" in f.filename.replace("\\", "/")
    ]
    code = (frames[-1].line or "").strip() if frames else ""
    where = (
        f" at {Path(frames[-1].filename).name}:{frames[-1].lineno} `{code[:120]}`" if frames else ""
    )
    try:
        default = type(config)()
        with torch.device("meta"):  # full size, no memory: only whether it builds
            AutoModelForCausalLM.from_config(default, attn_implementation="eager")
    except Exception as d_e:
        if one_line(d_e) != one_line(e):
            return (
                f"model init fails: {one_line(e)}{where}; HF's default config fails too: "
                f"{one_line(d_e)}"
            )
        unset = [
            f"{k}={v!r}"
            for k in dict.fromkeys(re.findall(r"config\.(\w+)", code))
            if (v := getattr(default, k, 0)) is None or v in ({}, [])
        ]  # the defaults' unset fields it reads
        return (
            f"HF's default config does not build: {type(config).__name__}() → {one_line(e)}{where}"
            + (f" (default {', '.join(unset)})" if unset else "")
        )
    return (
        f"model init fails: {one_line(e)}{where} (HF's default config builds: the shrinking "
        "broke it)"
    )


def _reference_run(
    config, seed: int, path: Path, tokens: Tensor
) -> tuple[torch.nn.Module, dict, tuple, list[str]]:
    """Save ``config``'s tiny HF model at ``path``, reload it and run it on ``tokens`` (eager).

    Returns the reloaded model, its scores by layer, its attention probabilities and the rotations
    its forward applied. Raises :class:`NotBuilt` when HF cannot build, save, reload or run it.
    """
    # transformers is imported where a model is built: importing the sweep stays light
    from transformers import AutoModelForCausalLM

    try:
        _save(_hf_model(config, seed), config, path)
        tiny_tokenizer().save_pretrained(path)
        hf = AutoModelForCausalLM.from_pretrained(
            path, attn_implementation="eager", dtype=torch.float32
        ).eval()
        with torch.no_grad(), hf_scores(hf) as scores, _hf_rotations(hf) as rotations:
            probs = hf(tokens, output_attentions=True).attentions
    except NotBuilt:
        raise
    except Exception as e:
        raise NotBuilt(f"HF save/reload/forward fails: {one_line(e)}") from None
    return hf, scores, probs, rotations


def _load_and_verify(result: SweepCheck, hf, path: Path, rotations: list[str]) -> tuple | None:
    """``(model, spec)`` loaded by ropelens, its probe's verdict in ``result``; None on a refusal.

    Raises :class:`NoRope` where HF and ropelens agree that the model applies no rotary embedding.
    """
    try:
        model = load_model(path, device="cpu")
        spec = reading.rope_spec(model)
    except NotRotaryError as e:
        if not rotations:  # HF agrees: the forward calls no rotation and runs no rotary module
            raise NoRope(
                result.architecture,
                f"HF's forward applies no rotary embedding ({_no_rotation(hf)}); ropelens agrees: "
                f"{str(e).split(':')[0]}",
            ) from None
        # HF rotates and ropelens says it does not: a refusal, shown as one
        result.refusal = str(e)
        return None
    except UnsupportedModelError as e:  # ropelens's one-line refusal
        result.refusal = str(e)
        return None
    # the probe's verdict; the errors measured after it are measured either way (they show what it
    # caught)
    try:
        verify_model(model, spec)
    except UnsupportedModelError as e:
        result.refusal = str(e)
    return model, spec


def _score_errors(
    result: SweepCheck, decomposition, hf_scores_by_layer: dict, hf_probs: dict, rotary: list[int]
) -> None:
    """Set ``result``'s score and pattern errors: ropelens's logits and pattern against HF's."""
    result.scores_err = result.pattern_err = 0.0
    for layer in rotary:
        ours = decomposition.logits(layer)
        finite = torch.isfinite(ours)
        reference = hf_scores_by_layer.get(layer)
        if reference is not None and reference.shape == ours.shape:
            error = (ours[finite] - reference[finite]).abs().max() / reference[finite].abs().max()
            result.scores_err = max(result.scores_err, float(error))
        else:
            result.scores_err = math.nan
        reference_probs = hf_probs.get(layer)
        if reference_probs is None or reference_probs.shape != ours.shape:
            result.pattern_err = math.nan
            continue
        error = (decomposition.rebuilt_pattern(layer) - reference_probs).abs().max()
        result.pattern_err = max(result.pattern_err, float(error))


def _pairing_error(model, spec, rotary: list[int]) -> float:
    """The largest rotation error of one token repeated, as in ``check_family``.

    Layers whose pre-RoPE queries vary with position are skipped, except a first rotary layer
    after a hybrid's linear-attention layers (they mix positions): its rotation is checked from
    its pre-RoPE queries, captured before and after it.
    """
    same = torch.full((1, N_CHECK), 7)
    acts = capture_qk(model, same, layers=rotary, which=("q_pre", "q_rot"))
    error = 0.0
    for layer in rotary:
        lr = spec[layer]
        # before a norm after RoPE
        rotated, pre = acts[layer]["q_rot"][0], acts[layer]["q_pre"][0]
        if float((pre - pre[:1]).abs().max()) > 1e-5 * float(pre.abs().max()):
            if rotary[0] == layer:
                error = max(error, rotation_from_pre(lr, pre, rotated))
            continue
        error = max(error, rotation_error(lr, rotated))
    return error


def check_config(
    name: str, config, *, seed: int = 0, workdir: str | Path | None = None, report: bool = False
) -> SweepCheck:
    """Save ``config``'s tiny model, load it with ``load_model(path)``, measure ropelens against HF.

    The measurements are :func:`tests.harness.families.check_family`'s (rotary buffers, eager
    scores, probabilities, rotation of one token repeated), without a hand-written expected
    structure: every reference number is HF's own; then frequency usage and band statistics against
    dense references from HF's attention inputs, and a RoPE variant with its exact restore
    (:mod:`tests.harness.sweep_checks`). An error that cannot be taken (HF's attention has no
    ``eager_attention_forward``, no rotary module with ``inv_freq``) stays NaN. Raises
    :class:`NotBuilt` when HF itself cannot build, save, reload or run the model.
    """
    result = SweepCheck(name)
    generator = torch.Generator().manual_seed(seed)
    tokens = torch.randint(4, VOCAB, (1, N_CHECK), generator=generator)
    tokens[0, 0] = 1
    with tempfile.TemporaryDirectory(dir=workdir) as tmp:
        hf, scores, probs, rotations = _reference_run(config, seed, Path(tmp) / name, tokens)
        result.architecture = type(hf).__name__
        loaded = _load_and_verify(result, hf, Path(tmp) / name, rotations)
    if loaded is None:
        return result
    model, spec = loaded
    result.kinds = spec.kinds
    rotary = spec.rotary_layers
    result.layers_checked = rotary
    if not rotary:
        return result
    result.inv_freq_err = _inv_freq_err(hf, spec, rotary)
    try:  # an analysis refusing in one line is a refusal too
        decomposition = attention_decomposition(
            model, tokens, bands=Bands.all(), layers=rotary, verify=False
        )
    except UnsupportedModelError as e:
        result.refusal = str(e)
        return result
    hf_probs = _with_hf_sinks(hf, probs_by_layer(probs, spec), scores)
    _score_errors(result, decomposition, scores, hf_probs, rotary)
    result.pairing_err = _pairing_error(model, spec, rotary)
    try:  # the analyses past the logits; one refusing in one line is a refusal
        result.usage_err = usage_error(model, spec, hf, hf_layers(hf, tokens), tokens, rotary)
        result.band_stats_err = band_stats_error(model, spec, hf, tokens, rotary)
    except UnsupportedModelError as e:
        result.refusal = str(e)
        return result
    result.variant_err, result.restore_err, result.variant_note = variant_error(
        model, spec, tokens, rotary
    )
    if not result.variant_note:
        result.hf_variant_err, result.hf_variant_note = hf_variant_error(model, spec, hf, tokens)
    if report:
        result.report = report_status(model)
    return result


@contextlib.contextmanager
def _hf_rotations(hf) -> Iterator[list[str]]:
    """Every rotation HF's forward applies, by name: calls of its modeling module's
    ``apply_rotary*`` functions and forwards of its rotary modules (a family that builds no rotary
    module and calls no rotation rotates nothing)."""
    mod = importlib.import_module(type(hf).__module__)
    seen: list[str] = []
    fns = {n: f for n, f in vars(mod).items() if n.startswith("apply_rotary") and callable(f)}

    def counted(name: str, fn):
        def call(*args, **kwargs):
            seen.append(name)
            return fn(*args, **kwargs)

        return call

    handles = [
        m.register_forward_hook(lambda m, _a, _o: seen.append(type(m).__name__))
        for m in hf.modules()
        if "rotary" in type(m).__name__.lower()
    ]
    for n, f in fns.items():
        setattr(mod, n, counted(n, f))
    try:
        yield seen
    finally:
        for n, f in fns.items():
            setattr(mod, n, f)
        for h in handles:
            h.remove()


def _no_rotation(hf) -> str:
    """What a non-rotating HF model has that looks rotary (why its modeling code matched), in a few
    words."""
    mod = importlib.import_module(type(hf).__module__)
    fns = sorted(n for n in vars(mod) if n.startswith("apply_rotary"))
    return (
        f"{', '.join(fns)} defined, never called" if fns else "no rotary module, no rotation called"
    )


def _with_hf_sinks(
    hf, probs: dict[int, torch.Tensor], scores: dict[int, torch.Tensor]
) -> dict[int, torch.Tensor]:
    """HF's probabilities as its values see them: where a layer's learned sinks are left out of the
    probabilities it returns (rows summing to 1) and scale its output after the softmax instead
    (Granite SWA), times HF's own factor ``sigmoid(logsumexp(scores) − sink)``, the log-sum-exp over
    the allowed keys read at each row's largest entry (``p = exp(s − lse)`` there)."""
    sinks = {
        m.layer_idx: m.sinks.detach().float()
        for m in hf.modules()
        if isinstance(getattr(m, "sinks", None), torch.Tensor)
        and isinstance(getattr(m, "layer_idx", None), int)
    }
    out = dict(probs)
    for L, p in probs.items():
        if L not in sinks or L not in scores or scores[L].shape != p.shape:
            continue
        if (
            float((p.sum(-1) - 1).abs().max()) > 1e-5
        ):  # the sink's mass is in the probabilities already (gpt-oss)
            continue
        top = p.argmax(-1, keepdim=True)
        lse = (scores[L].gather(-1, top) - p.gather(-1, top).log()).squeeze(-1)
        out[L] = p * torch.sigmoid(lse - sinks[L].view(1, -1, 1)).unsqueeze(-1)
    return out


def table_phase_steps(table: torch.Tensor, n_pos: int = N_CHECK) -> torch.Tensor:
    """Each plane's angle step from position m to m + 1 (m < ``n_pos``) in a ``[n_pos, 2·half]``
    sin|cos table.

    GPT-J and CodeGen keep no ``inv_freq``: their attention holds ``embed_positions``, the table
    ``[sin(m·θ) | cos(m·θ)]`` that HF's ``create_sinusoidal_positions`` builds and the forward
    reads. The angle of ``z(m+1)·conj(z(m))`` with ``z = cos + i·sin`` is the step the model rotates
    a plane by at each of the positions the check runs at: every row equals θ for a rotation at one
    frequency.
    """
    half = table.shape[1] // 2
    t = table[: n_pos + 1].double()
    z = torch.complex(t[:, half:], t[:, :half])
    return torch.angle(z[1:] * z[:-1].conj())


def _hf_tables(hf) -> list[torch.Tensor]:
    return [
        m.embed_positions
        for m in hf.modules()
        if isinstance(getattr(m, "embed_positions", None), torch.Tensor)
        and m.embed_positions.ndim == 2
    ]


def _inv_freq_err(hf, spec, rotary: list[int]) -> float:
    """The spec's frequencies against HF's: its rotary buffers, else the phase steps of its sin|cos
    tables."""
    try:
        return max(float((spec[i].inv_freq - hf_inv_freq(hf, spec[i])).abs().max()) for i in rotary)
    except (
        InputError,
        RuntimeError,
    ):  # HF keeps no inv_freq buffer (or one of another width) to compare with
        pass
    tables = _hf_tables(hf)
    if not tables:
        return math.nan
    err = 0.0
    for i in rotary:  # one table per attention layer (GPT-J, CodeGen), else one for the model
        steps = table_phase_steps(tables[i] if len(tables) == spec.n_layers else tables[0])
        if steps.shape[1] != spec[i].inv_freq.numel():
            return math.nan
        # float32 table: m·θ rounds to ~m·θ·6e-8 ≤ 2e-6 rad for m ≤ 24, so a match is ~1e-6 and a
        # misread θ is O(θ)
        err = max(err, float((steps - spec[i].inv_freq.double()).abs().max()))
    return err


_ERRORS = (
    "inv_freq_err",
    "scores_err",
    "pattern_err",
    "pairing_err",
    "usage_err",
    "band_stats_err",
    "variant_err",
    "restore_err",
    "hf_variant_err",
)


def classify(check: SweepCheck) -> tuple[str, str]:
    """One status and its detail: ``refused`` (the refusal's first line), ``exact``, ``wrong`` or
    ``unverified``.

    A variant that rotates off its spec or does not restore the logits bit for bit is ``wrong``; a
    model without variants (a plain HF model, a one-line refusal) is not a fault: its note is the
    detail."""
    if check.refusal is not None:
        return "refused", check.refusal.strip().splitlines()[0]
    errs = {k: getattr(check, k, math.nan) for k in _ERRORS}
    tol = {"restore_err": 0.0}  # leaving the variant must give back the very same bits
    bad = {k: v for k, v in errs.items() if not math.isnan(v) and v > tol.get(k, TOL)}
    if bad:
        return "wrong", ", ".join(f"{k} {v:.2e}" for k, v in bad.items())
    if not check.layers_checked:
        return "unverified", "no rotary layer read"
    note = getattr(check, "variant_note", "")
    # the HF rope-type reference exists only where HF's config takes another rope type for these
    # layers
    missing = [
        k
        for k, v in errs.items()
        if math.isnan(v)
        and k != "hf_variant_err"
        and not (note and k in ("variant_err", "restore_err"))
    ]
    if missing:
        return "unverified", "HF gave no reference for " + ", ".join(missing)
    return "exact", "; ".join(x for x in (note, getattr(check, "hf_variant_note", "")) if x)


def sweep_one(
    model_type: str, *, seed: int = 0, workdir: str | Path | None = None, report: bool = False
) -> SweepRow:
    """Shrink, build and check ``model_type``; every outcome becomes a row (ropelens's own errors as
    ``crashed``)."""
    row = SweepRow(model_type, "not built")
    try:
        cfg = shrink_config(model_type)
        row.structure = describe_config(cfg)
        check = check_config(model_type, cfg, seed=seed, workdir=workdir, report=report)
    except NotBuilt as e:
        row.detail = str(e)
        return row
    except NoRope as e:
        row.status, (row.architecture, row.detail) = "no RoPE", e.args
        return row
    except Exception as e:
        row.status, row.detail = "crashed", one_line(e)
        return row
    row.architecture = check.architecture
    row.status, row.detail = classify(check)
    row.kinds = check.kinds
    row.errors = {k: getattr(check, k) for k in _ERRORS}
    row.report = check.report
    if (
        report and check.report != "ok" and row.status == "exact"
    ):  # an exact family whose report does not build
        row.status, row.detail = "crashed", f"report: {check.report}"
    return row
