"""RoPE variants and plane ablations on the HF model's own forward, with its sdpa attention.

The bridge applies :func:`ropelens.intervene.apply_rope_variant` and
:func:`ropelens.intervene.ablate_planes` through hooks on its eager attention, which builds
``[batch, heads, n, n]`` scores. Each of those contexts also records what it does on the model (a
*plan*). :func:`on_sdpa` runs the HF model the bridge wraps (:func:`ropelens.fastpath.hf_view`,
weights shared) with sdpa attention and applies the plan where the model rotates, at its family's
``apply_rotary_pos_emb``: the variant's (cos, sin) for the positions the model is at (key/value
cache included) replace the model's own, ablated planes of the rotated q and k are zeroed, and
replaced entries of the q and k entering the rotation (massive values) are written before it turns.
Memory stays linear in the length. Tables keep the layout and the sign convention of the model's
own tables, so a model that turns the other way (``LayerRope.direction`` −1) turns the other way
under a variant too.
"""

from __future__ import annotations

import contextlib
import importlib
from collections.abc import Iterator
from dataclasses import dataclass

import torch
from torch import Tensor

from ropelens.errors import UnsupportedModelError
from ropelens.fastpath import hf_view, sdpa_attention
from ropelens.rope import LayerRope, RopeSpec
from ropelens.variants import RopeVariant

__all__ = ["AblationStep", "ReplaceStep", "Step", "VariantStep", "active_plan", "engine_plan", "engine_ready", "model_tables", "on_sdpa", "planned", "sdpa_ready",
           "variant_tables"]

_PLAN = "_ropelens_sdpa_plan"
_READY = "_ropelens_sdpa_ready"
_MARK = "_ropelens_interventions"  # ropelens.fastpath.intervened's counter
_PROBE = 8  # tokens of the forward that checks a model can take this path
_DECIDE = 4  # positive positions the table convention is read from


@dataclass(frozen=True, eq=False)
class VariantStep:
    """A RoPE variant in ``layers``, applied on the bridge with ``n_hooks`` hooks."""

    variant: RopeVariant
    layers: tuple[int, ...]
    n_hooks: int
    engine: bool = False  # applied by the engine alone (:mod:`ropelens.engine`), no bridge hook


@dataclass(frozen=True, eq=False)
class AblationStep:
    """Zeroed ``[head, d_head]`` entries of the rotated q and k per layer (None: none), ``n_hooks`` bridge hooks."""

    masks: dict[int, tuple[Tensor | None, Tensor | None]]
    n_hooks: int
    engine: bool = False


@dataclass(frozen=True, eq=False)
class ReplaceStep:
    """Entries of the q and k entering the rotation set to fixed values per layer, ``n_hooks`` bridge hooks:
    ``{layer: {"q" or "k": (mask [head, d_head], value [head, d_head])}}``."""

    values: dict[int, dict[str, tuple[Tensor, Tensor]]]
    n_hooks: int
    engine: bool = False


Step = VariantStep | AblationStep | ReplaceStep


@contextlib.contextmanager
def planned(model, step: Step) -> Iterator[None]:
    """Record ``step`` in the model's plan while the block runs. A step the engine applies (``step.engine``) on a
    bridge also has every forward of the bridge run with the plan applied at the rotations its HF modules call."""
    object.__setattr__(model, _PLAN, (*active_plan(model), step))
    hooks = _bridge_engine(model) if step.engine and not _is_plain(model) else contextlib.nullcontext()
    try:
        with hooks:
            yield
    finally:
        object.__setattr__(model, _PLAN, tuple(s for s in active_plan(model) if s is not step))


def engine_plan(model) -> bool:
    """Whether a step in force on ``model`` is applied by the engine alone (no bridge hook applies it): captures and
    references then run the HF forward with the plan (a plain HF model's plan is always the engine's)."""
    return any(s.engine for s in active_plan(model))


def _is_plain(model) -> bool:
    from ropelens.plain import is_plain

    return is_plain(model)


_ENGINE_HOOKS = "_ropelens_engine_hooks"


@contextlib.contextmanager
def _bridge_engine(model) -> Iterator[None]:
    """While the block runs, every forward of bridge ``model`` applies its plan at the rotations the HF modules under it
    call (installed once however many engine steps nest)."""
    from ropelens.engine import rotation_plan
    from ropelens.reading import hf_model_of, rope_spec

    count = getattr(model, _ENGINE_HOOKS, None)
    if count is not None:
        object.__setattr__(model, _ENGINE_HOOKS, (count[0] + 1, count[1]))
    else:
        spec = rope_spec(model)
        attns = [getattr(getattr(b, "attn", None), "original_component", None) for b in model.blocks]
        stack: list[contextlib.ExitStack] = []

        def enter(*_: object) -> None:
            es = contextlib.ExitStack()
            es.enter_context(rotation_plan(hf_model_of(model), spec, active_plan(model), attns=attns))
            stack.append(es)

        def leave(*_: object) -> None:
            if stack:
                stack.pop().close()

        handles = [model.register_forward_pre_hook(enter), model.register_forward_hook(leave, always_call=True)]
        object.__setattr__(model, _ENGINE_HOOKS, (1, handles))
    try:
        yield
    finally:
        n, handles = getattr(model, _ENGINE_HOOKS)
        if n == 1:
            for h in handles:
                h.remove()
            object.__delattr__(model, _ENGINE_HOOKS)
        else:
            object.__setattr__(model, _ENGINE_HOOKS, (n - 1, handles))


