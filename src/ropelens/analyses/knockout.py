"""Dose-response knockouts: zero k RoPE planes of a head set's queries and keys and measure what
breaks.

*Head sets.* ``"positional"`` (:func:`ropelens.analyses.head_taxonomy.head_taxonomy`),
``"retrieval"`` (retrieval score ≥ a threshold,
:func:`ropelens.analyses.retrieval_heads.retrieval_scores`), ``"sinks"`` (Gu et al.'s criterion,
:func:`ropelens.analyses.attention_sinks.attention_sinks`), ``"others"`` (rotary heads in none of
the three), or any list of (layer, query head).

*Doses.* k planes of every head in the set are zeroed in the rotated q and k
(:func:`ropelens.run.intervene.ablate_planes`, which removes exactly those planes' logit terms): the
k highest frequencies (``"high"``), the k lowest (``"low"``), or k planes drawn at random per head
(``"random"``, several seeds: the control). ``"head"`` is the whole-head knockout: every rotary
plane of the head zeroed. ropelens takes this rather than zeroing the head's output because it is
the same exact intervention as the plane doses on every engine ropelens runs (its dose-n endpoint):
every logit term the rotation carries is removed, so a fully rotary head's logits are all 0 and it
attends uniformly over its causal prefix; in partial-rotary heads the unrotated dims keep their
term.

*Effects*, per window (paired with the unmodified model on the same window): ``loss`` (next-token
loss on text, :func:`ropelens.run.evaluate.window_losses`); ``previous_token``, ``diagonal`` and
``positional`` (attention mass of the probe heads, the positional heads by default, at offset 1, at
offset 0, and at each probe head's own offset, on seeded uniformly random tokens, scored by
:class:`ropelens.analyses.head_taxonomy.HeadScoresReducer`); ``copy_nll`` and ``copy_accuracy``
(teacher-forced next-token loss and top-1 accuracy on the passkey digits of retrieval prompts,
:func:`ropelens.analyses.retrieval_heads.copy_case`).

*Statistics* (:mod:`ropelens.run.stats`, docs/statistics.md): each effect is the mean paired
difference (knocked out − unmodified) with a paired bootstrap CI over windows. ``p_random_planes``:
the layer-clustered permutation p-value of the set's effect against as many random planes per head
in the same heads; ``p_random_heads``: against random head sets with as many heads per layer, given
the same planes. Both are one-sided in the direction of damage (loss up, attention mass and accuracy
down), (1 + #≥)/(1 + n).
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import pandas as pd
import torch
from torch import Tensor
from tqdm.auto import tqdm

from ropelens.analyses.attention_sinks import attention_sinks
from ropelens.analyses.head_taxonomy import HeadScoresReducer, head_taxonomy, random_tokens
from ropelens.analyses.passkey_retrieval import make_passkey, passkey_prompt
from ropelens.analyses.retrieval_heads import copy_case, retrieval_scores
from ropelens.devices import device_of
from ropelens.errors import InputError, UnsupportedModelError
from ropelens.results.figures import figure_of
from ropelens.results.findings import Finding
from ropelens.results.provenance import Provenance, placement
from ropelens.results.result import Result
from ropelens.run import data
from ropelens.run.evaluate import check_n_boot, interval_text, percentile_ci, window_losses
from ropelens.run.intervene import ablate_planes, zeroed_entries
from ropelens.run.measure import RunOptions, Windows, measure
from ropelens.run.stats import (
    control_verdict,
    distinct_sets,
    matched_random_sets,
    matched_set_count,
    p_floor,
    permutation_p_value,
)
from ropelens.run.verify import verification
from ropelens.spec.bands import Bands
from ropelens.spec.reading import hf_model_of, model_label, rope_spec
from ropelens.spec.rotary_state import rotary_state_kept
from ropelens.spec.surface import running_model
from ropelens.validate import check_number

__all__ = [
    "DIRECTIONS",
    "HARM",
    "HEAD_SETS",
    "METRICS",
    "MIN_WINDOWS",
    "Knockout",
    "KnockoutProbe",
    "head_sets",
    "knocked_out",
    "knocked_out_rows",
    "knockout",
    "plane_order",
    "probe_rows",
]

HEAD_SETS = ("positional", "retrieval", "sinks", "others")
MIN_WINDOWS = 2  # the fewest windows an effect and its bootstrap CI are measured over
DIRECTIONS = ("high", "low", "random", "head", "random heads")
METRIC_GROUPS = {
    "loss": ("loss",),
    "probe": ("previous_token", "diagonal", "positional"),
    "retrieval": ("copy_nll", "copy_accuracy"),
}
METRICS = tuple(m for ms in METRIC_GROUPS.values() for m in ms)
HARM = {
    "loss": 1.0,
    "previous_token": -1.0,
    "diagonal": -1.0,
    "positional": -1.0,
    "copy_nll": 1.0,
    "copy_accuracy": -1.0,
}  # the sign of damage: p-values test harm · effect > 0
PROMPT_SEED_OFFSET = (
    2000  # knockout prompts use passkeys apart from those that scored the retrieval heads
)

Heads = tuple[tuple[int, int], ...]
Planes = dict[tuple[int, int], tuple[int, ...]]


# --------------------------------------------------------------------------------------------
# head sets and planes
# --------------------------------------------------------------------------------------------
def _as_heads(heads: Any, spec, what: str) -> Heads:
    """Sorted unique (layer, head) pairs, each a rotary layer's query head."""
    try:
        pairs = sorted({(int(L), int(h)) for L, h in heads})
    except (TypeError, ValueError) as e:
        raise InputError(
            f"{what} must be (layer, head) pairs such as [(3, 1), (5, 0)], got {heads!r}"
        ) from e
    if not pairs:
        raise InputError(f"{what} is empty: pass at least one (layer, head), or another head set")
    rotary = set(spec.rotary_layers)
    for L, h in pairs:
        if L not in rotary:
            raise InputError(
                f"{what}: layer {L} is not a rotary layer (rotary layers: {sorted(rotary)})"
            )
        if not 0 <= h < spec[L].n_heads:
            raise InputError(
                f"{what}: layer {L} has {spec[L].n_heads} query heads, so head {h} does not exist"
            )
    return tuple(pairs)


