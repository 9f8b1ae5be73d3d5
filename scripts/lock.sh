#!/usr/bin/env bash
# Record the exact versions installed in .venv as the tested stack (src/ropelens/tested_versions.txt).
# Run after the test suite passed in a venv built by `bash scripts/setup.sh --latest`; commit the file.
set -euo pipefail
cd "$(dirname "$0")/.."
py=${ROPELENS_VENV:-.venv}/bin/python
out=src/ropelens/tested_versions.txt
tmp=$(mktemp "$out.XXXX")
{
    echo "# The stack ropelens was tested with: pip constraints, installed by scripts/setup.sh by default."
    echo "# Written by scripts/lock.sh from a venv whose test suite passed (Python $("$py" -c 'import platform; print(platform.python_version())'))."
    # the local build label (+cpu) dropped: torch==2.13.0 matches the CPU and the CUDA builds alike
    "$py" -m pip freeze --exclude-editable 2>/dev/null | grep -v -e '^ropelens' -e ' @ ' | sed -E 's/^(torch==[^+]*)\+.*/\1/' | LC_ALL=C sort -f
} > "$tmp"
mv "$tmp" "$out"
echo "lock.sh: wrote $out ($(grep -vc '^#' "$out") packages)"
