"""Every algorithm, through the one interface, on a Gaussian target whose answer is known.

Each entry of ``CASES`` names an algorithm module, its settings, a target and the exact
stationary mean and variance of the chain it runs (the posterior for the Metropolis-adjusted
reference, the algorithm's own law for the others: FA-HMC's from its AR recursion, the Euler
samplers' from their discrete Lyapunov equation). The test runs the algorithm only through
``init(position, settings)`` and ``step(key, state, target, settings)``, long enough for the
start to be forgotten (below 1e-6 of the spread), and checks the mean and variance of the
final positions of many independent chains within Z Monte Carlo standard errors. A new
algorithm gets these checks by being listed.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import numpy as np
import pytest
import torch

from fedhmc.algorithms import (
    async_sgmcmc,
    debiased,
    dglmc,
    fahmc,
    fsgld,
    mhmc,
    oracles,
    qlsd,
    stale,
)
from fedhmc.algorithms.delayed import make_regression
from fedhmc.algorithms.delayed import sgld as delayed_sgld
from fedhmc.analysis.gaussian import fahmc_gaussian_stationary
from fedhmc.models.targets import hetero_gaussian

Z = 5.0
CHAINS = 4000
M1, V1 = 0.5, 0.8  # the one-dimensional target N(M1, V1) of the pooled samplers


def gaussian_grad(theta, step=0):
    return (theta - M1) / V1


def lyapunov(A: np.ndarray, Q: np.ndarray) -> np.ndarray:
    """Σ = A Σ Aᵀ + Q: the stationary covariance of x' = A x + noise of covariance Q."""
    n = A.shape[0]
    vec = np.linalg.solve(np.eye(n * n) - np.kron(A, A), Q.reshape(-1))
    return vec.reshape(n, n)


def euler_var(method: str, h: float, B: float) -> float:
    """Stationary variance of θ under SGHMC (Euler, friction B) or SGLD on N(M1, V1)."""
    if method == "sgld":
        a = 1 - h / V1
        return 2 * h / (1 - a * a)
    # (q, θ)' = A (q, θ) + (√(2Bh) ζ, h √(2Bh) ζ)
    A = np.array([[1 - B * h, -h / V1], [h * (1 - B * h), 1 - h * h / V1]])
    b = math.sqrt(2 * B * h) * np.array([1.0, h])
    return float(lyapunov(A, np.outer(b, b))[1, 1])


@dataclass
class Case:
    name: str
    module: object
    settings: object
    target: object
    position: torch.Tensor
    steps: int
    mean: np.ndarray
    var: np.ndarray
    drive: str = "step"  # "received": the gradient arrives as a worker's reply