def head_sets(
    model,
    names: Sequence[str],
    text: Tensor,
    *,
    retrieval_threshold: float = 0.1,
    retrieval_ctx: int = 256,
    seed: int = 0,
    verify: bool = True,
) -> dict[str, Heads]:
    """The named head sets of ``model``: ``text`` windows classify positional heads and find sink
    heads."""
    bad = [n for n in names if n not in HEAD_SETS]
    if bad:
        raise InputError(
            f"unknown head set {bad[0]!r}: choose from {HEAD_SETS} or pass (layer, head) pairs"
        )
    spec = rope_spec(model)
    need = set(names) | (set(HEAD_SETS[:3]) if "others" in names else set())
    found: dict[str, set[tuple[int, int]]] = {}
    if "positional" in need:
        tx = head_taxonomy(
            model, text, layers=spec.rotary_layers, seed=seed, progress=False, verify=verify
        )
        pos = tx.positional()
        found["positional"] = {
            (L, h) for i, L in enumerate(tx.layers) for h in range(pos.shape[1]) if pos[i, h]
        }
    if "sinks" in need:
        s = attention_sinks(
            model,
            text,
            n_ctx=text.shape[1],
            max_tokens=None,
            layers=spec.rotary_layers,
            progress=False,
            verify=verify,
        )
        sink = s.sinking()
        found["sinks"] = {
            (L, h) for i, L in enumerate(s.layers) for h in range(sink.shape[1]) if sink[i, h]
        }
    if "retrieval" in need:
        scores, _ = retrieval_scores(model, (retrieval_ctx,), (0.25, 0.75), 2, seed)
        found["retrieval"] = {
            (L, h)
            for L in spec.rotary_layers
            for h in range(spec[L].n_heads)
            if float(scores[L, h]) >= retrieval_threshold
        }
    if "others" in need:
        every = {(L, h) for L in spec.rotary_layers for h in range(spec[L].n_heads)}
        found["others"] = every - found["positional"] - found["sinks"] - found["retrieval"]
    out = {}
    for n in names:
        if not found[n]:
            raise InputError(
                f"this model has no {n} heads by ropelens's criterion: pass (layer, head) pairs "
                "instead"
            )
        out[n] = tuple(sorted(found[n]))
    return out


def plane_order(inv_freq: Tensor, direction: str) -> list[int]:
    """Planes from the highest frequency down (``"high"``) or the lowest up (``"low"``); ties by
    plane index."""
    f = [float(x) for x in inv_freq]
    if direction == "high":
        return sorted(range(len(f)), key=lambda i: (-f[i], i))
    if direction == "low":
        return sorted(range(len(f)), key=lambda i: (f[i], -i))
    raise InputError(f"direction must be 'high' or 'low', got {direction!r}")


def _planes(
    spec, heads: Heads, direction: str, k: int, rng: np.random.Generator | None = None
) -> Planes:
    """Each head's k planes in ``direction`` (``"random"``: drawn per head from ``rng``; ``"head"``:
    all)."""
    out = {}
    for L, h in heads:
        n = spec[L].n_planes
        if direction == "head":
            out[(L, h)] = tuple(range(n))
        elif direction == "random":
            out[(L, h)] = tuple(sorted(int(p) for p in rng.choice(n, size=k, replace=False)))
        else:
            out[(L, h)] = tuple(sorted(plane_order(spec[L].inv_freq, direction)[:k]))
    return out


@contextlib.contextmanager
def knocked_out(model, planes: Mapping[tuple[int, int], Sequence[int]]) -> Iterator[None]:
    """Zero each (layer, head)'s planes of its rotated q and k while the block runs.

    Heads of one layer with the same planes share one :func:`ropelens.run.intervene.ablate_planes`
    call, so a KV head is zeroed when every query head reading it is knocked out (the logits are the
    same either way)."""
    model = running_model(model)  # an nnsight model: the HF model it wraps
    groups: dict[tuple[int, tuple[int, ...]], list[int]] = {}
    for (L, h), ps in sorted(planes.items()):
        if len(ps):
            groups.setdefault((L, tuple(ps)), []).append(h)
    with contextlib.ExitStack() as stack:
        for (L, ps), hs in groups.items():
            stack.enter_context(ablate_planes(model, list(ps), layers=[L], heads=hs))
        yield


def _row_masks(spec, rows: Sequence[Mapping[tuple[int, int], Sequence[int]]]) -> dict[int, tuple]:
    """Per layer, the ``[row, head, d_head]`` masks of q and k that zero row b's planes.

    A KV dim is zeroed in a row where every query head reading it has that dim zeroed: the logits
    are those of :func:`knocked_out` (a query's zeroed dims carry no term whatever its key holds).
    """
    layers = sorted({L for planes in rows for (L, _), ps in planes.items() if len(ps)})
    out: dict[int, tuple] = {}
    for L in layers:
        lr = spec[L]
        q = torch.zeros(len(rows), lr.n_heads, lr.head_dim, dtype=torch.bool)
        for b, planes in enumerate(rows):
            for (layer, h), ps in planes.items():
                if layer == L and len(ps):
                    q[b, h, lr.plane_dims[list(ps)].flatten()] = True
        k = q.view(len(rows), lr.n_kv_heads, lr.group_size, lr.head_dim).all(2)
        out[L] = (q, k)
    return out


@contextlib.contextmanager
def knocked_out_rows(
    model, rows: Sequence[Mapping[tuple[int, int], Sequence[int]]]
) -> Iterator[None]:
    """:func:`knocked_out` with one knockout per batch row: row b of every forward in the block
    runs with ``rows[b]``'s planes zeroed (``{(layer, head): planes}``; an empty mapping: the
    unmodified model). Every forward in the block must hold ``len(rows)`` rows.

    Many control draws then cost one batched forward instead of one forward each.
    """
    if not rows:
        raise InputError("rows is empty: pass one {(layer, head): planes} mapping per batch row")
    spec = rope_spec(model)
    for planes in rows:
        _as_heads(planes, spec, "a row's knocked-out heads") if planes else None
        for (L, _), ps in planes.items():
            bad = [int(p) for p in ps if not 0 <= int(p) < spec[L].n_planes]
            if bad:
                raise InputError(
                    f"layer {L} has {spec[L].n_planes} planes per head, so plane {bad[0]} does "
                    "not exist"
                )
    with zeroed_entries(model, _row_masks(spec, rows)):
        yield


