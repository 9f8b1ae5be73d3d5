"""Multimodal RoPE (M-RoPE): 3-D position ids, the per-axis rotation, and q/k captured from a
vision-language forward.

Qwen2-VL, Qwen2.5-VL, Qwen3-VL and Qwen 3.5 rotate each plane by one of three positions: time,
height or width (``LayerRope.axes``, read from the model's own rotary by
:func:`ropelens.rope_spec`). Text tokens get t = h = w, so on text alone M-RoPE is 1-D RoPE and
every other analysis measures it as such. Image and video tokens get their grid coordinates, built
by the model (``get_rope_index``); :func:`capture_mrope` takes the position ids the model hands its
text rotary during the forward, with pixel input, and the queries and keys around its rotation and
attention function, and checks the spec's 3-D rotation against the model's (a wrong plane-to-axis
assignment is refused, never measured).
"""

from __future__ import annotations

import contextlib
import importlib
import inspect
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import einops
import torch
from jaxtyping import Float, Int
from torch import Tensor

from ropelens.backends.hf import vl_model
from ropelens.backends.sdpa_capture import attention_implementation
from ropelens.errors import InputError, UnsupportedModelError
from ropelens.loading.models import resolve_device, resolve_dtype
from ropelens.spec.reading import hf_model_of
from ropelens.spec.rope import LayerRope, RopeSpec

__all__ = [
    "MRopeCapture",
    "as_plain_vl",
    "capture_mrope",
    "load_vl_model",
    "modality",
    "mrope_angles",
    "mrope_tolerance",
    "rotate_mrope",
    "rotation_error_3d",
]

TEXT, IMAGE, VIDEO = 0, 1, 2  # token modality, as HF's mm_token_type_ids numbers them


def mrope_angles(
    lr: LayerRope, position_ids: Int[Tensor, "3 batch pos"]
) -> Float[Tensor, "batch pos n_planes"]:
    """Each plane's rotation angle, ``position_ids[axis_i]·θ_i`` (float64), from the model's 3-D
    position ids."""
    if not lr.axes:
        raise InputError(
            f"layer {lr.layer} applies 1-D RoPE (no axes in its spec): use LayerRope.angles"
        )
    if position_ids.ndim != 3 or position_ids.shape[0] != 3:
        raise InputError(
            "position_ids must be [3, batch, pos] (time, height, width), got "
            f"{tuple(position_ids.shape)}"
        )
    axes = torch.tensor(lr.axes, device=position_ids.device)
    pos = position_ids.to(torch.float64)[axes]  # [plane, batch, pos]: each plane's own axis
    return pos.permute(1, 2, 0) * lr.inv_freq.to(position_ids.device, torch.float64) * lr.direction


def rotate_mrope(
    lr: LayerRope, x: Float[Tensor, "batch pos head d"], position_ids: Int[Tensor, "3 batch pos"]
) -> Float[Tensor, "batch pos head d"]:
    """Rotate head vectors as the layer's M-RoPE does at the 3-D ``position_ids`` (attention scaling
    included)."""
    ang = mrope_angles(lr, position_ids.to(x.device))[:, :, None].to(
        x.dtype
    )  # [batch, pos, 1, plane]
    return lr.rotate_by(x, ang.cos() * lr.attention_scaling, ang.sin() * lr.attention_scaling)


def rotation_error_3d(lr: LayerRope, pre: Tensor, post: Tensor, position_ids: Tensor) -> float:
    """Relative max error of the model's rotated ``post`` ``[batch, pos, head, d]`` against the
    spec's 3-D rotation of ``pre`` at ``position_ids``: ~eps when every plane turns by the axis the
    spec gives it."""
    pred = rotate_mrope(lr, pre.double(), position_ids)
    return float((pred - post.double()).abs().max() / post.double().abs().max().clamp_min(1e-30))


def mrope_tolerance(dtype: torch.dtype) -> float:
    """Relative tolerance of the rotation and score checks for a model in ``dtype``.

    The model's cos/sin and its rotated q and k are rounded to its dtype (eps/2 relative each), and
    the scores sum d such products: 16·eps bounds both with room (float32: 1e-4 as the floor;
    bfloat16: 0.125 would be too loose, so 16-bit models get 2e-2, still far below the O(1) error of
    a wrong axis where the axes' positions differ by a few tokens).
    """
    eps = torch.finfo(dtype).eps if dtype.is_floating_point else 0.0
    return min(2e-2, max(1e-4, 16 * eps))


