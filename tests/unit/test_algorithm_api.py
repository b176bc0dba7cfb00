"""Every algorithm has the same interface: Settings, State and Info dataclasses (State and
Info immutable), ``init(position, settings)`` and ``step(seed, state, target, settings)``;
every State counts its ``step`` calls in ``round`` and every Info has the fields
``grad_evals``, ``finite``, ``clients`` and ``energy_error``; the federated ones compose
``step`` from ``broadcast``, ``client_update`` and ``server_update``; and every State
survives a checkpoint field by field (and one saved with an earlier version's ``step``)."""

from __future__ import annotations

import dataclasses
import inspect

import pytest
import torch

from fedhmc.algorithms import async_sgmcmc, debiased, fahmc, federated, mhmc, oracles, stale
from fedhmc.algorithms.delayed import make_regression, sequential_reference
from fedhmc.algorithms.delayed import sgld as delayed_sgld
from fedhmc.errors import ConfigError
from fedhmc.models.targets import hetero_gaussian
from fedhmc.runtime import checkpoint

MODULES = [fahmc, debiased, stale, async_sgmcmc, mhmc, delayed_sgld]


@pytest.mark.parametrize("module", MODULES, ids=lambda m: m.__name__)
def test_every_algorithm_has_the_same_shape(module):
    for name in ("Settings", "State", "Info", "init", "step"):
        assert hasattr(module, name), f"{module.__name__} lacks {name}"
    for cls in (module.State, module.Info):
        assert dataclasses.is_dataclass(cls) and cls.__dataclass_params__.frozen, cls
    names = [f.name for f in dataclasses.fields(module.State)]
    assert names[0] == "position" and "round" in names and "step" not in names, names
    info = {f.name: f.type for f in dataclasses.fields(module.Info)}
    for name, kind in INFO_FIELDS.items():
        assert info.get(name) == kind, (module.__name__, name, info.get(name))
    params = list(inspect.signature(module.step).parameters)
    assert params == ["seed", "state", "target", "settings"], params


INFO_FIELDS = {
    "grad_evals": "int",
    "finite": "bool",
    "clients": "int",
    "energy_error": "float | None",
}
"""What the engine reads of every Info (as fields, not properties), with their types."""


def _one_step(module, x):
    """(state after a step or two, its Info, settings) of ``module`` from positions ``x``."""
    if module is fahmc or module is debiased:
        s = module.Settings(0.1, 2, 2)
        state, _ = module.step(0, module.init(x, s), hetero_gaussian(2, 2, torch.float64), s)
        state, info = module.step(0, state, hetero_gaussian(2, 2, torch.float64), s)
    elif module is stale:
        s = stale.Settings("sghmc", 0.1, staleness=2, local_steps=3)
        state, info = stale.step(0, stale.init(x, s), oracles.from_grad(lambda t, i: t), s)
    elif module is async_sgmcmc:
        s = async_sgmcmc.Settings("sghmc", 0.1)
        state, info = module.step(0, module.init(x[0], s), oracles.Received(x[1]), s)
    elif module is mhmc:
        s = mhmc.Settings(0.1, 3)
        oracle = oracles.from_energy(lambda t: (0.5 * t.square().sum(-1), t))
        state, info = mhmc.step(0, mhmc.init(x, s), oracle, s)
    else:
        problem = make_regression(n=20, seed=0)
        s = delayed_sgld.Settings(chains=3, batch_size=4)
        state, info = module.step(0, module.init(torch.zeros(3, problem.dim), s), problem, s)
    return state, info, s


@pytest.mark.parametrize("module", [stale, async_sgmcmc, mhmc, delayed_sgld],
                         ids=lambda m: m.__name__)  # fmt: skip
def test_every_info_has_the_engine_fields_as_values(module):
    x = torch.randn(3, 2, dtype=torch.float64)
    state, info, _ = _one_step(module, x)
    assert state.round == 1
    assert isinstance(info.grad_evals, int) and info.grad_evals > 0
    assert info.finite is True and isinstance(info.clients, int)
    leapfrog = module is mhmc
    assert (info.energy_error is not None) == leapfrog
    if leapfrog:  # the mean |ΔH| per trajectory, not the signed ΔH of a proposal
        assert info.energy_error == pytest.approx(float(info.delta_h.abs().mean()))


@pytest.mark.parametrize("module", [fahmc, debiased], ids=lambda m: m.__name__)
@pytest.mark.parametrize("sync_unit, T", [("iteration", 3), ("leapfrog", 7)])
def test_step_is_broadcast_client_updates_and_server_update(module, sync_unit, T):
    """Each client alone (a Flower client) computes its row of the batched round, and the
    server's update of the stacked rows is the engine's step."""
    if module is debiased and sync_unit == "leapfrog":
        pytest.skip("debiased FA-HMC runs Algorithm 3's rounds only")
    target = hetero_gaussian(num_clients=3, dim=4, dtype=torch.float64)
    s = module.Settings(step_size=0.1, leapfrog_steps=5, local_steps=T, rho=0.5,
                        sync_unit=sync_unit)  # fmt: skip
    state = ref = module.init(torch.zeros(6, 4, dtype=torch.float64), s)
    for _ in range(4):
        ref, _ = module.step(3, ref, target, s)
        message = module.broadcast(3, state, s)
        ups = []
        for c in range(3):
            seeds = fahmc.client_seeds(3, [c])
            ups.append(module.client_update(message, target.client(c), s, seeds))  # (recomputed)
        how = module.combination(message, target.weights)
        state, info = module.server_update(state, federated.stack_updates(ups), how, s)
        torch.testing.assert_close(state.position, ref.position, rtol=1e-12, atol=1e-12)
        assert info.clients == 3
    assert state.round == 4


