"""Base predictors: Liu et al.'s critical dimension, extrapolation limit and critical base, Men et
al.'s bound, tabulated per length, and the loss measured by length they are checked against."""

from __future__ import annotations

import math

import pytest
import torch

from ropelens import rope_spec
from ropelens.analyses.base_predictions import (
    BasePredictions,
    MeasuredExtrapolation,
    base_lower_bound,
    base_predictions,
    bound_holds,
    critical_base,
    critical_dimension,
    extrapolation_limit,
    measured_extrapolation,
)
from ropelens.errors import InputError
from ropelens.run import data
from ropelens.run.evaluate import window_losses
from ropelens.spec.rope import LayerRope, RopeSpec

TWO_PI = 2 * math.pi


def llama2_like(base: float = 10000.0, d: int = 128, n_ctx: int = 4096) -> RopeSpec:
    """A one-layer spec with LLaMA 2's RoPE: head dim 128, base 1e4, 4096 tokens."""
    inv_freq = base ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)
    lr = LayerRope(
        layer=0,
        inv_freq=inv_freq.float(),
        head_dim=d,
        rotary_dim=d,
        pairing="half",
        n_heads=32,
        n_kv_heads=32,
        score_scale=d**-0.5,
        base=base,
        n_ctx=n_ctx,
    )
    return RopeSpec(
        model_name="llama-2-like", architecture="LlamaForCausalLM", layers=(lr,), n_ctx=n_ctx
    )


# ------------------------------------------------------------------ the paper's numbers, by hand
def test_llama2_critical_dimension_and_extrapolation_limit():
    # d_extra = 2⌈(d/2)·log_β(T/2π)⌉ = 2⌈64 · log(651.9)/log(1e4)⌉ = 2⌈45.03⌉ = 92
    assert 64 * math.log(4096 / TWO_PI) / math.log(10000) == pytest.approx(45.03, abs=0.01)
    assert critical_dimension(10000.0, 128, 4096) == 92
    # T_extra = 2π·10000^(92/128) = 2π·10^2.875 ≈ 4711.7 tokens: a little past the 4096 trained
    assert extrapolation_limit(10000.0, 128, 4096) == pytest.approx(TWO_PI * 10**2.875, rel=1e-12)
    assert extrapolation_limit(10000.0, 128, 4096) == pytest.approx(4711.72, abs=0.01)
    # Code LLaMA: base 1e6 on LLaMA 2 (critical dimension 92 from pre-training at 1e4, 4096 tokens)
    code = extrapolation_limit(1e6, 128, 4096, train_base=10000.0)
    assert code == pytest.approx(TWO_PI * 10 ** (6 * 92 / 128), rel=1e-12)
    assert 1.2e5 < code < 1.3e5


def test_llama2_critical_base_for_tuning():
    # β₀ = 10000^(log_{4096/2π}(16384/2π)) = 10000^(7.866/6.480) ≈ 7.17e4
    for tune in (8192, 16384, 32768, 100_000):
        want = 10000.0 ** (math.log(tune / TWO_PI) / math.log(4096 / TWO_PI))
        assert critical_base(4096, tune) == pytest.approx(want, rel=1e-12)
    assert critical_base(4096, 16384) == pytest.approx(71738.4, rel=1e-5)
    assert critical_base(4096, 4096) == pytest.approx(
        10000.0, rel=1e-12
    )  # tuning at T_train: the base itself
    # another pre-training base replaces the paper's 10000
    assert critical_base(8192, 16384, base=1e5) == pytest.approx(
        1e5 ** (math.log(16384 / TWO_PI) / math.log(8192 / TWO_PI)), rel=1e-12
    )


@pytest.mark.parametrize("train_base", [1e4, 5e5])
@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("tune", [4096, 6000, 16384, 65536, 1 << 20])
def test_extrapolation_limit_at_the_critical_base_is_the_tuning_length(train_base, d, tune):
    """T_extra(β₀(T_tune)) = T_tune up to the ceiling in the critical dimension: d_extra/d lies in
    [log_β(T/2π), that + 2/d), so T_tune ≤ T_extra < T_tune·β₀^(2/d)."""
    beta0 = critical_base(4096, tune, base=train_base)
    t = extrapolation_limit(beta0, d, 4096, train_base=train_base)
    assert tune * (1 - 1e-9) <= t < tune * beta0 ** (2 / d)


