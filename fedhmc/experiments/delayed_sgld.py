"""``delayed-sgld``: W₂ of shared-memory delayed SGLD to the exact posterior against
iterations and wall time, in the three modes (Kungurtsev et al. §3.2).
"""

from __future__ import annotations

import dataclasses
import multiprocessing as mp
import multiprocessing.connection
from pathlib import Path

import torch

from fedhmc.algorithms import delayed
from fedhmc.algorithms.delayed.driver import run_delayed
from fedhmc.algorithms.delayed.problem import hessian_eigs, make_regression, posterior
from fedhmc.algorithms.delayed.sgld import MODES
from fedhmc.analysis.metrics import gaussian_w2_sq


def w2_to(snapshots: torch.Tensor, mean: torch.Tensor, cov: torch.Tensor) -> list[float]:
    """W₂ between the Gaussian fit of each snapshot's R chains and N(mean, cov); snapshots
    (C, R, d), batched through ``fedhmc.analysis.metrics.gaussian_w2_sq``.

    The Gaussian fit (Gelbrich) is exact when the chains' law is Gaussian and a lower bound
    on W₂ otherwise; delayed SGLD on this quadratic U is Gaussian up to the minibatch noise.
    """
    x = snapshots.to(torch.float64)
    m = x.mean(1)
    z = x - m.unsqueeze(1)
    c = z.transpose(1, 2) @ z / (x.shape[1] - 1)
    return gaussian_w2_sq(m, c, mean, cov).clamp_min(0.0).sqrt().tolist()


def w2_floor(mean: torch.Tensor, cov: torch.Tensor, chains: int, reps: int = 200, seed: int = 0):
    """Mean and std of the W₂ of ``chains`` exact posterior draws (Gaussian fit) to the
    posterior: the floor that finite R puts under every curve."""
    gen = torch.Generator().manual_seed(int(seed))
    chol = torch.linalg.cholesky(cov)
    z = torch.randn(reps, chains, mean.numel(), generator=gen, dtype=torch.float64)
    v = torch.tensor(w2_to(mean + z @ chol.T, mean, cov))
    return float(v.mean()), float(v.std())


def delayed_sgld_experiment(out_dir: Path, *, quick: bool = False, seed: int = 0) -> dict:
    """Kungurtsev et al. §3.2: W₂ of shared-memory delayed SGLD to the posterior of a
    4th-degree polynomial regression, against iterations and wall time.

    Data: n = 1000 points x ~ U(−1, 1), y = Σ_{j≤4} β_j x^j + ε, ε ~ N(0, 0.1) (the paper's
    noise), β ~ N(0, I) drawn from ``seed``; prior N(0, I), so the posterior is Gaussian in
    closed form. SGLD with γ = c / L for c ∈ {0.1, 0.3} (L the largest Hessian eigenvalue:
    our U sums over the data, so the paper's learning rate does not transfer), minibatches
    of 32 per gradient, σ = 1, X_0 = 0, R = 200 chains (50 with ``quick``). For P ∈ {2, 4}
    and each mode the workers apply 16,000 increments in all (400 and c = 0.3 only with
    ``quick``): 16,000 / P iterations per worker; a ``sync`` iteration adds P increments.

    W₂ is that of the Gaussian fit of the R chains at each snapshot: the law of X_k over
    independent replicas, which is what the paper's bounds are about (a window of one
    chain's iterates would mix the transient with autocorrelation). Wall time runs from the
    workers' start barrier (process start-up excluded, reported apart). Processes are
    forked where the platform allows (the experiment's process runs no threads of its own
    when it forks, and workers use one torch thread), else spawned.
    """
    import json

    from fedhmc.experiments._common import write_csv
    from fedhmc.runtime.output import write_text_atomic

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    problem = make_regression(1000, degree=4, noise_var=0.1, prior_std=1.0, seed=seed)
    mean, cov = posterior(problem)
    m, L = hessian_eigs(problem)
    plan = _DelayedPlan(
        scales=(0.3,) if quick else (0.1, 0.3),
        chains=50 if quick else 200,
        total=400 if quick else 16000,
        points=10 if quick else 80,
        start="fork" if "fork" in mp.get_all_start_methods() else "spawn",
        seed=seed,
    )
    floor = w2_floor(mean, cov, plan.chains, seed=seed)
    curves, rows, extra = _delayed_runs(problem, (mean, cov), L, plan)
    summary = _delayed_summary(problem, (mean, cov), (m, L), plan, floor)
    summary.update(rows=rows, runs=extra)
    write_csv(out_dir / "delayed_sgld.csv", curves)
    write_text_atomic(out_dir / "delayed_sgld.json", json.dumps(summary, indent=2) + "\n")
    _plots(out_dir, curves, plan.scales, floor[0], plan.eps)
    return summary


@dataclasses.dataclass(frozen=True)
class _DelayedPlan:
    """delayed-sgld's budget: the step scales c (γ = c / L), the chains R, the increments
    per run, the snapshots per run, the minibatch, the start method, the seed and the W₂
    threshold ε."""

    scales: tuple
    chains: int
    total: int
    points: int
    start: str
    seed: int
    batch: int = 32
    eps: float = 0.25


