"""Sparse attention: the keys an indexer picks for each query from the input (DeepSeek's top-k,
Qwen4-Exp's blocks).

The references are HF's own eager attention probabilities of tiny random models of the sweep
(index_topk 8, inputs of 24 tokens, so most queries lose keys). The selection is read from the mask
the model hands its attention function; the indexer's own rotation (the other pairing, on its own
small q and k) is not the layer's.
"""

from __future__ import annotations

import dataclasses
import functools

import pytest
import torch
from transformers import AutoModelForCausalLM

import ropelens
from ropelens.analyses.band_statistics import BandStatsReducer
from ropelens.errors import UnsupportedModelError
from ropelens.run.capture import stream
from ropelens.run.verify import verify_model
from ropelens.spec.bands import Bands
from ropelens.spec.reading import rope_spec
from ropelens.spec.rope import RopeSpec
from ropelens.testing.families import N_CHECK
from tests.harness.sweep import save_tiny

# DeepSeek V3.2 (half-split indexer rotation, interleaved attention rotation), GLM-5 (interleaved
# indexer), HunYuan V4 (layers reusing an earlier layer's selection: indexer_types "shared")
DSA = ["deepseek_v32", "glm_moe_dsa", "hy_v4"]
TOPK = 8  # the sweep's tiny index_topk


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    @functools.cache
    def make(name: str):
        path = save_tiny(name, tmp_path_factory.mktemp(name) / name)
        hf = AutoModelForCausalLM.from_pretrained(
            path, attn_implementation="eager", dtype=torch.float32
        ).eval()
        return ropelens.load_model(path, device="cpu"), hf

    return make


def _tokens(n: int = N_CHECK, seed: int = 5) -> torch.Tensor:
    toks = torch.randint(4, 100, (2, n), generator=torch.Generator().manual_seed(seed))
    toks[:, 0] = 1
    return toks


def _hf_probs(hf, toks: torch.Tensor) -> tuple[torch.Tensor, ...]:
    with torch.no_grad():
        return hf(toks, output_attentions=True).attentions


@pytest.mark.parametrize("family", DSA)
def test_sparse_attention_is_exact(family, tiny):
    model, hf = tiny(family)
    spec = rope_spec(model)
    assert [lr.select_keys for lr in spec.layers] == [TOPK] * len(spec.layers)
    v = verify_model(model, spec)
    assert v.passed and v.errors["mask"] == 0 and v.errors["probs"] < 1e-5, v.errors
    toks = _tokens()
    dec = ropelens.analyses.attention_decomposition(model, toks, bands=Bands.all())
    probs = _hf_probs(hf, toks)
    causal = torch.ones(N_CHECK, N_CHECK).tril().bool()
    for L in spec.rotary_layers:
        ref = probs[L]
        mask = dec.mask(L)
        # the selection is real: queries past the top-k keep exactly TOPK keys, and HF gives the
        # others nothing
        assert (mask.sum(-1) == (torch.arange(N_CHECK) + 1).clamp(max=TOPK)).all()
        assert float(ref.masked_select(~mask[:, None].expand_as(ref)).abs().max()) == 0.0
        # float32: the same scores through the same softmax, a few ulps of probabilities ≤ 1
        assert float((dec.rebuilt_pattern(L) - ref).abs().max()) < 1e-5
        assert torch.allclose(dec.pattern(L), ref, atol=1e-6)
        # without the selection (the causal mask alone) the pattern is far off: the check above has
        # teeth
        scores = dec.band_logits(L, masked=False).sum(2)
        causal_only = dec.acts[L].rope.probs(scores.masked_fill(~causal[None, None], float("-inf")))
        assert float((causal_only - ref).abs().max()) > 0.05


@pytest.mark.parametrize("family", ["deepseek_v32", "glm_moe_dsa"])
def test_short_windows_lose_no_key(family, tiny):
    """On windows of at most index_topk tokens the indexer keeps every causal key: the static mask
    is exact."""
    model, hf = tiny(family)
    toks = _tokens(TOPK)
    dec = ropelens.analyses.attention_decomposition(model, toks)
    probs = _hf_probs(hf, toks)
    for L in dec.layers:
        assert "selected" not in dec.acts[L].tensors  # not needed, so not captured
        assert torch.equal(dec.mask(L), torch.ones(2, TOPK, TOPK).tril().bool())
        assert float((dec.rebuilt_pattern(L) - probs[L]).abs().max()) < 1e-5


def test_static_mask_analyses_refuse_long_windows(tiny):
    model, _ = tiny("deepseek_v32")
    spec = rope_spec(model)
    red = BandStatsReducer(spec, spec.rotary_layers, Bands.all())
    with pytest.raises(
        UnsupportedModelError, match=r"at most 8 keys per query.*band statistics.*at most 8 tokens"
    ):
        stream(model, [_tokens()], [red], spec=spec, progress=False)
    # within index_topk the causal mask is the model's: band statistics run
    assert (
        stream(
            model,
            [_tokens(TOPK)],
            [BandStatsReducer(spec, spec.rotary_layers, Bands.all())],
            spec=spec,
            progress=False,
        )
        == 2 * TOPK
    )


def _with_select(spec: RopeSpec, k: int | None) -> RopeSpec:
    return dataclasses.replace(
        spec,
        layers=tuple(
            dataclasses.replace(lr, select_keys=k) if lr.attention else lr for lr in spec.layers
        ),
    )


