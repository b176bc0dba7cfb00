"""The Metropolis-adjusted HMC reference on known answers (diagnostics: test_diagnostics.py).

The reference runs S independent chains; the last draw of each is one draw from (close to)
the target after warm-up and many proposals, so with S chains and D independent
coordinates the mean of a coordinate has standard error √(v/S) and its variance
v·√(2/(S−1)); tolerances are Z = 5 of them.
"""

import math

import pytest
import torch

from fedhmc.algorithms.mhmc import mhmc, pooled_energy
from fedhmc.runtime.config import RunConfig
from fedhmc.runtime.problem import build_problem

Z = 5.0
MEAN = torch.tensor([1.0, -2.0, 0.5], dtype=torch.float64)
VAR = torch.tensor([0.25, 1.0, 4.0], dtype=torch.float64)  # anisotropic


def gaussian(scale=1.0):
    def energy_grad(theta):
        diff = theta - MEAN
        return scale * 0.5 * (diff.square() / VAR).sum(-1), scale * diff / VAR

    return energy_grad


def last_draws(energy_grad, S=400):
    theta0 = torch.zeros(S, 3, dtype=torch.float64)
    samples, info = mhmc(energy_grad, theta0, 60, num_warmup=300, leapfrog_steps=10)
    return samples[-1], info


def test_reference_recovers_an_anisotropic_gaussian_at_the_target_acceptance():
    x, info = last_draws(gaussian())
    S = x.shape[0]
    for d in range(3):
        assert abs(float(x[:, d].mean() - MEAN[d])) < Z * math.sqrt(VAR[d] / S)
        assert abs(float(x[:, d].var() - VAR[d])) < Z * float(VAR[d]) * math.sqrt(2 / (S - 1))
    # Target 0.8. Dual averaging's averaged step is conservative after a short warm-up
    # (0.90 after 300 warm-up proposals here, 0.85 after 1,000), never aggressive.
    assert 0.75 < info["accept_rate"] < 0.95
    assert info["divergences"] == 0


def test_check_fails_with_a_wrong_energy():
    x, _ = last_draws(gaussian(scale=2.0))  # the posterior of twice the energy: half the var
    S = x.shape[0]
    ok = all(
        abs(float(x[:, d].var() - VAR[d])) < Z * float(VAR[d]) * math.sqrt(2 / (S - 1))
        for d in range(3)
    )
    assert not ok


def test_pooled_energy_is_the_full_data_negative_log_posterior():
    cfg = RunConfig(num_clients=4, partition="dirichlet", prior_std=2.0).resolve()
    target = build_problem(cfg.replace(dtype="float64")).target
    theta = 0.01 * torch.randn(2, target.dim, dtype=torch.float64)
    U, g = pooled_energy(target)(theta)
    # Direct: Σ over every training point of −log p(y|x, θ), plus ‖θ‖²/(2σ₀²).
    X = torch.cat([target.X[c, : int(target.counts[c])] for c in range(4)])
    y = torch.cat([target.y[c, : int(target.counts[c])] for c in range(4)])
    th = theta.clone().requires_grad_(True)
    lp = target.model.log_probs(th, X)
    direct = -lp.gather(-1, y.view(1, -1, 1).expand(2, -1, 1)).sum((1, 2))
    direct = direct + th.square().sum(-1) / (2 * 2.0**2)
    (gd,) = torch.autograd.grad(direct.sum(), th)
    torch.testing.assert_close(U, direct.detach(), rtol=1e-10, atol=1e-8)
    torch.testing.assert_close(g, gd, rtol=1e-10, atol=1e-8)


def test_reference_runs_on_a_logistic_regression_posterior():
    cfg = RunConfig(num_clients=2, partition="iid", dtype="float64").resolve()
    target = build_problem(cfg).target
    theta0 = torch.zeros(4, target.dim, dtype=torch.float64)
    samples, info = mhmc(
        pooled_energy(target), theta0, 20, num_warmup=60, leapfrog_steps=10, step_size=0.01
    )
    assert samples.shape == (20, 4, target.dim) and torch.isfinite(samples).all()
    assert 0.5 < info["accept_rate"] < 0.97


def test_bad_reference_settings():
    from fedhmc.errors import ConfigError

    with pytest.raises(ConfigError):
        mhmc(gaussian(), torch.zeros(2, 3), 0)
    with pytest.raises(ConfigError):
        mhmc(gaussian(), torch.zeros(2, 3), 5, target_accept=1.5)


def test_run_summary_reports_rhat_and_ess_across_chains(tmp_path):
    import json

    from fedhmc.cli.main import main

    args = ["run", "--rounds", "8", "--burn-in", "2", "--local-steps", "2", "--quiet"]
    assert main([*args, "--chains", "3", "--out", str(tmp_path / "a")]) == 0
    diag = json.loads((tmp_path / "a" / "summary.json").read_text())["diagnostics"]
    assert diag["chains"] == 3 and diag["samples_per_chain"] == 6
    assert diag["rhat_max"] >= 1.0 and diag["ess_min"] > 0
    assert main([*args, "--chains", "1", "--out", str(tmp_path / "b")]) == 0
    assert json.loads((tmp_path / "b" / "summary.json").read_text())["diagnostics"] is None
