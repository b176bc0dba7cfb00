"""The SuperNode's fork launcher (``deploy/supernode.sh --launcher fork``, the default):
every message still runs in a ClientApp process of its own, forked from a process that
never ran one, so nothing one message leaves in memory reaches the next, while what a node
keeps in its node state persists from round to round."""

from __future__ import annotations

import json
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "deploy"))
from loopback import Deployment, missing_tools, processes, wait_until  # noqa: E402

MISSING = missing_tools()

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(sys.platform == "win32", reason="the deploy scripts are bash scripts"),
    pytest.mark.skipif(bool(MISSING), reason=f"not found on PATH: {', '.join(MISSING)}"),
]

CLIENT = """
import os

from flwr.app import ConfigRecord, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp

app = ClientApp()
CALLS = [0]  # this process's messages: 1 in a fresh process


@app.train()
def train(msg: Message, context) -> Message:
    CALLS[0] += 1
    kept = context.state["kept"]["n"] if "kept" in context.state else 0
    context.state["kept"] = ConfigRecord({"n": kept + 1})
    out = {"pid": os.getpid(), "ppid": os.getppid(), "calls": CALLS[0], "kept": kept + 1}
    return Message(RecordDict({"metrics": MetricRecord(out)}), reply_to=msg)
"""

SERVER = """
import json
import time

from flwr.app import Context, Message, MessageType, RecordDict
from flwr.serverapp import Grid, ServerApp

app = ServerApp()


@app.main()
def main(grid: Grid, context: Context) -> None:
    rc = context.run_config
    while len(grid.get_node_ids()) < 2:
        time.sleep(0.05)
    with open(str(rc["out"]), "w") as f:
        for r in range(1, int(rc["rounds"]) + 1):
            msgs = [Message(RecordDict(), dst_node_id=nid, message_type=MessageType.TRAIN,
                            group_id=str(r)) for nid in sorted(grid.get_node_ids())]
            for rep in grid.send_and_receive(msgs, timeout=120):
                row = dict(rep.content["metrics"]) if rep.has_content() else {"error": 1}
                row.update(node=rep.metadata.src_node_id, round=r)
                f.write(json.dumps(row) + "\\n")
                f.flush()
"""

PYPROJECT = """
[build-system]
requires = ["setuptools>=77"]
build-backend = "setuptools.build_meta"

[project]
name = "fedhmc-probe"
version = "1.0.0"
requires-python = ">=3.10"
dependencies = ["flwr>=1.41,<1.42"]

[tool.flwr.app]
publisher = "fedhmc"

[tool.flwr.app.components]
serverapp = "probe_server:app"
clientapp = "probe_client:app"

[tool.flwr.app.config]
rounds = 3
out = ""
"""


def test_each_message_runs_in_a_fresh_process_and_the_node_state_persists(tmp_path):
    app = tmp_path / "probe"
    app.mkdir()
    (app / "probe_client.py").write_text(CLIENT)
    (app / "probe_server.py").write_text(textwrap.dedent(SERVER))
    (app / "pyproject.toml").write_text(PYPROJECT)
    out = tmp_path / "rows.jsonl"
    dep = Deployment(tmp_path / "dep", num_nodes=2, conn="fedhmc-test-launcher")
    try:
        dep.setup()
        dep.start_nodes()
        launchers = [p for i in range(2) for p in dep.pids(f"client{i}")[:-1]]
        proc = dep.submit(f'rounds=3 out="{out}"', tmp_path / "flwr.log", app=app)
        wait_until(lambda: out.exists() and len(out.read_text().splitlines()) >= 6, 300,
                   "the probe's 3 rounds")  # fmt: skip
        proc.wait(timeout=60)
        names = {pid: cmd for pid, (_, _, cmd) in processes().items()}
    finally:
        left = dep.stop_all()
    assert not left, f"processes left running: {left}"
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(rows) == 6 and not any("error" in r for r in rows), rows
    assert all(r["calls"] == 1 for r in rows), rows  # a fresh process for every message
    assert len({r["pid"] for r in rows}) == 6, rows
    for node in {r["node"] for r in rows}:  # the node state: 1, 2, 3 from round to round
        assert [r["kept"] for r in rows if r["node"] == node] == [1, 2, 3], rows
    servers = {r["ppid"] for r in rows}  # forked by each node's fork server
    assert len(servers) == 2, rows
    assert all("fedhmc_clients.launcher" in names.get(s, "") for s in servers), servers
    assert len(launchers) >= 2  # (worker and launcher lines in the pid files)
