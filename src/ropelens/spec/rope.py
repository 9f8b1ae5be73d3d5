"""RoPE specifications: frequencies, wavelengths and plane pairing of a running model.

Index 0 of every frequency axis is the *highest* frequency (θ₀ = 1 for default RoPE, wavelength 2π),
as in Barbero et al. A *plane* is the 2-D subspace of a head that one frequency rotates.
"""

from __future__ import annotations

import functools
import json
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

import pandas as pd
import torch
from jaxtyping import Bool, Float, Int
from torch import Tensor

from ropelens.errors import InputError, UnsupportedModelError

Pairing = Literal["half", "adjacent"]
# the axes along which layers of one model may differ in width, and the LayerRope count each is as
# long as
_WIDTH_AXES = {"head": "n_heads", "kv_head": "n_kv_heads", "plane": "n_planes", "dim": "head_dim"}
LayerKind = Literal[
    "full", "sliding", "chunked", "nope", "linear", "conv", "mamba", "recurrent", "none"
]
# Layers of a hybrid model with no softmax attention (Qwen3-Next's Gated DeltaNet, LFM2's short
# convolution, Bamba's Mamba): listed in the spec so its layer numbers stay the model's, never
# measured.
MIXER_KINDS = frozenset({"linear", "conv", "mamba", "recurrent", "none"})
# The position axes of multimodal RoPE (M-RoPE, Qwen2-VL): a plane labelled with axis a turns by
# position_ids[a]·θ_i.
MROPE_AXES = ("t", "h", "w")

__all__ = [
    "MIXER_KINDS",
    "MROPE_AXES",
    "LayerRope",
    "RopeSpec",
    "describe_axes",
    "layer_ranges",
    "expand_kv",
    "merge_planes",
    "plane_dims",
    "plane_norms",
    "split_planes",
]


def plane_dims(rotary_dim: int, pairing: Pairing) -> Int[Tensor, "n_planes 2"]:
    """Indices (x, y) into the head dimension of each rotated plane, highest frequency first.

    "half" (Llama, Gemma, NeoX: ``rotate_half``) pairs dims (i, i + rotary_dim/2);
    "adjacent" (GPT-J) pairs dims (2i, 2i + 1).
    """
    if rotary_dim < 0 or rotary_dim % 2:
        raise InputError(f"rotary_dim must be a non-negative even number, got {rotary_dim}")
    n = rotary_dim // 2
    i = torch.arange(n)
    if pairing == "half":
        return torch.stack([i, i + n], dim=1)
    if pairing == "adjacent":
        return torch.stack([2 * i, 2 * i + 1], dim=1)
    raise InputError(f"pairing must be 'half' or 'adjacent', got {pairing!r}")


def split_planes(
    x: Float[Tensor, "... head_dim"], rotary_dim: int, pairing: Pairing
) -> Float[Tensor, "... n_planes 2"]:
    """View the rotary part of ``x`` as planes: ``out[..., i, :]`` is plane i's 2-D coordinate."""
    if x.shape[-1] < rotary_dim:
        raise InputError(
            f"last dimension {x.shape[-1]} is smaller than rotary_dim {rotary_dim}: "
            "pass the head vectors, not a slice of them"
        )
    n = rotary_dim // 2
    if pairing == "half":
        return torch.stack([x[..., :n], x[..., n:rotary_dim]], dim=-1)
    if pairing == "adjacent":
        return x[..., :rotary_dim].unflatten(-1, (n, 2))
    raise InputError(f"pairing must be 'half' or 'adjacent', got {pairing!r}")


def merge_planes(
    planes: Float[Tensor, "... n_planes 2"], pairing: Pairing
) -> Float[Tensor, "... rotary_dim"]:
    """Inverse of :func:`split_planes` on the rotary part."""
    if pairing == "half":
        return torch.cat([planes[..., 0], planes[..., 1]], dim=-1)
    if pairing == "adjacent":
        return planes.flatten(-2)
    raise InputError(f"pairing must be 'half' or 'adjacent', got {pairing!r}")


def plane_norms(
    x: Float[Tensor, "... head_dim"], rotary_dim: int, pairing: Pairing
) -> Float[Tensor, "... n_planes"]:
    """2-norm of each plane of ``x`` (one fused op, no stacked copy)."""
    n = rotary_dim // 2
    if pairing == "half":
        return torch.hypot(x[..., :n], x[..., n:rotary_dim])
    if pairing == "adjacent":
        return torch.hypot(x[..., 0:rotary_dim:2], x[..., 1:rotary_dim:2])
    raise InputError(f"pairing must be 'half' or 'adjacent', got {pairing!r}")


def plane_sums(
    x: Float[Tensor, "... head_dim"], rotary_dim: int, pairing: Pairing
) -> Float[Tensor, "... n_planes"]:
    """Sum of each plane's two coordinates of ``x`` (of ``q * k``: each plane's logit term,
    unscaled)."""
    n = rotary_dim // 2
    if pairing == "half":
        return x[..., :n] + x[..., n:rotary_dim]
    if pairing == "adjacent":
        return x[..., 0:rotary_dim:2] + x[..., 1:rotary_dim:2]
    raise InputError(f"pairing must be 'half' or 'adjacent', got {pairing!r}")


@functools.lru_cache(maxsize=256)
def _sink_logits(sinks: tuple[float, ...], device: torch.device, dtype: torch.dtype) -> Tensor:
    """Learned sink logits as a tensor on ``device``, copied there once (a copy per call would make
    the host wait for the device every tile)."""
    return torch.tensor(sinks, dtype=dtype, device=device)


