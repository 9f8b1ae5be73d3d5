"""A model loaded in 16 bits rotates as HF's ``from_pretrained`` runs the checkpoint, on every load
path, and an identity RoPE variant leaves its logits as they were.

HF builds and loads every rotary module's ``inv_freq`` in float32 whatever the weights' dtype: a
load that cast them too would rotate by frequencies rounded to 8 bits (another model than the
checkpoint), and a variant recomputing them in float32 would change the logits of a model that holds
them rounded (one cast whole with ``.to``).
"""

from __future__ import annotations

import pytest
import torch

from ropelens import apply_rope_variant, load_model, rope_spec
from ropelens.backends.hf import is_plain
from ropelens.spec.variants import Default, Linear, PRoPE
from ropelens.testing import tiny_model_dir

HALF = [torch.bfloat16, torch.float16]
IDENTITIES = [PRoPE(1.0), Linear(1.0), Default()]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return tiny_model_dir("llama", tmp_path_factory.mktemp("tiny-llama"))


def _tokens() -> torch.Tensor:
    return torch.randint(5, 90, (2, 24), generator=torch.Generator().manual_seed(0))


def _hf_of(model) -> torch.nn.Module:
    return getattr(model, "original_model", model)


def _rotary(hf) -> torch.nn.Module:
    return hf.model.rotary_emb


def _logits(model, tokens: torch.Tensor) -> torch.Tensor:
    """The model's own forward: a plain model's ``model(tokens)`` runs sdpa attention (equal to
    eager in exact arithmetic only), ``model(input_ids=...)`` the HF model as loaded."""
    with torch.no_grad():
        out = model(input_ids=tokens) if is_plain(model) else model(tokens)
    return getattr(out, "logits", out).float()


def _relative(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).abs().max() / b.abs().max())


@pytest.mark.parametrize("bridge", [True, False])
@pytest.mark.parametrize("device_map", [None, "cpu"])
@pytest.mark.parametrize("dtype", [*HALF, "bfloat16", "float16"])
def test_load_model_rotates_as_hf_from_pretrained(model_dir, dtype, device_map, bridge):
    from transformers import AutoModelForCausalLM

    placed = {} if device_map is None else {"device_map": device_map}
    hf = AutoModelForCausalLM.from_pretrained(
        model_dir, dtype=dtype, attn_implementation="eager", **placed
    ).eval()
    model = load_model(model_dir, dtype=dtype, bridge=bridge, **placed)
    ours, theirs = _rotary(_hf_of(model)), _rotary(hf)
    for name in ("inv_freq", "original_inv_freq"):
        got, want = getattr(ours, name), getattr(theirs, name)
        assert got.dtype == want.dtype == torch.float32, name
        assert torch.equal(got, want), name
    assert next(_hf_of(model).parameters()).dtype == next(hf.parameters()).dtype
    tokens = _tokens()
    assert torch.equal(_logits(model, tokens), _logits(hf, tokens))
    torch.testing.assert_close(rope_spec(model)[0].inv_freq, theirs.inv_freq, rtol=0, atol=0)


@pytest.mark.parametrize("variant", IDENTITIES, ids=lambda v: v.name)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("bridge", [True, False])
def test_an_identity_variant_leaves_the_logits_alone(model_dir, dtype, bridge, variant):
    model = load_model(model_dir, dtype=dtype, bridge=bridge)
    tokens = _tokens()
    before = _logits(model, tokens)
    with apply_rope_variant(model, variant):
        under = _logits(model, tokens)
    assert _relative(under, before) <= 1e-6


@pytest.mark.parametrize("variant", IDENTITIES, ids=lambda v: v.name)
@pytest.mark.parametrize("bridge", [True, False])
def test_a_model_cast_whole_is_read_as_it_runs(model_dir, bridge, variant):
    """``.to(torch.bfloat16)`` rounds the frequencies too: ropelens reads those, and an identity
    variant turns the planes by them."""
    model = load_model(model_dir, bridge=bridge)
    _hf_of(model).to(torch.bfloat16)
    held = _rotary(_hf_of(model)).inv_freq
    assert held.dtype == torch.bfloat16
    assert torch.equal(rope_spec(model)[0].inv_freq, held.float())
    tokens = _tokens()
    before = _logits(model, tokens)
    with apply_rope_variant(model, variant):
        under = _logits(model, tokens)
    assert _relative(under, before) <= 1e-6
