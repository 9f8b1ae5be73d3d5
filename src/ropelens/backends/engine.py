"""The engine: RoPE interventions applied inside the HF model's own forward, at the rotation it calls.

Every family ropelens reads rotates its queries and keys by calling one of its modeling module's
rotation functions, in one of four forms (:func:`rotation_forms`):

- ``"qk"``: ``(q, k, cos, sin, ...) -> (q, k)`` (Llama's ``apply_rotary_pos_emb``, DeepSeek V3's
  ``apply_rotary_pos_emb_interleave``), on whole heads or on the rotary slice (partial rotary, MLA);
- ``"single"``: ``(x, cos, sin, ..., unsqueeze_dim)`` applied to the queries, then the keys (Gemma 3n, Gemma 4);
- ``"table"``: ``(x, sin, cos)`` on ``[batch, pos, head, d]`` (GPT-J, CodeGen), keys and queries in separate calls;
- ``"complex"``: ``(xq, xk, freqs_cis)``, a complex product (DeepSeek V2, Llama 4).

:func:`rotation_plan` swaps those functions for tapped ones while a block runs and applies a *plan*
(:mod:`ropelens.backends.sdpa`'s steps) there: a RoPE variant replaces the tables (cos/sin, or the complex
frequencies) the function receives with the variant's, in the layout and sign of the model's own, for
the positions the model is at (its rotary module's or its attention's ``position_ids``: a key/value cache
included); a plane ablation zeroes planes of the rotated q and k; a massive-value replacement writes
entries of the q and k entering the rotation. The layer a call belongs to is the attention module
running; a sparse-attention indexer inside it rotates by its layer's variant too (the rows of the rotary
tables it picks are found by value and replaced by the variant's rows at the same positions), and by
nothing else of the plan. :func:`engine_problem` checks on one short forward
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
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch import Tensor

from ropelens.errors import UnsupportedModelError
from ropelens.spec.plan import ReplaceStep, VariantStep, group_key, model_tables, variant_tables
from ropelens.spec.rope import LayerRope, RopeSpec

__all__ = ["engine_problem", "rotation_forms", "rotation_plan"]


def rotation_forms(mod) -> dict[str, tuple[Callable, str]]:
    """``{name: (function, form)}`` of the rotations modeling module ``mod`` defines (see the module doc)."""
    from ropelens.spec.forward_taps import rotation_functions, single_rotation, table_rotation

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
    """A ``[head, head_dim]`` mask in ropelens's coordinates for a rotation that sees ``n_heads`` heads of ``width``
    dims (the rotary slice comes first in ropelens's head vectors; an MLA key's rotary part is one shared head)."""
    if width != mask.shape[1]:
        if width != lr.rotary_dim:
            raise UnsupportedModelError(
                f"layer {lr.layer}: its rotation sees {width} dims per head, neither the head "
                f"({lr.head_dim}) nor the rotary slice ({lr.rotary_dim}); {what} cannot apply"
            )
        if bool(mask[:, width:].any()):
            raise UnsupportedModelError(
                f"layer {lr.layer} rotates only dims [0, {width}) of each head, and {what} touches dims past them, "
                "which never reach its rotation: restrict it to the rotary dims"
            )
        mask = mask[:, :width]
    if n_heads != mask.shape[0]:
        if n_heads != 1 or not bool((mask == mask[:1]).all()):
            raise UnsupportedModelError(
                f"layer {lr.layer} rotates one key shared by all heads (multi-head latent attention), so {what} "
                "cannot differ between heads there: apply it to every head"
            )
        mask = mask[:1]
    return mask


def _apply(
    x: Tensor, heads_axis: int, lr: LayerRope, masks: list, replaced: list, which: str, before: bool
) -> Tensor:
    """``x`` (one rotation's input with ``before``, else its output) with the plan's replacements (before the
    rotation) or plane ablations (after it) of ``which`` ("q" or "k") applied; heads on ``heads_axis``."""
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
            x = x.masked_fill(
                _fit(mask, n, width, lr, "plane ablation").to(x.device).view(shape), 0
            )
    return x


@contextlib.contextmanager
def rotation_plan(
    hf: torch.nn.Module, spec: RopeSpec, plan: tuple, seen: list | None = None, *, attns: list
) -> Iterator[None]:
    """Apply ``plan`` inside every forward of ``hf`` (an HF causal LM, or the HF model under a bridge) while the block
    runs; with ``seen``, record ``(layer, form, cos, sin, position_ids)`` for each layer's first rotation call.
    ``attns``: each layer's attention module (:func:`ropelens.backends.hf.attention_modules` of ``hf``, or a bridge's
    components, each unwrapped). Raises UnsupportedModelError where the model rotates some other way."""
    from ropelens.spec.forward_taps import complex_positions_axis

    mod = importlib.import_module(type(_unwrap(hf)).__module__)
    forms = rotation_forms(mod)
    if not forms:
        raise UnsupportedModelError(
            f"{type(_unwrap(hf)).__name__} calls no rotation function ropelens can tap "
            "(apply_rotary_pos_emb and its forms): interventions cannot reach its RoPE"
        )
    attns = [None if a is None else _unwrap(a) for a in attns]
    variant_of, masks, replaced = _compile(plan)
    from ropelens.devices import device_of

    dev = device_of(hf)
    masks = {
        L: [tuple(None if m is None else m.to(dev) for m in qk) for qk in v]
        for L, v in masks.items()
    }
    replaced = {
        L: [{w: (m.to(dev), x.to(dev)) for w, (m, x) in qk.items()} for qk in v]
        for L, v in replaced.items()
    }
    groups = {L: group_key(spec[L]) for L in variant_of}
    state: dict[str, Any] = {
        "layer": None,
        "pos": None,
        "tables": {},
        "conv": {},
        "calls": {},
        "outputs": [],
        "indexer": None,
        "rows": {},
    }

    def set_pos(pos: Any) -> None:
        if isinstance(pos, Tensor) and pos is not state["pos"]:
            state["pos"], state["tables"] = pos, {}

    def rotary_pre(_module, args, kwargs) -> None:
        set_pos(kwargs.get("position_ids", args[1] if len(args) > 1 else None))

    def rotary_post(_module, args, kwargs, out) -> None:
        # the tables this forward's rotary modules made, with their positions: an indexer rotating rows of them
        # (picked, pooled) gets the variant's rows at the same positions (:func:`indexer_tables`)
        pos = kwargs.get("position_ids", args[1] if len(args) > 1 else None)
        if variant_of and isinstance(out, tuple) and len(out) == 2 and isinstance(pos, Tensor):
            state["outputs"] = [*state["outputs"][-3:], (out[0], out[1], pos)]
            state["rows"] = {}

    def attn_pre(i: int):
        def pre(_module, _args, kwargs) -> None:
            state["layer"] = i
            state["calls"][i] = 0
            set_pos(kwargs.get("position_ids"))

        return pre

    def attn_post(_module, _args, _kwargs, _out) -> None:
        state["layer"] = None

    def layer_of() -> LayerRope | None:
        L = state["layer"]
        return spec[L] if L is not None and 0 <= L < spec.n_layers and spec[L].rotary else None

    def tables(lr: LayerRope, cos: Tensor, sin: Tensor) -> tuple[Tensor, Tensor]:
        """The variant's (cos, sin) in place of the model's own for this call, or the model's own."""
        L, pos = lr.layer, state["pos"]
        if seen is not None and not any(s[0] == L for s in seen):
            seen.append((L, cos, sin, pos))
        if L not in variant_of:
            return cos, sin
        if not isinstance(pos, Tensor) or pos.shape[-1] != cos.shape[-2]:
            raise UnsupportedModelError(
                f"layer {L}: the position ids the model passed ({None if pos is None else tuple(pos.shape)}) "
                f"do not match its rotation tables ({tuple(cos.shape)}): a RoPE variant cannot "
                "be placed at its positions"
            )
        g = groups[L]
        conv = state["conv"].get(g)
        if conv is None:
            conv = model_tables(cos, sin, lr, pos)
            if conv is not None:
                state["conv"][g] = conv
        key = (g, id(variant_of[L]), cos.shape, cos.dtype)
        if key not in state["tables"]:
            layout, sign = (conv[0], conv[1]) if conv is not None else ("cat", 1.0)
            state["tables"][key] = variant_tables(variant_of[L], lr, pos, cos, layout, sign)
        return state["tables"][key]

    def indexer_tables(cos: Tensor, sin: Tensor) -> tuple[Tensor, Tensor]:
        """Inside layer L's sparse-attention indexer, where L runs a variant: the variant's tables for the rows of this
        forward's rotary tables that the indexer rotates by (found by value: the rows it picked or pooled)."""
        L = state["indexer"]
        if L is None or L not in variant_of or not state["outputs"]:
            return cos, sin
        lr, w = spec[L], cos.shape[-1]
        rows = state["rows"].get(w)
        if rows is None:
            rows = {}
            for oc, os_, pos in state["outputs"]:
                if oc.shape[-1] != w:
                    continue
                p = (
                    pos.reshape(-1, pos.shape[-1])
                    if pos.ndim < 3
                    else pos[:, :1].reshape(pos.shape[0], -1)
                )
                for j, (c, sn) in enumerate(
                    zip(
                        oc.reshape(-1, *oc.shape[-2:])[0],
                        os_.reshape(-1, *os_.shape[-2:])[0],
                        strict=True,
                    )
                ):
                    rows.setdefault(
                        c.numpy().tobytes() + sn.numpy().tobytes()
                        if c.device.type == "cpu"
                        else bytes(c.cpu().numpy()) + bytes(sn.cpu().numpy()),
                        p[:, j] if pos.ndim == 3 else p[0, j],
                    )
            state["rows"][w] = rows
        flat_c, flat_s = cos.reshape(-1, w), sin.reshape(-1, w)
        found = []
        for c, sn in zip(flat_c.cpu(), flat_s.cpu(), strict=True):
            key = c.numpy().tobytes() + sn.numpy().tobytes()
            if key not in rows:
                raise UnsupportedModelError(
                    f"layer {L}'s indexer rotates by a table row that is none of this forward's rotary tables, so the "
                    "variant's tables cannot be placed at its positions"
                )
            found.append(rows[key])
        pos = torch.stack(found, dim=-1) if found[0].ndim else torch.stack(found)
        pos = pos.view(pos.shape[0], 1, -1) if pos.ndim == 2 else pos.view(1, -1)
        conv = model_tables(*state["outputs"][-1][:2], lr, state["outputs"][-1][2])
        layout, sign = (conv[0], conv[1]) if conv is not None else ("cat", 1.0)
        c2, s2 = variant_tables(variant_of[L], lr, pos.to(cos.device), flat_c, layout, sign)
        return c2.reshape(cos.shape), s2.reshape(sin.shape)

    def check(lr: LayerRope, x: Tensor, heads_axis: int, what: str) -> None:
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

    def tapped_qk(fn: Callable) -> Callable:
        @functools.wraps(fn)
        def call(q, k=None, cos=None, sin=None, *args, **kwargs):
            lr = layer_of()
            if (
                state["indexer"] is not None and cos is not None
            ):  # an indexer's own rotation: its layer's variant
                cos, sin = indexer_tables(cos, sin)
                return fn(q, k, cos, sin, *args, **kwargs)
            if (
                lr is None or k is None
            ):  # outside the attention layers, or queries alone (an indexer's form)
                return fn(q, k, cos, sin, *args, **kwargs)
            check(lr, q, 1, "queries")
            lm, lrep = masks.get(lr.layer, ()), replaced.get(lr.layer, ())
            q, k = _apply(q, 1, lr, lm, lrep, "q", True), _apply(k, 1, lr, lm, lrep, "k", True)
            cos, sin = tables(lr, cos, sin)
            q_rot, k_rot = fn(q, k, cos, sin, *args, **kwargs)
            return _apply(q_rot, 1, lr, lm, lrep, "q", False), _apply(
                k_rot, 1, lr, lm, lrep, "k", False
            )

        return call

    def tapped_complex(fn: Callable) -> Callable:
        heads_axis = 2 if complex_positions_axis(fn) == 1 else 1

        @functools.wraps(fn)
        def call(xq, xk, freqs, *args, **kwargs):
            lr = layer_of()
            if lr is None:
                return fn(xq, xk, freqs, *args, **kwargs)
            check(lr, xq, heads_axis, "queries")
            lm, lrep = masks.get(lr.layer, ()), replaced.get(lr.layer, ())
            xq, xk = (
                _apply(xq, heads_axis, lr, lm, lrep, "q", True),
                _apply(xk, heads_axis, lr, lm, lrep, "k", True),
            )
            cos, sin = tables(lr, freqs.real, freqs.imag)
            if cos is not freqs.real:
                freqs = torch.complex(cos, sin)
            q_rot, k_rot = fn(xq, xk, freqs, *args, **kwargs)
            return (
                _apply(q_rot, heads_axis, lr, lm, lrep, "q", False),
                _apply(k_rot, heads_axis, lr, lm, lrep, "k", False),
            )

        return call

    def tapped_single(fn: Callable) -> Callable:
        sig = inspect.signature(fn)

        @functools.wraps(fn)
        def call(x, cos, sin, *args, **kwargs):
            lr = layer_of()
            if lr is None:
                return fn(x, cos, sin, *args, **kwargs)
            bound = sig.bind(x, cos, sin, *args, **kwargs)
            bound.apply_defaults()
            heads_axis = int(bound.arguments["unsqueeze_dim"])
            which = (
                "q" if state["calls"].get(lr.layer, 0) % 2 == 0 else "k"
            )  # a layer rotates its queries first
            state["calls"][lr.layer] = state["calls"].get(lr.layer, 0) + 1
            lm, lrep = masks.get(lr.layer, ()), replaced.get(lr.layer, ())
            x = _apply(x, heads_axis, lr, lm, lrep, which, True)
            cos, sin = tables(lr, cos, sin)
            return _apply(fn(x, cos, sin, *args, **kwargs), heads_axis, lr, lm, lrep, which, False)

        return call

    def tapped_table(fn: Callable) -> Callable:
        names = list(inspect.signature(fn).parameters)[
            1:3
        ]  # ["sin", "cos"] (GPT-J) or ["cos", "sin"]

        @functools.wraps(fn)
        def call(x, a, b, *args, **kwargs):
            lr = layer_of()
            if lr is None:
                return fn(x, a, b, *args, **kwargs)
            lm, lrep = masks.get(lr.layer, ()), replaced.get(lr.layer, ())
            if lm or lrep:
                # keys and queries go through separate calls, in an order the call does not show
                same = all(
                    (qk[0] is None) == (qk[1] is None)
                    and (qk[0] is None or torch.equal(qk[0], qk[1]))
                    for qk in lm
                )
                same = same and all(
                    set(r) == {"q", "k"}
                    and torch.equal(r["q"][0], r["k"][0])
                    and torch.equal(r["q"][1], r["k"][1])
                    for r in lrep
                )
                if not same:
                    raise UnsupportedModelError(
                        f"layer {lr.layer} rotates its keys and queries in separate calls of {fn.__name__}, so an "
                        "intervention must treat queries and keys alike there (every head, both q and k)"
                    )
            cos, sin = (b, a) if names == ["sin", "cos"] else (a, b)
            x = _apply(x, 2, lr, lm, lrep, "q", True)
            cos, sin = tables(lr, cos, sin)
            out = (
                fn(x, sin, cos, *args, **kwargs)
                if names == ["sin", "cos"]
                else fn(x, cos, sin, *args, **kwargs)
            )
            return _apply(out, 2, lr, lm, lrep, "q", False)

        return call

    wrap = {
        "qk": tapped_qk,
        "complex": tapped_complex,
        "single": tapped_single,
        "table": tapped_table,
    }
    rotaries = [
        m
        for m in hf.modules()
        if "rotary" in type(m).__name__.lower() and "bridge" not in type(m).__name__.lower()
    ]
    rotaries += [
        _unwrap(m)
        for m in hf.modules()
        if "rotary" in type(m).__name__.lower() and "bridge" in type(m).__name__.lower()
    ]
    unique = {id(r): r for r in rotaries}.values()
    handles = [m.register_forward_pre_hook(rotary_pre, with_kwargs=True) for m in unique]
    handles += [m.register_forward_hook(rotary_post, with_kwargs=True) for m in unique]
    for i, a in enumerate(attns):
        if a is not None:
            handles.append(a.register_forward_pre_hook(attn_pre(i), with_kwargs=True))
            handles.append(a.register_forward_hook(attn_post, with_kwargs=True, always_call=True))
    indexers = [
        m
        for a in attns
        if a is not None
        for m in a.modules()
        if type(m).__name__.endswith("Indexer")
    ]
    saved_layer: list = []

    def enter_indexer(
        _m, _a
    ) -> None:  # an indexer's own rotation: its layer's variant, no ablation or replacement
        saved_layer.append((state["layer"], state["indexer"]))
        state["indexer"], state["layer"] = state["layer"], None

    def leave_indexer(_m, _a, _o) -> None:
        state["layer"], state["indexer"] = saved_layer.pop()

    for m in indexers:
        handles += [
            m.register_forward_pre_hook(enter_indexer),
            m.register_forward_hook(leave_indexer),
        ]
    saved = {name: fn for name, (fn, _form) in forms.items()}
    for name, (fn, form) in forms.items():
        setattr(mod, name, wrap[form](fn))
    try:
        yield
    finally:
        for name, fn in saved.items():
            setattr(mod, name, fn)
        for h in handles:
            h.remove()


def engine_problem(hf: torch.nn.Module, spec: RopeSpec, attns: list) -> str | None:
    """Why the engine cannot apply interventions to ``hf`` (None: it can): one short forward of 8 tokens with the
    rotations recorded; every rotary layer must call one, with tables that are the spec's rotation."""
    from ropelens.backends.sdpa_capture import sdpa_attention

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
        return f"its forward fails on a short probe ({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''})"
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
        # float32 tables of O(1) values: the model's own match the spec to ~1e-6; a wrong frequency is far off
        if conv is None or conv[2] > 1e-4:
            return (
                f"layer {L}'s rotation tables are not the spec's rotation (or its position ids could not be seen), "
                "so a variant's tables could not stand in for them"
            )
    return None
