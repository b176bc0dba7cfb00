"""The paper's figures under both protocols: tune η, run seeds, tabulate against the paper.

``fedhmc experiment paper-fmnist-K`` (and its siblings, see :data:`FIGURES`) runs one figure
of Liang et al. (2024) twice, side by side:

- ``authors``: the protocol of the authors' experiment code (``--protocol authors``);
- ``algorithm3``: the paper's Algorithm 3 as printed with fedhmc's defaults
  (``--protocol algorithm3``: prior N(0, I), temperature 1, standardised features, zero
  start, uniform minibatches, 15-bin ECE, 10 % burn-in).

Both get the same budget in leapfrog steps: the authors' protocol runs ``rounds`` rounds of
T leapfrog steps; Algorithm 3 runs T' = max(1, T // K) iterations of K steps per round, for
``rounds · T / (T' K)`` rounds (fewer exchanges where T < K or K does not divide T, the
same otherwise). Both tune η the same way, on seed 0 at a shorter budget, on a 1-2-5 grid
(the authors' grid; ten times larger for Algorithm 3, whose untempered posterior is
√200 ≈ 14 times wider): a descent along the grid from the previous setting's choice that
stops when the best η's two grid neighbours are both worse (:func:`tune_eta`); the lowest
final NLL wins. Then every setting runs
``seeds`` seeds at the chosen η and the table reports mean ± sd of the final BMA metrics
(sd "—" for a single seed).

Stages run in this order, each cell in its own folder under ``cells/``, resumed when it
completed before: tune (authors), seeds (authors), tune (algorithm3), seeds (algorithm3).
The tables are rewritten after every stage, so a stopped run leaves valid partial tables.
"""

from __future__ import annotations

import csv
import dataclasses
import json
import math
import os
import time
from dataclasses import dataclass, replace
from pathlib import Path

from fedhmc.errors import ConfigError
from fedhmc.experiments._common import write_csv
from fedhmc.runtime.config import RunConfig
from fedhmc.runtime.output import write_text_atomic
from fedhmc.sweep.cells import FolderLock, pending_cells, run_cells
from fedhmc.sweep.table import format_mean_std, mean_std

AUTHORS_GRID = (5e-4, 2e-4, 1e-4, 5e-5, 2e-5, 1e-5, 5e-6, 2e-6, 1e-6, 5e-7, 2e-7)
"""The step sizes the authors' tuning script tries (temperature 0.005)."""
ALGORITHM3_GRID = tuple(10 * e for e in AUTHORS_GRID)
"""The same ladder one decade up, for the untempered posterior of ``--protocol algorithm3``."""
PROTOCOL_ORDER = ("authors", "algorithm3")
PAPER_FMNIST = {"accuracy": 0.847, "brier": 0.219, "ece": 0.008, "nll_sum": 4332.0, "runs": 5}
"""The best values of the paper's Figure 3 (the K sweep), and its runs per setting."""
PAPER_FMNIST_T = {"accuracy": 0.846, "brier": 0.219, "ece": 0.0082, "nll_sum": 4332.0, "runs": 5}
"""The best values of the paper's Figure 4 (the T sweep), and its runs per setting."""
PAPER_MLP = {"accuracy": 0.899, "brier": 0.146, "ece": 0.006, "runs": 1, "source": "axes"}
"""The best values of the paper's Figure 5 (a–c), the MLP against K, as far as they can be
read off its axes (the paper gives no table, and no NLL panel); one chain per setting."""
METRICS = ("accuracy", "brier", "ece", "nll_sum")


@dataclass(frozen=True)
class Figure:
    """One figure: the axis it varies (``K`` or ``T``) and everything it holds fixed."""

    title: str
    axis: str
    values: tuple[int, ...]
    K: int = 10
    T: int = 50
    dataset: str = "fashion-mnist"
    model: str = "logistic"
    partition: str = "iid"
    alpha: float = 0.1
    clients: int = 10
    batch: int = 1000
    rounds: int = 200
    tune_rounds: int = 40
    seeds: int = 5
    grid_authors: tuple[float, ...] = AUTHORS_GRID
    grid_algorithm3: tuple[float, ...] = ALGORITHM3_GRID
    paper: dict | None = None

    def grid(self, protocol: str) -> tuple[float, ...]:
        return self.grid_authors if protocol == "authors" else self.grid_algorithm3

    def KT(self, value: int) -> tuple[int, int]:
        return (value, self.T) if self.axis == "K" else (self.K, value)


