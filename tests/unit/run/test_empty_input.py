"""No numbers from nothing: every corpus analysis refuses an empty input with an error naming what
was empty, and a result that counted no token writes no finding."""

from __future__ import annotations

import inspect
from dataclasses import replace

import pytest
import torch

from ropelens.analyses.registry import analyses
from ropelens.errors import InputError
from ropelens.results.findings import Finding
from ropelens.spec.variants import Linear

N_CTX = 16
# every registered analysis that reads a corpus
CORPUS_ANALYSES = sorted(
    a.name
    for a in analyses()
    if a.function is not None and "corpus" in inspect.signature(a.function).parameters
)


def _call(name: str, model_dir, tmp_path, corpus, budget: int | None = None):
    """``name``'s analysis on ``corpus`` with windows of ``N_CTX`` tokens; ``budget`` tokens in all
    (None: a few windows' worth)."""
    from ropelens import load_model

    fn = next(a.function for a in analyses() if a.name == name)
    tokens = 4 * N_CTX if budget is None else budget
    windows = tokens // N_CTX
    quiet = {"progress": False, "verify": False}
    if name == "trajectory":
        return fn(
            [model_dir],
            steps=[0],
            corpus=corpus,
            n_tokens=tokens,
            n_ctx=N_CTX,
            analyses=["massive"],
        )
    model = load_model(str(model_dir), device="cpu")
    if name == "report":
        return fn(model, corpus, tokens=tokens, n_ctx=N_CTX, out=tmp_path / "r", progress=False)
    if name == "extension-study":
        return fn(
            model, 2 * N_CTX, native=N_CTX, n_windows=windows, corpus=corpus, out=None, **quiet
        )
    if name == "knockout":
        sets = {"set": [(0, 0)]}
        return fn(model, sets, corpus=corpus, n_ctx=N_CTX, n_windows=windows, metrics=["loss"])
    if name == "head-taxonomy":
        return fn(model, corpus, n_ctx=N_CTX, n_windows=windows, **quiet)
    if name == "intervention-effect":
        return fn(model, Linear(2.0), corpus, n_ctx=N_CTX, max_tokens=tokens, **quiet)
    return fn(model, corpus, n_ctx=N_CTX, max_tokens=tokens, **quiet)


def _empty_inputs(tmp_path):
    (tmp_path / "blank.txt").write_text("  \n")
    (tmp_path / "rows.jsonl").write_text('{"text": ""}\n{"text": null}\n')
    return {
        "no windows": (torch.zeros(0, N_CTX, dtype=torch.long), r"no windows \(shape \(0, 16\)\)"),
        "zero-length windows": (torch.zeros(3, 0, dtype=torch.long), r"hold 0 tokens"),
        "empty list": ([], r"empty list"),
        "empty strings": (["", "  "], r"document 0 of the corpus list is empty"),
        "blank file": (str(tmp_path / "blank.txt"), r"blank.txt is empty"),
        "table without text": (str(tmp_path / "rows.jsonl"), r"no text in column 'text'"),
    }


EMPTY = [
    "no windows",
    "zero-length windows",
    "empty list",
    "empty strings",
    "blank file",
    "table without text",
]


@pytest.mark.parametrize("name", CORPUS_ANALYSES)
@pytest.mark.parametrize("case", EMPTY)
def test_every_corpus_analysis_refuses_an_empty_input(tiny_dir, tmp_path, name, case):
    corpus, message = _empty_inputs(tmp_path)[case]
    if name == "trajectory" and isinstance(corpus, torch.Tensor):
        message = "cannot be a Tensor"  # a trajectory reads text, never ready tokens
    with pytest.raises(InputError, match=message):
        _call(name, tiny_dir("llama"), tmp_path, corpus)


@pytest.mark.parametrize("name", CORPUS_ANALYSES)
def test_every_corpus_analysis_refuses_a_budget_below_one_window(tiny_dir, tmp_path, name):
    """Fewer tokens than one window (or no window at all) is refused, never measured as nothing
    or as shorter windows than asked."""
    with pytest.raises(
        InputError, match=r"(less|fewer) than one window|must be (an int )?>= ?[12]"
    ):
        _call(name, tiny_dir("llama"), tmp_path, None, budget=N_CTX // 2)


def test_the_registry_names_the_corpus_analyses():
    """The parametrization above covers the analyses users reach from the command line."""
    assert {"frequency-usage", "knockout", "head-taxonomy", "report"} <= set(CORPUS_ANALYSES)


def test_a_result_that_counted_no_token_writes_no_finding(tiny):
    """A result of zero tokens (here a real one with its count set to 0, as one written by an
    older ropelens could be) withholds its findings and says why."""
    from ropelens.analyses import frequency_usage

    r = frequency_usage(
        tiny("llama"),
        torch.randint(4, 60, (2, N_CTX), generator=torch.Generator().manual_seed(0)),
        progress=False,
        verify=False,
    )
    assert r.findings() and not r.findings()[0].values.get("withheld")
    empty = replace(r, provenance=replace(r.provenance, n_tokens=0, n_windows=0))
    (only,) = empty.findings()
    assert isinstance(only, Finding)
    assert only.values["withheld"] is True and only.values["n_tokens"] == 0
    assert "counted no token" in only.text and "%" not in only.text
    assert only.section == "frequency-usage"
