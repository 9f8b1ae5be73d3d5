"""Bad input to every command: one line naming the problem and the fix, exit code 2, nothing
written.

The model is "no-such-model" wherever the check must come before any model loads: a check that
were missing or late would fail with "cannot load model" instead, and the message assertion
catches it. The few checks that need the model's own numbers (its layers, its tokenizer) run on a
tiny model directory. No test here loads an embedded model.
"""

from __future__ import annotations

import json
import socket
import time
from pathlib import Path

import pandas as pd
import pytest

from ropelens.cli import main
from ropelens.cli.main import build_parser

N_CTX = 32


def tree(folder: Path) -> set[str]:
    return {str(p.relative_to(folder)) for p in folder.rglob("*")}


def one_error(capsys) -> str:
    """The single ``ropelens: error:`` line of a failed command (nothing on stdout, no
    traceback)."""
    captured = capsys.readouterr()
    lines = [line for line in captured.err.splitlines() if line.startswith("ropelens: error:")]
    assert captured.out == "" and "Traceback" not in captured.err, captured.err
    assert len(lines) == 1, captured.err
    return lines[0].removeprefix("ropelens: error: ")


def fails(argv: list[str], folder: Path, capsys) -> str:
    """Run ``argv`` in ``folder``; it must exit 2 and leave ``folder`` as it was. Returns the
    message."""
    before = tree(folder)
    started = time.perf_counter()
    assert main(argv) == 2
    assert time.perf_counter() - started < 30  # a smoke bound: no hub retries, no model run
    message = one_error(capsys)
    assert tree(folder) == before, f"{argv} left {tree(folder) - before}"
    return message


