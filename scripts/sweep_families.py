"""Sweep every RoPE causal LM of the installed transformers through ropelens and write
docs/sweep.md.

Each causal-LM model type whose modeling code applies rotary embeddings gets a tiny config built
from its config class's defaults (``tests.harness.sweep.shrink_config``), a random model, and
the family matrix's checks against HF's eager attention (``check_config``). A family added to
transformers shows up here by re-running:

    .venv/bin/python scripts/sweep_families.py            # writes docs/sweep.md
    # a few families, table to stdout
    .venv/bin/python scripts/sweep_families.py llama qwen3 --out -

Families run one at a time in a worker process; one that takes longer than ``--timeout`` seconds
is killed, reported as not built, and the worker restarts for the next.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import math
import os
import select
import subprocess
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
ROOT = Path(__file__).resolve().parents[1]
# the checkout's package, and its test harness (tests/harness), which the wheel leaves out
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "src"))

STATUSES = ("exact", "refused", "wrong", "crashed", "unverified", "no RoPE", "not built")
_NOT_COUNTED = ("no RoPE", "not built")  # outside the RoPE families built
_MARK = "@@ropelens-sweep "  # worker lines that carry a result (HF prints its own lines too)


def worker(report: bool = False) -> int:
    """Read model types from stdin, one a line; write one JSON result line for each (with
    ``report``, each family's ``ropelens report --quick`` is built too)."""
    import warnings

    warnings.filterwarnings("ignore")
    import torch
    from tests.harness.sweep import sweep_one

    torch.set_num_threads(1)  # one core: the machine is shared, and the models are tiny
    for line in sys.stdin:
        mt = line.strip()
        t0 = time.perf_counter()
        row = sweep_one(mt, report=report)
        row.seconds = time.perf_counter() - t0
        print(_MARK + json.dumps(dataclasses.asdict(row)), flush=True)
    return 0


class _Worker:
    """A worker process fed one model type at a time, restarted after a timeout or a crash."""

    def __init__(self, report: bool = False) -> None:
        self.proc: subprocess.Popen | None = None
        self.report = report

    def _start(self) -> subprocess.Popen:
        return subprocess.Popen(
            [sys.executable, __file__, "--worker", *(["--report"] if self.report else [])],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            bufsize=1,
        )

    def run(self, mt: str, timeout: float) -> dict:
        if self.proc is None or self.proc.poll() is not None:
            self.proc = self._start()
        self.proc.stdin.write(mt + "\n")
        self.proc.stdin.flush()
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            ready, _, _ = select.select([self.proc.stdout], [], [], max(left, 0))
            if not ready:
                self.stop()
                return {
                    "model_type": mt,
                    "status": "not built",
                    "detail": f"no result within {timeout:.0f} s",
                }
            line = self.proc.stdout.readline()
            if not line:  # the worker died (a segfault, an exit in HF code)
                code = self.proc.wait()
                self.proc = None
                return {
                    "model_type": mt,
                    "status": "not built",
                    "detail": f"the check's process died (exit {code})",
                }
            if line.startswith(_MARK):
                return json.loads(line[len(_MARK) :])

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait()
            self.proc = None


def _e(x: float | None) -> str:
    return "–" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.1e}"


def _cell(s: str) -> str:
    return s.replace("|", "\\|").replace("\n", " ")


