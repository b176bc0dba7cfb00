"""CUDA graphs: the clients' local iterations captured once and replayed every round.

On a GPU a round of small batched leapfrog steps costs the launches of its kernels, not
their arithmetic: thousands of kernels of a few microseconds each. A CUDA graph records
the round's kernels once and replays them with one launch. What makes this exact here is
that a round of Algorithm 3 is the same sequence of kernels every round: its random
numbers are counter-based hashes of keys that are *inputs* of the round (``fedhmc.core.rng``),
so replaying the captured kernels on new keys draws fresh numbers, and nothing in the
round reads a value back to the host.

`RoundGraphs` keeps one graph per kind of call (``key``):

1. the first call of a kind runs eagerly (the warm-up: caches and lazy initialisation
   happen outside capture);
2. the second runs eagerly and is captured on static copies of its inputs;
3. from the third on, the (new) inputs are copied into the graph and it is replayed.
   The 1st, 2nd, 4th, 8th, … replay of each kind also runs eagerly, and the two must agree
   bit for bit: a value the capture froze (a Python number read once, a tensor replaced
   between rounds) shows there, on inputs the graph was not captured with, and so does a
   graph that recorded nothing (captured on another device or stream).

Any difference, a capture that fails or records nothing, or a replay that fails turns the
graphs off for the rest of the run with a one-line note and the round runs eagerly, so a
capture never changes a chain. The tensors a capture read that were made outside it are
kept alive as long as its graph (a replay reads their memory). Warm-up, capture and replay
run with the run's device current (``torch.cuda.device``), on streams made on that device.
At most ``MAX_KINDS`` kinds are kept (each graph holds its own memory); calls of further
kinds run eagerly.
"""

from __future__ import annotations

import contextlib
import sys
import warnings
from collections.abc import Callable, Hashable

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from fedhmc.errors import first_line

Inputs = tuple[torch.Tensor | None, ...]
Outputs = tuple[torch.Tensor | None, ...]

MAX_KINDS = 16
"""At most this many kinds of call are captured in a run (the first ones met)."""

EMPTY_GRAPH = "The CUDA Graph is empty"
"""The start of torch's warning for a capture that recorded no kernel."""


class EmptyGraphError(RuntimeError):
    """A capture recorded no kernel: the round ran on another device or stream."""


def device_of(inputs: Inputs) -> torch.device:
    """The device of the first tensor among ``inputs``."""
    return next(x.device for x in inputs if x is not None)


class _KeepRead(TorchDispatchMode):
    """While a round is captured: every tensor its operations read that no operation of
    the capture made (the model's data, the clients' sizes, …), kept in ``read``."""

    def __init__(self):
        super().__init__()
        self._made: set[int] = set()
        self.read: dict[int, torch.Tensor] = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        for x in tree_leaves((args, kwargs or {})):
            if isinstance(x, torch.Tensor):
                ptr = x.untyped_storage().data_ptr()
                if ptr not in self._made:
                    self.read.setdefault(ptr, x)
        out = func(*args, **(kwargs or {}))
        for x in tree_leaves(out):
            if isinstance(x, torch.Tensor):
                self._made.add(x.untyped_storage().data_ptr())
        return out


class CudaGraph:
    """``fn`` captured on static copies of ``inputs`` on ``device`` (default: the inputs');
    `replay` runs it on new inputs. ``cuda`` is `torch.cuda` (tests pass a stand-in)."""

    def __init__(self, fn: Callable[..., Outputs], inputs: Inputs, device=None, cuda=torch.cuda):
        self.cuda = cuda
        self.device = torch.device(device) if device is not None else device_of(inputs)
        self.static = tuple(None if x is None else x.clone() for x in inputs)
        with cuda.device(self.device):
            side = cuda.Stream(device=self.device)
            side.wait_stream(cuda.current_stream(self.device))
            with cuda.stream(side):  # warm-up on a side stream, as capture requires
                fn(*self.static)
            cuda.current_stream(self.device).wait_stream(side)
            self.graph = cuda.CUDAGraph()
            keep = _KeepRead()
            self.out = _capture(self.graph, fn, self.static, side, self.device, cuda, keep)
            self.read = tuple(keep.read.values())  # alive as long as the graph

    def replay(self, inputs: Inputs) -> Outputs:
        with self.cuda.device(self.device):
            for static, x in zip(self.static, inputs, strict=True):
                if static is not None:
                    if x is None or x.shape != static.shape or x.dtype != static.dtype:
                        raise ValueError("a replay's inputs differ in shape or type")
                    static.copy_(x)
            self.graph.replay()
            # The next replay overwrites the outputs: hand out copies.
            return tuple(None if o is None else o.clone() for o in self.out)


