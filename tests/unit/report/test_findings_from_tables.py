"""Every number a report finding states, read back from the CSV the report writes beside it.

The report is built on a tiny Llama whose query and key weights are scaled up, with the highest-
frequency plane boosted in a few heads and the lowest-frequency plane in every head (so heads take
their margin from band Q1, and massive dimensions exist). Each finding's sentence is parsed — every
number, percentage, head name, "N of M layers" and "N heads (K shown)" — and each is checked against
what its section's table says, to the rounding the sentence prints. Settings the sentence restates
(the window length, thresholds) are checked against ``report.json``.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable
from pathlib import Path

import pandas as pd
import pytest
import torch

from ropelens.report import build_report

N_CTX = 64
TOKENS = 4 * N_CTX

NUMBER = re.compile(r"(?<![\w.−-])[−+-]?\d[\d,]*(?:\.\d+)?(?!\w)")
HEAD = re.compile(r"\bL(\d+)\.H(\d+)\b")
OF_LAYERS = re.compile(r"(?:(\d[\d,]*) of|all|none of the) (\d[\d,]*) layers")
SHOWN = re.compile(r"(\d[\d,]*) of (\d[\d,]*) heads \((\d+) shown")


# ------------------------------------------------------------------------------------ parsing
def numbers_in(text: str) -> list[tuple[float, int]]:
    """Every number the sentence prints (head names left out), with its decimals: "0.92", "54%"
    (as 54), "−0.03", "8,192"."""
    bare = HEAD.sub("", text)
    out = []
    for m in NUMBER.finditer(bare):
        s = m.group().replace("−", "-").replace(",", "")
        decimals = len(s.split(".")[1]) if "." in s else 0
        out.append((float(s), decimals))
    return out


def heads_in(text: str) -> list[tuple[int, int]]:
    return [(int(L), int(h)) for L, h in HEAD.findall(text)]


def agrees(printed: tuple[float, int], value: float) -> bool:
    """``value`` printed to the sentence's decimals gives the sentence's number."""
    x, decimals = printed
    return math.isfinite(value) and abs(x - value) <= 0.5 * 10.0**-decimals + 1e-9


def pct(share: float) -> float:
    return 100 * float(share)


# ------------------------------------------------------------------------------------ checkers
# Each returns what the sentence may quote, from the tables: {what: value}, in the units printed
# (shares that print as percentages are given ×100), and the heads it may name, in order.
Expected = tuple[dict[str, float], list[tuple[int, int]]]


def energy(_f: dict, t: dict[str, pd.DataFrame], r: dict) -> Expected:
    e = t["energy"]
    out = {}
    for w in "qk":
        rows = e[(e.which == w) & (e.scope == "no_sink")]
        per_layer = rows.groupby(["layer", "band"], sort=False)["energy_share"].mean().unstack()
        wins = per_layer.idxmax(axis=1)
        band = wins.value_counts().idxmax()
        out |= {
            f"{w} layers": (wins == band).sum(),
            f"{w} mean share": pct(per_layer.loc[wins == band, band].mean().round(2)),
        }
    return out | {"layers": t["energy"].layer.nunique()}, []


def sink(_f: dict, t: dict[str, pd.DataFrame], r: dict) -> Expected:
    # per layer, mean per-plane norm at the sink position ÷ at the others, from frequency_usage.csv:
    # with one sink position per window of n_ctx, its mean is n·(all) − (n − 1)·(no_sink)
    u, n = t["frequency_usage"], r["provenance"]["n_ctx"]
    ratio = {}
    for w in "qk":
        norms = u[u.which == w].pivot_table(
            index=["layer", "head", "plane"], columns="scope", values="mean_norm"
        )
        norms["sink"] = n * norms["all"] - (n - 1) * norms["no_sink"]
        by_layer = norms.groupby("layer")[["sink", "no_sink"]].mean()
        ratio[w] = by_layer.sink / by_layer.no_sink
    k = ratio["k"]
    layer = int(k.apply(lambda x: abs(math.log(x))).idxmax())
    return {
        "layer": layer,
        "k ratio": k[layer],
        "q ratio": ratio["q"][layer],
        "k min": k.min(),
        "k max": k.max(),
        # the finding's median is torch's: the lower of the two middle values of an even count
        "k median": k.sort_values().iloc[(len(k) - 1) // 2],
    }, []


def margin(f: dict, t: dict[str, pd.DataFrame], r: dict) -> Expected:
    bs = t["band_statistics"]
    first = bs[bs.band == bs.band.iloc[0]].sort_values("margin_share", ascending=False)
    major = first[first.margin_share > 0.5]
    shown = major if len(major) else first.head(1)
    shown = shown.head(len(heads_in(f["text"])))
    out = {"heads": len(first), "majority": len(major), "shown": len(shown)}
    for i, row in enumerate(shown.itertuples()):
        out |= {f"share {i}": row.margin_share, f"top-1 {i}": row.top1}
    return out, [(int(x.layer), int(x.head)) for x in shown.itertuples()]


def top1(_f: dict, t: dict[str, pd.DataFrame], r: dict) -> Expected:
    bs = t["band_statistics"]
    per_layer = bs.groupby(["layer", "band"], sort=False)["top1"].mean().unstack()
    wins = per_layer.idxmax(axis=1)
    band = wins.value_counts().idxmax()
    overall = bs.groupby("band", sort=False)["top1"].mean()
    return {
        "layers won": (wins == band).sum(),
        "layers": len(per_layer),
        "mean": overall[band],
        "first band": overall.iloc[0],
    }, []


def tightness(_f: dict, t: dict[str, pd.DataFrame], r: dict) -> Expected:
    ti, spec = t["tightness"], t["rope_spec"]
    zero = ti[ti.plane == 0]
    best = zero.loc[zero.tightness.idxmax()]
    last = ti.plane.max()
    return {
        "plane 0": 0,
        "wavelength": spec[spec.plane == 0].wavelength.iloc[0],
        "mean": zero.tightness.mean(),
        "heads": len(zero),
        "aligned": 1,
        "best": best.tightness,
        "lowest plane": last,
        "lowest mean": ti[ti.plane == last].tightness.mean(),
    }, [(int(best.layer), int(best["head"]))]


def heads(f: dict, t: dict[str, pd.DataFrame], r: dict) -> Expected:
    tx = t["head_taxonomy"]
    pos = tx[tx.positional]
    col = next(c for c in tx.columns if c.startswith("margin_share["))
    tau = next(s for s in r["sections"] if s["key"] == "head-taxonomy")["numbers"]["tau"]
    quick = r["provenance"]["config"]["quick"]
    return {
        "positional": len(pos),
        "heads": len(tx),
        "tau": tau,
        "margin positional": pct(pos[col].mean()) if len(pos) else math.nan,
        "margin other": pct(tx[~tx.positional][col].mean()),
        "windows": 2 if quick else 4,
        "window length": min(r["provenance"]["n_ctx"], 256),
    }, []


def sinks0(f: dict, t: dict[str, pd.DataFrame], r: dict) -> Expected:
    sh, sl = t["sinks_heads"], t["sinks_layers"].set_index("layer")
    lo, hi = sl.sinking_share.idxmin(), sl.sinking_share.idxmax()
    return {
        "sinking": sh.sinking.sum(),
        "heads": len(sh),
        "share": pct(sh.sinking.mean()),
        "position 0": 0,
        "after": 4,  # queries m ≥ 4: the analysis's setting
        "epsilon": 0.3,
        "lowest": pct(sl.sinking_share[lo]),
        "lowest layer": lo,
        "highest": pct(sl.sinking_share[hi]),
        "highest layer": hi,
        "attention": pct(sh.mean_attention.mean()),
    }, []


def distance(f: dict, t: dict[str, pd.DataFrame], r: dict) -> Expected:
    d = t["distance_shapes"]
    full = d[d.curve == "logit"]
    out = {f"layers {s}": n for s, n in full["shape"].value_counts().items()}
    out |= {"layers": len(full), "max distance": r["provenance"]["n_ctx"] - 1}
    out |= {f"cause {c}": n for c, n in full.u_cause.dropna().value_counts().items()}
    bands = d[(d["shape"] == "U-shaped") & ~d.curve.isin(["logit", "prob"])]
    out |= {"band U": len(bands), "recovery": 50, "margin": 10}
    return out, []


def massive(f: dict, t: dict[str, pd.DataFrame], r: dict) -> Expected:
    mp, model = t["massive_planes"], r["model"]
    factor = next(s for s in r["sections"] if s["key"] == "massive-values")["numbers"]["factor"]
    out = {"factor": factor, "context": model["trained_n_ctx"]}
    for w, n_heads in (("q", model["n_heads"]), ("k", model["n_kv_heads"])):
        rows = mp[mp.which == w]
        out |= {
            f"{w} massive": rows.n_massive_dims.sum(),
            f"{w} dims": model["n_layers"] * n_heads * model["head_dim"],
            f"{w} beyond": rows[rows.wavelength > model["trained_n_ctx"]].n_massive_dims.sum(),
        }
        hit = rows[rows.n_massive > 0].sort_values("persistence", ascending=False)
        if len(hit):
            out |= {
                f"{w} top plane": hit.plane.iloc[0],
                f"{w} top wavelength": hit.wavelength.iloc[0],
                f"{w} persistence": pct(hit.persistence.iloc[0]),
            }
    return out, []


def prope(f: dict, t: dict[str, pd.DataFrame], r: dict) -> Expected:
    ps = t["prope_sweep"]
    sweep = ps[ps.variant.str.startswith("p-RoPE")]
    ok = sweep[sweep["Δ hi"] < 0.05]
    out = {
        "threshold": 0.05,
        "nope p": 0,
        "nope": ps.loc[ps.p == 0.0, "Δ loss"].iloc[0],
        "p 0.75": 0.75,
        "kept": sweep.loc[sweep.p == 0.75, "Δ loss"].iloc[0],
        "reversed": ps[ps.variant.str.startswith("reversed")]["Δ loss"].iloc[0],
        "partial": ps[ps.variant.str.startswith("partial")]["Δ loss"].iloc[0],
        "planes": ps["planes rotating"].max(),
    }
    if len(ok):
        least = ok.loc[ok.p.idxmin()]
        out |= {"p min": least.p, "rotating": least["planes rotating"]}
    return out, []


def geometry(f: dict, t: dict[str, pd.DataFrame], r: dict) -> Expected:
    g = t["geometry"]
    at = next(c for c in g.columns if c.startswith("value at δ = "))
    window = int(at.removeprefix("value at δ = ").replace(",", ""))
    out = {"window": window, "origin": 0, "q = k": 1}
    for kind, value in g[g.curve.str.startswith("constant")][["kind", at]].to_numpy():
        out[f"{kind} constant"] = value
    return out, []


CHECKS: dict[str, Callable[[dict, dict[str, pd.DataFrame], dict], Expected]] = {
    "energy": energy,
    "sink": sink,
    "margin": margin,
    "top1": top1,
    "tightness": tightness,
    "heads": heads,
    "sinks-0": sinks0,
    "distance": distance,
    "massive": massive,
    "prope": prope,
    "geometry": geometry,
}


def check_finding(f: dict, tables: dict[str, pd.DataFrame], report: dict) -> int:
    """Check one finding's sentence against the tables; the count of numbers it checked."""
    text = f["text"]
    expected, named = CHECKS[f["key"]](f, tables, report)
    quoted = numbers_in(text)
    for printed in quoted:
        assert any(agrees(printed, float(v)) for v in expected.values()), (
            f"finding {f['key']!r} prints {printed[0]:g}, which no table gives ({expected}): {text}"
        )
    assert heads_in(text) == named, (f["key"], text)
    for m in OF_LAYERS.finditer(text):
        assert int(m.group(2).replace(",", "")) == len(report["provenance"]["config"]["layers"])
    for m in SHOWN.finditer(text):
        assert int(m.group(3)) == len(named) < int(m.group(1)), text
    if len(named) < expected.get("majority", 0):
        assert SHOWN.search(text), f"a list cut short must say how many it shows: {text}"
    return len(quoted) + len(named)