def test_extrapolation_limit_is_the_first_unturned_wavelength(tiny):
    lr = rope_spec(tiny("llama"))[0]
    d_extra = critical_dimension(lr.base, lr.rotary_dim, 256)
    assert float(lr.wavelength[d_extra // 2 - 1]) <= 256 < float(lr.wavelength[d_extra // 2])
    assert extrapolation_limit(lr.base, lr.rotary_dim, 256) == pytest.approx(
        float(lr.wavelength[d_extra // 2]), rel=1e-6
    )
    # every plane turns: nothing limits extrapolation
    assert extrapolation_limit(10.0, 16, 10_000) == math.inf


def test_monotone():
    tunes = [4096, 8192, 16384, 65536, 262144]
    b = [critical_base(4096, t) for t in tunes]
    assert all(x < y for x, y in zip(b, b[1:]))
    trains = [1024, 2048, 4096, 8192]
    b = [critical_base(t, 131072) for t in trains]
    assert all(x > y for x, y in zip(b, b[1:]))
    bases = [1e3, 1e4, 1e5, 1e6, 1e7]
    t = [extrapolation_limit(x, 128, 4096, train_base=1e4) for x in bases]
    assert all(x < y for x, y in zip(t, t[1:]))
    t = [extrapolation_limit(1e4, 128, n) for n in (512, 1024, 2048, 4096, 8192)]
    assert all(x <= y for x, y in zip(t, t[1:]))
    d = [critical_dimension(1e4, 128, n) for n in (64, 512, 4096, 32768)]
    assert all(x <= y for x, y in zip(d, d[1:]))
    d = [critical_dimension(x, 128, 4096) for x in bases]
    assert all(x >= y for x, y in zip(d, d[1:]))


@pytest.mark.parametrize(
    ("call", "match"),
    [
        (lambda: critical_base(0, 4096), "train_ctx must be a positive int"),
        (lambda: critical_base(-4096, 4096), "train_ctx must be a positive int"),
        (lambda: critical_base(4096, 0), "tune_ctx must be a positive int"),
        (lambda: critical_base(6, 4096), "exceed 2π"),
        (lambda: critical_base(4096, 16384, base=0), "base must be a finite number > 1"),
        (lambda: critical_base(4096, 16384, base=-10000.0), "base must be a finite number > 1"),
        (lambda: critical_base(4096, 16384, base=1.0), "base must be a finite number > 1"),
        (lambda: extrapolation_limit(0.0, 128, 4096), "base must be a finite number > 1"),
        (lambda: extrapolation_limit(1e4, 0, 4096), "rotary_dim must be a positive int"),
        (lambda: extrapolation_limit(1e4, 128, -1), "train_ctx must be a positive int"),
        (
            lambda: extrapolation_limit(1e4, 128, 4096, train_base=-1.0),
            "train_base must be a finite number > 1",
        ),
        (lambda: base_predictions(llama2_like(), []), "lengths is empty"),
        (lambda: base_predictions(llama2_like(), [4096, 0]), "each length must be a positive int"),
        (lambda: base_predictions(llama2_like(), [-4096]), "each length must be a positive int"),
        (lambda: base_predictions(llama2_like(), "4096"), "lengths must be a list"),
        (
            lambda: base_predictions(llama2_like(), [4096], train_ctx=0),
            "train_ctx must be a positive int",
        ),
        (
            lambda: base_predictions(llama2_like(), [4096], base=0.5),
            "base must be a finite number > 1",
        ),
    ],
)
def test_bad_input_raises(call, match):
    with pytest.raises(InputError, match=match):
        call()


# ------------------------------------------------------------------ the table
def test_base_predictions_llama2_table(tmp_path):
    pred = base_predictions(llama2_like(), [2048, 4096, 4711, 4712, 16384])
    df = pred.to_frame().set_index("length")
    assert (df["critical_dimension_train"] == 92).all() and df["t_extra"].tolist() == pytest.approx(
        [4711.724] * 5, abs=1e-3
    )
    assert df.loc[4096, "critical_dimension"] == 92 and df.loc[
        2048, "critical_dimension"
    ] == 2 * math.ceil(64 * math.log(2048 / TWO_PI) / math.log(1e4))
    assert df["within_t_extra"].tolist() == [True, True, True, False, False]
    assert df.loc[4096, "critical_base"] == pytest.approx(1e4)
    assert df.loc[16384, "critical_base"] == pytest.approx(critical_base(4096, 16384))
    # Liu's β₀ and T_extra agree on which lengths base 1e4 reaches, up to the critical dimension's
    # rounding
    assert df["base_ge_critical"].tolist() == [True, True, False, False, False]
    # Men et al.: 1e4 is below their 4k bound (2.7e4 in their Table 2), so it already fails at 4096
    assert df.loc[4096, "men_lower_bound"] == pytest.approx(base_lower_bound(128, 4096))
    assert 2e4 < df.loc[4096, "men_lower_bound"] < 3e4
    assert df["men_bound_holds"].tolist() == [bound_holds(1e4, 128, n) for n in df.index]
    assert not df.loc[4096, "men_bound_holds"]

    pred.save(tmp_path / "p.json")
    back = BasePredictions.load(tmp_path / "p.json")
    assert back.to_frame().equals(pred.to_frame()) and back.lengths == pred.lengths
    assert len(pred.figure().data) == 3
    with pytest.raises(InputError, match="MeasuredExtrapolation"):
        MeasuredExtrapolation.load(tmp_path / "p.json")


def test_base_predictions_per_layer_kind(tiny):
    spec = rope_spec(tiny("gemma3"))
    df = base_predictions(tiny("gemma3"), [7, 16, 256]).to_frame()
    assert set(df["kind"]) == {"sliding", "full"} and len(df) == 6
    full = df[df["kind"] == "full"].set_index("length")
    assert (full["base"] == 1e6).all() and (full["train_ctx"] == spec.n_ctx).all()
    assert full.loc[256, "t_extra"] == extrapolation_limit(1e6, 16, 256)
    assert full.loc[7, "critical_base"] == critical_base(
        spec.n_ctx, 7, 1e6
    )  # the shortest length above 2π
    with pytest.raises(
        InputError, match=r"length 6 is too short .* shortest length with a critical base is 7"
    ):
        base_predictions(spec, [6, 16])  # β₀ needs a length above 2π: refused, never NaN
    # sliding layers never see a distance past their window: lengths and T_train are capped there
    local = df[df["kind"] == "sliding"].set_index("length")
    assert (local["train_ctx"] == 8).all() and local["effective_length"].tolist() == [7, 8, 8]
    assert local.loc[256, "men_bound_holds"] == bound_holds(1e4, 16, 8)
    # a base given overrides every kind's
    assert (base_predictions(spec, [64], base=5e5).to_frame()["base"] == 5e5).all()


# ------------------------------------------------------------------ measured loss by length
def test_measured_extrapolation_matches_window_losses(tiny, tmp_path):
    model = tiny("llama-gqa")
    meas = measured_extrapolation(model, [16, 64], n_windows=2, progress=False, n_boot=200)
    for L, got in zip(meas.lengths, meas.window_losses):
        tokens = data.windows(data.english(), model.tokenizer, L, n_windows=2)
        want = window_losses(model, tokens, progress=False)  # through the bridge
        torch.testing.assert_close(torch.tensor(got), want, rtol=1e-4, atol=1e-5)
    df = meas.to_frame()
    assert df["length"].tolist() == [16, 64] and (df["n_windows"] == 2).all()
    assert df["perplexity"].tolist() == pytest.approx([math.exp(x) for x in df["loss"]])
    assert (df["loss_lo"] <= df["loss"]).all() and (df["loss"] <= df["loss_hi"]).all()
    assert not df["beyond_train"].any() and meas.train_ctx == 256

    meas.save(tmp_path / "m.json")
    back = MeasuredExtrapolation.load(tmp_path / "m.json")
    assert back.to_frame().equals(df) and back.window_losses == meas.window_losses
    pred = base_predictions(model, [16, 64, 1024])
    joined = pred.compare(meas)
    assert joined["length"].tolist() == [16, 64] and {"t_extra", "perplexity"} <= set(
        joined.columns
    )
    assert len(meas.figure(pred).data) == 1

    with pytest.raises(InputError, match="corpus must be a corpus name"):
        measured_extrapolation(model, [16], corpus=torch.zeros(2, 16, dtype=torch.long))
    with pytest.raises(InputError, match="n_windows must be a positive int"):
        measured_extrapolation(model, [16], n_windows=0)
    with pytest.raises(InputError, match="too short"):
        measured_extrapolation(model, [1])
