"""Exact laws of FA-HMC on Gaussian targets (full gradients): the stationary law and the
law after r rounds, used by the statistical tests and the Gaussian experiments.
"""

from __future__ import annotations

import math

import numpy as np


def fahmc_gaussian_stationary(
    means,
    variances,
    weights,
    step_size: float,
    leapfrog_steps: int,
    local_steps: int,
    rho: float,
    grad_noise: float = 0.0,
    temperature: float = 1.0,
    debiased: bool = False,
) -> tuple[float, float, float]:
    """Exact stationary law of FA-HMC's global sample on a
    [`GaussianTarget`][fedhmc.models.targets.GaussianTarget].

    On quadratic energies every FA-HMC operation is linear-Gaussian, coordinate by
    coordinate, so one communication round maps the broadcast coordinate θ̄ to
    θ̄′ = α θ̄ + β + N(0, γ). This function composes the leapfrog, the partially shared
    momentum and the injected gradient noise in float64 to get α, β and γ; the
    stationary law is N(β / (1 − α), γ / (1 − α²)). It includes every discretisation and
    local-drift bias of the algorithm, so a test can compare the sampler against it with
    Monte Carlo tolerances alone.

    With ``debiased=True`` it is the law of debiased FA-HMC (docs/algorithms.md) with the
    previous-anchor schedule of ``fedhmc.algorithms.debiased``: client c's gradient
    becomes a_c θ + (ā − a_c) θ_a − Σ_j w_j a_j μ_j (a_c = 1/s_c², ā = Σ w_c a_c; the μ_c
    cancel), where θ_a = θ̄_{r−2} is the anchor, so a round maps
    θ̄_r = α θ̄_{r−1} + α_a θ̄_{r−2} + β + N(0, γ): an AR(2) with stationary mean
    β / (1 − α − α_a) and variance γ (1 − α_a) / ((1 + α_a)((1 − α_a)² − α²)).

    Returns
    -------
    (mean, var, alpha)
        Stationary mean and variance of each coordinate of θ̄, and the per-round
        contraction α (|α| < 1 for a stable sampler; the autocorrelation of θ̄). For the
        debiased AR(2), α is the spectral radius of its companion matrix.
    """
    alpha, alpha_a, beta, gamma = _round_map(
        (means, variances, weights),
        (step_size, leapfrog_steps, local_steps, rho),
        grad_noise,
        temperature,
        debiased,
    )
    if not debiased:
        if not abs(alpha) < 1.0:
            return math.nan, math.nan, alpha
        return beta / (1.0 - alpha), gamma / (1.0 - alpha**2), alpha
    radius = float(np.max(np.abs(np.roots([1.0, -alpha, -alpha_a]))))
    if not radius < 1.0:
        return math.nan, math.nan, radius
    mean = beta / (1.0 - alpha - alpha_a)
    var = gamma * (1.0 - alpha_a) / ((1.0 + alpha_a) * ((1.0 - alpha_a) ** 2 - alpha**2))
    return mean, var, radius


def fahmc_gaussian_transient(
    means,
    variances,
    weights,
    step_size: float,
    leapfrog_steps: int,
    local_steps: int,
    rho: float,
    rounds: int,
    theta0: float = 0.0,
    grad_noise: float = 0.0,
    temperature: float = 1.0,
) -> tuple[np.ndarray, np.ndarray]:
    """Exact law of plain FA-HMC's θ̄_r, r = 1 … ``rounds``, from θ̄_0 = ``theta0``.

    Each coordinate of θ̄_r is N(m_r, v_r) with m_r = α m_{r−1} + β and
    v_r = α² v_{r−1} + γ (the round map of `fahmc_gaussian_stationary`), so the
    W₂² of θ̄_r to the posterior N(m 1_d, v I) is d ((m_r − m)² + (√v_r − √v)²) exactly,
    with no Monte Carlo error.

    Returns
    -------
    (mean, var)
        Arrays of shape (rounds,).
    """
    alpha, _, beta, gamma = _round_map(
        (means, variances, weights),
        (step_size, leapfrog_steps, local_steps, rho),
        grad_noise,
        temperature,
        False,
    )
    m, v = float(theta0), 0.0
    ms, vs = np.empty(rounds), np.empty(rounds)
    for r in range(rounds):
        m, v = alpha * m + beta, alpha * alpha * v + gamma
        ms[r], vs[r] = m, v
    return ms, vs


