"""Statistics that cannot overstate: a control that cannot differ from the tested set withholds its
p-value and says why, every p-value comes with the smallest one its draws allow, a bootstrap CI
needs enough resamples, doses are whole plane counts in Python as on the command line, and results
measured differently do not merge."""

from __future__ import annotations

import math

import pytest
import torch

from ropelens.analyses import frequency_usage, knockout
from ropelens.analyses.head_taxonomy import random_tokens
from ropelens.errors import InputError
from ropelens.run.evaluate import MIN_BOOT, bootstrap_ci, percentile_ci
from ropelens.run.stats import clustered_permutation_test, paired_bootstrap_ci

N_CTX, N_WIN = 24, 3
EVERY_HEAD = [(layer, head) for layer in range(2) for head in range(4)]  # tiny llama: 2 × 4


def _knockout(model, heads, **kw):
    args = {
        "doses": [2],
        "directions": ["high"],
        "metrics": ["loss"],
        "corpus": random_tokens(N_WIN, N_CTX, 101, 1, 5),
        "n_random": 3,
        "n_control": 3,
        "n_boot": MIN_BOOT,
        "verify": False,
        "progress": False,
    }
    return knockout(model, {"set": heads}, **{**args, **kw})


def _row(result, direction, dose):
    df = result.to_frame()
    (i,) = df.index[(df["direction"] == direction) & (df["dose"] == dose)]
    return df.loc[i]


@pytest.fixture(scope="module")
def whole_pool(tiny):
    """A knockout of every head: the random head sets can only be the set itself."""
    return _knockout(tiny("llama"), EVERY_HEAD)


@pytest.mark.parametrize("direction,dose", [("high", 2), ("head", 8)])
def test_a_set_of_every_head_withholds_its_random_heads_p(whole_pool, direction, dose):
    row = _row(whole_pool, direction, dose)
    assert math.isnan(row["p_random_heads"])  # before: 1.0, as if tested
    assert row["distinct_random_heads"] == 1
    assert "random head sets cannot differ from the tested set" in row["p_withheld"]
    assert "1 distinct set" in row["p_withheld"]
    control = _row(whole_pool, f"random heads ({direction})", dose)
    assert control["distinct_random_heads"] == 1 and control["n_draws"] == 3


def test_the_finding_names_the_control_that_cannot_differ(whole_pool):
    texts = [f.text for f in whole_pool.findings()]
    head = next(t for t in texts if "(head)" in t)
    assert "p_random_heads withheld: the random head sets cannot differ" in head
    assert "p_random_heads =" not in head
    high = next(t for t in texts if "(high)" in t)
    assert "p_random_planes = " in high and "the smallest 0.25 its draws allow" in high


def test_fewer_distinct_sets_than_draws_withholds_the_p(tiny):
    """3 of a layer's 4 heads: only 4 matched sets exist, so 9 draws must repeat."""
    r = _knockout(tiny("llama"), [(0, 0), (0, 1), (0, 2)], n_control=9, n_random=0)
    row = _row(r, "high", 2)
    assert math.isnan(row["p_random_heads"])
    assert "only 4 distinct sets exist" in row["p_withheld"]
    assert row["distinct_random_heads"] <= 4
    assert row["p_floor_random_heads"] == pytest.approx(1 / 10)


def test_every_p_value_states_its_floor_and_distinct_draws(tiny):
    r = _knockout(tiny("llama"), [(0, 1), (1, 2)])
    df = r.to_frame()
    for control in ("random_planes", "random_heads"):
        stated = df[df[f"p_{control}"].notna()]
        assert len(stated) and (stated[f"p_floor_{control}"] == 0.25).all()  # 1 / (1 + 3)
        assert (stated[f"p_{control}"] >= stated[f"p_floor_{control}"]).all()
        assert (stated[f"distinct_{control}"] >= 1).all()
    assert (df["p_withheld"] == "").all()
    assert "the smallest 0.25 its draws allow" in r.findings()[0].text


def test_withheld_reasons_and_floors_survive_a_save(whole_pool, tmp_path):
    from ropelens import load_result

    whole_pool.save(tmp_path / "k.json")
    back = load_result(tmp_path / "k.json")
    assert back.to_frame()["p_withheld"].tolist() == whole_pool.to_frame()["p_withheld"].tolist()
    assert [f.text for f in back.findings()] == [f.text for f in whole_pool.findings()]


