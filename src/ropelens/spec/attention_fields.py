"""What one HF attention module (and its layer's config) says about the layer: heads, KV heads,
NoPE, soft-cap, sinks, an output gate, a query temperature, and the position axis of each plane
under multimodal RoPE.

Leaf readers for :func:`ropelens.spec.reading.rope_spec`: each takes the module or config and
returns one field of :class:`ropelens.spec.rope.LayerRope`, reading the model's own attributes
before its config's.
"""

from __future__ import annotations

import json
from typing import Any

import torch

from ropelens.errors import UnsupportedModelError

__all__ = [
    "heads_of",
    "jsonable",
    "kv_heads_of",
    "layer_config",
    "output_gate",
    "plane_axes",
    "query_scale",
    "sinks_of",
    "softcap_of",
    "uses_rope",
]


def plane_axes(rotaries, inv: torch.Tensor) -> tuple[int, ...]:
    """The position axis (0 t, 1 h, 2 w) each plane turns by under multimodal RoPE, read from the
    model's own rotary.

    A rotary module with ``mrope_section`` (Qwen2-VL's contiguous sections, Qwen3-VL's and Qwen
    3.5's interleaved ones) is run once at positions t = 1, h = 2, w = 3: plane i's angle is then
    p·θ_i with p the position of its axis (every |angle| ≤ 3 < π, so atan2 returns it unwrapped). ()
    for 1-D RoPE.
    """
    n = inv.numel()
    rot = next(
        (
            m
            for m in rotaries
            if hasattr(m, "mrope_section")
            and isinstance(getattr(m, "inv_freq", None), torch.Tensor)
            and m.inv_freq.numel() == n
        ),
        None,
    )
    if rot is None or n == 0:
        return ()
    theta = rot.inv_freq.detach().double().cpu()
    probe = torch.tensor([1, 2, 3], device=rot.inv_freq.device).view(3, 1, 1)
    with torch.no_grad():
        cos, sin = rot(torch.zeros(1, device=rot.inv_freq.device), probe)
    ang = torch.atan2(sin.reshape(-1).double(), cos.reshape(-1).double()).cpu()
    turning = (
        theta > 0
    )  # an unrotated plane turns by nothing on any axis: label it time, as HF's recomposition does
    p = torch.where(turning, ang[:n] / theta.clamp_min(1e-300), torch.ones(n, dtype=torch.float64))
    axis = p.round() - 1
    # float32 angles of O(1): p is an integer to ~1e-6 relative; a rotary that does not label planes
    # by axis is O(1) off
    if (
        ang.numel() != 2 * n
        or not torch.allclose(ang[:n], ang[n:], atol=1e-6)
        or (p - p.round()).abs().max() > 1e-3
        or not ((axis >= 0) & (axis <= 2)).all()
    ):
        raise UnsupportedModelError(
            f"{type(rot).__name__}: multimodal rotary whose planes ropelens cannot assign to the "
            "time, height and width axes (its cos/sin at positions t=1, h=2, w=3 are not one "
            "axis's position times each plane's frequency, repeated over both halves)"
        )
    return tuple(int(a) for a in axis)


def layer_config(cfg, layer: int) -> Any:
    """Layer ``layer``'s config: HF's per-layer view of a heterogeneous config (Gemma 4), else the
    config itself."""
    if getattr(cfg, "is_heterogeneous", False):
        return cfg.per_layer_config[layer]
    return cfg


def heads_of(attn, cfg) -> int:
    """Query heads as the attention module counts them, else as its layer's config does."""
    for name in ("num_heads", "num_attention_heads"):
        n = getattr(attn, name, None)
        if isinstance(n, int) and n > 0:
            return n
    return int(cfg.num_attention_heads if hasattr(cfg, "num_attention_heads") else cfg.n_head)


def kv_heads_of(attn, n_heads: int, from_config: int) -> int:
    """KV heads as the attention module uses them (a config key the family ignores must not
    count)."""
    groups = getattr(attn, "num_key_value_groups", None)
    for name in ("num_key_value_heads", "num_kv_heads"):  # Falcon keeps its multi-query count here
        n = getattr(attn, name, None)
        if isinstance(n, int) and n > 0:
            # one query head per group with fewer KV heads: the module repeats its keys itself
            # before the attention function (JetMoE tiles them, one copy per expert slot), so the
            # score reads one key per query head
            return n_heads if groups == 1 and n < n_heads else n
    if isinstance(groups, int) and groups > 0:
        return n_heads // groups
    if any(
        hasattr(attn, n) for n in ("query_key_value", "c_attn")
    ):  # fused MHA projection (GPT-NeoX)
        return n_heads
    return from_config


def uses_rope(attn, cfg, layer: int) -> bool:
    use = getattr(attn, "use_rope", None)
    if use is not None:
        return bool(use)
    nope = getattr(cfg, "no_rope_layers", None)  # 1 = rotates, 0 = NoPE, one entry per layer
    return not (isinstance(nope, (list, tuple)) and layer < len(nope) and not nope[layer])


def query_scale(attn, n_planes: int, passed_in: bool = False) -> str | None:
    """The factor a NoPE layer multiplies each query at position m by before its score, in words:
    Llama 4's ``attn_temperature_tuning`` (read from its attention module, which applies it to NoPE
    layers only), or a factor the model computes and passes to the layer (``passed_in``: Beam's
    ``attention_scaling``); None where there is none."""
    if n_planes:
        return None
    if getattr(attn, "attn_temperature_tuning", False):
        return (
            f"1 + {float(attn.attn_scale):g}·ln(1 + ⌊(m + 1)/{int(attn.floor_scale)}⌋) "
            "(attn_temperature_tuning)"
        )
    if passed_in:
        return "a factor of m the model computes and passes in (attention_scaling)"
    return None


def output_gate(attn, n_heads: int, head_dim: int) -> bool:
    """Whether the attention gates its output (Qwen3-Next: q_proj also makes one sigmoid gate per
    query dim)."""
    q_proj = getattr(attn, "q_proj", None)
    weight = getattr(
        getattr(q_proj, "original_component", q_proj), "weight", None
    )  # under the bridge's wrapper
    return (
        isinstance(weight, torch.Tensor)
        and weight.ndim == 2
        and weight.shape[0] == 2 * n_heads * head_dim
    )


def softcap_of(attn, cfg) -> float | None:
    cap = getattr(attn, "attn_logit_softcapping", None)
    if cap is None:
        cap = getattr(cfg, "attn_logit_softcapping", None)
    return float(cap) if cap else None


def sinks_of(attn) -> tuple[float, ...] | None:
    sinks = getattr(attn, "sinks", None)
    if not isinstance(sinks, torch.Tensor):
        return None
    return tuple(float(x) for x in sinks.detach().float().cpu().flatten())


def jsonable(v: Any) -> bool:
    try:
        json.dumps(v)
    except (TypeError, ValueError):
        return False
    return True
