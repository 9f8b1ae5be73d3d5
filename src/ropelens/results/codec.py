"""A dataclass's fields to JSON and back, each written and read as its type says.

Every result is a frozen dataclass; :func:`fields_to_dict` and :func:`fields_from_dict` write and
read it from its field declarations alone, so a result class declares its fields and nothing more.
A field's type decides its JSON:

==================================================  ==============================================
type                                                JSON
==================================================  ==============================================
``Tensor``, ``Float[Tensor, "..."]``, ...            nested lists; read back with the dtype the type
                                                    names (``Float`` float64, ``Int`` int64,
                                                    ``Float32`` float32, ``Bool`` bool); a field
                                                    declared with ``metadata=BASE64`` is written as
                                                    base64 float32 (exact, 4× smaller)
a class with ``to_dict``/``from_dict``               its own dict (``RopeSpec``, ``Bands``,
(``RopeSpec``, ``Bands``, ``Provenance``,            ``Provenance``, ``Moments``, nested results)
``Moments``, a nested result)
any other dataclass                                  its fields, by these same rules
``tuple[X, ...]``, ``tuple[A, B]``, ``list[X]``      a list, each item by its type
``dict[K, V]``                                       an object; int keys as text, tuple keys joined
                                                    by ``/`` (``("q", "pre")`` → ``"q/pre"``)
``X | None``                                         ``null`` or ``X``
``int``, ``float``, ``str``, ``bool``, ``Any``       themselves
==================================================  ==============================================

Reading checks each value against its type before anything is built from it: a tensor must be a
rectangular array of numbers of its dtype (whole numbers for ``Int``, true/false for ``Bool``) with
the number of axes its jaxtyping type names, and tensor fields that name the same axis
(``" n_dist"``) must agree on its size; a fixed tuple has its length, a literal one of its values, a
class that reads its own dict gets one whose fields have their types. Anything else is an
:class:`~ropelens.errors.InputError` naming the field
(``FrequencyUsage.spec.layers[3].inv_freq[2]``), what it holds and what was expected, so a result
file edited by hand is refused in one line rather than failing in arithmetic later.
"""

from __future__ import annotations

import binascii
import collections.abc
import dataclasses
import functools
import math
import types
import typing
from collections.abc import Callable, Mapping
from typing import Any

import torch
from torch import Tensor

from ropelens.errors import InputError
from ropelens.results.serialize import tensor_from_json, tensor_to_json

__all__ = [
    "BASE64",
    "check_fields",
    "decode",
    "encode",
    "field_types",
    "fields_from_dict",
    "fields_to_dict",
]

# field metadata: write this tensor as base64 float32 rather than as nested lists
BASE64: Mapping[str, str] = types.MappingProxyType({"json": "base64"})
_KEY_SEPARATOR = "/"  # joins the parts of a tuple key: ("q", "pre") is written "q/pre"
# a jaxtyping dtype category names many dtypes; a file is read back in the widest of them
_WIDEST = ("float64", "int64", "bool")


@functools.cache
def field_types(cls: type) -> dict[str, Any]:
    """The declared type of each field of dataclass ``cls`` (string annotations resolved)."""
    return typing.get_type_hints(cls)


def fields_to_dict(obj: Any) -> dict[str, Any]:
    """The fields ``obj`` is built from (``init=True``), each as JSON-ready values its type says."""
    hints = field_types(type(obj))
    return {
        f.name: encode(getattr(obj, f.name), hints[f.name], base64=f.metadata == BASE64)
        for f in dataclasses.fields(obj)
        if f.init
    }


