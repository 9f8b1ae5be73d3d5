"""Read the RoPE a running model applies, from the HF modules under its bridge.

Frequencies come from the rotary modules' ``inv_freq`` buffers, the score scale from the attention
modules, layer kinds and windows from the config's ``layer_types``; never from the bridge's
``cfg.rotary_base``, which is wrong for real models.
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import math
import numbers
from collections.abc import Callable
from typing import Any

import torch

from ropelens.devices import device_of
from ropelens.errors import InputError, NotRotaryError, UnsupportedModelError
from ropelens.spec.attention_fields import (
    heads_of,
    jsonable,
    kv_heads_of,
    layer_config,
    output_gate,
    plane_axes,
    query_scale,
    sinks_of,
    softcap_of,
    uses_rope,
)
from ropelens.spec.forward_taps import (
    attention_tap,
    complex_positions_axis,
    layer_taps,
    probe_forward,
    rotation_functions,
)
from ropelens.spec.observed import measure_query_factors, observe_rotations
from ropelens.spec.plan import active_plan, spec_as_run
from ropelens.spec.rope import LayerRope, RopeSpec
from ropelens.spec.rotary_state import rotary_modules as _rotary_modules
from ropelens.spec.rotary_state import rotary_state_kept
from ropelens.spec.surface import (
    bridge_refusal,
    declared_adjacent_pairs,
    drop_wrapper_forward,
    running_model,
)
from ropelens.validate import check_positive_int

__all__ = [
    "hf_model_of",
    "is_mla",
    "model_label",
    "refuse_bad_base",
    "rope_spec",
    "unmodified_spec",
]


def model_label(model) -> str:
    """The name a model was loaded under (embedded name, path or hub id), read from
    ``model.cfg.model_name``."""
    # ropelens.loading.models keeps the name on the config, as TransformerLens does; a bridge booted
    # elsewhere carries the checkpoint name TransformerLens put there.
    return str(getattr(getattr(model, "cfg", None), "model_name", None) or "model")


def hf_model_of(model):
    """The HF module under a bridge (or the module itself if it is already an HF model)."""
    hf = getattr(model, "original_model", None)
    if hf is None and hasattr(model, "config"):
        hf = model
    if hf is None:
        raise TypeError(
            f"expected a TransformerBridge from ropelens.load_model, got {type(model).__name__}"
        )
    return hf


def _text_config(hf) -> Any:
    cfg = hf.config
    return cfg.get_text_config() if hasattr(cfg, "get_text_config") else cfg


def _blocks(model):
    """The bridge's blocks, or a plain HF model's decoder layers in their shape
    (``.attn.original_component``)."""
    blocks = getattr(model, "blocks", None)
    return blocks if blocks is not None else getattr(model, "attention_blocks", None)


def _attention_modules(model) -> list[torch.nn.Module | None]:
    """Each block's HF attention module, None for the layers of a hybrid that have no softmax
    attention."""
    blocks = _blocks(model)
    if blocks is None:
        raise TypeError(
            "expected a TransformerBridge with .blocks; load the model with ropelens.load_model"
        )
    return [b.attn.original_component if hasattr(b, "attn") else None for b in blocks]


# "hybrid": Falcon-H1's layers, softmax attention (causal, no window) beside a Mamba mixer
# "indexed_attention": DeepSeek sparse attention, causal with the top-k keys an indexer picks
# (LayerRope.select_keys) "chunked_attention": Llama 4's rotary layers, causal within chunks of
# attention_chunk_size tokens (LayerRope.chunk)
_KIND = {
    "sliding_attention": "sliding",
    "full_attention": "full",
    "hybrid": "full",
    "indexed_attention": "full",
    "chunked_attention": "chunked",
}
# (a piece of the HF class name, the spec's kind) of the token mixers hybrid models put beside or
# instead of softmax attention; a layer without attention that matches none is kind "none"
_MIXERS = (
    ("gateddeltanet", "linear"),
    ("linearattention", "linear"),
    ("lightningattention", "linear"),  # MiniMax
    (
        "deltaattention",
        "linear",
    ),  # Bailing and Kimi Linear: Kimi delta attention, a linear attention
    ("mamba", "mamba"),
    ("mixer", "mamba"),
    ("shortconv", "conv"),
    ("recurrentblock", "recurrent"),
    ("rglru", "recurrent"),
)


def is_token_mixer(name: str) -> bool:
    """Whether an HF class name is a hybrid's token mixer (linear attention, Mamba, convolution,
    recurrence)."""
    return any(key in name.lower() for key, _ in _MIXERS)


def _is_softmax_attention(
    name: str,
) -> bool:  # over the tokens themselves: cross-attention (Mllama's) is not
    return (
        name.endswith("Attention")
        and not is_token_mixer(name)
        and "crossattention" not in name.lower()
    )


def _mixer(layer: torch.nn.Module | None) -> tuple[str, str] | None:
    """(kind, HF class) of the token mixer an HF decoder layer runs instead of or beside softmax
    attention."""
    for child in layer.children() if layer is not None else ():
        child = (
            getattr(child, "original_component", None) or child
        )  # the HF module under a bridge component
        name = type(child).__name__
        kind = next((k for key, k in _MIXERS if key in name.lower()), None)
        if kind is not None and not _is_softmax_attention(name):
            return kind, name
    return None


def softmax_attention_in(layer: torch.nn.Module | None) -> str | None:
    """The class of a softmax-attention module anywhere in an HF decoder layer (RecurrentGemma's,
    Zamba 2's), or None."""
    for m in layer.modules() if layer is not None else ():
        if _is_softmax_attention(type(m).__name__):
            return type(m).__name__
    return None


def _masks_window(hf) -> bool:
    """Whether HF's modeling code builds a sliding-window mask (Moshi's config names a window its
    mask never applies)."""
    try:
        return "sliding_window_causal_mask" in inspect.getsource(
            importlib.import_module(type(hf).__module__)
        )
    except (
        OSError,
        TypeError,
    ):  # no source to read: the config's window is taken, as before, and the probe checks it
        return True


def _refuse_unsupported(model, cfg, arch: str) -> None:
    """Raise UnsupportedModelError for structures ropelens cannot measure exactly (never a wrong
    number)."""
    why = bridge_refusal(
        model, arch, chunked=CHUNKED_WHY if is_chunked(cfg) else None, mla=is_mla(cfg)
    )
    if why is not None:
        raise UnsupportedModelError(why)
    if any(hasattr(m, "lambda_init") for m in hf_model_of(model).modules()):
        raise UnsupportedModelError(
            f"{arch}: differential attention is not supported: each head's output is "
            "softmax(q1·k1) − λ·softmax(q2·k2) over two heads, so no head's attention is the "
            "softmax of its own scores that ropelens's patterns, band statistics and heads "
            "describe."
        )
    if isinstance(getattr(cfg, "H_cycles", None), int) and isinstance(
        getattr(cfg, "L_cycles", None), int
    ):
        raise UnsupportedModelError(
            f"{arch}: its two layer stacks run recurrently ({cfg.H_cycles} high-level cycles of "
            f"{cfg.L_cycles} low-level ones), so each layer attends several times per forward; "
            "ropelens measures a layer once."
        )
    loops = getattr(cfg, "n_recurrent_loops", None)
    if isinstance(loops, int) and loops > 1 and getattr(cfg, "n_recurrent_layers", None):
        first = int(getattr(cfg, "n_input_layers", 0) or 0)
        raise UnsupportedModelError(
            f"{arch}: its recurrent section (layers "
            f"{first}..{first + int(cfg.n_recurrent_layers) - 1}) runs {loops} times per forward "
            f"(n_recurrent_loops), so each of those layers attends {loops} times; ropelens "
            "measures a layer once."
        )
    blocks = _blocks(model) or []
    for i, b in enumerate(blocks):
        hidden = (
            None
            if hasattr(b, "attn")
            else softmax_attention_in(getattr(b, "original_component", None))
        )
        if hidden is not None:
            raise UnsupportedModelError(
                f"{arch}: layer {i}'s softmax attention ({hidden}) is wrapped whole by its "
                "TransformerLens adapter, which exposes no hooks for its queries and keys, so "
                "ropelens cannot capture them."
            )
    attns = [getattr(getattr(b, "attn", None), "original_component", None) for b in blocks]
    if getattr(cfg, "use_bidirectional_attention", None) in (True, "all"):
        raise UnsupportedModelError(
            f"{arch}: use_bidirectional_attention={cfg.use_bidirectional_attention!r}: every "
            "token attends both ways (an embedding model); ropelens measures causal attention "
            "only."
        )
    types = getattr(cfg, "layer_types", None) or ()
    shared = [i for i, a in enumerate(attns) if getattr(a, "is_kv_shared_layer", False)]
    why = bridge_refusal(
        model, arch, kv_shared=shared
    )  # the plain HF model takes them from the layer that stored them
    if why is not None:
        raise UnsupportedModelError(why)
    # Inkling's attention (hybrid_sliding and hybrid layers alike): its mask is causal or
    # sliding-window, but a learned relative-position bias and a per-token sink logit join q·k
    # before the softmax, and its text tower never rotates
    biased = sorted({type(m).__name__ for m in hf_model_of(model).modules() if _relative_bias(m)})
    if biased:
        why = (
            f"position enters its scores ({', '.join(biased)}) only as a learned "
            "relative-position bias, mixed per backward distance from each query's hidden "
            "state, added to q·k beside a per-token sink logit"
        )
        if not _rotary_modules(hf_model_of(model)):
            raise NotRotaryError(
                f"{arch} applies no RoPE to its text queries and keys: {why}, so there is no "
                "rotation for ropelens to measure."
            )
        raise UnsupportedModelError(
            f"{arch}: {why.replace(' only', '')}, so its scores are not q·k times one scale."
        )
    compressed = sorted({t for t in types if "compressed" in str(t)})
    if compressed and getattr(cfg, "compress_rates", None):  # DeepSeek V4
        raise UnsupportedModelError(
            f"{arch}: its {', '.join(compressed)} layers attend to compressed keys, each pooled "
            "by a learned compressor over a block of tokens (compress_rates "
            f"{dict(cfg.compress_rates)}) beside a sliding window, so a key is not one "
            "position's rotated key and no logit is one (query, key-position) q·k to decompose."
        )
    # the layer types of attention layers only: a hybrid's other layers have no mask to read
    types = {
        t for t, b in zip(getattr(cfg, "layer_types", None) or (), blocks) if hasattr(b, "attn")
    }
    unknown = types - set(_KIND)
    if unknown:
        raise UnsupportedModelError(
            f"{arch}: layer types {sorted(unknown)} are not supported (ropelens knows "
            f"{sorted(_KIND)}): their attention masks differ from causal and sliding-window "
            "masks."
        )


def _relative_bias(m: torch.nn.Module) -> bool:
    """Whether an attention module adds a learned relative-position bias to q·k: Inkling's, kept as
    ``rel_logits_proj`` up to transformers 5.23 and as a ``RelativePositionBias`` submodule since
    5.24."""
    return isinstance(getattr(m, "rel_logits_proj", None), torch.nn.Module) or (
        _is_softmax_attention(type(m).__name__)
        and any("relativepositionbias" in type(c).__name__.lower() for c in m.children())
    )


def _passed_query_scale(attn, cfg, layer_type: str | None) -> bool:
    """Whether a layer's attention takes a query factor the model passes in (Beam's NoPE layers:
    ``rope_parameters`` None for their layer type, and an ``attention_scaling`` argument in the
    attention's forward)."""
    rp = getattr(cfg, "rope_parameters", None)
    return (
        isinstance(rp, dict)
        and layer_type in rp
        and rp[layer_type] is None
        and "attention_scaling" in inspect.signature(type(attn).forward).parameters
    )


def _select_keys(attn: torch.nn.Module, cfg, arch: str, layer: int) -> int:
    """The keys a query of an indexed-attention layer keeps (:attr:`LayerRope.select_keys`): its
    indexer's ``index_topk`` (DeepSeek sparse attention; a layer reusing an earlier layer's
    selection has no indexer of its own: the config's), or a block indexer's token budget plus the
    tail of an incomplete block (Qwen4-Exp's QSA: ``token_budget`` in whole blocks of
    ``compress_ratio``, and the last ``compress_ratio − 1`` keys always kept). The probe checks it
    on the model's own mask."""
    indexer = getattr(attn, "indexer", None)
    k = getattr(indexer, "index_topk", None) or getattr(cfg, "index_topk", None)
    budget, ratio = getattr(indexer, "token_budget", None), getattr(indexer, "compress_ratio", None)
    if k is None and isinstance(budget, int) and isinstance(ratio, int) and ratio >= 1:
        k = budget + ratio - 1
    if not isinstance(k, int) or k < 1:
        raise UnsupportedModelError(
            f"{arch}: layer {layer} is an indexed-attention layer but neither its indexer nor "
            "its config gives the number of keys each query keeps (index_topk): ropelens cannot "
            "say which keys its softmax runs over"
        )
    return k


# why a model with chunked attention runs without the bridge (ropelens.loading.models says it when
# loading one)
CHUNKED_WHY = (
    "TransformerLens's Llama 4 adapter runs HF's attention whole and fires no hook on its "
    "rotated queries and keys (hook_rot_q), so the probe could not check the rotation against "
    "the model's own"
)


def is_chunked(cfg) -> bool:
    """Whether ``cfg`` has chunked-attention layers (Llama 4: ``layer_types`` "chunked_attention",
    ``attention_chunk_size``)."""
    return "chunked_attention" in (getattr(cfg, "layer_types", None) or ()) and bool(
        getattr(cfg, "attention_chunk_size", None)
    )


def is_mla(cfg) -> bool:
    """Whether ``cfg`` is multi-head latent attention (DeepSeek V2/V3 style: a decoupled rotary part
    per head)."""
    if getattr(
        cfg, "is_heterogeneous", False
    ):  # per-layer widths (Dots 3): HF raises on a global read of them
        cfg = cfg.per_layer_config[0]
    return (
        bool(getattr(cfg, "qk_rope_head_dim", None))
        and getattr(cfg, "qk_nope_head_dim", None) is not None
    )


def _mla_layout(hf, cfg, called: str | None = None) -> dict[str, Any]:
    """What an MLA layer's spec differs in: the rotary slice after the no-position dims, the plane
    layout the model's rotation writes (DeepSeek V2's complex product: adjacent pairs; V3's
    ``rope_interleave``: adjacent pairs read, halves written), and the key's rotary part shared by
    every head. ``called``: the rotation the attention modules were seen calling
    (:func:`_called_rotation`), which decides where it is known."""
    mod = importlib.import_module(type(hf).__module__)
    complex_rot = not hasattr(mod, "apply_rotary_pos_emb") and hasattr(
        mod, "apply_rotary_emb"
    )  # DeepSeek V2
    # interleaved where the attention calls the interleaved rotation (DeepSeek V3.2 always does; its
    # indexer calls the other one), else where the config says so, or where it is the only one the
    # module has (LongCat-Flash, Bailing: no rope_interleave flag, and every call is the interleaved
    # one)
    interleave = (
        called == "apply_rotary_pos_emb_interleave"
        if called is not None
        else (
            hasattr(mod, "apply_rotary_pos_emb_interleave")
            and (
                bool(getattr(cfg, "rope_interleave", False))
                or not hasattr(mod, "apply_rotary_pos_emb")
            )
        )
    )
    return {
        "rotary_offset": int(cfg.qk_nope_head_dim),
        "pre_interleaved": interleave and not complex_rot,
        "shared_rotary_key": True,
        "adjacent": complex_rot,
    }


def _layer_rope_params(cfg, layer_type: str | None) -> dict[str, Any]:
    rp = getattr(cfg, "rope_parameters", None) or {}
    if layer_type is not None and isinstance(rp.get(layer_type), dict):
        rp = rp[layer_type]
    return dict(rp)


def _inv_freq_for(rotaries, attn, layer_type: str | None) -> tuple[torch.Tensor, float]:
    """inv_freq and attention scaling that this layer's rotary module applies."""
    candidates = [attn, *rotaries]
    # the layer type's own buffers first, wherever they are: a multimodal model's vision rotary
    # (Gemma 4) comes before the text tower's and holds a plain inv_freq of its own
    for prefix in [f"{layer_type}_"] if layer_type else []:
        for mod in candidates:
            inv = getattr(mod, f"{prefix}inv_freq", None)
            if isinstance(inv, torch.Tensor):
                return inv.detach().float().cpu().clone(), float(
                    getattr(mod, f"{prefix}attention_scaling", 1.0)
                )
    for mod in candidates:
        for prefix in [""]:
            inv = getattr(mod, f"{prefix}inv_freq", None)
            if isinstance(inv, torch.Tensor):
                scaling = getattr(mod, f"{prefix}attention_scaling", 1.0)
                return inv.detach().float().cpu().clone(), float(scaling)
        rot = getattr(mod, "rotary_emb", None)
        if isinstance(rot, torch.nn.Module) and isinstance(
            getattr(rot, "inv_freq", None), torch.Tensor
        ):
            return rot.inv_freq.detach().float().cpu().clone(), float(
                getattr(rot, "attention_scaling", 1.0)
            )
    raise _NoBuffer


class _NoBuffer(Exception):
    """No module the layer reaches holds an ``inv_freq`` buffer: its rotation is measured
    instead."""


def _observed_rope(model, attns, layer: int, arch: str):
    """(inv_freq, attention scaling, pairing, direction) of ``layer`` measured from the rotation its
    attention calls in one short forward (:mod:`ropelens.spec.observed`), for a family that keeps no
    ``inv_freq`` buffer where ropelens looks (GPT-J and CodeGen hand their rotation sin|cos tables,
    kept on the attention up to transformers 5.23 and on a model-level module since 5.24); None for
    a layer whose attention calls no rotation while others do."""
    seen = observe_rotations(model, attns, _hf_tree(hf_model_of(model)), device_of(model))
    if seen is None:
        raise NotRotaryError(
            f"{arch}: no rotary module holds inv_freq, and a short forward of the HF model, run "
            "to observe the rotation its attention calls, failed: ropelens cannot read its "
            "frequencies"
        )
    if not seen:
        raise NotRotaryError(
            f"{arch}: no rotary module holds inv_freq, and in a short forward no attention layer "
            "called a rotation (an apply_rotary* function of its modeling module): it applies "
            "no RoPE that ropelens can see"
        )
    obs = seen.get(layer)
    if obs is None:
        return None
    differs = obs.differs()
    if differs is not None:
        # a table holding NaN or inf turns no plane right: named as such, not as a pairing
        _refuse_bad_rotary_buffers(hf_model_of(model), arch, tables=True)
        raise UnsupportedModelError(
            f"{arch}: layer {layer}: {differs}; ropelens measures rotations that turn plane i "
            "by m·θ_i and multiply every position by one constant"
        )
    scale = obs.scale[~obs.scale.isnan()]
    return obs.inv_freq.float(), float(scale[0]), obs.pairing, obs.direction


def _base_of(inv: torch.Tensor, rotary_dim: int) -> float | None:
    """The base b of θ_i = b^(−2i/d) that measured frequencies follow (GPT-J's config names none),
    or None where they follow no such law (then the spec says no base rather than a guessed one)."""
    if inv.numel() < 2 or float(inv[0]) <= 0 or float(inv[-1]) <= 0:
        return None
    n = inv.numel()
    base = float(f"{float(inv[0].double() / inv[-1].double()) ** (rotary_dim / (2 * (n - 1))):.5g}")
    law = inv[0].double() * base ** (-2 * torch.arange(n, dtype=torch.float64) / rotary_dim)
    return base if float(((law - inv.double()) / inv.double()).abs().max()) < 1e-4 else None


@dataclasses.dataclass(frozen=True)
class _ModelReading:
    """What every layer's reading shares: the HF model, its text config and what the probes saw."""

    model: Any
    hf: torch.nn.Module
    config: Any
    architecture: str
    rotaries: list[torch.nn.Module]
    attentions: list[torch.nn.Module | None]
    blocks: Any
    layer_types: Any  # the config's layer_types (a sequence of names), or None
    declared_adjacent: bool | None  # the bridge's flags for adjacent pairs; None: none says
    n_ctx: int
    rotary_calls: dict[int, tuple[torch.Tensor, torch.Tensor, bool]] | None
    called_rotation: str | None


def _rope_bases(config) -> list[tuple[str, Any]]:
    """(config field, value) of every RoPE base ``config`` names: ``rope_theta``, and the
    ``rope_theta`` of ``rope_parameters`` and of each layer type's entry in it."""
    bases = []
    if getattr(config, "rope_theta", None) is not None:
        bases.append(("rope_theta", config.rope_theta))
    parameters = getattr(config, "rope_parameters", None)
    if isinstance(parameters, dict):
        if "rope_theta" in parameters:
            bases.append(("rope_parameters['rope_theta']", parameters["rope_theta"]))
        for layer_type, entry in parameters.items():
            if isinstance(entry, dict) and "rope_theta" in entry:
                bases.append(
                    (f"rope_parameters[{layer_type!r}]['rope_theta']", entry["rope_theta"])
                )
    return bases


def refuse_bad_base(config, architecture: str) -> None:
    """InputError naming the config field whose RoPE base is not a positive number.

    Plane i turns by θ_i = base^(−2i/d): a base of 0 makes every plane but the first turn
    infinitely fast and a negative one makes them NaN, which the analyses would then blame on the
    plane pairing.
    """
    for field_name, value in _rope_bases(config):
        positive = (
            isinstance(value, numbers.Real)
            and not isinstance(value, bool)
            and math.isfinite(value)
            and value > 0
        )
        if not positive:
            raise InputError(
                f"{architecture}: the config's {field_name} is {value!r}, but RoPE's base must be "
                "a positive number (plane i turns by base^(-2i/d)): set it in the model's "
                "config.json to the base the model was trained with (e.g. 10000.0 for Llama 2)"
            )


def _refuse_bad_rotary_buffers(
    hf: torch.nn.Module, architecture: str, *, tables: bool = False
) -> None:
    """InputError naming an ``inv_freq`` buffer that holds NaN, ±inf or a negative frequency (with
    ``tables``, also any other buffer of a rotary module holding NaN or ±inf: GPT-J's sin|cos
    table): what a bad base, or code that overwrote the buffer, leaves, which the analyses would
    otherwise blame on the plane pairing. A frequency of 0 is a plane that does not rotate
    (proportional RoPE) and is kept. Tables are looked at only where a measured rotation failed: a
    cache a family fills at its first forward may hold anything before it."""
    rotary = {id(m) for m in _rotary_modules(hf)}
    for module_name, module in hf.named_modules():
        for name, buffer in module.named_buffers(recurse=False):
            if (
                ("inv_freq" not in name and not (tables and id(module) in rotary))
                or not buffer.is_floating_point()
                or buffer.is_meta
            ):
                continue
            values = buffer.detach().float().cpu().flatten()
            frequencies = "inv_freq" in name
            bad = ~torch.isfinite(values) | ((values < 0) if frequencies else False)
            if bool(bad.any()):
                index = int(bad.nonzero()[0, 0])
                what = (
                    "RoPE's frequencies must be finite and not negative (plane i turns by θ_i "
                    "radians per token, 0 for a plane that does not rotate)"
                    if frequencies
                    else "a rotary table must hold finite numbers"
                )
                path = f"{module_name}.{name}".replace("._original_component", "")
                raise InputError(
                    f"{architecture}: the rotary buffer {path} holds "
                    f"{float(values[index])!r} at entry {index}, but {what}: it was computed "
                    "from a bad config or overwritten; reload the model from its checkpoint, "
                    "with a positive, finite rope_theta in its config.json"
                )


def _refuse_meta(hf: torch.nn.Module, architecture: str) -> None:
    """InputError for a model whose weights are all on the meta device (shapes, no values)."""
    if device_of(hf).type == "meta":
        raise InputError(
            f"{architecture}: the model is on the meta device, whose tensors hold shapes but no "
            "values, so there is nothing to measure: load it on 'cpu', 'cuda' or 'mps'"
        )


def _start_reading(model) -> _ModelReading:
    """Refuse a model ropelens cannot read, and run the probes every layer's reading shares."""
    hf = hf_model_of(model)
    config = _text_config(hf)
    tl_config = getattr(model, "cfg", None)
    positional_embedding = getattr(tl_config, "positional_embedding_type", "rotary")
    architecture = type(hf).__name__
    if positional_embedding != "rotary":
        raise NotRotaryError(
            f"{architecture} uses {positional_embedding!r} position embeddings, not RoPE: ropelens "
            "measures rotary models (Llama, Gemma, Qwen, SmolLM, GPT-J, ...). For learned absolute "
            "position embeddings use ropelens.analyses.pe_similarity."
        )
    _refuse_meta(hf, architecture)
    refuse_bad_base(config, architecture)
    _refuse_bad_rotary_buffers(hf, architecture)
    _refuse_unsupported(model, config, architecture)
    attentions = _attention_modules(model)
    n_ctx = int(
        getattr(config, "max_position_embeddings", None)
        or getattr(config, "n_positions", 0)
        or tl_config.n_ctx
    )
    return _ModelReading(
        model=model,
        hf=hf,
        config=config,
        architecture=architecture,
        rotaries=_rotary_modules(hf),
        attentions=attentions,
        blocks=_blocks(model),
        layer_types=getattr(config, "layer_types", None),
        # GLM/ERNIE (rotary_adjacent_pairs) and Cohere (rotary_interleaved_cos_sin) rotate adjacent
        # pairs, as GPT-J does; the bridge's own flags say so
        declared_adjacent=declared_adjacent_pairs(model),
        n_ctx=n_ctx,
        rotary_calls=_rotary_calls(model, attentions),
        called_rotation=_called_rotation(model, attentions) if is_mla(config) else None,
    )


def _layer_without_attention(reading: _ModelReading, index: int) -> LayerRope:
    """A hybrid's linear-attention, convolution or state-space layer: listed, never measured."""
    decoder = getattr(reading.blocks[index], "original_component", None)
    mixer = _mixer(decoder)
    kind, mixer_class = mixer or ("none", type(decoder).__name__)
    return LayerRope(
        layer=index,
        inv_freq=torch.zeros(0),
        head_dim=0,
        rotary_dim=0,
        pairing="half",
        n_heads=0,
        n_kv_heads=0,
        score_scale=0.0,
        kind=kind,  # type: ignore[arg-type]
        mixer=mixer_class,
        n_ctx=reading.n_ctx,
    )


def _layer_frequencies(
    reading: _ModelReading, index: int, attention: torch.nn.Module, layer_type: str | None
) -> tuple[torch.Tensor, float, tuple[str, int] | None]:
    """(inv_freq, attention scaling, observed) of one attention layer.

    ``inv_freq`` is empty for a NoPE layer; ``observed`` is the (pairing, direction) where the
    rotation was measured instead of read.
    """
    all_parameters = getattr(reading.config, "rope_parameters", None)
    observed = None
    if isinstance(all_parameters, dict) and all_parameters.get(layer_type, ...) is None:
        inv_freq, scaling = torch.zeros(0), 1.0  # a layer type without RoPE (Beam)
    else:
        try:
            inv_freq, scaling = _inv_freq_for(reading.rotaries, attention, layer_type)
        except _NoBuffer:
            measured = _observed_rope(
                reading.model, reading.attentions, index, reading.architecture
            )
            if measured is None:
                inv_freq, scaling = torch.zeros(0), 1.0
            else:
                inv_freq, scaling, observed = measured[0], measured[1], measured[2:]
    # NoPE layers: flagged by the model (SmolLM3, Llama 4), or never rotating in its forward
    # (the full-attention layers of Cohere 2 and EXAONE 4 skip apply_rotary_pos_emb)
    calls = reading.rotary_calls
    if not uses_rope(attention, reading.config, index) or (
        calls is not None and index not in calls
    ):
        inv_freq = inv_freq[:0]
    return inv_freq, scaling, observed


def _layer_widths(
    reading: _ModelReading, index: int, attention: torch.nn.Module, observed: tuple | None
) -> dict[str, Any]:
    """Head counts, head width, plane pairing and (multi-head latent attention) layout of one layer.

    Read per layer: the attention module's own, else this layer's config (HF's per-layer config, as
    Gemma 4's wider global heads use), else the model's; MLA per layer too (Dots 3's widths differ).
    """
    layer_cfg = layer_config(reading.config, index)
    n_heads = heads_of(attention, layer_cfg)
    head_dim = int(
        getattr(attention, "head_dim", None)
        or getattr(layer_cfg, "head_dim", None)
        or layer_cfg.hidden_size // n_heads
    )
    mla = _mla_layout(reading.hf, layer_cfg, reading.called_rotation) if is_mla(layer_cfg) else None
    adjacent = mla.pop("adjacent") if mla is not None else bool(reading.declared_adjacent)
    if observed is not None:
        adjacent = observed[0] == "adjacent"
    if mla is not None:  # the score's head: no-position dims, then the rotary ones
        head_dim = int(layer_cfg.qk_nope_head_dim) + int(layer_cfg.qk_rope_head_dim)
    n_kv_heads = kv_heads_of(
        attention, n_heads, int(getattr(layer_cfg, "num_key_value_heads", None) or n_heads)
    )
    return {
        "n_heads": n_heads,
        "n_kv_heads": n_kv_heads,
        "head_dim": head_dim,
        "pairing": "adjacent" if adjacent else "half",
        "mla": mla,
    }


def _layer_mask(
    reading: _ModelReading, attention: torch.nn.Module, layer_type: str | None, rotary: bool
) -> tuple[str, int | None, int | None]:
    """(kind, window, chunk) of one attention layer's mask."""
    config = reading.config
    kind = _KIND.get(layer_type or "", "full")
    window = getattr(attention, "sliding_window", None) if kind == "sliding" else None
    if kind == "sliding" and window is None:
        window = getattr(config, "sliding_window", None)
    if (
        reading.layer_types is None
        and getattr(config, "sliding_window", None)
        and getattr(config, "use_sliding_window", True)
        and _masks_window(reading.hf)
    ):
        # Mistral, Mixtral, Starcoder2, Phi-3: one window for every layer, no layer_types
        kind, window = "sliding", int(config.sliding_window)
    # the size HF's chunked mask is built with
    chunk = int(config.attention_chunk_size) if kind == "chunked" else None
    if not rotary:
        kind = "nope"  # a NoPE layer keeps its chunk: its mask is still the chunked one
    return kind, int(window) if window else None, chunk


def _attention_layer(reading: _ModelReading, index: int, attention: torch.nn.Module) -> LayerRope:
    """The RoPE one softmax-attention layer applies, checked against its own rotation where seen."""
    config = reading.config
    layer_type = reading.layer_types[index] if reading.layer_types else None
    inv_freq, scaling, observed = _layer_frequencies(reading, index, attention, layer_type)
    widths = _layer_widths(reading, index, attention, observed)
    mla = widths.pop("mla")
    kind, window, chunk = _layer_mask(reading, attention, layer_type, bool(inv_freq.numel()))
    parameters = _layer_rope_params(config, layer_type)
    base = parameters.get("rope_theta", getattr(config, "rope_theta", None))
    score_scale = getattr(attention, "scaling", None)
    if score_scale is None:
        score_scale = 1.0 / float(getattr(attention, "scale_attn", math.sqrt(widths["head_dim"])))
    mixer = _mixer(getattr(reading.blocks[index], "original_component", None))
    layer = LayerRope(
        layer=index,
        inv_freq=inv_freq,
        rotary_dim=2 * inv_freq.numel(),
        **widths,
        score_scale=float(score_scale),
        rope_type=str(parameters.get("rope_type", "default")),
        base=float(base) if base is not None else _base_of(inv_freq, 2 * inv_freq.numel()),
        rope_parameters={k: v for k, v in parameters.items() if jsonable(v)},
        attention_scaling=scaling,
        kind=kind,  # type: ignore[arg-type]
        window=window,
        chunk=chunk,
        query_scale=query_scale(
            attention,
            inv_freq.numel(),
            _passed_query_scale(attention, config, layer_type),
        ),
        select_keys=(
            _select_keys(attention, config, reading.architecture, index)
            if layer_type == "indexed_attention"
            else None
        ),
        n_ctx=reading.n_ctx,
        softcap=softcap_of(attention, config),
        sinks=sinks_of(attention),
        axes=plane_axes(reading.rotaries, inv_freq),
        mixer=mixer[1] if mixer else None,
        output_gate=output_gate(attention, widths["n_heads"], widths["head_dim"]),
        direction=observed[1] if observed is not None else 1,
        **(mla if mla is not None and inv_freq.numel() else {}),
    )
    return _checked_by_its_rotation(reading, layer)


def _checked_by_its_rotation(reading: _ModelReading, layer: LayerRope) -> LayerRope:
    """``layer`` turned and paired as its own rotation shows, and normed after it where it is.

    The direction always, the pairing where no flag declares it, and whether its q and k pass a
    per-head norm after the rotation.
    """
    calls = reading.rotary_calls
    if calls is None or layer.layer not in calls or not layer.inv_freq.numel():
        return layer
    query, rotated_query, normed = calls[layer.layer]
    # where no flag declares adjacent pairs (a plain HF model: Helium), its own rotation says which
    layer = _with_direction(layer, query, rotated_query, pairing=reading.declared_adjacent is None)
    return dataclasses.replace(layer, norm_after_rope=True) if normed else layer


def rope_spec(model, *, length: int | None = None) -> RopeSpec:
    """Read what each attention layer of the running model rotates (on ``length`` tokens), under
    the interventions in force on it.

    Inside :func:`ropelens.run.intervene.apply_rope_variant`, on a copy from
    :func:`ropelens.run.intervene.with_rope_variant` and inside
    :func:`ropelens.run.intervene.ablate_planes`, the spec describes the model *as it runs*: the
    variant's frequencies (θ = 0 for the planes it stops, :attr:`LayerRope.stopped_planes`), the
    planes an ablation zeroes per query head (:attr:`LayerRope.ablated`), and every intervention
    in :attr:`RopeSpec.interventions`. :func:`unmodified_spec` is the model as built.

    Read from the HF modules the bridge wraps (their ``inv_freq`` buffers, attention ``scaling``,
    config ``layer_types`` and ``rope_parameters``), never from ``cfg.rotary_base``.

    Where the model's frequencies change with the input's length (dynamic NTK past the native
    context, LongRoPE's long factors past ``original_max_position_embeddings``), the plain reading
    gives a short input's and says in :attr:`RopeSpec.valid_up_to` up to which length they hold
    (measured on the rotary modules); with ``length`` the rotary modules are run at that many
    positions and each layer's frequencies and attention scaling are read as a forward of ``length``
    tokens applies them (:attr:`RopeSpec.length`). A model whose frequencies hold for every length,
    or one under a RoPE variant (which sets its own frequencies), reads the same at any ``length``.

    Args:
        model: A model from :func:`ropelens.load_model` (a ``TransformerBridge`` or a plain HF
            model), or an nnsight model wrapping one.
        length (int | None): Read the frequencies a forward of this many tokens applies (dynamic
            NTK, LongRoPE); None: a short input's, with :attr:`RopeSpec.valid_up_to` saying how
            far they hold.

    Returns:
        RopeSpec: One :class:`LayerRope` per layer (frequencies highest first, pairing, widths,
        score scale, masks), with the interventions in force.

    Raises:
        InputError: When ``length`` is not a positive integer.
        NotRotaryError: When the model has no rotary position embeddings.
        UnsupportedModelError: When the model applies RoPE in a way ropelens cannot read exactly.

    Examples:
        >>> from ropelens import apply_rope_variant, rope_spec
        >>> from ropelens.spec.variants import PRoPE
        >>> from ropelens.testing import tiny_model
        >>> model = tiny_model("llama")
        >>> spec = rope_spec(model)
        >>> spec[0].n_planes, spec[0].base, spec[0].pairing
        (8, 10000.0, 'half')
        >>> spec.valid_up_to is None  # default RoPE: the same frequencies at every length
        True
        >>> rope_spec(model, length=8192).length is None  # so nothing to read per length
        True
        >>> with apply_rope_variant(model, PRoPE(0.75)):  # the model as it runs under p-RoPE
        ...     inside = rope_spec(model)
        >>> inside[0].stopped_planes.tolist(), inside.interventions[0]["intervention"]
        ([6, 7], 'rope variant')
    """
    if length is not None:
        length = check_positive_int(length, "length", " (the input's length in tokens)")
    model = running_model(model)  # an nnsight model: the HF model it wraps
    return spec_as_run(unmodified_spec(model, length=length), active_plan(model), length)


def unmodified_spec(model, *, length: int | None = None) -> RopeSpec:
    """What each attention layer of ``model`` rotates as built, whatever intervention is in force
    (the reading the interventions themselves start from); :func:`rope_spec` otherwise."""
    if length is not None:
        length = check_positive_int(length, "length", " (the input's length in tokens)")
    model = running_model(model)  # an nnsight model: the HF model it wraps
    with rotary_state_kept(model):  # a reading runs the rotary modules: the model is left as it was
        return _unmodified_spec(model, length)


def _unmodified_spec(model, length: int | None) -> RopeSpec:
    reading = _start_reading(model)
    limit = None if active_plan(model) else _length_limit(model)
    if limit is not None:  # the short reading: the rotary modules as a short input leaves them
        for rotary in reading.rotaries:
            _rotary_tables(rotary, reading.config, LENGTH_PROBE)
    layers = [
        _layer_without_attention(reading, index)
        if attention is None
        else _attention_layer(reading, index, attention)
        for index, attention in enumerate(reading.attentions)
    ]
    layers = _with_temperature(model, reading.attentions, reading.config, layers)
    spec = RopeSpec(
        model_name=model_label(model),
        architecture=reading.architecture,
        layers=tuple(layers),
        n_ctx=reading.n_ctx,
        valid_up_to=limit,
    )
    return spec if limit is None or length is None else _read_at_length(model, spec, length)


def _with_temperature(model, attns, cfg, layers: list[LayerRope]) -> list[LayerRope]:
    """``layers`` with the query temperature the model applies after its rotation
    (:attr:`LayerRope.temperature`): where the config names one (``llama_4_scaling_beta`` β,
    ``original_max_position_embeddings`` L₀: Ministral 3, Mistral 4), the model's own forward at
    positions 0, L₀ − 1, L₀ and 3·L₀ must multiply each rotated query by 1, 1, 1 + β·ln 2 and 1 +
    β·ln 4 (all 1: a forward that does not apply it); a layer that does something else is refused
    with the factors measured."""

    rp = getattr(cfg, "rope_parameters", None)
    beta = rp.get("llama_4_scaling_beta") if isinstance(rp, dict) else None
    l0 = rp.get("original_max_position_embeddings") if isinstance(rp, dict) else None
    if not beta or not isinstance(l0, int) or l0 < 2:
        return layers
    positions = [0, l0 - 1, l0, 3 * l0]
    expected = 1 + float(beta) * torch.log(
        1 + torch.floor(torch.tensor(positions, dtype=torch.float64) / l0)
    )
    measured = measure_query_factors(
        attns, _hf_tree(hf_model_of(model)), device_of(model), positions
    )
    out = []
    for lr in layers:
        if lr.rotary and measured is not None and lr.layer in measured:
            f = measured[lr.layer]
            if f is not None and torch.allclose(f, torch.ones_like(f), rtol=0, atol=1e-6):
                out.append(lr)  # the config names a temperature this model's forward does not apply
                continue
            if f is None or not torch.allclose(f, expected, rtol=1e-4, atol=0):
                seen = (
                    "not one factor per position times the rotated query"
                    if f is None
                    else "factors " + ", ".join(f"{float(x):.6g}" for x in f)
                )
                raise UnsupportedModelError(
                    f"{type(hf_model_of(model)).__name__}: layer {lr.layer}'s config names a "
                    f"query temperature 1 + {float(beta):g}·ln(1 + ⌊m/{l0}⌋) "
                    "(llama_4_scaling_beta, original_max_position_embeddings), but at positions "
                    f"{positions} the query entering its score is {seen} (expected "
                    f"{', '.join(f'{float(x):.6g}' for x in expected)}): ropelens does not read "
                    "this layer"
                )
            lr = dataclasses.replace(lr, temperature=(float(beta), l0))
        elif (
            lr.rotary and measured is None
        ):  # a forward the probe cannot run: HF's code applies the config's
            lr = dataclasses.replace(lr, temperature=(float(beta), l0))
        out.append(lr)
    return out


_PROBE_TOKENS = (
    4  # a short forward: which layers rotate, which way, and whether q/k change after the rotation
)


def _norm_after_rope(rotated: torch.Tensor, scored: torch.Tensor) -> bool | None:
    """Whether ``scored`` (what enters the score) is the rotation's output ``rotated`` ([batch,
    head, pos, d]) under a per-head norm and gain: ``scored = s(batch, head, pos) · g(head, d) ⊙
    rotated`` with s > 0.

    False when they are the same, None when they differ in some other way (then the probe's q/k
    check refuses the model). Each row of ``scored / rotated`` is ``s·g``: divided by its RMS it is
    ``g / rms(g)`` in every row. A 16-bit model rounds ``scored`` to its eps (bf16: 4e-3 relative),
    so rows that agree to 2e-2 of the largest entry match; a norm that subtracts the mean, or any
    mixing of dims, is off by O(1).
    """
    if rotated.shape != scored.shape:
        return None
    rotated, scored = rotated.double(), scored.double()
    if float((scored - rotated).abs().max()) <= 1e-6 * float(rotated.abs().max().clamp_min(1e-30)):
        return False
    ok = (rotated.abs() > 1e-6 * rotated.abs().max()).all(
        -1
    )  # rows without a near-zero entry to divide by
    if not ok.any():
        return None
    ratio = (scored / rotated)[ok.unsqueeze(-1).expand_as(rotated)].view(-1, rotated.shape[-1])
    heads = torch.arange(rotated.shape[1]).view(1, -1, 1).expand(ok.shape)[ok]
    rows = ratio / ratio.pow(2).mean(-1, keepdim=True).sqrt().clamp_min(1e-30)
    for h in heads.unique():
        r = rows[heads == h]
        if float((r - r[:1]).abs().max()) > 2e-2 * float(r.abs().max()):
            return None
    return True


def _rotary_calls(model, attns) -> dict[int, tuple[torch.Tensor, torch.Tensor, bool]] | None:
    """Layer → (q before, q after, norm after RoPE) of the first ``apply_rotary_pos_emb`` call
    inside that layer's attention, from one short forward of the HF model (cached on the model);
    None where the family rotates elsewhere. The third entry says the q and k entering that
    layer's attention function are a per-head norm and gain of the rotated ones
    (:func:`_norm_after_rope`)."""
    import inspect

    mod = importlib.import_module(type(hf_model_of(model)).__module__)
    name, orig, flip = "apply_rotary_pos_emb", getattr(mod, "apply_rotary_pos_emb", None), False
    complex_rot = rotation_functions(mod).get("apply_rotary_emb")
    if orig is None and complex_rot is not None and not is_mla(_text_config(hf_model_of(model))):
        # Llama 4's complex product of whole heads, on [batch, pos, head, d]: recorded heads first,
        # as the others
        name, orig, flip = "apply_rotary_emb", complex_rot, complex_positions_axis(complex_rot) == 1
    # Only the (q, k, cos, sin) -> (q, k) form; GPT-J's (tensor, sin, cos) -> tensor is read from
    # its table.
    elif orig is None or list(inspect.signature(orig).parameters)[:2] != ["q", "k"]:
        return None
    key = (id(orig), id(getattr(mod, "rotate_half", None)), len(attns))
    cached = getattr(model, "_ropelens_rotary_calls", None)
    if cached is not None and cached[0] == key:
        return cached[1]

    view = _hf_tree(hf_model_of(model))
    current: list[int | None] = [None]
    calls: dict[int, tuple[torch.Tensor, ...]] = {}
    scored: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}

    outside = [0]

    def tap(q, k=None, *args, **kwargs):
        if k is None:  # queries alone (Qwen4-Exp's indexer form): not a layer's rotation of q and k
            return orig(q, k, *args, **kwargs)
        q_rot, k_rot = orig(q, k, *args, **kwargs)
        if current[0] is None:
            outside[0] += 1
        elif current[0] not in calls:
            calls[current[0]] = tuple(
                (t.transpose(1, 2) if flip else t).detach().float().cpu() for t in (q, q_rot, k_rot)
            )
        return q_rot, k_rot

    def score(_module, query, key) -> None:
        # the first attention call after the layer's rotation: what enters its score
        if current[0] in calls and current[0] not in scored:
            scored[current[0]] = (query.detach().float().cpu(), key.detach().float().cpu())

    attn_mods = [m for m in view.modules() if type(m) in {type(a) for a in attns if a is not None}]
    with layer_taps(view, attns, current, mod, {name: tap}) as tapping:
        # a family this forward cannot run keeps the config's reading (the probe still checks it)
        if not tapping or not probe_forward(
            view, device_of(model), _PROBE_TOKENS, attention_tap(attn_mods, score)
        ):
            return None
    # a rotation outside the attention modules cannot be placed in a layer: keep the config's
    # reading
    result = None
    if calls and not outside[0]:
        result = {}
        for i, (q, q_rot, k_rot) in calls.items():
            normed = [
                _norm_after_rope(r, s)
                for r, s in zip((q_rot, k_rot), scored.get(i, ()), strict=False)
            ]
            # a layer whose q or k changes after the rotation, each by a per-head norm and gain (or
            # not at all)
            result[i] = (q, q_rot, len(normed) == 2 and True in normed and None not in normed)
    object.__setattr__(
        model, "_ropelens_rotary_calls", (key, result)
    )  # not a submodule: nothing registered
    return result


