"""SG-MCMC with stale gradients: SGHMC (Euler, friction B) and SGLD (docs/algorithms.md).

Chen et al. (2016), Algorithm 1, and the delayed SGLD of Kungurtsev et al. The gradient at
step l is evaluated at the position of step l − τ_l:

    SGHMC:  q_{l+1} = (1 − B h) q_l − h ∇Ũ(θ_{l−τ_l}) + √(2 B h) ζ_l,   θ_{l+1} = θ_l + h q_{l+1}
    SGLD:   θ_{l+1} = θ_l − h ∇Ũ(θ_{l−τ_l}) + √(2 h) ζ_l

with ζ_l ~ N(0, I), and τ_l = τ ("fixed") or drawn uniformly from {0, …, τ} ("uniform"),
independently per chain and step. For l < τ_l the gradient is evaluated at θ_0 (the chain
has no earlier positions). A posterior temperature T divides ∇Ũ (the target is
exp(−U/T)). τ = 0 is plain SGHMC / SGLD.

Everything is vectorised over S independent chains (positions (S, D)). Past positions live
in a ring buffer of τ + 1 slots: position θ_j sits in slot j mod (τ + 1), so the τ + 1 most
recent positions are always there and nothing else is copied. Randomness is counter-based
(:mod:`fedhmc.core.rng`): the noise and the τ_l of step l come from the chain's key and l alone,
so advancing 10 then 15 steps gives exactly the 25-step chain.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch

from fedhmc.core import gradients, rng
from fedhmc.core.streams import STREAM_STALE_BATCH, STREAM_STALE_DELAY, STREAM_STALE_NOISE
from fedhmc.errors import ConfigError

METHODS = ("sghmc", "sgld")
STALENESS_DISTS = ("fixed", "uniform")


GradFn = Callable[[torch.Tensor, int], torch.Tensor]
"""``grad_fn(theta (S, D), step) -> ∇Ũ (S, D)``: ``step`` selects the minibatch."""


@dataclass(frozen=True)
class StaleSettings:
    """Settings of a stale-gradient SG-MCMC chain.

    Attributes
    ----------
    method
        ``"sghmc"`` or ``"sgld"``.
    step_size
        h > 0.
    friction
        B ≥ 0 (SGHMC only; B h ≤ 1 keeps the momentum decay in [0, 1]).
    staleness
        τ ≥ 0.
    staleness_dist
        ``"fixed"`` (τ_l = τ) or ``"uniform"`` (τ_l uniform on {0, …, τ}).
    temperature
        T > 0: the chain targets exp(−U/T).
    """

    method: str
    step_size: float
    friction: float = 1.0
    staleness: int = 0
    staleness_dist: str = "fixed"
    temperature: float = 1.0

    def __post_init__(self) -> None:
        if self.method not in METHODS:
            raise ConfigError(f"method must be one of {', '.join(METHODS)}; got {self.method!r}")
        if not (math.isfinite(self.step_size) and self.step_size > 0):
            raise ConfigError(f"step size h must be > 0, got {self.step_size}")
        if not (math.isfinite(self.friction) and self.friction >= 0):
            raise ConfigError(f"friction B must be ≥ 0, got {self.friction}")
        if self.method == "sghmc" and self.friction * self.step_size > 1:
            raise ConfigError(
                f"friction × step size = {self.friction * self.step_size:g} > 1 makes the "
                "momentum decay negative; lower --friction or --step-size"
            )
        if int(self.staleness) != self.staleness or self.staleness < 0:
            raise ConfigError(f"staleness τ must be an integer ≥ 0, got {self.staleness}")
        if self.staleness_dist not in STALENESS_DISTS:
            raise ConfigError(
                f"staleness distribution must be one of {', '.join(STALENESS_DISTS)}; "
                f"got {self.staleness_dist!r}"
            )
        if not (math.isfinite(self.temperature) and self.temperature > 0):
            raise ConfigError(f"temperature must be > 0, got {self.temperature}")


@dataclass
class StaleState:
    """A chain between calls to :func:`advance`."""

    theta: torch.Tensor
    """Current positions θ_l, (S, D)."""
    momentum: torch.Tensor
    """Current momenta q_l, (S, D) (zeros for SGLD)."""
    ring: torch.Tensor
    """The last τ + 1 positions, (τ + 1, S, D): θ_j in slot j mod (τ + 1)."""
    step: int
    """l: the number of steps taken."""


def init_state(theta0: torch.Tensor, settings: StaleSettings) -> StaleState:
    """A chain at θ_0 with zero momentum; every ring slot holds θ_0."""
    ring = theta0.unsqueeze(0).repeat(settings.staleness + 1, 1, 1)
    return StaleState(theta0.clone(), torch.zeros_like(theta0), ring, 0)


def chain_keys(seed: int, chains: int | torch.Tensor) -> torch.Tensor:
    """Per-chain keys (S,) of a run seed."""
    idx = torch.arange(chains) if isinstance(chains, int) else chains
    return rng.derive(seed, rng.STREAM_CHAIN, idx)


def delays(keys: torch.Tensor, step: int, settings: StaleSettings) -> torch.Tensor:
    """τ_l of every chain at step l: (S,) int64."""
    S, tau = keys.shape[0], settings.staleness
    if tau == 0 or settings.staleness_dist == "fixed":
        return torch.full((S,), tau, dtype=torch.int64, device=keys.device)
    u = rng.uniform(rng.derive(keys, STREAM_STALE_DELAY), step, 1)[:, 0]
    return torch.clamp((u * (tau + 1)).to(torch.int64), max=tau)


def euler_step(
    method: str,
    theta: torch.Tensor,
    momentum: torch.Tensor,
    grad: torch.Tensor,
    zeta: torch.Tensor,
    step_size: float,
    friction: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One SGHMC (Euler, friction B) or SGLD update; returns (θ, q).

    ``grad`` is ∇Ũ already divided by the temperature; ``zeta`` is N(0, I) noise. SGLD
    leaves the momentum as it is.
    """
    h, B = step_size, friction
    if method == "sghmc":
        q = (1.0 - B * h) * momentum - h * grad + math.sqrt(2.0 * B * h) * zeta
        return theta + h * q, q
    return theta - h * grad + math.sqrt(2.0 * h) * zeta, momentum


