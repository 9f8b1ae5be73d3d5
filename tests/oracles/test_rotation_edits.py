"""The reference's edit at the rotation's output (``recorded_attention(..., edit_at="rotation")``).

The matrix's ``norm_after_rope`` says which families pass q and k through a per-head norm between
HF's rotation and the score; there an ablation's reference zeroes the planes at the rotation's
output. These tests check that flag against HF's own forward in every family of the matrix, and
the edit itself on the three families it serves: the layer a rotation call belongs to, the layout
the edits see (Llama 4 rotates ``[batch, pos, head, dim]``), and what the norm then does to the
planes left.
"""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM

from tests.oracles import reference as R
from tests.oracles.test_differential import MATRIX

pytestmark = pytest.mark.filterwarnings("ignore")

NORMED = sorted(f for f, case in MATRIX.items() if case.norm_after_rope)


def _eager(family_dir, family: str):
    path = family_dir(family)
    return AutoModelForCausalLM.from_pretrained(path, attn_implementation="eager").eval()


def _tokens() -> torch.Tensor:
    tokens = torch.randint(4, 100, (2, 12), generator=torch.Generator().manual_seed(0))
    tokens[:, 0] = 1
    return tokens


def _rotation_outputs(hf, tokens):
    """Each layer's attention call and what HF's rotation returned there ``(query, key)``, both
    ``[batch, head, pos, dim]``, read by edits that change nothing."""
    returned: dict[int, list[torch.Tensor]] = {}

    def keep_query(layer, query):
        returned.setdefault(layer, [None, None])[0] = query.detach().float().clone()
        return query

    def keep_key(layer, key):
        returned.setdefault(layer, [None, None])[1] = key.detach().float().clone()
        return key

    edits = {"edit_query": keep_query, "edit_key": keep_key, "edit_at": "rotation"}
    with R.recorded_attention(hf, **edits) as calls, torch.no_grad():
        hf(input_ids=tokens)
    return calls, returned


def test_the_families_flagged_are_those_whose_q_and_k_change_after_the_rotation(family_dir):
    """In every family of the matrix, the score's q and k are the rotation's output exactly,
    except in the families flagged ``norm_after_rope``, where a norm lies between (in every layer
    with a rotation)."""
    tokens = _tokens()
    changed_after = {}
    for family, case in sorted(MATRIX.items()):
        hf = _eager(family_dir, family)
        calls, returned = _rotation_outputs(hf, tokens)
        assert returned, f"{family}: the reference saw no rotation to edit"
        layout = case.layout()
        differences = []
        for layer, (query, key) in sorted(returned.items()):
            for rotated, scored in ((query, calls[layer].query), (key, calls[layer].key)):
                if rotated.shape[-1] != scored.shape[-1]:  # MLA: the rotary dims alone
                    scored = scored[..., layout.offset : layout.offset + layout.n_rotary]
                scale = float(rotated.abs().max())
                # MLA's one rotary key broadcasts over the heads it is copied to
                differences.append(float((scored - rotated).abs().max()) / scale)
        if case.norm_after_rope:
            assert min(differences) > 0.1, f"{family}: {differences}"
        else:
            assert max(differences) == 0.0, f"{family}: {differences}"
        changed_after[family] = case.norm_after_rope
    assert sorted(f for f, changed in changed_after.items() if changed) == [
        "hunyuan_v1_dense",
        "llama4",
        "nanochat",
    ]


@pytest.mark.parametrize("family", NORMED)
def test_an_edit_at_the_rotation_zeroes_before_the_norm(family_dir, family):
    """Two planes zeroed at the rotation's output in query heads 0 and 2 and in KV head 0 of one
    layer: the layers before it attend as without the edit; in it, the score's q and k hold zeros
    there, and each edited head's other dims are the unedited ones rescaled by the ratio of the
    rotation output's RMS before and after the zeroing (the norm's gain, if any, cancels); the
    other heads are untouched. Zeroed at the score instead, the layer's attention differs."""
    hf = _eager(family_dir, family)
    tokens = _tokens()
    unedited, returned = _rotation_outputs(hf, tokens)
    layers = sorted(returned)
    layer = layers[len(layers) // 2]
    pairs = MATRIX[family].layout().plane_dims()
    dims = [d for plane in (0, len(pairs) - 1) for d in pairs[plane]]
    heads, kv_heads = [0, 2], [0]

    def zero(chosen):
        def edit(at, x):
            if at != layer:
                return x
            x = x.clone()
            for head in chosen:
                x[:, head, :, dims] = 0
            return x

        return edit

    edits = {"edit_query": zero(heads), "edit_key": zero(kv_heads)}
    with R.recorded_attention(hf, **edits, edit_at="rotation") as edited, torch.no_grad():
        hf(input_ids=tokens)
    with R.recorded_attention(hf, **edits, edit_at="score") as at_score, torch.no_grad():
        hf(input_ids=tokens)

    for before in [earlier for earlier in unedited if earlier < layer]:
        assert torch.equal(edited[before].probs, unedited[before].probs), f"layer {before}"
    eps = hf.config.get_text_config().rms_norm_eps
    others = [d for d in range(unedited[layer].query.shape[-1]) if d not in dims]
    for name, chosen, index in (("query", heads, 0), ("key", kv_heads, 1)):
        got = getattr(edited[layer], name)
        want = getattr(unedited[layer], name).double()
        rotated = returned[layer][index][:, chosen].double()
        kept = rotated.clone()
        kept[..., dims] = 0
        rescale = ((rotated.pow(2).mean(-1) + eps) / (kept.pow(2).mean(-1) + eps)).sqrt()
        want[:, chosen] = want[:, chosen] * rescale[..., None]
        assert float(got[:, chosen][..., dims].abs().max()) == 0.0, name
        scale = float(want.abs().max())
        err = float((got[..., others].double() - want[..., others]).abs().max()) / scale
        assert err < 1e-5, f"{name}: relative error {err:.3g}"
        untouched = [h for h in range(got.shape[1]) if h not in chosen]
        assert torch.equal(got[:, untouched], getattr(unedited[layer], name)[:, untouched]), name
    moved = float((at_score[layer].probs - edited[layer].probs).abs().max())
    assert moved > 1e-3, f"zeroing at the score or at the rotation moves layer {layer} by {moved}"


def test_an_unknown_edit_point_is_refused(family_dir):
    hf = _eager(family_dir, "nanochat")
    with (
        pytest.raises(ValueError, match=r"edit_at='norm': choose one of score, rotation"),
        R.recorded_attention(hf, edit_at="norm"),
    ):
        pass
