"""A round is composed once, from one description of its messages.

- What the server sends and what a client replies are the arrays of the algorithm's
  ``layout``: the wire format and ``bytes_per_round`` read it, for every federated
  algorithm, protocol and round kind.
- How replies combine is a type (``Weights`` or ``Coefficients``), chosen by the
  algorithm's ``combination`` rule, which also handles the clients that did not reply.
- Gradient evaluations come from the clients' updates.
"""

from __future__ import annotations

import pytest
import torch

from fedhmc.algorithms import federated, registry
from fedhmc.algorithms.federated import Coefficients, Weights
from fedhmc.core import participation
from fedhmc.models.targets import hetero_gaussian
from fedhmc.runtime import wire
from fedhmc.runtime.config import RunConfig
from fedhmc.runtime.problem import bytes_per_round

ROUND_ALGORITHMS = [e.name for e in registry.ENTRIES if e.federated and not e.asynchronous]

CASES = [
    {},
    {"protocol": "authors"},
    {"sync_unit": "leapfrog", "local_steps": 3, "leapfrog_steps": 2},
    {"sync_unit": "leapfrog", "local_steps": 2, "leapfrog_steps": 3, "restart_trajectories": True},
]


def _cfg(name, **kw) -> RunConfig:
    base = dict(dataset="gaussian-hetero", algorithm=name, rounds=4, num_clients=3, dim=2, chains=2)
    return RunConfig(**{**base, **kw}).resolve()


def _messages(cfg, rounds):
    """(message, update, settings, module) of each round, every client batched."""
    module, settings = registry.algorithm_of(cfg)
    target = hetero_gaussian(cfg.num_clients, cfg.dim, dtype=torch.float64)
    state = module.init(torch.zeros(cfg.chains, cfg.dim, dtype=torch.float64), settings)
    for _ in range(rounds):
        message = module.broadcast(cfg.seed, state, settings, target.weights)
        computing, seeds = federated.round_clients(cfg.seed, message, target)
        store = getattr(state, "clients", None)
        kept = None if store is None else store.take(message.client_ids)
        update, _ = federated.run_clients(module, message, computing, settings, seeds, kept)
        yield message, update, settings, module
        state, _ = module.step(cfg.seed, state, target, settings)


@pytest.mark.parametrize("name", ROUND_ALGORITHMS)
@pytest.mark.parametrize("case", range(len(CASES)))
def test_the_wire_and_the_byte_count_read_the_layout(name, case):
    e = registry.entry(name)
    kw = CASES[case]
    if kw.get("protocol", "algorithm3") not in e.protocols:
        pytest.skip(f"{name} does not run the {kw['protocol']} protocol")
    if "sync_unit" in kw and not e.trajectory_options:
        pytest.skip(f"{name} has no --sync-unit")
    if e.fixed_value("leapfrog_steps") is not None:
        kw = {k: v for k, v in kw.items() if k != "leapfrog_steps"}
    cfg = _cfg(name, **kw)
    for message, update, settings, module in _messages(cfg, 4):
        layout = module.layout(settings, message.round)
        _, arrays = wire.encode_message(cfg, message, 100, layout, module)
        sent = {module.MESSAGE[k] for k in arrays}
        assert sent == set(layout.down), (message.round, sent, layout.down)
        for f in layout.down:  # every array the layout names is sent, and is (S, D)
            assert getattr(message, f).shape == (cfg.chains, cfg.dim)
        up = wire.encode_reply(update, layout.up, module, 0)
        assert {module.REPLY[k] for k in up} == set(layout.up)
        for f, v in zip(layout.up, up.values(), strict=True):
            assert v.shape == (cfg.chains, cfg.dim), f
        for f in ("momentum", "local_grad"):  # nothing computed is left off the reply
            assert (getattr(update, f, None) is not None) == (f in layout.up), f
        item = 8 if cfg.dtype == "float64" else 4
        per = cfg.num_clients * cfg.chains * cfg.dim * item
        want = (len(layout.down) * per, len(layout.up) * per)
        assert bytes_per_round(cfg, cfg.dim, message.round) == want


@pytest.mark.parametrize("name", ROUND_ALGORITHMS)
def test_gradient_evaluations_come_from_the_updates(name):
    cfg = _cfg(name)
    for message, update, settings, module in _messages(cfg, 3):
        how = module.combination(message, torch.ones(cfg.num_clients))
        _, info = module.server_update(
            module.init(message.position, settings), update, how, settings
        )
        assert info.grad_evals == update.grad_evals > 0
        replied = getattr(update, module.layout(settings, message.round).up[0]).shape[1]
        assert info.clients == replied and info.finite  # (FSGLD: one drawn client a round)


