"""Verification: ropelens's reading of a model checked against the model's own attention, before any
number.

A short probe (two rows of at most a few hundred tokens: one token repeated, and BOS plus random
tokens) runs once per model, per layer that rotates:

- **rotation**: on the repeated token, the rotated q and k ropelens captures at every position (the
  output of the model's own rotation, ``q_rot``/``k_rot``) are the spec's rotation of position 0
  (frequencies, pairing, direction, a NoPE layer read as rotating, a partial slice); where something
  position-dependent reaches a later layer's pre-RoPE query (a learned sink), the captured rotated q
  and k are checked against the spec's rotation of the captured pre-RoPE ones instead;
- **q/k** and **scale**: the query and key the model's attention function receives are the
  captured post-RoPE q and k, and its score scale is the spec's. Post-RoPE q and k are taken where
  they enter the score: in a layer read as normalising them after the rotation
  (``LayerRope.norm_after_rope``: HunYuan dense, NanoChat) they are the normed q and k, so a norm
  after RoPE the reading misses fails here, and the rotation is checked before the norm;
- **scores**: the rebuilt pre-softmax scores (captured q·k times the spec's scale) equal q·k times
  the scale the attention function computes with;
- **mask** and **probs**: the spec's causal / sliding-window / chunked mask is the mask the model
  built (the probe spans two chunks of a chunked layer), and the spec's softmax (soft-cap, sinks) of
  the rebuilt scores gives the model's probabilities;
- **window edge** and **chunk edge**: windows (chunks) longer than the probe are checked at their
  edge against HF's own sliding-window (chunked) mask function with the config's ``sliding_window``
  (``attention_chunk_size``); which layers slide or are chunked is then seen only through the
  config's layer types.

Both capture paths analyses use are checked: the fast q/k path (HF's ``apply_rotary_pos_emb``) and
the bridge's hooks. The reference is the HF model under the bridge
(:func:`ropelens.backends.sdpa_capture.hf_view`) run with eager attention, its
``eager_attention_forward`` wrapped to read its inputs (query, key, mask, scaling) and output
(probabilities); a family without one (GPT-J) gives its probabilities through ``output_attentions``,
and its q/k, scale and score checks are listed as unchecked. Under a ropelens intervention (a RoPE
variant, plane ablation), which lives on the bridge, the reference is the bridge's own scores and
pattern.

The result is cached on the model, keyed by the spec, the modeling functions and attention classes
the model runs (``apply_rotary_pos_emb``, ``rotate_half``, ``eager_attention_forward``, each
attention and rotary module's ``forward``) and every hook on its attention (so a variant or
ablation applied with :mod:`ropelens.run.intervene`, or a patched attention function, is verified
again). Not in the key: in-place edits of weights, and instance-level patches of the HF modules
made after the first probe (the HF view is built once); call :func:`verify_model` with
``force=True`` after such changes.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import math
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from typing import Any

import einops
import torch
from torch import Tensor

from ropelens.backends import backend_of
from ropelens.backends.base import fingerprint
from ropelens.backends.engine import check_model_state
from ropelens.backends.hf import mixed_weights, planned_forward
from ropelens.backends.sdpa_capture import attention_implementation, hf_view
from ropelens.devices import device_of
from ropelens.errors import UnsupportedModelError
from ropelens.run.capture import capture_qk
from ropelens.spec.observed import measure_rotation
from ropelens.spec.plan import describe_intervention
from ropelens.spec.reading import hf_model_of, rope_spec
from ropelens.spec.rope import LayerRope, RopeSpec
from ropelens.spec.rotary_state import rotary_state_kept

__all__ = [
    "UNVERIFIED",
    "Verification",
    "fingerprint",
    "rotation_error",
    "skip_verification",
    "verification",
    "verify_model",
]

PROBE_CTX = 32  # probe length when no sliding window asks for more
MAX_PROBED_WINDOW = (
    512  # windows up to this are seen whole by a longer probe; longer ones at their edge
)
_CACHE = "_ropelens_verification"
_SKIP = "_ropelens_skip_verification"
_CHECKS = ("rotation", "qk", "scale", "scores", "mask", "probs", "window edge", "chunk edge")
# the repeated token of the rotation row (any id: every position then has the same pre-RoPE q)
_TOKEN = 7


@dataclass(frozen=True)
class Verification:
    """The outcome of the probe: passed with the largest error of each check, or unverified (opted
    out)."""

    status: str  # "passed" or "unverified"
    errors: dict[str, float] = field(
        default_factory=dict
    )  # check → largest error over layers and paths
    tolerance: dict[str, float] = field(default_factory=dict)
    layers: tuple[int, ...] = ()
    n_tokens: int = 0  # probe length
    reference: str = ""
    paths: tuple[str, ...] = ()
    unchecked: tuple[str, ...] = ()
    seconds: float = 0.0
    # the interventions in force on the model read (:attr:`RopeSpec.interventions`): what was
    # verified is the model as it runs under them
    interventions: tuple[dict[str, Any], ...] = ()

    @property
    def passed(self) -> bool:
        return self.status == "passed"

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready, as provenance records it (without the probe's time, which differs run to
        run)."""
        d = asdict(self)
        del d["seconds"]
        if not self.interventions:  # written only under an intervention
            del d["interventions"]
        return {k: list(v) if isinstance(v, tuple) else v for k, v in d.items()}

    @property
    def under(self) -> str:
        """The interventions verified under, in words ("" where none)."""
        return "; ".join(describe_intervention(i) for i in self.interventions)

    def describe(self) -> str:
        """One sentence: what was checked and the largest errors, or that nothing was."""
        under = f" under {self.under}" if self.interventions else ""
        if not self.passed:
            return (
                f"unverified{under}: ropelens's reading of this model was not checked against the "
                "model's own attention (verify=False / --no-verify)"
            )
        errs = ", ".join(f"{k} {v:.1e}" for k, v in self.errors.items())
        text = (
            f"verified{under} on a {self.n_tokens}-token probe in {len(self.layers)} rotary layers "
            f"against {self.reference} ({' and '.join(self.paths)}); largest errors: {errs}"
        )
        return text + (f"; not checked: {'; '.join(self.unchecked)}" if self.unchecked else "")


