"""QLSD, QLSD* and QLSD++: quantised Langevin stochastic dynamics (Vono, Plassier, Durmus,
Dieuleveut and Moulines, AISTATS 2022).

Clients send compressed gradients and the server takes the Langevin step; one round is one
step. In round k:

1. the server draws S of the N clients uniformly without replacement (S = N: all) and sends
   θ_k (with the reference θ* under QLSD* and QLSD++);
2. client c computes H_c, an unbiased estimate of ∇U_c(θ_k), U_c = w_c f^(c) its share of
   the energy: plain QLSD its minibatch gradient; QLSD* and QLSD++ the control variate
   H_c = w_c [∇f̃^(c)(θ_k) − ∇f̃^(c)(θ*)] + w_c ∇f^(c)(θ*), the two minibatch gradients on
   the same minibatch and ∇f^(c)(θ*) on the client's full data (the prior's term is exact
   at θ_k);
3. it sends Δ_c = C_s(H_c − m_c), C_s the stochastic quantiser with s levels
   (`fedhmc.core.quantize`). Without memory m_c = 0; QLSD++'s client and server both keep
   m_c (0 at the start) and update it after the round: m_c ← m_c + α Δ_c, α = 1/(1 + ω_s);
4. the server: θ_{k+1} = θ_k − γ (N/S) Σ_{c drawn} (Δ_c + m_c) + √(2γ) ξ_k.

QLSD* has a set-up phase before round 1 (``setup_rounds``): ``--mode-steps`` rounds of
federated gradient descent, θ ← θ − γ Σ_c ∇U_c(θ) from every client's full-data gradient
(0 rounds by default), move the chain's start towards the posterior's mode; then a last
set-up round sends that start θ*, and every client computes ∇f^(c)(θ*) on its full data,
keeps it, and replies ∇U_c(θ*). QLSD++ refreshes θ* to θ_k every l rounds (rounds 1,
l + 1, 2l + 1, …). A client computes ∇f^(c)(θ*) once per reference and keeps it; one that
was not drawn when the reference changed (or that lost it) computes it when next drawn.

Randomness (``fedhmc.core.rng``): client c's private key in round r for chain s is
``derive(client_seed, r, s)``; its minibatch, reference-gradient and quantisation draws are
folded out of it; the server's noise ξ_k comes from the round seed, and the drawn clients
from the run's seed and the round, so every backend draws the same chain.

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
from fedhmc.core import participation, quantize, rng
from fedhmc.core.streams import STREAM_MINIBATCH, STREAM_QLSD_NOISE, STREAM_QLSD_QUANT

VARIANTS = ("plain", "star", "pp")
"""Plain QLSD, QLSD* (a fixed reference) and QLSD++ (a refreshed reference and a memory)."""


@dataclass(frozen=True)
class Settings(api.Settings):
    """QLSD's settings.

    Attributes
    ----------
    step_size
        γ, the Langevin step.
    quantization_levels
        s, the quantiser's levels (``inf``: the gradients are sent as they are).
    clients_per_round
        S, the clients drawn each round (None: every client).
    reference_refresh
        l, QLSD++: the rounds between two references (0 for QLSD and QLSD*).
    mode_steps
        QLSD*: the set-up's rounds of gradient descent towards the mode (0 for the others).
    variant
        ``plain``, ``star`` or ``pp`` (fixed by the algorithm's name).
    """

    LANGEVIN_STEP = True
    step_size: float | None = api.option(
        None,
        "γ, the Langevin step: θ ← θ − γ (N/S) Σ_c (Δ_c + m_c) + √(2γ) ξ (default: η²/2 of the "
        "dataset's η)",
        low=0,
        low_open=True,
    )
    quantization_levels: float = api.option(
        math.inf,
        "s, the levels of the clients' stochastic quantiser (inf: uncompressed gradients)",
        low=1,
        infinite=True,
    )
    clients_per_round: int | None = api.option(
        None, "S, the clients drawn uniformly without replacement each round (default: all)",
        low=1,
    )  # fmt: skip
    reference_refresh: int = api.option(
        10, "l, the rounds between two references θ* of QLSD++ (θ* ← θ_k)", low=1
    )
    mode_steps: int = api.option(
        0,
        "QLSD*'s rounds of federated gradient descent θ ← θ − γ ∇f(θ) before round 1, from "
        "every client's full-data gradient: the reference θ* and the chain's start move to "
        "the posterior's mode (0: θ* is the chain's start)",
        low=0,
    )
    variant: str = "plain"

    def check(self) -> str | None:
        s = self.quantization_levels
        if not (math.isinf(s) or float(s).is_integer()):
            return f"--quantization-levels must be an integer ≥ 1 or inf, got {s!r}"
        if self.variant not in VARIANTS:
            return f"QLSD's variant must be one of {', '.join(VARIANTS)}, got {self.variant!r}"
        return None


def memory_rate(settings: Settings, dim: int) -> float:
    """α = 1/(1 + ω_s), ω_s = min(d/s², √d/s) (0 for s = ∞)."""
    return 1.0 / (1.0 + quantize.omega(settings.quantization_levels, dim))


@dataclass(frozen=True)
class Broadcast:
    """The server's message of round ``round``.

    Attributes
    ----------
    position
        θ_k (S, D).
    reference, reference_round
        QLSD* and QLSD++: θ* (S, D) and the round it was set (0: in QLSD*'s set-up); else
        None. QLSD*'s last set-up round sends θ* as ``position``, with its round.
    client_ids
        The drawn clients (M,) when S < N; None when every client takes part.
    num_clients
        N (the server's: not sent).
    """

    round: int
    round_seed: int
    position: torch.Tensor
    reference: torch.Tensor | None = None
    reference_round: int | None = None
    client_ids: torch.Tensor | None = None
    num_clients: int = 0


MESSAGE = {"theta": "position", "reference": "reference"}
"""The arrays of a round's message by their wire names."""

MESSAGE_VALUES = {"reference-round": "reference_round"}
"""The scalars of a round's message by their wire names."""


def setup_rounds(settings: Settings) -> int:
    """QLSD*'s set-up phase: ``mode_steps`` rounds of gradient descent, then the reference
    gradients' round; none for QLSD and QLSD++."""
    return settings.mode_steps + 1 if settings.variant == "star" else 0


@dataclass(frozen=True)
class ClientUpdate:
    """The clients' side of a round, M clients stacked.

    Attributes
    ----------
    delta
        Δ_c = C_s(H_c − m_c) (S, M, D): what each client sends (None in a set-up round).
    setup_grad
        QLSD*'s set-up rounds: ∇U_c(θ) = w_c ∇f^(c)(θ) on the client's full data (S, M, D),
        sent.
    memory
        QLSD++: each client's new memory m_c + α Δ_c (S, M, D), kept by the client (not
        sent); else None.
    reference_grad
        QLSD* and QLSD++: each client's ∇f^(c)(θ*) (S, M, D), kept by the client (not sent).
    """

    delta: torch.Tensor | None = None
    setup_grad: torch.Tensor | None = None
    energy: torch.Tensor | None = None
    energy_error: torch.Tensor | None = None
    grad_evals: int = 0
    memory: torch.Tensor | None = None
    reference_grad: torch.Tensor | None = None


REPLY = {"delta": "delta", "grad": "setup_grad"}
"""The arrays of a client's reply by their wire names."""


def _delta_bits(settings: Settings, dim: int, float_bits: int) -> int:
    return quantize.bits(settings.quantization_levels, dim, float_bits)


REPLY_BITS = {"delta": _delta_bits}
"""The bits a reply's Δ_c really takes per chain: the norm, and a sign and a level per
coordinate."""


@dataclass(frozen=True)
class State:
    """The server's state after ``round`` rounds: θ (S, D); its copy of QLSD++'s memories
    m_c (S, N, D); the reference θ* (S, D) and its round; on the engine, what its clients
    keep (``clients``: their memories, and their ∇f^(c)(θ*) with its round)."""

    position: torch.Tensor
    round: int = 0
    memory: torch.Tensor | None = None
    reference: torch.Tensor | None = None
    reference_round: int | None = None
    clients: federated.ClientStore | None = None


@dataclass(frozen=True)
class Combination:
    """How a round's replies combine: the clients (ids among N) whose Δ_c arrived, in the
    replies' order, N, and the round's seed and reference (for the server's step)."""

    clients: torch.Tensor
    num_clients: int
    round_seed: int
    reference: torch.Tensor | None
    reference_round: int | None


def init(position: torch.Tensor, settings: Settings) -> State:
    """The state before the first round (QLSD*'s set-up, else round 1): θ = ``position``
    (S, D)."""
    return State(position, -setup_rounds(settings))


def _reference(state: State, settings: Settings, r: int):
    """(θ*, its round) that round ``r`` uses."""
    if settings.variant == "plain":
        return None, None
    refresh = state.reference is None or (
        settings.variant == "pp" and (r - 1) % settings.reference_refresh == 0
    )
    if refresh:
        return state.position, r
    return state.reference, state.reference_round


def broadcast(seed: int, state: State, settings: Settings, weights: torch.Tensor) -> Broadcast:
    """Round ``state.round + 1``'s message: θ_k, the reference under QLSD* and QLSD++, and
    the drawn clients when S < N (uniformly without replacement)."""
    r = state.round + 1
    N = int(weights.shape[0])
    if r <= 0:  # QLSD*'s set-up: every client; θ* is sent as the position in its last round
        common = dict(round=r, round_seed=federated.round_seed(seed, r), num_clients=N)
        return Broadcast(position=state.position, reference_round=0 if r == 0 else None, **common)
    S = settings.clients_per_round
    ids = None
    if S is not None and S < N:
        ids = participation.draw(seed, r, weights, S, "uniform").clients
    reference, reference_round = _reference(state, settings, r)
    return Broadcast(
        round=r,
        round_seed=federated.round_seed(seed, r),
        position=state.position,
        reference=reference,
        reference_round=reference_round,
        client_ids=ids,
        num_clients=N,
    )


def layout(settings: Settings, round_: int) -> Layout:
    """θ_k down (and θ* under QLSD* and QLSD++); each client's Δ_c up. QLSD*'s set-up
    rounds: θ down, ∇U_c(θ) up."""
    if round_ <= 0:
        return Layout(("position",), ("setup_grad",))
    down = ("position",) if settings.variant == "plain" else ("position", "reference")
    return Layout(down, ("delta",))


def _estimate(message, target, keys, reference_grad, valid):
    """(H_c / w_c (S, M, D), ∇f^(c)(θ*) or None, gradient evaluations per chain, summed over
    the clients). ``valid`` (M,) marks the clients whose ``reference_grad`` rows are of the
    message's reference; the others compute theirs."""
    S, D = message.position.shape
    M = target.num_clients
    batch = rng.derive(keys, STREAM_MINIBATCH)
    theta = message.position.unsqueeze(1).expand(S, M, D).clone()
    g, _ = target.grad(theta, batch, 0, False)
    if message.reference is None:
        return g, None, M
    at = message.reference.unsqueeze(1).expand(S, M, D)
    g_ref, _ = target.grad(at.clone(), batch, 0, False)
    if reference_grad is None:
        valid = torch.zeros(M, dtype=torch.bool, device=g.device)
    missing = M - int(valid.sum())
    if missing:  # ∇f^(c)(θ*) on the client's full data (deterministic)
        full, _ = target.with_batch_size(0).grad(at.clone(), batch, 0, False)
        kept = full if reference_grad is None else reference_grad
        reference_grad = torch.where(valid.view(1, M, 1), kept, full)
    return g - g_ref + reference_grad, reference_grad, 2 * M + missing


def client_update(
    message: Broadcast,
    target,
    settings: Settings,
    seeds: torch.Tensor,
    *,
    memory: torch.Tensor | None = None,
    reference_grad: torch.Tensor | None = None,
    reference_valid: torch.Tensor | None = None,
) -> ClientUpdate:
    """The round of the clients of ``target``: Δ_c = C_s(H_c − m_c).

    ``memory`` (S, M, D) is QLSD++'s m_c (None: zero, a client's first round);
    ``reference_grad`` the clients' kept ∇f^(c)(θ*), valid for the clients that
    ``reference_valid`` (M,) marks (those of the message's reference); the others' are
    computed here, and counted (None: every client's)."""
    S, D = message.position.shape
    M = int(seeds.shape[0])
    keys = federated.private_keys(seeds, message.round, S, message.position.device)
    if message.round <= 0:
        return _setup_update(message, target, keys)
    if reference_grad is not None and reference_valid is None:
        reference_valid = torch.ones(M, dtype=torch.bool, device=reference_grad.device)
    g, kept_grad, evals = _estimate(message, target, keys, reference_grad, reference_valid)
    weights = target.weights.to(g.dtype).view(1, M, 1)
    x = weights * g
    if memory is not None:
        x = x - memory
    delta = quantize.quantize_keyed(
        x, settings.quantization_levels, rng.derive(keys, STREAM_QLSD_QUANT)
    )
    new_memory = None
    if settings.variant == "pp":
        old = torch.zeros_like(delta) if memory is None else memory
        new_memory = old + memory_rate(settings, D) * delta
    return ClientUpdate(
        delta=delta,
        grad_evals=evals * S,
        memory=new_memory,
        reference_grad=kept_grad,
    )


def _setup_update(message: Broadcast, target, keys) -> ClientUpdate:
    """A set-up round of the clients of ``target``: ∇f^(c)(θ) on each one's full data (as
    ``_estimate`` computes a missing reference gradient), sent as ∇U_c(θ) and, in the last
    set-up round, kept as the reference's."""
    S, D = message.position.shape
    M = target.num_clients
    at = message.position.unsqueeze(1).expand(S, M, D)
    batch = rng.derive(keys, STREAM_MINIBATCH)
    full, _ = target.with_batch_size(0).grad(at.clone(), batch, 0, False)
    weights = target.weights.to(full.dtype).view(1, M, 1)
    kept = full if message.round == 0 else None
    return ClientUpdate(None, weights * full, grad_evals=S * M, reference_grad=kept)


def combination(message: Broadcast, weights, replied: torch.Tensor | None = None) -> Combination:
    """The clients whose Δ_c arrived (``replied``: their mask over the round's clients,
    None: all), in the replies' order."""
    ids = federated.replied_clients(message, message.num_clients, replied)
    return Combination(
        ids, message.num_clients, message.round_seed, message.reference, message.reference_round
    )


def server_update(
    state: State, update: ClientUpdate, how: Combination, settings: Settings
) -> tuple[State, Info]:
    """θ_{k+1} = θ_k − γ (N/M) Σ_c (Δ_c + m_c) + √(2γ) ξ_k over the M clients that replied
    (M = S when all did), QLSD++'s memories updated, and the reference kept."""
    theta = state.position
    S, D = theta.shape
    M = int(how.clients.shape[0])
    if update.delta is None:
        return _setup_step(state, update, how, settings)
    total = update.delta.sum(dim=1)
    memory = state.memory
    if settings.variant == "pp":
        if memory is None:
            memory = torch.zeros(S, how.num_clients, D, dtype=theta.dtype, device=theta.device)
        total = total + memory[:, how.clients].sum(dim=1)
        memory = memory.clone()
        memory[:, how.clients] += memory_rate(settings, D) * update.delta
    gamma = settings.step_size
    chains = torch.arange(S, device=theta.device)
    xi = rng.normal(rng.derive(how.round_seed, STREAM_QLSD_NOISE, chains), 0, D, theta.dtype)
    position = theta - gamma * (how.num_clients / M) * total + math.sqrt(2 * gamma) * xi
    new = State(position, state.round + 1, memory, how.reference, how.reference_round)
    finite = bool(torch.isfinite(position).all())
    return new, Info(int(update.grad_evals), finite, M)


def _setup_step(state: State, update: ClientUpdate, how: Combination, settings: Settings):
    """A set-up round's server side: a gradient-descent step θ ← θ − γ (N/M) Σ_c ∇U_c(θ)
    over the M clients that replied, or in the last set-up round θ* = θ, the reference."""
    r, theta = state.round + 1, state.position
    M = int(how.clients.shape[0])
    if r == 0:
        new = State(theta, r, state.memory, theta, 0)
    else:
        step = settings.step_size * (how.num_clients / M)
        new = State(theta - step * update.setup_grad.sum(dim=1), r)
    finite = bool(torch.isfinite(new.position).all() and torch.isfinite(update.setup_grad).all())
    return new, Info(int(update.grad_evals), finite, M)


def skip(state: State, settings: Settings) -> State:
    """A round with no reply: θ stays, the round counter moves on."""
    return dataclasses.replace(state, round=state.round + 1)


def client_keeps(message: Broadcast, update: ClientUpdate) -> dict:
    """What each client keeps of its round: QLSD++'s memory m_c, and ∇f^(c)(θ*) with the
    reference round it is of."""
    out = {}
    if update.memory is not None:
        out["memory"] = update.memory
    if update.reference_grad is not None:
        grad = update.reference_grad
        out["reference_grad"] = grad
        out["reference_round"] = grad.new_full(
            (grad.shape[1],), int(message.reference_round), dtype=torch.int64
        )
    return out


def kept_by_client(message: Broadcast, kept: dict) -> dict:
    """The clients' memories (zero for a client that kept none), and their ∇f^(c)(θ*)
    where it is of the message's reference (``reference_valid``; the others compute
    theirs)."""
    out = {}
    if "memory" in kept:
        out["memory"] = kept["memory"]
    if "reference_grad" in kept and message.reference_round is not None:
        out["reference_grad"] = kept["reference_grad"]
        out["reference_valid"] = kept["held"] & (kept["reference_round"] == message.reference_round)
    return out


def resumes_on_flower(settings: Settings) -> bool:
    """Whether a run resumes on new Flower nodes: not QLSD++, whose clients' memories
    are theirs alone (QLSD*'s reference gradient is recomputed where it is missing)."""
    return settings.variant != "pp"


def step(seed: int, state: State, target, settings: Settings) -> tuple[State, Info]:
    """One round, every client and chain batched (``seed``: the run's)."""
    return federated.step(sys.modules[__name__], seed, state, target, settings)
