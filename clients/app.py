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
config to draw its private noise from a seed nobody else knows.
"""

from __future__ import annotations

from fedhmc_clients.task import (
    anchor_step,
    async_gradient,
    client_config,
    local_update,
    num_examples,
)
from flwr.app import Array, ArrayRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp


def _identity(context: Context, run_config: dict | None):
    rc = dict(context.run_config)
    if run_config:
        rc.update(run_config)
    pid = int(context.node_config["partition-id"])
    nparts = int(context.node_config["num-partitions"])
    rc["num-clients"] = nparts
    return client_config(rc), pid


def handle_query(msg: Message, context: Context, run_config: dict | None = None) -> Message:
    cfg, pid = _identity(context, run_config)
    metrics = MetricRecord({"num-examples": num_examples(cfg, pid), "partition-id": pid})
    return Message(RecordDict({"metrics": metrics}), reply_to=msg)


def handle_train(msg: Message, context: Context, run_config: dict | None = None) -> Message:
    cfg, pid = _identity(context, run_config)
    theta_bar = msg.content["arrays"]["theta"].numpy()
    round_config = dict(msg.content["config"])
    seed = context.node_config.get("private-seed")
    arrays = msg.content["arrays"]
    correction, local_grad = None, None
    if round_config.get("algorithm") == "fahmc-debiased":
        sent = "anchor" in arrays
        correction, local_grad = anchor_step(
            cfg,
            pid,
            theta_bar,
            round_config,
            seed,
            arrays["anchor"].numpy() if sent else None,
            arrays["anchor-grad"].numpy() if sent else None,
        )
    theta, n_c, energy, momentum, energy_error = local_update(
        cfg,
        pid,
        theta_bar,
        round_config,
        seed,
        correction,
        momentum=arrays["momentum"].numpy() if "momentum" in arrays else None,
        origin=arrays["origin"].numpy() if "origin" in arrays else None,
    )
    metrics = MetricRecord(
        {
            "num-examples": n_c,
            "partition-id": pid,
            "energy": energy,
            "energy-error": energy_error,
        }
    )
    reply = {"theta": Array(theta)}
    if momentum is not None:
        reply["momentum"] = Array(momentum)
    if local_grad is not None:
        reply["grad"] = Array(local_grad)
    content = RecordDict({"arrays": ArrayRecord(reply), "metrics": metrics})
    return Message(content, reply_to=msg)


def handle_grad(msg: Message, context: Context, run_config: dict | None = None) -> Message:
    cfg, pid = _identity(context, run_config)
    theta = msg.content["arrays"]["theta"].numpy()
    seed = context.node_config.get("private-seed")
    grad, n_c = async_gradient(cfg, pid, theta, dict(msg.content["config"]), seed)
    content = RecordDict(
        {
            "arrays": ArrayRecord({"grad": Array(grad)}),
            "metrics": MetricRecord({"num-examples": n_c, "partition-id": pid}),
        }
    )
    return Message(content, reply_to=msg)


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