@pytest.mark.parametrize("module", MODULES, ids=lambda m: m.__name__)
def test_every_state_survives_a_checkpoint(module, tmp_path):
    x = torch.randn(3, 2, dtype=torch.float64)
    state, _, _ = _one_step(module, x)
    checkpoint.save(tmp_path, {"round": 1, "backend": checkpoint.state_dict(state)})
    saved, _ = checkpoint.load(tmp_path)
    back = checkpoint.state_from_dict(saved["backend"], type(state))
    for f in dataclasses.fields(state):
        assert _same(getattr(state, f.name), getattr(back, f.name)), f.name


def _same(a, b) -> bool:
    """Equal values, tensors bit for bit, through dicts and dataclasses (a ClientStore)."""
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b)
    if dataclasses.is_dataclass(a):
        return type(a) is type(b) and all(
            _same(getattr(a, f.name), getattr(b, f.name)) for f in dataclasses.fields(a)
        )
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    return a == b


@pytest.mark.parametrize("module", [stale, async_sgmcmc, mhmc, delayed_sgld],
                         ids=lambda m: m.__name__)  # fmt: skip
def test_a_state_saved_with_other_fields_is_refused(module):
    """A State whose saved fields are not the class's (its counter saved as ``step``) is
    refused in one line: a checkpoint is read by the fedhmc that wrote it."""
    x = torch.randn(3, 2, dtype=torch.float64)
    state, _, _ = _one_step(module, x)
    saved = checkpoint.state_dict(state)
    saved["fields"]["step"] = saved["fields"].pop("round")
    with pytest.raises(ConfigError, match="does not have this version's fields") as e:
        checkpoint.state_from_dict(saved, type(state))
    assert "\n" not in str(e.value)


def test_a_checkpoint_of_another_state_is_refused():
    saved = checkpoint.state_dict(fahmc.init(torch.zeros(1, 1), fahmc.Settings(0.1, 1, 1)))
    with pytest.raises(Exception, match="needs fedhmc.algorithms.stale.State"):
        checkpoint.state_from_dict(saved, stale.State)


def test_async_chain_applies_fresh_and_drops_stale_gradients_through_step():
    s = async_sgmcmc.Settings("sghmc", 0.01, max_staleness=1)
    state = async_sgmcmc.init(torch.zeros(3), s)
    chain = async_sgmcmc.AsyncChain(torch.zeros(3), s, 0, 0)
    g = torch.ones(3)
    for sent in (0, 1, 1):
        state, info = async_sgmcmc.step(0, state, oracles.Received(g, sent), s)
        assert info.applied == chain.receive(0, g, sent)
        assert torch.equal(state.position, chain.theta) and state.timestamp == chain.t
    state2, info = async_sgmcmc.step(0, state, oracles.Received(g, 0), s)
    assert not info.applied and info.staleness == 3 and info.grad_evals == info.clients == 0
    assert state2.round == state.round + 1 and state2.timestamp == state.timestamp
    assert state2.position is state.position and state2.momentum is state.momentum


@pytest.mark.parametrize(
    "build, needle",
    [
        (lambda: mhmc.Settings(step_size=0.1, leapfrog_steps=0), "K ≥ 1"),
        (lambda: mhmc.Settings(step_size=-0.1), "step_size > 0"),
        (lambda: stale.Settings("sgld", 0.0), "--step-size must be a number > 0"),
        (lambda: async_sgmcmc.Settings("sgld", 0.1, max_staleness=-1), "max-staleness"),
        (lambda: delayed_sgld.Settings(workers=0), "workers"),
    ],
)
def test_bad_settings_are_refused_at_construction(build, needle):
    with pytest.raises(ConfigError, match=needle):
        build()


def test_delayed_step_is_the_sync_chain():
    problem = make_regression(n=200, seed=0)
    s = delayed_sgld.Settings(
        mode="sync", workers=2, step_size=1e-5, iterations=6, chains=3, record_every=2
    )
    state = delayed_sgld.init(torch.zeros(3, problem.dim), s)
    for _ in range(6):
        state, info = delayed_sgld.step(s.seed, state, problem, s)
    assert info.increments.shape == (2, 3, problem.dim)
    assert torch.equal(state.position, sequential_reference(problem, s)[-1])


def test_the_built_in_targets_and_models_meet_the_protocols():
    from fedhmc.models.nets import MLP, LogisticRegression
    from fedhmc.models.protocols import Model, Target

    assert oracles.Target is Target  # one interface, defined once
    for target in (hetero_gaussian(3, 4), oracles.Received(torch.zeros(2)),
                   oracles.from_grad(lambda t, i: t), make_regression(n=10)):  # fmt: skip
        assert isinstance(target, Target), target
    one = oracles.from_grad(lambda t, i: t)
    assert one.client(0) is one and one.subset([0]) is one and one.with_batch_size(4) is one
    assert isinstance(LogisticRegression(4, 3), Model) and isinstance(MLP(4, 3, (5,)), Model)
    assert not isinstance(object(), Target)
