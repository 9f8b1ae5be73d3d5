"""Flags whose bad values once leaked Python's own words, suggested invalid examples, or were
changed silently.

Every error stays one ``ropelens: error:`` line naming the flag (see test_cli_errors); every example
a message suggests is fed back to the command and must pass all of its checks (it then fails only at
loading the model "no-such-model"); a value ropelens adjusts instead of refusing is said once, as
one ``ropelens: note:`` line, and the output records the value used.
"""

from __future__ import annotations

import json
import re
import shlex
import shutil
from pathlib import Path

import pytest

from ropelens.cli import main
from tests.unit.cli.test_cli_errors import fails, tree

CLI = Path(__file__).resolve().parents[3] / "src" / "ropelens" / "cli"
NO_MODEL = "cannot load model 'no-such-model'"


def _argv(command: str, *rest: str) -> list[str]:
    """``command`` on the model "no-such-model" (pe-geometry names its model with --model)."""
    return (
        [command, "--model", "no-such-model", *rest]
        if command == "pe-geometry"
        else [command, "no-such-model", *rest]
    )


def _examples(message: str) -> list[tuple[str, str]]:
    """The ``--flag value`` pairs a message suggests after "e.g.", as a shell would split them."""
    out = []
    for m in re.finditer(r"e\.g\. (--[a-z][\w-]*) ", message):
        value = shlex.split(message[m.end() :])[0]
        out.append((m.group(1), value.rstrip(";,)")))
    return out


def _notes(err: str) -> list[str]:
    return [line for line in err.splitlines() if line.startswith("ropelens: note:")]


# ---------------------------------------------------------------------------- examples in the hints
# Bad values whose message suggests an example; the example must pass every check the command makes.
HINTED = [
    ["attention-by-distance", "--layers", ","],
    ["retrieval-heads", "--threshold", "2"],
    ["retrieval-heads", "--lengths", ","],
    ["retrieval-heads", "--lengths", "x"],
    ["retrieval-heads", "--depths", ","],
    ["prope-sweep", "--p", ","],
    ["prope-sweep", "--p", "x"],
    ["prope-sweep", "--p", "1.5"],
    ["passkey-retrieval", "--lengths", ","],
    ["passkey-retrieval", "--lengths", "a"],
    ["passkey-retrieval", "--depths", ","],
    ["passkey-retrieval", "--depths", "1.5"],
    ["passkey-retrieval", "--variant", "prope:1.5"],
    ["base-predictions", "--lengths", ","],
    ["base-predictions", "--lengths", "x"],
    ["attention-decomposition", "--text", " "],
    ["attention-by-distance", "--bands", "wavelength:10,x"],
    ["attention-by-distance", "--bands", "wavelength:"],
    ["frequency-usage", "--bands", "quantiles:x"],
    ["frequency-usage", "--bands", "quantiles:0"],
    ["attention-sinks", "--bands", "context:abc"],
    ["band-statistics", "--bands", "octaves"],
    ["pe-geometry", "--base", "1"],
    ["pe-geometry", "--d", "7"],
    ["pe-geometry", "--n-pos", "1"],
    ["pe-geometry", "--d", "1000000000"],
    ["variant-frequencies", "--variant", "warp:3"],
    ["knockout", "--heads", "x"],
    ["knockout", "--heads", ","],
    # each variant with too many values: the message shows that variant's form and example
    *(
        ["variant-frequencies", "--variant", f"{name}:{':'.join(['1'] * 9)}"]
        for name in (
            "default",
            "prope",
            "propereversed",
            "propepartial",
            "nope",
            "basechange",
            "planemask",
            "linear",
            "ntk",
            "dynamicntk",
            "yarn",
            "llama3",
            "longrope",
            "resonance",
            "cope",
            "fopezero",
        )
    ),
]


