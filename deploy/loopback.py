"""A TLS, node-authenticated Flower deployment on 127.0.0.1, driven through deploy/*.sh.

Used by the deployment tests (tests/integration/test_deploy.py), the deployment benchmark
(benchmarks/deploy.py) and the fault-injection suite (deploy/faults.py): one SuperLink,
SuperNodes with registered keys as separate processes, ``flwr run`` against them, and
helpers to kill, pause and restart any of them, each with everything it started. Every
process is found again by PID or by this deployment's folder and ports, so
``Deployment.stop_all`` leaves nothing behind.

It imports no other file of deploy/, so that it works both as ``loopback`` (a script
beside it, or a test that puts deploy/ on the path) and as ``deploy.loopback`` (run from
the repository root, as ``python -m benchmarks`` is).
"""

from __future__ import annotations

import csv
import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

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


def missing_tools() -> list[str]:
    import shutil

    return [t for t in TOOLS if shutil.which(t, path=SEARCH_PATH) is None]


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


def processes() -> dict[int, tuple[int, str, str]]:
    """{pid: (parent pid, state, command line)} of every process."""
    out = subprocess.run(
        ["ps", "-eo", "pid=,ppid=,stat=,args="], capture_output=True, text=True, check=True
    ).stdout
    procs = {}
    for line in out.splitlines():
        parts = line.split(None, 3)
        if len(parts) >= 3 and parts[0].isdigit():
            procs[int(parts[0])] = (int(parts[1]), parts[2], parts[3] if len(parts) > 3 else "")
    return procs


def tree(pid: int) -> list[int]:
    """``pid`` and all its live descendants."""
    procs = processes()
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        if p in procs and not procs[p][1].startswith("Z"):
            out.append(p)
        todo.extend(c for c, (pp, _, _) in procs.items() if pp == p)
    return out


def signal_tree(pid: int, sig: int) -> list[int]:
    """Send ``sig`` to ``pid`` and all its descendants (SIGKILL: a crash of that machine's
    process; SIGSTOP / SIGCONT: a frozen one). Returns the PIDs signalled."""
    pids = tree(pid)
    for p in pids:
        try:
            os.kill(p, sig)
        except ProcessLookupError:
            pass
    return pids


