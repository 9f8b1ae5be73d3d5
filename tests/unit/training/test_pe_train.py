"""Learned-PE training (micro config, character tokenizer) and the pe_geometry experiment's quick
mode."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch

from ropelens.training.pe_train import (
    PETrainConfig,
    PETrainResult,
    order_permutation,
    reorder,
    train_pe_model,
)

MICRO = PETrainConfig(
    n_positions=32,
    d_model=16,
    n_layers=1,
    n_heads=2,
    batch_size=4,
    steps=25,
    lr=1e-2,
    warmup=2,
    tokenizer="tiny-char",
    val_windows=2,
)


@pytest.fixture(scope="module")
def forward_run() -> PETrainResult:
    return train_pe_model("forward", MICRO)


def test_training_lowers_loss(forward_run):
    curve = forward_run.loss_curve
    assert len(curve) == MICRO.steps
    assert sum(curve[-5:]) / 5 < sum(curve[:5]) / 5 - 0.3
    init = train_pe_model("init", MICRO)
    assert forward_run.val_loss < init.val_loss
    assert init.loss_curve == () and init.provenance.n_tokens == 0


def test_same_seed_reproduces_exactly(forward_run):
    again = train_pe_model("forward", MICRO)
    assert again.loss_curve == forward_run.loss_curve
    assert torch.equal(again.pe, forward_run.pe)
    other = train_pe_model("forward", dataclasses.replace(MICRO, seed=1, steps=2))
    assert not torch.equal(other.pe, forward_run.pe)


def test_orders_reorder_tokens():
    tokens = torch.arange(3 * 10).reshape(3, 10)
    assert torch.equal(reorder(tokens, "forward"), tokens)
    assert torch.equal(reorder(tokens, "init"), tokens)
    back = reorder(tokens, "backward")
    assert torch.equal(back[:, 0], tokens[:, 0])  # BOS stays first
    assert torch.equal(back[:, 1:], tokens[:, 1:].flip(1))
    perm = reorder(tokens, "permuted", seed=3)
    assert torch.equal(perm[:, 0], tokens[:, 0])
    assert not torch.equal(perm, tokens)
    assert torch.equal(perm.sort(dim=1).values, tokens)  # same tokens in every row
    assert torch.equal(
        perm - perm[:, :1], (perm[:1] - perm[0, 0]).expand_as(perm)
    )  # one permutation for all
    assert torch.equal(reorder(tokens, "permuted", seed=3), perm)
    assert not torch.equal(
        order_permutation(10, "permuted", 4), order_permutation(10, "permuted", 3)
    )


def test_bad_order_and_config_errors():
    with pytest.raises(
        ValueError, match="one of forward, backward, permuted, init, got .sideways."
    ):
        train_pe_model("sideways", MICRO)
    with pytest.raises(ValueError, match="sideways"):
        reorder(torch.zeros(2, 4, dtype=torch.long), "sideways")
    with pytest.raises(ValueError, match="d_model 30 must be divisible by n_heads 4"):
        PETrainConfig(d_model=30, n_heads=4)
    with pytest.raises(ValueError, match="steps must be a positive int, got 0"):
        PETrainConfig(steps=0)
    with pytest.raises(TypeError, match="PETrainConfig"):
        train_pe_model("forward", {"steps": 3})


def test_save_load_round_trip(forward_run, tmp_path):
    forward_run.save(tmp_path / "r.json")
    back = PETrainResult.load(tmp_path / "r.json")
    assert torch.equal(back.pe, forward_run.pe) and back.config == forward_run.config
    assert back.loss_curve == forward_run.loss_curve and back.order == "forward"
    assert forward_run.pe.shape == (MICRO.n_positions, MICRO.d_model)
    with pytest.raises(ValueError, match="shape"):
        dataclasses.replace(forward_run, pe=torch.zeros(3, 3))


def test_scaled_config():
    big = PETrainConfig().scaled(2)
    assert (big.n_heads, big.d_model, big.n_positions) == (8, 128, 512)


def test_pe_geometry_quick_runs_and_resumes(tmp_path, capsys, experiment):
    mod = experiment("pe_geometry")
    argv = [
        "--quick",
        "--steps",
        "3",
        "--tokenizer",
        "tiny-char",
        "--decay-model",
        "tiny-llama",
        "--decay-ctx",
        "16",
        "--out",
        str(tmp_path),
    ]
    result = json.loads(mod.main(argv).read_text())
    assert set(result["learned_pe"]) == {"forward", "backward", "permuted", "init", "sinusoidal"}
    assert "period_strength" in result["learned_pe"]["permuted"]
    counts = result["rope_decay"]["counts"]
    assert sum(counts["total"].values()) == 2 * 4  # tiny-llama: 2 layers × 4 heads
    assert result["rope_decay"]["theory_verdicts"]["constant q = k = 1 (÷ value at 0)"] == "decays"
    for page in ("pe_heatmaps.html", "pe_by_distance.html", "rope_theory.html", "rope_heads.html"):
        assert (tmp_path / page).stat().st_size > 0
    runs = json.loads((tmp_path / "runs.json").read_text())["runs"]
    capsys.readouterr()
    mod.main(argv)
    assert "train loss" not in capsys.readouterr().out  # nothing retrained
    assert json.loads((tmp_path / "runs.json").read_text())["runs"] == runs


def test_cli_pe_geometry(tiny_dir, capsys):
    from ropelens.cli import main

    assert main(["pe-geometry", "--json", "--n-pos", "64", "--d", "16"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert rows[0]["name"] == "sinusoidal 64x16" and 0 <= rows[0]["period_strength"] <= 1
    assert (
        main(
            [
                "pe-geometry",
                "--json",
                "--n-pos",
                "64",
                "--d",
                "16",
                "--model",
                str(tiny_dir("gpt2")),
                "--device",
                "cpu",
            ]
        )
        == 0
    )
    rows = json.loads(capsys.readouterr().out)
    assert len(rows) == 2 and rows[1]["n_pos"] > 1
    assert main(["pe-geometry", "--model", str(tiny_dir("llama")), "--device", "cpu"]) == 2
    assert "rotary" in capsys.readouterr().err
    assert main(["pe-geometry", "--d", "7"]) == 2
    assert "even" in capsys.readouterr().err