def _capture(graph, fn, static: Inputs, side, device, cuda, keep) -> Outputs:
    """``fn(*static)`` captured into ``graph`` on the stream ``side``, under the dispatch
    mode ``keep``. Whatever happens, the stream that was current is current again and the
    device is synchronised after; a capture that recorded no kernel raises
    `EmptyGraphError`."""
    cuda.synchronize(device)
    before = cuda.current_stream(device)
    cuda.set_stream(side)
    try:
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            graph.capture_begin()
            try:
                with keep:
                    out = fn(*static)
            except BaseException:
                with contextlib.suppress(Exception):  # the capture is invalid: end it
                    graph.capture_end()
                raise
            graph.capture_end()
    finally:
        cuda.set_stream(before)
        cuda.synchronize(device)
    for w in seen:
        if str(w.message).startswith(EMPTY_GRAPH):
            raise EmptyGraphError(f"the capture recorded no kernel on {device}")
        warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
    return out


def _same(a: Outputs, b: Outputs) -> bool:
    return all(
        (x is None and y is None)
        or (x is not None and y is not None and x.shape == y.shape and torch.equal(x, y))
        for x, y in zip(a, b, strict=True)
    )


def _indexed(device: torch.device) -> torch.device:
    """``cuda`` as the GPU current now (``cuda:N``): the graphs stay on it."""
    if device.type == "cuda" and device.index is None and torch.cuda.is_available():
        return torch.device("cuda", torch.cuda.current_device())
    return device


class RoundGraphs:
    """Captured calls of pure tensor functions, one graph per ``key``.

    Parameters
    ----------
    capture
        Builds a graph from ``(fn, inputs, device)``; its ``replay(inputs)`` returns
        ``fn``'s outputs for new inputs. Default: `CudaGraph`. (Tests pass a stand-in that
        records the operations, to check on a CPU what a graph would freeze.)
    device
        The run's device, current while graphs are captured and replayed (default: the
        device of each call's first input).
    """

    def __init__(self, capture: Callable[..., CudaGraph] = CudaGraph, device=None):
        self._capture = capture
        self.device = None if device is None else _indexed(torch.device(device))
        self._graphs: dict[Hashable, CudaGraph | None] = {}
        self._served: dict[Hashable, int] = {}
        self.off: str | None = None
        """Why the graphs were turned off for this run, or None."""
        self.replays = 0

    def __call__(self, key: Hashable, fn: Callable[..., Outputs], inputs: Inputs) -> Outputs:
        """``fn(*inputs)``: eager, or replayed from the graph captured for ``key``.

        ``fn`` must be a pure function of ``inputs`` (tensors or None, whose shapes and
        dtypes ``key`` must fix) and of nothing that changes between calls with that key.
        """
        if self.off is not None:
            return fn(*inputs)
        if key not in self._graphs:
            if len(self._graphs) >= MAX_KINDS:
                return fn(*inputs)
            self._graphs[key] = None  # warmed up: captured at the next call
            return fn(*inputs)
        graph = self._graphs[key]
        if graph is None:
            return self._captured(key, fn, inputs)
        served = self._served[key] = self._served.get(key, 0) + 1
        if served & (served - 1) == 0:  # the 1st, 2nd, 4th, 8th, … replay
            return self._checked_replay(graph, fn, inputs)
        try:
            out = graph.replay(inputs)
        except Exception as e:  # noqa: BLE001
            self.turn_off(f"a replay failed ({first_line(e)})")
            return fn(*inputs)
        self.replays += 1
        return out

    def _captured(self, key, fn, inputs: Inputs) -> Outputs:
        """The eager result of the call; its graph captured for the next call to check."""
        expected = fn(*inputs)
        try:
            self._graphs[key] = self._capture(fn, inputs, self.device or device_of(inputs))
        except Exception as e:  # noqa: BLE001 - any failure: run on without graphs
            self.turn_off(f"capture failed ({first_line(e)})")
        return expected

    def _checked_replay(self, graph, fn, inputs: Inputs) -> Outputs:
        """A replay, on inputs the graph was not captured with, checked against the eager
        call: the eager result, and the graph kept only if they agree."""
        expected = tuple(None if x is None else x.clone() for x in fn(*inputs))
        try:
            got = graph.replay(inputs)
        except Exception as e:  # noqa: BLE001
            self.turn_off(f"a replay failed ({first_line(e)})")
            return expected
        if not _same(got, expected):
            self.turn_off("a replay differed from the same round computed without it")
            return expected
        self.replays += 1
        return expected

    def turn_off(self, why: str) -> None:
        """Stop capturing and replaying for the rest of the run, saying why in one line."""
        self.off = why
        self._graphs.clear()
        self._served.clear()
        print(
            f"fedhmc: note: CUDA graphs are off for the rest of this run: {why}; "
            "the chain is unchanged (add --no-cuda-graphs to skip the attempt)",
            file=sys.stderr,
        )
