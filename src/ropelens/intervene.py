"""Running a model under a RoPE variant, and zeroing RoPE planes of its queries and keys.

``apply_rope_variant`` hands each chosen attention layer the variant's (cos, sin) tables through a
forward pre-hook and removes it on exit, so the model is bit-for-bit what it was; ``with_rope_variant``
is the same on a deep copy, for long runs. ``ablate_planes`` zeroes planes of the rotated queries and
keys, which removes their logit contribution (unlike NoPE/PlaneMask, which keep the planes but stop
rotating them).
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import functools
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch
from jaxtyping import Bool, Float
from torch import Tensor

from ropelens.errors import InputError, UnsupportedModelError
from ropelens.fastpath import intervened
from ropelens.hooks import attn_hooks
from ropelens.plan import AblationStep, VariantStep, model_tables, variant_tables
from ropelens.reading import rope_spec
from ropelens.rope import LayerRope, RopeSpec
from ropelens.sdpa import on_sdpa, planned, sdpa_ready
from ropelens.validate import check_indices
from ropelens.variants import RopeVariant

__all__ = ["ablate_planes", "add_lens_hook", "apply_rope_variant", "is_identity", "on_sdpa", "sdpa_ready",
           "spec_with_variant", "uses_engine", "with_rope_variant"]

# --------------------------------------------------------------------------------------------
# running a model under a variant
# --------------------------------------------------------------------------------------------
def _check_variant(variant: Any) -> RopeVariant:
    if not isinstance(variant, RopeVariant):
        raise TypeError(
            f"expected a RoPE variant such as ropelens.variants.PRoPE(0.75), got {type(variant).__name__}"
        )
    return variant


def spec_with_variant(
    spec: RopeSpec,
    variant: RopeVariant,
    layers: Sequence[int] | None = None,
    layer_kind: str | None = None,
) -> RopeSpec:
    """The spec a model has under ``variant`` in the chosen layers (frequencies at the original length)."""
    _check_variant(variant)
    chosen = set(spec.layer_indices(layers, layer_kind))
    new = []
    for lr in spec.layers:
        if lr.layer in chosen:
            lr = dataclasses.replace(
                lr,
                inv_freq=variant.inv_freq(lr),
                attention_scaling=variant.attention_scaling(lr),
                rope_type=variant.rope_type,
                rope_parameters=variant.to_dict(),
            )
        new.append(lr)
    return dataclasses.replace(spec, layers=tuple(new))


def _attention_with_tables(model, layers: Sequence[int], what: str) -> list[torch.nn.Module]:
    """Attention bridges of ``layers``, checking each receives (cos, sin) and fires the rotary hooks."""
    attns = [model.blocks[i].attn for i in layers]
    for i, attn in zip(layers, attns, strict=True):
        if not hasattr(attn, "hook_cos"):
            raise InputError(
                f"{what} needs attention that receives (cos, sin) position embeddings, as in Llama, "
                f"Gemma, Qwen or SmolLM; layer {i} is a {type(attn).__name__} "
                f"({type(attn.original_component).__name__}), which rotates inside the HF module "
                "and exposes neither its tables nor hook_rot_q/hook_rot_k"
            )
    return attns


def _swap_tables_hook(
    module: torch.nn.Module,  # noqa: ARG001 - torch's pre-hook signature
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    *,
    variant: RopeVariant,
    layer: LayerRope,
    scale: float,
    interleaved: bool,
    convention: dict[str, tuple[str, float, float]],
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
    new = variant_tables(variant, layer, position_ids, tables[0], layout, sign, scale)
    return args, {**kwargs, "position_embeddings": new}


def uses_engine(model, layers: Sequence[int], what: str) -> bool:
    """Whether ``what`` runs on the engine (:mod:`ropelens.engine`: at the rotation the HF forward calls) rather than
    on bridge hooks: a plain HF model, or a bridge whose attention in ``layers`` rotates inside the HF module (no
    (cos, sin) handed to it, no post-RoPE hooks). Raises UnsupportedModelError, with what was seen, where neither
    can reach the model's rotation."""
    from ropelens.plain import is_plain
    from ropelens.sdpa import engine_ready

    if not is_plain(model) and all(hasattr(model.blocks[i].attn, "hook_cos") for i in layers):
        return False
    why = engine_ready(model)
    if why is not None:
        raise UnsupportedModelError(f"{what} cannot reach this model's rotation: {why}")
    return True


