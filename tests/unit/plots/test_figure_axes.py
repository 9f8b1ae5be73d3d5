"""Every registered figure, drawn from a result measured on a subset of a model's layers, labels
its axes with what was measured: layer axes carry the measured layers, head axes the heads, band
axes the band names.

An axis says what it holds through its title (``layer``, ``head``, ``kv head``, ``band``, ``context
length`` …) or through its trace's hover text (``layer %{y}``). The test reads each trace's x and y
(the row and column labels of a heatmap; plotly numbers unlabelled ones 0, 1, …) on every axis that
names what it holds, and compares them with the result's own layers, heads, bands, lengths or steps.
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import plotly.graph_objects as go
import pytest
import torch

from ropelens import Bands, Provenance
from ropelens.analyses.attention_by_distance import attention_by_distance
from ropelens.analyses.attention_decomposition import attention_decomposition
from ropelens.analyses.attention_sinks import attention_sinks
from ropelens.analyses.band_location import band_location
from ropelens.analyses.band_statistics import band_statistics
from ropelens.analyses.base_predictions import MeasuredExtrapolation, base_predictions
from ropelens.analyses.decay import rope_decay_by_distance
from ropelens.analyses.extension_planes import LongRopeSearch, extension_planes
from ropelens.analyses.extension_study import extension_study
from ropelens.analyses.frequency_entropy import frequency_entropy
from ropelens.analyses.frequency_usage import frequency_usage
from ropelens.analyses.head_taxonomy import head_taxonomy
from ropelens.analyses.intervention_effect import intervention_effect
from ropelens.analyses.knockout import knockout
from ropelens.analyses.massive_values import massive_values
from ropelens.analyses.mrope_decomposition import mrope_decomposition
from ropelens.analyses.passkey_retrieval import PasskeyRetrieval, PasskeyTrial
from ropelens.analyses.pe_geometry import pe_similarity, sinusoidal_pe
from ropelens.analyses.positional_symbolic import positional_symbolic
from ropelens.analyses.retrieval_heads import retrieval_heads
from ropelens.analyses.rotary_offsets import rotary_offsets
from ropelens.analyses.trajectory import ANALYSES, STRUCTURES, Checkpoint, Trajectory
from ropelens.loading.models import wrap_hf_model
from ropelens.results.figures import registered_figures
from ropelens.spec.reading import rope_spec
from ropelens.spec.variants import Linear, PRoPE
from ropelens.testing import tiny_hf_model, tiny_model, tiny_tokenizer
from ropelens.testing.vl import vl_hf_model, vl_inputs

N_LAYERS, N_HEADS, N_KV_HEADS = 6, 4, 2
HEADS, KV_HEADS = list(range(N_HEADS)), list(range(N_KV_HEADS))
MEASURED = [1, 3, 4]  # a subset that is neither 0..n-1 nor every layer
QK_SCALE = 16.0  # random init (std 0.02) gives near-uniform attention; this spreads the logits
BANDS = Bands.quantiles(2)
N_CTX = 16
PROVENANCE = Provenance(model="tiny")

# What an axis title or a hover label says an axis holds, read from its start (most specific first).
ROLES = (
    ("layer.head", r"layer\.head"),
    ("kv head", r"kv head"),
    ("head", r"head\b"),
    ("layer", r"layer\b"),
    ("band", r"band\b"),
    ("length", r"(context|prompt) length"),
    ("depth", r"depth"),
    ("step", r"training step"),
    ("dose", r"planes zeroed"),
    ("generation", r"generation\b"),
)


@dataclass
class Case:
    """A result, the arguments its figure is drawn with and what each labelled axis must carry."""

    result: Any
    expect: dict[str, list[Any]]
    args: tuple[Any, ...] = ()
    kwargs: dict[str, Any] = field(default_factory=dict)
    check: Callable[[go.Figure], None] | None = None  # what the axes cannot say (subplot titles)


def tokens(n_windows: int = 2, seq: int = N_CTX) -> torch.Tensor:
    """Random ASCII windows that start with BOS."""
    toks = torch.randint(4, 101, (n_windows, seq), generator=torch.Generator().manual_seed(0))
    toks[:, 0] = 1
    return toks


@functools.cache
def six_layer_model():
    """A 6-layer GQA Llama, its query and key weights scaled up so attention is far from uniform."""
    hf = tiny_hf_model("llama-gqa", num_hidden_layers=N_LAYERS)
    with torch.no_grad():
        for layer in hf.model.layers:
            layer.self_attn.q_proj.weight.mul_(QK_SCALE)
            layer.self_attn.k_proj.weight.mul_(QK_SCALE)
    return wrap_hf_model(hf, tiny_tokenizer(), device="cpu", label="tiny-6", hub_name="tiny-6")


def band_names() -> list[str]:
    """The names of BANDS on the six-layer model's layers."""
    return list(BANDS.resolve(rope_spec(six_layer_model()).layers[MEASURED[0]]).names)


