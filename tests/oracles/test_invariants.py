"""Metamorphic invariants of the public functions: what must hold whatever the numbers are.

- a result does not depend on earlier calls (the same call on a fresh model, after other
  analyses and interventions in shuffled orders, gives the same numbers);
- batched equals one by one (a ragged batch gives each text what it gives alone);
- the merge of two halves equals the whole;
- a layer subset equals the full run's slice;
- an intervention undone leaves the model bit-identical (every parameter, buffer and rotary
  attribute).
"""

from __future__ import annotations

import functools
import random

import pytest
import torch

import ropelens
from ropelens.analyses import attention_decomposition, band_statistics, frequency_usage
from ropelens.spec.variants import NoPE, PRoPE

pytestmark = pytest.mark.filterwarnings("ignore")

FAMILIES = ("llama", "phi", "gemma3_text", "gpt_oss", "cohere")
TEXTS = [
    "The cat sat on the mat.",
    "A river runs through the old town, past the mill.",
    "Seven.",
]


@pytest.fixture(scope="module")
def loaded(family_dir):
    @functools.cache
    def load(family: str):
        return ropelens.load_model(family_dir(family), device="cpu")

    return load


def _tokens(n: int = 4, length: int = 24) -> torch.Tensor:
    tokens = torch.randint(4, 100, (n, length), generator=torch.Generator().manual_seed(1))
    tokens[:, 0] = 1
    return tokens


def _state(model) -> dict[str, object]:
    """Every tensor of the model and every plain attribute of its rotary modules, copied."""
    hf = getattr(model, "original_model", model)
    out: dict[str, object] = {
        f"tensor/{k}": v.detach().clone() for k, v in hf.state_dict(keep_vars=True).items()
    }
    for name, buf in hf.named_buffers():
        out[f"buffer/{name}"] = buf.detach().clone()
    for name, module in hf.named_modules():
        if "rotary" in type(module).__name__.lower():
            for attr, value in vars(module).items():
                if isinstance(value, int | float | str | bool | type(None)):
                    out[f"attr/{name}.{attr}"] = value
    return out


def _same_state(a: dict[str, object], b: dict[str, object]) -> None:
    assert a.keys() == b.keys()
    for key in a:
        x, y = a[key], b[key]
        if isinstance(x, torch.Tensor):
            assert x.dtype == y.dtype and torch.equal(x, y), f"{key} changed"
        else:
            assert x == y, f"{key} changed: {x!r} -> {y!r}"


def _usage_numbers(usage) -> torch.Tensor:
    return torch.cat([usage.q_norm.flatten(), usage.k_norm.flatten()])


@pytest.mark.parametrize("family", FAMILIES)
def test_interventions_undone_leave_the_model_bit_identical(loaded, family):
    model = loaded(family)
    before = _state(model)
    tokens = _tokens(2)
    with ropelens.apply_rope_variant(model, PRoPE(0.5)):
        frequency_usage(model, tokens, progress=False)
    _same_state(before, _state(model))
    with ropelens.ablate_planes(model, [0, 1]):
        attention_decomposition(model, tokens)
    _same_state(before, _state(model))
    with ropelens.apply_rope_variant(model, NoPE()), ropelens.ablate_planes(model, [0]):
        band_statistics(model, tokens, progress=False)
    _same_state(before, _state(model))


@pytest.mark.parametrize("family", FAMILIES)
def test_results_do_not_depend_on_earlier_calls(loaded, family_dir, family):
    tokens = _tokens(2)
    fresh = ropelens.load_model(family_dir(family), device="cpu")
    want = _usage_numbers(frequency_usage(fresh, tokens, progress=False))
    model = loaded(family)
    calls = [
        lambda: ropelens.rope_spec(model, length=40),
        lambda: ropelens.rope_spec(model, length=300),
        lambda: attention_decomposition(model, tokens[:1]),
        lambda: ropelens.capture_qk(model, tokens[:1]),
        lambda: band_statistics(model, tokens, progress=False),
    ]
    random.Random(family).shuffle(calls)
    for call in calls:
        call()
        got = _usage_numbers(frequency_usage(model, tokens, progress=False))
        torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-7, equal_nan=True)


@pytest.mark.parametrize("family", FAMILIES)
def test_a_ragged_batch_gives_each_text_what_it_gives_alone(loaded, family):
    model = loaded(family)
    together = attention_decomposition(model, TEXTS)
    for row, text in enumerate(TEXTS):
        alone = attention_decomposition(model, text)
        n = alone.tokens.shape[1]
        for layer in alone.layers:
            a = alone.band_logits(layer)[0, ..., :n, :n]
            b = together.band_logits(layer)[row, ..., :n, :n]
            keep = alone.mask(layer)[0][None, None]
            torch.testing.assert_close(
                b.masked_fill(~keep, 0), a.masked_fill(~keep, 0), rtol=1e-4, atol=1e-5
            )
            torch.testing.assert_close(
                together.pattern(layer)[row, :, :n, :n], alone.pattern(layer)[0], atol=1e-5, rtol=0
            )


@pytest.mark.parametrize("family", FAMILIES)
def test_the_merge_of_two_halves_equals_the_whole(loaded, family):
    model = loaded(family)
    tokens = _tokens(4)
    whole = frequency_usage(model, tokens, progress=False)
    halves = frequency_usage(model, tokens[:2], progress=False).merge(
        frequency_usage(model, tokens[2:], progress=False)
    )
    torch.testing.assert_close(_usage_numbers(halves), _usage_numbers(whole), equal_nan=True)
    stats = band_statistics(model, tokens, progress=False)
    merged = band_statistics(model, tokens[:2], progress=False).merge(
        band_statistics(model, tokens[2:], progress=False)
    )
    torch.testing.assert_close(merged.abs_share(), stats.abs_share(), equal_nan=True)
    torch.testing.assert_close(merged.margin_share(), stats.margin_share(), equal_nan=True)


@pytest.mark.parametrize("family", FAMILIES)
def test_a_layer_subset_equals_the_full_runs_slice(loaded, family):
    model = loaded(family)
    tokens = _tokens(2)
    full = frequency_usage(model, tokens, progress=False)
    stats = band_statistics(model, tokens, progress=False)
    for subset in ([full.layers[-1]], list(full.layers[::2])):
        slots = [full.layers.index(L) for L in subset]
        part = frequency_usage(model, tokens, layers=subset, progress=False)
        torch.testing.assert_close(part.q_norm, full.q_norm[slots], equal_nan=True)
        torch.testing.assert_close(part.k_norm, full.k_norm[slots], equal_nan=True)
        part_stats = band_statistics(model, tokens, layers=subset, progress=False)
        torch.testing.assert_close(part_stats.abs_share(), stats.abs_share()[slots], equal_nan=True)