def check_report(out: Path) -> tuple[int, int]:
    """Every finding of the report in ``out`` that a check covers, against its CSVs; (findings,
    numbers) checked."""
    report = json.loads((out / "report.json").read_text())
    tables = {p.stem: pd.read_csv(p) for p in out.glob("*.csv")}
    n_findings = n_numbers = 0
    for f in report["findings"]:
        if f["key"] in CHECKS and not f["values"].get("withheld"):
            n_numbers += check_finding(f, tables, report)
            n_findings += 1
    # a head's margin share reads the same in both tables it appears in
    tx, bs = tables["head_taxonomy"], tables["band_statistics"]
    for band in bs.band.unique():
        merged = tx.merge(bs[bs.band == band], on=["layer", "head"])
        pd.testing.assert_series_equal(
            merged[f"margin_share[{band}]"], merged["margin_share"], check_names=False, atol=1e-6
        )
    return n_findings, n_numbers


# ------------------------------------------------------------------------------------ the report
@pytest.fixture(scope="module")
def planted_report(tiny, tmp_path_factory) -> Path:
    from ropelens.testing import tiny_model

    model = tiny_model("llama", num_hidden_layers=4)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.ndim != 2 or not any(s in name for s in ("q_proj", "k_proj")):
                continue
            p.mul_(3)  # sharper attention than a fresh initialisation gives
            p[7::16].mul_(6)  # plane 7 (lowest frequency, half pairing) of every head: massive
            if "layers.3." not in name:
                for h in range(2):  # plane 0 of two heads per layer carries their margin
                    p[16 * h].mul_(8)
                    p[16 * h + 8].mul_(8)
    out = tmp_path_factory.mktemp("findings") / "out"
    return build_report(
        model, corpus="english", tokens=TOKENS, n_ctx=N_CTX, out=out, progress=False,
        band_tokens=None,
    )  # fmt: skip


