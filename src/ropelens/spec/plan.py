"""The plan of interventions in force on a model, and the rotary tables a RoPE variant gives.

Each intervention context (:func:`ropelens.run.intervene.apply_rope_variant`,
:func:`ropelens.run.intervene.ablate_planes`,
:func:`ropelens.analyses.massive_values.replace_massive`) records a *step* on the model while it
lasts; :func:`active_plan` lists them, outermost first. The engine (:mod:`ropelens.backends.engine`)
applies the plan at the rotation the HF forward calls, with the variant's (cos, sin) laid out as the
model lays out its own (:func:`model_tables`, :func:`variant_tables`).
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from ropelens.errors import UnsupportedModelError
from ropelens.spec.rope import LayerRope, RopeSpec, layer_ranges
from ropelens.spec.variants import RopeVariant

__all__ = [
    "AblationStep",
    "ReplaceStep",
    "Step",
    "VariantStep",
    "active_plan",
    "angles",
    "describe_intervention",
    "describe_step",
    "group_key",
    "layer_with_variant",
    "model_tables",
    "spec_as_run",
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
# the spec a model has under its plan
# --------------------------------------------------------------------------------------------
def layer_with_variant(
    layer: LayerRope, variant: RopeVariant, length: int | None = None
) -> LayerRope:
    """``layer`` as it rotates under ``variant``: the variant's frequencies (at ``length`` tokens
    where they depend on the input's length, as dynamic NTK's do; else at the original context),
    cos/sin multiplier, HF rope type and parameters. Planes the variant stops have θ = 0
    (:attr:`LayerRope.stopped_planes`)."""
    takes_length = "seq_len" in inspect.signature(variant.inv_freq).parameters
    inv_freq = (
        variant.inv_freq(layer, length)
        if takes_length and length is not None
        else variant.inv_freq(layer)
    )
    return dataclasses.replace(
        layer,
        inv_freq=inv_freq,
        attention_scaling=variant.attention_scaling(layer),
        rope_type=variant.rope_type,
        rope_parameters=variant.to_dict(),
    )


def _ablated_by_head(
    layer: LayerRope, mask: Tensor | None, every_row: bool = True
) -> tuple[tuple[int, ...], ...]:
    """Per query head, the planes whose two dims ``mask`` (``[head, d_head]``) zeroes; a mask per
    batch row (``[row, head, d_head]``) zeroes a plane in every row (``every_row``) or in any."""
    if mask is None or not layer.n_planes:
        return ()
    if mask.ndim == 3:
        mask = mask.all(0) if every_row else mask.any(0)
    dims = layer.plane_dims.to(mask.device)
    both = mask[:, dims[:, 0]] & mask[:, dims[:, 1]]  # [head, plane]
    return tuple(tuple(int(p) for p in torch.nonzero(row).flatten()) for row in both)


def _merge_ablated(
    a: tuple[tuple[int, ...], ...], b: tuple[tuple[int, ...], ...]
) -> tuple[tuple[int, ...], ...]:
    if not a or not b:
        return a or b
    return tuple(tuple(sorted(set(x) | set(y))) for x, y in zip(a, b, strict=True))


def describe_step(step: Step, spec: RopeSpec, shadowed: Iterable[int] = ()) -> dict[str, Any]:
    """A JSON-ready record of one intervention (:attr:`RopeSpec.interventions`).

    ``shadowed``: the layers of a variant step where a variant applied inside it runs instead (the
    innermost wins); its ``layers`` are those where it runs, its ``shadowed_layers`` the others.
    """
    if isinstance(step, VariantStep):
        hidden = set(shadowed) & set(step.layers)
        record = {
            "intervention": "rope variant",
            "variant": step.variant.to_dict(),
            "name": step.variant.name,
            "layers": sorted(set(step.layers) - hidden),
        }
        if hidden:
            record["shadowed_layers"] = sorted(hidden)
        return record
    if isinstance(step, ReplaceStep):
        return {
            "intervention": "replacement",
            "what": "entries of q and k entering the rotation set to fixed values",
            "layers": sorted(step.values),
        }
    groups = []
    per_row = any(q is not None and q.ndim == 3 for q, _ in step.masks.values())
    for layer_index, (q_mask, _) in sorted(step.masks.items()):
        by_head = _ablated_by_head(spec[layer_index], q_mask, every_row=False)
        heads_of: dict[tuple[int, ...], list[int]] = {}
        for head, planes in enumerate(by_head):
            if planes:
                heads_of.setdefault(planes, []).append(head)
        groups += [
            {"layer": layer_index, "heads": heads, "planes": list(planes)}
            for planes, heads in heads_of.items()
        ]
    record: dict[str, Any] = {"intervention": "plane ablation", "zeroed": groups}
    if per_row:  # one mask per batch row: a plane is listed where any row zeroes it
        record["per_row"] = True
    return record


def describe_intervention(record: dict[str, Any]) -> str:
    """One intervention record (:attr:`RopeSpec.interventions`, :func:`describe_step`) in words."""
    kind = record.get("intervention")
    if kind == "rope variant":
        shadowed = record.get("shadowed_layers") or []
        where = f"in layers {layer_ranges(record['layers'])}" if record["layers"] else "in no layer"
        if shadowed:
            where += f" (shadowed by an inner variant in layers {layer_ranges(shadowed)})"
        return f"{record['name']} {where}"
    if kind == "plane ablation":
        parts = [
            f"layer {z['layer']} heads {layer_ranges(z['heads'])} planes "
            f"{layer_ranges(z['planes'])}"
            for z in record["zeroed"]
        ]
        rows = " in some batch rows" if record.get("per_row") else ""
        return f"planes zeroed{rows} (" + "; ".join(parts) + ")" if parts else "no planes zeroed"
    layers = record.get("layers") or []
    return f"{kind} in layers {layer_ranges(layers)}" if layers else f"{kind} in no layer"


def spec_as_run(spec: RopeSpec, plan: tuple[Step, ...], length: int | None = None) -> RopeSpec:
    """``spec`` (the model as built) as the model runs under ``plan``: each variant's frequencies in
    its layers (the innermost variant wins, as the engine applies them, each computed from the
    layer as built), the planes each ablation zeroes per query head (with one mask per batch row,
    those zeroed in every row), and every step recorded in :attr:`RopeSpec.interventions`."""
    if not plan:
        return spec
    layers = {lr.layer: lr for lr in spec.layers}
    variant_of: dict[int, RopeVariant] = {}
    ablated: dict[int, tuple[tuple[int, ...], ...]] = {}
    for step in plan:
        if isinstance(step, VariantStep):
            variant_of.update(dict.fromkeys(step.layers, step.variant))
        elif isinstance(step, AblationStep):
            for i, (q_mask, _) in step.masks.items():
                ablated[i] = _merge_ablated(ablated.get(i, ()), _ablated_by_head(spec[i], q_mask))
    for i, variant in variant_of.items():
        layers[i] = layer_with_variant(spec[i], variant, length)
    for i, by_head in ablated.items():
        layers[i] = dataclasses.replace(layers[i], ablated=by_head)
    dynamic = [
        v.original_max_position
        for v in variant_of.values()
        if "seq_len" in inspect.signature(v.inv_freq).parameters
    ]
    return dataclasses.replace(
        spec,
        layers=tuple(layers[i] for i in range(spec.n_layers)),
        interventions=tuple(
            describe_step(step, spec, _shadowed(plan, i)) for i, step in enumerate(plan)
        ),
        valid_up_to=spec.valid_up_to if length is not None or not dynamic else min(dynamic),
        length=length if dynamic and length is not None else spec.length,
    )


def _shadowed(plan: tuple[Step, ...], index: int) -> set[int]:
    """The layers of variant step ``plan[index]`` that a later (inner) variant step also sets: there
    the inner one runs."""
    return {
        layer
        for step in plan[index + 1 :]
        if isinstance(step, VariantStep)
        for layer in step.layers
    }


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


def _held_angles(
    variant: RopeVariant, layer: LayerRope, position_ids: Tensor, freq_dtype: torch.dtype | None
) -> Tensor:
    """:func:`angles`, with the variant's frequencies rounded to ``freq_dtype`` first where the
    model holds its own in 16 bits: HF turns each plane by its ``inv_freq`` buffer as held, so a
    model cast whole to bfloat16 rotates by rounded frequencies, and an identity variant must too.
    A variant with angles of its own (length-dependent) keeps them."""
    if (
        freq_dtype is None
        or freq_dtype == torch.float32
        or type(variant).angles is not RopeVariant.angles
        or position_ids.ndim == 3
    ):
        return angles(variant, layer, position_ids)
    inv = variant.inv_freq(layer).to(freq_dtype).float().to(position_ids.device)
    return position_ids[..., None].float() * inv


def variant_tables(
    variant: RopeVariant,
    layer: LayerRope,
    position_ids: Tensor,
    like: Tensor,
    layout: str,
    sign: float,
    scale: float | None = None,
    freq_dtype: torch.dtype | None = None,
) -> tuple[Tensor, Tensor]:
    """The variant's (cos, sin) for ``layer`` at ``position_ids``, in the layout, sign and dtype of
    the model's table ``like``, with the ops of HF's rotary forward (so an identity variant gives
    the model's tables to the bit). ``freq_dtype``: the dtype the model's rotary modules hold their
    frequencies in (:func:`ropelens.spec.rotary_state.frequency_dtype`; None: float32)."""
    with torch.no_grad():
        ang = _lay(
            _held_angles(variant, layer, position_ids.to(like.device), freq_dtype),
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
