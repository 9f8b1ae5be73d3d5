"""The experiment scripts' quick modes run end to end on tiny models, and resume."""

from __future__ import annotations

import importlib.metadata as md
import json
import platform
import re
import subprocess
from pathlib import Path

import pytest
import torch


def english_val_windows(n_ctx, n_windows):
    """The held-out windows the scripts evaluate on, cut with the tiny models' tokenizer."""
    from ropelens.run import data
    from ropelens.testing import tiny_tokenizer

    _, val = data.english().split()
    return data.windows(val, tiny_tokenizer(), n_ctx, n_windows=n_windows)


def hand_window_losses(hf, tokens):
    """Mean next-token NLL per window from an HF model's logits (logsumexp − logit of the next
    token)."""
    with torch.no_grad():
        logits = hf(input_ids=tokens).logits[:, :-1].double()
    nll = torch.logsumexp(logits, -1) - logits.gather(-1, tokens[:, 1:, None])[..., 0]
    return nll.mean(-1)


def assert_provenance_is_real(prov):
    """Versions are the installed ones; the commit is HEAD of the checkout ropelens is imported
    from (or an ancestor of it, should another commit land while the test runs), or None when
    ropelens is not imported from a git checkout."""
    import ropelens

    for pkg in ("torch", "transformers", "numpy"):
        assert prov["versions"][pkg] == md.version(pkg), pkg
    assert prov["versions"]["python"] == platform.python_version()
    here = Path(ropelens.__file__).resolve().parent

    def git(*a):
        return subprocess.run(["git", *a], cwd=here, capture_output=True, text=True)

    if git("rev-parse", "--is-inside-work-tree").returncode != 0:
        assert prov["commit"] is None
        return
    m = re.fullmatch(r"([0-9a-f]{40})(\+dirty)?", prov["commit"] or "")
    assert m, prov["commit"]
    head = git("rev-parse", "HEAD").stdout.strip()
    assert m[1] == head or git("merge-base", "--is-ancestor", m[1], head).returncode == 0, (
        m[1],
        head,
    )


def test_inference_quick_runs_and_resumes(tiny, tmp_path, capsys, experiment):
    mod = experiment("truncated_rope_inference")
    path = mod.main(
        ["--quick", "--lengths", "32", "--n-boot", "100", "--out", str(tmp_path)],
        model=tiny("llama"),
    )
    result = json.loads(path.read_text())
    assert len(result["table"]) == len(mod.VARIANTS)
    assert_provenance_is_real(result["provenance"])
    # p = 1 keeps every plane: its loss is the clean model's, recomputed here from the HF logits
    from ropelens.testing import tiny_hf_model

    clean = hand_window_losses(tiny_hf_model("llama"), english_val_windows(32, 4)).mean().item()
    ident = [r for r in result["table"] if r["variant"] == "PRoPE" and r["p"] == 1.0]
    assert len(ident) == 1 and ident[0]["loss"] == pytest.approx(clean, abs=1e-5)
    assert ident[0]["ppl"] == pytest.approx(torch.tensor(clean).exp().item(), rel=1e-5)
    assert (tmp_path / "perplexity_vs_p.html").stat().st_size > 0
    capsys.readouterr()
    mod.main(
        ["--quick", "--lengths", "32", "--n-boot", "100", "--out", str(tmp_path)],
        model=tiny("llama"),
    )
    assert "ppl" not in capsys.readouterr().out.split("model ")[0]  # nothing re-run


def test_inference_quick_by_name_gemma_kinds(tmp_path, experiment):
    mod = experiment("truncated_rope_inference")
    path = mod.main(
        [
            "--quick",
            "--model",
            "tiny-gemma3",
            "--lengths",
            "16",
            "--n-boot",
            "100",
            "--layer-kind",
            "global",
            "--out",
            str(tmp_path),
        ]
    )
    kinds = {r["layer_kind"] for r in json.loads(path.read_text())["table"]}
    assert kinds == {"global"}


def sharp_llama(dest, gain=10.0, out_gain=4.0):
    """The tiny Llama with q_proj and k_proj scaled by ``gain`` (logits × gain²: attention far
    from uniform) and v_proj, o_proj by ``out_gain`` (attention moves the residual more), so
    zeroing planes moves the loss by far more than float noise."""
    from ropelens.testing import tiny_hf_model, tiny_tokenizer

    hf = tiny_hf_model("llama")
    with torch.no_grad():
        for layer in hf.model.layers:
            layer.self_attn.q_proj.weight.mul_(gain)
            layer.self_attn.k_proj.weight.mul_(gain)
            layer.self_attn.v_proj.weight.mul_(out_gain)
            layer.self_attn.o_proj.weight.mul_(out_gain)
    hf.save_pretrained(dest)
    tiny_tokenizer().save_pretrained(dest)
    return hf


