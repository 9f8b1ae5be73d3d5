"""Result files damaged by hand, still valid JSON, end in one line naming the file, or load right.

Real results of several analyses are measured on a tiny model and saved (and every kind's file
ropelens keeps as a fixture, a report's ``report.json`` among them); hypothesis then damages
each file at a random place (deletes a key, changes a value's type, shortens or edits a list,
writes a string where a number was, makes the provenance a string) and loads and uses it: loads it,
draws its figure, writes its findings and table, merges it with a result of other windows. Nothing
may end in anything but :class:`~ropelens.errors.InputError` with one line that names the file,
unless the damage was harmless and the result loads and works.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
import torch
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

import ropelens
from ropelens.analyses import (
    attention_by_distance,
    attention_sinks,
    band_statistics,
    frequency_entropy,
    frequency_usage,
    head_taxonomy,
)
from ropelens.errors import InputError
from ropelens.results.serialize import tensor_to_json

ANALYSES = {
    "FrequencyUsage": lambda model, tokens: frequency_usage(model, tokens, progress=False),
    "AttentionSinks": lambda model, tokens: attention_sinks(model, tokens, progress=False),
    "BandStatistics": lambda model, tokens: band_statistics(model, tokens, progress=False),
    "AttentionByDistance": lambda model, tokens: attention_by_distance(
        model, tokens, progress=False
    ),
    "FrequencyEntropy": lambda model, tokens: frequency_entropy(model, tokens, progress=False),
    "HeadTaxonomy": lambda model, tokens: head_taxonomy(
        model, tokens, max_offset=2, progress=False
    ),
}


def _windows(seed: int) -> torch.Tensor:
    return torch.randint(4, 100, (2, 16), generator=torch.Generator().manual_seed(seed))


@pytest.fixture(scope="module")
def saved(tiny, tmp_path_factory) -> dict[str, tuple[dict[str, Any], Any]]:
    """Each analysis's saved file as JSON, with a result of other windows to merge it with."""
    folder = tmp_path_factory.mktemp("saved")
    model = tiny("llama")
    out = {}
    for name, measure in ANALYSES.items():
        first, second = measure(model, _windows(0)), measure(model, _windows(1))
        first.save(folder / f"{name}.json")
        out[name] = (json.loads((folder / f"{name}.json").read_text()), second)
    return out


# ---------------------------------------------------------------------------------- the damage
class Damaged:
    """A damaged file's content; shown as the analysis and what was done to it."""

    def __init__(self, name: str, content: dict[str, Any], what: str) -> None:
        self.name, self.content, self.what = name, content, what

    def __repr__(self) -> str:
        return f"Damaged({self.name}: {self.what})"


def _other_type(value: Any) -> list[Any]:
    """Values of another JSON type than ``value``."""
    choices = ["a string", 7, 0.5, -3, True, None, [], {}, [1, "x"], {"k": 1}]
    return [c for c in choices if type(c) is not type(value)]


@st.composite
def damaged(draw, files: dict[str, dict[str, Any]]) -> Damaged:
    """(analysis, its file damaged once, what was done): a path is walked down from the top,
    stopping at random, and the node there damaged."""
    name = draw(st.sampled_from(sorted(files)))
    data = copy.deepcopy(files[name])
    if draw(st.integers(0, 9)) == 0:
        data["provenance"] = draw(st.sampled_from(["tiny-llama", "", "{}"]))
        return Damaged(name, data, "provenance made a string")
    parent: Any = data
    key: Any = draw(st.sampled_from([k for k in data if k not in ("type", "format")]))
    path = [key]
    while isinstance(parent[key], dict | list) and parent[key] and draw(st.booleans()):
        parent = parent[key]
        key = draw(
            st.sampled_from(sorted(parent) if isinstance(parent, dict) else range(len(parent)))
        )
        path.append(key)
    node = parent[key]
    actions = ["delete", "retype"]
    if isinstance(node, list) and node:
        actions += ["shorten", "drop_one", "duplicate", "reverse"]
    if isinstance(node, int | float) and not isinstance(node, bool):
        actions += ["number_as_string", "negate", "huge"]
    action = draw(st.sampled_from(actions))
    if action == "delete":
        if isinstance(parent, dict):
            del parent[key]
        else:
            parent.pop(key)
    elif action == "retype":
        parent[key] = draw(st.sampled_from(_other_type(node)))
    elif action == "shorten":
        parent[key] = node[: draw(st.integers(0, len(node) - 1))]
    elif action == "drop_one":
        node.pop(draw(st.integers(0, len(node) - 1)))
    elif action == "duplicate":
        node.append(copy.deepcopy(node[0]))
    elif action == "reverse":
        node.reverse()
    elif action == "number_as_string":
        parent[key] = str(node)
    elif action == "negate":
        parent[key] = -node - 1
    else:
        parent[key] = node * 10**6 + 10**6
    return Damaged(name, data, f"{action} at {'/'.join(map(str, path))}")


