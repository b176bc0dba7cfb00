"""Asynchronous distributed SG-MCMC on Flower: the ServerApp body for ``async-sghmc`` and
``async-sgld`` (Chen et al. 2016, Appendix A, Algorithm 2; docs/algorithms.md).

S = ``--chains`` servers (independent chains), W workers (the SuperNodes), worker i serving
chain i mod S. The server sends every worker θ of its chain with ``push_messages``; from
then on it polls ``pull_messages`` and applies each gradient as soon as it arrives
(`fedhmc.algorithms.async_sgmcmc.AsyncChain`: an SGHMC Euler or SGLD update, timestamp + 1),
then sends the new θ to that worker only. A gradient staler than ``--max-staleness`` server
updates is dropped. A "round" of the output is ``--local-steps`` updates of every chain:
θ of every chain at that timestamp goes through the shared `fedhmc.runtime.loop.run_loop`
as the position of an `AsyncBackend` (burn-in, thinning, metrics, files), so the files are
those of ``fedhmc run``, plus
``staleness.csv`` and ``workers.csv`` and an ``async`` block in ``summary.json``.

Failures. An error reply (a ClientApp that raised) or an invalid one is counted and the
worker is sent θ again, until ``--max-worker-failures`` failures in a row retire it. A
request with no reply within ``--round-timeout`` seconds is counted as lost and its worker
retired (it may hang; another message would only queue behind it). A chain left with no
worker stops the run with a clear message. At the end, requests in flight are abandoned.

The chains live on the run's device (``--device``): each gradient is moved there as it
arrives, and each θ sent is brought to the CPU first.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

import torch
from fedhmc_server.exchange import failure_reason
from fedhmc_server.startup import Started, begin
from flwr.app import Array, ArrayRecord, ConfigRecord, Message, RecordDict
from flwr.serverapp import Grid

from fedhmc.algorithms import registry
from fedhmc.algorithms.async_sgmcmc import AsyncChain, pooled_histogram, staleness_rows
from fedhmc.errors import ConfigError, FedHMCError
from fedhmc.runtime import wire
from fedhmc.runtime.backends import prepare
from fedhmc.runtime.config import RunConfig
from fedhmc.runtime.loop import RoundStats, RunResult, run_loop
from fedhmc.runtime.output import write_csv_atomic
from fedhmc.runtime.problem import build_evaluator, initial_position, torch_dtype

log = logging.getLogger("fedhmc.server")

GRAD_MESSAGE = "query.grad"
POLL_S = 0.005
"""Seconds between polls of the grid when nothing has arrived."""


class AsyncServer:
    """The S chains, their workers, and the requests in flight."""

    def __init__(self, grid: Grid, cfg: RunConfig, theta0: torch.Tensor, sizes: dict):
        self.grid, self.cfg = grid, cfg
        self.sizes = sizes
        self.dtype = torch_dtype(cfg)
        self.device = theta0.device
        self.num_total = sum(n for _, n in sizes.values())
        settings = registry.entry(cfg.algorithm).build_settings(cfg)
        self.chains = [
            AsyncChain(theta0[s], settings, cfg.seed, s, snapshot_every=cfg.local_steps)
            for s in range(cfg.chains)
        ]
        by_partition = sorted(sizes, key=lambda nid: sizes[nid][0])
        self.assign = {nid: i % cfg.chains for i, nid in enumerate(by_partition)}
        self.requests = dict.fromkeys(sizes, 0)  # per worker: requests sent (minibatch index)
        self.inflight: dict[str, tuple[int, int, int, float]] = {}  # id → (node, chain, t, time)
        self.round_counts = dict.fromkeys(("grads", "failed", "bytes_down", "bytes_up"), 0)
        self.rejected = 0
        self.updates_t0: float | None = None

    # ------------------------------------------------------------------ messages
    def _config(self, nid: int, chain: int, t: int) -> ConfigRecord:
        return ConfigRecord(
            wire.encode_async(self.cfg, chain, t, int(self.requests[nid]), self.num_total)
        )

    def send(self, nids: list[int]) -> None:
        """Send each worker θ of its chain (one push for all)."""
        msgs, meta = [], []
        for nid in nids:
            s = self.assign[nid]
            theta, t = self.chains[s].send(nid)
            content = RecordDict(
                {
                    "arrays": ArrayRecord({"theta": Array(theta.detach().cpu().numpy())}),
                    "config": self._config(nid, s, t),
                }
            )
            self.requests[nid] += 1
            self.round_counts["bytes_down"] += sum(r.count_bytes() for r in content.values())
            msgs.append(
                Message(content, dst_node_id=nid, message_type=GRAD_MESSAGE, group_id=str(s))
            )
            meta.append((nid, s, t))
        ids = list(self.grid.push_messages(msgs))
        now = time.monotonic()
        for (nid, s, t), mid in zip(meta, ids + [None] * (len(meta) - len(ids)), strict=True):
            if mid is None:  # the SuperLink refused it: a failure of that worker
                log.warning("worker %s: message could not be pushed", nid)
                self._failed(nid, s, lost=False, why="push failed")
            else:
                self.inflight[str(mid)] = (nid, s, t, now)

    def _failed(self, nid: int, s: int, lost: bool, why: str) -> None:
        self.round_counts["failed"] += 1
        retired = self.chains[s].fail(nid, lost, self.cfg.max_worker_failures)
        pid = self.sizes[nid][0]
        if retired:
            log.warning("worker %s (partition %s, chain %d) retired: %s", nid, pid, s, why)
        else:
            log.warning("worker %s (partition %s, chain %d): %s; re-sent θ", nid, pid, s, why)
            self.send([nid])

    def _gradient(self, rep: Message, shape: tuple[int, ...]) -> torch.Tensor:
        """The reply's gradient, validated; raises ValueError with the reason."""
        arrays = rep.content["arrays"]
        if "grad" not in arrays:
            raise ValueError("missing arrays['grad']")
        g = torch.as_tensor(arrays["grad"].numpy(), device=self.device)
        if tuple(g.shape) != shape:
            raise ValueError(f"gradient of shape {tuple(g.shape)}, expected {shape}")
        if g.dtype != self.dtype:
            raise ValueError(f"gradient of dtype {g.dtype}, expected {self.dtype}")
        if not torch.isfinite(g).all():
            raise ValueError("non-finite gradient")
        return g

    def handle(self, rep: Message) -> None:
        mid = rep.metadata.reply_to_message_id
        if mid not in self.inflight:
            return  # a reply to a request already counted as lost
        nid, s, t, _ = self.inflight.pop(mid)
        chain = self.chains[s]
        if rep.has_error() or not rep.has_content():
            why = failure_reason(rep.error.code, rep.error.reason) if rep.has_error() else "empty"
            self._failed(nid, s, False, why)
            return
        self.round_counts["bytes_up"] += sum(r.count_bytes() for r in rep.content.values())
        try:
            g = self._gradient(rep, tuple(chain.theta.shape))
        except (KeyError, TypeError, ValueError) as e:
            self.rejected += 1
            self._failed(nid, s, False, f"rejected reply: {e}")
            return
        self.round_counts["grads"] += 1
        if self.updates_t0 is None:
            self.updates_t0 = time.perf_counter()
        chain.receive(nid, g, t)
        self.send([nid])

    def poll(self) -> int:
        """Apply what has arrived, expire lost requests; the number of replies handled."""
        replies = list(self.grid.pull_messages(list(self.inflight))) if self.inflight else []
        for rep in replies:
            self.handle(rep)
        now = time.monotonic()
        for mid, (nid, s, _, sent) in list(self.inflight.items()):
            if now - sent > self.cfg.round_timeout:
                del self.inflight[mid]
                self._failed(nid, s, True, f"no reply within {self.cfg.round_timeout:g} s")
        return len(replies)

    def advance_to(self, r: int) -> None:
        """Run until every chain has applied r × local-steps updates."""
        while True:
            pending = [c for c in self.chains if r not in c.snapshots]
            if not pending:
                return
            for s, c in enumerate(self.chains):
                if r not in c.snapshots and not c.active_workers():
                    raise FedHMCError(
                        f"chain {s} has no worker left after {c.t} updates (every worker "
                        "failed or timed out; see the log); start more SuperNodes or raise "
                        "--round-timeout or --max-worker-failures"
                    )
            if not self.poll():
                time.sleep(POLL_S)

    # ------------------------------------------------------------------ outputs
    def report(self, wall_s: float) -> dict:
        workers, lost, errors = [], 0, 0
        for nid, s in sorted(self.assign.items(), key=lambda kv: self.sizes[kv[0]][0]):
            st = self.chains[s].worker(nid)
            lost += st.lost
            errors += st.errors
            workers.append(
                {
                    "node": int(nid),
                    "partition": int(self.sizes[nid][0]),
                    "chain": s,
                    "applied": st.applied,
                    "dropped": st.dropped,
                    "errors": st.errors,
                    "lost": st.lost,
                    "retired": st.retired,
                }
            )
        updates = [c.t for c in self.chains]
        span = time.perf_counter() - self.updates_t0 if self.updates_t0 else wall_s
        abandoned = len(self.inflight)
        return {
            "servers": len(self.chains),
            "workers": len(self.assign),
            "updates": updates,
            "updates_per_s": sum(updates) / max(span, 1e-9),
            "max_staleness": int(self.cfg.max_staleness),
            "staleness_histogram": {str(k): v for k, v in pooled_histogram(self.chains).items()},
            "dropped_stale": sum(c.dropped for c in self.chains),
            "errors": errors,
            "rejected": self.rejected,
            "lost": lost,
            "abandoned_in_flight": abandoned,
            "missing": errors + lost + abandoned,
            "per_worker": workers,
        }

    def write(self, out: str, report: dict) -> None:
        """``staleness.csv`` and ``workers.csv`` (the report itself joins summary.json)."""
        out_dir = Path(out)
        write_csv_atomic(
            out_dir / "staleness.csv",
            staleness_rows(self.chains),
            ["chain", "staleness", "received", "applied", "dropped"],
        )
        cols = ["node", "partition", "chain", "applied", "dropped", "errors", "lost", "retired"]
        write_csv_atomic(out_dir / "workers.csv", report["per_worker"], cols)


