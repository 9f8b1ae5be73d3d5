"""Greedy decoding on a bridge's own forward with a key/value cache gives the tokens HF's full
forwards give, also where the bridge's attention keeps nothing in the cache."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM

import ropelens
from ropelens.analyses.passkey_retrieval import greedy_continuation


def _hf_greedy(hf, prompt: list[int], n: int, eos: int) -> list[int]:
    """Greedy tokens from full forwards, up to ``n`` or the first EOS."""
    out: list[int] = []
    while len(out) < n and eos not in out:
        with torch.no_grad():
            out.append(int(hf(input_ids=torch.tensor([prompt + out])).logits[0, -1].argmax()))
    return out


@pytest.mark.parametrize("family", ["llama", "granite"])
def test_bridge_decoding_with_a_cache_matches_full_forwards(family, family_dir):
    path = family_dir(family)
    model = ropelens.load_model(path, device="cpu")
    hf = AutoModelForCausalLM.from_pretrained(path, attn_implementation="eager").eval()
    prompt = torch.randint(4, 100, (40,), generator=torch.Generator().manual_seed(1))
    want = _hf_greedy(hf, prompt.tolist(), 6, model.tokenizer.eos_token_id)
    got = greedy_continuation(
        model, prompt, 6, prefill_chunk=16, stop_after_number=False, path="bridge"
    )
    assert got == want