def layered(expect_heads: bool = False, expect_bands: bool = False) -> dict[str, list[Any]]:
    """The measured layers, and the heads and band names when the figure has those axes."""
    expect: dict[str, list[Any]] = {"layer": MEASURED}
    if expect_heads:
        expect["head"] = HEADS
    if expect_bands:
        expect["band"] = band_names()
    return expect


def corpus_run() -> dict[str, Any]:
    """Keyword arguments for a streaming analysis on the measured layers."""
    return {"layers": MEASURED, "n_ctx": N_CTX, "progress": False}


def subplot_titles(fig: go.Figure) -> list[str]:
    """The texts of the figure's annotations (make_subplots writes subplot titles there)."""
    return [a.text for a in fig.layout.annotations if a.text]


def bands_title_panels(names: list[str]) -> Callable[[go.Figure], None]:
    """A check that the band names title the first panels."""

    def check(fig: go.Figure) -> None:
        assert subplot_titles(fig)[: len(names)] == names

    return check


@functools.cache
def make_usage():
    u = frequency_usage(six_layer_model(), tokens(), **corpus_run())
    return [
        Case(u, layered()),
        Case(u, {"head": HEADS, "kv head": KV_HEADS}, (), {"layer": 3}),
    ]


@functools.cache
def make_usage_heatmap():
    u = frequency_usage(six_layer_model(), tokens(), **corpus_run())
    return [Case(u, layered()), Case(u, {"kv head": KV_HEADS}, ("k",), {"layer": 4})]


@functools.cache
def make_decomposition():
    dec = attention_decomposition(six_layer_model(), tokens(1), bands=BANDS, layers=MEASURED)
    names = band_names()
    return [
        Case(dec, {}, check=bands_title_panels(names)),
        Case(dec, {}, (3,), {"head": 1}, check=bands_title_panels(names)),
    ]


def square_planes(fig: go.Figure) -> None:
    """Each panel of the rotation figure (each pair of axes with traces): both axes titled, the y
    axis tied to its own x axis at 1:1 over the same range (circles look round), and every vector
    within the range."""
    xs = sorted({"xaxis" + (t.xaxis or "x")[1:] for t in fig.data})
    assert xs, "no panels"
    for x_name in xs:
        y_name = "yaxis" + x_name[len("xaxis") :]
        x, y = fig.layout[x_name], fig.layout[y_name]
        assert x.title.text and y.title.text, f"{x_name}/{y_name} untitled"
        assert y.scaleanchor == "x" + x_name[len("xaxis") :] and y.scaleratio == 1
        assert tuple(x.range) == tuple(y.range) and x.range[0] == -x.range[1]
    for trace in fig.data:
        ref = (trace.xaxis or "x")[1:]
        lim = fig.layout[f"xaxis{ref}"].range[1]
        assert all(abs(v) <= lim for v in [*trace.x, *trace.y] if v is not None), trace.name


