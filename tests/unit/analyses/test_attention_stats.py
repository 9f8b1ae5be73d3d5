"""Attention entropy, KL and Jensen–Shannon divergence, matrix entropy: closed forms, the streamed
reducer against the model's own dense attention pattern, and their place in the context-extension
study and its command."""

from __future__ import annotations

import importlib
import json
import math

import numpy as np
import pytest
import torch

from ropelens import rope_spec
from ropelens.analyses.frequency_entropy import (
    AttentionStatsReducer,
    attention_entropy,
    js_divergence,
    kl_divergence,
    matrix_entropy,
)
from ropelens.errors import InputError
from ropelens.report.extension_study import write_study
from ropelens.run.capture import batches, capture_qk, stream
from ropelens.run.data import analysis_windows
from ropelens.run.intervene import apply_rope_variant
from ropelens.spec.variants import CoPE, FoPEZero, Resonance, YaRN
from ropelens.testing import tiny_model

# the package exports the function under the module's name: the module itself, for its helpers
E = importlib.import_module("ropelens.analyses.extension_study")


# --------------------------------------------------------------------------------------------
# closed forms
# --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("n", [1, 2, 7, 64, 1000])
def test_uniform_rows_have_entropy_log_n(n):
    p = torch.full((3, n), 1.0 / n, dtype=torch.float64)
    torch.testing.assert_close(
        attention_entropy(p), torch.full((3,), math.log(n), dtype=torch.float64)
    )


def test_entropy_of_known_distributions():
    p = torch.tensor([[0.5, 0.25, 0.25, 0.0], [1.0, 0.0, 0.0, 0.0]], dtype=torch.float64)
    got = attention_entropy(p)
    assert got[0].item() == pytest.approx(1.5 * math.log(2), rel=1e-12)  # ½ ln 2 + 2·¼ ln 4
    assert got[1].item() == 0.0


def test_kl_and_js():
    p = torch.tensor([0.5, 0.5], dtype=torch.float64)
    q = torch.tensor([0.9, 0.1], dtype=torch.float64)
    assert kl_divergence(p, p).item() == 0.0 and js_divergence(q, q).item() == 0.0
    assert kl_divergence(p, q).item() == pytest.approx(
        0.5 * math.log(0.5 / 0.9) + 0.5 * math.log(0.5 / 0.1)
    )
    assert kl_divergence(q, p).item() == pytest.approx(
        0.9 * math.log(0.9 / 0.5) + 0.1 * math.log(0.1 / 0.5)
    )
    m = [0.7, 0.3]
    js = 0.5 * sum(a * math.log(a / c) for a, c in zip([0.5, 0.5], m)) + 0.5 * sum(
        b * math.log(b / c) for b, c in zip([0.9, 0.1], m)
    )
    assert js_divergence(p, q).item() == pytest.approx(js) and js_divergence(
        q, p
    ).item() == pytest.approx(js)
    # disjoint supports: JS is ln 2, KL infinite; a key neither puts mass on adds nothing
    a, b = (
        torch.tensor([1.0, 0.0, 0.0], dtype=torch.float64),
        torch.tensor([0.0, 1.0, 0.0], dtype=torch.float64),
    )
    assert (
        js_divergence(a, b).item() == pytest.approx(math.log(2))
        and kl_divergence(a, b).item() == math.inf
    )


def test_matrix_entropy_against_numpy_singular_values():
    g = torch.Generator().manual_seed(0)
    q = torch.randn(50, 6, generator=g, dtype=torch.float64) * torch.tensor(
        [3.0, 2.0, 1.0, 0.5, 0.1, 0.01], dtype=torch.float64
    )
    s = np.linalg.svd(q.numpy(), compute_uv=False)
    lam = s**2 / (s**2).sum()
    want = float(-(lam * np.log(lam)).sum())
    assert matrix_entropy(q.T @ q).item() == pytest.approx(want, rel=1e-10)
    top = s[:2] ** 2 / (s[:2] ** 2).sum()
    assert matrix_entropy(q.T @ q, top=2).item() == pytest.approx(
        float(-(top * np.log(top)).sum()), rel=1e-10
    )
    assert matrix_entropy(torch.eye(4, dtype=torch.float64)).item() == pytest.approx(math.log(4))
    v = torch.tensor([[1.0, 2.0, 3.0]], dtype=torch.float64)
    assert matrix_entropy(v.T @ v).item() == pytest.approx(0.0, abs=1e-12)  # rank one
    with pytest.raises(InputError, match="top must be >= 1"):
        matrix_entropy(torch.eye(3), top=0)


