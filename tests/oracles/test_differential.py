"""Differential harness: every analysis against its plain-transformers reference, on drawn cases.

Hypothesis draws a family of the matrix (both pairings, partial rotary, multi-head latent attention,
sliding windows, soft-cap, learned sinks, GQA, local/global layers, NoPE layers), an intervention
(none, a plane ablation in some heads, p-RoPE, both nested), a dtype, an input form (a token tensor,
ragged texts, or a corpus file the analyses cut into windows), how the model was loaded (from a
path, with ``device_map="cpu"``, or the user's own ``from_pretrained`` model wrapped), a layer
subset and a band split, and compares ropelens with :mod:`tests.oracles.reference`, which runs HF's
own eager attention and reads nothing from ropelens but the model's inputs: plane and band logits,
the pattern and band-only patterns (attention decomposition), plane norms and energy shares of the
whole head (frequency usage), |logit| shares and top-1 agreement (band statistics), attention to
position 0 and the sink logit by band (attention sinks), band logits and probabilities by distance,
the loss, per-dimension norms and massive dimensions of the pre-RoPE q and k (massive values),
spectral entropies (frequency entropy), plane norms, outlier ratios and q–k angles at the attended
key (rotary offsets), attention by offset and band position shares on text and random tokens (head
taxonomy), and band shares with and without the intervention (intervention effect). Knockout
(per-row attention and the knocked-out loss), retrieval scores with passkey answers, and M-RoPE
decomposition (the tiny vision-language models) have tests of their own. A failure shrinks to its
smallest case and prints the seed to replay it. The reference's ablations and knockouts zero the
planes where q and k enter the score, or, in a family that norms q and k after its rotation
(``Case.norm_after_rope``: HunYuan dense, NanoChat, Llama 4), at the rotation's output, before the
norm, where ropelens zeroes them (``test_rotation_edits`` checks that flag against HF's forward).

Tolerances (``TOLERANCE``) are relative to the largest reference value of each quantity, or
absolute for quantities in [0, 1] (probabilities, shares, entropies, resultant lengths): float32
agrees to 1e-4; bfloat16 to 5e-2 (ropelens runs sdpa where the reference runs eager attention,
and both round scores and probabilities to 8 bits of mantissa). Band logits scale by the whole
score, variances by the square of the largest band term. What rounding can flip is bounded rather
than compared: a massive dimension within rounding of the threshold, a query whose two best keys
are within rounding (rotary offsets, retrieval scores), a greedy step whose two best logits are.

The matrix holds every family of :data:`ropelens.testing.families.FAMILIES` the reference can
compute (``NOT_IN_GRID`` names the others and what the reference lacks); ``REFUSED`` leaves out
the cells ropelens refuses on a family with one clear error, and ``KNOWN_WRONG`` runs the cells
where ropelens is known to differ from the reference as strict expected failures, with the reason.

``ROPELENS_ORACLE_EXAMPLES`` sets the number of drawn cases (default 30; the release profile runs
the whole grid, ``ROPELENS_ORACLE_GRID=1``).
"""

from __future__ import annotations

import contextlib
import functools
import math
import os
from dataclasses import dataclass

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from transformers import AutoModelForCausalLM, AutoTokenizer

import ropelens
from ropelens.analyses import (
    attention_by_distance,
    attention_decomposition,
    attention_sinks,
    band_statistics,
    frequency_entropy,
    frequency_usage,
    head_taxonomy,
    intervention_effect,
    massive_values,
    rotary_offsets,
)
from ropelens.analyses.knockout import knocked_out, probe_rows
from ropelens.analyses.passkey_retrieval import make_passkey, passkey_prompt, passkey_retrieval
from ropelens.analyses.retrieval_heads import retrieval_scores
from ropelens.loading.models import wrap_hf_model
from ropelens.run import data
from ropelens.run.evaluate import window_losses
from ropelens.spec.variants import PRoPE
from tests.oracles import reference as R

pytestmark = pytest.mark.filterwarnings("ignore")

EXAMPLES = int(os.environ.get("ROPELENS_ORACLE_EXAMPLES", "30"))
TOLERANCE = {torch.float32: 1e-4, torch.bfloat16: 5e-2}


@dataclass(frozen=True)
class Case:
    """What the matrix knows of a family: its plane layout in the rotated query."""

    head_dim: int
    n_rotary: int
    pairing: str = "half"
    rotary_last: bool = False  # multi-head latent attention: no-position dims first
    prope: bool = False  # default RoPE frequencies: p-RoPE has a reference
    # q and k pass a per-head norm between HF's rotation and the score: an ablation's reference
    # zeroes the planes at the rotation's output, before the norm, as ablate_planes does there
    norm_after_rope: bool = False

    def edit_at(self) -> str:
        """Where the reference edits q and k for an ablation or a knockout."""
        return "rotation" if self.norm_after_rope else "score"

    def layout(self) -> R.Layout:
        offset = self.head_dim - self.n_rotary if self.rotary_last else 0
        return R.Layout(self.head_dim, self.n_rotary, self.pairing, offset)


MATRIX = {
    "llama": Case(16, 16, prope=True),  # GQA, half pairs
    "cohere": Case(16, 16, "adjacent", prope=True),  # adjacent pairs
    "mistral": Case(16, 16, prope=True),  # sliding window
    "phi": Case(16, 6, prope=True),  # partial rotary 0.4
    "gpt_neox": Case(16, 4, prope=True),  # partial rotary 0.25, MHA
    "phi3": Case(16, 8, prope=True),  # fused qkv, partial rotary 0.5, sliding window
    "glm": Case(16, 8, "adjacent", prope=True),  # adjacent pairs, partial rotary 0.5
    "gemma2": Case(16, 16, prope=True),  # soft-cap, alternating windows
    "gemma3_text": Case(16, 16, prope=True),  # local/global layers, q/k norm
    "gpt_oss": Case(16, 16),  # learned sinks, YaRN, windows
    "deepseek_v3": Case(16, 8, rotary_last=True, prope=True),  # multi-head latent attention
    "smollm3": Case(16, 16, prope=True),  # NoPE layers
    "qwen3": Case(16, 16, prope=True),  # per-head q/k norm before RoPE
    "olmo2": Case(16, 16, prope=True),  # q/k norm over the whole projection, before the split
    "stablelm": Case(16, 4, prope=True),  # partial rotary 0.25
    "qwen2": Case(16, 16, prope=True),  # sliding window on the upper layers
    "mixtral": Case(16, 16, prope=True),  # sliding window, mixture of experts
    "gemma": Case(16, 16, prope=True),  # GQA, scaled embeddings
    "starcoder2": Case(16, 16, prope=True),  # one sliding window for every layer
    "persimmon": Case(16, 8, prope=True),  # partial rotary 0.5, q/k layer norm
    "ministral": Case(16, 16, prope=True),  # sliding and full layers, plain HF model
    "phimoe": Case(16, 16, prope=True),  # mixture of experts, plain HF model
    "helium": Case(16, 16, "adjacent", prope=True),  # adjacent pairs, plain HF model
    "glm4_moe_lite": Case(16, 4, rotary_last=True, prope=True),  # MLA, 4 rotary dims after 12
    "minicpm3": Case(16, 12, rotary_last=True, prope=True),  # MLA, 12 rotary dims after 4
    # HunYuanDenseV1Attention.forward: apply_rotary_pos_emb, then query_layernorm and
    # key_layernorm (RMS norms with a gain over the head dim)
    "hunyuan_v1_dense": Case(16, 16, prope=True, norm_after_rope=True),
    # NanoChatAttention.forward: apply_rotary_pos_emb (rotate_half the other way), then q_norm and
    # k_norm (RMS norms without a gain), "RoPE -> Norm (instead of usual Norm -> RoPE)"
    "nanochat": Case(16, 16, prope=True, norm_after_rope=True),
    # Llama4TextAttention.forward: apply_rotary_emb (a complex product on [batch, pos, head, dim]),
    # then qk_norm (an L2 norm without a gain) in its rotary layers; chunked attention
    "llama4": Case(16, 16, "adjacent", prope=True, norm_after_rope=True),
    "recurrent_gemma": Case(16, 8, prope=True),  # RG-LRU layers, local attention, partial 0.5
    "granite": Case(16, 16, prope=True),  # attention multiplier as the score scale
    "falcon": Case(16, 16, prope=True),  # grouped KV heads in a fused qkv
    "bamba": Case(16, 8, prope=True),  # Mamba-2 layers, partial rotary 0.5
    "falcon_h1": Case(16, 16, prope=True),  # a Mamba-2 mixer beside attention, key multiplier
    "granitemoehybrid": Case(16, 16, prope=True),  # Mamba-2 layers, attention multiplier
    "lfm2": Case(16, 16, prope=True),  # short-convolution layers, q/k norm
    "qwen3_next": Case(16, 4, prope=True),  # Gated DeltaNet layers, output gate, partial 0.25
    "qwen3_5_text": Case(16, 4, prope=True),  # Gated DeltaNet layers, output gate, partial 0.25
    "olmo_hybrid": Case(16, 16, prope=True),  # Gated DeltaNet layers, whole-projection q/k norm
    "cohere2": Case(16, 16, "adjacent", prope=True),  # full-attention layers without RoPE
    "exaone4": Case(16, 16, prope=True),  # q/k norm, full-attention layers without RoPE
    "deepseek_v2": Case(16, 8, "adjacent", rotary_last=True, prope=True),  # MLA, complex product
}

