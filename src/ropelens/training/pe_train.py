"""Train small GPT-style models with learned absolute position embeddings (Luo & Love, Fig. 7, in
small).

The model is HF ``GPT2LMHeadModel`` whose ``wpe`` table is the object of study. Each training window
is BOS + (n_positions − 1) tokens of the embedded English text, fed in one of three orders —
``forward``, ``backward`` (reversed) or ``permuted`` (one fixed seeded permutation of positions,
the same for every window) — or left untrained (``init``), the random baseline.

Data (SmolLM2 tokens relabelled to the ids the corpus uses), windows and the learning-rate schedule
come from :mod:`ropelens.training.train`, so both trainers see the same text the same way.
"""

from __future__ import annotations

import dataclasses
import json
import numbers
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import torch
from jaxtyping import Float, Int
from torch import Tensor

from ropelens.analyses.pe_geometry import learned_pe
from ropelens.errors import InputError
from ropelens.results.provenance import Provenance
from ropelens.results.serialize import dump_json, tensor_from_json, tensor_to_json
from ropelens.training.train import cut_windows, fit, scaled_shape, token_streams

__all__ = [
    "ORDERS",
    "Order",
    "PETrainConfig",
    "PETrainResult",
    "build_pe_model",
    "order_permutation",
    "reorder",
    "train_pe_model",
]

Order = Literal["forward", "backward", "permuted", "init"]
ORDERS: tuple[str, ...] = ("forward", "backward", "permuted", "init")


def _posint(x: Any, what: str, default: Any) -> int:
    if isinstance(x, bool) or not isinstance(x, numbers.Integral) or x <= 0:
        raise InputError(f"{what} must be a positive int, got {x!r} (the CPU default is {default})")
    return int(x)


def _check_order(order: Any) -> str:
    if order not in ORDERS:
        raise InputError(f"order must be one of {', '.join(ORDERS)}, got {order!r}")
    return order


@dataclass(frozen=True)
class PETrainConfig:
    """Model shape, data and optimisation for one learned-PE model (CPU default ≈ 2 min per
    order)."""

    n_positions: int = 256  # rows of the position table; every training window fills all of them
    d_model: int = 64
    n_layers: int = 2
    n_heads: int = 4
    batch_size: int = 4  # 1,024 tokens a step: the output softmax over ~5k ids dominates CPU time
    steps: int = 250
    lr: float = 3e-3
    warmup: int = 25
    seed: int = 0
    corpus: str = "english"
    tokenizer: str = "smollm2-135m"  # or "tiny-char" (ropelens.testing's character tokenizer)
    val_windows: int = 16
    val_fraction: float = 0.1
    device: str = "cpu"

    def __post_init__(self) -> None:
        for name in (
            "n_positions",
            "d_model",
            "n_layers",
            "n_heads",
            "batch_size",
            "steps",
            "val_windows",
        ):
            _posint(getattr(self, name), name, getattr(PETrainConfig, name))
        if self.n_positions < 2:
            raise InputError(
                f"n_positions must be >= 2 (a window needs two positions), got {self.n_positions}"
            )
        if self.d_model % self.n_heads:
            raise InputError(f"d_model {self.d_model} must be divisible by n_heads {self.n_heads}")
        if (
            isinstance(self.warmup, bool)
            or not isinstance(self.warmup, numbers.Integral)
            or self.warmup < 0
        ):
            raise InputError(
                f"warmup must be an int >= 0 (steps of linear warm-up), got {self.warmup!r}"
            )
        if not isinstance(self.lr, numbers.Real) or not 0 < self.lr < 1:
            raise InputError(f"lr must be a number in (0, 1), got {self.lr!r} (e.g. 2e-3)")

    @property
    def tokens(self) -> int:
        """The token budget: steps × batch_size × n_positions."""
        return self.steps * self.batch_size * self.n_positions

    def scaled(self, factor: float) -> PETrainConfig:
        """Width, depth, steps and positions × ``factor`` (GPU runs); head width and lr
        unchanged."""
        shape = scaled_shape(
            self.n_heads, self.d_model // self.n_heads, self.n_layers, self.steps, factor
        )
        return dataclasses.replace(
            self, **shape, n_positions=max(2, round(self.n_positions * factor))
        )

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> PETrainConfig:
        return cls(**d)


