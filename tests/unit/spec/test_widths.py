"""Layers of different widths in one model (Gemma 4): the spec, and every analysis that stacks
layers over them.

Gemma 4's global (full-attention) layers have wider heads (``global_head_dim``), may have fewer KV
heads, and rotate with "proportional" RoPE: every dim pair (i, i + d/2) of the wide head is a plane,
the leading quarter turn, the rest stay at frequency 0. The reference numbers here are HF's own (the
q and k its eager attention function receives) or the formulas of HF's rope init written out.
"""

from __future__ import annotations

import dataclasses
import functools
import math

import pandas as pd
import pytest
import torch

import ropelens
from ropelens import Bands
from ropelens.errors import InputError
from ropelens.report.build import build_report
from ropelens.results.result import load_result
from ropelens.run.capture import capture_qk
from ropelens.run.verify import rotation_error
from ropelens.spec.reading import rope_spec
from ropelens.testing.families import FAMILIES, N_CHECK, family_model_dir

transformers = pytest.importorskip("transformers")
pytestmark = pytest.mark.skipif(
    not hasattr(transformers, "Gemma4TextConfig"),
    reason="this transformers has no Gemma4TextConfig",
)


@pytest.fixture(scope="module")
def gemma4(tmp_path_factory):
    """(bridge, spec, HF eager model) of the family matrix's tiny Gemma 4, from one saved
    directory."""
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
    """Layer → (query, key) ``[b, head, pos, d]`` as HF's ``eager_attention_forward`` receives them
    (post-RoPE)."""
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
    want = torch.cat(
        [
            1.0 / 1e6 ** (torch.arange(0, 8, 2, dtype=torch.float64) / 32),
            torch.zeros(12, dtype=torch.float64),
        ]
    )
    torch.testing.assert_close(glob.inv_freq.double(), want, rtol=1e-6, atol=0)
    assert spec[0].window == 8 and glob.window is None


def test_partial_rotary_layout_is_not_proportional(gemma4):
    """Read as ordinary partial rotary (4 planes pairing dims (i, i + 4), the rest passing through)
    the global layer fails the rotation check: its turning planes pair (i, i + 16) across the whole
    head."""
    model, spec, _ = gemma4
    q = capture_qk(model, torch.full((1, N_CHECK), 7), layers=[3], which=("q_post",))[3]["q_post"][
        0
    ]
    right = spec[3]
    wrong = dataclasses.replace(right, inv_freq=right.inv_freq[:4], rotary_dim=8)
    assert rotation_error(right, q) < 1e-5  # float32 rotation of the same numbers
    assert rotation_error(wrong, q) > 0.1


def test_frequency_usage_over_mixed_widths_is_hfs_plane_norms(gemma4):
    """Each layer's per-plane mean norms equal the plane norms of the q and k HF's attention
    function receives (RoPE keeps every plane's norm; Gemma 4 has attention scaling 1), in that
    layer's own heads and planes; the padding of the narrower layers is NaN and is left out of the
    table."""
    model, spec, hf = gemma4
    usage = ropelens.analyses.frequency_usage(model, _tokens(), progress=False, n_sink=0)
    assert usage.layers == (0, 1, 2, 3) and usage.ragged
    assert usage.q_norm.shape == (4, 4, 16) and usage.k_norm.shape == (4, 2, 16)
    ref = _hf_qk(hf, 1)
    for i, L in enumerate(usage.layers):
        n = spec[L].head_dim // 2
        for got, x in ((usage.q_norm[i], ref[L][0]), (usage.k_norm[i], ref[L][1])):
            x = x.double()
            want = torch.hypot(x[..., :n], x[..., n:]).mean(
                (0, 2)
            )  # [head, plane]: pairs (i, i + d/2)
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
    whole = ropelens.analyses.frequency_usage(model, toks, progress=False)
    a = ropelens.analyses.frequency_usage(model, toks[:2], progress=False)
    b = ropelens.analyses.frequency_usage(model, toks[2:], progress=False)
    a.save(tmp_path / "a.json")
    merged = load_result(tmp_path / "a.json").merge(b)
    for key in whole.token:
        for got, want in (
            (merged.token[key], whole.token[key]),
            (merged.window[key], whole.window[key]),
        ):
            torch.testing.assert_close(
                got.total, want.total, rtol=1e-12, atol=1e-12
            )  # float64 sums, reordered
            torch.testing.assert_close(got.count, want.count, rtol=0, atol=0)
    torch.testing.assert_close(merged.q_norm, whole.q_norm, rtol=1e-6, atol=0, equal_nan=True)


