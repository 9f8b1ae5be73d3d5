"""The automatic sweep: shrunk configs keep each family's structure and build; statuses follow
ropelens's verdicts.

The structure is compared with the config class's own defaults (read here, independently of the
shrinking); the statuses with the curated matrix's verdicts on the same families.
"""

from __future__ import annotations

import math

import pytest
import torch
from transformers import CONFIG_MAPPING, AutoModelForCausalLM

from tests.harness.sweep import (
    TOL,
    check_config,
    classify,
    rope_model_types,
    shrink_config,
    sweep_one,
    table_phase_steps,
)
from tests.harness.sweep_checks import NO_VARIANTS, SweepCheck, static_len, sums_error


def _defaults(model_type: str) -> dict:
    return CONFIG_MAPPING[model_type]().to_dict()


def _builds(cfg) -> None:
    """HF builds the shrunk config and runs a 24-token forward (every layer kind is exercised)."""
    model = AutoModelForCausalLM.from_config(
        cfg, attn_implementation="eager", dtype=torch.float32
    ).eval()
    assert sum(p.numel() for p in model.parameters()) < 5_000_000
    with torch.no_grad():
        out = model(torch.arange(4, 28)[None])
    assert out.logits.shape == (1, 24, 101)


def _kinds_in_order(types: list) -> list:
    return [t for i, t in enumerate(types) if t not in types[:i]]


def test_sliding_window_is_cut_below_the_input():
    cfg = shrink_config("mistral")
    assert _defaults("mistral")["sliding_window"] > 24 and cfg.sliding_window == 8
    assert (cfg.hidden_size, cfg.num_attention_heads, cfg.vocab_size) == (64, 4, 101)
    _builds(cfg)


def test_hybrid_layer_types_keep_every_kind_in_order():
    d = _defaults("gemma3_text")
    cfg = shrink_config("gemma3_text")
    assert 2 <= cfg.num_hidden_layers == len(cfg.layer_types) <= 4
    assert (
        _kinds_in_order(cfg.layer_types)
        == _kinds_in_order(d["layer_types"])
        == ["sliding_attention", "full_attention"]
    )
    assert cfg.layer_types[0] == d["layer_types"][0]  # the pattern's start, not a reshuffle
    assert cfg.sliding_window == 8 and cfg.head_dim == 16
    assert cfg.rope_parameters.keys() == d["rope_parameters"].keys()  # local and global bases kept
    _builds(cfg)


def test_moe_keeps_few_experts_and_the_dense_prefix():
    d = _defaults("deepseek_v3")
    cfg = shrink_config("deepseek_v3")
    assert (
        cfg.n_routed_experts == 4
        and cfg.num_experts_per_tok == 2
        and cfg.n_group == cfg.topk_group == 1
    )
    assert (
        d["first_k_dense_replace"] == 3 and cfg.first_k_dense_replace == 3 < cfg.num_hidden_layers
    )  # dense, then MoE
    _builds(cfg)


def test_mla_ranks_shrink_together():
    d = _defaults("deepseek_v3")
    cfg = shrink_config("deepseek_v3")
    s = cfg.qk_rope_head_dim / d["qk_rope_head_dim"]
    for k in ("q_lora_rank", "kv_lora_rank", "qk_nope_head_dim", "v_head_dim"):
        assert getattr(cfg, k) == d[k] * s, k
        assert getattr(cfg, k) % 2 == 0 and getattr(cfg, k) >= 8
    assert cfg.qk_head_dim == cfg.qk_nope_head_dim + cfg.qk_rope_head_dim


def test_partial_rotary_is_kept():
    for mt in ("phi", "stablelm"):
        d, cfg = _defaults(mt), shrink_config(mt)
        assert (
            cfg.rope_parameters["partial_rotary_factor"]
            == d["rope_parameters"]["partial_rotary_factor"]
            < 1
        )
        assert (
            int(
                cfg.hidden_size
                // cfg.num_attention_heads
                * d["rope_parameters"]["partial_rotary_factor"]
            )
            % 2
            == 0
        )
        _builds(cfg)


