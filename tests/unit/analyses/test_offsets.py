"""Partial-cycle planes, rotary outliers and offset angles: planted offsets recovered, a dense
recomputation from captured q/k and HF's eager attention, and SmolLM2's partial-cycle planes."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from ropelens import capture_qk, rope_spec
from ropelens.analyses.rotary_offsets import (
    OffsetReducer,
    RotaryOffsets,
    partial_cycle_planes,
    rotary_offsets,
)
from ropelens.errors import InputError
from ropelens.results.provenance import Provenance
from ropelens.run import data
from ropelens.run.capture import LayerActs
from ropelens.spec.rope import LayerRope, RopeSpec
from ropelens.testing import tiny_hf_model

TWO_PI = 2 * math.pi


# ------------------------------------------------------------------ which planes are partial-cycle
def test_partial_cycle_planes_by_hand(tiny):
    # tiny Llama: base 1e4, head dim 16, 256 tokens: λ_i = 2π·10^(i/2) > 256 from plane 4 on
    flags = partial_cycle_planes(rope_spec(tiny("llama-gqa")))
    want = [TWO_PI * 10 ** (i / 2) > 256 for i in range(8)]
    assert want == [False] * 4 + [True] * 4
    assert flags.tolist() == [want, want]
    assert partial_cycle_planes(rope_spec(tiny("llama-gqa")), train_ctx=10_000).tolist()[0] == [
        False
    ] * 7 + [True]
    # tiny Gemma 3: sliding layers (base 1e4) never see a distance past their window of 8 tokens;
    # the global layer (base 1e6) sees the whole 256
    g = partial_cycle_planes(rope_spec(tiny("gemma3")))
    local = [TWO_PI * 1e4 ** (i / 8) > 8 for i in range(8)]
    full = [TWO_PI * 1e6 ** (i / 8) > 256 for i in range(8)]
    assert local == [False] + [True] * 7 and full == [False] * 3 + [True] * 5
    assert g.tolist() == [local, local, local, full]
    with pytest.raises(InputError, match="train_ctx must be a positive int"):
        partial_cycle_planes(rope_spec(tiny("llama")), train_ctx=0)


# ------------------------------------------------------------------ planted offsets
def toy_rope() -> LayerRope:
    """4 planes (base 100), 4 query heads over 2 KV heads, unit score scale."""
    d = 8
    return LayerRope(
        layer=0,
        inv_freq=100.0 ** (-torch.arange(0, d, 2, dtype=torch.float64) / d),
        head_dim=d,
        rotary_dim=d,
        pairing="half",
        n_heads=4,
        n_kv_heads=2,
        score_scale=1.0,
        base=100.0,
        n_ctx=64,
    )


def polar(r, a) -> torch.Tensor:
    a = torch.as_tensor(a, dtype=torch.float64)
    return torch.stack([r * torch.cos(a), r * torch.sin(a)], -1)


def set_plane(x: torch.Tensor, plane: int, xy: torch.Tensor) -> None:
    """Write plane coordinates into half-paired head vectors (dims i and i + 4)."""
    x[..., plane], x[..., plane + 4] = xy[..., 0], xy[..., 1]


ALPHA = {
    0: 0.7,
    1: -1.2,
}  # heads 0, 1 (KV head 0): post-RoPE offset in plane 3 towards the sink key
BETA = 2.0  # head 3 (KV head 1): post-RoPE angle in plane 2 at the previous token


def planted(b: int = 2, n: int = 16, seed: int = 0) -> tuple[LayerRope, LayerActs]:
    """Post-RoPE q/k with known attended keys and angles; pre-RoPE is their exact un-rotation.

    KV head 0 carries a sink key: position 0 has norm 50 in plane 3 at angle 0.3, and heads 0 and 1
    meet it at angles ALPHA from every query (norm 3: an outlier plane). KV head 1 makes a
    previous-token head from plane 0 (key n at angle n·2π/n_ctx), and in plane 2 head 3 meets the
    previous key at angle BETA with a norm too small to change which key wins.
    """
    rope = toy_rope()
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(b, n, 4, 8, generator=g, dtype=torch.float64) * 0.01
    k = torch.randn(b, n, 2, 8, generator=g, dtype=torch.float64) * 0.01
    m = torch.arange(n, dtype=torch.float64)
    set_plane(k[:, 0, 0], 3, polar(50.0, 0.3).expand(b, 2))
    for h, a in ALPHA.items():
        set_plane(q[:, :, h], 3, polar(3.0, torch.full((n,), 0.3 - a)).expand(b, n, 2))
    omega = TWO_PI / n
    set_plane(k[:, :, 1], 0, polar(5.0, m * omega).expand(b, n, 2))
    for h in (2, 3):
        set_plane(q[:, :, h], 0, polar(5.0, (m - 1) * omega).expand(b, n, 2))
    ang_k2 = torch.rand(b, n, generator=g, dtype=torch.float64) * TWO_PI
    set_plane(k[:, :, 1], 2, polar(1.0, ang_k2))
    prev = torch.cat(
        [ang_k2[:, :1], ang_k2[:, :-1]], 1
    )  # angle of the key each query attends (m − 1; 0 for m = 0)
    set_plane(q[:, :, 3], 2, polar(0.05, prev - BETA))
    pos = torch.arange(n)

    def un(x):
        return rope.rotate(x.transpose(1, 2), -pos).transpose(1, 2)

    tensors = {
        "q_post": q.float(),
        "k_post": k.float(),
        "q_pre": un(q).float(),
        "k_pre": un(k).float(),
    }
    return rope, LayerActs(
        layer=0, rope=rope, valid=torch.ones(b, n, dtype=torch.bool), tensors=tensors
    )


def toy_spec(rope: LayerRope) -> RopeSpec:
    return RopeSpec(model_name="toy", architecture="toy", layers=(rope,), n_ctx=rope.n_ctx)


def test_planted_offsets_are_recovered():
    rope, acts = planted()
    b, n = acts.valid.shape
    red = OffsetReducer(toy_spec(rope), [0])
    att = red.attended(rope, acts["q_post"], acts["k_post"], acts.valid)
    assert (att[:, :, :2] == 0).all()
    prev = (torch.arange(n) - 1).clamp(min=0)
    assert (att[:, :, 2:] == prev[None, :, None]).all()
    red.update(acts)
    res = red.result(Provenance(model="toy"))

    for h, a in ALPHA.items():  # every query meets the sink at the planted angle
        assert res.mean_angle("post", "sink")[0, h, 3].item() == pytest.approx(a, abs=1e-5)
        assert res.resultant_length("post", "sink")[0, h, 3].item() == pytest.approx(1.0, abs=1e-6)
        assert math.isnan(
            res.resultant_length("post", "content")[0, h, 3].item()
        )  # no other attended key
        # pre-RoPE (content) angle: Δ_pre = Δ_post + (m − n)·θ₃, spread over the queries m = 1 … n−1
        z = torch.exp(
            1j * (a + torch.arange(1, n, dtype=torch.float64) * rope.inv_freq[3].double())
        ).mean()
        assert res.mean_angle("pre")[0, h, 3].item() == pytest.approx(
            math.atan2(z.imag, z.real), abs=1e-4
        )
        assert res.resultant_length("pre")[0, h, 3].item() == pytest.approx(abs(z).item(), abs=1e-5)
    assert res.sink_fraction()[0, :2].tolist() == [1.0, 1.0]
    assert res.sink_fraction()[0, 2:].tolist() == pytest.approx([1 / (n - 1)] * 2)
    assert res.sums["n/content"][0].tolist() == [0, 0, b * (n - 2), b * (n - 2)]
    # the previous-token head: plane 0 aligned (angle 0), head 3's plane 2 at BETA, both with R = 1
    assert res.mean_angle("post", "content")[0, 2:, 0].abs().max().item() < 1e-5
    assert res.mean_angle("post", "content")[0, 3, 2].item() == pytest.approx(BETA, abs=1e-5)
    assert res.resultant_length("post", "content")[0, 3, 2].item() == pytest.approx(1.0, abs=1e-6)
    # outliers: plane 3 of heads 0, 1 has norm 3 against ~0.01 elsewhere; the sink key (position 0)
    # is left out of the norms, so KV head 0 shows no outlier
    assert (res.outlier_ratio("q")[0, :2, 3] > 100).all() and (
        res.outlier_ratio("q")[0, :2, :3] < 3
    ).all()
    assert res.norm("q")[0, 0, 3].item() == pytest.approx(3.0, rel=1e-5)
    assert res.outlier_ratio("k")[0, 0].max().item() < 5
    # the plane's logit at the attended key: ‖q‖‖k‖cos α
    for h, a in ALPHA.items():
        assert res.mean_term("sink")[0, h, 3].item() == pytest.approx(
            3 * 50 * math.cos(a), rel=1e-3
        )


def test_padding_and_merge():
    rope, acts = planted(b=2, n=16, seed=1)
    full = OffsetReducer(toy_spec(rope), [0])
    full.update(acts)
    halves = []
    for sl in (slice(0, 1), slice(1, 2)):
        r = OffsetReducer(toy_spec(rope), [0])
        r.update(LayerActs(0, rope, acts.valid[sl], {k: v[sl] for k, v in acts.tensors.items()}))
        halves.append(r.result(Provenance(model="toy", n_tokens=16)))
    merged = halves[0].merge(halves[1])
    want = full.result(Provenance(model="toy"))
    # the same per-window float32 terms, added in float64 in another order: float64's default
    # tolerance
    for key, v in want.sums.items():
        torch.testing.assert_close(merged.sums[key], v)
    torch.testing.assert_close(merged.q.total, want.q.total)
    assert merged.provenance.n_tokens == 32
    # right padding: the last 5 positions of window 1 count nowhere, and no query attends them
    valid = acts.valid.clone()
    valid[1, -5:] = False
    red = OffsetReducer(toy_spec(rope), [0])
    red.update(LayerActs(0, rope, valid, acts.tensors))
    res = red.result(Provenance(model="toy"))
    assert (res.sums["n/sink"] + res.sums["n/content"])[0].tolist() == [15 + 10] * 4
    assert res.q.count[0, 0, 0].item() == 25
    with pytest.raises(InputError, match="same layers"):
        halves[0].merge(RotaryOffsets(**{**halves[1].__dict__, "n_sink": 2}))


# ------------------------------------------------------------------ against a dense recomputation
def dense(kept, attentions, spec, n_sink=1):
    """Per layer: q/k plane norms and the complex mean of exp(iΔ) at HF's argmax key, per scope."""
    out = {}
    for L, acts in kept.items():
        rope = spec[L]
        P, G = rope.n_planes, rope.group_size
        att = attentions[L].argmax(-1).transpose(1, 2)  # [b, n, H]

        def qz(x, P=P):
            return torch.complex(x[..., :P].double(), x[..., P : 2 * P].double())

        res = {}
        for src in ("post", "pre"):
            q, k = acts[f"q_{src}"], acts[f"k_{src}"].repeat_interleave(G, dim=2)
            b, n, H, _ = q.shape
            ka = torch.stack(
                [
                    torch.stack([k[i, att[i, m], torch.arange(H)] for m in range(n)])
                    for i in range(b)
                ]
            )
            u = qz(ka) * qz(q).conj()
            u = u / u.abs()
            keep = (torch.arange(n) >= n_sink)[None, :, None].expand(b, n, H)
            sink = att < n_sink
            for scope, sel in (("all", keep), ("sink", keep & sink), ("content", keep & ~sink)):
                w = sel[..., None].double()
                res[(src, scope)] = (u * w).sum((0, 1)) / w.sum((0, 1))
        norms = {
            w: torch.hypot(acts[w][..., :P], acts[w][..., P : 2 * P])[:, n_sink:]
            .double()
            .mean((0, 1))
            for w in ("q_post", "k_post")
        }
        out[L] = (res, norms, att)
    return out


