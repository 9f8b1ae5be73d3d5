"""RoPE whose frequencies depend on the input's length (dynamic NTK, LongRoPE's short and long
factors) is read at the length analysed: the frequencies match the published formulas and HF's own
rotary tables at that length, the plain reading says up to which length it holds, and the
verification, run at that length against HF's own attention, passes where the short reading would
be refused."""

from __future__ import annotations

import pytest
import torch

from ropelens.analyses.attention_decomposition import attention_decomposition
from ropelens.analyses.band_statistics import band_statistics
from ropelens.errors import InputError, UnsupportedModelError
from ropelens.run.verify import verify_model
from ropelens.spec.reading import length_dependent, rope_spec
from ropelens.testing import tiny_model

NATIVE = 16
DIM = 16  # the tiny Llama's head (and rotary) width
BASE = 10000.0
LONG = [1.0, 1.5, 2.0, 3.0, 4.0, 5.0, 6.0, 8.0]
SHORT = [1.0, 1.0, 1.1, 1.2, 1.3, 1.4, 1.5, 1.6]


def _plain(base: float) -> torch.Tensor:
    return 1.0 / base ** (torch.arange(0, DIM, 2, dtype=torch.float64) / DIM)


def dynamic_ntk(n: int, factor: float) -> torch.Tensor:
    """Dynamic NTK (Reddit /u/emozilla, as in HF): the base grows with the length once past the
    native context."""
    if n <= NATIVE:
        return _plain(BASE)
    return _plain(BASE * ((factor * n / NATIVE) - (factor - 1)) ** (DIM / (DIM - 2)))


def longrope(n: int) -> torch.Tensor:
    """LongRoPE (Phi-3): each plane's frequency divided by its short factor within the native
    context, by its long factor past it."""
    factors = torch.tensor(LONG if n > NATIVE else SHORT, dtype=torch.float64)
    return _plain(BASE) / factors


@pytest.fixture
def dynamic():
    """A fresh model each test: HF's dynamic NTK keeps the frequencies of the longest input it has
    seen."""
    return tiny_model(
        "llama",
        max_position_embeddings=NATIVE,
        rope_parameters={"rope_type": "dynamic", "factor": 2.0, "rope_theta": BASE},
    )


@pytest.fixture(scope="module")
def long_rope():
    return tiny_model(
        "llama",
        max_position_embeddings=4 * NATIVE,
        rope_parameters={
            "rope_type": "longrope",
            "factor": 4.0,
            "rope_theta": BASE,
            "original_max_position_embeddings": NATIVE,
            "short_factor": SHORT,
            "long_factor": LONG,
        },
    )


def _tokens(n: int) -> torch.Tensor:
    return torch.randint(5, 90, (2, n), generator=torch.Generator().manual_seed(n))


@pytest.mark.parametrize("n", [12, 48, 80])
def test_dynamic_ntk_is_read_and_verified_at_the_length_analysed(dynamic, n):
    st = band_statistics(dynamic, _tokens(n), n_ctx=n, progress=False)
    assert st.provenance.config["verification"]["status"] == "passed"
    assert st.provenance.config["rope_read_at_length"] == n
    for L in st.spec.rotary_layers:
        torch.testing.assert_close(
            st.spec[L].inv_freq.double(), dynamic_ntk(n, 2.0), rtol=1e-6, atol=0
        )


@pytest.mark.parametrize("n", [12, 48])
def test_longrope_switches_factors_at_the_native_context(long_rope, n):
    st = band_statistics(long_rope, _tokens(n), n_ctx=n, progress=False)
    assert st.provenance.config["verification"]["status"] == "passed"
    for L in st.spec.rotary_layers:
        torch.testing.assert_close(st.spec[L].inv_freq.double(), longrope(n), rtol=1e-6, atol=0)


def test_the_short_reading_past_the_native_context_is_refused():
    """The check that makes the reading at length necessary: the spec of a short probe, verified on
    a long input, fails the rotation check with the frequencies measured."""
    n = 48
    dynamic = tiny_model(
        "llama",
        max_position_embeddings=NATIVE,
        rope_parameters={"rope_type": "dynamic", "factor": 2.0, "rope_theta": BASE},
    )
    short = rope_spec(dynamic)
    torch.testing.assert_close(
        short[0].inv_freq.double(), dynamic_ntk(NATIVE, 2.0), rtol=1e-6, atol=0
    )
    with pytest.raises(UnsupportedModelError, match="rotation check"):
        verify_model(dynamic, short, length=n, force=True)
    at = rope_spec(dynamic, length=n)
    assert at.length == n and at.valid_up_to == n
    assert verify_model(dynamic, at, length=n, force=True).passed


