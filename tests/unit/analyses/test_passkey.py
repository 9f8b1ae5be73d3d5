"""Passkey retrieval: prompt construction, scoring, cached greedy decoding, results, and SmolLM2."""

from __future__ import annotations

import re

import pytest
import torch

from ropelens.analyses.passkey_retrieval import (
    QUESTION,
    TASK,
    PasskeyRetrieval,
    greedy_continuation,
    make_passkey,
    needle,
    passkey_prompt,
    passkey_retrieval,
    score_answer,
)
from ropelens.errors import InputError
from ropelens.run.intervene import apply_rope_variant
from ropelens.spec.variants import DynamicNTK, PRoPE, YaRN
from ropelens.testing import tiny_tokenizer

SENTENCES = [
    "The grass is green.",
    "The sky is blue.",
    "The sun is yellow.",
    "Here we go.",
    "There and back again.",
]
LONGEST = (
    max(len(s) for s in SENTENCES) + 1
)  # characters (= tokens for the tiny tokenizer), with its space


# ----------------------------------------------------------------------------- prompts
@pytest.mark.parametrize("depth", [0.0, 0.1, 0.37, 0.5, 0.9, 1.0])
@pytest.mark.parametrize("length", [300, 1000])
def test_prompt_puts_the_passkey_at_the_depth(depth, length):
    """Read back from the text: task, filler, needle, filler, question; the needle after
    round(depth · n) sentences (± one); as many tokens as fit, never more than asked."""
    tok = tiny_tokenizer()
    p = passkey_prompt(tok, length, depth, "40123")
    lines = p.text.split("\n")
    assert lines[0] == TASK and lines[2] == needle("40123") and lines[4] == QUESTION
    before, after = lines[1].count("."), lines[3].count(".")
    assert before + after == p.n_filler and before == p.n_before
    assert abs(before - depth * p.n_filler) <= 1
    # the filler is the harness's sentences in order
    found = [s.strip() for s in re.findall(r"[^.]+\.", lines[1] + " " + lines[3])]
    assert found == [SENTENCES[i % 5] for i in range(p.n_filler)]
    # tokens: BOS + the text, exactly; at most `length`, and one more sentence would not fit
    ids = tok(p.text, add_special_tokens=False)["input_ids"]
    assert p.tokens.tolist() == [tok.bos_token_id, *ids]
    assert p.n_tokens <= length < p.n_tokens + LONGEST + 1
    # token positions: the needle starts at needle_start; token depth within one sentence of depth
    assert tok.decode(p.tokens[p.needle_start : p.needle_start + 15]).startswith("The pass key is")
    filler_tokens = len(lines[1]) + len(lines[3]) + 2
    assert abs(p.token_depth - depth) <= (LONGEST + 2) / filler_tokens


def test_prompts_are_seeded():
    tok = tiny_tokenizer()
    keys = [make_passkey(0, t) for t in range(4)]
    assert keys == [make_passkey(0, t) for t in range(4)]  # deterministic
    assert all(len(k) == 5 and k.isdigit() for k in keys)
    assert len(set(keys)) == 4 and make_passkey(1, 0) != make_passkey(0, 0)
    a, b = passkey_prompt(tok, 500, 0.5, keys[0]), passkey_prompt(tok, 500, 0.5, keys[0])
    assert a.text == b.text and torch.equal(a.tokens, b.tokens)


def test_prompt_input_errors():
    tok = tiny_tokenizer()
    with pytest.raises(InputError, match="too short"):
        passkey_prompt(tok, 100, 0.5, "12345")
    with pytest.raises(InputError, match="depth"):
        passkey_prompt(tok, 500, 1.5, "12345")
    with pytest.raises(InputError, match="passkey"):
        passkey_prompt(tok, 500, 0.5, "12a45")


# ----------------------------------------------------------------------------- scoring
@pytest.mark.parametrize(
    ("response", "answer", "correct"),
    [
        (" 40123.", "40123", True),
        ("\nThe pass key is 40123. Remember", "40123", True),
        (" 401234", "401234", False),
        (" 4012", "4012", False),
        (" blue.", None, False),
    ],
)
def test_score_answer_takes_the_first_integer(response, answer, correct):
    assert score_answer(response, "40123") == (answer, correct)


class Oracle:
    """A fake model: reads the passkey from the prompt and answers it (or a wrong number), one
    character per step, from full forwards on ``input_ids``."""

    def __init__(self, right: bool):
        self.tokenizer = tiny_tokenizer()
        self.right = right
        self.calls = 0

    def __call__(self, input_ids):
        self.calls += 1
        text = self.tokenizer.decode(input_ids[0], skip_special_tokens=True)
        prompt, _, written = text.rpartition(QUESTION)
        key = re.search(r"The pass key is (\d+)", prompt).group(1)
        if not self.right:
            key = str((int(key) + 1) % 100_000)
        answer = f" {key}. It was easy."
        nxt = answer[len(written)] if len(written) < len(answer) else "."
        logits = torch.zeros(1, input_ids.shape[1], len(self.tokenizer))
        logits[0, -1, self.tokenizer.convert_tokens_to_ids(nxt)] = 1.0
        return logits


