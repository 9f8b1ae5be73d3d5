"""Inputs too small to measure: refused in one line before the work starts, never answered with NaN
or a tie.

Windows too short for positional/symbolic scoring, lengths too short for Liu et al.'s critical base,
bands that hold no plane, passkey lengths no prompt fits, and a report that fails: each ends in one
``ropelens: error:`` line naming the flag and the fix, exit code 2, and leaves the output folder as
it was. Where a measurement is valid but a part of it is not measurable (a band empty in some layers
only), that part reads NaN (null in JSON, n/a in text), never 1.000.
"""

from __future__ import annotations

import importlib
import json
import math

import pytest
import torch

from ropelens.analyses.attention_decomposition import attention_decomposition
from ropelens.analyses.band_statistics import band_statistics
from ropelens.analyses.base_predictions import (
    MIN_PREDICTION_LENGTH,
    base_predictions,
    critical_base,
)
from ropelens.analyses.positional_symbolic import MIN_KEYS, positional_symbolic, shortest_window
from ropelens.cli import main
from ropelens.errors import InputError
from ropelens.spec.bands import Bands
from ropelens.spec.reading import rope_spec
from tests.unit.cli.test_cli_errors import (  # one line, exit 2, the folder as it was
    fails,
    tree,
)

# the package exports the function under the module's name: the module itself, for its helpers
extension_module = importlib.import_module("ropelens.analyses.extension_study")


# ---------------------------------------------------------------------------------------- possym
def test_shortest_possym_window_is_bos_and_min_keys():
    """A query at i sees the keys 1..i (BOS left out), so only windows of min_keys + 1 tokens hold a
    scored query."""
    assert shortest_window() == MIN_KEYS + 1 == 9
    assert shortest_window(16) == 17


@pytest.mark.parametrize("n_ctx", ["2", "8"])
def test_possym_short_window_is_refused_before_the_model_loads(
    n_ctx, tmp_path, monkeypatch, capsys
):
    monkeypatch.chdir(tmp_path)
    got = fails(
        ["positional-symbolic", "no-such-model", "--n-ctx", n_ctx, "--tokens", "64"],
        tmp_path,
        capsys,
    )
    assert got == (
        f"--n-ctx {n_ctx} is too short for positional/symbolic scoring: a query is scored only "
        "when it sees 8 keys besides BOS, so a window needs 9 tokens: use --n-ctx 9 or more"
    )


def test_possym_api_refuses_windows_too_short_to_score(tiny):
    model = tiny("llama")
    with pytest.raises(
        InputError, match=r"windows of 8 tokens are too short .* at least 9 tokens: pass n_ctx=9"
    ):
        positional_symbolic(model, "english", n_ctx=8, max_tokens=64, progress=False)
    with pytest.raises(
        InputError, match=r"windows of 12 tokens .* at least 17 tokens: pass n_ctx=17"
    ):
        positional_symbolic(model, "english", n_ctx=12, max_tokens=64, min_keys=16, progress=False)
    ready = torch.randint(3, 100, (2, 5))  # ready tokens: their own width counts, not n_ctx
    with pytest.raises(InputError, match="windows of 5 tokens are too short"):
        positional_symbolic(model, ready, progress=False)


def test_possym_at_the_shortest_window_scores_every_head(tiny):
    """The stated minimum is the real one: at 9 tokens every layer has scored queries and no finding
    is NaN."""
    r = positional_symbolic(
        tiny("llama"),
        "english",
        n_ctx=shortest_window(),
        max_tokens=4 * shortest_window(),
        progress=False,
    )
    assert (r.sums["n_queries"] > 0).all()
    for m in ("logit", "attention"):
        p, s = r.scores(m)
        assert p.isfinite().all() and s.isfinite().all()
    assert not any("nan" in f.text for f in r.findings())


def test_possym_refuses_layers_whose_window_is_narrower_than_min_keys(tiny):
    """Gemma's sliding layers (window 8 in the tiny model) never show a query 9 keys: refused, not
    NaN."""
    with pytest.raises(
        InputError, match=r"layer\(s\) \[0, 1, 2\] let a query see at most 8 keys .*\(min_keys=9\)"
    ):
        positional_symbolic(
            tiny("gemma3"), "english", n_ctx=32, max_tokens=64, min_keys=9, progress=False
        )


