"""Rotary offsets: partial-cycle planes and the q–k angle per plane (``rotary_offsets``, ``ropelens
rotary-offsets``)."""

from __future__ import annotations

import argparse

from ropelens.analyses.registry import Analysis, draw
from ropelens.analyses.rotary_offsets import RotaryOffsets, rotary_offsets
from ropelens.cli.common import (
    Command,
    CorpusCommand,
    load_from_args,
)
from ropelens.plots.rotary_offsets import offsets_figure, offsets_heatmap


def options(p: argparse.ArgumentParser) -> None:
    """``ropelens rotary-offsets [MODEL]``: partial-cycle planes and the q-k angle per plane."""
    CorpusCommand.add_to(p, tokens=4_096, n_ctx=512, save="RotaryOffsets JSON", bands=False)


def run(args: argparse.Namespace) -> int:
    """Partial-cycle planes, rotary outliers and the q-k angle per plane at the attended key

    Flags the planes that never complete a turn within the trained context (Jonasson 2025), and
    measures per plane the q/k outlier ratio and the circular mean angle between q and k at the key
    each query attends to (sink and content keys apart).
    """
    run = CorpusCommand.from_args(args)
    corpus, kw = run.prepare(rotary_offsets)
    r = rotary_offsets(load_from_args(args), corpus, **kw)
    used = run.measured(r)
    run.output.save_result(r)
    summary = (
        r.summary().rename_axis("cycle").reset_index()
    )  # partial-cycle planes against the others
    if run.output.json:
        return run.output.emit({**used, "summary": summary.to_dict("records")})
    print(summary.to_string(index=False, float_format="%.3f"))
    return 0


ANALYSIS = Analysis(
    "rotary-offsets",
    rotary_offsets,
    RotaryOffsets,
    draw(RotaryOffsets, figure=offsets_figure, heatmap=offsets_heatmap),
    Command("rotary-offsets", run, options, distributed=True),
    summary="Planes that never complete a turn in the trained context, and the q–k angle per "
    "plane at the attended key.",
)
