"""Asynchronous distributed SG-MCMC: the server side of one chain (docs/algorithms.md).

Chen et al. (2016), Appendix A, Algorithm 2: a server holds θ (and the SGHMC momentum q)
and a timestamp t, the number of updates it has applied. Workers receive (θ, t), compute a
stochastic gradient at θ and send it back; the server applies each gradient as soon as it
arrives, with no waiting for the other workers:

    SGHMC:  q ← (1 − B h) q − h g / τ + √(2 B h) ζ_t,   θ ← θ + h q
    SGLD:   θ ← θ − h g / τ + √(2 h) ζ_t

and t ← t + 1. The gradient's staleness is the number of updates applied between the θ the worker
was sent and this one, t_now − t_sent; a gradient staler than ``max_staleness`` is dropped, as in
Chen et al.'s Algorithm 1 (``if δ_l ≤ δ``). ζ_t is the chain's counter-based noise of step t (the
stream of [`fedhmc.algorithms.stale`][fedhmc.algorithms.stale]), so a chain whose gradients all
arrive fresh is ``fedhmc.algorithms.stale``'s chain with δ = 0, bit for bit.

This module is pure torch: no messages, no clocks.
[`AsyncChain`][fedhmc.algorithms.async_sgmcmc.AsyncChain] is the state machine the Flower
ServerApp (``fedhmc_server.async_loop``) drives, one per server.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from dataclasses import dataclass, field

import torch

from fedhmc.algorithms import api, stale
from fedhmc.algorithms.oracles import Received
from fedhmc.algorithms.stale import euler_step
from fedhmc.core import gradients, rng
from fedhmc.core.streams import STREAM_ASYNC_BATCH, STREAM_STALE_NOISE


@dataclass(frozen=True)
class Settings(stale.EulerSettings):
    """The options of an asynchronous chain: an Euler chain's
    (`fedhmc.algorithms.stale.EulerSettings`), the staleness bound and the round."""

    max_staleness: int = api.option(
        10, "δ, drop a gradient staler than this many server updates", low=0
    )
    local_steps: int = api.option(
        10, "the server's updates a round (a round: a row of metrics, a checkpoint)", low=1
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
        The chain's [`Settings`][fedhmc.algorithms.async_sgmcmc.Settings].
    seed, chain
        The run seed and the chain's index: the noise of step t is drawn from the chain's
        key (``stale.chain_keys(seed, S)[chain]``) and t.
    snapshot_every
        Keep a copy of θ each time t reaches a multiple of this (the run's rounds).
    """

    theta: torch.Tensor
    settings: Settings
    seed: int
    chain: int = 0
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
        # Only gradients it applies reach ``step``: its calls so far are its t updates.
        now = State(self.theta, self.momentum, round=self.t, timestamp=self.t, chain=self.chain)
        new, _ = step(self.seed, now, Received(grad, sent_t), self.settings)
        self.theta, self.momentum, self.t = new.position, new.momentum, new.timestamp
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
    """One asynchronous chain: position θ (D,), momentum q (D,), the ``step`` calls so far
    (``round``: one per arriving gradient, applied or dropped), the timestamp t (the updates
    applied) and the chain's index among the run's chains."""

    position: torch.Tensor
    momentum: torch.Tensor
    round: int = 0
    timestamp: int = 0
    chain: int = 0


@dataclass(frozen=True)
class Info:
    """What ``step`` did with one arriving gradient.

    Attributes
    ----------
    applied
        Whether it was applied (False: dropped as too stale).
    staleness
        t_now − t_sent.
    grad_evals
        The gradient evaluations that entered: 1, or 0 if dropped.
    finite
        Whether the new position and momentum are finite (True if dropped).
    clients
        The workers whose gradient entered: 1, or 0 if dropped.
    energy_error
        None: an Euler step has no leapfrog trajectory.
    """

    applied: bool
    staleness: int
    grad_evals: int
    finite: bool
    clients: int
    energy_error: float | None = None


def init(position: torch.Tensor, settings: Settings) -> State:
    """A chain at ``position`` (D,) with zero momentum and t = 0."""
    return State(position.clone(), torch.zeros_like(position))


def step(seed: int, state: State, target: Received, settings: Settings) -> tuple[State, Info]:
    """Apply one arriving gradient: ``target`` is the worker's reply
    (``oracles.Received(gradient, sent)``), computed at the θ of timestamp ``sent``.

    A gradient staler than ``settings.max_staleness`` is dropped (only ``round`` advances).
    ``seed`` is the run seed: the noise of update t is the chain's stale-gradient noise
    stream (``stale.chain_keys(seed, …)[state.chain]``) at t = ``state.timestamp``.
    """
    t = state.timestamp
    tau = t - target.sent
    if tau > settings.max_staleness:
        return dataclasses.replace(state, round=state.round + 1), Info(False, tau, 0, True, 0)
    position = state.position
    g, _ = target.grad(position.view(1, 1, -1), None, t, False)
    g = gradients.tempered(g.view(position.shape), settings.temperature)  # as stale
    chain_key = stale.chain_keys(seed, torch.tensor([state.chain], device=position.device))
    noise_key = rng.derive(chain_key.reshape(1), STREAM_STALE_NOISE)
    zeta = rng.normal(noise_key, t, position.shape[-1], position.dtype)[0]
    theta, momentum = euler_step(
        settings.method, position, state.momentum, g, zeta, settings.step_size, settings.friction
    )
    finite = bool(torch.isfinite(theta).all() & torch.isfinite(momentum).all())
    new = State(theta, momentum, round=state.round + 1, timestamp=t + 1, chain=state.chain)
    return new, Info(True, tau, 1, finite, 1)


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


def worker_key(seed: int, chain: int, device: torch.device | str = "cpu") -> torch.Tensor:
    """The (1,) key from which a worker draws its minibatches (and gradient noise) for a
    chain, on the worker's ``device``: derived from the worker's own seed and the chain."""
    chain_id = torch.tensor([int(chain)], device=device)
    return rng.derive(int(seed), STREAM_ASYNC_BATCH, chain_id)


def worker_gradient(
    target, theta: torch.Tensor, key: torch.Tensor, index: int, grad_noise: float = 0.0
) -> torch.Tensor:
    """∇f̃ at θ (D,), minibatch number ``index`` under ``key``, plus σ_g N(0, I) noise."""
    g, _ = target.grad(theta.reshape(1, 1, -1).clone(), key.reshape(1, 1), int(index), False)
    g = g[0, 0]
    return gradients.add_noise(g, gradients.noise_keys(key), index, grad_noise)
