"""Running a model under a RoPE variant, and zeroing RoPE planes of its queries and keys.

``apply_rope_variant`` hands each chosen attention layer the variant's (cos, sin) tables through a
forward pre-hook and removes it on exit, so the model is bit-for-bit what it was;
``with_rope_variant`` is the same on a deep copy, for long runs. ``ablate_planes`` zeroes planes of
the rotated queries and keys, which removes their logit contribution (unlike NoPE/PlaneMask, which
keep the planes but stop rotating them).
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch
from jaxtyping import Bool
from torch import Tensor

from ropelens.backends import backend_of
from ropelens.backends.bridge_interventions import add_lens_hook
from ropelens.backends.sdpa import on_sdpa, planned, sdpa_ready
from ropelens.backends.sdpa_capture import intervened
from ropelens.errors import InputError
from ropelens.spec.plan import AblationStep, VariantStep, active_plan, layer_with_variant
from ropelens.spec.reading import unmodified_spec
from ropelens.spec.rope import LayerRope, RopeSpec
from ropelens.spec.surface import running_model
from ropelens.spec.variants import RopeVariant, check_variant
from ropelens.validate import check_indices

__all__ = [
    "ablate_planes",
    "add_lens_hook",
    "apply_rope_variant",
    "is_identity",
    "on_sdpa",
    "sdpa_ready",
    "spec_with_variant",
    "uses_engine",
    "with_rope_variant",
    "zeroed_entries",
]


_HELD = "_ropelens_variant_contexts"  # where a copy from with_rope_variant keeps its contexts


# --------------------------------------------------------------------------------------------
# running a model under a variant
# --------------------------------------------------------------------------------------------
def spec_with_variant(
    spec: RopeSpec,
    variant: RopeVariant,
    layers: Sequence[int] | None = None,
    layer_kind: str | None = None,
) -> RopeSpec:
    """The spec a model has under ``variant`` in the chosen layers (frequencies at the original
    length)."""
    check_variant(variant)
    chosen = set(spec.layer_indices(layers, layer_kind))
    new = [layer_with_variant(lr, variant) if lr.layer in chosen else lr for lr in spec.layers]
    return dataclasses.replace(spec, layers=tuple(new))


def uses_engine(model, layers: Sequence[int], what: str) -> bool:
    """Whether ``what`` runs on the engine (:mod:`ropelens.backends.engine`: at the rotation the HF
    forward calls) rather than on bridge hooks: a plain HF model, or a bridge whose attention in
    ``layers`` rotates inside the HF module (no (cos, sin) handed to it, no post-RoPE hooks). Raises
    UnsupportedModelError, with what was seen, where neither can reach the model's rotation."""
    return backend_of(model).uses_engine(layers, what)


def _install_variant(
    model, variant: RopeVariant, layers, layer_kind
) -> tuple[RopeSpec, list[Any], list[int], bool]:
    """Install the variant where the model's backend applies it; returns the resulting spec, the
    removers of any hooks, the layers and whether the engine applies it (no hooks then)."""
    check_variant(variant)
    spec = unmodified_spec(model)  # NotRotaryError for models without RoPE
    chosen = spec.layer_indices(layers, layer_kind)
    new_spec = spec_with_variant(
        spec, variant, chosen
    )  # also validates the variant against each layer
    removers, engine = backend_of(model).variant_hooks(spec, new_spec, variant, chosen)
    return new_spec, removers, chosen, engine


