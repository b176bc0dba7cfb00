"""The Flower apps: the real ServerApp body and ClientApp objects, driven by a small
in-process Grid (fast, deterministic), plus one run through Flower's simulation engine."""

from __future__ import annotations

import csv
import json
import math
import time
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("flwr")  # (a machine with torch alone skips this module)

import tomllib
import torch
from _grids import InProcessGrid
from fedhmc_clients.app import handle_train, make_client_app
from fedhmc_clients.compute import COLOCATED_KEY
from fedhmc_server.loop import serve
from flwr.app import Array, ArrayRecord, Message, MetricRecord, RecordDict

from fedhmc.algorithms import fahmc
from fedhmc.algorithms.fahmc import client_seed, client_update, round_seed
from fedhmc.core.aggregate import ReplyError, validate_reply
from fedhmc.errors import FedHMCError
from fedhmc.runtime.config import RunConfig, builtin_option_keys, sampler_options
from fedhmc.runtime.engine import run
from fedhmc.runtime.loop import sampler_settings
from fedhmc.runtime.problem import build_problem

pytestmark = pytest.mark.slow  # Flower

ROOT = Path(__file__).resolve().parents[2]


def small_cfg(tmp_path, name, **kw):
    base = dict(
        num_clients=4,
        rounds=3,
        local_steps=3,
        leapfrog_steps=4,
        burn_in=1,
        chains=2,
        out=str(tmp_path / name),
    )
    base.update(kw)
    return RunConfig(**base)


def run_grid(cfg, client_app=None, colocated=False):
    rc = cfg.to_run_config()
    app = client_app or make_client_app({COLOCATED_KEY: True} if colocated else None)
    grid = InProcessGrid(app, cfg.num_clients, rc)
    return serve(grid, cfg), grid


def assert_same_run(a, b):
    torch.testing.assert_close(a.theta_bar, b.theta_bar, rtol=1e-5, atol=1e-6)
    assert len(a.history) == len(b.history)
    for ra, rb in zip(a.history, b.history, strict=True):
        for k in ("samples", "accuracy", "brier", "ece", "nll_mean", "nll_sum", "grad_evals"):
            assert ra[k] == pytest.approx(rb[k], rel=1e-4, abs=1e-6), k


@pytest.mark.parametrize("rho", [0.0, 0.5, 1.0])
def test_flower_apps_equal_the_engine(tmp_path, rho):
    cfg = small_cfg(tmp_path, "e", rho=rho)
    engine = run(cfg, progress=False)
    flower, _ = run_grid(cfg.replace(out=str(tmp_path / "f")))
    assert_same_run(engine, flower)
    for name in ("config.json", "metrics.csv", "summary.json"):
        assert (tmp_path / "f" / name).exists()
    head_e = (tmp_path / "e" / "metrics.csv").read_text().splitlines()[0]
    assert head_e == (tmp_path / "f" / "metrics.csv").read_text().splitlines()[0]


@pytest.mark.parametrize(
    "extra",
    [
        # T not a multiple of K: rounds start mid-trajectory and carry the momentum.
        dict(protocol="authors", local_steps=3, leapfrog_steps=4, rho=0.5, step_size=1e-4),
        dict(sync_unit="leapfrog", local_steps=5, leapfrog_steps=2, minibatch="reshuffle"),
        dict(sync_unit="leapfrog", restart_trajectories=True, fresh_gradients=True),
    ],
)
@pytest.mark.parametrize("colocated", [False, True])
def test_flower_apps_equal_the_engine_under_leapfrog_sync(tmp_path, extra, colocated):
    # colocated: the clients share a process and compute each round in one batch, as in
    # the Flower simulation; the messages, and the run, are the same.
    cfg = small_cfg(tmp_path, "e", **{"rounds": 6, "burn_in": 0, **extra})
    engine = run(cfg, progress=False)
    flower, grid = run_grid(cfg.replace(out=str(tmp_path / "f")), colocated=colocated)
    assert_same_run(engine, flower)
    assert engine.history[-1]["samples"] > 0
    sent = [m for m in grid.sent if m.metadata.message_type == "train"]
    with_momentum = {
        int(m.content["config"]["round"]) for m in sent if "momentum" in m.content["arrays"]
    }
    settings = sampler_settings(engine.config)
    assert with_momentum == {r for r in range(1, 7) if settings.starts_mid_trajectory(r)}


