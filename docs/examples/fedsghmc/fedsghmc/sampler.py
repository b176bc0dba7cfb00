r"""fed-sghmc: federated SGHMC whose clients keep their momentum between rounds, with a drift
correction. A complete sampler for fedhmc in a package of its own.

The target is fedhmc's (docs/algorithms.md): client c holds the share w_c = n_c / n of the
data, its energy f^(c) is its data scaled up to n plus the prior, f = Σ_c w_c f^(c), and
``target.grad`` returns a minibatch estimate ∇f̃^(c). Round r, for every chain:

1. The server sends θ̄ (and, from round 2 on, ḡ: the weighted mean of the drifts the clients
   sent in the last round).
2. Client c starts from θ_0 = θ̄ with the momentum p_c it kept from its last round (in its
   first round it draws p_c ~ N(0, I / w_c)) and takes T Euler steps of SGHMC with step h and
   friction B:

       G_t = ∇f̃^(c)(θ_t) + λ (ḡ − g_c)
       p  ← (1 − B h) p − h G_t + √(2 B h / w_c) ξ_t,      ξ_t ~ N(0, I)
       θ_{t+1} = θ_t + h p

   where g_c is the drift it sent in the last round (λ: ``--drift-correction``; no correction in
   a client's first round). It replies with θ_T and its new drift
   g_c = (1/T) Σ_t ∇f̃^(c)(θ_t), the mean of the round's raw minibatch gradients, and keeps
   p_c and g_c for its next round: the server never sees p_c.
3. The server averages: θ̄ = Σ_c w_c θ^(c) and ḡ = Σ_c w_c g_c (weights renormalised over
   the clients that replied).

Why it samples: the weighted mean of the clients' momenta, p̄ = Σ_c w_c p_c, follows
p̄ ← (1 − B h) p̄ − h Σ_c w_c G_t^(c) + √(2 B h) ξ̄ with ξ̄ ~ N(0, I) (the noises are
independent and Σ_c w_c² / w_c = 1), and Σ_c w_c G_t^(c) = Σ_c w_c ∇f̃^(c)(θ_t^(c)), because
Σ_c w_c (ḡ − g_c) = 0 whenever ḡ averages every client's g_c: the correction adds nothing to
the averaged chain. Where the clients share one position the averaged chain (θ̄, p̄) is
therefore SGHMC on f (Chen, Fox and Guestrin 2014, with unit mass), whose law tends to
∝ exp(−f(θ) − |p|²/2) as h → 0. The clients' positions do part within a round (each follows
its own gradient), and that is what the correction is for: g_c − ḡ estimates
∇f^(c) − ∇f, the pull of client c's own data away from the others', so G_t estimates ∇f at
the client's position (a SCAFFOLD-style control variate), the clients' paths stay together,
and their kept momenta do not drift apart over the rounds.

Randomness (``fedhmc.core.rng``): client c's private key of round r for chain s is
``derive(client_seed(seed, c), r, s)``. Its minibatches (fedhmc's minibatch stream), its
noises ξ_t (``STREAM_NOISE``, draw t) and its first momentum (``STREAM_FIRST_MOMENTUM``) are
folded out of it, so a client draws the same numbers batched with every other client on the
engine and alone on Flower. The stream numbers are this package's own, ≥ 1000: no stream of
fedhmc's (``fedhmc.core.streams``) takes them.
"""

from __future__ import annotations

import dataclasses
import math
import sys
from dataclasses import dataclass

import torch

from fedhmc.algorithms import api, federated
from fedhmc.algorithms.federated import Layout, Weights
from fedhmc.algorithms.registry import Entry
from fedhmc.core import rng
from fedhmc.core.aggregate import weighted_average
from fedhmc.core.streams import STREAM_MINIBATCH

STREAM_NOISE = 1001
"""The clients' SGHMC noises ξ_t (draw t of the round)."""
STREAM_FIRST_MOMENTUM = 1002
"""A client's momentum in its first round."""


# ------------------------------------------------------------------ options


