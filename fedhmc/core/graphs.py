"""CUDA graphs: the clients' local iterations captured once and replayed every round.

On a GPU a round of small batched leapfrog steps costs the launches of its kernels, not
their arithmetic: thousands of kernels of a few microseconds each. A CUDA graph records
the round's kernels once and replays them with one launch. What makes this exact here is
that a round of Algorithm 3 is the same sequence of kernels every round: its random
numbers are counter-based hashes of keys that are *inputs* of the round (``fedhmc.core.rng``),
so replaying the captured kernels on new keys draws fresh numbers, and nothing in the
round reads a value back to the host.

`RoundGraphs` keeps one graph per kind of call (``key``). A call of a new kind runs
eagerly (the warm-up: caches and lazy initialisation happen outside capture). The second
runs eagerly too, and is also captured and replayed on the same inputs: the replay must
equal the eager result bit for bit, or the graphs are turned off for the run with a
one-line note (so a capture can never change a chain). From the third call on, the inputs
are copied into the graph's static tensors and the graph is replayed. At most
``MAX_KINDS`` kinds are kept (each graph holds its own memory); calls of further kinds
run eagerly.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Hashable

import torch

Inputs = tuple[torch.Tensor | None, ...]
Outputs = tuple[torch.Tensor | None, ...]

MAX_KINDS = 16
"""At most this many kinds of call are captured in a run (the first ones met)."""


class CudaGraph:
    """``fn`` captured on static copies of ``inputs``; `replay` runs it on new inputs."""

    def __init__(self, fn: Callable[..., Outputs], inputs: Inputs):
        self.static = tuple(None if x is None else x.clone() for x in inputs)
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):  # warm-up on a side stream, as capture requires
            fn(*self.static)
        torch.cuda.current_stream().wait_stream(stream)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):
            self.out = fn(*self.static)

    def replay(self, inputs: Inputs) -> Outputs:
        for static, x in zip(self.static, inputs, strict=True):
            if static is not None:
                static.copy_(x)
        self.graph.replay()
        # The next replay overwrites the outputs: hand out copies.
        return tuple(None if o is None else o.clone() for o in self.out)


def _same(a: Outputs, b: Outputs) -> bool:
    return all(
        (x is None and y is None)
        or (x is not None and y is not None and x.shape == y.shape and torch.equal(x, y))
        for x, y in zip(a, b, strict=True)
    )


class RoundGraphs:
    """Captured calls of pure tensor functions, one graph per ``key``.

    Parameters
    ----------
    capture
        Builds a graph from ``(fn, inputs)``; its ``replay(inputs)`` returns ``fn``'s
        outputs for new inputs. Default: `CudaGraph`. (Tests pass an eager stand-in to
        check the bookkeeping on a CPU.)
    """

    def __init__(self, capture: Callable[[Callable, Inputs], CudaGraph] = CudaGraph):
        self._capture = capture
        self._graphs: dict[Hashable, CudaGraph | None] = {}
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
        if graph is not None:
            self.replays += 1
            return graph.replay(inputs)
        expected = fn(*inputs)
        try:
            graph = self._capture(fn, inputs)
            got = graph.replay(inputs)
        except Exception as e:  # noqa: BLE001 - any failure: run on without graphs
            self.turn_off(f"capture failed ({type(e).__name__}: {str(e).splitlines()[0]})")
            return expected
        if not _same(got, expected):
            self.turn_off("a replay differed from the same round computed without it")
            return expected
        self._graphs[key] = graph
        return expected

    def turn_off(self, why: str) -> None:
        """Stop capturing and replaying for the rest of the run, saying why in one line."""
        self.off = why
        self._graphs.clear()
        print(
            f"fedhmc: note: CUDA graphs are off for the rest of this run: {why}; "
            "the chain is unchanged (add --no-cuda-graphs to skip the attempt)",
            file=sys.stderr,
        )
