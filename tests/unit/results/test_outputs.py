"""What ropelens writes is what the name asks for, or it refuses before anything runs.

A result saved as ``.json.gz`` is gzip-compressed JSON that loads back; another format's suffix is
refused. A write that fails names the caller's path, never a temp file. A PNG larger than the
exporter draws is refused with the limit. ``--figure`` writes the format its suffix names and
refuses others (and the file ``--save`` writes) before the model loads. A report written into an
earlier report's folder replaces that report whole; a ``figures`` file there is refused before the
model loads.
"""

from __future__ import annotations

import gzip
import json
import struct

import pytest
import torch

import ropelens
from ropelens.analyses import frequency_usage
from ropelens.cli import main
from ropelens.cli.common import check_figure_path
from ropelens.errors import InputError
from ropelens.plots.export import export_unavailable
from ropelens.report import build as build_module

needs_browser = pytest.mark.skipif(
    export_unavailable() is not None, reason=str(export_unavailable())
)


@pytest.fixture(scope="module")
def usage(tiny):
    tokens = torch.randint(4, 100, (2, 16), generator=torch.Generator().manual_seed(0))
    return frequency_usage(tiny("llama"), tokens, progress=False)


# ---------------------------------------------------------------------------------- result files
def test_a_json_gz_result_is_gzip_compressed_json_that_loads_back(usage, tmp_path):
    plain, packed = tmp_path / "u.json", tmp_path / "u.json.gz"
    usage.save(plain)
    usage.save(packed)
    raw = packed.read_bytes()
    assert raw[:2] == b"\x1f\x8b", "a gzip file opens with 1f 8b"
    assert gzip.decompress(raw) == plain.read_bytes()  # the same JSON, compressed
    assert len(raw) < len(plain.read_bytes()) / 2
    back = ropelens.load_result(packed)
    assert json.loads(gzip.decompress(raw)) == json.loads(plain.read_text())
    assert torch.equal(back.token[("q", "all")].total, usage.token[("q", "all")].total)
    assert type(usage).load(packed).layers == usage.layers


@pytest.mark.parametrize(
    ("name", "named"),
    [
        ("u.csv", "not csv: name the file u.json (or u.json.gz"),
        ("u.csv.gz", "not csv: name the file u.json (or u.json.gz"),
        ("u.json.xz", "not xz: name the file u.json.json (or u.json.json.gz"),
        ("figure.png", "not png: name the file figure.json (or figure.json.gz"),
    ],
)
def test_another_formats_suffix_is_refused_naming_the_file_to_pass(usage, tmp_path, name, named):
    with pytest.raises(InputError) as caught:
        usage.save(tmp_path / name)
    assert str(caught.value).startswith(f"{tmp_path / name}: a FrequencyUsage result")
    assert named in str(caught.value)
    assert list(tmp_path.iterdir()) == []


def test_a_write_that_fails_names_the_callers_path_not_a_temp_file(usage, tmp_path):
    path = tmp_path / ("u" * 251 + ".json")  # 256 characters: longer than a name may be
    with pytest.raises(OSError) as caught:
        usage.save(path)
    message = str(caught.value)
    assert message == f"cannot write {path} (File name too long): choose another path"
    assert ".tmp" not in message
    assert list(tmp_path.iterdir()) == []
    longest = tmp_path / ("u" * 250 + ".json")  # 255: a temp name beside it must still fit
    usage.save(longest)
    assert [p.name for p in tmp_path.iterdir()] == [longest.name]


@needs_browser
def test_a_figure_that_cannot_be_written_names_the_callers_path(usage, tmp_path):
    path = tmp_path / ("f" * 252 + ".svg")  # 256 characters
    with pytest.raises(OSError) as caught:
        usage.save_figure(path)
    assert str(caught.value) == f"cannot write {path} (File name too long): choose another path"
    assert list(tmp_path.iterdir()) == []


def test_a_png_of_16000_pixels_a_side_is_refused_with_the_limit(usage, tmp_path):
    path = tmp_path / "usage.png"
    with pytest.raises(InputError) as caught:
        usage.save_figure(path, width=16_000, height=16_000)
    assert str(caught.value).startswith(f"{path}: a PNG of 32,000 × 32,000 pixels")
    assert "at most 65,535 pixels a side and 268,435,456 in all" in str(caught.value)
    assert not path.exists()


# ---------------------------------------------------------------------------------- --figure
def _intervention(*flags: str) -> list[str]:
    return ["intervention-effect", "no-such-model", "--variant", "prope:0.5", *flags]


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (
            ("--figure", "{dir}/fig.gif"),
            "--figure {dir}/fig.gif: the suffix chooses the figure's format, and '.gif' is not "
            "one of .html, .png, .pdf, .svg: name it fig.html (or .png, .pdf, .svg)",
        ),
        (
            ("--figure", "{dir}/fig"),
            "--figure {dir}/fig: the suffix chooses the figure's format, and a name without one "
            "is not one of .html, .png, .pdf, .svg: name it fig.html",
        ),
        (
            ("--save", "{dir}/fig.png", "--figure", "{dir}/fig.png"),
            "--save {dir}/fig.png: a ropelens result is written as JSON, not png",
        ),
        (
            ("--save", "{dir}/effect.csv"),
            "--save {dir}/effect.csv: a ropelens result is written as JSON, not csv",
        ),
    ],
)
def test_figure_and_save_paths_are_refused_before_the_model_loads(tmp_path, capsys, flags, message):
    """The model named does not exist: a refusal that came after loading would name it."""
    argv = _intervention(*(f.format(dir=tmp_path) for f in flags))
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"ropelens: error: {message.format(dir=tmp_path)}")
    assert err.count("\n") == 1 and "no-such-model" not in err
    assert list(tmp_path.iterdir()) == []