def fields_from_dict(
    cls: type,
    data: Mapping[str, Any],
    ignore: tuple[str, ...] = (),
    *,
    where: str | None = None,
    check: Callable[[dict[str, Any], str], None] | None = None,
) -> Any:
    """Build dataclass ``cls`` from :func:`fields_to_dict`'s output; keys in ``ignore`` are skipped.

    Every value is checked against its field's declared type before the class is built
    (:func:`decode`), and tensor fields whose types name the same axis against each other; then
    ``check(values, where)``, where given, checks how the fields relate. A missing field takes its
    default; a missing field without one, a key ``cls`` has no field for, or a value its type does
    not read is an :class:`InputError` naming ``where`` (default: the class's name) and the field.
    """
    where = where or cls.__name__
    if not isinstance(data, Mapping):
        raise InputError(f"{where} is {_found(data)}, expected a {cls.__name__} object")
    hints = field_types(cls)
    init_fields = [f for f in dataclasses.fields(cls) if f.init]
    unknown = sorted(set(data) - {f.name for f in init_fields} - set(ignore))
    if unknown:
        raise InputError(
            f"{where} has no field {unknown[0]!r} (fields: "
            f"{', '.join(f.name for f in init_fields)}): pass a file this ropelens wrote"
        )
    values = {}
    for f in init_fields:
        if f.name in data:
            values[f.name] = decode(data[f.name], hints[f.name], where=f"{where}.{f.name}")
        elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            raise InputError(
                f"{where} needs {f.name!r}, which the file lacks: pass a file this "
                "ropelens wrote, whole"
            )
    _check_same_sizes(cls, values, where)
    if check is not None:
        check(values, where)
    try:
        return cls(**values)
    except InputError as e:
        raise InputError(f"{where}: {e}") from e


def check_fields(cls: type, data: Any, *, where: str | None = None) -> None:
    """Check the values ``data`` holds for dataclass ``cls``'s fields against their declared
    types, as :func:`fields_from_dict` does, without building ``cls``: for a class that reads its
    dict itself first (an older layout brought up to date), so that its reader meets no value of
    the wrong type. Keys ``cls`` has no field for are left to that reader."""
    where = where or cls.__name__
    if not isinstance(data, Mapping):
        raise InputError(f"{where} is {_found(data)}, expected a {cls.__name__} object")
    hints = field_types(cls)
    values = {
        f.name: decode(data[f.name], hints[f.name], where=f"{where}.{f.name}")
        for f in dataclasses.fields(cls)
        if f.init and f.name in data
    }
    _check_same_sizes(cls, values, where)


# ---------------------------------------------------------------------------------- writing
def encode(value: Any, hint: Any, *, base64: bool = False) -> Any:
    """``value`` as JSON-ready data, as its declared type ``hint`` says it is written."""
    if value is None:
        return None
    if isinstance(value, Tensor):
        return tensor_to_json(value) if base64 else value.tolist()
    if hasattr(value, "to_dict"):
        return value.to_dict()
    if dataclasses.is_dataclass(value):
        return fields_to_dict(value)
    origin, args = _parts(hint)
    if isinstance(value, dict):
        value_hint = args[1] if origin is dict and len(args) == 2 else Any
        return {_encode_key(k): encode(v, value_hint) for k, v in value.items()}
    if isinstance(value, (tuple, list)):
        return [encode(item, item_hint) for item, item_hint in zip(value, _item_hints(hint, value))]
    return value


def _encode_key(key: Any) -> str:
    if isinstance(key, tuple):
        return _KEY_SEPARATOR.join(map(str, key))
    return key if isinstance(key, str) else str(key)


# ---------------------------------------------------------------------------------- reading
def decode(data: Any, hint: Any, *, where: str = "value") -> Any:
    """The value of declared type ``hint`` that :func:`encode` wrote as ``data``, checked against
    that type first: a value of another type, a tensor that is not a rectangular array of numbers
    of its dtype or has another number of axes than its type names, a tuple of another length, a
    literal outside its choices, a key that does not read as its type is an :class:`InputError`
    naming ``where`` (the field, e.g. ``FrequencyUsage.spec.layers[3].inv_freq``), what was found
    and what was expected."""
    if hint is Any or hint is None or hint is object:
        return data
    origin, args = _parts(hint)
    if origin in (typing.Union, types.UnionType):
        return _decode_union(data, args, where)
    if data is None:
        raise InputError(f"{where} is null, expected {_expected(hint)}")
    if origin is typing.Literal:
        if data not in args:
            raise InputError(
                f"{where} is {_found(data)}, expected one of {', '.join(map(repr, args))}"
            )
        return data
    if _is_tensor_type(hint):
        return _decode_tensor(data, hint, where)
    if origin in (dict, Mapping, collections.abc.Mapping):
        return _decode_dict(data, *(args or (Any, Any)), where=where)
    if origin in (tuple, list, collections.abc.Sequence):
        return _decode_sequence(data, hint, origin, where)
    if isinstance(hint, type):
        return _decode_class(data, hint, where)
    return data


