"""``blr-T`` and ``paper-blr-T``: simulated BLR, K = 100, η = 0.01, communication rounds to
reach a marginal error against T (the paper's Figure 1c).

``blr-T`` runs Algorithm 3 as printed; ``paper-blr-T`` runs the figure under both protocols
(the authors' and Algorithm 3) and asks whether Algorithm 3's odd/even-T bias at K·η = 1
appears under the authors' protocol. Both draw their samples, measure the online marginal
error and count rounds to a threshold with the same functions below.
"""

from __future__ import annotations

import dataclasses
import json
import math
import time
from pathlib import Path

import torch

from fedhmc.algorithms import fahmc
from fedhmc.errors import ConfigError
from fedhmc.experiments._common import ALGORITHM3_AS_PRINTED, PROTOCOL_ORDER, _write, write_csv
from fedhmc.experiments.blr import blr_config, blr_reference
from fedhmc.runtime.config import RunConfig
from fedhmc.runtime.output import write_text_atomic
from fedhmc.viz.plots import new_figure


def _settings_record(budget, dim: int, K: int, eta: float, noise: float, chains: int) -> dict:
    """The simulated-BLR settings both BLR-T summaries record (20 clients)."""
    return {"budget": budget, "dim": dim, "clients": 20, "K": K, "step_size": eta,
            "grad_noise": noise, "chains": chains}  # fmt: skip


def rounds_to_reach(curve: list[tuple[int, float]], eps: float) -> int | None:
    """The first round of ``curve`` ((round, value) pairs, rounds ascending) whose value
    is ≤ ``eps``; None if never."""
    for r, v in curve:
        if v <= eps:
            return r
    return None


def evaluation_rounds(rounds: int, every_until: int = 100, growth: float = 1.02) -> list[int]:
    """The rounds at which an online metric is computed: every round up to ``every_until``,
    then rounds growing by ``growth`` (so a long run costs O(log) evaluations, each within
    2 % of the round it stands for), and always the last."""
    out = list(range(1, min(rounds, every_until) + 1))
    r = float(every_until)
    while True:
        r *= growth
        nxt = max(out[-1] + 1, math.ceil(r))
        if nxt >= rounds:
            break
        out.append(nxt)
    if out[-1] != rounds:
        out.append(rounds)
    return out


def thresholds(curves: dict, factors) -> list[float]:
    """The thresholds ε: each of ``factors`` times the lowest ME any curve reached (curves:
    key → (round, ME) pairs), to 4 decimals."""
    floor = min(v for c in curves.values() for _, v in c)
    return [round(floor * f, 4) for f in factors]


def blr_protocol_settings(protocol: str, eta: float, K: int, T: int, noise: float = 0.0):
    """FA-HMC's settings of a protocol: ``authors`` (sync every T leapfrog steps, momenta
    averaged, fresh gradients, restarts from X₀) or ``algorithm3`` (T iterations of K steps)."""
    if protocol == "authors":
        return fahmc.Settings(
            eta,
            K,
            T,
            grad_noise=noise,
            sync_unit="leapfrog",
            fresh_gradients=True,
            restart_trajectories=True,
        )
    return fahmc.Settings(eta, K, T, grad_noise=noise)


def algorithm3_blr_samples(target, settings, theta0, seed: int, rounds: int):
    """θ̄ after each of ``rounds`` rounds of Algorithm 3 from θ̄ = ``theta0``, (rounds, S, D)."""
    state, out = fahmc.init(theta0, settings), []
    for _ in range(rounds):
        state, _ = fahmc.step(seed, state, target, settings)
        out.append(state.position)
    return torch.stack(out)


def first_nonfinite(samples) -> int | None:
    """The first round (1-based) of ``samples`` (rounds, S, D) holding a value that is not
    finite; None if every value is finite."""
    bad = ~torch.isfinite(samples).flatten(1).all(1)
    return int(bad.nonzero()[0, 0]) + 1 if bool(bad.any()) else None