@contextlib.contextmanager
def apply_rope_variant(
    model, variant: RopeVariant, layers: Sequence[int] | None = None, layer_kind: str | None = None
) -> Iterator[RopeSpec]:
    """Run ``model`` with ``variant`` in the chosen layers (all by default); yields the spec it now
    has.

    Each chosen layer's attention receives the variant's (cos, sin) in place of the shared rotary
    module's, so ``hook_cos``/``hook_sin`` and everything after see the variant. The model's own
    rotary module, its buffers and its dynamic-update state are never touched; leaving the context
    (also on an exception) removes the hooks, so the model is exactly as before.

    Args:
        model: A model from :func:`ropelens.load_model` (or an nnsight model wrapping one).
        variant (RopeVariant): What to rotate by instead, from :mod:`ropelens.spec.variants`
            (``PRoPE(p)``: stop the lowest fraction 1 − p of planes, Barbero et al.; ``NoPE()``;
            ``PlaneMask``; the context-extension methods: position interpolation, NTK, YaRN, ...).
        layers (Sequence[int] | None): Layers to change; None: every rotary layer (of
            ``layer_kind``).
        layer_kind (str | None): Only layers of this kind (``"sliding"``, ``"full"``); None: any.

    Yields:
        RopeSpec: The spec the model has inside the block (the variant's frequencies in the
        chosen layers; :func:`ropelens.rope_spec` reads the same there).

    Raises:
        TypeError: When ``variant`` is not a RoPE variant (a class such as ``PRoPE``, not
            instantiated, is named with how to instantiate it).
        InputError: When ``layers`` or ``layer_kind`` choose no rotary layer, or the variant does
            not fit a chosen layer.
        NotRotaryError: When the model has no RoPE.

    Examples:
        >>> import torch
        >>> from ropelens import apply_rope_variant
        >>> from ropelens.spec.variants import NoPE
        >>> from ropelens.testing import tiny_model
        >>> model = tiny_model("llama")
        >>> tokens = model.to_tokens("The cat sat on the mat.")
        >>> before = model(tokens)
        >>> with apply_rope_variant(model, NoPE(), layers=[1]) as spec:
        ...     print(spec[1].stopped_planes.tolist(), spec[0].stopped_planes.tolist())
        ...     inside = model(tokens)
        [0, 1, 2, 3, 4, 5, 6, 7] []
        >>> torch.allclose(inside, before)  # layer 1 without rotation changes the logits
        False
        >>> torch.equal(model(tokens), before)  # and leaving restores the model bit for bit
        True
    """
    model = running_model(model)  # an nnsight model: the HF model it wraps
    removers: list[Callable[[], None]] = []
    try:
        new_spec, removers, chosen, engine = _install_variant(model, variant, layers, layer_kind)
        # the fast q/k path would bypass the bridge hooks; the sdpa forward reads the plan instead
        with (
            intervened(model),
            planned(model, VariantStep(variant, tuple(chosen), len(removers), engine)),
        ):
            yield new_spec
    finally:
        for remove in removers:
            remove()


def is_identity(spec: RopeSpec, variant: RopeVariant, layers: Sequence[int], n_ctx: int) -> bool:
    """Whether ``variant`` leaves every one of ``layers`` rotating exactly as the model does, to the
    bit, for inputs of ``n_ctx`` tokens (p-RoPE with p = 1; dynamic NTK within the native context).

    Callers can then reuse the unmodified model's numbers instead of running it again; a variant
    that differs in the last bit is simply run.
    """
    positions = torch.arange(int(n_ctx))
    for i in layers:
        lr = spec[i]
        if variant.attention_scaling(lr) != lr.attention_scaling:
            return False
        if not torch.equal(
            variant.angles(lr, positions), positions[:, None].float() * lr.inv_freq.float()
        ):
            return False
    return True