class _RowMass(HeadScoresReducer):
    """Attention mass of ``heads`` at offsets 0 … max_offset in each batch row (queries ≥ 1 and
    keys ≥ 1, as :class:`HeadScoresReducer` counts them), kept per row."""

    def __init__(self, spec, heads: Heads, max_offset: int = 1) -> None:
        layers = sorted({L for L, _ in heads})
        super().__init__(spec, layers, Bands.default(), max_offset)
        self.heads = heads
        self.rows: dict[int, Tensor] = {}  # layer -> [row, head, offset]

    @torch.no_grad()
    def update(self, acts) -> None:
        rope = acts.rope
        queries = acts["q_post"].float() * rope.score_scale
        _, diag = self._attention(queries, acts["k_post"].float(), acts.valid, rope)
        per = [diag[d][..., d:].double().mean(-1) for d in range(self.max_offset + 1)]
        self.rows[acts.layer] = torch.stack(per, -1).cpu()

    def mass(self) -> Tensor:
        """``[row, head of self.heads, offset]``."""
        return torch.stack([self.rows[L][:, h] for L, h in self.heads], 1)


def probe_rows(
    model,
    window: Tensor,
    rows: Sequence[Mapping[tuple[int, int], Sequence[int]]],
    probe_heads: Sequence[tuple[int, int]],
    *,
    spec=None,
) -> Tensor:
    """Attention mass ``[row, probe head, offset 0/1]`` of ``probe_heads`` on one token window
    (``[n_ctx]``, repeated once per row) with row b's knockout ``rows[b]`` in force: many control
    draws of the positional probe in one forward (:func:`knocked_out_rows`)."""
    spec = spec if spec is not None else rope_spec(model)
    heads = _as_heads(probe_heads, spec, "probe_heads")
    window = torch.as_tensor(window).reshape(-1)
    if window.numel() < 3:
        raise InputError(f"the probe window needs at least 3 tokens, got {window.numel()}")
    red = _RowMass(spec, heads)
    run = RunOptions(layers=red.layers, batch_size=len(rows), progress=False, verify=False)
    with knocked_out_rows(model, rows):
        measure(
            model,
            None,
            lambda *_: red,
            run,
            windows=Windows(window[None].expand(len(rows), -1).contiguous()),
            spec=spec,
            analysis="knockout probe rows",
        )
    return red.mass()


# --------------------------------------------------------------------------------------------
# what is measured in every condition
# --------------------------------------------------------------------------------------------
@dataclass
class KnockoutProbe:
    """The inputs every condition is measured on: text windows (loss), random-token windows
    (attention probe of ``probe_heads``), retrieval prompts (copy steps), and the metrics to
    take."""

    text: Tensor
    random: Tensor
    cases: list[Any]
    probe_heads: Heads
    metrics: tuple[str, ...]
    batch_size: int = 4
    offsets: dict[tuple[int, int], int] = field(
        default_factory=dict
    )  # each probe head's own offset (0 or 1)

    def measure(self, model, spec) -> dict[str, Tensor]:
        """Per-window values of every metric under whatever interventions are in force."""
        out: dict[str, Tensor] = {}
        if "loss" in self.metrics:
            out["loss"] = window_losses(
                model, self.text, batch_size=self.batch_size, progress=False
            ).double()
        if "previous_token" in self.metrics:
            out.update(self._probe(model, spec))
        if "copy_nll" in self.metrics:
            out.update(self._copy(model))
        return out

    def _probe(self, model, spec) -> dict[str, Tensor]:
        layers = sorted({L for L, _ in self.probe_heads})
        li = {L: i for i, L in enumerate(layers)}
        run = RunOptions(layers=layers, batch_size=1, progress=False, verify=False)
        masses = []
        for w in range(
            self.random.shape[0]
        ):  # one window per pass: the reducer sums over its batch
            red = HeadScoresReducer(spec, layers, Bands.default(), max_offset=1)
            measure(
                model,
                None,
                lambda *_, r=red: r,
                run,
                windows=Windows(self.random[w : w + 1]),
                spec=spec,
                analysis="knockout probe",
            )
            masses.append(red.scores("random")["mass_random"])
        m = torch.stack(masses)  # [window, layer, head, offset]
        rows = torch.tensor([li[L] for L, _ in self.probe_heads])
        cols = torch.tensor([h for _, h in self.probe_heads])
        per = m[:, rows, cols]  # [window, probe head, offset]
        if (
            not self.offsets
        ):  # fixed once, on the unmodified model: the offset each head attends more
            best = per.mean(0).argmax(-1)
            self.offsets = {
                hd: int(b) for hd, b in zip(self.probe_heads, best.tolist(), strict=True)
            }
        own = torch.tensor([self.offsets[hd] for hd in self.probe_heads])
        return {
            "previous_token": per[..., 1].mean(-1),
            "diagonal": per[..., 0].mean(-1),
            "positional": per.gather(-1, own[None, :, None].expand(per.shape[0], -1, 1))[
                ..., 0
            ].mean(-1),
        }

    def _copy(self, model) -> dict[str, Tensor]:
        nll, acc = [], []
        with torch.no_grad():
            for case in self.cases:
                with rotary_state_kept(model):  # each case as a fresh model runs it
                    out = model(case.tokens[None].to(device_of(model)), return_type="logits")
                logits = out[0].float().cpu()
                q = torch.tensor(case.queries)
                target = case.tokens[q + 1]
                logp = logits[q].log_softmax(-1)
                nll.append(-logp.gather(-1, target[:, None]).mean())
                acc.append((logp.argmax(-1) == target).double().mean())
        return {"copy_nll": torch.stack(nll).double(), "copy_accuracy": torch.stack(acc).double()}


# --------------------------------------------------------------------------------------------
# result
# --------------------------------------------------------------------------------------------
COLUMNS = (
    "head_set",
    "direction",
    "dose",
    "metric",
    "estimate",
    "lo",
    "hi",
    "p_random_planes",
    "p_random_heads",
    "p_floor_random_planes",
    "p_floor_random_heads",
    "p_withheld",
    "n_windows",
    "n_draws",
    "distinct_random_planes",
    "distinct_random_heads",
    "n_heads",
    "base",
)
_ADDED = {  # columns added since the first files: what a row of an older file holds there
    "p_floor_random_planes": ("p_random_planes", "n_random"),
    "p_floor_random_heads": ("p_random_heads", "n_control"),
    "p_withheld": None,
    "distinct_random_planes": None,
    "distinct_random_heads": None,
}


