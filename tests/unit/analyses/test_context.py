"""Context extension per plane: frequencies against HF, categories, LongRoPE factor search."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from ropelens import rope_spec
from ropelens.analyses.extension_planes import (
    ExtensionPlanes,
    LongRopeSearch,
    extension_planes,
    search_longrope_factors,
)
from ropelens.plots.extension_planes import compare_figure
from ropelens.run import data
from ropelens.spec.variants import NTK, Default, DynamicNTK, Linear, Llama3, LongRoPE, YaRN
from ropelens.testing import tiny_hf_model

L0, L = 32, 128
LONG = (1.0, 1.5, 2.0, 3.0, 4.0, 6.0, 8.0, 16.0)

# (variant, HF rope_parameters) pairs describing the same scaling.
CASES = [
    (Linear(4.0), {"rope_type": "linear", "factor": 4.0}),
    (YaRN(4.0, L0), {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": L0}),
    (
        Llama3(4.0, 1.0, 4.0, L0),
        {
            "rope_type": "llama3",
            "factor": 4.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": L0,
        },
    ),
    (
        LongRoPE((1.0,) * 8, LONG, L0, factor=4.0),
        {
            "rope_type": "longrope",
            "short_factor": [1.0] * 8,
            "long_factor": list(LONG),
            "factor": 4.0,
            "original_max_position_embeddings": L0,
        },
    ),
    (DynamicNTK(2.0, L0), {"rope_type": "dynamic", "factor": 2.0}),
]


@pytest.fixture(scope="module")
def layer(tiny):
    return rope_spec(tiny("llama"))[0]


@pytest.mark.parametrize(("variant", "params"), CASES, ids=lambda x: getattr(x, "name", "")[:12])
def test_plane_view_frequencies_are_hfs(layer, variant, params):
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    # max_position_embeddings = L0: HF's "original" length for dynamic NTK, and L0 < L selects long
    # factors.
    hf = tiny_hf_model(
        "llama", max_position_embeddings=L0, rope_parameters={"rope_theta": 10000.0, **params}
    )
    want, scaling = ROPE_INIT_FUNCTIONS[params["rope_type"]](hf.config, None, seq_len=L)
    view = extension_planes(layer, variant, L0, L)
    torch.testing.assert_close(view.inv_freq_after, want.float(), rtol=1e-6, atol=0)
    assert view.attention_scaling == pytest.approx(float(scaling))
    torch.testing.assert_close(
        view.scale, (view.inv_freq_before / want).double(), rtol=1e-6, atol=0
    )
    torch.testing.assert_close(
        view.wavelength_after, 2 * math.pi / want.double(), rtol=1e-6, atol=0
    )


def test_categories(layer):
    plain = extension_planes(layer, Default(), L0, L)
    fits = (layer.wavelength <= L0).tolist()
    assert plain.categories == tuple("kept" if f else "extrapolated" for f in fits)
    assert set(extension_planes(layer, Linear(L / L0), L0, L).categories) == {"interpolated"}
    # PI by half the needed factor leaves the slow planes beyond anything seen in training.
    half = extension_planes(layer, Linear(2.0), L0, L)
    assert half.counts()["extrapolated"] == sum(not f for f in fits)
    ntk = extension_planes(layer, NTK(4.0), L0, L)
    assert ntk.categories[0] == "kept" and ntk.counts()["extrapolated"] > 0
    yarn = extension_planes(layer, YaRN(4.0, L0), L0, L)
    assert yarn.counts()["extrapolated"] == 0 and yarn.categories[0] == "kept"


def test_plane_view_roundtrip_and_figures(layer, tmp_path):
    views = [extension_planes(layer, v, L0, L) for v in (Linear(4.0), NTK(4.0), YaRN(4.0, L0))]
    views[0].save(tmp_path / "v.json")
    back = ExtensionPlanes.load(tmp_path / "v.json")
    torch.testing.assert_close(back.inv_freq_after, views[0].inv_freq_after)
    assert back.categories == views[0].categories and back.variant == views[0].variant
    frame = views[1].to_frame()
    assert len(frame) == layer.n_planes and set(frame.category) <= {
        "kept",
        "interpolated",
        "extrapolated",
    }
    assert len(compare_figure(views).data) == 4 and views[2].figure().data
    with pytest.raises(ValueError, match="original_ctx"):
        extension_planes(layer, Linear(4.0), 0, L)


# --------------------------------------------------------------------------------------------
# LongRoPE factor search
# --------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def search_setup(tiny):
    model = tiny("llama")
    tokens = data.windows(data.english().split()[1], model, L, n_windows=2)
    return model, tokens


def _search(search_setup, **kw):
    model, tokens = search_setup
    kw = {
        "population": 4,
        "generations": 2,
        "seed": 0,
        "original_ctx": L0,
        "tokens": tokens,
        "progress": False,
        **kw,
    }
    return search_longrope_factors(model, L, **kw)


def test_search_improves_and_is_monotone(search_setup):
    res = _search(search_setup)
    assert res.perplexity <= res.initial_best
    bests = [h["best"] for h in res.history]
    assert bests == sorted(bests, reverse=True) and len(bests) == 3
    f = np.asarray(res.factors)
    assert (f >= 1).all() and (np.diff(f) >= 0).all() and len(f) == 8
    assert set(res.baselines) == {"PI", "YaRN"} and isinstance(res.variant, LongRoPE)


def test_search_reproduces_and_resumes(search_setup, tmp_path):
    a = _search(search_setup)
    b = _search(search_setup)
    assert (a.factors, a.n_hat, a.perplexity) == (b.factors, b.n_hat, b.perplexity)
    state = tmp_path / "state.json"
    _search(search_setup, generations=1, state_path=state)  # "interrupted" after one generation
    c = _search(search_setup, state_path=state)
    assert (c.factors, c.n_hat, c.perplexity, c.history) == (
        a.factors,
        a.n_hat,
        a.perplexity,
        a.history,
    )
    with pytest.raises(ValueError, match="other settings"):
        _search(search_setup, seed=1, state_path=state)
    other = _search(search_setup, seed=1)
    assert other.history[0] != a.history[0] or other.factors != a.factors


def test_search_result_roundtrip(search_setup, tmp_path):
    res = _search(search_setup, generations=1)
    res.save(tmp_path / "s.json")
    back = LongRopeSearch.load(tmp_path / "s.json")
    assert (
        back.factors == res.factors
        and back.history == res.history
        and back.baselines == res.baselines
    )
    assert len(back.to_frame()) == 2 and back.figure().data
    assert set(res.gain()) == {"PI", "YaRN"}


def test_search_rejects_bad_input(search_setup):
    with pytest.raises(ValueError, match="must exceed original_ctx"):
        _search(search_setup, original_ctx=L)
    with pytest.raises(ValueError, match="population"):
        _search(search_setup, population=1)


def test_cli_context(tiny_dir, capsys):
    import json

    from ropelens.cli import main

    path = str(tiny_dir("llama"))
    assert (
        main(
            [
                "extension-planes",
                path,
                "--to",
                "1024",
                "--variants",
                "pi,yarn,dynamic",
                "--json",
            ]
        )
        == 0
    )
    out = json.loads(capsys.readouterr().out)
    assert out["original_ctx"] == 256 and len(out["views"]) == 3
    assert out["views"][0]["interpolated"] == 8 and len(out["views"][1]["planes"]) == 8
    assert main(["extension-planes", path, "--to", "1024"]) == 0
    assert "critical dimension" in capsys.readouterr().out
    assert main(["extension-planes", path, "--to", "1024", "--variants", "bogus"]) == 2
    assert main(["extension-planes", path, "--to", "100"]) == 2
