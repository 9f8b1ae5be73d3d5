"""Attention decomposition drawn: one head's logits band by band, beside the model's pattern; and
the rotation behind them, q and k turning in each plane with position; and the band mixer, an
interactive page that recomputes the pattern of any set of bands and planes."""

from __future__ import annotations

import base64
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from html import escape as html_escape
from pathlib import Path
from typing import Any

import numpy as np
import plotly.graph_objects as go
import torch
from jaxtyping import Bool, Float
from plotly.subplots import make_subplots
from torch import Tensor

from ropelens.analyses.attention_decomposition import AttentionDecomposition
from ropelens.analyses.head_taxonomy import HeadTaxonomy
from ropelens.errors import InputError
from ropelens.plots.style import style_figure
from ropelens.results.serialize import atomic_write_text
from ropelens.spec.rope import LayerRope

__all__ = [
    "HALF_TOLERANCE",
    "BandMixer",
    "band_mixer",
    "decode_array",
    "decomposition_figure",
    "rotation_figure",
    "encode_array",
    "STORAGE",
    "storage_error",
    "strongest_positional_head",
]


def decomposition_figure(
    dec: AttentionDecomposition, layer: int | None = None, head: int = 0, batch: int = 0
) -> go.Figure:
    """One head (default: head 0 of the first layer): each band's logits as a heatmap, and the
    model's pattern."""
    layer = dec.layers[0] if layer is None else layer
    n = _real_length(dec, batch)  # a padded row shows its text only
    x = dec.band_logits(layer)[batch, head, :, :n, :n]
    names = dec.band_names(layer)
    fig = make_subplots(
        rows=1, cols=len(names) + 1, subplot_titles=[*names, "pattern"], horizontal_spacing=0.02
    )
    lim = float(x[torch.isfinite(x)].abs().max()) if torch.isfinite(x).any() else 1.0
    for b in range(len(names)):
        z = x[b].masked_fill(~torch.isfinite(x[b]), float("nan")).numpy()
        fig.add_trace(
            go.Heatmap(
                z=z,
                coloraxis="coloraxis",
                hovertemplate="q %{y} k %{x}<br>logit %{z:.3f}<extra></extra>",
            ),
            row=1,
            col=b + 1,
        )
    fig.add_trace(
        go.Heatmap(
            z=dec.pattern(layer)[batch, head, :n, :n].numpy(),
            colorscale="Greys",
            showscale=False,
            hovertemplate="q %{y} k %{x}<br>p %{z:.3f}<extra></extra>",
        ),
        row=1,
        col=len(names) + 1,
    )
    fig.update_yaxes(autorange="reversed")
    fig.update_layout(
        coloraxis={"colorscale": "RdBu", "cmin": -lim, "cmax": lim, "cmid": 0},
        title=f"Layer {layer} head {head}: logit by band",
        height=330,
    )
    return fig


Q_COLOUR = "#c0392b"
K_COLOURS = ("#1f5fa8", "#2a9d8f", "#7b4fa0", "#d08a18", "#5b6770", "#b5487e")
FAINT = 0.35  # opacity of the pre-RoPE vectors and the paths they turned along
COLS = 2  # panels per row: a band's fastest plane beside its slowest
# pixels: a panel's height, the gap between rows (their titles), above the panels (the figure's
# title and the legend) and below them
PANEL, GAP, TOP, BOTTOM, WIDTH = 320, 100, 110, 60, 1120


def _arc(radius: float, start: float, turn: float) -> tuple[list[float], list[float]]:
    """Points of the arc of ``radius`` from angle ``start`` through ``turn`` radians (a whole circle
    where the rotation went round more than once)."""
    sweep = max(-2 * math.pi, min(2 * math.pi, turn))
    n = max(2, int(abs(sweep) / (math.pi / 90)) + 1)
    angles = [start + sweep * i / (n - 1) for i in range(n)]
    return [radius * math.cos(a) for a in angles], [radius * math.sin(a) for a in angles]


