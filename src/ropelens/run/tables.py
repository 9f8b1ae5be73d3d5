"""Documents from one column of tabular data: JSONL, CSV and Parquet files and HF datasets.

Each row's cell in the text column is one document. Rows whose cell is empty, blank or null are
skipped (datasets such as wikitext hold many); a cell that is not text is refused, naming its row.
``datasets`` and ``pyarrow`` are imported only when a dataset or a Parquet file is read.
"""

from __future__ import annotations

import csv
import json
import sys
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ropelens.errors import InputError

__all__ = [
    "DEFAULT_TEXT_COLUMN",
    "TABLE_SUFFIXES",
    "Texts",
    "check_text_column",
    "dataset_name",
    "dataset_texts",
    "is_dataset",
    "is_dataset_dict",
    "is_iterable_dataset",
    "read_table_file",
    "stream_texts",
]

DEFAULT_TEXT_COLUMN = "text"
TABLE_SUFFIXES = (".jsonl", ".ndjson", ".json", ".parquet", ".csv", ".tsv")


@dataclass(frozen=True)
class Texts:
    """The documents read from one table, and how many rows had no text."""

    documents: list[str]
    skipped: int = 0


def check_text_column(text_column: Any) -> str:
    """``text_column`` as given, once it is a non-empty string."""
    if not isinstance(text_column, str) or not text_column.strip():
        raise InputError(
            f"text_column must name a column, got {text_column!r}: pass the column that holds the "
            f'text, e.g. text_column="text" (--text-column text)'
        )
    return text_column


def _missing(column: str, names: Sequence[str], where: str) -> InputError:
    shown = ", ".join(repr(n) for n in names) if names else "none"
    return InputError(
        f"{where} has no column {column!r} (its columns: {shown}): pass the column that holds the "
        "text as text_column= (--text-column on the command line)"
    )


def _texts(values: Iterable[Any], column: str, where: str) -> Iterator[str | None]:
    """Each cell as a document, or None for a cell with no text; a non-text cell is refused."""
    for row, value in enumerate(values):
        if value is None or (isinstance(value, str) and not value.strip()):
            yield None
        elif isinstance(value, str):
            yield value
        else:
            raise InputError(
                f"row {row} of {where} holds a {type(value).__name__} in column {column!r}, not "
                "text: choose the column that holds the text with text_column= (--text-column)"
            )


def _collect(values: Iterable[Any], column: str, where: str) -> Texts:
    docs, skipped = [], 0
    for text in _texts(values, column, where):
        if text is None:
            skipped += 1
        else:
            docs.append(text)
    return Texts(docs, skipped)


def _open_text(path: Path, **kw: Any):
    return path.open(encoding="utf-8-sig", errors="strict", **kw)


def _jsonl_rows(path: Path, column: str) -> Iterator[Any]:
    with _open_text(path) as f:
        for number, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                raise InputError(
                    f"line {number} of {path} is not JSON ({e.msg}): a JSONL file holds one JSON "
                    "object per line"
                ) from e
            yield _cell(
                row,
                column,
                f"line {number} of {path}",
                f'write one object per line, e.g. {{"{column}": "..."}}',
            )


def _json_rows(path: Path, column: str) -> Iterator[Any]:
    """A ``.json`` file: a JSON array of objects, or JSON lines."""
    with _open_text(path) as f:
        head = f.read(1 << 16).lstrip()
    if not head.startswith("["):
        yield from _jsonl_rows(path, column)
        return
    try:
        rows = json.loads(path.read_text(encoding="utf-8-sig"))
    except json.JSONDecodeError as e:
        raise InputError(f"{path} is not valid JSON ({e.msg} at line {e.lineno})") from e
    for i, row in enumerate(rows):
        yield _cell(
            row,
            column,
            f"item {i} of {path}",
            f'write a list of objects, e.g. [{{"{column}": "..."}}]',
        )


def _cell(row: Any, column: str, where: str, fix: str) -> Any:
    """The ``column`` of one JSON row, which must be an object holding it."""
    if not isinstance(row, Mapping):
        raise InputError(f"{where} is a JSON {type(row).__name__}, not an object: {fix}")
    if column not in row:
        raise _missing(column, list(row), where)
    return row[column]


