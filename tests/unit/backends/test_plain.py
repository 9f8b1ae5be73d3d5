"""The plain HF model (no TransformerLens bridge): the bridge's numbers, HF's own numbers, one-line
refusals.

A Llama loaded both ways must give the same spec, usage and band statistics; families
TransformerLens cannot wrap load as a :class:`ropelens.backends.hf.PlainModel` and match HF's dense
reference (``test_families.py`` runs the full matrix on them); everything that needs the bridge's
hooks is refused in one line naming the architecture.
"""

from __future__ import annotations

import importlib

import pytest
import torch
from transformers import AutoModelForCausalLM

import ropelens
from ropelens import Bands
from ropelens.backends.hf import BridgeOnlyError, PlainModel, is_plain
from ropelens.errors import UnsupportedModelError
from ropelens.run.capture import capture_qk
from ropelens.run.verify import verify_model
from ropelens.spec.reading import rope_spec
from ropelens.testing.families import FAMILIES, N_CHECK

PLAIN = [f for f, fam in FAMILIES.items() if not fam.bridge and fam.refused is None]


@pytest.fixture(scope="module")
def llama_both(family_dir):
    """The family matrix's Llama loaded through the bridge and as the plain HF model, from one
    directory."""
    path = family_dir("llama")
    return ropelens.load_model(path, device="cpu"), ropelens.load_model(
        path, device="cpu", bridge=False
    )


def _tokens(seed: int = 1) -> torch.Tensor:
    toks = torch.randint(4, 100, (2, N_CHECK), generator=torch.Generator().manual_seed(seed))
    toks[:, 0] = 1
    return toks


