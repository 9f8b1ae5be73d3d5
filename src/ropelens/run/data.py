"""Corpora that need no download, and the fixed-length token windows analyses run on.

Two corpora ship with every CPython: ``english()`` is the language reference as plain English
text (``pydoc_data.topics``) and ``python_code()`` is the standard library's own source. Both depend
on the Python version, so every ``Corpus`` carries a ``sha256`` fingerprint for provenance.
"""

from __future__ import annotations

import functools
import glob
import gzip
import hashlib
import io
import json
import numbers
import os
import platform
import re
import sysconfig
import tempfile
import zlib
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import torch
from jaxtyping import Int
from torch import Tensor

from ropelens.errors import InputError
from ropelens.run.tables import (
    DEFAULT_TEXT_COLUMN,
    TABLE_SUFFIXES,
    check_text_column,
    dataset_name,
    dataset_texts,
    is_dataset,
    is_dataset_dict,
    is_iterable_dataset,
    read_table_file,
    stream_texts,
)
from ropelens.run.texts import bos_token_id

__all__ = [
    "CORPORA",
    "DEFAULT_CORPUS",
    "Corpus",
    "StreamedCorpus",
    "analysis_windows",
    "check_token_windows",
    "english",
    "load_corpus",
    "python_code",
    "text_files",
    "token_stream",
    "windows",
]

Bos = Literal["prepend", "none"]
PathLike = str | os.PathLike[str]

DEFAULT_CORPUS = "english"
DEFAULT_CODE_BYTES = 2_000_000
TEXT_SUFFIXES = (".txt", ".md")

# Directories of the stdlib that are not the library's own code: tests (and lib2to3/idlelib test
# data, which lives under them), third-party packages, and pydoc_data (the English corpus itself).
_SKIP_DIRS = frozenset(
    {"test", "tests", "idle_test", "site-packages", "dist-packages", "__pycache__", "pydoc_data"}
)
# Sphinx's text builder underlines headings with a row of one repeated character.
_UNDERLINE = re.compile(r"^[ \t]*([*=\-~^#])\1{2,}[ \t]*$", re.MULTILINE)
_BLANK_RUN = re.compile(r"\n{3,}")
_TOKENIZE_BATCH = 64  # documents per batch call: keeps the Rust tokenizer's threads busy


def _is_int(x: object) -> bool:
    # numbers.Integral admits numpy ints; bool is an int to Python but never a count.
    return isinstance(x, numbers.Integral) and not isinstance(x, bool)


def _is_number(x: object) -> bool:
    return isinstance(x, numbers.Real) and not isinstance(x, bool)


def _fingerprint(documents: Iterable[str]) -> str:
    h = hashlib.sha256()
    for doc in documents:
        # Length-prefixed, so ("ab",) and ("a", "b") differ: boundaries change the token stream.
        b = doc.encode("utf-8")
        h.update(f"{len(b)}\n".encode())
        h.update(b)
    return h.hexdigest()


# --------------------------------------------------------------------------------------------
# the corpus
# --------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Corpus:
    """An ordered collection of text documents with a name and where it came from.

    Documents keep their boundaries: :func:`token_stream` joins them with the tokenizer's EOS, and
    :attr:`sha256` fingerprints them with their boundaries, so results record exactly which text
    they ran on. Build one directly, or with :func:`load_corpus`, :func:`text_files`,
    :func:`english` or :func:`python_code`.

    Args:
        name (str): Short name, written into results and reports (e.g. ``"english"``).
        documents (tuple[str, ...]): The texts, in order; a list is stored as a tuple.
        source (str): Where the text came from, in words (provenance); default empty.

    Raises:
        TypeError: If ``documents`` is a single string or holds something other than strings.
        InputError: If ``documents`` is empty.

    Examples:
        >>> corpus = Corpus("notes", ("The first text.", "The second."), source="typed in")
        >>> corpus.n_documents, corpus.n_chars
        (2, 26)
        >>> len(corpus.sha256)  # hex digits of the fingerprint
        64
        >>> train, val = Corpus("ten", tuple(f"text {i}" for i in range(10))).split(0.2)
        >>> train.n_documents, val.n_documents, val.name
        (8, 2, 'ten[val]')
    """

    name: str
    documents: tuple[str, ...] = field(repr=False)
    source: str = ""

    def __post_init__(self) -> None:
        if isinstance(self.documents, str) or not isinstance(self.documents, Sequence):
            raise TypeError(
                f"documents must be a tuple of strings, got {type(self.documents).__name__}: "
                "wrap a single text as (text,)"
            )
        docs = tuple(self.documents)
        bad = [i for i, d in enumerate(docs) if not isinstance(d, str)]
        if bad:
            raise TypeError(
                f"document {bad[0]} of corpus {self.name!r} is a {type(docs[bad[0]]).__name__}, "
                "not a str: decode bytes before building a Corpus"
            )
        if not docs:
            raise InputError(f"corpus {self.name!r} has no documents: give it at least one text")
        object.__setattr__(self, "documents", docs)

    def __repr__(self) -> str:
        return (
            f"Corpus(name={self.name!r}, n_documents={self.n_documents}, n_chars={self.n_chars}, "
            f"sha256={self.sha256[:12]!r}…, source={self.source!r})"
        )

    @property
    def n_documents(self) -> int:
        """Number of documents."""
        return len(self.documents)

    @functools.cached_property
    def n_chars(self) -> int:
        """Total characters over all documents (separators not counted)."""
        return sum(len(d) for d in self.documents)

    @functools.cached_property
    def text(self) -> str:
        """All documents joined by a blank line."""
        return "\n\n".join(self.documents)

    @functools.cached_property
    def sha256(self) -> str:
        """Fingerprint of the documents and their boundaries: sha256 over ``len\\n utf-8`` of
        each."""
        return _fingerprint(self.documents)

    def split(self, val_fraction: float = 0.1, seed: int = 0) -> tuple[Corpus, Corpus]:
        """Split into (train, val) by document, deterministically from ``seed`` on any machine.

        Each document's side is decided by a hash of the seed and its text, so a document keeps
        its side when unrelated documents are added.

        Args:
            val_fraction (float): Share of the documents held out, strictly between 0 and 1
                (rounded to a count of at least 1 and at most all but one).
            seed (int): Seed of the hash that orders the documents.

        Returns:
            tuple[Corpus, Corpus]: ``(train, val)``, named ``name[train]`` and ``name[val]``.

        Raises:
            InputError: If ``val_fraction`` is out of range or the corpus has one document.
            TypeError: If ``seed`` is not an int.
        """
        if not (_is_number(val_fraction) and 0 < val_fraction < 1):
            raise InputError(
                f"val_fraction must be a number strictly between 0 and 1, got {val_fraction!r}"
            )
        if not _is_int(seed):
            raise TypeError(f"seed must be an int, got {seed!r}")
        n = self.n_documents
        if n < 2:
            raise InputError(
                f"corpus {self.name!r} has {n} document, so it cannot be split into train and val: "
                "add documents, or hold out windows instead of documents"
            )
        n_val = min(max(1, round(val_fraction * n)), n - 1)
        # Rank by a hash of (seed, document): no RNG whose algorithm could differ between versions,
        # and a document keeps its side when unrelated documents are added. Index breaks ties.
        prefix = f"ropelens-split:{seed}:".encode()
        keys = [hashlib.sha256(prefix + d.encode("utf-8")).digest() for d in self.documents]
        order = sorted(range(n), key=lambda i: (keys[i], i))
        val_idx = set(order[:n_val])
        tag = f"split val_fraction={val_fraction} seed={seed}"
        train = Corpus(
            f"{self.name}[train]",
            tuple(d for i, d in enumerate(self.documents) if i not in val_idx),
            f"{self.source}; {tag} (train)",
        )
        val = Corpus(
            f"{self.name}[val]",
            tuple(d for i, d in enumerate(self.documents) if i in val_idx),
            f"{self.source}; {tag} (val)",
        )
        return train, val


