"""The echo ServerApp: one query round trip (start-up), then ``rounds`` train round trips
of θ-sized arrays with fedhmc's own exchange; writes a JSON line per round to ``out``."""

import json
import time

import numpy as np
from fedhmc_server.exchange import Exchange
from flwr.app import Array, ArrayRecord, Context, MessageType, RecordDict
from flwr.serverapp import Grid, ServerApp

app = ServerApp()


@app.main()
def main(grid: Grid, context: Context) -> None:
    rc = context.run_config
    n, rounds, out = int(rc["num-clients"]), int(rc["rounds"]), str(rc["out"])
    while len(grid.get_node_ids()) < n:
        time.sleep(0.05)
    nodes = sorted(grid.get_node_ids())
    exchange = Exchange(grid)
    theta = np.zeros((1, int(rc["dim"])), np.float32)
    with open(out, "w") as f:
        ok, _ = exchange({nid: RecordDict() for nid in nodes}, MessageType.QUERY, "q", 600)
        f.write(json.dumps({"round": 0, "t": time.time(), "replies": len(ok)}) + "\n")
        f.flush()
        for r in range(1, rounds + 1):
            content = {
                nid: RecordDict({"arrays": ArrayRecord({"theta": Array(theta)})}) for nid in nodes
            }
            ok, _ = exchange(content, MessageType.TRAIN, str(r), 600)
            f.write(json.dumps({"round": r, "t": time.time(), "replies": len(ok)}) + "\n")
            f.flush()