def _vector_traces(row: Any, colour: str, first: bool) -> list[go.Scatter]:
    """One vector: its pre-RoPE arrow and the arc it turned along (faint), then the post-RoPE
    arrow to its labelled tip."""
    who = f"{row.role} at {row.position}"
    traces = []
    if math.isfinite(row.pre_x):
        start = math.atan2(row.pre_y, row.pre_x)
        ax, ay = _arc(math.hypot(row.x, row.y), start, row.turn)
        turns = abs(row.turn) / (2 * math.pi)
        traces.append(
            go.Scatter(
                x=[0.0, row.pre_x, None, *ax], y=[0.0, row.pre_y, None, *ay],
                mode="lines", line={"color": colour, "width": 1, "dash": "dot"}, opacity=FAINT,
                name="before RoPE (dotted), turned by position", legendgroup="pre",
                showlegend=first and row.role == "q",
                hovertemplate=f"{who} before RoPE<br>turned by {math.degrees(row.turn):.0f}° "
                f"({turns:.2f} turns)<extra></extra>",
            )
        )  # fmt: skip
    hover = f"{who} after RoPE<br>plane coords (%{{x:.3f}}, %{{y:.3f}})"
    label = f"{row.role} {row.position}"
    if row.role == "k":
        hover += f"<br>angle to q {row.angle:.0f}°<br>plane term {row.term:+.4f}"
    traces.append(
        go.Scatter(
            x=[0.0, row.x], y=[0.0, row.y], mode="lines+markers+text",
            line={"color": colour, "width": 2}, marker={"size": [0, 8], "color": colour},
            text=["", label], textposition="top center", textfont={"color": colour, "size": 10},
            name=label, legendgroup=label, showlegend=first,
            hovertemplate=hover + "<extra></extra>",
        )
    )  # fmt: skip
    return traces


