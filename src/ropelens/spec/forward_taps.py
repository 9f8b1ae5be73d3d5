"""Taps on an HF model's own forward: its attention function's inputs, and its rotation functions.

ropelens reads q, k, masks and rotations where the model itself computes them: :func:`attention_tap`
swaps a modeling module's attention functions for tapped ones while a block runs,
:func:`rotation_functions` lists the rotations a modeling module may apply to q and k, and
:func:`outside_indexers` keeps a sparse-attention indexer's own rotation from being filed as its
layer's.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import inspect
from collections.abc import Callable, Iterator

__all__ = [
    "attention_tap",
    "complex_positions_axis",
    "layer_taps",
    "outside_indexers",
    "probe_forward",
    "rotation_functions",
    "single_rotation",
    "table_rotation",
]

_TAPPED = "_ropelens_attention_tap"


class _TappedFunctions:
    """A modeling module's attention-function registry whose functions are handed out tapped."""

    def __init__(self, inner, wrap: Callable[[Callable], Callable]) -> None:
        self._inner, self._wrap = inner, wrap

    def get_interface(self, impl, default):
        return self._wrap(self._inner.get_interface(impl, default))

    def __getitem__(self, key):
        return self._wrap(self._inner[key])

    def get(self, key, default=None):
        return self._wrap(self._inner.get(key, default))

    def __contains__(self, key) -> bool:
        return key in self._inner

    def __getattr__(self, name: str):
        return getattr(self._inner, name)


@contextlib.contextmanager
def attention_tap(
    modules, on_call: Callable[..., object], *, with_mask: bool = False
) -> Iterator[None]:
    """Call ``on_call(attention module, query, key)`` at every call of the attention function
    (eager, sdpa or any registered one) of the modeling modules of ``modules`` (HF attention
    modules), with the query ``[batch, head, pos, d]`` and key ``[batch, kv_head, pos, d]`` that
    enter its score (``with_mask``: and the attention mask it receives, a tensor or None, as a
    fourth argument).

    The modeling module's ``eager_attention_forward`` and its ``ALL_ATTENTION_FUNCTIONS`` registry
    are swapped for tapped ones while the block runs (the registry is not changed: other modules
    and later calls see the original functions).
    """

    def wrap(fn):
        if fn is None or getattr(fn, _TAPPED, False):
            return fn

        @functools.wraps(fn)
        def tapped(module, query, key, *args, **kwargs):
            if with_mask:  # HF calls (module, query, key, value, attention_mask, ...)
                on_call(
                    module, query, key, args[1] if len(args) > 1 else kwargs.get("attention_mask")
                )
            else:
                on_call(module, query, key)
            return fn(module, query, key, *args, **kwargs)

        setattr(tapped, _TAPPED, True)
        return tapped

    saved = []
    for mod in {
        type(m).__module__: importlib.import_module(type(m).__module__) for m in modules
    }.values():
        for name, tapped in (
            ("eager_attention_forward", wrap),
            ("ALL_ATTENTION_FUNCTIONS", lambda reg: _TappedFunctions(reg, wrap)),
        ):
            orig = mod.__dict__.get(name)
            if orig is not None:
                saved.append((mod, name, orig))
                setattr(mod, name, tapped(orig))
    try:
        yield
    finally:
        for mod, name, orig in reversed(saved):
            setattr(mod, name, orig)


# the rotations a family's modeling module may apply to (q, k): Llama's form, DeepSeek V3's
# interleaved one, and DeepSeek V2's complex product (xq, xk, freqs_cis)
_ROTATION_NAMES = ("apply_rotary_pos_emb", "apply_rotary_pos_emb_interleave", "apply_rotary_emb")


def rotation_functions(mod) -> dict[str, Callable]:
    """The (q, k, ...) -> (q, k) rotation functions ``mod`` defines, by name, and the one-tensor
    (x, cos, sin, ...) -> x form Gemma 4 unified and Gemma 3n apply to q and k in turn."""
    out = {}
    for name in _ROTATION_NAMES:
        fn = getattr(mod, name, None)
        if fn is not None and (
            list(inspect.signature(fn).parameters)[:2] in (["q", "k"], ["xq", "xk"])
            or single_rotation(fn)
            or table_rotation(fn)
        ):
            out[name] = fn
    return out


def table_rotation(fn: Callable) -> bool:
    """Whether ``fn`` rotates one tensor by a sin and cos table and takes no head axis: GPT-J's and
    CodeGen's ``(tensor, sin, cos)``, applied to keys and then queries, ``[batch, pos, head,
    rotary_dim]``."""
    params = list(inspect.signature(fn).parameters)
    return len(params) == 3 and params[1:] in (["sin", "cos"], ["cos", "sin"])


