"""The engine: RoPE interventions applied inside the HF model's own forward, at the rotation it
calls.

Every family ropelens reads rotates its queries and keys by calling one of its modeling module's
rotation functions, in one of four forms (:func:`rotation_forms`):

- ``"qk"``: ``(q, k, cos, sin, ...) -> (q, k)`` (Llama's ``apply_rotary_pos_emb``, DeepSeek V3's
  ``apply_rotary_pos_emb_interleave``), on whole heads or on the rotary slice (partial rotary, MLA);
- ``"single"``: ``(x, cos, sin, ..., unsqueeze_dim)`` applied to the queries, then the keys (Gemma
  3n, Gemma 4);
- ``"table"``: ``(x, sin, cos)`` on ``[batch, pos, head, d]`` (GPT-J, CodeGen), keys and queries in
  separate calls;
- ``"complex"``: ``(xq, xk, freqs_cis)``, a complex product (DeepSeek V2, Llama 4).

:func:`rotation_plan` swaps those functions for tapped ones while a block runs and applies a *plan*
(:mod:`ropelens.backends.sdpa`'s steps) there: a RoPE variant replaces the tables (cos/sin, or the
complex frequencies) the function receives with the variant's, in the layout and sign of the model's
own, for the positions the model is at (its rotary module's or its attention's ``position_ids``: a
key/value cache included); a plane ablation zeroes planes of the rotated q and k; a massive-value
replacement writes entries of the q and k entering the rotation. The layer a call belongs to is the
attention module running; a sparse-attention indexer inside it rotates by its layer's variant too
(the rows of the rotary tables it picks are found by value and replaced by the variant's rows at the
same positions), and by nothing else of the plan. :func:`engine_problem` checks on one short forward
that a model's rotation can be reached this way and that its own tables are the spec's rotation.

It works the same under a TransformerLens bridge (the HF modules the bridge wraps call the same
functions) and on a plain HF model, so it is the one place interventions are implemented for models
whose bridge does not hand (cos, sin) to its attention.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import inspect
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch import Tensor

from ropelens.backends.sdpa_capture import sdpa_attention
from ropelens.devices import device_of
from ropelens.errors import InputError, RopelensWarning, UnsupportedModelError
from ropelens.spec.forward_taps import (
    complex_positions_axis,
    rotation_functions,
    single_rotation,
    table_rotation,
)
from ropelens.spec.plan import ReplaceStep, VariantStep, group_key, model_tables, variant_tables
from ropelens.spec.rope import LayerRope, RopeSpec
from ropelens.spec.rotary_state import frequency_dtype
from ropelens.spec.surface import register_runner, running_model

__all__ = [
    "check_model_state",
    "compiled_original",
    "engine_problem",
    "model_state_problem",
    "rotation_forms",
    "rotation_plan",
]


def rotation_forms(mod) -> dict[str, tuple[Callable, str]]:
    """``{name: (function, form)}`` of the rotations modeling module ``mod`` defines (see the module
    doc)."""
    out = {}
    for name, fn in rotation_functions(mod).items():
        params = list(inspect.signature(fn).parameters)
        if params[:4] == ["q", "k", "cos", "sin"]:
            out[name] = (fn, "qk")
        elif params[:2] == ["xq", "xk"]:
            out[name] = (fn, "complex")
        elif single_rotation(fn):
            out[name] = (fn, "single")
        elif table_rotation(fn):
            out[name] = (fn, "table")
    return out


def _unwrap(m: torch.nn.Module) -> torch.nn.Module:
    while getattr(m, "_original_component", None) is not None:
        m = m._original_component
    return m


def _compile(plan: tuple) -> tuple[dict, dict, dict]:

    variant_of: dict[int, Any] = {}
    masks: dict[int, list] = {}
    replaced: dict[int, list] = {}
    for step in plan:
        if isinstance(step, VariantStep):
            variant_of.update(
                dict.fromkeys(step.layers, step.variant)
            )  # the innermost variant wins
        elif isinstance(step, ReplaceStep):
            for L, qk in step.values.items():
                replaced.setdefault(L, []).append(qk)
        else:
            for L, qk in step.masks.items():
                masks.setdefault(L, []).append(qk)
    return variant_of, masks, replaced


def _fit(mask: Tensor, n_heads: int, width: int, lr: LayerRope, what: str) -> Tensor:
    """A ``[head, head_dim]`` mask (or ``[batch, head, head_dim]``: one per batch row) in ropelens's
    coordinates for a rotation that sees ``n_heads`` heads of ``width`` dims (the rotary slice comes
    first in ropelens's head vectors; an MLA key's rotary part is one shared head; a KV head's key
    copied to every query head of its group takes the KV head's mask)."""
    if width != mask.shape[-1]:
        if width != lr.rotary_dim:
            raise UnsupportedModelError(
                f"layer {lr.layer}: its rotation sees {width} dims per head, neither the head "
                f"({lr.head_dim}) nor the rotary slice ({lr.rotary_dim}); {what} cannot apply"
            )
        if bool(mask[..., width:].any()):
            raise UnsupportedModelError(
                f"layer {lr.layer} rotates only dims [0, {width}) of each head, and {what} "
                "touches dims past them, which never reach its rotation: restrict it to the "
                "rotary dims"
            )
        mask = mask[..., :width]
    if n_heads > mask.shape[-2] > 0 and n_heads % mask.shape[-2] == 0:
        # keys handed to the rotation once per query head (Falcon's fused qkv broadcasts each KV
        # head to its group, in order): each copy takes its KV head's mask
        return mask.repeat_interleave(n_heads // mask.shape[-2], dim=-2)
    if n_heads != mask.shape[-2]:
        if n_heads != 1 or not bool((mask == mask[..., :1, :]).all()):
            raise UnsupportedModelError(
                f"layer {lr.layer} rotates one key shared by all heads (multi-head latent "
                f"attention), so {what} cannot differ between heads there: apply it to every head"
            )
        mask = mask[..., :1, :]
    return mask


def _row_shape(x: Tensor, heads_axis: int, mask: Tensor) -> list[int]:
    """The shape ``mask`` (``[head, width]``, or ``[batch, head, width]``: one per batch row of
    ``x``) takes to broadcast over ``x`` with heads on ``heads_axis``."""
    shape = [1] * x.ndim
    shape[heads_axis], shape[-1] = -1, x.shape[-1]
    if mask.ndim == 3:
        if mask.shape[0] != x.shape[0]:
            raise UnsupportedModelError(
                f"a per-row plane ablation holds {mask.shape[0]} rows but the batch has "
                f"{x.shape[0]}: run a batch of as many rows as masks"
            )
        shape[0] = x.shape[0]
    return shape


def _apply(
    x: Tensor, heads_axis: int, lr: LayerRope, masks: list, replaced: list, which: str, before: bool
) -> Tensor:
    """``x`` (one rotation's input with ``before``, else its output) with the plan's replacements
    (before the rotation) or plane ablations (after it) of ``which`` ("q" or "k") applied; heads on
    ``heads_axis``."""
    i = 0 if which == "q" else 1
    n, width = x.shape[heads_axis], x.shape[-1]
    shape = [1] * x.ndim
    shape[heads_axis], shape[-1] = -1, width
    if before:
        for rep in replaced:
            entry = rep.get(which)
            if entry is None:
                continue
            mask, value = entry
            m = _fit(mask, n, width, lr, "massive-value replacement")
            v = value.to(x.device, x.dtype)
            v = v[:, :width] if v.shape[1] != width else v
            v = v[:1] if v.shape[0] != m.shape[0] else v
            x = torch.where(m.to(x.device).view(shape), v.view(shape), x)
        return x
    for qk in masks:
        mask = qk[i]
        if mask is not None:
            fitted = _fit(mask, n, width, lr, "plane ablation")
            x = x.masked_fill(fitted.to(x.device).view(_row_shape(x, heads_axis, fitted)), 0)
    return x


class _RotationTaps:
    """The state of one :func:`rotation_plan` block and its tapped rotations.

    The hooks on the rotary modules, the attention modules and the sparse-attention indexers keep
    the state (the layer running, the positions, the tables already made); the tapped rotation
    functions read it.
    """

    def __init__(
        self, spec: RopeSpec, plan: tuple, seen: list | None, device: torch.device
    ) -> None:
        self.spec = spec
        self.seen = seen
        variant_of, masks, replaced = _compile(plan)
        self.variant_of: dict[int, Any] = variant_of
        self.masks: dict[int, list] = {
            layer: [tuple(None if mask is None else mask.to(device) for mask in qk) for qk in steps]
            for layer, steps in masks.items()
        }
        self.replaced: dict[int, list] = {
            layer: [
                {which: (mask.to(device), value.to(device)) for which, (mask, value) in qk.items()}
                for qk in steps
            ]
            for layer, steps in replaced.items()
        }
        self.groups = {layer: group_key(spec[layer]) for layer in variant_of}
        self.layer: int | None = None  # the attention layer running, None outside them
        self.positions: Tensor | None = None  # the position ids of the forward running
        self.variant_cache: dict = {}  # (group, variant, shape, dtype) -> the variant's (cos, sin)
        self.model_conventions: dict = {}  # group -> model_tables' (layout, sign, error)
        self.calls_in_layer: dict[int, int] = {}  # rotation calls so far in each layer ("single")
        self.rotary_outputs: list = []  # the last (cos, sin, position_ids) the rotary modules made
        self.indexer_layer: int | None = None  # the layer whose indexer is running
        self.indexer_rows: dict = {}  # table width -> {row bytes: its position}
        self.saved_layers: list = []  # (layer, indexer_layer) outside each indexer running
        self.freq_dtype: torch.dtype | None = None  # what the rotary modules hold inv_freq in

    # hooks on the model's modules

    def set_positions(self, positions: Any) -> None:
        """Take the position ids of a new forward (its tables are made afresh)."""
        if isinstance(positions, Tensor) and positions is not self.positions:
            self.positions, self.variant_cache = positions, {}

    def rotary_pre(self, _module, args, kwargs) -> None:
        """Before a rotary module: its position ids are the forward's."""
        self.set_positions(kwargs.get("position_ids", args[1] if len(args) > 1 else None))

    def rotary_post(self, _module, args, kwargs, output) -> None:
        """After a rotary module: keep its tables with their positions.

        An indexer rotating rows of them (picked, pooled) gets the variant's rows at the same
        positions (:meth:`indexer_tables`).
        """
        positions = kwargs.get("position_ids", args[1] if len(args) > 1 else None)
        if (
            self.variant_of
            and isinstance(output, tuple)
            and len(output) == 2
            and isinstance(positions, Tensor)
        ):
            self.rotary_outputs = [*self.rotary_outputs[-3:], (output[0], output[1], positions)]
            self.indexer_rows = {}

    def attention_pre(self, layer: int) -> Callable:
        """The pre-hook of layer ``layer``'s attention: the rotations that follow are its."""

        def pre(_module, _args, kwargs) -> None:
            self.layer = layer
            self.calls_in_layer[layer] = 0
            self.set_positions(kwargs.get("position_ids"))

        return pre

    def attention_post(self, _module, _args, _kwargs, _output) -> None:
        """After an attention module: no layer runs."""
        self.layer = None

    def enter_indexer(self, _module, _args) -> None:
        """Before an indexer: its rotation gets its layer's variant, no ablation or replacement."""
        self.saved_layers.append((self.layer, self.indexer_layer))
        self.indexer_layer, self.layer = self.layer, None

    def leave_indexer(self, _module, _args, _output) -> None:
        """After an indexer: back in its layer."""
        self.layer, self.indexer_layer = self.saved_layers.pop()

    def register(self, hf: torch.nn.Module, attns: list) -> list:
        """Hook ``hf``'s rotary modules, ``attns`` and their indexers; return the handles."""
        rotaries = _rotary_modules(hf)
        self.freq_dtype = frequency_dtype(rotaries)
        handles = [m.register_forward_pre_hook(self.rotary_pre, with_kwargs=True) for m in rotaries]
        handles += [m.register_forward_hook(self.rotary_post, with_kwargs=True) for m in rotaries]
        for layer, attention in enumerate(attns):
            if attention is not None:
                handles.append(
                    attention.register_forward_pre_hook(self.attention_pre(layer), with_kwargs=True)
                )
                handles.append(
                    attention.register_forward_hook(
                        self.attention_post, with_kwargs=True, always_call=True
                    )
                )
        for indexer in _indexer_modules(attns):
            handles.append(indexer.register_forward_pre_hook(self.enter_indexer))
            handles.append(indexer.register_forward_hook(self.leave_indexer))
        return handles

    # the tables

    def current_layer(self) -> LayerRope | None:
        """The rotary layer running, or None."""
        layer = self.layer
        if layer is None or not 0 <= layer < self.spec.n_layers or not self.spec[layer].rotary:
            return None
        return self.spec[layer]

    def tables(self, lr: LayerRope, cos: Tensor, sin: Tensor) -> tuple[Tensor, Tensor]:
        """The variant's (cos, sin) in place of the model's own for this call, or its own."""
        layer, positions = lr.layer, self.positions
        if self.seen is not None and not any(entry[0] == layer for entry in self.seen):
            self.seen.append((layer, cos, sin, positions))
        if layer not in self.variant_of:
            return cos, sin
        if not isinstance(positions, Tensor) or positions.shape[-1] != cos.shape[-2]:
            shown = None if positions is None else tuple(positions.shape)
            raise UnsupportedModelError(
                f"layer {layer}: the position ids the model passed ({shown}) "
                f"do not match its rotation tables ({tuple(cos.shape)}): a RoPE variant cannot "
                "be placed at its positions"
            )
        group = self.groups[layer]
        convention = self.model_conventions.get(group)
        if convention is None:
            convention = model_tables(cos, sin, lr, positions)
            if convention is not None:
                self.model_conventions[group] = convention
        key = (group, id(self.variant_of[layer]), cos.shape, cos.dtype)
        if key not in self.variant_cache:
            layout, sign = _layout_and_sign(convention)
            self.variant_cache[key] = variant_tables(
                self.variant_of[layer], lr, positions, cos, layout, sign, freq_dtype=self.freq_dtype
            )
        return self.variant_cache[key]

    def rows_of_width(self, width: int) -> dict:
        """``{row bytes: position}`` of this forward's rotary table rows of width ``width``."""
        rows = self.indexer_rows.get(width)
        if rows is not None:
            return rows
        rows = {}
        for table_cos, table_sin, positions in self.rotary_outputs:
            if table_cos.shape[-1] != width:
                continue
            # positions [batch, pos] (or [pos]), or [batch, axis, pos] (multimodal, one axis kept)
            flat_positions = (
                positions.reshape(-1, positions.shape[-1])
                if positions.ndim < 3
                else positions[:, :1].reshape(positions.shape[0], -1)
            )
            first_cos = table_cos.reshape(-1, *table_cos.shape[-2:])[0]
            first_sin = table_sin.reshape(-1, *table_sin.shape[-2:])[0]
            for index, (cos_row, sin_row) in enumerate(zip(first_cos, first_sin, strict=True)):
                rows.setdefault(
                    _row_key(cos_row, sin_row),
                    flat_positions[:, index] if positions.ndim == 3 else flat_positions[0, index],
                )
        self.indexer_rows[width] = rows
        return rows

    def indexer_tables(self, cos: Tensor, sin: Tensor) -> tuple[Tensor, Tensor]:
        """The variant's tables for the rows an indexer rotates by, or ``(cos, sin)`` unchanged.

        Inside layer L's sparse-attention indexer, where L runs a variant: the rows of this
        forward's rotary tables that the indexer rotates by are found by value (the rows it picked
        or pooled).
        """
        layer = self.indexer_layer
        if layer is None or layer not in self.variant_of or not self.rotary_outputs:
            return cos, sin
        lr, width = self.spec[layer], cos.shape[-1]
        rows = self.rows_of_width(width)
        flat_cos, flat_sin = cos.reshape(-1, width), sin.reshape(-1, width)
        found = []
        for cos_row, sin_row in zip(flat_cos.cpu(), flat_sin.cpu(), strict=True):
            key = _row_key(cos_row, sin_row)
            if key not in rows:
                raise UnsupportedModelError(
                    f"layer {layer}'s indexer rotates by a table row that is none of this "
                    "forward's rotary tables, so the variant's tables cannot be placed at its "
                    "positions"
                )
            found.append(rows[key])
        positions = torch.stack(found, dim=-1) if found[0].ndim else torch.stack(found)
        if positions.ndim == 2:
            positions = positions.view(positions.shape[0], 1, -1)
        else:
            positions = positions.view(1, -1)
        last_cos, last_sin, last_positions = self.rotary_outputs[-1]
        layout, sign = _layout_and_sign(model_tables(last_cos, last_sin, lr, last_positions))
        variant_cos, variant_sin = variant_tables(
            self.variant_of[layer],
            lr,
            positions.to(cos.device),
            flat_cos,
            layout,
            sign,
            freq_dtype=self.freq_dtype,
        )
        return variant_cos.reshape(cos.shape), variant_sin.reshape(sin.shape)

    # the plan's interventions

    def replace_entries(self, x: Tensor, heads_axis: int, lr: LayerRope, which: str) -> Tensor:
        """``x`` entering the rotation, with ``lr``'s massive-value replacements of ``which``."""
        return _apply(
            x,
            heads_axis,
            lr,
            self.masks.get(lr.layer, ()),
            self.replaced.get(lr.layer, ()),
            which,
            True,
        )

    def ablate_planes(self, x: Tensor, heads_axis: int, lr: LayerRope, which: str) -> Tensor:
        """``x`` leaving the rotation with layer ``lr``'s plane ablations of ``which``."""
        return _apply(
            x,
            heads_axis,
            lr,
            self.masks.get(lr.layer, ()),
            self.replaced.get(lr.layer, ()),
            which,
            False,
        )

    # the tapped rotations, one per form (see the module doc)

    def tapped_qk(self, fn: Callable) -> Callable:
        """``fn(q, k, cos, sin, ...) -> (q, k)`` with the plan applied."""

        @functools.wraps(fn)
        def call(q, k=None, cos=None, sin=None, *args, **kwargs):
            lr = self.current_layer()
            if self.indexer_layer is not None and cos is not None:
                # an indexer's own rotation: its layer's variant
                cos, sin = self.indexer_tables(cos, sin)
                return fn(q, k, cos, sin, *args, **kwargs)
            if lr is None or k is None:
                # outside the attention layers, or queries alone (an indexer's form)
                return fn(q, k, cos, sin, *args, **kwargs)
            _check_shape(lr, q, 1, "queries")
            q = self.replace_entries(q, 1, lr, "q")
            k = self.replace_entries(k, 1, lr, "k")
            cos, sin = self.tables(lr, cos, sin)
            q_rotated, k_rotated = fn(q, k, cos, sin, *args, **kwargs)
            return (
                self.ablate_planes(q_rotated, 1, lr, "q"),
                self.ablate_planes(k_rotated, 1, lr, "k"),
            )

        return call

    def tapped_complex(self, fn: Callable) -> Callable:
        """``fn(xq, xk, freqs_cis, ...)`` (a complex product) with the plan applied."""
        heads_axis = 2 if complex_positions_axis(fn) == 1 else 1

        @functools.wraps(fn)
        def call(xq, xk, freqs, *args, **kwargs):
            lr = self.current_layer()
            if lr is None:
                return fn(xq, xk, freqs, *args, **kwargs)
            _check_shape(lr, xq, heads_axis, "queries")
            xq = self.replace_entries(xq, heads_axis, lr, "q")
            xk = self.replace_entries(xk, heads_axis, lr, "k")
            cos, sin = self.tables(lr, freqs.real, freqs.imag)
            if cos is not freqs.real:
                freqs = torch.complex(cos, sin)
            q_rotated, k_rotated = fn(xq, xk, freqs, *args, **kwargs)
            return (
                self.ablate_planes(q_rotated, heads_axis, lr, "q"),
                self.ablate_planes(k_rotated, heads_axis, lr, "k"),
            )

        return call

    def tapped_single(self, fn: Callable) -> Callable:
        """``fn(x, cos, sin, ..., unsqueeze_dim)`` (queries, then keys) with the plan applied."""
        signature = inspect.signature(fn)

        @functools.wraps(fn)
        def call(x, cos, sin, *args, **kwargs):
            lr = self.current_layer()
            if lr is None:
                return fn(x, cos, sin, *args, **kwargs)
            bound = signature.bind(x, cos, sin, *args, **kwargs)
            bound.apply_defaults()
            heads_axis = int(bound.arguments["unsqueeze_dim"])
            n_calls = self.calls_in_layer.get(lr.layer, 0)
            which = "q" if n_calls % 2 == 0 else "k"  # a layer rotates its queries first
            self.calls_in_layer[lr.layer] = n_calls + 1
            x = self.replace_entries(x, heads_axis, lr, which)
            cos, sin = self.tables(lr, cos, sin)
            return self.ablate_planes(fn(x, cos, sin, *args, **kwargs), heads_axis, lr, which)

        return call

    def tapped_table(self, fn: Callable) -> Callable:
        """``fn(x, sin, cos)`` (or ``(x, cos, sin)``) on ``[batch, pos, head, dim]``, planned."""
        sin_first = list(inspect.signature(fn).parameters)[1:3] == ["sin", "cos"]  # GPT-J

        @functools.wraps(fn)
        def call(x, first_table, second_table, *args, **kwargs):
            lr = self.current_layer()
            if lr is None:
                return fn(x, first_table, second_table, *args, **kwargs)
            self.check_queries_and_keys_alike(lr, fn.__name__)
            if sin_first:
                cos, sin = second_table, first_table
            else:
                cos, sin = first_table, second_table
            x = self.replace_entries(x, 2, lr, "q")
            cos, sin = self.tables(lr, cos, sin)
            if sin_first:
                rotated = fn(x, sin, cos, *args, **kwargs)
            else:
                rotated = fn(x, cos, sin, *args, **kwargs)
            return self.ablate_planes(rotated, 2, lr, "q")

        return call

    def check_queries_and_keys_alike(self, lr: LayerRope, function_name: str) -> None:
        """Raise unless layer ``lr``'s interventions treat queries and keys alike.

        Keys and queries go through separate calls of a "table" rotation, in an order the call
        does not show.
        """
        layer_masks = self.masks.get(lr.layer, ())
        layer_replaced = self.replaced.get(lr.layer, ())
        same = all(
            (qk[0] is None) == (qk[1] is None) and (qk[0] is None or torch.equal(qk[0], qk[1]))
            for qk in layer_masks
        )
        same = same and all(
            set(replacement) == {"q", "k"}
            and torch.equal(replacement["q"][0], replacement["k"][0])
            and torch.equal(replacement["q"][1], replacement["k"][1])
            for replacement in layer_replaced
        )
        if not same:
            raise UnsupportedModelError(
                f"layer {lr.layer} rotates its keys and queries in separate calls of "
                f"{function_name}, so an intervention must treat queries and keys alike there "
                "(every head, both q and k)"
            )

    def tapped(self, fn: Callable, form: str) -> Callable:
        """``fn`` (a rotation of form ``form``) with the plan applied."""
        wrappers = {
            "qk": self.tapped_qk,
            "complex": self.tapped_complex,
            "single": self.tapped_single,
            "table": self.tapped_table,
        }
        return wrappers[form](fn)


def _layout_and_sign(convention: tuple | None) -> tuple[str, float]:
    """The (layout, sign) of the model's own tables from :func:`model_tables`, or the default."""
    return (convention[0], convention[1]) if convention is not None else ("cat", 1.0)


def _row_key(cos_row: Tensor, sin_row: Tensor) -> bytes:
    """A table row (its cos and sin) as bytes: the key an indexer's rows are found by."""
    return cos_row.cpu().numpy().tobytes() + sin_row.cpu().numpy().tobytes()


def _check_shape(lr: LayerRope, x: Tensor, heads_axis: int, what: str) -> None:
    """Raise unless ``x`` is 4-d, the spec's heads on ``heads_axis``, its head (or rotary) width."""
    if (
        x.ndim != 4
        or x.shape[heads_axis] not in (lr.n_heads, lr.n_kv_heads, 1)
        or x.shape[-1] not in (lr.head_dim, lr.rotary_dim)
    ):
        raise UnsupportedModelError(
            f"layer {lr.layer}: its rotation received {what} of shape {tuple(x.shape)}, "
            f"which is not {lr.n_heads} heads of {lr.head_dim} (or {lr.rotary_dim} rotary) "
            "dims as the spec says"
        )


def _rotary_modules(hf: torch.nn.Module) -> list[torch.nn.Module]:
    """``hf``'s rotary modules, each once (a bridge's rotary component unwrapped to HF's)."""

    def is_rotary(module: torch.nn.Module, bridge: bool) -> bool:
        name = type(module).__name__.lower()
        return "rotary" in name and ("bridge" in name) == bridge

    rotaries = [m for m in hf.modules() if is_rotary(m, bridge=False)]
    rotaries += [_unwrap(m) for m in hf.modules() if is_rotary(m, bridge=True)]
    return list({id(rotary): rotary for rotary in rotaries}.values())


def _indexer_modules(attns: list) -> list[torch.nn.Module]:
    """The sparse-attention indexers inside the attention modules ``attns``."""
    return [
        module
        for attention in attns
        if attention is not None
        for module in attention.modules()
        if type(module).__name__.endswith("Indexer")
    ]


@contextlib.contextmanager
def rotation_plan(
    hf: torch.nn.Module, spec: RopeSpec, plan: tuple, seen: list | None = None, *, attns: list
) -> Iterator[None]:
    """Apply ``plan`` inside every forward of ``hf`` while the block runs.

    ``hf`` is an HF causal LM, or the HF model under a bridge. With ``seen``, record
    ``(layer, cos, sin, position_ids)`` for each layer's first rotation call. ``attns``: each
    layer's attention module (:func:`ropelens.backends.hf.attention_modules` of ``hf``, or a
    bridge's components, each unwrapped). Raises UnsupportedModelError where the model rotates
    some other way.
    """
    module = importlib.import_module(type(_unwrap(hf)).__module__)
    forms = rotation_forms(module)
    if not forms:
        raise UnsupportedModelError(
            f"{type(_unwrap(hf)).__name__} calls no rotation function ropelens can tap "
            "(apply_rotary_pos_emb and its forms): interventions cannot reach its RoPE"
        )
    attns = [None if attention is None else _unwrap(attention) for attention in attns]
    taps = _RotationTaps(spec, plan, seen, device_of(hf))
    handles = taps.register(hf, attns)
    for name, (fn, form) in forms.items():
        setattr(module, name, taps.tapped(fn, form))
    try:
        yield
    finally:
        for name, (fn, _form) in forms.items():
            setattr(module, name, fn)
        for handle in handles:
            handle.remove()


def engine_problem(hf: torch.nn.Module, spec: RopeSpec, attns: list) -> str | None:
    """Why the engine cannot apply interventions to ``hf`` (None: it can): one short forward of 8
    tokens with the rotations recorded; every rotary layer must call one, with tables that are the
    spec's rotation."""
    seen: list = []
    cfg = hf.config.get_text_config() if hasattr(hf.config, "get_text_config") else hf.config
    vocab = int(getattr(cfg, "vocab_size", 0) or 8)
    ids = (4 + (torch.arange(8) * 5 + 3) % max(vocab - 4, 1)).clamp_max(vocab - 1)[None]
    try:
        with rotation_plan(hf, spec, (), seen, attns=attns), sdpa_attention(hf), torch.no_grad():
            hf(input_ids=ids.to(next(iter(hf.parameters())).device), use_cache=False)
    except UnsupportedModelError as e:
        return str(e)
    except Exception as e:
        return (
            f"its forward fails on a short probe ({type(e).__name__}: "
            f"{str(e).splitlines()[0] if str(e) else ''})"
        )
    layers = sorted(s[0] for s in seen)
    if layers != spec.rotary_layers:
        return (
            f"its rotations ran in layers {layers}, and its rotary layers are {spec.rotary_layers}"
        )
    for L, cos, sin, pos in seen:
        conv = (
            model_tables(cos.float(), sin.float(), spec[L], pos)
            if isinstance(pos, Tensor)
            else None
        )
        # float32 tables of O(1) values: the model's own match the spec to ~1e-6; a wrong frequency
        # is far off. A 16-bit model rounds its tables to its dtype (bf16: 4e-3 at 1)
        tolerance = max(1e-4, torch.finfo(cos.dtype).eps) if cos.is_floating_point() else 1e-4
        if conv is None or conv[2] > tolerance:
            return (
                f"layer {L}'s rotation tables are not the spec's rotation (or its position ids "
                "could not be seen), so a variant's tables could not stand in for them"
            )
    return None


# ------------------------------------------------------------------------- the model ropelens runs
_COMPILED_NOTED = "_ropelens_compiled_noted"


def compiled_original(model: Any) -> Any:
    """The module a ``torch.compile``d model wraps (``OptimizedModule._orig_mod``), ``model``
    itself for anything else: ropelens taps the eager forward (its hooks and swapped rotation
    functions are invisible to, or broken by, the compiled graph), so it measures the original
    module, which holds the same weights. Said once per compiled model with a
    :class:`ropelens.errors.RopelensWarning`. A runner of :func:`ropelens.spec.surface
    .running_model`, so every analysis sees the original."""
    kind = type(model)
    if kind.__name__ != "OptimizedModule" or not kind.__module__.startswith("torch._dynamo"):
        return model
    original = model.__dict__.get("_modules", {}).get("_orig_mod")
    if original is None:
        return model
    if not model.__dict__.get(_COMPILED_NOTED):
        object.__setattr__(model, _COMPILED_NOTED, True)
        warnings.warn(
            f"the model is compiled (torch.compile): ropelens measures the "
            f"{type(original).__name__} it wraps (model._orig_mod), uncompiled, with the same "
            "weights, since its captures and interventions tap the eager forward",
            RopelensWarning,
            stacklevel=3,
        )
    return original


register_runner(compiled_original)


def _roots(model: Any) -> list[torch.nn.Module]:
    """The HF model a bridge or plain model holds (its names are the checkpoint's), then
    ``model``."""
    roots = (getattr(model, "original_model", None), model)
    return [root for root in roots if isinstance(root, torch.nn.Module)]


def _modules_of(model: Any) -> list[torch.nn.Module]:
    """``model``'s modules and those of the HF model a bridge or plain model holds."""
    seen: dict[int, torch.nn.Module] = {}
    for root in _roots(model):
        for module in root.modules():
            seen.setdefault(id(module), module)
    return list(seen.values())


def _tensors_of(model: Any) -> list[tuple[str, Tensor]]:
    """``model``'s named parameters and buffers (those of the HF model it holds first)."""
    seen: dict[int, tuple[str, Tensor]] = {}
    for root in _roots(model):
        for name, tensor in [*root.named_parameters(), *root.named_buffers()]:
            seen.setdefault(id(tensor), (name, tensor))
    return list(seen.values())


def _dropout_rates(model: Any, training: list[torch.nn.Module]) -> list[float]:
    """The non-zero dropout rates a model in training mode applies: its Dropout modules' and its
    config's (attention and hidden dropout, which HF applies functionally)."""
    rates = {float(m.p) for m in training if isinstance(m, torch.nn.Dropout)}
    roots = _roots(model)
    config = getattr(roots[0], "config", None) if roots else None
    for name in ("attention_dropout", "hidden_dropout", "dropout", "resid_pdrop", "attn_pdrop"):
        value = getattr(config, name, None)
        if isinstance(value, float | int) and not isinstance(value, bool):
            rates.add(float(value))
    rates.discard(0.0)
    return sorted(rates)


def model_state_problem(model: Any) -> str | None:
    """Why ``model``, as it stands, cannot be measured (None: it can): modules in training mode
    (dropout makes every forward random, and verification would blame the architecture), or
    weights on the meta device (shapes with no values: a model built under
    ``init_empty_weights``, or a device map that never loaded them)."""
    training = [module for module in _modules_of(model) if module.training]
    if training:
        rates = _dropout_rates(model, training)
        said = f", dropout {', '.join(f'{p:g}' for p in rates)} active" if rates else ""
        return (
            f"the model is in training mode (model.train(): {len(training)} modules{said}), so its "
            "forwards are not its inference and may differ from one run to the next: call "
            "model.eval() before measuring it"
        )
    tensors = _tensors_of(model)
    # a bridge's components hold the HF modules as _original_component: the checkpoint's names
    meta = [name.replace("_original_component.", "") for name, t in tensors if t.is_meta]
    if meta:
        share = "all" if len(meta) == len(tensors) else f"{len(meta)} of {len(tensors)}"
        return (
            f"{share} of the model's weights and buffers are on the meta device (shapes with no "
            f"values), e.g. {meta[0]!r}: the model was built without loading them "
            "(init_empty_weights, or a device map that left them unloaded); load it whole, e.g. "
            "ropelens.load_model(path) or from_pretrained(path) without a meta device"
        )
    return None


def check_model_state(model: Any) -> None:
    """Refuse, in one line, a model :func:`model_state_problem` finds unmeasurable. ropelens
    leaves a model in training mode as it is (switching it to eval behind a training loop would
    change that loop): the caller calls ``model.eval()``."""
    problem = model_state_problem(running_model(model))  # a wrapper: the model it runs
    if problem is not None:
        raise InputError(problem)
