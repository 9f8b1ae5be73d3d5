"""Cost of frequency usage and full band statistics relative to HF's own sdpa forward.

Runs them side by side on the same windows of the embedded English corpus, interleaved, and prints
the median time of each and its ratio to HF's sdpa forward over the same tokens (the decoder only,
no unembedding): ``sdpa`` is that baseline, ``forward`` the bridge's forward, ``usage`` frequency
usage on the fast q/k path, ``frequency_usage_bridge`` the same through the bridge. With ``--rss``
it instead measures the peak RSS each column adds over the loaded model, each in a fresh process.

    python benchmarks/core_bench.py [--model smollm2-135m] [--windows 16] [--n-ctx 512] \
        [--repeats 3]
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import time

import torch

import ropelens
from ropelens.analyses.band_statistics import BandStatsReducer
from ropelens.analyses.frequency_usage import UsageReducer
from ropelens.backends.sdpa_capture import hf_view, sdpa_attention
from ropelens.run import data
from ropelens.run.capture import batches, stream
from ropelens.spec.bands import Bands

args_tile: int | None = None
WHAT = (
    "sdpa",
    "forward",
    "frequency_usage",
    "frequency_usage_bridge",
    "band_statistics",
    "band_statistics+top1",
)


def run(model, spec, toks, what: str, batch_size: int) -> float:
    layers = spec.rotary_layers
    t0 = time.perf_counter()
    if what == "sdpa":
        view = hf_view(model)
        with torch.no_grad(), sdpa_attention(view):
            for b in batches(toks, batch_size):
                view.base_model(input_ids=b, use_cache=False)
    elif what == "forward":
        with torch.no_grad():
            for b in batches(toks, batch_size):
                model(b, return_type=None)
    else:
        reducers = [UsageReducer(spec, layers)]
        if what.startswith("band_statistics"):
            agreement = what == "band_statistics+top1"
            reducers.append(
                BandStatsReducer(
                    spec, layers, Bands.quantiles(4), agreement=agreement, tile=args_tile
                )
            )
        stream(
            model,
            batches(toks, batch_size),
            reducers,
            spec=spec,
            progress=False,
            fast=what != "frequency_usage_bridge",
        )
    return time.perf_counter() - t0


def timing(args) -> None:
    model = ropelens.load_model(args.model)
    spec = ropelens.rope_spec(model)
    toks = data.windows(data.english(), model.tokenizer, args.n_ctx, n_windows=args.windows)
    run(model, spec, toks[: args.batch_size], "band_statistics", args.batch_size)  # warm-up
    times: dict[str, list[float]] = {k: [] for k in args.what}
    for _ in range(args.repeats):
        for what in times:
            times[what].append(run(model, spec, toks, what, args.batch_size))
    med = {k: statistics.median(v) for k, v in times.items()}
    print(
        f"{args.model}: {toks.shape[0]} windows x {toks.shape[1]} tokens, batch {args.batch_size}, "
        f"{torch.get_num_threads()} threads, {args.repeats} interleaved repeats"
    )
    for k, v in times.items():
        # each repeat's own ratio to the sdpa run beside it: slow drifts of a shared machine cancel
        paired = statistics.median(x / y for x, y in zip(v, times["sdpa"], strict=True))
        print(
            f"  {k:<16} median {med[k]:7.2f} s  ratio to sdpa {med[k] / med['sdpa']:.3f}x  "
            f"median per-repeat ratio {paired:.3f}x   runs {[round(x, 2) for x in v]}"
        )


def rss_child(args) -> None:
    model = ropelens.load_model(args.model)
    spec = ropelens.rope_spec(model)
    toks = data.windows(data.english(), model.tokenizer, args.n_ctx, n_windows=args.windows)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    run(model, spec, toks, args.what[-1], args.batch_size)
    after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    print(
        json.dumps(
            {"what": args.what[-1], "rss_before_mb": before / 1024, "peak_rss_mb": after / 1024}
        )
    )


def rss(args) -> None:
    """Peak RSS each column adds over the loaded model, each in a fresh process."""
    added = {}
    for what in args.what:
        cmd = [
            sys.executable,
            __file__,
            "--rss-child",
            "--model",
            args.model,
            "--n-ctx",
            str(args.n_ctx),
            "--windows",
            str(args.windows),
            "--batch-size",
            str(args.batch_size),
            "--what",
            f"sdpa,{what}",
        ]
        res = json.loads(
            subprocess.run(cmd, capture_output=True, text=True, check=True)
            .stdout.strip()
            .splitlines()[-1]
        )
        added[what] = res["peak_rss_mb"] - res["rss_before_mb"]
        print(
            f"  {what:<16} peak RSS {res['peak_rss_mb']:7.0f} MB, adds {added[what]:7.0f} MB "
            f"over the loaded model ({res['rss_before_mb']:.0f} MB): "
            f"{added[what] / max(added['sdpa'], 1):.2f}x what sdpa adds"
        )


def main() -> None:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--windows", type=int, default=16)
    p.add_argument("--n-ctx", type=int, default=512)
    p.add_argument("--batch-size", type=int, default=4)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument(
        "--tile",
        type=int,
        default=None,
        help="queries per band-statistics tile (default: automatic)",
    )
    p.add_argument(
        "--what",
        default=",".join(WHAT),
        help=f"comma-separated columns, sdpa first (default: {','.join(WHAT)})",
    )
    p.add_argument(
        "--rss", action="store_true", help="measure the peak RSS each column adds (fresh processes)"
    )
    p.add_argument("--rss-child", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    global args_tile
    args_tile = args.tile
    args.what = [w for w in args.what.split(",") if w]
    if not args.what or args.what[0] != "sdpa" or set(args.what) - set(WHAT):
        p.error(f"--what must start with sdpa and name only {', '.join(WHAT)}")
    if args.rss_child:
        rss_child(args)
    elif args.rss:
        rss(args)
    else:
        timing(args)


if __name__ == "__main__":
    main()
