"""An nnsight model runs wherever an HF model does: the HF model it wraps is the engine, and every
number equals the same HF model's given to ropelens itself (``wrap_hf_model``, ``bridge=False``)."""

from __future__ import annotations

import importlib
import json
import warnings

import pytest
import torch

import ropelens
from ropelens.analyses import (
    attention_decomposition,
    band_statistics,
    frequency_usage,
    head_taxonomy,
)
from ropelens.backends import backend_of, handle
from ropelens.backends.hf import PlainModel
from ropelens.cli.main import main
from ropelens.loading.models import wrap_hf_model
from ropelens.report import build_report
from ropelens.run.evaluate import window_losses
from ropelens.spec.surface import is_nnsight, nnsight_module
from ropelens.spec.variants import PRoPE
from ropelens.testing import tiny_hf_model, tiny_model_dir, tiny_tokenizer

nnsight = pytest.importorskip("nnsight")


@pytest.fixture(autouse=True, scope="module")
def _nnsight_save_unmounted_after():
    """Importing nnsight gives every Python object a ``save`` method (its C ``mount``); the tests
    here run with it, as an nnsight user's session does, and the process gets it taken off after."""
    yield
    unmount = getattr(importlib.import_module("nnsight._c"), "unmount", None)
    if unmount is not None and "save" in vars(object):
        unmount("save")


TEXTS = [
    "The cat sat on the mat, and the dog sat on the rug by the door.",
    "A quick brown fox jumps over the lazy dog; then it runs far away.",
    "Rotary position embeddings turn each plane of a query by its angle.",
    "def add(a, b):\n    return a + b\n\nprint(add(2, 3))\n",
] * 3
KW = dict(n_ctx=24, max_tokens=24 * 8, batch_size=3, progress=False)


def _language_model(hf):
    with warnings.catch_warnings():  # nnsight 0.8 names LanguageModel deprecated, still its API
        warnings.simplefilter("ignore")
        return nnsight.LanguageModel(hf, tokenizer=tiny_tokenizer())


def _pair(family: str):
    """(an nnsight model, the same weights as ropelens's plain model), each on its own HF model."""
    lm = _language_model(tiny_hf_model(family))
    hf = tiny_hf_model(family)  # named as ropelens names a wrapped model without a name: its class
    plain = wrap_hf_model(hf, tiny_tokenizer(), device="cpu", label=type(hf).__name__, bridge=False)
    return lm, plain


def _numbers(result) -> dict:
    """A result as saved, less what a run cannot repeat (when it ran, and how long it took)."""
    d = json.loads(json.dumps(result.to_dict(), default=str))

    def drop(x):
        if isinstance(x, dict):
            return {k: drop(v) for k, v in x.items() if k not in ("seconds", "created")}
        return [drop(v) for v in x] if isinstance(x, list) else x

    return drop(d)


def test_an_nnsight_model_is_told_by_what_it_is():
    hf = tiny_hf_model("llama")
    lm = _language_model(hf)
    assert is_nnsight(lm) and nnsight_module(lm) is hf
    assert not is_nnsight(hf) and nnsight_module(hf) is None
    plain = backend_of(lm).model
    assert isinstance(plain, PlainModel) and plain.original_model is hf
    assert handle(lm).model is plain and backend_of(lm) is backend_of(plain)  # made once


@pytest.mark.parametrize("family", ["llama-gqa", "gemma3"])
def test_usage_decomposition_and_band_statistics_equal_the_plain_models(family):
    lm, plain = _pair(family)
    assert ropelens.rope_spec(lm).to_json() == ropelens.rope_spec(plain).to_json()
    assert _numbers(frequency_usage(lm, TEXTS, **KW)) == _numbers(
        frequency_usage(plain, TEXTS, **KW)
    )
    assert _numbers(band_statistics(lm, TEXTS, **KW)) == _numbers(
        band_statistics(plain, TEXTS, **KW)
    )
    got, want = attention_decomposition(lm, TEXTS[0]), attention_decomposition(plain, TEXTS[0])
    assert _numbers(got) == _numbers(want)
    for layer in want.layers:
        assert torch.equal(got.pattern(layer), want.pattern(layer))


def test_head_taxonomy_and_losses_equal_the_plain_models():
    lm, plain = _pair("llama")
    kw = dict(n_ctx=24, n_windows=4, max_offset=4, batch_size=2, progress=False)
    assert _numbers(head_taxonomy(lm, TEXTS, **kw)) == _numbers(head_taxonomy(plain, TEXTS, **kw))
    tokens = plain.to_tokens(TEXTS[:2])[:, :12]
    assert torch.equal(
        window_losses(lm, tokens, progress=False), window_losses(plain, tokens, progress=False)
    )


