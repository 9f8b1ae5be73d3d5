"""The band mixer page: what it stores (q and k in 16 bits only where the probabilities stay within
1e-3 of float32's), what it refuses, and how it shows itself."""

from __future__ import annotations

import base64
import dataclasses
import json
import re
from html import unescape

import pytest
import torch

from ropelens import Bands
from ropelens.analyses import AttentionDecomposition, attention_decomposition, head_taxonomy
from ropelens.backends.acts import LayerActs
from ropelens.errors import InputError
from ropelens.plots.attention_decomposition import (
    HALF_TOLERANCE,
    BandMixer,
    band_mixer,
    decode_array,
    encode_array,
    storage_error,
)

SEQ = 40  # longer than the tiny families' windows of 8


def tokens(seq=SEQ, seed=0):
    g = torch.Generator().manual_seed(seed)
    t = torch.randint(4, 101, (1, seq), generator=g)
    t[:, 0] = 1
    return t


def page_data(page: BandMixer) -> dict:
    """The JSON the page holds."""
    m = re.search(r"<script type='application/json' id='ropelens-data'>(.*?)</script>", page.html)
    return json.loads(m.group(1).replace("<\\/", "</"))


def reference_pattern(q, k, scale, dims, mask, softcap=None, sinks=None):
    """Softmax of q·k over ``dims`` (float64), written out here: soft-cap, masked keys, a sink logit
    per head that joins the softmax and is dropped."""
    kk = k.repeat_interleave(q.shape[0] // k.shape[0], dim=0).double()
    s = torch.einsum("hqd,hkd->hqk", q.double()[..., dims], kk[..., dims]) * scale
    if softcap:
        s = softcap * torch.tanh(s / softcap)
    e = torch.where(mask, s, torch.tensor(-1e300, dtype=torch.float64))
    top = e.amax(-1, keepdim=True)
    if sinks is not None:
        sink = torch.tensor(sinks, dtype=torch.float64)[:, None, None].expand_as(top)
        top = torch.maximum(top, sink)
    w = torch.exp(e - top) * mask
    total = w.sum(-1, keepdim=True) + (torch.exp(sink - top) if sinks is not None else 0.0)
    return w / total


@pytest.fixture(scope="module")
def gemma2(family_model):
    model, _ = family_model("gemma2")  # soft-capped, windowed, GQA
    return attention_decomposition(model, tokens(), bands=Bands.quantiles(2))


def test_encoding_round_trips_to_the_precision_chosen():
    g = torch.Generator().manual_seed(1)
    x = torch.randn(3, 17, 8, generator=g) * torch.logspace(-2, 2, 8)
    assert torch.equal(decode_array(encode_array(x, "float32"), x.shape), x.double())
    half = decode_array(encode_array(x, "float16"), x.shape)
    assert torch.equal(half, x.half().double())
    ints = decode_array(encode_array(x, "int16"), x.shape)
    step = x.abs().amax(1, keepdim=True).double() / 32767  # one step of each head and dim's scale
    # half a step, give or take float32 rounding of the scale and of x / scale
    assert ((ints - x.double()).abs() <= step * (0.5 + 1e-3)).all()
    assert ((ints - x.double()).abs() > 0).any()  # rounded, not stored exactly
    raw = base64.b64decode(encode_array(x, "int16")["data"])
    assert len(raw) == x.numel() * 2 and len(
        base64.b64decode(encode_array(x, "float32")["data"])
    ) == (x.numel() * 4)
    with pytest.raises(InputError, match="storage 'bfloat16' is not one of"):
        encode_array(x, "bfloat16")


def test_each_layer_is_stored_as_the_error_rule_says(gemma2):
    """Per layer: the first 16-bit form (scaled integers, then float16) whose page probabilities
    stay within 1e-3 of float32's, re-measured here with an independent softmax over all bands,
    each band alone and each band left out; the stored values decode to q and k to that form's
    precision."""
    page = gemma2.explore()
    data = page_data(page)
    for entry in data["layers"]:
        L = entry["layer"]
        rope, acts = gemma2.spec.layers[L], gemma2.acts[L]
        q = acts["q_post"][0].transpose(0, 1)
        k = acts["k_post"][0].transpose(0, 1)
        mask = gemma2.mask(L)[0]
        rb = gemma2.resolved(L)
        every = torch.arange(q.shape[-1])
        subsets = [every, *rb.dims, *(every[~torch.isin(every, d)] for d in rb.dims)]

        def error(dtype, q=q, k=k, mask=mask, subsets=subsets, rope=rope):
            qs = decode_array(encode_array(q, dtype), q.shape)
            ks = decode_array(encode_array(k, dtype), k.shape)
            return max(
                float(
                    (
                        reference_pattern(q, k, rope.score_scale, d, mask, rope.softcap)
                        - reference_pattern(qs, ks, rope.score_scale, d, mask, rope.softcap)
                    )
                    .abs()
                    .max()
                )
                for d in subsets
            )

        errors = {dtype: error(dtype) for dtype in ("int16", "float16")}
        passing = [d for d in ("int16", "float16") if errors[d] <= HALF_TOLERANCE]
        assert entry["dtype"] == (passing[0] if passing else "float32"), (L, errors)
        assert page.precision[L] == entry["dtype"]
        assert (
            page.half_error[L] == pytest.approx(errors[entry["dtype"]], abs=1e-9)
            if passing
            else True
        )
        stored = decode_array(entry["q"], q.shape)
        exact = decode_array(encode_array(q, entry["dtype"]), q.shape)
        assert torch.equal(stored, exact)
        assert (stored - q.double()).abs().max() <= q.abs().max() * 2**-10


def _with_dim0(dec: AttentionDecomposition, q0: float, k0) -> AttentionDecomposition:
    """A copy whose head dim 0 holds ``q0`` in every query and ``k0(positions)`` in every key."""
    acts = {}
    for L, a in dec.acts.items():
        q, k = a.tensors["q_post"].clone(), a.tensors["k_post"].clone()
        q[..., 0] = q0
        k[..., 0] = k0(k.shape[1])[None, :, None]
        acts[L] = LayerActs(a.layer, a.rope, a.valid, {**a.tensors, "q_post": q, "k_post": k})
    return dataclasses.replace(dec, acts=acts)


def _errors(dec: AttentionDecomposition, layer: int) -> dict[str, float]:
    """How far each 16-bit form moves the full pattern, by the independent softmax."""
    rope, mask = dec.spec.layers[layer], dec.mask(layer)[0]
    q = dec.acts[layer]["q_post"][0].transpose(0, 1)
    k = dec.acts[layer]["k_post"][0].transpose(0, 1)
    every = torch.arange(q.shape[-1])
    out = {}
    for dtype in ("int16", "float16"):
        qs = decode_array(encode_array(q, dtype), q.shape)
        ks = decode_array(encode_array(k, dtype), k.shape)
        moved = reference_pattern(q, k, rope.score_scale, every, mask) - reference_pattern(
            qs, ks, rope.score_scale, every, mask
        )
        out[dtype] = float(moved.abs().max())
        assert storage_error(rope, (q, k), (qs, ks), mask, [every]) == pytest.approx(
            out[dtype], abs=1e-9
        )
    return out


def test_16_bits_give_way_where_they_move_the_probabilities(family_model):
    """Keys whose dim 0 is about 40,000 (float16 steps of 32, integer steps of 1.2, logit terms
    differing by at most 1): neither 16-bit form keeps the probabilities, so the page stores
    float32, exactly. One key at -30,000 and the rest of order 1 (integer steps of 0.9, float16
    steps of 0.001): float16 keeps them where integers do not."""
    model, _ = family_model("llama")  # no soft-cap: logits reach the softmax as they are
    dec = attention_decomposition(model, tokens(), bands=Bands.quantiles(2), layers=[1])
    g = torch.Generator().manual_seed(3)
    scale = dec.spec.layers[1].score_scale
    loud = _with_dim0(dec, 1.0, lambda n: 40_000 + torch.rand(n, generator=g) / scale)
    errors = _errors(loud, 1)
    assert min(errors.values()) > HALF_TOLERANCE
    page = loud.explore()
    assert page.precision == {1: "float32"}
    # the page judged more patterns than the full one (each band alone, each band left out)
    assert page.half_error[1] >= min(errors.values()) - 1e-12
    entry = page_data(page)["layers"][0]
    q = loud.acts[1]["q_post"][0].transpose(0, 1)
    assert torch.equal(decode_array(entry["q"], q.shape), q.double())  # float32: exact

    outlier = _with_dim0(
        dec, 1.0, lambda n: torch.cat([torch.tensor([-30_000.0]), torch.randn(n - 1, generator=g)])
    )
    errors = _errors(outlier, 1)
    assert errors["int16"] > HALF_TOLERANCE >= errors["float16"]
    assert outlier.explore().precision == {1: "float16"}
    qs, ks = (torch.ones(2, 3, 4, dtype=torch.float64),) * 2
    rope, every = dec.spec.layers[1], torch.arange(4)
    assert storage_error(
        rope, (qs, ks), (qs * torch.inf, ks), torch.ones(3, 3).bool(), [every]
    ) == (float("inf"))


def test_the_page_holds_what_the_model_applies(family_model):
    """Sinks, window, soft-cap, score scale, the KV-head map and the model's own top key per query;
    an explicit mask only where the decomposition's differs from causal + window."""
    model, spec = family_model("gpt_oss")  # learned sinks, alternating windows, GQA
    dec = attention_decomposition(model, tokens(), bands=Bands.quantiles(2))
    data = page_data(dec.explore())
    assert [e["layer"] for e in data["layers"]] == dec.layers
    assert data["tokens"] == list(dec.token_text[0]) and len(data["tokens"]) == SEQ
    for e in data["layers"]:
        rope = spec.layers[e["layer"]]
        assert e["sinks"] == pytest.approx(list(rope.sinks))
        assert e["window"] == rope.window and e["softcap"] == rope.softcap
        assert e["score_scale"] == pytest.approx(rope.score_scale)
        assert (e["n_heads"], e["n_kv_heads"]) == (rope.n_heads, rope.n_kv_heads)
        assert e["mask"] is None
        assert e["model_top1"] == dec.pattern(e["layer"])[0].argmax(-1).tolist()
        names = [b["name"] for b in e["bands"]]
        assert names == dec.band_names(e["layer"])
        assert sorted(p for b in e["bands"] for p in b["planes"]) == list(range(rope.n_planes))
    assert {e["window"] for e in data["layers"]} == {8, None}

    # a padded row: the page holds its text only, under causal + window (padding never shown)
    padded = dataclasses.replace(
        dec,
        acts={
            L: LayerActs(
                a.layer,
                a.rope,
                a.valid.clone().index_fill_(1, torch.tensor([SEQ - 1]), False),
                a.tensors,
            )
            for L, a in dec.acts.items()
        },
    )
    shown = page_data(padded.explore(layers=[0]))
    entry, n = shown["layers"][0], SEQ - 1
    assert shown["tokens"] == list(dec.token_text[0][:n]) and entry["mask"] is None
    assert entry["model_top1"] == dec.pattern(0)[0, :, :n, :n].argmax(-1).tolist()
    assert torch.equal(padded.mask(0)[0, :n, :n], spec.layers[0].mask(n))


def test_partial_rotary_keeps_its_non_rotary_dims_in_rest(family_model):
    model, spec = family_model("phi3")
    dec = attention_decomposition(model, tokens(), bands=Bands.quantiles(2), layers=[0])
    rope = spec.layers[0]
    rest = page_data(dec.explore())["layers"][0]["bands"][-1]
    assert rest["name"] == "rest" and rope.rotary_dim < rope.head_dim
    assert rest["extra"] == list(range(rope.rotary_dim, rope.head_dim))


def test_heads_are_labelled_from_the_taxonomy(tiny):
    model = tiny("llama-gqa")
    toks = torch.randint(4, 101, (2, 16), generator=torch.Generator().manual_seed(0))
    toks[:, 0] = 1
    tax = head_taxonomy(
        model, toks, n_ctx=16, n_windows=2, max_offset=2, layers=[0], progress=False
    )
    dec = attention_decomposition(model, toks[:1], bands=Bands.quantiles(2))
    every = page_data(dec.explore(taxonomy=tax.with_tau(0.0)))["layers"]
    assert all(label.startswith("positional (") for label in every[0]["head_labels"])
    assert every[1]["head_labels"] is None  # layer 1 was not classified
    none = page_data(dec.explore(taxonomy=tax.with_tau(1.0)))["layers"][0]["head_labels"]
    assert none == ["other"] * 4
    kinds = tax.kinds()[0]
    labels = page_data(dec.explore(taxonomy=tax))["layers"][0]["head_labels"]
    for kind, label in zip(kinds, labels, strict=True):
        assert label == {"sink": "sink", "content": "other"}.get(kind, f"positional ({kind})")


def test_explore_draws_through_the_plots_layer(gemma2):
    from ropelens.results.figures import figure_of

    assert figure_of(AttentionDecomposition, "explore") is band_mixer
    assert gemma2.explore(layers=[1]).html == band_mixer(gemma2, layers=[1]).html


def test_bad_input_is_refused(gemma2, tmp_path):
    with pytest.raises(
        InputError, match=r"layers \[7\] were not decomposed; decomposed layers: \[0, 1, 2, 3\]"
    ):
        gemma2.explore(layers=[7])
    with pytest.raises(InputError, match="layers is a list of layer indices"):
        gemma2.explore(layers=1)
    with pytest.raises(InputError, match="batch 1 is not a row of the input: pick 0..0"):
        gemma2.explore(batch=1)
    with pytest.raises(InputError, match="taxonomy must be a HeadTaxonomy"):
        gemma2.explore(taxonomy={"layer": 0})
    with pytest.raises(InputError, match="name the file page.html"):
        gemma2.explore(layers=[0]).save(tmp_path / "page.txt")
    assert not (tmp_path / "page.txt").exists()


def test_page_saves_atomically_and_shows_itself_in_an_iframe(gemma2, tmp_path):
    page = gemma2.explore(layers=[0, 2], title="gemma2 </script> mixer")
    path = page.save(tmp_path / "mixer.html")
    assert path.read_text(encoding="utf-8") == page.html
    assert [p.name for p in tmp_path.iterdir()] == ["mixer.html"]  # no temp file left
    assert page.html.count("</script>") == 2  # the title's "</script>" is escaped in the data
    assert page_data(page)["title"] == "gemma2 </script> mixer"
    frame = page._repr_html_()
    assert frame.startswith("<iframe srcdoc=") and 'sandbox="allow-scripts"' in frame
    assert unescape(re.search(r'srcdoc="([^"]*)"', frame).group(1)) == page.html
    assert not re.search(r"(src|href)=['\"]?https?:", page.html)  # nothing fetched


def test_token_text_survives_a_save(gemma2, tmp_path):
    gemma2.save(tmp_path / "dec.safetensors")
    back = AttentionDecomposition.load(tmp_path / "dec.safetensors")
    assert back.token_text == gemma2.token_text and len(back.token_text[0]) == SEQ
    older = dataclasses.replace(gemma2, token_text=None)
    assert page_data(older.explore(layers=[0]))["tokens"][:2] == ["#1", f"#{int(tokens()[0, 1])}"]


def test_page_opens_on_the_head_asked_for_and_refuses_others(gemma2):
    dec = gemma2
    L = dec.layers[-1]
    page = dec.explore(open_on=(L, 1))
    assert page_data(page)["open"] == {"layer": L, "head": 1}
    with pytest.raises(InputError, match="not on the page"):
        dec.explore(layers=[L], open_on=(dec.layers[0], 0))
    with pytest.raises(InputError, match="is not a head of layer"):
        dec.explore(open_on=(L, 99))
    with pytest.raises(InputError, match="pair"):
        dec.explore(open_on=L)
