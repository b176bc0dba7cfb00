"""FA-HMC: federated averaging of stochastic-gradient HMC (Liang et al. 2024, Algorithm 3).

One communication round, on every client c in parallel, starting from the broadcast θ̄:

    for t = 0 … T−1:
        p  = √ρ ξ_t + √(1−ρ) ξ_t^(c) / √w_c             (fedhmc.core.momentum)
        θ^(c) ← leapfrog(∇f̃^(c), θ^(c), p, η, K)        (fedhmc.core.integrators)
    θ̄ = Σ_c w_c θ^(c)                                   (fedhmc.core.aggregate)

K = 1 is FA-LD (federated averaging Langevin dynamics with learning rate η²/2).

The gradient oracle adds the injected noise N(0, σ_g² I) when σ_g > 0 and divides by the
posterior temperature τ (the target is exp(−f/τ)).

Randomness is counter-based and keyed (``fedhmc.core.rng``):

- the round seed, ``round_seed(seed, r)``, is what the server broadcasts; the shared
  momentum key of chain s is ``derive(round_seed, s)``;
- client c's own seed is ``client_seed(seed, c)``; its private key in round r for chain s is
  ``derive(client_seed, r, s)``, from which the momentum, minibatch and gradient-noise
  streams are folded out.

A round is ``broadcast`` (the server's message), ``client_update`` (the clients' local
iterations: all N batched in the engine, one alone in a Flower ClientApp) and
``server_update`` (the average and what the next round carries); ``step`` composes the
three. Since a client's numbers depend only on its own seed, the round seed and θ̄, one
client alone draws exactly what it draws in the batched engine.
"""

from __future__ import annotations

import dataclasses
import math
import sys
import typing
from dataclasses import dataclass

import torch

from fedhmc.algorithms import api, federated
from fedhmc.algorithms.federated import (
    Coefficients,
    Layout,
    Weights,
    client_seed,
    client_seeds,
    round_clients,
    round_seed,
)
from fedhmc.core import PARTICIPATION_SCHEMES, SYNC_UNITS, gradients, participation, rng
from fedhmc.core.aggregate import combine, weighted_average
from fedhmc.core.integrators import leapfrog
from fedhmc.core.momentum import draw_momentum
from fedhmc.core.streams import STREAM_MINIBATCH, STREAM_MOMENTUM, STREAM_RESHUFFLE

PROTOCOLS = ("algorithm3", "authors")
"""The ``--protocol`` values FA-HMC runs under: the paper's Algorithm 3 and what the authors'
experiment code runs."""


@dataclass(frozen=True)
class Segment:
    """A stretch of leapfrog steps of one round with no exchange and no new momentum inside.

    Attributes
    ----------
    steps
        Leapfrog steps in the stretch.
    new_trajectory
        Whether a trajectory starts here (a fresh momentum draw; under ``restart`` the
        position also restarts from the outer iteration's origin X₀).
    momentum_counter
        The counter of the momentum draw (the trajectory's index within the round), or −1.
    first_eval
        The round-local index of the stretch's first gradient evaluation.
    """

    steps: int
    new_trajectory: bool
    momentum_counter: int
    first_eval: int