# ------------------------------------------------------------------------------------- predict-base
def test_shortest_prediction_length_is_the_first_above_two_pi():
    assert MIN_PREDICTION_LENGTH == 7 and 6 < 2 * math.pi < 7
    assert math.isfinite(critical_base(256, MIN_PREDICTION_LENGTH, 1e4))
    with pytest.raises(InputError, match="must exceed 2π"):
        critical_base(256, MIN_PREDICTION_LENGTH - 1, 1e4)


@pytest.mark.parametrize(
    ("lengths", "message"),
    [
        (
            "5",
            "length 5 is too short for the base's predictions: Liu et al.'s critical base takes "
            "log(L/2π), defined only for lengths above 2π ≈ 6.28 tokens, so the shortest length "
            "with a critical base is 7: pass lengths of 7 tokens or more (--lengths)",
        ),
        ("2,6,2048", "lengths 2, 6 are too short for the base's predictions"),
    ],
)
def test_predict_base_short_length_is_refused(lengths, message, tiny_dir, tmp_path, capsys):
    got = fails(
        [
            "base-predictions",
            str(tiny_dir("llama")),
            "--lengths",
            lengths,
            "--save",
            str(tmp_path / "p.json"),
        ],
        tmp_path,
        capsys,
    )
    assert got == message if lengths == "5" else message in got