@dataclass(frozen=True)
class Knockout(Result, json_options={"indent": None}):
    """Effects of knocking out planes of head sets: one row per (head set, direction, dose, metric).

    What :func:`knockout` returns. Each row holds the mean paired effect (knocked out − unmodified)
    over windows with its bootstrap CI and its layer-clustered permutation p-values against the
    random controls; :meth:`to_frame` gives the rows as a table, :meth:`findings` the largest dose
    of each set, direction and metric in words, and :meth:`figure` effect against dose with CI
    bands.

    The columns of a row: ``head_set``, ``direction`` (``"high"``, ``"low"``, ``"head"``, the
    ``"random"`` planes control or the ``"random heads (…)"`` control), ``dose`` (planes zeroed per
    head), ``metric``; ``estimate``/``lo``/``hi``, the mean paired effect and its CI (random
    controls: the effect averaged over their draws per window first); ``p_random_planes`` and
    ``p_random_heads``, one-sided p-values in the direction of damage (NaN where no control ran, or
    where the control cannot differ from the set: ``p_withheld`` then says why);
    ``p_floor_random_planes`` and ``p_floor_random_heads``, the smallest p each control's draws
    allow, 1 / (1 + draws); ``p_withheld``, why a p-value is withheld (empty where none is): the
    set is the whole pool its control draws from, so every draw is the set itself, or fewer
    distinct control sets exist than were drawn; ``n_windows``, ``n_draws``;
    ``distinct_random_planes`` and ``distinct_random_heads``, how many distinct sets the control's
    draws hold (NaN where it did not run); ``n_heads``; and ``base``, the metric's mean on the
    unmodified model.

    Attributes:
        rows (tuple[dict[str, Any], ...]): The rows, each with the columns above.
        heads (dict[str, Heads]): Each head set's ``(layer, head)`` pairs, by name.
        probe_heads (Heads): The heads whose attention the probe metrics read (empty without them).
        n_planes (int): Rotary planes per head in the knocked-out heads (the largest dose).
        provenance (Provenance): Model, windows, schedule, statistics settings, probe offsets and
            verification.

    Raises:
        InputError: When a row lacks a column or has one too many.

    Examples:
        >>> from ropelens.analyses import knockout
        >>> from ropelens.testing import tiny_model
        >>> model = tiny_model("llama")
        >>> ko = knockout(
        ...     model, {"mine": [(1, 0), (1, 1)]}, doses=[4], directions=["high"],
        ...     metrics=["loss"], n_ctx=32, n_windows=4, n_random=2, n_control=2, n_boot=200,
        ...     whole_head=False, progress=False,
        ... )
        >>> ko.to_frame()[["head_set", "direction", "dose", "metric"]].values.tolist()
        [['mine', 'high', 0, 'loss'], ['mine', 'high', 4, 'loss'],
         ['mine', 'random heads (high)', 4, 'loss'], ['mine', 'random', 4, 'loss']]
        >>> ko.n_planes, ko.heads["mine"]
        (8, ((1, 0), (1, 1)))
        >>> ko.findings()[0].text
        'Zeroing 4 planes (high) in the 2 mine heads changes loss by ...'
    """

    rows: tuple[dict[str, Any], ...]
    heads: dict[str, Heads]
    probe_heads: Heads
    n_planes: int
    provenance: Provenance

    def __post_init__(self) -> None:
        for r in self.rows:
            if set(r) != set(COLUMNS):
                raise InputError(f"a Knockout row must have the columns {COLUMNS}, got {sorted(r)}")

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Knockout:
        """The result :meth:`to_dict` wrote; a file from before the p-value floors and distinct
        counts were recorded gets its floors from its draws and no distinct counts."""
        config = (d.get("provenance") or {}).get("config", {})
        rows = []
        for row in d.get("rows", []):
            row = dict(row)
            for column, source in _ADDED.items():
                if column in row:
                    continue
                if source is None:
                    row[column] = "" if column == "p_withheld" else float("nan")
                    continue
                p, draws = source
                ran = row.get(p) is not None and not math.isnan(row[p]) and draws in config
                row[column] = p_floor(int(config[draws])) if ran else float("nan")
            rows.append(row)
        return super().from_dict({**d, "rows": rows})

    def to_frame(self) -> pd.DataFrame:
        """The rows as a table, one column per field of a row."""
        return pd.DataFrame(list(self.rows), columns=list(COLUMNS))

    def findings(self) -> list[Finding]:
        """The largest dose of each head set and direction, for every metric, with its CI and
        p-values."""
        df = self.to_frame()
        out = []
        own = df[(df["dose"] > 0) & df["direction"].isin(["high", "low", "head"])]
        for (s, d, m), g in own.groupby(["head_set", "direction", "metric"], sort=False):
            r = g.loc[g["dose"].idxmax()]
            ps = "; ".join(_p_text(r, control) for control in ("random_planes", "random_heads"))
            ps = "; ".join(p for p in ps.split("; ") if p)
            text = (
                f"Zeroing {int(r['dose'])} planes ({d}) in the {len(self.heads[s])} {s} heads "
                f"changes {m} by {r['estimate']:+.4g} {interval_text(r['lo'], r['hi'])} from "
                f"{r['base']:.4g}" + (f" ({ps})." if ps else ".")
            )
            out.append(
                Finding(
                    f"knockout-{len(out)}",
                    "knockout",
                    text,
                    {k: (v.item() if hasattr(v, "item") else v) for k, v in r.items()},
                )
            )
        return out

    def figure(self, metric: str | None = None):
        """Effect vs dose with CI bands, one curve per head set and direction
        (:mod:`ropelens.plots.knockout`)."""
        return figure_of(type(self))(self, metric)

    def _repr_text(self) -> str:
        return f"Knockout({self.provenance.model}, head sets {list(self.heads)})"


def _p_text(row: Any, control: str) -> str:
    """A control's p-value as a finding states it: with the smallest p its draws allow, or
    withheld with the reason; "" where the control did not run."""
    p, floor, why = row[f"p_{control}"], row[f"p_floor_{control}"], _withheld_reason(row, control)
    if why:
        return f"p_{control} withheld: {why}"
    if np.isnan(p):
        return ""
    return f"p_{control} = {p:.3g}, the smallest {floor:.3g} its draws allow"


def _withheld_reason(row: Any, control: str) -> str:
    """The reason ``row["p_withheld"]`` gives for ``control``'s p-value ("" where none)."""
    prefix = f"p_{control} withheld: "
    for part in str(row["p_withheld"] or "").split(" | "):
        if part.startswith(prefix):
            return part[len(prefix) :]
    return ""


