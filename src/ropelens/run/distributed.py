"""Corpus runs across processes (torch.distributed), with checkpoints to resume a killed run.

Every corpus analysis folds windows into *reducers* whose state is a set of sums (counts, totals,
sums of squares, float64). Sums add, so a corpus splits across ranks with no approximation: each
rank streams a fixed share of the batches (every N-th batch of windows, the very batches one process
would run, so every float32 kernel sees the same inputs) on its own device, and one ``all_reduce``
(float64, SUM) over the flattened state merges them; no tensor is pickled through rank 0. No
collective runs while the windows stream, so a rank that fails (bad input, out of memory) cannot
leave the others hanging: every rank reports its status in one small collective first, and all of
them raise the failing rank's error. A rank killed outright is the launcher's to clean up (torchrun
stops the job).

Launch with ``torchrun --nproc-per-node N -m ropelens frequency-usage ...`` (NCCL on GPUs, gloo on
CPUs), or call the analyses from Python inside an initialised process group.

Checkpoints: with ``checkpoint=DIR`` each rank writes its reducers' state, the run's configuration
and the number of batches done to ``DIR/rank{r}-of-{N}.pt`` every ``every`` batches. The same call
started again resumes after the last batch saved and gives the identical result (the float64 sums
add in the same order). A checkpoint is bound to its run: the model (its name, path, a fingerprint
of its weights and their dtype, :func:`ropelens.loading.models.weights_fingerprint`), the ropelens
version, the windows (a sha256 of the tokens), every analysis setting, the batches, layers and world
size; a run that differs in any of them refuses to resume and names both sides. Each write is atomic
(a temp file beside it, renamed over it), so a run killed mid-write leaves the previous checkpoint
whole and resumes from it; the temp file it leaves is removed when the run starts again. A file
damaged otherwise (truncated, altered) fails its sha256 check with an error naming it, instead of
resuming from wrong sums.
"""

from __future__ import annotations

import contextlib
import contextvars
import hashlib
import io
import itertools
import os
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor
from tqdm.auto import tqdm

from ropelens.errors import InputError
from ropelens.loading.models import weights_fingerprint
from ropelens.results.provenance import versions
from ropelens.results.serialize import atomic_write
from ropelens.run.capture import Reducer, stream
from ropelens.spec.reading import model_label
from ropelens.validate import check_output_path

__all__ = [
    "RankFailedError",
    "RunInfo",
    "init_from_env",
    "is_main",
    "local",
    "model_identity",
    "rank_and_world",
    "reducer_state",
    "run_windows",
    "shard",
]

_TOKENS_KEY = "ropelens/tokens_done"
_MAGIC = b"ropelens-checkpoint-1\n"  # then the payload's sha256 (32 bytes), then the payload
_CALLS = itertools.count()


class RankFailedError(RuntimeError):
    """Another rank of a distributed run failed; its error is in the message."""


@dataclass
class RunInfo:
    """How a corpus run was made: world size, the windows each rank took, tokens seen, timings."""

    n_tokens: int
    world_size: int = 1
    windows_by_rank: list[list[int]] = field(default_factory=list)
    resumed_batches: int = 0
    seconds_stream: float = 0.0
    seconds_reduce: float = 0.0

    def to_config(self) -> dict[str, Any]:
        """What a result's provenance records about the run (only what differs from one process)."""
        out: dict[str, Any] = {}
        if self.world_size > 1:
            out.update(
                world_size=self.world_size,
                windows_by_rank=self.windows_by_rank,
                reduce_seconds=round(self.seconds_reduce, 4),
            )
        if self.resumed_batches:
            out["resumed_batches"] = self.resumed_batches
        return out


_LOCAL = contextvars.ContextVar("ropelens_local_run", default=False)


def rank_and_world() -> tuple[int, int]:
    """(rank, world size) of the running process group, or (0, 1) outside one (or inside
    :func:`local`)."""
    if dist.is_available() and dist.is_initialized() and not _LOCAL.get():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


