"""The high-norm frequency band: its location on profiles with a known band, and NoPE below it."""

from __future__ import annotations

import copy
from dataclasses import replace

import pytest
import torch

from ropelens.analyses.band_location import (
    BandLocation,
    band_location,
    control_planes,
    locate_band,
    nope_below_band,
)
from ropelens.analyses.base_predictions import critical_dimension
from ropelens.errors import InputError
from ropelens.results.result import load_result
from ropelens.run.capture import Moments
from ropelens.run.evaluate import window_losses
from ropelens.testing import tiny_hf_model, tiny_tokenizer, wrap_hf_model

# median 2, peak 6: the level is 4, so planes 4–6 are the band; plane 3 (3.5) lies above peak/2 but
# below the level, and plane 10 (4) reaches the level but is cut off from the peak
PROFILE = [1, 1, 1, 3.5, 5, 6, 5, 2, 1, 1, 4]


def test_band_on_a_known_profile():
    b = locate_band(torch.tensor(PROFILE))
    assert (int(b.peak), int(b.lo), int(b.hi), int(b.width)) == (5, 4, 6, 3)
    assert float(b.prominence) == 3.0


def test_band_edges_include_a_plateau_at_the_level_and_batch_shapes():
    rows = torch.tensor(
        [
            [0.0, 0, 4, 4, 8, 4, 0, 0, 0],  # median 0, level 4: the 4s at the level belong
            [3.0, 3, 3, 3, 3, 3, 3, 3, 3],
        ]
    )  # flat: the peak is the first plane, prominence 1
    b = locate_band(rows[None])  # [1, 2, plane]
    assert b.peak.shape == (1, 2)
    assert (
        b.lo[0].tolist() == [2, 0] and b.hi[0].tolist() == [5, 8] and b.peak[0].tolist() == [4, 0]
    )
    assert b.prominence[0, 1] == 1.0


def test_band_refuses_non_finite_profiles():
    with pytest.raises(InputError, match="finite per-plane norms"):
        locate_band(torch.tensor([1.0, float("nan")]))


def test_control_planes_are_seeded_distinct_and_matched():
    a = control_planes(32, [5, 0, 12], seed=3)
    assert a == control_planes(32, [5, 0, 12], seed=3)  # reproducible
    assert [len(p) for p in a] == [5, 0, 12] and all(len(set(p)) == len(p) for p in a)
    assert all(0 <= x < 32 for p in a for x in p)
    assert a != control_planes(32, [5, 0, 12], seed=4)
    assert (
        control_planes(32, [7, 5], seed=3)[1] == control_planes(32, [9, 5], seed=3)[1]
    )  # nor on other layers' counts


def _with_profile(r: BandLocation, profile: torch.Tensor) -> BandLocation:
    """The same result with the query norms (no-sink scope) replaced by ``profile`` ``[layer, head,
    plane]``."""
    tok = dict(r.usage.token)
    tok[("q", "no_sink")] = Moments(torch.ones_like(profile), profile.clone(), profile**2)
    return replace(r, usage=replace(r.usage, token=tok), intervention=None)


@pytest.fixture(scope="module")
def tiny_bands():
    model = wrap_hf_model(
        tiny_hf_model("llama-gqa"),
        tiny_tokenizer(),
        device="cpu",
        label="tiny-llama-gqa",
        hub_name="ropelens/tiny-llama-gqa",
    )
    r = band_location(
        model, "english", n_ctx=32, max_tokens=256, progress=False, eval_windows=3, seed=1
    )
    return model, r


def test_bands_follow_the_measured_norms_and_the_critical_dimension(tiny_bands):
    _, r = tiny_bands
    norms = r.usage.norm("q", "no_sink").double()
    per_head = r.bands(per_head=True)
    for i in range(norms.shape[0]):
        for h in range(norms.shape[1]):
            assert int(per_head.hi[i, h]) == int(locate_band(norms[i, h]).hi)
    assert torch.equal(r.bands().peak, norms.mean(1).argmax(-1))
    for i, L in enumerate(
        r.layers
    ):  # Liu et al.'s d_extra from the base alone, against the measured wavelengths
        lr = r.spec.layers[L]
        assert (
            r.critical_plane()[i] == critical_dimension(lr.base, lr.rotary_dim, r.spec.n_ctx) // 2
        )
    df = r.to_frame()
    assert len(df) == len(r.layers) * (1 + norms.shape[1])
    row = df[(df["head"] == -1)].iloc[0]
    assert row["n_below"] == r.spec.layers[r.layers[0]].n_planes - 1 - row["hi"]


def test_nope_below_band_matches_zeroed_frequencies_and_its_control_is_seeded(tiny_bands):
    model, r = tiny_bands
    P = r.spec.layers[0].n_planes
    bump = torch.ones(len(r.layers), r.spec.layers[0].n_heads, P, dtype=torch.float64)
    bump[..., 2] = 5.0  # the band is plane 2 in every layer, so planes 3.. are below it
    synthetic = _with_profile(r, bump)
    assert synthetic.below_band() == [tuple(range(3, P))] * len(r.layers)
    toks = torch.randint(4, 100, (3, 24), generator=torch.Generator().manual_seed(0))
    iv = nope_below_band(model, synthetic, toks, seed=1)
    # independently: the HF model with those planes' frequencies zeroed in its own rotary buffer
    hf = copy.deepcopy(model.original_model)
    hf.model.rotary_emb.inv_freq[3:] = 0.0
    want = window_losses(hf, toks, progress=False).double()
    # float32 forwards of the same arithmetic in another order: a few ulps of a loss near 4.6
    assert torch.allclose(
        torch.tensor(iv.losses["nope_below"], dtype=torch.float64), want, atol=1e-5
    )
    assert torch.allclose(
        torch.tensor(iv.losses["rope"], dtype=torch.float64),
        window_losses(model.original_model, toks, progress=False).double(),
        atol=1e-5,
    )
    assert iv.control == tuple(control_planes(P, [P - 3] * len(r.layers), 1))
    assert (
        nope_below_band(model, synthetic, toks, seed=1).losses == iv.losses
    )  # reproducible with the seed
    d = torch.tensor(iv.losses["nope_below"]) - torch.tensor(iv.losses["rope"])
    assert iv.estimates["nope_below-rope"].loss.mean == pytest.approx(
        float(d.double().mean()), abs=1e-12
    )


def test_save_load_merge_and_figure(tiny_bands, tmp_path):
    _, r = tiny_bands
    assert r.intervention is not None and r.intervention.seed == 1
    r.save(tmp_path / "b.json")
    back = load_result(tmp_path / "b.json")
    assert isinstance(back, BandLocation) and back.to_dict() == r.to_dict()
    assert [f.text for f in back.findings()] == [f.text for f in r.findings()]
    assert len(r.findings()) == 2 and "random planes" in r.findings()[1].text
    with pytest.raises(InputError, match="do not merge"):
        r.merge(r)
    plain = replace(r, intervention=None)
    with pytest.raises(InputError, match="count them twice"):
        plain.merge(plain)
    elsewhere = replace(plain.provenance, spans={"tokens:elsewhere": [[0, 1]]})
    m = plain.merge(replace(plain, usage=replace(plain.usage, provenance=elsewhere)))
    assert (
        torch.equal(m.profile(), plain.profile())
        and m.provenance.n_tokens == 2 * plain.provenance.n_tokens
    )
    assert len(r.figure().data) >= 5 and "application/vnd.plotly.v1+json" in r._repr_mimebundle_()
