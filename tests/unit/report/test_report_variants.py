"""The report's p-RoPE sweep and context-extension sections, checked against the HF model run
directly with the variant's frequencies (or HF's own rope scaling), independently of ropelens'
variant hooks."""

from __future__ import annotations

import copy
import json
import math

import pandas as pd
import pytest
import torch
import torch.nn.functional as F
from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

from ropelens import rope_spec
from ropelens.analyses.extension_planes import extension_planes
from ropelens.report import build_report
from ropelens.run import data
from ropelens.spec.variants import Linear, PRoPE, PRoPEReversed

N_CTX = 64
TOKENS = 6 * N_CTX


@pytest.fixture(scope="module")
def llama(tiny):
    return tiny("llama")


@pytest.fixture(scope="module")
def out(llama, tmp_path_factory):
    return build_report(
        llama,
        corpus="english",
        tokens=TOKENS,
        n_ctx=N_CTX,
        out=tmp_path_factory.mktemp("rep") / "out",
        progress=False,
    )


@pytest.fixture(scope="module")
def windows(llama):
    """The windows both sections score: the report's first four (at most 256 tokens each)."""
    return data.windows(data.load_corpus("english"), llama.tokenizer, N_CTX, max_tokens=TOKENS)[:4]


def hf_losses(hf, tokens) -> torch.Tensor:
    with torch.no_grad():
        logits = hf(input_ids=tokens).logits
    return F.cross_entropy(logits[:, :-1].transpose(1, 2), tokens[:, 1:], reduction="none").mean(-1)


def with_inv_freq(llama, inv: torch.Tensor):
    hf = copy.deepcopy(llama.original_model)
    rotary = hf.model.rotary_emb
    rotary.inv_freq.copy_(inv)
    rotary.original_inv_freq.copy_(inv)
    return hf


@pytest.mark.parametrize(
    ("variant", "row"),
    [
        (PRoPE(0.0), "p-RoPE p = 0"),
        (PRoPE(0.5), "p-RoPE p = 0.5"),
        (PRoPEReversed(0.75), "reversed p = 0.75 (lowest kept)"),
    ],
)
def test_prope_rows_match_hf_with_those_frequencies(out, llama, windows, variant, row):
    frame = pd.read_csv(out / "prope_sweep.csv").set_index("variant")
    layer = rope_spec(llama)[0]
    base = hf_losses(llama.original_model, windows)
    losses = hf_losses(with_inv_freq(llama, variant.inv_freq(layer)), windows)
    assert frame.loc[row, "ppl"] == pytest.approx(math.exp(losses.mean().item()), rel=1e-4)
    assert frame.loc[row, "Δ loss"] == pytest.approx((losses - base).mean().item(), abs=1e-4)
    assert frame.loc[row, "Δ lo"] <= frame.loc[row, "Δ loss"] <= frame.loc[row, "Δ hi"]
    assert frame.loc[row, "planes rotating"] == int((variant.inv_freq(layer) > 0).sum())


def test_prope_baseline_is_the_unmodified_model(out, llama, windows):
    frame = pd.read_csv(out / "prope_sweep.csv").set_index("variant")
    base = hf_losses(llama.original_model, windows)
    assert frame.loc["RoPE (p = 1)", "ppl"] == pytest.approx(math.exp(base.mean().item()), rel=1e-5)


def test_context_pi_cost_matches_hf_linear_scaling(out, llama, windows):
    """PI's row against HF's own ``linear`` rope scaling, loaded into a fresh model with the same
    weights."""
    frame = pd.read_csv(out / "extension_planes.csv").set_index("method")
    cfg = copy.deepcopy(llama.original_model.config)
    cfg.rope_parameters = {**cfg.rope_parameters, "rope_type": "linear", "factor": 4.0}
    hf = copy.deepcopy(llama.original_model)
    hf.model.rotary_emb = LlamaRotaryEmbedding(config=cfg)  # HF's own "linear" init
    assert torch.allclose(hf.model.rotary_emb.inv_freq, rope_spec(llama)[0].inv_freq / 4)
    base = hf_losses(llama.original_model, windows)
    losses = hf_losses(hf, windows)
    assert not torch.allclose(losses, base)  # the scaling really changed something
    assert frame.loc["PI", "Δ loss"] == pytest.approx((losses - base).mean().item(), abs=1e-4)


def test_context_plane_counts_and_finding(out, llama):
    frame = pd.read_csv(out / "extension_planes.csv").set_index("method")
    report = json.loads((out / "report.json").read_text())
    layer = rope_spec(llama)[0]
    l0 = rope_spec(llama).n_ctx
    counts = extension_planes(layer, Linear(4.0), l0, 4 * l0).counts()
    assert frame.loc["PI", "interpolated"] == counts["interpolated"] == layer.n_planes
    none = frame.loc["none (RoPE as trained)"]
    assert none["extrapolated"] == int((layer.wavelength > l0).sum())
    assert none["Δ loss"] == 0.0
    finding = next(f for f in report["findings"] if f["key"] == "context")
    assert finding["values"]["beyond_native"] == none["extrapolated"]
    assert finding["values"]["delta_pi"] == pytest.approx(frame.loc["PI", "Δ loss"], abs=1e-9)
    section = next(s for s in report["sections"] if s["key"] == "extension-planes")
    bounds = section["numbers"]["bounds"]
    assert (
        bounds["bound_native"] <= bounds["bound_extended"]
    )  # a longer context needs a larger base