class Deployment:
    """Paths, environment and helpers of one loopback deployment in a folder."""

    def __init__(self, tmp: Path, num_nodes: int = 3, conn: str = "fedhmc-loopback"):
        self.tmp = Path(tmp)
        self.dir = self.tmp / "deploy"  # pid, log and database files
        self.certs = self.tmp / "certs"
        self.keys = self.tmp / "keys"
        self.conn = conn
        self.num_nodes = num_nodes
        self.link_port, *self.node_ports = free_ports(num_nodes + 2)
        self.address = f"127.0.0.1:{self.link_port}"
        self.env = {
            **os.environ,
            "PATH": SEARCH_PATH,
            "FLWR_HOME": str(self.tmp / "flwr-home"),
            "FEDHMC_DEPLOY_DIR": str(self.dir),
            "FLWR_TELEMETRY_ENABLED": "0",
            "FLWR_DISABLE_UPDATE_CHECK": "1",
            "RAY_USAGE_STATS_ENABLED": "0",
            "FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION": "1",
            "FLWR_SUPEREXEC_TASK_POLL_INTERVAL": "0.05",
        }
        # What only this deployment's processes carry on their command line: its folder or ports.
        ports = "|".join(str(p) for p in (self.link_port, *self.node_ports))
        self.marker = re.compile(rf"{re.escape(str(self.tmp))}/|127\.0\.0\.1:(?:{ports})(?!\d)")
        self.dir.mkdir(parents=True, exist_ok=True)

    # ------------------------------------------------------------------ scripts
    def sh(self, script: str, *args: str, check: bool = True, timeout: float = 90):
        res = subprocess.run(
            ["bash", str(DEPLOY / script), *args],
            env=self.env,
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        if check and res.returncode != 0:
            raise RuntimeError(f"{script} {args}: {res.stdout}\n{res.stderr}")
        return res

    def flwr(self, *args: str, timeout: float = 60) -> subprocess.CompletedProcess:
        return subprocess.run(
            ["flwr", *args], env=self.env, cwd=ROOT, capture_output=True, text=True, timeout=timeout
        )

    out: Path | None = None  # where a test's run writes (set by the caller)

    def setup(self, *extra_keys: str) -> None:
        """Certificates, keys client0 … client{N−1} (and ``extra_keys``, unregistered), the
        SuperLink, the connection and the registration of the N clients' keys."""
        names = [f"client{i}" for i in range(self.num_nodes)]
        self.sh("make_certs.sh", str(self.certs), "127.0.0.1")
        self.sh("make_keys.sh", str(self.keys), *names, *extra_keys)
        self.start_link()
        self.sh("connection.sh", self.conn, self.address, str(self.certs / "ca.crt"))
        self.sh("register.sh", self.conn, *(str(self.keys / f"{n}.pub") for n in names))

    def start_link(self) -> None:
        self.sh(
            "superlink.sh",
            "--host",
            "127.0.0.1",
            "--port",
            str(self.link_port),
            "--certs",
            str(self.certs),
        )

    def supernode(self, i: int, key: str | None = None, *extra: str) -> subprocess.Popen:
        """Start SuperNode ``i`` (partition i of N) with key ``client{i}`` (or ``key``); the
        Popen of deploy/supernode.sh, which returns once the SuperLink accepted it."""
        key = key or f"client{i}"
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
                str(i % self.num_nodes),
                "--num-partitions",
                str(self.num_nodes),
                "--name",
                key,
                "--wait",
                "90",
                *extra,
            ],
            env=self.env,
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )

    def start_nodes(self, indices=None) -> None:
        procs = [self.supernode(i) for i in (indices or range(self.num_nodes))]
        for p in procs:
            out = p.communicate(timeout=120)[0]
            if p.returncode != 0:
                raise RuntimeError(f"a SuperNode did not start: {out}")

    def pids(self, name: str) -> list[int]:
        """The PIDs in ``name``.pid (a SuperNode's file also names its worker)."""
        lines = (self.dir / f"{name}.pid").read_text().splitlines()
        return [int(line.split()[-1]) for line in lines if line.split()]

    def pid(self, name: str) -> int:
        """The Flower process of ``name`` (the last PID in its pid file)."""
        return self.pids(name)[-1]

    def submit(self, run_config: str, log: Path, app: Path | None = None) -> subprocess.Popen:
        """``flwr run APP CONN --stream`` in the background, its output in ``log``. APP:
        by default what ``deploy/run.sh`` submits, this repository's app staged alone."""
        if app is None:
            app = Path(tempfile.mkdtemp(prefix="app-", dir=self.dir))
            # Run as deploy/run.sh runs it, so that this module imports no sibling script.
            res = subprocess.run(
                [sys.executable, str(DEPLOY / "stage_app.py"), str(app)],
                cwd=ROOT,
                capture_output=True,
                text=True,
            )
            if res.returncode != 0:
                raise RuntimeError(f"deploy/stage_app.py {app}: {res.stderr.strip()}")
        f = open(log, "w")  # noqa: SIM115 (closed by the child's exit)
        return subprocess.Popen(
            ["flwr", "run", str(app), self.conn, "--stream", "--run-config", run_config],
            env=self.env,
            cwd=ROOT,
            stdout=f,
            stderr=subprocess.STDOUT,
        )

    # ------------------------------------------------------------------ processes
    def ours(self) -> dict[int, tuple[str, str]]:
        """This deployment's live processes (zombies excluded: they are already dead)."""
        return {
            pid: (st, cmd)
            for pid, (_, st, cmd) in processes().items()
            if not st.startswith("Z") and self.marker.search(cmd)
        }

    def stop_all(self) -> dict[int, tuple[str, str]]:
        """Stop everything; returns what was still running 10 s later (should be empty)."""
        for p in self.ours():  # a paused process would not see SIGTERM
            try:
                os.kill(p, signal.SIGCONT)
            except ProcessLookupError:
                pass
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
        deadline = time.monotonic() + 10
        while self.ours() and time.monotonic() < deadline:
            time.sleep(0.2)
        return self.ours()


def metrics_rows(out: Path) -> list[dict]:
    """The complete rows of ``out/metrics.csv`` so far."""
    try:
        with open(out / "metrics.csv", newline="") as f:
            return [r for r in csv.DictReader(f) if None not in r.values() and r.get("grad_evals")]
    except OSError:
        return []


def summary(out: Path) -> dict:
    try:
        return json.loads((out / "summary.json").read_text())
    except (OSError, ValueError):
        return {}


def wait_until(predicate, timeout: float, what: str, poll: float = 0.2):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(poll)
    raise TimeoutError(f"{what}: not within {timeout:g} s")
