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