def test_no_rope_layers_are_kept():
    d = _defaults("smollm3")
    cfg = shrink_config("smollm3")
    assert set(d["no_rope_layers"]) == set(cfg.no_rope_layers) == {0, 1}
    assert len(cfg.no_rope_layers) == cfg.num_hidden_layers <= 4
    assert cfg.no_rope_layers == d["no_rope_layers"][: cfg.num_hidden_layers]
    _builds(cfg)


def test_per_layer_overrides_follow_their_layers():
    """Gemma 4's wider global heads ("05": head_dim 512 over 256) land on the global layer that was
    kept."""
    d = _defaults("gemma4_text")
    cfg = shrink_config("gemma4_text").to_dict()
    full = [j for j, t in enumerate(cfg["layer_types"]) if t == "full_attention"]
    assert full and [int(k) for k in cfg["per_layer_config"]] == full
    ratio = next(iter(d["per_layer_config"].values()))["head_dim"] / d["head_dim"]
    assert all(v["head_dim"] == cfg["head_dim"] * ratio for v in cfg["per_layer_config"].values())


def test_rope_types_are_found():
    types = {
        t.model_type
        for t in rope_model_types({"llama", "gemma3_text", "deepseek_v3", "phi", "gpt2", "opt"})
    }
    assert types == {
        "llama",
        "gemma3_text",
        "deepseek_v3",
        "phi",
    }  # gpt2, opt: learned positions, no rotary code


@pytest.mark.parametrize(
    ("model_type", "status", "why"),
    [
        ("llama", "exact", ""),
        ("gemma3_text", "exact", ""),
        ("deepseek_v3", "exact", ""),
        ("deepseek_v32", "exact", ""),  # the indexer's top-k read from the mask the model builds
        (
            "hunyuan_v1_dense",
            "exact",
            "",
        ),  # q/k normed after RoPE: taken where they enter the score
        ("diffllama", "refused", "differential attention"),
        ("doge", "refused", "a bias added to q·k"),
        ("deepseek_v4", "refused", "compressed keys"),
        (
            "beam",
            "exact",
            "",
            # its position-scaled NoPE layer listed, its sliding rotary layers measured # keys
            # pooled over blocks of tokens: no per-position logit # its dynamic mask: finite values
            # added to the scores
        ),
        (
            "gptj",
            "exact",
            "",
            # no inv_freq buffer: its frequencies checked against the phase steps of its sin|cos
            # table
        ),
        ("gemma3", "not built", "text tower is 'gemma3_text'"),
        (
            "granite_swa",
            "exact",
            "",
        ),  # sinks scale the output after the softmax: HF's probabilities times that scale
        (
            "jamba",
            "no RoPE",
            "apply_rotary_pos_emb defined, never called",
        ),  # its attention never rotates
    ],
)
def test_sweep_classifies_like_the_matrix(model_type, status, why, tmp_path):
    row = sweep_one(model_type, workdir=tmp_path)
    assert row.status == status, row.detail
    assert why in row.detail
    if status == "exact":
        _assert_exact(row)


def _assert_exact(row) -> None:
    """Every error measured and within the tolerance (the logits restored bit for bit); the
    variant's only where the model has variants (else the detail says why not)."""
    errs = dict(row.errors)
    if math.isnan(errs["variant_err"]):
        assert row.detail == NO_VARIANTS or row.detail.startswith("no variants: "), row.detail
        assert math.isnan(errs.pop("variant_err")) and math.isnan(errs.pop("restore_err"))
    assert errs.pop("restore_err", 0.0) == 0.0, row.errors
    if math.isnan(
        errs.get("hf_variant_err", 0.0)
    ):  # HF's config takes no other rope type for these layers (GPT-J)
        errs.pop("hf_variant_err")
    assert all(0 <= v <= TOL for v in errs.values()), row.errors


_OK = dict(
    inv_freq_err=0.0,
    scores_err=1e-7,
    pattern_err=1e-7,
    pairing_err=1e-7,
    usage_err=1e-7,
    band_stats_err=1e-7,
    variant_err=1e-7,
    restore_err=0.0,
)