def online_me(samples, reference) -> list[tuple[int, float]]:
    """The paper's "MEs in an online manner": after r rounds (at evaluation_rounds), the ME
    of all the samples so far (the first r rounds of ``samples`` (rounds, S, D), pooled over
    chains) against the ``reference`` draws; (r, ME) pairs."""
    from fedhmc.analysis.metrics import wasserstein1_marginals

    D = samples.shape[-1]
    return [
        (n, float(wasserstein1_marginals(samples[:n].reshape(-1, D), reference).mean()))
        for n in evaluation_rounds(samples.shape[0])
    ]


def blr_t(out_dir: Path, *, quick: bool = False, seed: int = 0, full: bool = False) -> dict:
    """Communication rounds to reach a target marginal error against T (the paper's
    Figure 1c): simulated BLR, 20 clients, K = 100, η = 0.01, gradients + N(0, 100) noise.

    For every T, S chains start at θ̄ = 0 and one global sample per chain is collected
    every round from round 1 on (no burn-in: reaching the posterior from the start is part
    of the communication cost). After each round (every round up to 100, then at rounds
    2 % apart: evaluation_rounds) the ME of all samples collected so far (S · r of them,
    pooled over chains) against the MHMC reference is computed: the paper's "MEs in an
    online manner", with S chains in place of one so that a run needs S times fewer
    rounds. The rounds R_ε to reach ME ≤ ε are reported for ε a few percent above the
    lowest ME any T reached (the paper's ε = 0.1012, 0.105, 0.11 sit likewise just above
    its floor). Small T pays in rounds (little movement per round), large T in local-drift
    bias (its ME levels off above ε): the U-curve.

    Budgets (rounds per T: enough for a fixed number of local iterations, or a minimum
    number of rounds, whichever is more): quick d = 10, T ∈ {1, 10}, 4 chains, 20
    iterations; reduced (default) d = 10, T ∈ {1, 2, 5, 10, 20, 50, 100}, 16 chains, 200
    iterations or 5 rounds; full: the paper's d = 1000, T ∈ {1, 10, 20, …, 100}, 5,000
    iterations or 100 rounds (days on 2 cores).
    """
    budget = "quick" if quick else "full" if full else "reduced"
    dim, Ts, chains, iters, min_rounds = {
        "quick": (10, (1, 10), 4, 20, 2),
        "reduced": (10, (1, 2, 5, 10, 20, 50, 100), 16, 200, 5),
        "full": (1000, (1, 10, 20, 30, 40, 50, 60, 70, 80, 90, 100), 16, 5000, 100),
    }[budget]
    K, eta, noise = 100, 0.01, 10.0
    base = blr_config(dim, chains, seed, K, eta, grad_noise=noise)
    ref_sizes = {"quick": (4, 100, 100), "reduced": (8, 300, 500), "full": (16, 1000, 1000)}
    rc, rw, rs = ref_sizes[budget]
    from fedhmc_datasets.locate import cache_dir

    reference, ref_info = blr_reference(
        base, chains=rc, warmup=rw, samples=rs, cache=cache_dir() / "reference"
    )
    curves, walls = _blr_t_curves(base, reference, Ts, (iters, min_rounds), (K, eta, noise))
    epsilons, rows = blr_t_table(curves, walls)
    curve_rows = [{"T": T, "round": r, "me": v} for T in Ts for r, v in curves[T]]
    summary = {
        "experiment": "blr-T",
        "protocol": ALGORITHM3_AS_PRINTED,
        **_settings_record(budget, dim, K, eta, noise, chains),
        "epsilons": epsilons,
        "epsilon_rule": "1.02, 1.05, 1.1 and 1.25 × the lowest ME reached by any T",
        "reference": ref_info,
        "rows": rows,
    }
    _write(out_dir, "blr_T", rows, summary)
    _write(out_dir, "blr_T_curves", curve_rows, {"experiment": "blr-T", "curves": "me per round"})
    _plot_blr_t(out_dir / "blr_T.png", summary, curves)
    return summary


