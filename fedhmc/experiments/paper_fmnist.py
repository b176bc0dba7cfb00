"""``paper-fmnist-*``: the paper's Fashion-MNIST figures under both protocols: tune η, run
seeds, tabulate against the paper.

``fedhmc experiment paper-fmnist-K`` (and its siblings, see FIGURES) runs one figure
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
stops when the best η's two grid neighbours are both worse (tune_eta); the lowest final
NLL wins. Then every setting runs ``seeds`` seeds at the chosen η and the table reports
mean ± sd of the final BMA metrics (sd "—" for a single seed).

Stages run in this order, each cell in its own folder under ``cells/`` (run by
fedhmc.sweep.cells, the one cell runner), resumed when it completed before: tune
(authors), seeds (authors), tune (algorithm3), seeds (algorithm3). The tables are rewritten
after every stage, so a stopped run leaves valid partial tables.

η is tuned at ``tune_rounds`` and then run for ``rounds``, so the tuned η is the one the
shorter budget prefers. ``neighbour_eta`` (``--neighbour-eta``) checks what the full budget
prefers: after the authors' seeds it runs the best authors row (lowest mean NLL sum) again
at the next smaller grid η, with the same seeds and rounds, in cells
``authors_<axis>=<value>_eta=<η>_seed=<seed>``; the tables show that row beside the tuned
one (marked †).
"""

from __future__ import annotations

import contextlib
import csv
import json
import math
import os
import time
from dataclasses import dataclass, replace
from pathlib import Path

from fedhmc.experiments._common import METRICS, PROTOCOL_ORDER, write_csv
from fedhmc.experiments._common import PAPER_FMNIST as PAPER_FMNIST_200
from fedhmc.runtime.output import mark_folder, write_text_atomic
from fedhmc.sweep.cells import FolderLock, pending_cells, run_cells
from fedhmc.sweep.table import format_mean_std, mean_std

AUTHORS_GRID = (5e-4, 2e-4, 1e-4, 5e-5, 2e-5, 1e-5, 5e-6, 2e-6, 1e-6, 5e-7, 2e-7)
"""The step sizes the authors' tuning script tries (temperature 0.005)."""
ALGORITHM3_GRID = tuple(10 * e for e in AUTHORS_GRID)
"""The same ladder one decade up, for the untempered posterior of ``--protocol algorithm3``."""
PAPER_FMNIST_K = {**PAPER_FMNIST_200, "runs": 5}
"""The best values of the paper's Figure 3 (the K sweep), and its runs per setting."""
PAPER_FMNIST_T = {"accuracy": 0.846, "brier": 0.219, "ece": 0.0082, "nll_sum": 4332.0, "runs": 5}
"""The best values of the paper's Figure 4 (the T sweep), and its runs per setting."""
PAPER_MLP = {"accuracy": 0.899, "brier": 0.146, "ece": 0.006, "runs": 1, "source": "axes"}
"""The best values of the paper's Figure 5 (a–c), the MLP against K, as far as they can be
read off its axes (the paper gives no table, and no NLL panel); one chain per setting."""


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
    paper=PAPER_FMNIST_K,
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
    neighbour_eta: bool = False,
) -> dict:
    """Run figure ``name`` of FIGURES under both protocols into ``out_dir``.

    ``seed`` offsets the seeds (seed, seed + 1, …). With ``neighbour_eta`` the best authors
    row is also run at the next smaller grid η (neighbour_cells). Returns the summary (also
    written as ``<name>.json``, with ``<name>.csv``, ``<name>_curves.csv``, ``<name>.md``
    and plots).
    """
    budget = "quick" if quick else "full" if full else "reduced"
    fig = budget_figure(FIGURES[name], budget)
    out_dir = Path(out_dir)
    # `fedhmc experiment` holds the folder's lock already; a call from Python takes it here.
    held = FolderLock.held(out_dir)
    lock = contextlib.nullcontext() if held else FolderLock(out_dir, "an experiment")
    with lock:
        mark_folder(out_dir)
        (out_dir / "cells").mkdir(parents=True, exist_ok=True)
        return _paper_figure(name, out_dir, fig, budget, seed, workers, protocols, neighbour_eta)


def _paper_figure(name, out_dir, fig, budget, seed, workers, protocols, neighbour_eta) -> dict:
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
        if neighbour_eta and protocol == "authors":
            extra = neighbour_cells(fig, summary, seed)
            _run_missing(out_dir, extra, workers, f"{protocol}: seeds at the neighbouring η")
            summary = write_tables(name, out_dir, fig, budget, seed)
    summary["wall_s_this_call"] = time.perf_counter() - t0
    return summary


def smaller_neighbour(grid: tuple[float, ...], eta: float) -> float | None:
    """The next smaller η of ``grid`` than ``eta`` (None at the grid's bottom)."""
    below = [e for e in grid if e < eta * (1 - 1e-9)]
    return max(below) if below else None


def _tuned(summary: dict, row: dict) -> bool:
    """Whether a table row is at its setting's tuned η (not a neighbour_cells row)."""
    axis = summary["figure"]["axis"]
    sel = summary.get("tuning", {}).get(f"{row['protocol']} {axis}={row[axis]}")
    return sel is None or row["eta"] == sel["eta"]


