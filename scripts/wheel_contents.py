"""Check that ropelens's sdist and wheel hold every file the package needs.

Usage: python scripts/wheel_contents.py SDIST.tar.gz WHEEL.whl
       python scripts/wheel_contents.py --copy-to DIR   (the project's files, to build from)

Every file under src/ropelens that git tracks or would track (the modules and the package data:
the band mixer's script and style sheet, tested_versions.txt, py.typed) must be in the sdist and in
the wheel, and the wheel must hold nothing else besides its .dist-info; the wheel's version must be
pyproject's and its console script ``ropelens``. Prints one line per problem and exits 1 if there
is any. (The embedded corpora are read from the standard library, so they ship with Python.)

``--copy-to`` copies the files git tracks or would track (not those it ignores) to DIR, as a fresh
clone holds them: a build there cannot pick up a stale ``*.egg-info`` manifest, which setuptools
reads and which would put a file into the sdist that the package data rules no longer name.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = "ropelens"
ENTRY_POINT = "ropelens = ropelens.cli:main"


def project_version(root: Path = ROOT) -> str:
    """The version pyproject.toml's [project] table declares."""
    text = (root / "pyproject.toml").read_text()
    project = text.split("[project]", 1)[1].split("\n[", 1)[0]
    found = re.search(r'^version\s*=\s*"([^"]+)"', project, re.MULTILINE)
    if not found:
        raise SystemExit("wheel_contents: pyproject.toml's [project] table names no version")
    return found.group(1)


def package_files(root: Path = ROOT) -> list[str]:
    """The files under src/ropelens, relative to src/: those git tracks or would track (not those
    it ignores), or (outside a git checkout) every file but caches."""
    files = [f.removeprefix("src/") for f in _git_files(root, f"src/{PACKAGE}")]
    if not files:
        src = root / "src"
        files = [
            p.relative_to(src).as_posix()
            for p in (src / PACKAGE).rglob("*")
            if p.is_file() and "__pycache__" not in p.parts and p.suffix != ".pyc"
        ]
    return sorted(files)


def _git_files(root: Path, *paths: str) -> list[str]:
    """The files git tracks or would track under ``paths`` (all when none); [] outside git."""
    try:
        out = subprocess.run(
            ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard", *paths],
            cwd=root,
            capture_output=True,
            check=True,
            timeout=30,
        ).stdout.decode()
    except (OSError, subprocess.SubprocessError):
        return []
    return sorted({f for f in out.split("\0") if f and (root / f).is_file()})


_UNSHIPPED = {".git", ".venv", ".venv-latest", "build", "dist", "__pycache__"}


def copy_source(dest: Path, root: Path = ROOT) -> int:
    """Copy the project's files to ``dest`` as a fresh clone holds them; returns how many."""
    files = _git_files(root)
    if not files:  # not a git checkout: everything but environments, caches and build output
        files = [
            p.relative_to(root).as_posix()
            for p in root.rglob("*")
            if p.is_file()
            and not _UNSHIPPED & set(p.relative_to(root).parts)
            and not any(part.endswith(".egg-info") for part in p.parts)
        ]
    for f in files:
        (dest / f).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(root / f, dest / f)
    return len(files)


def sdist_problems(names: list[str], expected: list[str], version: str) -> list[str]:
    """What the sdist (its member names) lacks: the package's files, pyproject.toml, README.md."""
    top = f"{PACKAGE}-{version}/"
    have = {n.removeprefix(top) for n in names if n.startswith(top)}
    if not have:
        return [f"sdist: no member under {top} (is it version {version} of {PACKAGE}?)"]
    need = ["pyproject.toml", "README.md"] + [f"src/{f}" for f in expected]
    return [f"sdist: {n} is missing" for n in need if n not in have]


def wheel_problems(
    names: list[str], expected: list[str], version: str, metadata: str, entry_points: str
) -> list[str]:
    """What the wheel (its member names, METADATA and entry_points.txt) lacks or holds besides."""
    info = f"{PACKAGE}-{version}.dist-info/"
    have = set(names)
    problems = [f"wheel: {f} is missing" for f in expected if f not in have]
    extra = sorted(
        n for n in have - set(expected) if not n.startswith(info) and not n.endswith("/")
    )
    problems += [f"wheel: {n} is not a file of src/{PACKAGE} (stray build output?)" for n in extra]
    meta = re.search(r"^Version: (\S+)$", metadata, re.MULTILINE)
    if not meta or meta.group(1) != version:
        got = meta.group(1) if meta else "none"
        problems.append(f"wheel: METADATA says version {got}, pyproject.toml {version}")
    if not re.search(r"^ropelens\s*=\s*ropelens\.cli:main\s*$", entry_points, re.MULTILINE):
        problems.append(f"wheel: entry_points.txt lacks the console script `{ENTRY_POINT}`")
    return problems


def read_wheel(path: Path, version: str) -> tuple[list[str], str, str]:
    info = f"{PACKAGE}-{version}.dist-info/"
    with zipfile.ZipFile(path) as z:
        names = z.namelist()

        def member(name: str) -> str:
            return z.read(info + name).decode() if info + name in names else ""

        return names, member("METADATA"), member("entry_points.txt")


def check(sdist: Path, wheel: Path, root: Path = ROOT) -> list[str]:
    """Every problem with ``sdist`` and ``wheel`` against the checkout at ``root``."""
    version = project_version(root)
    expected = package_files(root)
    if not expected:
        return [f"found no files under {root / 'src' / PACKAGE}"]
    with tarfile.open(sdist) as t:
        problems = sdist_problems(t.getnames(), expected, version)
    names, metadata, entry_points = read_wheel(wheel, version)
    return problems + wheel_problems(names, expected, version, metadata, entry_points)


def main(argv: list[str]) -> int:
    if len(argv) == 2 and argv[0] == "--copy-to":
        n = copy_source(Path(argv[1]))
        print(f"wheel_contents: copied {n} project files to {argv[1]}")
        return 0
    if len(argv) != 2:
        print(__doc__.split("\n\n")[1], file=sys.stderr)
        return 2
    sdist, wheel = (Path(a) for a in argv)
    problems = check(sdist, wheel)
    for p in problems:
        print(f"wheel_contents: {p}", file=sys.stderr)
    if problems:
        return 1
    data = [f for f in package_files() if not f.endswith(".py")]
    print(
        f"wheel_contents: {sdist.name} and {wheel.name} hold all {len(package_files())} files of "
        f"src/{PACKAGE}, package data included ({', '.join(data)})"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
