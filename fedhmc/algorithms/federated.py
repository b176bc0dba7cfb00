"""A federated round, composed once: ``broadcast → client_update → server_update``.

A federated sampler is a module with these functions (FA-HMC's, ``fedhmc.algorithms.fahmc``,
is the model; debiased FA-HMC's adds its anchor):

==============================================  ============================================
``init(position, settings)``                    the state before round 1
``broadcast(seed, state, settings, weights)``   the server's message of the next round
``client_update(message, target, settings,      the round of the clients of ``target``
seeds, **kept)``
``server_update(state, update, combination,     the new state and the round's Info
settings)``
``combination(message, weights, replied)``      how the replies combine: `Weights` or
                                                `Coefficients` (the rule for failed clients)
``skip(state, settings)``                       a round in which no reply arrived
``layout(settings, round_)``                    the arrays of the round's message and replies
``kept_by_server(state, message)``              what the round's batched clients kept, as
                                                the state holds it (keyword arguments of
                                                ``client_update``)
``client_keeps(message, update)``               what one client process keeps of a round
``kept_by_client(message, kept)``               what it kept of its last round, as keyword
                                                arguments of ``client_update``, where it
                                                still applies
``step(seed, state, target, settings)``         ``step`` below, the three in a row
==============================================  ============================================

The engine's ``step`` ([`step`][fedhmc.algorithms.federated.step]), the Flower ServerApp
(its replies in place of the batched clients: [`finish`][fedhmc.algorithms.federated.finish])
and the ClientApp (``client_update`` on its own data) all compose these same functions; a
new federated sampler is its module and its registry entry.

Pure PyTorch: no Flower import.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from types import ModuleType

import torch

from fedhmc.core import rng
from fedhmc.core.streams import STREAM_CLIENT, STREAM_ROUND

__all__ = [
    "Coefficients",
    "Layout",
    "Weights",
    "client_seed",
    "client_seeds",
    "finish",
    "round_clients",
    "private_keys",
    "replied_clients",
    "round_seed",
    "stack_updates",
    "step",
]


@dataclass(frozen=True)
class Weights:
    """Relative weights (M,) of the clients that replied (n_c or w_c): the average is
    Σ_c w_c θ^(c) / Σ_c w_c over them, so a client that failed drops out of it."""

    values: torch.Tensor


@dataclass(frozen=True)
class Coefficients:
    """The round's coefficients a_c (M,) of the clients that replied, used as given:
    Σ_c a_c θ^(c) (partial participation fixes them, rescaled over the clients that
    replied by ``fedhmc.core.participation.renormalized``)."""

    values: torch.Tensor


@dataclass(frozen=True)
class Layout:
    """The arrays of one round's messages, each (S, D) per client.

    Attributes
    ----------
    down
        The Broadcast fields the server sends every drawn client (``position`` first).
    up
        The ClientUpdate fields each client replies with (``position`` first).
    """

    down: tuple[str, ...]
    up: tuple[str, ...]

    def bytes(self, clients: int, chains: int, dim: int, itemsize: int) -> tuple[int, int]:
        """(down, up) bytes of arrays in a round of ``clients`` clients."""
        per_array = clients * chains * dim * itemsize
        return len(self.down) * per_array, len(self.up) * per_array


def stack_updates(updates: list):
    """Single clients' updates (M = 1 each, one sampler's ``ClientUpdate``) stacked in the
    order given, as the batched engine computes them together: each tensor field joined
    along the clients' axis (None where any update lacks it), each integer summed (the
    Flower ServerApp stacks its replies this way)."""
    first = updates[0]
    out = {}
    for f in dataclasses.fields(first):
        xs = [getattr(u, f.name) for u in updates]
        if all(isinstance(x, torch.Tensor) for x in xs):
            out[f.name] = torch.cat(xs, dim=1)
        elif all(isinstance(x, int) and not isinstance(x, bool) for x in xs):
            out[f.name] = sum(xs)
        else:
            out[f.name] = None if any(x is None for x in xs) else xs[0]
    return type(first)(**out)


def private_keys(seeds: torch.Tensor, round_: int, chains: int, device) -> torch.Tensor:
    """The private keys (S, M) of clients with private ``seeds`` (M,) in round ``round_``,
    one per chain: ``derive(client_seed, round, chain)``, as FA-HMC's ``round_keys``."""
    c = torch.arange(chains, device=device)
    return rng.derive(seeds.to(device).view(1, -1), round_, c.view(-1, 1))


