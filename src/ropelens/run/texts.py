"""Texts as tokens: one BOS policy, ragged texts with their padding marked, and cuts said once.

Every ropelens entry point that turns text into tokens follows one policy, :func:`bos_token_id`:
the tokenizer's BOS first where the tokenizer has one, nothing where it has none. Corpus windows
(:func:`ropelens.run.data.windows`), single texts (:func:`text_tokens`: attention decomposition,
the band mixer) and passkey prompts all start the same text with the same ids, whatever a model's
own ``to_tokens`` would do (TransformerLens prepends no BOS for Qwen models, for one).
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from jaxtyping import Bool, Int
from torch import Tensor

from ropelens.errors import InputError, TruncatedInputWarning

__all__ = ["TextTokens", "bos_token_id", "cut_message", "encode", "text_tokens"]


def bos_token_id(tokenizer: Any) -> int | None:
    """The token every ropelens input starts with: the tokenizer's BOS, or None where it has
    none. ``tokenizer`` is an HF tokenizer or a model with ``.tokenizer``."""
    tok = getattr(tokenizer, "tokenizer", None) or tokenizer
    bos = getattr(tok, "bos_token_id", None)
    return None if bos is None else int(bos)


def encode(tokenizer: Any, text: str) -> list[int]:
    """``text``'s token ids under the BOS policy (:func:`bos_token_id`), uncut."""
    tok = getattr(tokenizer, "tokenizer", None) or tokenizer
    bos = bos_token_id(tok)
    ids = tok(text, add_special_tokens=False, verbose=False)["input_ids"]
    return ([] if bos is None else [bos]) + list(ids)


def cut_message(what: str, n: int, limit: int, verb: str = "decomposed") -> str:
    """The words ropelens says, in Python and on the command line, when ``what`` (``n`` tokens)
    is cut to its first ``limit``."""
    return (
        f"{what} is {n:,} tokens, longer than the model's trained context of {limit:,}: {verb} its "
        f"first {limit:,}"
    )


@dataclass(frozen=True)
class TextTokens:
    """Texts as one right-padded ``[n_texts, pos]`` batch: ``valid`` marks each row's real tokens
    (padding is never counted); ``cuts`` says which texts were cut to the model's context."""

    tokens: Int[Tensor, "batch pos"]
    valid: Bool[Tensor, "batch pos"]
    lengths: tuple[int, ...]
    cuts: tuple[str, ...] = ()

    @property
    def padded(self) -> bool:
        return not bool(self.valid.all())


def _context(model: Any) -> int:
    return int(getattr(getattr(model, "cfg", None), "n_ctx", 0) or 0)


def text_tokens(
    model: Any,
    texts: str | Sequence[str],
    *,
    limit: int | None = None,
    verb: str = "decomposed",
    names: Sequence[str] | None = None,
    warn: bool = True,
) -> TextTokens:
    """``texts`` as tokens under the BOS policy, each cut to ``limit`` tokens (default: the
    model's context), padded on the right with ``valid`` marking the real tokens.

    Every cut is said once per call: a :class:`ropelens.errors.TruncatedInputWarning` naming each
    text cut (``warn=False`` leaves the words in ``.cuts`` for the caller to say, as the command
    line does). ``names``: what each text is called in those words (default ``text`` for one text,
    ``text i`` for several).
    """
    texts = [texts] if isinstance(texts, str) else list(texts)
    if not texts or not all(isinstance(t, str) for t in texts):
        raise InputError(
            "texts must be a string or a non-empty list of strings, e.g. ['The cat sat.']"
        )
    names = list(names) if names is not None else _default_names(len(texts))
    for name, t in zip(names, texts, strict=True):
        if not t.strip():
            raise InputError(f"{name} is empty: pass some text, e.g. 'The cat sat on the mat.'")
    limit = limit if limit is not None else _context(model)
    rows, cuts = [], []
    for name, t in zip(names, texts, strict=True):
        ids = encode(model, t)
        if limit and len(ids) > limit:
            cuts.append(cut_message(name, len(ids), limit, verb))
            ids = ids[:limit]
        rows.append(ids)
    if warn and cuts:
        warnings.warn("; ".join(cuts), TruncatedInputWarning, stacklevel=3)
    return _padded(model, rows, tuple(cuts))


def _default_names(n: int) -> list[str]:
    return ["text"] if n == 1 else [f"text {i}" for i in range(n)]


def _padded(model: Any, rows: list[list[int]], cuts: tuple[str, ...]) -> TextTokens:
    tok = getattr(model, "tokenizer", None) or model
    pad = getattr(tok, "pad_token_id", None)
    pad = 0 if pad is None else int(pad)  # any id: padded positions are never counted
    n = max(len(r) for r in rows)
    tokens = torch.full((len(rows), n), pad, dtype=torch.long)
    valid = torch.zeros((len(rows), n), dtype=torch.bool)
    for i, r in enumerate(rows):
        tokens[i, : len(r)] = torch.tensor(r, dtype=torch.long)
        valid[i, : len(r)] = True
    return TextTokens(tokens, valid, tuple(len(r) for r in rows), cuts)
