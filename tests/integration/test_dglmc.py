"""DG-LMC (fedhmc.algorithms.dglmc): the θ-marginal against the exact linear-Gaussian law
(ALGORITHMS §11.4) and its limits, options, resume, and the Flower apps against the
engine."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch

from fedhmc.algorithms import dglmc, registry
from fedhmc.analysis.linear_gaussian import stationary_fixed
from fedhmc.errors import ConfigError
from fedhmc.models.targets import hetero_gaussian
from fedhmc.runtime.config import RunConfig
from fedhmc.runtime.engine import run

N, DIM = 4, 2


def _compose(first, then):
    """The affine map with noise x ↦ M x + c + L ξ (as (M, c, LLᵀ)) of ``first`` then
    ``then``."""
    m1, c1, s1 = first
    m2, c2, s2 = then
    return m2 @ m1, m2 @ c1 + c2, m2 @ s1 @ m2.T + s2


def _power(step, times: int):
    """``step`` applied ``times`` times (by squaring)."""
    n = step[0].shape[0]
    out = (np.eye(n), np.zeros(n), np.zeros((n, n)))
    while times:
        if times & 1:
            out = _compose(out, step)
        step = _compose(step, step)
        times >>= 1
    return out


def _shares(target):
    """(A_c, μ_c) per coordinate: U_c(z) = A_c (z − μ_c)² / 2, A_c = w_c / v_c."""
    w, mu, v = (t.numpy() for t in (target.weights, target.means, target.variances))
    return w / v, mu


def _round_map(target, gamma: float, steps: int, rho: float):
    """(M, c, LLᵀ) of one round on the stacked state x = (θ, z_1 … z_N) of one coordinate:
    θ ← z̄ + √(ρ/N) ξ, then L steps z_c ← (1 − γA_c − γ/ρ) z_c + (γ/ρ) θ + γ A_c μ_c + √(2γ) ξ."""
    A, mu = _shares(target)
    n = len(A) + 1
    draw_m = np.zeros((n, n))
    draw_m[0, 1:] = 1 / len(A)
    draw_m[1:, 1:] = np.eye(len(A))
    draw_s = np.zeros((n, n))
    draw_s[0, 0] = rho / len(A)
    step_m = np.eye(n)
    step_m[1:, 1:] = np.diag(1 - gamma * A - gamma / rho)
    step_m[1:, 0] = gamma / rho
    step_c = np.concatenate([[0.0], gamma * A * mu])
    step_s = np.diag(np.concatenate([[0.0], np.full(len(A), 2 * gamma)]))
    return _compose((draw_m, np.zeros(n), draw_s), _power((step_m, step_c, step_s), steps))


def _exact(target, gamma, steps, rho):
    """(mean, variance) of θ under the stationary law of §11.4, and M's spectral radius."""
    M, c, LLt = _round_map(target, gamma, steps, rho)
    m, V = stationary_fixed(M, c, LLt)
    return float(m[0]), float(V[0, 0]), float(np.max(np.abs(np.linalg.eigvals(M))))


def _gibbs(target, rho):
    """§11.3's θ-marginal of exact Gibbs: N(m_ρ, P_ρ⁻¹), P_ρ = Σ_c (A_c⁻¹ + ρ)⁻¹."""
    A, mu = _shares(target)
    k = 1 / (1 / A + rho)
    return float((k * mu).sum() / k.sum()), float(1 / k.sum())


def _chain(settings, rounds, burn, chains, seed=0):
    """θ of every chain and coordinate after ``burn`` rounds: (rounds − burn, chains · d);
    the coordinates are independent, so each column is a chain."""
    target = hetero_gaussian(N, DIM, dtype=torch.float64)
    state = dglmc.init(torch.zeros(chains, DIM, dtype=torch.float64), settings)
    kept = []
    for r in range(rounds):
        state, info = dglmc.step(seed, state, target, settings)
        assert info.finite and info.grad_evals == settings.local_steps * chains * N
        if r >= burn:
            kept.append(state.position.reshape(-1).clone())
    return torch.stack(kept).numpy(), target


