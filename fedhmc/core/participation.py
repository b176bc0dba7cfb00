"""Partial client participation: which clients a round draws, and their coefficients.

Each communication round r the server draws one set of S clients (1 ≤ S ≤ N), the same for
every chain, from the run seed by a stream of its own (``STREAM_PARTICIPATION``), so the
engine and the Flower ServerApp draw the same set. Three schemes:

- ``weighted``: S draws *with replacement*, client c with probability w_c; the average is
  (1/S) Σ_k θ^(c_k), so a client drawn m times runs once and counts m/S.
- ``uniform``: S *distinct* clients uniformly at random; coefficients (N/S) w_c, which sum to
  one only in expectation (unless every w_c = 1/N).
- ``normalized``: drawn like ``uniform``; coefficients w_c / Σ_drawn w_c (what Flower's
  FedAvg does).

With S = N, ``uniform`` and ``normalized`` are full participation exactly (the draw is then
every client, in order, and nothing random is used).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from fedhmc.core import PARTICIPATION_SCHEMES, rng
from fedhmc.core.streams import STREAM_PARTICIPATION


@dataclass(frozen=True)
class Draw:
    """The clients of one round: distinct ids in increasing order (M ≤ S), and each one's
    coefficient in the average θ̄ = Σ a_c θ^(c) (float64)."""

    clients: torch.Tensor
    coefficients: torch.Tensor


def draw(seed: int, round_: int, weights: torch.Tensor, size: int, scheme: str) -> Draw:
    """The clients that round ``round_`` of run ``seed`` draws, and their coefficients.

    ``weights`` (N,) are the clients' w_c (or n_c: only their ratios matter); ``size`` is S.
    The draw is made on the CPU (a few numbers, and the same bits on every device) and
    returned on the device of ``weights``.
    """
    if scheme not in PARTICIPATION_SCHEMES:
        raise ValueError(f"participation scheme must be one of {', '.join(PARTICIPATION_SCHEMES)}")
    device = weights.device if isinstance(weights, torch.Tensor) else torch.device("cpu")
    w = torch.as_tensor(weights, dtype=torch.float64, device="cpu")
    d = _draw_cpu(seed, round_, w, size, scheme)
    return Draw(d.clients.to(device), d.coefficients.to(device))


def _draw_cpu(seed: int, round_: int, w: torch.Tensor, size: int, scheme: str) -> Draw:
    """`draw` with the weights (N,) on the CPU, in float64."""
    N = int(w.shape[0])
    if not 1 <= size <= N:
        raise ValueError(f"clients per round must be in 1 … {N}, got {size}")
    key = rng.derive(int(seed), STREAM_PARTICIPATION, int(round_)).view(1)
    total = float(w.sum())
    if scheme == "weighted":
        u = rng.uniform(key, 0, size)[0]
        cdf = torch.cumsum(w / total, 0)
        picks = torch.clamp(torch.searchsorted(cdf, u, right=True), max=N - 1)
        clients, counts = torch.unique(picks, sorted=True, return_counts=True)
        return Draw(clients, counts.to(torch.float64) / size)
    if size == N:
        clients = torch.arange(N, device=w.device)
    else:
        order = torch.argsort(rng.uniform(key, 0, N)[0])
        clients = torch.sort(order[:size]).values
    share = w[clients]
    if scheme == "uniform":
        return Draw(clients, (N / size) * (share / total))
    return Draw(clients, share / float(share.sum()))


def renormalized(coefficients: torch.Tensor, kept: torch.Tensor) -> torch.Tensor:
    """The coefficients of the clients ``kept`` (a boolean mask) when the others' updates
    did not arrive: rescaled so that the round's total stays what the scheme gave."""
    c = coefficients[kept]
    return c * (float(coefficients.sum()) / float(c.sum()))
