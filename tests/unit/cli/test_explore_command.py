"""``ropelens explore``: the band mixer page of a text, a file or the corpus, and its refusals."""

from __future__ import annotations

import gzip
import json
import re

import pytest
import torch

from ropelens import Bands
from ropelens.analyses import attention_decomposition, frequency_usage, head_taxonomy
from ropelens.cli import main
from ropelens.loading.models import load_model


def page_data(path) -> dict:
    html = path.read_text(encoding="utf-8")
    m = re.search(r"<script type='application/json' id='ropelens-data'>(.*?)</script>", html)
    return json.loads(m.group(1).replace("<\\/", "</"))


def one_error(capsys) -> str:
    captured = capsys.readouterr()
    lines = [line for line in captured.err.splitlines() if line.startswith("ropelens: error:")]
    assert captured.out == "" and "Traceback" not in captured.err, captured.err
    assert len(lines) == 1, captured.err
    return lines[0].removeprefix("ropelens: error: ")


def test_text_page_matches_the_library(tiny_dir, tmp_path, capsys):
    """--text, --layers and --bands reach the page as attention_decomposition + explore build it."""
    model_dir = str(tiny_dir("llama"))
    out = tmp_path / "page.html"
    text = "The cat sat on the mat, and then the cat sat on the mat again."
    argv = ["explore", model_dir, "--text", text, "--layers", "1", "--bands", "quantiles:2"]
    assert main([*argv, "--out", str(out), "--json", "--no-verify"]) == 0
    summary = json.loads(capsys.readouterr().out)
    model = load_model(model_dir, device="cpu")
    toks = model.to_tokens(text)
    dec = attention_decomposition(model, toks, bands=Bands.quantiles(2), layers=[1], verify=False)
    want = dec.explore()
    assert summary["out"] == str(out) and summary["bytes"] == out.stat().st_size
    assert summary["n_tokens"] == toks.shape[1] and summary["layers"] == [1]
    assert summary["bands"] == dec.band_names(1)
    assert summary["precision"] == {"1": want.precision[1]}
    got = page_data(out)
    assert got["tokens"] == list(dec.token_text[0])
    assert got["layers"][0]["q"] == page_data_of(want)["layers"][0]["q"]


def page_data_of(mixer) -> dict:
    m = re.search(r"<script type='application/json' id='ropelens-data'>(.*?)</script>", mixer.html)
    return json.loads(m.group(1).replace("<\\/", "</"))


def test_default_input_is_the_corpus_and_files_are_cut_to_n_ctx(tiny_dir, tmp_path, capsys):
    model_dir = str(tiny_dir("llama"))
    out = tmp_path / "corpus.html"
    assert main(["explore", model_dir, "--n-ctx", "48", "--out", str(out), "--quiet"]) == 0
    printed = capsys.readouterr().out
    assert printed.startswith(f"band mixer: {out} (") and "corpus 'english'" in printed
    data = page_data(out)
    assert len(data["tokens"]) == 48 and [e["layer"] for e in data["layers"]] == [0, 1]
    assert [b["name"] for b in data["layers"][0]["bands"]] == [
        "Q1 (highest)",
        "Q2",
        "Q3",
        "Q4 (lowest)",
    ]  # quantiles:4 by default

    text = tmp_path / "long.txt"
    text.write_text("a long text " * 200)
    out2 = tmp_path / "file.html"
    assert (
        main(["explore", model_dir, "--file", str(text), "--n-ctx", "32", "--out", str(out2)]) == 0
    )
    err = capsys.readouterr().err
    assert "ropelens: note: the text is" in err and "the page shows its first 32 (--n-ctx)" in err
    assert len(page_data(out2)["tokens"]) == 32


