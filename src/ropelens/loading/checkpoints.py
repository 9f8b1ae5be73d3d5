"""Training checkpoints on disk: their ``step-NNNNNN`` names and the training info saved beside the
weights.

:mod:`ropelens.training.checkpoints` writes them; :mod:`ropelens.analyses.trajectory` reads them.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

from ropelens.errors import InputError

__all__ = ["INFO_FILE", "checkpoint_name", "read_info", "step_of"]

INFO_FILE = "ropelens-train.json"
_STEP = re.compile(r"(?:^|[^a-z])step[-_]?(\d+)", re.IGNORECASE)


def checkpoint_name(step: int) -> str:
    """The directory name of the checkpoint after ``step`` optimiser steps: ``step-000200``."""
    return f"step-{int(step):06d}"


def step_of(name: str | os.PathLike[str]) -> int | None:
    """The training step a checkpoint's name states (``step-000200``, ``step1000``,
    ``stage1-step5000-tokens…``; the last path component is read), or None when it states none."""
    m = _STEP.search(Path(os.fspath(name)).name)
    return int(m.group(1)) if m else None


def read_info(path: str | os.PathLike[str]) -> dict[str, Any] | None:
    """A checkpoint's ``ropelens-train.json`` (config, step, losses), or None for a directory
    without one."""
    f = Path(path) / INFO_FILE
    if not f.is_file():
        return None
    try:
        return json.loads(f.read_text())
    except (OSError, ValueError) as e:
        raise InputError(f"{f} is not readable JSON ({e}): write the checkpoint again") from None