@pytest.mark.parametrize("argv", HINTED, ids=[" ".join(a) for a in HINTED])
def test_every_suggested_example_is_accepted(argv, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    message = fails(_argv(*argv), tmp_path, capsys)
    examples = _examples(message)
    assert examples, f"no example in: {message}"
    for flag, value in examples:
        got = fails(_argv(argv[0], flag, value), tmp_path, capsys)
        assert got.startswith(NO_MODEL), f"the example {flag} {value} of {argv} is refused: {got}"


def test_the_hints_table_covers_every_example_written_in_the_cli():
    """A new "e.g. --flag" in a command's message needs a row in HINTED (its example then gets
    tested)."""
    written = {
        m for f in CLI.glob("*.py") for m in re.findall(r"e\.g\. (--[a-z][\w-]*)", f.read_text())
    }
    tested = {a[1] for a in HINTED}
    assert written <= tested, f"untested examples of {sorted(written - tested)}"


def test_variant_examples_parse_to_every_variant():
    """Each variant the CLI knows has an example, and it parses to that variant."""
    from ropelens.cli.variant_syntax import VARIANT_EXAMPLES, _variant_classes, parse_variant

    classes = _variant_classes()
    assert set(VARIANT_EXAMPLES) == set(classes)
    for name, example in VARIANT_EXAMPLES.items():
        assert isinstance(parse_variant(example), classes[name]), example


def test_band_examples_parse():
    from ropelens.spec.bands import Bands

    for spec in ("quantiles:4", "wavelength:10,100,1000", "context:2"):
        assert Bands.parse(spec, flag="--bands").describe().startswith(spec.split(":")[0])


# --------------------------------------------------------------------------------- numbers in specs
@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (
            ["attention-by-distance", "--bands", "wavelength:10,x"],
            "--bands: bad band spec 'wavelength:10,x': 'x' is not a finite number: write "
            "wavelength:E1,E2,... with E strictly increasing wavelengths in tokens, e.g. --bands "
            "wavelength:10,100,1000",
        ),
        (
            ["attention-by-distance", "--bands", "context:abc"],
            "--bands: bad band spec 'context:abc': 'abc' is not a finite number: write "
            "context[:FACTOR] with FACTOR a positive number, e.g. --bands context:2",
        ),
        (["attention-by-distance", "--bands", "context:nan"], "'nan' is not a finite number"),
        (
            ["attention-by-distance", "--bands", "quantiles:2.5"],
            "--bands: bad band spec 'quantiles:2.5': '2.5' is not an integer: write quantiles:N "
            "or quantiles:<=N (fewer bands in a layer with fewer planes) with N a positive "
            "integer, e.g. --bands quantiles:4",
        ),
        (
            ["variant-frequencies", "--variant", "prope:x"],
            "--variant 'prope:x': bad P 'x': P must be a number: write prope:P or by name "
            "(p=VALUE), e.g. --variant prope:0.75",
        ),
        (
            ["variant-frequencies", "--variant", "yarn:abc:2048"],
            "--variant 'yarn:abc:2048': bad FACTOR 'abc': FACTOR must be a number: "
            "write yarn:FACTOR:[ORIGINAL_MAX_POSITION]:",
        ),
        (
            ["variant-frequencies", "--variant", "yarn:4:2k"],
            "bad ORIGINAL_MAX_POSITION '2k': ORIGINAL_MAX_POSITION must be an integer",
        ),
        (
            ["variant-frequencies", "--variant", "longrope:1,x:1,2:2048"],
            "--variant 'longrope:1,x:1,2:2048': bad SHORT_FACTOR 'x' in '1,x': SHORT_FACTOR must "
            "be a comma-separated list of numbers",
        ),
        (
            ["variant-frequencies", "--variant", "yarn:4:2048:32:1:none:none:none:true:9"],
            "--variant 'yarn:4:2048:32:1:none:none:none:true:9': yarn takes 1 to 8 value(s) "
            "after the name, got 9: write yarn:FACTOR:",
        ),
        (
            ["variant-frequencies", "--variant", "yarn:4:2048:32:1:none:none:none:maybe"],
            "bad TRUNCATE 'maybe': TRUNCATE must be true or false",
        ),
        (
            ["passkey-retrieval", "--variant", "linear:0"],
            "--variant 'linear:0': factor must be > 0, got 0.0",
        ),
    ],
)
def test_numbers_in_specs_name_the_flag_token_and_syntax(argv, expected, tmp_path, capsys):
    got = fails(_argv(*argv), tmp_path, capsys)
    assert expected in got and "could not convert" not in got and "invalid literal" not in got


