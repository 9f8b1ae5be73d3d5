"""Analyses of a model under a RoPE variant or a plane ablation describe the model as it runs.

The reference for a variant is HF's own implementation of it: the same weights loaded into a model
whose config names the HF rope type (``proportional`` for p-RoPE, ``linear``, ``dynamic``,
``yarn``, ``llama3``), run with eager attention; its attention probabilities must equal the
pattern ropelens decomposes under :func:`apply_rope_variant` (and on a copy from
:func:`with_rope_variant`). The planes a variant stops are checked one by one: their terms must be
the unrotated product of HF's own pre-RoPE query and key dims ``(i, i + d/2)``, which a wrong plane
pairing or a wrong choice of stopped planes breaks even where the summed logits agree.
"""

from __future__ import annotations

import functools
import importlib
import math

import pytest
import torch
from transformers import AutoModelForCausalLM

import ropelens
from ropelens.analyses import attention_decomposition, band_statistics, frequency_usage
from ropelens.run.intervene import ablate_planes, apply_rope_variant, with_rope_variant
from ropelens.run.verify import verification
from ropelens.spec.plan import describe_intervention
from ropelens.spec.reading import rope_spec, unmodified_spec
from ropelens.spec.variants import DynamicNTK, Linear, Llama3, PRoPE, YaRN, kept_planes
from ropelens.testing import tiny_tokenizer
from ropelens.testing.families import VOCAB, family_hf_model

N = 30  # tokens per row
ATOL = 2e-5  # float32 probabilities
ORIGINAL = 16  # the trained context the length-dependent variants scale from (< N)

