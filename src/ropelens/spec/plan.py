"""The plan of interventions in force on a model, and the rotary tables a RoPE variant gives.

Each intervention context (:func:`ropelens.run.intervene.apply_rope_variant`,
:func:`ropelens.run.intervene.ablate_planes`,
:func:`ropelens.analyses.massive_values.replace_massive`) records a *step* on the model while it
lasts; :func:`active_plan` lists them, outermost first. The engine (:mod:`ropelens.backends.engine`)
applies the plan at the rotation the HF forward calls, with the variant's (cos, sin) laid out as the
model lays out its own (:func:`model_tables`, :func:`variant_tables`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from ropelens.errors import UnsupportedModelError
from ropelens.spec.rope import LayerRope
from ropelens.spec.variants import RopeVariant

__all__ = [
    "AblationStep",
    "ReplaceStep",
    "Step",
    "VariantStep",
    "active_plan",
    "angles",
    "group_key",
    "model_tables",
    "variant_tables",
]

PLAN_ATTR = "_ropelens_sdpa_plan"  # where a model keeps its plan
_DECIDE = 4  # positive positions the table convention is read from


@dataclass(frozen=True, eq=False)
class VariantStep:
    """A RoPE variant in ``layers``, applied on the bridge with ``n_hooks`` hooks."""

    variant: RopeVariant
    layers: tuple[int, ...]
    n_hooks: int
    engine: bool = (
        False  # applied by the engine alone (:mod:`ropelens.backends.engine`), no bridge hook
    )


@dataclass(frozen=True, eq=False)
class AblationStep:
    """Zeroed ``[head, d_head]`` entries of the rotated q and k per layer (None: none), ``n_hooks``
    bridge hooks."""

    masks: dict[int, tuple[Tensor | None, Tensor | None]]
    n_hooks: int
    engine: bool = False


@dataclass(frozen=True, eq=False)
class ReplaceStep:
    """Entries of the q and k entering the rotation set to fixed values per layer, ``n_hooks``
    bridge hooks: ``{layer: {"q" or "k": (mask [head, d_head], value [head, d_head])}}``."""

    values: dict[int, dict[str, tuple[Tensor, Tensor]]]
    n_hooks: int
    engine: bool = False


Step = VariantStep | AblationStep | ReplaceStep


def active_plan(model) -> tuple[Step, ...]:
    """The variants, ablations and replacements in force on ``model``, outermost first."""
    return getattr(model, PLAN_ATTR, ())


# --------------------------------------------------------------------------------------------
# tables
# --------------------------------------------------------------------------------------------
def _lay(x: Tensor, width: int, n: int, layout: str) -> Tensor:
    if width == n:
        return x
    return x.repeat_interleave(2, dim=-1) if layout == "interleaved" else torch.cat((x, x), dim=-1)


def model_tables(
    cos: Tensor, sin: Tensor, layer: LayerRope, position_ids: Tensor
) -> tuple[str, float, float] | None:
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


def angles(variant: RopeVariant, layer: LayerRope, position_ids: Tensor) -> Tensor:
    """The variant's angle of each plane at ``position_ids`` ``[..., pos, plane]``; multimodal
    position ids ``[axis, batch, pos]`` (M-RoPE) turn each plane by its own axis's position
    (:attr:`LayerRope.axes`; a layer read without axes, text alone, by the first)."""
    if position_ids.ndim == 3 and position_ids.shape[0] in (3, 4):
        if not layer.axes:
            return variant.angles(layer, position_ids[0])
        per = torch.stack(
            [variant.angles(layer, position_ids[a]) for a in range(position_ids.shape[0])]
        )
        idx = (
            torch.tensor(layer.axes, device=per.device).view(1, 1, 1, -1).expand(1, *per.shape[1:])
        )
        return per.gather(0, idx)[0]
    return variant.angles(layer, position_ids)


def variant_tables(
    variant: RopeVariant,
    layer: LayerRope,
    position_ids: Tensor,
    like: Tensor,
    layout: str,
    sign: float,
    scale: float | None = None,
) -> tuple[Tensor, Tensor]:
    """The variant's (cos, sin) for ``layer`` at ``position_ids``, in the layout, sign and dtype of
    the model's table ``like``, with the ops of HF's rotary forward (so an identity variant gives
    the model's tables to the bit)."""
    with torch.no_grad():
        ang = _lay(
            angles(variant, layer, position_ids.to(like.device)),
            like.shape[-1],
            layer.n_planes,
            layout,
        )
        if ang.shape[-1] != like.shape[-1]:
            raise UnsupportedModelError(
                f"layer {layer.layer}: the model's cos table is {like.shape[-1]} wide but the "
                f"spec has {layer.n_planes} planes; the spec does not describe this model"
            )
        scale = variant.attention_scaling(layer) if scale is None else scale
        cos, sin = ang.cos() * scale, ang.sin() * scale
        return cos.to(like.dtype), (sin if sign > 0 else -sin).to(like.dtype)


def group_key(lr: LayerRope) -> tuple:
    """Layers with equal keys get equal tables from any variant."""
    return (
        lr.rotary_dim,
        lr.pairing,
        lr.attention_scaling,
        lr.base,
        lr.n_ctx,
        lr.kind,
        lr.window,
        tuple(lr.inv_freq.tolist()),
        tuple(sorted(map(str, lr.rope_parameters.items()))),
    )
