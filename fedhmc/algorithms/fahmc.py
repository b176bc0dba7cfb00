"""FA-HMC: federated averaging of stochastic-gradient HMC (Liang et al. 2024, Algorithm 3).

One communication round, on every client c in parallel, starting from the broadcast θ̄:

    for t = 0 … T−1:
        p  = √ρ ξ_t + √(1−ρ) ξ_t^(c) / √w_c             (fedhmc.core.momentum)
        θ^(c) ← leapfrog(∇f̃^(c), θ^(c), p, η, K)        (fedhmc.core.integrators)
    θ̄ = Σ_c w_c θ^(c)                                   (fedhmc.core.aggregate)

K = 1 is FA-LD (federated averaging Langevin dynamics with learning rate η²/2).

The gradient oracle adds the injected noise N(0, σ_g² I) when σ_g > 0 and divides by the
posterior temperature τ (the target is exp(−f/τ)).

Randomness is counter-based and keyed (:mod:`fedhmc.core.rng`):

- the round seed, ``round_seed(seed, r)``, is what the server broadcasts; the shared
  momentum key of chain s is ``derive(round_seed, s)``;
- client c's own seed is ``client_seed(seed, c)``; its private key in round r for chain s is
  ``derive(client_seed, r, s)``, from which the momentum, minibatch and gradient-noise
  streams are folded out.

So :func:`client_update`, which runs one client alone (what the Flower ClientApp calls),
draws exactly the numbers :func:`run_round` draws for that client in the batched engine.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from fedhmc.core import gradients, rng
from fedhmc.core.aggregate import weighted_average
from fedhmc.core.integrators import leapfrog
from fedhmc.core.momentum import draw_momentum

SYNC_UNITS = ("iteration", "leapfrog")


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
class SamplerSettings:
    """The tunable values of one FA-HMC round.

    Attributes
    ----------
    step_size
        Leapfrog step size η.
    leapfrog_steps
        K, leapfrog steps per trajectory (K = 1: FA-LD).
    local_steps
        T: local iterations per communication round (``sync_unit="iteration"``,
        Algorithm 3), or leapfrog steps per round (``sync_unit="leapfrog"``).
    rho
        Momentum correlation ρ ∈ [0, 1] across clients.
    grad_noise
        σ_g of the Gaussian noise added to every gradient (0: none).
    temperature
        Posterior temperature τ > 0: the chain targets exp(−f/τ).
    sync_unit
        ``"iteration"``: a round is T whole trajectories, then the positions are averaged
        (the paper's Algorithm 3). ``"leapfrog"``: a round is T leapfrog steps counted on a
        global counter, after which positions *and momenta* are averaged, even in the
        middle of a trajectory (the authors' experiment code); a trajectory of K steps
        starts at every global step that is a multiple of K.
    fresh_gradients
        Evaluate two fresh minibatch gradients per leapfrog step (2K per trajectory)
        instead of reusing the gradient at the end of a step for the next (K + 1).
    restart
        With ``sync_unit="leapfrog"``: an outer iteration is T trajectories (T·K leapfrog
        steps, K rounds), each restarting from the origin X₀ broadcast at its start; X₀
        becomes the average at the end of the outer iteration (the authors' simulated-BLR
        code).
    """

    step_size: float
    leapfrog_steps: int
    local_steps: int
    rho: float = 1.0
    grad_noise: float = 0.0
    temperature: float = 1.0
    sync_unit: str = "iteration"
    fresh_gradients: bool = False
    restart: bool = False

    def __post_init__(self):
        if self.sync_unit not in SYNC_UNITS:
            raise ValueError(f"sync_unit must be one of {SYNC_UNITS}, got {self.sync_unit!r}")
        if self.restart and self.sync_unit != "leapfrog":
            raise ValueError("restart needs sync_unit='leapfrog'")

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
        period = T * K if self.restart else K
        return (round_ * T) % period == 0


@dataclass
class RoundInfo:
    """Diagnostics of one round of local iterations."""

    grad_evals: int
    """Client-gradient evaluations, summed over clients and chains."""
    energy: torch.Tensor
    """(S, N): the minibatch energy estimate of each chain and client at its last position."""
    momentum: torch.Tensor | None = None
    """The momenta at the end of the round: (S, N, D) from :func:`local_iterations`, the
    w-weighted average (S, D) from :func:`run_round`; None unless ``sync_unit="leapfrog"``."""
    energy_error: torch.Tensor | None = None
    """(S, N): the leapfrog's mean absolute energy error |ΔH| per trajectory this round,
    estimated from the gradients the integrator evaluated anyway (:func:`energy_error_terms`);
    a health check, exact for a Gaussian energy."""


def energy_error_sign(k: int, steps: int, fresh: bool) -> int:
    """The sign of |g_k|² in the leapfrog's energy error over one trajectory piece.

    One velocity-Verlet step changes H = U + |p|²/2 by (η²/8)(|g_{k+1}|² − |g_k|²) plus the
    error of the trapezoid rule ½(g_k + g_{k+1})·(θ_{k+1} − θ_k) for U(θ_{k+1}) − U(θ_k),
    which vanishes for a quadratic U. Over K steps the sum telescopes to
    (η²/8)(|g_K|² − |g_0|²): the first evaluation counts −1 and the last +1. With fresh
    gradients (evaluations 2k at θ_k and 2k + 1 at θ_{k+1}, on different minibatches) the
    same two ends are used: the per-step terms would add the minibatch noise of |g|² 2K
    times over, which measures the noise, not the integrator. Costs one reduction for each
    end and no extra gradient.
    """
    last = 2 * steps - 1 if fresh else steps
    return -1 if k == 0 else (1 if k == last else 0)


def round_seed(seed: int, round_: int) -> int:
    """The seed the server broadcasts in round ``round_`` (shared momentum)."""
    return rng.derive_int(seed, rng.STREAM_ROUND, round_)


def client_seed(seed: int, client: int) -> int:
    """Client ``client``'s private seed (never sent over the network)."""
    return rng.derive_int(seed, rng.STREAM_CLIENT, client)


def chains_and_seeds(
    seed: int,
    S: int,
    N: int,
    device,
    chains: torch.Tensor | None = None,
    client_ids: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The chain indices (S,) and the private client seeds (N,) of a batched round.

    ``chains`` and ``client_ids`` default to 0 … S−1 and 0 … N−1; client ``c``'s seed is
    :func:`client_seed` of its id, so a subset of clients draws what they draw in the full
    batch.
    """
    chains = torch.arange(S, device=device) if chains is None else chains
    ids = torch.arange(N) if client_ids is None else client_ids
    seeds = torch.tensor([client_seed(seed, int(c)) for c in ids], device=device)
    return chains, seeds


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
    return rng.derive(client_seeds.view(1, -1), rng.STREAM_RESHUFFLE, chains.view(-1, 1))


def local_iterations(
    target,
    theta: torch.Tensor,
    shared_keys: torch.Tensor,
    private_keys: torch.Tensor,
    settings: SamplerSettings,
    correction: torch.Tensor | None = None,
    *,
    round_: int = 1,
    momentum: torch.Tensor | None = None,
    origin: torch.Tensor | None = None,
    reshuffle_keys: torch.Tensor | None = None,
) -> tuple[torch.Tensor, RoundInfo]:
    """Run one round of local FA-HMC on every (chain, client) at once.

    Parameters
    ----------
    target
        A target from :mod:`fedhmc.models.targets` with N clients.
    theta
        Start positions, (S, N, D). Not modified.
    shared_keys, private_keys
        From :func:`round_keys`: (S,) and (S, N).
    settings
        η, K, T, ρ, σ_g, τ and the protocol (sync unit, fresh gradients, restart).
    correction
        Debiased FA-HMC's control variate ∇f(θ_a) − ∇f^(c)(θ_a), (S, N, D), added to every
        gradient; None for plain FA-HMC.
    round_
        The round number (1-based): with ``sync_unit="leapfrog"`` it places the round on
        the global leapfrog counter; with random-reshuffling minibatches, on the run's
        minibatch counter.
    momentum
        The averaged momentum to continue from, (S, N, D) or (S, 1, D), when the round
        starts in the middle of a trajectory (:meth:`SamplerSettings.starts_mid_trajectory`).
    origin
        Under ``restart``: the outer iteration's origin X₀, (S, N, D) or (S, 1, D).
    reshuffle_keys
        :func:`data_keys` of the clients, when the target draws random-reshuffling
        minibatches.

    Returns
    -------
    (theta, info)
        End positions (S, N, D) and :class:`RoundInfo` (with the end momenta).
    """
    S, N, D = theta.shape
    eta = settings.step_size
    keys_mom = rng.derive(private_keys, rng.STREAM_MOMENTUM)
    keys_noise = gradients.noise_keys(private_keys)
    if getattr(target, "minibatch", "uniform") == "reshuffle":
        if reshuffle_keys is None:
            raise ValueError("a random-reshuffling target needs reshuffle_keys (data_keys)")
        keys_batch, offset, plan = reshuffle_keys, settings.evals_before(round_), False
    else:
        keys_batch, offset, plan = rng.derive(private_keys, rng.STREAM_MINIBATCH), 0, True
    sigma, inv_temp = settings.grad_noise, 1.0 / settings.temperature
    last_energy = torch.zeros(S, N, dtype=theta.dtype, device=theta.device)
    abs_dh = torch.zeros(S, N, dtype=torch.float64, device=theta.device)
    trajectories = 0.0
    fresh = settings.fresh_gradients
    total = settings.evals_in_round(round_)
    p = None if momentum is None else momentum.expand(S, N, D)
    for seg in settings.segments(round_):
        if seg.new_trajectory:
            if settings.restart:
                if origin is None:
                    raise ValueError("restart needs the outer iteration's origin")
                theta = origin.expand(S, N, D)
            p = draw_momentum(
                shared_keys,
                keys_mom,
                target.weights,
                settings.rho,
                seg.momentum_counter,
                D,
                theta.dtype,
            )
        elif p is None:
            raise ValueError(
                f"round {round_} starts in the middle of a trajectory: pass the momentum"
            )
        base = seg.first_eval
        if plan:
            seg_evals = 2 * seg.steps if fresh else seg.steps + 1
            target.prefetch(keys_batch, base, seg_evals, horizon=total - base)
        dh = torch.zeros(S, N, dtype=torch.float64, device=theta.device)

        def grad_fn(th: torch.Tensor, k: int, base=base, steps=seg.steps, dh=dh) -> torch.Tensor:
            # The energy is only needed once a round, to stop a diverging chain.
            need_energy = base + k == total - 1
            g, energy = target.grad(th, keys_batch, offset + base + k, need_energy)
            g = gradients.corrected(g, correction, inplace=True)
            g = gradients.add_noise(g, keys_noise, base + k, sigma, inplace=True)
            g = gradients.tempered(g, settings.temperature, inplace=True)
            if need_energy:
                last_energy.copy_(energy * inv_temp)
            sign = energy_error_sign(k, steps, fresh)
            if sign:
                dh.add_(g.square().sum(-1, dtype=torch.float64), alpha=sign)
            return g

        theta, p, _ = leapfrog(grad_fn, theta, p, eta, seg.steps, fresh=fresh)
        abs_dh.add_(dh.abs_(), alpha=eta * eta / 8.0)
        trajectories += seg.steps / settings.leapfrog_steps
    info = RoundInfo(
        total * S * N,
        last_energy,
        p if settings.leapfrog_sync else None,
        abs_dh / max(trajectories, 1e-300),
    )
    return theta, info


def _clients_round(
    target, theta_bar, seed_of_round, seeds, chains, round_, settings, correction, momentum, origin
):
    """Every client's round from the broadcast (S, D) values: the one path of
    :func:`run_round` (all clients) and :func:`client_update` (one client)."""
    S, D = theta_bar.shape
    shared, private = round_keys(seed_of_round, seeds, round_, chains)
    return local_iterations(
        target,
        theta_bar.unsqueeze(1).expand(S, seeds.shape[0], D),
        shared,
        private,
        settings,
        correction,
        round_=round_,
        momentum=None if momentum is None else momentum.unsqueeze(1),
        origin=None if origin is None else origin.unsqueeze(1),
        reshuffle_keys=(
            data_keys(seeds, chains)
            if getattr(target, "minibatch", "uniform") == "reshuffle"
            else None
        ),
    )


def run_clients(
    target,
    theta_bar: torch.Tensor,
    seed: int,
    round_: int,
    settings: SamplerSettings,
    chains: torch.Tensor | None = None,
    client_ids: torch.Tensor | None = None,
    correction: torch.Tensor | None = None,
    momentum: torch.Tensor | None = None,
    origin: torch.Tensor | None = None,
) -> tuple[torch.Tensor, RoundInfo]:
    """Every client's own round from the broadcast θ̄, batched, before averaging.

    The arguments are :func:`run_round`'s. Returns the clients' positions (S, N, D) and the
    round's :class:`RoundInfo` with each client's end momentum (S, N, D) under
    ``sync_unit="leapfrog"``: client c's slice is what :func:`client_update` gives it.
    """
    chains, seeds = chains_and_seeds(
        seed, theta_bar.shape[0], target.num_clients, theta_bar.device, chains, client_ids
    )
    return _clients_round(
        target,
        theta_bar,
        round_seed(seed, round_),
        seeds,
        chains,
        round_,
        settings,
        correction,
        momentum,
        origin,
    )


def run_round(
    target,
    theta_bar: torch.Tensor,
    seed: int,
    round_: int,
    settings: SamplerSettings,
    chains: torch.Tensor | None = None,
    client_ids: torch.Tensor | None = None,
    correction: torch.Tensor | None = None,
    momentum: torch.Tensor | None = None,
    origin: torch.Tensor | None = None,
) -> tuple[torch.Tensor, RoundInfo]:
    """One communication round of the batched engine: local iterations, then θ̄.

    Parameters
    ----------
    theta_bar
        Broadcast positions, (S, D).
    seed, round_
        Run seed and round number (1-based).
    chains, client_ids
        Chain and client indices used for key derivation (default 0 … S−1, 0 … N−1).
    correction
        Debiased FA-HMC's control variate, (S, N, D) (see :func:`local_iterations`).
    momentum
        ``sync_unit="leapfrog"``: the averaged momentum (S, D) of the previous round, when
        this round continues a trajectory.
    origin
        Under ``restart``: the outer iteration's origin X₀, (S, D).

    Returns
    -------
    (theta_bar, info)
        The new average (S, D) and the round's :class:`RoundInfo`, whose ``momentum`` is
        the averaged momentum (S, D) under ``sync_unit="leapfrog"``.
    """
    theta, info = run_clients(
        target, theta_bar, seed, round_, settings, chains, client_ids, correction, momentum, origin
    )
    if info.momentum is not None:
        info.momentum = weighted_average(info.momentum, target.weights)
    return weighted_average(theta, target.weights), info


def client_update(
    target,
    theta_bar: torch.Tensor,
    seed_of_round: int,
    seed_of_client: int,
    round_: int,
    settings: SamplerSettings,
    chains: torch.Tensor | None = None,
    correction: torch.Tensor | None = None,
    momentum: torch.Tensor | None = None,
    origin: torch.Tensor | None = None,
) -> tuple[torch.Tensor, RoundInfo]:
    """One round of one client alone: what a Flower client runs each round.

    Parameters
    ----------
    target
        The client's own target (one client; its weight w_c = n_c / n uses the global n).
    theta_bar
        The broadcast positions, (S, D).
    seed_of_round
        The round seed the server sent (:func:`round_seed`).
    seed_of_client
        The client's private seed (:func:`client_seed`).
    round_
        The round number.
    correction
        Debiased FA-HMC's control variate ∇f(θ_a) − ∇f^(c)(θ_a) of this client, (S, D).
    momentum, origin
        As in :func:`run_round`, (S, D) each.

    Returns
    -------
    (theta, info)
        The client's new positions (S, D), equal to the batched engine's to float tolerance;
        ``info.momentum`` is the client's end momentum (S, D) under ``sync_unit="leapfrog"``.
    """
    if target.num_clients != 1:
        raise ValueError("client_update takes a single client's target (target.client(c))")
    S, D = theta_bar.shape
    chains = torch.arange(S, device=theta_bar.device) if chains is None else chains
    seeds = torch.tensor([seed_of_client], device=theta_bar.device)
    corr = None if correction is None else correction.unsqueeze(1)
    theta, info = _clients_round(
        target, theta_bar, seed_of_round, seeds, chains, round_, settings, corr, momentum, origin
    )
    if info.momentum is not None:
        info.momentum = info.momentum[:, 0]
    return theta[:, 0], info


# ------------------------------------------------------------------ the algorithm API
Settings = SamplerSettings
Info = RoundInfo


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

    def inputs(self, settings: SamplerSettings) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """(momentum or None, origin or None) that the next round needs."""
        r = self.round + 1
        momentum = self.momentum if settings.starts_mid_trajectory(r) else None
        return momentum, (self.origin if settings.restart else None)

    def advanced(
        self, settings: SamplerSettings, position: torch.Tensor, momentum: torch.Tensor | None
    ) -> State:
        """The state after the next round, given its new θ̄ and averaged momentum: under
        restarts θ̄ becomes the origin when the round ends an outer iteration."""
        r = self.round + 1
        origin = position if settings.restart and settings.ends_trajectory(r) else self.origin
        return State(position, r, momentum, origin)

    def carry_dict(self) -> dict:
        """The state a checkpoint keeps besides θ̄ (CPU tensors or None)."""
        return {
            k: None if v is None else v.detach().cpu()
            for k, v in (("momentum", self.momentum), ("origin", self.origin))
        }

    def with_carry(self, carry: dict, device="cpu") -> State:
        """This state with the momentum and origin of a checkpoint's :meth:`carry_dict`."""
        m, o = carry.get("momentum"), carry.get("origin")
        return State(
            self.position,
            self.round,
            None if m is None else m.to(device),
            None if o is None else o.to(device),
        )


def init(position: torch.Tensor, settings: SamplerSettings) -> State:
    """The state before round 1: θ̄ = ``position`` (S, D)."""
    return State(position, 0, None, position if settings.restart else None)


def step(
    state: State,
    target,
    settings: SamplerSettings,
    *,
    seed: int,
    chains: torch.Tensor | None = None,
    client_ids: torch.Tensor | None = None,
) -> tuple[State, RoundInfo]:
    """One communication round of FA-HMC (all clients and chains batched).

    The same numbers as :func:`run_round` for round ``state.round + 1`` of run ``seed``,
    and as every client's :func:`client_update` averaged: this is what the engine and the
    Flower ServerApp run.
    """
    momentum, origin = state.inputs(settings)
    position, info = run_round(
        target,
        state.position,
        seed,
        state.round + 1,
        settings,
        chains,
        client_ids,
        momentum=momentum,
        origin=origin,
    )
    return state.advanced(settings, position, info.momentum), info
