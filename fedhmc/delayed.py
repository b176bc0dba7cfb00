"""Shared-memory delayed SGLD (Kungurtsev, Chatterjee, Alistarh; docs/algorithms.md).

P worker processes on one machine share the parameter tensor X (``share_memory_()``) and
run SGLD on it,

    X_{k+1} = X_k − γ ∇Ũ(X̂_k) + √(2σγ) G_k,

where X̂_k is whatever X the worker read before computing its minibatch gradient. Three
modes, as in the paper's §3.1:

- ``sync``: two barriers per iteration. Every worker reads the same X, computes its noisy
  increment −γ ∇Ũ_p(X) + √(2σγ) G_p on its own minibatch, and one updater (worker 0) adds
  the sum of the P increments to X. This is the paper's "updater sums the gradients": an
  SGLD step of size Pγ with the average of P minibatch gradients, deterministic given the
  seed (:func:`sequential_reference` computes the same chain in one process).
- ``w-con``: asynchronous, with consistent reads: a lock is held while a worker copies X
  and while it adds its increment. Gradients are stale by however many other updates were
  applied between a worker's read and its write (the staleness histogram counts these).
- ``w-icon``: asynchronous and lock-free (Hogwild): reads may see a partly written X and
  concurrent in-place additions may overwrite each other.

X holds R independent chains (shape (R, d)), advanced together by every update, so the law
of X_k is observed directly (the empirical distribution of the R chains) rather than
through one chain's trajectory. The chains share the timing (the delays) of the run, and
each has its own minibatches and noise.

Randomness is counter-based (:mod:`fedhmc.rng`): worker p's j-th increment uses noise and
minibatch indices keyed by (seed, p, chain) and counter j, whatever the interleaving. So
``sync`` is reproducible bit for bit given the seed; ``w-con`` and ``w-icon`` draw the same
numbers but apply them in an order the operating system decides, so their chains are not
reproducible (by nature: that is what asynchrony is).

Processes are started with an explicit start method (``"spawn"`` by default: torch with
``fork`` after threads have started is unsafe), run ``torch.set_num_threads(1)``, and are
always stopped and joined: a worker that raises stops the run with a :class:`WorkerError`
naming it, the others are told to stop (barriers aborted), joined with a timeout, then
terminated and killed if they do not exit. Every wait has a timeout.

The regression problem (a 4th-degree polynomial with a known coefficient vector, Gaussian
noise and prior) has a Gaussian posterior in closed form (:func:`posterior`), and the
preset :func:`delayed_sgld_experiment` (``fedhmc experiment delayed-sgld``) measures W₂ of
the R chains to it against iterations and wall time.
"""

from __future__ import annotations

import math
import multiprocessing as mp
import multiprocessing.connection
import queue
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from . import rng
from .errors import ConfigError, FedHMCError, NonFiniteError
from .metrics import gaussian_w2_sq

MODES = ("sync", "w-con", "w-icon")
START_METHODS = ("spawn", "fork", "forkserver")

STREAM_DELAYED_NOISE = 41
STREAM_DELAYED_BATCH = 42
STREAM_DELAYED_DATA = 43


class WorkerError(FedHMCError, RuntimeError):
    """A worker process failed or the run timed out; every worker was stopped."""


# --------------------------------------------------------------------------- problem
@dataclass(frozen=True)
class Regression:
    """Polynomial regression y = Σ_{j=0}^{degree} β_j x^j + ε, ε ~ N(0, noise_var), with
    prior β ~ N(0, prior_std² I).

    ``features`` (n, degree + 1) holds 1, x, …, x^degree; ``coef`` is the true β.
    """

    features: torch.Tensor
    targets: torch.Tensor
    coef: torch.Tensor
    noise_var: float
    prior_std: float

    @property
    def n(self) -> int:
        return int(self.features.shape[0])

    @property
    def dim(self) -> int:
        return int(self.features.shape[1])