def _install_variant(model, variant: RopeVariant, layers, layer_kind) -> tuple[RopeSpec, list[Any], list[int], bool]:
    """Register the per-layer table swap; returns the resulting spec, the hook handles, the layers and whether the
    engine applies it (no hooks then)."""
    _check_variant(variant)
    spec = rope_spec(model)  # NotRotaryError for models without RoPE
    chosen = spec.layer_indices(layers, layer_kind)
    new_spec = spec_with_variant(
        spec, variant, chosen
    )  # also validates the variant against each layer
    if uses_engine(model, chosen, "apply_rope_variant"):
        return new_spec, [], chosen, True
    attns = _attention_with_tables(model, chosen, "apply_rope_variant")
    interleaved = bool(getattr(model.cfg, "rotary_interleaved_cos_sin", False))
    handles = []
    for i, attn in zip(chosen, attns, strict=True):
        # The multiplier does not depend on the input, so it is computed once, not per forward.
        scale = new_spec[i].attention_scaling
        hook = functools.partial(
            _swap_tables_hook, variant=variant, layer=spec[i], scale=scale, interleaved=interleaved,
            convention={},
        )
        handles.append(attn.register_forward_pre_hook(hook, with_kwargs=True))
    return new_spec, handles, chosen, False


@contextlib.contextmanager
def apply_rope_variant(
    model, variant: RopeVariant, layers: Sequence[int] | None = None, layer_kind: str | None = None
) -> Iterator[RopeSpec]:
    """Run ``model`` with ``variant`` in the chosen layers (all by default); yields the spec it now has.

    Each chosen layer's attention receives the variant's (cos, sin) in place of the shared rotary
    module's, so ``hook_cos``/``hook_sin`` and everything after see the variant. The model's own
    rotary module, its buffers and its dynamic-update state are never touched; leaving the context
    (also on an exception) removes the hooks, so the model is exactly as before.
    """
    handles: list[Any] = []
    try:
        new_spec, handles, chosen, engine = _install_variant(model, variant, layers, layer_kind)
        # the fast q/k path would bypass the bridge hooks; the sdpa forward reads the plan instead
        with intervened(model), planned(model, VariantStep(variant, tuple(chosen), len(handles), engine)):
            yield new_spec
    finally:
        for h in handles:
            h.remove()


def is_identity(spec: RopeSpec, variant: RopeVariant, layers: Sequence[int], n_ctx: int) -> bool:
    """Whether ``variant`` leaves every one of ``layers`` rotating exactly as the model does, to the bit,
    for inputs of ``n_ctx`` tokens (p-RoPE with p = 1; dynamic NTK within the native context).

    Callers can then reuse the unmodified model's numbers instead of running it again; a variant
    that differs in the last bit is simply run.
    """
    positions = torch.arange(int(n_ctx))
    for i in layers:
        lr = spec[i]
        if variant.attention_scaling(lr) != lr.attention_scaling:
            return False
        if not torch.equal(variant.angles(lr, positions), positions[:, None].float() * lr.inv_freq.float()):
            return False
    return True


def with_rope_variant(
    model, variant: RopeVariant, layers: Sequence[int] | None = None, layer_kind: str | None = None
):
    """A deep copy of ``model`` that always runs ``variant`` (for long runs); ``model`` is untouched."""
    _check_variant(variant)
    chosen = rope_spec(model).layer_indices(layers, layer_kind)  # fail before copying
    out = copy.deepcopy(model)
    _, handles, _, engine = _install_variant(out, variant, chosen, None)
    intervened(out).__enter__()  # for good: the copy always runs the variant (bridge hooks, sdpa plan)
    planned(out, VariantStep(variant, tuple(chosen), len(handles), engine)).__enter__()
    out.ropelens_rope_variant = {"variant": variant.to_dict(), "layers": chosen}
    return out


