"""One round trip to many nodes: push every message, then collect replies as they arrive.

Flower's ``Grid.send_and_receive`` waits a fixed 3 s between pulls on a deployed SuperLink,
which adds up to 3 s to every round. `Exchange` pushes the messages itself and
polls ``pull_messages`` with a short, backing-off interval (5 ms, growing to 100 ms while
nothing arrives), so a round ends as soon as its last reply is in.

A reply that arrives after its round gave up on it (a straggler that was paused, or a
node that came back) is recognised by its ``reply_to`` id, logged and counted, and never
enters an average: the ids of unanswered messages are kept and pulled with the next
rounds' for a while (`LATE_ROUNDS` exchanges), so the SuperLink does not keep the
replies either.
"""

from __future__ import annotations

import logging
import re
import time
from dataclasses import dataclass, field

from flwr.app import Message, RecordDict

log = logging.getLogger("fedhmc.server")

POLL_FIRST_S = 0.005
POLL_MAX_S = 0.1
LATE_ROUNDS = 20

PROCESS_DIED = "its ClientApp's process died"
"""How a reply's failure begins when the client's process ended mid-message (it exited,
crashed, or was killed): Flower's simulation does not restart it, so the run cannot go on."""

_WRAPPED = re.compile(r"<class '([^']*)'>:<'(.*)'>\Z", re.DOTALL)
_DIED = re.compile(r"ActorDiedError|RayActorError|WorkerCrashedError|ActorUnavailableError|"
                   r"NodeDiedError|OutOfMemoryError")  # fmt: skip


def failure_reason(code: int, reason: str) -> str:
    """An error reply's reason on one line: ``error CODE: what happened``, or `PROCESS_DIED`.

    Flower wraps what its runtime caught as ``<class 'T'>:<'message'>``; under the
    simulation T is Ray's (``RayTaskError(ClientAppException)`` around the ClientApp's own
    exception and its remote traceback, ``ActorDiedError`` when the process died). What
    the user needs is the ClientApp's exception, its type and first line, or that the
    process died; the rest (tracebacks, Ray's ids) stays in Flower's log."""
    m = _WRAPPED.match(reason.strip())
    if m is None:
        return f"error {code}: {_first_line(reason)}"
    kind, text = m.group(1), m.group(2)
    if _DIED.search(kind):
        return f"{PROCESS_DIED} ({kind.rsplit('.', 1)[-1]})"
    said = text.partition("occurred. Message: ")[2] if "ClientAppException" in kind else ""
    if said.strip():
        first = _first_line(said)
        raised = re.findall(rf"^([A-Za-z_][\w.]*): {re.escape(first)}$", text, re.MULTILINE)
        raised = [r for r in raised if not r.endswith("ClientAppException")] or ["an exception"]
        return f"error {code}: the ClientApp raised {raised[0]}: {first}"
    return f"error {code}: {kind.rsplit('.', 1)[-1]}: {_first_line(text)}"


def _first_line(text: str, limit: int = 300) -> str:
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    line = lines[0] if lines else "(no reason given)"
    return line if len(line) <= limit else line[: limit - 1] + "…"


@dataclass
class Pending:
    """The messages of one `Exchange.push` whose replies are still to be collected."""

    group: str
    number: int  # the exchange's count when pushed
    start: float  # time.monotonic() of the push
    ids: dict[str, int] = field(default_factory=dict)  # message id → node
    failed: dict[int, str] = field(default_factory=dict)
    unsent: tuple | None = None  # (nodes, messages) for a Grid without push_messages