class AsyncBackend:
    """The asynchronous server as a backend of the shared `fedhmc.runtime.loop.run_loop`:
    round r is reached when every chain has applied r × ``--local-steps`` updates, and θ̄ is
    the chains' θ at that timestamp. Not resumable: the chains' server state is not
    checkpointed (``--resume`` is refused)."""

    name = "flower"

    def __init__(self, server: AsyncServer, theta0: torch.Tensor):
        self.server = server
        self.position = theta0
        self.report: dict = {}  # the async block of summary.json, once the run ends
        self.t0 = time.perf_counter()

    def round(self, r: int) -> RoundStats:
        server, sizes = self.server, self.server.sizes
        if r == 1:
            server.send(sorted(sizes, key=lambda nid: sizes[nid][0]))
        server.advance_to(r)
        counts = dict(server.round_counts)
        server.round_counts = dict.fromkeys(counts, 0)
        self.position = torch.stack([c.snapshots.pop(r) for c in server.chains])
        return RoundStats(
            grad_evals=counts["grads"],
            finite=bool(torch.isfinite(self.position).all()),
            clients=sum(len(c.active_workers()) for c in server.chains),
            failed=counts["failed"],
            bytes_down=counts["bytes_down"],
            bytes_up=counts["bytes_up"],
        )

    def state_dict(self) -> None:
        return None

    def load_state_dict(self, saved: dict) -> None:
        raise ConfigError("the asynchronous server's state is not checkpointed")

    def summary(self) -> dict:
        self.report.update(self.server.report(time.perf_counter() - self.t0))
        return {"async": self.report}

    def close(self, out: str) -> None:
        """``staleness.csv`` and ``workers.csv`` (once the summary was written), and each
        chain's updates and staleness in the log."""
        if self.report and Path(out).is_dir():
            self.server.write(out, self.report)
        for s, c in enumerate(self.server.chains):
            log.info(
                "chain %d: %d updates, staleness %s", s, c.t, dict(sorted(c.staleness.items()))
            )


