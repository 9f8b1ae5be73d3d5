"""Llama 4's text model: chunked rotary layers measured exactly, NoPE layers with a query
temperature listed.

The tiny model comes from :mod:`ropelens.testing.families` (``attention_chunk_size`` 8, layers 0-2
chunked and rotary, layer 3 a NoPE full-attention layer with ``attn_temperature_tuning``). The
reference is HF's own eager attention, run on a separately loaded copy of the model.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
import transformers
from transformers import AutoModelForCausalLM

import ropelens
from ropelens.backends.hf import PlainModel
from ropelens.errors import UnsupportedModelError
from ropelens.run.verify import verify_model
from ropelens.spec.bands import Bands
from ropelens.spec.reading import CHUNKED_WHY, rope_spec
from ropelens.testing import spread_weights, tiny_tokenizer
from ropelens.testing.families import FAMILIES
from tests.harness.families import hf_scores, probs_by_layer

pytestmark = pytest.mark.skipif(
    not hasattr(transformers, "Llama4TextConfig"), reason="transformers has no Llama 4"
)

CHUNK = 8
N = 3 * CHUNK + 5  # longer than two chunks, the last one partial


def _save(dest, **config):
    """The llama4 family's tiny model with ``config`` overriding its config, saved with the tiny
    tokenizer."""
    cfg = transformers.Llama4TextConfig(**dict(FAMILIES["llama4"].config, **config))
    with torch.random.fork_rng():
        torch.manual_seed(0)
        hf = AutoModelForCausalLM.from_config(cfg, attn_implementation="eager")
    spread_weights(hf, 0)
    hf.save_pretrained(dest)
    tiny_tokenizer().save_pretrained(dest)
    return dest


@pytest.fixture(scope="module")
def llama4(tmp_path_factory):
    """(ropelens's model, its spec, HF's own eager model) of the tiny Llama 4."""
    path = _save(tmp_path_factory.mktemp("llama4") / "l4")
    model = ropelens.load_model(path, device="cpu")
    hf = AutoModelForCausalLM.from_pretrained(path, attn_implementation="eager").eval()
    return model, rope_spec(model), hf


def _tokens(n: int = N) -> torch.Tensor:
    toks = torch.randint(4, 100, (2, n), generator=torch.Generator().manual_seed(5))
    toks[:, 0] = 1
    return toks


def test_reading(llama4):
    """Chunked rotary layers with the config's chunk, adjacent pairs (the complex product), the L2
    norm after RoPE; the NoPE layer keeps its temperature, read from its attention module; the plain
    HF model, saying why."""
    model, spec, hf = llama4
    assert isinstance(model, PlainModel) and model.cfg.why == CHUNKED_WHY
    assert spec.kinds == {"chunked": [0, 1, 2], "nope": [3]}
    for L in (0, 1, 2):
        lr = spec[L]
        assert (lr.chunk, lr.window, lr.pairing, lr.norm_after_rope, lr.query_scale) == (
            CHUNK,
            None,
            "adjacent",
            True,
            None,
        )
    attn = hf.model.layers[3].self_attn
    assert (attn.attn_scale, attn.floor_scale) == (0.1, 8192)
    assert spec[3].query_scale == "1 + 0.1·ln(1 + ⌊(m + 1)/8192⌋) (attn_temperature_tuning)"
    assert spec.summary().set_index("kind")["chunk"].to_dict()["chunked"] == CHUNK


def test_mask_is_hf_chunked_mask():
    """LayerRope.mask with a chunk is HF's chunked_causal_mask_function (no padding), entry by
    entry."""
    from transformers.masking_utils import chunked_causal_mask_function

    from ropelens.spec.rope import LayerRope

    for chunk, n in ((1, 5), (3, 11), (8, 29), (8, 8)):
        lr = LayerRope(
            layer=0,
            inv_freq=torch.ones(2),
            head_dim=4,
            rotary_dim=4,
            pairing="half",
            n_heads=1,
            n_kv_heads=1,
            score_scale=1.0,
            kind="chunked",
            chunk=chunk,
        )
        fn = chunked_causal_mask_function(chunk, torch.zeros(1, dtype=torch.long))
        want = torch.tensor(
            [[bool(fn(0, 0, torch.tensor(q), torch.tensor(k))) for k in range(n)] for q in range(n)]
        )
        assert torch.equal(lr.mask(n), want), (chunk, n)


def test_decomposition_and_pattern_match_hf_over_three_chunks(llama4):
    """On 29 tokens (three chunks and a part), the summed band logits are HF's scores where HF's
    mask lets a key in, ropelens masks exactly the keys HF's chunked mask drops, and the rebuilt and
    band-only patterns are HF's."""
    model, spec, hf = llama4
    toks = _tokens()
    with torch.no_grad(), hf_scores(hf) as scores:
        probs = probs_by_layer(hf(toks, output_attentions=True).attentions, spec)
    dec = ropelens.analyses.attention_decomposition(
        model, toks, bands=Bands.quantiles(2), layers=[0, 1, 2]
    )
    allowed = spec[0].mask(N)
    assert (
        not allowed[CHUNK, CHUNK - 1] and allowed[CHUNK, CHUNK]
    )  # the input spans chunk boundaries
    for L in (0, 1, 2):
        ours = dec.band_logits(L).sum(2)  # [batch, head, q, k]
        # HF's attention: nothing beyond the chunk (its probabilities are 0 there), and ropelens
        # masks the same keys
        assert (probs[L][..., ~allowed] == 0).all()
        assert (
            torch.isneginf(dec.logits(L)[..., ~allowed]).all()
            and torch.isfinite(dec.logits(L)[..., allowed]).all()
        )
        ref = scores[L][..., allowed]
        # float32 q·k of O(10) values summed in another order: ~1e-6 relative; a wrong plane or
        # scale is O(1)
        assert float((ours[..., allowed] - ref).abs().max() / ref.abs().max()) < 1e-5
        # probabilities in [0, 1] from float32 softmaxes of the same scores: ~1e-7; a wrong mask
        # moves them by O(0.1)
        assert float((dec.rebuilt_pattern(L) - probs[L]).abs().max()) < 1e-5
    one = ropelens.analyses.attention_decomposition(model, toks, bands=Bands.all(), layers=[0])
    assert float((one.band_patterns(0)[:, :, 0] - probs[0]).abs().max()) < 1e-5


