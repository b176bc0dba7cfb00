"""What a client computes for one message, in plain values: no Flower types.

`compute` takes the message kind (``query``, ``train``, ``grad``), the run config,
the node config, the message's config and its arrays (numpy), and returns the reply's
arrays and metrics. The ClientApp calls it in its own process, or forwards the message to
the node's warm worker (`fedhmc_clients.worker`), which calls the same function; the
two give the same numbers.

A client computes on `client_device`: the node config's ``device`` (a SuperNode's own),
else the run's. Its arrays travel as NumPy arrays either way, so a CPU node and a GPU
node take part in one run.
"""

from __future__ import annotations

import sys

import numpy as np
from fedhmc_clients.task import (
    async_gradient,
    client_config,
    colocated_target,
    colocated_update,
    local_update,
    num_examples,
)

from fedhmc.runtime import wire

MESSAGE_KINDS = ("query", "train", "grad")
COLOCATED_KEY = "simulation-colocated"
"""Run-config key that the Flower simulation sets: its clients share one process, so a
round of ``train`` messages is computed in one batch (``colocated_update``)."""


def identity(run_config: dict, node_config: dict):
    """The client's resolved RunConfig, on its device (`client_device`), and partition id."""
    rc = dict(run_config)
    pid = int(node_config["partition-id"])
    rc["num-clients"] = int(node_config["num-partitions"])
    rc["device"] = client_device(run_config, node_config, _ray_gpu_ids())
    rc.pop("client-gpus", None)  # the simulation's resources, not this client's
    if not rc["device"].startswith("cuda"):  # CUDA graphs: how a GPU node computes, not
        rc.pop("cuda-graphs", None)  # what; a CPU node beside GPU ones runs without them
    return client_config(rc), pid


def client_device(run_config: dict, node_config: dict, ray_gpus=()) -> str:
    """The device this client computes on: the node config's ``device`` (checked here,
    one line if this node lacks it), else the run's.

    ``ray_gpus``: the GPUs Ray gave this process (a simulated client holding a share of
    a GPU). Ray shows such a process only those GPUs, so ``cuda`` and ``cuda:N`` mean
    the GPU Ray gave it, ``cuda``."""
    own = node_config.get("device")
    if own is not None and str(own) != "":
        device = str(own)
        check_node_device(device)
    else:
        device = str(run_config.get("device") or "cpu")
    if ray_gpus and (device == "cuda" or device.startswith("cuda:")):
        return "cuda"
    return device


def check_node_device(device: str) -> None:
    """A one-line ConfigError unless this node has ``device`` (node config ``device``)."""
    from fedhmc.runtime.config import check_device

    check_device(device, f"node config device={device!r}", "this node", "device='cpu'")


def _ray_gpu_ids() -> list:
    """The GPUs Ray gave this process ([] outside a Ray worker)."""
    ray = sys.modules.get("ray")
    if ray is None or not ray.is_initialized():
        return []
    try:
        return list(ray.get_gpu_ids())
    except Exception:  # noqa: BLE001 - not a worker Ray manages
        return []


def compute(
    kind: str, run_config: dict, node_config: dict, config: dict, arrays: dict[str, np.ndarray]
) -> tuple[dict[str, np.ndarray], dict]:
    """The reply (arrays, metrics) to one message."""
    cfg, pid = identity(run_config, node_config)
    seed = node_config.get("private-seed")
    if kind == "query":
        if run_config.get(COLOCATED_KEY):
            # Loaded now, with the start-up, not in round 1; it knows every client's size
            # (a simulation of thousands of clients must not load a partition per client).
            counts = getattr(colocated_target(cfg), "counts", None)
            n_c = 1 if counts is None else int(counts[pid])
        else:
            n_c = num_examples(cfg, pid)
        return {}, {"num-examples": n_c, "partition-id": pid}
    if kind == "grad":
        grad, n_c = async_gradient(cfg, pid, arrays["theta"], config, seed)
        return {"grad": grad}, {"num-examples": n_c, "partition-id": pid}
    if kind != "train":
        raise ValueError(f"unknown message kind {kind!r}; expected one of {MESSAGE_KINDS}")
    wire.check_data(cfg, config)
    reply = None
    if run_config.get(COLOCATED_KEY) and seed is None:
        reply = colocated_update(cfg, pid, config, arrays)
    if reply is None:
        reply = local_update(cfg, pid, config, arrays, seed)
    out, values = reply
    return out, {**values, "partition-id": pid}