# families of ropelens.testing.families the reference cannot compute, and what it lacks
NOT_IN_GRID = {
    "diffllama": "differential attention (two softmax maps subtracted), which ropelens refuses "
    "and the reference's one softmax per layer does not model",
    "gemma4_text": "one plane layout per family: its global layer's heads are twice as wide, "
    "with a quarter of each half turning",
}

_NO_SOFTMAX = (
    "retrieval scores read every layer's attention; a layer without softmax attention has none"
)
_CHUNKED = (
    "layers attend in chunks of 8 tokens, which band statistics and head scores do not model on "
    "24-token windows (the ragged texts, the decomposition alone, stay in)"
)
_BRIDGE_HOOKS = (
    "retrieval scores under an intervention read HF's eager attention, which Granite's bridge, "
    "with hooks of its own, cannot run the intervention on"
)
# what ropelens refuses on a family with one clear error (an analysis, intervention, dtype or
# input form it does not run there): those cells are left out of the grid
REFUSED = {
    "bamba": {"retrieval": _NO_SOFTMAX},
    "granite": {
        "retrieval prope": _BRIDGE_HOOKS,
        "retrieval ablate": _BRIDGE_HOOKS,
    },
    "granitemoehybrid": {
        "retrieval": _NO_SOFTMAX,
        "prope": "its decoder hands attention no position_ids, which a bridge's RoPE variant needs",
    },
    "lfm2": {"retrieval": _NO_SOFTMAX},
    "llama4": {"tensor": _CHUNKED, "file": _CHUNKED, "knockout": _CHUNKED},
    "minicpm3": {
        "bfloat16": "the tiny model's sharp attention amplifies 16-bit rounding layer by layer "
        "(HF's own bfloat16 probabilities differ from its float32 ones by 0.30 at layer 3): the "
        "probe refuses it past 0.2"
    },
    "olmo_hybrid": {"retrieval": _NO_SOFTMAX},
    "qwen3_5_text": {"retrieval": _NO_SOFTMAX},
    "qwen3_next": {"retrieval": _NO_SOFTMAX},
    "recurrent_gemma": {"retrieval": _NO_SOFTMAX},
}
# cells where ropelens's number differs from the reference's for a known reason: each runs, and
# is expected to fail (strictly: a cell that starts to pass must leave this list); none at present
KNOWN_WRONG: dict[str, dict[str, str]] = {}


def _runs(family: str, *what: str) -> bool:
    """Whether ropelens runs ``what`` (analyses, interventions, a dtype's or form's names) on
    the family and agrees with the reference there."""
    left_out = {**REFUSED.get(family, {}), **KNOWN_WRONG.get(family, {})}
    return not any(w in left_out for w in what)


def _prope(family: str) -> bool:
    """Whether the family's cells include p-RoPE (a reference exists and ropelens runs it)."""
    return MATRIX[family].prope and "prope" not in REFUSED.get(family, {})


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).split(".")[-1]


def _dtypes(family: str) -> list[torch.dtype]:
    dtypes = (torch.float32, torch.bfloat16)
    return [d for d in dtypes if _dtype_name(d) not in REFUSED.get(family, {})]


def _expected_to_fail(family: str, what: str) -> list:
    """A strict xfail mark where ``what`` is a known wrong cell of the family."""
    reason = KNOWN_WRONG.get(family, {}).get(what)
    # a crash is no known difference: only a failed comparison is expected
    return [pytest.mark.xfail(reason=reason, strict=True, raises=AssertionError)] if reason else []


RETRIEVAL_FAMILIES = sorted(f for f in MATRIX if "retrieval" not in REFUSED.get(f, {}))
KNOCKOUT_FAMILIES = sorted(f for f in MATRIX if "knockout" not in REFUSED.get(f, {}))

# input forms: a token tensor, ragged texts (padded, the decomposition alone), a corpus file the
# corpus analyses cut into windows themselves
FORMS = ("tensor", "ragged", "file")
LOADS = ("path", "device_map", "user")

TEXTS = (
    "The cat sat on the mat.",
    "A river runs through the old town, past the mill.",
    "Seven.",
    "She read the letter twice, then folded it away and looked out at the rain.",
)


@pytest.fixture(scope="module")
def models(family_dir):
    """``models(family, dtype, load)``: (ropelens model, HF eager reference, rotary layers), once
    each. ``load`` is how the model reached ropelens: ``"path"`` (``load_model(dir,
    device="cpu")``), ``"device_map"`` (``load_model(dir, device_map="cpu")``, through accelerate)
    or ``"user"`` (the user's own ``AutoModelForCausalLM.from_pretrained(dir)`` and tokenizer,
    wrapped with ``wrap_hf_model``)."""

    @functools.cache
    def make(family: str, dtype: torch.dtype, load: str = "path"):
        path = family_dir(family)
        if load == "device_map":
            model = ropelens.load_model(path, device_map="cpu", dtype=dtype)
        elif load == "user":
            user = AutoModelForCausalLM.from_pretrained(path, dtype=dtype)
            tokenizer = AutoTokenizer.from_pretrained(path)
            model = wrap_hf_model(user, tokenizer, device="cpu", dtype=dtype, label=str(path))
        else:
            model = ropelens.load_model(path, device="cpu", dtype=dtype)
        hf = AutoModelForCausalLM.from_pretrained(path, dtype=dtype, attn_implementation="eager")
        probe = torch.arange(4, 12)[None]
        rotary = sorted(ropelens.capture_qk(model, probe, which=("q_post",)))
        return model, hf.eval(), rotary

    return make


@st.composite
def cases(draw):
    family = draw(st.sampled_from(sorted(MATRIX)))
    case = MATRIX[family]
    n_planes = case.n_rotary // 2
    interventions = ["none", "ablate", "prope", "both"] if _prope(family) else ["none", "ablate"]
    intervention = draw(
        st.sampled_from(
            [i for i in interventions if i in ("none", "prope") or _runs(family, "ablate")]
        )
    )
    planes = draw(st.lists(st.integers(0, n_planes - 1), min_size=1, max_size=2, unique=True))
    heads = draw(st.none() | st.lists(st.integers(0, 3), min_size=1, max_size=3, unique=True))
    if case.rotary_last:  # one rotary key shared by every head: ablations cover all heads
        heads = None
    split = draw(st.integers(1, n_planes - 1)) if n_planes > 1 else 1
    return {
        "family": family,
        "intervention": intervention,
        "planes": sorted(planes),
        "heads": None if heads is None else sorted(heads),
        "dtype": draw(st.sampled_from(_dtypes(family))),
        "form": draw(st.sampled_from([f for f in FORMS if _runs(family, f)])),
        "load": draw(st.sampled_from(LOADS)),
        "layer_pick": draw(st.integers(0, 2**8 - 1)),
        "split": split,
        "claim_all": draw(st.booleans()),
        "seed": draw(st.integers(0, 2**16)),
    }


def _layers(rotary: list[int], pick: int) -> list[int]:
    chosen = [L for i, L in enumerate(rotary) if pick >> i & 1]
    return chosen or rotary[:1]


def _bands(n_planes: int, split: int, claim_all: bool) -> tuple[ropelens.Bands, list[list[int]]]:
    """Two explicit bands (highest planes, then the next ones), or all but the lowest plane, which
    falls to ``rest`` with the unrotated dims."""
    high = list(range(split))
    low = list(range(split, n_planes if claim_all or n_planes - split < 2 else n_planes - 1))
    groups = {"high": high, "low": low} if low else {"high": high}
    return ropelens.Bands.explicit(groups), list(groups.values())


@contextlib.contextmanager
def _reference_prope(hf, p: float):
    """p-RoPE in the reference: every rotary module's frequencies (``*inv_freq`` buffers) keep
    their highest ``int(p · n_planes)`` entries and the rest turn by nothing (θ = 0), as HF's
    ``proportional`` RoPE counts them. A rotary module that recomputes its frequencies from the
    config in every forward (PhiMoE's ``rope_init_fn``) is handed the same ones there."""
    saved = []
    for module in hf.modules():
        for name, buf in list(module.named_buffers(recurse=False)):
            if name.endswith("inv_freq") and not name.startswith("original"):
                kept = int(p * buf.numel())
                saved.append((module, name, buf))
                truncated = torch.cat([buf[:kept], torch.zeros_like(buf[kept:])])
                setattr(module, name, truncated)
                if name == "inv_freq" and callable(getattr(module, "rope_init_fn", None)):
                    init = module.rope_init_fn
                    scaling = init(module.config)[1]
                    saved.append((module, "rope_init_fn", init))
                    module.rope_init_fn = lambda *_, kept=truncated, s=scaling: (kept.clone(), s)
    try:
        yield
    finally:
        for module, name, value in reversed(saved):
            setattr(module, name, value)


# the largest relative error seen per quantity, and the cells compared (read by the grid's summary)
LARGEST: dict[str, float] = {}
CELLS: list[str] = []


def _close(
    name: str, got: torch.Tensor, want: torch.Tensor, tol: float, where=None, scale=None
) -> None:
    """Largest |got − want| relative to ``scale`` (default: the largest |want| compared)."""
    got, want = got.double(), want.double()
    if where is not None:
        got, want = got[where], want[where]
    assert got.shape == want.shape, f"{name}: shape {tuple(got.shape)} != {tuple(want.shape)}"
    if scale is None:
        scale = max(float(want.abs().max()), 1e-6) if want.numel() else 1.0
    err = float((got - want).abs().max()) / scale if want.numel() else 0.0
    quantity = name.split(" ", 1)[1] if name.startswith("L") else name
    LARGEST[quantity] = max(LARGEST.get(quantity, 0.0), err)
    assert err <= tol, f"{name}: relative error {err:.3g} > {tol:g}"


