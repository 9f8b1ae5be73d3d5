"""Checkpoints along a training run: one HF model directory per step, each loadable by
``ropelens.load_model``.

A trained model's vocabulary is the corpus's tokens relabelled 0 … vocab − 1 (see
:mod:`ropelens.training.train`), so each checkpoint carries the tokenizer with its ids permuted the
same way: the corpus's tokens get the model's ids and every other token an id past the model's
vocabulary. The segmentation is the original tokenizer's; text of the training corpus tokenises to
exactly the ids the model was trained on, and a model and its checkpoint give the same logits. Text
with tokens the corpus never used is outside the model's vocabulary: measure a checkpoint on its own
training corpus.

Each checkpoint is ``step-NNNNNN/`` (the optimiser steps taken, zero-padded) holding the weights,
config, tokenizer and ``ropelens-train.json`` (the training config, the step and the losses so far);
it is written into a temporary directory and renamed into place, so a killed run leaves only whole
checkpoints.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from ropelens.errors import InputError
from ropelens.loading.checkpoints import INFO_FILE, checkpoint_name, read_info, step_of
from ropelens.results.provenance import git_commit, versions
from ropelens.results.serialize import atomic_write_text

__all__ = [
    "INFO_FILE",
    "CheckpointWriter",
    "checkpoint_name",
    "plain_rope_theta",
    "read_info",
    "step_of",
]


def _permuted_tokenizer_json(text: str, used: Tensor) -> str:
    """A tokenizers JSON whose ids are permuted: ``used[i]`` → i, every other id after them in
    order."""
    d = json.loads(text)
    vocab = d["model"].get("vocab")
    if not isinstance(vocab, dict):
        raise InputError(
            f"the {d['model'].get('type')} tokenizer keeps no token → id table: ropelens can save "
            "checkpoints only for tokenizers that do (BPE, WordLevel, WordPiece)"
        )
    ids = {int(i) for i in vocab.values()} | {int(a["id"]) for a in d.get("added_tokens", [])}
    used_ids = [int(i) for i in used.tolist()]
    if not set(used_ids) <= ids:
        raise InputError(
            "the corpus uses token ids the tokenizer does not have: rebuild the token streams"
        )
    rest = sorted(ids - set(used_ids))
    new = {old: i for i, old in enumerate([*used_ids, *rest])}
    d["model"]["vocab"] = {tok: new[int(i)] for tok, i in vocab.items()}
    for a in d.get("added_tokens", []):
        a["id"] = new[int(a["id"])]
    post = d.get("post_processor") or {}
    for proc in [post, *post.get("processors", [])]:
        for special in (proc.get("special_tokens") or {}).values():
            if isinstance(special, dict) and "ids" in special:
                special["ids"] = [new[int(i)] for i in special["ids"]]
    return json.dumps(d, ensure_ascii=False)


class CheckpointWriter:
    """Writes ``step-NNNNNN/`` checkpoints of one training run into ``directory``.

    ``every``: a checkpoint at step 0 (the initialisation), every ``every`` steps and at the last
    step. ``tokenizer``: the run's tokenizer; ``used``: the original id of each model id (the
    corpus's tokens). ``rope_theta``: the base the saved config states, whose plain-RoPE frequencies
    must be the model's.
    """

    def __init__(
        self,
        directory: str | os.PathLike[str],
        every: int,
        *,
        tokenizer: Any,
        used: Tensor,
        config: dict[str, Any],
        rope_theta: float,
    ) -> None:
        self.directory = Path(directory)
        self.every = int(every)
        self.config = config
        self.rope_theta = float(rope_theta)
        self.directory.mkdir(parents=True, exist_ok=True)
        self._tokenizer_dir = Path(tempfile.mkdtemp(prefix=".tokenizer-", dir=self.directory))
        tokenizer.save_pretrained(self._tokenizer_dir)
        tj = self._tokenizer_dir / "tokenizer.json"
        if not tj.is_file():
            raise InputError(
                f"the tokenizer {type(tokenizer).__name__} saves no tokenizer.json: checkpoints "
                "need a fast (tokenizers) tokenizer"
            )
        atomic_write_text(tj, _permuted_tokenizer_json(tj.read_text(), used))
        self.written: list[Path] = []

    def steps(self, total: int) -> list[int]:
        """The steps a run of ``total`` steps saves: 0, every, 2·every, …, and ``total``."""
        return sorted({*range(0, total + 1, self.every), total})

    def save(self, model: Any, step: int, losses: Sequence[float]) -> Path:
        """Write the checkpoint of ``model`` after ``step`` steps (replacing one of that name)."""
        final = self.directory / checkpoint_name(step)
        tmp = self.directory / f".tmp-{final.name}-{uuid.uuid4().hex[:8]}"
        try:
            params = dict(model.config.rope_parameters or {})
            model.config.rope_parameters = {
                **params,
                "rope_type": "default",
                "rope_theta": self.rope_theta,
            }
            model.save_pretrained(tmp)
            for f in self._tokenizer_dir.iterdir():
                shutil.copy2(f, tmp / f.name)
            info = {
                "step": int(step),
                "steps": self.config.get("steps"),
                "config": self.config,
                "losses": [float(x) for x in losses],
                "versions": versions(),
                "commit": git_commit(),
            }
            atomic_write_text(tmp / INFO_FILE, json.dumps(info, indent=1))
            if final.exists():
                shutil.rmtree(final)
            os.replace(tmp, final)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        self.written.append(final)
        return final

    def close(self) -> None:
        """Remove the run's scratch tokenizer directory."""
        shutil.rmtree(self._tokenizer_dir, ignore_errors=True)


def plain_rope_theta(inv_freq: Tensor, head_dim: int, candidates: Sequence[float]) -> float | None:
    """The first base in ``candidates`` whose plain RoPE (HF's default rotary) has exactly
    ``inv_freq``, or None."""
    for base in candidates:
        plain = 1.0 / (base ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))
        if plain.shape == inv_freq.shape and torch.equal(plain, inv_freq.float()):
            return float(base)
    return None
