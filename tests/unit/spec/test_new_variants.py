"""Resonance RoPE, CoPE's soft clipping and FoPE's zeroing: frequencies against closed forms written
out here, rotated queries in a bridge and a plain HF model, serialisation, CLI parsing and refused
parameters."""

from __future__ import annotations

import json
import math

import pytest
import torch

from ropelens import rope_spec
from ropelens.cli.variant_syntax import parse_variant
from ropelens.errors import InputError
from ropelens.loading.models import wrap_hf_model
from ropelens.run.capture import capture_qk
from ropelens.run.intervene import apply_rope_variant, with_rope_variant
from ropelens.spec.variants import CoPE, FoPEZero, Resonance, YaRN, variant_from_dict
from ropelens.testing import tiny_hf_model, tiny_model, tiny_tokenizer

TWO_PI = 2 * math.pi


@pytest.fixture(scope="module")
def llama():
    return tiny_model("llama")


@pytest.fixture(scope="module")
def layer(llama):
    return rope_spec(llama)[0]


def _plain_theta(base: float, d: int) -> list[float]:
    """θ_i = base^(−2i/d) in double precision."""
    return [base ** (-2 * i / d) for i in range(d // 2)]


# --------------------------------------------------------------------------------------------
# frequencies against closed forms
# --------------------------------------------------------------------------------------------
def test_resonance_rounds_every_wavelength(layer):
    """Tiny Llama: base 1e4, d 16. Wavelengths 2π·10^(i/2): 6.28, 19.87, 62.83, 198.7, 628.3,
    1986.9, 6283.2, 19869.2 round to 6, 20, 63, 199, 628, 1987, 6283, 19869."""
    assert (layer.base, layer.rotary_dim) == (10000.0, 16)
    rounded = [6, 20, 63, 199, 628, 1987, 6283, 19869]
    assert [round(TWO_PI / t) for t in _plain_theta(10000.0, 16)] == rounded
    want = torch.tensor([TWO_PI / r for r in rounded], dtype=torch.float64)
    got = Resonance().inv_freq(layer)
    assert got.dtype == torch.float32 and got.shape == (8,)
    torch.testing.assert_close(got.double(), want, rtol=1e-6, atol=0)
    # every plane repeats exactly after its integer wavelength
    for t, r in zip(got.double().tolist(), rounded, strict=True):
        assert t * r == pytest.approx(TWO_PI, rel=1e-6)
    assert Resonance().attention_scaling(layer) == 1.0


@pytest.mark.parametrize(("factor", "L0"), [(4.0, 64), (8.0, 32)])
def test_resonance_yarn_rounds_yarn_wavelengths(layer, factor, L0):
    """Resonance-YaRN: YaRN's frequencies (HF yarn, β 32/1) with integer wavelengths, YaRN's cos/sin
    multiplier 0.1·ln s + 1; the YaRN frequencies are recomputed here from the ramp written out."""
    yarn = _yarn_theta(factor, L0)
    want = [TWO_PI / round(TWO_PI / t) for t in yarn]
    v = Resonance(factor, L0)
    torch.testing.assert_close(
        v.inv_freq(layer).double(), torch.tensor(want, dtype=torch.float64), rtol=1e-5, atol=0
    )
    assert v.attention_scaling(layer) == pytest.approx(0.1 * math.log(factor) + 1)
    # the YaRN it rounds is ropelens's YaRN
    torch.testing.assert_close(
        YaRN(factor, L0).inv_freq(layer).double(),
        torch.tensor(yarn, dtype=torch.float64),
        rtol=1e-5,
        atol=0,
    )


def test_resonance_yarn_defaults_to_the_layers_context(layer):
    assert layer.n_ctx == 256
    assert torch.equal(Resonance(4.0).inv_freq(layer), Resonance(4.0, 256).inv_freq(layer))


@pytest.mark.parametrize("n_low", [0, 1, 2, 4, 8, 20])
def test_cope_raised_cosine_taper(layer, n_low):
    """CoPE: the last c = min(n_low, 8) planes times ½(1 + cos(πj/(c−1))), j = 0 … c−1 (c = 1:
    unchanged)."""
    theta = _plain_theta(10000.0, 16)
    c = min(n_low, 8)
    want = list(theta)
    for j in range(c):
        m = 1.0 if c == 1 else 0.5 * (1 + math.cos(math.pi * j / (c - 1)))
        want[8 - c + j] = theta[8 - c + j] * m
    got = CoPE(n_low).inv_freq(layer)
    assert got.dtype == torch.float32
    torch.testing.assert_close(
        got.double(), torch.tensor(want, dtype=torch.float64), rtol=1e-5, atol=1e-9
    )
    if c >= 2:
        assert got[-1] == 0 and got[8 - c] == pytest.approx(theta[8 - c], rel=1e-6)
    assert CoPE(n_low).attention_scaling(layer) == 1.0


def test_cope_four_planes_by_hand(layer):
    """n_low 4: multipliers 1, ¾, ¼, 0 on planes 4…7 (cos 0, cos π/3, cos 2π/3, cos π)."""
    got = CoPE(4).inv_freq(layer).double()
    theta = torch.tensor(_plain_theta(10000.0, 16), dtype=torch.float64)
    torch.testing.assert_close(got[:4], theta[:4], rtol=1e-6, atol=0)
    torch.testing.assert_close(
        got[4:],
        theta[4:] * torch.tensor([1.0, 0.75, 0.25, 0.0], dtype=torch.float64),
        rtol=1e-5,
        atol=1e-9,
    )


@pytest.mark.parametrize(
    ("L", "n_kept"), [(None, 4), (256, 4), (63, 3), (62, 2), (64, 3), (20000, 8), (6, 0)]
)
def test_fope_zeroes_planes_without_a_full_turn(layer, L, n_kept):
    """θ_i·L < 2π → 0. Wavelengths 6.28, 19.87, 62.83, 198.7, 628.3, …: L 256 (the tiny Llama's
    n_ctx) keeps 4, L 63 keeps 3 (62.83 < 63), 62 keeps 2, 6 keeps none."""
    theta = _plain_theta(10000.0, 16)
    want = [t if t * (L or 256) >= TWO_PI else 0.0 for t in theta]
    assert sum(w > 0 for w in want) == n_kept
    got = FoPEZero(L).inv_freq(layer)
    torch.testing.assert_close(
        got.double(), torch.tensor(want, dtype=torch.float64), rtol=1e-6, atol=0
    )
    assert int((got > 0).sum()) == n_kept


def test_gemma_layer_kinds_use_their_own_base():
    """Gemma 3's sliding layers (base 1e4) and global layer (base 1e6) each get their own rounded
    wavelengths."""
    spec = rope_spec(tiny_model("gemma3"))
    for lr in spec.layers:
        want = [TWO_PI / round(TWO_PI / t) for t in _plain_theta(lr.base, lr.rotary_dim)]
        torch.testing.assert_close(
            Resonance().inv_freq(lr).double(),
            torch.tensor(want, dtype=torch.float64),
            rtol=1e-6,
            atol=0,
        )


# --------------------------------------------------------------------------------------------
# running a model under them: the rotated queries are the variant's rotation
# --------------------------------------------------------------------------------------------
def _rotate_half_by_hand(q: torch.Tensor, theta: torch.Tensor, scale: float) -> torch.Tensor:
    """Llama's rotation written out: q·cos + rotate_half(q)·sin, tables [cos(mθ), cos(mθ)],
    positions 0…n−1. ``q`` is [batch, pos, head, d] with d = 2·len(theta)."""
    n, half = q.shape[1], theta.numel()
    ang = torch.arange(n, dtype=torch.float64)[:, None] * theta.double()[None]
    cos = torch.cat([ang.cos(), ang.cos()], -1)[None, :, None] * scale
    sin = torch.cat([ang.sin(), ang.sin()], -1)[None, :, None] * scale
    q = q.double()
    rot_half = torch.cat([-q[..., half:], q[..., :half]], -1)
    return q * cos + rot_half * sin


def _yarn_theta(factor: float, L0: int, base: float = 1e4, d: int = 16) -> list[float]:
    """HF's YaRN frequencies written out: θ/s ramped into θ over the truncated correction range (β
    32 and 1)."""
    low = max(math.floor(d * math.log(L0 / (32 * TWO_PI)) / (2 * math.log(base))), 0)
    high = min(math.ceil(d * math.log(L0 / (1 * TWO_PI)) / (2 * math.log(base))), d - 1)
    high = high + 0.001 if low == high else high
    out = []
    for i, t in enumerate(_plain_theta(base, d)):
        ramp = min(max((i - low) / (high - low), 0.0), 1.0)  # 0: keep θ, 1: θ/s
        out.append(t / factor * ramp + t * (1 - ramp))
    return out


def _taper(c: int, n: int = 8) -> list[float]:
    """CoPE's multipliers on n planes: 1 on the first n − c, ½(1 + cos(πj/(c−1))) on the last c."""
    return [1.0] * (n - c) + [
        1.0 if c == 1 else 0.5 * (1 + math.cos(math.pi * j / (c - 1))) for j in range(c)
    ]


THETA = _plain_theta(1e4, 16)
# (variant, the frequencies it rotates by, written independently of ropelens)
CASES = [
    (Resonance(), [TWO_PI / round(TWO_PI / t) for t in THETA]),
    (Resonance(4.0, 64), [TWO_PI / round(TWO_PI / t) for t in _yarn_theta(4.0, 64)]),
    (CoPE(4), [t * m for t, m in zip(THETA, _taper(4), strict=True)]),
    (CoPE(), [t * m for t, m in zip(THETA, _taper(8), strict=True)]),
    (FoPEZero(), [t if t * 256 >= TWO_PI else 0.0 for t in THETA]),
    (FoPEZero(63), [t if t * 63 >= TWO_PI else 0.0 for t in THETA]),
]


@pytest.fixture(scope="module", params=["bridge", "plain"])
def both(request):
    if request.param == "bridge":
        return tiny_model("llama")
    return wrap_hf_model(
        tiny_hf_model("llama"), tiny_tokenizer(), device="cpu", label="tiny-llama", bridge=False
    )


@pytest.mark.parametrize(("variant", "closed"), CASES, ids=[v.name for v, _ in CASES])
def test_rotated_queries_are_the_variants_rotation(both, variant, closed):
    toks = torch.randint(4, 100, (1, 40), generator=torch.Generator().manual_seed(3))
    lr = rope_spec(both)[0]
    with apply_rope_variant(both, variant):
        acts = capture_qk(both, toks, layers=[0, 1], which=("q_pre", "q_post", "k_pre", "k_post"))
    theta = torch.tensor(closed, dtype=torch.float64)
    scale = (
        0.1 * math.log(variant.factor) + 1
        if isinstance(variant, Resonance) and variant.factor
        else 1.0
    )
    for L in (0, 1):
        for pre, post in (("q_pre", "q_post"), ("k_pre", "k_post")):
            want = _rotate_half_by_hand(acts[L][pre], theta, scale)
            torch.testing.assert_close(acts[L][post].double(), want, rtol=1e-4, atol=1e-5)
    # outside the context the model is itself again
    plain = capture_qk(both, toks, layers=[0], which=("q_pre", "q_post"))[0]
    torch.testing.assert_close(
        plain["q_post"].double(),
        _rotate_half_by_hand(plain["q_pre"], lr.inv_freq.double(), 1.0),
        rtol=1e-4,
        atol=1e-5,
    )


def test_with_rope_variant_changes_the_logits(llama):
    toks = torch.randint(4, 100, (1, 30), generator=torch.Generator().manual_seed(5))
    copy = with_rope_variant(llama, FoPEZero(63))
    with apply_rope_variant(llama, FoPEZero(63)):
        inside = llama(toks)
    assert torch.equal(copy(toks), inside)
    assert not torch.allclose(llama(toks), inside)


# --------------------------------------------------------------------------------------------
# serialisation, CLI, bad parameters
# --------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "variant",
    [*(v for v, _ in CASES), Resonance(2.0), FoPEZero(2048), CoPE(0)],
    ids=lambda v: v.name,
)
def test_round_trip(variant, layer):
    d = json.loads(json.dumps(variant.to_dict()))
    back = variant_from_dict(d)
    assert back == variant and back.name == variant.name
    assert torch.equal(back.inv_freq(layer), variant.inv_freq(layer))


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("resonance", Resonance()),
        ("resonance:4", Resonance(4.0)),
        ("resonance:4:2048", Resonance(4.0, 2048)),
        ("cope", CoPE()),
        ("cope:6", CoPE(6)),
        ("fopezero", FoPEZero()),
        ("fope:4096", FoPEZero(4096)),
        ("FoPE-Zero:512", FoPEZero(512)),
        ("co", CoPE()),
    ],
)
def test_cli_parses(text, expected):
    assert parse_variant(text) == expected