def test_optional_variant_values_take_none():
    """An optional value left at its default (to set a later one) is written none."""
    from ropelens.cli.variant_syntax import parse_variant

    v = parse_variant("yarn:4:2048:32:1:none:none:1.2")
    assert v.mscale is None and v.attention_factor == 1.2


# ------------------------------------------------------------------------------------- pe-geometry
@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (
            ["--n-pos", "1"],
            "--n-pos 1: the similarity by distance needs at least 2 positions: pass --n-pos 2 or "
            "more",
        ),
        (
            ["--d", "7"],
            "--d 7 must be even: sinusoidal embeddings pair a sine and a cosine per frequency: "
            "e.g. --d 8",
        ),
        (["--base", "0"], "--base 0 must be a finite number > 1"),
        (["--base", "inf"], "--base inf must be a finite number > 1"),
        (["--base", "nan"], "--base nan must be a finite number > 1"),
        (
            ["--d", "1000000000"],
            "--d 1,000,000,000 at --n-pos 512 (the n × d sinusoidal table) needs about",
        ),
    ],
)
def test_pe_geometry_names_its_flags(argv, expected, tmp_path, capsys):
    got = fails(["pe-geometry", *argv], tmp_path, capsys)
    assert got.startswith(expected)
    assert not re.search(r"(?<!-)\b(n_pos|d|base) must", got)


# ------------------------------------------------------------------------------------- --longrope
NEEDS = (
    "a JSON object with target_len and original_ctx (token counts, target_len > "
    "original_ctx), factors"
)


@pytest.fixture
def extend(tiny_dir, tmp_path):
    """``extend(file)``: the message of ``ropelens extension-study`` on the tiny Llama (8 planes,
    context 256) with --longrope."""
    model = str(tiny_dir("llama"))

    def run(longrope: Path, capsys) -> str:
        return fails(
            [
                "extension-study",
                model,
                "--to",
                "512",
                "--longrope",
                str(longrope),
                "--out",
                str(tmp_path / "ext"),
            ],
            tmp_path,
            capsys,
        )

    return run


def _factors(tmp_path: Path, name: str, content: str | dict) -> Path:
    f = tmp_path / name
    f.write_text(content if isinstance(content, str) else json.dumps(content))
    return f


GOOD = {"target_len": 512, "original_ctx": 256, "factors": [1, 1, 1, 1, 2, 2, 2, 2], "n_hat": 0}


@pytest.mark.parametrize(
    ("name", "content", "expected"),
    [
        ("missing.json", None, "does not exist: check the path, or pass " + NEEDS),
        ("folder", "dir", "is a directory: pass " + NEEDS),
        ("bad.json", "not json", "is not JSON (Expecting value at line 1): pass " + NEEDS),
        ("list.json", "[1, 2]", "holds a JSON list, not an object: pass " + NEEDS),
        (
            "usage.json",
            {"type": "FrequencyUsage", "format": 1},
            "holds a 'FrequencyUsage' result, not LongRopeSearch",
        ),
        (
            "nohat.json",
            {k: v for k, v in GOOD.items() if k != "n_hat"},
            "lacks n_hat: pass " + NEEDS,
        ),
        ("extra.json", {**GOOD, "scale": 2}, "has unknown keys scale: pass " + NEEDS),
        (
            "text.json",
            {**GOOD, "factors": [1, "x"]},
            "factors must be a non-empty list of positive numbers, got 2 "
            "entries, 1 of them not positive numbers (first 'x')",
        ),
        (
            "empty.json",
            {**GOOD, "factors": []},
            "factors must be a non-empty list of positive numbers, got an empty list",
        ),
        (
            "ints.json",
            {**GOOD, "original_ctx": 256.5},
            "original_ctx must be an integer ≥ 1, got 256.5",
        ),
        ("order.json", {**GOOD, "target_len": 128}, "target_len 128 must exceed original_ctx 256"),
    ],
)
def test_longrope_file_problems_are_one_line(name, content, expected, extend, tmp_path, capsys):
    path = tmp_path / name
    if content == "dir":
        path.mkdir()
    elif content is not None:
        _factors(tmp_path, name, content)
    got = extend(path, capsys)
    assert got.startswith(f"the LongRoPE factors file {path} (--longrope)") and expected in got


