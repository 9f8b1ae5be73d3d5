"""Everything the report shows, measured in one streaming pass over the corpus."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from torch import Tensor

from ropelens.analyses.band_statistics import BandStatistics, BandStatsReducer
from ropelens.analyses.frequency_usage import FrequencyUsage, UsageReducer
from ropelens.run.measure import RunOptions, Windows, measure
from ropelens.spec.bands import Bands
from ropelens.spec.rope import RopeSpec

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
    results: dict[str, Any] = field(
        default_factory=dict
    )  # measure steps' results, by section key or shared step
    experiments: dict[str, list[dict[str, Any]]] = field(
        default_factory=dict
    )  # experiment scripts' results

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
    win = Windows(tokens, corpus.get("name"), corpus.get("sha256"))
    usage_red = UsageReducer(spec, layers, n_sink=n_sink)
    band_red = BandStatsReducer(spec, layers, bands)
    run = RunOptions(layers=layers, batch_size=batch_size, progress=progress)
    passes = dict(spec=spec, label=label)
    both = measure(
        model,
        None,
        lambda *_: [usage_red, band_red],
        run,
        windows=win.subset(keep),
        analysis="report",
        config={"bands": bands.describe(), "jsd": False, "windows": keep},
        desc="ropelens report: usage + band statistics",
        **passes,
    )
    usage_prov = both.provenance
    if rest:
        alone = measure(
            model,
            None,
            lambda *_: usage_red,
            run,
            windows=win.subset(rest),
            analysis="report: usage",
            desc="ropelens report: usage",
            **passes,
        )
        usage_prov = usage_prov.merged(alone.provenance)
    usage = usage_red.result(
        replace(
            usage_prov,
            config={
                "n_sink": n_sink,
                "source": usage_red.source,
                "layers": list(layers),
                "batch_size": batch_size,
            },
        )
    )
    band_stats = band_red.result(replace(both.provenance, seconds=usage_prov.seconds))
    seconds = usage_prov.seconds
    return ReportData(
        model=model,
        label=label,
        spec=spec,
        layers=tuple(layers),
        tokens=tokens,
        band_windows=tuple(keep),
        corpus=corpus,
        settings=settings,
        usage=usage,
        band_stats=band_stats,
        steps={"stream": seconds},
    )