# --------------------------------------------------------------------------------------------
# entry point
# --------------------------------------------------------------------------------------------
def _check_doses(doses: Any, n_planes: int, what: str = "doses") -> tuple[int, ...]:
    """The doses as sorted whole plane counts with 0 added: one check for Python and ``--doses``
    (a fractional dose is refused, never rounded to another)."""
    try:
        given = list(doses)
    except TypeError as e:
        raise InputError(f"{what} must be plane counts such as [0, 2, 4, 8], got {doses!r}") from e
    bad = [
        d
        for d in given
        if isinstance(d, bool)
        or not isinstance(d, (int, float, np.integer, np.floating))
        or not math.isfinite(d)
        or int(d) != d
    ]
    if bad:
        raise InputError(
            f"{what} must be whole plane counts such as [0, 2, 4, 8], got {bad[0]!r} in {given}: "
            "a dose is how many planes per head are zeroed"
        )
    ds = sorted({int(d) for d in given} | {0})
    if ds[0] < 0 or ds[-1] > n_planes:
        raise InputError(
            f"{what} must lie in 0..{n_planes} (the head set's planes per head), got {list(doses)}"
        )
    return tuple(ds)


def _row(
    name,
    direction,
    dose,
    metric,
    diffs: Tensor,
    base: Tensor,
    *,
    n_boot,
    level,
    seed,
    n_heads,
    n_draws=1,
    p_planes=float("nan"),
    p_heads=float("nan"),
    planes: _Control | None = None,
    heads: _Control | None = None,
    tested: bool = False,
) -> dict[str, Any]:
    """One row; ``tested``: the set's own, whose p-values (stated or withheld) the controls give."""
    est = percentile_ci(diffs, n_boot=n_boot, seed=seed, alpha=1 - level)
    why = [
        f"p_{name} withheld: {c.withheld}"
        for name, c in (("random_planes", planes), ("random_heads", heads))
        if tested and c is not None and c.withheld
    ]
    return {
        "head_set": name,
        "direction": direction,
        "dose": int(dose),
        "metric": metric,
        "estimate": est.mean,
        "lo": est.lo,
        "hi": est.hi,
        "p_random_planes": float(p_planes),
        "p_random_heads": float(p_heads),
        "p_floor_random_planes": _floor(planes) if tested else float("nan"),
        "p_floor_random_heads": _floor(heads) if tested else float("nan"),
        "p_withheld": " | ".join(why),
        "n_windows": int(diffs.numel()),
        "n_draws": int(n_draws),
        "distinct_random_planes": _distinct(planes),
        "distinct_random_heads": _distinct(heads),
        "n_heads": int(n_heads),
        "base": float(base.mean()),
    }


@dataclass(frozen=True)
class _Control:
    """A random control at one dose: how many sets it drew, how many distinct, and why its p-value
    is withheld ("" where the control can differ from the set and has as many sets as draws)."""

    n_draws: int
    n_distinct: int
    withheld: str

    @classmethod
    def of(cls, drawn: Sequence[Any], n_possible: int, what: str) -> _Control:
        n_distinct = distinct_sets(drawn)
        return cls(
            len(drawn), n_distinct, control_verdict(n_possible, len(drawn), n_distinct, what)
        )


def _floor(control: _Control | None) -> float:
    return float("nan") if control is None or not control.n_draws else p_floor(control.n_draws)


def _distinct(control: _Control | None) -> float:
    return float("nan") if control is None or not control.n_draws else float(control.n_distinct)


def _corpus_name(corpus: Any) -> str:
    if isinstance(corpus, Tensor):
        return "tokens"
    return str(getattr(corpus, "name", None) or corpus or "english")


def _p(observed: Tensor, draws: list[Tensor], metric: str, control: _Control | None) -> float:
    if not draws or control is None or control.withheld:
        return float("nan")
    return permutation_p_value(
        HARM[metric] * float(observed.mean()), [HARM[metric] * float(d.mean()) for d in draws]
    )


def _inputs(
    model, corpus, n_ctx, n_windows, metrics, seed, prompt_len
) -> tuple[Tensor, Tensor, list[Any]]:
    if isinstance(corpus, Tensor):
        text = data.check_token_windows(corpus).long()
    else:
        text = data.windows(corpus, model.tokenizer, n_ctx, n_windows=n_windows)
    vocab = min(len(model.tokenizer), hf_model_of(model).get_input_embeddings().num_embeddings)
    rand = random_tokens(text.shape[0], text.shape[1], vocab, model.tokenizer.bos_token_id, seed)
    cases = []
    if "retrieval" in metrics:
        depths = np.linspace(0.1, 0.9, text.shape[0]).tolist()
        cases = [
            copy_case(
                model.tokenizer,
                passkey_prompt(
                    model.tokenizer,
                    prompt_len or text.shape[1],
                    d,
                    make_passkey(seed + PROMPT_SEED_OFFSET, t),
                ),
            )
            for t, d in enumerate(depths)
        ]
    return text, rand, cases


class _Experiment:
    """Runs conditions against the unmodified model's per-window values and turns effects into table
    rows."""

    def __init__(self, model, spec, probe: KnockoutProbe, **ci: Any) -> None:
        self.model, self.spec, self.probe, self.ci = model, spec, probe, ci
        self.base = probe.measure(model, spec)  # fixes the probe heads' own offsets too
        self.population = {L: range(spec[L].n_heads) for L in spec.rotary_layers}

    def run(self, planes: Planes) -> dict[str, Tensor]:
        """Per-window effect (knocked out − unmodified) of every metric."""
        with knocked_out(self.model, planes):
            got = self.probe.measure(self.model, self.spec)
        return {m: got[m] - self.base[m] for m in self.base}

    def random_draws(
        self, heads: Heads, k: int, n: int, seed: int
    ) -> tuple[list[dict[str, Tensor]], _Control]:
        """``n`` draws of k random planes per head: their effects, and the control they make."""
        rng = np.random.default_rng(seed)
        drawn = [_planes(self.spec, heads, "random", k, rng) for _ in range(n)]
        n_possible = math.prod(math.comb(self.spec[layer].n_planes, k) for layer, _ in heads)
        control = _Control.of(
            [tuple(sorted(p.items())) for p in drawn], n_possible, "the random planes"
        )
        return [self.run(p) for p in drawn], control

    def rows(
        self,
        name: str,
        direction: str,
        k: int,
        n_heads: int,
        draws: list[dict[str, Tensor]],
        controls: Mapping[str, _Control | None] | None = None,
        **p: dict[str, float],
    ) -> list[dict[str, Any]]:
        """One row per metric of the effect averaged over ``draws`` within each window."""
        return [
            _row(
                name,
                direction,
                k,
                m,
                torch.stack([d[m] for d in draws]).mean(0),
                self.base[m],
                n_heads=n_heads,
                n_draws=len(draws),
                **{key: v[m] for key, v in p.items()},
                **(controls or {}),
                tested=bool(p),
                **self.ci,
            )
            for m in self.base
        ]

    def dose_rows(
        self,
        name: str,
        heads: Heads,
        direction: str,
        k: int,
        random_planes: tuple[list[dict[str, Tensor]], _Control | None],
        controls: tuple[list[Heads], _Control | None],
    ) -> list[dict[str, Any]]:
        """The set's rows at dose ``k`` (p-values against ``random_planes`` and ``controls`` given
        the same planes, withheld where a control cannot differ from the set), then the random head
        sets' own rows."""
        if k == 0:  # nothing zeroed: the model itself, so the effect is 0 on every window
            return self.rows(
                name, direction, 0, len(heads), [{m: v - v for m, v in self.base.items()}]
            )
        planes = _planes(self.spec, heads, direction, k)
        of_layer = {
            L: ps for (L, _), ps in planes.items()
        }  # high, low and head: the same planes in every head of a layer
        eff = self.run(planes)
        (plane_draws, by_planes), (head_sets_drawn, by_heads) = random_planes, controls
        draws = [self.run({hd: of_layer[hd[0]] for hd in cs}) for cs in head_sets_drawn]
        p = {
            "p_planes": {m: _p(eff[m], [d[m] for d in plane_draws], m, by_planes) for m in eff},
            "p_heads": {m: _p(eff[m], [d[m] for d in draws], m, by_heads) for m in eff},
        }
        both = {"planes": by_planes, "heads": by_heads}
        out = self.rows(name, direction, k, len(heads), [eff], both, **p)
        if draws:
            out += self.rows(
                name, f"random heads ({direction})", k, len(heads), draws, {"heads": by_heads}
            )
        return out