@contextlib.contextmanager
def local() -> Iterator[None]:
    """Run corpus analyses in this process alone, even inside a process group (work one rank does
    by itself, such as rendering a report's sections on rank 0)."""
    token = _LOCAL.set(True)
    try:
        yield
    finally:
        _LOCAL.reset(token)


def is_main() -> bool:
    """True on rank 0 (and in a plain single-process run): the process that writes outputs."""
    return rank_and_world()[0] == 0


def init_from_env(device: str | None = None) -> str | None:
    """Join the process group torchrun describes in the environment (``WORLD_SIZE`` > 1).

    Returns the device this rank should use (``cuda:LOCAL_RANK`` with NCCL when CUDA is available
    and ``device`` does not say otherwise, else the given device with gloo); None outside torchrun.
    """
    if int(os.environ.get("WORLD_SIZE", "1")) <= 1:
        return None
    if dist.is_initialized():
        return device
    local = int(os.environ.get("LOCAL_RANK", "0"))
    wants_cuda = torch.cuda.is_available() and (device is None or str(device).startswith("cuda"))
    if wants_cuda:
        torch.cuda.set_device(local)
        dist.init_process_group("nccl", device_id=torch.device("cuda", local))
        return f"cuda:{local}"
    dist.init_process_group("gloo")
    return device or "cpu"


def shard(n_items: int, rank: int, world: int) -> list[int]:
    """The items (batches of windows) rank ``rank`` of ``world`` takes: every ``world``-th, from
    ``rank``."""
    if world < 1 or not 0 <= rank < world:
        raise InputError(f"rank {rank} is not in a world of {world} processes")
    return list(range(rank, n_items, world))


def reducer_state(reducer: Reducer) -> dict[str, Tensor]:
    """The tensors that hold a reducer's sums, by name (the tensors themselves, not copies)."""
    if hasattr(reducer, "state_dict"):
        return reducer.state_dict()
    if isinstance(getattr(reducer, "sums", None), dict):
        return reducer.sums
    raise InputError(
        f"{type(reducer).__name__} exposes no state (state_dict() or a sums dict): it cannot be "
        "merged across processes or checkpointed"
    )


def _load_state(reducer: Reducer, state: dict[str, Tensor]) -> None:
    own = reducer_state(reducer)
    if set(own) != set(state):
        raise InputError(
            f"{type(reducer).__name__}: checkpoint state holds {sorted(state)}, the reducer "
            f"{sorted(own)}"
        )
    if hasattr(reducer, "load_state_dict"):
        reducer.load_state_dict(state)
        return
    for k, v in state.items():
        if own[k].shape != v.shape:
            raise InputError(
                f"{type(reducer).__name__}.{k}: checkpoint shape {tuple(v.shape)}, reducer "
                f"{tuple(own[k].shape)}"
            )
        own[k].copy_(v.to(own[k].device, own[k].dtype))


def _agree(error: BaseException | None) -> None:
    """Every rank says whether it succeeded; if any failed, every rank raises that rank's error."""
    rank, world = rank_and_world()
    if world == 1:
        if error is not None:
            raise error
        return
    dev = _collective_device()
    flag = torch.tensor([0 if error is None else 1], device=dev)
    dist.all_reduce(flag)
    if int(flag) == 0:
        return
    messages: list[Any] = [None] * world
    dist.all_gather_object(messages, None if error is None else f"{type(error).__name__}: {error}")
    if error is not None:
        raise error
    r, msg = next((r, m) for r, m in enumerate(messages) if m is not None)
    raise RankFailedError(f"rank {r} of {world} failed, so every rank stops: {msg}")


def _collective_device() -> torch.device:
    return (
        torch.device("cuda", torch.cuda.current_device())
        if dist.get_backend() == "nccl"
        else torch.device("cpu")
    )


