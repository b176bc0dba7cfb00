"""DG-LMC: distributed Gibbs Langevin Monte Carlo (Plassier, Vono, Durmus and Moulines,
ICML 2021).

Each client c keeps an auxiliary copy z_c of the parameters between rounds. The chain
samples the augmented target, with the coupling ρ > 0,

    π_ρ(θ, z_1 … z_N) ∝ exp(−Σ_c [U_c(z_c) + ‖z_c − θ‖² / (2ρ)]),

U_c = w_c f^(c) client c's share of the energy. In round k:

1. the server draws θ_k from its exact conditional N(z̄, (ρ/N) I), z̄ = (1/N) Σ_c z_c the
   mean of the copies it last received (before round 1: every z_c = θ₀, the chain's
   start), and sends it (in round 1 with θ₀, from which each client starts its copy);
2. client c runs L Langevin steps on its conditional,
   z_c ← z_c − γ [Ĥ_c(z_c) + (z_c − θ_k)/ρ] + √(2γ) ξ, Ĥ_c = w_c ∇f̃^(c) its minibatch
   estimate of ∇U_c (minibatch l at step l), and sends z_c; it keeps z_c for its next round;
3. the server stores the copies; the run's samples are the θ_k.

On Gaussian clients exact Gibbs (γ → 0) has the θ-marginal N(m_ρ, P_ρ⁻¹),
P_ρ = Σ_c (A_c⁻¹ + ρI)⁻¹, m_ρ = P_ρ⁻¹ Σ_c (A_c⁻¹ + ρI)⁻¹ μ_c; ρ → 0 gives the posterior.

Every client takes part in every round: DG-LMC declares no ``clients_per_round``, so
``--clients-per-round`` is refused. A client whose reply does not arrive keeps its copy
on the server as last received. A client process that holds no copy (its node lost its
state) starts from θ₀ in round 1 and from θ_k after it.

Randomness (``fedhmc.core.rng``): client c's private key in round r for chain s is
``derive(client_seed, r, s)``, its minibatch and noise keys folded out of it; the server's
draw of θ comes from the round seed, so every backend draws the same chain.

Pure PyTorch: no Flower import.
"""

from __future__ import annotations

import dataclasses
import math
import sys
from dataclasses import dataclass

import torch

from fedhmc.algorithms import api, federated
from fedhmc.algorithms.fahmc import Info  # (a round's Info: the federated samplers' one)
from fedhmc.algorithms.federated import Layout
from fedhmc.core import rng
from fedhmc.core.streams import STREAM_DGLMC_NOISE, STREAM_DGLMC_THETA, STREAM_MINIBATCH


@dataclass(frozen=True)
class Settings(api.Settings):
    """DG-LMC's settings.

    Attributes
    ----------
    step_size
        γ, the clients' Langevin step.
    local_steps
        L, the Langevin steps of a client per round.
    coupling
        ρ, the variance that ties each client's copy z_c to θ. The default 0.01 keeps the
        bias small (a client's covariance A_c⁻¹ grows by ρ: on the data presets, whose
        prior variance is 1, that is a fraction of a per cent to a few per cent of a
        client's posterior variance) and the local steps stable on every preset (they need
        γ (λ_max(A_c) + 1/ρ) < 2, and the Euler default γ = η²/2 is at most 2·10⁻⁴ ≪ ρ).
    """

    LANGEVIN_STEP = True
    step_size: float | None = api.option(
        None,
        "γ, the clients' Langevin step: z_c ← z_c − γ [Ĥ_c + (z_c − θ)/ρ] + √(2γ) ξ (default: "
        "η²/2 of the dataset's η)",
        low=0,
        low_open=True,
    )
    local_steps: int = api.option(10, "L, the Langevin steps of a client per round", low=1)
    coupling: float = api.option(
        0.01, "ρ, DG-LMC's coupling: θ ~ N(z̄, ρ/N) ties the clients' copies z_c", low=0,
        low_open=True,
    )  # fmt: skip

    def check(self) -> str | None:
        if self.step_size is not None and self.step_size >= 2 * self.coupling:
            return (
                f"--step-size {self.step_size:g} must be below 2 × --coupling "
                f"({2 * self.coupling:g}): the clients' steps diverge otherwise"
            )
        return None


@dataclass(frozen=True)
class Broadcast:
    """The server's message of round ``round``.

    Attributes
    ----------
    position
        θ_k (S, D), drawn from N(z̄, ρ/N).
    start
        θ₀ (S, D) in round 1 (each client's first copy), else None.
    client_ids
        Always None: every client takes part.
    num_clients
        N (the server's: not sent).
    """

    round: int
    round_seed: int
    position: torch.Tensor
    start: torch.Tensor | None = None
    client_ids: torch.Tensor | None = None
    num_clients: int = 0


MESSAGE = {"theta": "position", "start": "start"}
"""The arrays of a round's message by their wire names."""


@dataclass(frozen=True)
class ClientUpdate:
    """The clients' side of a round, M clients stacked: their copies z_c (S, M, D) after
    the L steps (sent, and kept)."""

    z: torch.Tensor
    energy: torch.Tensor | None = None
    energy_error: torch.Tensor | None = None
    grad_evals: int = 0


REPLY = {"z": "z"}
"""The arrays of a client's reply by their wire names."""


@dataclass(frozen=True)
class State:
    """The server's state after ``round`` rounds: θ_k (S, D), the run's sample, and the
    clients' copies z_c (S, N, D) as last received (None before any arrived: every copy is
    then θ₀, which ``position`` still is); on the engine, what its clients keep
    (``clients``: their own copies)."""

    position: torch.Tensor
    round: int = 0
    z: torch.Tensor | None = None
    clients: federated.ClientStore | None = None


