"""Head taxonomy: a hand-built previous-token head and content head are found, scores are stable."""

from __future__ import annotations

import math

import pytest
import torch

from ropelens.analyses.head_taxonomy import (
    HeadScoresReducer,
    HeadTaxonomy,
    head_taxonomy,
    otsu_threshold,
    random_tokens,
)
from ropelens.loading.models import wrap_hf_model
from ropelens.run.capture import batches, stream
from ropelens.spec.bands import Bands
from ropelens.spec.reading import rope_spec
from ropelens.testing import tiny_hf_model, tiny_tokenizer

N_CTX = 20  # short: plane 0 (θ₀ = 1 rad) nearly repeats after 2π ≈ 6.3 tokens, so keep few periods
ROW = 16  # head_dim of the tiny llama; plane i pairs dims (i, i + 8)


def _handset():
    """Tiny Llama whose layer-0 head 0 is previous-token via plane 0 and head 1 content via plane 7.

    Every token embeds as [1, cos φ, sin φ, cos ψ, sin ψ, 0, ...]: constant norm, so after RMSNorm
    dim 0 is the same for every token and q/k built from it carry no content.
    """
    hf = tiny_hf_model("llama")
    g = torch.Generator().manual_seed(0)
    vocab = hf.get_input_embeddings().num_embeddings
    phi, psi = (
        torch.rand(vocab, generator=g) * 2 * math.pi,
        torch.rand(vocab, generator=g) * 2 * math.pi,
    )
    with torch.no_grad():
        emb = torch.zeros(vocab, 64)
        emb[:, 0], emb[:, 1], emb[:, 2], emb[:, 3], emb[:, 4] = (
            1,
            phi.cos(),
            phi.sin(),
            psi.cos(),
            psi.sin(),
        )
        hf.get_input_embeddings().weight.copy_(emb)
        attn = hf.model.layers[0].self_attn
        hf.model.layers[0].input_layernorm.weight.fill_(1.0)
        s = 1 / math.sqrt(3 / 64)  # RMSNorm scale of a norm-√3 embedding in 64 dims
        wq, wk = torch.zeros_like(attn.q_proj.weight), torch.zeros_like(attn.k_proj.weight)
        a, theta0 = 30.0 / s, 1.0
        # head 0, plane 0 (dims 0, 8): k = a·(1, 0), q = a·R(−θ₀)(1, 0) ⇒ logit ∝ cos((m−n−1)θ₀)
        wk[0, 0] = a
        wq[0, 0], wq[8, 0] = a * math.cos(theta0), -a * math.sin(theta0)
        # head 1, plane 7 (dims 7, 15): q from ψ of the query token, k from φ of the key token
        b = 20.0 / s
        wq[ROW + 7, 3], wq[ROW + 15, 4] = b, b
        wk[ROW + 7, 1], wk[ROW + 15, 2] = b, b
        attn.q_proj.weight.copy_(wq)
        attn.k_proj.weight.copy_(wk)
    return wrap_hf_model(
        hf, tiny_tokenizer(), device="cpu", label="tiny-handset", hub_name="ropelens/tiny-handset"
    )


@pytest.fixture(scope="module")
def handset():
    return _handset()


@pytest.fixture(scope="module")
def taxonomy(handset):
    return head_taxonomy(handset, n_ctx=N_CTX, n_windows=8, max_offset=6, progress=False)


def test_previous_token_head_found_from_high_band(taxonomy):
    kinds, df = taxonomy.kinds(), taxonomy.to_frame().set_index(["layer", "head"])
    assert kinds[0][0] == "previous-token"
    assert df.loc[(0, 0), "mass_text"] > 0.9 and df.loc[(0, 0), "mass_random"] > 0.9
    name0 = taxonomy.band_names[0]
    assert df.loc[(0, 0), f"margin_share[{name0}]"] > 0.95
    assert df.loc[(0, 0), f"position_share_text[{name0}]"] > 0.95  # content-free by construction
    assert df.loc[(0, 0), "top_plane"] == 0 and df.loc[(0, 0), "top_plane_tightness"] > 0.99
    assert taxonomy.positional().sum() == 1


def test_content_head_found_from_low_band(taxonomy):
    df = taxonomy.to_frame().set_index(["layer", "head"])
    name3 = taxonomy.band_names[3]
    assert taxonomy.kinds()[0][1] == "content"
    assert df.loc[(0, 1), f"margin_share[{name3}]"] > 0.95
    assert df.loc[(0, 1), f"position_share_text[{name3}]"] < 0.2


def test_tau_is_otsu_between_the_two_groups(taxonomy):
    robust = taxonomy.robust_mass()
    assert robust[0, 0] >= taxonomy.tau > robust.flatten()[1:].max()


def test_otsu_splits_bimodal_sample():
    v = torch.tensor([0.01, 0.02, 0.05, 0.04, 0.8, 0.9, 0.85])
    assert 0.05 < otsu_threshold(v) < 0.8
    with pytest.raises(ValueError, match="two distinct"):
        otsu_threshold(torch.ones(3))