def _blr_t_curves(base: RunConfig, reference, Ts, budget: tuple, kev: tuple):
    """``blr-T``'s online ME curves (T → (round, ME) pairs) and wall times (T → seconds):
    Algorithm 3 from θ̄ = 0 for each T, ``budget`` = (iterations, minimum rounds) and
    ``kev`` = (K, η, gradient noise)."""
    from fedhmc.core.progress import bar_or_null
    from fedhmc.runtime.problem import build_problem

    (iters, min_rounds), (K, eta, noise) = budget, kev
    problem = build_problem(base)
    target = problem.target
    curves: dict[int, list[tuple[int, float]]] = {}
    walls: dict[int, float] = {}
    bar = bar_or_null(len(Ts), "T values", "T")
    for T in Ts:
        rounds = max(min_rounds, math.ceil(iters / T))
        settings = blr_protocol_settings("algorithm3", eta, K, T, noise)
        theta0 = torch.zeros(base.chains, problem.dim, dtype=torch.float32)
        t0 = time.perf_counter()
        samples = algorithm3_blr_samples(target, settings, theta0, base.seed, rounds)
        r = first_nonfinite(samples)
        if r is not None:
            raise ConfigError(f"blr-T diverged at T = {T}, round {r}; lower the step size")
        curves[T] = online_me(samples, reference)
        walls[T] = time.perf_counter() - t0
        bar.update(1)
    bar.close()
    return curves, walls


def _plot_blr_t(path: Path, summary: dict, curves: dict) -> None:
    """``blr-T``'s figure from its summary (``blr_T.json``) and curves (T → (round, ME)
    pairs, from ``blr_T_curves.csv``): the online ME against rounds for each T, and the
    rounds to reach each ε against T (every T on the axis; a missing point: not reached)."""
    Ts = [r["T"] for r in summary["rows"]]
    epsilons = summary["epsilons"]
    fig = new_figure(8.0, 3.6)
    ax1, ax2 = fig.subplots(1, 2)
    for T in Ts:
        ax1.plot(*zip(*curves[T], strict=True), label=f"T = {T}")
    for eps in epsilons:
        ax1.axhline(eps, color="k", lw=0.5, ls=":")
    ax1.set_xscale("log")
    ax1.set_xlabel("communication rounds")
    ax1.set_ylabel("ME of the samples so far")
    ax1.set_title("dotted: the thresholds ε", fontsize=9)
    ax1.legend(fontsize=8, ncol=2)
    for i, eps in enumerate(epsilons):
        pts = [
            (r["T"], r[f"rounds_eps{i}"])
            for r in summary["rows"]
            if r[f"rounds_eps{i}"] is not None
        ]
        if pts:
            ax2.plot(*zip(*pts, strict=True), "o-", label=f"ε = {eps:.4g}")
    ax2.set_xscale("log")
    ax2.set_xlim(min(Ts) / 1.5, max(Ts) * 1.5)
    if all(b / a >= 1.5 for a, b in zip(Ts, Ts[1:], strict=False)):  # labels that fit
        ax2.set_xticks(Ts, [str(T) for T in Ts])
        ax2.minorticks_off()
    ax2.set_yscale("log")
    ax2.set_xlabel("local steps T")
    ax2.set_ylabel("rounds to reach ME ≤ ε")
    ax2.set_title(
        f"d = {summary['dim']}, K = {summary['K']}, η = {summary['step_size']:g}, "
        f"{summary['chains']} chains\n(no point: ε not reached)",
        fontsize=9,
    )
    ax2.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def blr_t_table(curves: dict, walls: dict) -> tuple[list[float], list[dict]]:
    """``blr-T``'s thresholds and table from its curves (T → (round, ME) pairs, in T's
    order) and wall times (T → seconds): one row per T."""
    epsilons = thresholds(curves, (1.02, 1.05, 1.1, 1.25))
    rows = []
    for T, c in curves.items():
        row = {"T": T, "rounds_run": c[-1][0], "me_final": c[-1][1]}
        row["me_min"] = min(v for _, v in c)
        for i, eps in enumerate(epsilons):
            row[f"rounds_eps{i}"] = rounds_to_reach(c, eps)
        row["wall_s"] = walls[T]
        rows.append(row)
    return epsilons, rows