# --------------------------------------------------------------------------------------------
# built-in corpora
# --------------------------------------------------------------------------------------------
def _clean_reference_text(text: str) -> str:
    """Drop heading underlines and blank-line runs; the rest is already plain text."""
    text = _UNDERLINE.sub("", text)
    text = "\n".join(line.rstrip() for line in text.split("\n"))
    return _BLANK_RUN.sub("\n\n", text).strip()


@functools.lru_cache(maxsize=1)
def english() -> Corpus:
    """The CPython language reference as English text: one document per topic, sorted by key.

    The text ships with Python itself (``pydoc_data.topics``), so it needs no download; it is the
    default corpus of every corpus analysis (``"english"``). Cached: one corpus per process.

    Returns:
        Corpus: Named ``"english"``, one document per reference topic, its source naming the
        Python version it came from.

    Examples:
        >>> corpus = english()
        >>> corpus.name, corpus.source.startswith("CPython")
        ('english', True)
        >>> len(corpus.documents) > 50
        True
    """
    from pydoc_data.topics import topics

    docs = tuple(
        cleaned for key in sorted(topics) if (cleaned := _clean_reference_text(topics[key]))
    )
    version = platform.python_version()
    return Corpus(
        name="english",
        documents=docs,
        source=f"CPython {version} language reference (pydoc_data.topics, {len(docs)} topics)",
    )


def _stdlib_sources(root: Path) -> list[Path]:
    """Every library .py file under ``root``, skipping tests and third-party code, sorted."""
    found = []
    for dirpath, dirnames, filenames in os.walk(root):
        # Prune in place so os.walk never descends into site-packages (most of the tree on some
        # installs).
        dirnames[:] = [d for d in dirnames if d not in _SKIP_DIRS and not d.startswith(".")]
        found.extend(Path(dirpath, f) for f in filenames if f.endswith(".py"))
    return sorted(found, key=lambda p: p.relative_to(root).as_posix())


def _is_generated(text: str) -> bool:
    # encodings/cp*.py etc. are charmap tables written by gencodec.py: data, not code.
    return "gencodec.py" in text[:400]


@functools.lru_cache(maxsize=4)
def python_code(max_bytes: int | None = DEFAULT_CODE_BYTES) -> Corpus:
    """The standard library's own source, one document per file in sorted path order.

    Test directories, site-packages, pydoc_data and generated codec tables are skipped. Files are
    taken whole until ``max_bytes`` (UTF-8) would be passed; the next file is cut at a line end to
    fill the cap and the corpus stops there. ``max_bytes=None`` takes every file.

    Args:
        max_bytes (int | None): The cap on the corpus size in UTF-8 bytes (default
            ``DEFAULT_CODE_BYTES``); None takes the whole standard library.

    Returns:
        Corpus: Named ``"python"``, one document per source file, at most ``max_bytes`` in all.

    Raises:
        InputError: If ``max_bytes`` is not a positive int or None.

    Examples:
        >>> corpus = python_code(20_000)
        >>> sum(len(d.encode()) for d in corpus.documents) <= 20_000
        True
    """
    if max_bytes is not None and not (_is_int(max_bytes) and max_bytes > 0):
        raise InputError(f"max_bytes must be a positive int or None, got {max_bytes!r}")
    root = Path(sysconfig.get_paths()["stdlib"])
    docs: list[str] = []
    used = 0
    for path in _stdlib_sources(root):
        try:
            text = path.read_bytes().decode("utf-8")
        except (OSError, UnicodeDecodeError):
            continue  # unreadable or legacy-encoded files are not worth failing the corpus over
        if not text.strip() or _is_generated(text):
            continue
        size = len(text.encode("utf-8"))
        if max_bytes is not None and used + size > max_bytes:
            head = text.encode("utf-8")[: max_bytes - used]
            head = head[: head.rfind(b"\n") + 1]
            if head.strip():
                docs.append(head.decode("utf-8"))
            break
        docs.append(text)
        used += size
    if not docs:
        raise InputError(
            f"found no Python source under {root} (sysconfig's stdlib path): this Python install "
            "ships without its standard library sources; use english() or text_files()"
        )
    cap = "all files" if max_bytes is None else f"first {max_bytes:,} bytes"
    version = platform.python_version()
    return Corpus(
        name="python",
        documents=tuple(docs),
        source=f"CPython {version} standard library source at {root} ({len(docs)} files, {cap})",
    )


