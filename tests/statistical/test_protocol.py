"""The authors' protocol (``--sync-unit leapfrog`` and its companions) against references
written here, independently of the sampler's code.

1. On Gaussian clients the protocol is a linear-Gaussian recursion of the clients'
   (position, momentum) pairs, one coordinate at a time. `exact_moments` propagates
   its mean and covariance step by step (momentum draws, leapfrog steps with one or two
   gradients each, the averaging of positions and momenta every T leapfrog steps on a
   global counter) until they stop changing: the exact stationary law of the sampled θ̄.
   The engine, run with many chains, must match it to Monte Carlo error (Z standard errors,
   from S·d independent draws of the last round).
2. T a multiple of K is Algorithm 3 with T/K iterations per round: bit for bit.
3. Random reshuffling visits every example exactly once per pass.
4. Under the authors' options each client's energy is (n/τ) × the mean minibatch
   cross-entropy, with n the total training size and no prior term.
"""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from fedhmc.algorithms import fahmc
from fedhmc.algorithms.fahmc import data_keys
from fedhmc.core import rng
from fedhmc.models.nets import LogisticRegression
from fedhmc.models.targets import DataTarget, hetero_gaussian
from fedhmc.runtime.config import RunConfig
from fedhmc.runtime.engine import run
from fedhmc.runtime.loop import is_collect_round, sampler_settings
from fedhmc.runtime.problem import build_problem, initial_position

Z = 5.0


# --------------------------------------------------------------- the exact reference
def exact_moments(means, variances, weights, eta, K, T, rho, noise=0.0, fresh=False):
    """Stationary mean and variance of θ̄ (one coordinate) at the protocol's sample times.

    State x = (θ_1 … θ_N, p_1 … p_N), carried with its mean m and covariance C. A
    trajectory starts every K global leapfrog steps (momentum replaced by
    √ρ ξ + √(1−ρ) ξ_c/√w_c), positions and momenta are averaged every T steps, and a sample
    is θ̄ after every lcm(T, K) steps. Gradients are a_c (θ − μ_c) (+ σ ε, ε fresh for each
    evaluation; with reused gradients the noise of g_{k+1} carries into the next step, so
    it is part of the state: x gains g_1 … g_N).
    """
    N = len(means)
    a = [1.0 / v for v in variances]
    w = torch.tensor(weights, dtype=torch.float64)
    n_state = 3 * N  # θ, p, g (the last gradient, used when gradients are reused)
    th, pp, gg = slice(0, N), slice(N, 2 * N), slice(2 * N, 3 * N)
    m = torch.zeros(n_state, dtype=torch.float64)
    C = torch.zeros(n_state, n_state, dtype=torch.float64)
    A = torch.tensor(a, dtype=torch.float64)
    mu = torch.tensor(means, dtype=torch.float64)

    def affine(M, c, L=None):
        nonlocal m, C
        m = M @ m + c
        C = M @ C @ M.T
        if L is not None:
            C = C + L @ L.T

    eye = torch.eye(n_state, dtype=torch.float64)

    def gradient_into_g():
        # g ← a(θ − μ) + σ ε
        M = eye.clone()
        M[gg, :] = 0.0
        M[gg, th] = torch.diag(A)
        c = torch.zeros(n_state, dtype=torch.float64)
        c[gg] = -A * mu
        L = torch.zeros(n_state, N, dtype=torch.float64)
        L[gg, :] = noise * torch.eye(N, dtype=torch.float64)
        affine(M, c, L)

    def step():
        if fresh:
            gradient_into_g()
        # θ ← θ + η p − η²/2 g
        M = eye.clone()
        M[th, pp] = eta * torch.eye(N, dtype=torch.float64)
        M[th, gg] = -0.5 * eta * eta * torch.eye(N, dtype=torch.float64)
        affine(M, torch.zeros(n_state, dtype=torch.float64))
        # p ← p − η/2 g   (first half, with the old gradient)
        M = eye.clone()
        M[pp, gg] = -0.5 * eta * torch.eye(N, dtype=torch.float64)
        affine(M, torch.zeros(n_state, dtype=torch.float64))
        gradient_into_g()  # g at the new position
        M = eye.clone()
        M[pp, gg] = -0.5 * eta * torch.eye(N, dtype=torch.float64)
        affine(M, torch.zeros(n_state, dtype=torch.float64))

    def new_trajectory():
        nonlocal m, C
        keep = eye.clone()
        keep[pp, pp] = 0.0
        affine(keep, torch.zeros(n_state, dtype=torch.float64))
        cov = rho * torch.ones(N, N, dtype=torch.float64) + (1 - rho) * torch.diag(1.0 / w)
        C[pp, pp] = cov
        if not fresh:
            gradient_into_g()  # the trajectory's first gradient, at its start

    def average():
        M = eye.clone()
        M[th, th] = w.expand(N, N)
        M[pp, pp] = w.expand(N, N)
        affine(M, torch.zeros(n_state, dtype=torch.float64))
        if not fresh:
            gradient_into_g()  # a reused gradient is recomputed at the averaged position

    period = K * T // math.gcd(K, T)
    steps = 0
    prev = None
    for _ in range(100_000):
        for _ in range(period):
            if steps % K == 0:
                new_trajectory()
            step()
            steps += 1
            if steps % T == 0:
                average()
        mean = float(w @ m[th])
        var = float(w @ C[th, th] @ w)
        if prev is not None and abs(mean - prev[0]) < 1e-12 and abs(var - prev[1]) < 1e-12:
            return mean, var, steps
        prev = (mean, var)
    raise AssertionError("the exact moments did not converge")


