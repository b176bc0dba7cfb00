"""Stale-gradient SGHMC and SGLD (fedhmc.algorithms.stale) against exact answers.

On a Gaussian energy U(θ) = Σ_i (θ_i − m)² / (2v) with exact gradients, a stale chain is a
linear recursion in (θ_l, …, θ_{l−τ}, q_l), so its exact stationary law per coordinate is
N(m, s²) with s² from the discrete Lyapunov equation Σ = A Σ Aᵀ + b bᵀ (solved below by
doubling). The samplers must match it to Monte Carlo error: with n independent values
(chains × coordinates) the mean has standard error √(s²/n) and the variance s²·√(2/(n−1));
tolerances are Z = 5 of them. Against the posterior N(m, v) the extra tolerance is the
derived discretisation bias |s² − v|.
"""

import dataclasses
import math

import numpy as np
import pytest
import torch

from fedhmc.algorithms import stale
from fedhmc.algorithms.oracles import from_grad
from fedhmc.algorithms.stale import chain_keys, delays
from fedhmc.core import rng
from fedhmc.core.streams import STREAM_STALE_NOISE
from fedhmc.errors import ConfigError

Z = 5.0
M, V = 2.0, 0.5


def gaussian_grad(theta, step):
    return (theta - M) / V


def advance(state, grad, steps, s, seed):
    """``steps`` steps of the chain through the algorithm interface."""
    return stale.step(seed, state, from_grad(grad), dataclasses.replace(s, local_steps=steps))[0]


def exact_stationary_var(s: stale.Settings) -> float:
    """Stationary variance of θ for the stale linear recursion on U = (θ − M)²/(2V)."""
    tau, h, B, a = s.staleness, s.step_size, s.friction, 1.0 / (V * s.temperature)
    n = tau + 2  # state (θ_l, θ_{l−1}, …, θ_{l−τ}, q_l)
    A, b = np.zeros((n, n)), np.zeros(n)
    if s.method == "sghmc":
        # q' = (1 − Bh) q − h a θ_{l−τ} + √(2Bh) ζ ;  θ' = θ + h q'
        A[n - 1, n - 1], A[n - 1, tau] = 1 - B * h, -h * a
        b[n - 1] = math.sqrt(2 * B * h)
        A[0, 0] = 1.0
        A[0, :] += h * A[n - 1, :]
        b[0] = h * b[n - 1]
    else:
        A[0, 0], b[0] = 1.0, math.sqrt(2 * h)
        A[0, tau] -= h * a
    for i in range(1, tau + 1):
        A[i, i - 1] = 1.0
    sigma, power = np.outer(b, b), A.copy()
    for _ in range(60):  # Σ_∞ = Σ_k A^k b bᵀ A^kᵀ, by doubling
        sigma = sigma + power @ sigma @ power.T
        power = power @ power
    return float(sigma[0, 0])


def run_chain(s: stale.Settings, steps: int, chains: int = 1000, dim: int = 4, seed: int = 0):
    theta0 = torch.full((chains, dim), M, dtype=torch.float64)
    state = advance(stale.init(theta0, s), gaussian_grad, steps, s, seed)
    return state.position.flatten()


@pytest.mark.parametrize("method", ["sgld", "sghmc"])
@pytest.mark.parametrize("tau", [0, 5])
def test_recovers_the_gaussian_posterior(method, tau):
    h = (0.02 if method == "sgld" else 0.1) / (1 + tau)  # staleness needs a smaller step
    s = stale.Settings(method, h, friction=2.0, staleness=tau)
    s2 = exact_stationary_var(s)
    x = run_chain(s, 1500)
    n = x.numel()
    assert abs(float(x.mean()) - M) < Z * math.sqrt(s2 / n)
    assert abs(float(x.var()) - s2) < Z * s2 * math.sqrt(2 / (n - 1))
    # Against the posterior itself: Monte Carlo error plus the derived bias |s² − V|.
    assert abs(float(x.var()) - V) < Z * s2 * math.sqrt(2 / (n - 1)) + abs(s2 - V)
    assert abs(s2 - V) < 0.1 * V  # the step sizes are small enough for that to mean something


