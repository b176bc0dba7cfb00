"""FSGLD (fedhmc.algorithms.fsgld): the conducive gradient, the stationary law with exact and
inexact surrogates against the exact ones, the set-up phase, options, resume, and the
Flower apps against the engine."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch

from fedhmc.algorithms import federated, fsgld, registry
from fedhmc.analysis.linear_gaussian import stationary_random, ula_gaussian
from fedhmc.errors import ConfigError
from fedhmc.models.targets import hetero_gaussian
from fedhmc.runtime.config import RunConfig
from fedhmc.runtime.engine import run

N, D = 4, 2
ROUNDS, BURN, CHAINS = 500, 100, 400
SEEDS = 30


def _target():
    return hetero_gaussian(N, D, dtype=torch.float64)


def _shares(target):
    """(w_c, μ_c, A_c = w_c / v_c): U_c(θ) = ½ A_c (θ − μ_c)² per coordinate."""
    w, mu, v = (target.weights.numpy(), target.means.numpy(), target.variances.numpy())
    return w, mu, w / v


def _state_with(target, means, precisions, chains=CHAINS):
    """The state after a set-up that fitted the given surrogates (N,) (every chain and
    coordinate the same)."""
    shape = (chains, N, D)
    mu = torch.as_tensor(means, dtype=torch.float64).view(1, N, 1).expand(shape).clone()
    lam = torch.as_tensor(precisions, dtype=torch.float64).view(1, N, 1).expand(shape).clone()
    theta = torch.zeros(chains, D, dtype=torch.float64)
    kept = {"surrogate_mean": mu, "surrogate_precision": lam}  # (the clients keep theirs)
    clients = federated.ClientStore.empty(N).put(None, kept)
    return fsgld.State(theta, 0, lam.sum(1), (lam * mu).sum(1), clients)


def _run(settings, state, target, rounds=ROUNDS, seed=0):
    kept = []
    for r in range(rounds):
        state, info = fsgld.step(seed, state, target, settings)
        assert info.finite
        if r >= BURN:
            kept.append(state.position[:, 0].clone())
    return torch.stack(kept).numpy()


def _moments(x):
    """(mean, variance, their standard errors) over independent chains' time averages."""
    m, v = x.mean(0), x.var(0)
    n = x.shape[1]
    return m.mean(), v.mean(), m.std(ddof=1) / math.sqrt(n), v.std(ddof=1) / math.sqrt(n)


def test_the_conducive_gradient_is_unbiased_over_the_draw():
    # Over the draw of c with probability p_c, E[g] = Σ_c ∇U_c = ∇f, whatever the surrogates.
    g = torch.Generator().manual_seed(0)
    theta = torch.randn(5, generator=g, dtype=torch.float64)
    grads = torch.randn(N, 5, generator=g, dtype=torch.float64)  # Ĥ_c(θ) (any values)
    mean = torch.randn(N, 5, generator=g, dtype=torch.float64)
    lam = torch.rand(N, 5, generator=g, dtype=torch.float64) + 0.1
    p = torch.tensor([0.1, 0.2, 0.3, 0.4], dtype=torch.float64)
    sums = (lam.sum(0), (lam * mean).sum(0))
    expected = sum(
        p[c] * fsgld.conducive_gradient(grads[c], theta, (mean[c], lam[c], *sums), float(p[c]))
        for c in range(N)
    )
    torch.testing.assert_close(expected, grads.sum(0), rtol=1e-12, atol=1e-12)


def test_exact_surrogates_give_ula():
    target = _target()
    w, mu, A = _shares(target)
    gamma = 0.5
    settings = fsgld.Settings(step_size=gamma, local_steps=3)
    x = _run(settings, _state_with(target, mu, A), target)
    mean, var, se_m, se_v = _moments(x)
    post_mean = float((A * mu).sum() / A.sum())
    m, V = ula_gaussian(np.array([post_mean]), np.array([[A.sum()]]), gamma)
    # (The time variance over R draws is low by about V τ / R, τ ≤ 2/(γ ΣA) ≈ 4 rounds'
    # steps here: allowed for.)
    assert abs(mean - m[0]) < 5 * se_m, (mean, m)
    assert abs(var - V[0, 0]) < 5 * se_v + V[0, 0] * 4 / x.shape[0], (var, V)


def _exact_random_law(mu, A, lam, means, w, gamma, steps):
    """§11.4's law of θ for T steps of the conducive-gradient chain with client c drawn
    with probability w_c (1-d): θ' = a_c θ + b_c + noise, per draw."""
    draws = []
    for c in range(N):
        k = (A[c] - lam[c]) / w[c] + lam.sum()  # g(θ) = k θ − shift
        shift = (A[c] * mu[c] - lam[c] * means[c]) / w[c] + (lam * means).sum()
        a, b, var = 1.0, 0.0, 0.0
        for _ in range(steps):
            a, b, var = (
                (1 - gamma * k) * a,
                (1 - gamma * k) * b + gamma * shift,
                (1 - gamma * k) ** 2 * var + 2 * gamma,
            )
        draws.append((w[c], np.array([[a]]), np.array([b]), np.array([[var]])))
    m, V = stationary_random(draws)
    return float(m[0]), float(V[0, 0])


