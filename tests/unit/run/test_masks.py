"""Key masks: right padding measured exactly (against one unpadded window at a time); left padding
and gaps refused by every entry that takes a mask, since every reducer reads a token's position as
its index in the window."""

from __future__ import annotations

import pytest
import torch

import ropelens
from ropelens.analyses.frequency_usage import UsageReducer
from ropelens.backends.sdpa_capture import fast_qk, right_padded
from ropelens.errors import InputError
from ropelens.run.capture import stream

N = 16
LENGTHS = (16, 11, 7)
REFUSED = (
    r"row 1 has a real token after padding \(left padding or a gap\).*right-padded batches only"
)


def _batch() -> torch.Tensor:
    toks = torch.randint(4, 100, (len(LENGTHS), N), generator=torch.Generator().manual_seed(11))
    toks[:, 0] = 1
    return toks


def _left_padded() -> tuple[torch.Tensor, torch.Tensor]:
    toks, valid = _batch(), torch.ones(len(LENGTHS), N, dtype=torch.bool)
    valid[1, :5] = False  # row 1's tokens start at index 5
    return toks, valid


def _gap() -> tuple[torch.Tensor, torch.Tensor]:
    toks, valid = _batch(), torch.ones(len(LENGTHS), N, dtype=torch.bool)
    valid[1, 6:9] = False  # row 1: tokens, three padded, tokens again
    return toks, valid


@pytest.mark.parametrize("fast", [True, False])
@pytest.mark.parametrize("family", ["llama-gqa", "gptj"])  # gptj never takes the fast path
def test_right_padding_equals_each_window_alone(tiny, family, fast):
    """Rows of 16, 11 and 7 real tokens right-padded in one batch give the sums of the three windows
    streamed alone, unpadded. The q/k at real positions come from other kernels (a batch of three
    with a mask against one row causal), which round float32 differently by a few ulps through two
    layers (~1e-6 relative); the float64 sums add that and ~1e-16, so rtol 1e-5."""
    model = tiny(family)
    spec = ropelens.rope_spec(model)
    toks = _batch()
    valid = torch.arange(N)[None] < torch.tensor(LENGTHS)[:, None]
    padded = UsageReducer(spec, spec.rotary_layers)
    n = stream(model, [(toks, valid)], [padded], progress=False, fast=fast)
    alone = UsageReducer(spec, spec.rotary_layers)
    n_alone = sum(
        stream(model, [toks[i : i + 1, :L]], [alone], progress=False, fast=fast)
        for i, L in enumerate(LENGTHS)
    )
    assert n == n_alone == sum(LENGTHS)
    for key in alone.tok:
        for f in ("count", "total", "total_sq"):
            want, got = getattr(alone.tok[key], f), getattr(padded.tok[key], f)
            assert torch.allclose(got, want, rtol=1e-5, atol=0), (key, f)


@pytest.mark.parametrize("mask", [_left_padded, _gap], ids=["left padding", "gap"])
@pytest.mark.parametrize("fast", [True, False])
def test_left_padding_and_gaps_are_refused(tiny, mask, fast):
    """stream (fast path and bridge) refuses them in one line naming the fix, before any reducer
    runs."""
    model = tiny("llama")
    spec = ropelens.rope_spec(model)
    red = UsageReducer(spec, spec.rotary_layers)
    with pytest.raises(InputError, match=REFUSED):
        stream(model, [mask()], [red], progress=False, fast=fast)
    assert all(float(m.count.sum()) == 0 for m in red.tok.values())


@pytest.mark.parametrize("mask", [_left_padded, _gap], ids=["left padding", "gap"])
def test_the_fast_path_refuses_them_too(tiny, mask):
    model = tiny("llama")
    spec = ropelens.rope_spec(model)
    toks, valid = mask()
    with pytest.raises(InputError, match=REFUSED):
        fast_qk(model, spec, toks, valid, spec.rotary_layers)


def test_right_padded_answers_whether_there_is_padding():
    assert right_padded(torch.ones(2, 4, dtype=torch.bool)) is False
    assert right_padded(torch.tensor([[1, 1, 0, 0], [1, 1, 1, 1]])) is True
    assert right_padded(torch.tensor([[0, 0, 0, 0]])) is True  # an empty row is all padding
    with pytest.raises(InputError, match="row 0 has a real token after padding"):
        right_padded(torch.tensor([[0, 1, 1, 1]]))
