"""RoPE variants and plane ablations on the HF model's own forward, with its sdpa attention.

The bridge applies :func:`ropelens.run.intervene.apply_rope_variant` and
:func:`ropelens.run.intervene.ablate_planes` through hooks on its eager attention, which builds
``[batch, heads, n, n]`` scores. Each of those contexts also records what it does on the model (a
*plan*). :func:`on_sdpa` runs the HF model the bridge wraps
(:func:`ropelens.backends.sdpa_capture.hf_view`, weights shared) with sdpa attention and applies the
plan where the model rotates, at its family's ``apply_rotary_pos_emb``: the variant's (cos, sin) for
the positions the model is at (key/value cache included) replace the model's own, ablated planes of
the rotated q and k are zeroed, and replaced entries of the q and k entering the rotation (massive
values) are written before it turns. Memory stays linear in the length. Tables keep the layout and
the sign convention of the model's own tables, so a model that turns the other way
(``LayerRope.direction`` −1) turns the other way under a variant too.
"""

from __future__ import annotations

import contextlib
import importlib
from collections.abc import Iterator

import torch

from ropelens.backends.engine import engine_problem, rotation_forms, rotation_plan
from ropelens.backends.hf import attention_modules, is_plain
from ropelens.backends.sdpa_capture import hf_view, sdpa_attention
from ropelens.backends.serials import object_serial
from ropelens.errors import UnsupportedModelError
from ropelens.spec.plan import (
    PLAN_ATTR,
    AblationStep,
    ReplaceStep,
    Step,
    VariantStep,
    active_plan,
    model_tables,
    variant_tables,
)
from ropelens.spec.reading import hf_model_of, unmodified_spec
from ropelens.spec.rope import RopeSpec

__all__ = [
    "AblationStep",
    "ReplaceStep",
    "Step",
    "VariantStep",
    "active_plan",
    "engine_plan",
    "engine_ready",
    "model_tables",
    "on_sdpa",
    "planned",
    "sdpa_ready",
    "variant_tables",
]

_READY = "_ropelens_sdpa_ready"
_MARK = "_ropelens_interventions"  # ropelens.backends.sdpa_capture.intervened's counter
_PROBE = 8  # tokens of the forward that checks a model can take this path


@contextlib.contextmanager
def planned(model, step: Step) -> Iterator[None]:
    """Record ``step`` in the model's plan while the block runs. A step the engine applies
    (``step.engine``) on a bridge also has every forward of the bridge run with the plan applied at
    the rotations its HF modules call."""
    object.__setattr__(model, PLAN_ATTR, (*active_plan(model), step))
    hooks = (
        _bridge_engine(model) if step.engine and not _is_plain(model) else contextlib.nullcontext()
    )
    try:
        with hooks:
            yield
    finally:
        object.__setattr__(model, PLAN_ATTR, tuple(s for s in active_plan(model) if s is not step))


def engine_plan(model) -> bool:
    """Whether a step in force on ``model`` is applied by the engine alone (no bridge hook applies
    it): captures and references then run the HF forward with the plan (a plain HF model's plan is
    always the engine's)."""
    return any(s.engine for s in active_plan(model))


def _is_plain(model) -> bool:
    return is_plain(model)


_ENGINE_HOOKS = "_ropelens_engine_hooks"


@contextlib.contextmanager
def _bridge_engine(model) -> Iterator[None]:
    """While the block runs, every forward of bridge ``model`` applies its plan at the rotations the
    HF modules under it call (installed once however many engine steps nest)."""
    count = getattr(model, _ENGINE_HOOKS, None)
    if count is not None:
        object.__setattr__(model, _ENGINE_HOOKS, (count[0] + 1, count[1]))
    else:
        spec = unmodified_spec(model)
        attns = [
            getattr(getattr(b, "attn", None), "original_component", None) for b in model.blocks
        ]
        stack: list[contextlib.ExitStack] = []

        def enter(*_: object) -> None:
            es = contextlib.ExitStack()
            es.enter_context(
                rotation_plan(hf_model_of(model), spec, active_plan(model), attns=attns)
            )
            stack.append(es)

        def leave(*_: object) -> None:
            if stack:
                stack.pop().close()

        handles = [
            model.register_forward_pre_hook(enter),
            model.register_forward_hook(leave, always_call=True),
        ]
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


