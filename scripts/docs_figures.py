"""Draw the figures of docs/concepts.md into docs/assets/concepts/ (PNG, rendered by headless
Chromium through ropelens's own static export).

    python scripts/docs_figures.py

- ``wavelengths.png``: every plane's wavelength 2π/θ_i for the embedded SmolLM2-135M and
  Gemma-3-270M (each layer kind), against their trained context and Gemma's sliding window;
- ``pairing.png``: which head dimensions form each plane under half (Llama) and adjacent (GPT-J)
  pairing, and one plane's query turning with position at a high and a low frequency;
- ``decomposition.png``: one attention score of SmolLM2 split into its band terms, the terms'
  sum beside the score HF's own attention code computes from the same input;
- ``positional.png``: the same for a previous-token head of SmolLM2.

Each figure's numbers come from a function here (``wavelength_data``, ``pairing_data``,
``decomposition_data``) that ``tests/docs/test_pages.py`` checks against an independent
computation on the tiny models.
"""

from __future__ import annotations

import math
import sys
from pathlib import Path
from typing import Any

import plotly.graph_objects as go
import torch
from plotly.subplots import make_subplots

import ropelens
from ropelens.analyses import attention_decomposition
from ropelens.backends import handle
from ropelens.plots.export import write_figures
from ropelens.plots.style import hline_log, style_figure
from ropelens.spec.bands import Bands
from ropelens.spec.rope import RopeSpec, plane_dims

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "docs" / "assets" / "concepts"
TEXT = "The cat sat on the mat. The dog sat on the rug. The cat sat on the"
COLOURS = ("#2f5fd0", "#d0652f", "#2fa05a", "#9b3fc0", "#7f7f7f")


# ------------------------------------------------------------------------------- wavelengths
def wavelength_data(spec: RopeSpec, label: str) -> list[dict[str, Any]]:
    """One record per rotary layer kind: its planes, their wavelengths (tokens), base and the
    trained context and sliding window to mark."""
    out = []
    for kind, layers in spec.rotary_kinds.items():
        lr = spec.layers[layers[0]]
        out.append(
            {
                "name": f"{label}, {kind} layers (base {lr.base:,.0f})",
                "planes": list(range(lr.n_planes)),
                "wavelength": lr.wavelength.tolist(),
                "n_ctx": spec.n_ctx,
                "window": lr.window,
            }
        )
    return out


def wavelength_figure(records: list[dict[str, Any]]) -> go.Figure:
    fig = go.Figure()
    marks: dict[int, str] = {}
    for i, r in enumerate(records):
        fig.add_trace(
            go.Scatter(
                x=r["planes"],
                y=r["wavelength"],
                mode="lines+markers",
                marker={"size": 4},
                line={"color": COLOURS[i % len(COLOURS)]},
                name=r["name"],
            )
        )
        label = r["name"].split(",")[0]
        marks[r["n_ctx"]] = f"{label} trained context {r['n_ctx']:,}"
        if r["window"]:
            marks[r["window"]] = f"{label} sliding window {r['window']:,}"
    for i, (y, text) in enumerate(sorted(marks.items())):
        hline_log(fig, y, text, "dash" if i % 2 == 0 else "dot")
    fig.update_yaxes(
        type="log", title_text="wavelength λ_i = 2π/θ_i (tokens)", exponentformat="power"
    )
    fig.update_xaxes(title_text="plane i (0 = highest frequency)")
    fig.update_layout(
        title="Wavelength of every plane: above a line, a plane never completes a turn",
        legend={"orientation": "h", "y": -0.22},
    )
    return style_figure(fig, height=480)


# ----------------------------------------------------------------------------------- pairing
def pairing_data(head_dim: int = 8) -> dict[str, list[int]]:
    """For each pairing, the plane each head dimension belongs to."""
    out = {}
    for pairing in ("half", "adjacent"):
        plane_of = [0] * head_dim
        for plane, (x, y) in enumerate(plane_dims(head_dim, pairing).tolist()):
            plane_of[x] = plane_of[y] = plane
        out[pairing] = plane_of
    return out


