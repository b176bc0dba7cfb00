"""`CudaGraph` against a stand-in for `torch.cuda` that keeps the current device and
stream: the run's device is current for warm-up, capture and replay, streams are made on
it, a capture that records nothing is refused, and a failed capture gives back the stream
that was current and synchronises before the round runs eagerly."""

from __future__ import annotations

import contextlib
import warnings

import pytest
import torch

from fedhmc.core.graphs import EMPTY_GRAPH, CudaGraph, EmptyGraphError, RoundGraphs


class FakeStream:
    def __init__(self, cuda, device):
        self.cuda, self.device = cuda, device

    def wait_stream(self, other):
        assert other.device == self.device, "streams of two devices"


class FakeGraph:
    def __init__(self, cuda):
        self.cuda = cuda

    def capture_begin(self):
        self.cuda.log("capture_begin")
        self.cuda.capturing = True

    def capture_end(self):
        self.cuda.log("capture_end")
        was, self.cuda.capturing = self.cuda.capturing, False
        if self.cuda.fail_end:
            raise RuntimeError("CUDA error: operation failed due to an error during capture")
        if self.cuda.kernels == 0 and was:
            warnings.warn(f"{EMPTY_GRAPH}. (wrong device or stream)", stacklevel=2)

    def replay(self):
        self.cuda.log("replay")


class FakeCuda:
    """What CudaGraph calls of torch.cuda, on a machine whose current device is 0."""

    def __init__(self):
        self.current = 0
        self.default = {}
        self.streams = {}
        self.events = []
        self.capturing = False
        self.kernels = 1
        self.fail_end = False

    def log(self, what):
        self.events.append((what, self.current, self.current_stream(self.current)))

    @contextlib.contextmanager
    def device(self, device):
        before, self.current = self.current, torch.device(device).index
        try:
            yield
        finally:
            self.current = before

    def Stream(self, device):  # noqa: N802 - torch.cuda's name
        return FakeStream(self, torch.device(device).index)

    def current_stream(self, device=None):
        index = self.current if device is None else torch.device("cuda", _index(device)).index
        return self.streams.get(index) or self.default.setdefault(index, FakeStream(self, index))

    def set_stream(self, stream):
        self.streams[stream.device] = stream

    @contextlib.contextmanager
    def stream(self, stream):
        before = self.current_stream(stream.device)
        self.set_stream(stream)
        try:
            yield
        finally:
            self.set_stream(before)

    def CUDAGraph(self):  # noqa: N802
        return FakeGraph(self)

    def synchronize(self, device=None):
        self.log("synchronize")


def _index(device):
    return device if isinstance(device, int) else torch.device(device).index


CUDA1 = torch.device("cuda", 1)


def _round(cuda):
    def fn(x):
        cuda.log("fn")
        return (x * 2.0,)

    return fn


def test_the_runs_device_is_current_for_warm_up_capture_and_replay():
    cuda = FakeCuda()
    x = torch.ones(3)
    graph = CudaGraph(_round(cuda), (x,), CUDA1, cuda=cuda)
    graph.replay((x + 1,))
    assert cuda.current == 0  # given back
    assert [e[0] for e in cuda.events] == [
        "fn", "synchronize", "capture_begin", "fn", "capture_end", "synchronize", "replay",
    ]  # fmt: skip
    assert all(device == 1 for _, device, _ in cuda.events), cuda.events
    side = cuda.events[0][2]
    assert side.device == 1 and side is not cuda.default[1]  # a side stream of cuda:1
    assert cuda.events[3][2] is side  # captured on it
    assert cuda.current_stream(1) is cuda.default[1]  # and the default stream is back


def test_an_empty_capture_is_refused_in_one_line(capsys):
    cuda = FakeCuda()
    cuda.kernels = 0
    with pytest.raises(EmptyGraphError, match="recorded no kernel on cuda:1"):
        CudaGraph(_round(cuda), (torch.ones(2),), CUDA1, cuda=cuda)

    def capture(fn, inputs, device):
        return CudaGraph(fn, inputs, device, cuda=cuda)

    graphs = RoundGraphs(capture=capture, device=CUDA1)
    x = torch.ones(2)
    for _ in range(4):
        assert torch.equal(graphs("k", lambda t: (t * 2,), (x,))[0], x * 2)
    assert (
        graphs.off == "capture failed (EmptyGraphError: the capture recorded no kernel on cuda:1)"
    )
    assert graphs.replays == 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "CUDA graphs are off" in err[0]


@pytest.mark.parametrize("end_fails", [False, True], ids=["round-fails", "end-fails-too"])
def test_a_failed_capture_gives_back_the_stream_and_synchronises(end_fails, capsys):
    cuda = FakeCuda()
    cuda.fail_end = end_fails

    def fn(x):
        if cuda.capturing:
            raise RuntimeError("operation not permitted when stream is capturing")
        return (x + 1.0,)

    graphs = RoundGraphs(capture=lambda f, i, d: CudaGraph(f, i, d, cuda=cuda), device=CUDA1)
    x = torch.zeros(2)
    graphs("k", fn, (x,))
    assert torch.equal(graphs("k", fn, (x,))[0], x + 1.0)  # the eager round
    assert graphs.off == (
        "capture failed (RuntimeError: operation not permitted when stream is capturing)"
    )
    assert cuda.current_stream(1) is cuda.default[1] and cuda.current == 0
    assert [e[0] for e in cuda.events][-2:] == ["capture_end", "synchronize"]
    assert torch.equal(graphs("k", fn, (x + 1,))[0], x + 2.0)  # eager from then on
    assert "CUDA graphs are off" in capsys.readouterr().err


