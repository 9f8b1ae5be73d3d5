"""Every corpus reducer on a bfloat16 and a float16 model, against float64 references from the same
q and k.

The half-precision model runs once per dtype and its q/k are captured (half tensors). Each reducer
is fed those tensors; its reference is computed densely from the same tensors upcast to float64, by
the plain formulas of ``test_band_tiles`` (band statistics) and ``test_reducer_placement`` (heads,
sinks, distance), or written out here (usage, offsets, massive values). The attention pattern of the
reference is rebuilt in float64 from q and k, not taken from the model's own half-precision softmax.

Why the tolerance is float32's, not the half dtype's: bfloat16 (8 significant bits, unit roundoff
u = 2^-8 ≈ 3.9e-3) and float16 (11 bits, u = 2^-11 ≈ 4.9e-4) both embed exactly in float32 (24 bits)
and float64, so reducer and reference start from identical numbers. A reducer that upcasts to
float32 for products and sums windows in float64 then differs from the float64 reference only by
float32 roundings: u32 = 2^-24 ≈ 6e-8, grown by at most the terms in one float32 reduction (a dot
product over d = 16 head dims, a row of at most N = 24 keys, a window of N tokens): γ ≈ (16 + 24
+ 24) · u32 ≈ 3.8e-6 of the sum of the terms' magnitudes (Higham's bound; typically √ of that).
TOL = 2e-5 leaves a factor 5 over the worst case. Rounding any product or sum to the half dtype
instead costs at least one half-precision rounding of that magnitude, u/2 ≥ 2.4e-4 (float16) and
1.9e-3 (bfloat16): 12× and 100× over TOL, so the check fails when a reducer computes in the model's
dtype. On a CUDA device (where present) the reducers run there, TF32 off as PyTorch's default leaves
it for matmuls, so the same float32 bound holds. Errors are measured against each statistic's scale,
the largest magnitude of its summed terms (``_scale``), since variances, covariances and margins
cancel.
"""

from __future__ import annotations

import pytest
import torch
from torch import Tensor

from ropelens.analyses.attention_by_distance import DistanceReducer
from ropelens.analyses.band_statistics import BandStatsReducer
from ropelens.analyses.frequency_usage import UsageReducer
from ropelens.analyses.massive_values import MassiveReducer
from ropelens.analyses.rotary_offsets import OffsetReducer
from ropelens.run.capture import LayerActs, capture_qk, stream
from ropelens.spec.reading import rope_spec
from ropelens.spec.rope import RopeSpec
from ropelens.testing import tiny_model
from tests.harness.dense import HFLayer, allowed_keys, band_logits, dense_layer_sums, pattern_of
from tests.unit.run.test_reducer_placement import (
    BANDS,
    EPS,
    REDUCERS,
    SKIP,
    _distance_ref,
    _heads_ref,
    _sinks_ref,
)

N, BATCH = 24, 3  # three windows of 8 in Gemma 3's sliding layers; its layer 3 is global
TOL = 2e-5  # float32 rounding growth over the reductions, with margin (see the module docstring)
DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16}
NAMES = ("usage", "band_stats", "heads", "sinks", "distance", "offsets", "massive")


DEVICES = [
    "cpu",
    pytest.param(
        "cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
    ),
]


@pytest.fixture(scope="module")
def captured():
    """``captured(dtype, device)``: (model, spec, {layer: LayerActs}) of the tiny Gemma 3 run in
    that dtype on that device, captured once."""
    cache: dict = {}

    def get(dtype: str, device: str = "cpu"):
        if (dtype, device) not in cache:
            model = tiny_model("gemma3", device=device).to(DTYPES[dtype])
            spec = rope_spec(model)
            acts = capture_qk(model, _tokens(), which=("q_pre", "k_pre", "q_post", "k_post"))
            assert {v.dtype for a in acts.values() for v in a.tensors.values()} == {DTYPES[dtype]}
            cache[dtype, device] = (model, spec, acts)
        return cache[dtype, device]

    return get


