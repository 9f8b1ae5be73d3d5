"""RoPE variants on the real embedded models, against HF's own rotary module built with that
scaling.

ropelens swaps each attention layer's (cos, sin) through hooks; the reference rebuilds the HF rotary
module from a config carrying the method (``rope_parameters``) and runs the HF model directly.
"""

from __future__ import annotations

import copy
import pydoc_data.topics

import pytest
import torch
from transformers import AutoModelForCausalLM

from ropelens import rope_spec
from ropelens.run.intervene import apply_rope_variant
from ropelens.spec.variants import Linear, PRoPE, YaRN

pytestmark = pytest.mark.integration


def tokens(model, n: int = 160) -> torch.Tensor:
    text = pydoc_data.topics.topics["execmodel"]
    return model.to_tokens(text)[:, :n]


def hf_logits(hf, toks: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return hf(input_ids=toks).logits


def bridge_logits(model, toks: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return model(toks)


def with_rotary(model, rope_parameters):
    """A copy of the HF model whose rotary module HF builds from ``rope_parameters``."""
    hf = copy.deepcopy(model.original_model)
    cfg = copy.deepcopy(hf.config)
    cfg.rope_parameters = rope_parameters
    cls = type(model.original_model.model.rotary_emb.original_component)
    hf.model.rotary_emb = cls(config=cfg)
    return hf


@pytest.mark.parametrize(
    ("variant", "params"),
    [
        (
            YaRN(4.0, 8192),
            {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 8192},
        ),
        (Linear(4.0), {"rope_type": "linear", "factor": 4.0}),
        (PRoPE(0.5), {"rope_type": "proportional", "partial_rotary_factor": 0.5}),
    ],
)
def test_smollm2_variant_equals_hf_rotary(smollm2, variant, params):
    toks = tokens(smollm2)
    before = bridge_logits(smollm2, toks)
    base = smollm2.original_model.config.rope_parameters
    ref = hf_logits(with_rotary(smollm2, {**base, **params}), toks)
    with apply_rope_variant(smollm2, variant):
        got = bridge_logits(smollm2, toks)
    assert (got - before).abs().max() > 1e-2  # the variant changed the model
    torch.testing.assert_close(got, ref, atol=2e-4, rtol=1e-4)
    assert torch.equal(bridge_logits(smollm2, toks), before)  # restored bit for bit


def test_gemma3_global_layers_only_equals_hf(gemma3):
    toks = tokens(gemma3)
    spec = rope_spec(gemma3)
    before = bridge_logits(gemma3, toks)
    params = copy.deepcopy(gemma3.original_model.config.rope_parameters)
    params["full_attention"] = {**params["full_attention"], "rope_type": "linear", "factor": 4.0}
    ref = hf_logits(with_rotary(gemma3, params), toks)
    with apply_rope_variant(gemma3, Linear(4.0), layer_kind="full") as new:
        got = bridge_logits(gemma3, toks)
    torch.testing.assert_close(got, ref, atol=2e-4, rtol=1e-4)
    for i in range(spec.n_layers):  # exactly the global layers changed
        changed = not torch.equal(new[i].inv_freq, spec[i].inv_freq)
        assert changed is (spec[i].kind == "full")
    with apply_rope_variant(gemma3, Linear(4.0)):
        both = bridge_logits(gemma3, toks)
    assert (both - got).abs().max() > 1e-2  # scaling the local layers too is a different model
    assert torch.equal(bridge_logits(gemma3, toks), before)


def test_smollm2_analysed_under_p_rope_is_hf_proportional(smollm2):
    """Under p-RoPE 0.75 the decomposition is HF's ``proportional`` attention, in every layer, and
    the frequency-usage result's spec shows the quarter of planes that stopped rotating."""
    from ropelens.analyses import attention_decomposition, frequency_usage

    toks = tokens(smollm2, 128)
    base = smollm2.original_model.config.rope_parameters
    cfg = copy.deepcopy(smollm2.original_model.config)
    cfg.rope_parameters = {**base, "rope_type": "proportional", "partial_rotary_factor": 0.75}
    ref = AutoModelForCausalLM.from_config(cfg, attn_implementation="eager").eval()
    weights = {  # the bridge's weights under HF's own names
        k.replace("._original_component", ""): v
        for k, v in smollm2.original_model.state_dict().items()
    }
    assert set(ref.state_dict()) <= set(weights)
    ref.load_state_dict({k: v for k, v in weights.items() if k in ref.state_dict()})
    with torch.no_grad():
        probs = ref(input_ids=toks, output_attentions=True).attentions
    with apply_rope_variant(smollm2, PRoPE(0.75)):
        dec = attention_decomposition(smollm2, toks)
        usage = frequency_usage(smollm2, toks)
    assert dec.provenance.config["verification"]["status"] == "passed"
    worst = max(float((dec.pattern(L).float() - probs[L].float()).abs().max()) for L in dec.layers)
    print(f"largest difference from HF's proportional attention: {worst:.2e}")
    assert worst < 1e-4, worst
    assert len(dec.layers) == 30
    for L in usage.layers:
        lr = usage.spec[L]
        assert lr.stopped_planes.tolist() == list(range(24, 32))  # the slowest quarter of 32
    assert usage.provenance.interventions[0]["name"] == "PRoPE(p=0.75)"
