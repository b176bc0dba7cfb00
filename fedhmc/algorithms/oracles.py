"""One-client targets made out of what some algorithms receive instead of a target.

Every algorithm's ``step`` takes a [`Target`][fedhmc.models.protocols.Target] (the one
definition of that interface, in ``fedhmc.models.protocols``): it answers
``grad(theta, keys, index, need_energy)``, the (stochastic) gradients ∇f̃^(c) at positions
``theta`` (S, N, D), one per chain and client, the minibatch of evaluation ``index`` drawn
from ``keys`` (S, N), and the energies (S, N) when asked (else None); it has ``num_clients``
N and weights w_c (N,) summing to one, and ``with_batch_size(b)``.

A federated target (``fedhmc.models.targets``: data on clients, the synthetic Gaussian) is
one. The adapters here are one-client targets (`OneClient`: client 0 of weight 1, whose
gradients ignore minibatches) made out of:

- ``from_grad(fn)``: a function ``fn(theta (S, D), index) -> ∇U (S, D)`` (a stale-gradient
  buffer, a test's closed-form gradient);
- ``from_energy(fn)``: a function ``fn(theta (S, D)) -> (U (S,), ∇U (S, D))``, full batch;
- ``Received(gradient)``: a gradient that arrived over the network, whatever θ is asked.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from fedhmc.models.protocols import Target

__all__ = ["OneClient", "Received", "Target", "from_energy", "from_grad"]


class OneClient:
    """The one-client part of a [`Target`][fedhmc.models.protocols.Target]: client 0
    alone, the whole target (``client(0)``, ``subset([0])`` and ``with_batch_size`` return
    it; ``prefetch`` does nothing). A subclass gives ``grad``, ``weights`` and ``dtype``."""

    num_clients = 1

    def client(self, c: int):
        if int(c) != 0:
            raise IndexError(f"a one-client target has client 0 only, not {c}")
        return self

    def subset(self, clients):
        if [int(c) for c in clients] != [0]:
            raise IndexError(f"a one-client target has client 0 only, not {list(clients)}")
        return self

    def with_batch_size(self, batch_size: int):
        return self

    def prefetch(self, keys, start: int, count: int, horizon: int | None = None) -> None:
        return None


class _OneClient(OneClient):
    """An adapter of weight 1 whose gradients ignore minibatches."""

    def __init__(self, dtype: torch.dtype = torch.float64):
        # Weight 1 is a number, not data: it is moved to the positions where it is used.
        self.weights = torch.ones(1, dtype=torch.float64, device="cpu")
        self.dtype = dtype


class from_grad(_OneClient):  # noqa: N801 (a function-like adapter)
    """A one-client target from ``fn(theta (S, D), index) -> ∇U (S, D)``; no energies.
    ``dtype``: the positions' dtype it is meant for (informational)."""

    def __init__(
        self, fn: Callable[[torch.Tensor, int], torch.Tensor], dtype: torch.dtype = torch.float64
    ):
        super().__init__(dtype)
        self.fn = fn

    def grad(self, theta, keys, index, need_energy=True):
        return self.fn(theta[:, 0], index).unsqueeze(1), None


class from_energy(_OneClient):  # noqa: N801
    """A full-batch one-client target from ``fn(theta (S, D)) -> (U (S,), ∇U (S, D))``.
    ``dtype``: the positions' dtype it is meant for (informational)."""

    def __init__(
        self,
        fn: Callable[[torch.Tensor], tuple[torch.Tensor, torch.Tensor]],
        dtype: torch.dtype = torch.float64,
    ):
        super().__init__(dtype)
        self.fn = fn

    def grad(self, theta, keys, index, need_energy=True):
        U, g = self.fn(theta[:, 0])
        return g.unsqueeze(1), U.unsqueeze(1)


class Received(_OneClient):
    """A gradient that arrived from a worker, (D,) or (S, D): returned whatever θ is asked
    (the worker evaluated it at the θ it was sent, that of timestamp ``sent``)."""

    def __init__(self, gradient: torch.Tensor, sent: int = 0):
        super().__init__(gradient.dtype)
        self.gradient = gradient
        self.sent = int(sent)

    def grad(self, theta, keys, index, need_energy=True):
        g = self.gradient.to(theta.device, theta.dtype)
        return g.reshape(theta.shape), None
