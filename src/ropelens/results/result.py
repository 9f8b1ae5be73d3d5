"""The base of every ropelens result: one file format, one loader, one merge, one Jupyter view.

A result class declares its file once, in its class statement (``class FrequencyUsage(Result,
merge_same=(...), merge_sums=(...))``: the kind defaults to the class name, the format to 1), and
its content by its dataclass fields: :mod:`ropelens.results.codec` writes and reads each field as
its type says. :class:`Result` writes ``{"type": KIND, "format": FORMAT, ...}`` atomically, checks
both on reading, and registers the class under its kind when the class is created, so that
:func:`load_result` reads any result file whose class is imported without being told its class
(``ropelens.load_result`` imports every one first), and a report's ``report.json``.
"""

from __future__ import annotations

import dataclasses
import functools
import gzip
import json
import os
import re
import typing
import zlib
from dataclasses import replace
from pathlib import Path
from typing import Any, ClassVar, TypeVar

from torch import Tensor

from ropelens.errors import InputError
from ropelens.results.codec import (
    check_fields,
    encode,
    field_types,
    fields_from_dict,
    fields_to_dict,
)
from ropelens.results.display import plotly_bundle
from ropelens.results.figures import figure_of, figure_writer
from ropelens.results.findings import Finding, counted_nothing, nothing_counted
from ropelens.results.report_file import ReportSummary, is_report
from ropelens.results.serialize import GZIP_MAGIC, dump_json, read_json

__all__ = ["Result", "check_related_fields", "check_result_path", "load_result", "registered"]

R = TypeVar("R", bound="Result")
_REGISTRY: dict[str, type[Result]] = {}
# what a result class declares in its class statement (the keyword arguments of
# Result.__init_subclass__)
_DECLARED = (
    "KIND",
    "FORMAT",
    "UNVERSIONED",
    "JSON_OPTIONS",
    "MERGE_SAME",
    "MERGE_SUMS",
    "MERGE_HINT",
    "PREVIOUS_KINDS",
    "DERIVED",
    "INCREASING",
)
# suffixes that name a format a JSON result is not written in
_NOT_JSON = (".safetensors", ".csv", ".html", ".parquet", ".pt", ".png", ".pdf", ".svg", ".jpg")
# compressions a result is not written in (``.gz`` is: gzip)
_NOT_GZIP = (".bz2", ".xz", ".lzma", ".zst", ".zip", ".lz4", ".7z", ".tgz", ".tar", ".br")


# the file a result was read from, set on results :meth:`Result.load` built (none on one measured)
_SOURCE = "_ropelens_file"
# what a user does with a result: a failure on a file's content is refused naming the file
_USES = ("figure", "to_frame", "findings")


def _file_guarded(method: Any, shown: str | None = None) -> Any:
    """``method`` of a result, refusing in one line naming the file where it fails on the content
    of a result read from a file (a table of sums with a key or a row edited away: what the
    field types do not declare, and so :func:`check_related_fields` cannot see). On a result
    measured in this process every error keeps its traceback. ``shown``: the method's name in
    the message (default: its own)."""
    if getattr(method, "__ropelens_file_guarded__", False):
        return method
    shown = shown or method.__name__

    @functools.wraps(method)
    def guarded(self: Any, *args: Any, **kwargs: Any) -> Any:
        # this result's file, else that of a result passed in (the other side of a merge)
        source = next(
            (getattr(r, _SOURCE) for r in (self, *args) if getattr(r, _SOURCE, None)), None
        )
        if source is None:
            return method(self, *args, **kwargs)
        try:
            return method(self, *args, **kwargs)
        except InputError:
            raise
        except (KeyError, IndexError, TypeError, ValueError, RuntimeError, ArithmeticError) as e:
            raise InputError(
                f"{source}: {type(self).__name__}.{shown}() cannot use what the file "
                f"holds ({type(e).__name__}: {_one_line(e)}): the file was edited or damaged; "
                "measure and save the result again"
            ) from e

    guarded.__ropelens_file_guarded__ = True  # type: ignore[attr-defined]
    return guarded


