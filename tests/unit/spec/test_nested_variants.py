"""Nested RoPE variants: the innermost runs in its layers, and the spec and every result's
provenance record that one as in force there, the outer one as shadowed."""

from __future__ import annotations

import torch

from ropelens import apply_rope_variant, rope_spec
from ropelens.analyses.band_statistics import band_statistics
from ropelens.spec.plan import describe_intervention
from ropelens.spec.variants import Linear, PRoPE


def _tokens() -> torch.Tensor:
    return torch.randint(5, 90, (2, 16), generator=torch.Generator().manual_seed(0))


def test_the_innermost_variant_is_recorded_where_it_runs(tiny):
    model = tiny("llama")  # 2 layers
    with apply_rope_variant(model, PRoPE(0.5)), apply_rope_variant(model, Linear(2.0), layers=[1]):
        spec = rope_spec(model)
        st = band_statistics(model, _tokens(), n_ctx=16, progress=False)
    outer, inner = spec.interventions
    assert (outer["name"], outer["layers"], outer["shadowed_layers"]) == ("PRoPE(p=0.5)", [0], [1])
    assert (inner["name"], inner["layers"]) == ("Linear(factor=2.0)", [1])
    assert "shadowed_layers" not in inner
    assert list(st.provenance.interventions) == list(spec.interventions)
    assert describe_intervention(outer) == (
        "PRoPE(p=0.5) in layers 0 (shadowed by an inner variant in layers 1)"
    )
    # what runs in each layer is what the records say
    assert torch.equal(spec[0].inv_freq, PRoPE(0.5).inv_freq(rope_spec(tiny("llama"))[0]))
    assert torch.equal(spec[1].inv_freq, Linear(2.0).inv_freq(rope_spec(tiny("llama"))[1]))


def test_a_variant_shadowed_in_every_layer_runs_in_none(tiny):
    model = tiny("llama")
    with apply_rope_variant(model, PRoPE(0.5)), apply_rope_variant(model, Linear(2.0)):
        outer, inner = rope_spec(model).interventions
    assert outer["layers"] == [] and outer["shadowed_layers"] == [0, 1]
    assert inner["layers"] == [0, 1]
    assert describe_intervention(outer) == (
        "PRoPE(p=0.5) in no layer (shadowed by an inner variant in layers 0-1)"
    )


def test_variants_side_by_side_shadow_nothing(tiny):
    model = tiny("llama")
    with (
        apply_rope_variant(model, PRoPE(0.5), layers=[0]),
        apply_rope_variant(model, Linear(2.0), layers=[1]),
    ):
        records = rope_spec(model).interventions
    assert [r["layers"] for r in records] == [[0], [1]]
    assert not any("shadowed_layers" in r for r in records)
