"""Counter-based random numbers keyed by (seed, round, chain, client, stream).

FA-HMC needs three properties from its random numbers that ``torch.Generator`` cannot give
at once:

1. every client (and every chain) has its own stream, derived from the run seed, the chain,
   the round and the client id, so that a Flower client that runs alone draws exactly the
   numbers that the batched engine draws for it;
2. the batched engine draws the streams of all clients and chains in one tensor operation,
   with no Python loop over clients;
3. the number drawn at a position does not depend on how many other numbers were drawn
   before it, so padding, batching and skipping a draw change nothing else.

A counter-based generator gives all three: the value at ``(key, counter)`` is a fixed hash
of the two (SplitMix64's finaliser, applied twice), computed element-wise with int64 tensor
arithmetic (multiplication wraps modulo 2**64, which is exactly the unsigned arithmetic the
hash needs). Keys are derived by the same hash, one component at a time. On the CPU the
hash runs on NumPy's uint64 views of the same memory, in place and with native logical
shifts (faster than the int64 tensor form; the bits are identical), and small key
derivations run on Python integers.

Counters are 64-bit: the high bits hold a caller-chosen index (the local iteration, the
gradient evaluation), the low 32 bits the element index within a draw, and the lowest bit
picks one of the two uniforms that Box-Muller consumes per normal.
"""

from __future__ import annotations

import math

import numpy as np
import torch

_MASK64 = (1 << 64) - 1
_GOLDEN = 0x9E3779B97F4A7C15
_M1 = 0xBF58476D1CE4E5B9
_M2 = 0x94D049BB133111EB


_TENSOR_PATH_ON_CPU = False
"""Tests set this to run the device path (int64 tensor arithmetic) on the CPU."""


def _on_host(t: torch.Tensor) -> bool:
    """Whether ``t``'s hashing runs in NumPy (CPU tensors) rather than in tensor arithmetic."""
    return t.device.type == "cpu" and not _TENSOR_PATH_ON_CPU


def _signed(x: int) -> int:
    """Two's-complement int64 view of an unsigned 64-bit integer."""
    x &= _MASK64
    return x - (1 << 64) if x >= (1 << 63) else x


_GOLDEN_S, _M1_S, _M2_S = _signed(_GOLDEN), _signed(_M1), _signed(_M2)


# Counter layout: hi index in bits 33..62, element in bits 1..32, Box-Muller half in bit 0.
MAX_HI = 1 << 29
MAX_ELEMENTS = 1 << 32


def _shr(z: torch.Tensor, s: int) -> torch.Tensor:
    """Logical (unsigned) right shift of int64 values."""
    return (z >> s) & ((1 << (64 - s)) - 1)


def _mix(z: torch.Tensor) -> torch.Tensor:
    """SplitMix64 finaliser, element-wise on int64 tensors (wrap-around arithmetic)."""
    z = (z ^ _shr(z, 30)) * _M1_S
    z = (z ^ _shr(z, 27)) * _M2_S
    return z ^ _shr(z, 31)


def mix_int(z: int) -> int:
    """SplitMix64 finaliser on a Python int (reference implementation, unsigned)."""
    z &= _MASK64
    z = ((z ^ (z >> 30)) * _M1) & _MASK64
    z = ((z ^ (z >> 27)) * _M2) & _MASK64
    return z ^ (z >> 31)


def derive(key: int | torch.Tensor, *parts: int | torch.Tensor) -> torch.Tensor:
    """Fold integers (or int64 tensors, broadcast) into a key: ``key = mix(key ^ mix(part))``.

    Parameters
    ----------
    key
        A seed (any Python int, reduced modulo 2**64) or an int64 tensor of keys.
    *parts
        Components to fold in, in order: Python ints or int64 tensors that broadcast
        against ``key``.

    Returns
    -------
    torch.Tensor
        int64 keys with the broadcast shape of all inputs.
    """
    if not isinstance(key, torch.Tensor) and not any(isinstance(p, torch.Tensor) for p in parts):
        # Python ints only: the same hash in plain integers (a few microseconds instead of a
        # dozen tensor operations per part). A 0-d CPU key combines with keys on any device.
        return torch.tensor(_signed(_derive_ints(key, parts)), dtype=torch.int64, device="cpu")
    tensors = [x for x in (key, *parts) if isinstance(x, torch.Tensor)]
    if all(_on_host(t) for t in tensors):
        shape = torch.broadcast_shapes(*(t.shape for t in tensors))
        k = _u64_any(key)
        for part in parts:
            k = _bits_np(k, _u64_any(part))
        if k.shape != tuple(shape):
            k = np.broadcast_to(k, shape).copy() if shape else k.reshape(())
        return torch.from_numpy(k.view(np.int64))
    return _derive_torch(key, parts, next(t.device for t in tensors if not _on_host(t)))