def render(
    rows: list[dict], *, seconds: float, families: int, command: str, report: bool = False
) -> str:
    """docs/sweep.md: header, counts, one row per family (status, then reason or errors)."""
    import torch
    import transformers

    import ropelens

    counts = {s: sum(r["status"] == s for r in rows) for s in STATUSES}
    built = len(rows) - sum(counts[s] for s in _NOT_COUNTED)
    out = [
        "# Sweep of every RoPE causal LM in transformers\n",
        "Every model type of transformers' `MODEL_FOR_CAUSAL_LM_MAPPING_NAMES` whose modeling "
        "code applies "
        "rotary embeddings (`apply_rotary_pos_emb`, `rotary_emb` or a `RotaryEmbedding` class) "
        "gets a tiny "
        "random model built automatically from its config class's defaults: hidden size 64, 4 "
        "heads of 16, "
        "intermediate 128, the tiny tokenizer's vocabulary of 101, 2-4 layers holding every kind "
        "of layer of "
        "the default stack (layer_types and other per-layer patterns, dense/MoE splits, NoPE "
        "layers), sliding "
        "windows and chunks cut to at most 8 (the input is 24 tokens), at most 4 experts, MLA "
        "ranks scaled "
        "together, partial rotary and soft-caps kept, q/k weights ×4 so attention is far from "
        "uniform "
        "(`tests.harness.sweep.shrink_config`). The model is saved, loaded with "
        "`ropelens.load_model(path)`, "
        "and checked against HF's own eager attention exactly as the curated family matrix "
        "([models.md](models.md)) does (`tests.harness.sweep.check_config`): the spec's "
        "frequencies against "
        "HF's rotary buffers (GPT-J and CodeGen keep none: against the angle step of each plane "
        "between "
        "consecutive positions of their `embed_positions` sin|cos tables), the summed band "
        "logits against HF's pre-softmax scores (relative), the rebuilt "
        "pattern against HF's attention probabilities, and on one token repeated the post-RoPE "
        "query against "
        "the spec's rotation (relative). Past the logits (`tests.harness.sweep_checks`): "
        "frequency usage, the "
        "mean norm of every plane of the post-RoPE q and k, against the plane norms of the q and "
        "k HF's "
        "attention function receives, its rotary `attention_scaling` divided out (relative); "
        "band statistics, "
        "every sum `BandStatsReducer` streams (|logit|, covariance, margin, top-1, JS "
        "divergence, variance, "
        "counts, Cauchy–Schwarz), against a dense float64 reference built from the q, k, scale, "
        "mask, cap, "
        "sinks and probabilities HF's eager attention receives and returns "
        "(`tests.harness.dense`; "
        "relative to each sum's largest value; layers whose mask the model picks at run time, "
        "sparse "
        "attention's key selection and Llama 4's chunks, on the input cut into windows they keep "
        "causal); and "
        "a RoPE variant, p-RoPE with p = 0.5 through `apply_rope_variant`: on one token repeated "
        "the rotated "
        "query against the variant's rotation (relative), and the logits after leaving it equal "
        "to the ones "
        "before bit for bit (a difference makes the family wrong); every engine takes variants: "
        "the bridge's "
        "hooks, and the HF forward's own rotation (`ropelens.backends.engine`) on a plain HF "
        "model or a bridge whose "
        "attention rotates inside HF's module. Then the variant against HF's own implementation: "
        "the logits "
        "under PI (`Linear(2)`) in the layers with default RoPE against the same weights "
        "reloaded with HF's "
        '`linear` rope type, factor 2, in their config (relative; "–" where HF\'s config takes '
        "no other rope "
        "type for them). With `--report`, each exact family's `ropelens report --quick` is built "
        "too (a family "
        "whose report does not build is a crash). Errors are absolute in float32 unless marked "
        "relative; the "
        "tolerance is 1e-4.\n",
        "Statuses: **exact** (every error ≤ 1e-4), **refused** (ropelens raised "
        "`UnsupportedModelError`; its first line is shown), **wrong** (ropelens gave a number HF "
        "disagrees with: a bug), **crashed** (ropelens raised something other than a refusal: a "
        "bug), **unverified** (ropelens read it but HF gave no reference for one of the checks, "
        "the variant aside), **no RoPE** (HF's forward calls no rotation and runs no rotary "
        "module, and ropelens says the model is not rotary: its modeling code only defines a "
        "rotation, as Jamba's and Nemotron-H's attention layers do; not a RoPE family, so "
        "outside the counts of RoPE families built), **not built** (the tiny model could not be "
        "built or run here: the reason is shown).\n",
        f"Made by `{command}` on {datetime.date.today().isoformat()} with ropelens "
        f"{ropelens.__version__}, transformers {transformers.__version__}, torch "
        f"{torch.__version__}: {families} model types with rotary code in {seconds:.0f} s.\n",
        "| RoPE families built | exact | refused | wrong | crashed | unverified | no RoPE | not "
        "built |",
        "|---|---|---|---|---|---|---|---|",
        f"| {built} | {counts['exact']} ({100 * counts['exact'] / max(built, 1):.0f}%) | "
        f"{counts['refused']} | {counts['wrong']} | {counts['crashed']} | {counts['unverified']} "
        f"| {counts['no RoPE']} | {counts['not built']} |\n",
        "| model type | HF class | status | reason | layer kinds read | structure kept | freq "
        "err | scores err (rel) | pattern err | pairing err (rel) | usage err (rel) | band stats "
        "err (rel) | variant err (rel) | PI vs HF's linear (rel) |"
        + (" report |" if report else ""),
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|" + ("---|" if report else ""),
    ]
    for r in rows:
        e = r.get("errors") or {}
        kinds = ", ".join(f"{k} {v}" for k, v in (r.get("kinds") or {}).items())
        status = (
            r["status"] if r["status"] not in ("wrong", "crashed") else f"**{r['status'].upper()}**"
        )
        out.append(
            f"| {r['model_type']} | {r.get('architecture', '')} | {status} | "
            f"{_cell(r.get('detail', ''))} | {kinds} | {_cell(r.get('structure', ''))} | "
            f"{_e(e.get('inv_freq_err'))} | {_e(e.get('scores_err'))} | "
            f"{_e(e.get('pattern_err'))} | {_e(e.get('pairing_err'))} | {_e(e.get('usage_err'))} "
            f"| {_e(e.get('band_stats_err'))} | {_e(e.get('variant_err'))} | "
            f"{_e(e.get('hf_variant_err'))} |"
            + (f" {_cell(r.get('report', '')) or '–'} |" if report else "")
        )
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "model_types",
        nargs="*",
        help="sweep only these model types (default: every RoPE causal LM)",
    )
    p.add_argument(
        "--out", default=str(ROOT / "docs" / "sweep.md"), help="where the table goes ('-': stdout)"
    )
    p.add_argument("--timeout", type=float, default=120.0, help="seconds one family may take")
    p.add_argument(
        "--report",
        action="store_true",
        help="also build each exact family's `ropelens report --quick` (about 5 s a family)",
    )
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.worker:
        return worker(a.report)
    from tests.harness.sweep import rope_model_types

    t0 = time.perf_counter()
    types = [t.model_type for t in rope_model_types()]
    if a.model_types:
        unknown = sorted(set(a.model_types) - set(types))
        if unknown:
            p.error(f"not a RoPE causal-LM model type here: {', '.join(unknown)}")
        types = [t for t in types if t in a.model_types]
    w = _Worker(a.report)
    rows = []
    try:
        for i, mt in enumerate(types, 1):
            r = w.run(mt, a.timeout)
            rows.append(r)
            print(
                f"[{i}/{len(types)}] {mt}: {r['status']} {r.get('detail', '')[:100]}",
                file=sys.stderr,
                flush=True,
            )
    finally:
        w.stop()
    seconds = time.perf_counter() - t0
    text = render(
        rows,
        seconds=seconds,
        families=len(types),
        command="python scripts/sweep_families.py"
        + (" --report" if a.report else "")
        + "".join(f" {t}" for t in a.model_types),
        report=a.report,
    )
    if a.out == "-":
        sys.stdout.write(text)
    else:
        Path(a.out).write_text(text)
    print(
        f"{len(rows)} families in {seconds:.0f} s; "
        + ", ".join(f"{s} {sum(r['status'] == s for r in rows)}" for s in STATUSES),
        file=sys.stderr,
    )
    return 1 if any(r["status"] in ("wrong", "crashed") for r in rows) else 0


if __name__ == "__main__":
    raise SystemExit(main())
