"""A CPU stand-in for a CUDA graph that sees what a graph freezes.

A CUDA graph records the kernels of one call, with their scalar arguments and the
addresses of the memory they read, and a replay runs those kernels again: it never runs
the Python that made them. So a value the Python computes anew each round (a Python
number, a tensor it replaces) is frozen at the capture's value, and a read back to the
host cannot be captured at all.

`RecordedGraph` does the same on the CPU. At capture it records, under a dispatch mode,
every ATen call of the function: the operator, its non-tensor arguments, and for each
tensor argument where it comes from (an input of the graph, the output of an earlier
call, or a tensor made outside the round, kept with its storage). A host
synchronisation is refused there, as a capture refuses it. A replay then

1. runs the recorded calls on the graph's inputs and the recorded tensors (what the GPU
   computes), and
2. runs the function's Python again under the same recording and fails, naming the
   call, if it would have made a different call, passed a different scalar, read a
   tensor of another storage, or synchronised: what the graph would have got wrong.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten, tree_unflatten

FORBIDDEN = {
    "aten._local_scalar_dense.default": "reads a value back to the host (item, float, bool)",
    "aten.lift_fresh.default": "copies host data to the device (torch.tensor of Python data)",
    "aten.equal.default": "torch.equal synchronises",
    "aten.nonzero.default": "nonzero has a data-dependent shape",
    "aten.is_nonzero.default": "bool(tensor) synchronises",
    "aten.masked_select.default": "masked_select has a data-dependent shape",
}


MASKED = {"aten.index.Tensor", "aten.index_put.default", "aten.index_put_.default"}
"""Indexing whose boolean mask becomes indices of a data-dependent number (nonzero)."""


def refusal(func, args) -> str | None:
    """Why a capture refuses ``func(*args)``, or None."""
    name = str(func)
    if name in MASKED and len(args) > 1:
        if any(isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in args[1]):
            return "indexing with a boolean mask has a data-dependent shape (nonzero)"
    return FORBIDDEN.get(name)


class HostSyncError(AssertionError):
    """The round synchronises with the host: a CUDA graph cannot capture it."""


HOST_READS = {
    "tolist": "reads the tensor back to the host (tolist)",
    "numpy": "reads the tensor back to the host (numpy)",
    "cpu": "copies the tensor to the host (cpu)",
    "__array__": "reads the tensor back to the host (NumPy conversion)",
    "item": "reads a value back to the host (item)",
}
"""Tensor methods that read device memory on the host without an ATen call that a
dispatch mode would see on the CPU (where they copy nothing). (``x.to(device)`` is not
among them: on the CPU the run's device is the host, so it cannot be told from a copy.)"""


class NoHostReads(TorchFunctionMode):
    """Refuses the reads back to the host that the CPU makes without an ATen call."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        why = HOST_READS.get(getattr(func, "__name__", ""))
        if why is not None:
            raise HostSyncError(f"Tensor.{func.__name__}: {why}")
        return func(*args, **(kwargs or {}))


class FrozenValueError(AssertionError):
    """A replay would differ from the round's Python: the graph froze a value."""


class NoHostSync(TorchDispatchMode):
    """Refuses what a CUDA graph capture refuses."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        why = refusal(func, args)
        if why is not None:
            raise HostSyncError(f"{func}: {why}")
        return func(*args, **(kwargs or {}))


class Ref(NamedTuple):
    """Where a recorded call's tensor argument comes from: ``("in", i)``, an input of the
    graph; ``("op", j, k)``, output k of call j; ``("ext", n)``, recorded tensor n."""

    kind: str
    a: int
    b: int = 0


class Call(NamedTuple):
    func: object
    spec: object
    leaves: list  # Ref or a non-tensor argument


def _storage(t: torch.Tensor) -> tuple:
    """What a kernel reads of a tensor made outside the round: its memory and layout."""
    return (
        t.untyped_storage().data_ptr(),
        t.storage_offset(),
        tuple(t.shape),
        t.stride(),
        t.dtype,
    )


def _scalar(x) -> object:
    """A comparable form of a non-tensor argument (floats exactly: NaN equals NaN)."""
    return x.hex() if isinstance(x, float) else x


class Recorder(TorchDispatchMode):
    """Records every ATen call (see the module's docstring) made with ``inputs`` as the
    graph's inputs; ``signature`` is what a replay must see again."""

    def __init__(self, inputs):
        super().__init__()
        self.calls: list[Call] = []
        self.signature: list[tuple] = []
        self.external: list[torch.Tensor] = []
        self._where: dict[int, Ref] = {}
        self._alive: list[torch.Tensor] = []  # no id() is reused while recording
        for i, x in enumerate(inputs):
            if x is not None:
                self._note(x, Ref("in", i))

    def _note(self, t: torch.Tensor, ref: Ref) -> None:
        self._where[id(t)] = ref
        self._alive.append(t)

    def _ref(self, t: torch.Tensor) -> Ref:
        ref = self._where.get(id(t))
        if ref is None:
            ref = Ref("ext", len(self.external))
            self.external.append(t)
            self._note(t, ref)
        return ref

    def describe(self, leaf) -> object:
        if not isinstance(leaf, Ref):
            return _scalar(leaf)
        if leaf.kind == "ext":
            return ("tensor made outside the round", _storage(self.external[leaf.a]))
        return tuple(leaf)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        why = refusal(func, args)
        if why is not None:
            raise HostSyncError(f"{func}: {why}")
        kwargs = kwargs or {}
        flat, spec = tree_flatten((args, kwargs))
        leaves = [self._ref(x) if isinstance(x, torch.Tensor) else x for x in flat]
        self.signature.append((str(func), str(spec), [self.describe(x) for x in leaves]))
        self.calls.append(Call(func, spec, leaves))
        out = func(*args, **kwargs)
        j = len(self.calls) - 1
        for k, o in enumerate(tree_flatten(out)[0]):
            if isinstance(o, torch.Tensor):
                self._note(o, Ref("op", j, k))
        return out

    def refs(self, outputs) -> list:
        return [None if o is None else self._ref(o) for o in outputs]


def first_difference(captured: list[tuple], now: list[tuple]) -> str | None:
    """The first call at which the round's Python now differs from the capture, in words."""
    for j, (a, b) in enumerate(zip(captured, now, strict=False)):
        if a[0] != b[0] or a[1] != b[1]:
            return f"call {j} is {b[0]}, the graph replays {a[0]}"
        for k, (x, y) in enumerate(zip(a[2], b[2], strict=True)):
            if x != y:
                what = "a tensor made outside the round was replaced"
                if not (isinstance(x, tuple) and isinstance(y, tuple)):
                    what = f"a scalar changed ({x!r} at capture, {y!r} now)"
                return f"call {j} ({a[0]}), argument {k}: {what}; the graph would reuse it"
    if len(captured) != len(now):
        return f"the round makes {len(now)} calls, the graph replays {len(captured)}"
    return None


class RecordedGraph:
    """A stand-in for `fedhmc.core.graphs.CudaGraph` on the CPU (see the module)."""

    captures = 0

    def __init__(self, fn, inputs, device=None):
        RecordedGraph.captures += 1
        self.fn = fn
        self.static = tuple(None if x is None else x.clone() for x in inputs)
        fn(*self.static)  # the warm-up, as CudaGraph's
        rec = Recorder(self.static)
        with NoHostReads(), rec:
            out = fn(*self.static)
        self.calls, self.external, self.signature = rec.calls, rec.external, rec.signature
        self.out = rec.refs(out)

    def _run_calls(self) -> tuple:
        """What the GPU computes: the recorded calls on the inputs and recorded tensors."""
        values: dict[Ref, torch.Tensor] = {}
        for i, x in enumerate(self.static):
            if x is not None:
                values[Ref("in", i)] = x
        for n, t in enumerate(self.external):
            values[Ref("ext", n)] = t
        with torch.no_grad():
            for j, call in enumerate(self.calls):
                flat = [values[x] if isinstance(x, Ref) else x for x in call.leaves]
                args, kwargs = tree_unflatten(flat, call.spec)
                out = call.func(*args, **kwargs)
                for k, o in enumerate(tree_flatten(out)[0]):
                    if isinstance(o, torch.Tensor):
                        values[Ref("op", j, k)] = o
        return tuple(None if r is None else values[r] for r in self.out)

    def replay(self, inputs):
        for s, x in zip(self.static, inputs, strict=True):
            if s is not None:
                s.copy_(x)
        out = tuple(None if o is None else o.clone() for o in self._run_calls())
        rec = Recorder(self.static)
        with NoHostReads(), rec:
            self.fn(*self.static)
        why = first_difference(self.signature, rec.signature)
        if why is not None:
            raise FrozenValueError(why)
        return out