@pytest.mark.parametrize(
    ("make", "match"),
    [
        (lambda: Resonance(0), "factor must be > 0"),
        (lambda: Resonance(None, 2048), "only read by Resonance-YaRN: pass factor="),
        (lambda: Resonance(4.0, 0), "original_max_position must be >= 1, got 0"),
        (lambda: CoPE(-1), "n_low must be >= 0, got -1"),
        (lambda: CoPE(2.5), "n_low must be a finite integer"),
        (lambda: FoPEZero(0), "original_max_position must be >= 1, got 0"),
        (lambda: FoPEZero(1.5), "original_max_position must be a finite integer"),
    ],
)
def test_bad_parameters_raise(make, match):
    with pytest.raises(InputError, match=match):
        make()


def test_bad_cli_values_name_the_form():
    with pytest.raises(
        InputError, match=r"--variant 'cope:x': bad N_LOW 'x'.*e\.g\. --variant cope:20"
    ):
        parse_variant("cope:x")
    with pytest.raises(
        InputError, match=r"fopezero takes 0 to 1 value\(s\).*fopezero:\[ORIGINAL_MAX_POSITION\]"
    ):
        parse_variant("fopezero:1:2")


def test_layers_without_a_context_length_are_refused(layer):
    import dataclasses

    bare = dataclasses.replace(layer, n_ctx=None)
    with pytest.raises(InputError, match="records none .*pass original_max_position="):
        FoPEZero().inv_freq(bare)
    with pytest.raises(InputError, match="pass original_max_position="):
        Resonance(4.0).inv_freq(bare)
    assert int((FoPEZero(256).inv_freq(bare) > 0).sum()) == 4


def test_resonance_refuses_a_wavelength_rounding_to_zero(layer):
    with pytest.raises(InputError, match="rounds to 0.*pass a factor ≥ 1"):
        Resonance(1e-5, 4096).inv_freq(layer)
