"""Partially shared momentum of FA-HMC (Liang et al. 2024, Algorithm 3, step 1).

At local iteration t every client c draws

    p_t^(c) = √ρ · ξ_t + √(1 − ρ) · ξ_t^(c) / √w_c,

where ξ_t ~ N(0, I) is shared by all clients (it comes from a seed the server sends, so it
costs no communication) and ξ_t^(c) ~ N(0, I) is private to client c. The 1/√w_c scaling
makes the averaged momentum Σ_c w_c p^(c) standard normal for every ρ ∈ [0, 1]:
its variance is ρ + (1 − ρ) Σ_c w_c² / w_c = 1. The per-client variance is
ρ + (1 − ρ)/w_c and the correlation between two clients c ≠ c′ is
ρ / √((ρ + (1 − ρ)/w_c)(ρ + (1 − ρ)/w_c′)).
"""

from __future__ import annotations

import math

import torch

from fedhmc.core import rng


def draw_momentum(
    shared_keys: torch.Tensor,
    private_keys: torch.Tensor,
    weights: torch.Tensor,
    rho: float,
    iteration: int,
    dim: int,
    dtype: torch.dtype = torch.float32,
) -> torch.Tensor:
    """Momentum of every (chain, client) for one local iteration.

    Parameters
    ----------
    shared_keys
        int64 keys of the shared stream, shape (S,): one per chain, the same on every client.
    private_keys
        int64 keys of the clients' private momentum streams, shape (S, N).
    weights
        Client weights w_c = n_c / n, shape (N,).
    rho
        Correlation ρ ∈ [0, 1]; ρ = 1 gives every client the same momentum.
    iteration
        Local iteration index t within the round (the counter of the draw).
    dim
        Dimension d of the position.

    Returns
    -------
    torch.Tensor
        Momenta, shape (S, N, d).
    """
    S, N = private_keys.shape
    p = torch.zeros(S, N, dim, dtype=dtype, device=private_keys.device)
    if rho > 0.0:
        xi = rng.normal(shared_keys, iteration, dim, dtype)
        p.add_(xi.unsqueeze(1), alpha=math.sqrt(rho))
    if rho < 1.0:
        xi_c = rng.normal(private_keys, iteration, dim, dtype)
        w = weights.to(p.device, torch.float64)
        scale = torch.sqrt((1.0 - rho) / w).to(dtype)
        p.addcmul_(xi_c, scale.view(1, N, 1))
    return p
