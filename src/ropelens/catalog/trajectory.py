"""When each structure appears over training: ``trajectory`` and ``ropelens trajectory``."""

from __future__ import annotations

import argparse

from ropelens.analyses.registry import Analysis, draw
from ropelens.analyses.trajectory import ANALYSES, Trajectory, trajectory
from ropelens.cli.common import (
    Command,
    CorpusOptions,
    OutputOptions,
    positive_int,
    window_length,
)
from ropelens.plots.trajectory import trajectory_figure
from ropelens.report.trajectory import write_trajectory
from ropelens.validate import check_output_path


def options(p: argparse.ArgumentParser) -> None:
    """``ropelens trajectory CKPT... [--revisions R...]``: structures over training checkpoints, and
    their page."""
    p.add_argument(
        "checkpoints",
        nargs="+",
        metavar="CKPT",
        help="checkpoint directories (step-N/, as ropelens.training.train saves them), or one "
        "hub id with --revisions",
    )
    g = p.add_argument_group("trajectory")
    g.add_argument(
        "--revisions",
        nargs="+",
        default=None,
        metavar="REV",
        help="hub revisions of the one hub id given (e.g. Pythia's step1000 step8000; needs the "
        "network)",
    )
    g.add_argument(
        "--steps",
        nargs="+",
        type=int,
        default=None,
        metavar="N",
        help="the training step of each checkpoint (default: read from step-N in the names)",
    )
    g.add_argument(
        "--analyses",
        nargs="+",
        default=list(ANALYSES),
        choices=ANALYSES,
        metavar="NAME",
        help=f"of {', '.join(ANALYSES)} (default: all)",
    )
    g.add_argument(
        "--tokens",
        type=positive_int,
        default=2048,
        metavar="N",
        help="tokens per analysis and checkpoint (default: 2048)",
    )
    g.add_argument(
        "--ctx",
        type=window_length,
        default=None,
        metavar="N",
        help="tokens per window (default: a ropelens checkpoint's training length, else 256)",
    )
    g.add_argument(
        "--corpus",
        default=None,
        metavar="PATH|english|python",
        help="text to measure on: a built-in corpus, a .txt/.md, .jsonl, .csv or .parquet file, a "
        "folder or glob of them, or a datasets save_to_disk folder (default: the corpus a "
        "ropelens checkpoint was trained on, else english)",
    )
    CorpusOptions.add_text_column(g)
    g.add_argument(
        "--device",
        default=None,
        metavar="DEV",
        help="cpu, cuda, cuda:N or mps (default: cuda if present)",
    )
    g.add_argument(
        "--seed",
        type=int,
        default=0,
        metavar="N",
        help="seed of the heads analysis's random tokens",
    )
    g.add_argument(
        "--out",
        default="ropelens-trajectory",
        metavar="DIR",
        help="where trajectory.json, trajectory.csv and trajectory.html go (default: "
        "ropelens-trajectory)",
    )
    OutputOptions.add_to(p)


def run(args: argparse.Namespace) -> int:
    """Structures over training: when the high-norm band, attention sinks, massive values and
    positional heads appear

    Load each checkpoint (a directory, or the hub id at each of --revisions), measure the chosen
    analyses on --tokens tokens, and keep per checkpoint the band's position and prominence, the
    share of sink heads, the number of massive query dimensions and of positional heads. Prints when
    each structure appears (the first checkpoint from which its metric stays at or above its
    threshold) and writes trajectory.json, trajectory.csv and trajectory.html into --out.
    """
    check_output_path(args.out, "--out", directory=True)
    output = OutputOptions.from_args(args)
    traj = trajectory(
        args.checkpoints,
        revisions=args.revisions,
        steps=args.steps,
        analyses=args.analyses,
        corpus=args.corpus,
        text_column=args.text_column,
        n_tokens=args.tokens,
        n_ctx=args.ctx,
        device=args.device,
        seed=args.seed,
        progress=output.progress,
    )
    page = write_trajectory(traj, args.out)
    em = traj.emergence()
    if output.json:
        return output.emit(
            {
                "page": str(page),
                "emergence": em.astype(object).where(em.notna(), None).to_dict("records"),
                "findings": [f.to_dict() for f in traj.findings()],
            }
        )
    print(em.to_string(index=False, float_format=lambda x: f"{x:.4g}"))
    for f in traj.findings():
        print(f"- {f.text}")
    print(f"wrote {page} (and trajectory.json, trajectory.csv beside it)")
    return 0


ANALYSIS = Analysis(
    "trajectory",
    trajectory,
    Trajectory,
    draw(Trajectory, figure=trajectory_figure),
    Command("trajectory", run, options),
    summary="The high-norm band, sinks, massive dimensions and positional heads across training "
    "checkpoints.",
)
