"""An automatic sweep of every RoPE causal LM in the installed transformers, checked like the family matrix.

:func:`rope_model_types` lists the causal-LM model types whose modeling code applies rotary
embeddings; :func:`shrink_config` turns a config class's defaults into a tiny config that keeps the
structure (layer-type patterns, sliding windows cut to at most 8 so a 24-token input is longer than
any window, a few experts, the partial rotary factor, MLA ranks scaled together, NoPE layers,
soft-caps) with small widths, a vocabulary of 101 and 2-4 layers holding every kind of layer, each
sub-config of a composite config (DBRX's attention, Moshi's depth decoder, Mllama's vision tower) shrunk alike;
:func:`check_config` measures ropelens on it against HF's eager attention exactly as
:func:`ropelens.testing.families.check_family` does, and :func:`classify` gives one status per
family: ``exact``, ``refused``, ``wrong`` (ropelens gave a number HF disagrees with: a bug),
``crashed`` (ropelens raised something other than a refusal: a bug), ``unverified``, ``no RoPE``
(HF's forward rotates nothing, e.g. Jamba's attention layers, and ropelens says so: not a RoPE
family, though its modeling code defines a rotation) or ``not built`` (where HF's modeling code failed, and
whether HF's own default config fails the same way: a transformers bug, not the shrinking's).
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
from typing import Any

import torch

from ropelens.errors import InputError, NotRotaryError, UnsupportedModelError
from ropelens.testing.dense import hf_layers
from ropelens.testing.families import (
    N_CHECK,
    VOCAB,
    hf_inv_freq,
    hf_scores,
    probs_by_layer,
    rotation_error,
    rotation_from_pre,
)
from ropelens.testing.sweep_checks import SweepCheck, band_stats_error, usage_error, variant_error

__all__ = ["NoRope", "NotBuilt", "SweepRow", "SweepTarget", "check_config", "classify", "rope_model_types", "save_tiny",
           "shrink_config", "sweep_one", "table_phase_steps"]

TOL = 1e-4  # float32: captured and HF tensors come from the same ops (errors ~1e-6); a misreading moves them O(1)
MAX_PARAMS = 20_000_000  # a shrunk config above this kept a full-size width somewhere: not built, say which
_ROPE_SOURCE = re.compile(r"apply_rotary_pos_emb|rotary_emb|RotaryEmbedding")
_SHARPEN = ("q_proj", "k_proj", "qkv", "query_key_value", "q_a_proj", "q_b_proj", "kv_a_proj", "kv_b_proj",
            "Wqkv", "c_attn", ".wq", ".wk", "query", "key")

# Roles of config keys (the canonical names to_dict writes; older families keep their own).
_HIDDEN = ("hidden_size", "n_embd", "d_model", "dim", "hidden_size_global")  # _global: BLT's global stack, seen locally
_LAYERS = ("num_hidden_layers", "n_layer", "n_layers", "num_layers")
_HEADS = ("num_attention_heads", "n_head", "n_heads", "swa_num_attention_heads")
_KV_HEADS = ("num_key_value_heads", "num_kv_heads", "num_query_groups", "multi_query_group_num", "swa_num_key_value_heads")
_HEAD_DIMS = ("head_dim", "kv_channels", "attention_head_dim", "swa_head_dim", "index_head_dim",
              "linear_key_head_dim", "linear_value_head_dim", "linear_head_dim")
_LINEAR_HEADS = ("linear_num_key_heads", "linear_num_value_heads", "linear_num_heads", "index_n_heads")
_EXPERTS = ("num_experts", "n_routed_experts", "num_local_experts", "moe_num_experts")
_TOPK = ("num_experts_per_tok", "num_experts_per_token", "moe_topk", "top_k", "moe_k")
_WINDOWS = ("sliding_window", "sliding_window_size", "attention_window_size", "local_attention_window_len",
            "attention_chunk_size", "local_attention", "window_size", "index_topk")  # index_topk: DSA picks keys
_MLA = ("q_lora_rank", "kv_lora_rank", "qk_rope_head_dim", "qk_nope_head_dim", "v_head_dim", "o_lora_rank")
_INDEX_LISTS = ("full_attn_idxs", "moe_layers", "mlp_only_layers", "hybrid_layer_ids", "attn_layer_indices",
                "cross_attention_layers")
_COUNTS_FROM_START = ("first_k_dense_replace", "max_window_layers", "moe_layer_start_index")
_PERIODS = (("attn_layer_period", "attn_layer_offset"), ("expert_layer_period", "expert_layer_offset"))
_IDS = {"bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 3}
# Qwen4-Exp's QSA indexer, unset in its defaults though they make every 4th layer indexed: one key head (required),
# a head as wide as the attention's (its rotary part must fit), a budget of 4 blocks of 2 keys, under the 24-token input
_INDEXER = {"indexer_n_heads": 4, "indexer_kv_heads": 1, "indexer_head_dim": 16, "indexer_budget": 8,
            "indexer_compress_ratio": 2}


_DBRX_CLIP = 8.0  # dbrx-base/instruct's clip_qkv


class NotBuilt(Exception):
    """This family's tiny model cannot be built here (the message says why, in one line)."""