def zeroed_planes(hf, planes, layers, head_dim=16, n_heads=4):
    """A copy of ``hf`` with the q_proj rows of ``planes`` zeroed in ``layers``: HF's rotate_half
    pairs dims (i, i + head_dim/2), so this removes exactly those planes' logit terms."""
    import copy

    out = copy.deepcopy(hf)
    with torch.no_grad():
        for L in layers:
            w = out.model.layers[L].self_attn.q_proj.weight
            for h in range(n_heads):
                for i in planes:
                    w[h * head_dim + i] = 0
                    w[h * head_dim + i + head_dim // 2] = 0
    return out


def test_band_ablation_quick(tmp_path, experiment):
    """Every reported loss is recomputed here by zeroing the band's q_proj rows in a copy of the
    HF model (no ropelens hooks) and taking the cross-entropy by hand."""
    import ropelens

    hf = sharp_llama(tmp_path / "model")
    mod = experiment("band_ablation")
    out = tmp_path / "out"
    path = mod.main(
        ["--quick", "--n-ctx", "32", "--out", str(out)],
        model=ropelens.load_model(tmp_path / "model", device="cpu"),
    )
    table = json.loads(path.read_text())["table"]
    assert len(table) == 4 * (1 + 2)  # all layers + each of 2 layers, 4 bands
    assert (out / "band_ablation.html").exists()
    runs = list(json.loads((out / "runs.json").read_text())["runs"].values())
    toks = english_val_windows(32, 4)
    clean = hand_window_losses(hf, toks)
    (clean_run,) = [r for r in runs if r["config"]["ablation"] == "none"]
    torch.testing.assert_close(
        torch.tensor(clean_run["window_losses"], dtype=torch.float64), clean, rtol=0, atol=2e-5
    )
    by_cfg = {(r["layers"], r["band"]): r for r in table}
    for (scope, band), row in by_cfg.items():
        layers = [0, 1] if scope == "all" else [int(scope)]
        assert row["planes"] == [2 * band, 2 * band + 1]  # quartiles of 8 planes, highest first
        if scope != "all" and band not in (0, 3):
            continue  # the all-layers rows and the outer bands per layer are enough
        ablated = hand_window_losses(zeroed_planes(hf, row["planes"], layers), toks)
        (run,) = [
            r for r in runs if r["config"].get("band") == band and r["config"]["layers"] == scope
        ]
        torch.testing.assert_close(
            torch.tensor(run["window_losses"], dtype=torch.float64), ablated, rtol=0, atol=2e-5
        )
        assert row["dloss"] == pytest.approx((ablated - clean).mean().item(), abs=3e-5)
        assert row["lo"] <= row["dloss"] <= row["hi"]
    # ablating a band visibly matters (measured all-layer Δloss −0.0035, 0.0090, 0.0118, −0.0239)
    assert max(abs(r["dloss"]) for r in table if r["layers"] == "all") > 0.01
    plane_run = next(
        r for r in runs if r["config"]["ablation"] == "plane" and r["config"]["plane"] == 0
    )
    torch.testing.assert_close(
        torch.tensor(plane_run["window_losses"], dtype=torch.float64),
        hand_window_losses(zeroed_planes(hf, [0], [0, 1]), toks),
        rtol=0,
        atol=2e-5,
    )


def test_band_ablation_single_planes(tiny, tmp_path, experiment):
    """Each single-plane row: Δ loss of zeroing that plane everywhere, checked against the stored
    losses."""
    import torch

    from ropelens import rope_spec

    mod = experiment("band_ablation")
    model = tiny("llama")
    path = mod.main(
        ["--quick", "--n-ctx", "32", "--no-per-layer", "--out", str(tmp_path)], model=model
    )
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
    path = mod.main(
        [
            "--quick",
            "--model",
            "tiny-gemma3",
            "--lengths",
            "16",
            "--n-boot",
            "100",
            "--layer-kind",
            "all",
            "--out",
            str(tmp_path),
        ]
    )
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
        [
            "--quick",
            "--lengths",
            "32",
            "--n-boot",
            "100",
            "--out",
            str(results / "truncated_rope_inference"),
        ],
        model=tiny("llama"),
    )
    experiment("band_ablation").main(
        ["--quick", "--n-ctx", "32", "--no-per-layer", "--out", str(results / "band_ablation")],
        model=tiny("llama"),
    )
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
    argv = [
        "--quick",
        "--train-steps",
        "5",
        "--multiples",
        "1",
        "2",
        "--n-windows",
        "2",
        "--search-population",
        "3",
        "--search-generations",
        "1",
        "--search-windows",
        "2",
        "--finetune-steps",
        "0",
        "--smollm",
        "none",
        "--n-boot",
        "100",
        "--out",
        str(tmp_path),
    ]
    result = json.loads(mod.main(argv).read_text())
    rows = result["table"]
    l0 = result["train_config"]["seq_len"]
    assert {r["n_ctx"] for r in rows} == {l0, 2 * l0}
    assert {r["method"] for r in rows if r["n_ctx"] == 2 * l0} == set(mod.METHODS)
    at_l0 = {r["method"]: r["ppl"] for r in rows if r["n_ctx"] == l0}
    assert at_l0["PI"] == at_l0["none"]  # factor 1 at the training length is no change
    (search,) = result["searches"]
    assert search["target_len"] == 2 * l0 and search["gain_vs_PI"] == pytest.approx(
        1 - search["longrope"] / search["PI"]
    )
    assert search["longrope"] <= search["initial_best"]
    runs = json.loads((tmp_path / "runs.json").read_text())["runs"]
    mod.main(argv)
    assert json.loads((tmp_path / "runs.json").read_text())["runs"] == runs  # nothing re-run