# The placeholders: {tmp} the test's folder, {file} a plain file in it, {new} a path that does not
# exist.
BEFORE_THE_MODEL = [
    # distance
    (
        ["attention-by-distance", "--n-ctx", "2", "--tokens", "8"],
        "--n-ctx 2 is too short for distance curves: they need three distance bins (δ = 0, 1, 2 "
        "between non-BOS tokens): use --n-ctx 4 or more",
    ),
    (
        ["attention-by-distance", "--n-ctx", "2", "--tokens", "8", "--keep-bos"],
        "use --n-ctx 3 or more",
    ),
    (
        ["attention-by-distance", "--n-ctx", "1"],
        "argument --n-ctx: a window needs at least 2 tokens (BOS and one more), got '1'",
    ),
    (
        ["attention-by-distance", "--tokens", "x"],
        "argument --tokens: expected a positive integer, got 'x'",
    ),
    (
        ["attention-by-distance", "--tokens", "16", "--n-ctx", "32"],
        "--tokens 16 is fewer than one window of --n-ctx 32: raise",
    ),
    (
        ["attention-by-distance", "--layers", "0,x"],
        "argument --layers: expected comma-separated indices such as 0,5,11, got '0,x'",
    ),
    (["attention-by-distance", "--bands", "quantiles:0"], "bad band spec 'quantiles:0'"),
    (
        ["attention-by-distance", "--corpus", "{tmp}/missing.txt"],
        "does not exist: check the path, or use a built-in corpus",
    ),
    (
        ["attention-by-distance", "--save", "{file}/d.json"],
        "--save {file}/d.json: {file} is a file, not a directory: pass a path in a writable "
        "directory",
    ),
    (
        ["attention-by-distance", "--save", "{tmp}"],
        "--save {tmp} is a directory: pass a file path such as {tmp}/result.json",
    ),
    (
        ["attention-by-distance", "--checkpoint", "{file}"],
        "--checkpoint {file} is a file: pass a directory",
    ),
    (
        ["attention-by-distance", "--checkpoint-every", "0"],
        "argument --checkpoint-every: expected a positive integer, got '0'",
    ),
    (["attention-by-distance", "--dtype", "int8"], "argument --dtype: invalid choice: 'int8'"),
    # offsets
    (["rotary-offsets", "--n-ctx", "0"], "argument --n-ctx: expected a positive integer, got '0'"),
    (
        ["rotary-offsets", "--tokens", "-5"],
        "argument --tokens: expected a positive integer, got '-5'",
    ),
    (["rotary-offsets", "--save", "{file}/sub/o.json"], "{file} is a file, not a directory"),
    (
        ["rotary-offsets", "--checkpoint", "{file}/ck"],
        "--checkpoint {file}/ck: {file} is a file, not a directory",
    ),
    # decompose-stats
    (
        ["band-statistics", "--batch-size", "0"],
        "argument --batch-size: expected a positive integer, got '0'",
    ),
    (["band-statistics", "--save", "{tmp}"], "is a directory: pass a file path"),
    (["band-statistics", "--bands", "octaves"], "unknown band spec 'octaves'"),
    # predict-base
    (
        ["base-predictions", "--measure", "-1"],
        "argument --measure: expected an integer ≥ 0, got '-1'",
    ),
    (
        ["base-predictions", "--measure", "x"],
        "argument --measure: expected an integer ≥ 0, got 'x'",
    ),
    (
        ["base-predictions", "--lengths", "x"],
        "--lengths must be a comma-separated list of integers, got 'x'",
    ),
    (
        ["base-predictions", "--lengths", "2048,1.5"],
        "--lengths must be a comma-separated list of integers",
    ),
    (
        ["base-predictions", "--lengths", ","],
        "--lengths is empty, got ',': pass a comma-separated list of integers",
    ),
    (["base-predictions", "--lengths", "1"], "--lengths needs token counts ≥ 2, got '1'"),
    (["base-predictions", "--save", "{file}/p.json"], "{file} is a file, not a directory"),
    # passkey
    (
        ["passkey-retrieval", "--depths", "1.5"],
        "each of --depths must be >= 0 and <= 1, got 1.5: pass fractions of the prompt",
    ),
    (["passkey-retrieval", "--depths", "nan"], "each of --depths must be a finite number, got nan"),
    (
        ["passkey-retrieval", "--depths", "a"],
        "--depths must be a comma-separated list of numbers, got 'a'",
    ),
    (
        ["passkey-retrieval", "--trials", "0"],
        "argument --trials: expected a positive integer, got '0'",
    ),
    (
        ["passkey-retrieval", "--lengths", "x"],
        "--lengths must be a comma-separated list of integers, got 'x'",
    ),
    (
        ["passkey-retrieval", "--lengths", "1024,0"],
        "each of --lengths must be >= 2, got 0: pass prompt lengths in tokens",
    ),
    (["passkey-retrieval", "--seed", "-1"], "argument --seed: expected an integer ≥ 0, got '-1'"),
    (["passkey-retrieval", "--variant", "prope:1.5"], "p must be >= 0 and <= 1, got 1.5"),
    (["passkey-retrieval", "--save", "{tmp}"], "is a directory: pass a file path"),
    # knockout
    (
        ["knockout", "--heads", "3:1"],
        "--heads takes LAYER.HEAD pairs separated by commas, got '3:1': e.g. --heads 3.1,5.0",
    ),
    (
        ["knockout", "--sets", "copying"],
        "--sets takes names from positional, retrieval, sinks, others separated by "
        "commas, got 'copying'",
    ),
    (
        ["knockout", "--directions", "random"],
        "--directions takes names from high, low separated by commas",
    ),
    (
        ["knockout", "--metrics", "ppl"],
        "--metrics takes names from loss, probe, retrieval separated by commas",
    ),
    (
        ["knockout", "--doses", "0,x"],
        "--doses must be a comma-separated list of numbers, got '0,x'",
    ),
    (["knockout", "--random", "-1"], "argument --random: expected an integer ≥ 0, got '-1'"),
    (["knockout", "--save", "{tmp}"], "is a directory: pass a file path"),
    # heads, truncate, context, the other corpus commands, decompose
    (["head-taxonomy", "--tokens", "0"], "argument --tokens: expected a positive integer, got '0'"),
    (["head-taxonomy", "--n-ctx", "1"], "argument --n-ctx: a window needs at least 2 tokens"),
    (["head-taxonomy", "--checkpoint", "{file}"], "--checkpoint {file} is a file"),
    (["head-taxonomy", "--save", "{file}/h.json"], "{file} is a file, not a directory"),
    (["prope-sweep", "--tokens", "0"], "argument --tokens: expected a positive integer, got '0'"),
    (["prope-sweep", "--n-ctx", "x"], "argument --n-ctx: expected a positive integer, got 'x'"),
    (["prope-sweep", "--p", "x"], "--p must be a comma-separated list of numbers, got 'x'"),
    (["prope-sweep", "--p", "1.5"], "p must be >= 0 and <= 1, got 1.5"),
    (
        ["extension-planes", "--to", "0"],
        "argument --to: expected a positive integer, got '0'",
    ),
    (
        ["extension-planes", "--to", "8192", "--native", "0"],
        "argument --native: expected a positive integer, got '0'",
    ),
    (
        ["extension-planes", "--to", "1024", "--native", "2048"],
        "--to 1024 must exceed --native 2048",
    ),
    (
        ["extension-planes", "--to", "8192", "--variants", "warp"],
        "--variants 'warp': unknown ['warp']",
    ),
    (["massive-values", "--factor", "0.5"], "--factor must exceed 1"),
    (
        ["frequency-usage", "--tokens", "0"],
        "argument --tokens: expected a positive integer, got '0'",
    ),
    (["attention-decomposition", "--window", "-1"], "--window must be ≥ 0, got -1"),
    (["attention-decomposition", "--text", " "], "--text is empty"),
    (["variant-frequencies", "--variant", "prope:x"], "variant 'prope:x': bad P 'x'"),
    (
        ["rope-spec", "--device", "gpu0"],
        "unknown device 'gpu0': use 'cpu', 'cuda', 'cuda:N' or 'mps'",
    ),
    (
        ["rope-spec", "--device", "meta"],
        "device 'meta': meta tensors hold shapes but no values, so there is nothing to measure "
        "on them: pick 'cpu', 'cuda' or 'mps'",
    ),
    (
        ["frequency-usage", "--device", "meta"],
        "device 'meta': meta tensors hold shapes but no values",
    ),
    # claims (it does not split across processes: test_torchrun_refusal)
    (
        ["claims", "--budget", "huge"],
        "--budget must be one of quick, standard, thorough, got 'huge' (e.g. --budget quick)",
    ),
    (
        ["claims", "--claims", "nope"],
        "--claims 'nope': no claim 'nope'; choose from positional-highest-band, ",
    ),
    (["claims", "--claims", ","], "--claims ',': no claim named; choose from "),
    (["claims", "--save", "{tmp}"], "--save {tmp} is a directory: pass a file path"),
    (["claims", "--save", "{file}/c.json"], "{file} is a file, not a directory"),
    # report
    (["report", "--out", "{file}"], "--out {file} is a file: pass a directory"),
    (["report", "--out", "{file}/r"], "--out {file}/r: {file} is a file, not a directory"),
    (
        ["report", "--band-tokens", "0"],
        "argument --band-tokens: expected a positive integer, got '0'",
    ),
    (
        ["report", "--experiments", "{tmp}/missing", "--out", "{new}"],
        "--experiments {tmp}/missing is not a directory",
    ),
]


