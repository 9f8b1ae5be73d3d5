"""A plane ablation acts at the rotation on every family: the pre-RoPE q and k ropelens captures
are the model's own under it, and only the rotated q and k lose the plane. Where the bridge's
attention fires no hook after its rotation (GPT-NeoX, Phi-3) the plane is zeroed before RoPE, which
removes the same term from the scores; the pre-RoPE q and k are read before that zeroing."""

from __future__ import annotations

import pytest
import torch

import ropelens
from ropelens.analyses.massive_values import massive_values, replace_massive
from ropelens.backends.base import backend_of, handle
from ropelens.backends.bridge_hooks import attn_hooks
from ropelens.backends.bridge_interventions import PRE_ROPE_ABLATION
from ropelens.run.capture import capture_qk
from ropelens.testing.families import family_model_dir

NO_HOOK_AFTER_ROTATION = ("gpt_neox", "phi3")


def _model(family, tmp_path):
    return ropelens.load_model(str(family_model_dir(family, tmp_path / family)))


def _tokens():
    return torch.randint(0, 50, (2, 12), generator=torch.Generator().manual_seed(0))


@pytest.mark.parametrize("family", ["gpt_neox", "phi3", "llama", "phi"])
@pytest.mark.parametrize("fast", [False, True])
def test_an_ablation_leaves_the_pre_rope_q_and_k_as_they_were(tmp_path, family, fast):
    model = _model(family, tmp_path)
    tokens = _tokens()
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
    if family in NO_HOOK_AFTER_ROTATION:
        assert type(backend_of(model)).__name__ == "BridgeBackend"  # the bridge, not a plain model
        hooks = attn_hooks(model, 0)
        assert hooks.post("q") is None and hooks.post("k") is None


@pytest.mark.parametrize("family", NO_HOOK_AFTER_ROTATION)
def test_nested_ablations_zero_both_and_leave_nothing_behind(tmp_path, family):
    """Two ablations in force at one pre-RoPE hook point: the rotated q and k lose both planes, the
    pre-RoPE ones neither; leaving each context takes its planes back, and the last leaves the
    hook point as it was."""
    model = _model(family, tmp_path)
    tokens = _tokens()
    before = capture_qk(model, tokens, layers=[0])[0]
    rope = handle(model).spec[0]
    point = model.hook_dict[attn_hooks(model, 0).pre("q")]
    hooks_before = len(point._forward_hooks)
    with ropelens.ablate_planes(model, [0], layers=[0]):
        with ropelens.ablate_planes(model, [1], layers=[0]):
            both = capture_qk(model, tokens, layers=[0])[0]
        one = capture_qk(model, tokens, layers=[0])[0]
    after = capture_qk(model, tokens, layers=[0])[0]
    for which in "qk":
        assert torch.equal(both[f"{which}_pre"], before[f"{which}_pre"])
        planes, whole = rope.split(both[f"{which}_post"]), rope.split(before[f"{which}_post"])
        assert not planes[..., :2, :].any() and whole[..., :2, :].abs().max() > 0
        torch.testing.assert_close(planes[..., 2:, :], whole[..., 2:, :])
        planes = rope.split(one[f"{which}_post"])
        assert not planes[..., 0, :].any() and planes[..., 1, :].abs().max() > 0
        assert torch.equal(after[f"{which}_post"], before[f"{which}_post"])
    assert not hasattr(point, PRE_ROPE_ABLATION) and len(point._forward_hooks) == hooks_before


@pytest.mark.parametrize("family", NO_HOOK_AFTER_ROTATION)
def test_the_pre_rope_q_and_k_under_an_ablation_keep_a_replacement(tmp_path, family):
    """A massive-value replacement writes the pre-RoPE q and k, an ablation inside it zeroes a
    plane at the rotation: the pre-RoPE q and k read are the replaced ones and the rotated ones
    lose the plane. (The other order is refused: the replacement's values were measured on the
    model without the ablation.)"""
    model = _model(family, tmp_path)
    tokens = _tokens()
    mv = massive_values(model, tokens, progress=False, factor=1.3)  # a low factor: several dims
    with replace_massive(model, mv, layers=[0]):
        replaced = capture_qk(model, tokens, layers=[0])[0]
    original = capture_qk(model, tokens, layers=[0])[0]
    assert not torch.equal(replaced["q_pre"], original["q_pre"])  # the replacement wrote q
    rope = handle(model).spec[0]
    with replace_massive(model, mv, layers=[0]), ropelens.ablate_planes(model, [0], layers=[0]):
        both = capture_qk(model, tokens, layers=[0])[0]
    for which in "qk":
        assert torch.equal(both[f"{which}_pre"], replaced[f"{which}_pre"])
        planes, want = rope.split(both[f"{which}_post"]), rope.split(replaced[f"{which}_post"])
        assert not planes[..., 0, :].any()
        torch.testing.assert_close(planes[..., 1:, :], want[..., 1:, :])
