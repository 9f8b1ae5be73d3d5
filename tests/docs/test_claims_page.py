"""The claims page (docs/claims.md): its list is the claims registry as it stands, every registered
claim with its protocol and source, and the page is in the site's navigation."""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import yaml

from ropelens.claims.markdown import PAGE_END, PAGE_START, registry_markdown
from ropelens.claims.protocol import CLAIMS

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "claims.md"


def _page() -> str:
    return PAGE.read_text(encoding="utf-8")


def _generated(text: str) -> str:
    return text[text.index(PAGE_START) : text.index(PAGE_END) + len(PAGE_END)] + "\n"


def test_every_registered_claim_is_on_the_page_with_its_protocol():
    text = _generated(_page())
    listed = re.findall(r"^### `([^`]+)`$", text, flags=re.M)
    assert len(CLAIMS) >= 8
    assert listed == list(CLAIMS), (
        "docs/claims.md lists other claims than the registry: run python scripts/claims_page.py"
    )
    for claim in CLAIMS.values():
        section = text[text.index(f"### `{claim.name}`") :]
        assert f"> {claim.claim}" in section
        assert f"- **Source:** {claim.source}" in section
        assert f"- **Measured:** {claim.measured}" in section


def test_generated_list_is_the_current_registry():
    assert _generated(_page()) == registry_markdown(), (
        "docs/claims.md is stale: run python scripts/claims_page.py"
    )


def test_budgets_table_states_the_p_floor_of_its_draws():
    rows = re.findall(r"^\| `(\w+)` \| (\d+) \| (\d+) \| ([\d.]+) \|$", _page(), flags=re.M)
    assert [r[0] for r in rows] == ["quick", "standard", "thorough"]
    for _, _, draws, floor in rows:
        assert float(floor) == float(f"{1 / (1 + int(draws)):.2g}")


def test_page_is_in_the_navigation():
    class Loader(yaml.SafeLoader):  # mkdocs.yml's own tags (!relative, !!python/name) are skipped
        pass

    for prefix in ("!", "tag:yaml.org,2002:python/"):
        Loader.add_multi_constructor(prefix, lambda *_: None)
    nav = yaml.load((ROOT / "mkdocs.yml").read_text(encoding="utf-8"), Loader=Loader)["nav"]
    assert {"Claims": "claims.md"} in nav


def test_every_python_name_the_page_gives_exists():
    names = set(re.findall(r"`(ropelens(?:\.[A-Za-z_]\w*)+)", _page()))
    assert len(names) >= 4
    for name in sorted(names):
        parts = name.split(".")
        for cut in range(len(parts), 0, -1):
            try:
                obj = importlib.import_module(".".join(parts[:cut]))
            except ImportError:
                continue
            for attr in parts[cut:]:
                assert hasattr(obj, attr), f"docs/claims.md names {name}, which does not exist"
                obj = getattr(obj, attr)
            break