class Result:
    """Base of every result: save/load, merge of summed results, findings and the Jupyter repr.

    Subclasses (frozen dataclasses) declare their file in the class statement, their content as
    dataclass fields (written and read by :mod:`ropelens.results.codec` as each field's type says),
    and implement ``to_frame``::

        @dataclass(frozen=True)
        class AttentionSinks(
            Result, merge_same=("layers", "band_names", "spec"), merge_sums=("sums",)
        ):

    Their figures are drawn by :mod:`ropelens.plots`, which registers a function per class
    (:func:`ropelens.results.figures.register_figure`) that :meth:`figure` calls.

    ``kind`` (default: the class name) and ``format`` (default 1) are the file's ``type`` and
    ``format``, read back as ``KIND`` and ``FORMAT``. Results made of sums name ``merge_same``
    (fields two partial results must share) and ``merge_sums`` (fields that add: a tensor, a value
    with a ``merge`` method, or a dict of them) and get :meth:`merge` for free; ``merge_hint`` ends
    the error of a refused merge. ``unversioned=True`` reads a file without a format (and without a
    type) as this class's: files written before the result base carried none. ``previous_kinds`` are
    the kinds the class's files carried under an earlier class name; such files load as this class.
    ``json_options`` are extra :func:`~ropelens.results.serialize.dump_json` arguments. ``derived``
    names attributes (a property, or a method taking no arguments) written after the fields for
    readers of the file and never read back (``derived=("findings",)``). ``increasing`` names
    fields whose values must increase strictly (``increasing=("edges",)``: bin edges), checked
    when a file is read. Kind, format and ``unversioned`` belong to the class that declares them;
    the merge fields, the hint, the JSON options, the derived and the increasing names pass to
    subclasses.
    """

    KIND: ClassVar[str]
    FORMAT: ClassVar[int]
    UNVERSIONED: ClassVar[bool] = False
    JSON_OPTIONS: ClassVar[dict[str, Any]] = {}
    MERGE_SAME: ClassVar[tuple[str, ...]] = ()
    MERGE_SUMS: ClassVar[tuple[str, ...]] = ()
    MERGE_HINT: ClassVar[str] = "measure both with the same settings"
    PREVIOUS_KINDS: ClassVar[tuple[str, ...]] = ()
    DERIVED: ClassVar[tuple[str, ...]] = ()
    INCREASING: ClassVar[tuple[str, ...]] = ()

    def __init_subclass__(
        cls,
        *,
        kind: str | None = None,
        format: int = 1,
        merge_same: tuple[str, ...] | None = None,
        merge_sums: tuple[str, ...] | None = None,
        merge_hint: str | None = None,
        unversioned: bool = False,
        json_options: dict[str, Any] | None = None,
        previous_kinds: tuple[str, ...] = (),
        derived: tuple[str, ...] | None = None,
        increasing: tuple[str, ...] | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init_subclass__(**kwargs)
        written = sorted(set(cls.__dict__) & set(_DECLARED))
        if written:
            raise TypeError(
                f"{cls.__qualname__} sets {', '.join(written)} in its body: declare them in the "
                f"class statement, e.g. class {cls.__name__}(Result, kind=..., merge_sums=(...))"
            )
        kind = cls.__name__ if kind is None else kind
        known = _REGISTRY.get(kind)
        if known is not None and known.__qualname__ != cls.__qualname__:
            raise TypeError(
                f"result kind {kind!r} is taken by {known.__module__}.{known.__qualname__}"
            )
        cls.KIND, cls.FORMAT, cls.UNVERSIONED = kind, format, unversioned
        for name, value in (
            ("MERGE_SAME", merge_same),
            ("MERGE_SUMS", merge_sums),
            ("MERGE_HINT", merge_hint),
            ("JSON_OPTIONS", json_options),
            ("DERIVED", derived),
            ("INCREASING", increasing),
        ):
            if value is not None:
                setattr(
                    cls, name, value if name in ("MERGE_HINT", "JSON_OPTIONS") else tuple(value)
                )
        cls.PREVIOUS_KINDS = tuple(previous_kinds)
        for name in (kind, *cls.PREVIOUS_KINDS):
            _REGISTRY[name] = cls
        if "findings" in cls.__dict__:
            cls.findings = _unless_empty(cls.__dict__["findings"])  # type: ignore[method-assign]
        for name in _USES:
            if name in cls.__dict__ and callable(cls.__dict__[name]):
                setattr(cls, name, _file_guarded(cls.__dict__[name]))

    # ---------------------------------------------------------------- persistence
    def to_dict(self) -> dict[str, Any]:
        """The result's content as JSON-ready values (the file without its type and format keys):
        each field as its type says, then the ``derived`` values."""
        derived = {}
        for name in self.DERIVED:
            value = getattr(self, name)
            derived[name] = encode(value() if callable(value) else value, Any)
        return {**fields_to_dict(self), **derived}

    @classmethod
    def from_dict(cls: type[R], d: dict[str, Any]) -> R:
        """Inverse of :meth:`to_dict` (derived values are written again from the fields).

        Every field is checked against its declared type (:func:`~ropelens.results.codec.decode`)
        and the fields against each other (:func:`check_related_fields`) before the result is
        built: a damaged dict is an :class:`~ropelens.errors.InputError` naming the field."""
        return fields_from_dict(cls, d, ignore=cls.DERIVED, check=cls._check_related)

    @classmethod
    def _check_related(cls, values: dict[str, Any], where: str) -> None:
        check_related_fields(cls, values, where)

    def save(self, path: str | os.PathLike[str]) -> None:
        """Write the result as JSON atomically (a temp file renamed into place), gzip-compressed
        where the name ends in ``.gz`` (``u.json.gz``; :meth:`load` reads either)."""
        check_result_path(path, self.KIND)
        dump_json(
            path,
            {"type": self.KIND, "format": self.FORMAT, **self.to_dict()},
            gzip_by_suffix=True,
            **self.JSON_OPTIONS,
        )

    @classmethod
    def load(cls: type[R], path: str | os.PathLike[str]) -> R:
        """Read a file written by :meth:`save`, checking its kind and format."""
        return cls._from_file(_read_json(path), path)

    @classmethod
    def _from_file(cls: type[R], d: dict[str, Any], path: str | os.PathLike[str]) -> R:
        default = cls.KIND if cls.UNVERSIONED else None
        kind = d.pop("type", default)
        fmt = d.pop("format", cls.FORMAT if cls.UNVERSIONED else None)
        if kind != cls.KIND and kind not in cls.PREVIOUS_KINDS:
            raise InputError(
                f"{path} does not hold {cls.KIND}: it holds a {kind!r} result, not {cls.KIND!r}; "
                "load it with ropelens.load_result(path)"
            )
        if fmt != cls.FORMAT:
            raise InputError(
                f"{path} has {cls.KIND} format {fmt!r}; this ropelens reads format {cls.FORMAT}: "
                "write it again with this version"
            )
        try:
            if getattr(cls.from_dict, "__func__", None) is not Result.from_dict.__func__:
                check_fields(cls, d)  # a reader of its own meets only values of the right type
            result = cls.from_dict(d)
            object.__setattr__(result, _SOURCE, str(path))
            return result
        except InputError as e:
            raise InputError(f"{path}: {e}") from e
        except (KeyError, IndexError, TypeError, ValueError, RuntimeError, AttributeError) as e:
            # the fields passed their checks but the class could not be built from them
            raise InputError(
                f"{path}: its fields do not make a {cls.KIND} ({type(e).__name__}: "
                f"{_one_line(e)}): pass a file this ropelens wrote, unedited"
            ) from e

    # ---------------------------------------------------------------- merge
    def merge(self: R, other: R) -> R:
        """Exact merge of two partial results over the same settings: their sums add."""
        if not self.MERGE_SUMS:
            raise InputError(f"{self.KIND} results do not merge: measure once over all the input")
        if type(other) is not type(self):
            raise TypeError(
                f"can only merge {type(self).__name__} with {type(self).__name__}, got "
                f"{type(other).__name__}"
            )
        return self._merged(other)

    def _merged(self: R, other: R) -> R:
        """The merge of two results of one class (:meth:`merge`), checked mergeable first."""
        self._check_mergeable(other)
        sums = {name: _add(getattr(self, name), getattr(other, name)) for name in self.MERGE_SUMS}
        merged = replace(self, **sums, provenance=self.provenance.merged(other.provenance))  # type: ignore[attr-defined,type-var]
        source = getattr(self, _SOURCE, None) or getattr(other, _SOURCE, None)
        if source is not None:  # what the file held is in the merge too
            object.__setattr__(merged, _SOURCE, source)
        return merged

    _merged = _file_guarded(_merged, "merge")

    def _check_mergeable(self, other: Result) -> None:
        """Raise naming the first setting (or set of sums) the two results do not share."""
        keyed = [s for s in self.MERGE_SUMS if isinstance(getattr(self, s), dict)]
        names = ", ".join((*self.MERGE_SAME, *(f"{s} keys" for s in keyed)))
        pairs = [
            (n, _comparable(getattr(self, n)), _comparable(getattr(other, n)))
            for n in self.MERGE_SAME
        ]
        pairs += [(f"{s} keys", sorted(getattr(self, s)), sorted(getattr(other, s))) for s in keyed]
        for name, a, b in pairs:
            if a != b:
                shown = f" ({a!r} vs {b!r})" if len(repr(a)) + len(repr(b)) < 120 else ""
                raise InputError(
                    f"can only merge {self.KIND} results with the same {names}: {name} "
                    f"differs{shown}; {self.MERGE_HINT}"
                )

    @staticmethod
    def _check_shape(
        name: str, tensor: Tensor, expected: tuple[int | None, ...], labels: str = ""
    ) -> None:
        """Raise unless ``tensor`` has ``expected`` shape (None: any size on that axis)."""
        got = tuple(tensor.shape)
        if len(got) != len(expected) or any(
            e is not None and g != e for g, e in zip(got, expected)
        ):
            want = ", ".join("any" if e is None else str(e) for e in expected)
            raise InputError(
                f"{name} has shape {got}, expected ({want}){labels}: pass sums from the same "
                "reducer"
            )

    # ---------------------------------------------------------------- views
    def to_frame(self) -> Any:
        """The result as a tidy pandas table."""
        raise NotImplementedError(f"{type(self).__name__} must implement to_frame")

    @_file_guarded
    def figure(self, *args: Any, **kwargs: Any) -> Any:
        """The result's plotly figure, drawn by the function :mod:`ropelens.plots` registered for
        its class."""
        return figure_of(type(self))(self, *args, **kwargs)

    @_file_guarded
    def save_figure(
        self,
        path: str | os.PathLike[str],
        name: str | None = None,
        *args: Any,
        width: int | None = None,
        height: int | None = None,
        scale: float | None = None,
        **kwargs: Any,
    ) -> Path:
        """Write a figure of this result as ``path``'s suffix says (``.png``, ``.svg`` or ``.pdf``)
        and return the path: the figure ``name`` (default: :meth:`figure`'s) drawn with ``args``
        and ``kwargs`` (``result.save_figure("u.pdf", "heatmap", "k", layer=3)``). ``width`` and
        ``height`` set the page in layout pixels (default: the figure's own), ``scale`` a PNG's
        pixels per layout pixel (:func:`ropelens.plots.export.write_figure`)."""
        fig = figure_of(type(self), name or "figure")(self, *args, **kwargs)
        return figure_writer()(fig, path, width=width, height=height, scale=scale)

    def findings(self) -> list[Finding]:
        """Sentences written from the measured numbers (none unless the result writes some)."""
        return []

    def _repr_text(self) -> str:
        name = getattr(self, "name", None)
        parts = [name] if isinstance(name, str) else []
        prov = getattr(self, "provenance", None)
        if prov is not None:
            parts.append(str(prov.model))
        layers = getattr(self, "layers", None)
        if layers is not None:
            parts.append(f"layers {list(layers)}")
        return f"{type(self).__name__}({', '.join(parts)})"

    def _repr_mimebundle_(self, include=None, exclude=None) -> dict:  # noqa: ARG002
        """Jupyter shows the plotly figure (offline: no CDN script); plain text names the result."""
        return plotly_bundle(self.figure(), self._repr_text())


def check_related_fields(cls: type, values: dict[str, Any], where: str) -> None:
    """Check how a result's fields relate, by the names ropelens's results share, before it is
    built from a file.

    ``layers`` holds distinct layer indices ≥ 0, below ``spec.n_layers`` where the result has a
    ``spec``; every tensor of a summed field (``merge_sums``) or of a table of tensors by name has
    one row per measured layer first where the result has ``layers``; an integer field named as a
    count (``n_sink``, ``n_pos``, ``skip_queries``) and ``provenance``'s token, window and context
    counts are ≥ 0; the fields the class declares ``increasing`` increase strictly. The first fault
    is an :class:`InputError` naming ``where``'s field, what it holds and what was expected.
    """
    layers = values.get("layers")
    if isinstance(layers, tuple) and all(isinstance(L, int) for L in layers):
        spec = values.get("spec")
        n_layers = getattr(spec, "n_layers", None)
        for i, layer in enumerate(layers):
            if layer < 0 or (isinstance(n_layers, int) and layer >= n_layers):
                within = f" of the {n_layers} the spec holds" if isinstance(n_layers, int) else ""
                raise InputError(
                    f"{where}.layers[{i}] is {layer}, expected a layer index ≥ 0{within}"
                )
        repeated = sorted({L for L in layers if layers.count(L) > 1})
        if repeated:
            raise InputError(f"{where}.layers names layer {repeated[0]} twice, expected each once")
        for name in _per_layer_fields(cls):
            for label, tensor in _tensors_in(values.get(name), f"{where}.{name}"):
                if tensor.ndim == 0 or tensor.shape[0] != len(layers):
                    raise InputError(
                        f"{label} has shape {tuple(tensor.shape)}, expected {len(layers)} rows "
                        f"first, one per layer of {where}.layers"
                    )
    hints = field_types(cls)
    for name, value in values.items():
        counted = name.startswith(("n_", "skip"))  # n_sink, n_pos, skip_queries: counts
        if counted and hints.get(name) is int and isinstance(value, int) and value < 0:
            raise InputError(f"{where}.{name} is {value}, expected a count ≥ 0")
    for name in getattr(cls, "INCREASING", ()):
        _check_increasing(values.get(name), f"{where}.{name}")
    provenance = values.get("provenance")
    for name in ("n_tokens", "n_windows", "n_ctx"):
        count = getattr(provenance, name, None)
        if isinstance(count, int) and count < 0:
            raise InputError(f"{where}.provenance.{name} is {count}, expected a count ≥ 0")


def _check_increasing(value: Any, where: str) -> None:
    """Refuse a one-dimensional field (a tensor, tuple or list of numbers) whose values do not
    increase strictly, naming the first step that does not."""
    if isinstance(value, Tensor):
        if value.ndim != 1:
            raise InputError(f"{where} has shape {tuple(value.shape)}, expected one dimension")
        value = value.tolist()
    if not isinstance(value, (tuple, list)):
        return  # None, or a type the field's own check refused already
    for i in range(1, len(value)):
        if not value[i] > value[i - 1]:
            raise InputError(
                f"{where}[{i}] is {value[i]} after {value[i - 1]}, expected values that increase "
                "strictly"
            )


def _per_layer_fields(cls: type) -> tuple[str, ...]:
    """The fields of a result with ``layers`` whose tensors have one row per layer: its summed
    fields, and its tables of tensors by name (``sums: dict[str, Tensor]``)."""
    hints = field_types(cls)
    tables = [
        name
        for name, hint in hints.items()
        if typing.get_origin(hint) is dict and typing.get_args(hint)[1:] == (Tensor,)
    ]
    return tuple(dict.fromkeys((*getattr(cls, "MERGE_SUMS", ()), *tables)))


def _tensors_in(value: Any, where: str) -> list[tuple[str, Tensor]]:
    """Each tensor in a summed field (a tensor, a dict of them, a value holding tensors such as
    ``Moments``) with the name it has there."""
    if isinstance(value, Tensor):
        return [(where, value)]
    if isinstance(value, dict):
        return [
            pair
            for k, v in value.items()
            for pair in _tensors_in(
                v, f"{where}[{'/'.join(map(str, k)) if isinstance(k, tuple) else k!r}]"
            )
        ]
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return [
            pair
            for f in dataclasses.fields(value)
            for pair in _tensors_in(getattr(value, f.name), f"{where}.{f.name}")
        ]
    return []


def _one_line(error: BaseException) -> str:
    return " ".join(str(error).split()) or type(error).__name__


def check_result_path(path: str | os.PathLike[str], kind: str = "ropelens") -> Path:
    """``path`` if a result can be saved there as its suffix says: JSON (``.json``), or JSON
    compressed with gzip (``.json.gz``); another format's suffix (``.csv``, ``.xz``) is an
    :class:`InputError` naming the file to pass instead."""
    p = Path(path)
    suffixes = [x.lower() for x in p.suffixes]
    last = suffixes[-1] if suffixes else ""
    inner = suffixes[-2] if last == ".gz" and len(suffixes) > 1 else ""
    if last in _NOT_JSON or last in _NOT_GZIP or inner in _NOT_JSON:
        stem = p.name[: len(p.name) - len(inner + last)]
        raise InputError(
            f"{path}: a {kind} result is written as JSON, not {(inner or last)[1:]}: name the "
            f"file {stem}.json (or {stem}.json.gz, compressed with gzip)"
        )
    return p


def _unless_empty(findings: Any) -> Any:
    """``findings`` guarded: a result that counted no token writes one withheld finding instead,
    whatever its class would write from its sums of nothing."""

    @functools.wraps(findings)
    def guarded(self: Result, *args: Any, **kwargs: Any) -> list[Finding]:
        prov = getattr(self, "provenance", None)
        if prov is not None and counted_nothing(prov):
            return [nothing_counted(_section_of(type(self)), prov)]
        return findings(self, *args, **kwargs)

    guarded.__ropelens_guarded__ = True  # type: ignore[attr-defined]
    return findings if getattr(findings, "__ropelens_guarded__", False) else guarded


def _section_of(cls: type) -> str:
    """The section a result's findings belong to: its kind in kebab case (``FrequencyUsage`` →
    ``frequency-usage``), as the analyses name their sections."""
    return re.sub(r"(?<=[a-z0-9])(?=[A-Z])", "-", cls.KIND).lower()  # type: ignore[attr-defined]


def _add(a: Any, b: Any) -> Any:
    if isinstance(a, dict):
        return {k: _add(v, b[k]) for k, v in a.items()}
    return a.merge(b) if hasattr(a, "merge") else a + b


def _comparable(v: Any) -> Any:
    if hasattr(v, "to_dict"):
        return v.to_dict()
    if isinstance(v, Tensor):
        return v.tolist()
    return v


def _read_json(path: str | os.PathLike[str]) -> dict[str, Any]:
    try:
        d = read_json(path)
    except (UnicodeDecodeError, json.JSONDecodeError, EOFError, gzip.BadGzipFile, zlib.error) as e:
        raise InputError(
            f"{path} is not a ropelens JSON result ({e}): pass a file written by .save()"
        ) from e
    if not isinstance(d, dict):
        raise InputError(
            f"{path} holds JSON {type(d).__name__}, not a ropelens result: pass a file written "
            "by .save()"
        )
    return d


def registered() -> dict[str, type[Result]]:
    """Every result class by the kind its files carry."""
    return dict(_REGISTRY)


def load_result(path: str | os.PathLike[str]) -> Result | ReportSummary:
    """Read any result file whose class is imported, whichever class wrote it (dispatched on the
    file's ``type``), or a report's ``report.json`` (as a :class:`ReportSummary`).

    ``ropelens.load_result`` imports every result class first, so it reads every kind ropelens
    writes.
    """
    with open(path, "rb") as f:
        head = f.read(64).lstrip()
    if head[:1] not in (b"{", b"[") and head[:2] != GZIP_MAGIC:
        # safetensors files open with their header's length, not JSON; only attention decompositions
        # write them
        from safetensors import SafetensorError, safe_open

        try:
            with safe_open(str(path), "pt") as st:
                kind = (st.metadata() or {}).get("type", "AttentionDecomposition")
        except (SafetensorError, OSError) as e:
            raise InputError(
                f"{path} is neither a ropelens JSON result nor a safetensors file ({e}): "
                "pass a file written by .save()"
            ) from e
        return _class_of(kind, path).load(path)
    d = _read_json(path)
    if "type" not in d and is_report(d):
        try:
            return ReportSummary.from_dict(d)
        except InputError as e:
            raise InputError(f"{path}: {e}") from e
    return _class_of(d.get("type"), path)._from_file(d, path)


def _class_of(kind: Any, path: str | os.PathLike[str]) -> type[Result]:
    if kind not in _REGISTRY:
        raise InputError(
            f"{path} holds a {kind!r} result, which ropelens does not know (known: "
            f"{sorted(_REGISTRY)}): load a file written by a ropelens result's .save(), or load "
            "an untyped file with its class"
        )
    return _REGISTRY[kind]