def single_rotation(fn: Callable) -> bool:
    """Whether ``fn`` rotates one tensor by a (cos, sin) table: ``(x, cos, sin, ...,
    unsqueeze_dim=...)``."""
    params = inspect.signature(fn).parameters
    return list(params)[:3] == ["x", "cos", "sin"] and "unsqueeze_dim" in params


@functools.lru_cache(maxsize=16)
def complex_positions_axis(fn: Callable) -> int:
    """The position axis of the q and k a complex-product rotation ``(xq, xk, freqs_cis)`` takes: 2
    where they are ``[batch, head, pos, d]`` (DeepSeek V2), 1 where ``[batch, pos, head, d]`` (Llama
    4, which rotates before moving heads forward). Found by one call on a 2 × 2 input whose
    ``freqs_cis`` (``[batch, pos, d/2]``) turns position 1 only: the output changes along the
    position axis alone."""
    import torch

    x = torch.ones(1, 2, 2, 2)
    freqs = torch.polar(torch.ones(1, 2, 1), torch.tensor([0.0, 1.0]).view(1, 2, 1))
    out, _ = fn(x, x, freqs)
    return 1 if not torch.equal(out[0, 0], out[0, 1]) else 2


def outside_indexers(attns, current: list) -> list:
    """Hooks that set ``current[0]`` (the layer a rotation tap files calls under) to None while a
    sparse-attention indexer inside one of ``attns`` runs: its rotation of its own small q and k is
    not the layer's (DeepSeek V3.2's indexer rotates after the attention's own rotation, with the
    other pairing), and it leaves the layer as it found it. Returns the hook handles."""
    saved: list = []

    def enter(_m, _a) -> None:
        saved.append(current[0])
        current[0] = None

    def leave(_m, _a, _o) -> None:
        current[0] = saved.pop()

    handles = []
    for a in attns:
        for m in a.modules() if a is not None else ():
            if type(m).__name__.endswith("Indexer"):
                handles += [m.register_forward_pre_hook(enter), m.register_forward_hook(leave)]
    return handles


@contextlib.contextmanager
def layer_taps(
    view, attns, current: list, mod=None, patches: dict[str, Callable] | None = None
) -> Iterator[bool]:
    """While the block runs, ``current[0]`` is the layer of the attention module of ``view`` (an HF
    module tree) that is running (None outside them and inside a sparse-attention indexer), and
    ``mod``'s functions named in ``patches`` are the given ones; everything is undone on exit.
    ``attns`` lists each layer's attention module (None for a layer without one), whose classes find
    their copies in ``view``. Yields False (and taps nothing) where ``view`` does not hold one such
    module per attention layer."""
    kinds = {type(a) for a in attns if a is not None}
    mods = [m for m in view.modules() if type(m) in kinds]
    where = [i for i, a in enumerate(attns) if a is not None]
    if len(mods) != len(where):
        yield False
        return

    def enter(i):
        return lambda _m, _a: current.__setitem__(0, i)

    handles = [m.register_forward_pre_hook(enter(i)) for i, m in zip(where, mods, strict=True)]
    handles += [
        m.register_forward_hook(lambda _m, _a, _o: current.__setitem__(0, None)) for m in mods
    ]
    handles += outside_indexers(mods, current)
    saved = {n: getattr(mod, n) for n in patches or {}}
    for n, fn in (patches or {}).items():
        setattr(mod, n, fn)
    try:
        yield True
    finally:
        for n, fn in saved.items():
            setattr(mod, n, fn)
        for h in handles:
            h.remove()


def probe_forward(
    view,
    device,
    n: int,
    context: contextlib.AbstractContextManager | None = None,
    positions: list[int] | None = None,
) -> bool:
    """One forward of ``view`` (an HF causal LM) on ``n`` token ids past the few special ids a
    tokenizer puts first (a padding id may embed to zero, and a zero query shows no rotation), at
    ``positions`` (``n`` increasing position ids; default 0..n−1), without gradients and inside
    ``context``; False where the forward raises (a family this cannot run)."""
    import torch

    cfg = view.config.get_text_config() if hasattr(view.config, "get_text_config") else view.config
    vocab = int(getattr(cfg, "vocab_size", 0) or 8)
    ids = (
        (4 + (torch.arange(n) * 5 + 3) % max(vocab - 4, 1))
        .clamp_max(vocab - 1)
        .unsqueeze(0)
        .to(device)
    )
    kwargs = {} if positions is None else {"position_ids": torch.tensor([positions], device=device)}
    try:
        with torch.no_grad(), context or contextlib.nullcontext():
            view(ids, **kwargs)
    except Exception:
        return False
    return True