def test_save_and_figure_on_one_file_are_refused(tmp_path):
    path = tmp_path / "effect.html"
    with pytest.raises(InputError) as caught:
        check_figure_path(str(path), save=str(tmp_path / "." / "effect.html"))
    assert str(caught.value) == (
        f"--save and --figure both name {path}: the one would overwrite the other; pass two "
        "files, such as --save effect.json --figure effect.html"
    )
    assert check_figure_path(str(path), save=str(tmp_path / "effect.json")) == path


@needs_browser
def test_figure_writes_the_format_its_suffix_names(family_dir, tmp_path, capsys):
    corpus = tmp_path / "docs.txt"
    corpus.write_text("The river rose slowly over the stone bridge while the town slept. " * 40)
    png, html = tmp_path / "effect.png", tmp_path / "effect.html"
    common = ["--corpus", str(corpus), "--n-ctx", "32", "--tokens", "64", "--quiet", "--json"]
    args = ["intervention-effect", str(family_dir("llama")), "--variant", "prope:0.5", *common]
    assert main([*args, "--figure", str(png)]) == 0
    assert main([*args, "--figure", str(html)]) == 0
    capsys.readouterr()
    data = png.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and data[12:16] == b"IHDR"
    width, height = struct.unpack(">II", data[16:24])
    assert width > 500 and height > 300 and len(data) > 10_000
    page = html.read_text()
    assert page.lstrip().lower().startswith(("<!doctype html>", "<html")) and "plotly" in page


# ---------------------------------------------------------------------------------- the report
@pytest.fixture(scope="module")
def report_inputs(tiny, tmp_path_factory):
    """The data and sections of a quick report on the tiny Llama, to write again and again."""
    seen = {}
    real = build_module.render_sections

    def keep(data, progress=False):
        seen["data"] = data
        seen["sections"] = real(data, progress)
        return seen["sections"]

    mp = pytest.MonkeyPatch()
    mp.setattr(build_module, "render_sections", keep)
    try:
        build_module.build_report(
            tiny("llama"), tokens=64, n_ctx=32, quick=True, progress=False,
            out=tmp_path_factory.mktemp("first") / "out",
        )  # fmt: skip
    finally:
        mp.undo()
    return seen["data"], seen["sections"]


def _files(folder) -> set[str]:
    return {str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file()}


@needs_browser
def test_a_report_written_over_an_earlier_one_leaves_none_of_its_files(report_inputs, tmp_path):
    data, sections = report_inputs
    out = tmp_path / "out"
    build_module._write(out, data, sections, {}, 0.0, figures="svg")
    first = json.loads((out / "report.json").read_text())
    assert (out / "figures").is_dir() and first["figures"]
    (out / "notes.md").write_text("mine")  # not ropelens's: stays
    (out / "stale.csv").write_text("a\n1\n")  # not listed by the earlier report: stays
    report = json.loads((out / "report.json").read_text())
    report["sections"][0]["tables"].append("gone.csv")  # a table the new report does not write
    (out / "report.json").write_text(json.dumps(report))
    (out / "gone.csv").write_text("a\n1\n")

    build_module._write(out, data, sections, {}, 0.0, figures=None)
    second = json.loads((out / "report.json").read_text())
    assert "figures" not in second and not (out / "figures").exists()
    tables = {t for s in second["sections"] for t in s["tables"]}
    assert _files(out) == {"index.html", "report.json", *tables, "notes.md", "stale.csv"}


def test_a_figures_file_is_refused_before_the_model_loads(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "figures").write_text("not a folder")
    if export_unavailable() is not None:
        pytest.skip(export_unavailable())
    with pytest.raises(InputError) as caught:
        build_module.build_report("no-such-model", out=out, figures="svg")
    assert str(caught.value) == (
        f"{out / 'figures'} is a file, and figures='svg' writes the figures into a folder of that "
        f"name: move or remove {out / 'figures'}, or pass another output folder"
    )
    assert _files(out) == {"figures"}


def test_the_report_command_refuses_a_figures_file_before_the_model_loads(tmp_path, capsys):
    out = tmp_path / "out"
    out.mkdir()
    (out / "figures").write_text("not a folder")
    if export_unavailable() is not None:
        pytest.skip(export_unavailable())
    assert main(["report", "no-such-model", "--out", str(out), "--figures", "svg"]) == 2
    err = capsys.readouterr().err
    assert err == (
        f"ropelens: error: {out / 'figures'} is a file, and figures='svg' writes the figures into "
        f"a folder of that name: move or remove {out / 'figures'}, or pass another output "
        "folder\n"
    )
