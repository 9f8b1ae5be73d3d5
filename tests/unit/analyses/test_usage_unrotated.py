"""Frequency usage counts the whole head: the dims RoPE leaves unrotated fall in the ``rest`` band.

The reference here is plain torch and transformers: forward hooks on each family's own q/k
projections (``q_proj``/``k_proj``, GPT-NeoX's fused ``query_key_value``, multi-head latent
attention's ``q_b_proj``, ``kv_a_proj_with_mqa`` and ``kv_b_proj``), split into heads as the HF
forward does, with the family's plane layout written out by hand. No ropelens code computes a
reference number.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

import ropelens
from ropelens.analyses import frequency_usage, intervention_effect
from ropelens.analyses.frequency_usage import FrequencyUsage
from ropelens.errors import InputError

pytestmark = pytest.mark.filterwarnings("ignore")

FIXTURES = Path(__file__).parents[2] / "fixtures" / "results"


@dataclasses.dataclass(frozen=True)
class Layout:
    """A family's head as its q/k projections write it: where the rotary dims sit, how they pair
    on their way into the rotation, and how the projections split into heads."""

    n_rotary: int
    pairing: str  # "half": (i, i + n/2); "adjacent": (2i, 2i + 1)
    rotary_last: bool = False  # multi-head latent attention: [no-position dims, rotary dims]
    path: str = "split"  # "split" q_proj/k_proj, "fused" GPT-NeoX qkv, "mla"
    head_dim: int = 16

    def planes(self) -> list[tuple[int, int]]:
        n = self.n_rotary // 2
        start = self.head_dim - self.n_rotary if self.rotary_last else 0
        if self.pairing == "half":
            return [(start + i, start + i + n) for i in range(n)]
        return [(start + 2 * i, start + 2 * i + 1) for i in range(n)]

    def unrotated(self) -> list[int]:
        rotary = {d for pair in self.planes() for d in pair}
        return [d for d in range(self.head_dim) if d not in rotary]


LAYOUTS = {
    "phi": Layout(6, "half"),  # partial rotary 0.4
    "gpt_neox": Layout(4, "half", path="fused"),  # partial rotary 0.25, fused qkv
    "stablelm": Layout(4, "half"),  # a Llama-like head with partial rotary 0.25
    "glm": Layout(8, "adjacent"),  # adjacent pairs, partial rotary 0.5
    "deepseek_v3": Layout(8, "adjacent", rotary_last=True, path="mla"),  # interleaved pairs read
    "llama": Layout(16, "half"),  # full rotary: no unrotated dims
}


def _tokens() -> torch.Tensor:
    tokens = torch.randint(4, 100, (3, 20), generator=torch.Generator().manual_seed(7))
    tokens[:, 0] = 1
    return tokens


def _reference_qk(
    path: Path, layout: Layout, tokens: torch.Tensor
) -> dict[int, dict[str, torch.Tensor]]:
    """Per layer, the queries and keys entering the rotation ``[batch, pos, head, head_dim]``,
    read from the projections' outputs with forward hooks."""
    hf = AutoModelForCausalLM.from_pretrained(path, attn_implementation="eager").eval()
    cfg = hf.config
    seen: dict[int, dict[str, torch.Tensor]] = {}
    hooks = []
    b, n = tokens.shape
    nope, rope = getattr(cfg, "qk_nope_head_dim", 0), getattr(cfg, "qk_rope_head_dim", 0)
    for i, layer in enumerate(hf.model.layers if hasattr(hf, "model") else hf.gpt_neox.layers):
        att = layer.self_attn if hasattr(layer, "self_attn") else layer.attention
        out = seen.setdefault(i, {})

        def keep(name, fn, out=out):
            def hook(_module, _inputs, output):
                out[name] = fn(output.detach().double())

            return hook

        if layout.path == "split":
            heads = lambda x: x.reshape(b, n, -1, layout.head_dim)  # noqa: E731
            hooks += [
                att.q_proj.register_forward_hook(keep("q", heads)),
                att.k_proj.register_forward_hook(keep("k", heads)),
            ]
        elif layout.path == "fused":  # [b, n, head, (q k v)] as GPTNeoXAttention views it

            def part(j):
                return lambda x: x.reshape(b, n, -1, 3 * layout.head_dim)[
                    ..., j * layout.head_dim : (j + 1) * layout.head_dim
                ]

            hooks.append(att.query_key_value.register_forward_hook(keep("q", part(0))))
            hooks.append(att.query_key_value.register_forward_hook(keep("k", part(1))))
        else:  # multi-head latent attention: [no-position dims, rotary dims] per head
            hooks += [
                att.q_b_proj.register_forward_hook(
                    keep("q", lambda x: x.reshape(b, n, -1, nope + rope))
                ),
                att.kv_a_proj_with_mqa.register_forward_hook(
                    keep("k_rot", lambda x: x[..., cfg.kv_lora_rank :])
                ),
                att.kv_b_proj.register_forward_hook(
                    keep("k_nope", lambda x: x.reshape(b, n, -1, nope + cfg.v_head_dim)[..., :nope])
                ),
            ]
    with torch.no_grad():
        hf(input_ids=tokens)
    for h in hooks:
        h.remove()
    for out in seen.values():
        if "k_nope" in out:  # one rotary key shared by every head, after each head's own dims
            k_nope = out.pop("k_nope")
            k_rot = out.pop("k_rot")[:, :, None].expand(-1, -1, k_nope.shape[2], -1)
            out["k"] = torch.cat([k_nope, k_rot], -1)
    return seen