@functools.cache
def make_rotation():
    (case, _) = make_decomposition()
    dec = case.result
    return [
        Case(dec, {}, check=square_planes),
        Case(dec, {}, (3, 1), {"query": 9, "keys": [9, 2], "planes": [0, 7, 3]}, square_planes),
    ]


def page_labels(names: list[str], layers: list[int]) -> Callable[[Any], None]:
    """The band mixer page (HTML, not a plotly figure) holds the measured layers, each layer's
    heads and the band names."""

    def check(page: Any) -> None:
        found = re.search(r"id='ropelens-data'>(.*?)</script>", page.html)
        data = json.loads(found.group(1).replace("<\\/", "</"))
        assert [e["layer"] for e in data["layers"]] == layers == list(page.layers)
        for e in data["layers"]:
            assert e["n_heads"] == len(HEADS)
            assert [b["name"] for b in e["bands"]] == names

    return check


@functools.cache
def make_decomposition_page():
    dec = attention_decomposition(six_layer_model(), tokens(1), bands=BANDS, layers=MEASURED)
    names = band_names()
    return [
        Case(dec, {}, check=page_labels(names, MEASURED)),
        Case(dec, {}, kwargs={"layers": [4, 1]}, check=page_labels(names, [4, 1])),
    ]


@functools.cache
def make_band_statistics():
    st = band_statistics(six_layer_model(), tokens(), bands=BANDS, **corpus_run())
    names = band_names()
    return [
        Case(st, {"layer": MEASURED, "band": names}),
        Case(st, {"head": HEADS, "band": names}, (3,)),
    ]


@functools.cache
def make_band_statistics_heatmap():
    st = make_band_statistics()[0].result
    return [
        Case(st, layered(expect_bands=True)),
        Case(st, {"head": HEADS, "band": band_names()}, ("var_share", 3)),
    ]


@functools.cache
def make_head_taxonomy():
    tax = head_taxonomy(
        six_layer_model(), tokens(), n_ctx=N_CTX, n_windows=2, max_offset=2, bands=BANDS,
        layers=MEASURED, progress=False,
    )  # fmt: skip
    pairs = [(layer, head) for layer in MEASURED for head in range(N_HEADS)]
    return [Case(tax, {"layer.head": pairs, "band": band_names()})]


@functools.cache
def make_head_scatter():
    (case,) = make_head_taxonomy()
    return [Case(case.result, {})]


@functools.cache
def make_sinks():
    snk = attention_sinks(six_layer_model(), tokens(), bands=BANDS, **corpus_run())

    def check(fig: go.Figure) -> None:
        attention = fig.data[0]  # a share of attention: its colours span [0, 1] on every model
        assert (attention.zmin, attention.zmax) == (0, 1)
        shares = np.asarray(attention.z, dtype=float)
        assert np.nanmax(shares) < 1 and np.nanmax(shares) - np.nanmin(shares) > 0.1  # not uniform

    return [Case(snk, layered(expect_heads=True, expect_bands=True), check=check)]


@functools.cache
def make_distance():
    res = attention_by_distance(six_layer_model(), tokens(), bands=BANDS, **corpus_run())

    def check(fig: go.Figure) -> None:
        legend = [t.name for t in fig.data if t.showlegend is not False]
        assert legend[: len(band_names())] == band_names()

    return [Case(res, {}, check=check), Case(res, {}, ([3],), check=check)]


@functools.cache
def make_massive():
    return [Case(massive_values(six_layer_model(), tokens(), **corpus_run()), layered())]


@functools.cache
def make_offsets():
    off = rotary_offsets(six_layer_model(), tokens(), **corpus_run())
    return [Case(off, layered()), Case(off, {"head": HEADS}, (3,))]


@functools.cache
def make_offsets_heatmap():
    off = rotary_offsets(six_layer_model(), tokens(), **corpus_run())
    return [Case(off, layered()), Case(off, {"head": HEADS}, ("k_ratio", 3))]