def test_a_number_that_disagrees_is_wrong():
    ok = _OK
    assert classify(SweepCheck("x", layers_checked=[0], **ok)) == ("exact", "")
    status, detail = classify(SweepCheck("x", layers_checked=[0], **{**ok, "pattern_err": 0.3}))
    assert status == "wrong" and "pattern_err" in detail
    assert (
        classify(SweepCheck("x", layers_checked=[0], **{**ok, "scores_err": math.nan}))[0]
        == "unverified"
    )
    assert classify(SweepCheck("x", refusal="no adapter\nmore"))[0:2] == ("refused", "no adapter")


def test_the_checks_past_the_logits_classify():
    """Usage or band statistics off, a variant off its spec, or logits one ulp off after the
    variant: wrong. No band or usage reference: unverified. No variants (a plain HF model, a
    one-line refusal): exact, noted."""
    for key, v in (
        ("usage_err", 0.01),
        ("band_stats_err", 2e-4),
        ("variant_err", 0.3),
        ("restore_err", 1e-8),
    ):
        status, detail = classify(SweepCheck("x", layers_checked=[0], **{**_OK, key: v}))
        assert status == "wrong" and key in detail, (key, status, detail)
    for key in ("usage_err", "band_stats_err"):
        status, detail = classify(SweepCheck("x", layers_checked=[0], **{**_OK, key: math.nan}))
        assert status == "unverified" and key in detail
    none = {**_OK, "variant_err": math.nan, "restore_err": math.nan}
    assert classify(SweepCheck("x", layers_checked=[0], **none, variant_note=NO_VARIANTS)) == (
        "exact",
        NO_VARIANTS,
    )
    assert (
        classify(SweepCheck("x", layers_checked=[0], **none))[0] == "unverified"
    )  # not run, and no reason why


def test_band_window_stops_where_the_model_picks_its_mask():
    """Llama 4's chunks and DeepSeek V3.2's top-k keys: band statistics run on windows of at most
    that many tokens (8 in the tiny configs, under the 24-token input), where the mask is causal;
    other layers keep the input."""
    from types import SimpleNamespace

    spec = {
        0: SimpleNamespace(select_keys=None, chunk=None),
        1: SimpleNamespace(select_keys=8, chunk=None),
        2: SimpleNamespace(select_keys=None, chunk=6),
    }
    assert static_len(spec, [0], 24) == 24
    assert static_len(spec, [0, 1], 24) == 8
    assert static_len(spec, [0, 1, 2], 24) == 6


@pytest.mark.parametrize("model_type", ["llama4_text", "deepseek_v32"])
def test_band_statistics_of_model_picked_masks_are_checked_on_short_windows(model_type, tmp_path):
    """Without the short windows the band check would be refused (static_mask): here it runs and is
    exact."""
    row = sweep_one(model_type, workdir=tmp_path)
    assert row.status == "exact", row.detail
    assert row.errors["band_stats_err"] <= TOL and row.errors["usage_err"] <= TOL
    assert (
        row.detail == "" and row.errors["variant_err"] <= TOL
    )  # plain HF models take variants on the engine


def test_a_broken_band_statistics_window_is_wrong(monkeypatch, tmp_path):
    """BandStatsReducer ignoring the sliding window (Mistral's 8 keys of 24) disagrees with the
    dense reference, which takes the mask HF's own attention receives: the family is wrong, every
    other check exact."""
    import dataclasses

    from ropelens.analyses.band_statistics import BandStatsReducer

    orig = BandStatsReducer._spans
    monkeypatch.setattr(
        BandStatsReducer,
        "_spans",
        staticmethod(lambda rope, *a: orig(dataclasses.replace(rope, window=None), *a)),
    )
    check = check_config("mistral", shrink_config("mistral"), workdir=tmp_path)
    status, detail = classify(check)
    assert status == "wrong" and detail.startswith("band_stats_err"), detail
    assert check.band_stats_err > 0.01 and check.usage_err < 1e-5 and check.scores_err < 1e-5


