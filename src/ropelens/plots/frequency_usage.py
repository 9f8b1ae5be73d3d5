"""Frequency usage drawn: layer × plane (or head × plane) heatmaps of the q and k plane norms."""

from __future__ import annotations

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from ropelens.analyses.frequency_usage import FrequencyUsage, Scope, Which
from ropelens.errors import InputError

__all__ = ["usage_figure", "usage_heatmap"]


def usage_heatmap(
    u: FrequencyUsage,
    which: Which = "q",
    scope: Scope = "all",
    *,
    layer: int | None = None,
    coloraxis: str | None = None,
) -> go.Heatmap:
    """Layer × plane heatmap (head-averaged), or head × plane for one ``layer``."""
    z = u.norm(which, scope)
    wl = u.wavelengths()
    if layer is None:
        z2, ylab, y = z.nanmean(1), "layer", list(u.layers)  # heads a layer lacks are NaN: left out
    else:
        if layer not in u.layers:
            raise InputError(f"layer {layer} was not measured; measured layers: {list(u.layers)}")
        i = u.layers.index(layer)
        lr = u.spec.layers[layer]
        heads = lr.n_heads if which == "q" else lr.n_kv_heads
        z2, ylab, y = (
            z[i, :heads, : lr.n_planes],
            "head" if which == "q" else "kv head",
            list(range(heads)),
        )
        wl = wl[i : i + 1, : lr.n_planes].expand(heads, -1)
    return go.Heatmap(
        z=z2.numpy(),
        x=list(range(z2.shape[-1])),
        y=y,
        coloraxis=coloraxis,  # NaN cells draw empty
        customdata=[[f"{w:.1f}" for w in row] for row in wl.tolist()],
        hovertemplate=f"{ylab} %{{y}}<br>plane %{{x}} (λ=%{{customdata}} tokens)<br>mean norm "
        f"%{{z:.3f}}<extra>{which}</extra>",
        colorbar={"title": "mean ‖·‖"} if coloraxis is None else None,
    )


def _unrotated_note(u: FrequencyUsage, which: Which, scope: Scope, layer: int | None) -> str:
    share = u.unrotated_share(which, scope)
    if layer in u.layers:  # a layer not measured is refused by the heatmap
        share = share[u.layers.index(layer)]
    # NaN: a file written before the unrotated dims were measured
    shown = f"{float(share.nanmean()):.0%}" if bool(share.isfinite().any()) else "unknown"
    return f" (unrotated dims, not drawn: {shown} of the energy)"


def usage_figure(u: FrequencyUsage, scope: Scope = "all", layer: int | None = None) -> go.Figure:
    """q and k heatmaps side by side: layer × plane, or head × plane for ``layer``."""
    what = "layer" if layer is None else f"head (layer {layer})"
    titles = [f"{noun}: {what} × plane" for noun in ("queries", "keys")]
    if u.has_unrotated:  # the planes drawn are not the whole head: say how much they leave out
        titles = [t + _unrotated_note(u, w, scope, layer) for t, w in zip(titles, ("q", "k"))]
    fig = make_subplots(rows=1, cols=2, subplot_titles=titles, horizontal_spacing=0.08)
    for col, w in ((1, "q"), (2, "k")):
        fig.add_trace(
            usage_heatmap(u, w, scope, layer=layer, coloraxis="coloraxis"), row=1, col=col
        )  # type: ignore[arg-type]
        fig.update_xaxes(title_text="plane (0 = highest frequency)", row=1, col=col)
        rows = "layer" if layer is None else ("head" if w == "q" else "kv head")
        fig.update_yaxes(title_text=rows, autorange="reversed", type="category", row=1, col=col)
    fig.update_layout(
        coloraxis={"colorscale": "Viridis", "colorbar": {"title": "mean ‖·‖"}},
        title=f"Frequency usage — {u.provenance.model} "
        f"({'all tokens' if scope == 'all' else 'sink positions excluded'}; {u.measured_as})",
        height=420 if layer is None else 320,
        margin={"t": 70, "l": 60, "r": 20, "b": 50},
    )
    return fig
