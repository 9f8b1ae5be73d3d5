"""Corpora and token windows, with the character-level tiny tokenizer (never a real model)."""

from __future__ import annotations

import hashlib
from types import SimpleNamespace

import pytest
import torch

from ropelens.run import data
from ropelens.run.data import Corpus
from ropelens.testing import tiny_tokenizer


@pytest.fixture(scope="module")
def tok():
    return tiny_tokenizer()


def char_ids(text: str) -> list[int]:
    """The tiny tokenizer's ids, spelled out: 4 specials, then ASCII 32..126, then \\n and \\t."""
    special = {"\n": 99, "\t": 100}
    return [special.get(c, 4 + ord(c) - 32) for c in text]


@pytest.fixture()
def small() -> Corpus:
    return Corpus("small", ("abc", "defg", "hi jk"), "hand-written")


# --------------------------------------------------------------------------------------------
# Corpus
# --------------------------------------------------------------------------------------------
def test_corpus_properties(small):
    assert small.n_documents == 3
    assert small.n_chars == 3 + 4 + 5
    assert small.text == "abc\n\ndefg\n\nhi jk"
    assert "n_documents=3" in repr(small) and "abc" not in repr(small)


def test_corpus_sha256_is_length_prefixed_utf8():
    c = Corpus("c", ("ab", "é"))
    expected = hashlib.sha256(b"2\nab" + b"2\n" + "é".encode()).hexdigest()
    assert c.sha256 == expected
    # Document boundaries change the token stream, so they must change the fingerprint.
    assert Corpus("x", ("ab",)).sha256 != Corpus("x", ("a", "b")).sha256


def test_corpus_accepts_list_and_stores_tuple():
    assert Corpus("c", ["a", "b"]).documents == ("a", "b")  # type: ignore[arg-type]


def test_corpus_rejects_empty_and_non_strings():
    with pytest.raises(ValueError, match="no documents"):
        Corpus("empty", ())
    with pytest.raises(TypeError, match=r"wrap a single text as \(text,\)"):
        Corpus("s", "just a string")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="decode bytes"):
        Corpus("b", (b"bytes",))  # type: ignore[arg-type]


# --------------------------------------------------------------------------------------------
# split
# --------------------------------------------------------------------------------------------
@pytest.fixture()
def many() -> Corpus:
    return Corpus("many", tuple(f"document number {i}" for i in range(50)))


def test_split_is_disjoint_covers_everything_and_keeps_order(many):
    train, val = many.split(0.2, seed=0)
    assert set(train.documents).isdisjoint(val.documents)
    assert sorted(train.documents + val.documents) == sorted(many.documents)
    assert val.n_documents == 10
    index = {d: i for i, d in enumerate(many.documents)}
    for part in (train, val):
        positions = [index[d] for d in part.documents]
        assert positions == sorted(positions)
    assert train.name == "many[train]" and "seed=0" in val.source


def test_split_is_deterministic_and_seed_dependent(many):
    assert many.split(0.2, seed=3) == many.split(0.2, seed=3)
    assert many.split(0.2, seed=0)[1].documents != many.split(0.2, seed=1)[1].documents


def test_split_golden_value_is_machine_independent():
    # Hash-based, so this exact answer must hold on every machine and Python version.
    corpus = Corpus("c", tuple(f"doc {i}" for i in range(10)))
    assert corpus.split(0.1, seed=0)[1].documents == ("doc 0",)
    assert corpus.split(0.3, seed=1)[1].documents == ("doc 1", "doc 2", "doc 8")
    assert corpus.split(0.3, seed=3)[1].documents == ("doc 4", "doc 6", "doc 8")


def test_split_val_never_empty_with_two_documents():
    train, val = Corpus("two", ("a", "b")).split(0.01)
    assert train.n_documents == 1 and val.n_documents == 1
    train, val = Corpus("two", ("a", "b")).split(0.99)
    assert train.n_documents == 1 and val.n_documents == 1


def test_split_errors():
    with pytest.raises(ValueError, match="1 document"):
        Corpus("one", ("a",)).split()
    for bad in (0, 1, 1.5, -0.1):
        with pytest.raises(ValueError, match="strictly between 0 and 1"):
            Corpus("two", ("a", "b")).split(bad)


