"""What a capture hands an analysis: one layer's tensors for one batch (:class:`LayerActs`), the
names they go by (:data:`NEEDS`), and the :class:`Reducer` protocol analyses fold them with. Below
every backend and every analysis."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

from jaxtyping import Bool
from torch import Tensor

from ropelens.errors import UnsupportedModelError
from ropelens.spec.rope import LayerRope

__all__ = ["NEEDS", "LayerActs", "Reducer"]

# q_post/k_post: q and k where they enter the score; q_rot/k_rot: the rotation's own output (the
# same tensors, unless the layer changes them after RoPE: LayerRope.norm_after_rope) selected:
# [batch, q, k] the keys the model's indexer kept for each query (LayerRope.select_keys), where it
# drops some
NEEDS = frozenset({"q_pre", "k_pre", "q_rot", "k_rot", "q_post", "k_post", "pattern", "selected"})


@dataclass
class LayerActs:
    """One layer's tensors for one batch, named as in :data:`NEEDS`, each ``[batch, pos, head,
    d_head]`` (keys: KV heads)."""

    layer: int
    rope: LayerRope
    valid: Bool[Tensor, "batch pos"]  # False on right padding
    tensors: dict[str, Tensor] = field(default_factory=dict)
    padded: bool | None = (
        None  # whether ``valid`` is False anywhere, when known (saves asking the device)
    )

    def __getitem__(self, key: str) -> Tensor:
        return self.tensors[key]

    def mask(self) -> Bool[Tensor, "batch q k"]:
        """The keys each query attends to: the layer's causal (and sliding-window) mask over real
        tokens, and the model's own key selection where its indexer drops keys (captured as
        ``"selected"``)."""
        n = self.valid.shape[1]
        m = (
            self.rope.mask(n, self.valid.device)[None]
            & self.valid[:, None, :]
            & self.valid[:, :, None]
        )
        if not self.rope.selects(n):
            return m
        if "selected" not in self.tensors:
            raise UnsupportedModelError(
                f"layer {self.layer} keeps at most {self.rope.select_keys} keys per query, "
                "picked by the model's indexer, and its selection was not captured: capture "
                "with which=(..., 'selected')"
            )
        return m & self.tensors["selected"]


class Reducer(Protocol):
    """Folds per-layer activations into running statistics.

    A reducer that builds attention masks from positions (causal, sliding window) names itself in a
    ``static_mask`` attribute: :func:`stream` then refuses layers whose mask the model picks from
    the input on the windows given (:meth:`LayerRope.require_static_mask`).
    """

    needs: frozenset[str]

    def update(self, acts: LayerActs) -> None: ...
