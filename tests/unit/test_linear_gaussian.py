"""Exact stationary laws of linear-Gaussian chains (fedhmc.analysis.linear_gaussian): the
equations hold, closed forms agree, and a simulated random-coefficient chain matches."""

from __future__ import annotations

import math

import numpy as np
import pytest

from fedhmc.analysis import linear_gaussian as lg


def _spd(rng: np.random.Generator, d: int, low: float = 0.5) -> np.ndarray:
    """A random symmetric positive definite matrix with eigenvalues ≥ ``low``."""
    B = rng.normal(size=(d, d))
    return B @ B.T / d + low * np.eye(d)


def _stable(rng: np.random.Generator, n: int, radius: float = 0.8) -> np.ndarray:
    """A random non-symmetric matrix scaled to the given spectral radius."""
    M = rng.normal(size=(n, n))
    return M * radius / np.max(np.abs(np.linalg.eigvals(M)))


def test_lyapunov_solution_satisfies_its_equation():
    rng = np.random.default_rng(0)
    n = 5
    M, c, L = _stable(rng, n), rng.normal(size=n), rng.normal(size=(n, n))
    m, V = lg.stationary_fixed(M, c, L @ L.T)
    np.testing.assert_allclose(m, M @ m + c, atol=1e-12)
    np.testing.assert_allclose(V, M @ V @ M.T + L @ L.T, atol=1e-10)
    np.testing.assert_array_equal(V, V.T)
    assert np.all(np.linalg.eigvalsh(V) > 0)


def test_ar1_closed_form():
    a, c, sigma = 0.7, 1.5, 0.4
    m, V = lg.stationary_fixed(a, c, sigma**2)
    assert m.shape == (1,) and V.shape == (1, 1)
    assert m[0] == pytest.approx(c / (1 - a), rel=1e-12)
    assert V[0, 0] == pytest.approx(sigma**2 / (1 - a**2), rel=1e-12)


def test_unstable_chain_is_refused():
    with pytest.raises(ValueError, match="spectral radius"):
        lg.stationary_fixed(np.diag([0.5, 1.0]), np.zeros(2), np.eye(2))
    # E[a²] = (1.5² + 0.5²)/2 = 1.25 ≥ 1: no stationary second moment. One expanding draw
    # alone is not enough to refuse: a ∈ {1.2, 0.5} has E[a²] = 0.845 and a stationary law.
    with pytest.raises(ValueError, match="spectral radius"):
        lg.stationary_random([(0.5, 1.5, 0.0, 1.0), (0.5, 0.5, 0.0, 1.0)])
    assert lg.stationary_random([(0.5, 1.2, 0.0, 1.0), (0.5, 0.5, 0.0, 1.0)])[1][0, 0] > 0
    with pytest.raises(ValueError, match="shapes"):
        lg.stationary_fixed(np.eye(2), np.zeros(3), np.eye(2))
    with pytest.raises(ValueError, match="probabilities"):
        lg.stationary_random([(0.5, 0.5, 0.0, 1.0)])


def test_ula_closed_form_matches_lyapunov():
    rng = np.random.default_rng(1)
    d = 4
    A, mu = _spd(rng, d), rng.normal(size=d)
    gamma = 0.5 / np.linalg.eigvalsh(A)[-1]
    mean, cov = lg.ula_gaussian(mu, A, gamma)
    m, V = lg.stationary_fixed(np.eye(d) - gamma * A, gamma * A @ mu, 2 * gamma * np.eye(d))
    np.testing.assert_allclose(mean, m, atol=1e-12)
    np.testing.assert_allclose(cov, V, rtol=1e-10, atol=1e-12)
    # ULA's bias: wider than the target's covariance A⁻¹.
    assert np.all(np.linalg.eigvalsh(cov - np.linalg.inv(A)) > 0)
    with pytest.raises(ValueError, match="ULA"):
        lg.ula_gaussian(mu, A, 2.5 / np.linalg.eigvalsh(A)[-1])


def test_random_with_one_draw_is_fixed():
    rng = np.random.default_rng(2)
    n = 3
    M, c, L = _stable(rng, n), rng.normal(size=n), rng.normal(size=(n, n))
    fixed = lg.stationary_fixed(M, c, L @ L.T)
    random = lg.stationary_random([(1.0, M, c, L @ L.T)])
    for a, b in zip(fixed, random, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-10, atol=1e-12)