@functools.cache
def make_positional_symbolic():
    ps = positional_symbolic(six_layer_model(), tokens(), min_keys=4, **corpus_run())
    return [Case(ps, layered(expect_heads=True))]


@functools.cache
def make_entropy():
    return [Case(frequency_entropy(six_layer_model(), tokens(), **corpus_run()), layered())]


@functools.cache
def make_band_location():
    fb = band_location(six_layer_model(), tokens(), intervene=False, **corpus_run())
    return [Case(fb, layered())]


@functools.cache
def make_pe_similarity():
    return [Case(pe_similarity(sinusoidal_pe(32, 16), name="sinusoidal"), {})]


@functools.cache
def make_by_distance_line():
    sim = pe_similarity(sinusoidal_pe(32, 16), name="sinusoidal")

    def check(fig: go.Figure) -> None:
        assert list(fig.data[0].x) == sim.distance.tolist()

    return [Case(sim, {}, check=check)]


@functools.cache
def make_decay_curve():
    model = six_layer_model()
    layer_rope = rope_spec(model).layers[MEASURED[0]]
    generator = torch.Generator().manual_seed(0)
    query = torch.randn(1, N_CTX, layer_rope.head_dim, generator=generator)  # batch pos d_head
    key = torch.randn(1, N_CTX, layer_rope.head_dim, generator=generator)
    curve = rope_decay_by_distance(query, key, layer_rope, 8)

    def check(fig: go.Figure) -> None:
        assert list(fig.data[-1].x) == curve.distance.tolist()

    return [Case(curve, {}, check=check)]


@functools.cache
def make_extension_planes():
    view = extension_planes(rope_spec(six_layer_model())[MEASURED[0]], Linear(2.0), 32, 64)
    return [Case(view, {})]


@functools.cache
def make_longrope_search():
    search = LongRopeSearch(
        target_len=64, original_ctx=32, factors=(1.0, 2.0), n_hat=0, perplexity=3.0,
        initial_best=3.5, baselines={"PI": 4.0}, settings={}, provenance=PROVENANCE,
        history=tuple(
            {"generation": g, "best": 3.0, "mean": 3.5, "n_evaluated": 4} for g in (0, 1, 2)
        ),
    )  # fmt: skip
    return [Case(search, {"generation": [0, 1, 2]})]


@functools.cache
def make_base_predictions():
    pred = base_predictions(rope_spec(six_layer_model()), [64, 128, 512])
    return [Case(pred, {"length": [64, 128, 512]})]


@functools.cache
def make_measured_extrapolation():
    estimate = {
        "n_windows": 2,
        "loss": {"mean": 1.0, "lo": 0.9, "hi": 1.1},
        "perplexity": {"mean": 2.7, "lo": 2.5, "hi": 3.0},
    }
    meas = MeasuredExtrapolation(
        lengths=(64, 256), estimates=(estimate, estimate), window_losses=((1.0, 1.0), (1.0, 1.0)),
        train_ctx=32, provenance=PROVENANCE,
    )  # fmt: skip
    return [Case(meas, {"length": [64, 256]})]


@functools.cache
def make_passkey():
    trials = tuple(
        PasskeyTrial(
            length=length,
            depth=depth,
            trial=0,
            passkey="12345",
            n_tokens=length,
            token_depth=depth,
            response="12345",
            answer="12345",
            correct=True,
        )  # fmt: skip
        for length in (64, 1024)
        for depth in (0.25, 0.75)
    )
    res = PasskeyRetrieval(
        lengths=(64, 1024), depths=(0.25, 0.75), trials=trials, provenance=PROVENANCE
    )
    return [Case(res, {"length": [64, 1024], "depth": [0.25, 0.75]})]


@functools.cache
def make_retrieval_heads():
    rh = retrieval_heads(
        six_layer_model(), lengths=[300], depths=[0.5], n_trials=1, top_k=2, seed=2
    )
    return [Case(rh, {"layer": list(range(N_LAYERS)), "head": HEADS})]


