"""Many knockouts in one forward: each batch row with its own planes zeroed gives the attention of
running that knockout alone (the bridge's own attention patterns, one forward per draw), on tiny
models with GQA, sliding windows, partial rotary, on a plain HF model and on SmolLM2."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import ropelens
from ropelens.analyses.head_taxonomy import HeadScoresReducer, random_tokens
from ropelens.analyses.knockout import knocked_out, knocked_out_rows, probe_rows
from ropelens.errors import InputError, UnsupportedModelError
from ropelens.run.measure import RunOptions, Windows, measure
from ropelens.spec.bands import Bands
from ropelens.spec.reading import rope_spec


def _draws(spec, heads, n_rows, k, seed):
    """``n_rows`` knockouts: k random planes in a random subset of ``heads``, then the model."""
    rng = np.random.default_rng(seed)
    rows = []
    for _ in range(n_rows):
        rows.append(
            {
                hd: tuple(sorted(rng.choice(spec[hd[0]].n_planes, k, replace=False).tolist()))
                for hd in heads
                if rng.random() < 0.7
            }
        )
    return [*rows, {}]


def _pattern_mass(model, window, planes, heads):
    """``[head, offset]`` mass at offsets 0 and 1 (queries and keys ≥ 1) from the bridge's
    hook_pattern under one knockout: one forward through the bridge's own attention."""
    with knocked_out(model, planes), torch.no_grad():
        _, cache = model.run_with_cache(
            window[None], names_filter=lambda n: n.endswith("hook_pattern")
        )
    out = []
    for L, h in heads:
        pat = cache[f"blocks.{L}.attn.hook_pattern"][0, h].double()
        n = pat.shape[-1]
        out.append(
            torch.stack(
                [pat[torch.arange(1 + d, n), torch.arange(1, n - d)].mean() for d in (0, 1)]
            )
        )
    return torch.stack(out)


def _reducer_mass(model, spec, window, planes, heads):
    """``[head, offset]`` from :class:`HeadScoresReducer` on one window under one knockout."""
    layers = sorted({L for L, _ in heads})
    red = HeadScoresReducer(spec, layers, Bands.default(), max_offset=1)
    with knocked_out(model, planes):
        measure(
            model,
            None,
            lambda *_: red,
            RunOptions(layers=layers, batch_size=1, progress=False, verify=False),
            windows=Windows(window[None]),
            spec=spec,
            analysis="reference",
        )
    m = red.scores("r")["mass_r"]
    return torch.stack([m[layers.index(L), h, :2] for L, h in heads])


@pytest.mark.parametrize("family", ["llama-gqa", "gemma3", "llama", "gptj"])
def test_each_row_is_its_own_knockout(tiny, family):
    model = tiny(family)
    spec = rope_spec(model)
    heads = [(L, h) for L in spec.rotary_layers for h in range(spec[L].n_heads)][::2]
    rows = _draws(spec, heads, 5, 2, seed=3)
    window = random_tokens(1, 14, 60, 5, 7)[0]
    got = probe_rows(model, window, rows, heads)
    assert got.shape == (len(rows), len(heads), 2)
    for b, planes in enumerate(rows):
        # GPT-J's bridge zeroes its planes before the rotation (no post-rotation hook), where its
        # hook_pattern drifts ~1e-3 from the rotation's own q·k: the reducer is the reference there
        if family == "gptj":
            want = _reducer_mass(model, spec, window, planes, heads)
        else:
            want = _pattern_mass(model, window, planes, heads)
        torch.testing.assert_close(got[b], want, rtol=1e-5, atol=1e-6)
    # the knockouts change the attention: the rows are not all the unmodified model
    assert (got[:-1] - got[-1]).abs().amax() > 1e-3


def test_rows_on_a_plain_model(tiny_dir):
    model = ropelens.load_model(str(tiny_dir("llama-gqa")), device="cpu", bridge=False)
    spec = rope_spec(model)
    heads = [(0, 0), (0, 1), (1, 2), (1, 3)]  # heads 0 and 1 share a KV head
    rows = [{(0, 0): (1, 2), (0, 1): (1, 2)}, {(0, 0): (0,), (1, 3): (3, 4, 5)}, {}]
    window = random_tokens(1, 12, 60, 5, 2)[0]
    got = probe_rows(model, window, rows, heads)
    for b, planes in enumerate(rows):
        torch.testing.assert_close(
            got[b], _reducer_mass(model, spec, window, planes, heads), rtol=1e-5, atol=1e-6
        )


def test_bad_rows_are_refused(tiny):
    model = tiny("llama")
    window = random_tokens(1, 8, 60, 5, 2)[0]
    with pytest.raises(InputError, match="rows is empty"):
        probe_rows(model, window, [], [(0, 0)])
    with pytest.raises(InputError, match="plane 99 does not exist"):
        probe_rows(model, window, [{(0, 0): (99,)}], [(0, 0)])
    with pytest.raises(InputError, match="head 40 does not exist"):
        probe_rows(model, window, [{(0, 40): (1,)}], [(0, 0)])
    with pytest.raises(InputError, match="at least 3 tokens"):
        probe_rows(model, window[:2], [{}], [(0, 0)])


def test_a_batch_of_another_size_is_refused(tiny):
    model = tiny("llama")
    with (
        knocked_out_rows(model, [{(0, 0): (1,)}, {}]),
        pytest.raises(UnsupportedModelError, match="as many rows"),
    ):
        model(random_tokens(3, 8, 60, 5, 2), return_type="logits")


@pytest.mark.integration
def test_rows_on_smollm2(smollm2):
    spec = rope_spec(smollm2)
    heads = [(1, 2), (2, 1), (11, 1), (29, 4)]
    rows = _draws(spec, heads, 3, 8, seed=0)
    window = random_tokens(1, 24, smollm2.cfg.d_vocab, 5, 0)[0]
    got = probe_rows(smollm2, window, rows, heads)
    for b, planes in enumerate(rows):
        torch.testing.assert_close(
            got[b], _reducer_mass(smollm2, spec, window, planes, heads), rtol=1e-4, atol=1e-5
        )
