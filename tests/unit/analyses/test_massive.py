"""Massive values: per-dimension norms against hand computation, a planted massive dimension, exact
merging and persistence, and replacing massive dimensions through the bridge's hooks."""

from __future__ import annotations

import functools

import pytest
import torch

from ropelens.analyses.massive_values import MassiveValues, massive_values, replace_massive
from ropelens.errors import InputError
from ropelens.loading.models import wrap_hf_model
from ropelens.run.capture import capture_qk
from ropelens.testing import tiny_hf_model, tiny_tokenizer

# Planted dimensions, and the plane each sits in, written out from the tiny configs (not read from
# ropelens): llama-gqa rotates all 16 dims of a head in "half" pairs (i, i + 8); GPT-J rotates the
# first 8 dims in adjacent pairs (2i, 2i + 1) and leaves dims 8..15 unrotated.
PLANT = {
    # family: (layer, q head, q dim, q plane, kv head, k dim, k plane)
    "llama-gqa": (1, 2, 11, 3, 1, 6, 6),
    "gptj": (0, 1, 5, 2, 0, 12, -1),
}
HEAD_DIM = 16


def tokens(batch=3, seq=24, seed=0):
    t = torch.randint(4, 101, (batch, seq), generator=torch.Generator().manual_seed(seed))
    t[:, 0] = 1
    return t


def _projections(hf, family: str, layer: int):
    attn = hf.transformer.h[layer].attn if family == "gptj" else hf.model.layers[layer].self_attn
    return attn.q_proj, attn.k_proj


@functools.cache
def planted(family: str, scale: float = 40.0):
    """A tiny model with one q row and one k row of one layer scaled by ``scale``."""
    hf = tiny_hf_model(family)
    layer, qh, qd, _, kh, kd, _ = PLANT[family]
    q, k = _projections(hf, family, layer)
    with torch.no_grad():
        q.weight[qh * HEAD_DIM + qd] *= scale
        k.weight[kh * HEAD_DIM + kd] *= scale
    return wrap_hf_model(hf, tiny_tokenizer(), device="cpu", label=f"planted-{family}")


@pytest.mark.parametrize("family", ["llama-gqa", "gemma3", "gptj"])
def test_reducer_equals_hand_computation(tiny, family):
    """Norms, means and the 5× rule from the streamed sums equal a few lines over captured q and k
    (captured through the bridge, while massive_values may take the fast path)."""
    model, toks = tiny(family), tokens()
    mv = massive_values(model, toks, progress=False, factor=1.3)
    cap = capture_qk(model, toks, which=("q_pre", "k_pre"), fast=False)
    assert mv.n_tokens == toks.numel()
    for i, L in enumerate(mv.layers):
        for w in "qk":
            x = cap[L][f"{w}_pre"].double()  # [b, pos, head, d]
            norm = x.pow(2).sum((0, 1)).sqrt()
            torch.testing.assert_close(mv.norm(w)[i], norm, rtol=1e-5, atol=1e-6)
            torch.testing.assert_close(mv.mean(w)[i], x.mean((0, 1)), rtol=1e-5, atol=1e-6)
            ratio = norm / norm.mean(-1, keepdim=True)
            assert torch.equal(mv.mask(w)[i], ratio > 1.3)


def test_valid_mask_and_merge_are_exact(tiny):
    """Two halves merged equal the whole; right padding (valid=False) is left out of the sums."""
    from ropelens.analyses.massive_values import MassiveReducer
    from ropelens.results.provenance import Provenance
    from ropelens.run.capture import stream
    from ropelens.spec.reading import rope_spec

    model = tiny("llama-gqa")
    toks = tokens(4)
    whole = massive_values(model, toks, progress=False)
    a = massive_values(model, toks[:2], progress=False)
    b = massive_values(model, toks[2:], progress=False)
    merged = a.merge(b)
    for w in "qk":
        torch.testing.assert_close(
            merged.moments[w].total_sq, whole.moments[w].total_sq, rtol=1e-12, atol=0
        )
        torch.testing.assert_close(
            merged.moments[w].total, whole.moments[w].total, rtol=1e-12, atol=1e-12
        )
    assert merged.provenance.n_tokens == whole.provenance.n_tokens
    # padding: windows of 24 with the last 8 positions invalid equal windows of 16
    spec = rope_spec(model)
    red = MassiveReducer(spec, spec.rotary_layers)
    valid = torch.ones_like(toks, dtype=torch.bool)
    valid[:, 16:] = False
    stream(model, [(toks, valid)], [red], progress=False)
    padded = red.result(Provenance(model="m"))
    short = massive_values(model, toks[:, :16], progress=False)
    for w in "qk":
        torch.testing.assert_close(
            padded.moments[w].total_sq, short.moments[w].total_sq, rtol=1e-5, atol=1e-6
        )
        assert torch.equal(padded.moments[w].count, short.moments[w].count)
    with pytest.raises(InputError, match="factor"):
        a.merge(b.with_factor(3.0))


