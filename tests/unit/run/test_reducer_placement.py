"""Head-score, sink and distance reducers: sums placed once on the first activations' device,
per-batch results of layers elsewhere (device maps) sent there, no host synchronisation in
``update``, and the sums equal to float64 references built from the captured activations.

A CPU-only machine has one real device; the ``meta`` device stands in for a second one (it accepts
copies in, so sums placed there take results from CPU layers, but nothing copies out of it).
"""

from __future__ import annotations

import contextlib
import types
from collections.abc import Callable, Iterator

import pytest
import torch
from torch import Tensor

import ropelens.run.distributed as D
from ropelens import Bands
from ropelens.analyses.attention_by_distance import DistanceReducer
from ropelens.analyses.attention_sinks import SinkReducer
from ropelens.analyses.head_taxonomy import HeadScoresReducer
from ropelens.run import capture
from ropelens.run.capture import LayerActs, capture_qk
from ropelens.run.distributed import reducer_state, run_windows
from ropelens.spec.reading import rope_spec
from ropelens.spec.rope import RopeSpec
from ropelens.testing import tiny_model

N = 20
MAX_OFFSET = 4
SKIP = 4
EPS = 0.3
BANDS = Bands.quantiles(2)
REDUCERS: dict[str, Callable[[RopeSpec, list[int]], object]] = {
    "heads": lambda spec, layers: HeadScoresReducer(spec, layers, BANDS, MAX_OFFSET),
    "sinks": lambda spec, layers: SinkReducer(spec, layers, BANDS, epsilon=EPS, skip_queries=SKIP),
    "distance": lambda spec, layers: DistanceReducer(spec, layers, BANDS, max_distance=N - 1),
}
HOST_SYNCS = ("cpu", "item", "tolist", "numpy", "__float__", "__int__", "__index__", "__bool__")


@pytest.fixture(scope="module")
def captured():
    """(spec, layers, {layer: LayerActs}) of a tiny Gemma-3: sliding-window and global layers,
    GQA."""
    model = tiny_model("gemma3")
    spec = rope_spec(model)
    toks = torch.randint(4, 100, (3, N), generator=torch.Generator().manual_seed(0))
    toks[:, 0] = 1
    acts = capture_qk(model, toks, which=("q_pre", "k_pre", "q_post", "k_post", "pattern"))
    return spec, spec.rotary_layers, acts


def _on(acts: LayerActs, device: str) -> LayerActs:
    return LayerActs(
        acts.layer,
        acts.rope,
        acts.valid.to(device),
        {k: v.to(device) for k, v in acts.tensors.items()},
    )


@contextlib.contextmanager
def _no_host_sync() -> Iterator[None]:
    """Every tensor → host conversion raises while the block runs."""

    def refuse(name: str):
        def raise_(*_a, **_k):
            raise AssertionError(f"Tensor.{name} synchronises with the host inside update")

        return raise_

    with pytest.MonkeyPatch.context() as mp:
        for name in HOST_SYNCS:
            mp.setattr(torch.Tensor, name, refuse(name))
        yield


def _fed(name: str, spec: RopeSpec, layers: list[int], acts: dict[int, LayerActs]):
    red = REDUCERS[name](spec, layers)
    for L in layers:
        with _no_host_sync():
            red.update(acts[L])
    return red


