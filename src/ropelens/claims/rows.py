"""Many knockouts in few forwards: the machinery the claims' knockouts share.

Every condition of a knockout (the unmodified model, the claimed set at each dose, each control
draw) is one batch row of one forward (:func:`ropelens.analyses.knockout.knocked_out_rows`); a
condition drawn twice runs once (:func:`distinct_rows`); rows whose knockouts all start at a layer
share the layers below it (:func:`shared_prefix`); the output layer projects only the scored
positions (:func:`logits_only_at`). Head sets split by layer kind (Gemma's local and global) with
:func:`by_layer_kind`. ``experiments/two_models.py`` runs its knockouts with these.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator
from typing import Any

import torch

from ropelens.analyses.knockout import knocked_out_rows, probe_rows
from ropelens.backends.hf import decoder_layers
from ropelens.devices import device_of
from ropelens.spec.reading import hf_model_of

__all__ = [
    "FUNCTION_WORDS",
    "by_layer_kind",
    "chunks",
    "copy_values",
    "distinct_rows",
    "find_heads",
    "first_knocked_layer",
    "head_sets",
    "kind_of",
    "logits_only_at",
    "loss_values",
    "most_positional",
    "probe_values",
    "row_scores",
    "shared_prefix",
    "token_classes",
]

_FUNCTION_WORDS = """a an the and or but if of to in on at by for with from as is are was were be
been being it its this that these those not no can will would should may might must do does did
has have had which who whom whose what when where how than then so such there their they them he
she we you i our your his her also into over under only each any all some more most other"""
FUNCTION_WORDS = frozenset(_FUNCTION_WORDS.split())  # 82 English function words


def kind_of(spec, layer: int) -> str:
    """``local`` (sliding window), ``global`` (full attention) or ``all`` (one kind)."""
    kinds = {lr.window is not None for lr in spec.layers}
    if len(kinds) < 2:
        return "all"
    return "local" if spec[layer].window is not None else "global"


def by_layer_kind(
    step: str, heads: list[tuple[int, int]], kinds: dict[str, str], direction: str
) -> dict[str, dict[str, Any]]:
    """One step's head sets: all ``heads`` (named ``step``) and, in a model with layer kinds
    (Gemma's local and global), the heads of each kind (``"<step> <kind>"``); where every head is
    of one kind, only the set named by it."""
    of_kind = sorted({kinds[str(L)] for L, _ in heads} - {"all"})
    sets = {}
    if heads and len(of_kind) != 1:
        sets[step] = {"heads": heads, "step": step, "direction": direction}
    for kind in of_kind:
        chosen = [hd for hd in heads if kinds[str(hd[0])] == kind]
        sets[f"{step} {kind}"] = {"heads": chosen, "step": step, "direction": direction}
    return sets


def distinct_rows(rows: list[dict]) -> tuple[list[dict], list[int]]:
    """(each distinct row once, in first-seen order; the index of every row among them): random
    head sets of layers with few heads repeat (Gemma's 5 retrieval heads have 64 possible sets),
    and a repeated condition is computed once."""
    keys = [tuple(sorted((hd, tuple(sorted(ps))) for hd, ps in row.items())) for row in rows]
    first: dict[tuple, int] = {}
    for k in keys:
        first.setdefault(k, len(first))
    return [dict(k) for k in first], [first[k] for k in keys]


def chunks(rows: list, size: int) -> Iterator[list]:
    """``rows`` in consecutive pieces of ``size`` (at least 1)."""
    for i in range(0, len(rows), max(1, size)):
        yield rows[i : i + max(1, size)]


def probe_values(model, spec, window, rows, heads, row_tokens) -> list:
    """``[row][head][offset 0/1]`` attention mass of ``heads`` on ``window``."""
    size = row_tokens // window.numel()
    parts = [probe_rows(model, window, c, heads, spec=spec) for c in chunks(rows, size)]
    return torch.cat(parts).tolist()


@contextlib.contextmanager
def logits_only_at(model, positions: torch.Tensor) -> Iterator[None]:
    """While the block runs, the model's output layer projects only ``positions`` (logits
    ``[batch, len(positions), vocab]``): a 262k-token vocabulary costs more than Gemma-3-270M's
    layers, and the copy metric reads a few positions."""
    head = hf_model_of(model).get_output_embeddings()
    head = getattr(head, "original_component", head)  # the bridge wraps the HF module
    own = head.forward
    object.__setattr__(head, "forward", lambda x: own(x[:, positions]))
    try:
        yield
    finally:
        object.__delattr__(head, "forward")


@contextlib.contextmanager
def shared_prefix(model, first_layer: int, n_rows: int) -> Iterator[None]:
    """While the block runs, a one-row forward runs the decoder layers before ``first_layer`` once
    and enters ``first_layer`` with its hidden states repeated ``n_rows`` times: rows whose
    knockouts all lie in ``first_layer`` or later share everything before it (the same numbers as
    ``n_rows`` rows from the start; masks and rotations of batch 1 broadcast)."""
    layer = decoder_layers(hf_model_of(model))[first_layer]

    def repeat(_module, args, kwargs):
        if args:
            args = (args[0].expand(n_rows, *args[0].shape[1:]), *args[1:])
        else:
            hidden = kwargs["hidden_states"]
            kwargs["hidden_states"] = hidden.expand(n_rows, *hidden.shape[1:])
        return args, kwargs

    handle = layer.register_forward_pre_hook(repeat, with_kwargs=True)
    try:
        yield
    finally:
        handle.remove()


def first_knocked_layer(rows: list[dict]) -> int | None:
    """The lowest layer any row knocks a plane out in (None: no row knocks anything out)."""
    layers = [L for row in rows for (L, _), ps in row.items() if len(ps)]
    return min(layers) if layers else None


def row_scores(model, tokens, rows, row_tokens, positions, targets, *, share_prefix=True):
    """Next-token NLL and top-1 hit ``[row, position]`` at ``positions`` of ``tokens`` (one
    window) for ``targets``, under each row's knockout; rows chunked so logits stay within about
    1 GB, and only the scores kept. With ``share_prefix`` the layers below the first knocked-out
    one run once per chunk (:func:`shared_prefix`); without, every row from the embedding on."""
    vocab = hf_model_of(model).get_input_embeddings().num_embeddings
    size = max(1, min(row_tokens // tokens.numel(), int(1e9 // (len(positions) * vocab * 4))))
    device = device_of(model)  # the prompt, positions and targets where the logits are
    tokens, positions, targets = tokens.to(device), positions.to(device), targets.to(device)
    nll, hit = [], []
    for c in chunks(rows, size):
        first = first_knocked_layer(c)
        share = share_prefix and first is not None and first > 0  # first 0: no layer shared
        prefix = shared_prefix(model, first, len(c)) if share else contextlib.nullcontext()
        batch = tokens[None] if share else tokens[None].expand(len(c), -1)
        with knocked_out_rows(model, c), logits_only_at(model, positions), prefix, torch.no_grad():
            logits = model(batch, return_type="logits")
        logp = logits.float().log_softmax(-1)
        del logits
        target = targets[None, :, None].expand(len(c), -1, 1)
        nll.append(-logp.gather(-1, target)[..., 0].double())
        hit.append((logp.argmax(-1) == targets[None]).double())
        del logp
    return torch.cat(nll), torch.cat(hit)


def copy_values(model, case, rows, row_tokens) -> list:
    """``[row][copy nll, copy accuracy]`` on one passkey prompt."""
    q = torch.tensor(case.queries)
    nll, hit = row_scores(model, case.tokens, rows, row_tokens, q, case.tokens[q + 1])
    return torch.stack([nll.mean(-1), hit.mean(-1)], -1).tolist()


def token_classes(tokenizer, tokens) -> tuple[torch.Tensor, torch.Tensor]:
    """Masks over next-token targets ``tokens[1:]``: content words (alphabetic, not a function
    word) and function words."""
    tok = getattr(tokenizer, "tokenizer", None) or tokenizer
    words = [tok.decode([int(t)]).strip().lower() for t in tokens[1:]]
    content = torch.tensor([w.isalpha() and w not in FUNCTION_WORDS for w in words])
    function = torch.tensor([w in FUNCTION_WORDS for w in words])
    return content, function


def loss_values(model, tokens, rows, row_tokens) -> list:
    """``[row][content loss, function loss]`` on one text window."""
    content, function = token_classes(model.tokenizer, tokens)
    pos = torch.nonzero(content | function)[:, 0]  # only the scored positions are projected
    nll, _ = row_scores(model, tokens, rows, row_tokens, pos, tokens[pos + 1])
    content, function = content[pos], function[pos]
    return torch.stack([nll[:, content].mean(-1), nll[:, function].mean(-1)], -1).tolist()


def find_heads(
    model, n_windows: int, n_ctx: int, prompt_len: int, seed: int = 0, spec=None
) -> dict[str, Any]:
    """Positional heads (:func:`~ropelens.analyses.head_taxonomy.head_taxonomy` on ``n_windows``
    windows of ``n_ctx`` tokens of the embedded English corpus), each band's position share and
    content variance, every head's retrieval score (copy score on passkey prompts of
    ``prompt_len`` tokens at depths 0.25 and 0.75, two trials) and each layer's kind
    (:func:`kind_of`), as JSON values."""
    from ropelens.analyses.head_taxonomy import head_taxonomy
    from ropelens.analyses.retrieval_heads import retrieval_scores
    from ropelens.run import data
    from ropelens.spec.reading import rope_spec

    spec = spec if spec is not None else rope_spec(model)
    text = data.windows(data.load_corpus("english"), model.tokenizer, n_ctx, n_windows=n_windows)
    tx = head_taxonomy(model, text, layers=spec.rotary_layers, seed=seed, progress=False)
    pos = tx.positional()
    retr, _ = retrieval_scores(model, (prompt_len,), (0.25, 0.75), 2, seed)
    return {
        "layers": list(tx.layers),
        "band_names": list(tx.band_names),
        "positional": [
            [L, h] for i, L in enumerate(tx.layers) for h in range(pos.shape[1]) if pos[i, h]
        ],
        "robust_mass": tx.robust_mass().tolist(),
        "position_share": tx.scores["position_share_text"].tolist(),
        "content_var": tx.scores["content_var_text"].tolist(),
        "retrieval_score": {
            f"{L}.{h}": float(retr[L, h])
            for L in spec.rotary_layers
            for h in range(spec[L].n_heads)
        },
        "kinds": {str(L): kind_of(spec, L) for L in spec.rotary_layers},
    }


def most_positional(found: dict[str, Any], k: int) -> list[tuple[int, int]]:
    """The ``k`` heads of highest robust positional mass (for random tiny models, which have no
    head past the positional threshold)."""
    mass = torch.tensor(found["robust_mass"], dtype=torch.float64).nan_to_num(-1.0)
    order = mass.flatten().argsort(descending=True)[:k].tolist()
    n = mass.shape[1]
    return sorted((found["layers"][i // n], i % n) for i in order)


def head_sets(
    spec, found: dict[str, Any], semantic_heads: int, quick: bool = False
) -> dict[str, dict[str, Any]]:
    """The head sets each knockout zeroes: positional, retrieval (score ≥ 0.1; in a model with
    layer kinds each also split into its local and its global heads, :func:`by_layer_kind`),
    semantic (the ``semantic_heads`` heads, neither positional nor retrieval, whose lowest band's
    logit varies most with content). ``quick``: the most positional heads stand in where none
    passes the threshold."""
    pos = [tuple(hd) for hd in found["positional"]]
    if not pos and quick:
        pos = most_positional(found, 4)
    retr = sorted(
        tuple(int(x) for x in k.split(".")) for k, v in found["retrieval_score"].items() if v >= 0.1
    )
    sets = {
        **by_layer_kind("positional", pos, found["kinds"], "high"),
        **by_layer_kind("retrieval", retr, found["kinds"], "low"),
    }
    var = torch.tensor(found["content_var"])[..., -1]  # [layer, head]: the lowest band
    taken = set(pos) | set(retr)
    ranked = sorted(
        (
            (float(var[i, h]), (L, h))
            for i, L in enumerate(found["layers"])
            for h in range(spec[L].n_heads)
            if (L, h) not in taken and not math.isnan(float(var[i, h]))
        ),
        reverse=True,
    )
    sem = sorted(hd for _, hd in ranked[:semantic_heads])
    if sem:
        sets["semantic"] = {"heads": sem, "step": "semantic", "direction": "low"}
    return sets
