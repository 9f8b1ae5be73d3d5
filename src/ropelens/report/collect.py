"""Everything the report shows, measured in one streaming pass over the corpus."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from torch import Tensor

from ropelens.analyses.decompose import BandStatistics, BandStatsReducer
from ropelens.analyses.usage import FrequencyUsage, UsageReducer
from ropelens.bands import Bands
from ropelens.capture import Reducer
from ropelens.distributed import run_windows
from ropelens.provenance import Provenance
from ropelens.rope import RopeSpec

__all__ = ["ReportData", "collect", "evenly_spaced"]


@dataclass
class ReportData:
    """The measured results and how they were measured; sections read this and draw it."""

    model: Any  # the loaded model (sections' measure steps may run it again; renderers never do)
    label: str
    spec: RopeSpec
    layers: tuple[int, ...]
    tokens: Tensor  # the [n_windows, n_ctx] windows analysed
    band_windows: tuple[int, ...]  # indices of the windows band statistics saw
    corpus: dict[str, Any]
    settings: dict[str, Any]
    usage: FrequencyUsage
    band_stats: BandStatistics
    steps: dict[str, float] = field(default_factory=dict)  # seconds per step
    results: dict[str, Any] = field(default_factory=dict)  # measure steps' results, by section key or shared step
    experiments: dict[str, list[dict[str, Any]]] = field(default_factory=dict)  # experiment scripts' results

    @property
    def n_ctx(self) -> int:
        return int(self.tokens.shape[1])

    @property
    def n_windows(self) -> int:
        return int(self.tokens.shape[0])


def evenly_spaced(n: int, k: int) -> list[int]:
    """``k`` indices spread evenly over ``range(n)``, first and last included (all if k ≥ n)."""
    if k >= n:
        return list(range(n))
    if k <= 1:
        return [0]
    return sorted({round(i * (n - 1) / (k - 1)) for i in range(k)})


def collect(
    model,
    tokens: Tensor,
    *,
    label: str,
    spec: RopeSpec,
    layers: Sequence[int],
    bands: Bands,
    band_windows: int | None,
    corpus: dict[str, Any],
    settings: dict[str, Any],
    batch_size: int = 4,
    n_sink: int = 1,
    progress: bool = True,
) -> ReportData:
    """Frequency usage over every window and band statistics over ``band_windows`` evenly spread
    windows (None: all): one bridge pass over the band windows feeds both, and the other windows
    go through the fast q/k path for usage alone (usage sums do not depend on window order)."""
    n = int(tokens.shape[0])
    keep = evenly_spaced(n, n if band_windows is None else max(1, min(band_windows, n)))
    rest = sorted(set(range(n)) - set(keep))
    usage_red = UsageReducer(spec, layers, n_sink=n_sink)
    band_red = BandStatsReducer(spec, layers, bands)
    t0 = time.perf_counter()
    both: list[Reducer] = [usage_red, band_red]
    run = run_windows(model, tokens[keep], both, batch_size=batch_size, layers=layers, spec=spec, progress=progress,
                      desc="ropelens report: usage + band statistics")
    n_tok = run.n_tokens
    if rest:
        n_tok += run_windows(model, tokens[rest], [usage_red], batch_size=batch_size, layers=layers, spec=spec,
                             progress=progress, desc="ropelens report: usage").n_tokens
    seconds = time.perf_counter() - t0
    common = dict(model=label, corpus=corpus.get("name"), corpus_sha256=corpus.get("sha256"),
                  n_ctx=int(tokens.shape[1]), seconds=seconds)
    usage = usage_red.result(Provenance(
        **common, n_tokens=n_tok, n_windows=n,
        config={"n_sink": n_sink, "source": usage_red.source, "layers": list(layers), "batch_size": batch_size}))
    band_stats = band_red.result(Provenance(
        **common, n_tokens=len(keep) * int(tokens.shape[1]), n_windows=len(keep),
        config={"bands": bands.describe(), "layers": list(layers), "jsd": False, "windows": keep, **run.to_config()}))
    return ReportData(model=model, label=label, spec=spec, layers=tuple(layers), tokens=tokens,
                      band_windows=tuple(keep), corpus=corpus, settings=settings, usage=usage,
                      band_stats=band_stats, steps={"stream": seconds})
