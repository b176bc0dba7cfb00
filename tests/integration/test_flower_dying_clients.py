"""Clients that die under Flower's simulation: the user sees fedhmc's one line (what went
wrong, how to go on, where Flower's own account is), never Ray's or Flower's tracebacks;
the run exits with status 1 and its folder says what happened."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

pytest.importorskip("flwr")  # (a machine with torch alone skips this module)

pytestmark = pytest.mark.slow  # Flower

BATCH = 8

MODULE = f"""
import os
import signal

from torch import nn


class Dies(nn.Module):
    '''Ends its process (DIE=exit: os._exit; DIE=segv: SIGSEGV) on a training minibatch
    ({BATCH} rows): inside the clients only; the server's evaluation still works.'''

    def __init__(self):
        super().__init__()
        self.head = nn.Linear(64, 10)

    def forward(self, x):
        if x.shape[0] == {BATCH} and os.environ.get("DIE") == "exit":
            os._exit(3)
        if x.shape[0] == {BATCH} and os.environ.get("DIE") == "segv":
            os.kill(os.getpid(), signal.SIGSEGV)
        return self.head(x.flatten(1))
"""


def test_a_client_process_that_dies_gives_one_line_and_no_traceback(tmp_path):
    (tmp_path / "dying.py").write_text(MODULE)
    p = subprocess.run(
        [
            sys.executable, "-m", "fedhmc", "run", "--backend", "flower",
            "--dataset", "digits", "--model", "dying:Dies", "--batch-size", str(BATCH),
            "--num-clients", "2", "--rounds", "3", "--quiet", "--out", str(tmp_path / "run"),
        ],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env={**os.environ, "DIE": "exit", "FLWR_HOME": str(tmp_path / "home")},
        timeout=300,
    )  # fmt: skip
    lines = p.stderr.strip().splitlines()
    assert "Traceback" not in p.stderr + p.stdout, p.stderr[-3000:]
    assert p.stdout == "", p.stdout[-3000:]  # (Ray's driver printed "(raylet) A worker died")
    assert len(lines) == 1 and p.returncode == 1, p.stderr[-3000:]
    line = lines[0]
    assert line.startswith("fedhmc run: error: round 1: client "), line
    assert "process died" in line and "start again with --overwrite" in line
    log = tmp_path / "run" / "flower.log"
    assert line.endswith(f"Flower's log is in {log}"), line
    assert "ActorDiedError" in log.read_text()  # Flower's account, tracebacks and all
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["status"] == "failed" and summary["rounds_completed"] == 0


def _wrapped(ex: BaseException) -> str:
    """An error reply's reason as Flower writes it (``vce_api``, ``run_clientapp``)."""
    return str(type(ex)) + ":<'" + str(ex) + "'>"


def test_a_failed_replys_reason_is_one_line():
    from fedhmc_server.exchange import PROCESS_DIED, failure_reason
    from flwr.clientapp.client_app import ClientAppException

    # The simulation: Ray's task error around Flower's, around the ClientApp's own.
    inner = ClientAppException("client boom\nsecond line")
    remote = (
        "ray::ClientAppActor.run() (pid=1, ip=10.0.0.1)\n"
        '  File "app.py", line 21, in train\n    raise ValueError("client boom")\n'
        "ValueError: client boom\nsecond line\n\n"
        "The above exception was the direct cause of the following exception:\n\n"
        f"ray::ClientAppActor.run()\nflwr.clientapp.client_app.ClientAppException: {inner}"
    )
    ray_reason = f"<class 'ray.exceptions.RayTaskError(ClientAppException)'>:<'{remote}'>"
    assert failure_reason(0, ray_reason) == "error 0: the ClientApp raised ValueError: client boom"
    died = _wrapped(RuntimeError("The actor died unexpectedly.\n\tclass_name: ClientAppActor"))
    died = died.replace("builtins.RuntimeError", "ray.exceptions.ActorDiedError")
    died = died.replace("'RuntimeError'", "'ray.exceptions.ActorDiedError'")
    assert failure_reason(0, died) == f"{PROCESS_DIED} (ActorDiedError)"
    # A deployed SuperNode's ClientApp that raised, and fedhmc's own one-line replies.
    assert failure_reason(2, _wrapped(KeyError("theta"))) == "error 2: KeyError: 'theta'"
    assert failure_reason(3701, "--model m:M raised IndexError: 7 (at m.py:3)") == (
        "error 3701: --model m:M raised IndexError: 7 (at m.py:3)"
    )
    assert "\n" not in failure_reason(0, "two\nlines")