def _use(result: Any, other: Any) -> None:
    """What a user does with a loaded result: its figure, findings, table and a merge."""
    result.figure()
    result.findings()
    result.to_frame()
    str(result._repr_text())
    if type(result).MERGE_SUMS:
        merged = result.merge(other)
        merged.findings()
        merged.to_frame()
        other.merge(result).figure()  # the damaged file on the other side


@settings(
    max_examples=400,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
    derandomize=True,
)
@given(data=st.data())
def test_damaged_file_ends_in_one_line_or_loads(saved, tmp_path, data):
    damage = data.draw(damaged({name: content for name, (content, _) in saved.items()}))
    name, content, what = damage.name, damage.content, damage.what
    path = tmp_path / f"{name}.json"
    path.write_text(json.dumps(content))
    try:
        result = ropelens.load_result(path)
    except InputError as e:
        message = str(e)
        assert "\n" not in message, f"{what}: the refusal is not one line: {message!r}"
        assert message.startswith(f"{path}: "), f"{what}: the refusal names no file: {message}"
        event("refused on loading")
        return
    except Exception as e:  # anything else is the failure this test finds
        raise AssertionError(f"{name}, {what}: loading raised {type(e).__name__}: {e}") from e
    try:
        _use(result, saved[name][1])
        event("loaded and used")
    except InputError as e:  # harmless-looking damage that only using the result reveals
        assert "\n" not in str(e), f"{what}: the refusal is not one line: {e}"
        event("refused on use")
    except Exception as e:
        raise AssertionError(f"{name}, {what}: using it raised {type(e).__name__}: {e}") from e


def _set(path: tuple[Any, ...], value: Any):
    def damage(content: dict[str, Any]) -> None:
        node = content
        for key in path[:-1]:
            node = node[key]
        node[path[-1]] = value(node[path[-1]]) if callable(value) else value

    return damage


@pytest.mark.parametrize(
    ("name", "damage", "message"),
    [
        (
            "FrequencyUsage",
            _set(("token", "q/all", "total"), lambda rows: rows[:-1]),
            "FrequencyUsage.token['q/all'].total has shape (1, 4, 8), expected (2, 4, 8) as "
            "FrequencyUsage.token['q/all'].count has",
        ),
        (
            "FrequencyUsage",
            _set(("provenance",), "tiny-llama"),
            "FrequencyUsage.provenance is the string 'tiny-llama', expected a Provenance object",
        ),
        (
            "AttentionSinks",
            _set(("layers",), [1]),
            "AttentionSinks.sums['n_queries'] has shape (2,), expected 1 rows first, one per "
            "layer of AttentionSinks.layers",
        ),
        (
            "AttentionSinks",
            _set(("layers",), [0, 7]),
            "AttentionSinks.layers[1] is 7, expected a layer index ≥ 0 of the 2 the spec holds",
        ),
        (
            "BandStatistics",
            _set(("spec", "layers", 0, "inv_freq", 2), "0.25"),
            "BandStatistics.spec.layers[0].inv_freq[2] is the string '0.25', expected a number",
        ),
        (
            "AttentionByDistance",
            _set(("edges",), lambda edges: [*edges[:-1], "far"]),
            "AttentionByDistance.edges[",
        ),
    ],
)
def test_the_damage_users_met_is_named(saved, tmp_path, name, damage, message):
    """A shortened sum, a provenance that is a string, an edited layer list, strings where
    frequencies go: each refused in one line naming the file, the field, what it holds and what
    was expected."""
    content = copy.deepcopy(saved[name][0])
    damage(content)
    path = tmp_path / f"{name}.json"
    path.write_text(json.dumps(content))
    with pytest.raises(InputError) as caught:
        ropelens.load_result(path)
    assert str(caught.value).startswith(f"{path}: {message}")
    assert "\n" not in str(caught.value)


