"""The fast q/k path (HF forward with sdpa, q/k taken where the model rotates) equals the bridge
path."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import ropelens
from ropelens.backends import sdpa_capture
from ropelens.run.capture import capture_qk
from ropelens.run.intervene import ablate_planes, apply_rope_variant
from ropelens.spec.reading import rope_spec
from ropelens.spec.variants import PRoPE
from ropelens.testing.families import FAMILIES, N_CHECK, family_model_dir

EXACT = [f for f, fam in FAMILIES.items() if fam.refused is None]
SLICED = {"phi", "stablelm"}  # HF rotates a slice of the head there: the bridge path runs
SLICED |= {
    "gemma4_text"
}  # HF rotates q and k in separate one-tensor calls there: the bridge path runs
# no bridge, and the tap declines (a slice of the head; Falcon's keys repeated per query head): the
# plain HF forward's rotation and attention function run instead
DECLINED = SLICED | {"persimmon", "falcon"}
# multi-head latent attention rotates a slice after the no-position dims, the key's slice once for
# all heads
DECLINED |= {f for f, fam in FAMILIES.items() if fam.config.get("qk_rope_head_dim")}
DECLINED |= {
    "llama4"
}  # a complex product (apply_rotary_emb), which the tap does not take: the plain HF forward's


def _tokens(seed: int = 0) -> torch.Tensor:
    toks = torch.randint(4, 100, (2, N_CHECK), generator=torch.Generator().manual_seed(seed))
    toks[:, 0] = 1
    return toks


@pytest.mark.parametrize("family", EXACT)
def test_fast_path_equals_bridge(family, family_model):
    model, spec = family_model(family)
    toks = _tokens()
    taken = sdpa_capture.fast_qk(
        model, spec, toks, torch.ones_like(toks, dtype=torch.bool), spec.rotary_layers
    )
    assert (taken is None) == (family in DECLINED)
    fast = capture_qk(model, toks, which=sdpa_capture.QK_NEEDS, fast=True)
    slow = capture_qk(model, toks, which=sdpa_capture.QK_NEEDS, fast=False)
    assert sorted(fast) == sorted(slow) == spec.rotary_layers
    for L in spec.rotary_layers:
        for key in sorted(sdpa_capture.QK_NEEDS):
            a, b = fast[L][key], slow[L][key]
            assert a.shape == b.shape, (L, key)
            assert float((a - b).abs().max()) <= 1e-5 * float(b.abs().max()), (L, key)


def test_usage_takes_the_fast_path_and_matches_the_bridge(family_model, monkeypatch):
    """frequency_usage goes through the fast path batch by batch and equals usage streamed through
    the bridge."""
    from ropelens.analyses.frequency_usage import UsageReducer
    from ropelens.run.capture import batches, stream

    model, spec = family_model("llama")
    toks = _tokens(1)
    ropelens.run.verify.verify_model(
        model
    )  # the probe (cached) tries the fast path too: count the analysis alone
    taken = []
    orig = sdpa_capture.fast_qk

    def counting(*a, **k):
        out = orig(*a, **k)
        taken.append(out is not None)
        return out

    # capture_qk calls the fast path by the name its own module imported
    monkeypatch.setattr(ropelens.run.capture, "fast_qk", counting)
    fast = ropelens.analyses.frequency_usage(model, toks, progress=False, batch_size=1)
    assert taken == [True, True]
    red = UsageReducer(spec, spec.rotary_layers)
    stream(model, batches(toks, 1), [red], spec=spec, progress=False, fast=False)
    assert taken == [True, True]  # fast=False never asks
    bridge = red.result(fast.provenance)
    for which in ("q", "k"):
        torch.testing.assert_close(
            fast.norm(which, "all"), bridge.norm(which, "all"), rtol=1e-5, atol=1e-6
        )


def test_a_family_that_rotates_a_head_slice_is_tried_once(family_model, monkeypatch):
    """Phi rotates a slice of each head: the first rotation stops the forward and the verdict is
    kept."""
    model, spec = family_model("phi")
    toks = _tokens(3)
    ones = torch.ones_like(toks, dtype=torch.bool)
    assert sdpa_capture.fast_qk(model, spec, toks, ones, spec.rotary_layers) is None
    monkeypatch.setattr(
        sdpa_capture, "hf_view", lambda m: pytest.fail("a second attempt ran the model")
    )
    assert sdpa_capture.fast_qk(model, spec, toks, ones, spec.rotary_layers) is None


@pytest.mark.parametrize("family", ["llama", "phi3"])
def test_interventions_keep_the_bridge(family, family_model):
    """Under a RoPE variant or plane ablation the fast path is not taken (it would bypass them)."""
    model, spec = family_model(family)
    toks = _tokens(2)
    ones = torch.ones_like(toks, dtype=torch.bool)
    with apply_rope_variant(model, PRoPE(0.5)):
        assert sdpa_capture.fast_qk(model, spec, toks, ones, spec.rotary_layers) is None
        under = capture_qk(model, toks, which=("q_post",))
    with ablate_planes(model, [0]):
        assert sdpa_capture.fast_qk(model, spec, toks, ones, spec.rotary_layers) is None
    assert sdpa_capture.fast_qk(model, spec, toks, ones, spec.rotary_layers) is not None
    plain = capture_qk(model, toks, which=("q_post",))
    L = spec.rotary_layers[-1]
    assert not torch.allclose(under[L]["q_post"], plain[L]["q_post"])


def test_the_forward_stops_at_the_last_rotation(family_model):
    """Nothing after the last layer's rotation runs: not its MLP, not its attention output."""
    model, spec = family_model("llama")
    toks = _tokens(4)
    blocks = sdpa_capture.hf_view(model).base_model.layers
    ran: list[str] = []
    last = spec.rotary_layers[-1]
    handles = [
        blocks[i].mlp.register_forward_hook(lambda *_, i=i: ran.append(f"mlp{i}"))
        for i in range(len(blocks))
    ]
    handles.append(
        blocks[last].self_attn.o_proj.register_forward_hook(lambda *_: ran.append("o_proj"))
    )
    try:
        got = sdpa_capture.fast_qk(
            model, spec, toks, torch.ones_like(toks, dtype=torch.bool), spec.rotary_layers
        )
    finally:
        for h in handles:
            h.remove()
    assert sorted(got) == spec.rotary_layers
    assert ran == [f"mlp{i}" for i in range(last)]