def _called_rotation(model, attns) -> str | None:
    """The rotation function (by name) the attention modules call first, outside their indexers, in
    one short forward of the HF model (cached on the model, as :func:`_rotary_calls` is); None where
    it cannot be seen (the forward fails, or no attention rotates)."""
    mod = importlib.import_module(type(hf_model_of(model)).__module__)
    fns = {n: f for n, f in rotation_functions(mod).items() if n != "apply_rotary_emb"}
    key = (tuple(id(f) for f in fns.values()), len(attns))
    cached = getattr(model, "_ropelens_called_rotation", None)
    if cached is not None and cached[0] == key:
        return cached[1]
    view = _hf_tree(hf_model_of(model))
    current: list = [None]
    seen: list[str] = []

    def tapped(name: str, fn: Callable) -> Callable:
        def call(*args, **kwargs):
            if current[0] is not None and not seen:
                seen.append(name)
            return fn(*args, **kwargs)

        return call

    with layer_taps(
        view, attns, current, mod, {name: tapped(name, fn) for name, fn in fns.items()}
    ) as tapping:
        # a forward this cannot run leaves the config's reading (the probe checks it)
        if not tapping or not probe_forward(view, device_of(model), _PROBE_TOKENS):
            return None
    result = seen[0] if seen else None
    object.__setattr__(
        model, "_ropelens_called_rotation", (key, result)
    )  # not a submodule: nothing registered
    return result


