"""Debiased FA-HMC (Algorithm B.2 of the FA-HMC paper): FA-HMC with a control variate.

In round r the server sends the average position and, from round 2 on, the previous anchor
θ_a = θ̄_{r−2} with the global gradient there, ∇f(θ_a) = Σ_c w_c ∇f^(c)(θ_a). Client c replaces
every gradient g by g − ∇f^(c)(θ_a) + ∇f(θ_a), and replies with its new position and its local
gradient at the position it was sent, from which the server forms the next round's ∇f(θ_a).
Round 1 has no anchor yet and runs plain FA-HMC (the control variate is zero). This schedule
needs no extra round trip.

The local gradient at the position sent in round r is drawn under the client's round-r anchor
key, so a client that is sent θ_a again in round r + 1 (a stateless client) recomputes exactly
the value it returned.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from fedhmc.algorithms.fahmc import RoundInfo, SamplerSettings, chains_and_seeds, run_round
from fedhmc.core import rng
from fedhmc.core.aggregate import weighted_average


def anchor_keys(client_seeds: torch.Tensor, round_: int, chains: torch.Tensor) -> torch.Tensor:
    """Keys (S, N) of the clients' gradients at the position sent in round ``round_``."""
    private = rng.derive(client_seeds.view(1, -1), round_, chains.view(-1, 1))
    return rng.derive(private, rng.STREAM_ANCHOR)


def anchor_gradients(
    anchor_target,
    theta_bar: torch.Tensor,
    seed: int,
    round_: int,
    chains: torch.Tensor | None = None,
    client_ids: torch.Tensor | None = None,
) -> torch.Tensor:
    """Every client's local gradient ∇f^(c) at the broadcast θ̄ (S, D): (S, N, D).

    ``anchor_target`` is the target at the anchor batch size
    (``target.with_batch_size(b)``; 0 = the full local data). No injected noise, no
    temperature: the control variate corrects ∇f itself.
    """
    S, D = theta_bar.shape
    N = anchor_target.num_clients
    chains, seeds = chains_and_seeds(seed, S, N, theta_bar.device, chains, client_ids)
    keys = anchor_keys(seeds, round_, chains)
    g, _ = anchor_target.grad(theta_bar.unsqueeze(1).expand(S, N, D).clone(), keys, 0, False)
    return g


def client_anchor_gradient(
    anchor_target,
    theta: torch.Tensor,
    seed_of_client: int,
    round_: int,
    chains: torch.Tensor | None = None,
) -> torch.Tensor:
    """One client's local gradient (S, D) at the position sent in round ``round_``."""
    if anchor_target.num_clients != 1:
        raise ValueError("client_anchor_gradient takes a single client's target")
    S, D = theta.shape
    chains = torch.arange(S, device=theta.device) if chains is None else chains
    seeds = torch.tensor([seed_of_client], device=theta.device)
    keys = anchor_keys(seeds, round_, chains)
    g, _ = anchor_target.grad(theta.unsqueeze(1).clone(), keys, 0, False)
    return g[:, 0]


@dataclass
class Anchor:
    """Debiased FA-HMC's state between rounds: the clients' control variates."""

    correction: torch.Tensor
    """(S, N, D): ∇f(θ_a) − ∇f^(c)(θ_a) for every chain and client."""


def debiased_round(
    target,
    anchor_target,
    theta_bar: torch.Tensor,
    anchor: Anchor | None,
    seed: int,
    round_: int,
    settings: SamplerSettings,
) -> tuple[torch.Tensor, Anchor, RoundInfo]:
    """One round of debiased FA-HMC in the batched engine.

    Parameters
    ----------
    target, anchor_target
        The target, and the same target at the anchor batch size.
    theta_bar
        The broadcast θ̄_{r−1}, (S, D).
    anchor
        The state from the previous round (None in round 1: no correction).

    Returns
    -------
    (theta_bar, anchor, info)
        θ̄_r, the state for round r + 1 (anchor θ̄_{r−1}), and the round's info; its
        ``grad_evals`` counts the anchor gradient as one evaluation per client and chain.
    """
    local = anchor_gradients(anchor_target, theta_bar, seed, round_)
    correction = None if anchor is None else anchor.correction
    new_bar, info = run_round(target, theta_bar, seed, round_, settings, correction=correction)
    glob = weighted_average(local, target.weights)
    info.grad_evals += local.shape[0] * local.shape[1]
    return new_bar, Anchor(glob.unsqueeze(1) - local), info


# ------------------------------------------------------------------ the algorithm API
Settings = SamplerSettings
Info = RoundInfo


@dataclass(frozen=True)
class State:
    """Debiased FA-HMC between rounds: θ̄ (S, D) after ``round`` rounds and the clients'
    control variates (None before round 2)."""

    position: torch.Tensor
    round: int = 0
    anchor: Anchor | None = None


def init(position: torch.Tensor, settings: SamplerSettings) -> State:
    """The state before round 1: θ̄ = ``position`` (S, D), no anchor yet."""
    return State(position, 0, None)


def step(
    state: State,
    target,
    settings: SamplerSettings,
    *,
    seed: int,
    anchor_target=None,
) -> tuple[State, RoundInfo]:
    """One round of debiased FA-HMC; ``anchor_target`` is the target at the anchor batch
    size (default: ``target`` itself)."""
    r = state.round + 1
    position, anchor, info = debiased_round(
        target,
        target if anchor_target is None else anchor_target,
        state.position,
        state.anchor,
        seed,
        r,
        settings,
    )
    return State(position, r, anchor), info
