"""What a client computes for one message, in plain values: no Flower types.

`compute` takes the message kind (``query``, ``train``, ``grad``), the run config,
the node config, the message's config and its arrays (numpy), and returns the reply's
arrays and metrics. The ClientApp calls it in its own process, or forwards the message to
the node's warm worker (`fedhmc_clients.worker`), which calls the same function; the
two give the same numbers.
"""

from __future__ import annotations

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

KINDS = ("query", "train", "grad")
COLOCATED_KEY = "simulation-colocated"
"""Run-config key that the Flower simulation sets: its clients share one process, so a
round of ``train`` messages is computed in one batch (``colocated_update``)."""


def identity(run_config: dict, node_config: dict):
    """The client's resolved RunConfig and partition id."""
    rc = dict(run_config)
    pid = int(node_config["partition-id"])
    rc["num-clients"] = int(node_config["num-partitions"])
    return client_config(rc), pid


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
        raise ValueError(f"unknown message kind {kind!r}; expected one of {KINDS}")
    wire.check_data(cfg, config)
    reply = None
    if run_config.get(COLOCATED_KEY) and seed is None:
        reply = colocated_update(cfg, pid, config, arrays)
    if reply is None:
        reply = local_update(cfg, pid, config, arrays, seed)
    out = {k: reply[k] for k in ("theta", "momentum", "grad") if reply[k] is not None}
    metrics = {
        "num-examples": reply["num-examples"],
        "partition-id": pid,
        "energy": reply["energy"],
        "energy-error": reply["energy-error"],
    }
    return out, metrics