def _clients(seed: int, n_clients: int, d: int):
    rng = np.random.default_rng(seed)
    mus = rng.normal(size=(n_clients, d))
    As = np.stack([_spd(rng, d) for _ in range(n_clients)])
    return mus, As


def test_qlsd_full_participation_is_ula_on_the_sum():
    mus, As = _clients(3, n_clients=4, d=3)
    A = As.sum(0)
    mu = np.linalg.solve(A, np.einsum("cij,cj->i", As, mus))
    gamma = 0.3 / np.linalg.eigvalsh(A)[-1]
    m, V = lg.qlsd_partial_gaussian(mus, As, gamma, clients_per_round=4)
    mean, cov = lg.ula_gaussian(mu, A, gamma)
    np.testing.assert_allclose(m, mean, atol=1e-10)
    np.testing.assert_allclose(V, cov, rtol=1e-9, atol=1e-12)


def test_qlsd_partial_participation_widens_the_law():
    mus, As = _clients(4, n_clients=4, d=2)
    gamma = 0.1 / np.linalg.eigvalsh(As.sum(0))[-1]
    _, full = lg.qlsd_partial_gaussian(mus, As, gamma, clients_per_round=4)
    for S in (1, 2, 3):
        _, part = lg.qlsd_partial_gaussian(mus, As, gamma, clients_per_round=S)
        assert np.trace(part) > np.trace(full)
    with pytest.raises(ValueError, match="clients_per_round"):
        lg.qlsd_partial_gaussian(mus, As, gamma, clients_per_round=5)


# A 1-d chain with random coefficients: each round, with probability ½ each,
# x′ = 0.5 x + 1 + 0.5 ξ  or  x′ = 0.9 x − 0.5 + 0.2 ξ.
DRAWS_1D = [(0.5, 0.5, 1.0, 0.25), (0.5, 0.9, -0.5, 0.04)]


def test_random_coefficients_match_simulation():
    m, V = lg.stationary_random(DRAWS_1D)
    m, V = m[0], V[0, 0]
    # Hand-derived: m = E[a] m + E[c]; E[x²] = E[a²] E[x²] + 2 E[a c] m + E[c²] + E[σ²].
    m_hand = 0.25 / (1 - 0.7)
    s_hand = (2 * (0.5 * 0.5 * 1.0 + 0.5 * 0.9 * -0.5) * m_hand + 0.625 + 0.145) / (1 - 0.53)
    assert m == pytest.approx(m_hand, rel=1e-12)
    assert V == pytest.approx(s_hand - m_hand**2, rel=1e-12)

    # Simulation: CHAINS independent chains, each started at 0, BURN rounds discarded,
    # then each chain's time averages of x and (x − m)² over KEEP rounds. The chains are
    # independent, so their averages are independent batch means: the spread of those
    # averages across chains gives an honest standard error whatever the autocorrelation
    # within a chain (KEEP ≫ the correlation time, about 1/(1 − 0.7) rounds, so each
    # average is close to normal). The burn-in leaves a bias of order 0.9^BURN ≈ 1e-23.
    # E[(x − m)²] = V exactly, so both checks are unbiased: 5 standard errors.
    CHAINS, BURN, KEEP = 2000, 500, 1000
    gen = np.random.default_rng(20240601)
    a = np.array([d[1] for d in DRAWS_1D])
    c = np.array([d[2] for d in DRAWS_1D])
    sigma = np.sqrt([d[3] for d in DRAWS_1D])
    x = np.zeros(CHAINS)
    sum_x, sum_sq = np.zeros(CHAINS), np.zeros(CHAINS)
    for t in range(BURN + KEEP):
        k = gen.integers(0, 2, size=CHAINS)
        x = a[k] * x + c[k] + sigma[k] * gen.standard_normal(CHAINS)
        if t >= BURN:
            sum_x += x
            sum_sq += (x - m) ** 2
    for averages, exact in ((sum_x / KEEP, m), (sum_sq / KEEP, V)):
        se = averages.std(ddof=1) / math.sqrt(CHAINS)
        assert abs(averages.mean() - exact) <= 5 * se, (averages.mean(), exact, se)
