"""window_losses matches the bridge's own loss; bootstrap_ci covers the mean and is seeded."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch

from ropelens.run.evaluate import (
    NO_INTERVAL,
    LossEstimate,
    bootstrap_ci,
    interval_text,
    loss_estimate,
    window_losses,
)
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
        window_losses(
            tiny("llama"), torch.zeros(2, 5, dtype=torch.long), batch_size=0, progress=False
        )


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


def test_one_window_gives_no_interval():
    """Resampling one window returns it every time: a zero-width 'CI' would claim a certainty
    no one measured, so there is none, said as n/a with the reason."""
    est = bootstrap_ci([315.62])
    assert est.loss.mean == 315.62 and est.n_windows == 1
    for e in (est.loss, est.perplexity):
        assert math.isnan(e.lo) and math.isnan(e.hi) and not e.has_interval
        assert e.interval() == NO_INTERVAL == "n/a (one window gives no spread)"
        assert not e.excludes(0.0)
    assert str(est.loss) == "315.6 n/a (one window gives no spread)"
    assert est.to_dict()["loss"] == {"mean": 315.62, "lo": None, "hi": None}
    back = LossEstimate.from_dict(json.loads(json.dumps(est.to_dict(), allow_nan=False)))
    assert math.isnan(back.loss.lo) and back.loss.mean == est.loss.mean
    assert (
        interval_text(1.0, 2.0, ".2f") == "[1.00, 2.00]" and interval_text(None, 2.0) == NO_INTERVAL
    )
    two = bootstrap_ci([1.0, 2.0])
    assert two.loss.has_interval and two.loss.lo < two.loss.hi


def test_prope_sweep_on_one_window_prints_no_interval(tiny_dir, capsys):
    from ropelens.cli import main

    path = str(tiny_dir("llama"))
    assert main(["prope-sweep", path, "--n-ctx", "32", "--tokens", "32", "--p", "1"]) == 0
    out = capsys.readouterr().out
    assert "95% CI (1 windows of 32)" in out and out.rstrip().endswith(NO_INTERVAL)
    assert main(["prope-sweep", path, "--n-ctx", "32", "--tokens", "32", "--p", "1", "--json"]) == 0
    row = json.loads(capsys.readouterr().out)["rows"][0]
    assert row["ppl_lo"] is None and row["ppl_hi"] is None and row["ppl"] > 0


def test_bootstrap_ci_narrows_with_more_windows():
    g = torch.Generator().manual_seed(0)
    few = bootstrap_ci(torch.randn(10, generator=g) + 3)
    many = bootstrap_ci(torch.randn(1000, generator=g) + 3)
    assert many.loss.hi - many.loss.lo < few.loss.hi - few.loss.lo
    assert many.loss.lo < 3 < many.loss.hi


@pytest.mark.parametrize(
    ("values", "kw", "match"),
    [
        ([], {}, "empty"),
        ([1.0, float("nan")], {}, "non-finite"),
        ([1.0], {"n_boot": 0}, "n_boot"),
        ([1.0], {"alpha": 1.5}, "alpha"),
    ],
)
def test_bootstrap_bad_input(values, kw, match):
    with pytest.raises(ValueError, match=match):
        bootstrap_ci(values, **kw)


def hand_window_losses(hf, tokens):
    """Mean next-token NLL per window from the HF model's logits: logsumexp − logit of the next
    token."""
    with torch.no_grad():
        logits = hf(input_ids=tokens).logits[:, :-1].double()  # [b, pos-1, vocab]
    target = tokens[:, 1:]
    nll = torch.logsumexp(logits, -1) - logits.gather(-1, target[..., None])[..., 0]
    return nll.mean(-1)


def hand_percentile_bootstrap(values, n_boot, seed, alpha):
    """Resample windows with replacement (same generator draws as ropelens), linear-interpolated
    percentiles."""
    v = np.asarray(values, dtype=np.float64)
    g = torch.Generator().manual_seed(seed)
    idx = torch.randint(0, len(v), (n_boot, len(v)), generator=g).numpy()
    means = v[idx].mean(1)
    lo, hi = np.percentile(means, [100 * alpha / 2, 100 * (1 - alpha / 2)])
    return float(v.mean()), min(float(lo), float(v.mean())), max(float(hi), float(v.mean()))


def test_loss_estimate(tiny, tokens):
    """Per-window losses equal a cross-entropy written here on the plain HF model (same weights);
    the CI equals a hand-coded percentile bootstrap with the same seed."""
    est, losses = loss_estimate(
        tiny("llama"), tokens, progress=False, n_boot=300, seed=7, alpha=0.1
    )
    want = hand_window_losses(tiny_hf_model("llama"), tokens)
    torch.testing.assert_close(losses.double(), want, rtol=1e-5, atol=1e-5)
    assert 4.0 < want.mean().item() < 5.5  # random 101-token model: near ln 101 = 4.62, not ~0
    mean, lo, hi = hand_percentile_bootstrap(losses.tolist(), n_boot=300, seed=7, alpha=0.1)
    assert est.n_windows == 5 and (est.n_boot, est.seed, est.alpha) == (300, 7, 0.1)
    assert (est.loss.mean, est.loss.lo, est.loss.hi) == pytest.approx((mean, lo, hi), rel=1e-9)
    assert lo < mean < hi
    assert (est.perplexity.lo, est.perplexity.hi) == pytest.approx(
        (math.exp(lo), math.exp(hi)), rel=1e-9
    )


def test_bootstrap_ci_matches_hand_bootstrap_on_skewed_values():
    """A skewed sample (one outlier window) where the CI is clearly asymmetric about the mean."""
    values = [1.0, 1.1, 0.9, 1.05, 0.95, 1.0, 6.0, 1.02]
    est = bootstrap_ci(values, n_boot=1000, seed=3)
    mean, lo, hi = hand_percentile_bootstrap(values, n_boot=1000, seed=3, alpha=0.05)
    assert (est.loss.mean, est.loss.lo, est.loss.hi) == pytest.approx((mean, lo, hi), rel=1e-9)
    assert hi - mean > 1.5 * (
        mean - lo
    )  # the outlier stretches the upper side (measured 1.26 vs 0.66)
    # a constant sample has a zero-width interval at its value
    flat = bootstrap_ci([2.5] * 6, n_boot=200)
    assert (flat.loss.lo, flat.loss.mean, flat.loss.hi) == pytest.approx((2.5, 2.5, 2.5))


def test_run_store_resumes_and_keeps_other_writers_runs(tmp_path):
    from ropelens.run.evaluate import RunStore

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


def test_the_report_tables_say_no_interval_as_n_a():
    import pandas as pd

    from ropelens.report.html import table_html
    from ropelens.report.steps import CI_FORMATS

    est = bootstrap_ci([4.2])
    frame = pd.DataFrame(
        [{"ppl": est.perplexity.mean, "ppl_lo": est.perplexity.lo, "ppl_hi": est.perplexity.hi}]
    )
    html = table_html(frame, formats=CI_FORMATS, folded=False)
    assert html.count(">n/a<") == 2 and f">{math.exp(4.2):.3g}<" in html
    two = bootstrap_ci([4.2, 4.4])
    assert CI_FORMATS["Δ lo"](two.loss.lo) != "n/a"
