"""Tiny random vision-language models with multimodal RoPE (Qwen2-VL, Qwen2.5-VL, Qwen3-VL, Qwen
3.5), and pixel input.

Each text tower keeps its family's real rotary shape: head dim 128 (64 planes) with the published
``mrope_section`` ([16, 24, 24] contiguous for Qwen2-VL and Qwen2.5-VL, [24, 20, 20] interleaved for
Qwen3-VL), and Qwen 3.5's partial rotary 0.25 of head dim 256 with [11, 11, 10] interleaved;
everything else is shrunk. q/k weights are scaled ×4 (as the family matrix does) so attention is far
from uniform.
"""

from __future__ import annotations

from typing import Any

import torch

from ropelens.errors import InputError
from ropelens.testing import spread_weights

__all__ = ["VL_FAMILIES", "VL_IDS", "expected_axes", "vl_hf_model", "vl_inputs"]

VL_IDS = {
    "image_token_id": 101,
    "video_token_id": 102,
    "vision_start_token_id": 103,
    "vision_end_token_id": 104,
}
_TEXT = dict(
    vocab_size=105,
    hidden_size=256,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=2,
    num_key_value_heads=1,
    max_position_embeddings=512,
    bos_token_id=1,
    eos_token_id=2,
    pad_token_id=3,
)
_VISION = dict(depth=1, num_heads=2, patch_size=2, temporal_patch_size=2, spatial_merge_size=2)

# family → (config class, text config, vision config, published sections, interleaved)
VL_FAMILIES: dict[str, tuple[str, dict[str, Any], dict[str, Any], tuple[int, int, int], bool]] = {
    "qwen2_vl": (
        "Qwen2VLConfig",
        dict(
            _TEXT,
            rope_parameters={
                "rope_type": "default",
                "rope_theta": 1e6,
                "mrope_section": [16, 24, 24],
            },
        ),
        dict(_VISION, embed_dim=32, hidden_size=256),
        (16, 24, 24),
        False,
    ),
    # the class default sections ([16, 24, 24]): the config names none
    "qwen2_5_vl": (
        "Qwen2_5_VLConfig",
        dict(_TEXT, rope_parameters={"rope_type": "default", "rope_theta": 1e6}),
        dict(
            _VISION,
            hidden_size=32,
            out_hidden_size=256,
            intermediate_size=64,
            window_size=8,
            fullatt_block_indexes=[0],
        ),
        (16, 24, 24),
        False,
    ),
    "qwen3_vl": (
        "Qwen3VLConfig",
        dict(
            _TEXT,
            hidden_size=64,
            head_dim=128,
            rope_parameters={
                "rope_type": "default",
                "rope_theta": 5e6,
                "mrope_section": [24, 20, 20],
                "mrope_interleaved": True,
            },
        ),
        dict(
            _VISION,
            hidden_size=32,
            out_hidden_size=64,
            intermediate_size=64,
            num_position_embeddings=16,
            deepstack_visual_indexes=[0],
        ),
        (24, 20, 20),
        True,
    ),
    "qwen3_5": (
        "Qwen3_5Config",
        dict(
            _TEXT,
            hidden_size=64,
            head_dim=256,
            layer_types=["linear_attention", "full_attention"],
            linear_num_value_heads=2,
            linear_num_key_heads=2,
            linear_key_head_dim=16,
            linear_value_head_dim=16,
            rope_parameters={
                "rope_type": "default",
                "rope_theta": 1e7,
                "mrope_section": [11, 11, 10],
                "mrope_interleaved": True,
                "partial_rotary_factor": 0.25,
            },
        ),
        dict(
            _VISION,
            hidden_size=32,
            out_hidden_size=64,
            intermediate_size=64,
            num_position_embeddings=16,
        ),
        (11, 11, 10),
        True,
    ),
}


def expected_axes(name: str) -> tuple[int, ...]:
    """Each plane's axis (0 t, 1 h, 2 w) from the family's published sections, by the documented
    rule: contiguous sections, highest frequencies first (Qwen2-VL), or interleaved t, h, w, t, h,
    w, ... with the leftover planes on time (Qwen3-VL)."""
    _, _, _, sections, interleaved = VL_FAMILIES[name]
    n = sum(sections)
    if not interleaved:
        return tuple(a for a, s in enumerate(sections) for _ in range(s))
    axes = [0] * n
    for a in (1, 2):
        for i in range(a, 3 * sections[a], 3):
            axes[i] = a
    return tuple(axes)


def vl_hf_model(name: str, *, seed: int = 0, **vision: Any):
    """The tiny random HF vision-language model of family ``name`` (eager attention, float32, q/k
    weights ×4); ``vision`` overrides its vision config (``depth=2``: as many vision blocks as
    decoder layers)."""
    import transformers
    from transformers import AutoModelForImageTextToText

    if name not in VL_FAMILIES:
        raise InputError(f"unknown VL family {name!r}: choose from {', '.join(VL_FAMILIES)}")
    cls_name, text, vision_cfg, _, _ = VL_FAMILIES[name]
    cfg = getattr(transformers, cls_name)(
        text_config=text, vision_config={**vision_cfg, **vision}, **VL_IDS
    )
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = AutoModelForImageTextToText.from_config(cfg, attn_implementation="eager")
    spread_weights(model, seed)
    with (
        torch.no_grad()
    ):  # sharper attention in the text tower: near-uniform patterns would hide wrong logits
        for pname, p in model.named_parameters():
            if (
                "language_model" in pname
                and p.ndim == 2
                and any(s in pname for s in ("q_proj", "k_proj"))
            ):
                p.mul_(4.0)
    return model.eval()


def vl_inputs(
    model, grids: tuple[tuple[int, int, int], ...] = ((1, 4, 6),), *, seed: int = 0, text: int = 5
) -> dict[str, torch.Tensor]:
    """``input_ids`` with ``text`` text tokens, then each image's vision-start, placeholders and
    vision-end tokens and ``text`` more text tokens, with random ``pixel_values`` and
    ``image_grid_thw`` (grids in patches: t, h, w; h and w even for the 2×2 merge)."""
    vc = model.config.vision_config
    g = torch.Generator().manual_seed(seed)
    ids = [1, *torch.randint(4, 100, (text - 1,), generator=g).tolist()]
    patches = 0
    for t, h, w in grids:
        ids += [VL_IDS["vision_start_token_id"]] + [VL_IDS["image_token_id"]] * (
            t * h * w // vc.spatial_merge_size**2
        )
        ids += [
            VL_IDS["vision_end_token_id"],
            *torch.randint(4, 100, (text,), generator=g).tolist(),
        ]
        patches += t * h * w
    width = vc.in_channels * vc.temporal_patch_size * vc.patch_size**2
    return {
        "input_ids": torch.tensor([ids]),
        "pixel_values": torch.randn(patches, width, generator=g),
        "image_grid_thw": torch.tensor(grids),
    }
