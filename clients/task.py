"""A client's side of a federated round, free of Flower types: load a partition, run the
round.

A client loads its own partition once per process (cached), and each round runs the
clients' half of the round (`fedhmc.algorithms.federated.run_clients`: its sampler's
``client_update`` with what it kept), the function the batched engine's ``step`` runs for
all clients at once. It never sends its data or its private seed.

Everything is computed on the client's device (``cfg.device``, from
`fedhmc_clients.compute.client_device`): its target is built there and the round's
message decoded there; what goes back on the wire is brought to the CPU first.
"""

from __future__ import annotations

import dataclasses

import torch

from fedhmc.algorithms.api import KEPT
from fedhmc.algorithms.federated import (
    ClientStore,
    client_seed,
    round_clients,
    round_seed,
    run_clients,
)
from fedhmc.runtime import wire
from fedhmc.runtime.config import ResolvedConfig, RunConfig
from fedhmc.runtime.problem import build_client_target, torch_dtype
from fedhmc.runtime.threads import apply_threads, round_work

_TARGETS: dict[tuple, tuple] = {}


def client_config(run_config: dict) -> ResolvedConfig:
    """The run config (pyproject [tool.flwr.app.config] plus --run-config), resolved."""
    keys = set(RunConfig.keys())
    return RunConfig.from_mapping({k: v for k, v in run_config.items() if k in keys}).resolve()


def _target_key(cfg: RunConfig, partition_id: int, num_total: int | None) -> tuple:
    """Everything a client's target depends on."""
    return (
        cfg.dataset,
        cfg.data_sha256,
        cfg.model,
        cfg.model_arg,
        cfg.model_batching,
        cfg.compile,
        cfg.hidden,
        cfg.num_clients,
        cfg.partition,
        cfg.dirichlet_alpha,
        cfg.min_client_size,
        cfg.classes_per_client,
        cfg.quantity_sigma,
        cfg.dim,
        cfg.data_dir,
        cfg.scaling,
        cfg.seed,
        cfg.batch_size,
        cfg.minibatch,
        cfg.prior_std,
        cfg.dtype,
        cfg.device,
        partition_id,
        num_total,
    )


def partition_target(cfg: RunConfig, partition_id: int, num_total: int | None = None):
    """(target, n_c) of this client, loaded once per process for the same settings."""
    key = _target_key(cfg, partition_id, num_total)
    if key not in _TARGETS:
        _TARGETS[key] = build_client_target(cfg, partition_id, num_total, device=cfg.device)
    return _TARGETS[key]


def moved(obj, device):
    """A dataclass (a ClientUpdate) with its tensors on ``device``."""
    tensors = {
        f.name: v.to(device)
        for f in dataclasses.fields(obj)
        if isinstance(v := getattr(obj, f.name), torch.Tensor)
    }
    return dataclasses.replace(obj, **tensors)


