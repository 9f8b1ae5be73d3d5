"""The only place hook names are spelled.

All tensors leave this module as ``[batch, pos, head, d_head]`` (queries) or
``[batch, pos, kv_head, d_head]`` (keys), whatever layout the bridge hook uses.
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import Tensor

from ropelens.errors import InputError, UnsupportedModelError
from ropelens.models import device_of

__all__ = ["AttnHooks", "attn_hooks", "to_bphd"]


@dataclass(frozen=True)
class AttnHooks:
    """Hook names of one attention layer, and the layout of its pre-RoPE hooks."""

    layer: int
    q_pre: str
    k_pre: str
    q_post: str | None  # None when the bridge fires no post-RoPE hook (GPT-J): rotate ourselves
    k_post: str | None
    scores: str
    pattern: str
    pre_heads_first: bool  # Gemma's q/k-norm hooks are [batch, head, pos, d]
    cos: str | None = None  # the (cos, sin) tables the attention received, where those hooks fire:
    sin: str | None = None  # with no post-RoPE hook, ropelens rotates with exactly these tables

    def pre(self, which: str) -> str:
        return self.q_pre if which == "q" else self.k_pre

    def post(self, which: str) -> str | None:
        return self.q_post if which == "q" else self.k_post


def attn_hooks(model, layer: int) -> AttnHooks:
    """Hook names for ``layer`` on this bridge.

    Pre-RoPE q/k are the last tensors before rotation: ``hook_q_normed``/``hook_k_normed`` where
    the model normalises q and k (Gemma 3), else ``hook_q``/``hook_k``.
    """
    p = f"blocks.{layer}.attn."
    if p + "hook_q" not in model.hook_dict:
        arch = type(getattr(model, "original_model", model)).__name__
        raise UnsupportedModelError(f"{arch}: its TransformerLens adapter exposes no per-head query hook for layer {layer} "
                                    f"({p}hook_q), so ropelens cannot capture its queries and keys; see "
                                    "docs/models.md for the families ropelens measures")
    fires = _firing(model)
    normed = "hook_q_normed" in fires
    q_post = p + "hook_rot_q" if "hook_rot_q" in fires else None
    k_post = p + "hook_rot_k" if "hook_rot_k" in fires else None
    return AttnHooks(
        layer=layer,
        q_pre=p + ("hook_q_normed" if normed else "hook_q"),
        k_pre=p + ("hook_k_normed" if normed else "hook_k"),
        q_post=q_post,
        k_post=k_post,
        scores=p + "hook_attn_scores",
        pattern=p + "hook_pattern",
        pre_heads_first=normed,
        cos=p + "hook_cos" if "hook_cos" in fires else None,
        sin=p + "hook_sin" if "hook_sin" in fires else None,
    )


_PROBED = ("hook_q_normed", "hook_k_normed", "hook_rot_q", "hook_rot_k", "hook_pattern", "hook_cos", "hook_sin")


def _firing(model) -> frozenset[str]:
    """Which optional attention hooks actually fire on this bridge (some exist but never run,
    e.g. GPT-J's hook_rot_q); probed once with a two-token forward and remembered."""
    cached = getattr(model, "_ropelens_firing", None)
    if cached is not None:
        return cached
    import torch

    fired: set[str] = set()
    # the first block with attention (a hybrid's first layers may have none)
    first = next((i for i, b in enumerate(getattr(model, "blocks", ())) if hasattr(b, "attn")), 0)
    names = [f"blocks.{first}.attn.{h}" for h in _PROBED if f"blocks.{first}.attn.{h}" in model.hook_dict]

    def probe(x, hook):
        fired.add(hook.name.rsplit(".", 1)[-1])
        return x

    device = device_of(model)
    toks = torch.tensor([[model.tokenizer.bos_token_id or 0, 1]], device=device)
    with torch.no_grad(), model.hooks(fwd_hooks=[(n, probe) for n in names]):
        model(toks, return_type=None, stop_at_layer=first + 1)
    result = frozenset(fired)
    model._ropelens_firing = result
    return result


def to_bphd(x: Tensor, heads_first: bool, n_heads: int | None = None) -> Tensor:
    """Bring a hook tensor to ``[batch, pos, head, d_head]``.

    A 3-D ``[batch, pos, n_heads·d_head]`` tensor (OLMo 2 normalises q and k over the whole
    projection, before the head split) is split into ``n_heads`` heads.
    """
    if x.ndim == 3 and n_heads and x.shape[-1] % n_heads == 0:
        return x.unflatten(-1, (n_heads, x.shape[-1] // n_heads))
    if x.ndim != 4:
        raise InputError(f"expected a 4-D per-head tensor, got shape {tuple(x.shape)}")
    return x.transpose(1, 2) if heads_first else x
