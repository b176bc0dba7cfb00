"""The client's side of FA-HMC, free of Flower types: load a partition, run T iterations.

A client loads its own partition once per process (cached), and each round runs T local
FA-HMC iterations through :func:`fedhmc.sampler.client_update`, the same function the
batched engine's numbers are tested against. It never sends its data or its private seed.
"""

from __future__ import annotations

import torch

from fedhmc.config import RunConfig
from fedhmc.problem import build_client_target, torch_dtype
from fedhmc.sampler import SamplerSettings, client_seed, client_update

# Every sampler setting travels in the round's ConfigRecord: the server is authoritative.
SETTING_KEYS = (
    "local-steps",
    "leapfrog-steps",
    "step-size",
    "rho",
    "batch-size",
    "grad-noise",
    "prior-std",
    "temperature",
)

_TARGETS: dict[tuple, tuple] = {}


def client_config(run_config: dict) -> RunConfig:
    """The run config (pyproject [tool.flwr.app.config] plus --run-config), resolved."""
    keys = set(RunConfig.keys())
    return RunConfig.from_mapping({k: v for k, v in run_config.items() if k in keys}).resolve()


def partition_target(cfg: RunConfig, partition_id: int, num_total: int | None = None):
    """(target, n_c) of this client, loaded once per process for the same settings."""
    key = (
        cfg.dataset,
        cfg.model,
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
        cfg.prior_std,
        cfg.dtype,
        partition_id,
        num_total,
    )
    if key not in _TARGETS:
        _TARGETS[key] = build_client_target(cfg, partition_id, num_total)
    return _TARGETS[key]


def local_update(
    cfg: RunConfig, partition_id: int, theta_bar, round_config: dict, private_seed: int | None
):
    """T local FA-HMC iterations from the broadcast θ̄ (S, D).

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

    Returns
    -------
    (theta, num_examples, energy)
        New positions (S, D) as a numpy array of the run's dtype, n_c, and the energy.
    """
    settings = {k: round_config[k] for k in SETTING_KEYS}
    cfg = cfg.replace(
        batch_size=int(settings["batch-size"]), prior_std=float(settings["prior-std"])
    )
    target, n_c = partition_target(cfg, partition_id, int(round_config["num-examples-total"]))
    s = SamplerSettings(
        step_size=float(settings["step-size"]),
        leapfrog_steps=int(settings["leapfrog-steps"]),
        local_steps=int(settings["local-steps"]),
        rho=float(settings["rho"]),
        grad_noise=float(settings["grad-noise"]),
        temperature=float(settings["temperature"]),
    )
    seed = client_seed(cfg.seed, partition_id) if private_seed is None else int(private_seed)
    theta_bar = torch.as_tensor(theta_bar).to(torch_dtype(cfg))
    theta, info = client_update(
        target, theta_bar, int(round_config["round-seed"]), seed, int(round_config["round"]), s
    )
    return theta.numpy(), n_c, float(info.energy.max())


def num_examples(cfg: RunConfig, partition_id: int) -> int:
    """n_c of this client's partition."""
    return partition_target(cfg, partition_id)[1]