def test_colocated_rows_are_each_clients_own_round(tmp_path):
    from fedhmc_clients.task import colocated_update, local_update

    from fedhmc.runtime import wire

    cfg = small_cfg(tmp_path, "c", rho=0.5, chains=2).resolve()
    target = build_problem(cfg).target
    theta_bar = np.random.default_rng(0).normal(size=(2, target.dim)).astype(np.float32)
    config = wire.encode_round(cfg, 2, target.num_total)
    arrays = {"theta": theta_bar}
    for pid in (2, 0, 3):  # any order: the first message computes the round for all
        (got, got_values) = colocated_update(cfg, pid, config, arrays)
        (want, want_values) = local_update(cfg, pid, config, arrays, None)
        np.testing.assert_allclose(got["theta"], want["theta"], rtol=1e-5, atol=1e-6)
        assert got.keys() == want.keys() == {"theta"}
        assert got_values["num-examples"] == want_values["num-examples"]
        assert got_values["grad-evals"] == want_values["grad-evals"] > 0
        assert got_values["energy"] == pytest.approx(want_values["energy"], rel=1e-5)
    # a message of another round seed is not the run's: the caller computes alone
    assert colocated_update(cfg, 0, {**config, "round-seed": 12345}, arrays) is None


@pytest.mark.parametrize("anchor_batch", [0, 8])
def test_debiased_flower_apps_equal_the_engine(tmp_path, anchor_batch):
    cfg = small_cfg(
        tmp_path, "de", algorithm="fahmc-debiased", anchor_batch_size=anchor_batch, rho=0.5
    )
    engine = run(cfg, progress=False)
    flower, grid = run_grid(cfg.replace(out=str(tmp_path / "df")))
    assert_same_run(engine, flower)
    # The stateless path: a client that lost its node state recomputes ∇f^(c)(θ_a) exactly.
    cold, _ = run_grid(
        cfg.replace(out=str(tmp_path / "dc")),
        client_app=_forgetful_client_app(),
    )
    assert_same_run(engine, cold)
    # Bytes: θ̄ down and θ up every round, plus θ_a and ∇f(θ_a) down and ∇f^(c) up.
    down = [r["bytes_down"] for r in flower.history]
    up = [r["bytes_up"] for r in flower.history]
    assert down[1] > 2.5 * down[0] and up[0] > 1.8 * flower.history[0]["bytes_down"]
    assert down[1] == down[-1]


def _forgetful_client_app():
    """A ClientApp whose node forgets what it kept between messages (a SuperNode that
    restarted)."""
    from fedhmc_clients.app import KEPT_RECORD

    inner = make_client_app()

    def app(msg, context):
        if KEPT_RECORD in context.state:
            del context.state[KEPT_RECORD]
        return inner(msg, context)

    return app


def test_messages_carry_positions_round_seed_and_settings_but_no_private_seed(tmp_path):
    cfg = small_cfg(tmp_path, "m", rounds=1, burn_in=0)
    result, grid = run_grid(cfg)
    train = [m for m in grid.sent if m.metadata.message_type == "train"]
    assert len(train) == 4
    content = train[0].content
    assert content["arrays"]["theta"].numpy().shape == (2, result.summary["dim"])
    config = dict(content["config"])
    for key in (
        "round",
        "round-seed",
        "local-steps",
        "leapfrog-steps",
        "step-size",
        "rho",
        "batch-size",
        "grad-noise",
        "prior-std",
        "temperature",
    ):
        assert key in config
    assert not any("private" in k or "client-seed" in k for k in config)
    row = result.history[0]
    assert row["clients"] == 4 and row["failed"] == 0
    assert row["bytes_down"] > 4 * 2 * result.summary["dim"] * 4