_FIG3 = Figure(
    "Fashion-MNIST logistic regression, 10 iid clients, T = 50 leapfrog steps (Figure 3)",
    "K",
    (1, 10, 50, 100),
    paper=PAPER_FMNIST,
)
_FIG4 = Figure(
    "Fashion-MNIST logistic regression, 10 iid clients, K = 10 (Figure 4)",
    "T",
    (1, 10, 20, 50, 100),
    paper=PAPER_FMNIST_T,
)
FIGURES: dict[str, Figure] = {
    "paper-fmnist-K": _FIG3,
    "paper-fmnist-T": _FIG4,
    "paper-fmnist-K-dirichlet": replace(
        _FIG3,
        title="Fashion-MNIST logistic regression, 10 Dirichlet(0.1) clients, T = 50",
        partition="dirichlet",
        paper=None,
    ),
    "paper-fmnist-T-dirichlet": replace(
        _FIG4,
        title="Fashion-MNIST logistic regression, 10 Dirichlet(0.1) clients, K = 10",
        partition="dirichlet",
        paper=None,
    ),
    "paper-fmnist-mlp": replace(
        _FIG3,
        title="Fashion-MNIST MLP (100, 100), 10 iid clients, T = 50 (one seed)",
        model="mlp",
        values=(1, 10, 50),
        seeds=1,
        paper=PAPER_MLP,
    ),
}


