"""The Triton band statistics kernel, run on CPU tensors under Triton's interpreter.

Two checks: the kernel's per-query key scan against a dense float64 computation written here from
the definitions (hypothesis draws the shapes: lengths off the block size, one query, windows
shorter and longer than a block, grouped-query heads, soft-capping, padding); and
:class:`BandStatsReducer` with ``kernel="triton"`` against its own torch path on the tiny model of
each covered family (both plane pairings, partial rotary, GQA, sliding windows, soft-capping), with
a family the kernel does not cover (sinks) shown to keep the torch path.
"""

from __future__ import annotations

import os

os.environ.setdefault("TRITON_INTERPRET", "1")  # read by Triton at import: set before it

import pytest
import torch
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

pytest.importorskip("triton", reason="the band statistics kernel needs Triton (pip install triton)")

import ropelens
from ropelens import Bands
from ropelens.analyses.band_statistics import BandStatsReducer
from ropelens.kernels import band_statistics_triton
from ropelens.run.capture import stream
from ropelens.spec.reading import rope_spec
from ropelens.testing import tiny_tokenizer
from ropelens.testing.families import N_CHECK, VOCAB, family_hf_model

pytestmark = pytest.mark.skipif(
    os.environ.get("TRITON_INTERPRET") != "1",
    reason="TRITON_INTERPRET was set to something other than 1 before Triton was imported",
)
BLOCK = band_statistics_triton.BLOCK_KEYS


