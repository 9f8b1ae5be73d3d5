"""Claims on tiny random-weight models: the negative control (no claim about trained weights holds
on random ones), the result's file and merge, the knockout numbers against one forward per
condition, and the command's refusals."""

from __future__ import annotations

import itertools
import math

import pytest
import torch

from ropelens.analyses.knockout import knocked_out
from ropelens.claims import (
    CLAIMS,
    DOES_NOT_HOLD,
    HOLDS,
    INCONCLUSIVE,
    NOT_APPLICABLE,
    Claim,
    ClaimContext,
    ClaimsResult,
    Measurement,
    claims,
    register_claim,
)
from ropelens.claims.context import budget
from ropelens.claims.knockouts import ANY_LAYER, PLANES, SAME_LAYERS, knockout_claim
from ropelens.errors import InputError, NotRotaryError

FAMILIES = ("llama", "llama-gqa", "gemma3", "gptj")


@pytest.fixture(scope="module")
def quick_results(tiny):
    return {f: claims(tiny(f), budget="quick", progress=False) for f in FAMILIES}


@pytest.mark.parametrize("family", FAMILIES)
def test_no_claim_about_trained_weights_holds_on_random_weights(quick_results, family):
    result = quick_results[family]
    assert [r.name for r in result.rows] == list(CLAIMS)
    for r in result.rows:
        assert r.reason, r.name
        if CLAIMS[r.name].reads_weights:
            assert r.verdict in (DOES_NOT_HOLD, INCONCLUSIVE, NOT_APPLICABLE), (r.name, r.reason)
    # the base bound reads the configuration alone; it is decided exactly, either way
    base = result.row("base-bounds-context")
    assert base.verdict in (HOLDS, DOES_NOT_HOLD) and base.lo == base.hi == base.effect


def test_the_result_saves_loads_and_merges(quick_results, tmp_path):
    result = quick_results["llama"]
    path = tmp_path / "claims.json"
    result.save(path)
    back = ClaimsResult.load(path)
    assert [(r.name, r.verdict, r.reason) for r in back.rows] == [
        (r.name, r.verdict, r.reason) for r in result.rows
    ]
    frame = back.to_frame()
    assert list(frame["claim"]) == list(CLAIMS)
    first, second = list(CLAIMS)[:2], list(CLAIMS)[2:4]
    a = ClaimsResult(
        tuple(r for r in result.rows if r.name in first), "quick", 0.05, result.provenance
    )
    b = ClaimsResult(
        tuple(r for r in result.rows if r.name in second), "quick", 0.05, result.provenance
    )
    merged = a.merge(b)
    assert [r.name for r in merged.rows] == first + second
    with pytest.raises(InputError, match="both results hold"):
        a.merge(a)


def test_knockout_numbers_match_one_forward_per_condition(tiny):
    model = tiny("llama")
    context = ClaimContext(model, budget("quick"))
    heads = [(0, 1), (1, 2)]
    windows = [
        torch.randint(4, 60, (12,), generator=torch.Generator().manual_seed(s)) for s in (1, 2)
    ]

    def batched(window, rows):
        from ropelens.claims.rows import row_scores

        pos = torch.arange(window.numel() - 1)
        nll, _ = row_scores(model, window, rows, 4096, pos, window[1:])
        return nll.mean(-1).tolist()

    m = knockout_claim(context, heads, "high", windows, batched, "greater", lambda a, b: "")

    def alone(window, planes):  # one plain forward, the planes zeroed for the whole batch
        with knocked_out(model, planes) if planes else torch.no_grad(), torch.no_grad():
            logits = model(window[None], return_type="logits")[0, :-1].double()
        return float((logits.logsumexp(-1) - logits.gather(-1, window[1:, None])[:, 0]).mean())

    top = {hd: m.detail["dose"] for hd in heads}
    from ropelens.claims.knockouts import _end

    planes = {hd: _end(context.spec, hd[0], "high", k) for hd, k in top.items()}

    def planes_of(layer):
        return _end(context.spec, layer, "high", m.detail["dose"])

    effects = [alone(w, planes) - alone(w, {}) for w in windows]
    assert m.effect == pytest.approx(sum(effects) / 2, abs=1e-5)
    assert m.baseline == pytest.approx(sum(alone(w, {}) for w in windows) / 2, abs=1e-5)
    names = [c.name for c in m.controls]
    assert names[:3] == [PLANES, SAME_LAYERS, ANY_LAYER]
    drawn, same, any_layer = m.controls[:3]
    assert drawn.n_draws == 39 and drawn.p_floor == pytest.approx(0.025)
    assert not drawn.exhaustive
    # 4 heads in each of 2 layers, one tested in each: 16 same-layer sets exist, few enough to
    # measure every one; the claimed set's exact p is the share of the 16 at least as extreme
    assert same.exhaustive and same.n_possible == 16 and same.n_draws == 15
    assert not same.withheld and same.p_floor == pytest.approx(1 / 16)
    sets = [{(0, a): planes_of(0), (1, b): planes_of(1)} for a in range(4) for b in range(4)]
    by_set = [sum(alone(w, s) - alone(w, {}) for w in windows) / 2 for s in sets]
    others = by_set[:6] + by_set[7:]  # set 6 is the claimed one: heads 1 and 2
    # the batched rows agree with one forward per set far closer than any two sets lie apart
    assert abs(by_set[6] - m.effect) < min(abs(e - m.effect) for e in others) / 10
    assert same.p == pytest.approx((1 + sum(e >= m.effect for e in others)) / 16)
    # 8 heads, 2 tested: C(8, 2) = 28 sets from any layer, also measured whole
    assert any_layer.exhaustive and any_layer.n_possible == 28 and any_layer.n_draws == 27