def _round_map(
    target: tuple, sampler: tuple, grad_noise, temperature, debiased
) -> tuple[float, float, float, float]:
    """(α, α_a, β, γ) of one round: θ̄_r = α θ̄_{r−1} + α_a θ_a + β + N(0, γ) per coordinate.
    ``target`` = (means, variances, weights) of the clients; ``sampler`` = (step size, K,
    T, ρ)."""
    means, variances, weights = target
    step_size, leapfrog_steps, local_steps, rho = sampler
    mu = np.asarray(means, dtype=float)
    a = 1.0 / (np.asarray(variances, dtype=float) * temperature)
    w = np.asarray(weights, dtype=float)
    w = w / w.sum()
    sig = grad_noise / temperature
    eta, K = float(step_size), int(leapfrog_steps)
    anchor = (float(w @ a), float(w @ (a * mu))) if debiased else None
    coef = _leapfrog_coefficients(mu, a, (eta, K, sig), anchor)

    def one_round(m0: float, ma: float, v0: float) -> tuple[float, float]:
        return _one_round(coef, w, (local_steps, rho), (m0, ma, v0))

    beta, gamma = one_round(0.0, 0.0, 0.0)
    alpha = one_round(1.0, 0.0, 0.0)[0] - beta
    alpha_a = one_round(0.0, 1.0, 0.0)[0] - beta if debiased else 0.0
    return alpha, alpha_a, beta, gamma


def _leapfrog_coefficients(mu, a, eta_k_sig: tuple, anchor: tuple | None) -> tuple:
    """Each client's K leapfrog steps from (θ0, p0) as affine forms: (A, B, C, E, V), client
    by client, with θ_K = A θ0 + B p0 + C + E θ_a + noise of variance V. ``anchor`` =
    (ā, Σ w_j a_j μ_j) for debiased FA-HMC, None for plain FA-HMC."""
    eta, K, sig = eta_k_sig
    N = mu.shape[0]
    A, B, C, E, V = (np.empty(N) for _ in range(5))
    for c in range(N):
        # Affine forms over the basis [θ0, p0, 1, θ_a, ε_0 … ε_K].
        basis = K + 5
        th = np.zeros(basis)
        th[0] = 1.0
        p = np.zeros(basis)
        p[1] = 1.0

        def grad(theta, k, c=c):
            g = a[c] * theta
            if anchor is not None:
                g[2] -= anchor[1]
                g[3] += anchor[0] - a[c]
            else:
                g[2] -= a[c] * mu[c]
            g[4 + k] += sig
            return g

        g = grad(th, 0)
        for k in range(K):
            th = th + eta * p - 0.5 * eta * eta * g
            g_next = grad(th, k + 1)
            p = p - 0.5 * eta * (g + g_next)
            g = g_next
        A[c], B[c], C[c], E[c] = th[0], th[1], th[2], th[3]
        V[c] = float(np.sum(th[4:] ** 2))
    return A, B, C, E, V


def _one_round(coef: tuple, w, t_rho: tuple, start: tuple) -> tuple[float, float]:
    """The mean and variance of θ̄ after one round of T local iterations (``t_rho`` = (T,
    ρ)) from ``start`` = (mean of θ̄, the anchor θ_a, variance of θ̄), with the clients'
    leapfrog coefficients ``coef`` and weights ``w``."""
    A, B, C, E, V = coef
    local_steps, rho = t_rho
    m0, ma, v0 = start
    N = A.shape[0]
    m = np.full(N, m0)
    cov = np.full((N, N), v0)
    for _ in range(local_steps):
        m = A * m + C + E * ma
        cov = (A[:, None] * cov * A[None, :]) + rho * np.outer(B, B)
        cov += np.diag((1.0 - rho) * B**2 / w + V)
    return float(w @ m), float(w @ cov @ w)
