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
# the tiny Llama's layer-0 query projection (its rows: head 0's dims first)
Q_PROJ = (
    "model.layers.0._original_component.self_attn._original_component.q_proj"
    "._original_component.weight"
)


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


def test_agreement_shares_tied_keys_as_python_does(tiny, browser, tmp_path):
    """A band whose query part is zero in one head gives every allowed key the same logit: the k
    keys a query sees tie, and the page counts 1/k for that query, as ``agreement`` does."""
    model = tiny("llama")
    toks = tokens(3)
    bands = Bands.quantiles(2)
    first = attention_decomposition(model, toks, bands=bands, layers=[0])
    zeroed = first.resolved(0).dims[0]  # head dims of band Q1
    d_head = first.spec.layers[0].head_dim
    q_proj = dict(model.named_parameters())[Q_PROJ]
    saved = q_proj.detach().clone()
    try:
        with torch.no_grad():
            q_proj[zeroed] = 0.0  # head 0's rows of Q1's dims
        dec = attention_decomposition(model, toks, bands=bands, layers=[0])
    finally:
        with torch.no_grad():
            q_proj.copy_(saved)
    assert int(zeroed.max()) < d_head
    # every causal query i sees i + 1 tied keys, the model's own among them
    want = sum(1 / (i + 1) for i in range(SEQ)) / SEQ
    frame = dec.agreement(0)
    q1 = dec.band_names(0)[0]
    python = frame[(frame["head"] == 0) & (frame["band"] == q1)]["top1"].item()
    assert python == pytest.approx(want, abs=1e-12)
    page, errors, external = open_page(browser, dec.explore().save(tmp_path / "tied.html"))
    page.evaluate("() => ropelensExplorer.setHead(0)")
    rows = {r["band"]: r["top1"] for r in page.evaluate("() => ropelensExplorer.agreement()")}
    assert rows[q1] == pytest.approx(want, abs=1e-12)
    assert rows[q1] > 1.5 / SEQ  # a first-key pick would count only the queries whose top key is 0
    # the other band is untouched and untied: both sides still agree on it
    q2 = dec.band_names(0)[1]
    other = frame[(frame["head"] == 0) & (frame["band"] == q2)]["top1"].item()
    assert rows[q2] == pytest.approx(other, abs=1.5 / SEQ)
    assert errors == [] and external == []
    page.close()


def test_a_labelled_explorer_opens_on_the_strongest_positional_head(
    tiny_dir, browser, tmp_path, capsys
):
    """``ropelens explore --taxonomy`` opens on the positional head of largest robust offset mass
    (not layer 0, head 0); without a taxonomy it opens on head 0 of the first layer."""
    import json

    from ropelens.analyses import head_taxonomy
    from ropelens.cli import main
    from ropelens.loading.models import load_model

    model_dir = str(tiny_dir("llama"))
    model = load_model(model_dir, device="cpu")
    tax = head_taxonomy(model, tokens(4)[:, :16], max_offset=2, tau=0.05, progress=False)
    tax.save(tmp_path / "tax.json")
    df = tax.to_frame()
    positional = df[df["positional"]]
    assert len(positional) >= 2
    best = positional.sort_values("robust_mass", ascending=False).iloc[0]
    want = {"layer": int(best["layer"]), "head": int(best["head"])}
    assert want != {"layer": 0, "head": 0}
    text = ["--text", "The cat sat on the mat, and then the cat sat on the mat again."]
    for name, extra, opens_on in [
        ("labelled", ["--taxonomy", str(tmp_path / "tax.json")], want),
        ("plain", [], {"layer": 0, "head": 0}),
    ]:
        out = tmp_path / f"{name}.html"
        assert main(["explore", model_dir, *text, *extra, "--out", str(out), "--json"]) == 0
        assert json.loads(capsys.readouterr().out)["out"] == str(out)
        page, errors, external = open_page(browser, out)
        state = page.evaluate("() => ropelensExplorer.state()")
        assert {"layer": state["layer"], "head": state["head"]} == opens_on
        assert page.input_value("#head") == str(opens_on["head"])
        # the head menu shows each label whole ("head 3 · positional (previous-token)")
        overflow = page.evaluate(
            """() => { const s = document.querySelector('#head');
              const ctx = document.createElement('canvas').getContext('2d');
              ctx.font = getComputedStyle(s).font;
              const room = s.clientWidth - 28;  // the arrow and padding
              return [...document.querySelectorAll('#layer option')].flatMap((_, li) => {
                ropelensExplorer.setLayer(ropelensExplorer.layers()[li]);
                return [...s.options].map(o => o.text).filter(t => ctx.measureText(t).width > room);
              }); }"""
        )
        assert overflow == []
        assert errors == [] and external == []
        page.close()
