"""``samplers``: every federated sampler of the registry on three tasks, at equal budgets of
gradient evaluations.

The samplers: FA-HMC (``fahmc``), FA-LD (``fald``), debiased FA-HMC (``fahmc-debiased``),
QLSD, QLSD* and QLSD++ (``qlsd``, ``qlsd-star``, ``qlsd-pp``), FSGLD (``fsgld``) and DG-LMC
(``dglmc``). The tasks:

1. ``gaussian``: the heterogeneous Gaussian (``--dataset gaussian-hetero``, d = 10, 10
   clients), the W₂ distance of the chains' law at a round to the exact posterior (the
   ``w2`` column);
2. ``blr``: simulated Bayesian logistic regression (``--dataset blr-synthetic``, 20 iid
   clients, full-batch gradients), the marginal error (ME, as blr-eta) of the chains'
   θ̄ at a round against Metropolis-adjusted HMC draws of the same seed's posterior
   (fedhmc.experiments.blr.blr_reference, cached);
3. ``fmnist``: Fashion-MNIST logistic regression on the paper's split (10 iid clients,
   batch 1,000), accuracy, Brier score, ECE and NLL of the model average; skipped, and
   said so in the summary, where the data is absent.

**Equal budgets.** Each task has a budget G of client-gradient evaluations per chain (the
``grad_evals`` column divided by the chains); each sampler runs as many rounds as its cost
per round allows (cost_per_round: ``rounds = ⌊(G − set-up) / evaluations a round⌋``).

**The tuning rule** (TUNING_RULE): on the tuning seed, every point of the sampler's grid
(step sizes × its own setting) runs at the full budget; the point with the lowest final
W₂, ME or NLL (the ``nll_sum`` column) is kept, a diverged run never. The kept point then
runs on the five report seeds, and the tables give mean ± standard error over them.

Everything runs through fedhmc.sweep.cells into ``out_dir/cells/``, resumed where it
stopped. ``replot_samplers(out_dir)`` writes the tables and figures again from the cells
(or, where the cells are gone, from ``samplers_curves.csv`` and ``samplers.json``):
``python tools/replot_results.py samplers``.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
from pathlib import Path

from fedhmc.experiments._common import write_csv

SAMPLERS = ("fahmc", "fald", "fahmc-debiased", "qlsd", "qlsd-star", "qlsd-pp", "fsgld", "dglmc")
LABELS = {
    "fahmc": "FA-HMC",
    "fald": "FA-LD",
    "fahmc-debiased": "FA-HMC debiased",
    "qlsd": "QLSD",
    "qlsd-star": "QLSD*",
    "qlsd-pp": "QLSD++",
    "fsgld": "FSGLD",
    "dglmc": "DG-LMC",
}
TASKS = ("gaussian", "blr", "fmnist")
METRIC_NAMES = {
    "w2": "W₂ to the posterior",
    "me": "marginal error (ME)",
    "accuracy": "accuracy",
    "brier": "Brier score",
    "ece": "ECE",
    "nll_sum": "NLL (sum over the test set)",
}
TUNING_RULE = (
    "on the tuning seed, every point of the sampler's grid (step sizes × its own setting) "
    "runs at the task's budget of gradient evaluations; the point with the lowest final "
    "tuning metric (W₂, ME, or the test NLL) wins, a diverged run never; the winner then "
    "runs on the report seeds"
)
QUANTIZATION_LEVELS = 16
"""s of QLSD, QLSD* and QLSD++: fixed, not tuned (every metric prefers s = ∞, no
compression); 16 levels send 1 + ⌈log₂ 17⌉ = 6 bits a coordinate and one float."""
LOCAL_STEPS = {"quick": 2, "reduced": 10, "full": 10}
"""T (FA-HMC, FA-LD, debiased FA-HMC, FSGLD) and L (DG-LMC): fixed at every budget."""

# Each sampler's step-size ladder per task (five values: the full budget tunes over all,
# the reduced over the middle three, the quick over the middle one) and its own setting:
# (run option, values per task; the full budget tunes over all, the others take the first).
STEPS = {
    "gaussian": {
        "fahmc": (0.05, 0.1, 0.2, 0.4, 0.8),
        "fald": (0.1, 0.2, 0.4, 0.8, 1.2),
        "fahmc-debiased": (0.05, 0.1, 0.2, 0.4, 0.8),
        "qlsd": (0.01, 0.03, 0.1, 0.3, 1.0),
        "qlsd-star": (0.01, 0.03, 0.1, 0.3, 1.0),
        "qlsd-pp": (0.01, 0.03, 0.1, 0.3, 1.0),
        "fsgld": (0.01, 0.03, 0.1, 0.3, 1.0),
        "dglmc": (0.02, 0.05, 0.1, 0.2, 0.5),  # γ / ρ
    },
    "blr": {
        "fahmc": (0.0125, 0.025, 0.05, 0.1, 0.2),
        "fald": (0.025, 0.05, 0.1, 0.2, 0.4),
        "fahmc-debiased": (0.0125, 0.025, 0.05, 0.1, 0.2),
        "qlsd": (1e-3, 3e-3, 0.01, 0.03, 0.1),
        "qlsd-star": (1e-3, 3e-3, 0.01, 0.03, 0.1),
        "qlsd-pp": (1e-3, 3e-3, 0.01, 0.03, 0.1),
        "fsgld": (3e-5, 1e-4, 3e-4, 1e-3, 3e-3),
        "dglmc": (0.02, 0.05, 0.1, 0.2, 0.5),  # γ / ρ
    },
    "fmnist": {
        "fahmc": (2.5e-4, 5e-4, 1e-3, 2e-3, 4e-3),
        "fald": (5e-4, 1e-3, 2e-3, 4e-3, 8e-3),
        "fahmc-debiased": (2.5e-4, 5e-4, 1e-3, 2e-3, 4e-3),
        "qlsd": (2.5e-7, 5e-7, 1e-6, 2e-6, 4e-6),
        "qlsd-star": (2.5e-7, 5e-7, 1e-6, 2e-6, 4e-6),
        "qlsd-pp": (2.5e-7, 5e-7, 1e-6, 2e-6, 4e-6),
        "fsgld": (2.5e-7, 5e-7, 1e-6, 2e-6, 4e-6),
        "dglmc": (0.02, 0.05, 0.1, 0.2, 0.5),  # γ / ρ
    },
}
OWN = {
    "fahmc": ("leapfrog-steps", {"gaussian": (5, 10), "blr": (5, 10), "fmnist": (5, 10)}),
    "fahmc-debiased": ("leapfrog-steps", {"gaussian": (5, 10), "blr": (5, 10), "fmnist": (5, 10)}),
    "qlsd-pp": ("reference-refresh", {"gaussian": (10, 50), "blr": (10, 50), "fmnist": (10, 50)}),
    "fsgld": ("surrogate-steps", {"gaussian": (400, 100), "blr": (400, 100), "fmnist": (50, 20)}),
    "dglmc": ("coupling", {"gaussian": (1.0, 0.1), "blr": (0.1, 0.01), "fmnist": (1e-4, 1e-3)}),
}  # fmt: skip


@dataclasses.dataclass(frozen=True)
class Task:
    """One task at one budget: its ``name``, figure ``title``, the run settings all its
    cells share (``base``), the budget ``evals`` per chain, the metrics (the first is the
    tuning metric), the report ``seeds`` and the grids' ``budget`` name."""

    name: str
    title: str
    base: dict
    evals: int
    metrics: tuple[str, ...]
    seeds: int
    budget: str
    reference: tuple[int, int, int] | None = None

    @property
    def clients(self) -> int:
        return int(self.base["num-clients"])

    @property
    def chains(self) -> int:
        return int(self.base["chains"])