@pytest.mark.parametrize("k", [None, TOPK - 1, TOPK + 1])
def test_probe_catches_a_wrong_selection(k, tiny):
    """A layer read as plain causal, or keeping another number of keys, fails the probe's mask
    check."""
    model, _ = tiny("deepseek_v32")
    with pytest.raises(UnsupportedModelError, match="fails the mask check"):
        verify_model(model, _with_select(rope_spec(model), k), force=True)


def test_the_indexer_rotation_is_not_the_layer_rotation(tiny):
    """DeepSeek V3.2's attention rotates interleaved pairs and its indexer half-split ones, after
    it: the spec follows the attention (read from the call it makes), and the captured pre-RoPE q is
    the attention's."""
    model, hf = tiny("deepseek_v32")
    spec = rope_spec(model)
    lr = spec.layers[0]
    assert lr.pre_interleaved and lr.shared_rotary_key
    cfg = hf.config
    assert (lr.rotary_offset, lr.rotary_dim) == (cfg.qk_nope_head_dim, cfg.qk_rope_head_dim)
    assert lr.n_heads == cfg.num_attention_heads  # the indexer's index_n_heads never enter the spec


def test_real_deepseek_v32_shapes():
    """DeepSeek V3.2's real attention and indexer shapes (DeepseekV32Config defaults: 128 heads of
    128 + 64 dims, an indexer of 64 heads × 128 dims keeping 2,048 keys), in one layer with a narrow
    residual stream."""
    from transformers import DeepseekV32Config

    from ropelens.loading.models import wrap_hf_model
    from ropelens.testing import tiny_tokenizer

    d = DeepseekV32Config()
    assert (d.num_attention_heads, d.qk_rope_head_dim, d.qk_nope_head_dim, d.index_topk) == (
        128,
        64,
        128,
        2048,
    )
    cfg = DeepseekV32Config(
        vocab_size=101,
        hidden_size=64,
        intermediate_size=64,
        moe_intermediate_size=16,
        num_hidden_layers=1,
        first_k_dense_replace=1,
        n_routed_experts=4,
        num_experts_per_tok=2,
        n_group=1,
        topk_group=1,
        q_lora_rank=32,
        kv_lora_rank=32,
        v_head_dim=8,
        layer_types=["indexed_attention"],
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=3,
    )
    torch.manual_seed(0)
    hf = AutoModelForCausalLM.from_config(cfg, attn_implementation="eager").eval()
    model = wrap_hf_model(hf, tiny_tokenizer(), device="cpu", label="dsv32")
    lr = rope_spec(model)[0]
    assert (lr.n_heads, lr.head_dim, lr.rotary_dim, lr.rotary_offset, lr.select_keys) == (
        128,
        192,
        64,
        128,
        2048,
    )
    assert lr.pre_interleaved and lr.shared_rotary_key
    assert not lr.selects(2048) and lr.selects(2049)  # every causal key kept up to 2,048 tokens
    v = verify_model(model)
    assert (
        v.passed and v.errors["mask"] == 0
    )  # the probe's window is shorter than 2,048: the causal mask exactly


def test_block_selection_is_exact(tiny):
    """Qwen4-Exp's QSA keeps whole blocks of 2 keys up to a budget of 8, plus an incomplete block's
    tail: a query allowed at most 9 keys keeps them all (select_keys 9), and longer rows keep 8 plus
    their tail."""
    model, hf = tiny("qwen4_exp_text")
    spec = rope_spec(model)
    assert [lr.kind for lr in spec.layers] == ["linear", "linear", "linear", "full"]
    lr = spec.layers[3]
    assert lr.select_keys == 9 and not lr.selects(9) and lr.selects(10)
    toks = _tokens()
    dec = ropelens.analyses.attention_decomposition(model, toks)
    ref = next(
        a for a in _hf_probs(hf, toks) if a is not None
    )  # HF returns the attention layers' only
    allowed = torch.arange(N_CHECK) + 1
    want = torch.where(allowed <= 9, allowed, 8 + allowed % 2)  # the block rule, counted by hand
    assert torch.equal(dec.mask(3)[0].sum(-1), want) and torch.equal(dec.mask(3)[1].sum(-1), want)
    assert float((dec.rebuilt_pattern(3) - ref).abs().max()) < 1e-5
    scores = dec.band_logits(3, masked=False).sum(2)
    causal = torch.ones(N_CHECK, N_CHECK).tril().bool()
    assert (
        float((lr.probs(scores.masked_fill(~causal[None, None], float("-inf"))) - ref).abs().max())
        > 0.05
    )
    with pytest.raises(
        UnsupportedModelError, match="fails the mask check"
    ):  # one key too many or too few
        verify_model(model, _with_select(spec, 8), force=True)


def test_inspect_shows_the_keys_kept(tiny):
    from ropelens.catalog.rope_spec import inspect_table

    model, _ = tiny("deepseek_v32")
    table = inspect_table(rope_spec(model))
    assert "keys kept            at most 8 per query, picked by an indexer" in table
    assert "rotary slice" in table and "key shared by all heads" in table


def test_the_spec_reads_the_forward_once(tiny, monkeypatch):
    """Which rotation the attention calls, and which layers rotate, come from one short forward
    cached on the model: reading the spec again (every analysis does) runs no forward."""
    import ropelens.spec.reading as reading

    model, _ = tiny("deepseek_v32")
    first = rope_spec(model)

    def no_forward(_module):
        raise AssertionError("a second short forward of the model")

    monkeypatch.setattr(reading, "_hf_tree", no_forward)
    assert rope_spec(model).to_json() == first.to_json()
