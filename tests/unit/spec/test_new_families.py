"""Families beyond the first matrix: each is exact against HF's eager attention or refused in one
line.

Every family is loaded as a user would (``load_model(path)`` on a saved directory) and run with the
probe on: it either passes and the numbers equal HF's own (rotary buffers, eager scores and
probabilities, measured by :func:`tests.harness.families.check_family`), or every step raises
:class:`UnsupportedModelError` naming the architecture and the reason. Never a number in between.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib

import pytest
import torch
from transformers import AutoConfig

import ropelens
from ropelens.errors import UnsupportedModelError
from ropelens.run.verify import rotation_error, verify_model
from ropelens.spec.reading import rope_spec
from ropelens.spec.rope import LayerRope
from ropelens.testing.families import FAMILIES, N_CHECK, family_hf_model, family_model_dir
from tests.harness.families import check_family

NEW = [
    "cohere2",
    "exaone4",
    "gemma4_text",
    "hunyuan_v1_dense",
    "nanochat",
    "falcon",
    "ministral",
    "helium",
    "persimmon",
    "phimoe",
    "diffllama",
    "minicpm3",
]
EXACT = [f for f in NEW if FAMILIES[f].refused is None]
NOPE = [f for f in EXACT if FAMILIES[f].nope_layers]


def _param(name: str):
    return pytest.param(name, id=name)


def _analyses(model):
    toks = torch.randint(4, 100, (1, N_CHECK), generator=torch.Generator().manual_seed(3))
    toks[0, 0] = 1
    return [
        lambda: verify_model(model),
        lambda: ropelens.analyses.attention_decomposition(model, toks),
        lambda: ropelens.analyses.frequency_usage(model, toks, progress=False),
    ]


@pytest.mark.parametrize("family", [_param(f) for f in NEW])
def test_family_is_exact_or_refused_in_one_line(family, family_dir):
    """With the probe on, a family passes (and every analysis runs) or every step raises one clear
    line."""
    fam = FAMILIES[family]
    path = family_dir(family)
    if fam.refused_at == "load":
        with pytest.raises(UnsupportedModelError, match=fam.refused) as err:
            ropelens.load_model(path, device="cpu")
    else:
        model = ropelens.load_model(path, device="cpu")
        if fam.refused is None:
            for run in _analyses(model):
                run()
            return
        for run in ([lambda: rope_spec(model)] if fam.refused_at == "spec" else []) + _analyses(
            model
        ):
            with pytest.raises(UnsupportedModelError, match=fam.refused) as err:
                run()
    msg = str(err.value)
    arch = AutoConfig.from_pretrained(path).architectures[0]
    assert "\n" not in msg and len(msg) < 600, msg
    assert msg.startswith(f"{arch}: ")
    assert "Available architectures" not in msg


@pytest.mark.parametrize("family", [_param(f) for f in EXACT])
def test_exact_family_matches_hf(family, tmp_path):
    """Summed band logits, rebuilt pattern and rotation equal HF's own numbers; the NoPE layer is
    read as such."""
    r = check_family(family, workdir=tmp_path)
    assert r.refusal is None and r.spec_errors == []
    assert r.inv_freq_err == 0.0
    # float32 sums of 16 products of O(10) values: relative error ~1e-7; 1e-5 leaves room, a wrong
    # term is O(1)
    assert r.scores_err < 1e-5 and r.pairing_err < 1e-5
    assert r.pattern_err < 1e-4 and r.band_pattern_err < 1e-4
    assert r.kinds.get("nope", []) == list(FAMILIES[family].nope_layers)


@pytest.mark.parametrize("family", NOPE)
def test_full_attention_layers_apply_no_rope(family):
    """Independently of ropelens: on one token repeated, the query entering layer 3's score is the
    same at every position (no rotation), while layer 0's turns; ropelens reads layer 3 as NoPE."""
    hf = family_hf_model(family)
    mod = importlib.import_module(type(hf).__module__)
    seen = {}
    orig = mod.eager_attention_forward

    def keep(module, query, key, *a, **kw):
        seen[module.layer_idx] = query.detach()
        return orig(module, query, key, *a, **kw)

    mod.eager_attention_forward = keep
    try:
        with (
            torch.no_grad()
        ):  # every value is the same vector, so every layer's input is the same at every position
            hf(torch.full((1, 6), 7))
    finally:
        mod.eager_attention_forward = orig
    moved = {L: float((q[0] - q[0, :, :1]).abs().max() / q.abs().max()) for L, q in seen.items()}
    # float32 arithmetic on identical rows: exactly equal up to ~1e-7; a rotation moves them by O(1)
    assert moved[3] < 1e-5 and moved[0] > 0.1
    assert [lr.kind for lr in _spec(family).layers] == ["sliding", "sliding", "sliding", "nope"]


