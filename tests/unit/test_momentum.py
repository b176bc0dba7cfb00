"""Partially shared momentum: variances, averaged momentum and correlations (MC tolerances)."""

import math

import pytest
import torch

from fedhmc.core import rng
from fedhmc.core.momentum import draw_momentum

N_DRAWS = 200_000  # coordinates are independent draws
Z = 5.0


@pytest.mark.parametrize("rho", [0.0, 0.3, 1.0])
def test_momentum_law(rho):
    w = torch.tensor([0.5, 0.3, 0.15, 0.05], dtype=torch.float64)
    shared = rng.derive(1, torch.arange(1))
    private = rng.derive(2, torch.arange(4).view(1, 4))
    p = draw_momentum(shared, private, w, rho, iteration=3, dim=N_DRAWS, dtype=torch.float64)[0]
    var = p.var(dim=1)
    expected = rho + (1 - rho) / w
    # sd of a sample variance of n normal draws: σ² √(2/(n−1)).
    assert torch.all((var - expected).abs() < Z * expected * math.sqrt(2 / (N_DRAWS - 1)))
    avg = (w.view(4, 1) * p).sum(0)
    assert abs(float(avg.mean())) < Z / math.sqrt(N_DRAWS)
    assert abs(float(avg.var()) - 1.0) < Z * math.sqrt(2 / (N_DRAWS - 1))
    corr = torch.corrcoef(p)
    sd = torch.sqrt(expected)
    for i in range(4):
        for j in range(i + 1, 4):
            want = rho / float(sd[i] * sd[j])
            # sd of a sample correlation ≈ (1 − r²)/√n; add a floor for r = ±1.
            tol = Z * max(1 - want**2, 1e-6) / math.sqrt(N_DRAWS) + 1e-9
            assert abs(float(corr[i, j]) - want) < tol


def test_shared_part_is_identical_across_clients_and_iterations_differ():
    w = torch.full((3,), 1 / 3, dtype=torch.float64)
    shared = rng.derive(5, torch.arange(2))
    private = rng.derive(6, torch.arange(6).view(2, 3))
    p = draw_momentum(shared, private, w, 1.0, 0, 10)
    assert torch.equal(p[:, 0], p[:, 1]) and torch.equal(p[:, 0], p[:, 2])
    assert not torch.equal(p[0, 0], p[1, 0]), "chains have their own shared stream"
    assert not torch.equal(p, draw_momentum(shared, private, w, 1.0, 1, 10))