def active_plan(model) -> tuple[Step, ...]:
    """The variants, ablations and replacements in force on ``model``, outermost first."""
    return getattr(model, _PLAN, ())


# --------------------------------------------------------------------------------------------
# tables
# --------------------------------------------------------------------------------------------
def _lay(x: Tensor, width: int, n: int, layout: str) -> Tensor:
    if width == n:
        return x
    return x.repeat_interleave(2, dim=-1) if layout == "interleaved" else torch.cat((x, x), dim=-1)


def model_tables(cos: Tensor, sin: Tensor, layer: LayerRope, position_ids: Tensor) -> tuple[str, float, float] | None:
    """How the model's own (cos, sin) for ``layer`` are laid out: ``(layout, sign, error)``.

    ``layout`` is ``"cat"`` (each frequency once per half, ``rotate_half``) or ``"interleaved"``
    (each twice in a row); ``sign`` is −1 where the model's sin is −sin(m·θ) (its tables turn the
    other way); ``error`` is the largest difference between the model's tables and the spec's
    rotation in that convention. Read at the first few positive positions of the first row; None
    when the input holds only position 0, where every convention gives the same tables.
    """
    pos = position_ids.reshape(-1, position_ids.shape[-1])[0]
    at = torch.nonzero(pos > 0).flatten()[:_DECIDE]
    if not at.numel():
        return None
    c = cos.reshape(-1, *cos.shape[-2:])[0, at].float()
    s = sin.reshape(-1, *sin.shape[-2:])[0, at].float()
    ang = pos[at].float()[:, None] * layer.inv_freq.to(pos.device)
    best = None
    for layout in ("cat", "interleaved"):
        want_c = _lay(ang.cos() * layer.attention_scaling, c.shape[-1], layer.n_planes, layout)
        want_s = _lay(ang.sin() * layer.attention_scaling, c.shape[-1], layer.n_planes, layout)
        if want_c.shape != c.shape:
            return None
        for sign in (1.0, -1.0):
            err = float(torch.maximum((c - want_c).abs().max(), (s - sign * want_s).abs().max()))
            if best is None or err < best[2]:
                best = (layout, sign, err)
    return best


def _angles(variant: RopeVariant, layer: LayerRope, position_ids: Tensor) -> Tensor:
    """The variant's angle of each plane at ``position_ids`` ``[..., pos, plane]``; multimodal position ids
    ``[axis, batch, pos]`` (M-RoPE) turn each plane by its own axis's position (:attr:`LayerRope.axes`; a layer read
    without axes, text alone, by the first)."""
    if position_ids.ndim == 3 and position_ids.shape[0] in (3, 4):
        if not layer.axes:
            return variant.angles(layer, position_ids[0])
        per = torch.stack([variant.angles(layer, position_ids[a]) for a in range(position_ids.shape[0])])
        idx = torch.tensor(layer.axes, device=per.device).view(1, 1, 1, -1).expand(1, *per.shape[1:])
        return per.gather(0, idx)[0]
    return variant.angles(layer, position_ids)


def variant_tables(variant: RopeVariant, layer: LayerRope, position_ids: Tensor, like: Tensor, layout: str,
                   sign: float, scale: float | None = None) -> tuple[Tensor, Tensor]:
    """The variant's (cos, sin) for ``layer`` at ``position_ids``, in the layout, sign and dtype of the model's
    table ``like``, with the ops of HF's rotary forward (so an identity variant gives the model's tables to the bit)."""
    with torch.no_grad():
        ang = _lay(_angles(variant, layer, position_ids.to(like.device)), like.shape[-1], layer.n_planes, layout)
        if ang.shape[-1] != like.shape[-1]:
            raise UnsupportedModelError(
                f"layer {layer.layer}: the model's cos table is {like.shape[-1]} wide but the spec has "
                f"{layer.n_planes} planes; the spec does not describe this model")
        scale = variant.attention_scaling(layer) if scale is None else scale
        cos, sin = ang.cos() * scale, ang.sin() * scale
        return cos.to(like.dtype), (sin if sign > 0 else -sin).to(like.dtype)