def test_replies_combine_by_weights_or_by_coefficients():
    fahmc = registry.entry("fahmc").module
    x = torch.arange(12, dtype=torch.float64).view(1, 3, 4)
    full = fahmc.Broadcast(round=1, round_seed=0, position=torch.zeros(1, 4))
    w = fahmc.combination(full, torch.tensor([1.0, 1.0, 2.0]))
    assert isinstance(w, Weights)  # renormalised over the clients given
    torch.testing.assert_close(fahmc.average(x, w)[0], (x[0, 0] + x[0, 1] + 2 * x[0, 2]) / 4)
    ids, a = torch.tensor([0, 2, 5]), torch.tensor([0.5, 0.25, 0.5], dtype=torch.float64)
    drawn = fahmc.Broadcast(round=1, round_seed=0, position=x[0], client_ids=ids, coefficients=a)
    c = fahmc.combination(drawn, None)
    assert isinstance(c, Coefficients) and torch.equal(c.values, a)  # as given
    want = 0.5 * x[0, 0] + 0.25 * x[0, 1] + 0.5 * x[0, 2]
    torch.testing.assert_close(fahmc.average(x, c)[0], want)
    # A drawn client that did not reply: the others' coefficients keep the round's total.
    replied = torch.tensor([True, False, True])
    c = fahmc.combination(drawn, None, replied)
    torch.testing.assert_close(c.values, participation.renormalized(a, replied))
    assert float(c.values.sum()) == pytest.approx(float(a.sum()))


def test_a_round_without_replies_is_skipped_by_the_algorithm():
    cfg = _cfg("fahmc")
    module, settings = registry.algorithm_of(cfg)
    state = module.init(torch.ones(cfg.chains, cfg.dim), settings)
    message = module.broadcast(cfg.seed, state, settings, torch.ones(3) / 3)
    new, info = federated.close_round(module, state, settings, message, None, None)
    assert info is None and new.round == 1 and torch.equal(new.position, state.position)


@pytest.mark.parametrize(
    "bad",
    [
        {"step_size": 0.0},
        {"step_size": float("nan")},
        {"leapfrog_steps": 0},
        {"local_steps": 1.5},
        {"rho": 1.5},
        {"grad_noise": -1.0},
        {"temperature": 0.0},
        {"sync_unit": "epoch"},
        {"restart_trajectories": True},
        {"clients_per_round": 0},
        {"participation": "random"},
        {"anchor_batch_size": -1},
    ],
)
def test_settings_refuse_a_bad_value_when_built(bad):
    from fedhmc.algorithms import debiased, fahmc
    from fedhmc.errors import ConfigError

    good = dict(step_size=0.1, leapfrog_steps=2, local_steps=3)
    module = debiased if "anchor_batch_size" in bad else fahmc
    module.Settings(**good)  # the good values pass
    with pytest.raises(ConfigError):
        module.Settings(**{**good, **bad})


def test_a_client_store_keeps_each_clients_rows():
    store = federated.ClientStore.empty(4)
    assert store.take(None) == {} and store.take(torch.tensor([1, 2])) == {}
    ids = torch.tensor([3, 1])
    z = torch.arange(12.0).view(2, 2, 3)  # (S, M, D) of clients 3 and 1
    rounds = torch.tensor([7, 7])  # (M,)
    store = store.put(ids, {"z": z, "round": rounds})
    got = store.take(torch.tensor([1, 0, 3]))
    assert got["held"].tolist() == [True, False, True]
    torch.testing.assert_close(got["z"][:, 0], z[:, 1])
    torch.testing.assert_close(got["z"][:, 2], z[:, 0])
    assert float(got["z"][:, 1].abs().sum()) == 0  # a client that kept nothing reads zeros
    assert got["round"].tolist() == [7, 0, 7]
    everyone = store.put(None, {"z": torch.ones(2, 4, 3), "round": torch.full((4,), 8)})
    assert bool(everyone.take(None)["held"].all()) and store.held.tolist()[0] is False


def test_a_state_that_cannot_hold_what_clients_keep_is_named():
    import types

    fahmc = registry.entry("fahmc").module
    module = types.SimpleNamespace(**vars(fahmc))
    module.client_keeps = lambda message, update: {"p": update.position}
    module.__name__ = "mysampler"
    s = fahmc.Settings(0.1, 2, 2)
    target = hetero_gaussian(2, 2, dtype=torch.float64)
    with pytest.raises(TypeError, match="mysampler: its clients keep .* needs a field `clients"):
        federated.step(module, 0, fahmc.init(torch.zeros(1, 2, dtype=torch.float64), s), target, s)


def test_what_clients_keep_stays_through_rounds_that_keep_nothing_new():
    """FSGLD's clients keep their surrogates from the set-up round only; a server_update
    that builds a new State (as a sampler's may: fedhmc fills ``clients``) loses nothing."""
    import dataclasses
    import types

    fsgld = registry.entry("fsgld").module

    def server_update(state, update, how, settings):
        new, info = fsgld.server_update(state, update, how, settings)
        return dataclasses.replace(new, clients=None), info  # (a State built anew)

    module = types.SimpleNamespace(**{**vars(fsgld), "server_update": server_update})
    s = fsgld.Settings(step_size=0.05, surrogate_steps=8, local_steps=2)
    target = hetero_gaussian(3, 2, dtype=torch.float64)
    state = fsgld.init(torch.zeros(2, 2, dtype=torch.float64), s)
    for _ in range(4):  # the set-up round, then three that keep nothing new
        state, info = federated.step(module, 0, state, target, s)
        assert info.finite and bool(state.clients.held.all())