def _massive(model, toks, **kw):
    from ropelens.analyses.massive_values import massive_values

    return massive_values(model, toks, progress=False, **kw)


def _offsets(model, toks, **kw):
    from ropelens.analyses.rotary_offsets import rotary_offsets

    return rotary_offsets(model, toks, progress=False, **kw)


def _heads(model, toks, **kw):
    from ropelens.analyses.head_taxonomy import head_taxonomy

    # τ given: Otsu's threshold is taken over every measured head, so it is not a per-layer number
    return head_taxonomy(model, toks, max_offset=4, tau=0.5, progress=False, **kw)


STACKING = {
    "band_statistics": lambda model, toks, **kw: ropelens.analyses.band_statistics(
        model, toks, progress=False, **kw
    ),
    "head_taxonomy": _heads,
    "attention_sinks": lambda model, toks, **kw: ropelens.analyses.attention_sinks(
        model, toks, progress=False, **kw
    ),
    "attention_by_distance": lambda model, toks, **kw: ropelens.analyses.attention_by_distance(
        model, toks, progress=False, **kw
    ),
    "massive_values": _massive,
    "positional_symbolic": lambda model, toks, **kw: ropelens.analyses.positional_symbolic(
        model, toks, progress=False, **kw
    ),
    "rotary_offsets": _offsets,
}


def _per_layer_arrays(result) -> dict[str, torch.Tensor]:
    """Every ``[layer, ...]`` array a result holds: its sums, scores or moments, by name."""
    out = {}
    for field in ("sums", "scores"):
        held = getattr(result, field, None)
        if isinstance(held, dict):
            out.update({f"{field}/{k}": v for k, v in held.items()})
    moments = dict(getattr(result, "moments", {}))
    moments.update({w: getattr(result, w) for w in ("q", "k") if hasattr(result, w)})
    for w, m in moments.items():
        out.update({f"{w}/{f}": getattr(m, f) for f in ("count", "total", "total_sq")})
    return out


def _frames(result) -> dict[str, "pd.DataFrame"]:
    frames = {"to_frame": result.to_frame()}
    if hasattr(result, "heads_frame"):
        frames["heads_frame"] = result.heads_frame()
    return frames


@pytest.fixture(scope="module")
def stacked(gemma4):
    """Each stacking analysis over every rotary layer in one run, and over each width group
    alone."""
    model, spec, _ = gemma4
    toks = _tokens()  # longer than the sliding window: the sliding layers see their window's edge
    assert toks.shape[1] > spec[0].window
    groups = list(spec.width_groups().values())
    return {
        name: (fn(model, toks), [(g, fn(model, toks, layers=g)) for g in groups])
        for name, fn in STACKING.items()
    }


@pytest.mark.parametrize("name", list(STACKING))
def test_mixed_widths_give_each_layer_its_own_groups_numbers(gemma4, stacked, name):
    """Over layers of two widths in one run, every layer's arrays equal those of its width group
    measured alone in the layer's own leading heads, planes and dims; the padding past them is NaN;
    the tables hold exactly the group's rows, and no padding."""
    _, spec, _ = gemma4
    whole, alone = stacked[name]
    assert list(whole.layers) == spec.rotary_layers
    arrays = _per_layer_arrays(whole)
    assert arrays
    padded = 0
    for group, one in alone:
        idx = [whole.layers.index(L) for L in group]
        for key, want in _per_layer_arrays(one).items():
            got = arrays[key][idx]
            assert got.ndim == want.ndim and all(g >= w for g, w in zip(got.shape, want.shape)), key
            own = tuple(slice(0, n) for n in want.shape)
            torch.testing.assert_close(
                got[own], want, rtol=1e-6, atol=1e-12, equal_nan=True, msg=key
            )
            rest = got.clone()
            rest[own] = math.nan
            assert rest.isnan().all(), f"{key}: entries past the group's own width are not NaN"
            padded += got.numel() - want.numel()
        for kind, frame in _frames(whole).items():
            want = _frames(one)[kind].reset_index(drop=True)
            got = frame[frame["layer"].isin(group)].reset_index(drop=True)
            pd.testing.assert_frame_equal(got, want, check_dtype=False, rtol=1e-6, atol=1e-12)
    # both widths have 4 query heads: arrays over query heads alone (head scores, distance,
    # positional/symbolic) need no padding; those over KV heads, planes or dims do
    assert (padded > 0) == (
        name in {"band_statistics", "attention_sinks", "massive_values", "rotary_offsets"}
    )
    for frame in _frames(whole).values():
        assert sorted(set(frame["layer"])) == spec.rotary_layers
    assert whole.findings() is not None and whole.figure() is not None


