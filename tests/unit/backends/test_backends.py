"""The backends: one per model, chosen once; the handle; and no module outside ``ropelens.backends``
asking which.

A bridge and a plain HF model of the same weights must give the same numbers through every backend
method (losses, decoding, captures, interventions); the handle's spec must follow the plan in force
and the model's own rotary buffers, never a stale copy.
"""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest
import torch

import ropelens
from ropelens.backends import BridgeBackend, CallableBackend, HFBackend, backend_of, handle
from ropelens.errors import InputError
from ropelens.run.intervene import ablate_planes, apply_rope_variant
from ropelens.spec.plan import active_plan
from ropelens.spec.reading import rope_spec
from ropelens.spec.variants import Linear, PRoPE

SRC = Path(ropelens.__file__).parent


@pytest.fixture(scope="module")
def both(tiny_dir):
    path = tiny_dir("llama")
    return ropelens.load_model(path, device="cpu"), ropelens.load_model(
        path, device="cpu", bridge=False
    )


def _tokens(n: int = 24, seed: int = 0) -> torch.Tensor:
    toks = torch.randint(4, 100, (2, n), generator=torch.Generator().manual_seed(seed))
    toks[:, 0] = 1
    return toks


def test_one_backend_per_model_kept_on_it(both):
    bridge, plain = both
    assert type(backend_of(bridge)) is BridgeBackend and backend_of(bridge).tl_view
    assert type(backend_of(plain)) is HFBackend and not backend_of(plain).tl_view
    assert backend_of(bridge) is backend_of(bridge)  # chosen once
    hf = plain.original_model
    assert type(backend_of(hf)) is CallableBackend and not backend_of(hf).runs_analyses


def test_handle_resolves_once_and_refuses_what_is_not_loaded(both):
    bridge, plain = both
    for model in both:
        h = handle(model)
        assert h is handle(model) and handle(h) is h
        assert h.label == rope_spec(model).model_name
        assert h.device == torch.device("cpu") and h.dtype == torch.float32
        assert h.spec.to_json() == rope_spec(model).to_json()
        assert h.fingerprint == handle(model).fingerprint
    with pytest.raises(InputError, match="ropelens.load_model"):
        handle(plain.original_model)


def test_handle_spec_follows_the_plan_and_the_buffers(both):
    bridge, _ = both
    h = handle(bridge)
    before = h.spec
    assert h.spec is before  # nothing changed: read once
    with apply_rope_variant(bridge, Linear(2.0)) as varied:
        assert (
            h.spec.to_json() == rope_spec(bridge).to_json()
        )  # the model's own reading; the variant's is yielded
        assert torch.allclose(varied.layers[0].inv_freq, before.layers[0].inv_freq / 2)
    assert h.spec.to_json() == before.to_json()
    buf = next(b for n, b in h.hf.named_buffers() if "inv_freq" in n)
    saved = buf.clone()
    try:
        buf.mul_(0.5)  # a user patching the model's rotary buffer in place
        assert torch.allclose(h.spec.layers[0].inv_freq, rope_spec(bridge).layers[0].inv_freq)
        assert not torch.allclose(h.spec.layers[0].inv_freq, before.layers[0].inv_freq)
    finally:
        buf.copy_(saved)
    assert h.spec.to_json() == before.to_json()


def test_losses_agree_across_backends_and_paths(both):
    bridge, plain = both
    toks = _tokens()
    got = {}
    for name, model in (("bridge", bridge), ("plain", plain)):
        b = backend_of(model)
        for path in ("auto", "bridge"):
            chosen = b.loss_path(path)
            with torch.no_grad(), b.loss_forward(chosen) as losses:
                got[name, chosen] = losses(toks)
    ref = (
        torch.nn.functional.cross_entropy(
            plain.original_model(input_ids=toks).logits[:, :-1].flatten(0, 1).float(),
            toks[:, 1:].flatten(),
            reduction="none",
        )
        .view(2, -1)
        .mean(-1)
    )
    assert {k[1] for k in got} == {"sdpa", "bridge", "hf"}
    for k, v in got.items():
        torch.testing.assert_close(v, ref.detach(), rtol=1e-4, atol=1e-5, msg=str(k))


def test_decoding_with_and_without_cache_agree(both):
    seq = _tokens(16)[:1]
    outs = []
    for model in both:
        b = backend_of(model)
        for cache in (True, False):
            with torch.no_grad(), b.decoding(b.loss_path(), cache, 5) as (step, cached):
                logits = step(seq, seq)
                assert cached == (cache and b.loss_path() != "hf")
                nxt = torch.tensor([[int(logits.argmax())]])
                outs.append(step(nxt, torch.cat([seq, nxt], 1)))
    for o in outs[1:]:
        torch.testing.assert_close(o, outs[0], rtol=1e-4, atol=1e-4)