# --------------------------------------------------------------------------------------------
# built-in corpora
# --------------------------------------------------------------------------------------------
def test_english_is_real_text_and_deterministic():
    corpus = data.english()
    assert corpus.name == "english"
    assert corpus.n_documents > 50 and corpus.n_chars > 200_000
    assert "assert" in corpus.text and " the " in corpus.text
    underlines = [ln for ln in corpus.text.split("\n") if ln and set(ln) <= set("*=-~^#")]
    assert not underlines  # Sphinx heading underlines are dropped
    assert all(d.strip() == d and d for d in corpus.documents)
    fingerprint = corpus.sha256
    data.english.cache_clear()
    again = data.english()
    assert again is not corpus and again == corpus and again.sha256 == fingerprint


def test_english_documents_follow_sorted_topic_keys():
    from pydoc_data.topics import topics

    first = sorted(topics)[0]
    assert data.english().documents[0].split("\n")[0] in topics[first]


def test_python_code_is_real_code_within_the_byte_cap():
    corpus = data.python_code(max_bytes=60_000)
    size = sum(len(d.encode("utf-8")) for d in corpus.documents)
    assert 50_000 < size <= 60_000  # the cap is filled, cut at a line end
    assert "def " in corpus.text and "import " in corpus.text
    assert all(d.endswith("\n") for d in corpus.documents)
    assert corpus.name == "python"
    assert "60,000 bytes" in corpus.source


def test_python_code_default_cap_and_determinism():
    corpus = data.python_code()
    assert sum(len(d.encode("utf-8")) for d in corpus.documents) <= data.DEFAULT_CODE_BYTES
    data.python_code.cache_clear()
    assert data.python_code().sha256 == corpus.sha256


def test_python_code_skips_tests_and_site_packages(tmp_path, monkeypatch):
    lib = tmp_path / "lib"
    for rel, text in {
        "a.py": "def a():\n    return 1\n",
        "pkg/b.py": "def b():\n    return 2\n",
        "pkg/tests/test_b.py": "def test_b(): pass\n",
        "test/test_a.py": "def test_a(): pass\n",
        "site-packages/third/x.py": "THIRD = 1\n",
        "idlelib/idle_test/t.py": "IDLE_TEST = 1\n",
        "pydoc_data/topics.py": "topics = {}\n",
        "encodings/cp1.py": '""" Python Character Mapping Codec generated with gencodec.py."""\n',
        "empty.py": "\n",
    }.items():
        (lib / rel).parent.mkdir(parents=True, exist_ok=True)
        (lib / rel).write_text(text)
    monkeypatch.setattr(data.sysconfig, "get_paths", lambda: {"stdlib": str(lib)})
    data.python_code.cache_clear()
    try:
        corpus = data.python_code(max_bytes=None)
    finally:
        data.python_code.cache_clear()
    assert corpus.documents == ("def a():\n    return 1\n", "def b():\n    return 2\n")


def test_python_code_bad_cap():
    with pytest.raises(ValueError, match="positive int or None"):
        data.python_code(max_bytes=0)


# --------------------------------------------------------------------------------------------
# text files
# --------------------------------------------------------------------------------------------
def test_text_files_single_list_and_directory(tmp_path):
    (tmp_path / "b.txt").write_text("bravo")
    (tmp_path / "a.md").write_text("# alpha")
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "c.txt").write_bytes(b"\xef\xbb\xbfcharlie\r\nline")  # BOM and CRLF
    (tmp_path / "ignored.bin").write_bytes(b"\x00\x01")
    assert data.text_files(tmp_path / "b.txt").documents == ("bravo",)
    assert data.text_files(str(tmp_path / "b.txt")).name == "b.txt"
    both = data.text_files([tmp_path / "b.txt", tmp_path / "a.md"])
    assert both.documents == ("bravo", "# alpha")
    folder = data.text_files(tmp_path)
    assert folder.documents == ("# alpha", "bravo", "charlie\nline")
    assert str(tmp_path / "a.md") in folder.source


def test_text_files_errors_name_the_file_and_the_fix(tmp_path):
    missing = tmp_path / "nope.txt"
    with pytest.raises(FileNotFoundError, match=r"nope\.txt does not exist"):
        data.text_files(missing)
    empty = tmp_path / "empty.txt"
    empty.write_text("  \n\n")
    with pytest.raises(ValueError, match=r"empty\.txt is empty"):
        data.text_files(empty)
    binary = tmp_path / "blob.txt"
    binary.write_bytes(b"PK\x03\x04\x00\x00binary")
    with pytest.raises(ValueError, match=r"blob\.txt looks binary"):
        data.text_files(binary)
    latin = tmp_path / "latin.txt"
    latin.write_bytes("café".encode("latin-1"))
    with pytest.raises(ValueError, match=r"latin\.txt is not UTF-8.*re-save it as UTF-8"):
        data.text_files(latin)
    (tmp_path / "nothing").mkdir()
    with pytest.raises(ValueError, match=r"has no \.txt/\.md files"):
        data.text_files(tmp_path / "nothing")
    with pytest.raises(ValueError, match="no paths given"):
        data.text_files([])


