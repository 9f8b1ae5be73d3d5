"""Attention sinks: the streamed per-head sums against a dense computation from HF's eager
attention.

The dense reference takes HF's attention probabilities (``output_attentions``: soft-capping and
learned sinks applied by HF's code) for the attention to position 0, and builds the band logits
from ``capture_qk``'s post-RoPE queries and keys as full ``[batch, head, band, q, k]`` einsums in
float64, with the score scale and sliding window read from HF's attention modules; key norms come
from the captured pre-RoPE keys.
"""

from __future__ import annotations

import functools
import math

import pytest
import torch
from torch import Tensor
from transformers import AutoModelForCausalLM

import ropelens
from ropelens import Bands, Provenance
from ropelens.analyses.attention_sinks import AttentionSinks, SinkReducer, attention_sinks
from ropelens.analyses.frequency_usage import frequency_usage
from ropelens.errors import InputError
from ropelens.run.capture import LayerActs, capture_qk, stream
from ropelens.spec.reading import rope_spec
from ropelens.spec.rope import LayerRope, RopeSpec

N = 29
EPS = 0.3
SKIP = 4
BANDS = Bands.quantiles(3)
CASES = {"llama-gqa": "tiny", "gemma3": "tiny", "gemma2": "family", "gpt_oss": "family"}


@pytest.fixture(scope="module")
def case(tiny_dir, family_dir):
    """``case(name)``: (ropelens model, HF eager model) loaded from one saved directory."""

    @functools.cache
    def load(name: str):
        path = tiny_dir(name) if CASES[name] == "tiny" else family_dir(name)
        return ropelens.load_model(path, device="cpu"), AutoModelForCausalLM.from_pretrained(
            path, attn_implementation="eager"
        ).eval()

    return load


def _tokens(n: int = N) -> Tensor:
    toks = torch.randint(4, 101, (2, n), generator=torch.Generator().manual_seed(0))
    toks[:, 0] = 1
    return toks