def _delayed_runs(problem, post: tuple, L: float, plan: _DelayedPlan):
    """Every run (step scale, P ∈ {2, 4}, mode): the curve rows (one per snapshot), the
    table rows (one per run) and each run's start-up time and staleness histogram."""
    curves, rows, extra = [], [], {}
    for c in plan.scales:
        for P in (2, 4):
            iters = plan.total // P
            for mode in MODES:
                s = delayed.Settings(
                    mode=mode,
                    workers=P,
                    iterations=iters,
                    step_size=c / L,
                    batch_size=plan.batch,
                    chains=plan.chains,
                    record_every=max(1, iters // plan.points),
                    seed=plan.seed,
                    start_method=plan.start,
                    timeout=600.0,
                )
                res = run_delayed(problem, s, progress=True)
                row, info = _delayed_run_rows(res, c, post, plan.eps, curves)
                rows.append(row)
                extra[f"c={c} {mode} P={P}"] = {
                    "startup_s": info["startup_s"],
                    "staleness_hist": info["staleness_hist"],
                }
    return curves, rows, extra


def _delayed_run_rows(res, c: float, post: tuple, eps: float, curves: list) -> tuple:
    """One run's table row and summary; its curve rows (W₂ and mean error at each snapshot)
    are appended to ``curves``."""
    mean, cov = post
    P, mode = res.settings.workers, res.settings.mode
    w2 = w2_to(res.snapshots, mean, cov)
    its = (res.updates.to(torch.float64) / P).tolist()
    wall = res.wall_s.tolist()
    snaps = res.snapshots
    for it, u, t, w, x in zip(its, res.updates.tolist(), wall, w2, snaps, strict=True):
        curves.append(
            {
                "step_scale": c,
                "workers": P,
                "mode": mode,
                "iteration": it,
                "updates": u,
                "wall_s": t,
                "w2": w,
                "mean_error": float((x.mean(0) - mean).norm()),
            }
        )
    tail = max(1, len(w2) // 4)
    hit = next((i for i, w in enumerate(w2) if w <= eps), None)
    info = res.summary()
    row = {
        "gamma_L": c,
        "workers": P,
        "mode": mode,
        "wall_s": round(res.wall_total_s, 2),
        "updates_per_s": round(info["updates"] / res.wall_total_s, 1),
        "w2_last25pct": sum(w2[-tail:]) / tail,
        "iters_to_eps": None if hit is None else its[hit],
        "time_to_eps": None if hit is None else round(wall[hit], 2),
        "staleness_mean": round(info["staleness_mean"], 3),
    }
    return row, info


def _delayed_summary(problem, post: tuple, eigs: tuple, plan: _DelayedPlan, floor) -> dict:
    """delayed-sgld's summary but its rows and runs: the settings, the posterior and the
    W₂ floor (mean, sd)."""
    (mean, cov), (m, L) = post, eigs
    return {
        "experiment": "delayed-sgld",
        "settings": {
            "n": problem.n,
            "degree": 4,
            "noise_var": 0.1,
            "prior_std": 1.0,
            "coef": problem.coef.tolist(),
            "hessian_m": m,
            "hessian_L": L,
            "step_sizes": {str(c): c / L for c in plan.scales},
            "batch_size": plan.batch,
            "chains": plan.chains,
            "increments_per_run": plan.total,
            "start_method": plan.start,
            "eps": plan.eps,
        },
        "posterior_mean": mean.tolist(),
        "posterior_sd": cov.diagonal().sqrt().tolist(),
        "w2_floor": {"mean": floor[0], "sd": floor[1]},
    }


def _plots(out_dir: Path, curves: list[dict], scales, floor: float, eps: float) -> None:
    from fedhmc.viz.plots import new_figure

    colors = {"sync": "C0", "w-con": "C1", "w-icon": "C2"}
    for xkey, xlabel, name in (
        ("iteration", "iterations per worker", "delayed_sgld_iterations.png"),
        ("wall_s", "wall time (s, from the workers' start)", "delayed_sgld_wall.png"),
    ):
        fig = new_figure(9.0, 3.2 * len(scales) + 0.4)
        axes = fig.subplots(len(scales), 2, sharey=True, squeeze=False)
        for row, c in zip(axes, scales, strict=True):
            for ax, P in zip(row, (2, 4), strict=True):
                for mode in MODES:
                    pts = [
                        q
                        for q in curves
                        if q["workers"] == P and q["mode"] == mode and q["step_scale"] == c
                    ]
                    xs, ys = [q[xkey] for q in pts], [q["w2"] for q in pts]
                    ax.semilogy(xs, ys, label=mode, color=colors[mode], lw=1.2)
                ax.axhline(floor, color="gray", ls=":", lw=1, label="floor (R exact draws)")
                ax.axhline(eps, color="gray", ls="--", lw=0.8, label=f"ε = {eps:g}")
                ax.set_title(f"γ = {c:g}/L, P = {P}", fontsize=9)
                ax.set_xlabel(xlabel, fontsize=8)
            row[0].set_ylabel("W₂ to the posterior")
        axes[0][0].legend(fontsize=7)
        fig.suptitle("Delayed SGLD, 4th-degree polynomial regression", fontsize=10)
        fig.tight_layout()
        fig.savefig(out_dir / name, dpi=120)