def within(samples, mean, var):
    n = samples.numel()
    dm = abs(float(samples.mean()) - mean)
    dv = abs(float(samples.var()) - var)
    m_tol = Z * math.sqrt(var / n)
    v_tol = Z * var * math.sqrt(2 / (n - 1))
    return dm < m_tol and dv < v_tol, (dm, m_tol, dv, v_tol)


CHAINS, DIM = 1000, 4


@pytest.mark.parametrize(
    "T,K,rho,noise,fresh",
    [
        (5, 3, 1.0, 0.0, True),  # T not a multiple of K: syncs mid-trajectory
        (3, 5, 0.5, 0.0, False),  # T < K, reused gradients, partial momentum sharing
        (6, 3, 1.0, 2.0, True),  # T a multiple of K, noisy fresh gradients
        (4, 6, 1.0, 2.0, False),  # noisy reused gradients: the noise carries across steps
    ],
)
def test_leapfrog_sync_matches_the_exact_stationary_law(T, K, rho, noise, fresh):
    eta = 0.15
    target = hetero_gaussian(4, DIM, dtype=torch.float64)
    means, variances = target.means.tolist(), target.variances.tolist()
    mean, var, steps = exact_moments(
        means, variances, target.weights.tolist(), eta, K, T, rho, noise, fresh
    )
    s = fahmc.Settings(
        eta, K, T, rho=rho, grad_noise=noise, sync_unit="leapfrog", fresh_gradients=fresh
    )
    # Rounds: as many as the reference needed to converge to 1e-12, rounded up to a
    # sample time (a multiple of lcm(T, K) leapfrog steps).
    period = K * T // math.gcd(K, T) // T
    rounds = max(period, math.ceil(steps / T / period) * period)
    state = fahmc.init(torch.zeros(CHAINS, DIM, dtype=torch.float64), s)
    for _ in range(rounds):
        state, _ = fahmc.step(7, state, target, s)
    assert s.ends_trajectory(rounds)
    ok, detail = within(state.position.flatten(), mean, var)
    assert ok, (mean, var, detail)
    # The law is the protocol's own: it differs from Algorithm 3's and from the posterior.
    post = target.posterior()
    assert abs(mean - post.mean) > 1e-3 or abs(var - post.var) > 1e-3


def test_the_exact_reference_is_sharp_enough_to_fail():
    """A wrong protocol (momenta not averaged) must be rejected by the same tolerance."""
    target = hetero_gaussian(4, DIM, dtype=torch.float64)
    T, K, eta = 5, 3, 0.15
    mean, var, steps = exact_moments(
        target.means.tolist(),
        target.variances.tolist(),
        target.weights.tolist(),
        eta,
        K,
        T,
        1.0,
        fresh=True,
    )
    s = fahmc.Settings(eta, K, T, sync_unit="leapfrog", fresh_gradients=True)
    theta, rounds = torch.zeros(CHAINS, DIM, dtype=torch.float64), 3 * math.ceil(steps / 15)
    # Drop the averaged momentum: every client keeps its own (here: the average is never
    # passed back, so a mid-trajectory round restarts from a zero momentum instead).
    state = fahmc.init(theta, s)
    for _ in range(rounds):
        state = dataclasses.replace(state, momentum=torch.zeros_like(theta))
        state, _ = fahmc.step(7, state, target, s)
    ok, _ = within(state.position.flatten(), mean, var)
    assert not ok


