"""A bfloat16 model's rotation is read as its float32 twin's: the pairing and direction its own
forward shows, not the defaults, although its rotated q is rounded to 8 bits of mantissa."""

from __future__ import annotations

import importlib

import pytest
import torch
from transformers import AutoModelForCausalLM

import ropelens
from ropelens.testing.families import FAMILIES


def _rotary_readings(model) -> list[tuple[str, int]]:
    spec = ropelens.rope_spec(model)
    return [(layer.pairing, layer.direction) for layer in spec.layers if layer.inv_freq.numel()]


# Helium pairs adjacent dims, NanoChat turns the other way, Llama 4 multiplies adjacent pairs as
# complex numbers: each is read from the model's own forward
@pytest.mark.parametrize("family", ["helium", "nanochat", "llama4"])
def test_bfloat16_reads_the_pairing_and_direction_of_float32(family, family_dir):
    path = family_dir(family)
    full = _rotary_readings(ropelens.load_model(path, device="cpu"))
    half = _rotary_readings(ropelens.load_model(path, device="cpu", dtype=torch.bfloat16))
    assert half == full
    assert {pairing for pairing, _ in half} == {FAMILIES[family].pairing}


@pytest.mark.parametrize("family", ["helium", "nanochat"])
def test_bfloat16_reading_rotates_as_the_hf_rotation(family, family_dir):
    """The bfloat16 model's layer 0 turns a random q as HF's own ``apply_rotary_pos_emb`` does
    with the float32 model's (cos, sin) tables."""
    path = family_dir(family)
    layer = ropelens.rope_spec(ropelens.load_model(path, device="cpu", dtype=torch.bfloat16))
    layer = layer.layers[0]
    hf = AutoModelForCausalLM.from_pretrained(path)
    module = importlib.import_module(type(hf).__module__)
    q = torch.randn(1, 4, 7, layer.head_dim, generator=torch.Generator().manual_seed(0))
    positions = torch.arange(7)[None]
    cos, sin = hf.model.rotary_emb(q, positions)
    want, _ = module.apply_rotary_pos_emb(q, q, cos, sin)
    got = layer.rotate(q, torch.arange(7))
    assert float((got - want).abs().max()) <= 1e-5 * float(want.abs().max())
