"""Means from sums: NaN where nothing was counted, never a division by zero."""

from __future__ import annotations

import torch

from ropelens.results.sums import count_or_nan


def test_count_or_nan_gives_means_where_counted_and_nan_elsewhere():
    total = torch.tensor([6.0, 0.0, 5.0], dtype=torch.float64)
    count = torch.tensor([3, 0, 2])
    mean = total / count_or_nan(count)
    assert mean.dtype == torch.float64
    assert mean[0] == 2.0 and mean[2] == 2.5 and mean[1].isnan()
    floats = torch.tensor([2.0, 0.0], dtype=torch.float32)
    assert count_or_nan(floats).dtype == torch.float32
    assert count_or_nan(floats)[1].isnan() and count_or_nan(floats)[0] == 2.0
