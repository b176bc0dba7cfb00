"""Exact stationary laws of linear-Gaussian samplers (ALGORITHMS §11.4).

On Gaussian clients with full-batch gradients, every sampler updates its whole state x
(all its parts stacked in one vector) as

    x′ = M x + c + L ξ,   ξ standard normal.

When M, c and L are fixed, the chain settles to the normal law N(m, V) with
m = (I − M)⁻¹ c and V = M V Mᵀ + L Lᵀ (a discrete Lyapunov equation):
[`stationary_fixed`][fedhmc.analysis.linear_gaussian.stationary_fixed]. When (M, c, L) are
drawn afresh every round, independently of x (which clients take part, say), the stationary
law is in general not normal, but its mean and covariance still solve linear equations:
[`stationary_random`][fedhmc.analysis.linear_gaussian.stationary_random], which takes the
list of all possible draws with their probabilities.

The equations are solved by vectorization (Kronecker products), which builds a matrix of
n² × n² entries for a state of n coordinates: meant for small examples (up to a few dozen
coordinates), as the statistical tests use them. Everything is NumPy, in float64.
"""

from __future__ import annotations

import itertools
import math

import numpy as np


def _as_system(M, c, LLt) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(M, c, LLᵀ) as float64 arrays of shapes (n, n), (n,), (n, n); scalars are 1 × 1."""
    M = np.atleast_2d(np.asarray(M, dtype=np.float64))
    c = np.atleast_1d(np.asarray(c, dtype=np.float64))
    LLt = np.atleast_2d(np.asarray(LLt, dtype=np.float64))
    n = c.shape[0]
    if c.ndim != 1 or M.shape != (n, n) or LLt.shape != (n, n):
        raise ValueError(
            f"M, c and LLᵀ must have shapes (n, n), (n,), (n, n); got {M.shape}, "
            f"{c.shape}, {LLt.shape}"
        )
    return M, c, LLt


def _spectral_radius(A: np.ndarray) -> float:
    return float(np.max(np.abs(np.linalg.eigvals(A)))) if A.size else 0.0


def _symmetric(V: np.ndarray) -> np.ndarray:
    return (V + V.T) / 2


def stationary_fixed(M, c, LLt) -> tuple[np.ndarray, np.ndarray]:
    """Stationary law N(m, V) of the chain x′ = M x + c + L ξ with fixed M, c, L.

    The mean is m = (I − M)⁻¹ c and the covariance V solves V = M V Mᵀ + L Lᵀ.

    Parameters
    ----------
    M
        The update's matrix, (n, n) (a number for n = 1).
    c
        The update's constant part, (n,).
    LLt
        The covariance L Lᵀ of the noise the update adds, (n, n).

    Returns
    -------
    tuple[np.ndarray, np.ndarray]
        The stationary mean m, (n,), and covariance V, (n, n).

    Raises
    ------
    ValueError
        If M has an eigenvalue of modulus 1 or more: the chain has no stationary law.
    """
    M, c, LLt = _as_system(M, c, LLt)
    n = c.shape[0]
    radius = _spectral_radius(M)
    if not radius < 1:
        raise ValueError(f"no stationary law: M's spectral radius is {radius:.6g} (needs < 1)")
    m = np.linalg.solve(np.eye(n) - M, c)
    # Row-major vec(M V Mᵀ) = (M ⊗ M) vec(V).
    v = np.linalg.solve(np.eye(n * n) - np.kron(M, M), LLt.reshape(-1))
    return m, _symmetric(v.reshape(n, n))


def _expectations(draws):
    """Probability-weighted sums over the draws: E[M], E[c], E[M ⊗ M], the arrays
    themselves, and the probabilities (checked to be a distribution)."""
    if not draws:
        raise ValueError("need at least one draw")
    if any(len(d) != 4 for d in draws):
        raise ValueError("each draw must be a tuple (probability, M, c, LLᵀ)")
    probs = np.array([float(d[0]) for d in draws])
    if np.any(probs < 0) or not np.isclose(probs.sum(), 1.0, rtol=0, atol=1e-9):
        raise ValueError(
            f"draw probabilities must be non-negative and sum to 1 (sum {probs.sum()})"
        )
    systems = [_as_system(*d[1:]) for d in draws]
    n = systems[0][1].shape[0]
    if any(s[1].shape[0] != n for s in systems):
        raise ValueError("every draw must have the same dimension")
    EM = sum(p * M for p, (M, _, _) in zip(probs, systems, strict=True))
    Ec = sum(p * c for p, (_, c, _) in zip(probs, systems, strict=True))
    EMM = sum(p * np.kron(M, M) for p, (M, _, _) in zip(probs, systems, strict=True))
    return EM, Ec, EMM, systems, probs


def stationary_random(draws) -> tuple[np.ndarray, np.ndarray]:
    """Stationary mean and covariance of x′ = M x + c + L ξ with (M, c, L) drawn each round.

    The draw is independent of x and of the rounds before. The mean m = E[x] and the second
    moment S = E[x xᵀ] solve m = E[M] m + E[c] and
    S = E[M S Mᵀ] + E[M m cᵀ] + E[c mᵀ Mᵀ] + E[c cᵀ] + E[L Lᵀ]; the covariance is
    V = S − m mᵀ. The law itself is a mixture, in general not normal.

    Parameters
    ----------
    draws
        Every possible draw as a tuple (probability, M, c, LLᵀ), with shapes as in
        [`stationary_fixed`][fedhmc.analysis.linear_gaussian.stationary_fixed]; the
        probabilities sum to 1.

    Returns
    -------
    tuple[np.ndarray, np.ndarray]
        The stationary mean m, (n,), and covariance V, (n, n).

    Raises
    ------
    ValueError
        If the chain is not stable in mean square (the spectral radius of E[M ⊗ M] is 1 or
        more), or the draws are malformed.
    """
    EM, Ec, EMM, systems, probs = _expectations(draws)
    n = Ec.shape[0]
    radius = _spectral_radius(EMM)
    if not radius < 1:
        raise ValueError(
            f"no stationary law: E[M ⊗ M]'s spectral radius is {radius:.6g} (needs < 1)"
        )
    m = np.linalg.solve(np.eye(n) - EM, Ec)
    rhs = np.zeros((n, n))
    for p, (M, c, LLt) in zip(probs, systems, strict=True):
        Mmc = np.outer(M @ m, c)
        rhs += p * (Mmc + Mmc.T + np.outer(c, c) + LLt)
    S = np.linalg.solve(np.eye(n * n) - EMM, rhs.reshape(-1)).reshape(n, n)
    return m, _symmetric(S - np.outer(m, m))


def ula_gaussian(mu, A, gamma: float) -> tuple[np.ndarray, np.ndarray]:
    """Stationary law of the unadjusted Langevin algorithm on a Gaussian target.

    The target has potential f(θ) = ½ (θ − μ)ᵀ A (θ − μ) (the normal law N(μ, A⁻¹)); ULA
    steps θ′ = θ − γ A (θ − μ) + √(2γ) ξ. Its stationary law is normal with mean μ and
    covariance [A (I − γA/2)]⁻¹, a little wider than A⁻¹.

    Parameters
    ----------
    mu
        The target's mean, (d,).
    A
        The target's precision matrix, (d, d), symmetric positive definite.
    gamma
        The step size γ; the chain is stable for 0 < γ < 2 / (A's largest eigenvalue).
    """
    mu = np.atleast_1d(np.asarray(mu, dtype=np.float64))
    A = np.atleast_2d(np.asarray(A, dtype=np.float64))
    d = mu.shape[0]
    if A.shape != (d, d):
        raise ValueError(f"A must have shape {(d, d)}, got {A.shape}")
    eig = np.linalg.eigvalsh(_symmetric(A))
    if not (gamma > 0 and eig[0] > 0 and gamma * eig[-1] < 2):
        raise ValueError(
            f"ULA has no stationary law here: needs A positive definite and "
            f"0 < γ < 2/λmax (γ = {gamma}, eigenvalues in [{eig[0]:.6g}, {eig[-1]:.6g}])"
        )
    cov = np.linalg.inv(A @ (np.eye(d) - gamma * A / 2))
    return mu.copy(), _symmetric(cov)


MAX_DRAWS = 100_000
"""The most client subsets `qlsd_partial_gaussian` enumerates."""


def qlsd_partial_gaussian(
    mus, As, gamma: float, clients_per_round: int
) -> tuple[np.ndarray, np.ndarray]:
    """Exact stationary mean and covariance of QLSD with partial participation on Gaussian
    clients (no quantization, full batches).

    Client c's share of the potential is U_c(θ) = ½ (θ − μ_c)ᵀ A_c (θ − μ_c). Each round
    the server draws S of the N clients uniformly without replacement and steps
    θ′ = θ − γ (N/S) Σ_{c drawn} ∇U_c(θ) + √(2γ) ξ. All C(N, S) subsets are enumerated and
    passed to [`stationary_random`][fedhmc.analysis.linear_gaussian.stationary_random].
    With S = N this is ULA on f = Σ_c U_c.

    Parameters
    ----------
    mus
        The clients' centres μ_c, (N, d).
    As
        The clients' precision matrices A_c, (N, d, d), symmetric.
    gamma
        The step size γ.
    clients_per_round
        S, between 1 and N.
    """
    mus = np.asarray(mus, dtype=np.float64)
    As = np.asarray(As, dtype=np.float64)
    if mus.ndim != 2 or As.shape != mus.shape + mus.shape[1:]:
        raise ValueError(f"mus must be (N, d) and As (N, d, d); got {mus.shape}, {As.shape}")
    N, d = mus.shape
    S = int(clients_per_round)
    if not 1 <= S <= N:
        raise ValueError(f"clients_per_round must be between 1 and {N}, got {clients_per_round}")
    count = math.comb(N, S)
    if count > MAX_DRAWS:
        raise ValueError(f"C({N}, {S}) = {count} subsets is too many to enumerate")
    scale = gamma * N / S
    noise = 2 * gamma * np.eye(d)
    draws = []
    for subset in itertools.combinations(range(N), S):
        A = As[list(subset)].sum(axis=0)
        b = np.einsum("cij,cj->i", As[list(subset)], mus[list(subset)])
        draws.append((1 / count, np.eye(d) - scale * A, scale * b, noise))
    return stationary_random(draws)
