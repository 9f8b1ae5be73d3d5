"""A plane ablation acts at the rotation on every family: the pre-RoPE q and k ropelens captures
are the model's own under it, and only the rotated q and k lose the plane. GPT-NeoX's bridge
attention has no hook after its rotation, where the bridge used to zero the plane before it."""

from __future__ import annotations

import pytest
import torch

import ropelens
from ropelens.backends.base import backend_of, handle
from ropelens.run.capture import capture_qk
from ropelens.testing.families import family_model_dir


@pytest.mark.parametrize("family", ["gpt_neox", "llama", "phi"])
@pytest.mark.parametrize("fast", [False, True])
def test_an_ablation_leaves_the_pre_rope_q_and_k_as_they_were(tmp_path, family, fast):
    model = ropelens.load_model(str(family_model_dir(family, tmp_path / family)))
    tokens = torch.randint(0, 50, (2, 12), generator=torch.Generator().manual_seed(0))
    before = capture_qk(model, tokens, layers=[0], fast=fast)[0]
    with ropelens.ablate_planes(model, [0], layers=[0]):
        after = capture_qk(model, tokens, layers=[0], fast=fast)[0]
    rope = handle(model).spec[0]
    for which in "qk":
        # the pre-RoPE tensors are untouched, exactly
        assert torch.equal(after[f"{which}_pre"], before[f"{which}_pre"])
        post_before, post_after = (
            rope.split(before[f"{which}_post"]),
            rope.split(after[f"{which}_post"]),
        )
        assert float(post_before[..., 0, :].abs().max()) > 0  # the plane carried something
        assert torch.equal(post_after[..., 0, :], torch.zeros_like(post_after[..., 0, :]))
        torch.testing.assert_close(post_after[..., 1:, :], post_before[..., 1:, :])
    if family == "gpt_neox":
        assert type(backend_of(model)).__name__ == "BridgeBackend"  # the bridge, not a plain model
