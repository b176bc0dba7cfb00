"""The start of a run, before any heavy import: wait for the clients, ask their sizes.

The ServerApp's process starts cold: importing PyTorch and fedhmc's sampler and loading the
test data take seconds. None of that is needed to learn which clients are connected and
how many examples each holds, so `begin` (Flower only, no PyTorch) waits for the
nodes and sends the size query at once, and `Started.sizes` collects the answers
after the caller has done its imports and built its evaluator, which thus overlap the
query's round trip.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

from fedhmc_server.exchange import Exchange, Pending
from flwr.app import MessageType, RecordDict
from flwr.serverapp import Grid

from fedhmc.errors import FedHMCError

log = logging.getLogger("fedhmc.server")


def wait_for_nodes(grid: Grid, count: int, timeout: float) -> list[int]:
    """Node ids once ``count`` are connected; a clear error after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        nodes = sorted(grid.get_node_ids())
        if len(nodes) >= count:
            return nodes
        if time.monotonic() > deadline:
            raise FedHMCError(
                f"only {len(nodes)} of the {count} clients needed connected within "
                f"{timeout:g} s; start more SuperNodes, or lower --min-clients or raise "
                "--node-wait-timeout"
            )
        time.sleep(0.05)


@dataclass
class Started:
    """Connected nodes and their size query in flight (`begin`)."""

    exchange: Exchange
    nodes: list[int]
    query: Pending
    timeout: float

    def sizes(self) -> dict[int, tuple[int, int]]:
        """{node: (partition id, n_c)} of the nodes that answered the size query."""
        ok, failed = self.exchange.collect(self.query, self.timeout)
        return _sizes(ok, failed)


def begin(grid: Grid, min_clients: int, node_wait_timeout: float, round_timeout: float) -> Started:
    """Wait for ``min_clients`` nodes, then send each the size query without waiting.

    The query's deadline is the larger of the two timeouts: a ClientApp's first message
    includes its start-up (imports, the partition's first load)."""
    nodes = wait_for_nodes(grid, min_clients, node_wait_timeout)
    exchange = Exchange(grid)
    query = exchange.push({nid: RecordDict() for nid in nodes}, MessageType.QUERY, "sizes")
    return Started(exchange, nodes, query, max(round_timeout, node_wait_timeout))


def query_sizes(
    grid: Grid, nodes: list[int], timeout: float, exchange: Exchange | None = None
) -> dict[int, tuple[int, int]]:
    """{node: (partition id, n_c)} of the nodes that answered the size query."""
    exchange = exchange or Exchange(grid)
    ok, failed = exchange({nid: RecordDict() for nid in nodes}, MessageType.QUERY, "sizes", timeout)
    return _sizes(ok, failed)


def _sizes(ok: dict, failed: dict) -> dict[int, tuple[int, int]]:
    for nid, why in failed.items():
        log.warning("client %s dropped: size query failed (%s)", nid, why)
    sizes = {}
    for nid, rep in ok.items():
        m = rep.content["metrics"]
        n_c, pid = m.get("num-examples"), m.get("partition-id")
        if isinstance(n_c, int) and n_c >= 1 and isinstance(pid, int):
            sizes[nid] = (pid, n_c)
        else:
            log.warning("client %s dropped: bad size reply %r", nid, dict(m))
    if not sizes:
        raise FedHMCError("no client answered the size query; check the SuperNodes' logs")
    return sizes