def test_plain_llama_reads_and_measures_as_the_bridge(llama_both):
    """Same spec, logits, frequency usage and band statistics through the bridge and on the plain HF
    model."""
    bridge, plain = llama_both
    assert not is_plain(bridge) and is_plain(plain)
    assert (
        plain.cfg.model_name == bridge.cfg.model_name
        and plain.cfg.model_path == bridge.cfg.model_path
    )
    assert rope_spec(plain).to_json() == rope_spec(bridge).to_json()
    assert verify_model(plain).passed
    toks = _tokens()
    # float32 forwards of the same weights (sdpa on the plain model, eager in the bridge): ~1e-6
    # apart
    torch.testing.assert_close(plain(toks), bridge(toks), rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(plain.to_tokens("The cat sat."), bridge.to_tokens("The cat sat."))
    u_p = ropelens.analyses.frequency_usage(plain, toks, progress=False, n_sink=0)
    u_b = ropelens.analyses.frequency_usage(bridge, toks, progress=False, n_sink=0)
    # both read q and k from the same HF forward (the fast path): float64 sums of the same float32
    # numbers
    torch.testing.assert_close(u_p.q_norm, u_b.q_norm, rtol=1e-6, atol=1e-7)
    torch.testing.assert_close(u_p.k_norm, u_b.k_norm, rtol=1e-6, atol=1e-7)
    s_p = ropelens.analyses.band_statistics(
        plain, toks, bands=Bands.quantiles(2), progress=False
    ).to_frame()
    s_b = ropelens.analyses.band_statistics(
        bridge, toks, bands=Bands.quantiles(2), progress=False
    ).to_frame()
    num = [c for c in s_b.columns if s_b[c].dtype.kind == "f"]
    assert num and s_p[num].to_numpy().shape == s_b[num].to_numpy().shape
    # float32 scores summed in float64: equal to ~1e-6 relative
    torch.testing.assert_close(
        torch.tensor(s_p[num].to_numpy()),
        torch.tensor(s_b[num].to_numpy()),
        rtol=1e-5,
        atol=1e-6,
        equal_nan=True,
    )


def test_plain_patterns_are_the_bridges(llama_both):
    """attention_decomposition (q, k and the pattern, from the plain forward's attention function)
    equals the bridge's."""
    bridge, plain = llama_both
    toks = _tokens(2)[:1]
    d_p, d_b = (
        ropelens.analyses.attention_decomposition(m, toks, bands=Bands.quantiles(2))
        for m in (plain, bridge)
    )
    for L in rope_spec(bridge).rotary_layers:
        ok = torch.isfinite(d_b.logits(L))
        torch.testing.assert_close(d_p.logits(L)[ok], d_b.logits(L)[ok], rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(d_p.pattern(L), d_b.pattern(L), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("family", PLAIN)
def test_families_without_an_adapter_load_as_the_plain_model(family, family_dir):
    """TransformerLens cannot wrap them: load_model returns the plain HF model, which passes the
    probe."""
    model = ropelens.load_model(family_dir(family), device="cpu")
    assert isinstance(model, PlainModel)
    assert verify_model(model).passed
    assert not hasattr(model, "blocks") and not hasattr(model, "hook_dict")


def test_falcon_keys_are_its_kv_heads(family_dir):
    """Falcon broadcasts each group's key to its query heads; ropelens keeps one key per KV head,
    and query head h reads group h // group size, as HF's own broadcast does."""
    model = ropelens.load_model(family_dir("falcon"), device="cpu")
    hf = AutoModelForCausalLM.from_pretrained(
        family_dir("falcon"), attn_implementation="eager"
    ).eval()
    mod = importlib.import_module(type(hf).__module__)
    orig, seen = mod.apply_rotary_pos_emb, []

    def keep(q, k, *a, **kw):
        out = orig(q, k, *a, **kw)
        seen.append(out[1])
        return out

    mod.apply_rotary_pos_emb = keep
    toks = _tokens(3)[:1]
    try:
        with torch.no_grad():
            hf(toks)
    finally:
        mod.apply_rotary_pos_emb = orig
    spec = rope_spec(model)
    assert {lr.n_kv_heads for lr in spec.layers} == {2} and {
        lr.group_size for lr in spec.layers
    } == {2}
    acts = capture_qk(model, toks, which=("k_post",), fast=False)
    for L, theirs in enumerate(
        seen
    ):  # [b, 4 heads, pos, d]: heads 0, 1 hold group 0's key, 2, 3 group 1's
        ours = acts[L]["k_post"].transpose(1, 2)  # [b, 2 KV heads, pos, d]
        torch.testing.assert_close(ours.repeat_interleave(2, dim=1), theirs, rtol=0, atol=0)


def _one_line(err: pytest.ExceptionInfo, arch: str) -> str:
    msg = str(err.value)
    assert "\n" not in msg and msg.startswith(f"{arch}: "), msg
    assert "TransformerLens" in msg and "What works" in msg
    return msg


def test_transformerlens_hook_points_are_refused_in_one_line(family_dir):
    """A plain model runs every ropelens intervention on the engine
    (tests/unit/backends/test_engine.py); only TransformerLens's own surface (hook points,
    run_with_cache) needs the bridge: one line naming the architecture."""
    from ropelens.run.intervene import apply_rope_variant
    from ropelens.spec.variants import PRoPE

    model = ropelens.load_model(family_dir("ministral"), device="cpu")
    with pytest.raises(BridgeOnlyError) as err:
        model.run_with_cache(_tokens())
    assert "no adapter" in _one_line(err, "MinistralForCausalLM")
    assert not hasattr(model, "hook_dict")
    with apply_rope_variant(model, PRoPE(0.5)):
        assert getattr(model, "_ropelens_interventions", 0) == 1
    assert not getattr(model, "_ropelens_interventions", 0)  # leaving it leaves no mark behind


def test_refusals_name_what_cannot_be_measured(family_dir):
    """DiffLlama (two softmax maps subtracted) is refused by rope_spec (MiniCPM3's latent attention
    is measured: tests/unit/spec/test_mla.py)."""
    for family, why in (("diffllama", "differential attention"),):
        model = ropelens.load_model(family_dir(family), device="cpu")
        with pytest.raises(UnsupportedModelError, match=why):
            rope_spec(model)
        with pytest.raises(UnsupportedModelError, match=why):
            ropelens.analyses.frequency_usage(model, _tokens(), progress=False)


def _sink_attention(fn_module: str, sinks: torch.Tensor):
    """Run ``fn_module``'s eager attention on random q/k/v (4 heads over 2 KV heads, causal):
    module, value, output."""
    from types import SimpleNamespace

    fn = importlib.import_module(f"transformers.models.{fn_module}").eager_attention_forward
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, h, 6, 8, generator=g) * 2 for h in (4, 2, 2))
    mask = torch.full((6, 6), float("-inf")).triu(1)[None, None]
    module = SimpleNamespace(sinks=sinks, num_key_value_groups=2, training=False)
    return module, q, k, v, mask, fn(module, q, k, v, mask, scaling=0.5)


def test_sinks_applied_after_the_softmax_are_in_the_mixed_weights():
    """Granite SWA returns the softmax without its sinks and scales the output by sigmoid(lse −
    sink); the weights its values see are the softmax with one extra logit per head, written out
    here (as gpt-oss returns them)."""
    from ropelens.backends.hf import mixed_weights

    sinks = torch.tensor([-1.0, 0.5, 2.0, 4.0])
    module, q, k, v, mask, out = _sink_attention("granite_swa.modeling_granite_swa", sinks)
    scores = q @ k.repeat_interleave(2, 1).transpose(-1, -2) * 0.5 + mask
    logits = torch.cat([scores, sinks.view(1, 4, 1, 1).expand(1, 4, 6, 1)], -1)
    want = torch.softmax(logits.double(), -1)[..., :-1].float()
    assert (
        float((out[1] - want).abs().max()) > 0.1
    )  # HF's returned probabilities leave the sinks out
    # float32 softmax and matmul: the measured per-query scale is exact to ~1e-7 relative
    assert float((mixed_weights(module, v, out) - want).abs().max()) < 1e-5
    _, _, _, v2, _, gpt_oss = _sink_attention("gpt_oss.modeling_gpt_oss", sinks)
    assert torch.equal(
        mixed_weights(module, v2, gpt_oss), gpt_oss[1]
    )  # gpt-oss's probabilities hold the sinks
    other = (
        out[0] + 0.3 * torch.randn(out[0].shape),
        out[1],
    )  # an output no per-query multiple of the mix
    assert torch.equal(mixed_weights(module, v, other), out[1])
