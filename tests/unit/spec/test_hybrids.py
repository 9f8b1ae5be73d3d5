"""Hybrid models: their softmax-attention layers measured exactly, their other layers listed and
refused.

Qwen3-Next and Qwen 3.5 put Gated DeltaNet linear attention, LFM2 short convolutions, Bamba and
Granite 4 Mamba-2 layers between softmax-attention layers; Falcon-H1 runs a Mamba-2 mixer beside
the attention of every layer. The spec lists every layer under the model's own numbering, the
analyses measure the attention layers only, and asking for another layer is an error naming it.
"""

from __future__ import annotations

import pytest
import torch

import ropelens
from ropelens import Bands
from ropelens.backends.sdpa_capture import fast_qk
from ropelens.errors import InputError
from ropelens.run.verify import verify_model
from ropelens.spec.reading import rope_spec
from ropelens.spec.rope import MIXER_KINDS, LayerRope, RopeSpec
from ropelens.testing.families import N_CHECK, family_hf_model


def _toks(seed: int = 0, n: int = N_CHECK) -> torch.Tensor:
    toks = torch.randint(4, 100, (1, n), generator=torch.Generator().manual_seed(seed))
    toks[0, 0] = 1
    return toks


@pytest.mark.parametrize(
    ("family", "kinds", "mixer"),
    [
        ("qwen3_next", {"linear": [0, 2], "full": [1, 3]}, "Qwen3NextGatedDeltaNet"),
        ("qwen3_5_text", {"linear": [0, 2], "full": [1, 3]}, "Qwen3_5GatedDeltaNet"),
        ("lfm2", {"conv": [0, 2], "full": [1, 3]}, "Lfm2ShortConv"),
        ("bamba", {"mamba": [0, 2], "full": [1, 3]}, "BambaMixer"),
        ("granitemoehybrid", {"mamba": [0, 2], "full": [1, 3]}, "GraniteMoeHybridMambaLayer"),
    ],
)
def test_spec_lists_the_layers_without_attention(family, kinds, mixer, family_model):
    """Every layer keeps the model's number; the others carry their kind and HF class, and no heads
    or planes."""
    model, spec = family_model(family)
    assert spec.kinds == kinds
    other = [k for k in kinds if k in MIXER_KINDS]
    for L in kinds[other[0]]:
        lr = spec[L]
        assert (lr.attention, lr.rotary, lr.mixer, lr.n_heads, lr.head_dim) == (
            False,
            False,
            mixer,
            0,
            0,
        )
        # the HF decoder layer really runs that mixer and no softmax attention
        hf_layer = family_hf_model(family).model.layers[L]
        assert getattr(hf_layer, "self_attn", None) is None
        assert mixer in {type(m).__name__ for m in hf_layer.children()}
    assert spec.attention_layers == spec.rotary_layers == kinds["full"]
    assert spec.layer_indices(None, rotary_only=False) == kinds["full"]
    assert RopeSpec.from_dict(spec.to_dict()).kinds == kinds  # saved and loaded with the kinds
    row = spec.summary().set_index("kind").loc[other[0]]
    assert (row["mixer"], row["n_planes"]) == (mixer, 0)


def test_falcon_h1_attention_is_listed_with_the_mamba_beside_it(family_model):
    model, spec = family_model("falcon_h1")
    assert spec.kinds == {"full": [0, 1, 2, 3]}
    assert {lr.mixer for lr in spec.layers} == {"FalconH1Mixer"}
    hf = family_hf_model("falcon_h1")  # the plain HF model: every layer runs both
    assert all(
        type(x.mamba).__name__ == "FalconH1Mixer" and x.self_attn is not None
        for x in hf.model.layers
    )


