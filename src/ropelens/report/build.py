"""``build_report``: measure, lay out, and write the report directory atomically."""

from __future__ import annotations

import contextlib
import json
import math
import os
import shutil
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from tqdm.auto import tqdm

from ropelens.backends import backend_of
from ropelens.devices import device_of
from ropelens.errors import ExportUnavailableError, InputError
from ropelens.loading.models import load_model, resolve_device, resolve_dtype
from ropelens.plots.export import FIGURE_FORMATS, export_unavailable, write_figures
from ropelens.report import html as H
from ropelens.report import registry as _sections
from ropelens.report.cards import finding_card
from ropelens.report.claims import (
    CLAIMS_KEY,
    check_claims_budget,
    claims_section,
    measure_claims,
)
from ropelens.report.collect import ReportData, collect, evenly_spaced
from ropelens.report.experiments import load_experiments
from ropelens.report.mixer import MIXER_AFTER, band_mixer_html, measure_mixer
from ropelens.report.section import Section
from ropelens.report.summary import summary_figure
from ropelens.results.provenance import (
    Provenance,
    git_commit,
    placement,
    untested_versions,
    versions,
)
from ropelens.results.report_file import is_report
from ropelens.run import data
from ropelens.run.data import CORPORA, StreamedCorpus, analysis_windows
from ropelens.run.distributed import is_main, local
from ropelens.run.verify import skip_verification, verification
from ropelens.spec.bands import Bands
from ropelens.spec.plan import describe_intervention
from ropelens.spec.reading import model_label, rope_spec
from ropelens.spec.surface import running_model
from ropelens.validate import check_positive_int

__all__ = [
    "DEFAULT_BAND_TOKENS",
    "QUICK",
    "build_report",
    "check_figures",
    "check_output_dir",
    "figure_files",
    "measure_sections",
    "render_sections",
    "resolve_corpus",
]

FORMAT = 1
FIGURES_DIR = "figures"  # where figures= writes the page's figures as files
# Band statistics add ~0.8× a forward pass per window in the report (benchmarks/report_bench.py), so
# by default they see 8k evenly spread tokens of the 32k frequency usage sees: per-head means over
# 8,192 queries, and the report within 2× HF's own sdpa forward over its tokens; None means every
# window.
DEFAULT_BAND_TOKENS: int | None = 8192
QUICK = {"n_ctx": 256, "windows": 4, "layers": 6}


@contextlib.contextmanager
def _timed(steps: dict[str, float], name: str) -> Iterator[None]:
    t0 = time.perf_counter()
    try:
        yield
    finally:
        steps[name] = round(time.perf_counter() - t0, 3)


def check_output_dir(out: str | os.PathLike[str], figures: str | None = None) -> Path:
    """Check that the output directory can be written, creating nothing: a probe folder is made in
    the directory (or, where it does not exist yet, in its nearest existing parent) and removed at
    once. The directory itself is created only when the finished report is written.

    In an existing directory the report replaces an earlier report's files (:func:`_write`) and
    leaves other files as they are; a ``figures`` file there is refused where ``figures`` asks for
    a ``figures/`` folder."""
    path = Path(out).expanduser()
    if path.exists() and not path.is_dir():
        raise NotADirectoryError(f"output path {path} is a file: pass a directory for the report")
    if path.is_dir():
        _check_report_folder(path, figures)
    ancestor = path
    while not ancestor.exists() and ancestor != ancestor.parent:
        ancestor = ancestor.parent
    if not ancestor.is_dir():
        raise NotADirectoryError(
            f"cannot write the report to {path} ({ancestor} is a file, not a directory): choose "
            "a writable output directory"
        )
    try:
        os.rmdir(tempfile.mkdtemp(prefix=".ropelens-probe-", dir=ancestor))
    except OSError as e:
        raise PermissionError(
            f"cannot write the report to {path} ({e.strerror or e}): choose a writable output "
            "directory"
        ) from e
    return path


def _check_report_folder(path: Path, figures: str | None) -> None:
    """Refuse an existing output folder the report cannot be written whole into: one with a
    ``figures`` file where ``figures`` asks for a ``figures/`` folder."""
    folder = path / FIGURES_DIR
    if figures is not None and folder.exists() and not folder.is_dir():
        raise InputError(
            f"{folder} is a file, and figures={figures!r} writes the figures into a folder of that "
            f"name: move or remove {folder}, or pass another output folder"
        )


