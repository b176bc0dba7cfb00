"""CUDA graphs, checked on the CPU.

A CUDA graph replays the kernels recorded from one call, so a round may be captured only
if (1) it reads nothing back to the host and copies nothing from it (capture forbids
both), and (2) every value that changes between rounds is an input. Both are properties
of the code, not of the GPU: here the device path of the random numbers runs on the CPU
(int64 tensor arithmetic instead of NumPy, the same bits), a dispatch mode refuses every
host synchronisation and host-to-device copy, and a stand-in for the graph
(``graph_standin.RecordedGraph``) replays the ATen calls recorded at capture, as a graph
does, and fails a replay whose Python would have made other calls, with other scalars or
on other tensors.
"""

from __future__ import annotations

import contextlib

import pytest
import torch
from graph_standin import HostSyncError, NoHostSync, RecordedGraph

from fedhmc.algorithms import debiased, fahmc
from fedhmc.core import rng
from fedhmc.core.graphs import RoundGraphs
from fedhmc.core.streams import STREAM_MOMENTUM
from fedhmc.runtime.config import RunConfig
from fedhmc.runtime.problem import build_problem, initial_position


@contextlib.contextmanager
def device_path():
    """The random numbers' device path (tensor arithmetic) on the CPU."""
    old = rng._TENSOR_PATH_ON_CPU
    rng._TENSOR_PATH_ON_CPU = True
    try:
        yield
    finally:
        rng._TENSOR_PATH_ON_CPU = old


# ------------------------------------------------------------------ the random numbers


@pytest.mark.parametrize(
    "draw",
    [
        lambda k: rng.derive(k, 3, torch.arange(4).view(-1, 1, 1)),
        lambda k: rng.derive(2**64 - 5, k, 7),
        lambda k: rng.derive(11, torch.arange(3)),
        lambda k: rng.uniform(k, 9, 33),
        lambda k: rng.uniform_block(k, 2, 4, 33),
        lambda k: rng.normal(k, 5, 17, torch.float64),
        lambda k: rng.normal(k, 5, 17, torch.float32),
    ],
)
def test_the_device_path_draws_the_host_paths_bits(draw):
    keys = torch.tensor([[0, -1, 2**62, 12345]], dtype=torch.int64)
    host = draw(keys)
    with device_path():
        dev = draw(keys)
    assert host.dtype == dev.dtype and host.shape == dev.shape
    assert torch.equal(host, dev)


def test_the_device_path_copies_nothing_from_the_host():
    keys = torch.tensor([3, 4], dtype=torch.int64)
    with device_path(), NoHostSync():
        k = rng.derive(keys, STREAM_MOMENTUM, 5)
        rng.normal(k, 3, 8)
        rng.uniform_block(k, 1, 2, 8)
    with NoHostSync(), pytest.raises(HostSyncError, match="lift_fresh"):
        torch.tensor([1, 2])  # the guard itself bites


# ------------------------------------------------------------------ a round is capturable


def _problem(**over):
    base = dict(
        dataset="digits",
        num_clients=4,
        partition="iid",
        local_steps=2,
        leapfrog_steps=3,
        batch_size=16,
        chains=2,
        rounds=4,
        burn_in=0,
        dtype="float64",
    )
    cfg = RunConfig.from_mapping({**base, **over}).resolve()
    problem = build_problem(cfg)
    theta = initial_position(problem.model, problem.dim, cfg)
    return cfg, problem, theta


def _settings(cfg, module=fahmc, **extra):
    return module.Settings(
        step_size=cfg.step_size,
        leapfrog_steps=cfg.leapfrog_steps,
        local_steps=cfg.local_steps,
        rho=cfg.rho,
        grad_noise=cfg.grad_noise,
        **extra,
    )


CASES = [
    {"model": "logistic"},
    {"model": "mlp", "hidden": "8"},
    {"model": "cnn"},
    {"model": "logistic", "batch_size": 0},  # full batch
    {"model": "logistic", "grad_noise": 0.1},
    {"dataset": "gaussian-hetero", "dim": 3, "grad_noise": 0.5},
]