def rotation_data(thetas: tuple[float, ...], positions: int = 8) -> dict[float, list[list[float]]]:
    """A plane's vector (1, 0) rotated to each position m = 0 … positions−1, per frequency θ."""
    return {t: [[math.cos(m * t), math.sin(m * t)] for m in range(positions)] for t in thetas}


def pairing_figure(head_dim: int = 8, thetas: tuple[float, ...] = (1.0, 0.08)) -> go.Figure:
    fig = make_subplots(
        rows=1,
        cols=2,
        column_widths=[0.58, 0.42],
        subplot_titles=(
            f"Which dims form each plane (head dim {head_dim})",
            "One plane of q at positions m = 0…7: angle m·θ_i",
        ),
    )
    rows = pairing_data(head_dim)
    names = {"half": "half (Llama, rotate_half)", "adjacent": "adjacent (GPT-J)"}
    for pairing, plane_of in rows.items():
        for dim, plane in enumerate(plane_of):
            fig.add_trace(
                go.Scatter(
                    x=[dim],
                    y=[names[pairing]],
                    mode="markers+text",
                    marker={"symbol": "square", "size": 38, "color": COLOURS[plane]},
                    text=[f"{plane}"],
                    textfont={"color": "white", "size": 14},
                    showlegend=False,
                    hovertemplate=f"dim {dim}: plane {plane}<extra>{pairing}</extra>",
                ),
                row=1,
                col=1,
            )
    fig.update_xaxes(title_text="head dimension (number in box: its plane)", dtick=1, row=1, col=1)
    fig.update_yaxes(range=[-0.6, 1.6], row=1, col=1)
    for i, (t, pts) in enumerate(rotation_data(thetas).items()):
        colour = COLOURS[i]
        for m, (x, y) in enumerate(pts):
            fig.add_trace(
                go.Scatter(
                    x=[0, x],
                    y=[0, y],
                    mode="lines+markers+text",
                    line={"color": colour, "width": 1.5},
                    marker={"size": [0, 6], "color": colour},
                    text=["", f"m={m}" if t == thetas[0] or m in (0, 7) else ""],
                    textposition="top center" if t == thetas[0] else "middle right",
                    textfont={"size": 10, "color": colour},
                    name=f"θ = {t:g} rad/token (λ = {2 * math.pi / t:.3g} tokens)",
                    legendgroup=str(t),
                    showlegend=m == 0,
                ),
                row=1,
                col=2,
            )
    fig.update_xaxes(range=[-1.3, 1.3], title_text="first dim of the plane", row=1, col=2)
    fig.update_yaxes(
        range=[-1.3, 1.3],
        scaleanchor="x2",
        title_text="second dim of the plane",
        row=1,
        col=2,
    )
    fig.update_layout(legend={"orientation": "h", "y": -0.25, "x": 0.6})
    return style_figure(fig, height=420)


