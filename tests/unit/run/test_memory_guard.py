"""Whole attention matrices: estimated before they are allocated and refused in one line where the
machine has not the room; inputs past the trained context treated alike in Python and the CLI."""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import textwrap
import warnings
import weakref

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

import ropelens.devices
from ropelens.analyses.attention_decomposition import attention_decomposition
from ropelens.cli import main
from ropelens.errors import InputError, RopelensWarning, TruncatedInputWarning
from ropelens.loading.models import load_model
from ropelens.plots.attention_decomposition import _patterns, _storage
from ropelens.run.memory import (
    band_mixer_bytes,
    band_terms_bytes,
    decomposition_bytes,
    explore_bytes,
    trained_context,
)
from ropelens.run.texts import cut_message
from ropelens.spec.bands import Bands
from ropelens.spec.reading import rope_spec
from ropelens.testing import tiny_model, tiny_model_dir

LONG_CONTEXT = 131_072  # a tiny Llama trained (so its config says) on Llama 3.1's context


def peak_rss() -> int:
    """The process's peak resident memory so far, in bytes (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def tebibytes(n: float) -> str:
    return f"{n / 1024**4:.3g} TB"


_EXPLORE_100K = textwrap.dedent(
    """
    import contextlib, io, json, resource, sys
    from ropelens.catalog import explore
    from ropelens.cli import main
    from ropelens.loading.models import load_model
    model_dir, text, out = sys.argv[1:]
    model = load_model(model_dir, device="cpu")
    explore.load_from_args = lambda args: model  # measure the run, not the load

    def rss():  # resident now, and the peak so far
        with open("/proc/self/statm") as f:
            now = int(f.read().split()[1]) * resource.getpagesize()
        return now, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024

    argv = ["explore", model_dir, "--file", text, "--n-ctx", "100000", "--out", out]
    now0, peak0 = rss()
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        rc = main(argv)
    now1, peak1 = rss()
    print(json.dumps({"rc": rc, "err": err.getvalue(),
                      "grown": now1 - now0, "peak_grown": peak1 - max(now0, peak0)}))
    """
)


def test_explore_of_100000_tokens_is_refused_without_growing(tmp_path):
    """In a fresh process, so that no earlier test's peak hides what this run takes."""
    model_dir = tmp_path / "long"
    tiny_model_dir("llama", model_dir, max_position_embeddings=LONG_CONTEXT)
    text = tmp_path / "long.txt"
    text.write_text("x" * 99_999, encoding="utf-8")  # one token a character, BOS first: 100,000
    out = tmp_path / "page.html"
    run = subprocess.run(
        [sys.executable, "-c", _EXPLORE_100K, str(model_dir), str(text), str(out)],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"},
        check=True,
    )
    got = json.loads(run.stdout.strip().splitlines()[-1])
    assert got["rc"] == 2 and not out.exists()
    # the tokens and their tensor, never a matrix of them
    assert got["grown"] < 64 * 2**20 and got["peak_grown"] < 64 * 2**20, got
    errors = [line for line in got["err"].splitlines() if line.startswith("ropelens: error:")]
    assert len(errors) == 1 and "Traceback" not in got["err"], got["err"]
    message = errors[0]
    # 2 layers × 4 heads × 100,000² kept in float32, and the page's float64 matrices of one layer:
    # 2·(1 + 2·4 bands) + 3 = 21 of 4 heads each
    n = 100_000
    need = 2 * 4 * n * n * 4 + 21 * 4 * n * n * 8
    assert f"needs about {tebibytes(need)}" in message
    assert "free: lower --n-ctx (100,000 tokens now" in message and "--layers (2 now)" in message