def neighbour_cells(
    fig: Figure, summary: dict, seed: int = 0, protocol: str = "authors"
) -> list[tuple[str, dict]]:
    """The cells that run the best ``protocol`` row of the tables ``summary`` (write_tables;
    the lowest mean NLL sum among the tuned-η rows with every seed done) at the next
    smaller grid η: the same seeds and rounds, cell ids
    ``<protocol>_<axis>=<value>_eta=<η>_seed=<seed>``. Empty when no row has all its seeds,
    or the tuned η is the grid's smallest."""
    full = [
        r
        for r in summary["rows"]
        if r["protocol"] == protocol
        and r["seeds"] + r["diverged_seeds"] >= fig.seeds
        and _tuned(summary, r)
    ]
    if not full:
        return []
    best = min(full, key=lambda r: r["nll_sum"])
    eta = smaller_neighbour(fig.grid(protocol), best["eta"])
    if eta is None:
        return []
    v = best[fig.axis]
    return [
        (
            _cell_id(protocol, fig.axis, v, eta, seed + i),
            cell_settings(fig, protocol, v, eta, seed + i, fig.rounds),
        )
        for i in range(fig.seeds)
    ]


def _seed_cells(out_dir: Path, fig: Figure, protocol: str, v: int, sel: dict, seed: int):
    """(η, cell ids of the seeds) of each row of one setting: the tuned η's seed cells,
    then those of any other grid η run at the full budget (neighbour_cells) found in
    ``out_dir/cells``."""
    yield sel["eta"], [_cell_id(protocol, fig.axis, v, None, seed + i) for i in range(fig.seeds)]
    for eta in sorted(fig.grid(protocol), reverse=True):
        if eta == sel["eta"]:
            continue
        cids = [_cell_id(protocol, fig.axis, v, eta, seed + i) for i in range(fig.seeds)]
        if any((out_dir / "cells" / c).is_dir() for c in cids):
            yield eta, cids


def _row(out_dir, fig, setting: tuple, at_eta: tuple, sel, seed, curves) -> dict | None:
    """The table row of one ``setting`` (protocol, value of the figure's axis) at one η
    from its seed cells (``at_eta`` = (η, cell ids), as _seed_cells gives them; None when
    none has completed); the tuned η's cells also add their curves to ``curves``."""
    (protocol, v), (eta, cids) = setting, at_eta
    finals, by_seed, diverged = [], [], 0
    for i, cid in enumerate(cids):
        s = _read_cell(out_dir / "cells" / cid)
        if s is not None and s.get("status") == "diverged":
            diverged += 1  # a result: reported beside the mean of the others
        if s is None or s.get("status") != "completed":
            continue
        finals.append(s["final"])
        cur = _curve(out_dir / "cells" / cid)
        by_seed.append(cur)
        if eta != sel["eta"]:
            continue  # curves and plots: the tuned η only
        for r in cur:
            curves.append(
                {
                    "protocol": protocol,
                    fig.axis: v,
                    "seed": seed + i,
                    **{k: r[k] for k in ("round", "grad_evals", "samples", *METRICS) if k in r},
                }
            )
    if not finals:
        return None
    K, T = fig.KT(v)
    settings = cell_settings(fig, protocol, v, eta, seed, fig.rounds)
    grid = fig.grid(protocol)
    row = {
        "protocol": protocol,
        fig.axis: v,
        "K": K,
        "T": T,
        "local_steps": settings["local-steps"],
        "local_steps_unit": "leapfrog steps" if protocol == "authors" else "iterations",
        "rounds": settings["rounds"],
        "eta": eta,
        "eta_at_grid_edge": sel["at_grid_edge"]
        if eta == sel["eta"]
        else eta in (max(grid), min(grid)),
        "seeds": len(finals),
        "diverged_seeds": diverged,
        "grad_evals": by_seed[0][-1]["grad_evals"],
    }
    for m in METRICS:
        mean, sd = mean_std([f[m] for f in finals])
        row[m] = mean
        row[f"{m}_sd"] = sd
    row["ece_bins"] = int(by_seed[0][-1].get("ece_bins", 15))
    return row


def write_tables(name: str, out_dir: Path, fig: Figure, budget: str, seed: int = 0) -> dict:
    """Tables, curves and plots from whatever cells have completed (partial is fine)."""
    rows, curves, tuning = [], [], {}
    for protocol in PROTOCOL_ORDER:
        for v in fig.values:
            sel = select_eta(out_dir, fig, protocol, v)
            tuning[f"{protocol} {fig.axis}={v}"] = sel
            for at_eta in _seed_cells(out_dir, fig, protocol, v, sel, seed):
                row = _row(out_dir, fig, (protocol, v), at_eta, sel, seed, curves)
                if row is not None:
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
    neighbours = False
    for r in summary["rows"]:
        edge = "*" if r["eta_at_grid_edge"] else ""
        if not _tuned(summary, r):
            edge += "†"
            neighbours = True
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
    if neighbours:
        lines += [
            "† not the tuned η: the next smaller grid η, run for the best row at the full "
            "budget with the same seeds (--neighbour-eta), to see which η the "
            f"{summary['figure']['rounds']} rounds prefer.",
            "",
        ]
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