def test_usage_that_keeps_the_attention_scaling_is_wrong(monkeypatch, tmp_path):
    """gpt-oss's YaRN multiplies cos and sin by its attention scaling; usage leaving it in the
    post-RoPE plane norms is off by that factor against HF's attention inputs divided by HF's own
    attention_scaling."""
    import dataclasses

    from ropelens.analyses.frequency_usage import UsageReducer

    orig = UsageReducer.update
    monkeypatch.setattr(
        UsageReducer,
        "update",
        lambda self, acts: orig(
            self,
            dataclasses.replace(acts, rope=dataclasses.replace(acts.rope, attention_scaling=1.0)),
        ),
    )
    check = check_config("gpt_oss", shrink_config("gpt_oss"), workdir=tmp_path)
    status, detail = classify(check)
    assert status == "wrong" and detail.startswith("usage_err"), detail
    assert check.usage_err > 0.1 and check.band_stats_err < 1e-5


def test_a_variant_that_stays_after_its_context_is_wrong(monkeypatch, tmp_path):
    """Hooks left in place on exit: the logits after the context differ from the ones before."""
    import ropelens.run.intervene as intervene

    orig = intervene._install_variant

    def leaky(*args, **kwargs):
        spec, _handles, chosen, engine = orig(*args, **kwargs)
        return spec, [], chosen, engine  # nothing to remove on exit

    monkeypatch.setattr(intervene, "_install_variant", leaky)
    check = check_config("llama", shrink_config("llama"), workdir=tmp_path)
    status, detail = classify(check)
    assert status == "wrong" and "restore_err" in detail, detail
    assert check.restore_err > 0 and check.variant_err < 1e-5


def test_a_variant_that_rotates_off_its_spec_is_wrong(monkeypatch, tmp_path):
    """The model handed p-RoPE with p = 1 (its own rotation) while the spec says p = 0.5: the
    rotated query of one token repeated does not turn by the spec's frequencies."""
    import ropelens.backends.bridge_interventions as hooks
    import ropelens.backends.engine as engine
    from ropelens.spec.variants import PRoPE

    for mod in (hooks, engine):
        orig = mod.variant_tables
        monkeypatch.setattr(
            mod, "variant_tables", lambda v, *a, _o=orig, **k: _o(PRoPE(1.0), *a, **k)
        )
    check = check_config("llama", shrink_config("llama"), workdir=tmp_path)
    status, detail = classify(check)
    assert status == "wrong" and detail.startswith("variant_err"), detail
    assert check.variant_err > 0.01 and check.restore_err == 0.0


def test_table_phase_steps_recover_the_frequencies():
    """HF's GPT-J table at rotary width 8: every step is θ_i = 10000^(-2i/8), written out here by
    hand."""
    from transformers.models.gptj.modeling_gptj import create_sinusoidal_positions

    theta = torch.tensor([1.0, 10000**-0.25, 10000**-0.5, 10000**-0.75], dtype=torch.float64)
    steps = table_phase_steps(create_sinusoidal_positions(64, 8))
    assert steps.shape == (24, 4)
    # float32 table: m·θ rounds to ≤ 24·6e-8 rad; a frequency off by one plane is off by ≥ 0.8·θ
    assert float((steps - theta).abs().max()) < 1e-5
    shifted = table_phase_steps(
        create_sinusoidal_positions(64, 8)[1:]
    )  # a table that is not one frequency per plane
    assert float((shifted - theta).abs().max()) < 1e-5  # a shift of positions keeps each step
    doubled = table_phase_steps(create_sinusoidal_positions(64, 8)[::2])
    assert float((doubled - 2 * theta).abs().max()) < 1e-5


def test_a_rotating_model_called_not_rotary_is_refused_not_dropped(monkeypatch, tmp_path):
    """'no RoPE' needs HF's word too: a model whose forward rotates stays a refused RoPE family."""
    import ropelens.spec.reading
    from ropelens.errors import NotRotaryError

    def not_rotary(model, **reading_options):
        raise NotRotaryError("LlamaForCausalLM uses 'none' position embeddings, not RoPE")

    # the sweep reads the spec through its module (reading.rope_spec)
    monkeypatch.setattr(ropelens.spec.reading, "rope_spec", not_rotary)
    row = sweep_one("llama", workdir=tmp_path)
    assert row.status == "refused" and "not RoPE" in row.detail


