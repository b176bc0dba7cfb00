"""The worker processes of delayed SGLD: each reads the shared X, computes its increment and
adds it, in the ``sync``, ``w-con`` (locked) or ``w-icon`` (lock-free) mode.
"""

from __future__ import annotations

import threading
import time

import torch

from fedhmc.algorithms import delayed
from fedhmc.algorithms.delayed.problem import Regression
from fedhmc.algorithms.delayed.sgld import (
    _keys,
    increment,
)
from fedhmc.core.streams import STREAM_DELAYED_BATCH, STREAM_DELAYED_NOISE
from fedhmc.errors import FedHMCError


class WorkerError(FedHMCError, RuntimeError):
    """A worker process failed or the run timed out; every worker was stopped."""


def _worker(p: int, s: delayed.Settings, problem: Regression, sh: dict) -> None:
    """Worker process p. ``sh`` holds the shared tensors and synchronisation objects."""
    import sys

    torch.set_num_threads(1)
    try:
        _worker_loop(p, s, problem, sh)
    except _Stopped:
        return
    except threading.BrokenBarrierError:
        if sh["stop"].is_set():
            return  # another worker failed or the run was stopped: exit quietly
        j = int(sh["progress"][p])
        sh["errors"].put((p, j, f"a barrier wait exceeded the timeout of {s.timeout:g} s"))
        sh["stop"].set()
        sys.exit(1)
    except BaseException as e:  # noqa: BLE001 - report everything, then exit non-zero
        j = int(sh["progress"][p])
        sh["errors"].put((p, j, f"{type(e).__name__}: {e}"))
        sh["stop"].set()
        for b in ("barrier", "start"):
            if sh.get(b) is not None:
                sh[b].abort()
        sys.exit(1)


class _Stopped(Exception):
    pass


def _acquire(lock, timeout: float) -> None:
    if not lock.acquire(timeout=timeout):
        raise TimeoutError(f"could not take the lock within {timeout:g} s")


def _worker_loop(p: int, s: delayed.Settings, problem: Regression, sh: dict) -> None:
    R, tmo = s.chains, s.timeout
    keys = (_keys(s.seed, STREAM_DELAYED_NOISE, p, R), _keys(s.seed, STREAM_DELAYED_BATCH, p, R))
    sh["start"].wait(tmo)
    if p == 0:
        sh["times"][0] = time.monotonic()
    if s.mode == "sync":
        _sync_loop(p, s, problem, sh, keys)
    else:
        _async_loop(p, s, problem, sh, keys)
    sh["progress"][p] = s.iterations
    sh["end"][p] = time.monotonic()


def _inject(s: delayed.Settings, p: int, j: int) -> None:
    """The test hooks: fail or hang worker p at iteration j when the settings ask."""
    if s.fail_at is not None and tuple(s.fail_at) == (p, j):
        raise RuntimeError("injected failure (test hook)")
    if s.hang_at is not None and tuple(s.hang_at) == (p, j):
        time.sleep(10 * s.timeout)


def _sync_loop(p: int, s: delayed.Settings, problem: Regression, sh: dict, keys) -> None:
    """Worker p's iterations in ``sync`` mode: every worker's increment of iteration j is
    computed from the same X, and worker 0 adds them all and takes the snapshots."""
    P, rec, tmo = s.workers, s.record_every, s.timeout
    X, counts, progress = sh["X"], sh["counts"], sh["progress"]
    H, times, ups = sh["H"], sh["times"], sh["ups"]
    slots = H.shape[0] - 1
    nk, bk = keys
    barrier, D = sh["barrier"], sh["D"]
    for j in range(s.iterations):
        progress[p] = j
        _inject(s, p, j)
        barrier.wait(tmo)  # X is the result of iteration j − 1 for everyone
        D[p] = increment(problem, s, X.clone(), nk, bk, j)
        barrier.wait(tmo)  # all increments written
        if p == 0:
            X.add_(D.sum(0))
            counts[0] += P
            c = (j + 1) // rec
            if (j + 1) % rec == 0 and c <= slots:
                H[c] = X
                times[c] = time.monotonic()
                ups[c] = P * (j + 1)
        if sh["stop"].is_set():
            raise _Stopped
    barrier.wait(tmo)


def _async_loop(p: int, s: delayed.Settings, problem: Regression, sh: dict, keys) -> None:
    """Worker p's iterations in ``w-con`` (read and write under the lock) or ``w-icon``
    (lock-free) mode, counting the staleness of each update."""
    tmo, top = s.timeout, s.max_staleness_bin
    X, counts, hist = sh["X"], sh["counts"], sh["hist"]
    stop, progress, lock = sh["stop"], sh["progress"], sh["lock"]
    nk, bk = keys
    locked = s.mode == "w-con"
    for j in range(s.iterations):
        progress[p] = j
        if stop.is_set():
            raise _Stopped
        _inject(s, p, j)
        if locked:
            _acquire(lock, tmo)
            try:
                x = X.clone()
                v0 = int(counts.sum())
            finally:
                lock.release()
        else:
            x = X.clone()
            v0 = int(counts.sum())
        delta = increment(problem, s, x, nk, bk, j)
        if locked:
            _acquire(lock, tmo)
            try:
                X.add_(delta)
                v1 = int(counts.sum())
                counts[p] += 1
            finally:
                lock.release()
        else:
            X.add_(delta)
            v1 = int(counts.sum())
            counts[p] += 1
        hist[p, min(max(v1 - v0, 0), top)] += 1
        _maybe_snapshot(s, sh, v1 + 1, locked)


def _maybe_snapshot(s: delayed.Settings, sh: dict, u: int, locked: bool) -> None:
    """Take the next snapshot of X if the update count ``u`` reached its slot and no other
    worker took it first (under the snapshot lock; under the lock too if ``locked``)."""
    rec, P, tmo = s.record_every, s.workers, s.timeout
    X, H, next_slot = sh["X"], sh["H"], sh["next_slot"]
    slots = H.shape[0] - 1
    if u >= (int(next_slot) + 1) * rec * P:
        _acquire(sh["snap_lock"], tmo)
        try:
            c = int(next_slot) + 1
            if u >= c * rec * P and c <= slots:
                if locked:
                    _acquire(sh["lock"], tmo)
                    try:
                        H[c] = X
                    finally:
                        sh["lock"].release()
                else:
                    H[c] = X
                sh["times"][c] = time.monotonic()
                sh["ups"][c] = u
                next_slot.fill_(c)
        finally:
            sh["snap_lock"].release()
