"""ropelens: which RoPE frequencies a model uses, and for what."""

# every result module, so that ropelens.result.load_result knows every kind
from ropelens import data, distributed, train, variants
from ropelens.analyses import context, extrapolation, heads, massive, offsets, passkey
from ropelens.analyses.band_stats import BandStatistics, band_statistics
from ropelens.analyses.decay import (
    rope_decay_by_distance,
    rope_decay_constant,
    rope_gaussian_expectation,
)
from ropelens.analyses.decompose import AttentionDecomposition, decompose_attention
from ropelens.analyses.distance import AttentionByDistance, attention_by_distance
from ropelens.analyses.extension import ExtensionStudy, extension_study
from ropelens.analyses.knockout import Knockout, knockout
from ropelens.analyses.mrope import MRopeDecomposition, mrope_decompose
from ropelens.analyses.pe_geometry import learned_pe, pe_similarity, sinusoidal_pe
from ropelens.analyses.possym import PositionalSymbolic, positional_symbolic
from ropelens.analyses.retrieval import RetrievalHeads, retrieval_heads
from ropelens.analyses.sinks import AttentionSinks, attention_sinks
from ropelens.analyses.usage import FrequencyUsage, frequency_usage
from ropelens.bands import Bands
from ropelens.capture import capture_qk
from ropelens.curves import describe_curve
from ropelens.errors import InputError, NotRotaryError, UnsupportedModelError
from ropelens.intervene import ablate_planes, apply_rope_variant, with_rope_variant
from ropelens.models import DEFAULT_MODEL, EMBEDDED_MODELS, cache_dir, load_model
from ropelens.provenance import Provenance
from ropelens.reading import rope_spec
from ropelens.rope import LayerRope, RopeSpec

__version__ = "0.1.0"

__all__ = [
    "DEFAULT_MODEL",
    "EMBEDDED_MODELS",
    "AttentionByDistance",
    "AttentionDecomposition",
    "AttentionSinks",
    "BandStatistics",
    "Bands",
    "ExtensionStudy",
    "FrequencyUsage",
    "LayerRope",
    "MRopeDecomposition",
    "PositionalSymbolic",
    "RetrievalHeads",
    "InputError",
    "Knockout",
    "NotRotaryError",
    "UnsupportedModelError",
    "Provenance",
    "RopeSpec",
    "ablate_planes",
    "attention_by_distance",
    "attention_sinks",
    "apply_rope_variant",
    "band_statistics",
    "cache_dir",
    "capture_qk",
    "context",
    "data",
    "decompose_attention",
    "describe_curve",
    "distributed",
    "extension_study",
    "extrapolation",
    "frequency_usage",
    "knockout",
    "heads",
    "learned_pe",
    "load_model",
    "massive",
    "mrope_decompose",
    "offsets",
    "passkey",
    "pe_similarity",
    "positional_symbolic",
    "retrieval_heads",
    "rope_decay_by_distance",
    "rope_decay_constant",
    "rope_gaussian_expectation",
    "rope_spec",
    "sinusoidal_pe",
    "train",
    "variants",
    "with_rope_variant",
]
