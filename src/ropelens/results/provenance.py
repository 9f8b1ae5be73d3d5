"""Provenance of results: model, data, config, package versions and git commit."""

from __future__ import annotations

import datetime as _dt
import functools
import importlib.metadata as md
import platform
import subprocess
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ropelens.errors import InputError

__all__ = [
    "Provenance",
    "git_commit",
    "merged_spans",
    "placement",
    "tested_versions",
    "untested_versions",
    "version_report",
    "versions",
]

# ropelens's own version, from the code that runs (an editable install's metadata can be older)
ROPELENS_VERSION = "0.2.0"
_PACKAGES = ("ropelens", "torch", "transformers", "transformer-lens", "numpy", "pandas", "plotly")


@functools.lru_cache(maxsize=1)
def versions() -> dict[str, str]:
    """Installed versions of the packages a result depends on, and Python's."""
    out = {"python": platform.python_version()}
    for name in _PACKAGES:
        if name == "ropelens":
            out[name] = ROPELENS_VERSION
            continue
        try:
            out[name] = md.version(name)
        except md.PackageNotFoundError:
            out[name] = "missing"
    return out


@functools.lru_cache(maxsize=1)
def tested_versions() -> dict[str, str]:
    """The versions ropelens was tested with (``tested_versions.txt``, the constraints
    ``scripts/setup.sh`` installs by default), by distribution name; empty where the file is not
    shipped."""
    path = Path(__file__).parents[1] / "tested_versions.txt"  # at the package root
    if not path.is_file():
        return {}
    out = {}
    for line in path.read_text().splitlines():
        name, sep, version = line.strip().partition("==")
        if sep and not name.startswith("#"):
            out[_canonical(name)] = version
    return out


def _canonical(name: str) -> str:
    return name.lower().replace("_", "-").replace(".", "-")


def untested_versions() -> dict[str, tuple[str, str]]:
    """Packages whose installed version is not the tested one: name → (installed, tested)."""
    tested = tested_versions()
    out = {}
    for name, have in versions().items():
        want = tested.get(_canonical(name))
        if want is not None and have.split("+")[0] != want.split("+")[0]:
            out[name] = (have, want)
    return out


def version_report() -> str:
    """What ``ropelens --version`` prints: the versions in use, and which differ from the tested
    stack."""
    v = versions()
    lines = [
        f"ropelens {v['ropelens']} (commit {git_commit() or 'unknown'})",
        "  " + ", ".join(f"{k} {x}" for k, x in v.items() if k != "ropelens"),
    ]
    off = untested_versions()
    if off:
        lines.append(
            "  not the tested stack: "
            + ", ".join(f"{k} {have} (tested {want})" for k, (have, want) in off.items())
            + "; bash scripts/setup.sh installs the tested versions"
        )
    elif tested_versions():
        lines.append("  the tested stack (tested_versions.txt)")
    return "\n".join(lines)


