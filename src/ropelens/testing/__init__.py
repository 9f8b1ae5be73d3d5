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
    """The character-level tokenizer the tiny models use (vocabulary of 101: 4 specials + ASCII).

    One token per character: ids 0-3 are ``<unk>``, ``<s>`` (BOS), ``</s>`` (EOS) and ``<pad>``,
    then the printable ASCII characters, newline and tab. It is built once per process and saved to
    a temporary directory, which the tiny models reload it from.

    Returns:
        transformers.PreTrainedTokenizerFast: The tokenizer (BOS id 1, EOS id 2, pad id 3).

    Examples:
        >>> from ropelens.testing import tiny_tokenizer
        >>> tok = tiny_tokenizer()
        >>> len(tok), tok.bos_token_id
        (101, 1)
        >>> tok("ab").input_ids
        [69, 70]
    """
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
    """A random HF causal LM of ``family`` (eager attention, eval mode, float32).

    The plain ``transformers`` model, without the TransformerLens bridge: what
    :func:`tiny_model` wraps, and what tests of the plain-HF backend
    (``load_model(..., bridge=False)``) start from. Its norm gains are spread
    (:func:`spread_weights`) so that planes and heads differ.

    Args:
        family (str): ``"llama"``, ``"llama-gqa"``, ``"gemma3"``, ``"gptj"`` or ``"gpt2"`` (see
            :func:`tiny_model` for what each is). Default ``"llama"``.
        seed (int): Seed of the random weights; the global torch RNG is left as it was.
        **config_overrides: Fields of the HF config to change (e.g. ``num_hidden_layers=4``).

    Returns:
        transformers.PreTrainedModel: The model, in eval mode, on the CPU.

    Raises:
        InputError: When ``family`` is not one of the families above.

    Examples:
        >>> from ropelens.testing import tiny_hf_model
        >>> hf = tiny_hf_model("llama-gqa", num_hidden_layers=3)
        >>> type(hf).__name__, hf.config.num_hidden_layers, hf.config.num_key_value_heads
        ('LlamaForCausalLM', 3, 2)
    """
    from transformers import AutoModelForCausalLM

    cfg = _config(family, vocab=len(_SPECIALS) + 97, **config_overrides)
    cfg._attn_implementation = "eager"
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(cfg, attn_implementation="eager")
        spread_weights(model, seed)
    return model.eval()


def spread_weights(model: torch.nn.Module, seed: int) -> None:
    """Give norm weights random gains so per-plane statistics differ between planes and heads.

    A freshly initialised HF model has every norm weight 1, which makes many per-plane statistics
    of a random model tie; each 1-D parameter with ``norm`` in its name is set in place to gains
    drawn uniformly from [0.25, 1.75).

    Args:
        model (torch.nn.Module): The model whose norm weights to overwrite (in place).
        seed (int): Seed of the gains (the generator is seeded with ``seed + 1``).

    Examples:
        >>> import torch
        >>> from ropelens.testing import spread_weights, tiny_hf_model
        >>> hf = tiny_hf_model("llama")
        >>> spread_weights(hf, seed=3)
        >>> gains = hf.model.norm.weight
        >>> bool(((gains >= 0.25) & (gains < 1.75)).all()), bool(torch.all(gains == 1))
        (True, False)
    """
    g = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.ndim == 1 and "norm" in name:
                p.copy_(torch.rand(p.shape, generator=g) * 1.5 + 0.25)


def tiny_model(
    family: str = "llama", *, seed: int = 0, device: str | None = "cpu", **config_overrides: Any
):
    """A tiny random ``family`` model wrapped in the TransformerLens bridge.

    No download and about a second to build: what ropelens's tests and examples run on. Every
    family has head dimension 16, a 256-token context and the character-level
    :func:`tiny_tokenizer`.

    Args:
        family (str): Which architecture (default ``"llama"``):

            - ``"llama"``: 2 layers, 4 heads (MHA), half-split pairing, base 1e4;
            - ``"llama-gqa"``: as ``"llama"`` with 4 query heads over 2 KV heads;
            - ``"gemma3"``: 3 sliding-window layers with window 8 and base 1e4, then one global
              layer with base 1e6, GQA, query_pre_attn_scalar 32;
            - ``"gptj"``: adjacent-pair partial rotary, rotary_dim 8 of 16;
            - ``"gpt2"``: no RoPE (for error paths and learned-PE geometry).
        seed (int): Seed of the random weights; the global torch RNG is left as it was.
        device (str | None): Where the model runs (default ``"cpu"``).
        **config_overrides: Fields of the HF config to change (e.g. ``num_hidden_layers=4``).

    Returns:
        transformer_lens.model_bridge.TransformerBridge: The model, named ``tiny-FAMILY``.

    Raises:
        InputError: When ``family`` is not one of the families above.

    Examples:
        >>> from ropelens import rope_spec
        >>> from ropelens.testing import tiny_model
        >>> model = tiny_model("gemma3")
        >>> model.cfg.model_name
        'tiny-gemma3'
        >>> spec = rope_spec(model)
        >>> spec.kinds
        {'sliding': [0, 1, 2], 'full': [3]}
        >>> [spec[i].base for i in (0, 3)], spec[0].window
        ([10000.0, 1000000.0], 8)
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
    """Save a tiny model and its tokenizer as an HF directory (for load_model(path) tests).

    The directory is what ``save_pretrained`` writes (``config.json``, ``model.safetensors``,
    the tokenizer's files), so it stands in for a checkpoint downloaded from the hub.

    Args:
        family (str): Which tiny architecture (see :func:`tiny_model`).
        dest (str | Path): The directory to write (created if missing).
        seed (int): Seed of the random weights.
        **config_overrides: Fields of the HF config to change (e.g. ``num_hidden_layers=4``).

    Returns:
        Path: ``dest``.

    Raises:
        InputError: When ``family`` is not a tiny family.

    Examples:
        >>> import tempfile
        >>> from ropelens import load_model
        >>> from ropelens.testing import tiny_model_dir
        >>> path = tiny_model_dir("gptj", tempfile.mkdtemp())
        >>> (path / "config.json").exists()
        True
        >>> model = load_model(path)
        >>> model.cfg.model_name == str(path)
        True
    """
    dest = Path(dest)
    tiny_hf_model(family, seed=seed, **config_overrides).save_pretrained(dest)
    tiny_tokenizer().save_pretrained(dest)
    return dest
