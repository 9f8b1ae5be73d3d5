"""A broken HF model directory ends in one line naming the file and the fix, as a broken GGUF file
does: an unknown model_type, no tokenizer, a truncated or missing safetensors shard, weights that do
not match the config (which transformers would otherwise fill with random values), no weights, a
config that is not JSON."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

import ropelens
from ropelens.errors import InputError
from ropelens.loading.hf_dir import safetensors_problem
from tests.unit.cli.test_cli_errors import fails


@pytest.fixture
def broken(tiny_dir, tmp_path):
    """``broken()``: a fresh copy of a tiny Llama directory to break."""

    def make() -> Path:
        dst = tmp_path / "model"
        shutil.rmtree(dst, ignore_errors=True)
        shutil.copytree(tiny_dir("llama"), dst)
        return dst

    return make


def _edit_config(path: Path, **changes) -> None:
    cfg = json.loads((path / "config.json").read_text())
    cfg.update(changes)
    (path / "config.json").write_text(json.dumps(cfg))


def _weights(path: Path) -> Path:
    return next(path.glob("*.safetensors"))


def _refused(path: Path, tmp_path: Path, capsys) -> str:
    return fails(["rope-spec", str(path)], tmp_path, capsys)


def test_unknown_model_type(broken, tmp_path, capsys):
    d = broken()
    _edit_config(d, model_type="frobnicator")
    msg = _refused(d, tmp_path, capsys)
    assert (
        "model_type 'frobnicator', which transformers" in msg
        and "does not know" in msg
        and "--latest" in msg
    )


def test_config_that_is_not_json(broken, tmp_path, capsys):
    d = broken()
    (d / "config.json").write_text('{"model_type": ')
    assert "config.json is not valid JSON" in _refused(d, tmp_path, capsys)


def test_no_tokenizer(broken, tmp_path, capsys):
    d = broken()
    for f in d.iterdir():
        if f.name.startswith(("tokenizer", "special_tokens", "vocab", "merges")):
            f.unlink()
    msg = _refused(d, tmp_path, capsys)
    assert "has no tokenizer ropelens can load" in msg and "tokenizer.save_pretrained(DIR)" in msg


@pytest.mark.parametrize("keep", [4, 0.5])
def test_truncated_safetensors(broken, tmp_path, capsys, keep):
    d = broken()
    f = _weights(d)
    data = f.read_bytes()
    f.write_bytes(data[: keep if isinstance(keep, int) else int(len(data) * keep)])
    msg = _refused(d, tmp_path, capsys)
    assert (
        str(f) in msg and ("truncated" in msg or "too few" in msg) and "save the model again" in msg
    )


def test_whole_safetensors_has_no_problem(tiny_dir):
    assert safetensors_problem(_weights(tiny_dir("llama"))) is None


def test_weights_that_do_not_match_the_config(broken, tmp_path, capsys):
    d = broken()
    cfg = json.loads((d / "config.json").read_text())
    _edit_config(d, intermediate_size=2 * cfg["intermediate_size"])
    msg = _refused(d, tmp_path, capsys)
    assert "do not match its config.json" in msg and "other shapes" in msg and "mlp" in msg
    assert "random values" in msg


def test_a_parameter_the_checkpoint_lacks(broken, tmp_path, capsys):
    d = broken()
    f = _weights(d)
    tensors = load_file(f)
    dropped = sorted(k for k in tensors if "layers.0.self_attn.q_proj" in k)[0]
    del tensors[dropped]
    save_file(tensors, f, metadata={"format": "pt"})
    msg = _refused(d, tmp_path, capsys)
    assert f"not in the checkpoint (first: {dropped})" in msg


def test_no_weights_and_a_missing_shard(broken, tmp_path, capsys):
    d = broken()
    f = _weights(d)
    f.unlink()
    assert "has a config but no weights" in _refused(d, tmp_path, capsys)
    d = broken()
    names = list(load_file(_weights(d)))
    (d / "model.safetensors.index.json").write_text(
        json.dumps(
            {
                "metadata": {},
                "weight_map": {
                    n: ("model-00002-of-00002.safetensors" if i % 2 else _weights(d).name)
                    for i, n in enumerate(names)
                },
            }
        )
    )
    msg = _refused(d, tmp_path, capsys)
    assert (
        "names 2 weight shards and 1 are not in" in msg
        and "model-00002-of-00002.safetensors" in msg
    )


def test_a_whole_directory_still_loads(tiny_dir):
    model = ropelens.load_model(str(tiny_dir("llama")), device="cpu")
    assert ropelens.rope_spec(model).n_layers >= 1
    assert torch.is_tensor(next(model.parameters()))


def test_the_api_raises_the_same_one_line_error(broken):
    d = broken()
    _edit_config(d, model_type="frobnicator")
    with pytest.raises(InputError, match="frobnicator"):
        ropelens.load_model(str(d), device="cpu")