def _failing_client(fail_round: int, fail_pid: int, corrupt=None):
    app = make_client_app()
    base = app

    def call(msg, context):
        r = dict(msg.content["config"]).get("round") if msg.content.get("config") else None
        pid = int(context.node_config["partition-id"])
        if r == fail_round and pid == fail_pid:
            if corrupt is None:
                raise RuntimeError("deliberate failure")
            reply = handle_train(msg, context)
            return corrupt(reply, msg)
        return base(msg, context)

    return call


def _raise_to_error_reply(client_app):
    """What Flower's runtime does with a raising ClientApp: an error reply."""
    from flwr.app import Error

    def call(msg, context):
        try:
            return client_app(msg, context)
        except Exception as e:  # noqa: BLE001
            return Message(Error(code=2, reason=repr(e)), reply_to=msg)

    return call


def test_client_that_raises_is_dropped_and_the_round_uses_the_others(tmp_path):
    failing = _raise_to_error_reply(_failing_client(2, 1))
    cfg = small_cfg(tmp_path, "x", rounds=3)
    result, _ = run_grid(cfg, failing)
    assert [r["clients"] for r in result.history] == [4, 3, 4]
    assert [r["failed"] for r in result.history] == [0, 1, 0]
    assert result.summary["status"] == "completed" and result.summary["client_failures"] == 1
    # Round 2's average is the n_c-weighted average of the three other clients' updates.
    theta1 = run_grid(cfg.replace(rounds=1, burn_in=0, out=str(tmp_path / "r1")))[0].theta_bar
    theta2 = run_grid(cfg.replace(rounds=2, out=str(tmp_path / "r2")), failing)[0].theta_bar
    full = cfg.resolve()
    target = build_problem(full).target
    s = sampler_settings(full)
    message = fahmc.Broadcast(2, round_seed(full.seed, 2), theta1)
    ups = {
        c: client_update(
            message, target.client(c), s, torch.tensor([client_seed(full.seed, c)])
        ).position[:, 0]
        for c in (0, 2, 3)
    }
    w = {c: float(target.counts[c]) for c in ups}
    want = sum(w[c] * ups[c] for c in ups) / sum(w.values())
    torch.testing.assert_close(theta2, want, rtol=1e-5, atol=1e-6)


def test_round_lines_for_a_deployed_run(tmp_path, caplog):
    from fedhmc_server.progress import log_final, round_logger

    cfg = small_cfg(tmp_path, "lines", rounds=2)
    grid = InProcessGrid(make_client_app(), 4, cfg.to_run_config())
    with caplog.at_level("INFO", logger="fedhmc.server"):
        result = serve(grid, cfg, on_round=round_logger(cfg.rounds))
        log_final(result)
    lines = [r.getMessage() for r in caplog.records if r.name == "fedhmc.server"]
    assert lines[0].startswith("round 1/2: 4 clients, 0 failed, accuracy ")
    assert lines[1].startswith("round 2/2: ")
    assert lines[2].startswith("completed: 2 of 2 rounds in ")


class StragglerGrid(InProcessGrid):
    """Holds back one node's reply to one round until the next round's messages are
    pushed: a straggler whose reply comes in after its round timed out."""

    def __init__(self, *args, node_pid: int, round_: int):
        super().__init__(*args)
        self.hold = (node_pid, round_)
        self.held: dict[str, Message] = {}

    def push_messages(self, messages):
        self.replies.update(self.held)  # the straggler wakes up during the next round
        self.held.clear()
        ids = super().push_messages(messages)
        for mid, msg in zip(ids, messages, strict=True):
            cfg = msg.content.get("config")
            pid = self.contexts[msg.metadata.dst_node_id].node_config["partition-id"]
            if cfg is not None and (pid, dict(cfg).get("round")) == self.hold:
                self.held[mid] = self.replies.pop(mid)
        return ids


