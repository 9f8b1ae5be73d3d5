"""BandStatsReducer's tiled corpus sums against a dense reference built from HF's own attention.

The reducer sees only post-RoPE queries and keys: it rebuilds each layer's scores tile by tile
(``tile`` queries at a time) and applies the causal mask, sliding window, soft-capping and sinks
itself. Here every one of its sums is recomputed densely, plainly and independently of that code, by
:mod:`tests.harness.dense` (which imports nothing of ropelens): from the queries, keys, score
scale, mask, soft-cap and sinks HF's own ``eager_attention_forward`` receives and the probabilities
it returns, in float64 over full ``[batch, head, q, k]`` tensors; plane pairs come from the family
record here, not from the spec.

Only the grouping of head dims into bands is taken from ropelens (``Bands.resolve``), and it is
checked to partition the head into whole planes. ``test_reference_reproduces_hf_attention`` shows
the reference is right: HF passes the family's windows, and its summed band logits, through its own
mask, cap and sinks, give HF's attention probabilities.

``gemma2_saturated`` is Gemma 2 with its query weights scaled up until the soft-cap saturates in
float32: several keys of a row then share the capped maximum and the model attends to the first of
them, not to the key with the largest raw score, so the soft-cap decides the attended key.
"""

from __future__ import annotations

import functools
import importlib.metadata
from dataclasses import dataclass, field

import pytest
import torch
from torch import Tensor
from transformers import AutoModelForCausalLM

import ropelens
from ropelens import Bands
from ropelens.analyses.band_statistics import BandStatsReducer
from ropelens.run.capture import stream
from ropelens.spec.reading import rope_spec
from ropelens.testing import tiny_tokenizer
from ropelens.testing.families import FAMILIES, N_CHECK, VOCAB, family_hf_model
from tests.harness.dense import (
    allowed_keys,
    band_logits,
    dense_reference,
    hf_layers,
    keys_per_head,
    pattern_of,
)

# the package exports the function under the module's name: the module itself, for its constants
band_statistics = importlib.import_module("ropelens.analyses.band_statistics")

N = N_CHECK + 5  # 29 tokens: not a multiple of any tile below, more than three windows of 8
BANDS = Bands.quantiles(
    3
)  # 8 planes -> bands of unequal width; Phi's 3 planes -> 3 bands + a wide "rest"
TILES = (1, 5, 7, None)
EXACT_KEYS = ("n_entries", "n_rows", "n_queries")
# top-1 adds shares of tied keys (1/k): exact up to the float64 rounding of their sum
SHARE_KEYS = ("top1",)
RTOL, ATOL = 1e-4, 1e-5

# case -> (family, gain on the query weights)
CASES = {
    "llama": ("llama", 1.0),  # grouped-query attention (4 heads, 2 KV heads)
    "gemma3_text": ("gemma3_text", 1.0),  # sliding windows of 8 on layers 0-2, global layer 3
    "gemma2": ("gemma2", 1.0),  # soft-capping at 50, alternating windows
    "gemma2_saturated": ("gemma2", 300.0),  # soft-cap saturated: it decides the attended key
    "gpt_oss": ("gpt_oss", 1.0),  # learned sinks, YaRN, alternating windows
    "cohere": ("cohere", 1.0),  # adjacent-pair rotation
    "phi": ("phi", 1.0),  # partial rotary (6 of 16 dims): a "rest" band
}


def _case(name: str):
    import transformers

    cls = FAMILIES[CASES[name][0]].config_class
    why = f"transformers {importlib.metadata.version('transformers')} has no {cls}"
    return pytest.param(name, marks=pytest.mark.skipif(not hasattr(transformers, cls), reason=why))


# ============================================================================ fixtures
@dataclass
class Case:
    name: str
    model: object  # the ropelens bridge
    spec: object
    hf: object  # the same weights in HF, eager attention
    dims: dict[int, list[Tensor]]  # layer -> head dims of each band
    planes: Tensor  # [P, 2] head dims of each plane, from the family record
    refs: dict = field(default_factory=dict)  # cached dense references
    sums: dict = field(default_factory=dict)  # cached reducer runs over the unpadded batch

    @property
    def layers(self) -> list[int]:
        return list(self.spec.rotary_layers)