# ---------------------------------------------------- paper-blr-T: both protocols
BLR_BUDGETS = {
    # d, T values, chains, outer iterations (authors) / iterations (Algorithm 3), reference
    "quick": (5, (1, 4), 4, 6, (4, 100, 100)),
    "reduced": (10, (1, 2, 3, 4, 5, 6, 7, 10, 20, 50, 100), 16, 200, (8, 300, 500)),
    "full": (100, (1, 10, 20, 30, 40, 50, 60, 70, 80, 90, 100), 16, 1000, (16, 1000, 1000)),
}


def authors_blr_samples(target, settings, theta0, seed: int, outer: int, skip=True):
    """X₀ after each of ``outer`` outer iterations of the restart protocol, (outer, S, D).

    With ``skip``, rounds that hold no step of an outer iteration's last trajectory are not
    computed: the next trajectory restarts from X₀ with a fresh momentum, and every random
    number is keyed by its position, so the samples are bit for bit those of running every
    round (tested). The momentum that such a round would have passed on feeds only the
    discarded part of the next round.
    """
    K, T = settings.leapfrog_steps, settings.local_steps
    state = fahmc.init(theta0, settings)
    out = []
    # Rounds (1-based, within an outer iteration) that hold a step of the last trajectory.
    first_needed = ((T - 1) * K) // T + 1
    for o in range(outer):
        for j in range(1, K + 1):
            r = o * K + j
            if skip and j < first_needed:
                continue
            state = dataclasses.replace(state, round=r - 1)
            if state.momentum is None and settings.starts_mid_trajectory(r):
                # (after skipped rounds) it feeds a discarded trajectory only
                state = dataclasses.replace(state, momentum=torch.zeros_like(theta0))
            state, _ = fahmc.step(seed, state, target, settings)
        out.append(state.position)
    return torch.stack(out)


def paper_blr_t(out_dir: Path, *, quick: bool = False, full: bool = False, seed: int = 0):
    """Figure 1(c) under both protocols: rounds to reach a marginal error ε against T.

    Simulated BLR, 20 clients, K = 100, η = 0.01, gradients + N(0, 100) noise, ρ = 1. For
    each T, S chains start at 0 and one global sample per chain is taken per outer iteration
    (authors' protocol: X₀) or per round (Algorithm 3: θ̄); after each, the ME of all
    samples so far against the MHMC reference. Rounds to reach ε are counted three ways:
    the authors' outer iterations, their all-reduces (K per outer iteration: fedhmc's
    rounds), and Algorithm 3's rounds. Algorithm 3 runs ``iters / T`` rounds (at least 5);
    the authors' protocol ``iters`` outer iterations whatever T (each is one trajectory of
    K steps that counts, whatever T).

    It also answers whether the odd/even-T bias of Algorithm 3 at K·η = 1 appears under the
    authors' protocol: with exact gradients at d = 10, the stationary mean of the samples
    for each T against the posterior mean (``paper_blr_T_parity.csv``).
    """
    from fedhmc_datasets.locate import cache_dir

    from fedhmc.runtime.problem import build_problem

    budget = "quick" if quick else "full" if full else "reduced"
    dim, Ts, chains, iters, (rc, rw, rs) = BLR_BUDGETS[budget]
    # The paper's K = 100, η = 0.01 (Kη = 1); the quick check keeps Kη = 1 with K = 10.
    K, eta, noise = (10, 0.1, 10.0) if quick else (100, 0.01, 10.0)
    base = blr_config(dim, chains, seed, K, eta)
    reference, ref_info = blr_reference(
        base, chains=rc, warmup=rw, samples=rs, cache=cache_dir() / "reference"
    )
    target = build_problem(base).target
    out_dir = Path(out_dir)
    (out_dir / "cells").mkdir(parents=True, exist_ok=True)
    key = {"dim": dim, "K": K, "eta": eta, "noise": noise, "chains": chains, "iters": iters,
           "seed": seed, "reference": [rc, rw, rs], "version": 1}  # fmt: skip
    theta0 = torch.zeros(chains, target.dim)
    run = _BlrRun(target, theta0, reference, seed, K, eta, noise, iters, out_dir / "cells", key)
    curves, walls = _paper_blr_curves(run, Ts)
    # Thresholds shared by both protocols: multiples of the lowest ME any run reached.
    factors = (1.25, 1.5, 2.0, 3.0)
    shared = thresholds(curves, factors)
    eps_by = {protocol: shared for protocol in PROTOCOL_ORDER}
    rows = _paper_blr_rows(curves, walls, Ts, K, shared)
    parity = _paper_blr_parity(out_dir, base, quick, seed)
    summary = {
        "experiment": "paper-blr-T",
        **_settings_record(budget, dim, K, eta, noise, chains),
        "epsilons": eps_by,
        "epsilon_rule": "1.25, 1.5, 2 and 3 × the lowest ME any run reached (either protocol)",
        "rounds": "authors: outer iterations (one sample each) and all-reduces = K × outer "
        "iterations; algorithm3: rounds of T iterations (one sample each)",
        "reference": ref_info,
        "rows": rows,
        "parity": parity,
    }
    _write_paper_blr(out_dir, summary, curves, Ts)
    return summary


