"""Positional vs symbolic heads: hand-built heads are called right, scores equal a plain per-query
loop."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
import torch

from ropelens.analyses.head_taxonomy import head_taxonomy
from ropelens.analyses.positional_symbolic import (
    PositionalSymbolic,
    agreement,
    cohen_kappa,
    key_permutation,
    positional_symbolic,
    rank_correlation,
)
from ropelens.errors import InputError
from ropelens.loading.models import wrap_hf_model
from ropelens.results.result import load_result
from ropelens.run.capture import capture_qk
from ropelens.spec.reading import rope_spec
from ropelens.testing import tiny_hf_model, tiny_model, tiny_tokenizer

N_CTX = 20


def _handset():
    """Tiny Llama whose layer-0 head 0 is previous-token by position (plane 0, q/k free of content)
    and head 1 attends to equal tokens (plane 7, q and k both from the token's angle φ: logit ∝
    cos(φ_q − φ_k)).

    Every token embeds as [1, cos φ, sin φ, 0, ...]: constant norm, so after RMSNorm dim 0 is the
    same for every token."""
    hf = tiny_hf_model("llama")
    g = torch.Generator().manual_seed(0)
    vocab = hf.get_input_embeddings().num_embeddings
    phi = torch.rand(vocab, generator=g) * 2 * math.pi
    with torch.no_grad():
        emb = torch.zeros(vocab, 64)
        emb[:, 0], emb[:, 1], emb[:, 2] = 1, phi.cos(), phi.sin()
        hf.get_input_embeddings().weight.copy_(emb)
        hf.model.layers[0].input_layernorm.weight.fill_(1.0)
        attn = hf.model.layers[0].self_attn
        s = 1 / math.sqrt(2 / 64)  # RMSNorm scale of a norm-√2 embedding in 64 dims
        wq, wk = torch.zeros_like(attn.q_proj.weight), torch.zeros_like(attn.k_proj.weight)
        a = 30.0 / s
        # head 0, plane 0 (dims 0, 8), θ₀ = 1: k = a·(1, 0), q = a·R(−θ₀)(1, 0) ⇒ logit ∝
        # cos((m−n−1)θ₀)
        wk[0, 0] = a
        wq[0, 0], wq[8, 0] = a * math.cos(1.0), -a * math.sin(1.0)
        # head 1, plane 7 (dims 7, 15; θ₇ = 10⁴^(−7/8) ≈ 3e-4 rad/token: nearly unrotated over 20
        # tokens)
        b = 20.0 / s
        wq[16 + 7, 1], wq[16 + 15, 2] = b, b
        wk[16 + 7, 1], wk[16 + 15, 2] = b, b
        attn.q_proj.weight.copy_(wq)
        attn.k_proj.weight.copy_(wk)
    return wrap_hf_model(
        hf, tiny_tokenizer(), device="cpu", label="tiny-possym", hub_name="ropelens/tiny-possym"
    )


@pytest.fixture(scope="module")
def handset():
    return _handset()


def _tokens(n_windows: int, n: int, vocab: int = 12, seed: int = 0) -> torch.Tensor:
    """Few distinct tokens, so every query meets equal tokens among its keys."""
    toks = torch.randint(
        4, 4 + vocab, (n_windows, n), generator=torch.Generator().manual_seed(seed)
    )
    toks[:, 0] = 1
    return toks


@pytest.fixture(scope="module")
def handset_result(handset):
    return positional_symbolic(
        handset, _tokens(8, N_CTX), n_ctx=N_CTX, layers=[0], min_keys=4, progress=False
    )


@pytest.mark.parametrize("measure", ["logit", "attention"])
def test_handset_heads_are_called_right(handset_result, measure):
    calls = handset_result.calls(measure)[0]
    p, s = handset_result.scores(measure)
    assert calls[0] == "positional" and calls[1] == "symbolic"
    # head 0's q and k carry no content, so moving key contents changes nothing: P = 1 up to float32
    assert float(p[0, 0]) == pytest.approx(1.0, abs=1e-4)
    # head 1 turns by (j − σ(j))·θ₇ ≤ 19 · 3.2e-4 rad: its logits follow the content almost exactly
    assert float(s[0, 1]) > 0.99
    assert float(s[0, 0]) < 0.6 and float(p[0, 1]) < 0.6
    if (
        measure == "attention"
    ):  # heads 2 and 3 have zero q/k: uniform attention is both (the exclusion case)
        torch.testing.assert_close(p[0, 2:], s[0, 2:])
        assert calls[2:] == ["mixed", "mixed"]


def _reference(model, toks: torch.Tensor, seed: int, min_keys: int) -> dict[str, torch.Tensor]:
    """Per layer, [4, head] means of P/S (logit, attention) from a plain loop over windows, heads
    and queries, with the permuted keys rotated from the pre-RoPE keys at their new absolute
    positions."""
    spec = rope_spec(model)
    acts = capture_qk(model, toks, which=("q_post", "k_pre", "k_post"))
    n = toks.shape[1]
    sig = key_permutation(n, seed)
    out = {}
    for L, a in acts.items():
        rope = spec.layers[L]
        q, kpre, kpost = a["q_post"].double(), a["k_pre"].double(), a["k_post"].double()
        kperm = rope.rotate(kpre[:, sig].transpose(1, 2), torch.arange(n)).transpose(
            1, 2
        )  # content σ(j) at position j
        G = rope.group_size
        c = rope.softcap

        def cap(x: torch.Tensor, c: float | None = c) -> torch.Tensor:
            return torch.tanh(x / c) * c if c else x

        tot, cnt = torch.zeros(4, rope.n_heads, dtype=torch.float64), 0
        for w in range(toks.shape[0]):
            for i in range(1, n):
                keys = [j for j in range(1, i + 1) if not rope.window or i - j < rope.window]
                if len(keys) < min_keys:
                    continue
                cnt += 1
                for h in range(rope.n_heads):
                    qi = q[w, i, h] * rope.score_scale
                    kv = h // G
                    lo = cap(torch.stack([qi @ kpost[w, j, kv] for j in keys]))
                    lp = cap(torch.stack([qi @ kperm[w, j, kv] for j in keys]))
                    ls = cap(torch.stack([qi @ kpost[w, int(sig[j]), kv] for j in keys]))
                    tot[0, h] += torch.corrcoef(torch.stack([lp, lo]))[0, 1]
                    tot[1, h] += torch.corrcoef(torch.stack([lp, ls]))[0, 1]
                    pp, po, ps = (torch.softmax(x, 0) for x in (lp, lo, ls))
                    tot[2, h] += 1 - 0.5 * (pp - po).abs().sum()
                    tot[3, h] += 1 - 0.5 * (pp - ps).abs().sum()
        out[L] = tot / cnt
    return out


# GQA; sliding windows and a score scale; interleaved partial rotary; soft-capping at 5 (these
# logits reach 7–10)
@pytest.mark.parametrize(
    ("family", "overrides"),
    [("llama-gqa", {}), ("gemma3", {}), ("gptj", {}), ("gemma3", {"attn_logit_softcapping": 5.0})],
)
def test_scores_equal_plain_loop(family, overrides):
    model = tiny_model(family, seed=1, **overrides)
    toks = _tokens(3, 16, vocab=60, seed=2)
    # the spec's soft-cap is what the scores apply; the tiny Gemma 3 forward (sdpa) ignores it, so
    # skip verification
    r = positional_symbolic(
        model, toks, n_ctx=16, min_keys=4, seed=3, tile=5, progress=False, verify=not overrides
    )
    ref = _reference(model, toks, seed=3, min_keys=4)
    for li, L in enumerate(r.layers):
        got = torch.stack([*r.scores("logit"), *r.scores("attention")])[:, li]
        # float32 logits of size ≲ 10 carry ~1e-6 relative error; correlations and softmaxes of ≤ 15
        # of them stay within 1e-4 of the float64 loop
        torch.testing.assert_close(got, ref[L], atol=1e-4, rtol=0)


def test_roundtrip_merge_and_agreement(handset, handset_result, tmp_path):
    path = tmp_path / "ps.json"
    handset_result.save(path)
    back = load_result(path)
    assert isinstance(back, PositionalSymbolic)
    torch.testing.assert_close(back.scores("logit")[0], handset_result.scores("logit")[0])
    with pytest.raises(InputError, match="count them twice"):
        handset_result.merge(handset_result)
    elsewhere = replace(handset_result.provenance, spans={"tokens:elsewhere": [[0, 1]]})
    merged = handset_result.merge(replace(handset_result, provenance=elsewhere))
    torch.testing.assert_close(merged.scores("attention")[1], handset_result.scores("attention")[1])
    assert merged.sums["n_queries"][0] == 2 * handset_result.sums["n_queries"][0]
    frame = handset_result.to_frame()
    assert list(frame["call_logit"][:2]) == ["positional", "symbolic"]
    assert len(handset_result.findings()) == 3 and handset_result.figure().data
    tax = head_taxonomy(handset, _tokens(8, N_CTX), max_offset=6, layers=[0], progress=False)
    ag = agreement(handset_result, tax)
    assert ag.confusion.loc["previous-token", "positional"] == 1
    # the equal-token head always finds its own token at offset 0, so the taxonomy reads it as
    # diagonal; moving key contents shows it follows content: flags [T, F, F, F] vs [T, T, F, F] ⇒
    # p_o = 3/4, p_e = 1/4·2/4 + 3/4·2/4 = 1/2, κ = (3/4 − 1/2) / (1 − 1/2) = 1/2
    assert ag.confusion.loc["diagonal", "symbolic"] == 1
    assert ag.positional_calls == pytest.approx(0.25) and ag.positional_taxonomy == pytest.approx(
        0.5
    )
    assert ag.kappa == pytest.approx(0.5)
    with pytest.raises(InputError, match="different layers"):
        agreement(positional_symbolic(handset, _tokens(2, N_CTX), n_ctx=N_CTX, progress=False), tax)


def test_kappa_and_rank_correlation_against_hand_counts():
    a = ["p", "p", "s", "m", "s", "p", "m", "s"]
    b = ["p", "s", "s", "m", "p", "p", "m", "m"]
    # observed 5/8 agree; expected Σ_c share_a(c)·share_b(c) = (3·3 + 3·2 + 2·3)/64 = 21/64
    assert cohen_kappa(a, b) == pytest.approx((5 / 8 - 21 / 64) / (1 - 21 / 64))
    assert cohen_kappa(["x"] * 4, ["x"] * 4) == 1.0
    x = torch.tensor([0.3, 1.0, 1.0, -2.0, 5.0, float("nan"), 0.1])
    y = torch.tensor([1.0, 2.0, 0.5, 0.0, 3.0, 4.0, 0.2])
    # the NaN pair drops out; ties share the average rank (1.0, 1.0 → 4.5, 4.5)
    rx = torch.tensor([3, 4.5, 4.5, 1, 6, 2], dtype=torch.float64)
    ry = torch.tensor([4, 5, 3, 1, 6, 2], dtype=torch.float64)
    assert rank_correlation(x, y) == pytest.approx(
        float(torch.corrcoef(torch.stack([rx, ry]))[0, 1]), abs=1e-12
    )


def test_bad_settings_are_named(handset):
    toks = _tokens(1, N_CTX)
    with pytest.raises(InputError, match="min_keys"):
        positional_symbolic(handset, toks, n_ctx=N_CTX, min_keys=1, progress=False)
    with pytest.raises(InputError, match="margin"):
        positional_symbolic(handset, toks, n_ctx=N_CTX, margin=1.5, progress=False)
    with pytest.raises(InputError, match="tile"):
        positional_symbolic(handset, toks, n_ctx=N_CTX, tile=0, progress=False)
    with pytest.raises(InputError, match="measure"):
        positional_symbolic(handset, toks, n_ctx=N_CTX, progress=False).scores("energy")
