"""A user's module that fails on Flower's clients (issue 37, item 1): each client replies
with a one-line error, and the server stops with one line naming the client's reason,
with no traceback (before: 2,269 lines and 9 Ray tracebacks)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

pytest.importorskip("flwr")  # (a machine with torch alone skips this module)

from _data import write_image_clients
from _grids import InProcessGrid
from fedhmc_clients.app import make_client_app
from fedhmc_server.loop import serve

from fedhmc.errors import FedHMCError
from fedhmc.runtime.config import RunConfig

pytestmark = pytest.mark.slow  # Flower

BATCH = 8

MODULE = f"""
import os

import torch
from torch import nn


class TrainsThenFails(nn.Module):
    '''Fails on the training minibatches (of {BATCH} rows) from the FAIL_AFTER-th on: the
    clients' computation in a later round; the server's test-set predictions still work.'''

    calls = 0

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(1, 2, 3, padding=1)
        self.head = nn.Linear(2 * 8 * 8, 3)

    def forward(self, x):
        if x.shape[0] == {BATCH}:
            TrainsThenFails.calls += 1
            if TrainsThenFails.calls > int(os.environ.get("FAIL_AFTER", "1000000000")):
                raise IndexError("index 7 is out of bounds\\nsecond line")
        return self.head(torch.tanh(self.conv(x)).flatten(1))
"""


@pytest.fixture
def user_files(tmp_path, monkeypatch):
    (tmp_path / "failnets.py").write_text(MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.chdir(tmp_path)
    sys.modules.pop("failnets", None)
    write_image_clients(tmp_path / "data.npz", 3)
    return tmp_path


def _cfg(root, **kw):
    return RunConfig(
        dataset=str(root / "data.npz"),
        model="failnets:TrainsThenFails",
        rounds=6,
        local_steps=2,
        leapfrog_steps=2,
        chains=2,
        batch_size=BATCH,
        step_size=0.01,
        out=str(root / "f"),
        **kw,
    )


def test_the_clients_reply_one_line_and_the_server_stops_with_it(user_files, monkeypatch):
    monkeypatch.setenv("FAIL_AFTER", "30")  # every client fails in a later round (in process)
    cfg = _cfg(user_files, max_failed_rounds=3).resolve()
    grid = InProcessGrid(make_client_app(), cfg.num_clients, cfg.to_run_config())
    with pytest.raises(FedHMCError) as e:
        serve(grid, cfg)
    msg = str(e.value)
    # The module's error stops the run at once (every round would fail alike), not after
    # --max-failed-rounds rounds without a valid reply.
    assert "\n" not in msg and "on a client, --model failnets:TrainsThenFails" in msg
    assert "failnets:TrainsThenFails" in msg and "IndexError: index 7 is out of bounds" in msg
    assert "(at failnets.py:" in msg and "second line" not in msg
    assert not msg.startswith("round 1:")  # a later round


def test_the_simulation_prints_no_traceback(user_files):
    """The Flower simulation (Ray): exit 2, the last line the server's, naming the client's
    reason, and no traceback from any client."""
    p = subprocess.run(
        [
            sys.executable, "-m", "fedhmc", "run", "--backend", "flower",
            "--dataset", "data.npz", "--model", "failnets:TrainsThenFails",
            "--rounds", "6", "--local-steps", "2", "--leapfrog-steps", "2",
            "--batch-size", str(BATCH), "--quiet", "--out", "sim",
        ],
        capture_output=True,
        text=True,
        cwd=user_files,
        env={**os.environ, "FAIL_AFTER": "8"},
        timeout=300,
    )  # fmt: skip
    assert p.returncode == 2, p.stderr[-3000:]
    lines = p.stderr.strip().splitlines()
    assert "Traceback" not in p.stderr, p.stderr[-3000:]
    assert lines[-1].startswith("fedhmc run: error: round ")
    assert "IndexError: index 7 is out of bounds" in lines[-1] and "failnets.py:" in lines[-1]
    assert len(lines) == 1, p.stderr  # the server stops at the first failed round