@dataclasses.dataclass(frozen=True)
class _BlrRun:
    """What every (protocol, T) cell of ``paper-blr-T`` shares: the target, the chains'
    start, the reference draws, the seed, K, η, the gradient noise, the budget in
    iterations, the folder of finished cells and the key a finished cell must match."""

    target: object
    theta0: torch.Tensor
    reference: torch.Tensor
    seed: int
    K: int
    eta: float
    noise: float
    iters: int
    cells: Path
    key: dict


def _paper_blr_curves(run: _BlrRun, Ts) -> tuple[dict, dict]:
    """The online ME curves ((protocol, T) → (round, ME) pairs) and wall times ((protocol,
    T) → seconds) of every cell, in PROTOCOL_ORDER then T's order."""
    from fedhmc.core.progress import bar_or_null

    curves: dict[tuple[str, int], list[tuple[int, float]]] = {}
    walls: dict[tuple[str, int], float] = {}
    bar = bar_or_null(2 * len(Ts), "T values", "T")
    for protocol in PROTOCOL_ORDER:
        for T in Ts:
            curves[(protocol, T)], walls[(protocol, T)] = _paper_blr_cell(run, protocol, T)
            bar.update(1)
    bar.close()
    return curves, walls


def _paper_blr_cell(run: _BlrRun, protocol: str, T: int) -> tuple[list, float]:
    """One (protocol, T) cell's online ME curve and wall time. A finished cell is kept in
    cells/, so a stopped run resumes there."""
    cell = run.cells / f"{protocol}_T={T}.json"
    try:
        done = json.loads(cell.read_text())
    except (OSError, ValueError):
        done = None
    if done is not None and done.get("key") == run.key:
        return [tuple(x) for x in done["curve"]], done["wall_s"]
    t0 = time.perf_counter()
    s = blr_protocol_settings(protocol, run.eta, run.K, T, run.noise)
    if protocol == "authors":
        samples = authors_blr_samples(run.target, s, run.theta0, run.seed, run.iters)
    else:
        rounds = max(5, math.ceil(run.iters / T))
        samples = algorithm3_blr_samples(run.target, s, run.theta0, run.seed, rounds)
    if first_nonfinite(samples) is not None:
        raise ConfigError(f"paper-blr-T diverged ({protocol}, T = {T})")
    curve = online_me(samples, run.reference)
    wall = time.perf_counter() - t0
    record = {"key": run.key, "curve": curve, "wall_s": wall}
    write_text_atomic(cell, json.dumps(record))
    return curve, wall