# --------------------------------------------------------------------------------------------
# user files
# --------------------------------------------------------------------------------------------
COMPRESSED_SUFFIXES = (".gz", ".zst")
_ICONV_FIX = "re-save it as UTF-8, e.g. `iconv -f latin1 -t utf-8 in.txt > out.txt`"


def _inner_suffix(path: Path) -> str:
    """The suffix that names a file's format: ``.jsonl`` for ``rows.jsonl.gz``."""
    suffixes = [s.lower() for s in path.suffixes]
    if suffixes and suffixes[-1] in COMPRESSED_SUFFIXES:
        return suffixes[-2] if len(suffixes) > 1 else ""
    return path.suffix.lower()


def _file_bytes(path: Path) -> bytes:
    """The bytes of a file, a named pipe or ``/dev/stdin``; gzip (``.gz``) and zstd (``.zst``)
    decompressed."""
    if path.is_dir():
        raise InputError(f"{path} is a folder where a file was expected: pass a file in it")
    data = path.read_bytes()
    suffix = path.suffix.lower()
    if suffix == ".gz":
        try:
            return gzip.decompress(data)
        except (OSError, EOFError, zlib.error) as e:
            raise InputError(
                f"{path} ends in .gz but is not gzip data ({e}): decompress it with the tool that "
                "made it, or rename it to its real suffix"
            ) from None
    if suffix == ".zst":
        try:
            import zstandard
        except ImportError:
            raise InputError(
                f"{path} is zstd-compressed and the zstandard package is not installed: "
                f"`pip install zstandard`, or decompress it first with `zstd -d {path}`"
            ) from None
        try:
            with zstandard.ZstdDecompressor().stream_reader(io.BytesIO(data)) as reader:
                return reader.read()
        except zstandard.ZstdError as e:
            raise InputError(
                f"{path} ends in .zst but is not zstd data ({e}): rename it to its real suffix"
            ) from None
    return data


def decode_text(data: bytes, where: object) -> str:
    """``data`` as UTF-8 text (a byte-order mark dropped, line ends ``\\n``), the one decoding
    every file ropelens reads as text goes through; ``where`` names it in the refusal.

    Raises:
        InputError: If ``data`` holds NUL bytes (binary) or is not UTF-8: the message names the
            file, the byte offset and the fix.

    Examples:
        >>> decode_text("caf\\u00e9\\r\\n".encode(), "note.txt")
        'café\\n'
        >>> decode_text("caf\\u00e9".encode("latin-1"), "note.txt")
        Traceback (most recent call last):
        ...
        ropelens.errors.InputError: note.txt is not UTF-8 text (byte 0xe9 at offset 3): ...
    """
    if (nul := data.find(b"\x00")) >= 0:
        raise InputError(
            f"{where} looks binary (a NUL byte at offset {nul}): pass plain UTF-8 "
            f"text (.txt or .md), JSON Lines, CSV or Parquet; gzip (.gz) or zstd (.zst) files are "
            "decompressed when their name ends so"
        )
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        raise InputError(
            f"{where} is not UTF-8 text (byte {data[e.start]:#04x} at offset {e.start}): "
            f"{_ICONV_FIX}"
        ) from None
    return text.replace("\r\n", "\n").replace("\r", "\n")


def read_text_file(path: PathLike) -> str:
    """The text of one file (or pipe) by :func:`decode_text`, decompressed when it ends .gz or
    .zst.

    Raises:
        InputError: If the file is a folder, binary, not UTF-8 or damaged compressed data.
        FileNotFoundError: If it does not exist.
    """
    path = Path(path).expanduser()
    return decode_text(_file_bytes(path), path)


def _read_text_file(path: Path) -> str:
    """Read one UTF-8 text file, refusing binary, undecodable and empty ones with the fix."""
    text = read_text_file(path)
    if not text.strip():
        raise InputError(
            f"{path} is empty (no text besides whitespace): add text or leave the file out"
        )
    return text


def _one_json_object(path: Path, text: str, text_column: str) -> list[str] | None:
    """A ``.json`` file that is one object: its ``text_column`` as the one document (else a
    refusal); None for a list or JSON Lines."""
    if not text.lstrip().startswith("{"):
        return None
    try:
        record = json.loads(text)
    except json.JSONDecodeError:
        return None  # several lines of objects: JSON Lines, read as such
    if isinstance(record, dict) and isinstance(record.get(text_column), str):
        return [record[text_column]] if record[text_column].strip() else []
    keys = ", ".join(repr(k) for k in list(record)[:8]) or "none"
    raise InputError(
        f"{path} holds one JSON object (keys: {keys}) with no text field {text_column!r}: a corpus "
        f'file is a list of records, [{{"{text_column}": "..."}}, ...], or JSON Lines, one such '
        "object per line (--text-column names the field)"
    )


