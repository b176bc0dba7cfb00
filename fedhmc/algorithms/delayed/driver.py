"""The driver of delayed SGLD: starts the workers, collects snapshots and staleness, and
always stops and joins every process (every wait has a timeout).
"""

from __future__ import annotations

import math
import multiprocessing.connection
import queue
import time
from dataclasses import asdict, dataclass, field

import torch

from fedhmc.algorithms import delayed
from fedhmc.algorithms.delayed.problem import Regression
from fedhmc.algorithms.delayed.workers import WorkerError, _worker
from fedhmc.errors import ConfigError, NonFiniteError


@dataclass
class DelayedResult:
    """Snapshots of a run: ``snapshots`` (C + 1, R, d) with ``updates`` (C + 1,) increments
    applied when each was taken and ``wall_s`` (C + 1,) seconds since the workers started
    (entry 0 is X_0; the last is the final X). ``staleness`` (P, bins) counts, per worker,
    the updates of others between its read and its write (0 in ``sync``). ``wall_total_s``
    is the time from the start barrier to the last worker's last update; ``pids`` are the
    workers' process ids (all joined when the result is returned)."""

    settings: delayed.Settings
    snapshots: torch.Tensor
    updates: torch.Tensor
    wall_s: torch.Tensor
    staleness: torch.Tensor
    wall_total_s: float
    startup_s: float
    pids: list[int] = field(default_factory=list)

    def summary(self) -> dict:
        h = self.staleness.sum(0).to(torch.float64)
        bins = torch.arange(h.numel(), dtype=torch.float64)
        total = float(h.sum())
        return {
            "settings": {k: v for k, v in asdict(self.settings).items() if "_at" not in k},
            "wall_total_s": self.wall_total_s,
            "startup_s": self.startup_s,
            "updates": int(self.updates[-1]),
            "staleness_mean": float((h * bins).sum() / total) if total else 0.0,
            "staleness_hist": [int(v) for v in self.staleness.sum(0)],
        }


def run_delayed(
    problem: Regression,
    settings: delayed.Settings,
    x0: torch.Tensor | None = None,
    *,
    progress: bool = False,
) -> DelayedResult:
    """Run delayed SGLD with ``settings.workers`` processes sharing X; see the module doc.

    Raises `WorkerError` (naming the worker) if a worker raises, exits abnormally or
    the run exceeds ``settings.timeout``; no worker process is left running in any case.
    Raises `NonFiniteError` if the chains diverge.
    """
    s = settings
    if x0 is not None and x0.device.type != "cpu":
        raise ConfigError(
            f"delayed SGLD's workers share X in CPU memory and run on the CPU by design; "
            f"give x0 on the CPU, not on {x0.device}"
        )
    ctx = torch.multiprocessing.get_context(s.start_method)
    P = s.workers
    sh = _shared_state(problem, s, x0, ctx)
    shared_problem = Regression(
        problem.features.clone().share_memory_(),
        problem.targets.clone().share_memory_(),
        problem.coef.clone(),
        problem.noise_var,
        problem.prior_std,
    )

    bar = None
    procs: list = []
    failure: str | None = None
    t_launch = time.monotonic()
    try:
        for p in range(P):
            pr = ctx.Process(
                target=_worker, args=(p, s, shared_problem, sh), name=f"fedhmc-delayed-{p}"
            )
            pr.daemon = True
            pr.start()
            procs.append(pr)
        if progress:  # after the workers start: tqdm's monitor thread must not be forked
            from fedhmc.core.progress import bar as progress_bar

            bar = progress_bar(P * s.iterations, f"{s.mode} P={P}", "upd", mininterval=0.5)
        failure = _watch(procs, sh, s, bar)
    finally:
        _shutdown(procs, sh, grace=min(5.0, s.timeout))
        if bar is not None:
            bar.close()
        sh["errors"].close()
        sh["errors"].join_thread()
    if failure is not None:
        err = WorkerError(f"{failure}; all {P} workers were stopped")
        err.pids = [pr.pid for pr in procs]
        raise err
    return _collect(s, sh, t_launch, [pr.pid for pr in procs])


