"""object_serial: the number a verification fingerprint names a hook or forward by, kept for as
long as the object lives, never handed to another, and forgotten once the object is freed."""

from __future__ import annotations

import gc

from ropelens.backends import serials
from ropelens.backends.serials import object_serial


def test_a_living_object_keeps_its_number_and_a_new_one_at_its_address_gets_another():
    numbers: dict[int, int] = {}  # id -> the number its object had
    reused = 0
    for i in range(200):
        hook = eval(f"lambda module, args: None  # hook {i}")  # a new function each time
        number = object_serial(hook)
        assert object_serial(hook) == number  # the same while it lives
        if id(hook) in numbers:
            reused += 1
            assert number != numbers[id(hook)]  # a freed one's address, not its number
        numbers[id(hook)] = number
        del hook
    assert reused > 0  # addresses were reused, so the check above ran
    assert len(set(numbers.values())) == len(numbers)


def test_a_freed_object_leaves_no_entry_and_one_without_weak_references_is_held():
    gc.collect()
    before = len(serials._SERIALS)
    for i in range(50):
        object_serial(eval(f"lambda: {i}"))
    gc.collect()
    assert len(serials._SERIALS) == before  # no entry outlives its object
    assert object_serial(None) == object_serial(None)
    assert object_serial(len) == object_serial(len)  # builtins take no weak reference
    assert object_serial(None) != object_serial(len)
