"""experiments/two_models.py --quick on a tiny Gemma-3 (local and global layers): it runs, its
p-values are the permutation p-values of its stored per-window numbers, its losses and copy scores
are the model's own, and a second run resumes with nothing left to do."""

from __future__ import annotations

import json

import numpy as np
import torch

ARGS = ["--quick", "--steps", "heads", "positional", "semantic", "--n-windows", "2"]


def _hand_class_losses(model, tokens, content, function):
    """Mean next-token NLL on content and on function targets, from the bridge's logits."""
    with torch.no_grad():
        logits = model(tokens[None], return_type="logits")[0, :-1].double()
    nll = torch.logsumexp(logits, -1) - logits.gather(-1, tokens[1:, None])[:, 0]
    return float(nll[content].mean()), float(nll[function].mean())


def test_two_models_quick(tmp_path, capsys, experiment):
    mod = experiment("two_models")
    path = mod.main([*ARGS, "--out", str(tmp_path)])
    result = json.loads(path.read_text())
    tables = {t["set"]: t for t in result["tables"]}
    assert {"positional", "positional local", "positional global", "semantic"} <= set(tables)
    runs = json.loads((tmp_path / "runs.json").read_text())["runs"]

    # the positional set's p against random planes, recomputed from the stored numbers
    pos = sorted(
        (r for r in runs.values() if r["config"].get("set") == "positional"),
        key=lambda r: r["config"]["window"],
    )
    values = np.array([r["values"] for r in pos])  # [window, row, head, offset]
    labels = np.array(pos[0]["labels"])
    own = values[:, 0].mean(0).argmax(-1)
    metric = np.stack([values[:, :, h, own[h]] for h in range(values.shape[2])], -1).mean(
        -1
    )  # [window, row]
    effect = (metric - metric[:, :1]).mean(0)
    main = [r for r in tables["positional"]["rows"] if "p_planes" in r][0]
    observed = effect[list(labels).index(f"set {main['dose']}")]
    draws = effect[labels == "random planes"]
    want = (1 + np.sum(draws <= observed)) / (1 + len(draws))  # damage: attention falls
    assert main["p_planes"]["p"] == want
    assert main["p_planes"]["floor"] == 1 / (1 + len(draws))
    assert main["estimate"] == observed or abs(main["estimate"] - observed) < 1e-12

    # the unmodified row's content and function losses are the bridge's own
    model, _ = mod._common.load("tiny-gemma3")
    window = mod.units(model, "semantic", mod.parse(ARGS))[0]
    content, function = mod.token_classes(model.tokenizer, window)
    assert content.any() and function.any()
    sem = next(
        r
        for r in runs.values()
        if r["config"].get("set") == "semantic" and not r["config"]["window"]
    )
    hand = _hand_class_losses(model, window, content, function)
    np.testing.assert_allclose(sem["values"][0], hand, rtol=1e-5)

    # the copy metric, its logits projected at the copy steps only, against the full logits
    case = mod.units(model, "retrieval", mod.parse(ARGS))[0]
    with torch.no_grad():
        logp = model(case.tokens[None], return_type="logits")[0].double().log_softmax(-1)
    q = torch.tensor(case.queries)
    target = case.tokens[q + 1]
    hand_nll = float(-logp[q].gather(-1, target[:, None]).mean())
    hand_acc = float((logp[q].argmax(-1) == target).double().mean())
    got = mod.copy_values(model, case, [{}, {}], 4096)
    np.testing.assert_allclose(got, [[hand_nll, hand_acc]] * 2, rtol=1e-5)

    # the page holds the figures and the tables
    page = (tmp_path / "two_models.html").read_text()
    assert page.count("<table>") >= 2 and "plotly" in page

    # a second run finds every window done
    capsys.readouterr()
    before = (tmp_path / "runs.json").read_text()
    mod.main([*ARGS, "--out", str(tmp_path)])
    assert "window 1/" not in capsys.readouterr().out
    assert json.loads((tmp_path / "runs.json").read_text())["runs"] == json.loads(before)["runs"]


def test_shared_prefix_and_distinct_rows_keep_the_scores(experiment):
    """Rows that knock out planes only from layer L on share the layers below L, and a repeated
    row is computed once: the copy scores equal those of every row run from the embedding on."""
    mod = experiment("two_models")
    seen: list[tuple[int, int]] = []  # (layer, batch rows) of every decoder layer's input

    def batch_of(i):
        def hook(_module, args, kwargs):
            seen.append((i, (args[0] if args else kwargs["hidden_states"]).shape[0]))

        return hook

    for name in ("tiny-gemma3", "tiny-llama"):
        model, _ = mod._common.load(name)
        spec = mod.rope_spec(model)
        n_planes = spec[1].n_planes
        top = spec.rotary_layers[-1]
        rows = [{}, {(1, 0): (0, 1)}, {(top, 1): tuple(range(n_planes))}, {(1, 0): (0, 1)}]
        assert mod.first_knocked_layer(rows) == 1 and mod.first_knocked_layer([{}]) is None
        once, where = mod.distinct_rows(rows)
        assert len(once) == 3 and where == [0, 1, 2, 1]
        case = mod.units(model, "retrieval", mod.parse(ARGS))[0]
        q = torch.tensor(case.queries)
        shared = mod.row_scores(model, case.tokens, rows, 4096, q, case.tokens[q + 1])
        plain = []
        for row in rows:  # one row per forward, every layer computed for it
            with mod.knocked_out_rows(model, [row]), torch.no_grad():
                logp = model(case.tokens[None], return_type="logits")[0, q].double()
            logp = logp.log_softmax(-1)
            plain.append(-logp.gather(-1, case.tokens[q + 1][:, None])[:, 0])
        plain = torch.stack(plain)
        torch.testing.assert_close(shared[0], plain, rtol=1e-6, atol=1e-6)
        assert (plain[2] - plain[0]).abs().max() > 1e-4  # the knockouts change the scores
        # layer 0 ran one row, layers after 1 four (this hook on layer 1 runs before the repeat)
        seen.clear()
        layers = mod.decoder_layers(mod.hf_model_of(model))
        hooks = [
            m.register_forward_pre_hook(batch_of(i), with_kwargs=True) for i, m in enumerate(layers)
        ]
        try:
            mod.row_scores(model, case.tokens, rows, 4096, q, case.tokens[q + 1])
        finally:
            for h in hooks:
                h.remove()
        assert seen[:2] == [(0, 1), (1, 1)] and all(b == 4 for i, b in seen if i >= 2)


def test_head_sets_by_layer_kind(experiment):
    """Heads of two layer kinds: the whole set and one set per kind; of one kind: only the set
    named by it; a model without kinds: one set."""
    mod = experiment("two_models")
    kinds = {"0": "local", "1": "local", "2": "global"}
    sets = mod.by_layer_kind("retrieval", [(0, 1), (2, 0), (2, 3)], kinds, "low")
    assert {k: v["heads"] for k, v in sets.items()} == {
        "retrieval": [(0, 1), (2, 0), (2, 3)],
        "retrieval global": [(2, 0), (2, 3)],
        "retrieval local": [(0, 1)],
    }
    assert all(v["step"] == "retrieval" and v["direction"] == "low" for v in sets.values())
    assert list(mod.by_layer_kind("positional", [(0, 1), (1, 2)], kinds, "high")) == [
        "positional local"
    ]
    assert list(mod.by_layer_kind("positional", [(0, 1)], {"0": "all"}, "high")) == ["positional"]
    assert mod.by_layer_kind("retrieval", [], kinds, "low") == {}
