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


@pytest.mark.parametrize(
    "fn, why",
    [
        (lambda x: (x * float(x.sum()),), "reads a value back to the host"),
        (lambda x: (x[x > 0],), "boolean mask"),
        (lambda x: (x * max(x.tolist()),), "tolist"),
        (lambda x: (x + x.cpu(),), "copies the tensor to the host"),
        (lambda x: (x * x.numpy().sum(),), "numpy"),
    ],
    ids=["float", "mask", "tolist", "cpu", "numpy"],
)
def test_the_standin_refuses_a_host_sync_at_capture(fn, why):
    """Reads back to the host, including those the CPU makes without an ATen call."""
    with pytest.raises(HostSyncError, match=why):
        RecordedGraph(fn, (torch.ones(3),))


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
        assert graphs.off.startswith("a replay failed (FrozenValueError: call ")
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "CUDA graphs are off" in err[0]


def test_a_late_host_sync_turns_the_graphs_off():
    eager = _rounds("late_sync", None)
    graphs = RoundGraphs(capture=RecordedGraph)
    got = _rounds("late_sync", graphs)
    assert all(torch.equal(a, b) for a, b in zip(eager, got, strict=True))
    assert graphs.off.startswith("a replay failed (HostSyncError: ")


def test_a_value_that_changes_late_is_caught():
    """A value that first changes after the first replay: the stand-in names it at the
    replay where it would be frozen, and the run keeps the eager chain."""

    class Late(Frozen):
        def next_round(self, kind):
            self.round += 1
            if self.round == 6:
                self.step = 0.125

    def rounds(graphs):
        state, x, out = Late(), torch.ones(3, dtype=torch.float64), []
        for _ in range(8):
            state.next_round("scalar")
            x = x + 0.5
            out.append(graphs("k", state.scalar, (x,))[0] if graphs else state.scalar(x)[0])
        return out

    graphs = RoundGraphs(capture=RecordedGraph)
    assert all(torch.equal(a, b) for a, b in zip(rounds(None), rounds(graphs), strict=True))
    assert graphs.off.startswith("a replay failed (FrozenValueError: ") and graphs.replays == 3


def test_replays_are_checked_again_at_powers_of_two():
    """Without the stand-in's own check (a GPU's graph), a value frozen at a later change is
    caught at the next checked replay (the 1st, 2nd, 4th, 8th, … of its kind): after it
    the run is eager again."""
    checked = []

    class Counting(GraphOnly):
        def replay(self, inputs):
            checked.append(inputs[0].clone())
            return super().replay(inputs)

    state, x = Frozen(), torch.ones(3, dtype=torch.float64)
    graphs = RoundGraphs(capture=Counting)
    for r in range(1, 13):
        x = x + 0.5
        if r == 9:
            state.step = 0.125  # changes between the 4th (round 6) and 8th (round 10) replays
        got = graphs("k", state.scalar, (x,))[0]
        if r >= 10:
            assert torch.equal(got, state.scalar(x)[0])
    assert graphs.off == "a replay differed from the same round computed without it"
    assert graphs.replays == 7  # rounds 3–9 (round 9's replay was frozen: not checked)


def test_a_failing_later_replay_runs_the_round_eagerly(capsys):
    class FailsAtFour(GraphOnly):
        calls = 0

        def replay(self, inputs):
            FailsAtFour.calls += 1
            if FailsAtFour.calls == 3:
                raise RuntimeError("CUDA error: an illegal memory access was encountered")
            return super().replay(inputs)

    graphs = RoundGraphs(capture=FailsAtFour)
    x = torch.ones(2, dtype=torch.float64)
    out = [graphs("k", lambda t: (t * 2.0,), (x + k,))[0] for k in range(6)]
    assert all(torch.equal(o, (x + k) * 2.0) for k, o in enumerate(out))
    assert graphs.off == (
        "a replay failed (RuntimeError: CUDA error: an illegal memory access was encountered)"
    )
    assert graphs.replays == 2 and "CUDA graphs are off" in capsys.readouterr().err


def test_an_output_that_the_replay_overwrites_is_not_compared_with_itself():
    """A round whose output lies in a buffer made outside it, which a replay overwrites:
    the eager result is copied before the replay, so the check sees the difference."""
    buffer = torch.zeros(3, dtype=torch.float64)
    step = [0.5]

    def fn(x):
        return (torch.mul(x, step[0], out=buffer),)

    graphs = RoundGraphs(capture=GraphOnly)
    x = torch.ones(3, dtype=torch.float64)
    for k in range(4):
        step[0] = 0.5 if k < 2 else 0.25
        graphs("k", fn, (x + k,))
    assert graphs.off == "a replay differed from the same round computed without it"