def make_extension_study(tmp_dir):
    study = extension_study(
        tiny_model("llama", max_position_embeddings=64), 128, methods=("none", "pi"), start=64,
        n_windows=1, depths=(0.5,), out=tmp_dir, progress=False,
    )  # fmt: skip
    return [Case(study, {"length": list(study.lengths)})]


@functools.cache
def make_knockout():
    result = knockout(
        six_layer_model(), {"set": [(1, 0), (3, 2)]}, doses=[0, 2], metrics=("loss",),
        corpus=tokens(), n_random=1, n_control=1, n_boot=100, verify=False,
    )  # fmt: skip
    return [Case(result, {"dose": [0, 2, result.n_planes]})]  # whole heads: every plane zeroed


@functools.cache
def make_intervention_effect():
    effect = intervention_effect(six_layer_model(), PRoPE(0.5), tokens(), layers=[1, 3])
    return [Case(effect, {"layer": [1, 3], "band": effect.band_names})]


@functools.cache
def make_trajectory():
    traj = Trajectory(
        records=tuple(
            (step, f"step-{step}", structure.analysis, structure.metric, -1, float(value))
            for structure in STRUCTURES
            for step, value in ((0, 0.0), (100, 3.0), (1000, 4.0))
        ),
        checkpoints=tuple(Checkpoint(step, f"step-{step}") for step in (0, 100, 1000)),
        analyses=ANALYSES,
        structures=STRUCTURES,
        provenance=PROVENANCE,
    )
    return [Case(traj, {"step": [0, 100, 1000]})]


@functools.cache
def make_mrope():
    vl = vl_hf_model("qwen2_vl")
    dec = mrope_decomposition(vl, **vl_inputs(vl), layers=[1])
    n_heads = vl.config.get_text_config().num_attention_heads
    return [Case(dec, {"head": list(range(n_heads))})]


def make_claims():
    """Made-up claims: each panel's x axis names its claim's metric (the axis roles this test
    reads are layers, heads and positions, which a forest plot has none of)."""
    from ropelens.plots.claims import x_axis_title
    from tests.unit.claims.test_markdown import made_up_result

    result = made_up_result()

    def metric_axes(fig: go.Figure) -> None:
        titles = {fig.layout[key].title.text for key in fig.layout if key.startswith("xaxis")}
        titles.discard(None)
        assert titles and titles <= {x_axis_title(row) for row in result.rows}, titles

    return [Case(result, {}, check=metric_axes)]


# (result class name, figure name) -> the cases that draw it; the tmp-dir makers take a folder
MAKERS: dict[tuple[str, str], Callable[..., list[Case]]] = {
    ("FrequencyUsage", "figure"): make_usage,
    ("FrequencyUsage", "heatmap"): make_usage_heatmap,
    ("AttentionDecomposition", "figure"): make_decomposition,
    ("AttentionDecomposition", "rotation"): make_rotation,
    ("AttentionDecomposition", "explore"): make_decomposition_page,
    ("BandStatistics", "figure"): make_band_statistics,
    ("BandStatistics", "heatmap"): make_band_statistics_heatmap,
    ("HeadTaxonomy", "figure"): make_head_taxonomy,
    ("HeadTaxonomy", "scatter"): make_head_scatter,
    ("AttentionSinks", "figure"): make_sinks,
    ("AttentionByDistance", "figure"): make_distance,
    ("ByDistance", "line"): make_by_distance_line,
    ("MassiveValues", "figure"): make_massive,
    ("RotaryOffsets", "figure"): make_offsets,
    ("RotaryOffsets", "heatmap"): make_offsets_heatmap,
    ("PositionalSymbolic", "figure"): make_positional_symbolic,
    ("FrequencyEntropy", "figure"): make_entropy,
    ("BandLocation", "figure"): make_band_location,
    ("PESimilarity", "figure"): make_pe_similarity,
    ("PESimilarity", "heatmap"): make_pe_similarity,
    ("DecayCurve", "figure"): make_decay_curve,
    ("ExtensionPlanes", "figure"): make_extension_planes,
    ("LongRopeSearch", "figure"): make_longrope_search,
    ("BasePredictions", "figure"): make_base_predictions,
    ("MeasuredExtrapolation", "figure"): make_measured_extrapolation,
    ("PasskeyRetrieval", "figure"): make_passkey,
    ("RetrievalHeads", "figure"): make_retrieval_heads,
    ("ExtensionStudy", "figure"): make_extension_study,
    ("Knockout", "figure"): make_knockout,
    ("InterventionEffect", "figure"): make_intervention_effect,
    ("Trajectory", "figure"): make_trajectory,
    ("ClaimsResult", "figure"): make_claims,
    ("MRopeDecomposition", "figure"): make_mrope,
}
NEEDS_FOLDER = {make_extension_study}


