"""The verification probe: passes on every family of the matrix, and catches every deliberately
broken reading.

Each break is made either in the spec ropelens reads (``rope_spec`` patched: what a misreading looks
like) or in the model (its HF code patched: what a family ropelens was not taught looks like). Each
fails with UnsupportedModelError naming the layer and the check with the probe on, and runs, marked
unverified, with ``verify=False``.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import json
import sys

import pytest
import torch
import transformers.models.llama.modeling_llama as llama_mod

import ropelens
import ropelens.spec.reading as reading
from ropelens.errors import UnsupportedModelError
from ropelens.loading.models import wrap_hf_model
from ropelens.run.intervene import ablate_planes, apply_rope_variant
from ropelens.run.verify import PROBE_CTX, fingerprint, verification, verify_model
from ropelens.spec.variants import PRoPE
from ropelens.testing import tiny_model, tiny_tokenizer
from ropelens.testing.families import FAMILIES, family_hf_model

EXACT = [f for f, fam in FAMILIES.items() if fam.refused is None]
TOKS = torch.randint(4, 100, (1, 24), generator=torch.Generator().manual_seed(0))


@functools.cache
def _family(name: str):
    hf = family_hf_model(name)
    hf.config.architectures = [type(hf).__name__]  # the bridge picks its adapter by this name
    return wrap_hf_model(hf, tiny_tokenizer(), device="cpu", label=f"family-{name}")


def _fresh(name: str):
    """A new model (its verification cache empty) of a matrix family."""
    _family.cache_clear()
    return _family(name)


@pytest.mark.parametrize("family", EXACT)
def test_probe_passes_on_every_family(family):
    v = verify_model(_family(family))
    assert v.passed
    if (
        family == "falcon"
    ):  # it scores inline, with no attention function to read: probabilities only
        assert set(v.errors) >= {"rotation", "probs"} and any(
            "q/k, scale and scores" in u for u in v.unchecked
        )
    else:
        assert set(v.errors) >= {"rotation", "qk", "scale", "scores", "mask", "probs"}
    # float32: captured and model tensors come from the same ops; see verify._tolerance
    assert all(v.errors[k] <= v.tolerance[k] for k in v.errors)
    assert v.n_tokens >= PROBE_CTX and all(
        v.n_tokens > w for w in FAMILIES[family].windows.values()
    )
    assert set(v.paths) == {
        "bridge" if FAMILIES[family].bridge else "plain HF forward",
        "fast q/k path",
    }


@pytest.mark.parametrize("family", ["llama-gqa", "gemma3", "gptj"])
def test_probe_passes_on_the_tiny_models(family):
    v = verify_model(tiny_model(family))
    assert v.passed and v.errors["rotation"] < 1e-5 and v.errors["probs"] < 1e-5
    if family == "gptj":
        hf = tiny_model(family).original_model
        if hasattr(
            importlib.import_module(type(hf).__module__), "eager_attention_forward"
        ):  # transformers ≥ 5.24
            assert "qk" in v.errors and not v.unchecked
        else:  # GPT-J calls no eager_attention_forward: probabilities only, and it says so
            assert "qk" not in v.errors and v.unchecked


def test_verification_is_cached_and_redone_when_the_model_changes(monkeypatch):
    model = tiny_model("llama")
    spec = ropelens.rope_spec(model)
    first = verify_model(model, spec)
    assert verify_model(model, spec) is first  # the probe ran once
    key = fingerprint(model, spec)
    with apply_rope_variant(model, PRoPE(0.5)):
        assert fingerprint(model, spec) != key  # under a variant the model is verified again
    assert fingerprint(model, spec) == key
    monkeypatch.setattr(
        llama_mod, "eager_attention_forward", _biased(llama_mod.eager_attention_forward)
    )
    assert fingerprint(model, spec) != key
    with pytest.raises(UnsupportedModelError, match="probs check"):
        verify_model(model, spec)


def test_an_intervention_is_verified_against_the_bridge():
    """Plane ablation lives on the bridge: decomposing under it verifies against the bridge's own
    attention."""
    model = tiny_model("llama-gqa")
    with ablate_planes(model, [0]):
        dec = ropelens.analyses.attention_decomposition(model, TOKS)
    v = dec.provenance.config["verification"]
    assert v["status"] == "passed" and "bridge" in v["reference"]


# ---------------------------------------------------------------------------------------- breaks
def _caught(model, match: str) -> None:
    """The break fails every analysis with the probe on; with verify=False they run, marked
    unverified."""
    with pytest.raises(UnsupportedModelError, match=match) as err:
        ropelens.analyses.band_statistics(model, TOKS, progress=False)
    assert "verify=False" in str(err.value) and "\n" not in str(err.value)
    with pytest.raises(UnsupportedModelError, match=match):
        ropelens.analyses.attention_decomposition(model, TOKS)
    st = ropelens.analyses.band_statistics(model, TOKS, progress=False, verify=False)
    assert st.provenance.config["verification"]["status"] == "unverified"
    usage = ropelens.analyses.frequency_usage(model, TOKS, progress=False, verify=False)
    assert usage.provenance.config["verification"]["status"] == "unverified"
    dec = ropelens.analyses.attention_decomposition(model, TOKS, verify=False)
    assert dec.provenance.config["verification"]["status"] == "unverified"


def _spec_patch(monkeypatch, **change) -> None:
    """ropelens reads every layer with ``change`` applied (a misreading of the model)."""
    orig = reading.rope_spec

    def wrong(model, **reading_options):
        s = orig(model, **reading_options)
        layers = tuple(
            dataclasses.replace(lr, **{k: (v(lr) if callable(v) else v) for k, v in change.items()})
            if lr.rotary
            else lr
            for lr in s.layers
        )
        return dataclasses.replace(s, layers=layers)

    # every module that reads the spec imported rope_spec at its top: replace it in each
    for module in list(sys.modules.values()):
        if (
            getattr(module, "__name__", "").startswith("ropelens")
            and getattr(module, "rope_spec", None) is orig
        ):
            monkeypatch.setattr(module, "rope_spec", wrong)


def test_wrong_pairing_is_caught(monkeypatch):
    model = tiny_model("llama")
    _spec_patch(monkeypatch, pairing="adjacent")
    _caught(
        model,
        r"layer 0 fails the rotation check .*measured on the model.s own rotated q, the rotation "
        r"pairs dims half where the reading pairs them adjacent",
    )


def test_wrong_pairing_the_other_way_is_caught(monkeypatch):
    model = _fresh("cohere")  # Cohere rotates adjacent pairs
    _spec_patch(monkeypatch, pairing="half")
    _caught(model, "layer 0 fails the rotation check")


def test_reversed_rotation_is_caught(monkeypatch):
    """A model whose rotate_half returns cat(x2, −x1) (NanoChat) turns the other way: read so, and a
    spec that misses it fails the rotation check."""
    model = tiny_model("llama")
    monkeypatch.setattr(
        llama_mod,
        "rotate_half",
        lambda x: torch.cat((x[..., x.shape[-1] // 2 :], -x[..., : x.shape[-1] // 2]), dim=-1),
    )
    assert {lr.direction for lr in ropelens.rope_spec(model).layers} == {-1}
    assert verify_model(model).passed
    _spec_patch(monkeypatch, direction=1)
    _caught(model, "fails the rotation check")


def test_wrong_frequencies_are_caught(monkeypatch):
    model = tiny_model("llama")
    _spec_patch(monkeypatch, inv_freq=lambda lr: lr.inv_freq * 1.01)
    _caught(model, "fails the rotation check")


def test_nope_layer_read_as_rotating_is_caught(monkeypatch):
    model = _fresh("smollm3")  # layers 1 and 3 apply no RoPE
    monkeypatch.setattr(reading, "uses_rope", lambda *_: True)
    monkeypatch.setattr(reading, "_rotary_calls", lambda *_: None)  # nor seen in the forward
    assert ropelens.rope_spec(model)[1].rotary
    _caught(model, "layer 1 fails the rotation check")


def _normed_after_rope(
    self,
    hidden_states,
    position_embeddings=None,
    attention_mask=None,
    past_key_values=None,
    **kwargs,
):
    """LlamaAttention.forward with an RMS norm and a gain of q and k after RoPE (as HunYuan's
    use_qk_norm)."""
    shape = (*hidden_states.shape[:-1], -1, self.head_dim)
    q = self.q_proj(hidden_states).view(shape).transpose(1, 2)
    k = self.k_proj(hidden_states).view(shape).transpose(1, 2)
    v = self.v_proj(hidden_states).view(shape).transpose(1, 2)
    q, k = llama_mod.apply_rotary_pos_emb(q, k, *position_embeddings)
    q = 2.0 * q * torch.rsqrt(q.pow(2).mean(-1, keepdim=True) + 1e-6)
    k = 2.0 * k * torch.rsqrt(k.pow(2).mean(-1, keepdim=True) + 1e-6)
    out, w = llama_mod.eager_attention_forward(self, q, k, v, attention_mask, scaling=self.scaling)
    return self.o_proj(out.reshape(*hidden_states.shape[:-1], -1).contiguous()), w


def test_norm_after_rope_is_caught(monkeypatch):
    model = tiny_model("llama")
    monkeypatch.setattr(llama_mod.LlamaAttention, "forward", _normed_after_rope)
    _caught(model, r"layer 0 fails the qk check .*a norm or gain after RoPE")


def _biased(orig):
    def biased(module, query, key, value, attention_mask, scaling, dropout=0.0, **kwargs):
        """The attention function with a distance bias added to the scores (ALiBi-like)."""
        n = query.shape[-2]
        pos = torch.arange(n)
        bias = -0.5 * (pos[:, None] - pos[None, :]).abs().float()
        mask = bias if attention_mask is None else attention_mask + bias
        return orig(module, query, key, value, mask, scaling, dropout, **kwargs)

    return biased


def test_score_bias_in_the_attention_function_is_caught(monkeypatch):
    model = tiny_model("llama")
    monkeypatch.setattr(
        llama_mod, "eager_attention_forward", _biased(llama_mod.eager_attention_forward)
    )
    _caught(model, r"layer 0 fails the probs check .*score bias")


def test_wrong_score_scale_is_caught(monkeypatch):
    model = tiny_model("llama")
    _spec_patch(monkeypatch, score_scale=lambda lr: lr.score_scale * 1.1)
    _caught(model, r"layer 0 fails the scale check .*spec 0\.275, model 0\.25")


@pytest.mark.parametrize("off", [-1, 1])
def test_window_off_by_one_is_caught(monkeypatch, off):
    model = tiny_model("gemma3")  # layers 0-2 slide with window 8
    _spec_patch(monkeypatch, window=lambda lr: lr.window + off if lr.window else None)
    _caught(model, "layer 0 fails the mask check .*entries differ")


def test_long_window_is_checked_at_its_edge(monkeypatch):
    """A window longer than the probe is checked against HF's mask function with the config's
    window."""
    model = tiny_model("gemma3", sliding_window=600)
    v = verify_model(model)
    assert v.passed and v.errors["window edge"] == 0 and v.n_tokens < 600
    _spec_patch(monkeypatch, window=lambda lr: lr.window + 1 if lr.window else None)
    _caught(model, "fails the window edge check .*spec window 601, config sliding_window 600")


def test_softcap_ignored_is_caught(monkeypatch):
    model = _fresh("gemma2")  # attention-logit soft-capping 50
    _spec_patch(monkeypatch, softcap=None)
    _caught(model, "fails the probs check")


def test_sinks_dropped_are_caught(monkeypatch):
    model = _fresh("gpt_oss")  # learned attention sinks
    _spec_patch(monkeypatch, sinks=None)
    _caught(model, "fails the probs check")


def test_opting_out_inside_a_block_and_the_report_says_unverified(tmp_path):
    model = tiny_model("llama")
    from ropelens.report.build import build_report

    out = build_report(
        model, tokens=64, n_ctx=32, out=tmp_path / "r", progress=False, quick=True, verify=False
    )
    html = (out / "index.html").read_text()
    assert "Unverified." in html
    report = json.loads((out / "report.json").read_text())
    assert report["provenance"]["config"]["verification"]["status"] == "unverified"
    assert verification(model, ropelens.rope_spec(model), verify=False).status == "unverified"
