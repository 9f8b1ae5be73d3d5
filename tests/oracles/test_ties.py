"""Top-1 agreement of a band whose logits tie: an ablated band agrees by chance, not always."""

from __future__ import annotations

import pytest
import torch

import ropelens
from ropelens.analyses import attention_decomposition, band_statistics

pytestmark = pytest.mark.filterwarnings("ignore")


def test_an_ablated_band_agrees_by_chance(family_dir):
    model = ropelens.load_model(family_dir("llama"), device="cpu")
    tokens = torch.randint(4, 100, (2, 24), generator=torch.Generator().manual_seed(0))
    tokens[:, 0] = 1
    bands = ropelens.Bands.explicit({"high": [0, 1], "low": list(range(2, 8))})
    with ropelens.ablate_planes(model, [0, 1]):
        stats = band_statistics(model, tokens, bands=bands, progress=False)
        dec = attention_decomposition(model, tokens, bands=bands)
    # every key ties at 0 in the ablated band: query m (m + 1 keys) agrees with share 1/(m + 1)
    chance = (1 / torch.arange(1, 25, dtype=torch.float64)).mean()
    high = stats.top1()[:, :, 0].double()
    torch.testing.assert_close(high, torch.full_like(high, float(chance)), rtol=0, atol=1e-6)
    for layer in dec.layers:
        frame = dec.agreement(layer)
        got = torch.tensor(frame[frame.band == "high"].top1.to_numpy())
        torch.testing.assert_close(got, torch.full_like(got, float(chance)), rtol=0, atol=1e-6)
    # the band that still holds the planes agrees far more often than chance
    assert bool((stats.top1()[:, :, 1] > 2 * chance).all())