def test_the_permutation_test_withholds_a_null_that_cannot_differ():
    values, layers = [0.9, 0.1, 0.2, 0.8, 0.1, 0.3], [0, 0, 0, 1, 1, 1]
    whole = clustered_permutation_test(values, layers, [True, True, True, False, False, False])
    assert math.isnan(whole.p_value) and whole.n_sets == 1 and "cannot differ" in whole.withheld
    # 9 assignments and 999 draws: counted exactly, not drawn with repeats
    few = clustered_permutation_test(
        values, layers, [True, False, False, True, False, False], n_perm=999
    )
    assert few.exact and few.n_sets == 9 and few.p_floor == pytest.approx(1 / 9)


# --------------------------------------------------------------------------- bootstrap resamples
@pytest.mark.parametrize(
    "ci",
    [
        lambda n: percentile_ci([1.0, 2.0, 3.0], n_boot=n),
        lambda n: bootstrap_ci([1.0, 2.0, 3.0], n_boot=n),
        lambda n: paired_bootstrap_ci([1.0, 2.0, 3.0], [0.5, 1.0, 2.5], n_boot=n),
    ],
    ids=["percentile_ci", "bootstrap_ci", "paired_bootstrap_ci"],
)
def test_a_ci_needs_enough_resamples(ci):
    with pytest.raises(InputError, match=r"n_boot must be an int >= 100 .* got 1: .*zero width"):
        ci(1)
    with pytest.raises(InputError, match="n_boot must be an int >= 100"):
        ci(MIN_BOOT - 1)
    assert ci(MIN_BOOT) is not None


def test_knockout_refuses_too_few_resamples_before_running(tiny):
    with pytest.raises(InputError, match="n_boot must be an int >= 100"):
        _knockout(tiny("llama"), [(0, 1)], n_boot=1)


def test_the_command_refuses_too_few_resamples(tiny_dir, capsys):
    from ropelens.cli.main import main

    assert main(["knockout", str(tiny_dir("llama")), "--heads", "0.1", "--boot", "1"]) == 2
    err = capsys.readouterr().err
    assert "--boot must be an int >= 100" in err and "n_boot" not in err


# -------------------------------------------------------------------------------------- doses
@pytest.mark.parametrize("doses", [[0.5], [0, 2.5]])
def test_a_fractional_dose_is_refused_in_python(tiny, doses):
    with pytest.raises(InputError, match=r"doses must be whole plane counts .* got (0\.5|2\.5)"):
        _knockout(tiny("llama"), [(0, 1)], doses=doses)


def test_a_fractional_dose_is_refused_by_the_command_with_the_same_words(tiny_dir, capsys):
    from ropelens.cli.main import main

    argv = ["knockout", str(tiny_dir("llama")), "--heads", "0.1", "--n-ctx", "24"]
    assert main([*argv, "--tokens", "48", "--doses", "0.5", "--metrics", "loss"]) == 2
    assert "--doses must be whole plane counts" in capsys.readouterr().err


def test_whole_doses_given_as_numbers_are_honoured(tiny):
    r = _knockout(tiny("llama"), [(0, 1)], doses=[2.0], n_random=0, n_control=0)
    assert sorted(set(r.to_frame()["dose"])) == [0, 2, 8]


# -------------------------------------------------------------------------------------- merges
def _usage(model, n_ctx, seed):
    tokens = torch.randint(4, 60, (2, n_ctx), generator=torch.Generator().manual_seed(seed))
    return frequency_usage(model, tokens, progress=False, verify=False)


def test_results_of_different_window_lengths_do_not_merge(tiny):
    model = tiny("llama")
    with pytest.raises(InputError, match=r"measured differently: n_ctx 32 vs 64"):
        _usage(model, 32, 0).merge(_usage(model, 64, 1))


def test_results_of_different_models_dtypes_or_variants_do_not_merge(tiny):
    from dataclasses import replace

    a, b = _usage(tiny("llama"), 32, 0), _usage(tiny("llama"), 32, 1)
    assert a.merge(b).provenance.n_windows == 4  # the same measurement merges
    for field, value, shown in (
        ("model", "other-model", "model"),
        ("dtype", "bfloat16", "dtype 'float32' vs 'bfloat16'"),
    ):
        other = replace(b, provenance=replace(b.provenance, **{field: value}))
        with pytest.raises(InputError, match=shown):
            a.merge(other)
    config = {**b.provenance.config, "interventions": [{"kind": "linear", "factor": 2.0}]}
    varied = replace(b, provenance=replace(b.provenance, config=config))
    with pytest.raises(InputError, match="variant"):
        a.merge(varied)
