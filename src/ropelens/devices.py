"""Where a model runs: the one place that answers it, below every module that loads, reads or
captures a model."""

from __future__ import annotations

from typing import Any

import torch

from ropelens.errors import InputError

__all__ = ["available_memory", "device_of", "forward_bytes", "require_memory"]


def device_of(model: Any) -> torch.device:
    """The device a model's inputs go to: where its first weight that holds data lives.

    A model split by a device map (accelerate) may leave offloaded weights on the meta device and
    bring them in at run time, so meta parameters are skipped; a model with no parameters runs on
    the CPU.
    """
    meta = False
    for p in getattr(model, "parameters", lambda: ())():
        if p.device.type != "meta":
            return p.device
        meta = True
    return torch.device("meta" if meta else "cpu")


def available_memory(device: torch.device | str | None = None) -> int | None:
    """Bytes free for new tensors on ``device`` (the CPU: the host's available memory); None where
    unknown."""
    device = torch.device(device or "cpu")
    if device.type == "cuda":
        try:
            return int(torch.cuda.mem_get_info(device)[0])
        except (RuntimeError, AssertionError):
            return None
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        import os

        return int(os.sysconf("SC_AVPHYS_PAGES")) * int(os.sysconf("SC_PAGE_SIZE"))
    except (ValueError, OSError, AttributeError):
        return None


def _size(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB", "TB", "PB"):
        if n < 1024 or unit == "PB":
            return f"{n:.3g} {unit}"
        n /= 1024
    return f"{n:.3g} PB"


def require_memory(
    nbytes: float, what: str, fix: str, device: torch.device | str | None = None
) -> None:
    """Raise one InputError before allocating when ``what`` needs about ``nbytes`` and ``device``
    has not that much free (a computation that would take the whole machine): the message names the
    need, the room and ``fix``."""
    room = available_memory(device)
    if room is not None and nbytes > 0.8 * room:
        where = "this machine" if torch.device(device or "cpu").type == "cpu" else str(device)
        raise InputError(
            f"{what} needs about {_size(nbytes)} and {where} has {_size(room)} free: {fix}"
        )


def forward_bytes(model: Any, n_tokens: int) -> float:
    """A lower bound on the memory one forward over ``n_tokens`` tokens holds: each layer's keys and
    values (the cache a long prompt keeps) and a few hidden and MLP activations, in the model's
    dtype."""
    hf = (
        getattr(model, "original_model", None) or model
    )  # a bridge's or a plain model's HF model, or an HF model
    cfg = getattr(hf, "config", None)
    cfg = cfg.get_text_config() if hasattr(cfg, "get_text_config") else cfg
    hidden = int(getattr(cfg, "hidden_size", 0) or 0)
    layers = int(getattr(cfg, "num_hidden_layers", 0) or 0)
    heads = int(getattr(cfg, "num_attention_heads", 0) or 1)
    kv = int(getattr(cfg, "num_key_value_heads", 0) or heads)
    head_dim = int(getattr(cfg, "head_dim", 0) or (hidden // heads if heads else 0))
    mlp = int(getattr(cfg, "intermediate_size", 0) or 4 * hidden)
    try:
        width = next(iter(hf.parameters())).element_size()
    except (StopIteration, AttributeError, TypeError):
        width = 4
    return float(n_tokens) * (2 * layers * kv * head_dim + 4 * hidden + mlp) * width
