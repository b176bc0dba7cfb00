"""Flower on a device. Without a GPU: the simulation's Ray resources under --device cpu
and cuda, each client's device (the run's, or its SuperNode's node config ``device``), a
device a node lacks as one line, and a CPU node beside nodes of another device giving the
engine's chain. With a GPU (``-m gpu``): the apps and the simulation on ``--device cuda``
give the CPU engine's chain."""

from __future__ import annotations

import logging
import os
import threading

import pytest

pytest.importorskip("flwr")  # (a machine with torch alone skips this module)

import torch
from _grids import InProcessGrid
from fedhmc_clients import compute as cc
from fedhmc_clients.app import handle, make_client_app
from fedhmc_clients.compute import COLOCATED_KEY
from fedhmc_clients.worker import call, serve_worker
from fedhmc_server import simulation as sim
from fedhmc_server.loop import serve as serve_run
from flwr.app import Context, Message, RecordDict

from fedhmc.errors import ConfigError, FedHMCError
from fedhmc.runtime.config import RunConfig
from fedhmc.runtime.engine import run

GPU = torch.cuda.is_available()


def flower(**kw) -> RunConfig:
    """A Flower run's config, built without the machine's device check."""
    return RunConfig(backend="flower", num_clients=4, **kw)


# --------------------------------------------------------------------- simulation resources
@pytest.mark.parametrize("colocated", [True, False])
def test_a_cpu_run_asks_ray_for_no_gpu(colocated):
    cfg = flower()
    want = {"num_cpus": 8 if colocated else 1, "num_gpus": 0.0}
    assert sim.client_resources(cfg, 8, colocated) == want
    args = sim.ray_init_args(cfg, 8, gpus=2)
    assert (args["num_cpus"], args["num_gpus"]) == (8, 0)
    assert sim.ray_visible_devices("cpu", "0,1") is None


@pytest.mark.parametrize(("share", "want"), [(None, 1.0), (0.25, 0.25), (1.0, 1.0)])
@pytest.mark.parametrize("colocated", [True, False])
def test_a_cuda_run_gives_each_client_its_share_of_a_gpu(share, want, colocated):
    cfg = flower(device="cuda", client_gpus=share)
    got = sim.client_resources(cfg, 8, colocated)
    assert got == {"num_cpus": 8 if colocated else 1, "num_gpus": want}
    assert sim.ray_init_args(cfg, 8, gpus=4)["num_gpus"] == 4  # every GPU of the machine
    assert sim.ray_visible_devices("cuda", "0,1") is None  # Ray places the clients


def test_cuda_n_gives_ray_gpu_n_alone():
    cfg = flower(device="cuda:2", client_gpus=0.5)
    assert sim.client_resources(cfg, 8, False)["num_gpus"] == 0.5
    assert sim.ray_init_args(cfg, 8, gpus=4)["num_gpus"] == 1
    assert sim.ray_visible_devices("cuda:2", None) == "2"
    assert sim.ray_visible_devices("cuda:1", "3,5") == "5"  # as this process numbers them
    assert sim.ray_visible_devices("cuda:0", "GPU-ab, GPU-cd") == "GPU-ab"


def _fake_simulation(seen: dict):
    def run_simulation(**kw):
        seen.update(kw)
        seen["visible"] = os.environ.get("CUDA_VISIBLE_DEVICES")

    return run_simulation


def test_the_simulation_hands_flower_these_resources_and_restores_the_environment(
    monkeypatch,
):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4,6")
    monkeypatch.setattr(torch.cuda, "init", lambda: None)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    seen: dict = {}
    cfg = flower(device="cuda:1", client_gpus=0.5)
    sim._simulate(_fake_simulation(seen), "server", "client", cfg, colocated=False)
    backend = seen["backend_config"]
    assert backend["client_resources"] == {"num_cpus": 1, "num_gpus": 0.5}
    assert backend["init_args"]["num_gpus"] == 1
    assert seen["visible"] == "6"  # Ray's processes see the run's GPU alone
    assert os.environ["CUDA_VISIBLE_DEVICES"] == "4,6"

    seen.clear()
    sim._simulate(_fake_simulation(seen), "server", "client", flower(device="cuda"), True)
    assert seen["backend_config"]["client_resources"]["num_gpus"] == 1.0
    assert seen["backend_config"]["init_args"]["num_gpus"] == 2
    assert seen["visible"] == "4,6"

    seen.clear()
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    sim._simulate(_fake_simulation(seen), "server", "client", flower(), True)
    assert seen["backend_config"]["client_resources"]["num_gpus"] == 0.0
    assert seen["backend_config"]["init_args"]["num_gpus"] == 0
    assert seen["visible"] is None


