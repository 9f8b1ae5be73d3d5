"""Layers of different widths in one model (Gemma 4): the spec, frequency usage over them, and the refusals.

Gemma 4's global (full-attention) layers have wider heads (``global_head_dim``), may have fewer KV
heads, and rotate with "proportional" RoPE: every dim pair (i, i + d/2) of the wide head is a plane,
the leading quarter turn, the rest stay at frequency 0. The reference numbers here are HF's own (the
q and k its eager attention function receives) or the formulas of HF's rope init written out.
"""

from __future__ import annotations

import dataclasses
import functools
import math

import pytest
import torch

import ropelens
from ropelens import Bands
from ropelens.capture import capture_qk
from ropelens.errors import InputError
from ropelens.reading import rope_spec
from ropelens.report.build import build_report
from ropelens.result import load_result
from ropelens.testing.families import FAMILIES, N_CHECK, family_model_dir, rotation_error

transformers = pytest.importorskip("transformers")
pytestmark = pytest.mark.skipif(not hasattr(transformers, "Gemma4TextConfig"),
                                reason="this transformers has no Gemma4TextConfig")


@pytest.fixture(scope="module")
def gemma4(tmp_path_factory):
    """(bridge, spec, HF eager model) of the family matrix's tiny Gemma 4, from one saved directory."""
    from transformers import AutoModelForCausalLM

    path = family_model_dir("gemma4_text", tmp_path_factory.mktemp("g4") / "gemma4_text")
    model = ropelens.load_model(path, device="cpu")
    hf = AutoModelForCausalLM.from_pretrained(path, attn_implementation="eager").eval()
    return model, rope_spec(model), hf


def _tokens(seed: int = 1) -> torch.Tensor:
    toks = torch.randint(4, 100, (2, N_CHECK), generator=torch.Generator().manual_seed(seed))
    toks[:, 0] = 1
    return toks


@functools.cache
def _hf_qk(hf, key: int) -> dict[int, tuple[torch.Tensor, torch.Tensor]]:
    """Layer → (query, key) ``[b, head, pos, d]`` as HF's ``eager_attention_forward`` receives them (post-RoPE)."""
    import importlib

    mod = importlib.import_module(type(hf).__module__)
    orig = mod.eager_attention_forward
    got = {}

    def wrapped(module, query, k, *args, **kwargs):
        got[module.layer_idx] = (query.detach().clone(), k.detach().clone())
        return orig(module, query, k, *args, **kwargs)

    mod.eager_attention_forward = wrapped
    try:
        with torch.no_grad():
            hf(_tokens(key))
    finally:
        mod.eager_attention_forward = orig
    return got


def test_spec_reads_each_layers_width(gemma4):
    model, spec, hf = gemma4
    assert spec.width_groups() == {(16, 4, 2, 8): [0, 1, 2], (32, 4, 1, 16): [3]}
    glob = spec[3]
    assert glob.rotary_dim == glob.head_dim == 32 and glob.score_scale == 1.0
    # proportional: θ_i = 1e6^(−2i/32) for the leading 32·0.25/2 = 4 planes, 0 for the other 12
    want = torch.cat([1.0 / 1e6 ** (torch.arange(0, 8, 2, dtype=torch.float64) / 32), torch.zeros(12, dtype=torch.float64)])
    torch.testing.assert_close(glob.inv_freq.double(), want, rtol=1e-6, atol=0)
    assert spec[0].window == 8 and glob.window is None


def test_partial_rotary_layout_is_not_proportional(gemma4):
    """Read as ordinary partial rotary (4 planes pairing dims (i, i + 4), the rest passing through) the
    global layer fails the rotation check: its turning planes pair (i, i + 16) across the whole head."""
    model, spec, _ = gemma4
    q = capture_qk(model, torch.full((1, N_CHECK), 7), layers=[3], which=("q_post",))[3]["q_post"][0]
    right = spec[3]
    wrong = dataclasses.replace(right, inv_freq=right.inv_freq[:4], rotary_dim=8)
    assert rotation_error(right, q) < 1e-5  # float32 rotation of the same numbers
    assert rotation_error(wrong, q) > 0.1


def test_frequency_usage_over_mixed_widths_is_hfs_plane_norms(gemma4):
    """Each layer's per-plane mean norms equal the plane norms of the q and k HF's attention function receives
    (RoPE keeps every plane's norm; Gemma 4 has attention scaling 1), in that layer's own heads and planes; the
    padding of the narrower layers is NaN and is left out of the table."""
    model, spec, hf = gemma4
    usage = ropelens.frequency_usage(model, _tokens(), progress=False, n_sink=0)
    assert usage.layers == (0, 1, 2, 3) and usage.ragged
    assert usage.q_norm.shape == (4, 4, 16) and usage.k_norm.shape == (4, 2, 16)
    ref = _hf_qk(hf, 1)
    for i, L in enumerate(usage.layers):
        n = spec[L].head_dim // 2
        for got, x in ((usage.q_norm[i], ref[L][0]), (usage.k_norm[i], ref[L][1])):
            x = x.double()
            want = torch.hypot(x[..., :n], x[..., n:]).mean((0, 2))  # [head, plane]: pairs (i, i + d/2)
            h, p = want.shape
            # float32 norms summed in float64 over 48 tokens: a few float32 ulps
            torch.testing.assert_close(got[:h, :p].double(), want, rtol=1e-5, atol=1e-6)
            assert got[h:].isnan().all() and got[:, p:].isnan().all()
    frame = usage.to_frame()
    rows = frame[(frame.which == "k") & (frame.scope == "all")]
    assert len(rows) == 3 * 2 * 8 + 1 * 1 * 16  # each layer's own KV heads × planes, no padding
    assert not rows["mean_norm"].isna().any()
    names, share = usage.band_share(Bands.quantiles(2), "q")
    assert torch.allclose(share.nansum(-1), torch.ones(4, 4).double().float())
    assert usage.findings() and usage.figure() is not None


