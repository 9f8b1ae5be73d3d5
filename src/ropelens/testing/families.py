"""Tiny random models of every RoPE family HF ships, for tests of code that must hold on each.

Each :class:`Family` is a real HF config class with a small config whose windows are shorter than
a 24-token input (:data:`N_CHECK`, so they matter) and whose q/k weights are scaled up (so attention
is far from uniform), plus what ropelens must read from it: pairing, rotary dims, windows,
soft-capping, sinks, NoPE layers, and whether ropelens measures it exactly or refuses it (and
where, and why). :func:`family_hf_model` builds the random HF model and :func:`family_model_dir`
saves it with the tiny tokenizer as a model directory for ``load_model(path)``. ``ropelens
rope-spec --families`` lists this table.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from ropelens.errors import InputError
from ropelens.testing import spread_weights, tiny_tokenizer

__all__ = [
    "FAMILIES",
    "N_CHECK",
    "VOCAB",
    "Family",
    "family",
    "family_hf_model",
    "family_model_dir",
]

VOCAB = 101  # the tiny character tokenizer of ropelens.testing
N_CHECK = 24  # input length: three times every window
_IDS = {"bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 3}
_BASE = dict(
    vocab_size=VOCAB,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=4,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=256,
    **_IDS,
)
_MOE = dict(num_local_experts=4, num_experts_per_tok=2)


def _rp(theta: float = 10000.0, **kw: Any) -> dict[str, Any]:
    return {"rope_theta": theta, "rope_type": "default", **kw}


def _no(key: str, d: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in d.items() if k != key}


@dataclass(frozen=True)
class Family:
    """One HF family: its tiny config, and what ropelens must read from it."""

    name: str
    config_class: str
    config: dict[str, Any]
    pairing: str = "half"
    rotary_fraction: float = 1.0
    windows: dict[int, int] = field(default_factory=dict)  # layer → sliding window
    chunks: dict[int, int] = field(
        default_factory=dict
    )  # layer → attention chunk (chunked attention)
    softcap: float | None = None
    sinks: bool = False
    nope_layers: tuple[int, ...] = ()
    mixer_layers: dict[int, str] = field(
        default_factory=dict
    )  # layer → kind, for layers without softmax attention
    output_gate: bool = False  # a sigmoid gate on the attention output (Qwen3-Next)
    mixer: str | None = (
        None  # the HF class of a token mixer running beside every attention layer (Falcon-H1)
    )
    score_scale: float | None = None  # None: head_dim ** -0.5
    head_dims: dict[int, int] = field(
        default_factory=dict
    )  # layer → head width where it is not the config's
    kv_heads: dict[int, int] = field(
        default_factory=dict
    )  # layer → KV heads where they are not the config's
    turning: dict[int, float] = field(
        default_factory=dict
    )  # layer → share of planes that turn (proportional
    # RoPE: the whole head is planes, the rest at frequency 0)
    refused: str | None = (
        None  # the reason ropelens refuses it (a pattern of the error), or None when it is exact
    )
    refused_at: str = (
        "spec"  # where: "load" (no bridge), "spec" (rope_spec) or "probe" (verification)
    )
    needs: str = ""  # what the family asks of ropelens, for the support table
    bridge: bool = (
        True  # False: TransformerLens cannot wrap it, so ropelens measures the plain HF model
    )

    @property
    def head_dim(self) -> int:
        c = self.config
        if c.get(
            "qk_rope_head_dim"
        ):  # multi-head latent attention: the score's head is no-position dims + rotary dims
            return int(c["qk_nope_head_dim"] + c["qk_rope_head_dim"])
        return int(c.get("head_dim") or c["hidden_size"] // c["num_attention_heads"])

    def layer_head_dim(self, layer: int) -> int:
        return self.head_dims.get(layer, self.head_dim)


_W4 = {i: 8 for i in range(4)}
_HYBRID = ["sliding_attention"] * 3 + ["full_attention"]
FAMILIES: dict[str, Family] = {
    f.name: f
    for f in [
        Family(
            "llama", "LlamaConfig", dict(_BASE, head_dim=16, rope_parameters=_rp()), needs="GQA"
        ),
        Family(
            "mistral",
            "MistralConfig",
            dict(_BASE, head_dim=16, sliding_window=8, rope_parameters=_rp()),
            windows=_W4,
            needs="one sliding window for every layer (no layer_types)",
        ),
        Family(
            "mixtral",
            "MixtralConfig",
            dict(_BASE, head_dim=16, sliding_window=8, rope_parameters=_rp(), **_MOE),
            windows=_W4,
            needs="sliding window, mixture of experts",
        ),
        Family(
            "qwen2",
            "Qwen2Config",
            dict(
                _BASE,
                rope_parameters=_rp(),
                use_sliding_window=True,
                sliding_window=8,
                max_window_layers=2,
            ),
            windows={2: 8, 3: 8},
            needs="sliding window on the upper layers (layer_types)",
        ),
        Family(
            "qwen3",
            "Qwen3Config",
            dict(_BASE, head_dim=16, rope_parameters=_rp()),
            needs="per-head q/k norm before RoPE",
        ),
        Family(
            "phi3",
            "Phi3Config",
            dict(_BASE, rope_parameters=_rp(), sliding_window=8, partial_rotary_factor=0.5),
            rotary_fraction=0.5,
            windows=_W4,
            needs="fused qkv, partial rotary, sliding window",
        ),
        Family(
            "phi",
            "PhiConfig",
            dict(_BASE, partial_rotary_factor=0.4, rope_parameters=_rp(partial_rotary_factor=0.4)),
            rotary_fraction=0.4,
            needs="partial rotary 0.4",
        ),
        Family(
            "gpt_neox",
            "GPTNeoXConfig",
            dict(
                _no("num_key_value_heads", _BASE),
                rotary_pct=0.25,
                rope_parameters=_rp(partial_rotary_factor=0.25),
            ),
            rotary_fraction=0.25,
            needs="partial rotary 0.25, fused qkv",
        ),
        Family(
            "gemma", "GemmaConfig", dict(_BASE, head_dim=16, rope_parameters=_rp()), needs="GQA"
        ),
        Family(
            "gemma2",
            "Gemma2Config",
            dict(
                _BASE,
                head_dim=16,
                sliding_window=8,
                attn_logit_softcapping=50.0,
                final_logit_softcapping=30.0,
                query_pre_attn_scalar=16,
                rope_parameters=_rp(),
            ),
            windows={0: 8, 2: 8},
            softcap=50.0,
            score_scale=16**-0.5,
            needs="attention-logit soft-capping, alternating sliding windows",
        ),
        Family(
            "gemma3_text",
            "Gemma3TextConfig",
            dict(
                _BASE,
                head_dim=16,
                sliding_window=8,
                query_pre_attn_scalar=32,
                layer_types=["sliding_attention"] * 3 + ["full_attention"],
                rope_parameters={"sliding_attention": _rp(), "full_attention": _rp(1e6)},
            ),
            windows={0: 8, 1: 8, 2: 8},
            score_scale=32**-0.5,
            needs="local (base 1e4) and global (base 1e6) layers, q/k norm",
        ),
        Family(
            "olmo2",
            "Olmo2Config",
            dict(_BASE, rope_parameters=_rp()),
            needs="q/k norm over the whole projection, before the head split",
        ),
        Family(
            "stablelm",
            "StableLmConfig",
            dict(
                _BASE, partial_rotary_factor=0.25, rope_parameters=_rp(partial_rotary_factor=0.25)
            ),
            rotary_fraction=0.25,
            needs="partial rotary 0.25",
        ),
        Family(
            "starcoder2",
            "Starcoder2Config",
            dict(_BASE, sliding_window=8, rope_parameters=_rp()),
            windows=_W4,
            needs="one sliding window for every layer (no layer_types)",
        ),
        Family(
            "granite",
            "GraniteConfig",
            dict(_BASE, attention_multiplier=0.2, rope_parameters=_rp()),
            score_scale=0.2,
            needs="attention multiplier as the score scale",
        ),
        Family(
            "cohere",
            "CohereConfig",
            dict(_BASE, rope_parameters=_rp()),
            pairing="adjacent",
            needs="adjacent-pair rotation",
        ),
        Family(
            "glm",
            "GlmConfig",
            dict(
                _BASE,
                head_dim=16,
                partial_rotary_factor=0.5,
                rope_parameters=_rp(partial_rotary_factor=0.5),
            ),
            pairing="adjacent",
            rotary_fraction=0.5,
            needs="adjacent pairs, partial rotary 0.5",
        ),
        Family(
            "smollm3",
            "SmolLM3Config",
            dict(_BASE, rope_parameters=_rp(), no_rope_layer_interval=2),
            nope_layers=(1, 3),
            needs="NoPE layers (every second layer here)",
        ),
        Family(
            "gpt_oss",
            "GptOssConfig",
            dict(
                _BASE,
                head_dim=16,
                sliding_window=8,
                **_MOE,
                layer_types=["sliding_attention", "full_attention"] * 2,
                rope_parameters=_rp(
                    150000.0,
                    rope_type="yarn",
                    factor=4.0,
                    original_max_position_embeddings=64,
                    beta_fast=32.0,
                    beta_slow=1.0,
                    truncate=False,
                ),
            ),
            windows={0: 8, 2: 8},
            sinks=True,
            needs="learned attention sinks, YaRN, alternating windows",
        ),
        Family(
            "deepseek_v3",
            "DeepseekV3Config",
            dict(
                _BASE,
                num_key_value_heads=4,
                q_lora_rank=32,
                kv_lora_rank=32,
                qk_rope_head_dim=8,
                qk_nope_head_dim=8,
                v_head_dim=16,
                n_routed_experts=4,
                num_experts_per_tok=2,
                first_k_dense_replace=1,
                n_group=1,
                topk_group=1,
                moe_intermediate_size=32,
                rope_parameters=_rp(),
            ),
            rotary_fraction=0.5,
            bridge=False,
            needs="multi-head latent attention (rotary dims after the no-position ones, one "
            "rotary key shared by all heads; interleaved pairs read, halves written); the plain "
            "HF model",
        ),
        Family(
            "deepseek_v2",
            "DeepseekV2Config",
            dict(
                _BASE,
                num_key_value_heads=4,
                q_lora_rank=32,
                kv_lora_rank=32,
                qk_rope_head_dim=8,
                qk_nope_head_dim=8,
                v_head_dim=16,
                n_routed_experts=4,
                num_experts_per_tok=2,
                first_k_dense_replace=1,
                n_group=1,
                topk_group=1,
                moe_intermediate_size=32,
                rope_parameters=_rp(),
            ),
            pairing="adjacent",
            rotary_fraction=0.5,
            bridge=False,
            needs="multi-head latent attention with a complex-product rotation (adjacent pairs); "
            "the plain HF model",
        ),
        Family(
            "glm4_moe_lite",
            "Glm4MoeLiteConfig",
            dict(
                _BASE,
                num_key_value_heads=4,
                q_lora_rank=32,
                kv_lora_rank=32,
                qk_rope_head_dim=4,
                qk_nope_head_dim=12,
                v_head_dim=16,
                n_routed_experts=4,
                num_experts_per_tok=2,
                n_group=1,
                topk_group=1,
                moe_intermediate_size=32,
                rope_parameters=_rp(),
            ),
            rotary_fraction=0.25,
            bridge=False,
            needs="multi-head latent attention, 4 rotary dims after 12 no-position ones; the "
            "plain HF model",
        ),
        Family(
            "qwen3_next",
            "Qwen3NextConfig",
            dict(
                _BASE,
                head_dim=16,
                num_experts=4,
                num_experts_per_tok=2,
                moe_intermediate_size=32,
                shared_expert_intermediate_size=32,
                layer_types=["linear_attention", "full_attention"] * 2,
                linear_num_value_heads=2,
                linear_num_key_heads=2,
                linear_key_head_dim=16,
                linear_value_head_dim=16,
                rope_parameters=_rp(partial_rotary_factor=0.25),
            ),
            rotary_fraction=0.25,
            mixer_layers={0: "linear", 2: "linear"},
            output_gate=True,
            needs="linear-attention (Gated DeltaNet) layers beside gated attention, partial "
            "rotary 0.25",
        ),
        Family(
            "qwen3_5_text",
            "Qwen3_5TextConfig",
            dict(
                _BASE,
                head_dim=16,
                layer_types=["linear_attention", "full_attention"] * 2,
                linear_num_value_heads=2,
                linear_num_key_heads=2,
                linear_key_head_dim=16,
                linear_value_head_dim=16,
                rope_parameters=_rp(partial_rotary_factor=0.25),
            ),
            rotary_fraction=0.25,
            mixer_layers={0: "linear", 2: "linear"},
            output_gate=True,
            needs="linear-attention (Gated DeltaNet) layers beside gated attention, partial "
            "rotary 0.25",
        ),
        Family(
            "lfm2",
            "Lfm2Config",
            dict(_BASE, layer_types=["conv", "full_attention"] * 2, rope_parameters=_rp()),
            mixer_layers={0: "conv", 2: "conv"},
            needs="short-convolution layers beside attention, q/k norm",
        ),
        Family(
            "falcon_h1",
            "FalconH1Config",
            dict(_BASE, mamba_d_ssm=128, mamba_n_heads=8, mamba_d_head=16, rope_parameters=_rp()),
            mixer="FalconH1Mixer",
            needs="a Mamba-2 mixer beside the attention of every layer, key multiplier",
        ),
        Family(
            "bamba",
            "BambaConfig",
            dict(
                _BASE,
                attn_layer_indices=[1, 3],
                mamba_n_heads=8,
                mamba_d_head=16,
                rope_parameters=_rp(partial_rotary_factor=0.5),
            ),
            rotary_fraction=0.5,
            mixer_layers={0: "mamba", 2: "mamba"},
            needs="Mamba-2 layers beside attention, partial rotary 0.5",
        ),
        Family(
            "granitemoehybrid",
            "GraniteMoeHybridConfig",
            dict(
                _BASE,
                layer_types=["linear_attention", "full_attention"] * 2,
                position_embedding_type="rope",
                attention_multiplier=0.2,
                mamba_n_heads=8,
                mamba_d_head=16,
                shared_intermediate_size=32,
                rope_parameters=_rp(),
                **_MOE,
            ),
            score_scale=0.2,
            mixer_layers={0: "mamba", 2: "mamba"},
            needs="Mamba-2 layers beside attention (Granite 4), attention multiplier as the "
            "score scale",
        ),
        Family(
            "recurrent_gemma",
            "RecurrentGemmaConfig",
            dict(
                _no("max_position_embeddings", _BASE),
                num_hidden_layers=3,
                block_types=["recurrent", "attention"],
                lru_width=64,
                attention_window_size=8,
                partial_rotary_factor=0.5,
                rope_parameters=_rp(partial_rotary_factor=0.5),
            ),
            rotary_fraction=0.5,
            windows={1: 8},
            mixer_layers={0: "recurrent", 2: "recurrent"},
            bridge=False,
            needs="RG-LRU recurrent layers beside local attention, partial rotary 0.5; its "
            "adapter wraps attention whole (no q/k hooks), so the plain HF model",
        ),
        Family(
            "olmo_hybrid",
            "OlmoHybridConfig",
            dict(
                _BASE,
                layer_types=["linear_attention", "full_attention"] * 2,
                linear_num_key_heads=2,
                linear_num_value_heads=2,
                linear_key_head_dim=16,
                linear_value_head_dim=16,
                rope_parameters=_rp(),
            ),
            mixer_layers={0: "linear", 2: "linear"},
            needs="Gated DeltaNet layers beside attention; q/k norm over the whole projection, "
            "taken from the norm submodules' hooks",
        ),
        Family(
            "llama4",
            "Llama4TextConfig",
            dict(
                _BASE,
                head_dim=16,
                num_local_experts=2,
                num_experts_per_tok=1,
                intermediate_size_mlp=128,
                no_rope_layers=[1, 1, 1, 0],
                attention_chunk_size=8,
                rope_parameters=_rp(),
            ),
            pairing="adjacent",
            chunks={0: 8, 1: 8, 2: 8},
            nope_layers=(3,),
            bridge=False,
            needs="chunked attention (rotary layers), complex adjacent-pair rotation, L2 q/k "
            "norm after RoPE; NoPE layers with a query temperature listed, not measured; its "
            "adapter fires no rotated-q hook, so the plain HF model",
        ),
        Family(
            "cohere2",
            "Cohere2Config",
            dict(_BASE, head_dim=16, sliding_window=8, layer_types=_HYBRID, rope_parameters=_rp()),
            pairing="adjacent",
            windows={0: 8, 1: 8, 2: 8},
            nope_layers=(3,),
            needs="adjacent pairs; its full-attention layers apply no RoPE (seen in the forward)",
        ),
        Family(
            "exaone4",
            "Exaone4Config",
            dict(_BASE, head_dim=16, sliding_window=8, layer_types=_HYBRID, rope_parameters=_rp()),
            windows={0: 8, 1: 8, 2: 8},
            nope_layers=(3,),
            needs="q/k norm before RoPE; full-attention layers apply no RoPE (seen in the forward)",
        ),
        Family(
            "gemma4_text",
            "Gemma4TextConfig",
            dict(
                _BASE,
                head_dim=16,
                global_head_dim=32,
                sliding_window=8,
                layer_types=_HYBRID,
                vocab_size_per_layer_input=VOCAB,
                hidden_size_per_layer_input=8,
                attention_k_eq_v=True,
                num_global_key_value_heads=1,
                rope_parameters={
                    "sliding_attention": _rp(),
                    "full_attention": _rp(
                        1e6, rope_type="proportional", partial_rotary_factor=0.25
                    ),
                },
            ),
            windows={0: 8, 1: 8, 2: 8},
            score_scale=1.0,
            head_dims={3: 32},
            kv_heads={3: 1},
            turning={3: 0.25},
            needs="wider global heads (global_head_dim) with fewer KV heads, proportional rotary "
            "0.25 (a quarter of each half turns), q/k norm with score scale 1",
        ),
        Family(
            "hunyuan_v1_dense",
            "HunYuanDenseV1Config",
            dict(_BASE, head_dim=16, use_qk_norm=True, rope_parameters=_rp()),
            needs="q/k RMS norm with a gain after RoPE (read from the forward): q/k taken where "
            "they enter the score",
        ),
        Family(
            "nanochat",
            "NanoChatConfig",
            dict(_BASE, rope_parameters=_rp()),
            needs="rotation the other way, q/k RMS norm after RoPE (both read from the forward): "
            "q/k taken where they enter the score",
        ),
        Family(
            "falcon",
            "FalconConfig",
            dict(
                _no("num_key_value_heads", _BASE),
                num_kv_heads=2,
                new_decoder_architecture=True,
                rope_parameters=_rp(),
            ),
            bridge=False,
            needs="grouped KV heads in a fused qkv (new_decoder_architecture): no bridge, the "
            "plain HF model",
        ),
        Family(
            "ministral",
            "MinistralConfig",
            dict(_BASE, head_dim=16, sliding_window=8, layer_types=_HYBRID, rope_parameters=_rp()),
            windows={0: 8, 1: 8, 2: 8},
            bridge=False,
            needs="sliding and full layers; no bridge, the plain HF model",
        ),
        Family(
            "helium",
            "HeliumConfig",
            dict(_BASE, head_dim=16, rope_parameters=_rp()),
            pairing="adjacent",
            bridge=False,
            needs="adjacent pairs (read from its own rotation); no bridge, the plain HF model",
        ),
        Family(
            "persimmon",
            "PersimmonConfig",
            dict(
                _no("num_key_value_heads", _BASE),
                partial_rotary_factor=0.5,
                rope_parameters=_rp(partial_rotary_factor=0.5),
            ),
            rotary_fraction=0.5,
            bridge=False,
            needs="partial rotary 0.5, q/k layer norm; no bridge, the plain HF model",
        ),
        Family(
            "phimoe",
            "PhimoeConfig",
            dict(_BASE, **_MOE, rope_parameters=_rp()),
            bridge=False,
            needs="mixture of experts; no bridge, the plain HF model",
        ),
        Family(
            "diffllama",
            "DiffLlamaConfig",
            dict(_BASE, head_dim=16, rope_parameters=_rp()),
            bridge=False,
            refused="differential attention",
            needs="differential attention: two softmax maps subtracted",
        ),
        Family(
            "minicpm3",
            "MiniCPM3Config",
            dict(
                _BASE,
                num_key_value_heads=4,
                q_lora_rank=32,
                kv_lora_rank=32,
                qk_rope_head_dim=12,
                qk_nope_head_dim=4,
                v_head_dim=16,
                rope_parameters=_rp(),
            ),
            rotary_fraction=0.75,
            bridge=False,
            needs="multi-head latent attention, 12 rotary dims after 4 no-position ones; the "
            "plain HF model",
        ),
    ]
}


def family(name: str) -> Family:
    """The family called ``name``, or an error naming the families there are."""
    if name not in FAMILIES:
        raise InputError(f"unknown family {name!r}: choose from {', '.join(FAMILIES)}")
    return FAMILIES[name]


def family_hf_model(name: str, *, seed: int = 0):
    """The tiny random HF model of family ``name`` (eager attention, float32, q/k weights ×4)."""
    import transformers
    from transformers import AutoModelForCausalLM

    fam = family(name)
    cls = getattr(transformers, fam.config_class, None)
    if cls is None:
        raise InputError(
            f"transformers {transformers.__version__} has no {fam.config_class}: upgrade "
            "transformers"
        )
    cfg = cls(**fam.config)
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(cfg, attn_implementation="eager")
    spread_weights(model, seed)
    with torch.no_grad():  # sharper attention: near-uniform patterns would hide wrong logits
        for pname, p in model.named_parameters():
            if p.ndim == 2 and any(
                s in pname
                for s in (
                    "q_proj",
                    "k_proj",
                    "qkv_proj",
                    "query_key_value",
                    "q_a_proj",
                    "q_b_proj",
                    "kv_a_proj",
                    "kv_b_proj",
                )
            ):
                p.mul_(4.0)
    return model.eval()


def family_model_dir(name: str, dest: str | Path, *, seed: int = 0) -> Path:
    """Save family ``name``'s tiny model and the tiny tokenizer as an HF model directory."""
    dest = Path(dest)
    family_hf_model(name, seed=seed).save_pretrained(dest)
    tiny_tokenizer().save_pretrained(dest)
    return dest
