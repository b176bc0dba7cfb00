"""The client's side of FA-HMC, free of Flower types: load a partition, run T iterations.

A client loads its own partition once per process (cached), and each round runs T local
FA-HMC iterations through :func:`fedhmc.algorithms.fahmc.client_update`, the same function the
batched engine's numbers are tested against. It never sends its data or its private seed.
"""

from __future__ import annotations

import torch

from fedhmc.algorithms.debiased import client_anchor_gradient
from fedhmc.algorithms.fahmc import client_seed, client_update, round_seed, run_clients
from fedhmc.runtime import wire
from fedhmc.runtime.config import RunConfig
from fedhmc.runtime.problem import build_client_target, torch_dtype

_TARGETS: dict[tuple, tuple] = {}
# Debiased FA-HMC: this process's last local gradient at the position it was sent, keyed by
# everything that determines it, so the next round need not recompute it (a client in a
# new process, or one that missed a round, recomputes it: the value is the same).
_ANCHOR_GRADS: dict[tuple, tuple] = {}


def client_config(run_config: dict) -> RunConfig:
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
        cfg.hidden,
        cfg.num_clients,
        cfg.partition,
        cfg.dirichlet_alpha,
        cfg.classes_per_client,
        cfg.dim,
        cfg.data_dir,
        cfg.scaling,
        cfg.seed,
        cfg.batch_size,
        cfg.minibatch,
        cfg.prior_std,
        cfg.dtype,
        partition_id,
        num_total,
    )


def partition_target(cfg: RunConfig, partition_id: int, num_total: int | None = None):
    """(target, n_c) of this client, loaded once per process for the same settings."""
    key = _target_key(cfg, partition_id, num_total)
    if key not in _TARGETS:
        _TARGETS[key] = build_client_target(cfg, partition_id, num_total)
    return _TARGETS[key]


def local_update(
    cfg: RunConfig,
    partition_id: int,
    theta_bar,
    round_config: dict,
    private_seed: int | None,
    correction: torch.Tensor | None = None,
    momentum=None,
    origin=None,
):
    """One round of local FA-HMC from the broadcast θ̄ (S, D).

    Parameters
    ----------
    cfg
        The client's resolved run config (data settings).
    partition_id
        This client's partition.
    theta_bar
        The broadcast positions as an array (S, D).
    round_config
        The round's ConfigRecord: ``round``, ``round-seed``, ``num-examples-total`` and the
        sampler settings.
    private_seed
        The client's own seed; by default derived from the run seed and the partition id,
        which reproduces the in-process engine.
    correction
        Debiased FA-HMC's control variate (S, D) from :func:`anchor_step`, or None.
    momentum, origin
        ``sync-unit = leapfrog``: the averaged momentum to continue a trajectory from, and
        under restarts the outer iteration's origin, as arrays (S, D), or None.

    Returns
    -------
    (theta, num_examples, energy, momentum, energy_error)
        New positions (S, D) as a numpy array of the run's dtype, n_c, the energy, the
        end momentum (S, D) under ``sync-unit = leapfrog`` (else None), and the mean |ΔH|
        per leapfrog trajectory over the chains (the health check's input).
    """
    # Every sampler setting travels in the round's settings: the server is authoritative.
    cfg = wire.apply_data(cfg, round_config)
    target, n_c = partition_target(cfg, partition_id, int(round_config["num-examples-total"]))
    s = wire.decode_sampler(round_config)
    seed = client_seed(cfg.seed, partition_id) if private_seed is None else int(private_seed)
    dtype = torch_dtype(cfg)
    theta_bar = torch.as_tensor(theta_bar).to(dtype)
    round_ = int(round_config["round"])
    theta, info = client_update(
        target,
        theta_bar,
        int(round_config["round-seed"]),
        seed,
        round_,
        s,
        correction=correction,
        momentum=None if momentum is None else torch.as_tensor(momentum).to(dtype),
        origin=None if origin is None else torch.as_tensor(origin).to(dtype),
    )
    p = None if info.momentum is None else info.momentum.numpy()
    de = float(info.energy_error.mean())
    return theta.numpy(), n_c, float(info.energy.max()), p, de


# A simulation's co-located clients: the last round computed for all of them at once.
_COLOCATED: dict = {}


