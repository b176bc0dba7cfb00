"""What the samplers expect of a target and a model, as typed interfaces (``typing.Protocol``).

`Target` is the one interface every algorithm's ``step`` takes as its ``target``. Any object
with these methods can be sampled: [`DataTarget`][fedhmc.models.targets.DataTarget] (data on
clients) and [`GaussianTarget`][fedhmc.models.targets.GaussianTarget] (the synthetic
Gaussian) are the two built in; [`fedhmc.algorithms.oracles`][fedhmc.algorithms.oracles]
makes one-client targets out of gradient functions and received gradients.
``isinstance(x, Target)`` checks the methods' presence.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

import torch


@runtime_checkable
class Target(Protocol):
    """A federated target: N clients with energies f^(c) and weights w_c (Σ w_c = 1), so
    that the pooled energy is f = Σ_c w_c f^(c) (N = 1: the pooled data, or a one-client
    view such as ``oracles.from_grad``)."""

    num_clients: int
    weights: torch.Tensor
    dtype: torch.dtype

    def grad(
        self, theta: torch.Tensor, keys: torch.Tensor, index: int, need_energy: bool = True
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Minibatch gradients ∇f̃^(c) at positions ``theta`` (S, N, D), one per chain and
        client, the minibatch of evaluation ``index`` drawn from ``keys`` (S, N); and the
        minibatch energies (S, N) when ``need_energy``."""
        ...

    def client(self, c: int) -> Target:
        """Client ``c`` alone: a one-client target that draws what client c draws here."""
        ...

    def subset(self, clients) -> Target:
        """The clients ``clients`` (ids) alone, in that order, each drawing what it draws
        here (a round's drawn clients under partial participation)."""
        ...

    def with_batch_size(self, batch_size: int) -> Target:
        """The same target at another minibatch size (0: full batch)."""
        ...

    def prefetch(
        self, keys: torch.Tensor, start: int, count: int, horizon: int | None = None
    ) -> None:
        """A hint that evaluations ``start`` … ``start + count − 1`` come next (may do nothing)."""
        ...


@runtime_checkable
class Model(Protocol):
    """A classifier whose parameters are a flat vector θ (D,), batched over rows.

    A row is one (chain, client) pair. The built-in fast paths
    (``LogisticRegression``, ``MLP``) and
    ``TorchModel`` (any ``torch.nn.Module``) all satisfy it.
    """

    dim: int
    num_classes: int

    def prepare(self, X: torch.Tensor) -> torch.Tensor:
        """Features (n, *shape) as the model consumes them (the data target stores these)."""
        ...

    def loss_grad(
        self,
        theta: torch.Tensor,
        X: torch.Tensor,
        y: torch.Tensor,
        sw: torch.Tensor,
        need_value: bool = True,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Σ_i sw_i ℓ(θ_m; x_mi, y_mi) of every row m and its gradient: θ (M, D), prepared
        features X (M, B, *shape), labels y (M, B), weights sw (M, B); returns the gradient
        (M, D) and, when ``need_value``, the values (M,)."""
        ...

    def log_probs(self, theta: torch.Tensor, X: torch.Tensor) -> torch.Tensor:
        """Class log-probabilities (S, n, classes) of ``X`` under each chain's θ (S, D)."""
        ...

    def init(self, kind: str, keys: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """θ (S, D) at round 0 for ``--init kind`` (``auto``: the model's own choice), one
        draw per chain from the run seed's initialisation keys (S,)."""
        ...