def make_regression(
    n: int = 1000,
    *,
    degree: int = 4,
    noise_var: float = 0.1,
    prior_std: float = 1.0,
    seed: int = 0,
) -> Regression:
    """A polynomial regression data set with a known coefficient vector.

    x_i ~ Uniform(−1, 1), β ~ N(0, I) (drawn from ``seed``), y_i = φ(x_i)ᵀβ + ε_i with
    ε_i ~ N(0, noise_var) and φ(x) = (1, x, …, x^degree). The default is the paper's
    setting: a linear layer with 4 inputs (x, …, x⁴) and a bias, noise variance 0.1.
    """
    if int(n) < 1:
        raise ConfigError(f"the regression needs at least one data point, got n = {n}")
    if int(degree) < 0:
        raise ConfigError(f"degree must be ≥ 0, got {degree}")
    if not (noise_var > 0 and math.isfinite(noise_var)):
        raise ConfigError(f"noise variance must be positive and finite, got {noise_var}")
    if not (prior_std > 0):
        raise ConfigError(f"prior std must be positive (inf for a flat prior), got {prior_std}")
    gen = torch.Generator().manual_seed(int(seed))
    coef = torch.randn(degree + 1, generator=gen, dtype=torch.float64)
    x = torch.rand(n, generator=gen, dtype=torch.float64) * 2.0 - 1.0
    features = torch.stack([x**j for j in range(degree + 1)], dim=1)
    eps = torch.randn(n, generator=gen, dtype=torch.float64) * math.sqrt(noise_var)
    return Regression(features, features @ coef + eps, coef, float(noise_var), float(prior_std))


