"""Checkpoints bound to their model and run, safe against a crash mid-write or a damaged file, and
under torchrun.

The reference is the same analysis uninterrupted: a resumed run adds the same float64 sums in the
same order (identical in one process); split over gloo ranks, each rank's float64 partial sums are
added once more, so they agree to float64 rounding (1e-9 relative leaves ample room).
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest
import torch

import ropelens
from ropelens.analyses.frequency_usage import FrequencyUsage
from ropelens.errors import InputError
from ropelens.loading.models import weights_fingerprint
from ropelens.run import capture
from ropelens.testing import tiny_model_dir

N_CTX, N_WINDOWS = 16, 6
KW = dict(n_ctx=N_CTX, batch_size=1, progress=False, checkpoint_every=2)


def _tokens() -> torch.Tensor:
    toks = torch.randint(4, 100, (N_WINDOWS, N_CTX), generator=torch.Generator().manual_seed(7))
    toks[:, 0] = 1
    return toks


def _killed_after(monkeypatch, n: int) -> None:
    """Make the run die (KeyboardInterrupt) in its (n+1)-th batch, as a run killed there."""
    import ropelens.run.distributed as D

    real, calls = capture.stream, {"n": 0}

    def dies(*a, **k):
        calls["n"] += 1
        if calls["n"] > n:
            raise KeyboardInterrupt("killed")
        return real(*a, **k)

    monkeypatch.setattr(D, "stream", dies)


def _same(a: FrequencyUsage, b: FrequencyUsage, tol: float = 0.0) -> None:
    for key in b.token:
        for f in ("count", "total", "total_sq"):
            x, y = getattr(a.token[key], f), getattr(b.token[key], f)
            if tol:
                assert float((x - y).abs().max() / y.abs().max().clamp_min(1e-300)) <= tol, (key, f)
            else:
                assert torch.equal(x, y), (key, f)


def test_a_checkpoint_refuses_another_models_weights(tmp_path, monkeypatch):
    """usage killed on the seed-0 tiny Llama; the seed-1 model saved to the same path (same name,
    same path) must not resume it: the weights fingerprint differs, and the message names both."""
    path = tiny_model_dir("llama", tmp_path / "model", seed=0)
    m0 = ropelens.load_model(path, device="cpu")
    ck = tmp_path / "ck"
    _killed_after(monkeypatch, 3)
    with pytest.raises(KeyboardInterrupt):
        ropelens.analyses.frequency_usage(m0, _tokens(), checkpoint=ck, **KW)
    monkeypatch.undo()
    tiny_model_dir("llama", path, seed=1)
    m1 = ropelens.load_model(path, device="cpu")
    fp0, fp1 = weights_fingerprint(m0)["weights_sha256"], weights_fingerprint(m1)["weights_sha256"]
    assert fp0 != fp1
    with pytest.raises(InputError, match="different run") as e:
        ropelens.analyses.frequency_usage(m1, _tokens(), checkpoint=ck, **KW)
    assert f"weights_sha256: {fp0!r} then, {fp1!r} now" in str(e.value)
    # the same weights in another dtype are another run too
    m64 = ropelens.load_model(path, device="cpu", dtype="float64")
    with pytest.raises(InputError, match="dtype: 'float32' then, 'float64' now"):
        ropelens.analyses.frequency_usage(m64, _tokens(), checkpoint=ck, **KW)
    # and the seed-0 model resumes it, to the uninterrupted sums
    tiny_model_dir("llama", path, seed=0)
    m0 = ropelens.load_model(path, device="cpu")
    resumed = ropelens.analyses.frequency_usage(m0, _tokens(), checkpoint=ck, **KW)
    assert resumed.provenance.config["resumed_batches"] == 2
    _same(resumed, ropelens.analyses.frequency_usage(m0, _tokens(), **KW))


def test_the_fingerprint_sees_one_sampled_weight_and_every_shape(tiny):
    """One sampled entry of one q projection changed, or a model of another shape, changes the
    fingerprint."""
    model = tiny("llama")
    before = weights_fingerprint(model)
    w = model.original_model.model.layers[1].self_attn.q_proj.weight
    with torch.no_grad():
        old = w.view(-1)[0].item()
        w.view(-1)[0] += 1e-3
        try:
            assert weights_fingerprint(model)["weights_sha256"] != before["weights_sha256"]
        finally:
            w.view(-1)[0] = old
    assert weights_fingerprint(model) == before
    assert weights_fingerprint(tiny("llama-gqa"))["weights_sha256"] != before["weights_sha256"]


def test_a_checkpoint_that_names_a_file_is_refused_naming_it(tiny, tmp_path):
    """checkpoint= is a folder: an existing file there is named before any window runs, and left
    as it was."""
    model = tiny("llama")
    file = tmp_path / "progress.pt"
    file.write_bytes(b"mine")
    with pytest.raises(InputError, match=rf"checkpoint {file} is a file: pass a directory"):
        ropelens.analyses.frequency_usage(model, _tokens(), checkpoint=file, **KW)
    assert file.read_bytes() == b"mine"


@pytest.mark.parametrize("damage", ["truncated", "one byte changed"])
def test_a_damaged_checkpoint_is_refused_by_name(tiny, tmp_path, damage):
    """A checkpoint cut short or altered fails its sha256 check: an error naming the file and the
    fix."""
    model = tiny("llama")
    ropelens.analyses.frequency_usage(model, _tokens(), checkpoint=tmp_path, **KW)
    f = tmp_path / "rank0-of-1.pt"
    raw = bytearray(f.read_bytes())
    if damage == "truncated":
        raw = raw[: len(raw) // 2]
    else:
        raw[len(raw) // 2] ^= 0x01
    f.write_bytes(bytes(raw))
    with pytest.raises(
        InputError, match=r"checkpoint .*rank0-of-1\.pt is damaged .*delete it to start over"
    ):
        ropelens.analyses.frequency_usage(model, _tokens(), checkpoint=tmp_path, **KW)


def test_a_crash_between_write_and_rename_resumes_from_the_last_good_state(tmp_path):
    """A process killed (os._exit) in its second checkpoint write, after the temp file is written
    and before the rename, leaves the first checkpoint whole: the run started again resumes from it,
    ends with the uninterrupted sums, and leaves no temp file behind."""
    path = tiny_model_dir("llama", tmp_path / "model")
    ck = tmp_path / "ck"
    script = tmp_path / "crash.py"
    script.write_text(
        textwrap.dedent(f"""
        import os, torch, ropelens
        import ropelens.results.serialize as S
        writes = {{"n": 0}}
        real = os.replace

        def replace(src, dst):
            writes["n"] += 1
            if writes["n"] == 2:
                os._exit(9)  # killed: the temp file is written, the rename never happens
            real(src, dst)

        S.os.replace = replace
        seeded = torch.Generator().manual_seed(7)
        toks = torch.randint(4, 100, ({N_WINDOWS}, {N_CTX}), generator=seeded)
        toks[:, 0] = 1
        model = ropelens.load_model({str(path)!r}, device="cpu")
        ropelens.analyses.frequency_usage(model, toks, checkpoint={str(ck)!r}, **{KW!r})
    """)
    )
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    r = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=240, env=env
    )
    assert r.returncode == 9, r.stderr[-3000:]
    left = sorted(p.name for p in ck.iterdir())
    assert "rank0-of-1.pt" in left and any(n.endswith(".tmp") for n in left), (
        left
    )  # what a crash leaves
    model = ropelens.load_model(path, device="cpu")
    resumed = ropelens.analyses.frequency_usage(model, _tokens(), checkpoint=ck, **KW)
    assert (
        resumed.provenance.config["resumed_batches"] == 2
    )  # the first checkpoint, not the lost second
    _same(resumed, ropelens.analyses.frequency_usage(model, _tokens(), **KW))
    assert sorted(p.name for p in ck.iterdir()) == ["rank0-of-1.pt"]


def test_no_temp_files_after_a_run_or_an_interrupted_one(tiny, tmp_path, monkeypatch):
    model = tiny("llama")
    _killed_after(monkeypatch, 3)
    with pytest.raises(KeyboardInterrupt):
        ropelens.analyses.frequency_usage(model, _tokens(), checkpoint=tmp_path, **KW)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["rank0-of-1.pt"]
    monkeypatch.undo()
    ropelens.analyses.frequency_usage(model, _tokens(), checkpoint=tmp_path, **KW)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["rank0-of-1.pt"]


def test_checkpoint_under_torchrun_resumes_to_the_uninterrupted_result(tmp_path):
    """2 gloo ranks, both killed (os._exit) in their third batch; launched again, both resume from
    their checkpoints (one file per rank, no temp files) and the result equals one uninterrupted
    process's."""
    path = tiny_model_dir("llama-gqa", tmp_path / "model")
    ck, out = tmp_path / "ck", tmp_path / "usage.json"
    script = tmp_path / "run.py"
    script.write_text(
        textwrap.dedent(f"""
        import os, sys, torch, torch.distributed as dist, ropelens
        import ropelens.run.distributed as D
        from ropelens.run.distributed import init_from_env, is_main
        init_from_env("cpu")
        if sys.argv[1] == "kill":
            real, calls = D.stream, {{"n": 0}}

            def dies(*a, **k):
                calls["n"] += 1
                if calls["n"] > 2:  # both ranks have saved two batches: killed together
                    dist.barrier()
                    os._exit(3)
                return real(*a, **k)

            D.stream = dies
        seeded = torch.Generator().manual_seed(7)
        toks = torch.randint(4, 100, ({N_WINDOWS}, {N_CTX}), generator=seeded)
        toks[:, 0] = 1
        model = ropelens.load_model({str(path)!r}, device="cpu")
        u = ropelens.analyses.frequency_usage(model, toks, checkpoint={str(ck)!r}, **{KW!r})
        if is_main():
            u.save({str(out)!r})
        dist.destroy_process_group()
    """)
    )
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "MASTER_ADDR": "127.0.0.1"}
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node=2",
        str(script),
    ]
    r = subprocess.run([*cmd, "kill"], capture_output=True, text=True, timeout=240, env=env)
    assert r.returncode != 0 and not out.exists()
    assert sorted(p.name for p in ck.iterdir()) == ["rank0-of-2.pt", "rank1-of-2.pt"]
    r = subprocess.run([*cmd, "resume"], capture_output=True, text=True, timeout=240, env=env)
    assert r.returncode == 0, r.stderr[-3000:]
    resumed = FrequencyUsage.load(out)
    assert (
        resumed.provenance.config["resumed_batches"] == 2
        and resumed.provenance.config["world_size"] == 2
    )
    one = ropelens.analyses.frequency_usage(
        ropelens.load_model(path, device="cpu"), _tokens(), **KW
    )
    _same(resumed, one, tol=1e-9)
    assert resumed.provenance.n_tokens == one.provenance.n_tokens
    assert sorted(p.name for p in ck.iterdir()) == ["rank0-of-2.pt", "rank1-of-2.pt"]
