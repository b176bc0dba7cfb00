"""The federated server: broadcast θ̄, collect the clients' replies, combine, evaluate.

Each round it opens the round (``fedhmc.algorithms.federated.open_round``: the sampler's
Broadcast), sends it to the round's clients as one message (the arrays its ``layout``
names as an ArrayRecord; the round, the round seed and the sampler settings as a
ConfigRecord), validates the replies (``fedhmc.core.aggregate.validate_reply``), stacks
them in partition order and closes the round with them
(``fedhmc.algorithms.federated.close_round``: the sampler's own rule for combining them,
weights n_c renormalised over the clients that replied or partial participation's
coefficients, and its ``server_update``): the server's half of the round the engine's
``step`` runs too. The loop between rounds (sample collection, metrics, files) is the
one the engine runs too (`fedhmc.runtime.loop.run_loop`), so the output files are the same.

The server computes on the run's device (``--device``): its evaluator, θ̄ and the
algorithm's state live there, every reply is moved there before the average, and what
goes on the wire is brought to the CPU first.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from fedhmc_server.exchange import PROCESS_DIED
from fedhmc_server.startup import Started, begin, query_sizes, wait_for_nodes
from flwr.app import Array, ArrayRecord, ConfigRecord, MessageType, RecordDict
from flwr.serverapp import Grid

from fedhmc.errors import MODEL_ERROR_CODE, ModelError, RunFailed
from fedhmc.runtime.backends import prepare
from fedhmc.runtime.config import ResolvedConfig, RunConfig

if TYPE_CHECKING:
    from fedhmc.runtime.loop import RoundStats, RunResult

__all__ = ["query_sizes", "round_config", "serve", "wait_for_nodes"]

log = logging.getLogger("fedhmc.server")


def round_config(cfg: RunConfig, round_: int, num_total: int) -> ConfigRecord:
    """Round ``round_``'s settings as a ConfigRecord (``fedhmc.runtime.wire.encode_round``)."""
    from fedhmc.runtime import wire

    return ConfigRecord(wire.encode_round(cfg, round_, num_total))


def _record_bytes(content: RecordDict) -> int:
    return sum(rec.count_bytes() for rec in content.values())


def _as_int(value) -> int | float:
    return value if isinstance(value, (int, float)) else float("nan")


def _mean_of_clients(values) -> float | None:
    """The mean over the clients (in partition order) of the values (1, M) they reported, as
    a sum of Python floats: the health number of the round's row."""
    if values is None:
        return None
    per_client = values.reshape(-1).tolist()
    return sum(per_client) / len(per_client)


def serve(
    grid: Grid,
    cfg: RunConfig,
    progress: bool = False,
    on_round=None,
    started: Started | None = None,
) -> RunResult:
    """Run a federated sampler over the grid's clients and write the run's files; the
    ServerApp's body.

    ``started`` is the run's `fedhmc_server.startup.begin` when the caller already
    sent the size query (the ServerApp does, before its heavy imports). ``cfg`` is resolved
    here unless it is a `ResolvedConfig` (the ServerApp's is)."""
    cfg = prepare(cfg)
    if started is None:
        started = begin(
            grid, cfg.min_clients or cfg.num_clients, cfg.node_wait_timeout, cfg.round_timeout
        )
    # The heavy part, while the size query is in flight.
    from fedhmc.runtime.loop import run_loop
    from fedhmc.runtime.problem import build_evaluator

    evaluator, model, dim, description = build_evaluator(cfg, cfg.device)
    server = RoundServer(cfg, started, model, dim)
    return run_loop(
        cfg,
        evaluator,
        server,
        dim=dim,
        num_clients=len(server.sizes),
        description=description,
        progress=progress,
        on_round=on_round,
    )