# ============================================================================ float64 references
def _band_logits(a: LayerActs, layer_bands) -> Tensor:
    """``[b, head, band, q, k]`` band terms of every logit, float64, score scale applied."""
    q, k = a["q_post"].double(), a["k_post"].double()
    k = k[:, :, torch.arange(q.shape[2]) // a.rope.group_size]
    return (
        torch.stack(
            [torch.einsum("bqhd,bkhd->bhqk", q[..., d], k[..., d]) for d in layer_bands.dims], 2
        )
        * a.rope.score_scale
    )


def _heads_ref(a: LayerActs, rb) -> dict[str, Tensor]:
    X, P = _band_logits(a, rb), a["pattern"].double()
    b, n = P.shape[0], P.shape[-1]
    out: dict[str, list[Tensor]] = {"mass": [], "n_offset": [], "band_sum": [], "band_sq": []}
    for d in range(MAX_OFFSET + 1):
        qp = torch.arange(1 + d, n)
        x = X[..., qp, qp - d]  # [b, h, band, queries]
        out["mass"].append(P[..., qp, qp - d].sum((0, 2)))
        out["n_offset"].append(torch.tensor(float(b * len(qp)), dtype=torch.float64))
        out["band_sum"].append(x.sum((0, 3)))
        out["band_sq"].append((x * x).sum((0, 3)))
    ref = {k: torch.stack(v, -1) for k, v in out.items()}
    ref.update(
        sink=P[:, :, 1:, 0].sum((0, 2)),
        n_sink=torch.tensor(float(b * (n - 1)), dtype=torch.float64),
    )
    return ref


def _sinks_ref(a: LayerActs, rb) -> dict[str, Tensor]:
    X, P = _band_logits(a, rb), a["pattern"].double()
    b, n = P.shape[0], P.shape[-1]
    used = torch.arange(SKIP, min(n, a.rope.window or n))
    j = torch.arange(n)
    other = ((j[None] >= 1) & (j[None] <= used[:, None])).double() / used[
        :, None
    ]  # [queries, k]: mean over keys 1 … m
    kp = a["k_pre"].double()
    norm = torch.stack([kp[..., d].norm(dim=-1) for d in rb.dims], -1)  # [b, n, kv, band]
    return {
        "n_queries": torch.tensor(float(b * len(used)), dtype=torch.float64),
        "p0_sum": P[:, :, used, 0].sum((0, 2)),
        "x0_sum": X[..., used, 0].sum((0, 3)),
        "xo_sum": torch.einsum("bhcqk,qk->hc", X[..., used, :], other),
        "n_k0": torch.tensor(float(b), dtype=torch.float64),
        "n_kother": torch.tensor(float(b * (n - 1)), dtype=torch.float64),
        "k0_band": norm[:, 0].sum(0),
        "kother_band": norm[:, 1:].sum((0, 1)),
    }


def _distance_ref(a: LayerActs, rb, edges: Tensor) -> dict[str, Tensor]:
    X, P = _band_logits(a, rb), a["pattern"].double()
    b, n = P.shape[0], P.shape[-1]
    ok = a.rope.mask(n) & (torch.arange(n)[None] >= 1)  # keys at position 0 (the sink) are left out
    delta = torch.arange(n)[:, None] - torch.arange(n)[None]
    which = torch.bucketize(delta.clamp(min=0), edges, right=True) - 1
    sel = torch.stack([ok & (which == t) for t in range(len(edges) - 1)]).double()  # [bins, q, k]
    return {
        "band_sum": torch.einsum("bhcqk,tqk->hct", X, sel),
        "prob_sum": torch.einsum("bhqk,tqk->ht", P, sel),
        "count": sel.sum((1, 2)) * b,
        "dist_sum": (sel * delta).sum((1, 2)) * b,
        "n_queries": torch.tensor(float(b * n), dtype=torch.float64),
    }


def _reference(
    name: str, red, spec: RopeSpec, layers: list[int], acts: dict[int, LayerActs]
) -> dict[str, Tensor]:
    per = []
    for L in layers:
        rb = BANDS.resolve(spec.layers[L])
        per.append(
            _heads_ref(acts[L], rb)
            if name == "heads"
            else _sinks_ref(acts[L], rb)
            if name == "sinks"
            else _distance_ref(acts[L], rb, red.edges)
        )
    return {k: torch.stack([p[k] for p in per]) for k in per[0]}


COUNTS = {"n_offset", "n_sink", "n_queries", "n_k0", "n_kother", "count", "dist_sum"}


# ============================================================================ tests
@pytest.mark.parametrize("name", list(REDUCERS))
def test_updates_never_synchronise_and_sums_match_references(name, captured):
    spec, layers, acts = captured
    red = _fed(name, spec, layers, acts)
    want = _reference(name, red, spec, layers, acts)
    for k, v in red.sums.items():
        assert v.device.type == "cpu" and v.dtype == torch.float64, k
    for k, w in want.items():
        got = red.sums[k]
        if k in COUNTS:
            assert torch.equal(got, w), k
        else:
            torch.testing.assert_close(got, w, rtol=1e-5, atol=1e-6, msg=lambda m, k=k: f"{k}: {m}")


@pytest.mark.parametrize("name", list(REDUCERS))
def test_sums_stay_on_the_first_device_under_a_device_map(name, captured):
    """Layers alternate between two devices: the sums stay where the first layer's activations
    were."""
    spec, layers, acts = captured
    red = REDUCERS[name](spec, layers)
    for j, L in enumerate(layers):
        a = _on(acts[L], "meta") if j % 2 == 0 else acts[L]
        with _no_host_sync():
            red.update(a)
    for k, v in red.sums.items():
        assert v.device.type == "meta" and v.dtype == torch.float64, k


@pytest.mark.parametrize("name", list(REDUCERS))
def test_sums_placed_once_on_the_first_device(name, captured):
    spec, layers, acts = captured
    red = REDUCERS[name](spec, layers)
    red.update(acts[layers[0]])
    placed = dict(red.sums)
    for L in layers[1:]:
        red.update(acts[L])
    assert all(red.sums[k] is v for k, v in placed.items())


def test_head_scores_are_on_the_cpu_in_float64(captured):
    spec, layers, acts = captured
    red = _fed("heads", spec, layers, acts)
    scores = red.scores("text")
    assert set(scores) == {"mass_text", "sink_text", "position_share_text", "content_var_text"}
    for k, v in scores.items():
        assert v.device.type == "cpu" and v.dtype == torch.float64, k
    torch.testing.assert_close(
        scores["mass_text"][..., 1], red.sums["mass"][..., 1] / red.sums["n_offset"][:, None, 1]
    )


def test_head_scores_resume_from_a_checkpoint_exactly(tmp_path, monkeypatch):
    """The head-score sums a checkpoint holds load into a fresh reducer before its first update and
    go on accumulating: the resumed run equals an uninterrupted one exactly."""
    model = tiny_model("llama-gqa")
    spec = rope_spec(model)
    layers = spec.rotary_layers
    toks = torch.randint(4, 100, (5, 16), generator=torch.Generator().manual_seed(3))
    whole = HeadScoresReducer(spec, layers, BANDS, MAX_OFFSET)
    run_windows(model, toks, [whole], batch_size=1, spec=spec, progress=False)

    real, calls = capture.stream, {"n": 0}

    def dies_after_three(*a, **k):
        calls["n"] += 1
        if calls["n"] > 3:
            raise KeyboardInterrupt("killed")
        return real(*a, **k)

    monkeypatch.setattr(D, "stream", dies_after_three)
    with pytest.raises(KeyboardInterrupt):
        run_windows(
            model,
            toks,
            [HeadScoresReducer(spec, layers, BANDS, MAX_OFFSET)],
            batch_size=1,
            spec=spec,
            progress=False,
            checkpoint=tmp_path,
            every=1,
        )
    monkeypatch.setattr(D, "stream", real)
    resumed = HeadScoresReducer(spec, layers, BANDS, MAX_OFFSET)
    info = run_windows(
        model,
        toks,
        [resumed],
        batch_size=1,
        spec=spec,
        progress=False,
        checkpoint=tmp_path,
        every=1,
    )
    assert info.resumed_batches == 3
    assert reducer_state(resumed) is resumed.sums
    for k, v in whole.sums.items():
        assert torch.equal(resumed.sums[k], v), k
    a, b = whole.scores("text"), resumed.scores("text")
    assert all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.parametrize(
    ("total_bytes", "expected"),
    [(141 << 30, 1 << 28), (8 << 30, (8 << 30) // 64), (1 << 30, 1 << 24)],
)
def test_cuda_tiles_grow_with_device_memory_up_to_the_cap(monkeypatch, total_bytes, expected):
    """CUDA tiles hold 2^28 entries, 1/64 of the device's memory where that is less, never fewer
    than 2^24; CPU tiles are fixed."""
    props = types.SimpleNamespace(total_memory=total_bytes)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda _device: props)
    assert capture.tile_elements(torch.device("cuda")) == expected
    assert capture.query_tile(torch.device("cuda"), 1 << 10) == expected >> 10
    assert capture.tile_elements(torch.device("cpu")) == 1 << 21
