"""Figures: each result's drawing methods give the plotly figure its ropelens.plots module draws."""

from __future__ import annotations

import plotly.graph_objects as go
import plotly.io as pio
import pytest
import torch

from ropelens import Bands
from ropelens.analyses.attention_decomposition import attention_decomposition
from ropelens.analyses.band_statistics import band_statistics
from ropelens.analyses.frequency_usage import frequency_usage
from ropelens.analyses.head_taxonomy import head_taxonomy
from ropelens.plots.attention_decomposition import decomposition_figure
from ropelens.plots.band_statistics import band_statistics_figure, band_statistics_heatmap
from ropelens.plots.frequency_usage import usage_figure, usage_heatmap
from ropelens.plots.head_taxonomy import heads_figure, heads_scatter
from ropelens.results import figures
from ropelens.results.figures import figure_of, register_figure, registered_figures

BANDS = Bands.quantiles(2)


@pytest.fixture(scope="module")
def drawn(tiny):
    model = tiny("llama-gqa")
    toks = torch.randint(4, 101, (2, 16), generator=torch.Generator().manual_seed(0))
    toks[:, 0] = 1
    return {
        "usage": frequency_usage(model, toks, progress=False),
        "band_stats": band_statistics(model, toks, bands=BANDS, progress=False),
        "decompose": attention_decomposition(model, toks[:1], bands=BANDS, layers=[0, 1]),
        "heads": head_taxonomy(
            model, toks, n_ctx=16, n_windows=2, max_offset=2, layers=[0], progress=False
        ),
    }


def _same(a, b) -> bool:
    """Two figures (or traces, or lists of traces) with the same JSON."""
    if isinstance(a, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    return pio.to_json(a.to_plotly_json()) == pio.to_json(b.to_plotly_json())


def test_usage_figures(drawn):
    u = drawn["usage"]
    fig = u.figure()
    assert isinstance(fig, go.Figure) and len(fig.data) == 2  # queries and keys
    assert _same(fig, usage_figure(u))
    assert _same(u.figure("no_sink", layer=1), usage_figure(u, "no_sink", layer=1))
    assert isinstance(u.heatmap("k", layer=0), go.Heatmap)
    assert _same(u.heatmap("k", layer=0), usage_heatmap(u, "k", layer=0))


def test_band_statistics_figures(drawn):
    st = drawn["band_stats"]
    fig = st.figure()
    assert isinstance(fig, go.Figure) and len(fig.data) == 3  # |logit|, variance and margin shares
    assert _same(st.figure(1), band_statistics_figure(st, 1))
    assert _same(st.heatmap("abs_share"), band_statistics_heatmap(st, "abs_share"))


def test_decomposition_figures(drawn):
    dec = drawn["decompose"]
    fig = dec.figure(1, head=1)
    assert (
        isinstance(fig, go.Figure) and len(fig.data) == len(dec.band_names(1)) + 1
    )  # each band and the pattern
    assert _same(fig, decomposition_figure(dec, 1, head=1))
    assert len(dec.figure().data) == 3


def test_head_taxonomy_figures(drawn):
    tax = drawn["heads"]
    fig = tax.figure()
    assert (
        isinstance(fig, go.Figure) and len(fig.data) == len(tax.scatter()) + 1
    )  # a scatter per kind, the heatmap
    assert _same(fig, heads_figure(tax))
    assert _same(tax.scatter(), heads_scatter(tax))


def test_jupyter_shows_the_registered_figure(drawn):
    u = drawn["usage"]
    bundle = u._repr_mimebundle_()
    assert len(bundle["application/vnd.plotly.v1+json"]["data"]) == 2


def test_a_class_draws_what_is_registered_for_it_or_its_nearest_base(monkeypatch):
    # registrations made here are dropped afterwards: the catalog's tests compare the registry
    # with the declared analyses
    monkeypatch.setattr(figures, "_FIGURES", dict(figures._FIGURES))

    class Base:
        def figure(self, *args, **kwargs):
            return figure_of(type(self))(self, *args, **kwargs)

    class Child(Base):
        pass

    with pytest.raises(
        NotImplementedError, match="no .figure. figure registered: an analysis declares its figures"
    ):
        Child().figure()
    register_figure(Base, lambda r, n=1: ("base", n))
    assert Child().figure(n=2) == ("base", 2)
    register_figure(Child, lambda r: "child")
    assert Child().figure() == "child" and Base().figure() == ("base", 1)
    assert registered_figures()[(Child, "figure")](None) == "child"
    with pytest.raises(TypeError, match="register_figure takes"):
        register_figure("Child", lambda r: None)
