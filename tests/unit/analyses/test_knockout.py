"""Knockouts on tiny models: dose 0 is the model itself, whole heads equal ablate_planes, the probe
and copy metrics against the bridge's own attention patterns and logits, CIs, seeds, the result
file, the figure and the command."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch

import ropelens
from ropelens.analyses.head_taxonomy import random_tokens
from ropelens.analyses.knockout import Knockout, head_sets, knocked_out, knockout, plane_order
from ropelens.errors import InputError
from ropelens.results.result import load_result
from ropelens.run.evaluate import window_losses
from ropelens.run.intervene import ablate_planes

SET = [(0, 0), (0, 1), (1, 2)]  # heads 0 and 1 of layer 0 share KV head 0 in llama-gqa
PROBE = [(0, 3), (1, 1)]
N_CTX, N_WIN = 24, 3


def _run(model, **kw):
    args = {
        "doses": [0, 2, 8],
        "metrics": ("loss", "probe"),
        "probe_heads": PROBE,
        "n_ctx": N_CTX,
        "n_windows": N_WIN,
        "n_random": 2,
        "n_control": 2,
        "control_doses": [2],
        "n_boot": 200,
        "verify": False,
        "corpus": random_tokens(N_WIN, N_CTX, 101, 1, 5),
    }
    return knockout(model, {"set": SET}, **{**args, **kw})


@pytest.fixture(scope="module")
def result(tiny):
    return _run(tiny("llama-gqa"))


def _rows(r: Knockout, direction: str, dose: int, metric: str) -> dict:
    df = r.to_frame()
    got = df[(df["direction"] == direction) & (df["dose"] == dose) & (df["metric"] == metric)]
    assert len(got) == 1, (direction, dose, metric)
    return got.iloc[0].to_dict()


def test_dose_zero_is_the_model_itself(result):
    df = result.to_frame()
    zero = df[df["dose"] == 0]
    assert set(zero["metric"]) == {"loss", "previous_token", "diagonal", "positional"}
    assert (zero["estimate"] == 0).all() and (zero["lo"] == 0).all() and (zero["hi"] == 0).all()


def _direct_effect(model, tokens, heads):
    """Loss effect of zeroing every plane of ``heads``: one ablate_planes call per layer,
    window_losses directly."""
    spec = ropelens.rope_spec(model)
    base = window_losses(model, tokens, progress=False)
    by_layer: dict[int, list[int]] = {}
    for L, h in heads:
        by_layer.setdefault(L, []).append(h)
    ctx = [
        ablate_planes(model, list(range(spec[L].n_planes)), layers=[L], heads=hs)
        for L, hs in by_layer.items()
    ]
    for c in ctx:
        c.__enter__()
    try:
        knocked = window_losses(model, tokens, progress=False)
    finally:
        for c in reversed(ctx):
            c.__exit__(None, None, None)
    return (knocked.double() - base.double()).mean().item()


def test_whole_head_knockout_equals_ablate_planes_computed_directly(tiny, result):
    model = tiny("llama-gqa")
    toks = random_tokens(N_WIN, N_CTX, 101, 1, 5)
    direct = _direct_effect(model, toks, SET)
    assert direct != 0
    assert _rows(result, "head", 8, "loss")["estimate"] == pytest.approx(
        direct, rel=1e-9, abs=1e-12
    )
    # all 8 planes from the highest down are the same planes: the high curve ends at the whole-head
    # value
    assert (
        _rows(result, "high", 8, "loss")["estimate"] == _rows(result, "head", 8, "loss")["estimate"]
    )


def test_whole_head_knockout_on_a_plain_model(tiny_dir):
    model = ropelens.load_model(str(tiny_dir("llama-gqa")), device="cpu", bridge=False)
    r = _run(model, metrics=("loss",), doses=[0, 8], n_random=0, n_control=0)
    toks = random_tokens(N_WIN, N_CTX, 101, 1, 5)
    assert _rows(r, "head", 8, "loss")["estimate"] == pytest.approx(
        _direct_effect(model, toks, SET), rel=1e-9, abs=1e-12
    )


def _pattern_masses(model, tokens, planes):
    """Mean attention at offsets 0 and 1 (keys from position 1 on) of the probe heads, per
    window, from the bridge's hook_pattern under the knockout: a forward through the bridge's own
    attention."""
    with knocked_out(model, planes), torch.no_grad():
        _, cache = model.run_with_cache(tokens, names_filter=lambda n: n.endswith("hook_pattern"))
    out = {0: [], 1: []}
    for d in (0, 1):
        per_head = []
        for L, h in PROBE:
            pat = cache[f"blocks.{L}.attn.hook_pattern"][:, h]  # [window, query, key]
            n = pat.shape[-1]
            q = torch.arange(1 + d, n)
            per_head.append(pat[:, q, q - d].double().mean(-1))
        out[d] = torch.stack(per_head, -1).mean(-1)
    return out


def test_probe_matches_the_bridges_attention_patterns(tiny, result):
    model = tiny("llama-gqa")
    spec = ropelens.rope_spec(model)
    probe_tokens = random_tokens(
        N_WIN, N_CTX, 101, 1, 0
    )  # the probe's random tokens: seed 0, BOS first
    base = _pattern_masses(model, probe_tokens, {})
    hi = {hd: tuple(sorted(plane_order(spec[hd[0]].inv_freq, "high")[:2])) for hd in SET}
    assert all(ps == (0, 1) for ps in hi.values())  # index 0 is the highest frequency
    knocked = _pattern_masses(model, probe_tokens, hi)
    for metric, d in (("diagonal", 0), ("previous_token", 1)):
        row = _rows(result, "high", 2, metric)
        assert row["base"] == pytest.approx(float(base[d].mean()), rel=1e-5)
        assert row["estimate"] == pytest.approx(
            float((knocked[d] - base[d]).mean()), rel=1e-4, abs=1e-7
        )


def test_copy_metrics_match_the_bridges_logits(tiny):
    """copy_nll and copy_accuracy: the digits' teacher-forced loss and top-1 hits, from the bridge's
    logits."""
    from ropelens.analyses.passkey_retrieval import make_passkey, passkey_prompt
    from ropelens.analyses.retrieval_heads import copy_case

    model = tiny("llama-gqa")
    r = _run(
        model,
        metrics=("retrieval",),
        doses=[0, 2],
        directions=("low",),
        n_random=0,
        n_control=0,
        whole_head=False,
        prompt_len=300,
    )
    spec = ropelens.rope_spec(model)
    low = {hd: tuple(sorted(plane_order(spec[hd[0]].inv_freq, "low")[:2])) for hd in SET}
    assert all(ps == (6, 7) for ps in low.values())
    nll = {"base": [], "knocked": []}
    for t, depth in enumerate(np.linspace(0.1, 0.9, N_WIN).tolist()):
        case = copy_case(
            model.tokenizer, passkey_prompt(model.tokenizer, 300, depth, make_passkey(2000, t))
        )
        for which, planes in (("base", {}), ("knocked", low)):
            with knocked_out(model, planes), torch.no_grad():
                logits = model(case.tokens[None])[0]
            q = list(case.queries)
            nll[which].append(
                torch.nn.functional.cross_entropy(logits[q], case.tokens[[i + 1 for i in q]]).item()
            )
    row = _rows(r, "low", 2, "copy_nll")
    assert row["base"] == pytest.approx(np.mean(nll["base"]), rel=1e-5)
    assert row["estimate"] == pytest.approx(
        np.mean(nll["knocked"]) - np.mean(nll["base"]), rel=1e-4, abs=1e-6
    )
    acc = _rows(r, "low", 0, "copy_accuracy")
    assert 0 <= acc["base"] <= 1


def test_intervals_hold_the_estimate_and_p_values_are_permutation_p_values(result):
    df = result.to_frame()
    assert (df["lo"] <= df["estimate"]).all() and (df["estimate"] <= df["hi"]).all()
    p = df[df["direction"].isin(["high", "low"]) & (df["dose"] == 2)]
    assert p["p_random_planes"].isin([1 / 3, 2 / 3, 1.0]).all()  # (1 + #≥) / (1 + 2 draws)
    assert p["p_random_heads"].isin([1 / 3, 2 / 3, 1.0]).all()
    assert df[df["dose"] == 8]["p_random_planes"].isna().all()  # no control ran there


def test_random_planes_that_are_all_planes_cannot_differ_from_the_set(tiny):
    """8 random planes of 8 are the 8 highest: every draw is the set itself, so its p-value is
    withheld (never a p of 1 from the set compared with itself) and the reason names it."""
    r = _run(
        tiny("llama-gqa"),
        metrics=("loss",),
        doses=[0, 8],
        control_doses=[8],
        n_control=0,
        whole_head=False,
    )
    row = _rows(r, "high", 8, "loss")
    assert math.isnan(row["p_random_planes"]) and row["distinct_random_planes"] == 1
    assert "random planes cannot differ from the tested set" in row["p_withheld"]
    assert _rows(r, "random", 8, "loss")["estimate"] == pytest.approx(
        _rows(r, "high", 8, "loss")["estimate"]
    )


def test_deterministic_under_a_seed_and_changed_by_another(tiny, result):
    model = tiny("llama-gqa")
    again = _run(model)
    assert again.to_frame().equals(result.to_frame())
    other = _run(model, seed=1).to_frame()
    assert not other[other["direction"] == "random"]["estimate"].equals(
        result.to_frame()[result.to_frame()["direction"] == "random"]["estimate"]
    )


def test_knocked_out_groups_heads_like_ablate_planes(tiny):
    """knocked_out of two heads sharing a KV head equals one ablate_planes call over both (logits to
    the bit)."""
    model = tiny("llama-gqa")
    toks = random_tokens(2, 16, 101, 1, 3)
    with torch.no_grad():
        with knocked_out(model, {(0, 0): (0, 1), (0, 1): (0, 1)}):
            a = model(toks)
        with ablate_planes(model, [0, 1], layers=[0], heads=[0, 1]):
            b = model(toks)
        base = model(toks)
    assert torch.equal(a, b) and not torch.equal(a, base)


def test_save_load_figure_and_findings(result, tmp_path):
    path = tmp_path / "knockout.json"
    result.save(path)
    back = load_result(path)
    assert isinstance(back, Knockout) and back.heads == result.heads
    assert back.to_frame().equals(result.to_frame())
    fig = result.figure("loss")
    names = {t.name for t in fig.data if t.showlegend is not False and t.name}
    assert {"set: high", "set: random", "set: head"} <= names
    assert len(result.figure().layout.annotations) == 4  # one panel per metric
    with pytest.raises(InputError, match="was not measured"):
        result.figure("copy_nll")
    texts = [f.text for f in result.findings()]
    assert any(
        t.startswith("Zeroing 8 planes (high) in the 3 set heads changes loss") for t in texts
    )


def test_bad_input_is_refused(tiny):
    model = tiny("llama-gqa")
    with pytest.raises(InputError, match="doses must lie in 0..8"):
        _run(model, doses=[0, 9])
    with pytest.raises(InputError, match="directions must be 'high' and/or 'low'"):
        _run(model, directions=("random",))
    with pytest.raises(InputError, match="layer 0 has 4 query heads, so head 4 does not exist"):
        knockout(
            model,
            {"x": [(0, 4)]},
            metrics=("loss",),
            verify=False,
            corpus=random_tokens(2, 16, 101, 1, 0),
        )
    with pytest.raises(InputError, match="pass probe_heads"):
        knockout(model, {"x": [(0, 1)]}, verify=False, corpus=random_tokens(2, 16, 101, 1, 0))
    with pytest.raises(InputError, match="unknown head set 'copying'"):
        knockout(model, ["copying"], verify=False)
    with pytest.raises(InputError, match="metrics must be chosen from"):
        _run(model, metrics=("perplexity",))


def test_named_sets_others_is_the_rest(tiny):
    """``others`` holds every rotary head in none of the positional, sink and retrieval sets (here:
    all heads, the tiny model having none of the three, or the complement of those it has)."""
    model = tiny("llama")
    text = random_tokens(2, 32, 101, 1, 0)
    try:
        sets = head_sets(model, ["others"], text, retrieval_ctx=300)
    except InputError as e:  # every head is positional, sink or retrieval: nothing left
        assert "no others heads" in str(e)
        return
    parts = {}
    for name in ("positional", "sinks", "retrieval"):
        try:
            parts[name] = set(head_sets(model, [name], text, retrieval_ctx=300)[name])
        except InputError:
            parts[name] = set()
    every = {(L, h) for L in range(2) for h in range(4)}
    assert set(sets["others"]) == every - set().union(*parts.values())


def test_knockout_command(tiny_dir, tmp_path, capsys):
    from ropelens.cli.main import main

    save = tmp_path / "k.json"
    argv = [
        "knockout",
        str(tiny_dir("llama-gqa")),
        "--heads",
        "0.0,1.2",
        "--probe-heads",
        "0.3",
        "--doses",
        "0,2",
        "--n-ctx",
        "24",
        "--tokens",
        "48",
        "--random",
        "1",
        "--controls",
        "1",
        "--boot",
        "100",
        "--json",
        "--save",
        str(save),
    ]
    assert main(argv) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["heads"] == {"custom": [[0, 0], [1, 2]]}
    assert {r["direction"] for r in out["rows"]} >= {"high", "low", "random", "head"}
    assert all(r["p_random_heads"] is None or 0 < r["p_random_heads"] <= 1 for r in out["rows"])
    assert isinstance(load_result(save), Knockout)
    assert main(["knockout", str(tiny_dir("llama-gqa")), "--heads", "0:1"]) == 2
    assert "LAYER.HEAD" in capsys.readouterr().err
    assert not math.isnan(out["rows"][0]["estimate"])