def test_a_late_reply_is_recognised_and_kept_out_of_the_average(tmp_path, caplog):
    cfg = small_cfg(tmp_path, "late", rounds=3, round_timeout=0.2)
    grid = StragglerGrid(make_client_app(), 4, cfg.to_run_config(), node_pid=1, round_=2)
    with caplog.at_level("WARNING", logger="fedhmc.server"):
        result = serve(grid, cfg)
    assert [r["clients"] for r in result.history] == [4, 3, 4]  # back in round 3
    assert [r["failed"] for r in result.history] == [0, 1, 0]
    assert result.summary["late_replies"] == 1
    assert "late reply from client 101 to message group 2 ignored" in caplog.text
    # The same numbers as a run in which that client failed outright in round 2.
    failing = _raise_to_error_reply(_failing_client(2, 1))
    ref, _ = run_grid(cfg.replace(out=str(tmp_path / "ref")), failing)
    assert torch.equal(result.theta_bar, ref.theta_bar)


class SlowNodeGrid(InProcessGrid):
    """One node's reply to one round becomes available only ``hold`` seconds after it was
    pushed: a slow node (the others answer at once)."""

    def __init__(self, *args, node_pid: int, round_: int, hold: float):
        super().__init__(*args)
        self.target, self.hold = (node_pid, round_), hold
        self.held: dict[str, tuple[float, Message]] = {}

    def push_messages(self, messages):
        ids = super().push_messages(messages)
        for mid, msg in zip(ids, messages, strict=True):
            cfg = msg.content.get("config")
            pid = self.contexts[msg.metadata.dst_node_id].node_config["partition-id"]
            if cfg is not None and (pid, dict(cfg).get("round")) == self.target:
                self.held[mid] = (time.monotonic() + self.hold, self.replies.pop(mid))
        return ids

    def pull_messages(self, message_ids):
        now = time.monotonic()
        for mid, (at, rep) in list(self.held.items()):
            if now >= at:
                self.replies[mid] = rep
                del self.held[mid]
        return super().pull_messages(message_ids)


@pytest.mark.parametrize("factor", [2.0, 0.0])
def test_the_straggler_deadline_closes_a_round_without_a_slow_node(tmp_path, factor):
    """With --straggler-factor 2 (floor 0.2 s) round 2 closes at about twice round 1's
    length without the node that takes 30 s; with 0 (off) it waits for a node that takes
    2 s. (Round 1 is the clients' compute: seconds at most, even on a loaded machine.)"""
    cfg = small_cfg(tmp_path, f"s{factor}", rounds=2, straggler_factor=factor, straggler_floor=0.2)
    hold = 30.0 if factor else 2.0
    grid = SlowNodeGrid(make_client_app(), 4, cfg.to_run_config(), node_pid=2, round_=2, hold=hold)
    result = serve(grid, cfg)
    r1, r2 = result.history
    took = r2["wall_s"] - r1["wall_s"]
    if factor:
        assert (r2["clients"], r2["failed"]) == (3, 1)
        assert took < hold, took
    else:
        assert (r2["clients"], r2["failed"]) == (4, 0)
        assert took >= hold, took


def test_on_failure_stop_ends_the_run_with_a_clear_message(tmp_path):
    cfg = small_cfg(tmp_path, "s", on_failure="stop")
    with pytest.raises(FedHMCError, match="round 2: client .* failed"):
        run_grid(cfg, _raise_to_error_reply(_failing_client(2, 0)))


