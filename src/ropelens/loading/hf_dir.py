"""An HF model directory checked as a GGUF file is: a fault in it is one line naming the file and
the fix.

transformers reports a broken directory with a traceback from deep inside its loader (an unknown
``model_type``, a truncated safetensors shard), and loads some faults without any error at all:
weights whose shapes do not match the config, or parameters the checkpoint lacks, come out
randomly initialised, which would give numbers about a model nobody trained. :func:`load_hf_dir`
checks what can be checked before loading (the config, the tokenizer, every safetensors file's
header against its size, the shards an index names) and refuses a model whose weights did not all
load as the checkpoint holds them.
"""

from __future__ import annotations

import json
import logging
import struct
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from ropelens.errors import InputError
from ropelens.spec.reading import refuse_bad_base

__all__ = ["check_hf_dir", "load_hf_dir", "safetensors_problem"]


def _first_line(e: BaseException) -> str:
    text = str(e).strip() or type(e).__name__
    return text.splitlines()[0]


def safetensors_problem(file: Path) -> str | None:
    """What is wrong with a safetensors file's framing, read from its header alone (no tensor is
    loaded): a header cut short, a header that is not JSON, or tensors that end past the end of the
    file; None if it is whole."""
    size = file.stat().st_size
    with file.open("rb") as f:
        head = f.read(8)
        if len(head) < 8:
            return (
                f"{file} has {size} bytes, too few for a safetensors header (it is truncated "
                "or empty)"
            )
        (n,) = struct.unpack("<Q", head)
        if 8 + n > size:
            return (
                f"{file} is truncated: its header alone should be {n:,} bytes and the file "
                f"holds {size:,}"
            )
        try:
            header = json.loads(f.read(n))
        except (UnicodeDecodeError, json.JSONDecodeError):
            return f"{file} is not a safetensors file (its header is not JSON)"
    ends = [
        int(v["data_offsets"][1])
        for k, v in header.items()
        if k != "__metadata__"
        and isinstance(v, dict)
        and isinstance(v.get("data_offsets"), list)
        and len(v["data_offsets"]) == 2
    ]
    need = 8 + n + max(ends, default=0)
    if need > size:
        return f"{file} is truncated: its tensors need {need:,} bytes and the file holds {size:,}"
    return None


def check_hf_dir(path: Path) -> None:
    """Raise InputError naming the fault in HF model directory ``path`` that can be seen before
    loading: no or unreadable config.json, a ``model_type`` this transformers does not know, no
    weights, a missing or truncated safetensors shard."""
    import transformers

    cfg_file = path / "config.json"
    if not cfg_file.is_file():
        raise InputError(
            f"{path} is a directory without config.json: pass an HF model directory (config.json + "
            "weights + tokenizer)"
        )
    try:
        cfg = json.loads(cfg_file.read_text())
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise InputError(
            f"{cfg_file} is not valid JSON ({_first_line(e)}): restore it, e.g. with "
            "config.save_pretrained(DIR)"
        ) from None
    if not isinstance(cfg, dict):
        raise InputError(f"{cfg_file} holds {type(cfg).__name__}, not a config object: restore it")
    from transformers import CONFIG_MAPPING

    model_type = cfg.get("model_type")
    if not model_type:
        raise InputError(
            f"{cfg_file} has no model_type: ropelens cannot tell which family this model is; "
            "save the config with config.save_pretrained(DIR)"
        )
    if model_type not in CONFIG_MAPPING:
        raise InputError(
            f"{cfg_file} has model_type {model_type!r}, which transformers "
            f"{transformers.__version__} does not know: check the spelling, or install a "
            "transformers release with this family (bash scripts/setup.sh --latest)"
        )
    for section in (cfg, cfg.get("text_config")):  # a base the loading itself would trip over
        if isinstance(section, dict):
            refuse_bad_base(SimpleNamespace(**section), str(cfg_file))
    index = path / "model.safetensors.index.json"
    if index.is_file():
        try:
            shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        except (UnicodeDecodeError, json.JSONDecodeError, KeyError, TypeError, AttributeError) as e:
            raise InputError(
                f"{index} is not a safetensors index ({_first_line(e)}): restore it or save the "
                "model again with model.save_pretrained(DIR)"
            ) from None
        missing = [s for s in shards if not (path / s).is_file()]
        if missing:
            raise InputError(
                f"{index} names {len(shards)} weight shards and {len(missing)} are not in {path} "
                f"(first: {missing[0]}): copy the whole model directory"
            )
        files = [path / s for s in shards]
    else:
        files = sorted(path.glob("*.safetensors"))
    if not files and not any(
        any(path.glob(p)) for p in ("*.bin", "*.pt", "*.pth", "*.ckpt", "*.msgpack", "*.h5")
    ):
        raise InputError(
            f"{path} has a config but no weights (no *.safetensors or *.bin file): copy the "
            "weights too, or save the model with model.save_pretrained(DIR)"
        )
    for f in files:
        problem = safetensors_problem(f)
        if problem:
            raise InputError(f"{problem}: download or save the model again")