def _decode_union(data: Any, arms: tuple[Any, ...], where: str) -> Any:
    """``data`` as the first arm of a union it reads as (null where the union allows None)."""
    if data is None and type(None) in arms:
        return None
    candidates = [a for a in arms if a is not type(None)]
    if len(candidates) == 1:
        return decode(data, candidates[0], where=where)
    for arm in candidates:
        try:
            return decode(data, arm, where=where)
        except InputError:
            continue
    raise InputError(
        f"{where} is {_found(data)}, expected {' or '.join(_expected(a) for a in arms)}"
    )


def _decode_sequence(data: Any, hint: Any, origin: Any, where: str) -> Any:
    if not isinstance(data, list):
        raise InputError(f"{where} is {_found(data)}, expected {_expected(hint)}")
    _, args = _parts(hint)
    if origin is tuple and args and args[-1] is not Ellipsis and len(data) != len(args):
        raise InputError(f"{where} is {_found(data)}, expected {_expected(hint)}")
    items = [
        decode(item, h, where=f"{where}[{i}]")
        for i, (item, h) in enumerate(zip(data, _item_hints(hint, data)))
    ]
    return tuple(items) if origin is tuple else items


def _decode_class(data: Any, cls: type, where: str) -> Any:
    if cls is bool:
        if not isinstance(data, bool):
            raise InputError(f"{where} is {_found(data)}, expected true or false")
        return data
    if cls is int:
        if isinstance(data, bool) or not (
            isinstance(data, int) or (isinstance(data, float) and data.is_integer())
        ):
            raise InputError(f"{where} is {_found(data)}, expected an integer")
        return int(data)
    if cls is float:
        if isinstance(data, bool) or not isinstance(data, int | float):
            raise InputError(f"{where} is {_found(data)}, expected a number")
        return float(data)
    if cls is str:
        if not isinstance(data, str):
            raise InputError(f"{where} is {_found(data)}, expected a string")
        return data
    if cls in (list, tuple) and not isinstance(data, list):
        raise InputError(f"{where} is {_found(data)}, expected a list")
    if cls is dict and not isinstance(data, Mapping):
        raise InputError(f"{where} is {_found(data)}, expected an object")
    from_dict = getattr(cls, "from_dict", None)
    if from_dict is not None:
        return _from_own_dict(data, cls, from_dict, where)
    if dataclasses.is_dataclass(cls):
        return fields_from_dict(cls, data, where=where)
    return data


def _from_own_dict(data: Any, cls: type, from_dict: Any, where: str) -> Any:
    """A class that reads its own dict (``RopeSpec``, ``Bands``, ``Provenance``, ``Moments``,
    a nested result): the keys it declares as dataclass fields are checked against their types
    first, and a dict its reader still cannot read is refused naming ``where``."""
    if not isinstance(data, Mapping):
        raise InputError(f"{where} is {_found(data)}, expected a {cls.__name__} object")
    if dataclasses.is_dataclass(cls):
        hints = field_types(cls)
        checked = {
            f.name: decode(data[f.name], hints[f.name], where=f"{where}.{f.name}")
            for f in dataclasses.fields(cls)
            if f.init and f.name in data
        }
        _check_same_sizes(cls, checked, where)
        if hasattr(cls, "merge"):  # a sum (Moments): its tensors add, so they share one shape
            _check_one_shape(checked, where)
    try:
        return from_dict(data)
    except InputError as e:
        raise InputError(f"{where}: {e}") from e
    except (KeyError, TypeError, ValueError, IndexError, RuntimeError, AttributeError) as e:
        raise InputError(
            f"{where} does not read as a {cls.__name__} ({type(e).__name__}: {e})"
        ) from e


