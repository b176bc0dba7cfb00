"""Delayed SGLD's settings and its update: one worker's noisy increment
−γ ∇Ũ_p(X̂) + √(2τγ) G_p, with counter-based noise and minibatches, and the ``sync`` chain computed
in one process ([`sequential_reference`][fedhmc.algorithms.delayed.sgld.sequential_reference]).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from fedhmc.algorithms.delayed.problem import Regression, gradient
from fedhmc.core import rng
from fedhmc.core.streams import STREAM_DELAYED_BATCH, STREAM_DELAYED_NOISE
from fedhmc.errors import ConfigError

MODES = ("sync", "w-con", "w-icon")


START_METHODS = ("spawn", "fork", "forkserver")


@dataclass(frozen=True)
class Settings:
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
        τ > 0: the target is exp(−U/τ).
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

    def __post_init__(self) -> None:
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


def _keys(seed: int, stream: int, worker: int, chains: int) -> torch.Tensor:
    return rng.derive(int(seed), stream, worker, torch.arange(chains, dtype=torch.int64))


def increment(
    problem: Regression,
    s: Settings,
    x: torch.Tensor,
    noise_keys: torch.Tensor,
    batch_keys: torch.Tensor,
    j: int,
) -> torch.Tensor:
    """Worker's j-th SGLD increment at the read position x: −γ ∇Ũ(x) + √(2τγ) G_j."""
    g = gradient(problem, x, batch_keys, j, s.batch_size)
    noise = rng.normal(noise_keys, j, problem.dim, dtype=torch.float64)
    return -s.step_size * g + math.sqrt(2.0 * s.temperature * s.step_size) * noise


def sequential_reference(
    problem: Regression, settings: Settings, x0: torch.Tensor | None = None
) -> torch.Tensor:
    r"""The ``sync`` chain computed in this process, as a plain loop: snapshots (C + 1, R, d).

    Iteration k: $X \leftarrow X + \sum_{p=0}^{P-1} \left(-\gamma \nabla\tilde U_p(X)
    + \sqrt{2\tau\gamma}\, G_{p,k}\right)$, with worker p's keys.
    """
    s = settings
    R, d = s.chains, problem.dim
    x = torch.zeros(R, d, dtype=torch.float64) if x0 is None else x0.clone().to(torch.float64)
    state = init(x, s)
    snaps = [x.clone()]
    for _ in range(s.iterations):
        state, _ = step(s.seed, state, problem, s)
        if state.round % s.record_every == 0:
            snaps.append(state.position.clone())
    return torch.stack(snaps)


# ------------------------------------------------------------------ the algorithm API
@dataclass(frozen=True)
class State:
    """The R chains X (R, d) after ``round`` synchronous iterations (calls of ``step``)."""

    position: torch.Tensor
    round: int = 0


@dataclass(frozen=True)
class Info:
    """One iteration.

    Attributes
    ----------
    increments
        The P workers' increments (P, R, d), before they are summed.
    grad_evals
        Minibatch gradient evaluations: P × R.
    finite
        Whether every increment is finite.
    clients
        1: the workers share the pooled data (there are no clients).
    energy_error
        None: SGLD has no leapfrog trajectory.
    """

    increments: torch.Tensor
    grad_evals: int
    finite: bool
    clients: int = 1
    energy_error: float | None = None


def init(position: torch.Tensor, settings: Settings) -> State:
    """The chains at ``position`` (R, d), in float64."""
    return State(position.clone().to(torch.float64), 0)


def step(seed: int, state: State, target: Regression, settings: Settings) -> tuple[State, Info]:
    r"""One ``sync`` iteration, in this process:
    $X \leftarrow X + \sum_p (-\gamma \nabla\tilde U_p(X) + \sqrt{2\tau\gamma}\, G_{p,k})$,
    every worker p reading the same X with its own keys derived from ``seed`` (the run
    seed). ``target`` is the regression problem, a gradient oracle whose minibatches are
    drawn with replacement. The multi-process driver (``run_delayed``) computes the same
    chain in ``sync`` mode."""
    s, R, k = settings, state.position.shape[0], state.round
    x = state.position
    oracle = target.with_batch_size(s.batch_size)
    deltas = []
    for p in range(s.workers):
        batch_keys = _keys(seed, STREAM_DELAYED_BATCH, p, R)
        g, _ = oracle.grad(x.unsqueeze(1), batch_keys.view(-1, 1), k, False)
        noise = rng.normal(_keys(seed, STREAM_DELAYED_NOISE, p, R), k, target.dim, torch.float64)
        deltas.append(-s.step_size * g[:, 0] + math.sqrt(2.0 * s.temperature * s.step_size) * noise)
    deltas = torch.stack(deltas)
    info = Info(deltas, s.workers * R, bool(torch.isfinite(deltas).all()))
    return State(x + deltas.sum(0), k + 1), info