def fahmc_case(module, name):
    target = hetero_gaussian(4, 2, dtype=torch.float64)
    eta, K, T = 0.2, 5, 2
    s = module.Settings(eta, K, T, rho=0.5, grad_noise=0.5)
    m, v, radius = fahmc_gaussian_stationary(
        target.means, target.variances, target.weights, eta, K, T, 0.5, grad_noise=0.5,
        debiased=module is debiased,
    )  # fmt: skip
    steps = math.ceil(math.log(1e-6) / math.log(radius))
    x0 = torch.zeros(CHAINS // 4, 2, dtype=torch.float64)
    return Case(name, module, s, target, x0, steps, np.full(2, m), np.full(2, v))


def euler_case(method):
    h, B = 0.1, 2.0
    s = stale.Settings(method, h, friction=B, local_steps=10)
    x0 = torch.zeros(CHAINS, 1, dtype=torch.float64)
    v = euler_var(method, h, B)
    return Case(
        f"stale-{method}", stale, s, oracles.from_grad(gaussian_grad), x0, 30,
        np.array([M1]), np.array([v]),
    )  # fmt: skip


def async_case():
    h, B = 0.1, 2.0
    s = async_sgmcmc.Settings("sghmc", h, B, max_staleness=0)
    # One chain of CHAINS independent coordinates: the target is separable.
    x0 = torch.zeros(CHAINS, dtype=torch.float64)
    v = euler_var("sghmc", h, B)
    return Case(
        "async-sghmc", async_sgmcmc, s, None, x0, 300, np.array([M1]), np.array([v]),
        drive="received",
    )  # fmt: skip


def mhmc_case():
    def energy_grad(theta):
        return 0.5 * ((theta - M1).square() / V1).sum(-1), (theta - M1) / V1

    s = mhmc.Settings(step_size=0.4, leapfrog_steps=5)
    x0 = torch.zeros(CHAINS, 2, dtype=torch.float64)
    return Case(
        "mhmc", mhmc, s, oracles.from_energy(energy_grad), x0, 60,
        np.full(2, M1), np.full(2, V1),
    )  # fmt: skip


def delayed_case():
    problem = make_regression(n=50, degree=1, noise_var=1.0, seed=0)
    R, P, gamma = CHAINS // 2, 2, 4e-3
    s = delayed_sgld.Settings(mode="sync", workers=P, step_size=gamma, batch_size=0, chains=R)
    phi = problem.features.numpy()
    H = phi.T @ phi / problem.noise_var + np.eye(problem.dim) / problem.prior_std**2
    b = phi.T @ problem.targets.numpy() / problem.noise_var
    mean = np.linalg.solve(H, b)  # the sync chain's fixed point is the posterior mean
    A = np.eye(problem.dim) - gamma * P * H
    cov = lyapunov(A, 2 * gamma * P * np.eye(problem.dim))
    radius = max(abs(np.linalg.eigvals(A)))
    steps = math.ceil(math.log(1e-6 / (1 + np.abs(mean).max())) / math.log(radius))
    x0 = torch.zeros(R, problem.dim, dtype=torch.float64)
    return Case("delayed-sgld", delayed_sgld, s, problem, x0, steps, mean, np.diag(cov))


def _ula_case(name, module, settings, target, steps_a_round=1):
    """A sampler that is the unadjusted Langevin algorithm on f = Σ_c U_c (U_c = w_c f^(c):
    per coordinate ½ A_c (θ − μ_c)², A_c = w_c / v_c): N(μ, [A (1 − γA/2)]⁻¹)."""
    A_c = (target.weights / target.variances).numpy()
    A = A_c.sum()
    mu = float((A_c * target.means.numpy()).sum() / A)
    gamma = settings.step_size
    var = 1 / (A * (1 - gamma * A / 2))
    steps = math.ceil(math.log(1e-6 / mu) / (steps_a_round * math.log(abs(1 - gamma * A)))) + 1
    x0 = torch.zeros(CHAINS // 4, 2, dtype=torch.float64)
    return Case(name, module, settings, target, x0, steps, np.full(2, mu), np.full(2, var))


def qlsd_case():
    # s = ∞ and every client each round: QLSD is ULA on f.
    target = hetero_gaussian(4, 2, dtype=torch.float64)
    return _ula_case("qlsd", qlsd, qlsd.Settings(step_size=0.5), target)


def fsgld_case():
    # One client: the conducive gradient is ∇f whatever its fitted surrogate, so after the
    # set-up round FSGLD is ULA on f, T steps a round.
    target = hetero_gaussian(1, 2, dtype=torch.float64)
    s = fsgld.Settings(step_size=0.3, local_steps=3, surrogate_steps=10)
    return _ula_case("fsgld", fsgld, s, target, steps_a_round=3)


def dglmc_case():
    """DG-LMC's θ: the stationary law of its round's linear map of (θ, z_1 … z_N) per
    coordinate (θ ~ N(z̄, ρ/N), then L Langevin steps on each z_c), a Lyapunov equation."""
    target = hetero_gaussian(4, 2, dtype=torch.float64)
    gamma, L, rho = 0.2, 5, 1.0
    A = (target.weights / target.variances).numpy()
    mu, N = target.means.numpy(), 4
    M, c, Q = np.eye(N + 1), np.zeros(N + 1), np.zeros((N + 1, N + 1))
    M[0] = 0.0
    M[0, 1:] = 1 / N
    Q[0, 0] = rho / N
    for _ in range(L):
        S, d, R = np.eye(N + 1), np.zeros(N + 1), np.zeros((N + 1, N + 1))
        for i in range(N):
            S[i + 1, i + 1] = 1 - gamma * (A[i] + 1 / rho)
            S[i + 1, 0] = gamma / rho
            d[i + 1], R[i + 1, i + 1] = gamma * A[i] * mu[i], 2 * gamma
        M, c, Q = S @ M, S @ c + d, S @ Q @ S.T + R
    mean = np.linalg.solve(np.eye(N + 1) - M, c)
    cov = lyapunov(M, Q)
    radius = max(abs(np.linalg.eigvals(M)))
    steps = math.ceil(math.log(1e-6 / abs(mean).max()) / math.log(radius)) + 1
    s = dglmc.Settings(step_size=gamma, local_steps=L, coupling=rho)
    x0 = torch.zeros(CHAINS // 4, 2, dtype=torch.float64)
    return Case("dglmc", dglmc, s, target, x0, steps, np.full(2, mean[0]), np.full(2, cov[0, 0]))


CASES = [
    fahmc_case(fahmc, "fahmc"),
    qlsd_case(),
    fsgld_case(),
    dglmc_case(),
    fahmc_case(debiased, "fahmc-debiased"),
    euler_case("sgld"),
    euler_case("sghmc"),
    async_case(),
    mhmc_case(),
    delayed_case(),
]


def test_every_algorithm_module_is_listed():
    """A module in fedhmc.algorithms with an interface must be in CASES."""
    import pkgutil

    import fedhmc.algorithms as pkg

    listed = {c.module.__name__ for c in CASES}
    for info in pkgutil.walk_packages(pkg.__path__, pkg.__name__ + "."):
        mod = __import__(info.name, fromlist=["step"])
        if callable(getattr(mod, "step", None)) and callable(getattr(mod, "init", None)):
            assert info.name in listed, f"{info.name} has init/step but no conformance case"


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_the_interface_reaches_the_known_stationary_law(case):
    for name in ("Settings", "State", "Info", "init", "step"):
        assert hasattr(case.module, name), f"{case.module.__name__} lacks {name}"
    state = case.module.init(case.position, case.settings)
    with pytest.raises(dataclasses.FrozenInstanceError):  # State is immutable
        state.position = None
    for _ in range(case.steps):
        if case.drive == "received":
            g = gaussian_grad(state.position)
            target = oracles.Received(g, sent=state.timestamp)
        else:
            target = case.target
        state, info = case.module.step(11, state, target, case.settings)
        assert info.grad_evals >= 0
    x = state.position.reshape(state.position.shape[0], -1).numpy()
    if case.drive == "received":
        x = x.reshape(-1, 1)  # coordinates are the independent chains
    n = x.shape[0]
    mean, var = x.mean(0), x.var(0, ddof=1)
    m_tol = Z * np.sqrt(case.var / n)
    v_tol = Z * case.var * math.sqrt(2 / (n - 1))
    assert np.all(np.abs(mean - case.mean) < m_tol), (mean, case.mean, m_tol)
    assert np.all(np.abs(var - case.var) < v_tol), (var, case.var, v_tol)


def test_a_wrong_law_is_rejected():
    """The tolerances can fail: FA-HMC's chains against the posterior (its law is biased
    on heterogeneous clients at this step size, by about 20 standard errors)."""
    case = fahmc_case(fahmc, "fahmc")
    state = fahmc.init(case.position, case.settings)
    for _ in range(case.steps):
        state, _ = fahmc.step(11, state, case.target, case.settings)
    post = case.target.posterior()
    x = state.position.numpy()
    n = x.shape[0]
    ok_var = np.abs(x.var(0, ddof=1) - post.var) < Z * post.var * math.sqrt(2 / (n - 1))
    ok_mean = np.abs(x.mean(0) - post.mean) < Z * math.sqrt(post.var / n)
    assert not (ok_var.all() and ok_mean.all())