def _shared_state(problem: Regression, s: delayed.Settings, x0, ctx) -> dict:
    """The tensors (in shared memory) and synchronisation objects the workers share: X
    (R, d) from ``x0`` (zeros if None), the snapshots H (slots + 1, R, d) with H[0] = X,
    their times and update counts, the per-worker counters, and the locks and barriers."""
    P, R, d = s.workers, s.chains, problem.dim
    slots = s.iterations // s.record_every
    X = (
        torch.zeros(R, d, dtype=torch.float64, device="cpu")
        if x0 is None
        else x0.clone().to(torch.float64)
    )
    if X.shape != (R, d):
        raise ConfigError(f"x0 must have shape ({R}, {d}), got {tuple(X.shape)}")
    H = torch.full((slots + 1, R, d), math.nan, dtype=torch.float64, device="cpu")
    H[0] = X
    sh = {
        "X": X,
        "H": H,
        "times": torch.zeros(slots + 1, dtype=torch.float64, device="cpu"),
        "ups": torch.full((slots + 1,), -1, dtype=torch.int64, device="cpu"),
        "counts": torch.zeros(P, dtype=torch.int64, device="cpu"),
        "progress": torch.zeros(P, dtype=torch.int64),
        "hist": torch.zeros(P, s.max_staleness_bin + 1, dtype=torch.int64),
        "next_slot": torch.zeros((), dtype=torch.int64),
        "end": torch.zeros(P, dtype=torch.float64),
    }
    sh["ups"][0] = 0
    if s.mode == "sync":
        sh["D"] = torch.zeros(P, R, d, dtype=torch.float64)
    for t in sh.values():
        t.share_memory_()
    sh["stop"] = ctx.Event()
    sh["errors"] = ctx.Queue()
    sh["start"] = ctx.Barrier(P)
    sh["barrier"] = ctx.Barrier(P) if s.mode == "sync" else None
    sh["lock"] = ctx.Lock()
    sh["snap_lock"] = ctx.Lock()
    return sh


def _watch(procs: list, sh: dict, s: delayed.Settings, bar) -> str | None:
    """Wait for the workers to finish; the first failure (a reported error, an abnormal
    exit or the timeout) as text, or None when all finished."""
    P = s.workers
    deadline = time.monotonic() + s.timeout
    while True:
        failure = _first_error(sh["errors"], 0.0)
        if failure:
            return failure
        alive = [pr for pr in procs if pr.is_alive()]
        for i, pr in enumerate(procs):
            if pr.exitcode not in (None, 0):
                failure = _first_error(sh["errors"], 2.0) or (
                    f"worker {i} of {P} exited with code {pr.exitcode}"
                )
                break
        if failure or not alive:
            return failure
        if time.monotonic() > deadline:
            return (
                f"the run exceeded its timeout of {s.timeout:g} s "
                f"(worker progress {sh['progress'].tolist()}); raise timeout"
            )
        multiprocessing.connection.wait([pr.sentinel for pr in alive], timeout=0.1)
        if bar is not None:
            bar.update(int(sh["progress"].sum()) - bar.n)


def _collect(s: delayed.Settings, sh: dict, t_launch: float, pids: list[int]) -> DelayedResult:
    """The result of a finished run from the shared state (all workers joined)."""
    X, H = sh["X"], sh["H"]
    slots = H.shape[0] - 1
    times = sh["times"]
    t0 = float(times[0])
    end = float(sh["end"].max())
    if int(sh["ups"][-1]) < 0 and slots > 0:
        # the last snapshot's claim can be missed by a lock-free race; X is final now
        H[-1] = X
        sh["times"][-1] = end
        sh["ups"][-1] = int(sh["counts"].sum())
    filled = sh["ups"] >= 0
    snaps = H[filled].clone()
    wall = (times[filled] - t0).clamp_min(0.0)
    wall[0] = 0.0
    if not bool(torch.isfinite(snaps).all()):
        raise NonFiniteError(
            f"delayed SGLD diverged (mode {s.mode}, P = {s.workers}, γ = {s.step_size:g}); "
            f"use a smaller step size"
        )
    return DelayedResult(
        settings=s,
        snapshots=snaps,
        updates=sh["ups"][filled].clone(),
        wall_s=wall,
        staleness=sh["hist"].clone(),
        wall_total_s=end - t0,
        startup_s=float(t0 - t_launch),
        pids=pids,
    )


def _first_error(q, timeout: float) -> str | None:
    try:
        p, j, text = q.get(timeout=timeout) if timeout > 0 else q.get_nowait()
    except queue.Empty:
        return None
    except (OSError, ValueError, EOFError):
        return None
    return f"worker {p} failed at iteration {j} ({text})"


def _shutdown(procs: list, sh: dict, grace: float) -> None:
    """Stop every worker: signal, abort barriers, join, terminate, kill; always join."""
    sh["stop"].set()
    for b in ("start", "barrier"):
        if sh.get(b) is not None:
            try:
                sh[b].abort()
            except Exception:  # noqa: BLE001 - a broken barrier is fine here
                pass
    deadline = time.monotonic() + grace
    for pr in procs:
        pr.join(max(0.0, deadline - time.monotonic()))
    for pr in procs:
        if pr.is_alive():
            pr.terminate()
    for pr in procs:
        pr.join(2.0)
        if pr.is_alive():
            pr.kill()
            pr.join(2.0)
    # drain reported errors so the queue's feeder threads can finish
    while _first_error(sh["errors"], 0.0):
        pass
