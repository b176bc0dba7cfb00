"""The FA-HMC server: broadcast θ̄, collect the clients' positions, average, evaluate.

Each round it asks the algorithm (``fahmc`` or ``debiased``) for the round's Broadcast,
sends it to every client as one message (θ̄ and what the round carries as an ArrayRecord;
the round, the round seed and the sampler settings as a ConfigRecord), validates the replies
(``fedhmc.core.aggregate.validate_reply``), stacks them in partition order and hands them
to the algorithm's ``server_update``, which averages with weights n_c renormalised over the
clients that replied: the function the engine's ``step`` ends with. The loop between rounds
(sample collection, metrics, files) is the engine's own ``run_loop``, so the output files
are the same.

The server computes on the run's device (``--device``): its evaluator, θ̄ and the
algorithm's state live there, every reply is moved there before the average, and what
goes on the wire is brought to the CPU first.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING

from fedhmc_server.startup import Started, begin, query_sizes, wait_for_nodes
from flwr.app import Array, ArrayRecord, ConfigRecord, MessageType, RecordDict
from flwr.serverapp import Grid

from fedhmc.errors import FedHMCError, ModelError
from fedhmc.runtime.config import RunConfig

if TYPE_CHECKING:
    import torch

    from fedhmc.runtime.engine import RoundStats, RunResult

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


def serve(
    grid: Grid,
    cfg: RunConfig,
    progress: bool = False,
    on_round=None,
    started: Started | None = None,
) -> RunResult:
    """Run FA-HMC over the grid's clients and write the run's files; the ServerApp's body.

    ``started`` is the run's `fedhmc_server.startup.begin` when the caller already
    sent the size query (the ServerApp does, before its heavy imports)."""
    cfg = cfg.resolve()
    if started is None:
        started = begin(
            grid, cfg.min_clients or cfg.num_clients, cfg.node_wait_timeout, cfg.round_timeout
        )
    # The heavy part, while the size query is in flight.
    import torch

    from fedhmc.algorithms import registry
    from fedhmc.algorithms.fahmc import ClientUpdate, stack_updates
    from fedhmc.core import participation
    from fedhmc.core.aggregate import ReplyError, validate_reply
    from fedhmc.runtime import checkpoint, wire
    from fedhmc.runtime.engine import RoundStats, prepare, run_loop
    from fedhmc.runtime.problem import build_evaluator, initial_position, torch_dtype

    cfg = prepare(cfg)
    device = torch.device(cfg.device)
    evaluator, model, dim, description = build_evaluator(cfg, device)
    exchange = started.exchange
    sizes = started.sizes()
    num_total = sum(n for _, n in sizes.values())
    # The clients' weights in partition order, as the engine's target holds them: under
    # partial participation the round's clients are drawn from these.
    by_partition = sorted(sizes, key=lambda nid: sizes[nid][0])
    counts = [sizes[nid][1] for nid in by_partition]
    client_weights = torch.tensor(counts, dtype=torch.float64, device=device) / num_total
    algorithm, settings = registry.algorithm_of(cfg)  # fahmc or debiased: the same interface
    dtype = torch_dtype(cfg)
    shape = (cfg.chains, dim)
    failed_rounds = 0
    anchored = registry.entry(cfg.algorithm).anchor  # debiased FA-HMC: + ∇f at the anchor
    keys = registry.entry(cfg.algorithm).reply  # what a client's reply carries
    if settings.leapfrog_sync:
        keys = (*keys, "momentum")
    theta0 = initial_position(model, dim, cfg, device=device)
    state = algorithm.init(theta0, settings)
    durations: list[float] = []  # of the complete rounds so far

    def straggler_deadline() -> float | None:
        """factor × the median of the last 10 complete rounds, at least the floor; None
        before any complete round or when off."""
        if cfg.straggler_factor <= 0 or not durations:
            return None
        recent = sorted(durations[-10:])
        median = recent[len(recent) // 2]
        return max(cfg.straggler_floor, cfg.straggler_factor * median)

    def round_fn(theta_bar: torch.Tensor, r: int) -> tuple[torch.Tensor, RoundStats]:
        nonlocal failed_rounds, state
        message = algorithm.broadcast(cfg.seed, state, settings, client_weights)
        values, tensors = wire.encode_message(cfg, message, num_total)
        config = ConfigRecord(values)
        arrays = ArrayRecord({k: Array(v.detach().cpu().numpy()) for k, v in tensors.items()})
        drawn = by_partition
        if message.clients is not None:  # partial participation: only the drawn nodes
            drawn = [by_partition[int(i)] for i in message.clients]
        content = {nid: RecordDict({"arrays": arrays, "config": config}) for nid in drawn}
        bytes_down = sum(_record_bytes(c) for c in content.values())
        t0 = time.monotonic()
        ok, failed = exchange(
            content, MessageType.TRAIN, str(r), cfg.round_timeout, straggler_deadline()
        )
        if not failed:  # a complete round: what the straggler deadline is measured on
            durations.append(time.monotonic() - t0)
        accepted, bytes_up, nonfinite, energy_errors = [], 0, 0, []
        for nid, rep in ok.items():
            bytes_up += _record_bytes(rep.content)
            pid, assigned = sizes[nid]
            try:
                m = rep.content["metrics"]
                arrs = {k: v.numpy() for k, v in rep.content["arrays"].items()}
                got = validate_reply(
                    arrs,
                    _as_int(m.get("num-examples")),
                    shape=shape,
                    dtype=dtype,
                    max_examples=assigned,
                    keys=keys,
                )
            except (ReplyError, KeyError, TypeError, ValueError) as e:
                failed[nid] = f"rejected reply: {e}"
                nonfinite += "non-finite" in str(e)
                continue

            rows = {k: torch.as_tensor(v, device=device).unsqueeze(1) for k, v in got.items()}
            update = ClientUpdate(
                rows["theta"], momentum=rows.get("momentum"), local_grad=rows.get("grad")
            )
            accepted.append((pid, int(m["num-examples"]), update))
            de = m.get("energy-error")
            if isinstance(de, (int, float)):
                energy_errors.append((pid, float(de)))
        # The user's module failed (its error code): every round would fail alike.
        model_failed = f"error {wire.MODEL_ERROR_CODE}: "
        for why in failed.values():
            if why.startswith(model_failed):
                raise ModelError(f"round {r}: on a client, {why[len(model_failed) :]}")
        for nid, why in failed.items():
            log.warning("round %d: client %s (partition %s) failed: %s", r, nid, sizes[nid][0], why)
        if failed and cfg.on_failure == "stop":
            nid, why = next(iter(failed.items()))
            raise FedHMCError(
                f"round {r}: client {nid} failed ({why}); "
                "use --on-failure renormalize to continue without it"
            )
        evals = settings.evals_in_round(r) + (1 if anchored else 0)
        stats = RoundStats(
            grad_evals=len(accepted) * evals * cfg.chains,
            finite=True,
            clients=len(accepted),
            failed=len(failed),
            bytes_down=bytes_down,
            bytes_up=bytes_up,
        )
        if energy_errors:
            energy_errors.sort()
            stats.energy_error = sum(e for _, e in energy_errors) / len(energy_errors)
        if not accepted:
            if nonfinite == len(drawn):  # every client diverged: that is the chain diverging
                stats.finite = False
                return theta_bar, stats
            failed_rounds += 1
            if failed_rounds >= cfg.max_failed_rounds:
                first = ""
                if failed:  # the first failure's reason: often every client's
                    nid, why = next(iter(failed.items()))
                    first = f" (client {nid}, partition {sizes[nid][0]}: {why})"
                raise FedHMCError(
                    f"round {r}: no valid client reply in {failed_rounds} rounds{first}; "
                    "see the log for each client's failure"
                )
            state = algorithm.skip(state, settings)
            return state.position, stats
        accepted.sort(key=lambda a: a[0])  # partition order, as the engine sums
        update = stack_updates([a[2] for a in accepted])
        if message.clients is None:
            weights = torch.tensor([a[1] for a in accepted], dtype=torch.float64, device=device)
            state, _ = algorithm.server_update(state, update, weights, settings)
        else:  # the scheme's coefficients, rescaled over the drawn clients that replied
            replied = {a[0] for a in accepted}
            kept = torch.tensor([int(c) in replied for c in message.clients], device=device)
            coefficients = participation.renormalized(message.coefficients, kept)
            state, _ = algorithm.server_update(state, update, coefficients, settings, exact=True)
        return state.position, stats

    def get_state() -> dict:
        return {"state": checkpoint.state_dict(state), "failed_rounds": failed_rounds}

    def set_state(saved: dict) -> None:
        nonlocal state, failed_rounds
        state = checkpoint.state_from_dict(saved.get("state"), type(state), device)
        failed_rounds = int(saved.get("failed_rounds", 0))

    return run_loop(
        cfg,
        evaluator,
        theta0,
        round_fn,
        backend_state=(get_state, set_state),
        summary_extra=lambda: {"late_replies": len(exchange.late_replies)},
        dim=dim,
        num_clients=len(sizes),
        description=description,
        backend="flower",
        progress=progress,
        on_round=on_round,
    )
