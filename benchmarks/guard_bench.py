"""Cost of the memory guard's refusal: ``ropelens explore`` at 100,000 tokens on a tiny Llama
(trained, by its config, on Llama 3.1's 131,072-token context, so nothing cuts the text) against
the same command at 64 tokens, which fits and writes its page.

Each case runs ``--repeats`` times in one fresh process (the model loaded once, outside the timing);
prints the median wall time of each, their ratio, the guard's message, and how much the refused runs
grew the process (resident now and peak, over what it held before the first one).

    python benchmarks/guard_bench.py [--repeats 5] [--tokens 100000]
"""

from __future__ import annotations

import argparse
import contextlib
import io
import resource
import statistics
import sys
import tempfile
import time
from pathlib import Path

from ropelens.catalog import explore
from ropelens.cli import main
from ropelens.loading.models import load_model
from ropelens.testing import tiny_model_dir

LONG_CONTEXT = 131_072


def resident() -> tuple[int, int]:
    """Resident bytes now, and the process's peak so far."""
    with open("/proc/self/statm") as f:
        now = int(f.read().split()[1]) * resource.getpagesize()
    return now, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def timed(argv: list[str]) -> tuple[float, int, str]:
    err = io.StringIO()
    t0 = time.perf_counter()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        rc = main(argv)
    return time.perf_counter() - t0, rc, err.getvalue()


def main_(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--tokens", type=int, default=100_000)
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="ropelens-guard-") as tmp:
        work = Path(tmp)
        model_dir = tiny_model_dir("llama", work / "long", max_position_embeddings=LONG_CONTEXT)
        model = load_model(str(model_dir), device="cpu")
        explore.load_from_args = lambda _args: model  # time the command, not the load
        cases = {}
        for name, n in (("fits", 64), ("refused", args.tokens)):
            text = work / f"{name}.txt"
            text.write_text("x" * (n - 1), encoding="utf-8")  # a token a character, BOS first
            cases[name] = (n, ["explore", str(model_dir), "--file", str(text), "--n-ctx", str(n)])
        timed([*cases["fits"][1], "--out", str(work / "warm.html")])  # code paths warmed
        before = resident()
        times: dict[str, list[float]] = {name: [] for name in cases}
        message = ""
        for i in range(args.repeats):
            for name, (_n, command) in cases.items():
                seconds, rc, err = timed([*command, "--out", str(work / f"{name}{i}.html")])
                if rc != (2 if name == "refused" else 0):
                    raise SystemExit(f"{name}: exit {rc}\n{err}")
                if name == "refused":
                    message = next(x for x in err.splitlines() if x.startswith("ropelens: error"))
                times[name].append(seconds)
        after = resident()
    fits, refused = (statistics.median(times[k]) for k in ("fits", "refused"))
    print(f"explore at {cases['fits'][0]:,} tokens (writes its page): median {fits:.3f} s")
    print(f"explore at {args.tokens:,} tokens (refused):          median {refused:.3f} s")
    print(f"ratio refused / fits: {refused / fits:.2f}; runs: {args.repeats} each, interleaved")
    grown = (after[0] - before[0]) / 2**20
    print(f"resident grew {grown:+.1f} MB; peak grew {(after[1] - before[1]) / 2**20:+.1f} MB")
    print(message)
    return 0


if __name__ == "__main__":
    sys.exit(main_())