@contextmanager
def _quiet_loading_report() -> Iterator[None]:
    """transformers' load report (a table on stderr) is folded into ropelens's one line instead."""
    loggers = [
        logging.getLogger(n)
        for n in (
            "transformers.modeling_utils",
            "transformers.utils.loading_report",
            "transformers.distributed.tensor_parallel",
        )
    ]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(logging.ERROR)
    try:
        yield
    finally:
        for lg, level in zip(loggers, levels, strict=True):
            lg.setLevel(level)


def _not_loaded(path: Path, info: dict[str, Any]) -> str | None:
    """The weights of ``path`` that did not load as the checkpoint holds them, in words; None when
    all did."""
    mismatched, missing = info.get("mismatched_keys") or [], info.get("missing_keys") or []
    if not mismatched and not missing:
        return None
    parts = []
    if mismatched:
        name, ckpt, model = next(iter(sorted(mismatched, key=lambda m: m[0])))
        parts.append(
            f"{len(mismatched)} weights have other shapes than its config gives (first: {name}, "
            f"{list(ckpt)} in the checkpoint, {list(model)} from config.json)"
        )
    if missing:
        parts.append(
            f"{len(missing)} parameters the config's model needs are not in the checkpoint "
            f"(first: {sorted(missing)[0]})"
        )
    unexpected = info.get("unexpected_keys") or []
    if unexpected:
        parts.append(f"{len(unexpected)} checkpoint weights the model does not use")
    return (
        f"the weights in {path} do not match its config.json: {'; '.join(parts)}. transformers "
        "would fill them with random values; pass the config the weights were saved with"
    )


def load_hf_dir(path: Path, dtype, placement: dict[str, Any] | None = None):
    """``(model, tokenizer)`` of HF model directory ``path`` (eager attention), or InputError naming
    its fault."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    check_hf_dir(path)
    try:
        tok = AutoTokenizer.from_pretrained(path)
    except Exception as e:
        raise InputError(
            f"{path} has no tokenizer ropelens can load ({_first_line(e)[:200]}): save it next "
            "to the weights with tokenizer.save_pretrained(DIR)"
        ) from None
    if tok is None or isinstance(tok, bool):
        raise InputError(
            f"{path} has no tokenizer: save it next to the weights with "
            "tokenizer.save_pretrained(DIR)"
        )
    try:
        with _quiet_loading_report():
            model, info = AutoModelForCausalLM.from_pretrained(
                path,
                dtype=dtype,
                attn_implementation="eager",
                output_loading_info=True,
                ignore_mismatched_sizes=True,
                **(placement or {}),
            )
    except (OSError, ValueError, KeyError, RuntimeError, TypeError) as e:
        raise InputError(
            f"transformers cannot load the model in {path}: {_first_line(e)[:300]}"
        ) from None
    except Exception as e:  # safetensors' own error derives from Exception only
        if type(e).__name__ != "SafetensorError":
            raise
        raise InputError(
            f"the weights in {path} cannot be read ({_first_line(e)}): download or save the model "
            "again"
        ) from None
    problem = _not_loaded(path, info)
    if problem:
        raise InputError(problem)
    return model, tok