def test_interventions_install_where_the_backend_applies_them(both):
    bridge, plain = both
    toks = _tokens()
    for model in both:
        b = backend_of(model)
        with ablate_planes(model, [0, 1]):
            steps = active_plan(model)
            assert steps[-1].engine == (
                b.name == "hf"
            )  # a bridge whose attention gets (cos, sin): its hooks
        with apply_rope_variant(model, PRoPE(0.5)):
            assert active_plan(model)[-1].n_hooks == (
                0 if b.name == "hf" else rope_spec(model).n_layers
            )
    # and the numbers agree: a variant through bridge hooks, and through the engine on the plain
    # model
    with apply_rope_variant(bridge, PRoPE(0.5)), apply_rope_variant(plain, PRoPE(0.5)):
        a = ropelens.run.evaluate.window_losses(bridge, toks, progress=False, path="bridge")
        c = ropelens.run.evaluate.window_losses(plain, toks, progress=False)
    torch.testing.assert_close(a, c, rtol=1e-4, atol=1e-5)


def test_passkey_provenance_names_the_model_on_every_backend(both):
    from ropelens.analyses.passkey_retrieval import passkey_retrieval

    for model in both:
        res = passkey_retrieval(
            model, lengths=[280], depths=[0.5], n_trials=1, max_new_tokens=2, progress=False
        )
        assert res.provenance.model == handle(model).label
        assert res.provenance.config["cached_decoding"] == (
            res.provenance.config["forward"] != "hf"
        )


# what only a backend may ask of a model
_ASKS = {
    "is_plain",
    "is_bridge",
    "engine_plan",
    "sdpa_ready",
    "engine_ready",
    "PlainModel",
    "BridgeBackend",
    "HFBackend",
    "CallableBackend",
}


def test_no_module_outside_the_backends_asks_which_backend_a_model_has():
    found = []
    for path in SRC.rglob("*.py"):
        rel = path.relative_to(SRC)
        if rel.parts[0] == "backends" or rel.as_posix() == "spec/surface.py":
            continue  # the backends, and what a model's surface declares before one is chosen
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call):
                name = getattr(node.func, "id", None) or getattr(node.func, "attr", None)
                if name in _ASKS:
                    found.append(f"{rel}:{node.lineno} {name}()")
                if name in ("isinstance", "hasattr") and any(
                    isinstance(a, ast.Constant)
                    and a.value in ("original_model", "blocks", "hook_dict")
                    or getattr(a, "id", None) in _ASKS
                    for a in node.args[1:]
                ):
                    found.append(f"{rel}:{node.lineno} {name}(..., {ast.unparse(node.args[1])})")
            if (
                isinstance(node, ast.Attribute)
                and node.attr == "name"
                and isinstance(node.value, ast.Call)
                and getattr(node.value.func, "id", None) == "backend_of"
            ):
                found.append(f"{rel}:{node.lineno} backend_of(...).name")
    assert found == []


def test_handle_spec_follows_a_patched_rotation(both, monkeypatch):
    """A user who swaps the modeling module's rotation gets a new reading, not the cached one."""
    bridge, _ = both
    h = handle(bridge)
    before = h.spec
    mod = importlib.import_module(type(h.hf).__module__)
    orig = mod.apply_rotary_pos_emb
    monkeypatch.setattr(mod, "apply_rotary_pos_emb", lambda *a, **k: orig(*a, **k))
    after = h.spec
    assert after is not before and after.to_json() == before.to_json()


def test_corpus_analyses_read_the_spec_once_per_model(tiny_dir, monkeypatch):
    """measure() reads a model through its handle: a second analysis of the same model reads no spec
    again."""
    import ropelens.backends.base as handle_module
    from ropelens.analyses.frequency_usage import frequency_usage

    model = ropelens.load_model(tiny_dir("llama"), device="cpu")
    calls = []
    orig = handle_module.rope_spec
    # the handle is where measure() reads the spec: count the readings there
    monkeypatch.setattr(handle_module, "rope_spec", lambda m: calls.append(1) or orig(m))
    first = frequency_usage(model, _tokens(), progress=False)
    n = len(calls)
    second = frequency_usage(model, _tokens(), progress=False)
    assert n >= 1 and len(calls) == n
    assert first.to_frame().equals(second.to_frame())  # the same numbers from the cached reading
