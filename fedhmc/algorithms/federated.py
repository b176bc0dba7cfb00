"""A federated round, written once: the server opens it, the round's clients run, the
server closes it from the replies that arrived.

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
``client_keeps(message, update)``               optional: what each of the round's clients
                                                keeps for its next round (never sent)
``kept_by_client(message, kept)``               optional: what the round's clients kept, as
                                                keyword arguments of ``client_update``,
                                                where it still applies
``step(seed, state, target, settings)``         `step` below: one round, batched
==============================================  ============================================

The round's two halves are written here once: the server's,
[`open_round`][fedhmc.algorithms.federated.open_round] and
[`close_round`][fedhmc.algorithms.federated.close_round], and the clients',
[`run_clients`][fedhmc.algorithms.federated.run_clients]. The engine's `step` calls the
three in a row with every client batched; the Flower ServerApp opens and closes rounds
around its message exchange; a deployed ClientApp runs its one client, and a simulation's
co-located clients run batched in one call.

What a client keeps between rounds (``client_keeps``) is carried the same way on every
path: batched over the clients in a [`ClientStore`][fedhmc.algorithms.federated.ClientStore]
(the engine's, in the State's ``clients`` field, saved in its checkpoint; the co-located
clients' of a Flower simulation), or one client's rows in its Flower node state.

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
    "ClientStore",
    "client_seed",
    "client_seeds",
    "close_round",
    "open_round",
    "private_keys",
    "replied_clients",
    "round_clients",
    "round_seed",
    "run_clients",
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


@dataclass(frozen=True)
class ClientStore:
    """What N clients keep between rounds, batched: each array of the sampler's
    ``client_keeps`` with the N clients on its client axis (axis 1 of an (S, N, …) array,
    axis 0 of an (N,) one), and ``held`` (N,), the clients that have kept anything. A
    client that has not reads zeros in its rows."""

    arrays: dict
    held: torch.Tensor

    def take(self, ids: torch.Tensor | None) -> dict:
        """What the clients ``ids`` (None: all N) kept, as ``kept_by_client`` reads it:
        their rows and their ``held`` mask; {} where none of them kept anything."""
        held = self.held if ids is None else self.held[ids]
        if not bool(held.any()):
            return {}
        out = {k: _rows(v, ids) for k, v in self.arrays.items()}
        return {**out, "held": held}

    def put(self, ids: torch.Tensor | None, keeps: dict) -> ClientStore:
        """This store with the rows of clients ``ids`` (None: all) replaced by ``keeps``."""
        arrays = dict(self.arrays)
        for k, v in keeps.items():
            axis = _client_axis(v)
            old = arrays.get(k)
            if old is None:
                shape = list(v.shape)
                shape[axis] = int(self.held.shape[0])
                old = v.new_zeros(shape)
            arrays[k] = _with_rows(old, ids, v, axis)
        held = self.held.clone()
        held[slice(None) if ids is None else ids] = True
        return ClientStore(arrays, held)

    @staticmethod
    def empty(num_clients: int, device=None) -> ClientStore:
        """A store of ``num_clients`` clients that have kept nothing yet."""
        return ClientStore({}, torch.zeros(num_clients, dtype=torch.bool, device=device))


def _client_axis(x: torch.Tensor) -> int:
    return 1 if x.dim() >= 2 else 0


def _rows(x: torch.Tensor, ids: torch.Tensor | None) -> torch.Tensor:
    if ids is None:
        return x
    return x[:, ids] if _client_axis(x) == 1 else x[ids]


def _with_rows(x: torch.Tensor, ids, rows: torch.Tensor, axis: int) -> torch.Tensor:
    if ids is None:
        return rows.clone()
    x = x.clone()
    if axis == 1:
        x[:, ids] = rows
    else:
        x[ids] = rows
    return x


def open_round(algorithm: ModuleType, seed: int, state, settings, weights):
    """The server's half of a round, first part: the message of the next round of run
    ``seed`` to the clients of weights ``weights`` (N,) (the sampler's ``broadcast``)."""
    return algorithm.broadcast(seed, state, settings, weights)


def run_clients(algorithm: ModuleType, message, target, settings, seeds, kept=None):
    """The clients' half of a round: the round's clients of ``target`` (private ``seeds``
    (M,)), each with what it ``kept`` of its last round (batched over the M clients, as
    `ClientStore.take` gives it; {} or None: nothing). Returns (the update, what each of
    them keeps for its next round: ``client_keeps``, {} for a sampler without)."""
    reads = getattr(algorithm, "kept_by_client", None)
    given = reads(message, kept) if kept and reads is not None else {}
    update = algorithm.client_update(message, target, settings, seeds, **given)
    keeps = getattr(algorithm, "client_keeps", None)
    return update, ({} if keeps is None else keeps(message, update))


def close_round(algorithm: ModuleType, state, settings, message, update, weights, replied=None):
    """The server's half of a round, second part: the new state from the replies that
    arrived.

    ``update`` stacks them in client order (None: none arrived, and the round is skipped);
    ``weights`` (M,) are their weights (n_c or w_c) in the same order, and ``replied`` the
    mask (over ``message.client_ids``, under partial participation) of the drawn clients
    that replied (None: all did). Returns (state, Info), or (state, None) when skipped."""
    if update is None:
        return algorithm.skip(state, settings), None
    combination = algorithm.combination(message, weights, replied)
    return algorithm.server_update(state, update, combination, settings)


def step(algorithm: ModuleType, seed: int, state, target, settings):
    """One round of ``algorithm`` with every client and chain batched (the engine): the
    server opens it, the round's clients run with what they kept (the State's ``clients``
    store), the server closes it."""
    message = open_round(algorithm, seed, state, settings, target.weights)
    computing, seeds = round_clients(seed, message, target)
    store = getattr(state, "clients", None)
    kept = None if store is None else store.take(message.client_ids)
    update, keeps = run_clients(algorithm, message, computing, settings, seeds, kept)
    new, info = close_round(algorithm, state, settings, message, update, target.weights)
    if keeps and "clients" not in getattr(type(new), "__dataclass_fields__", {}):
        raise TypeError(
            f"{algorithm.__name__}: its clients keep {sorted(keeps)} between rounds, so its "
            "State needs a field `clients: federated.ClientStore | None = None`"
        )
    if keeps:
        if store is None:
            store = ClientStore.empty(target.num_clients, message.position.device)
        store = store.put(message.client_ids, keeps)
    if store is not None:  # (a round that keeps nothing new keeps what was kept)
        new = dataclasses.replace(new, clients=store)
    return new, info