def rotation_figure(
    dec: AttentionDecomposition,
    layer: int | None = None,
    head: int = 0,
    *,
    query: int | None = None,
    keys: Sequence[int] | None = None,
    planes: Sequence[int] | None = None,
    batch: int = 0,
) -> go.Figure:
    """The rotation drawn: in each plane (default: each band's fastest and slowest), q at the query
    and k at a few keys as 2-D vectors after RoPE, each with its pre-RoPE vector and the arc the
    rotation turned it along (faint); each panel lists the angle from each k to q and the plane's
    term of the logit (q·k × score scale). Axes share one scale, so circles are round."""
    layer = dec.layers[0] if layer is None else layer
    rot = dec.rotation(layer, head, query=query, keys=keys, planes=planes, batch=batch)
    panels = list(dict.fromkeys(rot["panel"]))
    rows = math.ceil(len(panels) / COLS)
    titles = []
    for panel in panels:
        r = rot[rot["panel"] == panel].iloc[0]
        titles.append(f"{panel}: plane {r.plane}, {r.wavelength:,.3g} tokens per turn")
    area = PANEL * rows + GAP * (rows - 1)
    fig = make_subplots(
        rows=rows, cols=COLS, subplot_titles=titles, horizontal_spacing=0.09,
        vertical_spacing=GAP / area if rows > 1 else 0.0,
    )  # fmt: skip
    keys_at = list(dict.fromkeys(rot.loc[rot["role"] == "k", "position"]))
    colours = {("q", int(rot.loc[rot["role"] == "q", "position"].iloc[0])): Q_COLOUR}
    colours |= {("k", n): K_COLOURS[j % len(K_COLOURS)] for j, n in enumerate(keys_at)}
    for i, panel in enumerate(panels):
        _panel(fig, rot[rot["panel"] == panel], i // COLS + 1, i % COLS + 1, colours, i == 0)
    for i in range(len(panels), rows * COLS):  # the empty cell after an odd number of panels
        fig.update_xaxes(visible=False, row=i // COLS + 1, col=i % COLS + 1)
        fig.update_yaxes(visible=False, row=i // COLS + 1, col=i % COLS + 1)
    (query_at,) = (n for role, n in colours if role == "q")
    style_figure(fig)
    height = TOP + area + BOTTOM
    fig.update_layout(
        title={
            "text": f"Layer {layer} head {head}: q at position {query_at} and k at earlier "
            "positions, turning with position in each plane",
            "x": 0.01, "y": 1 - 14 / height, "yanchor": "top", "yref": "container",
        },
        height=height, width=WIDTH, margin={"t": TOP, "l": 70, "r": 20, "b": BOTTOM},
        legend={
            "orientation": "h", "x": 0, "y": 1 - 48 / height, "yanchor": "top",
            "yref": "container",
        },
    )  # fmt: skip
    return fig


def _panel(
    fig: go.Figure, sub: Any, row: int, col: int, colours: dict[tuple[str, int], str], first: bool
) -> None:
    """One plane's panel: its vectors, square axes around the longest at the left of its cell,
    and each key's angle and term listed to its right."""
    for r in sub.itertuples():
        for trace in _vector_traces(r, colours[(r.role, r.position)], first):
            fig.add_trace(trace, row=row, col=col)
    lengths = (sub["x"] ** 2 + sub["y"] ** 2) ** 0.5
    pre = ((sub["pre_x"] ** 2 + sub["pre_y"] ** 2) ** 0.5).fillna(0.0)
    radius = 1.3 * float(max(lengths.max(), pre.max(), 1e-12))
    x_ref, y_ref = _refs(fig, row, col)
    keys = sub[sub["role"] == "k"]
    lines = [f"k {r.position}: {r.angle:+.0f}°, term {r.term:+.3g}" for r in keys.itertuples()]
    fig.add_annotation(
        text="angle k→q, term<br>" + "<br>".join(lines), xref=f"{x_ref} domain",
        yref=f"{y_ref} domain", x=1.04, y=1.0, xanchor="left", yanchor="top", align="left",
        showarrow=False, font={"size": 10},
    )  # fmt: skip
    axis = {"range": [-radius, radius], "zeroline": True, "constrain": "domain"}
    axis["constraintoward"] = "left"
    fig.update_xaxes(title_text="plane coordinate 1", row=row, col=col, **axis)
    fig.update_yaxes(
        title_text="plane coordinate 2", scaleanchor=x_ref, scaleratio=1, row=row, col=col, **axis
    )


def _refs(fig: go.Figure, row: int, col: int) -> tuple[str, str]:
    """The x and y axis references (``"x3"``, ``"y3"``) of a subplot."""
    sub = fig.get_subplot(row, col)
    return sub.xaxis.plotly_name.replace("axis", ""), sub.yaxis.plotly_name.replace("axis", "")


# ============================================================================ the band mixer page
# 16 bits a value are kept for a layer only where every probability the page draws from it (all
# bands, each band alone, each band left out) stays this close to the one from float32 q and k
HALF_TOLERANCE = 1e-3
# how the page may store a layer's q and k: two 16-bit forms (IEEE half precision; integers times a
# float32 scale per head and head dim, which keeps 16 bits of each dim's largest value), float32
STORAGE = ("float16", "int16", "float32")
_INT16_MAX = 32767
_ASSETS = Path(__file__).parent
_POSITIONAL = "positional"


@dataclass(frozen=True)
class BandMixer:
    """The band mixer: one self-contained HTML page (no server, no network) holding each chosen
    layer's post-RoPE q and k, which recomputes the attention of any set of bands and planes.

    ``html`` is the page; :meth:`save` writes it; in Jupyter, VS Code and Colab the object shows
    itself (an ``<iframe srcdoc>``, so its script runs wherever notebooks sanitise HTML).
    ``precision``: per layer, how its q and k are stored (a 16-bit form of :data:`STORAGE` where
    the page's probabilities stay within :data:`HALF_TOLERANCE` of float32's, else float32);
    ``half_error``: per layer, the largest probability change of the better 16-bit form.
    """

    html: str
    title: str
    layers: tuple[int, ...]
    precision: dict[int, str]
    half_error: dict[int, float]

    def save(self, path: str | Path) -> Path:
        """Write the page to ``path`` (an ``.html`` file, atomically); returns the path."""
        path = Path(path)
        if path.suffix.lower() not in (".html", ".htm"):
            raise InputError(
                f"{path}: the band mixer is one HTML page: name the file "
                f"{path.with_suffix('.html').name}"
            )
        atomic_write_text(path, self.html)
        return path

    def _repr_html_(self) -> str:
        page = html_escape(self.html, quote=True)
        return (
            f'<iframe srcdoc="{page}" title="{html_escape(self.title, quote=True)}" '
            'style="width:100%;height:960px;border:1px solid #ddd" '
            'sandbox="allow-scripts"></iframe>'
        )

    def __repr__(self) -> str:
        return (
            f"BandMixer({self.title!r}, layers {list(self.layers)}, {len(self.html) / 1e6:.1f} MB)"
        )


def _b64(arr: np.ndarray) -> str:
    return base64.b64encode(arr.tobytes()).decode("ascii")


def encode_array(x: Float[Tensor, "head pos d"], dtype: str) -> dict[str, Any]:
    """``x`` as the page stores it: base64 of little-endian values (row-major) in ``dtype`` of
    :data:`STORAGE`; int16 values come with ``scale``, float32 ``[head, d]``, each value being
    the integer times its head and dim's scale."""
    x = x.detach().to(torch.float32).contiguous()
    if dtype == "int16":
        scale = (x.abs().amax(1, keepdim=True) / _INT16_MAX).to(torch.float32)
        ints = torch.where(scale > 0, x / scale.where(scale > 0, 1.0), 0.0).round()
        return {
            "dtype": dtype,
            "data": _b64(ints.clamp(-_INT16_MAX, _INT16_MAX).numpy().astype("<i2")),
            "scale": _b64(scale[:, 0].numpy().astype("<f4")),
        }
    if dtype not in STORAGE:
        raise InputError(f"storage {dtype!r} is not one of {STORAGE}")
    kind = "<f2" if dtype == "float16" else "<f4"
    return {"dtype": dtype, "data": _b64(x.numpy().astype(kind)), "scale": None}


def decode_array(stored: dict[str, Any], shape: Sequence[int]) -> Float[Tensor, "head pos d"]:
    """The values the page decodes from :func:`encode_array`'s output, in float64 (as the page
    computes)."""
    raw = base64.b64decode(stored["data"])
    kind = {"float16": "<f2", "int16": "<i2", "float32": "<f4"}[stored["dtype"]]
    x = torch.from_numpy(np.frombuffer(raw, dtype=kind).astype(np.float64)).reshape(*shape)
    if stored["dtype"] != "int16":
        return x
    scale = np.frombuffer(base64.b64decode(stored["scale"]), dtype="<f4").astype(np.float64)
    return x * torch.from_numpy(scale).reshape(shape[0], 1, shape[2])


def _probs(
    rope: LayerRope, q: Tensor, k: Tensor, dims: Tensor, mask: Tensor
) -> Float[Tensor, "head q k"]:
    """The pattern of ``dims`` alone, from ``[head, pos, d]`` q and (query-head) k, as the page
    computes it."""
    s = torch.einsum("hqd,hkd->hqk", q[..., dims], k[..., dims]) * rope.score_scale
    return rope.probs(s.masked_fill(~mask, float("-inf")), head_axis=0)


def storage_error(
    rope: LayerRope,
    exact: tuple[Tensor, Tensor],
    stored: tuple[Tensor, Tensor],
    mask: Bool[Tensor, "q k"],
    subsets: Sequence[Tensor],
    reference: Sequence[Tensor] | None = None,
) -> float:
    """The largest change of any probability of the patterns of ``subsets`` (head-dim index sets)
    when ``exact`` ``[head, pos, d]`` q and KV-head k are replaced by ``stored`` ones, both
    computed in float64; inf where a stored value is not finite (float16 overflow).
    ``reference``: the exact patterns, where already computed."""
    if not all(torch.isfinite(x).all() for x in stored):
        return math.inf
    if reference is None:
        reference = _patterns(rope, *exact, mask, subsets)
    worst = 0.0
    for ref, p in zip(reference, _patterns(rope, *stored, mask, subsets), strict=True):
        worst = max(worst, float((ref - p).abs().max()) if p.numel() else 0.0)
    return worst


def _patterns(
    rope: LayerRope, q: Tensor, k: Tensor, mask: Tensor, subsets: Sequence[Tensor]
) -> list[Tensor]:
    """The float64 pattern of each subset of head dims, from ``[head, pos, d]`` q and KV-head k."""
    q, k = q.double(), k.double().repeat_interleave(rope.group_size, dim=0)
    return [_probs(rope, q, k, dims, mask) for dims in subsets]


def _storage(
    rope: LayerRope, q: Tensor, k: Tensor, mask: Tensor, subsets: Sequence[Tensor]
) -> tuple[str, float, tuple[dict[str, Any], dict[str, Any]]]:
    """How the page stores q and k: the first 16-bit form (scaled integers, then half precision)
    whose probabilities stay within :data:`HALF_TOLERANCE` of float32's, else float32; its name,
    the smallest 16-bit error, the stored arrays."""
    reference = _patterns(rope, q, k, mask, subsets)
    smallest = math.inf
    for dtype in ("int16", "float16"):
        enc = (encode_array(q, dtype), encode_array(k, dtype))
        dec = (decode_array(enc[0], q.shape), decode_array(enc[1], k.shape))
        err = storage_error(rope, (q, k), dec, mask, subsets, reference)
        smallest = min(smallest, err)
        if err <= HALF_TOLERANCE:
            return dtype, err, enc
    return "float32", smallest, (encode_array(q, "float32"), encode_array(k, "float32"))


def _band_entries(rope: LayerRope, rb: Any) -> list[dict[str, Any]]:
    """Each band's name, planes and the head dims it holds beyond its planes (non-rotary dims)."""
    plane_dims = rope.plane_dims
    out = []
    for name, planes, dims in zip(rb.names, rb.planes, rb.dims, strict=True):
        in_planes = set(plane_dims[list(planes)].flatten().tolist()) if planes else set()
        out.append(
            {
                "name": name,
                "planes": [int(p) for p in planes],
                "extra": [int(d) for d in dims.tolist() if d not in in_planes],
            }
        )
    return out


def _head_labels(taxonomy: Any, layer: int, n_heads: int) -> list[str] | None:
    """positional (its offset) / sink / other for each head, from a head taxonomy of this layer."""
    if taxonomy is None or layer not in taxonomy.layers:
        return None
    kinds = taxonomy.kinds()[list(taxonomy.layers).index(layer)]
    if len(kinds) != n_heads:
        raise InputError(
            f"the taxonomy has {len(kinds)} heads in layer {layer}, the decomposition "
            f"{n_heads}: pass the head taxonomy of the same model"
        )
    return [
        "sink" if k == "sink" else "other" if k == "content" else f"{_POSITIONAL} ({k})"
        for k in kinds
    ]


def _real_length(dec: AttentionDecomposition, batch: int) -> int:
    """How many tokens of row ``batch`` are text (the rest is padding, never shown)."""
    return int(dec.acts[dec.layers[0]].valid[batch].sum())


def _layer_payload(
    dec: AttentionDecomposition, layer: int, batch: int, taxonomy: Any
) -> tuple[dict[str, Any], float]:
    """One layer's entry in the page's data, and the half-precision error it was judged by."""
    rope, acts = dec.spec.layers[layer], dec.acts[layer]
    n = _real_length(dec, batch)
    q = acts["q_post"][batch, :n].float().transpose(0, 1).contiguous()  # [head, pos, d]
    k = acts["k_post"][batch, :n].float().transpose(0, 1).contiguous()  # [kv_head, pos, d]
    mask = dec.mask(layer)[batch, :n, :n]
    rb = dec.resolved(layer)
    every = torch.arange(q.shape[-1])
    subsets = [every, *rb.dims, *(every[~torch.isin(every, d)] for d in rb.dims)]
    dtype, err, (q_stored, k_stored) = _storage(rope, q, k, mask, subsets)
    explicit = None if torch.equal(mask, rope.mask(n)) else np.packbits(mask.numpy(), axis=None)
    payload = {
        "layer": layer,
        "kind": rope.kind,
        "n_heads": int(q.shape[0]),
        "n_kv_heads": int(k.shape[0]),
        "d_head": int(q.shape[-1]),
        "score_scale": float(rope.score_scale),
        "softcap": rope.softcap,
        "window": rope.window,
        "chunk": rope.chunk,
        "sinks": list(rope.sinks) if rope.sinks is not None else None,
        "plane_dims": rope.plane_dims.tolist(),
        "wavelength": [float(w) if math.isfinite(w) else None for w in rope.wavelength.tolist()],
        "bands": _band_entries(rope, rb),
        "head_labels": _head_labels(taxonomy, layer, int(q.shape[0])),
        "model_top1": dec.pattern(layer)[batch, :, :n, :n].argmax(-1).tolist(),
        "mask": None if explicit is None else base64.b64encode(explicit.tobytes()).decode("ascii"),
        "dtype": dtype,
        "q": q_stored,
        "k": k_stored,
    }
    return payload, err


def _page_layers(dec: AttentionDecomposition, layers: Sequence[int] | None) -> list[int]:
    """The decomposed layers the page holds (all of them by default); unknown ones refused."""
    if layers is None:
        return dec.layers
    if isinstance(layers, int) or not all(isinstance(L, int) for L in layers):
        raise InputError(f"layers is a list of layer indices, e.g. layers=[0, 5]; got {layers!r}")
    missing = [L for L in layers if L not in dec.acts]
    if missing or not layers:
        raise InputError(
            f"layers {missing or '[]'} were not decomposed; decomposed layers: {dec.layers} "
            "(decompose others with attention_decomposition(..., layers=[...]))"
        )
    return list(dict.fromkeys(layers))


def band_mixer(
    dec: AttentionDecomposition,
    *,
    taxonomy: Any = None,
    batch: int = 0,
    layers: Sequence[int] | None = None,
    title: str | None = None,
    open_on: tuple[int, int] | None = None,
) -> BandMixer:
    """The band mixer page of ``dec`` (see :meth:`AttentionDecomposition.explore`)."""
    if taxonomy is not None and not isinstance(taxonomy, HeadTaxonomy):
        raise InputError(
            f"taxonomy must be a HeadTaxonomy (from head_taxonomy(model)), got "
            f"{type(taxonomy).__name__}"
        )
    n_batch = int(dec.tokens.shape[0])
    if isinstance(batch, bool) or not isinstance(batch, int) or not 0 <= batch < n_batch:
        raise InputError(f"batch {batch!r} is not a row of the input: pick 0..{n_batch - 1}")
    chosen = _page_layers(dec, layers)
    _check_open_on(dec, open_on, chosen)
    if open_on is None and taxonomy is not None:
        open_on = strongest_positional_head(taxonomy, chosen)
    title = title or f"{dec.provenance.model}: band mixer"
    n = _real_length(dec, batch)  # a padded row shows its text only
    ids = dec.tokens[batch, :n].tolist()
    text = dec.token_text[batch][:n] if dec.token_text is not None else [f"#{i}" for i in ids]
    payloads, errors = [], {}
    for L in chosen:
        payload, errors[L] = _layer_payload(dec, L, batch, taxonomy)
        payloads.append(payload)
    data = {
        "title": title,
        "model": dec.provenance.model,
        "tokens": list(text),
        "token_ids": ids,
        "layers": payloads,
        "taxonomy": taxonomy is not None,
        **({"open": {"layer": open_on[0], "head": open_on[1]}} if open_on else {}),
    }
    page = _page_html(title, data)
    return BandMixer(
        html=page,
        title=title,
        layers=tuple(chosen),
        precision={p["layer"]: p["dtype"] for p in payloads},
        half_error=errors,
    )


def strongest_positional_head(
    taxonomy: HeadTaxonomy, layers: Sequence[int]
) -> tuple[int, int] | None:
    """The positional head of ``layers`` with the largest robust offset mass in ``taxonomy``
    (None where none of them is positional): where a page with head labels opens."""
    df = taxonomy.to_frame()
    pos = df[df["positional"] & df["layer"].isin(list(layers))]
    if pos.empty:
        return None
    best = pos.loc[pos["robust_mass"].idxmax()]
    return int(best["layer"]), int(best["head"])


def _check_open_on(
    dec: AttentionDecomposition, open_on: tuple[int, int] | None, layers: Sequence[int]
) -> None:
    """``open_on``, the (layer, head) the page opens on: a layer on the page, one of its heads."""
    if open_on is None:
        return
    if not (isinstance(open_on, tuple | list) and len(open_on) == 2):
        raise InputError(f"open_on must be a (layer, head) pair, got {open_on!r}")
    L, h = open_on
    if L not in layers:
        raise InputError(f"open_on layer {L!r} is not on the page: it holds layers {list(layers)}")
    n_heads = dec.spec.layers[L].n_heads
    if isinstance(h, bool) or not isinstance(h, int) or not 0 <= h < n_heads:
        raise InputError(f"open_on head {h!r} is not a head of layer {L}: pick 0..{n_heads - 1}")


def _page_html(title: str, data: dict[str, Any]) -> str:
    """The page: styles, the data as JSON (``</`` escaped) and the script, inline."""
    css = (_ASSETS / "band_mixer.css").read_text(encoding="utf-8")
    js = (_ASSETS / "band_mixer.js").read_text(encoding="utf-8")
    payload = json.dumps(data, separators=(",", ":"), allow_nan=False).replace("</", "<\\/")
    return (
        "<!DOCTYPE html>\n<html lang='en'><head><meta charset='utf-8'>"
        f"<title>{html_escape(title)}</title>"
        "<meta name='viewport' content='width=device-width, initial-scale=1'>"
        f"<style>{css}</style></head><body>"
        f"<script type='application/json' id='ropelens-data'>{payload}</script>"
        f"<script>{js}</script></body></html>\n"
    )