def modality(hf, input_ids: Tensor) -> Int[Tensor, "batch pos"]:
    """Each token's modality (0 text, 1 image, 2 video) from the model's image and video placeholder
    ids."""
    cfg = hf.config
    out = torch.zeros_like(input_ids, dtype=torch.long)
    for key, value in (("image_token_id", IMAGE), ("video_token_id", VIDEO)):
        tok = getattr(cfg, key, None)
        if tok is not None:
            out[input_ids == int(tok)] = value
    return out


@dataclass(frozen=True)
class MRopeCapture:
    """What one forward with pixel input gave: the model's 3-D position ids and each layer's q, k
    and pattern."""

    position_ids: Int[Tensor, "3 batch pos"]
    modality: Int[Tensor, "batch pos"]
    tensors: dict[
        int, dict[str, Tensor]
    ]  # layer → q_pre, k_pre, q_post, k_post ([batch, pos, head, d]), pattern
    errors: dict[str, float] = field(
        default_factory=dict
    )  # rotation and score checks against the model


class _Stop(Exception):
    """Raised after the last layer asked for: the rest of the forward is skipped."""


def _language_model(hf) -> torch.nn.Module:
    """The text tower of an HF vision-language model (``model.language_model``), or the model's own
    decoder."""
    for name, m in hf.named_modules():
        if name.split(".")[-1] == "language_model" and isinstance(
            getattr(m, "layers", None), torch.nn.ModuleList
        ):
            return m
    inner = getattr(hf, "model", hf)
    if isinstance(getattr(inner, "layers", None), torch.nn.ModuleList):
        return inner
    raise UnsupportedModelError(
        f"{type(hf).__name__}: found no text tower (language_model.layers) to read M-RoPE from"
    )


def _text_rotary(lm: torch.nn.Module) -> torch.nn.Module:
    for m in lm.modules():
        if hasattr(m, "mrope_section") and isinstance(getattr(m, "inv_freq", None), Tensor):
            return m
    raise UnsupportedModelError(
        f"{type(lm).__name__}: its rotary has no mrope_section: not a multimodal RoPE model"
    )


def as_plain_vl(model_or_hf, label: str | None = None):
    """A :class:`ropelens.backends.hf.PlainModel` of an HF vision-language model (TransformerLens
    has no adapter for it)."""
    return vl_model(model_or_hf, label)


def load_vl_model(
    path: str, *, device: str | torch.device | None = None, dtype: str | torch.dtype = torch.float32
):
    """Load an HF vision-language model directory (Qwen2-VL, Qwen2.5-VL, Qwen3-VL) as a plain model,
    eager attention."""
    from transformers import AutoModelForImageTextToText

    hf = AutoModelForImageTextToText.from_pretrained(
        path, dtype=resolve_dtype(dtype), attn_implementation="eager"
    )
    return as_plain_vl(hf.to(resolve_device(device)).eval(), label=str(path))


def _forward_kwargs(hf, input_ids: Tensor, mm: dict[str, Any]) -> dict[str, Any]:
    """The VL forward's keyword arguments: pixel input as given, and the token types the processor
    would add."""
    kwargs = {k: v for k, v in mm.items() if v is not None}
    params = inspect.signature(hf.forward).parameters
    unknown = sorted(set(kwargs) - set(params))
    if unknown:
        raise InputError(
            f"{type(hf).__name__}.forward takes no {', '.join(unknown)}: pass the inputs its "
            "processor makes"
        )
    if "mm_token_type_ids" in params and "mm_token_type_ids" not in kwargs and kwargs:
        kwargs["mm_token_type_ids"] = modality(
            hf, input_ids
        ).int()  # what the processor returns beside input_ids
    return kwargs


def _check_text_layers(model, hf, spec: RopeSpec, attns: list) -> None:
    """Raise unless the text tower's attention modules are the ones ``spec`` was read from.

    A hybrid's linear-attention layers have no ``self_attn``; every other layer must be the one the
    spec was read from.
    """
    if len(attns) != spec.n_layers or any(
        (attention is None) == lr.attention
        or (attention is not None and type(attention).__name__ != _attn_class(model, layer))
        for layer, (attention, lr) in enumerate(zip(attns, spec.layers))
    ):
        raise UnsupportedModelError(
            f"{type(hf).__name__}: its text tower's layers are not the layers ropelens read "
            "its RoPE from"
        )


