"""What a Flower simulation started dies with it, even under ``kill -9``.

Ray's processes (its GCS server, raylet, dashboard and runtime-env agents, workers) are
started by the simulation's process but outlive it when that process is killed without a
chance to shut Ray down: they are re-parented to PID 1 and linger for up to a minute. A
small watchdog process (``python -m fedhmc_server.reaper PID``) follows the simulation's
process tree while it runs and, once that process is gone, stops every process that was
in its tree, within a second. Processes are recognised by PID and start time, so a PID
that the system reuses is never touched.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

POLL = 0.25
"""Seconds between two looks at the process tree."""


def _stat(pid: int) -> tuple[int, int] | None:
    """(parent PID, start time in clock ticks) of ``pid``, or None if it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            text = f.read()
    except OSError:
        return None
    fields = text[text.rindex(")") + 2 :].split()
    return int(fields[1]), int(fields[19])


def tree(root: int) -> dict[int, int]:
    """PID → start time of ``root``'s descendants (not ``root`` itself)."""
    parents: dict[int, list[int]] = {}
    starts: dict[int, int] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        st = _stat(int(name))
        if st is not None:
            parents.setdefault(st[0], []).append(int(name))
            starts[int(name)] = st[1]
    out, todo = {}, [root]
    while todo:
        for child in parents.get(todo.pop(), []):
            if child not in out:
                out[child] = starts[child]
                todo.append(child)
    return out


def watch(root: int) -> int:
    """Follow ``root``'s tree until ``root`` ends, then kill the processes that joined it
    while watched (those there before, and this watchdog, are left alone)."""
    start = _stat(root)
    me = os.getpid()
    before = set(tree(root).items())
    seen: dict[int, int] = {}
    while _alive_same(root, start):
        seen.update((p, t) for p, t in tree(root).items() if (p, t) not in before and p != me)
        time.sleep(POLL)
    killed = 0
    for pid, started in seen.items():
        st = _stat(pid)
        if st is not None and st[1] == started:
            try:
                os.kill(pid, signal.SIGKILL)
                killed += 1
            except OSError:
                pass
    return killed


def _alive_same(pid: int, start: tuple[int, int] | None) -> bool:
    st = _stat(pid)
    return start is not None and st is not None and st[1] == start[1]


def start_reaper() -> subprocess.Popen | None:
    """Start the watchdog of this process's tree (Linux only; None elsewhere)."""
    if not os.path.isdir("/proc") or _stat(os.getpid()) is None:
        return None
    return subprocess.Popen(
        [sys.executable, "-m", "fedhmc_server.reaper", str(os.getpid())],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,  # a signal to the run's process group does not stop it
    )


if __name__ == "__main__":
    watch(int(sys.argv[1]))