@pytest.mark.parametrize(
    ("argv", "message"), BEFORE_THE_MODEL, ids=[" ".join(a) for a, _ in BEFORE_THE_MODEL]
)
def test_bad_value_fails_before_the_model_loads(argv, message, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)  # commands with a default output folder would write it here
    (tmp_path / "file").write_text("not a directory")
    fill = {"tmp": tmp_path, "file": tmp_path / "file", "new": tmp_path / "new" / "out"}
    command, *rest = argv
    got = fails([command, "no-such-model", *(a.format(**fill) for a in rest)], tmp_path, capsys)
    assert message.format(**fill) in got


@pytest.mark.parametrize(
    "argv",
    [
        [
            "rotary-offsets",
            "--n-ctx",
            "32",
            "--tokens",
            "64",
            "--save",
            "{new}/o.json",
            "--checkpoint",
            "{new}/ck",
        ],
        ["head-taxonomy", "--save", "{new}/h.json", "--checkpoint", "{new}/ck"],
        ["passkey-retrieval", "--save", "{new}/p.json"],
        ["base-predictions", "--save", "{new}/p.json"],
        ["report", "--out", "{new}/report"],
    ],
)
def test_outputs_are_not_created_when_the_model_fails(argv, tmp_path, monkeypatch, capsys):
    """Output folders that do not exist yet are checked, not made: the failed run leaves nothing
    behind."""
    monkeypatch.chdir(tmp_path)
    command, *rest = argv
    got = fails(
        [command, "no-such-model", *(a.format(new=tmp_path / "new" / "sub") for a in rest)],
        tmp_path,
        capsys,
    )
    assert got.startswith("cannot load model 'no-such-model'")
    assert not (tmp_path / "new").exists()


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (
            ["attention-by-distance", "--layers", "9", "--n-ctx", "32", "--tokens", "64"],
            "layer 9 out of range: the model has 2 layers",
        ),
        (
            ["extension-planes", "--to", "8192", "--layer", "9"],
            "layer 9 out of range: the model has 2 layers (0..1)",
        ),
        (
            ["passkey-retrieval", "--lengths", "5", "--save", "{tmp}/p.json"],
            "length 5 is too short",
        ),
        (
            ["attention-decomposition", "--window", "99999", "--n-ctx", "32"],
            "--window 99999 does not exist: pick 0..",
        ),
        (
            ["extension-planes", "--to", "100"],
            "--to 100 must exceed the native context 256: pass --native N",
        ),
        # sizes checked against what the computation needs before anything is allocated
        (
            ["passkey-retrieval", "--lengths", "100000000"],
            "a passkey prompt of 100,000,000 tokens needs about",
        ),
        (
            ["base-predictions", "--lengths", "10000000000"],
            "context length 10,000,000,000 is past 262,144 tokens",
        ),
    ],
)
def test_bad_value_for_this_model(argv, message, tiny_dir, tmp_path, capsys):
    """Checks that need the model's own layers, context or tokenizer: still one line, nothing
    saved."""
    got = fails(
        [argv[0], str(tiny_dir("llama")), *(a.format(tmp=tmp_path) for a in argv[1:])],
        tmp_path,
        capsys,
    )
    assert message in got