UNVERIFIED = Verification("unverified")


@contextlib.contextmanager
def skip_verification(model) -> Iterator[None]:
    """Every analysis of ``model`` inside the block runs unverified (and says so), as with
    ``verify=False``."""
    object.__setattr__(model, _SKIP, getattr(model, _SKIP, 0) + 1)
    try:
        yield
    finally:
        object.__setattr__(model, _SKIP, getattr(model, _SKIP, 1) - 1)


def verification(
    model, spec: RopeSpec, *, verify: bool = True, length: int | None = None
) -> Verification:
    """The probe's verdict for ``model`` read as ``spec`` (cached), or :data:`UNVERIFIED` when opted
    out.

    ``length``: probe at that many tokens instead of the default (a spec read at the analysed length
    by ``rope_spec(model, length=n)``, whose frequencies hold for inputs of that length).

    First, verified or not, the model's state is checked
    (:func:`ropelens.backends.engine.check_model_state`): one in training mode is refused with
    "call model.eval()", as is one whose weights are on the meta device, before the probe would
    blame the architecture for either."""
    check_model_state(model)
    if not verify or getattr(model, _SKIP, 0):
        return dataclasses.replace(UNVERIFIED, interventions=spec.interventions)
    return verify_model(model, spec, length=length)


def rotation_error(lr: LayerRope, q_post: Tensor) -> float:
    """Relative max error of post-RoPE queries ``[pos, head, d]`` whose pre-RoPE query is the same
    at every position against ``lr``'s rotation of position 0 (which already carries the attention
    scaling once)."""
    n = q_post.shape[0]
    pred = lr.rotate(
        q_post[0].expand(n, -1, -1).transpose(0, 1), torch.arange(n, device=q_post.device)
    ).transpose(0, 1)
    pred[..., : lr.rotary_dim] /= lr.attention_scaling
    return float((pred - q_post).abs().max() / q_post.abs().max().clamp_min(1e-30))


def rotation_from_pre(lr: LayerRope, pre: Tensor, post: Tensor, ablated: bool = False) -> float:
    """Relative max error of captured post-RoPE ``[pos, head, d]`` against the spec's rotation of
    the captured pre-RoPE.

    With ``ablated`` (a plane ablation is active), planes zeroed after RoPE at every position are
    zero in the prediction too, as the rotation of position 0 predicts them where the pre-RoPE query
    is constant.
    """
    pos = torch.arange(pre.shape[0], device=pre.device)
    pred = lr.rotate(pre.transpose(0, 1), pos).transpose(0, 1)
    if ablated:
        gone = (lr.split(post) == 0).all(-1).all(0)  # [head, plane]: zero at every position
        dims = lr.plane_dims.to(post.device)
        mask = torch.zeros(post.shape[1:], dtype=torch.bool, device=post.device)
        mask[:, dims[:, 0]] = gone
        mask[:, dims[:, 1]] = gone
        pred = pred.masked_fill(mask, 0.0)
    return float((pred - post).abs().max() / post.abs().max().clamp_min(1e-30))