@dataclass(frozen=True)
class Settings(api.Settings):
    """The options of FA-HMC (and of FA-LD, its K = 1): each field's help says what it is.

    ``clients_per_round`` and ``participation`` are the run's (`fedhmc.algorithms.api.SHARED`).
    """

    STEP_SYMBOL: typing.ClassVar[str] = "eta"

    step_size: float | None = api.option(
        None,
        "η, the leapfrog step (FA-LD's Langevin learning rate is η²/2; default per dataset)",
        low=0,
        low_open=True,
    )
    leapfrog_steps: int = api.option(10, "K, leapfrog steps per iteration", low=1)
    local_steps: int = api.option(
        10,
        "T, local iterations per communication round (leapfrog steps with `--sync-unit leapfrog`)",
        low=1,
    )
    rho: float = api.option(1.0, "ρ, the momentum correlation across clients", low=0, high=1)
    grad_noise: float = api.option(
        0.0, "σ_g, the std of the Gaussian noise added to every gradient", low=0
    )
    temperature: float = api.option(
        1.0, "τ, the posterior temperature: the target is exp(−f/τ)", low=0, low_open=True
    )
    sync_unit: str = api.option(
        "iteration",
        "what T counts: iteration (T whole trajectories, then positions averaged: Algorithm "
        "3) or leapfrog (T leapfrog steps on a global counter, then positions and momenta "
        "averaged, mid-trajectory too)",
        choices=SYNC_UNITS,
    )
    fresh_gradients: bool = api.option(
        False,
        "two fresh minibatch gradients per leapfrog step (2K per trajectory) instead of "
        "reusing the end-of-step gradient (K + 1)",
    )
    restart_trajectories: bool = api.option(
        False,
        "`--sync-unit leapfrog`: an outer iteration is T trajectories (K rounds), each "
        "restarting from the position broadcast at its start, which becomes the average at "
        "its end (the authors' simulated-BLR code)",
    )
    clients_per_round: int | None = api.option(
        None, "S, the clients drawn each round by `--participation`'s scheme", low=1
    )
    participation: str = api.option(
        "normalized", "how the S clients are drawn and weighted", choices=PARTICIPATION_SCHEMES
    )

    def check(self) -> str | None:
        return _refusal(self)

    @property
    def leapfrog_sync(self) -> bool:
        return self.sync_unit == "leapfrog"

    def _evals(self, steps: int) -> int:
        return 2 * steps if self.fresh_gradients else steps + 1

    def segments(self, round_: int) -> list[Segment]:
        """The stretches of round ``round_`` (1-based), in order."""
        K, T = self.leapfrog_steps, self.local_steps
        out: list[Segment] = []
        e = 0
        if not self.leapfrog_sync:
            for t in range(T):
                out.append(Segment(K, True, t, e))
                e += self._evals(K)
            return out
        start = (round_ - 1) * T  # global leapfrog steps done before this round
        o, starts = 0, 0
        while o < T:
            pos = (start + o) % K
            steps = min(K - pos, T - o)
            new = pos == 0
            out.append(Segment(steps, new, starts if new else -1, e))
            starts += new
            e += self._evals(steps)
            o += steps
        return out

    def evals_in_round(self, round_: int) -> int:
        """Gradient evaluations of one client and chain in round ``round_``."""
        if not self.leapfrog_sync:
            return self.local_steps * self._evals(self.leapfrog_steps)
        if self.fresh_gradients:
            return 2 * self.local_steps
        return self.local_steps + len(self.segments(round_))

    @property
    def grad_evals_per_round(self) -> int:
        """Gradient evaluations per client and chain in round 1 (every round of Algorithm 3:
        T (K + 1), or 2TK with fresh gradients)."""
        return self.evals_in_round(1)

    def evals_before(self, round_: int) -> int:
        """Gradient evaluations of one client and chain in rounds 1 … ``round_`` − 1: the
        global counter of the random-reshuffling minibatches."""
        done = round_ - 1
        if done <= 0:
            return 0
        if not self.leapfrog_sync or self.fresh_gradients:
            return done * self.evals_in_round(1)
        # Reused gradients: T + (number of stretches) per round. A stretch starts at every
        # round start and at every trajectory start that is not one.
        K, T = self.leapfrog_steps, self.local_steps
        last = done * T - 1
        lcm = K * T // math.gcd(K, T)
        return done * T + done + last // K - last // lcm

    def starts_mid_trajectory(self, round_: int) -> bool:
        """Whether round ``round_`` continues a trajectory (it needs the averaged momentum)."""
        return self.leapfrog_sync and ((round_ - 1) * self.local_steps) % self.leapfrog_steps != 0

    def ends_trajectory(self, round_: int) -> bool:
        """Whether a trajectory ends with round ``round_`` (its average is a sample): the
        leapfrog count is a multiple of lcm(T, K) (of T·K under ``restart``: the end of an
        outer iteration). Every round of Algorithm 3 ends its trajectories."""
        if not self.leapfrog_sync:
            return True
        K, T = self.leapfrog_steps, self.local_steps
        period = T * K if self.restart_trajectories else K
        return (round_ * T) % period == 0


