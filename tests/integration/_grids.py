"""A Grid whose nodes are ClientApps in this process: the base of the tests' fake grids.

Subclasses deliver the messages (``send_and_receive``, or ``push_messages`` and
``pull_messages``). Imported by the test modules (pytest puts ``tests/`` on sys.path).
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field

from flwr.app import Context, Message, RecordDict
from flwr.serverapp import Grid
from flwr.supercore.task_identity import TaskIdentity


class LocalGrid(Grid):
    """Nodes 100, 101, … with ``partition-id`` i of ``num-partitions`` in their node config."""

    def __init__(self, client_app, num_nodes: int, run_config: dict):
        TaskIdentity.task_id, TaskIdentity.run_id, TaskIdentity.node_id = 1, 1, 1
        self.client_app = client_app
        self.contexts = {
            100 + i: Context(
                run_id=1,
                node_id=100 + i,
                node_config={"partition-id": i, "num-partitions": num_nodes},
                state=RecordDict(),
                run_config=dict(run_config),
            )
            for i in range(num_nodes)
        }

    def set_run(self, run_):
        pass

    @property
    def run(self):
        return None

    def create_message(self, *args, **kwargs):
        raise NotImplementedError

    def get_node_ids(self):
        return list(self.contexts)

    def push_messages(self, messages):
        raise NotImplementedError

    def pull_messages(self, message_ids):
        raise NotImplementedError

    def send_and_receive(self, messages, *, timeout=None):
        raise NotImplementedError

    @staticmethod
    def stamp(msg: Message) -> str:
        """Give a message the id a real Grid would; returns it."""
        mid = str(uuid.uuid4())
        msg.metadata.__dict__["_message_id"] = mid
        return mid


class InProcessGrid(LocalGrid):
    """A Grid that delivers each pushed message to a ClientApp in this process, node by
    node; ``pull_messages`` returns the replies (a ClientApp returning None: no reply)."""

    def __init__(self, client_app, num_nodes: int, run_config: dict):
        super().__init__(client_app, num_nodes, run_config)
        self.sent: list[Message] = []
        self.replies: dict[str, Message] = {}

    def push_messages(self, messages):
        ids = []
        for msg in messages:
            ids.append(self.stamp(msg))
            self.sent.append(msg)
            reply = self.client_app(msg, self.contexts[msg.metadata.dst_node_id])
            if reply is not None:
                self.replies[ids[-1]] = reply
        return ids

    def pull_messages(self, message_ids):
        return [self.replies.pop(m) for m in list(message_ids) if m in self.replies]


@dataclass
class Traffic:
    """What a Flower run through ``flower_run`` exchanged: the array names of each train
    message and each reply, and what each node kept in its state after each message."""

    sent: list = field(default_factory=list)
    replies: list = field(default_factory=list)
    kept: list = field(default_factory=list)


def flower_run(cfg):
    """``cfg``'s run through the Flower apps on an in-process grid: (result, Traffic)."""
    from fedhmc_clients.app import KEPT_RECORD, make_client_app
    from fedhmc_server.loop import serve

    inner, seen = make_client_app(), Traffic()

    def app(msg, context):
        if msg.has_content() and "arrays" in msg.content:
            seen.sent.append(set(msg.content["arrays"]))
        reply = inner(msg, context)
        if reply.has_content() and "arrays" in reply.content:
            seen.replies.append(set(reply.content["arrays"]))
        seen.kept.append(set(context.state.get(KEPT_RECORD, {})))
        return reply

    grid = InProcessGrid(app, cfg.num_clients, cfg.to_run_config())
    return serve(grid, cfg), seen


def assert_same_chain(engine, flower, columns=("w2", "mean_error", "grad_evals", "clients")):
    """The Flower run gave the engine's chain: θ̄ and ``columns`` of every round to 1e-9."""
    import pytest
    import torch

    torch.testing.assert_close(flower.theta_bar, engine.theta_bar, rtol=0, atol=1e-9)
    assert len(engine.history) == len(flower.history)
    for ra, rb in zip(engine.history, flower.history, strict=True):
        for k in columns:
            assert ra[k] == pytest.approx(rb[k], rel=1e-9, abs=1e-9), k
