"""Partial participation against an independent reference of the three schemes.

On the heterogeneous Gaussian with exact gradients a round of FA-HMC is linear in θ̄ given
the round's set of clients: client c's T trajectories map θ̄ − μ_c to
M11^T (θ̄ − μ_c) + Σ_t M11^(T−1−t) M12 p_t, with M = L^K the leapfrog's matrix on (x, p) for
the curvature a_c = 1/s_c², and p_t = √ρ ξ_t + √(1−ρ) ξ_{c,t}/√w_c. So θ̄' = A θ̄ + b + noise
with (A, b, noise variance q) a function of the set and its coefficients, drawn afresh each
round. The pooled stationary law follows in closed form from E[A], E[A²], E[b], E[Ab], E[b²]
and E[q] over the sets, which this file enumerates (every S-subset, or every ordered
S-tuple for draws with replacement). Nothing here uses fedhmc's sampler or its draws.

The engine's θ̄ is pooled over rounds and chains; its Monte Carlo error comes from batch
means over rounds (the chains of a round share its set of clients, so they are not
independent).
"""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
import torch

from fedhmc.algorithms import fahmc
from fedhmc.models.targets import GaussianTarget, hetero_gaussian

Z = 5.0
N, T, K, ETA = 6, 4, 5, 0.05
WEIGHTS = [0.3, 0.1, 0.1, 0.2, 0.2, 0.1]  # unequal: the three schemes differ


def make_target(dim: int = 1):
    """Three clients at N(20, 1) and three at N(1, 2), of unequal sizes."""
    means, variances = [20.0] * 3 + [1.0] * 3, [1.0] * 3 + [2.0] * 3
    return GaussianTarget(means, variances, dim, weights=WEIGHTS, dtype=torch.float64)


def leapfrog_matrix(a: float, eta: float, K: int) -> np.ndarray:
    half = np.array([[1.0, 0.0], [-eta * a / 2, 1.0]])
    drift = np.array([[1.0, eta], [0.0, 1.0]])
    return np.linalg.matrix_power(half @ drift @ half, K)


def client_terms(var):
    """Per client: M11^T, and the per-iteration noise gains h_t."""
    out = []
    for v in var:
        M = leapfrog_matrix(1.0 / v, ETA, K)
        h = [M[0, 0] ** (T - 1 - t) * M[0, 1] for t in range(T)]
        out.append((M[0, 0] ** T, np.array(h)))
    return out


def sets(scheme: str, S: int, w: np.ndarray):
    """(probability, {client: coefficient}) of every set the scheme can draw."""
    if scheme == "weighted":
        p = w / w.sum()
        for tup in itertools.product(range(N), repeat=S):
            coef: dict[int, float] = {}
            for c in tup:
                coef[c] = coef.get(c, 0.0) + 1.0 / S
            yield float(np.prod(p[list(tup)])), coef
        return
    combos = list(itertools.combinations(range(N), S))
    for combo in combos:
        share = w[list(combo)]
        if scheme == "uniform":
            coef = {c: (N / S) * w[c] / w.sum() for c in combo}
        else:
            coef = {c: w[c] / share.sum() for c in combo}
        yield 1.0 / len(combos), coef


def reference_law(scheme: str, S: int, rho: float):
    """Exact stationary mean and variance of one coordinate of θ̄."""
    target = make_target()
    mu, var = target.means.numpy(), target.variances.numpy()
    w = target.weights.numpy()
    terms = client_terms(var)
    EA = EA2 = Eb = EAb = Eb2 = Eq = 0.0
    for prob, coef in sets(scheme, S, w):
        A = sum(a * terms[c][0] for c, a in coef.items())
        b = sum(a * mu[c] * (1 - terms[c][0]) for c, a in coef.items())
        shared = sum(a * terms[c][1] for c, a in coef.items())  # (T,)
        own = sum(a * a * terms[c][1] ** 2 / w[c] for c, a in coef.items())
        q = float(rho * (shared**2).sum() + (1 - rho) * own.sum())
        EA += prob * A
        EA2 += prob * A * A
        Eb += prob * b
        EAb += prob * A * b
        Eb2 += prob * b * b
        Eq += prob * q
    m = Eb / (1 - EA)
    s2 = (2 * EAb * m + Eb2 + Eq) / (1 - EA2)
    return m, s2 - m * m


