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
import re
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DEPLOY = ROOT / "deploy"
BIN = Path(sys.executable).parent
SEARCH_PATH = f"{BIN}{os.pathsep}{os.environ.get('PATH', os.defpath)}"
TOOLS = (
    "bash",
    "openssl",
    "ssh-keygen",
    "ps",
    "pgrep",
    "flwr",
    "flower-superlink",
    "flower-supernode",
    "flower-superexec",
    "flwr-serverapp",
    "flwr-clientapp",
)
MISSING = [t for t in TOOLS if shutil.which(t, path=SEARCH_PATH) is None]
CONN = "fedhmc-test"

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(sys.platform == "win32", reason="the deploy scripts are bash scripts"),
    pytest.mark.skipif(bool(MISSING), reason=f"not found on PATH: {', '.join(MISSING)}"),
]


def free_ports(n: int) -> list[int]:
    """n distinct ports that are free now (bound to port 0 together, then released)."""
    socks = []
    try:
        for _ in range(n):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def processes() -> dict[int, tuple[str, str]]:
    """{pid: (state, command line)} of every process."""
    out = subprocess.run(
        ["ps", "-eo", "pid=,stat=,args="], capture_output=True, text=True, check=True
    ).stdout
    procs = {}
    for line in out.splitlines():
        parts = line.split(None, 2)
        if len(parts) >= 2 and parts[0].isdigit():
            procs[int(parts[0])] = (parts[1], parts[2] if len(parts) > 2 else "")
    return procs


class Deployment:
    """Paths, environment and helpers of one loopback deployment in a temporary folder."""

    def __init__(self, tmp: Path):
        self.tmp = tmp
        self.dir = tmp / "deploy"  # pid, log and database files
        self.certs = tmp / "certs"
        self.keys = tmp / "keys"
        self.out = tmp / "run"
        self.link_port, *self.node_ports = free_ports(4)
        self.address = f"127.0.0.1:{self.link_port}"
        self.env = {
            **os.environ,
            "PATH": SEARCH_PATH,
            "FLWR_HOME": str(tmp / "flwr-home"),
            "FEDHMC_DEPLOY_DIR": str(self.dir),
            "FLWR_TELEMETRY_ENABLED": "0",
            "FLWR_DISABLE_UPDATE_CHECK": "1",
            "RAY_USAGE_STATS_ENABLED": "0",
            "FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION": "1",
            "FLWR_SUPEREXEC_TASK_POLL_INTERVAL": "0.05",
        }
        # What only this deployment's processes carry on their command line: its folder or ports.
        ports = "|".join(str(p) for p in (self.link_port, *self.node_ports))
        self.marker = re.compile(rf"{re.escape(str(tmp))}/|127\.0\.0\.1:(?:{ports})(?!\d)")

    def sh(self, script: str, *args: str, check: bool = True, timeout: float = 90):
        res = subprocess.run(
            ["bash", str(DEPLOY / script), *args],
            env=self.env,
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        if check:
            assert res.returncode == 0, f"{script} {args}: {res.stdout}\n{res.stderr}"
        return res

    def supernode(self, i: int, key: str, partition: int, *extra: str) -> subprocess.Popen:
        return subprocess.Popen(
            [
                "bash",
                str(DEPLOY / "supernode.sh"),
                "--superlink",
                self.address,
                "--ca",
                str(self.certs / "ca.crt"),
                "--key",
                str(self.keys / key),
                "--port",
                str(self.node_ports[i]),
                "--partition-id",
                str(partition),
                "--num-partitions",
                "2",
                "--name",
                key,
                "--wait",
                "60",
                *extra,
            ],
            env=self.env,
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )

    def flwr(self, *args: str, timeout: float = 60) -> subprocess.CompletedProcess:
        return subprocess.run(
            ["flwr", *args], env=self.env, cwd=ROOT, capture_output=True, text=True, timeout=timeout
        )

    def ours(self) -> dict[int, tuple[str, str]]:
        """This deployment's live processes (zombies excluded: they are already dead)."""
        return {
            pid: (st, cmd)
            for pid, (st, cmd) in processes().items()
            if not st.startswith("Z") and self.marker.search(cmd)
        }

    def stop_all(self) -> None:
        pidfiles = sorted(str(p) for p in self.dir.glob("*.pid"))
        if pidfiles:
            self.sh("stop.sh", *pidfiles, check=False, timeout=60)
        # Anything that escaped the pid files (should not happen): kill it by PID.
        for pid in self.ours():
            if pid not in (os.getpid(), os.getppid()):
                try:
                    os.kill(pid, 9)
                except ProcessLookupError:
                    pass


@pytest.fixture
def deployment(tmp_path):
    dep = Deployment(tmp_path)
    dep.dir.mkdir()
    try:
        yield dep
    finally:
        dep.stop_all()
        deadline = time.monotonic() + 10
        while dep.ours() and time.monotonic() < deadline:
            time.sleep(0.2)
        left = dep.ours()
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
        dep.supernode(0, "client0", 0),
        dep.supernode(1, "client1", 1, "--node-config", "private-seed=1234"),
        dep.supernode(2, "rogue", 0),
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