BUDGETS = {
    # task: budget → (evals per chain, report seeds, task-specific sizes)
    "gaussian": {"quick": (400, 2, 20), "reduced": (10_000, 5, 100), "full": (40_000, 5, 200)},
    "blr": {
        "quick": (400, 2, (5, 8, (4, 100, 50))),
        "reduced": (12_000, 5, (20, 32, (8, 300, 200))),
        "full": (40_000, 5, (100, 64, (16, 1000, 1000))),
    },
    "fmnist": {"quick": (220, 2, 100), "reduced": (2_200, 5, 1000), "full": (22_000, 5, 1000)},
}


def task_spec(name: str, budget: str) -> Task:
    """The task ``name`` at ``budget`` (quick, reduced, full)."""
    evals, seeds, size = BUDGETS[name][budget]
    if name == "gaussian":
        base = {"dataset": "gaussian-hetero", "dim": 10, "num-clients": 10, "chains": size}
        title = f"heterogeneous Gaussian, d = 10, 10 clients, {size} chains"
        return Task(name, title, {**base, "burn-in": 0}, evals, ("w2",), seeds, budget)
    if name == "blr":
        dim, chains, ref = size
        base = {"dataset": "blr-synthetic", "dim": dim, "num-clients": 20, "partition": "iid"}
        base.update({"batch-size": 0, "chains": chains})
        title = f"simulated BLR, d = {dim}, 20 iid clients, {chains} chains"
        return Task(name, title, base, evals, ("me",), seeds, budget, ref)
    base = {"dataset": "fashion-mnist", "model": "logistic", "num-clients": 10}
    base.update({"partition": "iid", "batch-size": size, "chains": 1})
    title = f"Fashion-MNIST logistic regression, 10 iid clients, B = {size}"
    metrics = ("nll_sum", "accuracy", "brier", "ece")
    return Task(name, title, base, evals, metrics, seeds, budget)


