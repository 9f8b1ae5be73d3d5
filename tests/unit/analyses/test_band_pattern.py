"""``AttentionDecomposition.band_pattern`` against HF's own eager attention with planes zeroed.

The reference never asks ropelens which head dims a band holds. For each layer and band subset,
HF runs its own eager attention with every other dim of the post-RoPE query and key set to 0
(its score scale, soft-cap, mask, sliding window and sinks applied by HF's code), and the pattern
HF returns for that layer is compared with ``band_pattern``:

- the dims of each plane come from the family's HF rotation: ``rotate_half`` pairs dims ``i`` and
  ``i + rotary_dim/2``, the interleaved rotations (GPT-J's ``rotate_every_two``, Cohere's and GLM's
  interleaved ``rotate_half``, DeepSeek-V2's complex product) pair ``2i`` and ``2i + 1``;
  multi-head latent attention puts its rotary dims after the no-position ones;
- a plane's frequency is HF's own (the rotary module's ``inv_freq``, GPT-J's sinusoid table), and
  bands are equal-count groups of planes sorted fastest first.

So a plane pairing, band membership or rotary offset that ropelens reads wrongly changes the
pattern of single planes and bands, which a check of summed logits would not see.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import importlib
import math
import re
from collections.abc import Iterator

import numpy as np
import pytest
import torch
from torch import Tensor
from transformers import AutoModelForCausalLM

import ropelens
from ropelens import Bands
from ropelens.analyses import attention_decomposition
from ropelens.errors import InputError
from ropelens.testing import tiny_hf_model, tiny_tokenizer
from ropelens.testing.families import FAMILIES, VOCAB, family_hf_model

N = 30  # tokens per row: more than three sliding windows of 8
ATOL = 2e-5  # float32 probabilities
FAR_FROM_UNIFORM = 0.25  # least mean total-variation distance of the model's rows from uniform
# The family matrix's q/k weights are ×4; ×2 again makes every family's attention sharp (mean
# total-variation distance from uniform 0.3-0.9 per layer). Norms on q or k (Qwen3, OLMo 2, Gemma 3,
# MLA's latent norms) undo a scaled projection, so their gains are scaled too.
GAIN = 2.0
QK_PARAM = re.compile(
    r"(q_proj|k_proj|qkv_proj|query_key_value|q_a_proj|q_b_proj|kv_a_proj|kv_b_proj|q_norm|k_norm"
    r"|q_layernorm|k_layernorm|query_layernorm|key_layernorm)"
)
GPTJ = "gptj"  # ropelens.testing's tiny GPT-J (interleaved pairs, rotary_dim 8 of 16)

# HF's rotations that pair adjacent dims (2i, 2i + 1); every other family uses rotate_half
INTERLEAVED = {
    "cohere",  # rotate_half over x[..., ::2] and x[..., 1::2], cos/sin repeat_interleave'd
    "cohere2",
    "glm",  # the same interleaved rotate_half
    "deepseek_v2",  # view_as_complex over reshape(..., -1, 2)
    "llama4",  # view_as_complex
    "helium",  # interleaved rotate_half
    GPTJ,  # rotate_every_two
}

FAMILY_NAMES = [f for f, fam in FAMILIES.items() if fam.refused is None] + [GPTJ]


def _param(name: str):
    import transformers

    cls = "GPTJConfig" if name == GPTJ else FAMILIES[name].config_class
    why = f"transformers {transformers.__version__} has no {cls}"
    return pytest.param(name, marks=pytest.mark.skipif(not hasattr(transformers, cls), reason=why))


# ============================================================================ the HF side
def hf_inv_freq(hf, layer: int) -> Tensor:
    """The frequencies HF rotates ``layer`` with: its rotary module's buffer (the layer type's own
    where it keeps one per type), or GPT-J's sinusoid table (row 1 holds sin and cos of them)."""
    cfg = hf.config.get_text_config()
    types = getattr(cfg, "layer_types", None)
    for m in hf.modules():
        if types and isinstance(getattr(m, f"{types[layer]}_inv_freq", None), Tensor):
            return getattr(m, f"{types[layer]}_inv_freq").double()
        if isinstance(getattr(m, "inv_freq", None), Tensor):
            return m.inv_freq.double()
        if isinstance(getattr(m, "embed_positions", None), Tensor):
            row = m.embed_positions[1].double()
            return torch.atan2(*row.chunk(2))
    raise AssertionError(f"{type(hf).__name__} holds no inv_freq")


@dataclasses.dataclass(frozen=True)
class HFPlanes:
    """One layer's planes in HF's head layout, fastest first."""

    dims: Tensor  # [P, 2] the head dims of each plane
    rest: Tensor  # head dims in no plane
    head_dim: int

    @property
    def n(self) -> int:
        return self.dims.shape[0]