def with_rope_variant(
    model,
    variant: RopeVariant,
    layers: Sequence[int] | None = None,
    layer_kind: str | None = None,
    *,
    in_place: bool = False,
):
    """A deep copy of ``model`` that always runs ``variant`` (for long runs); ``model`` is
    untouched.

    The same hooks as :func:`apply_rope_variant`, held for as long as the copy lives, so every
    analysis run on the copy measures the model under the variant (and records it in its
    provenance). ``in_place``: install the variant on ``model`` itself, for good, and return it
    (what the command line's ``--variant`` does: no second copy of the weights).

    Args:
        model: A model from :func:`ropelens.load_model` (or an nnsight model wrapping one).
        variant (RopeVariant): The variant to run, from :mod:`ropelens.spec.variants`.
        layers (Sequence[int] | None): Layers to change; None: every rotary layer (of
            ``layer_kind``).
        layer_kind (str | None): Only layers of this kind (``"sliding"``, ``"full"``); None: any.
        in_place (bool): Change ``model`` itself instead of a copy (default False).

    Returns:
        The copy (or, with ``in_place``, ``model``) running ``variant``; its
        ``ropelens_rope_variant`` attribute records the variant and layers.

    Raises:
        TypeError: When ``variant`` is not a RoPE variant (a class such as ``PRoPE``, not
            instantiated, is named with how to instantiate it).
        InputError: When ``layers`` or ``layer_kind`` choose no rotary layer, the variant does
            not fit a chosen layer, or ``in_place`` is asked of a model already under an
            intervention.

    Examples:
        >>> from ropelens import rope_spec, with_rope_variant
        >>> from ropelens.spec.variants import NoPE, PRoPE
        >>> from ropelens.testing import tiny_model
        >>> model = tiny_model("llama")
        >>> half = with_rope_variant(model, PRoPE(0.5))  # the lowest half of the planes stopped
        >>> rope_spec(half)[0].stopped_planes.tolist(), rope_spec(model)[0].stopped_planes.tolist()
        ([4, 5, 6, 7], [])
        >>> with_rope_variant(half, NoPE(), in_place=True)
        Traceback (most recent call last):
        ...
        ropelens.errors.InputError: with_rope_variant(in_place=True): the model already runs ...
    """
    model = running_model(model)  # an nnsight model: the HF model it wraps
    check_variant(variant)
    chosen = unmodified_spec(model).layer_indices(layers, layer_kind)  # fail before copying
    if in_place and active_plan(model):
        raise InputError(
            "with_rope_variant(in_place=True): the model already runs under an intervention "
            f"({', '.join(type(s).__name__ for s in active_plan(model))}); install one variant "
            "on a model as loaded"
        )
    out = model if in_place else copy.deepcopy(model)
    _, handles, _, engine = _install_variant(out, variant, chosen, None)
    # for good: the copy always runs the variant (bridge hooks, sdpa plan). The contexts stay
    # entered as long as the copy holds them: a context manager dropped after __enter__ would be
    # closed by the garbage collector, taking the plan with it.
    held = contextlib.ExitStack()
    held.enter_context(intervened(out))
    held.enter_context(planned(out, VariantStep(variant, tuple(chosen), len(handles), engine)))
    object.__setattr__(out, _HELD, held)
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

    The planes are zeroed where the rotation leaves them. In a layer that normalises q and k after
    RoPE (HunYuan dense, NanoChat, Llama 4: ``LayerRope.norm_after_rope``) the norm then sees them
    zeroed and rescales the other planes, as the model would run with those planes absent from its
    rotation's output; the logits of the other planes move too (by up to 0.3 of the largest score
    on the tiny test models), so such an ablation is not the removal of one term from an unchanged
    score.

    Unlike a NoPE or ``PlaneMask`` variant, which keep a plane's content but stop rotating it, an
    ablation removes the plane's contribution altogether: the knockout analyses
    (:func:`ropelens.analyses.knockout`) measure what that costs. Leaving the block (also on an
    exception) removes the hooks.

    Args:
        model: A model from :func:`ropelens.load_model` (or an nnsight model wrapping one).
        planes (Sequence[int] | Tensor | int): Plane indices to zero (0 is the highest
            frequency).
        layers (Sequence[int] | None): Layers to ablate in; None: every rotary layer (of
            ``layer_kind``).
        heads (Sequence[int] | None): Query heads to ablate in; None: every head.
        layer_kind (str | None): Only layers of this kind (``"sliding"``, ``"full"``); None: any.

    Yields:
        None: The model runs ablated inside the block; :func:`ropelens.rope_spec` there lists the
        zeroed planes per query head (:attr:`LayerRope.ablated`).

    Raises:
        InputError: When a plane or head index is out of range in a chosen layer, or ``layers``
            or ``layer_kind`` choose no rotary layer.

    Examples:
        >>> import torch
        >>> from ropelens import ablate_planes, capture_qk, rope_spec
        >>> from ropelens.testing import tiny_model
        >>> model = tiny_model("llama")
        >>> tokens = model.to_tokens("The cat sat on the mat.")
        >>> with ablate_planes(model, [0], layers=[0], heads=[1]):
        ...     print(rope_spec(model)[0].ablated)  # plane 0 of query head 1
        ...     acts = capture_qk(model, tokens, layers=[0], which=("q_post",))
        ((), (0,), (), ())
        >>> plane0 = acts[0].rope.plane_norms(acts[0]["q_post"][0])[..., 0]  # [pos, head]
        >>> [bool(n) for n in plane0.amax(0)]  # zero in head 1 only, at every position
        [True, False, True, True]
    """
    model = running_model(model)  # an nnsight model: the HF model it wraps
    spec = unmodified_spec(model)
    chosen = spec.layer_indices(layers, layer_kind)
    plane_list = check_indices(planes, "plane")

    step_masks: dict[int, tuple[Tensor | None, Tensor | None]] = {}
    for i in chosen:
        lr = spec[i]
        check_indices(plane_list, "plane", lr.n_planes, f"layer {i}")
        head_set = None if heads is None else check_indices(heads, "head", lr.n_heads, f"layer {i}")
        qk = [
            _head_mask(lr, plane_list, head_set, n, per_kv)
            for n, per_kv in ((lr.n_heads, False), (lr.n_kv_heads, True))
        ]
        step_masks[i] = (qk[0], qk[1])
    with zeroed_entries(model, step_masks):
        yield


@contextlib.contextmanager
def zeroed_entries(model, masks: dict[int, tuple[Tensor | None, Tensor | None]]) -> Iterator[None]:
    """Zero the masked entries of the rotated q and k per layer while the block runs: ``{layer:
    (q mask, k mask)}``, each ``[head, d_head]`` (or ``[row, head, d_head]``: one mask per batch
    row of every forward), None for none. What :func:`ablate_planes` and the knockouts install."""
    removers: list[Callable[[], None]] = []
    try:
        removers, engine = backend_of(model).ablation_hooks(masks)
        # the fast q/k path would bypass the ablation hooks; the sdpa forward reads the plan instead
        with intervened(model), planned(model, AblationStep(masks, len(removers), engine)):
            yield
    finally:
        for remove in removers:
            remove()
