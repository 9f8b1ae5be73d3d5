"""Train small Llama-style models from scratch under a RoPE variant (Barbero et al. Table 2, in
small).

The model is HF ``LlamaForCausalLM``. The variant enters by overwriting the rotary module's
``inv_freq`` and ``original_inv_freq`` after construction: every variant that is one fixed frequency
vector (Default, PRoPE, PRoPEReversed, PRoPEPartial, NoPE, BaseChange, PlaneMask, Linear, NTK)
becomes exact that way, with the frequencies ``variant.inv_freq`` gives to the bit.

Tokens are the SmolLM2 tokenizer's, relabelled to the ids that occur in the corpus (a few thousand
of 49,152). The segmentation and the text are unchanged; only the softmax shrinks, which makes the
output layer (otherwise most of a tiny model's compute) about ten times cheaper on CPU.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import numbers
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from jaxtyping import Int
from torch import Tensor

from ropelens.errors import InputError
from ropelens.loading.models import load_model
from ropelens.results.provenance import Provenance
from ropelens.results.serialize import dump_json
from ropelens.run import data
from ropelens.run.evaluate import LossEstimate, bootstrap_ci, window_losses
from ropelens.spec.rope import LayerRope
from ropelens.spec.variants import BaseChange, RopeVariant, check_variant, variant_from_dict
from ropelens.testing import tiny_tokenizer
from ropelens.training.checkpoints import CheckpointWriter, plain_rope_theta
from ropelens.validate import check_positive_int

__all__ = [
    "TrainConfig",
    "TrainResult",
    "build_model",
    "cut_windows",
    "fit",
    "layer_rope",
    "lr_at",
    "token_streams",
    "train",
]

_FREQ_VARIANTS = (
    "Default",
    "PRoPE",
    "PRoPEReversed",
    "PRoPEPartial",
    "NoPE",
    "BaseChange",
    "PlaneMask",
    "Linear",
    "NTK",
)


def scaled_shape(
    n_heads: int, head_dim: int, n_layers: int, steps: int, factor: float
) -> dict[str, int]:
    """Heads (so d_model), layers and steps × ``factor``, each at least 1: a config sized up for a
    GPU."""
    if not isinstance(factor, numbers.Real) or isinstance(factor, bool) or factor <= 0:
        raise InputError(f"factor must be a positive number, got {factor!r}")
    heads = max(1, round(n_heads * factor))
    return {
        "n_heads": heads,
        "d_model": heads * head_dim,
        "n_layers": max(1, round(n_layers * factor)),
        "steps": max(1, round(steps * factor)),
    }


@dataclass(frozen=True)
class TrainConfig:
    """What to train: model shape, data, optimisation and the RoPE variant (CPU default ≈ 10
    min)."""

    d_model: int = 128
    n_layers: int = 4
    n_heads: int = 4
    head_dim: int = 32
    seq_len: int = 128
    batch_size: int = 8
    steps: int = 400
    lr: float = 2e-3
    warmup: int = 40
    seed: int = 0
    corpus: str = "english"
    variant: RopeVariant = field(default_factory=lambda: BaseChange(10000.0))
    rope_theta: float = 10000.0  # the base variants such as PRoPE(p) start from
    tokenizer: str = "smollm2-135m"  # or "tiny-char" (ropelens.testing's character tokenizer)
    val_windows: int = 64
    val_fraction: float = 0.1

    def __post_init__(self) -> None:
        for name in (
            "d_model",
            "n_layers",
            "n_heads",
            "head_dim",
            "seq_len",
            "batch_size",
            "steps",
            "val_windows",
        ):
            check_positive_int(
                getattr(self, name),
                name,
                f" (the CPU default is {getattr(TrainConfig, name, None)})",
            )
        if (
            isinstance(self.warmup, bool)
            or not isinstance(self.warmup, numbers.Integral)
            or self.warmup < 0
        ):
            raise InputError(
                f"warmup must be an int >= 0 (steps of linear warm-up), got {self.warmup!r}"
            )
        if self.head_dim % 2:
            raise InputError(
                f"head_dim must be even (RoPE rotates pairs of dims), got {self.head_dim}"
            )
        if not isinstance(self.lr, numbers.Real) or not 0 < self.lr < 1:
            raise InputError(f"lr must be a number in (0, 1), got {self.lr!r} (e.g. 2e-3)")
        check_variant(self.variant)
        if type(self.variant).__name__ not in _FREQ_VARIANTS:
            raise InputError(
                f"{self.variant.name} is not one fixed frequency vector, so training cannot bake "
                f"it into the model: use one of {', '.join(_FREQ_VARIANTS)}"
            )
        if self.seq_len < 2:
            raise InputError(f"seq_len must be >= 2, got {self.seq_len}")

    @property
    def tokens(self) -> int:
        """The token budget: steps × batch_size × seq_len."""
        return self.steps * self.batch_size * self.seq_len

    def scaled(self, factor: float) -> TrainConfig:
        """Width (heads), depth and steps × ``factor`` (GPU runs); head_dim, seq_len, lr
        unchanged."""
        return dataclasses.replace(
            self, **scaled_shape(self.n_heads, self.head_dim, self.n_layers, self.steps, factor)
        )

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["variant"] = self.variant.to_dict()
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> TrainConfig:
        return cls(**{**d, "variant": variant_from_dict(d["variant"])})


@dataclass(frozen=True)
class TrainResult:
    """A finished training run: config, losses, validation at seq_len and 2×seq_len, provenance."""

    config: TrainConfig
    final_train_loss: float
    val: LossEstimate  # at seq_len
    val_2x: LossEstimate  # at 2 × seq_len (length generalisation)
    loss_curve: tuple[float, ...]
    wall_seconds: float
    vocab_size: int
    provenance: Provenance

    def to_dict(self) -> dict[str, Any]:
        return {
            "config": self.config.to_dict(),
            "final_train_loss": self.final_train_loss,
            "val": self.val.to_dict(),
            "val_2x": self.val_2x.to_dict(),
            "loss_curve": list(self.loss_curve),
            "wall_seconds": self.wall_seconds,
            "vocab_size": self.vocab_size,
            "provenance": self.provenance.to_dict(),
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> TrainResult:
        return cls(
            config=TrainConfig.from_dict(d["config"]),
            final_train_loss=float(d["final_train_loss"]),
            val=LossEstimate.from_dict(d["val"]),
            val_2x=LossEstimate.from_dict(d["val_2x"]),
            loss_curve=tuple(float(x) for x in d["loss_curve"]),
            wall_seconds=float(d["wall_seconds"]),
            vocab_size=int(d["vocab_size"]),
            provenance=Provenance.from_dict(d["provenance"]),
        )

    def save(self, path: str | Path) -> None:
        """Write JSON atomically."""
        dump_json(path, self.to_dict())

    @classmethod
    def load(cls, path: str | Path) -> TrainResult:
        return cls.from_dict(json.loads(Path(path).read_text()))


# --------------------------------------------------------------------------------------------
# model
# --------------------------------------------------------------------------------------------
def layer_rope(config: TrainConfig, layer: int = 0) -> LayerRope:
    """The plain-RoPE spec of one layer of the model ``config`` describes (what variants start
    from)."""
    inv = 1.0 / (
        config.rope_theta
        ** (torch.arange(0, config.head_dim, 2, dtype=torch.float) / config.head_dim)
    )
    return LayerRope(
        layer=layer,
        inv_freq=inv,
        head_dim=config.head_dim,
        rotary_dim=config.head_dim,
        pairing="half",
        n_heads=config.n_heads,
        n_kv_heads=config.n_heads,
        score_scale=config.head_dim**-0.5,
        base=float(config.rope_theta),
        n_ctx=2 * config.seq_len,
    )


def build_model(config: TrainConfig, vocab_size: int):
    """A randomly initialised ``LlamaForCausalLM`` whose rotary module uses the config's variant."""
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=config.d_model,
        intermediate_size=4 * config.d_model,
        num_hidden_layers=config.n_layers,
        num_attention_heads=config.n_heads,
        num_key_value_heads=config.n_heads,
        head_dim=config.head_dim,
        max_position_embeddings=2 * config.seq_len,
        tie_word_embeddings=True,
        rope_parameters={"rope_type": "default", "rope_theta": float(config.rope_theta)},
        bos_token_id=None,
        eos_token_id=None,
        pad_token_id=None,
    )
    torch.manual_seed(config.seed)
    model = LlamaForCausalLM(cfg)
    inv = config.variant.inv_freq(layer_rope(config)).float()
    rotary = model.model.rotary_emb
    if rotary.inv_freq.shape != inv.shape:
        raise InputError(
            f"{config.variant.name} gives {inv.numel()} frequencies but the model has "
            f"{rotary.inv_freq.numel()} planes"
        )
    # Overwritten after construction: HF's _init_weights recomputes these from rope_parameters.
    rotary.inv_freq.copy_(inv)
    rotary.original_inv_freq.copy_(inv)
    return model