class _MRopeTaps:
    """One :func:`capture_mrope` forward: the layer running, its q, k and pattern, the positions."""

    def __init__(self, layers: Sequence[int]) -> None:
        self.wanted, self.last = set(layers), max(layers)
        self.current: int | None = None  # the attention layer running
        self.got: dict[int, dict[str, Tensor]] = {}
        self.positions: list[Tensor] = []  # the first position ids the text rotary saw, [3, b, n]

    def tapped_rotation(self, rotation: Callable) -> Callable:
        """``apply_rotary_pos_emb`` tapped: each wanted layer's first pre- and post-RoPE q and k."""

        def tapped(q, k, *args, **kwargs):
            out = rotation(q, k, *args, **kwargs)
            layer = self.current
            if layer in self.wanted and "q_pre" not in self.got.setdefault(layer, {}):
                self.got[layer].update(q_pre=q, k_pre=k, q_rot=out[0], k_rot=out[1])
            return out

        return tapped

    def tapped_attention(self, attention_function: Callable) -> Callable:
        """``eager_attention_forward`` tapped: each wanted layer's first query, key and pattern."""

        def tapped(module, query, key, value, attention_mask, *args, **kwargs):
            out = attention_function(module, query, key, value, attention_mask, *args, **kwargs)
            layer = self.current
            if layer in self.wanted and "q_post" not in self.got.setdefault(layer, {}):
                self.got[layer].update(q_post=query, k_post=key, pattern=out[1])
            return out

        return tapped

    def seen_positions(self, _module, args, kwargs) -> None:
        """The text rotary's pre-hook: keep the first position ids (1-D ones as 3 equal axes)."""
        positions = kwargs.get("position_ids", args[1] if len(args) > 1 else None)
        if isinstance(positions, Tensor) and not self.positions:
            if positions.ndim == 2:
                positions = positions.detach().expand(3, *positions.shape[-2:])
            self.positions.append(positions.detach())

    def enter(self, layer: int) -> Callable[..., None]:
        """The pre-hook of layer ``layer``'s attention module."""

        def hook(_module, _args) -> None:
            self.current = layer

        return hook

    def leave(self, layer: int) -> Callable[..., None]:
        """The hook after layer ``layer``'s attention module: stop after the last layer wanted."""

        def hook(_module, _args, _output) -> None:
            self.current = None
            if layer == self.last:
                raise _Stop

        return hook

    def register(self, lm: torch.nn.Module, attns: list) -> list:
        """Hook the text rotary of ``lm`` and the attention modules up to the last; the handles."""
        rotary = _text_rotary(lm)
        handles = [rotary.register_forward_pre_hook(self.seen_positions, with_kwargs=True)]
        for layer, attention in enumerate(attns[: self.last + 1]):
            if attention is not None:
                handles.append(attention.register_forward_pre_hook(self.enter(layer)))
                handles.append(attention.register_forward_hook(self.leave(layer)))
        return handles

    def captured(self, hf) -> tuple[Tensor, dict[int, dict[str, Tensor]]]:
        """The position ids and ``{layer: {name: tensor}}`` on the CPU, q and k heads first.

        q and k are ``[batch, pos, head, dim]``; the pattern stays ``[batch, head, q, k]``.
        """
        missing = sorted(
            layer for layer in self.wanted if {"q_pre", "q_post"} - set(self.got.get(layer, {}))
        )
        if missing:
            raise UnsupportedModelError(
                f"{type(hf).__name__}: layers {missing} ran no rotation and attention function "
                "ropelens could tap"
            )
        if not self.positions:
            raise UnsupportedModelError(f"{type(hf).__name__}: its text rotary saw no position ids")
        tensors = {
            layer: {
                name: (
                    tensor.detach().cpu()
                    if name == "pattern"
                    else einops.rearrange(
                        tensor.detach(), "batch head pos dim -> batch pos head dim"
                    ).cpu()
                )
                for name, tensor in self.got[layer].items()
            }
            for layer in sorted(self.wanted)
        }
        return self.positions[0].cpu(), tensors


