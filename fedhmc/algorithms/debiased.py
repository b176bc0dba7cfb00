"""Debiased FA-HMC (Algorithm B.2 of the FA-HMC paper): FA-HMC with a control variate.

In round r the server sends the average position and, from round 2 on, the previous anchor
θ_a = θ̄ of round r − 2 with the global gradient there, ∇f(θ_a) = Σ_c w_c ∇f^(c)(θ_a). Client c
replaces every gradient g by g − ∇f^(c)(θ_a) + ∇f(θ_a), and replies with its new position and
its local gradient at the position it was sent, from which the server forms the next round's
∇f(θ_a). Round 1 has no anchor yet and runs plain FA-HMC (the control variate is zero). This
schedule needs no extra round trip.

The local gradient at the position sent in round r is drawn under the client's round-r anchor
key, so a client that is sent θ_a again in round r + 1 (a stateless client) recomputes exactly
the value it returned. A client keeps its local gradient with its round (``client_keeps``),
so that it need not recompute it when that round's θ̄ becomes the anchor.

The interface is FA-HMC's (``fedhmc.algorithms.fahmc``): ``init``, ``broadcast``,
``client_update``, ``server_update`` and ``step``, with the same Broadcast, ClientUpdate and
Info types.
"""

from __future__ import annotations

import dataclasses
import sys
from dataclasses import dataclass

import torch

from fedhmc.algorithms import api, fahmc, federated
from fedhmc.algorithms.fahmc import (
    Broadcast,
    ClientUpdate,
    Coefficients,
    Info,
    Layout,
    Weights,
    average,
    combination,
    skip,
)
from fedhmc.core import rng
from fedhmc.core.streams import STREAM_ANCHOR

__all__ = [
    "Broadcast",
    "ClientUpdate",
    "Info",
    "Settings",
    "State",
    "anchor_gradient",
    "broadcast",
    "client_update",
    "combination",
    "init",
    "client_keeps",
    "kept_by_client",
    "layout",
    "server_update",
    "skip",
    "step",
]


NO_PARTIAL_REASON = " (debiased FA-HMC needs every client's gradient at its anchor)"
"""Why ``--clients-per-round`` does not apply."""


@dataclass(frozen=True)
class Settings(fahmc.Settings):
    """FA-HMC's settings and the minibatch of the anchor gradients (its registry entry fixes
    the trajectory options and full participation: every client's gradient at the anchor is
    needed)."""

    anchor_batch_size: int = api.option(
        0, "the minibatch of each client's gradient at the anchor (0: its full local data)", low=0
    )


def anchor_keys(client_seeds: torch.Tensor, round_: int, chains: torch.Tensor) -> torch.Tensor:
    """Keys (S, M) of the clients' gradients at the position sent in round ``round_``."""
    private = rng.derive(client_seeds.view(1, -1), round_, chains.view(-1, 1))
    return rng.derive(private, STREAM_ANCHOR)


def anchor_gradient(
    target, position: torch.Tensor, seeds: torch.Tensor, round_: int, settings: Settings
) -> torch.Tensor:
    """The local gradients ∇f^(c) (S, M, D) of the clients of ``target`` at the position
    (S, D) sent in round ``round_``, at the anchor batch size."""
    S, D = position.shape
    M = target.num_clients
    anchor_target = target.with_batch_size(settings.anchor_batch_size)
    chains = torch.arange(S, device=position.device)
    keys = anchor_keys(seeds.to(position.device), round_, chains)
    g, _ = anchor_target.grad(position.unsqueeze(1).expand(S, M, D).clone(), keys, 0, False)
    return g


MESSAGE = {"theta": "position", "anchor": "anchor_position", "anchor-grad": "anchor_grad"}
"""The arrays of a round's message by their wire names: wire name → ``Broadcast`` field."""

MESSAGE_VALUES = {"anchor-round": "anchor_round"}
"""The scalars of a round's message: wire name → ``Broadcast`` field."""

REPLY = {"theta": "position", "grad": "local_grad"}
"""The arrays of a client's reply by their wire names: wire name → ``ClientUpdate`` field."""