@functools.cache
def _spec(family: str):
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        return rope_spec(
            ropelens.load_model(family_model_dir(family, f"{tmp}/{family}"), device="cpu")
        )


def spec_kind(family: str, layer: int) -> str:
    return _spec(family)[layer].kind


def test_nanochat_direction_is_read_from_the_model():
    """NanoChat's rotate_half returns cat(x2, −x1): the spec turns the other way, as HF's own
    rotation does."""
    hf = family_hf_model("nanochat")
    lr = _spec("nanochat")[0]
    assert lr.direction == -1
    mod = importlib.import_module(type(hf).__module__)
    q = torch.randn(1, lr.n_heads, 9, lr.head_dim, generator=torch.Generator().manual_seed(0))
    pos = torch.arange(9)
    cos, sin = hf.model.rotary_emb(q, pos[None])
    want, _ = mod.apply_rotary_pos_emb(q, q, cos, sin)
    # float32 cos/sin of angles up to 8 rad: ~1e-6 relative; the other direction is O(1) off
    assert float((lr.rotate(q, pos) - want).abs().max()) < 1e-5
    assert float((dataclasses.replace(lr, direction=1).rotate(q, pos) - want).abs().max()) > 0.1
    same = torch.full((9, lr.n_heads, lr.head_dim), 0.0) + q[0, :, 0]
    assert rotation_error(lr, lr.rotate(same.transpose(0, 1), pos).transpose(0, 1)) < 1e-6


def test_direction_defaults_and_round_trips():
    """Specs saved before the direction field load as today's rotation; a flipped one survives a
    round trip."""
    lr = _spec("exaone4")[0]
    d = lr.to_dict()
    del d["direction"]
    assert LayerRope.from_dict(d).direction == 1
    flipped = dataclasses.replace(lr, direction=-1)
    assert LayerRope.from_dict(flipped.to_dict()).direction == -1
    assert not flipped.same_rotation(lr)
    with pytest.raises(ropelens.errors.InputError, match="direction"):
        dataclasses.replace(lr, direction=2)


# ============================================================================ a norm after RoPE
NORMED = [
    "hunyuan_v1_dense",
    "nanochat",
]  # q/k RMS-normed (HunYuan: with a gain) after apply_rotary_pos_emb


def _fresh(family: str, family_dir):
    return ropelens.load_model(family_dir(family), device="cpu")


@pytest.mark.parametrize(
    "family", ["hunyuan_v1_dense", "nanochat", "llama", "qwen3", "gemma3_text"]
)
def test_norm_after_rope_is_read_from_the_forward(family, family_dir):
    """Read on the model at run time: set where q/k change after the rotation, unset where a norm
    comes before it."""
    spec = rope_spec(_fresh(family, family_dir))
    assert {lr.norm_after_rope for lr in spec.layers} == {family in NORMED}


@pytest.mark.parametrize("family", NORMED)
def test_norm_after_rope_read_as_absent_is_caught(family, family_dir, monkeypatch):
    """A reading that misses the norm takes the rotated q/k as the score's: the probe's q/k check
    refuses it."""
    import ropelens.spec.reading as reading

    monkeypatch.setattr(reading, "_norm_after_rope", lambda *_: False)
    model = _fresh(family, family_dir)
    assert not any(lr.norm_after_rope for lr in rope_spec(model).layers)
    with pytest.raises(
        UnsupportedModelError, match=r"layer 0 fails the qk check .*a norm or gain after RoPE"
    ):
        verify_model(model)