def _hf_tree(module: torch.nn.Module) -> torch.nn.Module:
    """The HF module tree under a bridge with every bridge component replaced by the module it
    wraps, and no hooks: shallow copies sharing every weight, built for one short forward and
    dropped."""
    import copy

    while getattr(module, "_original_component", None) is not None:
        module = module._original_component
    view = copy.copy(module)
    drop_wrapper_forward(view, module)
    view._modules = {n: (None if c is None else _hf_tree(c)) for n, c in module._modules.items()}
    for hooks in (
        "_forward_hooks",
        "_forward_pre_hooks",
        "_forward_hooks_with_kwargs",
        "_forward_pre_hooks_with_kwargs",
        "_forward_hooks_always_called",
    ):
        if hasattr(view, hooks):
            setattr(view, hooks, type(getattr(module, hooks))())
    return view


_ROTATION_MATCH = 2e-2  # relative error of a rotation that matches the model's own


def _with_direction(
    lr: LayerRope, q: torch.Tensor, q_rot: torch.Tensor, pairing: bool = False
) -> LayerRope:
    """``lr`` turned the other way when the model's own rotation of ``q`` ([batch, head, pos, d]) is
    by −m·θ (with ``pairing``, also with the other plane pairing when that is the one the model
    rotates)."""
    if q.ndim != 4 or q.shape[-1] != lr.head_dim or q_rot.shape != q.shape:
        return lr
    pos = torch.arange(q.shape[-2], device=q.device)

    def err(d: LayerRope) -> float:
        return float((d.rotate(q, pos) - q_rot).abs().max() / q_rot.abs().max().clamp_min(1e-30))

    other = {"half": "adjacent", "adjacent": "half"}[lr.pairing]
    candidates = [dataclasses.replace(lr, direction=-lr.direction)]
    if pairing:
        candidates += [
            dataclasses.replace(lr, pairing=other),
            dataclasses.replace(lr, pairing=other, direction=-lr.direction),
        ]
    # a match is ~1e-6 in float32 and within the rounding of a 16-bit model's rotated q (bf16:
    # 4e-3 relative), a wrong direction or pairing is O(1) off
    if err(lr) <= _ROTATION_MATCH:
        return lr
    return next((c for c in candidates if err(c) < _ROTATION_MATCH), lr)


