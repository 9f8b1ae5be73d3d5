"""What every claim's protocol shares on one model: the budget, the RoPE reading, the head sets
(found once, read by every claim that needs them) and the windows."""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

import torch

from ropelens.claims.result import BUDGETS
from ropelens.claims.rows import find_heads, head_sets
from ropelens.errors import InputError
from ropelens.spec.reading import rope_spec

__all__ = ["BUDGET_SETTINGS", "Budget", "ClaimContext", "budget"]


@dataclass(frozen=True)
class Budget:
    """How much a claims run measures.

    Attributes:
        name (str): ``"quick"``, ``"standard"`` or ``"thorough"``.
        n_windows (int): Windows (text windows, random-token windows or passkey prompts) per
            claim.
        n_draws (int): Draws per control (the p floor is 1 / (1 + n_draws)).
        probe_ctx (int): Tokens of the positional probe's random-token windows.
        text_ctx (int): Tokens of a text window.
        prompt_len (int): Tokens of a passkey prompt.
        taxonomy_windows (int): Text windows the head sets are found on.
        taxonomy_ctx (int): Their tokens.
        row_tokens (int): Batch rows × tokens per forward of a knockout.
        n_boot (int): Bootstrap resamples of a CI.
    """

    name: str
    n_windows: int
    n_draws: int
    probe_ctx: int
    text_ctx: int
    prompt_len: int
    taxonomy_windows: int
    taxonomy_ctx: int
    row_tokens: int
    n_boot: int = 2000


BUDGET_SETTINGS = {
    "quick": Budget("quick", 4, 39, 16, 64, 128, 2, 128, 4096),
    "standard": Budget("standard", 8, 49, 16, 128, 256, 4, 256, 8192),
    "thorough": Budget("thorough", 16, 99, 16, 128, 256, 8, 256, 8192),
}


def budget(name: str) -> Budget:
    """The settings of budget ``name``."""
    if name not in BUDGET_SETTINGS:
        raise InputError(
            f"budget must be one of {', '.join(BUDGETS)}, got {name!r} (quick: minutes on a CPU; "
            "thorough: 99 draws per control, 16 windows)"
        )
    return BUDGET_SETTINGS[name]


class ClaimContext:
    """One model under test, its budget and what claims share: the RoPE reading, the head sets
    and the held-out text windows, each computed once on first use.

    Args:
        model: The loaded model (:func:`ropelens.load_model`, :func:`ropelens.testing.tiny_model`).
        budget (Budget): The budget's settings.
        seed (int): Seed of every draw.
    """

    def __init__(self, model: Any, budget: Budget, seed: int = 0) -> None:
        self.model = model
        self.budget = budget
        self.seed = int(seed)
        self.spec = rope_spec(model)

    @property
    def name(self) -> str:
        """The model's name as loaded."""
        return str(getattr(getattr(self.model, "cfg", None), "model_name", None) or "model")

    @functools.cached_property
    def prompt_len(self) -> int:
        """Tokens of a passkey prompt: the budget's, or the shortest of 1.25×, 1.5×, ... that holds
        the task line, the needle and the question in this model's tokenizer (a character-level
        tokenizer needs more)."""
        from ropelens.analyses.passkey_retrieval import make_passkey, passkey_prompt

        n = self.budget.prompt_len
        for _ in range(16):
            try:
                passkey_prompt(self.model.tokenizer, n, 0.5, make_passkey(self.seed, 0))
                return n
            except InputError:
                n = int(n * 1.25)
        raise InputError(
            f"no passkey prompt of up to {n} tokens fits this model's tokenizer: the claims that "
            "copy a passkey cannot run on it"
        )

    @functools.cached_property
    def found(self) -> dict[str, Any]:
        """Positional heads, band content shares and retrieval scores
        (:func:`ropelens.claims.rows.find_heads`)."""
        b = self.budget
        return find_heads(
            self.model, b.taxonomy_windows, b.taxonomy_ctx, self.prompt_len, self.seed, self.spec
        )

    @functools.cached_property
    def head_sets(self) -> dict[str, dict[str, Any]]:
        """The knockouts' head sets (:func:`ropelens.claims.rows.head_sets`): positional,
        retrieval, semantic (10 heads), and per layer kind where the model has two."""
        return head_sets(self.spec, self.found, 10)

    @functools.cached_property
    def text_windows(self) -> torch.Tensor:
        """``[n_windows, text_ctx]`` held-out windows of the embedded English corpus."""
        from ropelens.run import data

        _, val = data.english().split()
        return data.windows(val, self.model, self.budget.text_ctx, n_windows=self.budget.n_windows)

    def has_layer_kinds(self) -> bool:
        """Whether the model has local (sliding-window) and global layers."""
        return len({self.spec[L].window is not None for L in self.spec.rotary_layers}) == 2