def test_lightning_attention_layers_are_listed_not_measured(tmp_path):
    """MiniMax on the plain HF path: its lightning (linear) attention layers are kind 'linear', its
    softmax layers exact; the layer kinds follow the config's layer_types."""
    types = shrink_config("minimax").layer_types
    row = sweep_one("minimax", workdir=tmp_path)
    assert row.status == "exact", row.detail
    assert row.kinds == {
        "full": [i for i, t in enumerate(types) if t == "full_attention"],
        "linear": [i for i, t in enumerate(types) if t == "linear_attention"],
    }
    assert row.kinds["linear"]  # the shrunk stack kept both kinds


def test_unset_kv_heads_and_attention_free_defaults_still_build():
    """Nemotron leaves num_key_value_heads unset (one per query head); Bamba's and Granite 4.0-H's
    default stacks hold no attention layer, so the tiny stack ends in one (their checkpoints
    interleave them)."""
    assert _defaults("nemotron")["num_key_value_heads"] is None
    cfg = shrink_config("nemotron")
    assert cfg.num_key_value_heads == cfg.num_attention_heads == 4
    _builds(cfg)
    assert _defaults("bamba")["attn_layer_indices"] is None
    bamba = shrink_config("bamba")
    assert bamba.attn_layer_indices == [bamba.num_hidden_layers - 1]
    _builds(bamba)
    assert set(_defaults("granitemoehybrid")["layer_types"]) == {"linear_attention"}
    granite = shrink_config("granitemoehybrid")
    assert granite.layer_types[-1] == "full_attention" and "linear_attention" in granite.layer_types
    _builds(granite)


def test_widths_hidden_under_other_names_shrink():
    """Inkling 2's sliding layers' KV heads, Bailing's expert groups and top-k (num_expert_group,
    num_experts_per_token) and Zamba 2's attention input (2 × hidden) shrink with the rest."""
    d = _defaults("inkling2_text")
    ink = shrink_config("inkling2_text")
    assert (
        d["swa_num_key_value_heads"] < d["swa_num_attention_heads"]
        and ink.swa_num_key_value_heads == 2
    )
    _builds(ink)
    bailing = shrink_config("bailing_hybrid").to_dict()
    assert (
        bailing["num_experts"] == 4
        and bailing["num_expert_group"] == 1
        and bailing["num_experts_per_token"] == 2
    )
    _builds(shrink_config("bailing_hybrid"))
    d = _defaults("zamba2")
    zamba = shrink_config("zamba2")
    assert (
        d["attention_hidden_size"] == 2 * d["hidden_size"]
        and zamba.attention_hidden_size == 2 * zamba.hidden_size
    )
    _builds(zamba)


def test_recurrent_stacks_keep_one_cache_slot_per_call():
    """HRM's num_hidden_layers counts cache slots, num_layers_per_stack × H_cycles × (L_cycles + 1):
    the stacks shrink, the cycles and that product stay."""
    d = _defaults("hrm_text")
    cfg = shrink_config("hrm_text")
    assert d["num_hidden_layers"] == d["num_layers_per_stack"] * d["H_cycles"] * (d["L_cycles"] + 1)
    assert (cfg.H_cycles, cfg.L_cycles) == (
        d["H_cycles"],
        d["L_cycles"],
    ) and cfg.num_layers_per_stack == 2
    assert cfg.num_hidden_layers == 2 * cfg.H_cycles * (cfg.L_cycles + 1)
    _builds(cfg)


def test_per_layer_mla_overrides_shrink_with_the_global_ranks():
    """Dots 3's sliding layers override heads and MLA ranks; their head width stays the sum of its
    two parts."""
    d = _defaults("dots3_note_text")
    old = next(iter(d["per_layer_config"].values()))
    assert d["head_dim"] == old["qk_nope_head_dim"] + d["qk_rope_head_dim"]  # 256 = 192 + 64
    cfg = shrink_config("dots3_note_text").to_dict()
    s = cfg["qk_rope_head_dim"] / d["qk_rope_head_dim"]
    for v in cfg["per_layer_config"].values():
        assert (
            v["num_attention_heads"] == v["num_key_value_heads"] == 2
        )  # 64 of 128 heads: half of 4
        assert (
            v["kv_lora_rank"] == old["kv_lora_rank"] * s
            and v["qk_nope_head_dim"] == old["qk_nope_head_dim"] * s
        )
        assert v["head_dim"] == v["qk_nope_head_dim"] + cfg["qk_rope_head_dim"]
    _builds(shrink_config("dots3_note_text"))