class NoRope(Exception):
    """HF's model of this type rotates nothing in its forward, and ropelens says it is not rotary: not a RoPE family."""


@dataclass(frozen=True)
class SweepTarget:
    """One causal-LM model type whose modeling code applies rotary embeddings."""

    model_type: str
    model_class: str
    module: str
    text_of: str | None = None  # the composite model type whose text tower this is


@dataclass
class SweepRow:
    """One family's sweep result: its status, the reason or the measured errors, and the structure kept."""

    model_type: str
    status: str  # exact | refused | wrong | crashed | unverified | no RoPE | not built
    detail: str = ""
    architecture: str = ""
    structure: str = ""
    kinds: dict[str, list[int]] = field(default_factory=dict)
    errors: dict[str, float] = field(default_factory=dict)
    seconds: float = 0.0


def _module_source(module: str) -> str:
    try:
        return inspect.getsource(importlib.import_module(module))
    except (ImportError, OSError, TypeError):
        return ""


def rope_model_types(only: set[str] | None = None) -> list[SweepTarget]:
    """Every model type of MODEL_FOR_CAUSAL_LM_MAPPING_NAMES (or of ``only``) whose modeling module applies RoPE."""
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
def _even(x: float, lo: int = 8) -> int:
    return max(lo, 2 * round(x / 2))


def _n_layers(d: dict[str, Any]) -> tuple[str | None, int | None]:
    for k in _LAYERS:
        if isinstance(d.get(k), int) and not isinstance(d.get(k), bool):
            return k, d[k]
    return None, None


def _per_layer_keys(d: dict[str, Any], n: int) -> list[str]:
    """Keys holding one entry per layer (layer_types, no_rope_layers, mlp_layer_types, ...)."""
    return [k for k, v in d.items() if k not in _INDEX_LISTS and isinstance(v, (list, str)) and len(v) == n
            and k not in ("architectures",) and not k.endswith(("_token_id", "_token_ids"))]


def _per_layer_dicts(d: dict[str, Any], n: int) -> list[str]:
    """Keys holding a dict keyed by layer index (Gemma 4's per_layer_config)."""
    return [k for k, v in d.items() if isinstance(v, dict) and v and "model_type" not in v
            and all(str(j).isdigit() and int(j) < n for j in v)]


def _signature(d: dict[str, Any], n: int, per_layer: list[str], i: int) -> tuple:
    """What makes layer ``i`` of this config a kind of its own (every field that varies by layer)."""
    sig: list[Any] = [repr(d[k][i]) for k in per_layer]
    sig += [i in (d.get(k) or ()) for k in _INDEX_LISTS if isinstance(d.get(k), list)]
    sig += [repr({int(j): v for j, v in d[k].items()}.get(i)) for k in _per_layer_dicts(d, n)]
    sig += [i < d[k] for k in _COUNTS_FROM_START if isinstance(d.get(k), int) and k != "max_window_layers"]
    if d.get("use_sliding_window") and isinstance(d.get("max_window_layers"), int):
        sig.append(i < d["max_window_layers"])
    if isinstance(d.get("moe_layer_end_index"), int) and d["moe_layer_end_index"] >= 0:
        sig.append(i <= d["moe_layer_end_index"])
    if isinstance(d.get("num_kv_shared_layers"), int):
        sig.append(i >= n - d["num_kv_shared_layers"])
    for p in ("block_types", "attention_pattern"):  # cyclic patterns shorter than the stack
        if isinstance(d.get(p), list) and d[p]:
            sig.append(d[p][i % len(d[p])])
    return tuple(sig)


def _select_layers(d: dict[str, Any], n: int, per_layer: list[str], want: int = 4) -> list[int]:
    """The first layer of every kind, then the next layers in order up to ``want``: the pattern's start, every kind kept."""
    seen, first = set(), []
    for i in range(n):
        s = _signature(d, n, per_layer, i)
        if s not in seen:
            seen.add(s)
            first.append(i)
    chosen = set(first)
    for i in range(n):
        if len(chosen) >= max(want, 2):
            break
        chosen.add(i)
    return sorted(chosen)[: max(len(first), want, 2)]


