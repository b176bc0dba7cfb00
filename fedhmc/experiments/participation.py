"""``participation``: partial client participation, the cross-device setting.

Two parts, each written to ``out_dir`` as a CSV table, a JSON summary and a figure:

1. **Classification.** Fashion-MNIST logistic regression on 100 clients split by
   Dirichlet(0.3) label skew, FA-HMC (K = 10) against FA-LD (K = 1), T = 10 local
   iterations, B = 100: S ∈ {5, 10, 20, 50, 100} clients a round under each scheme
   (``weighted``, ``uniform``, ``normalized``), all after the same budget of client-rounds
   (rounds = budget / S, so a small S runs more rounds). Accuracy, Brier score, ECE and NLL
   of the Bayesian model average at the end. With S = N, ``uniform`` and ``normalized``
   are full participation and are run once.
2. **The Gaussian's stationary law.** On the heterogeneous Gaussian (10 clients, the first
   five N(20, 1), the others N(1, 2), of unequal sizes w ∝ 1, 2, 1, 2, …, so that the three
   schemes differ) with exact gradients, T = 10, K = 5, η = 0.02: the mean and variance of
   θ̄ pooled over rounds and chains after burn-in, and its W₂ distance to the exact
   posterior, against S for each scheme and ρ ∈ {0, 1}. Full participation (S = N,
   ``normalized``) has its own small bias from the local iterations; what partial
   participation adds does not decay with more rounds.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from fedhmc.core import PARTICIPATION_SCHEMES as SCHEMES
from fedhmc.experiments._common import METRICS, _write, write_csv

ARM_LEAPFROG_STEPS = (("fahmc", 10), ("fald", 1))
ARMS = tuple(name for name, _ in ARM_LEAPFROG_STEPS)  # the tables' order

PARTICIPATION_BUDGETS = {
    # budget: (dataset, clients, S values, client-rounds, seeds)
    "quick": ("digits", 20, (2, 20), 20, (0,)),
    "reduced": ("fashion-mnist", 100, (5, 10, 20, 50, 100), 1_000, (0,)),
    "full": ("fashion-mnist", 100, (5, 10, 20, 50, 100), 2_000, (0, 1, 2)),
}
GAUSSIAN = {
    # budget: (S values, chains, rounds, burn-in)
    "quick": ((1, 10), 50, 60, 20),
    "reduced": ((1, 2, 3, 5, 10), 100, 1_000, 150),
    "full": ((1, 2, 3, 5, 10), 200, 2_000, 200),
}
FIGURE_WIDTH = 7.2
"""Inches: the width a results page shows a figure at (688 px at 96 dpi), so that its
text is shown at the size it is drawn."""
FIGURE_DPI = 96


def _cells(budget: str, seed: int):
    """(cell id, settings, the rows' labels) of the classification part."""
    dataset, N, Ss, client_rounds, seeds = PARTICIPATION_BUDGETS[budget]
    base = {
        "dataset": dataset,
        "num-clients": N,
        "partition": "dirichlet",
        "dirichlet-alpha": 0.3,
        "min-client-size": 1,
        "batch-size": 100,
        "local-steps": 10 if budget != "quick" else 2,
        "chains": 1,
    }
    out = []
    for s in seeds:
        for algorithm, K in ARM_LEAPFROG_STEPS:
            for S in Ss:
                rounds = max(1, client_rounds // S)
                # S = N under uniform or normalized is full participation: one run for both.
                schemes = ["weighted", "normalized"] if S == N else list(SCHEMES)
                for scheme in schemes:
                    cell = {
                        **base,
                        "algorithm": algorithm,
                        "leapfrog-steps": K,
                        "clients-per-round": S,
                        "participation": scheme,
                        "rounds": rounds,
                        "burn-in": rounds // 10,
                        "seed": seed + s,
                    }
                    cid = f"{algorithm}_S{S}_{scheme}_seed{seed + s}"
                    labels = [scheme] if scheme != "normalized" or S != N else ["uniform", scheme]
                    out.append((cid, cell, labels))
    return out


def classification(out_dir: Path, budget: str, seed: int, workers: int = 1) -> list[dict]:
    """Run (or read back) the classification cells; the last round of each, one row per
    (algorithm, S, scheme, seed)."""
    from fedhmc.sweep.cells import pending_cells, run_cells

    cells = _cells(budget, seed)
    named = [(cid, s) for cid, s, _ in cells]
    # Small shapes: with several workers, one thread each (two threads a worker would
    # oversubscribe the cores, which slows torch down many times over).
    run_cells(
        out_dir,
        pending_cells(out_dir, named),
        workers=workers,
        threads=1 if workers > 1 else None,
        desc="cells",
    )
    return classification_rows(out_dir, cells)


def run_grad_evals(cell_dir: Path, history: list[dict]) -> int:
    """The gradient evaluations of the run in ``cell_dir``, summed over its clients and
    rounds: its ``summary.json``'s total, else the last round's running total in
    ``metrics.csv`` (whose ``grad_evals`` column counts from the run's start)."""
    try:
        total = json.loads((cell_dir / "summary.json").read_text()).get("grad_evals")
    except (OSError, ValueError):
        total = None
    if total is None:
        total = history[-1].get("grad_evals") if history else 0
    return int(total or 0)


def classification_rows(out_dir: Path, cells: list[tuple[str, dict, list[str]]]) -> list[dict]:
    """One row per (algorithm, S, scheme, seed) from the cells' files in
    ``out_dir/cells/``: the last round's metrics and the run's totals."""
    from fedhmc.sweep.table import cell_rows

    rows = []
    for cid, s, labels in cells:
        cell_dir = out_dir / "cells" / cid
        history = cell_rows(cell_dir)  # the run's status and every round
        last, status = history[-1], history[-1]["status"]
        for scheme in labels:
            rows.append(
                {
                    "algorithm": s["algorithm"],
                    "K": s["leapfrog-steps"],
                    "S": s["clients-per-round"],
                    "participation": scheme,
                    "seed": s["seed"],
                    "rounds": s["rounds"],
                    "status": status,
                    **{m: last.get(m) if status == "completed" else None for m in METRICS},
                    "grad_evals": run_grad_evals(cell_dir, history),
                    "wall_s": last.get("wall_s"),
                }
            )
    return rows


# ---------------------------------------------------------------------------------------
# The Gaussian


def gaussian_target(dim: int = 1):
    """The heterogeneous Gaussian of 10 clients with unequal sizes w ∝ 1, 2, 1, 2, …"""
    import torch

    from fedhmc.models.targets import GaussianTarget

    means, variances = [20.0] * 5 + [1.0] * 5, [1.0] * 5 + [2.0] * 5
    weights = [1.0 + (c % 2) for c in range(10)]
    return GaussianTarget(means, variances, dim, weights=weights, dtype=torch.float64)


def pooled_law(
    scheme: str, S: int, rho: float, chains: int, rounds: int, burn: int, seed: int
) -> dict:
    """θ̄'s mean and variance pooled over rounds (after ``burn``) and chains, with batch-means
    standard errors over 20 batches of rounds (a round's chains share its clients)."""
    import numpy as np
    import torch

    from fedhmc.algorithms import fahmc

    target = gaussian_target()
    settings = fahmc.Settings(0.02, 5, 10, rho=rho, clients_per_round=S, participation=scheme)
    state = fahmc.init(torch.zeros(chains, 1, dtype=torch.float64), settings)
    m1, m2 = [], []
    diverged = None
    for r in range(burn + rounds):
        state, _ = fahmc.step(seed, state, target, settings)
        x = state.position[:, 0]
        if not bool(torch.isfinite(x).all()) or float(x.abs().max()) > 1e6:
            diverged = r + 1
            break
        if r >= burn:
            m1.append(float(x.mean()))
            m2.append(float(x.square().mean()))
    post = target.posterior()
    out = {"scheme": scheme, "S": S, "rho": rho, "diverged_round": diverged}
    if diverged is not None:
        return {**out, "mean": None, "var": None, "w2": None, "se_mean": None, "se_var": None}
    a1, a2 = np.array(m1), np.array(m2)
    mean = float(a1.mean())
    # Each round's mean squared deviation from the pooled mean: their average is the pooled
    # variance, and their batch means give its standard error (E[θ̄²] and E[θ̄]² are too
    # correlated for their errors to be added).
    dev = a2 - 2 * mean * a1 + mean**2
    var = float(dev.mean())

    def se(v):
        b = v[: len(v) // 20 * 20].reshape(20, -1).mean(1)
        return float(b.std(ddof=1) / math.sqrt(20))

    se_mean, se_var = se(a1), se(dev)
    w2 = math.sqrt((mean - post.mean) ** 2 + (math.sqrt(max(var, 0.0)) - math.sqrt(post.var)) ** 2)
    return {**out, "mean": mean, "var": var, "w2": w2, "se_mean": se_mean, "se_var": se_var}


def gaussian_part(out_dir: Path, budget: str, seed: int) -> tuple[list[dict], dict]:
    """Every (ρ, scheme, S) of the Gaussian part; each setting's result is kept in
    ``out_dir/gaussian/`` as it finishes, so that a rerun goes on where one stopped."""
    from fedhmc.core.progress import bar
    from fedhmc.runtime.output import write_text_atomic

    Ss, chains, rounds, burn = GAUSSIAN[budget]
    jobs = [(rho, scheme, S) for rho in (1.0, 0.0) for scheme in SCHEMES for S in Ss]
    rows = []
    pbar = bar(len(jobs), "gaussian", "setting")
    (out_dir / "gaussian").mkdir(parents=True, exist_ok=True)
    for rho, scheme, S in jobs:
        done = (
            out_dir
            / "gaussian"
            / (f"rho{rho:g}_{scheme}_S{S}_chains{chains}_rounds{rounds}_burn{burn}_seed{seed}.json")
        )
        if done.exists():
            row = json.loads(done.read_text())
        else:
            row = pooled_law(scheme, S, rho, chains, rounds, burn, seed)
            write_text_atomic(done, json.dumps(row) + "\n")
        rows.append(row)
        if pbar is not None:
            pbar.update(1)
    if pbar is not None:
        pbar.close()
    post = gaussian_target().posterior()
    settings = {
        "clients": 10,
        "weights": "1, 2, 1, 2, … (normalised)",
        "T": 10,
        "K": 5,
        "eta": 0.02,
        "chains": chains,
        "rounds": rounds,
        "burn_in": burn,
        "seed": seed,
        "posterior_mean": post.mean,
        "posterior_var": post.var,
    }
    return rows, settings


# ---------------------------------------------------------------------------------------
# Tables and figures


def summarize_over_seeds(rows: list[dict]) -> list[dict]:
    """Mean and sd over the seeds of each (algorithm, S, scheme) that completed (nan
    where none did: every seed diverged)."""
    from fedhmc.sweep.table import mean_std

    groups: dict[tuple, list[dict]] = {}
    for r in rows:
        groups.setdefault((r["algorithm"], r["S"], r["participation"]), []).append(r)
    out = []
    for (algorithm, S, scheme), rs in sorted(
        groups.items(), key=lambda kv: (ARMS.index(kv[0][0]), kv[0][1], SCHEMES.index(kv[0][2]))
    ):
        row = {"algorithm": algorithm, "S": S, "participation": scheme, "rounds": rs[0]["rounds"]}
        ok = [r for r in rs if r["status"] == "completed"]
        row["seeds"] = f"{len(ok)}/{len(rs)}"
        for m in METRICS:
            row[m], row[f"{m}_sd"] = mean_std([r[m] for r in ok])
        out.append(row)
    return out


def plot_classification(path: Path, rows: list[dict], title: str) -> None:
    """Each metric against S: one line per (algorithm, scheme), mean over seeds."""
    from matplotlib.ticker import NullLocator

    from fedhmc.viz.plots import new_figure

    fig = new_figure(FIGURE_WIDTH, 6.4)
    axes = fig.subplots(2, 2).ravel()
    styles = {"weighted": "o-", "uniform": "s--", "normalized": "^:"}
    colors = {"fahmc": "C0", "fald": "C3"}
    names = {"fahmc": "FA-HMC K=10", "fald": "FA-LD"}
    for ax, m in zip(axes, METRICS, strict=True):
        for algorithm in colors:
            for scheme in SCHEMES:
                pts: dict[int, list[float]] = {}
                for r in rows:
                    ok = r["status"] == "completed" and r[m] not in (None, "")
                    if r["algorithm"] == algorithm and r["participation"] == scheme and ok:
                        pts.setdefault(int(r["S"]), []).append(float(r[m]))
                if not pts:
                    continue
                xs = sorted(pts)
                ys = [sum(pts[x]) / len(pts[x]) for x in xs]
                ax.plot(
                    xs,
                    ys,
                    styles[scheme],
                    color=colors[algorithm],
                    ms=4,
                    lw=1.2,
                    label=f"{names[algorithm]}, {scheme}",
                )
        ax.set_xscale("log")
        ax.set_xticks(sorted({int(r["S"]) for r in rows}))
        ax.xaxis.set_major_formatter("{x:.0f}")
        ax.xaxis.set_minor_locator(NullLocator())
        ax.tick_params(labelsize=8)
        ax.set_xlabel("clients per round S", fontsize=9)
        ax.set_title({"nll_sum": "NLL (sum over the test set)"}.get(m, m), fontsize=9)
        if m == "nll_sum":
            ax.set_yscale("log")
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=3, fontsize=8, frameon=False)
    fig.suptitle(title, fontsize=9)
    fig.tight_layout(rect=(0, 0.09, 1, 1))
    fig.savefig(path, dpi=FIGURE_DPI)


def plot_gaussian(path: Path, rows: list[dict], settings: dict) -> None:
    """Pooled variance and W₂ against S, per scheme and ρ."""
    from fedhmc.viz.plots import new_figure

    fig = new_figure(FIGURE_WIDTH, 6.4)
    axes = fig.subplots(2, 2)
    styles = {"weighted": "o-", "uniform": "s--", "normalized": "^:"}
    for j, rho in enumerate((1.0, 0.0)):
        for scheme in SCHEMES:
            sel = [r for r in rows if float(r["rho"]) == rho and r["scheme"] == scheme]
            sel = [r for r in sel if r["var"] not in (None, "")]
            xs = [int(r["S"]) for r in sel]
            var = [float(r["var"]) for r in sel]
            err = [2 * float(r["se_var"]) for r in sel]
            axes[0, j].errorbar(
                xs,
                var,
                # ±2 s.e., the lower bar kept above zero on the log axis
                yerr=[[min(e, 0.9 * v) for e, v in zip(err, var, strict=True)], err],
                fmt=styles[scheme],
                ms=4,
                capsize=2,
                label=scheme,
            )
            axes[1, j].plot(xs, [float(r["w2"]) for r in sel], styles[scheme], ms=4, label=scheme)
        axes[0, j].axhline(
            settings["posterior_var"], color="k", lw=0.8, ls="--", label="exact posterior"
        )
        axes[0, j].set_title(f"variance of θ̄ pooled over rounds, ρ = {rho:g}", fontsize=9)
        axes[0, j].set_yscale("log")
        axes[1, j].set_title(f"W₂(θ̄, posterior), ρ = {rho:g}", fontsize=9)
        axes[1, j].set_yscale("log")
        for ax in axes[:, j]:
            ax.tick_params(labelsize=8)
            ax.set_xlabel("clients per round S (of 10)", fontsize=9)
            ax.set_xticks(sorted({int(r["S"]) for r in rows}))
    handles, labels = axes[0, 0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=4, fontsize=8, frameon=False)
    fig.suptitle(
        f"Heterogeneous Gaussian, 10 clients of unequal sizes, T = {settings['T']}, "
        f"K = {settings['K']}, η = {settings['eta']}\n({settings['chains']} chains × "
        f"{settings['rounds']} rounds; error bars ±2 s.e.)",
        fontsize=9,
    )
    fig.tight_layout(rect=(0, 0.05, 1, 1))
    fig.savefig(path, dpi=FIGURE_DPI)


def write_participation_tables(
    out_dir: Path, rows: list[dict], budget: str, title: str
) -> list[dict]:
    """``participation.csv`` (one row per run), ``participation.json`` and
    ``participation_summary.csv`` (mean and sd over the seeds); returns the summary rows."""
    table = summarize_over_seeds(rows)
    _write(
        out_dir,
        "participation",
        rows,
        {"experiment": "participation", "budget": budget, "title": title, "rows": table},
    )
    write_csv(out_dir / "participation_summary.csv", table)
    return table


def rebuild_tables(out_dir: Path) -> bool:
    """Write the classification tables again from the runs in ``out_dir/cells/`` (every
    cell of the budget ``participation.json`` names, the seed ``participation_gaussian.json``
    names); False, writing nothing, where a cell is missing."""
    summary = json.loads((out_dir / "participation.json").read_text())
    seed = int(
        json.loads((out_dir / "participation_gaussian.json").read_text())["settings"]["seed"]
    )
    cells = _cells(summary["budget"], seed)
    if not all((out_dir / "cells" / cid / "metrics.csv").is_file() for cid, _, _ in cells):
        return False
    rows = classification_rows(out_dir, cells)
    write_participation_tables(out_dir, rows, summary["budget"], summary["title"])
    return True


def replot(out_dir: Path, rebuild: bool = True) -> list[Path]:
    """Redraw both figures from the files the experiment wrote; where its runs are kept
    (``cells/``), the classification tables are first written again from them (unless
    ``rebuild`` is false)."""
    from fedhmc.sweep.table import read_csv

    out_dir = Path(out_dir)
    if rebuild and (out_dir / "cells").is_dir():
        rebuild_tables(out_dir)
    summary = json.loads((out_dir / "participation.json").read_text())
    rows = read_csv(out_dir / "participation.csv")
    plot_classification(out_dir / "participation.png", rows, summary["title"])
    g = json.loads((out_dir / "participation_gaussian.json").read_text())
    plot_gaussian(out_dir / "participation_gaussian.png", g["rows"], g["settings"])
    return [out_dir / "participation.png", out_dir / "participation_gaussian.png"]


def participation(
    out_dir: Path, *, quick: bool = False, seed: int = 0, full: bool = False, workers: int = 1
) -> dict:
    """Partial participation on Fashion-MNIST (FA-HMC against FA-LD, S and scheme at a
    fixed budget of client-rounds) and on the heterogeneous Gaussian (the stationary law
    against S). The default budget is 1,000 client-rounds and one seed, and 100 chains ×
    1,000 rounds for the Gaussian; ``--full``, 2,000 client-rounds, three seeds, and
    200 chains × 2,000 rounds."""
    out_dir = Path(out_dir)
    budget = "quick" if quick else "full" if full else "reduced"
    dataset, N, Ss, client_rounds, seeds = PARTICIPATION_BUDGETS[budget]
    g_rows, g_settings = gaussian_part(out_dir, budget, seed)
    _write(out_dir, "participation_gaussian", g_rows, {"settings": g_settings, "rows": g_rows})
    rows = classification(out_dir, budget, seed, workers)
    title = (
        f"{dataset} logistic regression, {N} clients Dirichlet(0.3), T = "
        f"{10 if budget != 'quick' else 2}, B = 100, {client_rounds:,} client-rounds "
        f"({len(seeds)} seed{'s' if len(seeds) > 1 else ''}; {budget})"
    )
    table = write_participation_tables(out_dir, rows, budget, title)
    replot(out_dir, rebuild=False)
    return {"rows": table, "gaussian": g_rows}
