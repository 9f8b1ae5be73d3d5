"""Bands: recipes resolve to disjoint plane groups whose dims (plus rest) cover the head."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from ropelens.spec.bands import Bands
from ropelens.spec.rope import LayerRope


def layer(n_planes=8, head_dim=None, pairing="half", base=10000.0, n_ctx=256) -> LayerRope:
    inv = base ** (-torch.arange(n_planes, dtype=torch.float64) / n_planes)
    return LayerRope(
        layer=0,
        inv_freq=inv.float(),
        head_dim=head_dim or 2 * n_planes,
        rotary_dim=2 * n_planes,
        pairing=pairing,
        n_heads=4,
        n_kv_heads=2,
        score_scale=0.25,
        base=base,
        n_ctx=n_ctx,
    )


@settings(max_examples=60, deadline=None)
@given(
    n_planes=st.integers(1, 40),
    n=st.integers(1, 40),
    extra=st.integers(0, 6),
    pairing=st.sampled_from(["half", "adjacent"]),
)
def test_quantiles_partition_the_head(n_planes, n, extra, pairing):
    lr = layer(n_planes, head_dim=2 * n_planes + 2 * extra, pairing=pairing)
    if n > n_planes:
        with pytest.raises(ValueError, match="needs at least"):
            Bands.quantiles(n).resolve(lr)
        return
    rb = Bands.quantiles(n).resolve(lr)
    planes = [p for g in rb.planes for p in g]
    assert planes == list(range(n_planes))  # contiguous, highest first, each once
    sizes = [len(g) for g in rb.planes[:n]]
    assert max(sizes) - min(sizes) <= 1
    dims = torch.cat(rb.dims).sort().values
    assert torch.equal(dims, torch.arange(lr.head_dim))  # every head dim in exactly one band
    assert (rb.names[-1] == "rest") == (extra > 0)


def test_wavelength_and_context_bands_follow_wavelengths():
    lr = layer(8, base=10000.0, n_ctx=100)
    wl = lr.wavelength
    rb = Bands.by_wavelength([10, 100]).resolve(lr)
    for name, g in zip(rb.names, rb.planes):
        lo, hi = {"λ∈[0,10)": (0, 10), "λ∈[10,100)": (10, 100), "λ∈[100,inf)": (100, float("inf"))}[
            name
        ]
        assert all(lo <= wl[i] < hi for i in g)
    within, beyond = Bands.by_context().resolve(lr).planes
    assert all(wl[i] <= 100 for i in within) and all(wl[i] > 100 for i in beyond)
    assert len(within) + len(beyond) == 8


def test_unrotated_planes_fall_in_the_last_wavelength_band():
    lr = layer(4)
    lr = LayerRope(**{**lr.__dict__, "inv_freq": torch.tensor([1.0, 0.1, 0.0, 0.0])})
    rb = Bands.by_wavelength([50]).resolve(lr)
    assert rb.planes == ((0,), (1, 2, 3))  # λ = 6.3, 63, inf, inf


def test_explicit_bands_add_rest_and_validate():
    lr = layer(8)
    rb = Bands.explicit({"high": [0, 1], "low": [6, 7]}).resolve(lr)
    assert rb.names == ("high", "low", "rest") and rb.planes[-1] == (2, 3, 4, 5)
    with pytest.raises(ValueError, match="overlap"):
        Bands.explicit({"a": [0, 1], "b": [1, 2]}).resolve(lr)
    with pytest.raises(ValueError, match="out of range"):
        Bands.explicit({"a": [8]}).resolve(lr)
    with pytest.raises(ValueError, match="uncovered"):
        Bands.explicit({"a": [0]}, require_cover=True).resolve(lr)
    with pytest.raises(ValueError, match="reserved"):
        Bands.explicit({"rest": [0]})
    with pytest.raises(ValueError, match="empty"):
        Bands.explicit({"a": []})


@pytest.mark.parametrize("bad", [0, -1, 2.5, True])
def test_quantiles_reject_bad_counts(bad):
    with pytest.raises(ValueError, match="positive integer"):
        Bands.quantiles(bad)


def test_parse_and_round_trip():
    for text in ["planes", "all", "quantiles:3", "wavelength:10,100", "context:2"]:
        b = Bands.parse(text)
        assert Bands.from_dict(b.to_dict()) == b
    b = Bands.explicit({"x": [0, 2]})
    assert Bands.from_dict(b.to_dict()) == b
    with pytest.raises(ValueError, match="unknown band spec"):
        Bands.parse("octaves:3")
    with pytest.raises(ValueError, match="increase"):
        Bands.parse("wavelength:100,10")


def test_membership_matrix():
    rb = Bands.quantiles(2).resolve(layer(4))
    assert torch.equal(rb.membership(), torch.tensor([[1.0, 0], [1, 0], [0, 1], [0, 1]]))


@pytest.mark.parametrize("pairing", ["half", "adjacent"])
def test_dim_membership_puts_every_head_dim_in_its_band(pairing):
    """Partial rotary (head dim 20, 6 planes) and uneven bands: each dim of a plane goes with its
    plane's band, the unrotated dims with rest, and every dim belongs to exactly one band."""
    lr = layer(6, head_dim=20)
    lr = LayerRope(**{**lr.__dict__, "pairing": pairing})
    rb = Bands.explicit({"a": [0, 1, 2], "b": [4]}).resolve(lr)
    m = rb.dim_membership()
    assert m.shape == (20, 3) and torch.equal(m.sum(1), torch.ones(20))
    dims = lr.plane_dims  # [plane, 2]
    for p, band in ((0, 0), (1, 0), (2, 0), (4, 1), (3, 2), (5, 2)):
        assert m[dims[p], band].tolist() == [1.0, 1.0], (p, band)
    assert m[12:, 2].tolist() == [1.0] * 8


@pytest.mark.parametrize(
    ("n_planes", "names"),
    [
        (1, ["Q1 (highest)"]),
        (2, ["Q1 (highest)", "Q2 (lowest)"]),
        (3, ["Q1 (highest)", "Q2", "Q3 (lowest)"]),
        (4, ["Q1 (highest)", "Q2", "Q3", "Q4 (lowest)"]),
        (9, ["Q1 (highest)", "Q2", "Q3", "Q4 (lowest)"]),
    ],
)
def test_default_bands_fit_a_layer_with_few_planes(n_planes, names):
    """Four quantiles where a layer has four planes or more, one band per plane where it has
    fewer."""
    rb = Bands.default().resolve(layer(n_planes))
    assert list(rb.names) == names
    assert [p for g in rb.planes for p in g] == list(range(n_planes))
    if n_planes >= 4:
        assert rb.planes == Bands.quantiles(4).resolve(layer(n_planes)).planes
    else:
        assert rb.planes == tuple((i,) for i in range(n_planes))


def test_fitted_quantiles_parse_describe_and_round_trip():
    assert Bands.parse("quantiles:<=4") == Bands.parse("quantiles:≤4") == Bands.default()
    assert (
        Bands.default().describe() == "quantiles:<=4"
        and Bands.quantiles(4).describe() == "quantiles:4"
    )
    assert Bands.from_dict(Bands.default().to_dict()) == Bands.default()
    assert Bands.parse(Bands.default().describe()) == Bands.default()


def test_strict_quantiles_name_the_fitted_form():
    with pytest.raises(
        ValueError, match=r"layer 0 has 2: pass --bands quantiles:2 \(or quantiles:<=4"
    ):
        Bands.quantiles(4).resolve(layer(2))