def _shrink_layers(d: dict[str, Any], out: dict[str, Any]) -> None:
    key, n = _n_layers(d)
    if key is None:
        return
    for p in ("block_types", "attention_pattern"):
        if isinstance(d.get(p), list) and d[p] and len(d[p]) < n:
            n = min(n, len(d[p]) * 2)  # two cycles of the pattern are enough to select from
    per_layer = _per_layer_keys(d, d[key])
    for period, offset in _PERIODS:  # e.g. Jamba: attention every 8th layer from 4 → every 2nd from 1
        if isinstance(d.get(period), int) and d[period] > 2:
            out[period], out[offset] = 2, 1
    if any(isinstance(d.get(p), int) and d[p] > 2 for p, _ in _PERIODS):
        out[key] = 4
        return
    sel = _select_layers(d, n, per_layer)
    out[key] = len(sel)
    for k in per_layer:  # from out: per-layer widths and head counts are already shrunk
        v = [out[k][i] for i in sel]
        out[k] = "".join(v) if isinstance(d[k], str) else v
    for k in _INDEX_LISTS:
        if isinstance(d.get(k), list):
            out[k] = [j for j, i in enumerate(sel) if i in d[k]]
    for k in _per_layer_dicts(d, d[key]):  # keys keep their format ("05"); widths inside scale like head_dim
        by_layer, width = {int(j): v for j, v in d[k].items()}, max(len(str(j)) for j in d[k])
        out[k] = {str(j).zfill(width): _scale_widths(by_layer[i], d, out) for j, i in enumerate(sel) if i in by_layer}
    for k in _COUNTS_FROM_START:
        if isinstance(d.get(k), int) and not isinstance(d.get(k), bool):
            out[k] = sum(i < d[k] for i in sel)
    if isinstance(d.get("moe_layer_end_index"), int) and d["moe_layer_end_index"] >= 0:
        out["moe_layer_end_index"] = max([j for j, i in enumerate(sel) if i <= d["moe_layer_end_index"]], default=0)
    if isinstance(d.get("num_kv_shared_layers"), int):
        out["num_kv_shared_layers"] = sum(i >= d[key] - d["num_kv_shared_layers"] for i in sel)


def _scale_widths(v: Any, d: dict[str, Any], out: dict[str, Any]) -> Any:
    """A per-layer override's widths scaled as the global ones were (Gemma 4: head_dim 512 over 256 → 32 over 16;
    Dots 3: its sliding layers' head counts and MLA ranks, and the head width those ranks sum to)."""
    if not isinstance(v, dict):
        return v
    new = dict(v)
    if isinstance(v.get("head_dim"), int) and isinstance(d.get("head_dim"), int):
        new["head_dim"] = _even(16 * v["head_dim"] / d["head_dim"])
    heads = d.get("num_attention_heads")
    for k in ("num_attention_heads", "num_key_value_heads"):  # as the per-layer head lists are scaled
        if isinstance(v.get(k), int) and isinstance(heads, int):
            new[k] = (4 if v[k] >= heads else 1 if v[k] == 1 else 2) if "key_value" in k else max(1, round(4 * v[k] / heads))
    rope = d.get("qk_rope_head_dim")
    if isinstance(rope, int) and rope > 0 and any(k in v for k in _MLA):  # MLA: the global ranks' scale
        for k in _MLA:
            if isinstance(v.get(k), int) and v[k] > 0:
                new[k] = _even(v[k] * 8 / rope)
        def width(src: dict[str, Any], k: str) -> Any:
            return src.get(k, (d if src is v else out).get(k))
        old = [width(v, k) for k in ("head_dim", "qk_nope_head_dim", "qk_rope_head_dim")]
        if all(isinstance(x, int) for x in old) and old[0] == old[1] + old[2]:  # a head width the ranks sum to stays so
            new["head_dim"] = width(new, "qk_nope_head_dim") + width(new, "qk_rope_head_dim")
    return new


