"""The context-extension study on a tiny Llama with a 64-token native context, extended to 512."""

from __future__ import annotations

import dataclasses
import importlib
import json
import math
from html.parser import HTMLParser

import pytest
import torch

from ropelens.analyses.passkey_retrieval import passkey_retrieval
from ropelens.errors import InputError
from ropelens.report.extension_study import write_study
from ropelens.results.result import load_result
from ropelens.run.data import analysis_windows
from ropelens.run.evaluate import bootstrap_ci, window_losses
from ropelens.run.intervene import apply_rope_variant
from ropelens.spec.variants import NTK, DynamicNTK, Linear, Llama3, LongRoPE, PRoPE, YaRN
from ropelens.testing import tiny_model

# the package exports the function under the module's name: the module itself, for its helpers
E = importlib.import_module("ropelens.analyses.extension_study")

NATIVE, TARGET = 64, 512
SMALL = {"start": 64, "n_windows": 2, "depths": (0.5,), "progress": False}


@pytest.fixture(scope="module")
def model():
    return tiny_model("llama", max_position_embeddings=NATIVE)


@pytest.fixture(scope="module")
def study(model, tmp_path_factory):
    out = tmp_path_factory.mktemp("study")
    return E.extension_study(model, TARGET, out=out, **SMALL), out


def test_variants_are_set_for_the_factor(model):
    from ropelens import rope_spec

    layer = rope_spec(model)[0]
    v = E.extension_variants(layer, NATIVE, TARGET)
    assert v["none"] is None and v["pi"] == Linear(8.0) and v["ntk"] == NTK(8.0)
    assert v["dynamic"] == DynamicNTK(8.0, NATIVE) and v["yarn"] == YaRN(8.0, NATIVE)
    assert v["llama3"] == Llama3(8.0, 1.0, 4.0, NATIVE) and v["prope"] == PRoPE(0.75)
    lr = v["longrope"]
    assert (
        isinstance(lr, LongRoPE) and lr.factor == 8.0 and lr.short_factor == (1.0,) * layer.n_planes
    )
    # the default long factors are YaRN's per-plane rescale: same frequencies as YaRN at the target
    # (float32 frequencies divided and re-multiplied: a few ulps)
    torch.testing.assert_close(
        lr.inv_freq(layer, TARGET), YaRN(8.0, NATIVE).inv_freq(layer), rtol=1e-5, atol=0
    )


def test_cells_equal_direct_calls(model, study):
    """Every loss cell is window_losses under that variant on the same windows; every passkey cell
    is passkey_retrieval under it (both deterministic on CPU float32: equal exactly)."""
    st, _ = study
    assert st.lengths == (64, 128, 256, 512) and st.passkey_lengths == (256, 512)
    for name in st.methods:
        v = st.variant(name)
        for L in st.lengths:
            tokens = analysis_windows(model.tokenizer, None, L, 2 * L)[0]
            if v is None:
                direct = window_losses(model, tokens, progress=False)
            else:
                with apply_rope_variant(model, v):
                    direct = window_losses(model, tokens, progress=False)
            cell = next(c for c in st.loss_cells if c["method"] == name and c["length"] == L)
            assert cell["losses"] == [float(x) for x in direct], (name, L)
        L = st.passkey_lengths[-1]
        r = passkey_retrieval(model, [L], [0.5], n_trials=1, variant=v, progress=False)
        cell = next(c for c in st.passkey_cells if c["method"] == name and c["length"] == L)
        assert cell["trials"] == [t.to_dict() for t in r.trials], name


def test_identity_cells_are_copied_and_marked(study):
    st, _ = study
    df = st.loss_frame().set_index(["method", "length"])
    # dynamic NTK rotates as the model does within the native context only: its 64-token cell is
    # copied
    assert df["same_as"].dropna().to_dict() == {("dynamic", 64): "none"}
    assert df.loc[("dynamic", 64), "loss"] == df.loc[("none", 64), "loss"]
    assert df.loc[("dynamic", 128), "loss"] != df.loc[("none", 128), "loss"]


def test_resume_skips_finished_cells(model, study, monkeypatch):
    st, out = study
    calls = {"loss": 0, "passkey": 0}
    real = E._measure

    def counting(model_, kind, *a, **k):
        calls[kind] += 1
        return real(model_, kind, *a, **k)

    monkeypatch.setattr(E, "_measure", counting)
    again = E.extension_study(model, TARGET, out=out, **SMALL)
    assert calls == {"loss": 0, "passkey": 0} and again.provenance.config["cells_reused"] == len(
        st.loss_cells
    ) + len(st.passkey_cells)
    assert again.loss_cells == st.loss_cells and again.passkey_cells == st.passkey_cells
    # a killed run: two cells missing and one damaged are measured again, nothing else
    cells = out / "cells"
    (cells / "loss-yarn-512.json").unlink()
    (cells / "passkey-pi-512.json").unlink()
    (cells / "loss-ntk-256.json").write_text('{"format": 1, "config": {"mod')
    with pytest.warns(
        UserWarning, match=r"loss-ntk-256\.json is damaged .*measuring that cell again"
    ):
        resumed = E.extension_study(model, TARGET, out=out, **SMALL)
    assert calls == {"loss": 2, "passkey": 1}
    assert resumed.loss_cells == st.loss_cells and resumed.passkey_cells == st.passkey_cells
    json.loads((cells / "loss-ntk-256.json").read_text())  # rewritten whole


