"""No finding from windows too short to hold one: the finding is withheld and says why."""

from __future__ import annotations

import math

import pytest
import torch

from ropelens.analyses import attention_sinks, band_statistics, frequency_usage
from ropelens.errors import InputError


def _tokens(n_ctx: int, n: int = 4) -> torch.Tensor:
    toks = torch.randint(4, 101, (n, n_ctx), generator=torch.Generator().manual_seed(0))
    toks[:, 0] = 1
    return toks


def test_one_token_windows_are_refused(tiny):
    """Windows of BOS alone hold no position past the sink and no pair of keys: every analysis
    refuses them where windows are read, naming the fix, instead of withholding every finding."""
    model = tiny("llama")
    with pytest.raises(InputError, match="at least two positions"):
        frequency_usage(model, _tokens(1), progress=False)
    with pytest.raises(InputError, match="at least two positions"):
        attention_sinks(model, _tokens(1), progress=False)
    with pytest.raises(InputError, match="at least two positions"):
        band_statistics(model, _tokens(1), progress=False)


def test_usage_on_two_token_windows_states_its_findings(tiny):
    r = frequency_usage(tiny("llama"), _tokens(2), progress=False)
    sink = {f.key: f for f in r.findings()}["sink"]
    assert "withheld" not in sink.values and math.isfinite(sink.values["k_ratio"])
    # the sentence quotes the layer's ratio of key norms at position 0 to those after it
    ratios = r.sink_ratios()["k"]
    assert sink.values["k_ratio"] == pytest.approx(
        float(ratios[r.layers.index(sink.values["layer"])]), abs=0.005
    )


def test_usage_with_more_sink_positions_needs_longer_windows(tiny):
    r = frequency_usage(tiny("llama"), _tokens(3), n_sink=3, progress=False)
    assert all(f.values.get("min_tokens") == 4 for f in r.findings())
    assert "first 3 (sink) positions" in r.findings()[0].text


def test_sinks_withhold_what_short_windows_cannot_hold(tiny):
    model = tiny("llama")
    short = attention_sinks(model, _tokens(3), progress=False)  # no query at m ≥ 4
    fs = {f.key: f for f in short.findings()}
    assert set(fs) == {"sinks-0", "sinks-2"}
    assert fs["sinks-0"].values["min_tokens"] == 5 and "m ≥ 4" in fs["sinks-0"].text
    assert "withheld" not in fs["sinks-2"].values and math.isfinite(fs["sinks-2"].values["median"])
    long = attention_sinks(model, _tokens(8), progress=False)
    assert not any(f.values.get("withheld") for f in long.findings())


def test_band_statistics_on_two_token_windows_states_its_findings(tiny):
    assert not any(
        x.values.get("withheld")
        for x in band_statistics(tiny("llama"), _tokens(2), progress=False).findings()
    )
