"""FSGLD: federated stochastic-gradient Langevin dynamics with conducive gradients (El
Mekkaoui, Mesquita, Blomstedt and Kaski, UAI 2021).

One client computes per round, helped by Gaussian surrogates of everyone's share
U_c = w_c f^(c) of the energy.

- **Set-up (round 0).** Every client fits a diagonal Gaussian surrogate
  s_c(θ) = ½ (θ − μ_c)ᵀ Λ_c (θ − μ_c) of U_c: the mean μ_c and the inverse variance Λ_c of
  the second half of a short local SGLD run on exp(−U_c) (``--surrogate-steps`` steps of
  γ from the start), per chain, and sends (μ_c, Λ_c) once. The server keeps the sums
  Σ_j Λ_j and Σ_j Λ_j μ_j, so that Σ_j ∇s_j(θ) = (Σ_j Λ_j) θ − Σ_j Λ_j μ_j costs one product.
- **Round k ≥ 1.** The server draws one client c with probability p_c = w_c and sends it
  θ with the two sums and p_c. The client runs T (``--local-steps``) steps
  θ ← θ − γ g(θ) + √(2γ) ξ with the conducive gradient
  g(θ) = (1/p_c) [Ĥ_c(θ) − ∇s_c(θ)] + Σ_j ∇s_j(θ), Ĥ_c = w_c ∇f̃^(c) its minibatch
  estimate of ∇U_c, and returns θ: the next broadcast. g is unbiased for ∇f over the
  client's draw and its minibatch.

With exact surrogates (s_c = U_c) and full batches g = ∇f whatever the draw: the chain is
the unadjusted Langevin algorithm on f. ``--clients-per-round`` does not apply: FSGLD
draws one client a round by design.

A client keeps its surrogate (μ_c, Λ_c) between rounds (its node state on Flower; the
server's batched copy in the engine).

Randomness (``fedhmc.core.rng``): the drawn client from the run's seed and the round
(``fedhmc.core.participation``, one weighted draw); client c's private key in round r for
chain s is ``derive(client_seed, r, s)``, its step l's minibatch from
``derive(key, STREAM_MINIBATCH)`` at index l and its noise from
``derive(key, STREAM_FSGLD_NOISE)`` at index l.

Pure PyTorch: no Flower import.
"""

from __future__ import annotations

import dataclasses
import math
import sys
from dataclasses import dataclass

import torch

from fedhmc.algorithms import api, federated
from fedhmc.algorithms.fahmc import Info  # (a round's Info: the federated samplers' one)
from fedhmc.algorithms.federated import Layout
from fedhmc.core import participation, rng
from fedhmc.core.streams import STREAM_FSGLD_NOISE, STREAM_MINIBATCH


@dataclass(frozen=True)
class Settings(api.Settings):
    """FSGLD's settings: γ, T and the surrogate's SGLD steps."""

    LANGEVIN_STEP = True
    step_size: float | None = api.option(
        None,
        "γ, the Langevin step of the conducive-gradient chain and of the surrogate fits "
        "(default: η²/2 of the dataset's η)",
        low=0,
        low_open=True,
    )
    local_steps: int = api.option(
        10, "T, the drawn client's conducive-gradient Langevin steps a round", low=1
    )
    surrogate_steps: int = api.option(
        100,
        "the local SGLD steps each client runs before sampling to fit its Gaussian surrogate "
        "(the second half's mean and inverse variance)",
        low=2,
    )


def setup_rounds(settings: Settings) -> int:
    """One set-up round (round 0): the surrogates."""
    return 1


@dataclass(frozen=True)
class Broadcast:
    """Round ``round``'s message: θ (S, D); from round 1 on, Σ_j Λ_j and Σ_j Λ_j μ_j (S, D),
    the drawn client (1,) and its probability p_c."""

    round: int
    round_seed: int
    position: torch.Tensor
    precision_sum: torch.Tensor | None = None
    shift_sum: torch.Tensor | None = None
    probability: float | None = None
    client_ids: torch.Tensor | None = None


NO_PARTIAL_REASON = " (FSGLD draws one client a round by design)"
"""Why ``--clients-per-round`` does not apply."""

MESSAGE = {"theta": "position", "precision-sum": "precision_sum", "shift-sum": "shift_sum"}
"""The arrays of a round's message by their wire names."""

MESSAGE_VALUES = {"draw-probability": "probability"}
"""The scalars of a round's message by their wire names."""


