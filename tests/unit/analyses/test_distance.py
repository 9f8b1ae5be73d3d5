"""Attention by distance: the streamed per-bin sums against a dense computation, and the curve-shape
verdict.

The dense reference takes post-RoPE queries and keys from ``capture_qk``, builds every band logit
as a full ``[batch, head, band, q, k]`` einsum in float64 with the score scale and sliding window
read from HF's attention modules, and takes the attention probabilities from HF's own eager
forward (``output_attentions``), so soft-capping and learned sinks enter through HF's code.
"""

from __future__ import annotations

import functools
import math

import numpy as np
import pytest
import torch
from torch import Tensor
from transformers import AutoModelForCausalLM

import ropelens
from ropelens import Bands, Provenance
from ropelens.analyses.attention_by_distance import (
    AttentionByDistance,
    DistanceReducer,
    attention_by_distance,
    describe_curve,
    distance_bins,
)
from ropelens.analyses.decay import rope_decay_constant
from ropelens.errors import InputError
from ropelens.results.curves import decay_verdict
from ropelens.run.capture import LayerActs, capture_qk, stream
from ropelens.spec.reading import rope_spec
from ropelens.spec.rope import LayerRope, RopeSpec

N = 29  # not a multiple of any tile below; more than three sliding windows of 8
BANDS = Bands.quantiles(3)
KEYS = ("band_sum", "prob_sum", "count", "dist_sum", "n_queries")

# case -> how to build it: tiny families from ropelens.testing, the rest from the family matrix
CASES = {
    "llama-gqa": "tiny",  # 4 query heads over 2 KV heads
    "gemma3": "tiny",  # sliding window 8 on layers 0-2, global layer 3
    "gemma2": "family",  # attention-logit soft-capping, alternating windows
    "gpt_oss": "family",  # learned sinks, YaRN, alternating windows
}


@pytest.fixture(scope="module")
def case(tiny_dir, family_dir):
    """``case(name)``: (ropelens model, HF eager model) loaded from one saved directory."""

    @functools.cache
    def load(name: str):
        path = tiny_dir(name) if CASES[name] == "tiny" else family_dir(name)
        model = ropelens.load_model(path, device="cpu")
        hf = AutoModelForCausalLM.from_pretrained(path, attn_implementation="eager").eval()
        return model, hf

    return load


def _tokens(n: int = N) -> Tensor:
    toks = torch.randint(4, 101, (2, n), generator=torch.Generator().manual_seed(0))
    toks[:, 0] = 1
    return toks


