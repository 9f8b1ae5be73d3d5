"""Corpus runs across processes (torch's own launcher, gloo on loopback) and checkpoint/resume.

The reference is always the same analysis in one process: sums must agree to float64 rounding
(each rank runs exactly the batches one process would run), classifications exactly.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest
import torch

import ropelens
from ropelens import Bands
from ropelens.analyses.band_statistics import BandStatistics
from ropelens.analyses.frequency_usage import FrequencyUsage, UsageReducer
from ropelens.run import capture
from ropelens.run.distributed import RunInfo, run_windows, shard
from tests.unit.run.test_measure import _run_ranks

N_CTX, N_WINDOWS = 32, 7  # 7 windows: not divisible by 2 or 3


def launch(nproc: int, args: list[str], timeout: int = 240) -> subprocess.CompletedProcess:
    """``torchrun --standalone --nproc-per-node N ARGS`` on loopback, one thread per rank."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "MASTER_ADDR": "127.0.0.1"}
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc-per-node={nproc}",
        *args,
    ]
    return _run_ranks(cmd, timeout, env)


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).abs().max() / b.abs().max().clamp_min(1e-300)) if b.numel() else 0.0


def test_shard_takes_every_item_once():
    for n in range(0, 12):
        for world in (1, 2, 3, 5):
            parts = [shard(n, r, world) for r in range(world)]
            assert sorted(i for p in parts for i in p) == list(range(n))
    with pytest.raises(ValueError, match="not in a world"):
        shard(4, 3, 3)


@pytest.mark.parametrize("nproc", [2, 3])
def test_ranks_equal_one_process(nproc, gqa_dir, tmp_path):
    """usage and band statistics under N ranks equal one process's: sums to float64 rounding."""
    tokens = str(N_CTX * N_WINDOWS)
    common = ["--corpus", "english", "--n-ctx", str(N_CTX), "--tokens", tokens, "--device", "cpu"]
    u_path, s_path = tmp_path / "usage.json", tmp_path / "stats.json"
    r = launch(
        nproc, ["-m", "ropelens", "frequency-usage", str(gqa_dir), *common, "--save", str(u_path)]
    )
    assert r.returncode == 0, r.stderr[-3000:]
    r = launch(
        nproc,
        [
            "-m",
            "ropelens",
            "band-statistics",
            str(gqa_dir),
            *common,
            "--batch-size",
            "2",
            "--save",
            str(s_path),
        ],
    )
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.count("windows of 32") == 1, r.stdout

    model = ropelens.load_model(gqa_dir, device="cpu")
    u1 = ropelens.analyses.frequency_usage(
        model, "english", n_ctx=N_CTX, max_tokens=int(tokens), progress=False
    )
    s1 = ropelens.analyses.band_statistics(
        model, "english", n_ctx=N_CTX, max_tokens=int(tokens), batch_size=2, progress=False
    )
    uN, sN = FrequencyUsage.load(u_path), BandStatistics.load(s_path)
    for key in u1.token:
        for f in ("count", "total", "total_sq"):
            assert _rel(getattr(uN.token[key], f), getattr(u1.token[key], f)) <= 1e-9, (key, f)
            assert _rel(getattr(uN.window[key], f), getattr(u1.window[key], f)) <= 1e-9, (key, f)
    for k, v in s1.sums.items():
        assert _rel(sN.sums[k], v) <= 1e-9, k
    assert torch.equal(sN.sums["top1"], s1.sums["top1"])  # counts: identical
    assert uN.provenance.n_tokens == u1.provenance.n_tokens == N_CTX * N_WINDOWS
    cfg = sN.provenance.config
    assert cfg["world_size"] == nproc
    assert sorted(w for ws in cfg["windows_by_rank"] for w in ws) == list(range(N_WINDOWS))
    assert uN.provenance.config["world_size"] == nproc


def test_a_failing_rank_stops_every_rank_with_its_error(tmp_path, gqa_dir):
    """Rank 1 raises mid-run: both ranks exit non-zero, promptly, and rank 0 names rank 1's
    error."""
    script = tmp_path / "fail.py"
    script.write_text(
        textwrap.dedent(f"""
        import torch, torch.distributed as dist, ropelens
        from ropelens.run.distributed import init_from_env, run_windows
        from ropelens.analyses.frequency_usage import UsageReducer
        init_from_env("cpu")
        model = ropelens.load_model({str(gqa_dir)!r}, device="cpu")
        spec = ropelens.rope_spec(model)

        class Boom(UsageReducer):
            def update(self, acts):
                if dist.get_rank() == 1:
                    raise MemoryError("out of memory on rank 1 (planted)")
                super().update(acts)

        toks = torch.randint(4, 100, (4, 16))
        try:
            reducers = [Boom(spec, spec.rotary_layers)]
            run_windows(model, toks, reducers, batch_size=1, spec=spec, progress=False)
        finally:
            dist.destroy_process_group()
    """)
    )
    r = launch(2, [str(script)], timeout=180)
    assert r.returncode != 0
    assert "rank 1 of 2 failed" in r.stderr and "out of memory on rank 1 (planted)" in r.stderr, (
        r.stderr[-3000:]
    )


