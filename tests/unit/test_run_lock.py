"""One process per run folder: a second command on a live run is refused in one line naming
the process; a lock left by a killed process is taken over; a refused command leaves
nothing behind; ``summary.json`` says how far a killed run got."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from fedhmc.errors import ConfigError
from fedhmc.runtime.lock import FolderLock


def test_a_second_lock_is_refused_naming_the_holder(tmp_path):
    with FolderLock(tmp_path / "d"):
        with pytest.raises(ConfigError, match=f"in use by process {os.getpid()}") as e:
            FolderLock(tmp_path / "d").acquire()
        assert "--resume" not in str(e.value) and "\n" not in str(e.value)
    assert not (tmp_path / "d" / ".lock").exists()  # released: the file goes


def test_a_refused_run_leaves_no_lock_and_no_folder(tmp_path, cli):
    out = tmp_path / "r"
    assert cli("run", "--rounds", "2", "--local-steps", "1", "--quiet", "--out", out)[0] == 0
    code, _, err = cli("run", "--rounds", "2", "--out", out)
    assert code == 2 and "already holds a run" in err
    assert not (out / ".lock").exists()
    # Refused once the lock is taken (no checkpoint to resume): the folder it made goes too.
    from fedhmc import RunConfig, run

    fresh = tmp_path / "nothing" / "here"
    with pytest.raises(ConfigError, match="cannot resume"):
        run(RunConfig(rounds=2, out=str(fresh), resume=True), progress=False)
    assert not fresh.exists()


@pytest.mark.slow
def test_a_live_run_is_refused_then_taken_over_after_kill_9(tmp_path, cli):
    out = tmp_path / "r"
    first = subprocess.Popen(
        [sys.executable, "-m", "fedhmc", "run", "--rounds", "100000", "--local-steps", "1",
         "--leapfrog-steps", "1", "--burn-in", "0", "--checkpoint-every", "5", "--quiet",
         "--out", str(out)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 120
        while not (out / "checkpoint.pt").exists():
            assert time.monotonic() < deadline, "no checkpoint within 120 s"
            assert first.poll() is None
            time.sleep(0.2)
        for extra in (["--resume", out], ["--overwrite", "--out", out], ["--out", out]):
            code, _, err = cli("run", "--rounds", "100000", *extra)
            assert code == 2, err
            assert f"in use by process {first.pid}" in err and "--resume" not in err, err
        time.sleep(1.0)
    finally:
        first.send_signal(signal.SIGKILL)
        first.wait()
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "running" and summary["rounds_completed"] >= 5
    # The summary follows each checkpoint (every 5 rounds): the kill may fall between the two.
    reached = summary["rounds_completed"]
    code, _, err = cli("run", "--resume", out, "--rounds", reached + 10, "--quiet")
    assert code == 0, err
    assert f"left locked by process {first.pid}" in err
    done = json.loads((out / "summary.json").read_text())
    assert done["status"] == "completed" and done["rounds_completed"] == reached + 10