# --------------------------------------------------------------------------------------------
# load_corpus
# --------------------------------------------------------------------------------------------
def test_load_corpus_resolves_names_and_paths(tmp_path):
    assert data.load_corpus() is data.english()
    assert data.load_corpus("english") is data.english()
    assert data.load_corpus("Python") is data.python_code()
    (tmp_path / "t.txt").write_text("hello")
    assert data.load_corpus(str(tmp_path / "t.txt")).documents == ("hello",)
    assert data.load_corpus(tmp_path).documents == ("hello",)


def test_load_corpus_errors_list_the_choices(tmp_path):
    with pytest.raises(ValueError, match=r"unknown corpus 'klingon'.*'english', 'python'"):
        data.load_corpus("klingon")
    with pytest.raises(FileNotFoundError, match=r"does not exist.*'english'"):
        data.load_corpus(str(tmp_path / "missing.txt"))


# --------------------------------------------------------------------------------------------
# token stream and windows
# --------------------------------------------------------------------------------------------
def test_token_stream_joins_documents_with_eos(small, tok):
    expected = char_ids("abc") + [2] + char_ids("defg") + [2] + char_ids("hi jk")
    assert data.token_stream(small, tok).tolist() == expected


def test_token_stream_without_eos_has_no_separator(small):
    no_eos = tiny_tokenizer()
    no_eos.eos_token = None
    assert data.token_stream(small, no_eos).tolist() == char_ids("abcdefghi jk")


def test_windows_prepend_bos(small, tok):
    w = data.windows(small, tok, 5)
    stream = data.token_stream(small, tok)
    assert w.dtype == torch.long and w.shape == (3, 5)  # 14 tokens // 4 text tokens
    assert (w[:, 0] == tok.bos_token_id).all()
    assert w[:, 1:].flatten().tolist() == stream[:12].tolist()


def test_windows_no_bos(small, tok):
    w = data.windows(small, tok, 4, bos="none")
    stream = data.token_stream(small, tok)
    assert w.shape == (3, 4)
    assert (w != tok.bos_token_id).all()
    assert w.flatten().tolist() == stream[:12].tolist()


def test_windows_caps_and_stride(many, tok):
    stream = data.token_stream(many, tok)
    assert data.windows(many, tok, 8, n_windows=3).shape == (3, 8)
    assert data.windows(many, tok, 8, max_tokens=20).shape == (2, 8)
    assert data.windows(many, tok, 8, max_tokens=80, n_windows=3).shape == (3, 8)
    overlap = data.windows(many, tok, 6, bos="none", stride=2, n_windows=4)
    for i in range(4):
        assert overlap[i].tolist() == stream[2 * i : 2 * i + 6].tolist()
    # Stopping tokenization early must not change the windows it returns.
    full = data.windows(many, tok, 8)
    assert torch.equal(data.windows(many, tok, 8, n_windows=5), full[:5])


def test_windows_is_deterministic_and_accepts_a_model(tok):
    corpus = data.english()
    a = data.windows(corpus, tok, 64, n_windows=10)
    b = data.windows(corpus, SimpleNamespace(tokenizer=tok), 64, n_windows=10)
    assert torch.equal(a, b)


def test_windows_errors(small, tok):
    with pytest.raises(ValueError, match=r"has 14 tokens but one window of n_ctx=32.*needs 31"):
        data.windows(small, tok, 32)
    with pytest.raises(ValueError, match="n_ctx must be an int >= 2"):
        data.windows(small, tok, 1)
    with pytest.raises(ValueError, match="bos must be 'prepend' or 'none', got 'append'"):
        data.windows(small, tok, 4, bos="append")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="max_tokens=3 is less than one window"):
        data.windows(small, tok, 4, max_tokens=3)
    with pytest.raises(ValueError, match="n_windows must be an int >= 1"):
        data.windows(small, tok, 4, n_windows=0)
    no_bos = tiny_tokenizer()
    no_bos.bos_token = None
    with pytest.raises(ValueError, match="has no BOS token: use bos='none'"):
        data.windows(small, no_bos, 4)
    with pytest.raises(TypeError, match="expected an HF tokenizer"):
        data.windows(small, object(), 4)
    with pytest.raises(ValueError, match="pass an HF tokenizer explicitly"):
        data.windows(small, SimpleNamespace(tokenizer=None), 4)


def test_the_english_corpus_tokenizes_whole(tok):
    assert data.token_stream(data.english(), tok).numel() > 200_000