def test_check_fails_when_the_staleness_is_ignored():
    # Large τ at a step size where it matters: a sampler that used fresh gradients would
    # have the τ = 0 variance, which the τ = 10 law excludes.
    stale_s = stale.Settings("sgld", 0.05, staleness=10)
    fresh = stale.Settings("sgld", 0.05, staleness=0)
    s2_stale, s2_fresh = exact_stationary_var(stale_s), exact_stationary_var(fresh)
    x = run_chain(fresh, 1500)
    n = x.numel()
    assert abs(float(x.var()) - s2_stale) > Z * s2_stale * math.sqrt(2 / (n - 1))
    assert abs(float(x.var()) - s2_fresh) < Z * s2_fresh * math.sqrt(2 / (n - 1))


@pytest.mark.parametrize("method", ["sgld", "sghmc"])
def test_zero_staleness_is_the_plain_sampler_exactly(method):
    s = stale.Settings(method, 0.05, friction=3.0, temperature=0.7)
    S, D, steps = 3, 5, 20
    keys = chain_keys(4, S)
    theta0 = torch.randn(S, D, dtype=torch.float64)
    got = advance(stale.init(theta0, s), gaussian_grad, steps, s, 4).position
    # Plain SGHMC / SGLD written out directly.
    theta, q = theta0.clone(), torch.zeros_like(theta0)
    nk = rng.derive(keys, STREAM_STALE_NOISE)
    for step in range(steps):
        g = gaussian_grad(theta, step) * (1.0 / 0.7)
        z = rng.normal(nk, step, D, torch.float64)
        if method == "sghmc":
            q = (1 - 3.0 * 0.05) * q - 0.05 * g + math.sqrt(2 * 3.0 * 0.05) * z
            theta = theta + 0.05 * q
        else:
            theta = theta - 0.05 * g + math.sqrt(2 * 0.05) * z
    assert torch.equal(got, theta)


@pytest.mark.parametrize("dist", ["fixed", "uniform"])
def test_each_gradient_is_taken_where_the_chain_was_tau_l_steps_before(dist):
    tau, steps = 3, 12
    s = stale.Settings("sghmc", 0.1, friction=1.0, staleness=tau, staleness_dist=dist)
    keys = chain_keys(1, 2)
    seen = {}

    def recording_grad(theta, step):
        seen[step] = theta.clone()
        return gaussian_grad(theta, step)

    state = stale.init(torch.randn(2, 3, dtype=torch.float64), s)
    positions = [state.position.clone()]
    for _ in range(steps):  # one step at a time, to record every position
        state = advance(state, recording_grad, 1, s, 1)
        positions.append(state.position.clone())
    used = set()
    for step in range(steps):
        tau_l = delays(keys, step, s)
        assert int(tau_l.min()) >= 0 and int(tau_l.max()) <= tau
        for c in range(2):
            lag = int(tau_l[c])
            used.add(lag)
            expected = positions[max(step - lag, 0)][c]
            assert torch.equal(seen[step][c], expected), (step, c, lag)
    if dist == "fixed":
        assert used == {tau}
    else:
        assert len(used) > 1  # the delays really vary


def test_rounds_equal_one_run():
    """Round r takes Euler steps r·T … r·T + T − 1: five rounds of 5 steps are the chain of
    one round of 25, and ``round`` counts the ``step`` calls."""
    s = stale.Settings("sghmc", 0.05, friction=2.0, staleness=4, staleness_dist="uniform")
    start = stale.init(torch.zeros(3, 2, dtype=torch.float64), s)
    once = advance(start, gaussian_grad, 25, s, 9)
    chunked = start
    for _ in range(5):
        chunked = advance(chunked, gaussian_grad, 5, s, 9)
    assert torch.equal(once.position, chunked.position)
    assert torch.equal(once.momentum, chunked.momentum) and torch.equal(once.ring, chunked.ring)
    assert once.round == 1 and chunked.round == 5