def _paper_blr_rows(curves: dict, walls: dict, Ts, K: int, epsilons: list) -> list[dict]:
    """``paper-blr-T``'s table: one row per (protocol, T), with the rounds to reach each of
    ``epsilons`` counted as the protocol counts them."""
    rows = []
    for protocol in PROTOCOL_ORDER:
        for T in Ts:
            c = curves[(protocol, T)]
            row = {
                "protocol": protocol,
                "T": T,
                "T_unit": "leapfrog steps" if protocol == "authors" else "iterations",
                "samples_per_chain": c[-1][0],
                "me_final": c[-1][1],
                "me_min": min(v for _, v in c),
            }
            for i, eps in enumerate(epsilons):
                r = rounds_to_reach(c, eps)
                if protocol == "authors":
                    row[f"outer_eps{i}"] = r
                    row[f"allreduce_eps{i}"] = None if r is None else r * K
                    row[f"rounds_eps{i}"] = None
                else:
                    row[f"outer_eps{i}"] = row[f"allreduce_eps{i}"] = None
                    row[f"rounds_eps{i}"] = r
            row["wall_s"] = walls[(protocol, T)]
            rows.append(row)
    return rows


def _paper_blr_parity(out_dir: Path, base: RunConfig, quick: bool, seed: int) -> dict:
    """The odd/even-T bias check (blr_parity at d = 10), kept in cells/parity.json."""
    parity_Ts = (1, 2) if quick else (1, 2, 3, 4, 5, 6, 7, 10)
    parity_file = out_dir / "cells" / "parity.json"
    parity_key = {"Ts": list(parity_Ts), "quick": quick, "seed": seed, "version": 1}
    try:
        parity = json.loads(parity_file.read_text())
    except (OSError, ValueError):
        parity = None
    if parity is None or parity.get("key") != parity_key:
        parity = blr_parity(base.replace(dim=10), Ts=parity_Ts, quick=quick)
        parity["key"] = parity_key
        write_text_atomic(parity_file, json.dumps(parity, indent=1))
    return parity


def _write_paper_blr(out_dir: Path, summary: dict, curves: dict, Ts) -> None:
    """``paper-blr-T``'s files: the table, the curves, the parity table, the summary and
    the figure."""
    write_csv(out_dir / "paper_blr_T.csv", summary["rows"])
    write_csv(
        out_dir / "paper_blr_T_curves.csv",
        [
            {"protocol": p, "T": T, "samples": n, "me": v}
            for (p, T), c in curves.items()
            for n, v in c
        ],
    )
    write_csv(out_dir / "paper_blr_T_parity.csv", summary["parity"]["rows"])
    write_text_atomic(out_dir / "paper_blr_T.json", json.dumps(summary, indent=2) + "\n")
    _plot_blr(out_dir / "paper_blr_T.png", summary, curves, Ts)