# ---------------------------------------------------------------------------- length-dependent RoPE
LENGTH_PROBE = 8  # positions compared between a short call of a rotary module and a longer input's


def _rotary_tables(
    rotary: torch.nn.Module, config, n_positions: int, last: int | None = None
) -> list[tuple[torch.Tensor, ...]] | None:
    """The (cos, sin) ``rotary`` returns for positions 0..n_positions−1 (and ``last`` after them: an
    input that long, without its positions between), once per layer type it takes; None where it
    cannot be called as HF's rotary modules are (``forward(x, position_ids[, layer_type])``)."""
    try:
        parameters = inspect.signature(rotary.forward).parameters
    except (TypeError, ValueError):
        return None
    buffer = next((b for b in rotary.buffers() if b.is_floating_point()), None)
    device = buffer.device if buffer is not None else torch.device("cpu")
    positions = torch.arange(n_positions, device=device)
    if last is not None:
        positions = torch.cat([positions, positions.new_tensor([last])])
    positions = positions[None]
    hidden = torch.zeros(1, 1, positions.shape[1], 1, device=device)
    layer_types = [None]
    if "layer_type" in parameters:
        layer_types = sorted(set(getattr(config, "layer_types", None) or [])) or [None]
    tables = []
    for layer_type in layer_types:
        try:
            with torch.no_grad():
                if layer_type is None:
                    got = rotary(hidden, positions)
                else:
                    got = rotary(hidden, positions, layer_type)
        except Exception:
            return None
        if not (isinstance(got, tuple) and all(isinstance(t, torch.Tensor) for t in got)):
            return None
        tables.append(tuple(t.detach().float().cpu() for t in got))
    return tables


