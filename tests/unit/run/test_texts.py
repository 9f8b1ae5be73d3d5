"""Texts as tokens: padding never counted, every cut said once, one BOS policy everywhere."""

from __future__ import annotations

import argparse
import warnings

import pytest
import torch

from ropelens.analyses import attention_decomposition
from ropelens.analyses.passkey_retrieval import passkey_prompt
from ropelens.catalog.attention_decomposition import _text_tokens as cli_decompose_tokens
from ropelens.catalog.explore import _tokens as cli_explore_tokens
from ropelens.errors import InputError, RopelensWarning, TruncatedInputWarning
from ropelens.loading.models import wrap_hf_model
from ropelens.run.data import Corpus, windows
from ropelens.run.texts import bos_token_id, cut_message, encode, text_tokens
from ropelens.testing import tiny_tokenizer
from ropelens.testing.families import family_hf_model

TEXTS = ["Hi.", "A much longer sentence is here, ok."]


@pytest.fixture(scope="module")
def decompositions(tiny):
    """The two texts decomposed together and each alone (tiny Llama, every layer)."""
    model = tiny("llama")
    return attention_decomposition(model, TEXTS), [attention_decomposition(model, t) for t in TEXTS]


def test_ragged_texts_give_each_text_the_numbers_it_gives_alone(decompositions):
    both, alone = decompositions
    assert both.tokens.shape == (2, alone[1].tokens.shape[1])
    for L in both.layers:
        for row, one in enumerate(alone):
            n = one.tokens.shape[1]
            assert torch.equal(both.tokens[row, :n], one.tokens[0])
            torch.testing.assert_close(both.pattern(L)[row, :, :n, :n], one.pattern(L)[0])
            torch.testing.assert_close(
                both.band_logits(L)[row, :, :, :n, :n], one.band_logits(L)[0]
            )
            # the padded positions are masked: no query or key past the text's end
            assert not both.mask(L)[row, n:].any() and not both.mask(L)[row, :, n:].any()


def test_agreement_of_a_batch_is_the_token_weighted_mean_of_each_text_alone(decompositions):
    """Top-1 agreement and JS divergence count real queries only: the batch's value is the mean
    of the texts' values weighted by their token counts (the 'Hi.' row's padding adds nothing)."""
    both, alone = decompositions
    n = [one.tokens.shape[1] for one in alone]
    for L in both.layers:
        batched = both.agreement(L)
        frames = [one.agreement(L) for one in alone]
        for col in ("top1", "jsd"):
            pooled = sum(f[col] * k for f, k in zip(frames, n, strict=True)) / sum(n)
            torch.testing.assert_close(
                torch.tensor(batched[col].to_numpy()), torch.tensor(pooled.to_numpy())
            )
    assert both.provenance.n_tokens == sum(n)


@pytest.mark.parametrize("family", ["gemma3", "gptj"])  # sliding windows + GQA; adjacent pairs
def test_ragged_texts_match_alone_on_other_layouts(tiny, family):
    model = tiny(family)
    both = attention_decomposition(model, TEXTS)
    alone = [attention_decomposition(model, t) for t in TEXTS]
    n = [one.tokens.shape[1] for one in alone]
    for L in both.layers:
        for row, one in enumerate(alone):
            k = n[row]
            torch.testing.assert_close(both.pattern(L)[row, :, :k, :k], one.pattern(L)[0])
        pooled = sum(one.agreement(L)["top1"] * k for one, k in zip(alone, n, strict=True))
        torch.testing.assert_close(
            torch.tensor(both.agreement(L)["top1"].to_numpy()),
            torch.tensor((pooled / sum(n)).to_numpy()),
        )


def test_a_token_tensor_is_used_whole(tiny):
    """Ready tokens carry no padding mark: every position counts."""
    model = tiny("llama")
    tokens = text_tokens(model, "The cat sat.").tokens
    r = attention_decomposition(model, tokens)
    assert bool(r.acts[0].valid.all()) and r.provenance.n_tokens == tokens.numel()


