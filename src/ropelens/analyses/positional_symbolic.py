"""Positional versus symbolic heads (after Urrutia et al., ICLR 2026, "Decoupling Positional and
Symbolic Attention in Transformers", arXiv 2511.11579).

Urrutia et al. call a head *positional* when its logit sequence is invariant under a permutation of
the key vectors (attention depends on where keys are, not what they hold) and *symbolic* when the
logits move with the keys (attention depends on what keys hold, not where), and prove the two
exclusive unless attention is uniform. Their exact scoring formula was not available here; this
module is ropelens's operationalisation of those two definitions, measured with the model's own
RoPE.

**Perturbation.** One seeded permutation σ of the positions 1 … n−1 (position 0, the BOS/sink
key, stays put) moves key contents while positions stay fixed: the key at position j becomes the
content of position σ(j) rotated for position j, k'_j = R(j − σ(j)) k_post[σ(j)] (so that it is
R(j) applied to the pre-RoPE key of σ(j)). The query is not touched. For the query at i, over its
keys K_i = {j : 1 ≤ j ≤ i, inside the layer's window, j and σ(j) both real tokens}:

- ℓ_ij = q_i·k_j, the original logit at position j;
- ℓ'_ij = q_i·k'_j, the logit after the permutation;
- ℓ^σ_ij = q_i·k_σ(j), the original logit of the content now at j (at its own position σ(j), which
  may lie after i: the score is taken unmasked there).

A positional head has ℓ' = ℓ; a symbolic head has ℓ' = ℓ^σ. Logits are scaled by the layer's
score scale and soft-capped as the model does. Two measures of closeness, per query, averaged over
queries with |K_i| ≥ ``min_keys``:

- **logit**: P = Pearson corr(ℓ', ℓ), S = Pearson corr(ℓ', ℓ^σ) over K_i, in [−1, 1] (0 where the
  logits over K_i are constant, for which correlation is undefined);
- **attention**: the softmax of each over K_i (the sink at position 0 left out), P = 1 − TV(p', p),
  S = 1 − TV(p', p^σ), in [0, 1]. Uniform attention gets P = S = 1, Urrutia et al.'s exclusion case.

A head is *called* positional when P − S ≥ ``margin``, symbolic when S − P ≥ ``margin``, mixed
otherwise (``margin`` is ropelens's choice, default :data:`MARGIN`). A fixed σ per window length,
the same for every window and layer, keeps results mergeable and independent of batching.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

import einops
import numpy as np
import pandas as pd
import torch
from jaxtyping import Bool, Float
from torch import Tensor

from ropelens.errors import InputError
from ropelens.results.findings import Finding
from ropelens.results.provenance import Provenance
from ropelens.results.result import Result
from ropelens.results.sums import count_or_nan
from ropelens.run.capture import DeviceSums, LayerActs, query_tile, sum_dtype
from ropelens.run.measure import RunOptions, corpus_analysis, measure
from ropelens.spec.rope import LayerRope, RopeSpec
from ropelens.validate import check_number

__all__ = [
    "MARGIN",
    "MEASURES",
    "MIN_KEYS",
    "PosSymReducer",
    "PositionalSymbolic",
    "TaxonomyAgreement",
    "agreement",
    "cohen_kappa",
    "key_permutation",
    "positional_symbolic",
    "rank_correlation",
    "shortest_window",
]

MARGIN = 0.25  # P − S beyond this calls a head; a quarter of the attention measure's range [0, 1]
MEASURES = ("logit", "attention")
Measure = Literal["logit", "attention"]
CALLS = ("positional", "mixed", "symbolic")
MIN_KEYS = 8  # keys (BOS left out) a query must see to be scored, by default


def shortest_window(min_keys: int = MIN_KEYS) -> int:
    """The fewest tokens a window needs for any query to be scored: BOS and ``min_keys`` keys after
    it.

    A query at position i sees the keys 1 … i (position 0, the sink, is left out), so only the
    queries at i ≥ ``min_keys`` are scored, and a window of n tokens holds one only when n − 1 ≥
    ``min_keys``.
    """
    return int(min_keys) + 1


def _too_short(n: int, min_keys: int, flag: str) -> str:
    return (
        f"windows of {n} tokens are too short for positional/symbolic scoring: a query is scored "
        f"only when it sees {min_keys} keys besides BOS (min_keys={min_keys}), so a window needs "
        f"at least {shortest_window(min_keys)} tokens: {flag}"
    )


def key_permutation(n: int, seed: int) -> Tensor:
    """The permutation σ of positions 0 … n−1 that keeps 0 and shuffles 1 … n−1, from ``(seed,
    n)``."""
    g = torch.Generator().manual_seed(int(seed) * 1_000_003 + int(n))
    return torch.cat([torch.zeros(1, dtype=torch.long), torch.randperm(n - 1, generator=g) + 1])


def _corr(x: Tensor, y: Tensor, w: Tensor, nk: Tensor) -> Tensor:
    """Weighted (0/1) Pearson correlation along the last axis; 0 where either side is constant."""
    mx = (x * w).sum(-1, keepdim=True) / nk[..., None]
    my = (y * w).sum(-1, keepdim=True) / nk[..., None]
    xc, yc = (x - mx) * w, (y - my) * w
    vx, vy = (xc * xc).sum(-1), (yc * yc).sum(-1)
    ok = (vx > 0) & (vy > 0)
    return torch.where(
        ok, (xc * yc).sum(-1) / (vx * vy).clamp_min(1e-30).sqrt(), torch.zeros_like(vx)
    )


class PosSymReducer(DeviceSums):
    """Streams per layer × head the positional and symbolic scores (logit and attention measures).

    Needs only post-RoPE queries and keys, so the model runs on its fast path. Query tiles hold all
    n keys (ℓ^σ reads keys past the query), so memory is O(tile · n) per head."""

    # masks built from positions: refused where the model picks keys from the input
    static_mask = "the positional/semantic split"
    needs = frozenset({"q_post", "k_post"})

    def __init__(
        self,
        spec: RopeSpec,
        layers: Sequence[int],
        *,
        seed: int = 0,
        min_keys: int = MIN_KEYS,
        tile: int | None = None,
        n_ctx: int | None = None,
    ) -> None:
        self.layers = list(layers)
        if not self.layers:
            raise InputError("no layers selected: pass layer indices the model has")
        self.seed = int(
            check_number(
                seed, "seed", at_least=0, integer=True, hint=" (seeds the key permutation)"
            )
        )
        self.min_keys = int(
            check_number(
                min_keys,
                "min_keys",
                at_least=2,
                integer=True,
                hint=" (queries seeing fewer keys are left out: a correlation needs two)",
            )
        )
        if tile is not None and (isinstance(tile, bool) or not isinstance(tile, int) or tile < 1):
            raise InputError(
                f"tile must be a positive number of queries or None for automatic, got {tile!r}"
            )
        if n_ctx is not None and n_ctx < shortest_window(self.min_keys):
            raise InputError(
                _too_short(
                    n_ctx,
                    self.min_keys,
                    f"pass n_ctx={shortest_window(self.min_keys)} or "
                    "more (--n-ctx), or a smaller min_keys",
                )
            )
        narrow = {
            L: spec.layers[L].reach
            for L in self.layers
            if spec.layers[L].reach is not None and spec.layers[L].reach < self.min_keys
        }
        if (
            narrow
        ):  # no query of these layers ever sees min_keys keys: their scores would all be NaN
            raise InputError(
                f"layer(s) {list(narrow)} let a query see at most {min(narrow.values())} keys (a "
                f"sliding window or chunk), fewer than the {self.min_keys} a query needs to be "
                f"scored (min_keys={self.min_keys}), so none of their heads could be scored: "
                "leave them out (layers=, --layers) or pass "
                f"min_keys={max(2, min(narrow.values()))}"
            )
        self.tile = tile
        self.pos = {L: i for i, L in enumerate(self.layers)}
        # layers of different widths padded to the most heads: NaN past a layer's own
        # (RopeSpec.padded_zeros)
        self.sums: dict[str, Tensor] = {
            "n_queries": spec.padded_zeros(self.layers),
            **{
                f"{w}_{m}": spec.padded_zeros(self.layers, "head")
                for w in ("pos", "sym")
                for m in MEASURES
            },
        }
        self._perms: dict[tuple[int, str], Tensor] = {}

    def _perm(self, n: int, device: torch.device) -> Tensor:
        key = (n, str(device))
        if key not in self._perms:
            self._perms[key] = key_permutation(n, self.seed).to(device)
        return self._perms[key]

    @staticmethod
    def _cap(x: Tensor, rope: LayerRope) -> Tensor:
        return torch.tanh(x / rope.softcap) * rope.softcap if rope.softcap else x

    @torch.no_grad()
    def update(self, acts: LayerActs) -> None:
        layer_slot, rope, valid = self.pos[acts.layer], acts.rope, acts.valid
        queries = acts["q_post"].float() * rope.score_scale
        keys = acts["k_post"].float()
        device = queries.device
        sums = self._on(device)
        sums_device, sums_dtype, wide = (
            sums["n_queries"].device,
            sums["n_queries"].dtype,
            sum_dtype(device),
        )
        batch, n_positions, n_heads, head_dim = queries.shape
        n_kv_heads, group_size = rope.n_kv_heads, rope.group_size
        if n_positions < 2:
            return
        permutation = self._perm(n_positions, device)
        positions = torch.arange(n_positions, device=device)
        # k'_j = R(j − σ(j)) k_post[σ(j)]: σ(j)'s content, rotated to position j (no second
        # attention scaling); angles: [pos, plane]
        angles = rope.angles(positions - permutation).to(device, torch.float32)
        moved_keys = rope.rotate_by(
            keys[:, permutation], angles.cos()[:, None], angles.sin()[:, None]
        )
        head_queries = einops.rearrange(
            queries,
            "batch pos (kv_head group) dim -> batch kv_head group pos dim",
            kv_head=n_kv_heads,
        )
        to_key_columns = "batch pos kv_head dim -> batch kv_head dim pos"
        head_keys = einops.rearrange(keys, to_key_columns)
        head_moved_keys = einops.rearrange(moved_keys, to_key_columns)
        # [batch, pos]: keys that count (real, moved from a real key, past the first)
        key_ok = valid & valid[:, permutation] & (positions >= 1)[None]
        totals = {
            name: queries.new_zeros(n_heads, dtype=wide)
            for name in ("pos_logit", "sym_logit", "pos_attention", "sym_attention")
        }
        used_total = queries.new_zeros((), dtype=wide)
        tile_size = self.tile or query_tile(device, 4 * batch * n_heads * n_positions)
        for query_start in range(1, n_positions, tile_size):
            query_end = min(n_positions, query_start + tile_size)
            n_tile = query_end - query_start
            tile_queries = head_queries[:, :, :, query_start:query_end].reshape(
                batch, n_kv_heads, group_size * n_tile, head_dim
            )
            scores = self._cap(
                torch.matmul(tile_queries, head_keys).view(batch, n_heads, n_tile, n_positions),
                rope,
            )
            moved_scores = self._cap(
                torch.matmul(tile_queries, head_moved_keys).view(
                    batch, n_heads, n_tile, n_positions
                ),
                rope,
            )
            shuffled_scores = scores[..., permutation]
            query_positions, key_positions = (
                positions[query_start:query_end, None],
                positions[None, :],
            )
            allowed = (key_positions <= query_positions) & (
                (query_positions - key_positions) < rope.window if rope.window else True
            )
            # [batch, query, key]
            allowed = allowed[None] & key_ok[:, None, :] & valid[:, query_start:query_end, None]
            n_keys = allowed.sum(-1)  # [batch, query]
            used = n_keys >= self.min_keys
            weights = allowed[:, None].float()  # [batch, 1, query, key]
            n_keys_float = n_keys.clamp_min(1).float()[:, None].expand(batch, n_heads, n_tile)
            used_float = used[:, None].float()  # [batch, 1, query]
            totals["pos_logit"] += (
                (_corr(moved_scores, scores, weights, n_keys_float) * used_float)
                .to(wide)
                .sum((0, 2))
            )
            totals["sym_logit"] += (
                (_corr(moved_scores, shuffled_scores, weights, n_keys_float) * used_float)
                .to(wide)
                .sum((0, 2))
            )
            masked = ~allowed[:, None]
            moved_probs, probs, shuffled_probs = (
                torch.softmax(x.masked_fill(masked, float("-inf")), -1).nan_to_num(0.0)
                for x in (moved_scores, scores, shuffled_scores)
            )
            totals["pos_attention"] += (
                ((1 - 0.5 * (moved_probs - probs).abs().sum(-1)) * used_float).to(wide).sum((0, 2))
            )
            totals["sym_attention"] += (
                ((1 - 0.5 * (moved_probs - shuffled_probs).abs().sum(-1)) * used_float)
                .to(wide)
                .sum((0, 2))
            )
            used_total += used.to(wide).sum()
            del scores, moved_scores, shuffled_scores, moved_probs, probs, shuffled_probs
        for name, total in totals.items():
            # a narrower layer fills its leading heads
            sums[name][layer_slot, :n_heads] += total.to(sums_device, sums_dtype)
        sums["n_queries"][layer_slot] += used_total.to(sums_device, sums_dtype)

    def config(self) -> dict[str, Any]:
        return {"seed": self.seed, "min_keys": self.min_keys}

    def result(self, provenance: Provenance, margin: float = MARGIN) -> PositionalSymbolic:
        """The streamed sums as :class:`PositionalSymbolic` (on the CPU, float64)."""
        sums = {k: v.detach().to("cpu", torch.float64) for k, v in self.sums.items()}
        return PositionalSymbolic(
            tuple(self.layers), self.seed, self.min_keys, float(margin), sums, provenance
        )


@dataclass(frozen=True)
class PositionalSymbolic(
    Result, merge_same=("layers", "seed", "min_keys", "margin"), merge_sums=("sums",)
):
    """Positional and symbolic scores of every head under a key-content permutation, and its call.

    What :func:`positional_symbolic` returns (after Urrutia et al., ICLR 2026). P measures how much
    a head's logits stay put when key contents move, S how much they move with the contents, under
    two measures: ``"logit"`` (Pearson correlation, in [−1, 1]) and ``"attention"`` (1 − total
    variation, in [0, 1]). A head is called positional when P − S ≥ ``margin``, symbolic when S − P
    ≥ ``margin``, mixed otherwise.

    Layers of different widths (Gemma 4) share one ``[layer, head]`` array padded to the most heads:
    the scores of a head a layer lacks are NaN (:meth:`present`), and calls, shares and tables leave
    it out.

    Attributes:
        layers (tuple[int, ...]): The measured layer indices.
        seed (int): Seed of the key permutation.
        min_keys (int): Keys besides BOS a query had to see to be scored.
        margin (float): The difference of scores in [0, 1] that calls a head.
        sums (dict[str, Tensor]): ``n_queries`` ``[layer]`` (queries scored) and the summed scores
            ``pos_logit``, ``sym_logit``, ``pos_attention``, ``sym_attention`` ``[layer, head]``.
        provenance (Provenance): Model, corpus, tokens, settings and versions of the run.

    Raises:
        InputError: When ``margin`` is outside [0, 1] or the sums do not match ``layers``.

    Examples:
        >>> from ropelens.analyses import positional_symbolic
        >>> from ropelens.testing import tiny_model
        >>> model = tiny_model("llama")
        >>> heads = positional_symbolic(model, n_ctx=32, max_tokens=128, progress=False)
        >>> len(heads.calls("logit")), len(heads.calls("logit")[0])  # layers, heads
        (2, 4)
        >>> round(sum(heads.fractions("logit").values()), 6)
        1.0
        >>> len(heads.to_frame())  # one row per head
        8
    """

    layers: tuple[int, ...]
    seed: int
    min_keys: int
    margin: float
    sums: dict[str, Tensor]
    provenance: Provenance

    def __post_init__(self) -> None:
        self._check_shape(
            "pos_logit", self.sums["pos_logit"], (len(self.layers), None), " [layer, head]"
        )
        if not 0 <= self.margin <= 1:
            raise InputError(f"margin is a difference of scores in [0, 1], got {self.margin}")

    # ---------------------------------------------------------------- numbers
    def present(self) -> Bool[Tensor, "layer head"]:
        """The heads each layer has (all True when the measured layers share one width)."""
        return ~self.sums["pos_logit"].isnan()

    def scores(
        self, measure: Measure = "logit"
    ) -> tuple[Float[Tensor, "layer head"], Float[Tensor, "layer head"]]:
        """Mean positional score P and symbolic score S per head under ``measure`` ("logit" or
        "attention")."""
        if measure not in MEASURES:
            raise InputError(f"measure must be one of {MEASURES}, got {measure!r}")
        n = count_or_nan(self.sums["n_queries"])[:, None]
        return self.sums[f"pos_{measure}"] / n, self.sums[f"sym_{measure}"] / n

    def positionality(self, measure: Measure = "logit") -> Float[Tensor, "layer head"]:
        """P − S: positive for positional heads, negative for symbolic ones."""
        p, s = self.scores(measure)
        return p - s

    def positional(self, measure: Measure = "logit") -> Bool[Tensor, "layer head"]:
        """Heads called positional: P − S ≥ margin."""
        return self.positionality(measure) >= self.margin

    def symbolic(self, measure: Measure = "logit") -> Bool[Tensor, "layer head"]:
        """Heads called symbolic: S − P ≥ margin."""
        return self.positionality(measure) <= -self.margin

    def calls(self, measure: Measure = "logit") -> list[list[str]]:
        """positional / symbolic / mixed for each (layer, head), each layer's row as long as its own
        heads."""
        pos, sym = self.positional(measure), self.symbolic(measure)
        n_heads = self.present().sum(1).tolist()
        return [
            ["positional" if p else "symbolic" if s_ else "mixed" for p, s_ in zip(pr[:n], sr[:n])]
            for pr, sr, n in zip(pos.tolist(), sym.tolist(), n_heads)
        ]

    def fractions(self, measure: Measure = "logit") -> dict[str, float]:
        """Share of heads given each call under ``measure``."""
        flat = [c for row in self.calls(measure) for c in row]
        return {c: flat.count(c) / len(flat) for c in CALLS}

    def to_frame(self) -> pd.DataFrame:
        """One row per (layer, head) of the layer's own heads: both measures' P, S, P − S and call,
        and the queries scored."""
        L, H = self.sums["pos_logit"].shape
        have = self.present().reshape(-1).numpy()
        layer, head = np.meshgrid(np.array(self.layers), np.arange(H), indexing="ij")
        cols: dict[str, Any] = {"layer": layer.ravel()[have], "head": head.ravel()[have]}
        for m in MEASURES:
            p, s = self.scores(m)
            cols[f"positional_{m}"], cols[f"symbolic_{m}"] = (
                p.reshape(-1).numpy()[have],
                s.reshape(-1).numpy()[have],
            )
            cols[f"p_minus_s_{m}"] = (p - s).reshape(-1).numpy()[have]
            cols[f"call_{m}"] = [c for row in self.calls(m) for c in row]
        cols["n_queries"] = self.sums["n_queries"][:, None].expand(L, H).reshape(-1).numpy()[have]
        return pd.DataFrame(cols)

    def findings(self) -> list[Finding]:
        """The share of heads each measure calls positional, symbolic or mixed, and the exclusion
        check."""
        out = []
        for j, m in enumerate(MEASURES):
            fr = self.fractions(m)
            p, s = self.scores(m)
            vals = {
                **{c: round(v, 3) for c, v in fr.items()},
                "mean_positional": round(float(p.nanmean()), 3),
                "mean_symbolic": round(float(s.nanmean()), 3),
            }
            out.append(
                Finding(
                    f"possym-{j}",
                    "positional-symbolic",
                    f"Under the {m} measure {fr['positional']:.0%} of heads are positional, "
                    f"{fr['symbolic']:.0%} symbolic and {fr['mixed']:.0%} mixed (|P − S| < "
                    f"{self.margin:g}); mean P {vals['mean_positional']:.2f}, mean S "
                    f"{vals['mean_symbolic']:.2f}.",
                    vals,
                )
            )
        p, s = self.scores("attention")
        both = int(((p >= 0.9) & (s >= 0.9)).sum())
        out.append(
            Finding(
                "possym-2",
                "positional-symbolic",
                f"{both} heads score both P and S ≥ 0.9 on attention: by Urrutia et al.'s "
                "exclusion principle only near-uniform attention can.",
                {"both": both},
            )
        )
        return out

    # ---------------------------------------------------------------- persistence


@corpus_analysis(n_ctx=256, max_tokens=8_192)
def positional_symbolic(
    model,
    corpus,
    run: RunOptions,
    *,
    seed: int = 0,
    min_keys: int = MIN_KEYS,
    margin: float = MARGIN,
    tile: int | None = None,
) -> PositionalSymbolic:
    """Score every head as positional or symbolic over a corpus.

    After Urrutia et al. (ICLR 2026, "Decoupling Positional and Symbolic Attention in
    Transformers"): one seeded permutation moves the key contents while positions stay fixed. A head
    is positional when its logits stay put (score P), symbolic when they move with the contents
    (score S), under two measures: Pearson correlation of the logits, and 1 − total variation of the
    attention. A head is called positional when P − S ≥ ``margin``, symbolic when S − P ≥
    ``margin``, mixed otherwise. A query is scored only when it sees ``min_keys`` keys besides BOS,
    so windows need at least :func:`shortest_window` tokens (``min_keys`` + 1); shorter ones are
    refused before the model runs. The module :mod:`ropelens.analyses.positional_symbolic` defines
    the scores in full.

    Streamed: memory does not grow with the corpus. Inside a ``torch.distributed`` process group
    each rank takes a share of the windows and every rank returns the whole corpus's result;
    ``checkpoint`` saves progress to resume a killed run.

    Args:
        model: The model: what :func:`ropelens.load_model` or :func:`ropelens.testing.tiny_model`
            returns (a TransformerLens bridge, or the plain HF model with ``bridge=False``), or an
            nnsight ``LanguageModel``.
        corpus: The text to measure: any form :func:`ropelens.run.data.load_corpus` reads (a
            built-in corpus name, "english" or "python"; a path; a list of documents; a ``datasets``
            dataset, with ``text_column``), or a ready ``[n_windows, n_ctx]`` integer token tensor,
            used whole (default None: the built-in "english" corpus).
        n_ctx (int): Tokens per window, BOS first (default 256).
        max_tokens (int | None): Corpus tokens to read (default 8192; None: all of it).
        layers (Sequence[int] | None): Layer indices to measure (default None: every rotary layer).
        text_column (str): The column of a table or dataset corpus that holds the text (default
            "text").
        seed (int): Seed of the key permutation (default 0; one permutation per window length).
        min_keys (int): Keys besides BOS a query must see to be scored, ≥ 2 (default 8).
        margin (float): The difference of scores in [0, 1] that calls a head (default 0.25, a
            quarter of the attention measure's range).
        tile (int | None): Queries per tile (default None: sized to the device's memory budget); it
            changes memory use, not the numbers.
        batch_size (int): Windows per forward pass (default 4).
        progress (bool): Show a progress bar (default True; rank 0 only under torchrun).
        checkpoint (str | os.PathLike | None): A directory to save progress to and resume a killed
            run from (default None: none; see :mod:`ropelens.run.distributed`).
        checkpoint_every (int): Batches between checkpoints (default 8).
        verify (bool): First check that ropelens's reading of RoPE reproduces the model's own
            attention (default True); False skips the check, and the result says "unverified".

    Returns:
        PositionalSymbolic: Summed P and S scores per ``[layer, head]`` under both measures, and the
        number of queries scored; ``scores()``, ``calls()`` and ``fractions()`` read them.

    Raises:
        InputError: When ``layers`` selects no layer the model has, the corpus cannot be read,
            ``n_ctx`` is shorter than ``min_keys`` + 1, or ``margin`` / ``min_keys`` is out of range
            (the message names the problem and the fix).
        UnsupportedModelError: When ``verify`` finds that the RoPE reading does not reproduce the
            model's own attention.

    Examples:
        >>> from ropelens.analyses import positional_symbolic
        >>> from ropelens.testing import tiny_model
        >>> model = tiny_model("llama")
        >>> heads = positional_symbolic(model, n_ctx=32, max_tokens=128, progress=False)
        >>> positional, symbolic = heads.scores("attention")
        >>> tuple(positional.shape)  # [layer, head]
        (2, 4)
        >>> sorted(heads.fractions("attention"))
        ['mixed', 'positional', 'symbolic']
    """
    margin = float(
        check_number(
            margin,
            "margin",
            at_least=0,
            at_most=1,
            hint=" (the P − S difference that calls a head; default 0.25)",
        )
    )
    min_keys = int(
        check_number(
            min_keys,
            "min_keys",
            at_least=2,
            integer=True,
            hint=" (queries seeing fewer keys are left out: a correlation needs two)",
        )
    )
    if not isinstance(corpus, Tensor) and run.n_ctx < shortest_window(
        min_keys
    ):  # ready tokens: checked per window
        raise InputError(
            _too_short(
                run.n_ctx,
                min_keys,
                f"pass n_ctx={shortest_window(min_keys)} or more (--n-ctx), or a smaller min_keys",
            )
        )
    m = measure(
        model,
        corpus,
        lambda spec, chosen, win: PosSymReducer(
            spec, chosen, seed=seed, min_keys=min_keys, tile=tile, n_ctx=win.n_ctx
        ),
        run,
        analysis="positional/symbolic heads",
        config=lambda reds: {**reds[0].config(), "margin": margin},
        resume={"tile": tile},
    )
    result = m.reducer.result(m.provenance, margin)
    unscored = [
        L for L, n in zip(result.layers, result.sums["n_queries"].tolist(), strict=True) if n == 0
    ]
    if (
        unscored
    ):  # padding can leave a layer no query with min_keys keys: its scores would all be NaN
        raise InputError(
            f"no query of layer(s) {unscored} saw {min_keys} keys besides BOS "
            f"(min_keys={min_keys}), so their heads cannot be scored: pass longer windows of "
            f"real tokens (at least {shortest_window(min_keys)}, --n-ctx) or a smaller min_keys"
        )
    return result


# ============================================================================ comparison
def cohen_kappa(a: Sequence[Any], b: Sequence[Any]) -> float:
    """Cohen's κ of two labelings of the same items: (p_o − p_e) / (1 − p_e); 1.0 where both are one
    constant label."""
    if len(a) != len(b) or not len(a):
        raise InputError(
            f"cohen_kappa needs two labelings of the same non-empty items, got {len(a)} and "
            f"{len(b)}"
        )
    labels = sorted(set(a) | set(b), key=str)
    n = len(a)
    po = sum(x == y for x, y in zip(a, b)) / n
    pe = sum((list(a).count(c) / n) * (list(b).count(c) / n) for c in labels)
    return 1.0 if pe == 1 else (po - pe) / (1 - pe)


def rank_correlation(x: Tensor, y: Tensor) -> float:
    """Spearman's ρ (Pearson correlation of average ranks) over the entries finite in both."""
    x, y = (
        torch.as_tensor(x, dtype=torch.float64).flatten(),
        torch.as_tensor(y, dtype=torch.float64).flatten(),
    )
    if x.shape != y.shape:
        raise InputError(
            f"rank_correlation needs equal sizes, got {tuple(x.shape)} and {tuple(y.shape)}"
        )
    ok = x.isfinite() & y.isfinite()
    rx, ry = (pd.Series(v[ok].numpy()).rank().to_numpy() for v in (x, y))
    if len(rx) < 2 or rx.std() == 0 or ry.std() == 0:
        return float("nan")
    return float(np.corrcoef(rx, ry)[0, 1])


@dataclass(frozen=True)
class TaxonomyAgreement:
    """How the positional/symbolic calls line up with
    :func:`ropelens.analyses.head_taxonomy.head_taxonomy`'s kinds."""

    confusion: pd.DataFrame  # rows: taxonomy kinds; columns: positional / mixed / symbolic
    kappa: float  # Cohen's κ of "positional" by the calls against the taxonomy's positional flag
    positional_calls: float  # share of heads the calls make positional
    positional_taxonomy: float  # share the taxonomy makes positional
    measure: str


def agreement(
    result: PositionalSymbolic, taxonomy: Any, measure: Measure = "logit"
) -> TaxonomyAgreement:
    """Confusion table of taxonomy kinds × calls, and Cohen's κ on the binary positional flag."""
    if tuple(result.layers) != tuple(taxonomy.layers):
        raise InputError(
            f"the results cover different layers ({list(result.layers)} vs "
            f"{list(taxonomy.layers)}): measure both with the same layers="
        )
    kinds = [k for row in taxonomy.kinds() for k in row]
    calls = [c for row in result.calls(measure) for c in row]
    if len(kinds) != len(calls):
        raise InputError(
            f"the results have different head counts ({len(calls)} vs {len(kinds)}): pass one "
            "model's"
        )
    tax_pos = taxonomy.positional()[taxonomy.present()].tolist()  # the layers' own heads, in order
    call_pos = [c == "positional" for c in calls]
    confusion = pd.crosstab(
        pd.Series(kinds, name="taxonomy"), pd.Series(calls, name="call")
    ).reindex(columns=list(CALLS), fill_value=0)
    return TaxonomyAgreement(
        confusion,
        cohen_kappa(call_pos, tax_pos),
        sum(call_pos) / len(calls),
        sum(tax_pos) / len(calls),
        measure,
    )