# -------------------------------------------------------------------------------------- cache key
def verify_model(
    model, spec: RopeSpec | None = None, *, force: bool = False, length: int | None = None
) -> Verification:
    """Run the probe (see module doc) unless this model and spec already passed it; raise
    :class:`UnsupportedModelError` naming the layer, the check and the size of the error on a
    mismatch."""
    check_model_state(model)  # training mode or meta weights: said as such, not as a mismatch
    spec = spec if spec is not None else rope_spec(model)
    key = fingerprint(model, spec) + ("" if length is None else f"@{int(length)}")
    cache = getattr(model, _CACHE, None)
    if cache is None:
        cache = {}
        object.__setattr__(model, _CACHE, cache)  # not a submodule attribute: nothing registered
    if not force and key in cache:
        return cache[key]
    with rotary_state_kept(model):  # the probe's forwards leave the rotary modules as they were
        probed = _Probe(model, spec, length).run()
    result = dataclasses.replace(probed, interventions=spec.interventions)
    cache[key] = result
    return result


# -------------------------------------------------------------------------------------- the probe
def _tolerance(dtype: torch.dtype) -> dict[str, float]:
    """Relative (rotation, q/k, scores) and absolute (probabilities) tolerances for the model's
    dtype.

    In float32 the captured and the model's tensors come from the same ops (errors ~1e-6, a few
    ulps of the largest entry); 1e-4 leaves room for reductions in another order and is far below
    any misreading (a wrong pairing or a gain moves them by O(1)). In 16-bit floats each value
    carries a rounding of eps/2 relative (bf16: 4e-3), scores are rounded before the softmax, so
    the tolerances grow with eps.
    """
    eps = torch.finfo(dtype).eps if dtype.is_floating_point else 0.0
    t = max(1e-4, 16 * eps)
    return {
        "rotation": t,
        "qk": t,
        "scale": 1e-6,
        "scores": t,
        "mask": 0.0,
        "probs": max(1e-4, 32 * eps),
        "window edge": 0.0,
        "chunk edge": 0.0,
    }


_MEANING = {
    "rotation": "rotated {which} is not the spec's rotation of position 0: wrong frequencies, "
    "pairing or direction, or a layer read as rotating that applies no RoPE",
    "qk": "the {which} that enters the model's score is not the post-RoPE {which} ropelens "
    "captures: a norm or gain after RoPE that the reading (or the bridge) misses, or {which} "
    "taken at the wrong place",
    "scale": "the spec's score scale is not the one the model's attention function uses",
    "scores": "scores carry a term that is not q·k: a bias or a norm after RoPE",
    "mask": "the spec's mask is not the mask the model builds: a window off, chunked attention, "
    "or keys selected at run time (sparse attention) that the capture did not read or the spec's "
    "select_keys does not count",
    "probs": "the spec's softmax of the scores (mask, window, soft-cap, sinks) does not give the "
    "model's probabilities: a soft-cap, sinks or a score bias in the attention function the spec "
    "does not describe",
    "window edge": "the spec's sliding window is not the one HF's mask function builds from the "
    "config",
    "chunk edge": "the spec's attention chunk is not the one HF's chunked mask function builds "
    "from the config",
}


@dataclass
class _Failure:
    check: str
    layer: int
    path: str
    error: float
    tol: float
    detail: str = ""
    seen: str | None = (
        None  # what the model's rotation was measured to do differently (rotation check)
    )

    def message(self, arch: str) -> str:
        which = self.detail if self.check in ("rotation", "qk") else ""
        extra = f" ({self.detail})" if self.detail and not which else ""
        meaning = (
            f"measured on the model's own rotated {which or 'q'}, {self.seen}"
            if self.seen
            else _MEANING[self.check].format(which=which or "q")
        )
        return (
            f"{arch}: layer {self.layer} fails the {self.check} check ({self.path}): error "
            f"{self.error:.3g} > {self.tol:.1g}{extra}: {meaning}; ropelens's reading does not "
            "describe this model (pass verify=False or --no-verify to measure it anyway, "
            "unverified)"
        )