def _table_documents(path: Path, text_column: str) -> tuple[list[str], int]:
    """The documents of one table file, compressed or piped, and how many rows were empty."""
    suffix = _inner_suffix(path)
    if suffix == ".parquet" and path.is_file() and path.suffix.lower() == suffix:
        texts = read_table_file(path, text_column)
        return texts.documents, texts.skipped
    data = _file_bytes(path)
    if suffix != ".parquet":
        text = decode_text(data, path)
        if suffix == ".json" and (one := _one_json_object(path, text, text_column)) is not None:
            return one, 1 - len(one)
    with tempfile.TemporaryDirectory() as folder:
        copy = Path(folder) / f"rows{suffix}"
        copy.write_bytes(data)
        try:
            texts = read_table_file(copy, text_column)
        except InputError as e:
            raise InputError(str(e).replace(str(copy), str(path))) from None
    return texts.documents, texts.skipped


def _expand(paths: PathLike | Iterable[PathLike]) -> Iterator[Path]:
    items = [paths] if isinstance(paths, (str, os.PathLike)) else list(paths)
    if not items:
        raise InputError(
            "no paths given: pass a text file, a directory of .txt/.md files, or a list of them"
        )
    for item in items:
        if not isinstance(item, (str, os.PathLike)):
            raise TypeError(f"expected a path (str or Path), got {type(item).__name__}: {item!r}")
        p = Path(item).expanduser()
        if p.is_dir():
            found = sorted(
                (f for f in p.rglob("*") if f.suffix.lower() in TEXT_SUFFIXES and f.is_file()),
                key=lambda f: f.relative_to(p).as_posix(),
            )
            if not found:
                raise InputError(
                    f"directory {p} has no {'/'.join(TEXT_SUFFIXES)} files: "
                    "put text files there or pass the files themselves"
                )
            yield from found
        elif p.exists():
            yield p
        else:
            raise FileNotFoundError(f"text file {p} does not exist: check the path")


def text_files(paths: PathLike | Iterable[PathLike], *, name: str | None = None) -> Corpus:
    """A corpus of UTF-8 text files, one document per file; a directory adds its .txt/.md files.

    Directories are searched recursively and their files taken in sorted order. A file named twice
    counts once; Windows line ends become ``\\n`` and a UTF-8 byte-order mark is dropped.

    Args:
        paths (str | PathLike | Iterable[str | PathLike]): A file, a directory, or a list of them.
        name (str | None): The corpus name; None: the file's name for one file, else
            ``"text-files"``.

    Returns:
        Corpus: One document per file, ``source`` listing the first files.

    Raises:
        InputError: If no path is given, a directory holds no .txt/.md file, or a file is binary,
            not UTF-8, or empty.
        FileNotFoundError: If a path does not exist.
        TypeError: If an item of ``paths`` is not a path.

    Examples:
        >>> import pathlib, tempfile
        >>> folder = pathlib.Path(tempfile.mkdtemp())
        >>> _ = (folder / "a.txt").write_text("The first file.")
        >>> _ = (folder / "b.md").write_text("The second file.")
        >>> corpus = text_files(folder)
        >>> corpus.name, corpus.documents
        ('text-files', ('The first file.', 'The second file.'))
    """
    files = list(dict.fromkeys(_expand(paths)))  # a file named twice counts once
    docs = tuple(_read_text_file(f) for f in files)
    shown = ", ".join(str(f) for f in files[:5])
    if len(files) > 5:
        shown += f", … ({len(files)} files)"
    if name is None:
        name = files[0].name if len(files) == 1 else "text-files"
    return Corpus(name=name, documents=docs, source=f"text files: {shown}")


# --------------------------------------------------------------------------------------------
# documents read on demand
# --------------------------------------------------------------------------------------------
class StreamedCorpus:
    """Documents pulled from a stream (an HF ``IterableDataset``) only as far as a run needs them.

    Windows are cut as from a :class:`Corpus` of the same documents; :attr:`read` holds the
    documents the latest pass pulled and :attr:`sha256` fingerprints them (None before any pass).
    :func:`load_corpus` builds one from a ``datasets.IterableDataset``.

    Args:
        name (str): Short name, written into results.
        documents (Callable[[], Iterator[str]]): Called once per pass; returns a fresh iterator
            over the documents (so a second pass starts again from the first).
        source (str): Where the text came from, in words (provenance); default empty.

    Examples:
        >>> from ropelens.testing import tiny_tokenizer
        >>> texts = ["one two", "three four five", "six"]
        >>> stream = StreamedCorpus("lines", lambda: iter(texts), "a list, streamed")
        >>> stream.sha256 is None  # nothing read yet
        True
        >>> windows(stream, tiny_tokenizer(), 5, n_windows=1).shape
        torch.Size([1, 5])
        >>> stream.read  # one document was enough for one window
        ('one two',)
    """

    def __init__(self, name: str, documents: Callable[[], Iterator[str]], source: str = "") -> None:
        self.name = name
        self.source = source
        self._documents = documents
        self.read: tuple[str, ...] = ()

    def __repr__(self) -> str:
        return f"StreamedCorpus(name={self.name!r}, read={len(self.read)}, source={self.source!r})"

    def iter_documents(self) -> Iterator[str]:
        """A fresh pass over the stream; what it yields is recorded in :attr:`read`."""
        self.read = ()
        read: list[str] = []
        for doc in self._documents():
            read.append(doc)
            self.read = tuple(read)
            yield doc

    @property
    def sha256(self) -> str | None:
        """Fingerprint of the documents the latest pass read (as :attr:`Corpus.sha256`)."""
        return _fingerprint(self.read) if self.read else None


# --------------------------------------------------------------------------------------------
# resolving a corpus: names, paths, documents and datasets
# --------------------------------------------------------------------------------------------
CORPORA: dict[str, str] = {
    "english": "CPython language reference, English prose (~465 kB, ships with Python)",
    "python": f"Python standard library source (first {DEFAULT_CODE_BYTES:,} bytes)",
}
_BUILDERS = {"english": english, "python": python_code}
_GLOB_CHARS = frozenset("*?[")
_FORMS = (
    "a built-in corpus ('english', 'python'), a path (.txt/.md, .jsonl, .csv, .parquet, a folder "
    "of them or a datasets save_to_disk folder), a glob, a list of strings or a datasets.Dataset"
)


