"""Wall time of the default report (embedded SmolLM2, 32k tokens of the English corpus, n_ctx 512).

The model is loaded (and its conversion cached) before the clock starts; builds the report
``--repeats`` times and prints each wall time, their median, the median time of every step, and the
load average before and after (other processes skew CPU timings). Before each build it times HF's
own sdpa forward over the report's tokens (same windows, same batch size, decoder only), and prints
the median of the per-repeat ratios report / sdpa: slow drifts of a shared machine cancel in a pair.

    python benchmarks/report_bench.py [--model smollm2-135m] [--tokens 32768] [--n-ctx 512] \
        [--band-tokens N|all] [--batch-size 4] [--repeats 3] [--cprofile FILE]
"""

from __future__ import annotations

import argparse
import cProfile
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

import torch

import ropelens
from ropelens.backends.sdpa_capture import hf_view, sdpa_attention
from ropelens.report import DEFAULT_BAND_TOKENS, build_report
from ropelens.run.data import analysis_windows, english

TARGET_SECONDS = 180
TARGET_RATIO = 2.0  # report wall time against HF's sdpa forward over the same tokens


def sdpa_seconds(model, tokens: int, n_ctx: int, batch_size: int) -> float:
    """HF's own sdpa forward (decoder only) over the windows the report measures."""
    toks, _, _ = analysis_windows(model.tokenizer, english(), n_ctx, tokens)
    toks = toks[: max(1, tokens // int(toks.shape[1]))]
    view = hf_view(model)
    t0 = time.perf_counter()
    with torch.no_grad(), sdpa_attention(view):
        for s in range(0, toks.shape[0], batch_size):
            view.base_model(input_ids=toks[s : s + batch_size], use_cache=False)
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=ropelens.DEFAULT_MODEL)
    ap.add_argument("--tokens", type=int, default=32_768)
    ap.add_argument("--n-ctx", type=int, default=512)
    ap.add_argument(
        "--band-tokens",
        default="all" if DEFAULT_BAND_TOKENS is None else str(DEFAULT_BAND_TOKENS),
        help="tokens for band statistics, or 'all'",
    )
    ap.add_argument("--batch-size", type=int, default=4)
    ap.add_argument("--repeats", type=int, default=3, help="builds to take the median of")
    ap.add_argument(
        "--cprofile",
        default=None,
        metavar="FILE",
        help="write a cProfile of the first build to FILE",
    )
    args = ap.parse_args()
    band_tokens = None if args.band_tokens == "all" else int(args.band_tokens)

    t0 = time.perf_counter()
    model = ropelens.load_model(args.model, device="cpu")
    print(
        f"model {args.model} loaded in {time.perf_counter() - t0:.1f} s (not counted); torch "
        f"threads {torch.get_num_threads()}, CPUs {os.cpu_count()}"
    )
    load_before = os.getloadavg()
    walls, steps, sdpas = [], [], []
    for i in range(max(1, args.repeats)):
        sdpas.append(sdpa_seconds(model, args.tokens, args.n_ctx, args.batch_size))
        with tempfile.TemporaryDirectory() as tmp:
            kw = dict(
                tokens=args.tokens,
                n_ctx=args.n_ctx,
                out=Path(tmp) / "report",
                band_tokens=band_tokens,
                batch_size=args.batch_size,
                progress=False,
            )
            t0 = time.perf_counter()
            if args.cprofile and i == 0:
                with cProfile.Profile() as prof:
                    out = build_report(model, **kw)
                prof.dump_stats(args.cprofile)
            else:
                out = build_report(model, **kw)
            walls.append(time.perf_counter() - t0)
            report = json.loads((out / "report.json").read_text())
        steps.append(report["provenance"]["steps_seconds"])
        print(
            f"build {i + 1}: {walls[-1]:.1f} s (sdpa forward beside it {sdpas[-1]:.1f} s: "
            f"{walls[-1] / sdpas[-1]:.2f}×)",
            flush=True,
        )
    load_after = os.getloadavg()
    m = report["measured"]
    print(
        f"\nreport: {m['usage']['n_tokens']:,} tokens in {m['usage']['n_windows']} windows of "
        f"{args.n_ctx}, band statistics on {m['band_statistics']['n_windows']} windows, "
        f"{len(report['provenance']['config']['layers'])} layers"
    )
    for step in steps[0]:
        print(f"  {step:<18}{statistics.median(s[step] for s in steps):8.1f} s (median)")
    wall = statistics.median(walls)
    print(
        f"  {'wall':<18}{wall:8.1f} s median of {len(walls)} "
        f"({', '.join(f'{w:.1f}' for w in walls)}); target ≤ {TARGET_SECONDS} s: "
        f"{'met' if wall <= TARGET_SECONDS else 'missed'}"
    )
    ratio = statistics.median(w / s for w, s in zip(walls, sdpas, strict=True))
    print(
        f"  {'sdpa forward':<18}{statistics.median(sdpas):8.1f} s median; report / sdpa "
        f"{ratio:.2f}× (median of per-repeat ratios); target ≤ {TARGET_RATIO}×: "
        f"{'met' if ratio <= TARGET_RATIO else 'missed'}"
    )
    print(
        f"load average (1, 5, 15 min): before {load_before[0]:.2f} {load_before[1]:.2f} "
        f"{load_before[2]:.2f}, after {load_after[0]:.2f} {load_after[1]:.2f} {load_after[2]:.2f}"
    )


if __name__ == "__main__":
    main()
