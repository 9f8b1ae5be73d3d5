"""Griffe extension for the API reference: a corpus analysis documents the signature it runs with.

``@corpus_analysis`` (ropelens.run.measure) gives an analysis the shared run options (``n_ctx``,
``max_tokens``, ``layers``, ...) in place of its ``run: RunOptions`` parameter and sets the
function's ``__signature__``; a static reader sees only the source's parameters. For each function
decorated with it, this extension takes the parameters from the imported function's signature, so
the reference shows, and checks the docstring against, what a caller passes.
"""

from __future__ import annotations

import importlib
import inspect
from typing import Any

import griffe

DECORATOR = "corpus_analysis"
_KINDS = {
    inspect.Parameter.POSITIONAL_ONLY: griffe.ParameterKind.positional_only,
    inspect.Parameter.POSITIONAL_OR_KEYWORD: griffe.ParameterKind.positional_or_keyword,
    inspect.Parameter.VAR_POSITIONAL: griffe.ParameterKind.var_positional,
    inspect.Parameter.KEYWORD_ONLY: griffe.ParameterKind.keyword_only,
    inspect.Parameter.VAR_KEYWORD: griffe.ParameterKind.var_keyword,
}


def _annotation(value: Any) -> str | None:
    if value is inspect.Parameter.empty:
        return None
    if isinstance(value, str):
        return value
    return inspect.formatannotation(value)


class CorpusAnalysisSignature(griffe.Extension):
    """Replace a corpus analysis's parameters by those of its runtime signature."""

    def on_function_instance(self, *, func: griffe.Function, **kwargs: Any) -> None:
        if not any(str(d.value).split("(")[0].endswith(DECORATOR) for d in func.decorators):
            return
        module = importlib.import_module(func.module.path)
        runtime = getattr(module, func.name, None)
        if runtime is None:
            return
        params = [
            griffe.Parameter(
                p.name,
                annotation=_annotation(p.annotation),
                kind=_KINDS[p.kind],
                default=None if p.default is inspect.Parameter.empty else repr(p.default),
            )
            for p in inspect.signature(runtime).parameters.values()
        ]
        func.parameters = griffe.Parameters(*params)
