"""Tiny configs from a transformers config class's defaults, with the family's structure kept.

:func:`shrink_config` turns a model type's default config into a tiny one: hidden size 64, 4 heads
of 16, intermediate 128, a vocabulary of 101, sliding windows cut to at most 8 (so a 24-token input
is longer than any window), a few experts, the partial rotary factor, MLA ranks scaled together,
NoPE layers, soft-caps, and 2-4 layers holding every kind of layer of the default pattern; each
sub-config (DBRX's attention, Phi-4's audio tower) is shrunk the same way. :class:`NotBuilt` says
why a config cannot be made or built.
"""

from __future__ import annotations

from typing import Any

from ropelens.testing.families import VOCAB

__all__ = ["NotBuilt", "describe_config", "one_line", "shrink_config"]

_HIDDEN = (
    "hidden_size",
    "n_embd",
    "d_model",
    "dim",
    "hidden_size_global",
)  # _global: BLT's global stack, seen locally
_LAYERS = ("num_hidden_layers", "n_layer", "n_layers", "num_layers")
_HEADS = ("num_attention_heads", "n_head", "n_heads", "swa_num_attention_heads")
_KV_HEADS = (
    "num_key_value_heads",
    "num_kv_heads",
    "num_query_groups",
    "multi_query_group_num",
    "swa_num_key_value_heads",
)
_HEAD_DIMS = (
    "head_dim",
    "kv_channels",
    "attention_head_dim",
    "swa_head_dim",
    "index_head_dim",
    "linear_key_head_dim",
    "linear_value_head_dim",
    "linear_head_dim",
)
_LINEAR_HEADS = (
    "linear_num_key_heads",
    "linear_num_value_heads",
    "linear_num_heads",
    "index_n_heads",
)
_EXPERTS = ("num_experts", "n_routed_experts", "num_local_experts", "moe_num_experts")
_TOPK = ("num_experts_per_tok", "num_experts_per_token", "moe_topk", "top_k", "moe_k")
_WINDOWS = (
    "sliding_window",
    "sliding_window_size",
    "attention_window_size",
    "local_attention_window_len",
    "attention_chunk_size",
    "local_attention",
    "window_size",
    "index_topk",
)  # index_topk: DSA picks keys
_MLA = (
    "q_lora_rank",
    "kv_lora_rank",
    "qk_rope_head_dim",
    "qk_nope_head_dim",
    "v_head_dim",
    "o_lora_rank",
)
_INDEX_LISTS = (
    "full_attn_idxs",
    "moe_layers",
    "mlp_only_layers",
    "hybrid_layer_ids",
    "attn_layer_indices",
    "cross_attention_layers",
)
_COUNTS_FROM_START = ("first_k_dense_replace", "max_window_layers", "moe_layer_start_index")
_PERIODS = (
    ("attn_layer_period", "attn_layer_offset"),
    ("expert_layer_period", "expert_layer_offset"),
)
_IDS = {"bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 3}
# Qwen4-Exp's QSA indexer, unset in its defaults though they make every 4th layer indexed: one key
# head (required), a head as wide as the attention's (its rotary part must fit), a budget of 4
# blocks of 2 keys, under the 24-token input
_INDEXER = {
    "indexer_n_heads": 4,
    "indexer_kv_heads": 1,
    "indexer_head_dim": 16,
    "indexer_budget": 8,
    "indexer_compress_ratio": 2,
}


_DBRX_CLIP = 8.0  # dbrx-base/instruct's clip_qkv


class NotBuilt(Exception):
    """This family's tiny model cannot be built here (the message says why, in one line)."""


def one_line(e: BaseException) -> str:
    msg = str(e).strip().splitlines()
    return f"{type(e).__name__}: {msg[0][:200] if msg else ''}"


# ------------------------------------------------------------------------------------ checking


def _even(x: float, lo: int = 8) -> int:
    return max(lo, 2 * round(x / 2))


def _n_layers(d: dict[str, Any]) -> tuple[str | None, int | None]:
    for k in _LAYERS:
        if isinstance(d.get(k), int) and not isinstance(d.get(k), bool):
            return k, d[k]
    return None, None


def _per_layer_keys(d: dict[str, Any], n: int) -> list[str]:
    """Keys holding one entry per layer (layer_types, no_rope_layers, mlp_layer_types, ...)."""
    return [
        k
        for k, v in d.items()
        if k not in _INDEX_LISTS
        and isinstance(v, (list, str))
        and len(v) == n
        and k not in ("architectures",)
        and not k.endswith(("_token_id", "_token_ids"))
    ]


def _per_layer_dicts(d: dict[str, Any], n: int) -> list[str]:
    """Keys holding a dict keyed by layer index (Gemma 4's per_layer_config)."""
    return [
        k
        for k, v in d.items()
        if isinstance(v, dict)
        and v
        and "model_type" not in v
        and all(str(j).isdigit() and int(j) < n for j in v)
    ]


def _signature(d: dict[str, Any], n: int, per_layer: list[str], i: int) -> tuple:
    """What makes layer ``i`` of this config a kind of its own (every field that varies by
    layer)."""
    sig: list[Any] = [repr(d[k][i]) for k in per_layer]
    sig += [i in (d.get(k) or ()) for k in _INDEX_LISTS if isinstance(d.get(k), list)]
    sig += [repr({int(j): v for j, v in d[k].items()}.get(i)) for k in _per_layer_dicts(d, n)]
    sig += [
        i < d[k]
        for k in _COUNTS_FROM_START
        if isinstance(d.get(k), int) and k != "max_window_layers"
    ]
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
    """The first layer of every kind, then the next layers in order up to ``want``: the pattern's
    start, every kind kept."""
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
    for (
        period,
        offset,
    ) in _PERIODS:  # e.g. Jamba: attention every 8th layer from 4 → every 2nd from 1
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
    for k in _per_layer_dicts(
        d, d[key]
    ):  # keys keep their format ("05"); widths inside scale like head_dim
        by_layer, width = {int(j): v for j, v in d[k].items()}, max(len(str(j)) for j in d[k])
        out[k] = {
            str(j).zfill(width): _scale_widths(by_layer[i], d, out)
            for j, i in enumerate(sel)
            if i in by_layer
        }
    for k in _COUNTS_FROM_START:
        if isinstance(d.get(k), int) and not isinstance(d.get(k), bool):
            out[k] = sum(i < d[k] for i in sel)
    if isinstance(d.get("moe_layer_end_index"), int) and d["moe_layer_end_index"] >= 0:
        out["moe_layer_end_index"] = max(
            [j for j, i in enumerate(sel) if i <= d["moe_layer_end_index"]], default=0
        )
    if isinstance(d.get("num_kv_shared_layers"), int):
        out["num_kv_shared_layers"] = sum(i >= d[key] - d["num_kv_shared_layers"] for i in sel)


def _scale_widths(v: Any, d: dict[str, Any], out: dict[str, Any]) -> Any:
    """A per-layer override's widths scaled as the global ones were (Gemma 4: head_dim 512 over 256
    → 32 over 16; Dots 3: its sliding layers' head counts and MLA ranks, and the head width those
    ranks sum to)."""
    if not isinstance(v, dict):
        return v
    new = dict(v)
    if isinstance(v.get("head_dim"), int) and isinstance(d.get("head_dim"), int):
        new["head_dim"] = _even(16 * v["head_dim"] / d["head_dim"])
    heads = d.get("num_attention_heads")
    for k in (
        "num_attention_heads",
        "num_key_value_heads",
    ):  # as the per-layer head lists are scaled
        if isinstance(v.get(k), int) and isinstance(heads, int):
            new[k] = (
                (4 if v[k] >= heads else 1 if v[k] == 1 else 2)
                if "key_value" in k
                else max(1, round(4 * v[k] / heads))
            )
    rope = d.get("qk_rope_head_dim")
    if (
        isinstance(rope, int) and rope > 0 and any(k in v for k in _MLA)
    ):  # MLA: the global ranks' scale
        for k in _MLA:
            if isinstance(v.get(k), int) and v[k] > 0:
                new[k] = _even(v[k] * 8 / rope)

        def width(src: dict[str, Any], k: str) -> Any:
            return src.get(k, (d if src is v else out).get(k))

        old = [width(v, k) for k in ("head_dim", "qk_nope_head_dim", "qk_rope_head_dim")]
        if (
            all(isinstance(x, int) for x in old) and old[0] == old[1] + old[2]
        ):  # a head width the ranks sum to stays so
            new["head_dim"] = width(new, "qk_nope_head_dim") + width(new, "qk_rope_head_dim")
    return new


def _shrink_rope(rp: Any, old_half: int, new_half: int) -> Any:
    """Rotary parameters whose lists have one entry per frequency (LongRoPE factors, M-RoPE
    sections) rescaled."""
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


def _scaled_head_count(count: int, n_heads: int, kv: bool) -> int:
    """A head count of a config with ``n_heads`` query heads, scaled to the tiny config's 4.

    KV heads: 4 where every query head has its own, 1 where one is shared, else 2 (grouped).
    """
    if kv:
        return 4 if count >= n_heads else 1 if count == 1 else 2
    return max(1, round(4 * count / n_heads))


def _shrink_attention_widths(d: dict[str, Any], out: dict[str, Any], n_heads, hidden) -> None:
    """Hidden size 64, 4 heads of 16, KV heads scaled, head widths 16."""
    for k in _HIDDEN:
        if isinstance(d.get(k), int):
            out[k] = 64
    if isinstance(d.get("attention_hidden_size"), int) and hidden:
        # Zamba2: attention reads 2 × hidden (the input and the embeddings)
        out["attention_hidden_size"] = d["attention_hidden_size"] * 64 // hidden
    for k in _HEADS:
        if isinstance(d.get(k), int):
            out[k] = 4
    for k in _KV_HEADS:
        if isinstance(d.get(k), int) and n_heads:
            out[k] = _scaled_head_count(d[k], n_heads, kv=True)
        elif k in d and d[k] is None and n_heads and k == "num_key_value_heads":
            # unset: one KV head per query head (HF's convention), which some models do not
            # derive (Nemotron)
            out[k] = 4
    for k in _HEAD_DIMS:
        if isinstance(d.get(k), int) and not isinstance(d.get(k), bool):
            out[k] = 16
    if "head_dim" in d and d["head_dim"] is None:
        out["head_dim"] = 16  # left for the model to derive; some derive nothing
    for k, v in d.items():  # per-layer head counts (Laguna): scaled like the global ones
        if (
            isinstance(v, list)
            and v
            and n_heads
            and "heads" in k
            and all(isinstance(x, int) for x in v)
        ):
            kv = "key_value" in k or "kv" in k
            out[k] = [_scaled_head_count(count, n_heads, kv) for count in v]


def _shrink_mamba(d: dict[str, Any], out: dict[str, Any]) -> None:
    """Mamba-2 heads of 16 that tile expand × hidden, one group."""
    if not (isinstance(d.get("mamba_expand"), int) or isinstance(d.get("mamba_n_heads"), int)):
        return
    inner = (d.get("mamba_expand") or 2) * 64
    for k in ("mamba_d_head", "mamba_head_dim", "mamba_headdim"):
        if isinstance(d.get(k), int):
            out[k] = 16
    for k in ("mamba_n_heads", "mamba_num_heads"):
        if isinstance(d.get(k), int):
            out[k] = inner // 16
    if isinstance(d.get("mamba_d_ssm"), int):
        out["mamba_d_ssm"] = inner
    if isinstance(d.get("mamba_n_groups"), int):
        out["mamba_n_groups"] = 1


def _shrink_other_heads(d: dict[str, Any], out: dict[str, Any], old_head_dim) -> None:
    """Wider global heads keep their ratio; linear-attention head counts too (the fewest: 2)."""
    if isinstance(d.get("global_head_dim"), int) and old_head_dim:
        out["global_head_dim"] = _even(16 * d["global_head_dim"] / old_head_dim)
    linear_heads = [d[k] for k in _LINEAR_HEADS if isinstance(d.get(k), int)]
    for k in _LINEAR_HEADS:
        if isinstance(d.get(k), int):
            out[k] = max(1, 2 * d[k] // min(linear_heads))


_KEEP = object()  # _shrunk_field's answer for a field it leaves as it is


def _shrunk_field(k: str, v: Any) -> Any:
    """A vocabulary, token id or feed-forward width field's tiny value, or ``_KEEP``."""
    if isinstance(v, bool):
        return _KEEP
    if ("vocab_size" in k or k.endswith("_vocab")) and isinstance(v, int):
        return VOCAB  # _vocab: BLT's hashed n-gram tables
    if k in _IDS and v is not None:
        return [_IDS[k]] if isinstance(v, list) else _IDS[k]
    if k.endswith(("_token_id", "_token_index")) and isinstance(v, int) and v >= VOCAB:
        return 0  # ids past the tiny vocabulary (image, audio, ...): never in the check's input
    feed_forward = "intermediate_size" in k or k in (
        "ffn_hidden_size",
        "ffn_dim",
        "expert_ffn_hidden_size",
    )
    if feed_forward and isinstance(v, int):
        return 32 if any(s in k for s in ("moe", "expert", "shared")) else 128
    if "intermediate_size" in k and isinstance(v, list):
        return [128] * len(v)
    return _KEEP


def _shrink_experts(d: dict[str, Any], out: dict[str, Any]) -> None:
    """4 experts, 2 per token, one shared, one group; a sparse-attention indexer's sizes filled."""
    for k in _EXPERTS:
        if isinstance(d.get(k), int) and d[k] > 4:
            out[k] = 4
    moe = any(isinstance(d.get(k), int) for k in _EXPERTS) or isinstance(
        d.get("moe_intermediate_size"), int
    )
    for k in _EXPERTS:  # defaults that leave the expert count unset (the model cannot build)
        if k in d and d[k] is None and moe:
            out[k] = 4
    types = d.get("layer_types")
    if (
        isinstance(types, list)
        and "indexed_attention" in types
        and all(k in d and d[k] is None for k in _INDEXER)
    ):
        # the indexer's sizes are the only part of that structure the defaults leave out (HF's
        # default config does not build): filled as the experts' count is, under the names only
        # this config uses
        out.update(_INDEXER)
    for k in _TOPK:
        if isinstance(d.get(k), int) and d[k] > 2 or (k in d and d[k] is None and moe):
            out[k] = 2
    if moe and "n_shared_experts" in d and d["n_shared_experts"] is None:
        out["n_shared_experts"] = 1
    for k, limit in (
        ("n_group", 1),
        ("num_expert_group", 1),  # Bailing's name for n_group
        ("topk_group", 1),
        ("n_shared_experts", 1),
        ("num_shared_experts", 1),
    ):
        if isinstance(d.get(k), int) and d[k] > limit:
            out[k] = limit


def _shrink_mla(d: dict[str, Any], out: dict[str, Any]) -> None:
    """Multi-head latent attention: every rank scaled together, the rotary part 8 wide."""
    if not (isinstance(d.get("qk_rope_head_dim"), int) and d["qk_rope_head_dim"] > 0):
        return
    scale = 8 / d["qk_rope_head_dim"]
    for k in _MLA:
        if isinstance(d.get(k), int) and d[k] > 0:
            out[k] = _even(d[k] * scale)
    if isinstance(d.get("qk_head_dim"), int):
        out["qk_head_dim"] = out.get("qk_nope_head_dim", 0) + out["qk_rope_head_dim"]
    if d.get("head_dim") == d["qk_rope_head_dim"]:
        out["head_dim"] = out["qk_rope_head_dim"]  # DeepSeek: head_dim names the rotary width


def _shrink_rotary(d: dict[str, Any], out: dict[str, Any], old_head_dim) -> None:
    """An absolute rotary width (GPT-J) and per-frequency rotary parameters rescaled."""
    if isinstance(d.get("rotary_dim"), int) and old_head_dim:
        out["rotary_dim"] = _even(16 * d["rotary_dim"] / old_head_dim, lo=2)
    new_head_dim = out.get("head_dim") or 16
    for k in ("rope_parameters", "rope_scaling"):
        if isinstance(d.get(k), dict) and old_head_dim:
            out[k] = _shrink_rope(d[k], old_head_dim // 2, new_head_dim // 2)


def _shrink_sections(d: dict[str, Any], out: dict[str, Any]) -> None:
    """Stacks counted in sections (HRM's cycles, Dory's input, recurrent and output layers)."""
    if isinstance(d.get("num_layers_per_stack"), int) and isinstance(d.get("H_cycles"), int):
        # HRM: num_hidden_layers counts cache slots (one per stack layer per cycle): the stacks
        # shrink, the cycles stay
        out["num_layers_per_stack"] = 2
        out["num_hidden_layers"] = 2 * d["H_cycles"] * (d["L_cycles"] + 1)
    if not all(
        isinstance(d.get(k), int)
        for k in ("n_input_layers", "n_output_layers", "n_recurrent_loops")
    ):
        return
    # Dory: input, recurrent (run n_recurrent_loops times) and output sections that sum to
    # num_hidden_layers
    out.update(n_input_layers=1, n_recurrent_layers=2, n_output_layers=1, num_hidden_layers=4)
    types = d.get("layer_types")
    if isinstance(types, list) and "mlp" in types:
        # its saved form lists (attention, mlp) blocks: counts doubled
        kinds = [t for t in types if t != "mlp"]
        # the first and last kinds of its stack (sliding ×3, then full)
        attention_kinds = [kinds[0]] * 3 + [kinds[-1]]
        out.update(
            layer_types=[x for t in attention_kinds for x in (t, "mlp")],
            n_input_layers=2,
            n_recurrent_layers=4,
            n_output_layers=2,
            num_hidden_layers=8,
        )


def _keep_attention_layer(d: dict[str, Any], out: dict[str, Any]) -> None:
    """Make the last layer attention where the tiny stack would have none.

    A hybrid whose default stack has no softmax attention (Bamba, Granite 4.0-H) would rotate
    nothing: its last layer becomes attention, as in its checkpoints.
    """
    key, _ = _n_layers(out)
    if "attn_layer_indices" in d and not d["attn_layer_indices"] and key is not None:
        out["attn_layer_indices"] = [out[key] - 1]
    types = out.get("layer_types")
    if isinstance(types, list) and types and set(types) == {"linear_attention"}:
        out["layer_types"] = [*types[:-1], "full_attention"]


def _shrink_dict(d: dict[str, Any]) -> dict[str, Any]:
    """The tiny config's fields: small widths, every structural field kept (see module doc).

    ``d`` is the default config's fields; each step reads them and writes the tiny value in order
    (later steps read what earlier ones wrote: the head width, the layer count).
    """
    out = dict(d)
    n_heads = next((d[k] for k in _HEADS if isinstance(d.get(k), int)), None)
    hidden = next((d[k] for k in _HIDDEN if isinstance(d.get(k), int)), None)
    old_head_dim = d.get("head_dim") or (hidden // n_heads if hidden and n_heads else None)
    _shrink_attention_widths(d, out, n_heads, hidden)
    _shrink_mamba(d, out)
    _shrink_other_heads(d, out, old_head_dim)
    for k, v in d.items():
        value = _shrunk_field(k, v)
        if value is not _KEEP:
            out[k] = value
    _shrink_experts(d, out)
    for k in _WINDOWS:
        if isinstance(d.get(k), int) and not isinstance(d.get(k), bool) and d[k] > 8:
            out[k] = 8
    _shrink_mla(d, out)
    _shrink_rotary(d, out, old_head_dim)
    _shrink_layers(d, out)
    _shrink_sections(d, out)
    _keep_attention_layer(d, out)
    return out


def describe_config(cfg) -> str:
    """The structure fields the tiny config kept, in one line (layer types, windows, experts,
    rotary, MLA)."""
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
    for k in (
        *_WINDOWS,
        "indexer_budget",
        *_EXPERTS,
        "partial_rotary_factor",
        "rotary_dim",
        "rotary_pct",
        *_MLA[:2],
        "num_kv_shared_layers",
        "attn_logit_softcapping",
        "first_k_dense_replace",
        "max_window_layers",
    ):
        if d.get(k) not in (None, False) and not isinstance(d.get(k), (dict, list)):
            if k == "max_window_layers" and not d.get("use_sliding_window"):
                continue
            parts.append(f"{k}={d[k]}")
    return "; ".join(parts)


_TEMPERATURE_L0 = 8


def shrink_config(model_type: str):
    """The tiny config of ``model_type``: its config class's defaults shrunk (see module doc);
    raises :class:`NotBuilt`."""
    from transformers import CONFIG_MAPPING

    try:
        cls = CONFIG_MAPPING[model_type]
    except KeyError:
        raise NotBuilt(f"transformers has no config class for {model_type!r}") from None
    try:
        base = cls()
    except Exception as e:
        raise NotBuilt(f"{cls.__name__}() fails: {one_line(e)}") from None
    d = base.to_dict()
    if isinstance(d.get("text_config"), dict) and "model_type" in d["text_config"]:
        from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

        tt = d["text_config"]["model_type"]
        if tt in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES:
            raise NotBuilt(f"composite config: its text tower is {tt!r} (checked on its own)")
        # no causal-LM class of its own (Emu3, Mllama): the composite type's class builds the text
        # tower alone
    small = _shrink_nested(d)
    attn = small.get("attn_config")
    if (
        isinstance(attn, dict)
        and "rope_theta" not in attn
        and "rope_theta" in (small.get("rope_parameters") or {})
    ):
        # DBRX: HF's default config neither builds (its attention stores attn_config.rope_theta, a
        # field its config class no longer declares) nor runs (clamp(None, None) fails for
        # clip_qkv=None); both are filled as its checkpoints set them: the base it rotates by
        # (rope_parameters'), and q, k, v clipped to ±8
        attn["rope_theta"] = small["rope_parameters"]["rope_theta"]
        if "clip_qkv" in attn and attn["clip_qkv"] is None:
            attn["clip_qkv"] = _DBRX_CLIP
    rp = small.get("rope_parameters")
    if (
        isinstance(rp, dict)
        and rp.get("llama_4_scaling_beta")
        and rp.get("original_max_position_embeddings")
    ):
        # a query temperature that starts at L₀ (Ministral 3: 16,384): L₀ = 8, so the sweep's
        # 24-token input crosses it twice and its β·ln(1 + ⌊m/L₀⌋) is measured, not left at 1
        rp["original_max_position_embeddings"] = _TEMPERATURE_L0
    try:
        cfg = cls.from_dict(small)
    except Exception as e:
        raise NotBuilt(f"the shrunk {cls.__name__} fails: {one_line(e)}") from None
    cfg._attn_implementation = "eager"
    return cfg


def _shrink_nested(d: dict[str, Any]) -> dict[str, Any]:
    """``d`` shrunk, and each sub-config in it shrunk the same way (DBRX's attention, Phi-4's audio
    tower, ...)."""
    out = _shrink_dict(d)
    out.pop("transformers_version", None)
    for k, v in d.items():
        if isinstance(v, dict) and "model_type" in v:
            out[k] = _shrink_nested(v)
    return out