def test_a_users_claim_registers_and_runs(tiny):
    mine = register_claim(
        Claim(
            "heads-are-even",
            "The model has an even number of heads per layer.",
            "arithmetic",
            "",
            "the spec's head count",
            "heads mod 2",
            (),
            "exact",
            "less",
            0.5,
            lambda c: Measurement(
                effect=float(c.spec[0].n_heads % 2), lo=0.0, hi=0.0, detail={"controlled": False}
            ),
            reads_weights=False,
        )
    )
    try:
        result = claims(tiny("llama"), "heads-are-even", "quick", progress=False)
        assert result.row(mine.name).verdict == HOLDS
    finally:
        del CLAIMS["heads-are-even"]


def test_bad_input_is_one_line(tiny):
    with pytest.raises(InputError, match="no claim 'nope'"):
        claims(tiny("llama"), "nope", "quick")
    with pytest.raises(InputError, match="budget must be one of quick, standard, thorough"):
        claims(tiny("llama"), None, "fast")
    with pytest.raises(InputError, match="alpha"):
        claims(tiny("llama"), None, "quick", alpha=1.5)
    with pytest.raises(NotRotaryError, match="not RoPE"):
        claims(tiny("gpt2"), None, "quick")


def test_the_command_refuses_bad_flags(capsys, tiny_dir):
    from ropelens.cli import main

    model = str(tiny_dir("llama"))
    assert main(["claims", model, "--budget", "fast"]) != 0
    err = capsys.readouterr().err
    assert "--budget must be one of quick, standard, thorough, got 'fast'" in err
    assert main(["claims", model, "--claims", "positional,x"]) != 0
    assert "--claims 'positional,x': no claim 'positional'" in capsys.readouterr().err


def test_local_global_p_values_against_the_exact_hypergeometric(tiny):
    from dataclasses import replace

    from ropelens.claims.builtin import _local_global

    # tiny Gemma-3: 3 local layers and 1 global, 4 heads each (12 of 16 heads local)
    context = ClaimContext(tiny("gemma3"), replace(budget("quick"), n_draws=1999))
    context.__dict__["found"] = {
        "positional": [[0, 1], [1, 2]],  # both local
        "retrieval_score": {
            f"{L}.{h}": float(L == 3 and h < 2) for L in range(4) for h in range(4)
        },
    }
    m = _local_global(context)
    pos, retr = m.controls
    # 120 sets of 2 heads exist, fewer than the draws: every one is counted (exact). P(2 random
    # heads both local) = C(12, 2) / C(16, 2); both global: C(4, 2) / C(16, 2)
    assert pos.p == pytest.approx(math.comb(12, 2) / math.comb(16, 2))
    assert retr.p == pytest.approx(math.comb(4, 2) / math.comb(16, 2))
    assert pos.n_possible == retr.n_possible == 120 and pos.p_floor == pytest.approx(1 / 120)
    assert m.effect == pytest.approx(min(1 - 0.75, 1 - 0.25))
    assert "2 of 2 positional heads local, 2 of 2 retrieval heads global" in m.model_number


def test_base_bound_against_b_of_m_at_every_position(tiny):
    from ropelens.claims.builtin import _base_bound

    def b_min(base: float, d: int, n: int) -> float:  # Men et al.'s B(m) = Σ_i cos(m θ_i), m < n
        theta = base ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)
        return float(torch.cos(torch.arange(n, dtype=torch.float64)[:, None] * theta).sum(1).min())

    for family in ("llama", "gemma3", "gptj"):
        m = _base_bound(ClaimContext(tiny(family), budget("quick")))
        for r in m.detail["layers"]:
            assert r["min_b"] == pytest.approx(b_min(r["base"], r["rotary_dim"], r["context"]))
            assert r["holds"] == (r["min_b"] >= 0)
        assert m.effect == min(r["min_b"] for r in m.detail["layers"])
    # tiny Llama: base 1e4 lies above the smallest feasible base (8.6e3) and still fails at its
    # own 256 tokens, since feasibility is not monotone in the base
    (llama,) = _base_bound(ClaimContext(tiny("llama"), budget("quick"))).detail["layers"]
    assert llama["smallest_base"] < 1e4 and not llama["holds"]
    assert b_min(llama["smallest_base"] * (1 + 1e-9), 16, 256) >= -1e-9


