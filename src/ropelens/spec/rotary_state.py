"""Keep a model's rotary modules as they were around everything ropelens runs on them.

HF's rotary modules hold state that their forward changes: dynamic NTK replaces ``inv_freq`` and
``max_seq_len_cached`` when an input grows past the longest seen, and resets them on one within the
native context; LongRoPE copies its short or long frequencies into ``inv_freq`` in place and keeps
``long_inv_freq``. A reading or a capture that ran them would otherwise leave the model rotating the
next input by frequencies that depend on what ropelens ran before, and ropelens's own views of the
HF tree (shallow copies sharing the ``_buffers`` dict, each with its own ``max_seq_len_cached``)
would drift apart from the model. :func:`rotary_state_kept` starts each block from the state a
fresh model has (HF's own reset, a call on one position) and puts every buffer and attribute of
every rotary module back, bit for bit, when the block ends.
"""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Iterator
from typing import Any

import torch

from ropelens.errors import UnsupportedModelError
from ropelens.spec.surface import running_model

__all__ = ["frequency_dtype", "rotary_modules", "rotary_state_kept"]

# the attribute ropelens keeps its bridge-free view of the HF model under
# (ropelens.backends.sdpa_capture.hf_view): its rotary modules hold state of their own
_HF_VIEW = "_ropelens_hf_view"


def rotary_modules(hf: torch.nn.Module) -> list[torch.nn.Module]:
    """The text rotary modules of ``hf`` (without a bridge's wrappers or a vision tower's)."""
    # a vision tower's rotary (Qwen2-VL's, on image patches) comes first in the module tree and is
    # not the text's
    names = [(m, type(m).__name__.lower()) for _, m in hf.named_modules()]
    return [
        m for m, name in names if "rotary" in name and "bridge" not in name and "vision" not in name
    ]


def frequency_dtype(modules: list[torch.nn.Module]) -> torch.dtype:
    """The dtype ``modules`` (rotary modules) hold their frequencies in: float32 as HF builds and
    loads them, 16 bits in a model cast whole with ``.to(dtype)``; float32 where none holds any."""
    for module in modules:
        for name, buffer in module.named_buffers(recurse=False):
            if "inv_freq" in name and buffer.is_floating_point():
                return buffer.dtype
    return torch.float32


def _hf_tree_and_view(model: Any) -> tuple[torch.nn.Module | None, torch.nn.Module | None]:
    """The HF model under ``model`` and ropelens's view of it; None for what is not a module (the
    caller refuses it in its own words)."""
    model = running_model(model)
    hf = getattr(model, "original_model", None)
    hf = hf if hf is not None else model
    view = getattr(model, "__dict__", {}).get(_HF_VIEW)
    return (
        hf if isinstance(hf, torch.nn.Module) else None,
        view if isinstance(view, torch.nn.Module) else None,
    )


def _sync_views(hf: torch.nn.Module | None, view: torch.nn.Module | None) -> None:
    """Give each rotary module of ``view`` the attributes of the model's module whose buffers it
    shares: a shallow copy keeps its own ``max_seq_len_cached`` beside the model's frequencies, and
    a copy made while an input had grown them would never grow them again."""
    if hf is None or view is None:
        return
    twins = {id(m._buffers): m for m in rotary_modules(hf)}
    for copy in rotary_modules(view):
        twin = twins.get(id(copy._buffers))
        if twin is None or twin is copy:
            continue
        attrs = {k: v for k, v in vars(twin).items() if not k.startswith("_")}
        for k in [k for k in vars(copy) if not k.startswith("_") and k not in attrs]:
            delattr(copy, k)
        copy.__dict__.update(attrs)


def _state(module: torch.nn.Module) -> tuple[dict, dict, dict]:
    """(buffers by name, public attributes, a copy of every tensor's values by id)."""
    buffers = dict(module._buffers)
    attrs = {k: v for k, v in vars(module).items() if not k.startswith("_")}
    values = {
        id(t): t.detach().clone()
        for t in [*buffers.values(), *attrs.values()]
        if isinstance(t, torch.Tensor) and not t.is_meta  # a meta tensor holds no values
    }
    return buffers, attrs, values


def _restore(module: torch.nn.Module, state: tuple[dict, dict, dict]) -> None:
    buffers, attrs, values = state
    module._buffers.clear()
    module._buffers.update(buffers)
    for k in [k for k in vars(module) if not k.startswith("_") and k not in attrs]:
        delattr(module, k)  # what a forward added (LongRoPE's long_inv_freq)
    module.__dict__.update(attrs)
    with torch.no_grad():
        for t in [*buffers.values(), *attrs.values()]:
            # LongRoPE writes inv_freq in place: put the values back, leaving an unchanged tensor's
            # version alone (caches key on it)
            if id(t) in values and not torch.equal(t, values[id(t)]):
                t.copy_(values[id(t)])


def _is_dynamic(module: torch.nn.Module) -> bool:
    rope_type = getattr(module, "rope_type", None)
    types = rope_type.values() if isinstance(rope_type, dict) else [rope_type]
    return any(isinstance(t, str) and "dynamic" in t for t in types)


def _reset(module: torch.nn.Module) -> None:
    """HF's dynamic NTK as a fresh model holds it: its forward on one position (within the native
    context) puts back the original frequencies and cached length.

    A module whose forward does not take HF's ``(x, position_ids[, layer_type])`` is left as it is;
    one that takes them and fails is refused, naming the module and its error (running on would
    rotate by whatever frequencies an earlier input left)."""
    try:
        signature = inspect.signature(module.forward)
    except (TypeError, ValueError):
        return
    parameters = signature.parameters
    buffer = next((b for b in module.buffers() if b.is_floating_point()), None)
    device = buffer.device if buffer is not None else torch.device("cpu")
    positions = torch.zeros(1, 1, dtype=torch.long, device=device)
    hidden = torch.zeros(1, 1, 1, 1, device=device)
    rope_type = getattr(module, "rope_type", None)
    layer_types = (
        sorted(rope_type) if isinstance(rope_type, dict) and "layer_type" in parameters else [None]
    )
    with torch.no_grad():
        for layer_type in layer_types:
            args = (hidden, positions) if layer_type is None else (hidden, positions, layer_type)
            try:
                signature.bind(*args)
            except TypeError:  # not HF's signature: nothing ropelens knows how to reset
                return
            try:
                module.forward(*args)
            except Exception as error:
                where = "" if layer_type is None else f" (layer type {layer_type!r})"
                raise UnsupportedModelError(
                    f"{type(module).__name__}{where} could not be reset to a fresh model's dynamic "
                    f"RoPE frequencies: its forward on one position raised "
                    f"{type(error).__name__}: {error}; ropelens cannot start its runs from a "
                    "fresh model's rotary state with this module"
                ) from error


@contextlib.contextmanager
def rotary_state_kept(model: Any) -> Iterator[None]:
    """A block that starts with ``model``'s rotary modules as a fresh model holds them and ends with
    every buffer and attribute of them as it was before the block (see the module doc).

    Nested blocks are fine: each puts back what it found.
    """
    hf, view = _hf_tree_and_view(model)
    states = [] if hf is None else [(m, _state(m)) for m in rotary_modules(hf)]
    try:
        for m, _ in states:
            if _is_dynamic(m):
                _reset(m)
        _sync_views(hf, view)
        yield
    finally:
        for m, state in reversed(states):
            _restore(m, state)
        # a view made inside the block copied the state the block ran in
        _sync_views(*_hf_tree_and_view(model))