def serve_async(
    grid: Grid,
    cfg: RunConfig,
    progress: bool = False,
    on_round=None,
    started: Started | None = None,
) -> RunResult:
    """Run async-sghmc / async-sgld over the grid's workers; write the run's files.

    ``started``: as for `fedhmc_server.loop.serve`."""
    cfg = prepare(cfg)
    if started is None:
        started = begin(
            grid, cfg.min_clients or cfg.num_clients, cfg.node_wait_timeout, cfg.round_timeout
        )
    device = torch.device(cfg.device)
    evaluator, model, dim, description = build_evaluator(cfg, device)
    sizes = started.sizes()
    if len(sizes) < cfg.chains:
        raise ConfigError(
            f"{cfg.algorithm} gives each of the --chains {cfg.chains} servers its own "
            f"workers, but only {len(sizes)} answered; lower --chains or add SuperNodes"
        )
    theta0 = initial_position(model, dim, cfg, device=device)
    backend = AsyncBackend(AsyncServer(grid, cfg, theta0, sizes), theta0)
    try:
        return run_loop(
            cfg,
            evaluator,
            backend,
            dim=dim,
            num_clients=len(sizes),
            description=description,
            progress=progress,
            on_round=on_round,
        )
    finally:
        backend.close(cfg.out)
