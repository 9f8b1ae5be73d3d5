"""Queries and keys from the HF model's own forward, with its fast attention (sdpa), for q/k-only
analyses.

The TransformerLens bridge rebuilds eager attention (full score and pattern matrices) in every
layer. Analyses that need only queries and keys (frequency usage) do not need that: this path runs
the HF model the bridge wraps, with its ``sdpa`` attention, and takes each rotary layer's pre- and
post-RoPE q and k where the model rotates them, at the family's ``apply_rotary_pos_emb``; the
forward stops at the last rotation asked for (that layer's attention, MLP and every later layer are
skipped). In a layer that normalises q and k after RoPE (``LayerRope.norm_after_rope``), the
post-RoPE q and k are those its attention function receives, and the forward stops there. Families
that rotate elsewhere or only a slice of the head (GPT-J, Phi, StableLM), a model under a RoPE
variant or plane ablation, and any mismatch with the spec fall back to the bridge, which gives the
same numbers (``tests/unit/backends/test_fastpath.py``).
"""

from __future__ import annotations

import contextlib
import copy
import importlib
import inspect
from collections.abc import Callable, Iterator, Sequence

import einops
import torch
from torch import Tensor

from ropelens.errors import InputError
from ropelens.spec.forward_taps import attention_tap
from ropelens.spec.reading import hf_model_of
from ropelens.spec.rope import LayerRope, RopeSpec
from ropelens.spec.surface import drop_wrapper_forward

__all__ = [
    "QK_NEEDS",
    "attention_implementation",
    "fast_qk",
    "hf_view",
    "intervened",
    "right_padded",
    "sdpa_attention",
]

QK_NEEDS = frozenset({"q_pre", "k_pre", "q_rot", "k_rot", "q_post", "k_post"})
_MARK = "_ropelens_interventions"
_UNSUPPORTED = "_ropelens_fast_unsupported"
_SUPPORTED = "_ropelens_fast_supported"
_NAMES = ("q_pre", "k_pre", "q_rot", "k_rot", "q_post", "k_post")
_PROBE = 8  # tokens of the forward that finds out whether a model takes the fast path


class _Stop(Exception):
    """Raised after the last layer an analysis needs: the rest of the forward is skipped."""


class _Unsupported(Exception):
    """Raised at the first rotation that does not match the spec: the forward stops there."""


def right_padded(valid: Tensor) -> bool:
    """Whether a ``[batch, pos]`` key mask holds padding; an InputError unless each row's real
    tokens come first.

    Every reducer takes a token's position to be its index in the window (distances, the sink at
    index 0, the rotation of the fast path and the bridge alike), which holds only when each row is
    real tokens then padding. Left padding or a gap would shift every position, so it is refused
    instead of measured wrong. One host synchronisation answers both questions.
    """
    v = valid.bool()
    padded, gap = torch.stack([~v.all(), (v[:, 1:] & ~v[:, :-1]).any()]).tolist()
    if gap:
        row = int((v[:, 1:] & ~v[:, :-1]).any(1).nonzero()[0])
        raise InputError(
            f"the valid mask's row {row} has a real token after padding (left padding or a gap): "
            "ropelens measures right-padded batches only; put each window's tokens first and "
            "its padding last"
        )
    return bool(padded)


@contextlib.contextmanager
def intervened(model) -> Iterator[None]:
    """Mark ``model`` as running under an intervention (variant, ablation) while the block runs."""
    setattr(model, _MARK, getattr(model, _MARK, 0) + 1)
    try:
        yield
    finally:
        setattr(model, _MARK, getattr(model, _MARK, 1) - 1)