def _refusal(s: Settings) -> str | None:
    """Why ``s`` cannot run, in one line, or None (each option's own range is checked by
    its declaration)."""
    if s.restart_trajectories and s.sync_unit != "leapfrog":
        return "--restart-trajectories needs --sync-unit leapfrog"
    if s.local_steps * max(s.leapfrog_steps + 1, 2 * s.leapfrog_steps) >= 1 << 29:
        return (
            "T·(K + 1) (T·2K with fresh gradients) must be below 2**29 gradient evaluations "
            "per round"
        )
    return None


def energy_error_sign(k: int, steps: int, fresh: bool) -> int:
    r"""The sign of $|g_k|^2$ in the leapfrog's energy error over one trajectory piece.

    One velocity-Verlet step changes $H = U + |p|^2/2$ by
    $\frac{\eta^2}{8}(|g_{k+1}|^2 - |g_k|^2)$ plus the error of the trapezoid rule
    $\frac12 (g_k + g_{k+1}) \cdot (\theta_{k+1} - \theta_k)$ for $U(\theta_{k+1}) - U(\theta_k)$,
    which vanishes for a quadratic U. Over K steps the sum telescopes to
    $\frac{\eta^2}{8}(|g_K|^2 - |g_0|^2)$: the first evaluation counts −1 and the last +1. With
    fresh gradients (evaluations 2k at $\theta_k$ and 2k + 1 at $\theta_{k+1}$, on different
    minibatches) the
    same two ends are used: the per-step terms would add the minibatch noise of |g|² 2K
    times over, which measures the noise, not the integrator. Costs one reduction for each
    end and no extra gradient.
    """
    last = 2 * steps - 1 if fresh else steps
    return -1 if k == 0 else (1 if k == last else 0)