def test_the_estimates_count_the_tensors_the_analyses_hold(tiny):
    """Each estimate equals the bytes of the tensors the analysis really builds, summed here from
    those tensors (a short input, where nothing is refused)."""
    model = tiny("llama")
    bands = Bands.quantiles(4)
    dec = attention_decomposition(model, "The cat sat on the mat.", bands=bands)
    n = int(dec.tokens.shape[1])
    kept = sum(dec.pattern(L).nbytes for L in dec.layers)
    one_pattern = dec.pattern(0).nbytes
    forward = 2 * one_pattern + n * n * dec.pattern(0).element_size()  # scores, softmax, mask
    assert decomposition_bytes(dec.spec, dec.layers, 1, n, torch.float32, 8) == kept + forward
    # the page: the exact and the stored patterns of every subset of dims, and three transients
    rope, acts = dec.spec.layers[0], dec.acts[0]
    q = acts["q_post"][0].float().transpose(0, 1)
    k = acts["k_post"][0].float().transpose(0, 1)
    rb = dec.resolved(0)
    every = torch.arange(q.shape[-1])
    subsets = [every, *rb.dims, *(every[~torch.isin(every, d)] for d in rb.dims)]
    patterns = _patterns(rope, q, k, dec.mask(0)[0], subsets)
    page = 2 * sum(p.nbytes for p in patterns) + 3 * patterns[0].nbytes
    assert band_mixer_bytes(dec.spec, dec.layers, n, bands) == page
    assert explore_bytes(dec.spec, dec.layers, n, bands, torch.float32) == kept + page
    terms = dec.band_logits(0)
    assert band_terms_bytes(1, 4, rb.n_bands, n, torch.float32) == 3 * terms.nbytes


class LiveTensorBytes(TorchDispatchMode):
    """The bytes of tensor storage alive at once inside the block, counted by torch's own dispatch:
    each op's outputs add their storage (a view of a counted storage adds nothing) and a storage is
    released when its last tensor is. What the C allocator keeps or returns does not enter, so the
    count is the same on every machine."""

    def __init__(self) -> None:
        super().__init__()
        self.tensors: dict[int, list[int]] = {}  # storage address: [bytes, tensors holding it]
        self.live = 0
        self.peak = 0

    def _release(self, address: int) -> None:
        held = self.tensors[address]
        held[1] -= 1
        if held[1] == 0:
            del self.tensors[address]
            self.live -= held[0]

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor):
                storage = t.untyped_storage()
                address = storage.data_ptr()
                if address in self.tensors:
                    self.tensors[address][1] += 1
                else:
                    self.tensors[address] = [storage.nbytes(), 1]
                    self.live += storage.nbytes()
                    self.peak = max(self.peak, self.live)
                weakref.finalize(t, self._release, address)
        return out


def test_the_page_estimate_is_within_a_tenth_of_the_measured_peak():
    """The band mixer's largest part at 1,200 tokens (each float64 [4, n, n] matrix 46 MB): the
    estimate counts 21 of them, about 0.97 GB, against the peak of tensor bytes alive at once."""
    n = 1200
    spec = rope_spec(tiny_model("llama"))
    rope, bands = spec.layers[0], Bands.quantiles(4)
    g = torch.Generator().manual_seed(0)
    q, k = torch.randn(4, n, 16, generator=g), torch.randn(4, n, 16, generator=g)
    mask = rope.mask(n)
    every = torch.arange(16)
    dims = bands.resolve(rope).dims
    subsets = [every, *dims, *(every[~torch.isin(every, d)] for d in dims)]
    with LiveTensorBytes() as counted:
        _storage(rope, q, k, mask, subsets)
    estimated = band_mixer_bytes(spec, [0], n, bands)
    assert 0.9 < counted.peak / estimated < 1.1, (counted.peak, estimated)
    assert counted.live == 0  # every matrix of the page released when it returns


@pytest.fixture
def little_memory(monkeypatch):
    """A machine with ``room`` bytes free, as /proc/meminfo would say."""

    def set_room(room: int) -> None:
        monkeypatch.setattr(ropelens.devices, "available_memory", lambda device=None: room)

    return set_room


def test_python_refuses_a_decomposition_before_its_forward(tiny, little_memory):
    model = tiny("llama")
    tokens = torch.randint(5, 90, (1, 2000))
    little_memory(64 * 2**20)
    before = peak_rss()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RopelensWarning)  # 2,000 positions: past the context
        with pytest.raises(InputError) as refused:
            attention_decomposition(model, tokens)
    assert peak_rss() - before < 64 * 2**20
    message = str(refused.value)
    # kept: 2 layers × [1, 4, 2000, 2000] float32; the forward: two of one layer's and the mask
    need = (2 * 4 + 2 * 4 + 1) * 2000 * 2000 * 4
    assert f"needs about {need / 2**20:.3g} MB and this machine has 64 MB free" in message
    assert "layers=[...]; 2 now" in message and "2,000 now" in message