def hf_planes(hf, layer: int, head_dim: int, *, adjacent: bool) -> HFPlanes:
    """The planes of ``layer`` from HF's frequencies, paired as HF's rotation pairs them:
    ``adjacent`` (2i, 2i + 1), else rotate_half's (i, i + rotary_dim/2)."""
    inv = hf_inv_freq(hf, layer)
    n = inv.numel()
    offset = getattr(hf.config.get_text_config(), "qk_nope_head_dim", None) or 0  # MLA
    i = torch.arange(n)
    pairs = torch.stack([2 * i, 2 * i + 1] if adjacent else [i, i + n], dim=1) + offset
    order = torch.sort(-inv, stable=True).indices
    rest = torch.tensor([d for d in range(head_dim) if d not in set(pairs.flatten().tolist())])
    return HFPlanes(pairs[order], rest.long(), head_dim)


def _zero_but(x: Tensor, keep: Tensor) -> Tensor:
    """``x`` with every head dim (last axis) but ``keep`` set to 0."""
    drop = torch.ones(x.shape[-1], dtype=torch.bool)
    drop[keep] = False
    return x.masked_fill(drop, 0.0)


@contextlib.contextmanager
def _patched(mod, name: str, fn) -> Iterator[None]:
    orig = getattr(mod, name)
    setattr(mod, name, fn)
    try:
        yield
    finally:
        setattr(mod, name, orig)


def hf_patterns(hf, toks: Tensor, keeps: dict[int, list[Tensor]]) -> dict[int, list[Tensor]]:
    """HF's attention probabilities ``[batch, head, q, k]`` of each layer, once for each set of
    head dims in ``keeps[layer]``, with only those dims of its post-RoPE queries and keys.

    HF's ``eager_attention_forward`` is called once per set with the other dims zeroed, and its
    probabilities (what ``output_attentions`` returns) kept; the forward goes on with the unchanged
    call, so one forward serves every layer. A family that scores inline (Falcon) gets its rotation
    zeroed instead, one forward per layer and set (reading ``output_attentions``)."""
    mod = importlib.import_module(type(hf).__module__)
    eager = getattr(mod, "eager_attention_forward", None)
    got: dict[int, list[Tensor]] = {}
    if eager is not None:

        def wrapped(module, query, key, value, attention_mask, *args, **kwargs):
            L = getattr(module, "layer_idx", None)
            for keep in keeps.get(L, ()):
                o = eager(
                    module, _zero_but(query, keep), _zero_but(key, keep), value, attention_mask,
                    *args, **kwargs,
                )  # fmt: skip
                got.setdefault(L, []).append(o[1].detach().float())
            return eager(module, query, key, value, attention_mask, *args, **kwargs)

        with torch.no_grad(), _patched(mod, "eager_attention_forward", wrapped):
            hf(toks, output_attentions=True)
    elif hasattr(mod, "apply_rotary_pos_emb"):
        rotate = mod.apply_rotary_pos_emb
        for L, sets in keeps.items():
            for keep in sets:
                calls = []

                def zeroed(q, k, *args, keep=keep, L=L, calls=calls, **kwargs):
                    q, k = rotate(q, k, *args, **kwargs)
                    calls.append(None)
                    return (
                        (_zero_but(q, keep), _zero_but(k, keep)) if len(calls) == L + 1 else (q, k)
                    )

                with torch.no_grad(), _patched(mod, "apply_rotary_pos_emb", zeroed):
                    probs = hf(toks, output_attentions=True).attentions
                got.setdefault(L, []).append(probs[L].float())
    else:
        pytest.skip(f"{mod.__name__} has neither eager_attention_forward nor apply_rotary_pos_emb")
    missing = sorted(set(keeps) - set(got))
    if missing:
        pytest.skip(f"{type(hf).__name__}: HF's attention of layers {missing} could not be hooked")
    return got


# ============================================================================ fixtures
@dataclasses.dataclass
class Case:
    family: str
    hf: object
    dec: object  # AttentionDecomposition of every rotary layer
    toks: Tensor


def _sharp_dir(family: str, dest):
    """The family's tiny model with its query and key weights (and q/k norm gains) scaled up, saved
    with the tiny tokenizer (GPT-J's ×4 first, like the family matrix's)."""
    if family == GPTJ:
        hf = tiny_hf_model(GPTJ)
        with torch.no_grad():
            for name, p in hf.named_parameters():
                if name.endswith(("q_proj.weight", "k_proj.weight")):
                    p.mul_(4.0)
    else:
        hf = family_hf_model(family)
    with torch.no_grad():
        for name, p in hf.named_parameters():
            if QK_PARAM.search(name):
                p.mul_(GAIN)
    hf.save_pretrained(dest)
    tiny_tokenizer().save_pretrained(dest)
    return dest


