"""Loss-based analyses check the model's state where they enter: a model left in training mode is
refused in one line naming model.eval(), never measured through its dropout, and left as it was."""

from __future__ import annotations

import math

import pytest
import torch

from ropelens.analyses import (
    band_location,
    measured_extrapolation,
    passkey_retrieval,
    search_longrope_factors,
)
from ropelens.errors import InputError
from ropelens.run.data import load_corpus, windows
from ropelens.run.evaluate import loss_estimate, loss_path, window_losses
from ropelens.testing import tiny_model

TEXTS = ["The quick brown fox jumps over the lazy dog. " * 8]
REFUSAL = r"training mode .*dropout 0\.3 active.*call model\.eval\(\)"


@pytest.fixture
def dropout_model():
    """A tiny Llama whose attention drops 30 % of its probabilities in training mode."""
    return tiny_model("llama", seed=5, attention_dropout=0.3)


@pytest.fixture
def tokens(dropout_model):
    return windows(load_corpus(), dropout_model, 16, n_windows=2)


ENTRIES = {
    "loss_path": lambda m, t: loss_path(m),
    "window_losses": lambda m, t: window_losses(m, t, progress=False),
    "loss_estimate": lambda m, t: loss_estimate(m, t, progress=False, n_boot=100),
    "measured_extrapolation": lambda m, t: measured_extrapolation(
        m, [16], n_windows=1, corpus=TEXTS, progress=False, n_boot=100
    ),
    "passkey_retrieval": lambda m, t: passkey_retrieval(
        m, [120], depths=[0.5], n_trials=1, progress=False
    ),
    "search_longrope_factors": lambda m, t: search_longrope_factors(
        m, 32, original_ctx=16, population=2, generations=0, n_windows=1, progress=False
    ),
    # without its probe: refused all the same (before its corpus pass or at its loss step)
    "band_location": lambda m, t: band_location(
        m, TEXTS, n_ctx=16, max_tokens=32, eval_windows=1, verify=False, progress=False
    ),
}


@pytest.mark.parametrize("entry", list(ENTRIES))
def test_a_model_in_training_mode_is_refused_in_one_line(dropout_model, tokens, entry):
    dropout_model.train()
    with pytest.raises(InputError, match=REFUSAL) as refused:
        ENTRIES[entry](dropout_model, tokens)
    assert "\n" not in str(refused.value)
    assert dropout_model.training  # ropelens switched nothing


def test_the_refusal_is_what_stood_between_the_user_and_random_losses(dropout_model, tokens):
    """Through the forward the losses run on, a model in training mode gives another loss each
    time (the refusal's reason); after eval() the losses are the model's own, equal to a fresh
    model's and to a cross-entropy computed here from the HF model's logits."""
    hf = dropout_model.original_model
    hf.train()
    torch.manual_seed(0)
    with torch.no_grad():
        noisy = [float(hf(tokens, labels=tokens).loss) for _ in range(2)]
    assert noisy[0] != noisy[1]
    dropout_model.eval()
    got = window_losses(dropout_model, tokens, progress=False)
    fresh = window_losses(
        tiny_model("llama", seed=5, attention_dropout=0.3), tokens, progress=False
    )
    with torch.no_grad():
        logits = hf(tokens).logits.double()
    want = torch.nn.functional.cross_entropy(
        logits[:, :-1].transpose(1, 2), tokens[:, 1:], reduction="none"
    ).mean(-1)
    assert torch.equal(got, fresh)
    torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-5)
    assert all(math.isfinite(x) for x in got.tolist())
