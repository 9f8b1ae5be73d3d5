"""The family matrix: a tiny random model of every RoPE family HF ships, checked against HF's own
eager attention.

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
from typing import Any

import torch

from ropelens.analyses.attention_decomposition import attention_decomposition
from ropelens.errors import InputError, UnsupportedModelError
from ropelens.loading.models import load_model
from ropelens.run.capture import capture_qk
from ropelens.run.verify import rotation_error, rotation_from_pre, verify_model
from ropelens.spec.bands import Bands
from ropelens.spec.reading import rope_spec
from ropelens.testing import spread_weights, tiny_tokenizer

__all__ = [
    "FAMILIES",
    "Family",
    "FamilyCheck",
    "check_family",
    "family_model_dir",
    "rotation_error",
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


def _family(name: str) -> Family:
    if name not in FAMILIES:
        raise InputError(f"unknown family {name!r}: choose from {', '.join(FAMILIES)}")
    return FAMILIES[name]


def family_hf_model(name: str, *, seed: int = 0):
    """The tiny random HF model of family ``name`` (eager attention, float32, q/k weights ×4)."""
    import transformers
    from transformers import AutoModelForCausalLM

    fam = _family(name)
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

    fam = _family(name)
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
