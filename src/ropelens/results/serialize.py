"""Writing results to disk: one atomic writer, JSON with tensors, and typed result files.

Every file ropelens writes goes through :func:`atomic_write`: a temp file beside the target,
renamed over it only when the write succeeded, so a reader never sees half a file.
"""

from __future__ import annotations

import base64
import contextlib
import gzip
import json
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

import numpy as np
import torch
from torch import Tensor

GZIP_MAGIC = b"\x1f\x8b"  # the first bytes of a gzip file

__all__ = [
    "GZIP_MAGIC",
    "atomic_write",
    "atomic_write_text",
    "dump_json",
    "read_json",
    "tensor_from_json",
    "tensor_to_json",
]


@contextlib.contextmanager
def atomic_write(path: str | os.PathLike[str], mode: str = "w") -> Iterator[IO[Any]]:
    """Open a temp file beside ``path``; rename it over ``path`` only if the block succeeds.

    A write that fails (no space, a name too long, a folder that refuses it) raises an
    ``OSError`` naming ``path``, the file the caller chose, never the temp file."""
    path = Path(path)
    try:
        is_dir = path.is_dir()
    except OSError as e:  # a name too long to look up
        raise _write_error(path, e) from e
    if is_dir:
        raise IsADirectoryError(f"{path} is a directory: pass a file path")
    parent = path.parent
    try:
        parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise PermissionError(
            f"cannot create output directory {parent}: {e.strerror}; choose a writable path"
        ) from e
    if not os.access(parent, os.W_OK):
        raise PermissionError(f"output directory {parent} is not writable: choose a writable path")
    try:
        # a short temp name: the caller's name may be as long as a name can be
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name[:32]}.", suffix=".tmp", dir=parent)
    except OSError as e:
        raise _write_error(path, e) from e
    try:
        with os.fdopen(fd, mode) as f:
            yield f
            try:
                f.flush()
                os.fsync(f.fileno())
            except OSError as e:
                raise _write_error(path, e) from e
        os.chmod(tmp, _created_mode())  # mkstemp's 0600: give the mode open() would have given
        try:
            os.replace(tmp, path)
        except OSError as e:
            raise _write_error(path, e) from e
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def _write_error(path: Path, error: OSError) -> OSError:
    """``error`` as raised writing ``path``, with ``path`` as the file named."""
    reason = error.strerror or str(error)
    named = type(error)(f"cannot write {path} ({reason}): choose another path")
    named.errno = error.errno
    return named


def _created_mode() -> int:
    """The permissions a file created by ``open()`` gets under the process's umask (read from
    ``/proc`` where it is there: setting the umask to read it races with other threads' writes)."""
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            umask = next(int(line.split()[1], 8) for line in f if line.startswith("Umask:"))
    except (OSError, StopIteration, ValueError, IndexError):
        umask = os.umask(0)
        os.umask(umask)
    return 0o666 & ~umask


def atomic_write_text(path: str | os.PathLike[str], text: str) -> None:
    """Write ``text`` to ``path`` atomically."""
    with atomic_write(path, "w") as f:
        f.write(text)


def dump_json(
    path: str | os.PathLike[str],
    obj: Any,
    *,
    indent: int | None = 1,
    allow_nan: bool = True,
    gzip_by_suffix: bool = False,
) -> None:
    """Write JSON atomically (tensors and numpy arrays become lists); with ``gzip_by_suffix``,
    gzip-compressed where the name ends in ``.gz`` (``u.json.gz``), for a reader that reads with
    :func:`read_json`, which reads either back."""
    text = json.dumps(obj, indent=indent, allow_nan=allow_nan, default=_default)
    if gzip_by_suffix and Path(path).suffix.lower() == ".gz":
        # mtime 0: the same content makes the same bytes
        with (
            atomic_write(path, "wb") as f,
            gzip.GzipFile(filename="", fileobj=f, mode="wb", mtime=0) as z,
        ):
            z.write(text.encode())
        return
    atomic_write_text(path, text)


def read_json(path: str | os.PathLike[str]) -> Any:
    """The JSON in ``path``, which :func:`dump_json` wrote: plain, or gzip-compressed (told by
    its first bytes, whatever its name). Raises ``json.JSONDecodeError``,
    ``UnicodeDecodeError`` or ``EOFError``/``gzip.BadGzipFile`` for a file that is neither."""
    raw = Path(path).read_bytes()
    if raw[:2] == GZIP_MAGIC:
        raw = gzip.decompress(raw)
    return json.loads(raw.decode("utf-8"))


def _default(o: Any) -> Any:
    tolist = getattr(o, "tolist", None)
    if tolist is not None:
        return tolist()
    raise TypeError(f"not JSON serialisable: {type(o).__name__}")


def tensor_to_json(t: Tensor) -> dict[str, Any]:
    """Float32 little-endian bytes in base64: a 2048² matrix is 22 MB this way, ~90 MB as text."""
    raw = t.detach().cpu().to(torch.float32).numpy().astype("<f4").tobytes()
    return {"shape": list(t.shape), "dtype": "float32", "base64": base64.b64encode(raw).decode()}


def tensor_from_json(d: dict[str, Any]) -> Tensor:
    """Inverse of :func:`tensor_to_json`."""
    arr = np.frombuffer(base64.b64decode(d["base64"]), dtype="<f4").reshape(d["shape"])
    return torch.from_numpy(arr.copy())
