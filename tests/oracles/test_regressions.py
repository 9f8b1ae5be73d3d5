"""Defects the differential harness found, each pinned by the smallest case that showed it."""

from __future__ import annotations

import math

import pytest
import torch

import ropelens
from ropelens.analyses import rotary_offsets
from ropelens.testing import tiny_model

pytestmark = pytest.mark.filterwarnings("ignore")


def test_outlier_ratio_is_undefined_where_the_other_planes_are_zero():
    """A plane's outlier ratio over the median of the head's other planes: where an ablation has
    zeroed most of them that median is 0 and the ratio is NaN, never a number of order 1e30 (nor 0
    for a zeroed plane)."""
    model = tiny_model("llama")
    tokens = torch.randint(4, 100, (2, 16), generator=torch.Generator().manual_seed(0))
    tokens[:, 0] = 1
    with ropelens.ablate_planes(model, list(range(7)), layers=[0], heads=[0]):
        offsets = rotary_offsets(model, tokens, layers=[0], progress=False)
    ratio = offsets.outlier_ratio("q")[0]  # [head, plane]
    norm = offsets.norm("q")[0]
    assert float(norm[0, :7].abs().max()) == 0 and float(norm[0, 7]) > 0
    assert bool(ratio[0].isnan().all()), ratio[0].tolist()
    # the other heads keep every plane: their ratio is each plane's norm over its others' median
    others = torch.cat([norm[1, 1:]]).sort().values[(8 - 2) // 2]
    assert math.isclose(float(ratio[1, 0]), float(norm[1, 0] / others), rel_tol=1e-5)
