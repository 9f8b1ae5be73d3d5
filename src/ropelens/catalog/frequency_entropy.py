"""Frequency entropy of queries and keys over positions: ``frequency_entropy`` and ``ropelens
frequency-entropy``."""

from __future__ import annotations

import argparse

from ropelens.analyses.frequency_entropy import FrequencyEntropy, frequency_entropy
from ropelens.analyses.registry import Analysis, draw
from ropelens.cli.common import (
    Command,
    CorpusCommand,
    load_from_args,
)
from ropelens.plots.frequency_entropy import entropy_figure


def options(p: argparse.ArgumentParser) -> None:
    """``ropelens frequency-entropy [MODEL]``: spectral entropy of each plane's query norm along the
    sequence."""
    CorpusCommand.add_to(p, tokens=8192, n_ctx=256, save="FrequencyEntropy JSON", bands=False)
    p.add_argument(
        "--skip",
        type=int,
        default=1,
        metavar="N",
        help="leading positions of each window left out (the attention sink; default: 1)",
    )
    p.add_argument(
        "--seed", type=int, default=0, help="seed of the shuffled-order control (default: 0)"
    )


def run(args: argparse.Namespace) -> int:
    """Spectral entropy of each plane's query norm along the sequence, NoPE layers included

    Per layer, head and plane: the normalised Shannon entropy of the power spectrum of the plane's
    query norm over positions (1 = flat), against the same values in a shuffled order; printed per
    layer, heads and planes averaged.
    """
    run = CorpusCommand.from_args(args)
    corpus, kw = run.prepare(frequency_entropy)
    r = frequency_entropy(load_from_args(args), corpus, **kw, skip=args.skip, seed=args.seed)
    used = run.measured(r)
    run.output.save_result(r)
    h, s = r.entropy().nanmean((1, 2)), r.entropy(shuffled=True).nanmean((1, 2))
    rows = [
        {
            "layer": L,
            "kind": r.kind(L),
            "entropy": float(h[i]),
            "shuffled": float(s[i]),
            "gap": float(s[i] - h[i]),
        }
        for i, L in enumerate(r.layers)
    ]
    found = r.findings()
    if run.output.json:
        return run.output.emit(
            {
                "model": r.provenance.model,
                **used,
                "n_pos": r.n_pos,
                "layers": rows,
                "by_kind": r.by_kind(),
                "findings": [f.to_dict() for f in found],
            }
        )
    prov = r.provenance
    print(
        f"{prov.model}: {prov.n_tokens:,} tokens of {prov.corpus} in {prov.n_windows} windows of "
        f"{prov.n_ctx}; normalised spectral entropy of each plane's query norm, heads and planes "
        "averaged"
    )
    print("layer  kind   entropy  shuffled     gap")
    for row in rows:
        print(
            f"{row['layer']:5d}  {row['kind']:<5} {row['entropy']:8.4f}  {row['shuffled']:8.4f}  "
            f"{row['gap']:+7.4f}"
        )
    for f in found:
        print(f.text)
    return 0


ANALYSIS = Analysis(
    "frequency-entropy",
    frequency_entropy,
    FrequencyEntropy,
    draw(FrequencyEntropy, figure=entropy_figure),
    Command("frequency-entropy", run, options, distributed=True),
    summary="Spectral entropy of each plane's query and key signal over positions.",
)