def _derive_torch(key, parts, device: torch.device) -> torch.Tensor:
    """`derive` in int64 tensor arithmetic on ``device``. Python-int components stay
    Python ints, hashed on the host and met as scalar arguments: no host-to-device copy,
    so that the derivation can be captured in a CUDA graph."""
    k = key.to(device) if isinstance(key, torch.Tensor) else int(key) & _MASK64
    for part in parts:
        if isinstance(part, torch.Tensor):
            m = _mix(part.to(device, torch.int64) + _GOLDEN_S)
        else:
            m = mix_int((int(part) + _GOLDEN) & _MASK64)
        if isinstance(k, int) and isinstance(m, int):
            k = mix_int(k ^ m)
        elif isinstance(k, int):
            k = _mix(m ^ _signed(k))
        else:
            k = _mix(k ^ (m if isinstance(m, torch.Tensor) else _signed(m)))
    if isinstance(k, int):  # no tensor among the parts (a tensor key is never an int)
        k = torch.full((), _signed(k), dtype=torch.int64, device=device)
    return k


def derive_int(key: int, *parts: int) -> int:
    """[`derive`][fedhmc.core.rng.derive] for Python ints; returns a non-negative int below 2**63.

    The result fits an int64 (and Flower's ConfigRecord), so it can travel as a seed.
    """
    return _derive_ints(key, parts) & ((1 << 63) - 1)


def _derive_ints(key: int, parts) -> int:
    """[`derive`][fedhmc.core.rng.derive] on Python ints, as an unsigned 64-bit int."""
    k = key & _MASK64
    for part in parts:
        k = mix_int(k ^ mix_int((int(part) + _GOLDEN) & _MASK64))
    return k


def _bits(keys: torch.Tensor, counters: torch.Tensor) -> torch.Tensor:
    """Hash of (key, counter): ``mix(key ^ mix(counter + golden))``, broadcast (off the
    CPU; the CPU paths hash in NumPy, `_keyed_np`)."""
    return _mix(keys ^ _mix(counters + _GOLDEN_S))


def _u64(x: torch.Tensor) -> np.ndarray:
    """A CPU int64 tensor's memory as NumPy uint64 (no copy)."""
    return x.detach().numpy().view(np.uint64)


def _u64_any(x: int | torch.Tensor) -> np.ndarray:
    """A Python int or an int64 tensor as a uint64 array of at least one dimension (NumPy
    warns on the overflow of 0-d scalars, which the hash relies on)."""
    if isinstance(x, torch.Tensor):
        return np.atleast_1d(_u64(x.to(torch.int64)))
    return np.array([int(x) & _MASK64], dtype=np.uint64)


_NP_GOLDEN, _NP_M1, _NP_M2 = np.uint64(_GOLDEN), np.uint64(_M1), np.uint64(_M2)
_NP_SHIFTS = tuple(np.uint64(s) for s in (30, 27, 31))


def _mix_np(z: np.ndarray) -> np.ndarray:
    """`_mix` in place on a uint64 array (which it returns)."""
    s30, s27, s31 = _NP_SHIFTS
    z ^= z >> s30
    z *= _NP_M1
    z ^= z >> s27
    z *= _NP_M2
    z ^= z >> s31
    return z


def _bits_np(keys: np.ndarray, counters: np.ndarray) -> np.ndarray:
    """`_bits` on uint64 arrays: a new array of the broadcast shape."""
    inner = _mix_np(counters + _NP_GOLDEN)
    return _mix_np(np.bitwise_xor(keys, inner))


def _check_hi(hi: int) -> None:
    if not 0 <= hi < MAX_HI:
        raise ValueError(f"counter index {hi} outside [0, {MAX_HI})")


def _counters(hi: int, n: int, device: torch.device) -> torch.Tensor:
    _check_hi(hi)
    if n > MAX_ELEMENTS:
        raise ValueError(f"cannot draw {n} numbers at once (at most {MAX_ELEMENTS})")
    return (hi << 33) | (torch.arange(n, dtype=torch.int64, device=device) << 1)


_MIXED: dict[tuple, np.ndarray] = {}
_MIXED_BUDGET = 32 << 20  # bytes of cached counter hashes


