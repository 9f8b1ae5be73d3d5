"""Where the high-norm frequency band sits, and NoPE below it: ``band_location`` and ``ropelens
band-location``."""

from __future__ import annotations

import argparse

from ropelens.analyses.band_location import BandLocation, band_location
from ropelens.analyses.registry import Analysis, draw
from ropelens.cli.common import (
    Command,
    CorpusCommand,
    load_from_args,
    positive_int,
)
from ropelens.plots.band_location import band_location_figure
from ropelens.results.codec import fields_to_dict


def options(p: argparse.ArgumentParser) -> None:
    """``ropelens band-location [MODEL]``: where the high-norm frequency band sits, and NoPE below
    it."""
    CorpusCommand.add_to(p, tokens=4096, n_ctx=256, save="BandLocation JSON", bands=False)
    p.add_argument(
        "--which",
        choices=("q", "k"),
        default="q",
        help="locate the band in queries or keys (default: q)",
    )
    p.add_argument(
        "--no-intervene",
        action="store_true",
        help="only locate the band (skip the loss of unrotating the planes below it)",
    )
    p.add_argument(
        "--eval-windows",
        type=positive_int,
        default=8,
        metavar="N",
        help="windows the intervention's loss is measured on (default: 8)",
    )
    p.add_argument(
        "--seed", type=int, default=0, help="seed of the random control planes (default: 0)"
    )


def run(args: argparse.Namespace) -> int:
    """Locate the high-norm frequency band per layer (Oka et al.) and make the planes below it NoPE

    From the per-plane mean norms over a corpus: each layer's band (the contiguous planes around the
    peak at or above half-way from the median to the peak), its wavelengths against the training
    length and the critical plane; then the loss with the planes below the band unrotated, against
    as many random planes.
    """
    run = CorpusCommand.from_args(args)
    corpus, kw = run.prepare(band_location)
    r = band_location(
        load_from_args(args),
        corpus,
        **kw,
        which=args.which,
        intervene=not args.no_intervene,
        eval_windows=args.eval_windows,
        seed=args.seed,
    )
    used = run.measured(r)
    run.output.save_result(r)
    df = r.to_frame()
    layers = df[df["head"] == -1].drop(columns="head")
    found = r.findings()
    if run.output.json:
        return run.output.emit(
            {
                "model": r.provenance.model,
                **used,
                "train_ctx": r.spec.n_ctx,
                "which": r.which,
                "layers": layers.to_dict("records"),
                "findings": [f.to_dict() for f in found],
                "intervention": None if r.intervention is None else fields_to_dict(r.intervention),
            }
        )
    prov = r.provenance
    print(
        f"{prov.model}: {prov.n_tokens:,} tokens of {prov.corpus} in {prov.n_windows} windows of "
        f"{prov.n_ctx}; band of the {'queries' if r.which == 'q' else 'keys'}, heads averaged, "
        "sink excluded"
    )
    cols = [
        "layer",
        "peak",
        "lo",
        "hi",
        "prominence",
        "peak_wavelength",
        "critical_plane",
        "n_below",
    ]
    print(layers[cols].to_string(index=False, float_format="%.2f"))
    for f in found:
        print(f.text)
    return 0


ANALYSIS = Analysis(
    "band-location",
    band_location,
    BandLocation,
    draw(BandLocation, figure=band_location_figure),
    Command("band-location", run, options),
    summary="Each layer's high-norm frequency band, and the loss with the planes below it "
    "unrotated.",
)
