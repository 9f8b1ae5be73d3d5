"""What an intervention changes: frequency usage, band logit shares and head kinds, with and
without it, measured on the same windows in one call.

``intervention_effect(model, PRoPE(0.75))`` runs :func:`frequency_usage`, :func:`band_statistics`
and :func:`head_taxonomy` on the model as it is and again under the intervention (a RoPE variant,
applied with :func:`ropelens.run.intervene.apply_rope_variant`, or any callable that takes the model
and returns a context, e.g. ``lambda m: ablate_planes(m, [0, 1], heads=[3])``), on the same
windows. The heads under the intervention are classified with the unmodified model's threshold, so
a head changes kind only where its attention changed. :meth:`InterventionEffect.figure` draws the
three differences in one figure.

Band energy is that of the queries as the attention scores them (frequency usage with
``source="post"``): a plane an ablation zeroes has no energy under it, as it has no logit. The
``rest`` band holds, with planes no band claims, the dims RoPE leaves unrotated (partial rotary,
multi-head latent attention), which an ablation of planes leaves as they are.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import pandas as pd
import torch
from jaxtyping import Float
from torch import Tensor

from ropelens.analyses.band_statistics import BandStatistics, band_statistics
from ropelens.analyses.frequency_usage import FrequencyUsage, frequency_usage
from ropelens.analyses.head_taxonomy import HeadTaxonomy, head_taxonomy
from ropelens.errors import InputError
from ropelens.results.figures import figure_of
from ropelens.results.findings import Finding, fixed, signed
from ropelens.results.provenance import Provenance, placement
from ropelens.results.result import Result
from ropelens.run import data
from ropelens.run.intervene import apply_rope_variant
from ropelens.spec.bands import Bands
from ropelens.spec.plan import describe_intervention
from ropelens.spec.reading import rope_spec
from ropelens.spec.variants import RopeVariant, check_variant

__all__ = ["CONDITIONS", "HEAD_GROUPS", "InterventionEffect", "head_group", "intervention_effect"]

CONDITIONS = ("without", "with")  # index 0 and 1 of every stacked field
HEAD_GROUPS = ("positional", "sink", "content")


def head_group(kind: str) -> str:
    """The group of a head kind from :meth:`HeadTaxonomy.kinds`: its positional kinds (diagonal,
    previous-token, offset-δ) are ``positional``."""
    return kind if kind in ("sink", "content") else "positional"


@dataclass(frozen=True)
class InterventionEffect(Result):
    """Band energy, band |logit| shares and head kinds without and with an intervention.

    What :func:`intervention_effect` returns, measured on the same windows in both conditions
    (index 0: without, index 1: with).
    :meth:`change` gives with minus without, :meth:`head_changes` the heads whose kind changed,
    :meth:`head_counts` the heads of each group, and :meth:`figure` draws the three differences.

    Attributes:
        interventions (list[dict]): What ran (:attr:`RopeSpec.interventions`), as records.
        layers (list[int]): The measured layer indices.
        band_names (list[str]): The bands, highest frequency first.
        energy (Tensor): Share of the queries' squared norm per band as the attention scores them
            (after the rotation and the intervention; sink position left out), heads averaged,
            ``[condition, layer, band]``; ``rest`` includes the dims RoPE leaves unrotated.
        logit_share (Tensor): Each band's share of the summed |band logit|, heads averaged, same
            shape.
        head_kinds (list[list[list[str]]]): Per condition, layer and head, its kind
            (:meth:`HeadTaxonomy.kinds`: ``diagonal``, ``previous-token``, ``offset-δ``, ``sink`` or
            ``content``), both with the unmodified model's threshold.
        tau (float): That threshold: the attention mass in [0, 1] that makes a head positional or a
            sink.
        provenance (Provenance): Model, corpus, windows, bands, interventions and the verification
            of both runs.

    Examples:
        >>> from ropelens.analyses import intervention_effect
        >>> from ropelens.spec.variants import PRoPE
        >>> from ropelens.testing import tiny_model
        >>> model = tiny_model("llama")
        >>> effect = intervention_effect(model, PRoPE(0.75), n_ctx=32, max_tokens=64, layers=[1])
        >>> effect.under
        'PRoPE(p=0.75) in layers 0-1'
        >>> tuple(effect.change("logit_share").shape)  # [layer, band]
        (1, 4)
        >>> list(effect.to_frame().columns)[:4]
        ['layer', 'band', 'energy_without', 'energy_with']
    """

    interventions: list[dict[str, Any]]
    layers: list[int]
    band_names: list[str]
    energy: Float[Tensor, "condition layer band"]
    logit_share: Float[Tensor, "condition layer band"]
    head_kinds: list[list[list[str]]]
    tau: float
    provenance: Provenance

    @property
    def under(self) -> str:
        """The intervention, in words."""
        return "; ".join(describe_intervention(i) for i in self.interventions)

    def change(self, what: str = "energy") -> Float[Tensor, "layer band"]:
        """With minus without, ``[layer, band]``, of ``energy`` or ``logit_share``."""
        if what not in ("energy", "logit_share"):
            raise InputError(f"change of 'energy' or 'logit_share', got {what!r}")
        x = getattr(self, what)
        return x[1] - x[0]

    def head_changes(self) -> pd.DataFrame:
        """One row per head whose kind differs under the intervention (layer, head, kinds)."""
        rows = [
            {"layer": L, "head": h, "without": a, "with": b}
            for L, before, after in zip(
                self.layers, self.head_kinds[0], self.head_kinds[1], strict=True
            )
            for h, (a, b) in enumerate(zip(before, after, strict=True))
            if a != b
        ]
        return pd.DataFrame(rows, columns=["layer", "head", "without", "with"])

    def head_counts(self) -> pd.DataFrame:
        """Heads of each group per layer and condition (long form): ``positional`` (diagonal,
        previous-token and offset-δ heads together), ``sink`` and ``content``."""
        rows = []
        for c, condition in enumerate(CONDITIONS):
            for L, kinds in zip(self.layers, self.head_kinds[c], strict=True):
                groups = [head_group(k) for k in kinds]
                for group in HEAD_GROUPS:
                    rows.append(
                        {
                            "condition": condition,
                            "layer": L,
                            "kind": group,
                            "heads": groups.count(group),
                        }
                    )
        return pd.DataFrame(rows)

    def to_frame(self) -> pd.DataFrame:
        """One row per (layer, band): energy and |logit| share without, with and the change."""
        rows = []
        for i, L in enumerate(self.layers):
            for b, band in enumerate(self.band_names):
                row: dict[str, Any] = {"layer": L, "band": band}
                for what in ("energy", "logit_share"):
                    x = getattr(self, what)
                    row[f"{what}_without"] = float(x[0, i, b])
                    row[f"{what}_with"] = float(x[1, i, b])
                    row[f"{what}_change"] = float(x[1, i, b] - x[0, i, b])
                rows.append(row)
        return pd.DataFrame(rows)

    def findings(self) -> list[Finding]:
        """The largest change of band energy and of band |logit| share, and the heads that changed
        kind."""
        out = []
        for what, noun in (
            ("energy", "query energy (as attention scores it)"),
            ("logit_share", "|logit| share"),
        ):
            d = self.change(what)
            if not d.numel() or not torch.isfinite(d).any():
                continue
            flat = torch.nan_to_num(d.abs(), nan=-1.0).flatten()
            i = int(flat.argmax())
            L, b = self.layers[i // d.shape[1]], self.band_names[i % d.shape[1]]
            value = float(d.flatten()[i])
            before = getattr(self, what)[0]
            out.append(
                Finding(
                    f"largest_{what}_change",
                    "intervention-effect",
                    f"Under {self.under}, the largest change of {noun} is in layer {L}, band "
                    f"{b}: {signed(value, 3)} (from {fixed(before.flatten()[i], 3)}).",
                    {"layer": L, "band": b, "change": value},
                )
            )
        changed = self.head_changes()
        n = sum(len(k) for k in self.head_kinds[0])
        out.append(
            Finding(
                "heads_changed",
                "intervention-effect",
                f"Under {self.under}, {len(changed)} of {n} heads change kind"
                + (
                    ": "
                    + ", ".join(
                        f"L{r['layer']}.H{r['head']} {r['without']} → {r['with']}"
                        for _, r in changed.head(6).iterrows()
                    )
                    + ("…" if len(changed) > 6 else "")
                    if len(changed)
                    else ""
                )
                + ".",
                {"changed": len(changed), "heads": n},
            )
        )
        return out

    def figure(self) -> Any:
        """The changes in one figure (:func:`ropelens.plots.intervention_effect.effect_figure`)."""
        return figure_of(InterventionEffect)(self)


def _context(model, intervention: Any) -> Callable[[], contextlib.AbstractContextManager]:
    if isinstance(intervention, RopeVariant):
        return lambda: apply_rope_variant(model, intervention)
    if isinstance(intervention, type) and issubclass(intervention, RopeVariant):
        check_variant(intervention)  # a variant class is callable, but not a context: refused
    if callable(intervention):
        return lambda: intervention(model)
    raise InputError(
        "intervention must be a RoPE variant (e.g. ropelens.spec.variants.PRoPE(0.75)) or a "
        "callable that takes the model and returns a context (e.g. lambda m: "
        f"ablate_planes(m, [0, 1])), got {type(intervention).__name__}"
    )


def _measure(model, windows: Tensor, bands: Bands, layers, kw: dict[str, Any], tau=None):
    # what the attention scores: before the rotation an ablated plane would keep its energy
    usage: FrequencyUsage = frequency_usage(model, windows, layers=layers, source="post", **kw)
    stats: BandStatistics = band_statistics(model, windows, layers=layers, bands=bands, **kw)
    heads: HeadTaxonomy = head_taxonomy(
        model, windows, n_ctx=windows.shape[1], n_windows=windows.shape[0], bands=bands,
        layers=layers, tau=tau, **kw,
    )  # fmt: skip
    return usage, stats, heads


def _heads_mean(x: Tensor) -> Tensor:
    return x.nanmean(1) if x.is_floating_point() else x.float().mean(1)


def intervention_effect(
    model,
    intervention: RopeVariant | Callable[[Any], contextlib.AbstractContextManager],
    corpus: Any = "english",
    *,
    n_ctx: int = 256,
    max_tokens: int = 2_048,
    layers: Sequence[int] | None = None,
    bands: Bands | str | None = None,
    verify: bool = True,
    progress: bool = False,
    text_column: str = "text",
) -> InterventionEffect:
    """Band energy, band |logit| shares and head kinds of a model without and with an intervention.

    Runs :func:`frequency_usage`, :func:`band_statistics` and :func:`head_taxonomy` on the model as
    it is, and again under ``intervention``, on the same ``max_tokens`` tokens of ``corpus`` in
    windows of ``n_ctx``. The heads under the intervention are classified with the unmodified
    model's threshold, so a head changes kind only where its attention changed. Both runs are
    verified against the model as it runs. Band energy is measured on the queries the attention
    scores (after the rotation and the intervention: an ablated plane has none), its ``rest`` band
    including the dims RoPE leaves unrotated.

    Args:
        model: The model: what :func:`ropelens.load_model` or :func:`ropelens.testing.tiny_model`
            returns (a TransformerLens bridge, or the plain HF model with ``bridge=False``).
        intervention (RopeVariant | Callable): A RoPE variant (e.g. ``PRoPE(0.75)`` from
            :mod:`ropelens.spec.variants`, applied with
            :func:`ropelens.run.intervene.apply_rope_variant`), or a callable that takes the model
            and returns a context (an ablation, a replacement: ``lambda m: ablate_planes(m, [0,
            1])``).
        corpus: The text: any form :func:`ropelens.run.data.load_corpus` reads, or a ready
            ``[n_windows, n_ctx]`` token tensor (default "english").
        n_ctx (int): Tokens per window, BOS first (default 256).
        max_tokens (int): Corpus tokens to read (default 2048).
        layers (Sequence[int] | None): Layer indices to measure (default None: every rotary layer).
        bands (Bands | str | None): The plane groups, a :class:`Bands` or its spec string (default
            None: :meth:`Bands.default`, quartiles).
        verify (bool): Verify both runs against the model as it runs (default True; False: the
            result says unverified).
        progress (bool): Show progress bars (default False).
        text_column (str): The column of a table or dataset corpus that holds the text (default
            "text").

    Returns:
        InterventionEffect: Band energy and |logit| shares ``[condition, layer, band]`` and head
        kinds per condition, layer and head (condition 0: without, 1: with).

    Raises:
        InputError: When ``intervention`` is neither a RoPE variant nor a callable, or puts nothing
            in force on the model.
        TypeError: When ``intervention`` is a variant class (``PRoPE``), not a variant
            (``PRoPE(0.75)``).

    Examples:
        >>> from ropelens.analyses import intervention_effect
        >>> from ropelens.spec.variants import PRoPE
        >>> from ropelens.testing import tiny_model
        >>> model = tiny_model("llama")
        >>> effect = intervention_effect(model, PRoPE(0.75), n_ctx=32, max_tokens=64, layers=[1])
        >>> effect.layers, effect.band_names
        ([1], ['Q1 (highest)', 'Q2', 'Q3', 'Q4 (lowest)'])
        >>> tuple(effect.energy.shape)  # [condition, layer, band]
        (2, 1, 4)
        >>> from ropelens import ablate_planes
        >>> ablated = intervention_effect(
        ...     model, lambda m: ablate_planes(m, [0, 1]), n_ctx=32, max_tokens=64, layers=[1]
        ... )
        >>> float(ablated.energy[1, 0, 0])  # planes 0-1 (Q1) ablated: no energy the attention sees
        0.0
        >>> intervention_effect(model, "p-rope")
        Traceback (most recent call last):
            ...
        ropelens.errors.InputError: intervention must be a RoPE variant ...
    """
    enter = _context(model, intervention)
    bands = Bands.parse(bands) if isinstance(bands, str) else (bands or Bands.default())
    windows, corpus_name, corpus_sha = data.analysis_windows(
        model, corpus, n_ctx, max_tokens, text_column
    )
    kw = {"verify": verify, "progress": progress}
    runs = [_measure(model, windows, bands, layers, kw)]
    with enter():
        interventions = list(rope_spec(model).interventions)
        if not interventions:
            raise InputError(
                "the intervention put nothing in force on the model: pass a RoPE variant, or a "
                "callable returning apply_rope_variant(...), ablate_planes(...) or another "
                "ropelens intervention on this model"
            )
        runs.append(_measure(model, windows, bands, layers, kw, tau=runs[0][2].tau))
    usage0, stats0, heads0 = runs[0]
    names, _ = usage0.band_share(bands, "q", "no_sink")
    energy = torch.stack([_heads_mean(u.band_share(bands, "q", "no_sink")[1]) for u, _, _ in runs])
    shares = torch.stack([_heads_mean(s.abs_share()) for _, s, _ in runs])
    prov = usage0.provenance
    return InterventionEffect(
        interventions=interventions,
        layers=list(usage0.layers),
        band_names=list(names),
        energy=energy.double(),
        logit_share=shares.double(),
        head_kinds=[runs[0][2].kinds(), runs[1][2].kinds()],
        tau=float(heads0.tau),
        provenance=Provenance(
            model=prov.model,
            corpus=corpus_name,
            corpus_sha256=corpus_sha,
            n_tokens=int(windows.numel()),
            n_windows=int(windows.shape[0]),
            n_ctx=int(windows.shape[1]),
            **placement(model),
            config={
                "bands": bands.describe(),
                "energy_source": "post",
                "layers": list(usage0.layers),
                "interventions": interventions,
                "verification": {
                    "without": stats0.provenance.config.get("verification"),
                    "with": runs[1][1].provenance.config.get("verification"),
                },
            },
        ),
    )