@pytest.mark.parametrize(
    ("model_type", "status", "why"),
    [
        ("hrm_text", "refused", "run recurrently"),  # each layer attends several times per forward
        ("dots3_note_text", "exact", ""),  # per-layer MLA widths, indexed and sliding layers
        (
            "qwen4_exp_text",
            "exact",
            "",
        ),  # QSA block selection read from the model's mask, linear layers listed
        (
            "bailing_hybrid",
            "exact",
            "",
        ),  # Kimi delta attention listed as linear; its MLA rotation always interleaved
    ],
)
def test_newly_built_families_are_read_or_refused(model_type, status, why, tmp_path):
    row = sweep_one(model_type, workdir=tmp_path)
    assert row.status == status, row.detail
    assert why in row.detail


def test_an_unsized_indexer_is_sized_so_it_selects():
    """Qwen4-Exp's defaults make every 4th layer indexed but leave the indexer unsized (HF's own
    defaults do not build): the tiny config sizes it, keeps the layer pattern, and its budget bites
    inside the 24-token input. The last query sees 24 keys, 12 complete blocks of 2; the indexer
    keeps the top 4 blocks (budget 8) and no tail, so exactly 8 of its probabilities are nonzero
    (the others are masked: exp underflows to exactly 0)."""
    d = _defaults("qwen4_exp_text")
    assert "indexed_attention" in d["layer_types"] and d["indexer_budget"] is None
    cfg = shrink_config("qwen4_exp_text")
    assert (
        _kinds_in_order(cfg.layer_types)
        == _kinds_in_order(d["layer_types"])
        == ["linear_attention", "indexed_attention"]
    )
    assert (
        cfg.layer_types == d["layer_types"][: cfg.num_hidden_layers]
    )  # the pattern's start: 3 linear, 1 indexed
    assert cfg.indexer_kv_heads == 1 and cfg.indexer_budget % cfg.indexer_compress_ratio == 0
    _builds(cfg)
    model = AutoModelForCausalLM.from_config(
        cfg, attn_implementation="eager", dtype=torch.float32
    ).eval()
    with torch.no_grad():
        probs = model(torch.arange(4, 28)[None], output_attentions=True).attentions
    assert (
        len(probs) == cfg.layer_types.count("indexed_attention") == 1
    )  # linear layers return no probabilities
    last = probs[0][0, :, -1]  # [heads, keys]
    assert ((last > 0).sum(-1) == 8).all()
    assert (
        (probs[0][0, :, 8] > 0).sum(-1) == 9
    ).all()  # 9 keys: 4 blocks, all kept, and a tail of 1


@pytest.mark.parametrize(
    ("model_type", "why"),
    [
        (
            "lfm2_moe",
            'config.layer_types[layer_idx] != "conv"` (default layer_types=None)',
        ),  # no default pattern
        (
            "cohere_compass_text",
            "(default rope_parameters={})",
        ),  # no rotary parameters for any layer type
    ],
)
def test_defaults_hf_cannot_build_are_named_as_such(model_type, why, tmp_path):
    row = sweep_one(model_type, workdir=tmp_path)
    assert row.status == "not built"
    assert row.detail.startswith(
        f"HF's default config does not build: {type(shrink_config(model_type)).__name__}()"
    )
    assert why in row.detail, row.detail


def test_a_config_the_shrinking_broke_says_so(tmp_path):
    """HF's default Llama builds; a shrunk config missing a width it needs fails, and the reason
    blames the shrinking."""
    from tests.harness.sweep import NotBuilt, check_config

    cfg = shrink_config("llama")
    vars(cfg)["intermediate_size"] = (
        None  # a width the model needs left unset (past the config's type check)
    )
    with pytest.raises(
        NotBuilt,
        match=r"modeling_llama\.py:\d+ .*HF's default config builds: the shrinking broke it",
    ):
        check_config("llama", cfg, workdir=tmp_path)