def _csv_rows(path: Path, column: str) -> Iterator[Any]:
    csv.field_size_limit(min(sys.maxsize, 2**31 - 1))  # a document is often longer than 128 kB
    with _open_text(path, newline="") as f:
        reader = csv.DictReader(f, delimiter="\t" if path.suffix.lower() == ".tsv" else ",")
        names = list(reader.fieldnames or [])
        if column not in names:
            raise _missing(column, names, str(path))
        for row in reader:
            yield row[column]


def _parquet_rows(path: Path, column: str) -> Iterator[Any]:
    import pyarrow.parquet as pq

    try:
        file = pq.ParquetFile(path)
    except Exception as e:  # pyarrow raises ArrowInvalid and friends for a damaged file
        raise InputError(f"{path} is not a readable Parquet file ({e}): check the file") from e
    names = file.schema_arrow.names
    if column not in names:
        raise _missing(column, names, str(path))
    for batch in file.iter_batches(columns=[column], batch_size=1024):
        yield from batch.column(0).to_pylist()


_READERS = {
    ".jsonl": _jsonl_rows,
    ".ndjson": _jsonl_rows,
    ".json": _json_rows,
    ".csv": _csv_rows,
    ".tsv": _csv_rows,
    ".parquet": _parquet_rows,
}


def read_table_file(path: Path, text_column: str) -> Texts:
    """The documents in ``text_column`` of a JSONL, JSON, CSV/TSV or Parquet file, in row order."""
    reader = _READERS[path.suffix.lower()]
    try:
        return _collect(reader(path, text_column), text_column, str(path))
    except UnicodeDecodeError as e:
        raise InputError(
            f"{path} is not UTF-8 text (byte {e.object[e.start]:#04x} at offset {e.start}): "
            "re-save it as UTF-8"
        ) from e


# ------------------------------------------------------------------------- Hugging Face datasets
def _datasets_module() -> Any:
    return sys.modules.get("datasets")  # never imported just to ask: it is slow to import


def is_dataset(obj: Any) -> bool:
    mod = _datasets_module()
    return mod is not None and isinstance(obj, mod.Dataset)


def is_dataset_dict(obj: Any) -> bool:
    mod = _datasets_module()
    return mod is not None and isinstance(obj, (mod.DatasetDict, mod.IterableDatasetDict))


def is_iterable_dataset(obj: Any) -> bool:
    mod = _datasets_module()
    return mod is not None and isinstance(obj, mod.IterableDataset)


def dataset_name(ds: Any) -> str:
    """The dataset's own name (and split) where it records one, else ``"dataset"``."""
    info = getattr(ds, "info", None)
    name = getattr(info, "dataset_name", None) or getattr(info, "builder_name", None) or "dataset"
    split = getattr(ds, "split", None)
    return f"{name}[{split}]" if split else str(name)


def dataset_texts(ds: Any, text_column: str) -> Texts:
    """The documents in ``text_column`` of a ``datasets.Dataset``, read in batches."""
    if text_column not in ds.column_names:
        raise _missing(text_column, ds.column_names, f"dataset {dataset_name(ds)!r}")
    column = ds.select_columns([text_column])

    def values() -> Iterator[Any]:
        for batch in column.iter(batch_size=1024):
            yield from batch[text_column]

    return _collect(values(), text_column, f"dataset {dataset_name(ds)!r}")


def stream_texts(ds: Any, text_column: str) -> Iterator[str]:
    """The documents in ``text_column`` of an ``IterableDataset``, pulled one row at a time."""
    where = f"dataset {dataset_name(ds)!r}"
    names = getattr(ds, "column_names", None)
    if names is not None and text_column not in names:
        raise _missing(text_column, names, where)

    def values() -> Iterator[Any]:
        for row in ds:
            if text_column not in row:
                raise _missing(text_column, list(row), where)
            yield row[text_column]

    return (t for t in _texts(values(), text_column, where) if t is not None)
