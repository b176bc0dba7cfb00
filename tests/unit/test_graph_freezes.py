"""What a CUDA graph freezes, planted in a round and caught on the CPU.

A graph replays the kernels of its capture: a Python number read at capture, a tensor
replaced between rounds, or a round whose Python takes another branch is frozen, and a
read back to the host cannot be captured. Each kind is planted here in a small round
function, and must be caught twice: by the recording stand-in
(``graph_standin.RecordedGraph``), which names it, and by `RoundGraphs` itself, whose
first replay runs on new inputs and is checked against the eager round, so the run keeps
the eager chain and turns the graphs off in one line.
"""

from __future__ import annotations

import pytest
import torch
from graph_standin import FrozenValueError, HostSyncError, RecordedGraph

from fedhmc.core.graphs import RoundGraphs


class Frozen:
    """A round whose Python reads what changes between rounds outside its inputs."""

    def __init__(self):
        self.step = 0.5  # a Python number the round reads
        self.table = torch.arange(4.0)  # a tensor made outside the round
        self.round = 0

    def scalar(self, x):
        return (x * self.step + 1.0,)

    def replaced(self, x):
        return (x + self.table,)

    def refilled(self, x):  # a tensor changed in place: a graph reads it anew
        return (x + self.table,)

    def branch(self, x):
        return ((x * 2.0) if self.round < 3 else (x - 1.0).exp(),)

    def late_sync(self, x):
        if self.round >= 3 and float(x.sum()) > 0:  # reads back to the host
            return (x,)
        return (x * 3.0,)

    def next_round(self, kind):
        self.round += 1
        if kind == "scalar":
            self.step *= 0.5
        elif kind == "replaced":
            self.table = self.table + 1.0
        elif kind == "refilled":
            self.table.add_(1.0)


PLANTED = {
    "scalar": "a scalar changed (",
    "replaced": "a tensor made outside the round was replaced",
    "branch": "call 0 is aten.sub.Tensor, the graph replays aten.mul.Tensor",
    "late_sync": "_local_scalar_dense",
}


def _rounds(kind, graphs, rounds=5):
    state, x, out = Frozen(), torch.linspace(-1.0, 1.0, 4, dtype=torch.float64), []
    for _ in range(rounds):
        state.next_round(kind)
        x = x + 0.25  # new inputs every round
        y = graphs("k", getattr(state, kind), (x,)) if graphs else getattr(state, kind)(x)
        out.append(y[0])
    return out


@pytest.mark.parametrize("kind", list(PLANTED))
def test_the_standin_names_what_a_graph_would_freeze(kind):
    state, x = Frozen(), torch.ones(4, dtype=torch.float64)
    state.round = 1
    graph = RecordedGraph(getattr(state, kind), (x,))
    assert torch.equal(graph.replay((x,))[0], getattr(state, kind)(x)[0])  # nothing changed
    state.round = 2
    state.next_round(kind)
    error = HostSyncError if kind == "late_sync" else FrozenValueError
    with pytest.raises(error, match=PLANTED[kind].replace("(", r"\(")):
        graph.replay((x + 1,))


def test_the_standin_refuses_a_host_sync_at_capture():
    with pytest.raises(HostSyncError, match="reads a value back to the host"):
        RecordedGraph(lambda x: (x * float(x.sum()),), (torch.ones(3),))
    with pytest.raises(HostSyncError, match="boolean mask"):
        RecordedGraph(lambda x: (x[x > 0],), (torch.ones(3),))


def test_the_standin_replays_what_a_graph_computes():
    """Its replay runs the recorded calls, not the Python: a frozen Python number keeps
    its capture's value there (as on a GPU), a tensor changed in place is read anew."""
    state, x = Frozen(), torch.ones(4, dtype=torch.float64)
    graph = RecordedGraph(state.scalar, (x,))
    state.step = 0.25
    graph.static[0].copy_(x)
    assert torch.equal(graph._run_calls()[0], x * 0.5 + 1.0)  # frozen at 0.5
    graph = RecordedGraph(state.refilled, (x,))
    state.table.add_(10.0)
    assert torch.equal(graph.replay((x,))[0], x + state.table)


def test_a_tensor_refilled_in_place_replays():
    """What the round views do (their per-client tensors refilled in place): allowed."""
    eager = _rounds("refilled", None)
    graphs = RoundGraphs(capture=RecordedGraph)
    assert all(torch.equal(a, b) for a, b in zip(eager, _rounds("refilled", graphs), strict=True))
    assert graphs.off is None and graphs.replays == 3


class GraphOnly(RecordedGraph):
    """The stand-in without its Python check: only what a GPU's graph computes."""

    def replay(self, inputs):
        for s, x in zip(self.static, inputs, strict=True):
            s.copy_(x)
        return tuple(o.clone() for o in self._run_calls())


@pytest.mark.parametrize("capture", [RecordedGraph, GraphOnly], ids=["standin", "graph-only"])
@pytest.mark.parametrize("kind", ["scalar", "replaced", "branch"])
def test_the_first_replay_on_new_inputs_catches_a_frozen_value(kind, capture, capsys):
    """RoundGraphs checks a graph's first replay, on the next round's inputs, against the
    eager round: a frozen value differs there, so the graphs go off and the run keeps the
    eager chain (a check on the capture's own inputs would have passed)."""
    eager = _rounds(kind, None)
    graphs = RoundGraphs(capture=capture)
    got = _rounds(kind, graphs)
    assert all(torch.equal(a, b) for a, b in zip(eager, got, strict=True))
    assert graphs.off is not None and graphs.replays == 0
    if capture is GraphOnly:
        assert graphs.off == "a replay differed from the same round computed without it"
    else:
        assert graphs.off.startswith("the first replay failed (FrozenValueError: call ")
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "CUDA graphs are off" in err[0]


def test_a_late_host_sync_turns_the_graphs_off():
    eager = _rounds("late_sync", None)
    graphs = RoundGraphs(capture=RecordedGraph)
    got = _rounds("late_sync", graphs)
    assert all(torch.equal(a, b) for a, b in zip(eager, got, strict=True))
    assert graphs.off.startswith("the first replay failed (HostSyncError: ")