def _shrink_rope(rp: Any, old_half: int, new_half: int) -> Any:
    """Rotary parameters whose lists have one entry per frequency (LongRoPE factors, M-RoPE sections) rescaled."""
    if not isinstance(rp, dict):
        return rp
    if all(isinstance(v, dict) for v in rp.values()) and rp:  # per layer type
        return {k: _shrink_rope(v, old_half, new_half) for k, v in rp.items()}
    rp = dict(rp)
    for k, v in rp.items():
        if isinstance(v, list) and v and old_half and len(v) == old_half:
            rp[k] = [v[round(j * old_half / new_half)] for j in range(new_half)]
    if isinstance(rp.get("mrope_section"), list) and sum(rp["mrope_section"]):
        sec = rp["mrope_section"]
        new = [max(1, s * new_half // sum(sec)) for s in sec]
        new[0] += new_half - sum(new)
        rp["mrope_section"] = new
    return rp


def _shrink_dict(d: dict[str, Any]) -> dict[str, Any]:
    """The tiny config's fields: small widths, every structural field kept (see module doc)."""
    out = dict(d)
    heads = next((d[k] for k in _HEADS if isinstance(d.get(k), int)), None)
    hidden = next((d[k] for k in _HIDDEN if isinstance(d.get(k), int)), None)
    old_hd = d.get("head_dim") or (hidden // heads if hidden and heads else None)
    for k in _HIDDEN:
        if isinstance(d.get(k), int):
            out[k] = 64
    if isinstance(d.get("attention_hidden_size"), int) and hidden:  # Zamba2: attention reads 2 × hidden (the
        out["attention_hidden_size"] = d["attention_hidden_size"] * 64 // hidden  # input and the embeddings)
    for k in _HEADS:
        if isinstance(d.get(k), int):
            out[k] = 4
    for k in _KV_HEADS:
        if isinstance(d.get(k), int) and heads:
            out[k] = 4 if d[k] >= heads else 1 if d[k] == 1 else 2
        elif k in d and d[k] is None and heads and k == "num_key_value_heads":
            out[k] = 4  # unset: one KV head per query head (HF's convention), which some models do not derive (Nemotron)
    for k in _HEAD_DIMS:
        if isinstance(d.get(k), int) and not isinstance(d.get(k), bool):
            out[k] = 16
    if "head_dim" in d and d["head_dim"] is None:  # left for the model to derive; some derive nothing
        out["head_dim"] = 16
    for k, v in d.items():  # per-layer head counts (Laguna): scaled like the global ones
        if isinstance(v, list) and v and heads and "heads" in k and all(isinstance(x, int) for x in v):
            kv = "key_value" in k or "kv" in k
            out[k] = [(4 if x >= heads else 1 if x == 1 else 2) if kv else max(1, round(4 * x / heads)) for x in v]
    if isinstance(d.get("mamba_expand"), int) or isinstance(d.get("mamba_n_heads"), int):  # Mamba-2 heads tile expand × hidden
        inner = (d.get("mamba_expand") or 2) * 64
        for k in ("mamba_d_head", "mamba_head_dim", "mamba_headdim"):
            if isinstance(d.get(k), int):
                out[k] = 16
        for k in ("mamba_n_heads", "mamba_num_heads"):
            if isinstance(d.get(k), int):
                out[k] = inner // 16
        if isinstance(d.get("mamba_d_ssm"), int):
            out["mamba_d_ssm"] = inner
        for k in ("mamba_n_groups",):
            if isinstance(d.get(k), int):
                out[k] = 1
    if isinstance(d.get("global_head_dim"), int) and old_hd:  # wider global heads keep their ratio
        out["global_head_dim"] = _even(16 * d["global_head_dim"] / old_hd)
    lin = [d[k] for k in _LINEAR_HEADS if isinstance(d.get(k), int)]
    for k in _LINEAR_HEADS:
        if isinstance(d.get(k), int):
            out[k] = max(1, 2 * d[k] // min(lin))
    for k, v in d.items():
        if isinstance(v, bool):
            continue
        if ("vocab_size" in k or k.endswith("_vocab")) and isinstance(v, int):  # _vocab: BLT's hashed n-gram tables
            out[k] = VOCAB
        elif k in _IDS and v is not None:
            out[k] = [_IDS[k]] if isinstance(v, list) else _IDS[k]
        elif k.endswith(("_token_id", "_token_index")) and isinstance(v, int) and v >= VOCAB:
            out[k] = 0  # ids past the tiny vocabulary (image, audio, ...): never in the check's input
        elif ("intermediate_size" in k or k in ("ffn_hidden_size", "ffn_dim", "expert_ffn_hidden_size")) \
                and isinstance(v, int):
            out[k] = 32 if any(s in k for s in ("moe", "expert", "shared")) else 128
        elif "intermediate_size" in k and isinstance(v, list):
            out[k] = [128] * len(v)
    for k in _EXPERTS:
        if isinstance(d.get(k), int) and d[k] > 4:
            out[k] = 4
    moe = any(isinstance(d.get(k), int) for k in _EXPERTS) or isinstance(d.get("moe_intermediate_size"), int)
    for k in _EXPERTS:  # defaults that leave the expert count unset (the model cannot build without it)
        if k in d and d[k] is None and moe:
            out[k] = 4
    types = d.get("layer_types")
    if isinstance(types, list) and "indexed_attention" in types and all(k in d and d[k] is None for k in _INDEXER):
        # the indexer's sizes are the only part of that structure the defaults leave out (HF's default config does
        # not build): filled as the experts' count is, under the names only this config uses
        out.update(_INDEXER)
    for k in _TOPK:
        if isinstance(d.get(k), int) and d[k] > 2 or (k in d and d[k] is None and moe):
            out[k] = 2
    if moe and "n_shared_experts" in d and d["n_shared_experts"] is None:
        out["n_shared_experts"] = 1
    for k, lim in (("n_group", 1), ("num_expert_group", 1), ("topk_group", 1), ("n_shared_experts", 1),
                   ("num_shared_experts", 1)):  # num_expert_group: Bailing's name for n_group
        if isinstance(d.get(k), int) and d[k] > lim:
            out[k] = lim
    for k in _WINDOWS:
        if isinstance(d.get(k), int) and not isinstance(d.get(k), bool) and d[k] > 8:
            out[k] = 8
    if isinstance(d.get("qk_rope_head_dim"), int) and d["qk_rope_head_dim"] > 0:  # MLA: every rank scaled together
        s = 8 / d["qk_rope_head_dim"]
        for k in _MLA:
            if isinstance(d.get(k), int) and d[k] > 0:
                out[k] = _even(d[k] * s)
        if isinstance(d.get("qk_head_dim"), int):
            out["qk_head_dim"] = out.get("qk_nope_head_dim", 0) + out["qk_rope_head_dim"]
        if d.get("head_dim") == d["qk_rope_head_dim"]:  # DeepSeek: head_dim names the rotary part's width
            out["head_dim"] = out["qk_rope_head_dim"]
    if isinstance(d.get("rotary_dim"), int) and old_hd:  # GPT-J style: an absolute rotary width
        out["rotary_dim"] = _even(16 * d["rotary_dim"] / old_hd, lo=2)
    new_hd = out.get("head_dim") or 16
    for k in ("rope_parameters", "rope_scaling"):
        if isinstance(d.get(k), dict) and old_hd:
            out[k] = _shrink_rope(d[k], old_hd // 2, new_hd // 2)
    _shrink_layers(d, out)
    if isinstance(d.get("num_layers_per_stack"), int) and isinstance(d.get("H_cycles"), int):
        # HRM: num_hidden_layers counts cache slots (one per stack layer per cycle): the stacks shrink, the cycles stay
        out["num_layers_per_stack"] = 2
        out["num_hidden_layers"] = 2 * d["H_cycles"] * (d["L_cycles"] + 1)
    # a hybrid whose default stack has no softmax attention (Bamba, Granite 4.0-H) would rotate nothing: its last
    # layer becomes attention, as in its checkpoints
    key, _ = _n_layers(out)
    if "attn_layer_indices" in d and not d["attn_layer_indices"] and key is not None:
        out["attn_layer_indices"] = [out[key] - 1]
    types = out.get("layer_types")
    if isinstance(types, list) and types and set(types) == {"linear_attention"}:
        out["layer_types"] = [*types[:-1], "full_attention"]
    return out


def _describe(cfg) -> str:
    """The structure fields the tiny config kept, in one line (layer types, windows, experts, rotary, MLA)."""
    d = cfg.get_text_config().to_dict()
    parts = []
    key, n = _n_layers(d)
    if n is not None:
        parts.append(f"{n} layers")
    for k in _per_layer_keys(d, n or -1):
        if k.endswith(("types", "layers")) or k == "layer_types":
            vals = d[k]
            parts.append(f"{k}={''.join(vals) if isinstance(vals, str) else vals}")
    for k in ("attn_layer_indices", "cross_attention_layers"):
        if isinstance(d.get(k), list):
            parts.append(f"{k}={d[k]}")
    for k in (*_WINDOWS, "indexer_budget", *_EXPERTS, "partial_rotary_factor", "rotary_dim", "rotary_pct", *_MLA[:2],
              "num_kv_shared_layers", "attn_logit_softcapping", "first_k_dense_replace", "max_window_layers"):
        if d.get(k) not in (None, False) and not isinstance(d.get(k), (dict, list)):
            if k == "max_window_layers" and not d.get("use_sliding_window"):
                continue
            parts.append(f"{k}={d[k]}")
    return "; ".join(parts)


def shrink_config(model_type: str):
    """The tiny config of ``model_type``: its config class's defaults shrunk (see module doc); raises :class:`NotBuilt`."""
    from transformers import CONFIG_MAPPING

    try:
        cls = CONFIG_MAPPING[model_type]
    except KeyError:
        raise NotBuilt(f"transformers has no config class for {model_type!r}") from None
    try:
        base = cls()
    except Exception as e:  # noqa: BLE001 — a config class whose defaults do not build is reported, not raised
        raise NotBuilt(f"{cls.__name__}() fails: {_line(e)}") from None
    d = base.to_dict()
    if isinstance(d.get("text_config"), dict) and "model_type" in d["text_config"]:
        from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

        tt = d["text_config"]["model_type"]
        if tt in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES:
            raise NotBuilt(f"composite config: its text tower is {tt!r} (checked on its own)")
        # no causal-LM class of its own (Emu3, Mllama): the composite type's class builds the text tower alone
    small = _shrink_nested(d)
    attn = small.get("attn_config")
    if isinstance(attn, dict) and "rope_theta" not in attn and "rope_theta" in (small.get("rope_parameters") or {}):
        # DBRX: HF's default config neither builds (its attention stores attn_config.rope_theta, a field its config
        # class no longer declares) nor runs (clamp(None, None) fails for clip_qkv=None); both are filled as its
        # checkpoints set them: the base it rotates by (rope_parameters'), and q, k, v clipped to ±8
        attn["rope_theta"] = small["rope_parameters"]["rope_theta"]
        if "clip_qkv" in attn and attn["clip_qkv"] is None:
            attn["clip_qkv"] = _DBRX_CLIP
    try:
        cfg = cls.from_dict(small)
    except Exception as e:  # noqa: BLE001
        raise NotBuilt(f"the shrunk {cls.__name__} fails: {_line(e)}") from None
    cfg._attn_implementation = "eager"
    return cfg


def _shrink_nested(d: dict[str, Any]) -> dict[str, Any]:
    """``d`` shrunk, and each sub-config in it shrunk the same way (DBRX's attention, Phi-4's audio tower, ...)."""
    out = _shrink_dict(d)
    out.pop("transformers_version", None)
    for k, v in d.items():
        if isinstance(v, dict) and "model_type" in v:
            out[k] = _shrink_nested(v)
    return out


def _line(e: BaseException) -> str:
    msg = str(e).strip().splitlines()
    return f"{type(e).__name__}: {msg[0][:200] if msg else ''}"


# ------------------------------------------------------------------------------------ checking
def _hf_model(config, seed: int):
    """The tiny HF model of ``config`` (eager, float32, q/k weights ×4 so attention is far from uniform)."""
    from transformers import AutoModelForCausalLM

    from ropelens.testing import spread_weights

    try:
        with torch.random.fork_rng():
            torch.manual_seed(seed)
            model = AutoModelForCausalLM.from_config(config, attn_implementation="eager", dtype=torch.float32)
    except Exception as e:  # noqa: BLE001 — HF cannot build it: not ropelens's business
        raise NotBuilt(_init_failure(config, e)) from None
    n = sum(p.numel() for p in model.parameters())
    if n > MAX_PARAMS:
        big = max(model.named_parameters(), key=lambda kv: kv[1].numel())
        raise NotBuilt(f"{n / 1e6:.0f}M parameters after shrinking (largest: {big[0]} {tuple(big[1].shape)})")
    spread_weights(model, seed)
    with torch.no_grad():
        for pname, p in model.named_parameters():
            if p.ndim == 2 and any(s in pname for s in _SHARPEN):
                p.mul_(4.0)
        g = torch.Generator().manual_seed(seed + 2)
        for m in model.modules():  # learned sinks start at 0 (Granite SWA): spread, so a sign or a sink misplaced shows
            if isinstance(getattr(m, "sinks", None), torch.nn.Parameter):
                m.sinks.copy_(torch.randn(m.sinks.shape, generator=g) * 2)
    return model.eval()


def save_tiny(model_type: str, path: str | Path, *, seed: int = 0) -> Path:
    """Save the sweep's tiny random model of ``model_type`` (:func:`shrink_config`, attention sharpened) and a
    tokenizer to ``path``, for ``ropelens.load_model(path)``; raises :class:`NotBuilt` where HF cannot build it."""
    from ropelens.testing import tiny_tokenizer

    path = Path(path)
    config = shrink_config(model_type)
    _save(_hf_model(config, seed), config, path)
    tiny_tokenizer().save_pretrained(path)
    return path


def _save(model, config, path: Path) -> None:
    """Save ``model`` with ``config``: a text tower built alone from a composite config (Mllama, Emu3) keeps the
    composite config.json, the one its checkpoints carry and the only one AutoModelForCausalLM maps to its class."""
    model.save_pretrained(path)
    if type(model.config) is not type(config):
        config.architectures = [type(model).__name__]
        config.save_pretrained(path)


def _init_failure(config, e: BaseException) -> str:
    """Why HF cannot build ``config``'s model, in one line: where its modeling code failed, and whether its config
    class's own defaults fail the same way (a transformers bug, not the shrinking's) or build (the shrinking's)."""
    from transformers import AutoModelForCausalLM

    frames = [f for f in traceback.extract_tb(e.__traceback__) if "/transformers/models/" in f.filename.replace("\\", "/")]
    code = (frames[-1].line or "").strip() if frames else ""
    where = f" at {Path(frames[-1].filename).name}:{frames[-1].lineno} `{code[:120]}`" if frames else ""
    try:
        default = type(config)()
        with torch.device("meta"):  # full size, no memory: only whether it builds
            AutoModelForCausalLM.from_config(default, attn_implementation="eager")
    except Exception as d_e:  # noqa: BLE001 — HF's own defaults failing is the finding
        if _line(d_e) != _line(e):
            return f"model init fails: {_line(e)}{where}; HF's default config fails too: {_line(d_e)}"
        unset = [f"{k}={v!r}" for k in dict.fromkeys(re.findall(r"config\.(\w+)", code))
                 if (v := getattr(default, k, 0)) is None or v in ({}, [])]  # the defaults' unset fields it reads
        return (f"HF's default config does not build: {type(config).__name__}() → {_line(e)}{where}"
                + (f" (default {', '.join(unset)})" if unset else ""))
    return f"model init fails: {_line(e)}{where} (HF's default config builds: the shrinking broke it)"


def check_config(name: str, config, *, seed: int = 0, workdir: str | Path | None = None) -> SweepCheck:
    """Save ``config``'s tiny model, load it through ``load_model(path)`` and measure ropelens against HF.

    The measurements are :func:`ropelens.testing.families.check_family`'s (rotary buffers, eager
    scores, probabilities, rotation of one token repeated), without a hand-written expected
    structure: every reference number is HF's own; then frequency usage and band statistics against
    dense references from HF's attention inputs, and a RoPE variant with its exact restore
    (:mod:`ropelens.testing.sweep_checks`). An error that cannot be taken (HF's attention has no
    ``eager_attention_forward``, no rotary module with ``inv_freq``) stays NaN. Raises
    :class:`NotBuilt` when HF itself cannot build, save, reload or run the model.
    """
    from transformers import AutoModelForCausalLM

    from ropelens.analyses.decompose import decompose_attention
    from ropelens.bands import Bands
    from ropelens.capture import capture_qk
    from ropelens.models import load_model
    from ropelens.reading import rope_spec
    from ropelens.testing import tiny_tokenizer
    from ropelens.verify import verify_model

    res = SweepCheck(name)
    g = torch.Generator().manual_seed(seed)
    toks = torch.randint(4, VOCAB, (1, N_CHECK), generator=g)
    toks[0, 0] = 1
    with tempfile.TemporaryDirectory(dir=workdir) as tmp:
        path = Path(tmp) / name
        try:
            _save(_hf_model(config, seed), config, path)
            tiny_tokenizer().save_pretrained(path)
            hf = AutoModelForCausalLM.from_pretrained(path, attn_implementation="eager", dtype=torch.float32).eval()
            with torch.no_grad(), hf_scores(hf) as scores, _hf_rotations(hf) as rotations:
                probs = hf(toks, output_attentions=True).attentions
        except NotBuilt:
            raise
        except Exception as e:  # noqa: BLE001
            raise NotBuilt(f"HF save/reload/forward fails: {_line(e)}") from None
        res.architecture = type(hf).__name__
        try:
            model = load_model(path, device="cpu")
            spec = rope_spec(model)
        except NotRotaryError as e:
            if not rotations:  # HF agrees: the forward calls no rotation and runs no rotary module
                raise NoRope(res.architecture, f"HF's forward applies no rotary embedding ({_no_rotation(hf)}); ropelens agrees: "
                             f"{str(e).split(':')[0]}") from None
            res.refusal = str(e)  # HF rotates and ropelens says it does not: a refusal, shown as one
            return res
        except UnsupportedModelError as e:  # ropelens's one-line refusal
            res.refusal = str(e)
            return res
        try:  # the probe's verdict; the errors below are measured either way (they show what it caught)
            verify_model(model, spec)
        except UnsupportedModelError as e:
            res.refusal = str(e)
    res.kinds = spec.kinds
    rotary = spec.rotary_layers
    res.layers_checked = rotary
    if not rotary:
        return res
    res.inv_freq_err = _inv_freq_err(hf, spec, rotary)
    try:
        dec = decompose_attention(model, toks, bands=Bands.all(), layers=rotary, verify=False)
    except UnsupportedModelError as e:  # an analysis refusing in one line is a refusal too
        res.refusal = str(e)
        return res
    res.scores_err = res.pattern_err = 0.0
    probs = _with_hf_sinks(hf, probs_by_layer(probs, spec), scores)
    for L in rotary:
        ours = dec.logits(L)
        ok = torch.isfinite(ours)
        if L in scores and scores[L].shape == ours.shape:
            ref = scores[L]
            res.scores_err = max(res.scores_err, float((ours[ok] - ref[ok]).abs().max() / ref[ok].abs().max()))
        else:
            res.scores_err = math.nan
        ref_p = probs.get(L)
        if ref_p is None or ref_p.shape != ours.shape:
            res.pattern_err = math.nan
            continue
        res.pattern_err = max(res.pattern_err, float((dec.rebuilt_pattern(L) - ref_p).abs().max()))
    same = torch.full((1, N_CHECK), 7)
    acts = capture_qk(model, same, layers=rotary, which=("q_pre", "q_rot"))
    res.pairing_err = 0.0
    for L in rotary:  # as in check_family: layers whose pre-RoPE queries vary with position are skipped
        lr, q, pre = spec[L], acts[L]["q_rot"][0], acts[L]["q_pre"][0]  # before a norm after RoPE
        if float((pre - pre[:1]).abs().max()) > 1e-5 * float(pre.abs().max()):
            if rotary[0] != L:
                continue
            # a hybrid's linear-attention layers before the first attention layer mix positions: its pre-RoPE
            # queries differ, so the model's rotation is checked from them (captured before and after it)
            res.pairing_err = max(res.pairing_err, rotation_from_pre(lr, pre, q))
            continue
        res.pairing_err = max(res.pairing_err, rotation_error(lr, q))
    try:  # the analyses past the logits; one refusing in one line is a refusal, as decompose_attention's is
        res.usage_err = usage_error(model, spec, hf, hf_layers(hf, toks), toks, rotary)
        res.band_stats_err = band_stats_error(model, spec, hf, toks, rotary)
    except UnsupportedModelError as e:
        res.refusal = str(e)
        return res
    res.variant_err, res.restore_err, res.variant_note = variant_error(model, spec, toks, rotary)
    return res


@contextlib.contextmanager
def _hf_rotations(hf) -> Iterator[list[str]]:
    """Every rotation HF's forward applies, by name: calls of its modeling module's ``apply_rotary*`` functions and
    forwards of its rotary modules (a family that builds no rotary module and calls no rotation rotates nothing)."""
    mod = importlib.import_module(type(hf).__module__)
    seen: list[str] = []
    fns = {n: f for n, f in vars(mod).items() if n.startswith("apply_rotary") and callable(f)}

    def counted(name: str, fn):
        def call(*args, **kwargs):
            seen.append(name)
            return fn(*args, **kwargs)

        return call

    handles = [m.register_forward_hook(lambda m, _a, _o: seen.append(type(m).__name__))
               for m in hf.modules() if "rotary" in type(m).__name__.lower()]
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
    """What a non-rotating HF model has that looks rotary (why its modeling code matched), in a few words."""
    mod = importlib.import_module(type(hf).__module__)
    fns = sorted(n for n in vars(mod) if n.startswith("apply_rotary"))
    return f"{', '.join(fns)} defined, never called" if fns else "no rotary module, no rotation called"


def _with_hf_sinks(hf, probs: dict[int, torch.Tensor], scores: dict[int, torch.Tensor]) -> dict[int, torch.Tensor]:
    """HF's probabilities as its values see them: where a layer's learned sinks are left out of the probabilities it
    returns (rows summing to 1) and scale its output after the softmax instead (Granite SWA), times HF's own factor
    ``sigmoid(logsumexp(scores) − sink)``, the log-sum-exp over the allowed keys read at each row's largest entry
    (``p = exp(s − lse)`` there)."""
    sinks = {m.layer_idx: m.sinks.detach().float() for m in hf.modules()
             if isinstance(getattr(m, "sinks", None), torch.Tensor) and isinstance(getattr(m, "layer_idx", None), int)}
    out = dict(probs)
    for L, p in probs.items():
        if L not in sinks or L not in scores or scores[L].shape != p.shape:
            continue
        if float((p.sum(-1) - 1).abs().max()) > 1e-5:  # the sink's mass is in the probabilities already (gpt-oss)
            continue
        top = p.argmax(-1, keepdim=True)
        lse = (scores[L].gather(-1, top) - p.gather(-1, top).log()).squeeze(-1)
        out[L] = p * torch.sigmoid(lse - sinks[L].view(1, -1, 1)).unsqueeze(-1)
    return out


def table_phase_steps(table: torch.Tensor, n_pos: int = N_CHECK) -> torch.Tensor:
    """Each plane's angle step from position m to m + 1 (m < ``n_pos``) in a ``[n_pos, 2·half]`` sin|cos table.

    GPT-J and CodeGen keep no ``inv_freq``: their attention holds ``embed_positions``, the table
    ``[sin(m·θ) | cos(m·θ)]`` that HF's ``create_sinusoidal_positions`` builds and the forward reads.
    The angle of ``z(m+1)·conj(z(m))`` with ``z = cos + i·sin`` is the step the model rotates a plane
    by at each of the positions the check runs at: every row equals θ for a rotation at one frequency.
    """
    half = table.shape[1] // 2
    t = table[: n_pos + 1].double()
    z = torch.complex(t[:, half:], t[:, :half])
    return torch.angle(z[1:] * z[:-1].conj())


def _hf_tables(hf) -> list[torch.Tensor]:
    return [m.embed_positions for m in hf.modules()
            if isinstance(getattr(m, "embed_positions", None), torch.Tensor) and m.embed_positions.ndim == 2]


def _inv_freq_err(hf, spec, rotary: list[int]) -> float:
    """The spec's frequencies against HF's: its rotary buffers, else the phase steps of its sin|cos tables."""
    try:
        return max(float((spec[i].inv_freq - hf_inv_freq(hf, spec[i])).abs().max()) for i in rotary)
    except (InputError, RuntimeError):  # HF keeps no inv_freq buffer (or one of another width) to compare with
        pass
    tables = _hf_tables(hf)
    if not tables:
        return math.nan
    err = 0.0
    for i in rotary:  # one table per attention layer (GPT-J, CodeGen), else one for the model
        steps = table_phase_steps(tables[i] if len(tables) == spec.n_layers else tables[0])
        if steps.shape[1] != spec[i].inv_freq.numel():
            return math.nan
        # float32 table: m·θ rounds to ~m·θ·6e-8 ≤ 2e-6 rad for m ≤ 24, so a match is ~1e-6 and a misread θ is O(θ)
        err = max(err, float((steps - spec[i].inv_freq.double()).abs().max()))
    return err


_ERRORS = ("inv_freq_err", "scores_err", "pattern_err", "pairing_err", "usage_err", "band_stats_err", "variant_err",
           "restore_err")


def classify(check: SweepCheck) -> tuple[str, str]:
    """One status and its detail: ``refused`` (the refusal's first line), ``exact``, ``wrong`` or ``unverified``.

    A variant that rotates off its spec or does not restore the logits bit for bit is ``wrong``; a model without
    variants (a plain HF model, a one-line refusal) is not a fault: its note is the detail."""
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
    missing = [k for k, v in errs.items() if math.isnan(v) and not (note and k in ("variant_err", "restore_err"))]
    if missing:
        return "unverified", "HF gave no reference for " + ", ".join(missing)
    return "exact", note


def sweep_one(model_type: str, *, seed: int = 0, workdir: str | Path | None = None) -> SweepRow:
    """Shrink, build and check ``model_type``; every outcome becomes a row (ropelens's own errors as ``crashed``)."""
    row = SweepRow(model_type, "not built")
    try:
        cfg = shrink_config(model_type)
        row.structure = _describe(cfg)
        check = check_config(model_type, cfg, seed=seed, workdir=workdir)
    except NotBuilt as e:
        row.detail = str(e)
        return row
    except NoRope as e:
        row.status, (row.architecture, row.detail) = "no RoPE", e.args
        return row
    except Exception as e:  # noqa: BLE001 — ropelens raised something other than a refusal: a bug, reported
        row.status, row.detail = "crashed", _line(e)
        return row
    row.architecture = check.architecture
    row.status, row.detail = classify(check)
    row.kinds = check.kinds
    row.errors = {k: getattr(check, k) for k in _ERRORS}
    return row
