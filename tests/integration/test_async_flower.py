"""Asynchronous distributed SG-MCMC on Flower (async-sghmc / async-sgld).

Most checks are on the pure server state machine (fedhmc.algorithms.async_sgmcmc): staleness
bookkeeping on scripted arrival orders, dropping, and the update against
fedhmc.algorithms.stale bit for bit. The real ServerApp body and ClientApp then run over a small
threaded Grid (push/pull, replies in any order) with a worker that raises and one that
hangs, and once through Flower's simulation engine on the heterogeneous Gaussian, whose
posterior N(m 1, v I) is exact.
"""

from __future__ import annotations

import json
import math
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

pytest.importorskip("flwr")  # (a machine with torch alone skips this module)

import torch
from _grids import LocalGrid
from fedhmc_clients.app import make_client_app
from flwr.app import Array, ArrayRecord, Error, Message, RecordDict

from fedhmc.algorithms import async_sgmcmc, stale
from fedhmc.algorithms.async_sgmcmc import AsyncChain, euler_step, pooled_histogram
from fedhmc.algorithms.oracles import from_grad
from fedhmc.analysis.diagnostics import ess_basic
from fedhmc.errors import ConfigError
from fedhmc.runtime.config import RunConfig
from fedhmc.runtime.engine import run

pytestmark = pytest.mark.slow  # Flower

Z = 5.0
M, V = 2.0, 0.5


def gaussian_grad(theta, step=0):
    return (theta - M) / V


def make_chain(method="sghmc", max_staleness=10, D=3, seed=0, **kw):
    s = async_sgmcmc.Settings(
        method, kw.pop("h", 0.05), kw.pop("B", 2.0), max_staleness=max_staleness
    )
    theta0 = torch.linspace(-1, 1, D, dtype=torch.float64)
    return AsyncChain(theta0, s, seed, 0, **kw), theta0


# --------------------------------------------------------------- the state machine
def test_staleness_bookkeeping_is_exact_on_a_scripted_arrival_order():
    chain, _ = make_chain()
    sent = {}
    for w in ("a", "b", "c"):
        sent[w] = chain.send(w)  # all at t = 0
    log = []

    def arrive(w):
        theta, t = sent[w]
        applied = chain.receive(w, gaussian_grad(theta), t)
        log.append((w, chain.t - 1 - t if applied else None))
        sent[w] = chain.send(w)

    for w in ("b", "a", "a", "c", "b", "a", "c"):
        arrive(w)
    # b: sent 0, applied at 0 → 0; a: sent 0, at 1 → 1; a: sent 2, at 2 → 0;
    # c: sent 0, at 3 → 3; b: sent 1, at 4 → 3; a: sent 3, at 5 → 2; c: sent 4, at 6 → 2.
    assert [tau for _, tau in log] == [0, 1, 0, 3, 3, 2, 2]
    assert dict(chain.staleness) == {0: 2, 1: 1, 2: 2, 3: 2}
    assert chain.t == 7 and chain.dropped == 0
    assert {w: s.applied for w, s in chain.workers.items()} == {"a": 3, "b": 2, "c": 2}


def test_a_too_stale_gradient_is_dropped_and_counted():
    chain, _ = make_chain(max_staleness=1)
    theta_a, t_a = chain.send("a")
    theta_b, t_b = chain.send("b")
    theta_c, t_c = chain.send("c")
    assert chain.receive("a", gaussian_grad(theta_a), t_a)  # τ = 0
    assert chain.receive("b", gaussian_grad(theta_b), t_b)  # τ = 1 ≤ 1
    before = chain.theta.clone(), chain.momentum.clone()
    assert not chain.receive("c", gaussian_grad(theta_c), t_c)  # τ = 2 > 1: dropped
    assert torch.equal(chain.theta, before[0]) and torch.equal(chain.momentum, before[1])
    assert chain.t == 2 and chain.dropped == 1 and chain.workers["c"].dropped == 1
    assert pooled_histogram([chain]) == {0: 1, 1: 1, 2: 1}
    assert pooled_histogram([chain], applied_only=True) == {0: 1, 1: 1}
    with pytest.raises(ValueError, match="timestamp"):
        chain.receive("a", gaussian_grad(theta_a), 5)


