"""What the experiment presets share: writing tables, figures, running cells of a data
experiment and the paper's reference numbers.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from fedhmc.viz.plots import new_figure


def write_csv(path: Path, rows: list[dict]) -> None:
    """``rows`` as a CSV table, every key of any row a column (in the order first seen),
    written atomically by fedhmc.runtime.output.write_csv_atomic, the one CSV writer."""
    from fedhmc.runtime.output import write_csv_atomic

    write_csv_atomic(path, rows, list(dict.fromkeys(k for r in rows for k in r)))


def _write(out_dir: Path, name: str, rows: list[dict], summary: dict) -> None:
    from fedhmc.runtime.output import write_text_atomic

    out_dir.mkdir(parents=True, exist_ok=True)
    write_csv(out_dir / f"{name}.csv", rows)
    write_text_atomic(out_dir / f"{name}.json", json.dumps(summary, indent=2) + "\n")


PAPER_FMNIST = {"accuracy": 0.847, "brier": 0.219, "ece": 0.008, "nll_sum": 4332.0}
"""The paper's Fashion-MNIST logistic-regression results after 200 rounds (best settings)."""

METRICS = ("accuracy", "brier", "ece", "nll_sum")
"""The paper's Fashion-MNIST metrics, in the tables' and figures' order."""

PROTOCOL_ORDER = ("authors", "algorithm3")
"""The two protocols the ``paper-*`` experiments run side by side, in the tables' order."""


def run_experiment_cells(out_dir: Path, base: dict, cells: list[dict]) -> list[dict]:
    """Run each cell (``base`` updated by the cell) into ``out_dir/cells/`` through
    fedhmc.sweep.cells, one after another in this process.

    A cell finished before with the same settings is read back instead of rerun, so an
    interrupted experiment resumes where it stopped; a cell that fails stops the
    experiment with its error. Returns the tidy rows: one per (cell, round), with the
    cell's settings and the round's metrics (from the cell's ``metrics.csv``).
    """
    from fedhmc.errors import FedHMCError
    from fedhmc.sweep.cells import pending_cells
    from fedhmc.sweep.cells import run_cells as run
    from fedhmc.sweep.table import read_csv

    named = [("_".join(f"{k}={v}" for k, v in cell.items()), {**base, **cell}) for cell in cells]
    for res in run(out_dir, pending_cells(out_dir, named)).values():
        if res["status"] == "failed":
            raise FedHMCError(res["error"])
    rows: list[dict] = []
    for cell, (cid, _) in zip(cells, named, strict=True):
        rows += [{**cell, **h} for h in read_csv(out_dir / "cells" / cid / "metrics.csv")]
    return rows


def _metric_panels(rows: list[dict], hue: str, title: str, path: Path, paper: dict | None):
    metrics = [m for m in ("accuracy", "brier", "ece", "nll_sum") if m in rows[0]]
    fig = new_figure(3.2 * len(metrics), 3.2)
    axes = fig.subplots(1, len(metrics))
    values = sorted({r[hue] for r in rows})
    for ax, m in zip(axes, metrics, strict=True):
        for v in values:
            sel = [r for r in rows if r[hue] == v]
            ax.plot([r["round"] for r in sel], [r[m] for r in sel], label=f"{hue} = {v}")
        if paper and m in paper:
            ax.axhline(paper[m], color="k", ls="--", lw=0.8, label="paper, 200 rounds")
        ax.set_xlabel("communication round")
        ax.set_title(m, fontsize=10)
        if m == "nll_sum":
            ax.set_yscale("log")
    axes[0].legend(fontsize=7)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path.with_suffix(".png"), dpi=120)
    fig.savefig(path.with_suffix(".pdf"))


def summary_table_rows(rows: list[dict], hue: str) -> list[dict]:
    """A data experiment's summary table: the last round of each cell (``hue`` its
    setting), with the round's metrics and wall time."""
    last = max(r["round"] for r in rows)
    final = [r for r in rows if r["round"] == last]
    keep = (hue, "round", "accuracy", "brier", "ece", "nll_mean", "nll_sum", "wall_s")
    return [{k: r[k] for k in keep if k in r} for r in final]


@dataclasses.dataclass(frozen=True)
class DataExperiment:
    """A data experiment's preset: its ``name``, the ``base`` settings of every cell, the
    setting ``hue`` the cells vary and its ``values``, the ``budget`` (quick, reduced,
    full), the paper's numbers to draw beside (or None), the figure's ``title`` and the
    summary's ``note``."""

    name: str
    base: dict
    hue: str
    values: list
    budget: str
    paper: dict | None
    title: str
    note: str


def _data_experiment(out_dir: Path, spec: DataExperiment) -> dict:
    hue = spec.hue
    cells = [{hue: v} for v in spec.values]
    rows = run_experiment_cells(out_dir, spec.base, cells)
    file = spec.name.replace("-", "_")
    _write(out_dir, file, rows, {})
    table = summary_table_rows(rows, hue)
    summary = {
        "experiment": spec.name,
        "protocol": ALGORITHM3_AS_PRINTED,
        "budget": spec.budget,
        "base": spec.base,
        "note": spec.note,
        "paper_200_rounds": spec.paper,
        "rows": table,
    }
    from fedhmc.runtime.output import write_text_atomic

    write_text_atomic(out_dir / f"{file}.json", json.dumps(summary, indent=2) + "\n")
    _metric_panels(rows, hue, spec.title, out_dir / file, spec.paper)
    return summary


ALGORITHM3_AS_PRINTED = "algorithm3: the paper's Algorithm 3 as printed (--protocol algorithm3)"
"""What the FA-HMC experiments that are not ``paper-*`` run; their summaries say so."""
