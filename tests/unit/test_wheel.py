"""The wheel a user installs: scripts/wheel_contents.py's check of the sdist and wheel, the real
build (marker ``wheel``), and the install instructions docs/guide/install.md gives.

CI runs ``scripts/check_wheel.sh`` after the tests: it builds the sdist and wheel, runs the same
check, installs the wheel into a fresh venv with the tested constraints and runs ropelens outside
the checkout. CI's pytest therefore deselects the marker ``wheel`` (the same build and check would
run twice); a contributor's plain ``pytest`` runs it.
"""

from __future__ import annotations

import importlib.util
import io
import re
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

from ropelens.results import provenance

ROOT = Path(__file__).resolve().parents[2]
PACKAGE_DATA = (
    "ropelens/plots/band_mixer.js",
    "ropelens/plots/band_mixer.css",
    "ropelens/tested_versions.txt",
    "ropelens/py.typed",
)


def _load_checker():
    spec = importlib.util.spec_from_file_location(
        "wheel_contents", ROOT / "scripts/wheel_contents.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


wc = _load_checker()
VERSION = wc.project_version(ROOT)
FILES = wc.package_files(ROOT)


def _sdist(path: Path, members: list[str]) -> Path:
    with tarfile.open(path, "w:gz") as t:
        for name in members:
            info = tarfile.TarInfo(f"ropelens-{VERSION}/{name}")
            info.size = 1
            t.addfile(info, io.BytesIO(b"x"))
    return path


def _wheel(path: Path, members: list[str], *, version: str = VERSION, script: bool = True) -> Path:
    info = f"ropelens-{VERSION}.dist-info/"
    with zipfile.ZipFile(path, "w") as z:
        for name in members:
            z.writestr(name, "x")
        z.writestr(
            info + "METADATA", f"Metadata-Version: 2.4\nName: ropelens\nVersion: {version}\n"
        )
        entry = "[console_scripts]\nropelens = ropelens.cli:main\n" if script else ""
        z.writestr(info + "entry_points.txt", entry)
    return path


def test_the_package_files_are_the_same_with_and_without_git(monkeypatch):
    """Outside a git checkout the checker walks src/ropelens (caches skipped): the same files."""

    def no_git(*args, **kwargs):
        raise FileNotFoundError("git")

    assert set(PACKAGE_DATA) <= set(FILES)
    assert {"ropelens/__init__.py", "ropelens/cli/main.py", "ropelens/testing/__init__.py"} <= set(
        FILES
    )
    monkeypatch.setattr(wc.subprocess, "run", no_git)
    assert wc.package_files(ROOT) == FILES


def test_the_copy_to_build_from_holds_the_project_and_no_build_output(tmp_path):
    n = wc.copy_source(tmp_path, ROOT)
    copied = sorted(p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*") if p.is_file())
    assert len(copied) == n
    assert {"pyproject.toml", "README.md"} | {f"src/{f}" for f in FILES} <= set(copied)
    assert not [
        f for f in copied if ".egg-info" in f or "__pycache__" in f or f.startswith(".venv")
    ]
    for f in ("pyproject.toml", "src/ropelens/plots/band_mixer.js"):
        assert (tmp_path / f).read_bytes() == (ROOT / f).read_bytes()


def test_complete_archives_pass_and_each_missing_file_is_named(tmp_path):
    sdist_members = ["pyproject.toml", "README.md"] + [f"src/{f}" for f in FILES]
    sdist = _sdist(tmp_path / "ok.tar.gz", sdist_members)
    assert wc.check(sdist, _wheel(tmp_path / "ok.whl", FILES), ROOT) == []

    for lost in PACKAGE_DATA:
        short = _sdist(tmp_path / "short.tar.gz", [m for m in sdist_members if m != f"src/{lost}"])
        bare = _wheel(tmp_path / "bare.whl", [f for f in FILES if f != lost])
        assert wc.check(short, bare, ROOT) == [
            f"sdist: src/{lost} is missing",
            f"wheel: {lost} is missing",
        ]


def test_strays_a_wrong_version_and_a_lost_console_script_are_named(tmp_path):
    sdist = _sdist(tmp_path / "s.tar.gz", ["README.md"] + [f"src/{f}" for f in FILES])
    wheel = _wheel(tmp_path / "w.whl", [*FILES, "tests/test_x.py"], version="9.9", script=False)
    assert wc.check(sdist, wheel, ROOT) == [
        "sdist: pyproject.toml is missing",
        "wheel: tests/test_x.py is not a file of src/ropelens (stray build output?)",
        f"wheel: METADATA says version 9.9, pyproject.toml {VERSION}",
        "wheel: entry_points.txt lacks the console script `ropelens = ropelens.cli:main`",
    ]
    assert wc.sdist_problems(["ropelens-0.0.1/README.md"], FILES, VERSION) == [
        f"sdist: no member under ropelens-{VERSION}/ (is it version {VERSION} of ropelens?)"
    ]


@pytest.mark.wheel
def test_the_built_sdist_and_wheel_hold_every_package_file(tmp_path):
    """The real build, from a copy of the project as a fresh clone holds it: the sdist with
    setuptools, the wheel from the sdist (as python -m build does), so a file the sdist leaves out
    is missing from the wheel too."""
    source = tmp_path / "source"
    wc.copy_source(source, ROOT)
    build = "import sys; from setuptools import build_meta as b; b.build_sdist(sys.argv[1])"
    subprocess.run(
        [sys.executable, "-c", build, str(tmp_path)], cwd=source, check=True, capture_output=True
    )
    sdist = tmp_path / f"ropelens-{VERSION}.tar.gz"
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(tmp_path), str(sdist)],
        cwd=tmp_path,
        check=True,
        capture_output=True,
    )
    wheel = tmp_path / f"ropelens-{VERSION}-py3-none-any.whl"
    assert wc.check(sdist, wheel, ROOT) == []
    with zipfile.ZipFile(wheel) as z:
        names = set(z.namelist())
        assert set(PACKAGE_DATA) <= names
        shipped = z.read("ropelens/tested_versions.txt").decode()
    assert shipped == (ROOT / "src/ropelens/tested_versions.txt").read_text()


def test_the_install_page_installs_the_tested_torch_then_the_wheel_with_the_constraints():
    page = (ROOT / "docs/guide/install.md").read_text()
    assert "\n## Install the wheel\n" in page, "docs/guide/install.md has no 'Install the wheel'"
    install = page.split("\n## Install the wheel\n", 1)[1].split("\n## ", 1)[0]
    torch = provenance.tested_versions()["torch"]
    assert f"torch=={torch}" in install
    assert re.search(r"pip install \S*ropelens-\S*\.whl -c \S*tested_versions\.txt", install)
    assert re.search(r"pip install \"?git\+\S+\"? -c \S*tested_versions\.txt", install)
    assert "https://download.pytorch.org/whl/cu" in install  # a CUDA torch, first


def test_ci_runs_the_wheel_check_and_does_not_repeat_its_build_in_pytest():
    ci = (ROOT / ".ci" / "run").read_text()
    assert "bash scripts/check_wheel.sh" in ci
    assert re.search(r"-m pytest -m \"not wheel\"", ci)