def _decode_dict(data: Any, key_hint: Any, value_hint: Any, *, where: str) -> dict[Any, Any]:
    """A dict from a JSON object; tuple keys also from ``[*key, value]`` rows (an older layout)."""
    key_origin, key_args = _parts(key_hint)
    if isinstance(data, list) and key_origin is tuple:
        n_parts = len(key_args)
        out = {}
        for i, row in enumerate(data):
            if not isinstance(row, list) or len(row) != n_parts + 1:
                raise InputError(
                    f"{where}[{i}] is {_found(row)}, expected a row of {n_parts} key parts and "
                    "a value"
                )
            key = tuple(
                _decode_key(str(part), h, where) for part, h in zip(row[:n_parts], key_args)
            )
            out[key] = decode(row[n_parts], value_hint, where=f"{where}[{_encode_key(key)!r}]")
        return out
    if not isinstance(data, dict):
        raise InputError(f"{where} is {_found(data)}, expected an object")
    return {
        _decode_key(key, key_hint, where): decode(value, value_hint, where=f"{where}[{key!r}]")
        for key, value in data.items()
    }


def _decode_key(key: str, hint: Any, where: str) -> Any:
    origin, args = _parts(hint)
    if origin is tuple:
        parts = key.split(_KEY_SEPARATOR)
        if args and args[-1] is not Ellipsis and len(parts) != len(args):
            raise InputError(
                f"{where} has key {key!r}, expected {len(args)} parts joined by {_KEY_SEPARATOR!r}"
            )
        return tuple(
            _decode_key(part, h, where) for part, h in zip(parts, _item_hints(hint, parts))
        )
    if hint in (int, float):
        try:
            return hint(key)
        except ValueError as e:
            raise InputError(
                f"{where} has key {key!r}, expected {'an integer' if hint is int else 'a number'}"
            ) from e
    if typing.get_origin(hint) is typing.Literal and key not in typing.get_args(hint):
        raise InputError(
            f"{where} has key {key!r}, expected one of "
            f"{', '.join(map(repr, typing.get_args(hint)))}"
        )
    return key


def _decode_tensor(data: Any, hint: Any, where: str) -> Tensor:
    dtype = _tensor_dtype(hint)
    if isinstance(data, dict):
        tensor = _decode_base64(data, where)
    else:
        tensor = _decode_array(data, where, dtype)
    _check_rank(tensor, hint, where)
    return tensor


def _decode_array(data: Any, where: str, dtype: torch.dtype) -> Tensor:
    """A tensor of ``dtype`` from nested lists, checked as :func:`_array_shape` says. torch reads
    a rectangular array of numbers at C speed; only where it refuses one, or an integer array holds
    a fraction, does the slower walk run, to name the first entry at fault."""
    if dtype == torch.bool or not isinstance(data, list):
        _array_shape(data, where, dtype)
        return torch.tensor(data, dtype=dtype)
    try:
        wide = torch.tensor(data, dtype=torch.float64)
        if not dtype.is_floating_point and not bool((wide == wide.round()).all()):
            _array_shape(data, where, dtype)  # names the fraction (or the NaN)
        tensor = wide.to(dtype) if dtype.is_floating_point else torch.tensor(data, dtype=dtype)
    except (TypeError, ValueError, RuntimeError, OverflowError) as e:
        if isinstance(e, InputError):
            raise
        _array_shape(data, where, dtype)  # raises, naming the entry at fault
        raise InputError(
            f"{where} does not read as a tensor of {str(dtype).removeprefix('torch.')} ({e})"
        ) from e
    shape = _array_shape_fast(data)
    return tensor.reshape(shape) if tuple(tensor.shape) != shape else tensor


def _array_shape_fast(data: Any) -> tuple[int, ...]:
    """The shape of rectangular nested lists, read down their first items (torch reads ``[[]]`` as
    shape (1, 0) and ``[]`` as (0,): both kept as written)."""
    shape = []
    while isinstance(data, list):
        shape.append(len(data))
        if not data:
            break
        data = data[0]
    return tuple(shape)