def _moments_with_errors(x: np.ndarray):
    """(mean, variance, their standard errors) of draws (rounds, chains). The variance is
    each chain's mean squared deviation from the pooled mean (not its own), which a short
    chain does not underestimate; the chains are independent, so each chain's averages are
    one draw each (batch means)."""
    per_chain_mean = x.mean(0)
    per_chain_sq = ((x - x.mean()) ** 2).mean(0)
    n = x.shape[1]
    return (
        per_chain_mean.mean(),
        per_chain_sq.mean(),
        per_chain_mean.std(ddof=1) / math.sqrt(n),
        per_chain_sq.std(ddof=1) / math.sqrt(n),
    )


def test_the_theta_marginal_is_the_exact_linear_gaussian_law():
    # ρ = 2, γ = 0.5, L = 5 on 4 clients: the finite step widens the θ-marginal by about
    # 10% over exact Gibbs's P_ρ⁻¹, which the test tells apart.
    gamma, steps, rho, rounds, burn, chains = 0.5, 5, 2.0, 250, 70, 500
    settings = dglmc.Settings(step_size=gamma, local_steps=steps, coupling=rho)
    x, target = _chain(settings, rounds, burn, chains)
    mean, var, se_mean, se_var = _moments_with_errors(x)
    m, v, radius = _exact(target, gamma, steps, rho)
    # The pooled mean is estimated from R·C draws: the squared deviations from it fall
    # short of v by about v·τ/(R·C), τ = (1 + r)/(1 − r) the autocorrelation time bound.
    bias = v * (1 + radius) / (1 - radius) / x.size
    assert radius**burn * 20 < 1e-6  # the start (0, 20 from the law's mean) is forgotten
    assert abs(mean - m) < 5 * se_mean, (mean, m, se_mean)
    assert abs(var - v) < 5 * se_var + bias, (var, v, se_var)
    _, v_gibbs = _gibbs(target, rho)
    assert abs(var - v_gibbs) > 5 * se_var + bias, (var, v_gibbs)  # the law is γ's
    print(f"DG-LMC θ: mean {mean:.4f} ± {se_mean:.4f} (exact {m:.4f}), "
          f"variance {var:.4f} ± {se_var:.4f} (exact {v:.4f}; Gibbs {v_gibbs:.4f})")  # fmt: skip


@pytest.mark.parametrize("rho", [0.5, 2.0])
def test_small_steps_give_exact_gibbs(rho):
    target = hetero_gaussian(N, DIM, dtype=torch.float64)
    m_rho, v_rho = _gibbs(target, rho)
    errors = []
    for gamma in (1e-3, 1e-4):  # L γ = 20: each copy forgets its start within a round
        m, v, _ = _exact(target, gamma, round(20 / gamma), rho)
        assert m == pytest.approx(m_rho, rel=1e-9)
        errors.append(abs(v - v_rho) / v_rho)
    assert errors[0] < 1e-3 and errors[1] < errors[0] / 5, errors  # O(γ)


def test_small_coupling_gives_the_posterior():
    target = hetero_gaussian(N, DIM, dtype=torch.float64)
    post = target.posterior()
    for rho in (1e-2, 1e-4):
        m_rho, v_rho = _gibbs(target, rho)
        assert m_rho == pytest.approx(post.mean, rel=2 * rho)
        assert v_rho == pytest.approx(post.var, rel=2 * rho)
    # The chain's own law at a small ρ (γ ≪ ρ, L γ = 100 ρ) is the posterior's too.
    m, v, _ = _exact(target, 1e-5, 100_000, 1e-2)
    assert m == pytest.approx(post.mean, rel=2e-2) and v == pytest.approx(post.var, rel=2e-2)


def _cfg(tmp_path, name, **kw):
    base = dict(dataset="gaussian-hetero", algorithm="dglmc", dim=3, num_clients=4, chains=3,
                rounds=8, burn_in=2, step_size=0.1, local_steps=3, coupling=0.5,
                dtype="float64", out=str(tmp_path / name))  # fmt: skip
    base.update(kw)
    return RunConfig(**base)