def _check_settings(
    n_ctx, n_windows, n_boot, n_random, n_control, seed, prompt_len, level, directions, metrics
):
    """The run's settings checked (an InputError naming the first bad one) and normalised."""
    check_number(n_ctx, "n_ctx", at_least=2, integer=True)
    check_number(n_windows, "n_windows", at_least=MIN_WINDOWS, integer=True)
    check_n_boot(n_boot)
    n_random = check_number(
        n_random, "n_random", at_least=0, integer=True, hint=" (random plane draws per dose)"
    )
    n_control = check_number(
        n_control, "n_control", at_least=0, integer=True, hint=" (random head sets per dose)"
    )
    seed = check_number(seed, "seed", integer=True)
    if prompt_len is not None:
        prompt_len = check_number(
            prompt_len, "prompt_len", at_least=2, integer=True, hint=" (tokens per prompt)"
        )
    level = check_number(level, "level", above=0, at_most=0.999)
    directions = (directions,) if isinstance(directions, str) else tuple(directions)
    metrics = tuple(dict.fromkeys((metrics,) if isinstance(metrics, str) else metrics))
    if not directions or any(d not in ("high", "low") for d in directions):
        raise InputError(
            f"directions must be 'high' and/or 'low', got {list(directions)}; random planes and "
            "whole heads are the controls every run adds"
        )
    if not metrics or any(m not in METRIC_GROUPS for m in metrics):
        raise InputError(f"metrics must be chosen from {tuple(METRIC_GROUPS)}, got {list(metrics)}")
    return directions, metrics, prompt_len, n_random, n_control, seed, level


def _check_set_names(sets: str | Sequence[str]) -> list[str]:
    """The named head sets as a list, each one of :data:`HEAD_SETS`."""
    names = [sets] if isinstance(sets, str) else list(sets)
    unknown = [name for name in names if name not in HEAD_SETS]
    if unknown:
        raise InputError(
            f"unknown head set {unknown[0]!r}: choose from {HEAD_SETS} or pass "
            "{name: [(layer, head), ...]}"
        )
    return names


def _chosen_sets(
    model,
    spec,
    sets: list[str] | Mapping[str, Sequence[tuple[int, int]]],
    metrics: Sequence[str],
    probe_heads: Sequence[tuple[int, int]] | None,
    text: Tensor,
    retrieval_threshold: float,
    seed: int,
) -> tuple[dict[str, tuple[tuple[int, int], ...]], Sequence[tuple[int, int]] | None]:
    """The head sets (given, or found on ``text``) and the probe's heads (default: positional)."""
    wants_probe_heads = "probe" in metrics and probe_heads is None
    if isinstance(sets, Mapping):
        if wants_probe_heads:
            raise InputError(
                "the probe reads the positional heads: pass probe_heads=[(layer, head), ...] "
                "with your own head sets, or drop 'probe' from metrics"
            )
        chosen = {
            str(name): _as_heads(heads, spec, f"head set {name!r}") for name, heads in sets.items()
        }
        return chosen, probe_heads
    wanted = sets + (["positional"] if wants_probe_heads else [])
    found = head_sets(
        model,
        list(dict.fromkeys(wanted)),
        text,
        retrieval_threshold=retrieval_threshold,
        retrieval_ctx=text.shape[1],
        seed=seed,
        verify=False,
    )
    if wants_probe_heads:
        probe_heads = found["positional"]
    return {name: found[name] for name in sets}, probe_heads


def _planes_per_head(spec, chosen: Mapping[str, Sequence[tuple[int, int]]]) -> int:
    """The one plane count of every head in the sets (a dose counts planes)."""
    counts = {spec[layer].n_planes for heads in chosen.values() for layer, _ in heads}
    if len(counts) > 1:
        raise UnsupportedModelError(
            f"the head sets span layers with {sorted(counts)} planes per head: a dose of k "
            "planes is one plane count, so pass head sets from layers of one width"
        )
    return counts.pop()


