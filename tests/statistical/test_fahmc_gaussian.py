"""FA-HMC on Gaussian clients, against closed forms.

Two references:

1. ``fahmc_gaussian_stationary``: the exact stationary law of FA-HMC's θ̄ on quadratic
   energies (it composes the leapfrog, momentum and noise maps in float64), which includes
   all of the algorithm's discretisation and local-drift bias. The sampler must match it
   to Monte Carlo error alone.
2. The exact posterior N(m, vI): the sampler must match it to Monte Carlo error plus the
   bias that reference 1 derives, which is small at a small step size.

Chains and coordinates are independent, so the S·d values of the last round are S·d
independent draws from (nearly) the stationary law once α^R is negligible. The mean of
n draws has sd √(var/n) and their variance has sd var·√(2/(n−1)); tolerances are Z = 5
such standard errors.
"""

import math

import pytest
import torch

from fedhmc.algorithms import fahmc
from fedhmc.algorithms.fahmc import (
    client_seed,
    local_iterations,
    round_keys,
    round_seed,
)
from fedhmc.analysis.gaussian import fahmc_gaussian_stationary
from fedhmc.core.aggregate import weighted_average
from fedhmc.models.targets import GaussianTarget, hetero_gaussian

Z = 5.0
CHAINS, DIM = 2000, 4


def run_chains(target, settings, rounds, seed=0, average_weights=None):
    """FA-HMC rounds, assembled from the pure pieces so a test can swap the weights."""
    theta_bar = torch.zeros(CHAINS, DIM, dtype=torch.float64)
    N = target.num_clients
    seeds = torch.tensor([client_seed(seed, c) for c in range(N)])
    chains = torch.arange(CHAINS)
    w = target.weights if average_weights is None else torch.as_tensor(average_weights)
    for r in range(1, rounds + 1):
        shared, private = round_keys(round_seed(seed, r), seeds, r, chains)
        theta = theta_bar.unsqueeze(1).expand(CHAINS, N, DIM)
        theta = local_iterations(target, theta, shared, private, settings).position
        theta_bar = weighted_average(theta, w)
    return theta_bar.flatten()


def within(samples, mean, var, extra_mean=0.0, extra_var=0.0):
    n = samples.numel()
    m_tol = Z * math.sqrt(var / n) + extra_mean
    v_tol = Z * var * math.sqrt(2 / (n - 1)) + extra_var
    dm = abs(float(samples.mean()) - mean)
    dv = abs(float(samples.var()) - var)
    return dm < m_tol and dv < v_tol, (dm, m_tol, dv, v_tol)


def stationary(target, s):
    return fahmc_gaussian_stationary(
        target.means,
        target.variances,
        target.weights,
        s.step_size,
        s.leapfrog_steps,
        s.local_steps,
        s.rho,
        s.grad_noise,
        s.temperature,
    )


def rounds_to_mix(alpha, scale=20.0):
    # α^R · (distance from the start) well below the Monte Carlo error.
    return int(math.ceil(math.log(1e-6 / scale) / math.log(abs(alpha))))


@pytest.mark.parametrize(
    "rho,noise,temperature",
    [(1.0, 0.0, 1.0), (0.5, 0.0, 1.0), (0.0, 2.0, 1.0), (1.0, 2.0, 0.5)],
)
def test_matches_exact_stationary_law_of_the_algorithm(rho, noise, temperature):
    target = hetero_gaussian(4, DIM, dtype=torch.float64)
    s = fahmc.Settings(0.05, 10, 2, rho=rho, grad_noise=noise, temperature=temperature)
    mean, var, alpha = stationary(target, s)
    x = run_chains(target, s, rounds_to_mix(alpha))
    ok, info = within(x, mean, var)
    assert ok, info


def test_recovers_exact_posterior_at_small_step_size():
    target = hetero_gaussian(4, DIM, dtype=torch.float64)
    s = fahmc.Settings(0.1, 5, 1, rho=1.0)
    mean, var, alpha = stationary(target, s)
    post = target.posterior()
    assert (post.mean, post.var) == pytest.approx((41 / 3, 4 / 3))
    bias_m, bias_v = abs(mean - post.mean), abs(var - post.var)
    assert bias_m < 0.05 and bias_v < 0.01, "the derived discretisation bias is small here"
    x = run_chains(target, s, rounds_to_mix(alpha))
    ok, info = within(x, post.mean, post.var, bias_m, bias_v)
    assert ok, info


def test_check_fails_without_averaging():
    # T = ∞: one round whose T covers the whole run, so no client ever sees the average.
    target = hetero_gaussian(4, DIM, dtype=torch.float64)
    s = fahmc.Settings(0.1, 5, 1, rho=1.0)
    mean, var, alpha = stationary(target, s)
    rounds = rounds_to_mix(alpha)
    post = target.posterior()
    x = run_chains(target, fahmc.Settings(0.1, 5, rounds, rho=1.0), 1)
    ok, info = within(x, post.mean, post.var, abs(mean - post.mean), abs(var - post.var))
    assert not ok, info


def test_unequal_weights_pass_and_wrong_weights_fail():
    target = GaussianTarget(
        [20, 1, 1, 5], [1, 2, 2, 1], DIM, weights=[0.4, 0.3, 0.2, 0.1], dtype=torch.float64
    )
    s = fahmc.Settings(0.1, 5, 1, rho=1.0)
    mean, var, alpha = stationary(target, s)
    post = target.posterior()
    extra = (abs(mean - post.mean), abs(var - post.var))
    rounds = rounds_to_mix(alpha)
    ok, info = within(run_chains(target, s, rounds), post.mean, post.var, *extra)
    assert ok, info
    wrong = run_chains(target, s, rounds, average_weights=[0.25] * 4)
    ok, info = within(wrong, post.mean, post.var, *extra)
    assert not ok, info


def test_engine_round_equals_the_assembled_pieces():
    target = hetero_gaussian(4, 3, dtype=torch.float64)
    s = fahmc.Settings(0.05, 3, 4, rho=0.5, grad_noise=1.0)
    theta_bar = torch.zeros(2, 3, dtype=torch.float64)
    seeds = torch.tensor([client_seed(7, c) for c in range(4)])
    shared, private = round_keys(round_seed(7, 1), seeds, 1, torch.arange(2))
    theta = local_iterations(target, theta_bar.unsqueeze(1).expand(2, 4, 3), shared, private, s)
    got, info = fahmc.step(7, fahmc.init(theta_bar, s), target, s)
    torch.testing.assert_close(got.position, weighted_average(theta.position, target.weights))
    assert info.grad_evals == 4 * (3 + 1) * 2 * 4
