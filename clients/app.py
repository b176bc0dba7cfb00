"""The FA-HMC ClientApp: decode the round's message, run T local iterations, reply.

Message contract (see ``fedhmc_server.loop``):

- ``query`` → reply ``metrics``: ``num-examples`` (n_c) and ``partition-id``;
- ``train`` with ``arrays["theta"]`` (θ̄, chains × d) and ``config`` (round, round-seed,
  num-examples-total, sampler settings) → reply ``arrays["theta"]`` (this client's new
  positions) and ``metrics``: ``num-examples``, ``partition-id``, ``energy``,
  ``energy-error``.
- with ``sync-unit = leapfrog``, ``train`` also carries ``arrays["momentum"]`` (the averaged
  momentum) when the round continues a trajectory, and ``arrays["origin"]`` (X₀) under
  ``restart-trajectories``; the reply adds ``arrays["momentum"]``, this client's end momentum.
- for ``algorithm = fahmc-debiased``, ``train`` also carries, from round 2 on,
  ``arrays["anchor"]`` (θ_a) and ``arrays["anchor-grad"]`` (∇f(θ_a)) with
  ``config["anchor-round"]``; the reply adds ``arrays["grad"]``, the client's local
  gradient at the θ̄ it was sent.
- ``query.grad`` (``algorithm = async-sghmc`` or ``async-sgld``) with ``arrays["theta"]``
  (one chain's θ, d) and ``config`` (chain, request counter, n, batch size, prior, gradient
  noise) → reply ``arrays["grad"]`` (∇f̃^(c)(θ), d) and ``metrics``: ``num-examples``,
  ``partition-id``.

``partition-id`` and ``num-partitions`` come from ``context.node_config``; the dataset,
partitioner, α and seed from the run config. A node may set ``private-seed`` in its node
config to draw its private noise from a seed nobody else knows, ``device`` to compute on
a device of its own (``cuda``, ``cuda:1``, ``cpu``) instead of the run's, and
``worker-socket`` to have its warm worker (`fedhmc_clients.worker`) compute; the
computation itself is `fedhmc_clients.compute.compute` either way.

A user's error on this node (a ``device`` it does not have, data that differ from the
server's, a ``--model`` factory or forward pass that raises: ``fedhmc.errors.ModelError``)
is logged in one line and sent back as the reply's error, with no traceback.
"""

from __future__ import annotations

import logging

from fedhmc_clients.worker import WarmWorkerError, call
from flwr.app import Array, ArrayRecord, Context, Error, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp

# Flower starts a ClientApp process for every message: what it imports is paid each round.
# It imports neither PyTorch nor fedhmc.runtime (seconds); the warm worker computes.
from fedhmc.algorithms.api import KEPT
from fedhmc.errors import MODEL_ERROR_CODE, FedHMCError, ModelError

log = logging.getLogger("fedhmc.client")
CLIENT_APP_RAISED_EXCEPTION = 2
"""Flower's error code for a ClientApp that raised (``flwr.common.constant.ErrorCode``)."""


def handle(kind: str, msg: Message, context: Context, run_config: dict | None = None) -> Message:
    """Decode ``msg``, compute (in the node's warm worker when it has one, else here), and
    encode the reply. Only the in-process path imports torch."""
    rc = dict(context.run_config)
    if run_config:
        rc.update(run_config)
    nc = dict(context.node_config)
    arrays = (
        {k: v.numpy() for k, v in msg.content["arrays"].items()} if "arrays" in msg.content else {}
    )
    config = dict(msg.content["config"]) if "config" in msg.content else {}
    if kind == "train":  # what this client kept of its last round, from its node state
        arrays.update(_kept(context))
    try:
        out, metrics = _compute(kind, rc, nc, config, arrays)
    except FedHMCError as e:  # one line here and in the server's log
        log.error("partition %s: %s", nc.get("partition-id"), e)
        code = MODEL_ERROR_CODE if isinstance(e, ModelError) else CLIENT_APP_RAISED_EXCEPTION
        return Message(Error(code=code, reason=str(e)), reply_to=msg)
    if kind == "train":  # what it keeps of this round stays in its node state, unsent
        _keep(context, {k: out.pop(k) for k in [k for k in out if k.startswith(KEPT)]})
    content = {"metrics": MetricRecord(dict(metrics))}
    if out or kind != "query":
        content["arrays"] = ArrayRecord({k: Array(v) for k, v in out.items()})
    return Message(RecordDict(content), reply_to=msg)


KEPT_RECORD = "fedhmc-kept"
"""The node-state record of what a client keeps between rounds (``KEPT`` arrays)."""


def _kept(context: Context) -> dict:
    """What this node kept of its last round (``KEPT`` arrays), from its state."""
    record = context.state.get(KEPT_RECORD) if KEPT_RECORD in context.state else None
    return {} if record is None else {KEPT + k: v.numpy() for k, v in record.items()}


def _keep(context: Context, arrays: dict) -> None:
    """Store ``arrays`` (``KEPT`` arrays) in this node's state, each in place of the one of
    its name; what the round did not change stays."""
    if not arrays:
        return
    old = context.state.get(KEPT_RECORD) if KEPT_RECORD in context.state else None
    kept = {} if old is None else dict(old.items())
    kept.update({k[len(KEPT) :]: Array(v) for k, v in arrays.items()})
    context.state[KEPT_RECORD] = ArrayRecord(kept)


def _compute(kind: str, rc: dict, nc: dict, config: dict, arrays: dict):
    """(arrays, metrics) from the node's warm worker if it has one, else computed here."""
    sock = nc.get("worker-socket")
    if sock:
        try:
            return call(str(sock), kind, rc, nc, config, arrays)
        except WarmWorkerError as e:
            log.warning("%s; computing in this process instead", e)
    from fedhmc_clients.compute import compute  # torch: only when computing here

    return compute(kind, rc, nc, config, arrays)


def handle_query(msg: Message, context: Context, run_config: dict | None = None) -> Message:
    return handle("query", msg, context, run_config)


def handle_train(msg: Message, context: Context, run_config: dict | None = None) -> Message:
    return handle("train", msg, context, run_config)


def handle_grad(msg: Message, context: Context, run_config: dict | None = None) -> Message:
    return handle("grad", msg, context, run_config)


def make_client_app(run_config: dict | None = None) -> ClientApp:
    """A ClientApp whose run config is ``run_config`` over the context's (for simulation,
    where Flower's in-process runner passes no run config)."""
    client = ClientApp()

    @client.query()
    def query(msg: Message, context: Context) -> Message:
        return handle_query(msg, context, run_config)

    @client.train()
    def train(msg: Message, context: Context) -> Message:
        return handle_train(msg, context, run_config)

    @client.query("grad")
    def grad(msg: Message, context: Context) -> Message:
        return handle_grad(msg, context, run_config)

    return client


app = make_client_app()