# --------------------------------------------------------------------------------------------
# the tap
# --------------------------------------------------------------------------------------------
def _group_key(lr: LayerRope) -> tuple:
    """Layers with equal keys get equal tables from any variant."""
    return (lr.rotary_dim, lr.pairing, lr.attention_scaling, lr.base, lr.n_ctx, lr.kind, lr.window,
            tuple(lr.inv_freq.tolist()), tuple(sorted(map(str, lr.rope_parameters.items()))))


@contextlib.contextmanager
def _tapped(hf, spec: RopeSpec, plan: tuple) -> Iterator[None]:
    """Apply ``plan`` inside ``hf``'s forward, at the rotation it calls (:func:`ropelens.engine.rotation_plan`)."""
    from ropelens.engine import rotation_plan

    with rotation_plan(hf, spec, plan):
        yield


def _replace(x: Tensor, entry: tuple[Tensor, Tensor] | None) -> Tensor:
    """``x`` ``[batch, head, pos, d_head]`` with the masked (head, dim) entries set to their values at every position."""
    if entry is None:
        return x
    mask, value = entry
    return torch.where(mask.to(x.device)[:, None], value.to(x.device, x.dtype)[:, None], x)


# --------------------------------------------------------------------------------------------
# readiness and the public context
# --------------------------------------------------------------------------------------------
def _n_hooks(model) -> int:
    """TransformerLens hooks on the bridge's hook points, and forward hooks on its attention layers
    (where variants sit); the bridge's own internal hooks are elsewhere."""
    unique = {id(h): h for h in model.hook_dict.values()}.values()  # aliases name one hook point twice
    points = sum(len(getattr(h, "fwd_hooks", ())) + len(getattr(h, "bwd_hooks", ())) for h in unique)
    attns = [getattr(b, "attn", None) for b in model.blocks]
    return points + sum(len(a._forward_pre_hooks) + len(a._forward_hooks) for a in attns if a is not None)


def _probe(model, spec: RopeSpec) -> str | None:
    """Why ``model`` cannot take this path (None: it can): one short forward with its rotations recorded."""
    from ropelens.engine import engine_problem

    return engine_problem(hf_view(model), spec)


def engine_ready(model) -> str | None:
    """Why the engine cannot apply interventions to ``model`` (None: it can), checked once per modeling functions
    on a short forward (:func:`ropelens.engine.engine_problem`)."""
    from ropelens.engine import rotation_forms

    mod = importlib.import_module(type(hf_view(model)).__module__)
    key = (tuple(id(f) for f, _ in rotation_forms(mod).values()), id(getattr(mod, "rotate_half", None)))
    cached = getattr(model, _READY, None)
    if cached is None or cached[0] != key:
        from ropelens.reading import rope_spec

        cached = (key, _probe(model, rope_spec(model)))
        object.__setattr__(model, _READY, cached)
    return cached[1]


def sdpa_ready(model) -> bool:
    """Whether ``model``'s forward, with every intervention in force, can run as the HF model with sdpa.

    True for a bridge whose family rotates at a tappable ``apply_rotary_pos_emb`` (checked once on a
    short forward, including that the model's own tables are the spec's rotation), when every active
    intervention is a RoPE variant, a plane ablation or a massive-value replacement and no other hook
    is on the bridge.
    """
    from ropelens.plain import is_plain

    plain = is_plain(model)
    if not (hasattr(model, "original_model") and (plain or hasattr(model, "blocks"))):
        return False
    plan = active_plan(model)
    if getattr(model, _MARK, 0) != len(plan) or (not plain and _n_hooks(model) != sum(s.n_hooks for s in plan)):
        return False
    return engine_ready(model) is None


@contextlib.contextmanager
def on_sdpa(model) -> Iterator[torch.nn.Module]:
    """The HF causal LM under ``model`` running with sdpa attention and every RoPE variant, plane
    ablation and massive-value replacement in force on ``model`` (``apply_rope_variant``,
    ``ablate_planes``, :func:`ropelens.analyses.massive.replace_massive`) applied in its forward.

    Call it as an HF model (``hf(input_ids=..., past_key_values=..., use_cache=True)``); generation
    with its key/value cache rotates each new token at its own position. Raises
    :class:`UnsupportedModelError` where :func:`sdpa_ready` is False (another hook or intervention is
    in force, or the family rotates elsewhere): run the bridge then.
    """
    if not sdpa_ready(model):
        why = getattr(model, _READY, (None, None))[1]
        raise UnsupportedModelError(
            f"this model cannot run its interventions on the HF sdpa forward ({why or 'a hook or intervention other than a RoPE variant or plane ablation is in force'}): "
            "run it through the bridge")
    from ropelens.reading import rope_spec

    hf = hf_view(model)
    with _tapped(hf, rope_spec(model), active_plan(model)), sdpa_attention(hf):
        yield hf
