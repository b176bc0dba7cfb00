"""Asynchronous distributed SG-MCMC: the server side of one chain (docs/algorithms.md).

Chen et al. (2016), Appendix A, Algorithm 2: a server holds θ (and the SGHMC momentum q)
and a timestamp t, the number of updates it has applied. Workers receive (θ, t), compute a
stochastic gradient at θ and send it back; the server applies each gradient as soon as it
arrives, with no waiting for the other workers:

    SGHMC:  q ← (1 − B h) q − h g / T + √(2 B h) ζ_t,   θ ← θ + h q
    SGLD:   θ ← θ − h g / T + √(2 h) ζ_t

and t ← t + 1. The gradient's staleness is the number of updates applied between the θ the
worker was sent and this one, t_now − t_sent; a gradient staler than ``max_staleness`` is
dropped, as in Chen et al.'s Algorithm 1 (``if τ_l ≤ τ``). ζ_t is the chain's counter-based
noise of step t (the stream of :mod:`fedhmc.algorithms.stale`), so a chain whose gradients
all arrive fresh is :func:`fedhmc.algorithms.stale.advance` with τ = 0, bit for bit.

This module is pure torch: no messages, no clocks. :class:`AsyncChain` is the state
machine the Flower ServerApp (``fedhmc_server.async_loop``) drives, one per server.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

import torch

from fedhmc.algorithms.stale import StaleSettings, euler_step
from fedhmc.core import gradients, rng
from fedhmc.core.streams import STREAM_ASYNC_BATCH, STREAM_STALE_NOISE
from fedhmc.errors import ConfigError


@dataclass(frozen=True)
class AsyncSettings:
    """Settings of an asynchronous chain.

    Attributes
    ----------
    method
        ``"sghmc"`` or ``"sgld"``.
    step_size, friction, temperature
        h, B (SGHMC) and T, validated as in :class:`fedhmc.algorithms.stale.StaleSettings`.
    max_staleness
        τ: a gradient with staleness > τ is dropped.
    """

    method: str
    step_size: float
    friction: float = 1.0
    temperature: float = 1.0
    max_staleness: int = 10

    def __post_init__(self) -> None:
        StaleSettings(
            self.method, self.step_size, self.friction, temperature=self.temperature
        )  # validates h, B, T with one-line messages
        if int(self.max_staleness) != self.max_staleness or self.max_staleness < 0:
            raise ConfigError(f"--max-staleness must be an integer ≥ 0, got {self.max_staleness}")

    @staticmethod
    def from_config(cfg) -> AsyncSettings:
        """From a resolved :class:`~fedhmc.runtime.config.RunConfig` with an async algorithm."""
        return AsyncSettings(
            method=cfg.algorithm.removeprefix("async-"),
            step_size=float(cfg.step_size),
            friction=float(cfg.friction),
            temperature=float(cfg.temperature),
            max_staleness=int(cfg.max_staleness),
        )


@dataclass
class WorkerStats:
    """What one worker did for its chain."""

    applied: int = 0
    dropped: int = 0
    errors: int = 0
    lost: int = 0
    consecutive_failures: int = 0
    retired: bool = False


@dataclass
class AsyncChain:
    """The server of one chain: position, momentum, timestamp and bookkeeping.

    Parameters
    ----------
    theta
        θ_0, (D,).
    settings
        The chain's :class:`AsyncSettings`.
    key
        The chain's key, a (1,) int64 tensor (e.g. one entry of
        :func:`fedhmc.algorithms.stale.chain_keys`); the noise of step t is drawn from it and t.
    snapshot_every
        Keep a copy of θ each time t reaches a multiple of this (the run's rounds).
    """

    theta: torch.Tensor
    settings: AsyncSettings
    key: torch.Tensor
    snapshot_every: int = 0
    momentum: torch.Tensor | None = None
    t: int = 0
    staleness: Counter = field(default_factory=Counter)
    """Staleness value → number of gradients received with it (applied or dropped)."""
    dropped_staleness: Counter = field(default_factory=Counter)
    workers: dict = field(default_factory=dict)
    snapshots: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.theta = self.theta.clone()
        if self.momentum is None:
            self.momentum = torch.zeros_like(self.theta)
        self._noise_key = rng.derive(self.key.reshape(1), STREAM_STALE_NOISE)

    def worker(self, w) -> WorkerStats:
        if w not in self.workers:
            self.workers[w] = WorkerStats()
        return self.workers[w]

    def send(self, w) -> tuple[torch.Tensor, int]:
        """What worker ``w`` is sent: (a copy of θ, the timestamp t)."""
        self.worker(w)
        return self.theta.clone(), self.t

    def receive(self, w, grad: torch.Tensor, sent_t: int) -> bool:
        """Apply worker ``w``'s gradient, computed at the θ of timestamp ``sent_t``.

        Returns True if applied, False if dropped as too stale.
        """
        if sent_t > self.t or sent_t < 0:
            raise ValueError(f"timestamp {sent_t} is not one this chain (at {self.t}) sent")
        stats = self.worker(w)
        stats.consecutive_failures = 0
        tau = self.t - sent_t
        self.staleness[tau] += 1
        if tau > self.settings.max_staleness:
            self.dropped_staleness[tau] += 1
            stats.dropped += 1
            return False
        new, _ = step(
            State(self.theta, self.momentum, self.t),
            grad,
            self.settings,
            noise_key=self._noise_key,
            sent_t=sent_t,
        )
        self.theta, self.momentum, self.t = new.theta, new.momentum, new.t
        stats.applied += 1
        if self.snapshot_every and self.t % self.snapshot_every == 0:
            self.snapshots[self.t // self.snapshot_every] = self.theta.clone()
        return True

    def fail(self, w, lost: bool, max_failures: int) -> bool:
        """Record a failed request of worker ``w`` (an error reply, or ``lost``: no reply
        in time). Returns True if the worker is now retired: a lost worker at once (it may
        be hung; another message would queue behind it), an erring one after
        ``max_failures`` failures in a row."""
        stats = self.worker(w)
        if lost:
            stats.lost += 1
            stats.retired = True
        else:
            stats.errors += 1
            stats.consecutive_failures += 1
            stats.retired = stats.consecutive_failures >= max_failures
        return stats.retired

    def active_workers(self) -> list:
        return [w for w, s in self.workers.items() if not s.retired]

    @property
    def applied(self) -> int:
        return self.t

    @property
    def dropped(self) -> int:
        return sum(self.dropped_staleness.values())


@dataclass(frozen=True)
class State:
    """One asynchronous chain's position θ (D,), momentum q (D,) and timestamp t (the
    number of updates applied)."""

    theta: torch.Tensor
    momentum: torch.Tensor
    t: int = 0


@dataclass(frozen=True)
class Info:
    """What :func:`step` did with one arriving gradient: applied or dropped, and its
    staleness t_now − t_sent."""

    applied: bool
    staleness: int


Settings = AsyncSettings


def init(position: torch.Tensor, settings: AsyncSettings) -> State:
    """A chain at ``position`` (D,) with zero momentum and t = 0."""
    return State(position.clone(), torch.zeros_like(position), 0)


def step(
    state: State,
    grad: torch.Tensor,
    settings: AsyncSettings,
    *,
    noise_key: torch.Tensor,
    sent_t: int,
) -> tuple[State, Info]:
    """Apply one arriving gradient ``grad`` (D,), computed at the θ of timestamp ``sent_t``.

    A gradient staler than ``settings.max_staleness`` is dropped (the state is returned
    unchanged). ``noise_key`` is the chain's noise key, ``derive(key, STREAM_STALE_NOISE)``.
    """
    tau = state.t - sent_t
    if tau > settings.max_staleness:
        return state, Info(False, tau)
    g = grad.to(state.theta.dtype)
    g = gradients.tempered(g, settings.temperature)  # as fedhmc.algorithms.stale
    zeta = rng.normal(noise_key, state.t, state.theta.shape[-1], state.theta.dtype)[0]
    theta, momentum = euler_step(
        settings.method, state.theta, state.momentum, g, zeta, settings.step_size, settings.friction
    )
    return State(theta, momentum, state.t + 1), Info(True, tau)


def staleness_rows(chains: list[AsyncChain]) -> list[dict]:
    """staleness.csv rows: chain, staleness, received, applied, dropped."""
    rows = []
    for c, chain in enumerate(chains):
        for tau in sorted(chain.staleness):
            got, drop = chain.staleness[tau], chain.dropped_staleness.get(tau, 0)
            rows.append(
                {
                    "chain": c,
                    "staleness": tau,
                    "received": got,
                    "applied": got - drop,
                    "dropped": drop,
                }
            )
    return rows


def pooled_histogram(chains: list[AsyncChain], applied_only: bool = False) -> dict[int, int]:
    """Staleness → count over all chains (received, or applied only)."""
    total: Counter = Counter()
    for chain in chains:
        total.update(chain.staleness)
        if applied_only:
            total.subtract(chain.dropped_staleness)
    return {int(k): int(v) for k, v in sorted(total.items()) if v}


# ------------------------------------------------------------------------ the worker side


def worker_key(seed: int, chain: int) -> torch.Tensor:
    """The (1,) key from which a worker draws its minibatches (and gradient noise) for a
    chain: derived from the worker's own seed and the chain."""
    return rng.derive(int(seed), STREAM_ASYNC_BATCH, torch.tensor([int(chain)]))


def worker_gradient(
    target, theta: torch.Tensor, key: torch.Tensor, index: int, grad_noise: float = 0.0
) -> torch.Tensor:
    """∇f̃ at θ (D,), minibatch number ``index`` under ``key``, plus σ_g N(0, I) noise."""
    g, _ = target.grad(theta.reshape(1, 1, -1).clone(), key.reshape(1, 1), int(index), False)
    g = g[0, 0]
    return gradients.add_noise(g, gradients.noise_keys(key), index, grad_noise)