@pytest.mark.parametrize(
    ("model_type", "status", "why"),
    [
        (
            "emu3",
            "exact",
            "",
        ),  # its text tower built alone by Emu3ForCausalLM, saved under the composite config
        (
            "mllama",
            "exact",
            "",
        ),  # its cross-attention layers listed without self-attention, never measured
        (
            "phi4_multimodal",
            "exact",
            "",
        ),  # the text model's fields are the top level; vision and audio towers shrunk too
        (
            "moshi",
            "exact",
            "",
        ),  # its config's window is never masked: full causal attention, read so
        ("dbrx", "exact", ""),  # attention fields in attn_config, experts in ffn_config
        (
            "blt",
            "not built",
            "'BltConfig' object has no attribute 'num_hidden_layers'",
        ),  # HF's cache reads it: no forward
    ],
)
def test_composite_configs_are_built_and_read(model_type, status, why, tmp_path):
    row = sweep_one(model_type, workdir=tmp_path)
    assert row.status == status, row.detail
    assert why in row.detail
    if status == "exact":
        assert all(math.isnan(v) or 0 <= v <= TOL for v in row.errors.values()), (
            row.errors
        )  # NaN: no variants


def _sub(d: dict, key: str) -> dict:
    return {
        k: v
        for k, v in d[key].items()
        if k
        in (
            "hidden_size",
            "num_hidden_layers",
            "num_attention_heads",
            "intermediate_size",
            "ffn_hidden_size",
            "kv_n_heads",
        )
    }


def test_sub_configs_shrink_like_the_top_level():
    """Each sub-config keeps its keys and shrinks its widths as a top-level config would (a 64
    hidden size, 4 heads, at most 4 layers); the defaults are read from the config class,
    independently of the shrinking."""
    for mt, subs in (
        ("phi4_multimodal", ("vision_config", "audio_config")),
        ("moshi", ("depth_decoder_config",)),
        ("dbrx", ("attn_config", "ffn_config")),
        ("blt", ("encoder_config", "global_config")),
    ):
        d, cfg = _defaults(mt), shrink_config(mt).to_dict()
        for k in subs:
            assert set(_sub(cfg, k)) == set(_sub(d, k)), (mt, k)
            small = _sub(cfg, k)
            assert (
                small.get("hidden_size", 64) == 64 and small.get("num_attention_heads", 4) == 4
            ), (mt, k, small)
            assert (
                small.get("ffn_hidden_size", 128) == 128
                and small.get("intermediate_size", 128) <= 128
            ), (mt, k)
            assert small.get("num_hidden_layers", 1) <= min(
                4, max(2, d[k].get("num_hidden_layers", 1))
            ), (mt, k)
    blt = shrink_config("blt")
    assert (
        blt.encoder_config.hidden_size_global == blt.global_config.hidden_size
    )  # the local stacks read the global
    assert blt.encoder_hash_byte_group_vocab == 101


def test_dbrx_takes_its_checkpoints_attention_fields():
    """HF's default DBRX neither builds (attn_config.rope_theta undeclared) nor runs
    (clip_qkv=None): the tiny one carries its checkpoints' fields, the base equal to the one it
    rotates by."""
    cfg = shrink_config("dbrx")
    assert (
        cfg.attn_config.rope_theta
        == cfg.rope_parameters["rope_theta"]
        == _defaults("dbrx")["rope_parameters"]["rope_theta"]
    )
    assert (
        cfg.attn_config.clip_qkv == 8.0
        and cfg.attn_config.kv_n_heads == 1
        and cfg.num_key_value_heads == 1
    )
    assert cfg.ffn_config.moe_num_experts == 4 and cfg.ffn_config.hidden_size == cfg.d_model == 64
    _builds(cfg)


def test_dbrx_clipped_queries_are_read_after_the_clip(tmp_path):
    """With a clip that bites (±0.5: the tiny model's q, k, v reach ~2.4), HF rotates the clipped
    queries and keys, and ropelens's scores match HF's (the clip is before the rotation, where
    ropelens taps)."""
    from tests.harness.sweep import _hf_model, check_config

    cfg = shrink_config("dbrx")
    cfg.attn_config.clip_qkv = 0.5
    seen = []
    model = _hf_model(cfg, 0)
    model.transformer.blocks[0].norm_attn_norm.attn.Wqkv.register_forward_hook(
        lambda m, i, o: seen.append(float(o.abs().max()))
    )
    with torch.no_grad():
        model(torch.arange(4, 28)[None])
    assert seen[0] > 2 * 0.5  # the clip changes most of the largest entries
    status, why = classify(check_config("dbrx", cfg, workdir=tmp_path))
    assert status == "exact", why


