"""Queries, keys and patterns read from the TransformerLens bridge's hook points (the bridge view's
capture).

:class:`Collector` gathers a layer's tensors from the bridge's hooks (and, where a layer's score q/k
come from the HF attention function, from a tap on it) and hands them to the reducers once complete.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Sequence

import torch
from torch import Tensor

from ropelens.backends.acts import NEEDS, LayerActs, Reducer
from ropelens.backends.bridge_hooks import AttnHooks, attn_hooks, to_bphd
from ropelens.backends.bridge_interventions import PRE_ROPE_ABLATION, PreRopeAblation
from ropelens.errors import InputError, UnsupportedModelError
from ropelens.spec.forward_taps import attention_tap
from ropelens.spec.rope import LayerRope, RopeSpec

__all__ = ["ATTENTION", "Collector", "hook_plan", "plane_tables"]

ATTENTION = (
    "<attention function>"  # a tensor taken from the HF attention function's query/key, not a hook
)


def plane_tables(table: Tensor, rope: LayerRope, interleaved: bool) -> Tensor:
    """A ``[batch, pos, width]`` cos or sin table as one column per plane, ``[batch, pos,
    n_planes]``.

    Tables are half-width (one entry per plane), duplicated halves (Llama: ``cat(θ, θ)``) or
    interleaved (Cohere: ``repeat_interleave(θ, 2)``).
    """
    n = rope.n_planes
    if table.ndim == 2:
        table = table[None]
    if table.shape[-1] == n:
        return table
    if table.shape[-1] != 2 * n:
        raise InputError(
            f"layer {rope.layer}: a rotary table {table.shape[-1]} wide for {n} planes"
        )
    return table[..., ::2] if interleaved else table[..., :n]


def hook_plan(hooks: AttnHooks, needs: frozenset[str], rope: LayerRope) -> dict[str, str]:
    """Map each needed tensor to the hook that provides it (the rotation's output falls back to pre
    + rotate; the score q/k of a layer with a norm after RoPE come from their hook, else from the
    attention function)."""
    plan: dict[str, str] = {}
    for which in ("q", "k"):
        if f"{which}_pre" in needs:
            plan[f"{which}_pre"] = hooks.pre(which)
        rotated = [f"{which}_rot"] + ([] if rope.norm_after_rope else [f"{which}_post"])
        score = hooks.score(which) or (ATTENTION if hooks.calls_attention_function else None)
        if (
            rope.norm_after_rope and score is None
        ):  # a bridge that rebuilds attention without the norm: its own
            rotated.append(
                f"{which}_post"
            )  # scores are made of the rotated q/k (the probe's q/k check refuses it)
        elif rope.norm_after_rope and f"{which}_post" in needs:
            plan[f"{which}_post"] = score
        for key in set(rotated) & needs:
            post = hooks.post(which)
            plan[key] = post if post is not None else hooks.pre(which)
            if (
                post is None and hooks.cos is not None
            ):  # rotate with the tables the attention received
                plan["cos"], plan["sin"] = hooks.cos, hooks.sin
    if "pattern" in needs:
        plan["pattern"] = hooks.pattern
    return plan


class Collector:
    """Gathers a layer's tensors from its hooks and hands them to the reducers once complete."""

    def __init__(
        self, spec: RopeSpec, layers: Sequence[int], reducers: Sequence[Reducer], model
    ) -> None:
        self.spec, self.reducers = spec, reducers
        self.needs = frozenset().union(*(r.needs for r in reducers))
        unknown = self.needs - NEEDS
        if unknown:
            raise InputError(
                f"reducers ask for unknown tensors {sorted(unknown)}; known: {sorted(NEEDS)}"
            )
        self.hooks = {
            L: attn_hooks(model, L, norm_after_rope=spec.layers[L].norm_after_rope) for L in layers
        }
        self.plans = {L: hook_plan(h, self.needs, spec.layers[L]) for L, h in self.hooks.items()}
        self.hook_points = getattr(model, "hook_dict", {})
        self.attention = {
            id(model.blocks[L].attn.original_component): L
            for L, plan in self.plans.items()
            if ATTENTION in plan.values()
        }
        self.attention_modules = [
            model.blocks[L].attn.original_component for L in self.attention.values()
        ]
        self.pending: dict[int, dict[str, Tensor]] = {}
        self.valid: Tensor | None = None
        self.padded: bool | None = None
        self.interleaved = bool(
            getattr(getattr(model, "cfg", None), "rotary_interleaved_cos_sin", False)
        )

    def fwd_hooks(self) -> list[tuple[str, object]]:
        out = []
        for L, plan in self.plans.items():
            by_hook: dict[str, list[str]] = {}
            for key, name in plan.items():
                if name != ATTENTION and (name, key) not in self._before_ablation(L):
                    by_hook.setdefault(name, []).append(key)
            for name, keys in by_hook.items():
                out.append((name, self._hook_fn(L, tuple(keys))))
        return out

    def _before_ablation(self, layer: int) -> dict[tuple[str, str], PreRopeAblation]:
        """The pre-RoPE q and k of ``layer`` read at a hook point that a plane ablation zeroes
        (a bridge with no hook after its rotation): (hook, key) → the ablation, which hands them
        over before it zeroes."""
        out = {}
        for key, name in self.plans[layer].items():
            state = getattr(self.hook_points.get(name), PRE_ROPE_ABLATION, None)
            if key.endswith("_pre") and state is not None:
                out[(name, key)] = state
        return out

    @contextlib.contextmanager
    def ablation_observers(self):
        """Read the pre-RoPE q and k a plane ablation zeroes before it zeroes them."""
        added = []
        for L in self.plans:
            for (_, key), state in self._before_ablation(L).items():
                fn = functools.partial(self._receive, L, (key,))
                state.observers.append(fn)
                added.append((state, fn))
        try:
            yield
        finally:
            for state, fn in added:
                state.observers = [o for o in state.observers if o is not fn]

    def attention_tap(self) -> contextlib.AbstractContextManager:
        """Where a layer's score q/k come from the HF attention function (no bridge hook fires
        there): tap it."""
        if not self.attention:
            return contextlib.nullcontext()

        def on_call(module, query: Tensor, key: Tensor) -> None:
            L = self.attention.get(id(module))
            if L is not None:
                self._receive(L, ("q_post",), query.detach())
                self._receive(L, ("k_post",), key.detach())

        return attention_tap(self.attention_modules, on_call)

    def _hook_fn(self, layer: int, keys: tuple[str, ...]):
        def fn(x: Tensor, hook) -> Tensor:  # noqa: ARG001
            self._receive(layer, keys, x.detach())
            return x

        return fn

    def _receive(self, layer: int, keys: tuple[str, ...], x: Tensor) -> None:
        h = self.hooks[layer]
        rope = self.spec.layers[layer]
        got = self.pending.setdefault(layer, {})
        for key in keys:
            if key in ("pattern", "cos", "sin"):
                got[key] = x
                continue
            which, _ = key.split("_")
            name = self.plans[layer][key]
            n = rope.n_heads if which == "q" else rope.n_kv_heads
            got[key] = to_bphd(x, x.ndim == 4 and (name == ATTENTION or h.heads_first(name)), n)
        if len(got) == len(self.plans[layer]):
            self._rotate_missing(layer)
            self._dispatch(layer)

    def _rotate_missing(self, layer: int) -> None:
        """Post-RoPE q/k of a layer that fires no post-RoPE hook: its pre-RoPE tensors rotated with
        the (cos, sin) tables its attention received (so RoPE variants are seen), else with the
        spec's."""
        h, rope, got = self.hooks[layer], self.spec.layers[layer], self.pending[layer]
        plan = self.plans[layer]
        cos, sin = got.pop("cos", None), got.pop("sin", None)
        for which in ("q", "k"):
            keys = [
                k
                for k in (f"{which}_rot", f"{which}_post")
                if k in got and h.post(which) is None and plan[k] == h.pre(which)
            ]
            if not keys:
                continue
            t = got[keys[0]].transpose(1, 2)  # [b, head, pos, d]
            if cos is not None:
                c, s = (
                    plane_tables(cos, rope, self.interleaved),
                    plane_tables(sin, rope, self.interleaved),
                )
                t = rope.rotate_by(t, c[:, None].to(t.dtype), s[:, None].to(t.dtype))
            else:
                t = rope.rotate(t, torch.arange(t.shape[2], device=t.device))
            for key in keys:
                got[key] = t.transpose(1, 2)
            if (
                which == "q" and "q_post" in keys
            ):  # rotated here: the query temperature is still to apply
                got["q_post"] = rope.tempered(got["q_post"])
        if (
            rope.temperature is not None
            and "q_rot" in got
            and h.post("q") is not None
            and plan["q_rot"] == h.post("q")
        ):
            # the bridge's hook_rot_q is the query entering the score: the rotation's own output is
            # it untempered
            got["q_rot"] = rope.tempered(got["q_rot"], inverse=True)

    def _dispatch(self, layer: int) -> None:
        acts = LayerActs(
            layer=layer,
            rope=self.spec.layers[layer],
            valid=self.valid,
            tensors=self.pending.pop(layer),
            padded=self.padded,
        )
        for r in self.reducers:
            r.update(acts)

    def finish(self) -> None:
        """Complete layers whose pattern hook did not fire (GPT-J's bridge fires it only with
        output_attentions): the pattern is the softmax of the exact scores from q and k."""
        for layer in sorted(self.pending):
            got = self.pending[layer]
            if set(self.plans[layer]) - set(got) == {"pattern"} and {"q_post", "k_post"} <= set(
                got
            ):
                self._rotate_missing(layer)
                rope = self.spec.layers[layer]
                k = got["k_post"].repeat_interleave(rope.group_size, dim=2)
                scores = torch.einsum("bqhd,bkhd->bhqk", got["q_post"], k) * rope.score_scale
                ok = rope.mask(scores.shape[-1], scores.device)[None] & self.valid[:, None, :]
                got["pattern"] = rope.probs(scores.masked_fill(~ok[:, None], float("-inf")))
                self._dispatch(layer)
        for layer in sorted(self.pending):
            if any(
                name == ATTENTION and key not in self.pending[layer]
                for key, name in self.plans[layer].items()
            ):
                raise UnsupportedModelError(
                    f"{self.spec.architecture}: layer {layer} changes q and k after RoPE (a "
                    "norm), but the bridge neither fires a hook where they enter the score nor "
                    "calls the model's attention function: it does not compute this model's "
                    "attention, so ropelens cannot capture the q and k its scores are made of"
                )


@contextlib.contextmanager
def hooked_capture(model, spec: RopeSpec, layers: Sequence[int], reducers: Sequence[Reducer]):
    """A block in which ``run(tokens, valid, padded)`` runs bridge ``model`` over one batch and
    hands each layer of ``layers`` to ``reducers`` from the bridge's hook points (hooks installed
    once for every batch)."""
    col = Collector(spec, layers, reducers, model)
    stop = max(layers) + 1

    def run(toks: Tensor, valid: Tensor, padded: bool) -> None:
        col.valid, col.padded = valid, padded
        model(toks, return_type=None, stop_at_layer=stop if stop < spec.n_layers else None)
        col.finish()
        if col.pending:
            raise RuntimeError(f"hooks for layers {sorted(col.pending)} fired incompletely")

    with model.hooks(fwd_hooks=col.fwd_hooks()), col.attention_tap(), col.ablation_observers():
        yield run