def _replace_arrays(fn=None, metrics=None):
    def corrupt(reply, msg):
        arrays = {k: v.numpy() for k, v in reply.content["arrays"].items()}
        if fn is not None:
            arrays = fn(arrays)
        m = dict(reply.content["metrics"])
        if metrics is not None:
            m.update(metrics)
        content = RecordDict(
            {
                "arrays": ArrayRecord({k: Array(v) for k, v in arrays.items()}),
                "metrics": MetricRecord(m),
            }
        )
        return Message(content, reply_to=msg)

    return corrupt


def _set(value):
    def fn(a):
        t = a["theta"].copy()
        t[0, 0] = value
        return {"theta": t}

    return fn


BAD_REPLIES = {
    "nan": _replace_arrays(_set(np.nan)),
    "+inf": _replace_arrays(_set(np.inf)),
    "-inf": _replace_arrays(_set(-np.inf)),
    "wrong-shape": _replace_arrays(lambda a: {"theta": a["theta"][:, :-1].copy()}),
    "broadcastable-(1,)": _replace_arrays(lambda a: {"theta": np.ones(1, np.float32)}),
    "wrong-dtype": _replace_arrays(lambda a: {"theta": a["theta"].astype(np.float64)}),
    "missing-key": _replace_arrays(lambda a: {"other": a["theta"]}),
    "num-examples-0": _replace_arrays(metrics={"num-examples": 0}),
    "num-examples--1": _replace_arrays(metrics={"num-examples": -1}),
    "num-examples-nan": _replace_arrays(metrics={"num-examples": math.nan}),
    "num-examples-1e12": _replace_arrays(metrics={"num-examples": 1e12}),
}


@pytest.mark.parametrize("case", list(BAD_REPLIES))
def test_bad_reply_is_rejected_and_never_enters_the_average(tmp_path, case):
    cfg = small_cfg(tmp_path, case, rounds=2)
    result, _ = run_grid(cfg, _failing_client(2, 2, BAD_REPLIES[case]))
    row = result.history[1]
    assert row["clients"] == 3 and row["failed"] == 1, case
    assert torch.isfinite(result.theta_bar).all()
    assert result.theta_bar.shape == (2, result.summary["dim"])


def _set_grad(fn):
    def change(a):
        out = dict(a)
        g = fn(a["grad"])
        if g is None:
            del out["grad"]
        else:
            out["grad"] = g
        return out

    return _replace_arrays(change)


BAD_DEBIASED_REPLIES = {
    "grad-nan": _set_grad(lambda g: np.where(np.arange(g.size).reshape(g.shape) == 0, np.nan, g)),
    "grad-inf": _set_grad(lambda g: np.full_like(g, -np.inf)),
    "grad-wrong-shape": _set_grad(lambda g: g[:, :-1].copy()),
    "grad-wrong-dtype": _set_grad(lambda g: g.astype(np.float64)),
    "grad-missing": _set_grad(lambda g: None),
}


@pytest.mark.parametrize("case", list(BAD_DEBIASED_REPLIES))
def test_bad_debiased_grad_is_rejected_and_never_enters_the_anchor(tmp_path, case):
    """Debiased FA-HMC replies carry the client's gradient at the anchor: a bad one is
    rejected with the whole reply, so neither its position nor its gradient is used."""
    cfg = small_cfg(tmp_path, case, rounds=3, algorithm="fahmc-debiased")
    result, _ = run_grid(cfg, _failing_client(2, 2, BAD_DEBIASED_REPLIES[case]))
    assert [r["failed"] for r in result.history] == [0, 1, 0], case
    assert result.summary["status"] == "completed"
    assert torch.isfinite(result.theta_bar).all()
    # The same as a run where that client's round-2 reply was lost altogether.
    ref, _ = run_grid(
        cfg.replace(out=str(tmp_path / "ref")), _raise_to_error_reply(_failing_client(2, 2))
    )
    assert torch.equal(result.theta_bar, ref.theta_bar)