# --------------------------------------------------------------------------------------------
# band ablation
# --------------------------------------------------------------------------------------------
def _head_mask(
    layer: LayerRope, planes: Sequence[int], heads: Sequence[int] | None, n: int, per_kv: bool
) -> Bool[Tensor, "head d_head"] | None:
    """Which (head, dim) entries to zero in q (``per_kv`` False) or k; None when nothing."""
    dims = layer.plane_dims[list(planes)].flatten()
    if heads is None:
        chosen = list(range(n))
    elif per_kv:
        # Zero a KV head only when every query head reading it is ablated: others must keep it.
        g = layer.group_size
        chosen = [kv for kv in range(n) if all(kv * g + j in heads for j in range(g))]
    else:
        chosen = list(heads)
    if not chosen or not len(dims):
        return None
    mask = torch.zeros(n, layer.head_dim, dtype=torch.bool)
    mask[torch.tensor(chosen)[:, None], dims[None, :]] = True
    return mask


def _zero_hook(x: Float[Tensor, "batch pos head d_head"], *, hook: Any, mask: Tensor,  # noqa: ARG001
               heads_first: bool = False) -> Tensor:
    """Zero the masked (head, dim) entries of queries or keys (``[batch, head, pos, d]`` if ``heads_first``)."""
    m = mask.to(x.device)
    return torch.where(m[:, None] if heads_first else m, torch.zeros((), dtype=x.dtype, device=x.device), x)


def add_lens_hook(hook_point: Any, fn: Callable[..., Any]) -> Callable[[], None]:
    """Add a TransformerLens hook that survives ``reset_hooks()``; returns its remover."""
    # Permanent, so run_with_hooks/reset_hooks inside the context leave it; prepended, so user
    # hooks on the same point see the ablated tensor.
    handle = hook_point.add_hook(fn, is_permanent=True, prepend=True)

    def remove() -> None:
        handle.hook.remove()
        hook_point.fwd_hooks = [h for h in hook_point.fwd_hooks if h is not handle]

    return remove


@contextlib.contextmanager
def ablate_planes(
    model,
    planes: Sequence[int] | Tensor | int,
    layers: Sequence[int] | None = None,
    heads: Sequence[int] | None = None,
    layer_kind: str | None = None,
) -> Iterator[None]:
    """Zero ``planes`` of the rotated q and k, removing their term from the attention logits.

    ``heads`` are query heads. With grouped-query attention a KV head is zeroed only when all the
    query heads sharing it are ablated; zeroing the query planes alone already removes the planes'
    term from those heads' logits, and leaves the other heads exactly as they were.
    """
    spec = rope_spec(model)
    chosen = spec.layer_indices(layers, layer_kind)
    plane_list = check_indices(planes, "plane")
    engine = uses_engine(model, chosen, "ablate_planes")
    if not engine:
        _attention_with_tables(model, chosen, "ablate_planes")  # the post-RoPE hooks fire there
    removers: list[Callable[[], None]] = []
    step_masks: dict[int, tuple[Tensor | None, Tensor | None]] = {}
    try:
        for i in chosen:
            lr = spec[i]
            check_indices(plane_list, "plane", lr.n_planes, f"layer {i}")
            head_set = None if heads is None else check_indices(heads, "head", lr.n_heads, f"layer {i}")
            names = None if engine else attn_hooks(model, i)
            qk = []
            for which, n, per_kv in (("q", lr.n_heads, False), ("k", lr.n_kv_heads, True)):
                mask = _head_mask(lr, plane_list, head_set, n, per_kv)
                qk.append(mask)
                if mask is None or names is None:
                    continue
                # Rotation maps a zero plane to zero, so where no post-RoPE hook fires (Phi-3, GPT-NeoX)
                # zeroing the plane before RoPE removes the same term.
                name = names.post(which) or names.pre(which)
                first = names.post(which) is None and names.pre_heads_first
                fn = functools.partial(_zero_hook, mask=mask, heads_first=first)
                removers.append(add_lens_hook(model.hook_dict[name], fn))
            step_masks[i] = (qk[0], qk[1])
        # the fast q/k path would bypass the ablation hooks; the sdpa forward reads the plan instead
        with intervened(model), planned(model, AblationStep(step_masks, len(removers), engine)):
            yield
    finally:
        for remove in removers:
            remove()
