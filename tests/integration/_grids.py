"""A Grid whose nodes are ClientApps in this process: the base of the tests' fake grids.

Subclasses deliver the messages (``send_and_receive``, or ``push_messages`` and
``pull_messages``). Imported by the test modules (pytest puts ``tests/`` on sys.path).
"""

from __future__ import annotations

import uuid

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
