"""ropelens: which RoPE frequencies a model uses, and for what.

The package is built in layers, each importing only from those below it: ``spec`` (RoPE math, reading a model,
bands, variants), ``results`` (the result base class, files, provenance, findings), ``backends`` (how a model
runs), ``loading``, ``run`` (data, capture, measurement, losses, interventions), ``analyses``, ``plots``,
``report``, ``testing``, ``training``, ``cli``, and ``catalog``, which declares every analysis once (its function,
result, figures, command and report section) and registers it. This namespace is the curated API; modules that moved keep their old names
for one release (importing one warns and gives the module at its new place).
"""

import functools
import importlib
import importlib.abc
import importlib.machinery
import sys
import types
import warnings

from ropelens import catalog, plots
from ropelens.analyses import context, extrapolation, heads, load_result, massive, offsets, passkey
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
from ropelens.analyses.positional_symbolic import PositionalSymbolic, positional_symbolic
from ropelens.analyses.registry import Analysis, register_analysis
from ropelens.analyses.retrieval import RetrievalHeads, retrieval_heads
from ropelens.analyses.sinks import AttentionSinks, attention_sinks
from ropelens.analyses.trajectory import Trajectory, trajectory
from ropelens.analyses.usage import FrequencyUsage, frequency_usage
from ropelens.errors import InputError, NotRotaryError, UnsupportedModelError
from ropelens.loading.models import DEFAULT_MODEL, EMBEDDED_MODELS, cache_dir, load_model
from ropelens.report import extension as _extension_page
from ropelens.results import curves as _curves
from ropelens.results.curves import describe_curve
from ropelens.results.provenance import Provenance
from ropelens.run import data, distributed
from ropelens.run.capture import capture_qk
from ropelens.run.intervene import ablate_planes, apply_rope_variant, with_rope_variant
from ropelens.spec import variants
from ropelens.spec.bands import Bands
from ropelens.spec.reading import rope_spec
from ropelens.spec.rope import LayerRope, RopeSpec
from ropelens.training import train

# old module name -> where it lives now (kept for one release)
MOVED = {
    "serialize": "results.serialize", "provenance": "results.provenance", "findings": "results.findings",
    "display": "results.display", "result": "results.result", "curves": "results.curves",
    "rope": "spec.rope", "layer_fields": "spec.attention_fields", "bands": "spec.bands", "variants": "spec.variants",
    "taps": "spec.forward_taps", "observed": "spec.observed", "plan": "spec.plan", "reading": "spec.reading",
    "acts": "backends.acts", "losses": "backends.losses",
    "models": "loading.models", "hf_dir": "loading.hf_dir", "mrope": "loading.vision_language",
    "data": "run.data", "capture": "run.capture", "measure": "run.measure", "distributed": "run.distributed",
    "evaluate": "run.evaluate", "verify": "run.verify", "intervene": "run.intervene",
    "train": "training.train", "pe_train": "training.pe_train",
    "plain": "backends.hf", "sdpa": "backends.sdpa", "engine": "backends.engine", "fastpath": "backends.sdpa_capture",
    "hooks": "backends.bridge_hooks", "backends.fastpath": "backends.sdpa_capture",
    "analyses.possym": "analyses.positional_symbolic", "analyses.bandloc": "analyses.band_location",
    "report.findings": "results.findings", "analyses.extension_findings": "analyses.extension",
}
# old command and section modules, split into one ropelens.catalog module per analysis (kept for one release): a
# name is looked up in the new modules; a command's add_NAME/run_NAME and a section's measure_NAME/render_NAME are
# the options/run/measure/render of the catalog module NAME maps to
SPLIT = {
    "cli.inspect": {"inspect": "spec"},
    "cli.analysis": {"usage": "usage", "decompose_stats": "band_statistics", "decompose": "decompose", "heads": "heads",
                     "bands": "band_location", "entropy": "entropy"},
    "cli.attention": {"sinks": "sinks", "distance": "distance", "massive": "massive", "offsets": "offsets",
                      "possym": "positional_symbolic", "retrieval": "retrieval"},
    "cli.variants": {"variants": "variant_frequencies", "truncate": "truncate", "context": "context",
                     "passkey": "passkey", "predict_base": "extrapolation"},
    "cli.extend": {"extend": "extension"}, "cli.geometry": {"pe_geometry": "pe_geometry"},
    "cli.knockout": {"knockout": "knockout"}, "cli.trajectory": {"trajectory": "trajectory"},
    "cli.report": {"report": "report", "compare": "compare"},
    "report.measured": {"spec": "spec", "usage": "usage", "bands": "band_statistics"},
    "report.rerun": {"heads": "heads", "sinks": "sinks", "distance": "distance", "massive": "massive"},
    "report.variants": {"prope": "truncate", "context": "context"},
    "report.theory": {"geometry": "pe_geometry"},
}
_SHARED = ("cli.variant_syntax", "cli.common", "report.steps", "plots.style")  # helpers that moved there


