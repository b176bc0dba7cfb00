"""The node's warm worker (fedhmc_clients.worker): same numbers as computing in the
ClientApp, a private channel, and a validated reply."""

from __future__ import annotations

import os
import stat
import threading

import numpy as np
import pytest

pytest.importorskip("flwr")  # (a machine with torch alone skips this module)

from fedhmc_clients.app import handle
from fedhmc_clients.compute import compute
from fedhmc_clients.worker import WarmWorkerError, call, prepare_socket_path, serve_worker, validate
from fedhmc_server.loop import round_config  # the server's round config
from flwr.app import Array, ArrayRecord, Context, Message, RecordDict

from fedhmc.runtime.config import RunConfig

pytestmark = [pytest.mark.slow, pytest.mark.skipif(os.name != "posix", reason="Unix sockets")]


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
    assert not t.is_alive() and not path.exists()


def _num_total(cfg: RunConfig) -> int:
    rc = cfg.to_run_config()
    return sum(
        compute("query", rc, {"partition-id": c, "num-partitions": cfg.num_clients}, {}, {})[1][
            "num-examples"
        ]
        for c in range(cfg.num_clients)
    )


def test_the_worker_gives_the_numbers_computed_in_process(worker):
    cfg = RunConfig(num_clients=4, local_steps=2, leapfrog_steps=3, chains=2).resolve()
    rc = cfg.to_run_config()
    nc = {"partition-id": 1, "num-partitions": 4}
    q_arrays, q_metrics = call(str(worker), "query", rc, nc, {}, {})
    assert q_arrays == {} and q_metrics == compute("query", rc, nc, {}, {})[1]
    theta = np.random.default_rng(0).normal(size=(2, 650)).astype(np.float32)
    config, arrays = dict(round_config(cfg, 1, _num_total(cfg))), {"theta": theta}
    got, m1 = call(str(worker), "train", rc, nc, config, arrays)
    want, m2 = compute("train", rc, nc, config, arrays)
    assert set(got) == {"theta"} and np.array_equal(got["theta"], want["theta"])
    assert m1 == m2
    assert stat.S_IMODE(worker.stat().st_mode) == 0o600
    assert stat.S_IMODE(worker.parent.stat().st_mode) == 0o700


def test_the_clientapp_forwards_to_the_worker_and_falls_back_without_it(worker, tmp_path):
    cfg = RunConfig(num_clients=2, local_steps=1, leapfrog_steps=2).resolve()
    theta = np.zeros((1, 650), np.float32)
    config = round_config(cfg, 1, _num_total(cfg))

    from flwr.supercore.task_identity import TaskIdentity

    TaskIdentity.task_id, TaskIdentity.run_id, TaskIdentity.node_id = 1, 1, 1

    def reply(node_config):
        ctx = Context(
            run_id=1,
            node_id=1,
            node_config=node_config,
            state=RecordDict(),
            run_config=cfg.to_run_config(),
        )
        msg = Message(
            RecordDict({"arrays": ArrayRecord({"theta": Array(theta)}), "config": config}),
            dst_node_id=1,
            message_type="train",
        )
        msg.metadata.__dict__["_message_id"] = "m"
        return handle("train", msg, ctx)

    base = {"partition-id": 0, "num-partitions": 2}
    direct = reply(base)
    warm = reply({**base, "worker-socket": str(worker)})
    gone = reply({**base, "worker-socket": str(tmp_path / "nothing.sock")})
    for r in (warm, gone):
        assert np.array_equal(
            r.content["arrays"]["theta"].numpy(), direct.content["arrays"]["theta"].numpy()
        )
        assert dict(r.content["metrics"]) == dict(direct.content["metrics"])


@pytest.mark.parametrize(
    "arrays,metrics,match",
    [
        ({"theta": np.full((2, 3), np.nan, np.float32)}, {}, "finite"),
        ({"theta": np.zeros((2, 4), np.float32)}, {}, "shape"),
        ({"theta": np.zeros((2, 3), np.int32)}, {}, "finite floats"),
        ({"theta": np.zeros((2, 3), np.float32), "extra": np.zeros(1)}, {}, "shape"),
        ({"theta": np.zeros((2, 3), np.float32), "kept/m": np.full(2, np.inf)}, {}, "finite"),
        ({}, {}, "no arrays"),
        ({"theta": np.zeros((2, 3), np.float32)}, {"n": "x"}, "metrics"),
    ],
)
def test_a_bad_worker_reply_is_refused(arrays, metrics, match):
    with pytest.raises(WarmWorkerError, match=match):
        validate("train", {"theta": np.zeros((2, 3), np.float32)}, arrays, metrics)


def test_the_socket_folder_must_be_private(tmp_path):
    open_dir = tmp_path / "open"
    open_dir.mkdir(mode=0o755)
    os.chmod(open_dir, 0o755)
    with pytest.raises(SystemExit, match="chmod 700"):
        prepare_socket_path(open_dir / "w.sock")
    private = tmp_path / "private"
    private.mkdir(mode=0o700)
    (private / "w.sock").write_text("not a socket")
    with pytest.raises(SystemExit, match="not a socket"):
        prepare_socket_path(private / "w.sock")


def test_an_error_in_the_worker_comes_back_as_one_line(worker):
    with pytest.raises(WarmWorkerError, match="failed: ValueError: unknown message kind"):
        call(
            str(worker),
            "bogus",
            RunConfig().to_run_config(),
            {"partition-id": 0, "num-partitions": 2},
            {},
            {},
        )