# (HF rope parameters, the ropelens variant that claims to be the same)
HF_TYPES = {
    "proportional": ({"rope_type": "proportional", "partial_rotary_factor": 0.75}, PRoPE(0.75)),
    "linear": ({"rope_type": "linear", "factor": 2.0}, Linear(2.0)),
    "dynamic": (
        {"rope_type": "dynamic", "factor": 3.0, "max_position_embeddings": ORIGINAL},
        DynamicNTK(3.0, ORIGINAL),
    ),
    "yarn": (
        {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": ORIGINAL},
        YaRN(4.0, ORIGINAL),
    ),
    "llama3": (
        {
            "rope_type": "llama3",
            "factor": 4.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": ORIGINAL,
        },
        Llama3(4.0, 1.0, 4.0, ORIGINAL),
    ),
}
FAMILIES = ("llama", "qwen2", "gemma2")  # GQA; biases on q/k; soft-cap with a sliding window


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """A family's sharpened tiny model saved with a tokenizer: (path, HF model, tokens)."""
    cache = {}

    def load(family: str):
        if family not in cache:
            path = tmp_path_factory.mktemp(family) / family
            hf = family_hf_model(family)
            with torch.no_grad():  # sharper still: every layer's rows far from uniform
                for name, p in hf.named_parameters():
                    if name.endswith(("q_proj.weight", "k_proj.weight", "q_proj.bias")):
                        p.mul_(2.0)
            hf.save_pretrained(path)
            tiny_tokenizer().save_pretrained(path)
            toks = torch.randint(4, VOCAB, (2, N), generator=torch.Generator().manual_seed(3))
            toks[:, 0] = 1
            cache[family] = (path, hf, toks)
        return cache[family]

    return load


def hf_reference(hf, rope_parameters: dict):
    """The same weights in a model whose config asks HF for ``rope_parameters`` (HF's dynamic NTK
    scales from the config's ``max_position_embeddings``)."""
    cfg = hf.config.__class__.from_dict(hf.config.to_dict())
    rope_parameters = dict(rope_parameters)
    if "max_position_embeddings" in rope_parameters:
        cfg.max_position_embeddings = rope_parameters.pop("max_position_embeddings")
    cfg.rope_parameters = {**cfg.rope_parameters, **rope_parameters}
    ref = AutoModelForCausalLM.from_config(cfg, attn_implementation="eager").eval()
    ref.load_state_dict(hf.state_dict())
    return ref


def hf_run(ref, toks):
    """HF's attention probabilities per layer and its pre-RoPE q and k ``[batch, head, pos, d]``."""
    pre = []

    def tapped(rotate, q, k, *args, **kwargs):
        pre.append((q.detach().clone(), k.detach().clone()))
        return rotate(q, k, *args, **kwargs)

    return hf_attention(ref, toks, tapped), pre


def hf_attention(ref, toks, wrap) -> list[torch.Tensor]:
    """HF's attention probabilities per layer with its ``apply_rotary_pos_emb`` replaced by
    ``wrap(rotate, q, k, ...)``."""
    mod = importlib.import_module(type(ref).__module__)
    rotate = mod.apply_rotary_pos_emb
    mod.apply_rotary_pos_emb = functools.partial(wrap, rotate)
    try:
        with torch.no_grad():
            return [p.float() for p in ref(toks, output_attentions=True).attentions]
    finally:
        mod.apply_rotary_pos_emb = rotate


def far_from_uniform(probs) -> float:
    """Mean total-variation distance of the causal rows from uniform."""
    p = probs[..., 1:, :]
    n = torch.arange(2, p.shape[-2] + 2, dtype=p.dtype)[:, None]
    uniform = (torch.arange(p.shape[-1])[None, :] < n).to(p.dtype) / n
    return float(0.5 * (p - uniform).abs().sum(-1).mean())


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("rope_type", sorted(HF_TYPES))
def test_decomposition_under_a_variant_is_hf_own_rope_type(saved, family, rope_type):
    path, hf, toks = saved(family)
    params, variant = HF_TYPES[rope_type]
    probs, pre = hf_run(hf_reference(hf, params), toks)
    model = ropelens.load_model(path, device="cpu")
    built = unmodified_spec(model)
    with apply_rope_variant(model, variant) as yielded:
        spec = rope_spec(model, length=N)
        dec = attention_decomposition(model, toks)  # verified against the model as it runs
    assert rope_spec(model).interventions == ()  # the context leaves the model as it was
    assert spec.interventions[0]["variant"] == variant.to_dict()
    assert dec.provenance.interventions == list(rope_spec_records(yielded, variant))
    assert dec.provenance.config["verification"]["status"] == "passed"
    for L in dec.layers:
        assert far_from_uniform(probs[L]) > 0.25
        torch.testing.assert_close(dec.pattern(L).float(), probs[L], atol=ATOL, rtol=0)
        lr = spec[L]
        assert lr.rope_type == variant.rope_type
        if rope_type != "proportional":
            continue
        stopped = lr.stopped_planes.tolist()
        assert stopped == list(range(kept_planes(0.75, lr.n_planes), lr.n_planes))
        assert torch.count_nonzero(built[L].inv_freq) == built[L].n_planes
        # each stopped plane's term is HF's unrotated pre-RoPE product on dims (i, i + d/2)
        q, k = pre[L]
        group = q.shape[1] // k.shape[1]
        k = k.repeat_interleave(group, dim=1)
        half = lr.head_dim // 2
        terms = dec.plane_logits(L)
        scale = lr.score_scale
        for i in stopped:
            dims = [i, i + half]
            want = scale * q[..., dims].double() @ k[..., dims].double().transpose(-1, -2)
            got = terms[:, :, i].double()
            causal = torch.ones(N, N, dtype=torch.bool).tril()
            torch.testing.assert_close(got[..., causal], want[..., causal], atol=1e-4, rtol=1e-4)


def rope_spec_records(spec, variant):
    layers = [lr.layer for lr in spec.layers if lr.rope_type == variant.rope_type]
    yield {
        "intervention": "rope variant",
        "variant": variant.to_dict(),
        "name": variant.name,
        "layers": layers,
    }


def test_a_copy_with_a_variant_reads_and_measures_as_the_context(saved):
    path, _, toks = saved("llama")
    model = ropelens.load_model(path, device="cpu")
    with apply_rope_variant(model, PRoPE(0.5), layers=[1]):
        inside = attention_decomposition(model, toks)
        said = verification(model, rope_spec(model)).describe()
    assert said.startswith("verified under PRoPE(p=0.5) in layers 1 on a 32-token probe")
    copy = with_rope_variant(model, PRoPE(0.5), layers=[1])
    spec = rope_spec(copy)
    assert spec[1].stopped_planes.tolist() == list(range(kept_planes(0.5, spec[1].n_planes), 8))
    assert spec[0].stopped_planes.tolist() == []  # layer 0 rotates as built
    assert rope_spec(model).interventions == ()  # the original is untouched
    on_copy = attention_decomposition(copy, toks)
    assert on_copy.provenance.interventions == inside.provenance.interventions
    for L in (0, 1):
        torch.testing.assert_close(on_copy.pattern(L), inside.pattern(L), atol=0, rtol=0)


def _zeroed_after_rotation(head: int, dims: list[int]):
    """HF's rotation with ``dims`` of query head ``head`` zeroed after it."""

    def zeroed(rotate, q, k, *args, **kwargs):
        q, k = rotate(q, k, *args, **kwargs)
        q = q.clone()
        q[:, head, :, dims] = 0.0
        return q, k

    return zeroed


def test_ablated_planes_are_read_per_head_and_measured_as_hf_with_those_dims_zeroed(saved):
    path, hf, toks = saved("llama")  # GQA: query heads 0 and 1 share a key head
    model = ropelens.load_model(path, device="cpu")
    with ablate_planes(model, [0, 3], heads=[1]):
        spec = rope_spec(model)
        dec = attention_decomposition(model, toks)
        usage = frequency_usage(model, toks, verify=False)
    lr = spec[0]
    assert lr.ablated[1] == (0, 3) and all(not p for h, p in enumerate(lr.ablated) if h != 1)
    assert lr.ablated_planes == [0, 3]
    record = spec.interventions[0]
    assert record["intervention"] == "plane ablation"
    assert [(z["layer"], z["heads"], z["planes"]) for z in record["zeroed"]] == [
        (layer, [1], [0, 3]) for layer in range(spec.n_layers)
    ]
    assert describe_intervention(record).startswith(
        "planes zeroed (layer 0 heads 1 planes 0,3; layer 1 heads 1 planes 0,3; "
    )
    assert usage.provenance.interventions == [record]  # named also when unverified
    half = lr.head_dim // 2
    probs = hf_attention(hf, toks, _zeroed_after_rotation(1, [0, 3, half, half + 3]))
    for L in dec.layers:
        torch.testing.assert_close(dec.pattern(L).float(), probs[L].float(), atol=ATOL, rtol=0)
        terms = dec.plane_logits(L)
        assert torch.count_nonzero(terms[:, 1, [0, 3]]) == 0
        assert torch.count_nonzero(terms[:, 0, [0, 3]]) > 0


def test_usage_under_p_rope_records_the_stopped_planes_and_survives_a_round_trip(saved, tmp_path):
    path, _, toks = saved("gemma2")
    model = ropelens.load_model(path, device="cpu")
    with apply_rope_variant(model, PRoPE(0.75)):
        usage = frequency_usage(model, toks)
        stats = band_statistics(model, toks, verify=False)
    for result in (usage, stats):
        assert result.provenance.interventions[0]["name"] == "PRoPE(p=0.75)"
        for L in result.layers:
            lr = result.spec[L]
            assert lr.stopped_planes.tolist() == list(range(kept_planes(0.75, lr.n_planes), 8))
            assert math.isinf(float(lr.wavelength[-1]))
    usage.save(tmp_path / "usage.json")
    back = type(usage).load(tmp_path / "usage.json")
    assert back.spec.interventions == usage.spec.interventions
    assert back.provenance.interventions == usage.provenance.interventions
    assert torch.equal(back.spec[0].inv_freq, usage.spec[0].inv_freq)
    described = usage.provenance.config["verification"]
    assert described["interventions"][0]["variant"] == {"variant": "PRoPE", "p": 0.75}


def test_nested_interventions_are_all_in_the_spec(saved):
    path, _, _ = saved("llama")
    model = ropelens.load_model(path, device="cpu")
    with apply_rope_variant(model, PRoPE(0.5)), ablate_planes(model, [1], layers=[0]):
        spec = rope_spec(model)
    assert [r["intervention"] for r in spec.interventions] == ["rope variant", "plane ablation"]
    assert spec[0].ablated_planes == [1] and spec[1].ablated_planes == []
    assert spec[0].stopped_planes.tolist() == [4, 5, 6, 7]
    after = rope_spec(model)
    assert after.interventions == () and all(not lr.ablated for lr in after.layers)
    assert torch.equal(after[1].inv_freq, unmodified_spec(model)[1].inv_freq)


def test_band_location_refuses_its_nope_test_under_a_variant_and_says_why(saved):
    from ropelens.analyses import band_location
    from ropelens.errors import UnsupportedModelError

    path, _, toks = saved("llama")
    model = ropelens.load_model(path, device="cpu")
    with apply_rope_variant(model, PRoPE(0.75)), pytest.raises(UnsupportedModelError) as err:
        band_location(model, toks)
    assert "runs under PRoPE(p=0.75) in layers 0-3" in str(err.value)
    assert "intervene=False" in str(err.value)


def test_one_ablation_per_batch_row_is_recorded_as_such(saved):
    from ropelens.analyses.knockout import knocked_out_rows

    path, _, _ = saved("llama")
    model = ropelens.load_model(path, device="cpu")
    with knocked_out_rows(model, [{}, {(1, 2): [0, 1]}, {(1, 2): [1]}]):
        spec = rope_spec(model)
    record = spec.interventions[0]
    assert record["per_row"] is True
    assert record["zeroed"] == [{"layer": 1, "heads": [2], "planes": [0, 1]}]
    assert describe_intervention(record).startswith("planes zeroed in some batch rows (layer 1")
    assert spec[1].ablated_planes == []  # no plane is zeroed in every row
