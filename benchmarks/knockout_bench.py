"""Control draws per second of the knockout's positional probe: one forward per draw (the
knockout's own loop: :func:`ropelens.analyses.knockout.knocked_out` around one window) against many
draws in one forward (:func:`ropelens.analyses.knockout.probe_rows`, each draw's planes on its own
batch row), measured side by side in one run, interleaved, on the same random-token window. The
one-forward-per-draw path costs the same per draw however many draws it runs, so it times
``--draws-before`` of them; the batched path runs ``--draws`` rows in one forward.

Each draw zeroes ``--dose`` random planes in every probe head (the heads are the positional heads
ropelens finds on a few windows of the embedded English corpus, or ``--heads L.H,...``). Prints
the median draws per second of each path over ``--repeats`` and the speed-up.

    python benchmarks/knockout_bench.py [--model smollm2-135m] [--draws 64] [--draws-before 8] \
        [--n-ctx 16] [--repeats 3] [--dose 8]
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

import ropelens
from ropelens.analyses.head_taxonomy import HeadScoresReducer, head_taxonomy, random_tokens
from ropelens.analyses.knockout import knocked_out, probe_rows
from ropelens.run import data
from ropelens.run.measure import RunOptions, Windows, measure
from ropelens.spec.bands import Bands
from ropelens.spec.reading import rope_spec


def _one_at_a_time(model, spec, window, rows, heads) -> None:
    layers = sorted({L for L, _ in heads})
    for planes in rows:
        red = HeadScoresReducer(spec, layers, Bands.default(), max_offset=1)
        with knocked_out(model, planes):
            measure(
                model,
                None,
                lambda *_, r=red: r,
                RunOptions(layers=layers, batch_size=1, progress=False, verify=False),
                windows=Windows(window[None]),
                spec=spec,
                analysis="bench",
            )


def _heads(model, spec, given: str | None) -> list[tuple[int, int]]:
    if given:
        return [tuple(int(x) for x in hd.split(".")) for hd in given.split(",")]
    text = data.windows(data.load_corpus("english"), model.tokenizer, 128, n_windows=4)
    tx = head_taxonomy(model, text, layers=spec.rotary_layers, progress=False, verify=False)
    pos = tx.positional()
    return [(L, h) for i, L in enumerate(tx.layers) for h in range(pos.shape[1]) if pos[i, h]]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--draws", type=int, default=64, help="rows of the batched forward")
    ap.add_argument("--draws-before", type=int, default=8, help="draws run one at a time")
    ap.add_argument("--n-ctx", type=int, default=16)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--dose", type=int, default=8)
    ap.add_argument("--heads", default=None, help="L.H,L.H,... (default: the positional heads)")
    a = ap.parse_args()
    model = ropelens.load_model(a.model, device="cpu")
    spec = rope_spec(model)
    heads = _heads(model, spec, a.heads)
    rng = np.random.default_rng(0)
    rows = [
        {
            hd: tuple(rng.choice(spec[hd[0]].n_planes, a.dose, replace=False).tolist())
            for hd in heads
        }
        for _ in range(a.draws)
    ]
    window = random_tokens(1, a.n_ctx, model.cfg.d_vocab, model.tokenizer.bos_token_id, 0)[0]
    probe_rows(model, window, rows[:2], heads, spec=spec)  # warm-up
    before, after = [], []
    for _ in range(a.repeats):
        t = time.perf_counter()
        _one_at_a_time(model, spec, window, rows[: a.draws_before], heads)
        before.append(a.draws_before / (time.perf_counter() - t))
        t = time.perf_counter()
        probe_rows(model, window, rows, heads, spec=spec)
        after.append(a.draws / (time.perf_counter() - t))
    b, f = statistics.median(before), statistics.median(after)
    print(
        f"{a.model}: {len(heads)} probe heads, {a.dose} random planes each, "
        f"{a.n_ctx}-token window, median of {a.repeats}"
    )
    print(f"one forward per draw ({a.draws_before} draws): {b:.3g} draws/s")
    print(f"draws as batch rows ({a.draws} rows):  {f:.3g} draws/s  ({f / b:.1f}x)")


if __name__ == "__main__":
    main()