def round_keys(
    seed_of_round: int, client_seeds: torch.Tensor, round_: int, chains: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Shared keys (S,) and private keys (S, N) of a round."""
    shared = rng.derive(seed_of_round, chains)
    private = rng.derive(client_seeds.view(1, -1), round_, chains.view(-1, 1))
    return shared, private


def data_keys(client_seeds: torch.Tensor, chains: torch.Tensor) -> torch.Tensor:
    """Keys (S, N) of the random-reshuffling minibatches: one per chain and client for the
    whole run (the permutation of a pass does not depend on the round)."""
    return rng.derive(client_seeds.view(1, -1), STREAM_RESHUFFLE, chains.view(-1, 1))


@dataclass(frozen=True)
class RoundStart:
    """What one round of local iterations starts from besides the positions and the keys
    (`local_iterations`).

    Attributes
    ----------
    round
        The round number (1-based): with ``sync_unit="leapfrog"`` it places the round on
        the global leapfrog counter; with random-reshuffling minibatches, on the run's
        minibatch counter.
    correction
        Debiased FA-HMC's control variate ∇f(θ_a) − ∇f^(c)(θ_a), (S, N, D), added to every
        gradient; None for plain FA-HMC.
    momentum
        The averaged momentum to continue from, (S, N, D) or (S, 1, D), when the round
        starts in the middle of a trajectory (``Settings.starts_mid_trajectory``).
    origin
        Under ``restart``: the outer iteration's origin X₀, (S, N, D) or (S, 1, D).
    reshuffle_keys
        ``data_keys`` of the clients, when the target draws random-reshuffling
        minibatches.
    first_minibatch
        With random reshuffling: the run's minibatch number of the round's first
        evaluation as a 0-d int64 tensor on the device (a CUDA graph's input, so that a
        replay draws the next round's minibatches); None: ``settings.evals_before(round)``.
    """

    round: int = 1
    correction: torch.Tensor | None = None
    momentum: torch.Tensor | None = None
    origin: torch.Tensor | None = None
    reshuffle_keys: torch.Tensor | None = None
    first_minibatch: torch.Tensor | None = None


class _RoundOracle:
    """The gradient oracle of one round of local iterations: the minibatches (planned ahead,
    or random reshuffling's), the control variate, injected noise and temperature; it keeps
    the energy of the round's last evaluation (``last_energy``, (S, N))."""

    def __init__(self, target, private_keys, settings: Settings, start: RoundStart, theta):
        S, N, _ = theta.shape
        self.target, self.settings, self.correction = target, settings, start.correction
        self.keys_noise = gradients.noise_keys(private_keys)
        if getattr(target, "minibatch", "uniform") == "reshuffle":
            if start.reshuffle_keys is None:
                raise ValueError("a random-reshuffling target needs reshuffle_keys (data_keys)")
            first = start.first_minibatch
            self.offset = settings.evals_before(start.round) if first is None else first
            self.keys_batch, self.plan = start.reshuffle_keys, False
        else:
            self.keys_batch = rng.derive(private_keys, STREAM_MINIBATCH)
            self.offset, self.plan = 0, True
        self.reshuffled = start.reshuffle_keys is not None
        self.total = settings.evals_in_round(start.round)
        self.last_energy = torch.zeros(S, N, dtype=theta.dtype, device=theta.device)

    def stretch(self, seg: Segment, dh: torch.Tensor):
        """The ``grad_fn(θ, k)`` of stretch ``seg``, its minibatches fetched: it adds each
        end's signed |g|² (`energy_error_sign`) to ``dh`` (S, N)."""
        target, settings = self.target, self.settings
        base, fresh, steps = seg.first_eval, settings.fresh_gradients, seg.steps
        seg_evals = 2 * steps if fresh else steps + 1
        if self.plan:
            target.prefetch(self.keys_batch, base, seg_evals, horizon=self.total - base)
        elif self.reshuffled and not target.full_batch:
            # the permutations of the passes the stretch visits
            target.reshuffle_window(self.keys_batch, self.offset + base, seg_evals)
        sigma, inv_temp = settings.grad_noise, 1.0 / settings.temperature

        def grad_fn(th: torch.Tensor, k: int) -> torch.Tensor:
            # The energy is only needed once a round, to stop a diverging chain.
            need_energy = base + k == self.total - 1
            g, energy = target.grad(th, self.keys_batch, self.offset + base + k, need_energy)
            g = gradients.corrected(g, self.correction, inplace=True)
            g = gradients.add_noise(g, self.keys_noise, base + k, sigma, inplace=True)
            g = gradients.tempered(g, settings.temperature, inplace=True)
            if need_energy:
                self.last_energy.copy_(energy * inv_temp)
            sign = energy_error_sign(k, steps, fresh)
            if sign:
                dh.add_(g.square().sum(-1, dtype=torch.float64), alpha=sign)
            return g

        return grad_fn


def _stretch_start(seg: Segment, theta, p, draw, settings: Settings, start: RoundStart):
    """(θ, p) at the start of stretch ``seg``: a new trajectory draws its momentum
    (``draw(counter, D, dtype)``) and, under ``restart``, starts from the origin X₀; a
    stretch that continues one keeps ``p``."""
    S, N, D = theta.shape
    if seg.new_trajectory:
        if settings.restart_trajectories:
            if start.origin is None:
                raise ValueError("restart needs the outer iteration's origin")
            theta = start.origin.expand(S, N, D)
        return theta, draw(seg.momentum_counter, D, theta.dtype)
    if p is None:
        raise ValueError(
            f"round {start.round} starts in the middle of a trajectory: pass the momentum"
        )
    return theta, p


def local_iterations(
    target,
    theta: torch.Tensor,
    shared_keys: torch.Tensor,
    private_keys: torch.Tensor,
    settings: Settings,
    start: RoundStart | None = None,
) -> ClientUpdate:
    """Run one round of local FA-HMC on every (chain, client) at once.

    Parameters
    ----------
    target
        A target from ``fedhmc.models.targets`` with N clients.
    theta
        Start positions, (S, N, D). Not modified.
    shared_keys, private_keys
        From ``round_keys``: (S,) and (S, N).
    settings
        η, K, T, ρ, σ_g, τ and the protocol (sync unit, fresh gradients, restart).
    start
        The round's number and what it carries (`RoundStart`); None: round 1 of plain
        FA-HMC, uniform minibatches.

    Returns
    -------
    ClientUpdate
        End positions (S, N, D), with the end momenta under ``sync_unit="leapfrog"``.
    """
    start = RoundStart() if start is None else start
    S, N, D = theta.shape
    eta = settings.step_size
    keys_mom = rng.derive(private_keys, STREAM_MOMENTUM)
    oracle = _RoundOracle(target, private_keys, settings, start, theta)
    abs_dh = torch.zeros(S, N, dtype=torch.float64, device=theta.device)
    trajectories = 0.0

    def draw(counter: int, dim: int, dtype: torch.dtype) -> torch.Tensor:
        return draw_momentum(
            shared_keys, keys_mom, target.weights, settings.rho, counter, dim, dtype
        )

    p = None if start.momentum is None else start.momentum.expand(S, N, D)
    for seg in settings.segments(start.round):
        theta, p = _stretch_start(seg, theta, p, draw, settings, start)
        dh = torch.zeros(S, N, dtype=torch.float64, device=theta.device)
        grad_fn = oracle.stretch(seg, dh)
        theta, p, _ = leapfrog(grad_fn, theta, p, eta, seg.steps, fresh=settings.fresh_gradients)
        abs_dh.add_(dh.abs_(), alpha=eta * eta / 8.0)
        trajectories += seg.steps / settings.leapfrog_steps
    return ClientUpdate(
        position=theta,
        energy=oracle.last_energy,
        energy_error=abs_dh / max(trajectories, 1e-300),
        grad_evals=oracle.total * S * N,
        momentum=p if settings.leapfrog_sync else None,
    )


# ------------------------------------------------------------------ the algorithm API
#
# One round is three functions, composed once (fedhmc.algorithms.federated):
#
#     message = broadcast(seed, state, settings, weights)              the server
#     update  = client_update(message, target, settings, seeds)        each client (or all)
#     state, info = server_update(state, update, combination, settings) the server
#
# ``step`` is the three in a row with every client batched (the engine); the Flower
# ServerApp opens and closes the round (``federated.open_round``/``close_round``) around
# its messages, and the clients' half (``federated.run_clients``) runs each ClientApp's
# client on its own data, or a simulation's co-located clients batched.


@dataclass(frozen=True)
class Broadcast:
    """What the server sends every client at the start of a round.

    Attributes
    ----------
    round
        The round number r (1-based).
    round_seed
        The seed of the round's shared momentum (``round_seed(seed, r)``).
    position
        θ̄ (S, D).
    momentum
        ``sync_unit="leapfrog"``: the averaged momentum (S, D) when the round continues a
        trajectory; else None.
    origin
        Under ``restart``: the outer iteration's origin X₀ (S, D); else None.
    anchor_round, anchor_position, anchor_grad
        Debiased FA-HMC from round 2 on: the round in which the anchor θ_a was sent, θ_a
        (S, D) and the global gradient ∇f(θ_a) (S, D); None otherwise.
    client_ids
        Under partial participation: the ids of the drawn clients (M,) in increasing order
        (only they are sent the message); None when every client takes part.
    coefficients
        Under partial participation: the drawn clients' coefficients (M,) in the average
        (the server's: not sent); else None.
    """

    round: int
    round_seed: int
    position: torch.Tensor
    momentum: torch.Tensor | None = None
    origin: torch.Tensor | None = None
    anchor_round: int | None = None
    anchor_position: torch.Tensor | None = None
    anchor_grad: torch.Tensor | None = None
    client_ids: torch.Tensor | None = None
    coefficients: torch.Tensor | None = None


MESSAGE = {"theta": "position", "momentum": "momentum", "origin": "origin"}
"""The arrays of a round's message by their wire names: wire name → ``Broadcast`` field."""

REPLY = {"theta": "position", "momentum": "momentum"}
"""The arrays of a client's reply by their wire names: wire name → ``ClientUpdate`` field."""


@dataclass(frozen=True)
class ClientUpdate:
    """The clients' side of a round: what each client replies, M clients stacked.

    Attributes
    ----------
    position
        The clients' new positions (S, M, D).
    energy
        The minibatch energy (S, M) of each chain and client at its last position, or None
        where the reply does not carry it.
    energy_error
        The leapfrog's mean |ΔH| per trajectory (S, M) of each chain and client (a health
        check), or None.
    grad_evals
        Gradient evaluations, summed over the M clients and S chains.
    momentum
        ``sync_unit="leapfrog"``: each client's end momentum (S, M, D); else None.
    local_grad
        Debiased FA-HMC: each client's local gradient ∇f^(c) at the θ̄ it was sent
        (S, M, D), from which the server forms the next round's ∇f(θ_a); else None.
    """

    position: torch.Tensor
    energy: torch.Tensor | None = None
    energy_error: torch.Tensor | None = None
    grad_evals: int = 0
    momentum: torch.Tensor | None = None
    local_grad: torch.Tensor | None = None


@dataclass(frozen=True)
class Info:
    """What one round did, as the server sees it.

    Attributes
    ----------
    grad_evals
        Client-gradient evaluations, summed over clients and chains (the updates' own count).
    finite
        Whether every energy the clients reported is finite.
    clients
        How many clients' updates entered the average.
    energy_error
        The leapfrog's mean |ΔH| per trajectory over chains and clients, or None where the
        clients did not report it.
    energy
        (S, M): the minibatch energy of each chain and client at its last position (None
        where the clients did not send it).
    momentum
        ``sync_unit="leapfrog"``: the averaged momentum of the clients' end momenta (S, D);
        else None.
    """

    grad_evals: int
    finite: bool
    clients: int
    energy_error: float | None = None
    energy: torch.Tensor | None = None
    momentum: torch.Tensor | None = None


def round_info(update: ClientUpdate, momentum: torch.Tensor | None = None) -> Info:
    """The Info of a round whose clients replied with ``update``: its two health numbers
    come to the host in one transfer."""
    health = []
    if update.energy is not None:
        health.append(torch.isfinite(update.energy).all().to(torch.float64))
    if update.energy_error is not None:
        health.append(update.energy_error.mean(dtype=torch.float64))
    values = torch.stack(health).tolist() if health else []
    finite = True if update.energy is None else values.pop(0) == 1.0
    return Info(
        grad_evals=int(update.grad_evals),
        finite=finite,
        clients=int(update.position.shape[1]),
        energy_error=values[0] if values else None,
        energy=update.energy,
        momentum=momentum,
    )


@dataclass(frozen=True)
class State:
    """FA-HMC between rounds: what the server holds.

    ``position`` is θ̄ (S, D) after ``round`` rounds. Under ``sync_unit="leapfrog"``,
    ``momentum`` is the averaged momentum (S, D) that continues a trajectory into the next
    round, and under ``restart`` ``origin`` is the outer iteration's X₀; both are None
    otherwise.
    """

    position: torch.Tensor
    round: int = 0
    momentum: torch.Tensor | None = None
    origin: torch.Tensor | None = None


def init(position: torch.Tensor, settings: Settings) -> State:
    """The state before round 1: θ̄ = ``position`` (S, D)."""
    return State(position, 0, None, position if settings.restart_trajectories else None)


def broadcast(
    seed: int, state: State, settings: Settings, weights: torch.Tensor | None = None
) -> Broadcast:
    """What the server sends in round ``state.round + 1`` of run ``seed``.

    Under partial participation (``settings.clients_per_round``) it also draws the round's
    clients from the clients' ``weights`` (N,) (w_c or n_c), with their coefficients; with
    S = N and the ``uniform`` or ``normalized`` scheme every client takes part, as without.
    """
    r = state.round + 1
    client_ids = coefficients = None
    S = settings.clients_per_round
    if S is not None:
        if weights is None:
            raise ValueError("partial participation draws its clients from their weights")
        full = S == int(weights.shape[0]) and settings.participation != "weighted"
        if not full:
            d = participation.draw(seed, r, weights, S, settings.participation)
            client_ids, coefficients = d.clients, d.coefficients
    return Broadcast(
        round=r,
        round_seed=round_seed(seed, r),
        position=state.position,
        momentum=state.momentum if settings.starts_mid_trajectory(r) else None,
        origin=state.origin if settings.restart_trajectories else None,
        client_ids=client_ids,
        coefficients=coefficients,
    )


def layout(settings: Settings, round_: int) -> Layout:
    """The arrays of round ``round_``: θ̄ down and each client's position up; under
    ``sync_unit="leapfrog"`` the momenta both ways (down only when the round continues a
    trajectory) and the origin X₀ down under ``restart``."""
    down, up = ["position"], ["position"]
    if settings.leapfrog_sync:
        if settings.starts_mid_trajectory(round_):
            down.append("momentum")
        if settings.restart_trajectories:
            down.append("origin")
        up.append("momentum")
    return Layout(tuple(down), tuple(up))


def _round_inputs(message: Broadcast, target, settings: Settings, seeds, correction) -> tuple:
    """The tensors the clients' round computes from, in `client_update`'s order (a CUDA
    graph's inputs): θ̄ (S, D), the shared and private keys, the control variate, the
    carried momentum and origin (S, 1, D), the random-reshuffling keys and the round's first
    minibatch number (a tensor only where the round is replayed from a CUDA graph)."""
    theta_bar = message.position
    seeds = seeds.to(theta_bar.device)
    chains = torch.arange(theta_bar.shape[0], device=theta_bar.device)
    shared, private = round_keys(message.round_seed, seeds, message.round, chains)
    reshuffle = getattr(target, "minibatch", "uniform") == "reshuffle"
    momentum = None if message.momentum is None else message.momentum.unsqueeze(1)
    origin = None if message.origin is None else message.origin.unsqueeze(1)
    reshuffle_keys = data_keys(seeds, chains) if reshuffle else None
    first_minibatch = None
    if reshuffle and getattr(target, "graphs", None) is not None:
        # The round's place on the minibatch counter is a graph's input (a fill, not a
        # blocking copy).
        first = settings.evals_before(message.round)
        first_minibatch = torch.full((), first, dtype=torch.int64, device=theta_bar.device)
    return theta_bar, shared, private, correction, momentum, origin, reshuffle_keys, first_minibatch


def _round_kind(target, settings: Settings, round_: int, shape: tuple, inputs: tuple):
    """The key of round ``round_``'s CUDA graph (`fedhmc.core.graphs`) where ``target``
    replays its rounds from them, else None.

    Every round of a kind runs the same kernels on new inputs. The graph's round number and
    the closure's other values are the same in every round of the kind the key names: under
    ``sync_unit="leapfrog"`` the kind includes the round's stretches (where trajectories
    start and end in it), which repeat with a period of lcm(T, K) / T rounds.
    Random-reshuffling minibatches count across the run: the round's first minibatch number
    is an input."""
    if getattr(target, "graphs", None) is None:
        return None
    stretches = tuple(settings.segments(round_)) if settings.leapfrog_sync else None
    nones = tuple(x is None for x in inputs)
    return (target, settings, *shape, inputs[0].dtype, nones, stretches)


def client_update(
    message: Broadcast,
    target,
    settings: Settings,
    seeds: torch.Tensor,
    *,
    correction: torch.Tensor | None = None,
) -> ClientUpdate:
    """The round of the clients of ``target`` from the server's ``message``.

    Parameters
    ----------
    message
        The round's ``Broadcast``.
    target
        The clients' target: all N clients batched (the engine), or one client's own
        (``target.client(c)``, a Flower client; its weight uses the global n).
    settings
        The round's settings.
    seeds
        The clients' private seeds (M,) (``client_seeds``); never sent over the network.
    correction
        Debiased FA-HMC's control variate ∇f(θ_a) − ∇f^(c)(θ_a), (S, M, D), added to every
        gradient; None for plain FA-HMC.

    Returns
    -------
    ClientUpdate
        Positions (S, M, D); client c's slice is what it computes alone.
    """
    S, D = message.position.shape
    M = int(seeds.shape[0])
    if target.num_clients != M:
        raise ValueError(
            f"client_update got {M} client seeds for a target of {target.num_clients} clients"
        )
    inputs = _round_inputs(message, target, settings, seeds, correction)

    def round_fn(theta_bar, shared, private, correction, momentum, origin, keys, first):
        start = RoundStart(message.round, correction, momentum, origin, keys, first)
        theta = theta_bar.unsqueeze(1).expand(S, M, D)
        u = local_iterations(target, theta, shared, private, settings, start)
        return u.position, u.energy, u.energy_error, u.momentum

    kind = _round_kind(target, settings, message.round, (S, M, D), inputs)
    if kind is not None:
        position, energy, energy_error, p = target.graphs(kind, round_fn, inputs)
    else:
        position, energy, energy_error, p = round_fn(*inputs)
    return ClientUpdate(
        position=position,
        energy=energy,
        energy_error=energy_error,
        grad_evals=settings.evals_in_round(message.round) * S * M,
        momentum=p,
    )


def combination(
    message: Broadcast, weights: torch.Tensor | None, replied: torch.Tensor | None = None
) -> Weights | Coefficients:
    """How the replies of ``message``'s round combine: with every client sent the message,
    their ``weights`` (n_c or w_c of the clients that replied), renormalised over them;
    under partial participation, the scheme's coefficients of the drawn clients that
    replied (``replied``: their mask; None: all), rescaled so that the round's total stays
    what the scheme gave."""
    if message.client_ids is None:
        return Weights(weights)
    if replied is None:
        return Coefficients(message.coefficients)
    return Coefficients(participation.renormalized(message.coefficients, replied))


def average(x: torch.Tensor, how: Weights | Coefficients) -> torch.Tensor:
    """Σ_c over the clients of ``x`` (S, M, D): weighted (renormalised) or by coefficients."""
    if isinstance(how, Coefficients):
        return combine(x, how.values)
    return weighted_average(x, how.values)


def server_update(
    state: State, update: ClientUpdate, how: Weights | Coefficients, settings: Settings
) -> tuple[State, Info]:
    """The server's side of a round: θ̄ = Σ_c w_c θ^(c) over the clients that replied
    (``how``: their weights or the round's coefficients, ``combination``), the momenta
    averaged the same way under ``sync_unit="leapfrog"``, and the outer iteration's origin
    under ``restart``."""
    r = state.round + 1
    position = average(update.position, how)
    momentum = average(update.momentum, how) if settings.leapfrog_sync else None
    origin = (
        position if settings.restart_trajectories and settings.ends_trajectory(r) else state.origin
    )
    return State(position, r, momentum, origin), round_info(update, momentum)


def skip(state, settings) -> State:
    """A round in which no client's update arrived: θ̄ and what it carries stay, and the
    round counter moves on (any federated State with a ``round``: FA-HMC's, debiased's)."""
    return dataclasses.replace(state, round=state.round + 1)


def step(seed: int, state: State, target, settings: Settings) -> tuple[State, Info]:
    """One communication round of FA-HMC, every client and chain batched: ``broadcast``,
    ``client_update`` of the round's clients, ``server_update`` (``seed``: the run's)."""
    return federated.step(sys.modules[__name__], seed, state, target, settings)


__all__ = [
    "SYNC_UNITS",
    "Broadcast",
    "ClientUpdate",
    "Coefficients",
    "Info",
    "Layout",
    "MESSAGE",
    "REPLY",
    "RoundStart",
    "Segment",
    "Settings",
    "State",
    "Weights",
    "average",
    "broadcast",
    "client_seed",
    "client_seeds",
    "client_update",
    "combination",
    "data_keys",
    "energy_error_sign",
    "init",
    "layout",
    "local_iterations",
    "round_clients",
    "round_info",
    "round_keys",
    "round_seed",
    "server_update",
    "skip",
    "step",
]