def _all_reduce(reducers: Sequence[Reducer]) -> float:
    """Sum every reducer's state over the ranks: one flat float64 all_reduce. Returns its
    seconds."""
    t0 = time.perf_counter()
    dev = _collective_device()
    parts = [(r, k, t) for r in reducers for k, t in sorted(reducer_state(r).items())]
    flat = torch.cat([t.detach().to(dev, torch.float64).reshape(-1) for _, _, t in parts])
    dist.all_reduce(flat)
    off = 0
    for _, _, t in parts:
        n = t.numel()
        t.copy_(flat[off : off + n].view_as(t).to(t.device, t.dtype))
        off += n
    return time.perf_counter() - t0


def _fingerprint(tokens: Tensor) -> str:
    return hashlib.sha256(tokens.detach().cpu().contiguous().numpy().tobytes()).hexdigest()


def _diff(a: dict[str, Any], b: dict[str, Any]) -> str:
    keys = sorted(set(a) | set(b))
    return "; ".join(
        f"{k}: {a.get(k)!r} then, {b.get(k)!r} now" for k in keys if a.get(k) != b.get(k)
    )


def _write_checkpoint(
    path: Path, config: dict[str, Any], done: int, n_tokens: int, reducers: Sequence[Reducer]
) -> None:
    state = [{k: v.detach().cpu().clone() for k, v in reducer_state(r).items()} for r in reducers]
    buf = io.BytesIO()
    torch.save(
        {"config": config, "batches_done": done, "n_tokens": int(n_tokens), "state": state}, buf
    )
    payload = buf.getvalue()
    with atomic_write(path, "wb") as f:
        f.write(_MAGIC + hashlib.sha256(payload).digest() + payload)


def _read_checkpoint(
    path: Path, config: dict[str, Any], reducers: Sequence[Reducer]
) -> tuple[int, float]:
    """Load a checkpoint written by the same run into ``reducers``; returns the batches and tokens
    it covers."""
    raw = path.read_bytes()
    head, digest, payload = (
        raw[: len(_MAGIC)],
        raw[len(_MAGIC) : len(_MAGIC) + 32],
        raw[len(_MAGIC) + 32 :],
    )
    if head != _MAGIC or hashlib.sha256(payload).digest() != digest:
        raise InputError(
            f"checkpoint {path} is damaged or not a ropelens checkpoint ({len(raw)} bytes fail its "
            "sha256 check): delete it to start over"
        )
    try:
        saved = torch.load(io.BytesIO(payload), map_location="cpu", weights_only=True)
    except Exception as e:
        raise InputError(
            f"checkpoint {path} cannot be read ({type(e).__name__}: {e}): delete it to start over"
        ) from e
    if saved.get("config") != config:
        raise InputError(
            f"checkpoint {path} was written by a different run "
            f"({_diff(saved.get('config', {}), config)}): start the same command again to "
            "resume, or use a new --checkpoint directory"
        )
    if len(saved["state"]) != len(reducers):
        raise InputError(
            f"checkpoint {path} holds {len(saved['state'])} reducers, this run has {len(reducers)}"
        )
    for r, st in zip(reducers, saved["state"], strict=True):
        _load_state(r, st)
    return int(saved["batches_done"]), int(saved["n_tokens"])


def model_identity(model) -> dict[str, Any]:
    """What binds a checkpoint to its model: name, path, weights fingerprint and dtype, ropelens
    version."""
    cfg = getattr(model, "cfg", None)
    return {
        "model": model_label(model),
        "model_path": getattr(cfg, "model_path", None),
        **weights_fingerprint(model),
        "ropelens": versions().get("ropelens"),
    }


def _remove_stale(path: Path) -> None:
    """Delete temp files a killed write of ``path`` left (atomic_write's ``.NAME.*.tmp``): only this
    rank writes them."""
    for tmp in path.parent.glob(f".{path.name}.*.tmp"):
        with contextlib.suppress(OSError):
            tmp.unlink()


