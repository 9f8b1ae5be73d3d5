"""Frequency usage: per-plane norms, pre/post agreement, exact merging, persistence, figures."""

from __future__ import annotations

import pytest
import torch

import ropelens
from ropelens.analyses.frequency_usage import FrequencyUsage, frequency_usage
from ropelens.run.capture import capture_qk
from ropelens.spec.bands import Bands


def tokens(batch=4, seq=24, seed=0):
    g = torch.Generator().manual_seed(seed)
    t = torch.randint(4, 101, (batch, seq), generator=g)
    t[:, 0] = 1
    return t


def test_pre_and_post_rope_usage_agree(tiny, rope_family):
    """Rotation keeps each plane's norm, so usage from pre- and post-RoPE q/k is the same."""
    model = tiny(rope_family)
    pre = frequency_usage(model, tokens(), progress=False, source="pre")
    post = frequency_usage(model, tokens(), progress=False, source="post")
    for w in "qk":
        assert torch.allclose(pre.norm(w), post.norm(w), rtol=1e-5, atol=1e-6)


# ----------------------------------------------------------------------------- independent checks
# What each tiny family rotates, written out here from the HF configs in ropelens.testing (not read
# from ropelens): rotary dims, pairing, and the hooks that carry the pre-RoPE q and k.
HAND = {
    "llama-gqa": {"rotary_dim": 16, "pairing": "half", "pre": ("hook_q", "hook_k")},
    "gemma3": {"rotary_dim": 16, "pairing": "half", "pre": ("hook_q_normed", "hook_k_normed")},
    "gptj": {"rotary_dim": 8, "pairing": "adjacent", "pre": ("hook_q", "hook_k")},
}


def raw_hooks(model, toks, names):
    """Run the model once with our own TransformerLens hooks; return the tensors as [b, pos, head,
    d]."""
    kept = {}

    def keeper(name):  # keyed by the name we asked for (the bridge may fire it under an alias)
        def keep(x, hook):
            kept[name] = x.detach().clone()
            return x

        return keep

    with torch.no_grad(), model.hooks(fwd_hooks=[(n, keeper(n)) for n in names]):
        model(toks, return_type=None)
    seq = toks.shape[1]
    # Gemma's q/k-norm hooks are [b, head, pos, d]: find the position axis by its length.
    return {n: x if x.shape[1] == seq else x.transpose(1, 2) for n, x in kept.items()}


def hand_plane_norms(x, rotary_dim, pairing):
    """‖x^(i)‖ per plane from explicit dim pairs: half (i, i + r/2), adjacent (2i, 2i + 1)."""
    n = rotary_dim // 2
    pairs = [(i, i + n) if pairing == "half" else (2 * i, 2 * i + 1) for i in range(n)]
    return torch.stack([torch.sqrt(x[..., a] ** 2 + x[..., b] ** 2) for a, b in pairs], dim=-1)


@pytest.mark.parametrize("family", ["llama-gqa", "gemma3", "gptj"])
def test_usage_equals_norms_from_raw_hook_tensors(tiny, family):
    """frequency_usage (pre and post) equals per-plane norms computed in a few lines from the raw
    pre-RoPE hook tensors, with the family's pairing written out by hand."""
    model, hand = tiny(family), HAND[family]
    toks = tokens()
    pre = frequency_usage(model, toks, progress=False, source="pre")
    post = frequency_usage(model, toks, progress=False, source="post")
    names = [f"blocks.{L}.attn.{h}" for L in pre.layers for h in hand["pre"]]
    raw = raw_hooks(model, toks, names)
    for i, L in enumerate(pre.layers):
        for w, hook in zip("qk", hand["pre"], strict=True):
            n = hand_plane_norms(
                raw[f"blocks.{L}.attn.{hook}"], hand["rotary_dim"], hand["pairing"]
            )
            want = n.mean((0, 1))  # [head, plane]
            torch.testing.assert_close(pre.norm(w)[i], want, rtol=1e-5, atol=1e-6)
            torch.testing.assert_close(post.norm(w)[i], want, rtol=1e-5, atol=1e-6)
            torch.testing.assert_close(
                pre.norm(w, "no_sink")[i], n[:, 1:].mean((0, 1)), rtol=1e-5, atol=1e-6
            )