@pytest.mark.parametrize("over", CASES, ids=lambda o: "-".join(f"{k}={v}" for k, v in o.items()))
def test_a_round_of_algorithm3_reads_nothing_back(over):
    cfg, problem, theta = _problem(**over)
    settings = _settings(cfg)
    state = fahmc.init(theta, settings)
    target = problem.target
    with device_path():
        message = fahmc.broadcast(cfg.seed, state, settings)
        seeds = fahmc.client_seeds(cfg.seed, target.num_clients)
        chains = torch.arange(theta.shape[0])
        shared, private = fahmc.round_keys(message.round_seed, seeds, message.round, chains)
        expand = theta.unsqueeze(1).expand(-1, target.num_clients, -1)
        fahmc.local_iterations(target, expand, shared, private, settings)  # warm-up
        with NoHostSync():
            u = fahmc.local_iterations(target, expand, shared, private, settings)
    assert torch.isfinite(u.position).all()


def _run(cfg, problem, theta, settings, graphs, rounds, module=fahmc):
    problem.target.graphs = graphs
    state = module.init(theta, settings)
    out = []
    with device_path():
        for _ in range(rounds):
            state, info = module.step(cfg.seed, state, problem.target, settings)
            out.append(
                (state.position.clone(), info.energy.clone(), torch.tensor(info.energy_error))
            )
    problem.target.graphs = None
    return out


@pytest.mark.parametrize("over", CASES[:3] + CASES[5:], ids=lambda o: str(o.get("model", "g")))
def test_replayed_rounds_give_the_eager_chain(over):
    cfg, problem, theta = _problem(**over)
    settings = _settings(cfg)
    eager = _run(cfg, problem, theta, settings, None, 5)
    graphs = RoundGraphs(capture=RecordedGraph)
    replayed = _run(cfg, problem, theta, settings, graphs, 5)
    assert graphs.off is None and graphs.replays == 3  # rounds 3, 4, 5
    for a, b in zip(eager, replayed, strict=True):
        for x, y in zip(a, b, strict=True):
            assert torch.equal(x, y)


def test_debiased_rounds_replay_with_their_correction():
    cfg, problem, theta = _problem(algorithm="fahmc-debiased")
    settings = _settings(cfg, debiased)
    eager = _run(cfg, problem, theta, settings, None, 5, debiased)
    graphs = RoundGraphs(capture=RecordedGraph)
    replayed = _run(cfg, problem, theta, settings, graphs, 5, debiased)
    # Round 1 has no correction (its own kind), rounds 2… do: rounds 4 and 5 are replays.
    assert graphs.off is None and graphs.replays == 2
    for a, b in zip(eager, replayed, strict=True):
        assert all(torch.equal(x, y) for x, y in zip(a, b, strict=True))


@pytest.mark.parametrize(
    "over",
    [
        {"participation": "uniform"},
        {"participation": "normalized", "partition": "quantity"},
        {"participation": "normalized", "batch_size": 0},  # full batch
        {"participation": "uniform", "minibatch": "reshuffle", "batch_size": 60},
        {"participation": "uniform", "dataset": "gaussian-hetero", "dim": 3},
    ],
    ids=["uniform", "quantity", "full-batch", "reshuffle", "gaussian"],
)
def test_partial_participation_rounds_replay(over):
    """A round's drawn clients change, but not their number: every round computes on the
    same view of the target, its per-client tensors refilled from the drawn ids, so the
    rounds replay from round 3 on, and the chain is the eager one. (Clients of unequal
    sizes: one view, and kind of round, per width, so fewer rounds replay.)"""
    cfg, problem, theta = _problem(num_clients=8, clients_per_round=3, **over)
    settings = _settings(cfg, clients_per_round=3, participation=over["participation"])
    eager = _run(cfg, problem, theta, settings, None, 6)
    graphs = RoundGraphs(capture=RecordedGraph)
    replayed = _run(cfg, problem, theta, settings, graphs, 6)
    views = getattr(problem.target, "_views", {})
    assert graphs.off is None and graphs.replays >= 1
    if len(views) == 1:
        assert graphs.replays == 4
    for a, b in zip(eager, replayed, strict=True):
        assert all(torch.equal(x, y) for x, y in zip(a, b, strict=True))