def run_windows(
    model,
    tokens: Tensor,
    reducers: Sequence[Reducer],
    *,
    batch_size: int,
    layers: Sequence[int] | None = None,
    spec=None,
    progress: bool = True,
    desc: str = "ropelens",
    checkpoint: str | os.PathLike[str] | None = None,
    every: int = 8,
    config: dict[str, Any] | None = None,
    fast: bool = True,
) -> RunInfo:
    """Stream ``tokens`` (``[n_windows, n_ctx]``) into ``reducers``: this rank's share of the
    windows when a process group is running (the reducers then hold the sums over every rank), all
    of them otherwise; resuming from ``checkpoint`` when it holds a saved state of the same run.

    ``config`` is what must not change between a run and its resumption (analysis settings); the
    model's identity (:func:`model_identity`), the windows' fingerprint, batch size, layers and
    world size are added to it.
    """
    if not isinstance(every, int) or every < 1:
        raise InputError(f"every must be a positive number of batches, got {every!r}")
    if checkpoint is not None:  # a file there, or a folder that cannot be written: said at once
        check_output_path(checkpoint, "checkpoint", directory=True)
    rank, world = rank_and_world()
    n = int(tokens.shape[0])
    # shard by batch: a rank runs exactly the batches one process would, so every float32 kernel
    # sees the same inputs and only the float64 sums' order changes
    n_batches = -(-n // batch_size)
    my_batches = shard(n_batches, rank, world)
    mine = [w for j in my_batches for w in range(j * batch_size, min(n, (j + 1) * batch_size))]
    info = RunInfo(n_tokens=0, world_size=world)
    error: BaseException | None = None
    n_tok = 0
    t0 = time.perf_counter()
    try:
        path = None
        if checkpoint is not None:
            run_cfg = {
                **(config or {}),
                **model_identity(model),
                "windows_sha256": _fingerprint(tokens),
                "n_windows": n,
                "batch_size": batch_size,
                "layers": None if layers is None else list(layers),
                "world_size": world,
                "rank": rank,
                "reducers": [type(r).__name__ for r in reducers],
            }
            folder = Path(checkpoint)
            folder.mkdir(parents=True, exist_ok=True)
            path = folder / f"rank{rank}-of-{world}.pt"
            _remove_stale(path)
            if path.exists():
                info.resumed_batches, n_tok = _read_checkpoint(path, run_cfg, reducers)
        all_batches = [tokens[j * batch_size : (j + 1) * batch_size] for j in my_batches]
        bar = tqdm(
            total=n * int(tokens.shape[1]),
            desc=desc,
            unit="tok",
            unit_scale=True,
            disable=not progress or rank != 0,
        )
        store = _store() if world > 1 else None
        key = f"{_TOKENS_KEY}/{next(_CALLS)}"  # every rank makes the same calls in the same order
        for j, b in enumerate(all_batches):
            if j < info.resumed_batches:
                continue
            n_tok += stream(
                model, [b], reducers, layers=layers, spec=spec, progress=False, fast=fast
            )
            if path is not None and ((j + 1) % every == 0 or j + 1 == len(all_batches)):
                _write_checkpoint(path, run_cfg, j + 1, n_tok, reducers)
            _progress(bar, store, key, int(b.numel()), world)
        bar.close()
    except Exception as e:
        error = e
    info.seconds_stream = time.perf_counter() - t0
    _agree(error)
    if world > 1:
        info.seconds_reduce = _all_reduce(reducers)
        tok = torch.tensor(float(n_tok), dtype=torch.float64, device=_collective_device())
        dist.all_reduce(tok)
        n_tok = int(tok.item())
        gathered: list[Any] = [None] * world
        dist.all_gather_object(gathered, mine)
        info.windows_by_rank = gathered
    info.n_tokens = n_tok
    return info


def _store():
    """The process group's key-value store (for a cheap shared progress counter), if reachable."""
    try:
        from torch.distributed import distributed_c10d

        return distributed_c10d._get_default_store()
    except (AttributeError, RuntimeError, ImportError):
        return None


def _progress(bar, store, key: str, n: int, world: int) -> None:
    """Advance rank 0's bar to the tokens every rank has done (each rank adds its own to the
    store)."""
    if store is None:
        bar.update(n * world if world > 1 else n)
        return
    total = store.add(key, n)
    if not bar.disable:
        bar.update(total - bar.n)
