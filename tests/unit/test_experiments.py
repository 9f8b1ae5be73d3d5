"""The experiment scripts' quick modes run end to end on tiny models, and resume."""

from __future__ import annotations

import json

import pytest


def test_inference_quick_runs_and_resumes(tiny, tmp_path, capsys, experiment):
    mod = experiment("truncated_rope_inference")
    path = mod.main(["--quick", "--lengths", "32", "--n-boot", "50", "--out", str(tmp_path)],
                    model=tiny("llama"))
    result = json.loads(path.read_text())
    assert len(result["table"]) == len(mod.VARIANTS)
    assert result["provenance"]["commit"] is not None or result["provenance"]["versions"]
    assert (tmp_path / "perplexity_vs_p.html").stat().st_size > 0
    capsys.readouterr()
    mod.main(["--quick", "--lengths", "32", "--n-boot", "50", "--out", str(tmp_path)],
             model=tiny("llama"))
    assert "ppl" not in capsys.readouterr().out.split("model ")[0]  # nothing re-run


def test_inference_quick_by_name_gemma_kinds(tmp_path, experiment):
    mod = experiment("truncated_rope_inference")
    path = mod.main(["--quick", "--model", "tiny-gemma3", "--lengths", "16", "--n-boot", "20",
                     "--layer-kind", "global", "--out", str(tmp_path)])
    kinds = {r["layer_kind"] for r in json.loads(path.read_text())["table"]}
    assert kinds == {"global"}


def test_band_ablation_quick(tiny, tmp_path, experiment):
    mod = experiment("band_ablation")
    path = mod.main(["--quick", "--n-ctx", "32", "--out", str(tmp_path)], model=tiny("llama"))
    table = json.loads(path.read_text())["table"]
    assert len(table) == 4 * (1 + 2)  # all layers + each of 2 layers, 4 bands
    assert (tmp_path / "band_ablation.html").exists()


def test_band_ablation_single_planes(tiny, tmp_path, experiment):
    """Each single-plane row: Δ loss of zeroing that plane everywhere, checked against the stored losses."""
    import torch

    from ropelens import rope_spec

    mod = experiment("band_ablation")
    model = tiny("llama")
    path = mod.main(["--quick", "--n-ctx", "32", "--no-per-layer", "--out", str(tmp_path)], model=model)
    result = json.loads(path.read_text())
    spec = rope_spec(model)
    assert [r["plane"] for r in result["planes"]] == list(range(spec[0].n_planes))
    assert [r["wavelength"] for r in result["planes"]] == spec[0].wavelength.tolist()
    runs = json.loads((tmp_path / "runs.json").read_text())["runs"].values()
    clean = next(r for r in runs if r["config"]["ablation"] == "none")["window_losses"]
    for row in result["planes"]:
        run = next(r for r in runs if r["config"].get("plane") == row["plane"])
        diff = torch.tensor(run["window_losses"]) - torch.tensor(clean)
        assert row["dloss"] == pytest.approx(diff.mean().item(), abs=1e-6)
        assert row["lo"] <= row["dloss"] <= row["hi"]
    assert (tmp_path / "plane_ablation.html").exists()
    assert len(result["table"]) == 4  # --no-per-layer: all layers only


def test_inference_identity_is_shared_across_layer_kinds(tmp_path, experiment):
    mod = experiment("truncated_rope_inference")
    path = mod.main(["--quick", "--model", "tiny-gemma3", "--lengths", "16", "--n-boot", "20",
                     "--layer-kind", "all", "--out", str(tmp_path)])
    rows = json.loads(path.read_text())["table"]
    ident = [r for r in rows if r["variant"] == "PRoPE" and r["p"] == 1.0]
    assert {r["layer_kind"] for r in ident} == {"global", "local", "both"}
    assert len({r["loss"] for r in ident}) == 1
    nope = {r["layer_kind"]: r["loss"] for r in rows if r["variant"] == "PRoPE" and r["p"] == 0.0}
    assert len(set(nope.values())) == 3  # truncating different layers really differs


def test_training_quick(tmp_path, experiment):
    mod = experiment("truncated_rope_training")
    path = mod.main(["--quick", "--seeds", "1", "--steps", "2", "--out", str(tmp_path)])
    result = json.loads(path.read_text())
    assert set(result["table"]) == set(mod.PAPER)
    assert "ordering" in result["verdict"]
    assert (tmp_path / "table.txt").read_text().count("\n") >= 9
    runs = len(json.loads((tmp_path / "runs.json").read_text())["runs"])
    mod.main(["--quick", "--seeds", "1", "--steps", "2", "--out", str(tmp_path)])
    assert len(json.loads((tmp_path / "runs.json").read_text())["runs"]) == runs == 7


def test_summarize_writes_markdown_tables(tiny, tmp_path, experiment):
    results = tmp_path / "results"
    experiment("truncated_rope_inference").main(
        ["--quick", "--lengths", "32", "--n-boot", "20", "--out", str(results / "truncated_rope_inference")],
        model=tiny("llama"))
    experiment("band_ablation").main(["--quick", "--n-ctx", "32", "--no-per-layer", "--out",
                                   str(results / "band_ablation")], model=tiny("llama"))
    out = tmp_path / "results.md"
    text = experiment("summarize").main(["--results", str(results), "--out", str(out)])
    assert out.read_text() == text
    assert "## p-RoPE at inference" in text and "## Band and plane ablation" in text
    assert "## From-scratch training" not in text  # not run, not invented
    rows = json.loads((results / "truncated_rope_inference" / "result.json").read_text())["table"]
    nope = next(r for r in rows if r["variant"] == "PRoPE" and r["p"] == 0.0)
    assert f"| p = 0 | {nope['ppl']:.4g} [" in text


def test_context_extension_micro_runs_and_resumes(tmp_path, experiment):
    mod = experiment("context_extension")
    argv = ["--quick", "--train-steps", "5", "--multiples", "1", "2", "--n-windows", "2", "--search-population", "3",
            "--search-generations", "1", "--search-windows", "2", "--finetune-steps", "0", "--smollm", "none",
            "--n-boot", "20", "--out", str(tmp_path)]
    result = json.loads(mod.main(argv).read_text())
    rows = result["table"]
    l0 = result["train_config"]["seq_len"]
    assert {r["n_ctx"] for r in rows} == {l0, 2 * l0}
    assert {r["method"] for r in rows if r["n_ctx"] == 2 * l0} == set(mod.METHODS)
    at_l0 = {r["method"]: r["ppl"] for r in rows if r["n_ctx"] == l0}
    assert at_l0["PI"] == at_l0["none"]  # factor 1 at the training length is no change
    (search,) = result["searches"]
    assert search["target_len"] == 2 * l0 and search["gain_vs_PI"] == pytest.approx(1 - search["longrope"] / search["PI"])
    assert search["longrope"] <= search["initial_best"]
    runs = json.loads((tmp_path / "runs.json").read_text())["runs"]
    mod.main(argv)
    assert json.loads((tmp_path / "runs.json").read_text())["runs"] == runs  # nothing re-run
