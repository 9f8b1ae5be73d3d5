"""SmolLM2 across two processes, and a corpus run killed with SIGKILL and started again."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import torch

import ropelens
from ropelens.analyses.band_statistics import BandStatistics
from ropelens.analyses.frequency_usage import FrequencyUsage

ENV = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).abs().max() / b.abs().max().clamp_min(1e-300))


def test_smollm2_two_ranks_equal_one_process(smollm2, tmp_path):
    args = ["--n-ctx", "64", "--tokens", str(64 * 5), "--layers", "0,14,29", "--device", "cpu"]
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node=2",
        "-m",
        "ropelens",
    ]
    r = subprocess.run(
        [
            *cmd,
            "band-statistics",
            "smollm2-135m",
            *args,
            "--batch-size",
            "2",
            "--save",
            str(tmp_path / "s.json"),
        ],
        capture_output=True,
        text=True,
        timeout=600,
        env=ENV,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    r = subprocess.run(
        [*cmd, "frequency-usage", "smollm2-135m", *args, "--save", str(tmp_path / "u.json")],
        capture_output=True,
        text=True,
        timeout=600,
        env=ENV,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    one = ropelens.analyses.band_statistics(
        smollm2,
        "english",
        n_ctx=64,
        max_tokens=64 * 5,
        layers=[0, 14, 29],
        batch_size=2,
        progress=False,
    )
    two = BandStatistics.load(tmp_path / "s.json")
    assert two.provenance.config["world_size"] == 2
    # each rank batches its own windows, and a float32 forward of a window rounds differently in
    # another batch (5.4e-8 relative measured under torch 2.13 / transformers 5.24); the merge
    # itself adds float64 sums exactly
    for k, v in one.sums.items():
        assert _rel(two.sums[k], v) <= 1e-6, k
    u1 = ropelens.analyses.frequency_usage(
        smollm2, "english", n_ctx=64, max_tokens=64 * 5, layers=[0, 14, 29], progress=False
    )
    u2 = FrequencyUsage.load(tmp_path / "u.json")
    for key, m in u1.token.items():
        assert _rel(u2.token[key].total, m.total) <= 1e-6, key


def test_smollm2_killed_run_resumes_to_the_identical_result(smollm2, tmp_path):
    """SIGKILL after the first checkpoint; the same command again finishes with exactly the sums of
    an uninterrupted run; other arguments against the same checkpoint are refused."""
    ck, out = tmp_path / "ck", tmp_path / "stats.json"
    args = [
        "band-statistics",
        "smollm2-135m",
        "--n-ctx",
        "128",
        "--tokens",
        str(128 * 8),
        "--batch-size",
        "1",
        "--layers",
        "0,29",
        "--device",
        "cpu",
        "--checkpoint",
        str(ck),
        "--checkpoint-every",
        "2",
        "--save",
        str(out),
    ]
    cmd = [sys.executable, "-m", "ropelens", *args]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=ENV)
    deadline = time.time() + 300
    while not (ck / "rank0-of-1.pt").exists() and time.time() < deadline and proc.poll() is None:
        time.sleep(0.2)
    assert proc.poll() is None, "the run ended before it could be killed: lengthen it"
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert not out.exists()
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=ENV)
    assert r.returncode == 0, r.stderr[-3000:]
    resumed = BandStatistics.load(out)
    assert resumed.provenance.config.get("resumed_batches", 0) >= 2
    # the uninterrupted run is the same command, so its float32 kernels run as the resumed one's did
    # (this process runs 2 threads and the command 1, and they round apart by ~1e-7 relative:
    # measured 9.6e-8)
    whole_out = tmp_path / "whole.json"
    uninterrupted = args[
        : args.index("--checkpoint")
    ]  # the same command, without checkpoints and --save
    r = subprocess.run(
        [sys.executable, "-m", "ropelens", *uninterrupted, "--save", str(whole_out)],
        capture_output=True,
        text=True,
        timeout=600,
        env=ENV,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    whole = BandStatistics.load(whole_out)
    for k, v in whole.sums.items():
        assert _rel(resumed.sums[k], v) <= 1e-9, k
    bad = subprocess.run(
        [*cmd[:-2], "--bands", "quantiles:2", "--save", str(out)],
        capture_output=True,
        text=True,
        timeout=600,
        env=ENV,
    )
    assert bad.returncode == 2 and "different run" in bad.stderr