def _save(name: str, dest):
    family, gain = CASES[name]
    hf = family_hf_model(family)
    with torch.no_grad():
        for pname, p in hf.named_parameters():
            if "q_proj" in pname:
                p.mul_(gain)
    hf.save_pretrained(dest)
    tiny_tokenizer().save_pretrained(dest)
    return dest


def _hand_planes(family: str) -> Tensor:
    fam = FAMILIES[family]
    n = int(fam.head_dim * fam.rotary_fraction) // 2
    i = torch.arange(n)
    return torch.stack([i, i + n] if fam.pairing == "half" else [2 * i, 2 * i + 1], dim=1)


@pytest.fixture(scope="module")
def case(tmp_path_factory):
    """``case(name)``: the model loaded by ropelens and by HF (eager) from one saved directory."""

    @functools.cache
    def load(name: str) -> Case:
        path = _save(name, tmp_path_factory.mktemp(name) / name)
        model = ropelens.load_model(path, device="cpu")
        spec = rope_spec(model)
        hf = AutoModelForCausalLM.from_pretrained(path, attn_implementation="eager").eval()
        dims = {L: list(BANDS.resolve(spec[L]).dims) for L in spec.rotary_layers}
        return Case(name, model, spec, hf, dims, _hand_planes(CASES[name][0]))

    return load


def _tokens() -> Tensor:
    toks = torch.randint(4, VOCAB, (2, N), generator=torch.Generator().manual_seed(0))
    toks[:, 0] = 1
    return toks


def reference(c: Case, runs: list[Tensor]) -> dict[str, Tensor]:
    """Dense sums over separate unpadded runs (each a ``[b, n]`` token tensor), added up, ``[layer,
    ...]``."""
    return dense_reference(c.hf, runs, c.layers, c.dims, dict.fromkeys(c.layers, c.planes))


def reducer_sums(
    c: Case,
    batches: list[tuple[Tensor, Tensor]],
    tile: int | tuple[int, int] | None,
    jsd: bool = True,
) -> dict[str, Tensor]:
    """The reducer's sums, streamed over ``(tokens, valid)`` batches through ropelens's capture."""
    red = BandStatsReducer(c.spec, c.layers, BANDS, jsd=jsd, tile=tile)
    stream(c.model, batches, [red], spec=c.spec, progress=False)
    return {k: v.detach().double().cpu() for k, v in red.sums.items()}


def _full(toks: Tensor) -> tuple[Tensor, Tensor]:
    return toks, torch.ones_like(toks, dtype=torch.bool)


def assert_sums_match(
    got: dict[str, Tensor],
    want: dict[str, Tensor],
    what: str,
    rtol=RTOL,
    atol=ATOL,
    rel_floor: float = 0.0,
) -> None:
    """Counts exactly, top-1 (a sum of shares of tied keys) to 1e-9, the rest to ``rtol``/``atol``;
    every mismatching sum is reported.

    ``rel_floor`` raises each sum's ``atol`` to that fraction of its largest |value|: a sum that
    cancels to near 0 keeps the float32 rounding of its largest terms (q/k-normed models with large
    scores)."""
    assert set(want) <= set(got), f"reducer lacks sums {set(want) - set(got)}"
    errors = []
    for key, w in want.items():
        g = got[key]
        if g.shape != w.shape:
            errors.append(f"{key} has shape {tuple(g.shape)}, reference {tuple(w.shape)}")
        elif torch.isnan(g).any():
            where = torch.isnan(g)
            errors.append(
                f"{key} is NaN at {where.nonzero()[:4].tolist()}; want {w[where][:4].tolist()}"
            )
        elif key in EXACT_KEYS or key in SHARE_KEYS:
            bad = ((g - w).abs() > (1e-9 if key in SHARE_KEYS else 0)).nonzero().tolist()
            if bad:
                errors.append(
                    f"{key} differs at {bad[:4]}: got {[g[tuple(i)].item() for i in bad[:4]]}, "
                    f"want {[w[tuple(i)].item() for i in bad[:4]]}"
                )
        else:
            try:
                torch.testing.assert_close(
                    g, w, rtol=rtol, atol=max(atol, rel_floor * float(w.abs().max()))
                )
            except AssertionError as e:
                errors.append(f"{key}: " + " ".join(str(e).split("\n")[1:4]))
    assert not errors, f"{what}:\n  " + "\n  ".join(errors)