# --------------------------------------------------------------------------------------------
# the streamed reducer against the model's own dense pattern
# --------------------------------------------------------------------------------------------
def _patterns(model, toks, layers, variant=None):
    """The model's own attention pattern per layer (TransformerLens hook_pattern), float64."""
    import contextlib

    names = {f"blocks.{L}.attn.hook_pattern" for L in layers}
    with contextlib.nullcontext() if variant is None else apply_rope_variant(model, variant):
        _, cache = model.run_with_cache(toks, names_filter=lambda n: n in names)
    return {L: cache[f"blocks.{L}.attn.hook_pattern"].double() for L in layers}


def _dense_means(p, ref):
    """Per head: mean over rows of −Σ p ln p, of Σ p ln(p/ref), and of the JS divergence, written
    out in numpy."""
    p, ref = p.numpy(), ref.numpy()  # [b, head, q, k]
    with np.errstate(divide="ignore", invalid="ignore"):
        ent = -np.where(p > 0, p * np.log(p), 0.0).sum(-1)
        kl = np.where(p > 0, p * np.log(p / ref), 0.0).sum(-1)
        m = (p + ref) / 2
        js = 0.5 * np.where(p > 0, p * np.log(p / m), 0.0).sum(-1) + 0.5 * np.where(
            ref > 0, ref * np.log(ref / m), 0.0
        ).sum(-1)
    return ent.mean((0, 2)), kl.mean((0, 2)), js.mean((0, 2))


@pytest.mark.parametrize(
    ("family", "variant"),
    [("llama", YaRN(4.0, 16)), ("llama-gqa", CoPE(4)), ("gemma3", Resonance(2.0, 16))],
)
def test_reducer_equals_dense_softmax(family, variant):
    """Row entropy, KL and JS per head from the streamed q/k equal the same numbers from the model's
    own pattern (Gemma 3: sliding layers with an 8-token window, a global layer, GQA)."""
    model = tiny_model(family)
    spec = rope_spec(model)
    toks = torch.randint(4, 100, (3, 24), generator=torch.Generator().manual_seed(1))
    layers = spec.attention_layers
    ref = capture_qk(model, toks, layers=layers, which=("q_post", "k_post"))
    red = AttentionStatsReducer(spec, layers, reference=ref)
    with apply_rope_variant(model, variant):
        stream(
            model, batches(toks, 2), [red], layers=layers, progress=False
        )  # 2 batches: the offsets move on
    table = red.table()
    dense, dense_ref = _patterns(model, toks, layers, variant), _patterns(model, toks, layers)
    for L in layers:
        ent, kl, js = _dense_means(dense[L], dense_ref[L])
        rows = [r for r in table if r["layer"] == L]
        assert [r["kind"] for r in rows] == [spec[L].kind] * spec[L].n_heads
        assert all(r["rows"] == 3 * 24 for r in rows)
        np.testing.assert_allclose([r["entropy"] for r in rows], ent, rtol=1e-5, atol=1e-7)
        np.testing.assert_allclose([r["kl"] for r in rows], kl, rtol=1e-3, atol=1e-7)
        np.testing.assert_allclose([r["js"] for r in rows], js, rtol=1e-3, atol=1e-7)
        assert all(r["kl"] > 0 for r in rows)
    if family == "gemma3":  # a sliding row sees at most 8 keys: its entropy is at most ln 8
        assert max(r["entropy"] for r in table if r["kind"] == "sliding") <= math.log(8) + 1e-9
        assert {r["kind"] for r in table} == {"sliding", "full"}


def test_matrix_entropy_is_of_the_rotated_queries():
    model = tiny_model("llama")
    spec = rope_spec(model)
    toks = torch.randint(4, 100, (2, 20), generator=torch.Generator().manual_seed(2))
    red = AttentionStatsReducer(spec, [0, 1])
    stream(model, batches(toks, 8), [red], layers=[0, 1], progress=False)
    q = capture_qk(model, toks, layers=[1], which=("q_post",))[1][
        "q_post"
    ].double()  # [b, pos, head, d]
    for h in range(spec[1].n_heads):
        s = np.linalg.svd(q[:, :, h].reshape(-1, q.shape[-1]).numpy(), compute_uv=False)
        lam = s**2 / (s**2).sum()
        row = next(r for r in red.table() if r["layer"] == 1 and r["head"] == h)
        assert row["matrix_entropy"] == pytest.approx(float(-(lam * np.log(lam)).sum()), rel=1e-9)
        assert row["kl"] is None and row["js"] is None  # no reference


