"""What the samplers do to a gradient before using it: a control variate, injected noise
and the posterior temperature. One implementation, used by FA-HMC, stale and asynchronous
SG-MCMC and the Flower workers, so every path draws the same noise and scales the same way.

The in-place forms (``inplace=True``) are what the batched FA-HMC engine uses on its own
buffers; the out-of-place forms leave their input alone. The two are kept exactly as each
path has always computed them (``g.add_(x, alpha=σ)`` and ``g + σ x`` may differ in the
last bit), so results stay bit for bit what they were.
"""

from __future__ import annotations

import torch

from fedhmc.core import rng
from fedhmc.core.streams import STREAM_GRAD_NOISE


def corrected(g: torch.Tensor, correction: torch.Tensor | None, inplace: bool = False):
    """g + c: a control variate c added to a stochastic gradient (debiased FA-HMC's
    c = ∇f(θ_a) − ∇f^(c)(θ_a)). None: g itself."""
    if correction is None:
        return g
    return g.add_(correction) if inplace else g + correction


def noise_keys(keys: torch.Tensor) -> torch.Tensor:
    """The gradient-noise keys of ``keys`` (one per chain, client, …)."""
    return rng.derive(keys, STREAM_GRAD_NOISE)


def add_noise(
    g: torch.Tensor, keys: torch.Tensor, counter: int, sigma: float, inplace: bool = False
) -> torch.Tensor:
    """g + σ N(0, I), the noise drawn from the noise ``keys`` (`noise_keys`) at
    ``counter``; its shape is ``keys.shape + (D,)``, reshaped to g's. σ = 0: g itself."""
    if sigma <= 0.0:
        return g
    noise = rng.normal(keys, int(counter), g.shape[-1], g.dtype).reshape(g.shape)
    if inplace:
        return g.add_(noise, alpha=sigma)
    return g + sigma * noise


def tempered(g: torch.Tensor, temperature: float, inplace: bool = False) -> torch.Tensor:
    """∇f / τ: the gradient of the tempered target exp(−f/τ). τ = 1: g itself."""
    if temperature == 1.0:
        return g
    inv = 1.0 / temperature
    return g.mul_(inv) if inplace else g * inv