def _scores(model, toks, batch_size, valid=None):
    spec = rope_spec(model)
    red = HeadScoresReducer(spec, [0, 1], Bands.quantiles(4), 4)
    data = batches(toks, batch_size) if valid is None else [(toks, valid)]
    stream(model, data, [red], spec=spec, progress=False)
    return red.scores("x")


def test_scores_invariant_to_batch_size_and_right_padding(handset):
    toks = random_tokens(4, N_CTX, 101, 1, seed=3)
    a, b = _scores(handset, toks, 4), _scores(handset, toks, 1)
    padded = torch.cat([toks, torch.full((4, 5), 3)], 1)
    valid = torch.ones_like(padded, dtype=torch.bool)
    valid[:, N_CTX:] = False
    c = _scores(handset, padded, 4, valid)
    for k in a:
        torch.testing.assert_close(a[k], b[k], rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(a[k], c[k], rtol=1e-5, atol=1e-6)


def test_random_control_is_seeded(handset):
    assert torch.equal(random_tokens(2, 8, 101, 1, 5), random_tokens(2, 8, 101, 1, 5))
    assert not torch.equal(random_tokens(2, 8, 101, 1, 5), random_tokens(2, 8, 101, 1, 6))
    toks = random_tokens(2, N_CTX, 101, 1, seed=0)
    kw = dict(n_ctx=N_CTX, max_offset=3, layers=[0], progress=False)
    x, y = head_taxonomy(handset, toks, seed=7, **kw), head_taxonomy(handset, toks, seed=7, **kw)
    torch.testing.assert_close(x.scores["mass_random"], y.scores["mass_random"])


def test_save_load_roundtrip_and_figure(taxonomy, tmp_path):
    p = tmp_path / "heads.json"
    taxonomy.save(p)
    back = HeadTaxonomy.load(p)
    assert back.tau == taxonomy.tau and back.kinds() == taxonomy.kinds()
    assert back.to_frame().equals(taxonomy.to_frame())
    assert len(taxonomy.figure().data) >= 2
    assert "plotly" in taxonomy._repr_html_()
    with pytest.raises(ValueError, match="HeadTaxonomy"):
        (tmp_path / "bad.json").write_text('{"type": "Other"}')
        HeadTaxonomy.load(tmp_path / "bad.json")


def test_bad_arguments_name_the_value(handset):
    with pytest.raises(ValueError, match="max_offset"):
        head_taxonomy(handset, random_tokens(1, 8, 101, 1, 0), max_offset=0, progress=False)
    with pytest.raises(ValueError, match="tau"):
        head_taxonomy(
            handset, random_tokens(1, 8, 101, 1, 0), tau=1.5, max_offset=2, progress=False
        )


def test_cli_heads_json(handset, monkeypatch, capsys, tmp_path):
    import json

    from ropelens.catalog import head_taxonomy
    from ropelens.cli import main

    monkeypatch.setattr(head_taxonomy, "load_from_args", lambda args: handset)
    out = tmp_path / "tx.json"
    assert (
        main(
            [
                "head-taxonomy",
                "--tokens",
                str(2 * N_CTX),
                "--n-ctx",
                str(N_CTX),
                "--json",
                "--save",
                str(out),
            ]
        )
        == 0
    )
    got = json.loads(capsys.readouterr().out)
    assert got["heads"][0]["kind"] == "previous-token" and HeadTaxonomy.load(out).tau == got["tau"]


def test_experiment_main_on_handset(handset, tmp_path, capsys, monkeypatch):
    import importlib.util
    import json
    from pathlib import Path

    path = Path(__file__).resolve().parents[3] / "experiments" / "positional_vs_semantic.py"
    spec = importlib.util.spec_from_file_location("positional_vs_semantic", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    argv = [
        "--quick",
        "--n-ctx",
        str(N_CTX),
        "--n-windows",
        "4",
        "--n-perm",
        "200",
        "--out",
        str(tmp_path),
    ]
    result = mod.main(argv, model=handset)
    assert result.exists() and "H2" in capsys.readouterr().out
    first = json.loads(result.read_text())
    saved = {p.name: p.read_bytes() for p in tmp_path.iterdir() if p.name != result.name}
    assert any(n.startswith("taxonomy-") for n in saved) and "runs.json" in saved
    assert first["causal"]  # the handset has positional and content heads: there was causal work

    # The resumed run must not classify heads again nor redo any ablation: make both impossible.
    def refuse(*args, **kwargs):
        raise AssertionError("the resumed run redid finished work")

    monkeypatch.setattr(mod, "head_taxonomy", refuse)
    monkeypatch.setattr(mod, "_ablate", refuse)
    again = mod.main(argv, model=handset)
    assert again == result
    assert json.loads(again.read_text()) == first  # identical result
    assert {
        p.name: p.read_bytes() for p in tmp_path.iterdir() if p.name != result.name
    } == saved  # nothing rewritten
