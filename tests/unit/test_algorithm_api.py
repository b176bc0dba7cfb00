"""Every algorithm has the same shape: Settings, State, Info, init and step, and step gives
the numbers of the algorithm's established entry points."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from fedhmc.algorithms import async_sgmcmc, debiased, delayed, fahmc, mhmc, stale
from fedhmc.algorithms.delayed import sgld as delayed_sgld
from fedhmc.core import rng
from fedhmc.core.streams import STREAM_STALE_NOISE
from fedhmc.models.targets import hetero_gaussian

MODULES = [fahmc, debiased, stale, async_sgmcmc, mhmc, delayed_sgld]


@pytest.mark.parametrize("module", MODULES, ids=lambda m: m.__name__)
def test_every_algorithm_has_the_same_shape(module):
    for name in ("Settings", "State", "Info", "init", "step"):
        assert hasattr(module, name), f"{module.__name__} lacks {name}"
    assert dataclasses.is_dataclass(module.State)
    assert callable(module.init) and callable(module.step)


def test_delayed_package_exports_its_algorithm():
    assert delayed.Settings is delayed_sgld.Settings


@pytest.mark.parametrize("sync_unit, T", [("iteration", 3), ("leapfrog", 7), ("leapfrog", 10)])
def test_fahmc_step_is_run_round_with_the_carried_momentum(sync_unit, T):
    target = hetero_gaussian(num_clients=3, dim=4)
    s = fahmc.Settings(
        step_size=0.1, leapfrog_steps=5, local_steps=T, rho=0.5, sync_unit=sync_unit
    )
    theta0 = torch.zeros(6, 4)
    state = fahmc.init(theta0, s)
    theta, momentum = theta0, None
    for r in range(1, 6):
        state, info = fahmc.step(state, target, s, seed=3)
        m = momentum if s.starts_mid_trajectory(r) else None
        theta, ref = fahmc.run_round(target, theta, 3, r, s, momentum=m)
        momentum = ref.momentum
        assert state.round == r
        assert torch.equal(state.position, theta)
    assert (state.momentum is None) == (sync_unit == "iteration")


def test_debiased_step_is_debiased_round():
    target = hetero_gaussian(num_clients=3, dim=4)
    s = fahmc.Settings(step_size=0.1, leapfrog_steps=3, local_steps=4)
    state = debiased.init(torch.zeros(5, 4), s)
    theta, anchor = torch.zeros(5, 4), None
    for r in range(1, 4):
        state, _ = debiased.step(state, target, s, seed=1)
        theta, anchor, _ = debiased.debiased_round(target, target, theta, anchor, 1, r, s)
        assert torch.equal(state.position, theta)
        assert torch.equal(state.anchor.correction, anchor.correction)


def test_stale_step_is_advance():
    target = hetero_gaussian(num_clients=1, dim=3)
    s = stale.Settings("sghmc", 0.05, 1.0, staleness=2)
    keys = stale.chain_keys(0, 4)
    grad = stale.target_grad_fn(target, keys)
    state = stale.init(torch.zeros(4, 3), s)
    new, info = stale.step(state, grad, s, keys=keys, num_steps=7)
    ref = stale.advance(stale.init_state(torch.zeros(4, 3), s), grad, 7, s, keys)
    assert torch.equal(new.theta, ref.theta) and new.step == 7 and info.steps == 7 and info.finite


def test_async_step_applies_fresh_and_drops_stale_gradients():
    s = async_sgmcmc.Settings("sghmc", 0.01, max_staleness=1)
    key = stale.chain_keys(0, 1)
    noise_key = rng.derive(key.reshape(1), STREAM_STALE_NOISE)
    state = async_sgmcmc.init(torch.zeros(3), s)
    chain = async_sgmcmc.AsyncChain(torch.zeros(3), s, key)
    g = torch.ones(3)
    for sent in (0, 1, 1):
        state, info = async_sgmcmc.step(state, g, s, noise_key=noise_key, sent_t=sent)
        assert info.applied == chain.receive(0, g, sent)
        assert torch.equal(state.theta, chain.theta) and state.t == chain.t
    state2, info = async_sgmcmc.step(state, g, s, noise_key=noise_key, sent_t=0)
    assert not info.applied and info.staleness == 3 and state2 is state


def test_mhmc_step_leaves_a_gaussian_invariant():
    """Chains started exactly at N(0, I) stay there: after 10 transitions the mean and
    variance of S = 4000 chains are within 5 Monte Carlo standard errors."""
    S, D = 4000, 2

    def energy_grad(theta):
        return 0.5 * theta.square().sum(-1), theta

    x0 = torch.randn(S, D, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    state = mhmc.init(x0, energy_grad)
    settings = mhmc.Settings(step_size=0.5, leapfrog_steps=4)
    for _ in range(10):
        state, info = mhmc.step(state, energy_grad, settings, seed=2)
    assert state.iteration == 10
    assert float(info.accept_prob.mean()) > 0.8
    x = state.position
    assert x.mean(0).abs().max() < 5 / math.sqrt(S)
    assert (x.var(0) - 1).abs().max() < 5 * math.sqrt(2 / S)


def test_mhmc_step_rejects_bad_settings():
    with pytest.raises(Exception, match="K ≥ 1"):
        mhmc.Settings(step_size=0.1, leapfrog_steps=0)


def test_delayed_step_is_the_sync_chain():
    problem = delayed.make_regression(n=200, seed=0)
    s = delayed.Settings(
        mode="sync", workers=2, step_size=1e-5, iterations=6, chains=3, record_every=2
    ).validate()
    state = delayed_sgld.init(torch.zeros(3, problem.dim), s)
    for _ in range(6):
        state, info = delayed_sgld.step(state, problem, s)
    assert info.increments.shape == (2, 3, problem.dim)
    ref = delayed.sequential_reference(problem, s)
    assert torch.equal(state.position, ref[-1])


def test_the_built_in_targets_and_models_meet_the_protocols():
    from fedhmc.models.nets import MLP, LogisticRegression
    from fedhmc.models.protocols import Model, Target

    assert isinstance(hetero_gaussian(3, 4), Target)
    assert isinstance(LogisticRegression(4, 3), Model) and isinstance(MLP(4, 3, (5,)), Model)
    assert not isinstance(object(), Target)
