"""The decomposition of multimodal RoPE (M-RoPE) attention by position axis: ``mrope_decompose``."""

from __future__ import annotations

from ropelens.analyses.mrope import MRopeDecomposition, mrope_decompose
from ropelens.analyses.registry import Analysis, draw
from ropelens.plots.mrope import mrope_figure

ANALYSIS = Analysis(
    "mrope", mrope_decompose, MRopeDecomposition, draw(MRopeDecomposition, figure=mrope_figure),
    summary="A vision-language model's attention logits split by position axis (time, height, width) and band.",
)
