"""The decomposition and usage on the real embedded models (real English text)."""

from __future__ import annotations

import pytest
import torch

import ropelens
from ropelens.analyses.attention_decomposition import attention_decomposition
from ropelens.analyses.frequency_usage import frequency_usage
from ropelens.run import data
from ropelens.spec.bands import Bands

pytestmark = pytest.mark.integration


def english_window(model, n_ctx: int) -> torch.Tensor:
    return data.windows(data.english(), model.tokenizer, n_ctx, n_windows=1)


def assert_sums_to_scores(model, toks, layers, bands):
    dec = attention_decomposition(model, toks, bands=bands, layers=layers)
    _, cache = model.run_with_cache(
        toks, names_filter=lambda n: n.endswith(("hook_attn_scores", "hook_pattern"))
    )
    for L in layers:
        scores = cache[f"blocks.{L}.attn.hook_attn_scores"]
        total = dec.band_logits(L, masked=False).sum(2)
        mask = dec.mask(L)[:, None].expand_as(total)
        assert (total - scores)[mask].abs().max() <= 1e-4, f"layer {L}"
        assert torch.equal(torch.isfinite(dec.logits(L)), mask), f"mask of layer {L}"
        assert (
            torch.softmax(dec.logits(L), -1) - cache[f"blocks.{L}.attn.hook_pattern"]
        ).abs().max() <= 1e-5
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
    for w in "qk":
        assert torch.allclose(pre.norm(w, "no_sink"), post.norm(w, "no_sink"), rtol=1e-4)

    # The sink is large in attention: Gu et al. call a head sunk on a token when it gives it more
    # than ε = 0.3 of its attention. Measured on these 4 windows (queries at positions ≥ 16), the
    # mean attention to position 0 is 0.002–0.019 in layer 0 and 0.18–0.80 in layer 20 (8 of 9
    # heads above 0.3).
    _, cache = smollm2.run_with_cache(toks, names_filter=lambda n: n.endswith("hook_pattern"))
    to_bos = {L: cache[f"blocks.{L}.attn.hook_pattern"][:, :, 16:, 0].mean((0, 2)) for L in (0, 20)}
    assert to_bos[0].max() < 0.05, to_bos[0]
    assert (to_bos[20] > 0.3).sum() >= 7 and to_bos[20].mean() > 0.5, to_bos[20]

    # ... but not in norm. The no_sink scope leaves out exactly position 0 of each window, so the
    # sink position's own statistics are (all − no_sink) sums. Measured in layer 20: the RMS norm
    # of the BOS query is 0.09–0.12× that of the other positions' queries (every head), of the BOS
    # key 0.21–0.27× (every KV head), and no plane of the BOS key is as large as the rest's mean
    # (per-plane ratio ≤ 0.88). The BOS key draws attention by its direction, not its size.
    li = pre.layers.index(20)
    for w, limit in (("q", 0.2), ("k", 0.4)):
        a, b = pre.token[(w, "all")], pre.token[(w, "no_sink")]
        n_sink = a.count - b.count  # [layer, head, plane]
        assert (n_sink == toks.shape[0]).all() and (b.count == toks.numel() - toks.shape[0]).all()
        rms_sink = ((a.total_sq - b.total_sq) / n_sink).sum(-1).sqrt()[li]  # [head]
        rms_rest = (b.total_sq / b.count).sum(-1).sqrt()[li]
        assert (rms_sink < limit * rms_rest).all(), (w, rms_sink / rms_rest)
        if w == "k":
            per_plane = ((a.total - b.total) / n_sink)[li] / b.mean[li]
            assert (per_plane < 1.0).all(), per_plane.max()