def dense(model, hf, toks: Tensor, edges: Tensor, n_sink: int) -> dict[str, Tensor]:
    """Every per-bin sum, from full ``[q, k]`` tensors: band logits from captured q/k, probabilities
    from HF."""
    spec = rope_spec(model)
    acts = capture_qk(model, toks, which=("q_post", "k_post"))
    with torch.no_grad():
        probs = hf(toks, output_attentions=True).attentions
    out: dict[str, list[Tensor]] = {k: [] for k in KEYS}
    nb = len(edges) - 1
    for L in spec.rotary_layers:
        attn = hf.model.layers[L].self_attn
        q, k = acts[L]["q_post"].double(), acts[L]["k_post"].double()
        b, n, H, _ = q.shape
        k = k[:, :, torch.arange(H) // (H // k.shape[2])]  # query head h reads KV head h // group
        dims = BANDS.resolve(spec[L]).dims
        X = (
            torch.stack([torch.einsum("bqhd,bkhd->bhqk", q[..., dd], k[..., dd]) for dd in dims], 2)
            * attn.scaling
        )
        m, j = torch.arange(n)[:, None], torch.arange(n)[None]
        ok = j <= m
        window = getattr(attn, "sliding_window", None)
        if window:
            ok &= (m - j) < window
        w = ok & (j >= n_sink)
        which = torch.bucketize((m - j).clamp(min=0), edges, right=True) - 1
        P = probs[L].double()
        sel = torch.stack([w & (which == t) for t in range(nb)]).double()  # [nb, q, k]
        out["band_sum"].append(torch.einsum("bhcqk,tqk->hct", X, sel))
        out["prob_sum"].append(torch.einsum("bhqk,tqk->ht", P, sel))
        out["count"].append(sel.sum((1, 2)) * b)
        out["dist_sum"].append((sel * (m - j)).sum((1, 2)) * b)
        out["n_queries"].append(torch.tensor(float(b * n), dtype=torch.float64))
    return {k: torch.stack(v) for k, v in out.items()}


def reducer_sums(
    model, data, n_sink: int = 1, tile: int | None = None, max_distance: int = N - 1
) -> dict[str, Tensor]:
    spec = rope_spec(model)
    red = DistanceReducer(
        spec, spec.rotary_layers, BANDS, max_distance=max_distance, n_sink=n_sink, tile=tile
    )
    stream(model, data, [red], spec=spec, progress=False)
    return {k: v.double().cpu() for k, v in red.sums.items()}


def assert_sums(
    got: dict[str, Tensor], want: dict[str, Tensor], what: str, rtol=1e-4, atol=1e-5
) -> None:
    errors = []
    for key, w in want.items():
        try:
            torch.testing.assert_close(got[key], w, rtol=rtol, atol=atol)
        except AssertionError as e:
            errors.append(f"{key}: " + " ".join(str(e).split("\n")[1:4]))
    assert not errors, f"{what}:\n  " + "\n  ".join(errors)


# ============================================================================ bins
def test_bins_are_octaves_or_a_log_grid():
    assert distance_bins(511).tolist() == [0, 1, 2, 4, 8, 16, 32, 64, 128, 256, 512]
    assert distance_bins(300).tolist() == [0, 1, 2, 4, 8, 16, 32, 64, 128, 256, 301]
    assert distance_bins(0).tolist() == [0, 1]
    fine = distance_bins(511, 20)
    assert fine[:3].tolist() == [0, 1, 2] and int(fine[-1]) == 512 and len(fine) <= 21
    assert (fine.diff() > 0).all()
    assert distance_bins(3, 50).tolist() == [0, 1, 2, 3, 4]  # repeated edges merge
    for bad in ({"max_distance": -1}, {"max_distance": 2.5}, {"max_distance": 10, "n_bins": 1}):
        with pytest.raises(InputError):
            distance_bins(**bad)


# ============================================================================ describe_curve
X = np.arange(513, dtype=float)


def test_describe_monotone_and_flat_curves():
    down = describe_curve(np.exp(-X / 100), X)
    assert down.shape == "decays" and down.text.startswith(
        "monotone, decays: falls from 1.00 at δ = 0 to 0.00598 at δ = 512 (0.00598× its value"
    )
    assert describe_curve(1 - np.exp(-X / 100), X).shape == "grows"
    noisy = np.exp(-X / 100) + 0.01 * np.random.default_rng(0).standard_normal(
        X.size
    )  # wiggles under 10% of the range
    assert describe_curve(noisy, X).shape == "decays"
    flat = describe_curve(1 + 0.01 * np.sin(X), X)
    assert flat.shape == "flat" and "flat: stays within" in flat.text
    assert describe_curve(np.zeros(5), np.arange(5)).shape == "flat"
    assert describe_curve(1e-17 * np.arange(5), np.arange(5)).shape == "flat"
    # a curve that moves little against a given scale (another band's) is flat
    assert describe_curve(0.5 + 0.05 * np.exp(-X / 50), X, scale=10.0).shape == "flat"


def test_describe_u_shape_and_peak_name_their_extremum():
    u = describe_curve((np.log1p(X) - 3) ** 2, X)
    assert u.shape == "U-shaped" and u.min_at == 19.0 and u.turns == (19.0,)
    assert "minimum" in u.text and "δ = 19" in u.text and "rises again" in u.text
    assert describe_curve(-((np.log1p(X) - 3) ** 2), X).shape == "peaked"
    # a rise at the end below the margin is not a U; above it, it is
    small = np.concatenate([np.exp(-X[:400] / 50), np.exp(-8) + 0.05 * (X[400:] - 399) / 113])
    assert describe_curve(small, X).shape == "decays"
    big = np.concatenate([np.exp(-X[:400] / 50), np.exp(-8) + 0.6 * (X[400:] - 399) / 113])
    assert describe_curve(big, X).shape == "U-shaped"
    assert "the rise is 60% of the fall, at least the 50% a U-shape needs" in (
        describe_curve(big, X).text
    )
    # noise larger than the rise keeps it from counting
    assert describe_curve(big, X, noise=0.4).shape == "decays"
    # a rise above the margin that wins back less than half the fall is a decay that levels off
    part = np.concatenate([np.exp(-X[:400] / 50), np.exp(-8) + 0.15 * (X[400:] - 399) / 113])
    levels = describe_curve(part, X)
    assert levels.shape == "decays" and levels.min_at == 399.0
    assert "rises back only 15% of the fall" in levels.text and "a U-shape needs 50%" in levels.text
    assert describe_curve(part, X, recovery=0.1).shape == "U-shaped"
    assert describe_curve(-part, X).shape == "grows" and "a peak needs 50%" in (
        describe_curve(-part, X).text
    )


def test_describe_oscillation_gives_turns_and_envelope():
    osc = describe_curve(np.cos(X / 20) * np.exp(-X / 300), X)
    assert osc.shape == "oscillating" and len(osc.turns) >= 5
    assert abs(osc.upper[1]) < abs(osc.upper[0]) and abs(osc.lower[1]) < abs(
        osc.lower[0]
    )  # shrinking envelope
    assert osc.swings[-1] < osc.swings[0] and "envelope" in osc.text
    # a pure oscillation: a rank trend calls it flat, the description does not
    pure = rope_decay_constant(torch.tensor([2 * math.pi / 40]), 512)
    assert decay_verdict(pure).verdict == "flat"
    assert describe_curve(pure.mean, pure.distance).shape == "oscillating"
    # RoPE's constant-vector curve: not "flat", not monotone, an oscillation around a falling
    # midline
    rope = rope_decay_constant(1e5 ** (-torch.arange(32) / 32.0), 512).normalised()
    sh = describe_curve(rope.mean, rope.distance)
    assert (
        sh.shape == "oscillating"
        and "midline that falls" in sh.text
        and sh.midline[1] < sh.midline[0]
    )


def test_describe_log_scale_and_bad_input():
    p = np.array([0.5, 0.05, 0.01, 0.012, 0.03, 0.2])
    # linear: the rise is 39% of the fall
    assert describe_curve(p, np.arange(6)).shape == "decays"
    u = describe_curve(p, np.arange(6), log=True)  # log: ×20 back of ×50 down, 77% of the fall
    assert u.shape == "U-shaped" and u.min_value == 0.01
    assert describe_curve([1.0, 1.05, 1.02, 1.01], np.arange(4), log=True).shape == "flat"
    assert (
        describe_curve([1.0, np.nan, 0.5, 0.2, 0.1], np.arange(5)).shape == "decays"
    )  # NaN dropped
    with pytest.raises(InputError, match="same length"):
        describe_curve([1, 2, 3], [0, 1])
    with pytest.raises(InputError, match="at least 3"):
        describe_curve([1, 2], [0, 1])
    with pytest.raises(InputError, match="increase"):
        describe_curve([1, 2, 3], [0, 2, 1])
    with pytest.raises(InputError, match="positive"):
        describe_curve([1, 0, 3], [0, 1, 2], log=True)
    with pytest.raises(InputError, match="margin"):
        describe_curve([1, 2, 3], [0, 1, 2], margin=0)


# ====================================================================== against the dense reference
@pytest.mark.parametrize(
    ("name", "n_sink"),
    [
        ("llama-gqa", 0),
        ("llama-gqa", 1),
        ("gemma3", 1),
        ("gemma2", 0),
        ("gemma2", 1),
        ("gpt_oss", 1),
    ],
)
def test_sums_match_dense_reference(name, n_sink, case):
    """Band sums, probability sums, counts and distances per bin equal the dense computation (GQA,
    sliding windows, soft-capping, learned sinks; with and without the sink key)."""
    model, hf = case(name)
    toks = _tokens()
    got = reducer_sums(model, [toks], n_sink=n_sink)
    want = dense(model, hf, toks, distance_bins(N - 1), n_sink)
    assert_sums(got, want, f"{name} n_sink={n_sink}")
    if name in ("gemma3", "gpt_oss"):  # bins past the window stay empty in sliding layers
        spec = rope_spec(model)
        assert (
            got["count"][spec.kinds["sliding"][0], -1] == 0
            and got["count"][spec.kinds["full"][0], -1] > 0
        )


@pytest.mark.parametrize("name", ["gemma3", "gpt_oss"])
def test_tile_does_not_change_sums(name, case):
    model, _ = case(name)
    base = reducer_sums(model, [_tokens()])
    for tile in (1, 7, 4 * N):
        assert_sums(
            reducer_sums(model, [_tokens()], tile=tile),
            base,
            f"{name} tile={tile}",
            rtol=1e-5,
            atol=1e-6,
        )


@pytest.mark.parametrize("name", ["gemma3", "gpt_oss"])
def test_right_padding_equals_rows_alone(name, case):
    """A right-padded row counts exactly as the row run alone at its true length."""
    model, _ = case(name)
    toks = _tokens()
    length = 17
    toks[1, length:] = 3
    valid = torch.arange(N)[None] < torch.tensor([N, length])[:, None]
    padded = reducer_sums(model, [(toks, valid)], tile=7)
    alone = reducer_sums(model, [toks[:1], toks[1:, :length]], tile=7)
    assert_sums(padded, alone, f"{name}: padded vs rows alone", rtol=1e-5, atol=1e-5)


# ============================================================================ a planted U-shape
def planted(low: float, n: int = 256) -> AttentionByDistance:
    """One layer, two heads: three high-frequency planes with q = k (a decaying, oscillating Σcos)
    and one plane turning half a turn over ~300 tokens with q = −k (−cos(δθ) rises with δ): the sum
    is U-shaped, and the rise comes from the low plane."""
    theta = torch.tensor([1.0, 0.5, 0.25, math.pi / 300])
    lr = LayerRope(
        layer=0,
        inv_freq=theta,
        head_dim=8,
        rotary_dim=8,
        pairing="half",
        n_heads=2,
        n_kv_heads=1,
        score_scale=1.0,
    )
    spec = RopeSpec("planted", "test", (lr,), n)
    qv, kv = torch.tensor([1.0, 1, 1, low, 0, 0, 0, 0]), torch.tensor([1.0, 1, 1, -low, 0, 0, 0, 0])
    pos = torch.arange(n)
    q = lr.rotate(qv.expand(2, n, 8), pos).transpose(0, 1)[None]
    k = lr.rotate(kv.expand(1, n, 8), pos).transpose(0, 1)[None]
    red = DistanceReducer(
        spec, [0], Bands.explicit({"high": [0, 1, 2], "low": [3]}), max_distance=n - 1, n_sink=0
    )
    red.update(LayerActs(0, lr, torch.ones(1, n, dtype=torch.bool), {"q_post": q, "k_post": k}))
    return red.result(Provenance(model="planted"))


def test_planted_u_shape_is_found_and_blamed_on_the_low_band():
    r = planted(1.5)
    # the band curves are exact: the low plane gives −c²·cos(δθ), averaged over each bin's n − δ
    # pairs per δ
    d = torch.arange(256, dtype=torch.float64)
    low, pairs = -2.25 * torch.cos(d * math.pi / 300), 256 - d
    e = r.edges
    want = torch.stack(
        [
            (low * pairs)[e[j] : e[j + 1]].sum() / pairs[e[j] : e[j + 1]].sum()
            for j in range(r.n_bins)
        ]
    )
    torch.testing.assert_close(r.curve(0, "low"), want, rtol=1e-5, atol=1e-5)
    sh = r.describe(0, "logit")
    assert sh.shape == "U-shaped" and 4 <= sh.min_at <= 64
    assert r.describe(0, "low").shape == "grows"
    cause = r.u_shape_cause(0)
    assert cause["cause"] == "low" and cause["band_share"]["low"] > 0.5
    assert sum(cause["band_share"].values()) == pytest.approx(
        1.0
    )  # the band rises add up to the full rise
    frame = r.shapes()
    assert frame.set_index("curve").loc["logit", "u_cause"] == "low"
    assert "band low carries" in next(f.text for f in r.findings() if f.key == "distance-layer-0")
    # keep only the high frequencies (HoPE): the U is gone
    high_only = planted(0.0)
    assert high_only.describe(0, "logit").shape != "U-shaped" and high_only.u_shape_cause(0) is None


# =================================================================== the entry point and the result
def test_entry_point_result_roundtrip_and_merge(case, tmp_path):
    model, _ = case("gemma3")
    toks = torch.randint(4, 101, (4, 24), generator=torch.Generator().manual_seed(1))
    toks[:, 0] = 1
    r = attention_by_distance(model, toks, layers=[0, 3], bands=BANDS, progress=False)
    assert r.layers == (0, 3) and r.edges.tolist() == [0, 1, 2, 4, 8, 16, 24]
    assert r.provenance.n_tokens == toks.numel() and r.provenance.config["n_sink"] == 1
    torch.testing.assert_close(r.logit(), r.band_logit().sum(2), equal_nan=True)
    # mass: each query's attention off the sink key, spread over the bins, sums to at most 1
    assert (r.mass().nansum(-1) <= 1 + 1e-6).all()
    assert torch.isnan(
        r.prob()[0, :, -1]
    ).all()  # layer 0 is sliding (window 8): no pairs at δ ≥ 16
    a = attention_by_distance(model, toks[:2], layers=[0, 3], bands=BANDS, progress=False)
    b = attention_by_distance(model, toks[2:], layers=[0, 3], bands=BANDS, progress=False)
    merged = a.merge(b)
    # each window's terms are float32 (the model's activations) and windows add in float64, so a
    # batch split moves only float32 rounding inside a window: ~1e-7 relative per term, 1e-5 is
    # ample
    for key in r.sums:
        torch.testing.assert_close(merged.sums[key], r.sums[key], rtol=1e-5, atol=1e-6)
    assert merged.provenance.n_tokens == r.provenance.n_tokens
    r.save(tmp_path / "d.json")
    back = AttentionByDistance.load(tmp_path / "d.json")
    assert (
        back.layers == r.layers
        and back.band_names == r.band_names
        and torch.equal(back.edges, r.edges)
    )
    for key in r.sums:
        torch.testing.assert_close(back.sums[key], r.sums[key])
    frame = r.to_frame()
    H = rope_spec(model)[0].n_heads
    assert len(frame) == 2 * H * r.n_bins * (len(r.band_names) + 2)
    assert set(frame.curve) == {*r.band_names, "logit", "prob"}
    shapes = r.shapes()
    assert {"layer", "curve", "shape", "text", "u_cause"} <= set(shapes.columns)
    assert len(r.shapes(heads=True)) > len(shapes)
    fig = r.figure()
    assert len(fig.data) == 2 * (len(r.band_names) + 2) and fig.layout.xaxis.type == "log"
    assert r._repr_mimebundle_()["text/plain"].startswith("AttentionByDistance")


def test_bad_input_is_named(case, tmp_path):
    model, _ = case("llama-gqa")
    spec = rope_spec(model)
    red = DistanceReducer(spec, [0], BANDS, max_distance=10)
    with pytest.raises(InputError, match="max_distance ≥ 28"):
        stream(model, [_tokens()], [red], layers=[0], spec=spec, progress=False)
    with pytest.raises(InputError, match="tile"):
        DistanceReducer(spec, [0], BANDS, tile=0)
    with pytest.raises(InputError, match="n_sink"):
        DistanceReducer(spec, [0], BANDS, n_sink=-1)
    toks = _tokens()
    r = attention_by_distance(model, toks, bands=BANDS, progress=False)
    with pytest.raises(InputError, match="unknown curve"):
        r.curve(0, "Q9")
    with pytest.raises(InputError, match="not measured"):
        r.curve(7)
    other = attention_by_distance(model, toks, bands=BANDS, n_sink=0, progress=False)
    with pytest.raises(InputError, match="merge"):
        r.merge(other)
    (tmp_path / "x.json").write_text('{"type": "BandStatistics"}')
    with pytest.raises(InputError, match="does not hold AttentionByDistance"):
        AttentionByDistance.load(tmp_path / "x.json")