def test_checkpoint_resume_gives_the_identical_result(tmp_path, tiny, monkeypatch):
    """A run that dies after some batches, started again with the same arguments, resumes from
    its checkpoint and ends with exactly the sums of an uninterrupted run; a changed configuration
    refuses to resume."""
    model = tiny("llama-gqa")
    toks = torch.randint(4, 100, (6, 20), generator=torch.Generator().manual_seed(5))
    whole = ropelens.analyses.band_statistics(
        model, toks, bands=Bands.quantiles(2), batch_size=1, progress=False
    )

    real = capture.stream
    calls = {"n": 0}

    def dies_after_four(*a, **k):
        calls["n"] += 1
        if calls["n"] > 4:
            raise KeyboardInterrupt("killed")
        return real(*a, **k)

    import ropelens.run.distributed as D

    monkeypatch.setattr(D, "stream", dies_after_four)
    with pytest.raises(KeyboardInterrupt):
        ropelens.analyses.band_statistics(
            model,
            toks,
            bands=Bands.quantiles(2),
            batch_size=1,
            progress=False,
            checkpoint=tmp_path / "ck",
            checkpoint_every=2,
        )
    monkeypatch.setattr(D, "stream", real)
    assert (tmp_path / "ck" / "rank0-of-1.pt").exists()
    resumed = ropelens.analyses.band_statistics(
        model,
        toks,
        bands=Bands.quantiles(2),
        batch_size=1,
        progress=False,
        checkpoint=tmp_path / "ck",
        checkpoint_every=2,
    )
    assert resumed.provenance.config["resumed_batches"] == 4
    for k, v in whole.sums.items():
        assert torch.equal(resumed.sums[k], v), k
    assert resumed.provenance.n_tokens == whole.provenance.n_tokens
    with pytest.raises(ValueError, match="different run"):
        ropelens.analyses.band_statistics(
            model,
            toks,
            bands=Bands.quantiles(4),
            batch_size=1,
            progress=False,
            checkpoint=tmp_path / "ck",
        )
    with pytest.raises(ValueError, match="different run"):
        ropelens.analyses.band_statistics(
            model,
            toks[:5],
            bands=Bands.quantiles(2),
            batch_size=1,
            progress=False,
            checkpoint=tmp_path / "ck",
        )


def test_single_process_run_info(tiny):
    model = tiny("llama")
    spec = ropelens.rope_spec(model)
    toks = torch.randint(4, 100, (3, 12))
    red = UsageReducer(spec, spec.rotary_layers)
    info = run_windows(model, toks, [red], batch_size=2, spec=spec, progress=False)
    assert isinstance(info, RunInfo) and info.world_size == 1 and info.n_tokens == 36
    assert info.to_config() == {}
    with pytest.raises(ValueError, match="every must be"):
        run_windows(model, toks, [red], batch_size=2, spec=spec, progress=False, every=0)


def test_device_map_naming_cpu_loads_and_runs(gqa_dir):
    """A device map that names the CPU explicitly (the accelerate path) gives the plain load's
    numbers."""
    plain = ropelens.load_model(gqa_dir, device="cpu")
    mapped = ropelens.load_model(gqa_dir, device_map={"": "cpu"})
    toks = torch.randint(4, 100, (2, 16), generator=torch.Generator().manual_seed(2))
    a = ropelens.analyses.frequency_usage(plain, toks, progress=False)
    b = ropelens.analyses.frequency_usage(mapped, toks, progress=False)
    torch.testing.assert_close(b.q_norm, a.q_norm, rtol=0, atol=0)
    with pytest.raises(ValueError, match="either device or device_map"):
        ropelens.load_model(gqa_dir, device="cpu", device_map={"": "cpu"})
    with pytest.raises(ValueError, match="max_memory only applies"):
        ropelens.load_model(gqa_dir, max_memory={"cpu": "1GB"})