def test_a_file_is_read_as_the_corpus_reads_text(tiny_dir, tmp_path, capsys):
    """--file decodes as every text file ropelens reads: UTF-8 (a byte-order mark dropped, CRLF
    line ends as \\n), gzip decompressed by its name; its page is the page of the same --text."""
    model_dir = str(tiny_dir("llama"))
    text = "The café sat on the mat.\nThen the café sat again."
    plain = tmp_path / "plain.txt"
    plain.write_bytes(b"\xef\xbb\xbf" + text.replace("\n", "\r\n").encode("utf-8"))
    packed = tmp_path / "packed.txt.gz"
    packed.write_bytes(gzip.compress(text.encode("utf-8")))
    pages = {}
    for name, source in {"text": ["--text", text], "plain": ["--file", str(plain)]}.items():
        out = tmp_path / f"{name}.html"
        assert main(["explore", model_dir, *source, "--out", str(out), "--quiet"]) == 0
        pages[name] = page_data(out)["tokens"]
    out = tmp_path / "packed.html"
    assert main(["explore", model_dir, "--file", str(packed), "--out", str(out), "--quiet"]) == 0
    capsys.readouterr()
    assert pages["plain"] == pages["text"] == page_data(out)["tokens"]
    assert "\ufffd" not in "".join(pages["text"])  # nothing was replaced in decoding


def test_saved_taxonomy_labels_the_heads(tiny_dir, tmp_path, capsys):
    model_dir = str(tiny_dir("llama"))
    model = load_model(model_dir, device="cpu")
    toks = torch.randint(4, 101, (2, 16), generator=torch.Generator().manual_seed(0))
    toks[:, 0] = 1
    tax = head_taxonomy(model, toks, n_ctx=16, n_windows=2, max_offset=2, progress=False)
    tax.with_tau(0.0).save(tmp_path / "tax.json")
    out = tmp_path / "labelled.html"
    argv = ["explore", model_dir, "--text", "hello world", "--taxonomy", str(tmp_path / "tax.json")]
    assert main([*argv, "--out", str(out), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["labelled_heads"] is True
    for entry in page_data(out)["layers"]:
        assert all(label.startswith("positional (") for label in entry["head_labels"])

    frequency_usage(model, toks, progress=False).save(tmp_path / "usage.json")
    argv = ["explore", model_dir, "--taxonomy", str(tmp_path / "usage.json")]
    assert main([*argv, "--out", str(tmp_path / "x.html")]) == 2
    assert "holds a FrequencyUsage, not a head taxonomy" in one_error(capsys)
    assert not (tmp_path / "x.html").exists()


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--out", "{tmp}/page.txt"], "--out {tmp}/page.txt: the page is HTML: name it page.html"),
        (["--file", "{tmp}/missing.txt"], "--file {tmp}/missing.txt is not a file"),
        (
            ["--file", "{tmp}/latin1.txt"],
            "--file {tmp}/latin1.txt is not UTF-8 text (byte 0xe9 at offset 3): re-save it as "
            "UTF-8, e.g. `iconv -f latin1 -t utf-8 in.txt > out.txt`",
        ),
        (["--file", "{tmp}/blank.txt"], "--file {tmp}/blank.txt is empty (no text besides white"),
        (
            ["--text", "  "],
            "--text is empty: pass some text, e.g. --text 'The cat sat on the mat.'",
        ),
        (["--text", ""], "--text was given an empty value '': pass a value or leave the flag out"),
        (["--taxonomy", "{tmp}/missing.json"], "--taxonomy {tmp}/missing.json is not a file"),
        (["--taxonomy", "{tmp}/other.json"], "other.json holds a None result, which ropelens"),
        (["--bands", "quantiles:0"], "--bands"),
        (["--n-ctx", "1"], "--n-ctx"),
    ],
)
def test_bad_input_fails_before_the_model_loads(argv, message, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "other.json").write_text(
        json.dumps({"findings": [], "provenance": {}, "sections": {}})
    )
    (tmp_path / "latin1.txt").write_bytes("café au lait".encode("latin-1"))  # é is byte 3
    (tmp_path / "blank.txt").write_text(" \n\t\n")
    before = set(tmp_path.iterdir())
    fill = {"tmp": tmp_path}
    assert main(["explore", "no-such-model", *(a.format(**fill) for a in argv)]) == 2
    got = one_error(capsys)
    assert message.format(**fill) in got and "cannot load model" not in got
    assert set(tmp_path.iterdir()) == before


def test_unknown_layer_is_named_in_flag_terms(tiny_dir, tmp_path, capsys):
    out = tmp_path / "page.html"
    assert main(["explore", str(tiny_dir("llama")), "--layers", "5", "--out", str(out)]) == 2
    assert "layer 5 out of range: the model has 2 layers" in one_error(capsys)
    assert not out.exists()
