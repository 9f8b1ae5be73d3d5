"""models.py on tiny random models: the spec matches the config and what the running model does."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest
import torch

import ropelens
from ropelens import NotRotaryError, load_model, rope_spec
from ropelens.errors import InputError
from ropelens.loading.models import device_of, resolve_device
from ropelens.testing import tiny_hf_model, tiny_model, tiny_model_dir

# family -> (bases by kind, n_planes, pairing, heads, kv_heads, head_dim)
EXPECTED = {
    "llama": ({"full": 1e4}, 8, "half", 4, 4, 16),
    "llama-gqa": ({"full": 1e4}, 8, "half", 4, 2, 16),
    "gemma3": ({"sliding": 1e4, "full": 1e6}, 8, "half", 4, 2, 16),
    "gptj": ({"full": 1e4}, 4, "adjacent", 4, 4, 16),
}
TEXT = "The cat sat on the mat, and then it sat on the hat."


def test_spec_matches_config(tiny, rope_family):
    bases, n_planes, pairing, heads, kv_heads, head_dim = EXPECTED[rope_family]
    spec = rope_spec(tiny(rope_family))
    cfg = tiny(rope_family).original_model.config
    assert spec.n_layers == cfg.num_hidden_layers
    assert spec.n_ctx == 256
    for lr in spec.layers:
        assert lr.base == bases[lr.kind]
        assert (lr.n_planes, lr.pairing, lr.head_dim) == (n_planes, pairing, head_dim)
        assert (lr.n_heads, lr.n_kv_heads) == (heads, kv_heads)
        torch.testing.assert_close(
            lr.inv_freq,
            1.0 / lr.base ** (torch.arange(0, lr.rotary_dim, 2).float() / lr.rotary_dim),
        )


def test_gemma3_spec_has_local_and_global_layers(tiny):
    spec = rope_spec(tiny("gemma3"))
    assert spec.kinds == {"sliding": [0, 1, 2], "full": [3]}
    assert [lr.window for lr in spec.layers] == [8, 8, 8, None]
    # Gemma scales scores by query_pre_attn_scalar^-½ (32 here), not head_dim^-½ (16).
    assert all(lr.score_scale == pytest.approx(32**-0.5) for lr in spec.layers)


def test_gptj_spec_is_partial_adjacent(tiny):
    spec = rope_spec(tiny("gptj"))
    assert all(lr.rotary_dim == 8 and lr.head_dim == 16 for lr in spec.layers)
    assert all(lr.pairing == "adjacent" for lr in spec.layers)
    # GPT-J's config names no base: the one its measured frequencies follow, θ_i = 10000^(−2i/d)
    assert all(lr.base == 10000.0 for lr in spec.layers)


@pytest.mark.parametrize("family", ["llama", "llama-gqa", "gemma3"])
def test_inv_freq_matches_hooked_cos_sin(tiny, family):
    """The angle the running model applies at position 1 is θ_i, plane by plane, in every layer."""
    model, spec = tiny(family), rope_spec(tiny(family))
    seen = {}

    def keep(t, hook):
        seen[hook.name] = t.detach()

    hooks = [
        (f"blocks.{i}.attn.hook_{w}", keep) for i in range(spec.n_layers) for w in ("cos", "sin")
    ]
    with torch.no_grad():
        model.run_with_hooks(model.to_tokens(TEXT), fwd_hooks=hooks)
    for lr in spec.layers:
        cos, sin = (
            seen[f"blocks.{lr.layer}.attn.hook_cos"],
            seen[f"blocks.{lr.layer}.attn.hook_sin"],
        )
        assert cos.shape == (1, len(TEXT) + 1, lr.head_dim)
        n = lr.n_planes
        angle = torch.atan2(sin[0, 1, :n].double(), cos[0, 1, :n].double())
        torch.testing.assert_close(angle.float(), lr.inv_freq, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(cos[..., :n], cos[..., n:])  # "half": one angle for dims i, i+n


def test_spec_reproduces_attention_patterns(tiny, rope_family):
    """Rotating the model's own q, k with the spec (inv_freq, pairing, scale, window) gives its
    pattern.

    Works for GPT-J too, whose bridge fires no rotary hooks.
    """
    model, spec = tiny(rope_family), rope_spec(tiny(rope_family))
    tokens = model.to_tokens(TEXT)
    with torch.no_grad():
        _, cache = model.run_with_cache(tokens)
    pos = torch.arange(tokens.shape[1])
    for lr in spec.layers:
        q, k = _pre_rotation_qk(cache, lr.layer, rope_family)
        rk = lr.rotate(k, pos).repeat_interleave(lr.group_size, dim=1)
        scores = lr.score_scale * lr.rotate(q, pos) @ rk.transpose(-1, -2)
        allowed = pos[:, None] >= pos[None, :]
        if lr.window is not None:
            allowed &= pos[:, None] - pos[None, :] < lr.window
        pattern = scores.masked_fill(~allowed, float("-inf")).softmax(-1)
        torch.testing.assert_close(
            pattern, cache[f"blocks.{lr.layer}.attn.hook_pattern"], rtol=1e-4, atol=1e-5
        )


def _pre_rotation_qk(cache, layer: int, family: str):
    """Queries and keys just before RoPE, as [batch, head, pos, d_head]."""
    if family == "gemma3":  # Gemma normalises q and k per head before rotating them
        return cache[f"blocks.{layer}.attn.hook_q_normed"], cache[
            f"blocks.{layer}.attn.hook_k_normed"
        ]
    q, k = cache[f"blocks.{layer}.attn.hook_q"], cache[f"blocks.{layer}.attn.hook_k"]
    return q.transpose(1, 2), k.transpose(1, 2)


def test_to_tokens_prepends_bos(tiny):
    model = tiny("llama")
    assert model.to_tokens("ab")[0].tolist()[0] == model.tokenizer.bos_token_id == 1


# --------------------------------------------------------------------------------------------
# loading from a path
# --------------------------------------------------------------------------------------------
def test_load_hf_directory(tiny_dir, tiny):
    loaded = load_model(tiny_dir("gemma3"), device="cpu")
    pd.testing.assert_frame_equal(rope_spec(loaded).summary(), rope_spec(tiny("gemma3")).summary())
    tokens = loaded.to_tokens("hello")
    with torch.no_grad():
        torch.testing.assert_close(loaded(tokens), tiny("gemma3")(tokens))


# --------------------------------------------------------------------------------------------
# bad input
# --------------------------------------------------------------------------------------------
def test_non_rope_model_raises_not_rotary(tiny):
    with pytest.raises(NotRotaryError, match="not RoPE"):
        rope_spec(tiny("gpt2"))


def test_rope_spec_of_a_non_model_is_a_type_error():
    with pytest.raises(TypeError, match="TransformerBridge"):
        rope_spec(object())


def test_rope_spec_of_a_bare_hf_model_is_a_type_error():
    with pytest.raises(TypeError, match="load_model"):
        rope_spec(tiny_hf_model("llama"))


def test_unknown_model_name_offline_lists_embedded_models():
    with pytest.raises(ValueError, match="no-such-model") as info:
        load_model("no-such-model", device="cpu")
    for name in ropelens.EMBEDDED_MODELS:
        assert repr(name) in str(info.value)


def test_missing_gguf_path(tmp_path):
    with pytest.raises(FileNotFoundError, match="missing.gguf"):
        load_model(tmp_path / "missing.gguf", device="cpu")


def test_missing_local_path(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_model(str(tmp_path / "nowhere" / "model"), device="cpu")


def test_garbage_gguf_is_a_clear_value_error(tmp_path, monkeypatch):
    monkeypatch.setenv("ROPELENS_CACHE", str(tmp_path / "cache"))
    bad = tmp_path / "x.gguf"
    bad.write_bytes(b"this is not a model" * 100)
    with pytest.raises(ValueError, match=r"could not read GGUF file .*x\.gguf"):
        load_model(bad, device="cpu")
    assert not any((tmp_path / "cache" / "models").iterdir())  # nothing half-written left behind


def test_file_that_is_not_gguf(tmp_path):
    weights = tmp_path / "weights.bin"
    weights.write_bytes(b"\0" * 16)
    with pytest.raises(ValueError, match="not a .gguf model"):
        load_model(weights, device="cpu")


def test_directory_without_config(tmp_path):
    with pytest.raises(ValueError, match="without config.json"):
        load_model(tmp_path, device="cpu")


@pytest.mark.parametrize("device", ["gpu0", "tpu", ""])
def test_wrong_device_string(device):
    with pytest.raises(ValueError, match="unknown device"):
        resolve_device(device)
    with pytest.raises(ValueError, match="unknown device"):
        load_model("smollm2-135m", device=device)  # rejected before anything is loaded


@pytest.mark.parametrize("device", ["meta", torch.device("meta")])
def test_the_meta_device_is_refused_in_one_line(device, tmp_path):
    """Meta tensors hold no values: refused where a device is named, before anything loads."""
    message = r"meta tensors hold shapes but no values.*pick 'cpu', 'cuda' or 'mps'"
    with pytest.raises(InputError, match=message):
        resolve_device(device)
    with pytest.raises(InputError, match=message):
        load_model("smollm2-135m", device=device)
    with pytest.raises(InputError, match=message):
        load_model(tiny_model_dir("llama", tmp_path / "tiny"), device=device)
    with pytest.raises(InputError, match=message):
        tiny_model("llama", device=device)


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without a GPU")
def test_cuda_without_gpu():
    with pytest.raises(ValueError, match="no CUDA GPU"):
        resolve_device("cuda")


@pytest.mark.parametrize("dtype", ["float8", "int64", torch.int64, 32])
def test_bad_dtype_is_a_clear_input_error(dtype):
    with pytest.raises(InputError, match=r"unknown dtype .*'float32', 'bfloat16'"):
        load_model("no-such-model", dtype=dtype)  # rejected before anything is loaded


def test_dtype_by_name(tiny_dir):
    model = load_model(tiny_dir("llama"), device="cpu", dtype="bfloat16")
    assert {p.dtype for p in model.parameters() if p.is_floating_point()} == {torch.bfloat16}
    assert model.cfg.dtype == torch.bfloat16
    assert (
        load_model(tiny_dir("llama"), device="cpu", dtype="torch.float32").cfg.dtype
        == torch.float32
    )


# --------------------------------------------------------------------------------------------
# identity and placement
# --------------------------------------------------------------------------------------------
def _recorded(model) -> tuple[str, str]:
    """The model name an analysis's provenance and the spec record."""
    toks = model.to_tokens(TEXT)
    return ropelens.analyses.frequency_usage(
        model, toks, progress=False
    ).provenance.model, rope_spec(model).model_name