# --------------------------------------------------------------------------------------------
# data
# --------------------------------------------------------------------------------------------
@functools.lru_cache(maxsize=4)
def _tokenizer(name: str):
    if name == "tiny-char":
        return tiny_tokenizer()

    return load_model(name, device="cpu").tokenizer


def token_streams(
    corpus: str, tokenizer: str, val_fraction: float
) -> tuple[Tensor, Tensor, int, int]:
    """(train ids, val ids, compact vocab size, compact BOS id), relabelled to the corpus's ids.

    ``tokenizer`` is an embedded model name or ``"tiny-char"``; the ids are those the corpus uses,
    relabelled 0 … vocab − 1 (see the module docstring).
    """
    train_ids, val_ids, used, bos = _relabelled(corpus, tokenizer, val_fraction)
    return train_ids, val_ids, int(used.numel()), bos


@functools.lru_cache(maxsize=8)
def _relabelled(
    corpus: str, tokenizer: str, val_fraction: float
) -> tuple[Tensor, Tensor, Tensor, int]:
    """:func:`token_streams`, with the original id of each compact id in place of the vocab size."""
    tok = _tokenizer(tokenizer)
    train_c, val_c = data.load_corpus(corpus).split(val_fraction)
    train_ids = data.token_stream(train_c, tok)
    val_ids = data.token_stream(val_c, tok)
    # The id set, not counts, of val joins the vocabulary so no val token is out of vocabulary.
    used = torch.unique(torch.cat([train_ids, val_ids, torch.tensor([tok.bos_token_id])]))
    remap = torch.full((int(used.max()) + 1,), -1, dtype=torch.long)
    remap[used] = torch.arange(used.numel())
    return remap[train_ids], remap[val_ids], used, int(remap[tok.bos_token_id])