def _table_corpus(files: Sequence[Path], text_column: str, name: str | None) -> Corpus:
    """Documents of text files (one each) and table files (one per row), in the order given."""
    docs: list[str] = []
    skipped = 0
    for f in files:
        if _inner_suffix(f) in TABLE_SUFFIXES:
            documents, empty = _table_documents(f, text_column)
            docs.extend(documents)
            skipped += empty
        else:
            docs.append(_read_text_file(f))
    if not docs:
        shown = ", ".join(str(f) for f in files[:3])
        raise InputError(
            f"no text in column {text_column!r} of {shown}: every row is empty; choose the column "
            "that holds the text with text_column= (--text-column)"
        )
    shown = ", ".join(str(f) for f in files[:5]) + (f", … ({len(files)} files)" * (len(files) > 5))
    note = f", {skipped} empty rows skipped" * bool(skipped)
    tables = any(_inner_suffix(f) in TABLE_SUFFIXES for f in files)
    column = f" (column {text_column!r}{note})" if tables else ""
    if name is None:
        name = files[0].name if len(files) == 1 else "text-files"
    return Corpus(name=name, documents=tuple(docs), source=f"files: {shown}{column}")


def _holds_one_object(path: Path) -> bool:
    """Whether a .json file is one JSON object (a dataset's metadata), not rows of text."""
    try:
        return isinstance(json.loads(_file_bytes(path)), dict)
    except (InputError, ValueError):
        return False


def _folder_files(folder: Path) -> list[Path]:
    """The table files under ``folder`` (its .txt/.md files when it holds none), sorted."""
    files = sorted(
        (f for f in folder.rglob("*") if f.is_file()),
        key=lambda f: f.relative_to(folder).as_posix(),
    )
    tables = [f for f in files if _inner_suffix(f) in TABLE_SUFFIXES]
    if any(_inner_suffix(f) != ".json" for f in tables):  # a .json beside them is metadata
        tables = [f for f in tables if _inner_suffix(f) != ".json" or not _holds_one_object(f)]
    found = tables or [f for f in files if f.suffix.lower() in TEXT_SUFFIXES]
    if not found:
        raise InputError(
            f"folder {folder} has no text (.txt/.md) or table ({', '.join(TABLE_SUFFIXES)}) files: "
            "put documents there or pass the files themselves"
        )
    return found


def _is_saved_dataset(folder: Path) -> bool:
    """Whether ``save_to_disk`` wrote ``folder``: a DatasetDict's index, or a Dataset's
    state.json beside its .arrow shards (a state.json among JSON Lines files is just a file)."""
    if (folder / "dataset_dict.json").is_file():
        return True
    return (folder / "state.json").is_file() and any(folder.glob("*.arrow"))


def _saved_dataset(folder: Path, text_column: str) -> Corpus:
    """A folder ``datasets.Dataset.save_to_disk`` wrote (a DatasetDict's is refused, naming its
    splits)."""
    import datasets

    if (folder / "dataset_dict.json").is_file():
        splits = json.loads((folder / "dataset_dict.json").read_text()).get("splits", [])
        raise InputError(
            f"{folder} holds a DatasetDict with splits {', '.join(map(repr, splits))}: pass one "
            f"split's folder, e.g. {folder / (splits[0] if splits else 'train')}"
        )
    return _dataset_corpus(datasets.load_from_disk(str(folder)), text_column, source=str(folder))


def _dataset_corpus(ds: Any, text_column: str, source: str = "") -> Corpus:
    texts = dataset_texts(ds, text_column)
    where = source or f"datasets.Dataset of {ds.num_rows:,} rows"
    if not texts.documents:
        raise InputError(
            f"no text in column {text_column!r} of {where}: every row is empty; choose the column "
            "that holds the text with text_column= (--text-column)"
        )
    note = f", {texts.skipped} empty rows skipped" * bool(texts.skipped)
    return Corpus(
        name=dataset_name(ds),
        documents=tuple(texts.documents),
        source=f"{where} (column {text_column!r}{note})",
    )


def _streamed_corpus(ds: Any, text_column: str) -> StreamedCorpus:
    stream_texts(ds, text_column)  # a missing column fails now, not at the first window
    return StreamedCorpus(
        dataset_name(ds),
        lambda: stream_texts(ds, text_column),
        f"streamed datasets.IterableDataset (column {text_column!r})",
    )


def _document_list(items: Sequence[Any], text_column: str) -> Corpus:
    if not items:
        raise InputError(
            f"the corpus is an empty list: give at least one document, or pass {_FORMS}"
        )
    kinds = {type(x) for x in items}
    if all(isinstance(x, os.PathLike) for x in items):  # files, each read by its suffix
        files = [f for x in items for f in _path_files(Path(x).expanduser())]
        return _table_corpus(list(dict.fromkeys(files)), text_column, None)
    bad = next((i for i, x in enumerate(items) if not isinstance(x, str)), None)
    if bad is not None:
        raise InputError(
            f"item {bad} of the corpus list is a {type(items[bad]).__name__}, not a str "
            f"({', '.join(sorted(k.__name__ for k in kinds))} given): a list is read as documents, "
            "one str each (Path objects: files)"
        )
    empty = next((i for i, x in enumerate(items) if not x.strip()), None)
    if empty is not None:
        raise InputError(f"document {empty} of the corpus list is empty: drop it or give it text")
    return Corpus(
        name="documents", documents=tuple(items), source=f"{len(items)} documents given in Python"
    )