@pytest.mark.parametrize(
    "arrays,n,match",
    [
        ({"theta": np.full((2, 3), np.nan, np.float32)}, 5, "non-finite"),
        ({"theta": np.zeros((2, 3), np.float32)}, True, "integer"),
        ({"theta": np.zeros((2, 3), np.float32)}, 2.5, "integer"),
        ({"theta": np.zeros((2, 3), np.float32)}, 11, "outside"),
        ({"theta": np.zeros((3,), np.float32)}, 5, "shape"),
        ({"theta": np.zeros((1, 3), np.float32)}, 5, "shape"),
        ({"theta": np.zeros((2, 3), np.float16)}, 5, "dtype"),
        ({}, 5, "missing"),
    ],
)
def test_validate_reply_matrix(arrays, n, match):
    with pytest.raises(ReplyError, match=match):
        validate_reply(arrays, n, shape=(2, 3), dtype=torch.float32, max_examples=10)
    ok = validate_reply(
        {"theta": np.zeros((2, 3), np.float32)},
        10,
        shape=(2, 3),
        dtype=torch.float32,
        max_examples=10,
    )
    assert ok["theta"].shape == (2, 3)


def test_waiting_for_clients_has_a_deadline(tmp_path):
    cfg = small_cfg(tmp_path, "w", num_clients=4, node_wait_timeout=0.2)
    grid = InProcessGrid(make_client_app(), 2, cfg.to_run_config())
    with pytest.raises(FedHMCError, match="only 2 of the 4 clients"):
        serve(grid, cfg)


def test_pyproject_run_config_is_the_run_config():
    flwr = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["flwr"]["app"]
    # A plugin's options travel in "sampler-options"; fedhmc's samplers' are keys of their own.
    declared = {o.key for o in sampler_options().values()} - set(builtin_option_keys())
    assert set(flwr["config"]) == set(RunConfig.keys()) - declared
    assert all(flwr["config"][k] == "" for k in builtin_option_keys())  # the sampler's default
    assert RunConfig.from_mapping(flwr["config"]) == RunConfig()
    assert flwr["components"] == {
        "serverapp": "fedhmc_server.app:app",
        "clientapp": "fedhmc_clients.app:app",
    }
    # Overrides in Flower's syntax map onto the same fields.
    cfg = RunConfig.from_mapping({**flwr["config"], "leapfrog-steps": 10, "local-steps": 50})
    assert (cfg.leapfrog_steps, cfg.local_steps) == (10, 50)


@pytest.mark.slow
@pytest.mark.parametrize("algorithm", ["fahmc", "fald"])
def test_simulation_engine_equals_the_engine(tmp_path, monkeypatch, algorithm):
    # fald is FA-HMC with K = 1: its co-located clients batch a round as fahmc's do.
    import fedhmc_server.simulation as simulation

    batched = []
    simulate = simulation._simulate

    def spy(run_simulation, server, client, cfg, colocated=True):
        batched.append(colocated)
        return simulate(run_simulation, server, client, cfg, colocated)

    monkeypatch.setattr(simulation, "_simulate", spy)
    k = {"leapfrog_steps": None} if algorithm == "fald" else {}
    cfg = small_cfg(tmp_path, "sim", rho=0.5, algorithm=algorithm, **k)
    engine = run(cfg.replace(out=str(tmp_path / "eng")), progress=False)
    flower = simulation.run_flower(cfg, progress=False)
    assert_same_run(engine, flower)
    assert flower.summary["backend"] == "flower"
    assert batched == [True]


def test_fald_colocated_clients_equal_the_engine(tmp_path):
    cfg = small_cfg(tmp_path, "e", algorithm="fald", leapfrog_steps=None, rho=0.5)
    engine = run(cfg, progress=False)
    flower, _ = run_grid(cfg.replace(out=str(tmp_path / "f")), colocated=True)
    assert_same_run(engine, flower)
    assert engine.config.leapfrog_steps == 1


