"""ropelens: which RoPE frequencies a model uses, and for what.

This namespace is the core a notebook starts from: loading a model, reading its rotation, bands,
results and errors. Every analysis (its function and its result class) is in
:mod:`ropelens.analyses`::

    import ropelens
    from ropelens.analyses import frequency_usage

    model = ropelens.load_model()  # the embedded default model
    spec = ropelens.rope_spec(model)  # what each layer rotates, read from the model and verified
    usage = frequency_usage(model, "english")

The package is built in layers, each importing only from those below it: ``spec`` (RoPE math,
reading a model, bands, variants), ``results``, ``backends``, ``loading``, ``run`` (data, capture,
measurement, interventions), ``analyses``, ``plots``, ``report``, ``testing``, ``training``, ``cli``
and ``catalog``, which declares every analysis once (function, result, figures, command, report
section) and registers it. This root sits above them all: besides its names, it hands the layers
below the import of the catalog, run the first time a figure or the analysis registry is asked for.
"""

from ropelens import analyses
from ropelens.analyses import load_result
from ropelens.errors import InputError, NotRotaryError, UnsupportedModelError
from ropelens.loading.models import DEFAULT_MODEL, EMBEDDED_MODELS, cache_dir, load_model
from ropelens.results.figures import register_loader
from ropelens.results.provenance import ROPELENS_VERSION, Provenance
from ropelens.run.capture import capture_qk
from ropelens.run.intervene import ablate_planes, apply_rope_variant, with_rope_variant
from ropelens.spec.bands import Bands
from ropelens.spec.reading import rope_spec
from ropelens.spec.rope import LayerRope, RopeSpec

__version__ = ROPELENS_VERSION


def _load_catalog() -> None:
    # the catalog sits above every layer that asks for figures or analyses, so none of them may
    # import it; the root, above it, hands them this import to run when first asked (importing it
    # registers every analysis and loads plotly, which ``import ropelens`` should not)
    import ropelens.catalog  # noqa: F401


register_loader(_load_catalog)

__all__ = [
    "DEFAULT_MODEL",
    "EMBEDDED_MODELS",
    "Bands",
    "InputError",
    "LayerRope",
    "NotRotaryError",
    "Provenance",
    "RopeSpec",
    "UnsupportedModelError",
    "__version__",
    "ablate_planes",
    "analyses",
    "apply_rope_variant",
    "cache_dir",
    "capture_qk",
    "load_model",
    "load_result",
    "rope_spec",
    "with_rope_variant",
]
