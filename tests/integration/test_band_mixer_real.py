"""The band mixer on the real SmolLM2 (256 tokens of English, every layer): its previous-token head
L16.H0 keeps its pattern with band Q1 alone and loses it with Q1 off, read from the page."""

from __future__ import annotations

import json
import math

import pytest
import torch

from ropelens import Bands
from ropelens.analyses import attention_decomposition, head_taxonomy
from ropelens.run.data import load_corpus, windows
from tests.browser import ARTIFACTS, chromium, open_offline

N_TOKENS = 256
LAYER, HEAD = 16, 0

pytestmark = [pytest.mark.integration, pytest.mark.browser]


@pytest.fixture(scope="module")
def browser():
    yield from chromium()


def previous_token_mass(pattern) -> float:
    """Mean attention on key q − 1 over queries 1..n−1."""
    p = torch.as_tensor(pattern, dtype=torch.float64)
    n = p.shape[0]
    return float(p[torch.arange(1, n), torch.arange(n - 1)].mean())


def test_previous_token_head_lives_in_band_q1(smollm2, browser, tmp_path):
    tax = head_taxonomy(smollm2, layers=[LAYER], n_windows=4, progress=False)
    assert tax.kinds()[0][HEAD] == "previous-token"
    toks = windows(load_corpus("english"), smollm2.tokenizer, N_TOKENS, n_windows=1)
    dec = attention_decomposition(smollm2, toks, bands=Bands.quantiles(4))
    mixer = dec.explore(taxonomy=tax)
    path = mixer.save(tmp_path / "smollm2.html")
    size = path.stat().st_size
    # q [9 heads] and k [3 KV heads], 256 positions × 64 dims, two bytes each, base64, per layer
    stored = 30 * 4 * math.ceil((9 + 3) * N_TOKENS * 64 * 2 / 3)
    assert set(mixer.precision.values()) <= {"int16", "float16"}
    assert stored < size < 1.1 * stored  # the rest of the page is a small share of it

    page, errors, external = open_offline(browser, path, 1400, 1000)
    page.wait_for_function("() => window.ropelensExplorer !== undefined", timeout=60_000)
    page.evaluate(
        f"() => {{ ropelensExplorer.setLayer({LAYER}); ropelensExplorer.setHead({HEAD}) }}"
    )
    assert (
        page.evaluate("() => ropelensExplorer.headLabels()")[HEAD] == "positional (previous-token)"
    )

    def mass(bands: list[str], shot: str) -> float:
        page.evaluate("(b) => ropelensExplorer.setBands(b)", bands)
        page.evaluate("() => ropelensExplorer.setRow(120)")
        ARTIFACTS.mkdir(exist_ok=True)
        page.screenshot(path=str(ARTIFACTS / shot), full_page=True)
        drawn = page.evaluate("() => ropelensExplorer.pattern()")
        want = dec.band_pattern(LAYER, bands)[0, HEAD]
        assert (torch.tensor(drawn, dtype=torch.float64) - want.double()).abs().max() <= 1e-3
        return previous_token_mass(drawn)

    model = previous_token_mass(dec.pattern(LAYER)[0, HEAD])
    every = mass(dec.band_names(LAYER), "band-mixer-smollm2-L16H0-all.png")
    alone = mass(["Q1"], "band-mixer-smollm2-L16H0-Q1.png")
    without = mass(["Q2", "Q3", "Q4"], "band-mixer-smollm2-L16H0-without-Q1.png")
    # what a uniform pattern over the causal keys puts on the previous token, on average
    uniform = sum(1 / (i + 1) for i in range(1, N_TOKENS)) / (N_TOKENS - 1)
    agreement = {r["band"]: r["top1"] for r in page.evaluate("() => ropelensExplorer.agreement()")}
    (ARTIFACTS / "band-mixer-smollm2.json").write_text(
        json.dumps(
            {
                "page_bytes": size,
                "layers": len(mixer.layers),
                "tokens": N_TOKENS,
                "precision": sorted(set(mixer.precision.values())),
                "largest_16_bit_error": max(mixer.half_error.values()),
                "previous_token_mass": {
                    "model": model,
                    "all bands": every,
                    "Q1 alone": alone,
                    "Q1 off": without,
                    "uniform": uniform,
                },
                "top1_agreement": agreement,
            },
            indent=1,
        )
    )
    assert every == pytest.approx(model, abs=1e-3)
    assert alone > 0.5 * model  # Q1 alone keeps most of the head's previous-token attention
    assert without < uniform  # without Q1 the previous token gets less than a uniform pattern's
    assert agreement["Q1 (highest)"] == max(agreement.values())
    assert errors == [] and external == []
    page.close()