def _changes_by(rotary: torch.nn.Module, config, length: int) -> bool | None:
    """Whether ``rotary`` gives the first :data:`LENGTH_PROBE` positions of a ``length``-token input
    other tables than a short input's (None: it cannot be called so).

    The module is left as a short input leaves it.
    """
    short = _rotary_tables(rotary, config, LENGTH_PROBE)
    long = (
        _rotary_tables(rotary, config, LENGTH_PROBE, last=length - 1) if short is not None else None
    )
    _rotary_tables(rotary, config, LENGTH_PROBE)  # HF's dynamic NTK resets on a short input
    if long is None:
        return None
    return any(
        not torch.equal(short_table, long_table[..., :LENGTH_PROBE, :])
        for short_types, long_types in zip(short, long, strict=True)
        for short_table, long_table in zip(short_types, long_types, strict=True)
    )


def _length_limit(model) -> int | None:
    """The longest input whose rotary tables are a short input's, where a longer one gets others
    (dynamic NTK past the native context, LongRoPE's long factors); None where no input up to twice
    the native context changes them. Measured on the model's rotary modules by bisection, not read
    from its config; cached on the model."""
    cached = getattr(model, "_ropelens_length_limit", ...)
    if cached is not ...:
        return cached
    hf = hf_model_of(model)
    config = _text_config(hf)
    n_ctx = int(getattr(config, "max_position_embeddings", None) or 0)
    longest = max(2 * n_ctx, 2 * LENGTH_PROBE) + 1
    limit = None
    for rotary in _rotary_modules(hf):
        if not _changes_by(rotary, config, longest):
            continue
        unchanged, changed = (
            LENGTH_PROBE,
            longest,
        )  # tables of the first holds, of the second differ
        while changed - unchanged > 1:
            middle = (unchanged + changed) // 2
            if _changes_by(rotary, config, middle):
                changed = middle
            else:
                unchanged = middle
        limit = unchanged if limit is None else min(limit, unchanged)
    object.__setattr__(model, "_ropelens_length_limit", limit)
    return limit