@pytest.mark.parametrize("run", ["usage", "decompose", "band_statistics", "capture"])
def test_asking_for_a_layer_without_attention_names_it(run, family_model):
    """layers=[0] on Qwen3-Next: a one-line InputError naming layer 0, its kind and the attention
    layers."""
    model, _ = family_model("qwen3_next")
    toks = _toks()
    call = {
        "usage": lambda: ropelens.analyses.frequency_usage(model, toks, layers=[0], progress=False),
        "decompose": lambda: ropelens.analyses.attention_decomposition(model, toks, layers=[0]),
        "band_statistics": lambda: ropelens.analyses.band_statistics(
            model, toks, layers=[0], progress=False
        ),
        "capture": lambda: ropelens.run.capture.capture_qk(model, toks, layers=[2]),
    }[run]
    with pytest.raises(
        InputError,
        match=r"layer [02] is a 'linear' layer \(Qwen3NextGatedDeltaNet\) with no softmax "
        r"attention.*the attention layers are 1,3",
    ) as err:
        call()
    assert "\n" not in str(err.value)


def test_a_layer_kind_without_attention_is_refused(family_model):
    _, spec = family_model("qwen3_next")
    with pytest.raises(
        InputError, match=r"layer kind 'linear' has no softmax attention \(layers 0,2\)"
    ):
        spec.layer_indices(None, "linear")
    assert spec.layer_indices(None, "full") == [1, 3]


def test_mixer_layers_carry_no_heads():
    with pytest.raises(InputError, match="no softmax attention"):
        LayerRope(
            layer=0,
            inv_freq=torch.zeros(0),
            head_dim=16,
            rotary_dim=0,
            pairing="half",
            n_heads=4,
            n_kv_heads=2,
            score_scale=0.25,
            kind="linear",
        )


def test_usage_verification_and_fast_path_skip_the_linear_layers(family_model):
    """Usage measures layers 1 and 3 only, the probe checks them (both paths), and the fast path's
    rotation taps (checked to run inside decoder layers 1 and 3) give the bridge's q and k."""
    model, spec = family_model("qwen3_next")
    v = verify_model(model, spec, force=True)
    assert v.passed and v.layers == (1, 3) and set(v.paths) == {"bridge", "fast q/k path"}
    assert max(v.errors[k] for k in ("rotation", "qk", "scores", "probs")) < 1e-4
    toks = _toks(1)
    usage = ropelens.analyses.frequency_usage(model, toks, progress=False, n_sink=0)
    assert list(usage.layers) == [1, 3]
    assert (
        usage.q_norm.shape[-1] == spec[1].n_planes == 2
    )  # partial rotary 0.25 of 16 dims: 2 planes
    fast = fast_qk(model, spec, toks, torch.ones_like(toks, dtype=torch.bool), [1, 3])
    assert fast is not None and set(fast) == {1, 3}
    bridge = ropelens.run.capture.capture_qk(model, toks, fast=False)
    assert set(bridge) == {1, 3}
    for L in (1, 3):
        for k in ("q_pre", "k_pre", "q_post", "k_post"):
            # float32, the same ops on the same inputs in both paths: a few ulps of O(1) values
            torch.testing.assert_close(fast[L][k], bridge[L][k], rtol=1e-5, atol=1e-5)