def _decode_base64(data: dict[str, Any], where: str) -> Tensor:
    shape = data.get("shape")
    if (
        set(data) != {"shape", "dtype", "base64"}
        or data.get("dtype") != "float32"
        or not isinstance(data.get("base64"), str)
        or not isinstance(shape, list)
        or not all(isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in shape)
    ):
        raise InputError(
            f"{where} is {_found(data)}, expected a tensor: nested lists of numbers, or "
            '{"shape": [...], "dtype": "float32", "base64": ...}'
        )
    try:
        raw = binascii.a2b_base64(data["base64"].encode("ascii"), strict_mode=True)
    except (binascii.Error, UnicodeEncodeError) as e:
        raise InputError(f"{where} holds base64 that does not decode ({e})") from e
    want = 4 * math.prod(shape)
    if len(raw) != want:
        raise InputError(
            f"{where} holds {len(raw)} bytes of float32, expected {want} for shape {tuple(shape)}"
        )
    return tensor_from_json(data)


def _array_shape(data: Any, where: str, dtype: torch.dtype) -> tuple[int, ...]:
    """The shape of nested lists ``data``, checked rectangular with numbers of ``dtype`` at the
    leaves (an integer dtype takes whole numbers, bool true and false)."""
    if not isinstance(data, list):
        _check_leaf(data, where, dtype)
        return ()
    if not data:
        return (0,)
    shapes = [_array_shape(item, f"{where}[{i}]", dtype) for i, item in enumerate(data)]
    for i, shape in enumerate(shapes):
        if shape != shapes[0]:
            raise InputError(
                f"{where}[{i}] has shape {shape}, expected {shapes[0]} as {where}[0] has "
                "(a tensor's rows all have one length)"
            )
    return (len(data), *shapes[0])


def _check_leaf(value: Any, where: str, dtype: torch.dtype) -> None:
    if dtype == torch.bool:
        if not isinstance(value, bool):
            raise InputError(f"{where} is {_found(value)}, expected true or false")
    elif isinstance(value, bool) or not isinstance(value, int | float):
        raise InputError(f"{where} is {_found(value)}, expected a number")
    elif not dtype.is_floating_point and not (isinstance(value, int) or value.is_integer()):
        raise InputError(f"{where} is {_found(value)}, expected a whole number")


def _check_rank(tensor: Tensor, hint: Any, where: str) -> None:
    """The number of axes (and any fixed size) the tensor's jaxtyping type names."""
    dims = getattr(hint, "dims", None)
    if not isinstance(dims, tuple) or any(_is_variadic(d) for d in dims):
        return
    axes = " ".join(_dim_text(d) for d in dims)
    if tensor.ndim != len(dims) or any(
        getattr(d, "size", None) is not None and n != d.size for n, d in zip(tensor.shape, dims)
    ):
        raise InputError(
            f"{where} has shape {tuple(tensor.shape)}, expected {len(dims)} axes [{axes}]"
        )


def _is_variadic(dim: Any) -> bool:
    return "Variadic" in type(dim).__name__ or "Anonymous" in type(dim).__name__


def _dim_text(dim: Any) -> str:
    size = getattr(dim, "size", None)
    return str(size) if isinstance(size, int) else str(getattr(dim, "name", "?"))


def _named_sizes(hint: Any, tensor: Tensor) -> list[tuple[str, int, int]]:
    """(name, axis index, size) of each named axis of a tensor of jaxtyping type ``hint``."""
    origin, args = _parts(hint)
    if origin in (typing.Union, types.UnionType):
        return next((_named_sizes(a, tensor) for a in args if _is_tensor_type(a)), [])
    dims = getattr(hint, "dims", None)
    if not isinstance(dims, tuple) or any(_is_variadic(d) for d in dims):
        return []
    return [
        (d.name, i, n)
        for i, (d, n) in enumerate(zip(dims, tensor.shape))
        if isinstance(getattr(d, "name", None), str) and d.name not in ("_", "")
    ]