def test_gemma3_model_rotates_the_normed_hooks_with_half_pairing(tiny):
    """The hooks and pairing the hand computation above uses are the right ones: Gemma's own
    post-RoPE q/k (hook_rot_q/k) have, plane by plane, the norms of hook_q_normed/k_normed under
    (i, i + 8) pairing, and not under adjacent pairing or of the un-normed hook_q."""
    model = tiny("gemma3")
    toks = tokens(2)
    p = "blocks.0.attn."
    raw = raw_hooks(
        model,
        toks,
        [p + h for h in ("hook_q", "hook_q_normed", "hook_k_normed", "hook_rot_q", "hook_rot_k")],
    )
    for w in "qk":
        rot = hand_plane_norms(raw[f"{p}hook_rot_{w}"], 16, "half")
        torch.testing.assert_close(
            rot, hand_plane_norms(raw[f"{p}hook_{w}_normed"], 16, "half"), rtol=1e-5, atol=1e-6
        )
        assert not torch.allclose(
            hand_plane_norms(raw[f"{p}hook_rot_{w}"], 16, "adjacent"),
            hand_plane_norms(raw[f"{p}hook_{w}_normed"], 16, "adjacent"),
            rtol=1e-3,
        )
    assert not torch.allclose(
        hand_plane_norms(raw[p + "hook_q"], 16, "half"),
        hand_plane_norms(raw[p + "hook_rot_q"], 16, "half"),
        rtol=1e-3,
    )