def test_output_gate_changes_neither_logits_nor_pattern(tmp_path):
    """Qwen3-Next gates the attention output, sigmoid(x·W_g) ⊙ (softmax·V), after the softmax: with
    the gate rows of q_proj changed, HF's probabilities and ropelens's logits stay the same while
    the model's output moves, and ropelens's numbers still equal HF's."""
    from transformers import AutoModelForCausalLM

    toks = _toks(2)
    runs = []
    for scale in (1.0, -3.0):
        hf = family_hf_model("qwen3_next")
        # the last attention layer's gate: an earlier one would change the input of the layers after
        # it
        attn = hf.model.layers[3].self_attn
        with torch.no_grad():  # q_proj makes [query | gate] per head: scale the gate half only
            w = attn.q_proj.weight.view(attn.config.num_attention_heads, 2 * attn.head_dim, -1)
            w[:, attn.head_dim :] *= scale
        path = tmp_path / f"gate{scale}"
        hf.save_pretrained(path)
        ropelens.testing.tiny_tokenizer().save_pretrained(path)
        hf = AutoModelForCausalLM.from_pretrained(path, attn_implementation="eager").eval()
        model = ropelens.load_model(path, device="cpu")
        spec = rope_spec(model)
        assert [spec[L].output_gate for L in spec.attention_layers] == [True, True]
        with torch.no_grad():
            out = hf(toks, output_attentions=True)
        dec = ropelens.analyses.attention_decomposition(model, toks, bands=Bands.all())
        runs.append(
            (
                out.logits.clone(),
                [a.clone() for a in out.attentions],
                {L: dec.logits(L).clone() for L in (1, 3)},
                dec,
            )
        )
    (lo_a, p_a, s_a, dec_a), (lo_b, p_b, s_b, _) = runs
    assert float((lo_a - lo_b).abs().max()) > 1e-2  # the gate is live: the model's output changed
    for i, L in enumerate((1, 3)):
        torch.testing.assert_close(
            p_a[i], p_b[i], rtol=0, atol=1e-6
        )  # HF's own pattern: float32 round-off
        ok = torch.isfinite(s_a[L])
        torch.testing.assert_close(s_a[L][ok], s_b[L][ok], rtol=0, atol=1e-5)
        torch.testing.assert_close(dec_a.rebuilt_pattern(L), p_a[i], rtol=0, atol=1e-4)


def test_a_plain_attention_has_no_output_gate(family_model):
    _, spec = family_model("falcon_h1")
    assert not any(lr.output_gate for lr in spec.layers)


@pytest.mark.parametrize(
    "config_class", ["Qwen3NextConfig", "Qwen3_5TextConfig", "Qwen3_5MoeTextConfig"]
)
def test_real_config_partial_rotary_is_read(config_class):
    """The real configs rotate a quarter of each 256-wide head (64 dims, 32 planes, base 1e7 / 1e4
    as set): the spec reads exactly that from a model built with those defaults and HF's own rotary
    buffers."""
    import transformers
    from transformers import AutoModelForCausalLM

    from ropelens.loading.models import wrap_hf_model
    from ropelens.testing import tiny_tokenizer

    real = getattr(transformers, config_class)()
    assert real.rope_parameters["partial_rotary_factor"] == 0.25
    assert real.head_dim == 256
    theta = real.rope_parameters["rope_theta"]
    small = dict(
        vocab_size=101,
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        intermediate_size=64,
        layer_types=["linear_attention", "full_attention"],
        linear_num_value_heads=2,
        linear_num_key_heads=2,
        linear_key_head_dim=16,
        linear_value_head_dim=16,
        head_dim=real.head_dim,
        rope_parameters=dict(real.rope_parameters),
    )
    if hasattr(real, "num_experts"):
        small.update(
            num_experts=2,
            num_experts_per_tok=1,
            moe_intermediate_size=32,
            shared_expert_intermediate_size=32,
        )
    cfg = getattr(transformers, config_class)(**small)
    torch.manual_seed(0)
    hf = AutoModelForCausalLM.from_config(cfg, attn_implementation="eager").eval()
    hf.config.architectures = [type(hf).__name__]
    spec = rope_spec(wrap_hf_model(hf, tiny_tokenizer(), device="cpu", label=config_class))
    lr = spec[1]
    assert (lr.head_dim, lr.rotary_dim, lr.n_planes, lr.base) == (256, 64, 32, theta)
    want = theta ** (
        -torch.arange(0, 64, 2, dtype=torch.float64) / 64
    )  # θ_i over the rotary width, not the head
    torch.testing.assert_close(
        lr.inv_freq.double(), want, rtol=1e-6, atol=0
    )  # float32 buffer of a float64 value
    torch.testing.assert_close(
        lr.inv_freq, hf.model.rotary_emb.inv_freq.float(), rtol=0, atol=0
    )  # HF's own buffer
    assert spec.kinds == {"linear": [0], "full": [1]}
