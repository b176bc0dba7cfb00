"""Leapfrog: exact, deterministic checks in float64 (NumPyro's integrator tests as model)."""

import math

import pytest
import torch

from fedhmc.algorithms import fahmc
from fedhmc.core.integrators import leapfrog


def _oscillator(omega: float):
    calls = []

    def grad(theta, k):
        calls.append(k)
        return omega**2 * theta

    return grad, calls


@pytest.mark.parametrize("eta,K,omega", [(0.1, 7, 1.0), (0.03, 50, 2.0), (0.5, 3, 1.5)])
def test_harmonic_oscillator_reaches_the_discrete_analytic_end_point(eta, K, omega):
    # Leapfrog on H = p²/2 + ω²q²/2 is a rotation by φ with cos φ = 1 − η²ω²/2:
    # q_K = cos(Kφ) q0 + sin(Kφ) p0 / (ω √(1 − η²ω²/4)).
    grad, calls = _oscillator(omega)
    q0 = torch.tensor([0.7, -1.2], dtype=torch.float64)
    p0 = torch.tensor([0.3, 0.5], dtype=torch.float64)
    q, p, _ = leapfrog(grad, q0, p0, eta, K)
    phi = math.acos(1 - eta**2 * omega**2 / 2)
    scale = omega * math.sqrt(1 - eta**2 * omega**2 / 4)
    q_exact = math.cos(K * phi) * q0 + math.sin(K * phi) * p0 / scale
    p_exact = -math.sin(K * phi) * scale * q0 + math.cos(K * phi) * p0
    torch.testing.assert_close(q, q_exact, rtol=0, atol=1e-12)
    torch.testing.assert_close(p, p_exact, rtol=0, atol=1e-12)
    assert calls == list(range(K + 1)), "K + 1 gradient evaluations, numbered 0 … K"


def test_converges_to_the_continuous_solution_at_order_two():
    omega, t_end = 1.3, 2.0
    q0 = torch.tensor([1.0], dtype=torch.float64)
    p0 = torch.tensor([0.0], dtype=torch.float64)
    errs = []
    for K in (20, 40, 80):
        q, _, _ = leapfrog(_oscillator(omega)[0], q0, p0, t_end / K, K)
        errs.append(abs(float(q) - math.cos(omega * t_end)))
    assert 3.5 < errs[0] / errs[1] < 4.5 and 3.5 < errs[1] / errs[2] < 4.5


def test_energy_error_is_order_eta_squared():
    # Anisotropic Gaussian energy ½ θᵀ diag(a) θ.
    a = torch.tensor([1.0, 4.0, 9.0], dtype=torch.float64)

    def grad(theta, k):
        return a * theta

    def energy(q, p):
        return float(0.5 * (a * q * q).sum() + 0.5 * (p * p).sum())

    q0 = torch.tensor([1.0, 0.5, -0.3], dtype=torch.float64)
    p0 = torch.tensor([-0.2, 0.8, 0.4], dtype=torch.float64)
    h0 = energy(q0, p0)
    t_end, errs = 1.7, []
    for eta in (0.04, 0.02, 0.01):
        K = round(t_end / eta)
        worst, q, p = 0.0, q0, p0
        for _ in range(K):  # one step at a time, to see the whole trajectory
            q, p, _ = leapfrog(grad, q, p, eta, 1)
            worst = max(worst, abs(energy(q, p) - h0))
        errs.append(worst)
    assert errs[0] < 0.02
    assert 3.5 < errs[0] / errs[1] < 4.5 and 3.5 < errs[1] / errs[2] < 4.5


def test_time_reversibility():
    # A non-quadratic energy: f(θ) = Σ log cosh(θ) + θ⁴/4.
    def grad(theta, k):
        return torch.tanh(theta) + theta**3

    gen = torch.Generator().manual_seed(0)
    q0 = torch.randn(5, dtype=torch.float64, generator=gen)
    p0 = torch.randn(5, dtype=torch.float64, generator=gen)
    q1, p1, _ = leapfrog(grad, q0, p0, 0.05, 40)
    q2, p2, _ = leapfrog(grad, q1, -p1, 0.05, 40)
    torch.testing.assert_close(q2, q0, rtol=0, atol=1e-12)
    torch.testing.assert_close(-p2, p0, rtol=0, atol=1e-12)


