"""Frequency usage: per-plane norms, pre/post agreement, exact merging, persistence, figures."""

from __future__ import annotations

import pytest
import torch

import ropelens
from ropelens.bands import Bands
from ropelens.capture import capture_qk
from ropelens.usage import FrequencyUsage, frequency_usage


def tokens(batch=4, seq=24, seed=0):
    g = torch.Generator().manual_seed(seed)
    t = torch.randint(4, 101, (batch, seq), generator=g)
    t[:, 0] = 1
    return t


def test_pre_and_post_rope_usage_agree(tiny, rope_family):
    """Rotation keeps each plane's norm, so usage from pre- and post-RoPE q/k is the same."""
    model = tiny(rope_family)
    pre = frequency_usage(model, tokens(), progress=False, source="pre")
    post = frequency_usage(model, tokens(), progress=False, source="post")
    for w in "qk":
        assert torch.allclose(pre.norm(w), post.norm(w), rtol=1e-5, atol=1e-6)


def test_usage_matches_direct_norms(tiny):
    model = tiny("llama-gqa")
    toks = tokens()
    u = frequency_usage(model, toks, progress=False, n_sink=1)
    acts = capture_qk(model, toks, which=("q_pre", "k_pre"))
    spec = ropelens.rope_spec(model)
    for i, L in enumerate(u.layers):
        for w in "qk":
            n = spec.layers[L].split(acts[L][f"{w}_pre"]).norm(dim=-1)  # [b,pos,h,P]
            assert torch.allclose(u.norm(w)[i], n.mean((0, 1)), rtol=1e-5)
            assert torch.allclose(u.norm(w, "no_sink")[i], n[:, 1:].mean((0, 1)), rtol=1e-5)
            assert torch.allclose(u.std(w)[i], n.flatten(0, 1).std(0), rtol=1e-4)
            win = n.mean(1)  # per-window means
            assert torch.allclose(u.ci(w)[i], 1.96 * win.std(0) / 2.0, rtol=1e-4)
    assert u.q_norm.shape == (2, 4, 8) and u.k_norm.shape == (2, 2, 8)


def test_merged_halves_equal_one_pass(tiny, tmp_path):
    model = tiny("gemma3")
    toks = tokens(6)
    whole = frequency_usage(model, toks, progress=False, batch_size=4)
    a = frequency_usage(model, toks[:3], progress=False)
    b = frequency_usage(model, toks[3:], progress=False)
    a.save(tmp_path / "a.json")
    merged = FrequencyUsage.load(tmp_path / "a.json").merge(b)
    for key in whole.token:
        for name in ("count", "total", "total_sq"):
            assert torch.allclose(getattr(merged.token[key], name), getattr(whole.token[key], name), rtol=1e-12)
            assert torch.allclose(getattr(merged.window[key], name), getattr(whole.window[key], name), rtol=1e-12)
    assert merged.provenance.n_windows == 6


def test_padding_is_ignored(tiny):
    """Right padding: padded positions are excluded, so results equal the unpadded run."""
    from ropelens.capture import stream
    from ropelens.usage import UsageReducer

    model = tiny("llama")
    spec = ropelens.rope_spec(model)
    toks = tokens(2, seq=16)
    short = toks[:, :10]
    ref = UsageReducer(spec, [0, 1])
    stream(model, [short], [ref], progress=False)
    padded = UsageReducer(spec, [0, 1])
    valid = torch.zeros_like(toks, dtype=torch.bool)
    valid[:, :10] = True
    stream(model, [(toks, valid)], [padded], progress=False)
    for key in ref.tok:
        assert torch.allclose(ref.tok[key].mean, padded.tok[key].mean, rtol=1e-6)


def test_band_share_roundtrip_and_figures(tiny, tmp_path):
    u = frequency_usage(tiny("llama"), tokens(), progress=False)
    names, share = u.band_share(Bands.quantiles(2))
    assert names == ["Q1 (highest)", "Q2 (lowest)"] and torch.allclose(share.sum(-1), torch.ones(()))
    df = u.to_frame()
    assert len(df) == 2 * (2 * 4 * 8) * 2  # (q, k) × layers·heads·planes × (all, no_sink)
    assert set(df["which"]) == {"q", "k"} and set(df["scope"]) == {"all", "no_sink"}
    assert len(u.figure().data) == 2 and len(u.figure(layer=1).data) == 2
    bundle = u._repr_mimebundle_()
    assert "application/vnd.plotly.v1+json" in bundle and "cdn.plot.ly" not in str(bundle)
    u.save(tmp_path / "u.json")
    assert FrequencyUsage.load(tmp_path / "u.json").to_frame().equals(df)
    with pytest.raises(ValueError, match="not measured"):
        u.heatmap(layer=7)


def test_usage_rejects_bad_input(tiny, tmp_path):
    model = tiny("llama")
    with pytest.raises(ValueError, match="source"):
        frequency_usage(model, tokens(), source="middle", progress=False)
    with pytest.raises(ValueError, match="integer"):
        frequency_usage(model, torch.rand(2, 8), progress=False)
    bad = tmp_path / "x.json"
    bad.write_text('{"type": "BandStatistics"}')
    with pytest.raises(ValueError, match="FrequencyUsage"):
        FrequencyUsage.load(bad)