def test_band_terms_and_the_page_are_refused_before_they_exist(tiny, little_memory):
    model = tiny("llama")
    dec = attention_decomposition(model, "The cat sat on the mat. " * 4)  # one band per plane
    n = int(dec.tokens.shape[1])
    little_memory(2**20)
    with pytest.raises(InputError, match=r"the 8 band terms of every logit of layer 0") as refused:
        dec.band_patterns(0)
    need = 3 * 4 * 8 * n * n * 4
    assert f"needs about {need / 2**20:.3g} MB" in str(refused.value)
    with pytest.raises(InputError, match="plane terms"):
        dec.plane_logits(1)
    with pytest.raises(InputError, match="band mixer page"):
        dec.explore()
    assert dec.band_pattern(0, ["plane 0"]).shape == (1, 4, n, n)  # one pattern: not guarded


def test_trained_context_is_the_configs(tiny):
    assert trained_context(tiny("llama")) == 256
    assert trained_context(tiny_model("llama", max_position_embeddings=LONG_CONTEXT)) == (
        LONG_CONTEXT
    )


def test_a_text_past_the_trained_context_is_cut_alike_in_python_and_the_cli(
    tiny_dir, tmp_path, capsys
):
    """Python and ``ropelens explore`` keep the same first 256 tokens of a 301-token text and say
    so in the same words, even where --n-ctx asks for more."""
    model_dir = str(tiny_dir("llama"))
    text = "x" * 300
    out = tmp_path / "page.html"
    argv = ["explore", model_dir, "--text", text, "--n-ctx", "400", "--out", str(out), "--json"]
    assert main([*argv, "--no-verify"]) == 0
    captured = capsys.readouterr()
    assert json.loads(captured.out)["n_tokens"] == 256
    assert cut_message("--text", 301, 256) in " ".join(captured.err.split())
    assert "--n-ctx 400 is past the model's trained context of 256" in captured.err
    model = load_model(model_dir, device="cpu")
    with pytest.warns(TruncatedInputWarning) as said:
        dec = attention_decomposition(model, text, verify=False)
    assert str(said[0].message) == cut_message("text", 301, 256)
    assert dec.tokens.shape == (1, 256)


def test_tokens_past_the_trained_context_are_used_whole_and_said(tiny):
    model = tiny("llama")
    tokens = torch.randint(5, 90, (1, 300))
    with pytest.warns(RopelensWarning, match="past the model's trained context of 256") as said:
        dec = attention_decomposition(model, tokens, layers=[0])
    assert "decomposed all 300" in str(said[0].message)
    assert dec.tokens.shape == (1, 300)


def test_an_mrope_decomposition_is_refused_before_its_forward(little_memory):
    from ropelens.analyses import mrope_decomposition
    from ropelens.testing.vl import vl_hf_model, vl_inputs

    vl = vl_hf_model("qwen2_vl")
    inputs = vl_inputs(vl)
    n = int(inputs["input_ids"].shape[1])
    little_memory(1024)
    with pytest.raises(InputError, match=rf"decomposing 1 × {n} tokens in 1 layer\(s\)"):
        mrope_decomposition(vl, **inputs, layers=[0])


def test_retrieval_heads_refuses_prompts_whose_eager_attention_does_not_fit(tiny, little_memory):
    from ropelens.analyses import retrieval_heads

    model = tiny("llama")
    little_memory(2**20)
    with pytest.raises(InputError) as refused:
        retrieval_heads(model, lengths=[120, 250], depths=[0.5], n_trials=1, verify=False)
    # one layer's scores and softmax, [1, 4, 250, 250] float32 each, and the [250, 250] mask
    need = (2 * 4 + 1) * 250 * 250 * 4
    assert f"needs about {need / 2**20:.3g} MB" in str(refused.value)
    assert "shorter prompt lengths (the longest is 250 tokens now)" in str(refused.value)