def test_longrope_factors_must_fit_the_model_and_the_study(extend, tmp_path, capsys):
    """Checked once the model has loaded and before any cell runs: nothing is written."""
    got = extend(_factors(tmp_path, "short.json", {**GOOD, "factors": [1, 2]}), capsys)
    assert got == (
        "the LongRoPE search (--longrope) holds 2 factors but layer 0 has 8 rotary planes: pass "
        "factors searched on this model, one per plane"
    )
    got = extend(_factors(tmp_path, "other.json", {**GOOD, "target_len": 1024}), capsys)
    assert (
        "the LongRoPE search is for 256 → 1024 tokens, the study for 256 → 512" in got
        and "--longrope" in got
    )


def test_a_hand_written_factors_file_loads(tmp_path):
    from ropelens.analyses.extension_planes import LongRopeSearch

    s = LongRopeSearch.load(_factors(tmp_path, "good.json", GOOD))
    assert (
        s.factors == (1, 1, 1, 1, 2, 2, 2, 2) and s.variant.long_factor == (1.0,) * 4 + (2.0,) * 4
    )


# ---------------------------------------------------------------------------------- adjusted values
SMALL = tuple(f"Document {i}: the cat sat on the mat and looked at the dog. " * 3 for i in range(6))


@pytest.fixture
def small_corpus(tmp_path):
    """A corpus file of about 1 kB (the tiny tokenizer makes one token per character)."""
    folder = tmp_path / "corpus"
    folder.mkdir()
    for i, d in enumerate(SMALL):
        (folder / f"{i}.txt").write_text(d)
    return folder


def test_tokens_past_the_corpus_are_measured_with_one_note(
    tiny_dir, small_corpus, tmp_path, capsys
):
    """--tokens the corpus falls short of: all of it is measured, one note says so, the JSON says
    what was used."""
    argv = [
        "frequency-usage",
        str(tiny_dir("llama")),
        "--corpus",
        str(small_corpus),
        "--n-ctx",
        "32",
        "--json",
    ]
    assert main([*argv, "--tokens", "1500"]) == 0
    captured = capsys.readouterr()
    out = json.loads(captured.out)
    assert (
        out["n_ctx"] == 32
        and out["n_tokens"] == 32 * out["n_windows"]
        and out["n_windows"] < 1500 // 32
    )
    assert _notes(captured.err) == [
        "ropelens: note: --tokens 1,500 asks for 46 windows of 32 tokens but corpus "
        f"'text-files' holds {out['n_windows']}: measured all {out['n_windows']} "
        f"({out['n_tokens']:,} tokens)"
    ]
    assert (
        main(argv) == 0
    )  # the default --tokens (32,768) is past this corpus too: measured, noted as the default
    assert _notes(capsys.readouterr().err)[0].startswith(
        "ropelens: note: the default --tokens 32,768 asks for"
    )