def _full_sums(c: Case, tile: int | None) -> dict[str, Tensor]:
    """The reducer's sums over the unpadded two-row batch (one run per case and tile)."""
    if tile not in c.sums:
        c.sums[tile] = reducer_sums(c, [_full(_tokens())], tile)
    return c.sums[tile]


def _reference_cached(c: Case, length: int | None = None) -> dict[str, Tensor]:
    """The dense reference of the two-row batch, or (``length``) of row 0 and of row 1 cut to
    ``length``, run separately."""
    if length not in c.refs:
        toks = _tokens()
        c.refs[length] = reference(c, [toks] if length is None else [toks[:1], toks[1:2, :length]])
    return c.refs[length]


# ============================================================================ tests
@pytest.fixture(autouse=True)
def _gram_everywhere(monkeypatch):
    """Σ y² and Σ y·k from the running Σ k kᵀ wherever a tile has keys all its queries see (the
    reducer does that only past GRAM_MIN_KEYS such keys: these inputs are shorter)."""
    monkeypatch.setattr(band_statistics, "GRAM_MIN_KEYS", 1)


@pytest.mark.parametrize("name", [_case(n) for n in CASES])
def test_reference_reproduces_hf_attention(name, case):
    """The reference is right: HF passes the family's windows, cap and sinks; bands partition the
    head into whole planes; and the summed band logits, through the reference's own mask, cap and
    sinks, give HF's attention probabilities."""
    c = case(name)
    fam = FAMILIES[CASES[name][0]]
    toks = _tokens()
    lays = hf_layers(c.hf, toks)
    assert c.layers == list(range(len(lays)))
    for L in c.layers:
        lay = lays[L]
        assert lay.window == fam.windows.get(L)
        assert lay.softcap == fam.softcap
        assert (lay.sinks is not None) == fam.sinks
        assert lay.allowed is not None and torch.equal(
            lay.allowed, allowed_keys(N, lay.window)
        )  # HF's own mask
        d = lay.q.shape[-1]
        assert sorted(torch.cat(c.dims[L]).tolist()) == list(
            range(d)
        )  # bands sum to the whole score
        band_of = {int(i): j for j, dd in enumerate(c.dims[L]) for i in dd}
        assert all(
            band_of[int(a)] == band_of[int(b)] for a, b in c.planes
        )  # planes are never split
        X = band_logits(lay, c.dims[L])
        ok = allowed_keys(N, lay.window)
        torch.testing.assert_close(
            pattern_of(lay, X.sum(2), ok).float(), lay.probs, rtol=0, atol=1e-4
        )
        if lay.softcap is None:  # the summed band logits are the model's pre-softmax scores
            raw = (
                lay.q.double()
                @ keys_per_head(lay.k.double(), lay.q.shape[1]).transpose(-1, -2)
                * lay.scale
            )
            torch.testing.assert_close(X.sum(2), raw, rtol=1e-10, atol=1e-10)
    if (
        name == "gemma2_saturated"
    ):  # the cap decides: HF's attended key is often not the raw-score argmax
        Y = (
            band_logits(lays[0], c.dims[0])
            .sum(2)
            .masked_fill(~allowed_keys(N, lays[0].window), float("-inf"))
        )
        assert int((Y.argmax(-1) != lays[0].probs.argmax(-1)).sum()) >= 10


ALL_TILES = (
    "llama",
    "gemma3_text",
    "gemma2_saturated",
    "gpt_oss",
)  # every tile; the rest: (5, None)
DENSE = [(n, t) for n in CASES for t in (TILES if n in ALL_TILES else (5, None))]


@pytest.mark.parametrize(
    ("name", "tile"), [pytest.param(n, t, id=f"{n}-{t}", marks=_case(n).marks) for n, t in DENSE]
)
def test_band_sums_match_dense_reference(name, tile, case):
    """Every streamed sum (abs, cov, margin, top-1, JSD, var, counts, Cauchy–Schwarz) equals the
    dense reference over the same unpadded two-row batch."""
    c = case(name)
    assert_sums_match(_full_sums(c, tile), _reference_cached(c), f"{name} tile={tile}")