def _path_files(path: Path) -> list[Path]:
    if path.is_dir():
        return _folder_files(path)
    if path.exists():  # a file, a named pipe or /dev/stdin
        return [path]
    raise FileNotFoundError(f"corpus file {path} does not exist: check the path")


def _from_path(key: str, text_column: str) -> Corpus:
    path = Path(key).expanduser()
    if path.is_dir():
        if _is_saved_dataset(path):
            return _saved_dataset(path, text_column)
        return _table_corpus(_folder_files(path), text_column, None)
    if path.exists():  # a file, a named pipe or /dev/stdin
        return _table_corpus([path], text_column, None)
    if _GLOB_CHARS & set(key):
        found = sorted(
            (Path(f) for f in glob.glob(os.path.expanduser(key), recursive=True)),
            key=lambda f: f.as_posix(),
        )
        found = [f for f in found if f.is_file() and _inner_suffix(f) in _ALL_SUFFIXES]
        if not found:
            raise InputError(
                f"corpus pattern {key!r} matches no text or table file: check the pattern "
                f"(files ending {', '.join(_ALL_SUFFIXES)})"
            )
        return _table_corpus(found, text_column, key)
    choices = ", ".join(repr(c) for c in CORPORA)
    looks_like_path = _inner_suffix(path) in _ALL_SUFFIXES or os.sep in key or "/" in key
    if looks_like_path or key.startswith((".", "~")):
        raise FileNotFoundError(
            f"corpus path {key!r} does not exist: check the path, or use a built-in corpus "
            f"({choices})"
        )
    raise InputError(
        f"unknown corpus {key!r}: choose from {choices}, or pass a path to a .txt/.md, .jsonl, "
        ".csv or .parquet file, a folder of them, or a datasets save_to_disk folder"
    )


_ALL_SUFFIXES = TEXT_SUFFIXES + TABLE_SUFFIXES


def load_corpus(
    spec: Any = DEFAULT_CORPUS, *, text_column: str = DEFAULT_TEXT_COLUMN
) -> Corpus | StreamedCorpus:
    """Resolve a corpus given in any form a researcher keeps one.

    ``spec`` may be:

    - ``"english"`` (default, also for None) or ``"python"``: the built-in corpora;
    - a path: a .txt/.md file (one document), a JSONL/JSON, CSV/TSV or Parquet file (one document
      per row, from ``text_column``), a folder ``datasets``' ``save_to_disk`` wrote, or a folder
      of such files (its table files, else its .txt/.md files, recursively in sorted order); a
      glob pattern (``"data/*.jsonl"``) reads its matches in sorted order;
    - a list or tuple of strings, each a document (of ``Path`` objects: text files);
    - a ``datasets.Dataset`` (or one split of a DatasetDict): its ``text_column``; an
      ``IterableDataset`` is streamed (:class:`StreamedCorpus`): a run pulls only the documents
      its windows need;
    - a :class:`Corpus` or :class:`StreamedCorpus`, returned as it is.

    Rows with an empty or null text are skipped; a list's documents must all have text. An
    empty name or list is refused: it never stands for the default corpus.

    Args:
        spec (Any): The corpus in any of the forms above; default ``"english"``.
        text_column (str): The column holding the text in tables and datasets (default
            ``"text"``).

    Returns:
        Corpus | StreamedCorpus: The documents, with a name and a ``source`` saying where they
        came from; a :class:`StreamedCorpus` for an ``IterableDataset``.

    Raises:
        InputError: If the name is unknown or empty, the list is empty or holds a non-string or
            empty document, a DatasetDict is given whole, a folder or pattern holds no text, or
            the column holds no text (the message names the fix).
        FileNotFoundError: If ``spec`` looks like a path that does not exist.

    Examples:
        >>> corpus = load_corpus(["The first text.", "The second."])
        >>> corpus.name, corpus.n_documents, corpus.source
        ('documents', 2, '2 documents given in Python')
        >>> load_corpus().name  # the CPython language reference, shipped with Python
        'english'
    """
    if spec is None:
        spec = DEFAULT_CORPUS
    if isinstance(spec, (Corpus, StreamedCorpus)):
        return spec
    text_column = check_text_column(text_column)
    if isinstance(spec, (list, tuple)):
        return _document_list(spec, text_column)
    if is_dataset_dict(spec):
        raise InputError(
            f"a whole DatasetDict was given (splits: {', '.join(map(repr, spec))}): pass one "
            f'split, e.g. ds["{next(iter(spec), "train")}"]'
        )
    if is_dataset(spec):
        return _dataset_corpus(spec, text_column)
    if is_iterable_dataset(spec):
        return _streamed_corpus(spec, text_column)
    if not isinstance(spec, (str, os.PathLike)):
        raise InputError(f"a corpus cannot be a {type(spec).__name__}: pass {_FORMS}")
    key = os.fspath(spec)
    if not key.strip():
        raise InputError(
            f"the corpus name is empty: pass {_FORMS} (None or leaving it out means 'english')"
        )
    builder = _BUILDERS.get(key.strip().lower())
    if builder is not None:
        return builder()
    return _from_path(key, text_column)


# --------------------------------------------------------------------------------------------
# tokens and windows
# --------------------------------------------------------------------------------------------
def _tokenizer_of(tokenizer_or_model: Any) -> Any:
    """The HF tokenizer itself, or the ``.tokenizer`` of a model such as a TransformerLens
    bridge."""
    from transformers import PreTrainedTokenizerBase

    if isinstance(tokenizer_or_model, PreTrainedTokenizerBase):
        return tokenizer_or_model
    tok = getattr(tokenizer_or_model, "tokenizer", None)
    if isinstance(tok, PreTrainedTokenizerBase):
        return tok
    if hasattr(tokenizer_or_model, "tokenizer"):
        raise InputError(
            f"{type(tokenizer_or_model).__name__} has no tokenizer (its .tokenizer is {tok!r}): "
            "pass an HF tokenizer explicitly"
        )
    raise TypeError(
        "expected an HF tokenizer or a model with a .tokenizer, got "
        f"{type(tokenizer_or_model).__name__}"
    )