def test_mllama_cross_attention_layers_are_listed_not_measured(tmp_path):
    """Mllama's cross-attention layers attend to image states and a text-only forward skips them:
    its pattern is kept (layer 3 of 40 is the first, after three self-attention layers) and ropelens
    lists it as a layer without self-attention (kind 'none', its HF decoder layer named), measuring
    only the rotary self-attention layers."""
    from ropelens.loading.models import load_model
    from ropelens.spec.reading import rope_spec
    from tests.harness.sweep import save_tiny

    d = _defaults("mllama")["text_config"]
    assert d["cross_attention_layers"][0] == 3
    cfg = shrink_config("mllama")
    assert cfg.text_config.num_hidden_layers == 4 and cfg.text_config.cross_attention_layers == [3]
    path = save_tiny("mllama", tmp_path / "mllama")
    assert (
        AutoModelForCausalLM.from_pretrained(path).config.model_type == "mllama_text_model"
    )  # reloads from the
    spec = rope_spec(load_model(path, device="cpu"))  # composite config.json its checkpoints carry
    assert spec.kinds == {"full": [0, 1, 2], "none": [3]}
    assert spec[3].mixer == "MllamaCrossAttentionDecoderLayer" and spec.rotary_layers == [0, 1, 2]


def test_a_window_the_mask_never_applies_is_not_read(tmp_path):
    """Moshi's config names a sliding window (3000, cut to 8) but its code builds a plain causal
    mask: ropelens reads full attention, and HF's probabilities agree (the sweep's exact row above);
    Mistral's window is still read."""
    from ropelens.loading.models import load_model
    from ropelens.spec.reading import rope_spec
    from tests.harness.sweep import save_tiny

    assert shrink_config("moshi").sliding_window == 8
    spec = rope_spec(load_model(save_tiny("moshi", tmp_path / "moshi"), device="cpu"))
    assert spec.kinds == {"full": [0, 1, 2, 3]} and all(spec[i].window is None for i in range(4))
    spec = rope_spec(load_model(save_tiny("mistral", tmp_path / "mistral"), device="cpu"))
    assert spec.kinds == {"sliding": [0, 1, 2, 3]} and spec[0].window == 8


def test_byte_latent_stacks_are_refused_in_one_line(tmp_path):
    """BLT's layers run in separate stacks (bytes, patches) and its config counts none at the top:
    ropelens refuses it on loading, naming the stacks, instead of failing on a missing attribute."""
    from ropelens.errors import UnsupportedModelError
    from ropelens.loading.models import load_model
    from tests.harness.sweep import save_tiny

    path = save_tiny("blt", tmp_path / "blt")
    with pytest.raises(
        UnsupportedModelError,
        match=r"BltForCausalLM: its config counts no layers .*patcher_config, "
        r"encoder_config, decoder_config, global_config",
    ):
        load_model(path, device="cpu")


def test_sums_error_holds_jsd_to_its_float32_floor():
    """A JS divergence of ~1e-5 a row (a band's pattern nearly the model's) off by float32 rounding,
    1e-7 a row, passes; off by 0.01 a row (a wrong mask or sink) fails; every other sum is relative
    to its own largest value."""
    n = torch.tensor([24.0])
    want = {
        "jsd": torch.full((1, 4, 2), 24 * 1e-5, dtype=torch.float64),
        "n_queries": n,
        "cov": torch.tensor([[1.0, -2.0]], dtype=torch.float64),
    }
    near = {**want, "jsd": want["jsd"] + 24 * 1e-7}
    assert sums_error(near, want) < TOL
    assert sums_error({**want, "jsd": want["jsd"] + 24 * 1e-2}, want) > TOL
    assert sums_error({**want, "cov": want["cov"] * (1 + 1e-3)}, want) == pytest.approx(1e-3)
    assert sums_error({**want, "cov": want["cov"][:, :1]}, want) == math.inf  # misshapen