def budget_figure(fig: Figure, budget: str) -> Figure:
    """The figure at a budget: ``full`` (the paper's), ``reduced`` (about a quarter of the
    rounds, two seeds, every other grid value) or ``quick`` (digits, seconds: tests)."""
    if budget == "full":
        return fig
    if budget == "reduced":
        return replace(
            fig,
            rounds=max(1, fig.rounds // 4),
            tune_rounds=max(1, fig.tune_rounds // 4),
            seeds=min(fig.seeds, 2),
            grid_authors=fig.grid_authors[::2],
            grid_algorithm3=fig.grid_algorithm3[::2],
        )
    return replace(
        fig,
        title="quick check on digits of: " + fig.title,
        dataset="digits",
        values=fig.values[:2],
        K=2,
        T=4,
        clients=3,
        batch=32,
        rounds=3,
        tune_rounds=2,
        seeds=2,
        grid_authors=(1e-3, 1e-4),
        grid_algorithm3=(1e-2, 1e-3),
        paper=None,
    )


def cell_settings(fig: Figure, protocol: str, value: int, eta: float, seed: int, rounds: int):
    """The ``fedhmc run`` settings of one cell (kebab-case keys)."""
    K, T = fig.KT(value)
    s = {
        "dataset": fig.dataset,
        "model": fig.model,
        "num-clients": fig.clients,
        "partition": fig.partition,
        "dirichlet-alpha": fig.alpha,
        "batch-size": fig.batch,
        "protocol": protocol,
        "leapfrog-steps": K,
        "step-size": eta,
        "seed": seed,
    }
    if protocol == "authors":
        s.update({"local-steps": T, "rounds": rounds})
    else:  # the same leapfrog steps in whole trajectories
        t_iter = max(1, T // K)
        s.update({"local-steps": t_iter, "rounds": max(1, round(rounds * T / (t_iter * K)))})
    return s


def _cell_id(protocol: str, axis: str, value: int, eta: float | None, seed: int | None) -> str:
    parts = [protocol, f"{axis}={value}"]
    if eta is not None:
        parts.append(f"eta={eta:g}")
    if seed is not None:
        parts.append(f"seed={seed}")
    return "_".join(parts)


def _run_missing(out: Path, cells: list[tuple[str, dict]], workers: int, desc: str) -> None:
    """Run the cells not yet finished, ``workers`` at a time (each worker with its share
    of the cores' torch threads), with a progress bar."""
    threads = max(1, (os.cpu_count() or 1) // workers) if workers > 1 else None
    run_cells(out, pending_cells(out, cells), workers=workers, threads=threads, desc=desc)


def _read_cell(cell_dir: Path) -> dict | None:
    try:
        summary = json.loads((cell_dir / "summary.json").read_text())
    except (OSError, ValueError):
        return None
    return summary


def _curve(cell_dir: Path) -> list[dict]:
    with open(cell_dir / "metrics.csv") as f:
        return [{k: float(v) for k, v in r.items()} for r in csv.DictReader(f)]


def tune_eta(
    out: Path,
    fig: Figure,
    protocol: str,
    value: int,
    seed: int,
    workers: int,
    start: float | None = None,
) -> None:
    """Run tuning cells until the grid's best η has both grid neighbours evaluated.

    A descent along the grid: from ``start`` (the previous setting's choice, else the
    grid's middle) evaluate it and its neighbours, then step towards the lower final NLL
    until no neighbour of the best is left untried. Under a unimodal NLL(η) this finds the
    grid's best after a few cells instead of all of them; every cell tried is kept and
    reported.
    """
    grid = sorted(fig.grid(protocol))
    if start is None:
        i0 = len(grid) // 2
    else:
        i0 = min(range(len(grid)), key=lambda i: abs(math.log(grid[i] / start)))

    def nll(i: int) -> float:
        s = _read_cell(out / "cells" / _cell_id(protocol, fig.axis, value, grid[i], None))
        if s is None or s.get("status") != "completed":
            return math.inf
        v = (s.get("final") or {}).get("nll_sum")
        return v if v is not None and math.isfinite(v) else math.inf

    tried: set[int] = set()
    want = {i for i in (i0 - 1, i0, i0 + 1) if 0 <= i < len(grid)}
    while want - tried:
        todo = sorted(want - tried)
        cells = [
            (
                _cell_id(protocol, fig.axis, value, grid[i], None),
                cell_settings(fig, protocol, value, grid[i], seed, fig.tune_rounds),
            )
            for i in todo
        ]
        _run_missing(out, cells, workers, f"{protocol} {fig.axis}={value}: tuning η")
        tried |= set(todo)
        best = min(sorted(tried), key=lambda i: (nll(i), -i))
        if math.isinf(nll(best)):  # every cell so far diverged: try the next smaller step
            if min(tried) == 0:
                return
            want = tried | {min(tried) - 1}
            continue
        want = tried | {i for i in (best - 1, best + 1) if 0 <= i < len(grid)}


def select_eta(out: Path, fig: Figure, protocol: str, value: int) -> dict:
    """The tuning result of one setting: every η's final NLL and the chosen η."""
    tried = []
    for eta in fig.grid(protocol):
        cid = _cell_id(protocol, fig.axis, value, eta, None)
        s = _read_cell(out / "cells" / cid)
        if s is None:
            continue  # not tried: the descent did not need it
        status = s.get("status")
        nll = None
        if status == "completed":
            nll = (s.get("final") or {}).get("nll_sum")
        tried.append({"eta": eta, "status": status or "missing", "nll_sum": nll})
    ok = [t for t in tried if t["nll_sum"] is not None and math.isfinite(t["nll_sum"])]
    best = min(ok, key=lambda t: (t["nll_sum"], t["eta"])) if ok else None
    edge = None
    if best is not None:
        grid = fig.grid(protocol)
        edge = best["eta"] in (max(grid), min(grid))
    return {"tried": tried, "eta": None if best is None else best["eta"], "at_grid_edge": edge}


def paper_figure(
    name: str,
    out_dir: Path,
    *,
    quick: bool = False,
    full: bool = False,
    seed: int = 0,
    workers: int = 1,
    protocols: tuple[str, ...] = PROTOCOL_ORDER,
) -> dict:
    """Run figure ``name`` of :data:`FIGURES` under both protocols into ``out_dir``.

    ``seed`` offsets the seeds (seed, seed + 1, …). Returns the summary (also written as
    ``<name>.json``, with ``<name>.csv``, ``<name>_curves.csv``, ``<name>.md`` and plots).
    """
    budget = "quick" if quick else "full" if full else "reduced"
    fig = budget_figure(FIGURES[name], budget)
    out_dir = Path(out_dir)
    (out_dir / "cells").mkdir(parents=True, exist_ok=True)
    with FolderLock(out_dir):
        return _paper_figure(name, out_dir, fig, budget, seed, workers, protocols)


def _paper_figure(name, out_dir, fig, budget, seed, workers, protocols) -> dict:
    t0 = time.perf_counter()
    for protocol in protocols:
        chosen: dict[int, dict] = {}
        start = None
        for v in fig.values:
            tune_eta(out_dir, fig, protocol, v, seed, workers, start)
            chosen[v] = select_eta(out_dir, fig, protocol, v)
            start = chosen[v]["eta"] or start
        runs = [
            (
                _cell_id(protocol, fig.axis, v, None, seed + i),
                cell_settings(fig, protocol, v, chosen[v]["eta"], seed + i, fig.rounds),
            )
            for v in fig.values
            if chosen[v]["eta"] is not None
            for i in range(fig.seeds)
        ]
        _run_missing(out_dir, runs, workers, f"{protocol}: seeds")
        summary = write_tables(name, out_dir, fig, budget, seed)
    summary["wall_s_this_call"] = time.perf_counter() - t0
    return summary


def write_tables(name: str, out_dir: Path, fig: Figure, budget: str, seed: int = 0) -> dict:
    """Tables, curves and plots from whatever cells have completed (partial is fine)."""
    rows, curves, tuning = [], [], {}
    for protocol in PROTOCOL_ORDER:
        for v in fig.values:
            sel = select_eta(out_dir, fig, protocol, v)
            tuning[f"{protocol} {fig.axis}={v}"] = sel
            finals, by_seed, diverged = [], [], 0
            for i in range(fig.seeds):
                cid = _cell_id(protocol, fig.axis, v, None, seed + i)
                s = _read_cell(out_dir / "cells" / cid)
                if s is not None and s.get("status") == "diverged":
                    diverged += 1  # a result: reported beside the mean of the others
                if s is None or s.get("status") != "completed":
                    continue
                finals.append(s["final"])
                cur = _curve(out_dir / "cells" / cid)
                by_seed.append(cur)
                for r in cur:
                    curves.append(
                        {
                            "protocol": protocol,
                            fig.axis: v,
                            "seed": seed + i,
                            **{
                                k: r[k]
                                for k in ("round", "grad_evals", "samples", *METRICS)
                                if k in r
                            },
                        }
                    )
            if not finals:
                continue
            K, T = fig.KT(v)
            settings = cell_settings(fig, protocol, v, sel["eta"], seed, fig.rounds)
            row = {
                "protocol": protocol,
                fig.axis: v,
                "K": K,
                "T": T,
                "local_steps": settings["local-steps"],
                "local_steps_unit": "leapfrog steps" if protocol == "authors" else "iterations",
                "rounds": settings["rounds"],
                "eta": sel["eta"],
                "eta_at_grid_edge": sel["at_grid_edge"],
                "seeds": len(finals),
                "diverged_seeds": diverged,
                "grad_evals": by_seed[0][-1]["grad_evals"],
            }
            for m in METRICS:
                mean, sd = mean_std([f[m] for f in finals])
                row[m] = mean
                row[f"{m}_sd"] = sd
            row["ece_bins"] = int(by_seed[0][-1].get("ece_bins", 15))
            rows.append(row)
    stem = name.replace("-", "_")
    summary = {
        "experiment": name,
        "title": fig.title,
        "budget": budget,
        "figure": {
            k: getattr(fig, k)
            for k in ("axis", "values", "K", "T", "dataset", "model", "partition", "alpha")
        }
        | {"rounds": fig.rounds, "tune_rounds": fig.tune_rounds, "seeds": fig.seeds},
        "protocols": {
            "authors": "--protocol authors: sync every T leapfrog steps (positions and momenta "
            "averaged), two fresh gradients per step, flat prior, temperature 0.005, pixels "
            "in [-1, 1], nn.Linear initialisation, random reshuffling, ECE over 20 bins, "
            "BMA from the first sample",
            "algorithm3": "--protocol algorithm3: the paper's Algorithm 3 with fedhmc's "
            "defaults (T iterations of K steps, positions averaged, gradient reused, prior "
            "N(0, I), temperature 1, standardised features, zero start, uniform minibatches, "
            "ECE over 15 bins, 10 % burn-in), the same leapfrog steps",
        },
        "selection": "lowest final NLL (sum) on seed 0 after tune_rounds rounds",
        "paper": fig.paper,
        "tuning": tuning,
        "rows": rows,
    }
    write_text_atomic(out_dir / f"{stem}.json", json.dumps(summary, indent=2) + "\n")
    if rows:
        write_csv(out_dir / f"{stem}.csv", rows)
    if curves:
        write_csv(out_dir / f"{stem}_curves.csv", curves)
        _plot(out_dir / stem, fig, curves)
    write_text_atomic(out_dir / f"{stem}.md", markdown_table(summary))
    return summary


def _mean_sd(row: dict, metric: str, spec: str) -> str:
    """``mean ± sd`` of a table row (fedhmc.sweep.table.format_mean_std: "± —" for one seed)."""
    return format_mean_std(row[metric], row[f"{metric}_sd"], spec, spec)


def markdown_table(summary: dict) -> str:
    """The results table (mean ± sd over seeds), with the paper's best row when it has one."""
    axis = summary["figure"]["axis"]
    lines = [
        f"**{summary['title']}** ({summary['budget']} budget: {summary['figure']['rounds']} "
        f"rounds, η tuned at {summary['figure']['tune_rounds']} rounds)",
        "",
        f"| protocol | {axis} | a round | η | seeds | rounds | grad evals | accuracy | Brier | "
        "ECE (bins) | NLL sum |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in summary["rows"]:
        edge = "*" if r["eta_at_grid_edge"] else ""
        seeds = str(r["seeds"])
        if r.get("diverged_seeds"):
            seeds += f" (+{r['diverged_seeds']} diverged)"
        if r["local_steps_unit"] == "iterations":
            per_round = f"{r['local_steps']} × {r['K']} step{'s' if r['K'] != 1 else ''}"
        else:
            n = r["local_steps"]
            per_round = f"{n} step{'s' if n != 1 else ''}"
        lines.append(
            f"| {r['protocol']} | {r[axis]} | {per_round} | {r['eta']:g}{edge} | {seeds} | "
            f"{r['rounds']} | {r['grad_evals']:,.0f} | {_mean_sd(r, 'accuracy', '.4f')} | "
            f"{_mean_sd(r, 'brier', '.4f')} | {_mean_sd(r, 'ece', '.4f')} ({r['ece_bins']}) | "
            f"{_mean_sd(r, 'nll_sum', ',.0f')} |"
        )
    paper = summary.get("paper")
    if paper:
        axes = paper.get("source") == "axes"
        label = "paper (best, read off its axes)" if axes else "paper (best)"
        nll = f"{paper['nll_sum']:,.0f}" if "nll_sum" in paper else "—"
        lines.append(
            f"| {label} | | | | {paper['runs']} | 200 | | "
            f"{paper['accuracy']:.3f} | {paper['brier']:.3f} | {paper['ece']:.4g} (20) | {nll} |"
        )
    lines.append("")
    if any(r["eta_at_grid_edge"] for r in summary["rows"]):
        lines += ["\\* the chosen η is at the edge of the grid tried.", ""]
    if any(r.get("diverged_seeds") for r in summary["rows"]):
        lines += ["Diverged seeds are left out of the means and counted apart.", ""]
    return "\n".join(lines)


def _plot(stem: Path, fig: Figure, curves: list[dict]) -> None:
    from fedhmc.viz.plots import new_figure

    for x in ("round", "grad_evals"):
        f = new_figure(13, 3.4)
        axes = f.subplots(1, len(METRICS))
        for ax, m in zip(axes, METRICS, strict=True):
            for protocol, ls in (("authors", "-"), ("algorithm3", ":")):
                for i, v in enumerate(fig.values):
                    sel = [c for c in curves if c["protocol"] == protocol and c[fig.axis] == v]
                    if not sel:
                        continue
                    by_x: dict[float, list[float]] = {}
                    for c in sel:
                        by_x.setdefault(c[x], []).append(c[m])
                    xs = sorted(by_x)
                    ax.plot(
                        xs,
                        [sum(by_x[k]) / len(by_x[k]) for k in xs],
                        ls=ls,
                        color=f"C{i}",
                        label=f"{protocol}, {fig.axis} = {v}",
                    )
            if fig.paper and m in fig.paper:
                ax.axhline(fig.paper[m], color="k", lw=0.8, ls="--", label="paper, best")
            ax.set_title(m + (" (sum)" if m == "nll_sum" else ""), fontsize=9)
            ax.set_xlabel("communication rounds" if x == "round" else "gradient evaluations")
            if m in ("nll_sum", "ece", "brier"):
                ax.set_yscale("log")
        axes[0].legend(fontsize=6, ncol=2)
        f.suptitle(fig.title + " — solid: authors' protocol, dotted: Algorithm 3", fontsize=9)
        f.tight_layout()
        f.savefig(f"{stem}_{'rounds' if x == 'round' else 'evals'}.png", dpi=110)


def check_workers(workers: int) -> int:
    if workers < 1:
        raise ConfigError(f"--workers must be ≥ 1, got {workers}")
    return workers


# --------------------------------------------------------------- simulated BLR, Figure 1c
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
    import torch

    from fedhmc.algorithms.fahmc import State, run_round

    K, T = settings.leapfrog_steps, settings.local_steps
    state = State(theta0, 0, None, theta0)
    out = []
    # Rounds (1-based, within an outer iteration) that hold a step of the last trajectory.
    first_needed = ((T - 1) * K) // T + 1
    for o in range(outer):
        for j in range(1, K + 1):
            r = o * K + j
            if skip and j < first_needed:
                continue
            state = dataclasses.replace(state, round=r - 1)
            momentum, origin = state.inputs(settings)
            if momentum is None and settings.starts_mid_trajectory(r):
                momentum = torch.zeros_like(theta0)  # feeds a discarded trajectory only
            theta, info = run_round(
                target, state.position, seed, r, settings, momentum=momentum, origin=origin
            )
            state = state.advanced(settings, theta, info.momentum)
        out.append(state.position)
    return torch.stack(out)


def algorithm3_blr_samples(target, settings, theta0, seed: int, rounds: int):
    """θ̄ after each of ``rounds`` rounds of Algorithm 3, (rounds, S, D)."""
    import torch

    from fedhmc.algorithms.fahmc import run_round

    theta, out = theta0, []
    for r in range(1, rounds + 1):
        theta, _ = run_round(target, theta, seed, r, settings)
        out.append(theta)
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
    import torch
    from fedhmc_datasets.locate import cache_dir

    from fedhmc.algorithms.fahmc import SamplerSettings
    from fedhmc.analysis.metrics import wasserstein1_marginals
    from fedhmc.experiments.blr import blr_config, blr_reference
    from fedhmc.experiments.blr_t import evaluation_rounds, rounds_to_reach
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
    D = target.dim
    theta0 = torch.zeros(chains, D)
    curves: dict[tuple[str, int], list[tuple[int, float]]] = {}
    walls: dict[tuple[str, int], float] = {}
    from fedhmc.core.progress import bar_or_null

    out_dir = Path(out_dir)
    (out_dir / "cells").mkdir(parents=True, exist_ok=True)
    key = {
        "dim": dim,
        "K": K,
        "eta": eta,
        "noise": noise,
        "chains": chains,
        "iters": iters,
        "seed": seed,
        "reference": [rc, rw, rs],
        "version": 1,
    }
    bar = bar_or_null(2 * len(Ts), "T values", "T")
    for protocol in PROTOCOL_ORDER:
        for T in Ts:
            # One finished (protocol, T) is kept in cells/, so a stopped run resumes there.
            cell = out_dir / "cells" / f"{protocol}_T={T}.json"
            try:
                done = json.loads(cell.read_text())
            except (OSError, ValueError):
                done = None
            if done is not None and done.get("key") == key:
                curves[(protocol, T)] = [tuple(x) for x in done["curve"]]
                walls[(protocol, T)] = done["wall_s"]
                bar.update(1)
                continue
            t0 = time.perf_counter()
            if protocol == "authors":
                s = SamplerSettings(
                    eta,
                    K,
                    T,
                    grad_noise=noise,
                    sync_unit="leapfrog",
                    fresh_gradients=True,
                    restart=True,
                )
                samples = authors_blr_samples(target, s, theta0, seed, iters)
            else:
                s = SamplerSettings(eta, K, T, grad_noise=noise)
                samples = algorithm3_blr_samples(
                    target, s, theta0, seed, max(5, math.ceil(iters / T))
                )
            if not torch.isfinite(samples).all():
                raise ConfigError(f"paper-blr-T diverged ({protocol}, T = {T})")
            curve = []
            for n in evaluation_rounds(samples.shape[0]):
                pooled = samples[:n].reshape(-1, D)
                curve.append((n, float(wasserstein1_marginals(pooled, reference).mean())))
            curves[(protocol, T)] = curve
            walls[(protocol, T)] = time.perf_counter() - t0
            tmp = cell.with_name(cell.name + ".tmp")
            tmp.write_text(json.dumps({"key": key, "curve": curve, "wall_s": walls[(protocol, T)]}))
            os.replace(tmp, cell)
            bar.update(1)
    bar.close()
    rows = []
    # Thresholds shared by both protocols: multiples of the lowest ME any run reached.
    factors = (1.25, 1.5, 2.0, 3.0)
    floor = min(v for c in curves.values() for _, v in c)
    shared = [round(floor * f, 4) for f in factors]
    eps_by = {}
    for protocol in PROTOCOL_ORDER:
        eps_by[protocol] = shared
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
            for i, eps in enumerate(eps_by[protocol]):
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
    summary = {
        "experiment": "paper-blr-T",
        "budget": budget,
        "dim": dim,
        "clients": 20,
        "K": K,
        "step_size": eta,
        "grad_noise": noise,
        "chains": chains,
        "epsilons": eps_by,
        "epsilon_rule": "1.25, 1.5, 2 and 3 × the lowest ME any run reached (either protocol)",
        "rounds": "authors: outer iterations (one sample each) and all-reduces = K × outer "
        "iterations; algorithm3: rounds of T iterations (one sample each)",
        "reference": ref_info,
        "rows": rows,
        "parity": parity,
    }
    write_csv(out_dir / "paper_blr_T.csv", rows)
    write_csv(
        out_dir / "paper_blr_T_curves.csv",
        [
            {"protocol": p, "T": T, "samples": n, "me": v}
            for (p, T), c in curves.items()
            for n, v in c
        ],
    )
    write_csv(out_dir / "paper_blr_T_parity.csv", parity["rows"])
    write_text_atomic(out_dir / "paper_blr_T.json", json.dumps(summary, indent=2) + "\n")
    _plot_blr(out_dir / "paper_blr_T.png", summary, curves, Ts)
    return summary


def blr_parity(cfg: RunConfig, Ts, quick: bool = False) -> dict:
    """Exact gradients, d = 10: the stationary mean of the samples under each protocol,
    against the posterior mean (the MHMC reference's). Chains start at the reference mean;
    the first half of the rounds is discarded."""
    import torch
    from fedhmc_datasets.locate import cache_dir

    from fedhmc.algorithms.fahmc import SamplerSettings
    from fedhmc.experiments.blr import blr_reference
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
            if protocol == "authors":
                s = SamplerSettings(
                    eta, K, T, sync_unit="leapfrog", fresh_gradients=True, restart=True
                )
                x = authors_blr_samples(target, s, theta0, cfg.seed, outer)
            else:
                s = SamplerSettings(eta, K, T)
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

    from fedhmc.viz.plots import new_figure

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