@dataclass(frozen=True)
class PETrainResult:
    """One model's learned position table after training in one order (or at init)."""

    order: str
    config: PETrainConfig
    pe: Float[Tensor, "n_pos d_model"]
    final_train_loss: float  # mean of the last ≤ 10 steps; the held-out loss at init for "init"
    val_loss: float  # held-out windows, fed in the same order as training
    loss_curve: tuple[float, ...]
    wall_seconds: float
    vocab_size: int
    provenance: Provenance

    def __post_init__(self) -> None:
        _check_order(self.order)
        want = (self.config.n_positions, self.config.d_model)
        if not isinstance(self.pe, Tensor) or tuple(self.pe.shape) != want:
            raise InputError(
                f"pe must be a tensor of shape {want}, got {getattr(self.pe, 'shape', self.pe)!r}"
            )

    def to_dict(self) -> dict[str, Any]:
        return {
            "type": "PETrainResult",
            "order": self.order,
            "config": self.config.to_dict(),
            "pe": tensor_to_json(self.pe),
            "final_train_loss": self.final_train_loss,
            "val_loss": self.val_loss,
            "loss_curve": list(self.loss_curve),
            "wall_seconds": self.wall_seconds,
            "vocab_size": self.vocab_size,
            "provenance": self.provenance.to_dict(),
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> PETrainResult:
        if d.get("type") != "PETrainResult":
            raise InputError(
                f"expected a PETrainResult, got type {d.get('type')!r}: load it with its own class"
            )
        return cls(
            order=d["order"],
            config=PETrainConfig.from_dict(d["config"]),
            pe=tensor_from_json(d["pe"]),
            final_train_loss=float(d["final_train_loss"]),
            val_loss=float(d["val_loss"]),
            loss_curve=tuple(float(x) for x in d["loss_curve"]),
            wall_seconds=float(d["wall_seconds"]),
            vocab_size=int(d["vocab_size"]),
            provenance=Provenance.from_dict(d["provenance"]),
        )

    def save(self, path: str | Path) -> None:
        """Write JSON atomically (the position table as base64 float32, exact)."""
        dump_json(path, self.to_dict())

    @classmethod
    def load(cls, path: str | Path) -> PETrainResult:
        """Read a result written by :meth:`save`."""
        return cls.from_dict(json.loads(Path(path).read_text()))


def build_pe_model(config: PETrainConfig, vocab_size: int):
    """A seeded, randomly initialised ``GPT2LMHeadModel`` with a learned ``wpe`` of n_positions
    rows."""
    from transformers import GPT2Config, GPT2LMHeadModel

    cfg = GPT2Config(
        vocab_size=vocab_size,
        n_positions=config.n_positions,
        n_embd=config.d_model,
        n_layer=config.n_layers,
        n_head=config.n_heads,
        n_inner=4 * config.d_model,
        # No dropout: short runs need no regularisation, and results then depend only on the seed.
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
        tie_word_embeddings=True,
        bos_token_id=None,
        eos_token_id=None,
        pad_token_id=None,
    )
    torch.manual_seed(config.seed)
    return GPT2LMHeadModel(cfg)


def order_permutation(n_positions: int, order: str, seed: int = 0) -> Int[Tensor, " n_positions"]:
    """Source position of each fed position; position 0 (BOS) stays first in every order."""
    _check_order(order)
    _posint(n_positions, "n_positions", PETrainConfig.n_positions)
    body = torch.arange(1, n_positions)
    if order == "backward":
        body = body.flip(0)
    elif order == "permuted":
        # One permutation for the whole run (Luo & Love's PERM), not a fresh one per window.
        body = body[torch.randperm(n_positions - 1, generator=torch.Generator().manual_seed(seed))]
    return torch.cat([torch.zeros(1, dtype=torch.long), body])


def reorder(
    tokens: Int[Tensor, "batch n_positions"], order: str, seed: int = 0
) -> Int[Tensor, "batch n_positions"]:
    """Windows with their tokens fed forward, backward or permuted (``init`` feeds them forward)."""
    if not isinstance(tokens, Tensor) or tokens.ndim != 2:
        raise InputError(
            "tokens must be a [batch, n_positions] tensor, got "
            f"{getattr(tokens, 'shape', tokens)!r}"
        )
    return tokens[:, order_permutation(tokens.shape[1], order, seed)]


@torch.no_grad()
def _mean_loss(model, windows: Tensor, batch_size: int = 8) -> float:
    """Token-weighted mean next-token loss over ``windows`` (all windows have the same length)."""
    losses = [
        float(model(input_ids=windows[i : i + batch_size], labels=windows[i : i + batch_size]).loss)
        * windows[i : i + batch_size].shape[0]
        for i in range(0, windows.shape[0], batch_size)
    ]
    return sum(losses) / windows.shape[0]


def _fit(model, batches: Tensor, config: PETrainConfig) -> list[float]:
    """ropelens.training.train.fit on seeded random batches of the ordered windows."""
    return fit(
        model,
        batches,
        steps=config.steps,
        batch_size=config.batch_size,
        lr=config.lr,
        warmup=config.warmup,
        seed=config.seed,
        device=config.device,
    )


def train_pe_model(order: Order, config: PETrainConfig | None = None) -> PETrainResult:
    """Train (or, for ``init``, only build) one learned-PE model; deterministic given order and
    config."""
    _check_order(order)
    config = PETrainConfig() if config is None else config
    if not isinstance(config, PETrainConfig):
        raise TypeError(f"expected a PETrainConfig, got {type(config).__name__}")
    start = time.perf_counter()
    train_ids, val_ids, vocab, bos = token_streams(
        config.corpus, config.tokenizer, config.val_fraction
    )
    batches = reorder(cut_windows(train_ids, config.n_positions, bos), order, config.seed)
    val = reorder(
        cut_windows(val_ids, config.n_positions, bos, config.val_windows), order, config.seed
    )
    model = build_pe_model(config, vocab).to(config.device)
    curve: list[float] = []
    if order != "init":
        model.train()
        curve = _fit(model, batches, config)
    model.eval()
    val_loss = _mean_loss(model, val.to(config.device))
    tail = curve[-10:]
    wall = time.perf_counter() - start
    return PETrainResult(
        order=order,
        config=config,
        pe=learned_pe(model),
        final_train_loss=sum(tail) / len(tail) if tail else val_loss,
        val_loss=val_loss,
        loss_curve=tuple(curve),
        wall_seconds=wall,
        vocab_size=vocab,
        provenance=Provenance(
            model=f"gpt2-{config.n_layers}x{config.d_model}-learned-pe-{order}",
            corpus=config.corpus,
            n_tokens=config.tokens if order != "init" else 0,
            n_windows=int(val.shape[0]),
            n_ctx=config.n_positions,
            config={"order": order, **config.to_dict()},
            seconds=wall,
        ),
    )