# ---------------------------------------------------------------------------------------
# What a round costs


def quantized_bits(dim: int, float_bits: int = 32) -> int:
    """Bits of one vector sent by QLSD's quantiser at QUANTIZATION_LEVELS levels
    (fedhmc.core.quantize.bits): the norm as one float, then a sign and a level a
    coordinate."""
    from fedhmc.core.quantize import bits

    return bits(QUANTIZATION_LEVELS, dim, float_bits)


def cost_per_round(sampler: str, settings: dict, clients: int, dim: int) -> dict:
    """Per chain: the client-gradient evaluations and the bits (float32) of one round
    (``evals``, ``bits_down``, ``bits_up``) and of the set-up (``setup_evals``,
    ``setup_bits``), from the cell's ``settings``; QLSD++'s reference gradients (N every l
    rounds) are spread over the rounds, DG-LMC's θ₀ sent in round 1 is left out."""
    N, f = clients, 32
    T = settings.get("local-steps", 0)
    K = 1 if sampler == "fald" else settings.get("leapfrog-steps", 0)
    vec = dim * f
    out = {"evals": 0.0, "bits_down": N * vec, "bits_up": N * vec, "setup_evals": 0}
    out["setup_bits"] = 0
    if sampler in ("fahmc", "fald"):
        out["evals"] = N * T * (K + 1)
    elif sampler == "fahmc-debiased":
        out.update(evals=N * (T * (K + 1) + 1), bits_down=3 * N * vec, bits_up=2 * N * vec)
    elif sampler.startswith("qlsd"):
        out.update(evals=N, bits_up=N * quantized_bits(dim))
        if sampler != "qlsd":
            out.update(evals=2 * N, bits_down=2 * N * vec)
        if sampler == "qlsd-star":  # its set-up: θ down and ∇U_c(θ) up, each round
            rounds = settings.get("mode-steps", 0) + 1
            out.update(setup_evals=N * rounds, setup_bits=2 * N * vec * rounds)
        if sampler == "qlsd-pp":
            out.update(evals=2 * N + N / settings["reference-refresh"], setup_evals=0)
    elif sampler == "fsgld":
        out.update(evals=T, bits_down=3 * vec, bits_up=vec)
        out.update(setup_evals=N * settings["surrogate-steps"], setup_bits=3 * N * vec)
    elif sampler == "dglmc":
        out["evals"] = N * T
    return out