# -------------------------------------------------------------------------------------- model names
@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("no such model", "and it is not a hub id (owner/name of letters, digits, '-', '_', '.')"),
        ("a--b", "and it is not a hub id"),
        ("nosuchmodel", "and HF_HUB_OFFLINE is set while the local hub cache lacks it"),
        ("owner/nosuchmodel", "and HF_HUB_OFFLINE is set while the local hub cache lacks it"),
    ],
)
def test_unknown_model_name_says_what_was_tried(name, message, tmp_path, capsys):
    got = fails(["rope-spec", name], tmp_path, capsys)
    assert got.startswith(
        f"cannot load model {name!r}: it is not an embedded model ('smollm2-135m', "
        f"'gemma-3-270m'), no file or directory {name!r} exists"
    )
    assert message in got
    assert (
        "pass an embedded name, a .gguf file, an HF model directory (config.json + weights), or "
        "a hub id" in got
    )


def test_unreachable_hub_fails_fast(hub, tmp_path, capsys):
    """A hub that accepts the connection and never answers: the name fails after the timeout, not
    after retries."""
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(4)  # accepts (the kernel does) and never answers
    endpoint = f"http://127.0.0.1:{silent.getsockname()[1]}"
    try:
        hub.point(endpoint)
        started = time.perf_counter()
        got = fails(["rope-spec", "nosuchmodel"], tmp_path, capsys)
        assert time.perf_counter() - started < 10  # 0.5 s timeout; transformers' retries took 30 s
    finally:
        silent.close()
    assert f"the hub ({endpoint}) did not answer within 0.5 s (ReadTimeout" in got
    assert "did not answer within 0.5 s" in got and "or connect to the network" in got