def test_round_graphs_capture_on_the_runs_device():
    seen = []

    def capture(fn, inputs, device):
        seen.append(device)
        raise RuntimeError("stop")

    graphs = RoundGraphs(capture=capture, device="cuda:1")
    for _ in range(2):
        graphs("k", lambda t: (t,), (torch.ones(1),))
    assert seen == [CUDA1]


def test_a_run_on_cuda_n_gives_its_graphs_that_device():
    from fedhmc.runtime.config import RunConfig
    from fedhmc.runtime.problem import _replayed

    class Target:
        graphs = None

    cfg = RunConfig(device="cpu").resolve()
    object.__setattr__(cfg, "cuda_graphs", True)  # (a CUDA run's setting, on this CPU)
    object.__setattr__(cfg, "device", "cuda:1")
    assert _replayed(cfg, Target()).graphs.device == CUDA1


def test_a_graph_keeps_alive_what_its_round_read():
    """A replay reads the memory of the tensors made outside the round (the data, the
    clients' sizes): the graph keeps them, even after the round's owner drops them; the
    round's own intermediates are not kept."""
    import gc
    import weakref

    cuda = FakeCuda()
    holder = {"table": torch.arange(4.0)}
    made = []

    def fn(x):
        y = x * 2.0
        made.append(weakref.ref(y))
        return (y + holder["table"],)

    graph = CudaGraph(fn, (torch.ones(4),), CUDA1, cuda=cuda)
    table = weakref.ref(holder.pop("table"))
    gc.collect()
    assert table() is not None and any(t is table() for t in graph.read)
    assert all(ref() is None or all(ref() is not t for t in graph.read) for ref in made)


def test_a_replay_on_inputs_of_another_shape_is_refused(capsys):
    cuda = FakeCuda()
    graphs = RoundGraphs(capture=lambda f, i, d: CudaGraph(f, i, d, cuda=cuda), device=CUDA1)
    double = lambda t: (t * 2.0,)  # noqa: E731
    for _ in range(2):
        graphs("k", double, (torch.ones(3),))
    assert torch.equal(graphs("k", double, (torch.ones(2, 3),))[0], torch.full((2, 3), 2.0))
    assert graphs.off == "a replay failed (ValueError: a replay's inputs differ in shape or type)"


def test_a_cuda_run_sets_the_deterministic_switches():
    from fedhmc.core import determinism

    before = determinism.switches()
    flags = determinism._precision_flags()
    saved = {k: v.fp32_precision for k, v in flags.items()}
    try:
        determinism.deterministic_cuda("cpu")
        assert determinism.switches() == before  # the CPU needs none
        determinism.deterministic_cuda("cuda:0")
        got = determinism.switches()
        assert got["cudnn.deterministic"] and not got["cudnn.benchmark"]
        tf32 = {k: v for k, v in got.items() if "tf32" in k or "precision" in k}
        assert tf32 and all(v in (False, "ieee") for v in tf32.values()), tf32
    finally:
        torch.backends.cudnn.deterministic = before["cudnn.deterministic"]
        torch.backends.cudnn.benchmark = before["cudnn.benchmark"]
        for k, v in saved.items():
            flags[k].fp32_precision = v


@pytest.mark.parametrize("model", ["logistic", "cnn"])
def test_a_rounds_capture_keeps_the_clients_data(model):
    """FA-HMC's round captured under the keeping mode (vmap, the generic module path): it
    runs, and what it keeps includes the clients' data."""
    from fedhmc.algorithms import fahmc
    from fedhmc.runtime.config import RunConfig
    from fedhmc.runtime.problem import build_problem, initial_position

    cfg = RunConfig(
        dataset="digits", model=model, num_clients=3, batch_size=8, local_steps=1,
        leapfrog_steps=2, chains=2, dtype="float64",
    ).resolve()  # fmt: skip
    problem = build_problem(cfg)
    theta = initial_position(problem.model, problem.dim, cfg)
    settings = fahmc.Settings(step_size=0.01, leapfrog_steps=2, local_steps=1)
    state = fahmc.init(theta, settings)
    message = fahmc.broadcast(cfg.seed, state, settings)
    seeds = fahmc.client_seeds(cfg.seed, 3)
    seen = {}

    class Capture:
        def __call__(self, fn, inputs, device):
            seen["graph"] = CudaGraph(fn, inputs, CUDA1, cuda=FakeCuda())
            raise RuntimeError("captured")

    problem.target.graphs = RoundGraphs(capture=Capture())
    for _ in range(2):
        fahmc.client_update(message, problem.target, settings, seeds)
    kept = {t.untyped_storage().data_ptr() for t in seen["graph"].read}
    X_rows = problem.target._flat()[0]  # the clients' rows the minibatches are drawn from
    assert X_rows.untyped_storage().data_ptr() in kept