def rotation_mismatch(lr: LayerRope, pre: Tensor, post: Tensor) -> str | None:
    """What the rotation that took ``pre`` to ``post`` (``[pos, head, d]``, positions from 0) does
    that ``lr`` does not, measured (:func:`ropelens.spec.observed.measure_rotation`), in words; None
    where nothing measurable differs."""
    dims = slice(lr.rotary_offset, lr.rotary_offset + lr.rotary_dim)
    if pre.shape != post.shape or pre.shape[0] < 3 or not lr.rotary_dim:
        return None
    obs = measure_rotation(pre[..., dims], post[..., dims], 0)
    differs = obs.differs()
    if differs is not None:
        return differs.removeprefix("its ")
    if obs.pairing != lr.pairing:
        return f"the rotation pairs dims {obs.pairing} where the reading pairs them {lr.pairing}"
    if obs.direction != lr.direction:
        return "the rotation turns the planes the other way from the reading's"
    spec = lr.inv_freq.double()
    rel = (obs.inv_freq - spec).abs() / spec.abs().clamp_min(1e-30)
    if float(rel.max()) > 1e-4:
        i = int(rel.argmax())
        return (
            f"the rotation turns plane {i} by θ = {float(obs.inv_freq[i]):.6g} per token where "
            f"the reading says {float(spec[i]):.6g}"
        )
    scale = obs.scale[~obs.scale.isnan()]
    if scale.numel() and abs(float(scale[0]) - lr.attention_scaling) > 1e-4 * max(
        1.0, lr.attention_scaling
    ):
        return (
            f"the rotation multiplies the norm by {float(scale[0]):.6g} where the reading says "
            f"{lr.attention_scaling:.6g}"
        )
    return None