# --------------------------------------------------------------------- the client's device
def test_a_client_computes_on_its_nodes_device_else_the_runs():
    assert cc.client_device({"device": "cuda"}, {"device": "cpu"}) == "cpu"
    assert cc.client_device({"device": "cpu"}, {}) == "cpu"
    assert cc.client_device({"device": "cuda:1"}, {"device": ""}) == "cuda:1"
    assert cc.client_device({}, {}) == "cpu"


def test_in_a_ray_worker_with_a_gpu_share_cuda_is_the_gpu_ray_gave():
    assert cc.client_device({"device": "cuda:1"}, {}, ray_gpus=["3"]) == "cuda"
    assert cc.client_device({"device": "cuda"}, {}, ray_gpus=["0"]) == "cuda"
    assert cc.client_device({"device": "cpu"}, {}, ray_gpus=["0"]) == "cpu"
    assert cc.client_device({"device": "cuda:1"}, {}, ray_gpus=[]) == "cuda:1"


def test_a_cpu_node_runs_without_the_runs_cuda_graphs():
    """A run asking for CUDA graphs on its GPU nodes: a CPU node computes without them
    (they say how a GPU computes, not what), instead of refusing the run's config."""
    rc = {**RunConfig(num_clients=4).to_run_config(), "device": "cuda", "cuda-graphs": True}
    cfg, pid = cc.identity(rc, {"partition-id": 1, "num-partitions": 4, "device": "cpu"})
    assert (cfg.device, cfg.cuda_graphs, pid) == ("cpu", False, 1)


def test_flower_targets_replay_rounds_when_the_config_says_so():
    """The co-located clients' target, a deployed client's and the engine's take the run's
    CUDA graphs, unless the algorithm has no clients' rounds (set here on a CPU config,
    where a run would refuse them, to see the wiring)."""
    from fedhmc.runtime.problem import build_client_target, build_clients_target

    cfg = RunConfig(num_clients=4).resolve()
    assert build_clients_target(cfg).graphs is None
    assert build_client_target(cfg, 0)[0].graphs is None
    object.__setattr__(cfg, "cuda_graphs", True)
    assert build_clients_target(cfg).graphs is not None
    assert build_client_target(cfg, 0)[0].graphs is not None
    gauss = RunConfig(num_clients=4, dataset="gaussian-hetero").resolve()
    object.__setattr__(gauss, "cuda_graphs", True)
    assert build_client_target(gauss, 2)[0].graphs is not None
    from fedhmc.runtime.problem import build_problem

    pooled = RunConfig(num_clients=4, algorithm="sghmc").resolve()  # no clients' rounds
    object.__setattr__(pooled, "cuda_graphs", True)
    assert build_problem(pooled).target.graphs is None
    assert build_problem(cfg).target.graphs is not None


def _cuda_run_config(**kw) -> dict:
    """A run config whose device is cuda (refused by a client without a GPU)."""
    return {**RunConfig(num_clients=2, **kw).to_run_config(), "device": "cuda"}


def test_the_node_configs_device_overrides_the_runs_for_its_target():
    from fedhmc_clients.task import partition_target

    rc = _cuda_run_config()
    rc["client-gpus"] = 0.5  # the simulation's setting: ignored by a client
    node = {"partition-id": 1, "num-partitions": 2, "device": "cpu"}
    cfg, pid = cc.identity(rc, node)
    assert (cfg.device, pid) == ("cpu", 1)
    _, metrics = cc.compute("query", rc, node, {}, {})
    target, n_c = partition_target(cfg, 1)
    assert metrics == {"num-examples": n_c, "partition-id": 1}
    assert target.device == torch.device("cpu")
    if not GPU:  # without the node's device the run's cuda is refused here
        with pytest.raises(ConfigError, match="--device cuda"):
            cc.compute("query", rc, {"partition-id": 1, "num-partitions": 2}, {}, {})