# ----------------------------------------------------------------------------- decomposition
def hf_scores(model, tokens: torch.Tensor, layer: int) -> torch.Tensor:
    """Pre-softmax scores ``[batch, head, q, k]`` of one Llama-style layer, computed with HF's own
    projections, rotary embedding and ``apply_rotary_pos_emb`` from the hidden state the layer's
    attention receives (causal mask not applied)."""
    hf = handle(model).hf
    attn = hf.model.layers[layer].self_attn
    seen: dict[str, Any] = {}

    def grab(_module, args, kwargs):
        seen["hidden"] = kwargs.get("hidden_states", args[0] if args else None)
        seen["cos_sin"] = kwargs["position_embeddings"]

    hook = attn.register_forward_pre_hook(grab, with_kwargs=True)
    try:
        with torch.no_grad():
            hf(input_ids=tokens.to(next(hf.parameters()).device))
    finally:
        hook.remove()
    modeling = sys.modules[type(attn).__module__]
    h = seen["hidden"]
    b, n, _ = h.shape
    d = attn.head_dim
    q = attn.q_proj(h).view(b, n, -1, d).transpose(1, 2)
    k = attn.k_proj(h).view(b, n, -1, d).transpose(1, 2)
    cos, sin = seen["cos_sin"]
    q, k = modeling.apply_rotary_pos_emb(q, k, cos, sin)
    k = k.repeat_interleave(q.shape[1] // k.shape[1], dim=1)
    return (q @ k.transpose(-1, -2) * attn.scaling).detach().double()


def decomposition_data(model, text: str, layer: int, head: int | None = None) -> dict[str, Any]:
    """The last query of ``text`` at ``layer``: each key's band terms (default bands), their sum,
    and HF's own score. ``head`` None picks the head whose attention on the previous token is
    largest (a positional head)."""
    dec = attention_decomposition(model, text, layers=[layer], bands=Bands.default())
    pattern = dec.pattern(layer)[0]  # [head, q, k]
    q = dec.tokens.shape[1] - 1
    if head is None:
        head = int(pattern[:, q, q - 1].argmax())
    terms = dec.band_logits(layer)[0, head, :, q, : q + 1].double()  # [band, k]
    words = dec.token_text[0] if dec.token_text else [str(t) for t in dec.tokens[0].tolist()]
    return {
        "label": dec.provenance.model,
        "layer": layer,
        "head": head,
        "query": q,
        "tokens": list(words[: q + 1]),
        "bands": dec.band_names(layer),
        "terms": terms.tolist(),
        "sum": terms.sum(0).tolist(),
        "hf_score": hf_scores(model, dec.tokens, layer)[0, head, q, : q + 1].tolist(),
        "attention": pattern[head, q, : q + 1].double().tolist(),
    }


def _label(token: str) -> str:
    """A token as an axis label: visible when blank, never read as HTML."""
    text = token.strip() or repr(token)
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def decomposition_figure(d: dict[str, Any]) -> go.Figure:
    keys = [f"{i}:{_label(t)}" for i, t in enumerate(d["tokens"])]
    fig = go.Figure()
    for b, (name, row) in enumerate(zip(d["bands"], d["terms"], strict=True)):
        fig.add_trace(
            go.Bar(x=keys, y=row, name=f"band {name}", marker={"color": COLOURS[b % len(COLOURS)]})
        )
    fig.add_trace(
        go.Scatter(
            x=keys,
            y=d["sum"],
            mode="markers",
            marker={"symbol": "diamond", "size": 11, "color": "black"},
            name="sum of the band terms",
        )
    )
    fig.add_trace(
        go.Scatter(
            x=keys,
            y=d["hf_score"],
            mode="markers",
            marker={"symbol": "x-thin", "size": 14, "line": {"width": 2, "color": "#e0b000"}},
            name="score from HF's own attention code",
        )
    )
    err = max(abs(a - b) for a, b in zip(d["sum"], d["hf_score"], strict=True))
    fig.update_layout(
        barmode="relative",
        title=(
            f"{d['label']} layer {d['layer']} head {d['head']}: the last query's score with "
            f"each key, by band<br><sup>the band terms sum to HF's own score (largest "
            f"difference {err:.1e})</sup>"
        ),
        legend={"orientation": "h", "y": -0.35},
    )
    fig.update_yaxes(title_text="logit term (× score scale)")
    fig.update_xaxes(title_text="key position:token", tickangle=-45)
    return style_figure(fig, height=500)


def main() -> int:
    OUT.mkdir(parents=True, exist_ok=True)
    smol = ropelens.load_model("smollm2-135m", device="cpu")
    gemma = ropelens.rope_spec(ropelens.load_model("gemma-3-270m", device="cpu"))
    records = wavelength_data(ropelens.rope_spec(smol), "SmolLM2-135M")
    records += wavelength_data(gemma, "Gemma-3-270M")
    dec = decomposition_data(smol, TEXT, layer=3)
    pos = decomposition_data(
        smol, TEXT, layer=1
    )  # the layer of SmolLM2's strongest positional head
    for d in (dec, pos):
        err = max(abs(a - b) for a, b in zip(d["sum"], d["hf_score"], strict=True))
        print(
            f"decomposition: layer {d['layer']} head {d['head']}, largest |sum - HF| {err:.2e}, "
            f"attention to the previous token {d['attention'][-2]:.3f}"
        )
    write_figures(
        [
            (wavelength_figure(records), OUT / "wavelengths.png"),
            (pairing_figure(), OUT / "pairing.png"),
            (decomposition_figure(dec), OUT / "decomposition.png"),
            (decomposition_figure(pos), OUT / "positional.png"),
        ],
        width=1000,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