def _tokens() -> Tensor:
    toks = torch.randint(4, 100, (BATCH, N), generator=torch.Generator().manual_seed(5))
    toks[:, 0] = 1
    return toks


def _reducer(name: str, spec: RopeSpec, layers: list[int]):
    if name in REDUCERS and name != "distance":
        return REDUCERS[name](spec, layers)
    return {
        "distance": lambda: DistanceReducer(spec, layers, BANDS, max_distance=N - 1),
        "usage": lambda: UsageReducer(spec, layers),
        "band_stats": lambda: BandStatsReducer(spec, layers, BANDS, jsd=True, tile=(5, 3)),
        "offsets": lambda: OffsetReducer(spec, layers),
        "massive": lambda: MassiveReducer(spec, layers),
    }[name]()


def _sums(red) -> dict[str, Tensor]:
    state = red.state_dict() if hasattr(red, "state_dict") else red.sums
    return {k: v.detach().double().cpu() for k, v in state.items()}


# ============================================================================ float64 references
def _wide(a: LayerActs) -> LayerActs:
    """The captured tensors upcast to float64 (exact), with the pattern rebuilt from them in
    float64."""
    t = {k: v.cpu().double() for k, v in a.tensors.items()}
    a = LayerActs(a.layer, a.rope, a.valid.cpu(), t)
    t["pattern"] = _layer(a)[0].probs
    return a


def _layer(a: LayerActs) -> tuple[HFLayer, Tensor]:
    """The layer as the dense band-statistics reference takes it (float64 q, k, pattern) and its
    mask."""
    r = a.rope
    q, k = a["q_post"].double().transpose(1, 2), a["k_post"].double().transpose(1, 2)
    sinks = None if r.sinks is None else torch.as_tensor(r.sinks, dtype=torch.float64)
    lay = HFLayer(
        q=q, k=k, scale=r.score_scale, window=r.window, softcap=r.softcap, sinks=sinks, probs=q
    )
    ok = allowed_keys(q.shape[2], r.window)
    lay.probs = pattern_of(lay, band_logits(lay, [torch.arange(q.shape[-1])]).sum(2), ok)
    return lay, ok


def _halves(x: Tensor) -> tuple[Tensor, Tensor]:
    """The two coordinates of every plane, pairing (i, i + d/2) written out (Gemma 3 rotates
    halves)."""
    n = x.shape[-1] // 2
    return x[..., :n], x[..., n:]


def _norms(x: Tensor) -> Tensor:
    a, b = _halves(x)
    return (a * a + b * b).sqrt()


def _usage_ref(a: LayerActs) -> dict[str, Tensor]:
    out = {}
    for w in "qk":
        norms = _norms(a[f"{w}_pre"].double())  # [b, n, h, P]
        for scope, x in (("all", norms), ("no_sink", norms[:, 1:])):
            means = x.mean(1)  # per window

            def f64(v, x=x):
                return torch.full(x.shape[2:], float(v), dtype=torch.float64)

            out.update(
                {
                    f"tok/{w}/{scope}/count": f64(x.shape[0] * x.shape[1]),
                    f"tok/{w}/{scope}/total": x.sum((0, 1)),
                    f"tok/{w}/{scope}/total_sq": (x * x).sum((0, 1)),
                    f"win/{w}/{scope}/count": f64(x.shape[0]),
                    f"win/{w}/{scope}/total": means.sum(0),
                    f"win/{w}/{scope}/total_sq": (means * means).sum(0),
                }
            )
    return out


def _massive_ref(a: LayerActs) -> dict[str, Tensor]:
    out = {}
    for w in "qk":
        x = a[f"{w}_pre"].double()
        out.update(
            {
                f"{w}/count": torch.full(
                    x.shape[2:], float(x.shape[0] * x.shape[1]), dtype=torch.float64
                ),
                f"{w}/total": x.sum((0, 1)),
                f"{w}/total_sq": (x * x).sum((0, 1)),
            }
        )
    return out


