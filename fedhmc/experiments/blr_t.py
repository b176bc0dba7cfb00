"""``blr-T``: simulated BLR, K = 100, η = 0.01, rounds to reach a marginal error against T
(the paper's Figure 1c), under Algorithm 3.
"""

from __future__ import annotations

import math
import time
from pathlib import Path

import torch

from fedhmc.algorithms import fahmc
from fedhmc.errors import ConfigError
from fedhmc.experiments._common import ALGORITHM3, _write
from fedhmc.experiments.blr import blr_config, blr_reference
from fedhmc.viz.plots import new_figure


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


def blr_t(out_dir: Path, *, quick: bool = False, seed: int = 0, full: bool = False) -> dict:
    """Communication rounds to reach a target marginal error against T (the paper's
    Figure 1c): simulated BLR, 20 clients, K = 100, η = 0.01, gradients + N(0, 100) noise.

    For every T, S chains start at θ̄ = 0 and one global sample per chain is collected
    every round from round 1 on (no burn-in: reaching the posterior from the start is part
    of the communication cost). After each round (every round up to 100, then at rounds
    2 % apart: :func:`evaluation_rounds`) the ME of all samples collected so far
    (S · r of them, pooled over chains) against the MHMC reference is computed: the
    paper's "MEs in an online manner", with S chains in place of one so that a run needs S
    times fewer rounds. The rounds R_ε to reach ME ≤ ε are reported for ε a few percent
    above the lowest ME any T reached (the paper's ε = 0.1012, 0.105, 0.11 sit likewise
    just above its floor). Small T pays in rounds (little movement per round), large T in
    local-drift bias (its ME levels off above ε): the U-curve.

    Budgets (rounds per T: enough for a fixed number of local iterations, or a minimum
    number of rounds, whichever is more): quick d = 10, T ∈ {1, 10}, 4 chains, 20
    iterations; reduced (default) d = 10, T ∈ {1, 2, 5, 10, 20, 50, 100}, 16 chains, 200
    iterations or 5 rounds; full: the paper's d = 1000, T ∈ {1, 10, 20, …, 100}, 5,000
    iterations or 100 rounds (days on 2 cores).
    """
    from fedhmc.algorithms.fahmc import run_round
    from fedhmc.analysis.metrics import wasserstein1_marginals
    from fedhmc.runtime.problem import build_problem

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
    problem = build_problem(base)
    target = problem.target
    curves: dict[int, list[float]] = {}
    walls: dict[int, float] = {}
    from fedhmc.core.progress import bar_or_null

    bar = bar_or_null(len(Ts), "T values", "T")
    for T in Ts:
        rounds = max(min_rounds, math.ceil(iters / T))
        settings = fahmc.Settings(eta, K, T, rho=1.0, grad_noise=noise)
        theta = torch.zeros(chains, problem.dim, dtype=torch.float32)
        pooled = torch.empty(rounds * chains, problem.dim, dtype=torch.float32)
        at = set(evaluation_rounds(rounds))
        curve: list[tuple[int, float]] = []
        t0 = time.perf_counter()
        for r in range(1, rounds + 1):
            theta, _ = run_round(target, theta, seed, r, settings)
            if not torch.isfinite(theta).all():
                raise ConfigError(f"blr-T diverged at T = {T}, round {r}; lower the step size")
            pooled[(r - 1) * chains : r * chains] = theta
            if r in at:
                me = wasserstein1_marginals(pooled[: r * chains], reference).mean()
                curve.append((r, float(me)))
        walls[T] = time.perf_counter() - t0
        curves[T] = curve
        bar.update(1)
    bar.close()
    floor = min(v for c in curves.values() for _, v in c)
    epsilons = [round(floor * f, 4) for f in (1.02, 1.05, 1.1, 1.25)]
    rows = []
    for T in Ts:
        row = {"T": T, "rounds_run": curves[T][-1][0], "me_final": curves[T][-1][1]}
        row["me_min"] = min(v for _, v in curves[T])
        for i, eps in enumerate(epsilons):
            row[f"rounds_eps{i}"] = rounds_to_reach(curves[T], eps)
        row["wall_s"] = walls[T]
        rows.append(row)
    curve_rows = [{"T": T, "round": r, "me": v} for T in Ts for r, v in curves[T]]
    summary = {
        "experiment": "blr-T",
        "protocol": ALGORITHM3,
        "budget": budget,
        "dim": dim,
        "clients": 20,
        "K": K,
        "step_size": eta,
        "grad_noise": noise,
        "chains": chains,
        "epsilons": epsilons,
        "epsilon_rule": "1.02, 1.05, 1.1 and 1.25 × the lowest ME reached by any T",
        "reference": ref_info,
        "rows": rows,
    }
    _write(out_dir, "blr_T", rows, summary)
    _write(out_dir, "blr_T_curves", curve_rows, {"experiment": "blr-T", "curves": "me per round"})
    fig = new_figure(10.0, 3.8)
    ax1, ax2 = fig.subplots(1, 2)
    for T in Ts:
        ax1.plot(*zip(*curves[T], strict=True), label=f"T = {T}")
    for eps in epsilons:
        ax1.axhline(eps, color="k", lw=0.5, ls=":")
    ax1.set_xscale("log")
    ax1.set_xlabel("communication rounds")
    ax1.set_ylabel("ME of the samples so far")
    ax1.legend(fontsize=7, ncol=2)
    for i, eps in enumerate(epsilons):
        pts = [(r["T"], r[f"rounds_eps{i}"]) for r in rows if r[f"rounds_eps{i}"] is not None]
        if pts:
            ax2.plot(*zip(*pts, strict=True), "o-", label=f"ε = {eps:.4g}")
    ax2.set_yscale("log")
    ax2.set_xlabel("local steps T")
    ax2.set_ylabel("rounds to reach ME ≤ ε")
    ax2.set_title(f"d = {dim}, K = {K}, η = {eta:g}, {chains} chains (missing: not reached)")
    ax2.title.set_fontsize(8)
    ax2.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out_dir / "blr_T.png", dpi=120)
    return summary