def test_inexact_surrogates_match_the_exact_law_of_their_chain():
    target = _target()
    w, mu, A = _shares(target)
    means, lam = mu + np.array([0.5, -0.3, 0.2, 0.0]), A * np.array([0.8, 1.3, 1.0, 0.6])
    gamma, steps = 0.3, 2
    settings = fsgld.Settings(step_size=gamma, local_steps=steps)
    # A run's chains share each round's drawn client, so they are not independent of one
    # another: each seed's run (its own draws) gives one independent estimate of the first
    # two moments, and the errors come from the spread over seeds.
    first, second = [], []
    for seed in range(SEEDS):
        x = _run(settings, _state_with(target, means, lam, chains=20), target, seed=seed)
        first.append(x.mean())
        second.append((x * x).mean())
    first, second = np.array(first), np.array(second)
    mean, moment2 = first.mean(), second.mean()
    se_m = first.std(ddof=1) / math.sqrt(SEEDS)
    se_2 = second.std(ddof=1) / math.sqrt(SEEDS)
    m, V = _exact_random_law(mu, A, lam, means, w, gamma, steps)
    assert abs(mean - m) < 5 * se_m, (mean, m, se_m)
    assert abs(moment2 - (V + m * m)) < 5 * se_2, (moment2 - mean**2, V, se_2)


def _set_up(target, settings, chains=CHAINS, seed=0):
    """The state after the set-up round (the clients' fits) from θ = 0."""
    state = fsgld.init(torch.zeros(chains, target.dim, dtype=torch.float64), settings)
    state, info = fsgld.step(seed, state, target, settings)
    assert info.finite
    return state


def test_the_fit_recovers_gaussian_shares_exactly():
    # U_c = ½ A_c ‖θ − μ_c‖² with A_c = w_c / v_c: the fit is exact from a short run that
    # has not mixed (50 steps of γ = 0.05 on a share whose relaxation time is 160 steps).
    # (The inverse variance of the run's second half overestimated A_c 2-30 times.)
    target = _target()
    w, mu, A = _shares(target)
    state = _set_up(target, fsgld.Settings(step_size=0.05, surrogate_steps=50), chains=8)
    kept = state.clients.arrays  # (what the clients keep: their surrogates)
    lam, means = kept["surrogate_precision"].numpy(), kept["surrogate_mean"].numpy()
    np.testing.assert_allclose(lam, np.broadcast_to(A[None, :, None], lam.shape), rtol=1e-6)
    np.testing.assert_allclose(means, np.broadcast_to(mu[None, :, None], means.shape), rtol=1e-6)


def test_fitted_surrogates_give_ula():
    # After the set-up the conducive gradient is ∇f for every draw: the chain is ULA on f
    # (before, the fitted precisions made some drawn clients' drift expansive: it diverged).
    target = _target()
    w, mu, A = _shares(target)
    gamma = 0.5
    settings = fsgld.Settings(step_size=gamma, local_steps=3, surrogate_steps=40)
    x = _run(settings, _set_up(target, settings), target)
    mean, var, se_m, se_v = _moments(x)
    m, V = ula_gaussian(np.array([float((A * mu).sum() / A.sum())]), np.array([[A.sum()]]), gamma)
    assert abs(mean - m[0]) < 5 * se_m, (mean, m)
    assert abs(var - V[0, 0]) < 5 * se_v + V[0, 0] * 4 / x.shape[0], (var, V)