@contextlib.contextmanager
def _rotary_tap(
    hf,
    expected: Sequence[LayerRope],
    calls: list,
    on_call: Callable[[int, tuple], object] | None = None,
    block: list[int] | None = None,
) -> Iterator[bool]:
    """Record (q, k, q_rot, k_rot, q_score, k_score) at every call of the modeling module's
    ``apply_rotary_pos_emb`` (or, with ``on_call``, hand call i's tensors to ``on_call(i, tensors)``
    and keep nothing).

    Call i must rotate whole heads of ``expected[i]`` (``[batch, heads, pos, head_dim]``), from
    inside decoder layer ``expected[i].layer`` when ``block`` (``[index of the layer running]``) is
    given; the first call that does not (Phi and StableLM rotate a slice of the head, a family that
    rotates twice per layer) raises :class:`_Unsupported`. The score q/k are the rotated ones,
    except in a layer with a norm after RoPE (``norm_after_rope``), where they are the query and key
    its attention function receives next (:func:`ropelens.spec.forward_taps.attention_tap`). After
    the last expected layer's score q/k the forward stops (:class:`_Stop`).
    """
    mod = importlib.import_module(type(hf).__module__)
    orig = getattr(mod, "apply_rotary_pos_emb", None)
    # Only the (q, k, cos, sin) -> (q, k) form; GPT-J's (tensor, sin, cos) -> tensor is not tapped.
    if orig is None or list(inspect.signature(orig).parameters)[:2] != ["q", "k"]:
        yield False
        return
    waiting: list[tuple[Tensor, ...]] = []  # a rotation whose layer's score q/k are still to come

    def done(qk: tuple[Tensor, ...]) -> None:
        if on_call is None:
            calls.append(qk)
        else:
            calls.append(None)
            on_call(len(calls) - 1, qk)
        if len(calls) == len(expected):
            raise _Stop

    def tap(q, k=None, *args, **kwargs):
        if (
            waiting or len(calls) >= len(expected) or k is None
        ):  # k None: a rotation of queries alone (an indexer's)
            raise _Unsupported
        lr = expected[len(calls)]
        if (
            q.ndim != 4
            or q.shape[1] != lr.n_heads
            or k.shape[1] != lr.n_kv_heads
            or q.shape[-1] != lr.head_dim
            or k.shape[-1] != lr.head_dim
            or (block is not None and block[0] != lr.layer)
        ):
            raise _Unsupported
        q_rot, k_rot = orig(q, k, *args, **kwargs)
        if lr.norm_after_rope:
            waiting.append((q, k, q_rot, k_rot))
        else:  # a query temperature (Ministral 3) multiplies the rotated queries before the score
            done((q, k, q_rot, k_rot, lr.tempered(q_rot, pos_axis=2), k_rot))
        return q_rot, k_rot

    def scored(_module, query: Tensor, key: Tensor) -> None:
        if not waiting:
            return  # a layer whose score q/k are its rotated ones
        if (
            (block is not None and block[0] != expected[len(calls)].layer)
            or query.shape != waiting[0][2].shape
            or key.shape != waiting[0][3].shape
        ):
            raise _Unsupported
        done((*waiting.pop(), query, key))

    normed = any(lr.norm_after_rope for lr in expected)
    attn = [m for m in hf.modules() if "attention" in type(m).__name__.lower()] if normed else []
    mod.apply_rotary_pos_emb = tap
    try:
        with attention_tap(attn, scored) if normed else contextlib.nullcontext():
            yield True
    finally:
        mod.apply_rotary_pos_emb = orig


@contextlib.contextmanager
def sdpa_attention(hf) -> Iterator[None]:
    """Run the HF model with its sdpa attention where the family supports it, restoring the setting
    after."""
    with attention_implementation(hf, "sdpa" if getattr(hf, "_supports_sdpa", False) else None):
        yield


@contextlib.contextmanager
def attention_implementation(hf, impl: str | None) -> Iterator[None]:
    """Run the HF model with attention ``impl`` ("eager", "sdpa"; None: as it is) in its config and
    its text config, restoring the setting after: the one place ropelens switches a model's
    attention."""
    cfgs = {
        id(c): c for c in (hf.config, getattr(hf.config, "get_text_config", lambda: hf.config)())
    }.values()
    before = [(c, getattr(c, "_attn_implementation", None)) for c in cfgs]
    if impl is not None:
        for c, _ in before:
            c._attn_implementation = impl
    try:
        yield
    finally:
        for c, old in before:
            c._attn_implementation = old


def _unbridged(module: torch.nn.Module) -> torch.nn.Module:
    """The HF module tree under a bridge, with every bridge component replaced by the HF module it
    wraps: a shallow copy that shares every parameter and buffer (no memory, no copy of weights)."""
    while hasattr(module, "_original_component") and module._original_component is not None:
        module = module._original_component
    view = copy.copy(module)
    drop_wrapper_forward(view, module)
    view._modules = {
        name: (None if child is None else _unbridged(child))
        for name, child in module._modules.items()
    }
    for hooks in (
        "_forward_hooks",
        "_forward_pre_hooks",
        "_forward_hooks_with_kwargs",
        "_forward_pre_hooks_with_kwargs",
        "_forward_hooks_always_called",
        "_backward_hooks",
        "_backward_pre_hooks",
    ):
        if hasattr(view, hooks):
            setattr(view, hooks, type(getattr(module, hooks))())
    return view


def hf_view(model) -> torch.nn.Module:
    """The model's HF causal LM without the bridge's components (built once, weights shared)."""
    view = getattr(model, "_ropelens_hf_view", None)
    if view is None:
        view = _unbridged(hf_model_of(model))
        object.__setattr__(
            model, "_ropelens_hf_view", view
        )  # not a submodule: no double registration
    return view


def hf_decoder_layers(hf) -> Sequence[torch.nn.Module] | None:
    layers = getattr(getattr(hf, "base_model", None), "layers", None)
    return layers if isinstance(layers, torch.nn.ModuleList) else None


def _named(qk: tuple[Tensor, ...], keep: frozenset[str]) -> dict[str, Tensor]:
    """The tensors of ``keep`` among one layer's ``_NAMES``, each ``[batch, pos, head, dim]``."""
    return {
        name: einops.rearrange(tensor, "batch head pos dim -> batch pos head dim")
        for name, tensor in zip(_NAMES, qk, strict=True)
        if name in keep
    }


