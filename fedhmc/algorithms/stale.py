"""SG-MCMC with stale gradients: SGHMC (Euler, friction B) and SGLD (docs/algorithms.md).

Chen et al. (2016), Algorithm 1, and the delayed SGLD of Kungurtsev et al. The gradient at
step l is evaluated at the position of step l − δ_l:

    SGHMC:  q_{l+1} = (1 − B h) q_l − h ∇Ũ(θ_{l−δ_l}) + √(2 B h) ζ_l,   θ_{l+1} = θ_l + h q_{l+1}
    SGLD:   θ_{l+1} = θ_l − h ∇Ũ(θ_{l−δ_l}) + √(2 h) ζ_l

with ζ_l ~ N(0, I), and δ_l = δ ("fixed") or drawn uniformly from {0, …, δ} ("uniform"),
independently per chain and step. For l < δ_l the gradient is evaluated at θ_0 (the chain
has no earlier positions). A posterior temperature τ divides ∇Ũ (the target is
exp(−U/τ)). δ = 0 is plain SGHMC / SGLD.

Everything is vectorised over S independent chains (positions (S, D)). Past positions live
in a ring buffer of δ + 1 slots: position θ_j sits in slot j mod (δ + 1), so the δ + 1 most
recent positions are always there and nothing else is copied. Randomness is counter-based
(``fedhmc.core.rng``): the noise and the δ_l of step l come from the chain's key and l alone.
A State counts its ``step`` calls (``round``); call r takes Euler steps l = r·T … r·T + T − 1
(T = ``settings.local_steps``), so k calls of T steps give exactly the chain of one call of k·T
steps.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import ClassVar

import torch

from fedhmc.algorithms import api
from fedhmc.core import gradients, rng
from fedhmc.core.streams import (
    STREAM_CHAIN,
    STREAM_STALE_BATCH,
    STREAM_STALE_DELAY,
    STREAM_STALE_NOISE,
)

METHODS = ("sghmc", "sgld")
STALENESS_LAWS = ("fixed", "uniform")
"""The laws of δ_l (``Settings.staleness_dist``)."""


StaleGradFn = Callable[[torch.Tensor, int], torch.Tensor]
"""``grad_fn(theta (S, D), l) -> ∇Ũ (S, D)``: the Euler step l selects the minibatch."""


@dataclass(frozen=True)
class EulerSettings(api.Settings):
    """The options an Euler-step SG-MCMC chain has, here and in the asynchronous samplers
    (``method``, ``sghmc`` or ``sgld``, is fixed by the algorithm's name; SGLD has no
    friction). A step left unset is the dataset's η for SGHMC and η²/2 for SGLD (FA-LD's
    learning rate); a friction left unset is 0.1 / h for SGHMC (B·h = 0.1) and 0 for SGLD."""

    STEP_SYMBOL: ClassVar[str] = "h"
    method: str = "sghmc"
    step_size: float | None = api.option(
        None,
        "h, the Euler step (default: the dataset's η for SGHMC, η²/2 for SGLD, FA-LD's "
        "learning rate)",
        low=0,
        low_open=True,
    )
    friction: float | None = api.option(
        None, "B, the momentum's friction (default 0.1 / h: B·h = 0.1)", low=0
    )
    temperature: float = api.option(
        1.0, "τ, the posterior temperature: the target is exp(−f/τ)", low=0, low_open=True
    )
    grad_noise: float = api.option(
        0.0, "σ_g, the std of the Gaussian noise added to every gradient", low=0
    )

    def __post_init__(self) -> None:
        if self.friction is None and self.step_size is not None:  # (frozen: being made)
            friction = 0.1 / self.step_size if self.method == "sghmc" else 0.0
            object.__setattr__(self, "friction", float(friction))
        super().__post_init__()

    def check(self) -> str | None:
        if self.method not in METHODS:
            return f"method must be one of {', '.join(METHODS)}; got {self.method!r}"
        if self.friction is not None and self.step_size is not None:
            if self.friction * self.step_size > 1:
                return (
                    f"friction × step size = {self.friction * self.step_size:g} > 1 makes the "
                    "momentum decay negative; lower --friction or --step-size"
                )
        return None

    def with_defaults(self, step_size: float):
        if self.step_size is not None:
            return self
        h = step_size if self.method == "sghmc" else step_size**2 / 2
        return dataclasses.replace(self, step_size=float(h))


@dataclass(frozen=True)
class Settings(EulerSettings):
    """The options of a stale-gradient SG-MCMC chain on the pooled data."""

    staleness: int = api.option(0, "δ, the gradient staleness in steps", low=0)
    staleness_dist: str = api.option(
        "fixed",
        "each step's staleness δₗ is δ (fixed) or uniform on {0, …, δ}",
        choices=STALENESS_LAWS,
    )
    local_steps: int = api.option(10, "the Euler steps per round", low=1)


@dataclass(frozen=True)
class State:
    """Chains between calls to ``step``."""

    position: torch.Tensor
    """Current positions θ_l, (S, D)."""
    momentum: torch.Tensor
    """Current momenta q_l, (S, D) (zeros for SGLD)."""
    ring: torch.Tensor
    """The last δ + 1 positions, (δ + 1, S, D): θ_j in slot j mod (δ + 1)."""
    round: int = 0
    """The number of ``step`` calls so far: the chains have taken l = round × T Euler steps
    (T = ``settings.local_steps``)."""


@dataclass(frozen=True)
class Info:
    """What one call of ``step`` did.

    Attributes
    ----------
    grad_evals
        Gradient evaluations: steps × chains.
    finite
        Whether every momentum stayed finite.
    clients
        1: the pooled data is one client.
    energy_error
        None: an Euler step has no leapfrog trajectory.
    """

    grad_evals: int
    finite: bool
    clients: int = 1
    energy_error: float | None = None


def init(position: torch.Tensor, settings: Settings) -> State:
    """Chains at ``position`` (S, D) with zero momentum; every ring slot holds θ_0."""
    ring = position.unsqueeze(0).repeat(settings.staleness + 1, 1, 1)
    return State(position.clone(), torch.zeros_like(position), ring, 0)


def chain_keys(seed: int, chains: int | torch.Tensor, device=None) -> torch.Tensor:
    """Per-chain keys (S,) of a run seed (chains 0 … S−1, or the chain ids given), on
    ``device`` (default: the ids' device, or the CPU)."""
    if isinstance(chains, int):
        idx = torch.arange(chains, device=device)
    else:
        idx = chains if device is None else chains.to(device)
    return rng.derive(seed, STREAM_CHAIN, idx)


def delays(keys: torch.Tensor, step: int, settings: Settings) -> torch.Tensor:
    """δ_l of every chain at Euler step l = ``step``: (S,) int64."""
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


def _advance(state: State, grad_fn: StaleGradFn, settings: Settings, keys: torch.Tensor) -> State:
    """The ``settings.local_steps`` Euler steps of round ``state.round`` (l = round × T …
    round × T + T − 1) of stale SGHMC or SGLD from ``state`` (not modified), with the
    chains' keys (S,) and ∇Ũ at positions (S, D) for step l."""
    theta, q, ring = state.position.clone(), state.momentum.clone(), state.ring.clone()
    S, D = theta.shape
    slots = settings.staleness + 1
    h, B = settings.step_size, settings.friction
    noise_keys = rng.derive(keys, STREAM_STALE_NOISE)
    chain_idx = torch.arange(S, device=theta.device)
    first = state.round * settings.local_steps  # the Euler steps taken before this round
    for l in range(first, first + settings.local_steps):  # noqa: E741 (the paper's step index)
        tau_l = delays(keys, l, settings)
        src = torch.remainder(l - tau_l, slots)  # slot of θ_{max(l − δ_l, 0)}
        stale = theta if settings.staleness == 0 else ring[src, chain_idx]
        g = grad_fn(stale, l)
        g = gradients.tempered(g, settings.temperature)
        zeta = rng.normal(noise_keys, l, D, theta.dtype)
        theta, q = euler_step(settings.method, theta, q, g, zeta, h, B)
        if settings.staleness > 0:
            ring[(l + 1) % slots] = theta
    return State(theta, q, ring, state.round + 1)


def oracle_grad_fn(target, keys: torch.Tensor) -> StaleGradFn:
    """∇Ũ of a one-client gradient oracle (the pooled data; ``fedhmc.algorithms.oracles``)
    as a function of positions (S, D) and the step, the minibatches drawn from per-chain
    keys derived from ``keys``, as the FA-HMC engine draws them."""
    if target.num_clients != 1:
        raise ValueError("stale SG-MCMC runs on the pooled data: a one-client target")
    batch_keys = rng.derive(keys, STREAM_STALE_BATCH).view(-1, 1)

    def grad(theta: torch.Tensor, step: int) -> torch.Tensor:
        g, _ = target.grad(theta.unsqueeze(1).clone(), batch_keys, step, False)
        return g[:, 0]

    return grad


def step(seed: int, state: State, target, settings: Settings) -> tuple[State, Info]:
    """``settings.local_steps`` steps of stale SGHMC or SGLD on every chain: Euler steps
    l = r·T … r·T + T − 1 of round r = ``state.round`` (T = ``settings.local_steps``).

    ``seed`` is the run seed (chain s draws from ``chain_keys(seed, S)[s]``); ``target`` a
    one-client [`Target`][fedhmc.models.protocols.Target]: the pooled data's target, or
    ``oracles.from_grad(fn)``. k calls of T steps give exactly the chain of one call of k·T
    steps.
    """
    keys = chain_keys(seed, state.position.shape[0], state.position.device)
    grad = oracle_grad_fn(target, keys)
    if settings.grad_noise > 0:
        exact, noise = grad, gradients.noise_keys(keys)

        def grad(theta: torch.Tensor, l: int) -> torch.Tensor:  # noqa: E741
            return gradients.add_noise(exact(theta, l), noise, l, settings.grad_noise)

    new = _advance(state, grad, settings, keys)
    steps = settings.local_steps * state.position.shape[0]
    return new, Info(steps, bool(torch.isfinite(new.momentum).all()), 1, None)