@functools.lru_cache(maxsize=1)
def git_commit() -> str | None:
    """The commit of the ropelens checkout in use (with '+dirty' for local changes), if any."""
    here = Path(__file__).resolve().parent
    try:
        sha = subprocess.run(
            ["git", "rev-parse", "HEAD"],
            cwd=here,
            capture_output=True,
            text=True,
            timeout=5,
            check=True,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=here,
            capture_output=True,
            text=True,
            timeout=5,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return sha + ("+dirty" if dirty else "") if sha else None


_WHERE_KNOWN = ("dtype", "device", "spans")  # written only where recorded


@dataclass(frozen=True)
class Provenance:
    """Where a result came from: enough to reproduce it.

    Every result carries one (``result.provenance``), saved with it and shown in the report. The
    analyses fill it in; build one yourself only for a result of your own analysis. Merging two
    partial results (several processes, resumed runs) merges their provenance (:meth:`merged`).

    Attributes:
        model (str): The model's name as loaded (``model.cfg.model_name``: an embedded name, a
            path, a hub id, ``owner/name@revision``).
        corpus (str | None): The corpus's name (``"english"``, a path, ``"tokens"`` for a ready
            token tensor); None where no corpus was read.
        corpus_sha256 (str | None): SHA-256 of the corpus file's bytes, where it was a file.
        n_tokens (int | None): Tokens measured.
        n_windows (int | None): Windows measured.
        n_ctx (int | None): Tokens per window.
        config (dict[str, Any]): The analysis's settings (layers, bands, batch size, ...) and the
            verification of ropelens's reading against the model's own attention
            (``config["verification"]``).
        versions (dict[str, str]): Versions of Python and the packages the result depends on
            (default: the installed ones).
        commit (str | None): The git commit ropelens ran from, where it runs from a checkout.
        created (str): When the result was made, ISO 8601 in UTC, to the second.
        seconds (float | None): Wall-clock seconds the measurement took.
        dtype (str | None): Floating dtype of the model's weights (``"bfloat16"``).
        device (str | None): The device it ran on (``"cuda:0"``).
        spans (dict[str, list[list[int]]] | None): Which tokens were measured: the fingerprint of
            what the windows were cut from → sorted, disjoint ``[start, stop)`` token ranges
            (:attr:`ropelens.run.measure.Windows.spans`).

    Examples:
        >>> from ropelens import Provenance
        >>> first = Provenance(
        ...     model="tiny-llama", corpus="english", n_tokens=64, n_windows=4, n_ctx=16,
        ...     spans={"english:abc": [[0, 64]]},
        ... )
        >>> second = Provenance(
        ...     model="tiny-llama", corpus="english", n_tokens=32, n_windows=2, n_ctx=16,
        ...     spans={"english:abc": [[64, 96]]},
        ... )
        >>> both = first.merged(second)
        >>> both.n_tokens, both.n_windows, both.spans
        (96, 6, {'english:abc': [[0, 96]]})
        >>> sorted(first.versions)[:3]
        ['numpy', 'pandas', 'plotly']
        >>> Provenance.from_dict(first.to_dict()) == first
        True
    """

    model: str
    corpus: str | None = None
    corpus_sha256: str | None = None
    n_tokens: int | None = None
    n_windows: int | None = None
    n_ctx: int | None = None
    config: dict[str, Any] = field(default_factory=dict)
    versions: dict[str, str] = field(default_factory=versions)
    commit: str | None = field(default_factory=git_commit)
    created: str = field(
        default_factory=lambda: _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
    )
    seconds: float | None = None
    # the floating dtype of the model's weights ("bfloat16") and the device it ran on ("cuda:0")
    dtype: str | None = None
    device: str | None = None
    # which tokens the result measured: the fingerprint of what the windows were cut from → sorted,
    # disjoint [start, stop) ranges of its tokens (see ropelens.run.measure.Windows.spans)
    spans: dict[str, list[list[int]]] | None = None

    @property
    def interventions(self) -> list[dict[str, Any]]:
        """The RoPE variants, plane ablations and replacements the model ran under (recorded with
        its verification; empty where none)."""
        if "interventions" in self.config:  # an analysis that ran with and without them
            return list(self.config["interventions"])
        return list((self.config.get("verification") or {}).get("interventions", []))

    def to_dict(self) -> dict[str, Any]:
        """The fields as a dict; the dtype, device and spans only where known, so a result saved
        before they were recorded saves back as it was."""
        d = asdict(self)
        for key in _WHERE_KNOWN:
            if d[key] is None:
                del d[key]
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Provenance:
        """The provenance :meth:`to_dict` wrote."""
        return cls(**d)

    def merged(self, other: Provenance, *, n_ctx: int | None | object = ...) -> Provenance:
        """Provenance of the merge of two partial results over the same model and config.

        Refused (InputError) where the two measured some of the same tokens, a result merged with
        itself or with a run over overlapping windows: the merge would count them twice; and where
        they were measured differently (another model, window length, dtype or RoPE variant), so
        that one record would misstate part of the merge, naming each field that differs and its
        two values. A caller whose merge spans window lengths on purpose (passkey trials at several
        lengths) passes the ``n_ctx`` the merge records."""
        self.check_same_measurement(other, n_ctx=n_ctx is ...)

        def add(a, b):
            return None if a is None or b is None else a + b

        spans = merged_spans(self.spans, other.spans, self.corpus, other.corpus)
        return Provenance(
            model=self.model,
            corpus=self.corpus if self.corpus == other.corpus else f"{self.corpus}+{other.corpus}",
            corpus_sha256=self.corpus_sha256 if self.corpus_sha256 == other.corpus_sha256 else None,
            n_tokens=add(self.n_tokens, other.n_tokens),
            n_windows=add(self.n_windows, other.n_windows),
            n_ctx=self.n_ctx if n_ctx is ... else n_ctx,  # type: ignore[arg-type]
            config=self.config,
            versions=self.versions,
            commit=self.commit,
            seconds=add(self.seconds, other.seconds),
            dtype=self.dtype if self.dtype == other.dtype else None,
            device=self.device if self.device == other.device else None,
            spans=spans,
        )

    def check_same_measurement(self, other: Provenance, *, n_ctx: bool = True) -> None:
        """Raise an InputError naming every field in which ``other`` was measured differently
        (model, ``n_ctx`` unless ``n_ctx`` is False, dtype, RoPE variant) and both values; a field
        one of them does not record (None) is not compared.

        Examples:
            >>> a = Provenance(model="tiny", n_ctx=32)
            >>> try:
            ...     a.check_same_measurement(Provenance(model="tiny", n_ctx=64))
            ... except InputError as e:
            ...     print(str(e)[:57])
            cannot merge results measured differently: n_ctx 32 vs 64
        """
        mine = {"variant": self.interventions, **_measured(self)}
        theirs = {"variant": other.interventions, **_measured(other)}
        fields = [f for f in mine if n_ctx or f != "n_ctx"]
        differ = [
            f"{f} {mine[f]!r} vs {theirs[f]!r}"
            if f != "n_ctx"
            else f"n_ctx {mine[f]} vs {theirs[f]}"
            for f in fields
            if mine[f] is not None and theirs[f] is not None and mine[f] != theirs[f]
        ]
        if differ:
            raise InputError(
                f"cannot merge results measured differently: {'; '.join(differ)}; a merge adds "
                "sums of one measurement, so measure the missing windows with the same model, "
                "n_ctx, dtype and variant (or keep the results apart)"
            )


def _measured(p: Provenance) -> dict[str, Any]:
    """The fields two merged results must share."""
    return {"model": p.model, "n_ctx": p.n_ctx, "dtype": p.dtype}


def placement(model: Any) -> dict[str, str | None]:
    """``{"dtype": ..., "device": ...}`` of ``model``'s floating weights, for its results'
    provenance (the first floating parameter's; None where the model has none)."""
    params = getattr(model, "parameters", None)
    if not callable(params):
        return {"dtype": None, "device": None}
    for p in params():
        if p.is_floating_point():
            return {"dtype": str(p.dtype).removeprefix("torch."), "device": str(p.device)}
    return {"dtype": None, "device": None}


def _coalesced(ranges: list[list[int]]) -> list[list[int]]:
    out: list[list[int]] = []
    for a, b in sorted(ranges):
        if out and a <= out[-1][1]:
            out[-1][1] = max(out[-1][1], b)
        else:
            out.append([a, b])
    return out


def _overlap(a: list[list[int]], b: list[list[int]]) -> list[int] | None:
    """The first [start, stop) shared by two sorted, disjoint range lists (None: none)."""
    i = j = 0
    while i < len(a) and j < len(b):
        lo, hi = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
        if lo < hi:
            return [lo, hi]
        if a[i][1] <= b[j][1]:
            i += 1
        else:
            j += 1
    return None


def merged_spans(
    a: dict[str, list[list[int]]] | None,
    b: dict[str, list[list[int]]] | None,
    corpus_a: str | None = None,
    corpus_b: str | None = None,
) -> dict[str, list[list[int]]] | None:
    """The tokens two merged results measured together; InputError where they share any."""
    if a is None or b is None:  # a result from before spans were recorded: nothing to check
        return None
    out = {k: [list(r) for r in v] for k, v in a.items()}
    for source, ranges in b.items():
        shared = _overlap(_coalesced(out.get(source, [])), _coalesced(ranges))
        if shared is not None:
            name = f"corpus {corpus_a!r}" if corpus_a == corpus_b and corpus_a else "one input"
            raise InputError(
                f"cannot merge: both results measured tokens {shared[0]:,}–{shared[1] - 1:,} of "
                f"{name} (fingerprint {source[:22]}…), so the merge would count them twice (a "
                "result merged with itself, or with a run over overlapping windows); merge "
                "results measured on disjoint windows"
            )
        out[source] = _coalesced(out.get(source, []) + [list(r) for r in ranges])
    return out
