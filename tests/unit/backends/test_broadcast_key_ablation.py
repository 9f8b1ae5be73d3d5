"""Plane ablation on Falcon, whose fused qkv hands the rotation each KV head's key once per query
head: ablating every query head of a KV head zeroes that KV head's key, as a plain-torch edit of
HF's own forward does."""

from __future__ import annotations

import importlib

import torch
from transformers import AutoModelForCausalLM

import ropelens
from ropelens.run.evaluate import window_losses


def test_ablating_a_whole_kv_head_on_falcon_matches_hf(family_dir):
    path = family_dir("falcon")
    model = ropelens.load_model(path, device="cpu")
    hf = AutoModelForCausalLM.from_pretrained(path, attn_implementation="eager").eval()
    tokens = torch.randint(4, 100, (2, 24), generator=torch.Generator().manual_seed(0))
    tokens[:, 0] = 1
    # plane 0 of half-split 16-dim heads is dims (0, 8); query heads 0 and 1 share KV head 0
    with ropelens.ablate_planes(model, [0], layers=[0], heads=[0, 1]):
        got = window_losses(model, tokens, progress=False)

    module = importlib.import_module(type(hf).__module__)
    rotate = module.apply_rotary_pos_emb
    calls = [0]

    def ablated(q, k, cos, sin, *args, **kwargs):
        q, k = rotate(q, k, cos, sin, *args, **kwargs)
        calls[0] += 1
        if calls[0] == 1:  # layer 0: q heads 0, 1 and their key copies lose dims 0 and 8
            q, k = q.clone(), k.clone()
            q[:, :2, :, [0, 8]] = 0
            k[:, :2, :, [0, 8]] = 0
        return q, k

    module.apply_rotary_pos_emb = ablated
    try:
        with torch.no_grad():
            logits = hf(input_ids=tokens).logits
    finally:
        module.apply_rotary_pos_emb = rotate
    want = torch.nn.functional.cross_entropy(
        logits[:, :-1].transpose(1, 2), tokens[:, 1:], reduction="none"
    ).mean(-1)
    assert calls[0] == 4  # one rotation in each of the 4 layers
    assert torch.allclose(got.double(), want.double(), atol=1e-5, rtol=0)