# ----------------------------------------------------------- reduction to Algorithm 3
@pytest.mark.parametrize("minibatch", ["uniform", "reshuffle"])
@pytest.mark.parametrize("fresh", [False, True])
def test_T_a_multiple_of_K_is_algorithm3_bit_for_bit(tmp_path, minibatch, fresh):
    common = dict(
        dataset="digits",
        num_clients=3,
        rounds=4,
        burn_in=0,
        chains=2,
        leapfrog_steps=3,
        rho=0.5,
        minibatch=minibatch,
        fresh_gradients=fresh,
        grad_noise=0.5,
    )
    lf = run(
        RunConfig(**common, sync_unit="leapfrog", local_steps=6, out=str(tmp_path / "lf")),
        progress=False,
    )
    it = run(
        RunConfig(**common, sync_unit="iteration", local_steps=2, out=str(tmp_path / "it")),
        progress=False,
    )
    assert torch.equal(lf.theta_bar, it.theta_bar)
    assert [r["nll_sum"] for r in lf.history] == [r["nll_sum"] for r in it.history]
    assert [r["grad_evals"] for r in lf.history] == [r["grad_evals"] for r in it.history]


def test_evaluation_counts_and_sample_rounds():
    for K, T in [(3, 5), (4, 2), (10, 50), (100, 50), (1, 7), (6, 6)]:
        for fresh in (False, True):
            s = fahmc.Settings(0.1, K, T, sync_unit="leapfrog", fresh_gradients=fresh)
            total = 0
            for r in range(1, 40):
                assert s.evals_before(r) == total
                segs = s.segments(r)
                assert sum(g.steps for g in segs) == T
                n_new = sum(g.new_trajectory for g in segs)
                assert n_new == sum(((r - 1) * T + o) % K == 0 for o in range(T))
                per_step = 2 * T if fresh else T + len(segs)
                assert s.evals_in_round(r) == per_step
                total += per_step
                assert s.ends_trajectory(r) == ((r * T) % K == 0)
                assert s.starts_mid_trajectory(r) == (((r - 1) * T) % K != 0)
    # Algorithm 3: T(K + 1) evaluations, 2TK with fresh gradients.
    assert fahmc.Settings(0.1, 4, 3).evals_in_round(5) == 15
    assert fahmc.Settings(0.1, 4, 3, fresh_gradients=True).evals_in_round(5) == 24
    # Restarts: a sample once per outer iteration of K rounds.
    s = fahmc.Settings(0.1, 4, 3, sync_unit="leapfrog", restart_trajectories=True)
    assert [r for r in range(1, 13) if s.ends_trajectory(r)] == [4, 8, 12]


def test_samples_are_taken_at_lcm_of_T_and_K_and_outputs_count_both_gradients(tmp_path):
    cfg = RunConfig(
        dataset="digits",
        num_clients=2,
        rounds=6,
        local_steps=4,
        leapfrog_steps=6,
        protocol="authors",
        step_size=1e-4,
        out=str(tmp_path / "r"),
    )
    res = run(cfg, progress=False)
    # lcm(4, 6) = 12 leapfrog steps = 3 rounds; no burn-in under the authors' protocol.
    assert [r["samples"] for r in res.history] == [0, 0, 1, 1, 1, 2]
    assert [is_collect_round(res.config, r) for r in range(1, 7)] == [0, 0, 1, 0, 0, 1]
    # Two fresh gradients per leapfrog step: 2 · T per client and round.
    assert res.history[0]["grad_evals"] == 2 * 4 * 2
    assert res.summary["protocol"]["name"] == "authors"
    assert res.summary["protocol"]["sync_unit"] == "leapfrog"
    assert res.summary["protocol"]["fresh_gradients"] is True
    assert res.summary["ece_bins"] == 20
    assert res.history[-1]["ece_bins"] == 20


# ----------------------------------------------------------------- random reshuffling
@pytest.mark.parametrize("batch", [4, 5, 8])
def test_reshuffling_visits_every_example_once_per_pass(batch):
    torch.manual_seed(0)
    sizes = (10, 7, 3, 16)
    parts = [(torch.randn(n, 3), torch.randint(0, 2, (n,))) for n in sizes]
    t = DataTarget(LogisticRegression(3, 2), parts, batch, math.inf, minibatch="reshuffle")
    keys = rng.derive(11, torch.arange(3 * len(sizes)).view(3, len(sizes)))
    passes = 3
    for c, n_c in enumerate(sizes):
        b_c = min(batch, n_c)
        per_pass = math.ceil(n_c / b_c)
        orders = []
        for e in range(passes):
            seen = []
            for j in range(e * per_pass, (e + 1) * per_pass):
                idx, sw = t.reshuffle_indices(keys, j)
                for s in range(3):
                    got = idx[s, c][sw[s, c] > 0].tolist()
                    if s == 0:
                        seen += got
                    size = len(got)
                    assert sw[s, c][sw[s, c] > 0].allclose(torch.full((size,), t.num_total / size))
            assert sorted(seen) == list(range(n_c)), (c, e)
            orders.append(seen)
        if n_c > 3:
            assert orders[0] != orders[1]  # a new permutation every pass
    # Deterministic per key: the same keys give the same batches.
    again = DataTarget(LogisticRegression(3, 2), parts, batch, math.inf, minibatch="reshuffle")
    assert torch.equal(again.reshuffle_indices(keys, 5)[0], t.reshuffle_indices(keys, 5)[0])