def test_mixed_widths_pad_heads_planes_and_dims_with_nan(gemma4, stacked):
    """The global layer has one KV head where the sliding ones have two, the sliding layers 8 planes
    and 16 dims where the global one has 16 and 32: those entries read NaN and have no row."""
    _, spec, _ = gemma4
    band = stacked["band_statistics"][0]
    tight = band.tightness()
    assert tight.shape == (4, 4, 16)
    assert (
        tight[:3, :, 8:].isnan().all()
        and not tight[:3, :, :8].isnan().any()
        and not tight[3].isnan().any()
    )
    sinks = stacked["attention_sinks"][0]
    ratio = sinks.key_norm_ratio()  # [layer, kv_head, band]
    assert (
        ratio[3, 1].isnan().all() and not ratio[3, 0].isnan().any() and not ratio[:3].isnan().any()
    )
    assert not sinks.plane_key_ratio().isnan().any()
    mv = stacked["massive_values"][0]
    assert mv.norm("q").shape == (4, 4, 32) and mv.norm("q")[:3, :, 16:].isnan().all()
    assert not mv.mask("q")[:3, :, 16:].any() and not mv.ratio("q")[:3, :, :16].isnan().any()
    frame = mv.to_frame()
    assert frame.groupby(["which", "layer"]).size().to_dict() == {
        ("k", 0): 32,
        ("k", 1): 32,
        ("k", 2): 32,
        ("k", 3): 32,
        ("q", 0): 64,
        ("q", 1): 64,
        ("q", 2): 64,
        ("q", 3): 128,
    }
    planes = mv.planes_frame()
    assert planes.groupby("layers").size().to_dict() == {"0-2": 2 * 8, "3": 2 * 16}
    off = stacked["rotary_offsets"][0]
    assert off.norm("k")[3, 1].isnan().all() and off.norm("q")[:3, :, 8:].isnan().all()
    rows = off.to_frame()
    assert rows.groupby("layer").size().to_dict() == {0: 4 * 8, 1: 4 * 8, 2: 4 * 8, 3: 4 * 16}
    assert not rows[["q_norm", "k_norm", "q_ratio", "k_ratio"]].isna().any().any()


def test_mixed_width_results_save_and_load_with_their_padding(gemma4, stacked, tmp_path):
    for name, (whole, _) in stacked.items():
        whole.save(tmp_path / f"{name}.json")
        back = load_result(tmp_path / f"{name}.json")
        for key, want in _per_layer_arrays(whole).items():
            torch.testing.assert_close(
                _per_layer_arrays(back)[key], want, rtol=0, atol=0, equal_nan=True, msg=key
            )
        pd.testing.assert_frame_equal(back.to_frame(), whole.to_frame())


def test_band_names_that_differ_across_widths_are_refused(gemma4):
    """Up to 16 quantiles name 8 bands in a sliding layer (8 planes) and 16 in the global one:
    refused."""
    model, _, _ = gemma4
    bands = Bands.quantiles(16, fit=True)
    with pytest.raises(InputError, match="resolve to different band names across layers"):
        ropelens.analyses.band_statistics(model, _tokens(), bands=bands, progress=False)
    st = ropelens.analyses.band_statistics(
        model, _tokens(), layers=[3], bands=bands, progress=False
    )
    assert len(st.band_names) == 16