def dense(model, hf, toks: Tensor) -> dict[int, dict[str, Tensor]]:
    """Per rotary layer, every statistic the result reports, from full tensors."""
    spec = rope_spec(model)
    acts = capture_qk(model, toks, which=("q_post", "k_post", "k_pre"))
    with torch.no_grad():
        probs = hf(toks, output_attentions=True).attentions
    out = {}
    for L in spec.rotary_layers:
        attn = hf.model.layers[L].self_attn
        q, k = acts[L]["q_post"].double(), acts[L]["k_post"].double()
        b, n, H, _ = q.shape
        k = k[:, :, torch.arange(H) // (H // k.shape[2])]
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
        used = (torch.arange(n) >= SKIP) & ok[:, 0]  # queries from SKIP on that see position 0
        nq = used.sum() * b
        P = probs[L].double()
        p0 = P[..., 0]  # [b,H,n]
        others = ok & (j > 0)
        xo = (X * others).sum(-1) / others.sum(-1).clamp(
            min=1
        )  # [b,H,B,n]: mean band logit over the other keys
        kp = acts[L]["k_pre"].double()  # [b,n,KV,d]
        band_norm = torch.stack([kp[..., dd].norm(dim=-1) for dd in dims], -1)  # [b,n,KV,B]
        P_ = spec[L].n_planes
        planes = torch.stack(
            [torch.hypot(kp[..., i], kp[..., i + P_]) for i in range(P_)], -1
        )  # half pairing
        out[L] = {
            "mean_attention": (p0 * used).sum((0, 2)) / nq,
            "query_share": ((p0 > EPS) & used).double().sum((0, 2)) / nq,
            "n_queries": nq,
            "learned_sink": ((1 - P.sum(-1)) * used).sum((0, 2)) / nq,
            "sink_logit": ((X[..., 0] - xo) * used).sum((0, 3)) / nq,
            "key_sink": band_norm[:, 0].mean(0),
            "key_other": band_norm[:, 1:].mean((0, 1)),
            "plane_ratio": planes[:, 0].mean(0).mean() / planes[:, 1:].mean((0, 1)).mean(),
            "borderline": ((p0 - EPS).abs() < 1e-5).sum(),
        }
    return out


def run(model, data, tile=None, **kw) -> AttentionSinks:
    spec = rope_spec(model)
    red = SinkReducer(
        spec, spec.rotary_layers, BANDS, epsilon=EPS, skip_queries=SKIP, tile=tile, **kw
    )
    stream(model, data, [red], spec=spec, progress=False)
    return red.result(Provenance(model="test"))


# ====================================================================== against the dense reference
@pytest.mark.parametrize("name", list(CASES))
def test_matches_dense_reference(name, case):
    """Attention to position 0, share of queries above ε, learned-sink mass, the band decomposition
    of the sink logit and the key norms equal the dense computation (GQA, sliding windows,
    soft-capping, learned sinks)."""
    model, hf = case(name)
    toks = _tokens()
    r = run(model, [toks])
    ref = dense(model, hf, toks)
    for i, L in enumerate(r.layers):
        want = ref[L]
        close = functools.partial(
            torch.testing.assert_close,
            rtol=1e-4,
            atol=1e-6,
            msg=lambda m, L=L: f"{name} layer {L}: {m}",
        )
        close(r.mean_attention()[i], want["mean_attention"])
        # counts of queries above ε agree, up to queries whose attention lies within 1e-5 of ε
        flips = ((r.query_share()[i] - want["query_share"]) * want["n_queries"]).abs().round()
        assert int(flips.max()) <= int(want["borderline"]), f"{name} layer {L}: query shares differ"
        close(r.learned_sink()[i], want["learned_sink"])
        close(r.sink_logit()[i], want["sink_logit"])
        close(r.key_norm("sink")[i], want["key_sink"])
        close(r.key_norm("other")[i], want["key_other"])
        close(r.plane_key_ratio()[i], want["plane_ratio"])
    if name == "gpt_oss":  # the learned sink takes attention; elsewhere it is exactly 0
        assert (r.learned_sink() > 0.01).all()
    else:
        assert (r.learned_sink() == 0).all()
    if name == "gemma3":  # sliding layers: only queries 4..7 see position 0 (window 8)
        spec = rope_spec(model)
        assert r.sums["n_queries"][spec.kinds["sliding"][0]] == 2 * (8 - SKIP)
        assert r.sums["n_queries"][spec.kinds["full"][0]] == 2 * (N - SKIP)


def test_tiles_and_padding_do_not_change_sums(case):
    model, _ = case("gpt_oss")
    base = run(model, [_tokens()])
    for tile in (1, 5, N, 4 * N):
        got = run(model, [_tokens()], tile=tile)
        for key, v in base.sums.items():
            torch.testing.assert_close(
                got.sums[key],
                v,
                rtol=1e-5,
                atol=1e-6,
                msg=lambda m, t=tile, k=key: f"tile {t} {k}: {m}",
            )
    toks = _tokens()
    length = 17
    toks[1, length:] = 3
    valid = torch.arange(N)[None] < torch.tensor([N, length])[:, None]
    padded = run(model, [(toks, valid)], tile=5)
    alone = run(model, [toks[:1], toks[1:, :length]], tile=5)
    for key, v in alone.sums.items():
        torch.testing.assert_close(
            padded.sums[key], v, rtol=1e-5, atol=1e-5, msg=lambda m, k=key: f"padded {k}: {m}"
        )


def test_plane_key_ratio_is_the_usage_sink_ratio(case):
    """The per-plane key ratio at position 0 is the one frequency usage reports for its sink
    position."""
    model, _ = case("llama-gqa")
    toks = _tokens()
    r = attention_sinks(model, toks, bands=BANDS, progress=False)
    usage = frequency_usage(model, toks, n_sink=1, progress=False)
    torch.testing.assert_close(
        r.plane_key_ratio().float(), usage.sink_ratios()["k"], rtol=1e-5, atol=1e-6
    )


# ============================================================================ a planted sink
def test_planted_sink_is_found_and_blamed_on_its_band():
    """Key 0 carries a large component in the lowest plane that every query shares; the other keys
    are random. Every head sinks, and the lowest band holds the sink logit."""
    n, d = 64, 8
    theta = torch.tensor([1.0, 0.3, 0.1, 1e-4])
    lr = LayerRope(
        layer=0,
        inv_freq=theta,
        head_dim=d,
        rotary_dim=d,
        pairing="half",
        n_heads=2,
        n_kv_heads=1,
        score_scale=1.0,
    )
    spec = RopeSpec("planted", "test", (lr,), n)
    g = torch.Generator().manual_seed(0)
    q_pre = torch.randn(1, n, 2, d, generator=g) * 0.3
    k_pre = torch.randn(1, n, 1, d, generator=g) * 0.3
    q_pre[..., 3] += 3.0  # every query points along plane 3's x axis
    k_pre[:, 0, :, 3] = 3.0  # so does key 0: logit ≈ 9 there, ≈ 0 elsewhere
    pos = torch.arange(n)

    def rot(x):
        return lr.rotate(x.transpose(1, 2), pos).transpose(1, 2)

    acts = LayerActs(
        0,
        lr,
        torch.ones(1, n, dtype=torch.bool),
        {"q_post": rot(q_pre), "k_post": rot(k_pre), "k_pre": k_pre},
    )
    red = SinkReducer(spec, [0], Bands.explicit({"high": [0, 1, 2], "low": [3]}))
    red.update(acts)
    r = red.result(Provenance(model="planted"))
    assert r.sinking().all() and float(r.head_share()[0]) == 1.0
    assert (r.mean_attention() > 0.5).all() and (r.query_share() > 0.9).all()
    share = r.sink_logit_share()[0]  # [head, band]
    assert (share[:, 1] > 0.9).all()
    assert (r.key_norm_ratio()[0, 0, 1] > 5).all()
    assert "All 2 heads sink" in r.findings()[0].text and "band low" in r.findings()[1].text


# =================================================================== the entry point and the result
def test_entry_point_result_roundtrip_and_merge(case, tmp_path):
    model, _ = case("gemma3")
    toks = torch.randint(4, 101, (4, 24), generator=torch.Generator().manual_seed(1))
    toks[:, 0] = 1
    r = attention_sinks(model, toks, bands=BANDS, progress=False)
    assert r.provenance.config["epsilon"] == 0.3 and r.provenance.n_tokens == toks.numel()
    torch.testing.assert_close(r.sink_logit_share().sum(-1), torch.ones(4, 4, dtype=torch.float64))
    a = attention_sinks(model, toks[:2], bands=BANDS, progress=False)
    b = attention_sinks(model, toks[2:], bands=BANDS, progress=False)
    merged = a.merge(b)
    # windows add in float64; a batch of 2 against 4 moves only float32 rounding inside the model's
    # kernels (softmax, matmul: ~1 ulp, 6e-8 relative per term), so 1e-5 leaves two orders of margin
    for key in r.sums:
        torch.testing.assert_close(merged.sums[key], r.sums[key], rtol=1e-5, atol=1e-6)
    r.save(tmp_path / "s.json")
    back = AttentionSinks.load(tmp_path / "s.json")
    assert (back.layers, back.band_names, back.epsilon, back.skip_queries) == (
        r.layers,
        r.band_names,
        0.3,
        4,
    )
    for key in r.sums:
        torch.testing.assert_close(back.sums[key], r.sums[key])
    frame = r.to_frame()
    assert len(frame) == 4 * 4 * len(r.band_names)
    assert {"sink_logit", "sink_logit_share", "key_norm_ratio", "mean_attention", "sinking"} <= set(
        frame.columns
    )
    heads = r.heads_frame()
    assert len(heads) == 16 and set(heads.top_band) <= set(r.band_names)
    layers = r.layers_frame()
    assert list(layers.layer) == [0, 1, 2, 3] and layers.sinking_share.between(0, 1).all()
    assert len(r.findings()) >= 2
    assert len(r.figure().data) == 4
    assert r._repr_mimebundle_()["text/plain"].startswith("AttentionSinks")
    with pytest.raises(InputError, match="merge"):
        r.merge(attention_sinks(model, toks, bands=BANDS, epsilon=0.5, progress=False))
    (tmp_path / "x.json").write_text('{"type": "FrequencyUsage"}')
    with pytest.raises(InputError, match="does not hold AttentionSinks"):
        AttentionSinks.load(tmp_path / "x.json")


def test_bad_settings_are_named():
    lr = LayerRope(
        layer=0,
        inv_freq=torch.tensor([1.0]),
        head_dim=2,
        rotary_dim=2,
        pairing="half",
        n_heads=1,
        n_kv_heads=1,
        score_scale=1.0,
    )
    spec = RopeSpec("x", "test", (lr,), 16)
    for kw, msg in (
        ({"epsilon": 0}, "epsilon"),
        ({"epsilon": 1.5}, "epsilon"),
        ({"skip_queries": 0}, "skip_queries"),
        ({"tile": 0}, "tile"),
    ):
        with pytest.raises(InputError, match=msg):
            SinkReducer(spec, [0], Bands.all(), **kw)
    with pytest.raises(InputError, match="no layers"):
        SinkReducer(spec, [], Bands.all())
    assert math.isclose(SinkReducer(spec, [0], Bands.all()).epsilon, 0.3)


# ============================================================================ SmolLM2
@pytest.mark.integration
def test_smollm2_sink_heads(smollm2):
    """SmolLM2-135M over two 256-token windows of the embedded English corpus: no head sinks in the
    first layers, most heads of the upper half do, the lowest band carries their sink logit, and the
    sink key is smaller than the other keys (ratio below 1), as frequency usage also reports."""
    r = attention_sinks(smollm2, "english", n_ctx=256, max_tokens=512, progress=False)
    share = r.head_share()
    print("sinking-head share per layer:", [round(float(s), 2) for s in share])
    print("\n".join(f.text for f in r.findings()))
    assert float(share[:2].max()) == 0.0
    assert float(share[15:].mean()) > 0.5
    x = r.sink_logit()[r.sinking()].mean(0)
    assert int(x.argmax()) == len(r.band_names) - 1  # Q4, the lowest frequencies
    assert float(r.plane_key_ratio()[12:].max()) < 1.0