def rounds_for(sampler: str, settings: dict, task: Task) -> int:
    """The rounds that spend the task's budget: ⌊(G − set-up) / evaluations a round⌋."""
    c = cost_per_round(sampler, settings, task.clients, 1)
    return max(1, int((task.evals - c["setup_evals"]) // c["evals"]))


# ---------------------------------------------------------------------------------------
# Cells


def grid(task: Task, sampler: str) -> list[tuple[float, object]]:
    """(step size, own setting or None) points that ``task``'s budget tunes over: the
    ladder's middle one (quick), three (reduced) or all five (full), times the sampler's
    own setting's first value (all of them at the full budget). DG-LMC's ladder is of
    γ / ρ; FSGLD's surrogate steps are those whose fits spend at most half the budget."""
    ladder = STEPS[task.name][sampler]
    steps = {"quick": ladder[2:3], "reduced": ladder[1:4], "full": ladder}[task.budget]
    own = OWN.get(sampler, (None, {task.name: (None,)}))[1][task.name]
    if sampler == "fsgld":  # the surrogate fits may spend at most half the budget
        cap = task.evals // (2 * task.clients)
        own = tuple(o for o in own if o <= cap) or (cap,)
    own = own if task.budget == "full" else own[:1]
    if sampler == "dglmc":  # its ladder is γ / ρ (γ < 2ρ, else the clients diverge)
        return [(round(f * o, 12), o) for o in own for f in steps]
    return [(s, o) for o in own for s in steps]


def sampler_cell_settings(task: Task, sampler: str, step: float, own, seed: int) -> dict:
    """The ``fedhmc run`` settings of one cell (kebab-case keys), its rounds spending the
    task's budget."""
    s = {**task.base, "algorithm": sampler, "step-size": step, "seed": seed}
    if sampler in ("fahmc", "fald", "fahmc-debiased", "fsgld", "dglmc"):
        s["local-steps"] = LOCAL_STEPS[task.budget]
    if sampler.startswith("qlsd"):
        s["quantization-levels"] = float(QUANTIZATION_LEVELS)
    if sampler in OWN:
        s[OWN[sampler][0]] = own
    s["rounds"] = rounds_for(sampler, s, task)
    if task.name == "blr":  # θ̄ saved at about 40 rounds, the last among them
        thin = max(1, s["rounds"] // 40)
        s.update({"save-samples": True, "thin": thin, "burn-in": s["rounds"] % thin})
    return s


def sampler_cell_id(task: Task, sampler: str, step: float, own, seed: int) -> str:
    own_part = "" if sampler not in OWN else f"_{OWN[sampler][0]}={own:g}"
    return f"{task.name}_{sampler}{own_part}_step={step:g}_seed={seed}"


def _run(
    out_dir: Path, task: Task, cells: list[tuple[str, dict]], desc: str, workers: int = 1
) -> None:
    """Run the cells not finished before, in ``workers`` processes (one torch thread
    each where there are several); a failed one stops the experiment with its error.
    BLR's cells get their ME curve (``me.csv``) from their saved samples."""
    from fedhmc.errors import FedHMCError
    from fedhmc.sweep.cells import pending_cells, run_cells

    todo = pending_cells(out_dir, cells)
    threads = 1 if workers > 1 else None
    for res in run_cells(out_dir, todo, workers=workers, threads=threads, desc=desc).values():
        if res["status"] == "failed":
            raise FedHMCError(res["error"])
    if task.name == "blr":
        for cid, settings in cells:
            blr_me_curve(out_dir / "cells" / cid, settings, task)


def blr_reference_draws(settings: dict, task: Task):
    """The MHMC reference draws of the posterior of the cell's seed (its data), cached."""
    from fedhmc_datasets.locate import cache_dir

    from fedhmc.experiments.blr import blr_reference
    from fedhmc.runtime.config import RunConfig
    from fedhmc.runtime.threads import apply_threads, gradient_work, threads_restored

    chains, warmup, samples = task.reference
    cfg = RunConfig.from_mapping(settings).resolve()
    with threads_restored():  # as a run's: one thread for a small gradient (auto)
        apply_threads(None, gradient_work(1, chains, 1000, int(settings["dim"])))
        draws, _ = blr_reference(
            cfg, chains=chains, warmup=warmup, samples=samples, cache=cache_dir() / "reference"
        )
    return draws


def blr_me_curve(cell: Path, settings: dict, task: Task) -> None:
    """``me.csv`` of a BLR cell: at each round θ̄ was saved, the ME of the chains' θ̄
    against the reference draws (inf where a value is not finite); the samples are then
    deleted (they are large, and the curve is what the tables and figures read)."""
    import numpy as np
    import torch

    from fedhmc.analysis.metrics import marginal_error

    samples_file, me_file = cell / "samples.npy", cell / "me.csv"
    if me_file.exists() and not samples_file.exists():
        return
    rows = []
    if samples_file.exists():
        reference = blr_reference_draws(settings, task)
        samples = torch.as_tensor(np.load(samples_file), device="cpu").to(reference.dtype)
        thin, burn = settings["thin"], settings["burn-in"]
        finite = torch.isfinite(samples).flatten(1).all(1)
        me = torch.full((samples.shape[0],), math.inf, dtype=torch.float64, device=samples.device)
        if bool(finite.any()):  # every saved round's ME at once (the reference sorted once)
            me[finite] = torch.atleast_1d(marginal_error(samples[finite], reference))
        rows = [{"round": burn + thin * (i + 1), "me": float(m)} for i, m in enumerate(me)]
    write_csv(me_file, rows or [{"round": 0, "me": math.inf}])
    samples_file.unlink(missing_ok=True)


# ---------------------------------------------------------------------------------------
# Reading the cells


def cell_curve(cell: Path, task: Task) -> list[dict]:
    """Per round of a cell: ``round``, ``evals`` and cumulative ``bits`` per chain (down
    and up, the set-up's included; ``bits_up`` where the replies are compressed, else
    8 × ``bytes_up``) and the task's metrics (BLR's ME at the rounds θ̄ was saved)."""
    from fedhmc.sweep.table import read_csv

    rows = read_csv(cell / "metrics.csv") if (cell / "metrics.csv").exists() else []
    summary = json.loads((cell / "summary.json").read_text())
    bits = 8 * ((summary.get("setup_bytes_down") or 0) + (summary.get("setup_bytes_up") or 0))
    me = {}
    if task.name == "blr" and (cell / "me.csv").exists():
        me = {int(r["round"]): float(r["me"]) for r in read_csv(cell / "me.csv")}
    out = []
    for r in rows:
        up = r.get("bits_up")
        bits += 8 * float(r["bytes_down"]) + (
            float(up) if up not in (None, "") else 8 * float(r["bytes_up"])
        )
        row = {"round": int(r["round"]), "evals": float(r["grad_evals"]) / task.chains}
        row["bits"] = bits / task.chains
        for m in task.metrics:
            value = me.get(int(r["round"])) if m == "me" else r.get(m)
            row[m] = None if value in (None, "") else float(value)
        out.append(row)
    return out


def final_value(cell: Path, task: Task, metric: str) -> float:
    """The cell's final ``metric`` (inf where it diverged or has none): the tuning rule's
    score. Read from ``summary.json`` (BLR: the last row of ``me.csv``)."""
    from fedhmc.sweep.table import read_csv

    try:
        summary = json.loads((cell / "summary.json").read_text())
    except (OSError, ValueError):
        return math.inf
    if summary.get("status") != "completed":
        return math.inf
    if metric == "me":
        rows = read_csv(cell / "me.csv") if (cell / "me.csv").exists() else []
        value = rows[-1]["me"] if rows else None
    else:
        value = (summary.get("final") or {}).get(metric)
    value = math.inf if value in (None, "") else float(value)
    return value if math.isfinite(value) else math.inf


# ---------------------------------------------------------------------------------------
# The stages


def tuning_cells(task: Task, sampler: str, seed: int) -> list[tuple[str, dict, float, object]]:
    """(cell id, settings, step size, own setting) of the sampler's grid on ``seed``."""
    return [
        (sampler_cell_id(task, sampler, step, own, seed),
         sampler_cell_settings(task, sampler, step, own, seed), step, own)
        for step, own in grid(task, sampler)
    ]  # fmt: skip


def tune(out_dir: Path, task: Task, seed: int, runner=None) -> tuple[dict, list[dict]]:
    """Run every sampler's grid on the tuning seed (through ``runner``, _run by default);
    the winner per sampler (sampler → (step, own)) and the grid's rows (every point's
    score)."""
    cells = {s: tuning_cells(task, s, seed) for s in SAMPLERS}
    flat = [(cid, st) for s in SAMPLERS for cid, st, _, _ in cells[s]]
    (runner or _run)(out_dir, task, flat, f"{task.name}: tuning")
    metric, best, rows = task.metrics[0], {}, []
    for s in SAMPLERS:
        scored = [(final_value(out_dir / "cells" / c, task, metric), step, own, st["rounds"])
                  for c, st, step, own in cells[s]]  # fmt: skip
        win = min(range(len(scored)), key=lambda i: scored[i][0])
        best[s] = scored[win][1:3]
        tried = sorted(step for _, step, own, _ in scored if own == best[s][1])
        edges = (tried[0], tried[-1]) if len(tried) > 1 else ()
        for i, (score, step, own, rounds) in enumerate(scored):
            rows.append({"task": task.name, "sampler": s, "step_size": step,
                         "own": OWN[s][0] if s in OWN else "", "own_value": own,
                         "rounds": rounds, metric: score, "chosen": i == win,
                         "at_edge": i == win and step in edges})  # fmt: skip
    return best, rows


def report_cells(task: Task, best: dict, seed: int) -> list[tuple[str, str, dict]]:
    """(sampler, cell id, settings) of each sampler's winner on the report seeds
    ``seed + 1 … seed + task.seeds``."""
    out = []
    for s in SAMPLERS:
        step, own = best[s]
        for k in range(1, task.seeds + 1):
            out.append((s, sampler_cell_id(task, s, step, own, seed + k),
                        sampler_cell_settings(task, s, step, own, seed + k)))  # fmt: skip
    return out


def mean_se(values: list[float]) -> tuple[float | None, float | None]:
    """Mean and standard error (sd / √n, None for one value) of the finite values."""
    v = [x for x in values if x is not None and math.isfinite(x)]
    if not v:
        return None, None
    m = sum(v) / len(v)
    if len(v) < 2:
        return m, None
    return m, math.sqrt(sum((x - m) ** 2 for x in v) / (len(v) - 1) / len(v))


def summarize_samplers(
    out_dir: Path, task: Task, runs: list[tuple[str, str, dict]]
) -> tuple[list, list]:
    """The task's table (one row per sampler: its tuned settings, rounds, evaluations and
    bits per chain, each metric's mean and standard error over the report seeds) and its
    curves (per sampler and round: the seeds' means, at evaluation_rounds)."""
    from fedhmc.experiments.blr_t import evaluation_rounds

    table, curves = [], []
    for s in SAMPLERS:
        mine = [(cid, st) for name, cid, st in runs if name == s]
        per_seed = [cell_curve(out_dir / "cells" / cid, task) for cid, _ in mine]
        st = mine[0][1]
        row = {"task": task.name, "sampler": s, "label": LABELS[s], "step_size": st["step-size"]}
        row.update(
            {"own": OWN[s][0] if s in OWN else "", "own_value": st.get(OWN.get(s, ("",))[0])}
        )
        row["rounds"] = st["rounds"]
        row.update(_round_cost(out_dir / "cells" / mine[0][0], s, st, task))
        done = [c for c in per_seed if c and c[-1]["round"] == st["rounds"]]
        row["seeds"] = f"{len(done)}/{len(mine)}"
        row["evals"] = mean_se([c[-1]["evals"] for c in done])[0]
        row["bits"] = mean_se([c[-1]["bits"] for c in done])[0]
        for m in task.metrics:
            finals = [c[-1][m] if c and c[-1]["round"] == st["rounds"] else None for c in per_seed]
            row[m], row[f"{m}_se"] = mean_se([math.inf if x is None else x for x in finals])
        table.append(row)
        keep = set(evaluation_rounds(st["rounds"]))
        if task.name == "blr":  # the rounds θ̄ was saved at
            keep = {r["round"] for c in per_seed for r in c if r["me"] is not None}
        curves += _mean_curve(task, s, per_seed, keep)
    return table, curves


def _round_cost(cell: Path, sampler: str, settings: dict, task: Task) -> dict:
    """cost_per_round of the cell's settings, at the dimension its run records."""
    try:
        dim = int(json.loads((cell / "summary.json").read_text())["dim"])
    except (OSError, ValueError, KeyError, TypeError):
        return {}
    cost = cost_per_round(sampler, settings, task.clients, dim)
    return {"dim": dim, **{f"cost_{k}": v for k, v in cost.items()}}


def _mean_curve(task: Task, sampler: str, per_seed: list[list[dict]], keep: set) -> list[dict]:
    """The seeds' mean curve of one sampler at the rounds ``keep`` (a value only where
    every seed has a finite one)."""
    by_round: dict[int, list[dict]] = {}
    for curve in per_seed:
        for r in curve:
            if r["round"] in keep:
                by_round.setdefault(r["round"], []).append(r)
    out = []
    for rnd in sorted(by_round):
        rs = by_round[rnd]
        row = {"task": task.name, "sampler": sampler, "round": rnd}
        row["evals"] = sum(r["evals"] for r in rs) / len(rs)
        row["bits"] = sum(r["bits"] for r in rs) / len(rs)
        for m in task.metrics:
            vals = [r[m] for r in rs]
            ok = len(rs) == len(per_seed) and all(v is not None and math.isfinite(v) for v in vals)
            row[m] = sum(vals) / len(vals) if ok else None
        out.append(row)
    return out


# ---------------------------------------------------------------------------------------
# Tables and figures

_FIGURE_WIDTH = 7.2
"""Inches: the width a results page shows a figure at (as participation's)."""
X_AXES = (
    ("round", "communication rounds"),
    ("evals", "gradient evaluations per chain"),
    ("bits", "bits sent per chain\n(down + up)"),
)


def plot_task(path: Path, task_name: str, title: str, curves: list[dict]) -> None:
    """One row per metric, one column per x axis (rounds, gradient evaluations, bits),
    a line per sampler: the report seeds' mean."""
    from fedhmc.viz.plots import new_figure

    metrics = [m for m in METRIC_NAMES if any(c.get(m) not in (None, "") for c in curves)]
    fig = new_figure(_FIGURE_WIDTH, 2.3 * len(metrics) + 0.9)
    axes = fig.subplots(len(metrics), 3, squeeze=False)
    styles = ("-", "--", "-.", ":")
    for i, s in enumerate(SAMPLERS):
        rows = [c for c in curves if c["sampler"] == s]
        for j, m in enumerate(metrics):
            pts = [c for c in rows if c.get(m) not in (None, "")]
            for k, (x, _) in enumerate(X_AXES):
                axes[j, k].plot([float(c[x]) for c in pts], [float(c[m]) for c in pts],
                                styles[i % 4], color=f"C{i}", lw=1.2, label=LABELS[s])  # fmt: skip
    for j, m in enumerate(metrics):
        top = _top(curves, m)
        for k, (_, xlabel) in enumerate(X_AXES):
            ax = axes[j, k]
            ax.set_xscale("log")
            if m in ("w2", "me", "nll_sum"):
                ax.set_yscale("log")
                ax.set_ylim(top=top)
            ax.tick_params(labelsize=7)
            ax.set_xlabel(xlabel, fontsize=8)
            if k == 0:
                ax.set_ylabel(METRIC_NAMES[m], fontsize=8)
    handles, labels = axes[0, 0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=4, fontsize=8, frameon=False)
    fig.suptitle(title, fontsize=9)
    fig.tight_layout(rect=(0, 0.9 / (2.3 * len(metrics) + 0.9), 1, 1))
    fig.savefig(path, dpi=96)


def _top(curves: list[dict], metric: str) -> float | None:
    """The y axis's top for an error metric: 5 × the median of the samplers' first values,
    so that a chain that blows up (its curve leaves the axis) does not flatten the rest."""
    firsts = {}
    for c in curves:
        if c.get(metric) not in (None, "") and c["sampler"] not in firsts:
            firsts[c["sampler"]] = float(c[metric])
    values = sorted(v for v in firsts.values() if math.isfinite(v))
    return 5 * values[len(values) // 2] if values else None


def _fmt(value, se=None) -> str:
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "diverged"
    text = f"{value:.4g}"
    return text if se is None else f"{text} ± {se:.2g}"


def _count(value) -> str:
    return "—" if value is None else f"{float(value):,.0f}"


def _markdown_table(task: Task | dict, rows: list[dict]) -> str:
    """The task's table in Markdown: per sampler its tuned settings, rounds, gradient
    evaluations and Mbit per chain, and each metric's mean ± s.e."""
    metrics = list(task["metrics"] if isinstance(task, dict) else task.metrics)
    metrics = [m for m in METRIC_NAMES if m in metrics]  # the figures' order
    head = ["sampler", "step size", "own setting", "rounds", "grad evals / chain", "Mbit / chain"]
    lines = ["| " + " | ".join(head + [METRIC_NAMES[m] for m in metrics]) + " |"]
    lines.append("|" + "---|" * 3 + "---:|" * (len(head) - 3 + len(metrics)))
    for r in rows:
        own = f"{r['own']} = {r['own_value']:g}" if r.get("own") else "—"
        bits = None if r.get("bits") is None else float(r["bits"]) / 1e6
        cells = [r["label"], f"{float(r['step_size']):g}", own, str(r["rounds"]),
                 _count(r.get("evals")), _fmt(bits)]  # fmt: skip
        cells += [_fmt(r.get(m), r.get(f"{m}_se")) for m in metrics]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def cost_table(rows: list[dict]) -> str:
    """The task's costs in Markdown: per chain, each sampler's gradient evaluations and
    kbit down and up a round, and those of its set-up (cost_per_round)."""
    head = "| sampler | grad evals a round | kbit down a round | kbit up a round | set-up |"
    lines = [head, "|---|---:|---:|---:|---|"]
    for r in rows:
        if "cost_evals" not in r:
            continue
        setup = []
        if r["cost_setup_evals"]:
            setup.append(f"{r['cost_setup_evals']:,} grad evals")
        if r["cost_setup_bits"]:
            setup.append(f"{r['cost_setup_bits'] / 1e3:.4g} kbit")
        cells = [r["label"], f"{r['cost_evals']:,.4g}", f"{r['cost_bits_down'] / 1e3:.4g}",
                 f"{r['cost_bits_up'] / 1e3:.4g}", ", ".join(setup) or "—"]  # fmt: skip
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def write_tables_md(out_dir: Path, summary: dict) -> None:
    """``samplers_tables.md``: each task's table under its title (the docs page includes
    it), and the tasks skipped."""
    from fedhmc.runtime.output import write_text_atomic

    parts = [f"<!-- written by fedhmc.experiments.samplers ({summary['budget']} budget) -->\n"]
    for name in TASKS:
        t = summary["tasks"].get(name)
        if t is None:
            continue
        parts.append(f"### {t['title']}\n")
        if t.get("skipped"):
            parts.append(f"Skipped: {t['skipped']}\n")
            continue
        parts.append(
            f"Budget: {t['evals']:,} gradient evaluations per chain; mean ± standard error "
            f"over {t['seeds']} seeds.\n"
        )
        parts.append(_markdown_table(t, t["rows"]))
        dim = next((r["dim"] for r in t["rows"] if "dim" in r), None)
        parts.append(f"Cost per chain at the tuned settings (d = {dim}):\n")
        parts.append(cost_table(t["rows"]))
    write_text_atomic(out_dir / "samplers_tables.md", "\n".join(parts))


# ---------------------------------------------------------------------------------------
# The experiment


def fmnist_available() -> bool:
    """Whether the Fashion-MNIST files are found where a run looks for them."""
    from fedhmc_datasets import mnist

    try:
        return mnist._locate("fashion-mnist", None) is not None
    except Exception:  # an unreadable folder: absent, as far as a run goes
        return False


def build_task(
    out_dir: Path, task: Task, seed: int, run: bool = True, workers: int = 1
) -> tuple[dict, list]:
    """Tune, run the report seeds (in ``workers`` processes; unless ``run`` is false: the
    cells are read as they are) and summarise one task; its summary and its curves."""
    runner = functools.partial(_run, workers=workers) if run else _me_only
    best, tuning = tune(out_dir, task, seed, runner)
    runs = report_cells(task, best, seed)
    runner(out_dir, task, [(cid, st) for _, cid, st in runs], f"{task.name}: seeds")
    rows, curves = summarize_samplers(out_dir, task, runs)
    info = {"title": task.title, "evals": task.evals, "seeds": task.seeds}
    info.update({"metrics": list(task.metrics), "base": task.base, "rows": rows})
    info["tuning"] = tuning
    return info, curves


def _me_only(out_dir: Path, task: Task, cells: list, desc: str) -> None:
    """What _run does to cells that ran: BLR's ME curves."""
    if task.name == "blr":
        for cid, settings in cells:
            if (out_dir / "cells" / cid / "summary.json").exists():
                blr_me_curve(out_dir / "cells" / cid, settings, task)


def write_outputs(out_dir: Path, summary: dict, curves: list[dict]) -> None:
    """``samplers.json`` (the summary), ``samplers.csv`` (every task's table),
    ``samplers_tuning.csv`` (every grid point's score), ``samplers_curves.csv`` (the seeds'
    mean curves), ``samplers_tables.md`` and a figure per task, ``samplers_<task>.png``."""
    from fedhmc.runtime.output import write_text_atomic

    out_dir.mkdir(parents=True, exist_ok=True)
    tasks = summary["tasks"].values()
    write_text_atomic(out_dir / "samplers.json", json.dumps(summary, indent=2) + "\n")
    write_csv(out_dir / "samplers.csv", [r for t in tasks for r in t.get("rows", [])])
    write_csv(out_dir / "samplers_tuning.csv", [r for t in tasks for r in t.get("tuning", [])])
    if curves:
        write_csv(out_dir / "samplers_curves.csv", curves)
    write_tables_md(out_dir, summary)
    for name, t in summary["tasks"].items():
        mine = [c for c in curves if c["task"] == name]
        if mine:
            plot_task(out_dir / f"samplers_{name}.png", name, _figure_title(summary, t), mine)


def _figure_title(summary: dict, t: dict) -> str:
    return (
        f"{t['title']}\n{t['evals']:,} gradient evaluations per chain, "
        f"mean of {t['seeds']} seeds ({summary['budget']} budget)"
    )


def samplers(
    out_dir: Path, *, quick: bool = False, seed: int = 0, full: bool = False, workers: int = 1
) -> dict:
    """Every federated sampler on the heterogeneous Gaussian (W₂), simulated BLR (ME) and
    Fashion-MNIST (accuracy, Brier, ECE, NLL) at equal budgets of gradient evaluations,
    each tuned by one rule (TUNING_RULE) on ``seed`` and reported on the five seeds after
    it. ``quick``: seconds (tests); the default, reduced budget: about 9 minutes on 2
    CPU cores with two workers; ``full``: the larger budgets and grids (about 2 hours
    with two workers). ``workers``: the cells run in this many processes at once."""
    out_dir = Path(out_dir)
    budget = "quick" if quick else "full" if full else "reduced"
    summary = {"experiment": "samplers", "budget": budget, "seed": seed, "rule": TUNING_RULE,
               "quantization_levels": QUANTIZATION_LEVELS, "local_steps": LOCAL_STEPS[budget],
               "tasks": {}}  # fmt: skip
    curves: list[dict] = []
    for name in TASKS:
        task = task_spec(name, budget)
        if name == "fmnist" and not fmnist_available():
            summary["tasks"][name] = {"title": task.title, "skipped": _ABSENT}
            continue
        summary["tasks"][name], mine = build_task(out_dir, task, seed, workers=workers)
        curves += mine
        write_outputs(out_dir, summary, curves)  # partial results after every task
    write_outputs(out_dir, summary, curves)
    return {
        **summary,
        "rows": [_short(r) for t in summary["tasks"].values() for r in t.get("rows", [])],
    }


_ABSENT = (
    "the Fashion-MNIST files were not found (install them with `apt-get install "
    "dataset-fashion-mnist`, or give --data-dir)"
)


def _short(row: dict) -> dict:
    """A table row as the command prints it."""
    keep = ("task", "sampler", "step_size", "rounds", "evals", "w2", "me", "accuracy", "nll_sum")
    return {k: row[k] for k in keep if k in row}


def replot_samplers(out_dir: Path) -> list[Path]:
    """Write the tables and figures again: from the cells in ``out_dir/cells/`` where they
    are kept (nothing runs: a missing cell reads as diverged), else from
    ``samplers.json`` and ``samplers_curves.csv``."""
    from fedhmc.sweep.table import read_csv

    out_dir = Path(out_dir)
    summary = json.loads((out_dir / "samplers.json").read_text())
    curves: list[dict] = []
    if (out_dir / "cells").is_dir():
        for name, t in list(summary["tasks"].items()):
            if not t.get("skipped"):
                task = task_spec(name, summary["budget"])
                summary["tasks"][name], mine = build_task(out_dir, task, summary["seed"], False)
                curves += mine
    elif (out_dir / "samplers_curves.csv").exists():
        curves = read_csv(out_dir / "samplers_curves.csv")
    write_outputs(out_dir, summary, curves)
    return [
        out_dir / f"samplers_{n}.png" for n, t in summary["tasks"].items() if not t.get("skipped")
    ]


if __name__ == "__main__":  # python -m fedhmc.experiments.samplers DIR: replot_samplers DIR
    import sys

    for path in replot_samplers(
        Path(sys.argv[1] if len(sys.argv) > 1 else "docs/results/samplers")
    ):
        print(path)