def _mixed_counters(hi: int, count: int, n: int, odd: int = 0) -> np.ndarray:
    """``mix(counter + golden)`` of draws ``hi … hi+count−1`` (elements 0 … n−1, Box-Muller
    half ``odd``), (count, n): the half of the hash that does not depend on the key, the
    same in every round, so kept (read-only) up to `_MIXED_BUDGET` bytes."""
    key = (hi, count, n, odd)
    got = _MIXED.get(key)
    if got is None:
        _check_hi(hi + count - 1)
        if n > MAX_ELEMENTS:
            raise ValueError(f"cannot draw {n} numbers at once (at most {MAX_ELEMENTS})")
        rows = (np.arange(hi, hi + count, dtype=np.uint64) << np.uint64(33)).reshape(-1, 1)
        cols = (np.arange(n, dtype=np.uint64) << np.uint64(1)) | np.uint64(odd)
        got = _mix_np((rows | cols) + _NP_GOLDEN)
        if got.nbytes <= _MIXED_BUDGET // 8:
            while _MIXED and sum(a.nbytes for a in _MIXED.values()) + got.nbytes > _MIXED_BUDGET:
                del _MIXED[next(iter(_MIXED))]  # the oldest first
            got.flags.writeable = False
            _MIXED[key] = got
    return got


def _keyed_np(keys: torch.Tensor, mixed: np.ndarray) -> np.ndarray:
    """``mix(key ^ mixed)`` for every key: keys (...) against mixed counters (...,) → new
    uint64 array of shape keys.shape + mixed.shape."""
    k = _u64(keys).reshape(keys.shape + (1,) * mixed.ndim)
    return _mix_np(np.bitwise_xor(k, mixed))


def uniform(keys: torch.Tensor, hi: int, n: int) -> torch.Tensor:
    """Uniform(0, 1) float64 draws, shape ``keys.shape + (n,)``, 53 random bits each.

    Element ``i`` of the draw with index ``hi`` under a given key is the same number
    whatever ``n`` is, so a padded draw agrees with an unpadded one on the common prefix.
    """
    if _on_host(keys):
        bits = _keyed_np(keys, _mixed_counters(hi, 1, n)[0])
        return _to_unit(torch.from_numpy(bits.view(np.int64)))
    return _to_unit(_bits(keys.unsqueeze(-1), _counters(hi, n, keys.device)))


def uniform_block(keys: torch.Tensor, hi: int, count: int, n: int) -> torch.Tensor:
    """``count`` consecutive [`uniform`][fedhmc.core.rng.uniform] draws at once, shape ``keys.shape
    + (count, n)``.

    Slice ``j`` equals ``uniform(keys, hi + j, n)`` exactly.
    """
    _check_hi(hi + count - 1)
    if _on_host(keys):
        bits = _keyed_np(keys, _mixed_counters(hi, count, n))
        return _to_unit(torch.from_numpy(bits.view(np.int64)))
    first = _counters(hi, n, keys.device)
    steps = torch.arange(count, dtype=torch.int64, device=keys.device) << 33
    counters = first + steps.unsqueeze(1)  # (count, n): row j is _counters(hi + j, n)
    return _to_unit(_bits(keys.unsqueeze(-1).unsqueeze(-1), counters))


def _to_unit(bits: torch.Tensor) -> torch.Tensor:
    """The top 53 bits of each hash as a float64 in [0, 1)."""
    if _on_host(bits):
        top = torch.from_numpy((_u64(bits) >> np.uint64(11)).astype(np.float64))
        return top.mul_(1.0 / (1 << 53))
    return _shr(bits, 11).to(torch.float64) * (1.0 / (1 << 53))


def normal(keys: torch.Tensor, hi: int, n: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Standard normal draws by Box-Muller, shape ``keys.shape + (n,)``.

    Element ``i`` uses the two uniforms at counters ``2i`` and ``2i + 1`` of draw ``hi``.
    """
    if _on_host(keys):  # the integer work in NumPy: the same 53-bit integers
        top = np.uint64(11)
        b1 = _keyed_np(keys, _mixed_counters(hi, 1, n, 0)[0])
        b2 = _keyed_np(keys, _mixed_counters(hi, 1, n, 1)[0])
        u1 = torch.from_numpy((b1 >> top).astype(np.float64))
        u2 = torch.from_numpy((b2 >> top).astype(np.float64))
    else:
        c = _counters(hi, n, keys.device)
        k = keys.unsqueeze(-1)
        u1 = _shr(_bits(k, c), 11).to(torch.float64)
        u2 = _shr(_bits(k, c | 1), 11).to(torch.float64)
    # 1 - u keeps the logarithm's argument in (0, 1].
    r = torch.sqrt(-2.0 * torch.log1p(-u1 * (1.0 / (1 << 53))))
    z = r * torch.cos((2.0 * math.pi / (1 << 53)) * u2)
    return z.to(dtype)