@dataclass(frozen=True)
class ClientUpdate:
    """The clients' side of a round, M clients stacked: the set-up's surrogates (S, M, D)
    each; a round's new position (S, 1, D) (with the client's surrogate, kept, not sent)."""

    position: torch.Tensor | None = None
    surrogate_mean: torch.Tensor | None = None
    surrogate_precision: torch.Tensor | None = None
    energy: torch.Tensor | None = None
    energy_error: torch.Tensor | None = None
    grad_evals: int = 0


REPLY = {
    "theta": "position",
    "surrogate-mean": "surrogate_mean",
    "surrogate-precision": "surrogate_precision",
}
"""The arrays of a client's reply by their wire names."""


@dataclass(frozen=True)
class State:
    """The server's state after ``round`` rounds (−1: before the set-up): θ (S, D), the
    sums Σ_j Λ_j and Σ_j Λ_j μ_j (S, D) after the set-up; on the engine, what its clients
    keep (``clients``: their surrogates)."""

    position: torch.Tensor
    round: int = -1
    precision_sum: torch.Tensor | None = None
    shift_sum: torch.Tensor | None = None
    clients: federated.ClientStore | None = None


def init(position: torch.Tensor, settings: Settings) -> State:
    """The state before the set-up round: θ = ``position`` (S, D)."""
    return State(position)


def broadcast(seed: int, state: State, settings: Settings, weights: torch.Tensor) -> Broadcast:
    """The set-up round's message (θ to every client), or a round's: θ and the sums to one
    client drawn with probability p_c = w_c."""
    r = state.round + 1
    common = dict(round=r, round_seed=federated.round_seed(seed, r), position=state.position)
    if r <= 0:
        return Broadcast(**common)
    ids = participation.draw(seed, r, weights, 1, "weighted").clients
    w = weights.to(torch.float64)
    p = float(w[ids[0]] / w.sum())  # (one transfer of a scalar a round)
    return Broadcast(
        **common,
        precision_sum=state.precision_sum,
        shift_sum=state.shift_sum,
        probability=p,
        client_ids=ids,
    )


def layout(settings: Settings, round_: int) -> Layout:
    """The set-up: θ down, each client's surrogate up; a round: θ and the two sums down, θ
    up."""
    if round_ <= 0:
        return Layout(("position",), ("surrogate_mean", "surrogate_precision"))
    return Layout(("position", "precision_sum", "shift_sum"), ("position",))


def _langevin(theta, gradient, keys, settings: Settings, steps: int, keep_from: int = 0):
    """``steps`` steps θ ← θ − γ g(θ) + √(2γ) ξ from ``theta`` (S, M, D); ``gradient(θ,
    l)`` is g at step l. Returns the end and the sum and sum of squares of the positions
    from step ``keep_from`` on."""
    gamma = settings.step_size
    noise_keys = rng.derive(keys, STREAM_FSGLD_NOISE)
    total = torch.zeros_like(theta)
    squares = torch.zeros_like(theta)
    D = theta.shape[-1]
    for step in range(steps):
        xi = rng.normal(noise_keys, step, D, theta.dtype)
        theta = theta - gamma * gradient(theta, step) + math.sqrt(2 * gamma) * xi
        if step >= keep_from:
            total, squares = total + theta, squares + theta * theta
    return theta, total, squares


def _fit(message: Broadcast, target, settings: Settings, keys: torch.Tensor) -> ClientUpdate:
    """The set-up: each client's surrogate from the second half of an SGLD run on U_c."""
    S, D = message.position.shape
    M = target.num_clients
    w = target.weights.to(message.position.dtype).view(1, M, 1)
    batch = rng.derive(keys, STREAM_MINIBATCH)

    def share(theta, step):  # Ĥ_c: the minibatch gradient of U_c = w_c f^(c)
        return w * target.grad(theta.contiguous(), batch, step, False)[0]

    steps = settings.surrogate_steps
    half = steps // 2
    start = message.position.unsqueeze(1).expand(S, M, D).clone()
    _, total, squares = _langevin(start, share, keys, settings, steps, keep_from=half)
    n = steps - half
    mean = total / n
    var = (squares / n - mean * mean).clamp_min(torch.finfo(mean.dtype).tiny)
    return ClientUpdate(
        surrogate_mean=mean, surrogate_precision=1.0 / var, grad_evals=steps * S * M
    )