# --------------------------------------------------------------------------------------------
# the tap
# --------------------------------------------------------------------------------------------
@contextlib.contextmanager
def _tapped(hf, spec: RopeSpec, plan: tuple) -> Iterator[None]:
    """Apply ``plan`` inside ``hf``'s forward, at the rotation it calls
    (:func:`ropelens.backends.engine.rotation_plan`)."""

    with rotation_plan(hf, spec, plan, attns=attention_modules(hf)):
        yield


# --------------------------------------------------------------------------------------------
# readiness and the public context
# --------------------------------------------------------------------------------------------
def _n_hooks(model) -> int:
    """TransformerLens hooks on the bridge's hook points, and forward hooks on its attention layers
    (where variants sit); the bridge's own internal hooks are elsewhere."""
    unique = {
        id(h): h for h in model.hook_dict.values()
    }.values()  # aliases name one hook point twice
    points = sum(
        len(getattr(h, "fwd_hooks", ())) + len(getattr(h, "bwd_hooks", ())) for h in unique
    )
    attns = [getattr(b, "attn", None) for b in model.blocks]
    return points + sum(
        len(a._forward_pre_hooks) + len(a._forward_hooks) for a in attns if a is not None
    )


def _probe(model, spec: RopeSpec) -> str | None:
    """Why ``model`` cannot take this path (None: it can): one short forward with its rotations
    recorded."""
    hf = hf_view(model)
    return engine_problem(hf, spec, attention_modules(hf))


def engine_ready(model) -> str | None:
    """Why the engine cannot apply interventions to ``model`` (None: it can), checked once per
    modeling functions on a short forward (:func:`ropelens.backends.engine.engine_problem`)."""
    mod = importlib.import_module(type(hf_view(model)).__module__)
    key = (
        tuple(object_serial(f) for f, _ in rotation_forms(mod).values()),
        object_serial(getattr(mod, "rotate_half", None)),
    )
    cached = getattr(model, _READY, None)
    if cached is None or cached[0] != key:
        cached = (key, _probe(model, unmodified_spec(model)))
        object.__setattr__(model, _READY, cached)
    return cached[1]


def sdpa_ready(model) -> bool:
    """Whether ``model``'s forward, with every intervention in force, can run as the HF model with
    sdpa.

    True for a bridge whose family rotates at a tappable ``apply_rotary_pos_emb`` (checked once on a
    short forward, including that the model's own tables are the spec's rotation), when every active
    intervention is a RoPE variant, a plane ablation or a massive-value replacement and no other
    hook is on the bridge.
    """
    plain = is_plain(model)
    if not (hasattr(model, "original_model") and (plain or hasattr(model, "blocks"))):
        return False
    plan = active_plan(model)
    if getattr(model, _MARK, 0) != len(plan) or (
        not plain and _n_hooks(model) != sum(s.n_hooks for s in plan)
    ):
        return False
    return engine_ready(model) is None


@contextlib.contextmanager
def on_sdpa(model) -> Iterator[torch.nn.Module]:
    """The HF causal LM under ``model`` running with sdpa attention and every RoPE variant, plane
    ablation and massive-value replacement in force on ``model`` (``apply_rope_variant``,
    ``ablate_planes``, :func:`ropelens.analyses.massive_values.replace_massive`) applied in its
    forward.

    Call it as an HF model (``hf(input_ids=..., past_key_values=..., use_cache=True)``); generation
    with its key/value cache rotates each new token at its own position. Raises
    :class:`UnsupportedModelError` where :func:`sdpa_ready` is False (another hook or intervention
    is in force, or the family rotates elsewhere): run the bridge then.
    """
    if not sdpa_ready(model):
        why = getattr(model, _READY, (None, None))[1] or (
            "a hook or intervention other than a RoPE variant or plane ablation is in force"
        )
        raise UnsupportedModelError(
            "this model cannot run its interventions on the HF sdpa forward "
            f"({why}): "
            "run it through the bridge"
        )

    hf = hf_view(model)
    with _tapped(hf, unmodified_spec(model), active_plan(model)), sdpa_attention(hf):
        yield hf
