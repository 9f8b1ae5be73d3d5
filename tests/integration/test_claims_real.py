"""Claims on the real embedded models at the standard budget give the verdicts ropelens's measured
results report (docs/results.md, "Both embedded models"): positional heads take their position
from the highest band and retrieval heads copy through the lowest on both models; the lowest band
is not singled out as a semantic channel beyond random planes and heads; p-RoPE 0.75 costs nothing
and NoPE much; Gemma-3's positional heads are local and its retrieval heads global."""

from __future__ import annotations

import pytest

from ropelens.claims import DOES_NOT_HOLD, HOLDS, INCONCLUSIVE, claims

pytestmark = pytest.mark.integration

KNOCKOUTS = "positional-highest-band,retrieval-lowest-band,semantic-lowest-band,prope-keeps-highest"


@pytest.fixture(scope="module")
def smollm2_claims(smollm2):
    return claims(smollm2, KNOCKOUTS, "standard", progress=False)


@pytest.fixture(scope="module")
def gemma3_claims(gemma3):
    return claims(gemma3, f"{KNOCKOUTS},local-position-global-copy", "standard", progress=False)


@pytest.mark.parametrize("which", ["smollm2_claims", "gemma3_claims"])
def test_the_reported_verdicts(request, which):
    result = request.getfixturevalue(which)
    assert result.row("positional-highest-band").verdict == HOLDS
    assert result.row("retrieval-lowest-band").verdict == HOLDS
    assert result.row("prope-keeps-highest").verdict == HOLDS
    semantic = result.row("semantic-lowest-band")
    assert semantic.verdict in (DOES_NOT_HOLD, INCONCLUSIVE), semantic.reason
    assert semantic.effect > 0  # the direction holds; the singling out does not
    for name in ("positional-highest-band", "retrieval-lowest-band"):
        row = result.row(name)
        assert row.controls[0].p == pytest.approx(row.controls[0].p_floor)  # no draw reaches it


def test_smollm2_numbers_beside_the_reported_ones(smollm2_claims):
    pos = smollm2_claims.row("positional-highest-band")
    assert pos.detail["heads"] and len(pos.detail["heads"]) == 10  # the same 10 heads
    assert pos.baseline == pytest.approx(0.613, abs=0.05)
    assert pos.baseline + pos.effect == pytest.approx(0.073, abs=0.05)


def test_gemma3_position_local_copy_global(gemma3_claims):
    row = gemma3_claims.row("local-position-global-copy")
    assert row.verdict == HOLDS, row.reason
