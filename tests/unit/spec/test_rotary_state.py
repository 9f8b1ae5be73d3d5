"""Reading and running a model leaves it as it was, and gives what a fresh model gives.

HF's dynamic NTK replaces its frequencies and cached length when an input grows past the native
context, and LongRoPE copies its short or long factors into ``inv_freq``: ropelens runs these
modules (the reading at a length, captures, analyses), and afterwards every parameter, buffer and
rotary attribute is bit for bit what it was, whatever ran before. The q entering the score is
checked against HF's own rotary module and ``apply_rotary_pos_emb`` on a fresh model's hooked
``q_proj`` output, below and above the native context.
"""

from __future__ import annotations

import pytest
import torch
from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

from ropelens import capture_qk, rope_spec
from ropelens.analyses.band_statistics import band_statistics
from ropelens.testing import tiny_model

NATIVE = 16
HEAD = 16  # the tiny Llama's head width

ROPES = {
    "dynamic": {"rope_type": "dynamic", "factor": 2.0, "rope_theta": 10000.0},
    "yarn": {
        "rope_type": "yarn",
        "factor": 4.0,
        "rope_theta": 10000.0,
        "original_max_position_embeddings": NATIVE,
    },
    "llama3": {
        "rope_type": "llama3",
        "factor": 8.0,
        "rope_theta": 10000.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": NATIVE,
    },
    "longrope": {
        "rope_type": "longrope",
        "factor": 4.0,
        "rope_theta": 10000.0,
        "original_max_position_embeddings": NATIVE,
        "short_factor": [1.0, 1.0, 1.1, 1.2, 1.3, 1.4, 1.5, 1.6],
        "long_factor": [1.0, 1.5, 2.0, 3.0, 4.0, 5.0, 6.0, 8.0],
    },
}


def _model(rope: str):
    native = NATIVE if rope == "dynamic" else 4 * NATIVE
    return tiny_model("llama", max_position_embeddings=native, rope_parameters=ROPES[rope])


def _tokens(n: int) -> torch.Tensor:
    return torch.randint(5, 90, (2, n), generator=torch.Generator().manual_seed(n))


def _rotaries(model) -> list[torch.nn.Module]:
    return [
        m
        for m in model.original_model.modules()
        if "rotary" in type(m).__name__.lower() and "bridge" not in type(m).__name__.lower()
    ]


def _snapshot(model) -> dict[str, object]:
    hf = model.original_model
    state: dict[str, object] = {
        f"tensor {name}": t.detach().clone()
        for name, t in [*hf.named_parameters(), *hf.named_buffers()]
    }
    for i, rotary in enumerate(_rotaries(model)):
        for name, value in vars(rotary).items():
            if not name.startswith("_"):
                state[f"rotary {i} {name}"] = (
                    value.detach().clone() if isinstance(value, torch.Tensor) else value
                )
        state[f"rotary {i} buffers"] = sorted(rotary._buffers)
    return state


def _differences(before: dict[str, object], after: dict[str, object]) -> list[str]:
    out = [f"{k} added" for k in after.keys() - before.keys()]
    out += [f"{k} removed" for k in before.keys() - after.keys()]
    for k in before.keys() & after.keys():
        a, b = before[k], after[k]
        if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
            same = (
                isinstance(a, torch.Tensor)
                and isinstance(b, torch.Tensor)
                and a.dtype == b.dtype
                and torch.equal(a, b)
            )
        else:
            same = a is b or a == b
        if not same:
            out.append(f"{k}: {a!r} -> {b!r}")
    return out


def _q_post(model, tokens: torch.Tensor) -> torch.Tensor:
    return capture_qk(model, tokens, layers=[1], which=("q_post",))[1]["q_post"]


def _oracle_q_post(rope: str, tokens: torch.Tensor) -> torch.Tensor:
    """Layer 1's rotated q from HF alone, on a fresh model: the q_proj output its forward hook
    sees, rotated by the tables HF's rotary module gives these positions."""
    hf = _model(rope).original_model
    seen: dict[str, torch.Tensor] = {}
    hook = hf.model.layers[1].self_attn.q_proj.register_forward_hook(
        lambda _m, _i, out: seen.__setitem__("q", out.detach())
    )
    with torch.no_grad():
        hf(tokens)
    hook.remove()
    batch, n, _ = seen["q"].shape
    q = seen["q"].view(batch, n, -1, HEAD).transpose(1, 2)
    fresh = _model(rope).original_model  # the tables a fresh model gives an input of n tokens
    with torch.no_grad():
        cos, sin = fresh.model.rotary_emb(q, torch.arange(n)[None].expand(batch, n))
    rotated, _ = apply_rotary_pos_emb(q, q, cos, sin)
    return rotated.transpose(1, 2)  # [batch, pos, head, d], as capture_qk keeps it


def _relative(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).norm() / b.norm())


@pytest.mark.parametrize("rope", sorted(ROPES))
def test_readings_captures_and_analyses_leave_the_model_bit_identical(rope):
    model = _model(rope)
    n = 48  # past the native context of every model here but llama3's and yarn's 64
    before = _snapshot(model)
    rope_spec(model, length=n)
    rope_spec(model, length=n)
    capture_qk(model, _tokens(n))
    band_statistics(model, _tokens(n), n_ctx=n, progress=False)
    assert _differences(before, _snapshot(model)) == []


@pytest.mark.parametrize("rope", sorted(ROPES))
@pytest.mark.parametrize("n", [12, 48, 80])
def test_q_post_is_hfs_rotation_whatever_ran_before(rope, n):
    tokens = _tokens(n)
    oracle = _oracle_q_post(rope, tokens)
    fresh = _q_post(_model(rope), tokens)
    assert _relative(fresh, oracle) < 1e-5

    model = _model(rope)
    rope_spec(model, length=n)
    rope_spec(model, length=n)
    band_statistics(model, _tokens(n), n_ctx=n, progress=False)
    rope_spec(model, length=2 * n)
    rope_spec(model)
    assert torch.equal(_q_post(model, tokens), fresh)


def test_a_long_input_the_model_ran_before_is_neither_read_nor_undone():
    """HF's dynamic NTK keeps the longest input's frequencies until a short one resets them:
    ropelens measures as a fresh model runs, and hands the model back holding what it held."""
    model = _model("dynamic")
    with torch.no_grad():
        model.original_model(_tokens(200)[:1])  # the model's own forward grows its frequencies
    grown = _snapshot(model)
    tokens = _tokens(48)
    assert _relative(_q_post(model, tokens), _oracle_q_post("dynamic", tokens)) < 1e-5
    assert (
        rope_spec(model, length=48).to_json() == rope_spec(_model("dynamic"), length=48).to_json()
    )
    assert _differences(grown, _snapshot(model)) == []