def _batches(corpus: Corpus | StreamedCorpus) -> Iterator[list[str]]:
    """Documents in tokenizer batches; a stream one document at a time, so it is read no further
    than needed."""
    if isinstance(corpus, StreamedCorpus):
        for doc in corpus.iter_documents():
            yield [doc]
        return
    docs = corpus.documents
    for start in range(0, len(docs), _TOKENIZE_BATCH):
        yield list(docs[start : start + _TOKENIZE_BATCH])


def token_stream(
    corpus: Corpus | StreamedCorpus, tokenizer: Any, *, max_tokens: int | None = None
) -> Int[Tensor, " n_tokens"]:
    """The corpus as one token sequence: documents without special tokens, joined by EOS if any.

    With ``max_tokens`` tokenizing stops once at least that many tokens exist (the stream may be
    longer; it is never cut, so callers slice). ``tokenizer`` may be a model with ``.tokenizer``.

    Args:
        corpus (Corpus | StreamedCorpus): The documents.
        tokenizer (Any): An HF tokenizer, or a model with a ``.tokenizer`` (a TransformerLens
            bridge from :func:`ropelens.load_model`).
        max_tokens (int | None): Stop tokenizing once the stream holds at least this many tokens
            (None: the whole corpus).

    Returns:
        Tensor: ``[n_tokens]`` token ids (int64).

    Raises:
        InputError: If the corpus yields no document, or the model has no tokenizer.
        TypeError: If ``tokenizer`` is neither a tokenizer nor a model with one.

    Examples:
        >>> from ropelens.testing import tiny_tokenizer
        >>> tok = tiny_tokenizer()  # one token per character; EOS is 2
        >>> token_stream(Corpus("two", ("ab", "c")), tok).tolist()
        [69, 70, 2, 71]
    """
    tok = _tokenizer_of(tokenizer)
    sep = [tok.eos_token_id] if tok.eos_token_id is not None else []
    ids: list[int] = []
    first = True
    for batch in _batches(corpus):
        # verbose=False: documents are longer than model_max_length on purpose; windows cut them.
        encoded = tok(batch, add_special_tokens=False, return_attention_mask=False, verbose=False)
        for doc_ids in encoded["input_ids"]:
            if not first:
                ids.extend(sep)
            first = False
            ids.extend(doc_ids)
        if max_tokens is not None and len(ids) >= max_tokens:
            break
    if first:
        raise InputError(
            f"corpus {corpus.name!r} yielded no documents: the stream is empty or every row's text "
            "is empty; pass a dataset with text"
        )
    return torch.tensor(ids, dtype=torch.long)


def _check_count(name: str, value: int | None, minimum: int) -> None:
    if value is None:
        return
    if not _is_int(value) or value < minimum:
        raise InputError(f"{name} must be an int >= {minimum} or None, got {value!r}")


def windows(
    corpus: Corpus | StreamedCorpus,
    tokenizer: Any,
    n_ctx: int,
    *,
    n_windows: int | None = None,
    max_tokens: int | None = None,
    bos: Bos = "prepend",
    stride: int | None = None,
) -> Int[Tensor, "n_windows n_ctx"]:
    """Cut the corpus's token stream (see ``token_stream``) into windows of ``n_ctx`` tokens.

    ``bos="prepend"``: each window is the tokenizer's BOS then ``n_ctx - 1`` text tokens;
    ``bos="none"``: ``n_ctx`` text tokens. Window i starts at text token ``i * stride`` (default:
    the text length, so windows tile the stream without overlap; any tail shorter than a window
    is dropped). Windows cross document boundaries. ``max_tokens`` caps the total tokens returned
    (``max_tokens // n_ctx`` windows) and ``n_windows`` caps the count; the smaller cap wins.

    Args:
        corpus (Corpus | StreamedCorpus): The documents (a stream is read only as far as the caps
            need).
        tokenizer (Any): An HF tokenizer, or a model with a ``.tokenizer``.
        n_ctx (int): Tokens per window, BOS included (≥ 2).
        n_windows (int | None): At most this many windows (None: no cap).
        max_tokens (int | None): At most this many tokens in all, ≥ ``n_ctx`` (None: no cap).
        bos (str): ``"prepend"`` (default) or ``"none"``.
        stride (int | None): Text tokens between window starts (None: the window's text length).

    Returns:
        Tensor: ``[n_windows, n_ctx]`` token ids (int64).

    Raises:
        InputError: If ``n_ctx``, ``bos`` or a cap is invalid, ``bos="prepend"`` and the tokenizer
            has no BOS token, or the corpus is shorter than one window.

    Examples:
        >>> from ropelens.testing import tiny_tokenizer
        >>> tok = tiny_tokenizer()  # one token per character; BOS is 1, EOS 2
        >>> corpus = Corpus("two", ("abc de", "fgh"))
        >>> windows(corpus, tok, 4).tolist()
        [[1, 69, 70, 71], [1, 4, 72, 73], [1, 2, 74, 75]]
        >>> windows(corpus, tok, 4, bos="none", stride=2).shape
        torch.Size([4, 4])
    """
    if not _is_int(n_ctx) or n_ctx < 2:
        raise InputError(f"n_ctx must be an int >= 2 (a window needs two positions), got {n_ctx!r}")
    if bos not in ("prepend", "none"):
        raise InputError(f"bos must be 'prepend' or 'none', got {bos!r}")
    _check_count("n_windows", n_windows, 1)
    _check_count("stride", stride, 1)
    _check_count("max_tokens", max_tokens, 1)
    if max_tokens is not None and max_tokens < n_ctx:
        raise InputError(
            f"max_tokens={max_tokens} is less than one window of n_ctx={n_ctx}: raise max_tokens "
            "or lower n_ctx"
        )
    tok = _tokenizer_of(tokenizer)
    bos_id = bos_token_id(tok)  # the one BOS policy of every ropelens input
    if bos == "prepend" and bos_id is None:
        raise InputError(
            f"bos='prepend' but the tokenizer ({type(tok).__name__}) has no BOS token: use "
            "bos='none'"
        )
    n_ctx = int(n_ctx)
    n_text = n_ctx - 1 if bos == "prepend" else n_ctx
    step = n_text if stride is None else int(stride)
    by_tokens = None if max_tokens is None else int(max_tokens) // n_ctx
    caps = [int(c) for c in (n_windows, by_tokens) if c is not None]
    cap = min(caps) if caps else None
    needed = None if cap is None else (cap - 1) * step + n_text
    stream = token_stream(corpus, tok, max_tokens=needed)
    if stream.numel() < n_text:
        raise InputError(
            f"corpus {corpus.name!r} has {stream.numel()} tokens but one window of n_ctx={n_ctx} "
            f"(bos={bos!r}) needs {n_text}: lower n_ctx or use a larger corpus"
        )
    out = stream.unfold(0, n_text, step)
    if cap is not None:
        out = out[:cap]
    if bos == "prepend":
        bos_column = torch.full((out.shape[0], 1), bos_id, dtype=torch.long)
        out = torch.cat([bos_column, out], dim=1)
    return out.contiguous()


