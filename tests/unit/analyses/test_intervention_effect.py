"""``intervention_effect`` against the analyses it combines, run by hand with and without the
intervention, and ``ropelens intervention-effect`` / ``--variant`` on the command line."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch

import ropelens
from ropelens.analyses import (
    InterventionEffect,
    band_statistics,
    frequency_usage,
    head_taxonomy,
    intervention_effect,
)
from ropelens.cli import main
from ropelens.errors import InputError
from ropelens.run.intervene import ablate_planes, apply_rope_variant
from ropelens.spec.bands import Bands
from ropelens.spec.variants import PRoPE
from ropelens.testing.families import VOCAB


@pytest.fixture(scope="module")
def model_and_tokens(family_dir):
    model = ropelens.load_model(family_dir("llama"), device="cpu")
    toks = torch.randint(4, VOCAB, (4, 32), generator=torch.Generator().manual_seed(2))
    toks[:, 0] = 1
    return model, toks


@pytest.fixture(scope="module")
def effect(model_and_tokens):
    model, toks = model_and_tokens
    return intervention_effect(model, PRoPE(0.25), toks)


def test_each_condition_is_the_analysis_run_by_hand(model_and_tokens, effect):
    model, toks = model_and_tokens
    bands = Bands.quantiles(4)
    by_hand = []
    for under in (False, True):
        with apply_rope_variant(model, PRoPE(0.25)) if under else _nothing():
            usage = frequency_usage(model, toks, source="post")  # what the attention scores
            stats = band_statistics(model, toks, bands=bands)
            heads = head_taxonomy(model, toks, n_ctx=32, n_windows=4, bands=bands)
        by_hand.append((usage, stats, heads))
    for c, (usage, stats, heads) in enumerate(by_hand):
        energy = usage.band_share(bands, "q", "no_sink")[1].nanmean(1)
        torch.testing.assert_close(effect.energy[c], energy.double(), atol=1e-12, rtol=0)
        torch.testing.assert_close(
            effect.logit_share[c], stats.abs_share().nanmean(1).double(), atol=1e-12, rtol=0
        )
        assert effect.head_kinds[c] == heads.with_tau(by_hand[0][2].tau).kinds()
    # the first layer's queries enter RoPE unchanged, and a rotation keeps every plane's norm: its
    # energy cannot change (up to the float32 rounding of rotating them)
    torch.testing.assert_close(
        effect.change("energy")[0], torch.zeros(4, dtype=torch.float64), atol=1e-6, rtol=0
    )
    assert effect.change("logit_share").abs().max() > 1e-4  # the variant did something
    assert effect.interventions[0]["name"] == "PRoPE(p=0.25)"
    assert effect.provenance.interventions == effect.interventions


class _nothing:
    def __enter__(self):
        return None

    def __exit__(self, *exc):
        return False


def test_round_trip_frame_findings_and_figure(effect, tmp_path):
    effect.save(tmp_path / "effect.json")
    back = InterventionEffect.load(tmp_path / "effect.json")
    assert torch.equal(back.energy, effect.energy) and back.head_kinds == effect.head_kinds
    frame = effect.to_frame()
    assert len(frame) == len(effect.layers) * 4
    row = frame[(frame.layer == 2) & (frame.band == effect.band_names[1])].iloc[0]
    assert row.energy_change == pytest.approx(float(effect.change("energy")[2, 1]))
    texts = [f.text for f in effect.findings()]
    assert texts[0].startswith("Under PRoPE(p=0.25) in layers 0-3, the largest change of query")
    n_heads = sum(len(k) for k in effect.head_kinds[0])
    changed = len(effect.head_changes())
    assert texts[-1].startswith(f"Under PRoPE(p=0.25) in layers 0-3, {changed} of {n_heads} heads")
    fig = effect.figure()
    energy, share = fig.data[0], fig.data[1]
    assert list(energy.x) == effect.band_names and list(share.x) == effect.band_names
    assert list(energy.y) == [str(L) for L in effect.layers]
    assert energy.z.tolist() == effect.change("energy").tolist()
    assert share.z.tolist() == effect.change("logit_share").tolist()
    bars = [t for t in fig.data if t.type == "bar"]
    total = sum(int(sum(t.x)) for t in bars)
    assert total == 2 * sum(len(k) for k in effect.head_kinds[0])  # every head, both conditions


def test_an_ablation_and_bad_interventions(model_and_tokens):
    model, toks = model_and_tokens
    effect = intervention_effect(model, lambda m: ablate_planes(m, [0, 1], layers=[1]), toks)
    assert effect.interventions[0]["intervention"] == "plane ablation"
    change = effect.change("logit_share")
    assert torch.equal(change[0], torch.zeros_like(change[0]))  # layer 0 untouched
    assert float(change[1, 0]) < -0.05  # the zeroed planes' band loses its share in layer 1
    with pytest.raises(InputError, match="put nothing in force"):
        intervention_effect(model, lambda m: _nothing(), toks)
    with pytest.raises(InputError, match="must be a RoPE variant"):
        intervention_effect(model, "prope:0.5", toks)


def test_cli_intervention_effect_and_variant_flag(family_dir, tmp_path, capsys):
    path = str(family_dir("llama"))
    corpus = tmp_path / "docs.jsonl"
    text = "The river rose slowly over the stone bridge while the town slept. " * 8
    corpus.write_text("\n".join(json.dumps({"content": text}) for _ in range(6)))
    common = [
        "--corpus",
        str(corpus),
        "--text-column",
        "content",
        "--n-ctx",
        "32",
        "--tokens",
        "96",
    ]
    html = tmp_path / "effect.html"
    args = ["intervention-effect", path, "--variant", "prope:0.5", *common, "--json"]
    assert main([*args, "--figure", str(html), "--quiet"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["interventions"][0]["name"] == "PRoPE(p=0.5)"
    assert len(out["bands"]) == 4 * 4 and html.read_text().count("plotly") > 10

    saved = tmp_path / "usage.json"
    args = ["frequency-usage", path, *common, "--variant", "prope:0.5", "--variant-layers", "1"]
    assert main([*args, "--save", str(saved), "--quiet"]) == 0
    err = capsys.readouterr().err
    assert "runs under PRoPE(p=0.5) in layers 1" in err
    usage = ropelens.load_result(saved)
    assert usage.provenance.interventions[0]["layers"] == [1]
    assert usage.spec[1].stopped_planes.tolist() == [4, 5, 6, 7]
    assert usage.spec[0].stopped_planes.tolist() == []

    assert main(["rope-spec", path, "--variant-layers", "1"]) == 2
    assert "--variant-layers needs --variant" in capsys.readouterr().err
    assert main(["intervention-effect", path, *common]) == 2
    assert "name one intervention" in capsys.readouterr().err


def test_head_counts_group_the_positional_kinds(effect):
    kinds = [["previous-token", "offset-3", "sink", "content"]] + [
        ["diagonal", "content", "content", "sink"]
    ] * (len(effect.layers) - 1)
    made_up = dataclasses.replace(effect, head_kinds=[kinds, kinds])
    counts = made_up.head_counts()
    first = counts[(counts.layer == 0) & (counts.condition == "without")]
    assert dict(zip(first.kind, first.heads, strict=True)) == {
        "positional": 2,
        "sink": 1,
        "content": 1,
    }
    bars = [t for t in made_up.figure().data if t.type == "bar"]
    assert sum(int(sum(t.x)) for t in bars) == 2 * 4 * len(effect.layers)


def test_heads_that_change_kind_are_named_in_the_finding(effect):
    without = [["previous-token", "content", "sink", "content"]] * len(effect.layers)
    with_ = [["content", "content", "sink", "diagonal"]] + without[1:]
    made_up = dataclasses.replace(effect, head_kinds=[without, with_])
    text = made_up.findings()[-1].text
    n_heads = 4 * len(effect.layers)
    assert text.startswith(
        f"Under {effect.under}, 2 of {n_heads} heads change kind: "
        "L0.H0 previous-token → content, L0.H3 content → diagonal"
    )