def test_decomposition_reads_at_its_input_length(dynamic):
    dec = attention_decomposition(dynamic, _tokens(40)[:1])
    assert dec.provenance.config["verification"]["status"] == "passed"
    torch.testing.assert_close(
        dec.spec[0].inv_freq.double(), dynamic_ntk(40, 2.0), rtol=1e-6, atol=0
    )


def test_fixed_frequencies_are_left_alone(tiny):
    model = tiny("llama")
    spec = rope_spec(model)
    assert not length_dependent(model)
    assert spec.valid_up_to is None and "valid_up_to" not in spec.summary()
    at_length = rope_spec(model, length=64)
    assert at_length.length is None and at_length.to_json() == spec.to_json()
    st = band_statistics(model, _tokens(24), n_ctx=24, progress=False)
    assert "rope_read_at_length" not in st.provenance.config


def test_a_variant_in_force_keeps_its_own_frequencies(dynamic):
    """Under a RoPE variant the spec is the variant's: the model's rotary buffers at the length do
    not replace it."""
    from ropelens.run.intervene import apply_rope_variant
    from ropelens.spec.variants import PRoPE

    with apply_rope_variant(dynamic, PRoPE(0.5)):
        spec = rope_spec(dynamic)
        assert spec.valid_up_to is None
        assert rope_spec(dynamic, length=48).to_json() == spec.to_json()


def _hf_rotary_reading(model, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(θ, attention scaling) of the tables HF's own rotary module returns for an input of ``n``
    tokens: each plane's angle at position 1, and the tables' norm at position 0."""
    rotary = model.original_model.model.rotary_emb
    with torch.no_grad():
        cos, sin = rotary(torch.zeros(1, 1, n, 1), torch.arange(n)[None])
    cos, sin = cos[0].double(), sin[0].double()  # [pos, dim]: each plane's angle twice (halves)
    n_planes = cos.shape[-1] // 2
    theta = torch.atan2(sin[1, :n_planes], cos[1, :n_planes])
    return theta, torch.hypot(cos[0, :n_planes], sin[0, :n_planes])


@pytest.mark.parametrize("rope_type", ["dynamic", "longrope"])
@pytest.mark.parametrize("n", [12, 48, 80])
def test_the_spec_at_a_length_is_what_hf_rotates_that_input_by(rope_type, n, long_rope):
    model = (
        long_rope
        if rope_type == "longrope"
        else tiny_model(
            "llama",
            max_position_embeddings=NATIVE,
            rope_parameters={"rope_type": "dynamic", "factor": 2.0, "rope_theta": BASE},
        )
    )
    spec = rope_spec(model, length=n)
    theta, scaling = _hf_rotary_reading(model, n)
    assert spec.length == n and spec.valid_up_to == max(n, NATIVE)
    for layer in spec.rotary_layers:
        torch.testing.assert_close(spec[layer].inv_freq.double(), theta, rtol=1e-6, atol=0)
        torch.testing.assert_close(
            torch.full_like(scaling, spec[layer].attention_scaling), scaling, rtol=1e-6, atol=0
        )
    if n > NATIVE:  # the short reading is off by more than the tolerance
        short = rope_spec(model)
        assert not torch.allclose(short[0].inv_freq.double(), theta, rtol=1e-3)


def test_the_plain_reading_says_up_to_which_length_it_holds(dynamic, long_rope):
    for model in (dynamic, long_rope):
        spec = rope_spec(model)
        assert spec.valid_up_to == NATIVE and spec.length is None
        assert spec.summary()["valid_up_to"].tolist() == [NATIVE]
        assert "up to 16 tokens" in spec._repr_html_()
        assert type(spec).from_dict(spec.to_dict()).valid_up_to == NATIVE
    torch.testing.assert_close(
        rope_spec(dynamic)[0].inv_freq.double(), dynamic_ntk(NATIVE, 2.0), rtol=1e-6, atol=0
    )


@pytest.mark.parametrize("length", [0, -8, 4.5, True, "48"])
def test_a_bad_length_is_refused(dynamic, length):
    with pytest.raises(InputError, match=f"length must be a positive int, got {length!r}"):
        rope_spec(dynamic, length=length)
