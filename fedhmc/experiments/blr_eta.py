"""``blr-eta``: simulated BLR, the marginal error of FA-HMC and FA-LD against η (the
paper's Figure 1a, b).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import torch

from fedhmc.algorithms import registry
from fedhmc.experiments._common import ALGORITHM3_AS_PRINTED, _write
from fedhmc.experiments.blr import blr_reference
from fedhmc.viz.plots import new_figure


def _blr_eta(name, out_dir, quick, seed, full, dim, noises) -> dict:
    """The cells (one engine run per algorithm, η and gradient noise) run through
    fedhmc.sweep.cells into ``out_dir/cells/``, resumed when they finished before; each
    row's ME is that of the cell's saved samples against the MHMC reference, and its wall
    time the run's own."""
    from fedhmc.errors import FedHMCError
    from fedhmc.runtime.config import RunConfig
    from fedhmc.sweep.cells import pending_cells, run_cells

    budget = "quick" if quick else "full" if full else "reduced"
    etas = {
        "quick": [0.05, 0.1],
        "reduced": [0.02, 0.05, 0.1],
        "full": [0.002, 0.005, 0.01, 0.02, 0.05, 0.1],
    }[budget]
    rounds, chains = {"quick": (6, 4), "reduced": (20, 8), "full": (200, 8)}[budget]
    base = _blr_eta_base(dim, rounds, chains, seed)
    ref_sizes = {"quick": (4, 100, 50), "reduced": (8, 300, 200), "full": (16, 1000, 1000)}
    rc, rw, rs = ref_sizes[budget]
    from fedhmc_datasets.locate import cache_dir

    reference, ref_info = blr_reference(
        RunConfig.from_mapping(base).resolve(),
        chains=rc,
        warmup=rw,
        samples=rs,
        cache=cache_dir() / "reference",
    )
    cells = _blr_eta_cells(base, etas, noises)
    todo = pending_cells(out_dir, [(cid, s) for cid, s, _ in cells])
    for res in run_cells(out_dir, todo, desc="cells").values():
        if res["status"] == "failed":
            raise FedHMCError(res["error"])
    rows = _blr_eta_rows(out_dir, cells, reference)
    summary = {
        "experiment": name,
        "protocol": ALGORITHM3_AS_PRINTED,
        "budget": budget,
        "dim": dim,
        "clients": 20,
        "T": 10,
        "rounds": rounds,
        "chains": chains,
        "K_rule": "FA-HMC K = floor(pi / (3 eta)) at every eta (the paper tunes K above 0.01)",
        "reference": ref_info,
        "rows": rows,
    }
    file = name.replace("-", "_")
    _write(out_dir, file, rows, summary)
    _plot(out_dir / f"{file}.png", summary)
    return summary


def _blr_eta_base(dim: int, rounds: int, chains: int, seed: int) -> dict:
    """The settings every blr-eta cell shares: the simulated BLR over 20 iid clients, T =
    10, full batch, half the rounds burnt in, the samples saved."""
    return {
        "dataset": "blr-synthetic",
        "dim": dim,
        "num-clients": 20,
        "partition": "iid",
        "local-steps": 10,
        "batch-size": 0,
        "rounds": rounds,
        "burn-in": rounds // 2,
        "chains": chains,
        "seed": seed,
        "save-samples": True,
    }


def _blr_eta_cells(base: dict, etas: list, noises) -> list[tuple[str, dict, dict]]:
    """The cells (cell id, settings, the head of its row): for each gradient noise, η and
    algorithm, FA-HMC at K = ⌊π/(3η)⌋ and FA-LD at its fixed K."""
    cells = []
    for noise in noises:
        for eta in etas:
            for algo in ("fahmc", "fald"):
                fixed = registry.entry(algo).fixed_value("leapfrog_steps")  # FA-LD: K = 1
                K = max(1, math.floor(math.pi / (3 * eta))) if fixed is None else fixed
                settings = {**base, "algorithm": algo, "step-size": eta, "grad-noise": noise}
                if fixed is None:
                    settings["leapfrog-steps"] = K
                head = {"algorithm": algo, "grad_noise": noise, "step_size": eta}
                head["leapfrog_steps"] = K
                cells.append((f"{algo}-eta{eta:g}-noise{noise:g}", settings, head))
    return cells


def _blr_eta_rows(out_dir: Path, cells: list, reference) -> list[dict]:
    """One row per finished cell: its head, the ME of its saved samples against the
    reference, its final accuracy and NLL, and its wall time."""
    import numpy as np

    from fedhmc.analysis.metrics import marginal_error
    from fedhmc.sweep.table import read_csv

    rows = []
    for cid, _, head in cells:
        cell = out_dir / "cells" / cid
        samples = torch.as_tensor(np.load(cell / "samples.npy"))
        final = read_csv(cell / "metrics.csv")[-1]
        rows.append(
            {
                **head,
                "me": marginal_error(samples.reshape(-1, samples.shape[-1]), reference),
                "accuracy": final.get("accuracy"),
                "nll_mean": final.get("nll_mean"),
                "wall_s": json.loads((cell / "summary.json").read_text())["wall_s"],
            }
        )
    return rows


def _plot(path: Path, summary: dict) -> None:
    """The figure from the summary (``blr_eta.json``, ``blr_d10.json``): the ME of FA-HMC
    and FA-LD against η, one panel per gradient noise level, η's ticks at the values run."""
    rows, dim = summary["rows"], summary["dim"]
    noises = list(dict.fromkeys(r["grad_noise"] for r in rows))
    etas = sorted({r["step_size"] for r in rows})
    fig = new_figure(4.0 * len(noises), 3.4)
    axes = fig.subplots(1, len(noises), squeeze=False)[0]
    for ax, noise in zip(axes, noises, strict=True):
        for algo, label in (("fahmc", "FA-HMC"), ("fald", "FA-LD")):
            sel = [r for r in rows if r["algorithm"] == algo and r["grad_noise"] == noise]
            ax.plot([r["step_size"] for r in sel], [r["me"] for r in sel], "o-", label=label)
        ax.set_xscale("log")
        ax.set_xticks(etas, [f"{e:g}" for e in etas])
        ax.minorticks_off()
        ax.set_xlabel("step size η")
        ax.set_ylabel("marginal error (ME)")
        grads = "exact" if noise == 0 else r"$\sigma_g$ = " + f"{noise:g}"
        ax.set_title(f"d = {dim}, {grads} gradients", fontsize=9)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def blr_eta(out_dir: Path, *, quick: bool = False, seed: int = 0, full: bool = False) -> dict:
    """FA-HMC (K = ⌊π/(3η)⌋) against FA-LD over η on the simulated BLR (the paper's
    Figure 1a, b): d = 1000, n = 1000 over 20 clients, T = 10, exact gradients and gradients
    + N(0, 100) noise. The marginal error is against Metropolis-adjusted HMC draws on the
    pooled data (cached). Reduced default: η ∈ {0.02, 0.05, 0.1}, 20 rounds, 8 chains, the
    samples of the last 10 rounds; ``--full``: η from 0.002, 200 rounds."""
    return _blr_eta("blr-eta", out_dir, quick, seed, full, 20 if quick else 1000, (0.0, 10.0))