@dataclass(frozen=True)
class _Schedule:
    """The conditions every head set is measured under: doses, directions and their controls."""

    doses: tuple[int, ...]
    directions: tuple[str, ...]
    control_at: frozenset[int]
    n_random: int
    n_control: int
    whole_head_planes: int | None
    seed: int

    @classmethod
    def build(
        cls,
        doses: Sequence[int] | None,
        control_doses: Sequence[int] | None,
        n_planes: int,
        *,
        directions: tuple[str, ...],
        n_random: int,
        n_control: int,
        whole_head: bool,
        seed: int,
    ) -> _Schedule:
        """The schedule with doses checked against ``n_planes`` (default 0, n/8, n/4, n/2, n) and
        control doses (default every nonzero dose)."""
        if doses is None:
            doses = sorted({0, n_planes // 8, n_planes // 4, n_planes // 2, n_planes})
        doses = _check_doses(doses, n_planes)
        control_at = (
            doses[1:]
            if control_doses is None
            else _check_doses(control_doses, n_planes, "control_doses")[1:]
        )
        return cls(
            doses=doses,
            directions=directions,
            control_at=frozenset(control_at),
            n_random=n_random,
            n_control=n_control,
            whole_head_planes=n_planes if whole_head else None,
            seed=seed,
        )

    @property
    def random_doses(self) -> list[int]:
        """The nonzero control doses that get random-plane draws."""
        return [dose for dose in self.doses[1:] if dose in self.control_at and self.n_random]

    def conditions_per_set(self) -> int:
        """How many conditions one head set is measured under (the progress bar's steps)."""
        whole_head = self.whole_head_planes is not None
        return len(self.directions) * len(self.doses) + len(self.random_doses) + whole_head


def _set_rows(
    experiment: _Experiment,
    name: str,
    heads: Sequence[tuple[int, int]],
    set_index: int,
    schedule: _Schedule,
    bar: Any,
) -> list[dict[str, Any]]:
    """One head set's rows: every direction at every dose, random planes, the whole head.

    ``bar`` (a tqdm bar) advances once per condition measured."""
    seed = schedule.seed
    drawn = (
        matched_random_sets(heads, experiment.population, schedule.n_control, seed + set_index)
        if schedule.n_control
        else []
    )
    n_possible = matched_set_count(heads, experiment.population)
    controls = (
        drawn,
        _Control.of(drawn, n_possible, "the random head sets") if drawn else None,
    )
    none: tuple[list, None] = ([], None)
    random_at = {
        dose: experiment.random_draws(
            heads, dose, schedule.n_random, seed + 7919 * dose + 104729 * set_index
        )
        for dose in schedule.random_doses
    }
    rows: list[dict[str, Any]] = []
    for direction in schedule.directions:
        for dose in schedule.doses:
            rows += experiment.dose_rows(
                name,
                heads,
                direction,
                dose,
                random_at.get(dose, none),
                controls if dose in schedule.control_at else none,
            )
            bar.update()
    for dose, (draws, control) in random_at.items():
        rows += experiment.rows(name, "random", dose, len(heads), draws, {"planes": control})
        bar.update()
    if schedule.whole_head_planes is not None:
        rows += experiment.dose_rows(
            name, heads, "head", schedule.whole_head_planes, none, controls
        )
        bar.update()
    return rows


def _all_rows(
    experiment: _Experiment, chosen: Mapping[str, Heads], schedule: _Schedule, progress: bool
) -> list[dict[str, Any]]:
    """Every head set's rows, with a progress bar over the conditions measured (tqdm, stderr)."""
    rows: list[dict[str, Any]] = []
    total = len(chosen) * schedule.conditions_per_set()
    with tqdm(total=total, desc="knockout", unit="condition", disable=not progress) as bar:
        for set_index, (name, heads) in enumerate(chosen.items()):
            rows += _set_rows(experiment, name, heads, set_index, schedule, bar)
    return rows


def _check_model_and_sets(
    model, sets: Sequence[str] | Mapping[str, Sequence[tuple[int, int]]]
) -> list[str] | Mapping[str, Sequence[tuple[int, int]]]:
    """The head sets checked (known names, or a mapping; not empty) and the model's tokenizer."""
    if not isinstance(sets, Mapping):
        sets = _check_set_names(sets)
    if not sets:
        raise InputError("sets is empty: name a head set or pass {name: [(layer, head), ...]}")
    if getattr(model, "tokenizer", None) is None:
        raise InputError(
            f"{type(model).__name__} has no .tokenizer: pass a model from ropelens.load_model"
        )
    return sets


def _knockout_settings(
    schedule: _Schedule,
    metrics: Sequence[str],
    *,
    n_boot: int,
    level: float,
    retrieval_threshold: float,
    n_prompts: int,
    prompt_len: int | None,
) -> dict[str, Any]:
    """The run's settings as its provenance records them."""
    return {
        "doses": list(schedule.doses),
        "directions": list(schedule.directions),
        "metrics": list(metrics),
        "n_random": schedule.n_random,
        "n_control": schedule.n_control,
        "control_doses": sorted(schedule.control_at),
        "whole_head": schedule.whole_head_planes is not None,
        "n_boot": n_boot,
        "level": level,
        "seed": schedule.seed,
        "retrieval_threshold": retrieval_threshold,
        "n_prompts": n_prompts,
        "prompt_len": prompt_len,
    }


def _knockout_probe(
    text: Tensor,
    random_tokens: Tensor,
    cases: list[Any],
    probe_heads: Sequence[tuple[int, int]] | None,
    spec,
    metrics: Sequence[str],
) -> KnockoutProbe:
    """The probe measuring every metric of the chosen metric groups on the run's inputs."""
    return KnockoutProbe(
        text,
        random_tokens,
        cases,
        _as_heads(probe_heads, spec, "probe_heads") if probe_heads else (),
        tuple(metric for group in metrics for metric in METRIC_GROUPS[group]),
    )


def knockout(
    model,
    sets: Sequence[str] | Mapping[str, Sequence[tuple[int, int]]] = ("positional",),
    *,
    doses: Sequence[int] | None = None,
    directions: Sequence[str] = ("high", "low"),
    metrics: Sequence[str] = ("loss", "probe"),
    corpus: Any = None,
    n_ctx: int = 256,
    n_windows: int = 8,
    prompt_len: int | None = None,
    n_random: int = 9,
    n_control: int = 9,
    control_doses: Sequence[int] | None = None,
    whole_head: bool = True,
    probe_heads: Sequence[tuple[int, int]] | None = None,
    n_boot: int = 2000,
    level: float = 0.95,
    seed: int = 0,
    retrieval_threshold: float = 0.1,
    verify: bool = True,
    progress: bool = True,
    text_column: str = "text",
) -> Knockout:
    """Dose-response of zeroing planes in head sets, against random-plane and random-head controls.

    For each head set, k RoPE planes of every head (the k highest frequencies, ``"high"``, or the k
    lowest, ``"low"``) are zeroed in the rotated q and k
    (:func:`ropelens.run.intervene.ablate_planes`: exactly those planes' logit terms removed); the
    whole-head knockout zeroes every rotary plane. Each effect is the mean paired difference
    (knocked out − unmodified) over windows with a paired bootstrap CI; ``p_random_planes`` is the
    layer-clustered permutation p-value against as many random planes per head in the same heads,
    ``p_random_heads`` against random head sets with as many heads per layer given the same planes,
    both one-sided in the direction of damage (see :mod:`ropelens.run.stats`).

    Args:
        model: The model: what :func:`ropelens.load_model` or :func:`ropelens.testing.tiny_model`
            returns (a TransformerLens bridge, or the plain HF model with ``bridge=False``), or an
            nnsight ``LanguageModel``.
        sets (Sequence[str] | Mapping[str, Sequence[tuple[int, int]]]): Names from :data:`HEAD_SETS`
            (``"positional"``, ``"retrieval"``, ``"sinks"``, ``"others"``), found on the model, or
            ``{name: [(layer, head), ...]}`` (default ``("positional",)``).
        doses (Sequence[int] | None): Plane counts per head (default None: 0, n/8, n/4, n/2 and n of
            the n planes per head; 0 is always added).
        directions (Sequence[str]): ``"high"`` and/or ``"low"`` (default both).
        metrics (Sequence[str]): Metric groups: ``"loss"`` (next-token loss on text), ``"probe"``
            (previous-token, diagonal and positional attention mass of the probe heads on random
            tokens) and ``"retrieval"`` (copy loss and accuracy on passkey digits) (default
            ``("loss", "probe")``).
        corpus: The text: any form :func:`ropelens.run.data.load_corpus` reads, or ready
            ``[n_windows, n_ctx]`` tokens (default None: the built-in "english" corpus).
        n_ctx (int): Tokens per window (default 256).
        n_windows (int): Windows each effect is measured on (default 8).
        prompt_len (int | None): Tokens per retrieval prompt, one prompt per window, passkey depths
            spread over 0.1–0.9 (default None: ``n_ctx``).
        n_random (int): Random plane draws per head at each control dose (default 9).
        n_control (int): Random head sets (as many heads per layer) given the set's planes at each
            control dose (default 9).
        control_doses (Sequence[int] | None): The doses the controls run at (default None: every
            nonzero dose).
        whole_head (bool): Also knock out whole heads, and their random-head control (default True).
        probe_heads (Sequence[tuple[int, int]] | None): The heads whose attention the probe reads
            (default None: the positional heads).
        n_boot (int): Bootstrap resamples per CI, at least
            :data:`ropelens.run.evaluate.MIN_BOOT` (100) (default 2000).
        level (float): Confidence level of the CIs (default 0.95).
        seed (int): Seed of the random draws, tokens and bootstrap (default 0).
        retrieval_threshold (float): Retrieval score from which a head is in the ``"retrieval"`` set
            (default 0.1).
        verify (bool): First check that the RoPE reading reproduces the model's own attention
            (default True; False: the result says unverified).
        progress (bool): A bar over the conditions measured (tqdm, on stderr; default True).
        text_column (str): The column of a table or dataset corpus that holds the text (default
            "text").

    Returns:
        Knockout: One row per (head set, direction, dose, metric), with the controls' rows, the head
        sets and the probe heads.

    Raises:
        InputError: When a setting is out of range, a head set is unknown or names heads the model
            lacks, or a dose exceeds the planes per head.
        UnsupportedModelError: When ``verify`` finds that the RoPE reading does not reproduce the
            model's own attention, or the head sets span layers with different plane counts.

    Examples:
        >>> from ropelens.analyses import knockout
        >>> from ropelens.testing import tiny_model
        >>> model = tiny_model("llama")
        >>> ko = knockout(
        ...     model, {"mine": [(1, 0), (1, 1)]}, doses=[4], directions=["high"],
        ...     metrics=["loss"], n_ctx=32, n_windows=4, n_random=2, n_control=2, n_boot=200,
        ...     whole_head=False, progress=False,
        ... )
        >>> sorted(set(ko.to_frame()["direction"]))
        ['high', 'random', 'random heads (high)']
        >>> row = ko.rows[1]
        >>> row["dose"], row["n_windows"], bool(row["lo"] <= row["estimate"] <= row["hi"])
        (4, 4, True)
    """
    model = running_model(model)  # an nnsight model: the HF model it wraps
    started = time.perf_counter()
    directions, metrics, prompt_len, n_random, n_control, seed, level = _check_settings(
        n_ctx, n_windows, n_boot, n_random, n_control, seed, prompt_len, level, directions, metrics
    )
    sets = _check_model_and_sets(model, sets)
    for given, what in ((doses, "doses"), (control_doses, "control_doses")):
        if given is not None:  # whole plane counts, refused before any model runs
            _check_doses(given, math.inf, what)
    if not isinstance(corpus, Tensor):
        corpus = data.load_corpus(corpus, text_column=text_column)
    spec = rope_spec(model)
    verified = verification(model, spec, verify=verify)
    text, random_tokens, cases = _inputs(model, corpus, n_ctx, n_windows, metrics, seed, prompt_len)
    chosen, probe_heads = _chosen_sets(
        model, spec, sets, metrics, probe_heads, text, retrieval_threshold, seed
    )
    probe = _knockout_probe(text, random_tokens, cases, probe_heads, spec, metrics)
    n_planes = _planes_per_head(spec, chosen)
    schedule = _Schedule.build(
        doses,
        control_doses,
        n_planes,
        directions=directions,
        n_random=n_random,
        n_control=n_control,
        whole_head=bool(whole_head),
        seed=seed,
    )
    experiment = _Experiment(model, spec, probe, n_boot=n_boot, level=level, seed=seed)
    rows = _all_rows(experiment, chosen, schedule, progress)
    settings = _knockout_settings(
        schedule,
        metrics,
        n_boot=n_boot,
        level=level,
        retrieval_threshold=retrieval_threshold,
        n_prompts=len(cases),
        prompt_len=prompt_len,
    )
    provenance = replace(
        _knockout_provenance(model_label(model), corpus, text, settings, probe, verified, started),
        **placement(model),
    )
    return Knockout(
        rows=tuple(rows),
        heads=chosen,
        probe_heads=probe.probe_heads,
        n_planes=n_planes,
        provenance=provenance,
    )


def _knockout_provenance(
    model_name: str,
    corpus: Any,
    text: Tensor,
    settings: dict[str, Any],
    probe: KnockoutProbe,
    verified: Any,
    started: float,
) -> Provenance:
    """Where a knockout's numbers come from: model, windows, settings, the probe's offsets."""
    offsets = {f"{layer}.{head}": offset for (layer, head), offset in probe.offsets.items()}
    return Provenance(
        model=model_name,
        corpus=_corpus_name(corpus),
        n_tokens=int(text.numel()),
        n_windows=int(text.shape[0]),
        n_ctx=int(text.shape[1]),
        config={
            **settings,
            "probe_offsets": offsets,
            "whole_head_knockout": "every rotary plane of q and k zeroed",
            "verification": verified.to_dict(),
        },
        seconds=time.perf_counter() - started,
    )
