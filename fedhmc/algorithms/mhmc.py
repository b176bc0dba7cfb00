"""Metropolis-adjusted HMC on the pooled data: the reference sampler (docs/algorithms.md).

The reference runs S chains at once with full-batch gradients of the pooled energy
f = Σ_c w_c f^(c) (the full-data negative log posterior), K leapfrog steps per proposal and
a Metropolis accept/reject, so its stationary law is the posterior exactly. Each chain
adapts its own step size during warm-up by dual averaging (Hoffman & Gelman 2014, §3.2) to
a target acceptance rate (0.8 by default), then freezes it; during sampling the step size is
jittered uniformly by ±10 % per proposal so that no trajectory length resonates with the
target. Randomness is counter-based ([`fedhmc.core.rng`][fedhmc.core.rng]), keyed by
(seed, chain, iteration).

The diagnostics across chains (rank-normalised split R̂ and bulk ESS) live in
[`fedhmc.analysis.diagnostics`][fedhmc.analysis.diagnostics] and are re-exported here.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch

from fedhmc.analysis.diagnostics import convergence_summary, ess, split_rhat
from fedhmc.core import rng
from fedhmc.core.streams import (
    STREAM_CHAIN,
    STREAM_MHMC_ACCEPT,
    STREAM_MHMC_JITTER,
    STREAM_MHMC_MOMENTUM,
)
from fedhmc.errors import ConfigError

__all__ = [
    "EnergyGrad",
    "Info",
    "Settings",
    "State",
    "ess",
    "init",
    "mhmc",
    "pooled_energy",
    "split_rhat",
    "step",
    "convergence_summary",
]

EnergyGrad = Callable[[torch.Tensor], tuple[torch.Tensor, torch.Tensor]]
"""``energy_grad(theta (S, D)) -> (U (S,), ∇U (S, D))``."""


def pooled_energy(target) -> EnergyGrad:
    """The pooled energy f = Σ_c w_c f^(c) of a fedhmc target, full batch, as an
    [`EnergyGrad`][fedhmc.algorithms.mhmc.EnergyGrad] (for a
    [`DataTarget`][fedhmc.models.targets.DataTarget] this is the sum of the
    NLL over all training points plus the prior's −log density)."""
    full = target.with_batch_size(0)

    def energy_grad(theta: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        w = full.weights.to(theta.dtype)
        S, D = theta.shape
        N = full.num_clients
        keys = torch.zeros(S, N, dtype=torch.int64, device=theta.device)
        g, e = full.grad(theta.unsqueeze(1).expand(S, N, D).clone(), keys, 0, True)
        return (e * w).sum(1), (g * w.view(1, -1, 1)).sum(1)

    return energy_grad


def mhmc(
    energy_grad: EnergyGrad,
    theta0: torch.Tensor,
    num_samples: int,
    *,
    num_warmup: int = 500,
    leapfrog_steps: int = 20,
    step_size: float = 0.05,
    target_accept: float = 0.8,
    seed: int = 0,
    thin: int = 1,
) -> tuple[torch.Tensor, dict]:
    """Metropolis-adjusted HMC with per-chain dual-averaging step sizes.

    Parameters
    ----------
    energy_grad
        U and ∇U at positions (S, D).
    theta0
        Start positions (S, D); S chains.
    num_samples, num_warmup, thin
        Kept draws after warm-up (every ``thin``-th proposal), and warm-up proposals.
    leapfrog_steps, step_size
        K per proposal, and the initial step size of the adaptation.
    target_accept
        Mean acceptance probability the warm-up adapts to.

    Returns
    -------
    (samples, info)
        Samples (num_samples, S, D) and a dict with ``step_size`` (S,), ``accept_rate``
        (mean acceptance probability during sampling), ``accept_rate_per_chain`` and
        ``divergences`` (proposals whose energy error exceeded 1000).
    """
    if num_samples < 1 or num_warmup < 0 or leapfrog_steps < 1 or thin < 1:
        raise ConfigError("mhmc needs num_samples ≥ 1, num_warmup ≥ 0, K ≥ 1 and thin ≥ 1")
    if not 0.0 < target_accept < 1.0 or not step_size > 0:
        raise ConfigError("mhmc needs 0 < target_accept < 1 and step_size > 0")
    samples, adapt, acc_sum, divergences = _mhmc_chains(
        energy_grad,
        theta0,
        seed,
        (num_samples, num_warmup, thin),
        leapfrog_steps,
        step_size,
        target_accept,
    )
    n_prop = num_samples * thin
    info = {
        "step_size": (adapt.log_eps if num_warmup == 0 else adapt.log_eps_bar).exp(),
        "accept_rate": float(acc_sum.mean() / n_prop),
        "accept_rate_per_chain": acc_sum / n_prop,
        "divergences": divergences,
        "leapfrog_steps": leapfrog_steps,
        "target_accept": target_accept,
    }
    return samples, info


def _mhmc_chains(energy_grad, theta0, seed: int, counts: tuple, K: int, step_size, target_accept):
    """mhmc's proposals: ``counts`` = (num_samples, num_warmup, thin). Returns the samples
    (num_samples, S, D), the step-size adaptation (_DualAveraging), the summed acceptance
    probabilities of the sampling proposals (S,) and their divergences."""
    num_samples, num_warmup, thin = counts
    theta = theta0.clone()
    S, D = theta.shape
    dtype, device = theta.dtype, theta.device
    keys = rng.derive(seed, STREAM_CHAIN, torch.arange(S, device=device))
    k_mom, k_acc = rng.derive(keys, STREAM_MHMC_MOMENTUM), rng.derive(keys, STREAM_MHMC_ACCEPT)
    k_jit = rng.derive(keys, STREAM_MHMC_JITTER)
    U, g = energy_grad(theta)
    adapt = _DualAveraging(S, step_size, device)
    samples = torch.empty(num_samples, S, D, dtype=dtype, device=device)
    acc_sum = torch.zeros(S, dtype=torch.float64, device=device)
    divergences, kept = 0, 0
    for it in range(num_warmup + num_samples * thin):
        warm = it < num_warmup
        if warm:
            eps = adapt.log_eps.exp()
        else:
            jitter = 0.9 + 0.2 * rng.uniform(k_jit, it, 1)[:, 0]
            eps = adapt.log_eps_bar.exp() * jitter
        e = eps.to(dtype).view(S, 1)
        theta, U, g, accept_prob, dH = _transition(
            energy_grad, (theta, U, g), e, (k_mom, k_acc), it, K
        )
        divergences += int((dH > 1000).sum()) if not warm else 0
        if warm:
            adapt.update(it, accept_prob, target_accept)
        else:
            acc_sum += accept_prob
            if (it - num_warmup + 1) % thin == 0:
                samples[kept] = theta
                kept += 1
    return samples, adapt, acc_sum, divergences


class _DualAveraging:
    """Per-chain dual averaging of the log step size during warm-up (Hoffman & Gelman 2014,
    Algorithm 5: γ = 0.05, t0 = 10, κ = 0.75): ``log_eps`` is the step size of the next
    warm-up proposal, ``log_eps_bar`` the averaged one that sampling uses."""

    def __init__(self, S: int, step_size: float, device) -> None:
        self.log_eps = torch.full((S,), math.log(step_size), dtype=torch.float64, device=device)
        self.mu = self.log_eps + math.log(10.0)
        self.h_bar = torch.zeros(S, dtype=torch.float64, device=device)
        self.log_eps_bar = torch.zeros(S, dtype=torch.float64, device=device)

    def update(self, it: int, accept_prob: torch.Tensor, target_accept: float) -> None:
        """After warm-up proposal ``it`` (0-based) with acceptance probabilities
        ``accept_prob`` (S,)."""
        m = it + 1
        eta = 1.0 / (m + 10.0)
        self.h_bar = (1 - eta) * self.h_bar + eta * (target_accept - accept_prob)
        self.log_eps = self.mu - math.sqrt(m) / 0.05 * self.h_bar
        w = m ** (-0.75)
        self.log_eps_bar = w * self.log_eps + (1 - w) * self.log_eps_bar


def _transition(energy_grad, current: tuple, e, keys: tuple, it: int, leapfrog_steps: int):
    """One Metropolis-adjusted HMC proposal of every chain from ``current`` = (θ, U, ∇U) at
    step sizes ``e`` (S, 1): returns (θ, U, ∇U, acceptance probability, energy error ΔH),
    θ, U, ∇U after the accept/reject. The momentum and the uniform come from ``keys`` =
    (momentum keys, accept keys) at ``it``."""
    theta, U, g = current
    k_mom, k_acc = keys
    S, D = theta.shape
    p = rng.normal(k_mom, it, D, theta.dtype)
    H0 = U + 0.5 * p.square().sum(-1)
    th, gg = theta, g
    pp = p - 0.5 * e * gg
    for k in range(leapfrog_steps):
        th = th + e * pp
        U1, gg = energy_grad(th)
        if k < leapfrog_steps - 1:
            pp = pp - e * gg
    pp = pp - 0.5 * e * gg
    H1 = U1 + 0.5 * pp.square().sum(-1)
    dH = (H1 - H0).to(torch.float64)
    dH = torch.where(torch.isfinite(dH), dH, torch.full_like(dH, math.inf))
    accept_prob = torch.exp(torch.clamp(-dH, max=0.0))
    u = rng.uniform(k_acc, it, 1)[:, 0]
    accept = u < accept_prob
    theta = torch.where(accept.view(S, 1), th, theta)
    U = torch.where(accept, U1, U)
    g = torch.where(accept.view(S, 1), gg, g)
    return theta, U, g, accept_prob, dH


# ------------------------------------------------------------------ the algorithm API
@dataclass(frozen=True)
class Settings:
    """One HMC transition: the step size (a float, or one per chain, (S,)) and K."""

    step_size: float | torch.Tensor
    leapfrog_steps: int = 20

    def __post_init__(self) -> None:
        if int(self.leapfrog_steps) != self.leapfrog_steps or self.leapfrog_steps < 1:
            raise ConfigError(f"mhmc needs K ≥ 1, got {self.leapfrog_steps}")
        eta = self.step_size
        if not (bool((eta > 0).all()) if isinstance(eta, torch.Tensor) else eta > 0):
            raise ConfigError("mhmc needs step_size > 0")


@dataclass(frozen=True)
class State:
    """The chains (S, D) after ``round`` transitions (calls of ``step``), with their energy
    U (S,) and gradient ∇U (S, D) (None until the first ``step`` evaluates them)."""

    position: torch.Tensor
    energy: torch.Tensor | None = None
    grad: torch.Tensor | None = None
    round: int = 0


@dataclass(frozen=True)
class Info:
    """One transition of every chain.

    Attributes
    ----------
    accept_prob
        Acceptance probabilities (S,).
    delta_h
        The signed energy error ΔH = H(proposal) − H(current) of each chain's proposal (S,)
        (+inf where it is not finite).
    grad_evals
        Full-data gradient evaluations: K per chain.
    finite
        Whether every ΔH is finite.
    clients
        The target's clients: all of them enter the pooled energy Σ_c w_c f^(c).
    energy_error
        The leapfrog's mean |ΔH| per trajectory over the chains.
    """

    accept_prob: torch.Tensor
    delta_h: torch.Tensor
    grad_evals: int
    finite: bool
    clients: int
    energy_error: float | None


def init(position: torch.Tensor, settings: Settings) -> State:
    """The chains at ``position`` (S, D)."""
    return State(position.clone())


def step(seed: int, state: State, target, settings: Settings) -> tuple[State, Info]:
    """One Metropolis-adjusted HMC transition of every chain at a fixed step size on the
    pooled full-batch energy of ``target`` (a [`Target`][fedhmc.models.protocols.Target]:
    a fedhmc target, or ``oracles.from_energy(fn)``); ``seed`` is the run seed. The random
    numbers are those ``mhmc`` draws at the same transition (``state.round``) and seed."""
    energy_grad = pooled_energy(target)
    U, g = state.energy, state.grad
    if U is None or g is None:
        U, g = energy_grad(state.position)
    S = state.position.shape[0]
    keys = rng.derive(seed, STREAM_CHAIN, torch.arange(S, device=state.position.device))
    k_mom, k_acc = rng.derive(keys, STREAM_MHMC_MOMENTUM), rng.derive(keys, STREAM_MHMC_ACCEPT)
    e = torch.as_tensor(
        settings.step_size, dtype=state.position.dtype, device=state.position.device
    )
    e = e.expand(S).reshape(S, 1)
    theta, U, g, accept_prob, dH = _transition(
        energy_grad, (state.position, U, g), e, (k_mom, k_acc), state.round, settings.leapfrog_steps
    )
    info = Info(
        accept_prob,
        dH,
        S * settings.leapfrog_steps,
        finite=bool(torch.isfinite(dH).all()),
        clients=int(target.num_clients),
        energy_error=float(dH.abs().mean()),
    )
    return State(theta, U, g, state.round + 1), info