@dataclass(frozen=True)
class LayerRope:
    """What one attention layer rotates, read from the running model.

    **Norm after RoPE** (``norm_after_rope``): some models (HunYuan dense, NanoChat) normalise q and
    k per head, with a per-dim gain, *after* ``apply_rotary_pos_emb``, so the score is made of ``q_s
    = s_q(m)·g ⊙ R(m)q`` and ``k_s = s_k(n)·g' ⊙ R(n)k``. ropelens then takes "post-RoPE" q and k
    where they enter the score (``q_post``/``k_post`` are ``q_s``/``k_s``; ``q_rot``/``k_rot`` are
    the rotation's own output, which the probe checks against this spec), and:

    - the plane terms stay an exact decomposition of the logit: the sum over planes of
      ``q_s^(i)·k_s^(i)`` times the score scale is the model's pre-softmax score;
    - plane i's frequency is θ_i, the frequency its rotation had before the norm;
    - relative-position invariance no longer holds exactly: the norm rescales each position by
      its own factor, and a gain that differs between a plane's two dims makes the plane's term
      depend on more than m − n (analyses that re-rotate pre-RoPE q/k describe the rotation, not
      the score).

    **Multi-head latent attention** (DeepSeek V2/V3, MiniCPM3, GLM-4.7-Flash): each head is
    ``[no-position dims, rotary dims]`` (``qk_nope_head_dim`` then ``qk_rope_head_dim``), so the
    rotary slice starts at ``rotary_offset`` in the model's head. ropelens's captured head vectors
    put the rotary dims first (:meth:`from_model`: the same permutation of q's and k's dims, which
    leaves every q·k unchanged), so the planes are dims ``[0, rotary_dim)`` as for partial rotary
    and the dims after them are the no-position term. The key's rotary part (``k_pe``) is computed
    once and shared by every head (``shared_rotary_key``): per plane, every head's key is the same
    vector. With ``rope_interleave`` (DeepSeek V3) the model's rotation reads adjacent pairs (2i,
    2i+1) and writes them as (i, i + n) (``pre_interleaved``, pairing "half"): ropelens's pre-RoPE q
    and k are de-interleaved (:meth:`pre_from_model`), so :meth:`rotate` maps them onto the
    post-RoPE ones.

    **Key selection** (DeepSeek V3.2's sparse attention, GLM-5; Qwen4-Exp's block selection): an
    indexer scores the keys the mask allows and keeps at most ``select_keys`` of them per query
    (DeepSeek: its top ``index_topk``; Qwen4-Exp: whole blocks up to its token budget, plus an
    incomplete block's tail), and a query allowed at most ``select_keys`` keeps them all; the
    softmax runs over those alone. The logits are still q·k times the scale, so their decomposition
    is unchanged; only the mask is the input's. On windows of at most ``select_keys`` tokens no
    query is allowed more keys than it keeps, so the mask is :meth:`mask` exactly (:meth:`selects`
    is False); on longer ones the capture reads the selection from the mask the model hands its
    attention function (``"selected"``), and analyses that assume :meth:`mask` refuse
    (:meth:`require_static_mask`).

    **Chunked attention** (Llama 4's rotary layers, ``attention_chunk_size``): the window is cut
    into chunks of ``chunk`` tokens from its first token, and a query sees only the keys at or
    before it in its own chunk (HF's ``chunked_causal_mask_function``; windows are right-padded, so
    chunks start at index 0). :meth:`mask` applies it; analyses whose fast paths assume a causal or
    sliding mask refuse windows longer than the chunk (:meth:`require_static_mask`), where inside
    one chunk the mask is causal.

    **Query scale** (``query_scale``): a NoPE layer that multiplies each query by a factor of its
    position before the score (Llama 4's ``attn_temperature_tuning``: ``1 + attn_scale·ln(1 + ⌊(m +
    1)/floor_scale⌋)``; Beam's scalable softmax, passed in as ``attention_scaling``): its score is
    not q·k times one scale, so such layers are listed (kind "nope") and never measured;
    ``query_scale`` says the factor, in words.

    **Query temperature** (``temperature``): a rotary layer that multiplies each *rotated* query at
    position m by ``1 + β·ln(1 + ⌊m/L₀⌋)`` before the score (Ministral 3 and Mistral 4:
    ``llama_4_scaling_beta`` β and ``original_max_position_embeddings`` L₀; the factor is 1 below
    L₀). ``temperature`` is ``(β, L₀)``, read from the config and confirmed on the model's own
    forward at positions past L₀ (:mod:`ropelens.spec.reading`). ``q_rot`` is the rotation's output
    and ``q_post`` the query entering the score, ``query_temperature(m)·q_rot``, so the plane terms
    of ``q_post·k_post`` still sum to the model's score; a plane's term then depends on m as well as
    m − n.

    Attributes:
        layer (int): The layer's index in the model.
        inv_freq (Tensor): ``[n_planes]`` frequency θ_i of each plane in radians per token,
            highest first (θ₀ = 1 for default RoPE); 0 for a plane a variant stops.
        head_dim (int): Dims per head.
        rotary_dim (int): Dims the rotation turns (2 per plane): ``head_dim`` for full rotary,
            fewer for partial rotary (GPT-J, GPT-NeoX), whose remaining dims are never rotated.
        pairing (str): Which dims make a plane: ``"half"`` (dims i and i + rotary_dim/2, Llama's
            ``rotate_half``) or ``"adjacent"`` (dims 2i and 2i+1, GPT-J).
        n_heads (int): Query heads.
        n_kv_heads (int): Key/value heads (fewer than ``n_heads`` under grouped-query attention).
        score_scale (float): What multiplies q·k before the softmax: 1/√head_dim, or Gemma's
            ``query_pre_attn_scalar``^-½.
        rope_type (str): The config's ``rope_type`` (``"default"``, ``"linear"``, ``"dynamic"``,
            ``"yarn"``, ``"longrope"``, ``"llama3"``, ...).
        base (float | None): The RoPE base θ (10000 by default), where the config gives one.
        rope_parameters (dict[str, Any]): The config's RoPE parameters for this layer, as read.
        attention_scaling (float): What multiplies cos and sin (YaRN/LongRoPE's mscale); 1 if none.
        kind (str): ``"full"``, ``"sliding"``, ``"chunked"``, ``"nope"`` (attention without
            rotation: no planes; masks follow ``window``), or a layer without softmax attention
            (``"linear"``, ``"conv"``, ``"mamba"``, ``"recurrent"``, ``"none"``: listed so the layer
            numbers stay the model's, never measured).
        window (int | None): Sliding window: a query at m sees keys n with m − window < n ≤ m.
        chunk (int | None): Chunked attention (Llama 4): a query at m sees keys n ≤ m of its own
            chunk, ⌊n/chunk⌋ = ⌊m/chunk⌋ (see "Chunked attention" above).
        select_keys (int | None): Sparse attention (DeepSeek's DSA, Qwen4-Exp's QSA): the most
            keys an indexer keeps per query (see "Key selection" above).
        n_ctx (int | None): The trained context length, in tokens.
        softcap (float | None): Attention-logit soft-capping c: scores become c·tanh(s/c) (Gemma 2).
        sinks (tuple[float, ...] | None): Learned per-head sink logits that join the softmax
            (gpt-oss), one per query head.
        direction (int): +1 where position m turns each plane by +m·θ_i (Llama's rotate_half), −1
            where by −m·θ_i (NanoChat).
        norm_after_rope (bool): q and k are normalised per head, with a per-dim gain, after the
            rotation (HunYuan dense, NanoChat; see "Norm after RoPE" above).
        mixer (str | None): HF class of the layer's other token mixer: the one it has instead of
            softmax attention (heads and widths are then 0), or one running beside its attention
            (Falcon-H1's Mamba).
        output_gate (bool): A sigmoid gate on the attention output (Qwen3-Next); it acts after
            the softmax, so the logits and pattern ropelens measures are unchanged by it.
        rotary_offset (int): Where the rotary dims start in the model's own head vectors
            (multi-head latent attention; see above); 0 otherwise.
        pre_interleaved (bool): The model's rotation reads adjacent pairs and writes them split in
            halves (DeepSeek V3's ``rope_interleave``).
        shared_rotary_key (bool): The key's rotary planes are one vector shared by all heads (MLA).
        axes (tuple[int, ...]): Multimodal RoPE: the position axis of each plane, an index into
            ``MROPE_AXES`` (time, height, width); () for 1-D RoPE. On text alone every plane turns
            by the token's position, as in 1-D RoPE.
        query_scale (str | None): A NoPE layer's position-dependent query factor, in words (see
            "Query scale" above).
        temperature (tuple[float, int] | None): (β, L₀): rotated queries are multiplied by
            1 + β·ln(1 + ⌊m/L₀⌋) (see "Query temperature" above).
        ablated (tuple[tuple[int, ...], ...]): Planes zeroed in the rotated queries by a plane
            ablation in force (:func:`ropelens.ablate_planes`): ``ablated[h]`` lists query head
            h's, whose logit terms are then 0; () where none is.

    Raises:
        InputError: When the fields contradict each other: ``inv_freq`` not 1-D or not
            ``rotary_dim / 2`` long, ``rotary_dim`` (from ``rotary_offset``) past ``head_dim``,
            ``n_heads`` not a multiple of ``n_kv_heads``, a NoPE or mixer layer with planes (or a
            rotary one without), a ``direction`` other than ±1, one sink per head missing,
            ``select_keys`` or ``chunk`` below 1 (or a chunk beside a window), a temperature on a
            layer that does not rotate, ``axes`` not one per plane.

    Examples:
        Read from a model (GPT-J pairs adjacent dims and rotates 8 of its 16):

        >>> import torch
        >>> from ropelens import LayerRope, rope_spec
        >>> from ropelens.testing import tiny_model
        >>> layer = rope_spec(tiny_model("gptj"))[0]
        >>> layer.pairing, layer.n_planes, layer.rotary_dim, layer.head_dim
        ('adjacent', 4, 8, 16)
        >>> [round(w, 1) for w in layer.wavelength.tolist()]  # 2π/θ_i tokens per turn
        [6.3, 62.8, 628.3, 6283.2]

        Or built by hand: the rotated q·k depends on the positions only through m − n.

        >>> layer = LayerRope(
        ...     layer=0, inv_freq=torch.tensor([1.0, 0.1]), head_dim=4, rotary_dim=4,
        ...     pairing="half", n_heads=1, n_kv_heads=1, score_scale=0.5,
        ... )
        >>> q = k = torch.tensor([[1.0, 0.0, 0.0, 0.0]])  # all in plane 0 (θ₀ = 1)
        >>> def logit(m, n):
        ...     q_m = layer.rotate(q, torch.tensor([m]))
        ...     k_n = layer.rotate(k, torch.tensor([n]))
        ...     return round(float(q_m @ k_n[0]), 4)
        >>> logit(3, 1), logit(12, 10), round(float(torch.cos(torch.tensor(2.0))), 4)
        (-0.4161, -0.4161, -0.4161)
        >>> layer.planes_beyond(n_ctx=10).tolist()  # plane 1's wavelength, 62.8, exceeds 10
        [1]
    """

    layer: int
    inv_freq: Float[Tensor, "n_planes"]  # radians per token, highest first
    head_dim: int
    rotary_dim: int
    pairing: Pairing
    n_heads: int
    n_kv_heads: int
    score_scale: float  # multiplies q·k before softmax (1/√d, or Gemma's query_pre_attn_scalar^-½)
    rope_type: str = "default"
    base: float | None = None
    rope_parameters: dict[str, Any] = field(default_factory=dict)
    attention_scaling: float = 1.0  # multiplies cos and sin (YaRN/LongRoPE mscale)
    kind: LayerKind = (
        "full"  # "nope": attention without rotation (no planes); masks follow `window`
    )
    window: int | None = None  # sliding window: a query at m sees keys n with m − window < n ≤ m
    # chunked attention (Llama 4): a query at m sees keys n ≤ m of its own chunk, ⌊n/chunk⌋ =
    # ⌊m/chunk⌋; see "Chunked attention" in the class docstring
    chunk: int | None = None
    # sparse attention (DeepSeek's DSA, Qwen4-Exp's QSA): an indexer keeps at most ``select_keys``
    # of the keys the mask allows each query, picked from the input at run time; see "Key selection"
    # in the class docstring
    select_keys: int | None = None
    n_ctx: int | None = None
    softcap: float | None = (
        None  # attention-logit soft-capping c: scores become c·tanh(s/c) (Gemma 2)
    )
    sinks: tuple[float, ...] | None = (
        None  # learned per-head sink logits that join the softmax (gpt-oss)
    )
    # +1: position m turns each plane by +m·θ_i (Llama's rotate_half); −1: by −m·θ_i (NanoChat)
    direction: int = 1
    # the q and k entering the score are a per-head norm (a per-position rescaling) and per-dim gain
    # of the rotated q and k (HunYuan dense, NanoChat); see "Norm after RoPE" in the class docstring
    norm_after_rope: bool = False
    # HF class of the layer's other token mixer: the one it has instead of softmax attention (kind
    # in MIXER_KINDS; heads and widths are then 0), or the one running beside its attention
    # (Falcon-H1's Mamba)
    mixer: str | None = None
    # a sigmoid gate on the attention output, sigmoid(x·W_g) ⊙ (softmax·V) (Qwen3-Next): it acts
    # after the softmax, so the logits and the pattern ropelens measures are the same with or
    # without it
    output_gate: bool = False
    # multi-head latent attention (DeepSeek V2/V3, MiniCPM3): see "Multi-head latent attention" in
    # the class docstring
    rotary_offset: int = 0  # where the rotary dims start in the model's own head vectors
    pre_interleaved: bool = (
        False  # the model's rotation reads adjacent pairs and writes them split in halves
    )
    shared_rotary_key: bool = False  # the key's rotary planes are one vector shared by all heads
    # multimodal RoPE (M-RoPE: Qwen2-VL's sections, Qwen3-VL's interleaving): the position axis of
    # each plane, an index into MROPE_AXES (time, height, width); () for 1-D RoPE. Text tokens have
    # t = h = w, so on text alone every plane turns by the token's position, as in 1-D RoPE; image
    # tokens turn each plane by their own axis.
    axes: tuple[int, ...] = ()
    query_scale: str | None = (
        None  # a NoPE layer's position-dependent query factor, in words (see above)
    )
    temperature: tuple[float, int] | None = (
        None  # (β, L₀): rotated queries × 1 + β·ln(1 + ⌊m/L₀⌋) (see above)
    )
    # planes zeroed in the rotated queries by a plane ablation in force (``ablate_planes``):
    # ``ablated[h]`` lists query head h's, whose logit terms are then 0; () where none is
    ablated: tuple[tuple[int, ...], ...] = ()

    def __post_init__(self) -> None:
        if self.direction not in (1, -1):
            raise InputError(f"direction must be 1 or -1, got {self.direction!r}")
        if self.inv_freq.ndim != 1:
            raise InputError(f"inv_freq must be 1-D, got shape {tuple(self.inv_freq.shape)}")
        if 2 * self.inv_freq.numel() != self.rotary_dim:
            raise InputError(
                f"inv_freq has {self.inv_freq.numel()} planes but rotary_dim is {self.rotary_dim}"
            )
        if self.rotary_dim > self.head_dim:
            raise InputError(f"rotary_dim {self.rotary_dim} exceeds head_dim {self.head_dim}")
        if self.kind in MIXER_KINDS:
            if self.rotary_dim or self.n_heads or self.n_kv_heads or self.head_dim:
                raise InputError(
                    f"layer {self.layer}: a {self.kind!r} layer has no softmax attention: no "
                    "heads, no planes"
                )
        elif self.n_kv_heads <= 0 or self.n_heads % self.n_kv_heads:
            raise InputError(
                f"n_heads {self.n_heads} is not a multiple of n_kv_heads {self.n_kv_heads}"
            )
        if (self.kind == "nope" or self.kind in MIXER_KINDS) != (self.rotary_dim == 0):
            raise InputError(
                f"layer {self.layer}: kind 'nope' (or a layer without attention) is exactly the "
                "layers with no rotary planes"
            )
        if self.rotary_offset < 0 or self.rotary_offset + self.rotary_dim > self.head_dim:
            raise InputError(
                f"layer {self.layer}: rotary dims [{self.rotary_offset}, "
                f"{self.rotary_offset + self.rotary_dim}) do not fit in head_dim {self.head_dim}"
            )
        if self.sinks is not None and len(self.sinks) != self.n_heads:
            raise InputError(f"sinks has {len(self.sinks)} entries for {self.n_heads} heads")
        if self.select_keys is not None and self.select_keys < 1:
            raise InputError(
                f"layer {self.layer}: select_keys must be ≥ 1 (the keys each query keeps), got "
                f"{self.select_keys}"
            )
        if self.chunk is not None and (self.chunk < 1 or self.window):
            raise InputError(
                f"layer {self.layer}: chunk must be ≥ 1 and not beside a sliding window, got chunk "
                f"{self.chunk}, window {self.window}"
            )
        if self.temperature is not None and (self.temperature[1] < 1 or not self.rotary):
            raise InputError(
                f"layer {self.layer}: a query temperature needs a rotary layer and L₀ ≥ 1, got "
                f"{self.temperature}"
            )
        if self.axes and (
            len(self.axes) != self.n_planes or not set(self.axes) <= set(range(len(MROPE_AXES)))
        ):
            raise InputError(
                f"layer {self.layer}: axes must give one of 0, 1, 2 ({', '.join(MROPE_AXES)}) "
                f"for each of its {self.n_planes} planes, got {list(self.axes)}"
            )

    @property
    def n_planes(self) -> int:
        """Planes the layer rotates, ``rotary_dim // 2`` (0 for NoPE and mixer layers)."""
        return self.rotary_dim // 2

    def query_temperature(self, positions: Tensor) -> Tensor | None:
        """The factor of each position's rotated query, ``1 + β·ln(1 + ⌊m/L₀⌋)`` (float32, as the
        model computes it), or None for a layer without a query temperature."""
        if self.temperature is None:
            return None
        beta, l0 = self.temperature
        return 1 + beta * torch.log(1 + torch.floor(positions / l0))

    def tempered(
        self, q_rot: Float[Tensor, "batch pos head d"], pos_axis: int = 1, inverse: bool = False
    ) -> Tensor:
        """The queries entering the score from the rotated ones (positions 0, 1, … on ``pos_axis``
        of a 4-D tensor): ``q_rot`` itself unless the layer has a query temperature; ``inverse``:
        the rotated queries from the ones entering the score."""
        factor = self.query_temperature(torch.arange(q_rot.shape[pos_axis], device=q_rot.device))
        if factor is None:
            return q_rot
        shape = [1] * q_rot.ndim
        shape[pos_axis] = -1
        factor = factor.to(q_rot.dtype).view(shape)
        return q_rot / factor if inverse else q_rot * factor

    @property
    def group_size(self) -> int:
        """Query heads per KV head (grouped-query attention); query head h reads KV head h //
        group."""
        return self.n_heads // self.n_kv_heads

    @property
    def wavelength(self) -> Float[Tensor, "n_planes"]:
        """Tokens per full turn of each plane, 2π/θ_i (inf for unrotated planes)."""
        return (2 * math.pi) / self.inv_freq.double()

    def planes_beyond(self, n_ctx: int | None = None) -> Int[Tensor, " n"]:
        """Planes that never complete a turn within ``n_ctx`` tokens (wavelength > n_ctx)."""
        n_ctx = self._ctx(n_ctx)
        return torch.nonzero(self.wavelength > n_ctx).flatten()

    def _ctx(self, n_ctx: int | None) -> int:
        n_ctx = self.n_ctx if n_ctx is None else n_ctx
        if n_ctx is None or n_ctx <= 0:
            raise InputError("pass n_ctx: this spec records no context length")
        return int(n_ctx)

    @property
    def plane_dims(self) -> Int[Tensor, "n_planes 2"]:
        """``[n_planes, 2]``: the two head dims of each plane, as the pairing lays them out."""
        return plane_dims(self.rotary_dim, self.pairing)

    def split(self, x: Float[Tensor, "... head_dim"]) -> Float[Tensor, "... n_planes 2"]:
        """Split head vectors into this layer's planes (respecting pairing and partial rotary)."""
        return split_planes(x, self.rotary_dim, self.pairing)

    def plane_norms(self, x: Float[Tensor, "... head_dim"]) -> Float[Tensor, "... n_planes"]:
        """‖x^(i)‖ for every plane i."""
        return plane_norms(x, self.rotary_dim, self.pairing)

    def plane_sums(self, x: Float[Tensor, "... head_dim"]) -> Float[Tensor, "... n_planes"]:
        """x^(i)₀ + x^(i)₁ for every plane i (of ``q * k``: q^(i)·k^(i))."""
        return plane_sums(x, self.rotary_dim, self.pairing)

    @property
    def attention(self) -> bool:
        """Whether this layer has softmax attention (False for the linear, convolution or
        state-space layers of a hybrid)."""
        return self.kind not in MIXER_KINDS

    @property
    def rotary(self) -> bool:
        """Whether this layer rotates anything (False for NoPE layers)."""
        return self.rotary_dim > 0

    def mask(self, n_pos: int, device: torch.device | None = None) -> Bool[Tensor, "q k"]:
        """Keys each query may attend to: causal, and within the sliding window or the query's own
        chunk where the layer has one."""
        q = torch.arange(n_pos, device=device)[:, None]
        k = torch.arange(n_pos, device=device)[None, :]
        ok = k <= q
        if self.window:
            ok &= (q - k) < self.window
        if self.chunk:
            ok &= (q // self.chunk) == (k // self.chunk)
        return ok

    @property
    def reach(self) -> int | None:
        """The most keys one query sees (its sliding window or chunk), None where it sees every
        earlier key."""
        return self.window or self.chunk

    def selects(self, n_pos: int) -> bool:
        """Whether some query of an ``n_pos``-token window may lose a key its mask allows to the
        model's own selection (more keys allowed than the ``select_keys`` it keeps): the mask is
        then the input's."""
        return self.select_keys is not None and n_pos > self.select_keys

    def require_static_mask(self, n_pos: int, what: str) -> None:
        """UnsupportedModelError when ``what`` would assume :meth:`mask` but this layer selects keys
        at ``n_pos``, or would assume a causal or sliding mask on ``n_pos``-token windows that this
        layer cuts into chunks."""
        if self.chunk and n_pos > self.chunk:
            raise UnsupportedModelError(
                f"layer {self.layer} attends in chunks of {self.chunk} tokens (chunked "
                f"attention: a query sees only the keys of its own chunk), which {what} does not "
                f"model on {n_pos}-token windows: use windows of at most {self.chunk} tokens "
                "(--n-ctx), where the mask is causal, or attention_decomposition, which applies "
                "it"
            )
        if self.selects(n_pos):
            raise UnsupportedModelError(
                f"layer {self.layer} keeps at most {self.select_keys} keys per query, picked "
                f"from the input by the model's indexer (sparse attention), so on {n_pos}-token "
                f"windows its mask depends on the text and {what} (which assumes the causal "
                f"mask) would be wrong: use windows of at most {self.select_keys} tokens "
                "(--n-ctx), where no key is dropped, or attention_decomposition, which reads "
                "the selection"
            )

    def probs(self, scores: Float[Tensor, "... k"], head_axis: int = 1) -> Float[Tensor, "... k"]:
        """The attention pattern this layer makes of pre-softmax ``scores`` (masked entries −inf).

        Applies the layer's logit soft-capping and its learned sinks (a per-head logit that takes
        part in the softmax and is then dropped), as the model does; ``head_axis`` is where the
        head index sits in ``scores``. Rows with no allowed key give zeros.
        """
        x = scores
        if self.softcap:
            x = torch.where(x == float("-inf"), x, torch.tanh(x / self.softcap) * self.softcap)
        if self.sinks is None:
            return torch.softmax(x, dim=-1).nan_to_num(0.0)
        shape = [1] * x.ndim
        shape[head_axis] = self.n_heads
        sink = _sink_logits(self.sinks, x.device, x.dtype).reshape(shape)
        sink = sink.expand(*x.shape[:-1], 1)
        return torch.softmax(torch.cat([x, sink], dim=-1), dim=-1)[..., :-1]

    def angles(self, positions: Tensor) -> Float[Tensor, "... n_planes"]:
        """Rotation angle of each plane at each position, m·θ_i (−m·θ_i where the model turns the
        other way)."""
        return (
            positions.to(torch.float64)[..., None]
            * self.inv_freq.to(positions.device, torch.float64)
            * self.direction
        )

    def rotate(
        self, x: Float[Tensor, "... pos head_dim"], positions: Tensor
    ) -> Float[Tensor, "... pos head_dim"]:
        """Apply this layer's rotation (and attention scaling) to head vectors at ``positions``.

        ``positions`` broadcasts against the position axis (the second-to-last axis of ``x``).
        Dimensions past ``rotary_dim`` pass through unchanged, as in partial-rotary models.
        """
        ang = self.angles(positions).to(x.dtype)
        return self.rotate_by(
            x, ang.cos() * self.attention_scaling, ang.sin() * self.attention_scaling
        )

    def rotate_by(
        self,
        x: Float[Tensor, "... pos head_dim"],
        cos: Float[Tensor, "... pos n_planes"],
        sin: Float[Tensor, "... pos n_planes"],
    ) -> Float[Tensor, "... pos head_dim"]:
        """Rotate each plane of ``x`` by given per-plane cos and sin (which broadcast against
        ``x``'s planes)."""
        p = self.split(x)
        a, b = p[..., 0], p[..., 1]
        rot = torch.stack([a * cos - b * sin, a * sin + b * cos], dim=-1)
        out = merge_planes(rot, self.pairing)
        if self.rotary_dim < self.head_dim:
            out = torch.cat([out, x[..., self.rotary_dim :]], dim=-1)
        return out

    def from_model(self, x: Float[Tensor, "... head_dim"]) -> Float[Tensor, "... head_dim"]:
        """Head vectors in the model's own layout (rotary dims at ``rotary_offset``) in ropelens's
        (rotary dims first)."""
        if not self.rotary_offset:
            return x
        o, r = self.rotary_offset, self.rotary_dim
        return torch.cat([x[..., o : o + r], x[..., :o], x[..., o + r :]], dim=-1)

    def pre_from_model(
        self, rot_in: Float[Tensor, "... rotary_dim"]
    ) -> Float[Tensor, "... rotary_dim"]:
        """The rotary slice as the model's rotation receives it, in the plane layout its output has
        (de-interleaved where the rotation reads adjacent pairs and writes halves)."""
        return (
            torch.cat([rot_in[..., 0::2], rot_in[..., 1::2]], dim=-1)
            if self.pre_interleaved
            else rot_in
        )

    @property
    def stopped_planes(self) -> Int[Tensor, " n"]:
        """Planes that do not rotate at all (θ = 0: the planes a p-RoPE or NoPE variant stops)."""
        return torch.nonzero(self.inv_freq == 0).flatten()

    @property
    def ablated_planes(self) -> list[int]:
        """Planes zeroed in at least one query head by a plane ablation in force, ascending."""
        return sorted({p for planes in self.ablated for p in planes})

    def to_dict(self) -> dict[str, Any]:
        """The layer as a JSON-ready dict; :meth:`from_dict` reads it."""
        d = asdict(self)
        d["inv_freq"] = self.inv_freq.tolist()
        if not self.ablated:  # written only under an ablation, so other specs read as before
            del d["ablated"]
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> LayerRope:
        """The layer :meth:`to_dict` wrote."""
        d = dict(d)
        d["inv_freq"] = torch.tensor(d["inv_freq"], dtype=torch.float32)
        if d.get("sinks") is not None:
            d["sinks"] = tuple(d["sinks"])
        d["axes"] = tuple(d.get("axes", ()))
        d["ablated"] = tuple(tuple(int(p) for p in head) for head in d.get("ablated", ()))
        if d.get("temperature") is not None:
            d["temperature"] = (float(d["temperature"][0]), int(d["temperature"][1]))
        return cls(**d)

    def same_rotation(self, other: LayerRope) -> bool:
        """True if both layers rotate identically (used to group layers by kind)."""
        return (
            self.rotary_dim == other.rotary_dim
            and self.pairing == other.pairing
            and self.attention_scaling == other.attention_scaling
            and self.direction == other.direction
            and self.pre_interleaved == other.pre_interleaved
            and self.axes == other.axes
            and self.temperature == other.temperature
            and torch.equal(self.inv_freq, other.inv_freq)
        )


@dataclass(frozen=True)
class RopeSpec:
    """The RoPE of every attention layer of a model, as the running model applies it.

    Read with :func:`ropelens.rope_spec` (never from the config alone: from the HF modules, and
    verified against the model's own attention before any measurement). One :class:`LayerRope` per
    layer, in order, so ``spec[i]`` is layer i; :meth:`summary` groups the layers by kind and
    :meth:`to_frame` lists every (layer, plane) with its frequency and wavelength.

    Attributes:
        model_name (str): The model's name as loaded (``model.cfg.model_name``).
        architecture (str): The HF architecture (``"LlamaForCausalLM"``).
        layers (tuple[LayerRope, ...]): Every layer, in order (``layers[i].layer == i``),
            including NoPE layers and a hybrid's layers without softmax attention.
        n_ctx (int): The model's trained context length, in tokens.
        valid_up_to (int | None): Where the frequencies change with the input's length (dynamic
            NTK, LongRoPE): the longest input, in tokens, they hold for; None where they hold for
            every length.
        length (int | None): The input length the frequencies were read at
            (``rope_spec(model, length=n)``), where they depend on it.
        interventions (tuple[dict[str, Any], ...]): The interventions in force when the spec was
            read, outermost first, as JSON-ready records (``{"intervention": "rope variant" |
            "plane ablation" | "replacement", ...}``): the layers then describe the model as it
            runs under them (a variant's frequencies, ablated planes).

    Raises:
        InputError: When ``layers`` is empty or out of order.

    Examples:
        >>> from ropelens import rope_spec
        >>> from ropelens.testing import tiny_model
        >>> spec = rope_spec(tiny_model("gptj"))
        >>> spec.model_name, spec.architecture, spec.n_layers, spec.n_ctx
        ('tiny-gptj', 'GPTJForCausalLM', 2, 256)
        >>> spec.kinds
        {'full': [0, 1]}
        >>> spec.summary()[["kind", "layers", "pairing", "rotary_dim", "n_planes"]]
           kind layers   pairing  rotary_dim  n_planes
        0  full    0-1  adjacent           8         4
        >>> frame = spec.to_frame()  # one row per (layer, plane)
        >>> len(frame), list(frame.columns)
        (8, ['layer', 'kind', 'plane', 'inv_freq', 'wavelength', 'turns_within_ctx'])
    """

    model_name: str
    architecture: str
    layers: tuple[LayerRope, ...]
    n_ctx: int
    # where the frequencies change with the input's length (dynamic NTK, LongRoPE): the longest
    # input, in tokens, they hold for (a reading at a length past the short reading's limit: that
    # length); None where they hold for every length
    valid_up_to: int | None = None
    # the input length the frequencies were read at (rope_spec(model, length=n)), where they depend
    # on it
    length: int | None = None
    # the interventions in force when the spec was read, outermost first, as JSON-ready records
    # (``{"intervention": "rope variant" | "plane ablation" | "replacement", ...}``): the layers
    # then describe the model as it runs under them (a variant's frequencies, ablated planes)
    interventions: tuple[dict[str, Any], ...] = ()

    def __post_init__(self) -> None:
        if not self.layers:
            raise InputError("a RopeSpec needs at least one layer")
        for i, layer in enumerate(self.layers):
            if layer.layer != i:
                raise InputError(f"layers must be in order: position {i} holds layer {layer.layer}")

    def __len__(self) -> int:
        """Layers in the model."""
        return len(self.layers)

    def __getitem__(self, layer: int) -> LayerRope:
        """Layer ``layer``'s :class:`LayerRope`."""
        return self.layers[layer]

    @property
    def n_layers(self) -> int:
        """Layers in the model (NoPE and mixer layers included)."""
        return len(self.layers)

    @property
    def kinds(self) -> dict[str, list[int]]:
        """Layer indices of each layer kind, e.g. {"sliding": [0..4, 6..], "full": [5, 11, 17]}."""
        out: dict[str, list[int]] = {}
        for layer in self.layers:
            out.setdefault(layer.kind, []).append(layer.layer)
        return out

    @property
    def rotary_kinds(self) -> dict[str, list[int]]:
        """:attr:`kinds` without NoPE layers: the kinds per-plane analyses and figures cover."""
        return {k: v for k, v in self.kinds.items() if self.layers[v[0]].rotary}

    @property
    def rotary_layers(self) -> list[int]:
        """Layers that rotate (NoPE layers left out)."""
        return [lr.layer for lr in self.layers if lr.rotary]

    @property
    def attention_layers(self) -> list[int]:
        """Layers with softmax attention (a hybrid's linear, convolution and state-space layers left
        out)."""
        return [lr.layer for lr in self.layers if lr.attention]

    def layer_indices(
        self,
        layers: Sequence[int] | None = None,
        kind: str | None = None,
        *,
        rotary_only: bool = True,
    ) -> list[int]:
        """Validate a layer selection (None = every rotary layer), optionally restricted to one
        layer kind.

        Per-plane analyses have nothing to measure in a NoPE layer, so with ``rotary_only`` asking
        for one is an error that names it, and None selects the rotary layers only. A layer without
        softmax attention (a hybrid's linear-attention layer) has nothing to measure either way.
        """
        if kind is not None and kind not in self.kinds:
            raise InputError(f"layer kind {kind!r} not in this model; it has {sorted(self.kinds)}")
        if kind in MIXER_KINDS:
            raise InputError(
                f"layer kind {kind!r} has no softmax attention (layers "
                f"{layer_ranges(self.kinds[kind])}): nothing to measure; the attention layers "
                f"are {layer_ranges(self.attention_layers) or 'none'}"
            )
        if (
            layers is None
            # a NoPE layer whose queries carry a position-dependent temperature is measured by no
            # one
        ):
            chosen = (
                self.rotary_layers
                if rotary_only
                else [L for L in self.attention_layers if not self.layers[L].query_scale]
            )
        else:
            chosen = []
            for idx in layers:
                if not isinstance(idx, int) or isinstance(idx, bool):
                    raise TypeError(f"layer indices must be ints, got {idx!r}")
                if not -self.n_layers <= idx < self.n_layers:
                    raise InputError(
                        f"layer {idx} out of range: the model has {self.n_layers} layers "
                        f"(0..{self.n_layers - 1})"
                    )
                chosen.append(idx % self.n_layers)
            # a layer named twice (0,0) or by two names (-1 and n−1) is measured once: a repeated
            # row would halve every share across layers and add a row of zeros
            chosen = list(dict.fromkeys(chosen))
            mixers = [self.layers[i] for i in chosen if not self.layers[i].attention]
            if mixers:
                lr = mixers[0]
                raise InputError(
                    f"layer {lr.layer} is a {lr.kind!r} layer ({lr.mixer}) with no softmax "
                    "attention: nothing to measure; the attention layers are "
                    f"{layer_ranges(self.attention_layers) or 'none'}"
                )
        tempered = (
            [self.layers[i] for i in chosen if self.layers[i].query_scale]
            if layers is not None
            else []
        )
        if tempered and not rotary_only:
            lr = tempered[0]
            raise UnsupportedModelError(
                f"layer {lr.layer} is a NoPE layer that scales each query at position m by "
                f"{lr.query_scale} before its score, so its scores are not q·k times one scale "
                "and ropelens does not measure it; the rotary layers are "
                f"{layer_ranges(self.rotary_layers) or 'none'}"
            )
        if rotary_only and layers is not None:
            nope = [i for i in chosen if not self.layers[i].rotary]
            if nope:
                raise InputError(
                    f"layers {nope} apply no RoPE (NoPE layers: no planes to measure); "
                    f"the rotary layers are {layer_ranges(self.rotary_layers) or 'none'}"
                )
        if kind is not None:
            chosen = [i for i in chosen if self.layers[i].kind == kind]
        return chosen

    def width_groups(
        self, layers: Sequence[int] | None = None
    ) -> dict[tuple[int, int, int, int], list[int]]:
        """Layers (default: the rotary ones) grouped by width: (head_dim, n_heads, n_kv_heads,
        n_planes) → layers.

        One group for most models; Gemma 4's wider global heads make a second.
        """
        out: dict[tuple[int, int, int, int], list[int]] = {}
        for L in self.rotary_layers if layers is None else layers:
            lr = self.layers[L]
            out.setdefault((lr.head_dim, lr.n_heads, lr.n_kv_heads, lr.n_planes), []).append(L)
        return out

    def present(self, layers: Sequence[int], *axes: str | int) -> Bool[Tensor, "layer ..."]:
        """``[layer, *axes]``: True at the entries each of ``layers`` has, where layers of different
        widths (Gemma 4's wider global heads) share one array.

        An axis named "head", "kv_head", "plane" or "dim" is as long as the largest n_heads,
        n_kv_heads, n_planes or head_dim among ``layers``, and each layer has its leading ones; an
        int axis is one every layer has in full (bands, distance bins, offsets). All True when the
        layers share one width.
        """
        bad = [ax for ax in axes if not isinstance(ax, int) and ax not in _WIDTH_AXES]
        if bad:
            raise InputError(
                f"unknown width axes {bad}: name one of {sorted(_WIDTH_AXES)}, or give a size"
            )

        def width(L, ax):
            return ax if isinstance(ax, int) else getattr(self.layers[L], _WIDTH_AXES[ax])

        sizes = [max(width(L, ax) for L in layers) if layers else 0 for ax in axes]
        out = torch.zeros(len(layers), *sizes, dtype=torch.bool)
        for i, L in enumerate(layers):
            out[(i, *(slice(0, width(L, ax)) for ax in axes))] = True
        return out

    def padded_zeros(
        self, layers: Sequence[int], *axes: str | int, dtype: torch.dtype = torch.float64
    ) -> Tensor:
        """Running sums laid out ``[layer, *axes]`` as :meth:`present`: 0 at a layer's own entries,
        NaN past them.

        The analyses that stack layers (band statistics, head scores, sinks, attention by distance,
        massive values, positional/symbolic scores, rotary offsets) keep their sums this way: each
        layer adds into its leading slice ``[i, :n_heads, ..., :n_planes]``, so every number read
        from the sums is NaN where the layer has no such head, plane or dimension, sums merge and
        save as before, and a layer's numbers are those it has when its width group is measured
        alone.
        """
        have = self.present(layers, *axes)
        return torch.zeros(have.shape, dtype=dtype).masked_fill_(~have, math.nan)

    def require_one_width(self, layers: Sequence[int], what: str) -> None:
        """InputError naming the width groups when ``layers`` differ in width (``what`` stacks them
        in one array).

        ropelens's own analyses take layers of different widths in one run (:meth:`padded_zeros`);
        this is for code that needs one ``[layer, head, ...]`` shape without padding.
        """
        groups = self.width_groups(layers)
        if len(groups) < 2:
            return
        per = "; ".join(
            f"head dim {d}, {h} heads / {kv} KV heads, {p} planes in layers {layer_ranges(ls)}"
            for (d, h, kv, p), ls in groups.items()
        )
        fix = " or ".join(f"layers={ls}" for ls in groups.values())
        raise InputError(
            f"{what} stacks layers of one width, and these differ ({per}): measure one width at "
            f"a time, {fix} (--layers)"
        )

    def to_frame(self) -> pd.DataFrame:
        """One row per (layer, plane): frequency, wavelength and whether it turns within n_ctx."""
        rows = []
        for lr in self.layers:
            wl = lr.wavelength.tolist()
            for i, (f, w) in enumerate(zip(lr.inv_freq.tolist(), wl)):
                rows.append(
                    {
                        "layer": lr.layer,
                        "kind": lr.kind,
                        "plane": i,
                        "inv_freq": f,
                        "wavelength": w,
                        "turns_within_ctx": w <= self.n_ctx,
                    }
                )
        return pd.DataFrame(rows)

    def _summary_groups(self) -> list[tuple[str, list[int]]]:
        """The layers of each kind; under an intervention, split where it changed some of them."""
        if not self.interventions:
            return list(self.kinds.items())
        groups = []
        for kind, idx in self.kinds.items():
            by: dict[tuple, list[int]] = {}
            for i in idx:
                lr = self.layers[i]
                key = (lr.rope_type, tuple(lr.inv_freq.tolist()), lr.attention_scaling, lr.ablated)
                by.setdefault(key, []).append(i)
            groups += [(kind, sub) for sub in by.values()]
        return groups

    def summary(self) -> pd.DataFrame:
        """One row per layer kind: base, rotary dim, pairing, wavelengths, planes beyond n_ctx."""
        rows = []
        for kind, idx in self._summary_groups():
            lr = self.layers[idx[0]]
            wl = lr.wavelength
            finite = wl[torch.isfinite(wl)]
            longest = float(wl.max()) if wl.numel() else math.nan
            rows.append(
                {
                    "kind": kind,
                    "layers": layer_ranges(idx),
                    "n_layers": len(idx),
                    "rope_type": lr.rope_type,
                    "base": lr.base,
                    "head_dim": lr.head_dim,
                    "rotary_dim": lr.rotary_dim,
                    "n_planes": lr.n_planes,
                    "pairing": lr.pairing,
                    "heads": lr.n_heads,
                    "kv_heads": lr.n_kv_heads,
                    "score_scale": lr.score_scale,
                    "attention_scaling": lr.attention_scaling,
                    "window": lr.window,
                    **({"chunk": lr.chunk} if any(x.chunk for x in self.layers) else {}),
                    "softcap": lr.softcap,
                    "sinks": lr.sinks is not None,
                    "mixer": lr.mixer,
                    "output_gate": lr.output_gate,
                    "shortest_wavelength": float(finite.min())
                    if finite.numel()
                    else math.nan
                    if not wl.numel()
                    else math.inf,
                    "longest_wavelength": longest,
                    "planes_beyond_ctx": int((wl > self.n_ctx).sum()),
                }
            )
            if self.interventions:  # what the interventions in force changed
                rows[-1].update(
                    stopped_planes=lr.stopped_planes.tolist(), ablated_planes=lr.ablated_planes
                )
            if self.valid_up_to is not None:  # frequencies that change with the input's length
                rows[-1].update(read_at_length=self.length, valid_up_to=self.valid_up_to)
            if any(
                x.shared_rotary_key for x in self.layers
            ):  # multi-head latent attention: where the planes sit
                rows[-1].update(
                    rotary_offset=lr.rotary_offset, shared_rotary_key=lr.shared_rotary_key
                )
            if any(
                x.select_keys for x in self.layers
            ):  # sparse attention: the keys each query keeps
                rows[-1].update(select_keys=lr.select_keys)
            if any(
                x.temperature for x in self.layers
            ):  # a query temperature after the rotation (Ministral 3)
                rows[-1].update(temperature=lr.temperature)
            if any(
                x.axes for x in self.layers
            ):  # multimodal RoPE: which planes each position axis turns
                rows[-1].update(mrope_axes=describe_axes(lr.axes))
        return pd.DataFrame(rows)

    def to_dict(self) -> dict[str, Any]:
        """The spec as a JSON-ready dict; :meth:`from_dict` reads it."""
        # the length fields only where the frequencies depend on the input's length, so that the
        # spec of a fixed-length model is written as it always was
        lengths = {"valid_up_to": self.valid_up_to, "length": self.length}
        return {
            "model_name": self.model_name,
            "architecture": self.architecture,
            "n_ctx": self.n_ctx,
            **{key: value for key, value in lengths.items() if value is not None},
            **({"interventions": list(self.interventions)} if self.interventions else {}),
            "layers": [lr.to_dict() for lr in self.layers],
        }

    def to_json(self) -> str:
        """The spec as indented JSON (:meth:`to_dict`'s, tensors as lists)."""
        return json.dumps(self.to_dict(), indent=2, default=_json_default)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> RopeSpec:
        """The spec :meth:`to_dict` wrote."""
        return cls(
            model_name=d["model_name"],
            architecture=d["architecture"],
            n_ctx=int(d["n_ctx"]),
            layers=tuple(LayerRope.from_dict(x) for x in d["layers"]),
            valid_up_to=d.get("valid_up_to"),
            length=d.get("length"),
            interventions=tuple(d.get("interventions", ())),
        )

    def _repr_html_(self) -> str:
        head = (
            f"<b>{self.model_name}</b> ({self.architecture}), {self.n_layers} layers, n_ctx "
            f"{self.n_ctx}"
        )
        if self.valid_up_to is not None:
            head += f", frequencies hold for inputs up to {self.valid_up_to:,} tokens"
        return head + self.summary().to_html(index=False)


def describe_axes(axes: Sequence[int]) -> str:
    """The planes of each M-RoPE axis in compact form, e.g. ``t 0-15; h 16-39; w 40-63`` ('' for 1-D
    RoPE)."""
    return "; ".join(
        f"{name} {layer_ranges([i for i, a in enumerate(axes) if a == k])}"
        for k, name in enumerate(MROPE_AXES)
        if k in axes
    )


def layer_ranges(idx: Sequence[int]) -> str:
    """Compact '0-4,6-10' form of a sorted index list."""
    parts: list[str] = []
    start = prev = idx[0]
    for i in list(idx[1:]) + [None]:
        if i is not None and i == prev + 1:
            prev = i
            continue
        parts.append(f"{start}" if start == prev else f"{start}-{prev}")
        if i is not None:
            start = prev = i
    return ",".join(parts)


def _json_default(o: Any) -> Any:
    if isinstance(o, Tensor):
        return o.tolist()
    if isinstance(o, float) and math.isinf(o):
        return str(o)
    raise TypeError(f"not JSON serialisable: {type(o).__name__}")


def expand_kv(
    k: Float[Tensor, "batch pos kv_head d"], rope: LayerRope
) -> Float[Tensor, "batch pos head d"]:
    """KV heads → query heads under grouped-query attention (query head h reads KV head h //
    group)."""
    return k.repeat_interleave(rope.group_size, dim=2) if rope.group_size > 1 else k
