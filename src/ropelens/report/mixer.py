"""Where the report embeds the band mixer: after the positional-heads section, a section holding
the mixer's self-contained page for the positional heads the report found.

:func:`mixer_page` is the hook: it returns the mixer's HTML page for those heads (from
``AttentionDecomposition.explore``), or None while ropelens has no mixer to embed, in which case the
report has no mixer section. :func:`mixer_section` frames a page in an ``iframe`` (``srcdoc``: the
report stays one self-contained file)."""

from __future__ import annotations

from ropelens.analyses.attention_decomposition import attention_decomposition
from ropelens.analyses.head_taxonomy import HeadTaxonomy
from ropelens.report.collect import ReportData
from ropelens.report.html import esc
from ropelens.results.findings import count_of, head_name

__all__ = ["MIXER_AFTER", "MIXER_KEY", "band_mixer_html", "measure_mixer", "mixer_heads",
           "mixer_layers", "mixer_page", "mixer_section", "positional_heads"]  # fmt: skip

MIXER_AFTER = "head-taxonomy"  # the section the mixer follows
MIXER_KEY = "band-mixer"  # its anchor
MIXER_HEIGHT_PX = 760
# the page holds q and k of every head of the layers it shows: the layers of the strongest few
# positional heads, over the first tokens of one window, keep it near a megabyte for SmolLM2
MIXER_TOKENS = 128
MIXER_MAX_LAYERS = 4
MAX_NAMED = 8  # heads the introduction names at most


def _taxonomy(data: ReportData) -> HeadTaxonomy | None:
    """The head taxonomy the report measured (None where its section did not run)."""
    measured = data.results.get(MIXER_AFTER)
    tx = getattr(measured, "value", measured)
    return tx if isinstance(tx, HeadTaxonomy) else None


def positional_heads(data: ReportData) -> list[tuple[int, int]]:
    """The (layer, head) pairs the positional-heads section found, strongest first ([] where it did
    not run)."""
    tx = _taxonomy(data)
    if tx is None:
        return []
    df = tx.to_frame()
    pos = df[df.positional].sort_values("robust_mass", ascending=False)
    return [(int(L), int(h)) for L, h in zip(pos["layer"], pos["head"], strict=True)]


def mixer_layers(heads: list[tuple[int, int]]) -> list[int]:
    """The layers the mixer holds for ``heads`` (strongest first): those of the strongest heads, at
    most :data:`MIXER_MAX_LAYERS`, in order."""
    layers: list[int] = []
    for L, _ in heads:
        if L not in layers and len(layers) < MIXER_MAX_LAYERS:
            layers.append(L)
    return sorted(layers)


def mixer_heads(heads: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """The positional ``heads`` the mixer holds (those in :func:`mixer_layers`), strongest first."""
    held = set(mixer_layers(heads))
    return [(L, h) for L, h in heads if L in held]


def measure_mixer(data: ReportData, *, verify: bool = True) -> None:
    """Build the band mixer's page for the strongest positional heads into
    ``data.results[MIXER_KEY]``: the first :data:`MIXER_TOKENS` tokens of the first window,
    decomposed in the report's bands on the layers of those heads (at most
    :data:`MIXER_MAX_LAYERS`: :func:`mixer_layers`). Nothing where no head is positional."""
    heads = positional_heads(data)
    layers = mixer_layers(heads)
    if not layers:
        return
    dec = attention_decomposition(
        data.model,
        data.tokens[:1, :MIXER_TOKENS],
        bands=data.band_stats.bands,
        layers=layers,
        verify=verify,
    )
    page = dec.explore(
        taxonomy=_taxonomy(data), title=f"{data.label}: band mixer", open_on=heads[0]
    )
    data.results[MIXER_KEY] = page.html


def mixer_page(data: ReportData, heads: list[tuple[int, int]]) -> str | None:
    """The band mixer's self-contained HTML page that :func:`measure_mixer` built for ``heads``;
    None: no mixer, no section."""
    del heads
    return data.results.get(MIXER_KEY)


# the mixer posts its height from inside its frame; the report sizes the frame to it
_FIT_FRAME = (
    "window.addEventListener('message', (e) => { const h = e.data && e.data.ropelensMixerHeight;"
    " if (!h) return; for (const f of document.querySelectorAll('iframe.mixer'))"
    " if (f.contentWindow === e.source) f.style.height = (h + 4) + 'px'; });"
)


def mixer_section(page: str, heads: list[tuple[int, int]]) -> str:
    """The report's section holding the mixer ``page`` in a frame of its own; its introduction
    names the positional ``heads`` (strongest first) the mixer holds, and says how many it leaves
    out."""
    held = mixer_heads(heads)
    named = ", ".join(head_name(L, h) for L, h in held[:MAX_NAMED])
    if len(held) > MAX_NAMED:
        named += f" and {len(held) - MAX_NAMED} more"
    layers = mixer_layers(heads)
    where = f"layer {layers[0]}" if len(layers) == 1 else f"layers {', '.join(map(str, layers))}"
    rest = len(heads) - len(held)
    left = (
        f"; {count_of(rest, len(heads), 'positional head')} sit in other layers, which it leaves "
        "out"
        if rest
        else ""
    )
    return (
        f'<section id="{MIXER_KEY}"><h2>Band mixer</h2>'
        f'<p class="lead">The mixer holds {esc(where)}, with the positional heads '
        f"{esc(named)}{esc(left)}. Switch bands on and off and watch those heads lose or keep "
        "their pattern; recomputed in the page from the band logits.</p>"
        f'<iframe class="mixer" title="band mixer" srcdoc="{esc(page)}" '
        f'style="width:100%;height:{MIXER_HEIGHT_PX}px;border:1px solid #e3e6ec" '
        'sandbox="allow-scripts"></iframe>'
        f"<script>{_FIT_FRAME}</script></section>"
    )


def band_mixer_html(data: ReportData) -> str:
    """The mixer's section for the positional heads found ("" where there are none, or no mixer)."""
    heads = positional_heads(data)
    page = mixer_page(data, heads) if heads else None
    return "" if page is None else mixer_section(page, heads)
