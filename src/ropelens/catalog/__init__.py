"""Every analysis ropelens offers, one module each, registered here in order.

A module of this package declares one analysis (``ANALYSIS``, an
:class:`ropelens.analyses.registry.Analysis`): the function a notebook calls and the result it
returns (from ``ropelens.analyses``), the figures that draw it (``ropelens.plots``), the
``ropelens`` subcommand that runs it (its options, its run and its printout) and the section it adds
to the report (its measure and render steps). Every module uses the same names: ``options(parser)``
and ``run(args)`` for the command, ``measure(data)`` and ``render(data, measured)`` (or
``render(data)`` for a section drawn from the streaming pass) for the section, and ``ANALYSIS``,
last, for the declaration. The lines below register them; the order is the order of ``ropelens
--help`` and of the report's sections. A new analysis is one module here and one line below.
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
    attention_by_distance,
    attention_decomposition,
    attention_sinks,
    band_location,
    band_statistics,
    base_predictions,
    claims,
    compare,
    explore,
    extension_planes,
    extension_study,
    frequency_entropy,
    frequency_usage,
    head_taxonomy,
    intervention_effect,
    knockout,
    massive_values,
    mrope_decomposition,
    passkey_retrieval,
    pe_geometry,
    positional_symbolic,
    prope_sweep,
    report,
    retrieval_heads,
    rope_spec,
    rotary_offsets,
    trajectory,
    variant_frequencies,
)
from ropelens.plots.export import write_figure
from ropelens.results.figures import register_writer

__all__ = ["ANALYSES", "Analysis", "analyses", "analysis", "draw", "register_analysis"]

register_writer(write_figure)
register_analysis(rope_spec.ANALYSIS)
register_analysis(report.ANALYSIS)
register_analysis(frequency_usage.ANALYSIS)
register_analysis(attention_decomposition.ANALYSIS)
register_analysis(explore.ANALYSIS)
register_analysis(band_statistics.ANALYSIS)
register_analysis(head_taxonomy.ANALYSIS)
register_analysis(attention_sinks.ANALYSIS)
register_analysis(attention_by_distance.ANALYSIS)
register_analysis(massive_values.ANALYSIS)
register_analysis(rotary_offsets.ANALYSIS)
register_analysis(positional_symbolic.ANALYSIS)
register_analysis(frequency_entropy.ANALYSIS)
register_analysis(band_location.ANALYSIS)
register_analysis(variant_frequencies.ANALYSIS)
register_analysis(intervention_effect.ANALYSIS)
register_analysis(prope_sweep.ANALYSIS)
register_analysis(pe_geometry.ANALYSIS)
register_analysis(extension_planes.ANALYSIS)
register_analysis(base_predictions.ANALYSIS)
register_analysis(passkey_retrieval.ANALYSIS)
register_analysis(retrieval_heads.ANALYSIS)
register_analysis(extension_study.ANALYSIS)
register_analysis(knockout.ANALYSIS)
register_analysis(claims.ANALYSIS)
register_analysis(trajectory.ANALYSIS)
register_analysis(compare.ANALYSIS)
register_analysis(mrope_decomposition.ANALYSIS)