def test_reference_of_other_windows_is_refused():
    model = tiny_model("llama")
    spec = rope_spec(model)
    toks = torch.randint(4, 100, (2, 20), generator=torch.Generator().manual_seed(2))
    ref = capture_qk(model, toks[:, :10], layers=[0, 1], which=("q_post", "k_post"))
    red = AttentionStatsReducer(spec, [0, 1], reference=ref)
    with pytest.raises(InputError, match="capture the reference on the same tokens"):
        stream(model, batches(toks, 2), [red], layers=[0, 1], progress=False)
    with pytest.raises(InputError, match=r"holds no queries and keys of layer\(s\) \[1\]"):
        AttentionStatsReducer(spec, [0, 1], reference={0: ref[0]})


# --------------------------------------------------------------------------------------------
# in the extension study
# --------------------------------------------------------------------------------------------
NATIVE, TARGET = 32, 128
NEW = ("none", "dynamic", "yarn", "resonance", "cope", "fope")  # in METHODS order


@pytest.fixture(scope="module")
def ext_model():
    return tiny_model("llama", max_position_embeddings=NATIVE)


@pytest.fixture(scope="module")
def study(ext_model, tmp_path_factory):
    out = tmp_path_factory.mktemp("att")
    return E.extension_study(
        ext_model,
        TARGET,
        start=32,
        n_windows=2,
        passkey_lengths=(),
        methods=NEW,
        progress=False,
        out=out,
    ), out


def test_new_variants_are_methods_when_asked(ext_model, study):
    layer = rope_spec(ext_model)[0]
    v = E.extension_variants(layer, NATIVE, TARGET, ["resonance", "cope", "fope"])
    assert v == {"resonance": Resonance(4.0, NATIVE), "cope": CoPE(), "fope": FoPEZero(NATIVE)}
    assert not {"resonance", "cope", "fope"} & set(E.DEFAULT_METHODS) and set(
        E.DEFAULT_METHODS
    ) < set(E.METHODS)
    st, _ = study
    assert st.methods == NEW and st.variant("fope") == FoPEZero(NATIVE)
    assert {m for m in st.loss_frame()["method"]} == set(NEW)


def test_study_attention_equals_dense_softmax(ext_model, study):
    """The study's per-head KL of YaRN from the unmodified model at the native length, and its
    entropy past it, equal those of the model's own patterns on the same windows."""
    st, _ = study
    heads = st.attention_heads_frame()
    layers = rope_spec(ext_model).attention_layers
    for L_tok in (32, 128):
        toks = analysis_windows(ext_model.tokenizer, None, L_tok, 2 * L_tok)[0]
        dense, dense_ref = (
            _patterns(ext_model, toks, layers, YaRN(4.0, NATIVE)),
            _patterns(ext_model, toks, layers),
        )
        for L in layers:
            ent, kl, js = _dense_means(dense[L], dense_ref[L])
            got = heads[
                (heads["method"] == "yarn") & (heads["length"] == L_tok) & (heads["layer"] == L)
            ]
            np.testing.assert_allclose(got["entropy"], ent, rtol=1e-5)
            if L_tok <= NATIVE:
                np.testing.assert_allclose(got["kl"], kl, rtol=1e-3, atol=1e-8)
                np.testing.assert_allclose(got["js"], js, rtol=1e-3, atol=1e-8)
            else:
                assert got["kl"].isna().all() and got["js"].isna().all()