def colocated_update(
    cfg: RunConfig, partition_id: int, theta_bar, round_config: dict, momentum=None, origin=None
):
    """:func:`local_update` for a client of a Flower simulation, whose clients all live
    in this process: the first message of a round runs every client's round in one batched
    computation (:func:`fedhmc.algorithms.fahmc.run_clients`) and the round's other
    messages take their own rows. Each client's numbers are those of :func:`local_update`
    (the batched engine's); the messages, replies and failures stay per client. Returns
    None where it does not apply (another round seed than the run's), and the caller
    computes alone.
    """
    cfg = wire.apply_data(cfg, round_config)
    round_ = int(round_config["round"])
    if int(round_config["round-seed"]) != round_seed(cfg.seed, round_):
        return None
    num_total = int(round_config["num-examples-total"])
    dtype = torch_dtype(cfg)
    theta_bar = torch.as_tensor(theta_bar).to(dtype)
    momentum = None if momentum is None else torch.as_tensor(momentum).to(dtype)
    origin = None if origin is None else torch.as_tensor(origin).to(dtype)
    key = (
        _target_key(cfg, -1, num_total),
        tuple(sorted((k, str(v)) for k, v in round_config.items())),
    )
    last = _COLOCATED.get("round")
    if not (
        last is not None
        and last[0] == key
        and all(_same(a, b) for a, b in zip(last[1], (theta_bar, momentum, origin), strict=True))
    ):
        target = colocated_target(cfg, num_total)
        s = wire.decode_sampler(round_config)
        theta, info = run_clients(
            target, theta_bar, cfg.seed, round_, s, momentum=momentum, origin=origin
        )
        last = (key, (theta_bar, momentum, origin), theta, info, getattr(target, "counts", None))
        _COLOCATED["round"] = last
    _, _, theta, info, counts = last
    c = partition_id
    p = None if info.momentum is None else info.momentum[:, c].numpy()
    return (
        theta[:, c].numpy(),
        int(counts[c]) if counts is not None else 1,
        float(info.energy[:, c].max()),
        p,
        float(info.energy_error[:, c].mean()),
    )


def colocated_target(cfg: RunConfig, num_total: int | None = None):
    """Every client's target in one, loaded once per process (its n is Σ n_c unless
    ``num_total`` says otherwise). The simulation's clients load it when they are first
    asked their sizes, so that the rounds do not."""
    key = ("all", *_target_key(cfg, -1, None))
    target = _TARGETS.get(key)
    stale = num_total is not None and getattr(target, "num_total", num_total) != num_total
    if target is None or stale:
        from fedhmc.runtime.problem import build_clients_target

        target = _TARGETS[key] = build_clients_target(cfg, num_total)
    return target


def _same(a, b) -> bool:
    if a is None or b is None:
        return a is None and b is None
    return a.shape == b.shape and torch.equal(a, b)


def anchor_step(
    cfg: RunConfig,
    partition_id: int,
    theta_bar,
    round_config: dict,
    private_seed: int | None,
    anchor=None,
    anchor_grad=None,
):
    """Debiased FA-HMC's client side: (control variate or None, local gradient at θ̄).

    ``anchor`` and ``anchor_grad`` are θ_a and ∇f(θ_a) (S, D) as sent from round 2 on;
    ``round_config["anchor-round"]`` is the round in which θ_a was sent, whose anchor key
    gives this client's ∇f^(c)(θ_a). The returned local gradient is ∇f^(c)(θ̄) under this
    round's anchor key: the server averages it into the next round's ∇f(θ_a).
    """
    cfg = wire.apply_data(cfg, round_config, ("batch-size", "prior-std"))
    target, _ = partition_target(cfg, partition_id, int(round_config["num-examples-total"]))
    anchor_target = target.with_batch_size(int(round_config["anchor-batch-size"]))
    seed = client_seed(cfg.seed, partition_id) if private_seed is None else int(private_seed)
    dtype = torch_dtype(cfg)
    round_ = int(round_config["round"])
    base = (cfg, partition_id, seed, int(round_config["anchor-batch-size"]))
    correction = None
    if anchor is not None:
        a_round = int(round_config["anchor-round"])
        theta_a = torch.as_tensor(anchor).to(dtype)
        cached = _ANCHOR_GRADS.get(base)
        if cached is not None and cached[0] == a_round and torch.equal(cached[1], theta_a):
            local_a = cached[2]
        else:
            local_a = client_anchor_gradient(anchor_target, theta_a, seed, a_round)
        correction = torch.as_tensor(anchor_grad).to(dtype) - local_a
    theta_bar = torch.as_tensor(theta_bar).to(dtype)
    local = client_anchor_gradient(anchor_target, theta_bar, seed, round_)
    _ANCHOR_GRADS[base] = (round_, theta_bar, local)
    return correction, local.numpy()


def num_examples(cfg: RunConfig, partition_id: int) -> int:
    """n_c of this client's partition."""
    return partition_target(cfg, partition_id)[1]


def async_gradient(
    cfg: RunConfig, partition_id: int, theta, config: dict, private_seed: int | None
):
    """async-sghmc/sgld: this worker's stochastic gradient at the θ (D,) it was sent.

    ``config`` carries the chain, the request counter (which selects the minibatch), n and
    the settings the gradient depends on; see
    :func:`fedhmc.algorithms.async_sgmcmc.worker_gradient`.
    Returns (gradient as a numpy array of the run's dtype, n_c).
    """
    from fedhmc.algorithms.async_sgmcmc import worker_gradient, worker_key
    from fedhmc.runtime.problem import async_worker_target

    cfg = wire.apply_data(cfg, config, ("batch-size", "prior-std"))
    num_total = int(config["num-examples-total"])
    key = ("async", *_target_key(cfg, partition_id, num_total))
    if key not in _TARGETS:  # loaded once per process, as partition_target's
        _TARGETS[key] = async_worker_target(cfg, partition_id, num_total)
    target, n_c = _TARGETS[key]
    seed = client_seed(cfg.seed, partition_id) if private_seed is None else int(private_seed)
    g = worker_gradient(
        target,
        torch.as_tensor(theta).to(torch_dtype(cfg)),
        worker_key(seed, int(config["chain"])),
        int(config["request"]),
        float(config["grad-noise"]),
    )
    return g.numpy(), n_c