def _check_same_sizes(cls: type, values: Mapping[str, Any], where: str) -> None:
    """Tensor axes of ``cls``'s fields whose types give them one name (``mean: Float[Tensor,
    " n_dist"]`` and ``count: Int[Tensor, " n_dist"]``; both axes of ``Float[Tensor, "n_pos
    n_pos"]``) have one size."""
    hints = field_types(cls)
    seen: dict[str, tuple[str, int, int]] = {}
    for name, value in values.items():
        if not isinstance(value, Tensor):
            continue
        for axis, index, size in _named_sizes(hints[name], value):
            first = seen.setdefault(axis, (name, index, size))
            if first[2] != size:
                raise InputError(
                    f"{where}.{name} has {size} along axis {index} ({axis!r}), expected "
                    f"{first[2]} as {where}.{first[0]} has along axis {first[1]}"
                )


def _check_one_shape(values: Mapping[str, Any], where: str) -> None:
    tensors = [(n, v) for n, v in values.items() if isinstance(v, Tensor)]
    for name, t in tensors[1:]:
        if t.shape != tensors[0][1].shape:
            raise InputError(
                f"{where}.{name} has shape {tuple(t.shape)}, expected "
                f"{tuple(tensors[0][1].shape)} as {where}.{tensors[0][0]} has"
            )


def _tensor_dtype(hint: Any) -> torch.dtype:
    """The dtype a tensor of type ``hint`` is read in: the one it names, else the widest."""
    dtypes = tuple(getattr(hint, "dtypes", ()))
    if len(dtypes) == 1:
        return getattr(torch, dtypes[0])
    for name in _WIDEST:
        if name in dtypes:
            return getattr(torch, name)
    return torch.float64


# ---------------------------------------------------------------------------------- messages
def _found(data: Any) -> str:
    """What a JSON value is, in a few words (``the string 'abc'``, ``a list of 3``)."""
    if data is None:
        return "null"
    if isinstance(data, bool):
        return str(data).lower()
    if isinstance(data, int | float):
        return f"the number {data!r}"
    if isinstance(data, str):
        shown = data if len(data) <= 40 else data[:37] + "..."
        return f"the string {shown!r}"
    if isinstance(data, list):
        return f"a list of {len(data)}"
    if isinstance(data, Mapping):
        keys = list(data)
        shown = ", ".join(map(str, keys[:4])) + (", ..." if len(keys) > 4 else "")
        return f"an object with keys {shown}" if keys else "an empty object"
    return type(data).__name__


def _expected(hint: Any) -> str:
    """A declared type in words (``a list of integers``, ``a tensor``)."""
    origin, args = _parts(hint)
    if hint is type(None):
        return "null"
    if _is_tensor_type(hint):
        return "a tensor (nested lists of numbers)"
    if origin in (typing.Union, types.UnionType):
        return " or ".join(_expected(a) for a in args)
    if origin is typing.Literal:
        return "one of " + ", ".join(map(repr, args))
    if origin is tuple and args and args[-1] is not Ellipsis:
        return f"a list of {len(args)} ({', '.join(_expected(a) for a in args)})"
    if origin in (tuple, list, collections.abc.Sequence):
        return f"a list of {_expected(args[0]) if args else 'values'}"
    if origin in (dict, Mapping, collections.abc.Mapping):
        return "an object"
    words = {int: "an integer", float: "a number", str: "a string", bool: "true or false"}
    if hint in words:
        return words[hint]
    return f"a {getattr(hint, '__name__', hint)} object"


# ---------------------------------------------------------------------------------- types
def _parts(hint: Any) -> tuple[Any, tuple[Any, ...]]:
    return typing.get_origin(hint), typing.get_args(hint)


def _is_tensor_type(hint: Any) -> bool:
    """``Tensor`` itself or a jaxtyping ``Float[Tensor, "..."]`` (whose array type is Tensor)."""
    return hint is Tensor or getattr(hint, "array_type", None) is Tensor


def _item_hints(hint: Any, items: Any) -> list[Any]:
    """The declared type of each item of a tuple or list ``items`` of type ``hint``."""
    origin, args = _parts(hint)
    if origin is tuple and args and args[-1] is not Ellipsis:
        return list(args)
    item = args[0] if origin in (tuple, list) and args else Any
    return [item] * len(items)