@pytest.mark.parametrize("family", ["llama-gqa", "gptj"])
def test_planted_massive_dimension_is_found_in_its_plane(family):
    layer, qh, qd, qplane, kh, kd, kplane = PLANT[family]
    mv = massive_values(planted(family), tokens(), progress=False)
    i = mv.layers.index(layer)
    for w, head, dim, plane in (("q", qh, qd, qplane), ("k", kh, kd, kplane)):
        mask = mv.mask(w)
        assert mask[i, head, dim], (w, mv.ratio(w)[i, head])
        assert mv.ratio(w)[i, head, dim] > 5
        assert int(mv.dim_planes()[dim]) == plane
        # the planted dimension is the only massive one in that layer and head
        assert int(mask[i, head].sum()) == 1
        df = mv.massive_frame()
        row = df[
            (df["which"] == w) & (df["layer"] == layer) & (df["head"] == head) & (df["dim"] == dim)
        ]
        assert len(row) == 1 and int(row.plane.iloc[0]) == plane
        if plane >= 0:
            theta = float(mv.spec.layers[layer].inv_freq[plane])
            assert row.inv_freq.iloc[0] == pytest.approx(theta)
            assert mv.plane_mask(w)[i, head, plane]
            # massive in one of the measured layers: persistence 1/n_layers for that plane
            assert float(mv.persistence(w)[plane]) >= 1 / len(mv.layers)
            pf = mv.planes_frame()
            assert int(pf[(pf.which == w) & (pf.plane == plane)].n_massive.iloc[0]) >= 1
        else:
            assert row.inv_freq.isna().all()


def test_persistence_counts_layers(tiny):
    """Synthetic sums: plane 3 massive in both layers (different heads), plane 0 in one of two."""
    from ropelens.results.provenance import Provenance
    from ropelens.run.capture import Moments
    from ropelens.spec.reading import rope_spec

    spec = rope_spec(tiny("llama-gqa"))  # 2 layers, 4 q heads, 2 KV heads, 8 planes in half pairs
    moments = {"q": Moments.zeros((2, 4, HEAD_DIM)), "k": Moments.zeros((2, 2, HEAD_DIM))}
    for mom in moments.values():
        mom.count += 10
        mom.total_sq += 1.0
    q = moments["q"].total_sq
    q[0, 1, 3] = q[1, 2, 11] = q[1, 0, 0] = 1e4  # dims 3 and 11 are plane 3, dim 0 is plane 0
    mv = MassiveValues(
        layers=(0, 1), spec=spec, moments=moments, factor=5.0, provenance=Provenance(model="m")
    )
    pers = mv.persistence("q")
    assert pers[3] == 1.0 and pers[0] == 0.5 and float(pers.sum()) == 1.5
    per_head = mv.persistence("q", per_head=True)
    assert (
        per_head[1, 3] == per_head[2, 3] == per_head[0, 0] == 0.5 and float(per_head.sum()) == 1.5
    )
    assert float(mv.persistence("k").sum()) == 0.0
    pf = mv.planes_frame()
    row = pf[(pf["which"] == "q") & (pf["plane"] == 3)].iloc[0]
    assert (
        row["n_massive"] == 2 and row["persistence"] == 1.0 and row["max_head_persistence"] == 0.5
    )
    # both dimensions of one plane in one head: one (layer, head) pair, two massive dimensions
    q[0, 1, 11] = 1e4
    pf = mv.planes_frame()
    row = pf[(pf["which"] == "q") & (pf["plane"] == 3)].iloc[0]
    assert row["n_massive"] == 2 and row["n_massive_dims"] == 3
    assert pf[pf["which"] == "q"]["n_massive_dims"].sum() == int(mv.mask("q").sum()) == 4