def test_every_finding_number_comes_from_its_table(planted_report):
    report = json.loads((planted_report / "report.json").read_text())
    keys = [f["key"] for f in report["findings"]]
    n_findings, n_numbers = check_report(planted_report)
    # every finding the report wrote is checked, except the context one (its bounds are formulas
    # of the spec, not a table)
    assert n_findings == len([k for k in keys if k in CHECKS]) == len(keys) - 1
    assert n_numbers >= 80
    text = {f["key"]: f["text"] for f in report["findings"]}
    assert re.search(r"\d+ of 16 heads \(5 shown, largest first\)", text["margin"])
    assert (
        "a rise of at least 50% of the fall" in text["distance"]
        or "U-shaped" not in (text["distance"])
    )


def test_parser_reads_what_findings_print():
    assert numbers_in("L16.H0 0.68 (band-only top-1 0.91), 8,192 tokens, −0.03 nats, 54%") == [
        (0.68, 2), (0.91, 2), (8192.0, 0), (-0.03, 2), (54.0, 0)
    ]  # fmt: skip
    assert numbers_in("band Q4 (lowest) in 16 of 30 layers") == [(16.0, 0), (30.0, 0)]
    assert heads_in("L1.H2 0.70, L16.H0 0.68") == [(1, 2), (16, 0)]
    assert agrees((0.68, 2), 0.679023) and not agrees((0.69, 2), 0.679023)
    assert agrees((54.0, 0), 53.7) and not agrees((54.0, 0), 53.4)
