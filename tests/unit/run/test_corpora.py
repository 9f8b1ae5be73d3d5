"""Corpora in the forms researchers keep them: lists, HF datasets, JSONL, Parquet, CSV, folders.

The same twelve documents, stored each way, must give the same documents, fingerprint, windows and
analysis as a folder of .txt files (the form whose reading is tested in test_data.py).
"""

from __future__ import annotations

import csv
import json

import datasets
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from ropelens.analyses import FrequencyUsage, frequency_usage
from ropelens.cli import main
from ropelens.errors import InputError
from ropelens.run import data
from ropelens.run.data import Corpus, StreamedCorpus
from ropelens.testing import tiny_model, tiny_tokenizer

DOCS = [
    "The river rose overnight and flooded the lower fields by morning.",
    "She closed the book, turned off the lamp and listened to the rain.",
    "Bread rises because yeast turns sugar into gas and a little alcohol.",
    "The committee postponed its decision until the budget was approved.",
    "A fox crossed the road just as the bus came round the corner.",
    "Most of the town's old houses were built from the same grey stone.",
    "He learned to sail on a small lake before he ever saw the sea.",
    "The museum opens at nine, but the west wing is closed for repairs.",
    "Children in the village walk two miles to reach the nearest school.",
    "After the storm, the fishermen spent a week mending their nets.",
    "The orchestra tuned their instruments while the audience found seats.",
    "Snow fell on the mountain pass, and the road was closed until spring.",
]
N_CTX = 32


@pytest.fixture(scope="module")
def tok():
    return tiny_tokenizer()


def write_forms(root, column: str = "text") -> dict[str, object]:
    """The documents as every supported form; file forms are paths under ``root``."""
    root.mkdir(parents=True, exist_ok=True)
    ds = datasets.Dataset.from_dict({column: DOCS, "id": list(range(len(DOCS)))})
    ds.save_to_disk(str(root / "saved"))
    (root / "docs.jsonl").write_text(
        "".join(json.dumps({"id": i, column: d}) + "\n" for i, d in enumerate(DOCS))
    )
    pq.write_table(pa.table({"id": list(range(len(DOCS))), column: DOCS}), root / "docs.parquet")
    with (root / "docs.csv").open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["id", column])
        writer.writerows(enumerate(DOCS))
    txt = root / "txt"
    txt.mkdir()
    for i, d in enumerate(DOCS):
        (txt / f"doc{i:02d}.txt").write_text(d)
    return {
        "list": list(DOCS),
        "tuple": tuple(DOCS),
        "dataset": ds,
        "split": datasets.DatasetDict({"train": ds})["train"],
        "save_to_disk": str(root / "saved"),
        "jsonl": str(root / "docs.jsonl"),
        "parquet": root / "docs.parquet",
        "csv": str(root / "docs.csv"),
        "txt-folder": str(txt),
    }


@pytest.fixture(scope="module")
def forms(tmp_path_factory):
    return write_forms(tmp_path_factory.mktemp("corpora"))


FORMS = ["list", "tuple", "dataset", "split", "save_to_disk", "jsonl", "parquet", "csv"]


@pytest.mark.parametrize("form", FORMS)
def test_every_form_gives_the_text_files_documents_and_windows(forms, form, tok):
    reference = data.load_corpus(forms["txt-folder"])
    assert reference.documents == tuple(DOCS)  # the text-file corpus, read file by file
    c = data.load_corpus(forms[form])
    assert isinstance(c, Corpus)
    assert c.documents == reference.documents
    assert c.sha256 == reference.sha256  # the fingerprint covers the same text and boundaries
    got = data.windows(c, tok, N_CTX)
    assert torch.equal(got, data.windows(reference, tok, N_CTX))
    # the first window is the first document's text after BOS, not a JSON or CSV record
    assert tok.decode(got[0, 1:]) == DOCS[0][: N_CTX - 1]


def test_glob_and_folder_of_tables(forms, tmp_path):
    for i in range(3):  # three JSONL files of four documents each, read in sorted name order
        rows = DOCS[4 * i : 4 * i + 4]
        (tmp_path / f"part{i}.jsonl").write_text(
            "".join(json.dumps({"text": d}) + "\n" for d in rows)
        )
    (tmp_path / "README.md").write_text("# not a document: a folder of tables reads its tables")
    assert data.load_corpus(tmp_path).documents == tuple(DOCS)
    assert data.load_corpus(str(tmp_path / "part*.jsonl")).documents == tuple(DOCS)
    parts = [tmp_path / f"part{i}.jsonl" for i in range(3)]  # a list of Paths: files, not text
    assert data.load_corpus(parts).documents == tuple(DOCS)


@pytest.fixture(scope="module")
def tiny():
    return tiny_model("llama-gqa")


