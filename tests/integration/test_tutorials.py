"""The tutorial notebooks: each executes top to bottom, and its outputs carry the claim it makes.

The stored notebooks (docs/tutorials, executed by scripts/execute_tutorials.py) are checked cheaply:
every code cell ran, none failed, no output embeds plotly.js, and the claims hold in the stored
outputs. The integration tests execute each notebook again, offline, and check the same claims in
the fresh outputs.
"""

from __future__ import annotations

import importlib.util
import json
import re
from collections.abc import Callable
from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat")
pytest.importorskip("nbclient")

ROOT = Path(__file__).resolve().parents[2]
TUTORIALS = ROOT / "docs" / "tutorials"
PLOTLY = "application/vnd.plotly.v1+json"
MAX_BYTES = 1_000_000


def _executor():
    spec = importlib.util.spec_from_file_location(
        "execute_tutorials", ROOT / "scripts" / "execute_tutorials.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _outputs(nb) -> list[dict]:
    return [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])]


def _text(nb) -> str:
    """Everything the notebook printed (stdout), in order."""
    return "".join(o.get("text", "") for o in _outputs(nb) if o["output_type"] == "stream")


def _figures(nb) -> int:
    return sum(PLOTLY in o.get("data", {}) for o in _outputs(nb))


def _number(text: str, pattern: str) -> float:
    """The number captured by ``pattern`` (one group) in ``text``: exactly one match."""
    found = re.findall(pattern, text)
    assert len(found) == 1, (pattern, found)
    return float(found[0])


NUM = r"([-+]?\d+(?:\.\d+)?(?:e[-+]?\d+)?)"


# ------------------------------------------------------------------------ each notebook's claim
def quickstart(nb) -> None:
    text = _text(nb)
    assert _figures(nb) == 4  # two usage maps, the one-head decomposition and YaRN's planes
    assert "of its attended-key margin from" in text
    deltas = {
        line.split(" Δ loss ")[0].strip(): float(line.split(" Δ loss ")[1])
        for line in text.splitlines()
        if " Δ loss " in line
    }
    assert deltas["PRoPE(p=0.0)"] > deltas["PRoPE(p=0.75)"]  # NoPE costs more than p = 0.75
    assert "'interpolated'" in text


def positional_vs_semantic(nb) -> None:
    text = _text(nb)
    assert _figures(nb) == 2  # the taxonomy scatter and the margin-share bars
    heads = sum(int(n) for n in re.findall(r"(?:previous-token|diagonal)\s+(\d+)", text))
    assert heads >= 3  # positional heads found on text and random tokens
    pos = re.search(rf"positional heads: {NUM} of the margin from .*?, {NUM} from", text)
    other = re.search(rf"other heads: +{NUM} of the margin from .*?, {NUM} from", text)
    pos_high, pos_low = float(pos[1]), float(pos[2])
    other_high, other_low = float(other[1]), float(other[2])
    assert pos_high > 0.4 and pos_high > pos_low  # positional heads: the highest band decides
    assert other_low > other_high and pos_high > other_high  # the others: the lowest band
    share = [float(x) for x in re.findall(rf"^Q\d.*?\s{NUM}$", text, flags=re.M)]
    assert len(share) == 4 and share[0] > 0.3 > 0.05 > share[-1]  # position lives in Q1, not Q4


def truncated_rope(nb) -> None:
    text = _text(nb)
    assert _figures(nb) == 2  # the loss bars and the intervention-effect figure

    def delta(name: str) -> float:
        return _number(text, re.escape(name) + rf"\s+Δ loss {NUM}")

    assert delta("NoPE()") > delta("PRoPE(p=0.25)") > delta("PRoPE(p=0.75)")
    assert delta("PRoPE(p=0.875)") < 0.05  # stopping the slowest eighth costs ~nothing
    assert delta("PRoPEReversed(p=0.75)") > 5 * max(delta("PRoPE(p=0.75)"), 0.01)
    assert text.count("\n- ") >= 1  # the intervention's findings are printed


def context_extension(nb) -> None:
    text = _text(nb)
    assert _figures(nb) == 1  # YaRN's planes
    cost = {m: _number(text, rf"cost of {m}: {NUM}") for m in ("PI", "NTK", "YaRN")}
    assert cost["PI"] > cost["YaRN"] and cost["PI"] > cost["NTK"]  # PI slows the fast planes
    pi = re.search(r"PI interpolates (\d+) planes; YaRN keeps (\d+)", text)
    assert int(pi[1]) > 0 and int(pi[2]) > 0  # YaRN keeps fast planes that PI slows


def knockouts_and_statistics(nb) -> None:
    text = _text(nb)
    assert _figures(nb) == 1
    base = _number(text, rf"unmodified: {NUM}")
    high = re.search(rf"16 highest planes zeroed: {NUM} \[{NUM}, {NUM}\]", text)
    low = re.search(rf"16 lowest planes zeroed: +{NUM} \[{NUM}, {NUM}\]", text)
    assert base > 0.3  # these heads attend to the previous token on random tokens
    assert float(high[3]) < 0  # the CI of the high knockout's effect excludes zero
    assert float(high[1]) < float(low[1])  # and it removes more than the low knockout
    mean = re.search(rf"mean paired difference {NUM} \(direct: {NUM}\)", text)
    assert mean[1] == mean[2]  # the bootstrap's point estimate is the direct mean


