"""The band mixer in headless Chromium, on tiny models: the saved page loads offline with no error,
and the pattern it draws for any set of bands and planes is ``band_pattern``'s for the same set."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from ropelens import Bands
from ropelens.analyses import attention_decomposition
from tests.browser import ARTIFACTS, chromium, open_offline

SEQ = 40  # five times the tiny families' sliding windows of 8
TOLERANCE = 1e-3  # the page stores q and k in 16 bits only where its probabilities stay this close

pytestmark = pytest.mark.browser


@pytest.fixture(scope="module")
def browser():
    yield from chromium()


def open_page(browser, path: Path):
    """The saved page opened from disk, every request that is not local refused and recorded;
    returns (page, console errors, external requests)."""
    page, errors, external = open_offline(browser, path)
    page.wait_for_function("() => window.ropelensExplorer !== undefined", timeout=30_000)
    return page, errors, external


def drawn(page) -> torch.Tensor:
    return torch.tensor(page.evaluate("() => ropelensExplorer.pattern()"), dtype=torch.float64)


def tokens(seed=0):
    g = torch.Generator().manual_seed(seed)
    t = torch.randint(4, 101, (1, SEQ), generator=g)
    t[:, 0] = 1
    return t


def selections(names: list[str], n_planes: int) -> list[tuple[list[str], list[int]]]:
    """(bands, planes) to try: all bands, each alone, none, two planes, a band plus a plane of
    another."""
    short = [n.split(" ")[0] for n in names]
    return [
        (names, []),
        *(([n], []) for n in short),
        ([], []),
        ([], [0, n_planes - 1]),
        ([short[0]], [n_planes - 1]),
    ]


@pytest.mark.parametrize("family", ["gemma2", "gpt_oss", "phi3", "glm", "deepseek_v3", "llama4"])
def test_the_page_draws_band_pattern(family, family_model, browser, tmp_path):
    """gemma2: soft-capped logits, alternating sliding windows, GQA; gpt_oss: learned sinks,
    windows, GQA; phi3: partial rotary (its rest band holds the non-rotary dims), windows; glm:
    adjacent pairs, partial rotary; deepseek_v3: multi-head latent attention; llama4: chunked
    attention (chunks of 8)."""
    model, spec = family_model(family)
    dec = attention_decomposition(model, tokens(), bands=Bands.quantiles(2))
    path = dec.explore().save(tmp_path / f"{family}.html")
    page, errors, external = open_page(browser, path)
    assert page.evaluate("() => ropelensExplorer.layers()") == dec.layers
    assert page.evaluate("() => ropelensExplorer.tokens()") == list(dec.token_text[0])
    worst = 0.0
    for L in dec.layers:
        page.evaluate(f"() => ropelensExplorer.setLayer({L})")
        names = dec.band_names(L)
        assert page.evaluate("() => ropelensExplorer.bandNames()") == names
        rope = spec.layers[L]
        for h in range(rope.n_heads):
            page.evaluate(f"() => ropelensExplorer.setHead({h})")
            for bands, planes in selections(names, rope.n_planes):
                page.evaluate(
                    "([b, p]) => ropelensExplorer.select({bands: b, planes: p})", [bands, planes]
                )
                state = page.evaluate("() => ropelensExplorer.state()")
                assert (state["layer"], state["head"]) == (L, h)
                want = dec.band_pattern(L, bands, planes=planes)[0, h].double()
                worst = max(worst, float((drawn(page) - want).abs().max()))
            agreement = page.evaluate("() => ropelensExplorer.agreement()")
            frame = dec.agreement(L)
            for row in agreement:
                top1 = frame[(frame["head"] == h) & (frame["band"] == row["band"])]["top1"].item()
                # a query whose two best keys tie within the stored precision may flip
                assert row["top1"] == pytest.approx(top1, abs=1.5 / SEQ), (L, h, row)
    assert worst <= TOLERANCE, worst
    assert errors == [] and external == []
    page.close()


def test_layers_heads_and_bands_switch(family_model, browser, tmp_path):
    """Each switch redraws: another head or layer draws another pattern, a band off changes it
    and on again restores it; names the page does not know are refused."""
    model, _ = family_model("gemma2")
    dec = attention_decomposition(model, tokens(1), bands=Bands.quantiles(2))
    path = dec.explore(layers=[0, 3]).save(tmp_path / "switch.html")
    page, errors, external = open_page(browser, path)
    first = drawn(page)
    assert torch.allclose(first, dec.band_pattern(0)[0, 0].double(), atol=TOLERANCE)
    page.evaluate("() => ropelensExplorer.setHead(2)")
    assert not torch.allclose(drawn(page), first, atol=1e-2)
    page.evaluate("() => ropelensExplorer.setLayer(3)")
    assert page.evaluate("() => ropelensExplorer.state()")["layer"] == 3
    assert torch.allclose(drawn(page), dec.band_pattern(3)[0, 2].double(), atol=TOLERANCE)
    page.evaluate("() => ropelensExplorer.setBands(['Q2'])")
    assert torch.allclose(drawn(page), dec.band_pattern(3, ["Q2"])[0, 2].double(), atol=TOLERANCE)
    # the checkboxes drive the same state: Q1's box on gives both bands back
    page.check("input[data-band='0']")
    assert page.evaluate("() => ropelensExplorer.state()")["bands"] == dec.band_names(3)
    assert torch.allclose(drawn(page), dec.band_pattern(3)[0, 2].double(), atol=TOLERANCE)
    page.uncheck("input[data-plane='1']")
    assert page.evaluate("() => ropelensExplorer.state()")["planes"] == [0, 2, 3, 4, 5, 6, 7]
    page.evaluate("() => ropelensExplorer.setRow(30)")
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "band-mixer-gemma2.png"), full_page=True)
    for call, message in [
        ("setLayer(1)", "layer 1 is not on this page: it holds layers [0,3]"),
        ("setBands(['Q9'])", 'band "Q9" is not a band of layer 3'),
        ("setPlanes([99])", "plane 99 is not a plane of layer 3"),
        ("setHead(4)", "head 4 is not a head of layer 3"),
    ]:
        with pytest.raises(Exception, match=message.replace("[", r"\[").replace("]", r"\]")):
            page.evaluate(f"() => ropelensExplorer.{call}")
    assert errors == [] and external == []
    assert (ARTIFACTS / "band-mixer-gemma2.png").stat().st_size > 20_000
    page.close()


def test_the_notebook_iframe_runs_the_page(family_model, browser, tmp_path):
    """What Jupyter, VS Code and Colab show (``_repr_html_``: an iframe holding the page) runs its
    script and draws the same pattern."""
    model, _ = family_model("gpt_oss")
    dec = attention_decomposition(model, tokens(2), bands=Bands.quantiles(2), layers=[0])
    notebook = tmp_path / "notebook.html"
    notebook.write_text(
        "<!DOCTYPE html><html><body><p>a notebook cell</p>"
        + dec.explore()._repr_html_()
        + "</body></html>",
        encoding="utf-8",
    )
    page, errors, external = open_offline(browser, notebook)
    frame = page.frames[1]
    frame.wait_for_function("() => window.ropelensExplorer !== undefined", timeout=30_000)
    frame.evaluate("() => ropelensExplorer.setBands(['Q2'])")
    got = torch.tensor(frame.evaluate("() => ropelensExplorer.pattern()"), dtype=torch.float64)
    assert torch.allclose(got, dec.band_pattern(0, ["Q2"])[0, 0].double(), atol=TOLERANCE)
    assert errors == [] and external == []
    page.close()