def test_gptj_post_rope_queries_equal_hf_rotation(tiny):
    """GPT-J fires no post-RoPE hook, so ropelens rotates q/k itself: check its rotated tensors
    against HF's own GPT-J rotary code applied to the raw hook_q/hook_k (first rotary_dim = 8
    dims, adjacent pairs), and that HF's rotation keeps the adjacent-pair norms (so that is the
    pairing)."""
    from transformers.models.gptj.modeling_gptj import (
        apply_rotary_pos_emb,
        create_sinusoidal_positions,
    )

    model = tiny("gptj")
    toks = tokens(2)
    seq, r = toks.shape[1], 8
    sincos = create_sinusoidal_positions(seq, r)[None]  # [1, pos, r]: sin of r/2 angles, then cos
    sin, cos = sincos[..., : r // 2], sincos[..., r // 2 :]
    acts = ropelens.capture_qk(model, toks)
    raw = raw_hooks(model, toks, [f"blocks.{L}.attn.hook_{w}" for L in acts for w in "qk"])
    for L, a in acts.items():
        for w in "qk":
            x = raw[f"blocks.{L}.attn.hook_{w}"]  # [b, pos, head, 16]
            hf_rot = torch.cat([apply_rotary_pos_emb(x[..., :r], sin, cos), x[..., r:]], dim=-1)
            torch.testing.assert_close(a[f"{w}_pre"].float(), x, rtol=1e-6, atol=1e-6)
            torch.testing.assert_close(a[f"{w}_post"].float(), hf_rot, rtol=1e-5, atol=1e-5)
            torch.testing.assert_close(
                hand_plane_norms(hf_rot, r, "adjacent"), hand_plane_norms(x, r, "adjacent")
            )
            assert not torch.allclose(
                hand_plane_norms(hf_rot, r, "half"), hand_plane_norms(x, r, "half"), rtol=1e-3
            )


# Planted planes of the tiny GQA Llama (head_dim 16, 8 planes): query head → planes, KV head →
# planes.
PLANT_Q = {0: (0, 5), 1: (2, 7), 2: (3, 4), 3: (1, 6)}
PLANT_K = {0: (6, 1), 1: (4, 2)}


def planted_llama(dest, factor=40.0):
    """Tiny GQA Llama whose q_proj/k_proj rows of the planted planes (both dims of each plane,
    (i, i + 8) as HF's rotate_half pairs them) are scaled by ``factor`` in every layer."""
    from ropelens.testing import tiny_hf_model, tiny_tokenizer

    hf = tiny_hf_model("llama-gqa")
    d = 16
    with torch.no_grad():
        for layer in hf.model.layers:
            for proj, plant in (
                (layer.self_attn.q_proj, PLANT_Q),
                (layer.self_attn.k_proj, PLANT_K),
            ):
                for head, planes in plant.items():
                    for i in planes:
                        for dim in (i, i + d // 2):
                            proj.weight[head * d + dim] *= factor
    hf.save_pretrained(dest)
    tiny_tokenizer().save_pretrained(dest)
    return ropelens.load_model(dest, device="cpu")


def test_planted_plane_norms_are_found(tmp_path):
    """Scaling chosen planes of W_q/W_k makes exactly those planes the largest in frequency_usage:
    a wrong plane pairing spreads each planted plane over two of its planes and fails this."""
    u = frequency_usage(planted_llama(tmp_path / "planted"), tokens(), progress=False)
    for w, plant in (("q", PLANT_Q), ("k", PLANT_K)):
        norms = u.norm(w)  # [layer, head, plane]
        for i in range(len(u.layers)):
            for head, planes in plant.items():
                top = torch.topk(norms[i, head], len(planes)).indices.tolist()
                assert sorted(top) == sorted(planes), (w, u.layers[i], head, norms[i, head])
                rest = [p for p in range(8) if p not in planes]
                assert norms[i, head, list(planes)].min() > 5 * norms[i, head, rest].max()


def test_usage_matches_direct_norms(tiny):
    model = tiny("llama-gqa")
    toks = tokens()
    u = frequency_usage(model, toks, progress=False, n_sink=1)
    acts = capture_qk(model, toks, which=("q_pre", "k_pre"))
    spec = ropelens.rope_spec(model)
    for i, L in enumerate(u.layers):
        for w in "qk":
            n = spec.layers[L].split(acts[L][f"{w}_pre"]).norm(dim=-1)  # [b,pos,h,P]
            assert torch.allclose(u.norm(w)[i], n.mean((0, 1)), rtol=1e-5)
            assert torch.allclose(u.norm(w, "no_sink")[i], n[:, 1:].mean((0, 1)), rtol=1e-5)
            assert torch.allclose(u.std(w)[i], n.flatten(0, 1).std(0), rtol=1e-4)
            win = n.mean(1)  # per-window means
            assert torch.allclose(u.ci(w)[i], 1.96 * win.std(0) / 2.0, rtol=1e-4)
    assert u.q_norm.shape == (2, 4, 8) and u.k_norm.shape == (2, 2, 8)


def test_merged_halves_equal_one_pass(tiny, tmp_path):
    model = tiny("gemma3")
    toks = tokens(6)
    whole = frequency_usage(model, toks, progress=False, batch_size=4)
    a = frequency_usage(model, toks[:3], progress=False)
    b = frequency_usage(model, toks[3:], progress=False)
    a.save(tmp_path / "a.json")
    merged = FrequencyUsage.load(tmp_path / "a.json").merge(b)
    # each window's float32 norms do not depend on its batch, and windows add in float64: the merge
    # only reorders float64 additions (unit roundoff 1.1e-16 times a few dozen terms), so 1e-12 is
    # ample
    for key in whole.token:
        for name in ("count", "total", "total_sq"):
            assert torch.allclose(
                getattr(merged.token[key], name), getattr(whole.token[key], name), rtol=1e-12
            )
            assert torch.allclose(
                getattr(merged.window[key], name), getattr(whole.window[key], name), rtol=1e-12
            )
    assert merged.provenance.n_windows == 6


def test_padding_is_ignored(tiny):
    """Right padding: padded positions are excluded, so results equal the unpadded run."""
    from ropelens.analyses.frequency_usage import UsageReducer
    from ropelens.run.capture import stream

    model = tiny("llama")
    spec = ropelens.rope_spec(model)
    toks = tokens(2, seq=16)
    short = toks[:, :10]
    ref = UsageReducer(spec, [0, 1])
    stream(model, [short], [ref], progress=False)
    padded = UsageReducer(spec, [0, 1])
    valid = torch.zeros_like(toks, dtype=torch.bool)
    valid[:, :10] = True
    stream(model, [(toks, valid)], [padded], progress=False)
    for key in ref.tok:
        assert torch.allclose(ref.tok[key].mean, padded.tok[key].mean, rtol=1e-6)


def test_band_share_roundtrip_and_figures(tiny, tmp_path):
    u = frequency_usage(tiny("llama"), tokens(), progress=False)
    names, share = u.band_share(Bands.quantiles(2))
    assert names == ["Q1 (highest)", "Q2 (lowest)"] and torch.allclose(
        share.sum(-1), torch.ones(())
    )
    df = u.to_frame()
    assert len(df) == 2 * (2 * 4 * 8) * 2  # (q, k) × layers·heads·planes × (all, no_sink)
    assert set(df["which"]) == {"q", "k"} and set(df["scope"]) == {"all", "no_sink"}
    assert len(u.figure().data) == 2 and len(u.figure(layer=1).data) == 2
    bundle = u._repr_mimebundle_()
    assert "application/vnd.plotly.v1+json" in bundle and "cdn.plot.ly" not in str(bundle)
    u.save(tmp_path / "u.json")
    assert FrequencyUsage.load(tmp_path / "u.json").to_frame().equals(df)
    with pytest.raises(ValueError, match="not measured"):
        u.heatmap(layer=7)


def test_usage_rejects_bad_input(tiny, tmp_path):
    model = tiny("llama")
    with pytest.raises(ValueError, match="source"):
        frequency_usage(model, tokens(), source="middle", progress=False)
    with pytest.raises(ValueError, match="integer"):
        frequency_usage(model, torch.rand(2, 8), progress=False)
    bad = tmp_path / "x.json"
    bad.write_text('{"type": "BandStatistics"}')
    with pytest.raises(ValueError, match="FrequencyUsage"):
        FrequencyUsage.load(bad)
