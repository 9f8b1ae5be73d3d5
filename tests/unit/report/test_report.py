"""The HTML report on tiny models: self-contained page, every section, findings that match the
numbers, tidy CSVs, atomic writes, the section registry, and the report/usage/decompose commands."""

from __future__ import annotations

import html
import json
import re
from dataclasses import replace
from pathlib import Path

import pandas as pd
import plotly.offline
import pytest

from ropelens.cli import main
from ropelens.report import Section, SectionSpec, build_report, register_section, sections
from ropelens.results.findings import fixed, percent
from ropelens.run import data

N_CTX = 64
TOKENS = 4 * N_CTX


@pytest.fixture(scope="module")
def gemma_report(tiny, tmp_path_factory) -> Path:
    """A report on the tiny Gemma-3 (local and global layers), band statistics over every window."""
    out = tmp_path_factory.mktemp("report") / "out"
    return build_report(
        tiny("gemma3"),
        corpus="english",
        tokens=TOKENS,
        n_ctx=N_CTX,
        out=out,
        progress=False,
        band_tokens=None,
    )


@pytest.fixture(scope="module")
def page(gemma_report) -> str:
    return (gemma_report / "index.html").read_text(encoding="utf-8")


@pytest.fixture(scope="module")
def report(gemma_report) -> dict:
    return json.loads((gemma_report / "report.json").read_text())


def csv(out: Path, name: str) -> pd.DataFrame:
    return pd.read_csv(out / f"{name}.csv")


# ---------------------------------------------------------------------------------------- the page
def test_plotly_js_embedded_exactly_once(page):
    head = plotly.offline.get_plotlyjs()[:80]
    assert page.count(head) == 1
    assert page.count("Plotly.newPlot(") == page.count('class="plotly-graph-div"') >= 8


def test_page_fetches_nothing(page):
    ours = page.replace(plotly.offline.get_plotlyjs(), "")  # the library's own source mentions URLs
    sources = re.findall(
        r"<(?:script|link|img|iframe)\b[^>]*\b(?:src|href)\s*=\s*[\"']?([^\"'\s>]+)", ours, re.I
    )
    assert sources == []
    assert re.findall(r"<(?:script|link)\b[^>]*http", page, re.I) == []
    for needle in ("cdn.plot.ly", "fonts.googleapis", "@import", "mathjax", "@font-face"):
        assert needle not in ours.lower()


def test_every_section_present(page, report):
    for anchor in ("findings", "provenance", *(s.key for s in sections())):
        assert f'<section id="{anchor}">' in page
    available = {s["key"]: s["available"] for s in report["sections"]}
    assert available == {
        "rope-spec": True,
        "frequency-usage": True,
        "band-statistics": True,
        "head-taxonomy": True,
        "attention-sinks": True,
        "attention-by-distance": True,
        "massive-values": True,
        "prope-sweep": True,
        "pe-geometry": True,
        "extension-planes": True,
    }
    for key, ok in available.items():
        body = page.split(f'<section id="{key}">')[1].split("</section>")[0]
        assert ("Not yet available in this version of ropelens." in body) is (not ok)


def test_head_by_plane_shows_a_local_and_a_global_layer(page, report):
    kinds = report["model"]["kinds"]
    assert kinds == {"sliding": [0, 1, 2], "full": [3]}
    shown = set(re.findall(r"Layer (\d+) \((sliding|full)\): head", page))
    assert {kind for _, kind in shown} == {"sliding", "full"}


# ---------------------------------------------------------------------------------------- numbers
def flat_numbers(values) -> list:
    if isinstance(values, dict):
        return [x for v in values.values() for x in flat_numbers(v)]
    if isinstance(values, list):
        return [x for v in values for x in flat_numbers(v)]
    return [values] if isinstance(values, int | float) and not isinstance(values, bool) else []


def test_findings_quote_their_numbers(report, page):
    keys = [f["key"] for f in report["findings"]]
    assert keys == [
        "energy",
        "sink",
        "margin",
        "top1",
        "tightness",
        "heads",
        "sinks-0",
        "sinks-1",
        "distance",
        "massive",
        "prope",
        "geometry",
        "context",
    ]
    for f in report["findings"]:
        for x in flat_numbers(f["values"]):
            if isinstance(x, float):  # to 2 decimals, with no negative zero, or as a percentage
                quoted = {f"{x:.2f}", fixed(x), percent(x)}
                assert any(q in f["text"] for q in quoted), (x, f["text"])
        assert html.escape(f["text"]) in page


