"""Next-token losses from a causal LM's logits, a chunk of positions at a time: the arithmetic every
forward shares."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from jaxtyping import Float, Int
from torch import Tensor

from ropelens.devices import device_of

__all__ = ["LOGIT_CHUNK", "chunked_head", "head_logits", "hf_losses", "losses_of", "token_losses"]

LOGIT_CHUNK = 1024  # positions whose logits exist at once: [chunk, vocab] instead of [n, vocab]


def head_logits(hf: Any, hidden: Tensor) -> Tensor:
    """The causal LM's logits of ``hidden`` (lm_head and the family's final logit transform)."""
    cfg = hf.config.get_text_config() if hasattr(hf.config, "get_text_config") else hf.config
    logits = hf.lm_head(hidden)
    if getattr(hf, "logit_scale", None) is not None:  # Cohere
        logits = logits * hf.logit_scale
    if getattr(cfg, "logits_scaling", None):  # Granite
        logits = logits / cfg.logits_scaling
    cap = getattr(cfg, "final_logit_softcapping", None)
    if cap:  # Gemma 2/3
        logits = torch.tanh(logits / cap) * cap
    return logits


def chunked_head(hf: Any) -> bool:
    """Whether :func:`head_logits` on the base model's hidden states gives the model's own logits
    (checked once on 8 tokens); where it does not, losses take the model's full logits."""
    known = getattr(hf, "_ropelens_chunked_head", None)
    if known is None:
        toks = torch.arange(4, 12, device=device_of(hf))[None]
        try:
            hidden = hf.base_model(input_ids=toks, use_cache=False).last_hidden_state
            known = torch.equal(head_logits(hf, hidden), hf(input_ids=toks, use_cache=False).logits)
        except (AttributeError, TypeError):
            known = False
        object.__setattr__(hf, "_ropelens_chunked_head", known)
    return known


def hf_losses(hf: Any, batch: Int[Tensor, "b pos"]) -> Float[Tensor, " b"]:
    """Mean next-token loss of each window from an HF causal LM, with logits made a chunk of
    positions at a time."""
    if not chunked_head(hf):
        return losses_of(hf(input_ids=batch, use_cache=False).logits, batch)
    hidden = hf.base_model(input_ids=batch, use_cache=False).last_hidden_state
    total = torch.zeros(batch.shape[0], dtype=torch.float64, device=batch.device)
    for s in range(0, batch.shape[1] - 1, LOGIT_CHUNK):
        e = min(s + LOGIT_CHUNK, batch.shape[1] - 1)
        per_token = token_losses(head_logits(hf, hidden[:, s:e]).float(), batch[:, s + 1 : e + 1])
        total += per_token.double().sum(-1)
    return (total / (batch.shape[1] - 1)).float()


def losses_of(logits: Tensor, batch: Tensor) -> Tensor:
    # float32 softmax: bf16 logits lose the last digits of the loss a CI is built from.
    return token_losses(logits[:, :-1].float(), batch[:, 1:]).mean(dim=-1)


def token_losses(
    logits: Float[Tensor, "b pos vocab"], targets: Int[Tensor, "b pos"]
) -> Float[Tensor, "b pos"]:
    """Next-token loss at every position; rows of [b·pos, vocab] keep the vocabulary contiguous,
    which on a CPU is ~4× faster than cross_entropy over a [b, vocab, pos] view."""
    flat = F.cross_entropy(
        logits.reshape(-1, logits.shape[-1]), targets.reshape(-1), reduction="none"
    )
    return flat.view(targets.shape)