def test_axes_a_type_names_alike_have_one_size(tmp_path):
    """``similarity: Float32[Tensor, "n_pos n_pos"]`` is square and as long as the curve over
    ``" n_dist"``'s fields is long: a file whose base64 similarity lost a column is refused."""
    content = json.loads((FIXTURES / "PESimilarity.json").read_text())
    n = content["similarity"]["shape"][0]
    square = ropelens.load_result(FIXTURES / "PESimilarity.json").similarity
    content["similarity"] = tensor_to_json(square[:, :-1])
    path = tmp_path / "pe.json"
    path.write_text(json.dumps(content))
    with pytest.raises(InputError) as caught:
        ropelens.load_result(path)
    assert str(caught.value) == (
        f"{path}: PESimilarity.similarity has {n - 1} along axis 1 ('n_pos'), expected {n} as "
        "PESimilarity.similarity has along axis 0"
    )
    content = json.loads((FIXTURES / "PESimilarity.json").read_text())
    content["count"] = content["count"][:-1]
    path.write_text(json.dumps(content))
    with pytest.raises(InputError, match=r"PESimilarity.count has \d+ along axis 0 \('n_dist'\)"):
        ropelens.load_result(path)


def test_a_key_edited_away_is_refused_naming_the_file_where_it_is_used(saved, tmp_path):
    """A table of sums whose keys the field types do not declare: the use that needs the missing
    key is refused naming the file."""
    content = copy.deepcopy(saved["AttentionSinks"][0])
    del content["sums"]["p0_sum"]
    path = tmp_path / "sinks.json"
    path.write_text(json.dumps(content))
    sinks = ropelens.load_result(path)
    with pytest.raises(InputError, match=r"sinks.json: AttentionSinks.figure\(\) cannot use"):
        sinks.figure()


def test_an_intact_file_loads_as_it_was_saved(saved, tmp_path):
    """The checks pass every file ropelens writes: each loads with the numbers it was saved with."""
    for name, (content, _) in saved.items():
        path = tmp_path / f"{name}.json"
        path.write_text(json.dumps(content))
        result = ropelens.load_result(path)
        again = tmp_path / f"{name}-again.json"
        result.save(again)
        assert json.loads(again.read_text()) == content, name


# ---------------------------------------------------------------------------------- every kind
FIXTURES = Path(__file__).parents[2] / "fixtures" / "results"
USES = ("figure", "findings", "to_frame")


@pytest.fixture(scope="module")
def fixtures() -> dict[str, tuple[dict[str, Any], tuple[str, ...]]]:
    """Every JSON fixture (each result kind ropelens writes, and a report.json) with the uses that
    work on it intact (a result with no figure drawn on its own is not asked for one)."""
    out = {}
    for path in sorted(FIXTURES.glob("*.json")):
        if path.name == "numbers.json":
            continue
        result = ropelens.load_result(path)
        works = []
        for use in USES:
            try:
                getattr(result, use)()
            except (NotImplementedError, AttributeError, TypeError):
                continue
            works.append(use)
        out[path.stem] = (json.loads(path.read_text()), tuple(works))
    return out


@settings(
    max_examples=400,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
    derandomize=True,
)
@given(data=st.data())
def test_every_kind_damaged_ends_in_one_line_or_loads(fixtures, tmp_path, data):
    damage = data.draw(damaged({name: content for name, (content, _) in fixtures.items()}))
    name, what = damage.name, damage.what
    path = tmp_path / f"{name}.json"
    path.write_text(json.dumps(damage.content))
    try:
        result = ropelens.load_result(path)
    except InputError as e:
        assert "\n" not in str(e), f"{what}: the refusal is not one line: {e}"
        assert str(path) in str(e), f"{name}, {what}: the refusal names no file: {e}"
        event("refused on loading")
        return
    except Exception as e:  # anything else is the failure this test finds
        raise AssertionError(f"{name}, {what}: loading raised {type(e).__name__}: {e}") from e
    event("loaded")
    for use in fixtures[name][1]:
        try:
            getattr(result, use)()
        except InputError as e:
            assert "\n" not in str(e), f"{what}: the refusal is not one line: {e}"
            event(f"{use}() refused")
        except Exception as e:
            raise AssertionError(f"{name}, {what}: {use}() raised {type(e).__name__}: {e}") from e
