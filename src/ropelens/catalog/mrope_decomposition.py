"""The decomposition of multimodal RoPE (M-RoPE) attention by position axis:
``mrope_decomposition``."""

from __future__ import annotations

from ropelens.analyses.mrope_decomposition import MRopeDecomposition, mrope_decomposition
from ropelens.analyses.registry import Analysis, draw
from ropelens.plots.mrope_decomposition import mrope_figure

ANALYSIS = Analysis(
    "mrope-decomposition",
    mrope_decomposition,
    MRopeDecomposition,
    draw(MRopeDecomposition, figure=mrope_figure),
    summary="A vision-language model's attention logits split by position axis (time, height, "
    "width) and band.",
)