def test_tokens_no_corpus_could_hold_are_refused_with_the_maximum(
    tiny_dir, small_corpus, tmp_path, capsys
):
    got = fails(
        [
            "attention-sinks",
            "no-such-model",
            "--corpus",
            str(small_corpus),
            "--n-ctx",
            "32",
            "--tokens",
            "1000000",
        ],
        tmp_path,
        capsys,
    )
    from ropelens.run.data import load_corpus

    corpus = load_corpus(str(small_corpus))
    size = sum(len(d.encode()) for d in corpus.documents)
    most = 2 * (size + 2 * corpus.n_documents) // 31
    assert got == (
        f"--tokens 1,000,000 is more than corpus {corpus.name!r} can hold: its {size:,} bytes of "
        f"text make at most {most:,} windows of --n-ctx 32 with any tokenizer: pass --tokens "
        f"{most * 32} or fewer, or a larger --corpus"
    )
    # the maximum it names passes the check (and is noted, then measured on what the corpus holds)
    assert fails(
        [
            "attention-sinks",
            "no-such-model",
            "--corpus",
            str(small_corpus),
            "--n-ctx",
            "32",
            "--tokens",
            str(most * 32),
        ],
        tmp_path,
        capsys,
    ).startswith(NO_MODEL)


@pytest.mark.parametrize("command", ["head-taxonomy", "prope-sweep", "knockout"])
def test_tokens_no_corpus_could_hold_are_refused(command, tmp_path, capsys):
    got = fails(
        [command, "no-such-model", "--n-ctx", "64", "--tokens", "6400000000"], tmp_path, capsys
    )
    assert got.startswith("--tokens 6,400,000,000 is more than corpus 'english")
    assert got.endswith("or fewer, or a larger --corpus")
    most = int(re.search(r"pass --tokens (\d+) or fewer", got).group(1))
    assert fails(
        [command, "no-such-model", "--n-ctx", "64", "--tokens", str(most)], tmp_path, capsys
    ).startswith(NO_MODEL)


def _small(monkeypatch):
    from ropelens.cli import common as cli_common
    from ropelens.run import data

    small = data.Corpus("small", SMALL, "test")
    monkeypatch.setattr(data, "load_corpus", lambda spec=None, **_: small)
    monkeypatch.setattr(data, "english", lambda: small)
    # the command line resolves --corpus with the name it imported
    monkeypatch.setattr(cli_common, "load_corpus", lambda spec=None, **_: small)


def test_windows_past_the_corpus_are_noted(tiny_dir, monkeypatch, capsys):
    _small(monkeypatch)
    path = str(tiny_dir("llama"))
    assert main(["head-taxonomy", path, "--n-ctx", "32", "--tokens", "1280", "--json"]) == 0
    captured = capsys.readouterr()
    out = json.loads(captured.out)
    assert out["n_windows"] < 40 and out["n_ctx"] == 32
    assert _notes(captured.err) == [
        f"ropelens: note: --tokens 1,280 asks for 40 windows of 32 tokens but corpus 'small' "
        f"holds {out['n_windows']}: measured all {out['n_windows']} "
        f"({out['n_windows'] * 32:,} tokens)"
    ]
    assert (
        main(["prope-sweep", path, "--n-ctx", "32", "--tokens", "256", "--p", "1", "--json"]) == 0
    )
    captured = capsys.readouterr()
    out = json.loads(captured.out)
    assert out["windows"] < 8
    assert _notes(captured.err) == [
        f"ropelens: note: --tokens 256 asks for 8 windows of 32 tokens but corpus "
        f"'small[val]' holds {out['windows']}: measured all {out['windows']} "
        f"({out['windows'] * 32:,} tokens)"
    ]


def test_top_k_past_the_heads_ablates_all_with_one_note(tiny_dir, capsys):
    path = str(tiny_dir("llama"))  # 2 layers of 4 heads
    assert (
        main(
            [
                "retrieval-heads",
                path,
                "--lengths",
                "300",
                "--depths",
                "0.5",
                "--trials",
                "1",
                "--top-k",
                "1000",
                "--json",
            ]
        )
        == 0
    )
    captured = capsys.readouterr()
    out = json.loads(captured.out)
    assert out["top_k"] == 8 and len(out["heads"]) == 8
    assert _notes(captured.err) == [
        "ropelens: note: --top-k 1,000 is more than the model's 8 rotary heads: ablated all 8"
    ]


