"""The one atomic writer: whole files or none, with the permissions ``open()`` would give."""

from __future__ import annotations

import os
import stat

import pytest

from ropelens.results.serialize import atomic_write, atomic_write_text


def test_written_file_has_the_mode_open_gives(tmp_path):
    old = os.umask(0o022)
    try:
        atomic_write_text(tmp_path / "a.txt", "x")
        with open(tmp_path / "b.txt", "w") as f:
            f.write("x")
    finally:
        os.umask(old)
    mode = stat.S_IMODE(os.stat(tmp_path / "a.txt").st_mode)
    assert mode == stat.S_IMODE(os.stat(tmp_path / "b.txt").st_mode) == 0o644


def test_failed_write_leaves_no_file(tmp_path):
    with pytest.raises(RuntimeError), atomic_write(tmp_path / "a.txt", "w") as f:
        f.write("half")
        raise RuntimeError("stop")
    assert list(tmp_path.iterdir()) == []
