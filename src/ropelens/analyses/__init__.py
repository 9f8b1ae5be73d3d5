"""Every analysis ropelens offers: the function a notebook calls and the result it returns, in one
namespace.

Corpus analyses (frequency usage, band statistics, head taxonomy, attention sinks, attention by
distance, massive values, rotary offsets, positional symbolic, frequency entropy, band location)
stream windows through :func:`ropelens.run.measure.measure`; the others read the spec (decay,
extension planes, base predictions), a single input (attention decomposition) or run the model under
a variant (passkey retrieval, extension study, knockout, retrieval heads). Each analysis is one
module named after it, and its function and result class are exported here::

    from ropelens.analyses import frequency_usage, FrequencyUsage
"""

from __future__ import annotations

import os

from ropelens.analyses.attention_by_distance import AttentionByDistance, attention_by_distance
from ropelens.analyses.attention_decomposition import (
    AttentionDecomposition,
    attention_decomposition,
)
from ropelens.analyses.attention_sinks import AttentionSinks, attention_sinks
from ropelens.analyses.band_location import BandLocation, band_location
from ropelens.analyses.band_statistics import BandStatistics, band_statistics
from ropelens.analyses.base_predictions import (
    BasePredictions,
    MeasuredExtrapolation,
    base_predictions,
    measured_extrapolation,
)
from ropelens.analyses.decay import (
    rope_decay_by_distance,
    rope_decay_constant,
    rope_gaussian_expectation,
)
from ropelens.analyses.extension_planes import (
    ExtensionPlanes,
    LongRopeSearch,
    extension_planes,
    search_longrope_factors,
)
from ropelens.analyses.extension_study import ExtensionStudy, extension_study
from ropelens.analyses.frequency_entropy import FrequencyEntropy, frequency_entropy
from ropelens.analyses.frequency_usage import FrequencyUsage, frequency_usage
from ropelens.analyses.head_taxonomy import HeadTaxonomy, head_taxonomy
from ropelens.analyses.intervention_effect import InterventionEffect, intervention_effect
from ropelens.analyses.knockout import Knockout, knockout
from ropelens.analyses.massive_values import MassiveValues, massive_values
from ropelens.analyses.mrope_decomposition import MRopeDecomposition, mrope_decomposition
from ropelens.analyses.passkey_retrieval import PasskeyRetrieval, passkey_retrieval
from ropelens.analyses.pe_geometry import PESimilarity, learned_pe, pe_similarity, sinusoidal_pe
from ropelens.analyses.positional_symbolic import PositionalSymbolic, positional_symbolic
from ropelens.analyses.registry import Analysis, register_analysis
from ropelens.analyses.retrieval_heads import RetrievalHeads, retrieval_heads
from ropelens.analyses.rotary_offsets import RotaryOffsets, rotary_offsets
from ropelens.analyses.trajectory import Trajectory, trajectory
from ropelens.results import result as _result_base

__all__ = [
    "Analysis",
    "AttentionByDistance",
    "AttentionDecomposition",
    "AttentionSinks",
    "BandLocation",
    "BandStatistics",
    "BasePredictions",
    "ExtensionPlanes",
    "ExtensionStudy",
    "FrequencyEntropy",
    "FrequencyUsage",
    "HeadTaxonomy",
    "InterventionEffect",
    "Knockout",
    "LongRopeSearch",
    "MRopeDecomposition",
    "MassiveValues",
    "MeasuredExtrapolation",
    "PESimilarity",
    "PasskeyRetrieval",
    "PositionalSymbolic",
    "RetrievalHeads",
    "RotaryOffsets",
    "Trajectory",
    "attention_by_distance",
    "attention_decomposition",
    "attention_sinks",
    "band_location",
    "band_statistics",
    "base_predictions",
    "extension_planes",
    "extension_study",
    "frequency_entropy",
    "frequency_usage",
    "head_taxonomy",
    "intervention_effect",
    "knockout",
    "learned_pe",
    "load_result",
    "massive_values",
    "measured_extrapolation",
    "mrope_decomposition",
    "passkey_retrieval",
    "pe_similarity",
    "positional_symbolic",
    "register_analysis",
    "result_classes",
    "retrieval_heads",
    "rope_decay_by_distance",
    "rope_decay_constant",
    "rope_gaussian_expectation",
    "rotary_offsets",
    "search_longrope_factors",
    "sinusoidal_pe",
    "trajectory",
]


def result_classes() -> dict[str, type[_result_base.Result]]:
    """Every result class by the kind its files carry (every analysis module is imported above).

    A saved result file names its kind in its ``type`` field; :func:`load_result` reads it back
    through this table. Classes registered by your own analyses appear here once their module is
    imported.

    Returns:
        dict[str, type[Result]]: Kind (the class name) → result class, for every registered result.

    Examples:
        >>> from ropelens.analyses import FrequencyUsage, result_classes
        >>> classes = result_classes()
        >>> classes["FrequencyUsage"] is FrequencyUsage
        True
        >>> "HeadTaxonomy" in classes and "ExtensionStudy" in classes
        True
    """
    return _result_base.registered()


def load_result(path: str | os.PathLike[str]) -> _result_base.Result:
    """Read any result file ropelens writes, whichever analysis wrote it (dispatched on the file's
    ``type``).

    Every analysis module is imported first, so every result class is known: a JSON file that
    ``result.save(path)`` wrote, an attention decomposition's safetensors file, or a report's
    ``report.json`` (read as a :class:`ropelens.results.report_file.ReportSummary`).

    Args:
        path (str | os.PathLike): The file to read.

    Returns:
        The result, of the class that wrote it (e.g. :class:`ropelens.analyses.FrequencyUsage`),
        with its provenance.

    Raises:
        InputError: When the file is neither a ropelens JSON result nor a safetensors file, or
            names a result type that no analysis writes.

    Examples:
        >>> import tempfile
        >>> from ropelens import load_result
        >>> from ropelens.analyses import frequency_usage
        >>> from ropelens.testing import tiny_model
        >>> model = tiny_model("llama")
        >>> tokens = model.to_tokens(["The cat sat on the mat."] * 2)  # 2 windows of 24 tokens
        >>> usage = frequency_usage(model, tokens, progress=False, verify=False)
        >>> path = tempfile.mkdtemp() + "/usage.json"
        >>> usage.save(path)
        >>> again = load_result(path)
        >>> type(again).__name__, again.provenance.model, again.provenance.n_tokens
        ('FrequencyUsage', 'tiny-llama', 48)
    """
    return _result_base.load_result(path)