@pytest.fixture(scope="module")
def case(tmp_path_factory):
    """``case(family)``: HF's eager model and ropelens's decomposition of one input, both loaded
    from the same saved directory."""

    @functools.cache
    def load(family: str) -> Case:
        path = _sharp_dir(family, tmp_path_factory.mktemp(family) / family)
        hf = AutoModelForCausalLM.from_pretrained(path, attn_implementation="eager").eval()
        model = ropelens.load_model(path, device="cpu")
        toks = torch.randint(4, VOCAB, (2, N), generator=torch.Generator().manual_seed(1))
        toks[:, 0] = 1
        dec = attention_decomposition(model, toks, verify=False)  # every rotary layer
        return Case(family, hf, dec, toks)

    return load


def _n_bands(n_planes: int) -> int:
    """Quantiles of equal plane count: 4 where they divide the planes, else 3, 2 or 1."""
    return next(k for k in (4, 3, 2, 1) if n_planes % k == 0)


def _subsets(n_bands: int, n_planes: int, rest: bool) -> list[tuple]:
    """(bands, planes) arguments to try: band names, indices, pairs, planes, mixes, rest."""
    last = f"Q{n_bands}"
    subsets = [(["Q1"], None), ([last], None), ([], [0]), ([], [n_planes - 1])]
    if n_bands >= 3:
        subsets += [(["Q1", "Q3"], None), ([0, 2], [n_planes - 1])]
    if n_bands >= 2:
        subsets += [(["Q2"], [0])]
    if rest:
        subsets += [(["rest"], None), (["Q1", "rest"], None)]
    return subsets


def _hf_dims(p: HFPlanes, n_bands: int, bands, planes) -> Tensor:
    """The HF head dims of the chosen bands (quantiles of the fastest-first planes) and planes."""
    size = p.n // n_bands
    dims = [p.rest] if "rest" in (bands or ()) else []
    for b in bands or ():
        if b != "rest":
            j = int(b[1:]) - 1 if isinstance(b, str) else b
            dims.append(p.dims[j * size : (j + 1) * size].flatten())
    dims += [p.dims[i] for i in planes or ()]
    return torch.cat(dims) if dims else torch.zeros(0, dtype=torch.long)


def _tv_from_uniform(pattern: Tensor, allowed: Tensor) -> float:
    """Mean total-variation distance from uniform over the allowed keys, rows with ≥ 4 keys."""
    n = allowed.sum(-1, keepdim=True)  # [b, q, 1]
    uniform = allowed / n
    tv = 0.5 * (pattern - uniform[:, None]).abs().sum(-1)  # [b, h, q]
    rows = (n[..., 0] >= 4)[:, None].expand_as(tv)
    return float(tv[rows].mean())


# ============================================================================ tests
def _check_regime(c: Case, dec, L: int) -> None:
    """What makes the comparison bite holds in layer ``L``: the model's attention is far from
    uniform, the input is longer than a sliding window, and a soft-cap bends the largest logit."""
    tv = _tv_from_uniform(dec.pattern(L), dec.mask(L))
    assert tv > FAR_FROM_UNIFORM, f"layer {L}: the model's attention is near uniform (TV {tv:.2f})"
    fam = FAMILIES.get(c.family)
    if fam is not None and L in fam.windows:
        assert int(dec.mask(L)[0, -1].sum()) == fam.windows[L] < N, f"layer {L}: window unused"
    if fam is not None and fam.softcap:
        top = float(dec.logits(L).nan_to_num(neginf=0).abs().max())
        bent = top - fam.softcap * math.tanh(top / fam.softcap)
        assert bent > 0.5, f"layer {L}: the soft-cap bends the largest logit by {bent:.2g} only"


def _layer_plan(c: Case, L: int) -> list[tuple[str, Tensor, Tensor]]:
    """(what, band_pattern's pattern, the HF dims it keeps) for every choice tried in layer ``L``;
    asserts along the way what needs no HF run."""
    head_dim = c.dec.acts[L]["q_post"].shape[-1]
    p = hf_planes(c.hf, L, head_dim, adjacent=c.family in INTERLEAVED)
    k = _n_bands(p.n)
    dec = dataclasses.replace(c.dec, bands=Bands.quantiles(k))
    allowed = dec.mask(L)[:, None]
    _check_regime(c, dec, L)
    every = dec.band_pattern(L)
    torch.testing.assert_close(every, dec.pattern(L), rtol=0, atol=ATOL)
    # no band: every allowed key alike (the sinks keep their share)
    none = dec.band_pattern(L, bands=[])
    row_max = none.masked_fill(~allowed, 0).amax(-1, keepdim=True)
    torch.testing.assert_close(none, row_max * allowed, rtol=0, atol=1e-6)
    sinks = c.family in FAMILIES and FAMILIES[c.family].sinks
    assert (none.sum(-1).amax() < 0.99) if sinks else torch.allclose(none.sum(-1), torch.ones(1))
    # the full band name and its first word choose the same band
    assert torch.equal(
        dec.band_pattern(L, bands=[dec.band_names(L)[0]]), dec.band_pattern(L, bands=["Q1"])
    )
    plan = [
        ("all bands", every, torch.arange(head_dim)),
        ("no band", none, torch.zeros(0, dtype=torch.long)),
    ]
    for bands, planes in _subsets(k, p.n, bool(p.rest.numel())):
        plan.append(
            (
                f"bands={bands} planes={planes}",
                dec.band_pattern(L, bands=bands, planes=planes),
                _hf_dims(p, k, bands, planes),
            )
        )
    return plan


