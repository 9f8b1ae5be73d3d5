"""Multimodal RoPE decomposed per axis: how much of each image-and-text logit the time, height and
width planes carry.

Under M-RoPE (Qwen2-VL, Qwen2.5-VL, Qwen3-VL, Qwen 3.5) each plane turns by one position axis, so
the exact per-plane decomposition of a logit groups into one term per axis (t, h, w, and ``rest``
for the dims a partial-rotary head leaves unrotated) and, within an axis, per frequency band. The
terms add up to the model's pre-softmax score. Qwen2-VL gives time the highest frequencies ([16, 24,
24] contiguous sections); VideoRoPE (Wei et al., ICML 2025) argues time should have the lowest.
:meth:`axis_shares` and :meth:`axis_frequencies` put numbers on that: each axis's share of |logit|
and of logit energy on image and text pairs, and the frequency range it owns; :meth:`by_distance`
gives attention and each axis's logit by distance along that axis between image tokens.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd
import torch
from jaxtyping import Float, Int
from torch import Tensor

from ropelens.analyses.attention_decomposition import AttentionDecomposition, band_terms
from ropelens.devices import device_of
from ropelens.errors import InputError
from ropelens.loading.vision_language import TEXT, as_plain_vl, capture_mrope, mrope_tolerance
from ropelens.results.figures import figure_of
from ropelens.results.findings import Finding
from ropelens.results.provenance import Provenance, placement
from ropelens.run.capture import LayerActs
from ropelens.run.memory import require_decomposition_room
from ropelens.spec.bands import Bands
from ropelens.spec.reading import model_label, rope_spec
from ropelens.spec.rope import MROPE_AXES, LayerRope, describe_axes

__all__ = ["MRopeDecomposition", "axis_bands", "mrope_decomposition"]

PAIRS = ("all", "vision→vision", "text→vision", "vision→text", "text→text")  # query → key modality


def axis_bands(lr: LayerRope) -> Bands:
    """One band per M-RoPE axis (``t``, ``h``, ``w``) holding the planes that axis turns; ``rest``
    takes unrotated dims."""
    if not lr.axes:
        raise InputError(
            f"layer {lr.layer} applies 1-D RoPE (its spec has no M-RoPE axes): use "
            "attention_decomposition"
        )
    return Bands.explicit(
        {
            name: [i for i, a in enumerate(lr.axes) if a == k]
            for k, name in enumerate(MROPE_AXES)
            if k in lr.axes
        },
        require_cover=True,
    )


@dataclass(frozen=True)
class MRopeDecomposition(AttentionDecomposition):
    """Per-axis (and per-band) logits of an image-and-text input under M-RoPE, and its positions.

    What :func:`mrope_decomposition` returns. Under M-RoPE each plane turns by one position axis
    (time, height, width), so the exact per-plane decomposition of a logit groups into one term per
    axis; the terms add up to the model's pre-softmax score. :meth:`axis_shares` gives each axis's
    share of |logit| and of logit energy on image and text pairs, :meth:`axis_frequencies` the
    frequency range each axis owns (Qwen2-VL gives time the highest; VideoRoPE, Wei et al., ICML
    2025, argues it should have the lowest), :meth:`by_distance` attention and each axis's logit by
    distance along that axis between image tokens. ``band_logits``, ``band_patterns`` and ``figure``
    of the base class show one term per axis. Saved as safetensors like its base.

    Attributes:
        tokens (Tensor): The input ids ``[batch, pos]``.
        spec (RopeSpec): The model's RoPE spec, with each plane's axis.
        bands (Bands): The axes as bands (:func:`axis_bands`): ``t``, ``h``, ``w`` and ``rest`` for
            unrotated dims.
        acts (dict[int, LayerActs]): Per decomposed layer, the post-RoPE queries and keys and the
            model's own attention pattern.
        provenance (Provenance): Model, input size, layers, the axes' planes and the verification.
        token_text (tuple[tuple[str, ...], ...] | None): Each token as text per batch row, where
            known.
        position_ids (Tensor): The 3-D position ids the model built, ``[3, batch, pos]`` (t, h, w).
        modality (Tensor): Per token ``[batch, pos]``: 0 text, 1 image, 2 video.

    Raises:
        InputError: When ``position_ids`` or ``modality`` does not match the tokens' shape.

    Examples:
        >>> from ropelens.analyses import mrope_decomposition
        >>> from ropelens.testing.vl import vl_hf_model, vl_inputs
        >>> vl = vl_hf_model("qwen2_vl")  # a tiny random Qwen2-VL
        >>> dec = mrope_decomposition(vl, **vl_inputs(vl), layers=[0])
        >>> tuple(dec.position_ids.shape), dec.provenance.config["axes"]
        ((3, 1, 18), 't 0-15; h 16-39; w 40-63')
        >>> dec.axis_frequencies()["axis"].tolist()
        ['t', 'h', 'w']
        >>> sorted(set(dec.axis_shares()["axis"]))
        ['h', 't', 'w']
    """

    position_ids: Int[Tensor, "3 batch pos"]
    modality: Int[Tensor, "batch pos"]

    def __post_init__(self) -> None:
        b, n = self.tokens.shape
        if tuple(self.position_ids.shape) != (3, b, n) or tuple(self.modality.shape) != (b, n):
            raise InputError(
                f"position_ids {tuple(self.position_ids.shape)} and modality "
                f"{tuple(self.modality.shape)} must be [3, {b}, {n}] and [{b}, {n}] for tokens "
                f"[{b}, {n}]"
            )

    # ---------------------------------------------------------------- persistence
    def _file_tensors(self) -> dict[str, Tensor]:
        return {
            **super()._file_tensors(),
            "position_ids": self.position_ids.contiguous(),
            "modality": self.modality.contiguous(),
        }

    @classmethod
    def load(cls, path: str | Path) -> MRopeDecomposition:
        """Read a decomposition saved with ``save`` (safetensors)."""
        t, fields = cls._read(path)
        return cls(**fields, position_ids=t["position_ids"], modality=t["modality"])

    # ---------------------------------------------------------------- per axis and band
    def axis_band_logits(
        self, layer: int, bands: Bands
    ) -> tuple[list[str], Float[Tensor, "batch head band q k"]]:
        """Each (axis, band) term of every logit, e.g. ``t·Q1 (highest)``: the axes cut by ``bands``
        (unmasked; every term sums with the others, ``rest`` included, to the model's score)."""
        a = self._acts(layer)
        axes, cut = self.resolved(layer), bands.resolve(a.rope)
        groups = {
            f"{ax}·{bn}": sorted(set(ap) & set(bp))
            for ax, ap in zip(axes.names, axes.planes)
            if ax != "rest"
            for bn, bp in zip(cut.names, cut.planes)
            if bn != "rest"
        }
        resolved = Bands.explicit({k: v for k, v in groups.items() if v}).resolve(a.rope)
        return list(resolved.names), band_terms(a["q_post"], a["k_post"], a.rope, resolved)

    def pair_mask(self, layer: int, pair: str) -> torch.Tensor:
        """``[batch, q, k]``: allowed query–key pairs of one modality class (``PAIRS``; images and
        video are vision)."""
        if pair not in PAIRS:
            raise InputError(f"pair {pair!r} unknown: choose from {', '.join(PAIRS)}")
        m = self.mask(layer)
        if pair == "all":
            return m
        vision = self.modality != TEXT
        q_side, k_side = pair.split("→")
        qv = vision if q_side == "vision" else ~vision
        kv = vision if k_side == "vision" else ~vision
        return m & qv[:, :, None] & kv[:, None, :]

    def axis_shares(self, bands: Bands | None = None) -> pd.DataFrame:
        """Per layer × head × pair class × axis (or axis·band with ``bands``): share of the summed
        |term| and of the summed term² over the allowed pairs of that class, and the mean term."""
        rows = []
        for L in self.layers:
            names, x = (
                (self.band_names(L), self.band_logits(L, masked=False))
                if bands is None
                else self.axis_band_logits(L, bands)
            )
            for pair in PAIRS:
                m = self.pair_mask(L, pair)[:, None, None]  # [b,1,1,q,k]
                n = int(m.sum())
                if not n:
                    continue
                terms = torch.where(m, x.double(), 0.0)
                ab, sq = terms.abs().sum((0, 3, 4)), terms.pow(2).sum((0, 3, 4))  # [head, band]
                mean = terms.sum((0, 3, 4)) / n
                for h in range(x.shape[1]):
                    for b, name in enumerate(names):
                        rows.append(
                            {
                                "layer": L,
                                "head": h,
                                "pair": pair,
                                "axis": name,
                                "n_pairs": n,
                                "abs_share": float(ab[h, b] / ab[h].sum().clamp_min(1e-300)),
                                "energy_share": float(sq[h, b] / sq[h].sum().clamp_min(1e-300)),
                                "mean_term": float(mean[h, b]),
                            }
                        )
        return pd.DataFrame(rows)

    def axis_frequencies(self) -> pd.DataFrame:
        """Per decomposed layer × axis: the planes it turns and the frequency (θ, radians per
        token) and wavelength range they span: where the spec puts time, height and width in the
        spectrum."""
        rows = []
        for L in self.layers:
            lr = self.spec[L]
            for k, name in enumerate(MROPE_AXES):
                planes = [i for i, a in enumerate(lr.axes) if a == k]
                if not planes:
                    continue
                theta, wl = lr.inv_freq[planes].double(), lr.wavelength[planes]
                rows.append(
                    {
                        "layer": L,
                        "axis": name,
                        "n_planes": len(planes),
                        "planes": _span(planes),
                        "theta_max": float(theta.max()),
                        "theta_min": float(theta.min()),
                        "wavelength_min": float(wl.min()),
                        "wavelength_max": float(wl.max()),
                        "mean_plane_rank": sum(planes) / len(planes) / max(1, lr.n_planes - 1),
                    }
                )
        return pd.DataFrame(rows)

    def by_distance(self, layer: int) -> pd.DataFrame:
        """Between vision tokens of the same image or video: mean attention, full logit and each
        axis's term by the signed distance along each axis (query's position − key's), per head;
        causal pairs only."""
        x = self.band_logits(layer, masked=False).double()  # [b,h,B,q,k]
        full, prob = x.sum(2), self.pattern(layer).double()
        vision = self.modality != TEXT
        run = torch.cumsum(
            torch.cat([vision[:, :1], vision[:, 1:] & ~vision[:, :-1]], 1).long(), 1
        )  # one id per run
        same = (
            vision[:, :, None]
            & vision[:, None, :]
            & (run[:, :, None] == run[:, None, :])
            & self.mask(layer)
        )
        names = self.band_names(layer)
        rows = []
        for k, axis in enumerate(MROPE_AXES):
            if axis not in names:
                continue
            pos = self.position_ids[k]
            delta = pos[:, :, None] - pos[:, None, :]  # [b,q,k]
            term = x[:, :, names.index(axis)]
            for d in delta[same].unique().tolist():
                m = (same & (delta == d))[
                    :, None
                ].double()  # [b,1,q,k]: every head's mean in one reduction
                n = m.sum()
                means = [((t * m).sum((0, 2, 3)) / n).tolist() for t in (prob, full, term)]
                rows += [
                    {
                        "layer": layer,
                        "head": h,
                        "axis": axis,
                        "distance": int(d),
                        "n_pairs": int(n),
                        "attention": a,
                        "logit": lg,
                        "axis_logit": al,
                    }
                    for h, (a, lg, al) in enumerate(zip(*means, strict=True))
                ]
        return pd.DataFrame(rows)

    # ---------------------------------------------------------------- views
    def findings(self) -> list[Finding]:
        """Each axis's share of |logit| on vision pairs (heads and layers averaged) and the
        frequencies it owns."""
        shares = self.axis_shares()
        freq = self.axis_frequencies()
        out = []
        for pair in ("vision→vision", "text→vision"):
            s = shares[(shares.pair == pair) & (shares.axis != "rest")]
            if s.empty:
                continue
            mean = s.groupby("axis", sort=False).abs_share.mean()
            f = freq[freq.layer == self.layers[0]].set_index("axis")
            parts = [
                f"{ax} {100 * v:.1f}% (planes {f.loc[ax, 'planes']}, wavelengths "
                f"{f.loc[ax, 'wavelength_min']:.3g}–{f.loc[ax, 'wavelength_max']:.3g} tokens)"
                for ax, v in mean.items()
            ]
            values = {ax: round(100 * float(v), 1) for ax, v in mean.items()}
            out.append(
                Finding(
                    key=f"mrope-{pair}",
                    section="M-RoPE axes",
                    text=f"On {pair} pairs, each axis's share of |logit| (mean over heads of "
                    f"layers {self.layers}): " + "; ".join(parts) + ".",
                    values=values,
                )
            )
        return out

    def figure(self, layer: int | None = None, head: int | None = None, batch: int = 0) -> Any:
        """Each axis's share of |logit| per head on vision pairs, and attention by distance along
        each axis (``head``: one head; default the mean over heads); ``figure(layer, head=h)`` of
        the base class draws logits."""
        return figure_of(MRopeDecomposition)(self, layer, head, batch)


def _span(planes: Sequence[int]) -> str:
    """Plane indices in compact form: ``0-15`` or ``0,3,6``."""
    parts, start = [], 0
    for j in range(1, len(planes) + 1):
        if j == len(planes) or planes[j] != planes[j - 1] + 1:
            parts.append(
                f"{planes[start]}" if j - 1 == start else f"{planes[start]}-{planes[j - 1]}"
            )
            start = j
    return ",".join(parts)


def mrope_decomposition(
    model_or_hf,
    input_ids: Int[Tensor, "batch pos"],
    *,
    pixel_values: Tensor | None = None,
    image_grid_thw: Tensor | None = None,
    pixel_values_videos: Tensor | None = None,
    video_grid_thw: Tensor | None = None,
    layers: Sequence[int] | None = None,
    verify: bool = True,
    **model_inputs: Any,
) -> MRopeDecomposition:
    """Decompose every logit of an image-and-text input into one term per M-RoPE axis (and plane).

    The 3-D position ids are the ones the model builds for the input; the queries and keys are
    captured after rotation, and each logit splits exactly into one term per axis (t, h, w, and
    ``rest`` for the dims a partial-rotary head leaves unrotated). Before any number is returned,
    ``verify`` checks the spec's per-axis rotation and the rebuilt attention pattern against the
    model's own.

    Args:
        model_or_hf: An HF vision-language model (Qwen2-VL, Qwen2.5-VL, Qwen3-VL, Qwen 3.5), or one
            loaded with :func:`ropelens.loading.vision_language.load_vl_model`.
        input_ids (Tensor): Integer ``[batch, pos]`` ids holding the model's image (video)
            placeholder tokens where its processor puts them; rows unpadded (one length).
        pixel_values (Tensor | None): The images' pixels, as the model's processor makes them.
        image_grid_thw (Tensor | None): Each image's grid in patches (t, h, w), as the processor
            makes it.
        pixel_values_videos (Tensor | None): The videos' pixels, as the processor makes them.
        video_grid_thw (Tensor | None): Each video's grid in patches (t, h, w).
        layers (Sequence[int] | None): Layer indices to decompose (default None: every rotary
            layer); they must assign planes to axes alike.
        verify (bool): Check the per-axis rotation and the rebuilt pattern against the model's
            (default True; False: the provenance says unverified).
        **model_inputs: Other processor outputs, passed to the model's forward.

    Returns:
        MRopeDecomposition: The captured q/k and pattern per layer, the axes as bands, the 3-D
        position ids ``[3, batch, pos]`` and each token's modality.

    Raises:
        InputError: When ``input_ids`` is not an integer ``[batch, pos]`` tensor, a layer applies
            1-D RoPE, or the chosen layers assign planes to axes differently.
        UnsupportedModelError: When ``verify`` finds that the per-axis rotation or the rebuilt
            pattern does not match the model's.

    Examples:
        >>> from ropelens.analyses import mrope_decomposition
        >>> from ropelens.testing.vl import vl_hf_model, vl_inputs
        >>> vl = vl_hf_model("qwen2_vl")  # a tiny random Qwen2-VL
        >>> dec = mrope_decomposition(vl, **vl_inputs(vl), layers=[0])
        >>> dec.layers, dec.modality.tolist()  # 0 text, 1 image
        ([0], [[0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0]])
        >>> dec.band_names(0)
        ['t', 'h', 'w']
    """
    if not isinstance(input_ids, Tensor) or input_ids.ndim != 2 or input_ids.is_floating_point():
        raise InputError(
            "input_ids must be an integer [batch, pos] tensor with the model's image placeholder "
            "tokens"
        )
    model = as_plain_vl(model_or_hf)
    spec = rope_spec(model)
    chosen = spec.layer_indices(layers)
    bands = axis_bands(spec[chosen[0]])
    other = [L for L in chosen if spec[L].axes != spec[chosen[0]].axes]
    if other:
        raise InputError(
            f"layers {other} assign planes to axes differently from layer {chosen[0]}: decompose "
            "them separately (layers=...)"
        )
    require_decomposition_room(  # every chosen layer's [batch, head, n, n] pattern is kept
        spec,
        chosen,
        int(input_ids.shape[0]),
        int(input_ids.shape[1]),
        model.cfg.dtype,
        int(input_ids.shape[0]),  # one forward of every row
        device_of(model),
    )
    t0 = time.perf_counter()
    cap = capture_mrope(
        model,
        spec,
        input_ids,
        chosen,
        verify=verify,
        pixel_values=pixel_values,
        image_grid_thw=image_grid_thw,
        pixel_values_videos=pixel_values_videos,
        video_grid_thw=video_grid_thw,
        **model_inputs,
    )
    valid = torch.ones(input_ids.shape, dtype=torch.bool)
    acts = {
        L: LayerActs(
            L, spec[L], valid, {n: cap.tensors[L][n] for n in ("q_post", "k_post", "pattern")}
        )
        for L in chosen
    }
    dtype = model.cfg.dtype
    prov = Provenance(
        **placement(model),
        model=model_label(model),
        n_tokens=int(input_ids.numel()),
        n_windows=int(input_ids.shape[0]),
        n_ctx=int(input_ids.shape[1]),
        config={
            "layers": chosen,
            "axes": describe_axes(spec[chosen[0]].axes),
            "n_vision_tokens": int((cap.modality != TEXT).sum()),
            "verification": {
                "status": "passed" if verify else "unverified",
                "errors": cap.errors,
                "tolerance": mrope_tolerance(dtype),
            },
        },
        seconds=time.perf_counter() - t0,
    )
    return MRopeDecomposition(
        tokens=input_ids.cpu(),
        spec=spec,
        bands=bands,
        acts=acts,
        provenance=prov,
        position_ids=cap.position_ids,
        modality=cap.modality,
    )