def your_model_and_data(nb) -> None:
    text = _text(nb)
    assert _figures(nb) == 1
    assert text.count("same numbers: True") == 3 and "same numbers: False" not in text
    assert len(set(re.findall(r"sha256 ([0-9a-f]{12})", text))) == 1  # one fingerprint, 3 forms
    assert "exit code 0" in text
    assert "InputError: " in text and "text_column" in text


def many_processes(nb) -> None:
    text = _text(nb)
    assert "torchrun exit code 0" in text
    assert _number(text, rf"largest difference in q_norm: {NUM}") < 1e-9
    assert "killed: True | result written: False" in text
    assert "resumed, exit code 0" in text
    assert _number(text, rf"batches read from the checkpoint: {NUM}") > 0
    assert _number(text, rf"largest difference from the uninterrupted run: {NUM}") < 1e-9
    assert "exit code 2" in text  # a checkpoint of another run is refused


def your_own_analysis(nb) -> None:
    text = _text(nb)
    assert "streamed equals direct: True" in text
    assert "with checkpoints: True | resumed: True" in text
    assert "'key-norm'" in text and "exit code 0" in text
    streamed = json.loads(re.search(r"per layer: (\[.*?\])", text)[1])
    printed = json.loads(re.search(r"(\{\s*\"key_norm\".*?\})", text, flags=re.S)[1])["key_norm"]
    assert [round(x, 4) for x in printed] == streamed  # the command gives the function's numbers


def claims(nb) -> None:
    text = _text(nb)
    assert _figures(nb) == 1  # the forest plot
    verdict = r"(holds|does not hold|inconclusive|not applicable)"
    rows = dict(re.findall(rf"^([a-z0-9-]+) +{verdict}(?: |$)", text, flags=re.M))
    n_claims = _number(text, r"(\d+) claims in \d+ s")
    assert len(rows) == n_claims >= 8  # every registered claim has a verdict
    table = [line for line in text.splitlines() if line.startswith("| ")]
    assert len(table) == n_claims + 1  # the header and one row per claim (delimiter: "|---")
    assert all(f"- `{name}` (" in text for name in rows)  # each verdict's reason below the table
    # SmolLM2's positional and retrieval heads lose what they do when their band is zeroed: the
    # CI lies below 0, and the claim is never refuted (at the quick budget BH lifts the p floor
    # above alpha, so it is inconclusive until more draws)
    for name in ("positional-highest-band", "retrieval-lowest-band"):
        line = re.search(rf"^{name} +(holds|inconclusive) +{NUM} \[{NUM}, {NUM}\]$", text, re.M)
        assert line is not None, name
        assert float(line[4]) < 0
    assert "each a multiple of its floor 1/(1 + n): True" in text
    assert "Benjamini-Hochberg recomputed by hand equals the table's: True" in text
    assert "loaded back, same table: True" in text


CLAIMS: dict[str, Callable] = {
    f.__name__: f
    for f in (
        quickstart,
        positional_vs_semantic,
        truncated_rope,
        context_extension,
        knockouts_and_statistics,
        your_model_and_data,
        many_processes,
        your_own_analysis,
        claims,
    )
}


# ------------------------------------------------------------------------ the stored notebooks
def test_every_tutorial_has_its_claim():
    assert sorted(p.stem for p in TUTORIALS.glob("*.ipynb")) == sorted(CLAIMS)


@pytest.mark.parametrize("name", sorted(CLAIMS))
def test_stored_notebook_is_executed_and_small(name):
    path = TUTORIALS / f"{name}.ipynb"
    assert path.stat().st_size < MAX_BYTES
    nb = nbformat.read(path, as_version=4)
    nbformat.validate(nb)
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert code and all(c.get("execution_count") for c in code)  # every cell ran
    assert [c.execution_count for c in code] == list(range(1, len(code) + 1))  # in order, once
    assert not [o for o in _outputs(nb) if o["output_type"] == "error"]
    raw = path.read_text()
    assert "cdn.plot.ly" not in raw and "Plotly.newPlot" not in raw  # no plotly.js embedded
    assert "/tmp/" not in raw and "Traceback" not in raw


@pytest.mark.parametrize("name", sorted(CLAIMS))
def test_stored_outputs_carry_the_claim(name):
    CLAIMS[name](nbformat.read(TUTORIALS / f"{name}.ipynb", as_version=4))


# ------------------------------------------------------------------------ executed again
@pytest.mark.integration
@pytest.mark.parametrize("name", sorted(CLAIMS))
def test_tutorial_executes(name, monkeypatch):
    for key, value in _executor().ENV.items():
        monkeypatch.setenv(key, value)  # offline; the kernel inherits it
    nb, _ = _executor().execute(TUTORIALS / f"{name}.ipynb")
    assert not [o for o in _outputs(nb) if o["output_type"] == "error"]
    CLAIMS[name](nb)
