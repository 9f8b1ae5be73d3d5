"""What an intervention changes: ``intervention_effect`` and ``ropelens intervention-effect``."""

from __future__ import annotations

import argparse

from ropelens.analyses.intervention_effect import InterventionEffect, intervention_effect
from ropelens.analyses.registry import Analysis, draw
from ropelens.cli.common import (
    AnalysisOptions,
    Command,
    CorpusOptions,
    ModelOptions,
    OutputOptions,
    check_figure_path,
    layer_list,
    load_from_args,
    write_figure_file,
)
from ropelens.cli.variant_syntax import parse_variant, variant_help
from ropelens.errors import InputError
from ropelens.plots.intervention_effect import effect_figure
from ropelens.run.intervene import ablate_planes, apply_rope_variant


def options(p: argparse.ArgumentParser) -> None:
    """``ropelens intervention-effect [MODEL] --variant SPEC | --ablate-planes P,...``."""
    ModelOptions.add_to(p, taken=("variant", "variant_layers"))  # the intervention is compared
    CorpusOptions.add_to(p, tokens=2_048, n_ctx=256)
    what = p.add_argument_group("the intervention (one of)")
    what.add_argument("--variant", default=None, metavar="SPEC", help=variant_help())
    what.add_argument(
        "--ablate-planes",
        type=layer_list,
        default=None,
        metavar="P,P,...",
        help="zero these planes of the rotated q and k (0 is the highest frequency)",
    )
    what.add_argument(
        "--heads",
        type=layer_list,
        default=None,
        metavar="H,H,...",
        help="with --ablate-planes: the query heads to ablate (default: all)",
    )
    AnalysisOptions.add_to(p)  # --layers: the layers measured and intervened on
    p.add_argument(
        "--figure",
        default=None,
        metavar="FILE",
        help="also write the figure: FILE.html a self-contained page; FILE.png, .pdf or .svg a "
        "static image",
    )
    OutputOptions.add_to(p, save="InterventionEffect JSON")


def _intervention(args: argparse.Namespace):
    if (args.variant is None) == (args.ablate_planes is None):
        raise InputError(
            "name one intervention: --variant SPEC (e.g. prope:0.75) or --ablate-planes P,P"
        )
    if args.heads is not None and args.ablate_planes is None:
        raise InputError("--heads needs --ablate-planes: it names the heads whose planes to zero")
    if args.variant is not None:
        variant = parse_variant(args.variant)
        if args.layers is None:
            return variant
        return lambda m: apply_rope_variant(m, variant, layers=args.layers)
    return lambda m: ablate_planes(m, args.ablate_planes, layers=args.layers, heads=args.heads)


def run(args: argparse.Namespace) -> int:
    """Frequency usage, band logit shares and head kinds with and without an intervention

    Run frequency usage, band statistics and the head taxonomy on the same windows, once on the
    model as it is and once under a RoPE variant (--variant) or with planes zeroed
    (--ablate-planes); print what changed, layer by layer and band by band.
    """
    intervention = _intervention(args)
    analysis = AnalysisOptions.from_args(args)  # a bad --bands fails here
    output = OutputOptions.from_args(args)
    output.check()
    figure_path = check_figure_path(args.figure, save=output.save) if args.figure else None
    corpus = CorpusOptions.from_args(args)
    effect = intervention_effect(
        load_from_args(args),
        intervention,
        corpus.corpus,
        n_ctx=corpus.n_ctx,
        max_tokens=corpus.tokens,
        layers=analysis.layers,
        bands=analysis.parsed_bands(),
        verify=not analysis.no_verify,
        progress=output.progress,
        text_column=corpus.text_column,
    )
    if figure_path is not None:
        write_figure_file(effect.figure(), figure_path)
    return output.save_and_show(
        effect, effect.to_frame(), "bands", head={"interventions": effect.interventions}
    )


ANALYSIS = Analysis(
    "intervention-effect",
    intervention_effect,
    InterventionEffect,
    draw(InterventionEffect, figure=effect_figure),
    Command("intervention-effect", run, options),
    summary="What a RoPE variant or a plane ablation changes: band energy, band logit shares and "
    "head kinds, with and without it, in one figure.",
)
