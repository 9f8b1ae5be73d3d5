"""Cost of running a model under a RoPE variant or a band ablation on the HF sdpa forward.

Times, side by side on the same windows of the embedded English corpus and interleaved, the mean
next-token loss by HF's own sdpa forward (``sdpa``: the HF model the bridge wraps, nothing applied),
under p-RoPE 0.75 and under a band ablation (the highest quarter of the planes zeroed in every
layer) on the sdpa path (``prope_sdpa``, ``ablate_sdpa``), with ``--plain`` the same on the weights
loaded as a plain HF model (``prope_plain``, ``ablate_plain``: no bridge at all) and, where its
[heads, n, n] scores fit, through the bridge (``prope_bridge``); prints the median of each and its
ratio to ``sdpa``. ``--rss N`` instead measures the peak RSS one forward of N tokens adds over the
loaded model, plain and under p-RoPE 0.75, each in a fresh process (VmHWM after resetting it, and
ru_maxrss). ``--passkey N`` times one passkey trial at N tokens under the sdpa path (KV cache,
prefill in chunks of 4,096), with its peak RSS, for the unmodified model or a ``--variant``.

    python benchmarks/intervene_bench.py [--windows 8] [--n-ctx 512] [--repeats 3] \
        [--bridge] [--plain]
    python benchmarks/intervene_bench.py --rss 16384
    python benchmarks/intervene_bench.py --passkey 32768 [--variant yarn:4:8192]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import resource
import statistics
import subprocess
import sys
import time

import torch

import ropelens
from ropelens.backends.losses import hf_losses
from ropelens.backends.sdpa_capture import hf_view, sdpa_attention
from ropelens.run import data
from ropelens.run.evaluate import window_losses
from ropelens.run.intervene import ablate_planes, apply_rope_variant
from ropelens.spec.variants import PRoPE


def _context(model, what: str):
    if what.startswith("prope"):
        return apply_rope_variant(model, PRoPE(0.75))
    if what.startswith("ablate"):
        n = ropelens.rope_spec(model).layers[0].n_planes
        return ablate_planes(model, list(range(n // 4)))
    return contextlib.nullcontext()


def run(model, toks, what: str, batch_size: int) -> tuple[float, torch.Tensor]:
    t0 = time.perf_counter()
    if what == "sdpa":
        view = hf_view(model)
        with torch.no_grad(), sdpa_attention(view):
            losses = torch.cat(
                [hf_losses(view, toks[s : s + batch_size]) for s in range(0, len(toks), batch_size)]
            )
    else:
        with _context(model, what):
            losses = window_losses(
                model,
                toks,
                batch_size=batch_size,
                progress=False,
                path="bridge" if what.endswith("bridge") else "sdpa",
            )
    return time.perf_counter() - t0, losses


def timing(args) -> None:
    model = ropelens.load_model(args.model)
    # the same weights loaded without the bridge: the engine applies the variant at the rotation the
    # HF forward calls
    plain = ropelens.load_model(args.model, bridge=False) if args.plain else None
    toks = data.windows(data.english(), model.tokenizer, args.n_ctx, n_windows=args.windows)
    whats = (
        ["sdpa", "prope_sdpa", "ablate_sdpa"]
        + (["prope_plain", "ablate_plain"] if args.plain else [])
        + (["prope_bridge"] if args.bridge else [])
    )
    on = {w: plain if w.endswith("_plain") else model for w in whats}
    for w in whats:  # warm-up: first-call costs (probes, allocations) out of the medians
        run(on[w], toks[:1, :64], w, 1)
    times: dict[str, list[float]] = {w: [] for w in whats}
    losses: dict[str, float] = {}
    for _ in range(args.repeats):
        for w in whats:
            t, loss = run(on[w], toks, w, args.batch_size)
            times[w].append(t)
            losses[w] = float(loss.mean())
    base = statistics.median(times["sdpa"])
    print(
        f"{args.model}, {toks.shape[0]} × {toks.shape[1]} tokens, batch {args.batch_size}, "
        f"{torch.get_num_threads()} threads, medians of {args.repeats}; paired: the median of "
        "each repeat's own ratio to the sdpa run beside it (slow drifts of a shared machine "
        "cancel)"
    )
    for w in whats:
        med = statistics.median(times[w])
        paired = statistics.median(x / y for x, y in zip(times[w], times["sdpa"], strict=True))
        print(
            f"  {w:<13} {med:8.2f} s  {med / base:6.2f}×  paired {paired:5.2f}×  loss "
            f"{losses[w]:.4f}"
        )


def _vm(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])  # kB
    return 0


def rss_child(args) -> None:
    model = ropelens.load_model(args.model)
    toks = data.windows(data.english(), model.tokenizer, args.rss, n_windows=1)
    run(model, toks[:, :64], args.what, 1)  # warm-up
    with contextlib.suppress(OSError), open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # reset VmHWM to the current RSS
    before, maxrss_before = _vm("VmRSS"), resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    t, _ = run(model, toks, args.what, 1)
    print(
        json.dumps(
            {
                "what": args.what,
                "n": args.rss,
                "seconds": t,
                "peak_added_mb": (_vm("VmHWM") - before) / 1024,
                "maxrss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                "maxrss_before_mb": maxrss_before / 1024,
            }
        )
    )


def rss(args) -> None:
    rows = {}
    for what in ("sdpa", "prope_sdpa"):
        out = subprocess.run(
            [
                sys.executable,
                __file__,
                "--model",
                args.model,
                "--rss",
                str(args.rss),
                "--child",
                what,
            ],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        rows[what] = json.loads(out.strip().splitlines()[-1])
        print(rows[what])
    a, b = rows["sdpa"]["peak_added_mb"], rows["prope_sdpa"]["peak_added_mb"]
    print(
        f"{args.rss} tokens: peak RSS added {a:.0f} MB plain sdpa, {b:.0f} MB under p-RoPE 0.75: "
        f"{b / a:.2f}×"
    )


def passkey(args) -> None:
    from ropelens.analyses.passkey_retrieval import passkey_retrieval
    from ropelens.cli.variant_syntax import parse_variant

    variant = parse_variant(args.variant) if args.variant else None
    model = ropelens.load_model(args.model)
    loaded_mb = _vm("VmRSS") / 1024
    t0 = time.perf_counter()
    res = passkey_retrieval(
        model,
        [args.passkey],
        depths=[0.5],
        n_trials=1,
        progress=False,
        prefill_chunk=4096,
        variant=variant,
    )
    t = res.trials[0]
    peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(
        f"passkey at {t.n_tokens} tokens ({res.provenance.config['forward']}, variant "
        f"{args.variant or 'none'}): answer {t.answer!r} (passkey {t.passkey}), "
        f"{time.perf_counter() - t0:.0f} s; peak RSS {peak_mb:.0f} MB ({peak_mb - loaded_mb:.0f} "
        f"MB over the loaded model's {loaded_mb:.0f} MB)"
    )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--windows", type=int, default=8)
    p.add_argument("--n-ctx", type=int, default=512)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument(
        "--bridge",
        action="store_true",
        help="also time the bridge path (eager [heads, n, n] scores)",
    )
    p.add_argument(
        "--plain",
        action="store_true",
        help="also time p-RoPE and the band ablation on the same weights "
        "loaded without the bridge (a plain HF model)",
    )
    p.add_argument("--rss", type=int, default=0, help="measure peak RSS at this many tokens")
    p.add_argument(
        "--passkey", type=int, default=0, help="time one passkey trial at this many tokens"
    )
    p.add_argument(
        "--variant", default=None, help="with --passkey: a RoPE variant, e.g. yarn:4:8192"
    )
    p.add_argument("--child", dest="what", default=None, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.rss and args.what:
        rss_child(args)
    elif args.rss:
        rss(args)
    elif args.passkey:
        passkey(args)
    else:
        timing(args)


if __name__ == "__main__":
    main()
