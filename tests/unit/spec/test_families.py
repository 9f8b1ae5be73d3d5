"""Every RoPE family HF ships: exact against HF's eager attention, or refused with a clear error.

The tiny models come from :mod:`ropelens.testing.families` (windows shorter than the input, q/k
weights scaled so attention is far from uniform), are saved to a directory and loaded with
``load_model(path)``; the reference numbers are HF's own (rotary buffers, eager scores and
probabilities), never ropelens's.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib.util
import sys

import pytest
import torch
from transformers import AutoModelForCausalLM

import ropelens
from ropelens import Bands
from ropelens.analyses.band_statistics import BandStatsReducer
from ropelens.analyses.head_taxonomy import HeadScoresReducer
from ropelens.backends.bridge_hooks import attn_hooks
from ropelens.errors import UnsupportedModelError
from ropelens.run.capture import batches, capture_qk, stream
from ropelens.run.intervene import apply_rope_variant, spec_with_variant
from ropelens.run.verify import rotation_error, rotation_from_pre
from ropelens.spec.reading import rope_spec
from ropelens.spec.variants import BaseChange, PRoPE
from ropelens.testing.families import FAMILIES, N_CHECK, family_model_dir
from tests.harness.dense import dense_layer_sums, hf_layers
from tests.harness.families import check_family, probs_by_layer
from tests.unit.analyses.test_band_tiles import _hand_planes, assert_sums_match

# the module itself, to patch its constant (ropelens.analyses.band_statistics is the function)
BAND_STATISTICS_MODULE = importlib.import_module("ropelens.analyses.band_statistics")

EXACT = [f for f, fam in FAMILIES.items() if fam.refused is None]
REFUSED = [f for f, fam in FAMILIES.items() if fam.refused is not None and fam.refused_at == "spec"]
BRIDGED = [f for f in EXACT if FAMILIES[f].bridge]  # interventions run through the bridge's hooks
# q/k normalised after RoPE: an ablation of the rotated q/k is renormalised by the norm, so it does
# not remove exactly that plane's term of the score (NanoChat's bridge runs the HF attention whole:
# its variants and ablations are applied at the rotation that attention calls, by
# ropelens.backends.engine)
NORM_AFTER_ROPE = ("hunyuan_v1_dense", "nanochat")


def _available(name: str) -> bool:
    import transformers

    return hasattr(transformers, FAMILIES[name].config_class)


def _param(name: str):
    why = (
        f"transformers {importlib.metadata.version('transformers')} has no "
        f"{FAMILIES[name].config_class}"
    )
    return pytest.param(name, marks=pytest.mark.skipif(not _available(name), reason=why))


@pytest.fixture(scope="module")
def hf_eager(family_dir):
    """``hf_eager(family)``: HF's own model of the family (eager attention), from the directory
    ropelens loads."""
    return functools.cache(
        lambda name: AutoModelForCausalLM.from_pretrained(
            family_dir(name), attn_implementation="eager"
        ).eval()
    )


@pytest.mark.parametrize("family", [_param(f) for f in EXACT])
def test_family_is_exact_against_hf(family, tmp_path):
    """Spec, plane pairing, summed band logits and rebuilt patterns all equal HF's own numbers."""
    r = check_family(family, workdir=tmp_path)
    assert r.refusal is None
    assert r.spec_errors == []
    assert r.inv_freq_err == 0.0
    assert r.pairing_err < 1e-5
    assert r.scores_err < 1e-5  # relative to the largest score
    assert r.pattern_err < 1e-4
    assert r.band_pattern_err < 1e-4
    assert r.exact


@pytest.mark.parametrize("family", [_param(f) for f in REFUSED])
def test_unsupported_family_is_refused_by_every_analysis(family, tmp_path):
    """A family ropelens cannot measure exactly raises UnsupportedModelError naming it, never a
    number."""
    model = ropelens.load_model(family_model_dir(family, tmp_path / family), device="cpu")
    with pytest.raises(UnsupportedModelError, match=FAMILIES[family].refused) as err:
        rope_spec(model)
    assert type(model.original_model).__name__ in str(err.value)
    toks = torch.randint(4, 100, (1, 16))
    for run in (
        lambda: ropelens.analyses.frequency_usage(model, toks, progress=False),
        lambda: ropelens.analyses.attention_decomposition(model, toks),
        lambda: ropelens.analyses.band_statistics(model, toks, progress=False),
    ):
        with pytest.raises(UnsupportedModelError):
            run()