def _check_rotation(hf, errors: dict[str, float]) -> None:
    """Raise where the spec's 3-D rotation misses the model's by more than its dtype allows."""
    tolerance = mrope_tolerance(next(p.dtype for p in hf.parameters() if p.is_floating_point()))
    bad = {name: error for name, error in errors.items() if not error <= tolerance}
    if bad:
        shown = ", ".join(f"{name} error {error:.2g}" for name, error in bad.items())
        raise UnsupportedModelError(
            f"{type(hf).__name__}: ropelens's reading of its multimodal RoPE does not match the "
            f"model ({shown} > {tolerance:g}): the "
            "planes' time/height/width axes or the rotation differ from the spec"
        )


def capture_mrope(
    model,
    spec: RopeSpec,
    input_ids: Int[Tensor, "batch pos"],
    layers: Sequence[int],
    *,
    verify: bool = True,
    **multimodal: Any,
) -> MRopeCapture:
    """Run the VL model (eager attention) on ``input_ids`` and pixel input; capture q, k, pattern.

    The pixel input is ``pixel_values``, ``image_grid_thw``, ``pixel_values_videos``,
    ``video_grid_thw``, ... For each of ``layers`` it captures the q and k its rotation receives and
    returns and the probabilities its attention function returns, with the 3-D position ids its
    text rotary receives. ``verify`` checks the spec's 3-D rotation of the pre-RoPE q/k against the
    model's rotated ones and the pattern rebuilt from them against the model's, raising
    UnsupportedModelError on a mismatch.
    """
    hf = hf_model_of(model)
    lm = _language_model(hf)
    attns = [getattr(layer, "self_attn", None) for layer in lm.layers]
    _check_text_layers(model, hf, spec, attns)
    module = importlib.import_module(type(hf).__module__)
    rotation = getattr(module, "apply_rotary_pos_emb", None)
    attention_function = getattr(module, "eager_attention_forward", None)
    if rotation is None or attention_function is None:
        raise UnsupportedModelError(
            f"{type(hf).__name__}: no apply_rotary_pos_emb and eager_attention_forward to tap"
        )
    taps = _MRopeTaps(layers)
    handles = taps.register(lm, attns)
    kwargs = _forward_kwargs(hf, input_ids, multimodal)
    module.apply_rotary_pos_emb = taps.tapped_rotation(rotation)
    module.eager_attention_forward = taps.tapped_attention(attention_function)
    try:
        with attention_implementation(hf, "eager"), torch.no_grad(), contextlib.suppress(_Stop):
            hf(input_ids=input_ids, use_cache=False, **kwargs)
    finally:
        module.apply_rotary_pos_emb = rotation
        module.eager_attention_forward = attention_function
        for handle in handles:
            handle.remove()
    position_ids, tensors = taps.captured(hf)
    errors = _errors(spec, tensors, position_ids) if verify else {}
    _check_rotation(hf, errors)
    return MRopeCapture(
        position_ids=position_ids,
        modality=modality(hf, input_ids).cpu(),
        tensors=tensors,
        errors=errors,
    )


def _attn_class(model, layer: int) -> str:
    """The class of the attention module the spec of ``model`` was read from at ``layer``."""
    blocks = getattr(model, "attention_blocks", None) or []
    attn = getattr(blocks[layer], "attn", None) if layer < len(blocks) else None
    return type(getattr(attn, "original_component", None)).__name__


def _errors(
    spec: RopeSpec, tensors: dict[int, dict[str, Tensor]], position_ids: Tensor
) -> dict[str, float]:
    """The rotation check (spec's 3-D rotation of pre-RoPE q/k against the model's rotated q/k) and
    the score check (the pattern made of the q/k entering the model's score, through the layer's
    mask and softmax, against the model's), worst over layers."""
    rot = probs = 0.0
    for L, t in tensors.items():
        lr = spec[L]
        rot = max(
            rot,
            rotation_error_3d(lr, t["q_pre"], t["q_rot"], position_ids),
            rotation_error_3d(lr, t["k_pre"], t["k_rot"], position_ids),
        )
        q, k = t["q_post"].double(), t["k_post"].double()
        k = k.repeat_interleave(lr.group_size, dim=2)
        scores = torch.einsum("bqhd,bkhd->bhqk", q, k) * lr.score_scale
        scores = scores.masked_fill(~lr.mask(q.shape[1])[None, None], float("-inf"))
        probs = max(probs, float((lr.probs(scores) - t["pattern"].double()).abs().max()))
    return {"rotation": rot, "probs": probs}
