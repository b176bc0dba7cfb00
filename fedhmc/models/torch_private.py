"""Every private torch API that fedhmc uses, each beside a public fallback.

``TorchModel`` (`fedhmc.models.module`) takes four short cuts through torch's internals,
for speed only: each gives the public API's numbers (bit for bit, or up to float rounding
where so said), and each has a fallback through the public API that runs where the
private one is missing. ``tests/unit/test_torch_private.py`` runs both sides of each on
small inputs and fails when they differ.

- **One level of vmap** (`vmap_call`): torch.func.vmap's own primitives
  (``torch._C._functorch._vmap_increment_nesting``, ``_add_batch_dim``,
  ``_remove_batch_dim``, ``_vmap_decrement_nesting``; ``torch._functorch.vmap.
  lazy_load_decompositions``), without ``torch.func.vmap``'s per-call checks and
  flattening of its arguments (which cost about as much as a small model's whole
  gradient). The same batching rules: the same numbers bit for bit. Fallback:
  ``torch.func.vmap``.
- **The parameters swapped in** (`BoundModule`): θ's parts put into the submodules'
  ``_parameters`` dictionaries (``torch.nn.Module``'s private attribute), as
  ``torch.func.functional_call`` does, without its per-call lookups. The same module
  call: the same numbers bit for bit. Fallback: ``torch.func.functional_call``.
- **log_softmax's backward** (`log_softmax_backward`): ``torch._log_softmax_backward_data``,
  the kernel autograd's reverse pass of ``log_softmax`` calls. Fallback: its formula,
  g − exp(log p)·Σg, in public operations (equal up to float rounding: another order of
  the same sums).
- **A compiled gradient without Dynamo** (`compile_traced`): ``make_fx``
  (``torch.fx.experimental.proxy_tensor``) traces the function into one graph of ATen
  operations, which inductor's ``compile_fx`` compiles (under ``torch._guards``'
  tracing context, with ``torch._subclasses``' fake tensors), called without Dynamo's
  guards. Fallback: ``torch.compile(fn, dynamic=False)`` (Dynamo, guards and all; equal
  up to float rounding, as any two compilations).

And one private name used to classify a module, not to compute anything:
``torch.nn.modules.conv._ConvNd``, the base class of torch's convolutions (`is_convolution`;
fallback: the public convolution classes).

Checked on torch 2.14.1 (CPU; the version installed here): every fast path is available
and equals its fallback there (``tests/unit/test_torch_private.py``). The GPU machine's
torch 2.11 was not checked with this module (no GPU machine was lent to the session that
wrote it): run that test there. The ``*_AVAILABLE`` flags say which fast paths this torch
has; where one is False its fallback runs, with the same results.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence

import torch

try:  # torch.func.vmap's own primitives
    from torch._C._functorch import (
        _add_batch_dim,
        _remove_batch_dim,
        _vmap_decrement_nesting,
        _vmap_increment_nesting,
    )
    from torch._functorch.vmap import lazy_load_decompositions
except ImportError:  # pragma: no cover - a torch without them: the public vmap
    _vmap_increment_nesting = None

try:
    from torch.nn.modules.conv import _ConvNd
except ImportError:  # pragma: no cover - a torch without it: the public classes
    _ConvNd = None

DIRECT_VMAP = _vmap_increment_nesting is not None
"""Whether `vmap_call` batches through torch.func.vmap's primitives (else
``torch.func.vmap``)."""

DIRECT_SWAP = isinstance(getattr(torch.nn.Linear(1, 1), "_parameters", None), dict)
"""Whether `BoundModule` swaps parameters in the submodules' ``_parameters`` (else
``torch.func.functional_call``)."""

LOG_SOFTMAX_BACKWARD_AVAILABLE = hasattr(torch, "_log_softmax_backward_data")
"""Whether `log_softmax_backward` calls ``torch._log_softmax_backward_data``."""

CONVOLUTIONS = (
    torch.nn.Conv1d,
    torch.nn.Conv2d,
    torch.nn.Conv3d,
    torch.nn.ConvTranspose1d,
    torch.nn.ConvTranspose2d,
    torch.nn.ConvTranspose3d,
)
"""torch's public convolution classes (the lazy ones are subclasses of these)."""


# ----------------------------------------------------------------------------- one vmap level
def prepare_vmap() -> None:
    """What ``torch.func.vmap`` does first at every call (load its decompositions), done
    once (`vmap_call`'s direct path skips it)."""
    if DIRECT_VMAP:
        lazy_load_decompositions()


def vmap_call(fn: Callable, rows: Sequence[torch.Tensor], last: torch.Tensor, batched: bool):
    """``torch.func.vmap(fn, in_dims)(*rows, last)`` over dim 0 of every tensor of ``rows``
    and, where ``batched``, of ``last`` (else shared by every row): through vmap's
    primitives where this torch has them (`prepare_vmap` first), else through
    ``torch.func.vmap``. ``fn`` must return a tensor."""
    if DIRECT_VMAP:
        return direct_vmap_call(fn, rows, last, batched)
    return public_vmap_call(fn, rows, last, batched)


def direct_vmap_call(fn: Callable, rows: Sequence[torch.Tensor], last: torch.Tensor, batched):
    """`vmap_call` through one batching level of vmap's primitives."""
    M = rows[0].shape[0]
    level = _vmap_increment_nesting(M, "error")
    try:
        args = [_add_batch_dim(t, 0, level) for t in rows]
        args.append(_add_batch_dim(last, 0, level) if batched else last)
        out = fn(*args)
        if not isinstance(out, torch.Tensor):
            raise ValueError(f"the module returned a {type(out).__name__}, not a tensor")
        return _remove_batch_dim(out, level, M, 0)
    finally:
        _vmap_decrement_nesting()


