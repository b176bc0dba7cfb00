"""Debiased FA-HMC (docs/algorithms.md) against its exact stationary law on Gaussian clients.

On the heterogeneous Gaussian, ``fahmc_gaussian_stationary(..., debiased=True)`` gives the
exact stationary law of debiased FA-HMC's θ̄ with the previous-anchor schedule (an AR(2) in
the rounds; its mean is the exact posterior mean, since the clients' μ_c cancel from the
corrected gradients). Plain FA-HMC's law, from the same function, is biased toward the
clients' local optima by an amount that grows with T. Chains and coordinates are
independent, so the n = S·d values of the last round are n independent draws; tolerances
are Z = 5 Monte Carlo standard errors, √(var/n) for the mean.
"""

import dataclasses
import json
import math

import pytest
import torch

from fedhmc.algorithms import debiased as debiased_fahmc
from fedhmc.algorithms import fahmc
from fedhmc.analysis.gaussian import fahmc_gaussian_stationary
from fedhmc.models.targets import hetero_gaussian
from fedhmc.runtime.config import RunConfig
from fedhmc.runtime.engine import run

Z = 5.0
CHAINS, DIM = 1000, 4
T, K, ETA = 50, 5, 0.02


def law(target, debiased):
    return fahmc_gaussian_stationary(
        target.means, target.variances, target.weights, ETA, K, T, 1.0, debiased=debiased
    )


def last_round(target, debiased, correct=True):
    """θ̄ after enough rounds to forget the start; ``correct=False`` drops the correction."""
    algorithm = debiased_fahmc if debiased else fahmc
    settings = algorithm.Settings(ETA, K, T, rho=1.0)
    _, _, radius = law(target, debiased)
    rounds = int(math.ceil(math.log(1e-6 / 20) / math.log(radius)))
    state = algorithm.init(torch.zeros(CHAINS, DIM, dtype=torch.float64), settings)
    for _ in range(rounds):
        state, _ = algorithm.step(0, state, target, settings)
        if debiased and not correct:  # a control variate of zero: ∇f(θ_a) = ∇f^(c)(θ_a)
            kept = state.clients.arrays
            zero = torch.zeros_like(kept["anchor_local"][:, 0])
            clients = dataclasses.replace(
                state.clients, arrays={**kept, "anchor_local": 0 * kept["anchor_local"]}
            )
            state = dataclasses.replace(state, anchor_grad=zero, clients=clients)
    return state.position.flatten()


def test_the_laws_plain_is_biased_and_debiased_is_not():
    target = hetero_gaussian(4, DIM, dtype=torch.float64)
    post = target.posterior()
    plain_mean, _, _ = law(target, False)
    deb_mean, deb_var, _ = law(target, True)
    assert post.mean - plain_mean > 0.2  # pulled toward the unweighted optima (10.5)
    assert abs(deb_mean - post.mean) < 1e-9
    assert abs(deb_var - post.var) < 0.01  # what is left is the O(η²) discretisation


def test_debiased_sampler_matches_its_exact_law_and_removes_the_bias():
    target = hetero_gaussian(4, DIM, dtype=torch.float64)
    mean, var, _ = law(target, True)
    plain_mean, _, _ = law(target, False)
    x = last_round(target, True)
    se = math.sqrt(var / x.numel())
    assert abs(float(x.mean()) - mean) < Z * se
    assert abs(float(x.var()) - var) < Z * var * math.sqrt(2 / (x.numel() - 1))
    # Most of plain FA-HMC's bias is gone: what remains is within Monte Carlo error.
    assert abs(float(x.mean()) - mean) < 0.25 * abs(plain_mean - mean)


def test_check_fails_when_the_correction_is_switched_off():
    target = hetero_gaussian(4, DIM, dtype=torch.float64)
    mean, var, _ = law(target, True)
    x = last_round(target, True, correct=False)
    se = math.sqrt(var / x.numel())
    assert abs(float(x.mean()) - mean) > Z * se


def test_round_one_is_plain_fahmc_and_later_rounds_are_not():
    target = hetero_gaussian(4, 3, dtype=torch.float64)
    s = debiased_fahmc.Settings(0.05, 3, 4, rho=0.5, grad_noise=1.0)
    theta = torch.randn(2, 3, dtype=torch.float64)
    plain, info_p = fahmc.step(7, fahmc.init(theta, s), target, s)
    deb, info_d = debiased_fahmc.step(7, debiased_fahmc.init(theta, s), target, s)
    torch.testing.assert_close(deb.position, plain.position, rtol=0, atol=0)
    assert info_d.grad_evals == info_p.grad_evals + 2 * 4  # one anchor gradient per client
    # The control variates average to zero over clients (Σ w_c (∇f − ∇f^(c)) = 0).
    w = target.weights.view(1, -1, 1)
    correction = deb.anchor_grad.unsqueeze(1) - deb.clients.arrays["anchor_local"]
    assert float((correction * w).sum(1).abs().max()) < 1e-12
    plain2, _ = fahmc.step(7, plain, target, s)
    deb2, _ = debiased_fahmc.step(7, deb, target, s)
    assert not torch.allclose(deb2.position, plain2.position)


@pytest.mark.parametrize("anchor_batch", [0, 16])
def test_engine_runs_debiased_and_counts_its_bytes(tmp_path, anchor_batch):
    cfg = RunConfig(
        algorithm="fahmc-debiased",
        anchor_batch_size=anchor_batch,
        rounds=3,
        local_steps=2,
        leapfrog_steps=2,
        chains=2,
        out=str(tmp_path / "d"),
    )
    result = run(cfg, progress=False)
    d = result.summary["dim"]
    per_array = 10 * 2 * d * 4
    assert [r["bytes_down"] for r in result.history] == [per_array, 3 * per_array, 3 * per_array]
    assert all(r["bytes_up"] == 2 * per_array for r in result.history)
    # T·(K+1) + 1 evaluations per client and chain and round.
    assert result.summary["grad_evals"] == 3 * 10 * 2 * (2 * 3 + 1)
    assert 0.0 <= result.final["accuracy"] <= 1.0


@pytest.mark.slow  # an experiment preset end to end
def test_debiased_gaussian_experiment_quick(tmp_path, capsys):
    from fedhmc.cli.main import main

    assert main(["experiment", "debiased-gaussian", "--quick", "--out", str(tmp_path)]) == 0
    summary = json.loads((tmp_path / "debiased_gaussian.json").read_text())
    assert (tmp_path / "debiased_gaussian.png").stat().st_size > 1000
    assert (tmp_path / "debiased_gaussian.csv").exists()
    by = {(r["T"], r["algorithm"]): r for r in summary["rows"]}
    # Plain FA-HMC's bias at T = 50 (exact: −0.255) is far outside the Monte Carlo error;
    # the debiased one's is within it.
    p, d = by[50, "fahmc"], by[50, "fahmc-debiased"]
    assert abs(p["bias"] - d["bias"]) > Z * math.hypot(p["bias_se"], d["bias_se"])
    assert abs(d["bias"] - d["exact_bias"]) < Z * d["bias_se"]
    assert main(["experiment", "--list"]) == 0
    assert "stale-gaussian" in capsys.readouterr().out