def _offsets_ref(a: LayerActs, n_sink: int = 1) -> dict[str, Tensor]:
    lay, ok = _layer(a)
    scores = (band_logits(lay, [torch.arange(lay.q.shape[-1])]).sum(2)).masked_fill(
        ~ok, float("-inf")
    )
    att = scores.argmax(-1).transpose(1, 2)  # [b, n, H]: first maximum, as the model's argmax
    b, n, H = att.shape
    keep = (torch.arange(n) >= n_sink).double()[None, :, None]
    scope = {"sink": (att < n_sink).double() * keep, "content": (att >= n_sink).double() * keep}
    out = {f"n/{sc}": w.sum((0, 1)) for sc, w in scope.items()}
    for w, key in (("q", "q_post"), ("k", "k_post")):
        norms = _norms(a[key].double())
        kk = keep[..., None].expand(b, n, norms.shape[2], 1)
        out.update(
            {
                f"{w}_norm/count": kk.sum((0, 1)).expand(-1, norms.shape[-1]),
                f"{w}_norm/total": (norms * kk).sum((0, 1)),
                f"{w}_norm/total_sq": (norms * norms * kk).sum((0, 1)),
            }
        )
    bi, hi = torch.arange(b)[:, None, None], torch.arange(H)[None, None]
    for src in ("post", "pre"):
        q, k = a[f"q_{src}"].double(), a[f"k_{src}"].double()
        ka = k[bi, att, hi // (H // k.shape[2])]  # [b, n, H, d]: the attended key per query head
        (q0, q1), (k0, k1) = _halves(q), _halves(ka)
        norm = _norms(q) * _norms(ka)
        good = (norm > 0).double()
        stats = {
            "count": good,
            "cos": (q0 * k0 + q1 * k1) / norm * good,
            "sin": (q0 * k1 - q1 * k0) / norm * good,
        }
        if src == "post":
            stats["term"] = (q0 * k0 + q1 * k1) * a.rope.score_scale
        for stat, t in stats.items():
            for sc, w in scope.items():
                out[f"term/{sc}" if stat == "term" else f"{src}/{sc}/{stat}"] = (
                    t * w[..., None]
                ).sum((0, 1))
    return out


def _sinks_more(a: LayerActs) -> dict[str, Tensor]:
    """What ``_sinks_ref`` leaves out: queries over ε at position 0, sink mass (no learned sinks: 0)
    and the key norms per plane."""
    P, n = a["pattern"], a["pattern"].shape[-1]
    used = torch.arange(SKIP, min(n, a.rope.window or n))
    norms = _norms(a["k_pre"].double())
    return {
        "p0_over": (P[:, :, used, 0] > EPS).double().sum((0, 2)),
        "sink_mass": torch.zeros(P.shape[1], dtype=torch.float64),
        "k0_plane": norms[:, 0].sum(0),
        "kother_plane": norms[:, 1:].sum((0, 1)),
    }


def _band_ref(a: LayerActs, spec: RopeSpec) -> dict[str, Tensor]:
    lay, _ = _layer(a)
    P = a.rope.head_dim // 2
    planes = torch.stack([torch.arange(P), torch.arange(P) + P], 1)
    return dense_layer_sums(lay, list(BANDS.resolve(spec[a.layer]).dims), planes)


def _layer_ref(name: str, a: LayerActs, spec: RopeSpec, edges: Tensor | None) -> dict[str, Tensor]:
    """One layer's float64 reference sums for reducer ``name`` (``a`` already upcast)."""
    rb = BANDS.resolve(spec.layers[a.layer])
    if name == "usage":
        return _usage_ref(a)
    if name == "massive":
        return _massive_ref(a)
    if name == "offsets":
        return _offsets_ref(a)
    if name == "band_stats":
        return _band_ref(a, spec)
    if name == "heads":
        return _heads_ref(a, rb)
    if name == "sinks":
        return {**_sinks_ref(a, rb), **_sinks_more(a)}
    return _distance_ref(a, rb, edges)


def _reference(name: str, red, spec: RopeSpec, acts: dict[int, LayerActs]) -> dict[str, Tensor]:
    per = [_layer_ref(name, _wide(acts[L]), spec, getattr(red, "edges", None)) for L in red.layers]
    return {k: torch.stack([p[k] for p in per]) for k in per[0]}


def _scale(name: str, key: str, want: Tensor, ref_abs: dict[str, Tensor]) -> float:
    """The magnitude the float32 rounding of statistic ``key`` is relative to: its largest entry,
    or, where its terms cancel (variance, covariance, margin), the largest of the sums they cancel
    from."""
    big = {
        ("band_stats", "var"): "abs_sum",
        ("band_stats", "cov"): "abs_sum",
        ("band_stats", "margin"): "abs_sum",
        ("band_stats", "cs_term"): "cs_bound",
    }
    other = big.get((name, key))
    m = float(want.abs().max())
    if other in ref_abs:
        m = max(m, float(ref_abs[other].abs().max()))
    return max(m, 1e-30)


def _check(
    name: str, got: dict[str, Tensor], want: dict[str, Tensor], what: str
) -> dict[str, float]:
    """Every reference sum within TOL of its scale (counts exactly); returns the relative errors."""
    assert set(want) <= set(got), f"{what}: reducer lacks {set(want) - set(got)}"
    errs, bad = {}, []
    for key, w in want.items():
        g = got[key]
        assert g.shape == w.shape, f"{what} {key}: shape {tuple(g.shape)} vs {tuple(w.shape)}"
        err = float((g - w).abs().max()) / _scale(name, key, w, want)
        errs[key] = err
        if err > TOL:
            bad.append(f"{key}: max error {err:.2e} of its scale > {TOL:.0e}")
    assert not bad, f"{what}:\n  " + "\n  ".join(bad)
    return errs


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("name", NAMES)
def test_reducer_on_half_precision_matches_float64_reference(name, dtype, device, captured):
    """Fed a half-precision model's q and k, every sum equals the float64 reference to float32
    rounding."""
    _, spec, acts = captured(dtype, device)
    red = _reducer(name, spec, spec.rotary_layers)
    for L in spec.rotary_layers:
        red.update(acts[L])
    got = _sums(red)
    assert all(
        v.dtype == torch.float64
        for v in (red.state_dict() if hasattr(red, "state_dict") else red.sums).values()
    )
    _check(name, got, _reference(name, red, spec, acts), f"{name} on {dtype}")


@pytest.mark.parametrize("dtype", list(DTYPES))
def test_streamed_half_model_gives_the_captured_sums(dtype, captured):
    """Streaming the half model hands the reducer the tensors the capture kept: the sums are
    identical."""
    model, spec, acts = captured(dtype)
    fed, streamed = (
        BandStatsReducer(spec, spec.rotary_layers, BANDS, jsd=True, tile=(5, 3)) for _ in range(2)
    )
    for L in spec.rotary_layers:
        fed.update(acts[L])
    stream(model, [_tokens()], [streamed], spec=spec, progress=False)
    for k, v in fed.sums.items():
        assert torch.equal(streamed.sums[k], v), k


# ============================================================================ batch splits
# Six windows in batches of 1, 2 and 3: counts agree exactly. Each window's terms are float32
# reductions over at most N tokens (or a row of N keys) and windows add in float64, so a batch
# split can move only how float32 kernels group a window's own terms (tiles, vector blocking):
# within (d + 2N)·u32 ≈ 3.8e-6 of the statistic's scale, TOL with margin. Float64 addition order
# contributes windows · u64 ≈ 7e-16 of it, nothing at this tolerance.
@pytest.mark.parametrize("name", NAMES)
def test_batch_split_does_not_change_sums(name):
    from ropelens.run.distributed import run_windows

    model = tiny_model("gemma3")
    spec = rope_spec(model)
    toks = torch.randint(4, 100, (6, N), generator=torch.Generator().manual_seed(9))
    toks[:, 0] = 1
    runs = {}
    for bs in (1, 2, 3):
        red = _reducer(name, spec, spec.rotary_layers)
        run_windows(model, toks, [red], batch_size=bs, spec=spec, progress=False)
        runs[bs] = _sums(red)
    for bs in (2, 3):
        _check(name, runs[bs], runs[1], f"{name}: batches of {bs} vs 1")
