"""Stochastic quantization of client messages (QSGD, Alistarh et al. 2017), as QLSD uses it.

A client that sends a vector x quantizes it with s levels: it sends the norm ‖x‖₂ once, and
for every coordinate its sign and a level ζᵢ in {0, 1, …, s}. The receiver rebuilds

    C_s(x)ᵢ = ‖x‖₂ · sign(xᵢ) · ζᵢ / s,

where ζᵢ is ⌊s|xᵢ|/‖x‖₂⌋ plus one with probability equal to the remainder (the fractional
part of s|xᵢ|/‖x‖₂), drawn with the client's own randomness. The quantizer is unbiased,
E[C_s(x)] = x, and its error is bounded: E‖C_s(x) − x‖² ≤ ω_s ‖x‖² with
ω_s = min(d/s², √d/s) (see [`omega`][fedhmc.core.quantize.omega]). The zero vector is sent
as zero, and s = ∞ sends x as it is.

Everything here is tensor arithmetic along the last dimension (any leading batch
dimensions, e.g. (samples, clients, coordinates)), with no transfer to the host and no
Python decision on tensor values, so that it can be captured in a CUDA graph.
"""

from __future__ import annotations

import math

import torch

from fedhmc.core import rng


def _check_levels(levels: float) -> None:
    """Refuse anything but a positive whole number of levels or infinity."""
    try:
        s = float(levels)
    except (TypeError, ValueError):
        s = math.nan
    if s == math.inf:
        return
    if not (math.isfinite(s) and s >= 1 and s == int(s)):
        raise ValueError(f"quantization levels must be a positive integer or inf, got {levels!r}")


def omega(levels: float, dim: int) -> float:
    """The quantizer's relative error bound ω_s = min(d/s², √d/s).

    For every x of ``dim`` coordinates, E‖C_s(x) − x‖² ≤ ω_s ‖x‖² when x is quantized with
    ``levels`` levels. It is 0 for ``levels = inf`` (nothing is quantized).

    Parameters
    ----------
    levels
        The number of levels s (a positive integer), or ``math.inf``.
    dim
        The number of coordinates d of the quantized vector.
    """
    _check_levels(levels)
    if dim < 0:
        raise ValueError(f"dimension must be non-negative, got {dim}")
    if levels == math.inf:
        return 0.0
    s = float(levels)
    return min(dim / s**2, math.sqrt(dim) / s)


def quantize(x: torch.Tensor, levels: float, uniforms: torch.Tensor) -> torch.Tensor:
    """Quantize every vector along the last dimension of ``x`` with ``levels`` levels.

    Each row x (the last dimension; leading dimensions are a batch) becomes
    ‖x‖₂ · sign(xᵢ) · ζᵢ / s with ζᵢ = ⌊s|xᵢ|/‖x‖₂⌋ + 1{uᵢ < remainder}: rounded down or up
    to a neighbouring level, up with probability equal to the remainder, so that the result
    equals x on average. Rows that are zero stay zero.

    Parameters
    ----------
    x
        The vectors to quantize, shape (..., d), floating point.
    levels
        The number of levels s (a positive integer), or ``math.inf`` to return ``x``
        itself (not a copy).
    uniforms
        Uniform numbers in [0, 1), one per entry of ``x`` (same shape), which decide the
        rounding. Any floating dtype; the comparison is made in the wider of the two.

    Returns
    -------
    torch.Tensor
        The quantized (and already decoded) vectors, in ``x``'s shape and dtype.
    """
    _check_levels(levels)
    if levels == math.inf:
        return x
    if uniforms.shape != x.shape:
        raise ValueError(f"uniforms have shape {tuple(uniforms.shape)}, x has {tuple(x.shape)}")
    s = float(levels)
    # Half-precision inputs are worked in float32, so that the levels are exact integers.
    work = x if x.dtype in (torch.float32, torch.float64) else x.float()
    norm = torch.linalg.vector_norm(work, dim=-1, keepdim=True)
    safe = torch.where(norm > 0, norm, torch.ones_like(norm))
    scaled = work.abs() * (s / safe)
    low = torch.floor(scaled)
    up = (uniforms < (scaled - low)).to(work.dtype)
    # Rounding can put s|xᵢ|/‖x‖ a hair above s; the top level is s.
    level = torch.clamp(low + up, max=s)
    # A zero row has sign 0 everywhere, so its result is 0 without a branch.
    return (torch.sign(work) * level * (norm / s)).to(x.dtype)


def quantize_keyed(
    x: torch.Tensor, levels: float, keys: torch.Tensor, index: int = 0
) -> torch.Tensor:
    """[`quantize`][fedhmc.core.quantize.quantize] with its uniforms drawn from keys.

    Row r of ``x`` is rounded with the uniforms
    [`rng.uniform`][fedhmc.core.rng.uniform]``(keys[r], index, d)``: counter-based numbers
    that depend only on the key, the draw index and the coordinate, so every backend (the
    batched engine, a lone Flower client, CPU or GPU) rounds the same row the same way.

    Parameters
    ----------
    x
        The vectors to quantize, shape (..., d).
    levels
        The number of levels s (a positive integer), or ``math.inf`` (``x`` is returned and
        nothing is drawn).
    keys
        int64 keys, one per row: shape ``x.shape[:-1]`` (as
        [`rng.derive`][fedhmc.core.rng.derive] returns them), on ``x``'s device.
    index
        The draw index under each key (the counter's high part), so that several
        quantizations under one key draw different numbers.
    """
    _check_levels(levels)
    if levels == math.inf:
        return x
    if tuple(keys.shape) != tuple(x.shape[:-1]):
        raise ValueError(
            f"keys have shape {tuple(keys.shape)}, expected x.shape[:-1] = {tuple(x.shape[:-1])}"
        )
    u = rng.uniform(keys, index, x.shape[-1])
    if u.device != x.device:
        u = u.to(x.device)
    return quantize(x, levels, u)


def bits(levels: float, dim: int, float_bits: int) -> int:
    """How many bits one quantized vector of ``dim`` coordinates takes to send.

    The encoding is of fixed length: the norm ‖x‖₂ as one float (``float_bits`` bits), then
    for every coordinate one sign bit and its level ζᵢ ∈ {0, …, s} as a plain binary number
    of ⌈log₂(s + 1)⌉ bits. That is ``float_bits + dim · (1 + ⌈log₂(s + 1)⌉)``. (A variable-
    length code, such as QSGD's Elias coding, could send fewer bits for sparse levels; this
    count does not assume one.) With ``levels = inf`` the vector is sent as it is:
    ``dim · float_bits``.

    Parameters
    ----------
    levels
        The number of levels s (a positive integer), or ``math.inf``.
    dim
        The number of coordinates.
    float_bits
        The width of one float on the wire (32 for float32).
    """
    _check_levels(levels)
    if dim < 0 or float_bits < 1:
        raise ValueError(f"need dim >= 0 and float_bits >= 1, got {dim} and {float_bits}")
    if levels == math.inf:
        return dim * float_bits
    level_bits = int(levels).bit_length()  # = ⌈log₂(s + 1)⌉ for a whole s ≥ 1
    return float_bits + dim * (1 + level_bits)