@pytest.mark.parametrize(
    "name", [_case(n) for n in ("llama", "gemma3_text", "gemma2_saturated", "gpt_oss", "phi")]
)
def test_tile_does_not_change_sums(name, case):
    """Tiles of 1, 5, 7, the whole input and more than the input give the automatic tile's sums."""
    c = case(name)
    for tile in (1, 5, 7, N, 4 * N):
        assert_sums_match(
            _full_sums(c, tile),
            _full_sums(c, None),
            f"{name} tile={tile} vs automatic",
            rtol=1e-5,
            atol=1e-6,
        )


@pytest.mark.parametrize("length", [pytest.param(23, id="pad6"), pytest.param(17, id="pad12")])
@pytest.mark.parametrize("tile", (7, None))
@pytest.mark.parametrize("name", [_case(n) for n in ("llama", "gemma3_text", "gemma2", "gpt_oss")])
def test_right_padding_equals_unpadded_rows(name, tile, length, case):
    """A right-padded batch gives the sums of its rows run alone at their true lengths (reducer and
    dense reference alike): padded queries and keys count nowhere. Row 1 holds ``length`` real
    tokens of 29: 6 pads stay inside one window of 8, 12 pads fill whole windows (padded queries
    that see no real key at all)."""
    c = case(name)
    toks = _tokens()
    toks[1, length:] = 3  # the pad token
    valid = torch.arange(N)[None, :] < torch.tensor([N, length])[:, None]
    padded = reducer_sums(c, [(toks, valid)], tile)
    rows = [toks[:1], toks[1:2, :length]]
    alone = reducer_sums(c, [_full(rows[0]), _full(rows[1])], tile)
    assert_sums_match(
        padded, alone, f"{name} tile={tile}: padded vs rows alone", rtol=1e-5, atol=1e-6
    )
    assert_sums_match(
        padded, _reference_cached(c, length), f"{name} tile={tile}: padded vs reference"
    )


KEY_TILES = ((5, 3), (7, 8), (1, 1), (16, 13))


@pytest.mark.parametrize(
    "name", [pytest.param(n, marks=_case(n).marks) for n in ALL_TILES + ("phi",)]
)
def test_key_tiles_carry_the_attended_key_across_tiles(name, case):
    """Rows split over several key tiles (the attended key, its band logits, the band maxima and
    the sums carried from tile to tile) give the dense reference; without JSD, which needs whole
    rows."""
    c = case(name)
    want = {k: v for k, v in _reference_cached(c).items() if k != "jsd"}
    for tile in KEY_TILES:
        got = reducer_sums(c, [_full(_tokens())], tile, jsd=False)
        assert_sums_match(got, want, f"{name} tile={tile}")
        rows = _tokens()
        valid = torch.ones_like(rows, dtype=torch.bool)
        valid[1, N - 12 :] = False  # padding: the general mask, also per key tile
        padded = reducer_sums(c, [(rows, valid)], tile, jsd=False)
        alone = reducer_sums(c, [_full(rows[:1]), _full(rows[1:, : N - 12])], tile, jsd=False)
        assert_sums_match(
            padded, alone, f"{name} tile={tile}: padded vs rows alone", rtol=1e-5, atol=1e-6
        )


@pytest.mark.parametrize(
    "name", [pytest.param(n, marks=_case(n).marks) for n in ("llama", "gemma3_text", "gpt_oss")]
)
def test_scores_alone_give_the_same_sums(name, case, monkeypatch):
    """With the running Σ k kᵀ off (every Σ y² and Σ y·k from the scores), every tile gives the
    reference."""
    monkeypatch.setattr(band_statistics, "GRAM_MIN_KEYS", 1 << 30)
    c = case(name)
    want = {k: v for k, v in _reference_cached(c).items() if k != "jsd"}
    for tile in (None, 7, (5, 3)):
        assert_sums_match(
            reducer_sums(c, [_full(_tokens())], tile, jsd=False),
            want,
            f"{name} tile={tile}, scores only",
        )


def test_bad_tile_is_refused(case):
    c = case("llama")
    for bad in (0, -3, (4, 0), (1, 2, 3), 2.5):
        with pytest.raises(ValueError, match="tile must be"):
            BandStatsReducer(c.spec, c.layers, BANDS, tile=bad)