@dataclass(frozen=True)
class State:
    """Debiased FA-HMC between rounds: θ̄ (S, D) after ``round`` rounds and, from round 2
    on, the anchor: the round ``anchor_round`` in which θ_a was sent, θ_a (S, D), the
    global gradient ∇f(θ_a) (S, D); on the engine, what its clients keep (``clients``:
    their local gradients at θ_a)."""

    position: torch.Tensor
    round: int = 0
    anchor_round: int | None = None
    anchor_position: torch.Tensor | None = None
    anchor_grad: torch.Tensor | None = None
    clients: federated.ClientStore | None = None


def init(position: torch.Tensor, settings: Settings) -> State:
    """The state before round 1: θ̄ = ``position`` (S, D), no anchor yet."""
    return State(position, 0)


def broadcast(
    seed: int, state: State, settings: Settings, weights: torch.Tensor | None = None
) -> Broadcast:
    """FA-HMC's message plus the anchor θ_a and ∇f(θ_a) from round 2 on. Every client
    takes part in every round (the anchor needs every client's gradient), so ``weights``,
    which FA-HMC's ``broadcast`` draws a round's clients from, is not used."""
    r = state.round + 1
    return Broadcast(
        round=r,
        round_seed=federated.round_seed(seed, r),
        position=state.position,
        anchor_round=state.anchor_round,
        anchor_position=state.anchor_position,
        anchor_grad=state.anchor_grad,
    )


def layout(settings: Settings, round_: int) -> Layout:
    """θ̄ down, with θ_a and ∇f(θ_a) from round 2 on; each client's position and its local
    gradient up."""
    down = ("position", "anchor_position", "anchor_grad") if round_ > 1 else ("position",)
    return Layout(down, ("position", "local_grad"))


def client_update(
    message: Broadcast,
    target,
    settings: Settings,
    seeds: torch.Tensor,
    *,
    anchor_local: torch.Tensor | None = None,
) -> ClientUpdate:
    """The clients' round: FA-HMC with the control variate ∇f(θ_a) − ∇f^(c)(θ_a), and each
    client's local gradient at the θ̄ it was sent (``local_grad``).

    ``anchor_local`` is the clients' own ∇f^(c)(θ_a) (S, M, D) when they kept it from the
    previous round; otherwise it is recomputed (the same value, under the anchor round's
    key). Its evaluation is counted once per client and chain, as if kept.
    """
    correction = None
    if message.anchor_position is not None:
        if anchor_local is None:
            anchor_local = anchor_gradient(
                target, message.anchor_position, seeds, message.anchor_round, settings
            )
        correction = message.anchor_grad.unsqueeze(1) - anchor_local
    local = anchor_gradient(target, message.position, seeds, message.round, settings)
    update = fahmc.client_update(message, target, settings, seeds, correction=correction)
    return dataclasses.replace(
        update,
        grad_evals=update.grad_evals + local.shape[0] * local.shape[1],
        local_grad=local,
    )


def server_update(
    state: State, update: ClientUpdate, how: Weights | Coefficients, settings: Settings
) -> tuple[State, Info]:
    """FA-HMC's average; the θ̄ just sent becomes the anchor, with ∇f there the average of
    the clients' local gradients, combined as the positions are."""
    plain = fahmc.State(state.position, state.round)
    new, info = fahmc.server_update(plain, update, how, settings)
    return State(
        new.position,
        new.round,
        anchor_round=new.round,
        anchor_position=state.position,
        anchor_grad=average(update.local_grad, how),
    ), info


def client_keeps(message: Broadcast, update: ClientUpdate) -> dict:
    """What each client keeps of its round for the next: its local gradient at the θ̄ it
    was sent (the next round's anchor, if all goes well) and that round."""
    grad = update.local_grad
    rounds = grad.new_full((grad.shape[1],), message.round, dtype=torch.int64)
    return {"anchor_round": rounds, "anchor_local": grad}


def kept_by_client(message: Broadcast, kept: dict) -> dict:
    """The clients' local gradients at θ_a where every one of them kept its own of the
    round that sent θ_a: the values they would recompute (else they recompute them)."""
    if message.anchor_position is None:
        return {}
    valid = kept["held"] & (kept["anchor_round"] == message.anchor_round)
    return {"anchor_local": kept["anchor_local"]} if bool(valid.all()) else {}


def step(seed: int, state: State, target, settings: Settings) -> tuple[State, Info]:
    """One round of debiased FA-HMC, every client and chain batched (``seed``: the run's)."""
    return federated.step(sys.modules[__name__], seed, state, target, settings)
