"""``ropelens explore --taxonomy FILE`` labels heads only with a taxonomy of the same model: one
measured on another model (its provenance names another, or the layers and heads differ) is
refused in one line naming the file and both models."""

from __future__ import annotations

import torch

from ropelens.analyses import head_taxonomy
from ropelens.cli import main
from ropelens.loading.models import load_model
from ropelens.testing import tiny_model_dir


def one_error(capsys) -> str:
    captured = capsys.readouterr()
    lines = [line for line in captured.err.splitlines() if line.startswith("ropelens: error:")]
    assert captured.out == "" and "Traceback" not in captured.err, captured.err
    assert len(lines) == 1, captured.err
    return lines[0].removeprefix("ropelens: error: ")


def save_taxonomy(model_dir: str, path, layers=None) -> None:
    """The head taxonomy of the model saved in ``model_dir``, saved to ``path``."""
    model = load_model(model_dir, device="cpu")
    toks = torch.randint(4, 101, (2, 16), generator=torch.Generator().manual_seed(0))
    toks[:, 0] = 1
    tax = head_taxonomy(
        model, toks, n_ctx=16, n_windows=2, max_offset=2, layers=layers, progress=False
    )
    tax.save(path)


def explore(model_dir: str, taxonomy, out) -> int:
    argv = ["explore", model_dir, "--text", "hello world", "--taxonomy", str(taxonomy)]
    return main([*argv, "--out", str(out), "--no-verify"])


def test_taxonomy_of_another_model_is_refused(tiny_dir, tmp_path, capsys):
    llama, gemma = str(tiny_dir("llama")), str(tiny_dir("gemma3"))
    taxonomy = tmp_path / "llama-heads.json"
    save_taxonomy(llama, taxonomy)
    out = tmp_path / "page.html"
    assert explore(gemma, taxonomy, out) == 2
    message = one_error(capsys)
    assert message.startswith(
        f"--taxonomy {taxonomy} was measured on {llama}, this model is {gemma}"
    )
    assert f"ropelens head-taxonomy {gemma} --save FILE.json" in message
    assert not out.exists()

    assert explore(llama, taxonomy, out) == 0  # its own model takes it
    assert out.exists()


def test_model_saved_again_with_other_heads_is_refused(tmp_path, capsys):
    """Same name, other shape: the directory the taxonomy was measured on now holds a model with two
    heads per layer instead of four."""
    model_dir = tiny_model_dir("llama", tmp_path / "model")
    taxonomy = tmp_path / "heads.json"
    save_taxonomy(str(model_dir), taxonomy)
    tiny_model_dir("llama", model_dir, num_attention_heads=2, num_key_value_heads=2)
    assert explore(str(model_dir), taxonomy, tmp_path / "page.html") == 2
    assert one_error(capsys).startswith(
        f"--taxonomy {taxonomy} (measured on {model_dir}) has 4 heads in layer 0, this model "
        f"({model_dir}) has 2: "
    )


def test_model_saved_again_with_fewer_layers_is_refused(tmp_path, capsys):
    """The taxonomy holds layer 3 of a four-layer model; the directory now holds a two-layer one."""
    model_dir = tiny_model_dir("gemma3", tmp_path / "model")
    taxonomy = tmp_path / "heads.json"
    save_taxonomy(str(model_dir), taxonomy, layers=[3])
    tiny_model_dir("llama", model_dir)
    assert explore(str(model_dir), taxonomy, tmp_path / "page.html") == 2
    assert one_error(capsys).startswith(
        f"--taxonomy {taxonomy} (measured on {model_dir}) holds layer 3, this model "
        f"({model_dir}) has 2 layers: "
    )