def _energy(x: torch.Tensor, dims: list[int], skip: int) -> torch.Tensor:
    """Mean over tokens (past the first ``skip`` positions) of ‖x[..., dims]‖², per head."""
    return x[:, skip:, :, dims].pow(2).sum(-1).mean((0, 1))


def _reference_shares(
    x: torch.Tensor, layout: Layout, groups: list[list[int]], skip: int
) -> torch.Tensor:
    """``[head, band]`` energy shares: each group's planes, then rest (unclaimed planes and the
    unrotated dims), when there is one."""
    planes = layout.planes()
    claimed = {p for g in groups for p in g}
    unclaimed = [p for p in range(len(planes)) if p not in claimed]
    rest = [d for p in unclaimed for d in planes[p]] + layout.unrotated()
    bands = [[d for p in g for d in planes[p]] for g in groups] + ([rest] if rest else [])
    per_band = torch.stack([_energy(x, dims, skip) for dims in bands], -1)
    return per_band / _energy(x, list(range(layout.head_dim)), skip)[:, None]


@pytest.fixture(scope="module")
def measured(family_dir):
    """``measured(family)``: (path, ropelens model, pre usage, post usage) once per family."""
    cache = {}

    def get(family: str):
        if family not in cache:
            path = family_dir(family)
            model = ropelens.load_model(path, device="cpu")
            pre = frequency_usage(model, _tokens(), progress=False)
            post = frequency_usage(model, _tokens(), progress=False, source="post")
            cache[family] = (path, model, pre, post)
        return cache[family]

    return get