def test_refused_connection_and_unknown_repository(hub, tmp_path, capsys):
    free = socket.socket()
    free.bind(("127.0.0.1", 0))
    port = free.getsockname()[1]
    free.close()  # nothing listens there now: the connection is refused at once
    hub.point(f"http://127.0.0.1:{port}")
    assert "did not answer within 0.5 s (ConnectError" in fails(
        ["rope-spec", "nosuchmodel"], tmp_path, capsys
    )

    endpoint = hub.not_found("RepoNotFound", "Repository not found")
    got = fails(["rope-spec", "owner/nosuchmodel"], tmp_path, capsys)
    assert f"the hub ({endpoint}) has no model 'owner/nosuchmodel'" in got


# ---------------------------------------------------------------------------------------- torchrun
def _refusing() -> dict[str, list[str]]:
    """Every subcommand that does not split across processes, with the least argv that parses."""
    sub = next(a for a in build_parser()._actions if a.dest == "command")
    extra = {
        "compare": ["a", "b"],
        "variant-frequencies": ["--variant", "nope"],
        "intervention-effect": ["--variant", "nope"],
        "extension-planes": ["--to", "8192"],
        "extension-study": ["--to", "16384"],
        "trajectory": ["step-000100"],
    }
    return {
        name: [name, *extra.get(name, [])]
        for name, p in sub.choices.items()
        if not p.get_default("distributed")
    }


def test_the_refusing_commands_are_these():
    assert sorted(_refusing()) == [
        "attention-decomposition",
        "band-location",
        "base-predictions",
        "claims",
        "compare",
        "explore",
        "extension-planes",
        "extension-study",
        "intervention-effect",
        "knockout",
        "passkey-retrieval",
        "pe-geometry",
        "prope-sweep",
        "retrieval-heads",
        "rope-spec",
        "trajectory",
        "variant-frequencies",
    ]