def _hand_plane_norms(x: torch.Tensor, rotary_dim: int, pairing: str) -> torch.Tensor:
    """‖x^(i)‖ with the family's pairing written out: (i, i + d/2) or (2i, 2i + 1)."""
    n = rotary_dim // 2
    if pairing == "half":
        a, b = x[..., :n], x[..., n:rotary_dim]
    else:
        a, b = x[..., 0:rotary_dim:2], x[..., 1:rotary_dim:2]
    return (a**2 + b**2).sqrt()


def _positional_len(spec) -> int:
    """Input length for analyses that build masks from positions: N_CHECK, or the shortest chunk of
    a chunked layer (Llama 4), which they refuse past and inside which the mask is causal."""
    return min([N_CHECK] + [spec[L].chunk for L in spec.rotary_layers if spec[L].chunk])


@pytest.mark.parametrize("family", [_param(f) for f in EXACT])
def test_analyses_run_and_are_right(family, family_model, hf_eager):
    """Usage equals hand plane norms of the captured queries; band statistics run on every rotary
    layer."""
    model, spec = family_model(family)
    fam = FAMILIES[family]
    g = torch.Generator().manual_seed(1)
    toks = torch.randint(4, 100, (2, N_CHECK), generator=g)
    toks[:, 0] = 1
    usage = ropelens.analyses.frequency_usage(model, toks, progress=False, n_sink=0)
    assert (
        list(usage.layers)
        == spec.rotary_layers
        == [
            i
            for i in range(spec.n_layers)
            if i not in fam.nope_layers and i not in fam.mixer_layers
        ]
    )
    acts = capture_qk(model, toks, which=("q_pre", "k_pre"))
    for i, L in enumerate(usage.layers):
        lr = spec[L]
        want_q = _hand_plane_norms(acts[L]["q_pre"], lr.rotary_dim, fam.pairing).mean((0, 1))
        want_k = _hand_plane_norms(acts[L]["k_pre"], lr.rotary_dim, fam.pairing).mean((0, 1))
        # layers of other widths (Gemma 4) share the array: a layer's own heads and planes lead, the
        # rest is NaN
        for got, want in ((usage.q_norm[i], want_q), (usage.k_norm[i], want_k)):
            h, p = want.shape
            torch.testing.assert_close(got[:h, :p].float(), want.float(), rtol=1e-5, atol=1e-6)
            assert got[h:].isnan().all() and got[:, p:].isnan().all()
    short = _positional_len(spec)
    if short < N_CHECK:
        with pytest.raises(
            UnsupportedModelError, match=f"chunks of {short} tokens .* band statistics"
        ):
            ropelens.analyses.band_statistics(model, toks, progress=False)
        toks = toks[:, :short]
    with torch.no_grad():
        probs = probs_by_layer(hf_eager(family)(toks, output_attentions=True).attentions, spec)
    for group in spec.width_groups().values():  # bands fitted to each width's planes
        st = ropelens.analyses.band_statistics(
            model,
            toks,
            layers=group,
            progress=False,
            bands=Bands.quantiles(2) if spec[group[0]].n_planes >= 2 else Bands.all(),
        )
        assert list(st.layers) == group
        assert torch.isfinite(
            torch.as_tensor(st.to_frame()["margin_share"].to_numpy().copy())
        ).any()

        # heads: attention mass at each offset equals HF's own probabilities on those diagonals
        red = HeadScoresReducer(spec, group, Bands.all(), max_offset=3)
        stream(model, batches(toks, 2), [red], layers=group, spec=spec, progress=False)
        mass = red.scores("text")["mass_text"]
        for i, L in enumerate(group):
            for d in range(4):
                diag = probs[L].diagonal(offset=-d, dim1=2, dim2=3)[
                    ..., 1:
                ]  # queries ≥ 1 + d, keys ≥ 1
                torch.testing.assert_close(
                    mass[i, :, d].float(), diag.mean((0, 2)), rtol=1e-4, atol=1e-6
                )