def cut_windows(ids: Tensor, n_ctx: int, bos: int, n: int | None = None) -> Int[Tensor, "n n_ctx"]:
    """Non-overlapping windows of BOS + (n_ctx − 1) tokens, as ropelens.run.data.windows cuts
    them."""
    if ids.numel() < n_ctx - 1:
        raise InputError(
            f"the split has {ids.numel()} tokens, fewer than one window of {n_ctx}: lower seq_len "
            "or use a larger corpus"
        )
    w = ids.unfold(0, n_ctx - 1, n_ctx - 1)
    w = w if n is None else w[:n]
    return torch.cat([torch.full((w.shape[0], 1), bos, dtype=torch.long), w], dim=1)


# --------------------------------------------------------------------------------------------
# training
# --------------------------------------------------------------------------------------------
def lr_at(step: int, lr: float, warmup: int, steps: int) -> float:
    """Linear warm-up over ``warmup`` steps, then cosine decay to 10% of ``lr`` at ``steps``."""
    if step < warmup:
        return lr * (step + 1) / warmup
    t = (step - warmup) / max(1, steps - warmup)
    return lr * (0.1 + 0.45 * (1 + math.cos(math.pi * min(1.0, t))))


def _hf_loss(model, batch: Tensor) -> Tensor:
    return model(input_ids=batch, labels=batch).loss


def fit(
    model,
    batches: Int[Tensor, "n seq"],
    *,
    steps: int,
    batch_size: int,
    lr: float,
    warmup: int,
    seed: int,
    loss_fn: Callable[[Any, Tensor], Tensor] | None = None,
    device: str | torch.device | None = None,
    progress: str | None = None,
    on_step: Callable[[int, Any, list[float]], None] | None = None,
) -> list[float]:
    """Train ``model`` in place; returns the loss per step (the one loop every ropelens trainer
    uses).

    AdamW (β 0.9/0.95, weight decay 0.1), :func:`lr_at`'s schedule, gradient norm clipped at 1, and
    ``batch_size`` windows drawn at random from ``batches`` by a generator seeded with ``seed``: the
    same arguments give the same numbers. ``loss_fn(model, batch)`` (None: the HF causal-LM loss);
    pass one that runs a bridge under a RoPE variant to fine-tune through it. ``progress``: a tqdm
    label, or None for none. ``on_step(steps_done, model, losses)`` runs after every optimiser step
    (to save checkpoints). Leaves the model in eval mode.
    """
    loss_fn = loss_fn or _hf_loss
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.95), weight_decay=0.1)
    g = torch.Generator().manual_seed(seed)
    it: Any = range(steps)
    if progress is not None:
        from tqdm.auto import tqdm

        it = tqdm(it, desc=progress, unit="step")
    curve: list[float] = []
    for step in it:
        for group in opt.param_groups:
            group["lr"] = lr_at(step, lr, warmup, steps)
        batch = batches[torch.randint(0, batches.shape[0], (batch_size,), generator=g)]
        if device is not None:
            batch = batch.to(device)
        loss = loss_fn(model, batch)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        curve.append(float(loss.detach()))
        if not math.isfinite(curve[-1]):
            raise FloatingPointError(
                f"training loss became {curve[-1]} at step {step} with lr={lr}: lower lr"
            )
        if on_step is not None:
            on_step(step + 1, model, curve)
    model.eval()
    return curve


