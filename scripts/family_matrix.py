"""Print ropelens's model-family support table (docs/models.md) from the family matrix.

Each family's tiny random model is checked against HF's eager attention exactly as the tests do
(``tests.harness.families.check_family``); the table shows what each family needs, the layer
kinds ropelens reads, and the largest error measured. Usage:

    .venv/bin/python scripts/family_matrix.py > docs/models.md
"""

from __future__ import annotations

import math
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
# the checkout's package, and its test harness (tests/harness), which the wheel leaves out
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

import transformers
from tests.harness.families import check_family

import ropelens
from ropelens.testing.families import FAMILIES


def _e(x: float) -> str:
    return "–" if math.isnan(x) else f"{x:.1e}"


def _kinds(kinds: dict[str, list[int]]) -> str:
    return ", ".join(f"{k} {v}" for k, v in kinds.items())


def main() -> int:
    rows = []
    t0 = time.perf_counter()
    for name, fam in FAMILIES.items():
        if not hasattr(transformers, fam.config_class):
            rows.append(
                f"| {name} | – | skipped: transformers {transformers.__version__} has no "
                f"{fam.config_class} | | | | | |"
            )
            continue
        r = check_family(name)
        if (
            r.refusal and fam.refused_at == "probe"
        ):  # measured unverified: the errors the probe prevents
            status = (
                f"refused by the probe: `UnsupportedModelError` ({fam.refused}); errors "
                "shown are unverified"
            )
            rows.append(
                f"| {name} | {r.architecture} | {status} | {fam.needs} | {_kinds(r.kinds)} | "
                f"{_e(r.scores_err)} | {_e(r.pattern_err)} | {_e(r.pairing_err)} |"
            )
            continue
        if r.refusal:
            where = {"load": "at load", "spec": "by `rope_spec`"}[fam.refused_at]
            status = f"refused {where}: `UnsupportedModelError` ({fam.refused})"
            rows.append(f"| {name} | {r.architecture} | {status} | {fam.needs} | – | – | – | – |")
            continue
        status = "exact" if r.exact else "**NOT EXACT**"
        rows.append(
            f"| {name} | {r.architecture} | {status} | {fam.needs} | {_kinds(r.kinds)} | "
            f"{_e(r.scores_err)} | {_e(r.pattern_err)} | {_e(r.pairing_err)} |"
        )
    print("# Model families\n")
    print(
        "Every RoPE family in the table below is a tiny random model (4 layers, head dim 16, "
        "sliding windows of 8 on a 24-token input, q/k weights scaled so attention is far from "
        "uniform) saved to a directory and loaded with `ropelens.load_model(path)`, then checked "
        "against HF's own eager attention: the spec against HF's rotary buffers and the family's "
        "structure; the summed band logits against HF's pre-softmax, pre-cap scores (relative "
        "error); the pattern rebuilt from them (soft-capping, sinks and windows applied) against "
        "HF's attention probabilities; and, on one token repeated, the captured post-RoPE query "
        "at every position against the spec's rotation of position 0 (relative error; this is "
        "what catches a wrong plane pairing). The same checks run in "
        "`tests/unit/spec/test_families.py` and `tests/unit/spec/test_new_families.py`. Layers "
        "without RoPE are read from the model's own forward (the layers whose attention never "
        "calls `apply_rotary_pos_emb`), and so is the rotation direction. So is a norm after "
        "RoPE (HunYuan dense, NanoChat: q and k normalised per head, with a gain, after "
        "`apply_rotary_pos_emb`): ropelens then takes post-RoPE q and k where they enter the "
        "score (the query and key the attention function receives), so the plane terms stay an "
        "exact decomposition of each logit; a plane's frequency is the one its rotation had "
        "before the norm; relative-position invariance no longer holds exactly (the norm "
        "rescales each position, and a gain that differs between a plane's two dims breaks it "
        "within the plane); and the pairing column checks the rotation's own output, before the "
        "norm. `ropelens rope-spec --families` lists the families below, exact or refused and "
        "why, without building a model. A family ropelens cannot measure exactly raises "
        "`ropelens.errors.UnsupportedModelError` in one line, never a number: at load "
        "(TransformerLens has no adapter for it, or its adapter cannot wrap the configuration), "
        "from `rope_spec` (a structure ropelens knows it cannot read), or from the verification "
        "probe every analysis runs first (ropelens's reading does not reproduce the model's own "
        "attention).\n"
    )
    print(
        "Layer kinds: `full` (causal), `sliding` (causal within a window), `nope` (attention "
        "without rotation: no planes, left out of per-plane analyses).\n"
    )
    print(
        "| family | HF class | status | what it needs | layer kinds read | scores err | pattern "
        "err | pairing err |"
    )
    print("|---|---|---|---|---|---|---|---|")
    print("\n".join(rows))
    print(
        f"\nMade by `scripts/family_matrix.py` with ropelens {ropelens.__version__}, transformers "
        f"{transformers.__version__}, in {time.perf_counter() - t0:.0f} s."
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
