"""The figures: one module per analysis, each drawing its results with plotly.

The analyses hold the numbers and import no plotting library; a module here draws one analysis's
results (``ropelens.plots.usage.usage_figure(u)``). Each analysis's declaration (``ropelens.catalog``) names
its drawing functions by result class and figure name, so ``u.figure()``, ``u.heatmap()`` and Jupyter's
display find them; ``style`` holds the look the report pages give their figures.
"""

from ropelens.plots import (
    band_location,
    band_stats,
    context,
    curves,
    decompose,
    distance,
    entropy,
    extension,
    extrapolation,
    heads,
    knockout,
    massive,
    mrope,
    offsets,
    passkey,
    pe_geometry,
    positional_symbolic,
    retrieval,
    sinks,
    style,
    trajectory,
    usage,
)

__all__ = ["band_location", "band_stats", "context", "curves", "decompose", "distance", "entropy", "extension",
           "extrapolation", "heads", "knockout", "massive", "mrope", "offsets", "passkey", "pe_geometry",
           "positional_symbolic", "retrieval", "sinks", "style", "trajectory", "usage"]