class _CorrelatedShares:
    """Quadratic clients f^(c)(θ) = ½ (θ − m_c)ᵀ H_c (θ − m_c), H_c strongly correlated (as
    the two classes' weights of a softmax regression): a diagonal surrogate at the
    diagonal curvature, diag(w_c H_c), is not ⪯ w_c H_c."""

    def __init__(self, clients=3, dim=4):
        g = torch.Generator().manual_seed(1)
        self.num_clients, self.dim = clients, dim
        self.weights = torch.full((clients,), 1.0 / clients, dtype=torch.float64)
        h = []
        for _ in range(clients):
            x = torch.randn(dim // 2, dim // 2, generator=g, dtype=torch.float64)
            block = x @ x.T + torch.eye(dim // 2, dtype=torch.float64)
            pair = torch.tensor([[1.0, -1.0], [-1.0, 1.0]], dtype=torch.float64)
            h.append(torch.kron(pair, block) + 0.1 * torch.eye(dim, dtype=torch.float64))
        self.H = torch.stack(h)  # (N, D, D)
        self.m = torch.randn(clients, dim, generator=g, dtype=torch.float64)

    def grad(self, theta, keys, index, need_energy=True):
        diff = theta - self.m
        return torch.einsum("cij,scj->sci", self.H, diff), None


def test_the_fit_keeps_every_drift_contractive_on_correlated_shares():
    # Λ_c ⪯ A_c = w_c H_c for every client and chain (the Krylov basis spans the support
    # here, so the safety check is exact but for the round-off of its finite differences):
    # whatever the others' surrogates, a drawn client's drift (A_c − Λ_c)/p_c + Σ_j Λ_j
    # stays positive definite.
    target = _CorrelatedShares()
    A = target.weights.view(-1, 1, 1) * target.H
    assert (torch.linalg.eigvalsh(A - torch.diag_embed(torch.diagonal(A, 0, 1, 2)))[:, 0] < 0).all()
    settings = fsgld.Settings(step_size=0.01, surrogate_steps=40)
    state = _set_up(target, settings, chains=6)
    lam = state.clients.arrays["surrogate_precision"]
    assert (lam > 0).any() and (lam >= 0).all()
    gap = torch.linalg.eigvalsh(A.unsqueeze(0) - torch.diag_embed(lam))[..., 0]
    assert (gap > -1e-5 * A.abs().amax()).all(), gap.min()


def test_a_client_fits_alone_what_it_fits_among_all():
    # A client process (Flower) fits with its own seed exactly what the batched engine does.
    from fedhmc.algorithms import federated

    target = _target()
    settings = fsgld.Settings(step_size=0.05, surrogate_steps=24)
    message = fsgld.broadcast(3, fsgld.init(torch.zeros(5, D, dtype=torch.float64), settings),
                              settings, target.weights)  # fmt: skip
    seeds = federated.client_seeds(3, N)
    every = fsgld.client_update(message, target, settings, seeds)
    for c in range(N):
        alone = fsgld.client_update(message, target.subset([c]), settings, seeds[c : c + 1])
        for name in ("surrogate_mean", "surrogate_precision"):
            got, want = getattr(alone, name), getattr(every, name)[:, c : c + 1]
            torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)


def _cfg(tmp_path, name, **kw):
    base = dict(dataset="gaussian-hetero", dim=3, num_clients=4, chains=3, rounds=6,
                burn_in=1, step_size=0.05, dtype="float64", algorithm="fsgld",
                out=str(tmp_path / name))  # fmt: skip
    base.update(kw)
    return RunConfig(**base)


def test_the_set_up_is_counted_and_its_surrogates_kept(tmp_path):
    cfg = _cfg(tmp_path, "a", surrogate_steps=10, local_steps=2)
    result = run(cfg, progress=False)
    s = result.summary
    per = cfg.chains * 3 * 8  # one (S, D) float64 array of one client
    assert s["setup_rounds"] == 1 and s["setup_grad_evals"] == 10 * cfg.chains * 4
    assert s["setup_bytes_down"] == 4 * per and s["setup_bytes_up"] == 4 * 2 * per
    # Each round: one client, θ and the two sums down, θ up, T steps.
    row = result.history[0]
    assert (row["clients"], row["bytes_down"], row["bytes_up"]) == (1, 3 * per, per)
    assert row["grad_evals"] == s["setup_grad_evals"] + 2 * cfg.chains
    saved = json.loads((tmp_path / "a" / "config.json").read_text())
    assert saved["surrogate_steps"] == 10


@pytest.mark.parametrize(
    ("kw", "words"),
    [
        (dict(clients_per_round=2), "--clients-per-round is not an option of --algorithm fsgld"),
        (dict(surrogate_steps=1), "--surrogate-steps must be"),
    ],
)
def test_bad_options_are_refused_in_one_line(tmp_path, kw, words):
    with pytest.raises(ConfigError, match=words) as e:
        _cfg(tmp_path, "x").replace(**kw).resolve()
    assert "\n" not in str(e.value)


def test_fsgld_resumes_bit_exactly(tmp_path):
    kw = dict(rounds=8, checkpoint_every=1, surrogate_steps=6)
    whole = run(_cfg(tmp_path, "whole", **kw), progress=False)
    run(_cfg(tmp_path, "part", **{**kw, "rounds": 4}), progress=False)
    resumed = run(_cfg(tmp_path, "part", **kw).replace(resume=True), progress=False)
    assert torch.equal(whole.theta_bar, resumed.theta_bar)
    assert whole.history[-1]["grad_evals"] == resumed.history[-1]["grad_evals"]


def test_the_entry_declares_its_own_options():
    e = registry.entry("fsgld")
    assert {o.name for o in e.options} == {"step_size", "local_steps", "surrogate_steps"}


@pytest.mark.slow  # Flower
def test_flower_apps_equal_the_engine(tmp_path):
    from _grids import assert_same_chain, flower_run

    cfg = _cfg(tmp_path, "e", surrogate_steps=8, local_steps=2)
    engine = run(cfg, progress=False)
    flower, seen = flower_run(cfg.replace(out=str(tmp_path / "f")))
    assert_same_chain(engine, flower)
    assert flower.summary["setup_grad_evals"] == engine.summary["setup_grad_evals"]
    # The drawn client keeps its surrogate in its node state; the reply carries θ alone.
    assert seen.kept[-1] == {"surrogate_mean", "surrogate_precision"}
    assert seen.replies[-1] == {"theta"}
