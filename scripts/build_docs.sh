#!/usr/bin/env bash
# Build the documentation site into site/ (or DIR): warnings are errors, nothing is fetched.
# Usage: bash scripts/build_docs.sh [DIR]    (after `bash scripts/setup.sh`, which installs the docs extra)
# Preview while editing: .venv/bin/mkdocs serve
set -euo pipefail
cd "$(dirname "$0")/.."
out="${1:-site}"
export NO_MKDOCS_2_WARNING=1  # the theme's notice about its successor, printed on every build
start=$(date +%s)
"${ROPELENS_VENV:-.venv}/bin/python" -m mkdocs build --strict --clean -d "$out"
pages=$(find "$out" -name index.html | wc -l)
echo "build_docs.sh: $pages pages in $out ($(( $(date +%s) - start )) s); open $out/index.html or serve it: python -m http.server -d $out"