def blr_parity(cfg: RunConfig, Ts, quick: bool = False) -> dict:
    """Exact gradients, d = 10: the stationary mean of the samples under each protocol,
    against the posterior mean (the MHMC reference's). Chains start at the reference mean;
    the first half of the rounds is discarded."""
    from fedhmc_datasets.locate import cache_dir

    from fedhmc.runtime.problem import build_problem

    chains, outer = (4, 6) if quick else (64, 200)
    ref, _ = blr_reference(cfg, chains=8, warmup=300, samples=500, cache=cache_dir() / "reference")
    post = ref.to(torch.float64).mean(0)
    target = build_problem(cfg.replace(dtype="float64")).target
    theta0 = post.expand(chains, -1).clone()
    K, eta = cfg.leapfrog_steps, cfg.step_size
    rows = []
    for protocol in PROTOCOL_ORDER:
        for T in Ts:
            s = blr_protocol_settings(protocol, eta, K, T)
            if protocol == "authors":
                x = authors_blr_samples(target, s, theta0, cfg.seed, outer)
            else:
                x = algorithm3_blr_samples(target, s, theta0, cfg.seed, outer)
            x = x[outer // 2 :]  # (rounds, S, D)
            per_chain = x.mean(0)  # (S, D)
            mean = per_chain.mean(0)
            se = per_chain.std(0) / math.sqrt(chains)
            ratio = float(mean.norm() / post.norm())
            slope = float((mean @ post) / (post @ post))
            # The ratio's standard error, to first order: se of the projection on post.
            slope_se = float((se.square() @ post.square()).sqrt() / (post @ post))
            rows.append(
                {
                    "protocol": protocol,
                    "T": T,
                    "norm_ratio": ratio,
                    "slope": slope,
                    "slope_se": slope_se,
                    "chains": chains,
                    "samples_used": x.shape[0],
                }
            )
    return {
        "what": "stationary mean of the samples / posterior mean, exact gradients, d = "
        f"{cfg.dim}, K = {K}, η = {eta}: norm ratio ‖m‖/‖m_post‖ and the slope of m on "
        "m_post (1 = unbiased)",
        "rows": rows,
    }


def _plot_blr(path: Path, summary: dict, curves: dict, Ts) -> None:
    import matplotlib

    f = new_figure(15, 3.8)
    ax1, ax2, ax3, ax4 = f.subplots(1, 4)
    # One colour scale over T (the default cycle has 10 colours and repeats them).
    cmap = matplotlib.colormaps["viridis"]
    colors = [cmap(i / max(1, len(Ts) - 1)) for i in range(len(Ts))]
    for ax, protocol in ((ax1, "authors"), (ax2, "algorithm3")):
        for i, T in enumerate(Ts):
            c = curves[(protocol, T)]
            ax.plot(*zip(*c, strict=True), color=colors[i], label=f"T = {T}")
        for eps in summary["epsilons"][protocol]:
            ax.axhline(eps, color="k", lw=0.5, ls=":")
        ax.set_xscale("log")
        ax.set_xlabel("outer iterations" if protocol == "authors" else "rounds")
        ax.set_ylabel("ME of the samples so far")
        ax.set_title(f"{protocol}, d = {summary['dim']}", fontsize=9)
    ax1.legend(fontsize=6, ncol=2)
    # The loosest threshold (3 × the floor): the one the most settings reach.
    for row_key, ls, lab in (
        ("allreduce_eps3", "-", "authors: all-reduces"),
        ("outer_eps3", "--", "authors: outer iterations"),
        ("rounds_eps3", ":", "Algorithm 3: rounds"),
    ):
        pts = [(r["T"], r[row_key]) for r in summary["rows"] if r.get(row_key) is not None]
        if pts:
            ax3.plot(*zip(*pts, strict=True), "o" + ls, label=lab, ms=3)
    ax3.set_yscale("log")
    ax3.set_xlabel("T")
    ax3.set_ylabel(f"rounds to ME ≤ {summary['epsilons']['authors'][3]:.3g} (3 × floor)")
    ax3.set_title("missing: never reached", fontsize=8)
    ax3.legend(fontsize=7)
    for protocol, m in (("authors", "o-"), ("algorithm3", "s:")):
        pts = [(r["T"], r["slope"]) for r in summary["parity"]["rows"] if r["protocol"] == protocol]
        ax4.plot(*zip(*pts, strict=True), m, label=protocol, ms=4)
    ax4.axhline(1.0, color="k", lw=0.6)
    ax4.set_xlabel("T")
    ax4.set_ylabel("stationary mean / posterior mean")
    ax4.set_title("exact gradients, d = 10", fontsize=9)
    ax4.legend(fontsize=7)
    f.tight_layout()
    f.savefig(path, dpi=110)
