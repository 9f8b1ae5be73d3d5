"""What a provenance records: the dtype and device the model ran in, and which tokens were measured
(so that a merge counting some twice is refused)."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from ropelens.analyses import frequency_usage, load_result
from ropelens.cli import main
from ropelens.errors import InputError
from ropelens.results.provenance import Provenance, merged_spans, placement
from ropelens.run.data import Corpus
from ropelens.run.measure import Windows

N_CTX = 32


@pytest.fixture(scope="module")
def corpus() -> Corpus:
    docs = tuple(f"Document {i} says the cat sat on mat number {7 * i}. " * 3 for i in range(12))
    return Corpus(name="twelve", documents=docs)


def _usage(model, corpus, n_windows: int):
    return frequency_usage(model, corpus, n_ctx=N_CTX, max_tokens=N_CTX * n_windows, progress=False)


def test_a_result_merged_with_itself_is_refused(tiny, corpus):
    r = _usage(tiny("llama"), corpus, 4)
    stride = N_CTX - 1  # BOS, then 31 text tokens per window
    assert list(r.provenance.spans.values()) == [[[0, 4 * stride]]]
    with pytest.raises(InputError, match=r"tokens 0–123 of corpus 'twelve'.*count them twice"):
        r.merge(r)


def test_a_merge_of_overlapping_windows_is_refused_and_of_disjoint_ones_allowed(tiny, corpus):
    model = tiny("llama")
    four, six = _usage(model, corpus, 4), _usage(model, corpus, 6)
    with pytest.raises(InputError, match="tokens 0–123 of corpus 'twelve'"):
        four.merge(six)  # both measured the first four windows
    toks = Windows.of(model.tokenizer, corpus, N_CTX, N_CTX * 6).tokens
    halves = [frequency_usage(model, t, progress=False) for t in (toks[:3], toks[3:])]
    both = halves[0].merge(halves[1])  # two ready token tensors: different input
    whole = frequency_usage(model, toks, progress=False)
    key = ("q", "all")
    torch.testing.assert_close(both.token[key].total, whole.token[key].total)
    assert both.provenance.n_windows == 6
    with pytest.raises(InputError, match="count them twice"):
        both.merge(halves[1])  # the merged result already holds the second half


def test_window_subsets_record_where_their_windows_sit(tiny, corpus):
    """The report measures disjoint subsets of one corpus's windows: they merge, and their
    spans are the windows' own text tokens."""
    win = Windows.of(tiny("llama").tokenizer, corpus, N_CTX, N_CTX * 6)
    per = N_CTX - 1
    a, b = win.subset([0, 2, 3]), win.subset([1, 4, 5])
    (origin,) = win.spans
    assert a.spans == {origin: [[0, per], [2 * per, 4 * per]]}
    assert b.subset([1]).spans == {origin: [[4 * per, 5 * per]]}  # window 4 of the corpus
    assert merged_spans(a.spans, b.spans) == win.spans
    with pytest.raises(InputError, match=f"tokens {4 * per:,}–{5 * per - 1:,}"):
        merged_spans(win.spans, b.subset([1]).spans)


def test_results_from_before_spans_were_recorded_merge_unchecked():
    assert merged_spans(None, {"corpus:x": [[0, 3]]}) is None
    old = Provenance.from_dict({"model": "m", "n_tokens": 3})
    assert old.spans is None and old.dtype is None and old.device is None
    assert not {"spans", "dtype", "device"} & set(old.to_dict())  # saved back as it was


def test_the_placement_of_a_model_is_its_weights_dtype_and_device(tiny):
    model = tiny("llama")
    p = next(model.parameters())
    assert placement(model) == {"dtype": str(p.dtype).split(".")[1], "device": str(p.device)}
    assert placement(object()) == {"dtype": None, "device": None}


def test_a_result_saved_after_dtype_bfloat16_records_dtype_and_device(tiny_dir, tmp_path):
    out = tmp_path / "u.json"
    argv = ["frequency-usage", str(tiny_dir("llama")), "--dtype", "bfloat16", "--device", "cpu"]
    assert main([*argv, "--tokens", "64", "--n-ctx", "32", "--save", str(out)]) == 0
    back = load_result(out)
    assert (back.provenance.dtype, back.provenance.device) == ("bfloat16", "cpu")
    merged = back.merge(replace(back, provenance=replace(back.provenance, spans={"x": [[0, 1]]})))
    assert (merged.provenance.dtype, merged.provenance.device) == ("bfloat16", "cpu")