def client_update(
    message: Broadcast,
    target,
    settings: Settings,
    seeds: torch.Tensor,
    *,
    surrogate_mean: torch.Tensor | None = None,
    surrogate_precision: torch.Tensor | None = None,
) -> ClientUpdate:
    """The set-up round's surrogate fits, or the drawn client's T conducive-gradient steps
    with its kept surrogate (μ_c, Λ_c) (S, M, D)."""
    S, D = message.position.shape
    keys = federated.private_keys(seeds, message.round, S, message.position.device)
    if message.round <= 0:
        return _fit(message, target, settings, keys)
    if surrogate_mean is None or surrogate_precision is None:
        from fedhmc.errors import FedHMCError

        raise FedHMCError(
            f"round {message.round}: this client has no surrogate (it missed the set-up "
            "round, or lost its node state); start the run again"
        )
    M = target.num_clients
    w = target.weights.to(message.position.dtype).view(1, M, 1)
    batch = rng.derive(keys, STREAM_MINIBATCH)
    lam_sum, shift_sum = message.precision_sum.unsqueeze(1), message.shift_sum.unsqueeze(1)

    def conducive(theta, step):
        h = w * target.grad(theta.contiguous(), batch, step, False)[0]
        surrogate = (surrogate_mean, surrogate_precision, lam_sum, shift_sum)
        return conducive_gradient(h, theta, surrogate, message.probability)

    start = message.position.unsqueeze(1).expand(S, M, D).clone()
    theta, _, _ = _langevin(start, conducive, keys, settings, settings.local_steps)
    return ClientUpdate(
        position=theta,
        surrogate_mean=surrogate_mean,
        surrogate_precision=surrogate_precision,
        grad_evals=settings.local_steps * S * M,
    )


def conducive_gradient(h, theta, surrogate, probability: float):
    """g(θ) = (1/p_c) [Ĥ_c(θ) − ∇s_c(θ)] + Σ_j ∇s_j(θ): ``h`` is Ĥ_c(θ), ``surrogate``
    is (μ_c, Λ_c, Σ_j Λ_j, Σ_j Λ_j μ_j), broadcastable against ``theta``."""
    mean, precision, precision_sum, shift_sum = surrogate
    own = precision * (theta - mean)
    return (h - own) / probability + precision_sum * theta - shift_sum


@dataclass(frozen=True)
class Combination:
    """The clients (ids among N) whose replies arrived, in their order."""

    clients: torch.Tensor


def combination(message: Broadcast, weights, replied: torch.Tensor | None = None) -> Combination:
    """The clients that replied (``replied``: their mask over the round's; None: all)."""
    n = int(weights.shape[0]) if replied is None else int(replied.shape[0])
    return Combination(federated.replied_clients(message, n, replied))


def server_update(
    state: State, update: ClientUpdate, how: Combination, settings: Settings
) -> tuple[State, Info]:
    """The set-up: the sums of the surrogates that arrived; a round: θ is the drawn
    client's."""
    r = state.round + 1
    if r <= 0:
        lam, mu = update.surrogate_precision, update.surrogate_mean
        new = dataclasses.replace(
            state,
            round=r,
            precision_sum=lam.sum(dim=1),
            shift_sum=(lam * mu).sum(dim=1),
        )
        finite = bool(torch.isfinite(new.shift_sum).all() and torch.isfinite(lam).all())
        return new, Info(int(update.grad_evals), finite, int(how.clients.shape[0]))
    position = update.position[:, 0]
    new = dataclasses.replace(state, position=position, round=r)
    finite = bool(torch.isfinite(position).all())
    return new, Info(int(update.grad_evals), finite, 1)


def skip(state: State, settings: Settings) -> State:
    """A round with no reply: θ stays, the round counter moves on."""
    return dataclasses.replace(state, round=state.round + 1)


def client_keeps(message: Broadcast, update: ClientUpdate) -> dict:
    """A client keeps the surrogate it fitted in the set-up round (the rounds after change
    nothing it keeps)."""
    if message.round > 0:
        return {}
    return {
        "surrogate_mean": update.surrogate_mean,
        "surrogate_precision": update.surrogate_precision,
    }


def kept_by_client(message: Broadcast, kept: dict) -> dict:
    """The drawn client's surrogate (none: it missed the set-up, refused by
    ``client_update``)."""
    if not bool(kept["held"].all()):
        return {}
    return {k: kept[k] for k in ("surrogate_mean", "surrogate_precision") if k in kept}


def resumes_on_flower(settings: Settings) -> bool:
    """A run does not resume on new Flower nodes: they lack their set-up's surrogates."""
    return False


def step(seed: int, state: State, target, settings: Settings) -> tuple[State, Info]:
    """One round (the set-up's or a sampling one), every client and chain batched."""
    return federated.step(sys.modules[__name__], seed, state, target, settings)