def _reply(update, up: tuple[str, ...], algorithm, c: int, n_c: int) -> tuple[dict, dict]:
    """Client ``c``'s reply from an update of M clients (on the CPU: `moved`): its arrays
    (the layout's ``up``: positions, and the momentum or the local gradient where the
    algorithm sends them), and its n_c, gradient evaluations and health numbers."""
    M = int(getattr(update, up[0]).shape[1])
    total = int(update.grad_evals)  # (summed over the M clients, which may differ: QLSD's
    # clients that recompute a reference gradient; the first ones take the remainder, so
    # that the replies sum to the batch's count)
    values = {"num-examples": n_c, "grad-evals": total // M + (c < total % M)}
    if update.energy is not None:
        values["energy"] = float(update.energy[:, c].max())
    if update.energy_error is not None:
        values["energy-error"] = float(update.energy_error[:, c].mean())
    return wire.encode_reply(update, up, algorithm, c), values


def kept_from(arrays: dict, device) -> dict:
    """What this client kept, from the ``KEPT`` arrays of its message (its node state's),
    as `fedhmc.algorithms.federated.run_clients` reads it: its rows (M = 1) on ``device``
    and ``held``; {} where it kept nothing."""
    out = {
        key[len(KEPT) :]: torch.as_tensor(value, device=device)
        for key, value in arrays.items()
        if key.startswith(KEPT)
    }
    if out:
        out["held"] = torch.ones(1, dtype=torch.bool, device=device)
    return out


def kept_arrays(keeps: dict, c: int) -> dict:
    """Client ``c``'s rows of what the round's clients keep (``client_keeps``: (S, M, …)
    or (M,) tensors) as the reply's ``KEPT`` arrays (numpy, on the CPU), for its node
    state."""
    out = {}
    for key, value in keeps.items():
        rows = value[:, c : c + 1] if value.dim() >= 2 else value[c : c + 1]
        out[KEPT + key] = rows.detach().cpu().numpy()
    return out


def local_update(
    cfg: RunConfig, partition_id: int, config: dict, arrays: dict, private_seed: int | None
) -> tuple[dict, dict]:
    """One round of this client alone: the clients' half of the round
    (`fedhmc.algorithms.federated.run_clients`) on its own data.

    Parameters
    ----------
    cfg
        The client's resolved run config (data settings).
    partition_id
        This client's partition.
    config, arrays
        The round's message: its settings (round, round seed, n, the sampler settings) and
        arrays (θ̄ (S, D) and what the round carries), as ``fedhmc.runtime.wire`` encodes
        them, with what this client kept of its last round (``KEPT`` arrays, from its
        node state).
    private_seed
        The client's own seed; by default derived from the run seed and the partition id,
        which reproduces the in-process engine.

    Returns
    -------
    tuple
        The reply (``_reply``): its arrays (new positions (S, D) of the run's dtype, and what
        else the algorithm's layout sends up; and the ``KEPT`` arrays, for the node state)
        and its values (n_c, gradient evaluations, the energy and the mean |ΔH| per
        leapfrog trajectory over the chains).
    """
    # Every sampler setting travels in the round's settings: the server is authoritative.
    cfg = wire.apply_data(cfg, config)
    target, n_c = partition_target(cfg, partition_id, int(config["num-examples-total"]))
    settings = wire.decode_sampler(config)
    message = wire.decode_message(config, arrays, torch_dtype(cfg), cfg.device)
    seed = client_seed(cfg.seed, partition_id) if private_seed is None else int(private_seed)
    seeds = torch.tensor([seed], device=cfg.device)
    algorithm = wire.algorithm_entry(config).module
    kept = kept_from(arrays, cfg.device)
    update, keeps = run_clients(algorithm, message, target, settings, seeds, kept)
    up = algorithm.layout(settings, message.round).up
    out, values = _reply(moved(update, "cpu"), up, algorithm, 0, n_c)
    return {**out, **kept_arrays(keeps, 0)}, values


# A simulation's co-located clients: the last round computed for all of them at once
# ("round"), and what they keep between rounds, batched ("store").
_COLOCATED: dict = {}


def colocated_update(cfg: RunConfig, partition_id: int, config: dict, arrays: dict):
    """``local_update`` for a client of a Flower simulation, whose clients all live in this
    process: the first message of a round runs the clients' half of the round for every
    one of its clients in one batch, each with what it kept (batched in this process), and
    the round's other messages take their own rows. Each client's numbers are those of
    ``local_update`` (the batched engine's; its gradient evaluations are the batch's, shared
    out so that the replies sum alike); the messages, replies and failures stay per client,
    and each client's node state gets its rows of what it keeps. Returns None where it does
    not apply, and the caller computes alone: another round seed than the run's, or clients
    whose kept state is in their node states and not in this process (a new process).
    """
    cfg = wire.apply_data(cfg, config)
    round_ = int(config["round"])
    if int(config["round-seed"]) != round_seed(cfg.seed, round_):
        return None
    settings = wire.decode_sampler(config)
    algorithm = wire.algorithm_entry(config).module
    num_total = int(config["num-examples-total"])
    key = (
        _target_key(cfg, -1, num_total),
        tuple(sorted((k, str(v)) for k, v in config.items())),
    )
    sent = {k: v for k, v in arrays.items() if not k.startswith(KEPT)}
    last = _COLOCATED.get("round")
    if last is None or last[0] != key or not _same_arrays(last[1], sent):
        store = _colocated_store(cfg, algorithm, settings, round_)
        if len(sent) < len(arrays) and store is None:
            return None  # (what it kept is in its node state alone: it computes alone)
        message = wire.decode_message(config, arrays, torch_dtype(cfg), cfg.device)
        batch = _colocated_round(cfg, (algorithm, settings), message, store, num_total)
        last = (key, sent, *batch)
        _COLOCATED["round"] = last
    _, _, update, keeps, counts, ids = last
    if partition_id not in ids:
        return None
    c = ids.index(partition_id)
    up = algorithm.layout(settings, round_).up
    out, values = _reply(update, up, algorithm, c, int(counts[c]) if counts is not None else 1)
    return {**out, **kept_arrays(keeps, c)}, values


def _colocated_round(cfg: RunConfig, sampler: tuple, message, store, num_total: int):
    """(update on the CPU, what the clients keep, n_c of the round's clients, their ids) of
    every drawn co-located client of ``sampler`` (its module and settings), computed in
    one batch with what they kept (``store``; None: nothing yet)."""
    algorithm, settings = sampler
    target = colocated_target(cfg, num_total)
    # The engine's thread count for this round (--threads auto): a batched reduction
    # may round differently at another count, and the chain must be the engine's.
    apply_threads("auto", round_work(target, cfg))
    drawn = message.client_ids
    ids = list(range(target.num_clients)) if drawn is None else [int(c) for c in drawn]
    if store is None:
        store = ClientStore.empty(target.num_clients, cfg.device)
    computing, seeds = round_clients(cfg.seed, message, target)
    update, keeps = run_clients(algorithm, message, computing, settings, seeds, store.take(drawn))
    if keeps:
        store = store.put(drawn, keeps)
    _COLOCATED["store"] = (_store_key(cfg, algorithm, settings), message.round, store)
    counts = getattr(computing, "counts", None)
    if isinstance(counts, torch.Tensor):  # one transfer, not one per client
        counts = counts.tolist()
    keeps = {k: v.detach().cpu() for k, v in keeps.items()}  # (one transfer each)
    return moved(update, "cpu"), keeps, counts, ids


def _store_key(cfg: RunConfig, algorithm, settings) -> tuple:
    return (_target_key(cfg, -1, None), algorithm.__name__, repr(settings))


def _colocated_store(cfg: RunConfig, algorithm, settings, round_: int):
    """What the co-located clients kept of the last round of this run, batched: the store
    of round ``round_`` − 1 of the same run, else None (a new run, or one that goes on in
    a new process: what its clients kept, if anything, is in their node states)."""
    saved = _COLOCATED.get("store")
    if saved is not None and saved[0] == _store_key(cfg, algorithm, settings):
        if saved[1] == round_ - 1:
            return saved[2]
    return None


def colocated_target(cfg: RunConfig, num_total: int | None = None):
    """Every client's target in one, loaded once per process (its n is Σ n_c unless
    ``num_total`` says otherwise). The simulation's clients load it when they are first
    asked their sizes, so that the rounds do not."""
    key = ("all", *_target_key(cfg, -1, None))
    target = _TARGETS.get(key)
    stale = num_total is not None and getattr(target, "num_total", num_total) != num_total
    if target is None or stale:
        from fedhmc.runtime.problem import build_clients_target

        target = _TARGETS[key] = build_clients_target(cfg, num_total, device=cfg.device)
    return target


def _same_arrays(a: dict, b: dict) -> bool:
    """Whether two messages' arrays are the same (names, shapes, dtypes, values)."""
    import numpy as np

    return a.keys() == b.keys() and all(
        a[k].shape == b[k].shape and a[k].dtype == b[k].dtype and np.array_equal(a[k], b[k])
        for k in a
    )


def num_examples(cfg: RunConfig, partition_id: int) -> int:
    """n_c of this client's partition."""
    return partition_target(cfg, partition_id)[1]


def async_gradient(
    cfg: RunConfig, partition_id: int, theta, config: dict, private_seed: int | None
):
    """async-sghmc/sgld: this worker's stochastic gradient at the θ (D,) it was sent.

    ``config`` carries the chain, the request counter (which selects the minibatch), n and
    the settings the gradient depends on; see
    `fedhmc.algorithms.async_sgmcmc.worker_gradient`.
    Returns (gradient as a numpy array of the run's dtype, n_c).
    """
    from fedhmc.algorithms.async_sgmcmc import worker_gradient, worker_key
    from fedhmc.runtime.problem import async_worker_target

    cfg = wire.apply_data(cfg, config, ("batch-size", "prior-std"))
    num_total = int(config["num-examples-total"])
    key = ("async", *_target_key(cfg, partition_id, num_total))
    if key not in _TARGETS:  # loaded once per process, as partition_target's
        _TARGETS[key] = async_worker_target(cfg, partition_id, num_total, device=cfg.device)
    target, n_c = _TARGETS[key]
    seed = client_seed(cfg.seed, partition_id) if private_seed is None else int(private_seed)
    g = worker_gradient(
        target,
        torch.as_tensor(theta, dtype=torch_dtype(cfg), device=cfg.device),
        worker_key(seed, int(config["chain"]), cfg.device),
        int(config["request"]),
        float(config["grad-noise"]),
    )
    return g.cpu().numpy(), n_c
