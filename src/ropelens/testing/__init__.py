"""Tiny random RoPE models for tests (yours and ropelens'): no download, seconds to build.

Each family is a real HF model class with a small config, wrapped in the TransformerLens bridge
with a character-level tokenizer built locally.
"""

from __future__ import annotations

import functools
import tempfile
from pathlib import Path
from typing import Any, Literal

import torch

from ropelens.errors import InputError
from ropelens.loading.models import wrap_hf_model

__all__ = [
    "TINY_FAMILIES",
    "spread_weights",
    "tiny_hf_model",
    "tiny_model",
    "tiny_model_dir",
    "tiny_tokenizer",
]

Family = Literal["llama", "llama-gqa", "gemma3", "gptj", "gpt2"]
TINY_FAMILIES: tuple[str, ...] = ("llama", "llama-gqa", "gemma3", "gptj")

_SPECIALS = ["<unk>", "<s>", "</s>", "<pad>"]


@functools.lru_cache(maxsize=1)
def _tokenizer_dir() -> str:
    """Build a character-level tokenizer once per process and save it (the bridge reloads it by
    path)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    chars = [chr(c) for c in range(32, 127)] + ["\n", "\t"]
    vocab = {t: i for i, t in enumerate(_SPECIALS + chars)}
    tk = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tk.pre_tokenizer = pre_tokenizers.Split("", behavior="isolated")
    tk.decoder = decoders.Fuse()
    tok = PreTrainedTokenizerFast(
        tokenizer_object=tk, bos_token="<s>", eos_token="</s>", unk_token="<unk>", pad_token="<pad>"
    )
    path = tempfile.mkdtemp(prefix="ropelens-tiny-tokenizer-")
    tok.save_pretrained(path)
    return path


def tiny_tokenizer():
    """The character-level tokenizer the tiny models use (vocabulary of 101: 4 specials + ASCII)."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(_tokenizer_dir())


def _config(family: str, vocab: int, **overrides: Any):
    from transformers import Gemma3TextConfig, GPT2Config, GPTJConfig, LlamaConfig

    ids = {"bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 3}
    if family in ("llama", "llama-gqa"):
        kw = dict(
            vocab_size=vocab,
            hidden_size=64,
            intermediate_size=128,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=4 if family == "llama" else 2,
            head_dim=16,
            max_position_embeddings=256,
            rope_parameters={"rope_theta": 10000.0, "rope_type": "default"},
            **ids,
        )
        kw.update(overrides)
        cfg = LlamaConfig(**kw)
        cfg.architectures = ["LlamaForCausalLM"]
        return cfg
    if family == "gemma3":
        kw = dict(
            vocab_size=vocab,
            hidden_size=64,
            intermediate_size=128,
            num_hidden_layers=4,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=16,
            max_position_embeddings=256,
            sliding_window=8,
            query_pre_attn_scalar=32,
            layer_types=["sliding_attention"] * 3 + ["full_attention"],
            rope_parameters={
                "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                "full_attention": {"rope_type": "default", "rope_theta": 1000000.0},
            },
            **ids,
        )
        kw.update(overrides)
        cfg = Gemma3TextConfig(**kw)
        cfg.architectures = ["Gemma3ForCausalLM"]
        return cfg
    if family == "gptj":
        kw = dict(
            vocab_size=vocab,
            n_embd=64,
            n_layer=2,
            n_head=4,
            rotary_dim=8,
            n_positions=256,
            bos_token_id=1,
            eos_token_id=2,
        )
        kw.update(overrides)
        cfg = GPTJConfig(**kw)
        cfg.architectures = ["GPTJForCausalLM"]
        return cfg
    if family == "gpt2":  # no RoPE: for error paths and learned-PE geometry
        kw = dict(
            vocab_size=vocab,
            n_embd=64,
            n_layer=2,
            n_head=4,
            n_positions=256,
            bos_token_id=1,
            eos_token_id=2,
        )
        kw.update(overrides)
        cfg = GPT2Config(**kw)
        cfg.architectures = ["GPT2LMHeadModel"]
        return cfg
    raise InputError(f"unknown tiny family {family!r}: choose from {TINY_FAMILIES + ('gpt2',)}")


def tiny_hf_model(family: str = "llama", *, seed: int = 0, **config_overrides: Any):
    """A random HF causal LM of ``family`` (eager attention, eval mode, float32)."""
    from transformers import AutoModelForCausalLM

    cfg = _config(family, vocab=len(_SPECIALS) + 97, **config_overrides)
    cfg._attn_implementation = "eager"
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(cfg, attn_implementation="eager")
        spread_weights(model, seed)
    return model.eval()


def spread_weights(model: torch.nn.Module, seed: int) -> None:
    """Give norm weights random gains so per-plane statistics differ between planes and heads."""
    g = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.ndim == 1 and "norm" in name:
                p.copy_(torch.rand(p.shape, generator=g) * 1.5 + 0.25)


def tiny_model(
    family: str = "llama", *, seed: int = 0, device: str | None = "cpu", **config_overrides: Any
):
    """A tiny random ``family`` model wrapped in the TransformerLens bridge.

    Families: ``"llama"`` (MHA), ``"llama-gqa"`` (4 query heads over 2 KV heads), ``"gemma3"``
    (3 sliding-window layers with window 8 and base 1e4, then one global layer with base 1e6,
    GQA, query_pre_attn_scalar 32), ``"gptj"`` (adjacent-pair partial rotary, rotary_dim 8 of 16)
    and ``"gpt2"`` (no RoPE). ``config_overrides`` go to the HF config.
    """
    hf = tiny_hf_model(family, seed=seed, **config_overrides)
    return wrap_hf_model(
        hf,
        tiny_tokenizer(),
        device=device,
        label=f"tiny-{family}",
        hub_name=f"ropelens/tiny-{family}",
    )


def tiny_model_dir(
    family: str, dest: str | Path, *, seed: int = 0, **config_overrides: Any
) -> Path:
    """Save a tiny model and its tokenizer as an HF directory (for load_model(path) tests)."""
    dest = Path(dest)
    tiny_hf_model(family, seed=seed, **config_overrides).save_pretrained(dest)
    tiny_tokenizer().save_pretrained(dest)
    return dest