def test_cells_of_other_settings_are_refused(model, study):
    _, out = study
    with pytest.raises(
        InputError,
        match=r"loss-none-64\.json holds a cell measured with other settings "
        r"\(n_windows, tokens_sha256 differ\)",
    ):
        E.extension_study(model, TARGET, out=out, **{**SMALL, "n_windows": 1})


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"to": 64}, "the target 64 must exceed the native context 64"),
        ({"to": 512, "methods": ["yarn", "rope2"]}, r"unknown extension method\(s\) \['rope2'\]"),
        ({"to": 512, "lengths": [128, 1024]}, "each length must be >= 2 and <= 512, got 1024"),
        ({"to": 10**7, "lengths": [10**7]}, r"has \d+ tokens but one window of n_ctx=10000000"),
    ],
)
def test_bad_input_is_one_line(model, kwargs, match):
    with pytest.raises(InputError, match=match) as e:
        E.extension_study(model, **{**SMALL, **kwargs})
    assert "\n" not in str(e.value)


def test_findings_quote_the_measurements(study):
    st, _ = study
    fs = {f.key: f for f in st.findings()}
    df = st.loss_frame().set_index(["method", "length"])
    rank = fs["recommend"].values["ranking"]
    best, runner = rank[0], rank[1]
    rec = fs["recommend"]
    # the lead that ranks them, recomputed: recall where it differs, else the paired loss change
    on = rec.values["decided_by"]
    assert on == ("recall" if best["recall"] != runner["recall"] else "loss")
    if on == "loss":
        a, b = (_target_losses(st, r["method"]) for r in (runner, best))
        assert rec.values["lead"]["mean"] == pytest.approx(
            float(
                torch.tensor(a, dtype=torch.float64).mean()
                - torch.tensor(b, dtype=torch.float64).mean()
            )
        )
    lead = rec.values["lead"]
    if rec.values["recommended"] is not None:
        assert lead["lo"] > 0 and f"use {E.METHODS[best['method']]}" in rec.text
    else:
        assert "no method is better beyond its interval" in rec.text and "use " not in rec.text
    assert f"{df.loc[(best['method'], TARGET), 'loss']:.3f} nats" in rec.text
    # ranking: recall first, then loss, recomputed here
    key = [(-(r["recall"]), r["loss"]) for r in rank]
    assert key == sorted(key)
    for m in st.methods:
        f = fs[f"loss_{m}"]
        assert f"{df.loc[(m, TARGET), 'loss']:.3f}" in f.text
        held = f.values["held_up_to"]
        losses = [df.loc[(m, L), "loss"] for L in st.lengths]
        expect = st.lengths[0]
        for L, x in zip(st.lengths, losses, strict=True):
            if x - losses[0] > st.tolerance:
                break
            expect = L
        assert held == expect
    k, n = st.recall("pi", TARGET)
    assert f"PI {k}/{n}" in fs["passkey"].text
    # planes: PI divides every plane by the factor 8; YaRN keeps the fastest ones
    assert fs["planes_pi"].values["counts"] == {"interpolated": 8}
    assert st.in_distribution_limit("pi") == pytest.approx(NATIVE * 8, rel=1e-6)
    assert st.in_distribution_limit("none") == NATIVE
    assert math.isinf(st.in_distribution_limit("prope")) is False


def _target_losses(st, method: str) -> list[float]:
    return next(
        c["losses"] for c in st.loss_cells if c["method"] == method and c["length"] == TARGET
    )


def _with_target_losses(st, losses: dict[str, list[float]]):
    """The study with these per-window losses at the target and every passkey found (so the loss
    ranks the methods)."""
    cells = []
    for c in st.loss_cells:
        if c["length"] == TARGET:
            v = losses[c["method"]]
            c = {**c, "losses": v, "estimate": bootstrap_ci(v).to_dict()}
        cells.append(c)
    found = tuple(
        {**c, "trials": [{**t, "correct": True} for t in c["trials"]]} for c in st.passkey_cells
    )
    return dataclasses.replace(st, loss_cells=tuple(cells), passkey_cells=found)


def test_no_recommendation_from_a_difference_inside_its_interval(study):
    """One window, and methods 1e-5 nats apart: no interval, so no method is recommended."""
    st, _ = study
    one = _with_target_losses(st, {m: [4.0 + 1e-5 * i] for i, m in enumerate(st.methods)})
    rec = {f.key: f for f in one.findings()}["recommend"]
    assert rec.values["recommended"] is None and rec.values["decided_by"] == "loss"
    assert rec.values["lead"]["lo"] is None and rec.values["lead"]["mean"] == pytest.approx(1e-5)
    assert rec.text.startswith(f"For {NATIVE:,} → {TARGET:,} tokens no method is better beyond")
    assert "95% CI n/a (one window gives no spread)" in rec.text
    table = one.loss_frame()
    at_target = table.length == TARGET
    assert table.loc[at_target, "loss_lo"].isna().all()
    assert table.loc[~at_target, "loss_lo"].notna().all()