@pytest.mark.parametrize("family", ["llama-gqa", "gemma3"])
def test_matches_dense_recomputation_with_hf_attention(tiny, family):
    model = tiny(family)
    tokens = data.windows(data.english(), model.tokenizer, 40, n_windows=3)
    res = rotary_offsets(model, tokens, batch_size=2, progress=False)
    spec = rope_spec(model)
    kept = capture_qk(model, tokens)
    hf = tiny_hf_model(family)  # the same seed: the weights the bridge wraps
    wrapped = {
        k.replace("._original_component", ""): v
        for k, v in model.original_model.state_dict().items()
    }
    assert all(torch.equal(v, wrapped[k]) for k, v in hf.state_dict().items())
    with torch.no_grad():
        attentions = hf(input_ids=tokens, output_attentions=True).attentions
    red = OffsetReducer(spec, res.layers)
    for i, (L, (stats, norms, att)) in enumerate(dense(kept, attentions, spec).items()):
        acts = kept[L]
        assert torch.equal(red.attended(spec[L], acts["q_post"], acts["k_post"], acts.valid), att)
        for (src, scope), z in stats.items():
            got = res.resultant(src, scope)[i]
            torch.testing.assert_close(got[..., 0], z.real, atol=1e-5, rtol=0, equal_nan=True)
            torch.testing.assert_close(got[..., 1], z.imag, atol=1e-5, rtol=0, equal_nan=True)
        torch.testing.assert_close(res.norm("q")[i].double(), norms["q_post"], rtol=1e-5, atol=1e-7)
        torch.testing.assert_close(res.norm("k")[i].double(), norms["k_post"], rtol=1e-5, atol=1e-7)
        m = norms["q_post"].numpy()
        ratio = np.array(
            [
                [m[h, p] / np.median(np.delete(m[h], p)) for p in range(m.shape[1])]
                for h in range(m.shape[0])
            ]
        )
        # numpy's median of an even count averages the middle two; ropelens takes the lower one
        lower = np.array(
            [
                [
                    m[h, p] / np.sort(np.delete(m[h], p))[(m.shape[1] - 2) // 2]
                    for p in range(m.shape[1])
                ]
                for h in range(m.shape[0])
            ]
        )
        np.testing.assert_allclose(res.outlier_ratio("q")[i].numpy(), lower, rtol=1e-5)
        assert np.allclose(ratio, lower, rtol=0.5)


def test_result_roundtrip_figure_and_errors(tiny, tmp_path):
    model = tiny("llama-gqa")
    tokens = data.windows(data.english(), model.tokenizer, 32, n_windows=2)
    res = rotary_offsets(model, tokens, progress=False)
    res.save(tmp_path / "o.json")
    back = RotaryOffsets.load(tmp_path / "o.json")
    assert back.to_frame().equals(res.to_frame())
    df = res.to_frame()
    assert len(df) == 2 * 4 * 8 and (df["kv_head"] == df["head"] // 2).all()
    assert df.loc[df["partial_cycle"], "plane"].unique().tolist() == [4, 5, 6, 7]
    assert set(res.summary().index) == {"partial cycle", "full cycle"}
    assert len(res.figure().data) == 3 and len(res.figure(layer=1).data) == 3
    assert res.provenance.n_tokens == 64 and res.provenance.config["train_ctx"] == 256
    no_pre = rotary_offsets(model, tokens, pre=False, progress=False)
    torch.testing.assert_close(no_pre.resultant("post"), res.resultant("post"))
    for call, match in [
        (lambda: no_pre.resultant("pre"), "source must be 'post' or 'pre'"),
        (lambda: res.resultant("post", "everything"), "scope must be"),
        (lambda: res.norm("v"), "which must be 'q' or 'k'"),
        (lambda: res.heatmap("q_ratio", layer=5), "layer 5 was not measured"),
        (lambda: res.heatmap("nonsense"), "what must be one of"),
        (lambda: rotary_offsets(model, tokens, n_sink=-1, progress=False), "n_sink must be an int"),
        (
            lambda: rotary_offsets(model, tokens, train_ctx=0, progress=False),
            "train_ctx must be a positive int",
        ),
    ]:
        with pytest.raises(InputError, match=match):
            call()


# ------------------------------------------------------------------ SmolLM2
@pytest.mark.integration
def test_smollm2_partial_cycle_planes(smollm2):
    res = rotary_offsets(smollm2, "english", n_ctx=256, max_tokens=3 * 256, progress=False)
    theta = 100000.0 ** (-torch.arange(0, 64, 2, dtype=torch.float64) / 64)  # base 1e5, head dim 64
    want = (TWO_PI / theta > 8192).tolist()
    assert sum(want) == 12 and want == [False] * 20 + [True] * 12
    assert res.train_ctx == 8192 and len(res.layers) == 30
    assert res.partial_cycle.tolist() == [want] * 30
    df = res.to_frame()
    assert df.loc[df["partial_cycle"], "plane"].unique().tolist() == list(range(20, 32))
    assert np.isfinite(df["resultant_post"]).all() and (df["n_queries"] == 3 * 255).all()