@dataclass(frozen=True)
class Settings(api.Settings):
    """fed-sghmc's options. ``step_size``, ``local_steps`` and ``friction`` share the
    options of the same names with fedhmc's samplers (``--step-size``, ``--local-steps``,
    ``--friction``: one option each, whose help names each sampler's meaning; a step size
    left unset is the dataset's η); ``drift_correction`` is this sampler's own
    (``--drift-correction``)."""

    step_size: float | None = api.option(
        None, "h, the Euler step of every client's SGHMC (default: the dataset's η)", low=0,
        low_open=True,
    )  # fmt: skip
    local_steps: int = api.option(10, "T, the Euler steps of a client in one round", low=1)
    friction: float | None = api.option(
        None, "B, the friction of each client's momentum (default 0.1 / step size: B·h = 0.1)",
        low=0,
    )  # fmt: skip
    drift_correction: float = api.option(
        1.0,
        "λ, the weight of the drift correction ḡ − g_c added to every local gradient (0: none)",
        low=0,
        high=1,
    )

    @property
    def B(self) -> float:
        """The friction B (0.1 / h where unset)."""
        return 0.1 / self.step_size if self.friction is None else self.friction

    def check(self) -> str | None:
        if self.step_size is not None and self.B * self.step_size > 1:
            return (
                f"friction × step size = {self.B * self.step_size:g} > 1 makes the momentum's "
                "decay 1 − B·h negative; lower --friction or --step-size"
            )
        return None


# ------------------------------------------------------------------ messages and state


@dataclass(frozen=True)
class Broadcast:
    """The server's message of round ``round``: θ̄ (S, D) and ḡ (S, D) (None in round 1).
    ``client_ids`` is the wire's (partial participation, which fed-sghmc does not do)."""

    round: int
    round_seed: int
    position: torch.Tensor
    mean_drift: torch.Tensor | None = None
    client_ids: torch.Tensor | None = None


MESSAGE = {"theta": "position", "drift": "mean_drift"}
"""The message's arrays by wire name → Broadcast field."""


@dataclass(frozen=True)
class ClientUpdate:
    """The round of M clients, stacked on axis 1.

    Attributes
    ----------
    position
        θ_T (S, M, D), sent.
    drift
        g_c (S, M, D), sent (None where λ = 0), and kept by the client.
    client_momentum
        p_c (S, M, D), kept by the client, never sent.
    grad_evals
        Gradient evaluations, summed over chains and clients.
    energy, energy_error
        Health numbers fedhmc reads where a sampler has them; None here.
    """

    position: torch.Tensor
    drift: torch.Tensor | None = None
    client_momentum: torch.Tensor | None = None
    grad_evals: int = 0
    energy: torch.Tensor | None = None
    energy_error: torch.Tensor | None = None


REPLY = {"theta": "position", "drift": "drift"}
"""A reply's arrays by wire name → ClientUpdate field."""


@dataclass(frozen=True)
class State:
    """The server's state after ``round`` rounds: θ̄ (S, D) and ḡ (S, D). ``clients`` is
    what the clients keep (their momenta p_c and drifts g_c), which fedhmc fills on the
    engine, where it computes every client; on Flower each client keeps its own in its
    node state and ``clients`` stays None."""

    position: torch.Tensor
    round: int = 0
    mean_drift: torch.Tensor | None = None
    clients: federated.ClientStore | None = None


@dataclass(frozen=True)
class Info:
    """What a round did: gradient evaluations, whether θ̄ stays finite, the clients in it."""

    grad_evals: int
    finite: bool
    clients: int
    energy_error: float | None = None


# ------------------------------------------------------------------ the round


def init(position: torch.Tensor, settings: Settings) -> State:
    """The state before round 1: θ̄ = ``position`` (S, D)."""
    return State(position)


def broadcast(seed: int, state: State, settings: Settings, weights: torch.Tensor) -> Broadcast:
    """Round ``state.round + 1``'s message to every client."""
    r = state.round + 1
    return Broadcast(
        round=r,
        round_seed=federated.round_seed(seed, r),
        position=state.position,
        mean_drift=state.mean_drift if settings.drift_correction > 0 else None,
    )


def layout(settings: Settings, round_: int) -> Layout:
    """θ̄ down (with ḡ from round 2 on); each client's θ_T and g_c up (θ alone where λ = 0)."""
    if settings.drift_correction == 0:
        return Layout(("position",), ("position",))
    down = ("position",) if round_ == 1 else ("position", "mean_drift")
    return Layout(down, ("position", "drift"))


def _minibatches(target, private: torch.Tensor, seeds, chains, round_: int, steps: int):
    """(keys, index of the round's first minibatch) of ``target.grad``: drawn from the
    private keys, or under random reshuffling (``--minibatch reshuffle``) the client's
    pass over its data, counted across the run."""
    if getattr(target, "minibatch", "uniform") == "reshuffle":
        from fedhmc.algorithms.fahmc import data_keys

        return data_keys(seeds, chains), (round_ - 1) * steps
    return rng.derive(private, STREAM_MINIBATCH), 0


