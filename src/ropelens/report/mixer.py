"""Where the report embeds the band mixer: after the positional-heads section, a section holding
the mixer's self-contained page for the positional heads the report found.

:func:`mixer_page` is the hook: it returns the mixer's HTML page for those heads (from
``AttentionDecomposition.explore``), or None while ropelens has no mixer to embed, in which case the
report has no mixer section. :func:`mixer_section` frames a page in an ``iframe`` (``srcdoc``: the
report stays one self-contained file)."""

from __future__ import annotations

from ropelens.analyses.head_taxonomy import HeadTaxonomy
from ropelens.report.collect import ReportData
from ropelens.report.html import esc

__all__ = ["MIXER_AFTER", "MIXER_KEY", "band_mixer_html", "mixer_page", "mixer_section",
           "positional_heads"]  # fmt: skip

MIXER_AFTER = "head-taxonomy"  # the section the mixer follows
MIXER_KEY = "band-mixer"  # its anchor
MIXER_HEIGHT_PX = 760


def positional_heads(data: ReportData) -> list[tuple[int, int]]:
    """The (layer, head) pairs the positional-heads section found, strongest first ([] where it did
    not run)."""
    measured = data.results.get(MIXER_AFTER)
    tx = getattr(measured, "value", measured)
    if not isinstance(tx, HeadTaxonomy):
        return []
    df = tx.to_frame()
    pos = df[df.positional].sort_values("robust_mass", ascending=False)
    return [(int(L), int(h)) for L, h in zip(pos["layer"], pos["head"], strict=True)]


def mixer_page(data: ReportData, heads: list[tuple[int, int]]) -> str | None:
    """The band mixer's self-contained HTML page for ``heads`` on the report's text: the hook the
    mixer fills (``AttentionDecomposition.explore``); None: no mixer, no section."""
    del data, heads
    return None


def mixer_section(page: str, heads: list[tuple[int, int]]) -> str:
    """The report's section holding the mixer ``page`` in a frame of its own."""
    named = ", ".join(f"L{L}.H{h}" for L, h in heads[:8]) + (" …" if len(heads) > 8 else "")
    return (
        f'<section id="{MIXER_KEY}"><h2>Band mixer</h2>'
        f'<p class="lead">Switch bands on and off and watch the positional heads ({esc(named)}) '
        "lose or keep their pattern; recomputed in the page from the band logits.</p>"
        f'<iframe class="mixer" title="band mixer" srcdoc="{esc(page)}" '
        f'style="width:100%;height:{MIXER_HEIGHT_PX}px;border:1px solid #e3e6ec" '
        'sandbox="allow-scripts"></iframe></section>'
    )


def band_mixer_html(data: ReportData) -> str:
    """The mixer's section for the positional heads found ("" where there are none, or no mixer)."""
    heads = positional_heads(data)
    page = mixer_page(data, heads) if heads else None
    return "" if page is None else mixer_section(page, heads)
