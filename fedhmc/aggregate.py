"""Server-side averaging: θ̄ = Σ_c w_c θ^(c) (ALGORITHMS.md §3, step 3).

Pure tensor functions, shared by the in-process engine and the Flower ServerApp.
"""

from __future__ import annotations

import torch


def weighted_average(positions: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """Average client positions with weights renormalised to sum to one.

    Parameters
    ----------
    positions
        Client positions, (..., N, D): clients on the second-to-last dimension.
    weights
        Non-negative weights, (N,): the clients' n_c (or w_c). They are renormalised over
        the clients given, so averaging over the clients that replied in a round uses
        w_c / Σ_{replied} w_c.

    Returns
    -------
    torch.Tensor
        The average, (..., D), in the dtype of ``positions``.
    """
    w = weights.to(torch.float64)
    total = float(w.sum())
    if not total > 0.0:
        raise ValueError("weighted_average needs at least one positive weight")
    w = (w / total).to(positions.dtype)
    return torch.einsum("...nd,n->...d", positions, w)
