"""Frequency usage and band statistics against HF's own sdpa forward, on random-weight models of
real shapes.

Builds Llama-3.2-1B and Llama-3.1-8B shapes directly on the device with random weights (no
download: cost does not depend on the weights), wraps them in the TransformerLens bridge, and
prints for each shape and each ``windows x tokens`` setting: HF's sdpa forward over the decoder
(no unembedding; the baseline), frequency usage and full band statistics through ropelens, each
as median time, tokens/s, ratio to the baseline and peak device memory.

    # on CUDA: 1B and 8B, 8 x 4096 and 1 x 32768
    python benchmarks/gpu_bench.py
    python benchmarks/gpu_bench.py --shapes 1b --settings 8x4096 --repeats 5
    # band statistics at other tile sizes too (2^26 and 2^30 band-logit entries per tile)
    python benchmarks/gpu_bench.py --shapes 1b --tile-elements 26,30
    # with the fused Triton key scan beside the torch one (CUDA with Triton)
    python benchmarks/gpu_bench.py --what sdpa,band_statistics,band_statistics_triton
    # a smoke run anywhere
    python benchmarks/gpu_bench.py --device cpu --shapes tiny --settings 2x256
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import time
from unittest import mock

import torch

from ropelens.analyses.band_statistics import BandStatsReducer
from ropelens.analyses.frequency_usage import UsageReducer
from ropelens.backends.sdpa_capture import hf_view, sdpa_attention
from ropelens.kernels import band_statistics_triton
from ropelens.loading.models import wrap_hf_model
from ropelens.run import capture
from ropelens.run.capture import batches, stream
from ropelens.spec.bands import Bands
from ropelens.spec.reading import rope_spec
from ropelens.testing import tiny_tokenizer

LLAMA3_ROPE = {
    "rope_type": "llama3",
    "rope_theta": 500000.0,
    "factor": 32.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 8192,
}
SHAPES = {
    "1b": dict(
        hidden_size=2048,
        intermediate_size=8192,
        num_hidden_layers=16,
        num_attention_heads=32,
        num_key_value_heads=8,
        head_dim=64,
        vocab_size=128256,
        max_position_embeddings=131072,
        tie_word_embeddings=True,
    ),
    "8b": dict(
        hidden_size=4096,
        intermediate_size=14336,
        num_hidden_layers=32,
        num_attention_heads=32,
        num_key_value_heads=8,
        head_dim=128,
        vocab_size=128256,
        max_position_embeddings=131072,
    ),
    "tiny": dict(
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        vocab_size=1000,
        max_position_embeddings=131072,
    ),
}


def build(shape: str, device: torch.device, dtype: torch.dtype):
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(
        **SHAPES[shape], rope_parameters=dict(LLAMA3_ROPE), attn_implementation="sdpa"
    )
    torch.manual_seed(0)
    with torch.device(device):
        before = torch.get_default_dtype()
        torch.set_default_dtype(dtype)
        try:
            hf = LlamaForCausalLM(cfg).eval()
        finally:
            torch.set_default_dtype(before)
    return wrap_hf_model(
        hf, tiny_tokenizer(), device=device, dtype=dtype, label=f"random Llama {shape}"
    )


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def run_once(
    model, spec, toks: torch.Tensor, what: str, device: torch.device
) -> tuple[float, float | None]:
    """Seconds and peak device memory (GB; None off CUDA) of one run of ``what`` over ``toks``
    (``band_statistics@N``: with tiles of 2^N band-logit entries)."""
    layers = spec.rotary_layers
    what, _, log2 = what.partition("@")
    tiles = (
        mock.patch.object(capture, "tile_elements", lambda _device: 1 << int(log2))
        if log2
        else contextlib.nullcontext()
    )
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    sync(device)
    t0 = time.perf_counter()
    if what == "sdpa":
        view = hf_view(model)
        with torch.no_grad(), sdpa_attention(view):
            for b in batches(toks, 1):
                view.base_model(input_ids=b.to(device), use_cache=False)
    else:
        kernel = "triton" if what == "band_statistics_triton" else "torch"
        reducers = (
            [UsageReducer(spec, layers)]
            if what == "frequency_usage"
            else [BandStatsReducer(spec, layers, Bands.quantiles(4), kernel=kernel)]
        )
        with tiles:
            stream(model, batches(toks, 1), reducers, spec=spec, progress=False)
    sync(device)
    seconds = time.perf_counter() - t0
    peak = torch.cuda.max_memory_allocated(device) / 1e9 if device.type == "cuda" else None
    return seconds, peak


def main() -> None:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--device", default="cuda")
    p.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float16", "float32"))
    p.add_argument("--shapes", default="1b,8b", help=f"comma-separated, from {', '.join(SHAPES)}")
    p.add_argument("--settings", default="8x4096,1x32768", help="comma-separated WINDOWSxTOKENS")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument(
        "--what",
        default=None,
        help="comma-separated: sdpa (the baseline, first), frequency_usage, band_statistics, "
        "band_statistics_triton (the fused Triton key scan; needs CUDA and Triton); default all, "
        "the Triton one only on CUDA",
    )
    p.add_argument(
        "--tile-elements",
        default="",
        help="comma-separated log2 tile sizes: band statistics also runs with tiles of 2^N entries",
    )
    args = p.parse_args()
    device, dtype = torch.device(args.device), getattr(torch, args.dtype)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit(
            "gpu_bench needs CUDA (no CUDA device here): run it on a GPU machine, or pass "
            "--device cpu --shapes tiny --settings 2x256 for a smoke run"
        )
    if args.what is None:
        args.what = "sdpa,frequency_usage,band_statistics" + (
            ",band_statistics_triton" if device.type == "cuda" else ""
        )
    if "band_statistics_triton" in args.what.split(",") and device.type != "cuda":
        p.error(f"band_statistics_triton needs --device cuda (got --device {args.device})")
    whats = args.what.split(",")
    whats += [f"band_statistics@{n}" for n in args.tile_elements.split(",") if n]
    if whats[0] != "sdpa":
        p.error("--what must start with sdpa (the baseline)")
    for shape in args.shapes.split(","):
        if shape not in SHAPES:
            p.error(f"unknown shape {shape!r}; choose from {', '.join(SHAPES)}")
        model = build(shape, device, dtype)
        spec = rope_spec(model)
        for setting in args.settings.split(","):
            n_win, n_ctx = (int(v) for v in setting.lower().split("x"))
            g = torch.Generator().manual_seed(0)
            toks = torch.randint(10, SHAPES[shape]["vocab_size"], (n_win, n_ctx), generator=g)
            run_once(
                model, spec, toks[:1, : min(n_ctx, 512)], "band_statistics", device
            )  # warm-up (kernels, probe)
            if "band_statistics_triton" in whats:  # the tuner tries its blocks at this length
                run_once(model, spec, toks[:1], "band_statistics_triton", device)
            rows: dict[str, list[tuple[float, float | None]]] = {w: [] for w in whats}
            for _ in range(args.repeats):
                for w in whats:
                    try:
                        rows[w].append(run_once(model, spec, toks, w, device))
                    except torch.OutOfMemoryError:
                        rows[w].append((float("nan"), None))
                        torch.cuda.empty_cache()
            base = statistics.median(s for s, _ in rows["sdpa"])
            print(
                f"{shape} shape, {n_win} x {n_ctx} tokens, {args.dtype} on {device}, "
                f"{args.repeats} interleaved repeats, band statistics in tiles of "
                f"2^{capture.tile_elements(device).bit_length() - 1} entries"
            )
            for w, runs in rows.items():
                t = statistics.median(s for s, _ in runs)
                peaks = [m for _, m in runs if m is not None]
                mem = f"{max(peaks):6.1f} GB" if peaks else "   n/a"
                print(
                    f"  {w:<20} {t:8.3f} s  {n_win * n_ctx / t:10.0f} tok/s  {t / base:6.2f}x "
                    f"sdpa  peak {mem}"
                )
            if "band_statistics_triton" in whats:
                best = band_statistics_triton._tuned_key_scan_kernel.best_config
                print(f"  the tuner's blocks at {n_ctx} positions: {best}")
        del model
        if device.type == "cuda":
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