def test_a_pass_of_reshuffled_gradients_sums_to_the_full_gradient():
    torch.manual_seed(1)
    sizes = (11, 6)
    parts = [(torch.randn(n, 4, dtype=torch.float64), torch.randint(0, 3, (n,))) for n in sizes]
    model = LogisticRegression(4, 3)
    mb = DataTarget(model, parts, 4, math.inf, dtype=torch.float64, minibatch="reshuffle")
    full = DataTarget(model, parts, 0, math.inf, dtype=torch.float64)
    theta = torch.randn(1, 2, model.dim, dtype=torch.float64)
    keys = data_keys(torch.tensor([3, 4]), torch.arange(1))
    g_full, _ = full.grad(theta.clone(), keys, 0)
    for c, n_c in enumerate(sizes):
        per_pass = math.ceil(n_c / 4)
        acc = torch.zeros(model.dim, dtype=torch.float64)
        for j in range(per_pass):
            g, _ = mb.grad(theta.clone(), keys, j)
            size = min(4, n_c - 4 * j)
            acc += g[0, c] * size / n_c  # batch j weighs its share of the pass
        torch.testing.assert_close(acc, g_full[0, c])


# ------------------------------------------------------------- the authors' energy
def test_authors_energy_is_n_over_tau_times_mean_cross_entropy_without_prior():
    cfg = RunConfig(
        dataset="digits", num_clients=3, protocol="authors", batch_size=40, chains=1
    ).resolve()
    assert math.isinf(cfg.prior_std) and cfg.temperature == 0.005
    assert cfg.scaling == "symmetric" and cfg.init == "torch-linear"
    problem = build_problem(cfg)
    target, model = problem.target, problem.model
    n = target.num_total
    assert n == int(target.counts.sum())  # the total training size, on every client
    theta = initial_position(model, model.dim, cfg).unsqueeze(1).expand(1, 3, -1).clone()
    keys = data_keys(torch.tensor([5, 6, 7]), torch.arange(1))
    g, energy = target.grad(theta.clone(), keys, 2)
    idx, _ = target.reshuffle_indices(keys, 2)
    tau = cfg.temperature
    for c in range(3):
        X = target.X[c, idx[0, c]]  # prepared features: pixels and the bias column
        y = target.y[c, idx[0, c]]
        W = theta[0, c].detach().clone().requires_grad_(True)
        logits = X @ W.view(model.num_features + 1, model.num_classes)
        ce = torch.nn.functional.cross_entropy(logits, y)  # the mean over the batch
        U = (n / tau) * ce
        U.backward()
        torch.testing.assert_close(energy[0, c] / tau, U.detach(), rtol=1e-5, atol=1e-3)
        torch.testing.assert_close(g[0, c] / tau, W.grad, rtol=1e-4, atol=1e-2)
    # The sampler divides by τ: one round's energy is (n/τ)·CE at the client's position.
    assert sampler_settings(cfg).temperature == tau


def test_authors_scaling_and_initialisation():
    cfg = RunConfig(dataset="digits", protocol="authors", chains=4).resolve()
    problem = build_problem(cfg)
    X = problem.target.X[..., :-1]  # without the bias column
    valid = problem.target._valid
    assert float(X[valid].min()) == -1.0 and float(X[valid].max()) == 1.0
    model = problem.model
    theta0 = initial_position(model, model.dim, cfg)
    b = 1.0 / math.sqrt(model.num_features)
    assert float(theta0.abs().max()) <= b
    # U(−b, b): variance b²/3, over 4 · 650 draws.
    n = theta0.numel()
    var = float(theta0.var())
    assert abs(var - b * b / 3) < Z * (b * b / 3) * math.sqrt(0.8 / n)
    # Explicit options override the preset.
    cfg2 = RunConfig(dataset="digits", protocol="authors", temperature=1.0, ece_bins=15)
    cfg2 = cfg2.resolve()
    assert cfg2.temperature == 1.0 and cfg2.ece_bins == 15 and cfg2.sync_unit == "leapfrog"