def assert_same_frame(a, b, where: str) -> None:
    """Equal tables: the same columns and rows, strings equal, numbers to float64 rounding.

    The sums behind every number are float64, added in another order across ranks (each rank's part
    first): that moves them by a few ulps (~1e-15 relative), and the ratios and differences built on
    them by at most ~1e-12 of the column's scale; 1e-9 of the column's largest magnitude is far
    above that and far below any real difference (a window counted twice or missed moves them by >
    1e-3).
    """
    import numpy as np
    import pandas as pd

    assert list(a.columns) == list(b.columns) and len(a) == len(b), where
    for col in a.columns:
        x, y = a[col], b[col]
        if (
            pd.api.types.is_numeric_dtype(x)
            and pd.api.types.is_numeric_dtype(y)
            and x.dtype != bool
        ):
            x, y = x.to_numpy(np.float64), y.to_numpy(np.float64)
            scale = float(np.nanmax(np.abs(x), initial=0.0)) if np.isfinite(x).any() else 0.0
            np.testing.assert_allclose(
                y, x, rtol=1e-9, atol=1e-9 * scale, equal_nan=True, err_msg=f"{where}: {col}"
            )
        else:
            assert x.astype(str).tolist() == y.astype(str).tolist(), f"{where}: {col}"


def test_report_under_torchrun_equals_one_process(gqa_dir, tmp_path):
    """Two ranks measure, rank 0 alone renders (its sections re-run the model locally) and writes;
    every CSV equals a one-process report's in every column. The CSVs hold no timing column; the
    timings (report.json's provenance seconds and steps_seconds) are the only numbers left out."""
    import json

    import pandas as pd

    from ropelens.report.build import build_report

    r = launch(
        2,
        [
            "-m",
            "ropelens",
            "report",
            str(gqa_dir),
            "--quick",
            "--out",
            str(tmp_path / "two"),
            "--device",
            "cpu",
        ],
    )
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.count("report: ") == 1  # rank 0 only
    one = build_report(
        ropelens.load_model(gqa_dir, device="cpu"), quick=True, out=tmp_path / "one", progress=False
    )
    names = sorted(p.name for p in one.glob("*.csv"))
    assert names == sorted(p.name for p in (tmp_path / "two").glob("*.csv"))
    assert {
        "frequency_usage.csv",
        "band_statistics.csv",
        "energy.csv",
        "head_taxonomy.csv",
        "sinks_heads.csv",
        "distance_shapes.csv",
    } <= set(names)
    for name in names:
        assert_same_frame(pd.read_csv(one / name), pd.read_csv(tmp_path / "two" / name), name)
    a, b = (json.loads((d / "report.json").read_text()) for d in (one, tmp_path / "two"))
    assert [f["text"] for f in a["findings"]] == [f["text"] for f in b["findings"]]


def test_heads_under_torchrun_equals_one_process(gqa_dir, tmp_path):
    """heads on two gloo ranks: the saved taxonomy equals head_taxonomy in one process, every score
    and class."""
    from ropelens.analyses.head_taxonomy import HeadTaxonomy, head_taxonomy

    saved = tmp_path / "heads.json"
    r = launch(
        2,
        [
            "-m",
            "ropelens",
            "head-taxonomy",
            str(gqa_dir),
            "--tokens",
            str(3 * N_CTX),
            "--n-ctx",
            str(N_CTX),
            "--device",
            "cpu",
            "--save",
            str(saved),
        ],
    )
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.count("positional heads of") == 1, r.stdout  # rank 0 prints, alone
    two = HeadTaxonomy.load(saved)
    cfg = two.provenance.config
    assert cfg["world_size"] == 2 and sorted(w for ws in cfg["windows_by_rank"] for w in ws) == [
        0,
        1,
        2,
    ]
    one = head_taxonomy(
        ropelens.load_model(gqa_dir, device="cpu"), n_ctx=N_CTX, n_windows=3, progress=False
    )
    assert two.tau == one.tau
    assert_same_frame(one.to_frame(), two.to_frame(), "heads")


def test_commands_that_do_not_split_refuse_torchrun(gqa_dir, monkeypatch, capsys):
    """Under torchrun a command without a distributed implementation says so, instead of every rank
    repeating the whole job and writing the same file."""
    from ropelens.cli import main
    from ropelens.cli.main import build_parser

    monkeypatch.setenv("WORLD_SIZE", "2")
    assert main(["base-predictions", str(gqa_dir), "--lengths", "64"]) == 2
    assert "does not split its work across processes" in capsys.readouterr().err
    for command in (
        "frequency-usage",
        "band-statistics",
        "attention-sinks",
        "attention-by-distance",
        "massive-values",
        "rotary-offsets",
    ):  # these split
        args = build_parser().parse_args([command, str(gqa_dir), "--checkpoint", "ck"])
        assert args.distributed and args.checkpoint == "ck", command