def public_vmap_call(fn: Callable, rows: Sequence[torch.Tensor], last: torch.Tensor, batched):
    """`vmap_call` through ``torch.func.vmap``."""
    in_dims = (0,) * len(rows) + (0 if batched else None,)
    return torch.func.vmap(fn, in_dims=in_dims)(*rows, last)


# ----------------------------------------------------------------------- parameters swapped in
class BoundModule:
    """``net(x)`` with its sampled parameters (those that require gradients, in
    ``named_parameters()`` order) replaced by given tensors: ``functional_call``, with
    where each parameter lives in the module found once.

    ``slots`` holds (submodule, attribute, index among the sampled parameters) of every
    name under which a parameter is reachable: what ``functional_call`` would look up and
    swap at every call. A parameter shared by several submodules (tied weights) is listed
    under each of its names, with the index of its first (``functional_call``'s
    ``tie_weights``). Frozen parameters (``requires_grad=False``) stay in the module.
    """

    def __init__(self, net: torch.nn.Module):
        self.net = net
        sampled = [(k, p) for k, p in net.named_parameters() if p.requires_grad]
        self.names = [k for k, _ in sampled]
        index = {id(p): i for i, (_, p) in enumerate(sampled)}
        self.slots: list[tuple[torch.nn.Module, str, int]] = []
        for name, p in net.named_parameters(remove_duplicate=False):
            if not p.requires_grad:  # frozen: stays in the module, with its own value
                continue
            prefix, _, attr = name.rpartition(".")
            owner = net.get_submodule(prefix) if prefix else net
            self.slots.append((owner, attr, index[id(p)]))

    def __call__(self, values: Sequence[torch.Tensor], x: torch.Tensor):
        """``net(x)`` with the sampled parameters replaced by ``values``."""
        if DIRECT_SWAP:
            return self.swapped(values, x)
        return self.functional(values, x)

    def swapped(self, values: Sequence[torch.Tensor], x: torch.Tensor):
        """`__call__` by swapping the submodules' ``_parameters`` entries (restored after)."""
        slots = self.slots
        saved = [owner._parameters[attr] for owner, attr, _ in slots]
        try:
            for owner, attr, i in slots:
                owner._parameters[attr] = values[i]
            return self.net(x)
        finally:
            for (owner, attr, _), t in zip(slots, saved, strict=True):
                owner._parameters[attr] = t

    def functional(self, values: Sequence[torch.Tensor], x: torch.Tensor):
        """`__call__` through ``torch.func.functional_call``."""
        params = dict(zip(self.names, values, strict=True))
        return torch.func.functional_call(self.net, params, (x,))


# ------------------------------------------------------------------------- log_softmax backward
def log_softmax_backward(g_logp: torch.Tensor, logp: torch.Tensor, dim: int) -> torch.Tensor:
    """The gradient with respect to the logits of a loss whose gradient with respect to
    ``logp = log_softmax(logits, dim)`` is ``g_logp``: g − exp(log p)·Σ_dim g."""
    if LOG_SOFTMAX_BACKWARD_AVAILABLE:
        return torch._log_softmax_backward_data(g_logp, logp, dim, logp.dtype)
    return public_log_softmax_backward(g_logp, logp, dim)


def public_log_softmax_backward(g_logp: torch.Tensor, logp: torch.Tensor, dim: int):
    """`log_softmax_backward` in public operations."""
    return g_logp - logp.exp() * g_logp.sum(dim, keepdim=True)


# ------------------------------------------------------------------------------- compilation
def compile_traced(fn: Callable, inputs: Sequence[torch.Tensor]) -> Callable:
    """``fn`` compiled for ``inputs``' shapes, strides, dtypes and devices: traced by
    ``make_fx`` into one graph of ATen operations and compiled by inductor's
    ``compile_fx``, to be called without Dynamo's guards (the caller keys the compiled
    functions by what the guards would check). Through ``torch.compile`` where this torch
    lacks one of them (`compile_public`)."""
    # torch's C++ toolchain probe logs a warning about CUDA on a CPU-only machine
    logging.getLogger("torch.utils.cpp_extension").setLevel(logging.ERROR)
    try:
        from torch._guards import TracingContext, tracing
        from torch._inductor.compile_fx import compile_fx
        from torch._subclasses.fake_tensor import FakeTensorMode
        from torch.fx.experimental.proxy_tensor import make_fx
        from torch.fx.experimental.symbolic_shapes import ShapeEnv
    except ImportError:  # pragma: no cover - another torch: through Dynamo
        return compile_public(fn, inputs)
    graph = make_fx(fn)(*inputs)
    # (what a forward pass that failed and ran again as written left: TorchModel._run_net)
    graph.graph.eliminate_dead_code()
    graph.recompile()
    # Inductor keeps what it compiled on disk and a new process finds it there (about a
    # second instead of 5–20), given the tracing context that torch.compile would set.
    with tracing(TracingContext(FakeTensorMode(shape_env=ShapeEnv()))):
        return compile_fx(graph, list(inputs))


def compile_public(fn: Callable, inputs: Sequence[torch.Tensor]) -> Callable:
    """`compile_traced` through ``torch.compile`` (Dynamo and its guards): ``fn`` compiled
    for static shapes, ``inputs`` unused (compiled on the first call)."""
    logging.getLogger("torch.utils.cpp_extension").setLevel(logging.ERROR)
    return torch.compile(fn, dynamic=False)


# ------------------------------------------------------------------------------ convolutions
def is_convolution(m: torch.nn.Module) -> bool:
    """Whether ``m`` is one of torch's convolutions (a subclass of ``_ConvNd``, or of a
    public convolution class where this torch lacks it)."""
    return isinstance(m, _ConvNd if _ConvNd is not None else CONVOLUTIONS)