def test_text_past_the_context_is_cut_with_one_note(tiny_dir, capsys):
    path = str(tiny_dir("llama"))  # context 256; one token per character
    assert (
        main(["attention-decomposition", path, "--text", "x" * 300, "--layers", "0", "--json"]) == 0
    )
    captured = capsys.readouterr()
    out = json.loads(captured.out)
    assert out["n_tokens"] == 256 and out["input"] == "text (first 256 of 301 tokens)"
    assert _notes(captured.err) == [
        "ropelens: note: --text is 301 tokens, longer than the model's trained context of 256: "
        "decomposed its first 256"
    ]
    assert (
        main(["attention-decomposition", path, "--text", "x" * 20, "--layers", "0", "--json"]) == 0
    )
    captured = capsys.readouterr()
    assert json.loads(captured.out)["n_tokens"] == 21 and not _notes(captured.err)


# ------------------------------------------------------------------------------------- compare
@pytest.fixture(scope="module")
def report(tiny, tmp_path_factory):
    from ropelens.report import build_report

    return build_report(
        tiny("llama"),
        tokens=32,
        n_ctx=16,
        out=tmp_path_factory.mktemp("report") / "a",
        progress=False,
    )


def _damaged(report: Path, tmp_path: Path, table: str, edit) -> Path:
    b = Path(shutil.copytree(report, tmp_path / "b"))
    f = b / f"{table}.csv"
    f.write_text(edit(f.read_text()))
    return b


def _lines(text: str, n: int) -> str:
    return "".join(text.splitlines(True)[:n])


def _set_last_field(text: str, row: int, value: str) -> str:
    lines = text.splitlines(True)
    lines[row] = lines[row].rsplit(",", 1)[0] + f",{value}\n"
    return "".join(lines)


@pytest.mark.parametrize(
    ("table", "edit", "expected"),
    [
        (
            "energy",
            lambda t: t[: len(t) // 2 + 7],
            "energy.csv is truncated or damaged: row {row} (line {line}) has 5 of the header's 6 "
            "fields",
        ),
        (
            "energy",
            lambda t: t.rstrip("\n")[:-2],
            "energy.csv is truncated: its last row (row 128, line 129) ends without a newline, "
            "so it was cut short",
        ),
        (
            "energy",
            lambda t: _lines(t, 127),
            "energy.csv is truncated: its last rows (which k, scope no_sink, layer 1, head 3) "
            "lack bands Q3, Q4 (lowest) that the rest of layer 1 has (its last row is row 126)",
        ),
        (
            "band_statistics",
            lambda t: _lines(t, 17),
            "band_statistics.csv is truncated: it has no rows for layer 1 though the report "
            "measured layers 0, 1 (its last row is row 16)",
        ),
        (
            "energy",
            lambda t: "\n".join(
                ",".join(c for i, c in enumerate(r.split(",")) if i != 5) for r in t.split("\n")
            ),
            "energy.csv lacks the column energy_share (its header: which, scope, layer, head, "
            "band)",
        ),
        (
            "band_statistics",
            lambda t: t.replace("layer,", "lyr,", 1),
            "band_statistics.csv lacks the column layer",
        ),
        (
            "energy",
            lambda t: _set_last_field(t, 3, "abc"),
            "energy.csv: column energy_share holds 'abc' at row 3, not a number",
        ),
        (
            "head_taxonomy",
            lambda t: t.replace("False", "maybe", 1),
            "head_taxonomy.csv: column positional holds 'maybe' at row 1, not True or False",
        ),
        ("energy", lambda t: "", "energy.csv is empty (no header row)"),
    ],
)
def test_compare_names_the_damaged_file(table, edit, expected, report, tmp_path, capsys):
    b = _damaged(report, tmp_path, table, edit)
    rows = (b / f"{table}.csv").read_text().splitlines()
    row = len(rows) - 1
    before = tree(report)
    got = fails(["compare", str(report), str(b), "--out", str(tmp_path / "cmp")], tmp_path, capsys)
    assert (
        got.startswith(str(b / f"{table}.csv"))
        and "write the report again with `ropelens report`" in got
    )
    assert expected.format(row=row, line=row + 1) in got
    assert tree(report) == before