def usage_arrays(result) -> dict[str, torch.Tensor]:
    return {
        f"{kind}{key}.{part}": getattr(mom, part)
        for kind, moments in (("token", result.token), ("window", result.window))
        for key, mom in moments.items()
        for part in ("count", "total", "total_sq")
    }


def test_every_form_gives_the_same_frequency_usage(forms, tiny):
    kw = {"n_ctx": N_CTX, "max_tokens": None, "progress": False}
    reference = frequency_usage(tiny, forms["txt-folder"], **kw)
    expected = usage_arrays(reference)
    assert (
        reference.provenance.n_windows == data.windows(data.load_corpus(DOCS), tiny, N_CTX).shape[0]
    )
    for form in [*FORMS, "txt-folder"]:
        result = frequency_usage(tiny, forms[form], **kw)
        got = usage_arrays(result)
        assert got.keys() == expected.keys()
        for key, value in expected.items():
            assert torch.equal(got[key], value), (form, key)
        assert result.provenance.corpus_sha256 == reference.provenance.corpus_sha256


def test_text_column_reaches_every_form_and_analysis(tmp_path, tiny, tok):
    forms = write_forms(tmp_path, column="content")
    for form in ["dataset", "save_to_disk", "jsonl", "parquet", "csv"]:
        assert data.load_corpus(forms[form], text_column="content").documents == tuple(DOCS)
    result = frequency_usage(
        tiny, forms["jsonl"], text_column="content", n_ctx=N_CTX, max_tokens=None, progress=False
    )
    assert result.provenance.corpus_sha256 == Corpus("x", tuple(DOCS)).sha256


# --------------------------------------------------------------------------------------------
# a streamed dataset reads only the documents a run needs
# --------------------------------------------------------------------------------------------
def counting_stream(docs):
    pulled = []

    def rows():
        for d in docs:
            pulled.append(d)
            yield {"text": d}

    return datasets.IterableDataset.from_generator(rows), pulled


def docs_needed(tok, n_tokens: int) -> int:
    """The fewest leading documents whose tokens (one EOS between documents) reach ``n_tokens``."""
    total = 0
    for i, d in enumerate(DOCS * 10):
        total += len(tok(d, add_special_tokens=False)["input_ids"]) + (i > 0)
        if total >= n_tokens:
            return i + 1
    raise AssertionError("the documents are too short")


@pytest.mark.parametrize("n_windows", [1, 3, 5])
def test_iterable_dataset_reads_only_the_documents_it_needs(tok, n_windows):
    stream, pulled = counting_stream(DOCS * 10)
    c = data.load_corpus(stream)
    assert isinstance(c, StreamedCorpus) and c.sha256 is None
    got = data.windows(c, tok, N_CTX, n_windows=n_windows)
    need = docs_needed(tok, n_windows * (N_CTX - 1))
    assert len(pulled) == need < len(DOCS) * 10
    assert c.read == tuple((DOCS * 10)[:need])
    assert c.sha256 == Corpus("x", c.read).sha256  # the fingerprint covers what was read
    whole = data.windows(Corpus("all", tuple(DOCS * 10)), tok, N_CTX, n_windows=n_windows)
    assert torch.equal(got, whole)


def test_iterable_dataset_in_an_analysis(tiny):
    stream, pulled = counting_stream(DOCS * 10)
    kw = {"n_ctx": N_CTX, "max_tokens": 2 * N_CTX, "progress": False}
    result = frequency_usage(tiny, stream, **kw)
    assert len(pulled) == docs_needed(tiny.tokenizer, 2 * (N_CTX - 1))
    expected = frequency_usage(tiny, list(DOCS * 10), **kw)
    for key, value in usage_arrays(expected).items():
        assert torch.equal(usage_arrays(result)[key], value), key
    assert result.provenance.corpus_sha256 == Corpus("x", tuple(DOCS[: len(pulled)])).sha256


# --------------------------------------------------------------------------------------------
# errors name the problem and the fix
# --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("empty", ["", "  ", []])
def test_an_empty_corpus_is_refused_not_the_default(empty, tiny):
    with pytest.raises(InputError, match="empty"):
        data.load_corpus(empty)
    with pytest.raises(InputError, match="empty"):
        frequency_usage(tiny, empty, n_ctx=N_CTX, progress=False)


@pytest.mark.parametrize("form", ["dataset", "save_to_disk", "jsonl", "parquet", "csv"])
def test_a_missing_column_names_the_columns_there_are(forms, form):
    with pytest.raises(InputError, match=r"no column 'body' \(its columns: ") as e:
        data.load_corpus(forms[form], text_column="body")
    assert "'id'" in str(e.value) and "'text'" in str(e.value) and "--text-column" in str(e.value)


def test_a_missing_column_of_a_stream_fails_when_windows_are_cut(tok):
    stream, pulled = counting_stream(DOCS)
    c = data.load_corpus(stream, text_column="body")
    with pytest.raises(InputError, match=r"no column 'body' \(its columns: 'text'\)"):
        data.windows(c, tok, N_CTX)
    assert len(pulled) == 1


