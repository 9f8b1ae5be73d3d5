"""RoPE variants, plane ablations and massive-value replacement through the TransformerLens bridge's
hooks.

Where a bridge's attention receives (cos, sin) and fires post-RoPE hooks, an intervention is applied
there, so the bridge's own hook points (``hook_cos``, ``hook_rot_q``, ...) see it; everywhere else
the engine applies it at the rotation the HF forward calls (:mod:`ropelens.backends.engine`).
:class:`ropelens.backends.base.BridgeBackend` chooses; these functions install the hooks and return
their removers.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import Tensor

from ropelens.backends.bridge_hooks import attn_hooks
from ropelens.errors import InputError, UnsupportedModelError
from ropelens.spec.plan import model_tables, variant_tables
from ropelens.spec.reading import hf_model_of
from ropelens.spec.rope import LayerRope, RopeSpec
from ropelens.spec.rotary_state import frequency_dtype, rotary_modules
from ropelens.spec.variants import RopeVariant

__all__ = [
    "add_lens_hook",
    "attention_with_tables",
    "install_ablation",
    "install_replacement",
    "install_variant",
]


def attention_with_tables(model, layers: Sequence[int], what: str) -> list[torch.nn.Module]:
    """Attention bridges of ``layers``, checking each receives (cos, sin) and fires the rotary
    hooks."""
    attns = [model.blocks[i].attn for i in layers]
    for i, attn in zip(layers, attns, strict=True):
        if not hasattr(attn, "hook_cos"):
            raise InputError(
                f"{what} needs attention that receives (cos, sin) position embeddings, as in "
                f"Llama, Gemma, Qwen or SmolLM; layer {i} is a {type(attn).__name__} "
                f"({type(attn.original_component).__name__}), which rotates inside the HF module "
                "and exposes neither its tables nor hook_rot_q/hook_rot_k"
            )
    return attns


def _swap_tables_hook(
    module: torch.nn.Module,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    *,
    variant: RopeVariant,
    layer: LayerRope,
    scale: float,
    interleaved: bool,
    convention: dict[str, tuple[str, float, float]],
    freq_dtype: torch.dtype | None = None,
) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """Forward pre-hook: replace the (cos, sin) this attention layer receives with the variant's.

    The variant's tables take the layout and sign of the model's own (read once, from the first
    input past position 0), so a model whose tables turn the other way (``direction`` −1) turns the
    other way under the variant too.
    """
    tables, position_ids = kwargs.get("position_embeddings"), kwargs.get("position_ids")
    if not isinstance(tables, tuple) or len(tables) != 2 or position_ids is None:
        raise UnsupportedModelError(
            f"layer {layer.layer}: attention was called without (cos, sin) position_embeddings and "
            "position_ids keyword arguments, so the RoPE variant cannot be applied to this model"
        )
    if "read" not in convention:
        got = model_tables(tables[0], tables[1], layer, position_ids)
        if got is not None:
            convention["read"] = got
    layout, sign = convention.get("read", ("interleaved" if interleaved else "cat", 1.0, 0.0))[:2]
    new = variant_tables(variant, layer, position_ids, tables[0], layout, sign, scale, freq_dtype)
    return args, {**kwargs, "position_embeddings": new}


def _zero_hook(
    x: Tensor,
    *,
    hook: Any,
    mask: Tensor,
    heads_first: bool = False,
) -> Tensor:
    """Zero the masked (head, dim) entries of queries or keys (``[batch, head, pos, d]`` if
    ``heads_first``); a ``[batch, head, d]`` mask holds one mask per batch row."""
    m = mask.to(x.device)
    if m.ndim == 3:
        if m.shape[0] != x.shape[0]:
            raise UnsupportedModelError(
                f"a per-row plane ablation holds {m.shape[0]} rows but the batch has "
                f"{x.shape[0]}: run a batch of as many rows as masks"
            )
        m = m[:, :, None] if heads_first else m[:, None]
    elif heads_first:
        m = m[:, None]
    return torch.where(m, torch.zeros((), dtype=x.dtype, device=x.device), x)


def add_lens_hook(
    hook_point: Any, fn: Callable[..., Any], *, prepend: bool = True
) -> Callable[[], None]:
    """Add a TransformerLens hook that survives ``reset_hooks()``; returns its remover."""
    # Permanent, so run_with_hooks/reset_hooks inside the context leave it; prepended (by
    # default), so user hooks on the same point see the changed tensor.
    handle = hook_point.add_hook(fn, is_permanent=True, prepend=prepend)

    def remove() -> None:
        handle.hook.remove()
        hook_point.fwd_hooks = [h for h in hook_point.fwd_hooks if h is not handle]

    return remove


def _replace_hook(
    x: Tensor, *, hook: Any, mask: Tensor, value: Tensor, heads_first: bool
) -> Tensor:
    """Write ``value`` into the masked (head, dim) entries of a pre-RoPE q or k at every
    position."""
    flat = x.ndim == 3
    y = x.unflatten(-1, (mask.shape[0], mask.shape[1])) if flat else x
    m, v = mask.to(y.device), value.to(y.device, y.dtype)
    if heads_first:  # [b, head, pos, d]
        m, v = m[:, None], v[:, None]
    out = torch.where(m, v, y)
    return out.flatten(-2) if flat else out


def install_variant(
    model, spec: RopeSpec, new_spec: RopeSpec, variant: RopeVariant, layers: Sequence[int]
) -> list[Any]:
    """Hand each of ``layers``' attention the variant's (cos, sin) through a forward pre-hook; the
    hook handles."""
    attns = attention_with_tables(model, layers, "apply_rope_variant")
    interleaved = bool(getattr(model.cfg, "rotary_interleaved_cos_sin", False))
    freq_dtype = frequency_dtype(rotary_modules(hf_model_of(model)))
    handles = []
    for i, attn in zip(layers, attns, strict=True):
        # The multiplier does not depend on the input, so it is computed once, not per forward.
        hook = functools.partial(
            _swap_tables_hook,
            variant=variant,
            layer=spec[i],
            scale=new_spec[i].attention_scaling,
            interleaved=interleaved,
            convention={},
            freq_dtype=freq_dtype,
        )
        handles.append(attn.register_forward_pre_hook(hook, with_kwargs=True))
    return handles


PRE_ROPE_ABLATION = "ropelens_pre_rope_ablation"  # attribute of a hook point zeroed before RoPE


class PreRopeAblation:
    """The plane ablations of one pre-RoPE hook point, on a bridge whose attention fires no hook
    after its rotation (GPT-NeoX, Phi-3): rotation maps a zero plane to zero, so zeroing the plane
    before RoPE removes the same term from the scores. One hook applies every ablation in force
    there, after the hooks that write the pre-RoPE tensor (a massive-value replacement), and first
    hands that tensor to its observers: the pre-RoPE q or k an analysis reads is the model's own,
    as on a family with a hook after the rotation, while the rotation sees the plane zeroed."""

    def __init__(self, hook_point: Any, heads_first: bool) -> None:
        self.hook_point, self.heads_first = hook_point, heads_first
        self.masks: list[Tensor] = []
        self.observers: list[Callable[[Tensor], None]] = []
        self._remove_hook: Callable[[], None] | None = None

    def __call__(self, x: Tensor, *, hook: Any) -> Tensor:
        for observe in self.observers:
            observe(x)
        for mask in self.masks:
            x = _zero_hook(x, hook=hook, mask=mask, heads_first=self.heads_first)
        return x

    @classmethod
    def add(cls, hook_point: Any, mask: Tensor, heads_first: bool) -> Callable[[], None]:
        """Zero ``mask`` at ``hook_point`` (the point's one ablation hook, made on first use);
        returns the remover of this mask alone."""
        state = getattr(hook_point, PRE_ROPE_ABLATION, None)
        if state is None:
            state = cls(hook_point, heads_first)
            # appended: hooks already there (and replacements, which are prepended) run first
            state._remove_hook = add_lens_hook(hook_point, state, prepend=False)
            setattr(hook_point, PRE_ROPE_ABLATION, state)
        state.masks.append(mask)

        def remove() -> None:
            state.masks = [m for m in state.masks if m is not mask]
            if not state.masks and state._remove_hook is not None:
                state._remove_hook()
                state._remove_hook = None
                if getattr(hook_point, PRE_ROPE_ABLATION, None) is state:
                    delattr(hook_point, PRE_ROPE_ABLATION)

        return remove


def install_ablation(
    model, masks: dict[int, tuple[Tensor | None, Tensor | None]]
) -> list[Callable[[], None]]:
    """Zero the masked (head, dim) entries of each layer's rotated q and k (``masks[layer] = (q,
    k)``); removers."""
    attention_with_tables(model, list(masks), "ablate_planes")  # the post-RoPE hooks fire there
    removers: list[Callable[[], None]] = []
    for i, qk in masks.items():
        names = attn_hooks(model, i)
        for which, mask in zip("qk", qk, strict=True):
            if mask is None:
                continue
            post = names.post(which)
            if post is None:  # zeroed before the rotation, the pre-RoPE tensor still read whole
                point = model.hook_dict[names.pre(which)]
                removers.append(PreRopeAblation.add(point, mask, names.pre_heads_first))
                continue
            fn = functools.partial(_zero_hook, mask=mask, heads_first=False)
            removers.append(add_lens_hook(model.hook_dict[post], fn))
    return removers


def install_replacement(
    model, step: dict[int, dict[str, tuple[Tensor, Tensor]]]
) -> list[Callable[[], None]]:
    """Write ``value`` into the masked entries of each layer's pre-RoPE q and k (``step[layer][w] =
    (mask, value)``) at their pre-RoPE hook points; removers."""
    removers: list[Callable[[], None]] = []
    for L, parts in step.items():
        names = attn_hooks(model, L)
        for w, (mask, value) in parts.items():
            fn = functools.partial(
                _replace_hook, mask=mask, value=value, heads_first=names.pre_heads_first
            )
            removers.append(add_lens_hook(model.hook_dict[names.pre(w)], fn))
    return removers