def _validate(model, val_ids: Tensor, bos: int, config: TrainConfig, n_ctx: int) -> LossEstimate:
    tokens = cut_windows(val_ids, n_ctx, bos, config.val_windows)
    return bootstrap_ci(
        window_losses(model, tokens, batch_size=8, progress=False), seed=config.seed
    )


def train(
    config: TrainConfig,
    progress: bool = True,
    *,
    return_model: bool = False,
    checkpoint_dir: str | os.PathLike[str] | None = None,
    checkpoint_every: int | None = None,
):
    """Train one model from scratch; deterministic given ``config`` (seeded init and data order).

    Returns the :class:`TrainResult`, or ``(result, model)`` with ``return_model=True`` (the trained
    HF ``LlamaForCausalLM``, in eval mode).

    ``checkpoint_dir`` and ``checkpoint_every``: save the model at step 0, every
    ``checkpoint_every`` steps and at the last step, each as ``checkpoint_dir/step-NNNNNN/``, an HF
    model directory that ``ropelens.load_model`` reads (see :mod:`ropelens.training.checkpoints`).
    Saving does not change the training: the same config gives the same numbers with or without
    checkpoints.
    """
    if not isinstance(config, TrainConfig):
        raise TypeError(f"expected a TrainConfig, got {type(config).__name__}")
    if (checkpoint_dir is None) != (checkpoint_every is None):
        raise InputError(
            "pass checkpoint_dir and checkpoint_every together (where to save, and every how "
            "many steps)"
        )
    if checkpoint_every is not None:
        check_positive_int(checkpoint_every, "checkpoint_every", " (steps between checkpoints)")
    start = time.perf_counter()
    train_ids, val_ids, used, bos = _relabelled(
        config.corpus, config.tokenizer, config.val_fraction
    )
    vocab = int(used.numel())
    batches = cut_windows(train_ids, config.seq_len, bos)
    model = build_model(config, vocab)
    writer = (
        None
        if checkpoint_dir is None
        else _checkpoint_writer(config, model, used, checkpoint_dir, checkpoint_every)
    )
    on_step = None
    if writer is not None:
        saved_at = set(writer.steps(config.steps))
        writer.save(model, 0, [])

        def on_step(done: int, m: Any, losses: list[float]) -> None:
            if done in saved_at:
                writer.save(m, done, losses)

    try:
        curve = fit(
            model,
            batches,
            steps=config.steps,
            batch_size=config.batch_size,
            lr=config.lr,
            warmup=config.warmup,
            seed=config.seed,
            progress=config.variant.name if progress else None,
            on_step=on_step,
        )
    finally:
        if writer is not None:
            writer.close()
    val = _validate(model, val_ids, bos, config, config.seq_len)
    val_2x = _validate(model, val_ids, bos, config, 2 * config.seq_len)
    wall = time.perf_counter() - start
    tail = curve[-min(10, len(curve)) :]
    result = TrainResult(
        config=config,
        final_train_loss=sum(tail) / len(tail),
        val=val,
        val_2x=val_2x,
        loss_curve=tuple(curve),
        wall_seconds=wall,
        vocab_size=vocab,
        provenance=Provenance(
            model=f"llama-{config.n_layers}x{config.d_model}-{config.variant.name}",
            corpus=config.corpus,
            n_tokens=config.tokens,
            n_windows=config.val_windows,
            n_ctx=config.seq_len,
            config=config.to_dict(),
            seconds=wall,
        ),
    )
    return (result, model) if return_model else result


def _checkpoint_writer(
    config: TrainConfig, model: Any, used: Tensor, directory: str | os.PathLike[str], every: int
) -> CheckpointWriter:
    """The run's checkpoint writer; refuses a variant an HF config cannot state (its checkpoints
    would load with other frequencies)."""
    base = getattr(config.variant, "base", None)
    inv = model.model.rotary_emb.inv_freq
    theta = plain_rope_theta(
        inv, config.head_dim, [b for b in (base, config.rope_theta) if b is not None]
    )
    if theta is None:
        raise InputError(
            f"{config.variant.name} is not plain RoPE with one base, which is all an HF config can "
            "state, so its checkpoints would load with other frequencies: save checkpoints of "
            "Default or BaseChange runs"
        )
    return CheckpointWriter(
        directory,
        every,
        tokenizer=_tokenizer(config.tokenizer),
        used=used,
        config=config.to_dict(),
        rope_theta=theta,
    )