def test_a_dataset_dict_is_refused_naming_its_splits(tmp_path):
    ds = datasets.Dataset.from_dict({"text": DOCS})
    whole = datasets.DatasetDict({"train": ds, "validation": ds})
    with pytest.raises(InputError, match=r"splits: 'train', 'validation'\): pass one split"):
        data.load_corpus(whole)
    whole.save_to_disk(str(tmp_path / "dd"))
    with pytest.raises(InputError, match=r"'train', 'validation': pass one split's folder"):
        data.load_corpus(tmp_path / "dd")
    assert data.load_corpus(tmp_path / "dd" / "train").documents == tuple(DOCS)


def test_bad_lists_rows_and_columns(tmp_path):
    with pytest.raises(InputError, match="document 1 of the corpus list is empty"):
        data.load_corpus(["A sentence.", " "])
    with pytest.raises(InputError, match="item 1 of the corpus list is a int"):
        data.load_corpus(["A sentence.", 3])
    with pytest.raises(InputError, match="text_column must name a column"):
        data.load_corpus(DOCS, text_column="")
    (tmp_path / "bad.jsonl").write_text('{"text": "fine"}\n{"text": \n')
    with pytest.raises(InputError, match="line 2 of .*bad.jsonl is not JSON"):
        data.load_corpus(tmp_path / "bad.jsonl")
    (tmp_path / "list.jsonl").write_text('{"text": "fine"}\n["not", "an", "object"]\n')
    with pytest.raises(InputError, match="line 2 of .*list.jsonl is a JSON list, not an object"):
        data.load_corpus(tmp_path / "list.jsonl")
    (tmp_path / "array.json").write_text('[{"text": "fine"}, "loose"]')
    with pytest.raises(InputError, match="item 1 of .*array.json is a JSON str, not an object"):
        data.load_corpus(tmp_path / "array.json")
    (tmp_path / "other.json").write_text('[{"text": "fine"}, {"body": "elsewhere"}]')
    with pytest.raises(InputError, match="item 1 of .*other.json"):
        data.load_corpus(tmp_path / "other.json")
    (tmp_path / "num.jsonl").write_text('{"text": "fine", "n": 4}\n')
    with pytest.raises(InputError, match="row 0 of .* holds a int in column 'n'"):
        data.load_corpus(tmp_path / "num.jsonl", text_column="n")
    (tmp_path / "blank.csv").write_text("text\n\n\n")
    with pytest.raises(InputError, match="no text in column 'text'"):
        data.load_corpus(tmp_path / "blank.csv")
    with pytest.raises(InputError, match="matches no text or table file"):
        data.load_corpus(str(tmp_path / "nothing*.parquet"))


def test_empty_rows_are_skipped_and_counted(tmp_path):
    rows = [{"text": DOCS[0]}, {"text": ""}, {"text": None}, {"text": DOCS[1]}]
    (tmp_path / "gaps.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    c = data.load_corpus(tmp_path / "gaps.jsonl")
    assert c.documents == tuple(DOCS[:2]) and "2 empty rows skipped" in c.source


# --------------------------------------------------------------------------------------------
# the command line
# --------------------------------------------------------------------------------------------
def test_cli_reads_a_jsonl_file_with_text_column(tmp_path, tiny_dir, capsys):
    forms = write_forms(tmp_path, column="content")
    argv = ["frequency-usage", str(tiny_dir("llama-gqa")), "--n-ctx", str(N_CTX), "--json"]
    saved = tmp_path / "usage.json"
    column = ["--corpus", forms["jsonl"], "--text-column", "content", "--save", str(saved)]
    assert main([*argv, *column]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["corpus"] == "docs.jsonl"
    n_windows = data.windows(Corpus("x", tuple(DOCS)), tiny_tokenizer(), N_CTX).shape[0]
    assert out["n_windows"] == n_windows  # every window the twelve documents hold
    prov = FrequencyUsage.load(saved).provenance
    assert prov.corpus_sha256 == Corpus("x", tuple(DOCS)).sha256
    assert main([*argv, "--corpus", forms["jsonl"]]) == 2
    err = capsys.readouterr().err
    assert "no column 'text' (its columns: 'id', 'content')" in err and "--text-column" in err


def test_cli_refuses_an_empty_corpus(tiny_dir, capsys):
    assert main(["frequency-usage", str(tiny_dir("llama")), "--corpus", ""]) == 2
    assert "--corpus was given an empty value ''" in capsys.readouterr().err


@pytest.mark.parametrize("command", ["report", "extension-study", "trajectory", "attention-sinks"])
def test_every_corpus_command_takes_text_column(command, capsys):
    assert main([command, "--help"]) == 0
    assert "--text-column" in capsys.readouterr().out