def role_of(text: str | None) -> str | None:
    """What an axis title or hover label says the axis holds (None: nothing this test checks)."""
    text = (text or "").strip().lower()
    for role, pattern in ROLES:
        if re.match(pattern, text):
            return role
    return None


def hover_role(trace: Any, dim: str) -> str | None:
    """What the trace's hover text calls its ``dim`` values (``layer %{y}``), if anything."""
    template = getattr(trace, "hovertemplate", None) or ""
    found = re.findall(r"([A-Za-z][A-Za-z. ]*?) %\{" + dim + r"\b", template)
    return role_of(found[-1].split("<br>")[-1]) if found else None


def axis_of(fig: go.Figure, trace: Any, dim: str) -> Any:
    """The layout of the ``dim`` axis (``x`` or ``y``) the trace is drawn on."""
    ref = getattr(trace, f"{dim}axis", None) or dim  # "x", "x2", …
    return fig.layout[f"{dim}axis{ref[1:]}"]


def axis_title(fig: go.Figure, trace: Any, dim: str) -> str | None:
    """The title of the ``dim`` axis the trace is drawn on."""
    return axis_of(fig, trace, dim).title.text


def axis_values(trace: Any, dim: str) -> list[Any]:
    """The trace's ``dim`` values, or the 0, 1, … plotly draws where a trace gives none."""
    values = trace[dim]
    if values is None and isinstance(trace, go.Heatmap):
        z = np.asarray(trace.z)
        values = range(z.shape[0] if dim == "y" else z.shape[1])
    elif values is None:
        other = trace["y" if dim == "x" else "x"]
        values = range(len(other))
    return [v.item() if isinstance(v, np.generic) else v for v in values]


def as_number(value: Any) -> float:
    """A label's number: ``3``, ``"3 (global)"``, ``"L3"``, ``"1,024"`` or ``"0.25"``."""
    if isinstance(value, str):
        match = re.match(r"L?(-?[\d,]+(\.\d+)?)", value)
        assert match, f"label {value!r} does not start with a number"
        return float(match.group(1).replace(",", ""))
    return float(value)


def head_pair(label: str) -> tuple[int, int]:
    """A head's label, ``L3.H1`` (never a bare ``3.1``, which reads as a decimal), as (3, 1)."""
    match = re.fullmatch(r"L(\d+)\.H(\d+)", label)
    assert match, f"head label {label!r} is not of the form L3.H1"
    return int(match.group(1)), int(match.group(2))


def normalise(role: str, values: list[Any]) -> list[Any]:
    """Labels in the form the expectations use: numbers, band names, (layer, head) pairs."""
    if role == "band":
        return list(values)
    if role == "layer.head":
        return [v if isinstance(v, tuple) else head_pair(v) for v in values]
    return [as_number(v) for v in values]


