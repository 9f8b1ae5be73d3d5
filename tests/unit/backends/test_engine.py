"""Interventions on every engine: a plain HF model (no TransformerLens adapter), a bridge whose
attention rotates inside the HF module, multi-head latent attention, and a bridge that hands (cos,
sin) to its attention.

The reference is independent of ropelens's tables: HF's own implementation of the same rope type
(the same weights reloaded with ``rope_parameters`` set to it) must give the logits ropelens gives
under the variant.
"""

from __future__ import annotations

import functools
import json

import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM

import ropelens
from ropelens.backends.hf import is_plain
from ropelens.run.capture import capture_qk
from ropelens.run.intervene import ablate_planes, apply_rope_variant
from ropelens.run.verify import verify_model
from ropelens.spec.variants import Linear, YaRN
from tests.harness.sweep import save_tiny

# plain HF model; bridge rotating inside the HF module; MLA (complex product) on the plain model;
# bridge with (cos, sin)
FAMILIES = ["ministral", "gemma4_text", "deepseek_v2", "llama"]
SEQ = 24


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    @functools.cache
    def make(family: str):
        path = tmp_path_factory.mktemp(family) / family
        save_tiny(family, path)
        return path

    return make


def _tokens() -> torch.Tensor:
    return torch.randint(4, 100, (2, SEQ), generator=torch.Generator().manual_seed(0))


def _hf_with(path, **rope) -> torch.nn.Module:
    """The saved model reloaded by HF with its default rope type replaced (HF computes the tables
    itself); per layer type (Gemma 4), the layer types with default RoPE only."""
    cfg = AutoConfig.from_pretrained(path)
    text = cfg.get_text_config()
    rp = dict(text.rope_parameters)
    if any(isinstance(v, dict) for v in rp.values()):
        rp = {
            k: ({**v, **rope} if v.get("rope_type", "default") == "default" else v)
            for k, v in rp.items()
        }
    else:
        rp.update(rope)
    text.rope_parameters = rp
    return AutoModelForCausalLM.from_pretrained(
        path, config=cfg, attn_implementation="eager"
    ).eval()


@pytest.mark.parametrize("family", FAMILIES)
def test_a_variant_gives_hfs_own_logits_for_that_rope_type(saved, family):
    path = saved(family)
    model = ropelens.load_model(str(path), device="cpu")
    spec = ropelens.rope_spec(model)
    toks = _tokens()
    with torch.no_grad():
        before = model(toks)
    default = [L for L in spec.rotary_layers if spec[L].rope_type == "default"]
    l0 = int(
        json.loads((path / "config.json").read_text()).get("max_position_embeddings") or spec.n_ctx
    )
    for variant, rope in (
        (Linear(2.0), {"rope_type": "linear", "factor": 2.0}),
        (
            YaRN(4.0, l0),
            {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": l0},
        ),
    ):
        with apply_rope_variant(model, variant, layers=default) as vspec:
            assert verify_model(model, vspec, force=True).passed
            with torch.no_grad():
                ours = model(toks)
        with torch.no_grad():
            ref = _hf_with(path, **rope)(toks).logits
        err = float((ours - ref).abs().max() / ref.abs().max())
        assert err < 1e-4, (family, variant, err)
        assert float((ours - before).abs().max()) > 1e-3  # the variant changed the model's logits
    with torch.no_grad():
        assert torch.equal(
            model(toks), before
        )  # leaving the variant restores the model bit for bit


@pytest.mark.parametrize("family", FAMILIES)
def test_plane_ablation_zeroes_exactly_those_planes(saved, family):
    model = ropelens.load_model(str(saved(family)), device="cpu")
    spec = ropelens.rope_spec(model)
    L = spec.rotary_layers[0]
    toks = _tokens()
    base = capture_qk(model, toks, layers=[L], which=("q_rot", "k_rot"))[L]
    with ablate_planes(model, [0, 1], layers=[L]):
        assert verify_model(model, force=True).passed
        got = capture_qk(model, toks, layers=[L], which=("q_rot", "k_rot"))[L]
    dims = spec[L].plane_dims[:2].flatten()
    keep = torch.ones(spec[L].head_dim, dtype=torch.bool)
    keep[dims] = False
    for which in ("q_rot", "k_rot"):
        assert torch.equal(got[which][..., dims], torch.zeros_like(got[which][..., dims]))
        torch.testing.assert_close(got[which][..., keep], base[which][..., keep], rtol=0, atol=1e-6)


def test_the_bridge_forward_applies_an_engine_variant(saved):
    """A bridge whose attention rotates inside the HF module: its own forward (not only ropelens's
    captures) runs under the variant, as the HF sdpa forward does."""
    from ropelens.backends.sdpa import on_sdpa

    model = ropelens.load_model(str(saved("gemma4_text")), device="cpu")
    assert not is_plain(model)
    toks = _tokens()
    with apply_rope_variant(model, Linear(2.0)), torch.no_grad():
        bridge = model(toks)
        with on_sdpa(model) as hf:
            sdpa = hf(input_ids=toks).logits
    torch.testing.assert_close(bridge, sdpa, rtol=1e-4, atol=1e-4)


def test_the_report_runs_on_a_plain_model(saved, tmp_path):
    from ropelens.report.build import build_report

    model = ropelens.load_model(str(saved("ministral")), device="cpu")
    assert is_plain(model)
    build_report(model, out=tmp_path / "report", quick=True, progress=False)
    data = json.loads((tmp_path / "report" / "report.json").read_text())
    assert (tmp_path / "report" / "prope_sweep.csv").stat().st_size > 0
    assert "findings" in data
