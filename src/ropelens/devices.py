"""Where a model runs: the one place that answers it, below every module that loads, reads or captures a model."""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["device_of"]


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