@pytest.mark.parametrize("family", sorted(LAYOUTS))
def test_band_shares_count_the_unrotated_dims_as_the_reference_does(family, measured):
    """Band shares (rest included) and the unrotated dims' energy equal hook-read references, for
    queries and keys, pre and post, both scopes, with bands that cover every plane and bands that
    leave the lowest plane to rest."""
    layout = LAYOUTS[family]
    path, _, pre, post = measured(family)
    reference = _reference_qk(path, layout, _tokens())
    n_planes = layout.n_rotary // 2
    high = list(range(n_planes // 2))
    splits = [
        [high, list(range(len(high), n_planes))],  # every plane claimed
        [high, list(range(len(high), n_planes - 1))] if n_planes > 2 else [high],  # lowest left
    ]
    for usage in (pre, post):
        assert usage.has_unrotated == bool(layout.unrotated())
        for slot, layer in enumerate(usage.layers):
            for which in "qk":
                x = reference[layer][which]
                for scope, skip in (("all", 0), ("no_sink", 1)):
                    want_rest = _energy(x, layout.unrotated(), skip)
                    got_rest = usage.unrotated_energy(which, scope)[slot]
                    torch.testing.assert_close(got_rest.double(), want_rest, rtol=1e-5, atol=1e-7)
                    for groups in splits:
                        bands = ropelens.Bands.explicit(
                            {f"b{j}": g for j, g in enumerate(groups) if g}
                        )
                        names, got = usage.band_share(bands, which, scope)
                        want = _reference_shares(x, layout, [g for g in groups if g], skip)
                        assert len(names) == want.shape[-1], (family, names)
                        torch.testing.assert_close(
                            got[slot].double(), want, rtol=1e-5, atol=1e-7,
                            msg=f"{family} {usage.source} L{layer} {which} {scope} {names}",
                        )  # fmt: skip


def test_phi_queries_hold_most_of_their_energy_in_the_unrotated_dims(measured):
    """The case that read 0.000: a tiny Phi's rest band is its unrotated 10 of 16 dims."""
    _, _, pre, _ = measured("phi")
    names, share = pre.band_share(ropelens.Bands.default(), "q", "no_sink")
    assert names[-1] == "rest"
    rest = share[..., -1].mean(1)
    assert bool((rest > 0.3).all()), rest
    torch.testing.assert_close(share[..., -1], pre.unrotated_share("q", "no_sink"))


def test_ablated_planes_have_no_energy_as_attention_sees_it_and_the_unrotated_dims_keep_theirs(
    measured,
):
    """Inside ablate_planes, "post" usage and intervention_effect's energy give the ablated planes
    zero energy (as their logit share), "pre" usage keeps it and says so, and the unrotated dims'
    energy is what it was without the ablation."""
    _, model, pre, post = measured("phi")
    last = pre.layers[-1]  # ablated there alone, every layer's input is as it was
    with ropelens.ablate_planes(model, [0, 1], layers=[last]):
        seen = frequency_usage(model, _tokens(), progress=False, source="post")
        entering = frequency_usage(model, _tokens(), progress=False)
    assert seen.intervened and entering.intervened and not post.intervened
    assert float(seen.q_norm[-1, :, :2].abs().max()) == 0.0
    torch.testing.assert_close(seen.q_norm[:-1], post.q_norm[:-1])
    torch.testing.assert_close(entering.q_norm, pre.q_norm)
    for which in "qk":
        torch.testing.assert_close(seen.unrotated_energy(which), post.unrotated_energy(which))
    assert "before the rotation" in entering.measured_as and "post" in entering.measured_as
    assert "as the attention scores them" in seen.measured_as
    finding = seen.findings()[0]
    assert finding.values["source"] == "post" and finding.values["intervened"]
    assert seen.measured_as in finding.text

    effect = intervention_effect(
        model, lambda m: ropelens.ablate_planes(m, [0, 1]), n_ctx=24, max_tokens=72
    )
    assert effect.band_names == ["Q1 (highest)", "Q2", "Q3 (lowest)", "rest"]
    assert float(effect.energy[1, :, :2].abs().max()) == 0.0
    assert float(effect.logit_share[1, :, :2].abs().max()) == 0.0
    assert bool((effect.energy[0, :, -1] > 0.3).all())  # the unrotated dims, without
    assert bool(effect.energy[1, 0, -1] > effect.energy[0, 0, -1])  # a larger share of layer 0
    torch.testing.assert_close(effect.energy[1].sum(-1), torch.ones(len(effect.layers)).double())
    assert effect.provenance.config["energy_source"] == "post"


def test_unrotated_moments_save_load_and_merge(measured, tmp_path):
    """The unrotated moments survive a save and load, and merging two halves gives the whole."""
    _, model, _, _ = measured("gpt_neox")
    tokens = _tokens()
    whole = frequency_usage(model, tokens, progress=False)
    a = frequency_usage(model, tokens[:2], progress=False)
    b = frequency_usage(model, tokens[2:], progress=False)
    a.save(tmp_path / "a.json")
    back = FrequencyUsage.load(tmp_path / "a.json")
    for key, mom in a.unrotated_token.items():
        assert torch.equal(back.unrotated_token[key].total_sq, mom.total_sq), key
        assert torch.equal(back.unrotated_window[key].count, a.unrotated_window[key].count), key
    merged = back.merge(b)
    for key, mom in whole.unrotated_token.items():
        torch.testing.assert_close(merged.unrotated_token[key].total_sq, mom.total_sq)
        torch.testing.assert_close(merged.unrotated_token[key].count, mom.count)
    bands = ropelens.Bands.default()
    torch.testing.assert_close(merged.band_share(bands)[1], whole.band_share(bands)[1])


def test_files_without_unrotated_moments_read_as_unknown_where_there_are_such_dims(
    measured, tmp_path
):
    """A file written before the unrotated dims were measured: a partial-rotary layer's shares
    are NaN (the whole is unknown), and stay so when merged; a full-rotary one's are exact."""
    _, _, pre, _ = measured("phi")
    old = {k: v for k, v in json.loads(json.dumps(pre.to_dict())).items()
           if not k.startswith("unrotated_")}  # fmt: skip
    (tmp_path / "old.json").write_text(json.dumps({"type": "FrequencyUsage", **old}))
    loaded = FrequencyUsage.load(tmp_path / "old.json")
    _, share = loaded.band_share(ropelens.Bands.default())
    assert bool(share.isnan().all()) and bool(loaded.unrotated_norm().isnan().all())
    torch.testing.assert_close(loaded.q_norm, pre.q_norm)  # the planes are as they were
    assert "unknown" in loaded.figure().layout.annotations[0].text
    merged = loaded.merge(dataclasses.replace(pre, provenance=_elsewhere(pre.provenance)))
    assert bool(merged.band_share(ropelens.Bands.default())[1].isnan().all())

    full = FrequencyUsage.load(FIXTURES / "FrequencyUsage.json")  # a full-rotary Llama
    assert not full.has_unrotated
    names, share = full.band_share(ropelens.Bands.default())
    assert "rest" not in names and bool(share.isfinite().all())
    assert float(full.unrotated_energy().abs().max()) == 0.0


def test_bad_unrotated_moments_are_named(measured):
    _, _, pre, _ = measured("phi")
    wrong = {
        k: dataclasses.replace(m, total=m.total[:, :1]) for k, m in pre.unrotated_token.items()
    }
    with pytest.raises(InputError, match="unrotated_token q/all moments has shape"):
        dataclasses.replace(pre, unrotated_token=wrong)


def _elsewhere(prov):
    return dataclasses.replace(prov, spans={"tokens:elsewhere": [[0, 1]]})