@pytest.mark.parametrize("family", [_param(f) for f in FAMILY_NAMES])
def test_band_pattern_equals_hf_with_other_planes_zeroed(family, case):
    """Every band subset's pattern equals HF's eager attention with the other dims zeroed; all bands
    give the model's pattern, none a uniform one."""
    c = case(family)
    plans = {L: _layer_plan(c, L) for L in c.dec.layers}
    refs = hf_patterns(c.hf, c.toks, {L: [keep for *_, keep in plan] for L, plan in plans.items()})
    errors, worst = [], 0.0
    for L, plan in plans.items():
        for (what, got, _), want in zip(plan, refs[L], strict=True):
            err = float((got - want).abs().max())
            worst = max(worst, err)
            if err > ATOL:
                errors.append(f"layer {L} {what}: max |Δ| {err:.3g}")
    assert not errors, f"{family}: band_pattern differs from HF:\n  " + "\n  ".join(errors)
    print(f"{family}: max |band_pattern - HF| {worst:.3g} over {len(plans)} layers")


@pytest.mark.parametrize("family", [_param(f) for f in FAMILY_NAMES])
def test_reference_tells_pairings_and_planes_apart(family, case):
    """The comparison above can fail: HF with the other pairing, or with another plane, gives a
    pattern far from ``band_pattern``'s for plane 0."""
    c = case(family)
    L = c.dec.layers[-1]
    head_dim = c.dec.acts[L]["q_post"].shape[-1]
    p, swapped = (
        hf_planes(c.hf, L, head_dim, adjacent=(family in INTERLEAVED) != s) for s in (False, True)
    )
    wrong, other = hf_patterns(c.hf, c.toks, {L: [swapped.dims[0], p.dims[p.n - 1]]})[L]
    got = c.dec.band_pattern(L, planes=[0])
    assert float((got - wrong).abs().max()) > 1e-2
    assert float((got - other).abs().max()) > 1e-2


def test_band_pattern_input_errors(case):
    dec = case("llama").dec
    L = dec.layers[0]
    n = dec.spec.layers[L].n_planes
    with pytest.raises(InputError, match=r"'Q9' is not a band of layer 0: choose from"):
        dec.band_pattern(L, bands=["Q9"])
    with pytest.raises(InputError, match=r"band 99 is not a band"):
        dec.band_pattern(L, bands=[99])
    with pytest.raises(InputError, match=rf"plane {n} is not a plane of layer 0: .*0\.\.{n - 1}"):
        dec.band_pattern(L, planes=[n])
    with pytest.raises(InputError, match=r"plane -1 is not a plane"):
        dec.band_pattern(L, planes=[-1])
    with pytest.raises(InputError, match=r"bands and planes are lists"):
        dec.band_pattern(L, bands="plane 0")
    with pytest.raises(InputError, match=r"bands and planes are lists"):
        dec.band_pattern(L, planes=3)
    with pytest.raises(InputError, match=r"bands and planes are lists"):
        dec.band_pattern(L, planes=np.int64(3))
    with pytest.raises(InputError, match=r"plane True is not a plane"):
        dec.band_pattern(L, planes=[True])
    with pytest.raises(InputError, match=r"band 'rest' is not a band of layer 0"):
        dec.band_pattern(L, bands=["rest"])  # every dim of this head is in a plane
    with pytest.raises(InputError, match=r"layer 7 was not decomposed"):
        dec.band_pattern(7)


def test_band_pattern_takes_numpy_and_torch_indices(case):
    """Plane and band indices from numpy or torch choose what the same Python ints choose."""
    dec = case("llama").dec
    L = dec.layers[0]
    want = dec.band_pattern(L, bands=[1], planes=[0, 2])
    for bands, planes in [
        (np.array([1]), np.array([0, 2])),
        (torch.tensor([1]), torch.tensor([0, 2])),
        ([np.int64(1)], (torch.tensor(0), 2)),
        ((1,), range(0, 3, 2)),
    ]:
        assert torch.equal(dec.band_pattern(L, bands=bands, planes=planes), want)