def engine_pooled(scheme: str, S: int, rho: float, chains=200, burn=40, rounds=400, seed=3):
    target = make_target()
    s = fahmc.Settings(ETA, K, T, rho=rho, clients_per_round=S, participation=scheme)
    state = fahmc.init(torch.zeros(chains, 1, dtype=torch.float64), s)
    m1, m2 = [], []
    for r in range(burn + rounds):
        state, _ = fahmc.step(seed, state, target, s)
        if r >= burn:
            x = state.position[:, 0]
            m1.append(float(x.mean()))
            m2.append(float(x.square().mean()))
    return np.array(m1), np.array(m2)


def pooled_var(m1: np.ndarray, m2: np.ndarray) -> tuple[float, float]:
    """The pooled variance and its standard error: each round's mean squared deviation from
    the pooled mean, averaged, with batch means (the errors of E[θ̄²] and E[θ̄]² are too
    correlated to be added)."""
    mu = m1.mean()
    dev = m2 - 2 * mu * m1 + mu * mu
    return float(dev.mean()), batch_se(dev)


def batch_se(values: np.ndarray, batches: int = 20) -> float:
    b = values[: len(values) // batches * batches].reshape(batches, -1).mean(1)
    return float(b.std(ddof=1) / math.sqrt(batches))


@pytest.mark.parametrize("rho", [0.0, 1.0])
@pytest.mark.parametrize("scheme", ["weighted", "uniform", "normalized"])
def test_partial_participation_reaches_the_reference_law(scheme, rho):
    S = 2
    mean, var = reference_law(scheme, S, rho)
    m1, m2 = engine_pooled(scheme, S, rho)
    got_mean, se_mean = m1.mean(), batch_se(m1)
    got_var, se_var = pooled_var(m1, m2)
    assert abs(got_mean - mean) < Z * se_mean, (got_mean, mean, se_mean)
    assert abs(got_var - var) < Z * se_var, (got_var, var, se_var)


def test_the_reference_is_full_participation_at_s_equal_n_and_can_fail():
    """With S = N (normalized) the reference is the full-participation law
    (fedhmc.analysis.gaussian), and partial participation's law differs from it."""
    from fedhmc.analysis.gaussian import fahmc_gaussian_stationary

    target = make_target()
    for rho in (0.0, 1.0):
        m, v, _ = fahmc_gaussian_stationary(
            target.means, target.variances, target.weights, ETA, K, T, rho
        )
        rm, rv = reference_law("normalized", N, rho)
        assert rm == pytest.approx(m, rel=1e-9) and rv == pytest.approx(v, rel=1e-7)
    m_full, v_full = reference_law("normalized", N, 1.0)
    _, v_part = reference_law("weighted", 2, 1.0)
    assert v_part > 1.5 * v_full
    # The tolerance rejects another scheme's law: normalized chains against uniform's
    # reference (whose coefficients do not sum to one, so its variance is far larger).
    _, var_uniform = reference_law("uniform", 2, 1.0)
    m1, m2 = engine_pooled("normalized", 2, 1.0)
    got_var, se_var = pooled_var(m1, m2)
    assert abs(got_var - var_uniform) > Z * se_var
    # ... and full participation's, at the sampler's own precision.
    assert abs(got_var - v_full) > Z * se_var


@pytest.mark.parametrize("scheme", ["uniform", "normalized"])
@pytest.mark.parametrize("sync_unit", ["iteration", "leapfrog"])
def test_every_client_per_round_is_full_participation_bit_for_bit(scheme, sync_unit):
    target = hetero_gaussian(4, 3, dtype=torch.float64)
    kw = dict(rho=0.5, grad_noise=0.3, sync_unit=sync_unit)
    full = fahmc.Settings(0.1, 5, 7, **kw)
    all_of = fahmc.Settings(0.1, 5, 7, clients_per_round=4, participation=scheme, **kw)
    a, b = fahmc.init(torch.zeros(3, 3, dtype=torch.float64), full), None
    b = fahmc.init(torch.zeros(3, 3, dtype=torch.float64), all_of)
    for _ in range(5):
        a, _ = fahmc.step(1, a, target, full)
        b, _ = fahmc.step(1, b, target, all_of)
        assert torch.equal(a.position, b.position)


def test_idle_clients_compute_nothing():
    target = hetero_gaussian(10, 2, dtype=torch.float64)
    s = fahmc.Settings(0.05, 3, 2, clients_per_round=3, participation="uniform")
    state, info = fahmc.step(0, fahmc.init(torch.zeros(4, 2, dtype=torch.float64), s), target, s)
    assert info.clients == 3
    assert info.grad_evals == 3 * 4 * s.evals_in_round(1)