@dataclass(frozen=True)
class CopiesArrived:
    """How a round's replies combine: the clients (ids among N) whose z_c arrived, in the
    replies' order, N, and the round's θ."""

    clients: torch.Tensor
    num_clients: int
    theta: torch.Tensor


def init(position: torch.Tensor, settings: Settings) -> State:
    """The state before round 1: θ = ``position`` (S, D), every copy θ₀."""
    return State(position)


def _mean_copy(state: State) -> torch.Tensor:
    """z̄ (S, D): the mean of the copies, θ₀ before any arrived."""
    return state.position if state.z is None else state.z.mean(dim=1)


def broadcast(seed: int, state: State, settings: Settings, weights: torch.Tensor) -> Broadcast:
    """Round ``state.round + 1``'s message: θ ~ N(z̄, (ρ/N) I), drawn with the round
    seed's keys, and θ₀ in round 1."""
    r = state.round + 1
    N = int(weights.shape[0])
    zbar = _mean_copy(state)
    S, D = zbar.shape
    round_seed = federated.round_seed(seed, r)
    chains = torch.arange(S, device=zbar.device)
    xi = rng.normal(rng.derive(round_seed, STREAM_DGLMC_THETA, chains), 0, D, zbar.dtype)
    theta = zbar + math.sqrt(settings.coupling / N) * xi.to(zbar.device)
    return Broadcast(
        round=r,
        round_seed=round_seed,
        position=theta,
        start=state.position if r == 1 else None,
        num_clients=N,
    )


def layout(settings: Settings, round_: int) -> Layout:
    """θ_k down (with θ₀ in round 1); each client's z_c up."""
    down = ("position", "start") if round_ == 1 else ("position",)
    return Layout(down, ("z",))


def client_update(
    message: Broadcast,
    target,
    settings: Settings,
    seeds: torch.Tensor,
    *,
    z: torch.Tensor | None = None,
) -> ClientUpdate:
    """L Langevin steps of each client of ``target`` on its conditional given θ_k:
    z_c ← z_c − γ [w_c ∇f̃^(c)(z_c) + (z_c − θ_k)/ρ] + √(2γ) ξ.

    ``z`` (S, M, D) are the copies the clients kept (None: their first round, from the
    message's θ₀, or θ_k where the message has none)."""
    theta = message.position
    S, D = theta.shape
    M = int(seeds.shape[0])
    if z is None:
        base = message.start if message.start is not None else theta
        z = base.unsqueeze(1).expand(S, M, D).clone()
    keys = federated.private_keys(seeds, message.round, S, message.position.device)
    batch = rng.derive(keys, STREAM_MINIBATCH)
    noise = rng.derive(keys, STREAM_DGLMC_NOISE)
    weights = target.weights.to(theta.dtype).view(1, M, 1)
    gamma, rho = settings.step_size, settings.coupling
    scale = math.sqrt(2 * gamma)
    anchor = theta.unsqueeze(1)
    for step_ in range(settings.local_steps):
        g, _ = target.grad(z.clone(), batch, step_, False)
        xi = rng.normal(noise, step_, D, theta.dtype).to(theta.device)
        z = z - gamma * (weights * g + (z - anchor) / rho) + scale * xi
    return ClientUpdate(z=z, grad_evals=settings.local_steps * S * M)


def combination(message: Broadcast, weights, replied: torch.Tensor | None = None) -> CopiesArrived:
    """The clients whose z_c arrived (``replied``: their mask over the N clients, None:
    all), in the replies' order."""
    ids = federated.replied_clients(message, message.num_clients, replied)
    return CopiesArrived(ids, message.num_clients, message.position)


def server_update(
    state: State, update: ClientUpdate, how: CopiesArrived, settings: Settings
) -> tuple[State, Info]:
    """θ_k becomes the state's sample; the copies that arrived replace the server's (the
    others stay as last received)."""
    theta = how.theta
    S, D = theta.shape
    if state.z is None:  # no copy arrived yet: each is θ₀, the state's position still
        z = state.position.unsqueeze(1).expand(S, how.num_clients, D).clone()
    else:
        z = state.z.clone()
    z[:, how.clients] = update.z
    finite = bool(torch.isfinite(theta).all()) and bool(torch.isfinite(z).all())
    new = State(theta, state.round + 1, z)
    return new, Info(int(update.grad_evals), finite, int(how.clients.shape[0]))


def skip(state: State, settings: Settings) -> State:
    """A round with no reply: θ and the copies stay, the round counter moves on."""
    return dataclasses.replace(state, round=state.round + 1)


def client_keeps(message: Broadcast, update: ClientUpdate) -> dict:
    """What each client keeps of its round: its copy z_c."""
    return {"z": update.z}


def kept_by_client(message: Broadcast, kept: dict) -> dict:
    """The clients' copies z_c, except in round 1 (a new run: they start from θ₀); a client
    that kept none starts from θ_k."""
    if message.start is not None or "z" not in kept:
        return {}
    held = kept["held"].view(1, -1, 1)
    return {"z": torch.where(held, kept["z"], message.position.unsqueeze(1))}


def resumes_on_flower(settings: Settings) -> bool:
    """A run does not resume on new Flower nodes: the clients' copies z_c are theirs."""
    return False


def step(seed: int, state: State, target, settings: Settings) -> tuple[State, Info]:
    """One round, every client and chain batched (``seed``: the run's)."""
    return federated.step(sys.modules[__name__], seed, state, target, settings)