@pytest.mark.parametrize("command", sorted(_refusing()))
def test_torchrun_refusal(command, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("WORLD_SIZE", "2")
    got = fails(_refusing()[command], tmp_path, capsys)
    assert got.startswith(
        f"ropelens {command} does not split its work across processes: run it without torchrun ("
    )
    for splitting in (
        "frequency-usage",
        "band-statistics",
        "head-taxonomy",
        "attention-sinks",
        "attention-by-distance",
        "massive-values",
        "rotary-offsets",
        "frequency-entropy",
        "positional-symbolic",
        "report",
    ):
        assert f"{splitting}," in got or f"{splitting} and" in got or f"and {splitting} do" in got


# ---------------------------------------------------------------------------------------- compare
@pytest.fixture(scope="module")
def two_reports(tiny, tmp_path_factory):
    """A quick report of the tiny Llama, and a copy whose query energy moved in layer 1's first
    band."""
    import shutil

    from ropelens.report import build_report

    folder = tmp_path_factory.mktemp("reports")
    a = build_report(tiny("llama"), tokens=32, n_ctx=16, out=folder / "a", progress=False)
    b = Path(shutil.copytree(a, folder / "b"))
    e = pd.read_csv(b / "energy.csv")
    first = e.band.iloc[0]
    e.loc[(e.layer == 1) & (e.band == first), "energy_share"] += 0.25
    e.to_csv(b / "energy.csv", index=False)
    return a, b


def test_compare_command(two_reports, tmp_path, capsys):
    """The printed findings are compare.json's; the energy map is B − A of the two energy.csv."""
    a, b = two_reports
    out = tmp_path / "cmp"
    assert main(["compare", str(a), str(b), "--out", str(out)]) == 0
    printed = capsys.readouterr().out.splitlines()
    summary = json.loads((out / "compare.json").read_text())
    assert printed == [*summary["findings"], f"comparison: {out / 'index.html'}"]
    assert (out / "index.html").is_file() and not [
        p for p in out.iterdir() if p.name.startswith(".")
    ]

    def energy(folder: Path) -> pd.DataFrame:
        e = pd.read_csv(folder / "energy.csv")
        e = e[(e.which == "q") & (e.scope == "no_sink")]
        return e.groupby(["layer", "band"])["energy_share"].mean().unstack("band")

    want = energy(b) - energy(a)
    got = pd.read_csv(out / "energy_diff.csv").set_index("layer")[list(want.columns)]
    first = pd.read_csv(a / "energy.csv").band.iloc[0]
    assert (
        want.loc[1, first] == pytest.approx(0.25) and want.drop(index=1).abs().to_numpy().max() == 0
    )
    # both sides are float64 means of the same CSV values: equal to a few float64 ulps
    assert got.to_numpy() == pytest.approx(want.to_numpy(), rel=1e-12, abs=1e-15)
    assert f"Query energy moved most in layer 1, band {first}: +0.250" in printed[0]


def test_compare_bad_input(two_reports, tmp_path, capsys):
    a, b = two_reports
    (tmp_path / "file").write_text("x")
    (tmp_path / "empty").mkdir()
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "report.json").write_text("[1, 2]")
    (broken / "energy.csv").write_text("a\n1\n")
    (broken / "band_statistics.csv").write_text("a\n1\n")
    cases = [
        (
            [str(tmp_path / "missing"), str(b)],
            f"report directory {tmp_path / 'missing'} does not exist",
        ),
        (
            [str(a), str(tmp_path / "file")],
            f"{tmp_path / 'file'} is a file, not a report directory",
        ),
        (
            [str(tmp_path / "empty"), str(b)],
            f"{tmp_path / 'empty'} holds no report.json: pass two directories",
        ),
        ([str(a), str(broken)], f"{broken / 'report.json'} is not a ropelens report"),
        (
            [str(a), str(b), "--out", str(a)],
            f"the output directory {a} is report A: writing there would mix",
        ),
        ([str(a), str(b), "--out", str(b) + "/"], "is report B"),
        ([str(a), str(b), "--out", str(tmp_path / "file")], f"--out {tmp_path / 'file'} is a file"),
    ]
    before = {p: tree(p) for p in (a, b)}
    for argv, message in cases:
        assert message in fails(
            ["compare", *argv, *(["--out", str(tmp_path / "cmp")] if "--out" not in argv else [])],
            tmp_path,
            capsys,
        )
    assert {p: tree(p) for p in (a, b)} == before  # the reports are untouched


def test_similarity_too_large_for_memory_is_refused_by_its_flag(tmp_path, capsys):
    got = fails(["pe-geometry", "--n-pos", "100000000"], tmp_path, capsys)
    assert (
        got.startswith("--n-pos 100,000,000 (an n × n similarity matrix) needs about")
        and "pass a smaller --n-pos" in got
    )
    assert fails(["pe-geometry", "--d", "7"], tmp_path, capsys).startswith("--d 7 must be even")


def test_context_past_the_certified_bound_still_answers(tiny_dir, capsys):
    """A target far past any context (1e20 tokens) gets the per-plane view at once, and the base
    bound says why it is not given; nothing is allocated by the target's size."""
    started = time.perf_counter()
    assert main(["extension-planes", str(tiny_dir("llama")), "--to", str(10**20), "--json"]) == 0
    assert time.perf_counter() - started < 30
    out = json.loads(capsys.readouterr().out)
    assert out["target_ctx"] == 10**20 and out["base_lower_bound_target"] is None and out["views"]
