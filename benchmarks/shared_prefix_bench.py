"""Control draws per second of the retrieval knockout's copy score (``row_scores`` of
``experiments/two_models.py``), with and without the shared prefix: every batch row computed from
the embedding on, against the layers below the first knocked-out one run once for all rows
(``shared_prefix``). Both paths run side by side in one process, interleaved, on the same passkey
prompt and the same rows, and must give the same scores.

The rows are the experiment's own: the unmodified model, the dose curve and ``--draws`` draws of
each control (random planes, random heads) for the model's retrieval heads (``--heads L.H,...``;
by default the heads ``experiments/two_models.py`` found). Prints the median draws per second of
each path over ``--repeats`` and the speed-up.

    python benchmarks/shared_prefix_bench.py [--model gemma-3-270m] [--draws 16] [--repeats 3]
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import sys
import time
from pathlib import Path

import torch

EXPERIMENTS = Path(__file__).resolve().parents[1] / "experiments"
RETRIEVAL_HEADS = {  # found by experiments/two_models.py (copy score >= 0.1 at 256 tokens)
    "gemma-3-270m": "5.0,5.1,5.2,7.0,11.2",
    "smollm2-135m": "6.0,12.4,17.3,17.4,17.5,18.6,18.7,19.5,20.6,21.2,21.8,23.0,23.2,24.4,26.1",
}


def _experiment():
    sys.path.insert(0, str(EXPERIMENTS))  # the script imports its _common module
    spec = importlib.util.spec_from_file_location("two_models", EXPERIMENTS / "two_models.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="gemma-3-270m", choices=sorted(RETRIEVAL_HEADS))
    ap.add_argument("--draws", type=int, default=16, help="draws of each control")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--prompt-len", type=int, default=256)
    ap.add_argument("--heads", default=None, help="L.H,L.H,... (default: the retrieval heads)")
    a = ap.parse_args()
    mod = _experiment()
    model, _ = mod._common.load(a.model)
    spec = mod.rope_spec(model)
    given = a.heads or RETRIEVAL_HEADS[a.model]
    heads = [tuple(int(x) for x in hd.split(".")) for hd in given.split(",")]
    _, rows = mod.condition_rows(spec, heads, "low", a.draws, 17)
    args = mod.parse(["--models", a.model, "--n-windows", "2", "--prompt-len", str(a.prompt_len)])
    case = mod.units(model, "retrieval", args)[0]
    q = torch.tensor(case.queries)
    target = case.tokens[q + 1]

    def run(shared: bool) -> torch.Tensor:
        return mod.row_scores(model, case.tokens, rows, 8192, q, target, share_prefix=shared)[0]

    torch.testing.assert_close(run(True), run(False), rtol=1e-6, atol=1e-6)  # also a warm-up
    plain, shared = [], []
    for _ in range(a.repeats):
        t = time.perf_counter()
        run(False)
        plain.append(len(rows) / (time.perf_counter() - t))
        t = time.perf_counter()
        run(True)
        shared.append(len(rows) / (time.perf_counter() - t))
    b, f = statistics.median(plain), statistics.median(shared)
    first = mod.first_knocked_layer(rows)
    n_layers = len(mod.decoder_layers(mod.hf_model_of(model)))
    print(
        f"{a.model}: {len(heads)} retrieval heads, {len(rows)} rows, {case.tokens.numel()}-token "
        f"prompt, first knocked-out layer {first} of {n_layers}, median of {a.repeats}"
    )
    print(f"every row from the embedding: {b:.3g} rows/s")
    print(f"layers below {first} shared:    {f:.3g} rows/s  ({f / b:.2f}x)")


if __name__ == "__main__":
    main()