def test_sections_time_themselves(out):
    steps = json.loads((out / "report.json").read_text())["provenance"]["steps_seconds"]
    assert {"prope_sweep", "extension_planes", "variants_baseline"} <= set(steps)


# -------------------------------------------------------------------------------------- experiments


def test_report_shows_the_experiment_results(llama, tmp_path, experiment):
    results = tmp_path / "results"
    inf = experiment("truncated_rope_inference")
    inf.main(
        [
            "--quick",
            "--lengths",
            "32",
            "48",
            "--n-boot",
            "100",
            "--out",
            str(results / "truncated_rope_inference"),
        ],
        model=llama,
    )
    experiment("band_ablation").main(
        ["--quick", "--n-ctx", "32", "--no-per-layer", "--out", str(results / "band_ablation")],
        model=llama,
    )
    experiment("truncated_rope_training").main(
        [
            "--quick",
            "--seeds",
            "1",
            "--steps",
            "2",
            "--out",
            str(results / "truncated_rope_training"),
        ]
    )
    out = build_report(
        llama,
        corpus="english",
        tokens=TOKENS,
        n_ctx=N_CTX,
        out=tmp_path / "rep",
        progress=False,
        experiments=results,
    )
    table = pd.read_csv(out / "exp_prope_inference.csv")
    assert len(table) == 2 * len(inf.VARIANTS) and set(table.n_ctx) == {32, 48}
    stored = json.loads((results / "truncated_rope_inference" / "result.json").read_text())["table"]
    assert sorted(table.ppl) == pytest.approx(sorted(r["ppl"] for r in stored))
    assert len(pd.read_csv(out / "exp_prope_training.csv")) == 7
    assert len(pd.read_csv(out / "exp_band_ablation.csv")) == 4
    page = (out / "index.html").read_text()
    assert (
        "Full inference sweep" in page
        and "From-scratch training" in page
        and "Zeroing one plane" in page
    )
    assert "python experiments/context_extension.py" in page  # the one experiment not run is named
    report = json.loads((out / "report.json").read_text())
    assert report["provenance"]["config"]["experiments"] == str(results)


def test_report_context_experiment_table(llama, tmp_path):
    rows = [
        {
            "model": "m",
            "stage": s,
            "method": m,
            "n_ctx": n,
            "ppl": p,
            "ppl_lo": p - 1,
            "ppl_hi": p + 1,
            "n_windows": 4,
        }
        for s, m, n, p in [
            ("zero-shot", "none", 64, 10.0),
            ("zero-shot", "PI", 64, 11.0),
            ("zero-shot", "none", 128, 30.0),
            ("zero-shot", "PI", 128, 12.0),
            ("finetuned", "PI", 128, 9.0),
        ]
    ]
    (tmp_path / "context_extension").mkdir()
    (tmp_path / "context_extension" / "result.json").write_text(json.dumps({"table": rows}))
    out = build_report(
        llama,
        corpus="english",
        tokens=TOKENS,
        n_ctx=N_CTX,
        out=tmp_path / "rep",
        progress=False,
        experiments=tmp_path,
    )
    assert len(pd.read_csv(out / "exp_context_extension.csv")) == 5
    page = (out / "index.html").read_text()
    assert "30 [29, 31]" in page and "9 [8, 10]" in page
    assert "python experiments/truncated_rope_inference.py" in page


def test_report_experiments_folder_must_exist(tmp_path):
    with pytest.raises(NotADirectoryError, match="experiments"):
        build_report("no-such-model", out=tmp_path / "rep", experiments=tmp_path / "missing")


def test_a_full_run_is_shown_over_a_quick_one():
    from ropelens.report.experiments import main_result

    quick = {
        "path": "a",
        "provenance": {"config": {"quick": True}, "created": "2026-11-22T09:00:00"},
    }
    old = {
        "path": "b",
        "provenance": {"config": {"quick": False}, "created": "2026-11-20T09:00:00"},
    }
    new = {"path": "c", "provenance": {"config": {}, "created": "2026-11-21T09:00:00"}}
    assert main_result([quick, old, new])["path"] == "c"
    assert main_result([quick])["path"] == "a"


def test_context_rescales_only_the_global_layers_of_a_two_kind_model(tiny, tmp_path):
    """Gemma-style models: the context section's costs come from the global (full) layers alone."""
    from ropelens.run.evaluate import window_losses
    from ropelens.run.intervene import apply_rope_variant

    gemma = tiny("gemma3")
    out = build_report(
        gemma, corpus="english", tokens=TOKENS, n_ctx=N_CTX, out=tmp_path / "rep", progress=False
    )
    frame = pd.read_csv(out / "extension_planes.csv").set_index("method")
    toks = data.windows(data.load_corpus("english"), gemma.tokenizer, N_CTX, max_tokens=TOKENS)[:4]
    base = window_losses(gemma, toks, progress=False)
    with apply_rope_variant(gemma, Linear(4.0), layer_kind="full"):
        pi = window_losses(gemma, toks, progress=False)
    assert frame.loc["PI", "Δ loss"] == pytest.approx((pi - base).mean().item(), abs=1e-5)
    report = json.loads((out / "report.json").read_text())
    assert (
        next(f for f in report["findings"] if f["key"] == "context")["values"]["rescaled_kind"]
        == "full"
    )