def _hf_attention_inputs(
    family: str, family_dir, toks: torch.Tensor
) -> dict[int, tuple[torch.Tensor, torch.Tensor]]:
    """Layer → (query, key) HF's own eager attention function receives, ``[batch, head, pos,
    d]``."""
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(
        family_dir(family), attn_implementation="eager"
    ).eval()
    mod = importlib.import_module(type(hf).__module__)
    orig, seen = mod.eager_attention_forward, {}

    def keep(module, query, key, *a, **kw):
        seen[module.layer_idx] = (query.detach().double(), key.detach().double())
        return orig(module, query, key, *a, **kw)

    mod.eager_attention_forward = keep
    try:
        with torch.no_grad():
            hf(toks)
    finally:
        mod.eager_attention_forward = orig
    return seen


@pytest.mark.parametrize("fast", [True, False], ids=["fast path", "bridge"])
@pytest.mark.parametrize("family", NORMED)
def test_usage_is_the_plane_norms_of_what_enters_the_score(family, fast, family_dir):
    """Post-RoPE frequency usage equals the plane norms of the q and k HF's attention function
    receives (after the norm), on both capture paths; the pairing is written out by hand ((i, i +
    d/2))."""
    from ropelens.analyses.frequency_usage import UsageReducer
    from ropelens.run.capture import stream

    model = _fresh(family, family_dir)
    toks = torch.randint(4, 100, (2, N_CHECK), generator=torch.Generator().manual_seed(5))
    toks[:, 0] = 1
    usage = ropelens.analyses.frequency_usage(
        model, toks, progress=False, n_sink=0, source="post"
    )  # the probe passes
    spec = rope_spec(model)
    red = UsageReducer(spec, spec.rotary_layers, source="post", n_sink=0)
    stream(model, [toks], [red], spec=spec, progress=False, fast=fast)
    seen = _hf_attention_inputs(family, family_dir, toks)
    for i, L in enumerate(usage.layers):
        # the bridge rebuilds the norm in its own float32 ops: ~1e-7 relative from the fast path's
        torch.testing.assert_close(
            usage.q_norm[i].double(), red.tok[("q", "all")].mean[i].double(), rtol=1e-5, atol=1e-6
        )
        for got, x in (
            (red.tok[("q", "all")].mean[i], seen[L][0]),
            (red.tok[("k", "all")].mean[i], seen[L][1]),
        ):
            n = x.shape[-1] // 2
            want = torch.hypot(x[..., :n], x[..., n:]).mean((0, 2))  # [head, plane]
            # float32 norms of O(1) values averaged over 48 tokens: ~1e-7 relative; the rotated
            # (un-normed) q/k differ by O(1)
            torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-6)


def test_norm_after_rope_classifier_on_known_transforms():
    """Same tensors: no norm; an RMS norm with a per-dim gain, or an L2 norm, in float32 or rounded
    to bf16: a norm; a mean-subtracting layer norm or a mixing of dims: neither (left to the probe's
    q/k check to refuse)."""
    from ropelens.spec.reading import _norm_after_rope

    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 4, 6, 16, generator=g)  # [batch, head, pos, d]
    gain = torch.rand(16, generator=g) * 1.5 + 0.25
    rms = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * gain
    assert _norm_after_rope(x, x.clone()) is False
    assert _norm_after_rope(x, rms) is True
    assert _norm_after_rope(x, torch.nn.functional.normalize(x, dim=-1)) is True
    assert (
        _norm_after_rope(x.bfloat16().float(), (rms.bfloat16()).float()) is True
    )  # bf16: 4e-3 relative rounding
    centred = (x - x.mean(-1, keepdim=True)) * torch.rsqrt(x.var(-1, keepdim=True) + 1e-6)
    assert _norm_after_rope(x, centred) is None
    assert _norm_after_rope(x, x.flip(-1)) is None
    assert _norm_after_rope(x, x[..., :8]) is None


def test_norm_after_rope_defaults_and_round_trips():
    """Specs saved before the norm_after_rope field load as a layer without one; a set one survives
    a round trip."""
    lr = _spec("nanochat")[0]
    assert lr.norm_after_rope
    d = lr.to_dict()
    del d["norm_after_rope"]
    assert LayerRope.from_dict(d).norm_after_rope is False
    assert LayerRope.from_dict(lr.to_dict()).norm_after_rope is True