def advance(
    state: StaleState,
    grad_fn: GradFn,
    num_steps: int,
    settings: StaleSettings,
    keys: torch.Tensor,
) -> StaleState:
    """Take ``num_steps`` steps of stale SGHMC or SGLD; returns the new state.

    Parameters
    ----------
    state
        From :func:`init_state` or a previous call (not modified).
    grad_fn
        ∇Ũ at positions (S, D) for step l.
    keys
        Per-chain keys (S,), e.g. :func:`chain_keys`.
    """
    theta, q, ring = state.theta.clone(), state.momentum.clone(), state.ring.clone()
    S, D = theta.shape
    slots = settings.staleness + 1
    h, B = settings.step_size, settings.friction
    noise_keys = rng.derive(keys, STREAM_STALE_NOISE)
    chain_idx = torch.arange(S, device=theta.device)
    step = state.step
    for _ in range(num_steps):
        tau_l = delays(keys, step, settings)
        src = torch.remainder(step - tau_l, slots)  # slot of θ_{max(l − τ_l, 0)}
        stale = theta if settings.staleness == 0 else ring[src, chain_idx]
        g = grad_fn(stale, step)
        g = gradients.tempered(g, settings.temperature)
        zeta = rng.normal(noise_keys, step, D, theta.dtype)
        theta, q = euler_step(settings.method, theta, q, g, zeta, h, B)
        step += 1
        if settings.staleness > 0:
            ring[step % slots] = theta
    return StaleState(theta, q, ring, step)


def target_grad_fn(target, keys: torch.Tensor) -> GradFn:
    """∇Ũ of a one-client fedhmc target (the pooled data) as a :data:`GradFn`.

    Minibatches are drawn by the target from per-chain keys derived from ``keys`` and the
    step, as the FA-HMC engine draws them.
    """
    if target.num_clients != 1:
        raise ValueError("stale SG-MCMC runs on the pooled data: a one-client target")
    batch_keys = rng.derive(keys, STREAM_STALE_BATCH).view(-1, 1)

    def grad(theta: torch.Tensor, step: int) -> torch.Tensor:
        g, _ = target.grad(theta.unsqueeze(1).clone(), batch_keys, step, False)
        return g[:, 0]

    return grad


# ------------------------------------------------------------------ the algorithm API
Settings = StaleSettings
State = StaleState


@dataclass(frozen=True)
class Info:
    """What one call of :func:`step` did: the steps taken and whether every momentum
    stayed finite."""

    steps: int
    finite: bool


def init(position: torch.Tensor, settings: StaleSettings) -> StaleState:
    """A chain at ``position`` (S, D) with zero momentum (:func:`init_state`)."""
    return init_state(position, settings)


def step(
    state: StaleState,
    grad_fn: GradFn,
    settings: StaleSettings,
    *,
    keys: torch.Tensor,
    num_steps: int = 1,
) -> tuple[StaleState, Info]:
    """``num_steps`` steps of stale SGHMC or SGLD (:func:`advance`); ``keys`` (S,) are the
    chains' keys (:func:`chain_keys`) and ``grad_fn`` the gradient oracle
    (:func:`target_grad_fn`)."""
    new = advance(state, grad_fn, num_steps, settings, keys)
    return new, Info(num_steps, bool(torch.isfinite(new.momentum).all()))