@pytest.mark.parametrize("method", ["sghmc", "sgld"])
@pytest.mark.parametrize("workers", [1, 3])
def test_round_robin_workers_are_sgmcmc_with_fixed_staleness_bit_for_bit(method, workers):
    """W workers answering in turn give staleness W − 1, and the first W − 1 gradients are
    taken at θ_0: exactly fedhmc.algorithms.stale's stale chain with τ = W − 1 (τ = 0: plain SGHMC /
    SGLD), with the same noise."""
    steps, D = 25, 4
    settings = async_sgmcmc.Settings(method, 0.05, 2.0, temperature=0.7, max_staleness=workers)
    theta0 = torch.linspace(-1, 1, D, dtype=torch.float64)
    chain = AsyncChain(theta0, settings, 3, 0)
    sent = {w: chain.send(w) for w in range(workers)}
    for i in range(steps):
        w = i % workers
        theta, t = sent[w]
        assert chain.receive(w, gaussian_grad(theta), t)
        sent[w] = chain.send(w)
    assert dict(chain.staleness) == (
        {**{k: 1 for k in range(workers - 1)}, workers - 1: steps - workers + 1}
    )
    ref = stale.Settings(
        method, 0.05, 2.0, staleness=workers - 1, temperature=0.7, local_steps=steps
    )
    want, _ = stale.step(3, stale.init(theta0.view(1, D), ref), from_grad(gaussian_grad), ref)
    assert torch.equal(chain.theta, want.position[0])
    if method == "sghmc":
        assert torch.equal(chain.momentum, want.momentum[0])


def test_euler_step_is_the_sghmc_and_sgld_formula():
    th, q, g, z = (torch.tensor([v], dtype=torch.float64) for v in (1.0, 0.5, 2.0, -0.3))
    h, B = 0.1, 3.0
    t2, q2 = euler_step("sghmc", th, q, g, z, h, B)
    q_want = (1 - B * h) * 0.5 - h * 2.0 + math.sqrt(2 * B * h) * -0.3
    assert float(q2) == pytest.approx(q_want) and float(t2) == pytest.approx(1.0 + h * q_want)
    t3, q3 = euler_step("sgld", th, q, g, z, h, B)
    assert float(t3) == pytest.approx(1.0 - h * 2.0 + math.sqrt(2 * h) * -0.3)
    assert torch.equal(q3, q)


def test_failures_retire_a_worker():
    chain, _ = make_chain()
    theta, t = chain.send("x")
    assert not chain.fail("x", lost=False, max_failures=2)
    assert chain.fail("x", lost=False, max_failures=2)  # two in a row
    chain.send("y")
    chain.fail("y", lost=False, max_failures=2)
    chain.receive("y", gaussian_grad(theta), t)  # a success resets the count
    assert not chain.fail("y", lost=False, max_failures=2)
    chain.send("z")
    assert chain.fail("z", lost=True, max_failures=5)  # lost: retired at once
    assert chain.active_workers() == ["y"]
    assert (chain.workers["x"].errors, chain.workers["z"].lost) == (2, 1)


@pytest.mark.parametrize(
    "kw,needle",
    [
        (dict(chains=3, num_clients=2), "--num-clients ≥ --chains"),
        (dict(staleness=2), "--max-staleness"),
        (dict(max_staleness=-1), "--max-staleness"),
        (dict(leapfrog_steps=5), "--leapfrog-steps is not an option of --algorithm async-sghmc"),
        (dict(max_worker_failures=0), "--max-worker-failures"),
    ],
)
def test_bad_async_settings_give_one_line(kw, needle):
    with pytest.raises(ConfigError, match=needle):
        RunConfig(algorithm="async-sghmc", dataset="gaussian-hetero", **kw).resolve()


def test_the_engine_backend_says_to_use_flower(tmp_path):
    cfg = RunConfig(algorithm="async-sgld", dataset="gaussian-hetero", out=str(tmp_path))
    with pytest.raises(ConfigError, match="--backend flower"):
        run(cfg, progress=False)
    assert cfg.resolve().chains == 1  # one server by default


