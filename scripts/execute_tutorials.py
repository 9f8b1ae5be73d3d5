"""Execute the tutorial notebooks in docs/tutorials and store them with their outputs.

Each notebook runs top to bottom in a fresh ``python3`` kernel, offline (``HF_HUB_OFFLINE=1``), in
a temporary working directory (so nothing it writes lands in the repository), with plotly figures
emitted as ``application/vnd.plotly.v1+json`` only (no plotly.js embedded in the notebook). The
notebooks seed their own random draws, so a rerun gives the same numbers.

Usage::

    python scripts/execute_tutorials.py                 # every notebook
    python scripts/execute_tutorials.py quickstart ...  # the named ones (file stem or path)
    python scripts/execute_tutorials.py --check         # run, but do not write the notebooks
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

import nbclient
import nbformat

ROOT = Path(__file__).resolve().parents[1]
TUTORIALS = ROOT / "docs" / "tutorials"
ENV = {
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "HF_DATASETS_OFFLINE": "1",
    "HF_HUB_DISABLE_PROGRESS_BARS": "1",  # no weight-loading bars in the stored outputs
    "PYTHONWARNINGS": "ignore:IProgress not found",  # tqdm's note that ipywidgets is absent
    "PLOTLY_RENDERER": "plotly_mimetype",
    "PYTHONHASHSEED": "0",
    "TOKENIZERS_PARALLELISM": "false",
}


def notebooks(names: list[str]) -> list[Path]:
    """The notebooks named (file stem or path), or every one in docs/tutorials."""
    if not names:
        return sorted(TUTORIALS.glob("*.ipynb"))
    found = []
    for name in names:
        path = Path(name) if name.endswith(".ipynb") else TUTORIALS / f"{name}.ipynb"
        if not path.is_file():
            have = [p.stem for p in notebooks([])]
            sys.exit(f"execute_tutorials: no notebook {path}; the notebooks are {have}")
        found.append(path.resolve())
    return found


def execute(path: Path, timeout: int = 1800) -> tuple[nbformat.NotebookNode, float]:
    """Run ``path`` in a fresh kernel in a temporary directory; the notebook and its seconds."""
    os.environ.update(ENV)  # the kernel inherits this process's environment
    nb = nbformat.read(path, as_version=4)
    with tempfile.TemporaryDirectory(prefix="ropelens-tutorial-") as cwd:
        client = nbclient.NotebookClient(
            nb, timeout=timeout, kernel_name="python3", resources={"metadata": {"path": cwd}}
        )
        start = time.perf_counter()
        client.execute()
        seconds = time.perf_counter() - start
    nb.metadata.pop("widgets", None)
    return nb, seconds


def write(nb: nbformat.NotebookNode, path: Path) -> None:
    """Write ``nb`` to ``path`` atomically."""
    tmp = path.with_suffix(".ipynb.tmp")
    nbformat.write(nb, tmp)
    os.replace(tmp, path)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("names", nargs="*", help="notebook stems (default: all)")
    parser.add_argument("--check", action="store_true", help="execute only; write nothing")
    args = parser.parse_args(argv)
    for path in notebooks(args.names):
        nb, seconds = execute(path)
        size = len(nbformat.writes(nb).encode())
        print(f"{path.name:34s} {seconds:6.1f} s  {size / 1024:7.1f} KiB", flush=True)
        if not args.check:
            write(nb, path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
