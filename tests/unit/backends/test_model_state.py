"""A model's state, checked where it enters an analysis: training mode and meta weights refused in
one line, a compiled model measured as the module it compiles."""

from __future__ import annotations

import warnings

import pytest
import torch

from ropelens.analyses import frequency_usage
from ropelens.analyses.attention_decomposition import attention_decomposition
from ropelens.backends.engine import compiled_original, model_state_problem
from ropelens.errors import InputError, RopelensWarning
from ropelens.loading.models import wrap_hf_model
from ropelens.run.verify import verify_model
from ropelens.testing import tiny_hf_model, tiny_model, tiny_tokenizer

TEXT = "The cat sat on the mat."


@pytest.fixture
def dropout_model():
    """A tiny Llama whose attention drops 30 % of its probabilities in training mode."""
    return tiny_model("llama", seed=5, attention_dropout=0.3)


@pytest.mark.parametrize("verify", [True, False])
def test_training_mode_is_refused_naming_eval_and_the_model_is_left_as_it_was(
    dropout_model, verify
):
    dropout_model.train()
    with pytest.raises(InputError) as refused:
        attention_decomposition(dropout_model, TEXT, verify=verify)
    message = str(refused.value)
    assert "training mode" in message and "call model.eval()" in message
    assert "dropout 0.3 active" in message and "\n" not in message
    assert "soft-cap" not in message  # not blamed on the architecture
    assert dropout_model.training  # ropelens switched nothing


def test_training_mode_is_refused_by_corpus_analyses_and_the_probe_too(dropout_model):
    dropout_model.train()
    with pytest.raises(InputError, match=r"call model\.eval\(\)"):
        frequency_usage(dropout_model, n_ctx=16, max_tokens=64, progress=False)
    with pytest.raises(InputError, match=r"call model\.eval\(\)"):
        verify_model(dropout_model, force=True)


def test_after_eval_the_same_model_gives_the_numbers_of_a_fresh_one(dropout_model):
    """The refusal leaves nothing behind: eval() and the analysis runs, equal to a model that was
    never in training mode."""
    dropout_model.train()
    with pytest.raises(InputError):
        attention_decomposition(dropout_model, TEXT)
    dropout_model.eval()
    got = attention_decomposition(dropout_model, TEXT)
    fresh = attention_decomposition(tiny_model("llama", seed=5, attention_dropout=0.3), TEXT)
    assert torch.equal(got.pattern(0), fresh.pattern(0))
    assert got.provenance.config["verification"]["status"] == "passed"


def test_a_compiled_bridge_is_measured_as_the_module_it_compiles():
    model = tiny_model("llama", seed=6)
    compiled = torch.compile(model)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        got = attention_decomposition(compiled, TEXT)
        again = attention_decomposition(compiled, TEXT)
    said = [w for w in caught if issubclass(w.category, RopelensWarning)]
    assert len(said) == 1  # once per compiled model
    assert "torch.compile" in str(said[0].message) and "_orig_mod" in str(said[0].message)
    want = attention_decomposition(model, TEXT)
    for L in want.layers:
        assert torch.equal(got.pattern(L), want.pattern(L))
        assert torch.equal(again.acts[L]["q_post"], want.acts[L]["q_post"])
    assert got.provenance.config["verification"]["status"] == "passed"


@pytest.mark.parametrize("bridge", [True, False])
def test_a_compiled_hf_model_wraps_as_the_module_it_compiles(bridge):
    """``wrap_hf_model(torch.compile(hf))`` wraps ``hf`` itself (not the OptimizedModule, which has
    no ``.model`` for the bridge to read)."""
    hf = tiny_hf_model("llama", seed=7).eval()
    with pytest.warns(RopelensWarning, match="torch.compile"):
        wrapped = wrap_hf_model(torch.compile(hf), tiny_tokenizer(), device="cpu", bridge=bridge)
    plain = wrap_hf_model(hf, tiny_tokenizer(), device="cpu", bridge=bridge)
    got = attention_decomposition(wrapped, TEXT, layers=[1])
    want = attention_decomposition(plain, TEXT, layers=[1])
    assert torch.equal(got.acts[1]["k_post"], want.acts[1]["k_post"])


def test_compiled_original_leaves_other_models_alone():
    model = tiny_hf_model("llama", seed=8)
    assert compiled_original(model) is model
    with pytest.warns(RopelensWarning, match="torch.compile"):
        assert compiled_original(torch.compile(model)) is model


def test_weights_on_the_meta_device_are_refused_naming_one():
    model = tiny_model("llama", seed=9)
    mlp = model.original_model.model.layers[1].mlp
    shape = mlp.down_proj.weight.shape
    mlp.down_proj.weight = torch.nn.Parameter(torch.empty(shape, device="meta"))
    # every weight and buffer of the bridge and of the HF model it holds, each counted once
    total = len(
        {id(t) for m in (model, model.original_model) for t in [*m.parameters(), *m.buffers()]}
    )
    problem = model_state_problem(model)
    assert problem is not None and "meta device" in problem
    assert f"1 of {total} " in problem and "'model.layers.1.mlp.down_proj.weight'" in problem
    for verify in (True, False):
        with pytest.raises(InputError, match="meta device"):
            attention_decomposition(model, TEXT, verify=verify)


def test_a_model_as_loaded_has_no_state_problem():
    assert model_state_problem(tiny_model("llama", seed=10)) is None