def check_token_windows(tokens: Any) -> Tensor:
    """``tokens`` if it is a ready ``[n_windows, n_ctx]`` integer tensor with at least one window of
    at least two tokens; else an InputError naming what is wrong (empty above all) and the fix.

    Every corpus analysis reads its windows through here (:func:`analysis_windows`,
    :class:`ropelens.run.measure.Windows`), so an empty input is refused before a model runs,
    instead of giving sums of nothing that read as measurements.

    Args:
        tokens (Any): The ready token windows.

    Returns:
        Tensor: ``tokens`` itself.

    Raises:
        InputError: If ``tokens`` is not a 2-D integer tensor, holds no window, or its windows
            hold fewer than two tokens.

    Examples:
        >>> import torch
        >>> check_token_windows(torch.ones(2, 8, dtype=torch.long)).shape
        torch.Size([2, 8])
        >>> check_token_windows(torch.zeros(0, 32, dtype=torch.long))
        Traceback (most recent call last):
            ...
        ropelens.errors.InputError: the token input holds no windows (shape (0, 32)): ...
    """
    if not isinstance(tokens, Tensor):
        raise InputError(
            f"token input must be an integer [n_windows, n_ctx] tensor, got {type(tokens).__name__}"
        )
    shape = tuple(tokens.shape)
    if tokens.ndim != 2 or tokens.dtype not in (torch.int64, torch.int32):
        raise InputError(
            f"token input must be an integer [n_windows, n_ctx] tensor, got {tokens.dtype} {shape}"
        )
    if shape[0] == 0:
        raise InputError(
            f"the token input holds no windows (shape {shape}): pass at least one window of "
            "tokens, or a corpus to cut windows from"
        )
    if shape[1] < 2:
        raise InputError(
            f"the token input's windows hold {shape[1]} token{'' if shape[1] == 1 else 's'} "
            f"(shape {shape}): a window needs at least two positions (BOS and one token); pass "
            "longer windows"
        )
    return tokens


def analysis_windows(
    tokenizer: Any,
    corpus: Any,
    n_ctx: int,
    max_tokens: int | None,
    text_column: str = DEFAULT_TEXT_COLUMN,
) -> tuple[Int[Tensor, "n_windows n_ctx"], str, str | None]:
    """What every corpus analysis runs on: token windows, the corpus name and its fingerprint.

    ``corpus`` is any form :func:`load_corpus` reads (None is the default corpus; ``text_column``
    picks a table's or dataset's text), or a ready integer ``[n_windows, n_ctx]`` token tensor,
    used whole. A streamed corpus's fingerprint covers the documents the windows were cut from.

    Args:
        tokenizer (Any): An HF tokenizer, or a model with a ``.tokenizer``.
        corpus (Any): Any form :func:`load_corpus` reads, or a ``[n_windows, n_ctx]`` integer
            tensor of tokens.
        n_ctx (int): Tokens per window, BOS included (ignored for a token tensor).
        max_tokens (int | None): At most this many tokens in all (None: the whole corpus).
        text_column (str): The text column of tables and datasets (default ``"text"``).

    Returns:
        tuple[Tensor, str, str | None]: ``(tokens, name, sha256)``: the ``[n_windows, n_ctx]``
        windows, the corpus name (``"tokens"`` for a tensor) and its fingerprint (None for a
        tensor).

    Raises:
        InputError: If a tensor is not 2-D integer or is empty (no windows, or windows shorter
            than two tokens), or as :func:`load_corpus` and :func:`windows` do.

    Examples:
        >>> from ropelens.testing import tiny_model
        >>> model = tiny_model("llama")
        >>> tokens, name, sha256 = analysis_windows(model, None, n_ctx=32, max_tokens=128)
        >>> tuple(tokens.shape), name
        ((4, 32), 'english')
        >>> analysis_windows(model, tokens, n_ctx=32, max_tokens=None)[1:]
        ('tokens', None)
    """
    if isinstance(corpus, Tensor):
        return check_token_windows(corpus).long(), "tokens", None
    c = load_corpus(corpus, text_column=text_column)
    tokens = windows(c, tokenizer, n_ctx, max_tokens=max_tokens)  # a stream is read here
    return tokens, c.name, c.sha256
