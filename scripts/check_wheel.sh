#!/usr/bin/env bash
# Build ropelens's sdist and wheel, install the wheel into a fresh venv and run it outside the checkout.
# Usage: bash scripts/check_wheel.sh   (CI runs it after the tests; a few minutes, offline)
#   Builds with `python -m build` (the wheel from the sdist) where the build venv has it, else with
#   setuptools and `pip wheel`; checks both hold every file of src/ropelens (scripts/wheel_contents.py);
#   installs the tested torch first, then the wheel with its own tested_versions.txt as constraints,
#   as docs/guide/install.md ("Install the wheel") says; then, from an empty folder: `ropelens --version` (pyproject's
#   version, the tested stack), `rope-spec` on a tiny model directory and `frequency-usage` on a
#   JSONL file with --text-column, whose numbers must equal the checkout's.
#   ROPELENS_VENV=DIR: the venv that builds and runs the checkout (default .venv, as setup.sh's).
#   ROPELENS_KEEP=1 keeps the temporary folder (its path is printed).
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
venv_dir=${ROPELENS_VENV:-.venv}
case "$venv_dir" in /*) ;; *) venv_dir="$root/$venv_dir" ;; esac
py="$venv_dir/bin/python"
export PIP_NO_INPUT=1 PIP_DISABLE_PIP_VERSION_CHECK=1 HF_HUB_OFFLINE=1
unset PYTHONPATH  # the fresh venv must see its own site-packages only
start=$SECONDS

fail() {
    echo "check_wheel: FAILED: $*" >&2
    exit 1
}
step() { echo "check_wheel: [$((SECONDS - start))s] $*"; }
# a command that fails outside fail() still ends in one named line
trap 'echo "check_wheel: FAILED: line $LINENO of scripts/check_wheel.sh: $BASH_COMMAND" >&2' ERR
# run a step quietly; on failure show the end of its log and name the step
quiet() {
    local what=$1 log
    shift
    log="$work/log-$(echo "$what" | tr -c 'a-z0-9' '-').txt"
    "$@" >"$log" 2>&1 || { tail -n 40 "$log" >&2; fail "$what (log above)"; }
}

"$py" -c "" 2>/dev/null || fail "no Python at $py: run bash scripts/setup.sh first"
work=$(mktemp -d "${TMPDIR:-/tmp}/ropelens-wheel.XXXXXX")
if [ "${ROPELENS_KEEP:-0}" = 1 ]; then
    echo "check_wheel: keeping $work"
else
    trap 'step "removing $work"; rm -rf "$work"; step "removed"' EXIT
fi
version=$("$py" -c 'import sys; sys.path.insert(0, "scripts"); import wheel_contents as w; print(w.project_version())')
dist="$work/dist"

# ---- build: the sdist, then the wheel from the sdist (so the sdist must hold what the wheel needs),
# from a copy of the project as a fresh clone holds it (no stale *.egg-info, nothing written here)
source="$work/source"
"$py" scripts/wheel_contents.py --copy-to "$source" >/dev/null || fail "copying the project to $source"
if "$py" -c "import build" 2>/dev/null; then
    step "building ropelens $version with python -m build"
    quiet "python -m build" "$py" -m build --outdir "$dist" "$source"
else
    step "building ropelens $version with setuptools and pip wheel (python -m build is not installed)"
    quiet "building the sdist" env -C "$source" "$py" -c \
        "import sys; from setuptools import build_meta as b; b.build_sdist(sys.argv[1])" "$dist"
    quiet "pip wheel from the sdist" "$py" -m pip wheel --no-deps -w "$dist" "$dist/ropelens-$version.tar.gz"
fi
sdist="$dist/ropelens-$version.tar.gz"
wheel="$dist/ropelens-$version-py3-none-any.whl"
[ -f "$sdist" ] && [ -f "$wheel" ] || fail "the build made no $(basename "$sdist") and $(basename "$wheel"): $(ls "$dist")"
"$py" scripts/wheel_contents.py "$sdist" "$wheel" || fail "the sdist or the wheel lacks files (above)"
step "sdist $(du -k "$sdist" | cut -f1) KB, wheel $(du -k "$wheel" | cut -f1) KB"

# ---- install as a user would: a fresh venv, the tested torch, then the wheel with the constraints
venv="$work/venv"
quiet "creating a fresh venv" "$py" -m venv "$venv"
vpy="$venv/bin/python"
quiet "upgrading pip in the fresh venv" "$vpy" -m pip install --upgrade pip
"$vpy" -c "import zipfile, sys; sys.stdout.write(zipfile.ZipFile(sys.argv[1]).read('ropelens/tested_versions.txt').decode())" \
    "$wheel" >"$work/tested_versions.txt"
torch_pin=$(sed -n 's/^torch==//p' "$work/tested_versions.txt")
[ -n "$torch_pin" ] || fail "the wheel's tested_versions.txt pins no torch"
step "installing torch==$torch_pin into a fresh venv"
# the same pin scripts/setup.sh installs first: it resolves to the local CPU build
# --no-compile here and below: Python compiles what it imports; compiling (and later deleting) the
# bytecode of every module of torch and its company would add about 20,000 files to this venv
quiet "pip install torch==$torch_pin" "$vpy" -m pip install --no-compile "torch==$torch_pin"
step "installing the wheel with the tested constraints"
quiet "pip install the wheel" "$vpy" -m pip install --no-compile "$wheel" -c "$work/tested_versions.txt"

# ---- run it from a folder outside the checkout
outside="$work/outside"
mkdir -p "$outside"
cd "$outside"
installed=$("$vpy" -c "import ropelens; print(ropelens.__file__)")
case "$installed" in
    "$venv"/*) step "ropelens imported from $installed" ;;
    *) fail "the fresh venv imports ropelens from $installed, not from its site-packages" ;;
esac
"$venv/bin/ropelens" --version >version.txt 2>&1 || { cat version.txt >&2; fail "ropelens --version"; }
cat version.txt
head -n 1 version.txt | grep -q "^ropelens $version " ||
    fail "ropelens --version says '$(head -n 1 version.txt)', pyproject.toml says $version"
grep -q "the tested stack (tested_versions.txt)" version.txt ||
    fail "the wheel installed with its constraints is not on the tested stack: $(tail -n 1 version.txt)"

quiet "building a tiny model directory" "$vpy" -c \
    "from ropelens.testing import tiny_model_dir; tiny_model_dir('llama', 'tiny-llama')"
step "built a tiny model directory; ropelens rope-spec on it"
"$venv/bin/ropelens" rope-spec tiny-llama --device cpu --quiet --json >spec.json 2>spec.err ||
    { cat spec.err >&2; fail "ropelens rope-spec on a tiny model directory"; }
# the frequencies it reads must be the config's: inv_freq_i = theta^(-2i/d)
"$vpy" - <<'EOF' || fail "ropelens rope-spec does not read the tiny model's config (above)"
import json

spec = json.load(open("spec.json"))
config = json.load(open("tiny-llama/config.json"))
theta = config["rope_parameters"]["rope_theta"]
d = config["head_dim"]
want = [theta ** (-2 * i / d) for i in range(d // 2)]
assert spec["n_layers"] == config["num_hidden_layers"] == len(spec["layers"]), spec["n_layers"]
for layer in spec["layers"]:
    got = layer["inv_freq"]
    assert len(got) == len(want), got
    assert all(abs(g - w) <= 1e-6 * w for g, w in zip(got, want)), (got, want)
print(f"check_wheel: rope-spec reads base {theta:g}, {d // 2} planes on {len(spec['layers'])} layers")
EOF

"$vpy" - <<'EOF'
import json

words = "the cat sat on a mat while rain fell over the quiet town and nobody came".split()
with open("docs.jsonl", "w") as f:
    for i in range(12):
        text = " ".join(words[(i + j) % len(words)] for j in range(40 + 7 * i))
        f.write(json.dumps({"id": i, "content": text}) + "\n")
EOF
usage=(frequency-usage tiny-llama --device cpu --corpus docs.jsonl --text-column content
    --tokens 512 --n-ctx 64 --quiet)
step "ropelens frequency-usage on docs.jsonl --text-column content"
"$venv/bin/ropelens" "${usage[@]}" --save usage-wheel.json >usage.txt 2>&1 ||
    { cat usage.txt >&2; fail "ropelens frequency-usage on a JSONL file with --text-column"; }
cat usage.txt
# the same command from the checkout: the installed package must give the same numbers
step "the same from the checkout"
PYTHONPATH="$root/src" "$py" -m ropelens "${usage[@]}" --save usage-checkout.json >usage-checkout.txt 2>&1 ||
    { cat usage-checkout.txt >&2; fail "frequency-usage from the checkout (for comparison)"; }
"$vpy" - <<'EOF' || fail "the wheel's frequency-usage differs from the checkout's (above)"
import json
import math


def numbers(x, path=""):
    if isinstance(x, dict):
        for k, v in x.items():
            if k not in ("seconds", "errors"):  # run time; verification noise
                yield from numbers(v, f"{path}.{k}")
    elif isinstance(x, list):
        for i, v in enumerate(x):
            yield from numbers(v, f"{path}[{i}]")
    elif isinstance(x, (int, float)) and not isinstance(x, bool):
        yield path, float(x)


results = [json.load(open(f"usage-{x}.json")) for x in ("wheel", "checkout")]
shas = {r["provenance"]["corpus_sha256"] for r in results}
if len(shas) != 1:
    raise SystemExit(f"the two runs read different corpora (fingerprints {sorted(shas)})")
wheel, checkout = (dict(numbers(r)) for r in results)
if not wheel or wheel.keys() != checkout.keys():
    raise SystemExit(f"the two results hold different fields: {sorted(wheel.keys() ^ checkout.keys())[:5]}")
off = [k for k in wheel if not math.isclose(wheel[k], checkout[k], rel_tol=1e-6, abs_tol=1e-9)]
if off:
    raise SystemExit(f"{len(off)} of {len(wheel)} numbers differ, e.g. {off[0]}: {wheel[off[0]]} vs {checkout[off[0]]}")
print(f"check_wheel: the wheel's frequency-usage equals the checkout's ({len(wheel)} numbers)")
EOF
step "passed: the wheel builds, installs into a fresh venv and runs outside the checkout"