def _earlier_report(path: Path) -> set[str] | None:
    """The files an earlier report wrote into ``path`` (names relative to it), read from its
    ``report.json``; None where ``path`` holds no report."""
    try:
        data = json.loads((path / "report.json").read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return None
    if not isinstance(data, dict) or not is_report(data):
        return None
    names = {"index.html", "report.json"}
    for section in data.get("sections") or []:
        tables = section.get("tables") if isinstance(section, dict) else None
        names.update(t for t in tables or [] if isinstance(t, str))
    names.update(f for f in data.get("figures") or [] if isinstance(f, str))
    # only plain names in the folder or its figures/: never a path out of it
    return {n for n in names if _within_report(n)}


def _within_report(name: str) -> bool:
    parts = Path(name).parts
    return (len(parts) == 1 or (len(parts) == 2 and parts[0] == FIGURES_DIR)) and ".." not in parts


def _make_dir(path: Path) -> Path | None:
    """Create ``path`` and its missing parents; the topmost folder this created (None: ``path``
    existed)."""
    top = None
    p = path
    while not p.exists() and p != p.parent:
        top, p = p, p.parent
    try:
        path.mkdir(parents=True, exist_ok=True)
    except BaseException:
        if top is not None:
            shutil.rmtree(top, ignore_errors=True)
        raise
    return top


def resolve_corpus(corpus: Any, text_column: str = "text") -> tuple[Any, dict[str, Any]]:
    """A Corpus (or token tensor) and its description; fails before any model is loaded.

    ``corpus`` is any form :func:`ropelens.run.data.load_corpus` reads (``text_column``: the text
    of a table or dataset); a streamed corpus's fingerprint is filled in once its windows are cut.
    """
    import torch

    if isinstance(corpus, torch.Tensor):
        return corpus, {
            "name": "tokens",
            "sha256": None,
            "source": f"token tensor {tuple(corpus.shape)}",
        }
    c = data.load_corpus(corpus, text_column=text_column)
    if isinstance(c, data.StreamedCorpus):
        return c, {"name": c.name, "sha256": None, "source": c.source}
    return c, {"name": c.name, "sha256": c.sha256, "source": c.source, "n_documents": c.n_documents}


def _same_device(a, b) -> bool:
    import torch

    def index(d):  # "cuda" means the current GPU
        return torch.cuda.current_device() if d.type == "cuda" and d.index is None else d.index

    return a.type == b.type and index(a) == index(b)


def _check_model(model: Any, device: Any, dtype: Any) -> tuple[Any, Any]:
    """The device and dtype to load with, checked before anything loads; for a loaded model, that
    they match it."""
    dev = None if device is None else resolve_device(device)
    dt = None if dtype is None else resolve_dtype(dtype)
    if model is None or isinstance(model, (str, os.PathLike)):
        return dev, dt

    if not backend_of(model).runs_analyses:
        raise InputError(
            f"model must be an embedded name, a path, or a model from ropelens.load_model; got a "
            f"{type(model).__name__}: wrap an HF model with ropelens.loading.models.wrap_hf_model"
        )
    # A loaded model stays where it is: moving it would change the caller's model (and a
    # device-mapped one cannot move), so a placement that disagrees with it is refused.
    have = device_of(model)
    if dev is not None and not _same_device(dev, have):
        raise InputError(
            f"device={device!r} conflicts with the loaded model, which is on {have}: pass "
            f"device=None (or {str(have)!r}), or move the model first (model.to({str(dev)!r}))"
        )
    have_dt = next((p.dtype for p in model.parameters() if p.is_floating_point()), None)
    if dt is not None and have_dt is not None and dt != have_dt:
        raise InputError(
            f"dtype={dtype!r} conflicts with the loaded model, whose weights are {have_dt}: pass "
            f"dtype=None, or load the model with dtype={str(dt).removeprefix('torch.')!r}"
        )
    return None, None


def _load(model: Any, device: Any, dtype: Any) -> tuple[Any, str]:
    if model is None or isinstance(model, (str, os.PathLike)):
        model = load_model(model, device=device, **({} if dtype is None else {"dtype": dtype}))
    return model, model_label(model)


def _choose_layers(spec, layers: Sequence[int] | None, quick: bool) -> list[int]:
    if layers is not None:
        chosen = spec.layer_indices(list(layers))
        if not chosen:
            raise InputError("no layers selected: pass at least one layer index")
        return sorted(set(chosen))
    if not quick:
        return spec.layer_indices(None)
    picks = {L for L in evenly_spaced(spec.n_layers, QUICK["layers"]) if spec.layers[L].rotary}
    for idx in spec.rotary_kinds.values():  # every layer kind stays in a quick report
        picks.add(idx[0])
    return sorted(picks)


def build_report(
    model: Any = None,
    corpus: Any = "english",
    tokens: int = 32_768,
    n_ctx: int = 512,
    out: str | os.PathLike[str] = "ropelens-report",
    bands: str | Bands | None = None,
    layers: Sequence[int] | None = None,
    device: str | None = None,
    quick: bool = False,
    progress: bool = True,
    *,
    dtype: Any = None,
    band_tokens: int | None = DEFAULT_BAND_TOKENS,
    batch_size: int = 4,
    experiments: str | os.PathLike[str] | None = None,
    verify: bool = True,
    figures: str | None = None,
    text_column: str = "text",
    claims: str | None = None,
) -> Path:
    """Measure a model and write ``OUT/index.html``, ``report.json`` and one CSV per table; returns
    OUT.

    ``model``: an embedded name, a path (None: the default embedded model), or a model from
    :func:`ropelens.load_model`. ``device`` and ``dtype`` (a torch dtype or its name) apply when the
    report loads the model; a loaded model is never moved, and a ``device`` or ``dtype`` that
    disagrees with it is an error. ``quick``: 4 windows of at most 256 tokens over a few layers (a
    smoke test). ``band_tokens`` caps the tokens band statistics see (None: all). ``experiments``:
    the folder the experiment scripts wrote (``results/``); their tables for this model join the
    p-RoPE and context sections. Every input is checked before the model loads; nothing in OUT
    changes unless the whole report succeeds. ``verify``: check ropelens's reading against the
    model's own attention before measuring (:mod:`ropelens.run.verify`); False measures anyway and
    the report says, in its first section, that it is unverified. ``figures``: also write every
    figure of the page as a file beside it, ``OUT/figures/NN-SECTION.FORMAT`` (``"svg"``,
    ``"pdf"`` or ``"png"``; :func:`ropelens.plots.export.write_figures`), the summary figure
    first; None: none. ``corpus``: any form :func:`ropelens.run.data.load_corpus` reads,
    ``text_column`` the text of a table or dataset. ``claims``: also run the literature's claims
    (:func:`ropelens.claims.claims`) at that budget (``"quick"``, ``"standard"`` or
    ``"thorough"``), laid out right after the summary figure as "What the literature claims, on
    this model"; None: no such section.

    Everything is measured first (one streaming pass over the windows, then each section's own
    measure step); the sections (:func:`sections`) then lay out what was measured and never run
    the model. What ``ropelens report`` runs.

    Args:
        model: An embedded name, a path or hub id, or a model from :func:`ropelens.load_model`;
            None: the default embedded model.
        corpus: Any form :func:`ropelens.run.data.load_corpus` reads (a built-in name such as
            ``"english"``, a file, a list of documents, a ``datasets`` dataset).
        tokens (int): Corpus tokens to measure.
        n_ctx (int): Tokens per window (every window starts with BOS).
        out (str | os.PathLike): The output directory (created; replaced only on success).
        bands (str | Bands | None): Bands of the band sections, a :class:`ropelens.Bands` or its
            command-line form (``"quantiles:4"``); None: :meth:`ropelens.Bands.default`.
        layers (Sequence[int] | None): Layers to measure; None: every rotary layer (a few with
            ``quick``).
        device (str | None): Where to load the model, when the report loads it.
        quick (bool): 4 windows of at most 256 tokens over a few layers (a smoke test).
        progress (bool): Show progress bars.
        dtype: Floating dtype (or its name) to load the model in, when the report loads it.
        band_tokens (int | None): Cap on the tokens the band statistics see; None: all.
        batch_size (int): Windows per forward pass.
        experiments (str | os.PathLike | None): The folder the experiment scripts wrote
            (``results/``), whose tables for this model join the p-RoPE and context sections.
        verify (bool): Check ropelens's reading against the model's own attention first (default
            True); False measures anyway and says so in the first section.
        figures (str | None): Also write every figure as ``"svg"``, ``"pdf"`` or ``"png"`` under
            ``OUT/figures/``; None: none.
        text_column (str): The column holding the text, for a table or dataset corpus.
        claims (str | None): Run the literature's claims at this budget (``"quick"``,
            ``"standard"``, ``"thorough"``) into a section right after the summary figure; None:
            none.

    Returns:
        Path: ``out``, holding ``index.html`` (one self-contained page), ``report.json`` (the
        numbers and findings, readable with :func:`ropelens.load_result`) and one CSV per table.

    Raises:
        InputError: On a bad input, before the model loads (a budget smaller than one window, a
            layer out of range, a malformed band spec, an unknown figure format or claims
            budget, a ``device`` or ``dtype`` that disagrees with a loaded model, a corpus that
            cannot be read).
        ExportUnavailableError: When ``figures`` asks for a static format this machine cannot
            write.
        NotADirectoryError: When ``out`` is a file.

    Examples:
        A quick report of a tiny model (tens of seconds on a laptop's CPU):

        >>> import tempfile
        >>> from ropelens.report import build_report
        >>> from ropelens.testing import tiny_model
        >>> out = build_report(
        ...     tiny_model("llama"), corpus=["The cat sat on the mat. " * 20], tokens=64,
        ...     n_ctx=32, quick=True, out=tempfile.mkdtemp() + "/report", progress=False,
        ... )
        >>> (out / "index.html").exists(), (out / "report.json").exists()
        (True, True)
        >>> sorted(p.name for p in out.glob("*.csv"))[:3]
        ['band_statistics.csv', 'distance_shapes.csv', 'energy.csv']
    """
    t_start = time.perf_counter()
    steps: dict[str, float] = {}
    model = running_model(model)  # an nnsight model: the HF model it wraps
    device, dtype = _check_model(model, device, dtype)
    tokens, n_ctx, batch_size = _check_budget(tokens, n_ctx, batch_size, band_tokens, quick)
    bands = _check_bands(bands)
    figures = check_figures(figures)
    claims = check_claims_budget(claims)
    out_dir = check_output_dir(out, figures)
    exps = load_experiments(experiments)  # a bad folder fails before the model loads
    corpus_obj, corpus_info = resolve_corpus(corpus, text_column)
    with _timed(steps, "load_model"):
        model, label = _load(model, device, dtype)
    spec = rope_spec(model)
    chosen, n_ctx, window_note = _choose_measured(spec, bands, layers, quick, n_ctx)
    with _timed(steps, "verify"):
        verified = verification(model, spec, verify=verify)
    settings = {
        "tokens": tokens,
        "n_ctx": n_ctx,
        "bands": bands.describe(),
        "layers": chosen,
        "quick": quick,
        "band_tokens": band_tokens,
        "batch_size": batch_size,
        "device": str(device_of(model)),
        "experiments": None if experiments is None else str(experiments),
        "verification": verified.to_dict(),
        **({"claims": claims} if claims else {}),
        **({"n_ctx_note": window_note} if window_note else {}),
    }
    # every step measures unverified too when verification is off
    with contextlib.nullcontext() if verify else skip_verification(model):
        data = _collect_windows(
            model, corpus_obj, corpus_info, spec=spec, bands=bands, label=label, settings=settings,
            steps=steps, progress=progress,
        )  # fmt: skip
        if not is_main():  # under torch.distributed every rank measured; rank 0 alone writes
            return out_dir
        data.experiments = exps
        with local():  # rank 0 alone measures the sections: the model runs in this process only
            measure_sections(data, progress)
            with _timed(data.steps, "band_mixer"):
                measure_mixer(data, verify=verify)
            if claims is not None:
                with _timed(data.steps, CLAIMS_KEY):
                    data.results[CLAIMS_KEY] = measure_claims(model, claims, progress)
    steps.update({k: v for k, v in data.steps.items() if k not in steps})  # the measure steps'
    with _timed(steps, "render"):
        sections = render_sections(data, progress)
        if CLAIMS_KEY in data.results:  # first: laid out right after the summary figure
            sections.insert(0, claims_section(data.results[CLAIMS_KEY]))
    with _timed(steps, "write"):
        _write(out_dir, data, sections, steps, t_start, figures=figures)
    return out_dir


def check_figures(figures: str | None) -> str | None:
    """The figure format asked for (None: no figure files), checked before anything runs: one of
    :data:`FIGURE_FORMATS`, with static export available here."""
    if figures is None:
        return None
    fmt = str(figures).lower().lstrip(".")
    if fmt not in FIGURE_FORMATS:
        raise InputError(
            f"figures={figures!r} is not a figure format: pass one of {list(FIGURE_FORMATS)} "
            "(or None for no figure files)"
        )
    why = export_unavailable()
    if why is not None:
        raise ExportUnavailableError(why)
    return fmt


def figure_files(data: ReportData, sections: list[Section], fmt: str) -> list[tuple[Any, str]]:
    """Every figure of the page with its file name under ``figures/``, in page order: the summary
    figure, then each section's (``NN-SECTION.FORMAT``, or ``NN-SECTION-K.FORMAT`` where a section
    has several), numbered from 01."""
    named: list[tuple[Any, str]] = [(summary_figure(data), "summary")]
    for s in sections:
        many = len(s.figures) > 1
        named += [(fig, f"{s.key}-{k}" if many else s.key) for k, fig in enumerate(s.figures, 1)]
    return [(fig, f"{i:02d}-{name}.{fmt}") for i, (fig, name) in enumerate(named, start=1)]


def _collect_windows(
    model: Any,
    corpus: Any,
    corpus_info: dict[str, Any],
    *,
    spec: Any,
    bands: Bands,
    label: str,
    settings: dict[str, Any],
    steps: dict[str, float],
    progress: bool,
) -> ReportData:
    """Tokenize the report's windows (their budget is in ``settings``) and stream them."""
    tokens, n_ctx, band_tokens = settings["tokens"], settings["n_ctx"], settings["band_tokens"]
    with _timed(steps, "tokenize"):
        toks, _, sha = analysis_windows(model.tokenizer, corpus, n_ctx, tokens)
        if isinstance(corpus, StreamedCorpus):  # its fingerprint covers what was read
            corpus_info = {**corpus_info, "sha256": sha, "n_documents": len(corpus.read)}
        toks = toks[: max(1, tokens // int(toks.shape[1]))]  # a token tensor keeps the budget too
    band_windows = None if band_tokens is None else max(1, band_tokens // int(toks.shape[1]))
    data = collect(
        model,
        toks,
        label=label,
        spec=spec,
        layers=settings["layers"],
        bands=bands,
        band_windows=band_windows,
        corpus=corpus_info,
        settings=settings,
        batch_size=settings["batch_size"],
        progress=progress,
    )
    steps.update(data.steps)
    return data


def _check_budget(
    tokens: int, n_ctx: int, batch_size: int, band_tokens: int | None, quick: bool
) -> tuple[int, int, int]:
    """The token budget, window length and batch size, checked (and cut to the quick report's)."""
    tokens = check_positive_int(tokens, "tokens")
    n_ctx = check_positive_int(n_ctx, "n_ctx")
    batch_size = check_positive_int(batch_size, "batch_size")
    if quick:
        n_ctx = min(n_ctx, QUICK["n_ctx"])
        tokens = QUICK["windows"] * n_ctx
    if tokens < n_ctx:
        raise InputError(
            f"tokens={tokens} is fewer than one window of n_ctx={n_ctx}: raise tokens or lower "
            "n_ctx"
        )
    if band_tokens is not None and band_tokens < n_ctx:
        raise InputError(
            f"band_tokens={band_tokens} is fewer than one window of n_ctx={n_ctx}: raise it or "
            "pass None (all)"
        )
    return tokens, n_ctx, batch_size


def _check_bands(bands: str | Bands | None) -> Bands:
    """The report's bands: the default for None, parsed from a spec such as ``'quantiles:4'``."""
    if bands is None:
        return Bands.default()
    if isinstance(bands, str):
        return Bands.parse(bands)
    if not isinstance(bands, Bands):
        raise TypeError(
            f"bands must be a spec such as 'quantiles:4' or a Bands, got {type(bands).__name__}"
        )
    return bands


def _choose_measured(
    spec, bands: Bands, layers: Sequence[int] | None, quick: bool, n_ctx: int
) -> tuple[list[int], int, str | None]:
    """The layers to measure, the window length they allow and its note; an impossible band spec, or
    a band holding no plane in any chosen layer, fails here, not after the pass."""
    chosen = _choose_layers(spec, layers, quick)
    for layer in chosen:
        bands.resolve(spec.layers[layer])
    bands.require_planes([spec.layers[layer] for layer in chosen])
    n_ctx, window_note = _fit_windows(spec, chosen, n_ctx)
    return chosen, n_ctx, window_note


def _fit_windows(spec, layers: Sequence[int], n_ctx: int) -> tuple[int, str | None]:
    """``n_ctx`` cut to the longest windows whose masks band statistics and the head scores model in
    every layer measured (a chunked layer's chunk; a sparse-attention layer's key budget, past which
    its indexer picks keys from the text), and the note that says so (None: uncut)."""
    limits = {
        L: min(x for x in (spec[L].chunk, spec[L].select_keys) if x)
        for L in layers
        if spec[L].chunk or spec[L].select_keys
    }
    if not limits or n_ctx <= min(limits.values()):
        return n_ctx, None
    cut = min(limits.values())
    which = sorted(L for L, x in limits.items() if x == cut)
    return cut, (
        f"windows cut from {n_ctx:,} to {cut:,} tokens: layer(s) {which} attend in chunks of, or "
        f"pick from the text at most, {cut:,} keys, so on longer windows their mask depends on "
        "more than positions"
    )


def measure_sections(data: ReportData, progress: bool = False) -> None:
    """Run each available section's measure step into ``data.results[key]``, and the shared steps
    they need (once each) into ``data.results[step]``, every step timed into ``data.steps``."""
    todo = [s for s in _sections.sections() if s.measure is not None]
    for spec in tqdm(todo, desc="ropelens report: measuring", disable=not progress, unit="section"):
        for name in spec.needs:
            if name in data.results:
                continue
            step = _sections.SHARED_STEPS.get(name)
            if step is None:
                raise InputError(
                    f"section {spec.key!r} needs the shared step {name!r}: name one of "
                    f"{sorted(_sections.SHARED_STEPS)}"
                )
            with _timed(data.steps, name):
                data.results[name] = step(data)
        with _timed(data.steps, spec.step):
            data.results[spec.key] = spec.measure(data)


def render_sections(data: ReportData, progress: bool = False) -> list[Section]:
    """Lay out every section from what was measured."""
    out = []
    for spec in tqdm(
        _sections.sections(), desc="ropelens report: sections", disable=not progress, unit="section"
    ):
        if spec.measure is not None and spec.key not in data.results:
            raise InputError(
                f"section {spec.key!r} has not been measured: run measure_sections(data) before "
                "rendering"
            )
        with H.collecting_figures() as figures:
            if spec.measure is None:
                section = spec.render(data)
            else:
                section = spec.render(data, data.results[spec.key])
        if not section.figures:
            section.figures = figures
        out.append(section)
    return out


def _clean(x: Any) -> Any:
    """Strict-JSON form: NaN → null, ±inf → "inf"/"-inf", tuples → lists, numpy/torch scalars →
    Python."""
    if isinstance(x, dict):
        return {str(k): _clean(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_clean(v) for v in x]
    if hasattr(x, "item") and not isinstance(x, (str, bytes)):
        try:
            x = x.item()
        except (ValueError, RuntimeError):
            return _clean(x.tolist())
    if isinstance(x, float):
        if math.isnan(x):
            return None
        if math.isinf(x):
            return "inf" if x > 0 else "-inf"
    return x


def _report_json(
    data: ReportData, sections: list[Section], steps: dict[str, float], total: float
) -> dict[str, Any]:
    spec = data.spec
    lr = spec.layers[data.layers[0]]
    prov = Provenance(
        model=data.label,
        corpus=data.corpus.get("name"),
        corpus_sha256=data.corpus.get("sha256"),
        n_tokens=data.usage.provenance.n_tokens,
        n_windows=data.n_windows,
        n_ctx=data.n_ctx,
        config=data.settings,
        seconds=round(total, 3),
        **placement(data.model),
    )
    return _clean(
        {
            "format": FORMAT,
            "model": {
                "name": data.label,
                "architecture": spec.architecture,
                "n_layers": spec.n_layers,
                "n_heads": lr.n_heads,
                "n_kv_heads": lr.n_kv_heads,
                "head_dim": lr.head_dim,
                "n_planes": lr.n_planes,
                "trained_n_ctx": spec.n_ctx,
                "kinds": spec.kinds,
            },
            "corpus": data.corpus,
            "measured": {
                "usage": {"n_tokens": data.usage.provenance.n_tokens, "n_windows": data.n_windows},
                "band_statistics": {
                    "n_tokens": data.band_stats.provenance.n_tokens,
                    "n_windows": len(data.band_windows),
                    "windows": list(data.band_windows),
                },
            },
            "findings": [f.to_dict() for s in sections for f in s.findings],
            "sections": [
                {
                    "key": s.key,
                    "title": s.title,
                    "available": s.available,
                    "numbers": s.numbers,
                    "tables": [f"{name}.csv" for name in s.tables],
                }
                for s in sections
            ],
            "provenance": {
                **prov.to_dict(),
                "steps_seconds": steps,
                "untested_versions": {
                    k: {"installed": a, "tested": b} for k, (a, b) in untested_versions().items()
                },
            },
        }
    )


def _corpus_words(name: str | None) -> str:
    """What a built-in corpus is, said where the page first names it: ``CPython language
    reference`` for english; "" for a corpus of the user's own."""
    if name not in CORPORA:
        return ""
    return CORPORA[name].split(",")[0].split(" (")[0]


def _subtitle(data: ReportData, created: str) -> str:
    c = data.corpus
    said = [_corpus_words(c.get("name"))]
    said += [f"sha256 {c['sha256'][:12]}…"] if c.get("sha256") else []
    sha = f" ({H.esc('; '.join(w for w in said if w))})" if any(said) else ""
    bw = len(data.band_windows)
    band = "" if bw == data.n_windows else f" · band statistics on {bw} of them"
    commit = git_commit()
    under = "; ".join(describe_intervention(i) for i in data.spec.interventions)
    return (
        f"<b>{H.esc(data.label)}</b>"
        + (f" under <b>{H.esc(under)}</b>" if under else "")
        + f" · corpus <b>{H.esc(c.get('name'))}</b>{sha} · "
        f"{data.usage.provenance.n_tokens:,} tokens in {data.n_windows} windows of "
        f"{data.n_ctx}{band} · {H.esc(created)} · ropelens "
        f"{H.esc(versions().get('ropelens', '?'))}"
        + (
            f" ({H.esc(commit[:12])}{'+dirty' if commit.endswith('+dirty') else ''})"
            if commit
            else ""
        )
    )


def _findings_html(data: ReportData, sections: list[Section]) -> str:
    """The page's opening: the summary figure, then one card per finding (its sentence and a chart
    of the numbers it states)."""
    items = [finding_card(f, s.title) for s in sections for f in s.findings]
    body = (
        f'<ul class="findings">{"".join(items)}</ul>'
        if items
        else "<p>No findings: no section produced numbers.</p>"
    )
    summary = H.figure_html(
        summary_figure(data),
        "Per layer, from the sections below: the queries' energy share by band (sink positions "
        "excluded), the heads found positional, the share of heads that sink on position 0, and "
        "the massive query and key dimensions.",
    )
    claims = "".join(
        f'<section id="{H.esc(s.key)}"><h2>{H.esc(s.title)}</h2>{s.body}</section>'
        for s in sections
        if s.key == CLAIMS_KEY
    )  # the literature's claims on this model, right after the summary figure
    return (
        f'<section id="findings"><h2>Findings</h2><div class="summaryfig">{summary}</div>'
        + claims
        + '<p class="lead">Generated from the numbers measured below (also in '
        "<code>report.json</code>).</p>" + body + "</section>"
    )


def _untested_html(p: dict[str, Any]) -> str:
    """A warning beside the versions where some differ from the stack ropelens was tested with."""
    off = p.get("untested_versions") or {}
    if not off:
        return ""
    what = ", ".join(f"{k} {v['installed']} (tested {v['tested']})" for k, v in off.items())
    return (
        f"<br><strong>Not the tested stack:</strong> {H.esc(what)}; <code>bash "
        "scripts/setup.sh</code> installs the tested versions."
    )


def _provenance_html(report: dict[str, Any]) -> str:
    p = report["provenance"]
    c = report["corpus"]
    vers = ", ".join(f"{k} {v}" for k, v in p["versions"].items())
    items = [
        ("model", H.esc(report["model"]["name"]) + f" ({H.esc(report['model']['architecture'])})"),
        ("corpus", f"{H.esc(c.get('name'))}: {H.esc(c.get('source', ''))}"),
        ("corpus sha256", f"<code>{H.esc(c.get('sha256') or '–')}</code>"),
        ("tokens", f"{p['n_tokens']:,} in {p['n_windows']} windows of {p['n_ctx']}"),
        ("weights", f"{H.esc(p.get('dtype') or '–')} on {H.esc(p.get('device') or '–')}"),
        (
            "band statistics",
            f"{report['measured']['band_statistics']['n_tokens']:,} tokens, windows "
            f"{H.esc(_short_list(report['measured']['band_statistics']['windows']))}",
        ),
        (
            "settings",
            "<code>"
            + H.esc(json.dumps({k: v for k, v in p["config"].items() if k != "layers"}))
            + "</code>",
        ),
        ("layers", H.esc(_short_list(p["config"]["layers"]))),
        ("versions", H.esc(vers) + _untested_html(p)),
        ("commit", f"<code>{H.esc(p['commit'] or '–')}</code>"),
        ("created", H.esc(p["created"])),
        (
            "run time",
            " · ".join(f"{H.esc(k)} {v:.1f} s" for k, v in p["steps_seconds"].items())
            + f" · total {p['seconds']:.1f} s",
        ),
        (
            "files",
            " ".join(f"<code>{H.esc(n)}</code>" for n in ["report.json", *_csv_names(report)]),
        ),
    ]
    return '<section id="provenance"><h2>Provenance</h2>' + H.kv_table(items) + "</section>"


def _short_list(xs: list[int]) -> str:
    return (
        ", ".join(map(str, xs))
        if len(xs) <= 12
        else f"{', '.join(map(str, xs[:10]))}, … ({len(xs)} in all)"
    )


def _csv_names(report: dict[str, Any]) -> list[str]:
    return [t for s in report["sections"] for t in s["tables"]]


def _render_page(data: ReportData, sections: list[Section], report: dict[str, Any]) -> str:
    import plotly.offline

    blocks = [_findings_html(data, sections)]
    for s in sections:
        if s.key == CLAIMS_KEY:  # laid out in the findings, after the summary figure
            continue
        tag = "" if s.available else '<span class="tag">not yet available</span>'
        blocks.append(
            f'<section id="{H.esc(s.key)}"><h2>{H.esc(s.title)}{tag}</h2>{s.body}</section>'
        )
        if (
            s.key == MIXER_AFTER
        ):  # the band mixer for the positional heads found, where there is one
            blocks.append(band_mixer_html(data))
    blocks.append(_provenance_html(report))
    nav = [
        ("findings", "Findings", True),
        *((s.key, s.title, s.available) for s in sections),
        ("provenance", "Provenance", True),
    ]
    return H.page(
        title=f"ropelens report — {data.label}",
        subtitle=_subtitle(data, report["provenance"]["created"]),
        nav=nav,
        body="\n".join(blocks),
        plotly_js=plotly.offline.get_plotlyjs(),
        footer="Made with ropelens. Self-contained: works offline; the numbers behind every "
        "figure are in <code>report.json</code> and the CSV files beside this page.",
    )


def _write(
    out_dir: Path,
    data: ReportData,
    sections: list[Section],
    steps: dict[str, float],
    t_start: float,
    figures: str | None = None,
) -> None:
    """Write every file into a temp directory, then rename them into place, index.html last.

    ``out_dir`` (and missing parents) is created here; if writing fails, the folders this created
    are removed again, so a failed report leaves nothing behind. A folder that existed before is
    never removed."""
    created = _make_dir(out_dir)
    earlier = _earlier_report(out_dir) or set()
    tmp, done = None, False
    try:
        tmp = Path(tempfile.mkdtemp(prefix=".ropelens-report-", dir=out_dir))
        names = []
        for s in sections:
            for name, frame in s.tables.items():
                frame.to_csv(tmp / f"{name}.csv", index=False)
                names.append(f"{name}.csv")
        if figures is not None:
            files = figure_files(data, sections, figures)
            (tmp / FIGURES_DIR).mkdir()
            write_figures([(fig, tmp / FIGURES_DIR / name) for fig, name in files])
            names += [f"{FIGURES_DIR}/{name}" for _, name in files]
        report = _report_json(data, sections, steps, time.perf_counter() - t_start)
        if figures is not None:
            report["figures"] = [n for n in names if n.startswith(f"{FIGURES_DIR}/")]
        (tmp / "report.json").write_text(json.dumps(report, indent=1, allow_nan=False))
        (tmp / "index.html").write_text(_render_page(data, sections, report), encoding="utf-8")
        if figures is not None:
            (out_dir / FIGURES_DIR).mkdir(exist_ok=True)
        for name in [*names, "report.json", "index.html"]:
            os.replace(tmp / name, out_dir / name)
        _remove_earlier_files(out_dir, earlier - set(names) - {"report.json", "index.html"})
        if (out_dir / FIGURES_DIR).is_dir() and (figures is not None or earlier):
            # an earlier report's figures/: what this report did not write goes
            _remove_stale_figures(out_dir / FIGURES_DIR, set(names))
        done = True
    finally:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
        if not done and created is not None:
            shutil.rmtree(created, ignore_errors=True)


def _remove_earlier_files(out_dir: Path, names: set[str]) -> None:
    """Remove the files an earlier report wrote that this one did not (tables it no longer has,
    its figures), so that the folder holds one report; files ropelens did not write stay."""
    for name in names:
        path = out_dir / name
        if path.is_file() and not path.is_symlink():
            path.unlink()


def _remove_stale_figures(folder: Path, kept: set[str]) -> None:
    """Remove the figure files an earlier report wrote to ``folder`` that this one did not, and the
    folder itself where that leaves it empty."""
    for path in folder.iterdir():
        numbered = path.name[:2].isdigit() and path.name[2:3] == "-"
        if (
            numbered
            and path.suffix[1:] in FIGURE_FORMATS
            and f"{folder.name}/{path.name}" not in kept
        ):
            path.unlink()
    if not any(folder.iterdir()):
        folder.rmdir()