# ----------------------------------------------------- the apps over a threaded Grid
class ThreadGrid(LocalGrid):
    """Delivers each pushed message to the ClientApp on a thread of its own; pull returns
    the replies that are done (in any order), as Flower's grids do. A ClientApp that
    raises gives an error reply, as Flower's runtime does."""

    def __init__(self, client_app, num_nodes: int, run_config: dict):
        super().__init__(client_app, num_nodes, run_config)
        self.pool = ThreadPoolExecutor(max_workers=2 * num_nodes + 2)
        self.futures: dict = {}
        self.lock = threading.Lock()

    def _call(self, msg):
        try:
            return self.client_app(msg, self.contexts[msg.metadata.dst_node_id])
        except Exception as e:  # noqa: BLE001
            return Message(Error(code=2, reason=repr(e)), reply_to=msg)

    def push_messages(self, messages):
        ids = []
        for msg in messages:
            mid = self.stamp(msg)
            with self.lock:
                self.futures[mid] = self.pool.submit(self._call, msg)
            ids.append(mid)
        return ids

    def pull_messages(self, message_ids):
        out = []
        with self.lock:
            for mid in message_ids:
                f = self.futures.get(mid)
                if f is not None and f.done():
                    out.append(f.result())
                    del self.futures[mid]
        return out

    def send_and_receive(self, messages, *, timeout=None):
        ids = self.push_messages(messages)
        for mid in ids:
            self.futures[mid].result(timeout=timeout)
        return self.pull_messages(ids)


