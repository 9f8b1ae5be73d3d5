"""Serial numbers for objects: a name that, unlike ``id()``, is never given to another object.

CPython hands a freed object's id to the next one made at its address, so a cache keyed by the ids
of hooks, forwards or modeling functions can read a new object as the one before it. The
verification fingerprint and the engine's readiness check name objects by :func:`object_serial`.
"""

from __future__ import annotations

import functools
import itertools
import threading
import weakref
from typing import Any

__all__ = ["object_serial"]

# serial numbers of the objects a fingerprint names (functions, forwards, hooks): id() -> (a weak
# reference to the object, or the object itself where it takes none, and its serial)
_SERIALS: dict[int, tuple[Any, int]] = {}
_NEXT_SERIAL = itertools.count()
_SERIALS_LOCK = threading.RLock()  # a callback can run, on a collection, inside the lock


def _forget_serial(key: int, ref: weakref.ref) -> None:
    """A weak reference's callback: its object is freed, so its entry goes (unless its id already
    names a newer object)."""
    with _SERIALS_LOCK:
        if _SERIALS.get(key, (None,))[0] is ref:
            del _SERIALS[key]


def object_serial(obj: Any) -> int:
    """A number naming ``obj`` for as long as it lives and never given to another object, unlike
    ``id(obj)``: CPython hands a freed object's id to the next one made at its address, so a hook
    removed and another installed could read as the same one. Objects that take no weak reference
    (None, builtins) are held, and keep their number, for as long as the process runs."""
    key = id(obj)
    with _SERIALS_LOCK:
        known = _SERIALS.get(key)
        if known is not None:
            held, serial = known
            if (held() if isinstance(held, weakref.ref) else held) is obj:
                return serial
        serial = next(_NEXT_SERIAL)
        try:
            held = weakref.ref(obj, functools.partial(_forget_serial, key))
        except TypeError:  # takes no weak reference: held (a builtin, None, a small constant)
            held = obj
        _SERIALS[key] = (held, serial)
        return serial
