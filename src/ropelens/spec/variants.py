"""RoPE variants (p-RoPE, NoPE, context extension, Resonance, CoPE, FoPE's zeroing) as value
objects: per-plane frequencies and scaling.

A variant is a small frozen value object that says what one layer rotates: ``inv_freq(layer)``
(radians per token per plane, highest frequency first, as many planes as the layer),
``attention_scaling(layer)`` (the multiplier of cos and sin) and, for everything the frequencies
cannot express (LongRoPE's uninterpolated first positions, length-dependent scaling),
``angles(layer, positions)``.

Where HF transformers implements a method (``ROPE_INIT_FUNCTIONS``: linear, dynamic, yarn, longrope,
llama3, proportional) the variant calls it on a minimal config built from the layer's spec, so the
frequencies are HF's to the bit; the rest are closed forms written on top of HF's default formula.

Running a model under a variant (``apply_rope_variant``, ``with_rope_variant``) and zeroing planes
(``ablate_planes``) live in :mod:`ropelens.run.intervene`.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
from jaxtyping import Float, Int
from torch import Tensor

from ropelens.errors import InputError
from ropelens.spec.rope import LayerRope
from ropelens.validate import check_factors, check_flag, check_indices, check_number

__all__ = [
    "RopeVariant",
    "Default",
    "PRoPE",
    "PRoPEReversed",
    "PRoPEPartial",
    "NoPE",
    "BaseChange",
    "PlaneMask",
    "Linear",
    "NTK",
    "DynamicNTK",
    "YaRN",
    "Llama3",
    "LongRoPE",
    "Resonance",
    "CoPE",
    "FoPEZero",
    "check_variant",
    "kept_planes",
    "variant_from_dict",
]


def _base(layer: LayerRope) -> float:
    if layer.base is None:
        raise InputError(
            f"layer {layer.layer} records no RoPE base (LayerRope.base is None), so its "
            "frequencies cannot be recomputed: build the LayerRope with base=<the model's "
            "rope_theta>"
        )
    return float(layer.base)


# How each parameter is checked and normalised; any other parameter is a positive number.
_COERCE: dict[str, Callable[[Any, str], Any]] = {
    "p": functools.partial(
        check_number, at_least=0, at_most=1, hint=" (p is the share of planes that rotate)"
    ),
    "base": functools.partial(check_number, above=1, hint=" (θ_i = base^(−2i/d) must fall with i)"),
    "factor": functools.partial(
        check_number, above=0, hint=" (the context-extension ratio, e.g. 4)"
    ),
    "original_max_position": functools.partial(
        check_number, at_least=1, integer=True, hint=" (a length in tokens)"
    ),
    "n_hat": functools.partial(
        check_number, at_least=0, integer=True, hint=" (positions left uninterpolated)"
    ),
    "n_low": functools.partial(
        check_number,
        at_least=0,
        integer=True,
        hint=" (how many of the lowest-frequency planes CoPE tapers)",
    ),
    "planes": lambda v, what: check_indices(v, what[:-1]),
    "truncate": check_flag,
    "short_factor": check_factors,
    "long_factor": check_factors,
}
_POSITIVE = functools.partial(check_number, above=0)


# --------------------------------------------------------------------------------------------
# frequencies: HF's functions on a minimal config, and HF's default formula
# --------------------------------------------------------------------------------------------
class _RopeConfig:
    """The config fields HF's ``ROPE_INIT_FUNCTIONS`` read, describing one layer's rotary part."""

    def __init__(self, layer: LayerRope, rope_parameters: dict[str, Any], max_position: int | None):
        # head_dim = rotary_dim: frequencies span the rotary part, as HF's partial_rotary_factor
        # does.
        self.head_dim = freq_dim(layer)
        self.hidden_size = self.head_dim  # some functions evaluate hidden_size // heads eagerly
        self.num_attention_heads = 1
        self.max_position_embeddings = max_position
        self.rope_parameters = {"rope_theta": _base(layer), **rope_parameters}

    def standardize_rope_params(self) -> None:
        """Nothing to standardise: the parameters are complete and flat."""


def freq_dim(layer: LayerRope) -> int:
    """The width d of the default formula θ_i = base^(−2i/d) the layer's frequencies follow: its
    rotary dim, except where its own default frequencies were computed over another width with as
    many planes (MiMo-V2-Flash rounds ``head_dim · partial_rotary_factor`` down to an odd 5 for 6
    rotary dims); variants recompute over the same d."""
    d = layer.rotary_dim
    if layer.base is None or layer.rope_type != "default" or not layer.n_planes:
        return d
    own = layer.inv_freq.float()
    for cand in (d, d - 1):
        if (
            cand > 0
            and (cand + 1) // 2 == layer.n_planes
            and torch.allclose(_default_inv_freq(float(layer.base), cand), own, rtol=1e-6, atol=0)
        ):
            return cand
    return d


def _default_inv_freq(base: float, rotary_dim: int) -> Float[Tensor, " n_planes"]:
    """θ_i = base^(−2i/d), written exactly as HF's ``compute_default_rope_parameters``
    (bit-identical)."""
    return 1.0 / (base ** (torch.arange(0, rotary_dim, 2, dtype=torch.float) / rotary_dim))


def kept_planes(p: float, n_planes: int) -> int:
    """Planes a p-RoPE keeps: ``int(p · 2n // 2)``, HF ``proportional``'s rounding.

    In exact arithmetic this is ⌊p·n⌋ (0.7 of 8 planes keeps 5). HF evaluates p·d in floating point
    first, so where p·d lands just below an even integer it keeps one plane fewer: 0.58 of 50 planes
    keeps 28, not 29 (0.58·100 = 57.99999999999999). ropelens follows HF so that PRoPE(p) is HF's.

    Args:
        p (float): Share of the planes that keep rotating, in [0, 1].
        n_planes (int): The layer's planes (its rotary dims / 2).

    Returns:
        int: How many planes rotate: the highest frequencies under :class:`PRoPE`, the lowest
        under :class:`PRoPEReversed`, the recomputed first ones under :class:`PRoPEPartial`.

    Raises:
        InputError: If ``p`` is not a number in [0, 1].

    Examples:
        >>> kept_planes(0.7, 8)
        5
        >>> kept_planes(0.58, 50)  # HF's floating-point p·d, not ⌊29.0⌋
        28
    """
    return int(_COERCE["p"](p, "p") * (2 * n_planes) // 2)


# --------------------------------------------------------------------------------------------
# variants
# --------------------------------------------------------------------------------------------
_REGISTRY: dict[str, type[RopeVariant]] = {}


@dataclass(frozen=True)
class RopeVariant:
    """What a RoPE variant rotates in one layer: frequencies, cos/sin multiplier, angles.

    The base class of every variant. A variant is a frozen value object whose fields are its
    parameters, checked when it is built; it describes one layer (a
    :class:`~ropelens.spec.rope.LayerRope`) through :meth:`inv_freq` (radians per token of each
    plane, highest frequency first), :meth:`attention_scaling` (the multiplier of cos and sin) and
    :meth:`angles` (each plane's angle at each position, for what one frequency vector cannot
    express). :meth:`to_dict` and :func:`variant_from_dict` carry it through JSON for provenance.
    Run a model under one with :func:`ropelens.apply_rope_variant` (a context) or
    :func:`ropelens.with_rope_variant` (a copy of the model).

    Subclasses register under their class name, which is how :func:`variant_from_dict` finds them;
    the class variable ``rope_type`` is HF's name for the method where HF implements it.

    Examples:
        >>> from ropelens import apply_rope_variant, rope_spec
        >>> from ropelens.testing import tiny_model
        >>> model = tiny_model("llama")
        >>> layer = rope_spec(model)[0]
        >>> variant = PRoPE(0.5)
        >>> variant.name
        'PRoPE(p=0.5)'
        >>> [round(f, 4) for f in variant.inv_freq(layer).tolist()]
        [1.0, 0.3162, 0.1, 0.0316, 0.0, 0.0, 0.0, 0.0]
        >>> with apply_rope_variant(model, variant) as spec:
        ...     print(int((spec[0].inv_freq == 0).sum()), "planes stopped")
        4 planes stopped
    """

    rope_type: ClassVar[str] = "default"  # HF's name where HF implements the method

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        _REGISTRY[cls.__name__] = cls

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if isinstance(value, torch.nn.Module):  # the class called where its instance goes
                example = _example(type(self))
                raise InputError(
                    f"{type(self).__name__} was given a model ({type(value).__name__}) as its "
                    f"{f.name}: a variant is made from its parameters, e.g. {example}, and passed "
                    f"beside the model, e.g. apply_rope_variant(model, {example})"
                )
            if value is not None or f.default is not None:
                object.__setattr__(self, f.name, _COERCE.get(f.name, _POSITIVE)(value, f.name))
        self._check()

    def _check(self) -> None:
        """Checks across parameters (none by default)."""

    def inv_freq(self, layer: LayerRope) -> Float[Tensor, " n_planes"]:
        """Radians per token of each plane of ``layer``, highest frequency first (float32).

        Args:
            layer (LayerRope): The layer the variant replaces the rotation of; its base
                (rope_theta), rotary dims and trained context are what the frequencies are
                recomputed from.

        Returns:
            Tensor: ``[n_planes]`` frequencies θ_i; 0 marks a plane that does not rotate.

        Raises:
            InputError: If the variant needs the layer's base or trained context and the layer
                records none (``LayerRope.base`` / ``n_ctx`` is None).
            NotImplementedError: On the base class itself.
        """
        raise NotImplementedError(f"{type(self).__name__} does not define inv_freq")

    def attention_scaling(self, layer: LayerRope) -> float:  # noqa: ARG002
        """Multiplier of cos and sin: YaRN's or LongRoPE's attention factor, else 1.0.

        Args:
            layer (LayerRope): The layer (the factor may depend on its trained context).

        Returns:
            float: The multiplier; every plane logit scales by its square.
        """
        return 1.0

    def angles(
        self, layer: LayerRope, positions: Int[Tensor, "*batch pos"]
    ) -> Float[Tensor, "*batch pos n_planes"]:
        """Rotation angle of each plane at each position (float32, as HF's rotary modules).

        Args:
            layer (LayerRope): The layer.
            positions (Tensor): Integer token positions, any leading shape ``[*batch, pos]``.

        Returns:
            Tensor: ``[*batch, pos, n_planes]`` angles m·θ_i in radians.
        """
        return positions[..., None].float() * self.inv_freq(layer).to(positions.device)

    @property
    def name(self) -> str:
        """The variant as its constructor call, e.g. ``PRoPE(p=0.5)`` (labels and file names)."""
        args = ", ".join(f"{k}={v!r}" for k, v in self.to_dict().items() if k != "variant")
        return f"{type(self).__name__}({args})"

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready provenance: ``{"variant": class name, **parameters}`` (tuples as lists)."""
        d = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        return {
            "variant": type(self).__name__,
            **{k: list(v) if isinstance(v, tuple) else v for k, v in d.items()},
        }


# a value of each parameter some variant needs, for the example a refusal gives
_EXAMPLE_VALUES = {
    "p": "0.75",
    "base": "500000.0",
    "planes": "[0, 1]",
    "factor": "4.0",
    "original_max_position": "4096",
    "short_factor": "(1.0,) * 32",
    "long_factor": "(4.0,) * 32",
}


def _example(cls: type[RopeVariant]) -> str:
    """``cls`` built from the parameters it needs, as Python: ``PRoPE(0.75)``, ``NoPE()``."""
    needed = [
        f.name
        for f in dataclasses.fields(cls)
        if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
    ]
    return f"{cls.__name__}({', '.join(_EXAMPLE_VALUES[name] for name in needed)})"


def check_variant(variant: Any) -> RopeVariant:
    """``variant`` if it is a RoPE variant, else a TypeError in one line: a variant class is named,
    with how to instantiate it; anything else by its type (never its repr, which for a model runs
    to kilobytes).

    Args:
        variant (Any): What was passed where a variant goes.

    Returns:
        RopeVariant: ``variant`` itself.

    Raises:
        TypeError: If ``variant`` is not an instance of a :class:`RopeVariant` subclass.

    Examples:
        >>> check_variant(PRoPE(0.75))
        PRoPE(p=0.75)
        >>> check_variant(PRoPE)
        Traceback (most recent call last):
        ...
        TypeError: expected a RoPE variant, got the class PRoPE: instantiate it with its ...
    """
    if isinstance(variant, RopeVariant):
        return variant
    if isinstance(variant, type) and issubclass(variant, RopeVariant):
        if variant.__name__ not in _REGISTRY or variant.__name__.startswith("_"):
            raise TypeError(
                f"expected a RoPE variant, got the base class {variant.__name__}: pass one of its "
                "variants, instantiated, e.g. PRoPE(0.75)"
            )
        example = _example(variant)
        with_what = "" if example.endswith("()") else " with its parameters"
        raise TypeError(
            f"expected a RoPE variant, got the class {variant.__name__}: instantiate it"
            f"{with_what}, e.g. {example}"
        )
    raise TypeError(
        "expected a RoPE variant such as ropelens.spec.variants.PRoPE(0.75), got "
        f"{type(variant).__name__}"
    )


def variant_from_dict(d: dict[str, Any]) -> RopeVariant:
    """Rebuild a variant from :meth:`RopeVariant.to_dict`.

    The ``"variant"`` key names the class (any registered subclass of :class:`RopeVariant`); the
    other keys are its parameters, checked as the constructor checks them.

    Args:
        d (dict[str, Any]): ``{"variant": class name, **parameters}`` as ``to_dict`` wrote it
            (lists stand for tuples).

    Returns:
        RopeVariant: The variant, equal to the one that wrote ``d``.

    Raises:
        InputError: If ``d["variant"]`` names no variant class (the message lists them), or a
            parameter is out of range.

    Examples:
        >>> d = YaRN(4.0, 2048).to_dict()
        >>> d["variant"], d["factor"], d["original_max_position"]
        ('YaRN', 4.0, 2048)
        >>> variant_from_dict(d) == YaRN(4.0, 2048)
        True
    """
    d = dict(d)
    name = d.pop("variant", None)
    if name not in _REGISTRY or name.startswith("_"):
        raise InputError(
            f"unknown variant {name!r}: expected one of "
            f"{sorted(k for k in _REGISTRY if k[0] != '_')}"
        )
    return _REGISTRY[name](**d)


class _HF(RopeVariant):
    """A variant HF implements: frequencies and attention factor from ``ROPE_INIT_FUNCTIONS``."""

    _HF_NAMES: ClassVar[dict[str, str]] = {
        "p": "partial_rotary_factor",
        "original_max_position": "original_max_position_embeddings",
    }

    def _hf(self, layer: LayerRope, seq_len: int | Tensor | None = None) -> tuple[Tensor, float]:
        from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

        params = {self._HF_NAMES.get(k, k): v for k, v in self.to_dict().items() if v is not None}
        params = {k: v for k, v in params.items() if k not in ("variant", "n_hat")}
        cfg = _RopeConfig(layer, {**params, "rope_type": self.rope_type}, self._max_position(layer))
        try:
            inv, scaling = ROPE_INIT_FUNCTIONS[self.rope_type](cfg, None, seq_len=seq_len)
        except RuntimeError:
            d = cfg.head_dim
            if d % 2 == 0:
                raise
            # an odd frequency width (MiMo-V2-Flash's 5): HF's per-plane ramps and factors have d //
            # 2 entries for (d + 1) // 2 frequencies. The same frequencies base^(−2i/d) are
            # base'^(−2i/d') over the even width d' = 2·planes with base' = base^(d'/d), and YaRN's
            # correction range d·log(·)/(2·log base) is unchanged by that change of variables:
            # computed so, over every plane.
            even = 2 * ((d + 1) // 2)
            cfg.head_dim = cfg.hidden_size = even
            cfg.rope_parameters = {**cfg.rope_parameters, "rope_theta": _base(layer) ** (even / d)}
            inv, scaling = ROPE_INIT_FUNCTIONS[self.rope_type](cfg, None, seq_len=seq_len)
        return inv.float(), float(scaling)

    def _max_position(self, layer: LayerRope) -> int | None:
        """HF's ``max_position_embeddings``: what dynamic and derived factors are relative to."""
        return layer.n_ctx

    def inv_freq(self, layer: LayerRope) -> Float[Tensor, " n_planes"]:
        return self._hf(layer)[0]

    def attention_scaling(self, layer: LayerRope) -> float:
        return self._hf(layer)[1]


@dataclass(frozen=True)
class Default(RopeVariant):
    """Plain RoPE θ_i = base^(−2i/d_r) (undoes any scaling the model itself applies).

    The frequencies are recomputed from the layer's base (rope_theta) over its rotary dims d_r with
    HF's default formula, bit for bit, and the cos/sin multiplier is 1: a model trained or shipped
    with linear, YaRN or Llama 3 scaling runs with its unscaled RoPE. It takes no parameters.

    Examples:
        >>> from ropelens import rope_spec
        >>> from ropelens.testing import tiny_model
        >>> scaled = {"rope_theta": 10000.0, "rope_type": "linear", "factor": 4.0}
        >>> layer = rope_spec(tiny_model("llama", rope_parameters=scaled))[0]
        >>> [round(f, 4) for f in layer.inv_freq.tolist()]  # the model's own: θ_i / 4
        [0.25, 0.0791, 0.025, 0.0079, 0.0025, 0.0008, 0.0003, 0.0001]
        >>> [round(f, 4) for f in Default().inv_freq(layer).tolist()]
        [1.0, 0.3162, 0.1, 0.0316, 0.01, 0.0032, 0.001, 0.0003]
    """

    def inv_freq(self, layer: LayerRope) -> Float[Tensor, " n_planes"]:
        """θ_i = base^(−2i/d_r) from the layer's base, as HF's default formula computes it."""
        return _default_inv_freq(_base(layer), freq_dim(layer))


@dataclass(frozen=True)
class NoPE(RopeVariant):
    """No rotation at all: every θ_i = 0 (planes keep their content, lose position).

    NoPE is p-RoPE with p = 0 (Barbero et al. 2024, arXiv 2410.06205): q and k enter the score
    unrotated, so attention can only tell positions apart through the causal mask. It takes no
    parameters.

    Examples:
        >>> from ropelens import rope_spec
        >>> from ropelens.testing import tiny_model
        >>> layer = rope_spec(tiny_model("llama"))[0]  # 8 planes, base 10000, n_ctx 256
        >>> NoPE().inv_freq(layer).tolist()
        [0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0]
        >>> import torch
        >>> NoPE().angles(layer, torch.arange(3)).shape  # [pos, n_planes]
        torch.Size([3, 8])
    """

    rope_type: ClassVar[str] = "nope"

    def inv_freq(self, layer: LayerRope) -> Float[Tensor, " n_planes"]:
        """Zeros, one per plane."""
        return torch.zeros(layer.n_planes, dtype=torch.float32)


@dataclass(frozen=True)
class PRoPE(_HF):
    """p-RoPE: keep the highest ``kept_planes(p)`` frequencies, θ = 0 for the rest (HF
    ``proportional``).

    Barbero et al., "Round and Round We Go! What makes Rotary Positional Encodings useful?" (ICLR
    2025, arXiv 2410.06205): the lowest frequencies barely turn over a context, so they carry
    semantic rather than positional information; stopping them (θ = 0) keeps that channel free of
    position. p = 1 is RoPE, p = 0 is NoPE; their best model was 0.75-RoPE. The kept frequencies
    keep their exponent over the full rotary width (unlike :class:`PRoPEPartial`), as HF's
    ``proportional`` (Gemma 4) computes them.

    Args:
        p (float): Share of the planes that keep rotating, in [0, 1] (see :func:`kept_planes`).

    Raises:
        InputError: If ``p`` is not in [0, 1].

    Examples:
        >>> from ropelens import rope_spec
        >>> from ropelens.testing import tiny_model
        >>> layer = rope_spec(tiny_model("llama"))[0]  # 8 planes, base 10000, n_ctx 256
        >>> [round(f, 4) for f in PRoPE(0.75).inv_freq(layer).tolist()]
        [1.0, 0.3162, 0.1, 0.0316, 0.01, 0.0032, 0.0, 0.0]
    """

    p: float
    rope_type: ClassVar[str] = "proportional"

    def inv_freq(self, layer: LayerRope) -> Float[Tensor, " n_planes"]:
        """The layer's highest ``kept_planes(p)`` frequencies, then zeros."""
        d = freq_dim(layer)
        if d == layer.rotary_dim:
            return self._hf(layer)[0]  # HF's proportional, bit for bit
        # frequencies over another width than the rotary dims (an odd one): the layer's own, the
        # rest unrotated
        inv = _default_inv_freq(_base(layer), d)
        inv[kept_planes(self.p, layer.n_planes) :] = 0.0
        return inv


@dataclass(frozen=True)
class PRoPEReversed(RopeVariant):
    """Reversed p-RoPE: keep the lowest ``kept_planes(p)`` frequencies, θ = 0 for the highest
    ones.

    The control of Barbero et al.'s p-RoPE ("0.75-RoPE reversed", arXiv 2410.06205): as many
    planes stop as under :class:`PRoPE`, but the positional (highest-frequency) ones instead of the
    semantic ones.

    Args:
        p (float): Share of the planes that keep rotating, in [0, 1] (see :func:`kept_planes`).

    Raises:
        InputError: If ``p`` is not in [0, 1].

    Examples:
        >>> from ropelens import rope_spec
        >>> from ropelens.testing import tiny_model
        >>> layer = rope_spec(tiny_model("llama"))[0]  # 8 planes, base 10000, n_ctx 256
        >>> [round(f, 4) for f in PRoPEReversed(0.5).inv_freq(layer).tolist()]
        [0.0, 0.0, 0.0, 0.0, 0.01, 0.0032, 0.001, 0.0003]
    """

    p: float
    rope_type: ClassVar[str] = "p-rope-reversed"

    def inv_freq(self, layer: LayerRope) -> Float[Tensor, " n_planes"]:
        """Zeros for the highest frequencies, then the lowest ``kept_planes(p)``."""
        inv = _default_inv_freq(_base(layer), freq_dim(layer))
        inv[: layer.n_planes - kept_planes(self.p, layer.n_planes)] = 0.0
        return inv


@dataclass(frozen=True)
class PRoPEPartial(RopeVariant):
    """Partial-rotary ablation: the first k = ``kept_planes(p)`` planes rotate with θ_i =
    base^(−2i/(2k)).

    This is ordinary partial rotary over a rotary sub-dimension of 2k (Barbero et al.'s "partial"
    0.75-RoPE): frequencies are recomputed over 2k dims, so they span the whole range base^0 …
    base^(−(k−1)/k), unlike p-RoPE, which keeps the first k of the full-dimension frequencies.
    The planes are the layer's own (plane i pairs dims (i, i + d/2) in the half layout), so the
    rotated dimensions are those of planes 0..k−1, not dims 0..2k−1 as in a NeoX checkpoint.

    Args:
        p (float): Share of the planes that rotate, in [0, 1] (k = :func:`kept_planes`).

    Raises:
        InputError: If ``p`` is not in [0, 1].

    Examples:
        >>> from ropelens import rope_spec
        >>> from ropelens.testing import tiny_model
        >>> layer = rope_spec(tiny_model("llama"))[0]  # 8 planes, base 10000, n_ctx 256
        >>> [round(f, 4) for f in PRoPEPartial(0.5).inv_freq(layer).tolist()]  # 10000^(−i/4)
        [1.0, 0.1, 0.01, 0.001, 0.0, 0.0, 0.0, 0.0]
    """

    p: float
    rope_type: ClassVar[str] = "p-rope-partial"

    def inv_freq(self, layer: LayerRope) -> Float[Tensor, " n_planes"]:
        """base^(−2i/(2k)) for the first k = ``kept_planes(p)`` planes, then zeros."""
        k = kept_planes(self.p, layer.n_planes)
        inv = torch.zeros(layer.n_planes, dtype=torch.float32)
        if k:
            inv[:k] = _default_inv_freq(_base(layer), 2 * k)
        return inv


@dataclass(frozen=True)
class BaseChange(RopeVariant):
    """Plain RoPE with another base (rope_theta).

    θ_i = base^(−2i/d_r) over the layer's rotary dims: a smaller base turns every plane but the
    first faster, a larger one slower (Barbero et al. compare θ = 10k with 500k). "Base of RoPE
    bounds context length" (arXiv 2405.14591) asks the base to keep Σ_i cos(m·θ_i) ≥ 0 for every
    distance m the context holds.

    Args:
        base (float): The new base, > 1.

    Raises:
        InputError: If ``base`` is not a number above 1.

    Examples:
        >>> from ropelens import rope_spec
        >>> from ropelens.testing import tiny_model
        >>> layer = rope_spec(tiny_model("llama"))[0]  # 8 planes, base 10000, n_ctx 256
        >>> [round(f, 4) for f in BaseChange(500.0).inv_freq(layer).tolist()]
        [1.0, 0.4599, 0.2115, 0.0972, 0.0447, 0.0206, 0.0095, 0.0043]
    """

    base: float

    def inv_freq(self, layer: LayerRope) -> Float[Tensor, " n_planes"]:
        """θ_i = base^(−2i/d_r) with this variant's base."""
        return _default_inv_freq(self.base, freq_dim(layer))


@dataclass(frozen=True)
class PlaneMask(RopeVariant):
    """Plain RoPE with the given planes left unrotated (θ = 0); 0 is the highest frequency.

    The planes keep their content and lose position: unlike
    :func:`ropelens.ablate_planes`, which zeroes a plane's term of the logit, a masked plane still
    contributes its (now position-free) q·k.

    Args:
        planes (tuple[int, ...]): Plane indices, 0-based from the highest frequency; stored
            sorted and without repeats.

    Raises:
        InputError: If an index is negative or not an int; :meth:`inv_freq` raises it for an
            index past the layer's planes.

    Examples:
        >>> from ropelens import rope_spec
        >>> from ropelens.testing import tiny_model
        >>> layer = rope_spec(tiny_model("llama"))[0]  # 8 planes, base 10000, n_ctx 256
        >>> [round(f, 4) for f in PlaneMask((0, 1)).inv_freq(layer).tolist()]
        [0.0, 0.0, 0.1, 0.0316, 0.01, 0.0032, 0.001, 0.0003]
    """

    planes: tuple[int, ...]
    rope_type: ClassVar[str] = "plane-mask"

    def inv_freq(self, layer: LayerRope) -> Float[Tensor, " n_planes"]:
        """Plain RoPE with the masked planes at 0 (InputError for a plane the layer lacks)."""
        check_indices(self.planes, "plane", layer.n_planes, f"layer {layer.layer}")
        inv = _default_inv_freq(_base(layer), freq_dim(layer))
        inv[list(self.planes)] = 0.0
        return inv


@dataclass(frozen=True)
class Linear(_HF):
    """Position interpolation (Chen et al.): θ_i / factor (HF ``linear``).

    Chen et al. 2023, "Extending Context Window of Large Language Models via Positional
    Interpolation" (arXiv 2306.15595): positions are squeezed by ``factor`` so a context ``factor``
    times the trained one turns every plane no further than training did; every frequency, the
    positional high ones included, slows by the same ratio.

    Args:
        factor (float): The context-extension ratio s (> 0), e.g. 4 for 4× the trained context.

    Raises:
        InputError: If ``factor`` is not a positive number.

    Examples:
        >>> from ropelens import rope_spec
        >>> from ropelens.testing import tiny_model
        >>> layer = rope_spec(tiny_model("llama"))[0]  # 8 planes, base 10000, n_ctx 256
        >>> [round(f, 4) for f in Linear(4.0).inv_freq(layer).tolist()]
        [0.25, 0.0791, 0.025, 0.0079, 0.0025, 0.0008, 0.0003, 0.0001]
    """

    factor: float
    rope_type: ClassVar[str] = "linear"


@dataclass(frozen=True)
class NTK(RopeVariant):
    """Static NTK-aware scaling: plain RoPE with base · factor^(d/(d−2)) (HF has only the dynamic
    form).

    Raising the base by factor^(d/(d−2)) leaves the highest frequency (θ₀ = 1) as it is and
    slows the lowest, θ_(d/2−1), by exactly ``factor``: high frequencies are extrapolated, low
    ones interpolated, with a geometric blend between.

    Args:
        factor (float): The context-extension ratio s (> 0).

    Raises:
        InputError: If ``factor`` is not a positive number; :meth:`inv_freq` raises it for a layer
            with at most 2 rotary dims (the exponent d/(d−2) is undefined).

    Examples:
        >>> from ropelens import rope_spec
        >>> from ropelens.testing import tiny_model
        >>> layer = rope_spec(tiny_model("llama"))[0]  # 8 planes, base 10000, n_ctx 256
        >>> [round(f, 4) for f in NTK(4.0).inv_freq(layer).tolist()]
        [1.0, 0.2594, 0.0673, 0.0175, 0.0045, 0.0012, 0.0003, 0.0001]
    """

    factor: float
    rope_type: ClassVar[str] = "ntk"

    def inv_freq(self, layer: LayerRope) -> Float[Tensor, " n_planes"]:
        """Plain RoPE with base · factor^(d/(d−2)) (InputError for rotary_dim ≤ 2)."""
        d = layer.rotary_dim
        if d <= 2:
            raise InputError(
                f"NTK scaling needs rotary_dim > 2 (exponent d/(d−2)); layer {layer.layer} has {d}"
            )
        return _default_inv_freq(_base(layer) * self.factor ** (d / (d - 2)), d)


@dataclass(frozen=True)
class DynamicNTK(_HF):
    """Dynamic NTK (HF ``dynamic``): NTK base scaling that grows with the sequence length.

    Stateless: the frequencies are those for the current input's length (max position + 1). HF's
    module is stateful: after a long input it keeps the long-input frequencies for later inputs
    until one is shorter than ``original_max_position``.

    Up to ``original_max_position`` tokens it is plain RoPE; beyond, HF's base becomes
    base·((s·L/L₀) − (s − 1))^(d/(d−2)) for an input of L tokens, s = ``factor``.

    Args:
        factor (float): The scaling factor s (> 0).
        original_max_position (int): The trained context L₀ in tokens (≥ 1), below which nothing
            changes.

    Raises:
        InputError: If ``factor`` is not positive or ``original_max_position`` not a positive int.

    Examples:
        >>> from ropelens import rope_spec
        >>> from ropelens.testing import tiny_model
        >>> layer = rope_spec(tiny_model("llama"))[0]  # 8 planes, base 10000, n_ctx 256
        >>> ntk = DynamicNTK(4.0, original_max_position=64)
        >>> [round(f, 4) for f in ntk.inv_freq(layer).tolist()]  # within 64 tokens: plain RoPE
        [1.0, 0.3162, 0.1, 0.0316, 0.01, 0.0032, 0.001, 0.0003]
        >>> [round(f, 4) for f in ntk.inv_freq(layer, seq_len=256).tolist()]
        [1.0, 0.2192, 0.0481, 0.0105, 0.0023, 0.0005, 0.0001, 0.0]
    """

    factor: float
    original_max_position: int
    rope_type: ClassVar[str] = "dynamic"

    def _max_position(self, layer: LayerRope) -> int | None:  # noqa: ARG002
        return self.original_max_position

    def inv_freq(
        self, layer: LayerRope, seq_len: int | Tensor | None = None
    ) -> Float[Tensor, " n_planes"]:
        """Frequencies at ``seq_len`` tokens (None: the original context, i.e. plain RoPE).

        Args:
            layer (LayerRope): The layer.
            seq_len (int | Tensor | None): Input length in tokens; at most
                ``original_max_position`` (or None) gives plain RoPE.

        Returns:
            Tensor: ``[n_planes]`` frequencies, highest first.
        """
        if seq_len is not None and int(seq_len) <= self.original_max_position:
            seq_len = None  # HF keeps its init-time frequencies up to the original length
        return self._hf(layer, seq_len)[0]

    def angles(
        self,
        layer: LayerRope,
        positions: Int[Tensor, "*batch pos"],
        seq_len: int | Tensor | None = None,
    ) -> Float[Tensor, "*batch pos n_planes"]:
        """Angles with the frequencies for ``seq_len`` (default: max position + 1, as HF's forward).

        Args:
            layer (LayerRope): The layer.
            positions (Tensor): Integer positions ``[*batch, pos]``.
            seq_len (int | Tensor | None): Input length the frequencies are for (None: the
                largest position + 1).

        Returns:
            Tensor: ``[*batch, pos, n_planes]`` angles in radians.
        """
        # A tensor seq_len takes HF's runtime (float32 tensor) path, so the base matches HF's bit
        # for bit.
        seq_len = positions.max() + 1 if seq_len is None else seq_len
        return positions[..., None].float() * self.inv_freq(layer, seq_len).to(positions.device)


@dataclass(frozen=True)
class YaRN(_HF):
    """YaRN (HF ``yarn``): interpolate low frequencies, keep high ones, ramp between β_slow and
    β_fast.

    ``attention_factor`` overrides the cos/sin multiplier (default 0.1·ln s + 1). ``mscale`` and
    ``mscale_all_dim`` are DeepSeek's form, ratio of the two mscales; HF ignores ``mscale`` alone.
    ``original_max_position``: the trained context (default: the layer's n_ctx).

    Peng et al. 2023, "YaRN: Efficient Context Window Extension of Large Language Models" (arXiv
    2309.00071): a plane that turns more than β_fast times within the trained context L₀ keeps its
    frequency, one that turns fewer than β_slow times is interpolated (θ_i / s), and the planes
    between blend the two along a linear ramp over the plane index.

    Args:
        factor (float): The context-extension ratio s (> 0).
        original_max_position (int | None): The trained context L₀ in tokens; None reads the
            layer's n_ctx.
        beta_fast (float): Turns within L₀ above which a plane is left as it is (default 32).
        beta_slow (float): Turns within L₀ below which a plane is fully interpolated (default 1).
        mscale (float | None): DeepSeek's mscale; with ``mscale_all_dim`` the multiplier is the
            ratio of the two mscales. Pass both or neither.
        mscale_all_dim (float | None): DeepSeek's mscale_all_dim (see ``mscale``).
        attention_factor (float | None): The cos/sin multiplier itself, overriding the default
            0.1·ln s + 1.
        truncate (bool): HF's ``truncate``: round the correction range to whole planes (True, the
            paper's) or keep it fractional (gpt-oss).

    Raises:
        InputError: If ``beta_fast`` ≤ ``beta_slow``, only one of ``mscale`` and
            ``mscale_all_dim`` is given, or a number is out of range; :meth:`inv_freq` raises it
            when ``original_max_position`` is None and the layer records no n_ctx.

    Examples:
        >>> from ropelens import rope_spec
        >>> from ropelens.testing import tiny_model
        >>> layer = rope_spec(tiny_model("llama"))[0]  # 8 planes, base 10000, n_ctx 256
        >>> yarn = YaRN(4.0, original_max_position=64)
        >>> [round(f, 4) for f in yarn.inv_freq(layer).tolist()]
        [1.0, 0.2372, 0.05, 0.0079, 0.0025, 0.0008, 0.0003, 0.0001]
        >>> round(yarn.attention_scaling(layer), 4)  # 0.1·ln 4 + 1
        1.1386
    """

    factor: float
    original_max_position: int | None = None
    beta_fast: float = 32.0
    beta_slow: float = 1.0
    mscale: float | None = None
    mscale_all_dim: float | None = None
    attention_factor: float | None = None
    truncate: bool = True
    rope_type: ClassVar[str] = "yarn"

    def _hf(self, layer: LayerRope, seq_len: int | Tensor | None = None) -> tuple[Tensor, float]:
        if self.original_max_position is None:  # relative to the layer's trained context
            native = _native(layer, None, "YaRN")
            return dataclasses.replace(self, original_max_position=native)._hf(layer, seq_len)
        return super()._hf(layer, seq_len)

    def _check(self) -> None:
        # Checked here because HF reads `beta or default`: a 0 would silently become 32 or 1.
        if self.beta_fast <= self.beta_slow:
            raise InputError(
                f"beta_fast ({self.beta_fast}) must exceed beta_slow ({self.beta_slow}): "
                "defaults are 32 and 1"
            )
        if (self.mscale is None) != (self.mscale_all_dim is None):
            raise InputError(
                f"pass mscale and mscale_all_dim together (got {self.mscale!r}, "
                f"{self.mscale_all_dim!r}): HF ignores one without the other; to set the cos/sin "
                "multiplier pass attention_factor="
            )


@dataclass(frozen=True)
class Llama3(_HF):
    """Llama 3.1 scaling (HF ``llama3``): θ/factor beyond wavelength L₀/low, θ below L₀/high, smooth
    between.

    Planes whose wavelength 2π/θ_i is shorter than L₀ / ``high_freq_factor`` keep their frequency,
    those longer than L₀ / ``low_freq_factor`` are divided by ``factor``, and between the two the
    frequency blends smoothly from one to the other. The defaults are Llama 3.1's.

    Args:
        factor (float): The interpolation factor of the long-wavelength planes (default 8).
        low_freq_factor (float): L₀ / this is the wavelength beyond which planes are fully
            interpolated (default 1).
        high_freq_factor (float): L₀ / this is the wavelength below which planes are kept
            (default 4); must exceed ``low_freq_factor``.
        original_max_position (int): The trained context L₀ in tokens (default 8192).

    Raises:
        InputError: If ``high_freq_factor`` ≤ ``low_freq_factor`` or a number is out of range.

    Examples:
        >>> from ropelens import rope_spec
        >>> from ropelens.testing import tiny_model
        >>> layer = rope_spec(tiny_model("llama"))[0]  # 8 planes, base 10000, n_ctx 256
        >>> llama3 = Llama3(original_max_position=64)  # wavelengths 16 … 64 blend
        >>> [round(f, 4) for f in llama3.inv_freq(layer).tolist()]
        [1.0, 0.2444, 0.013, 0.004, 0.0012, 0.0004, 0.0001, 0.0]
    """

    factor: float = 8.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position: int = 8192
    rope_type: ClassVar[str] = "llama3"

    def _check(self) -> None:
        if self.high_freq_factor <= self.low_freq_factor:
            raise InputError(
                f"high_freq_factor ({self.high_freq_factor}) must exceed low_freq_factor "
                f"({self.low_freq_factor}): defaults are 4 and 1"
            )


@dataclass(frozen=True)
class LongRoPE(_HF):
    """LongRoPE (HF ``longrope``): θ_i / λ_i per plane, short or long λ by input length, attention
    factor.

    The attention factor is √(1 + ln s / ln L₀) with s = ``factor`` (default: the layer's n_ctx /
    L₀, as HF does for Phi-3), applied at every length as HF does. ``n_hat`` > 0 adds the paper's
    uninterpolated start: positions < n_hat rotate with plain RoPE θ_i, later ones with θ_i / λ_i;
    that cannot be one frequency vector, so it lives in :meth:`angles`.

    Ding et al. 2024, "LongRoPE: Extending LLM Context Window Beyond 2 Million Tokens" (arXiv
    2402.13753) found the per-plane rescale factors λ_i by evolutionary search on perplexity; HF
    uses ``short_factor`` for inputs up to L₀ tokens and ``long_factor`` beyond.

    Args:
        short_factor (tuple[float, ...]): λ_i per plane for inputs of at most L₀ tokens (> 0).
        long_factor (tuple[float, ...]): λ_i per plane for longer inputs (as many entries).
        original_max_position (int): The trained context L₀ in tokens.
        factor (float | None): The extension ratio s in the attention factor; None: the layer's
            n_ctx / L₀.
        attention_factor (float | None): The cos/sin multiplier itself, overriding
            √(1 + ln s / ln L₀).
        n_hat (int): Positions left uninterpolated at the start (default 0: none).

    Raises:
        InputError: If the two factor lists differ in length or hold a non-positive value; the
            methods raise it for a layer with another number of planes, or when ``factor`` is None
            and the layer records no n_ctx.

    Examples:
        >>> from ropelens import rope_spec
        >>> from ropelens.testing import tiny_model
        >>> layer = rope_spec(tiny_model("llama"))[0]  # 8 planes, base 10000, n_ctx 256
        >>> import torch
        >>> rope = LongRoPE((1.0,) * 8, (2.0,) * 8, original_max_position=64, n_hat=4)
        >>> round(rope.attention_scaling(layer), 4)  # s = 256 / 64: √(1 + ln 4 / ln 64)
        1.1547
        >>> rope.angles(layer, torch.tensor([2, 100]))[:, 0].tolist()  # plane 0: θ = 1, λ = 2
        [2.0, 50.0]
    """

    short_factor: tuple[float, ...]
    long_factor: tuple[float, ...]
    original_max_position: int
    factor: float | None = None
    attention_factor: float | None = None
    n_hat: int = 0
    rope_type: ClassVar[str] = "longrope"

    def _check(self) -> None:
        if len(self.short_factor) != len(self.long_factor):
            raise InputError(
                f"short_factor has {len(self.short_factor)} entries but long_factor "
                f"{len(self.long_factor)}: give one rescale factor per plane in both"
            )

    def _hf(self, layer: LayerRope, seq_len: int | Tensor | None = None) -> tuple[Tensor, float]:
        if len(self.short_factor) != layer.n_planes:
            raise InputError(
                f"LongRoPE has {len(self.short_factor)} rescale factors but layer {layer.layer} "
                f"has {layer.n_planes} planes: pass one factor per plane (short_factor and "
                "long_factor)"
            )
        if self.factor is None and layer.n_ctx is None:
            raise InputError(
                "LongRoPE needs factor= (the layer spec records no n_ctx to derive it from)"
            )
        return super()._hf(layer, seq_len)

    def inv_freq(self, layer: LayerRope, seq_len: int | None = None) -> Float[Tensor, " n_planes"]:
        """Frequencies for an input of ``seq_len`` tokens: long factors beyond L₀, else short.

        Args:
            layer (LayerRope): The layer.
            seq_len (int | None): Input length in tokens (None: the short factors).

        Returns:
            Tensor: ``[n_planes]`` frequencies θ_i / λ_i.
        """
        return self._hf(layer, None if seq_len is None else int(seq_len))[0]

    def angles(
        self, layer: LayerRope, positions: Int[Tensor, "*batch pos"], seq_len: int | None = None
    ) -> Float[Tensor, "*batch pos n_planes"]:
        """Angles for an input of ``seq_len`` tokens, the first ``n_hat`` positions uninterpolated.

        Args:
            layer (LayerRope): The layer.
            positions (Tensor): Integer positions ``[*batch, pos]``.
            seq_len (int | None): Input length that picks short or long factors (None: the largest
                position + 1).

        Returns:
            Tensor: ``[*batch, pos, n_planes]`` angles in radians.
        """
        seq_len = int(positions.max()) + 1 if seq_len is None else seq_len
        pos = positions[..., None].float()
        scaled = pos * self.inv_freq(layer, seq_len).to(positions.device)
        if not self.n_hat:
            return scaled
        plain = pos * _default_inv_freq(_base(layer), freq_dim(layer)).to(positions.device)
        return torch.where(positions[..., None] < self.n_hat, plain, scaled)


# --------------------------------------------------------------------------------------------
# frequency rounding, soft clipping and zeroing
# --------------------------------------------------------------------------------------------
def _native(layer: LayerRope, given: int | None, what: str) -> int:
    """The trained context length: ``given``, else the layer's ``n_ctx``."""
    if given is not None:
        return int(given)
    if layer.n_ctx is None:
        raise InputError(
            f"{what} needs the trained context length and layer {layer.layer} records none "
            "(LayerRope.n_ctx is None): pass original_max_position=<the trained length in "
            "tokens>"
        )
    return int(layer.n_ctx)


@dataclass(frozen=True)
class Resonance(RopeVariant):
    """Resonance RoPE (Wang et al. 2024, "Resonance RoPE: Improving Context Length Generalization of
    Large Language Models", arXiv 2403.00287): every plane's wavelength λ_i = 2π/θ_i is rounded to
    the nearest integer, θ̃_i = 2π / round(λ_i), so that each plane's angles repeat exactly every
    round(λ_i) tokens.

    The rounding is the authors' code's: ``torch.round(2π / θ)`` in float32 (halves to even), on
    every plane. Without ``factor`` it rounds plain RoPE's θ_i = base^(−2i/d). With ``factor`` (and
    ``original_max_position``, default the layer's n_ctx) it is the paper's Resonance-YaRN: the
    wavelengths of ``YaRN(factor, original_max_position)`` rounded, with YaRN's cos/sin multiplier.

    Args:
        factor (float | None): YaRN's extension ratio for Resonance-YaRN; None: plain Resonance
            RoPE.
        original_max_position (int | None): Resonance-YaRN's trained context in tokens (None: the
            layer's n_ctx); only with ``factor``.

    Raises:
        InputError: If ``original_max_position`` is given without ``factor``; :meth:`inv_freq`
            raises it when a wavelength rounds to 0 (a frequency above π per token).

    Examples:
        >>> from ropelens import rope_spec
        >>> from ropelens.testing import tiny_model
        >>> layer = rope_spec(tiny_model("llama"))[0]  # 8 planes, base 10000, n_ctx 256
        >>> [round(f, 4) for f in Resonance().inv_freq(layer).tolist()]  # 2π/6.28 → 2π/6
        [1.0472, 0.3142, 0.0997, 0.0316, 0.01, 0.0032, 0.001, 0.0003]
    """

    factor: float | None = None
    original_max_position: int | None = None
    rope_type: ClassVar[str] = "resonance"
    # YaRN's β_fast and β_slow are HF's defaults (32 and 1)

    def _check(self) -> None:
        if self.factor is None and self.original_max_position is not None:
            raise InputError(
                f"Resonance: original_max_position={self.original_max_position} is only read by "
                "Resonance-YaRN: pass factor= too (e.g. Resonance(4.0, 2048)), or leave both "
                "unset for plain Resonance RoPE"
            )

    def _yarn(self, layer: LayerRope) -> YaRN:
        assert self.factor is not None
        return YaRN(self.factor, _native(layer, self.original_max_position, "Resonance-YaRN"))

    def inv_freq(self, layer: LayerRope) -> Float[Tensor, " n_planes"]:
        """2π / round(2π/θ_i) of plain RoPE's θ_i, or of YaRN's with ``factor``."""
        inv = (
            _default_inv_freq(_base(layer), freq_dim(layer))
            if self.factor is None
            else self._yarn(layer).inv_freq(layer)
        )
        wavelengths = torch.round(2 * math.pi / inv)
        if bool((wavelengths == 0).any()):
            raise InputError(
                f"Resonance: a plane of layer {layer.layer} has a wavelength below half a token, "
                "which rounds to 0: its frequency exceeds π per token (a YaRN factor far below "
                "1); pass a factor ≥ 1"
            )
        return (2 * math.pi / wavelengths).float()

    def attention_scaling(self, layer: LayerRope) -> float:
        """YaRN's cos/sin multiplier for Resonance-YaRN, else 1.0."""
        return 1.0 if self.factor is None else self._yarn(layer).attention_scaling(layer)


@dataclass(frozen=True)
class CoPE(RopeVariant):
    """CoPE ("CoPE: Clipped RoPE as A Scalable Free Lunch for Long Context LLMs",
    arXiv 2602.05258): soft clipping of the lowest frequencies with a raised-cosine taper.

    Of plain RoPE's θ_i = base^(−2i/d), the last c = min(``n_low``, planes) planes (the lowest
    frequencies) are multiplied by m_j = ½(1 + cos(π·j/(c − 1))), j = 0 … c − 1: the first tapered
    plane keeps its frequency, the last is stopped (θ = 0), the ones between fall smoothly. This is
    the taper of the authors' code (``torch.linspace(0, π, c)`` in float32; c = 1 leaves the plane
    as it is), with their default ``n_low`` = 20 (of Llama-3-8B's 64 planes). ``n_low`` = 0 is plain
    RoPE.

    Args:
        n_low (int): How many of the lowest-frequency planes the taper covers (default 20).

    Raises:
        InputError: If ``n_low`` is not a non-negative int.

    Examples:
        >>> from ropelens import rope_spec
        >>> from ropelens.testing import tiny_model
        >>> layer = rope_spec(tiny_model("llama"))[0]  # 8 planes, base 10000, n_ctx 256
        >>> [round(f, 4) for f in CoPE(n_low=4).inv_freq(layer).tolist()]  # × 1, ¾, ¼, 0
        [1.0, 0.3162, 0.1, 0.0316, 0.01, 0.0024, 0.0002, 0.0]
    """

    n_low: int = 20
    rope_type: ClassVar[str] = "cope"

    def inv_freq(self, layer: LayerRope) -> Float[Tensor, " n_planes"]:
        """Plain RoPE with its lowest ``n_low`` planes tapered by the raised cosine."""
        inv = _default_inv_freq(_base(layer), freq_dim(layer))
        c = min(self.n_low, inv.numel())
        if c > 0:
            mask = 0.5 * (
                1.0 + torch.cos(torch.linspace(0.0, math.pi, steps=c, dtype=torch.float32))
            )
            inv[inv.numel() - c :] = inv[inv.numel() - c :] * mask
        return inv


@dataclass(frozen=True)
class FoPEZero(RopeVariant):
    """FoPE's zeroing of under-trained frequencies (Hua et al. 2024, "Fourier Position Embedding:
    Enhancing Attention's Periodic Extension for Length Generalization", arXiv 2412.17739).

    Of plain RoPE's θ_i = base^(−2i/d), every plane that does not complete one full turn within the
    trained context, θ_i · L < 2π (wavelength 2π/θ_i longer than L tokens), gets θ_i = 0: it becomes
    a NoPE plane. L is ``original_max_position``, by default the layer's trained context (its
    n_ctx). Only this zeroing is implemented, not FoPE's Fourier-series mixing of frequencies within
    a plane.

    Args:
        original_max_position (int | None): The trained context L in tokens; None reads the
            layer's n_ctx.

    Raises:
        InputError: If ``original_max_position`` is not a positive int; :meth:`inv_freq` raises
            it when it is None and the layer records no n_ctx.

    Examples:
        >>> from ropelens import rope_spec
        >>> from ropelens.testing import tiny_model
        >>> layer = rope_spec(tiny_model("llama"))[0]  # 8 planes, base 10000, n_ctx 256
        >>> [round(f, 4) for f in FoPEZero().inv_freq(layer).tolist()]  # wavelengths > 256 stop
        [1.0, 0.3162, 0.1, 0.0316, 0.0, 0.0, 0.0, 0.0]
    """

    original_max_position: int | None = None
    rope_type: ClassVar[str] = "fope-zero"

    def inv_freq(self, layer: LayerRope) -> Float[Tensor, " n_planes"]:
        """Plain RoPE with every plane that turns less than once within L set to 0."""
        inv = _default_inv_freq(_base(layer), freq_dim(layer))
        L = _native(layer, self.original_max_position, "FoPEZero")
        inv[inv.double() * L < 2 * math.pi] = 0.0
        return inv
