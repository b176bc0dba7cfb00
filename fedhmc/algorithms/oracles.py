"""The one gradient-oracle type every algorithm takes, and adapters to it.

An oracle answers ``grad(theta, keys, index, need_energy)``: the (stochastic) gradients
∇f̃^(c) at positions ``theta`` (S, N, D), one per chain and client, the minibatch of
evaluation ``index`` drawn from ``keys`` (S, N), and the energies (S, N) when asked (else
None); it has ``num_clients`` N and weights w_c (N,) summing to one, and
``with_batch_size(b)`` (an oracle that ignores minibatches returns itself).

A federated target (``fedhmc.models.targets``: data on clients, the synthetic Gaussian) is
an oracle. The adapters here make one out of what other algorithms receive:

- ``from_grad(fn)``: a function ``fn(theta (S, D), index) -> ∇U (S, D)`` (a stale-gradient
  buffer, a test's closed-form gradient);
- ``from_energy(fn)``: a function ``fn(theta (S, D)) -> (U (S,), ∇U (S, D))``, full batch;
- ``Received(gradient)``: a gradient that arrived over the network, whatever θ is asked.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol, runtime_checkable

import torch


@runtime_checkable
class GradientOracle(Protocol):
    """What every algorithm's ``step`` asks of its ``target`` argument."""

    num_clients: int
    weights: torch.Tensor

    def grad(
        self, theta: torch.Tensor, keys: torch.Tensor, index: int, need_energy: bool = True
    ) -> tuple[torch.Tensor, torch.Tensor | None]: ...

    def with_batch_size(self, batch_size: int) -> GradientOracle: ...


class _OneClient:
    """An oracle with one client of weight 1 whose gradients ignore minibatches."""

    num_clients = 1

    def __init__(self):
        # Weight 1 is a number, not data: it is moved to the positions where it is used.
        self.weights = torch.ones(1, dtype=torch.float64, device="cpu")

    def with_batch_size(self, batch_size: int):
        return self


class from_grad(_OneClient):  # noqa: N801 (a function-like adapter)
    """An oracle from ``fn(theta (S, D), index) -> ∇U (S, D)``; no energies."""

    def __init__(self, fn: Callable[[torch.Tensor, int], torch.Tensor]):
        super().__init__()
        self.fn = fn

    def grad(self, theta, keys, index, need_energy=True):
        return self.fn(theta[:, 0], index).unsqueeze(1), None


class from_energy(_OneClient):  # noqa: N801
    """A full-batch oracle from ``fn(theta (S, D)) -> (U (S,), ∇U (S, D))``."""

    def __init__(self, fn: Callable[[torch.Tensor], tuple[torch.Tensor, torch.Tensor]]):
        super().__init__()
        self.fn = fn

    def grad(self, theta, keys, index, need_energy=True):
        U, g = self.fn(theta[:, 0])
        return g.unsqueeze(1), U.unsqueeze(1)


class Received(_OneClient):
    """A gradient that arrived from a worker, (D,) or (S, D): returned whatever θ is asked
    (the worker evaluated it at the θ it was sent, that of timestamp ``sent``)."""

    def __init__(self, gradient: torch.Tensor, sent: int = 0):
        super().__init__()
        self.gradient = gradient
        self.sent = int(sent)

    def grad(self, theta, keys, index, need_energy=True):
        g = self.gradient.to(theta.device, theta.dtype)
        return g.reshape(theta.shape), None