def client_update(
    message: Broadcast,
    target,
    settings: Settings,
    seeds: torch.Tensor,
    *,
    momentum: torch.Tensor | None = None,
    drift: torch.Tensor | None = None,
) -> ClientUpdate:
    """The round of the clients of ``target`` (all N batched on the engine, one on Flower),
    with private seeds ``seeds`` (M,) and what they kept of their last round: ``momentum``
    and ``drift`` (S, M, D; None in a client's first round)."""
    theta0 = message.position
    S, D = theta0.shape
    M = int(seeds.shape[0])
    device, dtype = theta0.device, theta0.dtype
    h, B, T = settings.step_size, settings.B, settings.local_steps
    seeds = seeds.to(device)
    chains = torch.arange(S, device=device)
    private = rng.derive(seeds.view(1, M), message.round, chains.view(S, 1))  # (S, M)
    noise_keys = rng.derive(private, STREAM_NOISE)
    batch_keys, first = _minibatches(target, private, seeds, chains, message.round, T)
    scale = target.weights.to(device, dtype).rsqrt().view(1, M, 1)  # 1 / √w_c
    if momentum is None:  # a client's first round
        momentum = scale * rng.normal(rng.derive(private, STREAM_FIRST_MOMENTUM), 0, D, dtype)
    correction = None
    lam = settings.drift_correction
    if lam > 0 and drift is not None and message.mean_drift is not None:
        correction = lam * (message.mean_drift.unsqueeze(1) - drift)
    theta = theta0.unsqueeze(1).expand(S, M, D).clone()
    p = momentum.clone()
    total = torch.zeros_like(theta)
    decay, kick = 1.0 - B * h, math.sqrt(2.0 * B * h)
    for t in range(T):
        g, _ = target.grad(theta, batch_keys, first + t, False)
        total += g
        if correction is not None:
            g = g + correction
        xi = rng.normal(noise_keys, t, D, dtype)
        p = decay * p - h * g + kick * scale * xi
        theta = theta + h * p
    return ClientUpdate(
        position=theta,
        drift=total / T if lam > 0 else None,
        client_momentum=p,
        grad_evals=T * S * M,
    )


def combination(message: Broadcast, weights: torch.Tensor, replied=None) -> Weights:
    """The replies combine by the clients' weights, renormalised over those that replied."""
    return Weights(weights)


def server_update(
    state: State, update: ClientUpdate, how: Weights, settings: Settings
) -> tuple[State, Info]:
    """θ̄ = Σ_c w_c θ^(c) and ḡ = Σ_c w_c g_c over the clients that replied."""
    position = weighted_average(update.position, how.values)
    mean_drift = None if update.drift is None else weighted_average(update.drift, how.values)
    new = State(position, state.round + 1, mean_drift)
    finite = bool(torch.isfinite(position).all())
    return new, Info(int(update.grad_evals), finite, int(update.position.shape[1]))


def skip(state: State, settings: Settings) -> State:
    """A round in which no reply arrived: θ̄ and ḡ stay, the round counter moves on."""
    return dataclasses.replace(state, round=state.round + 1)


# ------------------------------------------------------------------ what clients keep


def client_keeps(message: Broadcast, update: ClientUpdate) -> dict:
    """What each of the round's M clients keeps of it (never sent): (S, M, D) tensors.
    fedhmc carries them to the client's next round on every backend."""
    out = {"momentum": update.client_momentum}
    if update.drift is not None:
        out["drift"] = update.drift
    return out


def kept_by_client(message: Broadcast, kept: dict) -> dict:
    """What the round's clients kept of their last round, as ``client_update``'s keywords
    (``kept`` is {} in their first round; ``kept["held"]`` (M,) marks those that kept
    anything, where some have not: every client takes part here, so all have)."""
    return {k: kept[k] for k in ("momentum", "drift") if k in kept}


def resumes_on_flower(settings: Settings) -> bool:
    """A run does not resume on new Flower nodes: the clients' momenta are theirs alone."""
    return False


def step(seed: int, state: State, target, settings: Settings) -> tuple[State, Info]:
    """One round with every client batched (the engine)."""
    return federated.step(sys.modules[__name__], seed, state, target, settings)


ENTRY = Entry(
    "fed-sghmc",
    module_path="fedsghmc.sampler",
    summary="federated SGHMC: clients keep their momenta, with a drift correction (a plugin)",
)  # a federated sampler (kind="federated") on both backends: what else the run needs to
# know (its options, that every client takes part in every round) is read from this module