def test_variants_and_ablations_through_the_nnsight_model_equal_the_plain_models():
    lm, plain = _pair("llama")
    with ropelens.apply_rope_variant(lm, PRoPE(0.75)):
        got = frequency_usage(lm, TEXTS, **KW, verify=False)
    with ropelens.apply_rope_variant(plain, PRoPE(0.75)):
        want = frequency_usage(plain, TEXTS, **KW, verify=False)
    assert _numbers(got) == _numbers(want)
    unmodified = frequency_usage(lm, TEXTS, **KW)
    assert _numbers(unmodified) != _numbers(got)  # the variant was in force, and is gone again
    assert _numbers(unmodified) == _numbers(frequency_usage(plain, TEXTS, **KW))

    with ropelens.ablate_planes(lm, [0, 1]):
        got = attention_decomposition(lm, TEXTS[1], verify=False)
    with ropelens.ablate_planes(plain, [0, 1]):
        want = attention_decomposition(plain, TEXTS[1], verify=False)
    assert _numbers(got) == _numbers(want)

    copy = ropelens.with_rope_variant(lm, PRoPE(0.5))
    reference = ropelens.with_rope_variant(plain, PRoPE(0.5))
    assert _numbers(frequency_usage(copy, TEXTS, **KW, verify=False)) == _numbers(
        frequency_usage(reference, TEXTS, **KW, verify=False)
    )


def test_the_nnsight_model_still_traces_after_ropelens_ran():
    hf = tiny_hf_model("llama")
    lm = _language_model(hf)
    tokens = torch.tensor([[1, 40, 41, 42, 43]])
    want = hf(input_ids=tokens).logits
    frequency_usage(lm, TEXTS, **KW)
    with lm.trace(tokens):
        logits = lm.output.logits.save()
    torch.testing.assert_close(logits, want, rtol=0, atol=0)


def test_a_lazily_loaded_nnsight_model_is_dispatched_and_measured(tmp_path):
    """nnsight builds a model named by its path on the meta device; ropelens loads its weights as
    nnsight's own first trace would, and measures them."""
    path = tiny_model_dir("llama", tmp_path / "tiny")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        lm = nnsight.LanguageModel(str(path), tokenizer=tiny_tokenizer())
    assert not lm.dispatched
    plain = ropelens.load_model(path, device="cpu", bridge=False)
    got, want = frequency_usage(lm, TEXTS, **KW), frequency_usage(plain, TEXTS, **KW)
    assert lm.dispatched and _numbers(got) == _numbers(want)
    assert got.provenance.model == str(path)


def test_a_report_on_an_nnsight_model(tmp_path):
    lm, _ = _pair("llama")
    out = build_report(
        lm, corpus=TEXTS, tokens=96, n_ctx=24, out=tmp_path / "r", quick=True, progress=False
    )
    summary = json.loads((out / "report.json").read_text())
    assert summary["model"]["name"] == ropelens.rope_spec(lm).model_name == "LlamaForCausalLM"
    assert (out / "index.html").stat().st_size > 0


def test_a_wrapper_of_no_hf_model_is_refused_in_one_line():
    envoy = nnsight.NNsight(torch.nn.Linear(2, 2))
    with pytest.raises(ropelens.InputError, match="wrapping a Linear: ropelens measures the HF"):
        frequency_usage(envoy, TEXTS, **KW)


@pytest.mark.parametrize("bridge", [True, False])
def test_wrap_hf_model_takes_the_hf_model_an_nnsight_model_wraps(bridge):
    lm, plain = _pair("llama")
    wrapped = wrap_hf_model(lm, None, device="cpu", label="LlamaForCausalLM", bridge=bridge)
    assert isinstance(wrapped, PlainModel) != bridge
    assert wrapped.tokenizer.get_vocab() == lm.tokenizer.get_vocab()  # the bridge reloads its own
    tokens = plain.to_tokens(TEXTS[2])
    torch.testing.assert_close(wrapped(tokens), plain(tokens), rtol=1e-5, atol=1e-5)


def test_the_command_line_reads_its_flags_while_nnsight_gives_every_object_save(tmp_path):
    """With nnsight imported ``argparse.Namespace().save`` exists: ``--save`` is read from the
    parsed flags, and a command without it saves nothing."""
    path = tiny_model_dir("llama", tmp_path / "tiny")
    corpus = tmp_path / "docs.txt"
    corpus.write_text("\n\n".join(TEXTS))
    common = ["--device", "cpu", "--corpus", str(corpus), "--n-ctx", "16", "--tokens", "64"]
    assert main(["frequency-usage", str(path), *common, "--json"]) == 0
    assert main(["frequency-usage", str(path), *common, "--save", str(tmp_path / "u.json")]) == 0
    assert (tmp_path / "u.json").is_file()