def test_mixed_width_usage_saves_loads_and_merges(gemma4, tmp_path):
    """Sums of two halves of the corpus merge into the sums of the whole; the file round-trips."""
    model, _, _ = gemma4
    toks = torch.cat([_tokens(1), _tokens(2)])
    whole = ropelens.frequency_usage(model, toks, progress=False)
    a = ropelens.frequency_usage(model, toks[:2], progress=False)
    b = ropelens.frequency_usage(model, toks[2:], progress=False)
    a.save(tmp_path / "a.json")
    merged = load_result(tmp_path / "a.json").merge(b)
    for key in whole.token:
        for got, want in ((merged.token[key], whole.token[key]), (merged.window[key], whole.window[key])):
            torch.testing.assert_close(got.total, want.total, rtol=1e-12, atol=1e-12)  # float64 sums, reordered
            torch.testing.assert_close(got.count, want.count, rtol=0, atol=0)
    torch.testing.assert_close(merged.q_norm, whole.q_norm, rtol=1e-6, atol=0, equal_nan=True)


def test_stacking_analyses_refuse_mixed_widths_naming_the_groups(gemma4, tmp_path):
    model, spec, _ = gemma4
    toks = _tokens()
    fix = r"layers=\[0, 1, 2\] or layers=\[3\]"
    with pytest.raises(InputError, match=r"band statistics .*head dim 32, 4 heads / 1 KV heads, 16 planes in layers 3.*" + fix):
        ropelens.band_statistics(model, toks, progress=False)
    with pytest.raises(InputError, match="the report stacks .*" + fix) as err:
        build_report(model, quick=True, progress=False, out=tmp_path / "report")
    assert "\n" not in str(err.value)
    st = ropelens.band_statistics(model, toks, layers=[3], bands=Bands.quantiles(2), progress=False)
    assert list(st.layers) == [3]
    assert not (tmp_path / "report" / "index.html").exists()


@pytest.mark.parametrize("k_eq_v", [False, True])
def test_real_gemma4_shapes_are_read(k_eq_v):
    """The released Gemma 4 layout (Gemma4TextConfig defaults: heads of 256, global heads of 512 with
    proportional rotary 0.25 at base 1e6, local base 1e4, window 512, five local layers to one global;
    the 31B's shared key/value global layers with 4 KV heads) at a tiny hidden size."""
    from transformers import AutoModelForCausalLM, Gemma4TextConfig

    from ropelens.models import wrap_hf_model
    from ropelens.testing import tiny_tokenizer

    extra = dict(attention_k_eq_v=True, num_global_key_value_heads=2) if k_eq_v else {}
    cfg = Gemma4TextConfig(vocab_size=101, hidden_size=32, intermediate_size=32, num_hidden_layers=6,
                           vocab_size_per_layer_input=101, hidden_size_per_layer_input=4, **extra)
    torch.manual_seed(0)
    hf = AutoModelForCausalLM.from_config(cfg, attn_implementation="eager").eval()
    hf.config.architectures = [type(hf).__name__]
    spec = rope_spec(wrap_hf_model(hf, tiny_tokenizer(), device="cpu", label="gemma4-shapes"))
    assert spec.kinds == {"sliding": [0, 1, 2, 3, 4], "full": [5]}
    local = 1.0 / 1e4 ** (torch.arange(0, 256, 2, dtype=torch.float64) / 256)
    glob = torch.cat([1.0 / 1e6 ** (torch.arange(0, 128, 2, dtype=torch.float64) / 512), torch.zeros(192, dtype=torch.float64)])
    for lr in spec.layers:
        full = lr.kind == "full"
        assert (lr.head_dim, lr.rotary_dim, lr.n_heads) == ((512, 512, 8) if full else (256, 256, 8))
        assert lr.n_kv_heads == (2 if full and k_eq_v else 4)
        assert lr.score_scale == 1.0 and lr.window == (None if full else 512)
        assert lr.rope_type == ("proportional" if full else "default")
        torch.testing.assert_close(lr.inv_freq.double(), glob if full else local, rtol=1e-6, atol=0)  # float32 buffers
        assert int((lr.inv_freq > 0).sum()) == (64 if full else 128)
    assert math.isinf(float(spec[5].wavelength[-1]))


def test_shared_key_layers_are_refused():
    """Gemma 4 E2B/E4B layers that reuse an earlier layer's keys compute none: refused in one line."""
    from transformers import AutoModelForCausalLM, Gemma4TextConfig

    from ropelens.errors import UnsupportedModelError
    from ropelens.models import wrap_hf_model
    from ropelens.testing import tiny_tokenizer

    fam = FAMILIES["gemma4_text"]
    cfg = Gemma4TextConfig(**{**fam.config, "num_kv_shared_layers": 2,
                              "layer_types": ["sliding_attention", "full_attention"] * 2})
    hf = AutoModelForCausalLM.from_config(cfg, attn_implementation="eager").eval()
    hf.config.architectures = [type(hf).__name__]
    with pytest.raises(UnsupportedModelError, match=r"layers \[2, 3\] reuse an earlier layer's keys"):
        rope_spec(wrap_hf_model(hf, tiny_tokenizer(), device="cpu", label="gemma4-shared"))