def test_frequency_usage_over_chunks_and_band_statistics_within_one(llama4):
    """Frequency usage runs on windows longer than a chunk; band statistics, which build masks from
    positions, run on one chunk (where the mask is causal) and refuse longer windows in one line
    naming the layer and chunk."""
    model, spec, _ = llama4
    toks = _tokens()
    usage = ropelens.analyses.frequency_usage(model, toks, progress=False, n_sink=0)
    assert list(usage.layers) == [0, 1, 2] and torch.isfinite(usage.q_norm).all()
    st = ropelens.analyses.band_statistics(model, toks[:, :CHUNK], progress=False)
    assert list(st.layers) == [0, 1, 2]
    with pytest.raises(
        UnsupportedModelError,
        match=rf"layer 0 attends in chunks of {CHUNK} tokens .* {N}-token windows: "
        rf"use windows of at most {CHUNK} tokens",
    ) as err:
        ropelens.analyses.band_statistics(model, toks, progress=False)
    assert "\n" not in str(err.value)


def test_probe_passes_over_two_chunks(llama4):
    model, spec, _ = llama4
    v = verify_model(model, spec)
    assert v.passed and v.n_tokens >= 2 * CHUNK + 8 and v.errors["mask"] == 0.0
    assert v.errors["scores"] < 1e-4 and v.errors["probs"] < 1e-4 and v.errors["rotation"] < 1e-4


@pytest.mark.parametrize("chunk", [None, 4, 16])
def test_probe_refuses_a_wrong_chunk(llama4, chunk):
    """A spec without the chunk, or with another one, fails the probe's mask check on layer 0."""
    model, spec, _ = llama4
    wrong = dataclasses.replace(
        spec,
        layers=tuple(
            dataclasses.replace(lr, chunk=chunk) if lr.chunk else lr for lr in spec.layers
        ),
    )
    with pytest.raises(
        UnsupportedModelError, match=r"layer 0 fails the mask check \(the mask the model built\)"
    ):
        verify_model(model, wrong, force=True)


def test_chunks_longer_than_the_probe_are_checked_at_their_edge(tmp_path):
    """A 300-token chunk (longer than the probe) is checked against HF's chunked mask function at
    its edge; a spec whose chunk is one token short fails there."""
    model = ropelens.load_model(_save(tmp_path / "long", attention_chunk_size=300), device="cpu")
    spec = rope_spec(model)
    v = verify_model(model, spec)
    assert v.errors["chunk edge"] == 0.0 and any("chunked" in u for u in v.unchecked)
    wrong = dataclasses.replace(
        spec,
        layers=tuple(dataclasses.replace(lr, chunk=299) if lr.chunk else lr for lr in spec.layers),
    )
    with pytest.raises(
        UnsupportedModelError,
        match=r"layer 0 fails the chunk edge check .*spec chunk 299, "
        r"config attention_chunk_size 300",
    ):
        verify_model(model, wrong, force=True)


def test_nope_layers_with_a_query_temperature(llama4, tmp_path):
    """Listed as NoPE layers, left out of every default selection and refused in one line when
    named; without attn_temperature_tuning they are plain NoPE layers that may be named."""
    _, spec, _ = llama4
    assert spec.layer_indices(None, rotary_only=False) == [0, 1, 2]
    with pytest.raises(
        UnsupportedModelError,
        match=r"layer 3 is a NoPE layer that scales each query .*attn_temperature_tuning",
    ) as err:
        spec.layer_indices([3], rotary_only=False)
    assert "\n" not in str(err.value)
    plain = rope_spec(
        ropelens.load_model(_save(tmp_path / "cold", attn_temperature_tuning=False), device="cpu")
    )
    assert plain[3].kind == "nope" and plain[3].query_scale is None
    assert plain.layer_indices([3], rotary_only=False) == [3]


def test_spec_round_trips(llama4):
    _, spec, _ = llama4
    back = type(spec).from_dict(__import__("json").loads(spec.to_json()))
    assert [(lr.chunk, lr.query_scale, lr.kind) for lr in back.layers] == [
        (lr.chunk, lr.query_scale, lr.kind) for lr in spec.layers
    ]
