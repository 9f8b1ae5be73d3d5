"""Frequency entropy: the streamed spectral entropy against a plain numpy loop over captured
queries."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest
import torch

from ropelens.analyses.frequency_entropy import (
    EntropyReducer,
    FrequencyEntropy,
    frequency_entropy,
    spectral_entropy,
)
from ropelens.analyses.frequency_usage import frequency_usage
from ropelens.errors import InputError
from ropelens.results.result import load_result
from ropelens.run.capture import capture_qk
from ropelens.testing import tiny_tokenizer, wrap_hf_model
from ropelens.testing.families import family_hf_model


def _entropy_loop(signal: np.ndarray) -> float:
    """Normalised spectral entropy written out: mean removed, |DFT|² at k = 1..n//2, −Σ p ln p /
    ln(n//2)."""
    n = len(signal)
    x = signal - signal.mean()
    F = n // 2
    power = []
    for k in range(1, F + 1):
        re = sum(x[t] * math.cos(2 * math.pi * k * t / n) for t in range(n))
        im = -sum(x[t] * math.sin(2 * math.pi * k * t / n) for t in range(n))
        power.append(re * re + im * im)
    total = sum(power)
    return -sum(p / total * math.log(p / total) for p in power if p > 0) / math.log(F)


def test_spectral_entropy_against_a_written_out_dft():
    g = np.random.default_rng(0)
    sig = g.normal(size=(3, 37))
    h, p = spectral_entropy(torch.from_numpy(sig))
    # float64 throughout; the loop's DFT sums 37 terms in another order: ~1e-14
    assert h.numpy() == pytest.approx([_entropy_loop(s) for s in sig], abs=1e-12)
    assert torch.allclose(p.sum(-1), torch.ones(3, dtype=torch.float64))
    t = torch.arange(64, dtype=torch.float64)
    tone, _ = spectral_entropy(5 + torch.cos(2 * math.pi * 4 * t / 64))  # all power at bin 4
    assert float(tone) == pytest.approx(0.0, abs=1e-12)
    assert torch.isnan(spectral_entropy(torch.full((16,), 2.0))[0])  # no variation, no spectrum
    with pytest.raises(InputError, match="at least 4 positions"):
        spectral_entropy(torch.ones(3))


@pytest.fixture(scope="module")
def smollm3():
    """The tiny SmolLM3: layers 1 and 3 are NoPE."""
    return wrap_hf_model(
        family_hf_model("smollm3"),
        tiny_tokenizer(),
        device="cpu",
        label="tiny-smollm3",
        hub_name="ropelens/tiny-smollm3",
    )


@pytest.fixture(scope="module")
def tokens():
    return torch.randint(4, 100, (3, 40), generator=torch.Generator().manual_seed(0))


@pytest.fixture(scope="module")
def result(smollm3, tokens):
    return frequency_entropy(smollm3, tokens, n_ctx=40, progress=False, batch_size=2, seed=5)


def test_streamed_entropy_matches_a_numpy_loop_over_captured_queries(smollm3, tokens, result):
    assert result.layers == (0, 1, 2, 3) and [result.kind(L) for L in result.layers] == [
        "full",
        "nope",
        "full",
        "nope",
    ]
    kept = capture_qk(smollm3, tokens, layers=[0, 1, 2, 3], which=("q_pre",), fast=False)
    perm = torch.randperm(39, generator=torch.Generator().manual_seed(5)).numpy()
    want = np.zeros((2, 4, 4, 8))  # in order / shuffled, layer, head, plane
    for i, L in enumerate(result.layers):
        q = kept[L]["q_pre"].double().numpy()[:, 1:]  # [window, pos, head, 16]; position 0 skipped
        for h in range(4):
            for p in range(8):  # half pairing: plane p is dims (p, p + 8), in NoPE layers too
                vals = [[], []]
                for w in range(q.shape[0]):
                    s = np.hypot(q[w, :, h, p], q[w, :, h, p + 8])
                    vals[0].append(_entropy_loop(s))
                    vals[1].append(_entropy_loop(s[perm]))
                want[:, i, h, p] = np.mean(vals, axis=1)
    # q is float32 from the model either way; the entropies are float64 sums of ≤ 20 bins: 1e-9 is
    # loose
    assert result.entropy().numpy() == pytest.approx(want[0], abs=1e-9)
    assert result.entropy(shuffled=True).numpy() == pytest.approx(want[1], abs=1e-9)
    assert int(result.sums["count"].sum()) == 3 * 4 * 4 * 8


def test_rotary_analyses_still_refuse_nope_layers(smollm3, tokens, result):
    with pytest.raises(InputError, match="apply no RoPE"):
        frequency_usage(smollm3, tokens, n_ctx=40, layers=[1], progress=False)
    only = frequency_entropy(smollm3, tokens, n_ctx=40, layers=[1], progress=False, seed=5)
    assert torch.allclose(only.sums["h"][0], result.sums["h"][1], rtol=1e-12, atol=0)


def test_merge_of_two_halves_is_the_whole(smollm3, tokens, result):
    a = frequency_entropy(smollm3, tokens[:2], n_ctx=40, progress=False, seed=5)
    b = frequency_entropy(smollm3, tokens[2:], n_ctx=40, progress=False, seed=5)
    m = a.merge(b)
    for k, v in result.sums.items():
        assert torch.allclose(m.sums[k], v, rtol=1e-12, atol=1e-12), (
            k
        )  # float64 sums in another order
    with pytest.raises(InputError, match="seed differs"):
        a.merge(replace(b, seed=6))


def test_findings_save_load_and_figure(result, tmp_path):
    text = result.findings()[0].text
    assert "NoPE layers (2)" in text and "rotary (full) layers (2)" in text
    kinds = result.by_kind()
    h = result.entropy()
    assert kinds["nope"]["entropy"] == pytest.approx(float(h[[1, 3]].mean()))
    result.save(tmp_path / "e.json")
    back = load_result(tmp_path / "e.json")
    assert isinstance(back, FrequencyEntropy) and back.to_dict() == result.to_dict()
    df = result.to_frame()
    assert len(df) == 4 * 4 * 8 and math.isinf(df[df["kind"] == "nope"]["wavelength"].iloc[0])
    assert result.spectrum().sum(-1).numpy() == pytest.approx(np.ones((4, 8)))
    assert len(result.figure().data) == 3
    with pytest.raises(InputError, match="a spectrum needs at least 4"):
        EntropyReducer(result.spec, [0], 5, skip=2)
