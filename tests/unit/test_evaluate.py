"""window_losses matches the bridge's own loss; bootstrap_ci covers the mean and is seeded."""

from __future__ import annotations

import math

import pytest
import torch

from ropelens.evaluate import LossEstimate, bootstrap_ci, loss_estimate, window_losses
from ropelens.testing import tiny_hf_model


@pytest.fixture(scope="module")
def tokens():
    return torch.randint(4, 101, (5, 24), generator=torch.Generator().manual_seed(0))


@pytest.mark.parametrize("family", ["llama", "gemma3"])
def test_window_losses_match_bridge_loss(tiny, tokens, family):
    model = tiny(family)
    losses = window_losses(model, tokens, batch_size=2, progress=False)
    assert losses.shape == (5,)
    for i in range(tokens.shape[0]):
        own = model(tokens[i : i + 1], return_type="loss")
        assert losses[i].item() == pytest.approx(own.item(), rel=1e-5)


def test_window_losses_hf_model_matches_bridge(tiny, tokens):
    bridge = tiny("llama")
    hf = tiny_hf_model("llama")
    a = window_losses(bridge, tokens, progress=False)
    b = window_losses(hf, tokens, progress=False)
    torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)


def test_window_losses_batch_size_invariant(tiny, tokens):
    model = tiny("llama")
    a = window_losses(model, tokens, batch_size=1, progress=False)
    b = window_losses(model, tokens, batch_size=5, progress=False)
    torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


def test_window_losses_bad_input(tiny):
    with pytest.raises(ValueError, match="n_windows, n_ctx"):
        window_losses(tiny("llama"), torch.zeros(10, dtype=torch.long), progress=False)
    with pytest.raises(ValueError, match="batch_size"):
        window_losses(tiny("llama"), torch.zeros(2, 5, dtype=torch.long), batch_size=0, progress=False)


def test_bootstrap_covers_mean_and_is_seeded():
    values = torch.tensor([3.0, 3.5, 2.9, 4.1, 3.3, 3.8, 3.1, 2.7])
    est = bootstrap_ci(values, n_boot=500, seed=1)
    assert est.loss.lo <= values.mean().item() <= est.loss.hi
    assert est.loss.lo < est.loss.hi
    assert est.loss.mean == pytest.approx(values.mean().item())
    assert est.perplexity.mean == pytest.approx(math.exp(est.loss.mean))
    assert est.perplexity.lo == pytest.approx(math.exp(est.loss.lo))
    assert est.perplexity.hi == pytest.approx(math.exp(est.loss.hi))
    assert bootstrap_ci(values, n_boot=500, seed=1) == est
    assert bootstrap_ci(values, n_boot=500, seed=2) != est
    assert LossEstimate.from_dict(est.to_dict()) == est


def test_bootstrap_ci_narrows_with_more_windows():
    g = torch.Generator().manual_seed(0)
    few = bootstrap_ci(torch.randn(10, generator=g) + 3)
    many = bootstrap_ci(torch.randn(1000, generator=g) + 3)
    assert many.loss.hi - many.loss.lo < few.loss.hi - few.loss.lo
    assert many.loss.lo < 3 < many.loss.hi


@pytest.mark.parametrize(
    ("values", "kw", "match"),
    [([], {}, "empty"), ([1.0, float("nan")], {}, "non-finite"), ([1.0], {"n_boot": 0}, "n_boot"),
     ([1.0], {"alpha": 1.5}, "alpha")],
)
def test_bootstrap_bad_input(values, kw, match):
    with pytest.raises(ValueError, match=match):
        bootstrap_ci(values, **kw)


def test_loss_estimate(tiny, tokens):
    est, losses = loss_estimate(tiny("llama"), tokens, progress=False, n_boot=100)
    assert est.n_windows == 5 and est.loss.mean == pytest.approx(losses.mean().item())


def test_run_store_resumes_and_keeps_other_writers_runs(tmp_path):
    from ropelens.evaluate import RunStore

    path = tmp_path / "runs.json"
    a, b = RunStore(path), RunStore(path)  # two sweeps writing one file
    a.put({"model": "x", "n": 1}, {"loss": 1.0})
    b.put({"model": "y", "n": 1}, {"loss": 2.0})
    a.put({"model": "x", "n": 2}, {"loss": 3.0})
    again = RunStore(path)
    assert len(again) == 3
    assert again.get({"n": 1, "model": "y"})["loss"] == 2.0  # key order does not matter
    assert again.get({"model": "x", "n": 3}) is None
    path.write_text("{not json")
    with pytest.raises(ValueError, match="move it aside"):
        RunStore(path)
