"""The only place hook names are spelled.

All tensors leave this module as ``[batch, pos, head, d_head]`` (queries) or
``[batch, pos, kv_head, d_head]`` (keys), whatever layout the bridge hook uses.
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import Tensor

from ropelens.devices import device_of
from ropelens.errors import InputError, UnsupportedModelError
from ropelens.spec.forward_taps import attention_tap

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
    # q/k where they enter the score, for a model that changes them after the rotation (a norm after
    # RoPE), where the bridge fires a hook there (HunYuan: the q/k-norm hooks after hook_rot_q/k);
    # None: taken from the HF attention function instead (ropelens.spec.forward_taps.attention_tap)
    q_score: str | None = None
    k_score: str | None = None
    calls_attention_function: bool = (
        False  # the bridge runs the HF attention module's own attention function
    )

    def pre(self, which: str) -> str:
        return self.q_pre if which == "q" else self.k_pre

    def post(self, which: str) -> str | None:
        return self.q_post if which == "q" else self.k_post

    def score(self, which: str) -> str | None:
        return self.q_score if which == "q" else self.k_score

    def heads_first(self, name: str) -> bool:
        """Whether hook ``name``'s 4-D tensors are ``[batch, head, pos, d]`` (the bridge's q/k-norm
        hooks)."""
        return name.endswith(("hook_q_normed", "hook_k_normed"))


def attn_hooks(model, layer: int, *, norm_after_rope: bool = False) -> AttnHooks:
    """Hook names for ``layer`` on this bridge.

    Pre-RoPE q/k are the last tensors before rotation: ``hook_q_normed``/``hook_k_normed`` where the
    model normalises q and k before RoPE (Gemma 3), the norm submodules' ``q_norm.hook_out``/
    ``k_norm.hook_out`` where only those fire (Gemma 4), else ``hook_q``/``hook_k``. Where the
    q/k-norm hooks fire after ``hook_rot_q``/``hook_rot_k`` (HunYuan normalises after RoPE), they
    are the q/k that enter the score instead. ``norm_after_rope`` (the spec's reading of the layer)
    says the norm submodules follow the rotation, so their outputs are never taken for pre-RoPE q/k
    (NanoChat).
    """
    p = f"blocks.{layer}.attn."
    if p + "hook_q" not in model.hook_dict:
        arch = type(getattr(model, "original_model", model)).__name__
        raise UnsupportedModelError(
            f"{arch}: its TransformerLens adapter exposes no per-head query hook for layer {layer} "
            f"({p}hook_q), so ropelens cannot capture its queries and keys; "
            "`ropelens rope-spec --families` lists the families ropelens measures"
        )
    order = _firing(model)
    fires = frozenset(order)
    after = (
        "hook_q_normed" in fires
        and "hook_rot_q" in fires
        and order.index("hook_q_normed") > order.index("hook_rot_q")
    )
    normed = "hook_q_normed" in fires and not after
    # a bridge that leaves attention to HF (Gemma 4) exposes q/k norms only as submodules, [batch,
    # pos, head, d]
    sub_normed = (
        not (normed or after or norm_after_rope)
        and "q_norm.hook_out" in fires
        and "k_norm.hook_out" in fires
    )
    q_post = p + "hook_rot_q" if "hook_rot_q" in fires else None
    k_post = p + "hook_rot_k" if "hook_rot_k" in fires else None
    return AttnHooks(
        layer=layer,
        q_pre=p + ("hook_q_normed" if normed else "q_norm.hook_out" if sub_normed else "hook_q"),
        k_pre=p + ("hook_k_normed" if normed else "k_norm.hook_out" if sub_normed else "hook_k"),
        q_post=q_post,
        k_post=k_post,
        scores=p + "hook_attn_scores",
        pattern=p + "hook_pattern",
        pre_heads_first=normed,
        cos=p + "hook_cos" if "hook_cos" in fires else None,
        sin=p + "hook_sin" if "hook_sin" in fires else None,
        q_score=p + "hook_q_normed" if after else None,
        k_score=p + "hook_k_normed" if after and "hook_k_normed" in fires else None,
        calls_attention_function=_ATTENTION in fires,
    )


_PROBED = (
    "hook_q_normed",
    "hook_k_normed",
    "hook_rot_q",
    "hook_rot_k",
    "hook_pattern",
    "hook_cos",
    "hook_sin",
    "q_norm.hook_out",
    "k_norm.hook_out",
)
# not a hook: the HF attention function, called by bridges that run HF's forward
_ATTENTION = "attention function"


def _firing(model) -> tuple[str, ...]:
    """Which optional attention hooks actually fire on this bridge (some exist but never run, e.g.
    GPT-J's hook_rot_q), in the order they fire; probed once with a two-token forward and
    remembered."""
    cached = getattr(model, "_ropelens_firing", None)
    if isinstance(cached, tuple):
        return cached
    import torch

    fired: list[str] = []
    # the first block with attention (a hybrid's first layers may have none)
    first = next((i for i, b in enumerate(getattr(model, "blocks", ())) if hasattr(b, "attn")), 0)
    names = [h for h in _PROBED if f"blocks.{first}.attn.{h}" in model.hook_dict]

    def probe(name: str):  # by the name asked for: an alias fires under its target's name
        def fn(x, hook):  # noqa: ARG001
            if name not in fired:
                fired.append(name)
            return x

        return fn

    def called(*_: object) -> None:
        if _ATTENTION not in fired:
            fired.append(_ATTENTION)

    device = device_of(model)
    toks = torch.tensor([[model.tokenizer.bos_token_id or 0, 1]], device=device)
    attn = (
        getattr(model.blocks[first].attn, "original_component", None)
        if hasattr(model, "blocks")
        else None
    )
    with (
        torch.no_grad(),
        model.hooks(fwd_hooks=[(f"blocks.{first}.attn.{n}", probe(n)) for n in names]),
        attention_tap([attn] if attn is not None else [], called),
    ):
        model(toks, return_type=None, stop_at_layer=first + 1)
    result = tuple(fired)
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
