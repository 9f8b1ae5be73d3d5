"""Results made of sums: the divisor that turns a summed quantity into its mean."""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["count_or_nan"]


def count_or_nan(count: Tensor) -> Tensor:
    """``count`` where it is positive and NaN where nothing was counted (as floats), so that
    ``total / count_or_nan(count)`` is the mean where there was something to average and NaN
    where there was not (never a division by zero)."""
    counted = count if count.is_floating_point() else count.to(torch.float64)
    return torch.where(counted > 0, counted, torch.nan)
