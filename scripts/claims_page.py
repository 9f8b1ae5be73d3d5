"""Write the generated part of docs/claims.md: the budgets and every registered claim's protocol
and source, from the claims registry (``ropelens.claims.markdown.registry_markdown``).

    python scripts/claims_page.py          # rewrite the part between the page's markers
    python scripts/claims_page.py --check  # exit 1 where the page is stale

``tests/docs/test_claims_page.py`` checks that the page's generated part is the current one.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ropelens.claims.markdown import PAGE_END, PAGE_START, registry_markdown
from ropelens.results.serialize import atomic_write_text

PAGE = Path(__file__).resolve().parent.parent / "docs" / "claims.md"


def generated_part(text: str) -> str:
    """The page's part between its markers, the markers included."""
    start, end = text.find(PAGE_START), text.find(PAGE_END)
    if start < 0 or end < start:
        sys.exit(f"claims_page: {PAGE} lacks the markers {PAGE_START!r} ... {PAGE_END!r}")
    return text[start : end + len(PAGE_END)] + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 where the page is stale")
    args = parser.parse_args(argv)
    text = PAGE.read_text(encoding="utf-8")
    old = generated_part(text)
    new = registry_markdown()
    if args.check:
        return int(old != new)
    atomic_write_text(PAGE, text.replace(old, new))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