class RoundServer:
    """The Flower backend of a synchronous federated run: each round, the algorithm's
    Broadcast goes to the round's clients, their replies are validated and stacked in
    partition order, and `fedhmc.algorithms.federated.close_round` combines them by the
    algorithm's rule (the server's half of the round, as the engine's ``step`` runs it).
    θ̄ is the algorithm's state's."""

    name = "flower"

    def __init__(self, cfg: ResolvedConfig, started: Started, model, dim: int):
        import torch

        from fedhmc.algorithms import registry
        from fedhmc.runtime.loop import setup_rounds_of
        from fedhmc.runtime.problem import initial_position, torch_dtype

        self.cfg, self.exchange = cfg, started.exchange
        self.device = torch.device(cfg.device)
        self.sizes = started.sizes()  # {node: (partition id, n_c)}
        self.num_total = sum(n for _, n in self.sizes.values())
        # The clients' weights in partition order, as the engine's target holds them: under
        # partial participation the round's clients are drawn from these.
        self.by_partition = sorted(self.sizes, key=lambda nid: self.sizes[nid][0])
        counts = [self.sizes[nid][1] for nid in self.by_partition]
        self.weights = torch.tensor(counts, dtype=torch.float64, device=self.device)
        self.weights = self.weights / self.num_total
        self.algorithm, self.settings = registry.algorithm_of(cfg)
        self.shape, self.dtype = (cfg.chains, dim), torch_dtype(cfg)
        theta0 = initial_position(model, dim, cfg, device=self.device)
        self.state = self.algorithm.init(theta0, self.settings)
        self.setup_rounds = setup_rounds_of(self.algorithm, self.settings)
        self.failed_rounds = 0
        self.durations: list[float] = []  # of the complete rounds so far

    @property
    def position(self):
        return self.state.position

    def round(self, r: int) -> RoundStats:
        """Round ``r``: send, collect, validate, combine."""
        from fedhmc.algorithms import federated
        from fedhmc.runtime.loop import RoundStats
        from fedhmc.runtime.problem import bits_up_per_round

        message = federated.open_round(
            self.algorithm, self.cfg.seed, self.state, self.settings, self.weights
        )
        layout = self.algorithm.layout(self.settings, r)  # the arrays down and up
        content = self._messages(message, layout)
        t0 = time.monotonic()
        ok, failed = self.exchange(
            content, MessageType.TRAIN, str(r), self.cfg.round_timeout, self._deadline()
        )
        if not failed:  # a complete round: what the straggler deadline is measured on
            self.durations.append(time.monotonic() - t0)
        replies = self._accept(ok, failed, layout)
        self._check_failures(failed, r)
        stats = RoundStats(
            grad_evals=sum(rep.grad_evals for _, _, rep in replies.accepted),
            finite=True,
            clients=len(replies.accepted),
            failed=len(failed),
            bytes_down=sum(_record_bytes(c) for c in content.values()),
            bytes_up=replies.bytes_up,
            bits_up=bits_up_per_round(
                self.cfg, self.shape[1], r, len(replies.accepted), self.settings
            ),
        )
        if not replies.accepted:
            stats.finite = replies.nonfinite < len(content)  # every client diverged: the chain
            if stats.finite:
                self._no_reply(failed, r)
        update, weights, replied = self._stacked(message, replies.accepted)
        self.state, info = federated.close_round(
            self.algorithm, self.state, self.settings, message, update, weights, replied
        )
        if info is not None:
            stats.finite = info.finite
            stats.energy_error = _mean_of_clients(update.energy_error)
        return stats

    def _deadline(self) -> float | None:
        """factor × the median of the last 10 complete rounds, at least the floor; None
        before any complete round or when off."""
        cfg = self.cfg
        if cfg.straggler_factor <= 0 or not self.durations:
            return None
        recent = sorted(self.durations[-10:])
        return max(cfg.straggler_floor, cfg.straggler_factor * recent[len(recent) // 2])

    def _messages(self, message, layout) -> dict:
        """{node: the round's message} of the round's clients (under partial participation,
        only the drawn ones)."""
        from fedhmc.runtime import wire

        values, tensors = wire.encode_message(
            self.cfg, message, self.num_total, layout, self.algorithm, self.settings
        )
        config = ConfigRecord(values)
        arrays = ArrayRecord({k: Array(v.numpy()) for k, v in tensors.items()})
        drawn = self.by_partition
        if message.client_ids is not None:
            drawn = [self.by_partition[int(i)] for i in message.client_ids]
        return {nid: RecordDict({"arrays": arrays, "config": config}) for nid in drawn}

    def _accept(self, ok: dict, failed: dict, layout) -> Replies:
        """The valid replies as (partition id, n_c, ClientUpdate), in partition order; an
        invalid one joins ``failed`` with its reason."""
        from fedhmc.core.aggregate import ReplyError
        from fedhmc.runtime import wire

        out = Replies()
        up = wire.reply_names(self.algorithm, layout)
        for nid, rep in ok.items():
            out.bytes_up += _record_bytes(rep.content)
            try:
                out.accepted.append(self._update(rep.content, self.sizes[nid], up))
            except (ReplyError, KeyError, TypeError, ValueError) as e:
                failed[nid] = f"rejected reply: {e}"
                out.nonfinite += "non-finite" in str(e)
        out.accepted.sort(key=lambda a: a[0])  # partition order, as the engine sums
        return out

    def _update(self, content, size: tuple[int, int], up: tuple[str, ...]):
        """(partition id, n_c, the client's ClientUpdate) of one reply, validated."""
        import torch

        from fedhmc.core.aggregate import ReplyError, validate_reply
        from fedhmc.runtime import wire

        pid, assigned = size
        m = content["metrics"]
        arrays = {k: v.numpy() for k, v in content["arrays"].items()}
        n_c = _as_int(m.get("num-examples"))
        got = validate_reply(
            arrays, n_c, shape=self.shape, dtype=self.dtype, max_examples=assigned, keys=up
        )
        evals = m.get("grad-evals")
        if isinstance(evals, bool) or not isinstance(evals, int) or evals < 0:
            raise ReplyError(f"grad-evals must be an integer ≥ 0, got {evals!r}")
        health = {}  # the client's energy and mean |ΔH|, (1, 1) each, where it sends them
        for k, f in (("energy", "energy"), ("energy-error", "energy_error")):
            if k in m:
                if isinstance(m[k], bool) or not isinstance(m[k], (int, float)):
                    raise ReplyError(f"{k} must be a number, got {m[k]!r}")
                health[f] = torch.tensor([[float(m[k])]], dtype=torch.float64, device=self.device)
        update = wire.decode_reply(got, self.device, self.algorithm, grad_evals=evals, **health)
        return pid, int(n_c), update

    def _check_failures(self, failed: dict, r: int) -> None:
        """Stop the run where a failure says every round would fail alike (the user's
        module's error, a client process that died), or where ``--on-failure stop`` says
        so; else log them, one line for the clients that failed alike."""
        model_failed = f"error {MODEL_ERROR_CODE}: "
        for nid, why in failed.items():
            if why.startswith(model_failed):
                raise ModelError(f"round {r}: on a client, {why[len(model_failed) :]}")
            if why.startswith(PROCESS_DIED):  # (the simulation restarts no client process)
                raise RunFailed(
                    f"round {r}: client {nid} (partition {self.sizes[nid][0]}): {why}: its "
                    "code ended or crashed the process (os._exit, a crash in native code) or "
                    "it ran out of memory, and the run cannot go on without it"
                )
        by_reason: dict[str, list[int]] = {}  # one line for the clients that failed alike
        for nid, why in failed.items():
            by_reason.setdefault(why, []).append(nid)
        for why, nids in by_reason.items():
            if len(nids) == 1:
                nid = nids[0]
                log.warning(
                    "round %d: client %s (partition %s) failed: %s", r, nid, self.sizes[nid][0], why
                )
            else:
                parts = ", ".join(str(p) for p in sorted(self.sizes[n][0] for n in nids))
                log.warning(
                    "round %d: %d clients (partitions %s) failed: %s", r, len(nids), parts, why
                )
        if failed and self.cfg.on_failure == "stop":
            nid, why = next(iter(failed.items()))
            raise RunFailed(
                f"round {r}: client {nid} failed ({why}); "
                "use --on-failure renormalize to continue without it"
            )

    def _no_reply(self, failed: dict, r: int) -> None:
        """A round with no valid reply: skipped, unless ``--max-failed-rounds`` such rounds
        in a row end the run."""
        self.failed_rounds += 1
        if self.failed_rounds < self.cfg.max_failed_rounds:
            return
        first = ""
        if failed:  # the first failure's reason: often every client's
            nid, why = next(iter(failed.items()))
            first = f" (client {nid}, partition {self.sizes[nid][0]}: {why})"
        raise RunFailed(
            f"round {r}: no valid client reply in {self.failed_rounds} rounds{first}; "
            "see the log for each client's failure"
        )

    def _stacked(self, message, accepted: list):
        """(update, weights, replied) of the accepted replies for ``close_round``:
        the stacked update (None: no reply), their n_c, and under partial participation
        the mask of the drawn clients that replied."""
        import torch

        from fedhmc.algorithms.federated import stack_updates

        if not accepted:
            return None, None, None
        update = stack_updates([a[2] for a in accepted])
        weights = torch.tensor([a[1] for a in accepted], dtype=torch.float64, device=self.device)
        # The mask of the round's clients (the drawn ones, or all) that replied, by their
        # positions in partition order (not partition ids).
        order = {self.sizes[nid][0]: i for i, nid in enumerate(self.by_partition)}
        got = {order[a[0]] for a in accepted}
        sent = range(len(order)) if message.client_ids is None else message.client_ids.tolist()
        replied = torch.tensor([int(c) in got for c in sent], device=self.device)
        return update, weights, replied

    def state_dict(self) -> dict:
        from fedhmc.runtime import checkpoint

        return {"state": checkpoint.state_dict(self.state), "failed_rounds": self.failed_rounds}

    def load_state_dict(self, saved: dict) -> None:
        from fedhmc.runtime import checkpoint

        self.state = checkpoint.state_from_dict(saved.get("state"), type(self.state), self.device)
        self.failed_rounds = int(saved.get("failed_rounds", 0))

    def summary(self) -> dict:
        return {"late_replies": len(self.exchange.late_replies)}


@dataclass
class Replies:
    """A round's valid replies (partition id, n_c, ClientUpdate), the bytes of every reply,
    and how many were rejected as non-finite."""

    accepted: list = field(default_factory=list)
    bytes_up: int = 0
    nonfinite: int = 0