def test_weighted_participation_replays_each_number_of_clients():
    """Under ``weighted`` participation S draws with replacement give M ≤ S distinct
    clients: one kind of round (and view) per M, each replayed once it has recurred."""
    cfg, problem, theta = _problem(num_clients=5, clients_per_round=4)
    settings = _settings(cfg, clients_per_round=4, participation="weighted")
    eager = _run(cfg, problem, theta, settings, None, 12)
    graphs = RoundGraphs(capture=RecordedGraph)
    replayed = _run(cfg, problem, theta, settings, graphs, 12)
    sizes = sorted(problem.target._views)
    assert len(sizes) > 1 and graphs.off is None and graphs.replays > 0
    for a, b in zip(eager, replayed, strict=True):
        assert all(torch.equal(x, y) for x, y in zip(a, b, strict=True))


def test_a_round_view_computes_what_its_clients_compute_alone():
    """A round's view of clients (3, 15, 7) gives the gradients that the target restricted
    to them (``subset``) gives: the same minibatches of the same points, whichever clients
    are drawn with them; refilling the view for other clients changes it in place."""
    cfg, problem, _ = _problem(num_clients=20, partition="quantity", batch_size=24)
    target = problem.target
    theta = torch.randn(2, 3, target.dim, dtype=torch.float64)
    keys = torch.arange(6).view(2, 3)
    ids = torch.tensor([3, 15, 7])
    view = target.round_view(ids)
    g, e = view.grad(theta.clone(), keys, 0)
    g_sub, e_sub = target.subset(ids).grad(theta.clone(), keys, 0)
    torch.testing.assert_close(g, g_sub, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(e, e_sub, rtol=1e-12, atol=1e-12)
    counts = view.counts
    assert view._plan is not None
    again = torch.tensor([7, 3, 15])
    assert target.round_view(again) is view and view.counts is counts
    assert torch.equal(view.counts, target.counts[again])
    assert view._plan is None  # a new round frees what the last one drew
    small = target.round_view(torch.argsort(target.counts)[:3])  # a narrower view of 3
    assert small is not view and small._n_max < view._n_max
    assert small._buffers is view._buffers  # one round at a time: one set of buffers


@pytest.mark.parametrize(
    "over, extra, rounds, replays",
    [
        # Algorithm 3's rounds with reshuffled minibatches of 120 (each client's pass: 3
        # minibatches, so a round of 8 evaluations crosses passes): one kind of round.
        ({}, {}, 5, 3),
        # The authors' image protocol: leapfrog sync, fresh gradients (3 kinds of round).
        ({}, {"sync_unit": "leapfrog", "fresh_gradients": True}, 12, 6),
        # Clients of unequal sizes (27 to 336 points), some smaller than B (their minibatch
        # is their whole data, a pass of one).
        ({"partition": "quantity", "num_clients": 12}, {}, 5, 3),
    ],
    ids=["algorithm3", "authors", "ragged"],
)
def test_reshuffled_rounds_replay_with_the_minibatch_counter_as_input(over, extra, rounds, replays):
    """Random-reshuffling minibatches count across the run: the round's first minibatch
    number is an input of the graph, so a replay draws the next round's minibatches, and
    the chain is the eager one."""
    cfg, problem, theta = _problem(minibatch="reshuffle", batch_size=120, **over)
    assert not problem.target.full_batch
    settings = _settings(cfg, **extra)
    eager = _run(cfg, problem, theta, settings, None, rounds)
    graphs = RoundGraphs(capture=RecordedGraph)
    replayed = _run(cfg, problem, theta, settings, graphs, rounds)
    assert graphs.off is None and graphs.replays == replays
    for a, b in zip(eager, replayed, strict=True):
        assert all(torch.equal(x, y) for x, y in zip(a, b, strict=True))


@pytest.mark.parametrize("budget", [None, 1000], ids=["window", "too-large"])
def test_a_reshuffle_window_holds_the_minibatches_drawn_one_by_one(budget, monkeypatch):
    """The permutations drawn for a window, from a tensor counter, give minibatch for
    minibatch what drawing each one alone gives, across passes; so does a window too large
    to draw at once, whose minibatches draw their own passes."""
    from fedhmc.models import targets

    if budget is not None:
        monkeypatch.setattr(targets, "PREFETCH_MAX_VALUES", budget)
    _, problem, _ = _problem(minibatch="reshuffle", batch_size=120, partition="quantity")
    target = problem.target
    keys = fahmc.data_keys(torch.tensor([11, 12, 13, 14]), torch.arange(2))
    alone = [target.reshuffle_indices(keys, i) for i in range(17, 30)]
    with device_path(), NoHostSync():
        first = torch.zeros((), dtype=torch.int64) + 17
        target.reshuffle_window(keys, first, 13)
        window = [target.reshuffle_indices(keys, first + k) for k in range(13)]
    for (i, w), (j, v) in zip(alone, window, strict=True):
        assert torch.equal(i, j) and torch.equal(w, v)
    assert (target._window[2] is None) == (budget is not None)


def test_full_batch_reshuffled_rounds_replay():
    """A client whose data fits one minibatch (here every client: B = 0) has nothing to
    reshuffle: the rounds run, and replay, on the full batch."""
    cfg, problem, theta = _problem(minibatch="reshuffle", batch_size=0)
    assert problem.target.full_batch
    settings = _settings(cfg, sync_unit="leapfrog", fresh_gradients=True)
    eager = _run(cfg, problem, theta, settings, None, 9)
    graphs = RoundGraphs(capture=RecordedGraph)
    replayed = _run(cfg, problem, theta, settings, graphs, 9)
    assert graphs.off is None and graphs.replays == 3  # 3 kinds: rounds 7–9 are replays
    for a, b in zip(eager, replayed, strict=True):
        assert all(torch.equal(x, y) for x, y in zip(a, b, strict=True))


@pytest.mark.parametrize(
    "extra",
    [
        {},  # T = 2, K = 3: rounds start mid-trajectory in a cycle of 3 kinds
        {"fresh_gradients": True},
        {"restart_trajectories": True},  # the authors' BLR protocol: trajectories restart from X₀
    ],
    ids=["reused", "fresh", "restart"],
)
def test_leapfrog_synced_rounds_replay_by_their_kind(extra):
    """Under sync_unit="leapfrog" a round's stretches (where its trajectories start and end)
    repeat every lcm(T, K) / T rounds: each kind is captured at its second occurrence and
    replayed after, with the averaged momentum and the origin as inputs."""
    cfg, problem, theta = _problem()
    settings = _settings(cfg, sync_unit="leapfrog", **extra)
    eager = _run(cfg, problem, theta, settings, None, 12)
    graphs = RoundGraphs(capture=RecordedGraph)
    replayed = _run(cfg, problem, theta, settings, graphs, 12)
    # 3 kinds of round (K = 3, T = 2): warmed up in rounds 1–3, captured in 4–6, replayed in
    # 7–12
    assert graphs.off is None and graphs.replays == 6
    for a, b in zip(eager, replayed, strict=True):
        assert all(torch.equal(x, y) for x, y in zip(a, b, strict=True))


# ------------------------------------------------------------------ the bookkeeping


def _double(x):
    return (x * 2.0,)


def test_at_most_max_kinds_are_captured(monkeypatch):
    from fedhmc.core import graphs as graphs_module

    monkeypatch.setattr(graphs_module, "MAX_KINDS", 2)
    graphs = RoundGraphs(capture=RecordedGraph)
    x = torch.ones(3)
    for _ in range(3):
        for key in "abc":
            graphs(key, lambda t: (t * 2,), (x,))
    assert graphs.replays == 2 and set(graphs._graphs) == {"a", "b"}  # "c" ran eagerly


def test_warm_up_capture_and_check_then_replay():
    RecordedGraph.captures = 0
    graphs = RoundGraphs(capture=RecordedGraph)
    x = torch.arange(3.0)
    assert torch.equal(graphs("k", _double, (x,))[0], x * 2)  # warm-up: eager
    assert RecordedGraph.captures == 0
    assert torch.equal(graphs("k", _double, (x + 1,))[0], (x + 1) * 2)  # eager, captured
    assert RecordedGraph.captures == 1 and graphs.replays == 0
    graphs("k", _double, (x + 2,))  # replayed on new inputs and checked against eager
    out = graphs("k", _double, (x + 5,))[0]
    assert torch.equal(out, (x + 5) * 2) and graphs.replays == 2
    again = graphs("k", _double, (x,))[0]
    assert torch.equal(out, (x + 5) * 2), "a replay's output is a copy, not the static buffer"
    assert torch.equal(again, x * 2)


def test_a_failed_capture_turns_the_graphs_off_in_one_line(capsys):
    def broken(fn, inputs, device):
        raise RuntimeError("operation not permitted when stream is capturing\nmore")

    graphs = RoundGraphs(capture=broken)
    x = torch.ones(2)
    graphs("k", _double, (x,))
    assert torch.equal(graphs("k", _double, (x,))[0], x * 2)  # the eager result
    assert graphs.off.startswith("capture failed (RuntimeError: operation not permitted")
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "CUDA graphs are off" in err
    assert torch.equal(graphs("k", _double, (x + 1,))[0], (x + 1) * 2)


def test_a_replay_that_differs_is_never_used(capsys):
    class Wrong(RecordedGraph):
        def replay(self, inputs):
            return tuple(o + 1e-12 for o in super().replay(inputs))

    graphs = RoundGraphs(capture=Wrong)
    x = torch.ones(2, dtype=torch.float64)
    graphs("k", _double, (x,))
    graphs("k", _double, (x,))  # captured
    assert torch.equal(graphs("k", _double, (x + 1,))[0], (x + 1) * 2)  # checked: eager
    assert graphs.off == "a replay differed from the same round computed without it"
    assert graphs.replays == 0
    assert torch.equal(graphs("k", _double, (x,))[0], x * 2)
    assert "CUDA graphs are off" in capsys.readouterr().err


def test_cuda_graphs_default_and_refusal():
    assert RunConfig().resolve().cuda_graphs is False  # on the CPU
    with pytest.raises(Exception, match="--cuda-graphs needs --device cuda"):
        RunConfig(cuda_graphs=True).resolve()


def test_a_run_says_how_many_rounds_it_replayed(tmp_path):
    """``summary.json`` records the rounds replayed from CUDA graphs (here the CPU
    stand-in): 6 rounds of 3 drawn clients, replayed from round 3 on."""
    import json

    from fedhmc.runtime.engine import run

    cfg, problem, _ = _problem(
        num_clients=6, clients_per_round=3, participation="uniform", rounds=6,
        out=str(tmp_path / "run"),
    )  # fmt: skip
    problem.target.graphs = RoundGraphs(capture=RecordedGraph)
    with device_path():
        res = run(cfg, problem=problem, progress=False)
    assert res.summary["cuda_graph_replays"] == 4 and "cuda_graphs_off" not in res.summary
    saved = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert saved["cuda_graph_replays"] == 4


def test_a_deployed_clients_rounds_replay(tmp_path):
    """A Flower client decodes its settings from every round's message (a new, equal
    object each round): its rounds are still one kind, replayed from round 3 on, and give
    the eager rounds."""
    import dataclasses

    from fedhmc.runtime.problem import build_client_target

    cfg, problem, theta = _problem()
    settings = _settings(cfg)
    target, _ = build_client_target(cfg, 2)
    seeds = fahmc.client_seeds(cfg.seed, [2])

    def rounds(graphs):
        target.graphs = graphs
        state, out = fahmc.init(theta, settings), []
        with device_path():
            for _ in range(5):
                decoded = dataclasses.replace(settings)  # as wire.decode_sampler gives it
                message = fahmc.broadcast(cfg.seed, state, decoded)
                update = fahmc.client_update(message, target, decoded, seeds)
                state = fahmc.State(update.position[:, 0], state.round + 1)
                out.append(update.position.clone())
        target.graphs = None
        return out

    eager = rounds(None)
    graphs = RoundGraphs(capture=RecordedGraph)
    replayed = rounds(graphs)
    assert graphs.off is None and graphs.replays == 3
    assert all(torch.equal(a, b) for a, b in zip(eager, replayed, strict=True))