def test_predict_base_at_the_shortest_length_has_a_critical_base(tiny_dir, capsys):
    assert main(["base-predictions", str(tiny_dir("llama")), "--lengths", "7,64", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)["rows"]
    assert [r["length"] for r in rows] == [7, 64]
    assert all(
        isinstance(r["critical_base"], float) and math.isfinite(r["critical_base"]) for r in rows
    )


def test_base_predictions_never_tabulates_nan(tiny):
    with pytest.raises(InputError, match=r"length 4 is too short .* \(--lengths\)"):
        base_predictions(tiny("gemma3"), [4, 256])
    df = base_predictions(tiny("gemma3"), [7, 256]).to_frame()
    assert df["critical_base"].notna().all()


# -------------------------------------------------------------------------------------- empty bands
def test_band_with_no_plane_anywhere_is_refused_naming_it(tiny):
    spec = rope_spec(tiny("llama"))  # wavelengths 6.283 … 19,869 tokens
    with pytest.raises(InputError) as e:
        Bands.by_wavelength([1e9]).require_planes([spec.layers[0], spec.layers[1]])
    assert str(e.value) == (
        "band 'λ∈[1e+09,inf)' of --bands wavelength:1e+09 holds no plane in any of the 2 layers "
        "measured (0, 1), so its band-only statistics cannot be measured: they have 8 planes, "
        "with wavelengths from 6.283 to 1.987e+04 tokens; pass edges inside that range (--bands "
        "wavelength:E1,E2,...), or use --bands quantiles:N"
    )
    with pytest.raises(
        InputError, match=r"band 'never turns within 256000' of --bands context:1000 .* context:F"
    ):
        Bands.by_context(factor=1000).require_planes([spec.layers[0]])
    Bands.quantiles(4).require_planes(spec.layers)  # every band holds planes: nothing to say


@pytest.mark.parametrize(
    "command",
    [
        ["band-statistics", "--n-ctx", "16", "--tokens", "32"],
        ["attention-decomposition", "--text", "hello there"],
    ],
)
def test_empty_band_is_refused_by_the_commands(command, tiny_dir, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    name, *rest = command
    got = fails(
        [name, str(tiny_dir("llama")), *rest, "--bands", "wavelength:1e9"], tmp_path, capsys
    )
    assert got.startswith("band 'λ∈[1e+09,inf)' of --bands wavelength:1e+09 holds no plane")


def test_band_statistics_refuses_an_empty_band_before_the_model_runs(tiny, monkeypatch):
    import ropelens.run.measure

    def ran(*_a, **_k):
        raise AssertionError("the model ran before the band spec was checked")

    # measure() runs the probe by the name its own module imported
    monkeypatch.setattr(ropelens.run.measure, "verification", ran)
    with pytest.raises(InputError, match="holds no plane"):
        band_statistics(
            tiny("llama"),
            "english",
            n_ctx=16,
            max_tokens=32,
            bands=Bands.by_wavelength([1e9]),
            progress=False,
        )


def test_band_empty_in_some_layers_is_not_measurable_there(tiny, tiny_dir, capsys):
    """Tiny Gemma: λ ≥ 1e5 holds planes in the global layer 3 only. Its band-only agreement is
    measured there and NaN in the sliding layers, where its all-zero logits would tie every key and
    read 1.000."""
    bands = Bands.by_wavelength([1e5])
    st = band_statistics(
        tiny("gemma3"), "english", n_ctx=16, max_tokens=32, bands=bands, jsd=True, progress=False
    )
    assert st.measurable().tolist() == [[True, False]] * 3 + [[True, True]]
    for values in (st.top1(), st.jsd()):
        assert (
            values[:3, :, 1].isnan().all()
            and values[3].isfinite().all()
            and values[:, :, 0].isfinite().all()
        )
    assert not any("nan" in f.text.lower() for f in st.findings())
    frame = st.to_frame()
    assert frame[frame.layer < 3].groupby("band", sort=False).top1.apply(
        lambda s: s.isna().all()
    ).tolist() == [False, True]

    dec = attention_decomposition(tiny("gemma3"), "The cat sat on the mat.", bands=bands)
    for layer, empty in ((0, True), (3, False)):
        agree = dec.agreement(layer)
        other = agree[agree.band == "λ∈[100000,inf)"]
        assert other.top1.isna().all() == empty and other.jsd.isna().all() == empty

    model = str(tiny_dir("gemma3"))
    assert (
        main(
            [
                "band-statistics",
                model,
                "--bands",
                "wavelength:1e5",
                "--n-ctx",
                "16",
                "--tokens",
                "32",
                "--json",
            ]
        )
        == 0
    )
    rows = json.loads(capsys.readouterr().out)["rows"]
    assert [r["top1"] is None for r in rows if r["band"] == "λ∈[100000,inf)"] == [
        True,
        True,
        True,
        False,
    ]
    assert (
        main(
            [
                "band-statistics",
                model,
                "--bands",
                "wavelength:1e5",
                "--n-ctx",
                "16",
                "--tokens",
                "32",
            ]
        )
        == 0
    )
    table = [
        line.split() for line in capsys.readouterr().out.splitlines() if "λ∈[100000,inf)" in line
    ]
    assert [row[-1] for row in table][:3] == ["n/a"] * 3 and table[3][-1] != "n/a"
    assert (
        main(
            [
                "attention-decomposition",
                model,
                "--bands",
                "wavelength:1e5",
                "--text",
                "The cat sat on the mat.",
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert "|  n/a" in out and "1.000" not in out


# -------------------------------------------------------------------------------------- knockout
# knockout measures each effect over windows of --n-ctx cut from --tokens: it needs two
KNOCKOUT_SMALL = ["--heads", "0.1", "--metrics", "loss", "--doses", "0,8", "--random", "2"]
KNOCKOUT_SMALL += ["--controls", "2", "--boot", "100", "--no-whole-head", "--json", "--quiet"]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (
            ["--tokens", "32", "--n-ctx", "32"],
            "--tokens 32 with --n-ctx 32 makes 1 window; knockout needs at least 2: pass --tokens "
            "64 or more, or --n-ctx 16 or less",
        ),
        (
            ["--tokens", "95", "--n-ctx", "64"],
            "--tokens 95 with --n-ctx 64 makes 1 window; knockout needs at least 2: pass --tokens "
            "128 or more, or --n-ctx 47 or less",
        ),
        (
            ["--tokens", "16", "--n-ctx", "32"],
            "--tokens 16 with --n-ctx 32 makes 0 windows; knockout needs at least 2: pass --tokens "
            "64 or more, or --n-ctx 8 or less",
        ),
        (  # no shorter window holds two: a window is at least 2 tokens
            ["--tokens", "3", "--n-ctx", "2"],
            "--tokens 3 with --n-ctx 2 makes 1 window; knockout needs at least 2: pass --tokens 4 "
            "or more",
        ),
        (  # the command's default --tokens (8 windows of 256) is not what the user typed
            ["--n-ctx", "4096"],
            "the default --tokens 2048 with --n-ctx 4096 makes 0 windows; knockout needs at least "
            "2: pass --tokens 8192 or more, or --n-ctx 1024 or less",
        ),
    ],
)
def test_knockout_counts_the_windows_its_tokens_make(argv, message, tmp_path, monkeypatch, capsys):
    """The window count is said in the flags the user typed, never as ``--tokens 1``."""
    monkeypatch.chdir(tmp_path)
    assert fails(["knockout", "no-such-model", *argv], tmp_path, capsys) == message


@pytest.mark.parametrize(
    "argv", [["--tokens", "64", "--n-ctx", "32"], ["--tokens", "32", "--n-ctx", "16"]]
)
def test_knockout_runs_on_the_windows_its_refusal_suggests(argv, tiny_dir, capsys):
    """Both fixes the refusal of ``--tokens 32 --n-ctx 32`` names make two windows, and knockout
    measures every row over them."""
    assert main(["knockout", str(tiny_dir("llama")), *argv, *KNOCKOUT_SMALL]) == 0
    rows = json.loads(capsys.readouterr().out)["rows"]
    assert rows and {row["n_windows"] for row in rows} == {2}


# ---------------------------------------------------------------------------------------- extend
@pytest.mark.parametrize(
    ("lengths", "message"),
    [
        (
            "5",
            "--passkey-lengths: passkey length 5 is too short: the task line, the needle and the "
            "question alone take ",
        ),
        ("300,8", "--passkey-lengths: passkey length 8 is too short"),
        (
            "1",
            "each passkey length must be >= 2, got 1 (--passkey-lengths: prompt lengths in tokens)",
        ),
        ("100000000", "a passkey prompt of 100,000,000 tokens needs about"),
    ],
)
@pytest.mark.parametrize("existing", [False, True])
def test_extend_checks_passkey_lengths_before_any_cell(
    lengths, message, existing, tiny_dir, tmp_path, monkeypatch, capsys
):
    """Before the fix the loss phase ran first and left its cells in --out; now nothing runs and
    nothing is written."""

    def measured(*_a, **_k):
        raise AssertionError("a cell was measured before --passkey-lengths was checked")

    extension_module = importlib.import_module("ropelens.analyses.extension_study")
    monkeypatch.setattr(extension_module, "_measure", measured)
    out = tmp_path / "study"
    if existing:
        out.mkdir()
        (out / "notes.txt").write_text("kept")
    got = fails(
        [
            "extension-study",
            str(tiny_dir("llama")),
            "--to",
            "512",
            "--passkey-lengths",
            lengths,
            "--out",
            str(out),
        ],
        tmp_path,
        capsys,
    )
    assert message in got
    if lengths == "5":
        assert got.endswith(
            "(or pass --passkey-lengths none to skip passkey; passkey_lengths=[] in Python)"
        )
    assert out.exists() == existing and (not existing or tree(out) == {"notes.txt"})


# ---------------------------------------------------------------------------------------- report
@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--layers", "9"], "layer 9 out of range: the model has 2 layers (0..1)"),
        (
            ["--bands", "wavelength:1e9"],
            "band 'λ∈[1e+09,inf)' of --bands wavelength:1e+09 holds no plane",
        ),
    ],
)
@pytest.mark.parametrize("out", ["new/report", "existing"])
def test_failed_report_leaves_the_output_folder_as_it_was(
    argv, message, out, tiny_dir, tmp_path, monkeypatch, capsys
):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "existing").mkdir()
    got = fails(
        ["report", str(tiny_dir("llama")), "--quick", "--out", str(tmp_path / out), *argv],
        tmp_path,
        capsys,
    )
    assert got.startswith(message)
    assert not (tmp_path / "new").exists() and (tmp_path / "existing").is_dir()


def test_report_that_fails_while_writing_removes_only_what_it_created(tiny, tmp_path, monkeypatch):
    from ropelens.report import build

    def broken(*_a, **_k):
        raise OSError("disk full")

    monkeypatch.setattr(build, "_render_page", broken)
    for out in (tmp_path / "new" / "sub" / "report", tmp_path / "kept"):
        if out.name == "kept":
            out.mkdir()
            (out / "old.txt").write_text("from before")
        with pytest.raises(OSError, match="disk full"):
            build.build_report(tiny("llama"), tokens=32, n_ctx=16, out=out, progress=False)
    assert not (tmp_path / "new").exists()  # the folders the report made are gone
    assert tree(tmp_path / "kept") == {"old.txt"}  # a folder that existed stays, with its files


def test_report_check_creates_nothing(tmp_path):
    from ropelens.report.build import check_output_dir

    assert check_output_dir(tmp_path / "a" / "b") == tmp_path / "a" / "b"
    assert list(tmp_path.iterdir()) == []
    (tmp_path / "file").write_text("x")
    with pytest.raises(
        NotADirectoryError, match=r"file is a file, not a directory\): choose a writable output"
    ):
        check_output_dir(tmp_path / "file" / "r")