class Exchange:
    """Round trips over a Grid, with late replies recognised and dropped."""

    def __init__(self, grid):
        self.grid = grid
        self.late: dict[str, tuple[str, int, int]] = {}  # id → (group, node, exchange no.)
        self.late_replies: list[tuple[str, int]] = []  # (group, node) of each late reply
        self.count = 0

    def __call__(
        self,
        contents: dict[int, RecordDict],
        message_type: str,
        group: str,
        timeout: float,
        deadline: float | None = None,
    ) -> tuple[dict[int, Message], dict[int, str]]:
        """Send one message per node; return ({node: reply}, {node: why it failed}).

        ``timeout`` is the hard limit. ``deadline`` (seconds, optional) is the straggler
        deadline: once it has passed and at least one reply is in, the exchange closes
        with what it has, and the missing replies count as late."""
        return self.collect(self.push(contents, message_type, group), timeout, deadline)

    def push(self, contents: dict[int, RecordDict], message_type: str, group: str) -> Pending:
        """Send one message per node and return at once; `collect` waits for the
        replies. The time limits of ``collect`` count from here, so other work (imports,
        loading data) can overlap the round trip."""
        self.count += 1
        msgs = [
            Message(content, dst_node_id=nid, message_type=message_type, group_id=group)
            for nid, content in contents.items()
        ]
        pending = Pending(group, self.count, time.monotonic())
        try:
            ids = list(self.grid.push_messages(msgs))
        except NotImplementedError:  # a Grid with send_and_receive only (e.g. a test double)
            pending.unsent = (list(contents), msgs)
            return pending
        for nid, mid in zip(contents, ids + [None] * (len(msgs) - len(ids)), strict=True):
            if mid:
                pending.ids[str(mid)] = nid
            else:
                pending.failed[nid] = "the SuperLink refused the message"
        return pending

    def collect(
        self, sent: Pending, timeout: float, deadline: float | None = None
    ) -> tuple[dict[int, Message], dict[int, str]]:
        """The replies to the messages of one `push`: ({node: reply}, {node: why it
        failed}); ``timeout`` and ``deadline`` as for a call, counted from the push."""
        if sent.unsent is not None:
            return self._send_and_receive(*sent.unsent, timeout)
        pending, failed = sent.ids, sent.failed
        ok: dict[int, Message] = {}
        hard = sent.start + timeout
        soft = hard if deadline is None else min(hard, sent.start + deadline)
        delay = POLL_FIRST_S
        while pending:
            got = self._pull(pending, ok, failed)
            now = time.monotonic()
            if not pending or now >= hard or (now >= soft and ok):
                break
            delay = POLL_FIRST_S if got else min(delay * 2, POLL_MAX_S)
            wake = soft if now < soft else hard
            time.sleep(max(0.0, min(delay, wake - now)))
        cut = time.monotonic() < hard
        for mid, nid in pending.items():
            failed[nid] = (
                f"no reply within the straggler deadline of {deadline:.1f} s"
                if cut
                else f"no reply within {timeout:g} s"
            )
            self.late[mid] = (sent.group, nid, sent.number)
        for mid, (_, _, n) in list(self.late.items()):
            if self.count - n >= LATE_ROUNDS:
                del self.late[mid]
        return ok, failed

    def _send_and_receive(self, nodes, msgs, timeout):
        replies = list(self.grid.send_and_receive(msgs, timeout=timeout))
        pending = {m.metadata.message_id: nid for nid, m in zip(nodes, msgs, strict=True)}
        ok: dict[int, Message] = {}
        failed: dict[int, str] = {}
        for rep in replies:
            self._take(rep, pending, ok, failed)
        for nid in pending.values():
            failed[nid] = f"no reply within {timeout:g} s"
        return ok, failed

    def _pull(self, pending: dict, ok: dict, failed: dict) -> int:
        replies = list(self.grid.pull_messages([*pending, *self.late]))
        for rep in replies:
            self._take(rep, pending, ok, failed)
        return len(replies)

    def _take(self, rep: Message, pending: dict, ok: dict, failed: dict) -> None:
        """File one reply: this exchange's (ok or failed), a late one (logged), or neither."""
        mid = rep.metadata.reply_to_message_id
        if mid in pending:
            nid = pending.pop(mid)
            if rep.has_error():
                failed[nid] = failure_reason(rep.error.code, rep.error.reason)
            else:
                ok[nid] = rep
        elif mid in self.late:
            group, nid, _ = self.late.pop(mid)
            self.late_replies.append((group, nid))
            what = "error" if rep.has_error() else "reply"
            log.warning(
                "late %s from client %s to message group %s ignored (it timed out)",
                what,
                nid,
                group,
            )