def test_energy_shares_against_the_projections_themselves(tiny):
    from dataclasses import replace

    from ropelens.claims.builtin import _energy
    from ropelens.spec.reading import hf_model_of

    model = tiny("llama")  # no q/k norm: the pre-RoPE q and k are q_proj and k_proj's outputs
    context = ClaimContext(model, replace(budget("quick"), n_windows=2))
    hf = hf_model_of(model)
    d = 16
    caught: dict[str, list[torch.Tensor]] = {"q": [], "k": []}
    hooks = [
        getattr(layer.self_attn, f"{x}_proj").register_forward_hook(
            lambda _m, _i, out, x=x: caught[x].append(out.detach().double())
        )
        for layer in hf.model.layers
        for x in ("q", "k")
    ]
    shares = []
    try:
        for w in context.text_windows:
            caught["q"].clear(), caught["k"].clear()
            with torch.no_grad():
                hf(w[None])
            per_which = []
            for x in ("q", "k"):
                per_layer = []
                for out in caught[x]:  # [1, pos, heads · d], half-split planes (i, i + d/2)
                    v = out[0].reshape(out.shape[1], -1, d)
                    plane = v[..., : d // 2] ** 2 + v[..., d // 2 :] ** 2  # [pos, head, plane]
                    e = plane.mean(0)  # [head, plane]
                    q4 = torch.stack([e[:, i * 2 : i * 2 + 2].sum(-1) for i in range(4)], -1)
                    per_layer.append(q4 / q4.sum(-1, keepdim=True))
                per_which.append(torch.stack(per_layer).mean((0, 1)))
            s = torch.stack(per_which).mean(0)
            shares.append(s)
    finally:
        for h in hooks:
            h.remove()
    want = torch.stack(shares).mean(0)
    m = _energy(context)
    assert torch.tensor(m.detail["quarter_share"]) == pytest.approx(want, abs=1e-5)
    per_window = [float(s[-1] - s[:-1].max()) for s in shares]
    assert m.effect == pytest.approx(sum(per_window) / 2, abs=1e-5)


def test_the_command_prints_and_emits_json(capsys, tiny_dir, tmp_path):
    import json

    from ropelens.cli import main

    model = str(tiny_dir("llama"))
    saved = tmp_path / "c.json"
    args = ["claims", model, "--claims", "base-bounds-context,qk-energy-lowest-band"]
    assert main([*args, "--budget", "quick", "--json", "--save", str(saved)]) == 0
    out = json.loads(capsys.readouterr().out)
    assert [r["name"] for r in out["rows"]] == ["base-bounds-context", "qk-energy-lowest-band"]
    assert ClaimsResult.load(saved).row("base-bounds-context").verdict == out["rows"][0]["verdict"]
    assert main([*args, "--budget", "quick"]) == 0
    printed = capsys.readouterr()
    assert "base-bounds-context" in printed.out and "min B(m)" in printed.out
    assert "qk-energy-lowest-band: measured in" in printed.err  # a line per claim as it ends
    assert main([*args, "--budget", "quick", "--quiet"]) == 0
    assert capsys.readouterr().err == ""


def test_small_pools_are_enumerated_each_set_once_the_claimed_one_left_out(tiny):
    from ropelens.claims.knockouts import condition_rows, control_pools

    spec = ClaimContext(tiny("llama"), budget("quick")).spec
    heads = [(0, 1)]
    k = 2
    pools = control_pools(spec, heads, k)
    labels, rows = condition_rows(spec, heads, "high", 39, seed=5, dose=k)
    claimed = rows[1]
    n_planes = spec[0].n_planes
    assert pools[PLANES] == math.comb(n_planes, k) <= 79  # few enough to enumerate
    for name, pool in pools.items():
        sets = [tuple(sorted(r.items())) for r, lab in zip(rows, labels) if lab == name]
        assert len(sets) == len(set(sets)) == pool - 1, name
        assert tuple(sorted(claimed.items())) not in sets, name
    planes = [r[(0, 1)] for r, lab in zip(rows, labels) if lab == PLANES]
    assert sorted(planes + [claimed[(0, 1)]]) == list(itertools.combinations(range(n_planes), k))
    # a pool larger than twice the draws is drawn from, as many draws as the budget says
    labels, _ = condition_rows(spec, heads, "high", 3, seed=5, dose=k)
    assert labels.count(PLANES) == 3
