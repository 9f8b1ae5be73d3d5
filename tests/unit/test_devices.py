"""Every core analysis on every available accelerator, against the same analysis on the CPU.

CUDA and MPS cases skip cleanly where the device is absent (CI is CPU-only: there the CPU would
only be compared with itself). Half-precision models are checked against float64 references in
``test_precision.py``.
"""

from __future__ import annotations

import pytest
import torch

import ropelens
from ropelens import Bands
from ropelens.analyses.band_statistics import BandStatsReducer
from ropelens.analyses.head_taxonomy import head_taxonomy
from ropelens.run.intervene import ablate_planes, apply_rope_variant
from ropelens.spec.variants import PRoPE
from ropelens.testing import tiny_model


def _accelerators() -> list:
    mps = getattr(torch.backends, "mps", None)
    return [
        pytest.param(
            "cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
        ),
        pytest.param(
            "mps",
            marks=pytest.mark.skipif(not (mps and mps.is_available()), reason="no MPS device"),
        ),
    ]


def _devices() -> list:
    return ["cpu", *_accelerators()]


FAMILIES = ("llama-gqa", "gemma3")  # gemma3: sliding windows of 8 over 40 tokens, GQA


def _tokens(n: int = 3, seq: int = 40) -> torch.Tensor:
    g = torch.Generator().manual_seed(11)
    t = torch.randint(4, 100, (n, seq), generator=g)
    t[:, 0] = 1
    return t


def _close(a: torch.Tensor, b: torch.Tensor, rtol: float = 1e-4, atol: float = 1e-5) -> None:
    torch.testing.assert_close(
        a.detach().double().cpu(), b.detach().double().cpu(), rtol=rtol, atol=atol
    )


@pytest.fixture(scope="module")
def models():
    cache: dict = {}

    def get(family: str, device: str, dtype: torch.dtype = torch.float32):
        key = (family, device, dtype)
        if key not in cache:
            m = tiny_model(family, device=device)
            cache[key] = m if dtype == torch.float32 else m.to(dtype)
        return cache[key]

    return get


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("device", _accelerators())
def test_usage_and_band_statistics_on_device(family, device, models):
    cpu, dev = models(family, "cpu"), models(family, device)
    toks = _tokens()
    u_cpu = ropelens.analyses.frequency_usage(cpu, toks, progress=False)
    u_dev = ropelens.analyses.frequency_usage(dev, toks, progress=False)
    _close(u_dev.q_norm, u_cpu.q_norm)
    _close(u_dev.k_norm, u_cpu.k_norm)
    s_cpu = ropelens.analyses.band_statistics(
        cpu, toks, bands=Bands.quantiles(2), progress=False, jsd=True
    )
    s_dev = ropelens.analyses.band_statistics(
        dev, toks, bands=Bands.quantiles(2), progress=False, jsd=True
    )
    for k in s_cpu.sums:
        assert s_dev.sums[k].device.type == "cpu" and s_dev.sums[k].dtype == torch.float64, k
        _close(s_dev.sums[k], s_cpu.sums[k], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("device", _devices())
def test_reducer_sums_stay_on_the_device(device, models):
    """Sums accumulate where the activations live (no host round trip per layer)."""
    model = models("llama-gqa", device)
    spec = ropelens.rope_spec(model)
    red = BandStatsReducer(spec, spec.rotary_layers, Bands.quantiles(2))
    ropelens.run.capture.stream(model, [_tokens()], [red], spec=spec, progress=False)
    assert {v.device.type for v in red.sums.values()} == {torch.device(device).type}


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("device", _accelerators())
def test_decomposition_heads_variants_and_ablation_on_device(family, device, models):
    cpu, dev = models(family, "cpu"), models(family, device)
    toks = _tokens(2, 24)
    d_cpu, d_dev = (
        ropelens.analyses.attention_decomposition(cpu, toks),
        ropelens.analyses.attention_decomposition(dev, toks),
    )
    L = d_cpu.layers[-1]
    _close(d_dev.band_logits(L, masked=False), d_cpu.band_logits(L, masked=False))
    _close(d_dev.rebuilt_pattern(L), d_cpu.pattern(L), atol=1e-5)
    h_cpu = head_taxonomy(cpu, toks, n_ctx=24, progress=False, max_offset=4)
    h_dev = head_taxonomy(dev, toks, n_ctx=24, progress=False, max_offset=4)
    for k, v in h_cpu.scores.items():
        _close(h_dev.scores[k], v, rtol=1e-4, atol=1e-5)
    with torch.no_grad():
        plain = cpu(toks, return_type="logits")
        with apply_rope_variant(cpu, PRoPE(0.5)):
            v_cpu = cpu(toks, return_type="logits")
        with apply_rope_variant(dev, PRoPE(0.5)):
            v_dev = dev(toks.to(device), return_type="logits")
        with ablate_planes(cpu, planes=[0, 1]):
            a_cpu = cpu(toks, return_type="logits")
        with ablate_planes(dev, planes=[0, 1]):
            a_dev = dev(toks.to(device), return_type="logits")
    assert not torch.allclose(v_cpu, plain) and not torch.allclose(
        a_cpu, plain
    )  # the interventions do something
    _close(v_dev, v_cpu, atol=1e-4)
    _close(a_dev, a_cpu, atol=1e-4)