@pytest.mark.parametrize(
    "extra",
    [
        dict(algorithm="fahmc-debiased", rho=0.5),
        dict(protocol="authors", local_steps=3, leapfrog_steps=4, step_size=1e-4),
    ],
)
def test_the_server_resumes_from_its_checkpoint_to_the_same_run(tmp_path, extra):
    import os
    import signal

    from fedhmc.errors import RunInterrupted

    cfg = small_cfg(tmp_path, "full", rounds=6, **extra)
    engine = run(cfg, progress=False)
    cut = cfg.replace(out=str(tmp_path / "cut"))
    rc = cut.to_run_config()

    def stop(row):
        if row["round"] == 2:
            os.kill(os.getpid(), signal.SIGTERM)

    grid = InProcessGrid(make_client_app(), cfg.num_clients, rc)
    with pytest.raises(RunInterrupted):
        serve(grid, cut, on_round=stop)
    grid = InProcessGrid(make_client_app(), cfg.num_clients, rc)
    resumed = serve(grid, cut.replace(resume=True))
    assert resumed.summary["resumed_from_round"] == 2
    assert_same_run(engine, resumed)


@pytest.mark.slow
@pytest.mark.parametrize("signame", ["SIGINT", "SIGTERM"])
def test_a_signal_ends_a_flower_simulation_within_seconds_and_resumes(tmp_path, signame):
    """SIGINT or SIGTERM to `fedhmc run --backend flower`: the round in flight finishes,
    the checkpoint is written, the command exits with 128 + the signal, no Ray process is
    left, and --resume finishes the run with the engine's numbers."""
    import os
    import signal
    import subprocess
    import sys
    import time

    signum = getattr(signal, signame)

    out = tmp_path / "fl"
    args = [
        "--backend",
        "flower",
        "--num-clients",
        "2",
        "--rounds",
        "12",
        "--local-steps",
        "20",
        "--chains",
        "2",
        "--quiet",
    ]
    env = {**os.environ, "FLWR_HOME": str(tmp_path / "home")}

    from fedhmc_server.reaper import tree

    proc = subprocess.Popen(
        [sys.executable, "-m", "fedhmc", "run", *args, "--out", str(out)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        env=env,
        text=True,
    )
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline:
        try:
            if len((out / "metrics.csv").read_text().splitlines()) > 2:
                break
        except OSError:
            pass
        time.sleep(0.2)
    ours = tree(proc.pid)  # this run's own processes (Ray's among them), by PID and start
    assert ours
    t0 = time.monotonic()
    proc.send_signal(signum)
    code = proc.wait(timeout=120)
    took = time.monotonic() - t0
    err = proc.stderr.read()
    assert code == 128 + signum, err
    assert took < 60, took
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "interrupted"
    assert (out / "checkpoint.pt").exists()
    assert not _still_running(ours, within=10.0)
    done = subprocess.run(
        [sys.executable, "-m", "fedhmc", "run", "--resume", str(out), "--quiet"],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr
    engine = run(
        RunConfig.from_mapping(
            {
                **json.loads((out / "config.json").read_text()),
                "backend": "engine",
                "resume": False,
                "out": str(tmp_path / "engine"),
            }
        ),
        progress=False,
    )
    with open(out / "metrics.csv") as f:
        flower_rows = list(csv.DictReader(f))
    assert len(flower_rows) == len(engine.history) == 12
    for a, b in zip(flower_rows, engine.history, strict=True):
        assert float(a["nll_sum"]) == pytest.approx(b["nll_sum"], rel=1e-4)


class SendAndReceiveGrid(InProcessGrid):
    """A Grid with Flower's blocking send_and_receive only (no push/pull)."""

    def push_messages(self, messages):
        raise NotImplementedError

    def pull_messages(self, message_ids):
        raise NotImplementedError

    def send_and_receive(self, messages, *, timeout=None):
        replies = []
        for msg in messages:
            self.stamp(msg)
            reply = self.client_app(msg, self.contexts[msg.metadata.dst_node_id])
            if reply is not None:
                replies.append(reply)
        return replies


def test_a_grid_without_push_and_pull_gives_the_same_run(tmp_path):
    cfg = small_cfg(tmp_path, "a", rounds=2)
    a, _ = run_grid(cfg)
    grid = SendAndReceiveGrid(make_client_app(), 4, cfg.to_run_config())
    b = serve(grid, cfg.replace(out=str(tmp_path / "b")))
    assert torch.equal(a.theta_bar, b.theta_bar)


def _still_running(procs: dict[int, int], within: float) -> dict[int, int]:
    """Those of ``procs`` (PID → start time) still alive after waiting up to ``within`` s."""
    import time

    from fedhmc_server.reaper import _stat

    deadline = time.monotonic() + within
    while True:
        left = {p: t for p, t in procs.items() if (_stat(p) or (0, -1))[1] == t}
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.2)


@pytest.mark.slow
def test_kill_9_of_a_flower_simulation_leaves_no_process_behind(tmp_path):
    """SIGKILL gives Ray no chance to shut down: the run's watchdog stops every process the
    simulation started within seconds (Ray's agents would linger for a minute)."""
    import os
    import signal
    import subprocess
    import sys
    import time

    from fedhmc_server.reaper import tree

    out = tmp_path / "fl"
    proc = subprocess.Popen(
        [sys.executable, "-m", "fedhmc", "run", "--backend", "flower", "--num-clients", "2",
         "--rounds", "200", "--local-steps", "20", "--quiet", "--out", str(out)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env={**os.environ, "FLWR_HOME": str(tmp_path / "home")},
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 240
        while (
            not (out / "metrics.csv").exists()
            or len((out / "metrics.csv").read_text().splitlines()) < 3
        ):
            assert time.monotonic() < deadline and proc.poll() is None, "no round in 240 s"
            time.sleep(0.2)
        ours = {p: t for p, t in tree(proc.pid).items()}
        assert len(ours) >= 3, ours  # Ray's GCS, raylet and workers at least
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    left = _still_running(
        {p: t for p, t in ours.items() if "reaper" not in _cmdline(p)}, within=10.0
    )
    assert not left, {p: _cmdline(p) for p in left}


def _cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


@pytest.mark.parametrize(
    "scheme, extra",
    [
        ("weighted", {}),
        ("uniform", {"partition": "dirichlet", "dirichlet_alpha": 0.5}),
        (
            "normalized",
            {"protocol": "authors", "local_steps": 7, "leapfrog_steps": 5, "step_size": 1e-4},
        ),
    ],
)
def test_flower_draws_the_engines_clients_and_equals_it(tmp_path, scheme, extra):
    """Partial participation on Flower: the ServerApp sends each round to the engine's drawn
    clients only, and the co-located clients (the simulation's) give the engine's chain
    bit for bit."""
    cfg = small_cfg(
        tmp_path, "e", rounds=4, clients_per_round=2, participation=scheme, rho=0.5, **extra
    )
    engine = run(cfg, progress=False)
    flower, grid = run_grid(cfg.replace(out=str(tmp_path / "f")), colocated=True)
    assert torch.equal(engine.theta_bar, flower.theta_bar)
    from fedhmc.algorithms import fahmc
    from fedhmc.runtime.loop import sampler_settings

    full = cfg.resolve()
    weights = build_problem(full).target.weights
    state = fahmc.init(engine.theta_bar, sampler_settings(full))
    for r in range(1, 5):
        state = fahmc.State(state.position, r - 1)
        drawn = fahmc.broadcast(full.seed, state, sampler_settings(full), weights).client_ids
        sent = [
            m for m in grid.sent
            if m.metadata.message_type == "train" and int(m.content["config"]["round"]) == r
        ]  # fmt: skip
        assert len(sent) == len(drawn) == engine.history[r - 1]["clients"]