def replied_clients(message, num_clients: int, replied) -> torch.Tensor:
    """The ids (among N) of a round's clients whose replies arrived, in the replies' order:
    ``message.client_ids`` (the drawn ones) or every client, masked by ``replied`` (None:
    all replied)."""
    ids = message.client_ids
    if ids is None:
        ids = torch.arange(num_clients, device=message.position.device)
    return ids if replied is None else ids[replied.to(ids.device)]


def round_seed(seed: int, round_: int) -> int:
    """The seed the server broadcasts in round ``round_`` of run ``seed`` (the shared
    momentum's)."""
    return rng.derive_int(seed, STREAM_ROUND, round_)


def client_seed(seed: int, client: int) -> int:
    """Client ``client``'s private seed in run ``seed`` (never sent over the network)."""
    return rng.derive_int(seed, STREAM_CLIENT, client)


def client_seeds(seed: int, clients, device=None) -> torch.Tensor:
    """The private seeds (N,) of clients ``clients`` (a count N: clients 0 … N−1, or their
    ids): client c's is ``client_seed(seed, c)``, so a subset of clients draws what they
    draw among all."""
    if isinstance(clients, int):
        ids = range(clients)
    elif isinstance(clients, torch.Tensor):
        ids = clients.tolist()  # one transfer, not one per client
    else:
        ids = [int(c) for c in clients]
    return torch.tensor([client_seed(seed, c) for c in ids], dtype=torch.int64, device=device)


def round_clients(seed: int, message, target):
    """(target, private seeds) of the clients that compute ``message``'s round of run
    ``seed``: all of ``target``'s, or under partial participation only the drawn ones, so
    that idle clients compute nothing: ``target.round_view(ids)`` where the target has one
    (the built-in targets: one view per number of drawn clients, refilled in place, so
    that a CUDA graph replays its rounds), else ``target.subset(ids)``."""
    device = message.position.device
    if message.client_ids is None:
        return target, client_seeds(seed, target.num_clients, device)
    ids = message.client_ids.tolist()  # one transfer, for the view and the seeds
    view = getattr(target, "round_view", None)
    computing = view(ids) if view is not None else target.subset(ids)
    return computing, client_seeds(seed, ids, device)


def finish(algorithm: ModuleType, state, settings, message, update, weights, replied=None):
    """The server's side of a round from the replies that arrived.

    ``update`` stacks them in client order (None: none arrived, and the round is skipped);
    ``weights`` (M,) are their weights (n_c or w_c) in the same order, and ``replied`` the
    mask (over ``message.client_ids``, under partial participation) of the drawn clients
    that replied (None: all did). Returns (state, Info), or (state, None) when skipped."""
    if update is None:
        return algorithm.skip(state, settings), None
    combination = algorithm.combination(message, weights, replied)
    return algorithm.server_update(state, update, combination, settings)


def step(algorithm: ModuleType, seed: int, state, target, settings):
    """One round of ``algorithm`` with every client and chain batched (the engine):
    ``broadcast``, ``client_update`` of the round's clients, ``server_update``."""
    message = algorithm.broadcast(seed, state, settings, target.weights)
    computing, seeds = round_clients(seed, message, target)
    update = algorithm.client_update(
        message, computing, settings, seeds, **algorithm.kept_by_server(state, message)
    )
    return finish(algorithm, state, settings, message, update, target.weights)