def dense_key_scan(queries, keys, valid, membership, window, softcap):
    """The kernel's outputs from full ``[batch, head, q, k]`` tensors, in float64."""
    q = queries.double().permute(0, 2, 1, 3)  # [b, h, n, d]
    n_heads, n_kv_heads = q.shape[1], keys.shape[1]
    k = keys.double().repeat_interleave(n_heads // n_kv_heads, dim=1)
    n = q.shape[2]
    positions = torch.arange(n)
    allowed = positions[None] <= positions[:, None]
    if window:
        allowed &= (positions[:, None] - positions[None]) < window
    allowed = allowed[None, None] & valid[:, None, None, :]  # [b, 1, n, n]
    member = membership.double()
    band_logits = torch.einsum("bhqd,bhkd,dc->bhcqk", q, k, member)  # per band, [b,h,band,q,k]
    scores = band_logits.sum(2).masked_fill(~allowed, 0.0)
    capped = torch.tanh(scores / softcap) if softcap else scores
    attended = capped.masked_fill(~allowed, float("-inf")).argmax(-1)  # first maximum
    masked = band_logits.masked_fill(~allowed[:, :, None], float("-inf"))
    band_max = masked.amax(-1)
    return dict(
        attended_key=attended,
        attended_band_logits=band_logits.gather(
            -1, attended[:, :, None, :, None].expand(-1, -1, member.shape[1], -1, 1)
        )[..., 0],
        band_max=band_max,
        band_ties=((masked == band_max[..., None]) & allowed[:, :, None]).sum(-1).double(),
        abs_logit_sum=band_logits.abs().masked_fill(~allowed[:, :, None], 0.0).sum(-1),
        score_square_sum=(scores**2).sum(-1),
        score_key_sum=scores @ k,
    )


def _membership(head_dim: int, pairing: str, rotary_dims: int, n_bands: int) -> torch.Tensor:
    """Bands of whole planes over the rotary dims, a band of its own for the rest."""
    half = rotary_dims // 2
    plane = torch.arange(half)
    dims = [plane, plane + half] if pairing == "half" else [2 * plane, 2 * plane + 1]
    member = torch.zeros(head_dim, n_bands + (rotary_dims < head_dim))
    for band, planes in enumerate(torch.tensor_split(plane, n_bands)):
        for pair_dims in dims:
            member[pair_dims[planes], band] = 1.0
    member[rotary_dims:, -1] = 1.0
    return member


@settings(
    max_examples=12,
    deadline=None,
    phases=(Phase.explicit, Phase.generate),
    database=None,
    suppress_health_check=[HealthCheck.too_slow],
)
@given(
    n=st.sampled_from([1, 7, BLOCK - 1, BLOCK + 3, 2 * BLOCK + 5]),
    window=st.sampled_from([None, 3, BLOCK - 2, BLOCK + 5]),
    # soft-caps the scores do not saturate in float32: where they do, the kernel's tanh and
    # torch's round differently and may tie different keys at the capped maximum
    softcap=st.sampled_from([None, 5.0, 50.0]),
    pairing=st.sampled_from(["half", "interleaved"]),
    partial=st.booleans(),
    group=st.sampled_from([1, 2]),
    padded=st.booleans(),
    seed=st.integers(0, 2**16),
    # the default blocks, and the tuner's other shapes: query blocks below, equal to and above
    # the key blocks
    blocks=st.sampled_from([None, (16, 32), (64, 32), (32, 64), (128, 32)]),
)
def test_kernel_key_scan_matches_dense(
    n, window, softcap, pairing, partial, group, padded, seed, blocks
):
    """Every per-query output of the kernel equals the dense computation (float32 tolerance; the
    attended key and tie counts exactly), with block shapes the tuner may choose."""
    _check_against_dense(n, window, softcap, pairing, partial, group, padded, seed, blocks)


@pytest.mark.parametrize("blocks", [b[:2] for b in band_statistics_triton.TUNED_BLOCKS])
@pytest.mark.parametrize("window", [None, 20])
def test_kernel_key_scan_matches_dense_with_each_tuned_block(blocks, window):
    """Each (query block, key block) the tuner tries on CUDA, on 75 positions (no block divides
    them) with grouped-query heads, padding and a soft-cap."""
    _check_against_dense(75, window, 50.0, "half", True, 2, True, 7, blocks)


def test_kernel_refuses_blocks_that_are_not_powers_of_two():
    x = torch.zeros(1, 4, 1, 16)
    with pytest.raises(ValueError, match="blocks must be powers of two of at least 16, got"):
        band_statistics_triton.key_scan(
            x, x.transpose(1, 2), torch.ones(1, 4, dtype=torch.bool), torch.ones(16, 1),
            window=None, softcap=None, blocks=(24, 32),
        )  # fmt: skip


def _check_against_dense(n, window, softcap, pairing, partial, group, padded, seed, blocks):
    generator = torch.Generator().manual_seed(seed)
    batch, n_kv_heads, head_dim = 2, 2, 16
    rotary_dims = 12 if partial else head_dim
    membership = _membership(head_dim, pairing, rotary_dims, 3)
    queries = torch.randn(batch, n, n_kv_heads * group, head_dim, generator=generator)
    keys = torch.randn(batch, n_kv_heads, n, head_dim, generator=generator)
    valid = torch.ones(batch, n, dtype=torch.bool)
    if padded and n > 1:
        valid[1, n // 2 :] = False
    got = band_statistics_triton.key_scan(
        queries, keys, valid, membership, window=window, softcap=softcap, blocks=blocks
    )
    want = dense_key_scan(queries, keys, valid, membership, window, softcap)
    # queries with a key to attend to (a padded query attends to nothing valid)
    seen = valid.clone()
    assert torch.equal(
        got.attended_key[seen[:, None].expand_as(got.attended_key)],
        want["attended_key"][seen[:, None].expand_as(got.attended_key)],
    )
    for name, value in want.items():
        if name == "attended_key":
            continue
        got_value = getattr(got, name).double()
        rows = (
            seen[:, None, None].expand_as(got_value)
            if got_value.dim() == 4 and name != ("score_key_sum")
            else None
        )
        if name == "score_key_sum":
            rows = seen[:, None, :, None].expand_as(got_value)
        elif got_value.dim() == 3:
            rows = seen[:, None].expand_as(got_value)
        torch.testing.assert_close(got_value[rows], value[rows], rtol=1e-4, atol=1e-4, msg=name)


# family -> what the kernel must cover there
FAMILY_CASES = {
    "llama": "grouped-query heads, half-split planes",
    "cohere": "interleaved planes",
    "phi": "partial rotary: a band of the unrotated dims",
    "gemma3_text": "sliding windows of 8 beside a global layer",
    "gemma2": "soft-capping at 50, alternating windows",
}


def _family_model(name: str, tmp_path):
    hf = family_hf_model(name)
    hf.save_pretrained(tmp_path)
    tiny_tokenizer().save_pretrained(tmp_path)
    return ropelens.load_model(tmp_path, device="cpu")


def _reducer_sums(model, kernel: str, tokens, valid):
    spec = rope_spec(model)
    reducer = BandStatsReducer(spec, list(spec.rotary_layers), Bands.quantiles(3), kernel=kernel)
    stream(model, [(tokens, valid)], [reducer], spec=spec, progress=False)
    return reducer, {key: value.detach().double() for key, value in reducer.sums.items()}


def _tokens(length: int = N_CHECK + 5):
    tokens = torch.randint(4, VOCAB, (2, length), generator=torch.Generator().manual_seed(0))
    tokens[:, 0] = 1
    return tokens


@pytest.mark.parametrize(
    ("family", "padded"),
    [(family, False) for family in FAMILY_CASES] + [("gemma3_text", True)],
    ids=[*FAMILY_CASES, "gemma3_text-padded"],
)
def test_triton_kernel_matches_torch_path(family, padded, tmp_path):
    """The reducer's sums through the kernel equal its torch path's (counts and top-1 exactly, the
    rest to float32 tolerance), and the provenance says the kernel ran."""
    model = _family_model(family, tmp_path)
    tokens = _tokens()
    valid = torch.ones_like(tokens, dtype=torch.bool)
    if padded:
        valid[1, 20:] = False
    kernel_reducer, kernel_sums = _reducer_sums(model, "triton", tokens, valid)
    _, torch_sums = _reducer_sums(model, "torch", tokens, valid)
    assert kernel_reducer.kernels_run == {"triton"}, FAMILY_CASES[family]
    for key, want in torch_sums.items():
        got = kernel_sums[key]
        assert torch.equal(torch.isnan(got), torch.isnan(want)), key
        known = ~torch.isnan(want)
        if key in ("n_entries", "n_rows", "n_queries"):
            assert torch.equal(got[known], want[known]), key
        else:
            torch.testing.assert_close(
                got[known],
                want[known],
                rtol=1e-4,
                atol=1e-4 * float(want[known].abs().max()),
                msg=f"{key} ({FAMILY_CASES[family]})",
            )
    assert float(kernel_sums["top1"].nansum()) > 0  # the comparison covers real agreement


def test_triton_kernel_records_itself_in_provenance(tmp_path):
    """The result's provenance names the key scan that ran."""
    model = _family_model("llama", tmp_path)
    tokens = _tokens(12)
    reducer, _ = _reducer_sums(model, "triton", tokens, torch.ones_like(tokens, dtype=torch.bool))
    provenance = ropelens.results.provenance.Provenance(model="llama")
    assert reducer.result(provenance).provenance.config["band_statistics_kernel"] == ["triton"]


def test_kernel_not_covering_sinks_keeps_torch_path(tmp_path):
    """gpt-oss's learned sinks are outside the kernel: those layers run the torch scan."""
    model = _family_model("gpt_oss", tmp_path)
    tokens = _tokens(12)
    reducer, _ = _reducer_sums(model, "triton", tokens, torch.ones_like(tokens, dtype=torch.bool))
    assert reducer.kernels_run == {"torch"}


def test_kernel_choice_refuses_unknown_name(tmp_path):
    """A kernel name other than torch or triton is refused in one line naming both."""
    spec = rope_spec(_family_model("llama", tmp_path))
    with pytest.raises(ropelens.errors.InputError, match="'torch' or 'triton'.*'cuda'"):
        BandStatsReducer(spec, [0], Bands.quantiles(3), kernel="cuda")