def test_a_family_that_rotates_twice_per_layer_is_refused(tmp_path, monkeypatch):
    """Each rotation must come from its own layer: a second one inside a layer sends the model to
    the bridge (counting calls alone would hand layer 1's tensors out as layer 2's)."""
    from transformers.models.llama import modeling_llama

    model = ropelens.load_model(family_model_dir("llama", tmp_path / "llama"), device="cpu")
    spec = rope_spec(model)
    orig = modeling_llama.LlamaAttention.forward

    def twice(self, hidden_states, position_embeddings, *args, **kwargs):
        b, n, _ = hidden_states.shape
        q = hidden_states.new_zeros(b, self.config.num_attention_heads, n, self.head_dim)
        k = hidden_states.new_zeros(b, self.config.num_key_value_heads, n, self.head_dim)
        modeling_llama.apply_rotary_pos_emb(q, k, *position_embeddings)
        return orig(self, hidden_states, position_embeddings, *args, **kwargs)

    monkeypatch.setattr(modeling_llama.LlamaAttention, "forward", twice)
    toks = _tokens(5)
    assert (
        sdpa_capture.fast_qk(
            model, spec, toks, torch.ones_like(toks, dtype=torch.bool), spec.rotary_layers
        )
        is None
    )


def test_one_host_sync_per_batch(family_model, monkeypatch):
    """Usage and band statistics streamed on the fast path ask the device one thing per batch
    (whether it holds padding), alone or through run_windows; with padding, the token count at the
    end as well."""
    import sys

    from ropelens.analyses.band_statistics import BandStatsReducer
    from ropelens.analyses.frequency_usage import UsageReducer
    from ropelens.run.capture import batches, stream
    from ropelens.run.distributed import run_windows
    from ropelens.spec.bands import Bands

    model, spec = family_model("llama")
    toks = torch.randint(4, 100, (4, 40), generator=torch.Generator().manual_seed(6))
    reducers = [
        UsageReducer(spec, spec.rotary_layers),
        BandStatsReducer(spec, spec.rotary_layers, Bands.quantiles(2)),
    ]
    stream(
        model, batches(toks[:1], 1), reducers, spec=spec, progress=False
    )  # the first batch probes the model
    package = str(Path(ropelens.__file__).parent)
    asked: list[str] = []
    for name in ("__bool__", "__int__", "__float__", "__index__", "item", "tolist", "cpu", "numpy"):
        orig = getattr(torch.Tensor, name)

        def counted(self, *a, _orig=orig, _name=name, **k):
            caller = sys._getframe(1).f_code.co_filename
            if caller.startswith(package):  # ropelens's own code, wherever the checkout lives
                asked.append(f"{_name} at {caller.rsplit('/', 1)[-1]}:{sys._getframe(1).f_lineno}")
            return _orig(self, *a, **k)

        monkeypatch.setattr(torch.Tensor, name, counted)
    n = stream(model, batches(toks, 1), reducers, spec=spec, progress=False)
    assert len(asked) == toks.shape[0], asked
    asked.clear()
    run = run_windows(
        model, toks, reducers, batch_size=1, spec=spec, progress=False
    )  # every corpus analysis's path
    assert len(asked) == toks.shape[0], asked
    asked.clear()
    valid = torch.ones_like(toks, dtype=torch.bool)
    valid[1, 30:] = False
    n_padded = stream(model, [(toks[:2], valid[:2])], reducers, spec=spec, progress=False)
    monkeypatch.undo()
    assert len(asked) == 2, asked  # the batch's question, and the count of its real tokens
    assert n == run.n_tokens == toks.numel()
    assert n_padded == 2 * 40 - 10