def test_a_lead_beyond_its_interval_is_recommended(study):
    st, _ = study
    base = [4.0 + 0.01 * i for i in range(8)]
    worse = {m: [x + 0.5 + 0.01 * (i % 3) for i, x in enumerate(base)] for m in st.methods}
    one = _with_target_losses(st, {**worse, "yarn": base})
    rec = {f.key: f for f in one.findings()}["recommend"]
    assert rec.values["recommended"] == "yarn" and rec.values["lead"]["lo"] > 0
    assert rec.text.startswith(f"For {NATIVE:,} → {TARGET:,} tokens use {E.METHODS['yarn']}")


def test_predictors_match_the_formulas(study):
    from ropelens.analyses.base_predictions import (
        base_lower_bound,
        critical_dimension,
        extrapolation_limit,
    )

    st, _ = study
    fs = {f.key: f for f in st.findings()}
    assert fs["critical_dimension"].values["critical_dimension"] == critical_dimension(
        1e4, 16, NATIVE
    )
    assert fs["critical_dimension"].values["t_extra"] == pytest.approx(
        extrapolation_limit(1e4, 16, NATIVE)
    )
    assert fs["base_bound"].values["men_lower_bound"] == pytest.approx(base_lower_bound(16, TARGET))


class _Collect(HTMLParser):
    def __init__(self):
        super().__init__()
        self.stack, self.ids, self.errors, self.scripts = [], [], [], 0

    def handle_starttag(self, tag, attrs):
        if tag not in ("meta", "br", "hr", "img", "input", "link"):
            self.stack.append(tag)
        self.ids += [v for k, v in attrs if k == "id"]
        self.scripts += tag == "script"

    def handle_endtag(self, tag):
        if not self.stack or self.stack.pop() != tag:
            self.errors.append(tag)


def test_page_is_well_formed_with_every_section(study):
    from ropelens.report.extension_study import SECTIONS, TABLES
    from ropelens.report.html import esc

    st, out = study
    page = write_study(st, out)
    text = page.read_text()
    parser = _Collect()
    parser.feed(text)
    assert parser.errors == [] and parser.stack == []
    assert [k for k, _ in SECTIONS] == [i for i in parser.ids if i in dict(SECTIONS)]
    assert "<script src=" not in text  # plotly.js embedded in the page, nothing fetched
    assert text.count('class="plotly-graph-div"') >= 3
    for f in st.findings():
        assert esc(f.text) in text
    for t in TABLES:
        assert (out / f"{t}.csv").exists()
    assert (
        st.provenance.config["verification"]["status"] == "passed"
    )  # the variants' spec was proven first
    back = load_result(out / "study.json")
    assert back.loss_cells == st.loss_cells and [f.text for f in back.findings()] == [
        f.text for f in st.findings()
    ]


def test_longrope_search_must_match_the_study(model):
    from ropelens import rope_spec
    from ropelens.analyses.extension_planes import LongRopeSearch

    s = LongRopeSearch(
        target_len=256,
        original_ctx=NATIVE,
        factors=(1.0,) * 8,
        n_hat=0,
        perplexity=1.0,
        initial_best=1.0,
        baselines={},
        history=(),
        settings={},
    )
    with pytest.raises(InputError, match="search is for 64 → 256 tokens, the study for 64 → 512"):
        E.extension_variants(rope_spec(model)[0], NATIVE, TARGET, ["longrope"], longrope=s)


def test_lengths_short_of_the_target_still_give_the_target_findings(model, tmp_path):
    """Loss measured only below the target (long cells are the costly ones): the predictors'
    findings still speak of the target, and the page is written."""
    from ropelens.analyses.base_predictions import base_lower_bound

    st = E.extension_study(
        model,
        TARGET,
        out=tmp_path,
        lengths=(64, 128),
        passkey_lengths=(),
        methods=("none", "yarn"),
        n_windows=1,
        progress=False,
    )
    assert TARGET not in st.lengths
    fs = {f.key: f for f in st.findings()}
    assert fs["base_bound"].values["men_lower_bound"] == pytest.approx(base_lower_bound(16, TARGET))
    page = write_study(st, tmp_path)
    assert page.exists() and (tmp_path / "study.json").exists()


def test_a_token_tensor_is_read_to_each_length():
    tokens = torch.arange(2 * 64).reshape(2, 64)
    cut = E._cut_windows(None, tokens, (32, 64), n_windows=2)
    assert torch.equal(cut[32][0], tokens[:, :32]) and torch.equal(cut[64][0], tokens)
    with pytest.raises(InputError, match="windows hold 64 tokens, fewer than the length 128"):
        E._cut_windows(None, tokens, (32, 128), n_windows=2)
