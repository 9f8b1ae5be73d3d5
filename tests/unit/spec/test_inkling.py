"""Inkling 2: causal and sliding-window masks, but no RoPE; a learned relative-position bias joins
q·k instead."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM
from transformers.models.inkling2 import modeling_inkling2

import ropelens
from ropelens.errors import NotRotaryError, UnsupportedModelError
from ropelens.spec import reading
from ropelens.spec.reading import rope_spec
from ropelens.testing import tiny_tokenizer
from tests.harness.sweep import shrink_config, sweep_one

T = 20  # longer than the shrunk sliding window (8), so the window cuts rows


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """(HF model, saved path) of a tiny random inkling2_text (hybrid_sliding ×3, then hybrid)."""
    cfg = shrink_config("inkling2_text")
    assert cfg.layer_types == ["hybrid_sliding"] * 3 + ["hybrid"] and cfg.sliding_window_size < T
    torch.manual_seed(0)
    hf = AutoModelForCausalLM.from_config(cfg, attn_implementation="eager").eval()
    path = tmp_path_factory.mktemp("inkling2") / "inkling2_text"
    hf.save_pretrained(path)
    tiny_tokenizer().save_pretrained(path)
    return hf, path


def _eager_calls(hf) -> dict[int, dict]:
    """Each layer's arguments to HF's eager attention function and the probabilities it returns."""
    seen, orig = {}, modeling_inkling2.eager_attention_forward

    def tap(module, query, key, value, attention_mask, scaling, *args, **kwargs):
        out = orig(module, query, key, value, attention_mask, scaling, *args, **kwargs)
        if not type(module).__name__.endswith(
            "Attention"
        ):  # 5.24's block attention residual calls it too
            return out
        seen[module.layer_idx] = dict(
            q=query, k=key, mask=attention_mask, scaling=scaling, probs=out[1], **kwargs
        )
        return out

    toks = torch.randint(4, 100, (1, T), generator=torch.Generator().manual_seed(0))
    modeling_inkling2.eager_attention_forward = tap
    try:
        with torch.no_grad():
            hf(toks)
    finally:
        modeling_inkling2.eager_attention_forward = orig
    return seen


def test_scores_are_qk_plus_a_relative_bias_and_a_sink_not_rotated_qk(tiny):
    """The reason for the refusal, checked on HF's own eager attention: the masks would fit
    ropelens's spec, but the probabilities are softmax([q·k·scale + mask + bias, sink]), and the
    bias moves them."""
    hf, _ = tiny
    assert not reading._rotary_modules(hf)  # nothing rotary in the text tower
    calls = _eager_calls(hf)
    d = torch.arange(T)[:, None] - torch.arange(T)[None]
    for L, c in calls.items():
        window = c["sliding_window"]
        assert window == (
            hf.config.sliding_window_size if hf.config.layer_types[L] == "hybrid_sliding" else None
        )
        allowed = (d >= 0) & (d < window) if window else d >= 0  # ropelens's (q - k) < window
        assert torch.equal(c["mask"][0, 0] == 0, allowed), L
        k = c["k"].repeat_interleave(c["q"].shape[1] // c["k"].shape[1], 1)
        s = c["q"] @ k.transpose(-1, -2) * c["scaling"] + c["mask"]
        bias, sink = c["position_bias"], c["sinks"]
        full = torch.softmax(torch.cat([s + bias, sink], -1), -1)[..., :-1]
        no_bias = torch.softmax(torch.cat([s, sink], -1), -1)[..., :-1]
        # float32, the same ops as HF's in the same order: equal up to rounding (~1e-7); the bias
        # moves p by ~5e-3
        torch.testing.assert_close(full, c["probs"], rtol=0, atol=1e-6)
        assert float((no_bias - c["probs"]).abs().max()) > 1e-3, L
        assert float(sink.std(2).max()) > 1e-2  # a sink logit per query token, not one per head


def test_inkling2_is_not_rotary_and_says_why_in_one_line(tiny):
    _, path = tiny
    with pytest.raises(
        NotRotaryError,
        match=r"applies no RoPE to its text queries and keys: position enters its "
        r"scores \(Inkling2FullAttention, Inkling2SlidingAttention\) only as a "
        r"learned relative-position bias",
    ) as err:
        rope_spec(ropelens.load_model(path, device="cpu"))
    assert "\n" not in str(err.value) and str(err.value).startswith(
        "Inkling2ForCausalLM applies no RoPE"
    )


def test_a_relative_bias_beside_rope_is_refused_as_unsupported(tiny, monkeypatch):
    """Were the same bias added to rotated scores, the scores would still not be q·k times one
    scale: refused."""
    _, path = tiny
    model = ropelens.load_model(path, device="cpu")
    monkeypatch.setattr(reading, "_rotary_modules", lambda hf: [torch.nn.Module()])
    with pytest.raises(
        UnsupportedModelError,
        match=r"relative-position bias.*so its scores are not q·k times one "
        r"scale",
    ) as err:
        rope_spec(model)
    assert "\n" not in str(err.value) and str(err.value).startswith(
        "Inkling2ForCausalLM: position enters"
    )


def test_sweep_row_is_no_rope(tmp_path):
    row = sweep_one("inkling2_text", workdir=tmp_path)
    assert row.status == "no RoPE", row.detail
    assert (
        "ropelens agrees: Inkling2ForCausalLM applies no RoPE to its text queries and keys"
        in row.detail
    )