def posterior(problem: Regression, temperature: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
    """Mean and covariance of the target exp(−U/σ), U(β) = ‖y − Φβ‖²/(2s²) + ‖β‖²/(2σ₀²).

    With A = ΦᵀΦ/s² + I/σ₀² (the Hessian of U): mean A⁻¹Φᵀy/s², covariance σA⁻¹.
    """
    phi, s2 = problem.features, problem.noise_var
    prec = phi.T @ phi / s2 + torch.eye(problem.dim, dtype=phi.dtype) / problem.prior_std**2
    chol = torch.linalg.cholesky(prec)
    mean = torch.cholesky_solve((phi.T @ problem.targets / s2).unsqueeze(1), chol).squeeze(1)
    cov = temperature * torch.cholesky_inverse(chol)
    return mean, 0.5 * (cov + cov.T)


def hessian_eigs(problem: Regression) -> tuple[float, float]:
    """Smallest and largest eigenvalue (m, L) of the Hessian of U."""
    phi = problem.features
    prec = phi.T @ phi / problem.noise_var
    prec = prec + torch.eye(problem.dim, dtype=phi.dtype) / problem.prior_std**2
    e = torch.linalg.eigvalsh(prec)
    return float(e[0]), float(e[-1])


# -------------------------------------------------------------------------- settings
@dataclass(frozen=True)
class DelayedSettings:
    """Settings of a shared-memory delayed SGLD run.

    Attributes
    ----------
    mode
        ``"sync"``, ``"w-con"`` or ``"w-icon"``.
    workers
        P ≥ 1 processes.
    iterations
        Iterations per worker: each worker computes this many gradients (``sync``: this
        many barrier rounds), so P · iterations increments are applied in all.
    step_size
        γ > 0 (per increment; a ``sync`` iteration applies P of them at once).
    batch_size
        Minibatch size B per gradient (0 or ≥ n: the full data). Drawn with replacement.
    chains
        R ≥ 2 independent chains in X.
    temperature
        σ > 0: the target is exp(−U/σ).
    record_every
        A snapshot of X every ``record_every`` iterations per worker (P · record_every
        increments).
    seed
        Run seed (noise and minibatches).
    start_method
        ``"spawn"`` (default), ``"fork"`` or ``"forkserver"``.
    timeout
        Seconds the whole run may take before every worker is stopped and an error raised;
        also the bound of every barrier and lock wait inside the workers.
    max_staleness_bin
        Staleness histograms have bins 0 … this (the last bin collects larger values).
    """

    mode: str = "sync"
    workers: int = 2
    iterations: int = 1000
    step_size: float = 1e-5
    batch_size: int = 32
    chains: int = 100
    temperature: float = 1.0
    record_every: int = 10
    seed: int = 0
    start_method: str = "spawn"
    timeout: float = 600.0
    max_staleness_bin: int = 64
    # test hooks: (worker, iteration) at which a worker raises / hangs
    fail_at: tuple[int, int] | None = field(default=None, repr=False)
    hang_at: tuple[int, int] | None = field(default=None, repr=False)

    def validate(self) -> DelayedSettings:
        if self.mode not in MODES:
            raise ConfigError(f"unknown mode {self.mode!r}; choose one of {', '.join(MODES)}")
        for name in ("workers", "iterations", "record_every"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise ConfigError(f"{name.replace('_', '-')} must be an integer ≥ 1, got {v!r}")
        if self.workers > 256:
            raise ConfigError(f"workers = {self.workers} is too many processes; use ≤ 256")
        if not isinstance(self.chains, int) or self.chains < 2:
            raise ConfigError(f"chains must be an integer ≥ 2 (W₂ needs two), got {self.chains!r}")
        if not isinstance(self.batch_size, int) or self.batch_size < 0:
            raise ConfigError(
                f"batch-size must be an integer ≥ 0 (0 = full data), got {self.batch_size!r}"
            )
        for name in ("step_size", "temperature", "timeout"):
            v = getattr(self, name)
            if not (isinstance(v, (int, float)) and math.isfinite(v) and v > 0):
                raise ConfigError(
                    f"{name.replace('_', '-')} must be positive and finite, not {v!r}"
                )
        if self.start_method not in START_METHODS:
            raise ConfigError(
                f"unknown start method {self.start_method!r}; "
                f"choose one of {', '.join(START_METHODS)}"
            )
        if self.iterations >= rng.MAX_HI:
            raise ConfigError(f"iterations must be below {rng.MAX_HI}, got {self.iterations}")
        return self


# ---------------------------------------------------------------------- the increment
def _keys(seed: int, stream: int, worker: int, chains: int) -> torch.Tensor:
    return rng.derive(int(seed), stream, worker, torch.arange(chains, dtype=torch.int64))


def gradient(
    problem: Regression, x: torch.Tensor, batch_keys: torch.Tensor, j: int, batch: int
) -> torch.Tensor:
    """Minibatch gradient of U at x (R, d), chain r's batch drawn from ``batch_keys[r]``, j.

    (n/B) Σ_{i∈S} −φ_i (y_i − φ_iᵀx)/s² + x/σ₀², with S drawn with replacement; B = 0 or
    B ≥ n uses the full data.
    """
    phi, y, n = problem.features, problem.targets, problem.n
    if batch == 0 or batch >= n:
        resid = y.unsqueeze(0) - x @ phi.T  # (R, n)
        g = -(resid @ phi) / problem.noise_var
    else:
        u = rng.uniform(batch_keys, j, batch)  # (R, B)
        idx = torch.clamp((u * n).to(torch.int64), max=n - 1)
        pb = phi[idx]  # (R, B, d)
        resid = y[idx] - torch.einsum("rbd,rd->rb", pb, x)
        g = -(n / batch) * torch.einsum("rbd,rb->rd", pb, resid) / problem.noise_var
    return g + x / problem.prior_std**2


def increment(
    problem: Regression,
    s: DelayedSettings,
    x: torch.Tensor,
    noise_keys: torch.Tensor,
    batch_keys: torch.Tensor,
    j: int,
) -> torch.Tensor:
    """Worker's j-th SGLD increment at the read position x: −γ ∇Ũ(x) + √(2σγ) G_j."""
    g = gradient(problem, x, batch_keys, j, s.batch_size)
    noise = rng.normal(noise_keys, j, problem.dim, dtype=torch.float64)
    return -s.step_size * g + math.sqrt(2.0 * s.temperature * s.step_size) * noise


def sequential_reference(
    problem: Regression, settings: DelayedSettings, x0: torch.Tensor | None = None
) -> torch.Tensor:
    """The ``sync`` chain computed in this process, as a plain loop: snapshots (C + 1, R, d).

    Iteration k: X ← X + Σ_{p=0}^{P−1} (−γ ∇Ũ_p(X) + √(2σγ) G_{p,k}), with worker p's keys.
    """
    s = settings.validate()
    R, d = s.chains, problem.dim
    x = torch.zeros(R, d, dtype=torch.float64) if x0 is None else x0.clone().to(torch.float64)
    nk = [_keys(s.seed, STREAM_DELAYED_NOISE, p, R) for p in range(s.workers)]
    bk = [_keys(s.seed, STREAM_DELAYED_BATCH, p, R) for p in range(s.workers)]
    snaps = [x.clone()]
    for k in range(s.iterations):
        deltas = torch.stack([increment(problem, s, x, nk[p], bk[p], k) for p in range(s.workers)])
        x.add_(deltas.sum(0))
        if (k + 1) % s.record_every == 0:
            snaps.append(x.clone())
    return torch.stack(snaps)


# ----------------------------------------------------------------------------- workers
def _worker(p: int, s: DelayedSettings, problem: Regression, sh: dict) -> None:
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


def _worker_loop(p: int, s: DelayedSettings, problem: Regression, sh: dict) -> None:
    P, R, rec, tmo = s.workers, s.chains, s.record_every, s.timeout
    X, counts, hist = sh["X"], sh["counts"], sh["hist"]
    H, times, ups = sh["H"], sh["times"], sh["ups"]
    stop, progress = sh["stop"], sh["progress"]
    nk = _keys(s.seed, STREAM_DELAYED_NOISE, p, R)
    bk = _keys(s.seed, STREAM_DELAYED_BATCH, p, R)
    top = s.max_staleness_bin
    sh["start"].wait(tmo)
    if p == 0:
        times[0] = time.monotonic()
    slots = H.shape[0] - 1

    def inject(j: int) -> None:
        if s.fail_at is not None and tuple(s.fail_at) == (p, j):
            raise RuntimeError("injected failure (test hook)")
        if s.hang_at is not None and tuple(s.hang_at) == (p, j):
            time.sleep(10 * tmo)

    if s.mode == "sync":
        barrier, D = sh["barrier"], sh["D"]
        for j in range(s.iterations):
            progress[p] = j
            inject(j)
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
            if stop.is_set():
                raise _Stopped
        barrier.wait(tmo)
        progress[p] = s.iterations
        sh["end"][p] = time.monotonic()
        return

    lock, snap_lock, next_slot = sh["lock"], sh["snap_lock"], sh["next_slot"]
    locked = s.mode == "w-con"
    for j in range(s.iterations):
        progress[p] = j
        if stop.is_set():
            raise _Stopped
        inject(j)
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
        u = v1 + 1
        if u >= (int(next_slot) + 1) * rec * P:
            _acquire(snap_lock, tmo)
            try:
                c = int(next_slot) + 1
                if u >= c * rec * P and c <= slots:
                    if locked:
                        _acquire(lock, tmo)
                        try:
                            H[c] = X
                        finally:
                            lock.release()
                    else:
                        H[c] = X
                    times[c] = time.monotonic()
                    ups[c] = u
                    next_slot.fill_(c)
            finally:
                snap_lock.release()
    progress[p] = s.iterations
    sh["end"][p] = time.monotonic()


# -------------------------------------------------------------------------- the driver
@dataclass
class DelayedResult:
    """Snapshots of a run: ``snapshots`` (C + 1, R, d) with ``updates`` (C + 1,) increments
    applied when each was taken and ``wall_s`` (C + 1,) seconds since the workers started
    (entry 0 is X_0; the last is the final X). ``staleness`` (P, bins) counts, per worker,
    the updates of others between its read and its write (0 in ``sync``). ``wall_total_s``
    is the time from the start barrier to the last worker's last update; ``pids`` are the
    workers' process ids (all joined when the result is returned)."""

    settings: DelayedSettings
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
    settings: DelayedSettings,
    x0: torch.Tensor | None = None,
    *,
    progress: bool = False,
) -> DelayedResult:
    """Run delayed SGLD with ``settings.workers`` processes sharing X; see the module doc.

    Raises :class:`WorkerError` (naming the worker) if a worker raises, exits abnormally or
    the run exceeds ``settings.timeout``; no worker process is left running in any case.
    Raises :class:`~fedhmc.errors.NonFiniteError` if the chains diverge.
    """
    s = settings.validate()
    ctx = torch.multiprocessing.get_context(s.start_method)
    P, R, d = s.workers, s.chains, problem.dim
    slots = s.iterations // s.record_every
    X = torch.zeros(R, d, dtype=torch.float64) if x0 is None else x0.clone().to(torch.float64)
    if X.shape != (R, d):
        raise ConfigError(f"x0 must have shape ({R}, {d}), got {tuple(X.shape)}")
    H = torch.full((slots + 1, R, d), math.nan, dtype=torch.float64)
    H[0] = X
    sh = {
        "X": X,
        "H": H,
        "times": torch.zeros(slots + 1, dtype=torch.float64),
        "ups": torch.full((slots + 1,), -1, dtype=torch.int64),
        "counts": torch.zeros(P, dtype=torch.int64),
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
            from tqdm.auto import tqdm

            bar = tqdm(
                total=P * s.iterations,
                desc=f"{s.mode} P={P}",
                unit="upd",
                leave=False,
                disable=None,
                mininterval=0.5,
            )
        deadline = time.monotonic() + s.timeout
        while True:
            failure = _first_error(sh["errors"], 0.0)
            if failure:
                break
            alive = [pr for pr in procs if pr.is_alive()]
            for i, pr in enumerate(procs):
                if pr.exitcode not in (None, 0):
                    failure = _first_error(sh["errors"], 2.0) or (
                        f"worker {i} of {P} exited with code {pr.exitcode}"
                    )
                    break
            if failure or not alive:
                break
            if time.monotonic() > deadline:
                failure = (
                    f"the run exceeded its timeout of {s.timeout:g} s "
                    f"(worker progress {sh['progress'].tolist()}); raise timeout"
                )
                break
            multiprocessing.connection.wait([pr.sentinel for pr in alive], timeout=0.1)
            if bar is not None:
                bar.update(int(sh["progress"].sum()) - bar.n)
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
            f"delayed SGLD diverged (mode {s.mode}, P = {P}, γ = {s.step_size:g}); "
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
        pids=[pr.pid for pr in procs],
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


# ------------------------------------------------------------------ the paper's preset
def w2_to(snapshots: torch.Tensor, mean: torch.Tensor, cov: torch.Tensor) -> list[float]:
    """W₂ between the Gaussian fit of each snapshot's R chains and N(mean, cov); snapshots
    (C, R, d), batched through :func:`fedhmc.metrics.gaussian_w2_sq`.

    The Gaussian fit (Gelbrich) is exact when the chains' law is Gaussian and a lower bound
    on W₂ otherwise; delayed SGLD on this quadratic U is Gaussian up to the minibatch noise.
    """
    x = snapshots.to(torch.float64)
    m = x.mean(1)
    z = x - m.unsqueeze(1)
    c = z.transpose(1, 2) @ z / (x.shape[1] - 1)
    return gaussian_w2_sq(m, c, mean, cov).clamp_min(0.0).sqrt().tolist()


def w2_floor(mean: torch.Tensor, cov: torch.Tensor, chains: int, reps: int = 200, seed: int = 0):
    """Mean and std of the W₂ of ``chains`` exact posterior draws (Gaussian fit) to the
    posterior: the floor that finite R puts under every curve."""
    gen = torch.Generator().manual_seed(int(seed))
    chol = torch.linalg.cholesky(cov)
    z = torch.randn(reps, chains, mean.numel(), generator=gen, dtype=torch.float64)
    v = torch.tensor(w2_to(mean + z @ chol.T, mean, cov))
    return float(v.mean()), float(v.std())


def delayed_sgld_experiment(out_dir: Path, *, quick: bool = False, seed: int = 0) -> dict:
    """Kungurtsev et al. §3.2: W₂ of shared-memory delayed SGLD to the posterior of a
    4th-degree polynomial regression, against iterations and wall time.

    Data: n = 1000 points x ~ U(−1, 1), y = Σ_{j≤4} β_j x^j + ε, ε ~ N(0, 0.1) (the paper's
    noise), β ~ N(0, I) drawn from ``seed``; prior N(0, I), so the posterior is Gaussian in
    closed form. SGLD with γ = c / L for c ∈ {0.1, 0.3} (L the largest Hessian eigenvalue:
    our U sums over the data, so the paper's learning rate does not transfer), minibatches
    of 32 per gradient, σ = 1, X_0 = 0, R = 200 chains (50 with ``quick``). For P ∈ {2, 4}
    and each mode the workers apply 16,000 increments in all (400 and c = 0.3 only with
    ``quick``): 16,000 / P iterations per worker; a ``sync`` iteration adds P increments.

    W₂ is that of the Gaussian fit of the R chains at each snapshot: the law of X_k over
    independent replicas, which is what the paper's bounds are about (a window of one
    chain's iterates would mix the transient with autocorrelation). Wall time runs from the
    workers' start barrier (process start-up excluded, reported apart). Processes are
    forked where the platform allows (the experiment's process runs no threads of its own
    when it forks, and workers use one torch thread), else spawned.
    """
    import json

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    problem = make_regression(1000, degree=4, noise_var=0.1, prior_std=1.0, seed=seed)
    mean, cov = posterior(problem)
    m, L = hessian_eigs(problem)
    scales = (0.3,) if quick else (0.1, 0.3)
    chains = 50 if quick else 200
    total = 400 if quick else 16000
    points = 10 if quick else 80
    batch = 32
    start = "fork" if "fork" in mp.get_all_start_methods() else "spawn"
    floor, floor_sd = w2_floor(mean, cov, chains, seed=seed)
    eps = 0.25
    curves, rows, extra = [], [], {}
    for c in scales:
        for P in (2, 4):
            iters = total // P
            for mode in MODES:
                s = DelayedSettings(
                    mode=mode,
                    workers=P,
                    iterations=iters,
                    step_size=c / L,
                    batch_size=batch,
                    chains=chains,
                    record_every=max(1, iters // points),
                    seed=seed,
                    start_method=start,
                    timeout=600.0,
                )
                res = run_delayed(problem, s, progress=True)
                w2 = w2_to(res.snapshots, mean, cov)
                its = (res.updates.to(torch.float64) / P).tolist()
                wall = res.wall_s.tolist()
                snaps = res.snapshots
                for it, u, t, w, x in zip(its, res.updates.tolist(), wall, w2, snaps, strict=True):
                    curves.append(
                        {
                            "step_scale": c,
                            "workers": P,
                            "mode": mode,
                            "iteration": it,
                            "updates": u,
                            "wall_s": t,
                            "w2": w,
                            "mean_error": float((x.mean(0) - mean).norm()),
                        }
                    )
                tail = max(1, len(w2) // 4)
                hit = next((i for i, w in enumerate(w2) if w <= eps), None)
                info = res.summary()
                rows.append(
                    {
                        "gamma_L": c,
                        "workers": P,
                        "mode": mode,
                        "wall_s": round(res.wall_total_s, 2),
                        "updates_per_s": round(info["updates"] / res.wall_total_s, 1),
                        "w2_last25pct": sum(w2[-tail:]) / tail,
                        "iters_to_eps": None if hit is None else its[hit],
                        "time_to_eps": None if hit is None else round(wall[hit], 2),
                        "staleness_mean": round(info["staleness_mean"], 3),
                    }
                )
                extra[f"c={c} {mode} P={P}"] = {
                    "startup_s": info["startup_s"],
                    "staleness_hist": info["staleness_hist"],
                }
    summary = {
        "experiment": "delayed-sgld",
        "settings": {
            "n": problem.n,
            "degree": 4,
            "noise_var": 0.1,
            "prior_std": 1.0,
            "coef": problem.coef.tolist(),
            "hessian_m": m,
            "hessian_L": L,
            "step_sizes": {str(c): c / L for c in scales},
            "batch_size": batch,
            "chains": chains,
            "increments_per_run": total,
            "start_method": start,
            "eps": eps,
        },
        "posterior_mean": mean.tolist(),
        "posterior_sd": cov.diagonal().sqrt().tolist(),
        "w2_floor": {"mean": floor, "sd": floor_sd},
        "rows": rows,
        "runs": extra,
    }
    from .output import write_csv_atomic, write_text_atomic

    write_csv_atomic(out_dir / "delayed_sgld.csv", curves)
    write_text_atomic(out_dir / "delayed_sgld.json", json.dumps(summary, indent=2) + "\n")
    _plots(out_dir, curves, scales, floor, eps)
    return summary


def _plots(out_dir: Path, curves: list[dict], scales, floor: float, eps: float) -> None:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    colors = {"sync": "C0", "w-con": "C1", "w-icon": "C2"}
    for xkey, xlabel, name in (
        ("iteration", "iterations per worker", "delayed_sgld_iterations.png"),
        ("wall_s", "wall time (s, from the workers' start)", "delayed_sgld_wall.png"),
    ):
        fig = Figure(figsize=(9.0, 3.2 * len(scales) + 0.4))
        FigureCanvasAgg(fig)
        axes = fig.subplots(len(scales), 2, sharey=True, squeeze=False)
        for row, c in zip(axes, scales, strict=True):
            for ax, P in zip(row, (2, 4), strict=True):
                for mode in MODES:
                    pts = [
                        q
                        for q in curves
                        if q["workers"] == P and q["mode"] == mode and q["step_scale"] == c
                    ]
                    xs, ys = [q[xkey] for q in pts], [q["w2"] for q in pts]
                    ax.semilogy(xs, ys, label=mode, color=colors[mode], lw=1.2)
                ax.axhline(floor, color="gray", ls=":", lw=1, label="floor (R exact draws)")
                ax.axhline(eps, color="gray", ls="--", lw=0.8, label=f"ε = {eps:g}")
                ax.set_title(f"γ = {c:g}/L, P = {P}", fontsize=9)
                ax.set_xlabel(xlabel, fontsize=8)
            row[0].set_ylabel("W₂ to the posterior")
        axes[0][0].legend(fontsize=7)
        fig.suptitle("Delayed SGLD, 4th-degree polynomial regression", fontsize=10)
        fig.tight_layout()
        fig.savefig(out_dir / name, dpi=120)