@settings(
    max_examples=EXAMPLES,
    deadline=None,
    derandomize=True,
    print_blob=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(draw=cases())
def test_analyses_match_their_references(models, draw):
    compare(models, draw)


GRID = [
    pytest.param(
        family,
        intervention,
        dtype,
        form,
        id="-".join([family, intervention, _dtype_name(dtype), form]),
        marks=_expected_to_fail(family, intervention),
    )
    for family in sorted(MATRIX)
    for intervention in ("none", "prope", "ablate")
    for dtype in _dtypes(family)
    for form in FORMS
    if (intervention != "prope" or _prope(family)) and _runs(family, form)
]


@pytest.mark.skipif(
    not os.environ.get("ROPELENS_ORACLE_GRID"),
    reason="the whole grid is the release profile: ROPELENS_ORACLE_GRID=1",
)
@pytest.mark.parametrize(("family", "intervention", "dtype", "form"), GRID)
def test_every_cell_of_the_matrix(models, family, intervention, dtype, form):
    """One cell of family × intervention × dtype × input form; the way the model was loaded turns
    with the cells (each family meets every load across its cells)."""
    n_planes = MATRIX[family].n_rotary // 2
    index = [p.values for p in GRID].index((family, intervention, dtype, form))
    draw = {
        "family": family,
        "intervention": intervention,
        "planes": [0, n_planes - 1],
        "heads": None if MATRIX[family].rotary_last else [0, 2],
        "dtype": dtype,
        "form": form,
        "load": LOADS[index % len(LOADS)],
        "layer_pick": 2**8 - 1,
        "split": max(1, n_planes // 2),
        "claim_all": False,
        "seed": 0,
    }
    with _errors_kept_if_it_passes():
        compare(models, draw)
    _cell_done(f"{family}/{intervention}/{dtype}/{form}/{draw['load']}")


@contextlib.contextmanager
def _errors_kept_if_it_passes():
    """A cell's errors count toward the largest seen only where it passes (a known wrong one's do
    not)."""
    before = dict(LARGEST)
    try:
        yield
    except BaseException:
        LARGEST.clear()
        LARGEST.update(before)
        raise


def _cell_done(cell: str) -> None:
    """Count a grid cell and rewrite the report (``ROPELENS_ORACLE_REPORT``): the cells compared,
    per kind, and the largest error seen per quantity."""
    CELLS.append(cell)
    summary = os.environ.get("ROPELENS_ORACLE_REPORT")
    if summary:
        kinds: dict[str, int] = {}
        for done in CELLS:
            kind = done.split(" ", 1)[0] if " " in done else "matrix"
            kinds[kind] = kinds.get(kind, 0) + 1
        lines = [
            f"cells compared: {len(CELLS)} ({', '.join(f'{k} {n}' for k, n in kinds.items())})"
        ]
        lines += [f"{name}: {err:.3g}" for name, err in sorted(LARGEST.items())]
        with open(summary, "w") as out:
            out.write("\n".join(lines) + "\n")


def _decomposition(model, form: str, bands, layers):
    """The attention decomposition of the drawn input form, and what the corpus analyses take:
    the token tensor itself, or the corpus file and how to cut it into windows (the same windows
    the decomposition read)."""
    if form == "ragged":
        dec = attention_decomposition(model, list(TEXTS[:3]), bands=bands, layers=layers)
        return dec, dec.tokens, {}
    if form == "file":
        source, windows = _corpus_file(), {"n_ctx": 24, "max_tokens": 48}
        tokens = data.analysis_windows(model, source, **windows)[0]
    else:
        tokens = torch.randint(4, 100, (2, 24), generator=torch.Generator().manual_seed(0))
        tokens[:, 0] = 1
        source, windows = tokens, {}
    return attention_decomposition(model, tokens, bands=bands, layers=layers), source, windows


@functools.cache
def _corpus_file() -> str:
    """A text file of the matrix's texts, several times over (the corpus-file input form)."""
    import tempfile

    folder = tempfile.mkdtemp(prefix="ropelens-oracle-")
    path = os.path.join(folder, "corpus.txt")
    with open(path, "w") as out:
        out.write("\n\n".join(TEXTS * 4) + "\n")
    return path


def compare(models, draw) -> None:
    """Run every analysis on the drawn case and compare it with the reference."""
    family, dtype = draw["family"], draw["dtype"]
    case = MATRIX[family]
    layout = case.layout()
    model, hf, rotary = models(family, dtype, draw["load"])
    tol = TOLERANCE[dtype]
    draw = {**draw, "ragged": draw["form"] == "ragged"}
    layers = _layers(rotary, draw["layer_pick"])
    bands, groups = _bands(case.n_rotary // 2, draw["split"], draw["claim_all"])
    ablating = draw["intervention"] in ("ablate", "both")
    heads = draw["heads"] if draw["heads"] is not None else list(range(4))
    ablated = [d for p in draw["planes"] for d in layout.plane_dims()[p]]

    edits = _ablation_edits(case, ablating, layers, heads, ablated)

    with contextlib.ExitStack() as stack:
        if draw["intervention"] in ("prope", "both"):
            stack.enter_context(ropelens.apply_rope_variant(model, PRoPE(0.5)))
            stack.enter_context(_reference_prope(hf, 0.5))
        if ablating:
            stack.enter_context(
                ropelens.ablate_planes(model, draw["planes"], layers=layers, heads=heads)
            )
        dec, source, windows = _decomposition(model, draw["form"], bands, layers)
        tokens = dec.tokens
        valid = dec.mask(layers[0]).diagonal(dim1=1, dim2=2)  # a real query attends to itself
        with (
            R.recorded_attention(hf, **edits) as calls,
            torch.no_grad(),
        ):
            hf(input_ids=tokens, attention_mask=valid.long())
        usage = usage_pre = None
        if not draw["ragged"]:
            run = {"layers": layers, "progress": False, **windows}
            usage = frequency_usage(model, source, source="post", **run)
            # the default reads q before the rotation: the same plane norms wherever no plane is
            # zeroed after it (a rotation keeps every plane's norm)
            usage_pre = None if ablating else frequency_usage(model, source, **run)
            stats = band_statistics(model, source, bands=bands, **run)
            sinks = attention_sinks(model, source, bands=bands, **run)
            by_distance = attention_by_distance(model, source, bands=bands, **run)
            got_loss = float(window_losses(model, tokens, progress=False).mean())
            massive = massive_values(model, source, **run)
            entropy = frequency_entropy(model, source, progress=False, **windows)  # NoPE too
            offsets = rotary_offsets(model, source, **run)
            taxonomy = head_taxonomy(
                model, source, bands=bands, layers=layers, progress=False, n_ctx=24, n_windows=2
            )
    if not draw["ragged"]:
        with contextlib.ExitStack() as stack:
            if draw["intervention"] in ("prope", "both"):
                stack.enter_context(_reference_prope(hf, 0.5))
            with R.recorded_attention(hf, **edits):
                want_loss = R.loss(hf, tokens)
            # head taxonomy's second pass: uniform tokens over the vocabulary (seeded), BOS first
            vocab = min(len(model.tokenizer), hf.get_input_embeddings().num_embeddings)
            generator = torch.Generator().manual_seed(0)
            random = torch.randint(0, vocab, tokens.shape, generator=generator)
            random[:, 0] = model.tokenizer.bos_token_id
            with (
                R.recorded_attention(hf, **edits) as random_calls,
                torch.no_grad(),
            ):
                hf(input_ids=random)
        assert abs(got_loss - want_loss) <= tol * max(1.0, abs(want_loss)), (
            f"loss {got_loss} != reference {want_loss}"
        )

    if not draw["ragged"]:
        if draw["intervention"] != "none":
            _check_intervention_effect(
                model, hf, draw, tokens, layers, bands, groups, layout, calls, tol
            )
        _check_entropy(entropy, calls, layout, tol)
    for slot, layer in enumerate(layers):
        call = calls[layer]
        entry = R.allowed(call) & valid[:, None, None, :] & valid[:, None, :, None]
        terms, rest_term = R.plane_terms(call, layout)
        # a term's rounding comes from the whole q and k: 16-bit errors scale with the full score
        score_scale = float(R.scores(call).masked_fill(~entry, 0).abs().max())
        # plane by plane: a wrong pairing moves energy between planes, which sums hide
        _close(
            f"L{layer} plane logits",
            dec.plane_logits(layer),
            terms,
            tol,
            entry[:, :, None].expand_as(terms),
            score_scale,
        )
        band_logits = dec.band_logits(layer)  # [batch, head, band, q, k]
        names = dec.band_names(layer)
        for name in names:
            want = _band_terms(terms, rest_term, groups, names)[:, :, names.index(name)]
            got = band_logits[:, :, names.index(name)]
            _close(
                f"L{layer} band {name} logits", got, want, tol, entry.expand_as(want), score_scale
            )
        _close(
            f"L{layer} pattern",
            dec.pattern(layer),
            call.probs,
            tol,
            valid[:, None, :, None].expand_as(call.probs),
        )
        want_band = R.softmax_of(call, terms[:, :, groups[0]].sum(2))
        _close(
            f"L{layer} band-only pattern",
            dec.band_pattern(layer, bands=["high"]),
            want_band,
            tol,
            valid[:, None, :, None].expand_as(want_band),
        )
        if usage is None:
            continue
        query = call.query
        scaling = _attention_scaling(hf)
        want_norm = torch.stack(
            [R.plane_norm_mean(query, pair) for pair in layout.plane_dims()], -1
        )
        _close(f"L{layer} q plane norms", usage.q_norm[slot], want_norm / scaling, tol)
        if usage_pre is not None:
            # q as HF's rotation received it: the same plane norms as the rotated q over the
            # rotation's gain, except where a norm after the rotation changes them (HunYuan)
            want_pre = R.pre_rope(call, layout)[0]
            _close(
                f"L{layer} q plane norms before the rotation",
                usage_pre.q_norm[slot],
                torch.stack(
                    [R.plane_norm_mean(want_pre, pair) for pair in layout.plane_dims()], -1
                ),
                tol,
            )
        # energy shares of the whole head: the unrotated dims and unclaimed planes are "rest"
        claimed = {p for g in groups for p in g}
        planes = layout.plane_dims()
        dims_of = [[d for p in g for d in planes[p]] for g in groups]
        if "rest" in names:
            unclaimed = [d for p in range(len(planes)) if p not in claimed for d in planes[p]]
            dims_of.append(unclaimed + layout.unrotated_dims())
        rotary = {d for pair in planes for d in pair}
        energy = torch.stack(
            [
                R.energy_by_dims(query, [d for d in dims if d in rotary]) / scaling**2
                + R.energy_by_dims(query, [d for d in dims if d not in rotary])
                for dims in dims_of
            ],
            -1,
        )
        share_names, share = usage.band_share(bands, "q")
        assert share_names == names, f"band_share names {share_names} != {names}"
        _close(f"L{layer} q energy share", share[slot], energy / energy.sum(-1, keepdim=True), tol)
        _check_stats(stats, slot, call, terms, rest_term, groups, names, tol, layer)
        _check_sinks(sinks, slot, call, terms, rest_term, groups, names, tol, layer, score_scale)
        _check_distance(by_distance, slot, call, terms, rest_term, groups, names, tol, layer)
        _check_taxonomy(taxonomy, slot, call, random_calls[layer], layout, groups, names, tol)
        _check_massive(massive, slot, call, case, tol, layer)
        _check_offsets(offsets, slot, call, layout, scaling, tol, layer)


def _attention_scaling(hf) -> float:
    """The gain HF's rotary module multiplies cos and sin by (YaRN's attention factor), read from
    the model's rotary module (RecurrentGemma keeps one in each attention layer)."""
    rotary = getattr(hf.base_model, "rotary_emb", None)
    if rotary is None:
        rotary = next((m for m in hf.modules() if hasattr(m, "attention_scaling")), None)
    return float(getattr(rotary, "attention_scaling", 1.0))


def _ablation_edits(case: Case, ablating: bool, layers, heads, ablated) -> dict:
    """The reference's plane ablation as edits of the rotated query and key (the keywords of
    :func:`R.recorded_attention`): the planes' dims zeroed in the chosen query heads, and in a KV
    head only when every query head sharing it is chosen; at the rotation's output where a norm
    follows it (``Case.norm_after_rope``), else where q and k enter the score."""

    def edit_query(layer, query):
        if not ablating or layer not in layers:
            return query
        query = query.clone()
        index = torch.tensor(heads)[:, None], torch.tensor(ablated)[None, :]
        query[:, index[0], :, index[1]] = 0
        return query

    def edit_key(layer, key):
        if not ablating or layer not in layers:
            return key
        group = 4 // key.shape[1]  # every family of the matrix has 4 query heads
        whole = [
            kv for kv in range(key.shape[1]) if all(kv * group + g in heads for g in range(group))
        ]
        if not whole:
            return key
        key = key.clone()
        index = torch.tensor(whole)[:, None], torch.tensor(ablated)[None, :]
        key[:, index[0], :, index[1]] = 0
        return key

    return {"edit_query": edit_query, "edit_key": edit_key, "edit_at": case.edit_at()}


def _band_terms(terms, rest_term, groups, names) -> torch.Tensor:
    """Each band's score term ``[batch, head, band, q, k]``: its planes' terms summed, and for
    ``rest`` the unclaimed planes' and the unrotated dims' terms."""
    claimed = {p for g in groups for p in g}
    unclaimed = [p for p in range(terms.shape[2]) if p not in claimed]
    out = [terms[:, :, g].sum(2) for g in groups]
    if "rest" in names:
        out.append(terms[:, :, unclaimed].sum(2) + rest_term)
    return torch.stack(out, 2)


def _check_stats(stats, slot, call, terms, rest_term, groups, names, tol, layer) -> None:
    """Band statistics against the reference: |logit| share, margin and top-1 agreement."""
    allowed = R.allowed(call).expand(-1, terms.shape[1], -1, -1)
    band_terms = _band_terms(terms, rest_term, groups, names)  # [batch, head, band, q, k]
    abs_sum = (band_terms.abs() * allowed[:, :, None]).sum((0, 3, 4))  # [head, band]
    want_share = abs_sum / abs_sum.sum(-1, keepdim=True)
    _close(f"L{layer} |logit| share", stats.abs_share()[slot], want_share, tol)
    # top-1 agreement: keys tied exactly at a band's maximum share its pick (1/k each); where the
    # rounding of the two computations may order near-ties differently, a query surely agrees when
    # the band's only near-maximal key is the model's only near-maximal key and may agree when the
    # two sets meet, and ropelens's fraction must lie between the two counts.
    full = R.scores(call)
    if call.softcap is not None:
        full = torch.tanh(full / call.softcap) * call.softcap
    # rounding comes from the whole q and k: a band's near-ties are within the full score's rounding
    row_scale = R.scores(call).masked_fill(~allowed, 0).abs().amax(-1, keepdim=True)
    model_top = _near_max(full, allowed, tol * row_scale)  # [batch, head, q, k]
    band_top = _near_max(band_terms, allowed[:, :, None], tol * row_scale[:, :, None])
    masked = band_terms.masked_fill(~allowed[:, :, None], -math.inf)
    exact = allowed[:, :, None] & (masked == masked.amax(-1, keepdim=True))
    n_exact = exact.sum(-1)
    attended = full.masked_fill(~allowed, -math.inf).argmax(-1)  # [batch, head, q]
    index = attended[:, :, None, :, None].expand(*exact.shape[:-1], 1)
    shared = exact.gather(-1, index)[..., 0].double() / n_exact.clamp_min(1)
    meet = (band_top & model_top[:, :, None]).any(-1)
    sure = (band_top.sum(-1) == 1) & (model_top.sum(-1) == 1)[:, :, None] & meet
    tied = n_exact > 1
    seen = allowed.any(-1)[:, :, None].expand_as(meet)  # queries with a key
    n_seen = seen.double().sum((0, 3))
    may = torch.where(tied, shared, meet.double())
    surely = torch.where(tied, shared, sure.double())
    if tol >= 1e-3:  # 16-bit: an exact tie in one computation may be a near-tie in the other
        may = torch.maximum(may, meet.double())
        surely = torch.minimum(surely, sure.double())
    may = (may * seen).sum((0, 3)) / n_seen
    surely = (surely * seen).sum((0, 3)) / n_seen
    got = stats.top1()[slot].double()
    measurable = torch.tensor([len(g) > 0 for g in groups] + [True] * ("rest" in names))
    inside = (got >= surely - 1e-6) & (got <= may + 1e-6)
    outside = ~inside[:, measurable]
    LARGEST["top-1 agreement (outside the tie bounds)"] = max(
        LARGEST.get("top-1 agreement (outside the tie bounds)", 0.0), float(outside.sum())
    )
    assert not outside.any(), (
        f"L{layer} top-1 agreement {got[:, measurable].tolist()} outside "
        f"[{surely[:, measurable].tolist()}, {may[:, measurable].tolist()}]"
    )


def _near_max(x: torch.Tensor, allowed: torch.Tensor, eps: torch.Tensor) -> torch.Tensor:
    """The allowed keys within ``eps`` (per row) of each row's maximum."""
    x = x.masked_fill(~allowed, -math.inf)
    return allowed & (x >= x.amax(-1, keepdim=True) - eps - 1e-12)


def _check_sinks(sinks, slot, call, terms, rest_term, groups, names, tol, layer, score_scale):
    """Attention sinks against the reference (Gu et al.): over the queries from position 4 on that
    see position 0, the mean attention there, the share above ε = 0.3, and per band the logit at
    key 0 minus the mean over the query's other keys."""
    allowed = R.allowed(call)[:, 0]  # [batch, q, k]
    n_q = allowed.shape[1]
    used = allowed[:, :, 0] & (torch.arange(n_q) >= 4)[None] & (allowed.sum(-1) >= 2)
    first = call.probs[..., 0]  # [batch, head, q]
    weight = used[:, None].double()
    n_used = weight.sum((0, 2))
    mean_attention = (first * weight).sum((0, 2)) / n_used
    _close(f"L{layer} sink attention", sinks.mean_attention()[slot], mean_attention, tol, None, 1.0)
    # a query within rounding of ε may fall either side: count the sure ones and the possible ones
    above, near = first > 0.3 + tol, (first - 0.3).abs() <= tol
    low = (above * weight).sum((0, 2)) / n_used
    high = ((above | near) * weight).sum((0, 2)) / n_used
    got = sinks.query_share()[slot].double()
    assert bool(((got >= low - 1e-6) & (got <= high + 1e-6)).all()), (
        f"L{layer} sink query share {got.tolist()} outside [{low.tolist()}, {high.tolist()}]"
    )
    band_terms = _band_terms(terms, rest_term, groups, names)  # [batch, head, band, q, k]
    keys = allowed[:, None, None].double()
    at_first = band_terms[..., 0]
    others = ((band_terms * keys).sum(-1) - at_first) / (keys.sum(-1) - 1).clamp_min(1)
    sink_logit = ((at_first - others) * weight[:, :, None]).sum((0, 3)) / n_used[:, None]
    _close(
        f"L{layer} sink logit by band", sinks.sink_logit()[slot], sink_logit, tol, None, score_scale
    )


def _check_distance(result, slot, call, terms, rest_term, groups, names, tol, layer):
    """Attention by distance against the reference (HoPE): per bin of δ = q − k (keys from
    position 1 on), the mean band logit and the mean attention probability over allowed pairs."""
    allowed = R.allowed(call)[:, 0]  # [batch, q, k]
    n = allowed.shape[1]
    delta = torch.arange(n)[:, None] - torch.arange(n)[None, :]
    pairs = allowed & (torch.arange(n) >= 1)[None, None, :]
    band_terms = _band_terms(terms, rest_term, groups, names)  # [batch, head, band, q, k]
    edges = [int(e) for e in result.edges]
    logits, probs = [], []
    for lo, hi in zip(edges[:-1], edges[1:]):
        in_bin = (pairs & (delta >= lo) & (delta < hi)).double()  # [batch, q, k]
        count = in_bin.sum().clamp_min(1e-300) if in_bin.any() else torch.tensor(float("nan"))
        logits.append((band_terms * in_bin[:, None, None]).sum((0, 3, 4)) / count)
        probs.append((call.probs * in_bin[:, None]).sum((0, 2, 3)) / count)
    want_logit = torch.stack(logits, -1)  # [head, band, bin]
    want_prob = torch.stack(probs, -1)  # [head, bin]
    scale = float(band_terms.abs().max())
    seen = ~want_prob[0].isnan()
    _close(
        f"L{layer} band logit by distance",
        result.band_logit()[slot][..., seen],
        want_logit[..., seen],
        tol,
        None,
        scale,
    )
    _close(
        f"L{layer} probability by distance",
        result.prob()[slot][..., seen],
        want_prob[..., seen],
        tol,
        None,
        1.0,
    )


def _ropelens_dims(case: Case) -> list[int]:
    """HF's dims in ropelens's head layout: a multi-head latent attention head puts its rotary
    dims first (``LayerRope.from_model``), every other head keeps HF's order."""
    if not case.rotary_last:
        return list(range(case.head_dim))
    offset = case.head_dim - case.n_rotary
    return list(range(offset, case.head_dim)) + list(range(offset))


def _check_massive(result, slot, call, case, tol, layer) -> None:
    """Massive values against the reference (Jin et al.): per head and dimension of the pre-RoPE q
    and k, the L2 norm over tokens and the mean, and which dimensions exceed 5× (and 1.5×) their
    head's mean norm, judged where the ratio is beyond rounding of the threshold."""
    order = _ropelens_dims(case)
    layout = case.layout()
    planes = layout.plane_dims()
    for which, pre in zip("qk", R.pre_rope(call, layout)):
        pre = pre[..., order]
        norms = R.dim_norms(pre)
        _close(f"L{layer} massive {which} norm", result.norm(which)[slot], norms, tol)
        _close(
            f"L{layer} massive {which} mean",
            result.mean(which)[slot],
            pre.double().mean((0, 2)),
            tol,
        )
        for factor in (5.0, 1.5):
            ratio, want = R.massive_mask(norms, factor)
            got = result.with_factor(factor).mask(which)[slot]
            decided = (ratio - factor).abs() > tol * ratio.amax(-1, keepdim=True)
            wrong = int((got != want)[decided].sum())
            LARGEST["massive mask (dims decided wrongly)"] = max(
                LARGEST.get("massive mask (dims decided wrongly)", 0.0), wrong
            )
            assert wrong == 0, (
                f"L{layer} massive {which} at {factor}×: {wrong} dims decided otherwise than the "
                f"reference ({got[decided].tolist()} != {want[decided].tolist()})"
            )
            # a plane holds a massive value where either of its dims is massive
            ropelens_dim = {hf: i for i, hf in enumerate(order)}
            pairs = torch.tensor([[ropelens_dim[a], ropelens_dim[b]] for a, b in planes])
            want_plane = want[:, pairs[:, 0]] | want[:, pairs[:, 1]]
            sure = decided[:, pairs[:, 0]] & decided[:, pairs[:, 1]]
            got_plane = result.with_factor(factor).plane_mask(which)[slot]
            assert bool((got_plane == want_plane)[sure].all()), (
                f"L{layer} massive {which} planes at {factor}×: {got_plane.tolist()} != "
                f"{want_plane.tolist()}"
            )


def _check_entropy(result, calls, layout, tol) -> None:
    """Frequency entropy against the reference: per layer (NoPE layers split into the rotary
    layers' planes), head and plane, the normalised spectral entropy of the pre-RoPE query's plane
    norm over positions after the first ``skip``, in order and in the seeded shuffled order, and
    the mean normalised spectrum; means over the windows whose signal varies."""
    skip = result.skip
    perm = torch.randperm(result.n_pos, generator=torch.Generator().manual_seed(result.seed))
    for slot, layer in enumerate(result.layers):
        query = R.pre_rope(calls[layer], layout)[0][:, :, skip:]
        norms = torch.stack(
            [query[..., list(pair)].double().norm(dim=-1) for pair in layout.plane_dims()], 2
        )  # [batch, head, plane, pos]
        for shuffled, signal in ((False, norms), (True, norms[..., perm])):
            h, p = R.spectral_entropy(signal)
            finite = ~h.isnan()
            want = torch.where(finite, h, 0.0).sum(0) / finite.sum(0)
            got = result.entropy(shuffled=shuffled)[slot]
            # an entropy is in [0, 1]: the tolerance is absolute
            _close(f"L{layer} frequency entropy{' shuffled' * shuffled}", got, want, tol, None, 1.0)
            if not shuffled:
                spectrum = torch.where(finite[..., None], p, 0.0).sum((0, 1))
                spectrum = spectrum / finite.sum((0, 1))[:, None]
                _close(
                    f"L{layer} entropy spectrum", result.spectrum()[slot], spectrum, tol, None, 1.0
                )


def _lower_median_of_others(x: torch.Tensor) -> torch.Tensor:
    """Per plane, the lower median of the other planes' values (``[..., plane]``)."""
    out = torch.empty_like(x)
    n = x.shape[-1]
    for i in range(n):
        others = torch.cat([x[..., :i], x[..., i + 1 :]], -1).sort(-1).values
        out[..., i] = others[..., (n - 2) // 2]
    return out


def _check_offsets(result, slot, call, layout, scaling, tol, layer) -> None:
    """Rotary offsets against the reference (Jonasson): over the queries from position 1 on, the
    mean plane norms of q and k and their outlier ratio (NaN where the other planes' median is 0);
    at the key each query attends most, the mean resultant of the q→k angle per plane (post- and
    pre-RoPE) and the plane's mean logit, sink (key 0) and content keys apart, and the share of
    queries whose key is the sink.

    A query whose two best keys are within rounding of each other may pick either: each such query
    of a head widens that head's bound by what one query can move a mean (a value of at most 1, or
    the head's largest plane term, leaving one scope and joining the other)."""
    n_sink = result.n_sink
    n_q = call.query.shape[2]
    counted = (torch.arange(n_q) >= n_sink)[None, None].expand(call.query.shape[0], 1, n_q)
    for which, x in (("q", call.query), ("k", call.key)):
        norm = torch.stack(
            [R.plane_norm_mean(x, p, counted[:, 0]) for p in layout.plane_dims()], -1
        )
        norm = norm / scaling
        _close(f"L{layer} offsets {which} norm", result.norm(which)[slot], norm, tol)
        median = _lower_median_of_others(norm)
        ratio = result.outlier_ratio(which)[slot]
        scaled = median > tol * norm.amax(-1, keepdim=True)
        _close(f"L{layer} offsets {which} outlier ratio", ratio, norm / median, tol, scaled)
        assert bool(ratio[median == 0].isnan().all()), (
            f"L{layer} offsets {which} outlier ratio {ratio[median == 0].tolist()} where the other "
            "planes' median is 0 (want NaN)"
        )
    attended, margin = R.attended_keys(call)
    row_scale = R.scores(call).masked_fill(~R.allowed(call), 0).abs().amax(-1)
    n_ambiguous = ((margin <= tol * row_scale) & counted).double().sum((0, 2))  # [head]
    LARGEST["offsets queries near-tied at the attended key"] = LARGEST.get(
        "offsets queries near-tied at the attended key", 0.0
    ) + float(n_ambiguous.sum())
    sink = attended < n_sink
    scopes = {"sink": sink & counted, "content": ~sink & counted}
    n_all = counted.double().sum((0, 2))

    def within(name, got, want, n, value_bound):
        """|got − want| ≤ tol · value_bound + what the near-tied queries can move a mean of n."""
        n, a = n.expand_as(want), n_ambiguous.reshape(-1, *[1] * (want.ndim - 1)).expand_as(want)
        keep = (n > a) & ~want.isnan()
        slack = 3 * a / (n - a).clamp_min(1) * value_bound
        err = (got.double() - want).abs()
        exact = keep & (a == 0)
        if exact.any():
            LARGEST[name] = max(LARGEST.get(name, 0.0), float(err[exact].max()) / value_bound)
        bad = keep & ~(err <= tol * value_bound + slack)
        assert not bad.any(), (
            f"L{layer} {name}: {got[bad].tolist()} != reference {want[bad].tolist()} "
            f"(near-tied queries {a[bad].tolist()} of {n[bad].tolist()})"
        )

    within(
        "offsets sink fraction",
        result.sink_fraction()[slot],
        (sink & counted).double().sum((0, 2)) / n_all,
        n_all.expand(sink.shape[1]),
        1.0,
    )
    terms, _ = R.plane_terms(call, layout)  # [batch, head, plane, q, k]
    # every plane ablated (a 2-plane head): each term is 0 and is compared absolutely
    term_bound = float(terms.masked_fill(~R.allowed(call)[:, :, None], 0).abs().max()) or 1.0
    sources = {"post": (call.query, call.key), "pre": R.pre_rope(call, layout)}
    for source, (q, k) in sources.items():
        cos, sin, dot = R.plane_angles(q, k, attended, layout)  # [batch, head, q, plane]
        for scope, chosen in scopes.items():
            w = chosen[..., None] & ~cos.isnan()
            n = w.double().sum((0, 2))  # [head, plane]
            resultant = (
                torch.stack(
                    [torch.where(w, cos, 0.0).sum((0, 2)), torch.where(w, sin, 0.0).sum((0, 2))], -1
                )
                / n[..., None]
            )
            within(
                f"offsets {source} {scope} resultant",
                result.resultant(source, scope)[slot],
                resultant,
                n[..., None],
                1.0,
            )
            if source == "post":
                n_scope = chosen.double().sum((0, 2))[:, None]  # [head, 1]
                term = (dot * call.scaling * chosen[..., None]).sum((0, 2)) / n_scope
                within(
                    f"offsets {scope} mean term",
                    result.mean_term(scope)[slot],
                    term,
                    n_scope,
                    term_bound,
                )


def _offset_scores(call, layout, groups, names, max_offset):
    """One pass of head taxonomy's scores in the reference, per head: the mean attention at each
    offset δ = 0..max_offset over the pairs (query i + δ, key i ≥ 1), the mean attention on
    position 0 over queries ≥ 1, and per band the share of its logit's variance over those pairs
    that lies between offsets (η², offsets weighted by their pairs) and the variance within an
    offset (content)."""
    probs = call.probs  # [batch, head, q, k]
    n = probs.shape[-1]
    terms, rest_term = R.plane_terms(call, layout)
    band_terms = _band_terms(terms, rest_term, groups, names).double()  # [batch, head, band, q, k]
    allowed = R.allowed(call)[:, 0]  # [batch, q, k]
    offsets = [
        d for d in range(max_offset + 1) if d < n - 1 and bool(allowed.diagonal(-d, 1, 2).any())
    ]
    mass = torch.zeros(probs.shape[1], max_offset + 1, dtype=torch.float64)
    means, variances, counts = [], [], []
    for d in offsets:
        keys = torch.arange(1, n - d)
        at = probs[:, :, keys + d, keys].double()  # [batch, head, pair]
        mass[:, d] = at.mean((0, 2))
        x = band_terms[:, :, :, keys + d, keys]  # [batch, head, band, pair]
        means.append(x.mean((0, 3)))
        variances.append(x.var((0, 3), unbiased=False))
        counts.append(x.shape[0] * x.shape[3])
    weight = torch.tensor(counts, dtype=torch.float64) / sum(counts)
    mean, within = torch.stack(means, -1), torch.stack(variances, -1)  # [head, band, offset]
    content = (within * weight).sum(-1)
    grand = (mean * weight).sum(-1, keepdim=True)
    position = ((mean - grand) ** 2 * weight).sum(-1)
    sink = probs[:, :, 1:, 0].double().mean((0, 2))
    return mass, sink, position / (position + content), content


def _check_taxonomy(result, slot, call, random_call, layout, groups, names, tol) -> None:
    """Head taxonomy against the reference, on the text and on the random tokens: the attention at
    each offset and on position 0, and each band's position share and content variance (a variance
    scaled by the square of the largest band term); the robust offset mass read from them."""
    max_offset = result.max_offset
    for kind, c in (("text", call), ("random", random_call)):
        mass, sink, share, content = _offset_scores(c, layout, groups, names, max_offset)
        scores = result.scores
        _close(
            f"L{c.layer} taxonomy mass {kind}", scores[f"mass_{kind}"][slot], mass, tol, None, 1.0
        )
        _close(
            f"L{c.layer} taxonomy sink {kind}", scores[f"sink_{kind}"][slot], sink, tol, None, 1.0
        )
        terms, rest_term = R.plane_terms(c, layout)
        band_scale = float(_band_terms(terms, rest_term, groups, names).abs().max()) ** 2
        _close(
            f"L{c.layer} taxonomy content variance {kind}",
            scores[f"content_var_{kind}"][slot],
            content,
            tol,
            None,
            band_scale,
        )
        # a share is ill-defined where its band barely varies: compared where the variance is
        # beyond rounding
        varies = share.isfinite() & (content > tol * band_scale)
        _close(
            f"L{c.layer} taxonomy position share {kind}",
            scores[f"position_share_{kind}"][slot],
            share,
            tol,
            varies,
            1.0,
        )


def _knockout_rows(case: Case, layers: list[int], seed: int) -> list[dict]:
    """Knockouts of the matrix, one per batch row: none; the two highest planes of query head 0;
    every plane of heads 0 and 1 (a whole KV head under grouped-query attention); planes drawn at
    random in head 3 of the last layer. A family whose heads share one rotary key is knocked out in
    every head at once."""
    n_planes = case.n_rotary // 2
    first, last = layers[0], layers[-1]
    drawn = torch.randperm(n_planes, generator=torch.Generator().manual_seed(seed))[:2]
    drawn = tuple(sorted(int(p) for p in drawn))
    heads = (lambda *hs: range(4)) if case.rotary_last else (lambda *hs: hs)
    return [
        {},
        {(first, h): tuple(range(min(2, n_planes))) for h in heads(0)},
        {(first, h): tuple(range(n_planes)) for h in heads(0, 1)},
        {(last, h): drawn for h in heads(3)},
    ]


def _knockout_edits(case: Case, planes: dict) -> dict:
    """The reference's knockout (the keywords of :func:`R.recorded_attention`): each (layer,
    head)'s planes zeroed in the rotated query, and in a KV head the dims every query head reading
    it has zeroed; at the rotation's output where a norm follows it, as in an ablation."""
    pairs = case.layout().plane_dims()

    def dims(layer, head):
        return [d for p in planes.get((layer, head), ()) for d in pairs[p]]

    def edit_query(layer, query):
        query = query.clone()
        for h in range(query.shape[1]):
            query[:, h, :, dims(layer, h)] = 0
        return query

    def edit_key(layer, key):
        key = key.clone()
        group = 4 // key.shape[1]
        for kv in range(key.shape[1]):
            shared = set(dims(layer, kv * group))
            for g in range(1, group):
                shared &= set(dims(layer, kv * group + g))
            key[:, kv, :, sorted(shared)] = 0
        return key

    return {"edit_query": edit_query, "edit_key": edit_key, "edit_at": case.edit_at()}


def check_knockout(models, family, dtype, prope, seed) -> None:
    """Knockout against the reference: with one knockout per batch row (:func:`probe_rows`), the
    attention of every head of the knocked-out layers at offsets 0 and 1 (queries and keys ≥ 1) as
    HF's eager attention gives it with the same planes zeroed; and with a knockout in force
    (:func:`knocked_out`), each window's loss."""
    case = MATRIX[family]
    model, hf, rotary = models(family, dtype)
    tol = TOLERANCE[dtype]
    layers = [rotary[0], rotary[-1]]
    rows = _knockout_rows(case, layers, seed)
    window = torch.randint(4, 100, (24,), generator=torch.Generator().manual_seed(seed))
    window[0] = 1
    probe_heads = [(L, h) for L in sorted(set(layers)) for h in range(4)]
    with contextlib.ExitStack() as stack:
        if prope:
            stack.enter_context(ropelens.apply_rope_variant(model, PRoPE(0.5)))
            stack.enter_context(_reference_prope(hf, 0.5))
        got = probe_rows(model, window, rows, probe_heads)  # [row, probe head, offset]
        tokens = window.reshape(2, 12).clone()
        tokens[:, 0] = 1
        with knocked_out(model, rows[2]):
            got_loss = window_losses(model, tokens, progress=False)
        want = torch.zeros(got.shape, dtype=torch.float64)
        for b, planes in enumerate(rows):
            edits = _knockout_edits(case, planes)
            with (
                R.recorded_attention(hf, **edits) as calls,
                torch.no_grad(),
            ):
                hf(input_ids=window[None])
            for i, (L, h) in enumerate(probe_heads):
                probs = calls[L].probs[0, h]  # [q, k]
                for d in (0, 1):
                    want[b, i, d] = probs[torch.arange(1 + d, 24), torch.arange(1, 24 - d)].mean()
        _close("knockout mass [row, head, offset]", got, want, tol, None, 1.0)
        edits = _knockout_edits(case, rows[2])
        with R.recorded_attention(hf, **edits):
            want_loss = torch.tensor([R.loss(hf, row[None]) for row in tokens])
    err = float((got_loss.double() - want_loss.double()).abs().max())
    LARGEST["knockout loss"] = max(LARGEST.get("knockout loss", 0.0), err)
    assert err <= tol * max(1.0, float(want_loss.abs().max())), (
        f"knockout loss {got_loss.tolist()} != reference {want_loss.tolist()}"
    )


@settings(
    max_examples=max(4, EXAMPLES // 4),
    deadline=None,
    derandomize=True,
    print_blob=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    family=st.sampled_from([f for f in KNOCKOUT_FAMILIES if _runs(f, "knockout float32")]),
    dtype=st.sampled_from([torch.float32, torch.bfloat16]),
    prope=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_knockout_matches_its_reference(models, family, dtype, prope, seed):
    dtype = dtype if dtype in _dtypes(family) else torch.float32
    check_knockout(models, family, dtype, prope and _prope(family), seed)


@pytest.mark.skipif(
    not os.environ.get("ROPELENS_ORACLE_GRID"),
    reason="the whole grid is the release profile: ROPELENS_ORACLE_GRID=1",
)
@pytest.mark.parametrize(
    ("family", "prope", "dtype"),
    [
        pytest.param(
            f,
            p,
            d,
            id=f"{f}-{'prope' if p else 'none'}-{_dtype_name(d)}",
            marks=_expected_to_fail(f, f"knockout {_dtype_name(d)}"),
        )
        for f in KNOCKOUT_FAMILIES
        for p in (False, True)
        for d in _dtypes(f)
        if not p or _prope(f)
    ],
)
def test_knockout_in_every_cell(models, family, prope, dtype):
    with _errors_kept_if_it_passes():
        check_knockout(models, family, dtype, prope, 0)
    _cell_done(f"knockout {family}/{'prope' if prope else 'none'}/{dtype}")


def _reference_copy_scores(hf, tokenizer, prompt_ids: list[int], passkey: str, tol: float, edits):
    """Retrieval scores in the reference (Wu et al.): the prompt followed by the answer
    `` <passkey>``, one eager forward; for each answer token holding a digit, the query before it
    and its sources, the positions of the same token in every occurrence of the answer inside the
    prompt; a head's score is the fraction of those steps whose most attended key (the earliest on
    a tie) is a source. Also, per head, the steps whose two best keys are within rounding."""
    answer = list(tokenizer(" " + passkey, add_special_tokens=False)["input_ids"])
    n, m = len(prompt_ids), len(answer)
    starts = [o for o in range(n - m + 1) if prompt_ids[o : o + m] == answer]
    steps = [
        (n + i - 1, [o + i for o in starts])
        for i, t in enumerate(answer)
        if any(c.isdigit() for c in tokenizer.decode([t]))
    ]
    with (
        R.recorded_attention(hf, **edits) as calls,
        torch.no_grad(),
    ):
        hf(input_ids=torch.tensor([prompt_ids + answer]))
    hits = torch.zeros(len(calls), calls[0].probs.shape[1], dtype=torch.float64)
    near = torch.zeros_like(hits)
    for layer, call in calls.items():
        for query, sources in steps:
            row = call.probs[0, :, query]  # [head, key]
            top = row.topk(2, -1).values
            hits[layer] += torch.isin(row.argmax(-1), torch.tensor(sources)).double()
            near[layer] += (top[:, 0] - top[:, 1] <= tol * top[:, 0]).double()
    return hits / len(steps), near / len(steps), len(steps)


def _reference_greedy(hf, tokenizer, prompt_ids: list[int], tol: float, max_new_tokens: int = 8):
    """Greedy continuation in the reference (a full forward per step), stopping at EOS or once a
    whole number has been written, and how many steps were decided beyond rounding (a step whose
    two best logits are within rounding may go either way)."""
    import re

    out: list[int] = []
    decided = None
    for i in range(max_new_tokens):
        with torch.no_grad():
            logits = hf(input_ids=torch.tensor([prompt_ids + out])).logits[0, -1].float()
        top = logits.topk(2).values
        if decided is None and float(top[0] - top[1]) <= tol * float(logits.abs().max()):
            decided = i
        nxt = int(logits.argmax())
        out.append(nxt)
        if nxt == tokenizer.eos_token_id or i == max_new_tokens - 1:
            break
        if re.search(r"\d+\D", tokenizer.decode(out)):
            break
    return out, len(out) if decided is None else decided


def check_retrieval(models, family, dtype, intervention, seed) -> None:
    """Retrieval scores and passkey retrieval against the reference, on a 280-token passkey
    prompt: each head's score (a head may differ by the steps whose best keys are within
    rounding), and the greedy answer (equal up to the first step decided within rounding)."""
    case = MATRIX[family]
    model, hf, rotary = models(family, dtype)
    tol = TOLERANCE[dtype]
    tokenizer = model.tokenizer
    n_planes = case.n_rotary // 2
    heads = list(range(4)) if case.rotary_last else [0, 2]
    ablated = [d for p in (0, n_planes - 1) for d in case.layout().plane_dims()[p]]
    ablating = intervention == "ablate"
    edits = _ablation_edits(case, ablating, rotary, heads, ablated)
    prompt = passkey_prompt(tokenizer, 280, 0.5, make_passkey(seed, 0))
    with contextlib.ExitStack() as stack:
        if intervention == "prope":
            stack.enter_context(ropelens.apply_rope_variant(model, PRoPE(0.5)))
            stack.enter_context(_reference_prope(hf, 0.5))
        if ablating:
            stack.enter_context(ropelens.ablate_planes(model, [0, n_planes - 1], heads=heads))
        got, got_steps = retrieval_scores(
            model, lengths=(280,), depths=(0.5,), n_trials=1, seed=seed
        )
        passkey = passkey_retrieval(
            model, [280], [0.5], n_trials=1, seed=seed, progress=False
        ).trials[0]
        want, near, steps = _reference_copy_scores(
            hf, tokenizer, prompt.tokens.tolist(), prompt.passkey, tol, edits
        )
        with R.recorded_attention(hf, **edits):
            ids, decided = _reference_greedy(hf, tokenizer, prompt.tokens.tolist(), tol)
    assert got_steps == steps, f"retrieval copy steps {got_steps} != reference {steps}"
    err = (got - want).abs() - near
    LARGEST["retrieval score (beyond near-tied steps)"] = max(
        LARGEST.get("retrieval score (beyond near-tied steps)", 0.0), float(err.max())
    )
    assert bool((err <= 1e-9).all()), (
        f"retrieval scores {got.tolist()} != reference {want.tolist()} beyond near ties"
    )
    want_text = tokenizer.decode(ids[:decided])
    whole = decided == len(ids)
    agrees = passkey.response == want_text if whole else passkey.response.startswith(want_text)
    LARGEST["passkey answers differing"] = LARGEST.get("passkey answers differing", 0.0) + (
        not agrees
    )
    assert agrees, f"passkey answer {passkey.response!r} != reference {tokenizer.decode(ids)!r}"


@settings(
    max_examples=max(3, EXAMPLES // 6),
    deadline=None,
    derandomize=True,
    print_blob=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    family=st.sampled_from(RETRIEVAL_FAMILIES),
    dtype=st.sampled_from([torch.float32, torch.bfloat16]),
    intervention=st.sampled_from(["none", "prope", "ablate"]),
    seed=st.integers(0, 2**10),
)
def test_retrieval_matches_its_reference(models, family, dtype, intervention, seed):
    runs = _runs(family, intervention, f"retrieval {intervention}")
    if intervention == "prope" and not _prope(family) or not runs:
        intervention = "none"
    dtype = dtype if dtype in _dtypes(family) else torch.float32
    check_retrieval(models, family, dtype, intervention, seed)


@pytest.mark.skipif(
    not os.environ.get("ROPELENS_ORACLE_GRID"),
    reason="the whole grid is the release profile: ROPELENS_ORACLE_GRID=1",
)
@pytest.mark.parametrize(
    ("family", "intervention", "dtype"),
    [
        pytest.param(
            f,
            i,
            d,
            id=f"{f}-{i}-{_dtype_name(d)}",
            marks=_expected_to_fail(f, f"retrieval {i} {_dtype_name(d)}"),
        )
        for f in RETRIEVAL_FAMILIES
        for i in ("none", "prope", "ablate")
        for d in _dtypes(f)
        if (i != "prope" or _prope(f)) and f"retrieval {i}" not in REFUSED.get(f, {})
    ],
)
def test_retrieval_in_every_cell(models, family, intervention, dtype):
    with _errors_kept_if_it_passes():
        check_retrieval(models, family, dtype, intervention, 0)
    _cell_done(f"retrieval {family}/{intervention}/{dtype}")


def _band_shares(call, layout, groups, names, scaling) -> tuple[torch.Tensor, torch.Tensor]:
    """Per head and band ``[head, band]``: the share of the query's mean squared norm as the
    attention scores it (positions from 1 on; the rotary dims without the rotation's gain), and
    the share of the summed |band logit| over the allowed pairs."""
    planes = layout.plane_dims()
    claimed = {p for g in groups for p in g}
    dims_of = [[d for p in g for d in planes[p]] for g in groups]
    if "rest" in names:
        unclaimed = [d for p in range(len(planes)) if p not in claimed for d in planes[p]]
        dims_of.append(unclaimed + layout.unrotated_dims())
    rotary = {d for pair in planes for d in pair}
    after_sink = torch.ones(call.query.shape[0], call.query.shape[2], dtype=torch.bool)
    after_sink[:, 0] = False
    energy = torch.stack(
        [
            R.energy_by_dims(call.query, [d for d in dims if d in rotary], after_sink) / scaling**2
            + R.energy_by_dims(call.query, [d for d in dims if d not in rotary], after_sink)
            for dims in dims_of
        ],
        -1,
    )
    terms, rest_term = R.plane_terms(call, layout)
    band_terms = _band_terms(terms, rest_term, groups, names)
    allowed = R.allowed(call).expand(-1, terms.shape[1], -1, -1)
    abs_sum = (band_terms.abs() * allowed[:, :, None]).sum((0, 3, 4))
    return energy / energy.sum(-1, keepdim=True), abs_sum / abs_sum.sum(-1, keepdim=True)


def _check_intervention_effect(model, hf, draw, tokens, layers, bands, groups, layout, calls, tol):
    """Intervention effect against the reference: per layer and band, the heads' mean energy share
    of the queries as the attention scores them and the heads' mean |logit| share, without the
    intervention (HF's forward as it is) and with it (the recorded forward of the drawn case)."""

    @contextlib.contextmanager
    def intervention(m):
        with contextlib.ExitStack() as stack:
            if draw["intervention"] in ("prope", "both"):
                stack.enter_context(ropelens.apply_rope_variant(m, PRoPE(0.5)))
            if draw["intervention"] in ("ablate", "both"):
                heads = draw["heads"] if draw["heads"] is not None else list(range(4))
                stack.enter_context(
                    ropelens.ablate_planes(m, draw["planes"], layers=layers, heads=heads)
                )
            yield

    effect = intervention_effect(model, intervention, tokens, layers=layers, bands=bands)
    with R.recorded_attention(hf) as unmodified, torch.no_grad():
        hf(input_ids=tokens)
    scaling = _attention_scaling(hf)
    names = effect.band_names
    for condition, recorded in enumerate((unmodified, calls)):
        for slot, layer in enumerate(layers):
            energy, logit = _band_shares(recorded[layer], layout, groups, names, scaling)
            _close(
                f"L{layer} intervention effect energy",
                effect.energy[condition, slot],
                energy.mean(0),
                tol,
                None,
                1.0,
            )
            _close(
                f"L{layer} intervention effect |logit| share",
                effect.logit_share[condition, slot],
                logit.mean(0),
                tol,
                None,
                1.0,
            )


def _mrope_axes(text_config, n_planes: int) -> list[int]:
    """Each plane's axis (0 t, 1 h, 2 w) by HF's M-RoPE: contiguous ``mrope_section`` blocks,
    highest frequencies first, or with ``mrope_interleaved`` planes i ≡ 1 (mod 3) below
    3·section[1] on height, i ≡ 2 below 3·section[2] on width, the rest on time."""
    rope = text_config.rope_parameters
    sections = list(rope["mrope_section"])
    if not rope.get("mrope_interleaved", False):
        return [a for a, s in enumerate(sections) for _ in range(s)][:n_planes]
    axes = [0] * n_planes
    for axis in (1, 2):
        for i in range(axis, min(n_planes, 3 * sections[axis]), 3):
            axes[i] = axis
    return axes


@functools.cache
def _vl_model(family: str, dtype: torch.dtype):
    from ropelens.testing.vl import vl_hf_model

    return vl_hf_model(family).to(dtype)


MROPE_GRID = [
    pytest.param(f, d, g, id=f"{f}-{str(d).split('.')[-1]}-{len(g)}image")
    for f in ("qwen2_vl", "qwen3_vl", "qwen3_5")
    for d in (torch.float32, torch.bfloat16)
    for g in (((1, 4, 6),), ((1, 2, 4), (1, 4, 2)))
]


@pytest.mark.parametrize(("family", "dtype", "grids"), MROPE_GRID)
def test_mrope_decomposition_matches_its_reference(family, dtype, grids):
    """M-RoPE decomposition against the reference: per layer, each axis's logit term (its planes'
    terms summed; ``rest`` the unrotated dims) over the allowed pairs, the pattern, and each axis's
    share of |logit| over all pairs, on images of one and two grids between text."""
    from ropelens.analyses.mrope_decomposition import mrope_decomposition
    from ropelens.testing.vl import vl_inputs

    hf = _vl_model(family, dtype)
    inputs = vl_inputs(hf, grids)
    dec = mrope_decomposition(hf, **inputs)
    image = hf.config.image_token_id
    with R.recorded_attention(hf) as calls, torch.no_grad():
        hf(**inputs, mm_token_type_ids=(inputs["input_ids"] == image).long())
    text = hf.config.get_text_config()
    head_dim = calls[dec.layers[0]].query.shape[-1]
    n_rotary = int(head_dim * text.rope_parameters.get("partial_rotary_factor", 1.0))
    layout = R.Layout(head_dim, n_rotary)
    axes = _mrope_axes(text, n_rotary // 2)
    tol = TOLERANCE[dtype]
    for layer in dec.layers:
        call = calls[layer]
        terms, rest_term = R.plane_terms(call, layout)
        by_axis = {
            name: terms[:, :, [i for i, a in enumerate(axes) if a == k]].sum(2)
            for k, name in enumerate("thw")
        }
        by_axis["rest"] = rest_term
        names = dec.band_names(layer)
        want = torch.stack([by_axis[n] for n in names], 2)  # [batch, head, axis, q, k]
        entry = R.allowed(call)[:, :, None].expand_as(want)
        score_scale = float(R.scores(call).masked_fill(~R.allowed(call), 0).abs().max())
        got = dec.band_logits(layer, masked=False)
        _close(f"L{layer} mrope axis logits", got, want, tol, entry, score_scale)
        _close(f"L{layer} mrope pattern", dec.pattern(layer), call.probs, tol, None, 1.0)
        abs_sum = torch.where(entry, want.abs(), 0.0).sum((0, 3, 4))  # [head, axis]
        share = (abs_sum / abs_sum.sum(-1, keepdim=True)).double()
        frame = dec.axis_shares()
        rows = frame[(frame["layer"] == layer) & (frame["pair"] == "all")]
        shares = {(r["head"], r["axis"]): r["abs_share"] for _, r in rows.iterrows()}
        got_share = torch.tensor(
            [[shares[(h, n)] for n in names] for h in range(share.shape[0])], dtype=torch.float64
        )
        _close(f"L{layer} mrope |logit| share", got_share, share, tol, None, 1.0)
    _cell_done(f"mrope {family}/{dtype}/{len(grids)}-image")


@pytest.mark.parametrize("family", ["llama", "gemma2", "deepseek_v3", "smollm3"])
def test_trajectory_matches_its_reference(family, family_dir, tmp_path):
    """Trajectory against the reference, over two checkpoints (the family's model and one drawn
    with another seed) on the corpus file: per checkpoint the massive query dimensions per layer
    and the largest ratio (the pre-RoPE q's dimension norms over their head's mean, massive above
    5×), and the mean attention to position 0 over every head and the share of heads above ε = 0.3
    per layer (queries from position 4 on that see position 0). Counts are compared where no
    value sits within rounding of its threshold."""
    from ropelens.analyses.trajectory import trajectory
    from ropelens.testing.families import family_model_dir

    checkpoints = [family_dir(family), family_model_dir(family, tmp_path / "other", seed=1)]
    got = trajectory(
        [str(c) for c in checkpoints],
        steps=[0, 1],
        analyses=["massive", "sinks"],
        corpus=_corpus_file(),
        n_tokens=48,
        n_ctx=24,
        device="cpu",
    ).to_frame()
    layout = MATRIX[family].layout()
    tol = TOLERANCE[torch.float32]
    for step, path in enumerate(checkpoints):
        model = ropelens.load_model(path, device="cpu")
        tokens = data.analysis_windows(model, _corpus_file(), 24, 48)[0]
        hf = AutoModelForCausalLM.from_pretrained(path, attn_implementation="eager").eval()
        with R.recorded_attention(hf) as calls, torch.no_grad():
            hf(input_ids=tokens)
        rows = got[got["step"] == step]

        def value(metric, layer=-1, rows=rows):
            return rows[(rows["metric"] == metric) & (rows["layer"] == layer)]["value"]

        ratios, sink_means = [], []
        for layer in sorted(set(rows[rows["metric"] == "massive_dims"]["layer"]) - {-1}):
            norms = R.dim_norms(R.pre_rope(calls[layer], layout)[0])
            ratio, massive = R.massive_mask(norms, 5.0)
            ratios.append(ratio)
            if bool(((ratio - 5.0).abs() > tol * ratio.amax(-1, keepdim=True)).all()):
                assert float(value("massive_dims", layer).iloc[0]) == float(massive.sum())
        _close(
            "trajectory massive max ratio",
            torch.tensor([float(value("massive_max_ratio").iloc[0])]),
            torch.tensor([float(torch.stack(ratios).max())]),
            tol,
        )
        for layer in sorted(set(rows[rows["metric"] == "sink_head_share"]["layer"]) - {-1}):
            call = calls[layer]
            seen = R.allowed(call)[:, 0]  # [batch, q, k]
            used = seen[:, :, 0] & (torch.arange(seen.shape[1]) >= 4) & (seen.sum(-1) >= 2)
            weight = used[:, None].double()  # queries from 4 on that see position 0
            first = (call.probs[..., 0] * weight).sum((0, 2)) / weight.sum((0, 2))  # [head]
            sink_means.append(first)
            if bool(((first - 0.3).abs() > tol).all()):
                share = float((first > 0.3).double().mean())
                assert math.isclose(float(value("sink_head_share", layer).iloc[0]), share)
        _close(
            "trajectory sink attention",
            torch.tensor([float(value("sink_attention").iloc[0])]),
            torch.tensor([float(torch.cat(sink_means).mean())]),
            tol,
            None,
            1.0,
        )
    _cell_done(f"trajectory {family}")
