"""The decomposition and usage on the real embedded models (real English text)."""

from __future__ import annotations

import pytest
import torch

import ropelens
from ropelens import data
from ropelens.bands import Bands
from ropelens.decompose import decompose_attention
from ropelens.usage import frequency_usage

pytestmark = pytest.mark.integration


def english_window(model, n_ctx: int) -> torch.Tensor:
    return data.windows(data.english(), model.tokenizer, n_ctx, n_windows=1)


def assert_sums_to_scores(model, toks, layers, bands):
    dec = decompose_attention(model, toks, bands=bands, layers=layers)
    _, cache = model.run_with_cache(toks, names_filter=lambda n: n.endswith(("hook_attn_scores", "hook_pattern")))
    for L in layers:
        scores = cache[f"blocks.{L}.attn.hook_attn_scores"]
        total = dec.band_logits(L, masked=False).sum(2)
        mask = dec.mask(L)[:, None].expand_as(total)
        assert (total - scores)[mask].abs().max() <= 1e-4, f"layer {L}"
        assert torch.equal(torch.isfinite(dec.logits(L)), mask), f"mask of layer {L}"
        assert (torch.softmax(dec.logits(L), -1) - cache[f"blocks.{L}.attn.hook_pattern"]).abs().max() <= 1e-5
    return dec


def test_smollm2_decomposition_is_exact(smollm2):
    toks = english_window(smollm2, 128)
    assert_sums_to_scores(smollm2, toks, [0, 3, 15, 29], Bands.quantiles(4))


def test_gemma3_local_and_global_layers_past_the_window(gemma3):
    """600 tokens > the 512-token sliding window: local layers must mask, global ones not."""
    spec = ropelens.rope_spec(gemma3)
    local, glob = spec.kinds["sliding"][0], spec.kinds["full"][0]
    toks = english_window(gemma3, 600)
    dec = assert_sums_to_scores(gemma3, toks, [local, glob], Bands.by_context())
    assert not dec.mask(local)[0, 599, 0] and dec.mask(glob)[0, 599, 0]


def test_smollm2_usage_pre_post_agree_and_sinks_are_large(smollm2):
    toks = data.windows(data.english(), smollm2.tokenizer, 128, n_windows=4)
    pre = frequency_usage(smollm2, toks, progress=False, source="pre", layers=[0, 10, 20])
    post = frequency_usage(smollm2, toks, progress=False, source="post", layers=[0, 10, 20])
    assert torch.allclose(pre.q_norm, post.q_norm, rtol=1e-4)
    assert torch.allclose(pre.k_norm, post.k_norm, rtol=1e-4)
    assert pre.q_norm.shape == (3, 9, 32) and pre.k_norm.shape == (3, 3, 32)