def _probe_rejects(model, spec: RopeSpec, tokens: Tensor, valid: Tensor, layers, on_layer) -> bool:
    """Whether a few tokens show that a model not yet known to take the fast path cannot.

    Learning it first lets the real batch stream to ``on_layer``.
    """
    probe = (
        on_layer is not None and not getattr(model, _SUPPORTED, False) and tokens.shape[1] > _PROBE
    )
    if not probe:
        return False
    probe_tokens, probe_valid = tokens[:1, :_PROBE], valid[:1, :_PROBE]
    return fast_qk(model, spec, probe_tokens, probe_valid, layers, keep=frozenset()) is None


def _block_hooks(blocks: Sequence[torch.nn.Module], last: int, running: list[int]) -> list:
    """Hook the decoder blocks up to ``last``: ``running[0]`` is the block running; stop after it.

    The rotary tap stops the forward at the last rotation; the hook on block ``last`` stops it when
    no layer up to ``last`` rotates.
    """

    def stop(*_: object) -> None:
        raise _Stop

    def enter(index: int) -> Callable[..., None]:
        def pre(*_: object) -> None:
            running[0] = index

        return pre

    handles = [blocks[last].register_forward_hook(stop)]
    handles += [blocks[index].register_forward_pre_hook(enter(index)) for index in range(last + 1)]
    return handles


def _tapped_forward(
    hf: torch.nn.Module,
    rotary_layers: list[LayerRope],
    calls: list,
    hand_over: Callable | None,
    running: list[int],
    tokens: Tensor,
    valid: Tensor,
    padded: bool | None,
) -> bool:
    """Run ``hf``, its rotations tapped into ``calls``; whether each rotation could be tapped."""
    try:
        with (
            _rotary_tap(hf, rotary_layers, calls, hand_over, running) as tapped,
            sdpa_attention(hf),
            torch.no_grad(),
        ):
            if tapped:
                # no padding: no mask tensor, so sdpa runs its causal kernel without an n × n mask
                if padded is None:
                    padded = right_padded(valid)
                hf(
                    input_ids=tokens,
                    attention_mask=valid.long() if padded else None,
                    use_cache=False,
                )
    except _Stop:
        pass
    except _Unsupported:
        tapped = False
    return tapped


def fast_qk(
    model,
    spec: RopeSpec,
    tokens: Tensor,
    valid: Tensor,
    layers: Sequence[int],
    *,
    keep: frozenset[str] = QK_NEEDS,
    on_layer: Callable[[int, dict[str, Tensor]], object] | None = None,
    padded: bool | None = None,
) -> dict[int, dict[str, Tensor]] | None:
    """``{layer: {name: tensor}}`` of q and k read on the fast path, or None where it cannot run.

    The names are those in ``keep`` (``q_pre``, ``k_pre``, ``q_rot``, ``k_rot``, ``q_post``,
    ``k_post``: see :data:`ropelens.run.capture.NEEDS`), each ``[batch, pos, head, d]``; on None
    the caller runs the bridge.

    With ``on_layer``, once the model is known to take the fast path, each layer's tensors go to
    ``on_layer(layer, tensors)`` while the forward runs and are dropped (memory: one layer's q/k,
    not every layer's); the returned dict then holds only what was not handed over. A model found
    unable to is remembered, so later calls cost nothing; a model under an intervention is only
    skipped while it lasts. ``valid`` must be right padding (:func:`right_padded`); ``padded``
    (whether it has a False anywhere), when the caller has checked it, saves asking the device.
    """
    if getattr(model, _MARK, 0) or getattr(model, _UNSUPPORTED, False):
        return None
    if _probe_rejects(model, spec, tokens, valid, layers, on_layer):
        return None
    hf = hf_view(model)
    blocks = hf_decoder_layers(hf)
    if blocks is None or len(blocks) != spec.n_layers:
        object.__setattr__(model, _UNSUPPORTED, True)
        return None
    last = max(layers)
    rotary = [layer for layer in spec.rotary_layers if last >= layer]
    wanted = set(layers)
    streaming = on_layer is not None and getattr(model, _SUPPORTED, False)

    def hand_over(index: int, qk: tuple[Tensor, ...]) -> None:
        if rotary[index] in wanted:
            on_layer(rotary[index], _named(qk, keep))

    calls: list = []
    running = [-1]
    handles = _block_hooks(blocks, last, running)
    try:
        tapped = _tapped_forward(
            hf,
            [spec[layer] for layer in rotary],
            calls,
            hand_over if streaming else None,
            running,
            tokens,
            valid,
            padded,
        )
    finally:
        for handle in handles:
            handle.remove()
    if not tapped or len(calls) != len(rotary):
        object.__setattr__(model, _UNSUPPORTED, True)
        return None
    object.__setattr__(model, _SUPPORTED, True)
    if streaming:
        return {}
    return {
        layer: _named(qk, keep) for layer, qk in zip(rotary, calls, strict=True) if layer in wanted
    }
