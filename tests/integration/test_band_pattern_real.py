"""``band_pattern`` on the real SmolLM2 against HF's own eager attention with planes zeroed."""

from __future__ import annotations

import pytest
import torch

import ropelens
from ropelens import Bands
from ropelens.analyses import attention_decomposition
from tests.integration.test_core_real import english_window
from tests.unit.analyses.test_band_pattern import hf_patterns, hf_planes

pytestmark = pytest.mark.integration

LAYER = 16  # holds a previous-token head (head 0)
ATOL = 1e-5


def test_smollm2_band_pattern_is_hf_with_other_planes_zeroed(smollm2):
    """All bands give the captured pattern; band Q1 alone, and Q2 with Q4, give HF's eager
    attention with every other dim of its post-RoPE q and k zeroed (rotate_half pairs, planes by
    HF's inv_freq, fastest first)."""
    toks = english_window(smollm2, 128)
    dec = attention_decomposition(smollm2, toks, bands=Bands.quantiles(4), layers=[LAYER])
    torch.testing.assert_close(dec.band_pattern(LAYER), dec.pattern(LAYER), rtol=0, atol=ATOL)

    hf = ropelens.load_model("smollm2-135m", device="cpu", bridge=False).original_model
    hf.set_attn_implementation("eager")
    head_dim = dec.acts[LAYER]["q_post"].shape[-1]
    p = hf_planes(hf, LAYER, head_dim, adjacent=False)
    assert p.n == 32 and p.rest.numel() == 0
    q1, q2, q4 = (p.dims[8 * j : 8 * (j + 1)].flatten() for j in (0, 1, 3))
    every, only_q1, q2_q4 = hf_patterns(
        hf, toks, {LAYER: [torch.arange(head_dim), q1, torch.cat([q2, q4])]}
    )[LAYER]
    torch.testing.assert_close(dec.band_pattern(LAYER), every, rtol=0, atol=ATOL)
    torch.testing.assert_close(dec.band_pattern(LAYER, bands=["Q1"]), only_q1, rtol=0, atol=ATOL)
    torch.testing.assert_close(
        dec.band_pattern(LAYER, bands=["Q2", "Q4"]), q2_q4, rtol=0, atol=ATOL
    )
    # the bands matter: Q1 alone is far from the model's pattern
    assert float((only_q1 - every).abs().max()) > 0.1