@pytest.mark.parametrize(
    "kwargs,needle",
    [
        (dict(method="nope", step_size=0.1), "method"),
        (dict(method="sgld", step_size=0.0), "--step-size must be"),
        (dict(method="sghmc", step_size=0.1, friction=-1.0), "friction"),
        (dict(method="sghmc", step_size=0.5, friction=3.0), "friction"),
        (dict(method="sgld", step_size=0.1, staleness=-1), "staleness"),
        (dict(method="sgld", step_size=0.1, staleness_dist="gamma"), "--staleness-dist must be"),
    ],
)
def test_bad_settings_give_one_line(kwargs, needle):
    with pytest.raises(ConfigError, match=needle) as e:
        stale.Settings(**kwargs)
    assert "\n" not in str(e.value)


def test_fedhmc_run_sghmc_and_sgld_on_data_and_gaussians(tmp_path):
    import json

    from fedhmc.cli.main import main

    for algo in ("sghmc", "sgld"):
        out = tmp_path / algo
        args = ["run", "--algorithm", algo, "--staleness", "2", "--rounds", "3"]
        assert (
            main([*args, "--local-steps", "4", "--chains", "2", "--quiet", "--out", str(out)]) == 0
        )
        cfg = json.loads((out / "config.json").read_text())
        assert cfg["num_clients"] == 1 and cfg["staleness"] == 2  # the pooled data
        summary = json.loads((out / "summary.json").read_text())
        assert summary["status"] == "completed" and summary["grad_evals"] == 3 * 4 * 2
        assert summary["bytes_total"] == 0 and 0.0 <= summary["final"]["accuracy"] <= 1.0
    out = tmp_path / "g"
    g = ["run", "--dataset", "gaussian-hetero", "--algorithm", "sgld", "--dim", "3"]
    assert main([*g, "--rounds", "2", "--chains", "4", "--quiet", "--out", str(out)]) == 0
    assert "w2" in (out / "metrics.csv").read_text().splitlines()[0]


@pytest.mark.parametrize(
    "args,needle",
    [
        (["--staleness", "3"], "is not an option of --algorithm fahmc"),
        (["--algorithm", "sghmc", "--backend", "flower"], "engine only"),
        (["--algorithm", "sgld", "--leapfrog-steps", "4"], "is not an option of --algorithm sgld"),
        (["--algorithm", "sghmc", "--staleness", "-1"], "--staleness"),
    ],
)
def test_bad_stale_options_exit_with_one_line(args, needle, capsys, tmp_path):
    from fedhmc.cli.main import main

    assert main(["run", *args, "--rounds", "1", "--quiet", "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and needle in err[0], err


def test_stale_experiments_quick(tmp_path):
    import json

    from fedhmc.experiments.stale_gaussian import stale_gaussian
    from fedhmc.experiments.stale_variance import stale_variance

    rows = stale_gaussian(tmp_path / "g", quick=True)["rows"]
    mse = [r["mse"] for r in rows]
    assert [r["tau"] for r in rows] == [1, 2, 5] and all(m > 0 for m in mse)
    # Chen et al.'s finding at L = L0·τ: about the same MSE whatever the staleness.
    assert max(mse) / min(mse) < 3.0
    assert (tmp_path / "g" / "stale_gaussian.png").stat().st_size > 1000
    stale_variance(tmp_path / "v", quick=True)
    summary = json.loads((tmp_path / "v" / "stale_variance.json").read_text())
    assert [r["workers"] for r in summary["rows"]] == [1, 2, 4]
    assert all(r["variance"] > 0 for r in summary["rows"])
    assert "a9a" in summary["data"]