@pytest.mark.parametrize("family", [_param(f) for f in BRIDGED])
def test_variants_rotate_what_the_spec_says_and_restore(family, family_model):
    """Under a variant the captured rotated query (before a norm after RoPE) turns by the variant's
    frequencies; exit restores."""
    model, spec = family_model(family)
    toks = torch.randint(4, 100, (1, N_CHECK), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        before = model(toks)
    L = spec.rotary_layers[0]
    lr0 = spec[L]
    variant = PRoPE(0.5) if lr0.n_planes >= 2 else BaseChange(1e3)
    same = torch.full((1, N_CHECK), 7)
    if (
        family == "granitemoehybrid"
    ):  # its attention gets no position_ids: variants refuse it in one line
        with (
            pytest.raises(UnsupportedModelError, match="cannot be applied to this model"),
            apply_rope_variant(model, variant),
        ):
            capture_qk(model, same, layers=[L], which=("q_rot",))
        return
    with apply_rope_variant(model, variant):
        got = capture_qk(model, same, layers=[L], which=("q_pre", "q_rot"))[L]
    q, pre = got["q_rot"][0], got["q_pre"][0]
    lr = spec_with_variant(spec, variant)[L]
    # a hybrid's layers before the first attention layer mix positions: then rotate the captured
    # pre-RoPE query
    same_pre = float((pre - pre[:1]).abs().max()) <= 1e-6 * float(pre.abs().max())
    assert (rotation_error(lr, q) if same_pre else rotation_from_pre(lr, pre, q)) < 1e-5
    with torch.no_grad():
        assert torch.equal(model(toks), before)


def test_matrix_covers_the_issue_families():
    want = {
        "llama",
        "mistral",
        "mixtral",
        "qwen2",
        "qwen3",
        "phi3",
        "phi",
        "gpt_neox",
        "gemma",
        "gemma2",
        "gemma3_text",
        "olmo2",
        "stablelm",
        "starcoder2",
        "granite",
        "cohere",
        "glm",
        "smollm3",
        "gpt_oss",
        "deepseek_v3",
        "qwen3_next",
        "llama4",
        "cohere2",
        "exaone4",
        "gemma4_text",
        "hunyuan_v1_dense",
        "nanochat",
        "falcon",
        "ministral",
        "helium",
        "persimmon",
        "phimoe",
        "diffllama",
        "minicpm3",
        "qwen3_5_text",
        "lfm2",
        "falcon_h1",
        "bamba",
        "granitemoehybrid",
        "recurrent_gemma",
        "olmo_hybrid",
        "deepseek_v2",
        "glm4_moe_lite",
    }
    assert (
        set(FAMILIES) == want
    )  # the families beyond the first 22 are tested in test_new_families.py
    assert len(REFUSED) <= 6


def test_pairing_check_catches_a_wrong_pairing(family_model, monkeypatch):
    """Cohere rotates adjacent pairs: a spec that says "half" fails the pairing check (logits do
    not)."""
    import dataclasses

    import ropelens.spec.reading as spec_mod

    orig = spec_mod.rope_spec

    def wrong(model, **reading_options):
        s = orig(model, **reading_options)
        return dataclasses.replace(
            s, layers=tuple(dataclasses.replace(lr, pairing="half") for lr in s.layers)
        )

    # every module that reads the spec imported rope_spec at its top (the harness's check too):
    # replace it in each
    for module in list(sys.modules.values()):
        if (
            getattr(module, "__name__", "").startswith(("ropelens", "tests.harness"))
            and getattr(module, "rope_spec", None) is orig
        ):
            monkeypatch.setattr(module, "rope_spec", wrong)
    r = check_family("cohere")
    assert r.pairing_err > 0.1 and r.pattern_err < 1e-4  # the summed logits cannot see it
    assert not r.exact


_REAL_SCALING = {
    "llama3 (Llama 3.1)": (
        "LlamaConfig",
        dict(
            head_dim=16,
            rope_parameters={
                "rope_type": "llama3",
                "rope_theta": 500000.0,
                "factor": 8.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 64,
            },
        ),
    ),
    "yarn (Qwen 2.5)": (
        "Qwen2Config",
        dict(
            rope_parameters={
                "rope_type": "yarn",
                "rope_theta": 1000000.0,
                "factor": 4.0,
                "original_max_position_embeddings": 64,
            }
        ),
    ),
    "longrope (Phi-3)": (
        "Phi3Config",
        dict(
            rope_parameters={
                "rope_type": "longrope",
                "rope_theta": 10000.0,
                "original_max_position_embeddings": 64,
                "short_factor": [1.0, 1.1, 1.3, 1.6, 2.0, 2.5, 3.1, 3.8],
                "long_factor": [1.0, 1.5, 2.4, 3.9, 6.0, 9.0, 13.0, 18.0],
            }
        ),
    ),
    "yarn + attention scaling (gpt-oss)": (
        "GptOssConfig",
        dict(
            FAMILIES["gpt_oss"].config,
            rope_parameters=FAMILIES["gpt_oss"].config["rope_parameters"],
        ),
    ),
}


@pytest.mark.parametrize("case", list(_REAL_SCALING))
def test_real_scaling_configs_read_as_hf_initialises_them(case):
    """The spec's frequencies and attention scaling equal HF's rope init function for that
    config."""
    import transformers
    from transformers import AutoModelForCausalLM
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    from ropelens.loading.models import wrap_hf_model
    from ropelens.testing import tiny_tokenizer
    from ropelens.testing.families import _BASE

    cls_name, kw = _REAL_SCALING[case]
    cfg = getattr(transformers, cls_name)(**{**_BASE, **kw})
    torch.manual_seed(0)
    hf = AutoModelForCausalLM.from_config(cfg, attn_implementation="eager").eval()
    hf.config.architectures = [type(hf).__name__]  # the bridge picks its adapter by this name
    spec = rope_spec(wrap_hf_model(hf, tiny_tokenizer(), device="cpu", label=case))
    rtype = cfg.rope_parameters["rope_type"]
    inv, factor = ROPE_INIT_FUNCTIONS[rtype](cfg, "cpu")
    for L in spec.rotary_layers:
        assert spec[L].rope_type == rtype
        torch.testing.assert_close(spec[L].inv_freq, inv.float(), rtol=0, atol=0)
        assert spec[L].attention_scaling == pytest.approx(float(factor), rel=1e-12)


@pytest.mark.parametrize("family", [_param(f) for f in BRIDGED if f not in NORM_AFTER_ROPE])
def test_ablating_a_plane_removes_exactly_its_term(family, family_model):
    """In the first rotary layer, logits under ablate_planes([0]) = logits − plane 0's term, on
    every family."""
    from ropelens.run.intervene import ablate_planes

    model, spec = family_model(family)
    L = spec.rotary_layers[0]
    toks = torch.randint(4, 100, (1, N_CHECK), generator=torch.Generator().manual_seed(3))
    dec = ropelens.analyses.attention_decomposition(model, toks, bands=Bands.planes(), layers=[L])
    want = dec.logits(L) - dec.plane_logits(L)[:, :, 0]
    with ablate_planes(model, [0], layers=[L]):
        got = ropelens.analyses.attention_decomposition(
            model, toks, bands=Bands.planes(), layers=[L]
        ).logits(L)
    ok = torch.isfinite(want)
    assert torch.equal(ok, torch.isfinite(got))
    torch.testing.assert_close(got[ok], want[ok], rtol=1e-5, atol=1e-5)


def test_a_config_key_the_family_ignores_does_not_change_the_spec(tmp_path):
    """GPT-NeoX has no grouped-query attention: a stray num_key_value_heads in its config is not
    read."""
    import transformers
    from transformers import AutoModelForCausalLM

    from ropelens.testing import tiny_tokenizer
    from ropelens.testing.families import _BASE

    cfg = transformers.GPTNeoXConfig(**{**_BASE, "num_key_value_heads": 2}, rotary_pct=0.25)
    AutoModelForCausalLM.from_config(cfg).save_pretrained(tmp_path / "neox")
    tiny_tokenizer().save_pretrained(tmp_path / "neox")
    model = ropelens.load_model(tmp_path / "neox", device="cpu")
    assert {lr.n_kv_heads for lr in rope_spec(model).layers} == {4}


# ==================================================================== band statistics, every family
NO_POST_HOOK = (
    "phi3",
    "gpt_neox",
)  # fused qkv: the bridge fires no post-RoPE hook, ropelens rotates q and k itself
BAND_TILES = (
    ((5, 3), False),
    (5, True),
)  # query and key tiles (online argmax, no JSD); query tiles with JSD


def _layer_planes(family: str, layer: int) -> torch.Tensor:
    """The family's planes of ``layer`` written out: under proportional RoPE (Gemma 4's global
    layers) every dim pair (i, i + d/2) of the wider head is a plane, the ones past the turning
    share at frequency 0."""
    fam = FAMILIES[family]
    if layer not in fam.turning and layer not in fam.head_dims:
        return _hand_planes(family)
    n = (
        fam.layer_head_dim(layer) // 2
        if layer in fam.turning
        else int(fam.layer_head_dim(layer) * fam.rotary_fraction) // 2
    )
    i = torch.arange(n)
    return torch.stack([i, i + n] if fam.pairing == "half" else [2 * i, 2 * i + 1], dim=1)


def _model_dims(family: str, idx: torch.Tensor) -> torch.Tensor:
    """Head dims as ropelens numbers them (rotary dims first) → as HF's attention receives them:
    multi-head latent attention puts its qk_rope_head_dim rotary dims after the qk_nope_head_dim
    no-position ones (from the config)."""
    c = FAMILIES[family].config
    if not c.get("qk_rope_head_dim"):
        return idx
    return torch.where(
        idx < c["qk_rope_head_dim"], idx + c["qk_nope_head_dim"], idx - c["qk_rope_head_dim"]
    )


def _band_inputs(family: str, family_model, hf_eager, layers: list[int] | None = None) -> tuple:
    """(tokens, bands, HF's layers, the dense float64 reference) of one short two-row input."""
    model, spec = family_model(family)
    toks = torch.randint(
        4, 100, (2, _positional_len(spec)), generator=torch.Generator().manual_seed(4)
    )
    toks[:, 0] = 1
    layers = spec.rotary_layers if layers is None else layers
    bands = Bands.quantiles(2) if spec[layers[0]].n_planes >= 2 else Bands.all()
    lays = hf_layers(hf_eager(family), toks)
    per = []
    for L in layers:
        dims = list(bands.resolve(spec[L]).dims)
        # the reference's full score is the sum of the bands: they must partition the head into
        # whole planes
        assert sorted(torch.cat(dims).tolist()) == list(range(spec[L].head_dim))
        per.append(
            dense_layer_sums(
                lays[L],
                [_model_dims(family, d) for d in dims],
                _model_dims(family, _layer_planes(family, L)),
            )
        )
    return toks, bands, lays, {k: torch.stack([p[k] for p in per]) for k in per[0]}


def _band_sums(
    model, spec, toks, bands, tile, jsd: bool, fast: bool = True, layers: list[int] | None = None
) -> dict:
    red = BandStatsReducer(
        spec, spec.rotary_layers if layers is None else layers, bands, jsd=jsd, tile=tile
    )
    stream(model, [toks], [red], layers=red.layers, spec=spec, progress=False, fast=fast)
    return {k: v.double() for k, v in red.sums.items()}


@pytest.mark.parametrize("family", [_param(f) for f in EXACT])
def test_band_statistics_match_hf_dense_reference(family, family_model, hf_eager, monkeypatch):
    """Every band-statistics sum equals the dense float64 reference built from the q, k, scale,
    window, cap, sinks and probabilities HF's own eager attention receives and returns
    (``test_band_tiles``), through query tiles, key tiles, and the running Σ k kᵀ wherever a tile
    has keys all its queries see."""
    monkeypatch.setattr(BAND_STATISTICS_MODULE, "GRAM_MIN_KEYS", 1)
    model, spec = family_model(family)
    for (
        group
    ) in spec.width_groups().values():  # the dense reference takes one width at a time (Gemma 4)
        toks, bands, _, want = _band_inputs(family, family_model, hf_eager, group)
        for tile, jsd in BAND_TILES:
            got = _band_sums(model, spec, toks, bands, tile, jsd, layers=group)
            # float32 scores carry ~1e-7 of the largest one; a sum that cancels near 0 keeps that
            # (Persimmon's q/k layer norm makes scores in the thousands): 1e-6 of each sum's largest
            # value, a wrong term is O(1)
            assert_sums_match(
                got,
                want if jsd else {k: v for k, v in want.items() if k != "jsd"},
                f"{family} layers {group} tile={tile}",
                rel_floor=1e-6,
            )


class _KeepPost:
    """Keeps each layer's post-RoPE q and k."""

    needs = frozenset({"q_post", "k_post"})

    def __init__(self) -> None:
        self.kept: dict[int, dict] = {}

    def update(self, acts) -> None:
        self.kept[acts.layer] = {k: acts[k] for k in ("q_post", "k_post")}


def _post_rope_error(model, spec, toks, lays) -> float:
    """Largest relative difference of the post-RoPE q and k the bridge path hands reducers (rotated
    by ropelens where no post-RoPE hook fires) from the ones HF's attention receives."""
    keep = _KeepPost()
    stream(model, [toks], [keep], spec=spec, progress=False, fast=False)
    err = 0.0
    for L in spec.rotary_layers:
        for ours, theirs in (
            (keep.kept[L]["q_post"], lays[L].q),
            (keep.kept[L]["k_post"], lays[L].k),
        ):
            theirs = theirs.transpose(1, 2)  # [b, pos, head, d]
            err = max(err, float((ours - theirs).abs().max() / theirs.abs().max()))
    return err


@pytest.mark.parametrize("family", [_param(f) for f in NO_POST_HOOK])
def test_wrong_pairing_is_caught_where_ropelens_rotates_itself(
    family, family_model, hf_eager, monkeypatch
):
    """Without a post-RoPE hook the bridge path's post-RoPE q and k are ropelens's own rotation of
    the pre-RoPE ones, so comparing them with the spec's rotation compares ropelens with itself (the
    fast path taps the model's own rotation instead). Against the model's own output (the q and k
    HF's attention receives) they agree under the family's pairing, and the band statistics match
    the dense reference; a spec with the pairing flipped fails both."""
    monkeypatch.setattr(BAND_STATISTICS_MODULE, "GRAM_MIN_KEYS", 1)
    model, spec = family_model(family)
    assert all(attn_hooks(model, L).q_post is None for L in spec.rotary_layers)
    toks, bands, lays, want = _band_inputs(family, family_model, hf_eager)
    assert _post_rope_error(model, spec, toks, lays) < 1e-5  # float32 rotations of the same numbers
    tile, jsd = BAND_TILES[0]
    no_jsd = {k: v for k, v in want.items() if k != "jsd"}
    assert_sums_match(
        _band_sums(model, spec, toks, bands, tile, jsd, fast=False),
        no_jsd,
        f"{family}, bridge path",
    )
    flip = {"half": "adjacent", "adjacent": "half"}
    wrong = dataclasses.replace(
        spec, layers=tuple(dataclasses.replace(lr, pairing=flip[lr.pairing]) for lr in spec.layers)
    )
    assert _post_rope_error(model, wrong, toks, lays) > 0.1
    with pytest.raises(AssertionError, match="cs_term"):
        assert_sums_match(
            _band_sums(model, wrong, toks, bands, tile, jsd, fast=False),
            no_jsd,
            f"{family}, pairing flipped",
        )