def test_save_load_round_trip_and_outputs(tmp_path, tiny):
    mv = massive_values(tiny("gemma3"), tokens(), progress=False, factor=1.5)
    path = tmp_path / "massive.json"
    mv.save(path)
    back = MassiveValues.load(path)
    assert back.layers == mv.layers and back.factor == mv.factor
    for w in "qk":
        assert torch.equal(back.moments[w].total_sq, mv.moments[w].total_sq)
        assert torch.equal(back.mask(w), mv.mask(w))
    assert back.provenance == mv.provenance
    df = mv.to_frame()
    L, H, KV = len(mv.layers), 4, 2
    assert len(df) == L * (H + KV) * HEAD_DIM
    assert set(df.columns) >= {
        "which",
        "layer",
        "head",
        "dim",
        "plane",
        "wavelength",
        "norm",
        "ratio",
        "massive",
    }
    fig = mv.figure()
    assert len(fig.data) == 4  # two heatmaps, two marker layers
    (tmp_path / "bad.json").write_text('{"type": "FrequencyUsage", "format": 1}')
    with pytest.raises(InputError, match="MassiveValues"):
        MassiveValues.load(tmp_path / "bad.json")
    with pytest.raises(InputError, match="factor"):
        massive_values(tiny("gemma3"), tokens(), progress=False, factor=0.5)


# ----------------------------------------------------------------------------- the intervention
def _logits(model, toks):
    with torch.no_grad():
        return model(toks)


@pytest.mark.parametrize("family", ["llama-gqa", "gptj", "gemma3"])
@pytest.mark.parametrize("control", [False, True])
def test_replace_massive_changes_exactly_those_dims(tiny, family, control):
    """In the one layer replaced, the captured pre-RoPE q and k change in exactly the masked
    (head, dim) entries, which hold the corpus mean; other dims are bit-identical; the logits move;
    after the block the logits are bit-identical to before."""
    model = planted(family) if family in PLANT else tiny(family)
    toks = tokens()
    factor = 5.0 if family in PLANT else 1.3
    mv = massive_values(model, toks, progress=False, factor=factor)
    layer = PLANT[family][0] if family in PLANT else mv.layers[-1]
    i = mv.layers.index(layer)
    before = _logits(model, toks)
    cap = capture_qk(model, toks, layers=[layer], which=("q_pre", "k_pre"), fast=False)[layer]
    with replace_massive(model, mv, layers=[layer], control=control, seed=3) as used:
        assert set(used) == {layer}
        # the fast path would bypass the hooks: it is off while the block lasts
        got = capture_qk(model, toks, layers=[layer], which=("q_pre", "k_pre"))[layer]
        during = _logits(model, toks)
    after = _logits(model, toks)
    assert torch.equal(after, before)
    massive = {w: mv.mask(w)[i] for w in "qk"}
    for w in "qk":
        mask = used[layer][w]
        assert mask.sum() == massive[w].sum()
        if control:
            assert not (mask & massive[w]).any()
        else:
            assert torch.equal(mask, massive[w])
        x, y = cap[f"{w}_pre"], got[f"{w}_pre"]
        changed = (x != y).any(0).any(0)  # [head, d]
        assert torch.equal(changed, mask), w
        mean = mv.mean(w)[i].float()
        assert torch.equal(y[:, :, mask], mean[mask].expand_as(y[:, :, mask]))
    assert (during - before).abs().max() > 1e-4


def test_control_mask_is_seeded_and_disjoint():
    mv = massive_values(planted("llama-gqa"), tokens(), progress=False, factor=1.2)
    for w in "qk":
        a, b, c = mv.control_mask(w, 0), mv.control_mask(w, 0), mv.control_mask(w, 1)
        assert torch.equal(a, b)
        assert not (a & mv.mask(w)).any()
        assert torch.equal(a.sum(-1), torch.minimum(mv.mask(w).sum(-1), (~mv.mask(w)).sum(-1)))
    assert c.sum() == a.sum()
    assert any(not torch.equal(mv.control_mask(w, 0), mv.control_mask(w, 1)) for w in "qk")


def test_replace_massive_restores_on_exception_and_checks_input(tiny):
    model = planted("llama-gqa")
    toks = tokens()
    mv = massive_values(model, toks, progress=False)
    before = _logits(model, toks)
    with pytest.raises(RuntimeError, match="boom"), replace_massive(model, mv):
        raise RuntimeError("boom")
    assert torch.equal(_logits(model, toks), before)
    assert all(
        not hp.fwd_hooks
        for name, hp in model.hook_dict.items()
        if name.endswith(("hook_q", "hook_k"))
    )
    part = massive_values(model, toks, progress=False, layers=[0])
    with pytest.raises(InputError, match="not measured"), replace_massive(model, part, layers=[1]):
        pass
    other = massive_values(tiny("gemma3"), tokens(), progress=False)
    with (
        pytest.raises(InputError, match="rotates differently|not measured"),
        replace_massive(model, other, layers=[0]),
    ):
        pass
    with pytest.raises(InputError, match="which"), replace_massive(model, mv, which=("v",)):
        pass