@pytest.mark.parametrize(
    ("device", "gpus", "match"),
    [
        ("cuda", 0, "node config device='cuda': no CUDA GPU is available on this node; use dev"),
        ("cuda:7", 1, r"node config device='cuda:7': this node has 1 GPU\(s\); use cuda:0"),
        ("nonsense", 0, "node config device='nonsense' is not a torch device"),
        ("meta", 0, "node config device='meta': fedhmc runs on cpu or cuda"),
    ],
)
def test_a_device_the_node_lacks_is_one_line(monkeypatch, device, gpus, match):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: gpus > 0)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: gpus)
    node = {"partition-id": 0, "num-partitions": 2, "device": device}
    with pytest.raises(ConfigError, match=match) as e:
        cc.compute("query", RunConfig(num_clients=2).to_run_config(), node, {}, {})
    assert "\n" not in str(e.value)


def test_the_clientapp_replies_a_bad_node_device_as_one_line_error(monkeypatch, caplog):
    from flwr.supercore.task_identity import TaskIdentity

    TaskIdentity.task_id, TaskIdentity.run_id, TaskIdentity.node_id = 1, 1, 1
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    ctx = Context(
        run_id=1,
        node_id=1,
        node_config={"partition-id": 0, "num-partitions": 2, "device": "cuda:3"},
        state=RecordDict(),
        run_config=RunConfig(num_clients=2).to_run_config(),
    )
    msg = Message(RecordDict(), dst_node_id=1, message_type="query")
    msg.metadata.__dict__["_message_id"] = "m"
    with caplog.at_level(logging.ERROR, logger="fedhmc.client"):
        reply = handle("query", msg, ctx)
    assert reply.has_error() and not reply.has_content()
    reason = reply.error.reason
    assert reason.startswith("node config device='cuda:3': this node has 1 GPU(s)")
    assert "\n" not in reason and "Traceback" not in reason
    [record] = [r for r in caplog.records if r.name == "fedhmc.client"]
    assert record.exc_info is None and "node config device='cuda:3'" in record.getMessage()


# --------------------------------------------------------------------- Flower's apps
def small_cfg(tmp_path, name, **kw) -> RunConfig:
    base = dict(
        num_clients=4,
        rounds=3,
        local_steps=3,
        leapfrog_steps=4,
        burn_in=1,
        chains=2,
        rho=0.5,
        out=str(tmp_path / name),
    )
    base.update(kw)
    return RunConfig(**base)


def run_grid(cfg: RunConfig, run_config: dict, devices: dict[int, str], colocated=False):
    """``cfg`` on the server; the clients get ``run_config`` and node ``i`` the node config
    ``device = devices[i]`` (none where absent)."""
    app = make_client_app({COLOCATED_KEY: True} if colocated else None)
    grid = InProcessGrid(app, cfg.num_clients, run_config)
    for ctx in grid.contexts.values():
        pid = ctx.node_config["partition-id"]
        if pid in devices:
            ctx.node_config["device"] = devices[pid]
    return serve_run(grid, cfg)


def assert_same_chain(a, b, rtol=1e-5, atol=1e-6):
    torch.testing.assert_close(a.theta_bar.cpu(), b.theta_bar.cpu(), rtol=rtol, atol=atol)
    for ra, rb in zip(a.history, b.history, strict=True):
        for k in ("accuracy", "nll_mean", "ece", "grad_evals", "clients"):
            assert ra[k] == pytest.approx(rb[k], rel=rtol, abs=atol), k


