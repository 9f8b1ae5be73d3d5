"""Bands: named groups of RoPE planes (frequencies), resolved against a layer's spec.

A :class:`Bands` is a recipe (e.g. "four quantiles", "planes that turn within the context"); the
same recipe resolves to concrete plane indices for each layer, whose frequencies may differ
(Gemma's local and global layers). Planes no band claims, and the non-rotary dimensions of a
partial-rotary head, fall in an automatic ``rest`` band so that band terms always sum to the
full logit.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from ropelens.errors import InputError
from ropelens.spec.rope import LayerRope

__all__ = ["Bands", "ResolvedBands"]

REST = "rest"
DEFAULT_QUANTILES = 4  # bands of the default split (Bands.default)


@dataclass(frozen=True)
class ResolvedBands:
    """Concrete bands of one layer: plane indices per band and head-dim indices per band."""

    names: tuple[str, ...]
    planes: tuple[tuple[int, ...], ...]
    dims: tuple[Tensor, ...]  # head-dim indices of each band (rest includes non-rotary dims)
    n_planes: int

    @property
    def n_bands(self) -> int:
        return len(self.names)

    def dim_membership(self) -> Tensor:
        """``[head_dim, n_bands]`` 0/1 matrix: head dim j belongs to band b (the bands, rest
        included, cover every dim), so a matmul with it sums per-dim products into band terms."""
        m = torch.zeros(sum(len(d) for d in self.dims), self.n_bands)
        for b, dims in enumerate(self.dims):
            m[dims, b] = 1.0
        return m

    def membership(self) -> Tensor:
        """``[n_planes, n_bands]`` 0/1 matrix: plane i belongs to band b."""
        m = torch.zeros(self.n_planes, self.n_bands)
        for b, planes in enumerate(self.planes):
            m[list(planes), b] = 1.0
        return m


@dataclass(frozen=True)
class Bands:
    """A recipe for grouping planes into bands; build with the classmethods.

    The same recipe resolves to concrete plane indices in each layer (:meth:`resolve`), whose
    frequencies may differ (Gemma's local and global layers). Plane 0 is the highest frequency
    (θ₀ = 1 for default RoPE), as in Barbero et al. Planes no band claims, and the non-rotary dims
    of a partial-rotary head, fall in an automatic ``rest`` band, so band terms always sum to the
    full logit. Constructors: :meth:`planes` (every plane its own band), :meth:`all`,
    :meth:`quantiles`, :meth:`default` (four quantiles, fewer where a layer has fewer planes),
    :meth:`by_wavelength`, :meth:`by_context`, :meth:`explicit`, and :meth:`parse` for the
    command line's ``--bands``.

    Attributes:
        kind (str): ``"planes"``, ``"all"``, ``"quantiles"``, ``"wavelength"``, ``"context"`` or
            ``"explicit"``.
        params (tuple[tuple[str, Any], ...]): The recipe's parameters as (name, value) pairs
            (``n`` and ``fit`` of quantiles, wavelength ``edges`` in tokens, ``n_ctx`` and
            ``factor`` of the context split, the explicit ``groups``); () for planes and all.
        require_cover (bool): Refuse (at :meth:`resolve`) a layer in which some plane is left to
            the ``rest`` band; default False.

    Raises:
        InputError: From the constructors, on parameters that make no bands (a non-positive
            count, wavelength edges that do not increase, an empty group, a spec that does not
            parse); from :meth:`resolve`, on bands that do not fit a layer (plane indices out of
            range, overlapping bands, more quantiles than planes, planes left uncovered under
            ``require_cover``).

    Examples:
        >>> from ropelens import Bands, rope_spec
        >>> from ropelens.testing import tiny_model
        >>> layer = rope_spec(tiny_model("llama"))[0]  # 8 planes, base 1e4
        >>> bands = Bands.default()
        >>> bands.describe()
        'quantiles:<=4'
        >>> resolved = bands.resolve(layer)
        >>> resolved.names
        ('Q1 (highest)', 'Q2', 'Q3', 'Q4 (lowest)')
        >>> resolved.planes
        ((0, 1), (2, 3), (4, 5), (6, 7))
        >>> by_wl = Bands.parse("wavelength:10,100").resolve(layer)  # cut at 10 and 100 tokens
        >>> by_wl.names, by_wl.planes
        (('λ∈[0,10)', 'λ∈[10,100)', 'λ∈[100,inf)'), ((0,), (1, 2), (3, 4, 5, 6, 7)))
        >>> Bands.explicit({"high": [0, 1]}).resolve(layer).names  # planes 2-7 left to rest
        ('high', 'rest')
    """

    kind: str
    params: tuple[tuple[str, Any], ...] = ()
    require_cover: bool = False

    # ---------------------------------------------------------------- constructors
    @classmethod
    def planes(cls) -> Bands:
        """Every plane its own band (the default): ``plane 0`` is the highest frequency."""
        return cls("planes")

    @classmethod
    def all(cls) -> Bands:
        """One band holding every plane."""
        return cls("all")

    @classmethod
    def quantiles(cls, n: int, *, fit: bool = False) -> Bands:
        """``n`` contiguous bands of (nearly) equal plane count, highest frequencies first.

        ``fit``: a layer with fewer than ``n`` planes gets one band per plane instead of an error
        (written ``quantiles:<=N``); without it such a layer is refused.
        """
        if not isinstance(n, int) or isinstance(n, bool) or n < 1:
            raise InputError(f"quantiles needs a positive integer number of bands, got {n!r}")
        return cls("quantiles", (("n", n), ("fit", True)) if fit else (("n", n),))

    @classmethod
    def default(cls) -> Bands:
        """The bands every analysis uses when none are given: four quantiles, or one band per plane
        in a layer with fewer than four planes (a GPT-NeoX or Qwen3-Next with a narrow rotary
        slice)."""
        return cls.quantiles(DEFAULT_QUANTILES, fit=True)

    @classmethod
    def by_wavelength(cls, edges: Sequence[float]) -> Bands:
        """Bands cut at wavelength ``edges`` (tokens): [0, e0), [e0, e1), ..., [e_last, inf]."""
        edges = tuple(float(e) for e in edges)
        if not edges or any(e <= 0 or math.isnan(e) for e in edges):
            raise InputError(f"wavelength edges must be positive numbers of tokens, got {edges}")
        if any(b <= a for a, b in zip(edges, edges[1:])):
            raise InputError(f"wavelength edges must increase strictly, got {edges}")
        return cls("wavelength", (("edges", edges),))

    @classmethod
    def by_context(cls, n_ctx: int | None = None, factor: float = 1.0) -> Bands:
        """Two bands: planes completing a turn within ``factor·n_ctx`` tokens, and those that don't.

        ``n_ctx`` defaults to the layer's trained context length.
        """
        if n_ctx is not None and n_ctx <= 0:
            raise InputError(f"n_ctx must be positive, got {n_ctx}")
        if factor <= 0:
            raise InputError(f"factor must be positive, got {factor}")
        return cls("context", (("n_ctx", n_ctx), ("factor", float(factor))))

    @classmethod
    def explicit(cls, groups: Mapping[str, Sequence[int]], *, require_cover: bool = False) -> Bands:
        """Named bands from explicit plane indices; ``require_cover`` forbids unclaimed planes."""
        if not groups:
            raise InputError("explicit bands need at least one group, e.g. {'high': [0, 1]}")
        items = []
        for name, idx in groups.items():
            if name == REST:
                raise InputError(f"{REST!r} is reserved for unclaimed planes: rename that band")
            idx = tuple(int(i) for i in idx)
            if not idx:
                raise InputError(f"band {name!r} is empty: give it at least one plane index")
            items.append((str(name), idx))
        return cls("explicit", (("groups", tuple(items)),), require_cover)

    @classmethod
    def parse(cls, text: str, flag: str | None = None) -> Bands:
        """Parse a CLI band spec: ``planes``, ``all``, ``quantiles:4``, ``wavelength:10,100,1000``,
        ``context``.

        Errors name the spec's form and an example that parses (``flag``, the option it came from,
        leads).
        """
        head, _, arg = text.partition(":")
        lead = f"{flag}: " if flag else ""
        eg = f"e.g. {flag} " if flag else "e.g. "
        forms = {
            "quantiles": (
                "quantiles:N or quantiles:<=N (fewer bands in a layer with fewer planes) with N "
                "a positive integer",
                "quantiles:4",
            ),
            "wavelength": (
                "wavelength:E1,E2,... with E strictly increasing wavelengths in tokens",
                "wavelength:10,100,1000",
            ),
            "context": ("context[:FACTOR] with FACTOR a positive number", "context:2"),
        }

        def bad(token: str, why: str = "") -> InputError:
            form, example = forms[head]
            return InputError(
                f"{lead}bad band spec {text!r}: {why or f'{token!r} is not a number'}: write "
                f"{form}, {eg}{example}"
            )

        def number(token: str, kind: type) -> Any:
            try:
                value = kind(token)
            except ValueError:
                value = None
            if value is None or not math.isfinite(value):
                raise bad(
                    token, f"{token!r} is not {'an integer' if kind is int else 'a finite number'}"
                )
            return value

        try:
            if head == "planes" and not arg:
                return cls.planes()
            if head == "all" and not arg:
                return cls.all()
            if head == "quantiles":
                fit = arg.startswith(("<=", "≤"))
                arg = arg.removeprefix("<=").removeprefix("≤")
                return cls.quantiles(number(arg, int) if arg else DEFAULT_QUANTILES, fit=fit)
            if head == "wavelength":
                if not arg.strip(", "):
                    raise bad(arg, "no wavelengths given")
                return cls.by_wavelength(
                    [number(x.strip(), float) for x in arg.split(",") if x.strip()]
                )
            if head == "context":
                return cls.by_context(factor=number(arg, float) if arg else 1.0)
        except InputError as e:
            if str(e).startswith(f"{lead}bad band spec"):
                raise
            raise bad(arg, str(e)) from e
        raise InputError(
            f"{lead}unknown band spec {text!r}: use planes, all, quantiles:N, "
            f"wavelength:E1,E2,... or context[:FACTOR], {eg}quantiles:4"
        )

    # ---------------------------------------------------------------- resolution
    def describe(self) -> str:
        """The recipe as the command line writes it (``quantiles:<=4``, ``wavelength:10,100``)."""
        p = dict(self.params)
        if self.kind == "quantiles":
            return f"quantiles:{'<=' if p.get('fit') else ''}{p['n']}"
        if self.kind == "wavelength":
            return "wavelength:" + ",".join(f"{e:g}" for e in p["edges"])
        if self.kind == "context":
            return f"context:{p['factor']:g}" + (f"@{p['n_ctx']}" if p["n_ctx"] else "")
        if self.kind == "explicit":
            return "explicit:" + ";".join(f"{n}={list(i)}" for n, i in p["groups"])
        return self.kind

    def resolve(self, layer: LayerRope) -> ResolvedBands:
        """Concrete bands for ``layer``, with a ``rest`` band for unclaimed and non-rotary dims."""
        n = layer.n_planes
        names, groups = self._groups(layer)
        claimed = [i for g in groups for i in g]
        bad = [i for i in claimed if not 0 <= i < n]
        if bad:
            raise InputError(
                f"plane indices {sorted(set(bad))} out of range: layer {layer.layer} has planes "
                f"0..{n - 1}"
            )
        if len(claimed) != len(set(claimed)):
            dup = sorted({i for i in claimed if claimed.count(i) > 1})
            raise InputError(f"bands overlap on planes {dup}: each plane may belong to one band")
        rest = tuple(i for i in range(n) if i not in set(claimed))
        if rest and self.require_cover:
            raise InputError(
                f"bands leave planes {list(rest)} uncovered; add them to a band or drop "
                "require_cover"
            )
        pd_ = layer.plane_dims
        dims = [pd_[list(g)].flatten() if g else torch.zeros(0, dtype=torch.long) for g in groups]
        extra = torch.arange(layer.rotary_dim, layer.head_dim)
        if rest or extra.numel():
            names = names + (REST,)
            groups = groups + (rest,)
            rest_dims = pd_[list(rest)].flatten() if rest else torch.zeros(0, dtype=torch.long)
            dims.append(torch.cat([rest_dims, extra]))
        return ResolvedBands(
            names=names, planes=groups, dims=tuple(d.sort().values for d in dims), n_planes=n
        )

    def empty_bands(self, layer: LayerRope) -> tuple[str, ...]:
        """The bands that hold no head dimension in ``layer``: their band-only logits are all 0
        there, so what a band does alone (its top-1 agreement, its pattern) cannot be measured in
        that layer."""
        rb = self.resolve(layer)
        return tuple(name for name, dims in zip(rb.names, rb.dims, strict=True) if not len(dims))

    def require_planes(self, layers: Sequence[LayerRope]) -> None:
        """InputError when a band holds no plane in any of ``layers``: nothing of it could be
        measured anywhere.

        The message names the band, the planes the layers have (count and wavelength range) and a
        spec that fits them. A band empty in some of the layers only (Gemma's local and global
        layers, say) is measured where it has planes; its band-only agreement reads NaN in the
        others.
        """
        layers = list(layers)
        if not layers:
            return
        empty = set(self.empty_bands(layers[0]))
        for lr in layers[1:]:
            empty &= set(self.empty_bands(lr))
        if not empty:
            return
        name = next(n for n in self.resolve(layers[0]).names if n in empty)
        wl = [float(w) for lr in layers for w in lr.wavelength.tolist()]
        finite = [w for w in wl if math.isfinite(w)] or [math.inf]
        counts = sorted({lr.n_planes for lr in layers})
        where = (
            f"layer {layers[0].layer}"
            if len(layers) == 1
            else f"any of the {len(layers)} layers measured "
            f"({_span_text([lr.layer for lr in layers])})"
        )
        have = (
            f"they have {'/'.join(map(str, counts))} planes, with wavelengths from "
            f"{min(finite):.4g} to {max(finite):.4g} tokens"
            if wl
            else "they have no rotary planes"
        )
        fixes = {
            "wavelength": "pass edges inside that range (--bands wavelength:E1,E2,...)",
            "context": "pass another factor (--bands context:F)",
        }
        fix = fixes.get(self.kind, "pass a spec whose every band holds a plane")
        raise InputError(
            f"band {name!r} of --bands {self.describe()} holds no plane in {where}, so its "
            f"band-only statistics cannot be measured: {have}; {fix}, or use --bands quantiles:N"
        )

    def _groups(self, layer: LayerRope) -> tuple[tuple[str, ...], tuple[tuple[int, ...], ...]]:
        n = layer.n_planes
        p = dict(self.params)
        if self.kind == "planes":
            return tuple(f"plane {i}" for i in range(n)), tuple((i,) for i in range(n))
        if self.kind == "all":
            return ("all",), (tuple(range(n)),)
        if self.kind == "quantiles":
            k = min(p["n"], n) if p.get("fit") else p["n"]
            if k > n:
                raise InputError(
                    f"quantiles:{k} needs at least {k} planes but layer {layer.layer} has {n}: "
                    f"pass --bands quantiles:{n} (or quantiles:<={k}, one band per plane where "
                    f"fewer; Bands.quantiles({k}, fit=True) in Python)"
                )
            cuts = [round(j * n / k) for j in range(k + 1)]
            names = tuple(
                f"Q{j + 1}" + (" (highest)" if j == 0 else " (lowest)" if j == k - 1 else "")
                for j in range(k)
            )
            return names, tuple(tuple(range(cuts[j], cuts[j + 1])) for j in range(k))
        if self.kind == "wavelength":
            edges = (0.0, *p["edges"], math.inf)
            wl = layer.wavelength.tolist()
            groups = tuple(
                tuple(i for i, w in enumerate(wl) if lo <= w < hi or (hi == math.inf and w == hi))
                for lo, hi in zip(edges, edges[1:])
            )
            names = tuple(f"λ∈[{lo:g},{hi:g})" for lo, hi in zip(edges, edges[1:]))
            return names, groups
        if self.kind == "context":
            ctx = (p["n_ctx"] or layer._ctx(None)) * p["factor"]
            wl = layer.wavelength.tolist()
            within = tuple(i for i, w in enumerate(wl) if w <= ctx)
            beyond = tuple(i for i, w in enumerate(wl) if w > ctx)
            return (f"turns within {ctx:g}", f"never turns within {ctx:g}"), (within, beyond)
        if self.kind == "explicit":
            return tuple(nm for nm, _ in p["groups"]), tuple(g for _, g in p["groups"])
        raise InputError(f"unknown band kind {self.kind!r}")

    def to_dict(self) -> dict[str, Any]:
        """The recipe as a JSON-ready dict (what results save); :meth:`from_dict` reads it."""
        return {
            "kind": self.kind,
            "spec": self.describe(),
            "require_cover": self.require_cover,
            "params": [[k, v] for k, v in self.params],
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Bands:
        """The recipe :meth:`to_dict` wrote."""
        return cls(
            d["kind"], tuple((k, _tupled(v)) for k, v in d["params"]), bool(d["require_cover"])
        )


def _tupled(v: Any) -> Any:
    """JSON lists back to the tuples a frozen Bands holds."""
    return tuple(_tupled(x) for x in v) if isinstance(v, list) else v


def _span_text(layers: Sequence[int]) -> str:
    """Layer indices as a message names them: ``0..11`` when contiguous, else the list."""
    if len(layers) > 2 and list(layers) == list(range(layers[0], layers[-1] + 1)):
        return f"{layers[0]}..{layers[-1]}"
    return ", ".join(map(str, layers))
