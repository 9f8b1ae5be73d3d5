"""Rotary offsets on a model whose config names no trained context length: a model whose every
rotary layer attends within a window needs none, any other is asked for ``train_ctx`` by name."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

import ropelens
from ropelens.analyses import rotary_offsets
from ropelens.analyses.rotary_offsets import partial_cycle_planes
from ropelens.errors import InputError


def test_windowed_model_without_a_context_length_reads_its_window(family_dir):
    """RecurrentGemma's config has no ``max_position_embeddings``; its attention layers see 8 keys,
    so a plane is partial-cycle where θ_i · 8 < 2π, θ_i = 10000^(−2i/8) over its 8 rotary dims."""
    model = ropelens.load_model(family_dir("recurrent_gemma"), device="cpu")
    tokens = torch.randint(4, 100, (2, 24), generator=torch.Generator().manual_seed(0))
    offsets = rotary_offsets(model, tokens, progress=False)
    theta = 10000.0 ** (-2 * torch.arange(4, dtype=torch.float64) / 8)
    assert offsets.train_ctx == 8
    for row in offsets.partial_cycle:
        assert row.tolist() == (theta * 8 < 2 * math.pi).tolist()


def test_full_attention_without_a_context_length_asks_for_train_ctx(family_dir):
    spec = ropelens.rope_spec(ropelens.load_model(family_dir("llama"), device="cpu"))
    unknown = dataclasses.replace(spec, n_ctx=0)
    with pytest.raises(InputError, match=r"max_position_embeddings.*pass train_ctx"):
        partial_cycle_planes(unknown)
    assert partial_cycle_planes(unknown, train_ctx=256).equal(partial_cycle_planes(spec))