@pytest.mark.slow  # Flower
def test_cpu_nodes_beside_nodes_of_the_runs_device_give_the_engines_chain(tmp_path):
    cfg = small_cfg(tmp_path, "e")
    engine = run(cfg, progress=False)
    # The clients are told the run's device is cuda. Without a GPU every node says cpu
    # (and could not compute otherwise); with one, nodes 1 and 3 compute on it.
    rc = {**cfg.to_run_config(), "device": "cuda"}
    nodes = {0: "cpu", 2: "cpu"} if GPU else dict.fromkeys(range(4), "cpu")
    flower = run_grid(cfg.replace(out=str(tmp_path / "f")), rc, nodes)
    assert_same_chain(engine, flower)
    assert [r["clients"] for r in flower.history] == [4, 4, 4]


@pytest.mark.slow  # Flower
def test_a_node_without_its_device_is_dropped_with_one_line(tmp_path, caplog):
    cfg = small_cfg(tmp_path, "x", rounds=2, burn_in=0)
    with caplog.at_level(logging.WARNING):
        result = run_grid(cfg, cfg.to_run_config(), {1: "cuda:99"})
    assert [r["clients"] for r in result.history] == [3, 3]
    lines = [r.getMessage() for r in caplog.records if "cuda:99" in r.getMessage()]
    dropped = [m for m in lines if "dropped: size query failed" in m]
    assert len(dropped) == 1 and "node config device='cuda:99'" in dropped[0]
    assert all("\n" not in m and "Traceback" not in m for m in lines)


@pytest.fixture
def worker(tmp_path):
    path = tmp_path / "w" / "worker.sock"
    ready, stop = threading.Event(), threading.Event()
    t = threading.Thread(target=serve_worker, args=(path,), kwargs={"ready": ready, "stop": stop})
    t.start()
    assert ready.wait(60)
    yield path
    stop.set()
    t.join(10)


@pytest.mark.slow
@pytest.mark.skipif(os.name != "posix", reason="Unix sockets")
def test_the_warm_worker_reports_a_device_its_node_lacks_in_one_line(worker):
    node = {"partition-id": 0, "num-partitions": 2, "device": "cuda:99"}
    rc = RunConfig(num_clients=2).to_run_config()
    with pytest.raises(FedHMCError, match="^node config device='cuda:99': ") as e:
        call(str(worker), "query", rc, node, {}, {})
    assert "\n" not in str(e.value)


# --------------------------------------------------------------------- on a GPU
@pytest.mark.gpu
@pytest.mark.skipif(not GPU, reason="no CUDA GPU here")
@pytest.mark.parametrize("colocated", [False, True])
@pytest.mark.parametrize("device", ["cuda", "cuda:0"])
def test_the_apps_on_a_gpu_give_the_cpu_engines_chain(tmp_path, device, colocated):
    cfg = small_cfg(tmp_path, "e", dtype="float64", rounds=5, burn_in=1)
    engine = run(cfg, progress=False)
    on_gpu = cfg.replace(out=str(tmp_path / "g"), device=device)
    flower = run_grid(on_gpu, on_gpu.to_run_config(), {}, colocated=colocated)
    assert flower.theta_bar.device.type == "cuda"
    assert_same_chain(engine, flower, rtol=1e-10, atol=1e-12)
    if not colocated:  # a CPU node beside the GPU nodes: the same chain
        out = str(tmp_path / "m")
        mixed = run_grid(on_gpu.replace(out=out), on_gpu.to_run_config(), {1: "cpu"})
        assert_same_chain(engine, mixed, rtol=1e-10, atol=1e-12)


@pytest.mark.gpu
@pytest.mark.skipif(not GPU, reason="no CUDA GPU here")
@pytest.mark.parametrize("share", [None, 0.5])
def test_the_simulation_on_a_gpu_gives_the_cpu_engines_chain(tmp_path, share):
    pytest.importorskip("ray", reason="Flower's simulation needs Ray")
    from fedhmc_server.simulation import run_flower

    cfg = small_cfg(tmp_path, "e", dtype="float64", rounds=5, burn_in=1)
    engine = run(cfg, progress=False)
    on_gpu = cfg.replace(
        out=str(tmp_path / "s"), device="cuda", backend="flower", client_gpus=share
    )
    flower = run_flower(on_gpu, progress=False)
    assert_same_chain(engine, flower, rtol=1e-10, atol=1e-12)