def test_a_worker_that_raises_and_one_that_hangs_do_not_stop_the_run(tmp_path):
    from fedhmc_server.async_loop import serve_async

    release = threading.Event()
    inner = make_client_app()
    calls = {1: 0, 2: 0}

    def app(msg, context):
        pid = int(context.node_config["partition-id"])
        if msg.metadata.message_type == "query.grad":
            time.sleep(0.01)  # the run lasts ≥ 1.5 s: longer than the 1 s timeout
        if msg.metadata.message_type == "query.grad" and pid in calls:
            calls[pid] += 1
            if pid == 1 and calls[pid] > 2:
                raise RuntimeError("deliberate failure")
            if pid == 2 and calls[pid] == 3:
                release.wait(30)  # hangs until the test is over
        return inner(msg, context)

    cfg = RunConfig(
        algorithm="async-sghmc",
        dataset="gaussian-hetero",
        num_clients=4,
        dim=3,
        rounds=15,
        local_steps=20,
        burn_in=2,
        step_size=0.05,
        friction=2.0,
        round_timeout=1.0,
        max_worker_failures=3,
        out=str(tmp_path / "f"),
    )
    grid = ThreadGrid(app, 4, cfg.to_run_config())
    t0 = time.monotonic()
    try:
        result = serve_async(grid, cfg)
    finally:
        release.set()
        grid.pool.shutdown(wait=True)
    assert time.monotonic() - t0 < 30
    summary = json.loads((tmp_path / "f" / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["rounds_completed"] == 15
    a = summary["async"]
    assert a["updates"][0] >= 300
    assert a["errors"] == 3 and a["lost"] == 1
    by_pid = {w["partition"]: w for w in a["per_worker"]}
    assert by_pid[1]["retired"] and by_pid[1]["errors"] == 3 and by_pid[1]["applied"] == 2
    assert by_pid[2]["retired"] and by_pid[2]["lost"] == 1 and by_pid[2]["applied"] == 2
    assert not by_pid[0]["retired"] and not by_pid[3]["retired"]
    assert sum(w["applied"] for w in a["per_worker"]) == a["updates"][0]
    # The failures are in the per-round files too.
    assert sum(r["failed"] for r in result.history) == 4
    assert result.history[-1]["clients"] == 2
    rows = (tmp_path / "f" / "workers.csv").read_text().splitlines()
    assert rows[0].startswith("node,partition,chain,applied") and len(rows) == 5
    stale = (tmp_path / "f" / "staleness.csv").read_text().splitlines()
    assert stale[0] == "chain,staleness,received,applied,dropped"
    received = sum(int(r.split(",")[2]) for r in stale[1:])
    assert received == a["updates"][0] + a["dropped_stale"]


BAD_GRADS = {
    "nan": lambda g: np.where(np.arange(g.size).reshape(g.shape) == 0, np.nan, g),
    "inf": lambda g: np.full_like(g, np.inf),
    "wrong-shape": lambda g: g[..., :-1].copy(),
    "scalar": lambda g: np.ones((), g.dtype),
    "wrong-dtype": lambda g: g.astype(np.float64 if g.dtype == np.float32 else np.float32),
    "missing": lambda g: None,
}


@pytest.mark.parametrize("case", list(BAD_GRADS))
def test_a_bad_async_gradient_is_rejected_and_never_applied(tmp_path, case):
    """Worker 1's third reply carries a bad gradient: the server rejects it (counted, never
    applied), re-sends θ, and the run completes with finite chains."""
    from fedhmc_server.async_loop import serve_async

    inner = make_client_app()
    calls = {"n": 0}

    def app(msg, context):
        reply = inner(msg, context)
        pid = int(context.node_config["partition-id"])
        if msg.metadata.message_type == "query.grad" and pid == 1:
            calls["n"] += 1
            if calls["n"] == 3:
                grad = BAD_GRADS[case](reply.content["arrays"]["grad"].numpy())
                arrays = ArrayRecord({} if grad is None else {"grad": Array(grad)})
                content = RecordDict({"arrays": arrays, "metrics": reply.content["metrics"]})
                return Message(content, reply_to=msg)
        return reply

    cfg = RunConfig(
        algorithm="async-sgld",
        dataset="gaussian-hetero",
        num_clients=3,
        dim=3,
        rounds=4,
        local_steps=5,
        step_size=0.05,
        round_timeout=10.0,
        out=str(tmp_path / case),
    )
    grid = ThreadGrid(app, 3, cfg.to_run_config())
    try:
        result = serve_async(grid, cfg)
    finally:
        grid.pool.shutdown(wait=True)
    a = result.summary["async"]
    assert result.summary["status"] == "completed"
    assert a["rejected"] == 1 and a["errors"] == 1, a
    by_pid = {w["partition"]: w for w in a["per_worker"]}
    assert by_pid[1]["errors"] == 1 and not by_pid[1]["retired"]
    assert sum(w["applied"] for w in a["per_worker"]) == a["updates"][0]
    assert torch.isfinite(result.theta_bar).all()


def test_two_servers_get_their_own_workers(tmp_path):
    from fedhmc_server.async_loop import serve_async

    cfg = RunConfig(
        algorithm="async-sgld",
        dataset="gaussian-hetero",
        num_clients=4,
        chains=2,
        dim=2,
        rounds=4,
        local_steps=5,
        burn_in=0,
        step_size=0.01,
        out=str(tmp_path / "s2"),
    )
    grid = ThreadGrid(make_client_app(), 4, cfg.to_run_config())
    try:
        result = serve_async(grid, cfg)
    finally:
        grid.pool.shutdown(wait=True)
    a = result.summary["async"]
    assert a["servers"] == 2 and min(a["updates"]) >= 20
    assert {w["partition"]: w["chain"] for w in a["per_worker"]} == {0: 0, 1: 1, 2: 0, 3: 1}
    assert result.theta_bar.shape == (2, 2)
    assert not torch.equal(result.theta_bar[0], result.theta_bar[1])


# ------------------------------------------------------- Flower's simulation engine
def stale_gaussian_var(h: float, B: float, tau: int, v: float) -> float:
    """Exact stationary variance of SGHMC with fixed staleness τ on (θ − m)²/(2v)."""
    a, n = 1.0 / v, tau + 2
    A, b = np.zeros((n, n)), np.zeros(n)
    A[n - 1, n - 1], A[n - 1, tau] = 1 - B * h, -h * a
    b[n - 1] = math.sqrt(2 * B * h)
    A[0, 0] = 1.0
    A[0, :] += h * A[n - 1, :]
    b[0] = h * b[n - 1]
    for i in range(1, tau + 1):
        A[i, i - 1] = 1.0
    sigma, power = np.outer(b, b), A.copy()
    for _ in range(60):
        sigma = sigma + power @ sigma @ power.T
        power = power @ power
    return float(sigma[0, 0])


def test_async_sghmc_in_flower_simulation_recovers_the_gaussian(tmp_path):
    """3 workers, one server, d = 1000 independent coordinates of N(m, v) (m = 16.2,
    v = 1.2 for 3 clients). Exact gradients, so the stationary mean is m for any staleness;
    the variance is biased by staleness τ by at most the exact fixed-τ bias at the largest
    τ applied (0.022·τ·v at h = 0.05, B = 2, at most 0.2 v for τ ≤ 10 = the drop bound).
    Tolerances: Z = 5 Monte Carlo standard errors from the samples' ESS."""
    from fedhmc_server.simulation import run_flower

    h, B = 0.05, 2.0
    cfg = RunConfig(
        algorithm="async-sghmc",
        backend="flower",
        dataset="gaussian-hetero",
        num_clients=3,
        dim=1000,
        rounds=90,
        local_steps=5,
        burn_in=40,
        step_size=h,
        friction=B,
        max_staleness=10,
        save_samples=True,
        out=str(tmp_path / "sim"),
    )
    result = run_flower(cfg, progress=False)
    summary = json.loads((tmp_path / "sim" / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["backend"] == "flower"
    a = summary["async"]
    hist = {int(k): v for k, v in a["staleness_histogram"].items()}
    assert a["updates"][0] >= 450
    assert sum(v for k, v in hist.items() if k >= 1) > 0.5 * sum(hist.values())
    assert a["errors"] == 0 and a["lost"] == 0
    assert {w["partition"] for w in a["per_worker"]} == {0, 1, 2}
    assert all(w["applied"] > 0 for w in a["per_worker"])
    assert len(result.history) == 90

    samples = np.load(tmp_path / "sim" / "samples.npy").astype(np.float64)  # (50, 1, 1000)
    assert samples.shape == (50, 1, 1000)
    m, v = 16.2, 1.2
    ess = float(ess_basic(samples).sum())  # coordinates are independent chains
    x = samples.ravel()
    print(f"ESS {ess:.0f}, mean {x.mean():.4f}, var {x.var():.4f}, staleness {hist}")
    assert ess > 2000
    assert abs(x.mean() - m) < Z * math.sqrt(v / ess)
    tau_max = max(k for k in hist if k <= cfg.max_staleness)
    bias = max(abs(stale_gaussian_var(h, B, t, v) - v) for t in range(tau_max + 1))
    assert bias < 0.25 * v
    assert abs(x.var() - v) < Z * v * math.sqrt(2 / ess) + bias


def test_data_workers_send_their_partition_gradient(tmp_path):
    """On data, worker c sends ∇f̃^(c) (its data scaled to n, docs/algorithms.md): the
    ClientApp's reply equals the engine's client target's gradient at the same θ."""
    from fedhmc_clients.app import handle_grad
    from flwr.app import Array, ArrayRecord, ConfigRecord

    from fedhmc.algorithms.async_sgmcmc import worker_key
    from fedhmc.algorithms.fahmc import client_seed
    from fedhmc.runtime.problem import build_problem

    cfg = RunConfig(
        algorithm="async-sghmc",
        num_clients=3,
        partition="iid",
        rounds=3,
        local_steps=4,
        burn_in=1,
        out=str(tmp_path / "d"),
    )
    grid = ThreadGrid(make_client_app(), 3, cfg.to_run_config())
    try:
        from fedhmc_server.async_loop import serve_async

        result = serve_async(grid, cfg)
    finally:
        grid.pool.shutdown(wait=True)
    assert result.summary["status"] == "completed" and "accuracy" in result.history[-1]
    assert result.summary["async"]["updates"][0] >= 12

    full = cfg.resolve()
    target = build_problem(full).target
    theta = torch.linspace(-0.1, 0.1, target.dim, dtype=torch.float32)
    content = RecordDict(
        {
            "arrays": ArrayRecord({"theta": Array(theta.numpy())}),
            "config": ConfigRecord(
                {
                    "chain": 0,
                    "request": 7,
                    "num-examples-total": int(target.counts.sum()),
                    "batch-size": int(full.batch_size),
                    "prior-std": float(full.prior_std),
                    "grad-noise": 0.0,
                }
            ),
        }
    )
    ctx = grid.contexts[101]
    msg = Message(content, dst_node_id=101, message_type="query.grad")
    reply = handle_grad(msg, ctx, cfg.to_run_config())
    got = torch.as_tensor(reply.content["arrays"]["grad"].numpy())
    key = worker_key(client_seed(full.seed, 1), 0)
    want, _ = target.client(1).grad(theta.view(1, 1, -1).clone(), key.view(1, 1), 7, False)
    torch.testing.assert_close(got, want[0, 0])
    assert reply.content["metrics"]["num-examples"] == int(target.counts[1])