class _Probe:
    """One run of the probe over a model read as a spec."""

    def __init__(self, model, spec: RopeSpec, length: int | None = None) -> None:
        self.model, self.spec = model, spec
        self.rotary = spec.rotary_layers
        self.device = device_of(model)
        self.tol = _tolerance(next(iter(model.parameters())).dtype)
        self.errors: dict[str, float] = {}
        self.failures: list[_Failure] = []
        self.unchecked: list[str] = []
        windows = [lr.window for lr in spec.layers if lr.window]
        chunks = [lr.chunk for lr in spec.layers if lr.chunk]
        # past every window, and across two chunk boundaries (a query's chunk starts after earlier
        # keys it would see)
        self.n = max(
            [PROBE_CTX]
            + [w + 8 for w in windows if w <= MAX_PROBED_WINDOW]
            + [2 * c + 8 for c in chunks if 2 * c <= MAX_PROBED_WINDOW]
        )
        if length is not None:  # frequencies that hold at this length only: probed there
            self.n = int(length)
        self.long_windows = sorted({w for w in windows if w + 8 > self.n})
        self.long_chunks = sorted({c for c in chunks if 2 * c + 8 > self.n})

    def _note(
        self,
        check: str,
        layer: int,
        path: str,
        err: float,
        detail: str = "",
        seen: Callable[[], str | None] | None = None,
    ) -> None:
        err = float(err) if math.isfinite(err) else math.inf
        self.errors[check] = max(self.errors.get(check, 0.0), err)
        if err > self.tol[check]:
            self.failures.append(
                _Failure(check, layer, path, err, self.tol[check], detail, seen() if seen else None)
            )

    def tokens(self) -> Tensor:
        vocab = int(
            getattr(getattr(self.model, "cfg", None), "d_vocab", 0) or len(self.model.tokenizer)
        )
        g = torch.Generator().manual_seed(0)
        rand = torch.randint(min(4, vocab - 1), vocab, (self.n,), generator=g)
        bos = getattr(self.model.tokenizer, "bos_token_id", None)
        if bos is not None:
            rand[0] = bos
        same = torch.full((self.n,), min(_TOKEN, vocab - 1))
        return torch.stack([same, rand]).to(self.device)

    def run(self) -> Verification:
        t0 = time.perf_counter()
        if not self.rotary:
            return Verification(
                "passed", reference="none (no layer rotates)", seconds=time.perf_counter() - t0
            )
        toks = self.tokens()
        which = ("q_pre", "k_pre", "q_rot", "k_rot", "q_post", "k_post")
        if any(
            self.spec[L].selects(self.n) for L in self.rotary
        ):  # sparse attention: its selection is read too
            which += ("selected",)
        intervened = bool(getattr(self.model, "_ropelens_interventions", 0))

        backend = backend_of(self.model)
        engine = backend.on_engine()  # the plan, if any, is applied by the engine
        slow = backend.capture_path()  # the path analyses take off the fast one
        paths = {
            slow: capture_qk(
                self.model, toks, layers=self.rotary, which=which, fast=False, spec=self.spec
            )
        }
        if (
            not intervened
        ):  # the fast path is off under an intervention: analyses then use the bridge alone
            paths["fast q/k path"] = capture_qk(
                self.model, toks, layers=self.rotary, which=which, fast=True, spec=self.spec
            )
        acts = {
            p: {L: {k: v.float() for k, v in a.tensors.items()} for L, a in got.items()}
            for p, got in paths.items()
        }
        for path, layers in acts.items():
            self._rotation(path, layers)
        if intervened and not engine:
            reference = "the bridge's own attention (a ropelens intervention is active)"
            self._bridge_reference(toks, acts)
        else:
            reference = "the model's own eager attention" + (
                " under the intervention in force" if intervened else ""
            )
            self._hf_reference(toks, acts)
        self._mask_edges()
        if self.failures:
            # the earliest layer first: a wrong reading there changes every later layer's input
            first = min(self.failures, key=lambda f: (f.layer, _CHECKS.index(f.check)))
            raise UnsupportedModelError(first.message(self.spec.architecture))
        return Verification(
            "passed",
            errors={k: self.errors[k] for k in _CHECKS if k in self.errors},
            tolerance={k: self.tol[k] for k in _CHECKS if k in self.errors},
            layers=tuple(self.rotary),
            n_tokens=self.n,
            reference=reference,
            paths=tuple(acts),
            unchecked=tuple(self.unchecked),
            seconds=time.perf_counter() - t0,
        )

    # ------------------------------------------------------------------ checks
    def _rotation(self, path: str, layers: dict[int, dict[str, Tensor]]) -> None:
        for L in self.rotary:
            lr, t = self.spec[L], layers[L]
            for which in ("q", "k"):
                # the repeated-token row, [pos, head, d]; the rotation's own output (before a norm
                # after RoPE)
                pre, post = t[f"{which}_pre"][0], t[f"{which}_rot"][0]
                same = float((pre - pre[:1]).abs().max()) <= 1e-6 * float(
                    pre.abs().max().clamp_min(1e-30)
                )
                ablated = bool(getattr(self.model, "_ropelens_interventions", 0))
                err = (
                    rotation_error(lr, post) if same else rotation_from_pre(lr, pre, post, ablated)
                )
                self._note(
                    "rotation",
                    L,
                    path,
                    err,
                    which,
                    lambda lr=lr, pre=pre, post=post: rotation_mismatch(lr, pre, post),
                )
                if lr.shared_rotary_key and not lr.norm_after_rope:
                    # MLA builds each head around the rotation's output: placed at the spec's rotary
                    # dims, it must be the q/k that enter the score (a wrong offset puts it over the
                    # no-position dims)
                    err = float(
                        (t[f"{which}_rot"] - t[f"{which}_post"]).abs().max()
                        / t[f"{which}_post"].abs().max().clamp_min(1e-30)
                    )
                    self._note("qk", L, path, err, which)
                if lr.rotary_offset or lr.pre_interleaved:
                    # the model's rotation reads another layout than it writes, or a slice inside
                    # the head: its own input, as ropelens lays it out, rotated by the spec must
                    # give its output, in both rows
                    for row in range(t[f"{which}_pre"].shape[0]):
                        err = rotation_from_pre(
                            lr, t[f"{which}_pre"][row], t[f"{which}_rot"][row], ablated
                        )
                        self._note("rotation", L, path, err, which)

    def _compare(
        self,
        L: int,
        acts: dict[str, dict[int, dict[str, Tensor]]],
        query: Tensor | None,
        key: Tensor | None,
        scaling: float | None,
        allowed: Tensor | None,
        probs: Tensor | None,
        capped: Tensor | None = None,
    ) -> None:
        """Compare every path's layer-L capture with what the model's attention got and gave."""
        lr = self.spec[L]
        spec_mask = lr.mask(self.n, self.device)
        if allowed is not None:
            self._compare_masks(lr, acts, allowed, spec_mask)
        if scaling is not None:
            self._note(
                "scale",
                L,
                "the scale the attention function uses",
                abs(lr.score_scale - scaling) / abs(scaling),
                f"spec {lr.score_scale:.6g}, model {scaling:.6g}",
            )
        for path, layers in acts.items():
            q, k = layers[L]["q_post"], layers[L]["k_post"]
            if not self._qk_layout_ok(lr, path, q, k):
                continue
            if query is not None and key is not None:
                self._compare_qk(lr, path, q, k, query, key)
            scores = self._compare_scores(lr, path, q, k, spec_mask, query, key, scaling, capped)
            if probs is not None:
                selected = layers[L].get("selected")
                keep = spec_mask[None, None] & (
                    selected.bool()[:, None] if selected is not None else True
                )
                rebuilt = lr.probs(scores.masked_fill(~keep, float("-inf")))
                self._note("probs", L, path, float((rebuilt - probs).abs().max()))

    def _compare_masks(
        self,
        lr: LayerRope,
        acts: dict[str, dict[int, dict[str, Tensor]]],
        allowed: Tensor,
        spec_mask: Tensor,
    ) -> None:
        """Compare the ``[batch, q, k]`` mask the model built with the spec's and each selection."""
        layer, selects = lr.layer, lr.selects(self.n)
        static = spec_mask[None].expand_as(allowed)
        # a layer whose indexer drops keys: its mask is inside the spec's (no key the spec masks),
        # and below it is exactly each path's captured selection
        expected = allowed & static if selects else static
        self._mask(layer, allowed, expected, "the mask the model built")
        if not selects:
            return
        # a query allowed at most select_keys keys keeps them all; none keeps more
        n_allowed = static.sum(-1)
        n_kept = (allowed & static).sum(-1)
        wrong = int(
            ((n_allowed <= lr.select_keys) & (n_kept != n_allowed)).sum()
            + (n_kept > lr.select_keys).sum()
        )
        self._note(
            "mask",
            layer,
            "the keys the model's indexer keeps",
            float(wrong),
            f"{wrong} queries keep keys select_keys {lr.select_keys} does not account for",
        )
        for path, layers in acts.items():  # each path's captured selection is the model's
            selected = layers[layer].get("selected")
            if selected is not None and selected.shape == allowed.shape:
                self._mask(layer, allowed, spec_mask[None] & selected.bool(), path)
            else:
                self._note("mask", layer, path, math.inf, "no selection captured")

    def _qk_layout_ok(self, lr: LayerRope, path: str, q: Tensor, k: Tensor) -> bool:
        """Whether a path's post-RoPE q and k are ``[batch, pos, head, dim]`` as the spec says.

        A hook read with the wrong layout (or the wrong hook) gives no score: noted as infinite.
        """
        want_q, want_k = (lr.n_heads, lr.head_dim), (lr.n_kv_heads, lr.head_dim)
        if (
            q.ndim == 4
            and k.ndim == 4
            and tuple(q.shape[2:]) == want_q
            and tuple(k.shape[2:]) == want_k
        ):
            return True
        self._note(
            "qk",
            lr.layer,
            path,
            math.inf,
            f"captured q {tuple(q.shape)} and k {tuple(k.shape)} are not "
            f"[batch, pos, heads, d] with {want_q} and {want_k}",
        )
        return False

    def _compare_qk(
        self, lr: LayerRope, path: str, q: Tensor, k: Tensor, query: Tensor, key: Tensor
    ) -> None:
        """Compare a path's q and k with the query and key the model's attention function received.

        The model's head layout is put in ropelens's (MLA: rotary dims first), the same dims
        reordered in q and k.
        """
        for which, ours, theirs in (
            ("q", q, lr.from_model(query)),
            ("k", k, lr.from_model(key)),
        ):
            if ours.shape != theirs.shape:
                self._note("qk", lr.layer, path, math.inf, which)
                continue
            error = float((ours - theirs).abs().max() / theirs.abs().max().clamp_min(1e-30))
            self._note("qk", lr.layer, path, error, which)

    def _compare_scores(
        self,
        lr: LayerRope,
        path: str,
        q: Tensor,
        k: Tensor,
        spec_mask: Tensor,
        query: Tensor | None,
        key: Tensor | None,
        scaling: float | None,
        capped: Tensor | None,
    ) -> Tensor:
        """Note how a path's scores ``[batch, head, query, key]`` match the model's; return them.

        The model's are rebuilt from the query and key its attention function received, else
        taken from the bridge (soft-capped where the model caps).
        """
        scores = _scores(q, k, lr.group_size) * lr.score_scale
        if query is not None and key is not None and scaling is not None and query.shape == q.shape:
            theirs = _scores(query, key, query.shape[2] // key.shape[2]) * scaling
            valid = spec_mask[None, None].expand_as(scores)
            error = (scores - theirs)[valid].abs().max() / theirs[valid].abs().max().clamp_min(
                1e-30
            )
            self._note("scores", lr.layer, path, float(error))
        elif capped is not None:
            ours = scores if not lr.softcap else torch.tanh(scores / lr.softcap) * lr.softcap
            valid = spec_mask[None, None].expand_as(ours)
            error = (ours - capped)[valid].abs().max() / capped[valid].abs().max().clamp_min(1e-30)
            self._note("scores", lr.layer, path, float(error))
        return scores

    def _mask(self, L: int, allowed: Tensor, expected: Tensor, path: str) -> None:
        """Note how many ``[batch, q, k]`` entries of the model's mask differ from ``expected``, and
        the first."""
        diff = (allowed != expected).nonzero()
        detail = ""
        if len(diff):
            _, q, k = diff[0].tolist()
            lr = self.spec[L]
            detail = (
                f"{len(diff)} entries differ, first at query {q}, key {k}: the spec "
                f"{'allows' if expected[diff[0][0], q, k] else 'masks'} it (window {lr.window}"
                + (f", chunk {lr.chunk}" if lr.chunk else "")
                + (f", select_keys {lr.select_keys})" if lr.select_keys else ")")
            )
        self._note("mask", L, path, float(len(diff)), detail)

    def _hf_reference(self, toks: Tensor, acts) -> None:
        """Run the HF model under the bridge with eager attention, reading its attention function's
        inputs and output."""
        hf = hf_view(self.model)
        mod = importlib.import_module(type(hf).__module__)
        orig = getattr(mod, "eager_attention_forward", None)
        calls = [0]

        def wrapped(module, query, key, value, attention_mask, *args, **kwargs):
            out = orig(module, query, key, value, attention_mask, *args, **kwargs)
            L = getattr(module, "layer_idx", None)
            L = calls[0] if not isinstance(L, int) else L
            calls[0] += 1
            if L in self.rotary:
                scaling = kwargs.get("scaling", args[0] if args else None)
                scaling = float(query.shape[-1] ** -0.5 if scaling is None else scaling)
                allowed = None
                if isinstance(attention_mask, Tensor):
                    m = attention_mask[..., : self.n, : self.n]
                    allowed = (m if m.dtype == torch.bool else m == 0).expand(
                        toks.shape[0], -1, -1, -1
                    )[:, 0]
                    if (
                        m.is_floating_point()
                    ):  # an additive mask is 0 or "minus infinity"; anything else is a bias
                        bias = m.isfinite() & (m != 0) & (m > torch.finfo(m.dtype).min / 2)
                        if bool(bias.any()):
                            self._note(
                                "mask",
                                L,
                                "the mask the model adds to its scores",
                                float(bias.sum()),
                                f"{int(bias.sum())} entries are finite and not 0, up to "
                                f"{float(m[bias].abs().max()):.3g}: a bias added to q·k (a "
                                "learned or dynamic mask), not a mask",
                            )
                probs = mixed_weights(
                    module, value, out
                )  # Granite SWA scales its output by sinks after the softmax
                self._compare(
                    L,
                    acts,
                    query.detach().float().transpose(1, 2),
                    key.detach().float().transpose(1, 2),
                    scaling,
                    allowed,
                    probs.detach().float() if probs is not None else None,
                )
            return out

        with (
            attention_implementation(hf, "eager"),
            torch.no_grad(),
            planned_forward(self.model, hf),
        ):
            if orig is None:
                self.unchecked.append(
                    "q/k, scale and scores (the model calls no eager_attention_forward: "
                    "probabilities only, from output_attentions)"
                )
                probs = hf(input_ids=toks, output_attentions=True, use_cache=False).attentions
                for L in self.rotary:
                    self._compare(L, acts, None, None, None, None, probs[L].float())
                return
            mod.eager_attention_forward = wrapped
            try:
                hf(input_ids=toks, use_cache=False)
            finally:
                mod.eager_attention_forward = orig
        if calls[0] == 0:
            self.unchecked.append(
                "scores and probabilities (the attention function was never called)"
            )

    def _bridge_reference(self, toks: Tensor, acts) -> None:
        """Under an intervention: the bridge's own pre-softmax scores (soft-capped, masked) and
        pattern."""
        got: dict[str, Tensor] = {}
        names = {
            f"blocks.{L}.attn.{h}"
            for L in self.rotary
            for h in ("hook_attn_scores", "hook_pattern")
        }
        names &= set(self.model.hook_dict)

        def keep(x: Tensor, hook) -> Tensor:
            got[hook.name] = x.detach().float()
            return x

        with torch.no_grad(), self.model.hooks(fwd_hooks=[(n, keep) for n in sorted(names)]):
            self.model(toks, return_type=None)
        for L in self.rotary:
            scores, pattern = (
                got.get(f"blocks.{L}.attn.hook_attn_scores"),
                got.get(f"blocks.{L}.attn.hook_pattern"),
            )
            if scores is None and pattern is None:
                self.unchecked.append(
                    f"layer {L} scores and probabilities (its bridge fires no score or pattern "
                    "hook)"
                )
                continue
            self._compare(L, acts, None, None, None, None, pattern, scores)

    def _mask_edges(self) -> None:
        """Windows and chunks longer than the probe: HF's own mask function, built with the config's
        size, checked against the spec's mask on both sides of the first edge."""
        try:
            from transformers.masking_utils import (
                chunked_causal_mask_function,
                sliding_window_causal_mask_function,
            )
        except ImportError:
            for what, long in (("windows", self.long_windows), ("chunks", self.long_chunks)):
                if long:
                    self.unchecked.append(
                        f"{what} {long} (longer than the probe; no HF mask function)"
                    )
            return

        cfg = hf_model_of(self.model).config
        cfg = cfg.get_text_config() if hasattr(cfg, "get_text_config") else cfg
        # (name, long sizes, LayerRope field, config key, HF mask function of a size, (q, k) at the
        # edge)
        kinds = (
            (
                "window",
                self.long_windows,
                "window",
                "sliding_window",
                sliding_window_causal_mask_function,
                lambda w: [(q, 0) for q in (w - 1, w, w + 1)],
            ),
            (
                "chunk",
                self.long_chunks,
                "chunk",
                "attention_chunk_size",
                lambda c: chunked_causal_mask_function(c, torch.zeros(1, dtype=torch.long)),
                lambda c: [(q, k) for q in (c - 1, c, c + 1) for k in (0, c - 1, c) if k <= q],
            ),
        )
        for name, long, attr, key, mask_function, edge in kinds:
            if not long:
                continue
            hf_size = getattr(cfg, key, None)
            for L, lr in enumerate(self.spec.layers):
                size = getattr(lr, attr)
                if not size or size not in long:
                    continue
                if not hf_size:
                    self.unchecked.append(
                        f"layer {L} {name} {size} (longer than the probe, no {key} in the config)"
                    )
                    continue
                fn, ours = mask_function(int(hf_size)), lr.mask(size + 2)
                # HF's mask functions take tensor indices
                wrong = sum(
                    bool(fn(0, 0, torch.tensor(q), torch.tensor(k))) != bool(ours[q, k])
                    for q, k in edge(size)
                )
                self._note(
                    f"{name} edge",
                    L,
                    f"HF's {'sliding-window' if name == 'window' else 'chunked'} mask function",
                    float(wrong),
                    f"spec {name} {size}, config {key} {hf_size}",
                )
            self.unchecked.append(
                f"which layers {'slide' if name == 'window' else 'are chunked'}, for "
                f"{name}s longer than the probe (read from the config)"
            )


def _scores(query: Tensor, key: Tensor, group_size: int) -> Tensor:
    """Unscaled scores ``[batch, head, query, key]`` of ``[batch, pos, head, dim]`` q and k.

    Each KV head's key serves ``group_size`` consecutive query heads.
    """
    key = einops.repeat(
        key, "batch pos kv_head dim -> batch pos (kv_head group) dim", group=group_size
    )
    return einops.einsum(
        query, key, "batch query head dim, batch key head dim -> batch head query key"
    )