def _split_module(old: str) -> types.ModuleType:
    """A stand-in for the split module ``old``: each name it held, found where it lives now."""
    module = types.ModuleType(f"ropelens.{old}")
    places = {**{f"catalog.{m}": None for m in SPLIT[old].values()}, **dict.fromkeys(_SHARED)}

    def __getattr__(name: str):  # noqa: N807 - the module's attribute hook
        for place in places:
            new = importlib.import_module(f"ropelens.{place}")
            if not name.startswith("__") and hasattr(new, name):
                return getattr(new, name)
        verb, _, what = name.partition("_")
        if verb in ("add", "run", "measure", "render") and what in SPLIT[old]:
            new = importlib.import_module(f"ropelens.catalog.{SPLIT[old][what]}")
            return new.ANALYSIS.command.add_to if verb == "add" else getattr(new, verb)
        raise AttributeError(f"module ropelens.{old} has no attribute {name!r}")

    module.__getattr__ = __getattr__  # type: ignore[method-assign]
    return module


class _MovedModules(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Imports a moved module under its old name: a deprecation warning, and the module at its new place."""

    def find_spec(self, fullname, path=None, target=None):  # noqa: ANN001, ARG002
        old = fullname.removeprefix("ropelens.")
        if fullname.startswith("ropelens.") and (old in MOVED or old in SPLIT):
            return importlib.machinery.ModuleSpec(fullname, self)
        return None

    def create_module(self, spec):  # noqa: ANN001
        old = spec.name.removeprefix("ropelens.")
        if old in SPLIT:
            places = ", ".join(f"ropelens.catalog.{m}" for m in dict.fromkeys(SPLIT[old].values()))
            warnings.warn(f"{spec.name} was split into one module per analysis ({places}); import from there (the "
                          "old name goes in the next release)", DeprecationWarning, stacklevel=2)
            return _split_module(old)
        new = "ropelens." + MOVED[old]
        warnings.warn(f"{spec.name} moved to {new}; import it from there (the old name goes in the next release)",
                      DeprecationWarning, stacklevel=2)
        return importlib.import_module(new)

    def exec_module(self, module):  # noqa: ANN001, ARG002
        return None


if not any(isinstance(f, _MovedModules) for f in sys.meta_path):
    sys.meta_path.insert(0, _MovedModules())


def _moved(fn, old: str, new: str):
    """``fn`` at its old place ``old``, for one release: a call warns that it moved to ``new``, then runs it."""

    @functools.wraps(fn)
    def moved(*args, **kwargs):
        warnings.warn(f"{old} moved to {new}; use it from there (the old name goes in the next release)",
                      DeprecationWarning, stacklevel=2)
        return fn(*args, **kwargs)

    return moved


# functions that moved up the layers (figures to plots, pages to report), kept at their old places for one release;
# set here, at the top, so that no module imports from a layer above its own
context.compare_figure = _moved(plots.context.compare_figure, "ropelens.analyses.context.compare_figure",
                                "ropelens.plots.context.compare_figure")
_curves.overlay = _moved(plots.curves.overlay, "ropelens.results.curves.overlay", "ropelens.plots.curves.overlay")
ExtensionStudy.write = _moved(_extension_page.write_study, "ExtensionStudy.write(out)",
                              "ropelens.report.extension.write_study(study, out)")

__version__ = "0.1.0"

__all__ = [
    "load_result",
    "Analysis",
    "catalog",
    "register_analysis",
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
    "Trajectory",
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
    "plots",
    "pe_similarity",
    "positional_symbolic",
    "retrieval_heads",
    "rope_decay_by_distance",
    "rope_decay_constant",
    "rope_gaussian_expectation",
    "rope_spec",
    "sinusoidal_pe",
    "train",
    "trajectory",
    "variants",
    "with_rope_variant",
]