def test_identity_by_path_travels_on_the_config(tiny_dir):
    path = tiny_dir("llama")
    model = load_model(path, device="cpu")
    assert model.cfg.model_name == ropelens.spec.reading.model_label(model) == str(path)
    assert model.cfg.model_path == str(path.resolve())
    assert _recorded(model) == (str(path), str(path))


def test_identity_by_name_travels_on_the_config(tiny_embedded):
    model = load_model(tiny_embedded, device="cpu")
    assert model.cfg.model_name == ropelens.spec.reading.model_label(model) == tiny_embedded
    assert model.cfg.model_path is None
    assert _recorded(model) == (tiny_embedded, tiny_embedded)


def test_wrapped_model_keeps_its_label(tiny):
    model = tiny("gemma3")
    assert ropelens.spec.reading.model_label(model) == model.cfg.model_name == "tiny-gemma3"
    assert not hasattr(model, "ropelens_name")


def test_no_name_attribute_outside_the_config():
    src = Path(ropelens.__file__).parent
    assert [p.name for p in src.rglob("*.py") if "ropelens_name" in p.read_text()] == []


def test_device_of():
    assert device_of(tiny_hf_model("llama")) == torch.device("cpu")
    assert device_of(torch.nn.Module()) == torch.device("cpu")  # no parameters
    # an accelerate-style split: offloaded weights on meta come first, inputs belong where weights
    # live
    split = torch.nn.Sequential(torch.nn.Linear(2, 2, device="meta"), torch.nn.Linear(2, 2))
    assert device_of(split) == torch.device("cpu")
    assert device_of(torch.nn.Linear(2, 2, device="meta")) == torch.device("meta")


def test_device_of_a_bridge(tiny):
    assert device_of(tiny("llama")) == torch.device("cpu")
