"""Every analysis ropelens offers, one module each, registered here in order.

A module of this package declares one analysis (``ANALYSIS``, an :class:`ropelens.analyses.registry.Analysis`):
the function a notebook calls and the result it returns (from ``ropelens.analyses``), the figures that draw it
(``ropelens.plots``), the ``ropelens`` subcommand that runs it (its options, its run and its printout) and the
section it adds to the report (its measure and render steps). Every module uses the same names: ``options(parser)``
and ``run(args)`` for the command, ``measure(data)`` and ``render(data, measured)`` (or ``render(data)`` for a
section drawn from the streaming pass) for the section, and ``ANALYSIS``, last, for the declaration. The lines below register them; the order is the order of ``ropelens --help`` and of the report's
sections. A new analysis is one module here and one line below.
"""

from ropelens.analyses.registry import (
    ANALYSES,
    Analysis,
    analyses,
    analysis,
    draw,
    register_analysis,
)
from ropelens.catalog import (
    band_location,
    band_statistics,
    compare,
    context,
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
    report,
    retrieval,
    sinks,
    spec,
    trajectory,
    truncate,
    usage,
    variant_frequencies,
)

__all__ = ["ANALYSES", "Analysis", "analyses", "analysis", "draw", "register_analysis"]

register_analysis(spec.ANALYSIS)  # ropelens inspect · the report's "Model and RoPE"
register_analysis(report.ANALYSIS)  # ropelens report
register_analysis(usage.ANALYSIS)  # ropelens usage · "Frequency usage"
register_analysis(decompose.ANALYSIS)  # ropelens decompose
register_analysis(band_statistics.ANALYSIS)  # ropelens decompose-stats · "Band decomposition of attention"
register_analysis(heads.ANALYSIS)  # ropelens heads · "Positional heads"
register_analysis(sinks.ANALYSIS)  # ropelens sinks · "Attention sinks by band"
register_analysis(distance.ANALYSIS)  # ropelens distance · "Attention by distance"
register_analysis(massive.ANALYSIS)  # ropelens massive · "Massive values"
register_analysis(offsets.ANALYSIS)  # ropelens offsets
register_analysis(positional_symbolic.ANALYSIS)  # ropelens possym
register_analysis(entropy.ANALYSIS)  # ropelens entropy
register_analysis(band_location.ANALYSIS)  # ropelens bands
register_analysis(variant_frequencies.ANALYSIS)  # ropelens variants
register_analysis(truncate.ANALYSIS)  # ropelens truncate · "p-RoPE inference sweep"
register_analysis(pe_geometry.ANALYSIS)  # ropelens pe-geometry · "PE geometry"
register_analysis(context.ANALYSIS)  # ropelens context · "Context extension"
register_analysis(extrapolation.ANALYSIS)  # ropelens predict-base
register_analysis(passkey.ANALYSIS)  # ropelens passkey
register_analysis(retrieval.ANALYSIS)  # ropelens retrieval
register_analysis(extension.ANALYSIS)  # ropelens extend
register_analysis(knockout.ANALYSIS)  # ropelens knockout
register_analysis(trajectory.ANALYSIS)  # ropelens trajectory
register_analysis(compare.ANALYSIS)  # ropelens compare
register_analysis(mrope.ANALYSIS)  # the vision-language decomposition (a function and its figure)