@pytest.mark.parametrize("right", [True, False])
def test_scoring_of_a_model_that_always_or_never_answers(right):
    model = Oracle(right)
    res = passkey_retrieval(model, [300, 400], [0.2, 0.8], n_trials=2, seed=5, progress=False)
    assert res.mean_accuracy() == (1.0 if right else 0.0)
    assert res.accuracy().shape == (2, 2) and (res.accuracy() == (1.0 if right else 0.0)).all()
    tf = res.trials_frame()
    assert len(tf) == 8 and set(tf["passkey"]) == {make_passkey(5, 0), make_passkey(5, 1)}
    assert (tf["n_tokens"] <= tf["length"]).all()
    # decoding stops once the number is complete: " 12345." is 7 characters
    assert all(len(r) == 7 for r in tf["response"])


# ----------------------------------------------------------------------------- decoding
@pytest.mark.parametrize("family", ["llama-gqa", "gemma3"])
def test_cached_chunked_decoding_equals_full_forwards(tiny, family):
    """Prefill in chunks into the KV cache, then one token at a time, gives the same greedy tokens
    as full forwards, unmodified and under a RoPE variant applied through the bridge's hooks."""
    model = tiny(family)
    toks = torch.randint(4, 101, (40,), generator=torch.Generator().manual_seed(1))
    toks[0] = 1
    kw = {"stop_after_number": False}
    full = greedy_continuation(model, toks, 6, cache=False, **kw)
    assert len(full) == 6
    assert greedy_continuation(model, toks, 6, prefill_chunk=7, **kw) == full
    assert greedy_continuation(model, toks, 6, prefill_chunk=None, **kw) == full
    with apply_rope_variant(model, YaRN(4.0, 16)):
        varied = greedy_continuation(model, toks, 6, cache=False, **kw)
        assert greedy_continuation(model, toks, 6, prefill_chunk=7, **kw) == varied


def test_result_round_trip_merge_and_variant_provenance(tiny, tmp_path):
    model = tiny("llama-gqa")
    res = passkey_retrieval(
        model, [300], [0.5], n_trials=2, seed=3, variant=YaRN(2.0, 128), progress=False
    )
    assert res.variant == YaRN(2.0, 128).to_dict()
    cfg = res.provenance.config
    assert cfg["seed"] == 3 and cfg["variant_name"].startswith("YaRN(") and cfg["cached_decoding"]
    assert res.provenance.model == "tiny-llama-gqa" and res.provenance.n_windows == 2
    path = tmp_path / "passkey.json"
    res.save(path)
    back = PasskeyRetrieval.load(path)
    assert back == res
    df = res.to_frame()
    assert (
        list(df.columns[:5]) == ["depth", "length", "n_trials", "n_correct", "accuracy"]
        and len(df) == 1
    )
    assert len(res.figure().data) == 1
    more = passkey_retrieval(
        model, [350], [0.5], n_trials=2, seed=3, variant=YaRN(2.0, 128), progress=False
    )
    both = res.merge(more)
    assert both.lengths == (300, 350) and len(both.trials) == 4 and both.accuracy().shape == (1, 2)
    with pytest.raises(InputError, match="same model"):
        res.merge(passkey_retrieval(model, [350], [0.5], n_trials=1, seed=4, progress=False))
    # a length-dependent variant decodes with full forwards (no chunked cache)
    dyn = passkey_retrieval(
        model, [300], [0.5], n_trials=1, variant=DynamicNTK(2.0, 128), progress=False
    )
    assert (
        dyn.provenance.config["prefill_chunk"] is None
        and not dyn.provenance.config["cached_decoding"]
    )
    with pytest.raises(InputError, match="depths"):
        passkey_retrieval(model, [300], [0.5, 2.0], progress=False)
    with pytest.raises(InputError, match="variant: expected a RoPE variant .*, got str; or None"):
        passkey_retrieval(model, [300], variant="yarn", progress=False)
    with pytest.raises(InputError, match="got the class PRoPE: instantiate it"):
        passkey_retrieval(model, [300], variant=PRoPE, progress=False)


# ----------------------------------------------------------------------------- a real model
@pytest.mark.integration
def test_smollm2_retrieves_the_passkey_at_a_short_length(smollm2):
    """SmolLM2-135M answers the passkey at 320 tokens (3 of 3 when this test was written; 6 of 6 at
    384 tokens with two trials per depth)."""
    p = passkey_prompt(smollm2, 320, 0.5, "40123")
    assert 320 - 25 < p.n_tokens <= 320
    assert (
        smollm2.tokenizer.decode(p.tokens[p.needle_start : p.needle_start + 4])
        .lstrip()
        .startswith("The pass key")
    )
    assert torch.equal(p.tokens, smollm2.to_tokens(p.text)[0])  # BOS as the model prepends it
    res = passkey_retrieval(smollm2, [320], [0.1, 0.5, 0.9], n_trials=1, seed=0, progress=False)
    print(res.trials_frame()[["depth", "trial", "passkey", "n_tokens", "response", "correct"]])
    assert res.mean_accuracy() >= 2 / 3