def labelled_axes(fig: go.Figure) -> list[tuple[str, str, Any, list[Any]]]:
    """(role, dim, trace, values) for each trace axis whose title or hover says what it holds."""
    found = []
    for trace in fig.data:
        for dim in ("x", "y"):
            by_title = role_of(axis_title(fig, trace, dim))
            by_hover = hover_role(trace, dim)
            assert by_title is None or by_hover is None or by_title == by_hover, (
                f"{trace.type} {trace.name!r}: the {dim} axis is titled {by_title!r} but its hover "
                f"text says {by_hover!r}"
            )
            role = by_title or by_hover
            if role is not None:
                found.append((role, dim, trace, normalise(role, axis_values(trace, dim))))
    return found


def check_axes(fig: go.Figure, expect: dict[str, list[Any]]) -> None:
    """Every labelled axis carries its expected labels (all of them in order for a heatmap or a bar
    chart, some of them for markers and lines), and every expected kind of axis is there."""
    found = labelled_axes(fig)
    assert {role for role, *_ in found} == set(expect), (
        f"axes found {sorted({role for role, *_ in found})}, expected {sorted(expect)}"
    )
    for role, dim, trace, values in found:
        wanted = normalise(role, expect[role])
        where = f"{trace.type} {trace.name!r} {dim} ({role})"
        if isinstance(trace, go.Heatmap | go.Bar):
            assert values == wanted, f"{where}: {values} != {wanted}"
        else:
            assert set(values) <= set(wanted), f"{where}: {values} not within {wanted}"


def check_layer_categories(fig: go.Figure) -> None:
    """Layer axes of numbers are categories: a row per measured layer, none for layers skipped."""
    for role, dim, trace, _values in labelled_axes(fig):
        labels = list(trace[dim] if trace[dim] is not None else [])
        if role == "layer" and labels and not isinstance(labels[0], str):
            axis_type = axis_of(fig, trace, dim).type
            assert axis_type == "category", f"{trace.type} {trace.name!r}: {dim} is {axis_type!r}"


def check_named_layers(fig: go.Figure, measured: list[int]) -> None:
    """Every layer the title or a subplot title names was measured."""
    texts = [fig.layout.title.text or "", *subplot_titles(fig)]
    named = {int(n) for text in texts for n in re.findall(r"\b[Ll]ayer (\d+)\b", text)}
    assert named <= set(measured), f"titles name layers {sorted(named)}, measured {measured}"


def as_figure(drawn: Any) -> go.Figure:
    """A figure, or a figure holding the drawn trace(s)."""
    if isinstance(drawn, go.Figure):
        return drawn
    return go.Figure(drawn if isinstance(drawn, list) else [drawn])


FIGURES = sorted(registered_figures().items(), key=lambda item: (item[0][0].__name__, item[0][1]))


@pytest.mark.parametrize(
    "key, draw", FIGURES, ids=[f"{cls.__name__}.{name}" for (cls, name), _ in FIGURES]
)
def test_every_figure_labels_its_axes_with_what_was_measured(key, draw, tmp_path):
    cls, name = key
    maker = MAKERS.get((cls.__name__, name))
    assert maker is not None, (
        f"figure {name!r} of {cls.__name__} ({draw.__module__}.{draw.__name__}) has no result to "
        "draw here: add a maker to MAKERS in tests/unit/plots/test_figure_axes.py"
    )
    cases = maker(tmp_path) if maker in NEEDS_FOLDER else maker()
    for case in cases:
        assert isinstance(case.result, cls)
        drawn = draw(case.result, *case.args, **case.kwargs)
        if hasattr(drawn, "html"):  # an interactive page: its data names what it holds
            case.check(drawn)
            continue
        fig = as_figure(drawn)
        check_axes(fig, case.expect)
        if isinstance(drawn, go.Figure):  # a lone trace leaves its axes to the figure it joins
            check_layer_categories(fig)
        check_named_layers(fig, getattr(case.result, "layers", MEASURED))
        if case.check is not None:
            case.check(fig)