def test_report_over_mixed_widths(gemma4, tmp_path):
    """The quick report measures both widths in one run: band statistics and heads hold rows of each
    layer, its own heads only."""
    model, spec, _ = gemma4
    out = build_report(model, quick=True, n_ctx=32, out=tmp_path / "r", progress=False)
    assert (out / "index.html").exists()
    bands = pd.read_csv(out / "band_statistics.csv")
    heads = pd.read_csv(out / "head_taxonomy.csv")
    groups = spec.width_groups()
    assert len(groups) == 2
    for frame in (bands, heads):
        for layers in groups.values():
            assert set(layers) <= set(frame["layer"])
    assert heads.groupby("layer").size().to_dict() == {
        L: spec[L].n_heads for L in spec.rotary_layers
    }
    tight = pd.read_csv(out / "tightness.csv")
    assert tight.groupby("layer").size().to_dict() == {
        L: spec[L].n_heads * spec[L].n_planes for L in spec.rotary_layers
    }
    assert not tight["tightness"].isna().any()


@pytest.mark.parametrize("k_eq_v", [False, True])
def test_real_gemma4_shapes_are_read(k_eq_v):
    """The released Gemma 4 layout (Gemma4TextConfig defaults: heads of 256, global heads of 512
    with proportional rotary 0.25 at base 1e6, local base 1e4, window 512, five local layers to one
    global; the 31B's shared key/value global layers with 4 KV heads) at a tiny hidden size."""
    from transformers import AutoModelForCausalLM, Gemma4TextConfig

    from ropelens.loading.models import wrap_hf_model
    from ropelens.testing import tiny_tokenizer

    extra = dict(attention_k_eq_v=True, num_global_key_value_heads=2) if k_eq_v else {}
    cfg = Gemma4TextConfig(
        vocab_size=101,
        hidden_size=32,
        intermediate_size=32,
        num_hidden_layers=6,
        vocab_size_per_layer_input=101,
        hidden_size_per_layer_input=4,
        **extra,
    )
    torch.manual_seed(0)
    hf = AutoModelForCausalLM.from_config(cfg, attn_implementation="eager").eval()
    hf.config.architectures = [type(hf).__name__]
    spec = rope_spec(wrap_hf_model(hf, tiny_tokenizer(), device="cpu", label="gemma4-shapes"))
    assert spec.kinds == {"sliding": [0, 1, 2, 3, 4], "full": [5]}
    local = 1.0 / 1e4 ** (torch.arange(0, 256, 2, dtype=torch.float64) / 256)
    glob = torch.cat(
        [
            1.0 / 1e6 ** (torch.arange(0, 128, 2, dtype=torch.float64) / 512),
            torch.zeros(192, dtype=torch.float64),
        ]
    )
    for lr in spec.layers:
        full = lr.kind == "full"
        assert (lr.head_dim, lr.rotary_dim, lr.n_heads) == (
            (512, 512, 8) if full else (256, 256, 8)
        )
        assert lr.n_kv_heads == (2 if full and k_eq_v else 4)
        assert lr.score_scale == 1.0 and lr.window == (None if full else 512)
        assert lr.rope_type == ("proportional" if full else "default")
        torch.testing.assert_close(
            lr.inv_freq.double(), glob if full else local, rtol=1e-6, atol=0
        )  # float32 buffers
        assert int((lr.inv_freq > 0).sum()) == (64 if full else 128)
    assert math.isinf(float(spec[5].wavelength[-1]))


def test_shared_key_layers_are_refused():
    """Gemma 4 E2B/E4B layers that reuse an earlier layer's keys compute none: refused in one
    line."""
    from transformers import AutoModelForCausalLM, Gemma4TextConfig

    from ropelens.errors import UnsupportedModelError
    from ropelens.loading.models import wrap_hf_model
    from ropelens.testing import tiny_tokenizer

    fam = FAMILIES["gemma4_text"]
    cfg = Gemma4TextConfig(
        **{
            **fam.config,
            "num_kv_shared_layers": 2,
            "layer_types": ["sliding_attention", "full_attention"] * 2,
        }
    )
    hf = AutoModelForCausalLM.from_config(cfg, attn_implementation="eager").eval()
    hf.config.architectures = [type(hf).__name__]
    with pytest.raises(
        UnsupportedModelError, match=r"layers \[2, 3\] reuse an earlier layer's keys"
    ):
        rope_spec(wrap_hf_model(hf, tiny_tokenizer(), device="cpu", label="gemma4-shared"))
