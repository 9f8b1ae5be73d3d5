"""Defects the differential harness found, each pinned by the smallest case that showed it."""

from __future__ import annotations

import math

import pytest
import torch

import ropelens
from ropelens.analyses import rotary_offsets
from ropelens.testing import tiny_model

pytestmark = pytest.mark.filterwarnings("ignore")


def test_outlier_ratio_is_undefined_where_the_other_planes_are_zero():
    """A plane's outlier ratio over the median of the head's other planes: where an ablation has
    zeroed most of them that median is 0 and the ratio is NaN, never a number of order 1e30 (nor 0
    for a zeroed plane)."""
    model = tiny_model("llama")
    tokens = torch.randint(4, 100, (2, 16), generator=torch.Generator().manual_seed(0))
    tokens[:, 0] = 1
    with ropelens.ablate_planes(model, list(range(7)), layers=[0], heads=[0]):
        offsets = rotary_offsets(model, tokens, layers=[0], progress=False)
    ratio = offsets.outlier_ratio("q")[0]  # [head, plane]
    norm = offsets.norm("q")[0]
    assert float(norm[0, :7].abs().max()) == 0 and float(norm[0, 7]) > 0
    assert bool(ratio[0].isnan().all()), ratio[0].tolist()
    # the other heads keep every plane: their ratio is each plane's norm over its others' median
    others = torch.cat([norm[1, 1:]]).sort().values[(8 - 2) // 2]
    assert math.isclose(float(ratio[1, 0]), float(norm[1, 0] / others), rel_tol=1e-5)


def test_retrieval_argmax_sees_the_interventions_in_force():
    """Retrieval scores read the model as it runs: with every plane of layer 0 ablated, a fully
    rotary head's logits there are all 0, so every query attends uniformly and its most attended
    key is the first (the earliest of a tie). The eager forward once ran without the ablation."""
    from ropelens.analyses.retrieval_heads import argmax_keys

    model = tiny_model("llama")
    tokens = torch.randint(4, 100, (20,), generator=torch.Generator().manual_seed(1))
    tokens[0] = 1
    queries = [5, 11, 19]
    before = argmax_keys(model, tokens, queries)
    with ropelens.ablate_planes(model, list(range(8)), layers=[0]):
        ablated = argmax_keys(model, tokens, queries)
    assert bool((ablated[0] == 0).all()), ablated[0].tolist()
    assert bool((before[0] != 0).any())  # the ablation is what made them 0


def test_retrieval_argmax_finds_attention_not_named_self_attn(family_dir):
    """GPT-NeoX's decoder layers hold their attention as ``attention``: the most attended keys are
    HF's own eager attention's, where retrieval scores once refused the family."""
    from transformers import AutoModelForCausalLM

    from ropelens.analyses.retrieval_heads import argmax_keys

    path = family_dir("gpt_neox")
    model = ropelens.load_model(path, device="cpu")
    hf = AutoModelForCausalLM.from_pretrained(path, attn_implementation="eager").eval()
    tokens = torch.randint(4, 100, (16,), generator=torch.Generator().manual_seed(2))
    tokens[0] = 1
    queries = [3, 9, 15]
    with torch.no_grad():
        attentions = hf(input_ids=tokens[None], output_attentions=True).attentions
    want = torch.stack([a[0][:, queries].argmax(-1) for a in attentions])
    assert torch.equal(argmax_keys(model, tokens, queries), want)


class _DynamicRotaryEmbedding(torch.nn.Module):
    """A dynamic-NTK rotary module with HF's forward signature (``x, position_ids``)."""

    rope_type = "dynamic"

    def __init__(self, fails: bool) -> None:
        super().__init__()
        self.register_buffer("inv_freq", torch.ones(4))
        self.fails = fails
        self.calls = 0

    def forward(self, x, position_ids):
        self.calls += 1
        if self.fails:
            raise RuntimeError("inv_freq is on another device")
        return x, x


class _OtherRotaryEmbedding(torch.nn.Module):
    """A dynamic rotary module whose forward takes other arguments than HF's."""

    rope_type = "dynamic"

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("inv_freq", torch.ones(4))

    def forward(self, seq_len, *, device, offset):
        raise AssertionError("never called: the signature does not fit")


def test_a_rotary_reset_that_fails_is_refused_by_name():
    """Resetting a dynamic rotary module to a fresh model's frequencies runs its forward on one
    position; an error there is refused in one line naming the module and the error (it was
    swallowed, and the block ran with whatever frequencies an earlier input had left)."""
    from ropelens.errors import UnsupportedModelError
    from ropelens.spec.rotary_state import rotary_state_kept

    model = torch.nn.Sequential(_DynamicRotaryEmbedding(fails=True))
    refusal = r"_DynamicRotaryEmbedding could not be reset.*RuntimeError: inv_freq is on"
    with pytest.raises(UnsupportedModelError, match=refusal), rotary_state_kept(model):
        pass
    working = torch.nn.Sequential(_DynamicRotaryEmbedding(fails=False))
    with rotary_state_kept(working):
        assert working[0].calls == 1  # reset once on entering
    other = torch.nn.Sequential(_OtherRotaryEmbedding())
    with rotary_state_kept(other):  # a forward of another signature is left as it is
        pass


def test_each_ablation_reads_its_own_spec():
    """The model's reading is cached under the ids of the plan steps in force: one ablation after
    another, a new step could take a freed step's id and be given the spec of the ablation before
    (its zeroed planes), which failed the rotation check of the new one now and then in a long
    run. Every ablation of many in a row reads as its own."""
    import random

    from ropelens.backends.base import handle

    model = tiny_model("llama")
    draw = random.Random(0)
    for _ in range(400):
        planes = sorted(draw.sample(range(8), draw.randint(1, 2)))
        heads = sorted(draw.sample(range(4), draw.randint(1, 3)))
        with ropelens.ablate_planes(model, planes, layers=[draw.choice([0, 1])], heads=heads):
            cached = [lr.ablated for lr in handle(model).spec.layers]
            assert cached == [lr.ablated for lr in ropelens.rope_spec(model).layers]


def test_a_hook_or_forward_made_at_a_freed_ones_address_is_verified_again():
    """The verification fingerprint named hooks and forwards by id: one removed and freed, the next
    made could take its address and read as the one verified, a stale pass. Many hooks and forwards
    made and dropped in a row, the addresses reused (checked here), each gives a fingerprint of its
    own and a verification run anew."""
    import types

    from ropelens.backends.base import fingerprint, handle
    from ropelens.run.verify import verify_model
    from ropelens.spec.reading import hf_model_of

    model = tiny_model("llama")
    spec = handle(model).spec
    bridge_attn = model.blocks[0].attn
    hf_attn = next(m for m in hf_model_of(model).modules() if type(m).__name__ == "LlamaAttention")
    plain = fingerprint(model, spec)
    seen: dict[int, str] = {}  # a hook's or forward's id -> the fingerprint it gave
    verified: dict[int, object] = {}
    reused = 0
    for i in range(60):
        hook = eval(f"lambda module, args: None  # hook {i}")  # a new function each time
        if i % 2:
            installed = bridge_attn.register_forward_pre_hook(hook)
            key, remove = id(hook), installed.remove
        else:
            forward = types.MethodType(type(hf_attn).forward, hf_attn)
            hf_attn.__dict__["forward"] = forward  # as a forward patched on the instance
            key, remove = id(forward), lambda: hf_attn.__dict__.pop("forward", None)
        got = fingerprint(model, spec)
        assert got != plain
        result = verify_model(model, spec)
        if key in seen:  # the address of a freed one: not read as it
            reused += 1
            assert got != seen[key]
            assert result is not verified[key]
        seen[key], verified[key] = got, result
        remove()
        del hook
        if i % 2 == 0:
            del forward
        assert fingerprint(model, spec) == plain
    assert reused > 0  # the addresses were reused, so the check above ran