def test_inputs_are_not_modified():
    q0, p0 = torch.ones(3), torch.ones(3)
    leapfrog(lambda th, k: th, q0, p0, 0.1, 3)
    assert torch.equal(q0, torch.ones(3)) and torch.equal(p0, torch.ones(3))


# ------------------------------------------------------------------ energy-error estimate
@pytest.mark.parametrize("fresh", [False, True])
def test_round_energy_error_is_the_exact_hamiltonian_change_on_a_gaussian(fresh):
    """fahmc.Info.energy_error (the health check's input) against H = f + |p|²/2 computed
    directly. The start momentum is recovered by time reversal (leapfrog from (θ_K, −p_K)
    ends at (θ_0, −p_0)); on a quadratic energy the estimate is exact, so 1e-9."""
    from fedhmc.algorithms.fahmc import RoundStart, client_seed, local_iterations, round_keys
    from fedhmc.models.targets import GaussianTarget

    S, N, D, K = 3, 4, 5, 7
    target = GaussianTarget([3.0, -1.0, 0.5, 2.0], [0.5, 1.0, 2.0, 0.8], D, dtype=torch.float64)
    settings = fahmc.Settings(
        step_size=0.4,  # near the stability limit of the stiffest client: large |ΔH|
        leapfrog_steps=K,
        local_steps=K,  # one whole trajectory per round
        rho=0.5,
        sync_unit="leapfrog",
        fresh_gradients=fresh,
    )
    theta0 = torch.randn(S, N, D, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    seeds = torch.tensor([client_seed(0, c) for c in range(N)])
    shared, private = round_keys(123, seeds, 1, torch.arange(S))
    info = local_iterations(target, theta0, shared, private, settings, RoundStart(round=1))
    theta = info.position

    def grad(th, k):
        return target.grad(th, None, k, False)[0]

    def energy(th):
        return target.grad(th, None, 0, True)[1]

    back_theta, back_p, _ = leapfrog(grad, theta, -info.momentum, 0.4, K)
    torch.testing.assert_close(back_theta, theta0, rtol=0, atol=1e-10)
    p0 = -back_p
    dh = energy(theta) + 0.5 * info.momentum.square().sum(-1)
    dh -= energy(theta0) + 0.5 * p0.square().sum(-1)
    assert dh.abs().max() > 0.1  # a case where the check has something to measure
    torch.testing.assert_close(info.energy_error, dh.abs(), rtol=1e-9, atol=1e-9)


def test_an_exploding_energy_error_ends_the_run_as_diverged(tmp_path):
    """A heterogeneous-Gaussian run past the leapfrog's stability limit (η = 2.5 against
    2 s_min = 2) in float64, where the positions stay finite in round 1 (|ΔH| ≈ 4e14): the
    energy check, not the NaN check, stops it. At η = 1 (stable: |ΔH| ≈ 30, 190 in round 1
    from the start far from the posterior) the run completes."""
    import json

    from fedhmc.errors import NonFiniteError
    from fedhmc.runtime.config import RunConfig
    from fedhmc.runtime.engine import run

    kw = dict(dataset="gaussian-hetero", dtype="float64", local_steps=1, rounds=5)
    cfg = RunConfig(step_size=2.5, out=str(tmp_path / "a"), **kw)
    with pytest.raises(NonFiniteError, match="energy error exploded"):
        run(cfg, progress=False)
    summary = json.loads((tmp_path / "a" / "summary.json").read_text())
    assert summary["status"] == "diverged"
    res = run(RunConfig(step_size=1.0, out=str(tmp_path / "b"), **kw), progress=False)
    assert res.summary["status"] == "completed"
    assert all(0 < row["energy_error"] < 1000 for row in res.history)  # threshold: 1e5
