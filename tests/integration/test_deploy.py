"""End-to-end Flower deployment on loopback through the deploy/*.sh recipe (deploy/README.md).

One SuperLink with TLS and SuperNode authentication, two SuperNodes with registered keys
(separate processes), `flwr run . CONNECTION --stream` for two rounds; a SuperNode with an
unregistered key must be refused. Every process is stopped by PID afterwards, and the test checks
that none is left.
"""

from __future__ import annotations

import csv
import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "deploy"))
from loopback import DEPLOY, SEARCH_PATH, Deployment, missing_tools, processes  # noqa: E402

MISSING = missing_tools()
CONN = "fedhmc-test"

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(sys.platform == "win32", reason="the deploy scripts are bash scripts"),
    pytest.mark.skipif(bool(MISSING), reason=f"not found on PATH: {', '.join(MISSING)}"),
]


@pytest.fixture
def deployment(tmp_path):
    dep = Deployment(tmp_path, num_nodes=2, conn=CONN)
    dep.out = tmp_path / "run"
    try:
        yield dep
    finally:
        left = dep.stop_all()
        assert not left, f"processes left running: {left}"


def test_tls_authenticated_deployment_runs_two_rounds(deployment):
    dep = deployment
    pyproject = ROOT / "pyproject.toml"
    assert "[tool.flwr.federations]" not in pyproject.read_text()  # else `flwr run` rewrites it

    dep.sh("make_certs.sh", str(dep.certs), "127.0.0.1")
    dep.sh("make_keys.sh", str(dep.keys), "client0", "client1", "rogue")
    dep.sh(
        "superlink.sh",
        "--host",
        "127.0.0.1",
        "--port",
        str(dep.link_port),
        "--certs",
        str(dep.certs),
    )
    assert (dep.dir / "superlink.pid").is_file()
    dep.sh("connection.sh", CONN, dep.address, str(dep.certs / "ca.crt"))
    dep.sh("register.sh", CONN, str(dep.keys / "client0.pub"), str(dep.keys / "client1.pub"))

    nodes = [
        dep.supernode(0, "client0"),
        dep.supernode(1, "client1", "--node-config", "private-seed=1234"),
        dep.supernode(2, "rogue"),  # partition 2 mod 2 = 0
    ]
    outs = [p.communicate(timeout=90)[0] for p in nodes]
    assert nodes[0].returncode == 0, outs[0]
    assert nodes[1].returncode == 0, outs[1]
    # The unregistered key is refused: the SuperNode exits and supernode.sh fails.
    assert nodes[2].returncode != 0, outs[2]
    assert "Failed to activate SuperNode" in (dep.dir / "rogue.log").read_text()
    assert not (dep.dir / "rogue.pid").exists()

    res = dep.flwr("supernode", "list", CONN, "--format", "json")
    assert res.returncode == 0, res.stdout + res.stderr
    listed = json.loads(res.stdout)["nodes"]
    assert sorted(n["status"] for n in listed) == ["online", "online"], listed

    run_config = (
        f"rounds=2 num-clients=2 local-steps=2 leapfrog-steps=3 "
        f'node-wait-timeout=60 round-timeout=60 out="{dep.out}"'
    )
    res = dep.flwr("run", ".", CONN, "--stream", "--run-config", run_config, timeout=300)
    log = res.stdout + res.stderr
    assert res.returncode == 0, log

    # The nodes' warm workers computed (the ClientApps forwarded to them).
    for key in ("client0", "client1"):
        wlog = (dep.dir / f"{key}-worker.log").read_text()
        assert "served train round 2" in wlog, wlog
        assert "computing in this process instead" not in (dep.dir / f"{key}.log").read_text()
    # `flwr run --stream` shows the run as it goes: one line per round and a final line.
    assert "round 1/2: 2 clients, 0 failed" in log and "round 2/2" in log, log
    assert "completed: 2 of 2 rounds" in log, log
    # `flwr run` exits 0 even when the ServerApp fails: check what it wrote.
    summary = json.loads((dep.out / "summary.json").read_text())
    assert summary["status"] == "completed", (summary, log)
    assert summary["rounds_completed"] == 2
    assert summary["num_clients"] == 2
    assert summary["backend"] == "flower"
    assert summary["client_failures"] == 0
    with open(dep.out / "metrics.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert [int(r["round"]) for r in rows] == [1, 2]
    assert all(int(r["clients"]) == 2 and int(r["failed"]) == 0 for r in rows), rows

    # The run created no federation section in pyproject.toml (a `flwr run` migration would).
    assert "federations" not in pyproject.read_text()

    # fedhmc's own processes (the nodes' warm workers) leave no <defunct> children behind.
    procs = processes()
    workers = {pid for pid, (_, st, cmd) in procs.items() if "fedhmc_clients.worker" in cmd}
    assert workers, "the warm workers are running"
    zombies = [(pid, cmd) for pid, (pp, st, cmd) in procs.items() if st[0] == "Z" and pp in workers]
    assert not zombies, zombies


def test_flwr_run_local_simulation_script_leaves_nothing_behind(tmp_path):
    """deploy/simulate.sh: `flwr run . local` with N virtual SuperNodes, then its managed
    local SuperLink is stopped by PID."""
    if socket.socket().connect_ex(("127.0.0.1", 39091)) == 0:
        pytest.skip("port 39091 (Flower's managed local SuperLink) is already in use")
    env = {
        **os.environ,
        "PATH": SEARCH_PATH,
        "FEDHMC_DEPLOY_DIR": str(tmp_path / "deploy"),
        "PYTHONWARNINGS": "ignore",
    }
    out = tmp_path / "sim-run"
    proc = subprocess.run(
        ["bash", str(DEPLOY / "simulate.sh"), "3", "rounds=2", "local-steps=2", f"out={out}"],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
        cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["num_clients"] == 3
    with open(out / "metrics.csv") as f:
        assert len(list(csv.DictReader(f))) == 2
    assert "stopped the local SuperLink" in proc.stdout
    left = subprocess.run(
        ["pgrep", "-f", str(tmp_path / "deploy")], capture_output=True, text=True
    ).stdout.split()
    assert not left, f"processes left behind: {left}"


def test_a_frozen_supernode_misses_rounds_then_takes_part_again(deployment):
    """SIGSTOP one of two SuperNodes (and its worker) in round 2: the straggler deadline
    (2 × the median round, at least 5 s) closes rounds without it well before the 120 s
    round-timeout; after SIGCONT its late reply is dropped and it takes part again."""
    import signal

    from loopback import metrics_rows, signal_tree, summary, wait_until

    dep = deployment
    dep.setup()
    dep.start_nodes()
    run_config = (
        "num-clients=2 rounds=7 local-steps=1 leapfrog-steps=1 round-timeout=120 "
        f'straggler-factor=2.0 straggler-floor=5.0 out="{dep.out}"'
    )
    proc = dep.submit(run_config, dep.tmp / "flwr.log")
    try:
        wait_until(lambda: len(metrics_rows(dep.out)) >= 1, 240, "round 1")
        frozen = [p for pid in dep.pids("client1") for p in signal_tree(pid, signal.SIGSTOP)]
        wait_until(lambda: len(metrics_rows(dep.out)) >= 3, 240, "rounds 2-3 without client1")
        for p in frozen:
            try:
                os.kill(p, signal.SIGCONT)
            except ProcessLookupError:
                pass
        wait_until(lambda: summary(dep.out).get("status") == "completed", 300, "the run's end")
    finally:
        proc.wait(timeout=60)
    rows = [(int(r["clients"]), int(r["failed"])) for r in metrics_rows(dep.out)]
    assert rows[0] == (2, 0)
    assert rows[1] == (1, 1) and rows[2] == (1, 1), rows  # closed without the frozen node
    assert (2, 0) in rows[3:], rows  # it takes part again
    s = summary(dep.out)
    assert s["client_failures"] >= 2 and s["late_replies"] >= 1, s


def test_a_user_module_and_data_file_in_a_deployment(tmp_path):
    """A model of the user's own (importable on the SuperLink and every SuperNode through
    PYTHONPATH) on an .npz with its own client split: the deployment runs it and records
    the spec and the file's checksum."""
    import numpy as np

    code = tmp_path / "usercode"
    code.mkdir()
    (code / "deploynets.py").write_text(
        "import torch.nn as nn\n"
        "def make(width=4):\n"
        "    return nn.Sequential(nn.Flatten(), nn.Linear(16, width), nn.Tanh(),"
        " nn.Linear(width, 3))\n"
    )
    g = np.random.default_rng(0)
    y = g.integers(0, 3, 80)
    x = (g.normal(size=(80, 1, 4, 4)) + y[:, None, None, None]).astype(np.float32)
    data = tmp_path / "data.npz"
    np.savez(data, x_train=x[:60], y_train=y[:60], x_test=x[60:], y_test=y[60:],
             client_train=np.arange(60) % 2)  # fmt: skip
    dep = Deployment(tmp_path, num_nodes=2, conn=CONN + "-user")
    dep.env["PYTHONPATH"] = os.pathsep.join([str(code), dep.env.get("PYTHONPATH", "")])
    out = tmp_path / "run"
    try:
        dep.setup()
        dep.start_nodes()
        run_config = (
            f'dataset="{data}" model="deploynets:make" model-arg="width=3" rounds=2 '
            f'local-steps=2 leapfrog-steps=2 batch-size=8 round-timeout=60 out="{out}"'
        )
        proc = dep.submit(run_config, tmp_path / "flwr.log")
        proc.wait(timeout=300)
    finally:
        left = dep.stop_all()
    assert not left, f"processes left running: {left}"
    log = (tmp_path / "flwr.log").read_text()
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "completed", (summary, log[-3000:])
    assert summary["num_clients"] == 2 and summary["client_failures"] == 0
    assert [p[0] for p in summary["model_parameters"]] == [
        "1.weight",
        "1.bias",
        "3.weight",
        "3.bias",
    ]
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["model"] == "deploynets:make" and cfg["partition"] == "given"
    assert len(cfg["data_sha256"]) == 64


def test_two_deployments_never_share_a_worker_socket(tmp_path):
    """The warm worker's socket is named by port, deployment folder and node: two
    deployments of one account on the same port get two sockets."""

    def socket_of(deploy_dir, name="client0", port="9100"):
        res = subprocess.run(
            ["bash", "-c", f'source "{DEPLOY / "_common.sh"}"; worker_socket /s {port} {name}'],
            env={**os.environ, "FEDHMC_DEPLOY_DIR": str(deploy_dir)},
            capture_output=True,
            text=True,
            check=True,
        )
        return res.stdout.strip()

    a, b = socket_of(tmp_path / "a"), socket_of(tmp_path / "b")
    assert a != b and a.startswith("/s/worker-9100-") and a.endswith(".sock")
    assert socket_of(tmp_path / "a") == a  # the same deployment finds its own again
    assert socket_of(tmp_path / "a", name="client1") != a
    assert len(a) < 100  # within the 108 bytes of a Unix socket path


def test_qlsd_pp_in_a_deployment_gives_the_engines_chain(tmp_path):
    """QLSD++ on two loopback SuperNodes: its own options travel in ``sampler-options``,
    each client keeps its memory and reference gradient in its node state between rounds
    (a new ClientApp process or its warm worker computes each round), and the chain is the
    engine's."""
    from fedhmc.runtime.config import RunConfig
    from fedhmc.runtime.engine import run

    dep = Deployment(tmp_path, num_nodes=2, conn=CONN + "-qlsd")
    out = tmp_path / "run"
    settings = dict(dataset="digits", algorithm="qlsd-pp", num_clients=2, rounds=4, chains=2,
                    batch_size=16, step_size=1e-4, dtype="float64")  # fmt: skip
    options = "quantization-levels=4;reference-refresh=2"
    try:
        dep.setup()
        dep.start_nodes()
        run_config = " ".join(
            [f'{k.replace("_", "-")}="{v}"' if isinstance(v, str) else f"{k.replace('_', '-')}={v}"
             for k, v in settings.items()]
            + [f'sampler-options="{options}"', "round-timeout=60", f'out="{out}"']
        )  # fmt: skip
        proc = dep.submit(run_config, tmp_path / "flwr.log")
        proc.wait(timeout=300)
    finally:
        left = dep.stop_all()
    assert not left, f"processes left running: {left}"
    log = (tmp_path / "flwr.log").read_text()
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "completed", (summary, log[-3000:])
    recorded = json.loads((out / "config.json").read_text())
    assert recorded["quantization_levels"] == 4.0 and recorded["reference_refresh"] == 2
    engine = run(
        RunConfig(**settings, quantization_levels=4, reference_refresh=2, out=str(tmp_path / "e")),
        progress=False,
    )
    with open(out / "metrics.csv", newline="") as f:
        deployed = list(csv.DictReader(f))
    for a, b in zip(engine.history, deployed, strict=True):
        for k in ("accuracy", "nll_mean", "grad_evals", "clients"):
            assert float(b[k]) == pytest.approx(float(a[k]), rel=1e-9, abs=1e-12), k