def test_attention_table(study):
    st, out = study
    df = st.attention_frame().set_index(["method", "length", "kind"])
    assert len(df) == len(NEW) * len(st.lengths)
    assert df.loc[("none", 32, "full"), "kl"] == 0.0 and df.loc[("none", 32, "full"), "js"] == 0.0
    # dynamic NTK rotates as the model does within the native context: its cell is the unmodified
    # one's
    assert df.loc[("dynamic", 32, "full"), "same_as"] == "none"
    assert df.loc[("dynamic", 32, "full"), "entropy"] == df.loc[("none", 32, "full"), "entropy"]
    for m in ("yarn", "resonance", "cope", "fope"):
        assert df.loc[(m, 32, "full"), "kl"] > 0 and df.loc[(m, 32, "full"), "js"] > 0
        assert math.isnan(df.loc[(m, 64, "full"), "kl"])
    # a random tiny model attends almost evenly: the mean row entropy is close to the mean of ln(m +
    # 1)
    for L in st.lengths:
        even = sum(math.log(m + 1) for m in range(L)) / L
        assert df.loc[("none", L, "full"), "entropy"] == pytest.approx(even, abs=0.01)
    # the study's numbers are saved and read back; the attention cells are read on a rerun
    page = write_study(st, out)
    back = E.ExtensionStudy.load(out / "study.json")
    assert back.attention_cells == st.attention_cells
    text = page.read_text()
    assert 'id="attention"' in text and "Attention entropy and divergence" in text
    assert (out / "attention.csv").exists() and (out / "attention_heads.csv").exists()
    assert len(list((out / "cells" / "attention").glob("*.json"))) == len(NEW) * len(st.lengths)


def test_rerun_reads_the_attention_cells(ext_model, study, monkeypatch):
    st, out = study

    def boom(*a, **k):
        raise AssertionError("an attention cell was measured again")

    monkeypatch.setattr(E, "_measure_attention", boom)
    again = E.extension_study(
        ext_model,
        TARGET,
        start=32,
        n_windows=2,
        passkey_lengths=(),
        methods=NEW,
        progress=False,
        out=out,
    )
    assert again.attention_cells == st.attention_cells
    assert again.provenance.config["attention_cells_reused"] == len(NEW) * len(st.lengths)


def test_attention_can_be_left_out(ext_model):
    from ropelens.report.extension_study import study_page

    st = E.extension_study(
        ext_model,
        64,
        start=32,
        n_windows=1,
        passkey_lengths=(),
        methods=("none", "cope"),
        progress=False,
        attention=False,
    )
    assert st.attention_cells == () and st.attention_frame().empty
    assert "No attention was measured" in study_page(st)


def test_extend_command_prints_attention(tmp_path, capsys):
    from ropelens.cli.main import main
    from ropelens.testing import tiny_model_dir

    path = str(tiny_model_dir("llama", tmp_path / "m", max_position_embeddings=32))
    argv = [
        "extension-study",
        path,
        "--to",
        "64",
        "--start",
        "32",
        "--methods",
        "none,resonance,cope,fope",
        "--windows",
        "1",
        "--passkey-lengths",
        "none",
        "--out",
        str(tmp_path / "ext"),
    ]
    assert main([*argv, "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    rows = {(r["method"], r["length"]): r for r in data["attention"]}
    assert set(rows) == {(m, L) for m in ("none", "resonance", "cope", "fope") for L in (32, 64)}
    assert rows[("none", 32)]["kl"] == 0.0 and rows[("cope", 32)]["kl"] > 0
    assert main(argv) == 0
    printed = capsys.readouterr().out
    assert (
        "mean attention entropy of the query rows (nats)" in printed and "Resonance-YaRN" in printed
    )
    assert "divergence from the unmodified model's attention within the native 32 tokens" in printed
    assert main([*argv[:-2], "--methods", "cope,dope", "--out", str(tmp_path / "e2")]) == 2
    assert "unknown ['dope']" in capsys.readouterr().err


def test_plain_model_gives_the_bridges_numbers():
    """The study's attention on the plain HF model (no bridge) equals the bridge's."""
    from ropelens.loading.models import wrap_hf_model
    from ropelens.testing import tiny_hf_model, tiny_tokenizer

    plain = wrap_hf_model(
        tiny_hf_model("llama", max_position_embeddings=32),
        tiny_tokenizer(),
        device="cpu",
        label="tiny-llama",
        bridge=False,
    )
    kw = {
        "start": 32,
        "n_windows": 1,
        "passkey_lengths": (),
        "progress": False,
        "methods": ("none", "fope"),
    }
    a = E.extension_study(plain, 64, **kw).attention_frame()
    b = E.extension_study(
        tiny_model("llama", max_position_embeddings=32), 64, **kw
    ).attention_frame()
    cols = ["entropy", "kl", "js", "matrix_entropy"]
    np.testing.assert_allclose(a[cols].to_numpy(), b[cols].to_numpy(), rtol=1e-6, atol=1e-9)
    assert a.loc[(a["method"] == "fope") & (a["length"] == 32), "kl"].item() > 0