def test_findings_agree_with_the_csvs(gemma_report, report):
    found = {f["key"]: f["values"] for f in report["findings"]}
    bs = csv(gemma_report, "band_statistics")
    first = (
        bs[bs["band"] == found["margin"]["band"]]
        .sort_values("margin_share", ascending=False)
        .iloc[0]
    )
    top = found["margin"]["heads"][0]
    assert (top["layer"], top["head"]) == (first["layer"], first["head"])
    assert top["margin_share"] == pytest.approx(first["margin_share"], abs=0.005)
    tight = csv(gemma_report, "tightness")
    assert found["tightness"]["mean"] == pytest.approx(
        tight[tight["plane"] == 0]["tightness"].mean(), abs=0.005
    )
    energy = csv(gemma_report, "energy")
    q = energy[(energy["which"] == "q") & (energy["scope"] == "no_sink")]
    per_layer = q.groupby(["layer", "band"], sort=False)["energy_share"].mean().unstack()
    winners = per_layer.idxmax(axis=1).value_counts()
    assert winners[found["energy"]["q"]["band"]] == found["energy"]["q"]["layers"] == winners.max()
    top1 = bs.groupby("band", sort=False)["top1"].mean()
    assert found["top1"]["mean_top1"] == pytest.approx(top1[found["top1"]["band"]], abs=0.005)


def test_csvs_are_tidy(gemma_report, report, tiny):
    from ropelens import rope_spec

    spec = rope_spec(tiny("gemma3"))
    L, P, H, KV = (
        spec.n_layers,
        spec.layers[0].n_planes,
        spec.layers[0].n_heads,
        spec.layers[0].n_kv_heads,
    )
    names = [t for s in report["sections"] for t in s["tables"]]
    assert sorted(names) == sorted(
        [
            "rope_spec.csv",
            "frequency_usage.csv",
            "energy.csv",
            "band_statistics.csv",
            "tightness.csv",
            "head_taxonomy.csv",
            "sinks_heads.csv",
            "sinks_layers.csv",
            "distance_shapes.csv",
            "massive_planes.csv",
            "geometry.csv",
            "prope_sweep.csv",
            "extension_planes.csv",
        ]
    )
    sinks = csv(gemma_report, "sinks_layers")
    assert len(sinks) == L and sinks["layer"].tolist() == list(range(L))
    shapes = csv(gemma_report, "distance_shapes")
    assert set(shapes["shape"]) <= {"flat", "decays", "grows", "U-shaped", "peaked", "oscillating"}
    heads = csv(gemma_report, "head_taxonomy")
    assert len(heads) == L * H and set(heads["kind"]) <= {
        "diagonal",
        "previous-token",
        "sink",
        "content",
    } | {k for k in heads["kind"] if k.startswith("offset-")}
    assert len(csv(gemma_report, "rope_spec")) == L * P
    usage = csv(gemma_report, "frequency_usage")
    assert len(usage) == 2 * L * (H + KV) * P  # q and k, two scopes
    assert set(usage.columns) >= {
        "which",
        "scope",
        "layer",
        "head",
        "plane",
        "wavelength",
        "mean_norm",
        "ci95",
    }
    bs = csv(gemma_report, "band_statistics")
    assert len(bs) == L * H * 4 and set(bs["band"]) == {"Q1 (highest)", "Q2", "Q3", "Q4 (lowest)"}
    assert bs.groupby(["layer", "head"])["margin_share"].sum().to_numpy() == pytest.approx(
        1.0, abs=1e-4
    )
    assert len(csv(gemma_report, "tightness")) == L * H * P


