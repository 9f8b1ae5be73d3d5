"""Every way a corpus file reaches ropelens: compressed, piped, a one-object JSON, a folder with a
metadata file beside its rows, and a file that is not UTF-8 — each read, or refused in one line
that names the file and the fix."""

from __future__ import annotations

import gzip
import json
import os
import sys
import threading

import pytest

from ropelens.errors import InputError
from ropelens.run.data import decode_text, load_corpus, read_text_file

ROWS = [{"text": "the first document"}, {"text": "a second, café"}]
JSONL = "".join(json.dumps(r) + "\n" for r in ROWS).encode()
TEXTS = tuple(r["text"] for r in ROWS)


def test_gzip_jsonl_is_read_as_its_rows(tmp_path):
    path = tmp_path / "rows.jsonl.gz"
    path.write_bytes(gzip.compress(JSONL))
    assert load_corpus(str(path)).documents == TEXTS


def test_gzip_text_file_is_read_as_one_document(tmp_path):
    path = tmp_path / "notes.txt.gz"
    path.write_bytes(gzip.compress(b"one document\r\nover two lines"))
    assert load_corpus(str(path)).documents == ("one document\nover two lines",)


def test_zstd_jsonl_is_read_when_zstandard_is_installed(tmp_path):
    zstandard = pytest.importorskip("zstandard")
    path = tmp_path / "rows.jsonl.zst"
    path.write_bytes(zstandard.ZstdCompressor().compress(JSONL))
    assert load_corpus(str(path)).documents == TEXTS


def test_zstd_without_zstandard_says_how_to_install_or_decompress(tmp_path, monkeypatch):
    path = tmp_path / "rows.jsonl.zst"
    path.write_bytes(b"\x28\xb5\x2f\xfd" + JSONL)
    monkeypatch.setitem(sys.modules, "zstandard", None)  # import zstandard now fails
    with pytest.raises(InputError, match=r"pip install zstandard.*zstd -d") as e:
        load_corpus(str(path))
    assert str(path) in str(e.value)


def test_gz_suffix_on_plain_text_is_refused_naming_the_path(tmp_path):
    path = tmp_path / "rows.jsonl.gz"
    path.write_bytes(JSONL)
    with pytest.raises(InputError, match=r"ends in \.gz but is not gzip data"):
        load_corpus(str(path))


def test_one_json_object_with_the_text_field_is_one_document(tmp_path):
    path = tmp_path / "record.json"
    path.write_text(json.dumps({"id": 7, "text": "a single record"}, indent=2))
    assert load_corpus(str(path)).documents == ("a single record",)


def test_one_json_object_without_the_text_field_says_what_it_holds(tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"vocab_size": 100, "hidden": 8}, indent=2))
    with pytest.raises(InputError) as e:
        load_corpus(str(path))
    message = str(e.value)
    assert "\n" not in message
    assert "holds one JSON object (keys: 'vocab_size', 'hidden')" in message
    assert "JSON Lines" in message and str(path) in message


def test_folder_of_jsonl_beside_a_metadata_json_reads_the_rows(tmp_path):
    (tmp_path / "part-0.jsonl").write_bytes(JSONL)
    (tmp_path / "part-1.jsonl").write_text(json.dumps({"text": "third"}) + "\n")
    (tmp_path / "state.json").write_text(json.dumps({"_fingerprint": "abc"}))
    assert load_corpus(str(tmp_path)).documents == (*TEXTS, "third")


def test_named_pipe_is_read(tmp_path):
    pipe = tmp_path / "corpus.fifo"
    os.mkfifo(pipe)

    def feed() -> None:
        with open(pipe, "wb") as f:
            f.write(b"text from a pipe")

    writer = threading.Thread(target=feed)
    writer.start()
    try:
        corpus = load_corpus(str(pipe))
    finally:
        writer.join(timeout=10)
    assert corpus.documents == ("text from a pipe",)


def test_file_descriptor_path_like_dev_stdin_is_read(tmp_path):
    source = tmp_path / "in.txt"
    source.write_text("text on standard input")
    with open(source, "rb") as f:
        stdin_path = f"/proc/self/fd/{f.fileno()}"
        if not os.path.exists(stdin_path):
            pytest.skip("no /proc/self/fd on this system")
        assert load_corpus(stdin_path).documents == ("text on standard input",)


def test_latin1_is_refused_with_the_file_the_offset_and_iconv(tmp_path):
    path = tmp_path / "latin.txt"
    path.write_bytes("un café noir".encode("latin-1"))
    with pytest.raises(InputError) as e:
        load_corpus(str(path))
    message = str(e.value)
    assert message.startswith(f"{path} is not UTF-8 text (byte 0xe9 at offset 6)")
    assert "iconv -f latin1 -t utf-8" in message
    # the same policy for every way a file is read as text
    with pytest.raises(InputError, match="byte 0xe9 at offset 6"):
        read_text_file(path)


def test_latin1_jsonl_gets_the_same_refusal(tmp_path):
    path = tmp_path / "rows.jsonl"
    path.write_bytes('{"text": "café"}\n'.encode("latin-1"))
    with pytest.raises(InputError, match=r"byte 0xe9 at offset 13\): re-save it as UTF-8, e\.g\."):
        load_corpus(str(path))


def test_binary_file_is_refused_with_the_offset_of_its_nul_byte(tmp_path):
    path = tmp_path / "blob.txt"
    path.write_bytes(b"abc\x00def")
    with pytest.raises(InputError, match=r"looks binary \(a NUL byte at offset 3\)"):
        load_corpus(str(path))


def test_decode_text_keeps_utf8_and_normalises_line_ends():
    assert decode_text("\ufeffcafé\r\nend\r".encode(), "x") == "café\nend\n"


def test_missing_path_names_it(tmp_path):
    path = tmp_path / "absent.jsonl.gz"
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_corpus(str(path))


def test_folder_where_a_file_is_expected_is_named(tmp_path):
    with pytest.raises(InputError, match="is a folder where a file was expected"):
        read_text_file(tmp_path)