def length_dependent(model) -> bool:
    """Whether the model's rotary modules give other tables to the first positions of a long input
    than of a short one (dynamic NTK past the native context, LongRoPE's short and long factors)."""
    with rotary_state_kept(model):
        return _length_limit(model) is not None


def _read_at_length(model, spec: RopeSpec, length: int) -> RopeSpec:
    """``spec`` (the short reading) with the frequencies a forward of ``length`` tokens applies.

    The rotary modules are run at ``length`` positions and each rotary layer's frequencies and
    attention scaling read again. HF's dynamic NTK keeps the frequencies of the longest input past
    the native context it has seen, until an input within it resets them: these are the
    frequencies the model applies now, to inputs of ``length`` tokens.
    """
    hf = hf_model_of(model)
    config = _text_config(hf)
    rotaries = _rotary_modules(hf)
    for rotary in rotaries:
        _rotary_tables(rotary, config, length)  # the module now holds what a forward on it holds
    attentions = _attention_modules(model)
    layer_types = getattr(config, "layer_types", None)
    layers = []
    for layer in spec.layers:
        if not layer.rotary or attentions[layer.layer] is None:
            layers.append(layer)
            continue
        layer_type = layer_types[layer.layer] if layer_types else None
        try:
            inv_freq, scaling = _inv_freq_for(rotaries, attentions[layer.layer], layer_type)
        except _NoBuffer:
            inv_freq, scaling = None, None
        if inv_freq is None or inv_freq.shape != layer.inv_freq.shape:
            held = (
                "no inv_freq"
                if inv_freq is None
                else f"{inv_freq.numel()} frequencies, the reading {layer.inv_freq.numel()}"
            )
            raise UnsupportedModelError(
                f"{spec.architecture}: the rotary tables of layer {layer.layer} change with the "
                f"input's length, and ropelens cannot read the frequencies a forward of {length} "
                f"tokens applies (its rotary module holds {held}): measure windows within the "
                f"first {spec.valid_up_to:,} tokens (--n-ctx), where the reading holds"
            )
        layers.append(
            dataclasses.replace(
                layer, inv_freq=inv_freq.to(layer.inv_freq.dtype), attention_scaling=scaling
            )
        )
    valid_up_to = max(spec.valid_up_to, length)
    return dataclasses.replace(spec, layers=tuple(layers), length=length, valid_up_to=valid_up_to)