def test_a_text_past_the_context_is_cut_with_one_warning_in_the_cli_words(tiny):
    model = tiny("llama")  # context 256, one token per character
    limit = model.cfg.n_ctx
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        r = attention_decomposition(model, ["x" * 300, "y" * 10, "z" * 400], layers=[0])
    said = [w for w in caught if issubclass(w.category, RopelensWarning)]
    assert len(said) == 1 and issubclass(said[0].category, TruncatedInputWarning)
    assert str(said[0].message) == (
        f"text 0 is 301 tokens, longer than the model's trained context of {limit}: decomposed its "
        f"first {limit}; text 2 is 401 tokens, longer than the model's trained context of {limit}: "
        f"decomposed its first {limit}"
    )
    assert r.tokens.shape == (3, limit)
    assert r.provenance.n_tokens == limit + 11 + limit
    # the command line says the same words for --text
    _, what = cli_decompose_tokens(model, "x" * 300)
    assert what == f"text (first {limit} of 301 tokens)"
    assert cut_message("--text", 301, limit) == str(said[0].message).split(";")[0].replace(
        "text 0", "--text"
    )


def test_a_text_within_the_context_is_not_warned_about(tiny):
    model = tiny("llama")
    with warnings.catch_warnings():
        warnings.simplefilter("error", RopelensWarning)
        text_tokens(model, "x" * (model.cfg.n_ctx - 1))  # BOS + 255 = the context exactly


@pytest.mark.parametrize("bad", ["", "   ", [], ["ok", ""], [3]])
def test_empty_or_non_text_input_is_refused(tiny, bad):
    with pytest.raises(InputError, match="empty|list of strings"):
        text_tokens(tiny("llama"), bad)


@pytest.fixture(scope="module")
def qwen2():
    """A Qwen2 model, for which TransformerLens's own to_tokens prepends no BOS."""
    hf = family_hf_model("qwen2")
    return wrap_hf_model(hf, tiny_tokenizer(), device="cpu", label="q", hub_name="ropelens/q2")


def test_every_entry_point_tokenises_a_text_to_the_same_ids(qwen2):
    """Decomposition (Python and CLI), the band mixer, corpus windows and passkey prompts start the
    same text with the same ids: the tokenizer's BOS, then the text."""
    text = "The cat sat on the mat. " * 4
    bos = bos_token_id(qwen2)
    assert bos == qwen2.tokenizer.bos_token_id is not None
    expected = [bos, *qwen2.tokenizer(text, add_special_tokens=False)["input_ids"]]
    assert qwen2.to_tokens(text)[0].tolist()[0] != bos  # the bridge's own policy differs
    n = len(expected)
    python = attention_decomposition(qwen2, text, layers=[0]).tokens[0].tolist()
    cli, _ = cli_decompose_tokens(qwen2, text)
    mixer, _ = cli_explore_tokens(qwen2, text, argparse.Namespace(n_ctx=n))
    corpus = windows(Corpus(name="one", documents=(text,)), qwen2, n, n_windows=1)
    assert encode(qwen2, text) == expected
    assert python == expected
    assert cli[0].tolist() == expected
    assert mixer[0].tolist() == expected
    assert corpus[0].tolist() == expected
    prompt = passkey_prompt(qwen2, 300, 0.5, "1234")
    assert prompt.tokens.tolist() == encode(qwen2, prompt.text)


def test_figures_of_a_padded_row_show_its_text_only(decompositions):
    """The heatmaps and the band mixer of the short text's row equal those of the text alone."""
    import json
    import re

    both, alone = decompositions
    one = alone[0]
    n = one.tokens.shape[1]
    fig_both, fig_one = both.figure(batch=0), one.figure()
    for a, b in zip(fig_both.data, fig_one.data, strict=True):
        assert a.z.shape == (n, n)
        torch.testing.assert_close(torch.tensor(a.z), torch.tensor(b.z), equal_nan=True)

    def page_data(mixer) -> dict:
        blob = re.search(
            r"<script type='application/json' id='ropelens-data'>(.*?)</script>", mixer.html
        )
        return json.loads(blob.group(1).replace("<\\/", "</"))

    d_both, d_one = page_data(both.explore(batch=0)), page_data(one.explore())
    assert d_both["tokens"] == d_one["tokens"] and d_both["token_ids"] == d_one["token_ids"]
    for a, b in zip(d_both["layers"], d_one["layers"], strict=True):
        assert a["model_top1"] == b["model_top1"] and a["mask"] == b["mask"]