def test_the_entry_declares_its_own_options():
    e = registry.entry("dglmc")
    assert {o.name for o in e.options} == {"step_size", "local_steps", "coupling"}
    assert not e.partial_participation and not e.leapfrog


def test_a_run_config_takes_the_coupling(tmp_path):
    cfg = RunConfig(algorithm="dglmc", dataset="gaussian-hetero", coupling=0.5).resolve()
    settings = registry.entry("dglmc").build_settings(cfg)
    assert settings.coupling == 0.5 and settings.local_steps == cfg.local_steps


@pytest.mark.parametrize(
    ("kw", "words"),
    [
        (dict(coupling=0.0), "--coupling must be a number > 0"),
        (dict(coupling=-1.0), "--coupling must be a number > 0"),
        (dict(step_size=1.0), "must be below 2 × --coupling"),
        (dict(clients_per_round=2), "--clients-per-round is not an option of --algorithm dglmc"),
        (dict(quantization_levels=4.0), "--quantization-levels is not an option"),
        (dict(leapfrog_steps=3), "--leapfrog-steps is not an option of --algorithm dglmc"),
    ],
)
def test_bad_options_are_refused_in_one_line(tmp_path, kw, words):
    with pytest.raises(ConfigError, match=words) as e:
        _cfg(tmp_path, "x").replace(**kw).resolve()
    assert "\n" not in str(e.value)
    if "is not an option" in str(e.value):
        assert "(its options: --step-size, --local-steps, --coupling)" in str(e.value)


def test_options_read_back_from_config_json(tmp_path):
    result = run(_cfg(tmp_path, "a", coupling=0.25), progress=False)
    saved = (tmp_path / "a" / "config.json").read_text()
    assert '"coupling": 0.25' in saved
    again = RunConfig.from_mapping(json.loads(saved))
    assert again.option("coupling") == 0.25 and again.local_steps == 3
    # Round 1 sends θ and θ₀, the others θ alone; every round each client's z_c comes back.
    per = 4 * 3 * 3 * 8
    assert [h["bytes_down"] for h in result.history[:2]] == [2 * per, per]
    assert all(h["bytes_up"] == per for h in result.history)
    evals = [h["grad_evals"] for h in result.history]  # cumulative: L S N a round
    assert evals == [3 * 3 * 4 * r for r in range(1, len(evals) + 1)]


def test_resumes_bit_exactly(tmp_path):
    kw = dict(rounds=10, checkpoint_every=1)
    whole = run(_cfg(tmp_path, "whole", **kw), progress=False)
    run(_cfg(tmp_path, "part", **{**kw, "rounds": 5}), progress=False)
    resumed = run(_cfg(tmp_path, "part", **kw).replace(resume=True), progress=False)
    assert torch.equal(whole.theta_bar, resumed.theta_bar)
    a = (tmp_path / "whole" / "metrics.csv").read_text().splitlines()
    b = (tmp_path / "part" / "metrics.csv").read_text().splitlines()
    cols = a[0].split(",")
    keep = [i for i, c in enumerate(cols) if "wall" not in c and "time" not in c]
    for ra, rb in zip(a[1:], b[1:], strict=True):
        x, y = ra.split(","), rb.split(",")
        assert [x[i] for i in keep] == [y[i] for i in keep]


@pytest.mark.slow  # Flower
def test_flower_apps_equal_the_engine(tmp_path):
    from _grids import assert_same_chain, flower_run

    cfg = _cfg(tmp_path, "e")
    engine = run(cfg, progress=False)
    flower, seen = flower_run(cfg.replace(out=str(tmp_path / "f")))
    rounds = [s for s in seen.sent if "theta" in s]
    assert rounds[: cfg.num_clients] == [{"theta", "start"}] * cfg.num_clients
    assert all(s == {"theta"} for s in rounds[cfg.num_clients :])
    # The reply carries z_c, which the node keeps in its state between rounds.
    assert {frozenset(r) for r in seen.replies} == {frozenset({"z"})}
    assert seen.kept[-1] == {"z"}
    assert_same_chain(engine, flower)
