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
"""

from __future__ import annotations

import dataclasses
import functools
import types
import typing
from collections.abc import Mapping
from typing import Any

import torch
from torch import Tensor

from ropelens.errors import InputError
from ropelens.results.serialize import tensor_from_json, tensor_to_json

__all__ = ["BASE64", "decode", "encode", "field_types", "fields_from_dict", "fields_to_dict"]

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


def fields_from_dict(cls: type, data: Mapping[str, Any], ignore: tuple[str, ...] = ()) -> Any:
    """Build dataclass ``cls`` from :func:`fields_to_dict`'s output; keys in ``ignore`` are skipped.

    A missing field takes its default; a missing field without one, or a key ``cls`` has no field
    for, is an :class:`InputError` naming it.
    """
    if not isinstance(data, Mapping):
        raise InputError(f"{cls.__name__} is read from a JSON object, got {type(data).__name__}")
    hints = field_types(cls)
    init_fields = [f for f in dataclasses.fields(cls) if f.init]
    unknown = sorted(set(data) - {f.name for f in init_fields} - set(ignore))
    if unknown:
        raise InputError(
            f"{cls.__name__} has no field {unknown[0]!r} (fields: "
            f"{', '.join(f.name for f in init_fields)}): pass a file this ropelens wrote"
        )
    values = {}
    for f in init_fields:
        if f.name in data:
            values[f.name] = decode(data[f.name], hints[f.name], where=f"{cls.__name__}.{f.name}")
        elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            raise InputError(
                f"{cls.__name__} needs {f.name!r}, which the file lacks: pass a file this "
                "ropelens wrote, whole"
            )
    return cls(**values)


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
    """The value of declared type ``hint`` that :func:`encode` wrote as ``data``."""
    if hint is Any or hint is None:
        return data
    if data is None:
        return None
    origin, args = _parts(hint)
    if origin in (typing.Union, types.UnionType):
        arms = [a for a in args if a is not type(None)]
        return decode(data, arms[0] if len(arms) == 1 else Any, where=where)
    if origin is typing.Literal:
        return data
    if _is_tensor_type(hint):
        return _decode_tensor(data, hint)
    if origin is dict:
        return _decode_dict(data, *(args or (Any, Any)), where=where)
    if origin in (tuple, list):
        items = [decode(item, h, where=where) for item, h in zip(data, _item_hints(hint, data))]
        return tuple(items) if origin is tuple else items
    if isinstance(hint, type):
        return _decode_class(data, hint, where)
    return data


def _decode_class(data: Any, cls: type, where: str) -> Any:
    from_dict = getattr(cls, "from_dict", None)
    if from_dict is not None:
        return from_dict(data)
    if dataclasses.is_dataclass(cls):
        return fields_from_dict(cls, data)
    if cls in (int, float, str, bool):
        try:
            return cls(data)
        except (TypeError, ValueError) as e:
            raise InputError(f"{where} should be {cls.__name__}, got {data!r}") from e
    return data


def _decode_dict(data: Any, key_hint: Any, value_hint: Any, *, where: str) -> dict[Any, Any]:
    """A dict from a JSON object; tuple keys also from ``[*key, value]`` rows (an older layout)."""
    key_origin, key_args = _parts(key_hint)
    if isinstance(data, list) and key_origin is tuple:
        n_parts = len(key_args)
        return {
            tuple(_decode_key(str(part), h) for part, h in zip(row[:n_parts], key_args)): decode(
                row[n_parts], value_hint, where=where
            )
            for row in data
        }
    return {
        _decode_key(key, key_hint): decode(value, value_hint, where=where)
        for key, value in data.items()
    }


def _decode_key(key: str, hint: Any) -> Any:
    origin, args = _parts(hint)
    if origin is tuple:
        parts = key.split(_KEY_SEPARATOR)
        return tuple(_decode_key(part, h) for part, h in zip(parts, _item_hints(hint, parts)))
    if hint in (int, float):
        return hint(key)
    return key


def _decode_tensor(data: Any, hint: Any) -> Tensor:
    if isinstance(data, dict) and "base64" in data:
        return tensor_from_json(data)
    return torch.tensor(data, dtype=_tensor_dtype(hint))


def _tensor_dtype(hint: Any) -> torch.dtype:
    """The dtype a tensor of type ``hint`` is read in: the one it names, else the widest."""
    dtypes = tuple(getattr(hint, "dtypes", ()))
    if len(dtypes) == 1:
        return getattr(torch, dtypes[0])
    for name in _WIDEST:
        if name in dtypes:
            return getattr(torch, name)
    return torch.float64


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