def test_report_json_provenance(report):
    p = report["provenance"]
    assert report["model"]["name"] == "tiny-gemma3"
    assert report["corpus"]["sha256"] == data.english().sha256 == p["corpus_sha256"]
    assert (p["n_tokens"], p["n_windows"], p["n_ctx"]) == (TOKENS, TOKENS // N_CTX, N_CTX)
    assert report["measured"]["band_statistics"]["n_windows"] == TOKENS // N_CTX
    assert {"python", "torch", "ropelens", "plotly"} <= set(p["versions"])
    assert set(p["steps_seconds"]) == {
        "load_model",
        "band_mixer",
        "tokenize",
        "stream",
        "render",
        "variants_baseline",
        "prope_sweep",
        "extension_planes",
        "head_taxonomy",
        "attention_sinks",
        "attention_by_distance",
        "massive_values",
        "pe_geometry",
        "verify",
    }
    assert p["config"]["verification"]["status"] == "passed"
    assert p["seconds"] >= p["steps_seconds"]["stream"] > 0


# ---------------------------------------------------------------------------------------- writing
def test_interrupted_run_leaves_no_index(tiny, tmp_path, registry):
    def boom(_data):
        raise RuntimeError("section failed")

    registry.replace_section("band-statistics", render=boom)
    out = tmp_path / "out"
    with pytest.raises(RuntimeError, match="section failed"):
        build_report(tiny("llama"), tokens=2 * N_CTX, n_ctx=N_CTX, out=out, progress=False)
    assert (
        not out.exists()
    )  # no index.html, no report.json, no temp directory, not even the empty folder


def test_failed_rerun_keeps_the_previous_report(gemma_report, tiny, registry):
    before = (gemma_report / "index.html").read_bytes()

    def boom(_data):
        raise KeyboardInterrupt

    registry.replace_section("frequency-usage", render=boom)
    with pytest.raises(KeyboardInterrupt):
        build_report(tiny("gemma3"), tokens=TOKENS, n_ctx=N_CTX, out=gemma_report, progress=False)
    assert (gemma_report / "index.html").read_bytes() == before
    assert not [p for p in gemma_report.iterdir() if p.name.startswith(".")]


def _positional_heads(data) -> Section:
    frame = pd.DataFrame({"layer": list(data.layers), "score": [0.5] * len(data.layers)})
    return Section(
        "head-taxonomy",
        "Positional heads",
        "<p>plugged-in section body</p>",
        tables={"head_taxonomy": frame},
        numbers={"n": len(data.layers)},
    )


def test_registry_plugs_in_a_section(tiny, tmp_path, registry):
    before = [s.key for s in sections()]
    register_section(SectionSpec("head-taxonomy", "Positional heads", _positional_heads))
    assert [s.key for s in sections()] == before  # same place in the layout
    out = build_report(
        tiny("llama"), tokens=2 * N_CTX, n_ctx=N_CTX, out=tmp_path / "out", progress=False
    )
    html = (out / "index.html").read_text()
    body = html.split('<section id="head-taxonomy">')[1].split("</section>")[0]
    assert "plugged-in section body" in body and "Not yet available" not in body
    assert len(pd.read_csv(out / "head_taxonomy.csv")) == 2


def test_accepts_a_model_path_and_quick(tiny_dir, tmp_path):
    out = build_report(
        str(tiny_dir("llama")), quick=True, n_ctx=N_CTX, out=tmp_path / "q", progress=False
    )
    r = json.loads((out / "report.json").read_text())
    assert r["measured"]["usage"]["n_windows"] == 4 and r["provenance"]["n_ctx"] == N_CTX
    assert r["provenance"]["config"]["quick"] is True


def test_band_statistics_on_a_subset_of_windows(tiny, tmp_path):
    """Band statistics over evenly spread windows equal band_statistics run on those windows
    alone."""
    from ropelens.analyses.band_statistics import band_statistics
    from ropelens.spec.bands import Bands

    model = tiny("llama-gqa")
    out = build_report(
        model, tokens=TOKENS, n_ctx=N_CTX, out=tmp_path / "r", band_tokens=2 * N_CTX, progress=False
    )
    r = json.loads((out / "report.json").read_text())
    assert r["measured"]["band_statistics"] == {
        "n_tokens": 2 * N_CTX,
        "n_windows": 2,
        "windows": [0, 3],
    }
    assert r["measured"]["usage"]["n_windows"] == 4
    assert "band statistics on 2 of them" in (out / "index.html").read_text()
    toks = data.windows(data.english(), model.tokenizer, N_CTX, max_tokens=TOKENS)
    direct = band_statistics(
        model, toks[[0, 3]], bands=Bands.quantiles(4), progress=False
    ).to_frame()
    ours = csv(out, "band_statistics")
    for col in ("abs_share", "var_share", "margin_share", "top1"):
        assert ours[col].to_numpy() == pytest.approx(direct[col].to_numpy(), abs=1e-5)
    # usage sees every window, half of them on the fast q/k path: the same as frequency_usage on all
    from ropelens.analyses.frequency_usage import frequency_usage

    usage = frequency_usage(model, toks, progress=False, batch_size=1)
    report_usage = csv(out, "frequency_usage")
    want = usage.to_frame()
    merged = report_usage.merge(
        want, on=["which", "scope", "layer", "head", "plane"], suffixes=("", "_direct")
    )
    assert len(merged) == len(want) > 0
    for col in ("mean_norm", "std"):
        assert merged[col].to_numpy() == pytest.approx(
            merged[f"{col}_direct"].to_numpy(), rel=1e-5, abs=1e-6
        )


def test_bad_arguments_fail_before_the_model_loads(tmp_path):
    not_a_dir = tmp_path / "file"
    not_a_dir.write_text("x")
    with pytest.raises(OSError, match="choose a writable output directory"):
        build_report("no-such-model", out=not_a_dir / "report")
    with pytest.raises(ValueError, match="fewer than one window"):
        build_report("no-such-model", tokens=100, n_ctx=512, out=tmp_path / "r")
    with pytest.raises(FileNotFoundError, match="does not exist"):
        build_report("no-such-model", corpus=tmp_path / "missing.txt", out=tmp_path / "r")


# ------------------------------------------------------------------------------------- command line
def one_error(err: str) -> str:
    lines = [line for line in err.splitlines() if line.startswith("ropelens: error:")]
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


def test_cli_report_json(tiny_dir, tmp_path, capsys):
    argv = [
        "report",
        str(tiny_dir("llama")),
        "--tokens",
        "128",
        "--n-ctx",
        str(N_CTX),
        "--out",
        str(tmp_path / "r"),
        "--layers",
        "0,1",
        "--json",
    ]
    assert main(argv) == 0
    captured = capsys.readouterr()
    out = json.loads(captured.out)
    assert Path(out["index"]).is_file() and [f["key"] for f in out["findings"]][0] == "energy"
    assert "ropelens report:" not in captured.err  # no progress bar beside JSON


def test_cli_usage_and_decompose(tiny_dir, capsys):
    model = str(tiny_dir("gemma3"))
    assert main(["frequency-usage", model, "--tokens", "128", "--n-ctx", str(N_CTX), "--json"]) == 0
    u = json.loads(capsys.readouterr().out)
    assert len(u["q_energy_share"]) == 4 and sum(u["q_energy_share"][0]) == pytest.approx(
        1.0, abs=1e-5
    )
    assert (
        main(
            [
                "attention-decomposition",
                model,
                "--text",
                "The cat sat on the mat. The cat sat.",
                "--layers",
                "0,3",
                "--bands",
                "quantiles:4",
            ]
        )
        == 0
    )
    text = capsys.readouterr().out
    assert "layer 0" in text and "layer 3" in text and "Q1 (highest)" in text
    assert (
        main(
            [
                "attention-decomposition",
                model,
                "--n-ctx",
                "32",
                "--window",
                "1",
                "--layers",
                "3",
                "--json",
            ]
        )
        == 0
    )
    d = json.loads(capsys.readouterr().out)
    assert d["input"] == "english window 1" and {r["layer"] for r in d["heads"]} == {3}
    assert {"margin_share", "top1", "jsd"} <= set(d["heads"][0])


@pytest.mark.parametrize(
    ("argv", "match"),
    [
        (["report", "no-such-model", "--out", "{tmp}/r"], "cannot load model 'no-such-model'"),
        (
            ["report", "{llama}", "--corpus", "{tmp}/missing.txt", "--out", "{tmp}/r"],
            "does not exist",
        ),
        (
            ["report", "{llama}", "--corpus", "{tmp}", "--out", "{tmp}/r"],
            "has no text (.txt/.md) or table",
        ),
        (
            ["report", "{llama}", "--tokens", "10", "--n-ctx", "64", "--out", "{tmp}/r"],
            "fewer than one window",
        ),
        (
            ["report", "{llama}", "--out", "{tmp}/file/r"],
            "is a file, not a directory: pass a path in a writable directory",
        ),
        (["report", "{llama}", "--layers", "0,x"], "--layers: expected comma-separated indices"),
        (
            ["report", "{llama}", "--bands", "octaves", "--out", "{tmp}/r"],
            "unknown band spec 'octaves'",
        ),
        (["frequency-usage", "{llama}", "--tokens", "0"], "expected a positive integer"),
        (
            ["frequency-usage", "{llama}", "--tokens", "32", "--n-ctx", "64"],
            "fewer than one window",
        ),
        (
            ["attention-decomposition", "{llama}", "--text", ""],
            "--text was given an empty value ''",
        ),
        (["attention-decomposition", "{llama}", "--text", "   \n"], "--text is empty"),
        (
            ["attention-decomposition", "{llama}", "--text", "hi", "--layers", "7"],
            "layer 7 out of range",
        ),
        (["attention-decomposition", "no-such-model", "--text", "hi"], "cannot load model"),
    ],
)
def test_cli_bad_input_exits_2(argv, match, tiny_dir, tmp_path, capsys):
    (tmp_path / "file").write_text("not a directory")
    args = [a.format(tmp=tmp_path, llama=tiny_dir("llama")) for a in argv]
    assert main(args) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert match in one_error(captured.err)
    assert not (tmp_path / "r" / "index.html").exists()


def test_compare_reports(gemma_report, tmp_path):
    """A report against itself changes nothing; against a copy with planted changes, the difference
    maps equal B − A computed here from the CSVs, and heads gained/lost are listed."""
    import shutil

    from ropelens.errors import InputError
    from ropelens.report.compare import compare_reports

    same = compare_reports(gemma_report, gemma_report, tmp_path / "same")
    assert pd.read_csv(same / "energy_diff.csv").drop(columns="layer").abs().to_numpy().max() == 0
    assert len(pd.read_csv(same / "heads_diff.csv")) == 0
    b = tmp_path / "b"
    shutil.copytree(gemma_report, b)
    bs = pd.read_csv(b / "band_statistics.csv")
    bs.loc[(bs.layer == 1) & (bs.band == "Q2"), "margin_share"] += 0.25
    bs.to_csv(b / "band_statistics.csv", index=False)
    heads = pd.read_csv(b / "head_taxonomy.csv")
    flip = heads.index[0]
    heads.loc[flip, "positional"] = not bool(heads.loc[flip, "positional"])
    heads.to_csv(b / "head_taxonomy.csv", index=False)
    out = compare_reports(gemma_report, b, tmp_path / "cmp")
    d = pd.read_csv(out / "margin_diff.csv").set_index("layer")
    assert d.loc[1, "Q2"] == pytest.approx(0.25) and d.drop(
        index=1
    ).abs().to_numpy().max() == pytest.approx(0)
    findings = json.loads((out / "compare.json").read_text())["findings"]
    assert any("layer 1, band Q2: +0.250" in f for f in findings)
    changed = pd.read_csv(out / "heads_diff.csv")
    assert len(changed) == 1 and (int(changed["layer"][0]), int(changed["head"][0])) == (
        int(heads["layer"][flip]),
        int(heads["head"][flip]),
    )
    html = (out / "index.html").read_text()
    assert html.count("Plotly.newPlot(") >= 2
    with pytest.raises(InputError, match="no report.json"):
        compare_reports(tmp_path, gemma_report, tmp_path / "x")


def test_report_on_a_model_with_two_rotary_planes(tmp_path):
    """A rotary slice of two planes (a GPT-NeoX or Qwen3-Next with partial rotary): the default
    bands are one per plane, and every section is built."""
    from ropelens.testing import tiny_model

    model = tiny_model("gptj", rotary_dim=4)
    out = build_report(model, quick=True, n_ctx=N_CTX, out=tmp_path / "r", progress=False)
    r = json.loads((out / "report.json").read_text())
    assert r["provenance"]["config"]["bands"] == "quantiles:<=4"
    bands = pd.read_csv(out / "band_statistics.csv")
    assert set(bands["band"]) >= {"Q1 (highest)", "Q2 (lowest)"} and "Q3" not in set(bands["band"])


def test_report_cuts_windows_to_a_chunked_layer(tmp_path):
    """A layer that attends in chunks: band statistics model its mask on windows up to one chunk, so
    the report measures windows of that length and says so."""
    from ropelens.testing import tiny_model

    model = tiny_model("llama")
    from ropelens.spec.reading import rope_spec

    spec = rope_spec(model)
    chunked = replace(
        spec, layers=tuple(replace(lr, chunk=16) if lr.layer == 1 else lr for lr in spec.layers)
    )
    from ropelens.report.build import _fit_windows

    assert _fit_windows(spec, spec.layer_indices(), 64) == (64, None)
    n, note = _fit_windows(chunked, chunked.layer_indices(), 64)
    assert n == 16 and "layer(s) [1]" in note and "from 64 to 16 tokens" in note
    assert _fit_windows(chunked, [0], 64) == (64, None)  # only the layers measured count
